/*
 * layout.c - KV layer geometry and per-transfer offset plans (SPEC §6).
 *
 * Geometry is derived from the tensor shape/strides (elements) and the
 * attention spec; every quantity stored in kvc_geom_t is in bytes. Shape
 * matching writes its reason into a kvc_match_t so that the 5-D case can try
 * both K/V axis positions before reporting one error.
 */
#include "layout.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVC_WHY_MAX 512

typedef struct kvc_match {
    const kvx_layer_desc_t *desc;
    char                    why[KVC_WHY_MAX];
    int                     ovf; /* a multiplication or sum overflowed */
} kvc_match_t;

/* kvc_axes_t: where a 5-D tensor keeps its token and head axes (SPEC §6).
 * The shape names the axes (torch keeps the logical order when a cache is
 * permuted); the strides say where they are in memory. */
typedef struct kvc_axes {
    uint64_t kbs;       /* tokens per (kernel) block on the token axis */
    uint64_t k;         /* kernel blocks per logical block */
    int      tok, head; /* shape axes of tokens and heads (2 or 3) */
    int      ambiguous; /* block_size == num_kv_heads: the shape cannot
                           tell the token axis from the head axis */
} kvc_axes_t;

static int kvc_match_fail(kvc_match_t *m, const char *fmt, ...)
    KVC_PRINTF(2, 3);

