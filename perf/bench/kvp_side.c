/*
 * kvp_side.c - one side of a pair: a kvxfer engine configured through its
 * JSON config, the KV pool (framework-owned mmap or api->alloc_region), one
 * registered tensor per layer, block ids, and the byte check.
 */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int kvp_geom_make(const kvp_model_t *m, uint32_t tp_size, uint64_t block_bytes,
                  uint64_t pool_bytes, uint64_t nb_min, kvp_geom_t *g,
                  char *err, size_t errlen)
{
    uint64_t per;

    memset(g, 0, sizeof(*g));
    g->layout   = m->layout;
    g->layers   = m->layers;
    g->tokens   = m->block_tokens;
    g->elem     = m->elem;
    g->head_dim = m->head_dim;
    if (m->layout == KVP_LAYOUT_KEY_ONLY) {
        g->heads = 1; /* replicated over TP */
    } else if (m->kv_heads <= tp_size) {
        g->heads = 1; /* KV heads replicated: one per rank */
    } else if (m->kv_heads % tp_size != 0) {
        snprintf(err, errlen, "%u KV heads do not divide over TP %u",
                 m->kv_heads, tp_size);
        return -1;
    } else {
        g->heads = m->kv_heads / tp_size;
    }
    per = (uint64_t)g->tokens * g->heads * g->elem;
    if (block_bytes != 0) {
        if (block_bytes % per != 0) {
            snprintf(err, errlen, "block size %" PRIu64 " B: must be a "
                     "multiple of tokens x heads x elem = %" PRIu64 " B",
                     block_bytes, per);
            return -1;
        }
        g->head_dim = (uint32_t)(block_bytes / per);
        if ((uint64_t)g->head_dim * per != block_bytes) {
            snprintf(err, errlen, "block size %" PRIu64 " B too large",
                     block_bytes);
            return -1;
        }
    }
    g->units       = m->layout == KVP_LAYOUT_KEY_ONLY ? 1 : 2;
    g->unit        = per * g->head_dim;
    g->block_total = (uint64_t)g->layers * g->units * g->unit;
    g->nb          = pool_bytes / g->block_total;
    if (g->nb < nb_min) {
        g->nb = nb_min;
    }
    /* At least 3 blocks: with 2, a [2, 2, ...] tensor fits both the split
     * [2, num_blocks, ...] and the interleaved [num_blocks, 2, ...] layout
     * and the library rightly refuses it as ambiguous. */
    if (g->nb < 3) {
        g->nb = 3;
    }
    g->layer_bytes  = (uint64_t)g->units * g->nb * g->unit;
    g->layer_stride = (g->layer_bytes + 4095) & ~4095ull;
    g->pool_bytes   = g->layer_stride * g->layers;
    if (g->pool_bytes > (1ull << 40)) {
        snprintf(err, errlen, "pool of %" PRIu64 " bytes is too large",
                 g->pool_bytes);
        return -1;
    }
    return 0;
}

/* --- block ids ---------------------------------------------------------- */

