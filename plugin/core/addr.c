/*
 * addr.c - peer addressing (SPEC §3, §4): zmq_address and request_id
 * parsing, the trust check, host of a remote rank, TP rank mapping and ack
 * quorum, and kv_transfer_params decoding/building.
 *
 * Everything here is pure: no DNS, no sockets, no global state. Host names
 * are never resolved; they are checked for shape only, and a trust-list name
 * matches only the same name (case-insensitive), never an address.
 */
#include "addr.h"
#include "pval.h"
#include "siphash.h"

#include <arpa/inet.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KVC_ADDR_SHOW     200 /* bytes of an input quoted in error text */
#define KVC_HOSTNAME_MAX  253
#define KVC_LABEL_MAX     63
#define KVC_REQID_HEX     32
#define KVC_PARAMS        "kv_transfer_params"

static const char kvc_prefill_marker[] = "___prefill_addr_";
static const char kvc_decode_marker[]  = "___decode_addr_";

/* ---- character helpers (locale independent) ---------------------------- */

static int kvc_addr_is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int kvc_addr_is_lhex(char c)
{
    return kvc_addr_is_digit(c) || (c >= 'a' && c <= 'f');
}

static int kvc_addr_is_hex(char c)
{
    return kvc_addr_is_lhex(c) || (c >= 'A' && c <= 'F');
}

static int kvc_addr_is_alnum(char c)
{
    return kvc_addr_is_digit(c) || (c >= 'a' && c <= 'z') ||
           (c >= 'A' && c <= 'Z');
}

static int kvc_addr_show(size_t len)
{
    return len > KVC_ADDR_SHOW ? KVC_ADDR_SHOW : (int)len;
}

/* ---- zmq_address -------------------------------------------------------- */

enum { KVC_SEEN_HOST = 1, KVC_SEEN_HANDSHAKE = 2, KVC_SEEN_NOTIFY = 4 };

static int kvc_addr_span_is(const char *p, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(p, lit, n) == 0;
}

/* kvc_addr_port_span parses n decimal digits as a port in 1..65535. */
static int kvc_addr_port_span(const char *p, size_t n, uint32_t *port_p)
{
    uint32_t v = 0;

    if (n == 0 || n > 5) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!kvc_addr_is_digit(p[i])) {
            return -1;
        }
        v = v * 10 + (uint32_t)(p[i] - '0');
    }
    if (v == 0 || v > 65535) {
        return -1;
    }
    *port_p = v;
    return 0;
}

static kvx_status_t kvc_zmq_addr_fail(const char *field, const char *s,
                                      size_t len, const char *rule,
                                      const char *item, size_t item_len)
{
    return kvc_error(KVX_ERR_INVALID_PARAM, "%s: address '%.*s': %s '%.*s'",
                     field, kvc_addr_show(len), s, rule,
                     kvc_addr_show(item_len), item);
}

/* kvc_zmq_addr_segment handles one "key:value" segment. Unknown keys are
 * ignored, as upstream's parser does. */
static kvx_status_t kvc_zmq_addr_segment(const char *seg, size_t n,
                                         const char *field, const char *s,
                                         size_t len, kvc_peer_addr_t *addr,
                                         unsigned *seen)
{
    const char *colon = memchr(seg, ':', n);
    size_t      klen, vlen;
    const char *val;
    unsigned    bit = 0;

    if (colon == NULL) {
        return kvc_zmq_addr_fail(field, s, len, "segment has no ':'", seg, n);
    }
    klen = (size_t)(colon - seg);
    val  = colon + 1;
    vlen = n - klen - 1;
    if (kvc_addr_span_is(seg, klen, "host")) {
        bit = KVC_SEEN_HOST;
        if (vlen == 0 || vlen >= KVC_HOST_MAX) {
            return kvc_zmq_addr_fail(field, s, len,
                                     "host must be 1..255 characters, got",
                                     val, vlen);
        }
        if (memchr(val, '\0', vlen) != NULL) {
            /* the host would end early and its formatted address no
             * longer parse */
            return kvc_zmq_addr_fail(field, s, len,
                                     "host must not contain a NUL byte, got",
                                     val, vlen);
        }
        memcpy(addr->host, val, vlen);
        addr->host[vlen] = '\0';
    } else if (kvc_addr_span_is(seg, klen, "handshake") ||
               kvc_addr_span_is(seg, klen, "notify")) {
        bit = seg[0] == 'h' ? KVC_SEEN_HANDSHAKE : KVC_SEEN_NOTIFY;
        if (kvc_addr_port_span(val, vlen, bit == KVC_SEEN_HANDSHAKE
                                              ? &addr->handshake_port
                                              : &addr->notify_port) != 0) {
            return kvc_zmq_addr_fail(
                field, s, len,
                "port must be a decimal integer in 1..65535, got", val, vlen);
        }
    }
    if (*seen & bit) {
        return kvc_zmq_addr_fail(field, s, len, "duplicate key", seg, klen);
    }
    *seen |= bit;
    return KVX_OK;
}

kvx_status_t kvc_zmq_addr_parse(const char *s, size_t len, const char *field,
                                kvc_peer_addr_t *out)
{
    kvc_peer_addr_t addr;
    unsigned        seen = 0;
    size_t          pos  = 0;
    kvx_status_t    st;

    if (s == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "%s: address missing", field);
    }
    memset(&addr, 0, sizeof(addr));
    while (pos <= len) {
        const char *comma = memchr(s + pos, ',', len - pos);
        size_t      n = comma ? (size_t)(comma - (s + pos)) : len - pos;

        st = kvc_zmq_addr_segment(s + pos, n, field, s, len, &addr, &seen);
        if (st != KVX_OK) {
            return st;
        }
        pos += n + 1;
    }
    if (!(seen & KVC_SEEN_HOST) || !(seen & KVC_SEEN_HANDSHAKE) ||
        !(seen & KVC_SEEN_NOTIFY)) {
        const char *key = !(seen & KVC_SEEN_HOST)        ? "host"
                          : !(seen & KVC_SEEN_HANDSHAKE) ? "handshake"
                                                         : "notify";
        return kvc_zmq_addr_fail(field, s, len, "missing key", key,
                                 strlen(key));
    }
    *out = addr;
    return KVX_OK;
}

int kvc_zmq_addr_format(const kvc_peer_addr_t *addr, char *buf, size_t len)
{
    return snprintf(buf, len, "host:%s,handshake:%u,notify:%u", addr->host,
                    (unsigned)addr->handshake_port,
                    (unsigned)addr->notify_port);
}

/* ---- request_id --------------------------------------------------------- */

/* kvc_reqid_is_tail: p starts with exactly 32 lowercase hex digits followed
 * by the end of the string or a non-hex character. */
static int kvc_reqid_is_tail(const char *p)
{
    for (size_t k = 0; k < KVC_REQID_HEX; k++) {
        if (!kvc_addr_is_lhex(p[k])) {
            return 0;
        }
    }
    return !kvc_addr_is_hex(p[KVC_REQID_HEX]);
}

/* kvc_reqid_tail returns the last '_' after start[0] that begins a
 * "_<32 hex>" tail, or NULL. */
static const char *kvc_reqid_tail(const char *start)
{
    size_t n = strlen(start);

    for (size_t i = n; i-- > 1;) {
        if (start[i] == '_' && kvc_reqid_is_tail(start + i + 1)) {
            return start + i;
        }
    }
    return NULL;
}