static int kvc_match_fail(kvc_match_t *m, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(m->why, sizeof(m->why), fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t kvc_mul(uint64_t a, uint64_t b, int *ovf)
{
    uint64_t r;

    if (__builtin_mul_overflow(a, b, &r)) {
        *ovf = 1;
        return UINT64_MAX;
    }
    return r;
}

static uint64_t kvc_add(uint64_t a, uint64_t b, int *ovf)
{
    uint64_t r;

    if (__builtin_add_overflow(a, b, &r)) {
        *ovf = 1;
        return UINT64_MAX;
    }
    return r;
}

static const char *kvc_kind_name(kvc_layout_kind_t kind)
{
    switch (kind) {
    case KVC_LAYOUT_KEY_ONLY:
        return "key-only";
    case KVC_LAYOUT_SPLIT:
        return "split";
    case KVC_LAYOUT_SPLIT_KERNEL:
        return "split-kernel";
    case KVC_LAYOUT_INTERLEAVED:
        return "interleaved";
    case KVC_LAYOUT_INTERLEAVED_KERNEL:
        return "interleaved-kernel";
    case KVC_LAYOUT_PACKED:
        return "content-packed";
    }
    return "unknown";
}

static const char *kvc_desc_name(const kvx_layer_desc_t *d)
{
    return d->name != NULL ? d->name : "(unnamed)";
}

static uint64_t kvc_dim(const kvx_layer_desc_t *d, int axis)
{
    return (uint64_t)d->shape[axis];
}

static uint64_t kvc_str(const kvx_layer_desc_t *d, int axis)
{
    return (uint64_t)d->stride[axis];
}

static void kvc_shape_str(const kvx_layer_desc_t *d, char *buf, size_t n)
{
    size_t used = 0;

    buf[0] = '\0';
    for (uint32_t i = 0; i < d->ndim && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%" PRId64,
                         i == 0 ? "(" : ",", d->shape[i]);
        if (w < 0) {
            return;
        }
        used += (size_t)w;
    }
    if (used < n) {
        snprintf(buf + used, n - used, ")");
    }
}

/* kvc_dense reports whether axes first..last (size-1 axes ignored) tile a
 * contiguous span of elements in some order: sorted by stride, each stride
 * equals the product of the smaller axes' sizes. */
static int kvc_dense(const kvx_layer_desc_t *d, int first, int last)
{
    int      ax[8];
    int      n      = 0;
    int      ovf    = 0;
    uint64_t expect = 1;

    for (int a = first; a <= last; a++) {
        if (kvc_dim(d, a) > 1) {
            int j = n++;
            while (j > 0 && kvc_str(d, ax[j - 1]) > kvc_str(d, a)) {
                ax[j] = ax[j - 1];
                j--;
            }
            ax[j] = a;
        }
    }
    for (int i = 0; i < n; i++) {
        if (ovf || kvc_str(d, ax[i]) != expect) {
            return 0;
        }
        expect = kvc_mul(expect, kvc_dim(d, ax[i]), &ovf);
    }
    return 1;
}

/* kvc_order: the unit_order code of axes first..last (roles[a - first] is
 * the KVC_ORDER_* role of axis a): digits outermost first, by stride;
 * axes of size 1 left out. */
static uint32_t kvc_order(const kvx_layer_desc_t *d, int first, int last,
                          const uint32_t *roles)
{
    int      ax[8];
    int      n    = 0;
    uint32_t code = 0;

    for (int a = first; a <= last; a++) {
        if (kvc_dim(d, a) > 1) {
            int j = n++;
            while (j > 0 && kvc_str(d, ax[j - 1]) < kvc_str(d, a)) {
                ax[j] = ax[j - 1];
                j--;
            }
            ax[j] = a;
        }
    }
    for (int i = 0; i < n; i++) {
        code = code * 10 + roles[ax[i] - first];
    }
    return code;
}

/* kvc_head_reps: how many times the head axis repeats inside a dense unit
 * spanning axes first..last: the product of the sizes of the axes whose
 * stride is larger than the head axis' stride (0 with one head). */
static uint64_t kvc_head_reps(const kvx_layer_desc_t *d, int first, int last,
                              int head)
{
    uint64_t r = 1;

    if (kvc_dim(d, head) < 2) {
        return 0;
    }
    for (int a = first; a <= last; a++) {
        if (a != head && kvc_dim(d, a) > 1 && kvc_str(d, a) > kvc_str(d, head)) {
            r *= kvc_dim(d, a);
        }
    }
    return r;
}

/* kvc_reach: elements from the first to one past the last element spanned
 * by axes first..last. */
static uint64_t kvc_reach(const kvx_layer_desc_t *d, int first, int last,
                          int *ovf)
{
    uint64_t r = 1;

    for (int a = first; a <= last; a++) {
        r = kvc_add(r, kvc_mul(kvc_dim(d, a) - 1, kvc_str(d, a), ovf), ovf);
    }
    return r;
}

static void kvc_geom_base(const kvx_layer_desc_t *d, kvc_layout_kind_t kind,
                          kvc_geom_t *g)
{
    memset(g, 0, sizeof(*g));
    g->kind                = kind;
    g->transfers_per_block = 1;
    g->elem_size           = d->elem_size;
    g->block_size          = d->block_size;
    g->kernel_block_size   = d->block_size;
    g->num_kv_heads        = d->num_kv_heads;
    g->head_size           = d->head_size;
    g->head_size_v = d->head_size_v != 0 ? d->head_size_v : d->head_size;
    g->key_only    = d->key_only != 0;
}

/* [NB, BS, L] or, with kernel blocks, [NB*k, kbs, L]. */
static int kvc_match_key_only(kvc_match_t *m, kvc_geom_t *g)
{
    const kvx_layer_desc_t *d   = m->desc;
    uint64_t                E   = d->elem_size;
    uint64_t                kbs = kvc_dim(d, 1);
    uint64_t                k;

    if (d->ndim != 3) {
        return kvc_match_fail(m, "a key_only layer needs a 3-D shape "
                                 "[num_blocks, block_size, head_size]");
    }
    if (kvc_dim(d, 2) != d->head_size) {
        return kvc_match_fail(m, "shape[2] = %" PRIu64 ": expected head_size "
                              "%u", kvc_dim(d, 2), d->head_size);
    }
    if (kbs > d->block_size || d->block_size % kbs != 0) {
        return kvc_match_fail(m, "shape[1] = %" PRIu64 ": expected block_size "
                              "%u or a divisor of it", kbs, d->block_size);
    }
    k = d->block_size / kbs;
    if (kvc_dim(d, 0) % k != 0) {
        return kvc_match_fail(m, "shape[0] = %" PRIu64 ": not a multiple of "
                              "the %" PRIu64 " kernel blocks per block",
                              kvc_dim(d, 0), k);
    }
    if (!kvc_dense(d, 1, 2)) {
        return kvc_match_fail(m, "axes 1..2 of a %sblock are not dense "
                              "(stride[1] = %" PRIu64 ", stride[2] = %"
                              PRIu64 ")", k > 1 ? "kernel " : "",
                              kvc_str(d, 1), kvc_str(d, 2));
    }
    kvc_geom_base(d, KVC_LAYOUT_KEY_ONLY, g);
    g->kernel_block_size = (uint32_t)kbs;
    g->num_blocks        = kvc_dim(d, 0) / k;
    g->unit_order = kvc_order(d, 1, 2, (const uint32_t[]){KVC_ORDER_TOK,
                                                          KVC_ORDER_DIM});
    if (k == 1) {
        g->block_len = kvc_mul(kvc_mul(kbs, kvc_dim(d, 2), &m->ovf), E,
                               &m->ovf);
        g->block_stride = kvc_mul(kvc_str(d, 0), E, &m->ovf);
        return 0;
    }
    if (kvc_reach(d, 1, 2, &m->ovf) > kvc_str(d, 0)) {
        return kvc_match_fail(m, "a kernel block does not fit in stride[0] "
                              "%" PRIu64, kvc_str(d, 0));
    }
    g->block_len    = kvc_mul(kvc_mul(k, kvc_str(d, 0), &m->ovf), E, &m->ovf);
    g->block_stride = g->block_len;
    return 0;
}

/* kvc_match_axes finds the token axis of a 5-D tensor among axes 2 and 3 by
 * matching the other one with num_kv_heads; axis 4 must be head_size. */
static int kvc_match_axes(kvc_match_t *m, kvc_axes_t *ax)
{
    const kvx_layer_desc_t *d  = m->desc;
    uint64_t                s2 = kvc_dim(d, 2);
    uint64_t                s3 = kvc_dim(d, 3);
    uint64_t                bs = d->block_size;
    uint64_t                h  = d->num_kv_heads;
    int                     c2, c3;

    if (kvc_dim(d, 4) != d->head_size) {
        return kvc_match_fail(m, "shape[4] = %" PRIu64 ": expected head_size "
                              "%u", kvc_dim(d, 4), d->head_size);
    }
    if ((s2 == bs && s3 == h) || (s3 == bs && s2 == h)) {
        ax->kbs       = bs;
        ax->k         = 1;
        ax->tok       = s2 == bs ? 2 : 3;
        ax->head      = 5 - ax->tok;
        ax->ambiguous = bs == h;
        return 0;
    }
    c2 = s3 == h && s2 < bs && bs % s2 == 0; /* axis 2 is the kernel block */
    c3 = s2 == h && s3 < bs && bs % s3 == 0; /* axis 3 is the kernel block */
    if (c2 && c3) {
        return kvc_match_fail(m, "ambiguous kernel-block layout: shape[2] and "
                              "shape[3] both equal num_kv_heads %" PRIu64
                              ", so the kernel block axis is unknown", h);
    }
    if (!c2 && !c3) {
        return kvc_match_fail(m, "shape[2] = %" PRIu64 ", shape[3] = %" PRIu64
                              ": expected block_size %" PRIu64 " (or a "
                              "divisor of it) and num_kv_heads %" PRIu64,
                              s2, s3, bs, h);
    }
    ax->kbs  = c2 ? s2 : s3;
    ax->k    = bs / ax->kbs;
    ax->tok  = c2 ? 2 : 3;
    ax->head = 5 - ax->tok;
    return 0;
}

static kvc_layout_kind_t kvc_kind_5d(int kv_axis, uint64_t k)
{
    if (kv_axis == 0) {
        return k == 1 ? KVC_LAYOUT_SPLIT : KVC_LAYOUT_SPLIT_KERNEL;
    }
    return k == 1 ? KVC_LAYOUT_INTERLEAVED : KVC_LAYOUT_INTERLEAVED_KERNEL;
}

/* kvc_match_kv interprets a 5-D tensor with the K/V axis at kv_axis (0:
 * split [2, NB, ...], 1: interleaved [NB, 2, ...]). */
static int kvc_match_kv(kvc_match_t *m, int kv_axis, kvc_geom_t *g)
{
    const kvx_layer_desc_t *d      = m->desc;
    int                     nb_ax  = 1 - kv_axis;
    uint64_t                E      = d->elem_size;
    uint64_t                inner  = kvc_mul(kvc_mul(kvc_dim(d, 2),
                                                     kvc_dim(d, 3), &m->ovf),
                                             kvc_dim(d, 4), &m->ovf);
    uint64_t                unit   = kvc_mul(inner, E, &m->ovf);
    kvc_axes_t              ax     = {0, 0, 2, 3, 0};
    uint32_t                roles[4];
    uint64_t                reps;

    if (kvc_match_axes(m, &ax) != 0) {
        return -1;
    }
    if (kvc_dim(d, nb_ax) % ax.k != 0) {
        return kvc_match_fail(m, "shape[%d] = %" PRIu64 ": not a multiple of "
                              "the %" PRIu64 " kernel blocks per block",
                              nb_ax, kvc_dim(d, nb_ax), ax.k);
    }
    if (!kvc_dense(d, 2, 4)) {
        return kvc_match_fail(m, "axes 2..4 of a block are not dense");
    }
    kvc_geom_base(d, kvc_kind_5d(kv_axis, ax.k), g);
    roles[0]                 = KVC_ORDER_KV;
    roles[ax.tok - 1]        = KVC_ORDER_TOK;
    roles[ax.head - 1]       = KVC_ORDER_HEAD;
    roles[3]                 = KVC_ORDER_DIM;
    g->unit_order            = kvc_order(d, 2, 4, roles + 1);
    reps                     = kvc_head_reps(d, 2, 4, ax.head);
    if (!ax.ambiguous && reps * ax.k <= UINT32_MAX) {
        g->head_reps = (uint32_t)(reps * ax.k);
    }
    g->kernel_block_size = (uint32_t)ax.kbs;
    g->num_blocks        = kvc_dim(d, nb_ax) / ax.k;
    if (kv_axis == 0) {
        if (ax.k > 1 && kvc_str(d, 1) != inner) {
            return kvc_match_fail(m, "kernel blocks of one block are not "
                                  "adjacent: stride[1] = %" PRIu64 ", expected "
                                  "%" PRIu64, kvc_str(d, 1), inner);
        }
        g->block_len    = kvc_mul(unit, ax.k, &m->ovf);
        g->block_stride = kvc_mul(kvc_mul(kvc_str(d, 1), ax.k, &m->ovf), E,
                                  &m->ovf);
        g->kv_stride    = kvc_mul(kvc_str(d, 0), E, &m->ovf);
        g->transfers_per_block = 2;
    } else if (ax.k == 1) {
        g->block_len    = unit;
        g->block_stride = kvc_mul(kvc_str(d, 0), E, &m->ovf);
        g->kv_stride    = kvc_mul(kvc_str(d, 1), E, &m->ovf);
        g->transfers_per_block = 2;
    } else {
        /* [NB*k, 2, kbs, H, D]: one unit of k kernel blocks, each holding
         * K and V (axes 2..4 dense, checked above). The order of the axes
         * and the K-to-V stride (kept in kv_stride, which a one-unit
         * layout does not otherwise use) say where every byte is, so two
         * sides agreeing on both hold the same bytes at the same place. */
        g->unit_order = kvc_order(d, 1, 4, roles);
        g->head_reps  = 0;
        g->kv_stride  = kvc_mul(kvc_str(d, 1), E, &m->ovf);
        if (kvc_reach(d, 1, 4, &m->ovf) > kvc_str(d, 0)) {
            return kvc_match_fail(m, "a kernel block does not fit in "
                                  "stride[0] %" PRIu64, kvc_str(d, 0));
        }
        g->block_len = kvc_mul(kvc_mul(kvc_str(d, 0), ax.k, &m->ovf), E,
                               &m->ovf);
        g->block_stride = g->block_len;
    }
    return 0;
}

/* kvc_match_5d tries the split and interleaved readings; a tensor with both
 * shape[0] and shape[1] equal to 2 must validate under exactly one. */
static int kvc_match_5d(kvc_match_t *m, kvc_geom_t *g)
{
    const kvx_layer_desc_t *d = m->desc;
    kvc_geom_t              gs, gi;
    char                    why_split[KVC_WHY_MAX];
    int                     rs, ri;

    if (d->shape[0] != 2 && d->shape[1] != 2) {
        return kvc_match_fail(m, "a 5-D layer needs the K/V axis (size 2) at "
                              "axis 0 [2, num_blocks, ...] or axis 1 "
                              "[num_blocks, 2, ...]");
    }
    if (d->shape[1] != 2) {
        return kvc_match_kv(m, 0, g);
    }
    if (d->shape[0] != 2) {
        return kvc_match_kv(m, 1, g);
    }
    rs = kvc_match_kv(m, 0, &gs);
    snprintf(why_split, sizeof(why_split), "%s", m->why);
    ri = kvc_match_kv(m, 1, &gi);
    if (rs == 0 && ri == 0) {
        return kvc_match_fail(m, "ambiguous: shape[0] and shape[1] are both 2 "
                              "and the tensor fits both split [2, num_blocks, "
                              "...] and interleaved [num_blocks, 2, ...]");
    }
    if (rs == 0 || ri == 0) {
        *g = rs == 0 ? gs : gi;
        return 0;
    }
    snprintf(m->why + strlen(m->why), sizeof(m->why) - strlen(m->why),
             " (as interleaved); %.200s (as split)", why_split);
    return -1;
}

/* [NB, H, BS, Dk+Dv] (SPEC §6 content-packed). */
static int kvc_match_packed(kvc_match_t *m, kvc_geom_t *g)
{
    const kvx_layer_desc_t *d  = m->desc;
    uint64_t                dv = d->head_size_v ? d->head_size_v
                                                : d->head_size;
    uint64_t                dd = (uint64_t)d->head_size + dv;

    if (kvc_dim(d, 1) != d->num_kv_heads) {
        return kvc_match_fail(m, "content-packed [num_blocks, num_kv_heads, "
                              "block_size, head_size+head_size_v]: shape[1] = "
                              "%" PRIu64 ": expected num_kv_heads %u",
                              kvc_dim(d, 1), d->num_kv_heads);
    }
    if (kvc_dim(d, 2) != d->block_size) {
        return kvc_match_fail(m, "content-packed: shape[2] = %" PRIu64
                              ": expected block_size %u", kvc_dim(d, 2),
                              d->block_size);
    }
    if (kvc_dim(d, 3) != dd) {
        return kvc_match_fail(m, "content-packed: shape[3] = %" PRIu64
                              ": expected head_size + head_size_v = %" PRIu64,
                              kvc_dim(d, 3), dd);
    }
    if (!kvc_dense(d, 1, 3)) {
        return kvc_match_fail(m, "axes 1..3 of a block are not dense");
    }
    kvc_geom_base(d, KVC_LAYOUT_PACKED, g);
    g->unit_order   = kvc_order(d, 1, 3, (const uint32_t[]){KVC_ORDER_HEAD,
                                                            KVC_ORDER_TOK,
                                                            KVC_ORDER_DIM});
    g->head_reps    = (uint32_t)kvc_head_reps(d, 1, 3, 1);
    g->num_blocks   = kvc_dim(d, 0);
    g->block_len    = kvc_mul(kvc_mul(kvc_mul(kvc_dim(d, 1), kvc_dim(d, 2),
                                              &m->ovf), dd, &m->ovf),
                              d->elem_size, &m->ovf);
    g->block_stride = kvc_mul(kvc_str(d, 0), d->elem_size, &m->ovf);
    return 0;
}

/* kvc_match_units checks that blocks, and the K and V units of one block,
 * do not overlap: V is either inside the block after K or in a plane after
 * every K unit. */
static int kvc_match_units(kvc_match_t *m, const kvc_geom_t *g)
{
    uint64_t last_end;

    if (g->num_blocks > 1 && g->block_len > g->block_stride) {
        return kvc_match_fail(m, "blocks overlap: block_len %" PRIu64
                              " bytes exceeds block stride %" PRIu64,
                              g->block_len, g->block_stride);
    }
    if (g->transfers_per_block != 2) {
        return 0;
    }
    last_end = kvc_add(kvc_mul(g->num_blocks - 1, g->block_stride, &m->ovf),
                       g->block_len, &m->ovf);
    if (g->kv_stride >= g->block_len &&
        (g->kv_stride + g->block_len <= g->block_stride ||
         g->kv_stride >= last_end)) {
        return 0;
    }
    return kvc_match_fail(m, "K and V units overlap: K/V stride %" PRIu64
                          " bytes, block_len %" PRIu64 ", block stride %"
                          PRIu64, g->kv_stride, g->block_len,
                          g->block_stride);
}

static kvx_status_t kvc_desc_check(const kvx_layer_desc_t *d)
{
    const char *name = kvc_desc_name(d);

    if (d->ndim < 3 || d->ndim > 5) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: ndim %u: must be "
                         "3, 4 or 5", name, d->ndim);
    }
    if (d->elem_size == 0 || d->block_size == 0 || d->head_size == 0 ||
        (d->num_kv_heads == 0 && !d->key_only)) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: elem_size %u, "
                         "block_size %u, head_size %u, num_kv_heads %u: must "
                         "be > 0 (num_kv_heads may be 0 only if key_only)",
                         name, d->elem_size, d->block_size, d->head_size,
                         d->num_kv_heads);
    }
    if (d->elem_size != 1 && d->elem_size != 2 && d->elem_size != 4 &&
        d->elem_size != 8) {
        /* The handshake metadata carries only these (peers would reject
         * every handshake of this engine). */
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: elem_size %u: "
                         "must be 1, 2, 4 or 8 bytes", name, d->elem_size);
    }
    for (uint32_t i = 0; i < d->ndim; i++) {
        if (d->shape[i] <= 0 || d->stride[i] <= 0) {
            return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: shape[%u] = "
                             "%" PRId64 ", stride[%u] = %" PRId64 ": must be "
                             "> 0", name, i, d->shape[i], i, d->stride[i]);
        }
    }
    return KVX_OK;
}

