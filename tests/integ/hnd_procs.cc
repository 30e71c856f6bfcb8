// hnd_procs.cc - HND-strided KV caches between real processes (issue 12):
// every P and D rank is its own process (forked before any engine exists),
// real UCX and nng on 127.0.0.1, caches described as torch describes them
// (FlashAttention [2, NB, BS, H, D] and FlashInfer [NB, 2, BS, H, D] with
// heads outside tokens in memory: stride order 0,1,3,2,4), and every byte of
// every D rank checked against tests/unit/layout_oracle.h (not the library's
// layout code), unsent blocks included.
//
//   hnd_procs --mode read|write --p-tp N --d-tp M --heads H
//
// H KV heads in total: H < TP on a side replicates heads there (vLLM). A
// prefix hit: D asks for the last 4 of P's 5 blocks. Exit status 0 when
// every rank succeeded; a failing rank prints why on stderr.
#include "harness.h"
#include "layout_run.h"
#include "../unit/layout_oracle.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kvt;

namespace {

struct Args {
    bool     write = false;
    uint32_t p_tp = 2, d_tp = 4, heads = 4;
};

const std::vector<uint64_t> kPIds = {5, 1, 9, 3, 12};
const std::vector<uint64_t> kDIds = {7, 2, 0, 10};
constexpr uint32_t           kPNb = 16, kDNb = 12;
constexpr uint64_t           kSalt = 0x48AD;
const char *const            kTid = "tx-hnd";

// The two layers: FlashAttention split and FlashInfer interleaved, both
// logical [.., BS, H, D] with heads outside tokens in memory.
oracle::Model LayerModel(const Args &a, int layer)
{
    oracle::Model m{};
    m.kind      = layer == 0 ? oracle::kSplit : oracle::kInter;
    m.heads     = a.heads;
    m.bs        = 16;
    m.k         = 1;
    m.d         = 8;
    m.dv        = 8;
    m.elem      = 2;
    m.hnd_shape = false;
    m.phys      = {0, 1, 3, 2, 4};
    m.free_perm = false;
    m.p_tp      = a.p_tp;
    m.d_tp      = a.d_tp;
    return m;
}

int Fail(const char *who, uint32_t rank, const std::string &why)
{
    fprintf(stderr, "%s rank %u: %s\n", who, rank, why.c_str());
    return 1;
}

// RunRank: one rank's whole life; returns the process exit status.
int RunRank(const Args &a, bool producer, uint32_t rank, uint16_t p_port,
            uint16_t d_port)
{
    const char *who = producer ? "P" : "D";
    uint32_t    tp  = producer ? a.p_tp : a.d_tp;
    RankOpts    o   = LayoutRankOpts(producer, rank, tp,
                                     producer ? p_port : d_port, a.write, 60.0);
    std::string cfg     = RankConfig(o);

    std::vector<oracle::Tensor>       t(2);
    std::vector<std::vector<uint8_t>> bufs(2);
    kvx_engine_t                     *eng = nullptr;
    if (Api()->engine_create(cfg.c_str(), &eng) != KVX_OK) {
        return Fail(who, rank, Api()->last_error());
    }
    for (int l = 0; l < 2; l++) {
        oracle::Model m     = LayerModel(a, l);
        uint32_t      heads = oracle::RankHeads(m, tp);
        t[l] = oracle::MakeTensor(m, producer ? kPNb : kDNb, heads, m.phys);
        bufs[l].assign(t[l].elems * m.elem, producer ? 0xA5 : 0xEE);
        for (uint64_t b = 0; producer && b < kPNb; b++) {
            oracle::WriteBlock(m, t[l], &bufs[l], b, b,
                               oracle::RankHead0(m, tp, rank), kSalt + l);
        }
        kvx_layer_desc_t d = oracle::Desc(m, t[l], &bufs[l], heads);
        d.name             = l == 0 ? "model.layers.0.attn" : "model.layers.1.attn";
        d.mem_type         = KVX_MEM_HOST;
        if (Api()->register_layer(eng, &d) != KVX_OK) {
            return Fail(who, rank, Api()->last_error());
        }
    }
    if (Api()->start(eng) != KVX_OK) {
        return Fail(who, rank, Api()->last_error());
    }
    int rc = 0;
    if (producer) {
        char       *resp = nullptr;
        std::string pp   = LayoutParams(kTid, a.write, true, d_port, a.d_tp, {});
        if (Api()->producer_request(eng, "req-hnd", pp.c_str(), kPIds.data(),
                                    kPIds.size(), &resp) != KVX_OK) {
            return Fail(who, rank, Api()->last_error());
        }
        Api()->free(resp);
        for (uint32_t l = 0; a.write && l < 2; l++) {
            if (Api()->layer_ready(eng, kTid, l) != KVX_OK) {
                return Fail(who, rank, Api()->last_error());
            }
        }
        if (a.write && Api()->seal_transfer(eng, kTid) != KVX_OK) {
            return Fail(who, rank, Api()->last_error());
        }
        // P is done when D released its blocks.
        std::vector<kvx_event_t> ev;
        if (!WaitFor([&] { return DrainEvents(eng, &ev) > 0; }, 60000)) {
            rc = Fail(who, rank, "no event within 60 s");
        } else if (ev[0].type != KVX_EVENT_FINISHED_SENDING) {
            rc = Fail(who, rank, std::string("event ") +
                                     std::to_string(ev[0].type) + ": " +
                                     ev[0].reason);
        }
        FreeEvents(&ev);
    } else {
        std::string dp = LayoutParams(kTid, a.write, false, p_port, a.p_tp, kPIds);
        if (Api()->consumer_request(eng, "req-hnd", dp.c_str(), kDIds.data(),
                                    kDIds.size()) != KVX_OK) {
            return Fail(who, rank, Api()->last_error());
        }
        for (uint32_t l = 0; l < 2 && rc == 0; l++) {
            if (Api()->wait_layer(eng, kTid, l, 60000) != KVX_OK) {
                rc = Fail(who, rank, Api()->last_error());
            }
        }
        if (rc == 0 && Api()->wait_transfer(eng, kTid, 60000) != KVX_OK) {
            rc = Fail(who, rank, Api()->last_error());
        }
        // Every byte of both layers, as the oracle writes them.
        size_t skip = kPIds.size() - kDIds.size();
        for (int l = 0; l < 2 && rc == 0; l++) {
            oracle::Model        m = LayerModel(a, l);
            std::vector<uint8_t> exp(bufs[l].size(), 0xEE);
            for (size_t i = 0; i < kDIds.size(); i++) {
                oracle::WriteBlock(m, t[l], &exp, kDIds[i], kPIds[skip + i],
                                   oracle::RankHead0(m, tp, rank), kSalt + l);
            }
            size_t bad = 0;
            for (size_t j = 0; j < exp.size(); j++) {
                bad += exp[j] != bufs[l][j];
            }
            if (bad != 0) {
                rc = Fail(who, rank, "layer " + std::to_string(l) + ": " +
                                         std::to_string(bad) + " of " +
                                         std::to_string(exp.size()) +
                                         " bytes wrong");
            }
        }
        if (rc == 0) {
            printf("D rank %u: %zu blocks x 2 layers byte-exact\n", rank,
                   kDIds.size());
        }
    }
    Api()->engine_destroy(eng);
    return rc;
}

bool ParseArgs(int argc, char **argv, Args *a)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--mode" && (v == "read" || v == "write")) {
            a->write = v == "write";
        } else if (k == "--p-tp") {
            a->p_tp = (uint32_t)atoi(v.c_str());
        } else if (k == "--d-tp") {
            a->d_tp = (uint32_t)atoi(v.c_str());
        } else if (k == "--heads") {
            a->heads = (uint32_t)atoi(v.c_str());
        } else {
            return false;
        }
    }
    return argc % 2 == 1 && a->p_tp >= 1 && a->p_tp <= 8 && a->d_tp >= 1 &&
           a->d_tp <= 8 && a->heads >= 1;
}

} // namespace

