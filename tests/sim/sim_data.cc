// sim_data.cc - the simulated data plane (kvt_data_ops_t): contexts,
// registrations, endpoints, rkeys and get/put runs, all in memory.
//
// A worker address names a context ("SIMW" + id), a packed rkey a context
// and a registration ("SIMK" + ctx id + mem id). post() queues one run-copy
// event per run; the op completes (a later op-done event) once each of its
// runs was copied or canceled. Every copy is checked against the live
// registrations of both sides and by the scenario (World::copy_check)
// before it is performed; a failed check is a violation and the copy is
// not made.
#include "sim_internal.h"

extern "C" {
#include "siphash.h"
}

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "error.h"
}

namespace sim {

World *W()
{
    return World::Get();
}

static void PutU64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

static uint64_t GetU64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, 8);
    return v;
}

// --- completion helpers ----------------------------------------------------

void QueueDone(SimOp *op)
{
    if (op->done_queued) {
        return;
    }
    op->done_queued = true;
    Event ev;
    ev.kind = EvKind::kOpDone;
    ev.node = op->node;
    ev.obj  = op->id;
    W()->Enqueue(ev);
}

// CheckFlushes: a flush completes once no op posted before it on the same
// endpoint has a run left to copy.
void CheckFlushes(uint64_t ep)
{
    World *w = W();

    for (auto &kv : w->ops) {
        SimOp *f = kv.second;

        if (!f->flush || f->ep != ep || f->done_queued) {
            continue;
        }
        bool blocked = false;
        for (auto &kv2 : w->ops) {
            const SimOp *o = kv2.second;

            if (o->id < f->id && !o->flush && o->ep == ep && o->pending > 0) {
                blocked = true;
                break;
            }
        }
        if (!blocked) {
            QueueDone(f);
        }
    }
}

// CancelEpOps: runs of ep not copied yet are canceled with st; their ops
// (and pending flushes) complete later.
void CancelEpOps(SimEp *ep, kvx_status_t st)
{
    World *w = W();

    for (auto &kv : w->ops) {
        SimOp *op = kv.second;

        if (op->ep != ep->id || op->done_queued) {
            continue;
        }
        for (size_t i = 0; i < op->n; i++) {
            if (op->state[i] == 0) {
                op->state[i] = 2;
                op->pending--;
                w->Cancel(EvKind::kRunCopy, op->id, (int)i);
            }
        }
        if (op->status == KVX_OK) {
            op->status = st;
        }
        if (op->pending == 0) {
            QueueDone(op);
        }
    }
}

void ScheduleEpError(SimEp *ep, kvx_status_t st, const char *why,
                            uint64_t delay_us)
{
    Event ev;

    if (ep->err_reported) {
        return;
    }
    W()->Cancel(EvKind::kEpError, ep->id);
    ev.kind   = EvKind::kEpError;
    ev.node   = ep->node;
    ev.obj    = ep->id;
    ev.status = st;
    ev.data   = why;
    ev.due_us = W()->Now() + delay_us;
    W()->Enqueue(ev);
}

// --- contexts ----------------------------------------------------------------

static kvx_status_t CtxCreate(const kvt_data_params_t *p, kvt_ctx_t **ctx_p)
{
    World *w = W();

    if (w->Current() < 0) {
        return kvc_error(KVX_ERR_INTERNAL, "sim: ctx_create outside a node");
    }
    SimCtx *c = new SimCtx;
    c->id     = w->NewId();
    c->node   = w->Current();
    c->p      = *p;
    c->name   = p->name ? p->name : "";
    c->p.name = nullptr;
    c->p.tls = c->p.net_devices = c->p.cpus = nullptr;
    memcpy(c->addr, "SIMW", 4);
    PutU64(c->addr + 4, c->id);
    w->ctxs[c->id] = c;
    Event ev;
    ev.kind   = EvKind::kTick;
    ev.node   = c->node;
    ev.obj    = c->id;
    ev.due_us = w->Now() + kTickUs;
    w->Enqueue(ev);
    *ctx_p = reinterpret_cast<kvt_ctx_t *>(c);
    return KVX_OK;
}