static int kvc_match_desc(kvc_match_t *m, kvc_geom_t *g)
{
    const kvx_layer_desc_t *d = m->desc;

    if (d->key_only) {
        return kvc_match_key_only(m, g);
    }
    if (d->ndim == 3) {
        return kvc_match_fail(m, "a 3-D shape [num_blocks, block_size, "
                              "head_size] needs key_only");
    }
    if (d->ndim == 4) {
        return kvc_match_packed(m, g);
    }
    return kvc_match_5d(m, g);
}

/* kvc_geom_wire_check: every quantity of g within what handshake metadata
 * carries (kvc_geom_ints in ctlmsg.c): byte counts at most
 * KVC_GEOM_BYTES_MAX (a stride can exceed the extent: block_stride with one
 * block, kv_stride of a split shape whose strides put K and V far apart),
 * counts of tokens, heads and elements at most INT32_MAX. */
static kvx_status_t kvc_geom_wire_check(const kvx_layer_desc_t *desc,
                                        const char *shape,
                                        const kvc_geom_t *g)
{
    const uint64_t i32 = INT32_MAX;
    const struct {
        const char *name;
        uint64_t    v, max;
        const char *rule;
    } f[] = {
        {"num_blocks", g->num_blocks, KVC_GEOM_BYTES_MAX, "2^53"},
        {"block_len", g->block_len, KVC_GEOM_BYTES_MAX, "2^53"},
        {"block_stride", g->block_stride, KVC_GEOM_BYTES_MAX, "2^53"},
        {"kv_stride", g->kv_stride, KVC_GEOM_BYTES_MAX, "2^53"},
        {"block_size", g->block_size, i32, "2^31-1"},
        {"kernel_block_size", g->kernel_block_size, i32, "2^31-1"},
        {"num_kv_heads", g->num_kv_heads, i32, "2^31-1"},
        {"head_size", g->head_size, i32, "2^31-1"},
        {"head_size_v", g->head_size_v, i32, "2^31-1"},
    };

    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].v > f[i].max) {
            return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: shape %s: %s "
                             "%" PRIu64 " is above %s (the most handshake "
                             "metadata carries)", kvc_desc_name(desc), shape,
                             f[i].name, f[i].v, f[i].rule);
        }
    }
    return KVX_OK;
}

