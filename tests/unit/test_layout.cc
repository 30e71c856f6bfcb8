// test_layout.cc - plugin/layout.c: geometry per SPEC §6 layout, offset
// plans (worked examples of research/moriio.md §6), bounds and errors.
//
// Units: tensor shapes and strides are in elements (as torch reports them);
// every kvc_geom_t field and every plan offset/length is in BYTES. The
// element size is 2 (bf16) throughout, so a research-note value given in
// elements appears here multiplied by 2.
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

extern "C" {
#include "error.h"
#include "layout.h"
}

namespace {

constexpr uint32_t kElem = 2; // bf16

struct DescSpec {
    std::vector<int64_t> shape;
    std::vector<int64_t> stride; // empty: contiguous
    uint32_t             block_size;
    uint32_t             heads;
    uint32_t             head;
    uint32_t             head_v;
    uint32_t             key_only;
    size_t               length; // 0: exactly the contiguous tensor bytes
};

kvx_layer_desc_t MakeDesc(const DescSpec &s)
{
    kvx_layer_desc_t d = {};
    int64_t          n = 1;

    d.struct_size = sizeof(d);
    d.name        = "model.layers.0.attn";
    d.ndim        = static_cast<uint32_t>(s.shape.size());
    for (size_t i = s.shape.size(); i-- > 0;) {
        d.shape[i]  = s.shape[i];
        d.stride[i] = s.stride.empty() ? n : s.stride[i];
        n *= s.shape[i];
    }
    d.length       = s.length != 0 ? s.length : static_cast<size_t>(n) * kElem;
    d.elem_size    = kElem;
    d.block_size   = s.block_size;
    d.num_kv_heads = s.heads;
    d.head_size    = s.head;
    d.head_size_v  = s.head_v;
    d.key_only     = s.key_only;
    return d;
}

bool HasText(const std::string &needle)
{
    return std::string(kvc_last_error()).find(needle) != std::string::npos;
}

#define EXPECT_LAST_ERROR_HAS(text)                                            \
    EXPECT_TRUE(HasText(text)) << "last error: " << kvc_last_error()

// The research-note example spec: block_size 4, 2 KV heads, head dim 3.
const DescSpec kSplit       = {{2, 8, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0};
const DescSpec kSplitHnd    = {{2, 8, 2, 4, 3}, {}, 4, 2, 3, 0, 0, 0};
const DescSpec kInterleaved = {{8, 2, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0};
const DescSpec kInterHnd    = {{8, 2, 2, 4, 3}, {}, 4, 2, 3, 0, 0, 0};
const DescSpec kMla         = {{8, 4, 3}, {}, 4, 1, 3, 0, 1, 0};
const DescSpec kKernelSplit = {{2, 32, 8, 2, 3}, {}, 16, 8, 3, 0, 0, 0};
const DescSpec kInterKernel = {{32, 2, 2, 8, 3}, {}, 16, 8, 3, 0, 0, 0};
const DescSpec kPacked      = {{8, 2, 4, 5}, {}, 4, 2, 3, 2, 0, 0};
const DescSpec kKeyKernel   = {{32, 2, 3}, {}, 8, 1, 3, 0, 1, 0};
// shape[0] == shape[1] == 2: only the interleaved-kernel reading fits,
// because stride[1] (20) is not the kernel block size (2*3*3 = 18) that a
// split-kernel layout needs, while axes 1..4 fit inside stride[0] (40).
const DescSpec kDoubleTwo = {{2, 2, 2, 3, 3}, {40, 20, 9, 3, 1}, 4, 3, 3, 0,
                             0, 80 * kElem};
// A split shape whose strides put num_blocks outermost (K and V of a block
// are adjacent): V is per block and must not move with remote num_blocks.
const DescSpec kSplitNbOuter = {{2, 8, 4, 2, 3}, {24, 48, 6, 3, 1}, 4, 2, 3,
                                0, 0, 384 * kElem};

// ---------------------------------------------------------------- geometry

struct GeomRow {
    const char       *name;
    DescSpec          desc;
    kvc_layout_kind_t kind;
    uint64_t          num_blocks;
    uint64_t          block_len;    // bytes
    uint64_t          block_stride; // bytes
    uint64_t          kv_stride;    // bytes, local
    uint32_t          tpb;
    uint32_t          kernel_block_size;
    uint64_t          peer_num_blocks;
    uint64_t          peer_kv_stride; // bytes, kvc_geom_for_peer
};

void PrintTo(const GeomRow &r, std::ostream *os)
{
    *os << r.name;
}

class LayoutGeom : public ::testing::TestWithParam<GeomRow> {};

TEST_P(LayoutGeom, DerivesSpecGeometry)
{
    const GeomRow   &r = GetParam();
    kvx_layer_desc_t d = MakeDesc(r.desc);
    kvc_geom_t       g, peer;

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &g)) << kvc_last_error();
    EXPECT_EQ(r.kind, g.kind);
    EXPECT_EQ(r.num_blocks, g.num_blocks);
    EXPECT_EQ(r.block_len, g.block_len);
    EXPECT_EQ(r.block_stride, g.block_stride);
    EXPECT_EQ(r.kv_stride, g.kv_stride);
    EXPECT_EQ(r.tpb, g.transfers_per_block);
    EXPECT_EQ(r.kernel_block_size, g.kernel_block_size);
    EXPECT_EQ(r.desc.block_size, g.block_size);
    EXPECT_EQ(kElem, g.elem_size);
    EXPECT_LE(kvc_geom_extent(&g), d.length);

    kvc_geom_for_peer(&g, r.peer_num_blocks, &peer);
    EXPECT_EQ(r.peer_num_blocks, peer.num_blocks);
    EXPECT_EQ(r.peer_kv_stride, peer.kv_stride);
    EXPECT_EQ(g.block_len, peer.block_len);
    EXPECT_EQ(g.block_stride, peer.block_stride);
    EXPECT_EQ(KVX_OK, kvc_geom_compatible(&g, &peer));
}

// Research note §6 values in elements: kernel split block_stride 384,
// local kv 1536, remote kv 3072 (remote_num_blocks 8) -> x2 bytes below.
const GeomRow kGeomRows[] = {
    {"Split", kSplit, KVC_LAYOUT_SPLIT, 8, 48, 48, 384, 2, 4, 16, 768},
    {"SplitHeadsFirst", kSplitHnd, KVC_LAYOUT_SPLIT, 8, 48, 48, 384, 2, 4, 16,
     768},
    {"Interleaved", kInterleaved, KVC_LAYOUT_INTERLEAVED, 8, 48, 96, 48, 2, 4,
     16, 48},
    {"InterleavedHeadsFirst", kInterHnd, KVC_LAYOUT_INTERLEAVED, 8, 48, 96, 48,
     2, 4, 16, 48},
    {"Mla", kMla, KVC_LAYOUT_KEY_ONLY, 8, 24, 24, 0, 1, 4, 16, 0},
    {"KernelSplit", kKernelSplit, KVC_LAYOUT_SPLIT_KERNEL, 4, 768, 384 * 2,
     1536 * 2, 2, 2, 8, 3072 * 2},
    // Interleaved kernel blocks keep the K-to-V stride in kv_stride (bytes).
    {"InterleavedKernel", kInterKernel, KVC_LAYOUT_INTERLEAVED_KERNEL, 4,
     96 * 8 * 2, 96 * 8 * 2, 48 * 2, 1, 2, 8, 48 * 2},
    {"ContentPacked", kPacked, KVC_LAYOUT_PACKED, 8, 4 * 2 * 5 * 2, 80, 0, 1, 4,
     16, 0},
    {"KeyOnlyKernel", kKeyKernel, KVC_LAYOUT_KEY_ONLY, 8, 48, 48, 0, 1, 2, 16,
     0},
    {"DoubleTwoResolved", kDoubleTwo, KVC_LAYOUT_INTERLEAVED_KERNEL, 1, 160,
     160, 20 * 2, 1, 2, 4, 20 * 2},
    {"SplitNumBlocksOuter", kSplitNbOuter, KVC_LAYOUT_SPLIT, 8, 48, 96, 48, 2,
     4, 16, 48},
};

INSTANTIATE_TEST_SUITE_P(SpecLayouts, LayoutGeom,
                         ::testing::ValuesIn(kGeomRows),
                         [](const ::testing::TestParamInfo<GeomRow> &info) {
                             return std::string(info.param.name);
                         });

// ------------------------------------------------------------------- plans

struct PlanRow {
    const char           *name;
    DescSpec              desc;
    std::vector<uint64_t> local_ids;
    std::vector<uint64_t> remote_ids;
    uint64_t              remote_num_blocks;
    std::vector<uint64_t> local_offs;  // bytes, sorted by local offset
    std::vector<uint64_t> remote_offs; // bytes
    std::vector<uint64_t> sizes;       // bytes
};

void PrintTo(const PlanRow &r, std::ostream *os)
{
    *os << r.name;
}

struct Plan {
    kvc_geom_t             local;
    kvc_geom_t             remote;
    std::vector<kvc_run_t> runs;
    kvx_status_t           status;
};

// BuildPlan derives the local geometry, makes the remote one with
// kvc_geom_for_peer and builds the plan against both full extents.
Plan BuildPlan(const DescSpec &spec, const std::vector<uint64_t> &lids,
               const std::vector<uint64_t> &rids, uint64_t remote_nb)
{
    kvx_layer_desc_t d = MakeDesc(spec);
    Plan             p = {};
    size_t           n = 0;

    p.status = kvc_geom_from_desc(&d, &p.local);
    if (p.status != KVX_OK) {
        return p;
    }
    kvc_geom_for_peer(&p.local, remote_nb, &p.remote);
    p.runs.resize(kvc_plan_max_runs(&p.local, lids.size()) + 1);
    p.status = kvc_plan_build(&p.local, d.length, &p.remote,
                              kvc_geom_extent(&p.remote), lids.data(),
                              lids.size(), rids.data(), rids.size(),
                              p.runs.data(), &n);
    p.runs.resize(p.status == KVX_OK ? n : 0);
    return p;
}

class LayoutPlan : public ::testing::TestWithParam<PlanRow> {};

TEST_P(LayoutPlan, MatchesWorkedExample)
{
    const PlanRow &r = GetParam();
    Plan p = BuildPlan(r.desc, r.local_ids, r.remote_ids, r.remote_num_blocks);

    ASSERT_EQ(KVX_OK, p.status) << kvc_last_error();
    std::vector<uint64_t> lo, ro, sz;
    for (const kvc_run_t &run : p.runs) {
        lo.push_back(run.local_off);
        ro.push_back(run.remote_off);
        sz.push_back(run.len);
    }
    EXPECT_EQ(r.local_offs, lo);
    EXPECT_EQ(r.remote_offs, ro);
    EXPECT_EQ(r.sizes, sz);
}

// The first four rows are the research note's worked examples (local
// [1,3] -> remote [4,5], remote_num_blocks 16); the kernel-split row's
// offsets follow from its note geometry (block 768 B, kv 3072 / 6144 B).
const PlanRow kPlanRows[] = {
    {"Split", kSplit, {1, 3}, {4, 5}, 16, {48, 144, 432, 528},
     {192, 240, 960, 1008}, {48, 48, 48, 48}},
    {"Interleaved", kInterleaved, {1, 3}, {4, 5}, 16, {96, 288}, {384, 480},
     {96, 96}},
    {"Mla", kMla, {1, 3}, {4, 5}, 16, {24, 72}, {96, 120}, {24, 24}},
    {"KernelSplit", kKernelSplit, {1, 3}, {4, 5}, 8, {768, 2304, 3840, 5376},
     {3072, 3840, 9216, 9984}, {768, 768, 768, 768}},
    {"MlaConsecutiveMergeToOneRun", kMla, {0, 1, 2, 3}, {4, 5, 6, 7}, 16, {0},
     {96}, {96}},
    {"SplitConsecutiveMergeToKAndV", kSplit, {0, 1, 2, 3}, {4, 5, 6, 7}, 16,
     {0, 384}, {192, 960}, {192, 192}},
    {"InterleavedConsecutiveMerge", kInterleaved, {0, 1}, {2, 3}, 16, {0},
     {192}, {192}},
    {"PrefixHitReadsLastRemote", kSplit, {1, 3}, {0, 2, 4, 5}, 16,
     {48, 144, 432, 528}, {192, 240, 960, 1008}, {48, 48, 48, 48}},
    {"UnsortedInputSorted", kSplit, {3, 1}, {5, 4}, 16, {48, 144, 432, 528},
     {192, 240, 960, 1008}, {48, 48, 48, 48}},
    // P has 8 blocks (remote), D 16 (local): the remote V plane is at
    // 8 * 48 = 384 bytes, the local one at 16 * 48 = 768.
    {"RemoteFewerBlocksMovesV", {{2, 16, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0}, {0},
     {2}, 8, {0, 768}, {96, 480}, {48, 48}},
    {"SplitNumBlocksOuterMerges", kSplitNbOuter, {1}, {2}, 16, {96}, {192},
     {96}},
    {"InterleavedKernel", kInterKernel, {0, 1, 3}, {1, 2, 4}, 8, {0, 4608},
     {1536, 6144}, {3072, 1536}},
    {"Empty", kSplit, {}, {4, 5}, 16, {}, {}, {}},
};

INSTANTIATE_TEST_SUITE_P(SpecLayouts, LayoutPlan,
                         ::testing::ValuesIn(kPlanRows),
                         [](const ::testing::TestParamInfo<PlanRow> &info) {
                             return std::string(info.param.name);
                         });

TEST(LayoutPlanBounds, MoreLocalThanRemoteIsInvalid)
{
    Plan p = BuildPlan(kSplit, {1, 2, 3}, {4, 5}, 16);

    EXPECT_EQ(KVX_ERR_INVALID_PARAM, p.status);
    EXPECT_LAST_ERROR_HAS("3 local blocks but only 2 remote blocks");
}

TEST(LayoutPlanBounds, LocalIdOutOfRange)
{
    Plan p = BuildPlan(kSplit, {1, 99}, {4, 5}, 16);

    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS, p.status);
    EXPECT_LAST_ERROR_HAS("local block_ids[1] = 99: must be < num_blocks 8");
}

TEST(LayoutPlanBounds, RemoteIdOutOfRangeNamesRemoteIndex)
{
    // Prefix hit: local[1] pairs with remote index 2.
    Plan p = BuildPlan(kSplit, {1, 3}, {0, 4, 16}, 16);

    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS, p.status);
    EXPECT_LAST_ERROR_HAS("remote block_ids[2] = 16: must be < num_blocks 16");
}

