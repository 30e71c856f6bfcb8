// test_layout_prop.cc - property test of KV geometry, the rank map and
// offset plans against an oracle written here from first principles.
//
// The oracle knows nothing of kvc_geom_t: a cache is a torch tensor (its
// logical shape, as a framework passes it, and strides in elements for a
// chosen physical order of the axes); the byte of element idx is
// sum(idx[i] * stride[i]) * elem_size. Every element's value is a function
// of (P block, K/V, logical token, global KV head, dim, byte), so a D rank's
// expected buffer is written from the heads it holds (vLLM: at TP t with H
// KV heads, rank r holds H/t heads from r*H/t, or with t > H the one head
// r*H/t, replicated) and the P blocks paired with its block ids (a shorter
// D list is a prefix hit: it takes the last P blocks).
//
// The library side is what the engine does with pure functions:
// kvc_geom_from_desc on each rank's tensor, kvc_rankmap_heads for the
// pairing, kvc_plan_build / _sliced / _gathered, and the runs copied as gets
// (READ: D plans, remote -> local) or puts (WRITE: P plans, local ->
// remote). A case the library refuses must be one the oracle marks as
// possibly refused (axes in an order no plan can express, a shape that
// cannot tell tokens from heads, a layout that cannot be sliced); every
// accepted case must leave every D byte exactly as the oracle says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "addr.h"
#include "error.h"
#include "layout.h"
}

#include "layout_oracle.h"

namespace {

using namespace oracle;


struct Side {
    Tensor                            t;
    uint32_t                          heads;
    std::vector<std::vector<uint8_t>> bufs; // per rank
    std::vector<kvc_geom_t>           geom;
};

// Copies runs; false if a run leaves either buffer.
bool Copy(const kvc_run_t *r, size_t n, std::vector<uint8_t> *dst, bool dst_local,
          const std::vector<uint8_t> &src)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t doff = dst_local ? r[i].local_off : r[i].remote_off;
        uint64_t soff = dst_local ? r[i].remote_off : r[i].local_off;
        if (doff + r[i].len > dst->size() || soff + r[i].len > src.size()) {
            return false;
        }
        memcpy(dst->data() + doff, src.data() + soff, r[i].len);
    }
    return true;
}

// Plans and copies one (local, remote) pairing: n == 1 whole blocks, else
// slice (gather 0: local is slice idx of remote) or part (gather 1: remote
// is part idx of local). Returns "" or the library's refusal.
std::string PlanCopy(const kvc_geom_t &lg, std::vector<uint8_t> *lbuf,
                     const kvc_geom_t &rg, std::vector<uint8_t> *rbuf,
                     uint32_t idx, uint32_t n, int gather,
                     const std::vector<uint64_t> &lids,
                     const std::vector<uint64_t> &rids, bool get)
{
    const kvc_geom_t *whole = gather ? &lg : &rg;
    std::vector<kvc_run_t> runs(
        (n > 1 ? kvc_plan_max_runs_sliced(&lg, whole, lids.size())
               : kvc_plan_max_runs(&lg, lids.size())) + 1);
    size_t       nr = 0;
    kvx_status_t st;

    if (n <= 1) {
        st = kvc_plan_build(&lg, lbuf->size(), &rg, rbuf->size(), lids.data(),
                            lids.size(), rids.data(), rids.size(), runs.data(),
                            &nr);
    } else if (gather) {
        st = kvc_plan_build_gathered(&lg, lbuf->size(), &rg, rbuf->size(), idx,
                                     n, lids.data(), lids.size(), rids.data(),
                                     rids.size(), runs.data(), &nr);
    } else {
        st = kvc_plan_build_sliced(&lg, lbuf->size(), &rg, rbuf->size(), idx, n,
                                   lids.data(), lids.size(), rids.data(),
                                   rids.size(), runs.data(), &nr);
    }
    if (st != KVX_OK) {
        return std::string(kvc_status_name(st)) + ": " + kvc_last_error();
    }
    if (nr > runs.size() - 1) {
        return "BUG: plan wrote more runs than its capacity";
    }
    bool ok = get ? Copy(runs.data(), nr, lbuf, true, *rbuf)
                  : Copy(runs.data(), nr, rbuf, false, *lbuf);
    return ok ? "" : "BUG: a run leaves a buffer";
}