kvx_status_t kvc_reqid_parse(const char *request_id, int want_prefill,
                             kvc_peer_addr_t *out)
{
    const char *start, *end;

    if (request_id == NULL || request_id[0] == '\0') {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "request_id: empty: must embed '%s' and '%s'",
                         kvc_prefill_marker, kvc_decode_marker);
    }
    start = strstr(request_id, want_prefill ? kvc_prefill_marker
                                            : kvc_decode_marker);
    if (start == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "request_id: value '%.*s': marker '%s' not found",
                         KVC_ADDR_SHOW, request_id,
                         want_prefill ? kvc_prefill_marker : kvc_decode_marker);
    }
    if (want_prefill) {
        start += sizeof(kvc_prefill_marker) - 1;
        end = strstr(start, kvc_decode_marker);
        if (end == NULL) {
            return kvc_error(
                KVX_ERR_INVALID_PARAM,
                "request_id: value '%.*s': marker '%s' not found after '%s'",
                KVC_ADDR_SHOW, request_id, kvc_decode_marker,
                kvc_prefill_marker);
        }
    } else {
        start += sizeof(kvc_decode_marker) - 1;
        end = kvc_reqid_tail(start);
        if (end == NULL) {
            return kvc_error(KVX_ERR_INVALID_PARAM,
                             "request_id: value '%.*s': no '_<32 lowercase "
                             "hex>' tail after a non-empty address after '%s'",
                             KVC_ADDR_SHOW, request_id, kvc_decode_marker);
        }
    }
    return kvc_zmq_addr_parse(start, (size_t)(end - start), "request_id", out);
}

kvx_status_t kvc_port_check(uint64_t port, const char *field)
{
    if (port < 1024 || port > 65535) {
        return kvc_error(KVX_ERR_UNTRUSTED_PEER,
                         "%s: port %llu: must be in 1024..65535", field,
                         (unsigned long long)port);
    }
    return KVX_OK;
}

/* ---- trust -------------------------------------------------------------- */

/* kvc_ip_parse: 4 or 6 when s is a literal (address in a[16]), else 0.
 * An IPv4-mapped IPv6 address (::ffff:a.b.c.d, how a dual-stack listener
 * sees IPv4 peers) is the IPv4 address it maps. */
static int kvc_ip_parse(const char *s, uint8_t a[16])
{
    static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};

    memset(a, 0, 16);
    if (inet_pton(AF_INET, s, a) == 1) {
        return 4;
    }
    if (inet_pton(AF_INET6, s, a) == 1) {
        if (memcmp(a, mapped, sizeof(mapped)) == 0) {
            memmove(a, a + 12, 4);
            memset(a + 4, 0, 12);
            return 4;
        }
        return 6;
    }
    return 0;
}

/* kvc_ip_loopback: 127.0.0.0/8 or ::1 (a[] from kvc_ip_parse). */
static int kvc_ip_loopback(int fam, const uint8_t a[16])
{
    static const uint8_t one6[16] = {[15] = 1};

    return (fam == 4 && a[0] == 127) ||
           (fam == 6 && memcmp(a, one6, 16) == 0);
}

/* kvc_from_ip: the IP literal of a sender address ("ip:port", "[v6]:port")
 * into ip (len bytes); 0, or -1 when there is none. */
static int kvc_from_ip(const char *from, char *ip, size_t iplen)
{
    const char *end;
    size_t      len;

    if (from == NULL || from[0] == '\0') {
        return -1;
    }
    if (from[0] == '[') {
        from++;
        end = strchr(from, ']');
    } else {
        end = strrchr(from, ':');
    }
    len = end != NULL ? (size_t)(end - from) : strlen(from);
    if (len == 0 || len >= iplen) {
        return -1;
    }
    memcpy(ip, from, len);
    ip[len] = '\0';
    return 0;
}

uint64_t kvc_host_session(const uint64_t key[2], const char *addr,
                          int with_port)
{
    char     ip[64];
    uint8_t  in[17];
    uint64_t s;
    int      fam;

    if (addr == NULL ||
        (with_port ? kvc_from_ip(addr, ip, sizeof(ip))
                   : snprintf(ip, sizeof(ip), "%s", addr) >= (int)sizeof(ip)
                         ? -1 : 0) != 0 ||
        (fam = kvc_ip_parse(ip, in + 1)) == 0) {
        return 0;
    }
    if (kvc_ip_loopback(fam, in + 1)) {
        /* Loopback addresses are one host (kvc_from_matches). */
        fam = 4;
        memset(in + 1, 0, 16);
        in[1] = 127;
        in[4] = 1;
    }
    in[0] = (uint8_t)fam;
    s     = kvc_siphash24(key, in, sizeof(in));
    return s != 0 ? s : 1;
}

int kvc_notice_match(const uint64_t key[2], const char *const *hosts,
                     const uint64_t *insts, uint32_t n, uint64_t tag,
                     uint64_t nonce, uint64_t instance, uint64_t xnonce,
                     uint64_t mac)
{
    return kvc_notice_match_n(key, hosts, insts, n, tag, nonce, instance,
                              xnonce, KVC_COUNT_NONE, mac);
}

int kvc_notice_match_n(const uint64_t key[2], const char *const *hosts,
                       const uint64_t *insts, uint32_t n, uint64_t tag,
                       uint64_t nonce, uint64_t instance, uint64_t xnonce,
                       uint64_t count, uint64_t mac)
{
    int rc = -1;

    if (instance == 0) {
        return -2;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t s;

        if (insts[i] != instance) {
            continue;
        }
        s = kvc_host_session(key, hosts[i], 0);
        if (s != 0 && kvc_notice_mac(s, tag, nonce, instance, xnonce,
                                     count) == mac) {
            return (int)i;
        }
        if (s != 0) {
            rc = -2; /* the rank of that instance did not send it */
        }
    }
    return rc;
}

int kvc_notice_from_ok(const uint64_t key[2], const char *from, uint64_t tag,
                       uint64_t nonce, uint64_t instance, uint64_t xnonce,
                       uint64_t mac)
{
    uint64_t s = kvc_host_session(key, from, 1);

    return s != 0 &&
           kvc_req_mac(s, tag, nonce, instance, xnonce, KVC_MAC_NOTICE) == mac;
}

uint64_t kvc_notice_ranks(const uint64_t key[2], const char *const *hosts,
                          uint32_t n, uint64_t candidates, uint64_t tag,
                          uint64_t nonce, uint64_t instance, uint64_t xnonce,
                          uint64_t mac, int *checked_p)
{
    return kvc_notice_ranks_n(key, hosts, n, candidates, tag, nonce,
                              instance, xnonce, KVC_COUNT_NONE, mac,
                              checked_p);
}

uint64_t kvc_notice_ranks_n(const uint64_t key[2], const char *const *hosts,
                            uint32_t n, uint64_t candidates, uint64_t tag,
                            uint64_t nonce, uint64_t instance,
                            uint64_t xnonce, uint64_t count, uint64_t mac,
                            int *checked_p)
{
    uint64_t ranks = 0;
    int      checked = 0;

    for (uint32_t i = 0; i < n && i < 64 && instance != 0; i++) {
        uint64_t s;

        if (!(candidates >> i & 1) ||
            (s = kvc_host_session(key, hosts[i], 0)) == 0) {
            continue; /* not a candidate, or a host name */
        }
        checked = 1;
        if (kvc_notice_mac(s, tag, nonce, instance, xnonce, count) == mac) {
            ranks |= 1ull << i;
        }
    }
    if (checked_p != NULL) {
        *checked_p = checked;
    }
    return ranks;
}

int kvc_early_done_keep(kvc_early_done_t *s, uint64_t inst, uint64_t ranks)
{
    int freed = -1;

    if (inst == 0 || ranks == 0) {
        return 0;
    }
    for (int i = 0; i < KVC_RANKMAP_MAX; i++) {
        if (s->inst[i] == inst) {
            s->ranks[i] |= ranks;
            return 1;
        }
        if (s->inst[i] == 0 && freed < 0) {
            freed = i;
        }
    }
    if (freed < 0) {
        return 0;
    }
    s->inst[freed]  = inst;
    s->ranks[freed] = ranks;
    return 1;
}

int kvc_early_done_take(kvc_early_done_t *s, uint64_t inst, uint32_t k)
{
    for (int i = 0; i < KVC_RANKMAP_MAX && inst != 0 && k < 64; i++) {
        if (s->inst[i] == inst && (s->ranks[i] >> k & 1)) {
            s->inst[i]  = 0;
            s->ranks[i] = 0;
            return 1;
        }
    }
    return 0;
}

