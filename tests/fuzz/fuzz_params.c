/*
 * fuzz_params.c - kv_transfer_params (kvc_params_parse), the proxy's
 * request_id (kvc_reqid_parse), zmq addresses (kvc_zmq_addr_parse) and the
 * trust check of a peer host.
 *
 * The first byte picks the decoder, the rest is its input.
 * Invariants:
 *  - params: kvc_params_parse (the flat reader, pval.h, where it takes the
 *    text) and kvc_params_parse_json_c give the same status, error text
 *    and fields;
 *  - params: accepted values obey their bounds (strings below their
 *    buffers, remote_hosts entries 1..255 characters without surrounding
 *    blanks, explicit ports 1024..65535); kvc_params_build_decode of the
 *    same JSON (P's response) succeeds, its output parses to the same
 *    fields with do_remote_prefill set, and building again from the output
 *    gives the same text;
 *  - address: an accepted address formats to text the parser accepts with
 *    the same host and ports; with a well-formed host (kvc_trust_check),
 *    both sides of a proxy request_id embedding it parse back to it;
 *  - request_id: an accepted address is re-embedded in a request_id and
 *    parsed back the same, through kvc_params_peer_addr too;
 *  - trust: a host the check accepts is 1..253 characters.
 */
#include "fuzz.h"

#include "addr.h"

static void fz_same_addr(const kvc_peer_addr_t *a, const kvc_peer_addr_t *b)
{
    FZ_CHECK(strcmp(a->host, b->host) == 0 &&
                 a->handshake_port == b->handshake_port &&
                 a->notify_port == b->notify_port,
             "'%s':%u:%u vs '%s':%u:%u", a->host, a->handshake_port,
             a->notify_port, b->host, b->handshake_port, b->notify_port);
}

/* fz_addr_travels: addr formatted parses back to addr; with a host that
 * passes the trust check (one a peer can have), so does a request_id
 * embedding it. */
static void fz_addr_travels(const kvc_peer_addr_t *addr)
{
    char            text[KVC_HOST_MAX + 64], rid[2 * sizeof(text) + 128];
    kvc_peer_addr_t back;
    kvc_trust_t     trust = {0};
    int             n = kvc_zmq_addr_format(addr, text, sizeof(text));

    FZ_CHECK(n > 0 && (size_t)n < sizeof(text), "format %d", n);
    FZ_CHECK(kvc_zmq_addr_parse(text, (size_t)n, "zmq_address", &back) ==
                 KVX_OK,
             "formatted '%s' rejected: %s", text, kvc_last_error());
    fz_same_addr(addr, &back);
    if (kvc_trust_check(&trust, addr->host, "host") != KVX_OK) {
        return;
    }
    snprintf(rid, sizeof(rid),
             "cmpl-___prefill_addr_%s___decode_addr_%s_"
             "0123456789abcdef0123456789abcdef-0",
             text, text);
    for (int want = 0; want <= 1; want++) {
        FZ_CHECK(kvc_params_peer_addr(NULL, rid, want, &back, NULL) ==
                     KVX_OK,
                 "request_id '%s' (%d) rejected: %s", rid, want,
                 kvc_last_error());
        fz_same_addr(addr, &back);
    }
}

static void fz_same_params(const kvc_xfer_params_t *a,
                           const kvc_xfer_params_t *b)
{
    FZ_CHECK(strcmp(a->transfer_id, b->transfer_id) == 0, "transfer_id");
    FZ_CHECK(a->has_remote_addr == b->has_remote_addr, "has_remote_addr");
    if (a->has_remote_addr) {
        fz_same_addr(&a->remote, &b->remote);
    }
    FZ_CHECK(a->num_remote_hosts == b->num_remote_hosts, "%zu vs %zu hosts",
             a->num_remote_hosts, b->num_remote_hosts);
    for (size_t i = 0; i < a->num_remote_hosts; i++) {
        FZ_CHECK(strcmp(a->remote_hosts[i], b->remote_hosts[i]) == 0,
                 "host %zu", i);
    }
    FZ_CHECK(a->has_remote_block_ids == b->has_remote_block_ids &&
                 a->num_remote_block_ids == b->num_remote_block_ids,
             "block ids");
    for (size_t i = 0; i < a->num_remote_block_ids; i++) {
        FZ_CHECK(a->remote_block_ids[i] == b->remote_block_ids[i],
                 "block %zu", i);
    }
    FZ_CHECK(strcmp(a->remote_engine_id, b->remote_engine_id) == 0,
             "engine id");
    FZ_CHECK(a->remote_tp_size == b->remote_tp_size &&
                 a->remote_dp_size == b->remote_dp_size &&
                 a->remote_dp_rank == b->remote_dp_rank,
             "sizes");
    FZ_CHECK(a->has_remote_instance == b->has_remote_instance &&
                 a->remote_instance == b->remote_instance &&
                 a->remote_tp_rank == b->remote_tp_rank &&
                 a->has_remote_accepted == b->has_remote_accepted &&
                 a->remote_accepted == b->remote_accepted,
             "instance binding");
}

