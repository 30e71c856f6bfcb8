#!/usr/bin/env bash
# nixl.sh - kvxfer_perf next to nixlbench (NIXL's benchmark, UCX backend) at
# the same points, in one run, with the ratio kvxfer / nixlbench per point.
# NIXL is not part of kvxfer and is not built here: give the path of a
# nixlbench you built (NIXL's benchmark/nixlbench, its ASIO runtime: two
# processes on one host, no etcd) and the library path it needs.
#
# Usage: perf/nixl.sh NIXLBENCH LABEL=BUILD_DIR[:LD_LIBRARY_PATH]... [-- OUT_DIR]
#   NIXLBENCH   the nixlbench binary
#   LABEL=DIR   a kvxfer meson build (perf/bench/kvxfer_perf in it), e.g.
#               ucx1.13=build ucx1.22=build-ucx122:/opt/ucx-1.22/lib (the
#               library path, when given, is prepended for that build's runs)
#   OUT_DIR     raw logs, rows.csv, summary.md (perf/results/nixl-<date>)
# Env knobs: NIXL_LD_LIBRARY_PATH (libraries nixlbench needs: NIXL's, its
#   UCX's, abseil's), NIXL_PLUGIN_DIR (NIXL's plugins), REPS (3), TLS_LIST
#   ("tcp sm"), OPS ("READ WRITE"), SIZES ("32768 1048576"), BATCHES ("1
#   32"), RESIDENCY ("resident cold"), LOAD_MAX (0.6), QUIET_WAIT (120:
#   seconds to wait for the 1-minute load to drop below LOAD_MAX before each
#   run), PORT_BASE (15600), PIN (1: pin nixlbench's two processes to CPUs
#   0 and 1 as its author's runs do; both busy-poll, and on one core every
#   round trip costs a time slice), PIN_KVX (0: kvxfer_perf's P and D
#   unpinned, the scheduler places their threads; 1: P on CPU 0, D on CPU 1,
#   as nixlbench's, which on 2 vCPUs is placement A of perf/placement.sh;
#   a build whose LABEL ends in "-pinned" is pinned so whatever PIN_KVX
#   says, so one run can hold a build unpinned and pinned side by side;
#   a LABEL ending in "-region" (or holding "-region-") runs kvxfer_perf
#   with --mem ucx: both KV pools in alloc_region memory, which same-host
#   peers copy directly through their mapping, not application memory).
#
# A point: one transfer in flight of BATCH blocks of SIZE bytes, host memory
# the application allocated and registered on both sides (nixlbench DRAM,
# kvxfer --mem app), UCX_TLS=TLS (nixlbench; kvxfer ucx_tls). kvxfer moves
# one layer of a key-only layout (one run per block), its blocks scattered in
# the pool (nixlbench's batch entries are adjacent in its buffer, and kvxfer
# would merge adjacent blocks into one run). WRITE runs kvxfer_perf with
# --write-ahead (P's layers ready before D asks, as nixlbench's initiator
# has its data; Tx and B/W from D's consumer_request, remote_blocks
# included); WRITE_AHEAD=0 leaves it out. Residency "resident": every
# transfer moves the same blocks (kvxfer --resident; nixlbench always does);
# "cold": kvxfer walks a 256 MiB pool (larger than the LLC), nixlbench gets
# --total_buffer_size of the same 256 MiB but still reuses its first
# BATCH x SIZE bytes, so its cold column is the resident one (said in the
# summary). Iterations: 1 GiB per point, 10..1000 transfers, a tenth as
# warm-up, for both (a "-region" build's cold points: kvxfer_perf's own
# warm-up, a tenth and at least one pass over the pool).
#
# Load: every run waits for a quiet machine and records the 1-minute load
# before and after (rows.csv); a point with a run that started at LOAD_MAX
# or more is printed but marked "loaded" and not used for a verdict (the
# load after a run is the benchmarks' own: nixlbench spins on both CPUs).
# SUMMARY_ONLY=1 perf/nixl.sh X -- OUT_DIR rewrites OUT_DIR/summary.md from
# its rows.csv.
#
# The other references in the same table: PERFTEST="LABEL=BIN[:LD_LIBRARY_PATH]
# ..." runs each ucx_perftest at every resident point (ucp_get for READ,
# ucp_put_bw for WRITE, -s SIZE, -O BATCH operations in flight, BATCH x the
# transfers as iterations, UCX_TLS=TLS, application memory:
# UCX_ALLOC_PRIO=mmap,heap; it reuses one buffer, so it has no cold run);
# its label pairs it with the kvxfer build of the same label (the same UCX).
# memcpy: kvxfer_perf --memcpy of the first build, single-thread copies of
# the same blocks of the same pool, per point (MEMCPY=0 leaves it out).
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { sed -n '2,20p' "$0"; exit 2; }
nixl=$1; shift
builds=()
out=$here/results/nixl-$(date +%Y%m%d-%H%M%S)
while [ $# -gt 0 ]; do
    case $1 in
        --) out=$2; shift 2 ;;
        *=*) builds+=("$1"); shift ;;
        *) echo "nixl.sh: not LABEL=BUILD_DIR: $1" >&2; exit 2 ;;
    esac
