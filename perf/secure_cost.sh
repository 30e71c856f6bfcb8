#!/usr/bin/env bash
# secure_cost.sh - what the secure defaults cost, as pair-by-pair ratios
# (A B A B ...) of kvxfer_perf runs that differ in one thing only.
#
# Usage: perf/secure_cost.sh am|tls [BUILD_DIR] [OUT_DIR]
#   am   data plane over tcp: kvxfer's checked active messages (default,
#        A) against UCX 1.13's own software RMA emulation
#        (KVX_UCX_AM_RMA=0, B). Ratio A/B of bw_GBs per op and case.
#   tls  control plane: mutual TLS (--tls-dir, certificates made here with
#        openssl, A) against plain TCP (B). Ratio A/B (the target is
#        <= 1.20 on the control path) of xfers_per_s and avg_tx_us (case
#        ctl below: the control path a framework sees per transfer), of
#        the probe's ctl_tx_avg_us and ctl_ntfy_avg_us (30 one-block
#        transfers 2 ms apart: noisy), of ctl_rtt_p50_us (an nng request ->
#        reply, "-" when none crossed the control plane), and of bw_GBs.
# Cases (CASES, default "1m 32k", tls "ctl 1m 32k"): compare.sh's 1m (64
# contiguous 1 MiB runs per transfer) and 32k (2048 scattered 32 KiB blocks
# per transfer); tls's ctl: one block of the tiny model per transfer,
# ITERS_CTL (2000) of them one at a time, WRITE with --write-ahead (from
# D's consumer_request: remote_blocks, P's puts, its completion), where
# the control path is most of a transfer: transfers/s and avg Tx (µs).
# READ and WRITE, tcp, application memory, two processes on 127.0.0.1.
# Env: PAIRS (5), ITERS (20), PORT_BASE (14800), LOAD_MAX (0.6),
# QUIET_WAIT (600): the series starts once the 1-minute load is below
# LOAD_MAX (waiting at most QUIET_WAIT s); a series that had to start above
# it is printed but marked "under load". The load during the series is the
# benchmark's own (two busy processes) and is recorded, not judged.
set -u
mode=${1:-}
case "$mode" in am|tls) ;; *) sed -n '2,27p' "$0"; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${2:-$root/build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
out=${3:-$here/results/secure-$mode-$(date +%Y%m%d-%H%M%S)}
perf=$build/perf/bench/kvxfer_perf
PAIRS=${PAIRS:-5}
ITERS=${ITERS:-20}
port=${PORT_BASE:-14800}
LOAD_MAX=${LOAD_MAX:-0.6}
if [ "$mode" = tls ]; then CASES=${CASES:-ctl 1m 32k}; else CASES=${CASES:-1m 32k}; fi
QUIET_WAIT=${QUIET_WAIT:-600}
[ -x "$perf" ] || { echo "$perf not built (ninja -C $build)"; exit 1; }
mkdir -p "$out/logs"
echo "variant,pair,case,load_before,load_after,csv" > "$out/runs.csv"

pki=$(mktemp -d /tmp/kvxfer-secure-cost-pki-XXXXXX)
trap 'rm -rf "$pki"' EXIT # throwaway keys: never kept with the results
if [ "$mode" = tls ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$pki/ca.key" -out "$pki/ca.crt" -subj "/CN=kvxfer-perf-ca" \
        -days 2 2>/dev/null &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$pki/peer.key" -out "$pki/peer.csr" -subj "/CN=kvxfer-peer" \
        2>/dev/null &&
    openssl x509 -req -in "$pki/peer.csr" -CA "$pki/ca.crt" \
        -CAkey "$pki/ca.key" -CAcreateserial -out "$pki/peer.crt" -days 2 \
        2>/dev/null || { echo "secure_cost.sh: openssl failed"; exit 1; }
fi

. "$here/load.sh"

# run VARIANT PAIR CASE: one server + client kvxfer_perf run.
run() {
    local v=$1 pair=$2 cs=$3 envs=() extra=() args tag before spid rc left
    local n=$ITERS
    case $cs in
        1m)  args=(-m llama-8b --contiguous -b 32 --max-inflight 16M) ;;
        32k) args=(-m llama-8b -b 32 --max-inflight 1M) ;;
        ctl) args=(-m tiny -b 1 --write-ahead); n=${ITERS_CTL:-2000} ;;
    esac
    case $mode/$v in
        am/B)  envs=(KVX_UCX_AM_RMA=0) ;;
        tls/A) extra=(--tls-dir "$pki") ;;
    esac
    port=$((port + 1))
    tag="${mode}_${v}_${cs}_p$pair"
    before=$(load1)
    env "${envs[@]}" timeout 300 "$perf" -p "$port" --bind 127.0.0.1 \
        --accept-timeout 60 -q "${extra[@]}" > "$out/logs/$tag.server.log" 2>&1 &
    spid=$!
    env "${envs[@]}" timeout 300 "$perf" 127.0.0.1 -p "$port" --tls tcp \
        -t read,write --mem app -n "$n" -q "${extra[@]}" "${args[@]}" \
        -f csv --csv "$out/$tag.csv" > "$out/logs/$tag.client.log" 2>&1
    rc=$?
    left=300
    while kill -0 "$spid" 2>/dev/null && [ $left -gt 0 ]; do
        sleep 0.1; left=$((left - 1))
    done
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    [ $rc -eq 0 ] || echo "secure_cost.sh: $tag failed (rc $rc, $out/logs/$tag.client.log)"
    echo "$v,$pair,$cs,$before,$(load1),$out/$tag.csv" >> "$out/runs.csv"
}

