// harness.cc - see harness.h.
#include "harness.h"

extern "C" {
#include "api.h"
}

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

#if KVT_SIM_TRANSPORTS
// The real declarations of the client calls harness.h redirects (the shims
// below hand clients they did not open to them).
#undef kvn_client_open
#undef kvn_client_request
#undef kvn_client_close
extern "C" {
#include "error.h"
#include "nng/kvn.h"
}
#include "simnet.h"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#endif

#if KVT_SIM_TRANSPORTS
// ---- the simulated environment ----------------------------------------------
//
// One sim::World per test: created when the test starts (seed: FNV-1a of
// "Suite.Name", xor KVT_SIM_SEED if set - the seed is printed), destroyed when
// it ends (every Rank of the test is gone by then). KVT_SIM_TRACE=1 traces
// every step. The engines' calls that create transport objects (engine_create,
// start, requests dialling a peer ...) run with the engine's node current;
// the engines' own waits run the world through the simulated clock.
namespace {

struct SimState {
    std::unique_ptr<sim::World>   world;
    uint64_t                      seed = 0;
    std::map<kvx_engine_t *, int> nodes;   // engine -> its node
    int                           driver = -1; // node of the raw clients
    std::set<kvt_client_t *>      clients; // raw clients open on the sim
    int                           next_port = 0;
    int                           engines   = 0;
    bool                          violation_reported = false;
};

SimState &S()
{
    static SimState s;
    return s;
}

uint64_t Fnv1a(const std::string &s)
{
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h = (h ^ c) * 1099511628211ull;
    }
    return h;
}

void NewWorld(const std::string &test)
{
    SimState   &s   = S();
    const char *env = getenv("KVT_SIM_SEED");

    s.nodes.clear();
    s.clients.clear();
    s.world.reset();
    s.seed      = Fnv1a(test) ^ (env != nullptr ? strtoull(env, nullptr, 0) : 0);
    s.world.reset(new sim::World(s.seed));
    s.driver    = -1;
    s.next_port = 0;
    s.engines   = 0;
    s.violation_reported = false;
    const char *tr = getenv("KVT_SIM_TRACE");
    s.world->set_trace(tr != nullptr && *tr != '\0' && *tr != '0');
}

sim::World *SimWorld()
{
    if (!S().world) {
        NewWorld("(outside a test)");
    }
    return S().world.get();
}

// CheckWorld reports the simulator's first invariant violation (a copy
// outside live registrations, a transport contract broken ...) once, as a
// failure of the running test.
void CheckWorld()
{
    SimState &s = S();
    if (s.world && s.world->Violated() && !s.violation_reported) {
        s.violation_reported = true;
        ADD_FAILURE() << "simulator invariant violated at step "
                      << s.world->ViolationStep() << ": "
                      << s.world->Violation() << " (seed " << s.seed << ")";
    }
}

class SimListener : public ::testing::EmptyTestEventListener {
    void OnTestStart(const ::testing::TestInfo &t) override
    {
        NewWorld(std::string(t.test_suite_name()) + "." + t.name());
        printf("[ sim      ] seed %" PRIu64 "\n", S().seed);
        fflush(stdout);
    }
    void OnTestEnd(const ::testing::TestInfo &t) override
    {
        SimState &s = S();
        if (!s.nodes.empty()) {
            printf("[ sim      ] %s.%s left %zu engines undestroyed\n",
                   t.test_suite_name(), t.name(), s.nodes.size());
        }
        printf("[ sim      ] %" PRIu64 " steps, %.3f s virtual\n",
               s.world->Steps(), (double)s.world->Now() / 1e6);
        s.clients.clear();
        s.nodes.clear();
        s.world.reset();
    }
};

const bool kListenerAdded = [] {
    ::testing::UnitTest::GetInstance()->listeners().Append(new SimListener);
    return true;
}();

