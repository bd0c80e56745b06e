#!/bin/sh
# Builds (when needed) and runs one libFuzzer target of tests/fuzz for a while.
#
#     tests/fuzz/run-fuzzer.sh NAME SECONDS        NAME: pickle | snapshot | mst | text
#
# The build lives in build-fuzz/ (clang, ASan + UBSan, every file instrumented for coverage:
# tools/meson.build gives -fsanitize=fuzzer to the target's own file only, so the library is
# compiled with -fsanitize=fuzzer-no-link here). The seeds are tests/data/good/*.EXT and
# tests/data/bad/*.EXT (EXT: pickle, mst, txt), plus, for pickles, the small real snapshots of
# ../shared/data/torch-snapshots (or $MEMSIM_SHARED_DATA/torch-snapshots). The corpus grows
# in build-fuzz/corpus-NAME/ from run to run.
#
# A crash, leak, timeout or out-of-memory input is copied to
# tests/data/bad/fuzz-NAME-<hash>.exit2.EXT (every such file must be refused cleanly: the
# tests load them) and the script exits with status 1.
set -eu

usage() {
    echo "usage: $0 pickle|snapshot|mst|text SECONDS" >&2
    exit 2
}
[ $# -eq 2 ] || usage
name=$1
seconds=$2
case $name in
pickle | snapshot) ext=pickle ;;
mst) ext=mst ;;
text) ext=txt ;;
*) usage ;;
esac
case $seconds in
'' | *[!0-9]*) usage ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build-fuzz
if [ ! -f "$build/build.ninja" ]; then
    CC=${CC:-clang} meson setup "$build" "$root" -Dfuzzers=true -Dtests=false \
        -Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link
fi
ninja -C "$build" "tests/fuzz/fuzz_$name"
fuzzer=$build/tests/fuzz/fuzz_$name
[ -x "$fuzzer" ] || {
    echo "$0: $fuzzer was not built (is tests/fuzz/fuzz_$name.c missing?)" >&2
    exit 2
}

seeds=$build/seeds-$name
corpus=$build/corpus-$name
artifacts=$build/artifacts-$name
rm -rf "$seeds" "$artifacts"
mkdir -p "$seeds" "$corpus" "$artifacts"
for f in "$root"/tests/data/good/*."$ext" "$root"/tests/data/bad/*."$ext"; do
    [ -f "$f" ] && cp "$f" "$seeds/"
done
if [ "$ext" = pickle ]; then
    shared=${MEMSIM_SHARED_DATA:-$root/../shared/data}/torch-snapshots
    if [ -d "$shared" ]; then
        # Small ones only: big inputs slow every execution down.
        find "$shared" -maxdepth 1 \( -name '*.pickle' -o -name '*.pkl' \) -size -64k \
            -exec cp {} "$seeds/" \;
    fi
fi
echo "$0: $(ls "$seeds" | wc -l) seed files, corpus $corpus, $seconds s"

# UBSan findings must stop the run like ASan's do.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$seeds" || status=$?

found=0
for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    hash=$(sha1sum "$f" | cut -c1-12)
    dest=$root/tests/data/bad/fuzz-$name-$hash.exit2.$ext
    cp "$f" "$dest"
    echo "$0: $(basename "$f") saved as $dest" >&2
    found=1
done
if [ $found -ne 0 ] || [ $status -ne 0 ]; then
    echo "$0: the fuzzer found a problem (status $status)" >&2
    exit 1
fi
echo "$0: no crash in $seconds s"
