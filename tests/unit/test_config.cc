// test_config.cc - plugin/config.c: defaults, accepted forms, errors, dump.
extern "C" {
#include "config.h"
#include "pci.h"
#include "error.h"
#include "tlsname.h"
}

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <json-c/json.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char *const kExtraKeys[] = {
    "host_ip",          "handshake_port",     "notify_port",
    "read_mode",        "read_bind_decode_host", "release_on_data_plane",
    "node_hosts",
    "trusted_remote_hosts",
    "handshake_timeout", "transfer_timeout",  "defer_timeout", "clock_skew",
    "proxy_ip",         "proxy_ping_port",    "http_port",
    "backend",          "qp_per_transfer",    "post_batch_size",
    "num_workers",      "ucx_tls",            "ucx_net_devices", "ucx_lane_settings",
    "ucx_required_transports", "ucx_error_mode", "max_inflight_bytes",
    "progress_spin_us", "progress_drive_us",  "progress_caller",
    "gpu_bus_id",
    "hwloc_topology",   "proxy_ping_interval", "ucx_tcp_port_range", "tls_cert_file",
    "tls_key_file",     "tls_ca_file",        "tls_peer_name",
    "tls_proxy_name",
};

// Extra wraps body (the inside of kv_connector_extra_config) in a producer
// config.
std::string Extra(const std::string &body)
{
    return R"({"role":"kv_producer","kv_connector_extra_config":{)" + body +
           "}}";
}

void CollectWarning(void *arg, const char *msg)
{
    static_cast<std::vector<std::string> *>(arg)->push_back(msg);
}

std::vector<std::string> Hosts(char **v, size_t n)
{
    return std::vector<std::string>(v, v + n);
}

bool Contains(const std::string &haystack, const std::string &needle)
{
    return haystack.find(needle) != std::string::npos;
}

// Config owns a parsed kvc_config_t and the warnings of its parse.
class Config : public ::testing::Test {
  protected:
    void TearDown() override { kvc_config_fini(&cfg_); }

    kvx_status_t Parse(const std::string &json)
    {
        kvc_config_fini(&cfg_);
        warnings_.clear();
        return kvc_config_parse(json.c_str(), &cfg_, CollectWarning,
                                &warnings_);
    }

    // DumpValue returns the JSON text of one extra key in the dump.
    std::string DumpValue(const char *key)
    {
        char        *dump = kvc_config_dump(&cfg_);
        json_object *root = json_tokener_parse(dump);
        json_object *extra = nullptr, *val = nullptr;
        std::string  out = "<missing>";

        if (json_object_object_get_ex(root, "kv_connector_extra_config",
                                      &extra) &&
            json_object_object_get_ex(extra, key, &val)) {
            out = json_object_to_json_string_ext(
                val, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        }
        json_object_put(root);
        free(dump);
        return out;
    }

    kvc_config_t             cfg_ = {};
    std::vector<std::string> warnings_;
};

using ConfigDefaults = Config;
using ConfigParse    = Config;
using ConfigDump     = Config;
using ConfigWarnings = Config;
using ConfigIdentity = Config;

TEST_F(ConfigDefaults, EveryKeyHasItsDefault)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_producer"})")) << kvc_last_error();
    EXPECT_TRUE(warnings_.empty());
    EXPECT_EQ(1, cfg_.is_producer);
    EXPECT_EQ(0u, cfg_.tp_rank);
    EXPECT_EQ(1u, cfg_.tp_size);
    EXPECT_EQ(0u, cfg_.dp_rank);
    EXPECT_EQ(1u, cfg_.dp_size);
    EXPECT_EQ(1, cfg_.log_level);
    EXPECT_EQ(6301u, cfg_.handshake_port);
    EXPECT_EQ(61005u, cfg_.notify_port);
    EXPECT_EQ(0, cfg_.read_mode);
    EXPECT_EQ(std::vector<std::string>{cfg_.host_ip},
              Hosts(cfg_.node_hosts, cfg_.num_node_hosts));
    EXPECT_EQ(0, cfg_.trusted_set);
    EXPECT_EQ(0u, cfg_.num_trusted_remote_hosts);
    EXPECT_EQ(nullptr, cfg_.trusted_remote_hosts);
    EXPECT_DOUBLE_EQ(10.0, cfg_.handshake_timeout);
    EXPECT_DOUBLE_EQ(30.0, cfg_.transfer_timeout);
    EXPECT_DOUBLE_EQ(60.0, cfg_.defer_timeout);
    EXPECT_STREQ("", cfg_.proxy_ip);
    EXPECT_EQ(0u, cfg_.proxy_ping_port);
    EXPECT_EQ(0u, cfg_.http_port);
    EXPECT_STREQ("rdma", cfg_.backend);
    EXPECT_EQ(1u, cfg_.qp_per_transfer);
    EXPECT_EQ(-1, cfg_.post_batch_size);
    EXPECT_EQ(1u, cfg_.num_workers);
    EXPECT_STREQ("", cfg_.ucx_tls);
    EXPECT_STREQ("", cfg_.ucx_net_devices);
    EXPECT_EQ(0u, cfg_.num_ucx_required_transports);
    EXPECT_EQ(KVC_ERR_MODE_PEER, cfg_.ucx_error_mode);
    EXPECT_EQ(16777216u, cfg_.max_inflight_bytes);
    EXPECT_EQ(50u, cfg_.progress_spin_us);
    EXPECT_EQ(200u, cfg_.progress_drive_us);
    EXPECT_EQ(KVC_PROGRESS_CALLER_AUTO, cfg_.progress_caller);
    EXPECT_STREQ("", cfg_.gpu_bus_id);
    EXPECT_STREQ("", cfg_.hwloc_topology);
}

TEST_F(ConfigDefaults, HostIpIsANonLoopbackIpv4OrTheLoopbackFallback)
{
    struct in_addr addr;

    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_consumer"})")) << kvc_last_error();
    EXPECT_EQ(0, cfg_.is_producer);
    ASSERT_EQ(1, inet_pton(AF_INET, cfg_.host_ip, &addr)) << cfg_.host_ip;
    if ((ntohl(addr.s_addr) >> 24) == 127) {
        EXPECT_STREQ("127.0.0.1", cfg_.host_ip);
    }
}

TEST_F(ConfigDefaults, EmptyExtraConfigEqualsAbsentOne)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_producer"})"));
    char *absent = kvc_config_dump(&cfg_);
    ASSERT_EQ(KVX_OK, Parse(Extra("")));
    char *empty = kvc_config_dump(&cfg_);
    ASSERT_NE(nullptr, absent);
    ASSERT_NE(nullptr, empty);
    EXPECT_STREQ(absent, empty);
    free(absent);
    free(empty);
}

TEST_F(ConfigDefaults, NodeHostsDefaultFollowsHostIp)
{
    ASSERT_EQ(KVX_OK, Parse(Extra(R"("host_ip":" 10.1.2.3 ")")))
        << kvc_last_error();
    EXPECT_STREQ("10.1.2.3", cfg_.host_ip);
    EXPECT_EQ(std::vector<std::string>{"10.1.2.3"},
              Hosts(cfg_.node_hosts, cfg_.num_node_hosts));
}