struct Outcome {
    std::string refused; // library refusal ("" = accepted)
    std::string wrong;   // byte mismatch or bug ("" = exact)
};

// Runs one case. salt makes P's values differ per case.
Outcome RunCase(const Model &m, uint64_t salt)
{
    Outcome o;
    Side    p, d;
    p.heads = RankHeads(m, m.p_tp);
    d.heads = RankHeads(m, m.d_tp);
    p.t     = MakeTensor(m, m.p_nb, p.heads, m.phys);
    d.t     = MakeTensor(m, m.d_nb, d.heads,
                         m.d_phys.empty() ? m.phys : m.d_phys);
    // Fill P ranks, sentinel D ranks.
    for (uint32_t r = 0; r < m.p_tp; r++) {
        p.bufs.emplace_back(p.t.elems * m.elem, 0xA5);
        for (uint64_t b = 0; b < m.p_nb; b++) {
            WriteBlock(m, p.t, &p.bufs[r], b, b, RankHead0(m, m.p_tp, r), salt);
        }
    }
    for (uint32_t r = 0; r < m.d_tp; r++) {
        d.bufs.emplace_back(d.t.elems * m.elem, 0xEE);
    }
    // Geometry of every rank (the library).
    for (Side *s : {&p, &d}) {
        for (auto &buf : s->bufs) {
            kvx_layer_desc_t desc = Desc(m, s->t, &buf, s->heads);
            kvc_geom_t       g;
            kvx_status_t     st = kvc_geom_from_desc(&desc, &g);
            if (st != KVX_OK) {
                o.refused = std::string("geometry: ") + kvc_status_name(st) +
                            ": " + kvc_last_error();
                return o;
            }
            s->geom.push_back(g);
        }
    }
    uint32_t ph = m.kind == kKeyOnly ? 0 : p.heads;
    uint32_t dh = m.kind == kKeyOnly ? 0 : d.heads;
    // P's list trimmed to D's length (a prefix hit): WRITE puts only those.
    std::vector<uint64_t> p_tail(m.p_ids.end() - (long)m.d_ids.size(),
                                 m.p_ids.end());
    for (uint32_t dr = 0; dr < m.d_tp && o.refused.empty(); dr++) {
        kvc_rankmap_t map;
        kvx_status_t  st = kvc_rankmap_heads(m.d_tp, m.p_tp, dh, ph, dr, &map);
        if (st != KVX_OK) {
            o.refused = std::string("rankmap: ") + kvc_last_error();
            break;
        }
        if (!m.write) {
            // READ: D rank dr plans against each source.
            uint32_t nsrc = map.gather ? map.num_slices : 1;
            for (uint32_t k = 0; k < nsrc && o.refused.empty(); k++) {
                uint32_t src = map.gather ? map.release[k] : map.read_rank;
                o.refused = PlanCopy(d.geom[dr], &d.bufs[dr], p.geom[src],
                                     &p.bufs[src], map.gather ? k : map.head_slice,
                                     map.num_slices, (int)map.gather, m.d_ids,
                                     m.p_ids, true);
            }
            continue;
        }
        // WRITE: each P rank serving dr plans its puts.
        if (m.p_tp > m.d_tp) {
            for (uint32_t k = 0; k < map.num_slices && o.refused.empty(); k++) {
                uint32_t pr = map.release[k];
                o.refused = PlanCopy(p.geom[pr], &p.bufs[pr], d.geom[dr],
                                     &d.bufs[dr], k, map.num_slices, 0, p_tail,
                                     m.d_ids, false);
            }
        } else {
            uint32_t pr = map.read_rank;
            o.refused = PlanCopy(p.geom[pr], &p.bufs[pr], d.geom[dr],
                                 &d.bufs[dr], map.head_slice, map.num_slices, 1,
                                 p_tail, m.d_ids, false);
        }
    }
    if (o.refused.rfind("BUG", 0) == 0) {
        o.wrong   = o.refused;
        o.refused = "";
        return o;
    }
    if (!o.refused.empty()) {
        return o;
    }
    // The oracle's D buffers.
    size_t skip = m.p_ids.size() - m.d_ids.size();
    for (uint32_t dr = 0; dr < m.d_tp; dr++) {
        std::vector<uint8_t> exp(d.t.elems * m.elem, 0xEE);
        for (size_t i = 0; i < m.d_ids.size(); i++) {
            WriteBlock(m, d.t, &exp, m.d_ids[i], m.p_ids[skip + i],
                       RankHead0(m, m.d_tp, dr), salt);
        }
        if (exp != d.bufs[dr]) {
            size_t at = 0;
            while (exp[at] == d.bufs[dr][at]) {
                at++;
            }
            size_t bad = 0;
            for (size_t j = 0; j < exp.size(); j++) {
                bad += exp[j] != d.bufs[dr][j];
            }
            std::ostringstream os;
            os << "D rank " << dr << ": " << bad << " of " << exp.size()
               << " bytes wrong, first at byte " << at;
            o.wrong = os.str();
            return o;
        }
    }
    return o;
}


