// READ mode end to end: real UCX endpoints and real nng sockets between
// engines in this process, every byte verified against a pattern keyed by
// (rank, layer, block).
#include "harness.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

using namespace kvt;

namespace {

struct Pair {
    ModelSpec                          model = ThreeLayerModel();
    std::vector<std::unique_ptr<Rank>> p, d;
    uint16_t                           hs = 0;
};

// Builds tp P ranks and tp D ranks; P has 32 blocks, D 24 (different
// num_blocks moves the remote V plane).
void MakePair(Pair *pair, uint32_t tp, const std::string &tls)
{
    pair->hs = PortBase((int)tp * 2);
    for (uint32_t r = 0; r < tp; r++) {
        RankOpts o;
        o.producer    = true;
        o.tp_rank     = r;
        o.tp_size     = tp;
        o.num_blocks  = 32;
        o.hs_port     = pair->hs;
        o.notify_port = (uint16_t)(pair->hs + 20000);
        o.tls         = tls;
        pair->p.emplace_back(new Rank);
        ASSERT_EQ(KVX_OK, MakeRank(pair->model, o, pair->p.back().get()))
            << Api()->last_error();
    }
    for (uint32_t r = 0; r < tp; r++) {
        RankOpts o;
        o.producer    = false;
        o.tp_rank     = r;
        o.tp_size     = tp;
        o.num_blocks  = 24;
        o.hs_port     = (uint16_t)(pair->hs + tp);
        o.notify_port = (uint16_t)(pair->hs + tp + 20000);
        o.tls         = tls;
        pair->d.emplace_back(new Rank);
        ASSERT_EQ(KVX_OK, MakeRank(pair->model, o, pair->d.back().get()))
            << Api()->last_error();
    }
}

// MakeSmPair: one READ P rank (32 blocks, handshake port hs) and one D rank
// (24 blocks, hs + 1) over ucx_tls sm; region: layers in alloc_region
// memory; extra: more extra_config members for both.
void MakeSmPair(const ModelSpec &m, uint16_t hs, bool region,
                const std::string &extra, Rank *p, Rank *d)
{
    RankOpts o;
    o.tls         = "sm";
    o.region      = region;
    o.extra       = extra;
    o.hs_port     = hs;
    o.notify_port = (uint16_t)(hs + 20000);
    ASSERT_EQ(KVX_OK, MakeRank(m, o, p)) << Api()->last_error();
    o.producer    = false;
    o.num_blocks  = 24;
    o.hs_port     = (uint16_t)(hs + 1);
    o.notify_port = (uint16_t)(hs + 1 + 20000);
    ASSERT_EQ(KVX_OK, MakeRank(m, o, d)) << Api()->last_error();
}

class ReadTransfer
    : public ::testing::TestWithParam<std::tuple<std::string, uint32_t>> {};

TEST_P(ReadTransfer, EveryByteLandsAndBothSidesFinish)
{
    const std::string tls = std::get<0>(GetParam());
    const uint32_t    tp  = std::get<1>(GetParam());
    Pair              pair;
    MakePair(&pair, tp, tls);
    if (HasFatalFailure()) {
        return;
    }
    // Scattered P blocks, a shorter D list (prefix hit reads the last ones).
    const std::vector<uint64_t> premote = {3, 4, 5, 17, 30, 9};
    const std::vector<uint64_t> dlocal  = {0, 1, 2, 20, 7};
    const std::string           tid     = "tx-read-" + tls;

    for (uint32_t r = 0; r < tp; r++) {
        char *resp = nullptr;
        std::string pp = "{\"transfer_id\":\"" + tid + "\",\"do_remote_decode\":true}";
        ASSERT_EQ(KVX_OK, Api()->producer_request(pair.p[r]->eng, "req-1",
                                                  pp.c_str(), premote.data(),
                                                  premote.size(), &resp))
            << Api()->last_error();
        Api()->free(resp);
    }
    for (uint32_t r = 0; r < tp; r++) {
        std::string params = Params(tid, "127.0.0.1", pair.hs,
                                    (uint16_t)(pair.hs + 20000), premote, tp);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(pair.d[r]->eng, "req-1",
                                                  params.c_str(), dlocal.data(),
                                                  dlocal.size()))
            << Api()->last_error();
    }
    for (uint32_t r = 0; r < tp; r++) {
        for (uint32_t l = 0; l < 3; l++) {
            ASSERT_EQ(KVX_OK, Api()->wait_layer(pair.d[r]->eng, tid.c_str(), l,
                                                20000))
                << Api()->last_error();
        }
        ASSERT_EQ(KVX_OK, Api()->wait_transfer(pair.d[r]->eng, tid.c_str(),
                                               20000))
            << Api()->last_error();
        EXPECT_EQ("", VerifyPull(pair.model, *pair.d[r], r, dlocal, premote))
            << "decode rank " << r;
    }
    // D reports finished-receiving; each P rank finished-sending once its
    // quorum (one D rank each, equal TP) released.
    for (uint32_t r = 0; r < tp; r++) {
        std::vector<kvx_event_t> dev, pev;
        DrainEvents(pair.d[r]->eng, &dev);
        ASSERT_EQ(1u, dev.size());
        EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, dev[0].type);
        EXPECT_EQ(tid, dev[0].transfer_id);
        ASSERT_TRUE(WaitFor([&] { DrainEvents(pair.p[r]->eng, &pev);
                                  return !pev.empty(); }, 10000));
        EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
        EXPECT_EQ(tid, pev[0].transfer_id);
        EXPECT_EQ(premote.size(), pev[0].num_block_ids);
        FreeEvents(&dev);
        FreeEvents(&pev);
    }
    char *json = nullptr;
    ASSERT_EQ(KVX_OK, Api()->transports(pair.d[0]->eng, &json));
    EXPECT_NE(std::string(json).find("\"state\":\"ready\""), std::string::npos)
        << json;
    EXPECT_NE(std::string(json).find(tls == "tcp" ? "tcp" : "sysv"),
              std::string::npos) << json;
    Api()->free(json);
}

