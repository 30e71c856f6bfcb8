// test_addr.cc - peer addressing: zmq_address, request_id, trust, host of a
// remote rank, TP rank map and ack quorum, kv_transfer_params (SPEC §3-§4).
#include <memory>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "addr.h"
#include "error.h"
#include "siphash.h"
}

namespace {

const char kP[]   = "host:10.0.0.1,handshake:6301,notify:61005";
const char kD[]   = "host:10.0.0.2,handshake:7301,notify:7501";
const char kHex[] = "0123456789abcdef0123456789abcdef";

std::string LastError()
{
    return std::string(kvc_last_error());
}

bool ErrorHas(const char *sub)
{
    return LastError().find(sub) != std::string::npos;
}

std::string ReqId(const std::string &p, const std::string &d,
                  const std::string &tail = kHex)
{
    return "___prefill_addr_" + p + "___decode_addr_" + d + "_" + tail;
}

// ---- request_id --------------------------------------------------------

struct ReqidCase {
    const char *name;
    std::string id;
    int         want_prefill;
    bool        ok;
    const char *host;     // expected host, or error substring when !ok
    uint32_t    handshake;
    uint32_t    notify;
};

std::vector<ReqidCase> ReqidCases()
{
    const std::string v6p = "host:::1,handshake:6301,notify:61005";
    const std::string v6d = "host:fd00::5,handshake:7301,notify:7501";
    const std::string wrapped =
        "chatcmpl-" + ReqId(kP, kD) + "-0-deadbeef";
    return {
        {"PlainDecodeSide", ReqId(kP, kD), 1, true, "10.0.0.1", 6301, 61005},
        {"PlainPrefillSide", ReqId(kP, kD), 0, true, "10.0.0.2", 7301, 7501},
        {"WrappedDecodeSide", wrapped, 1, true, "10.0.0.1", 6301, 61005},
        {"WrappedPrefillSide", wrapped, 0, true, "10.0.0.2", 7301, 7501},
        {"CmplSuffixPrefillSide", "cmpl-" + ReqId(kP, kD) + "-3-0a1b2c3d", 0,
         true, "10.0.0.2", 7301, 7501},
        {"UnderscoreSuffixPrefillSide", ReqId(kP, kD) + "_x", 0, true,
         "10.0.0.2", 7301, 7501},
        {"Ipv6PrefillHost", ReqId(v6p, kD), 1, true, "::1", 6301, 61005},
        {"Ipv6PrefillHostOtherSide", ReqId(v6p, kD), 0, true, "10.0.0.2",
         7301, 7501},
        {"Ipv6DecodeHost", ReqId(kP, v6d), 0, true, "fd00::5", 7301, 7501},
        {"Ipv6DecodeHostOtherSide", ReqId(kP, v6d), 1, true, "10.0.0.1",
         6301, 61005},
        {"Ipv6BothWrapped", "chatcmpl-" + ReqId(v6p, v6d) + "-0-deadbeef", 0,
         true, "fd00::5", 7301, 7501},
        {"KeysAnyOrder",
         ReqId("notify:61005,host:p.example,handshake:6301", kD), 1, true,
         "p.example", 6301, 61005},
        {"MissingPrefillMarker",
         "___decode_addr_" + std::string(kD) + "_" + kHex, 1, false,
         "___prefill_addr_", 0, 0},
        {"MissingDecodeMarkerDecodeSide",
         "___prefill_addr_" + std::string(kP) + "_" + kHex, 1, false,
         "___decode_addr_", 0, 0},
        {"MissingDecodeMarkerPrefillSide",
         "___prefill_addr_" + std::string(kP) + "_" + kHex, 0, false,
         "___decode_addr_", 0, 0},
        {"MissingNotifyKey",
         ReqId("host:10.0.0.1,handshake:6301", kD), 1, false,
         "missing key 'notify'", 0, 0},
        {"MissingHostKey", ReqId(kP, "handshake:7301,notify:7501"), 0, false,
         "missing key 'host'", 0, 0},
        {"NonNumericPort", ReqId("host:10.0.0.1,handshake:abc,notify:5", kD),
         1, false, "abc", 0, 0},
        {"PortZero", ReqId(kP, "host:10.0.0.2,handshake:0,notify:7501"), 0,
         false, "1..65535", 0, 0},
        {"PortTooLarge",
         ReqId("host:10.0.0.1,handshake:65536,notify:5", kD), 1, false,
         "65536", 0, 0},
        {"TailOf31Hex", ReqId(kP, kD, std::string(kHex).substr(1)), 0, false,
         "32 lowercase hex", 0, 0},
        {"TailOf33Hex", ReqId(kP, kD, std::string(kHex) + "a"), 0, false,
         "32 lowercase hex", 0, 0},
        {"TailUppercaseHex", ReqId(kP, kD, "0123456789ABCDEF0123456789ABCDEF"),
         0, false, "32 lowercase hex", 0, 0},
        {"EmptyHost", ReqId("host:,handshake:6301,notify:61005", kD), 1,
         false, "host must be 1..255 characters", 0, 0},
        {"EmptyPrefillAddress", ReqId("", kD), 1, false, "':'", 0, 0},
        {"EmptyDecodeAddress", ReqId(kP, ""), 0, false, "32 lowercase hex", 0,
         0},
        {"DuplicateKey",
         ReqId("host:a,host:b,handshake:6301,notify:61005", kD), 1, false,
         "duplicate", 0, 0},
        {"EmptyId", "", 1, false, "empty", 0, 0},
    };
}

class AddrReqid : public ::testing::TestWithParam<ReqidCase> {};

TEST_P(AddrReqid, Parses)
{
    const ReqidCase &c = GetParam();
    kvc_peer_addr_t  addr;

    memset(&addr, 0x5a, sizeof(addr));
    kvx_status_t st = kvc_reqid_parse(c.id.c_str(), c.want_prefill, &addr);
    if (c.ok) {
        ASSERT_EQ(st, KVX_OK) << LastError();
        EXPECT_STREQ(addr.host, c.host);
        EXPECT_EQ(addr.handshake_port, c.handshake);
        EXPECT_EQ(addr.notify_port, c.notify);
    } else {
        EXPECT_EQ(st, KVX_ERR_INVALID_PARAM);
        EXPECT_TRUE(ErrorHas("request_id")) << LastError();
        EXPECT_TRUE(ErrorHas(c.host)) << LastError();
    }
}

INSTANTIATE_TEST_SUITE_P(Table, AddrReqid, ::testing::ValuesIn(ReqidCases()),
                         [](const ::testing::TestParamInfo<ReqidCase> &i) {
                             return std::string(i.param.name);
                         });

TEST(AddrReqidNull, NullIsAnError)
{
    kvc_peer_addr_t addr;

    EXPECT_EQ(kvc_reqid_parse(nullptr, 0, &addr), KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("request_id"));
}

// ---- zmq_address -------------------------------------------------------

TEST(AddrZmq, FormatParseRoundTrip)
{
    const kvc_peer_addr_t cases[] = {
        {"10.0.0.1", 6301, 61005},
        {"::1", 1024, 65535},
        {"fd00:1:2::5", 7000, 7001},
        {"prefill-0.cluster.local", 1, 2},
    };
    for (const kvc_peer_addr_t &a : cases) {
        char            buf[512];
        kvc_peer_addr_t back;
        int             n = kvc_zmq_addr_format(&a, buf, sizeof(buf));

        ASSERT_GT(n, 0);
        ASSERT_LT((size_t)n, sizeof(buf));
        EXPECT_EQ(std::string(buf),
                  std::string("host:") + a.host +
                      ",handshake:" + std::to_string(a.handshake_port) +
                      ",notify:" + std::to_string(a.notify_port));
        ASSERT_EQ(kvc_zmq_addr_parse(buf, (size_t)n, "zmq_address", &back),
                  KVX_OK)
            << LastError();
        EXPECT_STREQ(back.host, a.host);
        EXPECT_EQ(back.handshake_port, a.handshake_port);
        EXPECT_EQ(back.notify_port, a.notify_port);
    }
}

TEST(AddrZmq, ParsesOnlyLenBytes)
{
    const char      s[] = "host:h1,handshake:2000,notify:3000TRAILING";
    kvc_peer_addr_t a;

    ASSERT_EQ(kvc_zmq_addr_parse(s, strlen(s) - strlen("TRAILING"), "f", &a),
              KVX_OK)
        << LastError();
    EXPECT_STREQ(a.host, "h1");
    EXPECT_EQ(a.notify_port, 3000u);
}

TEST(AddrZmq, IgnoresUnknownKeys)
{
    const char      s[] = "host:h1,handshake:2000,notify:3000,extra:1";
    kvc_peer_addr_t a;

    ASSERT_EQ(kvc_zmq_addr_parse(s, strlen(s), "f", &a), KVX_OK);
    EXPECT_EQ(a.handshake_port, 2000u);
}

// Issue 15, defect 1 (reproducer tests/fuzz/corpus/params/defect1-host-nul):
// the length-taking parser took "host:\0" as host "", whose formatted
// address the same parser then rejected. A NUL anywhere in the host is
// rejected, and everything it accepts formats to an address it accepts.
TEST(AddrZmq, HostWithNulByteIsRejected)
{
    using namespace std::string_literals;
    const std::string bad[] = {
        "host:\0,handshake:2000,notify:3000"s,
        "host:h\0x,handshake:2000,notify:3000"s,
        "handshake:2000,notify:3000,host:h1\0"s,
    };
    for (const std::string &s : bad) {
        kvc_peer_addr_t a;

        EXPECT_EQ(kvc_zmq_addr_parse(s.data(), s.size(), "zmq_address", &a),
                  KVX_ERR_INVALID_PARAM);
        EXPECT_TRUE(ErrorHas("zmq_address")) << LastError();
        EXPECT_TRUE(ErrorHas("NUL byte")) << LastError();
    }
}

TEST(AddrZmq, ErrorsNameTheField)
{
    const char *bad[] = {
        "host:h1,handshake:2000",
        "host:h1,handshake:2000,notify:-1",
        "host:h1,handshake:2000,notify:3000,",
        "host:h1,handshake: 2000,notify:3000",
        "",
    };
    for (const char *s : bad) {
        kvc_peer_addr_t a;

        EXPECT_EQ(kvc_zmq_addr_parse(s, strlen(s), "registration.zmq_address",
                                     &a),
                  KVX_ERR_INVALID_PARAM)
            << s;
        EXPECT_TRUE(ErrorHas("registration.zmq_address")) << LastError();
    }
}

// ---- host of a remote rank ---------------------------------------------

struct ResolveCase {
    const char              *name;
    std::vector<std::string> hosts;
    uint32_t                 dp_size, tp_size, dp_rank, tp_rank;
    int                      index;
};

std::vector<ResolveCase> ResolveCases()
{
    const std::vector<std::string> two  = {"hostA", "hostB"};
    const std::vector<std::string> four = {"h0", "h1", "h2", "h3"};
    std::vector<ResolveCase>       v    = {
        {"Tp16Rank0", two, 1, 16, 0, 0, 0},
        {"Tp16Rank7", two, 1, 16, 0, 7, 0},
        {"Tp16Rank8", two, 1, 16, 0, 8, 1},
        {"Tp16Rank15", two, 1, 16, 0, 15, 1},
        {"Dp16Rank0", two, 16, 1, 0, 0, 0},
        {"Dp16Rank7", two, 16, 1, 7, 0, 0},
        {"Dp16Rank8", two, 16, 1, 8, 0, 1},
        {"Dp16Rank15", two, 16, 1, 15, 0, 1},
        {"Dp2Tp16Dp1Tp9", four, 2, 16, 1, 9, 3},
        {"Dp2Tp16Dp0Tp8", four, 2, 16, 0, 8, 1},
        {"Dp2Tp16Dp0Tp0", four, 2, 16, 0, 0, 0},
        {"Dp2Tp16Dp0Tp7", four, 2, 16, 0, 7, 0},
        {"Dp2Tp16Dp0Tp15", four, 2, 16, 0, 15, 1},
        {"Dp2Tp16Dp1Tp0", four, 2, 16, 1, 0, 2},
        {"Dp2Tp16Dp1Tp7", four, 2, 16, 1, 7, 2},
        {"Dp2Tp16Dp1Tp15", four, 2, 16, 1, 15, 3},
    };
    for (uint32_t dp = 0; dp < 2; dp++) {
        for (uint32_t tp = 0; tp < 8; tp++) {
            v.push_back({"", two, 2, 8, dp, tp, (int)dp});
        }
    }
    return v;
}

class AddrHostResolve : public ::testing::TestWithParam<ResolveCase> {};

TEST_P(AddrHostResolve, PicksHost)
{
    const ResolveCase &c = GetParam();
    std::vector<char *> ptrs;
    const char         *host  = nullptr;
    int                 index = -7;

    for (const std::string &h : c.hosts) {
        ptrs.push_back(const_cast<char *>(h.c_str()));
    }
    ASSERT_EQ(kvc_host_resolve("advertised", ptrs.data(), ptrs.size(),
                               c.dp_size, c.tp_size, c.dp_rank, c.tp_rank,
                               &host, &index),
              KVX_OK)
        << LastError();
    EXPECT_EQ(index, c.index);
    EXPECT_EQ(host, ptrs[(size_t)c.index]);
}

INSTANTIATE_TEST_SUITE_P(
    Table, AddrHostResolve, ::testing::ValuesIn(ResolveCases()),
    [](const ::testing::TestParamInfo<ResolveCase> &i) {
        if (i.param.name[0] != '\0') {
            return std::string(i.param.name);
        }
        return "Dp2Tp8Dp" + std::to_string(i.param.dp_rank) + "Tp" +
               std::to_string(i.param.tp_rank);
    });

TEST(AddrHostResolveAdvertised, ZeroOrOneEntryKeepsAdvertised)
{
    char        only[] = "other-host";
    char       *one[]  = {only};
    const char *adv    = "10.0.0.1";

    for (size_t n = 0; n <= 1; n++) {
        for (uint32_t dp = 0; dp < 2; dp++) {
            for (uint32_t tp = 0; tp < 16; tp++) {
                const char *host  = nullptr;
                int         index = 5;

                ASSERT_EQ(kvc_host_resolve(adv, n ? one : nullptr, n, 2, 16,
                                           dp, tp, &host, &index),
                          KVX_OK);
                EXPECT_EQ(host, adv);
                EXPECT_EQ(index, -1);
            }
        }
    }
}

TEST(AddrHostResolveErrors, WorldNotMultipleOfHosts)
{
    char        a[] = "a", b[] = "b", c[] = "c", d[] = "d";
    char       *hosts[] = {a, b, c, d};
    const char *host    = nullptr;

    EXPECT_EQ(kvc_host_resolve("adv", hosts, 4, 1, 6, 0, 0, &host, nullptr),
              KVX_ERR_CONFIG);
    EXPECT_TRUE(ErrorHas("world 6")) << LastError();
    EXPECT_TRUE(ErrorHas("4 remote_hosts")) << LastError();
    EXPECT_EQ(host, nullptr);
}

TEST(AddrHostResolveErrors, RankOutOfRangeAndZeroSizes)
{
    char        a[] = "a", b[] = "b";
    char       *hosts[] = {a, b};
    const char *host    = nullptr;

    EXPECT_EQ(kvc_host_resolve("adv", hosts, 2, 1, 16, 0, 16, &host, nullptr),
              KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("tp 16")) << LastError();
    EXPECT_EQ(kvc_host_resolve("adv", hosts, 2, 2, 8, 2, 0, &host, nullptr),
              KVX_ERR_INVALID_PARAM);
    EXPECT_EQ(kvc_host_resolve("adv", hosts, 2, 1, 0, 0, 0, &host, nullptr),
              KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("remote_tp_size 0")) << LastError();
    EXPECT_EQ(host, nullptr);
}

// ---- trust ---------------------------------------------------------------

struct TrustCase {
    const char *host;
    bool        ok;
    const char *rule; // substring of the rule when rejected
};

class Trust {
  public:
    Trust(std::vector<std::string> list, int set)
    {
        std::vector<char *> ptrs;

        for (std::string &h : list) {
            ptrs.push_back(const_cast<char *>(h.c_str()));
        }
        st_ = kvc_trust_init(&t_, ptrs.data(), ptrs.size(), set);
    }
    ~Trust() { kvc_trust_fini(&t_); }
    const kvc_trust_t *get() const { return &t_; }
    kvx_status_t       status() const { return st_; }

