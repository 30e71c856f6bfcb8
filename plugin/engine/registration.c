/*
 * registration.c - the registration heartbeat to the proxy (SPEC §3).
 *
 * Every function here runs with the engine lock held unless it says
 * otherwise.
 */
#define _GNU_SOURCE
#include "engine.h"
#include "proxy.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* kvc_reg_setup: rank 0 of an instance with proxy_ip set registers with
 * the proxy every proxy_ping_interval (SPEC §3), the first time at once.
 * The proxy address passes the same trust rule as any peer. */
kvx_status_t kvc_reg_setup(struct kvx_engine *eng)
{
    kvt_client_t *cli     = NULL;
    char         *payload = NULL;
    kvt_ctl_sec_t sec;
    kvx_status_t  st;

    if (eng->cfg.proxy_ip[0] == '\0' || kvc_config_rank(&eng->cfg) != 0) {
        return KVX_OK;
    }
    st = kvc_trust_check(&eng->trust, eng->cfg.proxy_ip, "proxy_ip");
    if (st == KVX_OK) {
        st = kvc_registration_build(&eng->cfg, &payload);
    }
    if (st == KVX_OK) {
        st = KVN(eng)->client_open(eng->cfg.proxy_ip, eng->cfg.proxy_ping_port,
                                   1, kvc_config_proxy_sec(&eng->cfg, &sec),
                                   &cli);
    }
    if (st != KVX_OK) {
        free(payload);
        return kvc_error(st == KVX_ERR_UNTRUSTED_PEER ? KVX_ERR_CONFIG : st,
                         "proxy registration: %s", kvc_last_error());
    }
    /* The tick reads these under the lock: publish them under it. */
    pthread_mutex_lock(&eng->lock);
    eng->reg_payload = payload;
    eng->reg_len     = strlen(payload);
    eng->proxy_cli   = cli;
    eng->reg_next_us = kvc_now_us(eng);
    pthread_mutex_unlock(&eng->lock);
    KVD(eng)->kick(eng->ucx);
    return KVX_OK;
}

/* --- create / destroy --------------------------------------------------- */

/* kvc_reg_done: the proxy's answer to a registration (nng thread). Any
 * reply counts as delivered; failures are logged when they start and when
 * they end, not every interval. */
static void kvc_reg_done(void *arg, kvx_status_t st, const char *reply,
                         size_t len, const char *err)
{
    struct kvx_engine *eng = arg;

    (void)reply;
    (void)len;
    pthread_mutex_lock(&eng->lock);
    eng->reg_inflight = 0;
    if (st == KVX_OK) {
        eng->stats.reg_sent++;
        if (eng->reg_failing) {
            kvc_log_info("KVX-PROXY", "registration to %s:%u delivered again",
                         eng->cfg.proxy_ip, eng->cfg.proxy_ping_port);
        }
        eng->reg_failing = 0;
    } else if (st != KVX_ERR_CANCELED) {
        eng->stats.reg_failed++;
        if (!eng->reg_failing) {
            kvc_log_warn("KVX-PROXY", "registration to %s:%u failed: %s; "
                         "retrying every %.1f s", eng->cfg.proxy_ip,
                         eng->cfg.proxy_ping_port, err ? err : "",
                         eng->cfg.proxy_ping_interval);
        }
        eng->reg_failing = 1;
    }
    pthread_mutex_unlock(&eng->lock);
}

/* kvc_reg_tick sends the registration when it is due and the previous one
 * was answered (lock held; kvn never calls kvc_reg_done inside the post). */
void kvc_reg_tick(struct kvx_engine *eng)
{
    uint64_t now = kvc_now_us(eng);
    double   tmo = eng->cfg.proxy_ping_interval < eng->cfg.handshake_timeout
                       ? eng->cfg.proxy_ping_interval
                       : eng->cfg.handshake_timeout;

    if (eng->proxy_cli == NULL || eng->reg_inflight || now < eng->reg_next_us) {
        return;
    }
    eng->reg_next_us = now + (uint64_t)(eng->cfg.proxy_ping_interval * 1e6);
    if (KVN(eng)->client_post(eng->proxy_cli, eng->reg_payload, eng->reg_len,
                        tmo * 1000.0 < 50 ? 50 : (int)(tmo * 1000.0),
                        kvc_reg_done, eng) == KVX_OK) {
        eng->reg_inflight = 1;
    }
}