TEST(LayoutPlanBounds, RunOutsideRegionOnEitherSide)
{
    kvx_layer_desc_t d = MakeDesc(kSplit);
    kvc_geom_t       local, remote;
    kvc_run_t        runs[4];
    size_t           n     = 0;
    const uint64_t   lid[] = {7};
    const uint64_t   rid[] = {15};

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &local));
    kvc_geom_for_peer(&local, 16, &remote);
    // Block 7's V unit is [384 + 336, 768); a 700-byte local region is short.
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS,
              kvc_plan_build(&local, 700, &remote, 1536, lid, 1, rid, 1, runs,
                             &n));
    EXPECT_LAST_ERROR_HAS("local block_ids[0] = 7");
    EXPECT_LAST_ERROR_HAS("[720, 768)");
    EXPECT_LAST_ERROR_HAS("region of 700 bytes");
    // Remote block 15's K unit is [720, 768); V is [1488, 1536).
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS,
              kvc_plan_build(&local, 768, &remote, 1500, lid, 1, rid, 1, runs,
                             &n));
    EXPECT_LAST_ERROR_HAS("remote block_ids[0] = 15");
    EXPECT_LAST_ERROR_HAS("region of 1500 bytes");
    EXPECT_EQ(KVX_OK, kvc_plan_build(&local, 768, &remote, 1536, lid, 1, rid,
                                     1, runs, &n));
    EXPECT_EQ(2u, n);
}

