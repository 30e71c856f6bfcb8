// simnet.h - the deterministic simulator's world: in-memory transports
// behind the engine's seam (plugin/common/kvt.h), a virtual clock and a
// seeded scheduler.
//
// One World holds every simulated node (one engine process each), data-plane
// context, registration, endpoint, rkey, operation, control server, client,
// request and every pending event. Nothing runs on another thread, nothing
// touches a socket or the host clock: a step picks one enabled event with
// the world's RNG and delivers it. Same seed, same calls -> same run.
//
// The ops tables are plain C function tables without a context argument, so
// there is one World at a time (World::Get()), and calls that create objects
// (ctx_create, server_create, client_open) belong to the "current" node: the
// driver sets it before calling into an engine, the scheduler while it
// delivers an event.
#ifndef KVX_SIMNET_H
#define KVX_SIMNET_H

extern "C" {
#include "kvt.h"
}

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace sim {

// Rng: splitmix64. Every decision of the simulator comes from one of these.
class Rng {
public:
    explicit Rng(uint64_t seed = 0) : s_(seed) {}
    uint64_t Next();
    uint64_t Below(uint64_t n); // [0, n), n > 0
    bool     Percent(uint32_t p) { return Below(100) < p; }

private:
    uint64_t s_;
};

// Network fault classes the scheduler may inject into control messages.
enum NetFault : uint32_t {
    kFaultDup   = 1u << 0, // deliver a request twice
    kFaultDelay = 1u << 1, // hold a request for up to a few virtual seconds
    kFaultLag   = 1u << 2, // hold a reply up to 100 virtual ms: messages
                           // sent after it (other connections) overtake it
    kFaultSlow  = 1u << 3, // hold a data run up to 1.5 virtual s (5 %)
    kFaultTamper = 1u << 4, // before a data-plane control message (30 %):
                            // a copy naming other blocks, with one byte
                            // flipped, claiming another sender, or a
                            // replay (at once or up to 6 s later); a
                            // notice's nonce or count changed; a put
                            // replayed right after it landed (10 %)
};

enum class NodeState {
    kAlive,
    kCrashed,  // frozen: its events wait, its servers are gone
    kIsolated, // crashed, revived for cleanup: local events run, no network
};

enum class EvKind : uint8_t {
    kCtlRequest, // a request reaches a server
    kCtlReply,   // a reply (or a fast failure) reaches a client
    kCtlTimeout, // a request's deadline (timer)
    kRunCopy,    // one run of a get/put is copied
    kOpDone,     // an op's completion callback
    kJob,        // a deferred job
    kTick,       // a context's periodic tick (timer)
    kTickAt,     // a tick a context asked for (tick_at; timer, once)
    kEpError,    // an endpoint's error callback
    kNotice,     // a completion notice reaches its peer context
    kDpCtl,      // a data-plane control message reaches its peer context
};

struct Event {
    uint64_t     seq    = 0;
    EvKind       kind   = EvKind::kJob;
    uint64_t     due_us = 0;  // > now: a timer
    int          node   = -1; // whose state gates it (-1: none)
    uint64_t     obj    = 0;  // request / op / ctx / ep id
    uint32_t     idx    = 0;  // run index
    kvx_status_t status = KVX_OK;
    std::string  data;        // message bytes or reason
    kvt_job_t   *job    = nullptr;
};

// CopyInfo: one run about to be copied, for the scenario's checks.
struct CopyInfo {
    int         is_put;
    int         src_node, dst_node; // node ids
    const void *src;
    void       *dst;
    uint64_t    len;
    uint64_t    op_id;
};

struct Node {
    int         id;
    std::string host;
    std::string name;
    NodeState   state = NodeState::kAlive;
};

struct SimCtx;
struct SimMem;
struct SimEp;
struct SimRkey;
struct SimOp;
struct SimServer;
struct SimClient;
struct SimRequest;

class World {
public:
    explicit World(uint64_t seed);
    ~World();
    static World *Get();

    // --- nodes ------------------------------------------------------------
    int  AddNode(const std::string &host, const std::string &name);
    // Crash: the node's servers vanish, its events freeze, peers' endpoints
    // to it fail (err_cb, later) and runs against it fail.
    void Crash(int node);
    // Isolate: a crashed node runs again for its cleanup, cut off from the
    // network (its requests fail, its runs fail, its endpoints fail).
    void Isolate(int node);
    const Node &GetNode(int node) const { return nodes_.at((size_t)node); }
    void SetCurrent(int node) { current_ = node; }
    int  Current() const { return current_; }

    // --- transports and clock --------------------------------------------
    static const kvt_data_ops_t *DataOps();
    static const kvt_ctl_ops_t  *CtlOps();
    kvt_env_t Env();

    // --- scheduler ----------------------------------------------------------
    // Step runs one step (top level); false when nothing is pending at all.
    bool Step();
    // WaitUntil: the clock's wait (engine lock released by the caller).
    void WaitUntil(uint64_t deadline_us);
    // RunFor runs steps until virtual time passed `us` or nothing is pending.
    void RunFor(uint64_t us);
    uint64_t Now() const { return now_us_; }
    uint64_t Steps() const { return steps_; }
    int      Depth() const { return depth_; }
    Rng     &rng() { return rng_; }
    Rng     &engine_rng() { return eng_rng_; }
    // Engine instance ids started in this world (ordering of same-instant
    // starts; kvt_clock_t.random64).
    uint64_t inst_seq = 0;
    void     set_net_faults(uint32_t f) { net_faults_ = f; }
    uint32_t net_faults() const { return net_faults_; }
    // Stranger: a request from an unknown host (reply discarded).
    void InjectRequest(const std::string &from_host, const std::string &to,
                       const std::string &msg);
    size_t PendingEvents() const { return events_.size(); }

    // --- control-plane partitions (the partition fault) -------------------
    // CutCtl / HealCtl: the connections between the two nodes' control
    // planes reset (as nng 1.5 does, the requests in flight on them fail at
    // once with KVX_ERR_CONTROL) and cannot come back until the last cut of
    // the pair heals; requests posted meanwhile wait in the client's queue
    // and go at the heal unless their deadline passed first. The data plane
    // is not touched. With conn_events on, each client an engine watches
    // (kvt_ctl_ops_t.client_watch) learns when its connection, once up, is
    // lost or comes back: a cut, a heal, its server bound or gone, a node
    // crashed (CtlConnCheck); a client never connected hears nothing, as
    // with nng. Off, watched clients hear nothing at all, as before this
    // fault existed.
    void CutCtl(int a, int b);
    void HealCtl(int a, int b);
    bool CtlCut(int a, int b) const;
    void set_conn_events(bool on) { conn_events_ = on; }
    bool conn_events() const { return conn_events_; }
    void CtlConnCheck();

    // --- checks and trace --------------------------------------------------
    // Violate records the first invariant violation (the copy that caused it
    // is not performed).
    void Violate(const std::string &what);
    bool Violated() const { return !violation_.empty(); }
    const std::string &Violation() const { return violation_; }
    uint64_t ViolationStep() const { return violation_step_; }
    void set_trace(bool on) { trace_ = on; }
    bool trace() const { return trace_; }
    void Trace(const char *fmt, ...) __attribute__((format(printf, 2, 3)));

    std::function<bool(const CopyInfo &)> copy_check; // before each copy:
                                                      // false = refused
    std::function<void()>                 after_step; // after every step
    // Scenario actions compete with events at every step (nested ones
    // too): action_weight() is their total weight now (0: none), action()
    // runs one of them when the scheduler picks it.
    std::function<uint64_t()>             action_weight;
    std::function<void()>                 action;

    // --- used by the ops implementations (sim_data.cc, sim_ctl.cc) ---------
    uint64_t NewId() { return ++next_id_; }
    uint64_t Enqueue(Event ev);
    void     Cancel(EvKind kind, uint64_t obj, int idx = -1);
    NodeState StateOf(int node) const;
    bool      NodeUp(int node) const { return StateOf(node) == NodeState::kAlive; }

    std::map<uint64_t, SimCtx *>     ctxs;
    std::map<uint64_t, SimMem *>     mems;
    std::map<uint64_t, SimEp *>      eps;
    std::map<uint64_t, SimRkey *>    rkeys;
    std::map<uint64_t, SimOp *>      ops;
    std::map<uint64_t, SimServer *>  servers;
    std::map<std::string, uint64_t>  bound; // "host:port" -> server id
    std::map<uint64_t, SimClient *>  clients;
    std::map<uint64_t, SimRequest *> requests;
    std::vector<uint64_t>            delivering; // ctx ids (innermost last)

    // Data-plane internals shared by the scheduler.
    void DataDeliver(const Event &ev);
    void CtlDeliver(const Event &ev);
    void DataCrash(int node);
    void DataIsolate(int node);
    void CtlCrash(int node);
    void DataFini();
    void CtlFini();

private:
    bool StepLimit(uint64_t limit_us);
    void Deliver(const Event &ev);
    std::string Describe(const Event &ev) const;

    static World *the_;
    Rng                        rng_, eng_rng_;
    uint64_t                   now_us_   = 1000000;
    uint64_t                   steps_    = 0;
    uint64_t                   next_id_  = 0;
    uint64_t                   next_seq_ = 0;
    int                        current_  = -1;
    int                        depth_    = 0;
    uint32_t                   net_faults_ = 0;
    bool                       trace_ = false;
    bool                       conn_events_ = false;
    std::map<std::pair<int, int>, int> ctl_cut_; // (lower node, higher
                                                 // node) -> cuts not healed
    std::vector<Node>          nodes_;
    std::map<uint64_t, Event>  events_; // by seq
    std::string                violation_;
    uint64_t                   violation_step_ = 0;
};

} // namespace sim

#endif
