// rankhost.cc - the ranks of one instance that live on one host, for the
// multi-host test (tests/netns/run_netns.sh). One process per host; every
// rank is a real engine (UCX + nng) created in this process.
//
//   --role prefill   create the ranks, fill every block with the pattern of
//                    (host, global rank), producer_request the transfer,
//                    print READY, wait until every rank is released
//                    (FINISHED_SENDING).
//   --role decode    consumer_request per rank with explicit params naming
//                    P's rank-0 host, P's node_hosts and P's sizes; verify
//                    every byte against the pattern of the P rank and host the
//                    rank must have read, or the expected synchronous
//                    KVX_ERR_UNTRUSTED_PEER for --expect-fail-ranks.
//   --role listener  a plain TCP listener on --ports that counts accepted
//                    connections until SIGTERM/SIGINT/SIGUSR1 or --timeout;
//                    one --probe-port connection is expected (proves the
//                    listener can see connections), none on the other ports.
//
// --hold 1 keeps the engines after the result until a signal (so the other
// side can finish against live listeners); --destroy-threads and
// --destroy-on-done shape the teardown for the teardown-race cases.
//
// Output: "READY", "RANK <g> OK|FAIL ...", "RESULT ...", "HOLD",
// "STAT <g> <counter>=<n>" (prefill, each change of an --expect-stat counter),
// "TEARDOWN clean" (all engines destroyed), "ACCEPT host:port". Exit status
// 0 when every expected outcome happened, 1 otherwise, 2 on usage errors.
#include "../integ/harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace kvt;