TEST(LayoutPlanBounds, HugeRemoteNumBlocksCannotWrapOffsets)
{
    kvx_layer_desc_t d = MakeDesc(kSplit);
    kvc_geom_t       local, remote;
    kvc_run_t        runs[2];
    size_t           n     = 0;
    const uint64_t   lid[] = {0};
    const uint64_t   rid[] = {1};

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &local));
    kvc_geom_for_peer(&local, UINT64_MAX / 16, &remote);
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS,
              kvc_plan_build(&local, d.length, &remote, UINT64_MAX, lid, 1,
                             rid, 1, runs, &n));
    EXPECT_LAST_ERROR_HAS("remote block_ids[0] = 1");
}

TEST(LayoutPlanBounds, IncompatiblePeerGeometryRejected)
{
    kvx_layer_desc_t d  = MakeDesc(kSplit);
    kvx_layer_desc_t d6 = MakeDesc({{2, 8, 4, 2, 6}, {}, 4, 2, 6, 0, 0, 0});
    kvc_geom_t       local, remote;
    kvc_run_t        runs[2];
    size_t           n     = 0;
    const uint64_t   ids[] = {0};

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &local));
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d6, &remote));
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE,
              kvc_plan_build(&local, d.length, &remote, d6.length, ids, 1, ids,
                             1, runs, &n));
    EXPECT_LAST_ERROR_HAS("block_len: local 48, remote 96");
}

TEST(LayoutPlanBounds, MaxRunsFollowsTransfersPerBlock)
{
    kvc_geom_t split = {}, mla = {};

    split.transfers_per_block = 2;
    mla.transfers_per_block   = 1;
    EXPECT_EQ(10u, kvc_plan_max_runs(&split, 5));
    EXPECT_EQ(5u, kvc_plan_max_runs(&mla, 5));
    EXPECT_EQ(0u, kvc_plan_max_runs(&mla, 0));
}

