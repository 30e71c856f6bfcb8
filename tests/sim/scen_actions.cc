// scen_actions.cc - what the frameworks and the proxy do, as actions the
// scheduler picks among the pending events: start a transfer, each rank's
// request, WRITE layer_ready / seal, waits, and the fault actions (abort,
// crash, restart, destroy, messages from a stranger).
//
// An action that a real framework would not postpone (a request the proxy
// routed, the next layer of a prefill) becomes "due" after a few hundred
// virtual milliseconds and is then picked before anything else.
#include "scen.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sim {

static const uint64_t kDue = 1000000; // weight of an overdue action

static std::string Hex(Rng &rng, int digits)
{
    static const char *h = "0123456789abcdef";
    std::string        s;

    for (int i = 0; i < digits; i++) {
        s += h[rng.Below(16)];
    }
    return s;
}

static void Release(RankX *x)
{
    for (uint64_t b : x->blocks) {
        if (x->rank->owner[b] == x) {
            x->rank->owner[b] = nullptr;
        }
    }
}

static void Drop(RankX *x)
{
    x->dropped = true;
    x->live    = false;
    Release(x);
}

std::vector<uint64_t> Scenario::FreeBlocks(bool producer, uint32_t dp)
{
    uint32_t              nb = producer ? pnb_ : dnb_;
    std::vector<uint64_t> out;

    for (uint64_t b = 0; b < nb; b++) {
        bool free = true;
        for (uint32_t tp = 0; tp < tp_; tp++) {
            Rank *r = Slot(producer, dp, tp);
            free    = free && (r->state != Rank::kUp || r->owner[b] == nullptr);
        }
        if (free) {
            out.push_back(b);
        }
    }
    return out;
}

bool Scenario::Finished() const
{
    if (xfers_.size() < target_) {
        return false;
    }
    for (const auto &t : xfers_) {
        for (uint32_t tp = 0; tp < tp_; tp++) {
            for (const RankX *x : {t->p[tp].get(), t->d[tp].get()}) {
                if (x == nullptr || x->rank->state != Rank::kUp) {
                    continue;
                }
                if (x->live || (!x->requested && !x->dropped)) {
                    return false;
                }
            }
        }
    }
    return true;
}

uint64_t Scenario::ActionWeight()
{
    uint64_t total = 0;

    actions_.clear();
    if (cleanup_ || w_.Violated()) {
        return 0;
    }
    ListActions(&actions_);
    for (const Action &a : actions_) {
        total += a.weight;
    }
    return total;
}

void Scenario::DoAction()
{
    uint64_t total = 0;

    for (const Action &a : actions_) {
        total += a.weight;
    }
    uint64_t r = rng_.Below(total);
    for (const Action &a : actions_) {
        if (r < a.weight) {
            Action copy = a; // running it may list actions again (nested)
            w_.Trace("ACTION %s", copy.what.c_str());
            copy.run();
            return;
        }
        r -= a.weight;
    }
}