TEST(ConfigFini, ZeroedStructAndDoubleFiniAreNoOps)
{
    kvc_config_t cfg = {};

    kvc_config_fini(&cfg);
    ASSERT_EQ(KVX_OK, kvc_config_parse(R"({"role":"kv_producer"})", &cfg,
                                       nullptr, nullptr));
    kvc_config_fini(&cfg);
    EXPECT_EQ(nullptr, cfg.node_hosts);
    EXPECT_EQ(0u, cfg.num_node_hosts);
    kvc_config_fini(&cfg);
}

TEST(ConfigArgs, NullArgumentsAreInvalidParam)
{
    kvc_config_t cfg = {};

    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvc_config_parse(nullptr, &cfg, nullptr, nullptr));
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvc_config_parse("{}", nullptr, nullptr, nullptr));
}

TEST_F(ConfigParse, EveryKeySetToAValidValue)
{
    const std::string json = R"({"kv_role":"kv_consumer","tp_rank":1,
        "tp_size":2,"dp_rank":2,"dp_size":3,"log_level":3,
        "kv_connector_extra_config":{"host_ip":"192.0.2.7",
        "handshake_port":7000,"notify_port":"50000","read_mode":"TRUE",
        "node_hosts":["hostA","hostB"],
        "trusted_remote_hosts":"10.0.0.0/8, peer.example",
        "handshake_timeout":2.5,"transfer_timeout":"45",
        "defer_timeout":3600,"proxy_ip":"proxy.example",
        "proxy_ping_port":36367,"http_port":"8000","backend":"xgmi",
        "qp_per_transfer":64,"post_batch_size":4096,"num_workers":8,
        "ucx_tls":"rc,sm,self","ucx_net_devices":"mlx5_0:1",
        "ucx_required_transports":["rc_verbs","sysv"],
        "ucx_error_mode":"none","max_inflight_bytes":1073741824,
        "progress_spin_us":0,"progress_drive_us":0,"progress_caller":true,
        "gpu_bus_id":"0000:c1:00.0","hwloc_topology":"/etc/kvxfer/topo.xml"}})";

    ASSERT_EQ(KVX_OK, Parse(json)) << kvc_last_error();
    EXPECT_TRUE(warnings_.empty());
    EXPECT_EQ(0, cfg_.is_producer);
    EXPECT_EQ(1u, cfg_.tp_rank);
    EXPECT_EQ(2u, cfg_.tp_size);
    EXPECT_EQ(2u, cfg_.dp_rank);
    EXPECT_EQ(3u, cfg_.dp_size);
    EXPECT_EQ(3, cfg_.log_level);
    EXPECT_STREQ("192.0.2.7", cfg_.host_ip);
    EXPECT_EQ(7000u, cfg_.handshake_port);
    EXPECT_EQ(50000u, cfg_.notify_port);
    EXPECT_EQ(1, cfg_.read_mode);
    EXPECT_EQ((std::vector<std::string>{"hostA", "hostB"}),
              Hosts(cfg_.node_hosts, cfg_.num_node_hosts));
    EXPECT_EQ(1, cfg_.trusted_set);
    EXPECT_EQ((std::vector<std::string>{"10.0.0.0/8", "peer.example"}),
              Hosts(cfg_.trusted_remote_hosts, cfg_.num_trusted_remote_hosts));
    EXPECT_DOUBLE_EQ(2.5, cfg_.handshake_timeout);
    EXPECT_DOUBLE_EQ(45.0, cfg_.transfer_timeout);
    EXPECT_DOUBLE_EQ(3600.0, cfg_.defer_timeout);
    EXPECT_STREQ("proxy.example", cfg_.proxy_ip);
    EXPECT_EQ(36367u, cfg_.proxy_ping_port);
    EXPECT_EQ(8000u, cfg_.http_port);
    EXPECT_STREQ("xgmi", cfg_.backend);
    EXPECT_EQ(64u, cfg_.qp_per_transfer);
    EXPECT_EQ(4096, cfg_.post_batch_size);
    EXPECT_EQ(8u, cfg_.num_workers);
    EXPECT_STREQ("rc,sm,self", cfg_.ucx_tls);
    EXPECT_STREQ("mlx5_0:1", cfg_.ucx_net_devices);
    EXPECT_EQ((std::vector<std::string>{"rc_verbs", "sysv"}),
              Hosts(cfg_.ucx_required_transports,
                    cfg_.num_ucx_required_transports));
    EXPECT_EQ(KVC_ERR_MODE_NONE, cfg_.ucx_error_mode);
    EXPECT_EQ(1073741824u, cfg_.max_inflight_bytes);
    EXPECT_EQ(0u, cfg_.progress_spin_us);
    EXPECT_EQ(0u, cfg_.progress_drive_us);
    EXPECT_EQ(1, cfg_.progress_caller);
    EXPECT_STREQ("0000:c1:00.0", cfg_.gpu_bus_id);
    EXPECT_STREQ("/etc/kvxfer/topo.xml", cfg_.hwloc_topology);
    EXPECT_EQ(6u, kvc_config_world(&cfg_));
    EXPECT_EQ(5u, kvc_config_rank(&cfg_));
}

// One accepted input per row and the value the dump reports for it.
struct ValidCase {
    const char *name;
    const char *body; // inside kv_connector_extra_config
    const char *key;
    const char *dumped;
};

class ConfigValidValue : public Config,
                         public ::testing::WithParamInterface<ValidCase> {};

TEST_P(ConfigValidValue, ParsesAndDumps)
{
    const ValidCase &c = GetParam();

    ASSERT_EQ(KVX_OK, Parse(Extra(c.body))) << kvc_last_error();
    EXPECT_TRUE(warnings_.empty());
    EXPECT_EQ(c.dumped, DumpValue(c.key));
}