  private:
    kvc_trust_t  t_;
    kvx_status_t st_;
};

void CheckTrustTable(const kvc_trust_t *t, const std::vector<TrustCase> &tab)
{
    for (const TrustCase &c : tab) {
        kvx_status_t st =
            kvc_trust_check(t, c.host, "kv_transfer_params.remote_host");
        if (c.ok) {
            EXPECT_EQ(st, KVX_OK) << c.host << ": " << LastError();
            continue;
        }
        EXPECT_EQ(st, KVX_ERR_UNTRUSTED_PEER) << c.host;
        std::string prefix = std::string("peer host '") + c.host +
                             "' from kv_transfer_params.remote_host "
                             "rejected: ";
        EXPECT_EQ(LastError().compare(0, prefix.size(), prefix), 0)
            << LastError();
        EXPECT_TRUE(ErrorHas(c.rule)) << c.host << ": " << LastError();
    }
}

const std::vector<TrustCase> &SpecialCases()
{
    static const std::vector<TrustCase> v = {
        {"0.0.0.0", false, "wildcard address"},
        {"::", false, "wildcard address"},
        {"0:0:0:0:0:0:0:0", false, "wildcard address"},
        {"::ffff:0.0.0.0", false, "wildcard address"},
        {"224.0.0.1", false, "multicast address"},
        {"239.255.255.255", false, "multicast address"},
        {"ff02::1", false, "multicast address"},
        {"::ffff:224.0.0.5", false, "multicast address"},
        {"255.255.255.255", false, "broadcast address"},
        {"", false, "empty host"},
        {"[::1]", false, "malformed host name"},
        {"bad_host", false, "malformed host name"},
        {"-lead.example", false, "malformed host name"},
        {"trail-.example", false, "malformed host name"},
        {"a..b", false, "malformed host name"},
        {"a.b.", false, "malformed host name"},
        {"10.1", false, "malformed host name"},
        {"0", false, "malformed host name"},
        {"0x7f.1", false, "malformed host name"},
        {"host:6301", false, "malformed host name"},
        {"host name", false, "malformed host name"},
    };
    return v;
}

TEST(AddrTrust, AllowListMatches)
{
    Trust t({"prefill-a.example.com", "Node7", "10.1.0.0/16", "192.168.1.7",
             "172.16.0.0/12", "::1", "fd00::/8", "2001:db8::/33"},
            1);
    ASSERT_EQ(t.status(), KVX_OK) << LastError();
    CheckTrustTable(
        t.get(),
        {
            {"prefill-a.example.com", true, ""},
            {"PREFILL-A.Example.COM", true, ""},
            {"node7", true, ""},
            {"prefill-b.example.com", false, "not in trusted_remote_hosts"},
            {"prefill-a.example", false, "not in trusted_remote_hosts"},
            {"10.1.0.0", true, ""},
            {"10.1.255.255", true, ""},
            {"10.0.255.255", false, "not in trusted_remote_hosts"},
            {"10.2.0.0", false, "not in trusted_remote_hosts"},
            {"172.16.0.0", true, ""},
            {"172.31.255.255", true, ""},
            {"172.15.255.255", false, "not in trusted_remote_hosts"},
            {"172.32.0.0", false, "not in trusted_remote_hosts"},
            {"192.168.1.7", true, ""},
            {"192.168.1.8", false, "not in trusted_remote_hosts"},
            {"::1", true, ""},
            {"0:0:0:0:0:0:0:1", true, ""},
            {"0::1", true, ""},
            {"::2", false, "not in trusted_remote_hosts"},
            // IPv4-mapped: the IPv4 peer a dual-stack listener sees.
            {"::ffff:10.1.0.1", true, ""},
            {"::ffff:10.2.0.1", false, "not in trusted_remote_hosts"},
            {"fd00::5", true, ""},
            {"fdff:ffff::1", true, ""},
            {"fc00::1", false, "not in trusted_remote_hosts"},
            {"fe00::1", false, "not in trusted_remote_hosts"},
            {"2001:db8::1", true, ""},
            {"2001:db8:7fff:ffff::1", true, ""},
            {"2001:db8:8000::", false, "not in trusted_remote_hosts"},
            {"2001:db9::", false, "not in trusted_remote_hosts"},
        });
    CheckTrustTable(t.get(), SpecialCases());
}

TEST(AddrTrust, SpecialAddressesRejectedEvenWhenListedOrUnset)
{
    Trust all({"0.0.0.0/0", "::/0", "0.0.0.0", "255.255.255.255"}, 1);
    Trust unset({"ignored"}, 0);

    ASSERT_EQ(all.status(), KVX_OK) << LastError();
    ASSERT_EQ(unset.status(), KVX_OK);
    EXPECT_EQ(unset.get()->set, 0);
    for (const kvc_trust_t *t : {all.get(), unset.get(),
                                 (const kvc_trust_t *)nullptr}) {
        CheckTrustTable(t, SpecialCases());
        CheckTrustTable(t, {{"10.9.9.9", true, ""},
                            {"2001:db8::1", true, ""},
                            {"::1", true, ""},
                            {"127.0.0.1", true, ""}});
    }
    CheckTrustTable(unset.get(), {{"anything.example", true, ""},
                                  {"UPPER-case.Name", true, ""}});
}

TEST(AddrTrust, NameLengthLimits)
{
    Trust       unset({}, 0);
    std::string label63(63, 'a'), label64(64, 'a');
    std::string name253 = label63 + "." + label63 + "." + label63 + "." +
                          std::string(61, 'b');
    std::string name254 = name253 + "c";

    ASSERT_EQ(name253.size(), 253u);
    EXPECT_EQ(kvc_trust_check(unset.get(), label63.c_str(), "f"), KVX_OK);
    EXPECT_EQ(kvc_trust_check(unset.get(), name253.c_str(), "f"), KVX_OK);
    EXPECT_EQ(kvc_trust_check(unset.get(), label64.c_str(), "f"),
              KVX_ERR_UNTRUSTED_PEER);
    EXPECT_TRUE(ErrorHas("malformed host name"));
    EXPECT_EQ(kvc_trust_check(unset.get(), name254.c_str(), "f"),
              KVX_ERR_UNTRUSTED_PEER);
    EXPECT_TRUE(ErrorHas("longer than 253"));
}

TEST(AddrTrust, EmptyListRejectsEverything)
{
    Trust t({}, 1);

    ASSERT_EQ(t.status(), KVX_OK);
    CheckTrustTable(t.get(),
                    {{"10.0.0.1", false, "not in trusted_remote_hosts"},
                     {"localhost", false, "not in trusted_remote_hosts"}});
}

TEST(AddrTrust, ErrorNamesEverySourceField)
{
    Trust       t({"10.0.0.1"}, 1);
    const char *fields[] = {
        "kv_transfer_params.remote_host", "kv_transfer_params.remote_hosts[1]",
        "request_id", "registration.zmq_address",
        "remote_blocks.decode_host",
    };
    for (const char *f : fields) {
        EXPECT_EQ(kvc_trust_check(t.get(), "10.6.6.6", f),
                  KVX_ERR_UNTRUSTED_PEER);
        EXPECT_EQ(LastError(), std::string("peer host '10.6.6.6' from ") + f +
                                   " rejected: not in trusted_remote_hosts");
        EXPECT_EQ(kvc_trust_check(t.get(), "224.1.1.1", f),
                  KVX_ERR_UNTRUSTED_PEER);
        EXPECT_EQ(LastError(), std::string("peer host '224.1.1.1' from ") +
                                   f + " rejected: multicast address");
    }
}

TEST(AddrTrust, MalformedEntriesAreConfigErrors)
{
    struct {
        std::vector<std::string> list;
        const char              *index;
        const char              *rule;
    } cases[] = {
        {{"10.0.0.1", "10.0.0.0/33"}, "trusted_remote_hosts[1]", "prefix"},
        {{"fd00::/129"}, "trusted_remote_hosts[0]", "prefix"},
        {{"10.0.0.0/"}, "trusted_remote_hosts[0]", "prefix"},
        {{"10.0.0.0/8x"}, "trusted_remote_hosts[0]", "prefix"},
        {{"10.0.0/8"}, "trusted_remote_hosts[0]", "CIDR address"},
        {{"name/8"}, "trusted_remote_hosts[0]", "CIDR address"},
        {{"a", "b", ""}, "trusted_remote_hosts[2]", "empty"},
        {{"bad host"}, "trusted_remote_hosts[0]", "malformed host name"},
    };
    for (auto &c : cases) {
        Trust t(c.list, 1);

        EXPECT_EQ(t.status(), KVX_ERR_CONFIG) << c.index;
        EXPECT_TRUE(ErrorHas(c.index)) << LastError();
        EXPECT_TRUE(ErrorHas(c.rule)) << LastError();
        EXPECT_EQ(t.get()->entries, nullptr);
        EXPECT_EQ(t.get()->set, 0);
    }
}

TEST(AddrTrust, FiniOfZeroedIsNoop)
{
    kvc_trust_t t;

    memset(&t, 0, sizeof(t));
    kvc_trust_fini(&t);
    kvc_trust_fini(&t);
    EXPECT_EQ(t.entries, nullptr);
}

TEST(AddrPort, Range)
{
    struct {
        uint64_t port;
        bool     ok;
    } cases[] = {{0, false},    {1023, false},  {1024, true},
                 {65535, true}, {65536, false}, {UINT64_MAX, false}};
    for (auto &c : cases) {
        kvx_status_t st =
            kvc_port_check(c.port, "kv_transfer_params.remote_notify_port");
        if (c.ok) {
            EXPECT_EQ(st, KVX_OK) << c.port;
            continue;
        }
        EXPECT_EQ(st, KVX_ERR_UNTRUSTED_PEER) << c.port;
        EXPECT_EQ(LastError(),
                  "kv_transfer_params.remote_notify_port: port " +
                      std::to_string(c.port) + ": must be in 1024..65535");
    }
}

// ---- TP rank map and ack quorum ------------------------------------------

std::vector<uint32_t> Reads(uint32_t d_tp, uint32_t p_tp)
{
    std::vector<uint32_t> v;

    for (uint32_t d = 0; d < d_tp; d++) {
        kvc_rankmap_t m;

        EXPECT_EQ(kvc_rankmap(d_tp, p_tp, 1, d, &m), KVX_OK) << LastError();
        v.push_back(m.read_rank);
    }
    return v;
}

std::vector<uint32_t> Quorums(uint32_t d_tp, uint32_t p_tp, int replicated)
{
    std::vector<uint32_t> v;

    for (uint32_t p = 0; p < p_tp; p++) {
        uint32_t q = 999;

        EXPECT_EQ(kvc_ack_quorum(d_tp, p_tp, replicated, p, &q), KVX_OK)
            << LastError();
        v.push_back(q);
    }
    return v;
}

TEST(AddrRankmap, EqualTpIsIdentity)
{
    for (uint32_t tp : {1u, 2u, 8u, 16u}) {
        for (int replicated = 0; replicated <= 1; replicated++) {
            for (uint32_t d = 0; d < tp; d++) {
                kvc_rankmap_t m;

                ASSERT_EQ(kvc_rankmap(tp, tp, replicated, d, &m), KVX_OK);
                EXPECT_EQ(m.read_rank, d);
                EXPECT_EQ(m.num_release, 1u);
                EXPECT_EQ(m.release[0], d);
                EXPECT_EQ(m.num_slices, 1u);
                EXPECT_EQ(m.head_slice, 0u);
            }
            EXPECT_EQ(Quorums(tp, tp, replicated),
                      std::vector<uint32_t>(tp, 1u));
        }
    }
}

TEST(AddrRankmap, D8P4Replicated)
{
    EXPECT_EQ(Reads(8, 4), (std::vector<uint32_t>{0, 0, 1, 1, 2, 2, 3, 3}));
    for (uint32_t d = 0; d < 8; d++) {
        kvc_rankmap_t m;

        ASSERT_EQ(kvc_rankmap(8, 4, 1, d, &m), KVX_OK);
        EXPECT_EQ(m.num_release, 1u);
        EXPECT_EQ(m.release[0], d / 2);
    }
    EXPECT_EQ(Quorums(8, 4, 1), (std::vector<uint32_t>{2, 2, 2, 2}));
}

TEST(AddrRankmap, D4P8Replicated)
{
    EXPECT_EQ(Reads(4, 8), (std::vector<uint32_t>{0, 2, 4, 6}));
    for (uint32_t d = 0; d < 4; d++) {
        kvc_rankmap_t m;

        ASSERT_EQ(kvc_rankmap(4, 8, 1, d, &m), KVX_OK);
        ASSERT_EQ(m.num_release, 2u);
        EXPECT_EQ(m.release[0], 2 * d);
        EXPECT_EQ(m.release[1], 2 * d + 1);
    }
    // Every P rank, including the ones nobody reads, gets one release.
    EXPECT_EQ(Quorums(4, 8, 1), std::vector<uint32_t>(8, 1u));
}

TEST(AddrRankmap, QuorumAgreesWithReleaseSets)
{
    const uint32_t pairs[][2] = {{1, 8}, {2, 16}, {16, 2}, {8, 1}, {4, 4},
                                 {2, 8}, {16, 4}};
    for (const auto &pr : pairs) {
        uint32_t              d_tp = pr[0], p_tp = pr[1];
        std::vector<uint32_t> count(p_tp, 0);

        for (uint32_t d = 0; d < d_tp; d++) {
            kvc_rankmap_t m;

            ASSERT_EQ(kvc_rankmap(d_tp, p_tp, 1, d, &m), KVX_OK);
            EXPECT_LT(m.read_rank, p_tp);
            for (uint32_t k = 0; k < m.num_release; k++) {
                count[m.release[k]]++;
            }
        }
        std::vector<uint32_t> q = Quorums(d_tp, p_tp, 1);
        EXPECT_EQ(q, count) << d_tp << "/" << p_tp;
        for (uint32_t x : q) {
            EXPECT_GE(x, 1u) << d_tp << "/" << p_tp;
        }
    }
}

TEST(AddrRankmap, Errors)
{
    kvc_rankmap_t m;
    uint32_t      q = 77;

    EXPECT_EQ(kvc_rankmap(6, 4, 1, 0, &m), KVX_ERR_CONFIG);
    EXPECT_TRUE(ErrorHas("multiple")) << LastError();
    EXPECT_EQ(kvc_rankmap(3, 2, 1, 0, &m), KVX_ERR_CONFIG);
    EXPECT_EQ(kvc_ack_quorum(6, 4, 1, 0, &q), KVX_ERR_CONFIG);
    EXPECT_EQ(kvc_rankmap(8, 8, 1, 8, &m), KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("tp_rank 8")) << LastError();
    EXPECT_EQ(kvc_ack_quorum(8, 8, 1, 8, &q), KVX_ERR_INVALID_PARAM);
    EXPECT_EQ(kvc_rankmap(0, 8, 1, 0, &m), KVX_ERR_INVALID_PARAM);
    EXPECT_EQ(kvc_ack_quorum(0, 8, 1, 0, &q), KVX_ERR_INVALID_PARAM);
    EXPECT_EQ(q, 77u);
}

// Sharded heads, D tp > P tp: D rank d reads head slice d % q of P rank d / q
// and releases it, so each P rank's quorum is q (SPEC §4).
TEST(AddrRankmap, ShardedHeadsDecodeWiderReadsHeadSlices)
{
    struct Row {
        uint32_t d_tp, p_tp, d, read, slice, nslices;
    } rows[] = {
        {2, 1, 0, 0, 0, 2}, {2, 1, 1, 0, 1, 2}, {8, 4, 0, 0, 0, 2},
        {8, 4, 5, 2, 1, 2}, {8, 2, 7, 1, 3, 4}, {16, 2, 9, 1, 1, 8},
        {4, 4, 3, 3, 0, 1}, // equal TP: no slicing
    };
    for (const Row &r : rows) {
        kvc_rankmap_t m;
        SCOPED_TRACE(std::to_string(r.d_tp) + "/" + std::to_string(r.p_tp) +
                     " d" + std::to_string(r.d));
        ASSERT_EQ(KVX_OK, kvc_rankmap(r.d_tp, r.p_tp, 0, r.d, &m))
            << LastError();
        EXPECT_EQ(r.read, m.read_rank);
        EXPECT_EQ(r.slice, m.head_slice);
        EXPECT_EQ(r.nslices, m.num_slices);
        ASSERT_EQ(1u, m.num_release);
        EXPECT_EQ(r.read, m.release[0]);
        uint32_t q = 0;
        ASSERT_EQ(KVX_OK, kvc_ack_quorum(r.d_tp, r.p_tp, 0, r.read, &q));
        EXPECT_EQ(r.d_tp / r.p_tp, q);
    }
    // Replicated heads never slice.
    kvc_rankmap_t m;
    ASSERT_EQ(KVX_OK, kvc_rankmap(8, 2, 1, 7, &m));
    EXPECT_EQ(1u, m.num_slices);
    EXPECT_EQ(0u, m.head_slice);
    EXPECT_EQ(0u, m.gather);
}

// Sharded heads, D tp < P tp: D rank d gathers part k of its heads from P
// rank d*r + k and releases all r; each P rank's quorum is 1.
TEST(AddrRankmap, ShardedHeadsDecodeNarrowerGathersFromEveryPart)
{
    for (uint32_t p_tp : {4u, 8u, 32u}) {
        for (uint32_t d = 0; d < 2; d++) {
            kvc_rankmap_t m;
            uint32_t      r = p_tp / 2;
            ASSERT_EQ(KVX_OK, kvc_rankmap(2, p_tp, 0, d, &m)) << LastError();
            EXPECT_EQ(1u, m.gather);
            EXPECT_EQ(r, m.num_slices);
            EXPECT_EQ(d * r, m.read_rank);
            ASSERT_EQ(r, m.num_release);
            for (uint32_t k = 0; k < r; k++) {
                EXPECT_EQ(d * r + k, m.release[k]);
                uint32_t q = 0;
                ASSERT_EQ(KVX_OK, kvc_ack_quorum(2, p_tp, 0, d * r + k, &q));
                EXPECT_EQ(1u, q);
            }
        }
    }
    kvc_rankmap_t m;
    ASSERT_EQ(KVX_OK, kvc_rankmap(2, 8, 1, 1, &m)); // replicated: no gather
    EXPECT_EQ(0u, m.gather);
    EXPECT_EQ(1u, m.num_slices);
}

// ---- kv_transfer_params ----------------------------------------------------

class Params {
  public:
    explicit Params(const char *json) { st_ = kvc_params_parse(json, &p_); }
    ~Params() { kvc_params_fini(&p_); }
    const kvc_xfer_params_t &operator*() const { return p_; }
    const kvc_xfer_params_t *operator->() const { return &p_; }
    kvx_status_t             status() const { return st_; }