// NodeScope: the world's current node is the engine's for its lifetime.
class NodeScope {
  public:
    explicit NodeScope(int node) : w_(SimWorld()), saved_(w_->Current())
    {
        if (node >= 0) {
            w_->SetCurrent(node);
        }
    }
    explicit NodeScope(kvx_engine_t *eng) : NodeScope(NodeOf(eng)) {}
    ~NodeScope() { w_->SetCurrent(saved_); }
    NodeScope(const NodeScope &)            = delete;
    NodeScope &operator=(const NodeScope &) = delete;

  private:
    static int NodeOf(kvx_engine_t *eng)
    {
        auto it = S().nodes.find(eng);
        return it == S().nodes.end() ? -1 : it->second;
    }
    sim::World *w_;
    int         saved_;
};

// JsonString: the string value of "key" in json (first occurrence), or def.
std::string JsonString(const char *json, const char *key,
                       const std::string &def)
{
    std::string s(json), k = std::string("\"") + key + "\"";
    size_t      p = s.find(k);
    if (p == std::string::npos) {
        return def;
    }
    p = s.find('"', s.find(':', p + k.size()));
    size_t e = p == std::string::npos ? p : s.find('"', p + 1);
    return e == std::string::npos ? def : s.substr(p + 1, e - p - 1);
}

kvx_status_t SimEngineCreate(const char *json, kvx_engine_t **eng_p)
{
    if (json == nullptr || eng_p == nullptr) {
        return kvc_api_table()->engine_create(json, eng_p);
    }
    sim::World *w    = SimWorld();
    std::string host = JsonString(json, "host_ip", "127.0.0.1");
    int         node = w->AddNode(host, "engine" +
                                            std::to_string(S().engines++) +
                                            "@" + host);
    kvt_env_t   env  = w->Env();
    NodeScope   scope(node);
    kvx_status_t st = kvc_engine_create_env(&env, json, eng_p);
    if (st == KVX_OK) {
        S().nodes[*eng_p] = node;
    }
    return st;
}

void SimEngineDestroy(kvx_engine_t *eng)
{
    {
        NodeScope scope(eng);
        kvc_api_table()->engine_destroy(eng);
    }
    S().nodes.erase(eng);
}

const kvx_api_t *SimApi()
{
    static const kvx_api_t table = [] {
        kvx_api_t t = *kvc_api_table();
        t.engine_create  = SimEngineCreate;
        t.engine_destroy = SimEngineDestroy;
#define KVT_SIM_AS_NODE(fn)                                                    \
    t.fn = [](kvx_engine_t *e, auto... a) {                                    \
        NodeScope scope(e);                                                    \
        return kvc_api_table()->fn(e, a...);                                   \
    }
        KVT_SIM_AS_NODE(config_dump);
        KVT_SIM_AS_NODE(alloc_region);
        KVT_SIM_AS_NODE(free_region);
        KVT_SIM_AS_NODE(register_layer);
        KVT_SIM_AS_NODE(start);
        KVT_SIM_AS_NODE(registration_payload);
        KVT_SIM_AS_NODE(producer_request);
        KVT_SIM_AS_NODE(consumer_request);
        KVT_SIM_AS_NODE(wait_layer);
        KVT_SIM_AS_NODE(wait_transfer);
        KVT_SIM_AS_NODE(poll_events);
        KVT_SIM_AS_NODE(transports);
        KVT_SIM_AS_NODE(layer_ready);
        KVT_SIM_AS_NODE(seal_transfer);
        KVT_SIM_AS_NODE(consumer_abort);
        KVT_SIM_AS_NODE(stats);
        KVT_SIM_AS_NODE(connect_peer);
        KVT_SIM_AS_NODE(wait_events);
#undef KVT_SIM_AS_NODE
        return t;
    }();
    return &table;
}

// ---- raw control clients on the simulated control plane ---------------------

struct SimReply {
    bool         done = false;
    kvx_status_t st   = KVX_ERR_INTERNAL;
    std::string  data; // reply, or the reason of a failure
};

