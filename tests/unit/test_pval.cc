// pval: the flat reader takes exactly its subset of JSON, and params it
// takes decode to what json-c's path gives (fields, status, error text),
// whatever the input: the listed cases, every one-byte change of typical
// params, and lists of thousands of block ids.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <json-c/json.h>

extern "C" {
#include "addr.h"
#include "ctlmsg.h"
#include "pval.h"
}

namespace {

struct Scan {
    explicit Scan(const std::string &json) : text(json)
    {
        ok = kvc_flat_scan(text.data(), text.size(), m, 32, &n);
    }
    std::string Key(size_t i) const { return std::string(m[i].key, m[i].key_len); }
    std::string       text; // the members point into it
    int               ok;
    size_t            n = 0;
    kvc_flat_member_t m[32];
};

TEST(FlatScan, TakesTheSubset)
{
    Scan s(" {\"a\" : \"x y/z\",\n\"b\":-12,\t\"c\":[1, \"h\" ,true,null],"
           "\"d\":false,\"e\":null,\"f\":[],\"g\":0,\"h\":-0,"
           "\"i\":999999999999999999} \r\n");

    ASSERT_EQ(s.ok, 1);
    ASSERT_EQ(s.n, 9u);
    EXPECT_EQ(s.Key(0), "a");
    EXPECT_EQ(s.m[0].val.type, KVC_PV_STR);
    EXPECT_EQ(std::string(s.m[0].val.s, s.m[0].val.len), "x y/z");
    EXPECT_EQ(s.m[1].val.type, KVC_PV_INT);
    EXPECT_EQ(s.m[1].val.i, -12);
    EXPECT_EQ(s.m[1].val.u, 0u); // as json_object_get_uint64
    EXPECT_EQ(std::string(s.m[1].val.text, s.m[1].val.text_len), "-12");
    ASSERT_EQ(s.m[2].val.type, KVC_PV_ARRAY);
    EXPECT_EQ(s.m[2].val.len, 4u);
    EXPECT_EQ(std::string(s.m[2].val.text, s.m[2].val.text_len),
              "[1, \"h\" ,true,null]");
    kvc_pv_it_t it = {};
    kvc_pv_t    e;
    ASSERT_EQ(kvc_pv_next(&s.m[2].val, &it, &e), 1);
    EXPECT_EQ(e.type, KVC_PV_INT);
    EXPECT_EQ(e.u, 1u);
    ASSERT_EQ(kvc_pv_next(&s.m[2].val, &it, &e), 1);
    EXPECT_EQ(std::string(e.s, e.len), "h");
    ASSERT_EQ(kvc_pv_next(&s.m[2].val, &it, &e), 1);
    EXPECT_EQ(e.type, KVC_PV_BOOL);
    EXPECT_EQ(e.b, 1);
    ASSERT_EQ(kvc_pv_next(&s.m[2].val, &it, &e), 1);
    EXPECT_EQ(e.type, KVC_PV_NULL);
    EXPECT_EQ(kvc_pv_next(&s.m[2].val, &it, &e), 0);
    EXPECT_EQ(s.m[3].val.type, KVC_PV_BOOL);
    EXPECT_EQ(s.m[3].val.b, 0);
    EXPECT_EQ(s.m[4].val.type, KVC_PV_NULL);
    EXPECT_EQ(s.m[5].val.type, KVC_PV_ARRAY);
    EXPECT_EQ(s.m[5].val.len, 0u);
    EXPECT_EQ(s.m[6].val.i, 0);
    EXPECT_EQ(s.m[7].val.i, 0);
    EXPECT_EQ(s.m[8].val.i, 999999999999999999LL);
    EXPECT_EQ(Scan("{}").ok, 1);
    EXPECT_EQ(Scan(" { } ").ok, 1);
}

// It reads len bytes, never up to a NUL: control messages arrive without
// one, and a NUL inside the text is outside the subset.
TEST(FlatScan, ReadsExactlyLenBytes)
{
    const char        text[] = "{\"a\":[1,\"xy\"],\"b\":true}{\"c\":1}";
    kvc_flat_member_t m[4];
    size_t            n, whole = strlen("{\"a\":[1,\"xy\"],\"b\":true}");

    EXPECT_EQ(kvc_flat_scan(text, whole, m, 4, &n), 1);
    EXPECT_EQ(n, 2u);
    for (size_t len = 0; len < whole; len++) {
        EXPECT_EQ(kvc_flat_scan(text, len, m, 4, &n), 0) << len;
    }
    EXPECT_EQ(kvc_flat_scan(text, sizeof(text) - 1, m, 4, &n), 0);
    const char nul[] = "{\"a\":\"x\0y\"}";
    EXPECT_EQ(kvc_flat_scan(nul, sizeof(nul) - 1, m, 4, &n), 0);
    const char nul2[] = "{\"a\":1}\0";
    EXPECT_EQ(kvc_flat_scan(nul2, sizeof(nul2) - 1, m, 4, &n), 0);
}

TEST(FlatScan, RefusesEverythingElse)
{
    const char *cases[] = {
        "", " ", "null", "[1]", "\"s\"", "5",  // not an object
        "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":1,}", "{,}",
        "{\"a\" 1}", "{\"a\":1 \"b\":2}", "{a:1}", "{'a':1}",
        "{\"a\":1}x", "{\"a\":1} {}", "{\"a\":1}\f", "\v{\"a\":1}",
        "{\"a\":\"\\n\"}", "{\"a\":\"\\u0041\"}", "{\"a\\\"\":1}",  // escapes
        "{\"a\":\"\x01\"}", "{\"a\":\"\t\"}", "{\"a\":\"\x7f\"}",  // controls
        "{\"a\":\"\xc3\xa9\"}", "{\"\xc3\xa9\":1}",                // non-ASCII
        "{\"a\":1.0}", "{\"a\":1e3}", "{\"a\":1E3}", "{\"a\":-}",  // numbers
        "{\"a\":01}", "{\"a\":-01}", "{\"a\":+1}", "{\"a\":.5}",
        "{\"a\":1000000000000000000}",                 // 19 digits
        "{\"a\":-1000000000000000000}", "{\"a\":NaN}", "{\"a\":Infinity}",
        "{\"a\":True}", "{\"a\":FALSE}", "{\"a\":nul}", "{\"a\":truex}",
        "{\"a\":tru}", "{\"a\":{}}", "{\"a\":{\"b\":1}}",       // nesting
        "{\"a\":[[1]]}", "{\"a\":[{}]}", "{\"a\":[1,]}", "{\"a\":[,1]}",
        "{\"a\":[1 2]}", "{\"a\":[1}", "{\"a\":[1.5]}", "{\"a\":[\"\\/\"]}",
        "{/*c*/\"a\":1}", "{\"a\":1 // c\n}",
    };
    for (const char *json : cases) {
        EXPECT_EQ(Scan(json).ok, 0) << json;
    }
    std::string many = "{";
    for (int i = 0; i < 33; i++) {
        many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
    }
    many += "}";
    EXPECT_EQ(Scan(many).ok, 0) << "33 members, 32 slots";
}

