/*
 * fuzz_proxy.c - the proxy builders: kvc_registration_build (from a
 * configuration), kvc_params_build_prefill (from D's registration) and
 * kvc_params_build_decode (from P's response), chained as a proxy chains
 * them.
 *
 * The first byte picks the input: 0 a registration payload, 1 a
 * configuration (its registration is built first); bytes 1..n of the
 * transfer id length come next.
 * Invariants: whatever one helper emits, the next accepts —
 *  - an accepted configuration's registration is accepted by
 *    kvc_params_build_prefill, or not built at all (KVX_ERR_CONFIG: the
 *    config holds a host the registration cannot carry);
 *  - params built from an accepted registration pass kvc_params_parse
 *    (what producer_request runs) with D's address, sizes and hosts, and
 *    the address passes the port check;
 *  - those params, as P's response, build D's params, which parse.
 */
#include "fuzz.h"

#include "addr.h"
#include "config.h"
#include "proxy.h"

static void fz_no_warn(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

static void fz_prefill(const char *reg, const char *tid, int must)
{
    kvc_xfer_params_t p, d;
    char             *out = NULL, *dout = NULL;

    if (kvc_params_build_prefill(reg, tid, &out) != KVX_OK) {
        FZ_CHECK(!must, "registration '%.400s' from a config rejected: %s",
                 reg, kvc_last_error());
        FZ_CHECK(out == NULL && kvc_last_error()[0] != '\0', "error path");
        return;
    }
    FZ_CHECK(kvc_params_parse(out, &p) == KVX_OK,
             "params '%.400s' built from registration '%.400s' rejected: %s",
             out, reg, kvc_last_error());
    FZ_CHECK(p.has_remote_addr && p.do_remote_decode && !p.do_remote_prefill,
             "params '%.400s'", out);
    FZ_CHECK(strcmp(p.transfer_id, tid) == 0, "transfer_id");
    FZ_CHECK(p.remote_tp_size >= 1 && p.remote_dp_size >= 1, "sizes");
    FZ_CHECK(kvc_port_check(p.remote.handshake_port, "h") == KVX_OK &&
                 kvc_port_check(p.remote.notify_port, "n") == KVX_OK,
             "ports");
    FZ_CHECK(kvc_params_build_decode(out, NULL, &dout) == KVX_OK,
             "D's params from '%.400s': %s", out, kvc_last_error());
    FZ_CHECK(kvc_params_parse(dout, &d) == KVX_OK, "'%.400s': %s", dout,
             kvc_last_error());
    FZ_CHECK(d.num_remote_hosts == p.num_remote_hosts, "hosts");
    kvc_params_fini(&d);
    kvc_params_fini(&p);
    free(dout);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char         tid[KVX_ID_MAX + 8], *s, *reg = NULL;
    size_t       tlen;
    kvc_config_t cfg;

    if (size < 2) {
        return 0;
    }
    /* transfer id: "tx-" and up to 250 'a' (the id length is part of the
     * input, its bytes are not: the proxy generates it) */
    tlen = data[1] % 251u;
    memcpy(tid, "tx-", 3);
    memset(tid + 3, 'a', tlen);
    tid[3 + tlen] = '\0';
    s = fz_cstr(data + 2, size - 2);
    if (data[0] & 1u) {
        if (kvc_config_parse(s, &cfg, fz_no_warn, NULL) == KVX_OK) {
            if (kvc_registration_build(&cfg, &reg) == KVX_OK) {
                fz_prefill(reg, tid, 1);
                free(reg);
            } else {
                /* refused (not sent) rather than unreadable */
                FZ_CHECK(reg == NULL && strstr(kvc_last_error(),
                                               "not be readable") != NULL,
                         "%s", kvc_last_error());
            }
            kvc_config_fini(&cfg);
        }
    } else {
        fz_prefill(s, tid, 0);
    }
    free(s);
    return 0;
}