namespace {

struct Opts {
    std::string              role;
    std::string              host_ip;
    uint32_t                 rank_lo = 0, rank_hi = 0;
    uint32_t                 tp = 1, dp = 1;
    uint32_t                 hs_port = 0, notify_port = 0;
    std::vector<std::string> node_hosts;
    std::string              peer_host;
    std::vector<std::string> peer_hosts;
    uint32_t                 peer_hs_port = 0, peer_notify_port = 0;
    uint32_t                 peer_tp = 0, peer_dp = 0; // 0: same as ours
    uint32_t                 heads = 0, peer_heads = 0; // 0: model default
    std::string              tls = "tcp";
    std::string              net_dev;
    bool                     has_trusted = false;
    std::vector<std::string> trusted;
    std::string              transfer = "tx-netns";
    bool                     has_fail = false;
    uint32_t                 fail_lo = 0, fail_hi = 0;
    std::vector<std::string> expect_error;
    double                   timeout = 60.0;
    double                   handshake_timeout = 5.0;
    std::vector<std::pair<uint32_t, uint32_t>> ports; // listener
    uint32_t                 probe_port = 0;
    bool                     hold = false;        // wait for a signal
    bool                     destroy_threads = false;
    uint32_t                 log_level = 1;
    bool                     destroy_on_done = false;
    std::string              request_id = "req-netns";
    std::string              config_extra;   // more engine config keys
    std::string              expect_refused; // decode: gets refused, text
    std::vector<std::string> expect_stat;    // prefill: counters >= 1
    bool                     write = false;  // WRITE mode (P pushes)
};

// Blocks: P owns 12 and exposes 6 scattered ones; D owns 10 and reads the
// last 5 of them (a prefix hit skips the first) into scattered local blocks.
const uint32_t              kPBlocks = 12;
const uint32_t              kDBlocks = 10;
const std::vector<uint64_t> kRemote  = {9, 2, 7, 11, 0, 5};
const std::vector<uint64_t> kLocal   = {3, 8, 1, 6, 4};

void Usage(const char *why)
{
    fprintf(stderr,
            "rankhost: %s\n"
            "usage: rankhost --role prefill|decode|listener --host-ip IP\n"
            "  [--ranks a-b --tp N --dp M --hs-port P --notify-port P\n"
            "   --node-hosts A,B --peer-host X --peer-hosts A,B\n"
            "   --peer-hs-port P --peer-notify-port P --peer-tp N --peer-dp M\n"
            "   --heads N --peer-heads N (sharded heterogeneous TP)\n"
            "   --tls tcp --net-dev DEV --trusted LIST --transfer T\n"
            "   --expect-fail-ranks a-b --expect-error TEXT (repeatable)\n"
            "   --ports a-b[,c-d] --probe-port P --timeout S\n"
            "   --handshake-timeout S --hold 0|1 --destroy-threads 0|1\n"
            "   --log-level 0-3 --destroy-on-done 0|1\n"
            "   --request-id ID --config-extra '\"key\":value,...'\n"
            "   --expect-refused TEXT (decode) --expect-stat COUNTER "
            "(prefill)\n"
            "   --write 0|1 (WRITE mode: prefill needs --peer-host, "
            "--peer-hs-port, --peer-notify-port)]\n",
            why);
    exit(2);
}

std::vector<std::string> SplitList(const std::string &s)
{
    std::vector<std::string> out;
    size_t                   start = 0;
    while (start <= s.size()) {
        size_t end = s.find(',', start);
        if (end == std::string::npos) {
            end = s.size();
        }
        if (end > start) {
            out.push_back(s.substr(start, end - start));
        }
        start = end + 1;
    }
    return out;
}

uint32_t ParseUint(const std::string &s, const char *what)
{
    char         *end = nullptr;
    unsigned long v   = strtoul(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v > 0xffffffffu) {
        std::string m = std::string(what) + ": not a number: '" + s + "'";
        Usage(m.c_str());
    }
    return (uint32_t)v;
}

void ParseRange(const std::string &s, const char *what, uint32_t *lo,
                uint32_t *hi)
{
    size_t dash = s.find('-');
    if (dash == std::string::npos) {
        *lo = *hi = ParseUint(s, what);
    } else {
        *lo = ParseUint(s.substr(0, dash), what);
        *hi = ParseUint(s.substr(dash + 1), what);
    }
    if (*lo > *hi) {
        Usage((std::string(what) + ": empty range").c_str());
    }
}

Opts ParseArgs(int argc, char **argv)
{
    Opts o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (i + 1 >= argc) {
            Usage(("missing value of " + a).c_str());
        }
        std::string v = argv[++i];
        if (a == "--role") {
            o.role = v;
        } else if (a == "--host-ip") {
            o.host_ip = v;
        } else if (a == "--ranks") {
            ParseRange(v, "--ranks", &o.rank_lo, &o.rank_hi);
        } else if (a == "--tp") {
            o.tp = ParseUint(v, "--tp");
        } else if (a == "--dp") {
            o.dp = ParseUint(v, "--dp");
        } else if (a == "--heads") {
            o.heads = ParseUint(v, "--heads");
        } else if (a == "--peer-heads") {
            o.peer_heads = ParseUint(v, "--peer-heads");
        } else if (a == "--hs-port") {
            o.hs_port = ParseUint(v, "--hs-port");
        } else if (a == "--notify-port") {
            o.notify_port = ParseUint(v, "--notify-port");
        } else if (a == "--node-hosts") {
            o.node_hosts = SplitList(v);
        } else if (a == "--peer-host") {
            o.peer_host = v;
        } else if (a == "--peer-hosts") {
            o.peer_hosts = SplitList(v);
        } else if (a == "--peer-hs-port") {
            o.peer_hs_port = ParseUint(v, "--peer-hs-port");
        } else if (a == "--peer-notify-port") {
            o.peer_notify_port = ParseUint(v, "--peer-notify-port");
        } else if (a == "--peer-tp") {
            o.peer_tp = ParseUint(v, "--peer-tp");
        } else if (a == "--peer-dp") {
            o.peer_dp = ParseUint(v, "--peer-dp");
        } else if (a == "--tls") {
            o.tls = v;
        } else if (a == "--net-dev") {
            o.net_dev = v;
        } else if (a == "--trusted") {
            o.has_trusted = true;
            o.trusted     = SplitList(v);
        } else if (a == "--transfer") {
            o.transfer = v;
        } else if (a == "--expect-fail-ranks") {
            o.has_fail = true;
            ParseRange(v, "--expect-fail-ranks", &o.fail_lo, &o.fail_hi);
        } else if (a == "--expect-error") {
            o.expect_error.push_back(v);
        } else if (a == "--timeout") {
            o.timeout = atof(v.c_str());
        } else if (a == "--handshake-timeout") {
            o.handshake_timeout = atof(v.c_str());
        } else if (a == "--ports") {
            for (const std::string &r : SplitList(v)) {
                uint32_t lo, hi;
                ParseRange(r, "--ports", &lo, &hi);
                o.ports.emplace_back(lo, hi);
            }
        } else if (a == "--log-level") {
            o.log_level = ParseUint(v, "--log-level");
        } else if (a == "--destroy-on-done") {
            o.destroy_on_done = ParseUint(v, "--destroy-on-done") != 0;
        } else if (a == "--hold") {
            o.hold = ParseUint(v, "--hold") != 0;
        } else if (a == "--destroy-threads") {
            o.destroy_threads = ParseUint(v, "--destroy-threads") != 0;
        } else if (a == "--probe-port") {
            o.probe_port = ParseUint(v, "--probe-port");
        } else if (a == "--request-id") {
            o.request_id = v;
        } else if (a == "--config-extra") {
            o.config_extra = v;
        } else if (a == "--expect-refused") {
            o.expect_refused = v;
        } else if (a == "--expect-stat") {
            o.expect_stat.push_back(v);
        } else if (a == "--write") {
            o.write = ParseUint(v, "--write") != 0;
        } else {
            Usage(("unknown option " + a).c_str());
        }
    }
    if (o.role != "prefill" && o.role != "decode" && o.role != "listener") {
        Usage("--role must be prefill, decode or listener");
    }
    if (o.host_ip.empty()) {
        Usage("--host-ip is required");
    }
    if (o.timeout <= 0) {
        Usage("--timeout must be > 0");
    }
    if (o.role == "listener") {
        if (o.ports.empty()) {
            Usage("--ports is required for the listener");
        }
        return o;
    }
    if (o.tp == 0 || o.dp == 0 || o.rank_hi >= o.tp * o.dp) {
        Usage("--ranks must lie within dp*tp");
    }
    if (o.hs_port == 0 || o.notify_port == 0) {
        Usage("--hs-port and --notify-port are required");
    }
    if (o.node_hosts.empty()) {
        o.node_hosts.push_back(o.host_ip);
    }
    if (o.role == "decode" || o.write) {
        if (o.peer_host.empty() || o.peer_hs_port == 0 ||
            o.peer_notify_port == 0) {
            Usage("decode and WRITE prefill need --peer-host, "
                  "--peer-hs-port, --peer-notify-port");
        }
        if (o.write && (o.peer_tp != 0 && o.peer_tp != o.tp)) {
            Usage("--write needs --peer-tp equal to --tp");
        }
        if (o.peer_tp == 0) {
            o.peer_tp = o.tp;
        }
        if (o.peer_dp == 0) {
            o.peer_dp = o.dp;
        }
        if (o.peer_dp != o.dp) {
            Usage("--peer-dp must equal --dp");
        }
        if (o.peer_tp != o.tp &&
            (o.heads == 0 || o.peer_heads == 0 ||
             o.heads * o.tp != o.peer_heads * o.peer_tp ||
             (o.tp > o.peer_tp ? o.tp % o.peer_tp : o.peer_tp % o.tp) != 0)) {
            Usage("--peer-tp != --tp needs --heads and --peer-heads with "
                  "heads x tp equal on both sides (sharded heads) and one "
                  "tp a multiple of the other");
        }
    }
    return o;
}

