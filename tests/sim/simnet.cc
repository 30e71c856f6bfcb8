// simnet.cc - the world: nodes, the event queue, the seeded scheduler and
// the virtual clock (see simnet.h). The transports are in sim_data.cc and
// sim_ctl.cc.
#include "simnet.h"

#include <cctype>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace sim {

World *World::the_ = nullptr;

// Weights of the scheduler's choices: every ready event alike, and moving
// virtual time to the next timer (which leaves ready events waiting: the
// network's and the NIC's latency).
static const uint64_t kWeightReady   = 10;
static const uint64_t kWeightAdvance = 3;
// Longest virtual time one clock wait may cover (an engine passing "no
// deadline" still gets control back).
static const uint64_t kMaxWaitUs = 3600ull * 1000000ull;

uint64_t Rng::Next()
{
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t Rng::Below(uint64_t n)
{
    return n <= 1 ? 0 : Next() % n;
}

World::World(uint64_t seed)
    : rng_(seed), eng_rng_(seed ^ 0x5eed5eed5eed5eedull)
{
    if (the_ != nullptr) {
        fprintf(stderr, "sim: one World at a time\n");
        abort();
    }
    the_ = this;
}

World::~World()
{
    DataFini();
    CtlFini();
    the_ = nullptr;
}

World *World::Get()
{
    return the_;
}

int World::AddNode(const std::string &host, const std::string &name)
{
    Node n;

    n.id   = (int)nodes_.size();
    n.host = host;
    n.name = name;
    nodes_.push_back(n);
    return n.id;
}

NodeState World::StateOf(int node) const
{
    return node < 0 ? NodeState::kAlive : nodes_.at((size_t)node).state;
}

void World::Crash(int node)
{
    Trace("CRASH node %d (%s)", node, nodes_.at((size_t)node).name.c_str());
    nodes_.at((size_t)node).state = NodeState::kCrashed;
    CtlCrash(node);
    DataCrash(node);
}

void World::Isolate(int node)
{
    Trace("ISOLATE node %d (%s) for its cleanup", node,
          nodes_.at((size_t)node).name.c_str());
    nodes_.at((size_t)node).state = NodeState::kIsolated;
    DataIsolate(node);
}

uint64_t World::Enqueue(Event ev)
{
    ev.seq = ++next_seq_;
    events_[ev.seq] = ev;
    return ev.seq;
}

void World::Cancel(EvKind kind, uint64_t obj, int idx)
{
    for (auto it = events_.begin(); it != events_.end();) {
        if (it->second.kind == kind && it->second.obj == obj &&
            (idx < 0 || it->second.idx == (uint32_t)idx)) {
            it = events_.erase(it);
        } else {
            ++it;
        }
    }
}

void World::Violate(const std::string &what)
{
    if (violation_.empty()) {
        violation_      = what;
        violation_step_ = steps_;
        Trace("VIOLATION: %s", what.c_str());
    } else {
        Trace("(after the first violation) %s", what.c_str());
    }
}

void World::Trace(const char *fmt, ...)
{
    if (!trace_) {
        return;
    }
    va_list ap;

    va_start(ap, fmt);
    printf("[%" PRIu64 " t=%.6f%s] ", steps_, (double)now_us_ / 1e6,
           depth_ > 0 ? " w" : "");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static const char *KindName(EvKind k)
{
    switch (k) {
    case EvKind::kCtlRequest: return "ctl-request";
    case EvKind::kCtlReply:   return "ctl-reply";
    case EvKind::kCtlTimeout: return "ctl-timeout";
    case EvKind::kRunCopy:    return "run-copy";
    case EvKind::kOpDone:     return "op-done";
    case EvKind::kJob:        return "job";
    case EvKind::kTick:       return "tick";
    case EvKind::kTickAt:     return "tick-at";
    case EvKind::kEpError:    return "ep-error";
    case EvKind::kNotice:     return "notice";
    case EvKind::kDpCtl:      return "dp-ctl";
    }
    return "?";
}

std::string World::Describe(const Event &ev) const
{
    char buf[160];

    snprintf(buf, sizeof(buf), "%s #%" PRIu64 "/%u node %d", KindName(ev.kind),
             ev.obj, ev.idx, ev.node);
    std::string s = buf;
    if (!ev.data.empty() && (ev.kind == EvKind::kCtlRequest ||
                             ev.kind == EvKind::kCtlReply ||
                             ev.kind == EvKind::kEpError)) {
        std::string d = ev.data.substr(0, 160);
        for (char &c : d) {
            if (c < 32 || c > 126) {
                c = '.';
            }
        }
        s += " '" + d + (ev.data.size() > 160 ? "...'" : "'");
    }
    return s;
}

// StepLimit: one step among the events enabled now and the first timer due
// by limit_us. Returns false when there is none.
bool World::StepLimit(uint64_t limit_us)
{
    std::vector<uint64_t> ready;
    const Event          *timer = nullptr;

    for (const auto &kv : events_) {
        const Event &e = kv.second;

        if (e.node >= 0 && StateOf(e.node) == NodeState::kCrashed) {
            continue; // frozen with its node
        }
        if (e.due_us <= now_us_) {
            ready.push_back(kv.first);
        } else if (e.due_us <= limit_us &&
                   (timer == nullptr || e.due_us < timer->due_us)) {
            timer = &e;
        }
    }
    uint64_t aw = action_weight ? action_weight() : 0;

    if (ready.empty() && timer == nullptr && aw == 0) {
        return false;
    }
    uint64_t total = ready.size() * kWeightReady +
                     (timer != nullptr ? kWeightAdvance : 0) + aw;
    uint64_t r     = rng_.Below(total);
    uint64_t seq;

    if (r >= total - aw) {
        steps_++;
        action();
        if (after_step) {
            after_step();
        }
        return true;
    }
    if (r < ready.size() * kWeightReady) {
        seq = ready[r / kWeightReady];
    } else {
        now_us_ = timer->due_us;
        seq     = timer->seq;
    }
    Event ev = events_[seq];

    events_.erase(seq);
    steps_++;
    if ((ev.kind == EvKind::kCtlRequest || ev.kind == EvKind::kDpCtl) &&
        (net_faults_ & kFaultDelay) && rng_.Percent(3)) {
        ev.due_us = now_us_ + 1 + rng_.Below(3000000);
        Trace("delay %s until t=%.6f", Describe(ev).c_str(),
              (double)ev.due_us / 1e6);
        Enqueue(ev);
    } else if (ev.kind == EvKind::kRunCopy && (net_faults_ & kFaultSlow) &&
               ev.due_us <= now_us_ && rng_.Percent(25)) {
        ev.due_us = now_us_ + 1 + rng_.Below(1500000);
        Trace("slow %s until t=%.6f", Describe(ev).c_str(),
              (double)ev.due_us / 1e6);
        Enqueue(ev);
    } else if (ev.kind == EvKind::kCtlReply && (net_faults_ & kFaultLag) &&
               rng_.Percent(20)) {
        ev.due_us = now_us_ + 1 + rng_.Below(100000);
        Trace("lag %s until t=%.6f", Describe(ev).c_str(),
              (double)ev.due_us / 1e6);
        Enqueue(ev);
    } else {
        if (ev.kind == EvKind::kDpCtl && (net_faults_ & kFaultTamper) &&
            rng_.Percent(30)) {
            // What an attacker on the path could do with it: point it at
            // other blocks of D (still well-formed: taken, P would put
            // there), change any byte, claim another sender (its session
            // does not give that mac: refused), or replay it (its nonce
            // was taken: refused), at once or up to 6 s later (then also
            // outside the freshness window). Delivered before the real one
            // but the late replay.
            Event    bad = ev;
            uint64_t k   = rng_.Below(5);
            size_t   nul = bad.data.find('\0', 16);
            size_t   ids = bad.data.find("\"block_notify_list\":[");

            if (k == 0 && ids != std::string::npos &&
                isdigit((unsigned char)bad.data[ids + 21])) {
                char &d = bad.data[ids + 21];
                d       = d == '9' ? '8' : (char)(d + 1);
            } else if (k == 1 && nul != std::string::npos &&
                       nul + 1 < bad.data.size()) {
                bad.data[nul + 1 + rng_.Below(bad.data.size() - nul - 1)] ^=
                    0x02;
            } else if (k == 2 && nul != std::string::npos) {
                bad.data.replace(16, nul - 16, "10.0.9.9:7");
            }
            Trace("tamper (%s) %s: %s", k == 0   ? "blocks"
                                        : k == 1 ? "byte"
                                        : k == 2 ? "from"
                                        : k == 3 ? "replay"
                                                 : "late replay",
                  Describe(ev).c_str(),
                  nul != std::string::npos ? bad.data.substr(nul + 1).c_str()
                                           : "");
            if (k == 4) {
                bad.due_us = now_us_ + 1 + rng_.Below(6000000);
                Enqueue(bad);
            } else {
                Deliver(bad);
            }
        }
        if (ev.kind == EvKind::kNotice && (net_faults_ & kFaultTamper) &&
            rng_.Percent(30)) {
            // A completion notice (a READ D's release, a WRITE P's "puts
            // landed") captured on the unencrypted data plane: replayed at
            // once or up to 6 s later, or with its nonce (a READ release's
            // stamp) or its count (a counted notice's bytes: a lower one
            // would complete the transfer before its puts landed) changed,
            // which its mac no longer covers.
            Event    bad = ev;
            uint64_t k   = rng_.Below(4);

            if (k == 2 && bad.data.size() > 16) {
                bad.data[16] ^= 0x01;
            }
            if (k == 3 && bad.data.size() > 48 &&
                bad.data.compare(40, 8, std::string(8, '\xff')) != 0) {
                // a counted notice's count set to 0: were the count not
                // under the mac, D would complete at once, before its puts
                bad.data.replace(40, 8, std::string(8, '\0'));
            }
            Trace("tamper (%s) %s", k == 0   ? "replay"
                                    : k == 1 ? "late replay"
                                    : k == 2 ? "nonce"
                                             : "count",
                  Describe(ev).c_str());
            if (k == 1) {
                bad.due_us = now_us_ + 1 + rng_.Below(6000000);
                Enqueue(bad);
            } else {
                Deliver(bad);
            }
        }
        if (ev.kind == EvKind::kCtlRequest && (net_faults_ & kFaultDup) &&
            rng_.Percent(10)) {
            Trace("duplicate %s", Describe(ev).c_str());
            Enqueue(ev);
        }
        Trace("%s", Describe(ev).c_str());
        Deliver(ev);
    }
    if (after_step) {
        after_step();
    }
    return true;
}

void World::Deliver(const Event &ev)
{
    int saved = current_;

    switch (ev.kind) {
    case EvKind::kCtlRequest:
    case EvKind::kCtlReply:
    case EvKind::kCtlTimeout:
        CtlDeliver(ev);
        break;
    default:
        DataDeliver(ev);
        break;
    }
    current_ = saved;
}

bool World::Step()
{
    return StepLimit(UINT64_MAX);
}

void World::WaitUntil(uint64_t deadline_us)
{
    int saved = current_;

    if (deadline_us <= now_us_) {
        return;
    }
    if (deadline_us - now_us_ > kMaxWaitUs) {
        deadline_us = now_us_ + kMaxWaitUs;
    }
    depth_++;
    if (depth_ > 32) {
        Violate("clock waits nested more than 32 deep (a callback waits?)");
        now_us_ = deadline_us;
    } else if (!StepLimit(deadline_us)) {
        now_us_ = deadline_us; // nothing can happen before the deadline
    }
    depth_--;
    current_ = saved;
}

void World::RunFor(uint64_t us)
{
    uint64_t end = now_us_ + us;

    while (now_us_ < end && StepLimit(end)) {
    }
    if (now_us_ < end) {
        now_us_ = end;
    }
}

// --- the clock -------------------------------------------------------------

static uint64_t SimNow(void *arg)
{
    return static_cast<World *>(arg)->Now();
}

// Instance ids increase with the start (kvt_clock_t.random64): virtual
// microseconds, then a world-wide counter for starts at the same instant.
static uint64_t SimRandom(void *arg)
{
    World *w = static_cast<World *>(arg);

    (void)w->engine_rng().Next(); // keeps the engines' random stream
    return (w->Now() + 1) << 20 | (++w->inst_seq & 0xfffffu);
}

// Now on the instance-id scale: the same counter orders it among starts
// at the same virtual instant.
static uint64_t SimStamp(void *arg)
{
    World *w = static_cast<World *>(arg);

    return (w->Now() + 1) << 20 | (++w->inst_seq & 0xfffffu);
}

static void SimWait(void *arg, pthread_cond_t *cond, pthread_mutex_t *lock,
                    uint64_t deadline_us)
{
    (void)cond;
    pthread_mutex_unlock(lock);
    static_cast<World *>(arg)->WaitUntil(deadline_us);
    pthread_mutex_lock(lock);
}

kvt_env_t World::Env()
{
    kvt_env_t env;

    env.data        = DataOps();
    env.ctl         = CtlOps();
    env.clock.now_us   = SimNow;
    env.clock.random64 = SimRandom;
    env.clock.stamp    = SimStamp;
    env.clock.stamp_shift = 20;
    env.clock.wait     = SimWait;
    env.clock.arg      = this;
    return env;
}

} // namespace sim
