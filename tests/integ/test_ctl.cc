// Control plane and failure behaviour of READ mode (SPEC §3-§10) with real
// engines (UCX + nng on 127.0.0.1 / ::1) in this process. Raw control
// messages are sent with the nng transport directly to an engine's notify
// port (notify base + dp*tp_size + tp).
#include "harness.h"

#include <gtest/gtest.h>

extern "C" {
#include "ctlmsg.h"
#include "error.h"
#include "nng/kvn.h"
#include "ucx/kvu.h"
}

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace kvt;

namespace {

// The clock the engines run on (harness.h): durations around engine calls.
using Clock = TestClock;

double SecondsSince(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- engines ------------------------------------------------------------

RankOpts Opts(bool producer, uint16_t hs, uint32_t num_blocks)
{
    RankOpts o;
    o.producer    = producer;
    o.hs_port     = hs;
    o.notify_port = (uint16_t)(hs + 20000);
    o.num_blocks  = num_blocks;
    return o;
}

// Start creates and starts one rank; nullptr (and *err) on failure.
std::unique_ptr<Rank> Start(const ModelSpec &m, const RankOpts &o,
                            std::string *err)
{
    std::unique_ptr<Rank> r(new Rank);
    kvx_status_t          st = MakeRank(m, o, r.get());
    if (st != KVX_OK) {
        *err = std::string(Api()->status_name(st)) + ": " + Api()->last_error();
        return nullptr;
    }
    return r;
}

uint16_t NotifyPortOf(const RankOpts &o)
{
    return (uint16_t)(o.notify_port + o.tp_rank); // dp 0
}

ModelSpec KeyOnlyModel()
{
    ModelSpec m;
    m.layers = {{"model.layers.0.indexer", "key_only"},
                {"model.layers.1.mla", "key_only"}};
    return m;
}

// Hold makes P hold `ids` under transfer id tid.
kvx_status_t Hold(const Rank &p, const std::string &tid,
                  const std::vector<uint64_t> &ids,
                  const std::string &rid = "req-ctl")
{
    char       *resp = nullptr;
    std::string pp   = "{\"transfer_id\":\"" + tid +
                     "\",\"do_remote_decode\":true}";
    kvx_status_t st = Api()->producer_request(p.eng, rid.c_str(), pp.c_str(),
                                              ids.data(), ids.size(), &resp);
    Api()->free(resp);
    return st;
}

std::string ReleaseJson(const std::string &tid, int consumer_tp_size,
                        int consumer_rank)
{
    std::string s = "{\"type\":\"release\",\"transfer_id\":\"" + tid +
                    "\",\"consumer_tp_size\":" +
                    std::to_string(consumer_tp_size);
    if (consumer_rank >= 0) {
        s += ",\"consumer_rank\":" + std::to_string(consumer_rank);
    }
    return s + "}";
}

bool AllEE(const Rank &r)
{
    for (const auto &b : r.bufs) {
        if (std::any_of(b.begin(), b.end(),
                        [](uint8_t c) { return c != 0xEE; })) {
            return false;
        }
    }
    return true;
}

// ---- events -------------------------------------------------------------

struct Events {
    std::vector<kvx_event_t> v;
    ~Events() { FreeEvents(&v); }
    size_t Poll(kvx_engine_t *eng)
    {
        DrainEvents(eng, &v);
        return v.size();
    }
    // WaitN polls until at least n events arrived or timeout_ms passed.
    bool WaitN(kvx_engine_t *eng, size_t n, int timeout_ms)
    {
        return WaitFor([&] { return Poll(eng) >= n; }, timeout_ms);
    }
    size_t Count(kvx_event_type_t type, const std::string &tid) const
    {
        size_t n = 0;
        for (const auto &e : v) {
            n += e.type == type && tid == e.transfer_id;
        }
        return n;
    }
};

std::vector<uint64_t> Ids(const kvx_event_t &e)
{
    return std::vector<uint64_t>(e.block_ids, e.block_ids + e.num_block_ids);
}

// ---- raw control messages -----------------------------------------------

struct CtlReply {
    kvx_status_t st = KVX_ERR_INTERNAL; // transport status
    kvx_status_t dec = KVX_ERR_INTERNAL; // kvc_reply_decode status
    int          ok  = -1;
    std::string  error;
    std::string  raw;
};

class CtlClient {
  public:
    CtlClient(const std::string &host, uint16_t port)
    {
        open_st_ = kvn_client_open(host.c_str(), port, &cli_);
    }
    ~CtlClient() { kvn_client_close(cli_); }
    kvx_status_t open_status() const { return open_st_; }

    CtlReply Send(const std::string &bytes, int timeout_ms = 5000)
    {
        CtlReply r;
        char    *reply = nullptr;
        size_t   len   = 0;
        if (cli_ == nullptr) {
            r.st = open_st_;
            return r;
        }
        r.st = kvn_client_request(cli_, bytes.data(), bytes.size(),
                                  timeout_ms, &reply, &len);
        if (r.st != KVX_OK) {
            r.error = Api()->last_error();
            return r;
        }
        r.raw = std::string(reply, len);
        char reason[KVX_REASON_MAX] = "";
        r.dec   = kvc_reply_decode(reply, len, &r.ok, reason, sizeof(reason));
        r.error = reason;
        free(reply);
        return r;
    }

  private:
    kvn_client_t *cli_     = nullptr;
    kvx_status_t  open_st_ = KVX_ERR_INTERNAL;
};

#define EXPECT_REPLY_OK(rep)                                                   \
    do {                                                                       \
        const CtlReply &r_ = (rep);                                            \
        ASSERT_EQ(KVX_OK, r_.st) << r_.error;                                  \
        ASSERT_EQ(KVX_OK, r_.dec) << r_.raw;                                   \
        EXPECT_EQ(1, r_.ok) << r_.raw;                                         \
    } while (0)

#define EXPECT_REPLY_ERROR(rep)                                                \
    do {                                                                       \
        const CtlReply &r_ = (rep);                                            \
        ASSERT_EQ(KVX_OK, r_.st) << r_.error;                                  \
        ASSERT_EQ(KVX_OK, r_.dec) << r_.raw.substr(0, 200);                   \
        EXPECT_EQ(0, r_.ok) << r_.raw.substr(0, 200);                          \
        EXPECT_FALSE(r_.error.empty()) << r_.raw.substr(0, 200);               \
    } while (0)

// ---- raw TCP listener (to prove nothing dials a rejected peer) ----------

class TcpListener {
  public:
    explicit TcpListener(uint16_t port)
    {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd_ < 0) {
            return;
        }
        int one = 1;
        setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in a;
        memset(&a, 0, sizeof(a));
        a.sin_family      = AF_INET;
        a.sin_port        = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd_, (sockaddr *)&a, sizeof(a)) != 0 || listen(fd_, 8) != 0) {
            close(fd_);
            fd_ = -1;
        }
    }
    ~TcpListener()
    {
        if (fd_ >= 0) {
            close(fd_);
        }
    }
    bool ok() const { return fd_ >= 0; }
    // Accepted waits up to timeout_ms (real time: a real socket) for one
    // incoming connection.
    bool Accepted(int timeout_ms)
    {
        using Real = std::chrono::steady_clock;
        pollfd p{fd_, POLLIN, 0};
        auto   end = Real::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            int left = (int)std::chrono::duration_cast<std::chrono::milliseconds>(
                           end - Real::now()).count();
            if (left < 0) {
                left = 0;
            }
            int rc = poll(&p, 1, left);
            if (rc > 0) {
                int c = accept(fd_, nullptr, nullptr);
                if (c >= 0) {
                    close(c);
                    return true;
                }
            }
            if (left == 0) {
                return false;
            }
        }
    }

  private:
    int fd_ = -1;
};

bool CanBindIpv6Loopback()
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    sockaddr_in6 a;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_addr   = in6addr_loopback;
    bool ok       = bind(fd, (sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

std::string ReqId(const std::string &phost, uint16_t phs, uint16_t pnotify,
                  const std::string &dhost, uint16_t dhs, uint16_t dnotify)
{
    return "chatcmpl-___prefill_addr_host:" + phost +
           ",handshake:" + std::to_string(phs) +
           ",notify:" + std::to_string(pnotify) +
           "___decode_addr_host:" + dhost +
           ",handshake:" + std::to_string(dhs) +
           ",notify:" + std::to_string(dnotify) +
           "_0123456789abcdef0123456789abcdef-0-1a2b3c4d";
}

bool Contains(const std::string &hay, const std::string &needle)
{
    return hay.find(needle) != std::string::npos;
}

// One healthy P/D pair: P has 32 blocks, D 24 (3-layer model).
struct Pair {
    ModelSpec             model = ThreeLayerModel();
    RankOpts              po, dopt;
    std::unique_ptr<Rank> p, d;
    uint16_t              hs = 0;
};

void MakePair(Pair *pr, const std::string &dextra = "",
              double d_hs_timeout = 5.0, double d_xfer_timeout = 20.0,
              const std::string &pextra = "")
{
    std::string err;
    pr->hs   = PortBase(2);
    pr->po   = Opts(true, pr->hs, 32);
    pr->dopt = Opts(false, (uint16_t)(pr->hs + 1), 24);
    pr->po.extra               = pextra;
    pr->dopt.extra             = dextra;
    pr->dopt.handshake_timeout = d_hs_timeout;
    pr->dopt.transfer_timeout  = d_xfer_timeout;
    pr->p = Start(pr->model, pr->po, &err);
    ASSERT_TRUE(pr->p) << "P: " << err;
    pr->d = Start(pr->model, pr->dopt, &err);
    ASSERT_TRUE(pr->d) << "D: " << err;
}

std::string PairParams(const Pair &pr, const std::string &tid,
                       const std::vector<uint64_t> &remote,
                       const std::string &more = "")
{
    return Params(tid, "127.0.0.1", pr.hs, (uint16_t)(pr.hs + 20000), remote,
                  1, more);
}

// Pull runs one full transfer P->D and verifies the bytes and both events.
void Pull(Pair &pr, const std::string &tid, const std::vector<uint64_t> &local,
          const std::vector<uint64_t> &remote)
{
    ASSERT_EQ(KVX_OK, Hold(*pr.p, tid, remote)) << Api()->last_error();
    std::string params = PairParams(pr, tid, remote);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-ctl",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, tid.c_str(), 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, local, remote));
    Events dev, pev;
    ASSERT_TRUE(dev.WaitN(pr.d->eng, 1, 5000));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, tid));
    ASSERT_TRUE(pev.WaitN(pr.p->eng, 1, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, tid));
}

// ========================================================================
// 1. Handshake to a port with nothing listening.
// ========================================================================

