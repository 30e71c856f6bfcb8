// test_kvu_fifo.cc - a peer killed while it writes a message into this
// process's shared-memory receive FIFO blocks that FIFO for good (UCX
// sysv/posix deliver strictly in order). The receive-FIFO watchdog
// (transports/ucx/kvu.c) must notice, fail the shared-memory endpoints
// whose answers would land there, and move the context to a new worker
// that serves and is served again. The peer is a real process
// (fifo_saboteur) killed inside UCX's pack callback.
#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kvu_test_util.h"

extern "C" {
#include "ucx/kvu.h"
}

namespace {

uint64_t now_ms()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

struct Waiter {
    kvt_op_t        op{};
    pthread_mutex_t mu   = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t  cv   = PTHREAD_COND_INITIALIZER;
    int             done = 0;

    Waiter()
    {
        op.done = cb;
        op.arg  = this;
    }
    static void cb(kvt_op_t *op)
    {
        Waiter *w = static_cast<Waiter *>(op->arg);
        pthread_mutex_lock(&w->mu);
        w->done++;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
    // true when the op completed within ms
    bool wait(int ms)
    {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&mu);
        while (done == 0 && pthread_cond_timedwait(&cv, &mu, &ts) == 0) {
        }
        int d = done;
        pthread_mutex_unlock(&mu);
        return d > 0;
    }
};

struct EpErr {
    pthread_mutex_t mu     = PTHREAD_MUTEX_INITIALIZER;
    int             n      = 0;
    std::string     reason;

    static void cb(void *arg, kvt_ep_t *, kvx_status_t, const char *why)
    {
        EpErr *e = static_cast<EpErr *>(arg);
        pthread_mutex_lock(&e->mu);
        e->n++;
        e->reason = why != nullptr ? why : "";
        pthread_mutex_unlock(&e->mu);
    }
};

struct Ctx {
    kvu_ctx_t           *ctx = nullptr;
    kvu_mem_t           *mem = nullptr;
    std::vector<uint8_t> buf;

    Ctx(const char *name, uint8_t fill) : buf(65536, fill)
    {
        kvu_params_t p{};
        // shared memory without cma: gets on application memory are then
        // emulated over the FIFO on every UCX version (with cma, UCX 1.16+
        // copies them zero-copy and no answer crosses a FIFO)
        p.tls                = "sysv,posix";
        p.err_mode_peer      = 1;
        p.max_inflight_bytes = 1 << 20;
        p.name               = name;
        p.remote_access      = KVT_ACCESS_DEFAULT;
        EXPECT_EQ(kvu_ctx_create(&p, &ctx), KVX_OK);
        EXPECT_EQ(kvu_mem_register(ctx, buf.data(), buf.size(), 0, &mem),
                  KVX_OK);
    }
    ~Ctx()
    {
        kvu_mem_release(mem);
        kvu_ctx_destroy(ctx);
    }
    std::string address() const
    {
        const void *a;
        size_t      n;
        kvu_worker_address(ctx, &a, &n);
        return std::string(static_cast<const char *>(a), n);
    }
};

// An endpoint from `from` to `to`'s current worker with `to`'s rkey.
struct Link {
    kvu_ep_t   *ep   = nullptr;
    kvu_rkey_t *rkey = nullptr;
    EpErr       err;
    Ctx        &from, &to;

