/*
 * plan.c - a transfer's copy plans: runs per (layer, source) from both
 * sides' geometry, head slices and parts for heterogeneous TP (SPEC §4, §6),
 * shared by READ (gets) and WRITE (puts).
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Builds every layer's run list (one per distinct geometry) pairing lids
 * with x->remote_ids; nothing is posted if any block or range is out of
 * bounds. */
/* kvc_xfer_nsrc: sources of x (1 unless D gathers its heads). */
uint32_t kvc_xfer_nsrc(const kvc_xfer_t *x)
{
    return x->nsrc > 1 ? x->nsrc : 1;
}

/* kvc_xfer_source: source k of x (x->src when there is one). */
kvc_peer_t *kvc_xfer_source(const kvc_xfer_t *x, uint32_t k)
{
    return x->nsrc > 1 ? x->rel[k] : x->src;
}

uint32_t kvc_eng_heads(const struct kvx_engine *eng)
{
    for (size_t i = 0; i < eng->nlayers; i++) {
        if (!eng->layers[i].geom.key_only) {
            return eng->layers[i].geom.num_kv_heads;
        }
    }
    return 0;
}

uint32_t kvc_meta_heads(const kvc_hs_meta_t *m)
{
    if (m->num_layers == 0) {
        return KVC_HEADS_SHARDED;
    }
    for (size_t i = 0; i < m->num_layers; i++) {
        if (!m->layers[i].geom.key_only) {
            return m->layers[i].geom.num_kv_heads;
        }
    }
    return 0;
}

/* kvc_xfer_moves_nothing: op o moves nothing: a WRITE P rank holding a
 * replica of its part (replicated KV heads), or, for a replicated
 * (key-only) layer, a later source of a gathering READ or a WRITE P rank
 * that is not part 0 of its D rank's heads. */
static int kvc_xfer_moves_nothing(const struct kvx_engine *eng,
                                  const kvc_xfer_t *x, size_t o, int key_only)
{
    uint32_t part, nparts;
    int      gather;

    kvc_peer_parts(eng, x->ops[o].peer, &part, &nparts, &gather);
    if (gather == 3) {
        return 1;
    }
    if (!key_only) {
        return 0;
    }
    return o % kvc_xfer_nsrc(x) != 0 || (gather == 2 && part > 0);
}

/* kvc_xfer_plan_one builds the runs of op o (layer i from source peer). */
static kvx_status_t kvc_xfer_plan_one(struct kvx_engine *eng, kvc_xfer_t *x,
                                      size_t o, const uint64_t *lids,
                                      size_t nl)
{
    const kvc_layer_t    *l    = &eng->layers[x->ops[o].index];
    kvc_peer_t           *peer = x->ops[o].peer;
    const kvc_hs_layer_t *rl   = &peer->meta.layers[peer->layer_map[
                                     x->ops[o].index]];
    uint32_t              part, nparts;
    int                   gather, parted;
    kvx_status_t          st;

    kvc_peer_parts(eng, peer, &part, &nparts, &gather);
    parted = nparts > 1 && !l->geom.key_only;
    x->plans[x->nplans] = malloc(
        ((parted ? kvc_plan_max_runs_sliced(&l->geom,
                                            gather == 1 ? &l->geom : &rl->geom,
                                            nl)
                 : kvc_plan_max_runs(&l->geom, nl)) + 1) * sizeof(kvc_run_t));
    if (x->plans[x->nplans] == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "plan: out of memory");
    }
    x->ops[o].runs = x->plans[x->nplans++];
    if (parted && gather == 1) {
        st = kvc_plan_build_gathered(&l->geom, l->length, &rl->geom,
                                     rl->length, part, nparts, lids, nl,
                                     x->remote_ids, x->nremote, x->ops[o].runs,
                                     &x->ops[o].nruns);
    } else if (parted) {
        st = kvc_plan_build_sliced(&l->geom, l->length, &rl->geom, rl->length,
                                   part, nparts, lids, nl, x->remote_ids,
                                   x->nremote, x->ops[o].runs,
                                   &x->ops[o].nruns);
    } else {
        st = kvc_plan_build(&l->geom, l->length, &rl->geom, rl->length, lids,
                            nl, x->remote_ids, x->nremote, x->ops[o].runs,
                            &x->ops[o].nruns);
    }
    if (st != KVX_OK) {
        return kvc_error(st, "transfer %s, layer '%s'%s%s: %s",
                         x->transfer_id, l->name, parted ? " from " : "",
                         parted ? peer->name : "", kvc_last_error());
    }
    return KVX_OK;
}

/* Builds every op's run list (one per distinct geometry and source) pairing
 * lids with x->remote_ids; nothing is posted if any block or range is out
 * of bounds. One op per layer, or per (layer, source) when D gathers its
 * heads from several P ranks. */
kvx_status_t kvc_xfer_plan(struct kvx_engine *eng, kvc_xfer_t *x,
                           const uint64_t *lids, size_t nl)
{
    uint32_t ns   = kvc_xfer_nsrc(x);
    size_t   nops = eng->nlayers * ns;

    x->ops   = calloc(nops ? nops : 1, sizeof(*x->ops));
    x->plans = calloc(nops ? nops : 1, sizeof(*x->plans));
    if (x->ops == NULL || x->plans == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "transfer %s: out of memory",
                         x->transfer_id);
    }
    for (size_t o = 0; o < nops; o++) {
        size_t                i    = o / ns;
        kvc_peer_t           *peer = kvc_xfer_source(x, (uint32_t)(o % ns));
        const kvc_layer_t    *l    = &eng->layers[i];
        const kvc_hs_layer_t *rl   = &peer->meta.layers[peer->layer_map[i]];
        kvx_status_t          st;

        x->ops[o].xfer  = x;
        x->ops[o].peer  = peer;
        x->ops[o].index = (uint32_t)i;
        if (kvc_xfer_moves_nothing(eng, x, o, (int)l->geom.key_only)) {
            /* A key-only layer is replicated on every P rank: it moves
             * once (from the first source, or by the first P part); a P
             * rank holding replicated heads leaves them to the first. */
            x->ops[o].nruns = 0;
            continue;
        }
        /* Layers of equal geometry share the runs of one source. */
        for (size_t k = o % ns; k < o; k += ns) {
            const kvc_hs_layer_t *rk =
                &peer->meta.layers[peer->layer_map[k / ns]];

            if (kvc_geom_same(&eng->layers[k / ns].geom, &l->geom) &&
                kvc_geom_same(&rk->geom, &rl->geom) &&
                eng->layers[k / ns].length == l->length &&
                rk->length == rl->length) {
                x->ops[o].runs  = x->ops[k].runs;
                x->ops[o].nruns = x->ops[k].nruns;
                break;
            }
        }
        if (x->ops[o].runs != NULL) {
            continue;
        }
        st = kvc_xfer_plan_one(eng, x, o, lids, nl);
        if (st != KVX_OK) {
            return st;
        }
    }
    return KVX_OK;
}
