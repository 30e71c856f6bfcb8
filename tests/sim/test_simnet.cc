// test_simnet.cc - the simulator's in-memory transports on their own: the
// kvt.h contract (callbacks never inside the submitting call, exactly once,
// close cancels), copies checked against registrations, crashes, and
// determinism of the seeded scheduler.
#include "simnet.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace sim;

namespace {

struct Reply {
    int          calls = 0;
    kvx_status_t st    = KVX_OK;
    std::string  data;
    uint64_t     at_us = 0;
};

void OnReply(void *arg, kvx_status_t st, const char *reply, size_t len,
             const char *err)
{
    Reply *r = static_cast<Reply *>(arg);
    r->calls++;
    r->st    = st;
    r->data  = st == KVX_OK ? std::string(reply, len) : std::string(err);
    r->at_us = World::Get()->Now();
}

std::string g_from;

void Echo(void *arg, const char *from, const char *msg, size_t len,
          char **reply_p, size_t *reply_len_p)
{
    (void)arg;
    g_from = from;
    std::string r = "re:" + std::string(msg, len);
    *reply_p      = static_cast<char *>(malloc(r.size()));
    memcpy(*reply_p, r.data(), r.size());
    *reply_len_p = r.size();
}

void RunUntil(World &w, const std::function<bool()> &cond, int max = 100000)
{
    for (int i = 0; i < max && !cond(); i++) {
        if (!w.Step()) {
            break;
        }
    }
}

TEST(SimCtl, RequestReplyCarriesTheSenderAddress)
{
    World w(1);
    int   a = w.AddNode("10.0.0.1", "a"), b = w.AddNode("10.0.0.2", "b");
    const kvt_ctl_ops_t *ops = World::CtlOps();
    kvt_server_t *srv;
    kvt_client_t *cli;
    Reply         r;

    w.SetCurrent(a);
    ASSERT_EQ(KVX_OK, ops->server_create("10.0.0.1", 5000, 4, 1024, nullptr, Echo,
                                         nullptr, &srv));
    EXPECT_NE(KVX_OK, ops->server_create("10.0.0.1", 5000, 4, 1024, nullptr, Echo,
                                         nullptr, &srv));
    w.SetCurrent(b);
    ASSERT_EQ(KVX_OK, ops->client_open("10.0.0.1", 5000, 2, nullptr, &cli));
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "hi", 2, 1000, OnReply, &r));
    EXPECT_EQ(0, r.calls); // never inside the submitting call
    RunUntil(w, [&] { return r.calls > 0; });
    EXPECT_EQ(1, r.calls);
    EXPECT_EQ(KVX_OK, r.st);
    EXPECT_EQ("re:hi", r.data);
    EXPECT_EQ(0u, g_from.find("10.0.0.2:"));
    w.RunFor(3000000); // the timeout of an answered request never fires
    EXPECT_EQ(1, r.calls);
    ops->client_close(cli);
    w.SetCurrent(a);
    ops->server_destroy(srv);
}

TEST(SimCtl, NoServerTimesOutAtTheDeadlineAndBusyContextsRefuse)
{
    World w(2);
    w.SetCurrent(w.AddNode("10.0.0.2", "b"));
    const kvt_ctl_ops_t *ops = World::CtlOps();
    kvt_client_t *cli;
    Reply         r, r2;
    uint64_t      t0 = w.Now();

    ASSERT_EQ(KVX_OK, ops->client_open("10.0.0.9", 7, 1, nullptr, &cli));
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "x", 1, 500, OnReply, &r));
    EXPECT_EQ(KVX_ERR_BAD_STATE,
              ops->client_post(cli, "y", 1, 500, OnReply, &r2));
    RunUntil(w, [&] { return r.calls > 0; });
    EXPECT_EQ(KVX_ERR_TIMEOUT, r.st);
    EXPECT_EQ(t0 + 500000, r.at_us);
    EXPECT_EQ(0, r2.calls);
    ops->client_close(cli);
    EXPECT_EQ(1, r.calls);
}

// Watch: every connection event of cli is appended to events (1 up, 0
// lost).
void Watch(const kvt_ctl_ops_t *ops, kvt_client_t *cli,
           std::vector<int> *events)
{
    ops->client_watch(
        cli, [](void *arg, int up) {
            static_cast<std::vector<int> *>(arg)->push_back(up);
        },
        events);
}

