/*
 * attack.c - a hostile process against a running kvxfer engine's control
 * plane (tests/security/run_security.sh). It has its own nng and UCP code
 * and no kvxfer code but SipHash-2-4 (plugin/common/siphash.c, a public
 * algorithm, for the authenticator of the data-plane protocol): what anyone
 * who can reach the ports could run. Each command
 * tries one attack and exits 0 only when the engine refused it the way it
 * must; it prints one line saying what happened.
 *
 *   attack wait    HOST PORT SECS        the port accepts TCP (deadline)
 *   attack forge   SRC HOST HSPORT NPORT handshake request and forged
 *                                        release/write_done/remote_blocks
 *                                        from source address SRC: each
 *                                        answered {"ok":false,...}, no
 *                                        metadata
 *   attack plain   HOST PORT             plain TCP to a TLS port: no answer
 *   attack tlsid   HOST PORT CERT KEY CA NAME
 *                                        TLS with this certificate: no answer
 *   attack stall   HOST PORT N SECS      raw SP connection, N requests,
 *                                        never reads; held SECS seconds
 *   attack big     HOST PORT MIB         one MIB-MiB message: no answer (the
 *                                        connection is dropped)
 *   attack fetch   HOST PORT FILE        an engine's metadata into FILE
 *   attack respond HOST PORT MODE SECS FILE
 *                                        fake handshake responder for SECS:
 *                                        the metadata in FILE altered by
 *                                        MODE (fake_meta)
 *   attack rma     FILE SECS             UCX's software RMA against every
 *                                        worker address in the metadata in
 *                                        FILE, from a tcp-only UCP worker
 *                                        of its own: a get of layer 0 that
 *                                        completes was served (exit 1)
 *   attack amput   FILE TRANSFER SECS    kvxfer's own data-plane protocol
 *                                        (active-message puts, the wire
 *                                        format below) authenticated with
 *                                        the session the engine gave THIS
 *                                        host in FILE (its metadata, from
 *                                        attack fetch): 16
 *                                        bytes at the start of every block
 *                                        of layer 0 for TRANSFER's tag, a
 *                                        put each, then the same (at most
 *                                        16 blocks) as one several-run put
 *                                        (PUTV), then a malformed PUTV.
 *                                        Exit 0: none served and at least
 *                                        one refused as bound to another
 *                                        peer; 1: one was served; 3: the
 *                                        malformed PUTV was not refused as
 *                                        out of bounds; 2: else
 *   attack notice  FILE TRANSFER FROM TP RANK
 *                                        a READ release notice (the wire
 *                                        format below) for TRANSFER,
 *                                        claiming to come from FROM
 *                                        ("ip:port") as rank RANK of TP,
 *                                        with the session in FILE: exit 0
 *                                        once it left; the engine's
 *                                        counters say what it did
 *   attack blocks  FILE TRANSFER REQ FROM IDS
 *                                        a WRITE remote_blocks (the
 *                                        data-plane control message, wire
 *                                        format below) for TRANSFER of
 *                                        request REQ naming D's block ids
 *                                        IDS ("3,8,1"), claiming to come
 *                                        from FROM ("ip:port"), its mac
 *                                        under the session in FILE: exit 0
 *                                        once it left; the engine's
 *                                        counters say what it did
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <json-c/json.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "siphash.h"

#define NO_REPLY_MS 2000

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int tcp_connect(const char *host, int port)
{
    struct sockaddr_in sa;
    int                fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port   = htons((uint16_t)port);
    if (fd < 0 || inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int err = errno;

        if (fd >= 0) {
            close(fd);
        }
        errno = err; /* the caller tells a refusal from other failures */
        return -1;
    }
    return fd;
}

/* req_open: a REQ socket dialled (blocking, deadline) at url, with TLS when
 * tls is non-NULL. */
/* sock_drop: this one-shot tool leaves its sockets to the process exit.
 * libnng 1.5.2's nng_close can hang for ever when a connection it closes is
 * completing a read (nng PR #1636; kvxfer works around it in kvn.c): seen
 * here in `big` (15 iterations of the 9 MiB message, reaper and nng_close
 * stuck). */
static void sock_drop(nng_socket s)
{
    (void)s;
}

static int req_open(const char *url, nng_tls_config *tls, nng_socket *s)
{
    nng_dialer d;
    int        rv;

    if ((rv = nng_req0_open(s)) != 0) {
        return rv;
    }
    nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, NO_REPLY_MS);
    nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, NO_REPLY_MS);
    nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if ((rv = nng_dialer_create(&d, *s, url)) != 0) {
        return rv;
    }
    if (tls != NULL && (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG,
                                                tls)) != 0) {
        return rv;
    }
    return nng_dialer_start(d, NNG_FLAG_NONBLOCK);
}

/* request: one round trip; the reply (NUL-terminated, malloc'd) or NULL. */
static char *request(nng_socket s, const char *msg, size_t len, int *rv_p)
{
    char  *buf = NULL;
    size_t n   = 0;
    char  *out;

    if ((*rv_p = nng_send(s, (void *)msg, len, 0)) != 0 ||
        (*rv_p = nng_recv(s, &buf, &n, NNG_FLAG_ALLOC)) != 0) {
        return NULL;
    }
    out = malloc(n + 1);
    memcpy(out, buf, n);
    out[n] = '\0';
    nng_free(buf, n);
    return out;
}

static int cmd_wait(char **a)
{
    double end = now_s() + atof(a[2]);

    while (now_s() < end) {
        int fd = tcp_connect(a[0], atoi(a[1]));

        if (fd >= 0) {
            close(fd);
            return 0;
        }
        poll(NULL, 0, 20);
    }
    printf("wait: %s:%s not listening after %s s\n", a[0], a[1], a[2]);
    return 1;
}