// A peer reads only blocks P holds for a live transfer (issue 11): after
// P's transfer finished, D (a legitimate, handshaken peer) asking for the
// same blocks again under a transfer id P never accepted gets nothing, and
// none of D's blocks change. Over tcp the gets are kvxfer's own active
// messages, whose target asks the engine's exposure for every range.
TEST(ReadExposure, BlocksPNoLongerHoldsAreNotServed)
{
    Pair pair;
    MakePair(&pair, 1, "tcp");
    if (HasFatalFailure()) {
        return;
    }
    Rank                       &p = *pair.p[0], &d = *pair.d[0];
    const std::vector<uint64_t> premote = {3, 4, 5};
    const std::vector<uint64_t> dlocal  = {0, 1, 2};
    char                       *resp    = nullptr;

    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-1",
                                              "{\"transfer_id\":\"tx-held\"}",
                                              premote.data(), premote.size(),
                                              &resp))
        << Api()->last_error();
    Api()->free(resp);
    std::string params = Params("tx-held", "127.0.0.1", pair.hs,
                                (uint16_t)(pair.hs + 20000), premote, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-1", params.c_str(),
                                              dlocal.data(), dlocal.size()));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, "tx-held", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pair.model, d, 0, dlocal, premote));
    std::vector<kvx_event_t> pev, dev;
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type); // P may reuse them
    FreeEvents(&pev);
    DrainEvents(d.eng, &dev);
    FreeEvents(&dev);
    EXPECT_EQ(0, StatCount(p.eng, "data_refused"));

    // The same blocks again, under an id P never accepted.
    const std::vector<uint64_t> dother = {10, 11, 12};
    std::vector<std::vector<uint8_t>> before = d.bufs;
    params = Params("tx-unheld", "127.0.0.1", pair.hs,
                    (uint16_t)(pair.hs + 20000), premote, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-2", params.c_str(),
                                              dother.data(), dother.size()));
    // Refused as not exposed, D retries (P's producer_request could still
    // come) until its deadline; here the framework gives up first.
    ASSERT_TRUE(WaitFor([&] { return StatCount(d.eng, "read_retries") > 2; },
                        10000));
    ASSERT_EQ(KVX_OK, Api()->consumer_abort(d.eng, "req-2", params.c_str()));
    EXPECT_NE(KVX_OK, Api()->wait_transfer(d.eng, "tx-unheld", 20000));
    ASSERT_TRUE(WaitFor([&] { DrainEvents(d.eng, &dev); return !dev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FAILED, dev[0].type);
    EXPECT_EQ(KVX_ERR_CANCELED, dev[0].status);
    EXPECT_EQ(dother.size(), dev[0].num_block_ids);
    FreeEvents(&dev);
    EXPECT_GT(StatCount(p.eng, "data_not_exposed"), 0);
    for (size_t l = 0; l < d.bufs.size(); l++) {
        EXPECT_TRUE(d.bufs[l] == before[l]) << "layer " << l << " changed";
    }
}

// D reads only while P still holds the blocks (SPEC §10, §14): P's
// response says when it took the request (remote_accepted) and for how long
// it holds the blocks (remote_hold_ms, its defer_timeout); D ends its reads
// clock_skew (0.5 s) before that, because at the end of the hold P reports
// the blocks free whatever D's gets on a direct RMA lane are doing. A
// request that reaches D after the hold ended reads nothing and fails
// naming the hold; one within it is byte-exact.
TEST(ReadHold, DecodeReadsOnlyWhileTheProducerHoldsTheBlocks)
{
    Pair pair;
    MakePair(&pair, 1, "tcp");
    if (HasFatalFailure()) {
        return;
    }
    Rank                       &p = *pair.p[0], &d = *pair.d[0];
    const std::vector<uint64_t> premote = {3, 4, 5};
    const std::vector<uint64_t> dlocal  = {0, 1, 2};
    std::vector<kvx_event_t>    pev, dev;

    for (const char *tid : {"tx-late", "tx-in-time"}) {
        char       *resp = nullptr;
        std::string pp   = std::string("{\"transfer_id\":\"") + tid + "\"}";

        ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-1", pp.c_str(),
                                                  premote.data(),
                                                  premote.size(), &resp))
            << Api()->last_error();
        std::string r(resp);
        Api()->free(resp);
        std::smatch acc, hold;
        ASSERT_TRUE(std::regex_search(
            r, acc, std::regex("\"remote_accepted\":\"([0-9]+)\"")))
            << r;
        ASSERT_TRUE(std::regex_search(
            r, hold, std::regex("\"remote_hold_ms\":([0-9]+)")))
            << r;
        EXPECT_EQ("60000", hold[1].str()); // defer_timeout 60 s
        const bool  late = std::string(tid) == "tx-late";
        // Late: the hold said is shorter than clock_skew, so it ended for D
        // before D got the request.
        std::string params =
            Params(tid, "127.0.0.1", pair.hs, (uint16_t)(pair.hs + 20000),
                   premote, 1,
                   ",\"remote_accepted\":\"" + acc[1].str() +
                       "\",\"remote_hold_ms\":" +
                       (late ? std::string("400") : hold[1].str()));
        std::vector<std::vector<uint8_t>> before = d.bufs;

        ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-1",
                                                  params.c_str(), dlocal.data(),
                                                  dlocal.size()))
            << Api()->last_error();
        ASSERT_TRUE(WaitFor([&] { DrainEvents(d.eng, &dev);
                                  return !dev.empty(); }, 20000));
        if (late) {
            EXPECT_EQ(KVX_EVENT_FAILED, dev[0].type);
            EXPECT_EQ(KVX_ERR_TRANSFER_TIMEOUT, dev[0].status);
            EXPECT_NE(std::string(dev[0].reason).find("hold of the blocks"),
                      std::string::npos) << dev[0].reason;
            EXPECT_EQ(dlocal.size(), dev[0].num_block_ids);
            for (size_t l = 0; l < d.bufs.size(); l++) {
                EXPECT_TRUE(d.bufs[l] == before[l]) << "layer " << l;
            }
        } else {
            EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, dev[0].type)
                << dev[0].reason;
            EXPECT_EQ("", VerifyPull(pair.model, d, 0, dlocal, premote));
        }
        // Either way D releases P's blocks.
        ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev);
                                  return !pev.empty(); }, 10000));
        EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
        FreeEvents(&pev);
        FreeEvents(&dev);
    }
    // The late transfer posted no get at all (none refused, none waited).
    EXPECT_EQ(0, StatCount(p.eng, "data_refused"));
    EXPECT_EQ(0, StatCount(p.eng, "data_not_exposed"));
}