// The partition fault's cut, as nng 1.5 behaves: requests in flight on a
// reset connection fail at once; requests posted while cut wait and go at
// the heal (unless their deadline passed); a watched client hears of its
// connection going and coming once it was up; two cuts of a pair need two
// heals.
TEST(SimCtl, CutResetsInFlightHoldsNewRequestsAndHealDeliversThem)
{
    World w(4);
    int   a = w.AddNode("10.0.0.1", "a"), b = w.AddNode("10.0.0.2", "b");
    const kvt_ctl_ops_t *ops = World::CtlOps();
    kvt_server_t        *srv;
    kvt_client_t        *cli;
    Reply                r1, r2, r3;
    std::vector<int>     events;

    w.set_conn_events(true);
    w.SetCurrent(a);
    ASSERT_EQ(KVX_OK, ops->server_create("10.0.0.1", 5000, 4, 1024, nullptr,
                                         Echo, nullptr, &srv));
    w.SetCurrent(b);
    ASSERT_EQ(KVX_OK, ops->client_open("10.0.0.1", 5000, 4, nullptr, &cli));
    Watch(ops, cli, &events);
    ASSERT_EQ(std::vector<int>({1}), events); // up: said inside the call
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "one", 3, 5000, OnReply, &r1));
    w.CutCtl(a, b);
    EXPECT_EQ(1, r1.calls); // in flight on the reset connection
    EXPECT_EQ(KVX_ERR_CONTROL, r1.st);
    EXPECT_EQ(std::vector<int>({1, 0}), events);
    w.CutCtl(b, a); // a second cut of the same pair
    w.SetCurrent(b);
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "two", 3, 5000, OnReply, &r2));
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "three", 5, 100, OnReply, &r3));
    w.RunFor(1000000);
    EXPECT_EQ(0, r2.calls); // held by the cut
    EXPECT_EQ(1, r3.calls); // its deadline passed while held
    EXPECT_EQ(KVX_ERR_TIMEOUT, r3.st);
    w.HealCtl(a, b);
    EXPECT_TRUE(w.CtlCut(a, b)); // one cut stays
    w.RunFor(1000000);
    EXPECT_EQ(0, r2.calls);
    EXPECT_EQ(std::vector<int>({1, 0}), events);
    w.HealCtl(a, b);
    EXPECT_FALSE(w.CtlCut(a, b));
    EXPECT_EQ(std::vector<int>({1, 0, 1}), events);
    RunUntil(w, [&] { return r2.calls > 0; });
    EXPECT_EQ(KVX_OK, r2.st);
    EXPECT_EQ("re:two", r2.data);
    ops->client_close(cli);
    w.SetCurrent(a);
    ops->server_destroy(srv);
}

// A watched client that never connected hears nothing (nng raises no pipe
// event for a dial that never succeeds), then up once its server listens.
TEST(SimCtl, WatchOfANeverConnectedClientHearsNothingUntilUp)
{
    World w(5);
    int   a = w.AddNode("10.0.0.1", "a"), b = w.AddNode("10.0.0.2", "b");
    const kvt_ctl_ops_t *ops = World::CtlOps();
    kvt_server_t        *srv;
    kvt_client_t        *cli;
    std::vector<int>     events;

    w.set_conn_events(true);
    w.SetCurrent(b);
    ASSERT_EQ(KVX_OK, ops->client_open("10.0.0.1", 5000, 4, nullptr, &cli));
    Watch(ops, cli, &events);
    w.CutCtl(a, b);
    EXPECT_TRUE(events.empty());
    w.SetCurrent(a);
    ASSERT_EQ(KVX_OK, ops->server_create("10.0.0.1", 5000, 4, 1024, nullptr,
                                         Echo, nullptr, &srv));
    EXPECT_TRUE(events.empty()); // (cut)
    w.HealCtl(a, b);
    EXPECT_EQ(std::vector<int>({1}), events);
    w.SetCurrent(b);
    ops->client_close(cli);
    w.SetCurrent(a);
    ops->server_destroy(srv);
}