TEST(LayoutPlanBounds, ThousandsOfBlocksMergeIntoTwoRuns)
{
    const uint64_t        nb = 4096;
    DescSpec              s  = {{2, 8192, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0};
    std::vector<uint64_t> lids, rids;

    // Reverse order: the plan must sort before merging.
    for (uint64_t i = nb; i-- > 0;) {
        lids.push_back(i);
        rids.push_back(i + 100);
    }
    Plan p = BuildPlan(s, lids, rids, 8192);
    ASSERT_EQ(KVX_OK, p.status) << kvc_last_error();
    ASSERT_EQ(2u, p.runs.size());
    EXPECT_EQ(0u, p.runs[0].local_off);
    EXPECT_EQ(100u * 48, p.runs[0].remote_off);
    EXPECT_EQ(nb * 48, p.runs[0].len);
    EXPECT_EQ(8192u * 48, p.runs[1].local_off);
    EXPECT_EQ(8192u * 48 + 100u * 48, p.runs[1].remote_off);
    EXPECT_EQ(nb * 48, p.runs[1].len);
}

// ------------------------------------------------------- peer comparisons

TEST(LayoutPeer, CompatibleNamesFirstDifferingField)
{
    kvx_layer_desc_t a = MakeDesc(kSplit);
    kvx_layer_desc_t b = MakeDesc({{2, 8, 4, 2, 6}, {}, 4, 2, 6, 0, 0, 0});
    kvx_layer_desc_t c = MakeDesc(kInterleaved);
    kvc_geom_t       ga, gb, gc, peer;

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&a, &ga));
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&b, &gb));
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&c, &gc));
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_compatible(&ga, &gb));
    EXPECT_LAST_ERROR_HAS("peer layer geometry differs: block_len: local 48, "
                          "remote 96");
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_compatible(&ga, &gc));
    EXPECT_LAST_ERROR_HAS("layout local split remote interleaved");
    // num_blocks and kv_stride may differ.
    kvc_geom_for_peer(&ga, 1000, &peer);
    EXPECT_EQ(KVX_OK, kvc_geom_compatible(&ga, &peer));
}

TEST(LayoutPeer, SameComparesEveryField)
{
    kvx_layer_desc_t a = MakeDesc(kSplit);
    kvc_geom_t       g, same, other;

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&a, &g));
    kvc_geom_for_peer(&g, 8, &same);
    EXPECT_TRUE(kvc_geom_same(&g, &same));
    kvc_geom_for_peer(&g, 16, &other);
    EXPECT_FALSE(kvc_geom_same(&g, &other));
    other            = g;
    other.head_size_v = 7;
    EXPECT_FALSE(kvc_geom_same(&g, &other));
}

TEST(LayoutPeer, ExtentCoversLastVUnit)
{
    kvx_layer_desc_t a = MakeDesc(kSplit);
    kvc_geom_t       g, peer;

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&a, &g));
    EXPECT_EQ(768u, kvc_geom_extent(&g));
    kvc_geom_for_peer(&g, 16, &peer);
    EXPECT_EQ(1536u, kvc_geom_extent(&peer));
    kvc_geom_for_peer(&g, 0, &peer);
    EXPECT_EQ(0u, kvc_geom_extent(&peer));
}

// kvc_geom_cover: which bytes of a layer belong to which blocks (the engine's
// exposure check for peers' software gets and puts).
int AllowSet(void *arg, uint64_t block)
{
    const std::vector<uint64_t> *ids = static_cast<std::vector<uint64_t> *>(arg);

    for (uint64_t id : *ids) {
        if (id == block) {
            return 1;
        }
    }
    return 0;
}

TEST(LayoutCover, EveryByteMustBelongToAnAllowedBlock)
{
    kvx_layer_desc_t      d = MakeDesc(kSplit); // 8 blocks, K/V units of 48 B
    kvc_geom_t            g;
    std::vector<uint64_t> ids = {1, 2, 7};

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &g));
    ASSERT_EQ(48u, g.block_len);
    ASSERT_EQ(384u, g.kv_stride);
    EXPECT_EQ(1, kvc_geom_cover(&g, 48, 48, AllowSet, &ids));      // K of 1
    EXPECT_EQ(1, kvc_geom_cover(&g, 50, 90, AllowSet, &ids));      // K 1..2
    EXPECT_EQ(0, kvc_geom_cover(&g, 47, 2, AllowSet, &ids));       // 0 and 1
    EXPECT_EQ(0, kvc_geom_cover(&g, 96, 49, AllowSet, &ids));      // 2 and 3
    EXPECT_EQ(1, kvc_geom_cover(&g, 384 + 48, 96, AllowSet, &ids)); // V 1..2
    EXPECT_EQ(0, kvc_geom_cover(&g, 7 * 48, 48 + 48, AllowSet, &ids))
        << "K of 7 runs into V of 0, which is not allowed";
    ids.push_back(0);
    EXPECT_EQ(1, kvc_geom_cover(&g, 7 * 48, 96, AllowSet, &ids));  // K7, V0
    EXPECT_EQ(0, kvc_geom_cover(&g, 768, 1, AllowSet, &ids));      // past V7
    EXPECT_EQ(0, kvc_geom_cover(&g, 48, 0, AllowSet, &ids));       // empty
    EXPECT_EQ(0, kvc_geom_cover(&g, UINT64_MAX - 4, 8, AllowSet, &ids));
}

TEST(LayoutCover, GapsBetweenUnitsBelongToNoBlock)
{
    // Key-only blocks padded to 64 bytes: 24 bytes of latent, 40 of nothing.
    kvx_layer_desc_t d = MakeDesc({{8, 4, 3}, {32, 3, 1}, 4, 1, 3, 0, 1,
                                   8 * 64});
    kvc_geom_t            g;
    std::vector<uint64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};

    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &g)) << kvc_last_error();
    ASSERT_EQ(64u, g.block_stride);
    ASSERT_EQ(24u, g.block_len);
    EXPECT_EQ(1, kvc_geom_cover(&g, 64, 24, AllowSet, &ids));
    EXPECT_EQ(0, kvc_geom_cover(&g, 64, 25, AllowSet, &ids)) << "padding";
    EXPECT_EQ(0, kvc_geom_cover(&g, 60, 1, AllowSet, &ids)) << "padding";
    EXPECT_EQ(1, kvc_geom_cover(&g, 7 * 64, 24, AllowSet, &ids));
}

