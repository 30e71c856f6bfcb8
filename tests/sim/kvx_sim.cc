// kvx_sim - runs seeded simulator scenarios (tests/sim/README.md).
//
//   kvx_sim --seeds 1..10000 [--scenario read|write|any] [--faults ci]
//   kvx_sim --seed 42 --scenario write --faults abort,crash --trace
//   kvx_sim --long           (1..1000000, or from --seeds' start)
//
// Prints one VIOLATION report per failing seed (with the replay command)
// and a summary; exits 1 if any seed failed. A crash or a hang of a seed
// (an engine fault, a deadlock) prints the seed and its replay command too.
#include "scenario.h"

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

using namespace sim;

namespace {

volatile sig_atomic_t g_running = 0;
char                  g_replay[512];
struct sigaction      g_old[32];

void Say(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

void OnFatal(int sig, siginfo_t *info, void *ctx)
{
    if (g_running) {
        Say(sig == SIGALRM ? "\nHANG (seed over its wall-clock budget): "
                           : "\nCRASH (signal) while running: ");
        Say(g_replay);
        Say("\n");
    }
    if (sig == SIGALRM) {
        _exit(3);
    }
    struct sigaction *old = &g_old[sig];
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction != nullptr) {
        old->sa_sigaction(sig, info, ctx);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void Install()
{
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL, SIGALRM}) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = OnFatal;
        sa.sa_flags     = SA_SIGINFO;
        sigaction(sig, &sa, &g_old[sig]);
    }
}

bool ParseRange(const char *s, uint64_t *a, uint64_t *b)
{
    char    *end;
    errno = 0;
    *a    = strtoull(s, &end, 10);
    if (errno || end == s) {
        return false;
    }
    if (*end == '\0') {
        *b = *a;
        return true;
    }
    if (strncmp(end, "..", 2) != 0) {
        return false;
    }
    const char *t = end + 2;
    *b = strtoull(t, &end, 10);
    return !errno && end != t && *end == '\0' && *b >= *a;
}

int Usage()
{
    fprintf(stderr,
            "usage: kvx_sim [--seed N | --seeds A..B | --long] "
            "[--scenario read|write|any] [--tp 1|2]\n"
            "               [--faults LIST|all|ci|none] [--trace] [--quiet] "
            "[--max-fail K] [--seed-timeout S]\n"
            "faults: abort preabort crash restart destroy junk forge dup delay "
            "reboot lag slow partition\n        (ci = crash,preabort,junk,dup,"
            "delay,destroy; all = every class)\n");
    return 2;
}

} // namespace

int main(int argc, char **argv)
{
    Options  o;
    uint64_t a = 1, b = 100, max_fail = 20;
    unsigned seed_timeout = 120;
    bool     lng = false;

    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : nullptr;
        std::string err;

        if ((arg == "--seed" || arg == "--seeds") && val != nullptr) {
            if (!ParseRange(val, &a, &b)) {
                return Usage();
            }
            i++;
        } else if (arg == "--scenario" && val != nullptr) {
            o.scenario = val;
            if (o.scenario != "read" && o.scenario != "write" &&
                o.scenario != "any") {
                return Usage();
            }
            i++;
        } else if (arg == "--faults" && val != nullptr) {
            if (!ParseFaults(val, &o.faults, &err)) {
                fprintf(stderr, "%s\n", err.c_str());
                return 2;
            }
            i++;
        } else if (arg == "--tp" && val != nullptr) {
            o.tp = (uint32_t)strtoul(val, nullptr, 10);
            if (o.tp != 1 && o.tp != 2) {
                return Usage();
            }
            i++;
        } else if (arg == "--max-fail" && val != nullptr) {
            max_fail = strtoull(val, nullptr, 10);
            i++;
        } else if (arg == "--seed-timeout" && val != nullptr) {
            seed_timeout = (unsigned)strtoul(val, nullptr, 10);
            i++;
        } else if (arg == "--trace") {
            o.trace = true;
        } else if (arg == "--quiet") {
            o.quiet = true;
        } else if (arg == "--long") {
            lng = true;
        } else {
            return Usage();
        }
    }
    if (lng) {
        b = a + 999999;
    }
    Install();
    setvbuf(stdout, nullptr, _IOLBF, 0);
    auto     t0 = std::chrono::steady_clock::now();
    uint64_t failed = 0, steps = 0, n = 0, recv = 0, fails = 0, crashes = 0;
    uint64_t reboots = 0, stale = 0;
    for (uint64_t s = a; s <= b; s++) {
        snprintf(g_replay, sizeof(g_replay), "%s",
                 ReplayCommand(s, o).c_str());
        g_running = 1;
        alarm(seed_timeout);
        Result r = RunSeed(s, o);
        alarm(0);
        g_running = 0;
        n++;
        steps += r.steps;
        recv += r.recv_ok;
        fails += r.failed;
        crashes += r.crashes;
        reboots += r.reboots;
        stale += r.stale_reads;
        if (!r.ok) {
            failed++;
            if (o.quiet) {
                printf("VIOLATION seed %" PRIu64 " step %" PRIu64 ": %s\n  "
                       "replay: %s\n", s, r.step, r.violation.c_str(),
                       ReplayCommand(s, o).c_str());
            }
            if (failed >= max_fail) {
                printf("stopping after %" PRIu64 " failed seeds\n", failed);
                break;
            }
        } else if (a == b) {
            printf("seed %" PRIu64 " ok: %s; %" PRIu64 " steps, %.3f virtual "
                   "s, %u transfers, %u received, %u failed events\n", s,
                   r.config.c_str(), r.steps, (double)r.virt_us / 1e6,
                   r.transfers, r.recv_ok, r.failed);
        }
        if (lng && n % 10000 == 0) {
            printf("... %" PRIu64 " seeds, %" PRIu64 " failed\n", n, failed);
        }
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now()
                                                - t0).count();
    printf("kvx_sim: %" PRIu64 " seeds (%" PRIu64 "..%" PRIu64 "), scenario "
           "%s, faults %s: %" PRIu64 " failed; %" PRIu64 " steps, %" PRIu64
           " transfers received OK, %" PRIu64 " failed events, %" PRIu64
           " crashes", n, a, a + n - 1, o.scenario.c_str(),
           FaultNames(o.faults).c_str(), failed, steps, recv, fails, crashes);
    if (reboots > 0 || stale > 0) {
        printf(", %" PRIu64 " reboots, %" PRIu64 " stale reads", reboots,
               stale);
    }
    printf("; %.1f s\n", wall);
    return failed ? 1 : 0;
}