done
[ -x "$nixl" ] || { echo "nixl.sh: $nixl is not executable" >&2; exit 2; }
REPS=${REPS:-3}
TLS_LIST=${TLS_LIST:-"tcp sm"}
OPS=${OPS:-"READ WRITE"}
SIZES=${SIZES:-"32768 1048576"}
BATCHES=${BATCHES:-"1 32"}
RESIDENCY=${RESIDENCY:-"resident cold"}
LOAD_MAX=${LOAD_MAX:-0.6}
QUIET_WAIT=${QUIET_WAIT:-120}
PIN=${PIN:-1}
PIN_KVX=${PIN_KVX:-0}
port=${PORT_BASE:-15600}
TMO=300
mkdir -p "$out/logs"
. "$here/load.sh"

[ "${SUMMARY_ONLY:-0}" = 1 ] || {
    echo "# $(date -Is) $(uname -srm), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p')"
    echo "# nixlbench: $nixl"
    echo "# kvxfer builds: ${builds[*]}"
    echo "# REPS=$REPS TLS_LIST=$TLS_LIST OPS=$OPS SIZES=$SIZES BATCHES=$BATCHES RESIDENCY=$RESIDENCY PIN=$PIN PIN_KVX=$PIN_KVX"
} > "$out/env.txt"
[ "${SUMMARY_ONLY:-0}" = 1 ] ||
    echo "rep,tool,tls,op,size,batch,residency,iters,bw_GBs,avg_lat_us,load_before,load_after,rc" > "$out/rows.csv"

# iters SIZE BATCH: 1 GiB per point, 10..1000 transfers
iters() {
    local n=$(( 1073741824 / ($1 * $2) ))
    [ $n -lt 10 ] && n=10
    [ $n -gt 1000 ] && n=1000
    echo $n
}


# row TOOL BW LAT LOAD0 RC: one line of rows.csv (globals: the point)
row() {
    echo "$rep,$1,$tls,$op,$size,$batch,$res,$n,$2,$3,$4,$(load1),$5" >> "$out/rows.csv"
    printf '  %-16s %-4s %-5s %8s x %-3s %-8s %10s GB/s %10s us/block  load %s rc=%s\n' \
        "$1" "$tls" "$op" "$size" "$batch" "$res" "$2" "$3" "$4" "$5"
}