int main(int argc, char **argv)
{
    Args a;
    if (!ParseArgs(argc, argv, &a)) {
        fprintf(stderr, "usage: hnd_procs --mode read|write --p-tp N "
                        "--d-tp M --heads H\n");
        return 2;
    }
    uint16_t p_port = PortBase(16), d_port = (uint16_t)(p_port + 8);
    printf("%s: P tp%u -> D tp%u, %u KV heads, HND by strides\n",
           a.write ? "WRITE" : "READ", a.p_tp, a.d_tp, a.heads);
    fflush(stdout);

    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, nullptr);
    std::vector<pid_t> kids;
    for (int side = 0; side < 2; side++) {
        uint32_t n = side == 0 ? a.p_tp : a.d_tp;
        for (uint32_t r = 0; r < n; r++) {
            pid_t pid = fork();
            if (pid == 0) {
                sigprocmask(SIG_UNBLOCK, &chld, nullptr);
                int rc = RunRank(a, side == 0, r, p_port, d_port);
                fflush(stdout);
                _exit(rc);
            }
            if (pid < 0) {
                perror("fork");
                for (pid_t k : kids) {
                    kill(k, SIGKILL);
                }
                return 1;
            }
            kids.push_back(pid);
        }
    }
    // Every child within 120 s, or it is killed and the run fails: SIGCHLD
    // (blocked before the forks) is awaited with the time left.
    auto   deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int    failed   = 0;
    size_t left     = kids.size();
    while (left > 0) {
        int   status = 0;
        pid_t pid    = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            left--;
            failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            continue;
        }
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            fprintf(stderr, "ranks still running after 120 s: killed\n");
            for (pid_t k : kids) {
                kill(k, SIGKILL);
            }
            while (waitpid(-1, &status, 0) > 0) {
            }
            return 1;
        }
        auto            ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      deadline - now).count();
        struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
        sigtimedwait(&chld, nullptr, &ts);
    }
    printf("%s\n", failed ? "FAILED" : "OK");
    return failed ? 1 : 0;
}
