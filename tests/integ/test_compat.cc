// Handshake compatibility and device seams: a peer whose layer set or
// geometry differs is refused with a clear error before any get; device
// memory is never silently treated as host memory; the mixed-layout model
// moves in READ mode with different num_blocks on P and D.
#include "harness.h"

extern "C" {
#include "ctlmsg.h"
#include "nng/kvn.h"
}

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace kvt;

namespace {

bool Has(const std::string &s, const std::string &what)
{
    return s.find(what) != std::string::npos;
}

RankOpts Opts(bool producer, uint16_t hs, uint32_t nb, bool read = true)
{
    RankOpts o;
    o.producer    = producer;
    o.num_blocks  = nb;
    o.hs_port     = hs;
    o.notify_port = (uint16_t)(hs + 20000);
    o.read_mode   = read;
    return o;
}

struct Case {
    const char *label;
    ModelSpec   d_model;
    const char *expect; // substring of the failure reason
};

TEST(Compat, PeerWithOtherLayersOrGeometryIsRefusedBeforeAnyGet)
{
    ModelSpec renamed = ThreeLayerModel();
    renamed.layers[1].name = "model.layers.1.self_attn";
    ModelSpec wider = ThreeLayerModel();
    wider.head_dim = 32;
    ModelSpec fewer = ThreeLayerModel();
    fewer.layers.pop_back();
    const Case cases[] = {
        {"renamed", renamed, "has no layer named 'model.layers.1.self_attn'"},
        {"geometry", wider, "block_len"},
        {"fewer", fewer, "registers 3 layers, this engine 2"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.label);
        uint16_t hs = PortBase(2);
        Rank     p, d;
        ASSERT_EQ(KVX_OK, MakeRank(ThreeLayerModel(), Opts(true, hs, 16), &p));
        ASSERT_EQ(KVX_OK, MakeRank(c.d_model, Opts(false, (uint16_t)(hs + 1), 16),
                                   &d));
        std::vector<uint64_t> ids = {1, 2};
        std::string tid = std::string("tx-compat-") + c.label;
        std::string prm = Params(tid, "127.0.0.1", hs, (uint16_t)(hs + 20000),
                                 ids, 1);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", prm.c_str(),
                                                  ids.data(), ids.size()));
        kvx_status_t st = Api()->wait_transfer(d.eng, tid.c_str(), 10000);
        EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE, st) << Api()->last_error();
        EXPECT_TRUE(Has(Api()->last_error(), c.expect)) << Api()->last_error();
        // Nothing was written into D's layers.
        for (const auto &b : d.bufs) {
            for (uint8_t v : b) {
                ASSERT_EQ(0xEE, v);
            }
        }
        EXPECT_EQ(0, StatCount(d.eng, "bytes_read"));
        EXPECT_EQ(1, StatCount(d.eng, "handshakes_failed"));
    }
}

TEST(Compat, DeviceMemoryWithoutDeviceFailsLoudly)
{
    Rank         r;
    RankOpts     o = Opts(true, PortBase(1), 8);
    std::string  cfg = RankConfig(o);
    ASSERT_EQ(KVX_OK, Api()->engine_create(cfg.c_str(), &r.eng));
    std::vector<uint8_t> buf(2 * 8 * 4 * 2 * 16 * 2);
    kvx_layer_desc_t     d{};
    d.struct_size  = sizeof(d);
    d.name         = "gpu.layer";
    d.base         = buf.data();
    d.length       = buf.size();
    d.mem_type     = KVX_MEM_ROCM; // host memory claimed to be device memory
    d.ndim         = 5;
    int64_t shape[5] = {2, 8, 4, 2, 16};
    int64_t stride[5] = {8 * 4 * 2 * 16, 4 * 2 * 16, 2 * 16, 16, 1};
    memcpy(d.shape, shape, sizeof(shape));
    memcpy(d.stride, stride, sizeof(stride));
    d.elem_size    = 2;
    d.block_size   = 4;
    d.num_kv_heads = 2;
    d.head_size    = 16;
    EXPECT_EQ(KVX_ERR_DEVICE, Api()->register_layer(r.eng, &d));
    std::string err = Api()->last_error();
    EXPECT_TRUE(Has(err, "gpu.layer")) << err;
    EXPECT_TRUE(Has(err, "rocm")) << err;
    // The same memory as host memory registers fine.
    d.mem_type = KVX_MEM_HOST;
    EXPECT_EQ(KVX_OK, Api()->register_layer(r.eng, &d)) << Api()->last_error();
}