static void EpFree(SimEp *ep);

static void CtxDestroy(kvt_ctx_t *handle)
{
    World  *w = W();
    SimCtx *c = reinterpret_cast<SimCtx *>(handle);
    int     neps = 0, nmems = 0;

    if (c == nullptr) {
        return;
    }
    for (auto it = w->eps.begin(); it != w->eps.end();) {
        SimEp *ep = it->second;
        ++it;
        if (ep->ctx == c->id) {
            neps++;
            CancelEpOps(ep, KVX_ERR_CANCELED);
            EpFree(ep);
        }
    }
    for (auto it = w->mems.begin(); it != w->mems.end();) {
        SimMem *m = it->second;
        if (m->ctx == c->id) {
            nmems++;
            if (m->owned) {
                free(m->base);
            }
            delete m;
            it = w->mems.erase(it);
        } else {
            ++it;
        }
    }
    if (neps > 0 || nmems > 0) {
        char buf[200];
        snprintf(buf, sizeof(buf), "ctx_destroy(%s) with %d endpoints and %d "
                 "registrations still open (kvt.h: released first)",
                 c->name.c_str(), neps, nmems);
        w->Violate(buf);
    }
    // Completions still pending for this context are delivered now (the
    // real one lets its progress thread finish them before it returns).
    DeliverPendingOps(c->id);
    w->Cancel(EvKind::kTick, c->id);
    w->Cancel(EvKind::kTickAt, c->id);
    w->Cancel(EvKind::kJob, c->id);
    // Peers in error mode "peer" learn that this context is gone.
    for (auto &kv : w->eps) {
        SimEp *ep = kv.second;
        if (ep->peer_ctx == c->id && !ep->failed &&
            w->ctxs.at(ep->ctx)->p.err_mode_peer) {
            ScheduleEpError(ep, KVX_ERR_ENDPOINT, "peer context destroyed", 1);
        }
    }
    c->destroyed = true;
    w->Trace("ctx_destroy %s (ctx %" PRIu64 ")", c->name.c_str(), c->id);
}

static void Kick(kvt_ctx_t *ctx)
{
    (void)ctx;
}

// TickAt: one more tick at us (the virtual clock), besides the period;
// one queued per context, at the earliest time asked for (as UCX's).
static void TickAt(kvt_ctx_t *handle, uint64_t us)
{
    SimCtx *c = reinterpret_cast<SimCtx *>(handle);
    World  *w = W();
    Event   ev;

    us = us > w->Now() ? us : w->Now();
    if (c->tick_at != 0 && c->tick_at <= us) {
        return;
    }
    w->Cancel(EvKind::kTickAt, c->id);
    c->tick_at = us;
    ev.kind   = EvKind::kTickAt;
    ev.node   = c->node;
    ev.obj    = c->id;
    ev.due_us = us;
    w->Enqueue(ev);
}

static void Defer(kvt_ctx_t *handle, kvt_job_t *job)
{
    SimCtx *c = reinterpret_cast<SimCtx *>(handle);
    Event   ev;

    ev.kind = EvKind::kJob;
    ev.node = c->node;
    ev.obj  = c->id;
    ev.job  = job;
    W()->Enqueue(ev);
}

static int InProgress(const kvt_ctx_t *handle)
{
    const SimCtx *c = reinterpret_cast<const SimCtx *>(handle);
    World        *w = W();

    return !w->delivering.empty() && w->delivering.back() == c->id;
}

static void WorkerAddress(kvt_ctx_t *handle, const void **addr_p,
                          size_t *len_p)
{
    SimCtx *c = reinterpret_cast<SimCtx *>(handle);

    *addr_p = c->addr;
    *len_p  = sizeof(c->addr);
}

static const char *Version(void)
{
    return "sim";
}

// --- memory ------------------------------------------------------------------

