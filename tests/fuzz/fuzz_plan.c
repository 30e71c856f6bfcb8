/*
 * fuzz_plan.c - layer geometry from a registration (kvc_geom_from_desc) and
 * the offset plans built on it (kvc_plan_build, _sliced, _gathered).
 *
 * Input (fz_reader_t, bytes past the end read as 0): a flags byte, the
 * local layer description (shape, strides contiguous or given, sizes,
 * length), the remote geometry (a second description, or the local one
 * with another num_blocks via kvc_geom_for_peer), the remote region
 * length, slice/part numbers and the two block id lists.
 *
 * Invariants:
 *  - an accepted geometry fits its registration (extent <= length), has
 *    num_blocks, block_len >= 1 and 1 or 2 transfers a block, is
 *    compatible with itself and with itself for another num_blocks, and
 *    travels in handshake metadata: kvc_hs_encode -> kvc_hs_decode accepts
 *    it and gives the same geometry;
 *  - every run of every plan has len > 0 and lies inside BOTH registered
 *    regions (no wrap-around), at most the documented capacity of runs;
 *  - kvc_plan_build: runs in local offset order, and every transfer unit of
 *    every (local, remote) block pair is covered by one run at the same
 *    local-to-remote displacement (the plan moves exactly those bytes);
 *  - kvc_geom_cover (the exposure check a peer's get/put goes through):
 *    a byte range is admitted exactly when it lies inside the union of the
 *    K/V units of the allowed blocks (the local id list), computed here
 *    from block_stride, kv_stride and block_len; ok() is asked only about
 *    blocks below num_blocks.
 */
#include "fuzz.h"

#include "ctlmsg.h"
#include "layout.h"

#include <kvxfer/kvxfer.h>

#define FZ_MAX_IDS 16

static void fz_desc(fz_reader_t *r, kvx_layer_desc_t *d)
{
    unsigned flags = (unsigned)fz_take(r, 1);
    uint64_t bytes;
    int64_t  st = 1;

    memset(d, 0, sizeof(*d));
    d->struct_size = sizeof(*d);
    d->name        = "model.layers.0.attn";
    d->base        = (void *)(uintptr_t)0x10000;
    d->mem_type    = KVX_MEM_HOST;
    d->ndim        = 3 + (flags & 3u) % 3u;
    d->key_only    = (flags >> 2) & 1u;
    for (uint32_t i = 0; i < d->ndim; i++) {
        d->shape[i] = (int64_t)fz_take(r, 2);
    }
    for (uint32_t i = d->ndim; i-- > 0;) {
        if (flags & 8u) {
            d->stride[i] = (int64_t)fz_take(r, 4);
        } else {
            d->stride[i] = st;
            st = d->shape[i] > 0 && st < (INT64_C(1) << 40) ? st * d->shape[i]
                                                            : st;
        }
    }
    d->elem_size    = (uint32_t)fz_take(r, 1);
    /* up to 255 tokens a block unless asked (a heads-inner sliced plan has
     * a run per token: large blocks make slow units, not new paths) */
    d->block_size   = (uint32_t)fz_take(r, (flags & 64u) ? 2 : 1);
    d->num_kv_heads = (uint32_t)fz_take(r, 2);
    d->head_size    = (uint32_t)fz_take(r, 2);
    d->head_size_v  = (uint32_t)fz_take(r, 2);
    /* length: the contiguous size plus a little (or minus), or given */
    bytes = (uint64_t)st * (d->elem_size ? d->elem_size : 1);
    if (flags & 16u) {
        d->length = (size_t)fz_take(r, 8);
    } else if (flags & 32u) {
        uint64_t less = fz_take(r, 1);

        d->length = (size_t)(bytes > less ? bytes - less : 0);
    } else {
        d->length = (size_t)(bytes + fz_take(r, 1));
    }
}

