// Proxy helpers (SPEC §3): D's registration -> P's kv_transfer_params, and
// the full proxy round trip P response -> D's params, read back by the same
// parser the engines use.
extern "C" {
#include "proxy.h"
}
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

const char kDecodeReg[] =
    "{\"type\":\"D\",\"http_address\":\"10.1.0.9:8200\","
    "\"zmq_address\":\"host:fd00::9,handshake:7301,notify:7501\","
    "\"dp_size\":2,\"tp_size\":16,\"transfer_mode\":\"WRITE\","
    "\"node_hosts\":[\"fd00::9\",\"fd00::10\"]}";

TEST(ProxyParams, PrefillParamsCarryTheDecodeInstance)
{
    char *out = nullptr;
    ASSERT_EQ(KVX_OK, kvc_params_build_prefill(kDecodeReg, "tx-1", &out))
        << kvc_last_error();
    kvc_xfer_params_t p;
    ASSERT_EQ(KVX_OK, kvc_params_parse(out, &p)) << kvc_last_error() << out;
    EXPECT_STREQ("tx-1", p.transfer_id);
    EXPECT_TRUE(p.do_remote_decode);
    EXPECT_FALSE(p.do_remote_prefill);
    ASSERT_TRUE(p.has_remote_addr);
    EXPECT_STREQ("fd00::9", p.remote.host);
    EXPECT_EQ(7301u, p.remote.handshake_port);
    EXPECT_EQ(7501u, p.remote.notify_port);
    EXPECT_EQ(16u, p.remote_tp_size);
    EXPECT_EQ(2u, p.remote_dp_size);
    ASSERT_EQ(2u, p.num_remote_hosts);
    EXPECT_STREQ("fd00::10", p.remote_hosts[1]);
    EXPECT_FALSE(p.has_remote_block_ids);
    kvc_params_fini(&p);
    free(out);
}

TEST(ProxyParams, RejectsBrokenRegistrations)
{
    struct Row {
        const char *reg;
        const char *field;
    } rows[] = {
        {"[]", "registration"},
        {"{\"tp_size\":1,\"dp_size\":1}", "zmq_address"},
        {"{\"zmq_address\":\"host:a,handshake:1\",\"tp_size\":1,\"dp_size\":1}",
         "zmq_address"},
        {"{\"zmq_address\":\"host:a,handshake:7301,notify:7501\",\"dp_size\":1}",
         "tp_size"},
        {"{\"zmq_address\":\"host:a,handshake:7301,notify:7501\",\"tp_size\":0,"
         "\"dp_size\":1}", "tp_size"},
        {"{\"zmq_address\":\"host:a,handshake:7301,notify:7501\",\"tp_size\":1,"
         "\"dp_size\":1,\"node_hosts\":[1]}", "node_hosts[0]"},
    };
    for (const Row &r : rows) {
        char *out = nullptr;
        EXPECT_EQ(KVX_ERR_INVALID_PARAM, kvc_params_build_prefill(r.reg, "tx", &out))
            << r.reg;
        EXPECT_NE(std::string(kvc_last_error()).find(r.field), std::string::npos)
            << kvc_last_error();
        EXPECT_EQ(nullptr, out);
    }
    char *out = nullptr;
    EXPECT_EQ(KVX_ERR_INVALID_PARAM, kvc_params_build_prefill(kDecodeReg, "", &out));
}

// Issue 15, defects 4 and 5 (reproducers in tests/fuzz/corpus/proxy/): the
// helper passed ports below 1024 and node_hosts entries of 256+ characters
// into params that kvc_params_parse (producer_request) then rejected. Now the
// registration is rejected, naming the field; at the limits it still builds
// params that parse.
TEST(ProxyParams, RegistrationValuesTheParamsWouldRejectAreRejected)
{
    const std::string long_host(KVC_HOST_MAX, 'h');
    const std::string rows[][2] = {
        {"{\"zmq_address\":\"host:a,handshake:80,notify:7501\",\"tp_size\":1,"
         "\"dp_size\":1}", "handshake port 80"},
        {"{\"zmq_address\":\"host:a,handshake:7301,notify:1023\",\"tp_size\":1,"
         "\"dp_size\":1}", "notify port 1023"},
        {"{\"zmq_address\":\"host:a,handshake:7301,notify:7501\",\"tp_size\":1,"
         "\"dp_size\":1,\"node_hosts\":[\"b\",\"" + long_host + "\"]}",
         "node_hosts[1]: length 256"},
    };
    for (const auto &r : rows) {
        char *out = nullptr;
        EXPECT_EQ(KVX_ERR_INVALID_PARAM,
                  kvc_params_build_prefill(r[0].c_str(), "tx", &out))
            << r[0];
        EXPECT_NE(std::string(kvc_last_error()).find(r[1]), std::string::npos)
            << kvc_last_error();
        EXPECT_EQ(nullptr, out);
    }
    const std::string ok_reg =
        "{\"zmq_address\":\"host:a,handshake:1024,notify:65535\",\"tp_size\":1,"
        "\"dp_size\":1,\"node_hosts\":[\"" + long_host.substr(1) + "\"]}";
    char *out = nullptr;
    ASSERT_EQ(KVX_OK, kvc_params_build_prefill(ok_reg.c_str(), "tx", &out))
        << kvc_last_error();
    kvc_xfer_params_t p;
    EXPECT_EQ(KVX_OK, kvc_params_parse(out, &p)) << kvc_last_error();
    EXPECT_EQ(1024u, p.remote.handshake_port);
    EXPECT_EQ(65535u, p.remote.notify_port);
    ASSERT_EQ(1u, p.num_remote_hosts);
    EXPECT_EQ(KVC_HOST_MAX - 1u, strlen(p.remote_hosts[0]));
    kvc_params_fini(&p);
    free(out);
}