static SimMem *MemNew(SimCtx *c, void *base, size_t len, bool owned)
{
    SimMem *m = new SimMem;

    m->id    = W()->NewId();
    m->ctx   = c->id;
    m->base  = static_cast<uint8_t *>(base);
    m->len   = len;
    m->owned = owned;
    memcpy(m->rkey, "SIMK", 4);
    PutU64(m->rkey + 4, c->id);
    PutU64(m->rkey + 12, m->id);
    W()->mems[m->id] = m;
    return m;
}

static kvx_status_t MemRegister(kvt_ctx_t *handle, void *base, size_t len,
                                int mem_type, kvt_mem_t **mem_p)
{
    (void)mem_type;
    if (base == nullptr || len == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "sim: empty registration");
    }
    *mem_p = reinterpret_cast<kvt_mem_t *>(
        MemNew(reinterpret_cast<SimCtx *>(handle), base, len, false));
    return KVX_OK;
}

static kvx_status_t MemAlloc(kvt_ctx_t *handle, size_t len, kvt_mem_t **mem_p,
                             void **ptr_p)
{
    void *p = calloc(1, len ? len : 1);

    if (p == nullptr) {
        return kvc_error(KVX_ERR_NO_MEMORY, "sim: mem_alloc %zu", len);
    }
    *mem_p = reinterpret_cast<kvt_mem_t *>(
        MemNew(reinterpret_cast<SimCtx *>(handle), p, len, true));
    *ptr_p = p;
    return KVX_OK;
}

static void MemRelease(kvt_mem_t *handle)
{
    SimMem *m = reinterpret_cast<SimMem *>(handle);

    if (m == nullptr) {
        return;
    }
    W()->mems.erase(m->id);
    if (m->owned) {
        free(m->base);
    }
    delete m;
}

static void *MemBase(const kvt_mem_t *h)
{
    return reinterpret_cast<const SimMem *>(h)->base;
}

static size_t MemLength(const kvt_mem_t *h)
{
    return reinterpret_cast<const SimMem *>(h)->len;
}

static void MemRkey(const kvt_mem_t *h, const void **buf_p, size_t *len_p)
{
    const SimMem *m = reinterpret_cast<const SimMem *>(h);

    *buf_p = m->rkey;
    *len_p = sizeof(m->rkey);
}

static int MemTypeOf(const void *ptr)
{
    (void)ptr;
    return 0;
}

// --- endpoints and rkeys ------------------------------------------------------

static kvx_status_t EpCreate(kvt_ctx_t *handle, const void *addr, size_t len,
                             const char *peer_name, kvt_ep_err_fn err_cb,
                             void *err_arg, kvt_ep_t **ep_p)
{
    World  *w = W();
    SimCtx *c = reinterpret_cast<SimCtx *>(handle);

    if (len != 12 || memcmp(addr, "SIMW", 4) != 0) {
        return kvc_error(KVX_ERR_ENDPOINT, "sim: %s: not a worker address "
                         "(%zu bytes)", peer_name ? peer_name : "", len);
    }
    SimEp *ep     = new SimEp;
    ep->id        = w->NewId();
    ep->ctx       = c->id;
    ep->node      = c->node;
    ep->peer_ctx  = GetU64(static_cast<const uint8_t *>(addr) + 4);
    ep->peer_name = peer_name ? peer_name : "";
    ep->cb        = err_cb;
    ep->arg       = err_arg;
    w->eps[ep->id] = ep;
    auto pc = w->ctxs.find(ep->peer_ctx);
    if (pc == w->ctxs.end() || pc->second->destroyed ||
        !w->NodeUp(pc->second->node) || !w->NodeUp(c->node)) {
        ScheduleEpError(ep, KVX_ERR_ENDPOINT, "wire-up failed: peer "
                        "unreachable", 0);
    }
    *ep_p = reinterpret_cast<kvt_ep_t *>(ep);
    return KVX_OK;
}