/* fz_geom_travels: the geometry in handshake metadata round-trips. */
static void fz_geom_travels(const kvc_geom_t *g, uint64_t length)
{
    kvc_hs_layer_t layer;
    kvc_hs_meta_t  meta, back;
    uint8_t        rkey = 7, worker = 9;
    char          *text;
    size_t         len = 0;

    memset(&layer, 0, sizeof(layer));
    snprintf(layer.name, sizeof(layer.name), "model.layers.0.attn");
    layer.base     = 0x10000;
    layer.length   = length;
    layer.rkey     = &rkey;
    layer.rkey_len = 1;
    layer.mem_type = KVX_MEM_HOST;
    layer.geom     = *g;
    memset(&meta, 0, sizeof(meta));
    meta.version = KVC_PROTO_VERSION;
    snprintf(meta.engine_id, sizeof(meta.engine_id), "10.0.0.1:6301");
    snprintf(meta.host, sizeof(meta.host), "10.0.0.1");
    meta.handshake_port  = 6301;
    meta.notify_port     = 61005;
    meta.dp_size         = 1;
    meta.tp_size         = 1;
    meta.epoch           = 42;
    meta.worker_addr     = &worker;
    meta.worker_addr_len = 1;
    meta.layers          = &layer;
    meta.num_layers      = 1;
    meta.digest          = kvc_hs_digest(&layer, 1);
    text = kvc_hs_encode(&meta, &len);
    FZ_CHECK(text != NULL, "hs encode: %s", kvc_last_error());
    /* Every geometry registration accepts must survive the handshake
     * (elem_size 16 once did not: corpus/plan/open-elem-size-16). */
    FZ_CHECK(kvc_hs_decode(text, len, &back) == KVX_OK,
             "a geometry kvc_geom_from_desc accepted is rejected in "
             "handshake metadata: %s", kvc_last_error());
    FZ_CHECK(back.num_layers == 1 && kvc_geom_same(&back.layers[0].geom, g),
             "geometry changed in the handshake");
    kvc_hs_fini(&back);
    free(text);
}

static void fz_geom_ok(const kvc_geom_t *g, uint64_t length)
{
    kvc_geom_t peer;

    FZ_CHECK(kvc_geom_extent(g) <= length, "extent %llu > length %llu",
             (unsigned long long)kvc_geom_extent(g),
             (unsigned long long)length);
    FZ_CHECK(g->num_blocks >= 1 && g->block_len >= 1, "empty geometry");
    FZ_CHECK(g->transfers_per_block == 1 || g->transfers_per_block == 2,
             "tpb %u", g->transfers_per_block);
    FZ_CHECK(kvc_geom_same(g, g), "not same as itself");
    FZ_CHECK(kvc_geom_compatible(g, g) == KVX_OK, "%s", kvc_last_error());
    kvc_geom_for_peer(g, g->num_blocks + 3, &peer);
    FZ_CHECK(kvc_geom_compatible(g, &peer) == KVX_OK, "%s",
             kvc_last_error());
    fz_geom_travels(g, length);
}

/* fz_runs_inside: every run non-empty and inside both regions. */
static uint64_t fz_runs_inside(const kvc_run_t *runs, size_t n,
                               size_t cap, uint64_t lreg, uint64_t rreg)
{
    uint64_t sum = 0;

    FZ_CHECK(n <= cap, "%zu runs > capacity %zu", n, cap);
    for (size_t i = 0; i < n; i++) {
        const kvc_run_t *r = &runs[i];

        FZ_CHECK(r->len > 0, "run %zu empty", i);
        FZ_CHECK(r->local_off <= lreg && r->len <= lreg - r->local_off,
                 "run %zu local [%llu,+%llu) outside region %llu", i,
                 (unsigned long long)r->local_off,
                 (unsigned long long)r->len, (unsigned long long)lreg);
        FZ_CHECK(r->remote_off <= rreg && r->len <= rreg - r->remote_off,
                 "run %zu remote [%llu,+%llu) outside region %llu", i,
                 (unsigned long long)r->remote_off,
                 (unsigned long long)r->len, (unsigned long long)rreg);
        sum += r->len;
    }
    return sum;
}