void SimReplyFn(void *arg, kvx_status_t st, const char *reply, size_t len,
                const char *err)
{
    SimReply *r = static_cast<SimReply *>(arg);
    r->done     = true;
    r->st       = st;
    if (st == KVX_OK) {
        r->data.assign(reply, len);
    } else {
        r->data = err != nullptr ? err : "";
    }
}

kvt_client_t *SimClient(kvn_client *cli)
{
    kvt_client_t *c = reinterpret_cast<kvt_client_t *>(cli);
    return S().clients.count(c) != 0 ? c : nullptr;
}

} // namespace

extern "C" kvx_status_t kvt_sim_kvn_client_open(const char *host,
                                                uint32_t port,
                                                kvn_client **cli_p)
{
    SimState   &s = S();
    sim::World *w = SimWorld();
    if (s.driver < 0) {
        s.driver = w->AddNode("127.0.0.1", "test-client");
    }
    NodeScope     scope(s.driver);
    kvt_client_t *c  = nullptr;
    kvx_status_t  st = sim::World::CtlOps()->client_open(host, port, 1, nullptr, &c);
    if (st == KVX_OK) {
        s.clients.insert(c);
        *cli_p = reinterpret_cast<kvn_client *>(c);
    }
    return st;
}

extern "C" kvx_status_t kvt_sim_kvn_client_request(kvn_client *cli,
                                                   const void *msg, size_t len,
                                                   int timeout_ms,
                                                   char **reply_p,
                                                   size_t *reply_len_p)
{
    kvt_client_t *c = SimClient(cli);
    if (c == nullptr) {
        return kvn_client_request(cli, msg, len, timeout_ms, reply_p,
                                  reply_len_p);
    }
    sim::World *w = SimWorld();
    // Heap: a reply that could still come after we gave up must not land
    // on this stack frame (the simulated request has its own deadline, so
    // it always completes; the bound below is a safety net).
    SimReply   *r = new SimReply;
    kvx_status_t st;
    {
        NodeScope scope(S().driver);
        st = sim::World::CtlOps()->client_post(c, msg, len, timeout_ms,
                                               SimReplyFn, r);
    }
    if (st != KVX_OK) {
        delete r;
        return st;
    }
    uint64_t end = w->Now() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) *
                                  1000u + 1000000u;
    while (!r->done && w->Now() < end) {
        w->WaitUntil(end);
    }
    CheckWorld();
    if (!r->done) {
        return kvc_error(KVX_ERR_INTERNAL, "sim: request never completed");
    }
    std::unique_ptr<SimReply> own(r);
    if (r->st != KVX_OK) {
        return kvc_error(r->st, "sim request: %s", r->data.c_str());
    }
    *reply_len_p = r->data.size();
    *reply_p     = static_cast<char *>(malloc(r->data.size() + 1));
    if (*reply_p == nullptr) {
        return kvc_error(KVX_ERR_NO_MEMORY, "reply: out of memory");
    }
    memcpy(*reply_p, r->data.data(), r->data.size());
    (*reply_p)[r->data.size()] = '\0';
    return KVX_OK;
}

extern "C" void kvt_sim_kvn_client_close(kvn_client *cli)
{
    kvt_client_t *c = SimClient(cli);
    if (c == nullptr) {
        kvn_client_close(cli);
        return;
    }
    S().clients.erase(c);
    NodeScope scope(S().driver);
    sim::World::CtlOps()->client_close(c);
}
#endif // KVT_SIM_TRANSPORTS