std::string JsonList(const std::vector<std::string> &v)
{
    std::string s = "[";
    for (size_t i = 0; i < v.size(); i++) {
        s += (i ? ",\"" : "\"") + v[i] + "\"";
    }
    return s + "]";
}

// Key of the data a rank holds: the pattern depends on the host that serves
// it AND the global rank, so a byte from the wrong rank or the wrong host
// (e.g. rank 8 of host A instead of rank 8 of host B) is detected.
uint32_t Key(const std::string &host, uint32_t global_rank)
{
    std::string s = host + "#" + std::to_string(global_rank);
    uint32_t    h = 2166136261u;
    for (unsigned char c : s) {
        h = (h ^ c) * 16777619u;
    }
    return h;
}

// MakeHostRank is kvt::MakeRank with DP coordinates, node_hosts and the
// trust list in the config, and the producer pattern keyed by `key`.
kvx_status_t MakeHostRank(const Opts &o, const ModelSpec &m, uint32_t g,
                          uint32_t key, Rank *r)
{
    bool     producer = o.role == "prefill";
    RankOpts ro;
    ro.producer          = producer;
    ro.read_mode         = !o.write;
    ro.tp_rank           = g % o.tp;
    ro.tp_size           = o.tp;
    ro.num_blocks        = producer ? kPBlocks : kDBlocks;
    ro.hs_port           = (uint16_t)o.hs_port;
    ro.notify_port       = (uint16_t)o.notify_port;
    ro.tls               = o.tls;
    ro.host              = o.host_ip;
    ro.handshake_timeout = o.handshake_timeout;
    ro.transfer_timeout  = o.timeout;
    ro.defer_timeout     = o.timeout + 30;
    ro.extra             = "\"node_hosts\":" + JsonList(o.node_hosts);
    if (o.has_trusted) {
        ro.extra += ",\"trusted_remote_hosts\":" + JsonList(o.trusted);
    }
    if (!o.net_dev.empty()) {
        ro.extra += ",\"ucx_net_devices\":\"" + o.net_dev + "\"";
    }
    if (!o.config_extra.empty()) {
        ro.extra += "," + o.config_extra;
    }
    std::string cfg = RankConfig(ro);
    // The DP coordinates are top-level identity keys (SPEC §1).
    cfg.insert(1, "\"dp_rank\":" + std::to_string(g / o.tp) +
                      ",\"dp_size\":" + std::to_string(o.dp) +
                      ",\"log_level\":" + std::to_string(o.log_level) + ",");

    kvx_status_t st = Api()->engine_create(cfg.c_str(), &r->eng);
    if (st != KVX_OK) {
        return st;
    }
    r->num_blocks = ro.num_blocks;
    r->tp_rank    = ro.tp_rank;
    r->bufs.resize(m.layers.size());
    r->descs.resize(m.layers.size());
    for (size_t li = 0; li < m.layers.size(); li++) {
        const LayerSpec &l   = m.layers[li];
        uint64_t         len = UnitLen(m, l) * Units(l) * ro.num_blocks;
        r->bufs[li].assign(len, 0xEE);
        if (producer) {
            for (uint64_t b = 0; b < ro.num_blocks; b++) {
                for (int u = 0; u < Units(l); u++) {
                    uint8_t *p = r->bufs[li].data() +
                                 UnitOffset(m, l, ro.num_blocks, b, u);
                    for (uint64_t i = 0; i < UnitLen(m, l); i++) {
                        p[i] = Pattern(key, (uint32_t)li, b, u, i);
                    }
                }
            }
        }
        Describe(m, l, ro.num_blocks, r->bufs[li].data(), len, &r->descs[li]);
        st = Api()->register_layer(r->eng, &r->descs[li]);
        if (st != KVX_OK) {
            return st;
        }
    }
    return Api()->start(r->eng);
}

