/*
 * kvxfer_perf - ucx_perftest-style benchmark of kvxfer (thin CLI over the
 * perf library in kvp_*.c). See `kvxfer_perf --help` and perf/README.md.
 *
 *   kvxfer_perf -l -m llama-8b -b 1,8,32 -t read,write      # one process
 *   kvxfer_perf -p 13338 &  kvxfer_perf 127.0.0.1 -p 13338   # two processes
 *   mpirun -np 4 kvxfer_perf --mpi -m tiny                   # TP2 -> TP2
 */
#include "kvp.h"

#include <stdio.h>

int main(int argc, char **argv)
{
    kvp_opts_t o;
    char       err[512];
    int        rc;

    kvp_opts_defaults(&o);
    rc = kvp_opts_parse(argc, argv, &o, err, sizeof(err));
    if (rc == 1) {
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "kvxfer_perf: %s (see --help)\n", err);
        return 2;
    }
    return kvp_run(&o);
}
