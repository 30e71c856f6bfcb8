// harness.cc - see harness.h.
#include "harness.h"

extern "C" {
#include "api.h"
}

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>

namespace kvt {

const kvx_api_t *Api()
{
    return kvc_api_table();
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
}

uint16_t PortBase(int span)
{
    // Handshake ports come from [2000, 12500); the matching notify port is
    // +20000. Both stay below Linux's ephemeral range (32768+), so outgoing
    // connections never hold them. Each process starts at a pid-dependent
    // offset so that parallel test binaries rarely collide.
    static std::atomic<int> next{(int)(getpid() % 200) * 50};
    int off = next.fetch_add(span + 1);
    return (uint16_t)(2000 + off % 10400);
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