void Scenario::ListActions(std::vector<Action> *out)
{
    const uint64_t now = w_.Now();
    auto due = [&](uint64_t since, uint64_t after_ms, uint64_t w) {
        return now >= since + after_ms * 1000 ? kDue : w;
    };

    if (xfers_.size() < target_ && !FreeBlocks(true, 0).empty() &&
        !FreeBlocks(false, 0).empty() && !FreeBlocks(true, pdp_ - 1).empty() &&
        !FreeBlocks(false, ddp_ - 1).empty()) {
        out->push_back({4, "new transfer", [this] { NewTransfer(); }});
    }
    for (auto &up : xfers_) {
        Transfer *t = up.get();
        // READ: the proxy routes to D once every P rank of the instance
        // finished its prefill (registered the transfer, p_complete).
        for (uint32_t tp = 0; tp < tp_; tp++) {
            RankX *px = t->p[tp].get(), *dx = t->d[tp].get();
            std::string sfx = " " + t->tid + " tp" + std::to_string(tp);

            if (px != nullptr && !px->requested && !px->dropped &&
                !px->rank->busy && now >= t->hold_until_us) {
                out->push_back({due(t->created_us, 300, 20), "p-request" + sfx,
                                [this, t, tp] { PRequest(t, tp); }});
            }
            if (!read_ && px != nullptr && px->live && !px->rank->busy &&
                !px->sealed && now >= t->hold_until_us) {
                bool last = px->next_layer >= layers;
                out->push_back({due(px->last_us, 200, 15),
                                (last ? "seal" : "layer_ready") + sfx,
                                [this, px, last] {
                                    last ? Seal(px) : LayerReady(px);
                                }});
            }
            if (dx == nullptr || dx->rank->busy || dx->dropped) {
                continue;
            }
            bool can_d = !read_ || (t->p_complete && !t->presp.empty());
            if (!dx->requested && can_d) {
                out->push_back({due(read_ ? t->presp_us : t->created_us, 300,
                                    20), "d-request" + sfx,
                                [this, t, tp] { DRequest(t, tp); }});
            }
            if (abort_budget_ > 0 && can_d && !dx->aborted &&
                (dx->live ? (o_.faults & kFAbort) != 0
                          : !dx->requested && (o_.faults & kFPreAbort))) {
                // before the request it races with: as likely as it
                out->push_back({dx->requested ? 1u : 10u, "consumer_abort" + sfx,
                                [this, t, tp] { Abort(t, tp); }});
            }
            if (dx->live) {
                out->push_back({2, "wait_transfer" + sfx,
                                [this, dx] { WaitTransfer(dx); }});
            }
        }
        if (reboot_budget_ > 0) {
            ListReboot(t, out);
        }
    }
    std::vector<Rank *> idle; // running ranks not inside an API call
    for (auto &kv : slots_) {
        Rank *r = kv.second;
        if (r->state == Rank::kUp && !r->busy) {
            idle.push_back(r);
        }
        if (r->state != Rank::kUp && (o_.faults & kFRestart)) {
            out->push_back({5, "restart " + r->name(), [this, r] {
                                StartRank(r->producer, r->dp, r->tp);
                            }});
        }
    }
    if (!idle.empty() && crash_budget_ > 0) {
        out->push_back({1, "crash", [this, idle] {
                            CrashRank(idle[rng_.Below(idle.size())]);
                        }});
    }
    if (!idle.empty() && destroy_budget_ > 0) {
        out->push_back({1, "engine_destroy", [this, idle] {
                            DestroyRank(idle[rng_.Below(idle.size())]);
                        }});
    }
    if (partition_budget_ > 0 && idle.size() >= 2) {
        out->push_back({1, "partition", [this] { Partition(); }});
    }
    for (size_t i = 0; i < cuts_.size(); i++) {
        if (cuts_[i].heal_us != 0 && now >= cuts_[i].heal_us) {
            out->push_back({20, "heal", [this, i] {
                                w_.HealCtl(cuts_[i].a, cuts_[i].b);
                                cuts_.erase(cuts_.begin() + (long)i);
                            }});
            break; // (one at a time: the index stays valid)
        }
    }
    if (stranger_budget_ > 0) {
        if (o_.faults & kFJunk) {
            out->push_back({2, "stranger junk", [this] { Stranger(false); }});
        }
        if ((o_.faults & kFForge) && !xfers_.empty()) {
            out->push_back({2, "stranger forge", [this] { Stranger(true); }});
        }
    }
}

// ListReboot: the reboot fault's moment for t. READ: every P rank of t
// registered it (the proxy has the response) and some D rank has not made
// its request yet; WRITE: a D rank requested t and P has not ended it.
// The instance restarted is P's (READ) or D's (WRITE) DP rank of t; each
// of its ranks must be running and outside any API call.
void Scenario::ListReboot(Transfer *t, std::vector<Action> *out)
{
    bool     moment = false, all_p = true;
    uint32_t dp     = read_ ? t->pdp : t->ddp;

    for (uint32_t tp = 0; tp < tp_; tp++) {
        const RankX *px = t->p[tp].get(), *dx = t->d[tp].get();
        all_p = all_p && px != nullptr && px->requested;
        if (read_) {
            moment = moment || (dx != nullptr && !dx->requested &&
                                !dx->dropped);
        } else {
            moment = moment || (dx != nullptr && dx->live && px != nullptr &&
                                px->live);
        }
        Rank *r = Slot(read_, dp, tp);
        if (r->state != Rank::kUp || r->busy) {
            return;
        }
    }
    if (!moment || (read_ && (!all_p || t->presp.empty()))) {
        return;
    }
    out->push_back({10, std::string("reboot ") + (read_ ? "P" : "D") +
                            " instance of " + t->tid,
                    [this, t] { Reboot(t, read_, rng_.Below(2) == 0); }});
}

