#!/usr/bin/env bash
# compare.sh - kvxfer_perf next to ucx_perftest in one run, at the same
# message sizes, transport set (UCX_TLS) and memory placement, with the
# ratio kvxfer / ucx_perftest per row, and single-thread memcpy of the same
# pool (the physical limit of one copying thread) next to it.
#
# Usage: perf/compare.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR  meson build directory with perf/bench/kvxfer_perf (build)
#   OUT_DIR    raw logs, CSVs and summary.md (perf/results/compare-<date>)
# Env knobs: REPS (3: the summary gives the median and the min-max of the
#   repetitions; this VM is shared and noisy), TLS_LIST ("tcp sm"), ITERS
#   (20), WARMUP (auto: one pass over
#   the pool so every block was touched once), POOL (256M),
#   PT_ITERS_1M (500), PT_ITERS_32K (4000), PORT_BASE (14600), CASES
#   ("1m 32k"), LOAD_MAX (0.6: the 1-minute load above which no target is
#   judged), QUIET_WAIT (0: seconds to wait before each run for the 1-minute
#   load to drop below LOAD_MAX), KVX_ARGS (more kvxfer_perf arguments, e.g.
#   "--resident").
#
# Load: the 1-minute load average is recorded before and after every run
# (loads.csv). Figures taken while it exceeded LOAD_MAX are printed but no
# target is called met or missed from them ("not judged").
#
# Cases (both as two processes on 127.0.0.1, like ucx_perftest; no pinning):
#   1m   contiguous 1 MiB runs: llama-8b, contiguous block ids, batch 32 ->
#        per transfer 64 runs of 1 MiB (K and V of 32 layers), window 16
#        (kvxfer max_inflight_bytes 16M)   vs ucx_perftest -s 1M -O 16
#   32k  scattered 32 KiB blocks: llama-8b, scattered ids, batch 32 -> 2048
#        runs of 32 KiB per transfer, window 32 (max_inflight_bytes 1M)
#        vs ucx_perftest -s 32K -O 32
# READ is compared with ucp_get, WRITE with ucp_put_bw. Placement "ucx":
# kvxfer pools from api->alloc_region, perftest's default UCX allocation;
# "app": kvxfer pools mmap()ed by the application and registered, perftest
# with UCX_ALLOC_PRIO=mmap,heap. kvxfer's pool (256 MiB per side, larger
# than the 32 MiB LLC) is cold; ucx_perftest reuses one buffer (hot).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-$root/build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
out=${2:-$here/results/compare-$(date +%Y%m%d-%H%M%S)}
perf=$build/perf/bench/kvxfer_perf
REPS=${REPS:-3}
TLS_LIST=${TLS_LIST:-"tcp sm"}
CASES=${CASES:-"1m 32k"}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-}
POOL=${POOL:-256M}
PT_ITERS_1M=${PT_ITERS_1M:-500}
PT_ITERS_32K=${PT_ITERS_32K:-4000}
port=${PORT_BASE:-14600}
TMO=300
LOAD_MAX=${LOAD_MAX:-0.6}
QUIET_WAIT=${QUIET_WAIT:-0}
KVX_ARGS=${KVX_ARGS:-}

command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)"; exit 1; }
[ -x "$perf" ] || { echo "$perf not built (ninja -C $build)"; exit 1; }
mkdir -p "$out/logs"
pt_csv=$out/perftest.csv
echo "rep,tls,mem,case,test,size,window,iters,overall_MiBs,GBs,rc" > "$pt_csv"
{
    echo "# $(date -Is) $(uname -srm), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p')"
    ucx_info -v | head -2
    echo "# load: $(cat /proc/loadavg)"
    echo "# REPS=$REPS TLS_LIST=$TLS_LIST CASES=$CASES ITERS=$ITERS POOL=$POOL"
} > "$out/env.txt"

. "$here/load.sh"

