// test_dlopen.cc - libkvxfer.so used exactly as a serving framework uses it:
// dlopen() the shared object, resolve only "kvx_get_api", and go through
// the versioned function table for everything (SPEC §13). Real engines,
// real UCX (tcp on 127.0.0.1) and real nng.
#include <kvxfer/kvxfer.h>

#include <gtest/gtest.h>
#include <json-c/json.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifndef KVX_SO_PATH
#error "KVX_SO_PATH must name the built libkvxfer.so"
#endif

namespace {

// --- loading ---------------------------------------------------------------

// One dlopen() reference to the library and its table.
struct Lib {
    void            *handle = nullptr;
    const kvx_api_t *api    = nullptr;
    std::string      error;

    Lib()
    {
        // A serving framework keeps its plugin loaded. Tests that only need
        // the table hold one extra reference for the whole process, so that
        // their dlclose() never unloads the library (the unload cycles are
        // OpenUseCloseThreeTimes' business, in a child process of its own).
        static void *keep = dlopen(KVX_SO_PATH, RTLD_NOW | RTLD_LOCAL);
        (void)keep;
        handle = dlopen(KVX_SO_PATH, RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            const char *e = dlerror();
            error = std::string("dlopen " KVX_SO_PATH ": ") + (e ? e : "?");
            return;
        }
        auto get = reinterpret_cast<kvx_get_api_fn_t>(
            dlsym(handle, KVX_ENTRY_POINT_NAME));
        if (get == nullptr) {
            error = "dlsym kvx_get_api failed";
            return;
        }
        api = get(KVX_ABI_MAJOR);
        if (api == nullptr) {
            error = "kvx_get_api(KVX_ABI_MAJOR) returned NULL";
        }
    }
    ~Lib()
    {
        if (handle != nullptr) {
            dlclose(handle);
        }
    }
    Lib(const Lib &)            = delete;
    Lib &operator=(const Lib &) = delete;
};

// Ports: a window of 200 per process in [12600, 17600) (this binary uses
// about 130): below Linux's ephemeral range (32768+, where outgoing
// connections of any process may hold a port) and clear of the integration
// harness ([2000, 12500) and +20000) and of kvxfer_demo's probe range
// [17600, 22000).
uint16_t NextPorts(int n)
{
    constexpr int kWindow = 200;
    static int    next    = 0;
    const int     base    = 12600 + (int)(getpid() % 25) * kWindow;
    if (next + n > kWindow) {
        next = 0;
    }
    int p = base + next;
    next += n;
    return (uint16_t)p;
}

bool WaitFor(const std::function<bool()> &cond, int timeout_ms)
{
    auto end = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(timeout_ms);
    while (!cond()) {
        if (std::chrono::steady_clock::now() >= end) {
            return cond();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

// --- a small model: split K/V layers [2, NB, 4, 2, 16] bf16 ---------------

constexpr uint32_t kBS = 4, kHeads = 2, kDim = 16, kElem = 2;
constexpr uint64_t kUnit = (uint64_t)kBS * kHeads * kDim * kElem; // 256 B

uint8_t Pattern(uint32_t layer, uint64_t block, int unit, uint64_t i)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t x : {(uint64_t)layer, block, (uint64_t)unit, i}) {
        h = (h ^ x) * 1099511628211ull;
    }
    return (uint8_t)(h >> 31);
}

uint64_t UnitOff(uint32_t nb, uint64_t block, int unit)
{
    return ((uint64_t)unit * nb + block) * kUnit;
}

struct Engine {
    const kvx_api_t                  *api = nullptr;
    kvx_engine_t                     *eng = nullptr;
    uint32_t                          nb  = 0;
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<std::string>          names;
    uint16_t                          hs = 0, notify = 0;

    ~Engine()
    {
        if (api != nullptr) {
            api->engine_destroy(eng);
        }
    }
};

std::string Config(bool producer, uint16_t hs, uint16_t notify,
                   const std::string &extra = "")
{
    char buf[1024];
    snprintf(buf, sizeof(buf),
             "{\"role\":\"%s\",\"tp_rank\":0,\"tp_size\":1,"
             "\"kv_connector_extra_config\":{\"host_ip\":\"127.0.0.1\","
             "\"handshake_port\":%u,\"notify_port\":%u,\"read_mode\":true,"
             "\"node_hosts\":[\"127.0.0.1\"],\"ucx_tls\":\"tcp\","
             "\"handshake_timeout\":5,\"transfer_timeout\":20,"
             "\"defer_timeout\":30%s}}",
             producer ? "kv_producer" : "kv_consumer", hs, notify,
             extra.c_str());
    return buf;
}

kvx_layer_desc_t Desc(const std::string &name, uint8_t *base, uint32_t nb)
{
    kvx_layer_desc_t d;
    memset(&d, 0, sizeof(d));
    d.struct_size  = sizeof(d);
    d.name         = name.c_str();
    d.base         = base;
    d.length       = 2 * nb * kUnit;
    d.mem_type     = KVX_MEM_HOST;
    d.ndim         = 5;
    int64_t s[5]   = {2, nb, kBS, kHeads, kDim};
    memcpy(d.shape, s, sizeof(s));
    int64_t stride = 1;
    for (int k = 4; k >= 0; k--) {
        d.stride[k] = stride;
        stride *= d.shape[k];
    }
    d.elem_size    = kElem;
    d.block_size   = kBS;
    d.num_kv_heads = kHeads;
    d.head_size    = kDim;
    return d;
}

// Creates, registers `layers` layers (P: pattern, D: 0xEE) and starts.
::testing::AssertionResult MakeEngine(const kvx_api_t *api, bool producer,
                                      uint32_t nb, uint32_t layers,
                                      Engine *e, const std::string &extra = "")
{
    e->api    = api;
    e->nb     = nb;
    e->hs     = NextPorts(2);
    e->notify = (uint16_t)(e->hs + 1);
    std::string  cfg = Config(producer, e->hs, e->notify, extra);
    kvx_status_t st  = api->engine_create(cfg.c_str(), &e->eng);
    if (st != KVX_OK) {
        return ::testing::AssertionFailure()
               << "engine_create: " << api->status_name(st) << ": "
               << api->last_error();
    }
    e->bufs.resize(layers);
    e->names.resize(layers);
    for (uint32_t l = 0; l < layers; l++) {
        e->names[l] = "model.layers." + std::to_string(l) + ".self_attn";
        e->bufs[l].assign(2 * nb * kUnit, 0xEE);
        if (producer) {
            for (uint64_t b = 0; b < nb; b++) {
                for (int u = 0; u < 2; u++) {
                    uint8_t *p = e->bufs[l].data() + UnitOff(nb, b, u);
                    for (uint64_t i = 0; i < kUnit; i++) {
                        p[i] = Pattern(l, b, u, i);
                    }
                }
            }
        }
        kvx_layer_desc_t d = Desc(e->names[l], e->bufs[l].data(), nb);
        st                 = api->register_layer(e->eng, &d);
        if (st != KVX_OK) {
            return ::testing::AssertionFailure()
                   << "register_layer: " << api->status_name(st) << ": "
                   << api->last_error();
        }
    }
    st = api->start(e->eng);
    if (st != KVX_OK) {
        return ::testing::AssertionFailure()
               << "start: " << api->status_name(st) << ": "
               << api->last_error();
    }
    return ::testing::AssertionSuccess();
}

// D's buffers hold P's blocks remote[i] at local[i], 0xEE elsewhere.
std::string Verify(const Engine &d, const std::vector<uint64_t> &local,
                   const std::vector<uint64_t> &remote)
{
    for (uint32_t l = 0; l < d.bufs.size(); l++) {
        std::vector<uint8_t> want(d.bufs[l].size(), 0xEE);
        for (size_t k = 0; k < local.size(); k++) {
            for (int u = 0; u < 2; u++) {
                uint8_t *p = want.data() + UnitOff(d.nb, local[k], u);
                for (uint64_t i = 0; i < kUnit; i++) {
                    p[i] = Pattern(l, remote[k], u, i);
                }
            }
        }
        for (size_t i = 0; i < want.size(); i++) {
            if (want[i] != d.bufs[l][i]) {
                return "layer " + std::to_string(l) + " byte " +
                       std::to_string(i) + ": got " +
                       std::to_string(d.bufs[l][i]) + " want " +
                       std::to_string(want[i]);
            }
        }
    }
    return "";
}

std::vector<kvx_event_t> Drain(const kvx_api_t *api, kvx_engine_t *eng)
{
    std::vector<kvx_event_t> out;
    kvx_event_t              evs[8];
    int                      n;
    while ((n = api->poll_events(eng, evs, 8)) > 0) {
        out.insert(out.end(), evs, evs + n);
    }
    return out;
}

void FreeEvents(const kvx_api_t *api, std::vector<kvx_event_t> *evs)
{
    for (auto &e : *evs) {
        api->free(e.block_ids);
    }
    evs->clear();
}

std::string RequestId(const Engine &p, const Engine &d)
{
    return "___prefill_addr_host:127.0.0.1,handshake:" + std::to_string(p.hs) +
           ",notify:" + std::to_string(p.notify) +
           "___decode_addr_host:127.0.0.1,handshake:" + std::to_string(d.hs) +
           ",notify:" + std::to_string(d.notify) +
           "_0123456789abcdef0123456789abcdef";
}

// Runs one READ transfer P -> D through the table; D's params come from
// P's response via build_decode_params. Returns "" or what went wrong (no
// gtest assertions: also used in a death-test child). *resp_out gets P's
// response params.
std::string Transfer(const kvx_api_t *api, Engine *p, Engine *d,
                     const std::string &tid, const std::vector<uint64_t> &pids,
                     const std::vector<uint64_t> &dids,
                     std::string *resp_out = nullptr)
{
    auto fail = [&](const std::string &what, kvx_status_t st) {
        return what + ": " + api->status_name(st) + ": " + api->last_error();
    };
    const std::string rid = RequestId(*p, *d);
    std::string       pp  = "{\"transfer_id\":\"" + tid +
                     "\",\"do_remote_decode\":true}";
    char        *resp = nullptr;
    kvx_status_t st   = api->producer_request(p->eng, rid.c_str(), pp.c_str(),
                                              pids.data(), pids.size(), &resp);
    if (st != KVX_OK || resp == nullptr) {
        return fail("producer_request", st);
    }
    std::string response = resp;
    api->free(resp);
    if (resp_out != nullptr) {
        *resp_out = response;
    }
    char *dp = nullptr;
    st       = api->build_decode_params(response.c_str(), tid.c_str(), &dp);
    if (st != KVX_OK) {
        return fail("build_decode_params(" + response + ")", st);
    }
    std::string dparams = dp;
    api->free(dp);
    for (auto &b : d->bufs) {
        std::fill(b.begin(), b.end(), 0xEE); // fresh cache for this request
    }
    st = api->consumer_request(d->eng, rid.c_str(), dparams.c_str(),
                               dids.data(), dids.size());
    if (st != KVX_OK) {
        return fail("consumer_request(" + dparams + ")", st);
    }
    for (uint32_t l = 0; l < d->bufs.size(); l++) {
        st = api->wait_layer(d->eng, tid.c_str(), l, 20000);
        if (st != KVX_OK) {
            return fail("wait_layer " + std::to_string(l), st);
        }
    }
    st = api->wait_transfer(d->eng, tid.c_str(), 20000);
    if (st != KVX_OK) {
        return fail("wait_transfer", st);
    }
    std::string bad = Verify(*d, dids, pids);
    if (!bad.empty()) {
        return "D's cache after " + tid + ": " + bad;
    }

    std::vector<kvx_event_t> dev = Drain(api, d->eng), pev;
    std::string              err;
    if (dev.size() != 1 || dev[0].type != KVX_EVENT_FINISHED_RECVING ||
        dev[0].status != KVX_OK || tid != dev[0].transfer_id) {
        err = "D: expected one FINISHED_RECVING for " + tid + ", got " +
              std::to_string(dev.size()) + " events" +
              (dev.empty() ? std::string()
                           : std::string(", first type ") +
                                 std::to_string(dev[0].type) + " " +
                                 dev[0].transfer_id + " " + dev[0].reason);
    }
    FreeEvents(api, &dev);
    if (!err.empty()) {
        return err;
    }
    WaitFor([&] {
        auto more = Drain(api, p->eng);
        pev.insert(pev.end(), more.begin(), more.end());
        return !pev.empty();
    }, 10000);
    if (pev.size() != 1 || pev[0].type != KVX_EVENT_FINISHED_SENDING ||
        pev[0].status != KVX_OK || tid != pev[0].transfer_id) {
        err = "P: expected one FINISHED_SENDING for " + tid + " within 10 s, "
              "got " + std::to_string(pev.size()) + " events" +
              (pev.empty() ? std::string()
                           : std::string(", first type ") +
                                 std::to_string(pev[0].type) + " " +
                                 pev[0].transfer_id + " " + pev[0].reason);
    } else {
        std::vector<uint64_t> got(pev[0].block_ids,
                                  pev[0].block_ids + pev[0].num_block_ids);
        std::vector<uint64_t> want = pids;
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        if (got != want) {
            err = "P: FINISHED_SENDING lists " + std::to_string(got.size()) +
                  " blocks, not the " + std::to_string(want.size()) +
                  " it held";
        }
    }
    FreeEvents(api, &pev);
    return err;
}

// JSON helpers (json-c, for parsing what the library returns).
struct Json {
    json_object *o;
    explicit Json(const std::string &s) : o(json_tokener_parse(s.c_str())) {}
    ~Json() { json_object_put(o); }
    json_object *Get(const char *key) const
    {
        json_object *v = nullptr;
        return o != nullptr && json_object_object_get_ex(o, key, &v) ? v
                                                                     : nullptr;
    }
    std::string Str(const char *key) const
    {
        json_object *v = Get(key);
        return v != nullptr && json_object_is_type(v, json_type_string)
                   ? json_object_get_string(v)
                   : "<missing " + std::string(key) + ">";
    }
    int64_t Int(const char *key) const
    {
        json_object *v = Get(key);
        return v != nullptr && json_object_is_type(v, json_type_int)
                   ? json_object_get_int64(v)
                   : -12345;
    }
};

// --- (a) entry point, ABI, status table -----------------------------------

TEST(Dlopen, OnlyTheEntryPointIsVisibleAndTheTableIsVersioned)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;

    EXPECT_EQ((uint32_t)KVX_ABI_MAJOR, api->abi_major);
    EXPECT_GE(api->abi_minor, (uint32_t)KVX_ABI_MINOR);
    EXPECT_EQ(sizeof(kvx_api_t), api->struct_size);

    auto get = reinterpret_cast<kvx_get_api_fn_t>(
        dlsym(lib.handle, KVX_ENTRY_POINT_NAME));
    ASSERT_NE(nullptr, get);
    EXPECT_EQ(nullptr, get(KVX_ABI_MAJOR + 1));
    EXPECT_EQ(nullptr, get(0));
    EXPECT_EQ(nullptr, get(UINT32_MAX));
    EXPECT_EQ(api, get(KVX_ABI_MAJOR)) << "one table per library";

    // Internal symbols stay hidden.
    for (const char *sym : {"kvc_api_table", "kvx_engine_create",
                            "kvc_status_name", "kvu_post", "kvn_client_open"}) {
        EXPECT_EQ(nullptr, dlsym(lib.handle, sym)) << sym << " is exported";
    }

    // Every member of the table is set.
    const void *const fns[] = {
        (const void *)api->status_name,    (const void *)api->status_string,
        (const void *)api->last_error,     (const void *)api->free,
        (const void *)api->set_logger,     (const void *)api->engine_create,
        (const void *)api->engine_destroy, (const void *)api->config_dump,
        (const void *)api->alloc_region,   (const void *)api->free_region,
        (const void *)api->register_layer, (const void *)api->start,
        (const void *)api->registration_payload,
        (const void *)api->producer_request,
        (const void *)api->consumer_request, (const void *)api->wait_layer,
        (const void *)api->wait_transfer,  (const void *)api->poll_events,
        (const void *)api->transports,
        (const void *)api->build_decode_params,
        // ABI 1.1
        (const void *)api->layer_ready,    (const void *)api->seal_transfer,
        (const void *)api->consumer_abort, (const void *)api->stats,
        (const void *)api->build_prefill_params,
        // ABI 1.2
        (const void *)api->connect_peer,   (const void *)api->wait_events,
        // ABI 1.3
        (const void *)api->event_fd,
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        EXPECT_NE(nullptr, fns[i]) << "table member " << i;
    }
}

struct StatusRow {
    kvx_status_t code;
    const char  *name;
    const char  *msg;
};
#define KVT_ROW(name, value, msg) {name, #name, msg},
const StatusRow kRows[] = {KVX_STATUS_MAP(KVT_ROW)};
#undef KVT_ROW

TEST(Dlopen, StatusNamesAndStringsForEveryCode)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    std::set<std::string> names, strings;

