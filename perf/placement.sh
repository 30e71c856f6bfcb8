#!/usr/bin/env bash
# placement.sh - one change measured per thread placement: on a machine
# with fewer CPUs than busy threads, where the scheduler puts the four
# threads of a two-process run (D's framework and progress threads, P's
# framework and progress threads) decides the figure more than the code
# (unpinned runs of one build differ up to 2.6x). This pins them, so each
# placement is measured as itself, build A and build B alternating:
#
#   A  D's two threads on CPU 0, P's two on CPU 1 (a process per CPU)
#   B  D's framework + P's progress on CPU 0, D's progress + P's framework on 1
#   C  both framework threads on CPU 0, both progress threads on CPU 1
#   S  all four on CPU 0
#
# Both builds must name their progress thread kvx-progress (kvxfer does
# since 159945c; for an older build, patch pthread_setname_np into its
# kvu_progress_main). Every point starts once the 1-minute load is below
# LOAD_MAX (perf/load.sh) or is marked LOADED.
#
# Usage: perf/placement.sh BUILD_A BUILD_B [REPS]
# Env: OP (write), ITERS (3000), PLACES ("A B C S"), POINTS ("sm app 32K 1;
#      tcp app 32K 1;sm ucx 32K 1": tls, --mem, block size, blocks per
#      transfer), EXTRA (more kvxfer_perf options; WRITE adds --write-ahead)
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: $0 BUILD_A BUILD_B [REPS]" >&2; exit 2; }
A=$1
B=$2
REPS=${3:-3}
OP=${OP:-write}
ITERS=${ITERS:-3000}
LOAD_MAX=${LOAD_MAX:-0.6}
PLACES=${PLACES:-"A B C S"}
POINTS=${POINTS:-"sm app 32K 1;tcp app 32K 1;sm ucx 32K 1"}
EXTRA=${EXTRA:-}
[ "$OP" = write ] && EXTRA="--write-ahead $EXTRA"
[ "$(nproc)" -ge 2 ] || { echo "placement.sh: needs 2 CPUs" >&2; exit 1; }
for b in "$A" "$B"; do
    [ -x "$b/perf/bench/kvxfer_perf" ] || { echo "$b: kvxfer_perf not built" >&2; exit 1; }
done
. "$here/load.sh"
port=$((21000 + RANDOM % 2000))

# pin_progress PID CPU: pins PID's kvx-progress thread; 0 when done.
pin_progress() {
    local t
    for t in /proc/"$1"/task/*; do
        if [ "$(cat "$t/comm" 2> /dev/null)" = kvx-progress ]; then
            taskset -p -c "$2" "$(basename "$t")" > /dev/null && return 0
        fi
    done
    return 1
}

# run PORT BUILD PLACE TLS MEM SIZE BATCH: transfers/s of one run, "" on
# failure (run is called in a subshell: the caller counts the ports).
run() {
    local port=$1 perf=$2/perf/bench/kvxfer_perf df dp pf pp ppid cpid csv k a b
    shift
    case $2 in
    A) df=0 dp=0 pf=1 pp=1 ;;
    B) df=0 pp=0 dp=1 pf=1 ;;
    C) df=0 pf=0 dp=1 pp=1 ;;
    S) df=0 dp=0 pf=0 pp=0 ;;
    *) echo "placement $2: A, B, C or S" >&2; return 1 ;;
    esac
    csv=$(mktemp)
    taskset -c "$pf" timeout 300 "$perf" -p "$port" --bind 127.0.0.1 \
        --accept-timeout 60 -q > /dev/null 2>&1 &
    ppid=$!
    sleep 0.3 # the server's listener; the client retries its connect too
    taskset -c "$df" timeout 300 "$perf" 127.0.0.1 -p "$port" --tls "$3" \
        -t "$OP" --mem "$4" --resident --layers 1 --layout split -s "$5" \
        -b "$6" -n "$ITERS" -q -f csv --csv "$csv" $EXTRA > /dev/null 2>&1 &
    cpid=$!
    # $! is timeout's pid: the benchmark is its child. The progress
    # threads start with the engines, before the first transfer.
    a=1 b=1
    for k in $(seq 1 250); do
        [ "$a" = 0 ] || { pin_progress "$(pgrep -P "$ppid" | head -1)" "$pp"; a=$?; }
        [ "$b" = 0 ] || { pin_progress "$(pgrep -P "$cpid" | head -1)" "$dp"; b=$?; }
        [ "$a$b" = 00 ] && break
        sleep 0.02
    done
    wait "$cpid" "$ppid" 2> /dev/null
    if [ "$a$b" != 00 ]; then
        echo "placement.sh: no kvx-progress thread to pin in $1" >&2
        rm -f "$csv"
        return 1
    fi
    python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(rows[-1]["xfers_per_s"] if rows else "")
PY
    rm -f "$csv"
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
IFS=';' read -r -a pts <<< "$POINTS"
for pt in "${pts[@]}"; do
    set -- $pt
    mark=""
    wait_quiet "$LOAD_MAX" "${QUIET_WAIT:-300}" || mark="LOADED "
    echo "# $OP $pt: starts at load $(load1)"
    for place in $PLACES; do
        for rep in $(seq 1 "$REPS"); do
            port=$((port + 2))
            if [ $((rep % 2)) = 1 ]; then # alternate which build goes first
                a=$(run "$port" "$A" "$place" "$@")
                b=$(run "$((port + 1))" "$B" "$place" "$@")
            else
                b=$(run "$port" "$B" "$place" "$@")
                a=$(run "$((port + 1))" "$A" "$place" "$@")
            fi
            echo "${mark}op=$OP tls=$1 mem=$2 size=$3 batch=$4 place=$place rep=$rep load=$(load1) a=$a b=$b" |
                tee -a "$log"
        done
    done
done
python3 - "$log" <<'PY'
import re, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    m = dict(re.findall(r"(\w+)=(\S+)", line))
    if not m.get("a") or not m.get("b") or float(m["a"]) <= 0:
        continue
    k = "%s %s %s x%s place %s" % (m["tls"], m["mem"], m["size"], m["batch"], m["place"])
    rows.setdefault(k, []).append((float(m["a"]), float(m["b"]), line.startswith("LOADED")))
print("\ntransfers/s, A -> B median; B/A pair by pair min / median / max")
for k, v in rows.items():
    r = sorted(b / a for a, b, _ in v)
    print("%-32s %9.0f -> %9.0f   %.2f / %.2f / %.2f%s" % (
        k, st.median(a for a, _, _ in v), st.median(b for _, b, _ in v),
        r[0], st.median(r), r[-1], "  LOADED" if any(l for _, _, l in v) else ""))
PY