void Scenario::NewTransfer()
{
    auto t  = std::make_unique<Transfer>();
    t->idx  = (uint32_t)xfers_.size();
    t->tid  = "tx-" + std::to_string(t->idx) + "-" + Hex(rng_, 8);
    t->rid  = "___prefill_addr_host:10.0.1.1,handshake:7000,notify:7100"
              "___decode_addr_host:10.0.2.1,handshake:8000,notify:8100_" +
              Hex(rng_, 32);
    t->pdp  = (uint32_t)rng_.Below(pdp_);
    t->ddp  = (uint32_t)rng_.Below(ddp_);
    t->created_us = w_.Now();
    if ((o_.faults & kFSlow) && !read_ && rng_.Percent(40)) {
        t->hold_until_us = t->created_us + 3000000 + rng_.Below(4000000);
    }

    std::vector<uint64_t> pf = FreeBlocks(true, t->pdp);
    std::vector<uint64_t> df = FreeBlocks(false, t->ddp);
    size_t np = 1 + rng_.Below(4), nd;
    np = np < pf.size() ? np : pf.size();
    nd = rng_.Percent(15) ? rng_.Below(np + 1) : np; // prefix-cache hit
    nd = nd < df.size() ? nd : df.size();
    for (size_t i = 0; i < pf.size(); i++) { // shuffle, take the first
        std::swap(pf[i], pf[i + rng_.Below(pf.size() - i)]);
    }
    for (size_t i = 0; i < df.size(); i++) {
        std::swap(df[i], df[i + rng_.Below(df.size() - i)]);
    }
    t->pblocks.assign(pf.begin(), pf.begin() + (long)np);
    t->dblocks.assign(df.begin(), df.begin() + (long)nd);
    if (read_) {
        t->pparams = "{\"transfer_id\":\"" + t->tid +
                     "\",\"do_remote_decode\":true}";
    } else {
        t->pparams = "{\"transfer_id\":\"" + t->tid +
                     "\",\"do_remote_decode\":true,\"remote_host\":"
                     "\"10.0.2.1\",\"remote_handshake_port\":8000,"
                     "\"remote_notify_port\":8100,\"remote_tp_size\":" +
                     std::to_string(tp_) + ",\"remote_dp_size\":" +
                     std::to_string(ddp_) + "}";
        t->dparams = "{\"transfer_id\":\"" + t->tid +
                     "\",\"do_remote_prefill\":true,\"remote_tp_size\":" +
                     std::to_string(tp_) + ",\"remote_dp_size\":" +
                     std::to_string(pdp_) + ",\"remote_dp_rank\":" +
                     std::to_string(t->pdp) + "}";
    }
    t->p.resize(tp_);
    t->d.resize(tp_);
    for (uint32_t tp = 0; tp < tp_; tp++) {
        for (int side = 0; side < 2; side++) {
            Rank *r = Slot(side == 0, side == 0 ? t->pdp : t->ddp, tp);
            if (r->state != Rank::kUp) {
                continue;
            }
            auto x   = std::make_unique<RankX>();
            x->t     = t.get();
            x->rank  = r;
            x->tp    = tp;
            x->blocks = side == 0 ? t->pblocks : t->dblocks;
            x->ready.assign(layers, false);
            x->gens.assign(layers, std::vector<uint32_t>(x->blocks.size(), 0));
            for (uint64_t b : x->blocks) {
                r->owner[b] = x.get();
            }
            r->xfers[t->tid] = x.get();
            (side == 0 ? t->p : t->d)[tp] = std::move(x);
        }
    }
    w_.Trace("  %s %s: P dp%u blocks %zu, D dp%u blocks %zu", t->tid.c_str(),
             t->rid.c_str(), t->pdp, np, t->ddp, nd);
    xfers_.push_back(std::move(t));
    SettleP(xfers_.back().get());
}