// HoldPair: P TP 2 and D TP 2 over sm with the pools in alloc_region memory
// (a direct lane: nothing at P refuses a get), P rank 1 holding blocks for
// p1_defer seconds, P rank 0 for 60 s.
void MakeHoldPair(Pair *pair, double p1_defer)
{
    pair->hs = PortBase(4);
    for (int producer = 1; producer >= 0; producer--) {
        for (uint32_t r = 0; r < 2; r++) {
            RankOpts o;
            o.producer      = producer != 0;
            o.tp_rank       = r;
            o.tp_size       = 2;
            o.num_blocks    = producer ? 32 : 24;
            o.hs_port       = (uint16_t)(pair->hs + (producer ? 0 : 2));
            o.notify_port   = (uint16_t)(o.hs_port + 20000);
            o.tls           = "sm";
            o.region        = true;
            o.defer_timeout = producer && r == 1 ? p1_defer : 60.0;
            auto &v = producer ? pair->p : pair->d;
            v.emplace_back(new Rank);
            ASSERT_EQ(KVX_OK, MakeRank(pair->model, o, v.back().get()))
                << Api()->last_error();
        }
    }
}

// AwaitEvent: the first event of eng within 20 s (type 0 if none).
kvx_event_t AwaitEvent(kvx_engine_t *eng, std::vector<kvx_event_t> *evs)
{
    kvx_event_t none{};
    if (!WaitFor([&] { DrainEvents(eng, evs); return !evs->empty(); },
                 20000)) {
        return none;
    }
    return (*evs)[0];
}

