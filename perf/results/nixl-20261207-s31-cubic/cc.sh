#!/bin/bash
# cc.sh OUT CC: tcp WRITE 1M (x1, x32) both residencies, kvxfer 1.13 and nixlbench, under congestion control CC
cd /work/main
export NIXL_LD_LIBRARY_PATH=/work/scratch/nixl-install/lib:/work/scratch/nixl-install/lib/plugins:/work/scratch/ucx-1.22/lib:/work/scratch/nixl-deps/abseil/lib
export NIXL_PLUGIN_DIR=/work/scratch/nixl-install/lib/plugins
old=$(sysctl -n net.ipv4.tcp_congestion_control)
sysctl -w net.ipv4.tcp_congestion_control=$2 >/dev/null
REPS=${REPS:-2} PIN_KVX=1 TLS_LIST=tcp OPS=WRITE SIZES=1048576 BATCHES="${BATCHES:-1 32}" perf/nixl.sh /work/scratch/nixl-bench-install/bin/nixlbench ucx1.13=/tmp/bdef -- $1
sysctl -w net.ipv4.tcp_congestion_control=$old >/dev/null
sysctl net.ipv4.tcp_congestion_control