# quiet_gate TAG: wait up to QUIET_WAIT s for a quiet machine, then record
# the load before the run (the caller records it after).
quiet_gate() {
    wait_quiet "$LOAD_MAX" "$QUIET_WAIT"
    echo "$rep,$1,before,$(load1)" >> "$out/loads.csv"
}

# wait_pid PID SECONDS: wait for PID, end it (by its PID) after the deadline
wait_pid() {
    local pid=$1 left=$(( $2 * 10 ))
    while kill -0 "$pid" 2>/dev/null && [ $left -gt 0 ]; do
        sleep 0.1; left=$((left - 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "compare.sh: ending pid $pid after its deadline" >&2
        kill "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
}


# ucx_perftest TLS MEM CASE TEST SIZE WINDOW ITERS
run_perftest() {
    local tls=$1 mem=$2 cs=$3 test=$4 size=$5 win=$6 n=$7 envs tag line bw rc spid
    envs=(UCX_TLS="$tls")
    [ "$mem" = app ] && envs+=(UCX_ALLOC_PRIO=mmap,heap)
    port=$((port + 1))
    tag="pt_${tls}_${mem}_${cs}_${test}_r$rep"
    quiet_gate "$tag"
    env "${envs[@]}" timeout $TMO ucx_perftest -p "$port" > "$out/logs/$tag.server.log" 2>&1 &
    spid=$!
    wait_listen "$port"
    env "${envs[@]}" UCX_LOG_LEVEL=info timeout $TMO ucx_perftest 127.0.0.1 -p "$port" \
        -t "$test" -s "$size" -n "$n" -w $((n / 20 + 2)) -O "$win" -v \
        > "$out/logs/$tag.client.log" 2>&1
    rc=$?
    wait_pid "$spid" 10
    echo "$rep,$tag,after,$(load1)" >> "$out/loads.csv"
    line=$(grep -E '^ *[0-9]+,' "$out/logs/$tag.client.log" | tail -1 | tr -d ' ')
    bw=$(echo "$line" | cut -d, -f6)
    [ -z "$bw" ] && bw=0
    echo "$rep,$tls,$mem,$cs,$test,$size,$win,$n,$bw,$(awk -v b="$bw" 'BEGIN{printf "%.4f", b*1048576/1e9}'),$rc" >> "$pt_csv"
    printf '  ucx_perftest %-10s %-4s %-3s %-10s -s %-8s -O %-3s %10.1f MiB/s rc=%s\n' \
        "$tls" "$mem" "$cs" "$test" "$size" "$win" "$bw" "$rc"
}

# kvxfer_perf as two processes: TLS CASE ARGS...
run_kvxfer() {
    local tls=$1 cs=$2; shift 2
    local tag="kvx_${tls}_${cs}_r$rep" spid rc
    port=$((port + 1))
    quiet_gate "$tag"
    timeout $TMO "$perf" -p "$port" --bind 127.0.0.1 --accept-timeout 60 -q \
        > "$out/logs/$tag.server.log" 2>&1 &
    spid=$!
    timeout $TMO "$perf" 127.0.0.1 -p "$port" --tls "$tls" -t read,write \
        --mem ucx,app -n "$ITERS" ${WARMUP:+-w "$WARMUP"} --pool "$POOL" --memcpy -q \
        --csv "$out/kvxfer_${tls}_${cs}_r$rep.csv" "$@" $KVX_ARGS > "$out/logs/$tag.client.log" 2>&1
    rc=$?
    wait_pid "$spid" 30
    echo "$rep,$tag,after,$(load1)" >> "$out/loads.csv"
    echo "  kvxfer_perf  $tls $cs rc=$rc ($out/logs/$tag.client.log)"
    cat "$out/logs/$tag.client.log"
}

echo "compare.sh: results in $out"
echo "rep,run,when,load1" > "$out/loads.csv"
base=$build/perf/bench/kvxfer_ctl_baseline
echo "rep,kind,n,p50_us,avg_us,p99_us" > "$out/ctl_baseline.csv"
for rep in $(seq 1 "$REPS"); do
if [ -x "$base" ]; then
    port=$((port + 2))
    timeout 60 "$base" -c -n 2000 -p "$port" | sed "s/^/$rep,/" >> "$out/ctl_baseline.csv"
    port=$((port + 1))
fi
for tls in $TLS_LIST; do
    for cs in $CASES; do
        case $cs in
            1m)  args=(-m llama-8b --contiguous -b 32 --max-inflight 16M); size=1048576; win=16; n=$PT_ITERS_1M ;;
            32k) args=(-m llama-8b -b 32 --max-inflight 1M); size=32768; win=32; n=$PT_ITERS_32K ;;
            *) echo "unknown case $cs"; exit 1 ;;
        esac
        echo "== $tls / $cs"
        run_kvxfer "$tls" "$cs" "${args[@]}"
        for mem in ucx app; do
            run_perftest "$tls" "$mem" "$cs" ucp_get "$size" "$win" "$n"
            run_perftest "$tls" "$mem" "$cs" ucp_put_bw "$size" "$win" "$n"
        done
    done