namespace kvt {

const kvx_api_t *Api()
{
#if KVT_SIM_TRANSPORTS
    return SimApi();
#else
    return kvc_api_table();
#endif
}

TestClock::time_point TestClock::now()
{
#if KVT_SIM_TRANSPORTS
    return time_point(duration((rep)SimWorld()->Now()));
#else
    return time_point(std::chrono::duration_cast<duration>(
        std::chrono::steady_clock::now().time_since_epoch()));
#endif
}

ModelSpec ThreeLayerModel()
{
    ModelSpec m;
    m.layers = {{"model.layers.0.attn", "split"},
                {"model.layers.1.attn", "interleaved"},
                {"model.layers.1.indexer", "key_only"}};
    return m;
}

ModelSpec MixedModel()
{
    ModelSpec m;
    for (int i = 0; i < 4; i++) {
        m.layers.push_back({"model.layers." + std::to_string(i) + ".attn",
                            "split"});
    }
    m.layers.push_back({"model.layers.1.indexer", "key_only"});
    m.layers.push_back({"model.layers.3.indexer", "key_only"});
    m.layers.push_back({"model.layers.4.attn", "interleaved"});
    return m;
}

long long StatAwait(kvx_engine_t *eng, const std::string &key, long long want,
                    int timeout_ms)
{
    WaitFor([&] { return StatCount(eng, key) >= want; }, timeout_ms);
    return StatCount(eng, key);
}

long long StatCount(kvx_engine_t *eng, const std::string &key)
{
    char *json = nullptr;
    if (Api()->stats(eng, &json) != KVX_OK) {
        return -1;
    }
    std::string s(json), leaf = key;
    Api()->free(json);
    size_t dot = key.find('.'), at = 0;
    if (dot != std::string::npos) {
        at   = s.find("\"" + key.substr(0, dot) + "\"");
        leaf = key.substr(dot + 1);
        if (at == std::string::npos) {
            return -1;
        }
    }
    size_t p = s.find("\"" + leaf + "\":", at);
    if (p == std::string::npos) {
        return -1;
    }
    return std::stoll(s.substr(p + leaf.size() + 3));
}

Rank::~Rank()
{
    Api()->engine_destroy(eng);
#if KVT_SIM_TRANSPORTS
    CheckWorld();
#endif
}

uint16_t PortBase(int span)
{
#if KVT_SIM_TRANSPORTS
    // One world per test: ports need only be unique within it, and the same
    // in every run (they appear in messages and reasons).
    int off = S().next_port;
    S().next_port += span + 1;
    return (uint16_t)(2000 + off % 10400);
#else
    // Handshake ports come from [2000, 12500); the matching notify port is
    // +20000. Both stay below Linux's ephemeral range (32768+), so outgoing
    // connections never hold them. Each process starts at a pid-dependent
    // offset so that parallel test binaries rarely collide.
    static std::atomic<int> next{(int)(getpid() % 200) * 50};
    int off = next.fetch_add(span + 1);
    return (uint16_t)(2000 + off % 10400);
#endif
}

std::string RankConfig(const RankOpts &o)
{
    char buf[2048];
    snprintf(buf, sizeof(buf),
             "{\"role\":\"%s\",\"tp_rank\":%u,\"tp_size\":%u,"
             "\"kv_connector_extra_config\":{\"host_ip\":\"%s\","
             "\"handshake_port\":%u,\"notify_port\":%u,\"read_mode\":%s,"
             "\"ucx_tls\":\"%s\",\"handshake_timeout\":%.3f,"
             "\"transfer_timeout\":%.3f,\"defer_timeout\":%.3f%s%s}}",
             o.producer ? "kv_producer" : "kv_consumer", o.tp_rank, o.tp_size,
             o.host.c_str(), o.hs_port, o.notify_port,
             o.read_mode ? "true" : "false", o.tls.c_str(),
             o.handshake_timeout, o.transfer_timeout, o.defer_timeout,
             o.extra.empty() ? "" : ",", o.extra.c_str());
    return buf;
}

std::string CtlTlsExtra()
{
    static std::string extra;
    static bool        tried = false;

    if (tried) {
        return extra;
    }
    tried = true;
    char dir[] = "/tmp/kvxfer-integ-pki-XXXXXX";
    if (mkdtemp(dir) == nullptr) {
        fprintf(stderr, "CtlTlsExtra: mkdtemp: %s\n", strerror(errno));
        return extra;
    }
    const std::string d   = dir;
    const std::string ec  = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1"
                            " -nodes";
    const std::string cmd =
        "openssl req -x509" + ec + " -keyout " + d + "/ca.key -out " + d +
        "/ca.crt -subj /CN=kvxfer-integ-ca -days 2 2>/dev/null &&"
        " openssl req" + ec + " -keyout " + d + "/peer.key -out " + d +
        "/peer.csr -subj /CN=kvxfer-peer 2>/dev/null &&"
        " openssl x509 -req -in " + d + "/peer.csr -CA " + d +
        "/ca.crt -CAkey " + d + "/ca.key -CAcreateserial -out " + d +
        "/peer.crt -days 2 2>/dev/null";
    if (system(cmd.c_str()) != 0) {
        fprintf(stderr, "CtlTlsExtra: openssl failed (%s)\n", cmd.c_str());
        return extra;
    }
    static std::string rm = "rm -rf " + d;
    atexit([] { (void)!system(rm.c_str()); });
    extra = "\"tls_cert_file\":\"" + d + "/peer.crt\",\"tls_key_file\":\"" +
            d + "/peer.key\",\"tls_ca_file\":\"" + d +
            "/ca.crt\",\"tls_peer_name\":\"kvxfer-peer\"";
    return extra;
}

bool CtlTlsOn(kvx_engine_t *eng)
{
    char *js = nullptr;
    bool  on = false;

    if (Api()->config_dump(eng, &js) == KVX_OK && js != nullptr) {
        on = strstr(js, "kvxfer-integ-pki-") != nullptr &&
             strstr(js, "peer.crt") != nullptr;
        Api()->free(js);
    }
    return on;
}

int Units(const LayerSpec &l)
{
    return l.kind == "key_only" ? 1 : 2;
}

uint64_t UnitLen(const ModelSpec &m, const LayerSpec &l)
{
    if (l.kind == "key_only") {
        return (uint64_t)m.block_size * m.head_dim * m.elem;
    }
    return (uint64_t)m.block_size * m.heads * m.head_dim * m.elem;
}

uint64_t UnitOffset(const ModelSpec &m, const LayerSpec &l, uint32_t nb,
                    uint64_t block, int unit)
{
    uint64_t blk = UnitLen(m, l);
    if (l.kind == "split") {
        return (uint64_t)unit * nb * blk + block * blk;
    }
    if (l.kind == "interleaved") {
        return block * 2 * blk + (uint64_t)unit * blk;
    }
    return block * blk;
}

uint8_t Pattern(uint32_t rank, uint32_t layer, uint64_t block, int unit,
                uint64_t i)
{
    uint64_t h = 1469598103934665603ull;
    uint64_t v[5] = {rank, layer, block, (uint64_t)unit, i};
    for (uint64_t x : v) {
        h = (h ^ x) * 1099511628211ull;
    }
    /* Finalizer (splitmix64): every input bit reaches the output byte, so
     * neighbouring bytes of one unit differ and a misplaced range within a
     * unit is caught (a bare FNV step left the byte constant per unit). */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return (uint8_t)h;
}

void Describe(const ModelSpec &m, const LayerSpec &l, uint32_t nb, void *base,
              size_t len, kvx_layer_desc_t *d)
{
    memset(d, 0, sizeof(*d));
    d->struct_size  = sizeof(*d);
    d->name         = l.name.c_str();
    d->base         = base;
    d->length       = len;
    d->mem_type     = KVX_MEM_HOST;
    d->elem_size    = m.elem;
    d->block_size   = m.block_size;
    d->num_kv_heads = m.heads;
    d->head_size    = m.head_dim;
    if (l.kind == "split") {
        int64_t s[5] = {2, nb, m.block_size, m.heads, m.head_dim};
        d->ndim = 5;
        memcpy(d->shape, s, sizeof(s));
    } else if (l.kind == "interleaved") {
        int64_t s[5] = {nb, 2, m.block_size, m.heads, m.head_dim};
        d->ndim = 5;
        memcpy(d->shape, s, sizeof(s));
    } else {
        int64_t s[3] = {nb, m.block_size, m.head_dim};
        d->ndim         = 3;
        d->key_only     = 1;
        d->num_kv_heads = 1;
        memcpy(d->shape, s, sizeof(s));
    }
    int64_t stride = 1;
    for (int k = (int)d->ndim - 1; k >= 0; k--) {
        d->stride[k] = stride;
        stride *= d->shape[k];
    }
}

kvx_status_t MakeRank(const ModelSpec &m, const RankOpts &o, Rank *r)
{
    std::string  cfg = RankConfig(o);
    kvx_status_t st  = Api()->engine_create(cfg.c_str(), &r->eng);
    if (st != KVX_OK) {
        return st;
    }
    r->num_blocks = o.num_blocks;
    r->tp_rank    = o.tp_rank;
    r->bufs.resize(m.layers.size());
    r->descs.resize(m.layers.size());
    for (size_t li = 0; li < m.layers.size(); li++) {
        const LayerSpec &l   = m.layers[li];
        uint64_t         len = UnitLen(m, l) * Units(l) * o.num_blocks;
        r->bufs[li].assign(len, 0xEE);
        if (o.producer) {
            for (uint64_t b = 0; b < o.num_blocks; b++) {
                for (int u = 0; u < Units(l); u++) {
                    uint8_t *p = r->bufs[li].data() +
                                 UnitOffset(m, l, o.num_blocks, b, u);
                    for (uint64_t i = 0; i < UnitLen(m, l); i++) {
                        p[i] = Pattern(o.tp_rank, (uint32_t)li, b, u, i);
                    }
                }
            }
        }
        void *mem = r->bufs[li].data();
        if (o.region) {
            st = Api()->alloc_region(r->eng, len, &mem);
            if (st != KVX_OK) {
                return st;
            }
            memcpy(mem, r->bufs[li].data(), len);
            r->region.push_back((uint8_t *)mem);
        }
        Describe(m, l, o.num_blocks, mem, len, &r->descs[li]);
        st = Api()->register_layer(r->eng, &r->descs[li]);
        if (st != KVX_OK) {
            return st;
        }
    }
    return Api()->start(r->eng);
}

void SyncFromRegion(Rank *r)
{
    for (size_t li = 0; li < r->region.size(); li++) {
        memcpy(r->bufs[li].data(), r->region[li], r->bufs[li].size());
    }
}

// FirstDiff: "" or the first byte where layer li of D differs from want.
static std::string FirstDiff(size_t li, const LayerSpec &l,
                             const std::vector<uint8_t> &want,
                             const std::vector<uint8_t> &got)
{
    for (size_t i = 0; i < want.size(); i++) {
        if (want[i] != got[i]) {
            char buf[256];
            snprintf(buf, sizeof(buf),
                     "layer %zu (%s) byte %zu: got 0x%02x want 0x%02x", li,
                     l.kind.c_str(), i, got[i], want[i]);
            return buf;
        }
    }
    return "";
}

std::string VerifyPull(const ModelSpec &m, const Rank &d, uint32_t src_rank,
                       const std::vector<uint64_t> &local,
                       const std::vector<uint64_t> &remote)
{
    size_t skip = remote.size() - local.size();
    for (size_t li = 0; li < m.layers.size(); li++) {
        const LayerSpec     &l = m.layers[li];
        std::vector<uint8_t> want(d.bufs[li].size(), 0xEE);
        for (size_t k = 0; k < local.size(); k++) {
            for (int u = 0; u < Units(l); u++) {
                uint8_t *p = want.data() +
                             UnitOffset(m, l, d.num_blocks, local[k], u);
                for (uint64_t i = 0; i < UnitLen(m, l); i++) {
                    p[i] = Pattern(src_rank, (uint32_t)li, remote[skip + k], u,
                                   i);
                }
            }
        }
        std::string diff = FirstDiff(li, l, want, d.bufs[li]);
        if (!diff.empty()) {
            return diff;
        }
    }
    return "";
}

std::string VerifyPullHeads(const ModelSpec &m, uint32_t p_heads,
                            const Rank &d, const std::vector<uint32_t> &keys,
                            uint32_t slice, const std::vector<uint64_t> &local,
                            const std::vector<uint64_t> &remote)
{
    const bool     gather = m.heads > p_heads;
    const uint64_t row    = (uint64_t)m.head_dim * m.elem; /* one head */
    size_t         skip   = remote.size() - local.size();

    for (size_t li = 0; li < m.layers.size(); li++) {
        const LayerSpec     &l = m.layers[li];
        std::vector<uint8_t> want(d.bufs[li].size(), 0xEE);
        for (size_t k = 0; k < local.size(); k++) {
            for (int u = 0; u < Units(l); u++) {
                uint8_t *p = want.data() +
                             UnitOffset(m, l, d.num_blocks, local[k], u);
                uint64_t rb = remote[skip + k];
                if (l.kind == "key_only") { /* replicated: whole, from 0 */
                    for (uint64_t i = 0; i < UnitLen(m, l); i++) {
                        p[i] = Pattern(keys[0], (uint32_t)li, rb, u, i);
                    }
                    continue;
                }
                for (uint64_t t = 0; t < m.block_size; t++) {
                    for (uint64_t h = 0; h < m.heads; h++) {
                        uint32_t key   = gather ? keys[h / p_heads] : keys[0];
                        uint64_t ph    = gather ? h % p_heads
                                                : slice * m.heads + h;
                        uint64_t p_off = (t * p_heads + ph) * row;
                        uint64_t d_off = (t * m.heads + h) * row;
                        for (uint64_t e = 0; e < row; e++) {
                            p[d_off + e] = Pattern(key, (uint32_t)li, rb, u,
                                                   p_off + e);
                        }
                    }
                }
            }
        }
        std::string diff = FirstDiff(li, l, want, d.bufs[li]);
        if (!diff.empty()) {
            return diff;
        }
    }
    return "";
}

bool WaitFor(const std::function<bool()> &cond, int timeout_ms)
{
#if KVT_SIM_TRANSPORTS
    sim::World *w   = SimWorld();
    uint64_t    end = w->Now() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) *
                                     1000u;
    bool        ok  = true;
    while (!cond()) {
        if (w->Now() >= end) {
            ok = cond();
            break;
        }
        w->WaitUntil(end); // one step, or the deadline when nothing is due
    }
    CheckWorld();
    return ok;
#else
    auto end = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(timeout_ms);
    while (!cond()) {
        if (std::chrono::steady_clock::now() >= end) {
            return cond();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
#endif
}

int DrainEvents(kvx_engine_t *eng, std::vector<kvx_event_t> *out)
{
    kvx_event_t evs[16];
    int         total = 0, n;
    while ((n = Api()->poll_events(eng, evs, 16)) > 0) {
        out->insert(out->end(), evs, evs + n);
        total += n;
    }
    return total;
}

void FreeEvents(std::vector<kvx_event_t> *evs)
{
    for (auto &e : *evs) {
        Api()->free(e.block_ids);
    }
    evs->clear();
}

std::string Params(const std::string &tid, const std::string &host,
                   uint16_t hs, uint16_t notify,
                   const std::vector<uint64_t> &remote_ids, uint32_t remote_tp,
                   const std::string &more)
{
    std::string ids;
    for (size_t i = 0; i < remote_ids.size(); i++) {
        ids += (i ? "," : "") + std::to_string(remote_ids[i]);
    }
    std::string s = "{\"transfer_id\":\"" + tid + "\",\"do_remote_prefill\":true";
    if (!host.empty()) {
        s += ",\"remote_host\":\"" + host + "\",\"remote_handshake_port\":" +
             std::to_string(hs) + ",\"remote_notify_port\":" +
             std::to_string(notify);
    }
    s += ",\"remote_block_ids\":[" + ids + "],\"remote_tp_size\":" +
         std::to_string(remote_tp) + ",\"remote_engine_id\":\"x\"";
    s += more + "}";
    return s;
}

} // namespace kvt