  private:
    kvc_xfer_params_t p_;
    kvx_status_t      st_;
};

TEST(AddrParams, FullParse)
{
    Params p(R"({"transfer_id": "tx-1234", "remote_host": "10.0.0.1",
        "remote_handshake_port": 6301, "remote_notify_port": 61005,
        "remote_hosts": ["10.0.0.1", "10.0.0.2"],
        "remote_block_ids": [3, 1, 4, 0], "remote_engine_id": "10.0.0.1:6301",
        "remote_tp_size": 8, "tp_size": 4, "remote_dp_size": 2,
        "remote_dp_rank": 1, "do_remote_prefill": true,
        "remote_instance": "18446744073709551615", "remote_tp_rank": 3,
        "remote_accepted": "7357584953551276031", "remote_hold_ms": 60000,
        "do_remote_decode": false, "unknown_field": {"x": [1]}})");

    ASSERT_EQ(p.status(), KVX_OK) << LastError();
    EXPECT_STREQ(p->transfer_id, "tx-1234");
    EXPECT_EQ(p->has_remote_addr, 1);
    EXPECT_STREQ(p->remote.host, "10.0.0.1");
    EXPECT_EQ(p->remote.handshake_port, 6301u);
    EXPECT_EQ(p->remote.notify_port, 61005u);
    ASSERT_EQ(p->num_remote_hosts, 2u);
    EXPECT_STREQ(p->remote_hosts[0], "10.0.0.1");
    EXPECT_STREQ(p->remote_hosts[1], "10.0.0.2");
    EXPECT_EQ(p->has_remote_block_ids, 1);
    ASSERT_EQ(p->num_remote_block_ids, 4u);
    EXPECT_EQ(std::vector<uint64_t>(p->remote_block_ids,
                                    p->remote_block_ids + 4),
              (std::vector<uint64_t>{3, 1, 4, 0}));
    EXPECT_STREQ(p->remote_engine_id, "10.0.0.1:6301");
    EXPECT_EQ(p->remote_tp_size, 8u);
    EXPECT_EQ(p->remote_dp_size, 2u);
    EXPECT_EQ(p->remote_dp_rank, 1u);
    EXPECT_EQ(p->has_remote_instance, 1);
    EXPECT_EQ(p->remote_instance, UINT64_MAX);
    EXPECT_EQ(p->remote_tp_rank, 3u);
    EXPECT_EQ(p->has_remote_accepted, 1);
    EXPECT_EQ(p->remote_accepted, 7357584953551276031ull);
    EXPECT_EQ(p->remote_hold_ms, 60000u);
    EXPECT_EQ(p->do_remote_prefill, 1);
    EXPECT_EQ(p->do_remote_decode, 0);
}