done
done

python3 - "$out" "$LOAD_MAX" <<'PY' | tee "$out/summary.md"
import csv, glob, os, re, statistics, sys
out = sys.argv[1]
load_max = float(sys.argv[2])
loads = [float(r["load1"]) for r in csv.DictReader(open(os.path.join(out, "loads.csv")))]
peak = max(loads) if loads else float("nan")
quiet = bool(loads) and peak < load_max
def verdict(ok):
    """A target is judged only from a quiet run (every recorded 1-minute
    load below LOAD_MAX)."""
    if not quiet:
        return f"not judged (load {peak:.2f} >= {load_max})"
    return "met" if ok else "missed"
def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")
def med(v):
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")
def rng(v):
    v = [x for x in v if x == x]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "-"
pt = {}
for r in csv.DictReader(open(os.path.join(out, "perftest.csv"))):
    pt.setdefault((r["tls"], r["mem"], r["case"], r["test"]), {})[r["rep"]] = fnum(r["GBs"])
kv = {}
for f in sorted(glob.glob(os.path.join(out, "kvxfer_*_r*.csv"))):
    m = re.match(r"kvxfer_(.+)_(\w+)_r(\d+)\.csv", os.path.basename(f))
    tls, cs, rp = m.group(1), m.group(2), m.group(3)
    for r in csv.DictReader(open(f)):
        kv.setdefault((tls, cs, r["mem"], r["mode"]), {})[rp] = r
order = sorted(kv, key=lambda k: (k[0], k[1], k[3], k[2]))
print(f"1-minute load during the runs: {min(loads) if loads else float('nan'):.2f}-{peak:.2f} (loads.csv); "
      + ("quiet (< %s): targets judged." % load_max if quiet else
         "NOT quiet (>= %s): the figures are printed, no target is judged." % load_max))