    Link(Ctx &f, Ctx &t) : from(f), to(t)
    {
        std::string a = t.address();
        const void *rk;
        size_t      rklen;
        EXPECT_EQ(kvu_ep_create(f.ctx, a.data(), a.size(), "fifo-peer",
                                EpErr::cb, &err, &ep), KVX_OK);
        kvu_mem_rkey(t.mem, &rk, &rklen);
        EXPECT_EQ(kvu_rkey_unpack(ep, rk, rklen, &rkey), KVX_OK);
    }
    ~Link()
    {
        kvu_rkey_destroy(rkey);
        kvu_ep_close(ep);
    }
    // read_ok: a get that completes OK and brings v into from's first
    // 32 KiB
    bool read_ok(uint8_t v)
    {
        Waiter w;
        get(w);
        return w.wait(10000) && w.op.status == KVX_OK &&
               all_eq(from.buf.data(), 32768, v);
    }
    // posts a get of 32 KiB at offset 0 of `to` into `from` at 0
    void get(Waiter &w)
    {
        static const kvc_run_t run = {0, 0, 32768};
        EXPECT_EQ(kvu_post(ep, 0, from.mem,
                           (uint64_t)(uintptr_t)from.buf.data(), rkey,
                           (uint64_t)(uintptr_t)to.buf.data(), &run, 1,
                           &w.op), KVX_OK);
    }
};

std::string hex(const std::string &s)
{
    static const char d[] = "0123456789abcdef";
    std::string       h;
    for (unsigned char c : s) {
        h += d[c >> 4];
        h += d[c & 15];
    }
    return h;
}

// Runs fifo_saboteur against addr; true when it died of SIGKILL (inside
// the pack callback: the FIFO element stays reserved and never ready).
bool sabotage(const std::string &addr)
{
    const char *exe = getenv("KVT_FIFO_SABOTEUR");
    if (exe == nullptr) {
        ADD_FAILURE() << "KVT_FIFO_SABOTEUR is not set";
        return false;
    }
    const void *ent[KVU_ADDR_MAX];
    size_t      len[KVU_ADDR_MAX];
    unsigned    n = 0;
    EXPECT_EQ(KVX_OK, kvu_addr_entries(addr.data(), addr.size(), ent, len, nullptr, &n));
    if (n == 0) {
        return false;
    }
    std::string h   = hex(std::string(static_cast<const char *>(ent[0]),
                                      len[0])); // the shared-memory worker
    pid_t       pid = fork();
    if (pid == 0) {
        execl(exe, exe, h.c_str(), (char *)nullptr);
        _exit(127);
    }
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "fifo_saboteur status " << status;
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// d (the origin whose FIFO gets blocked) reads from p over sm; after the
// watchdog moved d to a new worker, d reads from p again and a third
// context q (a peer that connects to d's new address: a context that also
// holds a closing endpoint to d would race UCX's endpoint matching, a test
// artifact) reads from d.
TEST(KvuFifo, BlockedReceiveFifoMovesTheContextToANewWorker)
{
    Ctx p("fifo-p", 0x5a), d("fifo-d", 0x00), q("fifo-q", 0x00);
    std::string old_addr;
    {
        Link l(d, p);
        ASSERT_TRUE(l.read_ok(0x5a));

        old_addr = d.address();
        ASSERT_TRUE(sabotage(old_addr));
        memset(d.buf.data(), 0, d.buf.size());

        // p's answer to this get would land behind the dead element: the
        // watchdog fails the endpoint (probe lost after 1 s) instead.
        Waiter   w1;
        uint64_t t0 = now_ms();
        l.get(w1);
        ASSERT_TRUE(w1.wait(15000)) << "get never completed";
        EXPECT_EQ(w1.op.status, KVX_ERR_ENDPOINT);
        EXPECT_LT(now_ms() - t0, 5000u);
        EXPECT_TRUE(all_eq(d.buf.data(), d.buf.size(), 0x00));
        pthread_mutex_lock(&l.err.mu);
        EXPECT_EQ(l.err.n, 1);
        EXPECT_NE(l.err.reason.find("receive FIFO is blocked"),
                  std::string::npos) << l.err.reason;
        pthread_mutex_unlock(&l.err.mu);
    }
    EXPECT_NE(d.address(), old_addr) << "the worker address did not change";

    // The retired worker (its FIFO still blocked) must not keep the
    // progress thread from sleeping: idle, the three contexts use a small
    // fraction of one core (a spinning thread uses all of it).
    {
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        uint64_t t0 = now_ms();
        while (now_ms() - t0 < 2000) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, nullptr); // measuring idle CPU over 2 s
        }
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) +
                     (double)(c1.tv_nsec - c0.tv_nsec) / 1e9;
        EXPECT_LT(cpu, 1.0) << "idle process used " << cpu << " s of CPU in "
                            << "2 s after a worker was retired";
    }

    // The new worker: d reads from p again, and q reads from d.
    memset(d.buf.data(), 0, d.buf.size());
    EXPECT_TRUE(Link(d, p).read_ok(0x5a));
    memset(d.buf.data(), 0x33, d.buf.size());
    EXPECT_TRUE(Link(q, d).read_ok(0x33));
}

