// sim_deliver.cc - delivery of data-plane events (run copies with their
// checks, op completions, deferred jobs, ticks, endpoint errors, notices),
// crashes
// and isolation of nodes, and the final release of the world's objects.
#include "sim_internal.h"

extern "C" {
#include "siphash.h"
}

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sim {

// CopyRun copies run idx of op after its checks; false when it must fail.
static bool CheckRange(World *w, const char *side, const SimMem *m,
                       uint64_t addr, uint64_t len, const SimOp *op)
{
    uint64_t b = (uint64_t)(uintptr_t)m->base;

    if (addr < b || len > m->len || addr - b > m->len - len) {
        char buf[300];
        snprintf(buf, sizeof(buf), "%s of op %" PRIu64 ": range [0x%" PRIx64
                 ", +%" PRIu64 ") outside its registration [0x%" PRIx64
                 ", +%zu)", side, op->id, addr, len, b, m->len);
        w->Violate(buf);
        return false;
    }
    return true;
}

static kvx_status_t CopyRun(World *w, SimOp *op, size_t idx)
{
    const kvc_run_t &run = op->runs[idx];
    const SimCtx    *own = w->ctxs.at(op->ctx);
    char             buf[300];

    if (!w->NodeUp(own->node)) {
        return KVX_ERR_ENDPOINT; // isolated: nothing leaves the node
    }
    auto eit = w->eps.find(op->ep);
    if (eit != w->eps.end() && eit->second->peer_ctx != op->rkey_ctx) {
        snprintf(buf, sizeof(buf), "op %" PRIu64 " on the endpoint to ctx %"
                 PRIu64 " uses an rkey of ctx %" PRIu64, op->id,
                 eit->second->peer_ctx, op->rkey_ctx);
        w->Violate(buf);
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    auto pit = w->ctxs.find(op->rkey_ctx);
    if (pit == w->ctxs.end()) {
        w->Violate("op uses an rkey naming no context");
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    const SimCtx *peer = pit->second;
    if (!w->NodeUp(peer->node)) {
        return KVX_ERR_ENDPOINT; // the peer crashed: the run fails
    }
    auto lm = w->mems.find(op->local_mem);
    auto rm = w->mems.find(op->rkey_mem);
    if (lm == w->mems.end()) {
        snprintf(buf, sizeof(buf), "%s of op %" PRIu64 " on %s: the local "
                 "registration was released before the op completed",
                 op->is_put ? "put" : "get", op->id, own->name.c_str());
        w->Violate(buf);
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    if (peer->destroyed) {
        // The peer's context is gone (engine_destroy; its process lives on
        // and may reuse the memory). Real UCX never reaches a destroyed
        // context's memory: its worker no longer answers (emulated RMA) or
        // the registration is invalid (RDMA), so the run fails at the
        // origin like one to a crashed peer, and nothing is copied.
        w->Trace("  %s of op %" PRIu64 " from %s: the peer context %s was "
                 "destroyed: the run fails", op->is_put ? "put" : "get",
                 op->id, own->name.c_str(), peer->name.c_str());
        return KVX_ERR_ENDPOINT;
    }
    if (rm == w->mems.end()) {
        // A registration released while its context still serves peers:
        // the memory may be reused under the peer's operation.
        snprintf(buf, sizeof(buf), "%s of op %" PRIu64 " from %s: the peer "
                 "%s released the registration it targets (deregistered "
                 "while a peer operation was in flight, the context still "
                 "serving)",
                 op->is_put ? "put" : "get", op->id, own->name.c_str(),
                 peer->name.c_str());
        w->Violate(buf);
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    uint64_t laddr = op->local_base + run.local_off;
    uint64_t raddr = op->remote_base + run.remote_off;
    if (!CheckRange(w, "local side", lm->second, laddr, run.len, op) ||
        !CheckRange(w, "remote side", rm->second, raddr, run.len, op)) {
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    CopyInfo ci;
    ci.is_put   = op->is_put;
    ci.op_id    = op->id;
    ci.len      = run.len;
    if (op->is_put) {
        ci.src      = reinterpret_cast<const void *>(laddr);
        ci.dst      = reinterpret_cast<void *>(raddr);
        ci.src_node = own->node;
        ci.dst_node = peer->node;
    } else {
        ci.src      = reinterpret_cast<const void *>(raddr);
        ci.dst      = reinterpret_cast<void *>(laddr);
        ci.src_node = peer->node;
        ci.dst_node = own->node;
    }
    if (w->copy_check && !w->copy_check(ci)) {
        return KVX_ERR_OUT_OF_BOUNDS;
    }
    // The target's exposure (kvt_data_params_t.authorize, what a transport
    // serving the op in software asks): it must not refuse for good an op
    // the scenario admits, or real transfers would fail for nothing. "Not
    // exposed (yet)" is not flagged: the scenario also admits, and counts,
    // stale reads from a restarted P instance that never held the transfer,
    // which the exposure rightly refuses; an exposure opened too late shows
    // as a failed transfer instead.
    // The request's authenticator, as kvu computes it (nonce: the op id).
    uint64_t     mac  = kvc_req_mac(op->session, op->op->tag, op->id, raddr,
                                    run.len, op->is_put);
    kvx_status_t auth = peer->p.authorize == nullptr
                            ? KVX_OK
                            : peer->p.authorize(peer->p.authorize_arg, op->op->tag,
                                                mac, op->id, raddr, run.len,
                                                op->is_put);
    if (auth != KVX_OK) {
        w->Trace("  %s of op %" PRIu64 " from %s refused by %s's exposure "
                 "(%d)", op->is_put ? "put" : "get", op->id, own->name.c_str(),
                 peer->name.c_str(), (int)auth);
        if (w->copy_check && auth != KVX_ERR_NOT_EXPOSED) {
            snprintf(buf, sizeof(buf), "%s of op %" PRIu64 " from %s: %s "
                     "refuses (%d) %" PRIu64 " bytes at offset %" PRIu64 " of "
                     "its registration that a live transfer owns (exposure "
                     "misses a block)", op->is_put ? "put" : "get", op->id,
                     own->name.c_str(), peer->name.c_str(), (int)auth,
                     run.len,
                     raddr - reinterpret_cast<uint64_t>(rm->second->base));
            w->Violate(buf);
        }
        return auth;
    }
    memmove(ci.dst, ci.src, run.len);
    return KVX_OK;
}

static void DeliverRun(World *w, const Event &ev)
{
    auto it = w->ops.find(ev.obj);

    if (it == w->ops.end() || it->second->state[ev.idx] != 0) {
        return;
    }
    SimOp       *op = it->second;
    kvx_status_t st = CopyRun(w, op, ev.idx);

    if (st == KVX_OK && op->is_put && (w->net_faults() & kFaultTamper) &&
        w->rng().Percent(10)) {
        // A captured put sent again (same bytes, same mac), right away: it
        // writes nothing new, and must not count twice towards a counted
        // notice (else D completes before the puts still on their way).
        w->Trace("  put of op %" PRIu64 " run %u replayed", op->id, ev.idx);
        (void)CopyRun(w, op, ev.idx);
    }

    op->state[ev.idx] = st == KVX_OK ? 1 : 2;
    op->pending--;
    __atomic_store_n(&op->op->remaining, (int64_t)op->pending, __ATOMIC_SEQ_CST);
    if (st != KVX_OK && op->status == KVX_OK) {
        op->status = st;
    }
    if (op->pending == 0) {
        QueueDone(op);
    }
    CheckFlushes(op->ep);
}

static void DeliverDone(World *w, const Event &ev)
{
    auto it = w->ops.find(ev.obj);

    if (it == w->ops.end()) {
        return;
    }
    SimOp    *op = it->second;
    kvt_op_t *o  = op->op;

    w->ops.erase(it);
    __atomic_store_n(&o->remaining, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&o->status, (int)op->status, __ATOMIC_SEQ_CST);
    w->SetCurrent(op->node);
    w->delivering.push_back(op->ctx);
    uint64_t ep = op->ep;
    delete op;
    o->done(o);
    w->delivering.pop_back();
    CheckFlushes(ep);
}

static void DeliverTick(World *w, const Event &ev)
{
    auto it = w->ctxs.find(ev.obj);

    if (it == w->ctxs.end() || it->second->destroyed) {
        return;
    }
    SimCtx *c = it->second;
    Event   next = ev;

    if (ev.kind == EvKind::kTick) { // the period goes on; a tick_at is once
        next.due_us = (ev.due_us > w->Now() ? ev.due_us : w->Now()) + kTickUs;
        w->Enqueue(next);
    } else {
        c->tick_at = 0;
    }
    if (c->p.tick != nullptr) {
        w->SetCurrent(c->node);
        w->delivering.push_back(c->id);
        c->p.tick(c->p.tick_arg);
        w->delivering.pop_back();
    }
}

static void DeliverJob(World *w, const Event &ev)
{
    auto it = w->ctxs.find(ev.obj);

    if (it == w->ctxs.end() || it->second->destroyed) {
        return;
    }
    w->SetCurrent(it->second->node);
    w->delivering.push_back(it->second->id);
    ev.job->fn(ev.job);
    w->delivering.pop_back();
}

static void DeliverEpError(World *w, const Event &ev)
{
    auto it = w->eps.find(ev.obj);

    if (it == w->eps.end() || it->second->err_reported) {
        return;
    }
    SimEp *ep = it->second;

    ep->err_reported = true;
    if (!ep->failed) {
        ep->failed = true;
        CancelEpOps(ep, ev.status);
        CheckFlushes(ep->id);
    }
    if (ep->cb != nullptr) {
        w->SetCurrent(ep->node);
        w->delivering.push_back(ep->ctx);
        ep->cb(ep->arg, reinterpret_cast<kvt_ep_t *>(ep), ev.status,
               ev.data.c_str());
        w->delivering.pop_back();
    }
}

static uint64_t NoticeU64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, 8);
    return v;
}

// DeliverNotice: a Notify (sim_data.cc) reaches its peer context.
static void DeliverNotice(World *w, const Event &ev)
{
    auto it = w->ctxs.find(ev.obj);

    if (it == w->ctxs.end() || it->second->destroyed ||
        it->second->p.notice == nullptr || ev.data.size() <= 48) {
        return;
    }
    SimCtx        *c = it->second;
    const uint8_t *h = reinterpret_cast<const uint8_t *>(ev.data.data());
    std::string    id = ev.data.substr(48), from;
    size_t         nul = id.find('\0');

    if (nul != std::string::npos) {
        from = id.substr(nul + 1);
        id.resize(nul);
    }

    w->SetCurrent(c->node);
    w->delivering.push_back(c->id);
    c->p.notice(c->p.notice_arg, NoticeU64(h), NoticeU64(h + 24),
                NoticeU64(h + 16), NoticeU64(h + 8), NoticeU64(h + 32),
                id.c_str(), id.size(), from.c_str(), NoticeU64(h + 40));
    w->delivering.pop_back();
}

// DeliverDpCtl: a CtlSend (sim_data.cc) reaches its peer context.
static void DeliverDpCtl(World *w, const Event &ev)
{
    auto it = w->ctxs.find(ev.obj);

    if (it == w->ctxs.end() || it->second->destroyed ||
        it->second->p.ctl == nullptr || ev.data.size() <= 16) {
        return;
    }
    SimCtx        *c = it->second;
    const uint8_t *h = reinterpret_cast<const uint8_t *>(ev.data.data());
    std::string    rest = ev.data.substr(16);
    size_t         nul = rest.find('\0');

    if (nul == std::string::npos) {
        return;
    }
    std::string from = rest.substr(0, nul), msg = rest.substr(nul + 1);

    w->SetCurrent(c->node);
    w->delivering.push_back(c->id);
    c->p.ctl(c->p.ctl_arg, msg.c_str(), msg.size(), NoticeU64(h),
             NoticeU64(h + 8), from.c_str());
    w->delivering.pop_back();
}

void World::DataDeliver(const Event &ev)
{
    switch (ev.kind) {
    case EvKind::kRunCopy: DeliverRun(this, ev); break;
    case EvKind::kOpDone:  DeliverDone(this, ev); break;
    case EvKind::kTick:    DeliverTick(this, ev); break;
    case EvKind::kTickAt:  DeliverTick(this, ev); break;
    case EvKind::kJob:     DeliverJob(this, ev); break;
    case EvKind::kEpError: DeliverEpError(this, ev); break;
    case EvKind::kNotice:  DeliverNotice(this, ev); break;
    case EvKind::kDpCtl:   DeliverDpCtl(this, ev); break;
    default: break;
    }
}

// DeliverPendingOps: ctx_destroy completes every op of the context still
// pending (runs not copied are canceled), inside the call.
void DeliverPendingOps(uint64_t ctx)
{
    World *w     = W();
    int    saved = w->Current();

    for (;;) {
        SimOp *op = nullptr;
        for (auto &kv : w->ops) {
            if (kv.second->ctx == ctx) {
                op = kv.second;
                break;
            }
        }
        if (op == nullptr) {
            break;
        }
        for (size_t i = 0; i < op->n; i++) {
            if (op->state[i] == 0) {
                op->state[i] = 2;
                op->pending--;
                w->Cancel(EvKind::kRunCopy, op->id, (int)i);
                op->status = op->status ? op->status : KVX_ERR_CANCELED;
            }
        }
        Event ev;
        ev.kind = EvKind::kOpDone;
        ev.node = op->node;
        ev.obj  = op->id;
        w->Cancel(EvKind::kOpDone, op->id);
        DeliverDone(w, ev);
    }
    w->SetCurrent(saved);
}

// DataCrash: endpoints (elsewhere) to the node's contexts fail after a
// keep-alive delay, when their context asked for peer failures.
void World::DataCrash(int node)
{
    for (auto &kv : eps) {
        SimEp *ep = kv.second;
        auto   pc = ctxs.find(ep->peer_ctx);

        if (pc == ctxs.end() || pc->second->node != node || ep->node == node ||
            ep->failed || !ctxs.at(ep->ctx)->p.err_mode_peer) {
            continue;
        }
        ScheduleEpError(ep, KVX_ERR_ENDPOINT, "peer unreachable (crashed)",
                        1 + rng().Below(300000));
    }
}

// DataIsolate: a crashed node revived for cleanup reaches no peer.
void World::DataIsolate(int node)
{
    for (auto &kv : eps) {
        SimEp *ep = kv.second;

        if (ep->node == node && !ep->failed) {
            ScheduleEpError(ep, KVX_ERR_ENDPOINT, "network unreachable", 0);
        }
    }
}

void World::DataFini()
{
    for (auto &kv : ops) {
        delete kv.second;
    }
    ops.clear();
    for (auto &kv : rkeys) {
        delete kv.second;
    }
    rkeys.clear();
    for (auto &kv : eps) {
        delete kv.second;
    }
    eps.clear();
    for (auto &kv : mems) {
        if (kv.second->owned) {
            free(kv.second->base);
        }
        delete kv.second;
    }
    mems.clear();
    for (auto &kv : ctxs) {
        delete kv.second;
    }
    ctxs.clear();
}

} // namespace sim