TEST(ReadFailure, HandshakeToDeadPortTimesOutWithReasonAndBlocks)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(2);
    uint16_t    dead  = base; // nothing listens here
    RankOpts    o     = Opts(false, (uint16_t)(base + 1), 24);
    std::string err;
    o.handshake_timeout = 0.5;
    auto d              = Start(model, o, &err);
    ASSERT_TRUE(d) << err;

    const std::vector<uint64_t> local  = {5, 1, 9};
    const std::vector<uint64_t> remote = {2, 3, 4};
    std::string params = Params("tx-dead-hs", "127.0.0.1", dead,
                                (uint16_t)(dead + 20000), remote, 1);
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-dead",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    kvx_status_t st = Api()->wait_transfer(d->eng, "tx-dead-hs", 10000);
    double       dt = SecondsSince(t0);
    std::string  le = Api()->last_error();
    EXPECT_EQ(KVX_ERR_HANDSHAKE_TIMEOUT, st)
        << Api()->status_name(st) << ": " << le;
    EXPECT_GE(dt, 0.4);
    EXPECT_LT(dt, 3.0);

    Events ev;
    ASSERT_TRUE(ev.WaitN(d->eng, 1, 3000));
    ASSERT_EQ(1u, ev.v.size());
    const kvx_event_t &e = ev.v[0];
    EXPECT_EQ(KVX_EVENT_FAILED, e.type);
    EXPECT_EQ(KVX_ERR_HANDSHAKE_TIMEOUT, e.status);
    EXPECT_STREQ("tx-dead-hs", e.transfer_id);
    EXPECT_STREQ("req-dead", e.request_id);
    EXPECT_TRUE(Contains(e.reason, "handshake")) << e.reason;
    EXPECT_TRUE(Contains(e.reason, std::to_string(dead))) << e.reason;
    EXPECT_EQ(local, Ids(e));
    EXPECT_TRUE(AllEE(*d));
}

// ========================================================================
// 2. Malformed control messages do not stop the listener.
// ========================================================================

TEST(CtlListener, MalformedMessagesGetErrorRepliesAndListenerKeepsServing)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    const std::vector<uint64_t> ids = {1, 2, 3};
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-ctl-a", ids)) << Api()->last_error();
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-ctl-legacy", {4, 5}))
        << Api()->last_error();

    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    ASSERT_EQ(KVX_OK, cli.open_status()) << Api()->last_error();

    struct Bad {
        const char *what;
        std::string bytes;
    };
    std::string big = "{\"type\":\"release\",\"transfer_id\":\"tx-ctl-a\","
                      "\"pad\":\"" + std::string(5u << 20, 'a') + "\"}";
    const Bad bad[] = {
        {"binary garbage", std::string("\xff\xfe\x01\x02garbage\x7f", 12)},
        {"truncated json", "{\"type\":\"release\",\"transfer_id\":"},
        {"empty-block remote_blocks",
         "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-ctl-a\","
         "\"req_id\":\"req-ctl\",\"block_notify_list\":[],"
         "\"decode_rank\":0}"},
        {"unknown type",
         "{\"type\":\"frobnicate\",\"transfer_id\":\"tx-ctl-a\"}"},
        {"5 MB message", big},
        {"object without type", "{\"transfer_id\":\"tx-ctl-a\"}"},
        {"release with consumer_tp_size 0",
         "{\"type\":\"release\",\"transfer_id\":\"tx-ctl-a\","
         "\"consumer_tp_size\":0}"},
        {"empty", ""},
    };
    for (const Bad &b : bad) {
        SCOPED_TRACE(b.what);
        CtlReply r = cli.Send(b.bytes);
        EXPECT_REPLY_ERROR(r);
    }
    // Nothing was released by the bad messages.
    Events ev;
    EXPECT_EQ(0u, ev.Poll(p->eng));

    // The listener still serves a valid release.
    CtlReply r = cli.Send(ReleaseJson("tx-ctl-a", 1, 0));
    EXPECT_REPLY_OK(r);
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000));
    ASSERT_EQ(1u, ev.v.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, ev.v[0].type);
    EXPECT_STREQ("tx-ctl-a", ev.v[0].transfer_id);
    EXPECT_EQ(KVX_OK, ev.v[0].status);
    EXPECT_EQ(ids, Ids(ev.v[0]));

    // A plain-string legacy release (just the transfer id bytes).
    r = cli.Send("tx-ctl-legacy");
    EXPECT_REPLY_OK(r);
    ASSERT_TRUE(ev.WaitN(p->eng, 2, 3000));
    ASSERT_EQ(2u, ev.v.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, ev.v[1].type);
    EXPECT_STREQ("tx-ctl-legacy", ev.v[1].transfer_id);
    EXPECT_EQ((std::vector<uint64_t>{4, 5}), Ids(ev.v[1]));

    // A fresh client (new connection) is still served after all that.
    CtlClient cli2("127.0.0.1", NotifyPortOf(o));
    r = cli2.Send("{\"type\":\"heartbeat\",\"transfer_id\":\"hb\"}");
    ASSERT_EQ(KVX_OK, r.st) << r.error;
    EXPECT_EQ(KVX_OK, r.dec) << r.raw;
}

// ========================================================================
// 3. Duplicate releases and the ack quorum.
// ========================================================================

TEST(CtlRelease, DuplicateReleaseFromSameRankGivesOneEvent)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-dup", {7, 8})) << Api()->last_error();

    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-dup", 1, 0)));
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-dup", 1, 0)));
    // Events are queued before the reply is sent: a marker transfer
    // released afterwards proves that every event of tx-dup is in.
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-dup-marker", {9})) << Api()->last_error();
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-dup-marker", 1, 0)));
    Events ev;
    ASSERT_TRUE(ev.WaitN(p->eng, 2, 3000));
    ev.Poll(p->eng);
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-dup"));
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-dup-marker"));
    EXPECT_EQ(2u, ev.v.size());
}

TEST(CtlRelease, KeyOnlyQuorumOfTwoNeedsTwoDistinctConsumerRanks)
{
    // Key-only layers are replicated: D tp 2 -> both D ranks read P rank 0,
    // so P rank 0's quorum is 2.
    ModelSpec   model = KeyOnlyModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-q2", {1, 2, 3})) << Api()->last_error();

    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    Events    ev;
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2", 2, 0)));
    EXPECT_EQ(0u, ev.Poll(p->eng)) << "released after 1 of 2 consumer ranks";
    // The same rank again is a duplicate and must not complete the quorum.
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2", 2, 0)));
    EXPECT_EQ(0u, ev.Poll(p->eng))
        << "a duplicate release from consumer rank 0 completed the quorum";
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2", 2, 1)));
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000));
    ASSERT_EQ(1u, ev.v.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, ev.v[0].type);
    EXPECT_STREQ("tx-q2", ev.v[0].transfer_id);
    EXPECT_EQ((std::vector<uint64_t>{1, 2, 3}), Ids(ev.v[0]));
    // A third release (rank 1 again) after completion changes nothing.
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2", 2, 1)));
    EXPECT_EQ(1u, ev.Poll(p->eng));
}

TEST(CtlRelease, ShardedHeadsDecodeWiderNeedsEverySliceReader)
{
    // The 3-layer model shards its heads: with consumer_tp_size 2 against P
    // tp 1 each D rank reads one half of the heads of P rank 0 (SPEC §4), so
    // P rank 0's quorum is 2 distinct consumer ranks.
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-q2s", {4})) << Api()->last_error();
    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    Events    ev;
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2s", 2, 0)));
    EXPECT_EQ(0u, ev.Poll(p->eng)) << "released after 1 of 2 slice readers";
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q2s", 2, 1)));
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000));
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-q2s"));
}

TEST(CtlRelease, DecodeNarrowerGathersSoEachPartHasQuorumOne)
{
    // D tp 1 against P tp 2 with sharded heads: D gathers its heads from
    // both P ranks, each read by that one D rank, so P rank 0's quorum is 1
    // and the first release frees the blocks.
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(2);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    o.tp_size = 2;
    auto p    = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-q1", {4})) << Api()->last_error();
    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-q1", 1, 0)));
    Events ev;
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000));
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-q1"));
}

// ========================================================================
// 4. A release that overtakes producer_request is remembered.
// ========================================================================

TEST(CtlRelease, EarlyReleaseBeforeProducerRequestIsRemembered)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;

    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-early", 1, 0)));
    Events ev;
    EXPECT_EQ(0u, ev.Poll(p->eng));

    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-early", {10, 11})) << Api()->last_error();
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 1000))
        << "the early release was not applied to producer_request";
    EXPECT_LT(SecondsSince(t0), 1.0);
    ASSERT_EQ(1u, ev.v.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, ev.v[0].type);
    EXPECT_STREQ("tx-early", ev.v[0].transfer_id);
    EXPECT_EQ((std::vector<uint64_t>{10, 11}), Ids(ev.v[0]));

    // With a quorum of 2 (key-only model, consumer tp 2) one early release
    // is not enough; the second, arriving after producer_request, is.
    ModelSpec km  = KeyOnlyModel();
    uint16_t  hs2 = PortBase(1);
    RankOpts  o2  = Opts(true, hs2, 32);
    auto      p2  = Start(km, o2, &err);
    ASSERT_TRUE(p2) << err;
    CtlClient cli2("127.0.0.1", NotifyPortOf(o2));
    EXPECT_REPLY_OK(cli2.Send(ReleaseJson("tx-early2", 2, 1)));
    ASSERT_EQ(KVX_OK, Hold(*p2, "tx-early2", {3})) << Api()->last_error();
    Events ev2;
    EXPECT_EQ(0u, ev2.Poll(p2->eng));
    EXPECT_REPLY_OK(cli2.Send(ReleaseJson("tx-early2", 2, 0)));
    ASSERT_TRUE(ev2.WaitN(p2->eng, 1, 3000));
    EXPECT_EQ(1u, ev2.Count(KVX_EVENT_FINISHED_SENDING, "tx-early2"));
}

// ========================================================================
// 5. A release for a finished transfer is ignored.
// ========================================================================

TEST(CtlRelease, ReleaseForFinishedTransferIsIgnored)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    hs    = PortBase(1);
    RankOpts    o     = Opts(true, hs, 32);
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    CtlClient cli("127.0.0.1", NotifyPortOf(o));

    ASSERT_EQ(KVX_OK, Hold(*p, "tx-fin", {1})) << Api()->last_error();
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-fin", 1, 0)));
    Events ev;
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000));
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-fin"));

    // Late releases (JSON and legacy) are answered ok and ignored.
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-fin", 1, 0)));
    EXPECT_REPLY_OK(cli.Send("tx-fin"));
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-fin-marker", {2})) << Api()->last_error();
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-fin-marker", 1, 0)));
    ASSERT_TRUE(ev.WaitN(p->eng, 2, 3000));
    ev.Poll(p->eng);
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-fin"));
    EXPECT_EQ(1u, ev.Count(KVX_EVENT_FINISHED_SENDING, "tx-fin-marker"));
    EXPECT_EQ(2u, ev.v.size());
}

// ========================================================================
// 6. Block ids past num_blocks are rejected before anything is posted.
// ========================================================================

