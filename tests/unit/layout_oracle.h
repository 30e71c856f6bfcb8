// layout_oracle.h - the KV-cache oracle of the layout tests, written from
// first principles (never with the library's layout code): a cache is a
// torch tensor (logical shape as a framework passes it, strides in elements
// for a chosen physical order of the axes); the byte of element idx is
// sum(idx[i] * stride[i]) * elem_size; every element's value is a function
// of (P block, K/V, logical token, global KV head, dim, byte). Heads per
// rank follow vLLM: at TP t with H KV heads rank r holds H/t heads from
// r*H/t, or with t > H the one head r*H/t (replicated).
// Used by tests/unit/test_layout_prop.cc and tests/integ/hnd_procs.cc.
#ifndef KVX_TESTS_LAYOUT_ORACLE_H
#define KVX_TESTS_LAYOUT_ORACLE_H

#include <kvxfer/kvxfer.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace oracle {

enum Kind { kSplit, kInter, kPacked, kKeyOnly, kSplitK, kInterK, kNumKinds };
inline const char *const kKindName[] = {"split", "interleaved", "packed", "key-only",
                                 "split-kernel", "interleaved-kernel"};

// Axis roles of the oracle's tensors.
enum Role { rKV, rBlk, rTok, rHead, rDim };

struct Model {
    Kind     kind;
    uint32_t heads;     // total KV heads (ignored for key-only)
    uint32_t bs, k;     // tokens per block, kernel blocks per block
    uint32_t d, dv;     // head dims (dv: packed V dim)
    uint32_t elem;      // bytes per element
    bool     hnd_shape; // shape [.., H, BS, D] instead of [.., BS, H, D]
    // physical order of the axes, outermost first, as logical axis indices
    std::vector<int> phys;
    std::vector<int> d_phys; // D's own order (empty: the same as P's)
    bool     free_perm; // phys drawn from all permutations (may be refused)
    uint32_t p_tp, d_tp;
    uint32_t p_nb, d_nb;
    std::vector<uint64_t> p_ids, d_ids;
    bool     write;
};

// One rank's tensor: logical axes (role, size) and element strides.
struct Tensor {
    std::vector<Role>    role;
    std::vector<int64_t> size, stride;
    uint64_t             elems = 0;
};

inline uint32_t RankHeads(const Model &m, uint32_t tp)
{
    return tp <= m.heads ? m.heads / tp : 1;
}

inline uint32_t RankHead0(const Model &m, uint32_t tp, uint32_t rank)
{
    return tp <= m.heads ? rank * (m.heads / tp) : rank * m.heads / tp;
}

// Logical shape of one rank's cache, exactly as a framework passes it.
inline Tensor MakeTensor(const Model &m, uint32_t nb, uint32_t heads,
                  const std::vector<int> &phys)
{
    Tensor   t;
    uint32_t kbs = m.bs / m.k;
    auto     add = [&](Role r, int64_t n) {
        t.role.push_back(r);
        t.size.push_back(n);
    };
    auto tok_head = [&](uint32_t tok) {
        if (m.hnd_shape) {
            add(rHead, heads);
            add(rTok, tok);
        } else {
            add(rTok, tok);
            add(rHead, heads);
        }
    };
    switch (m.kind) {
    case kSplit:
    case kSplitK:
        add(rKV, 2);
        add(rBlk, (int64_t)nb * m.k);
        tok_head(kbs);
        add(rDim, m.d);
        break;
    case kInter:
    case kInterK:
        add(rBlk, (int64_t)nb * m.k);
        add(rKV, 2);
        tok_head(kbs);
        add(rDim, m.d);
        break;
    case kPacked:
        add(rBlk, nb);
        add(rHead, heads);
        add(rTok, m.bs);
        add(rDim, m.d + m.dv);
        break;
    case kKeyOnly:
        add(rBlk, (int64_t)nb * m.k);
        add(rTok, kbs);
        add(rDim, m.d);
        break;
    default:
        break;
    }
    // Strides: contiguous in the physical order m.phys.
    t.stride.assign(t.size.size(), 0);
    int64_t s = 1;
    for (size_t i = phys.size(); i-- > 0;) {
        t.stride[phys[i]] = s;
        s *= t.size[phys[i]];
    }
    t.elems = (uint64_t)s;
    return t;
}

inline uint8_t Value(uint64_t pblock, uint32_t kv, uint32_t tok, uint32_t head,
              uint32_t dim, uint32_t byte, uint64_t salt)
{
    uint64_t z = salt ^ (pblock * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)kv << 60) ^ ((uint64_t)tok << 40) ^
                 ((uint64_t)head << 28) ^ ((uint64_t)dim << 8) ^ byte;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint8_t)(z ^ (z >> 31));
}