// Both paths must agree on everything a caller can see.
void ExpectSameAsJsonC(const std::string &json)
{
    kvc_xfer_params_t a, b;
    kvx_status_t      sa = kvc_params_parse(json.c_str(), &a);
    std::string       ea = sa == KVX_OK ? "" : kvc_last_error();
    kvx_status_t      sb = kvc_params_parse_json_c(json.c_str(), &b);
    std::string       eb = sb == KVX_OK ? "" : kvc_last_error();

    ASSERT_EQ(sa, sb) << json << " -> " << ea << " | " << eb;
    EXPECT_EQ(ea, eb) << json;
    EXPECT_STREQ(a.transfer_id, b.transfer_id) << json;
    EXPECT_EQ(a.has_remote_addr, b.has_remote_addr) << json;
    EXPECT_STREQ(a.remote.host, b.remote.host) << json;
    EXPECT_EQ(a.remote.handshake_port, b.remote.handshake_port) << json;
    EXPECT_EQ(a.remote.notify_port, b.remote.notify_port) << json;
    ASSERT_EQ(a.num_remote_hosts, b.num_remote_hosts) << json;
    for (size_t i = 0; i < a.num_remote_hosts; i++) {
        EXPECT_STREQ(a.remote_hosts[i], b.remote_hosts[i]) << json;
    }
    EXPECT_EQ(a.has_remote_block_ids, b.has_remote_block_ids) << json;
    ASSERT_EQ(a.num_remote_block_ids, b.num_remote_block_ids) << json;
    for (size_t i = 0; i < a.num_remote_block_ids; i++) {
        EXPECT_EQ(a.remote_block_ids[i], b.remote_block_ids[i]) << json;
    }
    EXPECT_STREQ(a.remote_engine_id, b.remote_engine_id) << json;
    EXPECT_EQ(a.remote_tp_size, b.remote_tp_size) << json;
    EXPECT_EQ(a.remote_dp_size, b.remote_dp_size) << json;
    EXPECT_EQ(a.remote_dp_rank, b.remote_dp_rank) << json;
    EXPECT_EQ(a.remote_instance, b.remote_instance) << json;
    EXPECT_EQ(a.has_remote_instance, b.has_remote_instance) << json;
    EXPECT_EQ(a.remote_tp_rank, b.remote_tp_rank) << json;
    EXPECT_EQ(a.remote_accepted, b.remote_accepted) << json;
    EXPECT_EQ(a.has_remote_accepted, b.has_remote_accepted) << json;
    EXPECT_EQ(a.remote_hold_ms, b.remote_hold_ms) << json;
    EXPECT_EQ(a.do_remote_prefill, b.do_remote_prefill) << json;
    EXPECT_EQ(a.do_remote_decode, b.do_remote_decode) << json;
    kvc_params_fini(&a);
    kvc_params_fini(&b);
}

