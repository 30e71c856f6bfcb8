#!/usr/bin/env bash
# overhead.sh - the fixed cost of one transfer (perf/README.md, "Per-transfer
# overhead"): kvxfer_perf Tx of one-block and 32-block transfers, one in
# flight, cache-resident, shared memory, READ and WRITE, UCX-allocated and
# application memory, beside ucx_perftest ucp_get of the same sizes. Every
# run starts once the 1-minute load is below LOAD_MAX (or after QUIET_WAIT
# s, then marked "LOADED").
#
# Usage: perf/overhead.sh [BUILD_DIR] [OUT_FILE]
# Env: REPS (3), ITERS (2000), LOAD_MAX (0.6), QUIET_WAIT (300), TLS (sm)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
out=${2:-$here/results/overhead-$(date +%Y%m%d-%H%M%S).txt}
perf=$build/perf/bench/kvxfer_perf
REPS=${REPS:-3}
ITERS=${ITERS:-2000}
LOAD_MAX=${LOAD_MAX:-0.6}
QUIET_WAIT=${QUIET_WAIT:-300}
TLS=${TLS:-sm}
[ -x "$perf" ] || { echo "$perf not built"; exit 1; }
mkdir -p "$(dirname "$out")"
: > "$out"
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT

. "$here/load.sh"


port=$((16000 + RANDOM % 1000))
for rep in $(seq 1 "$REPS"); do
    for cs in "4K 1" "32K 32"; do
        set -- $cs
        for op in read write; do
            for mem in ucx app; do
                l=$(quiet); port=$((port + 1))
                timeout 300 "$perf" -p "$port" --bind 127.0.0.1 \
                    --accept-timeout 60 -q > /dev/null 2>&1 &
                spid=$!
                sleep 0.3
                timeout 300 "$perf" 127.0.0.1 -p "$port" --tls "$TLS" -t "$op" \
                    --mem "$mem" --resident --layers 1 --layout split -s "$1" \
                    -b "$2" -n "$ITERS" --memcpy -q -f csv --csv "$csv" \
                    > /dev/null 2>&1 || echo "# kvxfer_perf $op $mem $1x$2 failed" >> "$out"
                wait "$spid" 2>/dev/null
                python3 - "$csv" "$rep" "$op" "$mem" "$1" "$2" "$l" >> "$out" <<'PY'
import csv, sys
f, rep, op, mem, s, b, load = sys.argv[1:]
for r in csv.DictReader(open(f)):
    print(f"kvxfer rep={rep} op={op} mem={mem} size={s} batch={b} load={load} "
          f"bytes={r['xfer_bytes']} tx_us={r['avg_tx_us']} post_us={r['avg_post_us']} "
          f"memcpy_us={r['memcpy_avg_tx_us']} ctl_rtt_p50_us={r['ctl_rtt_p50_us']} "
          f"rma={r['rma_mode']}")
PY
                : > "$csv"
            done
        done
    done
    for bytes in 8192 2097152; do
        l=$(quiet); port=$((port + 1))
        UCX_TLS=$TLS timeout 120 ucx_perftest -p "$port" > /dev/null 2>&1 &
        spid=$!
        sleep 0.5
        r=$(UCX_TLS=$TLS timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get \
                -s "$bytes" -n "$ITERS" 2>&1 | grep Final | tr -s ' ')
        wait "$spid" 2>/dev/null
        echo "ucx_perftest rep=$rep ucp_get bytes=$bytes load=$l $r" >> "$out"
    done
done

python3 - "$out" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("kvxfer "):
        kv = dict(t.split("=", 1) for t in line.split()[1:])
        rows[(kv["op"], kv["mem"], kv["bytes"])].append(float(kv["tx_us"]))
for (op, mem, b), v in sorted(rows.items()):
    print(f"{op:5} {mem:3} {b:>8} B  Tx us min/median/max "
          f"{min(v):.0f}/{statistics.median(v):.0f}/{max(v):.0f}  ({len(v)} runs)")
PY
echo "rows: $out"