TEST(LayoutCover, OneBlockLongerThanItsStride)
{
    // Found by layout_engines (case 6822): a one-block layer whose unit
    // (192 bytes) is longer than the block stride (48), which no second
    // block constrains.
    kvc_geom_t            g{};
    std::vector<uint64_t> ids = {0};

    g.num_blocks          = 1;
    g.block_len           = 192;
    g.block_stride        = 48;
    g.transfers_per_block = 1;
    EXPECT_EQ(1, kvc_geom_cover(&g, 96, 48, AllowSet, &ids));
    EXPECT_EQ(1, kvc_geom_cover(&g, 0, 192, AllowSet, &ids));
    EXPECT_EQ(0, kvc_geom_cover(&g, 144, 49, AllowSet, &ids));
    ids.clear();
    EXPECT_EQ(0, kvc_geom_cover(&g, 96, 48, AllowSet, &ids));
}

// ---------------------------------------------------------------- rejects

struct RejectRow {
    const char              *name;
    DescSpec                 desc;
    kvx_status_t             status;
    std::vector<std::string> texts;
};

void PrintTo(const RejectRow &r, std::ostream *os)
{
    *os << r.name;
}

class LayoutReject : public ::testing::TestWithParam<RejectRow> {};

TEST_P(LayoutReject, FailsWithReason)
{
    const RejectRow &r = GetParam();
    kvx_layer_desc_t d = MakeDesc(r.desc);
    kvc_geom_t       g;

    kvc_error_clear();
    EXPECT_EQ(r.status, kvc_geom_from_desc(&d, &g));
    for (const std::string &t : r.texts) {
        EXPECT_LAST_ERROR_HAS(t);
    }
}