kvx_status_t kvc_geom_from_desc(const struct kvx_layer_desc *desc,
                                kvc_geom_t *geom)
{
    kvc_match_t  m = {.desc = desc};
    kvc_geom_t   g;
    kvx_status_t st;
    char         shape[160];
    uint64_t     extent;

    if (desc == NULL || geom == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer desc %p, geom %p: "
                         "must not be NULL", (const void *)desc,
                         (void *)geom);
    }
    st = kvc_desc_check(desc);
    if (st != KVX_OK) {
        return st;
    }
    kvc_shape_str(desc, shape, sizeof(shape));
    if (kvc_match_desc(&m, &g) != 0 || kvc_match_units(&m, &g) != 0) {
        return kvc_error(KVX_ERR_LAYOUT, "layer %s: unsupported KV layout "
                         "shape %s for block_size %u, num_kv_heads %u, "
                         "head_size %u, head_size_v %u, key_only %u: %s",
                         kvc_desc_name(desc), shape, desc->block_size,
                         desc->num_kv_heads, desc->head_size,
                         desc->head_size_v, desc->key_only, m.why);
    }
    extent = kvc_geom_extent(&g);
    if (m.ovf || extent == UINT64_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: shape %s: byte "
                         "sizes overflow 64 bits", kvc_desc_name(desc), shape);
    }
    if (extent > desc->length) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "layer %s: layout needs %"
                         PRIu64 " bytes but length is %zu",
                         kvc_desc_name(desc), extent, desc->length);
    }
    st = kvc_geom_wire_check(desc, shape, &g);
    if (st != KVX_OK) {
        return st;
    }
    *geom = g;
    return KVX_OK;
}