static uint64_t kvp_xorshift(uint64_t *s)
{
    uint64_t x = *s;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

int kvp_idgen_init(kvp_idgen_t *ig, uint64_t nb, int contiguous)
{
    memset(ig, 0, sizeof(*ig));
    ig->nb         = nb;
    ig->contiguous = contiguous;
    if (contiguous) {
        return 0;
    }
    for (int side = 0; side < 2; side++) {
        uint64_t seed = 0x9e3779b97f4a7c15ull + (uint64_t)side * 7919u;

        ig->perm[side] = malloc(nb * sizeof(uint64_t));
        if (ig->perm[side] == NULL) {
            kvp_idgen_fini(ig);
            return -1;
        }
        for (uint64_t i = 0; i < nb; i++) {
            ig->perm[side][i] = i;
        }
        for (uint64_t i = nb - 1; i > 0; i--) {
            uint64_t j = kvp_xorshift(&seed) % (i + 1), t = ig->perm[side][i];

            ig->perm[side][i] = ig->perm[side][j];
            ig->perm[side][j] = t;
        }
    }
    return 0;
}

void kvp_idgen_fini(kvp_idgen_t *ig)
{
    free(ig->perm[0]);
    free(ig->perm[1]);
    ig->perm[0] = ig->perm[1] = NULL;
}

void kvp_block_ids(const kvp_idgen_t *ig, int producer, uint64_t i,
                   uint32_t b, uint64_t *ids)
{
    if (ig->resident) {
        i = 0; /* every transfer moves the blocks of the first one */
    }
    if (ig->contiguous) {
        uint64_t slots = ig->nb / b, s = (i % slots) * b;

        for (uint32_t k = 0; k < b; k++) {
            ids[k] = s + k;
        }
        return;
    }
    for (uint32_t k = 0; k < b; k++) {
        ids[k] = ig->perm[producer ? 1 : 0][(i * b + k) % ig->nb];
    }
}

/* --- runs --------------------------------------------------------------- */

typedef struct {
    uint64_t l, r, len;
} kvp_unit_run_t;

static int kvp_run_cmp(const void *a, const void *b)
{
    const kvp_unit_run_t *x = a, *y = b;

    return x->l < y->l ? -1 : x->l > y->l ? 1 : 0;
}

static uint64_t kvp_unit_off(const kvp_geom_t *g, uint64_t block, uint32_t u)
{
    switch (g->layout) {
    case KVP_LAYOUT_SPLIT:
        return ((uint64_t)u * g->nb + block) * g->unit;
    case KVP_LAYOUT_INTERLEAVED:
        return (block * 2 + u) * g->unit;
    case KVP_LAYOUT_KEY_ONLY:
    default:
        return block * g->unit;
    }
}

uint64_t kvp_count_runs(const kvp_geom_t *g, const uint64_t *lids,
                        const uint64_t *rids, uint32_t n)
{
    size_t          cnt = (size_t)n * g->units, runs = 0;
    kvp_unit_run_t *v   = malloc(cnt * sizeof(*v));

    if (v == NULL || n == 0) {
        free(v);
        return 0;
    }
    for (uint32_t k = 0; k < n; k++) {
        for (uint32_t u = 0; u < g->units; u++) {
            kvp_unit_run_t *r = &v[(size_t)k * g->units + u];

            r->l   = kvp_unit_off(g, lids[k], u);
            r->r   = kvp_unit_off(g, rids[k], u);
            r->len = g->unit;
        }
    }
    qsort(v, cnt, sizeof(*v), kvp_run_cmp);
    for (size_t i = 0; i < cnt;) {
        size_t j = i + 1;
        uint64_t end_l = v[i].l + v[i].len, end_r = v[i].r + v[i].len;

        while (j < cnt && v[j].l == end_l && v[j].r == end_r) {
            end_l += v[j].len;
            end_r += v[j].len;
            j++;
        }
        runs++;
        i = j;
    }
    free(v);
    return (uint64_t)runs * g->layers;
}

/* --- engine and pool ---------------------------------------------------- */

uint8_t *kvp_unit_ptr(const kvp_side_t *s, uint32_t layer, uint64_t block,
                      uint32_t unit)
{
    return s->pool + (uint64_t)layer * s->geom.layer_stride +
           kvp_unit_off(&s->geom, block, unit);
}

static void kvp_describe(const kvp_geom_t *g, uint32_t layer, void *base,
                         char *name, size_t namelen, kvx_layer_desc_t *d)
{
    int64_t stride = 1;

    memset(d, 0, sizeof(*d));
    snprintf(name, namelen, "model.layers.%u.%s", layer,
             g->layout == KVP_LAYOUT_KEY_ONLY ? "self_attn.kv_latent"
                                              : "self_attn.kv");
    d->struct_size  = sizeof(*d);
    d->name         = name;
    d->base         = base;
    d->length       = g->layer_bytes;
    d->mem_type     = KVX_MEM_HOST;
    d->elem_size    = g->elem;
    d->block_size   = g->tokens;
    d->num_kv_heads = g->heads;
    d->head_size    = g->head_dim;
    switch (g->layout) {
    case KVP_LAYOUT_SPLIT: {
        int64_t sh[5] = {2, (int64_t)g->nb, g->tokens, g->heads, g->head_dim};

        d->ndim = 5;
        memcpy(d->shape, sh, sizeof(sh));
        break;
    }
    case KVP_LAYOUT_INTERLEAVED: {
        int64_t sh[5] = {(int64_t)g->nb, 2, g->tokens, g->heads, g->head_dim};

        d->ndim = 5;
        memcpy(d->shape, sh, sizeof(sh));
        break;
    }
    case KVP_LAYOUT_KEY_ONLY:
    default: {
        int64_t sh[3] = {(int64_t)g->nb, g->tokens, g->head_dim};

        d->ndim         = 3;
        d->key_only     = 1;
        d->num_kv_heads = 1;
        memcpy(d->shape, sh, sizeof(sh));
        break;
    }
    }
    for (int k = (int)d->ndim - 1; k >= 0; k--) {
        d->stride[k] = stride;
        stride *= d->shape[k];
    }
}

int kvp_side_open(const kvx_api_t *api, const kvp_side_cfg_t *cfg,
                  const kvp_geom_t *g, kvp_side_t *s, char *err,
                  size_t errlen)
{
    char         json[4096], tls[400] = "", infl[64] = "";
    kvx_status_t st;

    memset(s, 0, sizeof(*s));
    s->api      = api;
    s->producer = cfg->producer;
    s->tp_rank  = cfg->tp_rank;
    s->tp_size  = cfg->tp_size;
    s->geom     = *g;
    s->mem      = cfg->mem;
    s->hs_base  = cfg->hs_base;
    s->nt_base  = cfg->nt_base;
    snprintf(s->host, sizeof(s->host), "%s", cfg->host);
    if (cfg->tls != NULL && cfg->tls[0] != '\0') {
        snprintf(tls, sizeof(tls), ",\"ucx_tls\":\"%s\"", cfg->tls);
    }
    if (cfg->max_inflight != 0) {
        snprintf(infl, sizeof(infl), ",\"max_inflight_bytes\":%" PRIu64,
                 cfg->max_inflight);
    }
    snprintf(json, sizeof(json),
             "{\"role\":\"%s\",\"tp_rank\":%u,\"tp_size\":%u,"
             "\"kv_connector_extra_config\":{\"host_ip\":\"%s\","
             "\"handshake_port\":%u,\"notify_port\":%u,\"read_mode\":%s,"
             "\"handshake_timeout\":10,\"transfer_timeout\":%.0f,"
             "\"defer_timeout\":%.0f%s%s%s%s}}",
             cfg->producer ? "kv_producer" : "kv_consumer", cfg->tp_rank,
             cfg->tp_size, cfg->host, cfg->hs_base, cfg->nt_base,
             cfg->mode == KVP_READ ? "true" : "false",
             cfg->transfer_timeout_s > 0 ? cfg->transfer_timeout_s
                                         : cfg->defer_timeout_s,
             cfg->defer_timeout_s, tls, infl,
             cfg->extra && cfg->extra[0] ? "," : "",
             cfg->extra ? cfg->extra : "");
    kvp_info("engine config: %s", json);
    st = api->engine_create(json, &s->eng);
    if (st != KVX_OK) {
        snprintf(err, errlen, "engine_create: %s: %s", api->status_name(st),
                 api->last_error());
        return -1;
    }
    if (cfg->mem == KVP_MEM_UCX) {
        void *p = NULL;

        st = api->alloc_region(s->eng, g->pool_bytes, &p);
        if (st != KVX_OK) {
            snprintf(err, errlen, "alloc_region(%" PRIu64 "): %s: %s",
                     g->pool_bytes, api->status_name(st), api->last_error());
            kvp_side_close(s);
            return -1;
        }
        s->pool = p;
    } else {
        void *p = mmap(NULL, g->pool_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

        if (p == MAP_FAILED) {
            snprintf(err, errlen, "mmap of %" PRIu64 " bytes: %s",
                     g->pool_bytes, strerror(errno));
            kvp_side_close(s);
            return -1;
        }
        s->pool        = p;
        s->pool_mapped = 1;
    }
    /* Touch every page; P's blocks get their pattern with --check. */
    if (cfg->producer && cfg->fill_pattern) {
        for (uint32_t l = 0; l < g->layers; l++) {
            for (uint64_t b = 0; b < g->nb; b++) {
                for (uint32_t u = 0; u < g->units; u++) {
                    kvp_pattern_fill(kvp_unit_ptr(s, l, b, u), g->unit,
                                     cfg->tp_rank, l, b, u);
                }
            }
        }
    } else {
        memset(s->pool, cfg->producer ? 0x5a : 0xEE, g->pool_bytes);
    }
    for (uint32_t l = 0; l < g->layers; l++) {
        kvx_layer_desc_t d;
        char             name[96];

        kvp_describe(g, l, s->pool + (uint64_t)l * g->layer_stride, name,
                     sizeof(name), &d);
        st = api->register_layer(s->eng, &d);
        if (st != KVX_OK) {
            snprintf(err, errlen, "register_layer %u: %s: %s", l,
                     api->status_name(st), api->last_error());
            kvp_side_close(s);
            return -1;
        }
    }
    st = api->start(s->eng);
    if (st != KVX_OK) {
        snprintf(err, errlen, "start: %s: %s", api->status_name(st),
                 api->last_error());
        kvp_side_close(s);
        return -1;
    }
    return 0;
}

void kvp_side_close(kvp_side_t *s)
{
    if (s->eng != NULL) {
        s->api->engine_destroy(s->eng); /* frees alloc_region memory too */
        s->eng = NULL;
    }
    if (s->pool_mapped && s->pool != NULL) {
        munmap(s->pool, s->geom.pool_bytes);
    }
    s->pool        = NULL;
    s->pool_mapped = 0;
}

void kvp_fill_dst(kvp_side_t *d, const uint64_t *dids, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        for (uint32_t l = 0; l < d->geom.layers; l++) {
            for (uint32_t u = 0; u < d->geom.units; u++) {
                memset(kvp_unit_ptr(d, l, dids[k], u), 0xEE, d->geom.unit);
            }
        }
    }
}

int kvp_verify(const kvp_side_t *d, uint32_t p_rank, const uint64_t *dids,
               const uint64_t *pids, uint32_t n, char *err, size_t errlen)
{
    uint8_t *want = malloc(d->geom.unit);

    if (want == NULL) {
        snprintf(err, errlen, "verify: out of memory");
        return -1;
    }
    for (uint32_t k = 0; k < n; k++) {
        for (uint32_t l = 0; l < d->geom.layers; l++) {
            for (uint32_t u = 0; u < d->geom.units; u++) {
                const uint8_t *got = kvp_unit_ptr(d, l, dids[k], u);

                kvp_pattern_fill(want, d->geom.unit, p_rank, l, pids[k], u);
                if (memcmp(got, want, d->geom.unit) != 0) {
                    uint64_t i = 0;

                    while (got[i] == want[i]) {
                        i++;
                    }
                    snprintf(err, errlen, "check failed: D block %" PRIu64
                             " (from P rank %u block %" PRIu64 "), layer %u, "
                             "%s, byte %" PRIu64 ": got 0x%02x, want 0x%02x",
                             dids[k], p_rank, pids[k], l,
                             u == 0 ? "K" : "V", i, got[i], want[i]);
                    free(want);
                    return -1;
                }
            }
        }
    }
    free(want);
    return 0;
}