// With P TP > 1 each P rank takes the request on its own, and D gets one
// rank's response: its remote_accepted and remote_hold_ms bound D's reads
// from that rank only. A P rank whose hold ended (its defer_timeout ran
// out, and the framework reused its blocks) is read over a direct lane
// without P ever seeing a get, so D asks each other rank it reads from how
// much longer it holds the blocks (a hold message) and is OK only with
// every answer: here D rank 1, which reads from P rank 1 only, fails
// naming its blocks instead of reporting OK with the framework's new
// bytes. A rank that still holds them answers, and the reads are
// byte-exact; D waits for a rank that has not taken the request yet.
TEST(ReadHold, EachProducerRankReadFromConfirmsItsHold)
{
    Pair pair;
    MakeHoldPair(&pair, 1.0);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> premote = {3, 4, 5, 17};
    const std::vector<uint64_t> dlocal  = {0, 1, 2, 20};
    long long                   asked   = 0;
    // refused(st): how D rank 1 fails once P rank 1's hold ended: its hold
    // answer (the simulator serves every get through P's exposure, which
    // refuses them as well: whichever comes first)
#if KVT_SIM_TRANSPORTS
    const bool sim = true;
#else
    const bool sim = false;
#endif
    auto refused = [sim](kvx_status_t st) {
        return st == KVX_ERR_NOT_EXPOSED ||
               (sim && st == KVX_ERR_OUT_OF_BOUNDS);
    };

    for (const char *tid : {"tx-held", "tx-early", "tx-ended"}) {
        SCOPED_TRACE(tid);
        const bool        ended = std::string(tid) == "tx-ended";
        const bool        early = std::string(tid) == "tx-early";
        const std::string pp    = std::string("{\"transfer_id\":\"") + tid +
                               "\"}";
        std::vector<kvx_event_t> ev;
        // take(r): P rank r's producer_request; its response
        auto take = [&](uint32_t r) {
            char *resp = nullptr;
            EXPECT_EQ(KVX_OK, Api()->producer_request(
                                  pair.p[r]->eng, "req-1", pp.c_str(),
                                  premote.data(), premote.size(), &resp))
                << Api()->last_error();
            std::string out = resp != nullptr ? resp : "";
            Api()->free(resp);
            return out;
        };

        if (!early) {
            take(1);
        }
        if (ended) {
            // P rank 1's hold runs out; the framework reuses its blocks.
            kvx_event_t e = AwaitEvent(pair.p[1]->eng, &ev);
            ASSERT_EQ(KVX_EVENT_FAILED, e.type);
            FreeEvents(&ev);
            for (size_t l = 0; l < pair.p[1]->region.size(); l++) {
                memset(pair.p[1]->region[l], 0x5A, pair.p[1]->bufs[l].size());
            }
        }
        // P rank 0's response, as a framework passes it
        const std::string params = take(0);
        for (uint32_t r = 0; r < 2; r++) {
            ASSERT_EQ(KVX_OK, Api()->consumer_request(
                                  pair.d[r]->eng, "req-1", params.c_str(),
                                  dlocal.data(), dlocal.size()))
                << Api()->last_error();
        }
        if (early) {
            // P rank 1 has not taken the request: it answers so, and D rank
            // 1 asks again and waits for its producer_request (whatever D
            // read is only known to be the request's blocks once that rank
            // holds them).
            EXPECT_EQ(asked + 2,
                      StatAwait(pair.d[1]->eng, "hold_asked", asked + 2));
            DrainEvents(pair.d[1]->eng, &ev);
            EXPECT_TRUE(ev.empty()) << ev[0].reason;
            FreeEvents(&ev);
            take(1);
        }
        for (uint32_t r = 0; r < 2; r++) {
            // A layer's bytes count only once the transfer could be OK: a
            // layer-wise consumer (wait_layer) gets the failure too.
            kvx_status_t lst = Api()->wait_layer(pair.d[r]->eng, tid, 0,
                                                 20000);
            if (ended && r == 1) {
                EXPECT_TRUE(refused(lst)) << lst << ": " << Api()->last_error();
            } else {
                EXPECT_EQ(KVX_OK, lst)
                    << "decode rank " << r << ": " << Api()->last_error();
            }
            kvx_event_t e = AwaitEvent(pair.d[r]->eng, &ev);
            if (ended && r == 1) {
                EXPECT_EQ(KVX_EVENT_FAILED, e.type) << e.reason;
                EXPECT_TRUE(refused(e.status)) << e.reason;
#if !KVT_SIM_TRANSPORTS
                EXPECT_NE(std::string(e.reason).find("no longer holds"),
                          std::string::npos) << e.reason;
#endif
                EXPECT_EQ(dlocal.size(), e.num_block_ids);
            } else {
                EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, e.type) << e.reason;
                SyncFromRegion(pair.d[r].get());
                EXPECT_EQ("", VerifyPull(pair.model, *pair.d[r], r, dlocal,
                                         premote))
                    << "decode rank " << r;
            }
            FreeEvents(&ev);
        }
        // D rank 0 reads from the rank that answered: nothing asked.
        EXPECT_EQ(0, StatCount(pair.d[0]->eng, "hold_asked"));
        // D rank 1 asked P rank 1 once (again while it had not taken the
        // request).
        if (early) {
            EXPECT_LE(asked + 2, StatCount(pair.d[1]->eng, "hold_asked"));
        } else {
            EXPECT_EQ(asked + 1, StatCount(pair.d[1]->eng, "hold_asked"));
        }
        asked = StatCount(pair.d[1]->eng, "hold_asked");
        for (uint32_t r = 0; r < (ended ? 1u : 2u); r++) {
            kvx_event_t e = AwaitEvent(pair.p[r]->eng, &ev);
            EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, e.type) << e.reason;
            FreeEvents(&ev);
        }
    }
}