/* fz_allow_t: the blocks a cover check may admit (the local id list). */
typedef struct fz_allow {
    const kvc_geom_t *g;
    const uint64_t   *ids;
    size_t            n;
} fz_allow_t;

static int fz_allowed(void *arg, uint64_t block)
{
    const fz_allow_t *a = arg;

    FZ_CHECK(block < a->g->num_blocks, "cover asked about block %llu of %llu",
             (unsigned long long)block,
             (unsigned long long)a->g->num_blocks);
    for (size_t i = 0; i < a->n; i++) {
        if (a->ids[i] == block) {
            return 1;
        }
    }
    return 0;
}

/* fz_cover_expected: 1 when [off, off + len) lies in the union of the
 * units of the allowed blocks, by walking intervals computed here. */
static int fz_cover_expected(const fz_allow_t *a, uint64_t off, uint64_t len)
{
    const kvc_geom_t *g = a->g;
    uint64_t          pos = off, end = off + len;

    if (len == 0) {
        return 0;
    }
    while (pos < end) {
        int found = 0;

        for (size_t i = 0; i < a->n && !found; i++) {
            if (a->ids[i] >= g->num_blocks) {
                continue;
            }
            for (uint32_t u = 0; u < g->transfers_per_block && !found; u++) {
                uint64_t s = a->ids[i] * g->block_stride + u * g->kv_stride;

                if (s <= pos && pos - s < g->block_len) {
                    pos   = s + g->block_len;
                    found = 1;
                }
            }
        }
        if (!found) {
            return 0;
        }
    }
    return 1;
}

/* fz_cover: kvc_geom_cover against fz_cover_expected. The range comes from
 * the input's last bytes; without them, the first allowed block's K unit
 * (or byte 0). */
static void fz_cover(fz_reader_t *r, const kvc_geom_t *g,
                     const uint64_t *ids, size_t n)
{
    fz_allow_t a = {g, ids, n};
    uint64_t   ext = kvc_geom_extent(g);
    uint64_t   off = fz_take(r, 8), len = fz_take(r, 3);

    if (off == 0 && len == 0 && n > 0 && ids[0] < g->num_blocks) {
        off = ids[0] * g->block_stride;
        len = g->block_len;
    }
    off %= ext + 64; /* around the layer, and a little past its end */
    FZ_CHECK(kvc_geom_cover(g, off, len, fz_allowed, &a) ==
                 fz_cover_expected(&a, off, len),
             "cover of [%llu,+%llu) differs from the units' union",
             (unsigned long long)off, (unsigned long long)len);
}