    for (const StatusRow &r : kRows) {
        const char *n = lib.api->status_name(r.code);
        const char *s = lib.api->status_string(r.code);
        ASSERT_NE(nullptr, n);
        ASSERT_NE(nullptr, s);
        EXPECT_GT(strlen(n), 0u) << r.name;
        EXPECT_GT(strlen(s), 0u) << r.name;
        EXPECT_STREQ(r.name, n);
        EXPECT_STREQ(r.msg, s);
        EXPECT_TRUE(names.insert(n).second) << "duplicate name " << n;
        EXPECT_TRUE(strings.insert(s).second) << "duplicate string " << s;
    }
    EXPECT_EQ(sizeof(kRows) / sizeof(kRows[0]), names.size());
    EXPECT_STREQ("unknown status", lib.api->status_name((kvx_status_t)-77));
    EXPECT_STREQ("unknown status", lib.api->status_string((kvx_status_t)99));
}

// --- (b) a complete READ transfer through the table -----------------------

TEST(Dlopen, ReadTransferThroughTheTableOnly)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    Engine           p, d;
    ASSERT_TRUE(MakeEngine(api, true, 16, 2, &p));
    ASSERT_TRUE(MakeEngine(api, false, 12, 2, &d));

    // Scattered P blocks to scattered D blocks (different num_blocks moves
    // the remote V plane).
    const std::vector<uint64_t> pids = {15, 2, 7, 8, 0};
    const std::vector<uint64_t> dids = {3, 11, 0, 6, 5};
    std::string                 resp;
    ASSERT_EQ("", Transfer(api, &p, &d, "tx-dlopen-read-1", pids, dids,
                           &resp));

    // P's response carries what the proxy forwards (SPEC §3).
    Json r(resp);
    ASSERT_NE(nullptr, r.o) << resp;
    EXPECT_EQ("tx-dlopen-read-1", r.Str("transfer_id"));
    EXPECT_EQ("127.0.0.1", r.Str("remote_host"));
    EXPECT_EQ(p.hs, r.Int("remote_handshake_port"));
    EXPECT_EQ(p.notify, r.Int("remote_notify_port"));
    EXPECT_EQ(1, r.Int("tp_size"));
    EXPECT_EQ(1, r.Int("remote_dp_size"));
    EXPECT_NE(nullptr, r.Get("remote_engine_id"));
    json_object *ids = r.Get("remote_block_ids");
    ASSERT_NE(nullptr, ids);
    ASSERT_EQ(pids.size(), json_object_array_length(ids));
    for (size_t i = 0; i < pids.size(); i++) {
        EXPECT_EQ((int64_t)pids[i],
                  json_object_get_int64(json_object_array_get_idx(ids, i)));
    }
    json_object *hosts = r.Get("remote_hosts");
    ASSERT_NE(nullptr, hosts);
    ASSERT_EQ(1u, json_object_array_length(hosts));
    EXPECT_STREQ("127.0.0.1",
                 json_object_get_string(json_object_array_get_idx(hosts, 0)));

    // The endpoint D used: ready, over tcp.
    char *tj = nullptr;
    ASSERT_EQ(KVX_OK, api->transports(d.eng, &tj)) << api->last_error();
    std::string transports = tj;
    api->free(tj);
    EXPECT_NE(std::string::npos, transports.find("\"state\":\"ready\""))
        << transports;
    EXPECT_NE(std::string::npos, transports.find("tcp")) << transports;

    // Counters are JSON.
    char *sj = nullptr;
    ASSERT_EQ(KVX_OK, api->stats(d.eng, &sj)) << api->last_error();
    Json stats(sj);
    EXPECT_TRUE(stats.o != nullptr &&
                json_object_is_type(stats.o, json_type_object)) << sj;
    api->free(sj);

    // A second transfer on the same engines (the handshake is reused), with
    // other blocks.
    ASSERT_EQ("", Transfer(api, &p, &d, "tx-dlopen-read-2", {1, 3},
                           {10, 9}));

    // A third one whose params carry no explicit address: D finds P in the
    // proxy's request_id.
    const std::vector<uint64_t> pids3 = {4, 5, 6}, dids3 = {1, 2, 4};
    const std::string           tid3  = "tx-dlopen-read-rid";
    const std::string           rid   = RequestId(p, d);
    char                       *resp3 = nullptr;
    ASSERT_EQ(KVX_OK, api->producer_request(
                          p.eng, rid.c_str(),
                          ("{\"transfer_id\":\"" + tid3 + "\"}").c_str(),
                          pids3.data(), pids3.size(), &resp3))
        << api->last_error();
    api->free(resp3);
    std::string dparams = "{\"transfer_id\":\"" + tid3 +
                          "\",\"do_remote_prefill\":true,"
                          "\"remote_block_ids\":[4,5,6],\"remote_tp_size\":1}";
    std::fill(d.bufs[0].begin(), d.bufs[0].end(), 0xEE);
    std::fill(d.bufs[1].begin(), d.bufs[1].end(), 0xEE);
    ASSERT_EQ(KVX_OK, api->consumer_request(d.eng, rid.c_str(),
                                            dparams.c_str(), dids3.data(),
                                            dids3.size()))
        << api->last_error();
    ASSERT_EQ(KVX_OK, api->wait_transfer(d.eng, tid3.c_str(), 20000))
        << api->last_error();
    EXPECT_EQ("", Verify(d, dids3, pids3));
    std::vector<kvx_event_t> dev = Drain(api, d.eng), pev;
    ASSERT_EQ(1u, dev.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, dev[0].type);
    FreeEvents(api, &dev);
    ASSERT_TRUE(WaitFor([&] {
        auto more = Drain(api, p.eng);
        pev.insert(pev.end(), more.begin(), more.end());
        return !pev.empty();
    }, 10000));
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type);
    EXPECT_EQ(tid3, pev[0].transfer_id);
    FreeEvents(api, &pev);
}