/* fz_params_paths: both ways of decoding json agree on everything. */
static void fz_params_paths(const char *json)
{
    kvc_xfer_params_t a, b;
    char              err[KVC_ERR_MAX];
    kvx_status_t      sa = kvc_params_parse(json, &a), sb;

    snprintf(err, sizeof(err), "%s", sa == KVX_OK ? "" : kvc_last_error());
    sb = kvc_params_parse_json_c(json, &b);
    FZ_CHECK(sa == sb, "'%.300s': status %d (flat) vs %d (json-c): %s", json,
             (int)sa, (int)sb, sa != KVX_OK ? err : kvc_last_error());
    FZ_CHECK(sa == KVX_OK || strcmp(err, kvc_last_error()) == 0,
             "'%.300s': '%s' vs '%s'", json, err, kvc_last_error());
    if (sa == KVX_OK) {
        fz_same_params(&a, &b);
        FZ_CHECK(strcmp(a.remote.host, b.remote.host) == 0 &&
                     a.remote.handshake_port == b.remote.handshake_port &&
                     a.remote.notify_port == b.remote.notify_port &&
                     a.remote_hold_ms == b.remote_hold_ms &&
                     a.do_remote_prefill == b.do_remote_prefill &&
                     a.do_remote_decode == b.do_remote_decode,
                 "'%.300s': fields differ", json);
    }
    kvc_params_fini(&a);
    kvc_params_fini(&b);
}

static void fz_params(const char *json)
{
    kvc_xfer_params_t p, d, d2;
    char             *out = NULL, *out2 = NULL;

    fz_params_paths(json);
    if (kvc_params_parse(json, &p) != KVX_OK) {
        FZ_CHECK(kvc_last_error()[0] != '\0', "no error text");
        return;
    }
    FZ_CHECK(strlen(p.transfer_id) < KVX_ID_MAX, "transfer_id");
    FZ_CHECK(strlen(p.remote.host) < KVC_HOST_MAX, "host");
    for (size_t i = 0; i < p.num_remote_hosts; i++) {
        size_t len = strlen(p.remote_hosts[i]);

        FZ_CHECK(len > 0 && len < KVC_HOST_MAX, "host %zu length %zu", i,
                 len);
        FZ_CHECK(p.remote_hosts[i][0] != ' ' && p.remote_hosts[i][0] != '\t' &&
                     p.remote_hosts[i][len - 1] != ' ' &&
                     p.remote_hosts[i][len - 1] != '\t',
                 "host %zu not trimmed", i);
    }
    if (p.has_remote_addr) {
        FZ_CHECK(kvc_port_check(p.remote.handshake_port, "h") == KVX_OK &&
                     kvc_port_check(p.remote.notify_port, "n") == KVX_OK,
                 "ports");
    }
    FZ_CHECK(kvc_params_build_decode(json, NULL, &out) == KVX_OK,
             "P's response parses but D's params cannot be built: %s",
             kvc_last_error());
    FZ_CHECK(kvc_params_parse(out, &d) == KVX_OK,
             "D's params '%.300s' rejected: %s", out, kvc_last_error());
    FZ_CHECK(d.do_remote_prefill == 1 && d.do_remote_decode == 0, "flags");
    /* the address D gets, if any, is P's host with its ports */
    if (p.has_remote_addr && p.remote.host[0] != '\0' &&
        strlen(p.remote.host) == strlen(d.remote.host)) {
        fz_same_addr(&p.remote, &d.remote);
    }
    FZ_CHECK(kvc_params_build_decode(out, NULL, &out2) == KVX_OK &&
                 strcmp(out, out2) == 0,
             "D's params not stable: '%.300s' vs '%.300s'", out,
             out2 ? out2 : "(null)");
    FZ_CHECK(kvc_params_parse(out2, &d2) == KVX_OK, "%s", kvc_last_error());
    fz_same_params(&d, &d2);
    FZ_CHECK(strcmp(p.transfer_id, d.transfer_id) == 0, "transfer_id");
    FZ_CHECK(p.num_remote_block_ids == d.num_remote_block_ids &&
                 p.num_remote_hosts == d.num_remote_hosts &&
                 p.remote_dp_size == d.remote_dp_size &&
                 (p.remote_tp_size == 0) == (d.remote_tp_size == 0),
             "D's params lost a field");
    /* the instance binding reaches D unchanged (mode_read.c) */
    FZ_CHECK(p.has_remote_instance == d.has_remote_instance &&
                 (!p.has_remote_instance ||
                  (p.remote_instance == d.remote_instance &&
                   p.remote_tp_rank == d.remote_tp_rank)) &&
                 p.has_remote_accepted == d.has_remote_accepted &&
                 p.remote_accepted == d.remote_accepted,
             "D's params changed the instance binding");
    kvc_params_fini(&d2);
    kvc_params_fini(&d);
    kvc_params_fini(&p);
    free(out2);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvc_peer_addr_t addr, back;
    kvc_trust_t     trust = {0};
    char           *s;
    unsigned        mode;

    if (size == 0) {
        return 0;
    }
    mode = data[0] % 4u;
    data++;
    size--;
    switch (mode) {
    case 0:
        s = fz_cstr(data, size);
        fz_params(s);
        free(s);
        break;
    case 1:
        if (kvc_zmq_addr_parse((const char *)data, size, "zmq_address",
                               &addr) == KVX_OK) {
            fz_addr_travels(&addr);
        }
        break;
    case 2:
        s = fz_cstr(data, size);
        for (int want = 0; want <= 1; want++) {
            if (kvc_reqid_parse(s, want, &addr) == KVX_OK) {
                FZ_CHECK(kvc_params_peer_addr(NULL, s, want, &back, NULL) ==
                             KVX_OK,
                         "peer_addr");
                fz_same_addr(&addr, &back);
                fz_addr_travels(&addr);
            }
        }
        free(s);
        break;
    default:
        s = fz_cstr(data, size);
        if (kvc_trust_check(&trust, s, "remote_host") == KVX_OK) {
            FZ_CHECK(strlen(s) >= 1 && strlen(s) <= 253, "host length %zu",
                     strlen(s));
        }
        free(s);
        break;
    }
    return 0;
}