const RejectRow kRejectRows[] = {
    {"TokenAxisMatchesNothing", {{2, 8, 5, 2, 3}, {}, 4, 2, 3, 0, 0, 0},
     KVX_ERR_LAYOUT,
     {"model.layers.0.attn", "shape (2,8,5,2,3)", "block_size 4",
      "num_kv_heads 2", "shape[2] = 5"}},
    {"HeadSizeMismatch", {{2, 8, 4, 2, 5}, {}, 4, 2, 3, 0, 0, 0},
     KVX_ERR_LAYOUT, {"shape[4] = 5: expected head_size 3"}},
    {"ThreeDimNeedsKeyOnly", {{8, 4, 3}, {}, 4, 1, 3, 0, 0, 0}, KVX_ERR_LAYOUT,
     {"shape (8,4,3)", "needs key_only"}},
    {"KeyOnlyLatentMismatch", {{8, 4, 5}, {}, 4, 1, 3, 0, 1, 0},
     KVX_ERR_LAYOUT, {"shape[2] = 5: expected head_size 3"}},
    {"KeyOnlyBlockMismatch", {{8, 3, 3}, {}, 4, 1, 3, 0, 1, 0},
     KVX_ERR_LAYOUT, {"shape[1] = 3: expected block_size 4"}},
    {"KeyOnlyFiveDim", {{2, 8, 4, 2, 3}, {}, 4, 2, 3, 0, 1, 0}, KVX_ERR_LAYOUT,
     {"a key_only layer needs a 3-D shape"}},
    {"PackedWrongWidth", {{8, 2, 4, 6}, {}, 4, 2, 3, 2, 0, 0}, KVX_ERR_LAYOUT,
     {"shape (8,2,4,6)", "expected head_size + head_size_v = 5"}},
    {"PackedWrongHeads", {{8, 3, 4, 5}, {}, 4, 2, 3, 2, 0, 0}, KVX_ERR_LAYOUT,
     {"shape[1] = 3: expected num_kv_heads 2"}},
    {"KernelAxisAmbiguous", {{2, 32, 2, 2, 3}, {}, 16, 2, 3, 0, 0, 0},
     KVX_ERR_LAYOUT, {"ambiguous kernel-block layout"}},
    {"SplitOrInterleavedAmbiguous", {{2, 2, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0},
     KVX_ERR_LAYOUT, {"ambiguous: shape[0] and shape[1] are both 2"}},
    {"NoKvAxis", {{4, 8, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0}, KVX_ERR_LAYOUT,
     {"K/V axis"}},
    {"KernelCountNotMultiple", {{2, 30, 8, 2, 3}, {}, 16, 8, 3, 0, 0, 0},
     KVX_ERR_LAYOUT, {"shape[1] = 30: not a multiple of the 8 kernel blocks"}},
    {"BlockNotDense", {{2, 8, 4, 2, 3}, {384, 48, 12, 3, 1}, 4, 2, 3, 0, 0,
                       10000},
     KVX_ERR_LAYOUT, {"not dense"}},
    {"KernelBlocksNotAdjacent",
     {{2, 32, 8, 2, 3}, {3072, 96, 6, 3, 1}, 16, 8, 3, 0, 0, 20000},
     KVX_ERR_LAYOUT, {"stride[1] = 96, expected 48"}},
    {"KAndVOverlap", {{2, 8, 4, 2, 3}, {12, 48, 6, 3, 1}, 4, 2, 3, 0, 0,
                      10000},
     KVX_ERR_LAYOUT, {"K and V units overlap"}},
    {"LengthTooShort", {{2, 8, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 700},
     KVX_ERR_INVALID_PARAM,
     {"layer model.layers.0.attn: layout needs 768 bytes but length is 700"}},
    {"SixDims", {{1, 2, 8, 4, 2, 3}, {}, 4, 2, 3, 0, 0, 0},
     KVX_ERR_INVALID_PARAM, {"ndim 6: must be 3, 4 or 5"}},
    {"ZeroStride", {{2, 8, 4, 2, 3}, {192, 24, 0, 3, 1}, 4, 2, 3, 0, 0, 0},
     KVX_ERR_INVALID_PARAM, {"stride[2] = 0: must be > 0"}},
    {"NegativeStride", {{8, 4, 3}, {-12, 3, 1}, 4, 1, 3, 0, 1, 1000},
     KVX_ERR_INVALID_PARAM, {"stride[0] = -12: must be > 0"}},
    {"ZeroBlockSize", {{8, 4, 3}, {}, 0, 1, 3, 0, 1, 0}, KVX_ERR_INVALID_PARAM,
     {"block_size 0"}},
    {"HugeStridesOverflow",
     {{2, 8, 4, 2, 3}, {INT64_MAX, INT64_MAX / 32, 6, 3, 1}, 4, 2, 3, 0, 0,
      SIZE_MAX},
     KVX_ERR_INVALID_PARAM, {"overflow"}},
    // Found by fuzz_plan (corpus/plan/kv-stride-above-2p53): accepted here,
    // then every peer rejected the handshake metadata that carried it.
    {"KvStrideAbove2p53",
     {{2, 8, 4, 2, 3}, {INT64_C(1) << 53, 24, 6, 3, 1}, 4, 2, 3, 0, 0,
      SIZE_MAX},
     KVX_ERR_INVALID_PARAM,
     {"shape (2,8,4,2,3)", "kv_stride 18014398509481984 is above 2^53"}},
    {"BlockStrideAbove2p53", {{1, 4, 3}, {INT64_C(1) << 53, 3, 1}, 4, 1, 3, 0,
                              1, 1000},
     KVX_ERR_INVALID_PARAM, {"block_stride 18014398509481984 is above 2^53"}},
};

INSTANTIATE_TEST_SUITE_P(SpecLayouts, LayoutReject,
                         ::testing::ValuesIn(kRejectRows),
                         [](const ::testing::TestParamInfo<RejectRow> &info) {
                             return std::string(info.param.name);
                         });

TEST(LayoutRejectArgs, NullDescIsInvalid)
{
    kvc_geom_t g;

    EXPECT_EQ(KVX_ERR_INVALID_PARAM, kvc_geom_from_desc(nullptr, &g));
    EXPECT_LAST_ERROR_HAS("must not be NULL");
}

} // namespace

// ---- head slices (sharded heterogeneous TP, SPEC §4) ------------------------

namespace {

TEST(LayoutHeads, UnitOrderAndHeadRepsComeFromTheStrides)
{
    // FlashAttention HND as torch describes it: logical [2, NB, BS, H, D]
    // with strides in the order 0,1,3,2,4 (heads outside tokens in memory).
    const DescSpec fa_hnd = {{2, 8, 4, 2, 3}, {192, 24, 3, 12, 1}, 4, 2, 3,
                             0, 0, 0};
    // FlashInfer HND: logical [NB, 2, BS, H, D], memory [NB, 2, H, BS, D].
    const DescSpec fi_hnd = {{8, 2, 4, 2, 3}, {48, 24, 3, 12, 1}, 4, 2, 3,
                             0, 0, 0};
    // Content-packed described [NB, H, BS, C] with tokens outside heads.
    const DescSpec packed_nhd = {{8, 2, 4, 5}, {40, 5, 10, 1}, 4, 2, 3, 2,
                                 0, 0};
    struct Row {
        const char *name;
        DescSpec    d;
        uint32_t    order, reps;
    } rows[] = {
        {"split NHD", kSplit, 234, 4},
        {"split HND (shape)", kSplitHnd, 324, 1},
        {"split HND (strides)", fa_hnd, 324, 1},
        {"interleaved NHD", kInterleaved, 234, 4},
        {"interleaved HND (shape)", kInterHnd, 324, 1},
        {"interleaved HND (strides)", fi_hnd, 324, 1},
        {"packed", kPacked, 324, 1},
        {"packed NHD (strides)", packed_nhd, 234, 4},
        {"mla", kMla, 24, 0},
        // [2, NB*8, H=8, kbs=2, D]: 8 kernel blocks, heads outside tokens.
        {"kernel split", kKernelSplit, 324, 8},
        {"interleaved kernel", kInterKernel, 1234, 0},
        // block_size == num_kv_heads: the shape cannot tell the head axis.
        {"bs == heads", {{2, 8, 4, 4, 3}, {}, 4, 4, 3, 0, 0, 0}, 234, 0},
    };
    for (const Row &r : rows) {
        kvx_layer_desc_t d = MakeDesc(r.d);
        kvc_geom_t       g;
        ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&d, &g))
            << r.name << ": " << kvc_last_error();
        EXPECT_EQ(r.order, g.unit_order) << r.name;
        EXPECT_EQ(r.reps, g.head_reps) << r.name;
    }
    // Equal TP: a peer with the other head order is incompatible, the same
    // memory described by shape or by strides is the same geometry.
    kvx_layer_desc_t a = MakeDesc(kSplit), b = MakeDesc(kSplitHnd),
                     c = MakeDesc(fa_hnd);
    kvc_geom_t       ga, gb, gc;
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&a, &ga));
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&b, &gb));
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&c, &gc));
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_compatible(&ga, &gb));
    EXPECT_TRUE(HasText("unit_order")) << kvc_last_error();
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_compatible(&ga, &gc));
    EXPECT_EQ(KVX_OK, kvc_geom_compatible(&gb, &gc)) << kvc_last_error();
    EXPECT_TRUE(kvc_geom_same(&gb, &gc));
}

// A tensor of nb blocks x (K,V) x bs tokens x h heads x d elements, filled
// with a value per (block, kv, token, head, element); byte offsets follow
// the layout. Slicing is checked against a brute-force copy.
struct Model {
    bool     outer; // [H, BS, D] inside a unit
    bool     split; // [2, NB, ...] vs [NB, 2, ...]
    uint32_t nb, bs, h, d;

    std::vector<int64_t> Shape() const
    {
        std::vector<int64_t> s = {split ? 2 : (int64_t)nb, split ? (int64_t)nb : 2};
        s.push_back(outer ? h : bs);
        s.push_back(outer ? bs : h);
        s.push_back(d);
        return s;
    }
    size_t Off(uint32_t b, uint32_t kv, uint32_t t, uint32_t hh,
               uint32_t e) const
    {
        size_t unit  = (size_t)bs * h * d;
        size_t base  = split ? ((size_t)kv * nb + b) * unit
                             : ((size_t)b * 2 + kv) * unit;
        size_t inner = outer ? ((size_t)hh * bs + t) * d + e
                             : ((size_t)t * h + hh) * d + e;
        return (base + inner) * kElem;
    }
    size_t Bytes() const { return (size_t)2 * nb * bs * h * d * kElem; }
};