// Without the watchdog the same sabotage leaves the get unanswered for
// good: the test above sees a real blocked FIFO, not a slow peer.
struct EnvGuard {
    const char *name;
    EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
    ~EnvGuard() { unsetenv(name); }
};

TEST(KvuFifo, WithoutTheWatchdogTheBlockedFifoNeverDelivers)
{
    EnvGuard off("KVX_UCX_FIFO_WATCHDOG", "0");
    {
        Ctx  p("fifo-p", 0x5a), d("fifo-d", 0x00);
        Link l(d, p);
        ASSERT_TRUE(l.read_ok(0x5a));
        std::string addr = d.address();
        ASSERT_TRUE(sabotage(addr));
        Waiter w1;
        l.get(w1);
        EXPECT_FALSE(w1.wait(7000)) << "the sabotage did not block the FIFO";
        EXPECT_EQ(d.address(), addr);
        kvu_ep_fail(l.ep, KVX_ERR_TIMEOUT, "test deadline");
        EXPECT_TRUE(w1.wait(10000));
    }
}

} // namespace

namespace {

// A context nobody talks to (no endpoints: UCX only wakes its
// shared-memory interface by event) and one that serves gets keep their
// worker: the probe is received, the watchdog never fires on its own.
TEST(KvuFifo, HealthyContextsKeepTheirWorker)
{
    Ctx         idle("fifo-idle", 0x00), p("fifo-p", 0x5a), d("fifo-d", 0);
    std::string a_idle = idle.address(), a_p = p.address();
    Link        l(d, p);
    uint64_t    end = now_ms() + 6000;
    while (now_ms() < end) {
        ASSERT_TRUE(l.read_ok(0x5a));
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, nullptr); // pacing between gets, not a wait
    }
    EXPECT_EQ(idle.address(), a_idle);
    EXPECT_EQ(p.address(), a_p);
}

} // namespace

namespace {

// The endpoint made right after the kill (before the periodic probe could
// tell): its creation probes the FIFO, finds it blocked and makes the
// endpoint on a new worker, so the first get through it already succeeds;
// the older shared-memory endpoint fails with the reason.
TEST(KvuFifo, EndpointMadeAfterTheKillIsMadeOnANewWorker)
{
    Ctx p("fifo-p", 0x5a), p2("fifo-p2", 0x77), d("fifo-d", 0x00);
    Link old(d, p);
    ASSERT_TRUE(old.read_ok(0x5a));
    std::string a = d.address();
    ASSERT_TRUE(sabotage(a));

    uint64_t t0 = now_ms();
    Link     l(d, p2);
    EXPECT_NE(d.address(), a);
    EXPECT_TRUE(l.read_ok(0x77));
    EXPECT_LT(now_ms() - t0, 5000u);
    uint64_t end = now_ms() + 5000;
    for (;;) { // the old endpoint's failure reaches its callback
        pthread_mutex_lock(&old.err.mu);
        int         n      = old.err.n;
        std::string reason = old.err.reason;
        pthread_mutex_unlock(&old.err.mu);
        if (n > 0 || now_ms() > end) {
            EXPECT_EQ(n, 1);
            EXPECT_NE(reason.find("receive FIFO is blocked"),
                      std::string::npos) << reason;
            break;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, nullptr);
    }
}

} // namespace