// Fill: layer l of x's P blocks is computed now (fresh content).
static void Compute(Scenario *s, RankX *x, uint32_t l,
                    const std::function<void(Rank *, uint32_t, uint64_t)> &fill)
{
    (void)s;
    for (size_t j = 0; j < x->blocks.size(); j++) {
        uint64_t b = x->blocks[j];
        x->rank->gen[l][b]++;
        fill(x->rank, l, b);
        x->gens[l][j] = x->rank->gen[l][b];
    }
    x->ready[l] = true;
}

void Scenario::PRequest(Transfer *t, uint32_t tp)
{
    RankX *x = t->p[tp].get();
    Rank  *r = x->rank;
    auto fill = [this](Rank *rk, uint32_t l, uint64_t b) { FillP(rk, l, b); };

    if (Slot(true, t->pdp, tp) != r || r->state != Rank::kUp) {
        Drop(x);
    } else {
        if (read_) { // prefill done: every layer is in the blocks
            for (uint32_t l = 0; l < layers; l++) {
                Compute(this, x, l, fill);
            }
        }
        char        *resp = nullptr;
        x->requested = x->live = true; // events may come before it returns
        x->last_us   = w_.Now();
        kvx_status_t st = Call(r, [&] {
            return api_->producer_request(r->eng, t->rid.c_str(),
                                          t->pparams.c_str(), x->blocks.data(),
                                          x->blocks.size(), &resp);
        });
        if (st == KVX_OK && o_.mutate == 4) {
            ReleaseBlocks(x); // a framework bug: frees what P still lends
        }
        if (st == KVX_OK) {
            if (t->presp.empty()) {
                t->presp    = resp;
                t->presp_us = w_.Now();
            }
        } else {
            w_.Trace("  producer_request: %s: %s", api_->status_name(st),
                     api_->last_error());
            x->requested = false;
            Drop(x);
        }
        api_->free(resp);
    }
    SettleP(t);
}

// SettleP: in READ, the proxy routes to D only when every P rank
// registered the transfer with the instance it had at creation (TP ranks
// compute a prefill together: one down or failing during it fails the
// prefill, and a real framework produces no response). A rank that
// restarts after that has an instance id greater than the accepting
// rank's stamp (remote_accepted): D must fail, which VerifyOk checks.
void Scenario::SettleP(Transfer *t)
{
    bool all = read_;

    for (uint32_t k = 0; k < tp_ && all; k++) {
        all = t->p[k] && t->p[k]->requested && !t->p[k]->dropped;
    }
    if (all && !t->presp.empty()) {
        t->p_complete = true;
        return;
    }
    for (uint32_t k = 0; read_ && !t->p_complete && k < tp_; k++) {
        if (t->p[k] && !t->p[k]->requested && !t->p[k]->dropped) {
            return; /* still to register */
        }
    }
    for (uint32_t k = 0; read_ && !t->p_complete && k < tp_; k++) {
        if (t->d[k] && !t->d[k]->requested) {
            Drop(t->d[k].get());
        }
    }
}

void Scenario::DRequest(Transfer *t, uint32_t tp)
{
    RankX *x = t->d[tp].get();
    Rank  *r = x->rank;

    if (Slot(false, t->ddp, tp) != r || r->state != Rank::kUp) {
        Drop(x);
        return;
    }
    if (t->dparams.empty()) {
        char        *dp = nullptr;
        kvx_status_t st = api_->build_decode_params(t->presp.c_str(),
                                                    t->tid.c_str(), &dp);
        if (st != KVX_OK) {
            Fail(std::string("build_decode_params: ") + api_->last_error());
            return;
        }
        t->dparams = dp;
        api_->free(dp);
    }
    x->requested = x->live = true; // events may come before it returns
    x->last_us   = w_.Now();
    kvx_status_t st = Call(r, [&] {
        return api_->consumer_request(r->eng, t->rid.c_str(),
                                      t->dparams.c_str(), x->blocks.data(),
                                      x->blocks.size());
    });
    if (st != KVX_OK) {
        w_.Trace("  consumer_request: %s: %s", api_->status_name(st),
                 api_->last_error());
        x->requested = false;
        Drop(x);
    }
}