TEST(Compat, MixedModelReadWithDifferentNumBlocks)
{
    ModelSpec m  = MixedModel();
    uint16_t  hs = PortBase(2);
    Rank      p, d;
    ASSERT_EQ(KVX_OK, MakeRank(m, Opts(true, hs, 48), &p)) << Api()->last_error();
    ASSERT_EQ(KVX_OK, MakeRank(m, Opts(false, (uint16_t)(hs + 1), 20), &d))
        << Api()->last_error();
    std::vector<uint64_t> pids = {47, 0, 13, 14, 15, 30};
    std::vector<uint64_t> dids = {19, 0, 1, 2, 3, 10};
    std::string tid = "tx-mixed-read";
    // P holds the blocks first (SPEC §7): peers may read only the blocks of
    // P's live transfers (plugin/engine/expose.c).
    char       *resp = nullptr;
    std::string pp   = "{\"transfer_id\":\"" + tid + "\",\"do_remote_decode\":true}";
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "r", pp.c_str(), pids.data(),
                                              pids.size(), &resp))
        << Api()->last_error();
    Api()->free(resp);
    std::string prm = Params(tid, "127.0.0.1", hs, (uint16_t)(hs + 20000), pids, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", prm.c_str(), dids.data(),
                                              dids.size()));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d.eng, tid.c_str(), 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(m, d, 0, dids, pids));
}

// An old-style P's reply: ok, and no instance.
void LegacyReply(void *, const char *, const char *, size_t, char **reply,
                 size_t *rlen)
{
    *reply = strdup("{\"ok\":true}");
    *rlen  = strlen(*reply);
}