constexpr int kCases = 10000;

TEST(LayoutProperty, EveryLayoutPermutationAndTpPairingIsExactOrRefused)
{
    std::mt19937_64 rng(0x5EEDC0DEull);
    int             accepted = 0, refused = 0, hetero_ok = 0, replicated_ok = 0,
        free_ok = 0, free_refused = 0, order_refused = 0;
    int             kind_ok[kNumKinds] = {};

    for (int c = 0; c < kCases; c++) {
        Model   m = DrawModel(rng);
        Outcome o = RunCase(m, (uint64_t)c * 0x2545F4914F6CDD1Dull);
        ASSERT_EQ("", o.wrong) << "case " << c << ": " << Describe(m);
        if (!o.refused.empty()) {
            ASSERT_TRUE(MayRefuse(m)) << "case " << c << " refused: "
                                      << o.refused << "\n  " << Describe(m);
            refused++;
            free_refused += m.free_perm;
            order_refused += !m.d_phys.empty();
            if (getenv("LP_DEBUG")) { // LP_DEBUG=1: list every refusal
                printf("%d %s\n", m.free_perm, o.refused.c_str());
            }
            continue;
        }
        accepted++;
        kind_ok[m.kind]++;
        free_ok += m.free_perm;
        hetero_ok += m.p_tp != m.d_tp;
        replicated_ok += m.kind != kKeyOnly &&
                         (m.p_tp > m.heads || m.d_tp > m.heads) &&
                         m.p_tp != m.d_tp;
    }
    // The property must not hold vacuously: most cases move bytes, every
    // layout and replicated GQA pairings among them.
    EXPECT_GT(accepted, kCases * 3 / 5);
    EXPECT_GT(hetero_ok, kCases / 3);
    EXPECT_GT(replicated_ok, kCases / 20);
    EXPECT_GT(free_ok, 100);
    EXPECT_GT(free_refused, 100);
    EXPECT_GT(order_refused, 300);
    for (int k = 0; k < kNumKinds; k++) {
        EXPECT_GT(kind_ok[k], kCases / 20) << kKindName[k];
    }
    RecordProperty("accepted", accepted);
    RecordProperty("refused", refused);
}

// The case: FlashAttention HND as torch describes it, P tp2 -> D
// tp4 READ with 4 KV heads (sharded) and with 2 (replicated on D).
// SplitModel: a split-layout case of one block list pairing, its physical
// axis order given.
Model SplitModel(uint32_t heads, uint32_t bs, uint32_t d, std::vector<int> phys,
                 uint32_t p_tp, uint32_t d_tp, bool write)
{
    Model m;
    m.kind      = kSplit;
    m.heads     = heads;
    m.bs        = bs;
    m.k         = 1;
    m.d         = d;
    m.dv        = d;
    m.elem      = 2;
    m.hnd_shape = false; // [2, NB, BS, H, D]
    m.phys      = std::move(phys);
    m.free_perm = false;
    m.p_tp      = p_tp;
    m.d_tp      = d_tp;
    m.p_nb      = 6;
    m.d_nb      = 5;
    m.p_ids     = {5, 1, 3};
    m.d_ids     = {4, 0};
    m.write     = write;
    return m;
}