int kvc_from_matches(const char *from, const char *host)
{
    char        ip[64];
    uint8_t     a[16], b[16];
    int         fa, fb;

    if (host == NULL || kvc_from_ip(from, ip, sizeof(ip)) != 0) {
        return -1;
    }
    fa = kvc_ip_parse(ip, a);
    fb = kvc_ip_parse(host, b);
    if (fa == 0 || fb == 0) {
        return -1; /* a host name: not resolved here */
    }
    if (kvc_ip_loopback(fa, a) && kvc_ip_loopback(fb, b)) {
        return 1; /* a loopback dial leaves from 127.0.0.1 whatever host */
    }
    return fa == fb && memcmp(a, b, 16) == 0;
}

static int kvc_bytes_are(const uint8_t *a, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++) {
        if (a[i] != v) {
            return 0;
        }
    }
    return 1;
}

static const char *kvc_ip4_rule(const uint8_t *a)
{
    if (kvc_bytes_are(a, 4, 0)) {
        return "wildcard address";
    }
    if ((a[0] & 0xf0) == 0xe0) {
        return "multicast address";
    }
    if (kvc_bytes_are(a, 4, 0xff)) {
        return "broadcast address";
    }
    return NULL;
}

/* kvc_ip_rule names why an address literal may never be a peer, or NULL.
 * IPv4-mapped IPv6 addresses get the IPv4 rules. */
static const char *kvc_ip_rule(int kind, const uint8_t *a)
{
    if (kind == 4) {
        return kvc_ip4_rule(a);
    }
    if (kvc_bytes_are(a, 16, 0)) {
        return "wildcard address";
    }
    if (a[0] == 0xff) {
        return "multicast address";
    }
    if (kvc_bytes_are(a, 10, 0) && a[10] == 0xff && a[11] == 0xff) {
        return kvc_ip4_rule(a + 12);
    }
    return NULL;
}

/* kvc_name_rule: NULL when s is a well-formed host name, else the rule.
 * Names a resolver would read as an IPv4 number ("0", "0x7f.1", "10.1")
 * are refused so no name can smuggle a wildcard or broadcast address. */
static const char *kvc_name_rule(const char *s)
{
    size_t         len = strlen(s), label = 0;
    struct in_addr ia;

    if (len > KVC_HOSTNAME_MAX) {
        return "malformed host name: longer than 253 characters";
    }
    for (size_t i = 0; i <= len; i++) {
        char c = s[i];

        if (c == '.' || c == '\0') {
            if (label == 0 || s[i - 1] == '-') {
                break;
            }
            label = 0;
            if (c == '\0') {
                return inet_aton(s, &ia) != 0
                           ? "malformed host name: non-canonical IPv4 "
                             "literal"
                           : NULL;
            }
        } else if ((!kvc_addr_is_alnum(c) && c != '-') ||
                   (c == '-' && label == 0) || ++label > KVC_LABEL_MAX) {
            break;
        }
    }
    return "malformed host name: must be an IPv4/IPv6 literal or '.'-"
           "separated labels of 1..63 characters [A-Za-z0-9-] not starting "
           "or ending with '-'";
}

static int kvc_prefix_eq(const uint8_t *x, const uint8_t *y, uint32_t bits)
{
    size_t   full = bits / 8;
    uint32_t rest = bits % 8;
    uint8_t  mask;

    if (memcmp(x, y, full) != 0) {
        return 0;
    }
    if (rest == 0) {
        return 1;
    }
    mask = (uint8_t)(0xffu << (8 - rest));
    return ((x[full] ^ y[full]) & mask) == 0;
}

static int kvc_trust_match(const kvc_trust_t *trust, const char *host,
                           int kind, const uint8_t *a)
{
    for (size_t i = 0; i < trust->num_entries; i++) {
        const kvc_trust_entry_t *e = &trust->entries[i];

        if (e->kind == 0 && kind == 0 && strcasecmp(e->name, host) == 0) {
            return 1;
        }
        if (e->kind != 0 && e->kind == kind &&
            kvc_prefix_eq(e->addr, a, e->prefix)) {
            return 1;
        }
    }
    return 0;
}

static kvx_status_t kvc_trust_entry_fail(size_t i, const char *s,
                                         const char *rule)
{
    return kvc_error(KVX_ERR_CONFIG,
                     "trusted_remote_hosts[%zu]: value '%.*s': %s", i,
                     KVC_ADDR_SHOW, s, rule);
}

/* kvc_trust_cidr parses "addr/bits" (slash points into s). */
static kvx_status_t kvc_trust_cidr(kvc_trust_entry_t *e, const char *s,
                                   const char *slash, size_t i)
{
    char     ip[KVC_HOST_MAX];
    size_t   alen = (size_t)(slash - s), blen = strlen(slash + 1);
    uint32_t bits = 0;

    memcpy(ip, s, alen);
    ip[alen] = '\0';
    e->kind = kvc_ip_parse(ip, e->addr);
    if (e->kind == 0) {
        return kvc_trust_entry_fail(
            i, s, "CIDR address must be an IPv4 or IPv6 literal");
    }
    for (size_t k = 0; k < blen && blen <= 3; k++) {
        bits = kvc_addr_is_digit(slash[1 + k])
                   ? bits * 10 + (uint32_t)(slash[1 + k] - '0')
                   : 1000;
    }
    if (e->kind == 4 && strchr(ip, ':') != NULL) {
        /* ::ffff:a.b.c.d/bits: bits of the mapped IPv6 address. */
        if (blen == 0 || blen > 3 || bits < 96 || bits > 128) {
            return kvc_trust_entry_fail(
                i, s, "CIDR prefix of an IPv4-mapped address must be "
                      "96..128");
        }
        bits -= 96;
    }
    if (blen == 0 || blen > 3 || bits > (e->kind == 4 ? 32u : 128u)) {
        return kvc_trust_entry_fail(
            i, s, "CIDR prefix must be 0..32 (IPv4) or 0..128 (IPv6)");
    }
    e->prefix = bits;
    return KVX_OK;
}

static kvx_status_t kvc_trust_entry_parse(kvc_trust_entry_t *e,
                                          const char *s, size_t i)
{
    const char *slash;

    if (s == NULL || s[0] == '\0') {
        return kvc_trust_entry_fail(i, "", "empty entry");
    }
    if (strlen(s) > KVC_HOSTNAME_MAX) {
        return kvc_trust_entry_fail(i, s, "longer than 253 characters");
    }
    slash = strchr(s, '/');
    if (slash != NULL) {
        return kvc_trust_cidr(e, s, slash, i);
    }
    e->kind = kvc_ip_parse(s, e->addr);
    if (e->kind != 0) {
        e->prefix = e->kind == 4 ? 32 : 128;
        return KVX_OK;
    }
    if (kvc_name_rule(s) != NULL) {
        return kvc_trust_entry_fail(i, s, kvc_name_rule(s));
    }
    snprintf(e->name, sizeof(e->name), "%s", s);
    return KVX_OK;
}

kvx_status_t kvc_trust_init(kvc_trust_t *trust, char *const *hosts, size_t n,
                            int set)
{
    kvc_trust_entry_t *entries;
    kvx_status_t       st;

    memset(trust, 0, sizeof(*trust));
    if (!set) {
        return KVX_OK;
    }
    if (n > 0 && hosts == NULL) {
        return kvc_error(KVX_ERR_CONFIG,
                         "trusted_remote_hosts: %zu entries but no list", n);
    }
    entries = calloc(n ? n : 1, sizeof(*entries));
    if (entries == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "trusted_remote_hosts: out of memory for %zu entries",
                         n);
    }
    for (size_t i = 0; i < n; i++) {
        st = kvc_trust_entry_parse(&entries[i], hosts[i], i);
        if (st != KVX_OK) {
            free(entries);
            return st;
        }
    }
    trust->set         = 1;
    trust->entries     = entries;
    trust->num_entries = n;
    return KVX_OK;
}

size_t kvc_trust_nets(const kvc_trust_t *trust, kvt_net_t *out, size_t max)
{
    size_t n = 0;

    for (size_t i = 0; i < trust->num_entries; i++) {
        const kvc_trust_entry_t *e = &trust->entries[i];

        if (e->kind == 0) {
            continue;
        }
        if (n < max) {
            out[n].family = e->kind;
            memcpy(out[n].addr, e->addr, sizeof(out[n].addr));
            out[n].prefix = e->prefix;
        }
        n++;
    }
    return n;
}