int TimeoutMs(const Opts &o)
{
    return (int)(o.timeout * 1000);
}

// SIGTERM, SIGINT and SIGUSR1 are blocked in every thread (engine threads
// never see EINTR from them) and taken with sigtimedwait: the listener
// reports, --hold ends.
bool g_stop = false;

sigset_t StopSignals()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    return set;
}

// StopRequested waits up to wait_ms for a stop signal; latches g_stop.
bool StopRequested(int wait_ms)
{
    if (!g_stop) {
        sigset_t        set = StopSignals();
        struct timespec ts  = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
        if (sigtimedwait(&set, nullptr, &ts) > 0) {
            g_stop = true;
        }
    }
    return g_stop;
}

// Teardown: with --hold, keep the engines (and so this host's listeners and
// endpoints) alive until a signal or --timeout; then destroy every engine,
// one thread per engine with --destroy-threads. A crash while destroying
// shows as the process dying without "TEARDOWN clean".
void Teardown(const Opts &o, std::vector<std::unique_ptr<Rank>> *ranks)
{
    if (o.hold) {
        printf("HOLD\n");
        if (!WaitFor([] { return StopRequested(50); }, TimeoutMs(o))) {
            printf("HOLD ended by --timeout\n");
        }
    }
    if (o.destroy_threads) {
        std::vector<std::thread> th;
        for (auto &r : *ranks) {
            th.emplace_back([&r] { r.reset(); });
        }
        for (auto &t : th) {
            t.join();
        }
    }
    ranks->clear();
    printf("TEARDOWN clean\n");
}

// ModelOf: the test model, with --heads KV heads per rank (then 8 tokens
// per block, so the head axis of a block is never ambiguous).
ModelSpec ModelOf(const Opts &o)
{
    ModelSpec m = ThreeLayerModel();
    if (o.heads != 0) {
        m.heads      = o.heads;
        m.block_size = 8;
    }
    return m;
}

// --- prefill -------------------------------------------------------------