const char *const kSeeds[] = {
    // D's params as kvxfer_perf and the proxy build them
    R"({"transfer_id":"kvp-1a2b-0-17","do_remote_prefill":true,)"
    R"("remote_host":"127.0.0.1","remote_handshake_port":40123,)"
    R"("remote_notify_port":40124,"remote_tp_size":1,)"
    R"("remote_engine_id":"kvp-prefill","remote_block_ids":[17,3]})",
    // P's READ and WRITE params
    R"({"transfer_id":"t-9","do_remote_decode":true})",
    R"({"transfer_id":"t-9","do_remote_decode":true,"remote_host":"h1",)"
    R"("remote_handshake_port":"7301","remote_notify_port":7302,)"
    R"("remote_tp_size":2})",
    // P's response, every field
    R"({"do_remote_prefill":true,"do_remote_decode":false,)"
    R"("transfer_id":"x","remote_block_ids":[1],"remote_engine_id":"e",)"
    R"("remote_host":"10.0.0.1","remote_handshake_port":6301,)"
    R"("remote_notify_port":6302,"tp_size":4,"remote_dp_size":2,)"
    R"("remote_dp_rank":1,"remote_instance":"18446744073709551615",)"
    R"("remote_tp_rank":3,"remote_accepted":"99","remote_hold_ms":30000,)"
    R"("remote_hosts":["a"," b ",""]})",
    R"({"remote_hosts":" a , b,,c ","tp_size":3,"remote_tp_size":0})",
};