// A decode instance that shuts down right after its last request: the
// release D queued when its gets completed must still reach P, so that P
// frees its blocks now and not after defer_timeout (SPEC §7, §10).
bool Readable(int fd, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, timeout_ms) == 1 && (pfd.revents & POLLIN);
}

// ABI 1.3: event_fd is readable exactly while an event is pending (an
// event loop sleeps on it, no thread in wait_events); every call clears
// last_error.
TEST(Dlopen, EventFdIsReadableExactlyWhileEventsArePending)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    ASSERT_GE(api->struct_size,
              offsetof(kvx_api_t, event_fd) + sizeof(api->event_fd));
    Engine p, d;
    ASSERT_TRUE(MakeEngine(api, true, 8, 2, &p));
    ASSERT_TRUE(MakeEngine(api, false, 8, 2, &d));
    int pfd = -1, again = -1;
    ASSERT_EQ(KVX_OK, api->event_fd(p.eng, &pfd)) << api->last_error();
    ASSERT_EQ(KVX_OK, api->event_fd(p.eng, &again));
    EXPECT_EQ(pfd, again) << "one descriptor per engine";
    EXPECT_FALSE(Readable(pfd, 0));
    EXPECT_EQ(KVX_ERR_INVALID_PARAM, api->event_fd(p.eng, nullptr));

    // One READ transfer by hand (Transfer() drains the events itself).
    const std::vector<uint64_t> pids = {1, 2}, dids = {3, 4};
    const std::string           rid = RequestId(p, d);
    char                       *resp = nullptr, *dp = nullptr;
    int                         dfd  = -1;
    ASSERT_EQ(KVX_OK, api->event_fd(d.eng, &dfd));
    ASSERT_EQ(KVX_OK, api->producer_request(
                          p.eng, rid.c_str(),
                          "{\"transfer_id\":\"tx-evfd\",\"do_remote_decode\":"
                          "true}", pids.data(), pids.size(), &resp))
        << api->last_error();
    ASSERT_EQ(KVX_OK, api->build_decode_params(resp, "tx-evfd", &dp));
    api->free(resp);
    EXPECT_FALSE(Readable(dfd, 0));
    ASSERT_EQ(KVX_OK, api->consumer_request(d.eng, rid.c_str(), dp,
                                            dids.data(), dids.size()))
        << api->last_error();
    api->free(dp);
    // poll() sleeps until D's FINISHED_RECVING, then P's FINISHED_SENDING.
    ASSERT_TRUE(Readable(dfd, 20000));
    EXPECT_TRUE(Readable(dfd, 0)) << "level-triggered until taken";
    EXPECT_EQ("", Verify(d, dids, pids));
    auto evs = Drain(api, d.eng);
    ASSERT_EQ(1u, evs.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_RECVING, evs[0].type);
    FreeEvents(api, &evs);
    EXPECT_FALSE(Readable(dfd, 0)) << "poll_events drained it";
    ASSERT_TRUE(Readable(pfd, 20000));
    evs = Drain(api, p.eng);
    ASSERT_EQ(1u, evs.size());
    EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, evs[0].type);
    FreeEvents(api, &evs);
    EXPECT_FALSE(Readable(pfd, 0));

    // last_error: a failure, then a success of a call that left the old
    // message in place before 1.3.
    EXPECT_EQ(KVX_ERR_NOT_FOUND, api->wait_transfer(d.eng, "nope", 0));
    EXPECT_STRNE("", api->last_error());
    char *sj = nullptr;
    ASSERT_EQ(KVX_OK, api->stats(d.eng, &sj));
    api->free(sj);
    EXPECT_STREQ("", api->last_error());
    EXPECT_EQ(KVX_ERR_NOT_FOUND, api->wait_transfer(d.eng, "nope", 0));
    kvx_event_t ev[2];
    EXPECT_EQ(0, api->poll_events(d.eng, ev, 2));
    EXPECT_STREQ("", api->last_error());
}