TEST(SimCtl, CloseCompletesPendingRequestsBeforeItReturns)
{
    World w(3);
    int   a = w.AddNode("10.0.0.1", "a");
    const kvt_ctl_ops_t *ops = World::CtlOps();
    kvt_server_t *srv;
    kvt_client_t *cli;
    Reply         r;

    w.SetCurrent(a);
    ASSERT_EQ(KVX_OK, ops->server_create("0.0.0.0", 5000, 4, 1024, nullptr, Echo,
                                         nullptr, &srv));
    ASSERT_EQ(KVX_OK, ops->client_open("10.0.0.1", 5000, 2, nullptr, &cli));
    ASSERT_EQ(KVX_OK, ops->client_post(cli, "hi", 2, 1000, OnReply, &r));
    ops->client_close(cli);
    EXPECT_EQ(1, r.calls);
    EXPECT_EQ(KVX_ERR_CANCELED, r.st);
    w.RunFor(2000000);
    EXPECT_EQ(1, r.calls);
    ops->server_destroy(srv);
}

// --- data plane ---------------------------------------------------------------

struct Ctx {
    kvt_ctx_t           *ctx = nullptr;
    kvt_mem_t           *mem = nullptr;
    std::vector<uint8_t> buf;
    int                  ticks = 0;
};

struct EpErr {
    int          calls = 0;
    kvx_status_t st    = KVX_OK;
};

void OnEpErr(void *arg, kvt_ep_t *ep, kvx_status_t st, const char *why)
{
    (void)ep;
    (void)why;
    static_cast<EpErr *>(arg)->calls++;
    static_cast<EpErr *>(arg)->st = st;
}

struct Op {
    kvt_op_t op{};
    int      calls = 0;
};

void OnOpDone(kvt_op_t *o)
{
    reinterpret_cast<Op *>(o)->calls++;
}

void OnTick(void *arg)
{
    static_cast<Ctx *>(arg)->ticks++;
}

void MakeCtx(World &w, int node, Ctx *c, uint8_t fill)
{
    const kvt_data_ops_t *d = World::DataOps();
    kvt_data_params_t     p{};

    p.err_mode_peer = 1;
    p.tick          = OnTick;
    p.tick_arg      = c;
    p.name          = "ctx";
    w.SetCurrent(node);
    ASSERT_EQ(KVX_OK, d->ctx_create(&p, &c->ctx));
    c->buf.assign(4096, fill);
    ASSERT_EQ(KVX_OK, d->mem_register(c->ctx, c->buf.data(), c->buf.size(), 0,
                                      &c->mem));
}

struct Link {
    kvt_ep_t   *ep = nullptr;
    kvt_rkey_t *rk = nullptr;
    EpErr       err;
};

void Connect(Ctx &from, Ctx &to, Link *l)
{
    const kvt_data_ops_t *d = World::DataOps();
    const void *addr, *rk;
    size_t      alen, rlen;

    d->worker_address(to.ctx, &addr, &alen);
    ASSERT_EQ(KVX_OK, d->ep_create(from.ctx, addr, alen, "peer", OnEpErr,
                                   &l->err, &l->ep));
    d->mem_rkey(to.mem, &rk, &rlen);
    ASSERT_EQ(KVX_OK, d->rkey_unpack(l->ep, rk, rlen, &l->rk));
}

void Teardown(Ctx &c, Link *l)
{
    const kvt_data_ops_t *d = World::DataOps();
    if (l != nullptr) {
        d->rkey_destroy(l->rk);
        d->ep_close(l->ep);
    }
    d->mem_release(c.mem);
    d->ctx_destroy(c.ctx);
}

