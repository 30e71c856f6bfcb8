// scen.h - the scenario's model of the serving framework (internal to
// scen_*.cc): ranks and their KV buffers, the proxy's transfers, the block
// ownership each framework keeps, and the byte patterns the checks use.
//
// Geometry is computed here from the shape alone (split K/V layers
// [2, NB, BS, H, D], contiguous), never with the library's layout code.
#ifndef KVX_SIM_SCEN_H
#define KVX_SIM_SCEN_H

#include "scenario.h"
#include "simnet.h"

#include <kvxfer/kvxfer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sim {

// --- byte patterns -------------------------------------------------------------

uint64_t Mix64(uint64_t x);
// PatternKey names the content of one K or V unit of one P block.
uint64_t PatternKey(uint32_t uid, uint32_t layer, uint64_t block, uint32_t gen,
                    int kv);
inline uint8_t PatternByte(uint64_t key, uint64_t off)
{
    return (uint8_t)(Mix64(key + (off >> 3) * 0x9E3779B97F4A7C15ull) >>
                     ((off & 7) * 8));
}

struct Transfer;
struct Rank;

// RankX: one rank's part of a transfer, as that rank's framework sees it.
struct RankX {
    Transfer             *t    = nullptr;
    Rank                 *rank = nullptr;
    uint32_t              tp   = 0;
    bool                  requested = false; // the API call succeeded
    bool                  dropped   = false; // never requested
    bool                  live      = false; // requested, no terminal yet
    bool                  aborted   = false;
    bool                  verified  = false; // OK checked
    // D READ: a get copied into this transfer's blocks from a P instance
    // that never accepted it (a restart on the same address): the engine
    // may not know until it has read, but it must not report OK.
    std::string           stale;
    uint64_t              last_us   = 0;     // last framework action
    std::vector<uint64_t> blocks;
    // P: per layer, computed (filled) for this transfer, and the gen of
    // each block's content then.
    std::vector<bool>                  ready;
    std::vector<std::vector<uint32_t>> gens;
    uint32_t                           next_layer = 0;
    bool                               sealed     = false;
};

struct Rank {
    uint32_t    uid = 0;       // unique per incarnation (pattern key)
    bool        producer = false;
    uint32_t    dp = 0, tp = 0;
    int         node = -1;
    kvx_engine_t *eng = nullptr;
    enum State { kUp, kCrashed, kDestroyed } state = kUp;
    bool        busy = false;  // the framework is inside an API call
    uint32_t    nb = 0;
    std::vector<std::vector<uint8_t>> bufs;  // per layer
    std::vector<RankX *>              owner; // per block
    std::vector<std::vector<uint32_t>> gen;  // P: [layer][block]
    std::map<std::string, RankX *>    xfers; // by transfer_id
    std::string name() const;
};

// Transfer: one request as the proxy routes it.
struct Transfer {
    uint32_t              idx = 0;
    std::string           tid, rid;
    uint32_t              pdp = 0, ddp = 0;
    std::vector<uint64_t> pblocks, dblocks;
    std::string           pparams, dparams, presp;
    uint64_t              created_us = 0, presp_us = 0;
    // READ: every P rank of the instance registered the transfer with the
    // instance it had at creation (the TP ranks computed the prefill
    // together); only then does the proxy route it to D.
    bool                  p_complete = false;
    // slow fault (WRITE): P's request and layers come only from this time
    // on (a prefill queued behind others).
    uint64_t              hold_until_us = 0;
    std::vector<std::unique_ptr<RankX>> p, d; // per TP rank (null: none)
};

struct Action {
    uint64_t              weight;
    std::string           what;
    std::function<void()> run;
};