const ValidCase kValidCases[] = {
    {"HostIpName", R"("host_ip":"node-1.example")", "host_ip",
     R"("node-1.example")"},
    {"HostIpV6", R"("host_ip":"fd00::1")", "host_ip", R"("fd00::1")"},
    {"HandshakePortLow", R"("handshake_port":1024)", "handshake_port", "1024"},
    {"ProgressCallerAuto", R"("progress_caller":" AUTO ")", "progress_caller",
     R"("auto")"},
    {"ProgressCallerFalseString", R"("progress_caller":"false")",
     "progress_caller", "false"},
    {"ProgressCallerOne", R"("progress_caller":1)", "progress_caller", "true"},
    {"HandshakePortHigh", R"("handshake_port":65535)", "handshake_port",
     "65535"},
    {"HandshakePortString", R"("handshake_port":" 7001 ")", "handshake_port",
     "7001"},
    {"NotifyPortLow", R"("notify_port":"1024")", "notify_port", "1024"},
    {"NodeHostsSingleString", R"("node_hosts":"a")", "node_hosts", R"(["a"])"},
    {"TrustedNull", R"("trusted_remote_hosts":null)", "trusted_remote_hosts",
     "null"},
    {"TrustedEmptyList", R"("trusted_remote_hosts":[])",
     "trusted_remote_hosts", "[]"},
    {"HandshakeTimeoutTiny", R"("handshake_timeout":0.001)",
     "handshake_timeout", "0.001"},
    {"TransferTimeoutString", R"("transfer_timeout":" 12.5 ")",
     "transfer_timeout", "12.5"},
    {"DeferTimeoutInt", R"("defer_timeout":1)", "defer_timeout", "1.0"},
    {"ProxyIp", R"("proxy_ip":"10.0.0.9","proxy_ping_port":36367)",
     "proxy_ip", R"("10.0.0.9")"},
    {"ProxyPingInterval", R"("proxy_ping_interval":0.25)",
     "proxy_ping_interval", "0.25"},
    {"ProxyPingPortMax", R"("proxy_ping_port":65535)", "proxy_ping_port",
     "65535"},
    {"ProxyPingPortUnset", R"("proxy_ping_port":0)", "proxy_ping_port", "0"},
    {"HttpPortLow", R"("http_port":1)", "http_port", "1"},
    {"BackendUpperCase", R"("backend":"XGMI")", "backend", R"("xgmi")"},
    {"BackendRdma", R"("backend":"rdma")", "backend", R"("rdma")"},
    {"QpPerTransferMin", R"("qp_per_transfer":1)", "qp_per_transfer", "1"},
    {"PostBatchSizeMinusOne", R"("post_batch_size":-1)", "post_batch_size",
     "-1"},
    {"PostBatchSizeOne", R"("post_batch_size":"1")", "post_batch_size", "1"},
    {"NumWorkersMax", R"("num_workers":64)", "num_workers", "64"},
    {"UcxTls", R"("ucx_tls":"tcp")", "ucx_tls", R"("tcp")"},
    {"UcxNetDevices", R"("ucx_net_devices":"eth0")", "ucx_net_devices",
     R"("eth0")"},
    {"UcxRequiredTransportsString",
     R"("ucx_required_transports":" rc_verbs, ,tcp ")",
     "ucx_required_transports", R"(["rc_verbs","tcp"])"},
    {"UcxErrorModePeer", R"("ucx_error_mode":"Peer")", "ucx_error_mode",
     R"("peer")"},
    {"MaxInflightBytesMin", R"("max_inflight_bytes":4096)",
     "max_inflight_bytes", "4096"},
    {"MaxInflightBytesHuge", R"("max_inflight_bytes":"1099511627776")",
     "max_inflight_bytes", "1099511627776"},
    {"ProgressSpinUsMax", R"("progress_spin_us":100000)", "progress_spin_us",
     "100000"},
    {"ProgressDriveUsMax", R"("progress_drive_us":100000)",
     "progress_drive_us", "100000"},
    {"GpuBusIdFull", R"("gpu_bus_id":"0000:c1:00.0")", "gpu_bus_id",
     R"("0000:c1:00.0")"},
    {"GpuBusIdShort", R"("gpu_bus_id":"83:1f.7")", "gpu_bus_id",
     R"("83:1f.7")"},
    {"GpuBusIdUpperCasePadded", R"("gpu_bus_id":" 0001:C1:0A.1 ")",
     "gpu_bus_id", R"("0001:C1:0A.1")"},
    {"GpuBusIdEmpty", R"("gpu_bus_id":"")", "gpu_bus_id", R"("")"},
    {"GpuBusIdBlank", R"("gpu_bus_id":"  ")", "gpu_bus_id", R"("")"},
    {"HwlocTopologyPath", R"("hwloc_topology":"/tmp/topo.xml")",
     "hwloc_topology", R"("/tmp/topo.xml")"},
    {"HwlocTopologyEmpty", R"("hwloc_topology":"")", "hwloc_topology",
     R"("")"},
};

INSTANTIATE_TEST_SUITE_P(
    EveryKey, ConfigValidValue, ::testing::ValuesIn(kValidCases),
    [](const ::testing::TestParamInfo<ValidCase> &info) {
        return std::string(info.param.name);
    });

// read_mode in every accepted form.
struct BoolCase {
    const char *name;
    const char *json;
    int         expect;
};

class ConfigReadMode : public Config,
                       public ::testing::WithParamInterface<BoolCase> {};

TEST_P(ConfigReadMode, AcceptsEveryForm)
{
    const BoolCase &c = GetParam();

    ASSERT_EQ(KVX_OK, Parse(Extra(std::string("\"read_mode\":") + c.json)))
        << kvc_last_error();
    EXPECT_EQ(c.expect, cfg_.read_mode);
}

const BoolCase kBoolCases[] = {
    {"JsonTrue", "true", 1},          {"JsonFalse", "false", 0},
    {"StringTrue", "\"true\"", 1},    {"StringFalse", "\"false\"", 0},
    {"StringOne", "\"1\"", 1},        {"StringZero", "\"0\"", 0},
    {"IntOne", "1", 1},               {"IntZero", "0", 0},
    {"MixedCase", "\"TrUe\"", 1},     {"UpperFalse", "\"FALSE\"", 0},
    {"Padded", "\"  true \"", 1},     {"PaddedZero", "\" 0\"", 0},
};

INSTANTIATE_TEST_SUITE_P(
    Forms, ConfigReadMode, ::testing::ValuesIn(kBoolCases),
    [](const ::testing::TestParamInfo<BoolCase> &info) {
        return std::string(info.param.name);
    });

TEST_F(ConfigParse, NodeHostsAsList)
{
    ASSERT_EQ(KVX_OK,
              Parse(Extra(R"("node_hosts":[" h0 ","","h1","  ","h2"])")))
        << kvc_last_error();
    EXPECT_EQ((std::vector<std::string>{"h0", "h1", "h2"}),
              Hosts(cfg_.node_hosts, cfg_.num_node_hosts));
}

TEST_F(ConfigParse, NodeHostsAsCommaString)
{
    ASSERT_EQ(KVX_OK, Parse(Extra(R"("node_hosts":" h0 , ,h1,,h2 ,")")))
        << kvc_last_error();
    EXPECT_EQ((std::vector<std::string>{"h0", "h1", "h2"}),
              Hosts(cfg_.node_hosts, cfg_.num_node_hosts));
}

TEST_F(ConfigParse, TrustedRemoteHostsForms)
{
    ASSERT_EQ(KVX_OK, Parse(Extra(
                          R"("trusted_remote_hosts":["10.0.0.1"," ::1 "])")))
        << kvc_last_error();
    EXPECT_EQ(1, cfg_.trusted_set);
    EXPECT_EQ((std::vector<std::string>{"10.0.0.1", "::1"}),
              Hosts(cfg_.trusted_remote_hosts, cfg_.num_trusted_remote_hosts));

    ASSERT_EQ(KVX_OK,
              Parse(Extra(R"("trusted_remote_hosts":"a.example,,b.example")")));
    EXPECT_EQ(1, cfg_.trusted_set);
    EXPECT_EQ((std::vector<std::string>{"a.example", "b.example"}),
              Hosts(cfg_.trusted_remote_hosts, cfg_.num_trusted_remote_hosts));

    // Present but empty: set, trusting nobody.
    ASSERT_EQ(KVX_OK, Parse(Extra(R"("trusted_remote_hosts":"")")));
    EXPECT_EQ(1, cfg_.trusted_set);
    EXPECT_EQ(0u, cfg_.num_trusted_remote_hosts);

    ASSERT_EQ(KVX_OK, Parse(Extra(R"("trusted_remote_hosts":null)")));
    EXPECT_EQ(0, cfg_.trusted_set);
}