TEST(ReadFailure, OutOfBoundsBlockIdsFailBeforeAnyGetAndStillRelease)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    struct Case {
        const char           *tid;
        std::vector<uint64_t> local, remote_params, p_holds;
        std::string           bad_id;
    };
    const Case cases[] = {
        // local id 24 >= D's 24 blocks (the first case also handshakes).
        {"tx-oob-local", {0, 24}, {1, 2}, {1, 2}, "24"},
        // remote id 40 >= P's 32 blocks, named in D's params only.
        {"tx-oob-remote", {3, 4}, {5, 40}, {5, 6}, "40"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.tid);
        ASSERT_EQ(KVX_OK, Hold(*pr.p, c.tid, c.p_holds))
            << Api()->last_error();
        std::string params = PairParams(pr, c.tid, c.remote_params);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-oob",
                                                  params.c_str(),
                                                  c.local.data(),
                                                  c.local.size()))
            << Api()->last_error();
        kvx_status_t st = Api()->wait_transfer(pr.d->eng, c.tid, 10000);
        std::string  le = Api()->last_error();
        EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS, st)
            << Api()->status_name(st) << ": " << le;
        EXPECT_TRUE(Contains(le, c.bad_id)) << le;

        Events dev;
        ASSERT_TRUE(dev.WaitN(pr.d->eng, 1, 3000));
        ASSERT_EQ(1u, dev.v.size());
        EXPECT_EQ(KVX_EVENT_FAILED, dev.v[0].type);
        EXPECT_EQ(KVX_ERR_OUT_OF_BOUNDS, dev.v[0].status);
        EXPECT_TRUE(Contains(dev.v[0].reason, c.bad_id)) << dev.v[0].reason;
        EXPECT_EQ(c.local, Ids(dev.v[0]));
        EXPECT_TRUE(AllEE(*pr.d)) << "D memory was written";

        // D releases P even though it read nothing.
        Events pev;
        ASSERT_TRUE(pev.WaitN(pr.p->eng, 1, 5000)) << "P never released";
        EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, c.tid));
    }
    // The engine keeps serving: a valid transfer afterwards works.
    Pull(pr, "tx-oob-after", {0, 1}, {30, 31});
}

// ========================================================================
// 7. Peer address derived from the request_id.
// ========================================================================

TEST(ReadAddress, RequestIdDerivedAddressTransfers)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    const std::string rid = ReqId("127.0.0.1", pr.hs,
                                  (uint16_t)(pr.hs + 20000), "127.0.0.1",
                                  (uint16_t)(pr.hs + 1),
                                  (uint16_t)(pr.hs + 20001));
    const std::vector<uint64_t> remote = {6, 7, 8, 20};
    const std::vector<uint64_t> local  = {2, 3, 11, 23};
    ASSERT_EQ(KVX_OK, Hold(*pr.p, "tx-rid", remote, rid))
        << Api()->last_error();
    std::string params = Params("tx-rid", "", 0, 0, remote, 1);
    ASSERT_EQ(std::string::npos, params.find("remote_host"));
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, rid.c_str(),
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, "tx-rid", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, local, remote));
    Events dev, pev;
    ASSERT_TRUE(dev.WaitN(pr.d->eng, 1, 3000));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, "tx-rid"));
    EXPECT_EQ(rid, dev.v[0].request_id);
    ASSERT_TRUE(pev.WaitN(pr.p->eng, 1, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-rid"));
}

TEST(ReadAddress, MalformedRequestIdWithoutExplicitAddressIsRejected)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> ids = {1, 2};
    const std::string bad[] = {
        "chatcmpl-plain-request-0123456789abcdef0123456789abcdef",
        "chatcmpl-___prefill_addr_host:127.0.0.1,handshake:abc,notify:1"
        "___decode_addr_host:127.0.0.1,handshake:2000,notify:2001"
        "_0123456789abcdef0123456789abcdef",
        "chatcmpl-___prefill_addr_host:127.0.0.1,notify:30000"
        "___decode_addr_host:127.0.0.1,handshake:2000,notify:2001"
        "_0123456789abcdef0123456789abcdef",
    };
    for (const std::string &rid : bad) {
        SCOPED_TRACE(rid);
        std::string  params = Params("tx-badrid", "", 0, 0, ids, 1);
        kvx_status_t st = Api()->consumer_request(pr.d->eng, rid.c_str(),
                                                  params.c_str(), ids.data(),
                                                  ids.size());
        std::string  le = Api()->last_error();
        EXPECT_EQ(KVX_ERR_INVALID_PARAM, st)
            << Api()->status_name(st) << ": " << le;
        EXPECT_TRUE(Contains(le, "request_id")) << le;
    }
    // Nothing was started, so nothing is reported.
    Events ev;
    EXPECT_EQ(0u, ev.Poll(pr.d->eng));
    // The rejected id never became a transfer.
    EXPECT_EQ(KVX_ERR_NOT_FOUND,
              Api()->wait_transfer(pr.d->eng, "tx-badrid", 100));
}

// ========================================================================
// 8. Trust: nothing is sent to a rejected peer.
// ========================================================================

TEST(ReadTrust, UntrustedHostIsRejectedSynchronouslyAndNeverDialed)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(2);
    uint16_t    target_hs = base, target_notify = (uint16_t)(base + 20000);
    TcpListener hs_l(target_hs), notify_l(target_notify);
    ASSERT_TRUE(hs_l.ok() && notify_l.ok()) << "cannot bind test listeners";

    RankOpts o = Opts(false, (uint16_t)(base + 1), 24);
    o.extra    = "\"trusted_remote_hosts\":[\"127.0.0.2\"]";
    std::string err;
    auto        d = Start(model, o, &err);
    ASSERT_TRUE(d) << err;

    const std::vector<uint64_t> ids = {1, 2};
    // Explicit remote_host.
    std::string  params = Params("tx-untrusted", "127.0.0.1", target_hs,
                                 target_notify, ids, 1);
    kvx_status_t st = Api()->consumer_request(d->eng, "req-u", params.c_str(),
                                              ids.data(), ids.size());
    std::string  le = Api()->last_error();
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, st) << Api()->status_name(st) << ": "
                                          << le;
    EXPECT_TRUE(Contains(le, "127.0.0.1")) << le;
    EXPECT_TRUE(Contains(le, "remote_host")) << le;
    EXPECT_TRUE(Contains(le, "trusted_remote_hosts")) << le;

    // Trusted remote_host, but this rank (P DP rank 0 of a DP2 instance
    // over two hosts) resolves to an untrusted remote_hosts entry.
    params = Params("tx-untrusted2", "127.0.0.2", target_hs, target_notify,
                    ids, 1,
                    ",\"remote_hosts\":[\"127.0.0.1\",\"127.0.0.2\"],"
                    "\"remote_dp_size\":2,\"remote_dp_rank\":0");
    st = Api()->consumer_request(d->eng, "req-u", params.c_str(), ids.data(),
                                 ids.size());
    le = Api()->last_error();
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, st) << Api()->status_name(st) << ": "
                                          << le;
    EXPECT_TRUE(Contains(le, "127.0.0.1")) << le;
    EXPECT_TRUE(Contains(le, "remote_hosts")) << le;

    // Address from the request_id.
    std::string rid = ReqId("127.0.0.1", target_hs, target_notify,
                            "127.0.0.1", (uint16_t)(base + 1),
                            (uint16_t)(base + 20001));
    params = Params("tx-untrusted3", "", 0, 0, ids, 1);
    st = Api()->consumer_request(d->eng, rid.c_str(), params.c_str(),
                                 ids.data(), ids.size());
    le = Api()->last_error();
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, st) << Api()->status_name(st) << ": "
                                          << le;
    EXPECT_TRUE(Contains(le, "127.0.0.1")) << le;
    EXPECT_TRUE(Contains(le, "request_id")) << le;

    // Nothing dialled the rejected address, nothing was reported.
    EXPECT_FALSE(hs_l.Accepted(500)) << "a rejected peer was dialled";
    EXPECT_FALSE(notify_l.Accepted(0)) << "a rejected peer was notified";
    Events ev;
    EXPECT_EQ(0u, ev.Poll(d->eng));
    char *json = nullptr;
    ASSERT_EQ(KVX_OK, Api()->transports(d->eng, &json));
    EXPECT_EQ("[]", std::string(json)) << "a peer was created: " << json;
    Api()->free(json);

    // Positive control: the listener does see a real connection.
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(c, 0);
    sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family      = AF_INET;
    a.sin_port        = htons(target_hs);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(0, connect(c, (sockaddr *)&a, sizeof(a)));
    EXPECT_TRUE(hs_l.Accepted(2000));
    close(c);
}

TEST(ReadTrust, WildcardHostAndPrivilegedPortRejectedWithoutTrustList)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    const std::vector<uint64_t> ids = {1, 2};
    struct Case {
        const char *what;
        std::string params;
        std::vector<std::string> needles;
    };
    const Case cases[] = {
        {"wildcard host",
         Params("tx-w", "0.0.0.0", pr.hs, (uint16_t)(pr.hs + 20000), ids, 1),
         {"0.0.0.0", "remote_host", "wildcard"}},
        {"ipv6 wildcard host",
         Params("tx-w6", "::", pr.hs, (uint16_t)(pr.hs + 20000), ids, 1),
         {"remote_host", "wildcard"}},
        {"broadcast host",
         Params("tx-b", "255.255.255.255", pr.hs, (uint16_t)(pr.hs + 20000),
                ids, 1),
         {"255.255.255.255", "remote_host"}},
        {"handshake port 80",
         Params("tx-p80", "127.0.0.1", 80, (uint16_t)(pr.hs + 20000), ids, 1),
         {"80", "remote_handshake_port", "1024..65535"}},
        {"notify port 80",
         Params("tx-n80", "127.0.0.1", pr.hs, 80, ids, 1),
         {"80", "remote_notify_port", "1024..65535"}},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        kvx_status_t st = Api()->consumer_request(pr.d->eng, "req-w",
                                                  c.params.c_str(),
                                                  ids.data(), ids.size());
        std::string  le = Api()->last_error();
        EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, st)
            << Api()->status_name(st) << ": " << le;
        for (const std::string &n : c.needles) {
            EXPECT_TRUE(Contains(le, n)) << "'" << n << "' not in: " << le;
        }
    }
    // Wildcard in the request_id.
    std::string rid = ReqId("0.0.0.0", pr.hs, (uint16_t)(pr.hs + 20000),
                            "127.0.0.1", (uint16_t)(pr.hs + 1),
                            (uint16_t)(pr.hs + 20001));
    std::string params = Params("tx-wrid", "", 0, 0, ids, 1);
    kvx_status_t st = Api()->consumer_request(pr.d->eng, rid.c_str(),
                                              params.c_str(), ids.data(),
                                              ids.size());
    std::string le = Api()->last_error();
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER, st) << Api()->status_name(st) << ": "
                                          << le;
    EXPECT_TRUE(Contains(le, "request_id")) << le;

    Events ev;
    EXPECT_EQ(0u, ev.Poll(pr.d->eng));
    // The engine keeps serving other requests.
    Pull(pr, "tx-after-reject", {4, 5}, {9, 10});
}

// ========================================================================
// 9. IPv6 loopback.
// ========================================================================

