// scen_checks.cc - the invariants, checked after every step and at every
// copy (tests/sim/README.md):
//
//  - a get or put reads only P bytes of blocks P holds for a live transfer,
//    of layers already computed; it writes only D bytes of blocks D holds
//    for a live transfer, and exactly the bytes that transfer expects there
//    (P's pattern of the paired block, computed independently);
//  - a transfer D reports OK holds exactly P's bytes in all its blocks; an
//    aborted READ never reports OK;
//  - every request gets exactly one terminal event, within its deadlines
//    plus slack, listing the blocks the framework gave it;
//  - P overwrites a block with a fresh pattern the moment it is reported
//    free, D forgets its blocks when they are reported free, so any later
//    access is caught by the copy checks.
#include "scen.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace sim {

static const uint64_t kSlackUs = 2000000;

static std::string Fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string Fmt(const char *fmt, ...)
{
    char    buf[768];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return buf;
}

static const char *TypeName(int type)
{
    switch (type) {
    case KVX_EVENT_FINISHED_SENDING: return "FINISHED_SENDING";
    case KVX_EVENT_FINISHED_RECVING: return "FINISHED_RECVING";
    case KVX_EVENT_FAILED:           return "FAILED";
    }
    return "?";
}

void Scenario::EndRank(Rank *r)
{
    for (auto &kv : r->xfers) {
        kv.second->live = false;
    }
}

void Scenario::AfterStep()
{
    for (auto &up : ranks_) {
        Rank *r = up.get();
        if (r->state == Rank::kUp && !r->busy && r->eng != nullptr) {
            Poll(r);
        }
    }
    if (!cleanup_) {
        CheckDeadlines();
    }
}

void Scenario::Poll(Rank *r)
{
    kvx_event_t evs[8];
    int         n;

    if (o_.mutate == 3 && !r->producer) {
        return;
    }
    while ((n = api_->poll_events(r->eng, evs, 8)) > 0) {
        for (int i = 0; i < n; i++) {
            OnEvent(r, evs[i]);
            api_->free(evs[i].block_ids);
        }
    }
    if (n < 0) {
        Fail(r->name() + ": poll_events failed: " + api_->last_error());
    }
}

void Scenario::OnEvent(Rank *r, const kvx_event_t &ev)
{
    std::string what = r->name() + " " + TypeName(ev.type) + " " +
                       ev.transfer_id + " (" + api_->status_name(ev.status) +
                       ")";
    auto it = r->xfers.find(ev.transfer_id);

    w_.Trace("EVENT %s '%s'", what.c_str(), ev.reason);
    if (it == r->xfers.end() || !it->second->requested) {
        Fail("terminal event for a transfer this rank never requested: " +
             what);
        return;
    }
    RankX *x = it->second;
    if (!x->live) {
        Fail("a second terminal event (or one after the rank's framework "
             "stopped expecting it): " + what);
        return;
    }
    bool okt = r->producer ? ev.type == KVX_EVENT_FINISHED_SENDING
                           : ev.type == KVX_EVENT_FINISHED_RECVING;
    if (!okt && ev.type != KVX_EVENT_FAILED) {
        Fail("event of the other side's kind: " + what);
        return;
    }
    if (okt && ev.status != KVX_OK) {
        Fail("finished event with an error status: " + what);
        return;
    }
    if (ev.num_block_ids > 0 &&
        (ev.num_block_ids != x->blocks.size() ||
         memcmp(ev.block_ids, x->blocks.data(),
                x->blocks.size() * sizeof(uint64_t)) != 0)) {
        Fail(Fmt("%s lists %zu blocks, but the framework gave the transfer "
                 "%zu (other ids)", what.c_str(), ev.num_block_ids,
                 x->blocks.size()));
        return;
    }
    if (!r->producer && ev.type == KVX_EVENT_FINISHED_RECVING) {
        VerifyOk(x, "FINISHED_RECVING");
        res_.recv_ok++;
    }
    res_.failed += ev.type == KVX_EVENT_FAILED;
    x->live = false;
    ReleaseBlocks(x);
}

// ReleaseBlocks: the framework takes the blocks back; P overwrites them at
// once (the next request's prefill).
void Scenario::ReleaseBlocks(RankX *x)
{
    Rank *r = x->rank;

    for (uint64_t b : x->blocks) {
        if (r->owner[b] != x) {
            continue;
        }
        r->owner[b] = nullptr;
        for (uint32_t l = 0; r->producer && l < layers; l++) {
            r->gen[l][b]++;
            FillP(r, l, b);
        }
    }
}