TEST_F(ConfigIdentity, KvRoleIsAnAliasOfRole)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"kv_role":"kv_producer"})"));
    EXPECT_EQ(1, cfg_.is_producer);
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_consumer","kv_role":"kv_consumer"})"));
    EXPECT_EQ(0, cfg_.is_producer);
    EXPECT_TRUE(warnings_.empty());
}

TEST_F(ConfigIdentity, WorldAndGlobalRank)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_producer","tp_rank":3,
        "tp_size":4,"dp_rank":1,"dp_size":2})"));
    EXPECT_EQ(8u, kvc_config_world(&cfg_));
    EXPECT_EQ(7u, kvc_config_rank(&cfg_));
}

TEST_F(ConfigIdentity, PortRuleCountsEveryRank)
{
    // world 8: the base may go up to 65535 - 7.
    const std::string ident =
        R"({"role":"kv_producer","tp_size":4,"dp_size":2,)"
        R"("kv_connector_extra_config":{)";

    ASSERT_EQ(KVX_OK, Parse(ident + R"("handshake_port":65528}})"))
        << kvc_last_error();
    EXPECT_EQ(65528u, cfg_.handshake_port);

    EXPECT_EQ(KVX_ERR_CONFIG, Parse(ident + R"("handshake_port":65529}})"));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "kv_connector_extra_config.handshake_port")) << err;
    EXPECT_TRUE(Contains(err, "65529")) << err;
    EXPECT_TRUE(Contains(err, "would exceed 65535")) << err;

    EXPECT_EQ(KVX_ERR_CONFIG, Parse(ident + R"("notify_port":65530}})"));
    err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "notify_port")) << err;
    EXPECT_TRUE(Contains(err, "65530")) << err;
}

TEST_F(ConfigIdentity, DefaultPortCanOverflowWithALargeWorld)
{
    // 61005 + 64*128 - 1 > 65535: the default notify_port no longer fits.
    EXPECT_EQ(KVX_ERR_CONFIG, Parse(R"({"role":"kv_producer","tp_size":64,
        "dp_size":128})"));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "notify_port")) << err;
    EXPECT_TRUE(Contains(err, "61005")) << err;
    EXPECT_EQ(nullptr, cfg_.node_hosts);
}

TEST_F(ConfigWarnings, UnknownKeysAreReportedAndIgnored)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_producer","kv_connector":"x",
        "kv_connector_extra_config":{"foo":1,"read_mode":true}})"));
    EXPECT_EQ(1, cfg_.read_mode);
    ASSERT_EQ(2u, warnings_.size());
    std::vector<std::string> sorted = warnings_;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ("kv_connector: unknown key, ignored", sorted[0]);
    EXPECT_EQ("kv_connector_extra_config.foo: unknown key, ignored",
              sorted[1]);
}

struct LogCapture {
    std::vector<std::string> ids, msgs;
};

void CaptureLog(void *arg, int, const char *id, const char *msg)
{
    auto *cap = static_cast<LogCapture *>(arg);
    cap->ids.push_back(id);
    cap->msgs.push_back(msg);
}

TEST(ConfigWarningsLog, WithoutCallbackTheWarningIsLogged)
{
    LogCapture   cap;
    kvc_config_t cfg = {};

    kvc_log_set(CaptureLog, &cap, KVC_LOG_WARN);
    kvx_status_t st = kvc_config_parse(
        Extra(R"("ucx_tlss":"tcp")").c_str(), &cfg, nullptr, nullptr);
    kvc_log_set(nullptr, nullptr, KVC_LOG_WARN);
    ASSERT_EQ(KVX_OK, st);
    kvc_config_fini(&cfg);
    ASSERT_EQ(1u, cap.ids.size());
    EXPECT_EQ("KVX-CONFIG-UNKNOWN-KEY", cap.ids[0]);
    EXPECT_TRUE(Contains(cap.msgs[0], "kv_connector_extra_config.ucx_tlss"))
        << cap.msgs[0];
}

// ExpectSameConfig compares every field of two configs.
void ExpectSameConfig(const kvc_config_t &a, const kvc_config_t &b)
{
    EXPECT_EQ(a.is_producer, b.is_producer);
    EXPECT_EQ(a.tp_rank, b.tp_rank);
    EXPECT_EQ(a.tp_size, b.tp_size);
    EXPECT_EQ(a.dp_rank, b.dp_rank);
    EXPECT_EQ(a.dp_size, b.dp_size);
    EXPECT_EQ(a.log_level, b.log_level);
    EXPECT_STREQ(a.host_ip, b.host_ip);
    EXPECT_EQ(a.handshake_port, b.handshake_port);
    EXPECT_EQ(a.notify_port, b.notify_port);
    EXPECT_EQ(a.read_mode, b.read_mode);
    EXPECT_EQ(Hosts(a.node_hosts, a.num_node_hosts),
              Hosts(b.node_hosts, b.num_node_hosts));
    EXPECT_EQ(a.trusted_set, b.trusted_set);
    EXPECT_EQ(Hosts(a.trusted_remote_hosts, a.num_trusted_remote_hosts),
              Hosts(b.trusted_remote_hosts, b.num_trusted_remote_hosts));
    EXPECT_EQ(a.handshake_timeout, b.handshake_timeout);
    EXPECT_EQ(a.transfer_timeout, b.transfer_timeout);
    EXPECT_EQ(a.defer_timeout, b.defer_timeout);
    EXPECT_STREQ(a.proxy_ip, b.proxy_ip);
    EXPECT_EQ(a.proxy_ping_port, b.proxy_ping_port);
    EXPECT_EQ(a.http_port, b.http_port);
    EXPECT_STREQ(a.backend, b.backend);
    EXPECT_EQ(a.qp_per_transfer, b.qp_per_transfer);
    EXPECT_EQ(a.post_batch_size, b.post_batch_size);
    EXPECT_EQ(a.num_workers, b.num_workers);
    EXPECT_STREQ(a.ucx_tls, b.ucx_tls);
    EXPECT_STREQ(a.ucx_net_devices, b.ucx_net_devices);
    EXPECT_EQ(Hosts(a.ucx_required_transports, a.num_ucx_required_transports),
              Hosts(b.ucx_required_transports, b.num_ucx_required_transports));
    EXPECT_EQ(a.ucx_error_mode, b.ucx_error_mode);
    EXPECT_EQ(a.max_inflight_bytes, b.max_inflight_bytes);
    EXPECT_EQ(a.progress_spin_us, b.progress_spin_us);
    EXPECT_EQ(a.progress_drive_us, b.progress_drive_us);
    EXPECT_EQ(a.progress_caller, b.progress_caller);
    EXPECT_STREQ(a.gpu_bus_id, b.gpu_bus_id);
    EXPECT_STREQ(a.hwloc_topology, b.hwloc_topology);
}

class ConfigRoundTrip : public Config,
                        public ::testing::WithParamInterface<const char *> {};