TEST(ParamsFlat, SameAsJsonCOnListedCases)
{
    const char *cases[] = {
        "{}", "null", " ", "{\"transfer_id\":null}",
        "{\"transfer_id\":\"a\",\"transfer_id\":\"b\"}",  // json-c: last wins
        "{\"transfer_id\":\"a\",\"transfer_id\":7}",
        "{\"x\":1,\"x\":[1,\"y\"],\"transfer_id\":\"t\"}",  // unknown keys
        "{\"remote_block_ids\":[1,-1]}", "{\"remote_block_ids\":[true]}",
        "{\"remote_block_ids\":[null]}", "{\"remote_block_ids\":[\"1\"]}",
        "{\"remote_block_ids\":[999999999999999999]}",
        "{\"remote_block_ids\":[1000000000000000000]}",
        "{\"remote_block_ids\":[18446744073709551615]}",
        "{\"remote_block_ids\":[18446744073709551616]}",
        "{\"remote_handshake_port\":-0}", "{\"remote_handshake_port\":80}",
        "{\"remote_handshake_port\":\"\"}", "{\"remote_handshake_port\":[]}",
        "{\"remote_handshake_port\":9223372036854775808}",
        "{\"remote_notify_port\":\"0070000\"}", "{\"remote_hosts\":[]}",
        "{\"remote_hosts\":\"\"}", "{\"remote_hosts\":\",,,\"}",
        "{\"remote_hosts\":[\"a\",null]}", "{\"remote_hosts\":true}",
        "{\"remote_instance\":\"0\"}", "{\"remote_instance\":\"007\"}",
        "{\"remote_accepted\":\"18446744073709551616\"}",
        "{\"tp_size\":4294967296}", "{\"tp_size\":4294967295}",
        "{\"remote_dp_rank\":0}", "{\"do_remote_decode\":null}",
        "{\"do_remote_decode\":0}", "{\"transfer_id\":\"\\u0000x\"}",
        "{\"remote_host\":\"a\\u0000b\",\"remote_handshake_port\":7000,"
        "\"remote_notify_port\":7001}",
        "{\"remote_hosts\":\"a\\u0000,b\"}",
        "{\"transfer_id\":\"caf\xc3\xa9\"}", "{\"transfer_id\":\"\xff\"}",
        "{\"transfer_id\":\"t\"} trailing", "[1]", "5", "{\"a\":",
    };
    for (const char *c : cases) {
        ExpectSameAsJsonC(c);
    }
    for (const char *c : kSeeds) {
        ExpectSameAsJsonC(c);
    }
    std::string longid = "{\"transfer_id\":\"" + std::string(KVX_ID_MAX, 'i') +
                         "\"}";
    ExpectSameAsJsonC(longid);
    longid = "{\"transfer_id\":\"" + std::string(KVX_ID_MAX - 1, 'i') + "\"}";
    ExpectSameAsJsonC(longid);
}

// Every single-byte change of each seed (to a byte from a set that hits
// every branch of the reader), and every truncation: the two paths agree.
TEST(ParamsFlat, SameAsJsonCOnEveryOneByteChange)
{
    const char repl[] = {' ', '"', ',', ':', '[', ']', '{', '}', '-', '0',
                         '1', '9', 'e', '.', 't', 'n', '\\', '\t', 'x', '\x01',
                         '\x80'};

    for (const char *seed : kSeeds) {
        std::string s(seed);

        for (size_t pos = 0; pos < s.size(); pos++) {
            for (char c : repl) {
                std::string m = s;

                m[pos] = c;
                ExpectSameAsJsonC(m);
            }
            ExpectSameAsJsonC(s.substr(0, pos));
            ExpectSameAsJsonC(s.substr(0, pos) + s.substr(pos + 1));
        }
    }
}

TEST(ParamsFlat, ThousandsOfBlockIds)
{
    std::string json = "{\"transfer_id\":\"t\",\"remote_block_ids\":[";
    for (int i = 0; i < 4096; i++) {
        json += (i ? "," : "") + std::to_string(i * 7919ULL % 1000003);
    }
    json += "]}";
    ExpectSameAsJsonC(json);

    kvc_xfer_params_t p;
    ASSERT_EQ(kvc_params_parse(json.c_str(), &p), KVX_OK);
    ASSERT_EQ(p.num_remote_block_ids, 4096u);
    EXPECT_EQ(p.remote_block_ids[4095], 4095ULL * 7919 % 1000003);
    kvc_params_fini(&p);
    // the flat reader takes it: these lists are why it exists
    kvc_flat_member_t m[32];
    size_t            n;
    EXPECT_EQ(kvc_flat_scan(json.data(), json.size(), m, 32, &n), 1);
    EXPECT_EQ(m[1].val.len, 4096u);
}

// ---- control messages ---------------------------------------------------