TEST(AddrParams, DefaultsAndNulls)
{
    for (const char *json :
         {(const char *)nullptr, "", "null", "{}",
          R"({"transfer_id": null, "remote_host": null,
              "remote_handshake_port": null, "remote_notify_port": null,
              "remote_hosts": null, "remote_block_ids": null,
              "remote_engine_id": null, "remote_tp_size": null,
              "tp_size": null, "remote_dp_size": null,
              "remote_dp_rank": null, "do_remote_prefill": null,
              "do_remote_decode": null})"}) {
        Params p(json);

        ASSERT_EQ(p.status(), KVX_OK) << (json ? json : "NULL");
        EXPECT_STREQ(p->transfer_id, "");
        EXPECT_EQ(p->has_remote_addr, 0);
        EXPECT_EQ(p->num_remote_hosts, 0u);
        EXPECT_EQ(p->has_remote_block_ids, 0);
        EXPECT_EQ(p->remote_block_ids, nullptr);
        EXPECT_STREQ(p->remote_engine_id, "");
        EXPECT_EQ(p->remote_tp_size, 0u);
        EXPECT_EQ(p->remote_dp_size, 0u);
        EXPECT_EQ(p->do_remote_prefill, 0);
        EXPECT_EQ(p->do_remote_decode, 0);
    }
}

