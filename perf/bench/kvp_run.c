/*
 * kvp_run.c - the session: roles, the pair protocol and the measurements.
 *
 * A session runs "setups" (mode x memory placement x block size; each with
 * fresh engines, pools and ports) and in each setup one probe transfer (it
 * connects: handshake + one block) and then one "point" per batch size.
 *
 * Point protocol (D drives, P answers):
 *   D -> P  POINT  {setup, point, batch, warmup, iters, base}
 *   P              producer_request for the first `ahead` transfers
 *   P -> D  READY
 *   READ:  D posts consumer_request (gets) for each transfer, up to --depth
 *          in flight, and waits for FINISHED_RECVING; P keeps issuing
 *          producer_requests and timestamps each FINISHED_SENDING (release).
 *   WRITE: D posts consumer_request (sends remote_blocks) and waits for
 *          FINISHED_RECVING (write_done); P waits until the transfer's
 *          remote_blocks arrived (stats), then layer_ready x layers + seal,
 *          and timestamps FINISHED_SENDING (final flush done).
 *   D -> P  DONE;  P -> D  PRECS (P's per-transfer times, RSS)
 *   D merges P's and its own times (P's clock mapped onto D's) and every
 *   rank takes part in a gather to the reporter, which prints the row.
 */
#define _GNU_SOURCE
#include "kvp_int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define KVP_PROBE     UINT32_MAX
#define KVP_CTL_SKIP  5  /* probe: the connecting transfer and 4 more (the
                            first release / write_done dials its nng
                            connection and delays the next ones) */
#define KVP_PROBE_GAP_US 2000 /* probe: pause between its transfers */
#define KVP_CTL_N     30 /* probe: 1-block transfers measured after those */
#define KVP_PORT_LO_P 10000
#define KVP_PORT_LO_D 15000
#define KVP_PORT_SPAN 5000

typedef struct {
    uint32_t optsize;
    uint32_t npairs;
    char     boot_id[64];
    char     host[64];
    uint32_t port_base; /* this instance's base for setup 0 */
    char     sess[24];
} kvp_hello_t;

typedef struct {
    uint32_t setup, point, batch, warm, iters, mode;
    uint64_t base; /* transfers of earlier points of this setup */
} kvp_point_msg_t;

typedef struct {
    uint32_t total;
    int32_t  rma_emulated;
    double   handshake_us;
    double   ctl_rtt[3], hs_parts[3]; /* WRITE: P's (kvp_ctl_stats) */
    int64_t  rss_kb[3], hwm_kb;
    uint32_t hold;          /* --hold: idle transfers held on P */
    int64_t  p_xfers_end;   /* P's engine "transfers" after the point */
    double   hold_create_s;
    int64_t  hold_rss_kb;
    char     rma_mode[16];
    char     transports[512];
    /* followed by 3 x total doubles: a, b, c (see kvp_p_point) */
} kvp_precs_t;

typedef struct {
    const kvp_opts_t *o;
    const kvx_api_t  *api;
    kvp_comm_t       *c;
    char              sess[24];
    char              host[64];      /* my engine host */
    char              peer_host[64]; /* peer engine host */
    uint32_t          my_base, peer_base;
    double            offset_us;     /* P clock - D clock */
    uint32_t          npairs;
    kvp_report_t     *report;
    uint64_t          xfers_done;
    uint64_t          paced;         /* D: times D waited for P (--lead) */
    uint64_t          counts;        /* D: PACED counts taken from P */
    unsigned          test_p_delay_us; /* P: KVP_TEST_P_DELAY_US */
    /* per setup */
    uint32_t          setup;
    kvp_mode_t        mode;
    kvp_mem_t         mem;
    uint64_t          block_bytes;
    kvp_side_t        side;
    kvp_idgen_t       ig;
    uint8_t          *src_pool;      /* D with --memcpy */
    double            handshake_us, first_xfer_us;
    double            ctl_rtt[3], hs_parts[3];
    char              transports[512];
    int               rma_emulated;
    char              rma_mode[16];
    char              geom_desc[160];
    uint32_t          held;          /* P: idle transfers created (--hold) */
    double            hold_create_s; /* P: their creation time */
    int64_t           hold_rss_kb;   /* P: RSS growth while creating them */
} kvp_sess_t;

/* --- helpers ------------------------------------------------------------ */