void kvc_geom_for_peer(const kvc_geom_t *like, uint64_t remote_num_blocks,
                       kvc_geom_t *out)
{
    int ovf = 0;

    *out            = *like;
    out->num_blocks = remote_num_blocks;
    /* SPEC §6: a V plane that follows all K units moves with the remote
     * num_blocks. When K and V share the block (kv_stride < block_stride,
     * e.g. a split shape whose strides put num_blocks outermost) the V
     * offset is per block and does not depend on num_blocks. */
    if ((like->kind == KVC_LAYOUT_SPLIT ||
         like->kind == KVC_LAYOUT_SPLIT_KERNEL) &&
        like->kv_stride >= like->block_stride) {
        out->kv_stride = kvc_mul(like->block_stride, remote_num_blocks, &ovf);
    }
}

uint64_t kvc_geom_extent(const kvc_geom_t *geom)
{
    int      ovf = 0;
    uint64_t end;

    if (geom->num_blocks == 0) {
        return 0;
    }
    end = kvc_add(kvc_mul(geom->num_blocks - 1, geom->block_stride, &ovf),
                  geom->block_len, &ovf);
    if (geom->transfers_per_block == 2) {
        end = kvc_add(end, geom->kv_stride, &ovf);
    }
    return ovf ? UINT64_MAX : end;
}

/* kvc_geom_unit_at: the block whose unit holds byte o (and the bytes left
 * in that unit from o), or 0 when no unit does. */
static int kvc_geom_unit_at(const kvc_geom_t *g, uint64_t o, uint64_t *block,
                            uint64_t *left)
{
    for (uint32_t u = 0; u < g->transfers_per_block && u < 2; u++) {
        uint64_t r = o, b, in;

        if (u == 1) {
            if (o < g->kv_stride) {
                continue;
            }
            r = o - g->kv_stride;
        }
        /* One block may be longer than the stride (nothing follows it);
         * with more, block_len <= block_stride and r / stride is the only
         * candidate. */
        b  = g->num_blocks > 1 && g->block_stride != 0 ? r / g->block_stride
                                                       : 0;
        in = r - b * g->block_stride; /* b * stride <= r: no overflow */
        if (b < g->num_blocks && in < g->block_len) {
            *block = b;
            *left  = g->block_len - in;
            return 1;
        }
    }
    return 0;
}

int kvc_geom_cover(const kvc_geom_t *g, uint64_t off, uint64_t len,
                   int (*ok)(void *arg, uint64_t block), void *arg)
{
    uint64_t block, left;

    if (len == 0) {
        return 0;
    }
    while (len > 0) {
        if (!kvc_geom_unit_at(g, off, &block, &left) || !ok(arg, block)) {
            return 0;
        }
        left = left < len ? left : len;
        off += left;
        len -= left;
    }
    return 1;
}

/* kvc_geom_field_t: one compared geometry quantity, local and remote. */
typedef struct kvc_geom_field {
    const char *name;
    uint64_t    l, r;
} kvc_geom_field_t;

/* kvc_geom_fields: same kind and every pair equal, else
 * KVX_ERR_PEER_INCOMPATIBLE naming the first difference (what: "" or " for
 * N head slices"). */
static kvx_status_t kvc_geom_fields(const kvc_geom_t *local,
                                    const kvc_geom_t *remote,
                                    const kvc_geom_field_t *f, size_t n,
                                    const char *what)
{
    if (local->kind != remote->kind) {
        return kvc_error(KVX_ERR_PEER_INCOMPATIBLE, "peer layer geometry "
                         "differs%s: layout local %s remote %s", what,
                         kvc_kind_name(local->kind),
                         kvc_kind_name(remote->kind));
    }
    for (size_t i = 0; i < n; i++) {
        if (f[i].l != f[i].r) {
            return kvc_error(KVX_ERR_PEER_INCOMPATIBLE, "peer layer geometry "
                             "differs%s: %s: local %" PRIu64 ", remote %"
                             PRIu64, what, f[i].name, f[i].l, f[i].r);
        }
    }
    return KVX_OK;
}