TEST(AddrParams, TpSizeFallbackStringPortsCommaHosts)
{
    Params p(R"({"tp_size": 4, "remote_host": "fd00::5",
        "remote_handshake_port": "7301", "remote_notify_port": "7501",
        "remote_hosts": " a.example , b.example,,c.example ",
        "remote_block_ids": []})");

    ASSERT_EQ(p.status(), KVX_OK) << LastError();
    EXPECT_EQ(p->remote_tp_size, 4u);
    EXPECT_EQ(p->has_remote_addr, 1);
    EXPECT_EQ(p->remote.handshake_port, 7301u);
    EXPECT_EQ(p->remote.notify_port, 7501u);
    ASSERT_EQ(p->num_remote_hosts, 3u);
    EXPECT_STREQ(p->remote_hosts[0], "a.example");
    EXPECT_STREQ(p->remote_hosts[1], "b.example");
    EXPECT_STREQ(p->remote_hosts[2], "c.example");
    EXPECT_EQ(p->has_remote_block_ids, 1);
    EXPECT_EQ(p->num_remote_block_ids, 0u);
}

TEST(AddrParams, RemoteTpSizeZeroFallsBack)
{
    Params p(R"({"remote_tp_size": 0, "tp_size": 2})");

    ASSERT_EQ(p.status(), KVX_OK);
    EXPECT_EQ(p->remote_tp_size, 2u);
}

struct ParamsErrCase {
    const char  *json;
    kvx_status_t status;
    const char  *field; // must appear in the error text
    const char  *value; // must appear too
};

TEST(AddrParams, WrongTypesNameTheField)
{
    const ParamsErrCase cases[] = {
        {R"({"transfer_id": 5})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.transfer_id", "5"},
        {R"({"remote_host": ["h"]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_host", "[\"h\"]"},
        {R"({"remote_handshake_port": "abc"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_handshake_port", "abc"},
        {R"({"remote_handshake_port": "63 01"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_handshake_port", "63 01"},
        {R"({"remote_handshake_port": 6301.5})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_handshake_port", "6301.5"},
        {R"({"remote_notify_port": true})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_notify_port", "true"},
        {R"({"remote_notify_port": ""})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_notify_port", "\"\""},
        {R"({"remote_hosts": 5})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hosts", "5"},
        {R"({"remote_hosts": ["a", 1]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hosts[1]", "1"},
        {R"({"remote_block_ids": "1,2"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_block_ids", "1,2"},
        {R"({"remote_block_ids": [0, 1, 2, -1]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_block_ids[3]", "-1"},
        {R"({"remote_block_ids": [1.5]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_block_ids[0]", "1.5"},
        {R"({"remote_block_ids": ["7"]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_block_ids[0]", "7"},
        {R"({"remote_engine_id": 3})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_engine_id", "3"},
        {R"({"remote_tp_size": "8"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_tp_size", "8"},
        {R"({"remote_tp_size": -1})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_tp_size", "-1"},
        {R"({"tp_size": 4294967296})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.tp_size", "4294967296"},
        {R"({"remote_dp_size": 1.0})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_dp_size", "1"},
        {R"({"remote_dp_rank": "0"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_dp_rank", "0"},
        {R"({"remote_instance": 12})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_instance", "12"},
        {R"({"remote_instance": "0"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_instance", "'0'"},
        {R"({"remote_instance": "18446744073709551616"})",
         KVX_ERR_INVALID_PARAM, "kv_transfer_params.remote_instance",
         "18446744073709551616"},
        {R"({"remote_instance": "12x"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_instance", "12x"},
        {R"({"remote_accepted": 5})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_accepted", "5"},
        {R"({"remote_accepted": "-5"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_accepted", "-5"},
        {R"({"remote_hold_ms": -1})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hold_ms", "-1"},
        {R"({"remote_hold_ms": 4294967296})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hold_ms", "4294967296"},
        {R"({"remote_tp_rank": -1})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_tp_rank", "-1"},
        {R"({"do_remote_prefill": "true"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.do_remote_prefill", "true"},
        {R"({"do_remote_decode": 1})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.do_remote_decode", "1"},
        {R"({"remote_handshake_port": 80})", KVX_ERR_UNTRUSTED_PEER,
         "kv_transfer_params.remote_handshake_port", "port 80"},
        {R"({"remote_handshake_port": "70000"})", KVX_ERR_UNTRUSTED_PEER,
         "kv_transfer_params.remote_handshake_port", "port 70000"},
        {R"({"remote_notify_port": -5})", KVX_ERR_UNTRUSTED_PEER,
         "kv_transfer_params.remote_notify_port", "port -5"},
        {R"({"remote_notify_port": 0})", KVX_ERR_UNTRUSTED_PEER,
         "kv_transfer_params.remote_notify_port", "port 0"},
        {R"({"transfer_id": )", KVX_ERR_INVALID_PARAM, "kv_transfer_params",
         "invalid JSON"},
        // a NUL would end the text where it is used: refused, not cut
        {R"({"transfer_id": "a\u0000b"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.transfer_id", "NUL character"},
        // control messages carry it as printable ASCII: a peer would
        // refuse every message of the transfer, which ended at a timeout
        {R"({"transfer_id": "tx-\u00e9\t1"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.transfer_id", "byte 0xc3 at offset 3"},
        {R"({"transfer_id": "tx\t1"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.transfer_id", "printable ASCII"},
        {R"({"remote_handshake_port": "7000\u0000"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_handshake_port", "at offset 4"},
        {R"({"remote_hosts": "a\u0000,b"})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hosts", "NUL character"},
        {R"({"remote_hosts": ["a", "\u0000"]})", KVX_ERR_INVALID_PARAM,
         "kv_transfer_params.remote_hosts[1]", "NUL character"},
        {R"([1, 2])", KVX_ERR_INVALID_PARAM, "kv_transfer_params",
         "JSON object"},
    };
    for (const ParamsErrCase &c : cases) {
        Params p(c.json);

        EXPECT_EQ(p.status(), c.status) << c.json;
        EXPECT_TRUE(ErrorHas(c.field)) << c.json << " -> " << LastError();
        EXPECT_TRUE(ErrorHas(c.value)) << c.json << " -> " << LastError();
        // Nothing to free after an error.
        EXPECT_EQ(p->remote_hosts, nullptr);
        EXPECT_EQ(p->remote_block_ids, nullptr);
    }
}

TEST(AddrParams, ErrorAfterListsLeavesNothing)
{
    Params p(R"({"remote_hosts": ["a", "b"], "remote_block_ids": [1, 2],
        "do_remote_decode": "yes"})");

    EXPECT_EQ(p.status(), KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("do_remote_decode"));
    EXPECT_EQ(p->remote_hosts, nullptr);
    EXPECT_EQ(p->num_remote_hosts, 0u);
    EXPECT_EQ(p->remote_block_ids, nullptr);
}

TEST(AddrParams, PeerAddrExplicitWins)
{
    Params          p(R"({"remote_host": "10.9.9.9",
        "remote_handshake_port": 2000, "remote_notify_port": 3000})");
    kvc_peer_addr_t a;
    const char     *field = nullptr;
    std::string     id    = ReqId(kP, kD);

    ASSERT_EQ(p.status(), KVX_OK) << LastError();
    for (int want_prefill = 0; want_prefill <= 1; want_prefill++) {
        ASSERT_EQ(kvc_params_peer_addr(&*p, id.c_str(), want_prefill, &a,
                                       &field),
                  KVX_OK);
        EXPECT_STREQ(field, "remote_host");
        EXPECT_STREQ(a.host, "10.9.9.9");
        EXPECT_EQ(a.handshake_port, 2000u);
        EXPECT_EQ(a.notify_port, 3000u);
    }
    // Explicit address also works without any request_id.
    ASSERT_EQ(kvc_params_peer_addr(&*p, nullptr, 1, &a, nullptr), KVX_OK);
    EXPECT_STREQ(a.host, "10.9.9.9");
}

TEST(AddrParams, PeerAddrFallsBackToRequestId)
{
    const char *partial[] = {
        R"({"remote_handshake_port": 2000, "remote_notify_port": 3000})",
        R"({"remote_host": "10.9.9.9", "remote_notify_port": 3000})",
        R"({"remote_host": "10.9.9.9", "remote_handshake_port": 2000})",
        R"({"remote_host": "10.9.9.9", "remote_handshake_port": 2000,
            "remote_notify_port": null})",
        R"({"remote_host": "", "remote_handshake_port": 2000,
            "remote_notify_port": 3000})",
        "{}",
    };
    std::string id = "chatcmpl-" + ReqId(kP, kD) + "-0-deadbeef";

    for (const char *json : partial) {
        Params          p(json);
        kvc_peer_addr_t a;
        const char     *field = nullptr;

        ASSERT_EQ(p.status(), KVX_OK) << json << LastError();
        EXPECT_EQ(p->has_remote_addr, 0) << json;
        ASSERT_EQ(kvc_params_peer_addr(&*p, id.c_str(), 1, &a, &field),
                  KVX_OK);
        EXPECT_STREQ(field, "request_id");
        EXPECT_STREQ(a.host, "10.0.0.1");
        EXPECT_EQ(a.handshake_port, 6301u);
        ASSERT_EQ(kvc_params_peer_addr(&*p, id.c_str(), 0, &a, &field),
                  KVX_OK);
        EXPECT_STREQ(a.host, "10.0.0.2");
        EXPECT_EQ(a.notify_port, 7501u);

        field = "untouched";
        EXPECT_EQ(kvc_params_peer_addr(&*p, "plain-id", 1, &a, &field),
                  KVX_ERR_INVALID_PARAM);
        EXPECT_TRUE(ErrorHas("request_id"));
        EXPECT_STREQ(field, "untouched");
    }
}

// ---- proxy helper ----------------------------------------------------------

