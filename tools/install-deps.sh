#!/bin/sh
# Installs what memsim needs to build and test, from Debian's archive (run as root).
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    ca-certificates gcc clang libclang-rt-14-dev meson ninja-build pkg-config \
    libglib2.0-dev libzstd-dev zlib1g-dev libprotobuf-c-dev protobuf-c-compiler \
    libjson-glib-dev libyaml-dev libcairo2-dev libcriterion-dev python3 python3-torch chromium \
    man-db groff-base valgrind bash-completion >/dev/null
echo "memsim: build and test dependencies installed"