TEST_P(ConfigRoundTrip, ParseOfDumpGivesTheSameValues)
{
    ASSERT_EQ(KVX_OK, Parse(GetParam())) << kvc_last_error();
    char *dump = kvc_config_dump(&cfg_);
    ASSERT_NE(nullptr, dump);

    kvc_config_t             again = {};
    std::vector<std::string> warnings;
    kvx_status_t st = kvc_config_parse(dump, &again, CollectWarning, &warnings);
    EXPECT_EQ(KVX_OK, st) << kvc_last_error() << "\n" << dump;
    EXPECT_TRUE(warnings.empty());
    if (st == KVX_OK) {
        ExpectSameConfig(cfg_, again);
    }
    kvc_config_fini(&again);
    free(dump);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ConfigRoundTrip,
    ::testing::Values(
        R"({"role":"kv_producer"})",
        R"({"kv_role":"kv_consumer","tp_rank":1,"tp_size":2,"dp_rank":2,
        "dp_size":3,"log_level":0,"kv_connector_extra_config":{
        "host_ip":"192.0.2.7","handshake_port":7000,"notify_port":50000,
        "read_mode":"1","node_hosts":"a, b","trusted_remote_hosts":["c/d"],
        "handshake_timeout":0.1,"transfer_timeout":"45.25",
        "defer_timeout":3600,"proxy_ip":"p","proxy_ping_port":1024,
        "http_port":2,"backend":"xgmi","qp_per_transfer":3,
        "post_batch_size":5,"num_workers":6,"ucx_tls":"rc,\"x\"",
        "ucx_net_devices":"mlx5_0:1","ucx_required_transports":"rc_verbs",
        "ucx_error_mode":"none","max_inflight_bytes":9223372036854775807,
        "progress_spin_us":7,"progress_drive_us":9,"gpu_bus_id":" 83:00.0",
        "hwloc_topology":"/data/topo \"a\".xml"}})",
        R"({"role":"kv_consumer","kv_connector_extra_config":{
        "trusted_remote_hosts":[]}})"));

TEST_F(ConfigDump, ListsEveryKey)
{
    ASSERT_EQ(KVX_OK, Parse(R"({"role":"kv_consumer","tp_size":2})"));
    char        *dump = kvc_config_dump(&cfg_);
    json_object *root = json_tokener_parse(dump);
    json_object *val = nullptr, *extra = nullptr;

    ASSERT_NE(nullptr, root) << dump;
    ASSERT_TRUE(json_object_object_get_ex(root, "role", &val));
    EXPECT_STREQ("kv_consumer", json_object_get_string(val));
    for (const char *key : {"tp_rank", "tp_size", "dp_rank", "dp_size",
                            "log_level"}) {
        EXPECT_TRUE(json_object_object_get_ex(root, key, nullptr)) << key;
    }
    ASSERT_TRUE(json_object_object_get_ex(root, "kv_connector_extra_config",
                                          &extra));
    EXPECT_EQ(7, json_object_object_length(root));
    for (const char *key : kExtraKeys) {
        EXPECT_TRUE(json_object_object_get_ex(extra, key, nullptr)) << key;
    }
    EXPECT_EQ(static_cast<int>(sizeof(kExtraKeys) / sizeof(kExtraKeys[0])),
              json_object_object_length(extra));
    json_object_put(root);
    free(dump);
}

// One rejected input per row: the error must name the key and the value.
struct BadCase {
    const char *name;
    std::string json;
    const char *key;
    const char *value;
};

class ConfigBadValues : public Config,
                        public ::testing::WithParamInterface<BadCase> {};

TEST_P(ConfigBadValues, RejectedWithKeyAndValue)
{
    const BadCase &c = GetParam();

    EXPECT_EQ(KVX_ERR_CONFIG, Parse(c.json));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, c.key)) << err;
    EXPECT_TRUE(Contains(err, c.value)) << err;
    // Nothing is left behind on error.
    EXPECT_EQ(nullptr, cfg_.node_hosts);
    EXPECT_EQ(nullptr, cfg_.trusted_remote_hosts);
    EXPECT_EQ(nullptr, cfg_.ucx_required_transports);
    EXPECT_EQ(0u, cfg_.num_node_hosts);
}

BadCase Top(const char *name, const std::string &json, const char *key,
            const char *value)
{
    return BadCase{name, json, key, value};
}

BadCase X(const char *name, const std::string &body, const char *key,
          const char *value)
{
    return BadCase{name, Extra(body), key, value};
}

const std::string kLong(300, 'h');