print()
print("Medians over the repetitions (min-max in brackets). GB/s = 1e9 B/s.")
print()
print("| UCX_TLS | mem | case | op | kvxfer GB/s | kvxfer wall GB/s (gaps count) | ucx_perftest GB/s | ratio | target | memcpy GB/s (same pool) | kvxfer / memcpy | Post/Run us (<=0.5) | Avg Tx us | Runs/Xfer |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for key in order:
    tls, cs, mem, op = key
    reps = kv[key]
    test = "ucp_get" if op == "READ" else "ucp_put_bw"
    pts = pt.get((tls, mem, cs, test), {})
    ks = [fnum(r["bw_GBs"]) for r in reps.values()]
    ps = [pts.get(rp, float("nan")) for rp in reps]
    ratios = [k / p if p > 0 else float("nan") for k, p in zip(ks, ps)]
    ms = [fnum(r["memcpy_bw_GBs"]) for r in reps.values()]
    kms = [k / m if m > 0 else float("nan") for k, m in zip(ks, ms)]
    ratio, km = med(ratios), med(kms)
    ppr = med([fnum(r["post_per_run_us"]) for r in reps.values()])
    tgt = ""
    if cs == "1m":
        tgt = ">=0.95 " + verdict(ratio >= 0.95)
    elif cs == "32k":
        tgt = ">=0.85 " + verdict(ratio >= 0.85)
        if tls == "sm":
            tgt += "; cold vs memcpy >=0.8 " + verdict(km >= 0.8)
    ws = [fnum(r.get("wall_bw_GBs")) for r in reps.values()]
    print(f"| {tls} | {mem} | {cs} | {op} | {med(ks):.3f} ({rng(ks)}) | {med(ws):.3f} | {med(ps):.3f} ({rng(ps)}) | {ratio:.2f} ({rng(ratios)}) | {tgt} | {med(ms):.2f} | {km:.2f} | {ppr:.3f} {verdict(ppr <= 0.5)} | {med([fnum(r['avg_tx_us']) for r in reps.values()]):.0f} | {med([fnum(r['runs_per_xfer']) for r in reps.values()]):.0f} |")
print()
print("Transports (initiator's endpoint, from api->transports):")
print()
seen = set()
for key in order:
    r = next(iter(kv[key].values()))
    k2 = (key[0], key[2], key[3])
    if k2 not in seen:
        seen.add(k2)
        print(f"- {key[0]}, mem {key[2]}, {key[3]}: `{r['transports']}`, RMA: {r.get('rma_mode', '?')}")
print()
print("Control plane (each setup's probe: the connecting transfer, then 30 one-block transfers 2 ms apart). Round trip = the library's own figure for the release (READ, D) / write_done (WRITE, P): queued -> reply received (api->stats ctl_rtt). One-way = D done -> P freed (READ) / P flushed -> D notified (WRITE), as the two applications observe it (noisy: each side sees its event when its thread runs).")
print()
base = {}
bpath = os.path.join(out, "ctl_baseline.csv")
if os.path.exists(bpath):
    for r in csv.DictReader(open(bpath)):
        base.setdefault(r["kind"], []).append(fnum(r["p50_us"]))
nng50 = med(base.get("nng", []))
tcp50 = med(base.get("tcp", []))
print(f"Floor on this machine (kvxfer_ctl_baseline, blocking ping-pong between two processes, median of the p50s): raw TCP {tcp50:.0f} us, bare nng req/rep {nng50:.0f} us.")
print()
print("| UCX_TLS | mem | op | handshake us (<=2000) | metadata / endpoint / rkeys us | first transfer us | round trip p50 us (<=200) | p99 us | / bare nng p50 | one-way avg us |")
print("|---|---|---|---|---|---|---|---|---|---|")
seen = set()
for key in order:
    tls, cs, mem, op = key
    if (tls, mem, op) in seen:
        continue
    seen.add((tls, mem, op))
    rows = [r for (t, c, m, o), reps in kv.items() if (t, m, o) == (tls, mem, op) for r in reps.values()]
    hs = med([fnum(r["handshake_us"]) for r in rows])
    nt = med([fnum(r["ctl_ntfy_avg_us"]) for r in rows])
    rt = med([fnum(r.get("ctl_rtt_p50_us")) for r in rows])
    rt99 = med([fnum(r.get("ctl_rtt_p99_us")) for r in rows])
    parts = "/".join(f"{med([fnum(r.get(k)) for r in rows]):.0f}" for k in ("hs_metadata_us", "hs_endpoint_us", "hs_rkeys_us"))
    print(f"| {tls} | {mem} | {op} | {hs:.0f} ({rng([fnum(r['handshake_us']) for r in rows])}) {verdict(0 <= hs <= 2000)} | {parts} | {med([fnum(r['first_xfer_us']) for r in rows]):.0f} | {rt:.0f} ({rng([fnum(r.get('ctl_rtt_p50_us')) for r in rows])}) {verdict(rt <= 200)} | {rt99:.0f} | {rt / nng50 if nng50 > 0 else float('nan'):.2f} | {nt:.0f} |")
PY