kvx_status_t kvc_geom_compatible(const kvc_geom_t *local,
                                 const kvc_geom_t *remote)
{
    int ik = local->kind == KVC_LAYOUT_INTERLEAVED_KERNEL;
    const kvc_geom_field_t f[] = {
        {"transfers_per_block", local->transfers_per_block,
         remote->transfers_per_block},
        {"block_len", local->block_len, remote->block_len},
        {"block_stride", local->block_stride, remote->block_stride},
        {"elem_size", local->elem_size, remote->elem_size},
        {"block_size", local->block_size, remote->block_size},
        {"kernel_block_size", local->kernel_block_size,
         remote->kernel_block_size},
        {"num_kv_heads", local->num_kv_heads, remote->num_kv_heads},
        {"head_size", local->head_size, remote->head_size},
        {"head_size_v", local->head_size_v, remote->head_size_v},
        {"key_only", local->key_only, remote->key_only},
        {"unit_order (axis order in memory)", local->unit_order,
         remote->unit_order},
        {"head_reps", local->head_reps, remote->head_reps},
        /* inside an interleaved kernel block, V's place next to K */
        {"kv_stride", ik ? local->kv_stride : 0, ik ? remote->kv_stride : 0},
    };

    return kvc_geom_fields(local, remote, f, sizeof(f) / sizeof(f[0]), "");
}

int kvc_geom_same(const kvc_geom_t *a, const kvc_geom_t *b)
{
    return a->kind == b->kind && a->num_blocks == b->num_blocks &&
           a->block_len == b->block_len &&
           a->block_stride == b->block_stride &&
           a->kv_stride == b->kv_stride &&
           a->transfers_per_block == b->transfers_per_block &&
           a->elem_size == b->elem_size && a->block_size == b->block_size &&
           a->kernel_block_size == b->kernel_block_size &&
           a->num_kv_heads == b->num_kv_heads &&
           a->head_size == b->head_size && a->head_size_v == b->head_size_v &&
           a->key_only == b->key_only && a->unit_order == b->unit_order &&
           a->head_reps == b->head_reps;
}

/* kvc_order_nohead: unit_order without the head digit (a side with one
 * head has no head axis in its order). */
static uint32_t kvc_order_nohead(uint32_t code)
{
    uint32_t out = 0, mul = 1;

    for (; code != 0; code /= 10) {
        if (code % 10 != KVC_ORDER_HEAD) {
            out += (code % 10) * mul;
            mul *= 10;
        }
    }
    return out;
}

/* kvc_geom_parts: local holds head part `of n` of remote (slice) or remote
 * holds one of local's n parts (gather). */
static kvx_status_t kvc_geom_parts(const kvc_geom_t *local,
                                   const kvc_geom_t *remote, uint32_t n,
                                   int gather)
{
    int      ovf = 0;
    const kvc_geom_t *part  = gather ? remote : local;
    const kvc_geom_t *whole = gather ? local : remote;
    uint64_t heads = kvc_mul(part->num_kv_heads, n, &ovf);
    uint64_t len   = kvc_mul(part->block_len, n, &ovf);
    char     what[40];
    const kvc_geom_field_t f[] = {
        {"transfers_per_block", local->transfers_per_block,
         remote->transfers_per_block},
        {"elem_size", local->elem_size, remote->elem_size},
        {"block_size", local->block_size, remote->block_size},
        {"kernel_block_size", local->kernel_block_size,
         remote->kernel_block_size},
        {"head_size", local->head_size, remote->head_size},
        {"head_size_v", local->head_size_v, remote->head_size_v},
        {"unit_order without the head axis (axis order in memory)",
         kvc_order_nohead(local->unit_order),
         kvc_order_nohead(remote->unit_order)},
        /* a part with several heads repeats them as the whole does */
        {"head_reps", part->num_kv_heads > 1 ? part->head_reps
                                             : whole->head_reps,
         whole->head_reps},
    };
    kvx_status_t st;

    if (n < 2) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "head %s: %u: must be >= 2",
                         gather ? "parts" : "slices", n);
    }
    if ((local->kind != KVC_LAYOUT_SPLIT &&
         local->kind != KVC_LAYOUT_SPLIT_KERNEL &&
         local->kind != KVC_LAYOUT_INTERLEAVED &&
         local->kind != KVC_LAYOUT_PACKED) || local->key_only) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED, "reading head %s of a %s "
                         "layer is not supported (sharded heterogeneous TP "
                         "needs split, split-kernel, interleaved or "
                         "content-packed blocks)",
                         gather ? "parts" : "slices",
                         kvc_kind_name(local->kind));
    }
    if (whole->head_reps == 0 || whole->block_len % whole->head_reps != 0) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED, "reading head %s of a %s "
                         "layer with block_size %u == num_kv_heads %u is not "
                         "supported: the shape cannot tell the token axis "
                         "from the head axis (%s side)",
                         gather ? "parts" : "slices",
                         kvc_kind_name(local->kind), whole->block_size,
                         whole->num_kv_heads, gather ? "local" : "remote");
    }
    snprintf(what, sizeof(what), " for %u head %s", n,
             gather ? "parts" : "slices");
    st = kvc_geom_fields(local, remote, f, sizeof(f) / sizeof(f[0]), what);
    /* A part of one head has no head_reps of its own to compare (f above
     * compares the whole's with itself): the whole's, which may be the
     * peer's word, must cut the part into runs that cover it, each of
     * whole elements (part.block_len / head_reps bytes: the axes inside
     * the head axis). Else a plan would move 0-byte runs (a transfer
     * ending OK with nothing moved) or up to block_len runs a unit. */
    if (st == KVX_OK && local->elem_size != 0 &&
        (part->block_len % whole->head_reps != 0 ||
         (part->block_len / whole->head_reps) % local->elem_size != 0)) {
        st = kvc_error(KVX_ERR_PEER_INCOMPATIBLE, "peer layer geometry "
                       "differs%s: %s head_reps %u: must cut the %s head "
                       "part's block_len %" PRIu64 " into runs of whole "
                       "elements (elem_size %u)", what,
                       gather ? "local" : "remote", whole->head_reps,
                       gather ? "remote" : "local", part->block_len,
                       local->elem_size);
    }
    if (st == KVX_OK && (ovf || heads != whole->num_kv_heads ||
                         len != whole->block_len)) {
        /* the part x n against the whole, each under its own label */
        int h = ovf || heads != whole->num_kv_heads;

        st = kvc_error(KVX_ERR_PEER_INCOMPATIBLE, "peer layer geometry "
                       "differs%s: %s: %s %s x %u = %" PRIu64 ", %s %"
                       PRIu64, what, h ? "num_kv_heads" : "block_len",
                       gather ? "remote" : "local",
                       h ? "num_kv_heads" : "block_len", n,
                       ovf ? UINT64_MAX : h ? heads : len,
                       gather ? "local" : "remote",
                       h ? (uint64_t)whole->num_kv_heads : whole->block_len);
    }
    return st;
}