std::vector<BadCase> BadCases()
{
    return {
        Top("RoleUnknown", R"({"role":"kv_both"})", "role",
            "\"kv_both\""),
        Top("RoleNotString", R"({"role":1})", "role", "value 1"),
        Top("KvRoleUnknown", R"({"kv_role":"producer"})", "kv_role",
            "\"producer\""),
        Top("RoleConflict", R"({"role":"kv_producer","kv_role":"kv_consumer"})",
            "kv_role", "\"kv_consumer\""),
        Top("RoleMissing", R"({"tp_size":1})", "role", "missing"),
        Top("TpRankNegative", R"({"role":"kv_producer","tp_rank":-1})",
            "tp_rank", "-1"),
        Top("TpRankNotInt", R"({"role":"kv_producer","tp_rank":"abc"})",
            "tp_rank", "\"abc\""),
        Top("TpRankTooBig", R"({"role":"kv_producer","tp_rank":4,"tp_size":4})",
            "tp_rank: value 4: must be < tp_size 4", "4"),
        Top("TpSizeZero", R"({"role":"kv_producer","tp_size":0})", "tp_size",
            "value 0"),
        Top("TpSizeBool", R"({"role":"kv_producer","tp_size":true})",
            "tp_size", "true"),
        Top("DpRankDouble", R"({"role":"kv_producer","dp_rank":1.5})",
            "dp_rank", "1.5"),
        Top("DpRankTooBig", R"({"role":"kv_producer","dp_rank":2,"dp_size":2})",
            "dp_rank: value 2: must be < dp_size 2", "2"),
        Top("DpSizeZero", R"({"role":"kv_producer","dp_size":"0"})",
            "dp_size", "\"0\""),
        Top("DpSizeHuge", R"({"role":"kv_producer","dp_size":70000})",
            "dp_size", "70000"),
        Top("LogLevelHigh", R"({"role":"kv_producer","log_level":4})",
            "log_level", "4"),
        Top("LogLevelWord", R"({"role":"kv_producer","log_level":"warn"})",
            "log_level", "\"warn\""),
        Top("ExtraNotObject",
            R"({"role":"kv_producer","kv_connector_extra_config":5})",
            "kv_connector_extra_config", "5"),
        Top("ExtraNull",
            R"({"role":"kv_producer","kv_connector_extra_config":null})",
            "kv_connector_extra_config", "null"),
        Top("NotJson", R"({"role":)", "invalid JSON", ""),
        Top("TrailingGarbage", R"({"role":"kv_producer"} x)", "invalid JSON",
            "trailing"),
        Top("RootArray", R"(["role"])", "config", "[\"role\"]"),
        X("HostIpEmpty", R"("host_ip":"  ")", "host_ip", "\"  \""),
        X("HostIpNumber", R"("host_ip":42)", "host_ip", "42"),
        X("HostIpTooLong", "\"host_ip\":\"" + kLong + "\"", "host_ip",
          "hhhhhhhh"),
        X("HandshakePortLow", R"("handshake_port":1023)", "handshake_port",
          "1023"),
        X("HandshakePortHigh", R"("handshake_port":65536)",
          "kv_connector_extra_config.handshake_port", "65536"),
        X("HandshakePortString", R"("handshake_port":"70000")",
          "handshake_port", "\"70000\""),
        X("HandshakePortWord", R"("handshake_port":"port")", "handshake_port",
          "\"port\""),
        X("HandshakePortDouble", R"("handshake_port":6301.5)",
          "handshake_port", "6301.5"),
        X("NotifyPortLow", R"("notify_port":80)", "notify_port", "80"),
        X("NotifyPortNull", R"("notify_port":null)", "notify_port", "null"),
        X("ReadModeYes", R"("read_mode":"yes")", "read_mode", "\"yes\""),
        X("ReadModeTwo", R"("read_mode":2)", "read_mode", "value 2"),
        X("ReadModeList", R"("read_mode":[1])", "read_mode", "[1]"),
        X("NodeHostsNumber", R"("node_hosts":5)", "node_hosts", "5"),
        X("NodeHostsNumbers", R"("node_hosts":[1,2])", "node_hosts", "[1,2]"),
        X("NodeHostsEmpty", R"("node_hosts":"")", "node_hosts", "\"\""),
        X("NodeHostsBlank", R"("node_hosts":[" ",""])", "node_hosts",
          "[\" \",\"\"]"),
        X("NodeHostsTooLong", "\"node_hosts\":[\"a\",\"" + kLong + "\"]",
          "node_hosts", "hhhhhhhh"),
        X("TrustedNumber", R"("trusted_remote_hosts":7)",
          "trusted_remote_hosts", "7"),
        X("TrustedObject", R"("trusted_remote_hosts":{"a":1})",
          "trusted_remote_hosts", "{\"a\":1}"),
        X("HandshakeTimeoutZero", R"("handshake_timeout":0)",
          "handshake_timeout", "value 0"),
        X("HandshakeTimeoutNegative", R"("handshake_timeout":-1)",
          "handshake_timeout", "-1"),
        X("HandshakeTimeoutHuge", R"("handshake_timeout":3601)",
          "handshake_timeout", "3601"),
        X("HandshakeTimeoutWord", R"("handshake_timeout":"abc")",
          "handshake_timeout", "\"abc\""),
        X("HandshakeTimeoutNan", R"("handshake_timeout":"nan")",
          "handshake_timeout", "\"nan\""),
        X("TransferTimeoutBool", R"("transfer_timeout":true)",
          "transfer_timeout", "true"),
        X("TransferTimeoutHuge", R"("transfer_timeout":1e9)",
          "transfer_timeout", "1e9"),
        X("DeferTimeoutZeroString", R"("defer_timeout":"0")",
          "defer_timeout", "\"0\""),
        X("ProxyIpNumber", R"("proxy_ip":1)", "proxy_ip", "value 1"),
        X("ProxyPingPortHigh", R"("proxy_ping_port":70000)",
          "proxy_ping_port", "70000"),
        X("ProxyPingPortNegative", R"("proxy_ping_port":-1)",
          "proxy_ping_port", "-1"),
        X("ProxyIpWithoutPort", R"("proxy_ip":"10.0.0.9")",
          "proxy_ping_port", "must be set when proxy_ip"),
        X("ProxyPingPortPrivileged",
          R"("proxy_ip":"10.0.0.9","proxy_ping_port":80)",
          "proxy_ping_port", "value 80"),
        X("ProxyPingIntervalZero", R"("proxy_ping_interval":0)",
          "proxy_ping_interval", "0"),
        X("TlsCertWithoutKey",
          R"("tls_cert_file":"c.pem","tls_ca_file":"ca.pem","tls_peer_name":"p")",
          "tls_key_file", "must be set when any of tls_cert_file"),
        X("TlsPeerNameMissing",
          R"("tls_cert_file":"c.pem","tls_key_file":"k.pem","tls_ca_file":"ca.pem")",
          "tls_peer_name", "mutual TLS needs all four"),
        X("TlsProxyNameAlone", R"("tls_proxy_name":"proxy")",
          "tls_proxy_name", "'proxy'"),
        X("TlsCaNumber", R"("tls_ca_file":1)", "tls_ca_file", "value 1"),
        X("HttpPortHigh", R"("http_port":65536)", "http_port", "65536"),
        X("HttpPortWord", R"("http_port":"x")", "http_port", "\"x\""),
        X("BackendUnknown", R"("backend":"tcp")", "backend", "\"tcp\""),
        X("BackendNumber", R"("backend":1)", "backend", "value 1"),
        X("QpPerTransferZero", R"("qp_per_transfer":0)", "qp_per_transfer",
          "value 0"),
        X("QpPerTransferHigh", R"("qp_per_transfer":65)", "qp_per_transfer",
          "65"),
        X("PostBatchSizeZero", R"("post_batch_size":0)", "post_batch_size",
          "value 0"),
        X("PostBatchSizeMinusTwo", R"("post_batch_size":-2)",
          "post_batch_size", "-2"),
        X("PostBatchSizeHigh", R"("post_batch_size":4097)",
          "post_batch_size", "4097"),
        X("NumWorkersZero", R"("num_workers":0)", "num_workers", "value 0"),
        X("NumWorkersHigh", R"("num_workers":65)", "num_workers", "65"),
        X("UcxTlsNumber", R"("ucx_tls":5)", "ucx_tls", "value 5"),
        X("UcxTlsTooLong", "\"ucx_tls\":\"" + kLong + "\"", "ucx_tls",
          "hhhhhhhh"),
        X("UcxNetDevicesBool", R"("ucx_net_devices":false)",
          "ucx_net_devices", "false"),
        X("UcxRequiredTransportsNumber", R"("ucx_required_transports":3)",
          "ucx_required_transports", "3"),
        X("UcxRequiredTransportsBools", R"("ucx_required_transports":[true])",
          "ucx_required_transports", "[true]"),
        X("UcxErrorModeUnknown", R"("ucx_error_mode":"strict")",
          "ucx_error_mode", "\"strict\""),
        X("UcxErrorModeNumber", R"("ucx_error_mode":0)", "ucx_error_mode",
          "value 0"),
        X("MaxInflightBytesSmall", R"("max_inflight_bytes":4095)",
          "max_inflight_bytes", "4095"),
        X("MaxInflightBytesWord", R"("max_inflight_bytes":"big")",
          "max_inflight_bytes", "\"big\""),
        X("MaxInflightBytesOverflow",
          R"("max_inflight_bytes":18446744073709551615)",
          "max_inflight_bytes", "18446744073709551615"),
        X("MaxInflightBytesStringOverflow",
          R"("max_inflight_bytes":"99999999999999999999")",
          "max_inflight_bytes", "99999999999999999999"),
        X("ProgressSpinUsHigh", R"("progress_spin_us":100001)",
          "progress_spin_us", "100001"),
        X("ProgressSpinUsNegative", R"("progress_spin_us":-1)",
          "progress_spin_us", "-1"),
        X("ProgressDriveUsHigh", R"("progress_drive_us":100001)",
          "progress_drive_us", "100001"),
        X("ProgressDriveUsNegative", R"("progress_drive_us":-1)",
          "progress_drive_us", "-1"),
        X("ProgressDriveUsString", R"("progress_drive_us":"x")",
          "progress_drive_us", "\"x\""),
        X("ProgressCallerNumber", R"("progress_caller":2)",
          "progress_caller", "2"),
        X("ProgressCallerWord", R"("progress_caller":"sometimes")",
          "progress_caller", "\"sometimes\""),
        X("GpuBusIdWord", R"("gpu_bus_id":"gpu0")", "gpu_bus_id",
          "\"gpu0\""),
        X("GpuBusIdNumber", R"("gpu_bus_id":3)", "gpu_bus_id", "value 3"),
        X("GpuBusIdNoFunction", R"("gpu_bus_id":"0000:c1:00")", "gpu_bus_id",
          "\"0000:c1:00\""),
        X("GpuBusIdDeviceHigh", R"("gpu_bus_id":"c1:20.0")", "gpu_bus_id",
          "\"c1:20.0\""),
        X("GpuBusIdFunctionHigh", R"("gpu_bus_id":"0000:c1:00.8")",
          "gpu_bus_id", "\"0000:c1:00.8\""),
        X("GpuBusIdFiveDigitDomain", R"("gpu_bus_id":"10000:c1:00.0")",
          "gpu_bus_id", "\"10000:c1:00.0\""),
        X("GpuBusIdOneDigitBus", R"("gpu_bus_id":"1:00.0")", "gpu_bus_id",
          "\"1:00.0\""),
        X("GpuBusIdNotHex", R"("gpu_bus_id":"0000:g1:00.0")", "gpu_bus_id",
          "\"0000:g1:00.0\""),
        X("GpuBusIdTrailing", R"("gpu_bus_id":"0000:c1:00.0,0000:c2:00.0")",
          "gpu_bus_id", "0000:c2:00.0"),
        X("GpuBusIdTooLong", "\"gpu_bus_id\":\"" + kLong + "\"",
          "gpu_bus_id", "hhhhhhhh"),
        X("HwlocTopologyNumber", R"("hwloc_topology":1)", "hwloc_topology",
          "value 1"),
        X("HwlocTopologyList", R"("hwloc_topology":["a.xml"])",
          "hwloc_topology", "[\"a.xml\"]"),
        X("HwlocTopologyTooLong", "\"hwloc_topology\":\"" + kLong + "\"",
          "hwloc_topology", "hhhhhhhh"),
        // An error after lists were parsed frees them.
        X("ErrorAfterLists",
          R"("node_hosts":"a,b","trusted_remote_hosts":"c",)"
          R"("ucx_required_transports":"tcp","progress_spin_us":"x")",
          "progress_spin_us", "\"x\""),
    };
}