class Scenario {
public:
    Scenario(uint64_t seed, const Options &o);
    ~Scenario();
    Result Run();

private:
    friend struct ScenAccess;
    // scen_setup.cc
    void        Configure();
    Rank       *StartRank(bool producer, uint32_t dp, uint32_t tp);
    std::string RankConfig(const Rank &r) const;
    Rank      *&Slot(bool producer, uint32_t dp, uint32_t tp);
    void        FillP(Rank *r, uint32_t layer, uint64_t block);
    void        Cleanup();
    // scen_actions.cc
    uint64_t    ActionWeight();
    void        DoAction();
    void        ListActions(std::vector<Action> *out);
    void        NewTransfer();
    void        PRequest(Transfer *t, uint32_t tp);
    void        SettleP(Transfer *t);
    void        DRequest(Transfer *t, uint32_t tp);
    void        LayerReady(RankX *x);
    void        Seal(RankX *x);
    void        Abort(Transfer *t, uint32_t tp);
    void        WaitTransfer(RankX *x);
    void        CrashRank(Rank *r);
    void        DestroyRank(Rank *r);
    void        Reboot(Transfer *t, bool producer, bool crash);
    void        ListReboot(Transfer *t, std::vector<Action> *out);
    void        Stranger(bool forge);
    void        Partition();
    std::vector<uint64_t> FreeBlocks(bool producer, uint32_t dp);
    bool        Finished() const;
    // scen_checks.cc
    void        AfterStep();
    void        Poll(Rank *r);
    void        OnEvent(Rank *r, const kvx_event_t &ev);
    void        ReleaseBlocks(RankX *x);
    void        VerifyOk(RankX *x, const char *how);
    bool        CopyCheck(const CopyInfo &ci);
    void        CheckDeadlines();
    bool        Expected(const RankX *dx, uint32_t layer, uint64_t db,
                         int kv, uint64_t *key, std::string *why) const;
    void        EndRank(Rank *r);
    template <class F> auto Call(Rank *r, F f) -> decltype(f());
    void        Fail(const std::string &what);

public:
    // Geometry of every layer of every rank.
    uint32_t layers = 1, bs = 2, heads = 2, hdim = 4, elem = 2;
    uint64_t Unit() const { return (uint64_t)bs * heads * hdim * elem; }

private:
    uint64_t           seed_;
    Options            o_;
    World              w_;
    Rng                rng_; // the scenario's own choices
    const kvx_api_t   *api_;
    bool               read_ = true;
    uint32_t           tp_ = 1, pdp_ = 1, ddp_ = 1, pnb_ = 8, dnb_ = 8;
    uint32_t           target_ = 3;   // transfers to start
    uint32_t           crash_budget_ = 0, destroy_budget_ = 0,
                       abort_budget_ = 0, stranger_budget_ = 0,
                       reboot_budget_ = 0, partition_budget_ = 0;
    struct Cut {
        int      a, b;
        uint64_t heal_us; // 0: never
    };
    std::vector<Cut>   cuts_; // the partition fault's cuts not healed yet
    double             hs_s_ = 1.0, xfer_s_ = 2.0, defer_s_ = 3.0;
    uint32_t           next_uid_ = 1;
    bool               cleanup_  = false;
    bool               mutated_  = false;
    std::vector<std::unique_ptr<Rank>>     ranks_;   // every incarnation
    std::map<uint32_t, Rank *>             slots_;   // current instance
    std::vector<std::unique_ptr<Transfer>> xfers_;
    std::map<uintptr_t, std::pair<Rank *, uint32_t>> bufmap_; // base -> rank,
                                                              // layer
    std::vector<Action> actions_; // listed by ActionWeight, run by DoAction
    Result              res_;
};

// Call runs f as rank r's framework: r is busy meanwhile (no nested action
// or poll touches it), transport objects created belong to r's node, and
// r's events are polled afterwards.
template <class F> auto Scenario::Call(Rank *r, F f) -> decltype(f())
{
    bool was   = r->busy;
    int  saved = w_.Current();

    r->busy = true;
    w_.SetCurrent(r->node);
    auto v = f();
    r->busy = was;
    w_.SetCurrent(saved);
    if (!r->busy && r->state == Rank::kUp && r->eng != nullptr) {
        Poll(r);
    }
    return v;
}

} // namespace sim

#endif