kvx_status_t kvc_geom_sliceable(const kvc_geom_t *local,
                                const kvc_geom_t *remote, uint32_t nslices)
{
    return kvc_geom_parts(local, remote, nslices, 0);
}

kvx_status_t kvc_geom_gatherable(const kvc_geom_t *local,
                                 const kvc_geom_t *remote, uint32_t nparts)
{
    return kvc_geom_parts(local, remote, nparts, 1);
}

size_t kvc_plan_max_runs_sliced(const kvc_geom_t *local,
                                const kvc_geom_t *whole, size_t nlocal)
{
    size_t per = whole != NULL && whole->head_reps ? whole->head_reps : 1;

    return kvc_plan_max_runs(local, nlocal) * per;
}

size_t kvc_plan_max_runs(const kvc_geom_t *local, size_t nlocal)
{
    if (local != NULL && local->transfers_per_block == 1) {
        return nlocal;
    }
    return nlocal * 2;
}

/* kvc_plan_side: one side of a plan (SPEC §6 bounds checks). */
typedef struct kvc_plan_side {
    const char       *name; /* "local" or "remote" */
    const kvc_geom_t *geom;
    uint64_t          region_len;
    const uint64_t   *ids;
} kvc_plan_side_t;

/* kvc_plan_unit computes the offset of transfer unit `unit` (0 K, 1 V) of
 * ids[idx] and checks the id and the byte range against the side. */
static kvx_status_t kvc_plan_unit(const kvc_plan_side_t *s, size_t idx,
                                  uint32_t unit, uint64_t *off_p)
{
    const kvc_geom_t *g   = s->geom;
    uint64_t          id  = s->ids[idx];
    int               ovf = 0;
    uint64_t          off, end;

    if (id >= g->num_blocks) {
        return kvc_error(KVX_ERR_OUT_OF_BOUNDS, "%s block_ids[%zu] = %" PRIu64
                         ": must be < num_blocks %" PRIu64, s->name, idx, id,
                         g->num_blocks);
    }
    off = kvc_mul(id, g->block_stride, &ovf);
    if (unit == 1) {
        off = kvc_add(off, g->kv_stride, &ovf);
    }
    end = kvc_add(off, g->block_len, &ovf);
    if (ovf || end > s->region_len) {
        return kvc_error(KVX_ERR_OUT_OF_BOUNDS, "%s block_ids[%zu] = %" PRIu64
                         ": %s bytes [%" PRIu64 ", %" PRIu64 ") exceed the "
                         "registered region of %" PRIu64 " bytes", s->name,
                         idx, id, unit == 1 ? "V" : "K", off,
                         ovf ? UINT64_MAX : end, s->region_len);
    }
    *off_p = off;
    return KVX_OK;
}

static int kvc_run_cmp(const void *pa, const void *pb)
{
    const kvc_run_t *a = pa;
    const kvc_run_t *b = pb;

    if (a->local_off != b->local_off) {
        return a->local_off < b->local_off ? -1 : 1;
    }
    if (a->remote_off != b->remote_off) {
        return a->remote_off < b->remote_off ? -1 : 1;
    }
    return 0;
}

/* kvc_plan_merge sorts runs by local offset and coalesces neighbours whose
 * local and remote offsets both continue; returns the new count. */
static size_t kvc_plan_merge(kvc_run_t *runs, size_t n)
{
    size_t out = 0;

    if (n == 0) {
        return 0;
    }
    qsort(runs, n, sizeof(*runs), kvc_run_cmp);
    for (size_t i = 1; i < n; i++) {
        kvc_run_t *prev = &runs[out];
        if (runs[i].local_off == prev->local_off + prev->len &&
            runs[i].remote_off == prev->remote_off + prev->len) {
            prev->len += runs[i].len;
        } else {
            runs[++out] = runs[i];
        }
    }
    return out + 1;
}

/* kvc_plan_lists: the arguments every plan needs. */
static kvx_status_t kvc_plan_lists(const kvc_geom_t *local,
                                   const kvc_geom_t *remote,
                                   const uint64_t *local_ids, size_t nlocal,
                                   const uint64_t *remote_ids, size_t nremote,
                                   const kvc_run_t *runs,
                                   const size_t *nruns_p)
{
    if (local == NULL || remote == NULL || nruns_p == NULL ||
        (nlocal > 0 && (local_ids == NULL || remote_ids == NULL ||
                        runs == NULL))) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "plan: geometry, block id "
                         "lists, runs and nruns_p must not be NULL");
    }
    if (nlocal > nremote) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "block_ids: %zu local blocks "
                         "but only %zu remote blocks: local must not exceed "
                         "remote", nlocal, nremote);
    }
    return KVX_OK;
}