run_nixl() {
    local tag="nixl_${tls}_${op}_${size}_${batch}_${res}_r$rep" l0 rc p0 line
    local total=$(( size * batch ))
    local pin0=() pin1=() envs=(UCX_TLS="$tls" UCX_NET_DEVICES=lo)
    [ "$res" = cold ] && total=268435456
    [ $total -lt 67108864 ] && total=67108864
    [ "$tls" = tcp ] || envs+=(UCX_MM_ERROR_HANDLING=y) # NIXL's peer error mode
    [ -n "${NIXL_LD_LIBRARY_PATH:-}" ] && envs+=(LD_LIBRARY_PATH="$NIXL_LD_LIBRARY_PATH")
    [ -n "${NIXL_PLUGIN_DIR:-}" ] && envs+=(NIXL_PLUGIN_DIR="$NIXL_PLUGIN_DIR")
    [ "$PIN" = 1 ] && pin0=(taskset -c 0) && pin1=(taskset -c 1)
    local args=(--runtime_type=ASIO --asio_address=127.0.0.1 --asio_port=$port
                --backend=UCX --worker_type=nixl --initiator_seg_type=DRAM
                --target_seg_type=DRAM --op_type="$op"
                --start_block_size="$size" --max_block_size="$size"
                --start_batch_size="$batch" --max_batch_size="$batch"
                --num_iter="$n" --warmup_iter=$(( n / 10 > 2 ? n / 10 : 2 ))
                --large_blk_iter_ftr=1 --total_buffer_size=$total)
    port=$((port + 1))
    wait_quiet "$LOAD_MAX" "$QUIET_WAIT"
    l0=$(load1)
    env "${envs[@]}" timeout $TMO "${pin0[@]}" "$nixl" "${args[@]}" > "$out/logs/$tag.p0.log" 2>&1 &
    p0=$!
    wait_listen $((port - 1))
    env "${envs[@]}" timeout $TMO "${pin1[@]}" "$nixl" "${args[@]}" > "$out/logs/$tag.p1.log" 2>&1
    wait "$p0"
    rc=$?
    # The initiator (rank 0) prints: block size, batch, B/W, avg lat, ...
    line=$(grep -hE "^ *$size +$batch +[0-9.]+ +[0-9.]+" "$out/logs/$tag.p0.log" "$out/logs/$tag.p1.log" | head -1)
    row nixlbench "$(echo "$line" | awk '{print $3}')" "$(echo "$line" | awk '{print $4}')" "$l0" "$rc"
}

run_kvxfer() {
    local label=$1 dir=$2 ld=${3:-} tag l0 rc spid perf csv envs=()
    tag="kvx_${label}_${tls}_${op}_${size}_${batch}_${res}_r$rep"
    perf=$dir/perf/bench/kvxfer_perf
    csv=$out/logs/$tag.csv
    [ -n "$ld" ] && envs+=(LD_LIBRARY_PATH="$ld")
    local resident=() memcpy=() pin0=() pin1=() mem=app
    if [ "$PIN_KVX" = 1 ] || [ "${label%-pinned}" != "$label" ]; then
        pin0=(taskset -c 0) pin1=(taskset -c 1)
    fi
    local warm=(-w $(( n / 10 > 2 ? n / 10 : 2 )))
    # alloc_region pools, cold points: kvxfer_perf's own warm-up (n/10 and
    # at least one pass over the pool), so each page of the peer's segment
    # was copied through this process's new mapping once before the timed
    # transfers: on this VM that first touch costs about 5 us a page even
    # after MADV_POPULATE_READ (perf/README.md, "KV pools in alloc_region
    # memory against nixlbench"). Resident points move the same blocks
    # throughout and keep a tenth (a resident direct READ with a warm-up of
    # 8,192 once timed out on P: D ran too far ahead; kvxfer_perf's --lead
    # now bounds that, perf/README.md "D's lead over P").
    case $label in *-region|*-region-*) mem=ucx; [ "$res" = cold ] && warm=() ;; esac
    [ "$label" = "$first_label" ] && [ "${MEMCPY:-1}" = 1 ] && memcpy=(--memcpy)
    [ "$res" = resident ] && resident=(--resident)
    [ "$op" = WRITE ] && [ "${WRITE_AHEAD:-1}" = 1 ] &&
        resident+=(--write-ahead)
    port=$((port + 1))
    wait_quiet "$LOAD_MAX" "$QUIET_WAIT"
    l0=$(load1)
    env "${envs[@]}" timeout $TMO "${pin0[@]}" "$perf" -p "$port" --bind 127.0.0.1 --accept-timeout 60 -q \
        > "$out/logs/$tag.server.log" 2>&1 &
    spid=$!
    env "${envs[@]}" timeout $TMO "${pin1[@]}" "$perf" 127.0.0.1 -p "$port" --tls "$tls" \
        -t "$(echo "$op" | tr A-Z a-z)" --mem "$mem" --layers 1 --layout key-only \
        -s "$size" -b "$batch" "${resident[@]}" -n "$n" "${warm[@]}" \
        "${memcpy[@]}" -q --csv "$csv" > "$out/logs/$tag.client.log" 2>&1
    rc=$?
    wait "$spid" 2>/dev/null
    if [ "$label" = "$first_label" ] && [ "${MEMCPY:-1}" = 1 ]; then
        row memcpy \
            "$(python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[-1]["memcpy_bw_GBs"] if r else "")' "$csv" 2>/dev/null)" \
            "" "$l0" "$rc"
    fi
    row "kvxfer-$label" \
        "$(python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[-1]["bw_GBs"] if r else "")' "$csv" 2>/dev/null)" \
        "$(python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[-1]["avg_lat_us"] if r else "")' "$csv" 2>/dev/null)" \
        "$l0" "$rc"
}