INSTANTIATE_TEST_SUITE_P(
    EveryKey, ConfigBadValues, ::testing::ValuesIn(BadCases()),
    [](const ::testing::TestParamInfo<BadCase> &info) {
        return std::string(info.param.name);
    });

TEST_F(ConfigBadValues, MissingRoleNamesBothSpellings)
{
    EXPECT_EQ(KVX_ERR_CONFIG, Parse("{}"));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "role")) << err;
    EXPECT_TRUE(Contains(err, "kv_role")) << err;
    EXPECT_TRUE(Contains(err, "kv_producer")) << err;
    EXPECT_TRUE(Contains(err, "kv_consumer")) << err;
}

TEST_F(ConfigBadValues, WrongTypeNamesTheExpectedType)
{
    EXPECT_EQ(KVX_ERR_CONFIG, Parse(Extra(R"("notify_port":[61005])")));
    std::string err = kvc_last_error();
    EXPECT_EQ("kv_connector_extra_config.notify_port: value [61005]: expected "
              "an integer (or a string holding one)",
              err);

    EXPECT_EQ(KVX_ERR_CONFIG, Parse(Extra(R"("node_hosts":{"a":"b"})")));
    err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "expected a list of strings or a "
                              "comma-separated string"))
        << err;
}

// A NUL (JSON \u0000) inside any string value is refused, naming where:
// every value is used as C text, so "10.0.0.1\u0000junk" was taken as
// 10.0.0.1 and a list entry lost what followed.
TEST_F(ConfigBadValues, NulInsideAStringValueIsRefused)
{
    struct {
        const char *extra, *where, *offset;
    } cases[] = {
        {R"("host_ip":"10.0.0.1\u0000junk")",
         "kv_connector_extra_config.host_ip:", "offset 8"},
        {R"("trusted_remote_hosts":["10.0.0.1","10.0.0.2\u0000 10.9.9.9"])",
         "kv_connector_extra_config.trusted_remote_hosts[1]:", "offset 8"},
        {R"("node_hosts":"10.0.0.1\u0000,10.0.0.3")",
         "kv_connector_extra_config.node_hosts:", "offset 8"},
        {R"("ucx_tls":"\u0000")", "kv_connector_extra_config.ucx_tls:",
         "offset 0"},
    };
    for (const auto &c : cases) {
        EXPECT_EQ(KVX_ERR_CONFIG, Parse(Extra(c.extra))) << c.extra;
        std::string err = kvc_last_error();
        EXPECT_TRUE(Contains(err, c.where)) << err;
        EXPECT_TRUE(Contains(err, "NUL character at " + std::string(c.offset)))
            << err;
    }
    // and one at the top level
    EXPECT_EQ(KVX_ERR_CONFIG, Parse(R"({"role":"kv_producer\u0000"})"));
    EXPECT_TRUE(Contains(kvc_last_error(), "config: role: NUL"))
        << kvc_last_error();
}

TEST_F(ConfigBadValues, LongValuesAreShortenedButTheRuleStays)
{
    const std::string big(5000, 'x');

    EXPECT_EQ(KVX_ERR_CONFIG, Parse(Extra("\"backend\":\"" + big + "\"")));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "kv_connector_extra_config.backend")) << err;
    EXPECT_TRUE(Contains(err, "...")) << err;
    EXPECT_TRUE(Contains(err, "\"xgmi\"")) << err;
    EXPECT_LT(err.size(), 512u);
}

// gpu_bus_id errors state the accepted forms.
TEST_F(ConfigBadValues, GpuBusIdErrorStatesTheRule)
{
    EXPECT_EQ(KVX_ERR_CONFIG, Parse(Extra(R"("gpu_bus_id":"card0")")));
    EXPECT_EQ("kv_connector_extra_config.gpu_bus_id: value \"card0\": must "
              "be empty or a PCI bus id \"dddd:bb:dd.f\" or \"bb:dd.f\" "
              "(hex; device <= 1f, function <= 7)",
              std::string(kvc_last_error()));
}

// The path limit is the field's buffer: 255 characters fit, 256 do not.
TEST_F(ConfigParse, HwlocTopologyLengthLimit)
{
    const std::string fits(255, 'p'), over(256, 'p');

    ASSERT_EQ(KVX_OK, Parse(Extra("\"hwloc_topology\":\"" + fits + "\"")))
        << kvc_last_error();
    EXPECT_EQ(fits, cfg_.hwloc_topology);
    EXPECT_EQ(KVX_ERR_CONFIG,
              Parse(Extra("\"hwloc_topology\":\"" + over + "\"")));
    std::string err = kvc_last_error();
    EXPECT_TRUE(Contains(err, "kv_connector_extra_config.hwloc_topology"))
        << err;
    EXPECT_TRUE(Contains(err, "must be shorter than 256 characters")) << err;
}