void ExpectMsgSameAsJsonC(const std::string &text, int is_producer)
{
    kvc_msg_t    a, b;
    kvx_status_t sa = kvc_msg_decode(text.data(), text.size(), is_producer, &a);
    std::string  ea = sa == KVX_OK ? "" : kvc_last_error();
    kvx_status_t sb =
        kvc_msg_decode_json_c(text.data(), text.size(), is_producer, &b);
    std::string eb = sb == KVX_OK ? "" : kvc_last_error();

    ASSERT_EQ(sa, sb) << text << " -> " << ea << " | " << eb;
    EXPECT_EQ(ea, eb) << text;
    EXPECT_EQ(a.type, b.type) << text;
    EXPECT_STREQ(a.transfer_id, b.transfer_id) << text;
    EXPECT_STREQ(a.req_id, b.req_id) << text;
    ASSERT_EQ(a.num_block_ids, b.num_block_ids) << text;
    for (size_t i = 0; i < a.num_block_ids; i++) {
        EXPECT_EQ(a.block_ids[i], b.block_ids[i]) << text;
    }
    EXPECT_EQ(a.decode_rank, b.decode_rank) << text;
    EXPECT_EQ(a.consumer_tp_size, b.consumer_tp_size) << text;
    EXPECT_EQ(a.consumer_rank, b.consumer_rank) << text;
    EXPECT_EQ(a.legacy, b.legacy) << text;
    EXPECT_EQ(a.instance, b.instance) << text;
    EXPECT_EQ(a.to_instance, b.to_instance) << text;
    EXPECT_EQ(a.xfer_nonce, b.xfer_nonce) << text;
    EXPECT_EQ(a.done_by_notice, b.done_by_notice) << text;
    kvc_msg_fini(&a);
    kvc_msg_fini(&b);
}

const char *const kMsgSeeds[] = {
    R"({"type":"remote_blocks","transfer_id":"kvp-1-17","instance":"12345",)"
    R"("to_instance":"987","xfer_nonce":"2448378","req_id":"req-1",)"
    R"("block_notify_list":[1000,0,9007199254740992],"consumer_rank":2,)"
    R"("done_by_notice":1,"decode_rank":0})",
    R"({"type":"release","transfer_id":"t","instance":"1",)"
    R"("consumer_tp_size":2,"consumer_rank":1})",
    R"({"type":"write_done","transfer_id":"t","to_instance":"5"})",
    R"({"type":"heartbeat"})",
    R"({"req_id":"r","transfer_id":"t","block_notify_list":[3],)"
    R"("decode_rank":1,"decode_rank":2})",
};

// Every one-byte change and truncation of typical messages, in both roles.
TEST(CtlMsgFlat, SameAsJsonCOnEveryOneByteChange)
{
    const char repl[] = {' ', '"', ',', ':', '[', ']', '{', '}', '-', '0',
                         '1', '9', 'e', '.', 't', 'n', '\\', '\t', 'x', '\x01',
                         '\x80', '\0'};

    for (const char *seed : kMsgSeeds) {
        std::string s(seed);

        for (int role = 0; role <= 1; role++) {
            ExpectMsgSameAsJsonC(s, role);
            for (size_t pos = 0; pos < s.size(); pos++) {
                for (char c : repl) {
                    std::string m = s;

                    m[pos] = c;
                    ExpectMsgSameAsJsonC(m, role);
                }
                ExpectMsgSameAsJsonC(s.substr(0, pos), role);
                ExpectMsgSameAsJsonC(s.substr(0, pos) + s.substr(pos + 1),
                                     role);
            }
        }
    }
}