// Expected: the pattern D block db of dx must hold in (layer, kv).
bool Scenario::Expected(const RankX *dx, uint32_t layer, uint64_t db, int kv,
                        uint64_t *key, std::string *why) const
{
    const Transfer *t  = dx->t;
    size_t          nd = dx->blocks.size(), np = t->pblocks.size(), i = 0;

    while (i < nd && dx->blocks[i] != db) {
        i++;
    }
    const RankX *px = t->p[dx->tp].get();
    size_t       j  = np - nd + i; // shorter D list: P's last blocks
    if (i == nd) {
        *why = "D block " + std::to_string(db) + " is not in " + t->tid;
        return false;
    }
    if (px == nullptr) {
        *why = "its P rank (tp" + std::to_string(dx->tp) + ") was down when "
               "the transfer was created: no P data exists";
        return false;
    }
    if (!px->ready[layer]) {
        *why = Fmt("P %s has not computed layer %u of %s (%s)",
                   px->rank->name().c_str(), layer, t->tid.c_str(),
                   px->requested ? "no layer_ready yet" : "never requested");
        return false;
    }
    *key = PatternKey(px->rank->uid, layer, t->pblocks[j], px->gens[layer][j],
                      kv);
    return true;
}

void Scenario::VerifyOk(RankX *x, const char *how)
{
    Rank *r = x->rank;

    if (x->verified) {
        return;
    }
    x->verified = true;
    if (!x->stale.empty()) {
        Fail(Fmt("%s: %s for %s, but its gets read %s", r->name().c_str(),
                 how, x->t->tid.c_str(), x->stale.c_str()));
        return;
    }
    if (x->aborted && read_) {
        Fail(Fmt("%s: %s for READ transfer %s after consumer_abort (SPEC "
                 "§14: an aborted READ never reports OK)", r->name().c_str(),
                 how, x->t->tid.c_str()));
        return;
    }
    for (uint64_t b : x->blocks) {
        for (uint32_t l = 0; l < layers; l++) {
            for (int kv = 0; kv < 2; kv++) {
                uint64_t    key;
                std::string why;
                const uint8_t *p = r->bufs[l].data() +
                                   ((uint64_t)kv * r->nb + b) * Unit();
                if (!Expected(x, l, b, kv, &key, &why)) {
                    Fail(r->name() + ": " + how + " for " + x->t->tid +
                         ", but " + why);
                    return;
                }
                for (uint64_t k = 0; k < Unit(); k++) {
                    if (p[k] != PatternByte(key, k)) {
                        Fail(Fmt("%s: %s for %s, but layer %u block %" PRIu64
                                 " %s byte %" PRIu64 " is 0x%02x, P's is "
                                 "0x%02x", r->name().c_str(), how,
                                 x->t->tid.c_str(), l, b, kv ? "V" : "K", k,
                                 p[k], PatternByte(key, k)));
                        return;
                    }
                }
            }
        }
    }
}

struct Loc {
    Rank    *r;
    uint32_t layer;
    uint64_t off;
};

static bool Locate(const std::map<uintptr_t, std::pair<Rank *, uint32_t>> &m,
                   const void *p, uint64_t len, Loc *loc)
{
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin()) {
        return false;
    }
    --it;
    Rank    *r    = it->second.first;
    uint64_t size = r->bufs[it->second.second].size();
    uint64_t off  = (uintptr_t)p - it->first;
    if (off + len > size) {
        return false;
    }
    *loc = {r, it->second.second, off};
    return true;
}

