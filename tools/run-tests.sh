#!/bin/sh
# Builds memsim twice — normally, and with AddressSanitizer + UndefinedBehaviorSanitizer —
# and runs the whole Criterion suite in each; then a ThreadSanitizer build of the
# concurrency check alone. Exits non-zero if any test fails.
# MEMSIM_TEST_SUITES may name suites to run (default: all).
set -u
cd "$(dirname "$0")/.."
status=0
passed=0
failed=0
run() {
    dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
    fi
    ninja -C "$dir" || return 1
    meson test -C "$dir" --print-errorlogs --num-processes 2 ${MEMSIM_TEST_SUITES:+--suite $MEMSIM_TEST_SUITES}
    rc=$?
    # meson's summary lines, e.g. "Ok:   9" and "Fail:   0"
    ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$dir/meson-logs/testlog.txt" | tail -n 1)
    bad=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p;s/^Timeout: *\([0-9]*\).*/\1/p' "$dir/meson-logs/testlog.txt" |
        awk '{s += $1} END {print s + 0}')
    passed=$((passed + ${ok:-0}))
    failed=$((failed + ${bad:-0}))
    return $rc
}
echo "== build: normal"
run build || status=1
echo "== build: AddressSanitizer + UndefinedBehaviorSanitizer"
# -O1: the sanitizers' own advice for usable speed (at -O0 the suite takes twice as long)
run build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1 || status=1
# ThreadSanitizer: only the concurrency check (tests/threads_check.c, a plain program: TSan
# and Criterion's sandboxed workers do not get along). G_SLICE=always-malloc because GLib
# 2.74's slice allocator hands memory between threads through futex-based locks that TSan
# cannot see (thousands of false reports otherwise).
tsan() {
    dir=build-tsan
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" -Db_sanitize=thread -Db_lundef=false >"$dir.setup.log" 2>&1 ||
            { cat "$dir.setup.log"; return 1; }
    fi
    ninja -C "$dir" tests/threads_check || return 1
    snap=../shared/data/torch-snapshots/shreyansh26__MLSys-Experiments__profile_grad.pkl
    [ -f "$snap" ] || snap=
    G_SLICE=always-malloc TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
        "$dir/tests/threads_check" $snap
}
echo "== build: ThreadSanitizer (concurrent calls into the library)"
if tsan; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    status=1
fi
echo
echo "tests: $passed passed, $failed failed"
if [ $status -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "memsim: TESTS FAILED" >&2
    exit 1
fi