void kvc_trust_fini(kvc_trust_t *trust)
{
    if (trust == NULL) {
        return;
    }
    free(trust->entries);
    memset(trust, 0, sizeof(*trust));
}

kvx_status_t kvc_trust_check(const kvc_trust_t *trust, const char *host,
                             const char *field)
{
    uint8_t     a[16] = {0};
    const char *rule;
    int         kind = 0;

    if (field == NULL) {
        field = "(unnamed field)";
    }
    if (host == NULL || host[0] == '\0') {
        rule = "empty host";
        host = "";
    } else {
        kind = kvc_ip_parse(host, a);
        rule = kind != 0 ? kvc_ip_rule(kind, a) : kvc_name_rule(host);
    }
    if (rule == NULL && trust != NULL && trust->set &&
        !kvc_trust_match(trust, host, kind, a)) {
        rule = "not in trusted_remote_hosts";
    }
    if (rule != NULL) {
        return kvc_error(KVX_ERR_UNTRUSTED_PEER,
                         "peer host '%.*s' from %s rejected: %s",
                         KVC_ADDR_SHOW, host, field, rule);
    }
    return KVX_OK;
}

/* ---- host of a remote rank ---------------------------------------------- */

kvx_status_t kvc_host_resolve(const char *advertised, char *const *hosts,
                              size_t n, uint32_t remote_dp_size,
                              uint32_t remote_tp_size, uint32_t remote_dp_rank,
                              uint32_t remote_tp_rank, const char **host_p,
                              int *index_p)
{
    uint64_t world, per_host, idx;

    if (n <= 1) {
        *host_p = advertised;
        if (index_p != NULL) {
            *index_p = -1;
        }
        return KVX_OK;
    }
    if (hosts == NULL) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "remote_hosts: %zu entries but no list", n);
    }
    if (remote_dp_size == 0 || remote_tp_size == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "remote_hosts: %zu entries but remote_dp_size %u / "
                         "remote_tp_size %u: both must be >= 1",
                         n, remote_dp_size, remote_tp_size);
    }
    if (remote_dp_rank >= remote_dp_size || remote_tp_rank >= remote_tp_size) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "remote rank (dp %u, tp %u): must be below "
                         "(remote_dp_size %u, remote_tp_size %u)",
                         remote_dp_rank, remote_tp_rank, remote_dp_size,
                         remote_tp_size);
    }
    world = (uint64_t)remote_dp_size * remote_tp_size;
    if (world % n != 0) {
        return kvc_error(KVX_ERR_CONFIG,
                         "remote_hosts: world %llu (remote_dp_size %u x "
                         "remote_tp_size %u) is not a multiple of %zu "
                         "remote_hosts",
                         (unsigned long long)world, remote_dp_size,
                         remote_tp_size, n);
    }
    per_host = world / n;
    idx = ((uint64_t)remote_dp_rank * remote_tp_size + remote_tp_rank) /
          per_host;
    *host_p = hosts[idx];
    if (index_p != NULL) {
        *index_p = (int)idx;
    }
    return KVX_OK;
}

/* ---- TP rank mapping ---------------------------------------------------- */

static kvx_status_t kvc_rankmap_sizes(uint32_t d_tp, uint32_t p_tp)
{
    uint32_t hi = d_tp > p_tp ? d_tp : p_tp, lo = d_tp > p_tp ? p_tp : d_tp;

    if (d_tp == 0 || p_tp == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "tp sizes: decode tp_size %u, prefill tp_size %u: "
                         "both must be >= 1",
                         d_tp, p_tp);
    }
    if (hi % lo != 0) {
        return kvc_error(KVX_ERR_CONFIG,
                         "tp sizes: decode tp_size %u, prefill tp_size %u: "
                         "the larger must be a multiple of the smaller",
                         d_tp, p_tp);
    }
    if (d_tp < p_tp && p_tp / d_tp > KVC_RANKMAP_MAX) {
        return kvc_error(KVX_ERR_NOT_SUPPORTED,
                         "tp sizes: prefill tp_size %u / decode tp_size %u: "
                         "ratio must be <= %d",
                         p_tp, d_tp, KVC_RANKMAP_MAX);
    }
    return KVX_OK;
}

/* kvc_heads_split: n heads per rank cut into at most `ways` equal pieces
 * (ways ranks of the other side share them): min(n, ways), 1 for a
 * key-only model (n == 0). The count must divide `ways` and n evenly. */
static kvx_status_t kvc_heads_split(uint32_t n, uint32_t ways,
                                    const char *side, uint32_t *out)
{
    uint32_t k = n == 0 ? 1 : n < ways ? n : ways;

    if (n == KVC_HEADS_SHARDED) {
        *out = ways;
        return KVX_OK;
    }

    if ((n != 0 && n % k != 0) || ways % k != 0) {
        return kvc_error(KVX_ERR_PEER_INCOMPATIBLE,
                         "%s num_kv_heads %u per rank cannot be shared by "
                         "%u ranks of the other side: the smaller of the two "
                         "must divide the larger", side, n, ways);
    }
    *out = k;
    return KVX_OK;
}

kvx_status_t kvc_rankmap_heads(uint32_t d_tp, uint32_t p_tp, uint32_t d_heads,
                               uint32_t p_heads, uint32_t d_rank,
                               kvc_rankmap_t *map)
{
    kvc_rankmap_t m;
    kvx_status_t  st = kvc_rankmap_sizes(d_tp, p_tp);

    if (st != KVX_OK) {
        return st;
    }
    if (d_rank >= d_tp) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "decode tp_rank %u: must be below decode tp_size %u",
                         d_rank, d_tp);
    }
    memset(&m, 0, sizeof(m));
    m.num_slices  = 1;
    m.num_release = 1;
    if (d_tp >= p_tp) {
        uint32_t q = d_tp / p_tp, n;

        /* The q D ranks d/q*q .. +q-1 share P rank d/q. Its p_heads are
         * cut into n = min(p_heads, q) slices; with fewer heads than D
         * ranks each slice is held by q/n consecutive D ranks (replicated
         * GQA heads), as the rank holding head h at tp t is h*t/heads. */
        st = kvc_heads_split(p_heads, q, "prefill", &n);
        if (st != KVX_OK) {
            return st;
        }
        m.read_rank  = d_rank / q;
        m.release[0] = m.read_rank;
        m.num_slices = n;
        m.head_slice = (d_rank % q) / (q / n);
    } else {
        uint32_t r = p_tp / d_tp, n, step;

        /* The r P ranks d*r .. d*r+r-1 hold this rank's heads and are all
         * released. d_heads are assembled from n = min(d_heads, r) parts;
         * with fewer heads than P ranks each part is held by step = r/n
         * consecutive P ranks (replicated), and the first of them is read.
         * release[0..n-1] are the sources (part k), then the replicas. */
        st = kvc_heads_split(d_heads, r, "decode", &n);
        if (st != KVX_OK) {
            return st;
        }
        step          = r / n;
        m.read_rank   = d_rank * r;
        m.num_release = r;
        for (uint32_t k = 0; k < r; k++) {
            uint32_t part = k < n ? k : (k - n) / (step - 1);
            uint32_t rep  = k < n ? 0 : (k - n) % (step - 1) + 1;

            m.release[k] = d_rank * r + part * step + rep;
        }
        m.gather     = n > 1;
        m.num_slices = n;
    }
    *map = m;
    return KVX_OK;
}

kvx_status_t kvc_rankmap(uint32_t d_tp, uint32_t p_tp, int replicated,
                         uint32_t d_rank, kvc_rankmap_t *map)
{
    uint32_t heads = replicated ? 0 : KVC_HEADS_SHARDED;

    return kvc_rankmap_heads(d_tp, p_tp, heads, heads, d_rank, map);
}