static void EpFree(SimEp *ep)
{
    World *w = W();

    w->Cancel(EvKind::kEpError, ep->id);
    for (auto &kv : w->rkeys) {
        if (kv.second->ep == ep->id) {
            kv.second->ep = 0; // orphaned: reported by EpClose
        }
    }
    w->eps.erase(ep->id);
    delete ep;
}

static void EpClose(kvt_ep_t *handle)
{
    SimEp *ep = reinterpret_cast<SimEp *>(handle);

    if (ep == nullptr) {
        return;
    }
    if (ep->nrkeys > 0) {
        char buf[200];
        snprintf(buf, sizeof(buf), "ep_close(%s) with %d rkeys still "
                 "unpacked on it (kvt.h: rkeys are destroyed first)",
                 ep->peer_name.c_str(), ep->nrkeys);
        W()->Violate(buf);
    }
    CancelEpOps(ep, KVX_ERR_CANCELED);
    uint64_t id = ep->id;
    EpFree(ep);
    CheckFlushes(id);
}

static void EpFail(kvt_ep_t *handle, kvx_status_t st, const char *reason)
{
    SimEp *ep = reinterpret_cast<SimEp *>(handle);

    if (ep->failed) {
        return;
    }
    ep->failed = true;
    CancelEpOps(ep, st);
    CheckFlushes(ep->id);
    ScheduleEpError(ep, st, reason ? reason : "failed", 0);
}

static const char *EpTransports(const kvt_ep_t *ep)
{
    (void)ep;
    return "sim";
}

static int EpZero(const kvt_ep_t *ep)
{
    (void)ep;
    return 0;
}

static kvx_status_t RkeyUnpack(kvt_ep_t *handle, const void *buf, size_t len,
                               kvt_rkey_t **rkey_p)
{
    SimEp         *ep = reinterpret_cast<SimEp *>(handle);
    const uint8_t *b  = static_cast<const uint8_t *>(buf);

    if (len != 20 || memcmp(b, "SIMK", 4) != 0) {
        return kvc_error(KVX_ERR_HANDSHAKE, "sim: not a packed rkey (%zu "
                         "bytes)", len);
    }
    SimRkey *rk = new SimRkey;
    rk->id  = W()->NewId();
    rk->ep  = ep->id;
    rk->ctx = GetU64(b + 4);
    rk->mem = GetU64(b + 12);
    ep->nrkeys++;
    W()->rkeys[rk->id] = rk;
    *rkey_p = reinterpret_cast<kvt_rkey_t *>(rk);
    return KVX_OK;
}

static void RkeyDestroy(kvt_rkey_t *handle)
{
    SimRkey *rk = reinterpret_cast<SimRkey *>(handle);

    if (rk == nullptr) {
        return;
    }
    auto ep = W()->eps.find(rk->ep);
    if (ep != W()->eps.end()) {
        ep->second->nrkeys--;
    }
    W()->rkeys.erase(rk->id);
    delete rk;
}

static void *RkeyLocal(const kvt_rkey_t *rkey, uint64_t addr)
{
    (void)rkey;
    (void)addr;
    return nullptr;
}

static void Prefault(kvt_rkey_t *rkey, uint64_t addr, size_t len)
{
    (void)rkey;
    (void)addr;
    (void)len;
}

// --- operations ---------------------------------------------------------------

static SimOp *OpNew(SimEp *ep, kvt_op_t *o, size_t n)
{
    SimOp *op = new SimOp;

    op->id      = W()->NewId();
    op->ep      = ep->id;
    op->session = ep->session;
    op->ctx     = ep->ctx;
    op->node    = ep->node;
    op->n       = n;
    op->pending = n;
    op->state.assign(n, 0);
    op->op      = o;
    op->flush   = false;
    op->runs    = nullptr;
    op->is_put  = 0;
    op->local_mem = op->local_base = 0;
    op->rkey_ctx = op->rkey_mem = op->remote_base = 0;
    W()->ops[op->id] = op;
    __atomic_store_n(&o->remaining, (int64_t)n, __ATOMIC_SEQ_CST);
    __atomic_store_n(&o->status, 0, __ATOMIC_SEQ_CST);
    return op;
}