/* refused: a reply that is an error naming no metadata. */
static int refused(const char *what, const char *reply, int rv)
{
    if (reply == NULL) {
        printf("forge %s: no reply (%s): FAIL, expected a refusal\n", what,
               nng_strerror(rv));
        return 1;
    }
    if (strstr(reply, "\"ok\":false") == NULL ||
        strstr(reply, "worker_addr") != NULL) {
        printf("forge %s: answered '%.120s': FAIL\n", what, reply);
        return 1;
    }
    printf("forge %s: refused (%.80s)\n", what, reply);
    return 0;
}

static int cmd_forge(char **a)
{
    static const char *msgs[] = {
        "{\"type\":\"release\",\"transfer_id\":\"tx-forged\"}",
        "{\"type\":\"write_done\",\"transfer_id\":\"tx-forged\"}",
        "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-forged\","
        "\"block_ids\":[0,1,2]}",
        "tx-forged",
    };
    const char *hs = "{\"type\":\"get_meta\",\"version\":1}";
    char        url[256];
    nng_socket  s;
    int         bad = 0, rv;
    char       *r;

    snprintf(url, sizeof(url), "tcp://%s;%s:%s", a[0], a[1], a[2]);
    if ((rv = req_open(url, NULL, &s)) != 0) {
        printf("forge: dial %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    r    = request(s, hs, strlen(hs), &rv);
    bad |= refused("get_meta", r, rv);
    free(r);
    sock_drop(s);
    snprintf(url, sizeof(url), "tcp://%s;%s:%s", a[0], a[1], a[3]);
    if ((rv = req_open(url, NULL, &s)) != 0) {
        printf("forge: dial %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
        r    = request(s, msgs[i], strlen(msgs[i]), &rv);
        bad |= refused(msgs[i], r, rv);
        free(r);
    }
    sock_drop(s);
    return bad;
}

/* no_answer: a request over url (TLS with tls) must get nothing back. */
static int no_answer(const char *what, const char *url, nng_tls_config *tls)
{
    const char *hs = "{\"type\":\"get_meta\",\"version\":1}";
    nng_socket  s;
    int         rv;
    char       *r;

    if ((rv = req_open(url, tls, &s)) != 0) {
        printf("%s: dial %s: %s\n", what, url, nng_strerror(rv));
        return 1;
    }
    r = request(s, hs, strlen(hs), &rv);
    sock_drop(s);
    if (r != NULL) {
        printf("%s: answered '%.120s': FAIL\n", what, r);
        free(r);
        return 1;
    }
    printf("%s: no answer within %d ms (%s)\n", what, NO_REPLY_MS,
           nng_strerror(rv));
    return 0;
}

static int cmd_plain(char **a)
{
    char url[256];

    snprintf(url, sizeof(url), "tcp://%s:%s", a[0], a[1]);
    return no_answer("plain", url, NULL);
}

static char *read_file(const char *path)
{
    FILE  *f   = fopen(path, "rb");
    char  *buf = calloc(1, 1 << 20);
    size_t n;

    if (f == NULL || buf == NULL) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int cmd_tlsid(char **a)
{
    nng_tls_config *tls;
    char            url[256];
    char           *cert = read_file(a[2]), *key = read_file(a[3]);
    int             rc;

    if (nng_tls_config_alloc(&tls, NNG_TLS_MODE_CLIENT) != 0 ||
        nng_tls_config_own_cert(tls, cert, key, NULL) != 0 ||
        nng_tls_config_ca_file(tls, a[4]) != 0 ||
        nng_tls_config_server_name(tls, a[5]) != 0) {
        printf("tlsid: TLS configuration failed\n");
        return 1;
    }
    snprintf(url, sizeof(url), "tls+tcp://%s:%s", a[0], a[1]);
    rc = no_answer("tlsid", url, tls);
    nng_tls_config_free(tls);
    free(cert);
    free(key);
    return rc;
}

/* sp_frame appends one SP/TCP message (8-byte length, REQ request id,
 * body) to buf. */
static size_t sp_frame(uint8_t *buf, uint32_t id, const char *body)
{
    size_t   blen = strlen(body), n = 4 + blen;
    uint32_t rid  = htonl(0x80000000u | id);

    for (int i = 0; i < 8; i++) {
        buf[i] = (uint8_t)(n >> (56 - 8 * i));
    }
    memcpy(buf + 8, &rid, 4);
    memcpy(buf + 12, body, blen);
    return 12 + blen;
}

/* stall_once: one raw SP connection that sends n handshake requests and
 * never reads a reply; 0 when the engine dropped it within hold_s, 2 when
 * the connection was refused, or closed or reset before the engine's SP
 * header came (an engine shutting down resets its listener's queued
 * connections), 1
 * otherwise (no header within hold_s is a stalled accept path: a
 * failure). */
static int stall_once(const char *host, int port, int n, double hold_s)
{
    static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
    const char          *hs     = "{\"type\":\"get_meta\",\"version\":1}";
    int                  fd     = tcp_connect(host, port);
    int                  cerr   = errno; /* before anything else sets it */
    double               t0     = now_s();
    double               end    = t0 + hold_s;
    uint8_t              peer[8], msg[256];
    int                  rcvbuf = 4096, i;
    ssize_t              got    = -1;
    double               tw;
    struct timeval       tv     = {.tv_sec = (time_t)hold_s};
    struct pollfd        pfd;

    if (fd < 0) {
        /* Refused: the engine's process may have finished since the
         * caller's probe; the caller decides with listener_gone. */
        int refused = cerr == ECONNREFUSED;

        printf("stall: cannot connect (%s)\n", strerror(cerr));
        return refused ? 2 : 1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (write(fd, hdr, 8) != 8 || (got = read(fd, peer, 8)) != 8) {
        int closed = got == 0 ||
                     (got < 0 && (errno == ECONNRESET || errno == EPIPE));

        printf("stall: SP header exchange failed (%s)\n",
               got == 0 ? "closed" : got > 0 ? "short read" : strerror(errno));
        close(fd);
        return closed ? 2 : 1;
    }
    /* From here on nothing is read: the replies pile up in the engine. */
    for (i = 0; i < n && now_s() < end; i++) {
        size_t len = sp_frame(msg, (uint32_t)i + 1, hs);

        if (write(fd, msg, len) != (ssize_t)len) {
            break;
        }
    }
    tw         = now_s() - t0;
    pfd.fd     = fd;
    pfd.events = POLLRDHUP;
    while (now_s() < end) {
        if (poll(&pfd, 1, 50) == 1 &&
            (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
            printf("stall: %d requests sent in %.2f s, dropped after "
                   "%.2f s\n", i, tw, now_s() - t0);
            close(fd);
            return 0;
        }
    }
    printf("stall: connection (%d requests sent in %.2f s, none read) "
           "still held after %.1f s: FAIL\n", i, tw, hold_s);
    close(fd);
    return 1;
}

/* listener_gone: 1 when connecting to host:port is refused within 10 s. */
static int listener_gone(const char *host, int port)
{
    double end = now_s() + 10.0;

    while (now_s() < end) {
        int fd = tcp_connect(host, port);

        if (fd < 0) {
            return errno == ECONNREFUSED;
        }
        close(fd);
        poll(NULL, 0, 50); /* polls the condition; bounded by end */
    }
    return 0;
}

/* cmd_stall: stalled connections one after another for SECS seconds (so
 * one is always parked while the legitimate transfer runs); each must be
 * dropped within 5 s. The engine's process may finish meanwhile (D released
 * it): a connection it refuses, or one it closes unanswered while its
 * listener goes away, ends the attack after at least one drop. */
static int cmd_stall(char **a)
{
    double end   = now_s() + atof(a[3]);
    int    drops = 0;

    while (now_s() < end) {
        int fd = tcp_connect(a[0], atoi(a[1]));

        if (fd < 0 && drops > 0) {
            break; /* the engine's process finished meanwhile */
        }
        if (fd >= 0) {
            close(fd);
        }
        int rc = stall_once(a[0], atoi(a[1]), atoi(a[2]), 5.0);

        if (rc == 2 && drops > 0 && listener_gone(a[0], atoi(a[1]))) {
            printf("stall: the engine closed its listener\n");
            break;
        }
        if (rc != 0) {
            return 1;
        }
        drops++;
    }
    printf("stall: %d stalled connections, each dropped by the engine\n",
           drops);
    return drops > 0 ? 0 : 1;
}

static int cmd_big(char **a)
{
    size_t len = (size_t)atoi(a[2]) << 20;
    char  *buf = malloc(len);
    char   url[256];
    int    rc;

    memset(buf, ' ', len);
    buf[0] = '{';
    buf[len - 1] = '}';
    snprintf(url, sizeof(url), "tcp://%s:%s", a[0], a[1]);
    {
        nng_socket s;
        int        rv;
        char      *r;

        if ((rv = req_open(url, NULL, &s)) != 0) {
            printf("big: dial: %s\n", nng_strerror(rv));
            return 1;
        }
        r = request(s, buf, len, &rv);
        sock_drop(s);
        rc = r != NULL;
        printf("big: %zu-byte message: %s\n", len,
               r != NULL ? "answered: FAIL" : "no answer (dropped)");
        free(r);
    }
    free(buf);
    return rc;
}

/* cmd_fetch: a real engine's handshake metadata into a file (as a peer
 * would get it). */
static int cmd_fetch(char **a)
{
    const char *hs = "{\"type\":\"get_meta\",\"version\":1}";
    char        url[256];
    nng_socket  s;
    FILE       *f;
    char       *r;
    int         rv;

    snprintf(url, sizeof(url), "tcp://%s:%s", a[0], a[1]);
    if ((rv = req_open(url, NULL, &s)) != 0 ||
        (r = request(s, hs, strlen(hs), &rv)) == NULL) {
        printf("fetch: %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    sock_drop(s);
    f = fopen(a[2], "w");
    if (f == NULL || fputs(r, f) < 0 || fclose(f) != 0) {
        printf("fetch: cannot write %s\n", a[2]);
        return 1;
    }
    free(r);
    return 0;
}

/* fake_meta: a real engine's metadata (from file) turned into a lie: other_engine serves it as is (it names the real
 * engine, not the one dialled); the bad_* modes claim to be the responder
 * but carry a worker address (bad_addr) or rkey (bad_rkey) far too long,
 * or a layer whose blocks do not fit its length (bad_layer). */
static char *fake_meta(const char *host, int port, const char *mode,
                       const char *file)
{
    char         id[300];
    json_object *o, *layer;
    char        *out, *blob;

    if ((o = json_object_from_file(file)) == NULL) {
        printf("respond: cannot read metadata from %s\n", file);
        exit(1);
    }
    if (strcmp(mode, "other_engine") != 0) {
        snprintf(id, sizeof(id), "%s:%d", host, port);
        json_object_object_add(o, "engine_id", json_object_new_string(id));
        json_object_object_add(o, "handshake_port", json_object_new_int(port));
    }
    blob = calloc(1, 400001);
    memset(blob, 'A', 400000);
    layer = json_object_array_get_idx(json_object_object_get(o, "layers"), 0);
    if (strcmp(mode, "bad_addr") == 0) {
        json_object_object_add(o, "worker_addr", json_object_new_string(blob));
    } else if (strcmp(mode, "bad_rkey") == 0) {
        blob[40000] = '\0';
        json_object_object_add(layer, "rkey", json_object_new_string(blob));
    } else if (strcmp(mode, "bad_layer") == 0) {
        json_object_object_add(layer, "length",
                               json_object_new_string("4096"));
    }
    free(blob);
    out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return out;
}

static int cmd_respond(char **a)
{
    char       url[256];
    char      *meta = fake_meta(a[0], atoi(a[1]), a[2], a[4]);
    double     end  = now_s() + atof(a[3]);
    nng_socket s;
    int        served = 0;

    snprintf(url, sizeof(url), "tcp://%s:%s", a[0], a[1]);
    if (nng_rep0_open(&s) != 0 || nng_listen(s, url, NULL, 0) != 0) {
        printf("respond: cannot listen on %s\n", url);
        return 1;
    }
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 100);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 1 << 20);
    printf("respond: serving %s metadata on %s\n", a[2], url);
    fflush(stdout);
    while (now_s() < end) {
        char  *buf;
        size_t n;

        if (nng_recv(s, &buf, &n, NNG_FLAG_ALLOC) == 0) {
            nng_free(buf, n);
            nng_send(s, meta, strlen(meta), 0);
            served++;
        }
    }
    printf("respond: %s metadata served %d times\n", a[2], served);
    sock_drop(s);
    free(meta);
    return 0;
}

/* b64_decode: standard base64 (what the metadata carries); NULL when
 * malformed. */
static uint8_t *b64_decode(const char *in, size_t *len_p)
{
    size_t   n = strlen(in), o = 0;
    uint8_t *out = malloc(n / 4 * 3 + 3);
    uint32_t acc = 0;
    int      bits = 0;

    for (size_t i = 0; out != NULL && i < n && in[i] != '='; i++) {
        const char *t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                        "0123456789+/";
        const char *c = strchr(t, in[i]);

        if (c == NULL || in[i] == '\0') {
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)(c - t);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    *len_p = o;
    return out;
}

/* tcp_worker: a UCP context (tcp only, features) and its one worker. */
static int tcp_worker(uint64_t features, ucp_context_h *ucp, ucp_worker_h *wk)
{
    ucp_config_t       *cfg;
    ucp_params_t        prm;
    ucp_worker_params_t wp;
    int                 ok;

    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) {
        return -1;
    }
    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features   = features;
    ok = ucp_config_modify(cfg, "TLS", "tcp") == UCS_OK &&
         ucp_init(&prm, cfg, ucp) == UCS_OK;
    ucp_config_release(cfg);
    if (!ok) {
        return -1;
    }
    memset(&wp, 0, sizeof(wp));
    wp.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    return ucp_worker_create(*ucp, &wp, wk) == UCS_OK ? 0 : -1;
}

/* ep_to: a UCP endpoint from wk to the worker address addr (peer error
 * handling, as kvxfer's own). */
static ucs_status_t ep_to(ucp_worker_h wk, const void *addr, ucp_ep_h *ep)
{
    ucp_ep_params_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                     UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    prm.address    = (const ucp_address_t *)addr;
    prm.err_mode   = UCP_ERR_HANDLING_MODE_PEER;
    return ucp_ep_create(wk, &prm, ep);
}

/* Bytes of kvxfer's published worker-address header (kvu.c kvu_addr_hdr_t,
 * protocol 10 and later: magic, version, count, UCX version, FIFO
 * geometry) before its entries. */
#define WA_HDR 24

/* rma_try: one UCP endpoint from wk to addr, a get of 4096 bytes at base
 * with the packed rkey, progressed for secs: 1 when it completed (served),
 * 0 when it did not or no endpoint could be made (*reached says which). */
static int rma_try(ucp_worker_h wk, const void *addr, const void *rkey,
                   uint64_t base, double secs, int *reached)
{
    static uint8_t      buf[4096];
    ucp_request_param_t rp;
    ucp_ep_h            ep;
    ucp_rkey_h          rk;
    ucs_status_ptr_t    get, cl;
    ucs_status_t        st = UCS_INPROGRESS;
    double              end = now_s() + secs;

    if (ep_to(wk, addr, &ep) != UCS_OK) {
        return 0;
    }
    (*reached)++;
    if (ucp_ep_rkey_unpack(ep, rkey, &rk) != UCS_OK) {
        printf("rma: rkey unpack failed\n");
        exit(2);
    }
    memset(&rp, 0, sizeof(rp));
    get = ucp_get_nbx(ep, buf, sizeof(buf), base, rk, &rp);
    while (UCS_PTR_IS_PTR(get) &&
           (st = ucp_request_check_status(get)) == UCS_INPROGRESS &&
           now_s() < end) {
        ucp_worker_progress(wk);
    }
    if (!UCS_PTR_IS_PTR(get)) {
        st = UCS_PTR_STATUS(get);
    }
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    cl = ucp_ep_close_nbx(ep, &rp);
    while (UCS_PTR_IS_PTR(cl) &&
           ucp_request_check_status(cl) == UCS_INPROGRESS &&
           now_s() < end + 5) {
        ucp_worker_progress(wk);
    }
    if (UCS_PTR_IS_PTR(get)) {
        ucp_request_free(get);
    }
    if (UCS_PTR_IS_PTR(cl)) {
        ucp_request_free(cl);
    }
    ucp_rkey_destroy(rk);
    return st == UCS_OK;
}

static int cmd_rma(char **a)
{
    json_object        *o = json_object_from_file(a[0]), *layer, *v;
    ucp_context_h       ucp;
    ucp_worker_h        wk;
    uint8_t            *addr, *rkey;
    size_t              alen, rlen, off = WA_HDR;
    uint32_t            magic;
    uint16_t            n;
    uint64_t            base;
    int                 served = 0, reached = 0;

    layer = o ? json_object_array_get_idx(json_object_object_get(o, "layers"),
                                          0)
              : NULL;
    if (layer == NULL || !json_object_object_get_ex(o, "worker_addr", &v) ||
        !json_object_is_type(v, json_type_string) ||
        (addr = b64_decode(json_object_get_string(v), &alen)) == NULL ||
        !json_object_object_get_ex(layer, "rkey", &v) ||
        !json_object_is_type(v, json_type_string) ||
        (rkey = b64_decode(json_object_get_string(v), &rlen)) == NULL ||
        !json_object_object_get_ex(layer, "base", &v) || alen < WA_HDR) {
        printf("rma: no worker address, layer 0 rkey and base in %s\n", a[0]);
        return 2;
    }
    base = strtoull(json_object_get_string(v), NULL, 10);
    memcpy(&magic, addr, 4); /* kvxfer's list of UCP addresses */
    memcpy(&n, addr + 6, 2);
    if (magic != 0x4157564bu || n < 1 || n > 8) {
        printf("rma: worker address is not a kvxfer address list\n");
        return 2;
    }
    if (tcp_worker(UCP_FEATURE_RMA | UCP_FEATURE_AM, &ucp, &wk) != 0) {
        return 2;
    }
    for (uint16_t i = 0; i < n; i++) {
        uint32_t len;

        if (alen - off < 4) {
            break;
        }
        memcpy(&len, addr + off, 4);
        len &= 0x3fffffffu; /* the top two bits are flags */
        off += 4;
        if (len > alen - off) {
            break;
        }
        served += rma_try(wk, addr + off, rkey, base, atof(a[1]), &reached);
        off += len;
    }
    ucp_worker_destroy(wk);
    ucp_cleanup(ucp);
    free(addr);
    free(rkey);
    json_object_put(o);
    printf("rma: %u worker addresses, %d reachable over tcp, %d served a "
           "get of layer 0 at 0x%llx\n", (unsigned)n, reached, served,
           (unsigned long long)base);
    return served ? 1 : 0;
}

/* --- kvxfer's data-plane wire format (protocol 11), as a peer sees it ---
 * An AM put: id 0x4b3, this header, then the bytes; the target answers on
 * the reply endpoint with id 0x4b4 and the header, status set. A READ
 * release notice: id 0x4b6 (cmd_notice). A control message: id 0x4b7,
 * only len, nonce and mac set (cmd_blocks); no answer. */
#define AM_PUT    0x4b3
#define AM_PUTACK 0x4b4
#define AM_PUTV   0x4b8 /* addr = n entries {addr, len, nonce, mac}, len =
                           their bytes; data: the entries, then the bytes */
#define AM_MAGIC  0x4d41564bu
#define AM_PROTO  11
#define ST_WRONG_PEER  (-20) /* KVX_ERR_UNTRUSTED_PEER */
#define ST_OOB         (-42) /* KVX_ERR_OUT_OF_BOUNDS */
#define ST_NOT_EXPOSED (-46) /* KVX_ERR_NOT_EXPOSED */
typedef struct {
    uint32_t magic;
    uint16_t version, pad;
    int32_t  status;
    uint32_t pad2;
    uint64_t id, addr, len, token, nonce, tag, mac;
} am_hdr_t;

typedef struct {
    int     answered;
    int32_t status;
} am_ans_t;

static am_ans_t g_ans[4096];

static ucs_status_t am_ack_cb(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param)
{
    am_hdr_t h;

    (void)arg, (void)data, (void)len, (void)param;
    if (hlen == sizeof(h)) {
        memcpy(&h, header, sizeof(h));
        if (h.magic == AM_MAGIC && h.id < 4096) {
            g_ans[h.id].answered = 1;
            g_ans[h.id].status   = h.status;
        }
    }
    return UCS_OK;
}

/* u64_of: a decimal string member of o (0 when absent). */
static uint64_t u64_of(json_object *o, const char *key)
{
    json_object *v;

    return o != NULL && json_object_object_get_ex(o, key, &v)
               ? strtoull(json_object_get_string(v), NULL, 10)
               : 0;
}

/* next_wk_addr: the worker address at *off in a packed list of them
 * (kvxfer's worker_addr: 8 bytes of header, then per worker a 4-byte
 * length with 2 flag bits, then the address); advances *off. */
static int next_wk_addr(const uint8_t *addr, size_t alen, size_t *off,
                        const ucp_address_t **wa)
{
    uint32_t len;

    if (alen < *off || alen - *off < 4) {
        return -1;
    }
    memcpy(&len, addr + *off, 4);
    len &= 0x3fffffffu;
    *off += 4;
    if (len > alen - *off) {
        return -1;
    }
    *wa = (const ucp_address_t *)(addr + *off);
    *off += len;
    return 0;
}

/* ep_close_wait: close ep (flags), progressing wk for at most 5 s. */
static void ep_close_wait(ucp_worker_h wk, ucp_ep_h ep, uint32_t flags)
{
    ucp_request_param_t rp;
    ucs_status_ptr_t    cl;
    double              end = now_s() + 5;

    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags        = flags;
    cl              = ucp_ep_close_nbx(ep, &rp);
    while (UCS_PTR_IS_PTR(cl) &&
           ucp_request_check_status(cl) == UCS_INPROGRESS && now_s() < end) {
        ucp_worker_progress(wk);
    }
    if (UCS_PTR_IS_PTR(cl)) {
        ucp_request_free(cl);
    }
}

static int cmd_amput(char **a)
{
    json_object        *o = json_object_from_file(a[0]), *layer, *v, *geom;
    ucp_am_handler_param_t hp;
    ucp_context_h       ucp;
    ucp_worker_h        wk;
    uint8_t            *addr, *rkey, junk[16];
    size_t              alen, rlen, off = WA_HDR;
    uint64_t            base, stride, nb, token, tag = kvc_xfer_tag(a[1]);
    uint64_t            session;
    uint16_t            n;
    int                 sent = 0, served = 0, wrong = 0, oob = 0, nexp = 0,
                        other = 0, silent = 0, putv[2] = {-1, -1};
    double              secs = atof(a[2]);

    layer = o ? json_object_array_get_idx(json_object_object_get(o, "layers"),
                                          0)
              : NULL;
    geom = layer ? json_object_object_get(layer, "geom") : NULL;
    if (layer == NULL || geom == NULL ||
        !json_object_object_get_ex(o, "worker_addr", &v) ||
        (addr = b64_decode(json_object_get_string(v), &alen)) == NULL ||
        !json_object_object_get_ex(layer, "rkey", &v) ||
        (rkey = b64_decode(json_object_get_string(v), &rlen)) == NULL ||
        alen < WA_HDR || rlen < 16) {
        printf("amput: no worker address, layer 0 rkey and geom in %s\n",
               a[0]);
        return 2;
    }
    base    = u64_of(layer, "base");
    nb      = u64_of(geom, "num_blocks");
    stride  = u64_of(geom, "block_stride");
    stride  = stride ? stride : u64_of(geom, "block_len");
    session = u64_of(o, "session");
    memcpy(&token, rkey + rlen - 16, 8); /* packed rkey, token, trailer */
    memcpy(&n, addr + 6, 2);
    if (nb == 0 || nb > 4096 || n < 1 || n > 8) {
        printf("amput: layer 0 has %llu blocks, %u worker addresses\n",
               (unsigned long long)nb, (unsigned)n);
        return 2;
    }
    memset(junk, 0xA5, sizeof(junk));
    if (tcp_worker(UCP_FEATURE_AM, &ucp, &wk) != 0) {
        return 2;
    }
    memset(&hp, 0, sizeof(hp));
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id         = AM_PUTACK;
    hp.cb         = am_ack_cb;
    hp.arg        = NULL;
    if (ucp_worker_set_am_recv_handler(wk, &hp) != UCS_OK) {
        return 2;
    }
    for (uint16_t i = 0; i < n && sent == 0; i++) {
        ucp_request_param_t rp;
        ucp_ep_h            ep;
        const ucp_address_t *wa;
        double              end;
        void               *reqs[66];
        am_hdr_t            hdrs[66];
        static uint64_t     vbuf[2][16 * 4 + 16 * 2]; /* entries + bytes */

        if (next_wk_addr(addr, alen, &off, &wa) != 0) {
            break;
        }
        if (ep_to(wk, wa, &ep) != UCS_OK) {
            continue;
        }
        /* One put per block (at most 64), each its own header. */
        for (uint64_t b = 0; b < nb && b < 64; b++) {
            am_hdr_t *h = &hdrs[b];

            memset(h, 0, sizeof(*h));
            h->magic   = AM_MAGIC;
            h->version = AM_PROTO;
            h->id      = b;
            h->addr    = base + b * stride;
            h->len     = sizeof(junk);
            h->token   = token;
            h->nonce   = 0x1234 + b;
            h->tag     = tag;
            h->mac     = kvc_req_mac(session, tag, h->nonce, h->addr,
                                     h->len, 1);
            memset(&rp, 0, sizeof(rp));
            rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            rp.flags        = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
            reqs[b] = ucp_am_send_nbx(ep, AM_PUT, h, sizeof(*h), junk,
                                      sizeof(junk), &rp);
            sent++;
        }
        /* Phase 0 waits for the puts' answers; phase 1 sends the blocks
         * they found inside the transfer (served, or refused as bound to
         * another peer; at most 16) as one PUTV, each entry under its own
         * mac, then a malformed PUTV (3 entries named, 2 carried), and
         * waits for those. */
        for (int phase = 0; phase < 2; phase++) {
            int nput = sent;

            for (int v = 0; phase == 1 && v < 2; v++) {
                am_hdr_t *h = &hdrs[sent];
                uint64_t *e = vbuf[v];
                uint64_t  k = 0;

                for (int b = 0; b < nput && k < 16; b++) {
                    if (v == 1 ? k < 2
                               : g_ans[b].answered &&
                                     (g_ans[b].status == 0 ||
                                      g_ans[b].status == ST_WRONG_PEER)) {
                        e[4 * k]     = hdrs[b].addr;
                        e[4 * k + 1] = sizeof(junk);
                        e[4 * k + 2] = 0x5678 + k;
                        e[4 * k + 3] = kvc_req_mac(session, tag, e[4 * k + 2],
                                                   e[4 * k], sizeof(junk), 1);
                        k++;
                    }
                }
                if (k == 0) {
                    continue;
                }
                for (uint64_t j = 0; j < k; j++) {
                    memcpy((uint8_t *)(e + 4 * k) + j * sizeof(junk), junk,
                           sizeof(junk));
                }
                memset(h, 0, sizeof(*h));
                h->magic   = AM_MAGIC;
                h->version = AM_PROTO;
                h->id      = (uint64_t)sent;
                h->addr    = v == 0 ? k : 3;
                h->len     = (v == 0 ? k : 3) * sizeof(junk);
                h->token   = token;
                h->nonce   = 0x9999 + (uint64_t)v;
                h->tag     = tag;
                memset(&rp, 0, sizeof(rp));
                rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                rp.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
                reqs[sent] = ucp_am_send_nbx(ep, AM_PUTV, h, sizeof(*h), e,
                                             k * (32 + sizeof(junk)), &rp);
                putv[v] = sent++;
            }
            end = now_s() + secs;
            for (;;) {
                int left = 0;

                for (int b = 0; b < sent; b++) {
                    left += !g_ans[b].answered;
                }
                if (left == 0 || now_s() >= end) {
                    break;
                }
                ucp_worker_progress(wk);
            }
        }
        for (int b = 0; b < sent; b++) {
            if (UCS_PTR_IS_PTR(reqs[b])) {
                ucp_request_cancel(wk, reqs[b]);
                ucp_request_free(reqs[b]);
            }
        }
        ep_close_wait(wk, ep, UCP_EP_CLOSE_FLAG_FORCE);
    }
    for (int b = 0; b < sent; b++) {
        int32_t st = g_ans[b].status;

        silent += !g_ans[b].answered;
        served += g_ans[b].answered && st == 0;
        wrong += g_ans[b].answered && st == ST_WRONG_PEER;
        oob += g_ans[b].answered && st == ST_OOB;
        nexp += g_ans[b].answered && st == ST_NOT_EXPOSED;
        other += g_ans[b].answered && st != 0 && st != ST_WRONG_PEER &&
                 st != ST_OOB && st != ST_NOT_EXPOSED;
    }
    ucp_worker_destroy(wk);
    ucp_cleanup(ucp);
    free(addr);
    free(rkey);
    json_object_put(o);
    printf("amput: %d puts with session %s: %d served, %d refused as bound "
           "to another peer, %d out of bounds, %d not exposed, %d other, %d "
           "unanswered\n", sent, session ? "given" : "none", served, wrong,
           oob, nexp, other, silent);
    for (int v = 0; v < 2; v++) {
        if (putv[v] >= 0) {
            printf("amput: %s several-run put (PUTV): %s, status %d\n",
                   v == 0 ? "a well-formed" : "a malformed",
                   g_ans[putv[v]].answered ? "answered" : "unanswered",
                   (int)g_ans[putv[v]].status);
        }
    }
    /* A malformed PUTV is refused whoever sends it (3: a failure for
     * every caller, whatever it expects of the well-formed puts). */
    if (putv[1] >= 0 && (!g_ans[putv[1]].answered ||
                         g_ans[putv[1]].status != ST_OOB)) {
        return 3;
    }
    return served ? 1 : wrong > 0 ? 0 : 2;
}

/* req_wait: progress wk until request r (from a *_nbx call) completes or
 * secs pass; frees it. UCS_OK when it completed without error. */
static ucs_status_t req_wait(ucp_worker_h wk, ucs_status_ptr_t r, double secs)
{
    double       end = now_s() + secs;
    ucs_status_t st;

    if (!UCS_PTR_IS_PTR(r)) {
        return UCS_PTR_STATUS(r);
    }
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           now_s() < end) {
        ucp_worker_progress(wk);
    }
    if (st == UCS_INPROGRESS) {
        ucp_request_cancel(wk, r);
    }
    ucp_request_free(r);
    return st;
}

/* am_to_engine: one eager active message `id` (header h, len bytes of
 * data) to the engine worker wa from a tcp-only UCP worker of our own,
 * then a flush; *sst and *fst their statuses. 0, or 2 when no worker or
 * endpoint could be made (`what` names the command in the message). */
static int am_to_engine(const char *what, const ucp_address_t *wa,
                        unsigned id, const am_hdr_t *h, const void *data,
                        size_t len, ucs_status_t *sst, ucs_status_t *fst)
{
    ucp_context_h       ucp;
    ucp_worker_h        wk;
    ucp_request_param_t rp;
    ucp_ep_h            ep;

    if (tcp_worker(UCP_FEATURE_AM, &ucp, &wk) != 0) {
        return 2;
    }
    if (ep_to(wk, wa, &ep) != UCS_OK) {
        printf("%s: no endpoint to the engine's worker\n", what);
        return 2;
    }
    memset(&rp, 0, sizeof(rp));
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags        = UCP_AM_SEND_FLAG_EAGER;
    *sst = req_wait(wk, ucp_am_send_nbx(ep, id, h, sizeof(*h), data, len,
                                        &rp), 10);
    memset(&rp, 0, sizeof(rp));
    *fst = req_wait(wk, ucp_ep_flush_nbx(ep, &rp), 10);
    ep_close_wait(wk, ep, 0);
    ucp_worker_destroy(wk);
    ucp_cleanup(ucp);
    return 0;
}

/* stamp_now: a fresh stamp, as an engine draws it (kvt_clock_t.stamp:
 * CLOCK_REALTIME microseconds << 12): P's replay guard takes it, so what
 * refuses a forgery is the check under test. */
static uint64_t stamp_now(void)
{
    struct timespec rt;

    clock_gettime(CLOCK_REALTIME, &rt);
    return ((uint64_t)rt.tv_sec * 1000000u + (uint64_t)rt.tv_nsec / 1000u)
               << 12 |
           0xfffu;
}

/* cmd_notice: a forged READ release notice (NOTICE, 0x4b6): the transfer id,
 * a NUL and the address FROM claims, tp size TP and rank RANK in the
 * instance field, authenticated with the session the engine's handshake
 * gave THIS host (FILE, from attack fetch). Sent to the engine's first
 * worker from a tcp-only UCP worker of its own. Exit 0 when the notice left
 * (send and flush completed), 2 otherwise: the verdict is the engine's
 * (run_netns.sh notice_thief watches its counters and its transfer). */
static int cmd_notice(char **a)
{
    json_object        *o = json_object_from_file(a[0]), *v;
    const ucp_address_t *wa;
    am_hdr_t            h;
    uint8_t            *addr;
    char                data[600];
    size_t              alen, off = WA_HDR;
    uint64_t            tag = kvc_xfer_tag(a[1]), session;
    ucs_status_t        sst, fst;
    int                 dlen;

    dlen = snprintf(data, sizeof(data), "%s%c%s", a[1], '\0', a[2]);
    if (o == NULL || !json_object_object_get_ex(o, "worker_addr", &v) ||
        (addr = b64_decode(json_object_get_string(v), &alen)) == NULL ||
        next_wk_addr(addr, alen, &off, &wa) != 0 || dlen < 0 ||
        dlen >= (int)sizeof(data)) {
        printf("notice: no worker address in %s (or ids too long)\n", a[0]);
        return 2;
    }
    session = u64_of(o, "session");
    memset(&h, 0, sizeof(h));
    h.magic   = AM_MAGIC;
    h.version = AM_PROTO;
    h.addr    = strtoull(a[3], NULL, 10) << 32 | strtoull(a[4], NULL, 10);
    h.nonce   = stamp_now(); /* fresh: the replay guard takes it */
    h.token   = 0x6174746b00000000ull | (uint64_t)getpid(); /* instance */
    h.tag     = tag;
    h.mac     = kvc_req_mac(session, tag, h.nonce, h.addr, h.token, 2);
    if (am_to_engine("notice", wa, 0x4b6, &h, data, (size_t)dlen, &sst,
                     &fst) != 0) {
        return 2;
    }
    free(addr);
    json_object_put(o);
    printf("notice: release of %s from \"%s\" (tp %s rank %s) with session "
           "%s: send %s, flush %s\n", a[1], a[2], a[3], a[4],
           session ? "given" : "none", ucs_status_string(sst),
           ucs_status_string(fst));
    return sst == UCS_OK && fst == UCS_OK ? 0 : 2;
}

/* blocks_json: the remote_blocks a WRITE D sends its P rank (encoded as
 * plugin/core/ctlmsg.c does, so that P decodes it and the refusal, if any,
 * is by P's checks, not by a parse error): TRANSFER of request REQ, decode
 * (and consumer) rank 0, the block ids in ids ("3,8,1"), an xfer_nonce of
 * the attacker's choosing; no instance (a D that never handshook P) and no
 * to_instance (any instance of P). NULL when ids is not such a list. */
static char *blocks_json(const char *tid, const char *req, const char *ids)
{
    json_object *o = json_object_new_object(), *list = json_object_new_array();
    const char  *p = ids;
    char        *out;

    while (*p != '\0') {
        char              *end;
        unsigned long long b = strtoull(p, &end, 10);

        if (end == p || (*end != ',' && *end != '\0')) {
            json_object_put(o);
            json_object_put(list);
            return NULL;
        }
        json_object_array_add(list, json_object_new_uint64(b));
        p = *end == ',' ? end + 1 : end;
    }
    json_object_object_add(o, "type", json_object_new_string("remote_blocks"));
    json_object_object_add(o, "transfer_id", json_object_new_string(tid));
    json_object_object_add(o, "req_id", json_object_new_string(req));
    json_object_object_add(o, "block_notify_list", list);
    json_object_object_add(o, "consumer_rank", json_object_new_int(0));
    json_object_object_add(o, "decode_rank", json_object_new_int(0));
    json_object_object_add(o, "xfer_nonce",
                           json_object_new_string("4242424242"));
    out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return out;
}

/* cmd_blocks: a forged WRITE remote_blocks on the data plane (CTL, 0x4b7):
 * the address FROM claims, a NUL, then the message (blocks_json); the
 * header's len is the message's, its mac kvc_msg_mac under the session the
 * engine's handshake gave THIS host (FILE, from attack fetch): P derives
 * the session from FROM, so it authenticates only when FROM is on this
 * host. Sent to the engine's first worker from a tcp-only UCP worker of
 * its own. Exit 0 when it left (send and flush completed), 2 otherwise:
 * the verdict is the engine's (run_netns.sh blocks_thief watches its
 * counters and its transfer). */
static int cmd_blocks(char **a)
{
    json_object        *o = json_object_from_file(a[0]), *v;
    const ucp_address_t *wa;
    am_hdr_t            h;
    uint8_t            *addr;
    char               *msg = blocks_json(a[1], a[2], a[4]), *data;
    size_t              alen, off = WA_HDR, flen = strlen(a[3]), mlen;
    uint64_t            session;
    ucs_status_t        sst, fst;

    if (msg == NULL || flen == 0 || flen > 63) {
        printf("blocks: block ids '%s' or from '%s' malformed\n", a[4],
               a[3]);
        return 2;
    }
    if (o == NULL || !json_object_object_get_ex(o, "worker_addr", &v) ||
        (addr = b64_decode(json_object_get_string(v), &alen)) == NULL ||
        next_wk_addr(addr, alen, &off, &wa) != 0) {
        printf("blocks: no worker address in %s\n", a[0]);
        return 2;
    }
    session = u64_of(o, "session");
    mlen    = strlen(msg);
    data    = malloc(flen + 1 + mlen);
    memcpy(data, a[3], flen + 1); /* from and its NUL */
    memcpy(data + flen + 1, msg, mlen);
    memset(&h, 0, sizeof(h));
    h.magic   = AM_MAGIC;
    h.version = AM_PROTO;
    h.len     = mlen;
    h.nonce   = stamp_now();
    h.mac     = kvc_msg_mac(session, h.nonce, msg, mlen);
    if (am_to_engine("blocks", wa, 0x4b7, &h, data, flen + 1 + mlen, &sst,
                     &fst) != 0) {
        return 2;
    }
    printf("blocks: remote_blocks %s from \"%s\" with session %s: send %s, "
           "flush %s\n", msg, a[3], session ? "given" : "none",
           ucs_status_string(sst), ucs_status_string(fst));
    free(addr);
    free(data);
    free(msg);
    json_object_put(o);
    return sst == UCS_OK && fst == UCS_OK ? 0 : 2;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const struct {
        const char *name;
        int         nargs;
        int (*fn)(char **);
    } cmds[] = {
        {"wait", 3, cmd_wait},   {"forge", 4, cmd_forge},
        {"plain", 2, cmd_plain}, {"tlsid", 6, cmd_tlsid},
        {"stall", 4, cmd_stall}, {"big", 3, cmd_big},
        {"respond", 5, cmd_respond}, {"fetch", 3, cmd_fetch},
        {"rma", 2, cmd_rma},     {"amput", 3, cmd_amput},
        {"notice", 5, cmd_notice}, {"blocks", 5, cmd_blocks},
    };

    for (size_t i = 0; argc >= 2 && i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        if (strcmp(argv[1], cmds[i].name) == 0 && argc == cmds[i].nargs + 2) {
            return cmds[i].fn(argv + 2);
        }
    }
    fprintf(stderr, "usage: see the head of tests/security/attack.c\n");
    return 2;
}