TEST(AddrBuildDecode, RoundTrip)
{
    const char *resp = R"({"do_remote_decode": false,
        "do_remote_prefill": true, "transfer_id": "tx-from-p",
        "remote_block_ids": [7, 8, 9, 18446744073709551615],
        "remote_engine_id": "10.0.0.1:6301", "remote_host": "10.0.0.1",
        "remote_handshake_port": 6301, "remote_notify_port": "61005",
        "tp_size": 16, "remote_tp_size": 4, "remote_dp_size": 2,
        "remote_dp_rank": 1, "remote_hosts": "10.0.0.1, 10.0.0.3",
        "prefill_complete_ts": 12.5})";
    char *out = nullptr;

    ASSERT_EQ(kvc_params_build_decode(resp, "tx-proxy", &out), KVX_OK)
        << LastError();
    ASSERT_NE(out, nullptr);
    Params d(out);
    Params p(resp);
    ASSERT_EQ(d.status(), KVX_OK) << out << LastError();
    ASSERT_EQ(p.status(), KVX_OK);
    EXPECT_STREQ(d->transfer_id, "tx-proxy");
    EXPECT_EQ(d->do_remote_prefill, 1);
    EXPECT_EQ(d->do_remote_decode, 0);
    EXPECT_EQ(d->has_remote_addr, 1);
    EXPECT_STREQ(d->remote.host, p->remote.host);
    EXPECT_EQ(d->remote.handshake_port, p->remote.handshake_port);
    EXPECT_EQ(d->remote.notify_port, 61005u);
    ASSERT_EQ(d->num_remote_hosts, p->num_remote_hosts);
    for (size_t i = 0; i < d->num_remote_hosts; i++) {
        EXPECT_STREQ(d->remote_hosts[i], p->remote_hosts[i]);
    }
    ASSERT_EQ(d->num_remote_block_ids, 4u);
    EXPECT_EQ(std::vector<uint64_t>(d->remote_block_ids,
                                    d->remote_block_ids + 4),
              (std::vector<uint64_t>{7, 8, 9, UINT64_MAX}));
    EXPECT_STREQ(d->remote_engine_id, "10.0.0.1:6301");
    EXPECT_EQ(d->remote_tp_size, 16u); // P's tp_size, not the echoed one
    EXPECT_EQ(d->remote_dp_size, 2u);
    EXPECT_EQ(d->remote_dp_rank, 1u);
    EXPECT_EQ(std::string(out).find("prefill_complete_ts"),
              std::string::npos);
    free(out);
}

TEST(AddrBuildDecode, TransferIdAndOptionalFields)
{
    char *out = nullptr;

    ASSERT_EQ(kvc_params_build_decode(
                  R"({"transfer_id": "tx-p", "remote_tp_size": 4,
                      "remote_block_ids": []})",
                  nullptr, &out),
              KVX_OK);
    {
        Params d(out);

        ASSERT_EQ(d.status(), KVX_OK);
        EXPECT_STREQ(d->transfer_id, "tx-p");
        EXPECT_EQ(d->remote_tp_size, 4u);
        EXPECT_EQ(d->has_remote_block_ids, 1);
        EXPECT_EQ(d->has_remote_addr, 0);
        EXPECT_EQ(std::string(out).find("remote_dp_rank"), std::string::npos);
        EXPECT_EQ(std::string(out).find("remote_host"), std::string::npos);
    }
    free(out);
    out = nullptr;

    ASSERT_EQ(kvc_params_build_decode(R"({"remote_dp_rank": 0})", "", &out),
              KVX_OK);
    EXPECT_NE(std::string(out).find("\"remote_dp_rank\":0"),
              std::string::npos)
        << out;
    EXPECT_EQ(std::string(out).find("transfer_id"), std::string::npos);
    EXPECT_NE(std::string(out).find("\"do_remote_prefill\":true"),
              std::string::npos);
    free(out);
}

TEST(AddrBuildDecode, RejectsBadResponse)
{
    char       *out = nullptr;
    std::string long_id(KVX_ID_MAX, 'x');

    EXPECT_EQ(kvc_params_build_decode(R"({"remote_block_ids": [-2]})",
                                      "tx", &out),
              KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("remote_block_ids[0]"));
    EXPECT_EQ(kvc_params_build_decode("{", "tx", &out),
              KVX_ERR_INVALID_PARAM);
    EXPECT_EQ(kvc_params_build_decode("{}", long_id.c_str(), &out),
              KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("transfer_id"));
    EXPECT_EQ(out, nullptr);
}

} // namespace

// SipHash-2-4 against the reference vectors of its paper (key 00..0f,
// message 00..0e: 15 bytes; and the empty message).
TEST(SipHash, ReferenceVectors)
{
    uint8_t  m[15];
    uint64_t key[2] = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};

    for (int i = 0; i < 15; i++) {
        m[i] = (uint8_t)i;
    }
    EXPECT_EQ(kvc_siphash24(key, m, 15), 0xa129ca6149be45e5ull);
    EXPECT_EQ(kvc_siphash24(key, m, 0), 0x726fdb47dd0e0e31ull);
}

// A transfer id's tag (what request and notice macs cover in place of the
// id): SipHash-2-4 under the fixed public key, the same in every build of
// data-plane protocol 9 (these values are the wire's), never 0, and not
// FNV-1a, whose second preimages are cheap.
TEST(SipHash, TransferTagIsSipHashOfTheIdUnderTheFixedKey)
{
    const uint64_t key[2] = {0x6b76786665722d74ull, 0x7261672d7639a5c3ull};

    EXPECT_EQ(kvc_xfer_tag("tx-1"), 0x852bb052ac5599fcull);
    EXPECT_EQ(kvc_xfer_tag(""), 0xebdd949511236de1ull);
    EXPECT_EQ(kvc_xfer_tag("tx-1"), kvc_siphash24(key, "tx-1", 4));
    EXPECT_NE(kvc_xfer_tag("tx-1"), kvc_xfer_tag("tx-2"));
    uint64_t fnv = 0xcbf29ce484222325ull;
    for (const char *p = "tx-1"; *p; p++) {
        fnv = (fnv ^ (uint8_t)*p) * 0x100000001b3ull;
    }
    EXPECT_NE(kvc_xfer_tag("tx-1"), fnv);
}

// A data-plane control message's mac: keyed by the session, over the
// nonce and every byte, in a domain of its own (no request or notice mac
// of the same numbers passes for it), never 0, none without a session.
TEST(SipHash, MessageMacCoversNonceAndEveryByte)
{
    const uint64_t s = 0x1234abcd5678ef01ull;
    std::string    m = "{\"type\":\"remote_blocks\",\"block_ids\":[1,2]}";
    uint64_t       a = kvc_msg_mac(s, 7, m.data(), m.size());

    EXPECT_NE(a, 0u);
    EXPECT_EQ(a, kvc_msg_mac(s, 7, m.data(), m.size()));
    EXPECT_NE(a, kvc_msg_mac(s, 8, m.data(), m.size()));
    EXPECT_NE(a, kvc_msg_mac(s + 1, 7, m.data(), m.size()));
    for (size_t i = 0; i < m.size(); i++) {
        std::string t = m;
        t[i] ^= 1;
        EXPECT_NE(a, kvc_msg_mac(s, 7, t.data(), t.size())) << "byte " << i;
    }
    EXPECT_NE(a, kvc_msg_mac(s, 7, m.data(), m.size() - 1));
    EXPECT_EQ(0u, kvc_msg_mac(0, 7, m.data(), m.size()));
    EXPECT_NE(0u, kvc_msg_mac(s, 0, "", 0));
    EXPECT_NE(kvc_msg_mac(s, 7, "", 0), kvc_req_mac(s, 0, 7, 0, 0, 0));
    // Its definition (peers of other builds must agree): SipHash-2-4 under
    // {session ^ "10gsmxvk", session} of the nonce's 8 little-endian bytes
    // and the message, hashed in place for every length around a word.
    const uint64_t key[2] = {s ^ 0x6b76786d73673031ull, s};
    for (size_t n = 0; n <= 20; n++) {
        std::string in(8 + n, '\0');
        for (int b = 0; b < 8; b++) {
            in[b] = (char)(0x0123456789abcdefull >> (8 * b));
        }
        for (size_t i = 0; i < n; i++) {
            in[8 + i] = (char)('a' + i);
        }
        EXPECT_EQ(kvc_msg_mac(s, 0x0123456789abcdefull, in.data() + 8, n),
                  kvc_siphash24(key, in.data(), in.size()))
            << n << " bytes";
    }
}

