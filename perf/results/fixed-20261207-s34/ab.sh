#!/bin/bash
# ab.sh A_BUILD B_BUILD PAIRS "tls op mem size batch res n;..." -> lines of A/B bw and ratio
A=$1 B=$2 PAIRS=$3 POINTS=$4
IFS=';' read -r -a pts <<< "$POINTS"
for pt in "${pts[@]}"; do
  read -r tls op mem size batch res n <<< "$pt"
  for r in $(seq 1 $PAIRS); do
    out=""
    for b in A B; do
      [ $b = A ] && dir=$A || dir=$B
      /tmp/s34/quiet.sh; l0=$(cut -d' ' -f1 /proc/loadavg)
      PORT=$((20000 + RANDOM % 20000)); PERF=$dir/perf/bench/kvxfer_perf
      resx=(); [ "$res" = resident ] && resx=(--resident); [ "$op" = write ] && resx+=(--write-ahead)
      warm=(-w $((n/10))); [ "$mem" = ucx ] && [ "$res" = cold ] && warm=()
      timeout 300 taskset -c 0 $PERF -p $PORT --bind 127.0.0.1 --accept-timeout 60 -q > /tmp/s34/ab-srv.log 2>&1 &
      timeout 300 taskset -c 1 $PERF 127.0.0.1 -p $PORT --tls $tls -t $op --mem $mem --layers 1 --layout key-only -s $size -b $batch "${resx[@]}" -n $n "${warm[@]}" -q --csv /tmp/s34/ab.csv > /tmp/s34/ab-cli.log 2>&1
      rc=$?; wait
      bw=$(python3 -c 'import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[-1]["bw_GBs"] if r else "nan")' /tmp/s34/ab.csv 2>/dev/null)
      rm -f /tmp/s34/ab.csv
      out="$out $b=$bw(l$l0,rc$rc)"
      eval "bw_$b=$bw"
    done
    ratio=$(python3 -c "print('%.3f' % ($bw_B/$bw_A))" 2>/dev/null)
    echo "$tls $op $mem $size x$batch $res pair$r:$out B/A=$ratio"
  done
done
