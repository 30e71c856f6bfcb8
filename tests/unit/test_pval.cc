// pval: the flat reader takes exactly its subset of JSON, and params it
// takes decode to what json-c's path gives (fields, status, error text),
// whatever the input: the listed cases, every one-byte change of typical
// params, and lists of thousands of block ids.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "addr.h"
#include "pval.h"
}

namespace {

struct Scan {
    explicit Scan(const std::string &json) : text(json)
    {
        ok = kvc_flat_scan(text.c_str(), m, 32, &n);
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
    EXPECT_EQ(kvc_flat_scan(json.c_str(), m, 32, &n), 1);
    EXPECT_EQ(m[1].val.len, 4096u);
}

} // namespace