TEST(Dlopen, ConsumerDestroyedRightAfterItsTransferStillReleasesProducer)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    Engine           p;
    ASSERT_TRUE(MakeEngine(api, true, 8, 1, &p));

    // The loss is a race (D's peer thread vs. engine_destroy): 50 rounds
    // showed it nearly every run before destroy flushed queued messages.
    for (int i = 0; i < 50; i++) {
        SCOPED_TRACE("iteration " + std::to_string(i));
        const std::string     tid  = "tx-destroy-" + std::to_string(i);
        const std::string     rid  = "req-" + std::to_string(i);
        std::vector<uint64_t> pids = {1, 6}, dids = {2, 3};
        char                 *resp = nullptr, *dp = nullptr;
        ASSERT_EQ(KVX_OK, api->producer_request(
                              p.eng, rid.c_str(),
                              ("{\"transfer_id\":\"" + tid + "\"}").c_str(),
                              pids.data(), pids.size(), &resp))
            << api->last_error();
        ASSERT_EQ(KVX_OK, api->build_decode_params(resp, tid.c_str(), &dp))
            << api->last_error();
        api->free(resp);
        std::string dparams = dp;
        api->free(dp);
        {
            Engine d;
            ASSERT_TRUE(MakeEngine(api, false, 8, 1, &d));
            ASSERT_EQ(KVX_OK, api->consumer_request(d.eng, rid.c_str(),
                                                    dparams.c_str(),
                                                    dids.data(), dids.size()))
                << api->last_error();
            ASSERT_EQ(KVX_OK, api->wait_transfer(d.eng, tid.c_str(), 20000))
                << api->last_error();
        } // engine_destroy right away
        std::vector<kvx_event_t> pev;
        WaitFor([&] {
            auto more = Drain(api, p.eng);
            pev.insert(pev.end(), more.begin(), more.end());
            return !pev.empty();
        }, 5000);
        ASSERT_EQ(1u, pev.size())
            << "P got no release within 5 s (defer_timeout is 30 s): the "
               "consumer's engine_destroy dropped the release it had queued";
        EXPECT_EQ(KVX_EVENT_FINISHED_SENDING, pev[0].type) << pev[0].reason;
        EXPECT_EQ(tid, pev[0].transfer_id);
        FreeEvents(api, &pev);
    }
}