TEST(ReadAddress, Ipv6LoopbackTransfers)
{
    if (!CanBindIpv6Loopback()) {
        GTEST_SKIP() << "cannot bind ::1 on this machine";
    }
    Pair pr;
    pr.hs       = PortBase(2);
    pr.po       = Opts(true, pr.hs, 32);
    pr.dopt     = Opts(false, (uint16_t)(pr.hs + 1), 24);
    pr.po.host  = "::1";
    pr.dopt.host = "::1";
    std::string err;
    pr.p = Start(pr.model, pr.po, &err);
    ASSERT_TRUE(pr.p) << "P on ::1: " << err;
    pr.d = Start(pr.model, pr.dopt, &err);
    ASSERT_TRUE(pr.d) << "D on ::1: " << err;

    const std::string rid = ReqId("::1", pr.hs, (uint16_t)(pr.hs + 20000),
                                  "::1", (uint16_t)(pr.hs + 1),
                                  (uint16_t)(pr.hs + 20001));
    ASSERT_TRUE(Contains(rid, "host:::1,"));
    const std::vector<uint64_t> remote = {0, 31, 15};
    const std::vector<uint64_t> local  = {23, 0, 12};
    ASSERT_EQ(KVX_OK, Hold(*pr.p, "tx-v6", remote, rid))
        << Api()->last_error();
    std::string params = Params("tx-v6", "", 0, 0, remote, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, rid.c_str(),
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, "tx-v6", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, local, remote));
    Events pev;
    ASSERT_TRUE(pev.WaitN(pr.p->eng, 1, 10000)) << "release over ::1 lost";
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-v6"));

    // An explicit IPv6 remote_host works the same way.
    const std::vector<uint64_t> remote2 = {1, 2};
    const std::vector<uint64_t> local2  = {5, 6};
    ASSERT_EQ(KVX_OK, Hold(*pr.p, "tx-v6b", remote2)) << Api()->last_error();
    params = Params("tx-v6b", "::1", pr.hs, (uint16_t)(pr.hs + 20000),
                    remote2, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-v6b",
                                              params.c_str(), local2.data(),
                                              local2.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, "tx-v6b", 20000))
        << Api()->last_error();
    std::vector<uint64_t> all_l = local, all_r = remote;
    all_l.insert(all_l.end(), local2.begin(), local2.end());
    all_r.insert(all_r.end(), remote2.begin(), remote2.end());
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, all_l, all_r));
    ASSERT_TRUE(pev.WaitN(pr.p->eng, 2, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-v6b"));
}

// ========================================================================
// 10. defer_timeout on P.
// ========================================================================

TEST(ReadFailure, DeferTimeoutFailsHeldTransferWithBlocks)
{
    ModelSpec model = ThreeLayerModel();
    uint16_t  hs    = PortBase(1);
    RankOpts  o     = Opts(true, hs, 32);
    o.defer_timeout = 0.3;
    std::string err;
    auto        p = Start(model, o, &err);
    ASSERT_TRUE(p) << err;
    const std::vector<uint64_t> ids = {12, 3, 30};
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-defer", ids)) << Api()->last_error();
    Events ev;
    ASSERT_TRUE(ev.WaitN(p->eng, 1, 3000)) << "no event within 3 s";
    double dt = SecondsSince(t0);
    EXPECT_GE(dt, 0.25);
    EXPECT_LT(dt, 3.0);
    ASSERT_EQ(1u, ev.v.size());
    EXPECT_EQ(KVX_EVENT_FAILED, ev.v[0].type);
    EXPECT_EQ(KVX_ERR_TIMEOUT, ev.v[0].status);
    EXPECT_STREQ("tx-defer", ev.v[0].transfer_id);
    EXPECT_TRUE(Contains(ev.v[0].reason, "defer_timeout")) << ev.v[0].reason;
    EXPECT_EQ(ids, Ids(ev.v[0]));

    // A late release is answered ok and produces no second event.
    CtlClient cli("127.0.0.1", NotifyPortOf(o));
    EXPECT_REPLY_OK(cli.Send(ReleaseJson("tx-defer", 1, 0)));
    EXPECT_EQ(1u, ev.Poll(p->eng));
}

// ========================================================================
// 11. Peer death after a completed handshake.
// ========================================================================

TEST(ReadFailure, DeadPeerFailsPromptlyAndEngineKeepsServing)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(3);
    const double hs_to = 1.0, xfer_to = 3.0;
    RankOpts    o1 = Opts(true, base, 32);
    RankOpts    o2 = Opts(true, (uint16_t)(base + 1), 32);
    RankOpts    od = Opts(false, (uint16_t)(base + 2), 24);
    od.handshake_timeout = hs_to;
    od.transfer_timeout  = xfer_to;
    std::string err;
    auto        p1 = Start(model, o1, &err);
    ASSERT_TRUE(p1) << err;
    auto p2 = Start(model, o2, &err);
    ASSERT_TRUE(p2) << err;
    auto d = Start(model, od, &err);
    ASSERT_TRUE(d) << err;

    auto run = [&](const Rank &p, uint16_t hs, const std::string &tid,
                   const std::vector<uint64_t> &local,
                   const std::vector<uint64_t> &remote) {
        std::string params = Params(tid, "127.0.0.1", hs,
                                    (uint16_t)(hs + 20000), remote, 1);
        if (Hold(p, tid, remote) != KVX_OK) {
            return std::string("hold: ") + Api()->last_error();
        }
        kvx_status_t st = Api()->consumer_request(d->eng, "req-death",
                                                  params.c_str(), local.data(),
                                                  local.size());
        return st == KVX_OK ? std::string()
                            : std::string("consumer_request: ") +
                                  Api()->last_error();
    };

    // A healthy transfer from P1: the handshake completes.
    ASSERT_EQ("", run(*p1, o1.hs_port, "tx-alive", {0, 1}, {2, 3}));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d->eng, "tx-alive", 20000))
        << Api()->last_error();
    Events dev;
    ASSERT_TRUE(dev.WaitN(d->eng, 1, 3000));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, "tx-alive"));
    {
        Events pev;
        ASSERT_TRUE(pev.WaitN(p1->eng, 1, 10000));
    }
    char *json = nullptr;
    ASSERT_EQ(KVX_OK, Api()->transports(d->eng, &json));
    EXPECT_TRUE(Contains(json, "\"state\":\"ready\"")) << json;
    Api()->free(json);

    // P1 dies.
    p1.reset();

    const std::vector<uint64_t> local = {10, 11, 12};
    std::string params = Params("tx-to-dead", "127.0.0.1", o1.hs_port,
                                (uint16_t)(o1.hs_port + 20000), {2, 3, 4}, 1);
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-death",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    kvx_status_t st = Api()->wait_transfer(d->eng, "tx-to-dead", 20000);
    double       dt = SecondsSince(t0);
    std::string  le = Api()->last_error();
    EXPECT_NE(KVX_OK, st);
    EXPECT_NE(KVX_ERR_TIMEOUT, st) << "wait ran out before the transfer failed: "
                                   << le;
    EXPECT_TRUE(KVX_IS_PEER_ERROR(st) || KVX_IS_TRANSFER_ERROR(st))
        << Api()->status_name(st) << ": " << le;
    EXPECT_LT(dt, hs_to + xfer_to + 1.0) << le;
    ASSERT_TRUE(dev.WaitN(d->eng, 2, 3000));
    const kvx_event_t &e = dev.v[1];
    EXPECT_EQ(KVX_EVENT_FAILED, e.type);
    EXPECT_STREQ("tx-to-dead", e.transfer_id);
    EXPECT_EQ(st, e.status);
    EXPECT_NE(std::string(), e.reason);
    EXPECT_EQ(local, Ids(e));

    // The D engine keeps serving: a transfer from the healthy P2 works.
    ASSERT_EQ("", run(*p2, o2.hs_port, "tx-p2", {20, 21}, {7, 8}));
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d->eng, "tx-p2", 20000))
        << Api()->last_error();
    // P1 and P2 have the same pattern (rank 0): D holds tx-alive and tx-p2;
    // tx-to-dead may have left partial data only in its own local blocks.
    std::vector<uint64_t> all_l = {0, 1, 20, 21}, all_r = {2, 3, 7, 8};
    std::string           diff;
    {
        // Ignore the failed transfer's blocks by copying D's buffers with
        // those blocks reset to 0xEE.
        Rank view;
        view.num_blocks = d->num_blocks;
        view.bufs       = d->bufs;
        for (size_t li = 0; li < model.layers.size(); li++) {
            const LayerSpec &l = model.layers[li];
            for (uint64_t b : local) {
                for (int u = 0; u < Units(l); u++) {
                    memset(view.bufs[li].data() +
                               UnitOffset(model, l, view.num_blocks, b, u),
                           0xEE, UnitLen(model, l));
                }
            }
        }
        diff = VerifyPull(model, view, 0, all_l, all_r);
    }
    EXPECT_EQ("", diff);
    ASSERT_TRUE(dev.WaitN(d->eng, 3, 3000));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, "tx-p2"));
    Events pev2;
    ASSERT_TRUE(pev2.WaitN(p2->eng, 1, 10000));
    EXPECT_EQ(1u, pev2.Count(KVX_EVENT_FINISHED_SENDING, "tx-p2"));
}

// A peer that went away is collected: once its control connection stayed
// lost past the grace and nothing is queued to it for KVC_PEER_IDLE_S, its
// control clients are closed (no thread redials a dead address forever);
// a new instance on the same address then serves a new transfer.
TEST(ReadFailure, GonePeerIsCollectedAndANewInstanceOnItsAddressServes)
{
    ModelSpec model = ThreeLayerModel();
    uint16_t  base  = PortBase(3);
    RankOpts  op    = Opts(true, base, 32);
    RankOpts  od    = Opts(false, (uint16_t)(base + 2), 24);
    od.handshake_timeout = 1.0;
    od.transfer_timeout  = 3.0;
    std::string err;
    auto        p = Start(model, op, &err);
    ASSERT_TRUE(p) << err;
    auto d = Start(model, od, &err);
    ASSERT_TRUE(d) << err;

    auto run = [&](const Rank &pr, const std::string &tid,
                   const std::vector<uint64_t> &local,
                   const std::vector<uint64_t> &remote) {
        std::string params = Params(tid, "127.0.0.1", op.hs_port,
                                    (uint16_t)(op.hs_port + 20000), remote, 1);
        if (Hold(pr, tid, remote) != KVX_OK) {
            return std::string("hold: ") + Api()->last_error();
        }
        kvx_status_t st = Api()->consumer_request(d->eng, ("r-" + tid).c_str(),
                                                  params.c_str(), local.data(),
                                                  local.size());
        if (st != KVX_OK) {
            return std::string("consumer_request: ") + Api()->last_error();
        }
        st = Api()->wait_transfer(d->eng, tid.c_str(), 20000);
        return st == KVX_OK ? std::string()
                            : std::string("wait_transfer: ") +
                                  Api()->last_error();
    };

    ASSERT_EQ("", run(*p, "tx-first", {0, 1}, {2, 3}));
    EXPECT_EQ(0, StatCount(d->eng, "peers_collected"));
    p.reset(); // P goes away; D has nothing more to send it
    auto t0 = Clock::now();

    // Grace (1 s) + idle (5 s), with a margin for a loaded machine.
    EXPECT_TRUE(WaitFor([&] { return StatCount(d->eng, "peers_collected") == 1; },
                        15000))
        << "peers_collected " << StatCount(d->eng, "peers_collected");
    // Not before the idle time (counted from the connection loss, which
    // happens inside p.reset()).
    EXPECT_GE(SecondsSince(t0), 4.5);

    auto p2 = Start(model, op, &err); // a new instance, same ports
    ASSERT_TRUE(p2) << err;
    ASSERT_EQ("", run(*p2, "tx-second", {4, 5}, {6, 7}));
    EXPECT_EQ("", VerifyPull(model, *d, 0, {0, 1, 4, 5}, {2, 3, 6, 7}));
}