kvx_status_t kvc_ack_quorum(uint32_t d_tp, uint32_t p_tp, int replicated,
                            uint32_t p_rank, uint32_t *quorum_p)
{
    kvc_rankmap_t m;
    uint32_t      quorum = 0;
    kvx_status_t  st = kvc_rankmap_sizes(d_tp, p_tp);

    if (st != KVX_OK) {
        return st;
    }
    if (p_rank >= p_tp) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "prefill tp_rank %u: must be below prefill tp_size "
                         "%u",
                         p_rank, p_tp);
    }
    for (uint32_t d = 0; d < d_tp; d++) {
        st = kvc_rankmap(d_tp, p_tp, replicated, d, &m);
        if (st != KVX_OK) {
            return st;
        }
        for (uint32_t k = 0; k < m.num_release; k++) {
            if (m.release[k] == p_rank) {
                quorum++;
                break;
            }
        }
    }
    *quorum_p = quorum;
    return KVX_OK;
}

/* ---- kv_transfer_params ------------------------------------------------- */

typedef struct kvc_params_ctx {
    kvc_xfer_params_t *p;
    uint32_t           tp_size;     /* "tp_size", 0 when absent */
    int                has_dp_rank; /* "remote_dp_rank" present */
} kvc_params_ctx_t;

typedef kvx_status_t (*kvc_params_field_fn)(const kvc_pv_t *v,
                                            const char *key,
                                            kvc_params_ctx_t *c);

/* kvc_params_show_len: at most KVC_ADDR_SHOW bytes of a value's text. */
static int kvc_params_show_len(int len)
{
    return len < KVC_ADDR_SHOW ? len : KVC_ADDR_SHOW;
}

static kvx_status_t kvc_params_type_fail(const kvc_pv_t *v, const char *key,
                                         const char *rule)
{
    int         len;
    const char *text = kvc_pv_show(v, &len);

    return kvc_error(KVX_ERR_INVALID_PARAM, "%s.%s: value %.*s: %s",
                     KVC_PARAMS, key, kvc_params_show_len(len), text, rule);
}

/* kvc_params_no_nul: a string value (element idx of a list, SIZE_MAX for
 * the field itself) must not hold a NUL (JSON "\u0000"): every field is
 * used as C text, which would end there. */
static kvx_status_t kvc_params_no_nul(const kvc_pv_t *v, const char *key,
                                      size_t idx)
{
    const char *nul = v->type == KVC_PV_STR ? memchr(v->s, '\0', v->len)
                                            : NULL;

    if (nul == NULL) {
        return KVX_OK;
    }
    if (idx == SIZE_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "%s.%s: NUL character (\\u0000) at offset %zu: not "
                         "allowed", KVC_PARAMS, key, (size_t)(nul - v->s));
    }
    return kvc_error(KVX_ERR_INVALID_PARAM,
                     "%s.%s[%zu]: NUL character (\\u0000) at offset %zu: not "
                     "allowed", KVC_PARAMS, key, idx, (size_t)(nul - v->s));
}

static kvx_status_t kvc_params_str(const kvc_pv_t *v, const char *key,
                                   char *dst, size_t cap)
{
    if (v->type != KVC_PV_STR) {
        return kvc_params_type_fail(v, key, "must be a string");
    }
    if (v->len >= cap) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "%s.%s: length %zu: must be below %zu", KVC_PARAMS,
                         key, v->len, cap);
    }
    memcpy(dst, v->s, v->len);
    dst[v->len] = '\0';
    return KVX_OK;
}

static kvx_status_t kvc_params_u32(const kvc_pv_t *v, const char *key,
                                   uint32_t *dst)
{
    int64_t x;

    if (v->type != KVC_PV_INT) {
        return kvc_params_type_fail(v, key, "must be a non-negative integer");
    }
    x = v->i;
    if (x < 0 || x > (int64_t)UINT32_MAX) {
        return kvc_params_type_fail(v, key,
                                    "must be an integer in 0..4294967295");
    }
    *dst = (uint32_t)x;
    return KVX_OK;
}

/* kvc_params_transfer_id: what every control message of the transfer
 * carries, so held to the messages' rule (ctlmsg.c kvc_text_check:
 * printable ASCII, spaces allowed): a peer refuses every release,
 * remote_blocks and write_done of an id outside it, and the transfer would
 * end only at a timeout instead of here with the field named. */
static kvx_status_t kvc_params_transfer_id(const kvc_pv_t *v, const char *key,
                                           kvc_params_ctx_t *c)
{
    kvx_status_t st = kvc_params_str(v, key, c->p->transfer_id,
                                     sizeof(c->p->transfer_id));

    for (size_t i = 0; st == KVX_OK && i < v->len; i++) {
        unsigned char b = (unsigned char)v->s[i];

        if (b < 0x20 || b > 0x7e) {
            c->p->transfer_id[0] = '\0';
            st = kvc_error(KVX_ERR_INVALID_PARAM, "%s.%s: byte 0x%02x at "
                           "offset %zu: must be printable ASCII (control "
                           "messages carry it as such)", KVC_PARAMS, key, b,
                           i);
        }
    }
    return st;
}

static kvx_status_t kvc_params_engine_id(const kvc_pv_t *v, const char *key,
                                         kvc_params_ctx_t *c)
{
    return kvc_params_str(v, key, c->p->remote_engine_id,
                          sizeof(c->p->remote_engine_id));
}

/* kvc_params_instance: "remote_instance" or "remote_accepted", a decimal
 * string of a non-zero 64-bit id (JSON numbers cannot carry every
 * uint64). */
static kvx_status_t kvc_params_instance(const kvc_pv_t *v, const char *key,
                                        kvc_params_ctx_t *c)
{
    const char *s;
    uint64_t    x = 0;
    size_t      i, n;

    if (v->type != KVC_PV_STR) {
        return kvc_params_type_fail(v, key, "must be a decimal string of a "
                                    "64-bit instance id");
    }
    s = v->s;
    n = v->len;
    for (i = 0; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        unsigned d = (unsigned)(s[i] - '0');

        if (x > (UINT64_MAX - d) / 10) {
            break;
        }
        x = x * 10 + d;
    }
    if (n == 0 || i != n || x == 0 || s[0] == '0') {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "kv_transfer_params.%s: value '%.*s': must be a "
                         "decimal string of an integer in 1..%llu", key,
                         n < 40 ? (int)n : 40, s,
                         (unsigned long long)UINT64_MAX);
    }
    if (strcmp(key, "remote_accepted") == 0) {
        c->p->remote_accepted     = x;
        c->p->has_remote_accepted = 1;
    } else {
        c->p->remote_instance     = x;
        c->p->has_remote_instance = 1;
    }
    return KVX_OK;
}

static kvx_status_t kvc_params_host(const kvc_pv_t *v, const char *key,
                                    kvc_params_ctx_t *c)
{
    return kvc_params_str(v, key, c->p->remote.host,
                          sizeof(c->p->remote.host));
}

/* kvc_params_port_value reads an integer or a decimal string and checks
 * the port range (field is "kv_transfer_params.<key>"). */
static kvx_status_t kvc_params_port_value(const kvc_pv_t *v, const char *key,
                                          uint32_t *dst)
{
    char     field[64];
    uint64_t port = 0;

    snprintf(field, sizeof(field), "%s.%s", KVC_PARAMS, key);
    if (v->type == KVC_PV_INT) {
        if (v->i < 0) {
            return kvc_error(KVX_ERR_UNTRUSTED_PEER,
                             "%s: port %lld: must be in 1024..65535", field,
                             (long long)v->i);
        }
        port = v->u;
    } else if (v->type == KVC_PV_STR) {
        for (size_t i = 0; i < v->len; i++) {
            if (!kvc_addr_is_digit(v->s[i])) {
                return kvc_params_type_fail(
                    v, key, "must be an integer or a decimal string");
            }
            port = port > 65535 ? port
                                : port * 10 + (uint64_t)(v->s[i] - '0');
        }
        if (v->len == 0) {
            return kvc_params_type_fail(
                v, key, "must be an integer or a decimal string");
        }
    } else {
        return kvc_params_type_fail(v, key,
                                    "must be an integer or a decimal string");
    }
    if (kvc_port_check(port, field) != KVX_OK) {
        return KVX_ERR_UNTRUSTED_PEER;
    }
    *dst = (uint32_t)port;
    return KVX_OK;
}

