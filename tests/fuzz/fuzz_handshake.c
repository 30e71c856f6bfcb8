/*
 * fuzz_handshake.c - the handshake request (kvc_hs_request_decode), the
 * handshake metadata (kvc_hs_decode / kvc_hs_encode) and base64.
 *
 * Invariants:
 *  - an accepted request reports a version, and our own request decodes to
 *    KVC_PROTO_VERSION;
 *  - accepted metadata obeys its documented bounds (tp_rank < tp_size,
 *    dp_rank < dp_size, 1..4096 layers, non-empty rkeys and worker address,
 *    layer geometry accepted by kvc_geom_compatible with itself), re-encodes,
 *    decodes to the same metadata (every field, every layer, every rkey
 *    byte) and re-encodes to the same bytes;
 *  - base64: text that decodes re-encodes to the same text (the decoder
 *    accepts only canonical text); any bytes encode to text that decodes
 *    to those bytes.
 */
#include "fuzz.h"

#include "ctlmsg.h"

static void fz_same_meta(const kvc_hs_meta_t *a, const kvc_hs_meta_t *b)
{
    FZ_CHECK(a->version == b->version && a->digest == b->digest &&
                 strcmp(a->engine_id, b->engine_id) == 0 &&
                 strcmp(a->host, b->host) == 0 &&
                 a->handshake_port == b->handshake_port &&
                 a->notify_port == b->notify_port &&
                 a->dp_rank == b->dp_rank && a->dp_size == b->dp_size &&
                 a->tp_rank == b->tp_rank && a->tp_size == b->tp_size &&
                 a->is_producer == b->is_producer && a->epoch == b->epoch,
             "identity changed");
    FZ_CHECK(a->worker_addr_len == b->worker_addr_len &&
                 memcmp(a->worker_addr, b->worker_addr, a->worker_addr_len) ==
                     0,
             "worker address changed");
    FZ_CHECK(a->num_layers == b->num_layers, "%zu vs %zu layers",
             a->num_layers, b->num_layers);
    for (size_t i = 0; i < a->num_layers; i++) {
        const kvc_hs_layer_t *x = &a->layers[i], *y = &b->layers[i];

        FZ_CHECK(strcmp(x->name, y->name) == 0 && x->base == y->base &&
                     x->length == y->length && x->mem_type == y->mem_type &&
                     x->rkey_len == y->rkey_len &&
                     memcmp(x->rkey, y->rkey, x->rkey_len) == 0 &&
                     kvc_geom_same(&x->geom, &y->geom),
                 "layer %zu changed", i);
    }
}

static void fz_meta(const char *buf, size_t len)
{
    kvc_hs_meta_t meta, back;
    char         *text, *again;
    size_t        tlen = 0, alen = 0;

    if (kvc_hs_decode(buf, len, &meta) != KVX_OK) {
        FZ_CHECK(kvc_last_error()[0] != '\0', "no error text");
        return;
    }
    FZ_CHECK(meta.tp_rank < meta.tp_size && meta.dp_rank < meta.dp_size,
             "ranks");
    FZ_CHECK(meta.num_layers >= 1 && meta.num_layers <= 4096, "%zu layers",
             meta.num_layers);
    FZ_CHECK(meta.worker_addr_len > 0, "empty worker address");
    for (size_t i = 0; i < meta.num_layers; i++) {
        FZ_CHECK(meta.layers[i].rkey_len > 0, "empty rkey");
        FZ_CHECK(kvc_geom_compatible(&meta.layers[i].geom,
                                     &meta.layers[i].geom) == KVX_OK,
                 "%s", kvc_last_error());
    }
    text = kvc_hs_encode(&meta, &tlen);
    FZ_CHECK(text != NULL, "encode: %s", kvc_last_error());
    FZ_CHECK(tlen == strlen(text), "len");
    FZ_CHECK(kvc_hs_decode(text, tlen, &back) == KVX_OK,
             "re-decode: %s", kvc_last_error());
    fz_same_meta(&meta, &back);
    again = kvc_hs_encode(&back, &alen);
    FZ_CHECK(again != NULL && alen == tlen && memcmp(again, text, tlen) == 0,
             "encodings differ");
    free(again);
    free(text);
    kvc_hs_fini(&back);
    kvc_hs_fini(&meta);
}

static void fz_b64(const uint8_t *data, size_t size)
{
    uint8_t *bytes = NULL, *back = NULL;
    size_t   n = 0, m = 0;
    char    *text;

    if (kvc_b64_decode((const char *)data, size, &bytes, &n) == KVX_OK) {
        text = kvc_b64_encode(bytes, n);
        FZ_CHECK(text != NULL && strlen(text) == size &&
                     memcmp(text, data, size) == 0,
                 "base64 not canonical: re-encoded differs");
        free(text);
        free(bytes);
    }
    text = kvc_b64_encode(data, size);
    FZ_CHECK(text != NULL, "encode");
    FZ_CHECK(strlen(text) == (size + 2) / 3 * 4, "encoded length");
    FZ_CHECK(kvc_b64_decode(text, strlen(text), &back, &m) == KVX_OK,
             "decode of our encoding: %s", kvc_last_error());
    FZ_CHECK(m == size && (size == 0 || memcmp(back, data, size) == 0),
             "base64 round trip");
    free(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint32_t version = 0;
    char    *req;
    size_t   rlen = 0;

    if (kvc_hs_request_decode((const char *)data, size, &version) !=
        KVX_OK) {
        FZ_CHECK(kvc_last_error()[0] != '\0', "no error text");
    }
    req = kvc_hs_request_encode(&rlen);
    FZ_CHECK(req != NULL &&
                 kvc_hs_request_decode(req, rlen, &version) == KVX_OK &&
                 version == KVC_PROTO_VERSION,
             "own request");
    free(req);
    fz_meta((const char *)data, size);
    fz_b64(data, size);
    return 0;
}