// engine_destroy of a D rank that waits for a P rank to take the request
// (its hold answer said not yet): the transfer ends there and its release
// still reaches P, which keeps it until its producer_request and then
// finishes at once (no FAILED at defer_timeout).
TEST(ReadHold, DestroyWhileAskingAgainStillReleases)
{
    Pair pair;
    MakeHoldPair(&pair, 60.0);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> ids = {3, 4};
    const std::string           pp  = "{\"transfer_id\":\"tx-destroy\"}";
    std::vector<kvx_event_t>    ev;
    char                       *resp = nullptr;

    ASSERT_EQ(KVX_OK, Api()->producer_request(pair.p[0]->eng, "req-1",
                                              pp.c_str(), ids.data(),
                                              ids.size(), &resp))
        << Api()->last_error();
    const std::string params(resp);
    Api()->free(resp);
    for (uint32_t r = 0; r < 2; r++) {
        ASSERT_EQ(KVX_OK, Api()->consumer_request(pair.d[r]->eng, "req-1",
                                                  params.c_str(), ids.data(),
                                                  ids.size()))
            << Api()->last_error();
    }
    ASSERT_EQ(2, StatAwait(pair.d[1]->eng, "hold_asked", 2));
    pair.d[1].reset(); // engine_destroy
    ASSERT_EQ(KVX_OK, Api()->producer_request(pair.p[1]->eng, "req-1",
                                              pp.c_str(), ids.data(),
                                              ids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    kvx_event_t e = AwaitEvent(pair.p[1]->eng, &ev);
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, e.type) << e.reason;
    FreeEvents(&ev);
}

// An instance a request's params claim for P (remote_instance) is checked
// with P, not taken: a claim P does not confirm fails that transfer only.
// When D took it as P's restart, D dropped the live instance, refused
// every later handshake with it as stale and failed every later transfer.
TEST(ReadPeer, ClaimedInstanceIsCheckedNotTaken)
{
    Pair pair;
    MakePair(&pair, 1, "tcp");
    if (HasFatalFailure()) {
        return;
    }
    Rank                       &p = *pair.p[0], &d = *pair.d[0];
    const std::vector<uint64_t> premote = {3, 4};
    const std::vector<uint64_t> dlocal  = {0, 1};
    std::vector<kvx_event_t>    pev, dev;

    for (const char *tid : {"tx-ok-1", "tx-claim", "tx-ok-2", "tx-ok-3"}) {
        SCOPED_TRACE(tid);
        char       *resp = nullptr;
        std::string pp   = std::string("{\"transfer_id\":\"") + tid + "\"}";
        const bool  claim = std::string(tid) == "tx-claim";

        ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-1", pp.c_str(),
                                                  premote.data(),
                                                  premote.size(), &resp))
            << Api()->last_error();
        Api()->free(resp);
        std::string params = Params(
            tid, "127.0.0.1", pair.hs, (uint16_t)(pair.hs + 20000), premote, 1,
            claim ? ",\"remote_instance\":\"18446744073709551000\","
                    "\"remote_tp_rank\":0"
                  : "");
        for (auto &b : d.bufs) {
            std::fill(b.begin(), b.end(), 0xEE);
        }
        ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-1",
                                                  params.c_str(), dlocal.data(),
                                                  dlocal.size()))
            << Api()->last_error();
        ASSERT_TRUE(WaitFor([&] { DrainEvents(d.eng, &dev);
                                  return !dev.empty(); }, 20000));
        if (claim) {
            EXPECT_EQ(KVX_EVENT_FAILED, dev[0].type);
            EXPECT_NE(std::string(dev[0].reason).find("18446744073709551000"),
                      std::string::npos) << dev[0].reason;
        } else {
            EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, dev[0].type)
                << dev[0].reason;
            EXPECT_EQ("", VerifyPull(pair.model, d, 0, dlocal, premote));
        }
        FreeEvents(&dev);
        if (!claim) { // D's release frees P's blocks
            ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev);
                                      return !pev.empty(); }, 10000));
            FreeEvents(&pev);
        }
    }
}

// EarlyRead: D asks for tid from P before P's producer_request; returns
// once D's gets were refused as not exposed.
static void EarlyRead(Pair &pair, const char *tid,
                      const std::vector<uint64_t> &premote,
                      const std::vector<uint64_t> &dlocal)
{
    Rank       &d      = *pair.d[0];
    std::string params = Params(tid, "127.0.0.1", pair.hs,
                                (uint16_t)(pair.hs + 20000), premote, 1);

    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-1", params.c_str(),
                                              dlocal.data(), dlocal.size()));
    ASSERT_TRUE(WaitFor([&] { return StatCount(d.eng, "read_retries") > 0; },
                        10000))
        << "D's gets were not refused as not exposed";
}

// ExposeLate: P's producer_request for tid comes; D's transfer completes
// byte-exact and P gets its blocks back.
static void ExposeLate(Pair &pair, const char *tid,
                       const std::vector<uint64_t> &premote,
                       const std::vector<uint64_t> &dlocal)
{
    Rank                    &p = *pair.p[0], &d = *pair.d[0];
    char                    *resp = nullptr;
    std::vector<kvx_event_t> pev;
    std::string pp = std::string("{\"transfer_id\":\"") + tid + "\"}";

    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-1", pp.c_str(),
                                              premote.data(), premote.size(),
                                              &resp))
        << Api()->last_error();
    Api()->free(resp);
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, tid, 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pair.model, d, 0, dlocal, premote));
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
    FreeEvents(&pev);
}

// D's gets may reach a P rank before that rank's producer_request (SPEC
// §7: a release can overtake P's own bookkeeping; params built from
// config): they are refused as not exposed yet and retried until the
// deadline, and the transfer is byte-exact once P holds the blocks.
TEST(ReadExposure, GetsBeforeProducerRequestWaitForIt)
{
    Pair pair;
    MakePair(&pair, 1, "tcp");
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> premote = {6, 2, 9, 10};
    const std::vector<uint64_t> dlocal  = {1, 3, 4, 5};

    EarlyRead(pair, "tx-early", premote, dlocal);
    if (HasFatalFailure()) {
        return;
    }
    EXPECT_GT(StatCount(pair.p[0]->eng, "data_not_exposed"), 0);
    ExposeLate(pair, "tx-early", premote, dlocal);
}

// Those retries come on their own schedule (0.1, 0.2, 0.4, 0.8, 1.6 ms
// ...: the data plane's tick_at), not on the engine's periodic tick (every
// 10 ms or more), which made every early get cost at least a whole tick.
// A layer's seventh refusal comes about 6 ms (plus six round trips) after
// its first on schedule, and 50 ms or more after it on the tick alone (the
// model has three layers, each its own get: 21 refusals). Without the
// schedule it fails on the simulator (integ_sim: virtual time, a tick every
// 10 ms) and with UCX.
TEST(ReadExposure, RetriesComeOnTheirScheduleNotOnTheTick)
{
    Pair pair;
    MakePair(&pair, 1, "tcp");
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> premote = {7, 8};
    const std::vector<uint64_t> dlocal  = {2, 6};

    EarlyRead(pair, "tx-soon", premote, dlocal);
    if (HasFatalFailure()) {
        return;
    }
    EXPECT_TRUE(WaitFor([&] { return StatCount(pair.d[0]->eng,
                                               "read_retries") >= 21; }, 40))
        << StatCount(pair.d[0]->eng, "read_retries")
        << " refusals within 40 ms";
    ExposeLate(pair, "tx-soon", premote, dlocal);
}