// Data-plane control messages: a nonce (its sender's stamp) is taken once
// per sender, only within the window around now, and not when older than
// the last KVC_REPLAY_DEPTH taken from that sender; senders are apart;
// beyond KVC_REPLAY_SENDERS the least recently heard is forgotten, and a
// host that holds KVC_REPLAY_PER_HOST forgets its own first.
TEST(Replay, EachStampOncePerSenderWithinTheWindow)
{
    auto           r     = std::make_unique<kvc_replay_t>();
    const unsigned shift = 4;
    const uint64_t now   = 1000000000ull << shift, w = 5000000; // 5 s
    auto us = [&](int64_t d) {
        return (uint64_t)((int64_t)now + d * ((int64_t)1 << shift));
    };

    *r = {};
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 1, 0, us(-10), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(-10), now, shift, w))
        << "a replay was taken";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 2, 0, us(-10), now, shift, w))
        << "another sender's equal stamp";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 1, 0, us(-20), now, shift, w))
        << "a little reordering";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(-5000001), now, shift,
                                        w)) << "before the window";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(5000001), now, shift,
                                        w)) << "after the window";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 1, 0, us(4999999), now, shift,
                                        w));
    // Fill sender 3's depth; then anything older than its oldest is out.
    for (int i = 0; i < KVC_REPLAY_DEPTH; i++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 3, 0, us(100 + i), now,
                                            shift, w));
    }
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(99), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(100), now, shift, w));
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 3, 0, us(200), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(100), now, shift, w))
        << "the oldest, pushed out, is still older than what is kept";
    // One sender too many: sender 2, the least recently heard, is
    // forgotten; 1 and 3 are kept.
    for (uint64_t k = 1000; k < 1000 + KVC_REPLAY_SENDERS - 2; k++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), k, 0, us(1), now, shift, w));
    }
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(200), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(-10), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 2, 0, us(-10), now, shift, w))
        << "the forgotten sender's replay passed (it left a floor)";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 2, 7, us(-11), now, shift, w))
        << "another instance of that host is not held to its floor";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 2, 0, us(-9), now, shift, w))
        << "the forgotten sender's next message";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 2, 0, us(-10), now, shift, w))
        << "back in a slot, the sender still refuses its old replay";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 2, 0, us(-30), now, shift, w))
        << "nor an older one (its slot holds one stamp, above the floor)";
    // One host naming ever new instances (each stamped later, as on one
    // clock) forgets only its own senders, and keeps floors for the last
    // KVC_REPLAY_FLOORS_PER_HOST of them.
    *r = {};
    ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 5, 1, us(-10), now, shift, w));
    const uint64_t last = 100 + 4 * KVC_REPLAY_SENDERS - 1;
    for (uint64_t inst = 100; inst <= last; inst++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 9, inst,
                                            us((int64_t)inst), now, shift, w));
    }
    const uint64_t late = last - KVC_REPLAY_PER_HOST; // forgotten last
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 9, late, us((int64_t)late),
                                        now, shift, w))
        << "a recently forgotten instance's replay";
    // A forgotten instance whose floor is its host's lowest comes back: the
    // sender it pushes out keeps its own floor (in the entry just freed).
    const uint64_t back = late - KVC_REPLAY_FLOORS_PER_HOST + 1;
    ASSERT_NE(nullptr, kvc_replay_check(r.get(), 9, back, us((int64_t)back),
                                        now, shift, w));
    ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 9, back, us((int64_t)last + 1),
                                        now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 9, late + 1,
                                        us((int64_t)late + 1), now, shift, w))
        << "the sender pushed out by a returning one lost its floor";
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 9, 100, us(100), now, shift,
                                        w))
        << "host 9's oldest floors gave way to its newer ones";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 5, 1, us(-10), now, shift, w))
        << "another host's flood made host 5's sender be forgotten";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 9, last, us((int64_t)last),
                                        now, shift, w));
    // Hosts 1 and 3 forgotten (floors at -100 and +50), then one host's
    // flood of instances: its floors replace only its own.
    *r = {};
    ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 1, 0, us(-100), now, shift, w));
    ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 3, 0, us(50), now, shift, w));
    for (uint64_t h = 20; h < 20 + KVC_REPLAY_SENDERS - 1; h++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), h, 0, us(0), now, shift,
                                            w));
    }
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(-100), now, shift, w));
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(50), now, shift, w));
    for (uint64_t inst = 1; inst <= 4 * KVC_REPLAY_FLOORS; inst++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), 9, inst,
                                            us(1000 + (int64_t)inst), now,
                                            shift, w));
    }
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 1, 0, us(-100), now, shift, w))
        << "one host's flood dropped another host's floor";
    // Floors of many hosts beyond KVC_REPLAY_FLOORS: the lowest go first
    // (host 1's at -100 before host 3's at +50), so only then does a
    // forgotten sender's replay pass.
    for (uint64_t h = 10000; h < 10000 + 2 * KVC_REPLAY_FLOORS; h++) {
        ASSERT_EQ(nullptr, kvc_replay_check(r.get(), h, 0, us(1), now, shift,
                                            w));
    }
    EXPECT_EQ(nullptr, kvc_replay_check(r.get(), 1, 0, us(-100), now, shift, w))
        << "host 1's floor was the lowest and is gone";
    EXPECT_NE(nullptr, kvc_replay_check(r.get(), 3, 0, us(50), now, shift, w))
        << "host 3's higher floor outlived the lower ones";
}

// The data-plane session of a host: one per address (loopback addresses
// are one host), the same from a sender address and from the host, none
// for a host name, and another key gives other sessions.
TEST(HostSession, OnePerAddressKeyedAndNoneForNames)
{
    const uint64_t k1[2] = {1, 2}, k2[2] = {1, 3};
    uint64_t       a     = kvc_host_session(k1, "192.0.2.1", 0);

    EXPECT_NE(a, 0u);
    EXPECT_EQ(a, kvc_host_session(k1, "192.0.2.1:45123", 1));
    EXPECT_NE(a, kvc_host_session(k1, "192.0.2.2", 0));
    EXPECT_NE(a, kvc_host_session(k2, "192.0.2.1", 0));
    EXPECT_EQ(kvc_host_session(k1, "127.0.0.1", 0),
              kvc_host_session(k1, "127.0.0.7:9", 1));
    EXPECT_EQ(kvc_host_session(k1, "::1", 0),
              kvc_host_session(k1, "127.0.0.1", 0));
    EXPECT_EQ(kvc_host_session(k1, "fd00::1", 0),
              kvc_host_session(k1, "[fd00::1]:6301", 1));
    EXPECT_EQ(kvc_host_session(k1, "fd00:0::1", 0),
              kvc_host_session(k1, "fd00::1", 0));
    EXPECT_NE(kvc_host_session(k1, "fd00::1", 0),
              kvc_host_session(k1, "fd00::2", 0));
    EXPECT_EQ(kvc_host_session(k1, "prefill-0.example", 0), 0u);
    EXPECT_EQ(kvc_host_session(k1, "", 0), 0u);
    EXPECT_EQ(kvc_host_session(k1, "", 1), 0u);
    EXPECT_EQ(kvc_host_session(k1, nullptr, 1), 0u);
    EXPECT_EQ(kvc_host_session(k1, "192.0.2.1", 1), a) << "no port";
    // A dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d.
    EXPECT_EQ(kvc_host_session(k1, "[::ffff:192.0.2.1]:40000", 1), a);
    EXPECT_EQ(kvc_host_session(k1, "::ffff:127.0.0.9", 0),
              kvc_host_session(k1, "127.0.0.1", 0));
    EXPECT_TRUE(kvc_from_matches("[::ffff:192.0.2.1]:40000", "192.0.2.1"));
}

// Trust entries written as IPv4-mapped addresses are the IPv4 ones; their
// CIDR prefix counts the IPv6 bits (96 + the IPv4 prefix).
TEST(AddrTrust, Ipv4MappedEntries)
{
    Trust t({"::ffff:10.9.0.0/112", "::ffff:192.0.2.9"}, 1);
    ASSERT_EQ(t.status(), KVX_OK) << LastError();
    CheckTrustTable(t.get(), {
                                 {"10.9.3.4", true, ""},
                                 {"::ffff:10.9.0.1", true, ""},
                                 {"192.0.2.9", true, ""},
                                 {"10.8.0.1", false,
                                  "not in trusted_remote_hosts"},
                             });
    Trust bad({"::ffff:10.9.0.0/64"}, 1);
    EXPECT_EQ(bad.status(), KVX_ERR_CONFIG);
    EXPECT_TRUE(ErrorHas("IPv4-mapped address must be 96..128"))
        << LastError();
}

// The authenticator of a data-plane request (kvc_req_mac): none without a
// session, and another for any other session, tag, nonce, address, length
// or direction.
TEST(ReqMac, CoversEveryFieldAndNeedsTheSession)
{
    const uint64_t m = kvc_req_mac(42, 7, 9, 0x1000, 64, 1);

    EXPECT_NE(m, 0u);
    EXPECT_NE(m, 42u);
    EXPECT_EQ(m, kvc_req_mac(42, 7, 9, 0x1000, 64, 1));
    EXPECT_EQ(kvc_req_mac(0, 7, 9, 0x1000, 64, 1), 0u);
    EXPECT_NE(m, kvc_req_mac(43, 7, 9, 0x1000, 64, 1));
    EXPECT_NE(m, kvc_req_mac(42, 8, 9, 0x1000, 64, 1));
    EXPECT_NE(m, kvc_req_mac(42, 7, 10, 0x1000, 64, 1));
    EXPECT_NE(m, kvc_req_mac(42, 7, 9, 0x1001, 64, 1));
    EXPECT_NE(m, kvc_req_mac(42, 7, 9, 0x1000, 65, 1));
    EXPECT_NE(m, kvc_req_mac(42, 7, 9, 0x1000, 64, 0));
    EXPECT_NE(m, kvc_req_mac(42, 7, 9, 0x1000, 64, KVC_MAC_NOTICE));
}

// A WRITE D takes a P rank's data-plane completion notice only with the
// mac of that rank's host session over the notice's own fields (one from a
// rank not bound yet is kept by the engine for the reply that binds it,
// kvc_write_d_keep_early; one from a host name is left to write_done).
TEST(NoticeMatch, OnlyTheBoundRankOfThatInstanceAuthenticates)
{
    const uint64_t    key[2]  = {0x1111, 0x2222};
    const char *const hosts[] = {"192.0.2.1", "192.0.2.2", "p2.example"};
    const uint64_t    insts[] = {100, 200, 300};
    const uint64_t    s1 = kvc_host_session(key, "192.0.2.1", 0);
    const uint64_t    s2 = kvc_host_session(key, "192.0.2.2", 0);
    const uint64_t    s9 = kvc_host_session(key, "192.0.2.9", 0);
    auto mac = [](uint64_t s, uint64_t tag, uint64_t nonce, uint64_t inst) {
        return kvc_req_mac(s, tag, nonce, inst, 3, KVC_MAC_NOTICE);
    };

    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3,
                               mac(s1, 7, 5, 100)), 0);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 200, 3,
                               mac(s2, 7, 5, 200)), 1);
    // Another host's session (a peer that passed the handshake elsewhere),
    // the right session over other fields, a put's mac, no mac at all.
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3,
                               mac(s2, 7, 5, 100)), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3,
                               mac(s9, 7, 5, 100)), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3,
                               mac(s1, 7, 6, 100)), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 8, 5, 100, 3,
                               mac(s1, 7, 5, 100)), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3,
                               kvc_req_mac(s1, 7, 5, 100, 3, 1)), -2);
    // Another use of the transfer id (xnonce).
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 4,
                               mac(s1, 7, 5, 100)), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 100, 3, 0), -2);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 0, 3,
                               mac(s1, 7, 5, 0)), -2);
    // Under another D's key (a restarted D on the same address).
    const uint64_t other[2] = {0x1111, 0x2223};
    EXPECT_EQ(kvc_notice_match(other, hosts, insts, 3, 7, 5, 100, 3,
                               mac(s1, 7, 5, 100)), -2);
    // An instance no rank is bound to yet, and a rank named by host name:
    // not for the notice to decide.
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 999, 3,
                               mac(s1, 7, 5, 999)), -1);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 3, 7, 5, 300, 3,
                               mac(s1, 7, 5, 300)), -1);
    EXPECT_EQ(kvc_notice_match(key, hosts, insts, 0, 7, 5, 100, 3,
                               mac(s1, 7, 5, 100)), -1);
}