int RunPrefill(const Opts &o)
{
    ModelSpec                          m = ModelOf(o);
    std::vector<std::unique_ptr<Rank>> ranks;
    for (uint32_t g = o.rank_lo; g <= o.rank_hi; g++) {
        ranks.emplace_back(new Rank);
        kvx_status_t st = MakeHostRank(o, m, g, Key(o.host_ip, g),
                                       ranks.back().get());
        if (st != KVX_OK) {
            printf("RANK %u FAIL create: %s: %s\n", g, Api()->status_name(st),
                   Api()->last_error());
            printf("RESULT prefill %s: 0 ok, 1 failed\n", o.host_ip.c_str());
            return 1;
        }
    }
    std::string pp = "{\"transfer_id\":\"" + o.transfer +
                     "\",\"do_remote_decode\":true";
    if (o.write) {
        // WRITE: P names D and pushes as many blocks as D receives (the
        // last ones of kRemote, the blocks a READ decode rank would read).
        pp += ",\"remote_host\":\"" + o.peer_host +
              "\",\"remote_handshake_port\":" + std::to_string(o.peer_hs_port) +
              ",\"remote_notify_port\":" + std::to_string(o.peer_notify_port) +
              ",\"remote_tp_size\":" + std::to_string(o.tp);
    }
    pp += "}";
    const std::vector<uint64_t> ids =
        o.write ? std::vector<uint64_t>(kRemote.end() - kLocal.size(),
                                        kRemote.end())
                : kRemote;
    for (size_t k = 0; k < ranks.size(); k++) {
        char        *resp = nullptr;
        uint32_t     g    = o.rank_lo + (uint32_t)k;
        kvx_status_t st   = Api()->producer_request(
            ranks[k]->eng, o.request_id.c_str(), pp.c_str(), ids.data(),
            ids.size(), &resp);
        if (st != KVX_OK) {
            printf("RANK %u FAIL producer_request: %s: %s\n", g,
                   Api()->status_name(st), Api()->last_error());
            return 1;
        }
        // P's response carries its node_hosts as remote_hosts (SPEC §3).
        std::string r = resp;
        Api()->free(resp);
        if (r.find("\"remote_hosts\"") == std::string::npos ||
            r.find(o.node_hosts.back()) == std::string::npos) {
            printf("RANK %u FAIL response lacks remote_hosts: %s\n", g,
                   r.c_str());
            return 1;
        }
        for (uint32_t l = 0; o.write && l < m.layers.size(); l++) {
            st = Api()->layer_ready(ranks[k]->eng, o.transfer.c_str(), l);
            if (st != KVX_OK) {
                printf("RANK %u FAIL layer_ready %u: %s: %s\n", g, l,
                       Api()->status_name(st), Api()->last_error());
                return 1;
            }
        }
        if (o.write && (st = Api()->seal_transfer(ranks[k]->eng,
                                                   o.transfer.c_str())) !=
                           KVX_OK) {
            printf("RANK %u FAIL seal_transfer: %s: %s\n", g,
                   Api()->status_name(st), Api()->last_error());
            return 1;
        }
    }
    printf("READY prefill %s ranks %u-%u\n", o.host_ip.c_str(), o.rank_lo,
           o.rank_hi);
    fflush(stdout);

    // Every local rank must be released by its decode rank.
    std::vector<int>         sent(ranks.size(), 0);
    std::vector<std::string> bad(ranks.size());
    std::vector<std::vector<long long>> seen(
        ranks.size(), std::vector<long long>(o.expect_stat.size(), 0));
    WaitFor(
        [&] {
            bool all = true;
            for (size_t k = 0; k < ranks.size(); k++) {
                std::vector<kvx_event_t> evs;
                // "STAT <rank> <counter>=<n>" as an expected counter moves
                // (a script waits on it instead of guessing when an attack
                // was processed).
                for (size_t c = 0; c < o.expect_stat.size(); c++) {
                    long long n = StatCount(ranks[k]->eng, o.expect_stat[c]);
                    if (n != seen[k][c]) {
                        seen[k][c] = n;
                        printf("STAT %u %s=%lld\n", o.rank_lo + (uint32_t)k,
                               o.expect_stat[c].c_str(), n);
                        fflush(stdout);
                    }
                }
                DrainEvents(ranks[k]->eng, &evs);
                for (const kvx_event_t &e : evs) {
                    if (e.type == KVX_EVENT_FINISHED_SENDING &&
                        o.transfer == e.transfer_id &&
                        e.num_block_ids == ids.size()) {
                        sent[k]++;
                    } else {
                        bad[k] += std::string(" unexpected event type ") +
                                  std::to_string(e.type) + " " +
                                  Api()->status_name(e.status) + " " +
                                  e.reason;
                    }
                }
                FreeEvents(&evs);
                all = all && sent[k] > 0;
            }
            return all;
        },
        TimeoutMs(o));
    int ok = 0, failed = 0;
    for (size_t k = 0; k < ranks.size(); k++) {
        uint32_t g = o.rank_lo + (uint32_t)k;
        std::string stats;
        for (const std::string &c : o.expect_stat) {
            long long n = StatCount(ranks[k]->eng, c);
            stats += " " + c + "=" + std::to_string(n);
            if (n < 1) {
                bad[k] += " counter " + c + " is " + std::to_string(n) +
                          ", want >= 1";
            }
        }
        if (sent[k] == 1 && bad[k].empty()) {
            printf("RANK %u OK released (FINISHED_SENDING)%s\n", g,
                   stats.c_str());
            ok++;
        } else {
            printf("RANK %u FAIL finished_sending=%d within %.0f s%s\n", g,
                   sent[k], o.timeout, bad[k].c_str());
            failed++;
        }
    }
    printf("RESULT prefill %s: %d ok, %d failed\n", o.host_ip.c_str(), ok,
           failed);
    Teardown(o, &ranks);
    return failed == 0 ? 0 : 1;
}