TEST(LayoutProperty, FlashAttentionHndDescribedByStrides)
{
    for (uint32_t heads : {4u, 2u}) {
        for (bool write : {false, true}) {
            for (auto tps : {std::make_pair(2u, 4u), std::make_pair(4u, 2u)}) {
                // memory [2, NB, H, BS, D]: stride order 0,1,3,2,4
                Model   m = SplitModel(heads, 16, 8, {0, 1, 3, 2, 4},
                                       tps.first, tps.second, write);
                Outcome o = RunCase(m, 7);
                EXPECT_EQ("", o.refused) << Describe(m);
                EXPECT_EQ("", o.wrong) << Describe(m);
            }
        }
    }
}

// An order with the block axis inside a unit is refused, never misread.
TEST(LayoutProperty, BlockAxisInsideAUnitIsRefused)
{
    Model m     = SplitModel(2, 4, 3, {0, 2, 1, 3, 4}, 1, 1, false);
    m.free_perm = true; // tokens outside blocks
    Outcome o   = RunCase(m, 3);
    EXPECT_NE(std::string::npos, o.refused.find("KV layout")) << o.refused;
}

// The rank map with replicated heads: who reads what, and the release
// quorum that follows from the same function.
TEST(LayoutProperty, RankMapReplicatedHeads)
{
    kvc_rankmap_t m;
    // 2 KV heads, P tp2 (1 head each) -> D tp4 (1 head, replicated): D rank
    // d reads the whole block of P rank d/2.
    for (uint32_t dr = 0; dr < 4; dr++) {
        ASSERT_EQ(KVX_OK, kvc_rankmap_heads(4, 2, 1, 1, dr, &m));
        EXPECT_EQ(dr / 2, m.read_rank);
        EXPECT_EQ(1u, m.num_slices);
        EXPECT_EQ(0u, m.gather);
    }
    // P tp4 (replicated) -> D tp2: D rank d reads P rank 2d whole, releases
    // 2d and 2d+1.
    ASSERT_EQ(KVX_OK, kvc_rankmap_heads(2, 4, 1, 1, 1, &m));
    EXPECT_EQ(2u, m.read_rank);
    EXPECT_EQ(0u, m.gather);
    ASSERT_EQ(2u, m.num_release);
    EXPECT_EQ(2u, m.release[0]);
    EXPECT_EQ(3u, m.release[1]);
    // 4 heads, P tp8 (replicated, 1 head) -> D tp1 (4 heads): parts from
    // P ranks 0, 2, 4, 6; all 8 released.
    ASSERT_EQ(KVX_OK, kvc_rankmap_heads(1, 8, 4, 1, 0, &m));
    EXPECT_EQ(1u, m.gather);
    ASSERT_EQ(4u, m.num_slices);
    ASSERT_EQ(8u, m.num_release);
    for (uint32_t k = 0; k < 4; k++) {
        EXPECT_EQ(2 * k, m.release[k]);
    }
    // 2 heads, P tp1 (2 heads) -> D tp4: slices 0,0,1,1.
    for (uint32_t dr = 0; dr < 4; dr++) {
        ASSERT_EQ(KVX_OK, kvc_rankmap_heads(4, 1, 1, 2, dr, &m));
        EXPECT_EQ(2u, m.num_slices);
        EXPECT_EQ(dr / 2, m.head_slice);
    }
    // A head count that does not share: 3 heads over 2 ranks.
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_rankmap_heads(1, 2, 3, 1, 0, &m));
    EXPECT_NE(nullptr, strstr(kvc_last_error(), "decode num_kv_heads 3"))
        << kvc_last_error();
    // Quorum: the release sets do not depend on heads.
    uint32_t q = 0;
    ASSERT_EQ(KVX_OK, kvc_ack_quorum(4, 2, 0, 1, &q));
    EXPECT_EQ(2u, q);
    ASSERT_EQ(KVX_OK, kvc_ack_quorum(2, 4, 0, 3, &q));
    EXPECT_EQ(1u, q);
}

} // namespace