TEST(Compat, LegacyPlainStringWriteDoneAndLateRemoteBlocks)
{
    ModelSpec m  = ThreeLayerModel();
    uint16_t  hs = PortBase(2);
    Rank      p, d;
    ASSERT_EQ(KVX_OK, MakeRank(m, Opts(true, hs, 16, false), &p));
    ASSERT_EQ(KVX_OK, MakeRank(m, Opts(false, (uint16_t)(hs + 1), 16, false), &d));
    std::vector<uint64_t> ids = {3};
    // D waits for a push from an old-style P: its replies name no instance
    // (a kvxfer P's do, and then a write_done must carry the use's
    // xfer_nonce), and its write_done is the bare transfer id.
    uint16_t      lp     = PortBase(2);
    kvn_server_t *legacy = nullptr;
    ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", (uint32_t)(lp + 20000), 2,
                                        1 << 20, LegacyReply, nullptr,
                                        &legacy))
        << kvc_last_error();
    std::string dprm = Params("tx-legacy", "127.0.0.1", lp,
                              (uint16_t)(lp + 20000), {}, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", dprm.c_str(),
                                              ids.data(), ids.size()))
        << Api()->last_error();
    kvn_client_t *cli = nullptr;
    ASSERT_EQ(KVX_OK, kvn_client_open("127.0.0.1", (uint32_t)(hs + 1 + 20000), &cli));
    char  *reply = nullptr;
    size_t rlen  = 0;
    ASSERT_EQ(KVX_OK, kvn_client_request(cli, "tx-legacy", 9, 5000, &reply, &rlen));
    int  ok = 0;
    char why[256];
    ASSERT_EQ(KVX_OK, kvc_reply_decode(reply, rlen, &ok, why, sizeof(why)));
    EXPECT_EQ(1, ok) << why;
    free(reply);
    EXPECT_EQ(KVX_OK, Api()->wait_transfer(d.eng, "tx-legacy", 5000))
        << Api()->last_error();
    kvn_server_destroy(legacy);

    // P holds a WRITE transfer; D aborts it; a remote_blocks arriving after
    // that is answered but ignored (no write, no event).
    char       *resp = nullptr;
    std::string pprm = "{\"transfer_id\":\"tx-late\",\"remote_host\":\"127.0.0.1\","
                       "\"remote_handshake_port\":" + std::to_string(hs + 1) +
                       ",\"remote_notify_port\":" + std::to_string(hs + 1 + 20000) +
                       ",\"remote_tp_size\":1}";
    ASSERT_EQ(KVX_OK, Api()->producer_request(p.eng, "r", pprm.c_str(), ids.data(),
                                              ids.size(), &resp));
    Api()->free(resp);
    std::string abort_prm = Params("tx-late", "127.0.0.1", hs,
                                   (uint16_t)(hs + 20000), {}, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_abort(d.eng, "r", abort_prm.c_str()));
    std::vector<kvx_event_t> pev;
    ASSERT_TRUE(WaitFor([&] { DrainEvents(p.eng, &pev); return !pev.empty(); }, 5000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
    FreeEvents(&pev);
    kvn_client_t *pc = nullptr;
    ASSERT_EQ(KVX_OK, kvn_client_open("127.0.0.1", (uint32_t)(hs + 20000), &pc));
    const std::string rb = "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-late\","
                           "\"req_id\":\"r\",\"block_notify_list\":[3],\"decode_rank\":0}";
    ASSERT_EQ(KVX_OK, kvn_client_request(pc, rb.data(), rb.size(), 5000, &reply, &rlen));
    free(reply);
    ASSERT_EQ(KVX_OK, Api()->layer_ready(p.eng, "tx-late", 0));
    ASSERT_EQ(KVX_OK, Api()->seal_transfer(p.eng, "tx-late"));
    EXPECT_EQ(0, DrainEvents(p.eng, &pev));
    EXPECT_EQ(0, StatCount(p.eng, "bytes_written"));
    kvn_client_close(pc);
    kvn_client_close(cli);
}

} // namespace