void Scenario::LayerReady(RankX *x)
{
    uint32_t l  = x->next_layer++;
    Rank    *r  = x->rank;
    auto fill = [this](Rank *rk, uint32_t ll, uint64_t b) { FillP(rk, ll, b); };

    Compute(this, x, l, fill); // the KV of layer l is computed, then signalled
    x->last_us = w_.Now();
    kvx_status_t st = Call(r, [&] {
        return api_->layer_ready(r->eng, x->t->tid.c_str(), l);
    });
    if (st != KVX_OK) {
        w_.Trace("  layer_ready: %s: %s", api_->status_name(st),
                 api_->last_error());
    }
}

void Scenario::Seal(RankX *x)
{
    Rank *r    = x->rank;
    x->sealed  = true;
    x->last_us = w_.Now();
    kvx_status_t st = Call(r, [&] {
        return api_->seal_transfer(r->eng, x->t->tid.c_str());
    });
    if (st != KVX_OK) {
        w_.Trace("  seal_transfer: %s: %s", api_->status_name(st),
                 api_->last_error());
    }
}

void Scenario::Abort(Transfer *t, uint32_t tp)
{
    RankX *x = t->d[tp].get();
    Rank  *r = x->rank;

    abort_budget_--;
    x->aborted = true;
    x->last_us = w_.Now();
    if (t->dparams.empty()) {
        char *dp = nullptr;
        if (api_->build_decode_params(t->presp.c_str(), t->tid.c_str(), &dp) !=
            KVX_OK) {
            Fail(std::string("build_decode_params: ") + api_->last_error());
            return;
        }
        t->dparams = dp;
        api_->free(dp);
    }
    if (!x->requested) {
        Drop(x); // the request will never be made
    }
    kvx_status_t st = Call(r, [&] {
        return api_->consumer_abort(r->eng, t->rid.c_str(), t->dparams.c_str());
    });
    if (st != KVX_OK) {
        w_.Trace("  consumer_abort: %s: %s", api_->status_name(st),
                 api_->last_error());
    }
}

void Scenario::WaitTransfer(RankX *x)
{
    Rank        *r   = x->rank;
    int64_t      tmo = (int64_t)rng_.Below(300);
    kvx_status_t st  = Call(r, [&] {
        return api_->wait_transfer(r->eng, x->t->tid.c_str(), tmo);
    });

    w_.Trace("  wait_transfer %s (%lld ms): %s", x->t->tid.c_str(),
             (long long)tmo, api_->status_name(st));
    if (st == KVX_OK && x->live) {
        VerifyOk(x, "wait_transfer returned KVX_OK");
    }
}

void Scenario::CrashRank(Rank *r)
{
    w_.Trace("  crash %s", r->name().c_str());
    crash_budget_--;
    res_.crashes++;
    w_.Crash(r->node);
    r->state = Rank::kCrashed;
    EndRank(r);
}

// Partition: the control planes of a running P rank and a running D rank
// are cut (their connections reset, requests between them lost) while the
// data plane between them works on; healed later, or never.
void Scenario::Partition()
{
    std::vector<Rank *> ps, ds;

    partition_budget_--;
    for (auto &kv : slots_) {
        Rank *r = kv.second;
        if (r->state == Rank::kUp) {
            (r->producer ? ps : ds).push_back(r);
        }
    }
    if (ps.empty() || ds.empty()) {
        return;
    }
    Rank    *p    = ps[rng_.Below(ps.size())];
    Rank    *d    = ds[rng_.Below(ds.size())];
    uint64_t heal = rng_.Percent(30) ? 0
                                     : w_.Now() + 300000 + rng_.Below(3700000);

    w_.Trace("  partition %s | %s (heal %s)", p->name().c_str(),
             d->name().c_str(), heal != 0 ? "later" : "never");
    cuts_.push_back({p->node, d->node, heal});
    w_.CutCtl(p->node, d->node);
}

