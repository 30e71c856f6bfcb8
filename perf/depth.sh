#!/usr/bin/env bash
# depth.sh - do several transfers in flight scale (issue 14)? kvxfer_perf
# with 1, 2, 4 and 8 transfers in flight (-d), the same blocks size and
# count each, cache-resident, application memory, READ and WRITE, over
# shared memory and tcp; two processes on 127.0.0.1. Every run starts once
# the 1-minute load is below LOAD_MAX (or after QUIET_WAIT s, then marked
# "LOADED"). Prints one line per run and, at the end, per (tls, op, depth)
# transfers per second min / median / max and the speed-up over depth 1 of
# the same repetition (min / median / max).
#
# Usage: perf/depth.sh [BUILD_DIR] [OUT_FILE]
# Env: REPS (3), ITERS (2000), SIZE (32K), BATCH (1), DEPTHS ("1 2 4 8"),
#      TLS_LIST ("sm tcp"), OPS ("read write"), LOAD_MAX (0.6),
#      QUIET_WAIT (300), WRITE_AHEAD (1: WRITE runs kvxfer_perf
#      --write-ahead, P's layers ready before D asks; 0: P waits for each
#      remote_blocks, polling, as the results before 5 December 2026 did)
#      PIN (0: P and D unpinned, the scheduler places their threads; 1: P
#      on CPU 0 and D on CPU 1, as perf/nixl.sh's PIN_KVX=1 and nixlbench)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
out=${2:-$here/results/depth-$(date +%Y%m%d-%H%M%S).txt}
perf=$build/perf/bench/kvxfer_perf
REPS=${REPS:-3}
ITERS=${ITERS:-2000}
SIZE=${SIZE:-32K}
BATCH=${BATCH:-1}
DEPTHS=${DEPTHS:-"1 2 4 8"}
TLS_LIST=${TLS_LIST:-"sm tcp"}
OPS=${OPS:-"read write"}
LOAD_MAX=${LOAD_MAX:-0.6}
QUIET_WAIT=${QUIET_WAIT:-300}
pin0=() pin1=() pinned=0
case ${PIN:-0} in
    0) ;;
    1) { taskset -c 0 true && taskset -c 1 true; } 2> /dev/null ||
           { echo "depth.sh: PIN=1 needs taskset and CPUs 0 and 1"; exit 1; }
       pin0=(taskset -c 0) pin1=(taskset -c 1) pinned=1 ;;
    *) echo "depth.sh: PIN must be 0 or 1, not '$PIN'"; exit 1 ;;
esac
[ -x "$perf" ] || { echo "$perf not built"; exit 1; }
mkdir -p "$(dirname "$out")"
: > "$out"
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT

. "$here/load.sh"


echo "# depth.sh $(date -u +%FT%TZ) build $build size $SIZE batch $BATCH" \
     "iters $ITERS pin $pinned" >> "$out"
port=$((18000 + RANDOM % 1000))
for rep in $(seq 1 "$REPS"); do
    for tls in $TLS_LIST; do
        for op in $OPS; do
            l=$(quiet) # one gate per series of depths: they run back to back
            for depth in $DEPTHS; do
                extra=()
                [ "$op" = write ] && [ "${WRITE_AHEAD:-1}" = 1 ] &&
                    extra=(--write-ahead)
                port=$((port + 1))
                timeout 300 "${pin0[@]}" "$perf" -p "$port" --bind 127.0.0.1 \
                    --accept-timeout 60 -q > /dev/null 2>&1 &
                spid=$!
                sleep 0.3 # the server's listener; the client retries too
                timeout 300 "${pin1[@]}" "$perf" 127.0.0.1 -p "$port" --tls "$tls" -t "$op" \
                    --mem app --resident --layers 1 --layout split -s "$SIZE" \
                    -b "$BATCH" -d "$depth" -n "$ITERS" "${extra[@]}" -q \
                    -f csv --csv "$csv" \
                    > /dev/null 2>&1 ||
                    echo "# kvxfer_perf $tls $op depth $depth failed" >> "$out"
                wait "$spid" 2>/dev/null
                python3 - "$csv" "$rep" "$tls" "$op" "$depth" "$l" >> "$out" <<'PY'
import csv, sys
f, rep, tls, op, depth, load = sys.argv[1:]
for r in csv.DictReader(open(f)):
    print(f"rep={rep} tls={tls} op={op} depth={depth} load={load} "
          f"xfers_per_s={r['xfers_per_s']} tx_us={r['avg_tx_us']} "
          f"wall_bw_GBs={r['wall_bw_GBs']}")
PY
                : > "$csv"
            done
        done
    done
done

python3 - "$out" <<'PY' | tee -a "$out"
import collections, statistics, sys
rows = [dict(kv.split("=", 1) for kv in l.split()) for l in open(sys.argv[1])
        if l.startswith("rep=")]
rate = {(r["rep"], r["tls"], r["op"], int(r["depth"])): float(r["xfers_per_s"])
        for r in rows}
by = collections.defaultdict(list)
up = collections.defaultdict(list)
for (rep, tls, op, d), v in rate.items():
    by[(tls, op, d)].append(v)
    base = rate.get((rep, tls, op, 1))
    if base:
        up[(tls, op, d)].append(v / base)
def mmm(v, f):
    return " / ".join(f % x for x in (min(v), statistics.median(v), max(v)))
print("tls | op | depth | runs | transfers/s | speed-up over depth 1")
for k in sorted(by):
    print(f"{k[0]} | {k[1]} | {k[2]} | {len(by[k])} | {mmm(by[k], '%.0f')} | "
          f"{mmm(up[k], '%.2f') if up[k] else '-'}")
loaded = sum(1 for r in rows if r["load"].startswith("LOADED"))
if loaded:
    print(f"# {loaded} runs started under load: not a quiet figure")
PY