// --- (c) dlopen / dlclose cycles ------------------------------------------

// Threads of this process: tid -> name.
std::map<int, std::string> Tasks()
{
    std::map<int, std::string> out;
    DIR                       *d = opendir("/proc/self/task");
    struct dirent             *e;
    while (d != nullptr && (e = readdir(d)) != nullptr) {
        if (e->d_name[0] == '.') {
            continue;
        }
        std::string comm = "?";
        std::string path = std::string("/proc/self/task/") + e->d_name +
                           "/comm";
        if (FILE *f = fopen(path.c_str(), "r")) {
            char buf[64] = "";
            if (fgets(buf, sizeof(buf), f) != nullptr) {
                comm = buf;
                comm.erase(comm.find_last_not_of("\n") + 1);
            }
            fclose(f);
        }
        out[atoi(e->d_name)] = comm;
    }
    if (d != nullptr) {
        closedir(d);
    }
    return out;
}

bool Loaded(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (h != nullptr) {
        dlclose(h);
    }
    return h != nullptr;
}

// Three times: dlopen, two engines, one small transfer, destroy, dlclose.
// After each dlclose that unloads the library, no thread the library
// started may remain (its code is gone). Returns "" or what went wrong.
std::string OpenUseCloseCycles()
{
    if (Loaded(KVX_SO_PATH)) {
        return "libkvxfer.so is already loaded before the first dlopen";
    }
    const std::map<int, std::string> before = Tasks();
    for (int cycle = 0; cycle < 3; cycle++) {
        const std::string c = "cycle " + std::to_string(cycle) + ": ";
        void *h = dlopen(KVX_SO_PATH, RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            return c + "dlopen: " + dlerror();
        }
        auto get = reinterpret_cast<kvx_get_api_fn_t>(
            dlsym(h, KVX_ENTRY_POINT_NAME));
        const kvx_api_t *api = get != nullptr ? get(KVX_ABI_MAJOR) : nullptr;
        if (api == nullptr) {
            return c + "no function table";
        }
        {
            Engine p, d;
            auto   rp = MakeEngine(api, true, 8, 1, &p);
            if (!rp) {
                return c + "producer: " + rp.message();
            }
            auto rd = MakeEngine(api, false, 8, 1, &d);
            if (!rd) {
                return c + "consumer: " + rd.message();
            }
            std::string err = Transfer(api, &p, &d,
                                       "tx-cycle-" + std::to_string(cycle),
                                       {cycle + 1u, 7}, {2, cycle + 4u});
            if (!err.empty()) {
                return c + err;
            }
            // Each engine's progress thread carries its name (top -H,
            // perf/placement.sh pins it by that name).
            int named = 0;
            for (const auto &t : Tasks()) {
                named += t.second == "kvx-progress";
            }
            if (named != 2) {
                return c + std::to_string(named) + " threads named "
                       "kvx-progress with two engines alive (want 2)";
            }
        } // both engines destroyed: engine_destroy joins their threads
        if (dlclose(h) != 0) {
            return c + "dlclose: " + dlerror();
        }
        if (Loaded(KVX_SO_PATH)) {
            continue; // still mapped: threads it left would be harmless
        }
        // libkvxfer is gone. A thread started through it may remain only if
        // the code it runs stays mapped: nng's process-wide threads
        // ("nng:...") need libnng.so resident; any other thread is a leak.
        const bool  nng_resident = Loaded("libnng.so.1");
        std::string leaked;
        int         n = 0;
        for (const auto &t : Tasks()) {
            if (before.count(t.first) != 0 ||
                (nng_resident && t.second.rfind("nng:", 0) == 0)) {
                continue;
            }
            leaked += (n++ ? ", " : "") + t.second;
        }
        if (n > 0) {
            return c + "dlclose() unloaded libkvxfer.so (libnng.so " +
                   (nng_resident ? "still" : "no longer") + " mapped) but " +
                   std::to_string(n) + " threads started through it still " +
                   "run: " + leaked + ". Their code is unmapped: they crash "
                   "(SIGSEGV) when they wake.";
        }
    }
    return "";
}

TEST(Dlopen, OpenUseCloseThreeTimes)
{
    // In a child process of its own: the library must be loaded by nobody
    // else, and a crash after dlclose must not take the other tests down.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            std::string err = OpenUseCloseCycles();
            if (!err.empty()) {
                fprintf(stderr, "%s\n", err.c_str());
                fflush(stderr);
                _exit(1);
            }
            _exit(0);
        },
        ::testing::ExitedWithCode(0), "");
}

