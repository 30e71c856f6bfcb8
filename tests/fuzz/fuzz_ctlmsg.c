/*
 * fuzz_ctlmsg.c - control messages (kvc_msg_decode / kvc_msg_encode), typed
 * JSON and the legacy plain-string forms, as received by a producer and by
 * a consumer.
 *
 * Invariants, for both receiving roles:
 *  - kvc_msg_decode (the flat reader, pval.h, where it takes the text) and
 *    kvc_msg_decode_json_c give the same status, error text and message;
 *  - a typed message encodes to the bytes json-c prints for the same
 *    members in the same order (JSON_C_TO_STRING_PLAIN | NOSLASHESCAPE),
 *    the format every earlier build sent;
 *  - a decoded message re-encodes (no NULL), within KVC_MSG_MAX_BYTES;
 *  - the encoding decodes in the same role to the same message (type, ids,
 *    block list, ranks, legacy flag), and re-encodes to the same bytes;
 *  - decoded fields obey their documented bounds (transfer_id printable
 *    ASCII, non-empty unless optional; ranks >= 0; block ids <= 2^53);
 *  - a rejected input leaves a non-empty error text that is valid UTF-8
 *    (it travels to the peer in a reply).
 */
#include "fuzz.h"
#include "fuzz_utf8.h"

#include "ctlmsg.h"

#include <json-c/json.h>

static void fz_check_id(const char *id, int optional)
{
    size_t len = strlen(id);

    FZ_CHECK(len < KVX_ID_MAX, "len %zu", len);
    FZ_CHECK(optional || len > 0, "empty transfer_id");
    for (size_t i = 0; i < len; i++) {
        FZ_CHECK(id[i] >= 0x20 && id[i] <= 0x7e, "byte 0x%02x",
                 (unsigned char)id[i]);
    }
}

static void fz_check_same(const kvc_msg_t *a, const kvc_msg_t *b)
{
    FZ_CHECK(a->type == b->type, "%d vs %d", a->type, b->type);
    FZ_CHECK(strcmp(a->transfer_id, b->transfer_id) == 0, "'%s' vs '%s'",
             a->transfer_id, b->transfer_id);
    FZ_CHECK(strcmp(a->req_id, b->req_id) == 0, "'%s' vs '%s'", a->req_id,
             b->req_id);
    FZ_CHECK(a->num_block_ids == b->num_block_ids, "%zu vs %zu",
             a->num_block_ids, b->num_block_ids);
    for (size_t i = 0; i < a->num_block_ids; i++) {
        FZ_CHECK(a->block_ids[i] == b->block_ids[i], "block %zu", i);
    }
    FZ_CHECK(a->decode_rank == b->decode_rank, "%d vs %d", a->decode_rank,
             b->decode_rank);
    FZ_CHECK(a->consumer_tp_size == b->consumer_tp_size, "%d vs %d",
             a->consumer_tp_size, b->consumer_tp_size);
    FZ_CHECK(a->consumer_rank == b->consumer_rank, "%d vs %d",
             a->consumer_rank, b->consumer_rank);
    FZ_CHECK(a->legacy == b->legacy, "%d vs %d", a->legacy, b->legacy);
    FZ_CHECK(a->instance == b->instance, "instance");
    FZ_CHECK(a->to_instance == b->to_instance, "to_instance");
}

/* fz_paths: both ways of decoding buf agree on everything. */
static void fz_paths(const char *buf, size_t len, int is_producer)
{
    kvc_msg_t    a, b;
    char         err[KVC_ERR_MAX];
    kvx_status_t sa = kvc_msg_decode(buf, len, is_producer, &a), sb;

    snprintf(err, sizeof(err), "%s", sa == KVX_OK ? "" : kvc_last_error());
    sb = kvc_msg_decode_json_c(buf, len, is_producer, &b);
    FZ_CHECK(sa == sb, "'%.*s': status %d (flat) vs %d (json-c): %s",
             (int)(len < 300 ? len : 300), buf, (int)sa, (int)sb,
             sa != KVX_OK ? err : kvc_last_error());
    FZ_CHECK(sa == KVX_OK || strcmp(err, kvc_last_error()) == 0,
             "'%s' vs '%s'", err, kvc_last_error());
    if (sa == KVX_OK) {
        fz_check_same(&a, &b);
        FZ_CHECK(a.xfer_nonce == b.xfer_nonce &&
                     a.done_by_notice == b.done_by_notice,
                 "xfer_nonce / done_by_notice");
    }
    kvc_msg_fini(&a);
    kvc_msg_fini(&b);
}

