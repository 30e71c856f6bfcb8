// sim_ctl.cc - the simulated control plane (kvt_ctl_ops_t): servers bound
// to "host:port", clients with a bounded number of requests in flight, each
// with a deadline, and the delivery of requests, replies and timeouts.
//
// A request to an address where no server listens (never bound, destroyed,
// or its node crashed) is lost: its client sees KVX_ERR_TIMEOUT at the
// deadline, as with nng, which keeps dialling. A message above the server's
// max_msg is dropped the same way. A client on an isolated node fails fast
// with KVX_ERR_CONTROL. client_close completes every pending request with
// KVX_ERR_CANCELED before it returns (kvt.h), inside the call. A cut
// between two nodes' control planes (the partition fault) resets their
// connections: requests in flight between them fail at once
// (KVX_ERR_CONTROL, as nng 1.5's REQ on a closed pipe), requests posted
// meanwhile are held and delivered at the heal unless they timed out.
#include "sim_internal.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "error.h"
}

namespace sim {

static std::string HostPort(const std::string &host, uint32_t port)
{
    return host + ":" + std::to_string(port);
}

static kvx_status_t ServerCreate(const char *host, uint32_t port, int nctx,
                                 size_t max_msg, const kvt_ctl_sec_t *sec,
                                 kvt_handler_fn fn, void *arg,
                                 kvt_server_t **srv_p)
{
    World *w = W();

    (void)nctx;
    if (sec != nullptr) {
        return kvc_error(KVX_ERR_CONFIG, "sim: the simulated control plane "
                         "has no TLS");
    }
    if (w->Current() < 0) {
        return kvc_error(KVX_ERR_INTERNAL, "sim: server_create outside a "
                         "node");
    }
    const Node &n = w->GetNode(w->Current());
    if (strcmp(host, "0.0.0.0") != 0 && strcmp(host, "::") != 0 &&
        n.host != host) {
        return kvc_error(KVX_ERR_CONFIG, "sim: node %s (%s) cannot bind %s:%u",
                         n.name.c_str(), n.host.c_str(), host, port);
    }
    std::string key = HostPort(n.host, port);
    if (w->bound.count(key) != 0) {
        return kvc_error(KVX_ERR_CONFIG, "sim: %s: address in use",
                         key.c_str());
    }
    SimServer *s = new SimServer;
    s->id      = w->NewId();
    s->node    = n.id;
    s->key     = key;
    s->max_msg = max_msg;
    s->fn      = fn;
    s->arg     = arg;
    w->servers[s->id] = s;
    w->bound[key]     = s->id;
    w->Trace("listen %s (node %d)", key.c_str(), n.id);
    *srv_p = reinterpret_cast<kvt_server_t *>(s);
    w->CtlConnCheck();
    return KVX_OK;
}

static void ServerDestroy(kvt_server_t *handle)
{
    World     *w = W();
    SimServer *s = reinterpret_cast<SimServer *>(handle);

    if (s == nullptr) {
        return;
    }
    auto b = w->bound.find(s->key);
    if (b != w->bound.end() && b->second == s->id) {
        w->bound.erase(b);
    }
    w->servers.erase(s->id);
    delete s;
    w->CtlConnCheck();
}

static kvx_status_t ClientOpen(const char *host, uint32_t port, int nctx,
                               const kvt_ctl_sec_t *sec, kvt_client_t **cli_p)
{
    World *w = W();

    if (sec != nullptr) {
        return kvc_error(KVX_ERR_CONFIG, "sim: the simulated control plane "
                         "has no TLS");
    }
    if (w->Current() < 0) {
        return kvc_error(KVX_ERR_INTERNAL, "sim: client_open outside a node");
    }
    SimClient *c = new SimClient;
    c->id   = w->NewId();
    c->node = w->Current();
    c->to   = HostPort(host, port);
    c->from = HostPort(w->GetNode(c->node).host,
                       (uint32_t)(30000 + c->id % 30000));
    c->nctx = nctx > 0 ? nctx : 1;
    w->clients[c->id] = c;
    *cli_p = reinterpret_cast<kvt_client_t *>(c);
    return KVX_OK;
}

static void Finish(World *w, SimRequest *r, kvx_status_t st,
                   const std::string &data)
{
    r->done = true;
    auto c = w->clients.find(r->client);
    if (c != w->clients.end()) {
        c->second->inflight--;
    }
    w->Cancel(EvKind::kCtlTimeout, r->id);
    w->Cancel(EvKind::kCtlReply, r->id);
    if (r->fn == nullptr) {
        return;
    }
    w->SetCurrent(r->node);
    if (st == KVX_OK) {
        r->fn(r->arg, st, data.c_str(), data.size(), nullptr);
    } else {
        r->fn(r->arg, st, nullptr, 0, data.c_str());
    }
}

static kvx_status_t ClientPost(kvt_client_t *handle, const void *msg,
                               size_t len, int timeout_ms, kvt_reply_fn fn,
                               void *arg)
{
    World     *w = W();
    SimClient *c = reinterpret_cast<SimClient *>(handle);

    if (c->inflight >= c->nctx) {
        return kvc_error(KVX_ERR_BAD_STATE, "sim: client to %s: all %d "
                         "contexts busy", c->to.c_str(), c->nctx);
    }
    SimRequest *r = new SimRequest;
    r->id     = w->NewId();
    r->client = c->id;
    r->node   = c->node;
    r->from   = c->from;
    r->to     = c->to;
    r->fn     = fn;
    r->arg    = arg;
    w->requests[r->id] = r;
    c->inflight++;

    Event ev;
    ev.obj  = r->id;
    ev.node = c->node;
    r->data.assign(static_cast<const char *>(msg), len);
    if (w->NodeUp(c->node)) {
        ev.kind = EvKind::kCtlRequest;
        ev.node = -1; // in the network
        ev.data = r->data;
    } else {
        ev.kind   = EvKind::kCtlReply;
        ev.status = KVX_ERR_CONTROL;
        ev.data   = "network unreachable";
    }
    w->Enqueue(ev);
    Event to;
    to.kind   = EvKind::kCtlTimeout;
    to.node   = c->node;
    to.obj    = r->id;
    to.due_us = w->Now() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000;
    w->Enqueue(to);
    return KVX_OK;
}

static void ClientClose(kvt_client_t *handle)
{
    World     *w = W();
    SimClient *c = reinterpret_cast<SimClient *>(handle);

    if (c == nullptr) {
        return;
    }
    int saved = w->Current();
    for (auto &kv : w->requests) {
        SimRequest *r = kv.second;
        if (r->client == c->id && !r->done) {
            Finish(w, r, KVX_ERR_CANCELED, "client closed");
        }
    }
    w->SetCurrent(saved);
    w->clients.erase(c->id);
    delete c;
}

// ServerNode: the node of the server bound at "host:port" to (-1: none).
static int ServerNode(World *w, const std::string &to)
{
    auto b = w->bound.find(to);
    if (b == w->bound.end()) {
        return -1;
    }
    auto s = w->servers.find(b->second);
    return s != w->servers.end() ? s->second->node : -1;
}

// ConnUp: whether c's connection is up: its server is bound on a node
// that runs, and no cut lies between the two nodes.
static bool ConnUp(World *w, const SimClient *c)
{
    int srv = ServerNode(w, c->to);
    return w->NodeUp(c->node) && srv >= 0 && w->NodeUp(srv) &&
           !w->CtlCut(c->node, srv);
}

// ClientWatch: with conn_events on, fn hears that the connection is up
// now (inside the call, as kvt.h allows) and every change after, once it
// was up (CtlConnCheck): like nng's pipe events, a client that never
// connected hears nothing. Off, nothing at all (the simulator had no
// connection events before the partition fault; the other classes keep
// their runs).
static void ClientWatch(kvt_client_t *handle, kvt_conn_fn fn, void *arg)
{
    World     *w = W();
    SimClient *c = reinterpret_cast<SimClient *>(handle);

    c->watch_fn  = fn;
    c->watch_arg = arg;
    if (w->conn_events() && ConnUp(w, c)) {
        c->watch_up = 1;
        fn(arg, 1);
    }
}

void World::CtlConnCheck()
{
    if (!conn_events_) {
        return;
    }
    int saved = Current();
    for (auto &kv : clients) {
        SimClient *c  = kv.second;
        int        up = ConnUp(this, c) ? 1 : 0;

        if (c->watch_fn != nullptr && up != c->watch_up &&
            !(c->watch_up < 0 && !up) &&
            StateOf(c->node) != NodeState::kCrashed) {
            c->watch_up = up;
            Trace("  connection of node %d to %s %s", c->node, c->to.c_str(),
                  up ? "up" : "lost");
            SetCurrent(c->node);
            c->watch_fn(c->watch_arg, up);
        }
    }
    SetCurrent(saved);
}

static std::pair<int, int> CutKey(int a, int b)
{
    return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
}

void World::CutCtl(int a, int b)
{
    Trace("CUT the control planes of nodes %d and %d", a, b);
    if (ctl_cut_[CutKey(a, b)]++ > 0) {
        return; // (already cut: nothing changes)
    }
    // The connections reset: requests in flight between the two fail at
    // once (ids first: a reply function may post new requests).
    std::vector<uint64_t> reset;
    for (auto &kv : requests) {
        SimRequest *r   = kv.second;
        int         srv =
            r->srv_node >= 0 ? r->srv_node : ServerNode(this, r->to);
        if (!r->done && !r->parked && r->client != 0 && srv >= 0 &&
            CutKey(r->node, srv) == CutKey(a, b)) {
            reset.push_back(kv.first);
        }
    }
    int saved = Current();
    for (uint64_t id : reset) {
        auto it = requests.find(id);
        if (it != requests.end() && !it->second->done) {
            Cancel(EvKind::kCtlRequest, id);
            Finish(this, it->second, KVX_ERR_CONTROL,
                   "sim: connection reset (control planes cut)");
        }
    }
    SetCurrent(saved);
    CtlConnCheck();
}

void World::HealCtl(int a, int b)
{
    auto k = ctl_cut_.find(CutKey(a, b));
    if (k == ctl_cut_.end() || --k->second > 0) {
        Trace("HEAL one cut of nodes %d and %d (another stays)", a, b);
        return;
    }
    Trace("HEAL the control planes of nodes %d and %d", a, b);
    ctl_cut_.erase(k);
    CtlConnCheck();
    // The requests the cut held go now, in the order they were posted.
    for (auto &kv : requests) {
        SimRequest *r = kv.second;
        if (r->parked && !r->done && r->srv_node >= 0 &&
            CutKey(r->node, r->srv_node) == CutKey(a, b)) {
            Event ev;
            r->parked = false;
            ev.kind   = EvKind::kCtlRequest;
            ev.node   = -1;
            ev.obj    = r->id;
            ev.data   = r->data;
            Enqueue(ev);
        }
    }
}

bool World::CtlCut(int a, int b) const
{
    return ctl_cut_.count(CutKey(a, b)) != 0;
}

extern "C" {
static const kvt_ctl_ops_t kSimCtlOps = {
    "sim", ServerCreate, ServerDestroy, ClientOpen, ClientPost, ClientClose,
    ClientWatch,
};
}

const kvt_ctl_ops_t *World::CtlOps()
{
    return &kSimCtlOps;
}

void World::InjectRequest(const std::string &from_host, const std::string &to,
                          const std::string &msg)
{
    SimRequest *r = new SimRequest;

    r->id     = NewId();
    r->client = 0;
    r->node   = -1;
    r->from   = from_host + ":" + std::to_string(20000 + r->id % 10000);
    r->to     = to;
    requests[r->id] = r;
    Event ev;
    ev.kind = EvKind::kCtlRequest;
    ev.obj  = r->id;
    ev.data = msg;
    Enqueue(ev);
}

static void DeliverRequest(World *w, const Event &ev)
{
    auto rit = w->requests.find(ev.obj);
    if (rit == w->requests.end()) {
        return;
    }
    SimRequest *r = rit->second;
    auto        b = w->bound.find(r->to);
    if (b == w->bound.end()) {
        w->Trace("  no server at %s: lost", r->to.c_str());
        return;
    }
    SimServer *s = w->servers.at(b->second);
    if (!w->NodeUp(s->node) || ev.data.size() > s->max_msg) {
        w->Trace("  dropped by %s", r->to.c_str());
        return;
    }
    if (r->node >= 0 && w->CtlCut(r->node, s->node)) {
        w->Trace("  held: the control planes of nodes %d and %d are cut",
                 r->node, s->node);
        r->srv_node = s->node;
        r->parked   = true;
        return;
    }
    r->srv_node = s->node;
    char  *reply = nullptr;
    size_t rlen  = 0;
    w->SetCurrent(s->node);
    s->fn(s->arg, r->from.c_str(), ev.data.data(), ev.data.size(), &reply,
          &rlen);
    if (r->client != 0 && !r->done) {
        Event rep;
        rep.kind = EvKind::kCtlReply;
        rep.node = r->node;
        rep.obj  = r->id;
        if (reply != nullptr) {
            rep.data.assign(reply, rlen);
        }
        w->Enqueue(rep);
    } else if (reply != nullptr) {
        w->Trace("  reply to %s discarded: '%.120s'", r->from.c_str(), reply);
    }
    free(reply);
}

void World::CtlDeliver(const Event &ev)
{
    if (ev.kind == EvKind::kCtlRequest) {
        DeliverRequest(this, ev);
        return;
    }
    auto rit = requests.find(ev.obj);
    if (rit == requests.end() || rit->second->done) {
        return;
    }
    SimRequest *r = rit->second;
    if (ev.kind == EvKind::kCtlTimeout) {
        Finish(this, r, KVX_ERR_TIMEOUT, "sim: request timed out");
    } else if (!NodeUp(r->node)) {
        Finish(this, r, KVX_ERR_CONTROL, "network unreachable");
    } else {
        Finish(this, r, ev.status, ev.data);
    }
}

// CtlCrash: the node's listeners vanish with it.
void World::CtlCrash(int node)
{
    for (auto &kv : servers) {
        auto b = bound.find(kv.second->key);
        if (kv.second->node == node && b != bound.end() &&
            b->second == kv.first) {
            bound.erase(b);
        }
    }
    CtlConnCheck();
}

void World::CtlFini()
{
    for (auto &kv : servers) {
        delete kv.second;
    }
    servers.clear();
    bound.clear();
    for (auto &kv : clients) {
        delete kv.second;
    }
    clients.clear();
    for (auto &kv : requests) {
        delete kv.second;
    }
    requests.clear();
}

} // namespace sim