// --- decode --------------------------------------------------------------

// Host of P's global rank pg by the layout the instance publishes: ranks in
// order over node_hosts (SPEC §4). Computed here from the test's own
// layout, not by the library.
std::string ExpectedHost(const Opts &o, uint32_t pg)
{
    if (o.peer_hosts.size() <= 1) {
        return o.peer_host;
    }
    uint32_t per_host = o.peer_tp * o.peer_dp / (uint32_t)o.peer_hosts.size();
    return o.peer_hosts[pg / per_host];
}

int RunDecode(const Opts &o)
{
    ModelSpec                          m = ModelOf(o);
    std::vector<std::unique_ptr<Rank>> ranks;
    for (uint32_t g = o.rank_lo; g <= o.rank_hi; g++) {
        ranks.emplace_back(new Rank);
        kvx_status_t st = MakeHostRank(o, m, g, 0, ranks.back().get());
        if (st != KVX_OK) {
            printf("RANK %u FAIL create: %s: %s\n", g, Api()->status_name(st),
                   Api()->last_error());
            printf("RESULT decode %s: 0 ok, 1 failed\n", o.host_ip.c_str());
            return 1;
        }
    }
    std::string more;
    if (!o.peer_hosts.empty()) {
        more += ",\"remote_hosts\":" + JsonList(o.peer_hosts);
    }
    more += ",\"remote_dp_size\":" + std::to_string(o.peer_dp);

    // wait_one waits for rank k's transfer (one deadline for all ranks). With
    // --destroy-on-done it destroys the engine the moment the transfer
    // completed (the buffers stay for the check; the release the rank owes
    // its P rank may still be queued then), and the ranks run one after
    // the other, each started after the previous one was destroyed.
    struct Done {
        kvx_status_t             st = KVX_ERR_INTERNAL;
        std::string              err;
        std::vector<kvx_event_t> evs;
    };
    std::vector<Done> done(ranks.size());
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(TimeoutMs(o));
    auto wait_one = [&](size_t k) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
        done[k].st  = Api()->wait_transfer(ranks[k]->eng, o.transfer.c_str(),
                                           left > 0 ? left : 0);
        done[k].err = done[k].st == KVX_OK ? "" : Api()->last_error();
        DrainEvents(ranks[k]->eng, &done[k].evs);
        if (o.destroy_on_done && done[k].st == KVX_OK) {
            Api()->engine_destroy(ranks[k]->eng);
            ranks[k]->eng = nullptr;
        }
    };
    std::vector<int>         expect_fail(ranks.size(), 0);
    std::vector<std::string> verdict(ranks.size());
    std::vector<int>         started(ranks.size(), 0);
    for (size_t k = 0; k < ranks.size(); k++) {
        uint32_t g  = o.rank_lo + (uint32_t)k;
        uint32_t dp = g / o.tp;
        expect_fail[k] = o.has_fail && g >= o.fail_lo && g <= o.fail_hi;
        std::string params =
            Params(o.transfer, o.peer_host, (uint16_t)o.peer_hs_port,
                   (uint16_t)o.peer_notify_port, kRemote, o.peer_tp,
                   more + ",\"remote_dp_rank\":" + std::to_string(dp));
        kvx_status_t st = Api()->consumer_request(
            ranks[k]->eng, o.request_id.c_str(), params.c_str(),
            kLocal.data(),
            kLocal.size());
        std::string err = st == KVX_OK ? "" : Api()->last_error();
        if (!expect_fail[k]) {
            if (st != KVX_OK) {
                verdict[k] = std::string("consumer_request: ") +
                             Api()->status_name(st) + ": " + err;
            } else {
                started[k] = 1;
                if (o.destroy_on_done) {
                    wait_one(k);
                }
            }
            continue;
        }
        if (st != KVX_ERR_UNTRUSTED_PEER) {
            verdict[k] = std::string("want synchronous KVX_ERR_UNTRUSTED_PEER, "
                                     "got ") +
                         Api()->status_name(st) + (err.empty() ? "" : ": ") +
                         err;
            if (st == KVX_OK) {
                started[k] = 1; // still drain its outcome below
            }
            continue;
        }
        for (const std::string &want : o.expect_error) {
            if (err.find(want) == std::string::npos) {
                verdict[k] += "error text lacks '" + want + "': " + err;
                break;
            }
        }
        if (verdict[k].empty()) {
            printf("RANK %u OK rejected as expected: %s\n", g, err.c_str());
        }
    }

    printf("READY decode %s ranks %u-%u requested\n", o.host_ip.c_str(),
           o.rank_lo, o.rank_hi);
    fflush(stdout);
    for (size_t k = 0; k < ranks.size(); k++) {
        if (started[k] && !o.destroy_on_done) {
            wait_one(k);
        }
    }
    for (size_t k = 0; k < ranks.size(); k++) {
        uint32_t g  = o.rank_lo + (uint32_t)k;
        uint32_t pg = (g / o.tp) * o.peer_tp + g % o.tp;
        std::vector<kvx_event_t> &evs = done[k].evs;
        if (!started[k] || !verdict[k].empty()) {
            FreeEvents(&evs);
            continue; // not started, or an expected rejection that was not
        }
        if (!o.expect_refused.empty()) {
            // A thief: its gets must be refused (FAILED naming the reason)
            // and not one byte of P's may have landed in its blocks.
            std::string why = done[k].err, diff;
            for (const kvx_event_t &e : evs) {
                why += std::string(" [event ") + std::to_string(e.type) +
                       " " + e.reason + "]";
            }
            FreeEvents(&evs);
            diff = VerifyPull(m, *ranks[k], 0, {}, {});
            if (done[k].st == KVX_OK) {
                verdict[k] = "want the transfer refused, it completed";
            } else if (why.find(o.expect_refused) == std::string::npos) {
                verdict[k] = "failure lacks '" + o.expect_refused + "': " +
                             Api()->status_name(done[k].st) + ": " + why;
            } else if (!diff.empty()) {
                verdict[k] = "refused rank's blocks changed: " + diff;
            } else {
                printf("RANK %u OK refused, blocks untouched: %s: %s\n", g,
                       Api()->status_name(done[k].st), why.c_str());
            }
            continue;
        }
        if (done[k].st != KVX_OK) {
            verdict[k] = std::string("wait_transfer: ") +
                         Api()->status_name(done[k].st) + ": " + done[k].err;
            for (const kvx_event_t &e : evs) {
                verdict[k] += std::string(" [event ") + std::to_string(e.type) +
                              " " + e.reason + "]";
            }
            FreeEvents(&evs);
            continue;
        }
        if (o.peer_tp != o.tp) {
            /* Sharded heterogeneous TP: a head slice of one P rank, or
             * parts from r P ranks, each on the host it resolves to. */
            uint32_t              t = g % o.tp, dp = g / o.tp, slice = 0;
            std::vector<uint32_t> keys;
            std::string           from;
            if (o.tp > o.peer_tp) {
                uint32_t q = o.tp / o.peer_tp;
                pg    = dp * o.peer_tp + t / q;
                slice = t % q;
                keys.push_back(Key(ExpectedHost(o, pg), pg));
                from = "head slice " + std::to_string(slice) + " of P rank " +
                       std::to_string(pg) + " on " + ExpectedHost(o, pg);
            } else {
                uint32_t r = o.peer_tp / o.tp;
                from       = "heads from P ranks";
                for (uint32_t j = 0; j < r; j++) {
                    uint32_t pj = dp * o.peer_tp + t * r + j;
                    keys.push_back(Key(ExpectedHost(o, pj), pj));
                    from += " " + std::to_string(pj) + "@" +
                            ExpectedHost(o, pj);
                }
            }
            std::string diff = VerifyPullHeads(m, o.peer_heads, *ranks[k],
                                               keys, slice, kLocal, kRemote);
            if (!diff.empty()) {
                verdict[k] = from + " expected: " + diff;
            } else if (evs.size() != 1 ||
                       evs[0].type != KVX_EVENT_FINISHED_RECVING) {
                verdict[k] = "want one FINISHED_RECVING event, got " +
                             std::to_string(evs.size()) + " events";
            } else {
                printf("RANK %u (dp%u,tp%u) OK read %s, every byte\n", g, dp,
                       t, from.c_str());
            }
            FreeEvents(&evs);
            continue;
        }
        std::string host = ExpectedHost(o, pg);
        std::string diff =
            VerifyPull(m, *ranks[k], Key(host, pg), kLocal, kRemote);
        if (!diff.empty()) {
            // Name the source the data did come from, when it is one of P's.
            std::string src;
            for (const std::string &h : o.peer_hosts) {
                for (uint32_t r = 0; r < o.peer_tp * o.peer_dp; r++) {
                    if (VerifyPull(m, *ranks[k], Key(h, r), kLocal, kRemote)
                            .empty()) {
                        src = " (data is P rank " + std::to_string(r) +
                              " of host " + h + ")";
                    }
                }
            }
            verdict[k] = "data of P rank " + std::to_string(pg) + " on " +
                         host + " expected: " + diff + src;
        } else if (evs.size() != 1 ||
                   evs[0].type != KVX_EVENT_FINISHED_RECVING ||
                   o.transfer != evs[0].transfer_id) {
            verdict[k] = "want one FINISHED_RECVING event, got " +
                         std::to_string(evs.size()) + " events";
        } else {
            printf("RANK %u (dp%u,tp%u) OK read P rank %u (dp%u,tp%u) of host "
                   "%s, every byte\n", g, g / o.tp, g % o.tp, pg,
                   pg / o.peer_tp, pg % o.peer_tp, host.c_str());
        }
        FreeEvents(&evs);
    }
    // A rejected rank must not have touched its blocks nor raised events.
    for (size_t k = 0; k < ranks.size(); k++) {
        if (!expect_fail[k] || !verdict[k].empty()) {
            continue;
        }
        std::string diff = VerifyPull(m, *ranks[k], 0, {}, {});
        std::vector<kvx_event_t> evs;
        DrainEvents(ranks[k]->eng, &evs);
        if (!diff.empty()) {
            verdict[k] = "rejected rank's blocks changed: " + diff;
        } else if (!evs.empty()) {
            verdict[k] = "rejected rank raised " + std::to_string(evs.size()) +
                         " events";
        }
        FreeEvents(&evs);
    }
    int ok = 0, failed = 0;
    for (size_t k = 0; k < ranks.size(); k++) {
        if (verdict[k].empty()) {
            ok++;
        } else {
            printf("RANK %u FAIL %s\n", o.rank_lo + (uint32_t)k,
                   verdict[k].c_str());
            failed++;
        }
    }
    printf("RESULT decode %s: %d ok, %d failed\n", o.host_ip.c_str(), ok,
           failed);
    Teardown(o, &ranks);
    return failed == 0 ? 0 : 1;
}

