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

#include <cstdint>
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

} // namespace oracle

#endif
