// scen_setup.cc - a scenario's topology and lifetime: the configuration
// drawn from the seed, ranks started as real engines on simulated nodes,
// the main loop, the final destruction of every engine, fault flags.
#include "scen.h"

extern "C" {
#include "api.h"
}

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sim {

const uint32_t kAllFaults = kFAbort | kFCrash | kFRestart | kFDestroy |
                            kFJunk | kFForge | kFDup | kFDelay | kFPreAbort |
                            kFReboot | kFLag | kFSlow | kFPartition;
const uint32_t kCiFaults  = kFCrash | kFPreAbort | kFJunk | kFDup | kFDelay |
                            kFDestroy;

static const char *const kFaultNames[] = {"abort", "crash", "restart",
                                          "destroy", "junk", "forge", "dup",
                                          "delay", "preabort", "reboot",
                                          "lag", "slow", "partition"};
static const size_t kNumFaults = sizeof(kFaultNames) / sizeof(kFaultNames[0]);

static const char *kPHost = "10.0.1.1";
static const char *kDHost = "10.0.2.1";
static const uint32_t kPHs = 7000, kPNotify = 7100, kDHs = 8000,
                      kDNotify = 8100;

bool ParseFaults(const std::string &s, uint32_t *out, std::string *err)
{
    uint32_t f = 0;
    size_t   pos = 0;

    while (pos <= s.size()) {
        size_t      comma = s.find(',', pos);
        std::string name  = s.substr(pos, comma == std::string::npos
                                              ? std::string::npos
                                              : comma - pos);
        pos = comma == std::string::npos ? s.size() + 1 : comma + 1;
        if (name.empty() || name == "none") {
            continue;
        }
        if (name == "all") {
            f |= kAllFaults;
            continue;
        }
        if (name == "ci") {
            f |= kCiFaults;
            continue;
        }
        size_t i = 0;
        while (i < kNumFaults && name != kFaultNames[i]) {
            i++;
        }
        if (i == kNumFaults) {
            *err = "unknown fault '" + name + "' (abort, preabort, crash, "
                   "restart, destroy, junk, forge, dup, delay, reboot, lag, all, "
                   "ci, none)";
            return false;
        }
        f |= 1u << i;
    }
    *out = f;
    return true;
}

std::string FaultNames(uint32_t faults)
{
    std::string s;

    for (size_t i = 0; i < kNumFaults; i++) {
        if (faults & (1u << i)) {
            s += (s.empty() ? "" : ",") + std::string(kFaultNames[i]);
        }
    }
    return s.empty() ? "none" : s;
}

std::string ReplayCommand(uint64_t seed, const Options &o)
{
    return "build/tests/sim/kvx_sim --seed " + std::to_string(seed) +
           " --scenario " + o.scenario +
           (o.tp != 0 ? " --tp " + std::to_string(o.tp) : std::string()) +
           " --faults " + FaultNames(o.faults) + " --trace";
}

uint64_t Mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t PatternKey(uint32_t uid, uint32_t layer, uint64_t block, uint32_t gen,
                    int kv)
{
    return Mix64(((uint64_t)uid << 40) ^ ((uint64_t)layer << 32) ^
                 (block << 16) ^ ((uint64_t)gen << 1) ^ (uint64_t)kv) ^
           Mix64(gen + 0x1234567ull * block);
}

std::string Rank::name() const
{
    char buf[64];

    snprintf(buf, sizeof(buf), "%s(dp%u,tp%u)#%u", producer ? "P" : "D", dp,
             tp, uid);
    return buf;
}

static void TraceLog(void *arg, int level, const char *id, const char *msg)
{
    World *w = static_cast<World *>(arg);

    if (w->trace()) {
        w->Trace("  log%d %s: %s", level, id, msg);
    }
}

Scenario::Scenario(uint64_t seed, const Options &o)
    : seed_(seed), o_(o), w_(seed), rng_(Mix64(seed) ^ 0xC0FFEEull),
      api_(kvc_api_table())
{
    w_.set_trace(o.trace);
    api_->set_logger(TraceLog, &w_, o.trace ? 3 : -1);
}

Scenario::~Scenario()
{
    api_->set_logger(nullptr, nullptr, 0);
}

Rank *&Scenario::Slot(bool producer, uint32_t dp, uint32_t tp)
{
    return slots_[(producer ? 1u << 16 : 0u) | dp << 8 | tp];
}

std::string Scenario::RankConfig(const Rank &r) const
{
    char buf[1024];

    snprintf(buf, sizeof(buf),
             "{\"role\":\"%s\",\"tp_rank\":%u,\"tp_size\":%u,\"dp_rank\":%u,"
             "\"dp_size\":%u,\"kv_connector_extra_config\":{"
             "\"host_ip\":\"%s\",\"handshake_port\":%u,\"notify_port\":%u,"
             "\"read_mode\":%s,\"node_hosts\":[\"%s\"],"
             "\"trusted_remote_hosts\":[\"%s\",\"%s\"],"
             "\"handshake_timeout\":%g,\"transfer_timeout\":%g,"
             "\"defer_timeout\":%g}}",
             r.producer ? "kv_producer" : "kv_consumer", r.tp, tp_, r.dp,
             r.producer ? pdp_ : ddp_, r.producer ? kPHost : kDHost,
             r.producer ? kPHs : kDHs, r.producer ? kPNotify : kDNotify,
             read_ ? "true" : "false", r.producer ? kPHost : kDHost, kPHost,
             kDHost, hs_s_, xfer_s_, defer_s_);
    return buf;
}

void Scenario::FillP(Rank *r, uint32_t layer, uint64_t block)
{
    for (int kv = 0; kv < 2; kv++) {
        uint64_t key = PatternKey(r->uid, layer, block, r->gen[layer][block],
                                  kv);
        uint8_t *dst = r->bufs[layer].data() + ((uint64_t)kv * r->nb + block) *
                                                   Unit();
        for (uint64_t i = 0; i < Unit(); i++) {
            dst[i] = PatternByte(key, i);
        }
    }
}

Rank *Scenario::StartRank(bool producer, uint32_t dp, uint32_t tp)
{
    ranks_.emplace_back(new Rank);
    Rank *r     = ranks_.back().get();
    r->uid      = next_uid_++;
    r->producer = producer;
    r->dp       = dp;
    r->tp       = tp;
    r->nb       = producer ? pnb_ : dnb_;
    r->node     = w_.AddNode(producer ? kPHost : kDHost, r->name());
    r->owner.assign(r->nb, nullptr);
    r->bufs.resize(layers);
    r->gen.assign(layers, std::vector<uint32_t>(r->nb, 0));
    for (uint32_t l = 0; l < layers; l++) {
        r->bufs[l].assign(2 * (uint64_t)r->nb * Unit(), 0xEE);
        bufmap_[(uintptr_t)r->bufs[l].data()] = {r, l};
        for (uint64_t b = 0; producer && b < r->nb; b++) {
            FillP(r, l, b);
        }
    }
    Slot(producer, dp, tp) = r;
    w_.Trace("START %s on node %d", r->name().c_str(), r->node);

    std::string  cfg = RankConfig(*r);
    kvt_env_t    env = w_.Env();
    kvx_status_t st  = Call(r, [&] {
        return kvc_engine_create_env(&env, cfg.c_str(), &r->eng);
    });
    for (uint32_t l = 0; st == KVX_OK && l < layers; l++) {
        kvx_layer_desc_t d;
        std::string      name = "model.layers." + std::to_string(l) + ".attn";

        memset(&d, 0, sizeof(d));
        d.struct_size  = sizeof(d);
        d.name         = name.c_str();
        d.base         = r->bufs[l].data();
        d.length       = r->bufs[l].size();
        d.mem_type     = KVX_MEM_HOST;
        d.ndim         = 5;
        d.shape[0]     = 2;
        d.shape[1]     = r->nb;
        d.shape[2]     = bs;
        d.shape[3]     = heads;
        d.shape[4]     = hdim;
        d.stride[4]    = 1;
        for (int k = 3; k >= 0; k--) {
            d.stride[k] = d.stride[k + 1] * d.shape[k + 1];
        }
        d.elem_size    = elem;
        d.block_size   = bs;
        d.num_kv_heads = heads;
        d.head_size    = hdim;
        st = Call(r, [&] { return api_->register_layer(r->eng, &d); });
    }
    if (st == KVX_OK) {
        st = Call(r, [&] { return api_->start(r->eng); });
    }
    if (st != KVX_OK) {
        Fail("setup of " + r->name() + " failed: " +
             api_->status_name(st) + ": " + api_->last_error());
    }
    return r;
}

void Scenario::Configure()
{
    const std::string &s = o_.scenario;

    read_   = s == "read" ? true : s == "write" ? false : rng_.Below(2) == 0;
    tp_     = 1 + (uint32_t)rng_.Below(2);
    tp_     = o_.tp != 0 ? o_.tp : tp_; // drawn anyway: same stream
    pdp_    = 1 + (uint32_t)rng_.Below(2);
    ddp_    = 1 + (uint32_t)rng_.Below(2);
    layers  = 1 + (uint32_t)rng_.Below(3);
    bs      = 1u << rng_.Below(3);
    heads   = 1 + (uint32_t)rng_.Below(2);
    hdim    = 4u << rng_.Below(2);
    pnb_    = 6 + (uint32_t)rng_.Below(7);
    dnb_    = 6 + (uint32_t)rng_.Below(7);
    target_ = 1 + (uint32_t)rng_.Below(6);
    crash_budget_    = (o_.faults & kFCrash) ? (uint32_t)rng_.Below(3) : 0;
    destroy_budget_  = (o_.faults & kFDestroy) ? 1 : 0;
    reboot_budget_   = (o_.faults & kFReboot) ? 1 : 0;
    abort_budget_    = (o_.faults & (kFAbort | kFPreAbort))
                           ? 1 + (uint32_t)rng_.Below(2) : 0;
    stranger_budget_ = (o_.faults & (kFJunk | kFForge))
                           ? 1 + (uint32_t)rng_.Below(4) : 0;
    partition_budget_ = (o_.faults & kFPartition)
                            ? 1 + (uint32_t)rng_.Below(2) : 0;
    w_.set_conn_events((o_.faults & kFPartition) != 0);
    w_.set_net_faults(((o_.faults & kFDup) ? (uint32_t)kFaultDup : 0u) |
                      ((o_.faults & kFDelay) ? (uint32_t)kFaultDelay : 0u) |
                      ((o_.faults & kFLag) ? (uint32_t)kFaultLag : 0u) |
                      ((o_.faults & kFSlow) ? (uint32_t)kFaultSlow : 0u) |
                      ((o_.faults & kFForge) ? (uint32_t)kFaultTamper : 0u));
    char buf[300];
    snprintf(buf, sizeof(buf), "%s, P tp%u dp%u -> D tp%u dp%u, %u layers "
             "[2,NB,%u,%u,%u]x%u B, P %u / D %u blocks, %u transfers, "
             "faults %s", read_ ? "READ" : "WRITE", tp_, pdp_, tp_, ddp_,
             layers, bs, heads, hdim, elem, pnb_, dnb_, target_,
             FaultNames(o_.faults).c_str());
    res_.config = buf;
    w_.Trace("CONFIG seed %" PRIu64 ": %s", seed_, buf);
    for (int side = 1; side >= 0 && !w_.Violated(); side--) {
        for (uint32_t dp = 0; dp < (side ? pdp_ : ddp_); dp++) {
            for (uint32_t tp = 0; tp < tp_ && !w_.Violated(); tp++) {
                StartRank(side == 1, dp, tp);
            }
        }
    }
}

void Scenario::Fail(const std::string &what)
{
    w_.Violate(what);
}

// StatOf: the counter key of an engine's stats JSON (0 when absent).
static uint64_t StatOf(const char *json, const char *key)
{
    std::string k = std::string("\"") + key + "\":";
    const char *p = strstr(json, k.c_str());

    return p != nullptr ? strtoull(p + k.size(), nullptr, 10) : 0;
}

// Cleanup destroys every engine: running ones as a framework would, crashed
// ones after reviving them cut off from the network.
void Scenario::Cleanup()
{
    cleanup_ = true;
    for (auto &up : ranks_) {
        Rank *r = up.get();
        char *js = nullptr;

        if (r->eng == nullptr) {
            continue;
        }
        if (api_->stats(r->eng, &js) == KVX_OK && js != nullptr) {
            res_.notices_early += StatOf(js, "notices_early");
            res_.write_done_skipped += StatOf(js, "write_done_skipped");
            res_.early_completed += StatOf(js, "early_completed");
            res_.blocks_on_dp += StatOf(js, "blocks_on_dp");
            res_.notices_counted += StatOf(js, "notices_counted");
            res_.notices_landing += StatOf(js, "notices_landing");
            res_.dp_msgs_refused += StatOf(js, "dp_msgs_refused");
            res_.releases_on_dp += StatOf(js, "releases_on_dp");
            res_.notices_done += StatOf(js, "notices_done");
            res_.notices_refused += StatOf(js, "notices_refused");
            res_.dp_stale += StatOf(js, "dp_stale");
            api_->free(js);
        }
        if (r->state == Rank::kCrashed) {
            w_.Isolate(r->node);
        }
        w_.Trace("DESTROY %s (cleanup)", r->name().c_str());
        Call(r, [&] {
            api_->engine_destroy(r->eng);
            r->eng   = nullptr;
            r->state = Rank::kDestroyed;
            return 0;
        });
        EndRank(r);
    }
}

Result Scenario::Run()
{
    w_.copy_check    = [this](const CopyInfo &ci) { return CopyCheck(ci); };
    w_.after_step    = [this] { AfterStep(); };
    w_.action_weight = [this] { return ActionWeight(); };
    w_.action        = [this] { DoAction(); };
    Configure();
    uint64_t hard_end = w_.Now() + 600ull * 1000000ull;
    while (!w_.Violated() && !Finished()) {
        if (w_.Now() > hard_end || w_.Steps() > 5000000) {
            Fail("the run did not settle within 600 virtual seconds / 5M "
                 "steps");
            break;
        }
        if (!w_.Step()) {
            Fail("nothing left to run but transfers are still open");
            break;
        }
    }
    Cleanup();
    res_.ok        = !w_.Violated();
    res_.violation = w_.Violation();
    res_.step      = w_.ViolationStep();
    res_.steps     = w_.Steps();
    res_.virt_us   = w_.Now();
    res_.transfers = (uint32_t)xfers_.size();
    return res_;
}

Result RunSeed(uint64_t seed, const Options &o)
{
    Scenario s(seed, o);
    Result   r = s.Run();

    if (!r.ok && !o.quiet) {
        printf("VIOLATION seed %" PRIu64 " step %" PRIu64 ": %s\n  config: "
               "%s\n  replay: %s\n", seed, r.step, r.violation.c_str(),
               r.config.c_str(), ReplayCommand(seed, o).c_str());
        fflush(stdout);
    }
    return r;
}

} // namespace sim