TEST(SimData, GetAndPutCopyTheRunsAndFlushFollowsThem)
{
    World w(4);
    const kvt_data_ops_t *d = World::DataOps();
    Ctx   a, b;
    Link  l;
    Op    get, put, fl;
    MakeCtx(w, w.AddNode("10.0.0.1", "a"), &a, 0xAA);
    MakeCtx(w, w.AddNode("10.0.0.2", "b"), &b, 0xBB);
    for (size_t i = 0; i < b.buf.size(); i++) {
        b.buf[i] = (uint8_t)i;
    }
    Connect(a, b, &l);
    const kvc_run_t gets[2] = {{0, 100, 10}, {50, 200, 5}};
    const kvc_run_t puts[1] = {{1000, 3000, 8}};
    uint64_t abase = (uint64_t)(uintptr_t)a.buf.data();
    uint64_t bbase = (uint64_t)(uintptr_t)b.buf.data();
    get.op.done = put.op.done = fl.op.done = OnOpDone;
    ASSERT_EQ(KVX_OK, d->post(l.ep, 0, a.mem, abase, l.rk, bbase, gets, 2,
                              &get.op));
    ASSERT_EQ(KVX_OK, d->post(l.ep, 1, a.mem, abase, l.rk, bbase, puts, 1,
                              &put.op));
    ASSERT_EQ(KVX_OK, d->flush(l.ep, &fl.op));
    EXPECT_EQ(0, get.calls + put.calls + fl.calls);
    RunUntil(w, [&] { return fl.calls > 0; });
    EXPECT_EQ(1, get.calls);
    EXPECT_EQ(1, put.calls);
    EXPECT_EQ(1, fl.calls);
    EXPECT_EQ(0, __atomic_load_n(&get.op.status, __ATOMIC_SEQ_CST));
    EXPECT_EQ(15u, get.op.bytes);
    for (int i = 0; i < 10; i++) {
        EXPECT_EQ((uint8_t)(100 + i), a.buf[(size_t)i]);
    }
    EXPECT_EQ(0xAA, a.buf[10]);
    EXPECT_EQ((uint8_t)200, a.buf[50]);
    EXPECT_EQ(0xAA, b.buf[3000]); // put a's bytes
    EXPECT_EQ((uint8_t)(3008 & 0xff), b.buf[3008]);
    EXPECT_FALSE(w.Violated());
    EXPECT_GT(a.ticks, 0);
    Teardown(a, &l);
    Teardown(b, nullptr);
    EXPECT_FALSE(w.Violated()) << w.Violation();
}

TEST(SimData, CloseCancelsRunsLaterAndOutOfRangeIsAViolation)
{
    World w(5);
    const kvt_data_ops_t *d = World::DataOps();
    Ctx   a, b;
    Link  l;
    Op    get, bad;
    MakeCtx(w, w.AddNode("10.0.0.1", "a"), &a, 0xAA);
    MakeCtx(w, w.AddNode("10.0.0.2", "b"), &b, 0xBB);
    Connect(a, b, &l);
    const kvc_run_t gets[1]    = {{0, 0, 64}};
    const kvc_run_t outside[1] = {{0, 4090, 64}};
    uint64_t abase = (uint64_t)(uintptr_t)a.buf.data();
    uint64_t bbase = (uint64_t)(uintptr_t)b.buf.data();
    get.op.done = bad.op.done = OnOpDone;
    ASSERT_EQ(KVX_OK, d->post(l.ep, 0, a.mem, abase, l.rk, bbase, gets, 1,
                              &get.op));
    d->rkey_destroy(l.rk);
    d->ep_close(l.ep);
    EXPECT_EQ(0, get.calls);
    RunUntil(w, [&] { return get.calls > 0; });
    EXPECT_EQ(KVX_ERR_CANCELED, __atomic_load_n(&get.op.status, __ATOMIC_SEQ_CST));
    EXPECT_EQ(0xAA, a.buf[0]);

    Connect(a, b, &l);
    ASSERT_EQ(KVX_OK, d->post(l.ep, 0, a.mem, abase, l.rk, bbase, outside, 1,
                              &bad.op));
    RunUntil(w, [&] { return bad.calls > 0; });
    EXPECT_TRUE(w.Violated());
    EXPECT_NE(std::string::npos, w.Violation().find("outside"));
    EXPECT_NE(0, __atomic_load_n(&bad.op.status, __ATOMIC_SEQ_CST));
    EXPECT_EQ(0xAA, a.buf[0]); // not performed
    Teardown(a, &l);
    Teardown(b, nullptr);
}

TEST(SimData, CrashedPeerFailsTheEndpointOnceAndItsRuns)
{
    World w(6);
    const kvt_data_ops_t *d = World::DataOps();
    Ctx   a, b;
    Link  l;
    Op    get;
    int   nb = w.AddNode("10.0.0.2", "b");
    MakeCtx(w, w.AddNode("10.0.0.1", "a"), &a, 0xAA);
    MakeCtx(w, nb, &b, 0xBB);
    Connect(a, b, &l);
    const kvc_run_t gets[2] = {{0, 0, 8}, {8, 8, 8}};
    get.op.done = OnOpDone;
    ASSERT_EQ(KVX_OK, d->post(l.ep, 0, a.mem, (uint64_t)(uintptr_t)a.buf.data(),
                              l.rk, (uint64_t)(uintptr_t)b.buf.data(), gets, 2,
                              &get.op));
    w.Crash(nb);
    RunUntil(w, [&] { return get.calls > 0 && l.err.calls > 0; });
    EXPECT_EQ(1, l.err.calls);
    EXPECT_EQ(KVX_ERR_ENDPOINT, l.err.st);
    EXPECT_EQ(1, get.calls);
    EXPECT_NE(0, __atomic_load_n(&get.op.status, __ATOMIC_SEQ_CST));
    EXPECT_EQ(0xAA, a.buf[0]);
    w.RunFor(1000000);
    EXPECT_EQ(1, l.err.calls);
    Teardown(a, &l);
    w.Isolate(nb);
    w.SetCurrent(nb);
    Teardown(b, nullptr);
    EXPECT_FALSE(w.Violated()) << w.Violation();
}