/* fz_as_json_c: text is what json-c prints for its own parse of it. */
static void fz_as_json_c(const char *text)
{
    json_object *o = json_tokener_parse(text);
    const char  *again;

    FZ_CHECK(o != NULL, "'%.200s' is not JSON", text);
    again = json_object_to_json_string_ext(
        o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    FZ_CHECK(strcmp(again, text) == 0, "'%.200s' vs json-c's '%.200s'", text,
             again);
    json_object_put(o);
}

static void fz_one_role(const char *buf, size_t len, int is_producer)
{
    kvc_msg_t             msg, back;
    const kvc_msg_desc_t *desc;
    char                 *text, *again;
    size_t                tlen = 0, alen = 0;

    fz_paths(buf, len, is_producer);
    if (kvc_msg_decode(buf, len, is_producer, &msg) != KVX_OK) {
        const char *err = kvc_last_error();

        FZ_CHECK(err[0] != '\0', "no error text");
        FZ_CHECK(fz_utf8_valid(err, strlen(err)), "error text: %s", err);
        return;
    }
    desc = kvc_msg_desc(msg.type);
    FZ_CHECK(desc != NULL, "type %d", msg.type);
    FZ_CHECK(desc->roles & KVC_MSG_ROLE(is_producer), "role");
    FZ_CHECK(kvc_msg_desc_by_name(desc->name, strlen(desc->name)) == desc,
             "%s", desc->name);
    fz_check_id(msg.transfer_id, desc->id_optional && !msg.legacy);
    FZ_CHECK(msg.decode_rank >= 0, "%d", msg.decode_rank);
    FZ_CHECK(msg.consumer_rank >= -1, "%d", msg.consumer_rank);
    if (msg.type == KVC_MSG_REMOTE_BLOCKS) {
        FZ_CHECK(msg.num_block_ids > 0, "empty block list");
        fz_check_id(msg.req_id, 0);
    }
    if (msg.type == KVC_MSG_RELEASE) {
        FZ_CHECK(msg.consumer_tp_size >= 1, "%d", msg.consumer_tp_size);
    }
    for (size_t i = 0; i < msg.num_block_ids; i++) {
        FZ_CHECK(msg.block_ids[i] <= (UINT64_C(1) << 53), "block %zu", i);
    }

    text = kvc_msg_encode(&msg, &tlen);
    FZ_CHECK(text != NULL, "encode: %s", kvc_last_error());
    FZ_CHECK(tlen == strlen(text), "len %zu", tlen);
    FZ_CHECK(tlen <= KVC_MSG_MAX_BYTES, "len %zu", tlen);
    if (!msg.legacy) {
        fz_as_json_c(text);
    }
    FZ_CHECK(kvc_msg_decode(text, tlen, is_producer, &back) == KVX_OK,
             "re-decode of '%.200s': %s", text, kvc_last_error());
    fz_check_same(&msg, &back);
    again = kvc_msg_encode(&back, &alen);
    FZ_CHECK(again != NULL && alen == tlen && memcmp(again, text, tlen) == 0,
             "'%.200s' vs '%.200s'", text, again ? again : "(null)");
    free(again);
    free(text);
    kvc_msg_fini(&back);
    kvc_msg_fini(&msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_one_role((const char *)data, size, 1);
    fz_one_role((const char *)data, size, 0);
    return 0;
}