{
    echo "# $(date -Is) $(uname -srm), $(nproc) cpus"
    ucx_info -v | head -2
    echo "# mode=$mode PAIRS=$PAIRS ITERS=$ITERS load: $(cat /proc/loadavg)"
} > "$out/env.txt"
wait_quiet "$LOAD_MAX" "$QUIET_WAIT"
echo "$(load1)" > "$out/start_load"
for pair in $(seq 1 "$PAIRS"); do
    for cs in $CASES; do
        run A "$pair" "$cs"
        run B "$pair" "$cs"
    done
done

python3 - "$out" "$mode" "$LOAD_MAX" "$CASES" <<'PY' | tee "$out/summary.md"
import csv, statistics, sys
out, mode, load_max = sys.argv[1], sys.argv[2], float(sys.argv[3])
cases = sys.argv[4].split()
runs = list(csv.DictReader(open(out + "/runs.csv")))
start = float(open(out + "/start_load").read())
peak = max(max(float(r["load_before"]), float(r["load_after"])) for r in runs)
rows = {}
for r in runs:
    try:
        for row in csv.DictReader(open(r["csv"])):
            rows[(r["variant"], r["pair"], r["case"], row["mode"])] = row
    except FileNotFoundError:
        pass
metrics = [("bw_GBs", "bandwidth")]
if mode == "tls":
    metrics[0:0] = [("xfers_per_s", "transfers/s"),
                    ("avg_tx_us", "transfer avg (µs)"),
                    ("ctl_tx_avg_us", "probe: one-block transfer avg (µs)"),
                    ("ctl_ntfy_avg_us", "probe: release / completion one-way avg (µs)"),
                    ("ctl_rtt_p50_us", "nng round trip p50 (µs)")]
names = {"am": ("checked active messages", "UCX emulation (KVX_UCX_AM_RMA=0)"),
         "tls": ("mutual TLS", "plain TCP")}[mode]
print(f"# secure_cost.sh {mode}: A = {names[0]}, B = {names[1]}")
print(f"1-minute load at the start {start:.2f}" +
      ("" if start < load_max else f" (>= {load_max}: under load, not a quiet-window figure)") +
      f"; peak during the series (the benchmark's own) {peak:.2f}")
print()
print("| case | op | metric | A median | B median | A/B min | A/B median | A/B max | pairs |")
print("|---|---|---|---|---|---|---|---|---|")
for cs in cases:
    for op in ("READ", "WRITE"):
        for key, label in metrics:
            a, b, ratio = [], [], []
            for p in sorted({r["pair"] for r in runs}):
                ra = rows.get(("A", p, cs, op))
                rb = rows.get(("B", p, cs, op))
                if not ra or not rb:
                    continue
                va, vb = float(ra[key]), float(rb[key])
                if va < 0 or vb < 0:
                    continue  # not measured (no sample in that run)
                a.append(va); b.append(vb)
                if vb > 0:
                    ratio.append(va / vb)
            if not ratio:
                print(f"| {cs} | {op} | {label} | - | - | - | - | - | 0 |")
                continue
            print(f"| {cs} | {op} | {label} | {statistics.median(a):.3f} | "
                  f"{statistics.median(b):.3f} | {min(ratio):.2f} | "
                  f"{statistics.median(ratio):.2f} | {max(ratio):.2f} | {len(ratio)} |")
PY