// A random mixed workload; returns a digest of the schedule.
uint64_t Workload(uint64_t seed, bool dup_delay)
{
    World w(seed);
    const kvt_data_ops_t *d = World::DataOps();
    const kvt_ctl_ops_t  *c = World::CtlOps();
    Ctx   a, b;
    Link  l;
    std::vector<Op>    ops(20);
    std::vector<Reply> reps(20);
    kvt_server_t      *srv;
    kvt_client_t      *cli;
    uint64_t           digest = 0;

    w.set_net_faults(dup_delay ? kFaultDup | kFaultDelay : 0);
    int na = w.AddNode("10.0.0.1", "a"), nb = w.AddNode("10.0.0.2", "b");
    MakeCtx(w, na, &a, 1);
    MakeCtx(w, nb, &b, 2);
    w.SetCurrent(nb);
    c->server_create("10.0.0.2", 9, 4, 4096, nullptr, Echo, nullptr, &srv);
    w.SetCurrent(na);
    c->client_open("10.0.0.2", 9, 32, nullptr, &cli);
    Connect(a, b, &l);
    w.after_step = [&] { digest = digest * 31 + w.Now() + w.Steps(); };
    std::vector<kvc_run_t> runs(20);
    for (int i = 0; i < 20; i++) {
        runs[(size_t)i] = {(uint64_t)i * 100, (uint64_t)i * 150, 50};
        ops[(size_t)i].op.done = OnOpDone;
        d->post(l.ep, i & 1, a.mem, (uint64_t)(uintptr_t)a.buf.data(), l.rk,
                (uint64_t)(uintptr_t)b.buf.data(), &runs[(size_t)i], 1,
                &ops[(size_t)i].op);
        std::string m = "m" + std::to_string(i);
        c->client_post(cli, m.data(), m.size(), 2000, OnReply,
                       &reps[(size_t)i]);
    }
    w.RunFor(5000000);
    for (auto &r : reps) {
        EXPECT_EQ(1, r.calls);
        digest = digest * 7 + (uint64_t)r.st;
    }
    for (auto &o : ops) {
        EXPECT_EQ(1, o.calls);
    }
    c->client_close(cli);
    w.SetCurrent(nb);
    c->server_destroy(srv);
    Teardown(a, &l);
    Teardown(b, nullptr);
    return digest;
}

TEST(SimWorld, SameSeedSameScheduleOtherSeedOtherSchedule)
{
    EXPECT_EQ(Workload(42, true), Workload(42, true));
    EXPECT_EQ(Workload(7, false), Workload(7, false));
    EXPECT_NE(Workload(42, true), Workload(43, true));
}

TEST(SimWorld, ClockWaitRunsStepsAndReachesItsDeadline)
{
    World     w(8);
    kvt_env_t env = w.Env();
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t  cv = PTHREAD_COND_INITIALIZER;
    Ctx             a;

    MakeCtx(w, w.AddNode("10.0.0.1", "a"), &a, 0);
    uint64_t deadline = env.clock.now_us(env.clock.arg) + 50000;
    pthread_mutex_lock(&mu);
    while (env.clock.now_us(env.clock.arg) < deadline) {
        env.clock.wait(env.clock.arg, &cv, &mu, deadline);
    }
    pthread_mutex_unlock(&mu);
    EXPECT_EQ(deadline, w.Now());
    EXPECT_GE(a.ticks, 4);
    EXPECT_NE(env.clock.random64(env.clock.arg),
              env.clock.random64(env.clock.arg));
    Teardown(a, nullptr);
}

} // namespace