// Found in review: "not exposed" must not be retried into another
// transfer's hold. P's hold of tx-old expires (defer_timeout), P reuses the
// blocks for tx-new; D's late request of tx-old must fail, not read tx-new's
// bytes: the check is per transfer, and an ended transfer is final.
TEST(ReadExposure, ExpiredHoldReusedByAnotherTransferIsNotServed)
{
    ModelSpec model = ThreeLayerModel();
    uint16_t  hs    = PortBase(2);
    Rank      p, d;
    RankOpts  po, dopt;

    po.producer      = true;
    po.num_blocks    = 32;
    po.hs_port       = hs;
    po.notify_port   = (uint16_t)(hs + 20000);
    po.defer_timeout = 0.3;
    dopt.producer    = false;
    dopt.num_blocks  = 24;
    dopt.hs_port     = (uint16_t)(hs + 1);
    dopt.notify_port = (uint16_t)(hs + 1 + 20000);
    ASSERT_EQ(KVX_OK, MakeRank(model, po, &p)) << Api()->last_error();
    ASSERT_EQ(KVX_OK, MakeRank(model, dopt, &d)) << Api()->last_error();
    const std::vector<uint64_t> ids    = {3, 4, 5};
    const std::vector<uint64_t> dlocal = {0, 1, 2};
    char                       *resp   = nullptr;
    std::vector<kvx_event_t>    pev, dev;

    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-1",
                                              "{\"transfer_id\":\"tx-old\"}",
                                              ids.data(), ids.size(), &resp));
    Api()->free(resp);
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FAILED, pev[0].type); // defer_timeout: blocks free
    FreeEvents(&pev);
    for (auto &b : p.bufs) {
        memset(b.data(), 0x77, b.size()); // the framework reuses them
    }
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "req-2",
                                              "{\"transfer_id\":\"tx-new\"}",
                                              ids.data(), ids.size(), &resp));
    Api()->free(resp);
    std::vector<std::vector<uint8_t>> before = d.bufs;
    std::string params = Params("tx-old", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), ids, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "req-1", params.c_str(),
                                              dlocal.data(), dlocal.size()));
    EXPECT_NE(KVX_OK, Api()->wait_transfer(d.eng, "tx-old", 10000));
    ASSERT_TRUE(WaitFor([&] { DrainEvents(d.eng, &dev); return !dev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FAILED, dev[0].type);
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS, dev[0].status) << dev[0].reason;
    FreeEvents(&dev);
    EXPECT_EQ(0, StatCount(d.eng, "read_retries"));
    EXPECT_GT(StatCount(p.eng, "data_refused"), 0);
    for (size_t l = 0; l < d.bufs.size(); l++) {
        EXPECT_TRUE(d.bufs[l] == before[l]) << "layer " << l << " changed";
    }
}

// With read_bind_decode_host a P READ transfer is bound to the decode host
// its request id names (issue 11): gets from any other host, over kvxfer's
// checked active messages, are refused as bound to another peer (D fails
// naming it, its blocks untouched) and so is that host's release (P keeps
// holding); the host the request id names reads and releases as usual.
TEST(ReadExposure, BoundToTheDecodeHostItsRequestIdNames)
{
    ModelSpec model = ThreeLayerModel();
    uint16_t  hs    = PortBase(2);
    Rank      p, d;
    RankOpts  po, dopt;

    po.producer      = true;
    po.num_blocks    = 32;
    po.hs_port       = hs;
    po.notify_port   = (uint16_t)(hs + 20000);
    po.extra         = "\"read_bind_decode_host\":true";
    dopt.producer    = false;
    dopt.num_blocks  = 24;
    dopt.hs_port     = (uint16_t)(hs + 1);
    dopt.notify_port = (uint16_t)(hs + 1 + 20000);
    ASSERT_EQ(KVX_OK, MakeRank(model, po, &p)) << Api()->last_error();
    ASSERT_EQ(KVX_OK, MakeRank(model, dopt, &d)) << Api()->last_error();
    auto rid = [&](const std::string &dhost) {
        return "___prefill_addr_host:127.0.0.1,handshake:" +
               std::to_string(hs) + ",notify:" + std::to_string(hs + 20000) +
               "___decode_addr_host:" + dhost + ",handshake:" +
               std::to_string(hs + 1) + ",notify:" +
               std::to_string(hs + 1 + 20000) +
               "_0123456789abcdef0123456789abcdef";
    };
    const std::vector<uint64_t> ids    = {3, 4, 5};
    const std::vector<uint64_t> dlocal = {0, 1, 2};
    char                       *resp   = nullptr;
    std::vector<kvx_event_t>    pev, dev;

    // Bound to 192.0.2.77; D reads from loopback.
    std::string far = rid("192.0.2.77");
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, far.c_str(),
                                              "{\"transfer_id\":\"tx-far\"}",
                                              ids.data(), ids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    std::vector<std::vector<uint8_t>> before = d.bufs;
    std::string params = Params("tx-far", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), ids, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, far.c_str(),
                                              params.c_str(), dlocal.data(),
                                              dlocal.size()));
    EXPECT_NE(KVX_OK, Api()->wait_transfer(d.eng, "tx-far", 10000));
    ASSERT_TRUE(WaitFor([&] { DrainEvents(d.eng, &dev); return !dev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FAILED, dev[0].type);
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, dev[0].status) << dev[0].reason;
    EXPECT_NE(std::string(dev[0].reason).find("another decode host"),
              std::string::npos) << dev[0].reason;
    FreeEvents(&dev);
    EXPECT_GT(StatCount(p.eng, "data_wrong_peer"), 0);
    EXPECT_EQ(0, StatCount(d.eng, "read_retries"));
    for (size_t l = 0; l < d.bufs.size(); l++) {
        EXPECT_TRUE(d.bufs[l] == before[l]) << "layer " << l << " changed";
    }
    // D released P on failing; P refuses that release and keeps holding.
    ASSERT_TRUE(WaitFor([&] {
        return StatCount(p.eng, "notify.wrong_peer") > 0; }, 10000));
    DrainEvents(p.eng, &pev);
    EXPECT_TRUE(pev.empty()) << "P must still hold tx-far";
    FreeEvents(&pev);

    // Bound to the host D reads from: served and released.
    std::string near = rid("127.0.0.1");
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, near.c_str(),
                                              "{\"transfer_id\":\"tx-near\"}",
                                              ids.data(), ids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    params = Params("tx-near", "127.0.0.1", hs, (uint16_t)(hs + 20000), ids,
                    1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, near.c_str(),
                                              params.c_str(), dlocal.data(),
                                              dlocal.size()));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, "tx-near", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(model, d, 0, dlocal, ids));
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); },
                        10000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
    EXPECT_EQ(std::string("tx-near"), pev[0].transfer_id);
    FreeEvents(&pev);
    DrainEvents(d.eng, &dev);
    FreeEvents(&dev);
}