// ========================================================================
// 12. Many transfers in flight between one D and one P.
// ========================================================================

TEST(ReadConcurrency, EightTransfersInFlightAllVerified)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    const int                          n = 8;
    std::vector<std::vector<uint64_t>> local(n), remote(n);
    std::vector<std::string>           tids;
    for (int i = 0; i < n; i++) {
        remote[i] = {(uint64_t)i, (uint64_t)(8 + i), (uint64_t)(31 - i)};
        local[i]  = {(uint64_t)(3 * i + 2), (uint64_t)(3 * i),
                    (uint64_t)(3 * i + 1)};
        tids.push_back("tx-conc-" + std::to_string(i));
        ASSERT_EQ(KVX_OK, Hold(*pr.p, tids[i], remote[i]))
            << Api()->last_error();
    }
    for (int i = 0; i < n; i++) {
        std::string params = PairParams(pr, tids[i], remote[i]);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-conc",
                                                  params.c_str(),
                                                  local[i].data(),
                                                  local[i].size()))
            << tids[i] << ": " << Api()->last_error();
    }
    for (int i = 0; i < n; i++) {
        for (uint32_t l = 0; l < 3; l++) {
            EXPECT_EQ(KVX_OK, Api()->wait_layer(pr.d->eng, tids[i].c_str(), l,
                                                20000))
                << tids[i] << " layer " << l << ": " << Api()->last_error();
        }
        EXPECT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, tids[i].c_str(),
                                               20000))
            << tids[i] << ": " << Api()->last_error();
    }
    std::vector<uint64_t> all_l, all_r;
    for (int i = 0; i < n; i++) {
        all_l.insert(all_l.end(), local[i].begin(), local[i].end());
        all_r.insert(all_r.end(), remote[i].begin(), remote[i].end());
    }
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, all_l, all_r));
    Events dev, pev;
    ASSERT_TRUE(dev.WaitN(pr.d->eng, n, 5000));
    ASSERT_TRUE(pev.WaitN(pr.p->eng, n, 10000));
    for (int i = 0; i < n; i++) {
        EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, tids[i])) << tids[i];
        EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, tids[i]))
            << tids[i];
    }
    EXPECT_EQ((size_t)n, dev.v.size());
    EXPECT_EQ((size_t)n, pev.v.size());
}

// ========================================================================
// 13. A dead peer does not delay a healthy one.
// ========================================================================

TEST(ReadConcurrency, DeadPeerDoesNotDelayHealthyPeer)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(3);
    uint16_t    dead  = base; // nothing listens here
    RankOpts    op    = Opts(true, (uint16_t)(base + 1), 32);
    RankOpts    od    = Opts(false, (uint16_t)(base + 2), 24);
    od.handshake_timeout = 2.0;
    std::string err;
    auto        p = Start(model, op, &err);
    ASSERT_TRUE(p) << err;
    auto d = Start(model, od, &err);
    ASSERT_TRUE(d) << err;

    const std::vector<uint64_t> dl = {0, 1}, dr = {4, 5};
    const std::vector<uint64_t> hl = {10, 11, 12}, hr = {20, 21, 22};
    std::string dparams = Params("tx-dead", "127.0.0.1", dead,
                                 (uint16_t)(dead + 20000), dr, 1);
    std::string hparams = Params("tx-healthy", "127.0.0.1", op.hs_port,
                                 (uint16_t)(op.hs_port + 20000), hr, 1);
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-healthy", hr)) << Api()->last_error();

    auto t_dead = Clock::now();
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-dead",
                                              dparams.c_str(), dl.data(),
                                              dl.size()))
        << Api()->last_error();
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-healthy",
                                              hparams.c_str(), hl.data(),
                                              hl.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d->eng, "tx-healthy", 10000))
        << Api()->last_error();
    double dt = SecondsSince(t0);
    EXPECT_LT(dt, 1.5) << "the healthy transfer waited for the dead peer";
    EXPECT_EQ("", VerifyPull(model, *d, 0, hl, hr));

    kvx_status_t st = Api()->wait_transfer(d->eng, "tx-dead", 10000);
    EXPECT_EQ(KVX_ERR_HANDSHAKE_TIMEOUT, st) << Api()->last_error();
    double dd = SecondsSince(t_dead);
    EXPECT_GE(dd, 1.8);
    EXPECT_LT(dd, 5.0);

    Events dev, pev;
    ASSERT_TRUE(dev.WaitN(d->eng, 2, 3000));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FINISHED_RECVING, "tx-healthy"));
    EXPECT_EQ(1u, dev.Count(KVX_EVENT_FAILED, "tx-dead"));
    ASSERT_TRUE(pev.WaitN(p->eng, 1, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-healthy"));
}

} // namespace

// ========================================================================
// 14. Control client: several requests in flight per peer (kvn contexts).
// ========================================================================

namespace {

// A REP handler that holds a request until a condition holds (with a
// deadline): "A" waits for "B" to arrive; "hold" waits for release().
struct Gate {
    std::mutex              m;
    std::condition_variable cv;
    bool                    b_seen = false, a_saw_b = false, open = false;
    int                     handled = 0;

    void release()
    {
        std::lock_guard<std::mutex> lk(m);
        open = true;
        cv.notify_all();
    }
};

void GateHandler(void *arg, const char *, const char *msg, size_t len, char **reply,
                 size_t *rlen)
{
    Gate                        *g = static_cast<Gate *>(arg);
    std::string                  s(msg, len);
    std::unique_lock<std::mutex> lk(g->m);

    if (s == "B") {
        g->b_seen = true;
        g->cv.notify_all();
    } else if (s == "A") {
        g->a_saw_b = g->cv.wait_for(lk, std::chrono::seconds(3),
                                    [&] { return g->b_seen; });
    } else if (s == "hold") {
        g->cv.wait_for(lk, std::chrono::seconds(3), [&] { return g->open; });
    }
    g->handled++;
    *reply = strdup(("re:" + s).c_str());
    *rlen  = strlen(*reply);
}

// Completions of kvn_client_post, collected for the test thread.
struct Replies {
    struct One {
        std::string  tag;
        kvx_status_t st;
        std::string  body;
    };
    std::mutex              m;
    std::condition_variable cv;
    std::vector<One>        v;

    bool WaitN(size_t n, int ms)
    {
        std::unique_lock<std::mutex> lk(m);
        return cv.wait_for(lk, std::chrono::milliseconds(ms),
                           [&] { return v.size() >= n; });
    }
};

struct Tag {
    Replies    *r;
    std::string tag;
};

void ReplyCb(void *arg, kvx_status_t st, const char *reply, size_t len,
             const char *err)
{
    std::unique_ptr<Tag>        t(static_cast<Tag *>(arg));
    std::lock_guard<std::mutex> lk(t->r->m);
    t->r->v.push_back({t->tag, st,
                       reply != nullptr ? std::string(reply, len)
                                        : std::string(err ? err : "")});
    t->r->cv.notify_all();
}

kvx_status_t Post(kvn_client_t *cli, Replies *r, const std::string &msg,
                  int timeout_ms)
{
    Tag         *t  = new Tag{r, msg};
    kvx_status_t st = kvn_client_post(cli, msg.data(), msg.size(), timeout_ms,
                                      ReplyCb, t);
    if (st != KVX_OK) {
        delete t;
    }
    return st;
}

struct GateServer {
    Gate          gate;
    kvn_server_t *srv  = nullptr;
    uint16_t      port = 0;

    GateServer()
    {
        port = PortBase(1);
        EXPECT_EQ(KVX_OK, kvn_server_create("127.0.0.1", port, 4, 1 << 20,
                                            GateHandler, &gate, &srv))
            << kvc_last_error();
    }
    ~GateServer()
    {
        gate.release();
        kvn_server_destroy(srv);
    }
};

} // namespace

// With one request at a time, "A" would hold its context until its 3 s
// deadline because "B" is only sent after A's reply.
TEST(CtlClient, SecondRequestIsSentWhileTheFirstAwaitsItsReply)
{
    GateServer    gs;
    kvn_client_t *cli = nullptr;
    Replies       r;
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", gs.port, 8, &cli));
    ASSERT_EQ(KVX_OK, Post(cli, &r, "A", 5000));
    ASSERT_EQ(KVX_OK, Post(cli, &r, "B", 5000));
    ASSERT_TRUE(r.WaitN(2, 10000));
    for (const auto &o : r.v) {
        EXPECT_EQ(KVX_OK, o.st) << o.tag << ": " << o.body;
        EXPECT_EQ("re:" + o.tag, o.body);
    }
    {
        std::lock_guard<std::mutex> lk(gs.gate.m);
        EXPECT_TRUE(gs.gate.a_saw_b) << "B was not in flight while A waited";
    }
    EXPECT_EQ(8, kvn_client_idle_contexts(cli));
    kvn_client_close(cli);
}

TEST(CtlClient, AllContextsBusyIsRefusedWithoutSending)
{
    GateServer    gs;
    kvn_client_t *cli = nullptr;
    Replies       r;
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", gs.port, 1, &cli));
    ASSERT_EQ(KVX_OK, Post(cli, &r, "hold", 5000));
    EXPECT_EQ(0, kvn_client_idle_contexts(cli));
    EXPECT_EQ(KVX_ERR_BAD_STATE, Post(cli, &r, "B", 5000));
    EXPECT_NE(nullptr, strstr(kvc_last_error(), "busy")) << kvc_last_error();
    gs.gate.release();
    ASSERT_TRUE(r.WaitN(1, 10000));
    EXPECT_EQ(KVX_OK, r.v[0].st) << r.v[0].body;
    kvn_client_close(cli);
    std::lock_guard<std::mutex> lk(gs.gate.m);
    EXPECT_FALSE(gs.gate.b_seen);
}

TEST(CtlClient, DeadlineExpiresWithTimeoutStatus)
{
    GateServer    gs;
    kvn_client_t *cli = nullptr;
    Replies       r;
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", gs.port, 2, &cli));
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Post(cli, &r, "hold", 200));
    ASSERT_TRUE(r.WaitN(1, 5000));
    EXPECT_EQ(KVX_ERR_TIMEOUT, r.v[0].st) << r.v[0].body;
    EXPECT_LT(SecondsSince(t0), 2.0);
    EXPECT_NE(std::string::npos, r.v[0].body.find("no reply")) << r.v[0].body;
    kvn_client_close(cli);
}