// --- (d) errors through the table -----------------------------------------

TEST(Dlopen, ErrorsNameTheKeyTheShapeAndTheState)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    kvx_engine_t    *eng = nullptr;

    // Bad configuration: the message names the key (and the value).
    struct {
        const char *json;
        const char *key;
    } bad[] = {
        {"{\"role\":\"kv_producer\",\"kv_connector_extra_config\":"
         "{\"handshake_port\":\"abc\"}}", "handshake_port"},
        {"{\"role\":\"kv_producer\",\"kv_connector_extra_config\":"
         "{\"notify_port\":70000}}", "notify_port"},
        {"{\"role\":\"kv_prefill\"}", "role"},
        {"{\"role\":\"kv_consumer\",\"tp_size\":-2}", "tp_size"},
        {"{\"role\":\"kv_consumer\",\"kv_connector_extra_config\":"
         "{\"read_mode\":\"maybe\"}}", "read_mode"},
    };
    for (const auto &b : bad) {
        eng = nullptr;
        EXPECT_EQ(KVX_ERR_CONFIG, api->engine_create(b.json, &eng)) << b.json;
        EXPECT_EQ(nullptr, eng);
        EXPECT_NE(std::string::npos, std::string(api->last_error()).find(b.key))
            << "last_error '" << api->last_error() << "' does not name "
            << b.key;
        api->engine_destroy(eng);
    }
    EXPECT_NE(KVX_OK, api->engine_create("not json", &eng));
    EXPECT_GT(strlen(api->last_error()), 0u);
    EXPECT_EQ(KVX_ERR_INVALID_PARAM, api->engine_create(nullptr, &eng));

    // A consumer engine that is not started yet.
    uint16_t    hs  = NextPorts(2);
    std::string cfg = Config(false, hs, (uint16_t)(hs + 1));
    eng             = nullptr;
    ASSERT_EQ(KVX_OK, api->engine_create(cfg.c_str(), &eng))
        << api->last_error();
    ASSERT_NE(nullptr, eng);

    std::vector<uint8_t> buf(2 * 8 * kUnit, 0);
    std::string          name = "model.layers.0.self_attn";

    // Shape that matches no layout: its last dimension (16) is not the
    // layer's head_size (24).
    kvx_layer_desc_t d = Desc(name, buf.data(), 8);
    d.head_size        = 24;
    EXPECT_EQ(KVX_ERR_LAYOUT, api->register_layer(eng, &d));
    std::string why = api->last_error();
    EXPECT_NE(std::string::npos, why.find(name)) << why;
    EXPECT_NE(std::string::npos, why.find("layout")) << why;
    // Leading dimension 3 is neither K/V split nor blocks.
    d          = Desc(name, buf.data(), 8);
    d.shape[0] = 3;
    d.length   = buf.size() * 3 / 2;
    std::vector<uint8_t> big(d.length);
    d.base = big.data();
    for (int k = 4, s = 1; k >= 0; k--) {
        d.stride[k] = s;
        s *= (int)d.shape[k];
    }
    EXPECT_EQ(KVX_ERR_LAYOUT, api->register_layer(eng, &d));
    EXPECT_GT(strlen(api->last_error()), 0u);

    // Requests before start().
    const uint64_t ids[2] = {0, 1};
    std::string    params = "{\"transfer_id\":\"tx-early\","
                            "\"remote_host\":\"127.0.0.1\","
                            "\"remote_handshake_port\":45001,"
                            "\"remote_notify_port\":45002,"
                            "\"remote_block_ids\":[0,1]}";
    EXPECT_EQ(KVX_ERR_BAD_STATE, api->consumer_request(
                                     eng, "req", params.c_str(), ids, 2));
    EXPECT_GT(strlen(api->last_error()), 0u);
    EXPECT_EQ(KVX_ERR_BAD_STATE, api->start(eng)) << "no layer registered";

    // A valid layer, then start; registration after start is refused, and
    // so is the producer side on a consumer engine.
    d = Desc(name, buf.data(), 8);
    ASSERT_EQ(KVX_OK, api->register_layer(eng, &d)) << api->last_error();
    EXPECT_EQ(KVX_ERR_EXISTS, api->register_layer(eng, &d));
    ASSERT_EQ(KVX_OK, api->start(eng)) << api->last_error();
    std::string      name2 = "model.layers.1.self_attn";
    kvx_layer_desc_t d2    = Desc(name2, buf.data(), 8);
    EXPECT_EQ(KVX_ERR_BAD_STATE, api->register_layer(eng, &d2));
    char *resp = nullptr;
    EXPECT_EQ(KVX_ERR_BAD_STATE,
              api->producer_request(eng, "req", "{\"transfer_id\":\"t\"}", ids,
                                    2, &resp));
    EXPECT_EQ(nullptr, resp);
    EXPECT_EQ(KVX_ERR_NOT_FOUND,
              api->wait_transfer(eng, "tx-never-started", 10));
    EXPECT_EQ(0, api->poll_events(eng, nullptr, 0));
    // A request id longer than events carry is refused, naming the limit
    // (KVX_ID_MAX - 1 characters), not truncated.
    std::string long_rid(KVX_ID_MAX + 11, 'r');
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              api->consumer_request(eng, long_rid.c_str(), params.c_str(), ids,
                                    2));
    EXPECT_NE(std::string::npos,
              std::string(api->last_error())
                  .find("request_id: 267 characters: must be at most 255"))
        << api->last_error();
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              api->consumer_abort(eng, long_rid.c_str(), params.c_str()));
    api->engine_destroy(eng);
    api->engine_destroy(nullptr); // no-op
}

// s with bytes outside printable ASCII as \xNN (test logs are XML).
std::string Printable(const std::string &s)
{
    std::string out;
    for (unsigned char ch : s) {
        if (ch >= 0x20 && ch < 0x7f) {
            out += (char)ch;
        } else {
            char buf[8];
            snprintf(buf, sizeof(buf), "\\x%02x", ch);
            out += buf;
        }
    }
    return out;
}