// Writes into buf every element of `block` of tensor t with the values of
// P block `pblock`, local head j being global head head0 + j.
inline void WriteBlock(const Model &m, const Tensor &t, std::vector<uint8_t> *buf,
                uint64_t block, uint64_t pblock, uint32_t head0,
                uint64_t salt)
{
    size_t              n = t.size.size();
    std::vector<int64_t> idx(n, 0);
    uint32_t            kbs = m.bs / m.k;
    int                 blk = -1;

    for (size_t i = 0; i < n; i++) {
        if (t.role[i] == rBlk) {
            blk = (int)i;
        }
    }
    for (;;) {
        // this element, when its block axis lies in `block`
        uint32_t kv = 0, tok = 0, head = 0, dim = 0, kb = 0;
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            int64_t v = idx[i];
            switch (t.role[i]) {
            case rKV: kv = (uint32_t)v; break;
            case rBlk: kb = (uint32_t)v; break;
            case rTok: tok = (uint32_t)v; break;
            case rHead: head = (uint32_t)v; break;
            case rDim: dim = (uint32_t)v; break;
            }
        }
        uint64_t abs_blk = block * m.k + kb;
        for (size_t i = 0; i < n; i++) {
            off += (uint64_t)(t.role[i] == rBlk ? (int64_t)abs_blk : idx[i]) *
                   (uint64_t)t.stride[i];
        }
        uint32_t logical_tok = kb * kbs + tok;
        uint32_t g = m.kind == kKeyOnly ? 0 : head0 + head;
        for (uint32_t b = 0; b < m.elem; b++) {
            (*buf)[off * m.elem + b] =
                Value(pblock, kv, logical_tok, g, dim, b, salt);
        }
        // next index, the block axis running over k kernel blocks only
        size_t i = n;
        while (i-- > 0) {
            int64_t lim = (int)i == blk ? m.k : t.size[i];
            if (++idx[i] < lim) {
                break;
            }
            idx[i] = 0;
        }
        if (i == (size_t)-1) {
            return;
        }
    }
}

inline kvx_layer_desc_t Desc(const Model &m, const Tensor &t, std::vector<uint8_t> *buf,
                      uint32_t heads)
{
    kvx_layer_desc_t d = {};
    d.struct_size  = sizeof(d);
    d.name         = "layer";
    d.base         = buf->data();
    d.length       = buf->size();
    d.ndim         = (uint32_t)t.size.size();
    for (size_t i = 0; i < t.size.size(); i++) {
        d.shape[i]  = t.size[i];
        d.stride[i] = t.stride[i];
    }
    d.elem_size    = m.elem;
    d.block_size   = m.bs;
    d.num_kv_heads = m.kind == kKeyOnly ? 0 : heads;
    d.head_size    = m.d;
    d.head_size_v  = m.kind == kPacked ? m.dv : 0;
    d.key_only     = m.kind == kKeyOnly;
    return d;
}