bool Scenario::CopyCheck(const CopyInfo &ci)
{
    const char *op = ci.is_put ? "put" : "get";
    Loc         s, d;

    if (!Locate(bufmap_, ci.src, ci.len, &s) ||
        !Locate(bufmap_, ci.dst, ci.len, &d)) {
        Fail(Fmt("%s of op %" PRIu64 ": a side is outside every KV buffer",
                 op, ci.op_id));
        return false;
    }
    if (!s.r->producer || d.r->producer) {
        Fail(Fmt("%s of op %" PRIu64 " copies %s -> %s (only P -> D)", op,
                 ci.op_id, s.r->name().c_str(), d.r->name().c_str()));
        return false;
    }
    const uint64_t unit = Unit();
    if ((o_.mutate == 1 || o_.mutate == 2) && !mutated_) {
        mutated_ = true;
        *static_cast<uint8_t *>(const_cast<void *>(ci.src)) ^= 0x5a;
    }
    for (uint64_t done = 0; done < ci.len;) {
        uint64_t su = (s.off + done) / unit, sin = (s.off + done) % unit;
        uint64_t du = (d.off + done) / unit, din = (d.off + done) % unit;
        uint64_t sb = su % s.r->nb, db = du % d.r->nb;
        int      skv = (int)(su / s.r->nb), dkv = (int)(du / d.r->nb);
        uint64_t seg = unit - sin < unit - din ? unit - sin : unit - din;
        seg = seg < ci.len - done ? seg : ci.len - done;

        RankX *px = s.r->owner[sb];
        RankX *dx = d.r->owner[db];
        // READ from a P incarnation other than the one that accepted the
        // transfer (or when none did): it restarted on the same address.
        // Only reading, harmless to P; D can learn it only from the
        // instance ids, possibly after reading. Recorded: D must not
        // report the transfer OK (VerifyOk). Reads of the accepting
        // instance's blocks are checked below as always.
        const RankX *acc = dx != nullptr && dx->live
                               ? dx->t->p[dx->tp].get() : nullptr;
        if (!ci.is_put && dx != nullptr && dx->live &&
            s.r->dp == dx->t->pdp && s.r->tp == dx->tp &&
            (acc == nullptr || !acc->requested || acc->rank != s.r)) {
            if (dx->stale.empty()) {
                dx->stale = Fmt("%s layer %u block %" PRIu64 ", an instance "
                                "that never accepted it (%s)",
                                s.r->name().c_str(), s.layer, sb,
                                acc == nullptr ? "its P rank was down at "
                                "creation"
                                : !acc->requested
                                    ? "its P rank never registered it"
                                    : ("accepted by " +
                                       acc->rank->name()).c_str());
                w_.Trace("  stale read into %s for %s: %s",
                         d.r->name().c_str(), dx->t->tid.c_str(),
                         dx->stale.c_str());
            }
            res_.stale_reads++;
            done += seg;
            continue;
        }
        if (px == nullptr || !px->live || !px->ready[s.layer]) {
            Fail(Fmt("%s reads %s layer %u block %" PRIu64 " %s, which P %s",
                     op, s.r->name().c_str(), s.layer, sb, skv ? "V" : "K",
                     px == nullptr ? "holds for no transfer (free)"
                     : !px->requested
                         ? "holds for no transfer (allocated to one not "
                           "requested yet)"
                     : !px->live ? "no longer holds for a live transfer"
                                 : "has not computed yet (no layer_ready)"));
            return false;
        }
        if (dx == nullptr || !dx->live) {
            Fail(Fmt("%s writes %s layer %u block %" PRIu64 " %s, which D "
                     "holds for no live transfer (%s)", op,
                     d.r->name().c_str(), d.layer, db, dkv ? "V" : "K",
                     dx == nullptr ? "free" : dx->t->tid.c_str()));
            return false;
        }
        uint64_t    key;
        std::string why;
        if (!Expected(dx, d.layer, db, dkv, &key, &why)) {
            Fail(Fmt("%s writes %s layer %u block %" PRIu64 " of %s before "
                     "its data exists (%s); it copies %s block %" PRIu64
                     " held for %s", op, d.r->name().c_str(), d.layer, db,
                     dx->t->tid.c_str(), why.c_str(), s.r->name().c_str(), sb,
                     px->t->tid.c_str()));
            return false;
        }
        const uint8_t *src = static_cast<const uint8_t *>(ci.src) + done;
        for (uint64_t k = 0; k < seg && o_.mutate != 2; k++) {
            if (src[k] != PatternByte(key, din + k)) {
                Fail(Fmt("%s writes wrong bytes into %s layer %u block %"
                         PRIu64 " %s of %s: it copies %s layer %u block %"
                         PRIu64 " %s (held for %s) at unit offset %" PRIu64,
                         op, d.r->name().c_str(), d.layer, db,
                         dkv ? "V" : "K", dx->t->tid.c_str(),
                         s.r->name().c_str(), s.layer, sb, skv ? "V" : "K",
                         px->t->tid.c_str(), sin + k));
                return false;
            }
        }
        done += seg;
    }
    return true;
}

void Scenario::CheckDeadlines()
{
    const uint64_t bound = (uint64_t)((hs_s_ + xfer_s_ + defer_s_) * 1e6) +
                           kSlackUs;
    // WRITE D: a failure waits up to transfer + handshake timeout more for
    // the P ranks to confirm their puts fenced (kvc_write_d_fence).
    const uint64_t fence = read_ ? 0 : (uint64_t)((hs_s_ + xfer_s_) * 1e6);
    const uint64_t now   = w_.Now();

    for (auto &t : xfers_) {
        for (uint32_t tp = 0; tp < tp_; tp++) {
            for (RankX *x : {t->p[tp].get(), t->d[tp].get()}) {
                const uint64_t b = x == t->d[tp].get() ? bound + fence
                                                       : bound;
                if (x != nullptr && x->live && x->rank->state == Rank::kUp &&
                    now > x->last_us + b) {
                    Fail(Fmt("%s: no terminal event for %s %.3f s after the "
                             "framework's last call for it (bound %.3f s)",
                             x->rank->name().c_str(), t->tid.c_str(),
                             (double)(now - x->last_us) / 1e6,
                             (double)b / 1e6));
                    return;
                }
            }
        }
    }
}

} // namespace sim