// start() on a handshake port another socket already listens on fails with
// an error naming the address. (kvn_server_create formats that message from
// the server it has just freed: run in a child whose malloc scribbles over
// freed memory (no tcache, perturb byte), so that a use-after-free shows as
// a wrong message, or as an ASan report in sanitizer builds.)
std::string StartOnBusyPort()
{
    Lib lib;
    if (lib.api == nullptr) {
        return lib.error;
    }
    const kvx_api_t *api = lib.api;
    uint16_t         hs  = 0;
    int              fd  = -1;
    // Occupy a port: SO_REUSEADDR so that connections of earlier processes
    // still in TIME_WAIT do not stop the bind (a listening socket still
    // blocks the engine's own listen), and the next pair if one is taken.
    for (int attempt = 0; attempt < 20 && fd < 0; attempt++) {
        int         one = 1;
        sockaddr_in a{};
        hs                = NextPorts(2);
        a.sin_family      = AF_INET;
        a.sin_port        = htons(hs);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd                = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 &&
            (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
             bind(fd, (sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 4) != 0)) {
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        return "cannot occupy any port near " + std::to_string(hs);
    }
    std::string   cfg = Config(true, hs, (uint16_t)(hs + 1));
    kvx_engine_t *eng = nullptr;
    std::string   err;
    if (api->engine_create(cfg.c_str(), &eng) != KVX_OK) {
        err = std::string("engine_create: ") + api->last_error();
    }
    std::vector<uint8_t> buf(2 * 8 * kUnit);
    std::string          name = "model.layers.0.self_attn";
    kvx_layer_desc_t     d    = Desc(name, buf.data(), 8);
    if (err.empty() && api->register_layer(eng, &d) != KVX_OK) {
        err = std::string("register_layer: ") + api->last_error();
    }
    if (err.empty()) {
        kvx_status_t st   = api->start(eng);
        std::string  why  = api->last_error();
        std::string  want = "listen on tcp://127.0.0.1:" + std::to_string(hs);
        if (st == KVX_OK) {
            err = "start() succeeded on busy port " + want;
        } else if (why.find(want) == std::string::npos) {
            err = "start() on a busy port returned " +
                  std::string(api->status_name(st)) +
                  " but last_error does not say '" + want + "': '" +
                  Printable(why.substr(0, 160)) + "'";
        }
    }
    api->engine_destroy(eng);
    close(fd);
    return err;
}

TEST(Dlopen, StartOnBusyPortFailsNamingTheAddress)
{
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    // The child is a fresh exec of this binary: it reads these at startup.
    const char *old = getenv("GLIBC_TUNABLES");
    std::string saved = old != nullptr ? old : "";
    setenv("GLIBC_TUNABLES",
           "glibc.malloc.tcache_count=0:glibc.malloc.perturb=165", 1);
    EXPECT_EXIT(
        {
            std::string err = StartOnBusyPort();
            if (!err.empty()) {
                fprintf(stderr, "%s\n", err.c_str());
                fflush(stderr);
                _exit(1);
            }
            _exit(0);
        },
        ::testing::ExitedWithCode(0), "");
    if (old != nullptr) {
        setenv("GLIBC_TUNABLES", saved.c_str(), 1);
    } else {
        unsetenv("GLIBC_TUNABLES");
    }
}

// --- (e) registration payload ---------------------------------------------

// An hwloc XML topology (with a comment header, as tests/data has them) is
// read by the library loaded RTLD_LOCAL as the README tells frameworks to
// load it: hwloc's libxml plugin cannot load there, so a failure would say
// the file is not a topology. A bus id absent from the topology is the
// error that proves the file was read.
TEST(Dlopen, HwlocXmlTopologyLoadsUnderRtldLocal)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const char *data = getenv("KVT_DATA");
    ASSERT_NE(nullptr, data) << "KVT_DATA (tests/data) not set";
    std::string xml = std::string(data) + "/topo-2numa.xml";
    uint16_t    hs  = NextPorts(2);
    std::string cfg = Config(false, hs, (uint16_t)(hs + 1),
                             ",\"hwloc_topology\":\"" + xml +
                                 "\",\"gpu_bus_id\":\"0000:7f:00.0\"");
    kvx_engine_t *eng = nullptr;
    EXPECT_EQ(KVX_ERR_CONFIG, lib.api->engine_create(cfg.c_str(), &eng));
    std::string why = lib.api->last_error();
    EXPECT_NE(std::string::npos,
              why.find("no such PCI device in the topology of " + xml))
        << why;
    EXPECT_EQ(std::string::npos, why.find("cannot read")) << why;
    lib.api->engine_destroy(eng);
}

// log_level in an engine's config is applied: it sets the process-wide
// threshold (the logger is process-wide) for the lines that follow.
std::vector<std::pair<int, std::string>> g_log_lines;

void CaptureLog(void *, int level, const char *id, const char *)
{
    g_log_lines.emplace_back(level, id != nullptr ? id : "");
}

int CountLog(const std::string &id)
{
    int n = 0;
    for (const auto &l : g_log_lines) {
        n += l.second == id;
    }
    return n;
}

TEST(Dlopen, LogLevelOfTheConfigIsApplied)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    std::vector<uint8_t> buf(2 * 8 * kUnit, 0);
    for (int level : {2, 0}) {
        g_log_lines.clear();
        api->set_logger(CaptureLog, nullptr, 1); // warn, then the config
        uint16_t      hs  = NextPorts(2);
        std::string   cfg = Config(false, hs, (uint16_t)(hs + 1));
        kvx_engine_t *eng = nullptr;
        cfg.insert(1, "\"log_level\":" + std::to_string(level) + ",");
        ASSERT_EQ(KVX_OK, api->engine_create(cfg.c_str(), &eng))
            << api->last_error();
        const std::string name = "model.layers.0.attn"; // d.name borrows it
        kvx_layer_desc_t  d    = Desc(name, buf.data(), 8);
        ASSERT_EQ(KVX_OK, api->register_layer(eng, &d)) << api->last_error();
        ASSERT_EQ(KVX_OK, api->start(eng)) << api->last_error();
        // start() logs KVX-STARTED at info (2): seen only at log_level 2.
        EXPECT_EQ(level >= 2 ? 1 : 0, CountLog("KVX-STARTED")) << level;
        api->engine_destroy(eng);
    }
    api->set_logger(nullptr, nullptr, 1);
}

TEST(Dlopen, RegistrationPayloadHasTheProxyFields)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;

    for (bool producer : {true, false}) {
        SCOPED_TRACE(producer ? "producer" : "consumer");
        Engine e;
        ASSERT_TRUE(MakeEngine(api, producer, 4, 1, &e,
                               ",\"http_port\":8123"));
        char *pj = nullptr;
        ASSERT_EQ(KVX_OK, api->registration_payload(e.eng, &pj))
            << api->last_error();
        std::string payload = pj;
        api->free(pj);
        Json j(payload);
        ASSERT_NE(nullptr, j.o) << payload;
        EXPECT_EQ(producer ? "P" : "D", j.Str("type"));
        EXPECT_EQ("127.0.0.1:8123", j.Str("http_address"));
        EXPECT_EQ("host:127.0.0.1,handshake:" + std::to_string(e.hs) +
                      ",notify:" + std::to_string(e.notify),
                  j.Str("zmq_address"));
        EXPECT_EQ(1, j.Int("dp_size"));
        EXPECT_EQ(1, j.Int("tp_size"));
        EXPECT_EQ("READ", j.Str("transfer_mode"));
        json_object *hosts = j.Get("node_hosts");
        ASSERT_NE(nullptr, hosts) << payload;
        ASSERT_TRUE(json_object_is_type(hosts, json_type_array));
        ASSERT_EQ(1u, json_object_array_length(hosts));
        EXPECT_STREQ("127.0.0.1", json_object_get_string(
                                      json_object_array_get_idx(hosts, 0)));
    }
}

} // namespace