# run_perftest LABEL BIN LD: one ucx_perftest run at the point.
run_perftest() {
    local label=$1 bin=$2 ld=${3:-} tag l0 rc spid line bw test=ucp_get
    local envs=(UCX_TLS="$tls" UCX_ALLOC_PRIO=mmap,heap)
    [ "$op" = WRITE ] && test=ucp_put_bw
    [ -n "$ld" ] && envs+=(LD_LIBRARY_PATH="$ld")
    tag="pt_${label}_${tls}_${op}_${size}_${batch}_r$rep"
    port=$((port + 1))
    wait_quiet "$LOAD_MAX" "$QUIET_WAIT"
    l0=$(load1)
    env "${envs[@]}" timeout $TMO "$bin" -p "$port" > "$out/logs/$tag.server.log" 2>&1 &
    spid=$!
    wait_listen "$port"
    env "${envs[@]}" timeout $TMO "$bin" 127.0.0.1 -p "$port" -t "$test" \
        -s "$size" -n $(( n * batch )) -w $(( n * batch / 10 + 2 )) -O "$batch" \
        > "$out/logs/$tag.client.log" 2>&1
    rc=$?
    wait "$spid" 2>/dev/null
    # The last line of numbers: ..., bandwidth MB/s (average, overall), ...
    line=$(grep -E '^ *Final: |^ *[0-9]+ +[0-9.]+' "$out/logs/$tag.client.log" | tail -1)
    bw=$(echo "$line" | sed 's/Final://' | awk '{ if (NF >= 7) printf "%.4f", $(NF-2) * 1048576 / 1e9 }')
    row "ucx_perftest-$label" "$bw" "" "$l0" "$rc"
}