static kvx_status_t Post(kvt_ep_t *handle, int is_put, kvt_mem_t *local_mem,
                         uint64_t local_base, kvt_rkey_t *rkey,
                         uint64_t remote_base, const kvc_run_t *runs, size_t n,
                         kvt_op_t *o)
{
    World   *w  = W();
    SimEp   *ep = reinterpret_cast<SimEp *>(handle);
    SimRkey *rk = reinterpret_cast<SimRkey *>(rkey);

    if (ep->failed) {
        return kvc_error(KVX_ERR_ENDPOINT, "sim: endpoint to %s failed",
                         ep->peer_name.c_str());
    }
    if (rk->ep != ep->id) {
        w->Violate("post on endpoint to " + ep->peer_name +
                   " with an rkey unpacked on another endpoint");
    }
    SimOp *op = OpNew(ep, o, n);
    uint64_t bytes = 0;
    op->is_put      = is_put;
    op->runs        = runs;
    op->local_mem   = reinterpret_cast<SimMem *>(local_mem)->id;
    op->local_base  = local_base;
    op->rkey_ctx    = rk->ctx;
    op->rkey_mem    = rk->mem;
    op->remote_base = remote_base;
    for (size_t i = 0; i < n; i++) {
        Event ev;
        ev.kind = EvKind::kRunCopy;
        ev.node = op->node;
        ev.obj  = op->id;
        ev.idx  = (uint32_t)i;
        w->Enqueue(ev);
        bytes += runs[i].len;
    }
    o->bytes    = bytes;
    o->am_bytes = bytes; // every run is served through the target's
                         // authorize (sim_deliver.cc CopyRun), which counts
    if (n == 0) {
        QueueDone(op);
    }
    return KVX_OK;
}

static void EpSetSession(kvt_ep_t *handle, uint64_t session)
{
    reinterpret_cast<SimEp *>(handle)->session = session;
}

// Notify: the notice travels as an event to the peer context (gated on
// the peer's node: a crashed or isolated peer never gets it; a node that is
// not up sends nothing), data = tag, instance, nonce, mac, xnonce, count
// (8 bytes each; count KVT_NOTICE_UNCOUNTED but for NotifyQueued's) and
// the id, then a NUL and from when there is one.
static kvx_status_t NotifyCounted(kvt_ep_t *handle, uint64_t tag,
                                  uint64_t instance, uint64_t xnonce,
                                  uint64_t nonce, const char *id,
                                  const char *from, uint64_t count);

static kvx_status_t Notify(kvt_ep_t *handle, uint64_t tag, uint64_t instance,
                           uint64_t xnonce, uint64_t nonce, const char *id,
                           const char *from)
{
    return NotifyCounted(handle, tag, instance, xnonce, nonce, id, from,
                         KVT_NOTICE_UNCOUNTED);
}

// NotifyQueued: a counted notice, as an event queued now like any other:
// the scheduler may deliver it before the run copies of the puts it
// follows (a real transport sends it after them on one wire, which
// reorders rarely; here it is common), which the receiver must wait for.
static kvx_status_t NotifyQueued(kvt_ep_t *handle, uint64_t tag,
                                 uint64_t instance, uint64_t xnonce,
                                 uint64_t count, const char *id)
{
    return NotifyCounted(handle, tag, instance, xnonce, 0, id, nullptr,
                         count);
}