static kvx_status_t kvc_params_hs_port(const kvc_pv_t *v, const char *key,
                                       kvc_params_ctx_t *c)
{
    return kvc_params_port_value(v, key, &c->p->remote.handshake_port);
}

static kvx_status_t kvc_params_nt_port(const kvc_pv_t *v, const char *key,
                                       kvc_params_ctx_t *c)
{
    return kvc_params_port_value(v, key, &c->p->remote.notify_port);
}

static void kvc_hosts_free(char **hosts, size_t n)
{
    for (size_t i = 0; i < n && hosts != NULL; i++) {
        free(hosts[i]);
    }
    free(hosts);
}

/* kvc_hosts_add appends s[0..len) trimmed; empty entries are dropped. */
static kvx_status_t kvc_hosts_add(char **hosts, size_t *n, const char *s,
                                  size_t len, const char *key, size_t idx)
{
    while (len > 0 && (s[0] == ' ' || s[0] == '\t')) {
        s++;
        len--;
    }
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t')) {
        len--;
    }
    if (len == 0) {
        return KVX_OK;
    }
    if (len >= KVC_HOST_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "%s.%s[%zu]: length %zu: must be below %d",
                         KVC_PARAMS, key, idx, len, KVC_HOST_MAX);
    }
    hosts[*n] = strndup(s, len);
    if (hosts[*n] == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "%s.%s: out of memory",
                         KVC_PARAMS, key);
    }
    (*n)++;
    return KVX_OK;
}

static kvx_status_t kvc_hosts_fill(const kvc_pv_t *v, const char *key,
                                   char **hosts, size_t *n)
{
    kvx_status_t st = KVX_OK;
    kvc_pv_it_t  it = {0};
    kvc_pv_t     e;

    if (v->type == KVC_PV_STR) {
        const char *p = v->s, *end = v->s + v->len;
        size_t      i = 0;

        for (; st == KVX_OK; i++) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            size_t      len = (size_t)((comma ? comma : end) - p);

            st = kvc_hosts_add(hosts, n, p, len, key, i);
            if (comma == NULL) {
                break;
            }
            p = comma + 1;
        }
        return st;
    }
    for (size_t i = 0; st == KVX_OK && kvc_pv_next(v, &it, &e); i++) {
        if (e.type != KVC_PV_STR) {
            int         len;
            const char *text = kvc_pv_show(&e, &len);

            return kvc_error(KVX_ERR_INVALID_PARAM,
                             "%s.%s[%zu]: value %.*s: must be a string",
                             KVC_PARAMS, key, i, kvc_params_show_len(len),
                             text);
        }
        st = kvc_params_no_nul(&e, key, i);
        st = st != KVX_OK ? st : kvc_hosts_add(hosts, n, e.s, e.len, key, i);
    }
    return st;
}

static kvx_status_t kvc_params_hosts(const kvc_pv_t *v, const char *key,
                                     kvc_params_ctx_t *c)
{
    size_t       cap = 1, n = 0;
    char       **hosts;
    kvx_status_t st;

    if (v->type == KVC_PV_ARRAY) {
        cap = v->len + 1;
    } else if (v->type == KVC_PV_STR) {
        for (size_t i = 0; i < v->len; i++) {
            cap += v->s[i] == ',';
        }
    } else {
        return kvc_params_type_fail(
            v, key, "must be a list of strings or a comma-separated string");
    }
    hosts = calloc(cap, sizeof(*hosts));
    if (hosts == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "%s.%s: out of memory",
                         KVC_PARAMS, key);
    }
    st = kvc_hosts_fill(v, key, hosts, &n);
    if (st != KVX_OK) {
        kvc_hosts_free(hosts, n);
        return st;
    }
    c->p->remote_hosts     = hosts;
    c->p->num_remote_hosts = n;
    return KVX_OK;
}

static kvx_status_t kvc_params_blocks(const kvc_pv_t *v, const char *key,
                                      kvc_params_ctx_t *c)
{
    size_t      n;
    uint64_t   *ids;
    kvc_pv_it_t it = {0};
    kvc_pv_t    e;

    if (v->type != KVC_PV_ARRAY) {
        return kvc_params_type_fail(v, key,
                                    "must be a list of non-negative integers");
    }
    n   = v->len;
    ids = calloc(n ? n : 1, sizeof(*ids));
    if (ids == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "%s.%s: out of memory for %zu ids",
                         KVC_PARAMS, key, n);
    }
    for (size_t i = 0; i < n && kvc_pv_next(v, &it, &e); i++) {
        if (e.type != KVC_PV_INT || e.i < 0) {
            int         len;
            const char *text = kvc_pv_show(&e, &len);

            free(ids);
            return kvc_error(KVX_ERR_INVALID_PARAM,
                             "%s.%s[%zu]: value %.*s: must be a non-negative "
                             "integer",
                             KVC_PARAMS, key, i, kvc_params_show_len(len),
                             text);
        }
        ids[i] = e.u;
    }
    c->p->has_remote_block_ids = 1;
    c->p->remote_block_ids     = ids;
    c->p->num_remote_block_ids = n;
    return KVX_OK;
}

static kvx_status_t kvc_params_int(const kvc_pv_t *v, const char *key,
                                   kvc_params_ctx_t *c)
{
    if (strcmp(key, "tp_size") == 0) {
        return kvc_params_u32(v, key, &c->tp_size);
    }
    if (strcmp(key, "remote_tp_size") == 0) {
        return kvc_params_u32(v, key, &c->p->remote_tp_size);
    }
    if (strcmp(key, "remote_dp_size") == 0) {
        return kvc_params_u32(v, key, &c->p->remote_dp_size);
    }
    if (strcmp(key, "remote_tp_rank") == 0) {
        return kvc_params_u32(v, key, &c->p->remote_tp_rank);
    }
    if (strcmp(key, "remote_hold_ms") == 0) {
        return kvc_params_u32(v, key, &c->p->remote_hold_ms);
    }
    c->has_dp_rank = 1;
    return kvc_params_u32(v, key, &c->p->remote_dp_rank);
}

static kvx_status_t kvc_params_bool(const kvc_pv_t *v, const char *key,
                                    kvc_params_ctx_t *c)
{
    int *dst = strcmp(key, "do_remote_prefill") == 0
                   ? &c->p->do_remote_prefill
                   : &c->p->do_remote_decode;

    if (v->type != KVC_PV_BOOL) {
        return kvc_params_type_fail(v, key, "must be true or false");
    }
    *dst = v->b;
    return KVX_OK;
}

#define KVC_PARAMS_FIELD(key, fn) {key, sizeof(key) - 1, fn}

static const struct {
    const char         *key;
    size_t              len; /* strlen(key) */
    kvc_params_field_fn fn;
} kvc_params_fields[] = {
    KVC_PARAMS_FIELD("transfer_id", kvc_params_transfer_id),
    KVC_PARAMS_FIELD("remote_host", kvc_params_host),
    KVC_PARAMS_FIELD("remote_handshake_port", kvc_params_hs_port),
    KVC_PARAMS_FIELD("remote_notify_port", kvc_params_nt_port),
    KVC_PARAMS_FIELD("remote_hosts", kvc_params_hosts),
    KVC_PARAMS_FIELD("remote_block_ids", kvc_params_blocks),
    KVC_PARAMS_FIELD("remote_engine_id", kvc_params_engine_id),
    KVC_PARAMS_FIELD("remote_tp_size", kvc_params_int),
    KVC_PARAMS_FIELD("tp_size", kvc_params_int),
    KVC_PARAMS_FIELD("remote_dp_size", kvc_params_int),
    KVC_PARAMS_FIELD("remote_dp_rank", kvc_params_int),
    KVC_PARAMS_FIELD("remote_tp_rank", kvc_params_int),
    KVC_PARAMS_FIELD("remote_instance", kvc_params_instance),
    KVC_PARAMS_FIELD("remote_accepted", kvc_params_instance),
    KVC_PARAMS_FIELD("remote_hold_ms", kvc_params_int),
    KVC_PARAMS_FIELD("do_remote_prefill", kvc_params_bool),
    KVC_PARAMS_FIELD("do_remote_decode", kvc_params_bool),
};