struct BusIdCase {
    const char *text;
    int         rc;
    unsigned    domain, bus, dev, func;
};

TEST(ConfigBusId, ParsesBothFormsAndRejectsTheRest)
{
    const BusIdCase cases[] = {
        {"0000:c1:00.0", 0, 0x0000, 0xc1, 0x00, 0},
        {"abcd:EF:1f.7", 0, 0xabcd, 0xef, 0x1f, 7},
        {"83:02.1", 0, 0, 0x83, 0x02, 1},
        {"ffff:ff:1f.7", 0, 0xffff, 0xff, 0x1f, 7},
        {"", -1, 0, 0, 0, 0},
        {"0000:c1:00.0\n", -1, 0, 0, 0, 0},
        {" 83:02.1", -1, 0, 0, 0, 0},
        {"0000:c1:20.0", -1, 0, 0, 0, 0},
        {"0000:c1:00.8", -1, 0, 0, 0, 0},
        {"0000-c1:00.0", -1, 0, 0, 0, 0},
        {"0000:c1.00.0", -1, 0, 0, 0, 0},
        {"000:c1:00.0", -1, 0, 0, 0, 0},
        {"0000:c1:00.00", -1, 0, 0, 0, 0},
        {"+000:c1:00.0", -1, 0, 0, 0, 0},
        {"0x00:c1:00.0", -1, 0, 0, 0, 0},
    };

    for (const BusIdCase &c : cases) {
        unsigned d = 99, b = 99, v = 99, f = 99;

        ASSERT_EQ(c.rc, kvc_busid_parse(c.text, &d, &b, &v, &f))
            << "'" << c.text << "'";
        if (c.rc == 0) {
            EXPECT_EQ(c.domain, d) << c.text;
            EXPECT_EQ(c.bus, b) << c.text;
            EXPECT_EQ(c.dev, v) << c.text;
            EXPECT_EQ(c.func, f) << c.text;
        }
    }
    EXPECT_EQ(-1, kvc_busid_parse(nullptr, nullptr, nullptr, nullptr,
                                         nullptr));
    EXPECT_EQ(0, kvc_busid_parse("01:00.0", nullptr, nullptr, nullptr,
                                        nullptr));
}

} // namespace

// progress_caller "auto" drives waits only where ucx_tls keeps the data
// plane inside the host (measured faster on shared memory, mixed on tcp:
// perf/README.md, "The lease without its timer").
TEST(ConfigTls, LocalOnlyListsAreThoseOfHostTransports)
{
    EXPECT_EQ(1, kvc_tls_local_only("sm"));
    EXPECT_EQ(1, kvc_tls_local_only("sm,self"));
    EXPECT_EQ(1, kvc_tls_local_only("sysv,cma,rocm_ipc,rocm_copy"));
    EXPECT_EQ(1, kvc_tls_local_only("\\sm,self:aux"));  // UCX's two forms
    EXPECT_EQ(0, kvc_tls_local_only("tcp:aux,sm"));
    EXPECT_EQ(0, kvc_tls_local_only(" sm"));   // UCX compares names exactly
    EXPECT_EQ(0, kvc_tls_local_only("SM"));
    EXPECT_EQ(1, kvc_tls_local_only("posix,self,cuda_ipc"));
    EXPECT_EQ(0, kvc_tls_local_only(""));     // UCX's default: every lane
    EXPECT_EQ(0, kvc_tls_local_only("all"));
    EXPECT_EQ(0, kvc_tls_local_only("tcp"));
    EXPECT_EQ(0, kvc_tls_local_only("sm,tcp"));
    EXPECT_EQ(0, kvc_tls_local_only("rc,sm,self"));
    EXPECT_EQ(0, kvc_tls_local_only("rc_verbs"));
    EXPECT_EQ(0, kvc_tls_local_only("^tcp"));  // everything but tcp
    EXPECT_EQ(0, kvc_tls_local_only("sm,"));   // an empty entry
    EXPECT_EQ(0, kvc_tls_local_only(",sm"));
    EXPECT_EQ(0, kvc_tls_local_only("smx"));
    EXPECT_EQ(0, kvc_tls_local_only(nullptr));
}

// The one name rule behind kvc_tls_local_only and the data plane's
// feature choice (kvu_rma_wanted): an entry of n bytes, not NUL-ended.
TEST(ConfigTls, NameRuleIsUcxs)
{
    const char *list = "tcp,sm";

    EXPECT_EQ(1, kvc_tl_is(list, 3, "tcp"));      // the entry, not the list
    EXPECT_EQ(0, kvc_tl_is(list, 6, "tcp"));
    EXPECT_EQ(1, kvc_tl_is(list + 4, 2, "sm"));
    EXPECT_EQ(0, kvc_tl_is(list, 2, "tcp"));      // a prefix is no name
    EXPECT_EQ(1, kvc_tl_is("\\tcp", 4, "tcp"));    // that name only
    EXPECT_EQ(1, kvc_tl_is("tcp:aux", 7, "tcp"));  // auxiliary use
    EXPECT_EQ(1, kvc_tl_is("\\tcp:aux", 8, "tcp"));
    EXPECT_EQ(0, kvc_tl_is(":aux", 4, "aux"));     // nothing before :aux
    EXPECT_EQ(0, kvc_tl_is("\\", 1, "tcp"));
    EXPECT_EQ(0, kvc_tl_is("", 0, "tcp"));         // an empty entry
    EXPECT_EQ(0, kvc_tl_is("TCP", 3, "tcp"));      // no case folding
    EXPECT_EQ(0, kvc_tl_is(" tcp", 4, "tcp"));     // no trimming
}

TEST(ConfigTls, ProgressCallerOnFollowsTheSettingAndTheLanes)
{
    kvc_config_t c;

    memset(&c, 0, sizeof(c));
    c.progress_caller = KVC_PROGRESS_CALLER_AUTO;
    snprintf(c.ucx_tls, sizeof(c.ucx_tls), "sm");
    EXPECT_EQ(1, kvc_progress_caller_on(&c, nullptr));
    EXPECT_EQ(1, kvc_progress_caller_on(&c, "tcp")); // ucx_tls wins
    snprintf(c.ucx_tls, sizeof(c.ucx_tls), "tcp");
    EXPECT_EQ(0, kvc_progress_caller_on(&c, "sm"));
    c.ucx_tls[0] = '\0'; // the environment's UCX_TLS is in force
    EXPECT_EQ(0, kvc_progress_caller_on(&c, nullptr));
    EXPECT_EQ(1, kvc_progress_caller_on(&c, "sm,self"));
    EXPECT_EQ(0, kvc_progress_caller_on(&c, "sm,tcp"));
    c.progress_caller = 1;
    EXPECT_EQ(1, kvc_progress_caller_on(&c, nullptr));
    c.progress_caller = 0;
    snprintf(c.ucx_tls, sizeof(c.ucx_tls), "sm");
    EXPECT_EQ(0, kvc_progress_caller_on(&c, "sm"));
}
