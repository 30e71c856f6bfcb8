#!/bin/bash
# fixed.sh: per-transfer time at 32 KiB x 1 and 1 MiB x 1, resident, sm, same build, alternating
B=/tmp/bdef; port=17300
wq() { for i in $(seq 240); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 0.6)}" && return; sleep 1; done; }
one() { local op=$1 size=$2 n=$3 csv=/tmp/fx.csv r=(--resident); [ $op = write ] && r+=(--write-ahead)
  port=$((port+1)); rm -f $csv; wq; local l0=$(cut -d' ' -f1 /proc/loadavg)
  taskset -c 0 $B/perf/bench/kvxfer_perf -p $port --bind 127.0.0.1 --accept-timeout 60 -q >/tmp/fx.s.log 2>&1 & local sp=$!
  taskset -c 1 $B/perf/bench/kvxfer_perf 127.0.0.1 -p $port --tls sm -t $op --mem app --layers 1 --layout key-only -s $size -b 1 "${r[@]}" -n $n -w $((n/10)) -q --csv $csv >/tmp/fx.c.log 2>&1 || echo FAIL
  wait $sp
  python3 -c 'import csv,sys; x=list(csv.DictReader(open(sys.argv[1])))[-1]; print(sys.argv[2], sys.argv[3], "%.3f GB/s %.2f us/xfer prep %s load %s"%(float(x["bw_GBs"]), 1e6/float(x["xfers_per_s"]), x["avg_prep_us"], sys.argv[4]))' $csv $op $size $l0
}
for rep in 1 2 3 4; do
  for op in write read; do one $op 32K 20000; one $op 1M 5000; done
done