// --- listener ------------------------------------------------------------

int Listen(const std::string &ip, uint32_t port)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port   = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip.c_str(), &sa.sin_addr) != 1) {
        fprintf(stderr, "listener: bad IPv4 address %s\n", ip.c_str());
        return -1;
    }
    int fd  = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(fd, 64) != 0) {
        fprintf(stderr, "listener: %s:%u: %s\n", ip.c_str(), port,
                strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

int RunListener(const Opts &o)
{
    std::vector<struct pollfd> pfds;
    std::vector<uint32_t>      port_of;
    std::map<uint32_t, int>    count;
    std::vector<uint32_t>      all;
    for (const auto &r : o.ports) {
        for (uint32_t p = r.first; p <= r.second; p++) {
            all.push_back(p);
        }
    }
    if (o.probe_port != 0) {
        all.push_back(o.probe_port);
    }
    for (uint32_t p : all) {
        int fd = Listen(o.host_ip, p);
        if (fd < 0) {
            return 1;
        }
        pfds.push_back({fd, POLLIN, 0});
        port_of.push_back(p);
        count[p] = 0;
    }
    printf("READY listener %s on %zu ports\n", o.host_ip.c_str(), all.size());
    fflush(stdout);

    auto end = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(TimeoutMs(o));
    bool last = false;
    while (true) {
        int n = poll(pfds.data(), pfds.size(), last ? 0 : 50);
        for (size_t i = 0; n > 0 && i < pfds.size(); i++) {
            if (pfds[i].revents & POLLIN) {
                int c;
                while ((c = accept(pfds[i].fd, nullptr, nullptr)) >= 0) {
                    count[port_of[i]]++;
                    printf("ACCEPT %s:%u\n", o.host_ip.c_str(), port_of[i]);
                    fflush(stdout);
                    close(c);
                }
            }
        }
        if (last) {
            break;
        }
        // One more sweep after the stop request collects queued connects.
        last = StopRequested(0) || std::chrono::steady_clock::now() >= end;
    }
    int others = 0;
    for (const auto &pc : count) {
        if (pc.first != o.probe_port || o.probe_port == 0) {
            others += pc.second;
        }
    }
    int probe = o.probe_port ? count[o.probe_port] : -1;
    for (const struct pollfd &p : pfds) {
        close(p.fd);
    }
    printf("RESULT listener %s: %d connections on watched ports, probe %d%s\n",
           o.host_ip.c_str(), others, probe,
           g_stop ? "" : " (stopped by --timeout)");
    return others == 0 && (o.probe_port == 0 || probe == 1) ? 0 : 1;
}

} // namespace

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    Opts o = ParseArgs(argc, argv);
    sigset_t stop = StopSignals();
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    if (o.role == "listener") {
        return RunListener(o);
    }
    return o.role == "prefill" ? RunPrefill(o) : RunDecode(o);
}
