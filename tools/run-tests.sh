#!/bin/sh
# Builds memsim twice — normally, and with AddressSanitizer + UndefinedBehaviorSanitizer —
# and runs the whole Criterion suite in each; then a ThreadSanitizer build of the
# concurrency check alone. Exits non-zero if any test fails.
# Skips are shown, never counted as passes: every skipped test case is listed with its reason
# and the summary counts skipped suites apart. Under CI (CI=true), where every dependency is
# installed and ../shared is laid beside the checkout, a skip fails the run — except the
# sanitized build's by-design skips (python3 cannot load a sanitized library, Helgrind, ...).
# MEMSIM_TEST_SUITES may name suites to run (default: all).
set -u
cd "$(dirname "$0")/.."
status=0
passed=0
failed=0
skipped=0
skiplist=
run() {
    dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
    fi
    ninja -C "$dir" || return 1
    MEMSIM_SKIP_LOG=$PWD/$dir/skips.log
    export MEMSIM_SKIP_LOG
    rm -f "$MEMSIM_SKIP_LOG"
    meson test -C "$dir" --print-errorlogs --num-processes 2 ${MEMSIM_TEST_SUITES:+--suite $MEMSIM_TEST_SUITES}
    rc=$?
    # meson's summary lines, e.g. "Ok:   9", "Fail:   0", "Skipped:   1"
    log=$dir/meson-logs/testlog.txt
    ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    bad=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p;s/^Timeout: *\([0-9]*\).*/\1/p' "$log" |
        awk '{s += $1} END {print s + 0}')
    skip=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)
    passed=$((passed + ${ok:-0}))
    failed=$((failed + ${bad:-0}))
    skipped=$((skipped + ${skip:-0}))
    if [ -s "$MEMSIM_SKIP_LOG" ]; then
        echo "== $dir: skipped test cases, with their reasons:"
        sed 's/^/  SKIP /' "$MEMSIM_SKIP_LOG"
        skiplist="$skiplist $MEMSIM_SKIP_LOG"
    fi
    return $rc
}
# In CI nothing may be skipped but what a sanitized build cannot run by design.
ci_skips() {
    [ "${CI:-}" = true ] || return 0
    for f in $skiplist; do
        case $f in
        */build-asan/*) grep -v -i -e 'sanitiz' "$f" ;;
        *) cat "$f" ;;
        esac
    done | sed 's/^/  /' >ci-skips.log
    if [ -s ci-skips.log ]; then
        echo "memsim: CI installs every dependency, yet these were skipped:" >&2
        cat ci-skips.log >&2
        rm -f ci-skips.log
        return 1
    fi
    rm -f ci-skips.log
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
    if [ ! -f "$snap" ]; then
        echo "  SKIP threads_check's snapshot job: $snap is absent (the generated jobs run)"
        echo "threads_check/snapshot: $snap is absent" >"$dir/skips.log"
        skiplist="$skiplist $PWD/$dir/skips.log"
        snap=
    else
        rm -f "$dir/skips.log"
    fi
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
ci_skips || status=1
cases=$(cat $skiplist /dev/null 2>/dev/null | wc -l)
echo
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$cases" -eq 0 ] || echo "($cases test cases skipped in all, listed above)"
if [ $status -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "memsim: TESTS FAILED" >&2
    exit 1
fi