namespace {

// Connection events of kvn_client_watch, in order.
struct Watch {
    std::mutex              m;
    std::condition_variable cv;
    std::vector<int>        ev;

    std::vector<int> Seen()
    {
        std::lock_guard<std::mutex> lk(m);
        return ev;
    }
    bool WaitN(size_t n, int ms)
    {
        std::unique_lock<std::mutex> lk(m);
        return cv.wait_for(lk, std::chrono::milliseconds(ms),
                           [&] { return ev.size() >= n; });
    }
};

void WatchCb(void *arg, int up)
{
    Watch                      *w = static_cast<Watch *>(arg);
    std::lock_guard<std::mutex> lk(w->m);
    w->ev.push_back(up);
    w->cv.notify_all();
}

// AnsweredWithin: one request at a time until one is answered (a request
// may go to a connection that is closing), at most ms in all.
bool AnsweredWithin(kvn_client_t *cli, const std::string &msg, int ms)
{
    auto t0 = Clock::now();
    while (SecondsSince(t0) * 1e3 < ms) {
        auto r = std::make_unique<Replies>();
        if (Post(cli, r.get(), msg, 500) != KVX_OK) {
            continue;
        }
        // The 500 ms deadline completes the request; should its callback
        // still not have run, r is left to it (never freed under it).
        if (!r->WaitN(1, 10000)) {
            r.release();
            return false;
        }
        if (r->v[0].st == KVX_OK) {
            return true;
        }
    }
    return false;
}

// Closes what a test opened, whichever assertion ends it.
struct CtlCleanup {
    std::vector<kvn_client_t *> cli;
    kvn_server_t              **srv = nullptr;

    ~CtlCleanup()
    {
        for (kvn_client_t *c : cli) {
            kvn_client_close(c);
        }
        if (srv != nullptr && *srv != nullptr) {
            kvn_server_destroy(*srv);
        }
    }
};

} // namespace

// The engine watches a peer's control connection to notice a restart: a
// reconnect makes it ask the peer for its instance (heartbeat). The dial
// is non-blocking, so the connection can come up before the watch is
// registered; the watch must still learn of it, or the reconnect to a
// restarted peer looks like a first connection and nothing asks (a WRITE
// D then waited for its deadline, fault campaign restart_p).
TEST(CtlClient, WatchLearnsOfConnectionsThatCameUpBeforeIt)
{
    Gate          gate;
    kvn_server_t *srv  = nullptr;
    uint16_t      port = PortBase(1);
    kvn_client_t *twice = nullptr, *fresh = nullptr;
    Watch         w_twice, w_fresh; // outlive the clients (cleanup below)
    CtlCleanup    cleanup;

    cleanup.srv = &srv;
    ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", port, 4, 1 << 20,
                                        GateHandler, &gate, &srv))
        << kvc_last_error();
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", port, 2, &twice));
    cleanup.cli.push_back(twice);
    ASSERT_TRUE(AnsweredWithin(twice, "x", 10000));

    // The server restarts on its port: `twice` reconnects before it is
    // watched.
    kvn_server_destroy(srv);
    srv = nullptr;
    ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", port, 4, 1 << 20,
                                        GateHandler, &gate, &srv))
        << kvc_last_error();
    ASSERT_TRUE(AnsweredWithin(twice, "y", 10000));

    // A reply can overtake nng's ADD_POST callback of its connection, so
    // the last event may come live, after the replay: the sequence is the
    // same either way.
    kvn_client_watch(twice, WatchCb, &w_twice);
    EXPECT_TRUE(w_twice.WaitN(3, 5000));
    EXPECT_EQ((std::vector<int>{1, 0, 1}), w_twice.Seen())
        << "a connection, lost, and up again before the watch";

    // A client connected once and watched afterwards: up, nothing else.
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", port, 2, &fresh));
    cleanup.cli.push_back(fresh);
    ASSERT_TRUE(AnsweredWithin(fresh, "z", 10000));
    kvn_client_watch(fresh, WatchCb, &w_fresh);
    EXPECT_TRUE(w_fresh.WaitN(1, 5000));
    EXPECT_EQ((std::vector<int>{1}), w_fresh.Seen());

    // Events after the watch still arrive: the server goes away.
    kvn_server_destroy(srv);
    srv = nullptr;
    EXPECT_TRUE(w_fresh.WaitN(2, 10000));
    EXPECT_EQ((std::vector<int>{1, 0}), w_fresh.Seen());
    EXPECT_TRUE(w_twice.WaitN(4, 10000));
    EXPECT_EQ((std::vector<int>{1, 0, 1, 0}), w_twice.Seen());
}

TEST(CtlClient, CloseCompletesPendingRequestsOnceAsCanceled)
{
    // A plain TCP listener that never speaks SP: the requests stay pending
    // in the client (no nng server whose teardown could race the test).
    uint16_t    port = PortBase(1);
    TcpListener l(port);
    ASSERT_TRUE(l.ok());
    kvn_client_t *cli = nullptr;
    Replies       r;
    ASSERT_EQ(KVX_OK, kvn_client_open_async("127.0.0.1", port, 4, &cli));
    ASSERT_EQ(KVX_OK, Post(cli, &r, "hold", 5000));
    ASSERT_EQ(KVX_OK, Post(cli, &r, "hold", 5000));
    EXPECT_TRUE(l.Accepted(5000)); // the client did dial
    kvn_client_close(cli);         // callbacks done before it returns
    std::lock_guard<std::mutex> lk(r.m);
    ASSERT_EQ(2u, r.v.size());
    for (const auto &o : r.v) {
        EXPECT_EQ(KVX_ERR_CANCELED, o.st) << o.body;
    }
}

// The engine reports the round trip of the releases it sent over the
// control plane (release_on_data_plane off) and the parts of its last
// handshake.
TEST(CtlClient, EngineReportsReleaseRoundTripsAndHandshakeParts)
{
    Pair pr;
    MakePair(&pr, "\"release_on_data_plane\":false");
    if (HasFatalFailure()) {
        return;
    }
    const int n = 4;
    for (int i = 0; i < n; i++) {
        std::vector<uint64_t> remote = {(uint64_t)i}, local = {(uint64_t)i};
        std::string           tid    = "tx-rtt-" + std::to_string(i);
        ASSERT_EQ(KVX_OK, Hold(*pr.p, tid, remote)) << Api()->last_error();
        std::string params = PairParams(pr, tid, remote);
        ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-rtt",
                                                  params.c_str(), local.data(),
                                                  local.size()))
            << Api()->last_error();
        ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, tid.c_str(), 20000))
            << Api()->last_error();
    }
    Events pev;
    ASSERT_TRUE(pev.WaitN(pr.p->eng, n, 10000));
    // The replies reach D just after P applied the releases.
    WaitFor([&] { return StatCount(pr.d->eng, "ctl_rtt.count") >= n; }, 5000);
    EXPECT_EQ(n, StatCount(pr.d->eng, "ctl_rtt.count"));
    EXPECT_EQ(0, StatCount(pr.d->eng, "tx_fail"));
    EXPECT_GT(StatCount(pr.d->eng, "ctl_rtt.max_us"), 0);
    EXPECT_GE(StatCount(pr.d->eng, "ctl_rtt.max_us"),
              StatCount(pr.d->eng, "ctl_rtt.p50_us"));
    long long total = StatCount(pr.d->eng, "last_handshake.total_us");
    EXPECT_GT(total, 0);
    EXPECT_GE(total, StatCount(pr.d->eng, "last_handshake.metadata_us"));
    EXPECT_EQ(0, StatCount(pr.d->eng, "releases_on_dp"));
}

// By default a READ D releases the P rank it read from with a notice on the
// UCX endpoint of the gets (no control message per transfer), and P takes
// it only under the session it gave the address it saw D's handshake from:
// the same transfers, byte-exact, with no release over the control plane.
// With sec (mutual TLS on the control plane) the same: the handshake (over
// TLS) gave D its session, the notices carry D's stamps, P takes each once.
void ReleasesOnDp(const std::string &sec, const std::string &prefix)
{
    Pair pr;
    MakePair(&pr, sec, 5.0, 20.0, sec);
    if (::testing::Test::HasFatalFailure()) {
        return;
    }
    ASSERT_TRUE(sec.empty() || (CtlTlsOn(pr.p->eng) && CtlTlsOn(pr.d->eng)));
    const int n = 4;
    for (int i = 0; i < n; i++) {
        // The same blocks each time: Pull checks that D's others are
        // untouched.
        std::vector<uint64_t> remote = {3, 1}, local = {0, 5};
        Pull(pr, prefix + std::to_string(i), local, remote);
        if (::testing::Test::HasFatalFailure()) {
            return;
        }
    }
    WaitFor([&] { return StatCount(pr.p->eng, "notices_done") >= n; }, 5000);
    EXPECT_EQ(n, StatCount(pr.p->eng, "notices_done"));
    EXPECT_EQ(0, StatCount(pr.p->eng, "notices_refused"));
    EXPECT_EQ(0, StatCount(pr.p->eng, "dp_stale"));
    EXPECT_EQ(n, StatCount(pr.d->eng, "releases_on_dp"));
    EXPECT_EQ(0, StatCount(pr.d->eng, "ctl_rtt.count"));
    EXPECT_EQ(0, StatCount(pr.p->eng, "rx.release"));
    EXPECT_EQ(1, StatCount(pr.d->eng, "handshakes_ok"));
}

TEST(CtlClient, ReleasesTravelOnTheDataPlane)
{
    ReleasesOnDp("", "tx-dp-rel-");
}

TEST(CtlClient, ControlPlaneTlsKeepsReleasesOnTheDataPlane)
{
    std::string sec = CtlTlsExtra();
    ASSERT_FALSE(sec.empty()) << "no certificates";
    ReleasesOnDp(sec, "tx-tls-rel-");
}

// ========================================================================
// 15. connect_peer: the handshake ahead of the first request (ABI 1.2).
// ========================================================================

namespace {

std::string AddrParams(const char *host, uint16_t hs, uint16_t notify)
{
    return std::string("{\"remote_host\":\"") + host +
           "\",\"remote_handshake_port\":" + std::to_string(hs) +
           ",\"remote_notify_port\":" + std::to_string(notify) +
           ",\"remote_tp_size\":1}";
}

} // namespace