# split_spec LABEL=PATH[:LD]: prints LABEL PATH [LD] (no spaces in them).
split_spec() {
    local spec=${1#*=} path
    path=${spec%%:*}
    if [ "$spec" != "$path" ]; then
        echo "${1%%=*} $path ${spec#*:}"
    else
        echo "${1%%=*} $path"
    fi
}

first_label=${builds[0]:-}
first_label=${first_label%%=*}
read -r -a perftests <<< "${PERFTEST:-}"
echo "nixl.sh: results in $out"
[ "${SUMMARY_ONLY:-0}" = 1 ] && REPS=0
for rep in $(seq 1 "$REPS"); do
    for tls in $TLS_LIST; do
        for op in $OPS; do
            for size in $SIZES; do
                for batch in $BATCHES; do
                    for res in $RESIDENCY; do
                        n=$(iters "$size" "$batch")
                        run_nixl
                        for b in "${builds[@]}"; do
                            run_kvxfer $(split_spec "$b")
                        done
                        [ "$res" = resident ] || continue
                        for b in "${perftests[@]}"; do
                            run_perftest $(split_spec "$b")
                        done
                    done
                done
            done
        done
    done
done

python3 - "$out" "$LOAD_MAX" <<'PY' | tee "$out/summary.md"
import csv, os, statistics, sys
out, load_max = sys.argv[1], float(sys.argv[2])
rows = list(csv.DictReader(open(os.path.join(out, "rows.csv"))))
def f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")
pts, tools = {}, []
for r in rows:
    key = (r["tls"], r["op"], int(r["size"]), int(r["batch"]), r["residency"])
    pts.setdefault(key, {}).setdefault(r["tool"], []).append(
        (int(r["rep"]), f(r["bw_GBs"]),
         f(r["load_before"]), r["rc"]))
    if r["tool"] not in tools:
        tools.append(r["tool"])
def mmm(v):
    v = sorted(x for x in v if x == x and x > 0)
    if not v:
        return "-"
    return f"{v[0]:.3f} / {statistics.median(v):.3f} / {v[-1]:.3f}"
print(f"# kvxfer_perf vs nixlbench ({os.path.basename(out)})\n")
print("GB/s min / median / max over the repetitions; ratio = kvxfer / nixlbench "
      "pair by pair (same repetition), median; \"loaded\": some run of the "
      f"point started at a 1-minute load >= {load_max}, \"quiet\": none did. "
      "nixlbench's cold column reuses the same buffer (it has no pool walk); "
      "ucx_perftest runs at resident points only (one buffer, BATCH "
      "operations in flight); memcpy: single-thread copies of the same "
      "blocks of the same pool (kvxfer_perf --memcpy), ratio kvxfer / memcpy "
      "of the first kvxfer build.\n")
kvx = [t for t in tools if t.startswith("kvxfer-")]
pts_tools = [t for t in tools if t.startswith("ucx_perftest-")]
refs = pts_tools + (["memcpy"] if "memcpy" in tools else [])
# ratio columns: (kvxfer tool, reference tool, heading)
rcols = [(t, "nixlbench", f"{t}/nixl") for t in kvx]
rcols += [(t, "ucx_perftest-" + t[7:], f"{t}/perftest") for t in kvx
          if "ucx_perftest-" + t[7:] in pts_tools]
if "memcpy" in tools and kvx:
    rcols.append((kvx[0], "memcpy", f"{kvx[0]}/memcpy"))
hdr = "| tls | op | block | batch | residency | nixlbench | " + \
      " | ".join(kvx + refs) + " | " + " | ".join(h for (_, _, h) in rcols) + \
      " | load |"
print(hdr)
print("|" + "---|" * (hdr.count("|") - 1))
for key in sorted(pts):
    d = pts[key]
    loaded = any(l >= load_max for t in d.values() for (_, _, l, _) in t)
    cells = [mmm([bw for (_, bw, _, _) in d.get("nixlbench", [])])]
    for t in kvx + refs:
        cells.append(mmm([bw for (_, bw, _, _) in d.get(t, [])]))
    ratios = []
    for (t, ref, _) in rcols:
        rb = {rep: bw for (rep, bw, _, _) in d.get(ref, [])}
        rs = [bw / rb[rep] for (rep, bw, _, _) in d.get(t, [])
              if rb.get(rep, 0) > 0 and bw == bw and bw > 0]
        ratios.append(f"{statistics.median(rs):.2f}" if rs else "-")
    tls, op, size, batch, res = key
    blk = f"{size // 1024} KiB" if size < 1048576 else f"{size // 1048576} MiB"
    print(f"| {tls} | {op} | {blk} | {batch} | {res} | " + " | ".join(cells) +
          " | " + " | ".join(ratios) + f" | {'loaded' if loaded else 'quiet'} |")
PY
