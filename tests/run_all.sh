#!/bin/bash
# run_all.sh - install dependencies, build with warnings as errors, run every
# test suite; then build with ASan+UBSan and run the suites again.
# Prints "N passed, M failed" (gtest cases) at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

tests/setup.sh build-ci --werror -Dbuildtype=debugoptimized || exit 1
tests/setup.sh build-ci-asan --werror -Dbuildtype=debug \
    -Db_sanitize=address,undefined -Db_lundef=false || exit 1

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# intercept_tls_get_addr=0: GCC 12's ASan runtime can mistake a dynamic TLS
# block for a pre-glibc-2.25 header and crash LSan's exit scan ("Tracer
# caught signal 11"); see tests/meson.build, python suite.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:intercept_tls_get_addr=0
export LSAN_OPTIONS=suppressions=$root/tests/lsan.supp:print_suppressions=0
rc=0
meson test -C build-ci --print-errorlogs --num-processes 1 || rc=1
meson test -C build-ci-asan --print-errorlogs --num-processes 1 \
    --no-suite netns --timeout-multiplier 3 || rc=1
# Coverage-guided fuzzing (tests/fuzz/README.md): every target 10 s with
# libFuzzer + ASan + UBSan from its corpus (the meson suite "fuzz" above
# replays the corpus in both builds, with or without clang).
if command -v clang-14 >/dev/null || command -v clang >/dev/null; then
    tests/fuzz/fuzz.sh ci "$root/build-ci-fuzz" 10 || rc=1
fi

python3 - "$root/build-ci" "$root/build-ci-asan" <<'PY'
import sys, xml.etree.ElementTree as ET, os
passed = failed = skipped = 0
for d in sys.argv[1:]:
    p = os.path.join(d, "meson-logs", "testlog.junit.xml")
    if not os.path.exists(p):
        continue
    for tc in ET.parse(p).getroot().iter("testcase"):
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed += 1
        elif tc.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