TEST(ConnectPeer, HandshakeAheadThenTheRequestUsesIt)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    std::string addr = AddrParams("127.0.0.1", pr.hs,
                                  (uint16_t)(pr.hs + 20000));
    EXPECT_EQ(0, StatCount(pr.d->eng, "handshakes_ok"));
    ASSERT_EQ(KVX_OK, Api()->connect_peer(pr.d->eng, addr.c_str(), 10000))
        << Api()->last_error();
    EXPECT_EQ(1, StatCount(pr.d->eng, "handshakes_ok"));
    EXPECT_GT(StatCount(pr.d->eng, "last_handshake.total_us"), 0);
    // Connected already: a no-op, also with a deadline.
    ASSERT_EQ(KVX_OK, Api()->connect_peer(pr.d->eng, addr.c_str(), 0));
    ASSERT_EQ(KVX_OK, Api()->connect_peer(pr.d->eng, addr.c_str(), 1000));

    const std::vector<uint64_t> remote = {7, 3}, local = {1, 2};
    ASSERT_EQ(KVX_OK, Hold(*pr.p, "tx-ahead", remote)) << Api()->last_error();
    std::string params = PairParams(pr, "tx-ahead", remote);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-ahead",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(pr.d->eng, "tx-ahead", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPull(pr.model, *pr.d, 0, local, remote));
    EXPECT_EQ(1, StatCount(pr.d->eng, "handshakes_ok")); // no second one
    EXPECT_EQ(0, StatCount(pr.d->eng, "handshakes_failed"));
}

TEST(ConnectPeer, DeadPortFailsWithinTheHandshakeTimeout)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(2);
    RankOpts    o     = Opts(false, (uint16_t)(base + 1), 24);
    std::string err;
    o.handshake_timeout = 0.5;
    auto d              = Start(model, o, &err);
    ASSERT_TRUE(d) << err;
    std::string addr = AddrParams("127.0.0.1", base, (uint16_t)(base + 20000));
    auto        t0   = Clock::now();
    kvx_status_t st = Api()->connect_peer(d->eng, addr.c_str(), 10000);
    EXPECT_EQ(KVX_ERR_HANDSHAKE_TIMEOUT, st) << Api()->last_error();
    EXPECT_TRUE(Contains(Api()->last_error(), std::to_string(base)))
        << Api()->last_error();
    EXPECT_LT(SecondsSince(t0), 3.0);
    EXPECT_EQ(1, StatCount(d->eng, "handshakes_failed"));
    // A deadline shorter than the handshake's own: KVX_ERR_TIMEOUT.
    o.handshake_timeout = 2.0;
    base                = PortBase(2);
    o.hs_port           = (uint16_t)(base + 1);
    o.notify_port       = (uint16_t)(base + 20001);
    auto d2             = Start(model, o, &err);
    ASSERT_TRUE(d2) << err;
    addr = AddrParams("127.0.0.1", base, (uint16_t)(base + 20000));
    EXPECT_EQ(KVX_ERR_TIMEOUT, Api()->connect_peer(d2->eng, addr.c_str(), 100))
        << Api()->last_error();
}

TEST(ConnectPeer, BadInputAndWrongRoleAreRefusedWithTheRule)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    // P in READ mode answers handshakes; it never makes one.
    std::string addr = AddrParams("127.0.0.1", (uint16_t)(pr.hs + 1),
                                  (uint16_t)(pr.hs + 20001));
    EXPECT_EQ(KVX_ERR_NOT_SUPPORTED,
              Api()->connect_peer(pr.p->eng, addr.c_str(), 0));
    EXPECT_TRUE(Contains(Api()->last_error(), "kv_producer"))
        << Api()->last_error();
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              Api()->connect_peer(pr.d->eng, "{\"remote_tp_size\":1}", 0));
    EXPECT_TRUE(Contains(Api()->last_error(), "remote_host"))
        << Api()->last_error();
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              Api()->connect_peer(pr.d->eng, addr.c_str(), -1));
    EXPECT_TRUE(Contains(Api()->last_error(), "timeout_ms"))
        << Api()->last_error();
    // Wildcard host: the trust rule, nothing dialled.
    std::string wild = AddrParams("0.0.0.0", pr.hs, (uint16_t)(pr.hs + 20000));
    EXPECT_EQ(KVX_ERR_UNTRUSTED_PEER,
              Api()->connect_peer(pr.d->eng, wild.c_str(), 0));
    EXPECT_EQ(0, StatCount(pr.d->eng, "handshakes_ok") +
                     StatCount(pr.d->eng, "handshakes_failed"));
}

// ========================================================================
// 16. Registration heartbeat to the proxy (SPEC §3, rank 0 only).
// ========================================================================

namespace {

struct ProxyRecorder {
    std::mutex               m;
    std::condition_variable  cv;
    std::vector<std::string> msgs;

    size_t Count()
    {
        std::lock_guard<std::mutex> lk(m);
        return msgs.size();
    }
    bool WaitCount(size_t n, int ms)
    {
        std::unique_lock<std::mutex> lk(m);
        return cv.wait_for(lk, std::chrono::milliseconds(ms),
                           [&] { return msgs.size() >= n; });
    }
};

void ProxyHandler(void *arg, const char *, const char *msg, size_t len, char **reply,
                  size_t *rlen)
{
    ProxyRecorder              *r = static_cast<ProxyRecorder *>(arg);
    std::lock_guard<std::mutex> lk(r->m);
    r->msgs.emplace_back(msg, len);
    r->cv.notify_all();
    *reply = strdup("{\"ok\":true}");
    *rlen  = strlen(*reply);
}

bool WaitStat(kvx_engine_t *eng, const std::string &key, long long at_least,
              double seconds)
{
    return WaitFor([&] { return StatCount(eng, key) >= at_least; },
                   (int)(seconds * 1000));
}

std::string ProxyExtra(uint16_t port)
{
    return "\"proxy_ip\":\"127.0.0.1\",\"proxy_ping_port\":" +
           std::to_string(port) + ",\"proxy_ping_interval\":0.05";
}

} // namespace

TEST(Registration, RankZeroRegistersPeriodicallyAndRidesOutAProxyOutage)
{
    ProxyRecorder rec;
    uint16_t      pport = PortBase(1);
    kvn_server_t *srv   = nullptr;
    ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", pport, 2, 1 << 20,
                                        ProxyHandler, &rec, &srv));
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(4);
    std::string err;
    RankOpts    r0 = Opts(true, base, 32), r1 = r0;
    r0.tp_size = r1.tp_size = 2;
    r1.tp_rank = 1;
    r0.extra = r1.extra = ProxyExtra(pport);
    auto p0 = Start(model, r0, &err);
    ASSERT_TRUE(p0) << err;
    auto p1 = Start(model, r1, &err);
    ASSERT_TRUE(p1) << err;

    ASSERT_TRUE(rec.WaitCount(3, 5000)) << rec.Count();
    char *payload = nullptr;
    ASSERT_EQ(KVX_OK, Api()->registration_payload(p0->eng, &payload));
    std::string want(payload);
    Api()->free(payload);
    {
        std::lock_guard<std::mutex> lk(rec.m);
        for (const auto &m : rec.msgs) {
            EXPECT_EQ(want, m); // rank 0's payload only, never rank 1's
        }
    }
    EXPECT_TRUE(Contains(want, "\"type\":\"P\"")) << want;
    EXPECT_TRUE(Contains(want, "handshake:" + std::to_string(base))) << want;
    EXPECT_TRUE(WaitStat(p0->eng, "reg_sent", 3, 5));
    EXPECT_EQ(0, StatCount(p1->eng, "reg_sent") +
                     StatCount(p1->eng, "reg_failed"));

    // The proxy goes away: failures are counted, the engine keeps serving.
    kvn_server_destroy(srv);
    srv = nullptr;
    EXPECT_TRUE(WaitStat(p0->eng, "reg_failed", 1, 5));
    const std::vector<uint64_t> ids = {1, 2};
    ASSERT_EQ(KVX_OK, Hold(*p0, "tx-reg-outage", ids)) << Api()->last_error();
    // It comes back on the same port: registrations are delivered again.
    size_t before = rec.Count();
    ASSERT_EQ(KVX_OK, kvn_server_create("127.0.0.1", pport, 2, 1 << 20,
                                        ProxyHandler, &rec, &srv));
    EXPECT_TRUE(rec.WaitCount(before + 2, 5000)) << rec.Count();
    p1.reset();
    p0.reset();
    kvn_server_destroy(srv);
}

TEST(Registration, UntrustedOrIncompleteProxyAddressIsAConfigError)
{
    ModelSpec   model = ThreeLayerModel();
    uint16_t    base  = PortBase(2);
    std::string err;
    RankOpts    o = Opts(true, base, 32);
    o.extra       = "\"proxy_ip\":\"0.0.0.0\",\"proxy_ping_port\":36367";
    EXPECT_FALSE(Start(model, o, &err));
    EXPECT_TRUE(Contains(err, "proxy_ip")) << err;
    o.extra = "\"proxy_ip\":\"127.0.0.1\"";
    EXPECT_FALSE(Start(model, o, &err));
    EXPECT_TRUE(Contains(err, "proxy_ping_port")) << err;
}

// ========================================================================
// 17. wait_events: a producer sleeps until its FINISHED_SENDING.
// ========================================================================

TEST(WaitEvents, TimesOutEmptyAndWakesOnTheReleaseEvent)
{
    Pair pr;
    MakePair(&pr);
    if (HasFatalFailure()) {
        return;
    }
    EXPECT_EQ(KVX_ERR_TIMEOUT, Api()->wait_events(pr.p->eng, 20));
    EXPECT_EQ(KVX_ERR_INVALID_PARAM, Api()->wait_events(pr.p->eng, -1));
    EXPECT_TRUE(Contains(Api()->last_error(), "timeout_ms"))
        << Api()->last_error();

    const std::vector<uint64_t> remote = {4}, local = {9};
    ASSERT_EQ(KVX_OK, Hold(*pr.p, "tx-wait-ev", remote)) << Api()->last_error();
    std::string params = PairParams(pr, "tx-wait-ev", remote);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(pr.d->eng, "req-wait-ev",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    // P learns of the release only through its event: wait for it.
    ASSERT_EQ(KVX_OK, Api()->wait_events(pr.p->eng, 20000))
        << Api()->last_error();
    kvx_event_t ev[4];
    int         n = Api()->poll_events(pr.p->eng, ev, 4);
    ASSERT_EQ(1, n);
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, ev[0].type);
    EXPECT_STREQ("tx-wait-ev", ev[0].transfer_id);
    Api()->free(ev[0].block_ids);
    EXPECT_EQ(KVX_ERR_TIMEOUT, Api()->wait_events(pr.p->eng, 0));
}

// ========================================================================
// 18. Sharded heterogeneous TP (SPEC §4): P tp 1, D tp 2; each D rank reads
//     its half of the heads of every P block, key-only layers whole.
// ========================================================================


