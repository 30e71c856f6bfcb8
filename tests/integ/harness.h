// harness.h - helpers for integration tests: real engines (UCX + nng) in
// this process, a 3-layer model with mixed layouts, byte patterns keyed by
// (rank, layer, block), and condition waits with deadlines.
//
// Built with -DKVT_SIM_TRANSPORTS=1 (integ_sim_tests) the same helpers run
// the engines on the deterministic simulator (tests/sim): one simulated node
// per engine, one sim::World per test (seeded from the test's name; the
// seed is printed, KVT_SIM_SEED=N varies it, KVT_SIM_TRACE=1 prints every
// step), waits and clocks in the world's virtual time. The raw control
// clients of the tests (kvn_client_open / _request / _close) are then
// clients of the simulated control plane, on a node of their own.
#ifndef KVT_HARNESS_H
#define KVT_HARNESS_H

#include <kvxfer/kvxfer.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#if KVT_SIM_TRANSPORTS
#include <cstddef>
extern "C" {
struct kvn_client;
kvx_status_t kvt_sim_kvn_client_open(const char *host, uint32_t port,
                                     struct kvn_client **cli_p);
kvx_status_t kvt_sim_kvn_client_request(struct kvn_client *cli,
                                        const void *msg, size_t len,
                                        int timeout_ms, char **reply_p,
                                        size_t *reply_len_p);
void         kvt_sim_kvn_client_close(struct kvn_client *cli);
}
// Included before nng/kvn.h by every test file: the synchronous client calls
// of the tests reach the simulated control plane (other kvn_* calls stay the
// real nng ones; the tests using them are not run on the simulator).
#define kvn_client_open    kvt_sim_kvn_client_open
#define kvn_client_request kvt_sim_kvn_client_request
#define kvn_client_close   kvt_sim_kvn_client_close
#endif