namespace {

std::string TopoConfig(const std::string &busid, const std::string &extra)
{
    const char *data = getenv("KVT_DATA");
    std::string xml  = std::string(data ? data : "tests/data") + "/topo-2numa.xml";
    return "{\"role\":\"kv_producer\",\"kv_connector_extra_config\":{"
           "\"host_ip\":\"127.0.0.1\",\"ucx_tls\":\"tcp\",\"gpu_bus_id\":\"" +
           busid + "\",\"hwloc_topology\":\"" + xml + "\"" + extra + "}}";
}

// hwloc seam: the NIC nearest the GPU becomes UCX's device; where that NIC
// does not exist the engine refuses to start and says which device.
TEST(Placement, GpuBusIdChoosesTheNearestNicOrFailsClearly)
{
    kvx_engine_t *eng = nullptr;
    std::string   cfg = TopoConfig("0000:01:00.0", "");
    EXPECT_EQ(KVX_ERR_CONFIG, Api()->engine_create(cfg.c_str(), &eng));
    EXPECT_TRUE(Has(Api()->last_error(), "gpu_bus_id")) << Api()->last_error();
    EXPECT_TRUE(Has(Api()->last_error(), "0000:01:00.0")) << Api()->last_error();

    cfg = TopoConfig("0000:02:00.0", "");
    EXPECT_EQ(KVX_ERR_TRANSPORT, Api()->engine_create(cfg.c_str(), &eng));
    EXPECT_TRUE(Has(Api()->last_error(), "mlx5_0:1")) << Api()->last_error();

    // An explicit device wins over the topology; the engine runs.
    cfg = TopoConfig("0000:02:00.0", ",\"ucx_net_devices\":\"lo\"");
    ASSERT_EQ(KVX_OK, Api()->engine_create(cfg.c_str(), &eng))
        << Api()->last_error();
    Api()->engine_destroy(eng);
}

} // namespace

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace {

// A P whose answer to remote_blocks waits until the test opens the gate
// (at most 5 s), then names an instance (a kvxfer P) or none (a legacy P).
struct SlowP {
    std::mutex              m;
    std::condition_variable cv;
    bool                    open = false;
    std::string             answer;
};

void SlowReply(void *arg, const char *, const char *, size_t, char **reply,
               size_t *rlen)
{
    SlowP                       *s = static_cast<SlowP *>(arg);
    std::unique_lock<std::mutex> lk(s->m);
    s->cv.wait_for(lk, std::chrono::seconds(5), [s] { return s->open; });
    *reply = strdup(s->answer.c_str());
    *rlen  = strlen(*reply);
}

// A plain write_done (the bare transfer id) that reaches D before its P
// rank answered remote_blocks is held until the answer: a kvxfer P's
// (naming an instance) drops it, since that P's write_done carries the
// use's xfer_nonce; a legacy P's (no instance) applies it. Before, it ended
// the use at once, whoever sent it (seen in the sanitizer run, whose
// answer came late).
TEST(Compat, PlainWriteDoneBeforeTheAnswerWaitsForIt)
{
    for (bool legacy : {false, true}) {
        SCOPED_TRACE(legacy ? "legacy P" : "kvxfer P");
        ModelSpec m  = ThreeLayerModel();
        uint16_t  hs = PortBase(2);
        Rank      d;
        ASSERT_EQ(KVX_OK, MakeRank(m, Opts(false, hs, 16, false), &d))
            << Api()->last_error();
        SlowP slow;
        slow.answer = legacy ? "{\"ok\":true}"
                             : "{\"ok\":true,\"instance\":\"4242\"}";
        uint16_t      lp  = PortBase(2);
        kvn_server_t *srv = nullptr;
        ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", (uint32_t)(lp + 20000),
                                            2, 1 << 20, SlowReply, &slow, &srv))
            << kvc_last_error();
        std::vector<uint64_t> ids = {3};
        std::string tid = legacy ? "tx-slow-legacy" : "tx-slow-kvx";
        std::string prm = Params(tid, "127.0.0.1", lp, (uint16_t)(lp + 20000),
                                 {}, 1);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(d.eng, "r", prm.c_str(),
                                                  ids.data(), ids.size()))
            << Api()->last_error();
        // the plain write_done, while the answer is held back
        kvn_client_t *cli = nullptr;
        ASSERT_EQ(KVX_OK,
                  kvn_client_open("127.0.0.1", (uint32_t)(hs + 20000), &cli));
        char  *reply = nullptr;
        size_t rlen  = 0;
        ASSERT_EQ(KVX_OK, kvn_client_request(cli, tid.data(), tid.size(), 5000,
                                             &reply, &rlen));
        free(reply);
        kvn_client_close(cli);
        EXPECT_EQ(KVX_ERR_TIMEOUT,
                  Api()->wait_transfer(d.eng, tid.c_str(), 300))
            << "D ended the use before its P rank answered";
        {
            std::lock_guard<std::mutex> lk(slow.m);
            slow.open = true;
        }
        slow.cv.notify_all();
        kvx_status_t st = Api()->wait_transfer(d.eng, tid.c_str(), 1500);
        if (legacy) {
            EXPECT_EQ(KVX_OK, st) << Api()->last_error();
        } else {
            EXPECT_NE(KVX_OK, st) << "a plain write_done ended a use of a "
                                     "kvxfer P's";
        }
        kvn_server_destroy(srv);
    }
}

} // namespace
