#!/bin/sh
# Builds memsim twice — normally, and with AddressSanitizer + UndefinedBehaviorSanitizer —
# and runs the whole Criterion suite in each. Exits non-zero if any test fails.
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
run build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug || status=1
echo
echo "tests: $passed passed, $failed failed"
if [ $status -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "memsim: TESTS FAILED" >&2
    exit 1
fi