// A completion that overtook the reply binding its sender's instance:
// kvc_notice_ranks names the unbound ranks whose host's session gives its
// mac (so a notice from host B naming rank A's instance belongs to B's
// ranks only), and the early store then completes only such a rank when a
// reply binds it to that instance.
// A counted notice (kvt.h notify_queued) authenticates its count too: the
// same notice with another count, or under the plain notice's mac (or a
// plain notice under a counted mac) matches no rank.
TEST(NoticeMatch, CountedNoticeMacCoversItsCount)
{
    const uint64_t    key[2]  = {0x1111, 0x2222};
    const char *const hosts[] = {"192.0.2.1"};
    const uint64_t    insts[] = {100};
    const uint64_t    s1 = kvc_host_session(key, "192.0.2.1", 0);
    const uint64_t    cm = kvc_count_mac(s1, 7, 5, 100, 3, 65536);

    EXPECT_EQ(kvc_notice_match_n(key, hosts, insts, 1, 7, 5, 100, 3, 65536,
                                 cm), 0);
    EXPECT_EQ(kvc_notice_match_n(key, hosts, insts, 1, 7, 5, 100, 3, 65535,
                                 cm), -2);
    EXPECT_EQ(kvc_notice_match_n(key, hosts, insts, 1, 7, 5, 100, 3, 0, cm),
              -2);
    EXPECT_EQ(kvc_notice_match_n(key, hosts, insts, 1, 7, 5, 100, 3,
                                 KVC_COUNT_NONE, cm), -2);
    EXPECT_EQ(kvc_notice_match_n(key, hosts, insts, 1, 7, 5, 100, 3, 65536,
                                 kvc_req_mac(s1, 7, 5, 100, 3,
                                             KVC_MAC_NOTICE)), -2);
    // The plain notice's mac is kvc_notice_mac's for KVC_COUNT_NONE, and
    // the counted one is none of a request's.
    EXPECT_EQ(kvc_notice_mac(s1, 7, 5, 100, 3, KVC_COUNT_NONE),
              kvc_req_mac(s1, 7, 5, 100, 3, KVC_MAC_NOTICE));
    EXPECT_EQ(kvc_notice_mac(s1, 7, 5, 100, 3, 65536), cm);
    for (int dir = 0; dir <= KVC_MAC_NOTICE; dir++) {
        EXPECT_NE(cm, kvc_req_mac(s1, 7, 5, 100, 3, dir));
    }
    EXPECT_EQ(kvc_count_mac(0, 7, 5, 100, 3, 65536), 0u);
    // The early path checks the count the same way.
    int checked = 0;
    EXPECT_EQ(kvc_notice_ranks_n(key, hosts, 1, 1, 7, 5, 100, 3, 65536, cm,
                                 &checked), 1u);
    EXPECT_EQ(kvc_notice_ranks_n(key, hosts, 1, 1, 7, 5, 100, 3, 1, cm,
                                 &checked), 0u);
    EXPECT_EQ(checked, 1);
}

TEST(NoticeMatch, EarlyCompletionBelongsToTheRanksOfItsHost)
{
    const uint64_t    key[2]  = {0x1111, 0x2222};
    // Ranks 0 and 2 on host A, rank 1 on host B, rank 3 named by name.
    const char *const hosts[] = {"192.0.2.1", "192.0.2.2", "192.0.2.1",
                                 "p3.example"};
    const uint64_t    sa = kvc_host_session(key, "192.0.2.1", 0);
    const uint64_t    sb = kvc_host_session(key, "192.0.2.2", 0);
    auto mac = [](uint64_t s, uint64_t inst) {
        return kvc_req_mac(s, 7, 5, inst, 3, KVC_MAC_NOTICE);
    };
    int checked = -1;

    // A's session: A's unbound ranks; B's session: B's rank only.
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0xf, 7, 5, 100, 3,
                               mac(sa, 100), &checked), 0x5u);
    EXPECT_EQ(checked, 1);
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0xf, 7, 5, 100, 3,
                               mac(sb, 100), &checked), 0x2u);
    // Only candidates (unbound ranks) count; none left of A's: refused.
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0x2 | 0x8, 7, 5, 100, 3,
                               mac(sa, 100), &checked), 0u);
    EXPECT_EQ(checked, 1);
    // Only the host-name rank left: nothing can be checked.
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0x8, 7, 5, 100, 3,
                               mac(sa, 100), &checked), 0u);
    EXPECT_EQ(checked, 0);
    // Other fields under the mac, instance 0.
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0xf, 7, 5, 101, 3,
                               mac(sa, 100), nullptr), 0u);
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0xf, 7, 5, 100, 4,
                               mac(sa, 100), nullptr), 0u);
    EXPECT_EQ(kvc_notice_ranks(key, hosts, 4, 0xf, 7, 5, 0, 3, mac(sa, 0),
                               nullptr), 0u);

    kvc_early_done_t s = {};
    // B's forged completion naming A's instance 100, then A's own.
    EXPECT_EQ(kvc_early_done_keep(&s, 100, 0x2), 1);
    EXPECT_EQ(kvc_early_done_take(&s, 100, 0), 0) << "B completed A's rank";
    EXPECT_EQ(kvc_early_done_keep(&s, 100, 0x5), 1); // merged
    EXPECT_EQ(kvc_early_done_take(&s, 100, 0), 1);
    EXPECT_EQ(kvc_early_done_take(&s, 100, 2), 0) << "taken once";
    EXPECT_EQ(kvc_early_done_take(&s, 999, 1), 0);
    // Nothing kept for instance 0 or no rank; slots are reused once taken.
    EXPECT_EQ(kvc_early_done_keep(&s, 0, 0x1), 0);
    EXPECT_EQ(kvc_early_done_keep(&s, 5, 0), 0);
    for (uint64_t i = 1; i <= KVC_RANKMAP_MAX; i++) {
        EXPECT_EQ(kvc_early_done_keep(&s, 1000 + i, 1), 1) << i;
    }
    EXPECT_EQ(kvc_early_done_keep(&s, 5000, 1), 0) << "store full";
    EXPECT_EQ(kvc_early_done_take(&s, 1001, 0), 1);
    EXPECT_EQ(kvc_early_done_keep(&s, 5000, 1), 1) << "slot not reused";
    EXPECT_EQ(kvc_early_done_take(&s, 5000, 0), 1);
    EXPECT_EQ(kvc_early_done_take(&s, 1, 64), 0);
}

// A READ P takes a D rank's release notice only with the mac of the
// session it gave the address the notice claims (the handshake's seen_as,
// port and all, computed as the handshake did): another address, another
// engine's key, other fields or no claim do not authenticate it.
TEST(NoticeMatch, ReleaseNoticeNeedsTheSessionOfItsClaimedAddress)
{
    const uint64_t key[2]   = {0x3333, 0x4444};
    const uint64_t other[2] = {0x3333, 0x4445};
    const uint64_t s = kvc_host_session(key, "192.0.2.7:40001", 1);
    const uint64_t inst = (uint64_t)2 << 32 | 1; // tp 2, rank 1
    const uint64_t m = kvc_req_mac(s, 7, 5, inst, 0, KVC_MAC_NOTICE);

    ASSERT_NE(s, 0u);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 7, 5, inst, 0, m), 1);
    // The session is per host: another port of that host is the same one.
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:50000", 7, 5, inst, 0, m), 1);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.8:40001", 7, 5, inst, 0, m), 0);
    EXPECT_EQ(kvc_notice_from_ok(other, "192.0.2.7:40001", 7, 5, inst, 0, m),
              0);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 8, 5, inst, 0, m), 0);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 7, 6, inst, 0, m), 0);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 7, 5, inst + 1, 0,
                                 m), 0); // another rank
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 7, 5, inst, 1, m), 0);
    EXPECT_EQ(kvc_notice_from_ok(key, "", 7, 5, inst, 0, m), 0);
    // A dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d, and every
    // loopback address is one host: the same session as the handshake's.
    EXPECT_EQ(kvc_notice_from_ok(key, "[::ffff:192.0.2.7]:40001", 7, 5, inst,
                                 0, m), 1);
    const uint64_t lo = kvc_host_session(key, "127.0.0.1:5", 1);
    const uint64_t ml = kvc_req_mac(lo, 7, 5, inst, 0, KVC_MAC_NOTICE);
    EXPECT_EQ(kvc_notice_from_ok(key, "127.0.0.2:9", 7, 5, inst, 0, ml), 1);
    EXPECT_EQ(kvc_notice_from_ok(key, "[::1]:9", 7, 5, inst, 0, ml), 1);
    EXPECT_EQ(kvc_notice_from_ok(key, "p.example:1", 7, 5, inst, 0, m), 0);
    EXPECT_EQ(kvc_notice_from_ok(key, "192.0.2.7:40001", 7, 5, inst, 0,
                                 kvc_req_mac(s, 7, 5, inst, 0, 1)), 0)
        << "a put's mac must not pass for a notice's";
}
