/*
 * run.h - one contiguous copy of a transfer plan: len bytes from local_off
 * (relative to the local layer's base) to or from remote_off (relative to
 * the remote layer's base). Plans are built by the connector logic and
 * posted by the data plane.
 */
#ifndef KVC_RUN_H
#define KVC_RUN_H

#include <stdint.h>

typedef struct kvc_run {
    uint64_t local_off;
    uint64_t remote_off;
    uint64_t len;
} kvc_run_t;

#endif