static kvx_status_t kvc_plan_args(const kvc_geom_t *local,
                                  const kvc_geom_t *remote,
                                  const uint64_t *local_ids, size_t nlocal,
                                  const uint64_t *remote_ids, size_t nremote,
                                  const kvc_run_t *runs, const size_t *nruns_p)
{
    kvx_status_t st = kvc_plan_lists(local, remote, local_ids, nlocal,
                                     remote_ids, nremote, runs, nruns_p);

    if (st != KVX_OK) {
        return st;
    }
    if (local->transfers_per_block != 1 && local->transfers_per_block != 2) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "plan: transfers_per_block "
                         "%u: must be 1 or 2", local->transfers_per_block);
    }
    return kvc_geom_compatible(local, remote);
}

kvx_status_t kvc_plan_build(const kvc_geom_t *local, uint64_t local_region_len,
                            const kvc_geom_t *remote,
                            uint64_t remote_region_len,
                            const uint64_t *local_ids, size_t nlocal,
                            const uint64_t *remote_ids, size_t nremote,
                            kvc_run_t *runs, size_t *nruns_p)
{
    kvc_plan_side_t ls = {"local", local, local_region_len, local_ids};
    kvc_plan_side_t rs = {"remote", remote, remote_region_len, remote_ids};
    kvx_status_t    st;
    size_t          skip, n = 0;

    st = kvc_plan_args(local, remote, local_ids, nlocal, remote_ids, nremote,
                       runs, nruns_p);
    if (st != KVX_OK) {
        return st;
    }
    /* SPEC §6: a shorter local list (prefix-cache hit) reads the last
     * remote blocks. */
    skip = nremote - nlocal;
    for (size_t i = 0; i < nlocal; i++) {
        for (uint32_t u = 0; u < local->transfers_per_block; u++) {
            kvc_run_t *r = &runs[n++];
            st           = kvc_plan_unit(&ls, i, u, &r->local_off);
            if (st == KVX_OK) {
                st = kvc_plan_unit(&rs, skip + i, u, &r->remote_off);
            }
            if (st != KVX_OK) {
                return st;
            }
            r->len = local->block_len;
        }
    }
    *nruns_p = kvc_plan_merge(runs, n);
    return KVX_OK;
}

/* kvc_plan_parts: kvc_plan_build_sliced (gather 0: local is slice idx of
 * the remote unit) and kvc_plan_build_gathered (gather 1: the remote unit
 * is part idx of the local one). */
static kvx_status_t kvc_plan_parts(const kvc_geom_t *local,
                                   uint64_t local_region_len,
                                   const kvc_geom_t *remote,
                                   uint64_t remote_region_len, uint32_t idx,
                                   uint32_t n, int gather,
                                   const uint64_t *local_ids, size_t nlocal,
                                   const uint64_t *remote_ids, size_t nremote,
                                   kvc_run_t *runs, size_t *nruns_p)
{
    kvc_plan_side_t ls = {"local", local, local_region_len, local_ids};
    kvc_plan_side_t rs = {"remote", remote, remote_region_len, remote_ids};
    kvx_status_t    st;
    size_t          skip, m = 0;
    uint64_t        reps, wrep, prep;

    st = kvc_plan_lists(local, remote, local_ids, nlocal, remote_ids, nremote,
                        runs, nruns_p);
    if (st == KVX_OK) {
        st = kvc_geom_parts(local, remote, n, gather);
    }
    if (st != KVX_OK) {
        return st;
    }
    if (idx >= n) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "head %s %u: must be < %u",
                         gather ? "part" : "slice", idx, n);
    }
    /* Both units are [reps][heads][B]: a part is prep bytes of each of the
     * reps rows of wrep bytes of the whole. */
    reps = gather ? local->head_reps : remote->head_reps;
    wrep = (gather ? local->block_len : remote->block_len) / reps;
    prep = (gather ? remote->block_len : local->block_len) / reps;
    skip = nremote - nlocal;
    for (size_t i = 0; i < nlocal; i++) {
        for (uint32_t u = 0; u < local->transfers_per_block; u++) {
            uint64_t lo, ro;

            st = kvc_plan_unit(&ls, i, u, &lo);
            if (st == KVX_OK) {
                st = kvc_plan_unit(&rs, skip + i, u, &ro);
            }
            if (st != KVX_OK) {
                return st;
            }
            for (uint64_t a = 0; a < reps; a++) {
                runs[m].local_off  = lo + (gather ? a * wrep + idx * prep
                                                  : a * prep);
                runs[m].remote_off = ro + (gather ? a * prep
                                                  : a * wrep + idx * prep);
                runs[m].len        = prep;
                m++;
            }
        }
    }
    *nruns_p = kvc_plan_merge(runs, m);
    return KVX_OK;
}

kvx_status_t kvc_plan_build_sliced(const kvc_geom_t *local,
                                   uint64_t local_region_len,
                                   const kvc_geom_t *remote,
                                   uint64_t remote_region_len,
                                   uint32_t slice, uint32_t nslices,
                                   const uint64_t *local_ids, size_t nlocal,
                                   const uint64_t *remote_ids, size_t nremote,
                                   kvc_run_t *runs, size_t *nruns_p)
{
    return kvc_plan_parts(local, local_region_len, remote, remote_region_len,
                          slice, nslices, 0, local_ids, nlocal, remote_ids,
                          nremote, runs, nruns_p);
}

kvx_status_t kvc_plan_build_gathered(const kvc_geom_t *local,
                                     uint64_t local_region_len,
                                     const kvc_geom_t *remote,
                                     uint64_t remote_region_len,
                                     uint32_t part, uint32_t nparts,
                                     const uint64_t *local_ids, size_t nlocal,
                                     const uint64_t *remote_ids,
                                     size_t nremote, kvc_run_t *runs,
                                     size_t *nruns_p)
{
    return kvc_plan_parts(local, local_region_len, remote, remote_region_len,
                          part, nparts, 1, local_ids, nlocal, remote_ids,
                          nremote, runs, nruns_p);
}