INSTANTIATE_TEST_SUITE_P(
    TlsTp, ReadTransfer,
    ::testing::Combine(::testing::Values(std::string("tcp"), std::string("sm")),
                       ::testing::Values(1u, 2u)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, uint32_t>> &i) {
        return std::get<0>(i.param) + "Tp" + std::to_string(std::get<1>(i.param));
    });

} // namespace

namespace {

// With the KV pool in UCX-allocated memory (alloc_region), shared-memory
// peers copy directly instead of going through UCX 1.13's emulation.
TEST(ReadRegion, UcxAllocatedPoolGivesDirectSharedMemoryCopies)
{
    ModelSpec m  = ThreeLayerModel();
    uint16_t  hs = PortBase(2);
    Rank      p, d;
    MakeSmPair(m, hs, true, "", &p, &d);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> pids = {2, 9, 10, 11, 31};
    const std::vector<uint64_t> dids = {23, 0, 5, 6, 7};
    std::string prm = Params("tx-region", "127.0.0.1", hs, (uint16_t)(hs + 20000),
                             pids, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", prm.c_str(), dids.data(),
                                              dids.size()));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, "tx-region", 20000))
        << Api()->last_error();
    SyncFromRegion(&d);
    EXPECT_EQ("", VerifyPull(m, d, 0, dids, pids));
    char *json = nullptr;
    ASSERT_EQ(KVX_OK, Api()->transports(d.eng, &json));
    EXPECT_NE(std::string(json).find("\"rma\":\"direct-shm\""), std::string::npos)
        << json;
    Api()->free(json);

    // A direct lane never asks P: D read before P's producer_request, and
    // its release (a notice on the data plane) waits in P's early store
    // until that request, which then finishes at once.
    EXPECT_EQ(1, StatAwait(p.eng, "notices_done", 1));
    EXPECT_EQ(1, StatCount(d.eng, "releases_on_dp"));
    char *resp = nullptr;
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "r",
                                              "{\"transfer_id\":\"tx-region\"}",
                                              pids.data(), pids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    std::vector<kvx_event_t> pev;
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); },
                        5000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
    EXPECT_STREQ("tx-region", pev[0].transfer_id);
    FreeEvents(&pev);
    EXPECT_EQ(0, StatCount(p.eng, "rx.release"));
}

// RequestPair: P's producer_request, then D's consumer_request of the same
// transfer tid (P's blocks pids into D's dids), on the pair of MakeSmPair.
void RequestPair(const Rank &p, const Rank &d, uint16_t hs,
                 const std::string &tid, const std::vector<uint64_t> &pids,
                 const std::vector<uint64_t> &dids)
{
    const std::string pp   = "{\"transfer_id\":\"" + tid + "\"}";
    char             *resp = nullptr;
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "r", pp.c_str(),
                                              pids.data(), pids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    std::string prm = Params(tid, "127.0.0.1", hs, (uint16_t)(hs + 20000),
                             pids, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", prm.c_str(),
                                              dids.data(), dids.size()))
        << Api()->last_error();
}

// A thread waiting in wait_transfer runs the data plane's progress itself
// (progress_caller true; "auto" by default): the completion is seen on that thread, not
// handed over by the progress thread. driven_passes counts those passes;
// with progress_caller off there are none, and the bytes are the same.
class ReadDrive : public ::testing::TestWithParam<bool> {};