TEST(ReadHeteroTp, DecodeTp2ReadsHeadSlicesOfPrefillTp1)
{
    ModelSpec pm = ThreeLayerModel();
    pm.block_size = 8; // never equal to a head count: the order is known
    pm.heads      = 4;
    ModelSpec dm  = pm;
    dm.heads      = 2;
    uint16_t    hs = PortBase(4);
    std::string err;
    RankOpts    po = Opts(true, hs, 32);
    RankOpts    d0 = Opts(false, (uint16_t)(hs + 1), 24), d1;
    d0.tp_size     = 2;
    d1             = d0;
    d1.tp_rank     = 1;
    auto p  = Start(pm, po, &err);
    ASSERT_TRUE(p) << err;
    auto r0 = Start(dm, d0, &err);
    ASSERT_TRUE(r0) << err;
    auto r1 = Start(dm, d1, &err);
    ASSERT_TRUE(r1) << err;

    const std::vector<uint64_t> remote = {3, 17, 4, 30}, local = {9, 2, 23, 0};
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-het", remote)) << Api()->last_error();
    std::string params = Params("tx-het", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), remote, 1);
    for (Rank *d : {r0.get(), r1.get()}) {
        ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-het",
                                                  params.c_str(), local.data(),
                                                  local.size()))
            << Api()->last_error();
    }
    for (Rank *d : {r0.get(), r1.get()}) {
        ASSERT_EQ(KVX_OK, Api()->wait_transfer(d->eng, "tx-het", 20000))
            << Api()->last_error();
    }
    EXPECT_EQ("", VerifyPullHeads(dm, pm.heads, *r0, {0}, 0, local, remote));
    EXPECT_EQ("", VerifyPullHeads(dm, pm.heads, *r1, {0}, 1, local, remote));
    // P frees its blocks once both slice readers released them.
    Events pev;
    ASSERT_TRUE(pev.WaitN(p->eng, 1, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-het"));
}

TEST(ReadHeteroTp, HeadCountThatDoesNotSplitIsRefusedAtHandshake)
{
    // P has 4 heads, D tp 2 registers 3 heads per rank: 2 x 3 != 4.
    ModelSpec pm = ThreeLayerModel();
    pm.block_size = 8;
    pm.heads      = 4;
    ModelSpec dm  = pm;
    dm.heads      = 3;
    uint16_t    hs = PortBase(4);
    std::string err;
    RankOpts    po = Opts(true, hs, 32), d0 = Opts(false, (uint16_t)(hs + 1), 24);
    d0.tp_size     = 2;
    auto p  = Start(pm, po, &err);
    ASSERT_TRUE(p) << err;
    auto r0 = Start(dm, d0, &err);
    ASSERT_TRUE(r0) << err;
    const std::vector<uint64_t> remote = {3}, local = {9};
    ASSERT_EQ(KVX_OK, Hold(*p, "tx-het-bad", remote)) << Api()->last_error();
    std::string params = Params("tx-het-bad", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), remote, 1);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(r0->eng, "req-het-bad",
                                              params.c_str(), local.data(),
                                              local.size()));
    EXPECT_EQ(KVX_ERR_PEER_INCOMPATIBLE,
              Api()->wait_transfer(r0->eng, "tx-het-bad", 20000));
    EXPECT_TRUE(Contains(Api()->last_error(), "local num_kv_heads x 2 = 6, remote 4"))
        << Api()->last_error();
}

// P tp 2 (2 heads per rank) -> D tp 1 (4 heads): D gathers heads 0-1 from P
// rank 0 and heads 2-3 from P rank 1 for every token; key-only layers come
// whole from P rank 0; both P ranks are released.
TEST(ReadHeteroTp, DecodeTp1GathersHeadsFromPrefillTp2)
{
    ModelSpec pm = ThreeLayerModel();
    pm.block_size = 8;
    pm.heads      = 2;
    ModelSpec dm  = pm;
    dm.heads      = 4;
    uint16_t    hs = PortBase(4);
    std::string err;
    RankOpts    p0o = Opts(true, hs, 32), p1o;
    p0o.tp_size     = 2;
    p1o             = p0o;
    p1o.tp_rank     = 1;
    RankOpts    dop = Opts(false, (uint16_t)(hs + 2), 24);
    auto p0 = Start(pm, p0o, &err);
    ASSERT_TRUE(p0) << err;
    auto p1 = Start(pm, p1o, &err);
    ASSERT_TRUE(p1) << err;
    auto d = Start(dm, dop, &err);
    ASSERT_TRUE(d) << err;

    // connect_peer handshakes with every P rank D gathers from.
    std::string addr = "{\"remote_host\":\"127.0.0.1\",\"remote_handshake_port\":" +
                       std::to_string(hs) + ",\"remote_notify_port\":" +
                       std::to_string(hs + 20000) + ",\"remote_tp_size\":2}";
    ASSERT_EQ(KVX_OK, Api()->connect_peer(d->eng, addr.c_str(), 10000))
        << Api()->last_error();
    EXPECT_EQ(2, StatCount(d->eng, "handshakes_ok"));
    const std::vector<uint64_t> remote = {3, 17, 4, 30}, local = {9, 2, 23, 0};
    ASSERT_EQ(KVX_OK, Hold(*p0, "tx-gather", remote)) << Api()->last_error();
    ASSERT_EQ(KVX_OK, Hold(*p1, "tx-gather", remote)) << Api()->last_error();
    std::string params = Params("tx-gather", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), remote, 2);
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-gather",
                                              params.c_str(), local.data(),
                                              local.size()))
        << Api()->last_error();
    for (uint32_t l = 0; l < dm.layers.size(); l++) {
        ASSERT_EQ(KVX_OK, Api()->wait_layer(d->eng, "tx-gather", l, 20000))
            << "layer " << l << ": " << Api()->last_error();
    }
    ASSERT_EQ(KVX_OK, Api()->wait_transfer(d->eng, "tx-gather", 20000))
        << Api()->last_error();
    EXPECT_EQ("", VerifyPullHeads(dm, pm.heads, *d, {0, 1}, 0, local,
                                  remote));
    EXPECT_EQ(2, StatCount(d->eng, "handshakes_ok")); // none on the request
    // Each P rank is released by its one reader.
    for (Rank *p : {p0.get(), p1.get()}) {
        Events pev;
        ASSERT_TRUE(pev.WaitN(p->eng, 1, 10000));
        EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-gather"));
    }
}

// Gathering from two P ranks when one of them never answers: the transfer
// fails with the handshake's reason and its blocks, the live P rank is still
// released, and no byte of D's blocks was touched.
TEST(ReadHeteroTp, GatherWithOneDeadSourceFailsAndReleasesTheLiveOne)
{
    ModelSpec pm = ThreeLayerModel();
    pm.block_size = 8;
    pm.heads      = 2;
    ModelSpec dm  = pm;
    dm.heads      = 4;
    uint16_t    hs = PortBase(4); // P rank 1 (hs + 1) is never started
    std::string err;
    RankOpts    p0o = Opts(true, hs, 32);
    p0o.tp_size     = 2;
    RankOpts    dop = Opts(false, (uint16_t)(hs + 2), 24);
    dop.handshake_timeout = 0.5;
    auto p0 = Start(pm, p0o, &err);
    ASSERT_TRUE(p0) << err;
    auto d = Start(dm, dop, &err);
    ASSERT_TRUE(d) << err;
    const std::vector<uint64_t> remote = {3, 17}, local = {9, 2};
    ASSERT_EQ(KVX_OK, Hold(*p0, "tx-gather-dead", remote));
    std::string params = Params("tx-gather-dead", "127.0.0.1", hs,
                                (uint16_t)(hs + 20000), remote, 2);
    auto t0 = Clock::now();
    ASSERT_EQ(KVX_OK, Api()->consumer_request(d->eng, "req-gd",
                                              params.c_str(), local.data(),
                                              local.size()));
    kvx_status_t st = Api()->wait_transfer(d->eng, "tx-gather-dead", 10000);
    EXPECT_EQ(KVX_ERR_HANDSHAKE_TIMEOUT, st) << Api()->last_error();
    EXPECT_TRUE(Contains(Api()->last_error(), std::to_string(hs + 1)))
        << Api()->last_error();
    EXPECT_LT(SecondsSince(t0), 5.0);
    Events dev;
    ASSERT_TRUE(dev.WaitN(d->eng, 1, 3000));
    EXPECT_EQ(KVX_EVENT_FAILED, dev.v[0].type);
    EXPECT_EQ(local, Ids(dev.v[0]));
    EXPECT_TRUE(AllEE(*d)); // nothing was posted
    Events pev;
    ASSERT_TRUE(pev.WaitN(p0->eng, 1, 10000));
    EXPECT_EQ(1u, pev.Count(KVX_EVENT_FINISHED_SENDING, "tx-gather-dead"));
}

// ========================================================================
// ucx_lane_settings: UCX settings through ucp_config_modify, reported.
// ========================================================================

TEST(LaneSettings, ExplicitSettingIsAppliedAndReportedWithThePeer)
{
    Pair pr;
    MakePair(&pr, "\"ucx_lane_settings\":\"auto RNDV_THRESH=16k\"");
    if (HasFatalFailure()) {
        return;
    }
    Pull(pr, "tx-settings", {1, 2}, {7, 3});
    char *json = nullptr;
    ASSERT_EQ(KVX_OK, Api()->transports(pr.d->eng, &json));
    std::string js(json);
    Api()->free(json);
    // UCX 1.17 and later take tcp's keys as TCP_* (kvu_tcp_key)
    // (and 4m socket buffers where the kernel allows them, kvu_sock_max)
    std::string bufs, tbufs;
    if (kvu_sock_max("wmem_max") >= (4u << 20)) {
        bufs += "SNDBUF=4m ";
        tbufs += "TCP_SNDBUF=4m ";
    }
    if (kvu_sock_max("rmem_max") >= (4u << 20)) {
        bufs += "RCVBUF=4m ";
        tbufs += "TCP_RCVBUF=4m ";
    }
    // (KEEPALIVE_INTERVAL=500ms: auto in peer error mode)
    EXPECT_TRUE(Contains(js, "\"settings\":\"KEEPALIVE_INTERVAL=500ms "
                             "TX_SEG_SIZE=272k RX_SEG_SIZE=272k " +
                                 bufs + "RNDV_THRESH=16k\"") ||
                Contains(js, "\"settings\":\"KEEPALIVE_INTERVAL=500ms "
                             "TCP_TX_SEG_SIZE=272k TCP_RX_SEG_SIZE=272k " +
                                 tbufs + "RNDV_THRESH=16k\""))
        << js;
    EXPECT_TRUE(Contains(js, "\"transports\":\"tcp")) << js;
    EXPECT_FALSE(Contains(js, "4294967295")) << js;
}

TEST(LaneSettings, RejectedSettingNamesTheKeyTheValueAndTheRule)
{
    ModelSpec model = ThreeLayerModel();
    struct {
        const char *value, *needle;
    } cases[] = {
        {"auto RNDV_THRESH=not-a-size", "RNDV_THRESH=not-a-size"},
        {"rndv_thresh=16k", "KEY=VALUE"},
        {"UCX_RNDV_THRESH=16k", "without the UCX_ prefix"},
        {"TLS=tcp", "ucx_tls"},
        {"RNDV_THRESH=", "KEY=VALUE"},
    };
    for (const auto &c : cases) {
        RankOpts o = Opts(true, PortBase(1), 8);
        std::string err;
        o.extra = std::string("\"ucx_lane_settings\":\"") + c.value + "\"";
        EXPECT_FALSE(Start(model, o, &err)) << c.value;
        EXPECT_TRUE(Contains(err, "ucx_lane_settings")) << err;
        EXPECT_TRUE(Contains(err, c.needle)) << err;
    }
}
