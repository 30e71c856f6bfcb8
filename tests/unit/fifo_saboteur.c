/*
 * fifo_saboteur.c - a peer killed while it writes a message into another
 * process's shared-memory receive FIFO (tests/unit/test_kvu_fifo.cc).
 *
 * Usage: fifo_saboteur HEX_WORKER_ADDRESS
 * Connects to the worker over sysv/posix shared memory and sends one active
 * message whose payload is packed by a generic datatype: UCX calls the pack
 * callback after it reserved the FIFO element and before it marks it ready,
 * and the callback kills this process there. Exit status 2: the message
 * was never packed within 10 s (no shared-memory lane, or UCX changed).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

static void *start_pack(void *context, const void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return (void *)buffer;
}

static size_t packed_size(void *state)
{
    (void)state;
    return 4096;
}

static size_t pack(void *state, size_t offset, void *dest, size_t max)
{
    (void)state;
    (void)offset;
    (void)dest;
    (void)max;
    kill(getpid(), SIGKILL); /* inside the reserved, not yet ready element */
    return 0;
}

static void finish(void *state)
{
    (void)state;
}

static int unhex(const char *s, unsigned char *out, size_t max, size_t *len)
{
    size_t n = strlen(s);

    if (n % 2 != 0 || n / 2 > max) {
        return -1;
    }
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;

        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            return -1;
        }
        out[i] = (unsigned char)v;
    }
    *len = n / 2;
    return 0;
}

int main(int argc, char **argv)
{
    static unsigned char addr[8192];
    static char          payload[4096];
    ucp_generic_dt_ops_t ops = {0};
    ucp_config_t        *cfg;
    ucp_params_t         prm;
    ucp_worker_params_t  wp;
    ucp_ep_params_t      ep_prm;
    ucp_request_param_t  rp;
    ucp_context_h        ucp;
    ucp_worker_h         wk;
    ucp_ep_h             ep;
    ucp_datatype_t       dt;
    size_t               alen;
    uint64_t             hdr = 0x5ab07a6e;
    time_t               t0;

    if (argc != 2 || unhex(argv[1], addr, sizeof(addr), &alen) != 0) {
        fprintf(stderr, "usage: fifo_saboteur HEX_WORKER_ADDRESS\n");
        return 1;
    }
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK ||
        ucp_config_modify(cfg, "TLS", "sysv,posix") != UCS_OK ||
        /* kvxfer's FIFO geometry ("auto"): a sender indexes the
         * receiver's FIFO with its own size */
        ucp_config_modify(cfg, "MM_FIFO_SIZE", "64") != UCS_OK ||
        ucp_config_modify(cfg, "MM_FIFO_ELEM_SIZE", "128") != UCS_OK) {
        return 1;
    }
    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features   = UCP_FEATURE_AM;
    if (ucp_init(&prm, cfg, &ucp) != UCS_OK) {
        return 1;
    }
    ucp_config_release(cfg);
    memset(&wp, 0, sizeof(wp));
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(ucp, &wp, &wk) != UCS_OK) {
        return 1;
    }
    memset(&ep_prm, 0, sizeof(ep_prm));
    ep_prm.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_prm.address    = (const ucp_address_t *)addr;
    if (ucp_ep_create(wk, &ep_prm, &ep) != UCS_OK) {
        fprintf(stderr, "fifo_saboteur: no shared-memory endpoint\n");
        return 2;
    }
    ops.start_pack  = start_pack;
    ops.packed_size = packed_size;
    ops.pack        = pack;
    ops.finish      = finish;
    if (ucp_dt_create_generic(&ops, NULL, &dt) != UCS_OK) {
        return 1;
    }
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
    rp.datatype     = dt;
    rp.flags        = UCP_AM_SEND_FLAG_EAGER;
    /* Any id: the FIFO blocks before the receiver could look at it. */
    (void)ucp_am_send_nbx(ep, 0x4b1, &hdr, sizeof(hdr), payload, 1, &rp);
    t0 = time(NULL);
    while (time(NULL) - t0 < 10) {
        ucp_worker_progress(wk);
    }
    fprintf(stderr, "fifo_saboteur: the message was never packed\n");
    return 2;
}
