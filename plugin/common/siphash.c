/*
 * siphash.c - SipHash-2-4, written from the algorithm's description (two
 * compression rounds per 8-byte word, four finalization rounds).
 */
#include "siphash.h"

#include <string.h>

#define KVC_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

typedef struct kvc_sip {
    uint64_t v0, v1, v2, v3;
} kvc_sip_t;

static void kvc_sip_rounds(kvc_sip_t *s, int n)
{
    for (int i = 0; i < n; i++) {
        s->v0 += s->v1;
        s->v1  = KVC_ROTL(s->v1, 13);
        s->v1 ^= s->v0;
        s->v0  = KVC_ROTL(s->v0, 32);
        s->v2 += s->v3;
        s->v3  = KVC_ROTL(s->v3, 16);
        s->v3 ^= s->v2;
        s->v0 += s->v3;
        s->v3  = KVC_ROTL(s->v3, 21);
        s->v3 ^= s->v0;
        s->v2 += s->v1;
        s->v1  = KVC_ROTL(s->v1, 17);
        s->v1 ^= s->v2;
        s->v2  = KVC_ROTL(s->v2, 32);
    }
}

static void kvc_sip_word(kvc_sip_t *s, uint64_t m)
{
    s->v3 ^= m;
    kvc_sip_rounds(s, 2);
    s->v0 ^= m;
}

/* kvc_sip: SipHash-2-4 under key of the eight little-endian bytes of *w0
 * (when not NULL) followed by len bytes at data, without copying them
 * together. */
static uint64_t kvc_sip(const uint64_t key[2], const uint64_t *w0,
                        const void *data, size_t len)
{
    const uint8_t *p = data;
    kvc_sip_t      s = {key[0] ^ UINT64_C(0x736f6d6570736575),
                        key[1] ^ UINT64_C(0x646f72616e646f6d),
                        key[0] ^ UINT64_C(0x6c7967656e657261),
                        key[1] ^ UINT64_C(0x7465646279746573)};
    uint64_t       last = (uint64_t)(len + (w0 != NULL ? 8 : 0)) << 56;
    size_t         i;

    if (w0 != NULL) {
        kvc_sip_word(&s, *w0);
    }
    for (i = 0; i + 8 <= len; i += 8) {
        uint64_t m = 0;

        for (int b = 7; b >= 0; b--) {
            m = m << 8 | p[i + (size_t)b];
        }
        kvc_sip_word(&s, m);
    }
    for (size_t b = 0; i + b < len; b++) {
        last |= (uint64_t)p[i + b] << (8 * b);
    }
    kvc_sip_word(&s, last);
    s.v2 ^= 0xff;
    kvc_sip_rounds(&s, 4);
    return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

uint64_t kvc_xfer_tag(const char *transfer_id)
{
    /* "kvxfer-transfer-tag-v9" folded into a key: public, fixed. */
    static const uint64_t key[2] = {UINT64_C(0x6b76786665722d74),
                                    UINT64_C(0x7261672d7639a5c3)};
    uint64_t              h = kvc_siphash24(key, transfer_id,
                                            strlen(transfer_id));

    return h != 0 ? h : 1; /* 0: an op without a transfer */
}

/* kvc_mac5: SipHash-2-4 under key of five words, little-endian on every
 * host; never 0. */
static uint64_t kvc_mac5(const uint64_t key[2], const uint64_t v[5])
{
    uint8_t  in[40];
    uint64_t m;

    for (size_t i = 0; i < 40; i++) {
        in[i] = (uint8_t)(v[i / 8] >> (8 * (i % 8)));
    }
    m = kvc_siphash24(key, in, sizeof(in));
    return m != 0 ? m : 1;
}

uint64_t kvc_req_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                     uint64_t addr, uint64_t len, int is_put)
{
    const uint64_t key[2] = {session, session ^ UINT64_C(0x6b76786d61633031)};
    const uint64_t v[5]   = {tag, nonce, addr, len,
                             is_put == KVC_MAC_NOTICE ? 2u
                             : is_put                 ? 1u
                                                      : 0u};

    return session == 0 ? 0 : kvc_mac5(key, v);
}

uint64_t kvc_siphash24(const uint64_t key[2], const void *data, size_t len)
{
    return kvc_sip(key, NULL, data, len);
}

uint64_t kvc_count_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                       uint64_t instance, uint64_t xnonce, uint64_t count)
{
    const uint64_t key[2] = {session ^ UINT64_C(0x6b7678636e743031),
                             session ^ UINT64_C(0x6b76786d61633031)};
    const uint64_t v[5]   = {tag, nonce, instance, xnonce, count};

    return session == 0 ? 0 : kvc_mac5(key, v);
}

uint64_t kvc_notice_mac(uint64_t session, uint64_t tag, uint64_t nonce,
                        uint64_t instance, uint64_t xnonce, uint64_t count)
{
    return count == KVC_COUNT_NONE
               ? kvc_req_mac(session, tag, nonce, instance, xnonce,
                             KVC_MAC_NOTICE)
               : kvc_count_mac(session, tag, nonce, instance, xnonce, count);
}

uint64_t kvc_msg_mac(uint64_t session, uint64_t nonce, const void *msg,
                     size_t len)
{
    const uint64_t key[2] = {session ^ UINT64_C(0x6b76786d73673031),
                             session};
    uint64_t       m;

    if (session == 0) {
        return 0;
    }
    m = kvc_sip(key, &nonce, msg, len); /* the nonce, then the message */
    return m != 0 ? m : 1;
}
