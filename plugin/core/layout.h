/*
 * layout.h - KV layer geometry and per-transfer offset plans (SPEC §6).
 *
 * kvc_geom_from_desc derives a layer's per-block geometry from the tensor
 * shape/strides and the attention spec the framework passes at registration
 * (never from a fixed block dimension). kvc_plan_build turns paired block id
 * lists into merged (local offset, remote offset, length) runs, bounds-checked
 * against num_blocks on both sides and against both registered regions.
 * Offsets are in bytes relative to the start of each side's layer tensor.
 *
 * Threading: pure functions, any thread.
 */
#ifndef KVC_LAYOUT_H
#define KVC_LAYOUT_H

#include "error.h"
#include "run.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kvc_layout_kind {
    KVC_LAYOUT_KEY_ONLY           = 1, /* [NB, BS, L] MLA / indexer */
    KVC_LAYOUT_SPLIT              = 2, /* [2, NB, BS, H, D] or [2,NB,H,BS,D] */
    KVC_LAYOUT_SPLIT_KERNEL       = 3, /* [2, NB*k, kbs, H, D] */
    KVC_LAYOUT_INTERLEAVED        = 4, /* [NB, 2, BS, H, D] or [NB,2,H,BS,D] */
    KVC_LAYOUT_INTERLEAVED_KERNEL = 5, /* [NB*k, 2, kbs, H, D] */
    KVC_LAYOUT_PACKED             = 6, /* [NB, H, BS, Dk+Dv] */
} kvc_layout_kind_t;

/* kvc_geom_t: all byte quantities. For split layouts a block has two
 * transfer units (K at b*block_stride, V at kv_stride + b*block_stride); for
 * interleaved (non-kernel) the V unit is at b*block_stride + kv_stride with
 * kv_stride == block_len, so the two merge into one run; the others have one
 * unit of block_len at b*block_stride. */
typedef struct kvc_geom {
    kvc_layout_kind_t kind;
    uint64_t num_blocks;          /* logical blocks */
    uint64_t block_len;           /* bytes of one transfer unit */
    uint64_t block_stride;        /* bytes between logical blocks */
    uint64_t kv_stride;           /* bytes from K unit to V unit (tpb == 2) */
    uint32_t transfers_per_block; /* 1 or 2 */
    uint32_t elem_size;
    uint32_t block_size;          /* logical tokens per block */
    uint32_t kernel_block_size;   /* tokens per kernel block (= block_size
                                     when not a kernel layout) */
    uint32_t num_kv_heads;
    uint32_t head_size;
    uint32_t head_size_v;
    uint32_t key_only;
    uint32_t unit_order;          /* KVC_ORDER_*: physical order of a unit */
    uint32_t head_reps;           /* runs of heads per unit, 0 = no head axis
                                     usable for slicing (see below) */
} kvc_geom_t;

/* unit_order records, from the strides, the physical order (outermost
 * first) of the axes inside one transfer unit as decimal digits of their
 * roles; axes of size 1 are left out (their stride says nothing). Two sides
 * whose units have the same sizes but a different unit_order hold the same
 * numbers at different bytes, so they are incompatible. Example: an HND
 * cache (heads outside tokens) is 324, NHD is 234. */
#define KVC_ORDER_KV   1u /* the K/V axis (interleaved kernel blocks) */
#define KVC_ORDER_TOK  2u /* tokens (block or kernel block) */
#define KVC_ORDER_HEAD 3u /* KV heads */
#define KVC_ORDER_DIM  4u /* head_size / latent / packed content */

/* head_reps: a sliceable unit (split, split-kernel, interleaved,
 * content-packed) is [A][H][B] in memory: A = head_reps repetitions of all
 * H heads, each head B contiguous bytes (the axes physically inside the
 * head axis). NHD [BS,H,D] has A = BS; HND [H,BS,D] has A = 1; a kernel
 * HND unit [k,H,kbs,D] has A = k. 0 when the head axis cannot be told
 * (block_size == num_kv_heads in a non-kernel shape), for key-only and
 * interleaved-kernel layers, and when num_kv_heads is 1 (any A fits). */

struct kvx_layer_desc;

/* KVC_GEOM_BYTES_MAX: the largest byte count (num_blocks, block_len,
 * block_stride, kv_stride) a geometry may hold. Handshake metadata carries
 * them as JSON integers, exact only up to 2^53, so registration refuses
 * more: whatever a layer accepts, the peer can decode. */
#define KVC_GEOM_BYTES_MAX (UINT64_C(1) << 53)

/* kvc_geom_from_desc: KVX_ERR_LAYOUT (with the reason: which dimension did
 * not match which spec value, or that two axes match ambiguously) or
 * KVX_ERR_INVALID_PARAM (zero sizes, ndim out of range, extent of the
 * geometry larger than desc->length, a byte count above
 * KVC_GEOM_BYTES_MAX). */
kvx_status_t kvc_geom_from_desc(const struct kvx_layer_desc *desc,
                                kvc_geom_t *geom);

/* kvc_geom_for_peer returns geometry `like` as a peer with remote_num_blocks
 * would have it: same per-block shape, num_blocks = remote_num_blocks and,
 * for split layouts whose V plane follows all K units (kv_stride >=
 * block_stride), kv_stride = block_stride * remote_num_blocks (SPEC §6: the
 * remote V offset uses the remote num_blocks). A split shape whose strides
 * keep K and V inside one block (kv_stride < block_stride) keeps kv_stride.
 * The product saturates at UINT64_MAX, so kvc_plan_build rejects it. */
void kvc_geom_for_peer(const kvc_geom_t *like, uint64_t remote_num_blocks,
                       kvc_geom_t *out);

