#!/usr/bin/env bash
# pair_builds.sh - one change measured pair by pair: the same kvxfer_perf
# run (two processes on 127.0.0.1, one transfer in flight, cache-resident,
# one split layer) from build A, then from build B, for each point; every
# repetition starts once the 1-minute load is below LOAD_MAX (perf/load.sh),
# or is marked LOADED. Prints one line per pair (Tx of A and B in us, B/A)
# and, at the end, min / median / max per point.
#
# Usage: perf/pair_builds.sh BUILD_A BUILD_B [REPS]
# Env: OP (write), ITERS (2000), LOAD_MAX (0.6), QUIET_WAIT (300),
#      POINTS ("sm ucx 4K 1;sm app 32K 32;tcp app 4K 1;tcp app 32K 32":
#      tls, --mem, block size, blocks per transfer), METRIC (avg_tx_us;
#      or xfers_per_s, the completion rate: higher is better), EXTRA
#      (more kvxfer_perf options for both builds, e.g. --write-ahead)
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: $0 BUILD_A BUILD_B [REPS]" >&2; exit 2; }
A=$1
B=$2
REPS=${3:-5}
OP=${OP:-write}
ITERS=${ITERS:-2000}
LOAD_MAX=${LOAD_MAX:-0.6}
QUIET_WAIT=${QUIET_WAIT:-300}
POINTS=${POINTS:-"sm ucx 4K 1;sm app 32K 32;tcp app 4K 1;tcp app 32K 32"}
METRIC=${METRIC:-avg_tx_us}
EXTRA=${EXTRA:-}
for b in "$A" "$B"; do
    [ -x "$b/perf/bench/kvxfer_perf" ] || { echo "$b: kvxfer_perf not built" >&2; exit 1; }
done
. "$here/load.sh"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
port=$((17000 + RANDOM % 1000))

# tx BUILD TLS MEM SIZE BATCH: METRIC of one run (average Tx in us by
# default), or "" on failure.
tx() {
    local perf=$1/perf/bench/kvxfer_perf csv spid
    csv=$(mktemp)
    port=$((port + 1))
    timeout 300 "$perf" -p "$port" --bind 127.0.0.1 --accept-timeout 60 -q \
        > /dev/null 2>&1 &
    spid=$!
    sleep 0.3 # the server's listener; the client retries its connect too
    timeout 300 "$perf" 127.0.0.1 -p "$port" --tls "$2" -t "$OP" --mem "$3" \
        --resident --layers 1 --layout split -s "$4" -b "$5" -n "$ITERS" -q \
        -f csv --csv "$csv" $EXTRA > /dev/null 2>&1
    wait "$spid" 2> /dev/null
    python3 - "$csv" "$METRIC" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(rows[-1][sys.argv[2]] if rows else "")
PY
    rm -f "$csv"
}

for rep in $(seq 1 "$REPS"); do
    mark=""
    wait_quiet "$LOAD_MAX" "$QUIET_WAIT" || mark="LOADED "
    IFS=';' read -r -a pts <<< "$POINTS"
    for pt in "${pts[@]}"; do
        set -- $pt
        l=$(load1)
        a=$(tx "$A" "$@")
        b=$(tx "$B" "$@")
        echo "${mark}rep=$rep op=$OP tls=$1 mem=$2 size=$3 batch=$4 load=$l metric=$METRIC a_tx_us=$a b_tx_us=$b" |
            tee -a "$log"
    done
done
python3 - "$log" <<'PY'
import re, statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    m = dict(re.findall(r"(\w+)=(\S+)", line))
    if not m.get("a_tx_us") or not m.get("b_tx_us"):
        continue
    k = "%s %s %s x%s" % (m["tls"], m["mem"], m["size"], m["batch"])
    a, b = float(m["a_tx_us"]), float(m["b_tx_us"])
    rows.setdefault(k, []).append((a, b, b / a, line.startswith("LOADED")))
f = lambda v, p: "%s / %s / %s" % tuple(p % x for x in (min(v), st.median(v), max(v)))
metric = next((dict(re.findall(r"(\w+)=(\S+)", l)).get("metric") for l in open(sys.argv[1])), None) or "avg_tx_us"
print("point | pairs | A %s min/med/max | B %s | B/A" % (metric, metric))
for k, v in rows.items():
    note = " (some LOADED)" if any(x[3] for x in v) else ""
    print("%s | %d%s | %s | %s | %s" % (k, len(v), note, f([x[0] for x in v], "%.0f"),
                                       f([x[1] for x in v], "%.0f"), f([x[2] for x in v], "%.2f")))
PY