/* fz_plan_covers: kvc_plan_build's runs against the units computed here. */
static void fz_plan_covers(const kvc_geom_t *lg, const kvc_geom_t *rg,
                           const uint64_t *lids, size_t nl,
                           const uint64_t *rids, size_t nr,
                           const kvc_run_t *runs, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        FZ_CHECK(runs[i - 1].local_off <= runs[i].local_off,
                 "runs not in local offset order at %zu", i);
    }
    for (size_t i = 0; i < nl; i++) {
        for (uint32_t u = 0; u < lg->transfers_per_block; u++) {
            uint64_t lo = lids[i] * lg->block_stride + u * lg->kv_stride;
            uint64_t ro = rids[nr - nl + i] * rg->block_stride +
                          u * rg->kv_stride;
            int      found = 0;

            for (size_t k = 0; k < n && !found; k++) {
                found = runs[k].local_off <= lo &&
                        lo - runs[k].local_off <= runs[k].len &&
                        lg->block_len <= runs[k].len -
                                             (lo - runs[k].local_off) &&
                        runs[k].remote_off + (lo - runs[k].local_off) == ro;
            }
            FZ_CHECK(found, "unit %u of pair %zu (local %llu -> remote %llu) "
                     "not moved", u, i, (unsigned long long)lo,
                     (unsigned long long)ro);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader_t      r = {data, size};
    unsigned         flags = (unsigned)fz_take(&r, 1);
    kvx_layer_desc_t ld, rd;
    kvc_geom_t       lg, rg;
    uint64_t         lreg, rreg, lids[FZ_MAX_IDS], rids[FZ_MAX_IDS + 2];
    size_t           nl, nr, cap, nruns = 0;
    uint32_t         a, b;
    kvc_run_t       *runs;
    kvx_status_t     st;

    fz_desc(&r, &ld);
    if (kvc_geom_from_desc(&ld, &lg) != KVX_OK) {
        return 0;
    }
    lreg = ld.length;
    fz_geom_ok(&lg, lreg);
    if (flags & 1u) {
        fz_desc(&r, &rd);
        if (kvc_geom_from_desc(&rd, &rg) != KVX_OK) {
            return 0;
        }
        fz_geom_ok(&rg, rd.length);
        rreg = rd.length;
    } else {
        uint64_t less;

        kvc_geom_for_peer(&lg, fz_take(&r, 2), &rg);
        less = fz_take(&r, 1);
        rreg = kvc_geom_extent(&rg);
        rreg = rreg > less ? rreg - less : 0;
    }
    a  = (uint32_t)fz_take(&r, 1);
    b  = (uint32_t)fz_take(&r, 1);
    nl = (size_t)fz_take(&r, 1) % (FZ_MAX_IDS + 1);
    nr = nl + (size_t)fz_take(&r, 1) % 3;
    if ((flags & 2u) && nr > 0) {
        nr--; /* may be shorter than the local list: rejected */
    }
    for (size_t i = 0; i < nl; i++) {
        lids[i] = (flags & 4u) ? fz_take(&r, 8) : fz_take(&r, 1);
    }
    for (size_t i = 0; i < nr; i++) {
        rids[i] = (flags & 8u) ? fz_take(&r, 8) : fz_take(&r, 1);
    }

    fz_cover(&r, &lg, lids, nl);

    switch ((flags >> 4) % 3u) {
    case 0:
        cap  = kvc_plan_max_runs(&lg, nl);
        runs = calloc(cap ? cap : 1, sizeof(*runs));
        st   = kvc_plan_build(&lg, lreg, &rg, rreg, lids, nl, rids, nr, runs,
                              &nruns);
        if (st == KVX_OK) {
            fz_runs_inside(runs, nruns, cap, lreg, rreg);
            fz_plan_covers(&lg, &rg, lids, nl, rids, nr, runs, nruns);
        }
        break;
    case 1:
        cap  = kvc_plan_max_runs_sliced(&lg, &rg, nl);
        runs = calloc(cap ? cap : 1, sizeof(*runs));
        st   = kvc_plan_build_sliced(&lg, lreg, &rg, rreg, a, b, lids, nl,
                                     rids, nr, runs, &nruns);
        if (st == KVX_OK) {
            FZ_CHECK(a < b, "slice %u of %u accepted", a, b);
            FZ_CHECK(fz_runs_inside(runs, nruns, cap, lreg, rreg) <=
                         (uint64_t)nl * lg.transfers_per_block * lg.block_len,
                     "more bytes than the local units hold");
        }
        break;
    default:
        cap  = kvc_plan_max_runs_sliced(&lg, &lg, nl);
        runs = calloc(cap ? cap : 1, sizeof(*runs));
        st   = kvc_plan_build_gathered(&lg, lreg, &rg, rreg, a, b, lids, nl,
                                       rids, nr, runs, &nruns);
        if (st == KVX_OK) {
            FZ_CHECK(a < b, "part %u of %u accepted", a, b);
            FZ_CHECK(fz_runs_inside(runs, nruns, cap, lreg, rreg) <=
                         (uint64_t)nl * lg.transfers_per_block * lg.block_len,
                     "more bytes than the local units hold");
        }
        break;
    }
    if (st != KVX_OK) {
        FZ_CHECK(kvc_last_error()[0] != '\0', "no error text");
    }
    free(runs);
    return 0;
}