// --- threads around engine_destroy and start (found by a review agent) ----
namespace {

// calls of the API in progress on eng (stats "api_calls", less the stats
// call itself)
int64_t CallsInProgress(const kvx_api_t *api, kvx_engine_t *eng)
{
    char *out = nullptr;
    if (api->stats(eng, &out) != KVX_OK) {
        return -1;
    }
    Json j(out);
    api->free(out);
    return j.Int("api_calls") - 1;
}

// A framework thread waits for events (timeout ms) while the main thread
// destroys the engine: the wait ends at once with KVX_ERR_CANCELED and
// destroy does not wait for its timeout. Before, destroy blocked in
// pthread_cond_destroy for the rest of the wait, and the waiter then read
// the freed engine.
void DestroyEndsTheWait(int64_t timeout_ms)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    Engine           p;
    ASSERT_TRUE(MakeEngine(api, true, 8, 1, &p));
    kvx_engine_t *eng = p.eng;
    kvx_status_t  st  = KVX_OK;
    std::thread   t([&] { st = api->wait_events(eng, timeout_ms); });
    // the waiter is inside its wait (a wait that returned at once, as one
    // of INT64_MAX ms did when its deadline wrapped, is never seen here)
    bool inside = WaitFor([&] { return CallsInProgress(api, eng) == 1; },
                          5000);
    EXPECT_TRUE(inside) << "wait_events(" << timeout_ms << ") is not waiting";
    auto t0 = std::chrono::steady_clock::now();
    api->engine_destroy(eng);
    p.api = nullptr; // destroyed
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
    t.join();
    EXPECT_LT(ms, 5000) << "engine_destroy took " << ms << " ms";
    if (inside) {
        EXPECT_EQ(KVX_ERR_CANCELED, st) << api->status_name(st);
    }
}

TEST(DlopenThreads, DestroyEndsAWaitInAnotherThread)
{
    DestroyEndsTheWait(20000);
}

// A "very long" timeout is a long wait, not one that ends at once.
TEST(DlopenThreads, HugeTimeoutIsALongWait)
{
    DestroyEndsTheWait(INT64_MAX);
}

// Two threads call start() at once: one starts the engine, the other is
// refused, and both listeners stay up. Before, the loser's failed bind
// closed the winner's handshake listener (and leaked its metadata).
TEST(DlopenThreads, ConcurrentStartsStartOnce)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    for (int round = 0; round < 10; round++) {
        Engine e;
        e.api    = api;
        e.nb     = 8;
        e.hs     = NextPorts(2);
        e.notify = (uint16_t)(e.hs + 1);
        std::string cfg = Config(true, e.hs, e.notify);
        ASSERT_EQ(KVX_OK, api->engine_create(cfg.c_str(), &e.eng))
            << api->last_error();
        e.names = {"l0"};
        e.bufs.resize(1);
        e.bufs[0].assign(2 * 8 * kUnit, 0);
        kvx_layer_desc_t dsc = Desc(e.names[0], e.bufs[0].data(), 8);
        ASSERT_EQ(KVX_OK, api->register_layer(e.eng, &dsc));
        std::atomic<int> go{0};
        kvx_status_t     s1 = KVX_OK, s2 = KVX_OK;
        std::thread      t1([&] {
            while (!go) {
            }
            s1 = api->start(e.eng);
        });
        std::thread t2([&] {
            while (!go) {
            }
            s2 = api->start(e.eng);
        });
        go = 1;
        t1.join();
        t2.join();
        ASSERT_EQ(1, (s1 == KVX_OK) + (s2 == KVX_OK))
            << "round " << round << ": " << api->status_name(s1) << ", "
            << api->status_name(s2);
        EXPECT_EQ(KVX_ERR_BAD_STATE, s1 == KVX_OK ? s2 : s1);
        // both listeners up: a connection is accepted on each port
        for (uint16_t port : {e.hs, e.notify}) {
            int                fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a;
            memset(&a, 0, sizeof(a));
            a.sin_family      = AF_INET;
            a.sin_port        = htons(port);
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            EXPECT_EQ(0, connect(fd, (struct sockaddr *)&a, sizeof(a)))
                << "round " << round << ": port " << port << " not listening";
            close(fd);
        }
        // and a layer can no longer be registered
        kvx_layer_desc_t late = Desc(e.names[0], e.bufs[0].data(), 8);
        EXPECT_EQ(KVX_ERR_BAD_STATE, api->register_layer(e.eng, &late));
    }
}

// A start() that failed (its notify port taken) can be retried once the
// port is free; the first attempt's metadata is not leaked (LSan in the
// sanitizer run).
TEST(DlopenThreads, StartRetriedAfterABusyPort)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    const kvx_api_t *api = lib.api;
    Engine           e;
    e.api    = api;
    e.nb     = 8;
    e.hs     = NextPorts(2);
    e.notify = (uint16_t)(e.hs + 1);
    int                fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family      = AF_INET;
    a.sin_port        = htons(e.notify);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ASSERT_EQ(0, bind(fd, (struct sockaddr *)&a, sizeof(a)));
    ASSERT_EQ(0, listen(fd, 4));
    std::string cfg = Config(true, e.hs, e.notify);
    ASSERT_EQ(KVX_OK, api->engine_create(cfg.c_str(), &e.eng));
    e.names = {"l0"};
    e.bufs.resize(1);
    e.bufs[0].assign(2 * 8 * kUnit, 0);
    kvx_layer_desc_t dsc = Desc(e.names[0], e.bufs[0].data(), 8);
    ASSERT_EQ(KVX_OK, api->register_layer(e.eng, &dsc));
    EXPECT_NE(KVX_OK, api->start(e.eng));
    EXPECT_NE(nullptr, strstr(api->last_error(), "notify_port"))
        << api->last_error();
    close(fd);
    EXPECT_EQ(KVX_OK, api->start(e.eng)) << api->last_error();
}

// build_decode_params needs the prefill response.
TEST(DlopenThreads, DecodeParamsWithoutAResponseAreRefused)
{
    Lib lib;
    ASSERT_NE(nullptr, lib.api) << lib.error;
    char *out = nullptr;
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              lib.api->build_decode_params(nullptr, "tx", &out));
    EXPECT_NE(nullptr, strstr(lib.api->last_error(), "prefill_response_json"))
        << lib.api->last_error();
    EXPECT_EQ(nullptr, out);
}

} // namespace