void Scenario::DestroyRank(Rank *r)
{
    w_.Trace("  engine_destroy %s", r->name().c_str());
    destroy_budget_--;
    Call(r, [&] {
        api_->engine_destroy(r->eng);
        r->eng   = nullptr;
        r->state = Rank::kDestroyed;
        return 0;
    });
    EndRank(r);
}

// Reboot: every TP rank of t's P (or D) DP rank goes down (all crash, or
// all engine_destroy in turn) and starts again on the same addresses with
// new instance ids, as a restarted serving instance does.
void Scenario::Reboot(Transfer *t, bool producer, bool crash)
{
    uint32_t dp = producer ? t->pdp : t->ddp;

    reboot_budget_--;
    res_.reboots++;
    w_.Trace("  reboot the %s instance dp%u (%s)", producer ? "P" : "D", dp,
             crash ? "crash" : "engine_destroy");
    for (uint32_t tp = 0; tp < tp_; tp++) {
        Rank *r = Slot(producer, dp, tp);
        if (r->state != Rank::kUp || r->busy) {
            continue; // taken down meanwhile (nested fault action)
        }
        if (crash) {
            w_.Trace("  crash %s", r->name().c_str());
            res_.crashes++;
            w_.Crash(r->node);
            r->state = Rank::kCrashed;
        } else {
            w_.Trace("  engine_destroy %s", r->name().c_str());
            Call(r, [&] {
                api_->engine_destroy(r->eng);
                r->eng   = nullptr;
                r->state = Rank::kDestroyed;
                return 0;
            });
        }
        EndRank(r);
    }
    for (uint32_t tp = 0; tp < tp_ && !w_.Violated(); tp++) {
        if (Slot(producer, dp, tp)->state != Rank::kUp) {
            StartRank(producer, dp, tp);
        }
    }
}

void Scenario::Stranger(bool forge)
{
    bool        to_p = rng_.Below(2) == 0;
    uint32_t    dp   = (uint32_t)rng_.Below(to_p ? pdp_ : ddp_);
    uint32_t    tp   = (uint32_t)rng_.Below(tp_);
    uint32_t    off  = dp * tp_ + tp;
    bool        hs   = !forge && rng_.Below(3) == 0;
    uint32_t    port = (to_p ? (hs ? 7000 : 7100) : (hs ? 8000 : 8100)) + off;
    std::string to   = std::string(to_p ? "10.0.1.1:" : "10.0.2.1:") +
                     std::to_string(port);
    std::string msg;

    stranger_budget_--;
    if (!forge) {
        static const char *const junk[] = {
            "{", "{}", "[]", "\"\"", "null", "{\"type\":\"release\"",
            "{\"type\":\"release\",\"transfer_id\":7}",
            "{\"type\":\"get_meta\",\"version\":99}",
            "{\"type\":\"nope\",\"transfer_id\":\"x\"}"};
        size_t k = rng_.Below(sizeof(junk) / sizeof(junk[0]) + 1);
        if (k < sizeof(junk) / sizeof(junk[0])) {
            msg = junk[k];
        } else {
            size_t n = 1 + rng_.Below(64);
            for (size_t i = 0; i < n; i++) {
                msg += (char)rng_.Below(256);
            }
        }
    } else {
        const Transfer *t = xfers_[rng_.Below(xfers_.size())].get();
        std::string     tid = t->tid;
        switch (rng_.Below(3)) {
        case 0:
            msg = to_p ? "{\"type\":\"release\",\"transfer_id\":\"" + tid +
                             "\",\"consumer_tp_size\":" +
                             std::to_string(tp_) + ",\"consumer_rank\":" +
                             std::to_string(tp) + "}"
                       : "{\"type\":\"write_done\",\"transfer_id\":\"" + tid +
                             "\"}";
            break;
        case 1:
            msg = tid; // legacy: release on P, write_done on D
            break;
        default:
            msg = "{\"type\":\"remote_blocks\",\"transfer_id\":\"" + tid +
                  "\",\"req_id\":\"" + t->rid + "\",\"block_notify_list\":"
                  "[0,1],\"decode_rank\":0,\"consumer_rank\":" +
                  std::to_string(tp) + "}";
            break;
        }
    }
    w_.InjectRequest("10.66.6.6", to, msg);
}

} // namespace sim
