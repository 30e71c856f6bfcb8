/*
 * kvu_lanes.h - what an endpoint's lanes are and which of them carry
 * one-sided operations, from the text of ucp_ep_print_info (and, where the
 * UCX headers have it, the names ucp_ep_query reports).
 *
 * Pure text handling: no UCX call, so tests feed it captured output
 * (tests/data/ucx-*-ep-*.txt). Two formats exist:
 *
 *  - protocol v1 (UCX 1.13 default): lane lines "lane[i]: r:tl/dev.p md[m]
 *    -> md[m]/cmpt/sysdev[s] roles...", then protocol lines "put[i]: ..." and
 *    "get[i]: ..." naming the lanes one-sided operations use. A lane named
 *    there is an RMA lane; no such line means every put/get is emulated over
 *    active messages.
 *  - protocol v2 (UCX >= 1.16 default): the lane lines carry "seg <size>"
 *    after the destination and no put/get lines (one-sided protocols are
 *    chosen per remote key at first use). The RMA lanes are the "rma_bw#k"
 *    lanes (zero-copy put/get: cma, tcp, verbs, ...) and the shared-memory
 *    lanes (sysv, posix, xpmem, knem), which copy directly into memory UCX
 *    allocated (seen per remote key through ucp_rkey_ptr).
 *
 * Roles are taken only from a fixed vocabulary (am, am_bw#k, rma, rma_bw#k,
 * amo#k, rkey_ptr, tag_offload, keepalive, wireup, device); anything else on
 * a lane line (sizes, "seg N", addresses) is never a role.
 */
#ifndef KVU_LANES_H
#define KVU_LANES_H

#include <stddef.h>

#define KVU_LANES_MAX 16

typedef struct kvu_lane {
    char tl[32];      /* "tcp", "sysv", "cma" */
    char dev[64];     /* "lo", "memory" */
    char roles[128];  /* space-separated, from the vocabulary above */
    int  rma;         /* carries one-sided operations */
} kvu_lane_t;

typedef struct kvu_lanes {
    int        n;
    int        proto_v2;     /* the text is of the v2 format */
    kvu_lane_t lane[KVU_LANES_MAX];
} kvu_lanes_t;

/* kvu_lanes_parse fills out from ucp_ep_print_info text; returns the number
 * of lanes (connection-manager lanes are not data lanes and are skipped). */
int kvu_lanes_parse(const char *text, kvu_lanes_t *out);

/* kvu_lanes_set_names overwrites lane i's transport and device with the
 * names UCX's query API gave (lane order); n is the count it gave. Returns
 * 0, or -1 when n differs from the parsed count (names left unchanged). */
int kvu_lanes_set_names(kvu_lanes_t *l, const char *const *tl,
                        const char *const *dev, int n);

/* kvu_lanes_is_shm: is tl a shared-memory transport whose lanes copy
 * directly into UCX-allocated peer memory (sysv, posix, xpmem, knem)? */
int kvu_lanes_is_shm(const char *tl);

/* kvu_lanes_rma_emulated: no lane carries one-sided operations. */
int kvu_lanes_rma_emulated(const kvu_lanes_t *l);
/* kvu_lanes_rma_on: some RMA lane is transport tl (e.g. "cma": on protocol
 * v2 its rma_bw lane carries zero-copy gets/puts on application memory). */
int kvu_lanes_rma_on(const kvu_lanes_t *l, const char *tl);

/* kvu_lanes_rma_shm_or: some RMA lane is tl and every other one is shared
 * memory (no GPU or RDMA lane beside them). */
int kvu_lanes_rma_shm_or(const kvu_lanes_t *l, const char *tl);

/* kvu_lanes_rma_shm_only: there are RMA lanes and all are shared memory. */
int kvu_lanes_rma_shm_only(const kvu_lanes_t *l);

/* kvu_lanes_am_fifo: the active-message lane is a memory-mapped FIFO
 * (sysv, posix, xpmem: a bounded ring in the peer's shared segment that
 * only the peer drains). Emulated gets send one request message each over
 * it (transports/ucx/README.md, "Emulated gets over a shared-memory FIFO"). */
int kvu_lanes_am_fifo(const kvu_lanes_t *l);
/* kvu_lanes_any_fifo: some lane, whatever its roles, is such a FIFO
 * transport (its two ends must agree on the FIFO's geometry). */
int kvu_lanes_any_fifo(const kvu_lanes_t *l);
/* kvu_lanes_format writes "tl/dev[roles] ..." (roles including "rma" on
 * RMA lanes) to buf; returns the length it needed (like snprintf). */
int kvu_lanes_format(const kvu_lanes_t *l, char *buf, size_t len);

#endif
