#!/bin/bash
# fuzz.sh - build the fuzz targets of tests/fuzz with clang's libFuzzer +
# ASan + UBSan, and run them (README.md in this folder).
#
#   tests/fuzz/fuzz.sh build OUT           build every target into OUT
#   tests/fuzz/fuzz.sh ci OUT [SECONDS]    build, fuzz each target SECONDS
#                                          (default 10) from its corpus;
#                                          exit 1 on any finding
#   tests/fuzz/fuzz.sh long OUT [RUNS] [TARGET...]
#                                          build, fuzz each target (niced) for
#                                          RUNS executions (default 10000000);
#                                          prints executions and coverage;
#                                          FUZZ_MAX_SECONDS caps each target
#
# New inputs go to OUT/work/<target> (the committed corpus is only read);
# a finding is saved as OUT/finding-<target>-* and its output is printed.
# CLANG picks the compiler (default clang-14, else clang).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
mode=${1:-}
out=${2:-}
if [ -z "$mode" ] || [ -z "$out" ]; then
    sed -n '2,17p' "$0"
    exit 2
fi
shift 2
targets=(config params ctlmsg reply handshake plan proxy)
nice=

cc=${CLANG:-}
if [ -z "$cc" ]; then
    cc=$(command -v clang-14 || command -v clang || true)
fi
if [ -z "$cc" ]; then
    echo "fuzz.sh: no clang found" >&2
    exit 2
fi

build() {
    local san=-fsanitize=address,undefined
    local cflags=(-g -O1 -std=gnu11 -fno-omit-frame-pointer
                  -fno-sanitize-recover=all -Iinclude -Iplugin/common
                  -Iplugin/core $(pkg-config --cflags json-c))
    local objs=() src obj
    mkdir -p "$out/obj" || return 1
    # The two pure layers whole (no network, no GPU; README.md, Layout):
    # a file added there is linked here without editing this list.
    for src in plugin/common/*.c plugin/core/*.c; do
        obj=$out/obj/$(basename "$src" .c).o
        if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
            "$cc" "${cflags[@]}" $san,fuzzer-no-link -c "$src" -o "$obj" ||
                return 1
        fi
        objs+=("$obj")
    done
    for t in "${targets[@]}"; do
        "$cc" "${cflags[@]}" $san,fuzzer -Itests/fuzz \
            "tests/fuzz/fuzz_$t.c" "${objs[@]}" \
            $(pkg-config --libs json-c) -lpthread -lm -o "$out/fuzz_$t" ||
            return 1
    done
}

# run TARGET ARGS...: one libFuzzer session; fails on a finding.
run() {
    local t=$1
    shift
    mkdir -p "$out/work/$t"
    $nice "$out/fuzz_$t" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -max_len=4096 -artifact_prefix="$out/finding-$t-" "$@" \
        "$out/work/$t" "tests/fuzz/corpus/$t" >"$out/$t.log" 2>&1
    local rc=$?
    local execs cov
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log")
    cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE).*cov: ' "$out/$t.log" |
          tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+).*/\1 edges, \2 features/')
    printf '%-10s %s  executions %s, coverage %s\n' "$t" \
        "$([ $rc = 0 ] && echo ok || echo FINDING)" "${execs:-?}" "${cov:-?}"
    if [ $rc != 0 ]; then
        tail -40 "$out/$t.log"
        return 1
    fi
}

case "$mode" in
build)
    build
    ;;
ci)
    secs=${1:-10}
    build || exit 1
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    rc=0
    for t in "${targets[@]}"; do
        run "$t" -max_total_time="$secs" || rc=1
    done
    exit $rc
    ;;
long)
    runs=${1:-10000000}
    shift || true
    [ $# -gt 0 ] && targets=("$@")
    build || exit 1
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    nice="nice -n 10"
    rc=0
    for t in "${targets[@]}"; do
        cap=()
        [ -n "${FUZZ_MAX_SECONDS:-}" ] && cap=(-max_total_time="$FUZZ_MAX_SECONDS")
        run "$t" -runs="$runs" "${cap[@]}" || rc=1
    done
    exit $rc
    ;;
*)
    echo "fuzz.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