TEST(ProxyParams, FullRoundTripThroughBothHelpers)
{
    // P's response (as producer_request returns it) -> D's params.
    const char resp[] =
        "{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
        "\"transfer_id\":\"tx-2\",\"remote_block_ids\":[4,5,6],"
        "\"remote_engine_id\":\"10.0.0.1:6301\",\"remote_host\":\"10.0.0.1\","
        "\"remote_handshake_port\":6301,\"remote_notify_port\":61005,"
        "\"tp_size\":8,\"remote_dp_size\":1,\"remote_hosts\":[\"10.0.0.1\"],"
        "\"remote_instance\":\"7357584953551272713\",\"remote_tp_rank\":2,"
        "\"remote_accepted\":\"7357584953561276415\","
        "\"remote_hold_ms\":60000}";
    char *dparams = nullptr;
    ASSERT_EQ(KVX_OK, kvc_params_build_decode(resp, "tx-2", &dparams));
    kvc_xfer_params_t p;
    ASSERT_EQ(KVX_OK, kvc_params_parse(dparams, &p));
    EXPECT_EQ(8u, p.remote_tp_size);
    ASSERT_EQ(3u, p.num_remote_block_ids);
    EXPECT_EQ(6u, p.remote_block_ids[2]);
    EXPECT_STREQ("10.0.0.1", p.remote.host);
    // The instance binding reaches D unchanged.
    EXPECT_EQ(7357584953551272713ull, p.remote_instance);
    EXPECT_EQ(2u, p.remote_tp_rank);
    EXPECT_EQ(1, p.has_remote_accepted);
    EXPECT_EQ(7357584953561276415ull, p.remote_accepted);
    // So does how long P holds the blocks (D's reads end before).
    EXPECT_EQ(60000u, p.remote_hold_ms);
    kvc_params_fini(&p);
    free(dparams);
}

} // namespace

namespace {

// The registration payload an engine sends (built from its config) is what
// the proxy helper reads back: config -> registration -> P's params.
TEST(ProxyRegistration, PayloadFromConfigRoundTripsThroughTheProxyHelper)
{
    const char cfg_json[] =
        "{\"role\":\"kv_consumer\",\"tp_rank\":0,\"tp_size\":4,\"dp_rank\":0,"
        "\"dp_size\":2,\"kv_connector_extra_config\":{\"host_ip\":\"10.2.0.5\","
        "\"handshake_port\":7301,\"notify_port\":7501,\"read_mode\":false,"
        "\"http_port\":8200,\"node_hosts\":[\"10.2.0.5\",\"10.2.0.6\"]}}";
    kvc_config_t cfg;
    ASSERT_EQ(KVX_OK, kvc_config_parse(cfg_json, &cfg, nullptr, nullptr))
        << kvc_last_error();
    char *reg = nullptr;
    ASSERT_EQ(KVX_OK, kvc_registration_build(&cfg, &reg)) << kvc_last_error();
    std::string r(reg);
    EXPECT_NE(std::string::npos, r.find("\"type\":\"D\"")) << r;
    EXPECT_NE(std::string::npos, r.find("\"http_address\":\"10.2.0.5:8200\""))
        << r;
    EXPECT_NE(std::string::npos, r.find("\"transfer_mode\":\"WRITE\"")) << r;

    char *out = nullptr;
    ASSERT_EQ(KVX_OK, kvc_params_build_prefill(reg, "tx-reg", &out))
        << kvc_last_error() << " " << r;
    kvc_xfer_params_t p;
    ASSERT_EQ(KVX_OK, kvc_params_parse(out, &p)) << kvc_last_error() << out;
    EXPECT_STREQ("10.2.0.5", p.remote.host);
    EXPECT_EQ(7301u, p.remote.handshake_port);
    EXPECT_EQ(7501u, p.remote.notify_port);
    EXPECT_EQ(4u, p.remote_tp_size);
    EXPECT_EQ(2u, p.remote_dp_size);
    ASSERT_EQ(2u, p.num_remote_hosts);
    EXPECT_STREQ("10.2.0.6", p.remote_hosts[1]);
    kvc_params_fini(&p);
    free(out);
    free(reg);
    kvc_config_fini(&cfg);
}

} // namespace

namespace {

// Found by fuzz_proxy (tests/fuzz/corpus/proxy/finding-config-host-comma):
// the config accepts a host_ip with a ',' which the zmq_address of the
// registration cannot carry; the registration is refused (KVX_ERR_CONFIG,
// naming the reason) instead of being sent unreadable to the proxy.
TEST(ProxyRegistration, ConfigHostTheProxyCannotReadIsRefused)
{
    const char cfg_json[] =
        "{\"role\":\"kv_consumer\",\"tp_rank\":0,\"tp_size\":1,"
        "\"kv_connector_extra_config\":{\"host_ip\":\"rc,x\","
        "\"node_hosts\":[\"10.2.0.5\"]}}";
    kvc_config_t cfg;
    ASSERT_EQ(KVX_OK, kvc_config_parse(cfg_json, &cfg, nullptr, nullptr))
        << kvc_last_error();
    char *reg = nullptr;
    EXPECT_EQ(KVX_ERR_CONFIG, kvc_registration_build(&cfg, &reg));
    EXPECT_EQ(nullptr, reg);
    const std::string err = kvc_last_error();
    EXPECT_NE(std::string::npos, err.find("not be readable by the proxy"))
        << err;
    EXPECT_NE(std::string::npos, err.find("host:rc,x")) << err;
    kvc_config_fini(&cfg);
}

} // namespace