/* kvc_geom_extent: bytes the geometry spans from the tensor start (the
 * highest offset + length any valid block can touch). */
uint64_t kvc_geom_extent(const kvc_geom_t *geom);

/* kvc_geom_cover: 1 when every byte of [off, off + len) (offsets from the
 * layer's start) lies in a transfer unit (K or V unit of a block < num_blocks)
 * whose block passes ok(arg, block), else 0 (also for len 0). Units never
 * overlap (kvc_geom_from_desc), so each byte has at most one owner; the walk
 * takes one step per unit piece. */
int kvc_geom_cover(const kvc_geom_t *g, uint64_t off, uint64_t len,
                   int (*ok)(void *arg, uint64_t block), void *arg);

/* kvc_geom_compatible: KVX_OK when a and b have the same kind and per-block
 * shape (everything but num_blocks and kv_stride); otherwise
 * KVX_ERR_PEER_INCOMPATIBLE naming the first differing field and both
 * values. */
kvx_status_t kvc_geom_compatible(const kvc_geom_t *local,
                                 const kvc_geom_t *remote);

/* kvc_geom_sliceable: KVX_OK when local (this rank's heads) can be read as
 * head slice `slice` of nslices from remote (a rank holding nslices times
 * the heads): same kind (split, split-kernel, interleaved or
 * content-packed), the head axis of the side with more heads known
 * (head_reps != 0), the same head_reps on a side with more than one head,
 * the same unit_order apart from the head axis, remote num_kv_heads =
 * nslices x local, equal token count, head sizes and element size, and
 * remote block_len = nslices x local block_len. Otherwise
 * KVX_ERR_PEER_INCOMPATIBLE (or KVX_ERR_NOT_SUPPORTED for a layout that
 * cannot be sliced) naming the field and both values. */
kvx_status_t kvc_geom_sliceable(const kvc_geom_t *local,
                                const kvc_geom_t *remote, uint32_t nslices);

/* kvc_geom_gatherable: the converse, for D tp < P tp: remote (one P rank)
 * holds part `of nparts` of local's heads (remote num_kv_heads x nparts =
 * local, remote block_len x nparts = local), same conditions otherwise. */
kvx_status_t kvc_geom_gatherable(const kvc_geom_t *local,
                                 const kvc_geom_t *remote, uint32_t nparts);

/* kvc_geom_same reports whether two geometries produce identical plans
 * (all fields equal); used to cache plans per geometry. */
int kvc_geom_same(const kvc_geom_t *a, const kvc_geom_t *b);

/* kvc_plan_max_runs: capacity kvc_plan_build needs for nlocal blocks. */
size_t kvc_plan_max_runs(const kvc_geom_t *local, size_t nlocal);

/*
 * kvc_plan_build pairs local_ids[i] with remote_ids[nremote - nlocal + i] (a
 * shorter local list reads the last remote blocks; nlocal > nremote is
 * KVX_ERR_INVALID_PARAM), computes the transfer units, sorts them by local
 * offset and merges neighbours whose local and remote offsets both continue.
 * Every id is checked against its side's num_blocks and every run against
 * its side's region length: KVX_ERR_OUT_OF_BOUNDS naming the side, the list
 * index, the id and the limit. local and remote must pass
 * kvc_geom_compatible (else its KVX_ERR_PEER_INCOMPATIBLE). runs must hold
 * kvc_plan_max_runs() entries; *nruns_p is written only on KVX_OK.
 */
kvx_status_t kvc_plan_build(const kvc_geom_t *local, uint64_t local_region_len,
                            const kvc_geom_t *remote,
                            uint64_t remote_region_len,
                            const uint64_t *local_ids, size_t nlocal,
                            const uint64_t *remote_ids, size_t nremote,
                            kvc_run_t *runs, size_t *nruns_p);

/* kvc_plan_max_runs_sliced: capacity kvc_plan_build_sliced and
 * kvc_plan_build_gathered need (whole: the side holding more heads). */
size_t kvc_plan_max_runs_sliced(const kvc_geom_t *local,
                                const kvc_geom_t *whole, size_t nlocal);

/*
 * kvc_plan_build_sliced is kvc_plan_build for sharded heterogeneous TP
 * (SPEC §4): each local unit receives head slice `slice` (of nslices) of
 * the paired remote unit: one run per head repetition (head_reps of the
 * side holding more heads: 1 for HND, block_size for NHD). Ids and both
 * units are bounds-checked as in kvc_plan_build (a slice lies inside its
 * remote unit); local and remote must pass kvc_geom_sliceable and slice
 * must be < nslices.
 */
kvx_status_t kvc_plan_build_sliced(const kvc_geom_t *local,
                                   uint64_t local_region_len,
                                   const kvc_geom_t *remote,
                                   uint64_t remote_region_len,
                                   uint32_t slice, uint32_t nslices,
                                   const uint64_t *local_ids, size_t nlocal,
                                   const uint64_t *remote_ids, size_t nremote,
                                   kvc_run_t *runs, size_t *nruns_p);

/* kvc_plan_build_gathered: each local unit receives the whole paired remote
 * unit as head part `part` of nparts (D tp < P tp: part k of D's heads from
 * P rank d*r + k). Same checks as kvc_plan_build_sliced, with
 * kvc_geom_gatherable; capacity kvc_plan_max_runs_sliced(local, n). */
kvx_status_t kvc_plan_build_gathered(const kvc_geom_t *local,
                                     uint64_t local_region_len,
                                     const kvc_geom_t *remote,
                                     uint64_t remote_region_len,
                                     uint32_t part, uint32_t nparts,
                                     const uint64_t *local_ids, size_t nlocal,
                                     const uint64_t *remote_ids,
                                     size_t nremote, kvc_run_t *runs,
                                     size_t *nruns_p);

#endif
