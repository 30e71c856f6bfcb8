/*
 * dispatch.c - inbound control messages (SPEC §9): decode, dispatch by
 * type to the engine's mode, reply.
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

/* --- listeners ---------------------------------------------------------- */

void kvc_reply(int ok, const char *reason, char **reply_p, size_t *len_p)
{
    *reply_p = kvc_reply_encode(ok, reason, len_p);
    if (*reply_p == NULL) {
        *len_p = 0;
    }
}

void kvc_notify_handler(void *arg, const char *from, const char *msg,
                               size_t len, char **reply_p, size_t *len_p)
{
    struct kvx_engine *eng = arg;
    char               reason[KVX_REASON_MAX] = "";
    kvc_msg_t          m;
    int                ok = 1;

    if (kvc_msg_decode(msg, len, eng->cfg.is_producer, &m) != KVX_OK) {
        kvc_log_warn("KVX-BAD-MESSAGE", "%s notify listener: from %s: %s",
                     eng->engine_id, from, kvc_last_error());
        pthread_mutex_lock(&eng->lock);
        eng->stats.rx_bad++;
        pthread_mutex_unlock(&eng->lock);
        kvc_reply(0, kvc_last_error(), reply_p, len_p);
        return;
    }
    pthread_mutex_lock(&eng->lock);
    eng->stats.rx_msgs[m.type]++;
    switch (m.type) {
    case KVC_MSG_RELEASE:
        kvc_read_on_release(eng, &m, reason, sizeof(reason), &ok);
        break;
    case KVC_MSG_REMOTE_BLOCKS:
        kvc_write_on_remote_blocks(eng, &m, reason, sizeof(reason), &ok);
        break;
    case KVC_MSG_WRITE_DONE:
        kvc_write_on_write_done(eng, &m);
        break;
    case KVC_MSG_HEARTBEAT:
        break;
    }
    pthread_mutex_unlock(&eng->lock);
    if (!ok) {
        kvc_log_warn("KVX-CTL-REJECT", "%s: %s", eng->engine_id, reason);
    }
    kvc_msg_fini(&m);
    kvc_reply(ok, reason, reply_p, len_p);
}