#define KVC_PARAMS_NFIELDS                                                     \
    (sizeof(kvc_params_fields) / sizeof(kvc_params_fields[0]))
/* members of params the flat reader takes; more go to json-c */
#define KVC_PARAMS_FLAT_MAX 32

/* kvc_params_apply decodes vals[i], the value of kvc_params_fields[i] (NULL
 * when absent; JSON null counts as absent), into c->p, in the table's
 * order. On error c->p is finalised. */
static kvx_status_t kvc_params_apply(const kvc_pv_t *const *vals,
                                     kvc_params_ctx_t *c)
{
    kvc_xfer_params_t *p = c->p;
    kvx_status_t       st;

    for (size_t i = 0; i < KVC_PARAMS_NFIELDS; i++) {
        if (vals[i] == NULL || vals[i]->type == KVC_PV_NULL) {
            continue;
        }
        st = kvc_params_no_nul(vals[i], kvc_params_fields[i].key, SIZE_MAX);
        if (st == KVX_OK) {
            st = kvc_params_fields[i].fn(vals[i], kvc_params_fields[i].key,
                                         c);
        }
        if (st != KVX_OK) {
            kvc_params_fini(p);
            return st;
        }
    }
    if (p->remote_tp_size == 0) {
        p->remote_tp_size = c->tp_size;
    }
    p->has_remote_addr = p->remote.host[0] != '\0' &&
                         p->remote.handshake_port != 0 &&
                         p->remote.notify_port != 0;
    return KVX_OK;
}

/* kvc_params_from_obj decodes json-c's obj (NULL = all defaults) into c->p
 * as kvc_params_apply. */
static kvx_status_t kvc_params_from_obj(json_object *obj, kvc_params_ctx_t *c)
{
    kvc_pv_t        pv[KVC_PARAMS_NFIELDS];
    const kvc_pv_t *vals[KVC_PARAMS_NFIELDS] = {0};
    json_object    *v;

    for (size_t i = 0; obj != NULL && i < KVC_PARAMS_NFIELDS; i++) {
        if (json_object_object_get_ex(obj, kvc_params_fields[i].key, &v)) {
            kvc_pv_from_json(v, &pv[i]);
            vals[i] = &pv[i];
        }
    }
    return kvc_params_apply(vals, c);
}

/* kvc_params_flat decodes json into c->p without json-c when the flat
 * reader takes it (pval.h), no field repeats and every field is valid: 1.
 * Otherwise 0 with c->p zeroed: the caller decodes with json-c, which
 * gives the same fields or the canonical error. */
static int kvc_params_flat(const char *json, kvc_params_ctx_t *c)
{
    kvc_flat_member_t m[KVC_PARAMS_FLAT_MAX];
    const kvc_pv_t   *vals[KVC_PARAMS_NFIELDS] = {0};
    size_t            n, len = strlen(json);

    /* json-c takes at most INT32_MAX bytes: longer text is its to refuse */
    if (len > INT32_MAX ||
        !kvc_flat_scan(json, len, m, KVC_PARAMS_FLAT_MAX, &n)) {
        return 0;
    }
    for (size_t j = 0; j < n; j++) {
        for (size_t i = 0; i < KVC_PARAMS_NFIELDS; i++) {
            if (kvc_params_fields[i].len != m[j].key_len ||
                memcmp(kvc_params_fields[i].key, m[j].key, m[j].key_len) !=
                    0) {
                continue;
            }
            if (vals[i] != NULL) {
                return 0; /* json-c keeps the last: let it decide */
            }
            vals[i] = &m[j].val;
            break;
        }
    }
    return kvc_params_apply(vals, c) == KVX_OK;
}

/* kvc_params_json parses json into *obj_p (NULL for NULL/""/"null"). */
static kvx_status_t kvc_params_json(const char *json, const char *what,
                                    json_object **obj_p)
{
    enum json_tokener_error jerr = json_tokener_success;
    json_object            *obj;

    *obj_p = NULL;
    if (json == NULL || json[0] == '\0') {
        return KVX_OK;
    }
    obj = json_tokener_parse_verbose(json, &jerr);
    if (jerr != json_tokener_success) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "%s: invalid JSON: %s", what,
                         json_tokener_error_desc(jerr));
    }
    if (obj != NULL && !json_object_is_type(obj, json_type_object)) {
        json_object_put(obj);
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "%s: must be a JSON object", what);
    }
    *obj_p = obj;
    return KVX_OK;
}

/* kvc_params_decode: json (NULL/"" = all defaults) into c->p; the flat
 * reader first, json-c for everything it does not take. */
static kvx_status_t kvc_params_decode(const char *json, kvc_params_ctx_t *c,
                                      int flat)
{
    kvx_status_t st;
    json_object *obj;

    if (flat && json != NULL && json[0] != '\0' && kvc_params_flat(json, c)) {
        return KVX_OK;
    }
    memset(c->p, 0, sizeof(*c->p));
    c->tp_size     = 0;
    c->has_dp_rank = 0;
    st             = kvc_params_json(json, KVC_PARAMS, &obj);
    if (st != KVX_OK) {
        return st;
    }
    st = kvc_params_from_obj(obj, c);
    json_object_put(obj);
    return st;
}

kvx_status_t kvc_params_parse(const char *json, kvc_xfer_params_t *p)
{
    kvc_params_ctx_t ctx = {.p = p};

    memset(p, 0, sizeof(*p));
    return kvc_params_decode(json, &ctx, 1);
}

kvx_status_t kvc_params_parse_json_c(const char *json, kvc_xfer_params_t *p)
{
    kvc_params_ctx_t ctx = {.p = p};

    memset(p, 0, sizeof(*p));
    return kvc_params_decode(json, &ctx, 0);
}

void kvc_params_fini(kvc_xfer_params_t *p)
{
    if (p == NULL) {
        return;
    }
    kvc_hosts_free(p->remote_hosts, p->num_remote_hosts);
    free(p->remote_block_ids);
    memset(p, 0, sizeof(*p));
}

kvx_status_t kvc_params_peer_addr(const kvc_xfer_params_t *p,
                                  const char *request_id, int want_prefill,
                                  kvc_peer_addr_t *out, const char **field_p)
{
    kvx_status_t st;

    if (p != NULL && p->has_remote_addr) {
        *out = p->remote;
        if (field_p != NULL) {
            *field_p = "remote_host";
        }
        return KVX_OK;
    }
    st = kvc_reqid_parse(request_id, want_prefill, out);
    if (st == KVX_OK && field_p != NULL) {
        *field_p = "request_id";
    }
    return st;
}

/* ---- proxy helper: D's params from P's response ------------------------- */

static int kvc_obj_put(json_object *obj, const char *key, json_object *v)
{
    if (v == NULL) {
        return -1;
    }
    return json_object_object_add(obj, key, v) == 0 ? 0 : -1;
}

/* kvc_obj_put_u64: a 64-bit id as a decimal string (JSON numbers cannot
 * carry every uint64). */
static int kvc_obj_put_u64(json_object *obj, const char *key, uint64_t v)
{
    char text[24];

    snprintf(text, sizeof(text), "%llu", (unsigned long long)v);
    return kvc_obj_put(obj, key, json_object_new_string(text));
}

static json_object *kvc_json_hosts(const kvc_xfer_params_t *p)
{
    json_object *arr = json_object_new_array();

    for (size_t i = 0; arr != NULL && i < p->num_remote_hosts; i++) {
        json_object_array_add(arr,
                              json_object_new_string(p->remote_hosts[i]));
    }
    return arr;
}

static json_object *kvc_json_blocks(const kvc_xfer_params_t *p)
{
    json_object *arr = json_object_new_array();

    for (size_t i = 0; arr != NULL && i < p->num_remote_block_ids; i++) {
        json_object_array_add(arr,
                              json_object_new_uint64(p->remote_block_ids[i]));
    }
    return arr;
}