namespace kvt {

// Api: the library's function table. On the simulator, engine_create puts
// the engine on a new simulated node (host: its host_ip) and every call
// taking an engine runs as that node.
const kvx_api_t *Api();

// TestClock: the clock the engines under test run on - std::chrono::
// steady_clock with the real transports, the world's virtual clock on the
// simulator. Durations the tests measure around engine calls use it.
struct TestClock {
    using duration   = std::chrono::microseconds;
    using rep        = duration::rep;
    using period     = duration::period;
    using time_point = std::chrono::time_point<TestClock, duration>;
    static constexpr bool is_steady = true;
    static time_point     now();
};

// A layer of the test model. kind: "split", "interleaved", "key_only".
struct LayerSpec {
    std::string name;
    std::string kind;
};

struct ModelSpec {
    std::vector<LayerSpec> layers;
    uint32_t               block_size = 4;
    uint32_t               heads      = 2;
    uint32_t               head_dim   = 16;
    uint32_t               elem       = 2;
};

ModelSpec ThreeLayerModel();
// MixedModel: 4 dense split K/V layers, 2 key-only indexer layers and one
// interleaved layer (the mixed-layout model).
ModelSpec MixedModel();
// StatCount reads one counter ("rx.write_done", "tx_msgs", ...) from
// api->stats() of eng; -1 if absent.
long long StatCount(kvx_engine_t *eng, const std::string &key);
// StatAwait: the stat once it reached want, or its value at the deadline
// (D WRITE's write_done may arrive after the data-plane notice completed
// the transfer).
long long StatAwait(kvx_engine_t *eng, const std::string &key, long long want,
                    int timeout_ms = 10000);

// One rank: an engine and its layer buffers.
struct Rank {
    kvx_engine_t                    *eng = nullptr;
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<kvx_layer_desc_t>    descs;
    uint32_t                         num_blocks = 0;
    uint32_t                         tp_rank    = 0;
    // With RankOpts::region the layers live in UCX-allocated memory here;
    // bufs then mirror it (SyncFromRegion copies it back for checks).
    std::vector<uint8_t *>           region;
    ~Rank();
};

struct RankOpts {
    bool        producer   = true;
    uint32_t    tp_rank    = 0;
    uint32_t    tp_size    = 1;
    uint32_t    num_blocks = 32;
    uint16_t    hs_port    = 0;
    uint16_t    notify_port = 0;
    std::string tls        = "tcp";
    std::string host       = "127.0.0.1";
    std::string extra;       // extra JSON members of extra_config
    bool        read_mode  = true;
    bool        region     = false; // layers in api->alloc_region memory
    double      handshake_timeout = 5.0;
    double      transfer_timeout  = 20.0;
    double      defer_timeout     = 60.0;
};

// PortBase returns a base port unique to this process and call (< 12500;
// notify ports at +20000). On the simulator: unique within the test, the same
// sequence in every run.
uint16_t PortBase(int span);

std::string RankConfig(const RankOpts &o);
// CtlTlsExtra: extra config members that turn on mutual TLS on the control
// plane (tls_cert_file, tls_key_file, tls_ca_file, tls_peer_name), with a
// CA and one peer certificate made by openssl in a temporary directory at
// the first call (removed at exit). "" when openssl failed (the reason is
// printed).
std::string CtlTlsExtra();
// CtlTlsOn: the engine's effective configuration (config_dump) names the
// certificate CtlTlsExtra made.
bool        CtlTlsOn(kvx_engine_t *eng);
// MakeRank creates, registers the model's layers (filled with the pattern
// of `pattern_rank` for producers, 0xEE for consumers) and starts.
kvx_status_t MakeRank(const ModelSpec &m, const RankOpts &o, Rank *r);

// SyncFromRegion copies region-resident layers back into r->bufs.
void SyncFromRegion(Rank *r);

// Pattern byte of (rank, layer, block, unit, offset).
uint8_t Pattern(uint32_t rank, uint32_t layer, uint64_t block, int unit,
                uint64_t i);

// Geometry helpers of the test model (independent of the library).
uint64_t UnitLen(const ModelSpec &m, const LayerSpec &l);
int      Units(const LayerSpec &l);
uint64_t UnitOffset(const ModelSpec &m, const LayerSpec &l, uint32_t nb,
                    uint64_t block, int unit);

// Describe fills a layer descriptor of the test model (contiguous tensor of
// nb blocks at base) for api->register_layer.
void Describe(const ModelSpec &m, const LayerSpec &l, uint32_t nb, void *base,
              size_t len, kvx_layer_desc_t *d);

// VerifyPull checks that D's layer buffers hold P rank src_rank's blocks
// remote[i] at local[i] (last-remote pairing) and the 0xEE fill elsewhere.
// Returns "" or a description of the first mismatch.
std::string VerifyPull(const ModelSpec &m, const Rank &d, uint32_t src_rank,
                       const std::vector<uint64_t> &local,
                       const std::vector<uint64_t> &remote);

// VerifyPullHeads is VerifyPull for sharded heterogeneous TP (token-major
// blocks): D (m, m.heads heads per rank) against P ranks of p_heads heads
// whose patterns are keyed by keys. m.heads < p_heads: D holds head slice
// `slice` of keys[0]'s blocks; m.heads > p_heads: D's heads k*p_heads ..
// come from keys[k]. Key-only layers hold keys[0]'s whole blocks.
std::string VerifyPullHeads(const ModelSpec &m, uint32_t p_heads,
                            const Rank &d, const std::vector<uint32_t> &keys,
                            uint32_t slice, const std::vector<uint64_t> &local,
                            const std::vector<uint64_t> &remote);

// WaitFor polls cond every 2 ms until true or timeout_ms passed (on the
// simulator: runs the world step by step, cond checked after each, until
// true or timeout_ms of virtual time passed).
bool WaitFor(const std::function<bool()> &cond, int timeout_ms);

// DrainEvents polls events of an engine into out; returns count.
int DrainEvents(kvx_engine_t *eng, std::vector<kvx_event_t> *out);
void FreeEvents(std::vector<kvx_event_t> *evs);

std::string Params(const std::string &tid, const std::string &host,
                   uint16_t hs, uint16_t notify,
                   const std::vector<uint64_t> &remote_ids,
                   uint32_t remote_tp, const std::string &more = "");

} // namespace kvt

#endif