TEST_P(ReadDrive, WaitingThreadDrivesTheDataPlane)
{
    const bool caller = GetParam();
    ModelSpec  m      = ThreeLayerModel();
    uint16_t   hs     = PortBase(2);
    Rank       p, d;
    // A long lease keeps the waiter's hold over the gap between transfers:
    // posts then wait for its passes (the progress thread stays aside), so
    // the count does not depend on which thread the scheduler runs first.
    MakeSmPair(m, hs, false,
               caller ? "\"progress_caller\":true,\"progress_drive_us\":100000"
                      : "\"progress_caller\":false",
               &p, &d);
    if (HasFatalFailure()) {
        return;
    }
    // Five transfers, each waited for right after it is requested: the
    // first at least spans the handshake, so the wait finds work to drive.
    std::vector<uint64_t> all_p, all_d; // D blocks differ between transfers
    for (uint64_t i = 0; i < 5; i++) {
        const std::vector<uint64_t> pids = {i, 9 + i, 31 - i};
        const std::vector<uint64_t> dids = {3 * i + 2, 3 * i, 3 * i + 1};
        const std::string           tid  = "tx-drive-" + std::to_string(i);
        RequestPair(p, d, hs, tid, pids, dids);
        if (HasFatalFailure()) {
            return;
        }
        ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, tid.c_str(), 20000))
            << Api()->last_error();
        all_p.insert(all_p.end(), pids.begin(), pids.end());
        all_d.insert(all_d.end(), dids.begin(), dids.end());
        EXPECT_EQ("", VerifyPull(m, d, 0, all_d, all_p)) << tid;
    }
    const long long driven = StatCount(d.eng, "driven_passes");
    EXPECT_EQ(caller ? 1 : 0, StatCount(d.eng, "waits_drive"));
    if (caller) {
        EXPECT_GT(driven, 0);
    } else {
        EXPECT_EQ(0, driven);
    }
    std::vector<kvx_event_t> pev;
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev);
                              return pev.size() >= 5; }, 10000));
    FreeEvents(&pev);
}

// A waiter whose wait was satisfied holds a lease (progress_drive_us): the
// progress thread stays aside and a post skips its wake-up, expecting the
// waiter back. No timer marks the lease's end; the progress thread looks
// again every millisecond. Here nobody waits again: the second transfer is
// posted right after the first one's wait returned (inside its 20 ms lease,
// unless the scheduler delays this thread that long) and only polled for
// (poll_events does not drive), so it completes only if the progress
// thread takes it over. It guards against a lease that never ends; the
// 1 ms bound itself is not timed here.
TEST(ReadDriveLease, PostInTheLeaseCompletesWithNoWaiter)
{
    ModelSpec m  = ThreeLayerModel();
    uint16_t  hs = PortBase(2);
    Rank      p, d;
    MakeSmPair(m, hs, false,
               "\"progress_caller\":true,\"progress_drive_us\":20000", &p, &d);
    if (HasFatalFailure()) {
        return;
    }
    std::vector<uint64_t> all_p, all_d;
    for (uint64_t i = 0; i < 2; i++) {
        const std::vector<uint64_t> pids = {4 + i, 20 - i};
        const std::vector<uint64_t> dids = {2 * i + 1, 2 * i};
        const std::string           tid  = "tx-lease-" + std::to_string(i);
        RequestPair(p, d, hs, tid, pids, dids);
        if (HasFatalFailure()) {
            return;
        }
        all_p.insert(all_p.end(), pids.begin(), pids.end());
        all_d.insert(all_d.end(), dids.begin(), dids.end());
        if (i == 0) { // the waiter drives, then leaves with its lease
            ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, tid.c_str(), 20000))
                << Api()->last_error();
            continue;
        }
        std::vector<kvx_event_t> dev;
        bool                     done = false;
        ASSERT_TRUE(WaitFor([&] {
            DrainEvents(d.eng, &dev);
            for (const kvx_event_t &e : dev) {
                done = done || (e.type == KVX_EVENT_FINISHED_RECVING &&
                                tid == e.transfer_id);
            }
            return done;
        }, 10000)) << "the transfer posted in the lease never completed";
        FreeEvents(&dev);
    }
    EXPECT_EQ("", VerifyPull(m, d, 0, all_d, all_p));
#if !KVT_SIM_TRANSPORTS // the simulated data plane has no drive
    EXPECT_GT(StatCount(d.eng, "driven_passes"), 0);
#endif
}

// progress_caller's default, "auto", drives waits where ucx_tls names only
// host-local transports: this pair is on sm and sets no progress_caller.
// (Whether a given wait finds work to drive depends on the scheduler: the
// progress thread may complete the transfer first; stats says the mode.)
TEST(ReadDriveAuto, DefaultDrivesWaitsOverSharedMemory)
{
    ModelSpec m  = ThreeLayerModel();
    uint16_t  hs = PortBase(2);
    Rank      p, d;
    MakeSmPair(m, hs, false, "", &p, &d);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> pids = {7, 3};
    const std::vector<uint64_t> dids = {1, 5};
    RequestPair(p, d, hs, "tx-auto", pids, dids);
    if (HasFatalFailure()) {
        return;
    }
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, "tx-auto", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(m, d, 0, dids, pids));
    EXPECT_EQ(1, StatCount(d.eng, "waits_drive"));
    EXPECT_EQ(1, StatCount(p.eng, "waits_drive"));
}

INSTANTIATE_TEST_SUITE_P(CallerOnOff, ReadDrive, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool> &i) {
                             return std::string(i.param ? "caller" : "thread");
                         });

} // namespace