// DrawModel: a random case. Supported physical orders keep the block axes
// (K/V and blocks; kernel split: K/V then blocks) outside a unit whose own
// axes come in any order; with free_perm any order at all.
inline Model DrawModel(std::mt19937_64 &rng)
{
    auto pick = [&](std::initializer_list<uint32_t> v) {
        return *(v.begin() + rng() % v.size());
    };
    Model m;
    m.kind      = (Kind)(rng() % kNumKinds);
    m.heads     = pick({1, 2, 4, 8});
    m.elem      = pick({1, 2, 4});
    m.d         = 1 + rng() % 6;
    m.dv        = 1 + rng() % 6;
    m.hnd_shape = rng() % 2;
    m.k         = 1;
    m.bs        = pick({1, 2, 3, 4, 5, 6, 8});
    if (m.kind == kSplitK || m.kind == kInterK ||
        (m.kind == kKeyOnly && rng() % 2)) {
        m.bs = pick({4, 6, 8, 12, 16});
        std::vector<uint32_t> ks;
        for (uint32_t k = 2; k <= m.bs; k++) {
            if (m.bs % k == 0 && k < m.bs) {
                ks.push_back(k);
            }
        }
        m.k = ks[rng() % ks.size()];
    }
    m.p_tp  = pick({1, 2, 4, 8});
    m.d_tp  = pick({1, 2, 4, 8});
    m.write = rng() % 2;
    // physical order
    size_t ndim = m.kind == kKeyOnly ? 3 : m.kind == kPacked ? 4 : 5;
    m.free_perm = rng() % 6 == 0;
    m.phys.resize(ndim);
    for (size_t i = 0; i < ndim; i++) {
        m.phys[i] = (int)i;
    }
    auto order = [&](std::vector<int> *ph) {
        if (m.free_perm) {
            std::shuffle(ph->begin(), ph->end(), rng);
            return;
        }
        size_t inner = ndim == 5 ? 2 : 1; // unit axes start here
        if (ndim == 5 && m.kind != kSplitK && m.kind != kInterK && rng() % 2) {
            std::swap((*ph)[0], (*ph)[1]); // K/V plane inside or outside
        }
        std::shuffle(ph->begin() + (long)inner, ph->end(), rng);
    };
    order(&m.phys);
    if (rng() % 6 == 0) {
        // D on another backend: its own order of the same axes
        m.d_phys.resize(ndim);
        for (size_t i = 0; i < ndim; i++) {
            m.d_phys[i] = (int)i;
        }
        order(&m.d_phys);
        if (m.d_phys == m.phys) {
            m.d_phys.clear();
        }
    }
    // blocks and ids (distinct, random order), a prefix hit on D
    // (num_blocks 2 with a K/V axis of 2 is ambiguous: drawn rarely)
    m.p_nb = rng() % 16 == 0 ? 2 : 3 + rng() % 6;
    m.d_nb = rng() % 16 == 0 ? 2 : 1 + rng() % 8;
    if (m.d_nb == 2 && rng() % 2) {
        m.d_nb = 1;
    }
    size_t np = 1 + rng() % std::min<uint32_t>(m.p_nb, m.d_nb);
    size_t nd = 1 + rng() % np;
    std::vector<uint64_t> pa(m.p_nb), da(m.d_nb);
    for (uint64_t i = 0; i < m.p_nb; i++) pa[i] = i;
    for (uint64_t i = 0; i < m.d_nb; i++) da[i] = i;
    std::shuffle(pa.begin(), pa.end(), rng);
    std::shuffle(da.begin(), da.end(), rng);
    m.p_ids.assign(pa.begin(), pa.begin() + (long)np);
    m.d_ids.assign(da.begin(), da.begin() + (long)nd);
    return m;
}

// MayRefuse: the oracle's list of cases the library may refuse; any other
// refusal fails the test.
inline bool MayRefuse(const Model &m)
{
    bool hetero = m.p_tp != m.d_tp &&
                  RankHeads(m, m.p_tp) != RankHeads(m, m.d_tp);
    uint32_t hp = RankHeads(m, m.p_tp), hd = RankHeads(m, m.d_tp);
    if (m.free_perm) {
        return true; // an arbitrary axis order may have no plan
    }
    if (!m.d_phys.empty()) {
        return true; // P and D keep the axes in another order: bytes move
                     // as they are, so it must be refused (or be equal)
    }
    bool five = m.kind != kKeyOnly && m.kind != kPacked;
    if (five && (m.p_nb * m.k == 2 || m.d_nb * m.k == 2)) {
        return true; // [2, 2, ...]: split or interleaved, both fit
    }
    if (m.k > 1 && m.kind != kKeyOnly &&
        (m.bs / m.k == hp || m.bs / m.k == hd)) {
        return true; // kernel block size == heads: which axis is which?
    }
    if (!hetero || m.kind == kKeyOnly) {
        return false;
    }
    if (m.kind == kInterK) {
        return true; // K and V interleaved per kernel block: no slices
    }
    // Sliced: both sides must tell tokens from heads (a 5-D shape with
    // block_size == heads cannot).
    return m.kind != kPacked && m.k == 1 && (m.bs == hp || m.bs == hd);
}

inline std::string Describe(const Model &m)
{
    std::ostringstream os;
    Tensor t = MakeTensor(m, m.p_nb, RankHeads(m, m.p_tp), m.phys);
    os << (m.write ? "WRITE " : "READ ") << kKindName[m.kind] << " heads "
       << m.heads << " P tp" << m.p_tp << " -> D tp" << m.d_tp << " bs "
       << m.bs << " k " << m.k << " d " << m.d << " dv " << m.dv << " elem "
       << m.elem << " P shape [";
    for (size_t i = 0; i < t.size.size(); i++) {
        os << (i ? "," : "") << t.size[i];
    }
    os << "] strides [";
    for (size_t i = 0; i < t.stride.size(); i++) {
        os << (i ? "," : "") << t.stride[i];
    }
    if (!m.d_phys.empty()) {
        os << "] D order [";
        for (size_t i = 0; i < m.d_phys.size(); i++) {
            os << (i ? "," : "") << m.d_phys[i];
        }
    }
    os << "] P blocks " << m.p_ids.size() << " D blocks " << m.d_ids.size()
       << (m.free_perm ? " (free permutation)" : "");
    return os.str();
}

} // namespace oracle

#endif