void Fill(const Model &m, std::vector<uint8_t> *buf, uint32_t head0)
{
    buf->assign(m.Bytes(), 0);
    for (uint32_t b = 0; b < m.nb; b++)
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t t = 0; t < m.bs; t++)
                for (uint32_t hh = 0; hh < m.h; hh++)
                    for (uint32_t e = 0; e < m.d * kElem; e++)
                        (*buf)[m.Off(b, kv, t, hh, 0) + e] = (uint8_t)(
                            b * 31 + kv * 17 + t * 7 + (hh + head0) * 5 + e);
}

kvc_geom_t GeomOf(const Model &m)
{
    DescSpec s = {m.Shape(), {}, m.bs, m.h, m.d, 0, 0, 0};
    kvx_layer_desc_t desc = MakeDesc(s);
    kvc_geom_t       g;
    EXPECT_EQ(KVX_OK, kvc_geom_from_desc(&desc, &g)) << kvc_last_error();
    return g;
}

// CopyRuns does what the gets of a plan do: remote -> local per run, after
// checking every run lies inside both buffers.
bool CopyRuns(const kvc_run_t *runs, size_t n, std::vector<uint8_t> *local,
              const std::vector<uint8_t> &remote)
{
    for (size_t i = 0; i < n; i++) {
        if (runs[i].local_off + runs[i].len > local->size() ||
            runs[i].remote_off + runs[i].len > remote.size()) {
            ADD_FAILURE() << "run " << i << " leaves a buffer";
            return false;
        }
        memcpy(local->data() + runs[i].local_off,
               remote.data() + runs[i].remote_off, runs[i].len);
    }
    return true;
}

TEST(LayoutHeads, SlicedPlanCopiesExactlyTheSliceOfEveryHeadOrder)
{
    for (bool outer : {false, true}) {
        for (bool split : {true, false}) {
            for (uint32_t q : {2u, 4u}) {
                SCOPED_TRACE(std::string(outer ? "HND" : "NHD") +
                             (split ? " split" : " interleaved") + " q" +
                             std::to_string(q));
                // block_size 3: never equal to a head count (the order must
                // be known from the shape).
                Model rm = {outer, split, 6, 3, 8, 3};      // P: 8 heads
                Model lm = {outer, split, 5, 3, 8 / q, 3};  // D: 8/q heads
                kvc_geom_t rg = GeomOf(rm), lg = GeomOf(lm);
                std::vector<uint8_t> remote, local;
                Fill(rm, &remote, 0);
                for (uint32_t s = 0; s < q; s++) {
                    local.assign(lm.Bytes(), 0xEE);
                    const uint64_t lid[] = {4, 0, 2}, rid[] = {1, 5, 3};
                    std::vector<kvc_run_t> runs(kvc_plan_max_runs_sliced(&lg, &rg, 3));
                    size_t n = 0;
                    ASSERT_EQ(KVX_OK, kvc_plan_build_sliced(
                                          &lg, lm.Bytes(), &rg, rm.Bytes(), s,
                                          q, lid, 3, rid, 3, runs.data(), &n))
                        << kvc_last_error();
                    ASSERT_LE(n, runs.size());
                    ASSERT_TRUE(CopyRuns(runs.data(), n, &local, remote));
                    // Expected: D's heads hh are P's heads s*(8/q) + hh of
                    // the paired P block, K and V alike.
                    for (size_t k = 0; k < 3; k++) {
                        for (uint32_t kv = 0; kv < 2; kv++) {
                            size_t a = lm.Off((uint32_t)lid[k], kv, 0, 0, 0);
                            size_t len = (size_t)lm.bs * lm.h * lm.d * kElem;
                            std::vector<uint8_t> exp(len);
                            for (uint32_t t = 0; t < lm.bs; t++)
                                for (uint32_t hh = 0; hh < lm.h; hh++)
                                    for (uint32_t e = 0; e < lm.d * kElem; e++)
                                        exp[lm.Off(0, 0, t, hh, 0) -
                                            lm.Off(0, 0, 0, 0, 0) + e] =
                                            remote[rm.Off((uint32_t)rid[k], kv,
                                                          t, s * (8 / q) + hh,
                                                          0) + e];
                            ASSERT_EQ(0, memcmp(exp.data(), &local[a], len))
                                << "block " << lid[k] << " kv " << kv;
                        }
                    }
                    // Blocks not named stay untouched.
                    size_t unit = (size_t)lm.bs * lm.h * lm.d * kElem;
                    for (uint32_t kv = 0; kv < 2; kv++) {
                        size_t a = lm.Off(1, kv, 0, 0, 0);
                        EXPECT_EQ(std::vector<uint8_t>(unit, 0xEE),
                                  std::vector<uint8_t>(&local[a],
                                                       &local[a] + unit));
                    }
                    // Heads-outer: one run per unit (before merging).
                    if (outer) {
                        EXPECT_LE(n, 6u);
                    } else {
                        EXPECT_GE(n, 6u);
                    }
                }
            }
        }
    }
}