static kvx_status_t NotifyCounted(kvt_ep_t *handle, uint64_t tag,
                                  uint64_t instance, uint64_t xnonce,
                                  uint64_t nonce, const char *id,
                                  const char *from, uint64_t count)
{
    World *w  = W();
    SimEp *ep = reinterpret_cast<SimEp *>(handle);
    auto   pc = w->ctxs.find(ep->peer_ctx);

    if (ep->failed) {
        return kvc_error(KVX_ERR_ENDPOINT, "sim: endpoint to %s failed",
                         ep->peer_name.c_str());
    }
    if (pc == w->ctxs.end() || !w->NodeUp(ep->node)) {
        return KVX_OK; // lost, as a message to or from a gone process
    }
    uint8_t hdr[48];

    if (nonce == 0) {
        nonce = w->NewId();
    }
    PutU64(hdr, tag);
    PutU64(hdr + 8, instance);
    PutU64(hdr + 16, nonce);
    PutU64(hdr + 24, kvc_notice_mac(ep->session, tag, nonce, instance, xnonce,
                                    count));
    PutU64(hdr + 32, xnonce);
    PutU64(hdr + 40, count);
    Event ev;
    ev.kind = EvKind::kNotice;
    ev.node = pc->second->node;
    ev.obj  = pc->second->id;
    ev.data = std::string(reinterpret_cast<const char *>(hdr), sizeof(hdr)) +
              id;
    if (from != nullptr && from[0] != '\0') {
        ev.data += std::string(1, '\0') + from;
    }
    w->Enqueue(ev);
    return KVX_OK;
}

// CtlSend: a data-plane control message travels as an event to the peer
// context like a notice; data = nonce, mac (8 bytes each), from, a NUL and
// the message.
static kvx_status_t CtlSend(kvt_ep_t *handle, const char *msg, size_t len,
                            const char *from, uint64_t nonce)
{
    World *w  = W();
    SimEp *ep = reinterpret_cast<SimEp *>(handle);
    auto   pc = w->ctxs.find(ep->peer_ctx);

    if (ep->failed || ep->session == 0 || from == nullptr || from[0] == 0 ||
        len == 0 || len > KVT_CTL_MAX) {
        return kvc_error(KVX_ERR_ENDPOINT, "sim: control message to %s "
                         "refused", ep->peer_name.c_str());
    }
    if (pc == w->ctxs.end() || !w->NodeUp(ep->node)) {
        return KVX_OK; // lost, as a message to or from a gone process
    }
    uint8_t hdr[16];

    PutU64(hdr, nonce);
    PutU64(hdr + 8, kvc_msg_mac(ep->session, nonce, msg, len));
    Event ev;
    ev.kind = EvKind::kDpCtl;
    ev.node = pc->second->node;
    ev.obj  = pc->second->id;
    ev.data = std::string(reinterpret_cast<const char *>(hdr), sizeof(hdr)) +
              from + std::string(1, '\0') + std::string(msg, len);
    w->Enqueue(ev);
    return KVX_OK;
}

static kvx_status_t Flush(kvt_ep_t *handle, kvt_op_t *o)
{
    SimEp *ep = reinterpret_cast<SimEp *>(handle);

    if (ep->failed) {
        return kvc_error(KVX_ERR_ENDPOINT, "sim: endpoint to %s failed",
                         ep->peer_name.c_str());
    }
    SimOp *op = OpNew(ep, o, 0);
    op->flush = true;
    o->bytes  = 0;
    CheckFlushes(ep->id);
    return KVX_OK;
}

extern "C" {
static const kvt_data_ops_t kSimDataOps = {
    "sim",         CtxCreate,   CtxDestroy,   Kick,        Defer,
    InProgress,    WorkerAddress, Version,    MemRegister, MemAlloc,
    MemRelease,    MemBase,     MemLength,    MemRkey,     MemTypeOf,
    EpCreate,      EpClose,     EpFail,       EpTransports, EpZero,
    EpZero,        RkeyUnpack,  RkeyDestroy,  RkeyLocal,   Prefault,
    Post,          Flush,       nullptr,      nullptr,     nullptr,
    EpSetSession,  Notify,      NotifyQueued, CtlSend,
    nullptr,       nullptr,     nullptr,      nullptr, // no caller drive
    TickAt,
};
}

const kvt_data_ops_t *World::DataOps()
{
    return &kSimDataOps;
}

} // namespace sim