// The encoder writes what json-c printed for the same members (the format
// every earlier build sent), whatever the ids hold.
TEST(CtlMsgFlat, EncodesWhatJsonCPrints)
{
    kvc_msg_t m = {};
    uint64_t  ids[] = {0, 1, 9007199254740992ULL, UINT64_MAX};

    m.type          = KVC_MSG_REMOTE_BLOCKS;
    m.block_ids     = ids;
    m.num_block_ids = 4;
    m.decode_rank   = 3;
    m.consumer_rank = 0;
    m.instance      = UINT64_MAX;
    m.xfer_nonce    = 1;
    m.done_by_notice = 1;
    for (const char *id : {"a/b", "q\"uote", "back\\slash", "tab\there", "\x01",
                           "caf\xc3\xa9", "<>&'"}) {
        snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", id);
        snprintf(m.req_id, sizeof(m.req_id), "r%s", id);
        for (kvc_msg_type_t t : {KVC_MSG_REMOTE_BLOCKS, KVC_MSG_RELEASE,
                                 KVC_MSG_WRITE_DONE, KVC_MSG_HEARTBEAT}) {
            size_t len = 0;

            m.type             = t;
            m.consumer_tp_size = t == KVC_MSG_RELEASE ? 2 : 0;
            char *text         = kvc_msg_encode(&m, &len);
            ASSERT_NE(text, nullptr);
            EXPECT_EQ(len, strlen(text));
            json_object *o = json_tokener_parse(text);
            ASSERT_NE(o, nullptr) << text;
            EXPECT_STREQ(text, json_object_to_json_string_ext(
                                   o, JSON_C_TO_STRING_PLAIN |
                                          JSON_C_TO_STRING_NOSLASHESCAPE));
            json_object_put(o);
            free(text);
        }
    }
    snprintf(m.transfer_id, sizeof(m.transfer_id), "x");
    snprintf(m.req_id, sizeof(m.req_id), "rx");
    m.type = KVC_MSG_REMOTE_BLOCKS;
    char *text = kvc_msg_encode(&m, nullptr);
    ASSERT_NE(text, nullptr);
    EXPECT_STREQ(text,
                 R"({"type":"remote_blocks","transfer_id":"x",)"
                 R"("instance":"18446744073709551615","xfer_nonce":"1",)"
                 R"("req_id":"rx","block_notify_list":[0,1,)"
                 R"(9007199254740992,18446744073709551615],)"
                 R"("consumer_rank":0,"done_by_notice":1,"decode_rank":3})");
    free(text);
}

// Member order and omissions, pinned to what the json-c encoder (fc2c13d)
// printed for the same messages.
TEST(CtlMsgFlat, EncodesAsTheJsonCEncoderDid)
{
    struct Case {
        kvc_msg_type_t type;
        const char    *id, *req;
        int32_t        tp, rank, decode;
        uint64_t       inst, to, nonce;
        const char    *want;
    };
    uint64_t   ids[] = {7, 0, 9007199254740992ULL};
    const Case cases[] = {
        {KVC_MSG_RELEASE, "t/1", "", 2, -1, 0, 5, 6, 0,
         R"({"type":"release","transfer_id":"t/1","instance":"5",)"
         R"("to_instance":"6","consumer_tp_size":2})"},
        {KVC_MSG_RELEASE, "t/1", "", 0, 1, 0, 5, 6, 9,
         R"({"type":"release","transfer_id":"t/1","instance":"5",)"
         R"("to_instance":"6","xfer_nonce":"9","consumer_rank":1})"},
        {KVC_MSG_WRITE_DONE, "w\"d", "", 0, -1, 0, 0, UINT64_MAX, 0,
         R"({"type":"write_done","transfer_id":"w\"d",)"
         R"("to_instance":"18446744073709551615"})"},
        {KVC_MSG_HEARTBEAT, "", "", 0, -1, 0, 1, 0, 0,
         R"({"type":"heartbeat","instance":"1"})"},
        {KVC_MSG_REMOTE_BLOCKS, "x", "r\\q", 0, -1, 4, 0, 0, 0,
         R"({"type":"remote_blocks","transfer_id":"x","req_id":"r\\q",)"
         R"("block_notify_list":[7,0,9007199254740992],"decode_rank":4})"},
    };
    for (const Case &c : cases) {
        kvc_msg_t m = {};

        m.type             = c.type;
        m.consumer_tp_size = c.tp;
        m.consumer_rank    = c.rank;
        m.decode_rank      = c.decode;
        m.instance         = c.inst;
        m.to_instance      = c.to;
        m.xfer_nonce       = c.nonce;
        m.block_ids        = ids;
        m.num_block_ids    = 3;
        snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", c.id);
        snprintf(m.req_id, sizeof(m.req_id), "%s", c.req);
        char *text = kvc_msg_encode(&m, nullptr);
        ASSERT_NE(text, nullptr);
        EXPECT_STREQ(text, c.want);
        free(text);
    }
}

} // namespace