/* kvc_build_decode_obj fills obj from P's decoded params. */
static int kvc_build_decode_obj(json_object *obj, const kvc_params_ctx_t *c,
                                const char *transfer_id)
{
    const kvc_xfer_params_t *p = c->p;
    int                      rc = 0;

    rc |= kvc_obj_put(obj, "do_remote_prefill", json_object_new_boolean(1));
    rc |= kvc_obj_put(obj, "do_remote_decode", json_object_new_boolean(0));
    if (transfer_id[0] != '\0') {
        rc |= kvc_obj_put(obj, "transfer_id",
                          json_object_new_string(transfer_id));
    }
    if (p->has_remote_block_ids) {
        rc |= kvc_obj_put(obj, "remote_block_ids", kvc_json_blocks(p));
    }
    if (p->has_remote_instance) {
        rc |= kvc_obj_put_u64(obj, "remote_instance", p->remote_instance);
        rc |= kvc_obj_put(obj, "remote_tp_rank",
                          json_object_new_int((int)p->remote_tp_rank));
    }
    if (p->has_remote_accepted) {
        rc |= kvc_obj_put_u64(obj, "remote_accepted", p->remote_accepted);
    }
    if (p->remote_hold_ms != 0) {
        rc |= kvc_obj_put(obj, "remote_hold_ms",
                          json_object_new_int64((int64_t)p->remote_hold_ms));
    }
    if (p->remote_engine_id[0] != '\0') {
        rc |= kvc_obj_put(obj, "remote_engine_id",
                          json_object_new_string(p->remote_engine_id));
    }
    if (p->has_remote_addr) {
        rc |= kvc_obj_put(obj, "remote_host",
                          json_object_new_string(p->remote.host));
        rc |= kvc_obj_put(obj, "remote_handshake_port",
                          json_object_new_int64(p->remote.handshake_port));
        rc |= kvc_obj_put(obj, "remote_notify_port",
                          json_object_new_int64(p->remote.notify_port));
    }
    if (p->num_remote_hosts > 0) {
        rc |= kvc_obj_put(obj, "remote_hosts", kvc_json_hosts(p));
    }
    if (c->tp_size != 0 || p->remote_tp_size != 0) {
        rc |= kvc_obj_put(obj, "remote_tp_size",
                          json_object_new_int64(c->tp_size != 0
                                                    ? c->tp_size
                                                    : p->remote_tp_size));
    }
    if (p->remote_dp_size != 0) {
        rc |= kvc_obj_put(obj, "remote_dp_size",
                          json_object_new_int64(p->remote_dp_size));
    }
    if (c->has_dp_rank) {
        rc |= kvc_obj_put(obj, "remote_dp_rank",
                          json_object_new_int64(p->remote_dp_rank));
    }
    return rc;
}

static kvx_status_t kvc_build_decode_string(const kvc_params_ctx_t *c,
                                            const char *transfer_id,
                                            char **out_p)
{
    json_object *obj = json_object_new_object();
    char        *s   = NULL;

    if (obj != NULL && kvc_build_decode_obj(obj, c, transfer_id) == 0) {
        s = strdup(json_object_to_json_string_ext(
            obj, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    }
    json_object_put(obj);
    if (s == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY,
                         "decode kv_transfer_params: out of memory");
    }
    *out_p = s;
    return KVX_OK;
}

kvx_status_t kvc_params_build_decode(const char *prefill_response_json,
                                     const char *transfer_id, char **out_p)
{
    kvc_xfer_params_t p;
    kvc_params_ctx_t  ctx = {.p = &p};
    kvx_status_t      st;

    memset(&p, 0, sizeof(p));
    if (transfer_id != NULL && strlen(transfer_id) >= KVX_ID_MAX) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "transfer_id: length %zu: must be below %d",
                         strlen(transfer_id), KVX_ID_MAX);
    }
    st = kvc_params_decode(prefill_response_json, &ctx, 1);
    if (st != KVX_OK) {
        return st;
    }
    st = kvc_build_decode_string(
        &ctx,
        transfer_id != NULL && transfer_id[0] != '\0' ? transfer_id
                                                      : p.transfer_id,
        out_p);
    kvc_params_fini(&p);
    return st;
}

/* kvc_replay_forget: slot i's sender leaves the table; its newest stamp
 * (or its own floor, if higher) becomes its floor entry: a free entry, else
 * the lowest of its host's once that host holds KVC_REPLAY_FLOORS_PER_HOST,
 * else the lowest of all. */
static void kvc_replay_forget(kvc_replay_t *r, uint32_t i)
{
    uint64_t top = r->s[i].floor;
    uint32_t low = 0, low_host = 0, nhost = 0, j;

    for (uint32_t k = 0; k < r->s[i].n; k++) {
        top = r->s[i].seen[k] > top ? r->s[i].seen[k] : top;
    }
    for (j = 0; j < KVC_REPLAY_FLOORS; j++) {
        if (r->f[j].floor < r->f[low].floor) {
            low = j;
        }
        if (r->f[j].floor != 0 && r->f[j].host == r->s[i].host &&
            (nhost++ == 0 || r->f[j].floor < r->f[low_host].floor)) {
            low_host = j;
        }
    }
    j = nhost >= KVC_REPLAY_FLOORS_PER_HOST ? low_host : low;
    r->f[j].host  = r->s[i].host;
    r->f[j].inst  = r->s[i].inst;
    r->f[j].floor = top;
}

const char *kvc_replay_check(kvc_replay_t *r, uint64_t host, uint64_t inst,
                             uint64_t nonce, uint64_t now, unsigned shift,
                             uint64_t window_us)
{
    uint64_t d   = nonce > now ? nonce - now : now - nonce;
    uint32_t i, j = KVC_REPLAY_FLOORS, lru = 0, lru_host = 0, nhost = 0,
             low = 0;
    uint64_t floor = 0;

    if ((d >> shift) > window_us) {
        return nonce > now ? "stamped in the future (clocks further apart "
                             "than the window)"
                           : "too old (sent before the replay window)";
    }
    for (i = 0; i < KVC_REPLAY_SENDERS; i++) {
        if (r->s[i].last_heard != 0 && r->s[i].host == host &&
            r->s[i].inst == inst) {
            break;
        }
        if (r->s[i].last_heard < r->s[lru].last_heard) {
            lru = i;
        }
        if (r->s[i].last_heard != 0 && r->s[i].host == host &&
            (nhost++ == 0 ||
             r->s[i].last_heard < r->s[lru_host].last_heard)) {
            lru_host = i;
        }
    }
    if (i < KVC_REPLAY_SENDERS) {
        floor = r->s[i].floor;
    } else { /* a new sender, or a forgotten one: its floor, if kept */
        for (j = 0; j < KVC_REPLAY_FLOORS; j++) {
            if (r->f[j].floor != 0 && r->f[j].host == host &&
                r->f[j].inst == inst) {
                floor = r->f[j].floor;
                break;
            }
        }
    }
    if (nonce <= floor) {
        return "not newer than this sender's last message before it was "
               "forgotten (a replay, or reordered that far)";
    }
    if (i == KVC_REPLAY_SENDERS) {
        if (j < KVC_REPLAY_FLOORS) {
            /* Back in a slot, which keeps it (freed first: forgetting the
             * slot's sender below may take this entry). */
            r->f[j].floor = 0;
        }
        i = nhost >= KVC_REPLAY_PER_HOST ? lru_host : lru;
        if (r->s[i].last_heard != 0) {
            kvc_replay_forget(r, i);
        }
        memset(&r->s[i], 0, sizeof(r->s[i]));
        r->s[i].host  = host;
        r->s[i].inst  = inst;
        r->s[i].floor = floor;
    }
    for (uint32_t k = 0; k < r->s[i].n; k++) {
        if (r->s[i].seen[k] == nonce) {
            return "a replay (this sender's nonce was taken before)";
        }
        if (r->s[i].seen[k] < r->s[i].seen[low]) {
            low = k;
        }
    }
    if (r->s[i].n == KVC_REPLAY_DEPTH) {
        if (nonce < r->s[i].seen[low]) {
            return "older than the last messages taken from its sender";
        }
        r->s[i].seen[low] = nonce;
    } else {
        r->s[i].seen[r->s[i].n++] = nonce;
    }
    r->s[i].last_heard = ++r->heard;
    return NULL;
}