static int kvp_fatal(kvp_sess_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int kvp_fatal(kvp_sess_t *s, const char *fmt, ...)
{
    char    msg[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    kvp_err("%s", msg);
    s->c->ops->abort(s->c, msg);
    return -1;
}

static void kvp_tid(const kvp_sess_t *s, const kvp_point_msg_t *pm, uint32_t i,
                    char *buf, size_t len)
{
    if (pm->point == KVP_PROBE) {
        snprintf(buf, len, "tx-kvp-%s-s%u-probe-%u", s->sess, pm->setup, i);
    } else {
        snprintf(buf, len, "tx-kvp-%s-s%u-p%u-%u", s->sess, pm->setup,
                 pm->point, i);
    }
}

/* Index of a transfer id of this point, or -1. */
static long kvp_tid_index(const kvp_sess_t *s, const kvp_point_msg_t *pm,
                          const char *tid)
{
    char        prefix[KVX_ID_MAX];
    size_t      pl;
    char       *end;
    long        v;
    const char *dash;

    kvp_tid(s, pm, 0, prefix, sizeof(prefix));
    dash = strrchr(prefix, '-');
    pl   = (size_t)(dash - prefix) + 1;
    if (strncmp(prefix, tid, pl) != 0) {
        return -1;
    }
    v = strtol(tid + pl, &end, 10);
    if (*end != '\0' || v < 0 || v >= (long)(pm->warm + pm->iters)) {
        return -1;
    }
    return v;
}

/* Index into the block-id sequence: the probe cycles over the blocks of
 * 2 x depth transfers (it measures the control plane, not first-touch page
 * faults of fresh blocks; transfers in flight together stay distinct);
 * points walk the pool. */
static uint64_t kvp_xfer_seq(const kvp_sess_t *s, const kvp_point_msg_t *pm,
                             uint32_t i)
{
    return pm->point == KVP_PROBE ? i % (2 * s->o->depth) : pm->base + i;
}

static long long kvp_stat(const kvp_sess_t *s, const char *key)
{
    char       *js = NULL;
    const char *p;
    char        pat[64];
    long long   v = -1;

    if (s->api->stats(s->side.eng, &js) != KVX_OK) {
        return -1;
    }
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(js, pat);
    if (p != NULL) {
        v = strtoll(p + strlen(pat), NULL, 10);
    }
    s->api->free(js);
    return v;
}

static int kvp_port_free(const char *host, uint32_t port)
{
    struct sockaddr_in sa;
    int                fd = socket(AF_INET, SOCK_STREAM, 0), ok;

    if (fd < 0) {
        return 0;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port   = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    }
    ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    close(fd);
    return ok;
}

/* A free range of `count` ports in [lo, lo + KVP_PORT_SPAN). */
static uint32_t kvp_pick_ports(const char *host, uint32_t lo, uint32_t count)
{
    uint64_t seed = (uint64_t)getpid() * 2654435761u ^ (uint64_t)time(NULL);

    if (count >= KVP_PORT_SPAN) {
        return 0;
    }
    for (int attempt = 0; attempt < 200; attempt++) {
        uint32_t base, k;

        seed = kvp_mix64(seed);
        base = lo + (uint32_t)(seed % (KVP_PORT_SPAN - count));
        for (k = 0; k < count && kvp_port_free(host, base + k); k++) {
        }
        if (k == count) {
            return base;
        }
    }
    return 0;
}

static uint32_t kvp_nsetups(const kvp_opts_t *o)
{
    return (uint32_t)(o->nmodes * o->nmems * o->nblock_bytes);
}

/* Ports of one instance: per setup, N handshake then N notify ports. */
static uint32_t kvp_hs_base(uint32_t base, uint32_t setup, uint32_t n)
{
    return base + setup * 2 * n;
}

static uint32_t kvp_max_batch(const kvp_opts_t *o)
{
    uint32_t m = 1;

    for (int i = 0; i < o->nbatches; i++) {
        m = o->batches[i] > m ? o->batches[i] : m;
    }
    return m;
}

/* Auto warm-up: n/10, at least 2, and at least one pass over the pool so
 * every block was touched once (page faults of the peer's first access to
 * a shared segment are set-up cost, not transfer cost; the pool is still
 * larger than the LLC, so blocks stay cold). */
static void kvp_point_counts(const kvp_opts_t *o, uint64_t xfer_bytes,
                             uint64_t nb, uint32_t batch, uint32_t *warm,
                             uint32_t *iters)
{
    uint32_t n = o->iters;
    uint64_t pass = (nb + batch - 1) / batch;

    if (n == 0) {
        uint64_t k = xfer_bytes ? (1ull << 30) / xfer_bytes : 1000;

        n = k < 10 ? 10 : k > 1000 ? 1000 : (uint32_t)k;
    }
    *iters = n;
    if (o->warmup != UINT32_MAX) {
        *warm = o->warmup;
        return;
    }
    *warm = n / 10 < 2 ? 2 : n / 10;
    if (*warm < pass) {
        *warm = pass > 10000 ? 10000 : (uint32_t)pass;
    }
}

/* Polls events of the engine; calls back per event of this point. */
typedef int (*kvp_ev_fn)(kvp_sess_t *s, const kvp_point_msg_t *pm, long idx,
                         const kvx_event_t *ev, void *arg);

static int kvp_drain(kvp_sess_t *s, const kvp_point_msg_t *pm, kvp_ev_fn fn,
                     void *arg, int *got)
{
    kvx_event_t ev[64];
    int         n, rc = 0;

    *got = 0;
    while ((n = s->api->poll_events(s->side.eng, ev, 64)) > 0) {
        for (int k = 0; k < n; k++) {
            long idx = kvp_tid_index(s, pm, ev[k].transfer_id);

            if (ev[k].type == KVX_EVENT_FAILED && rc == 0) {
                rc = kvp_fatal(s, "transfer %s failed: %s: %s",
                               ev[k].transfer_id,
                               s->api->status_name(ev[k].status),
                               ev[k].reason);
            } else if (idx < 0) {
                kvp_err("event for unexpected transfer %s ignored",
                        ev[k].transfer_id);
            } else if (rc == 0) {
                rc = fn(s, pm, idx, &ev[k], arg);
            }
            s->api->free(ev[k].block_ids);
            (*got)++;
        }
    }
    if (n < 0 && rc == 0) {
        rc = kvp_fatal(s, "poll_events: %s", s->api->last_error());
    }
    return rc;
}

static void kvp_transports(kvp_sess_t *s)
{
    char *js = NULL;
    const char *p;

    s->transports[0] = '\0';
    s->rma_emulated  = 0;
    snprintf(s->rma_mode, sizeof(s->rma_mode), "?");
    if (s->api->transports(s->side.eng, &js) != KVX_OK) {
        return;
    }
    /* "rma": how RMA really moves (rma | direct-shm | emulated); newer
     * engines only. */
    p = strstr(js, "\"rma\":\"");
    if (p != NULL) {
        p += strlen("\"rma\":\"");
        snprintf(s->rma_mode, sizeof(s->rma_mode), "%.*s",
                 (int)strcspn(p, "\""), p);
    }
    p = strstr(js, "\"transports\":\"");
    if (p != NULL) {
        const char *q;

        p += strlen("\"transports\":\"");
        q = strchr(p, '"');
        for (size_t k = 0; q != NULL && p < q &&
                           k + 1 < sizeof(s->transports); p++) {
            if (*p == '\\' && p + 1 < q) {
                p++; /* JSON escape ("\/") */
            }
            s->transports[k++] = *p;
            s->transports[k]   = '\0';
        }
    }
    s->rma_emulated = strstr(js, "\"rma_emulated\":true") != NULL;
    s->api->free(js);
}

/* kvp_json_num: the number after "key": inside the object named obj of
 * the engine's stats JSON; -1 if absent. */
static double kvp_json_num(const char *js, const char *obj, const char *key)
{
    char        pat[64];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", obj);
    p = strstr(js, pat);
    if (p == NULL) {
        return -1;
    }
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(p, pat);
    return p != NULL ? strtod(p + strlen(pat), NULL) : -1;
}

/* kvp_ctl_stats: the library's own control-plane figures of this side's
 * engine (api->stats): round trip of the control messages it sent (queued
 * -> reply) and the parts of its last handshake. */
static void kvp_ctl_stats(kvp_sess_t *s, double rtt[3], double parts[3])
{
    char *js = NULL;

    for (int i = 0; i < 3; i++) {
        rtt[i] = parts[i] = -1;
    }
    if (s->api->stats(s->side.eng, &js) != KVX_OK) {
        return;
    }
    rtt[0]   = kvp_json_num(js, "ctl_rtt", "avg_us");
    rtt[1]   = kvp_json_num(js, "ctl_rtt", "p50_us");
    rtt[2]   = kvp_json_num(js, "ctl_rtt", "p99_us");
    parts[0] = kvp_json_num(js, "last_handshake", "metadata_us");
    parts[1] = kvp_json_num(js, "last_handshake", "endpoint_us");
    parts[2] = kvp_json_num(js, "last_handshake", "rkeys_us");
    s->api->free(js);
}

/* kvp_connect_ahead: the initiator's api->connect_peer to its peer rank,
 * waiting for the outcome; returns its duration in us (-1 on failure). */
static double kvp_connect_ahead(kvp_sess_t *s)
{
    char         addr[512];
    uint32_t     hs = kvp_hs_base(s->peer_base, s->setup, s->npairs);
    double       t;
    kvx_status_t st;

    if (s->api->abi_minor < 2 ||
        s->api->struct_size < offsetof(kvx_api_t, connect_peer) +
                                  sizeof(s->api->connect_peer)) {
        kvp_fatal(s, "--connect-ahead: this libkvxfer has no connect_peer "
                  "(ABI 1.%u)", s->api->abi_minor);
        return -1;
    }
    snprintf(addr, sizeof(addr),
             "{\"remote_host\":\"%s\",\"remote_handshake_port\":%u,"
             "\"remote_notify_port\":%u,\"remote_tp_size\":%u}",
             s->peer_host, hs, hs + s->npairs, s->npairs);
    t  = kvp_now_us();
    st = s->api->connect_peer(s->side.eng, addr, (int64_t)(s->o->timeout_s *
                                                           1000.0));
    t = kvp_now_us() - t;
    if (st != KVX_OK) {
        kvp_fatal(s, "connect_peer %s: %s: %s", addr, s->api->status_name(st),
                  s->api->last_error());
        return -1;
    }
    return t;
}

/* Polling back-off of P (the API has no blocking wait for producer
 * events): after activity poll every 2 us, then double up to `max` us. The
 * probe (control-plane latency) uses max 16 us; bandwidth points 100 us so
 * that P's polling steals little CPU from the copies. */
typedef struct {
    unsigned cur, max;
} kvp_backoff_t;

static void kvp_backoff_reset(kvp_backoff_t *b)
{
    b->cur = 2;
}

/* kvp_has_wait_events: the library has api->wait_events (ABI >= 1.2). */
static int kvp_has_wait_events(const kvp_sess_t *s)
{
    return s->api->abi_minor >= 2 &&
           s->api->struct_size >= offsetof(kvx_api_t, wait_events) +
                                      sizeof(s->api->wait_events);
}

static void kvp_backoff_wait(kvp_backoff_t *b)
{
    kvp_sleep_us(b->cur);
    b->cur = b->cur * 2 > b->max ? b->max : b->cur * 2;
}

/* --- P side --------------------------------------------------------------- */

typedef struct {
    double  *a, *b, *c;
    uint32_t finished;
    int      write;
} kvp_p_state_t;

static int kvp_p_on_event(kvp_sess_t *s, const kvp_point_msg_t *pm, long idx,
                          const kvx_event_t *ev, void *arg)
{
    kvp_p_state_t *st = arg;
    double         now = kvp_now_us();
    double        *slot = st->write ? &st->c[idx] : &st->b[idx];

    (void)pm;
    if (ev->type == KVX_EVENT_FINISHED_SENDING && *slot == 0) {
        *slot = now;
        st->finished++;
        if (s->test_p_delay_us > 0) {
            kvp_sleep_us(s->test_p_delay_us); /* a slow P (tests, --lead) */
        }
    }
    return 0;
}

static int kvp_p_issue(kvp_sess_t *s, const kvp_point_msg_t *pm, uint32_t i,
                       uint64_t *ids, double *prep)
{
    char         tid[KVX_ID_MAX], params[1024], rid[KVX_ID_MAX + 8];
    char        *resp = NULL;
    kvx_status_t st;
    double       t;

    kvp_tid(s, pm, i, tid, sizeof(tid));
    snprintf(rid, sizeof(rid), "req-%s", tid);
    if (s->mode == KVP_READ) {
        snprintf(params, sizeof(params),
                 "{\"transfer_id\":\"%s\",\"do_remote_decode\":true}", tid);
    } else {
        snprintf(params, sizeof(params),
                 "{\"transfer_id\":\"%s\",\"do_remote_decode\":true,"
                 "\"remote_host\":\"%s\",\"remote_handshake_port\":%u,"
                 "\"remote_notify_port\":%u,\"remote_tp_size\":%u}",
                 tid, s->peer_host, kvp_hs_base(s->peer_base, s->setup,
                                                s->npairs),
                 kvp_hs_base(s->peer_base, s->setup, s->npairs) + s->npairs,
                 s->npairs);
    }
    kvp_block_ids(&s->ig, 1, kvp_xfer_seq(s, pm, i), pm->batch, ids);
    t  = kvp_now_us();
    st = s->api->producer_request(s->side.eng, rid, params, ids, pm->batch,
                                  &resp);
    *prep = kvp_now_us() - t;
    if (st != KVX_OK) {
        return kvp_fatal(s, "producer_request %s: %s: %s", tid,
                         s->api->status_name(st), s->api->last_error());
    }
    s->api->free(resp);
    return 0;
}

/* kvp_p_ready: WRITE P: every layer of transfer i computed, then sealed. */
static int kvp_p_ready(kvp_sess_t *s, const kvp_point_msg_t *pm, uint32_t i)
{
    char tid[KVX_ID_MAX];

    kvp_tid(s, pm, i, tid, sizeof(tid));
    for (uint32_t l = 0; l < s->side.geom.layers; l++) {
        kvx_status_t r = s->api->layer_ready(s->side.eng, tid, l);

        if (r != KVX_OK) {
            return kvp_fatal(s, "layer_ready %s %u: %s: %s", tid, l,
                             s->api->status_name(r), s->api->last_error());
        }
    }
    if (s->api->seal_transfer(s->side.eng, tid) != KVX_OK) {
        return kvp_fatal(s, "seal_transfer %s: %s", tid,
                         s->api->last_error());
    }
    return 0;
}

/* D's lead over P (KVP_MSG_PACED). A direct READ never waits for P, and
 * in this benchmark D knows every block id in advance (a framework's D
 * learns them from P's answer), so D could run thousands of transfers
 * ahead of P's producer_requests; each release it sends meanwhile waits in
 * P's engine's early store, which keeps at most KVC_EARLY_MAX (4,096) and
 * drops the oldest: that transfer of P then never finishes and the point
 * times out. So in a point of more than --lead transfers P says how many
 * it finished every quarter of --lead (KVP_MSG_PACED, unasked), and D
 * issues a transfer only while it is fewer than --lead (2,048) ahead of
 * the last count; otherwise it waits for the next one, taking its own
 * events meanwhile (transfers in flight end on time). Points of at most
 * --lead transfers send none: the auto counts at resident points (at most
 * 1,100); a point with a long pass over the pool (cold --mem ucx 32 KiB x 1
 * with the auto warm-up: 8,192 + 1,000 transfers in a 256 MiB pool) paces.
 * D can always be answered: P finishes every transfer D issued, and a
 * count at most a quarter of --lead below that lets D on.
 * KVP_TEST_P_DELAY_US (tests only) makes P wait that long after each
 * transfer it sees finished, so that D gets ahead. */
static uint32_t kvp_pace_step(const kvp_opts_t *o)
{
    return o->lead / 4 > 0 ? o->lead / 4 : 1;
}

/* kvp_p_paced (P): tell D the finished count when it passed the next
 * step (points of more than --lead transfers only). */
static int kvp_p_paced(kvp_sess_t *s, uint32_t total, uint32_t finished,
                       uint32_t *said)
{
    if (total <= s->o->lead || finished < *said + kvp_pace_step(s->o)) {
        return 0;
    }
    *said = finished;
    if (s->c->ops->send(s->c, KVP_MSG_PACED, &finished, sizeof(finished)) !=
        0) {
        kvp_err("%s", s->c->errmsg);
        return -1;
    }
    return 0;
}

/* P: takes D's DONE if it is waiting (an ABORT there is an error). The
 * channel is looked at once a millisecond at most, events or not: its
 * poll() is a system call, on the CPU P's progress thread needs, and
 * looking before every sleep made it one per transfer at one transfer in
 * flight (perf/README.md, "The framework's share" and "The 21 short
 * points"). D's DONE waits at most a millisecond more for it. */
static int kvp_p_check_channel(kvp_sess_t *s, int *done_rx, double *last_us)
{
    void  *b;
    double now;

    if (*done_rx) {
        return 0;
    }
    now = kvp_now_us();
    if (now - *last_us < 1000.0) {
        return 0;
    }
    *last_us = now;
    if (!s->c->ops->pending(s->c)) {
        return 0;
    }
    if (s->c->ops->recv(s->c, KVP_MSG_DONE, &b, NULL, 10) != 0) {
        kvp_err("%s", s->c->errmsg);
        return -1;
    }
    free(b);
    *done_rx = 1;
    return 0;
}

static int kvp_p_point(kvp_sess_t *s, const kvp_point_msg_t *pm)
{
    uint32_t      total = pm->warm + pm->iters, issued = 0;
    uint32_t      ahead = s->o->depth * 4 > 64 ? s->o->depth * 4 : 64;
    kvp_p_state_t st    = {0};
    double        ahead_us = -1; /* --connect-ahead: connect_peer's time */
    uint64_t     *ids   = malloc(pm->batch * sizeof(uint64_t));
    double        deadline = kvp_now_us() + s->o->timeout_s * 1e6;
    double        t_rb0 = 0;
    long long     rb0 = 0;
    int           done_rx = 0, rc = -1, got = 0, wahead;
    double        chan_us = 0; /* the channel last looked at */
    uint32_t      said = 0;    /* finished count last sent to D */
    kvp_precs_t   *pr = NULL;
    size_t        prlen;
    int64_t       rss_tmp;
    kvp_backoff_t bo = {2, pm->point == KVP_PROBE ? 16 : 100};

    st.write = s->mode == KVP_WRITE;
    wahead   = st.write && s->o->write_ahead;
    st.a     = calloc(total, sizeof(double));
    st.b     = calloc(total, sizeof(double));
    st.c     = calloc(total, sizeof(double));
    prlen    = sizeof(*pr) + 3 * (size_t)total * sizeof(double);
    pr       = calloc(1, prlen);
    if (ids == NULL || st.a == NULL || st.b == NULL || st.c == NULL ||
        pr == NULL) {
        kvp_fatal(s, "out of memory");
        goto out;
    }
    kvp_touch(st.a, total * sizeof(double));
    kvp_touch(st.b, total * sizeof(double));
    kvp_touch(st.c, total * sizeof(double));
    kvp_touch(pr, prlen);
    pr->total = total;
    pr->handshake_us = -1;
    if (ahead > total) {
        ahead = total;
    }
    if (st.write && pm->point == KVP_PROBE && s->o->connect_ahead &&
        (ahead_us = kvp_connect_ahead(s)) < 0) {
        goto out;
    }
    if (st.write) {
        rb0 = kvp_stat(s, "remote_blocks");
        if (rb0 < 0) {
            kvp_fatal(s, "stats: no remote_blocks counter");
            goto out;
        }
    }
    while (issued < ahead) {
        double prep;

        if (kvp_p_issue(s, pm, issued, ids, &prep) != 0 ||
            (wahead && kvp_p_ready(s, pm, issued) != 0)) {
            goto out;
        }
        if (!st.write || wahead) {
            st.a[issued] = prep;
        }
        issued++;
    }
    kvp_rss_kb(&pr->rss_kb[0], &rss_tmp);
    if (s->c->ops->send(s->c, KVP_MSG_READY, NULL, 0) != 0) {
        kvp_err("%s", s->c->errmsg);
        goto out;
    }
    if (st.write && !wahead) {
        for (uint32_t i = 0; i < total; i++) {
            /* D's remote_blocks for transfer i must have arrived. Events
             * first: FINISHED_SENDING of i-1 precedes its write_done, which
             * precedes D's next remote_blocks. */
            for (;;) {
                long long rb;

                if (kvp_drain(s, pm, kvp_p_on_event, &st, &got) != 0 ||
                    kvp_p_check_channel(s, &done_rx, &chan_us) != 0 ||
                    kvp_p_paced(s, total, st.finished, &said) != 0) {
                    goto out;
                }
                rb = kvp_stat(s, "remote_blocks");
                if (rb >= rb0 + (long long)i + 1) {
                    break;
                }
                if (kvp_now_us() > deadline) {
                    kvp_fatal(s, "point timed out waiting for remote_blocks "
                              "of transfer %u", i);
                    goto out;
                }
                if (got > 0) {
                    kvp_backoff_reset(&bo);
                }
                kvp_backoff_wait(&bo);
            }
            kvp_backoff_reset(&bo);
            st.a[i] = kvp_now_us();
            if (i == 0) {
                t_rb0 = st.a[i];
            }
            if (kvp_p_ready(s, pm, i) != 0) {
                goto out;
            }
            st.b[i] = kvp_now_us() - st.a[i];
            while (issued < total && issued < i + 1 + ahead) {
                double prep;

                if (kvp_p_issue(s, pm, issued++, ids, &prep) != 0) {
                    goto out;
                }
            }
            if (i == pm->warm + pm->iters / 2) {
                kvp_rss_kb(&pr->rss_kb[1], &rss_tmp);
            }
            if (kvp_drain(s, pm, kvp_p_on_event, &st, &got) != 0) {
                goto out;
            }
        }
    }
    while (st.finished < total) {
        if (kvp_drain(s, pm, kvp_p_on_event, &st, &got) != 0 ||
            kvp_p_check_channel(s, &done_rx, &chan_us) != 0 ||
            kvp_p_paced(s, total, st.finished, &said) != 0) {
            goto out;
        }
        while ((!st.write || wahead) && issued < total &&
               issued < st.finished + ahead) {
            if (kvp_p_issue(s, pm, issued, ids, &st.a[issued]) != 0 ||
                (wahead && kvp_p_ready(s, pm, issued) != 0)) {
                goto out;
            }
            issued++;
        }
        if ((!st.write || wahead) && st.finished >= pm->warm + pm->iters / 2 &&
            pr->rss_kb[1] == 0) {
            kvp_rss_kb(&pr->rss_kb[1], &rss_tmp);
        }
        if (got == 0) {
            if (kvp_now_us() > deadline) {
                kvp_fatal(s, "point timed out: %u of %u transfers finished "
                          "on P", st.finished, total);
                goto out;
            }
            if (kvp_has_wait_events(s)) {
                /* Sleep until kvxfer pushes an event (1 ms at most, so the
                 * bootstrap channel is still looked at). */
                (void)s->api->wait_events(s->side.eng, 1);
            } else {
                kvp_backoff_wait(&bo);
            }
        } else {
            kvp_backoff_reset(&bo);
        }
    }
    if (!done_rx) {
        void *b;

        if (s->c->ops->recv(s->c, KVP_MSG_DONE, &b, NULL,
                            s->o->timeout_s) != 0) {
            kvp_err("%s", s->c->errmsg);
            goto out;
        }
        free(b);
    }
    s->xfers_done += total;
    kvp_rss_kb(&pr->rss_kb[2], &pr->hwm_kb);
    pr->hold          = s->held;
    pr->hold_create_s = s->hold_create_s;
    pr->hold_rss_kb   = s->hold_rss_kb;
    /* The holds must still be there (none expired or was lost): the
     * engine's active transfers once every transfer of the point ended. */
    pr->p_xfers_end   = kvp_stat(s, "transfers");
    if (pm->point != KVP_PROBE && s->held > 0 &&
        pr->p_xfers_end >= 0 && pr->p_xfers_end < (int64_t)s->held) {
        kvp_fatal(s, "--hold: P's engine holds %lld transfers after the "
                  "point, fewer than the %u idle ones created",
                  (long long)pr->p_xfers_end, s->held);
        goto out;
    }
    if (st.write && pm->point == KVP_PROBE) {
        double hs = kvp_logger_last_handshake_us();

        pr->handshake_us = ahead_us >= 0 ? ahead_us
                         : t_rb0 > 0 && hs > t_rb0 ? hs - t_rb0
                                                   : -1; /* (--write-ahead:
                                                            no reference) */
        kvp_transports(s);
        kvp_ctl_stats(s, pr->ctl_rtt, pr->hs_parts);
    }
    if (st.write) {
        snprintf(pr->transports, sizeof(pr->transports), "%s", s->transports);
        snprintf(pr->rma_mode, sizeof(pr->rma_mode), "%s", s->rma_mode);
        pr->rma_emulated = s->rma_emulated;
    }
    memcpy((double *)(pr + 1), st.a, total * sizeof(double));
    memcpy((double *)(pr + 1) + total, st.b, total * sizeof(double));
    memcpy((double *)(pr + 1) + 2 * (size_t)total, st.c,
           total * sizeof(double));
    if (s->c->ops->send(s->c, KVP_MSG_PRECS, pr, prlen) != 0) {
        kvp_err("%s", s->c->errmsg);
        goto out;
    }
    rc = 0;
out:
    free(ids);
    free(st.a);
    free(st.b);
    free(st.c);
    free(pr);
    return rc;
}

/* Every rank takes part; the reporter turns the blobs into a row. */
static int kvp_gather_point(kvp_sess_t *s, const void *blob, size_t len)
{
    void  **bufs = NULL;
    size_t *lens = NULL;
    int     n = 0, rc;

    rc = s->c->ops->gather(s->c, blob, blob ? len : 0, &bufs, &lens, &n,
                           s->o->timeout_s);
    if (rc != 0) {
        kvp_err("%s", s->c->errmsg);
        return -1;
    }
    if (s->c->reporter) {
        kvp_row_t row;
        char      err[256];

        if (kvp_rows_from_blobs(bufs, lens, n, &row, err, sizeof(err)) != 0) {
            kvp_err("%s", err);
            rc = -1;
        } else {
            kvp_report_row(s->report, &row);
        }
        for (int i = 0; i < n; i++) {
            free(bufs[i]);
        }
        free(bufs);
        free(lens);
    }
    return rc;
}

/* --- D side --------------------------------------------------------------- */

typedef struct {
    double *done_t;
} kvp_d_state_t;

static int kvp_d_on_event(kvp_sess_t *s, const kvp_point_msg_t *pm, long idx,
                          const kvx_event_t *ev, void *arg)
{
    kvp_d_state_t *st = arg;

    (void)s;
    (void)pm;
    if (ev->type == KVX_EVENT_FINISHED_RECVING && st->done_t[idx] == 0) {
        st->done_t[idx] = kvp_now_us();
    }
    return 0;
}

static char *kvp_d_params(kvp_sess_t *s, const char *tid, const uint64_t *pids,
                          uint32_t n)
{
    size_t   cap = 512 + (size_t)n * 21;
    char    *p   = malloc(cap);
    size_t   len;
    uint32_t hs  = kvp_hs_base(s->peer_base, s->setup, s->npairs);

    if (p == NULL) {
        return NULL;
    }
    len = (size_t)snprintf(p, cap,
                           "{\"transfer_id\":\"%s\",\"do_remote_prefill\":"
                           "true,\"remote_host\":\"%s\",\"remote_handshake_"
                           "port\":%u,\"remote_notify_port\":%u,\"remote_tp_"
                           "size\":%u,\"remote_engine_id\":\"kvp-prefill\"",
                           tid, s->peer_host, hs, hs + s->npairs, s->npairs);
    if (s->mode == KVP_READ) {
        len += (size_t)snprintf(p + len, cap - len, ",\"remote_block_ids\":[");
        for (uint32_t k = 0; k < n; k++) {
            len += (size_t)snprintf(p + len, cap - len, "%s%" PRIu64,
                                    k ? "," : "", pids[k]);
        }
        len += (size_t)snprintf(p + len, cap - len, "]");
    }
    snprintf(p + len, cap - len, "}");
    return p;
}

static int kvp_memcpy_point(kvp_sess_t *s, const kvp_point_msg_t *pm,
                            const uint64_t *pids, const uint64_t *dids,
                            double *tx)
{
    const kvp_geom_t *g = &s->side.geom;
    uint32_t          total = pm->warm + pm->iters;

    if (s->src_pool == NULL) {
        void *p = mmap(NULL, g->pool_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

        if (p == MAP_FAILED) {
            return kvp_fatal(s, "memcpy source pool: out of memory");
        }
        memset(p, 0x5a, g->pool_bytes);
        s->src_pool = p;
    }
    for (uint32_t i = 0; i < total; i++) {
        const uint64_t *pi = pids + (size_t)i * pm->batch;
        const uint64_t *di = dids + (size_t)i * pm->batch;
        double          t  = kvp_now_us();

        for (uint32_t l = 0; l < g->layers; l++) {
            for (uint32_t k = 0; k < pm->batch; k++) {
                for (uint32_t u = 0; u < g->units; u++) {
                    uint8_t *dst = kvp_unit_ptr(&s->side, l, di[k], u);
                    uint8_t *src = s->src_pool +
                                   (kvp_unit_ptr(&s->side, l, pi[k], u) -
                                    s->side.pool);

                    memcpy(dst, src, g->unit);
                }
            }
        }
        if (i >= pm->warm) {
            tx[i - pm->warm] = kvp_now_us() - t;
        }
    }
    return 0;
}

/* kvp_d_pace (D, about to issue transfer head): take P's counts that
 * arrived, and wait for the next while head is --lead or more ahead,
 * taking D's events meanwhile so that transfers in flight end on time. */
static int kvp_d_pace(kvp_sess_t *s, const kvp_point_msg_t *pm,
                      kvp_d_state_t *st, uint32_t head, uint32_t *p_fin)
{
    double        deadline = kvp_now_us() + s->o->timeout_s * 1e6;
    kvp_backoff_t bo = {2, 100};
    int           waited = 0, got;

    for (;;) {
        uint32_t n;
        void    *b;
        size_t   len;

        if (!s->c->ops->pending(s->c)) {
            if (head < *p_fin + s->o->lead) {
                break;
            }
            waited = 1;
            if (kvp_drain(s, pm, kvp_d_on_event, st, &got) != 0) {
                return -1;
            }
            if (kvp_now_us() > deadline) {
                kvp_fatal(s, "no count from P within %.1f s: D is %u "
                          "transfers ahead of P's last (%u; --lead %u)",
                          s->o->timeout_s, head - *p_fin, *p_fin,
                          s->o->lead);
                return -1;
            }
            if (got > 0) {
                kvp_backoff_reset(&bo);
            } else {
                kvp_backoff_wait(&bo);
            }
            continue;
        }
        if (s->c->ops->recv(s->c, KVP_MSG_PACED, &b, &len, s->o->timeout_s) !=
            0) {
            kvp_err("%s", s->c->errmsg);
            return -1;
        }
        if (len != sizeof(n)) {
            free(b);
            kvp_fatal(s, "bootstrap protocol: bad PACED from P");
            return -1;
        }
        memcpy(&n, b, sizeof(n));
        free(b);
        s->counts++;
        *p_fin = n > *p_fin ? n : *p_fin;
    }
    s->paced += (uint64_t)waited;
    return 0;
}

static int kvp_d_point(kvp_sess_t *s, const kvp_point_msg_t *pm)
{
    uint32_t       total = pm->warm + pm->iters, head = 0, tail = 0;
    uint32_t       p_fin = 0; /* P's finished transfers, as P last said */
    uint64_t      *pids = malloc((size_t)total * pm->batch * sizeof(uint64_t));
    uint64_t      *dids = malloc((size_t)total * pm->batch * sizeof(uint64_t));
    char         **params = calloc(total, sizeof(char *));
    double        *t0 = calloc(total, sizeof(double));
    double        *post = calloc(total, sizeof(double));
    kvp_d_state_t  st = {.done_t = calloc(total, sizeof(double))};
    kvp_precs_t   *pr = NULL;
    size_t         prlen = 0, bloblen;
    kvp_blob_hdr_t *blob = NULL;
    double         runs = 0;
    int            rc = -1, got;
    uint32_t       first_rec, nrec;
    int64_t        rss[3] = {0, 0, 0}, hwm;
    void          *tmp;
    double         ahead_us = -1; /* --connect-ahead: connect_peer's time */

    if (pids == NULL || dids == NULL || params == NULL || t0 == NULL ||
        post == NULL || st.done_t == NULL) {
        kvp_fatal(s, "out of memory");
        goto out;
    }
    kvp_touch(t0, total * sizeof(double));
    kvp_touch(post, total * sizeof(double));
    kvp_touch(st.done_t, total * sizeof(double));
    for (uint32_t i = 0; i < total; i++) {
        char tid[KVX_ID_MAX];

        kvp_block_ids(&s->ig, 1, kvp_xfer_seq(s, pm, i), pm->batch,
                      pids + (size_t)i * pm->batch);
        kvp_block_ids(&s->ig, 0, kvp_xfer_seq(s, pm, i), pm->batch,
                      dids + (size_t)i * pm->batch);
        kvp_tid(s, pm, i, tid, sizeof(tid));
        params[i] = kvp_d_params(s, tid, pids + (size_t)i * pm->batch,
                                 pm->batch);
        if (params[i] == NULL) {
            kvp_fatal(s, "out of memory");
            goto out;
        }
        runs += (double)kvp_count_runs(&s->side.geom,
                                       dids + (size_t)i * pm->batch,
                                       pids + (size_t)i * pm->batch,
                                       pm->batch);
    }
    runs /= total;
    if (s->c->ops->send(s->c, KVP_MSG_POINT, pm, sizeof(*pm)) != 0 ||
        s->c->ops->recv(s->c, KVP_MSG_READY, &tmp, NULL, s->o->timeout_s) !=
            0) {
        kvp_err("%s", s->c->errmsg);
        goto out;
    }
    free(tmp);
    if (pm->point == KVP_PROBE && s->mode == KVP_READ && s->o->connect_ahead) {
        if ((ahead_us = kvp_connect_ahead(s)) < 0) {
            goto out;
        }
    }
    while (tail < total) {
        char         tid[KVX_ID_MAX];
        kvx_status_t r;
        double       deadline;

        while (head < total && head - tail < s->o->depth) {
            char rid[KVX_ID_MAX + 8];

            if (total > s->o->lead && head >= p_fin + s->o->lead / 2 &&
                kvp_d_pace(s, pm, &st, head, &p_fin) != 0) {
                goto out;
            }
            kvp_tid(s, pm, head, tid, sizeof(tid));
            snprintf(rid, sizeof(rid), "req-%s", tid);
            if (s->o->check) {
                kvp_fill_dst(&s->side, dids + (size_t)head * pm->batch,
                             pm->batch);
            }
            if (pm->point == KVP_PROBE && head > 0) {
                /* Pacing, not synchronization: the control-plane probe
                 * measures an unloaded round trip, so the previous
                 * transfer's release / write_done is answered before the
                 * next transfer's data competes for the two CPUs. */
                kvp_sleep_us(KVP_PROBE_GAP_US);
            }
            t0[head] = kvp_now_us();
            r = s->api->consumer_request(s->side.eng, rid, params[head],
                                         dids + (size_t)head * pm->batch,
                                         pm->batch);
            post[head] = kvp_now_us() - t0[head];
            if (r != KVX_OK) {
                kvp_fatal(s, "consumer_request %s: %s: %s", tid,
                          s->api->status_name(r), s->api->last_error());
                goto out;
            }
            head++;
        }
        kvp_tid(s, pm, tail, tid, sizeof(tid));
        if (s->o->busy_poll) { /* --busy-poll: spin until its event */
            deadline = kvp_now_us() + s->o->timeout_s * 1e6;
            while (st.done_t[tail] == 0) {
                if (kvp_drain(s, pm, kvp_d_on_event, &st, &got) != 0) {
                    goto out;
                }
                if (st.done_t[tail] == 0 && kvp_now_us() > deadline) {
                    kvp_fatal(s, "transfer %s: no event within %.1f s "
                              "(--busy-poll)", tid, s->o->timeout_s);
                    goto out;
                }
            }
        }
        /* Its event may already be drained (then the engine forgot it). */
        r = st.done_t[tail] != 0
                ? KVX_OK
                : s->api->wait_transfer(s->side.eng, tid,
                                        (int64_t)(s->o->timeout_s * 1000));
        if (r != KVX_OK) {
            kvp_fatal(s, "transfer %s: %s: %s", tid, s->api->status_name(r),
                      s->api->last_error());
            goto out;
        }
        deadline = kvp_now_us() + 10e6;
        while (st.done_t[tail] == 0) {
            if (kvp_drain(s, pm, kvp_d_on_event, &st, &got) != 0) {
                goto out;
            }
            if (st.done_t[tail] == 0) {
                if (kvp_now_us() > deadline) {
                    kvp_fatal(s, "transfer %s: no FINISHED_RECVING event "
                              "after wait_transfer returned", tid);
                    goto out;
                }
                kvp_sleep_us(5);
            }
        }
        if (s->o->inject_error && pm->point != KVP_PROBE &&
            tail == pm->warm) {
            /* --inject-error: the check must catch one flipped byte. */
            kvp_unit_ptr(&s->side, s->side.geom.layers - 1,
                         dids[(size_t)tail * pm->batch + pm->batch - 1],
                         s->side.geom.units - 1)[s->side.geom.unit / 2] ^= 1;
        }
        if (s->o->check) {
            char err[512];

            if (kvp_verify(&s->side, s->side.tp_rank,
                           dids + (size_t)tail * pm->batch,
                           pids + (size_t)tail * pm->batch, pm->batch, err,
                           sizeof(err)) != 0) {
                kvp_fatal(s, "transfer %s: %s", tid, err);
                goto out;
            }
        }
        if (tail == pm->warm) {
            kvp_rss_kb(&rss[0], &hwm);
        } else if (tail == pm->warm + pm->iters / 2) {
            kvp_rss_kb(&rss[1], &hwm);
        }
        tail++;
    }
    s->xfers_done += total;
    kvp_rss_kb(&rss[2], &hwm);
    if (pm->point == KVP_PROBE && s->mode == KVP_READ) {
        double hs = kvp_logger_last_handshake_us();

        s->handshake_us = ahead_us >= 0 ? ahead_us
                                        : hs > t0[0] ? hs - t0[0] : -1;
        kvp_transports(s);
        kvp_ctl_stats(s, s->ctl_rtt, s->hs_parts);
    }
    if (s->c->ops->send(s->c, KVP_MSG_DONE, NULL, 0) != 0) {
        kvp_err("%s", s->c->errmsg);
        goto out;
    }
    do { /* P's records, after the counts D did not need */
        free(pr);
        pr = NULL;
        if (s->c->ops->recv(s->c, KVP_MSG_ANY, (void **)&pr, &prlen,
                            s->o->timeout_s) != 0) {
            kvp_err("%s", s->c->errmsg);
            goto out;
        }
        s->counts += s->c->last_type == KVP_MSG_PACED;
    } while (s->c->last_type == KVP_MSG_PACED);
    if (s->c->last_type != KVP_MSG_PRECS) {
        kvp_fatal(s, "bootstrap protocol: expected P's records, got "
                  "message %u", s->c->last_type);
        goto out;
    }
    if (prlen != sizeof(*pr) + 3 * (size_t)total * sizeof(double) ||
        pr->total != total) {
        kvp_fatal(s, "bootstrap protocol: bad records from P");
        goto out;
    }
    if (s->mode == KVP_WRITE && pm->point == KVP_PROBE) {
        s->handshake_us = pr->handshake_us;
        memcpy(s->ctl_rtt, pr->ctl_rtt, sizeof(s->ctl_rtt));
        memcpy(s->hs_parts, pr->hs_parts, sizeof(s->hs_parts));
        snprintf(s->transports, sizeof(s->transports), "%s", pr->transports);
        snprintf(s->rma_mode, sizeof(s->rma_mode), "%s", pr->rma_mode);
        s->rma_emulated = pr->rma_emulated;
    }
    if (pm->point == KVP_PROBE) {
        /* D's consumer_request -> D's FINISHED_RECVING (WRITE: includes
         * remote_blocks to P, P's handshake, the puts and write_done). */
        s->first_xfer_us = st.done_t[0] - t0[0];
    }
    /* The probe's first transfer connected (handshake); its records are
     * the 1-block transfers after KVP_CTL_SKIP (control-plane latency). */
    first_rec = pm->point == KVP_PROBE ? KVP_CTL_SKIP : 0;
    nrec      = pm->iters - first_rec;
    bloblen = sizeof(*blob) + (size_t)nrec * sizeof(kvp_rec_t) +
              (s->o->memcpy_rows && pm->point != KVP_PROBE
                   ? (size_t)nrec * sizeof(double)
                   : 0);
    blob = calloc(1, bloblen);
    if (blob == NULL) {
        kvp_fatal(s, "out of memory");
        goto out;
    }
    {
        const double *pa = (const double *)(pr + 1);
        const double *pb = pa + total, *pc = pb + total;
        kvp_rec_t    *rec = (kvp_rec_t *)(blob + 1);

        for (uint32_t k = 0; k < nrec; k++) {
            uint32_t i = pm->warm + first_rec + k;

            rec[k].end_us = st.done_t[i];
            if (s->mode == KVP_WRITE && s->o->write_ahead) {
                /* P readied the layers before D asked: from D's
                 * consumer_request (remote_blocks included). */
                rec[k].start_us  = t0[i];
                rec[k].prep_us   = post[i];
                rec[k].post_us   = 0;
                rec[k].notify_us = st.done_t[i] - (pc[i] - s->offset_us);
            } else if (s->mode == KVP_READ) {
                rec[k].start_us  = t0[i];
                rec[k].prep_us   = pa[i];
                rec[k].post_us   = post[i];
                rec[k].notify_us = pb[i] - s->offset_us - st.done_t[i];
            } else {
                rec[k].start_us  = pa[i] - s->offset_us;
                rec[k].prep_us   = post[i];
                rec[k].post_us   = pb[i];
                rec[k].notify_us = st.done_t[i] - (pc[i] - s->offset_us);
            }
            rec[k].tx_us = rec[k].end_us - rec[k].start_us;
        }
        if (s->o->memcpy_rows && pm->point != KVP_PROBE) {
            if (kvp_memcpy_point(s, pm, pids, dids,
                                 (double *)(rec + pm->iters)) != 0) {
                goto out;
            }
            blob->n_memcpy = pm->iters;
        }
    }
    blob->setup        = s->setup;
    blob->point        = pm->point;
    blob->pair         = s->side.tp_rank;
    blob->n            = nrec;
    blob->mode         = s->mode;
    blob->mem          = s->mem;
    blob->batch        = pm->batch;
    blob->block_bytes  = s->side.geom.unit;
    blob->xfer_bytes   = s->side.geom.block_total * pm->batch;
    blob->runs_per_xfer = runs;
    blob->handshake_us = s->handshake_us;
    blob->first_xfer_us = s->first_xfer_us;
    memcpy(blob->ctl_rtt, s->ctl_rtt, sizeof(blob->ctl_rtt));
    memcpy(blob->hs_parts, s->hs_parts, sizeof(blob->hs_parts));
    memcpy(blob->rss_kb[0], pr->rss_kb, sizeof(pr->rss_kb));
    memcpy(blob->rss_kb[1], rss, sizeof(rss));
    blob->hwm_kb[0]    = pr->hwm_kb;
    blob->hwm_kb[1]    = hwm;
    blob->rma_emulated = s->rma_emulated;
    blob->xfers_done   = s->xfers_done;
    blob->hold          = pr->hold;
    blob->p_xfers_end   = pr->p_xfers_end;
    blob->hold_create_s = pr->hold_create_s;
    blob->hold_rss_kb   = pr->hold_rss_kb;
    snprintf(blob->transports, sizeof(blob->transports), "%s", s->transports);
    snprintf(blob->rma_mode, sizeof(blob->rma_mode), "%s", s->rma_mode);
    snprintf(blob->geom_desc, sizeof(blob->geom_desc), "%s", s->geom_desc);
    rc = 0;
out:
    if (rc == 0) {
        rc = kvp_gather_point(s, blob, bloblen);
    }
    if (params != NULL) {
        for (uint32_t i = 0; i < total; i++) {
            free(params[i]);
        }
    }
    free(params);
    free(pids);
    free(dids);
    free(t0);
    free(post);
    free(st.done_t);
    free(pr);
    free(blob);
    return rc;
}

/* --- idle transfers (--hold) --------------------------------------------- */

/* kvp_hold (P): o->hold idle transfers, one block each, that no D ever
 * reads (READ) or sends remote_blocks for (WRITE). They stay held by the
 * engine until the setup's engine is destroyed (defer_timeout is
 * --hold-timeout), so every measured point of the setup runs next to them.
 * Block ids walk the pool: the engine does not refuse a block shared by
 * two transfers (it checks bounds only), so N needs no pool of N blocks. */
static int kvp_hold(kvp_sess_t *s)
{
    const kvp_opts_t *o = s->o;
    uint32_t          hs = kvp_hs_base(s->peer_base, s->setup, s->npairs);
    int64_t           rss0, rss1, hwm;
    double            t0 = kvp_now_us();

    kvp_rss_kb(&rss0, &hwm);
    for (uint32_t i = 0; i < o->hold; i++) {
        char         tid[KVX_ID_MAX], rid[KVX_ID_MAX + 8], params[1024];
        char        *resp = NULL;
        uint64_t     id;
        kvx_status_t st;

        snprintf(tid, sizeof(tid), "tx-kvp-%s-s%u-hold-%u", s->sess,
                 s->setup, i);
        snprintf(rid, sizeof(rid), "req-%s", tid);
        if (s->mode == KVP_READ) {
            snprintf(params, sizeof(params),
                     "{\"transfer_id\":\"%s\",\"do_remote_decode\":true}",
                     tid);
        } else {
            snprintf(params, sizeof(params),
                     "{\"transfer_id\":\"%s\",\"do_remote_decode\":true,"
                     "\"remote_host\":\"%s\",\"remote_handshake_port\":%u,"
                     "\"remote_notify_port\":%u,\"remote_tp_size\":%u}",
                     tid, s->peer_host, hs, hs + s->npairs, s->npairs);
        }
        kvp_block_ids(&s->ig, 1, i, 1, &id);
        st = s->api->producer_request(s->side.eng, rid, params, &id, 1,
                                      &resp);
        if (st != KVX_OK) {
            return kvp_fatal(s, "--hold: producer_request %s (%u of %u): "
                             "%s: %s", tid, i + 1, o->hold,
                             s->api->status_name(st), s->api->last_error());
        }
        s->api->free(resp);
        s->held = i + 1;
        if (kvp_verbose && (i + 1) % 10000 == 0) {
            kvp_info("--hold: %u of %u idle transfers created (%.1f s)",
                     i + 1, o->hold, (kvp_now_us() - t0) / 1e6);
        }
    }
    s->hold_create_s = (kvp_now_us() - t0) / 1e6;
    kvp_rss_kb(&rss1, &hwm);
    s->hold_rss_kb = rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : -1;
    kvp_info("--hold: %u idle transfers created in %.2f s, RSS %+lld KiB",
             s->held, s->hold_create_s, (long long)s->hold_rss_kb);
    return 0;
}

/* --- setups and the session ----------------------------------------------- */

static int kvp_point(kvp_sess_t *s, kvp_point_msg_t *pm)
{
    if (s->c->producer) {
        kvp_point_msg_t *got = NULL;
        size_t           len;
        int              rc;

        if (s->c->ops->recv(s->c, KVP_MSG_POINT, (void **)&got, &len,
                            s->o->timeout_s * 4) != 0) {
            kvp_err("%s", s->c->errmsg);
            return -1;
        }
        if (len != sizeof(*got) || got->setup != pm->setup ||
            got->point != pm->point || got->batch != pm->batch) {
            free(got);
            return kvp_fatal(s, "bootstrap protocol: P and D disagree on "
                             "the point");
        }
        *pm = *got;
        free(got);
        rc = kvp_p_point(s, pm);
        return rc == 0 ? kvp_gather_point(s, NULL, 0) : rc;
    }
    return kvp_d_point(s, pm);
}

static void kvp_geom_describe(const kvp_sess_t *s, char *buf, size_t len)
{
    static const char *lay[] = {"split K/V", "interleaved K/V", "key-only"};
    const kvp_geom_t  *g     = &s->side.geom;
    char               pool[32];

    kvp_fmt_size(g->pool_bytes, pool, sizeof(pool));
    snprintf(buf, len, "%s: %u layers %s, %u tokens x %u heads x %u dim x "
             "%u B, %" PRIu64 " blocks (%s pool)", s->o->model.name,
             g->layers, lay[g->layout], g->tokens, g->heads, g->head_dim,
             g->elem, g->nb, pool);
}

static int kvp_setup(kvp_sess_t *s)
{
    const kvp_opts_t *o = s->o;
    kvp_side_cfg_t    cfg;
    kvp_geom_t        g;
    char              err[512];
    uint32_t          hs = kvp_hs_base(s->my_base, s->setup, s->npairs);
    uint64_t          base = 0;
    int               rc = 0;

    if (kvp_geom_make(&o->model, s->npairs, s->block_bytes, o->pool_bytes,
                      2ull * o->depth * kvp_max_batch(o), &g, err,
                      sizeof(err)) != 0) {
        return kvp_fatal(s, "%s", err);
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.producer        = s->c->producer;
    cfg.tp_rank         = s->c->pair;
    cfg.tp_size         = s->npairs;
    cfg.mode            = s->mode;
    cfg.mem             = s->mem;
    cfg.host            = s->host;
    cfg.hs_base         = hs;
    cfg.nt_base         = hs + s->npairs;
    cfg.tls             = o->tls;
    cfg.max_inflight    = o->max_inflight;
    cfg.extra           = o->extra;
    cfg.defer_timeout_s = o->timeout_s + 60;
    cfg.transfer_timeout_s = o->timeout_s + 60;
    if (o->hold > 0 && o->hold_timeout_s > cfg.defer_timeout_s) {
        /* The idle transfers must outlive the whole setup. */
        cfg.defer_timeout_s = o->hold_timeout_s;
    }
    cfg.fill_pattern    = o->check;
    if (kvp_side_open(s->api, &cfg, &g, &s->side, err, sizeof(err)) != 0) {
        return kvp_fatal(s, "%s", err);
    }
    kvp_geom_describe(s, s->geom_desc, sizeof(s->geom_desc));
    kvp_info("setup %u: %s, mem %s: %s", s->setup,
             s->mode == KVP_READ ? "READ" : "WRITE",
             s->mem == KVP_MEM_APP ? "app" : "ucx", s->geom_desc);
    if (kvp_idgen_init(&s->ig, g.nb, o->contiguous) != 0) {
        kvp_side_close(&s->side);
        return kvp_fatal(s, "out of memory (block ids)");
    }
    s->ig.resident = o->resident;
    s->handshake_us = s->first_xfer_us = -1;
    for (int k = 0; k < 3; k++) {
        s->ctl_rtt[k] = s->hs_parts[k] = -1;
    }
    s->transports[0] = '\0';
    s->rma_emulated = 0;
    snprintf(s->rma_mode, sizeof(s->rma_mode), "?");
    s->held          = 0;
    s->hold_create_s = 0;
    s->hold_rss_kb   = 0;
    if (s->c->ops->barrier(s->c, 120) != 0) {
        kvp_err("%s", s->c->errmsg);
        rc = -1;
    }
    /* The probe connects (handshake) with one block. */
    if (rc == 0) {
        kvp_point_msg_t pm = {.setup = s->setup, .point = KVP_PROBE,
                              .batch = 1, .warm = 0,
                              .iters = KVP_CTL_SKIP + KVP_CTL_N,
                              .mode = s->mode, .base = base};

        rc   = kvp_point(s, &pm);
        base = pm.iters;
    }
    /* --hold: after the probe (the setup header's handshake and control
     * plane stay comparable), before the measured points. D waits. */
    if (rc == 0 && o->hold > 0) {
        if (s->c->producer) {
            rc = kvp_hold(s);
        }
        if (rc == 0 && s->c->ops->barrier(s->c, o->timeout_s * 10 > 600
                                                    ? o->timeout_s * 10
                                                    : 600) != 0) {
            kvp_err("%s", s->c->errmsg);
            rc = -1;
        }
    }
    for (int b = 0; rc == 0 && b < o->nbatches; b++) {
        kvp_point_msg_t pm = {.setup = s->setup, .point = (uint32_t)b,
                              .batch = o->batches[b], .mode = s->mode,
                              .base = base};

        kvp_point_counts(o, g.block_total * pm.batch, g.nb, pm.batch,
                         &pm.warm, &pm.iters);
        rc = kvp_point(s, &pm);
        base += pm.warm + pm.iters;
    }
    if (rc == 0 && s->c->ops->barrier(s->c, 120) != 0) {
        kvp_err("%s", s->c->errmsg);
        rc = -1;
    }
    kvp_side_close(&s->side);
    kvp_idgen_fini(&s->ig);
    if (s->src_pool != NULL) {
        munmap(s->src_pool, g.pool_bytes);
        s->src_pool = NULL;
    }
    return rc;
}

static int kvp_clock_sync(kvp_sess_t *s)
{
    double best_rtt = 1e300;

    for (int k = 0; k < 16; k++) {
        double *v = NULL, t1, t2, now;

        if (s->c->producer) {
            if (s->c->ops->recv(s->c, KVP_MSG_PING, (void **)&v, NULL, 60) !=
                0) {
                kvp_err("%s", s->c->errmsg);
                return -1;
            }
            free(v);
            now = kvp_now_us();
            if (s->c->ops->send(s->c, KVP_MSG_PONG, &now, sizeof(now)) != 0) {
                return -1;
            }
            continue;
        }
        t1 = kvp_now_us();
        if (s->c->ops->send(s->c, KVP_MSG_PING, &t1, sizeof(t1)) != 0 ||
            s->c->ops->recv(s->c, KVP_MSG_PONG, (void **)&v, NULL, 60) != 0) {
            kvp_err("%s", s->c->errmsg);
            return -1;
        }
        t2 = kvp_now_us();
        if (t2 - t1 < best_rtt) {
            best_rtt     = t2 - t1;
            s->offset_us = *v - (t1 + t2) / 2;
        }
        free(v);
    }
    kvp_info("clock offset P - D = %.1f us (rtt %.1f us)", s->offset_us,
             best_rtt);
    return 0;
}

int kvp_session(const kvp_opts_t *o, const kvx_api_t *api, kvp_comm_t *c)
{
    kvp_sess_t  s;
    kvp_hello_t me, *peer = NULL;
    size_t      len;
    uint32_t    nset = kvp_nsetups(o);
    int         rc = 0;
    char        tag[16];

    memset(&s, 0, sizeof(s));
    s.o      = o;
    s.api    = api;
    s.c      = c;
    s.npairs = c->npairs;
    if (c->producer && getenv("KVP_TEST_P_DELAY_US") != NULL) {
        s.test_p_delay_us = (unsigned)strtoul(getenv("KVP_TEST_P_DELAY_US"),
                                              NULL, 10);
    }
    snprintf(tag, sizeof(tag), "%s%u", c->producer ? "P" : "D", c->pair);
    kvp_set_tag(tag);
    kvp_timer_slack_min();
    snprintf(s.host, sizeof(s.host), "%s",
             o->host_ip[0] ? o->host_ip : c->local_ip);

    /* Port bases: each instance needs 2 x N ports per setup. */
    {
        uint64_t pb = 0, db = 0;
        uint32_t need = 2 * s.npairs * nset;

        if (o->kv_port != 0) {
            pb = o->kv_port;
            db = o->kv_port + need;
        } else if (o->role == KVP_ROLE_MPI) {
            if (c->reporter) {
                pb = kvp_pick_ports(s.host, KVP_PORT_LO_P, need);
                db = kvp_pick_ports(s.host, KVP_PORT_LO_D, need);
            }
            if (c->ops->bcast_u64(c, &pb) != 0 ||
                c->ops->bcast_u64(c, &db) != 0) {
                kvp_err("MPI broadcast of the port bases failed");
                return 1;
            }
        } else if (c->producer) {
            pb = kvp_pick_ports(s.host, KVP_PORT_LO_P, need);
        } else {
            db = kvp_pick_ports(s.host, KVP_PORT_LO_D, need);
        }
        s.my_base = (uint32_t)(c->producer ? pb : db);
        if (s.my_base == 0 || s.my_base + need > 65535) {
            kvp_fatal(&s, "no free range of %u ports for the engines "
                      "(use --kv-port)", need);
            return 1;
        }
    }

    /* Hello: hosts, port bases, boot ids (same host: same clock). */
    memset(&me, 0, sizeof(me));
    me.optsize   = (uint32_t)sizeof(kvp_opts_t);
    me.npairs    = s.npairs;
    me.port_base = s.my_base;
    kvp_boot_id(me.boot_id, sizeof(me.boot_id));
    snprintf(me.host, sizeof(me.host), "%s", s.host);
    if (!c->producer) {
        uint64_t r = kvp_mix64((uint64_t)getpid() ^ (uint64_t)time(NULL) ^
                               ((uint64_t)c->pair << 40));

        snprintf(me.sess, sizeof(me.sess), "%08" PRIx32, (uint32_t)r);
    }
    if (c->ops->send(c, KVP_MSG_HELLO, &me, sizeof(me)) != 0 ||
        c->ops->recv(c, KVP_MSG_HELLO, (void **)&peer, &len, 120) != 0) {
        kvp_err("%s", c->errmsg);
        return 1;
    }
    if (len != sizeof(me) || peer->optsize != me.optsize ||
        peer->npairs != me.npairs) {
        free(peer);
        kvp_fatal(&s, "bootstrap: the peer runs a different kvxfer_perf "
                  "build");
        return 1;
    }
    snprintf(s.peer_host, sizeof(s.peer_host), "%s", peer->host);
    s.peer_base = peer->port_base;
    snprintf(s.sess, sizeof(s.sess), "%s", c->producer ? peer->sess : me.sess);
    if (o->clock_sync || strcmp(peer->boot_id, me.boot_id) != 0 ||
        strcmp(me.boot_id, "unknown") == 0) {
        free(peer);
        if (kvp_clock_sync(&s) != 0) {
            return 1;
        }
    } else {
        free(peer);
    }
    kvp_info("engine host %s, ports %u.., peer %s ports %u..", s.host,
             s.my_base, s.peer_host, s.peer_base);

    if (c->reporter) {
        s.report = kvp_report_open(o);
        if (s.report == NULL) {
            kvp_fatal(&s, "cannot open the output files");
            return 1;
        }
    }
    for (int mi = 0; rc == 0 && mi < o->nmodes; mi++) {
        for (int ei = 0; rc == 0 && ei < o->nmems; ei++) {
            for (int bi = 0; rc == 0 && bi < o->nblock_bytes; bi++) {
                s.mode        = o->modes[mi];
                s.mem         = o->mems[ei];
                s.block_bytes = o->block_bytes[bi];
                rc            = kvp_setup(&s);
                s.setup++;
            }
        }
    }
    if (s.report != NULL) {
        kvp_report_close(s.report, rc != 0);
    }
    if (s.counts > 0) { /* even with -q: it tells how the points ran */
        fprintf(stderr, "kvxfer_perf[D%u]: %" PRIu64 " progress counts from "
                "P; waited for one %" PRIu64 " times to stay within --lead "
                "%u transfers of P's finished ones\n",
                c->pair, s.counts, s.paced, o->lead);
    }
    return rc == 0 ? 0 : 1;
}

/* --- roles ------------------------------------------------------------------ */

typedef struct {
    const kvp_opts_t *o;
    const kvx_api_t  *api;
    kvp_comm_t       *c;
    int               rc;
} kvp_thread_arg_t;

static void *kvp_p_thread(void *arg)
{
    kvp_thread_arg_t *a = arg;

    a->rc = kvp_session(a->o, a->api, a->c);
    return NULL;
}

/* Server: take the client's test options, keep our local ones. */
static int kvp_server_opts(kvp_comm_t *c, const kvp_opts_t *mine,
                           kvp_opts_t *out)
{
    kvp_opts_t *got = NULL;
    size_t      len;

    if (c->ops->recv(c, KVP_MSG_ARGV, (void **)&got, &len, 120) != 0) {
        kvp_err("%s", c->errmsg);
        return -1;
    }
    if (len != sizeof(*got)) {
        free(got);
        kvp_err("the client runs a different kvxfer_perf build");
        c->ops->abort(c, "server: different kvxfer_perf build");
        return -1;
    }
    *out = *got;
    free(got);
    out->role   = mine->role;
    out->port   = mine->port;
    out->format = mine->format;
    out->verbose = mine->verbose;
    out->quiet  = mine->quiet;
    out->accept_timeout_s = mine->accept_timeout_s;
    memcpy(out->bind_addr, mine->bind_addr, sizeof(out->bind_addr));
    memcpy(out->host_ip, mine->host_ip, sizeof(out->host_ip));
    memcpy(out->lib, mine->lib, sizeof(out->lib));
    memcpy(out->csv_path, mine->csv_path, sizeof(out->csv_path));
    memcpy(out->json_path, mine->json_path, sizeof(out->json_path));
    return 0;
}

int kvp_run(const kvp_opts_t *o)
{
    char             err[1024];
    const kvx_api_t *api;
    kvp_comm_t      *c = NULL, *cp = NULL;
    int              rc = 1;

    kvp_set_tag(o->role == KVP_ROLE_SERVER ? "P" : o->role == KVP_ROLE_CLIENT
                                                       ? "D" : "perf");
    if (o->role == KVP_ROLE_MPI) {
        /* MPI first: it may fork helpers; engines come after. */
        if (kvp_comm_mpi(NULL, NULL, &c, err, sizeof(err)) != 0) {
            kvp_err("%s", err);
            return 1;
        }
    }
    api = kvp_load_api(o->lib, err, sizeof(err));
    if (api == NULL) {
        kvp_err("%s", err);
        if (c != NULL) {
            c->ops->abort(c, err);
        }
        return 1;
    }
    kvp_logger_install(api);
    switch (o->role) {
    case KVP_ROLE_MPI:
        rc = kvp_session(o, api, c);
        c->ops->close(c);
        return rc;
    case KVP_ROLE_SERVER: {
        kvp_opts_t so;

        if (kvp_comm_server(o->bind_addr, o->port, o->accept_timeout_s, &c) !=
            0) {
            return 1;
        }
        if (kvp_server_opts(c, o, &so) == 0) {
            kvp_verbose = so.verbose;
            rc          = kvp_session(&so, api, c);
        }
        c->ops->close(c);
        return rc;
    }
    case KVP_ROLE_CLIENT:
        if (kvp_comm_client(o->server, o->port, 60, &c) != 0) {
            return 1;
        }
        if (c->ops->send(c, KVP_MSG_ARGV, o, sizeof(*o)) != 0) {
            kvp_err("%s", c->errmsg);
        } else {
            rc = kvp_session(o, api, c);
        }
        c->ops->close(c);
        return rc;
    case KVP_ROLE_LOOPBACK:
    default: {
        pthread_t        th;
        kvp_thread_arg_t a;

        if (kvp_comm_pair(&cp, &c) != 0) {
            return 1;
        }
        a.o   = o;
        a.api = api;
        a.c   = cp;
        a.rc  = 1;
        if (pthread_create(&th, NULL, kvp_p_thread, &a) != 0) {
            kvp_err("cannot start the P thread");
            cp->ops->close(cp);
            c->ops->close(c);
            return 1;
        }
        rc = kvp_session(o, api, c);
        if (rc != 0) {
            /* Unblock P if it still waits for us. */
            c->ops->abort(c, "D failed");
        }
        pthread_join(th, NULL);
        cp->ops->close(cp);
        c->ops->close(c);
        return rc != 0 || a.rc != 0 ? 1 : 0;
    }
    }
}
