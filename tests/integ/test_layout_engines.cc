// test_layout_engines.cc - the layout property test through real engines on
// the in-memory transports (integ_sim_tests only: tests/sim): random cases
// of tests/unit/layout_oracle.h (layouts, axis orders as torch strides,
// kernel-block ratios, K/V dims, element sizes, block lists with prefix
// hits, TP pairings with replicated KV heads, READ and WRITE), each run as P
// and D instances of engines driven through the function table, and every
// byte of every D rank compared with the oracle. A refusal (at
// register_layer or as the transfer's failure) is allowed only where the
// oracle says the case may be refused.
#include "harness.h"
#include "layout_run.h"
#include "../unit/layout_oracle.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

using namespace kvt;

namespace {

struct EngRank {
    kvx_engine_t        *eng = nullptr;
    std::vector<uint8_t> buf;
    ~EngRank() { Api()->engine_destroy(eng); }
};

constexpr int kEngineCases = 10000;
const char   *kTid         = "tx-prop";

// RunEngines: "" (byte-exact), "refused: ..." or the failure.
std::string RunEngines(const oracle::Model &m, uint64_t salt)
{
    uint16_t p_port = PortBase(16), d_port = (uint16_t)(p_port + 8);
    std::vector<std::unique_ptr<EngRank>> ps, ds;
    std::vector<oracle::Tensor>           pt(1), dt(1);
    uint32_t ph = oracle::RankHeads(m, m.p_tp), dh = oracle::RankHeads(m, m.d_tp);
    oracle::Tensor p_t = oracle::MakeTensor(m, m.p_nb, ph, m.phys);
    oracle::Tensor d_t = oracle::MakeTensor(
        m, m.d_nb, dh, m.d_phys.empty() ? m.phys : m.d_phys);

    for (int side = 0; side < 2; side++) {
        bool     producer = side == 0;
        uint32_t tp       = producer ? m.p_tp : m.d_tp;
        for (uint32_t r = 0; r < tp; r++) {
            RankOpts o = LayoutRankOpts(producer, r, tp,
                                        producer ? p_port : d_port, m.write,
                                        20.0);
            std::string cfg     = RankConfig(o);
            std::unique_ptr<EngRank> e(new EngRank);
            const oracle::Tensor    &t = producer ? p_t : d_t;
            e->buf.assign(t.elems * m.elem, producer ? 0xA5 : 0xEE);
            for (uint64_t b = 0; producer && b < m.p_nb; b++) {
                oracle::WriteBlock(m, t, &e->buf, b, b,
                                   oracle::RankHead0(m, tp, r), salt);
            }
            if (Api()->engine_create(cfg.c_str(), &e->eng) != KVX_OK) {
                return std::string("engine_create: ") + Api()->last_error();
            }
            kvx_layer_desc_t d =
                oracle::Desc(m, t, &e->buf, producer ? ph : dh);
            d.mem_type     = KVX_MEM_HOST;
            kvx_status_t st = Api()->register_layer(e->eng, &d);
            if (st != KVX_OK) {
                return std::string("refused: register_layer: ") +
                       Api()->last_error();
            }
            if (Api()->start(e->eng) != KVX_OK) {
                return std::string("start: ") + Api()->last_error();
            }
            (producer ? ps : ds).push_back(std::move(e));
        }
    }
    for (auto &p : ps) {
        char       *resp = nullptr;
        std::string pp   = LayoutParams(kTid, m.write, true, d_port, m.d_tp, {});
        if (Api()->producer_request(p->eng, "req-prop", pp.c_str(),
                                    m.p_ids.data(), m.p_ids.size(),
                                    &resp) != KVX_OK) {
            return std::string("producer_request: ") + Api()->last_error();
        }
        Api()->free(resp);
    }
    std::string dp = LayoutParams(kTid, m.write, false, p_port, m.p_tp, m.p_ids);
    for (auto &d : ds) {
        if (Api()->consumer_request(d->eng, "req-prop", dp.c_str(),
                                    m.d_ids.data(), m.d_ids.size()) != KVX_OK) {
            return std::string("consumer_request: ") + Api()->last_error();
        }
    }
    for (auto &p : ps) {
        if (m.write && (Api()->layer_ready(p->eng, kTid, 0) != KVX_OK ||
                        Api()->seal_transfer(p->eng, kTid) != KVX_OK)) {
            return std::string("layer_ready/seal: ") + Api()->last_error();
        }
    }
    // A refusal shows as the failure of the side that checks the peer's
    // geometry: D in READ; P in WRITE (D then fails at its deadline).
    auto refusal = [](kvx_status_t st) {
        return st == KVX_ERR_PEER_INCOMPATIBLE || st == KVX_ERR_NOT_SUPPORTED ||
               st == KVX_ERR_LAYOUT;
    };
    std::string refused, failed;
    for (auto &d : ds) {
        kvx_status_t st = Api()->wait_transfer(d->eng, kTid, 30000);
        if (refusal(st)) {
            refused = std::string("refused: ") + Api()->last_error();
        } else if (st != KVX_OK) {
            failed = std::string("wait_transfer: ") + Api()->status_name(st) +
                     ": " + Api()->last_error();
        }
    }
    if (!failed.empty() && m.write) {
        for (auto &p : ps) {
            std::vector<kvx_event_t> ev;
            WaitFor([&] { return DrainEvents(p->eng, &ev) > 0; }, 30000);
            for (const kvx_event_t &e : ev) {
                if (e.type == KVX_EVENT_FAILED && refusal(e.status)) {
                    refused = std::string("refused: P: ") + e.reason;
                }
            }
            FreeEvents(&ev);
        }
        return !refused.empty() ? refused : failed;
    }
    if (!failed.empty() || !refused.empty()) {
        return !failed.empty() ? failed : refused;
    }
    size_t skip = m.p_ids.size() - m.d_ids.size();
    for (uint32_t r = 0; r < m.d_tp; r++) {
        std::vector<uint8_t> exp(ds[r]->buf.size(), 0xEE);
        for (size_t i = 0; i < m.d_ids.size(); i++) {
            oracle::WriteBlock(m, d_t, &exp, m.d_ids[i], m.p_ids[skip + i],
                               oracle::RankHead0(m, m.d_tp, r), salt);
        }
        size_t bad = 0;
        for (size_t j = 0; j < exp.size(); j++) {
            bad += exp[j] != ds[r]->buf[j];
        }
        if (bad != 0) {
            return "D rank " + std::to_string(r) + ": " + std::to_string(bad) +
                   " of " + std::to_string(exp.size()) + " bytes wrong";
        }
    }
    // Every P rank is released (FINISHED_SENDING).
    for (auto &p : ps) {
        std::vector<kvx_event_t> ev;
        if (!WaitFor([&] { return DrainEvents(p->eng, &ev) > 0; }, 30000)) {
            return "a P rank got no event";
        }
        bool ok = ev[0].type == KVX_EVENT_FINISHED_SENDING;
        FreeEvents(&ev);
        if (!ok) {
            return "a P rank's first event is not FINISHED_SENDING";
        }
    }
    return "";
}

class LayoutEngines : public ::testing::TestWithParam<int> {};

TEST_P(LayoutEngines, ExactOrRefusedThroughTheEngines)
{
    std::mt19937_64 rng(0xE1617E5ull + (uint64_t)GetParam() * 7919u);
    oracle::Model   m   = oracle::DrawModel(rng);
    std::string     out = RunEngines(m, (uint64_t)GetParam() + 1);
    if (out.rfind("refused: ", 0) == 0) {
        EXPECT_TRUE(oracle::MayRefuse(m)) << out << "\n  " << oracle::Describe(m);
    } else {
        EXPECT_EQ("", out) << oracle::Describe(m);
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, LayoutEngines,
                         ::testing::Range(0, kEngineCases));

} // namespace
