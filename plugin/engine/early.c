/*
 * early.c - the one bounded store for control messages that overtake their
 * transfer (SPEC §7-§9): a release or remote_blocks can reach P before P's
 * own producer_request (the proxy talks to both at once). Kept in arrival
 * order for defer_timeout, at most KVC_EARLY_MAX messages and
 * KVC_EARLY_MAX_BYTES bytes (the oldest is dropped first), and replayed
 * through the mode's handlers when the transfer is published.
 *
 * Every function here runs with the engine lock held.
 */
#define _GNU_SOURCE
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t kvc_early_size(const kvc_msg_t *m)
{
    return sizeof(kvc_early_t) + m->num_block_ids * sizeof(uint64_t);
}

static void kvc_early_drop(struct kvx_engine *eng, kvc_early_t *e)
{
    eng->nearly--;
    eng->early_bytes -= e->size;
    kvc_msg_fini(&e->msg);
    free(e);
}

/* kvc_early_pop_oldest unlinks and frees the head. */
static void kvc_early_pop_oldest(struct kvx_engine *eng)
{
    kvc_early_t *e = eng->early_head;

    eng->early_head = e->next;
    if (eng->early_head == NULL) {
        eng->early_tail = NULL;
    }
    kvc_early_drop(eng, e);
}

void kvc_early_keep(struct kvx_engine *eng, kvc_msg_t *m)
{
    size_t       size = kvc_early_size(m);
    kvc_early_t *e;

    if (size > KVC_EARLY_MAX_BYTES) {
        kvc_log_warn("KVX-EARLY-DROP", "early %s for %s dropped (%zu bytes "
                     "> %u)", kvc_msg_desc(m->type)->name, m->transfer_id,
                     size, KVC_EARLY_MAX_BYTES);
        eng->stats.early_dropped++;
        return;
    }
    while (eng->early_head != NULL &&
           (eng->nearly >= KVC_EARLY_MAX ||
            eng->early_bytes + size > KVC_EARLY_MAX_BYTES)) {
        kvc_log_warn("KVX-EARLY-DROP", "early %s for %s dropped (cap %d "
                     "messages, %u bytes)",
                     kvc_msg_desc(eng->early_head->msg.type)->name,
                     eng->early_head->msg.transfer_id, KVC_EARLY_MAX,
                     KVC_EARLY_MAX_BYTES);
        eng->stats.early_dropped++;
        kvc_early_pop_oldest(eng);
    }
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        return;
    }
    e->msg           = *m; /* takes the owned block list */
    snprintf(e->from, sizeof(e->from), "%s", m->from != NULL ? m->from : "");
    e->msg.from      = e->from;
    e->size          = size;
    m->block_ids     = NULL;
    m->num_block_ids = 0;
    e->expires_us    = kvc_deadline_us(eng, eng->cfg.defer_timeout);
    if (eng->early_tail != NULL) {
        eng->early_tail->next = e;
    } else {
        eng->early_head = e;
    }
    eng->early_tail = e;
    eng->nearly++;
    eng->early_bytes += size;
    eng->stats.early_kept++;
}

void kvc_early_replay(struct kvx_engine *eng, const char *tid)
{
    kvc_early_t  *mine = NULL, **tail = &mine, *prev = NULL;
    kvc_early_t  *e    = eng->early_head;

    /* Take this transfer's messages out first: a handler may keep a new
     * one (if the transfer ended meanwhile it is ignored instead). */
    while (e != NULL) {
        kvc_early_t *next = e->next;

        if (strcmp(e->msg.transfer_id, tid) == 0) {
            if (prev != NULL) {
                prev->next = next;
            } else {
                eng->early_head = next;
            }
            if (eng->early_tail == e) {
                eng->early_tail = prev;
            }
            e->next = NULL;
            *tail   = e;
            tail    = &e->next;
        } else {
            prev = e;
        }
        e = next;
    }
    while ((e = mine) != NULL) {
        kvc_msg_fn fn = eng->mode->on_msg[e->msg.type];
        char       reason[KVX_REASON_MAX] = "";
        int        ok = 1;

        mine = e->next;
        if (fn != NULL) {
            fn(eng, &e->msg, reason, sizeof(reason), &ok);
        }
        if (!ok) {
            kvc_log_warn("KVX-CTL-REJECT", "%s: early %s: %s", eng->engine_id,
                         kvc_msg_desc(e->msg.type)->name, reason);
        }
        kvc_early_drop(eng, e);
    }
}

void kvc_early_expire(struct kvx_engine *eng, uint64_t now)
{
    /* Every entry lives defer_timeout: arrival order is expiry order. */
    while (eng->early_head != NULL && eng->early_head->expires_us <= now) {
        kvc_early_pop_oldest(eng);
    }
}

void kvc_early_free_all(struct kvx_engine *eng)
{
    while (eng->early_head != NULL) {
        kvc_early_pop_oldest(eng);
    }
}