// D tp < P tp: D's unit is assembled from r P ranks, part k from rank k.
TEST(LayoutHeads, GatheredPlanAssemblesEveryHeadFromItsPart)
{
    for (bool outer : {false, true}) {
        for (bool split : {true, false}) {
            for (uint32_t r : {2u, 4u}) {
                SCOPED_TRACE(std::string(outer ? "HND" : "NHD") +
                             (split ? " split" : " interleaved") + " r" +
                             std::to_string(r));
                Model lm = {outer, split, 5, 3, 8, 3};     // D: 8 heads
                Model rm = {outer, split, 6, 3, 8 / r, 3}; // each P rank
                kvc_geom_t lg = GeomOf(lm), rg = GeomOf(rm);
                std::vector<std::vector<uint8_t>> parts(r);
                std::vector<uint8_t> local(lm.Bytes(), 0xEE);
                const uint64_t lid[] = {4, 0, 2}, rid[] = {1, 5, 3};
                for (uint32_t k = 0; k < r; k++) {
                    Fill(rm, &parts[k], k * (8 / r)); // global head numbers
                    std::vector<kvc_run_t> runs(kvc_plan_max_runs_sliced(&lg, &lg, 3));
                    size_t n = 0;
                    ASSERT_EQ(KVX_OK, kvc_plan_build_gathered(
                                          &lg, lm.Bytes(), &rg, rm.Bytes(), k,
                                          r, lid, 3, rid, 3, runs.data(), &n))
                        << kvc_last_error();
                    ASSERT_LE(n, runs.size());
                    ASSERT_TRUE(CopyRuns(runs.data(), n, &local, parts[k]));
                }
                const uint32_t hp = 8 / r;
                for (size_t b = 0; b < 3; b++)
                    for (uint32_t kv = 0; kv < 2; kv++)
                        for (uint32_t t = 0; t < lm.bs; t++)
                            for (uint32_t hh = 0; hh < lm.h; hh++)
                                ASSERT_EQ(0, memcmp(&local[lm.Off((uint32_t)lid[b], kv, t, hh, 0)],
                                                    &parts[hh / hp][rm.Off((uint32_t)rid[b], kv, t, hh % hp, 0)],
                                                    lm.d * kElem))
                                    << "block " << lid[b] << " kv " << kv
                                    << " token " << t << " head " << hh;
                // Blocks not named stay untouched.
                size_t unit = (size_t)lm.bs * lm.h * lm.d * kElem;
                size_t a    = lm.Off(1, 0, 0, 0, 0);
                EXPECT_EQ(std::vector<uint8_t>(unit, 0xEE),
                          std::vector<uint8_t>(&local[a], &local[a] + unit));
            }
        }
    }
    // Wrong part count: 4 parts of 4 heads do not make 8.
    Model lm = {false, true, 5, 3, 8, 3}, rm = {false, true, 6, 3, 4, 3};
    kvc_geom_t lg = GeomOf(lm), rg = GeomOf(rm);
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_gatherable(&lg, &rg, 4));
    EXPECT_TRUE(HasText("num_kv_heads: remote num_kv_heads x 4 = 16, local 8")) << kvc_last_error();
    EXPECT_EQ(KVX_OK, kvc_geom_gatherable(&lg, &rg, 2)) << kvc_last_error();
}

// A local part of one head has no head_reps of its own: the peer's whole
// head_reps must still cut the part into runs of whole elements that cover
// it. With head_reps = block_len every run was 0 bytes (the transfer ended
// OK with nothing moved) and the plan held block_len runs a unit.
TEST(LayoutHeads, PeerHeadRepsOfAOneHeadPartIsChecked)
{
    Model rm = {false, true, 4, 16, 2, 8}, lm = {false, true, 4, 16, 1, 8};
    kvc_geom_t rg = GeomOf(rm), lg = GeomOf(lm);
    ASSERT_EQ(16u, rg.head_reps); // NHD: once per token
    ASSERT_EQ(KVX_OK, kvc_geom_sliceable(&lg, &rg, 2)) << kvc_last_error();
    // longer than the part; runs of 1 byte (elem_size 2)
    for (uint32_t bad : {(uint32_t)rg.block_len, (uint32_t)lg.block_len}) {
        kvc_geom_t evil = rg;
        evil.head_reps  = bad;
        EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_sliceable(&lg, &evil, 2))
            << "head_reps " << bad;
        EXPECT_TRUE(HasText("remote head_reps " + std::to_string(bad)))
            << kvc_last_error();
    }
    // runs of whole elements that cover the part: a coarser honest cut
    kvc_geom_t coarse = rg;
    coarse.head_reps  = 4;
    EXPECT_EQ(KVX_OK, kvc_geom_sliceable(&lg, &coarse, 2)) << kvc_last_error();
}

TEST(LayoutHeads, SliceChecksNameTheRule)
{
    Model rm = {false, true, 6, 3, 8, 3}, lm = {false, true, 5, 3, 4, 3};
    kvc_geom_t rg = GeomOf(rm), lg = GeomOf(lm);
    const uint64_t lid[] = {0}, rid[] = {6};
    kvc_run_t      runs[64];
    size_t         n = 0;
    // Wrong slice count for the heads: 4 x 4 != 8.
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, kvc_geom_sliceable(&lg, &rg, 4));
    EXPECT_TRUE(HasText("num_kv_heads: local num_kv_heads x 4 = 16, remote 8")) << kvc_last_error();
    // Remote id past its num_blocks.
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS,
              kvc_plan_build_sliced(&lg, lm.Bytes(), &rg, rm.Bytes(), 0, 2, lid,
                                    1, rid, 1, runs, &n));
    EXPECT_TRUE(HasText("remote block_ids[0] = 6")) << kvc_last_error();
    // Slice index out of range.
    const uint64_t rid_ok[] = {5};
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvc_plan_build_sliced(&lg, lm.Bytes(), &rg, rm.Bytes(), 2, 2, lid,
                                    1, rid_ok, 1, runs, &n));
    // Interleaved kernel-block and MLA layers cannot be sliced.
    kvx_layer_desc_t kd = MakeDesc(kInterKernel);
    kvc_geom_t       kg;
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&kd, &kg));
    EXPECT_EQ(KVX_ERR_NOT_SUPPORTED, kvc_geom_sliceable(&kg, &kg, 2));
    EXPECT_TRUE(HasText("not supported")) << kvc_last_error();
    kvx_layer_desc_t md = MakeDesc(kMla);
    ASSERT_EQ(KVX_OK, kvc_geom_from_desc(&md, &kg));
    EXPECT_EQ(KVX_ERR_NOT_SUPPORTED, kvc_geom_sliceable(&kg, &kg, 2));
    // block_size == num_kv_heads: the head axis is unknown, refused.
    Model am = {false, true, 6, 4, 4, 3}, bm = {false, true, 6, 4, 2, 3};
    kvc_geom_t ag = GeomOf(am), bg = GeomOf(bm);
    EXPECT_EQ(KVX_ERR_NOT_SUPPORTED, kvc_geom_sliceable(&bg, &ag, 2));
    EXPECT_TRUE(HasText("cannot tell the token axis")) << kvc_last_error();
    // Remote region too short for the remote unit.
    EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS,
              kvc_plan_build_sliced(&lg, lm.Bytes(), &rg, rm.Bytes() / 2, 0, 2,
                                    lid, 1, rid_ok, 1, runs, &n));
}

} // namespace
