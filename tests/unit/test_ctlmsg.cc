// test_ctlmsg.cc - control-plane codecs (plugin/ctlmsg.h; SPEC §5, §9).
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>

#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

extern "C" {
#include "ctlmsg.h"
}

namespace {

bool ErrorHas(const std::string &needle)
{
    return std::string(kvc_last_error()).find(needle) != std::string::npos;
}

std::string Take(char *text)
{
    EXPECT_NE(text, nullptr);
    std::string s = text != nullptr ? text : "";
    free(text);
    return s;
}

std::string EncodeMsg(const kvc_msg_t &msg)
{
    size_t len  = 0;
    char  *text = kvc_msg_encode(&msg, &len);
    EXPECT_NE(text, nullptr);
    if (text == nullptr) {
        return "";
    }
    EXPECT_EQ(len, strlen(text));
    return Take(text);
}

kvx_status_t Decode(const std::string &s, int is_producer, kvc_msg_t *msg)
{
    return kvc_msg_decode(s.data(), s.size(), is_producer, msg);
}

// ---------------------------------------------------------------------------
// control messages: round trips

struct RoundTripCase {
    const char             *label;
    kvc_msg_type_t          type;
    int                     is_producer; // receiving role
    const char             *transfer_id;
    const char             *req_id;
    std::vector<uint64_t>   blocks;
    int32_t                 decode_rank;
    int32_t                 consumer_tp_size; // sent
    int32_t                 expect_tp_size;   // decoded
};

void PrintTo(const RoundTripCase &c, std::ostream *os)
{
    *os << c.label;
}

class MsgRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(MsgRoundTrip, FieldsSurvive)
{
    const RoundTripCase &c = GetParam();
    kvc_msg_t in{};
    in.type = c.type;
    snprintf(in.transfer_id, sizeof(in.transfer_id), "%s", c.transfer_id);
    snprintf(in.req_id, sizeof(in.req_id), "%s", c.req_id);
    std::vector<uint64_t> blocks = c.blocks;
    in.block_ids        = blocks.empty() ? nullptr : blocks.data();
    in.num_block_ids    = blocks.size();
    in.decode_rank      = c.decode_rank;
    in.consumer_tp_size = c.consumer_tp_size;

    std::string text = EncodeMsg(in);
    kvc_msg_t   out;
    ASSERT_EQ(Decode(text, c.is_producer, &out), KVX_OK)
        << text << ": " << kvc_last_error();
    EXPECT_EQ(out.type, c.type);
    EXPECT_STREQ(out.transfer_id, c.transfer_id);
    EXPECT_EQ(out.legacy, 0);
    if (c.type == KVC_MSG_REMOTE_BLOCKS) {
        EXPECT_STREQ(out.req_id, c.req_id);
        EXPECT_EQ(out.decode_rank, c.decode_rank);
        ASSERT_EQ(out.num_block_ids, blocks.size());
        EXPECT_EQ(std::vector<uint64_t>(out.block_ids,
                                        out.block_ids + out.num_block_ids),
                  blocks);
    } else {
        EXPECT_EQ(out.block_ids, nullptr);
        EXPECT_EQ(out.num_block_ids, 0u);
    }
    if (c.type == KVC_MSG_RELEASE) {
        EXPECT_EQ(out.consumer_tp_size, c.expect_tp_size);
    }
    kvc_msg_fini(&out);
    EXPECT_EQ(out.block_ids, nullptr);
}

const RoundTripCase kRoundTrips[] = {
    {"RemoteBlocks", KVC_MSG_REMOTE_BLOCKS, 1, "tx-1", "cmpl-abc-0",
     {3, 1, 4, 1, 5, 9007199254740992ull}, 7, 0, 0},
    {"RemoteBlocksOneBlock", KVC_MSG_REMOTE_BLOCKS, 1, "tx-2", "r", {0}, 0, 0,
     0},
    {"WriteDone", KVC_MSG_WRITE_DONE, 0, "tx-3", "", {}, 0, 0, 0},
    {"ReleaseTp4", KVC_MSG_RELEASE, 1, "tx-4", "", {}, 0, 4, 4},
    {"ReleaseNoTpSize", KVC_MSG_RELEASE, 1, "tx-5", "", {}, 0, 0, 1},
    {"HeartbeatProducer", KVC_MSG_HEARTBEAT, 1, "", "", {}, 0, 0, 0},
    {"HeartbeatConsumer", KVC_MSG_HEARTBEAT, 0, "", "", {}, 0, 0, 0},
    {"Hold", KVC_MSG_HOLD, 1, "tx-6", "", {}, 0, 0, 0},
    {"GivenUp", KVC_MSG_GIVEN_UP, 0, "tx-7", "", {}, 0, 0, 0},
    {"TransferIdWithSpace", KVC_MSG_WRITE_DONE, 0, "tx with space", "", {}, 0,
     0, 0},
};

INSTANTIATE_TEST_SUITE_P(
    AllTypes, MsgRoundTrip, ::testing::ValuesIn(kRoundTrips),
    [](const ::testing::TestParamInfo<RoundTripCase> &info) {
        return std::string(info.param.label);
    });

// given_up (P -> D, WRITE): a P whose engine stopped names the use it gave
// up; only a consumer takes it, and it needs the transfer id.
TEST(CtlMsg, GivenUpIsForTheConsumerAndNamesItsUse)
{
    const std::string in = R"({"type":"given_up","transfer_id":"tx-9",)"
                           R"("instance":"12","xfer_nonce":"77"})";
    kvc_msg_t m{};
    ASSERT_EQ(KVX_OK, Decode(in, 0, &m)) << kvc_last_error();
    EXPECT_EQ(KVC_MSG_GIVEN_UP, m.type);
    EXPECT_STREQ("tx-9", m.transfer_id);
    EXPECT_EQ(12u, m.instance);
    EXPECT_EQ(77u, m.xfer_nonce);
    kvc_msg_fini(&m);
    EXPECT_NE(KVX_OK, Decode(in, 1, &m)); // a producer never takes it
    EXPECT_TRUE(ErrorHas("given_up")) << kvc_last_error();
    EXPECT_NE(KVX_OK, Decode(R"({"type":"given_up"})", 0, &m));
    EXPECT_TRUE(ErrorHas("transfer_id")) << kvc_last_error();
}

TEST(CtlMsg, ReleaseCarriesConsumerRank)
{
    const char in[] = "{\"type\":\"release\",\"transfer_id\":\"tx-1\","
                      "\"consumer_tp_size\":4,\"consumer_rank\":3}";
    kvc_msg_t  m{};
    ASSERT_EQ(KVX_OK, kvc_msg_decode(in, sizeof(in) - 1, 1, &m));
    EXPECT_EQ(4, m.consumer_tp_size);
    EXPECT_EQ(3, m.consumer_rank);
    kvc_msg_fini(&m);
    const char old[] = "{\"type\":\"release\",\"transfer_id\":\"tx-1\"}";
    ASSERT_EQ(KVX_OK, kvc_msg_decode(old, sizeof(old) - 1, 1, &m));
    EXPECT_EQ(-1, m.consumer_rank);
    kvc_msg_fini(&m);
    const char bad[] = "{\"type\":\"release\",\"transfer_id\":\"tx-1\","
                       "\"consumer_rank\":-2}";
    EXPECT_EQ(KVX_ERR_BAD_MESSAGE, kvc_msg_decode(bad, sizeof(bad) - 1, 1, &m));
    EXPECT_NE(std::string(kvc_last_error()).find("consumer_rank"),
              std::string::npos);
    // a tp_size's range (1..65535): P computes a READ quorum from it, one
    // rank map per D rank (2^31 of them took P's engine minutes)
    const char huge[] = "{\"type\":\"release\",\"transfer_id\":\"tx-1\","
                        "\"consumer_tp_size\":65536,\"consumer_rank\":0}";
    EXPECT_EQ(KVX_ERR_BAD_MESSAGE,
              kvc_msg_decode(huge, sizeof(huge) - 1, 1, &m));
    EXPECT_TRUE(ErrorHas("consumer_tp_size")) << kvc_last_error();
    EXPECT_TRUE(ErrorHas("65536")) << kvc_last_error();
    const char top[] = "{\"type\":\"release\",\"transfer_id\":\"tx-1\","
                       "\"consumer_tp_size\":65535,\"consumer_rank\":0}";
    ASSERT_EQ(KVX_OK, kvc_msg_decode(top, sizeof(top) - 1, 1, &m));
    EXPECT_EQ(65535, m.consumer_tp_size);
    kvc_msg_fini(&m);
}

// WRITE messages name the use of their transfer id (xfer_nonce): encoded
// when set, optional on decode (a legacy peer's messages have none), every
// bit of a 64-bit value kept.
TEST(CtlMsg, XferNonceRoundTripsAndIsOptional)
{
    kvc_msg_t m{};
    m.type          = KVC_MSG_WRITE_DONE;
    m.consumer_rank = -1;
    m.xfer_nonce    = 0xfedcba9876543210ull;
    snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-xn");
    std::string s = EncodeMsg(m);
    EXPECT_NE(s.find("\"xfer_nonce\""), std::string::npos) << s;
    kvc_msg_t d{};
    ASSERT_EQ(KVX_OK, Decode(s, 0, &d)) << kvc_last_error();
    EXPECT_EQ(d.xfer_nonce, 0xfedcba9876543210ull);
    kvc_msg_fini(&d);
    m.xfer_nonce = 0;
    s            = EncodeMsg(m);
    EXPECT_EQ(s.find("xfer_nonce"), std::string::npos) << s;
    kvc_msg_t e{};
    ASSERT_EQ(KVX_OK, Decode(s, 0, &e));
    EXPECT_EQ(e.xfer_nonce, 0u);
    kvc_msg_fini(&e);
    const char bad[] = "{\"type\":\"write_done\",\"transfer_id\":\"t\","
                       "\"xfer_nonce\":\"x\"}";
    EXPECT_EQ(KVX_ERR_BAD_MESSAGE, kvc_msg_decode(bad, sizeof(bad) - 1, 0, &e));
    EXPECT_TRUE(ErrorHas("xfer_nonce")) << kvc_last_error();
}

TEST(CtlMsg, EncodesExpectedJson)
{
    kvc_msg_t msg{};
    msg.type = KVC_MSG_HEARTBEAT;
    EXPECT_EQ(EncodeMsg(msg), "{\"type\":\"heartbeat\"}");

    msg.type = KVC_MSG_WRITE_DONE;
    snprintf(msg.transfer_id, sizeof(msg.transfer_id), "tx-9");
    EXPECT_EQ(EncodeMsg(msg), "{\"type\":\"write_done\",\"transfer_id\":\"tx-9\"}");

    msg.type             = KVC_MSG_RELEASE;
    msg.consumer_tp_size = 2;
    msg.consumer_rank    = -1;
    EXPECT_EQ(EncodeMsg(msg), "{\"type\":\"release\",\"transfer_id\":\"tx-9\","
                              "\"consumer_tp_size\":2}");
    msg.consumer_rank = 0;
    EXPECT_EQ(EncodeMsg(msg), "{\"type\":\"release\",\"transfer_id\":\"tx-9\","
                              "\"consumer_tp_size\":2,\"consumer_rank\":0}");

    uint64_t ids[] = {5, 6};
    msg.type          = KVC_MSG_REMOTE_BLOCKS;
    msg.block_ids     = ids;
    msg.num_block_ids = 2;
    msg.decode_rank   = 1;
    msg.consumer_rank = -1; /* set: "consumer_rank" names the D TP rank */
    snprintf(msg.req_id, sizeof(msg.req_id), "req");
    EXPECT_EQ(EncodeMsg(msg),
              "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-9\","
              "\"req_id\":\"req\",\"block_notify_list\":[5,6],"
              "\"decode_rank\":1}");
    msg.done_by_notice = 1; /* D completes on the notice alone */
    EXPECT_EQ(EncodeMsg(msg),
              "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-9\","
              "\"req_id\":\"req\",\"block_notify_list\":[5,6],"
              "\"done_by_notice\":1,\"decode_rank\":1}");
    msg.done_by_notice = 0;

    msg.type = static_cast<kvc_msg_type_t>(99);
    EXPECT_EQ(kvc_msg_encode(&msg, nullptr), nullptr);
}

TEST(CtlMsg, TypelessObjectWithReqIdIsRemoteBlocks)
{
    kvc_msg_t msg;
    ASSERT_EQ(Decode("{\"req_id\":\"r1\",\"transfer_id\":\"tx-1\","
                     "\"block_notify_list\":[2,3],\"decode_rank\":0}",
                     1, &msg),
              KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(msg.type, KVC_MSG_REMOTE_BLOCKS);
    EXPECT_STREQ(msg.req_id, "r1");
    EXPECT_EQ(msg.done_by_notice, 0); /* absent: write_done wanted */
    ASSERT_EQ(msg.num_block_ids, 2u);
    EXPECT_EQ(msg.block_ids[0], 2u);
    EXPECT_EQ(msg.block_ids[1], 3u);
    kvc_msg_fini(&msg);
}

TEST(CtlMsg, UnknownFieldsAndWhitespaceAccepted)
{
    kvc_msg_t msg;
    ASSERT_EQ(Decode(" \n{\"type\":\"release\",\"transfer_id\":\"tx-1\","
                     "\"future\":[1,{\"x\":null}]}\r\n",
                     1, &msg),
              KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(msg.type, KVC_MSG_RELEASE);
    EXPECT_EQ(msg.consumer_tp_size, 1);
    kvc_msg_fini(&msg);
}

// ---------------------------------------------------------------------------
// the message type table

const char *RoleName(int is_producer)
{
    return is_producer ? "producer" : "consumer";
}

// every kvc_msg_type_t value; a new type is added here too
const kvc_msg_type_t kAllTypes[] = {KVC_MSG_REMOTE_BLOCKS, KVC_MSG_WRITE_DONE,
                                    KVC_MSG_RELEASE, KVC_MSG_HEARTBEAT,
                                    KVC_MSG_HOLD, KVC_MSG_GIVEN_UP};
static_assert(sizeof(kAllTypes) / sizeof(kAllTypes[0]) == KVC_MSG_NTYPES,
              "kAllTypes lists every kvc_msg_type_t value");

TEST(CtlMsgTable, EveryTypeHasItsEntry)
{
    for (kvc_msg_type_t t : kAllTypes) {
        EXPECT_GE(static_cast<int>(t), 1);
        EXPECT_LE(static_cast<int>(t), KVC_MSG_NTYPES);
    }
    for (int t = 1; t <= KVC_MSG_NTYPES; t++) {
        const kvc_msg_desc_t *d = kvc_msg_desc(static_cast<kvc_msg_type_t>(t));
        ASSERT_NE(d, nullptr) << "type " << t;
        EXPECT_EQ(static_cast<int>(d->type), t);
        ASSERT_NE(d->name, nullptr) << "type " << t;
        EXPECT_GT(strlen(d->name), 0u);
        ASSERT_NE(d->stats_name, nullptr) << d->name;
        EXPECT_GT(strlen(d->stats_name), 0u);
        EXPECT_NE(d->roles, 0u) << d->name;
        EXPECT_EQ(d->roles & ~(KVC_MSG_TO_PRODUCER | KVC_MSG_TO_CONSUMER), 0u)
            << d->name;
        // fields are decoded and encoded by the same entry, or by neither
        EXPECT_EQ(d->decode_fields == nullptr, d->encode_fields == nullptr)
            << d->name;
    }
    for (int t : {0, KVC_MSG_NTYPES + 1}) {
        EXPECT_EQ(kvc_msg_desc(static_cast<kvc_msg_type_t>(t)), nullptr) << t;
    }
}

TEST(CtlMsgTable, NamesUniqueAndLookupRoundTrips)
{
    std::vector<std::string> names, stats;
    for (int t = 1; t <= KVC_MSG_NTYPES; t++) {
        const kvc_msg_desc_t *d = kvc_msg_desc(static_cast<kvc_msg_type_t>(t));
        ASSERT_NE(d, nullptr);
        names.push_back(d->name);
        stats.push_back(d->stats_name);
        EXPECT_EQ(kvc_msg_desc_by_name(d->name, strlen(d->name)), d);
        // not NUL-terminated at len; a prefix or an extension is no match
        std::string longer = std::string(d->name) + "x";
        EXPECT_EQ(kvc_msg_desc_by_name(longer.data(), longer.size() - 1), d);
        EXPECT_EQ(kvc_msg_desc_by_name(longer.data(), longer.size()), nullptr);
        EXPECT_EQ(kvc_msg_desc_by_name(d->name, strlen(d->name) - 1), nullptr);
    }
    for (std::vector<std::string> *v : {&names, &stats}) {
        std::vector<std::string> sorted = *v;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()),
                  sorted.end());
    }
    EXPECT_EQ(kvc_msg_desc_by_name("", 0), nullptr);
    EXPECT_EQ(kvc_msg_desc_by_name(nullptr, 0), nullptr);
    EXPECT_EQ(kvc_msg_desc_by_name("get_meta", 8), nullptr);
}

TEST(CtlMsgTable, WireAndStatsNamesAndRolesPinned)
{
    struct Want {
        kvc_msg_type_t type;
        const char    *name, *stats_name;
        unsigned       roles;
    };
    const Want want[] = {
        {KVC_MSG_REMOTE_BLOCKS, "remote_blocks", "remote_blocks",
         KVC_MSG_TO_PRODUCER},
        {KVC_MSG_WRITE_DONE, "write_done", "write_done", KVC_MSG_TO_CONSUMER},
        {KVC_MSG_RELEASE, "release", "release", KVC_MSG_TO_PRODUCER},
        {KVC_MSG_HEARTBEAT, "heartbeat", "heartbeat",
         KVC_MSG_TO_PRODUCER | KVC_MSG_TO_CONSUMER},
        {KVC_MSG_HOLD, "hold", "hold", KVC_MSG_TO_PRODUCER},
        {KVC_MSG_GIVEN_UP, "given_up", "given_up", KVC_MSG_TO_CONSUMER},
    };
    for (const Want &w : want) {
        const kvc_msg_desc_t *d = kvc_msg_desc(w.type);
        ASSERT_NE(d, nullptr);
        EXPECT_STREQ(d->name, w.name);
        EXPECT_STREQ(d->stats_name, w.stats_name);
        EXPECT_EQ(d->roles, w.roles) << w.name;
    }
    EXPECT_EQ(KVC_MSG_ROLE(1), KVC_MSG_TO_PRODUCER);
    EXPECT_EQ(KVC_MSG_ROLE(0), KVC_MSG_TO_CONSUMER);
}

// every entry with all fields set: accepted (and re-encoded identically) by
// the roles in its entry, refused by the others
TEST(CtlMsgTable, EachEntryRoundTripsForItsRoles)
{
    uint64_t ids[] = {7, 0, 9007199254740992ull};
    for (int t = 1; t <= KVC_MSG_NTYPES; t++) {
        const kvc_msg_desc_t *d = kvc_msg_desc(static_cast<kvc_msg_type_t>(t));
        ASSERT_NE(d, nullptr);
        kvc_msg_t in{};
        in.type = d->type;
        snprintf(in.transfer_id, sizeof(in.transfer_id), "tx-%s", d->name);
        snprintf(in.req_id, sizeof(in.req_id), "req-%d", t);
        in.block_ids        = ids;
        in.num_block_ids    = 3;
        in.decode_rank      = 2;
        in.consumer_tp_size = 4;
        in.consumer_rank    = 3;
        std::string text = EncodeMsg(in);
        EXPECT_EQ(text.rfind("{\"type\":\"" + std::string(d->name) + "\"", 0),
                  0u)
            << text;
        for (int is_producer : {1, 0}) {
            kvc_msg_t out;
            kvx_status_t st = Decode(text, is_producer, &out);
            if (d->roles & KVC_MSG_ROLE(is_producer)) {
                ASSERT_EQ(st, KVX_OK) << text << ": " << kvc_last_error();
                EXPECT_EQ(out.type, d->type);
                EXPECT_STREQ(out.transfer_id, in.transfer_id);
                EXPECT_EQ(out.legacy, 0);
                EXPECT_EQ(EncodeMsg(out), text) << RoleName(is_producer);
                kvc_msg_fini(&out);
            } else {
                EXPECT_EQ(st, KVX_ERR_BAD_MESSAGE) << text;
                EXPECT_TRUE(ErrorHas(std::string("control message: type ") +
                                     d->name + " not accepted by a " +
                                     RoleName(is_producer)))
                    << kvc_last_error();
                EXPECT_EQ(out.block_ids, nullptr);
            }
        }
    }
}

TEST(CtlMsgTable, TransferIdRequiredUnlessOptional)
{
    for (int t = 1; t <= KVC_MSG_NTYPES; t++) {
        const kvc_msg_desc_t *d = kvc_msg_desc(static_cast<kvc_msg_type_t>(t));
        ASSERT_NE(d, nullptr);
        int is_producer = (d->roles & KVC_MSG_TO_PRODUCER) != 0;
        kvc_msg_t out;
        kvx_status_t st = Decode("{\"type\":\"" + std::string(d->name) + "\"}",
                                 is_producer, &out);
        if (d->id_optional) {
            EXPECT_EQ(st, KVX_OK) << d->name << ": " << kvc_last_error();
            EXPECT_STREQ(out.transfer_id, "");
            EXPECT_EQ(EncodeMsg(out),
                      "{\"type\":\"" + std::string(d->name) + "\"}");
            kvc_msg_fini(&out);
        } else {
            EXPECT_EQ(st, KVX_ERR_BAD_MESSAGE) << d->name;
            EXPECT_TRUE(ErrorHas("control message: field transfer_id: "
                                 "missing"))
                << kvc_last_error();
        }
    }
}

// ---------------------------------------------------------------------------
// legacy plain transfer ids

struct LegacyCase {
    const char    *label;
    std::string    input;
    int            is_producer;
    kvc_msg_type_t expect;
};

void PrintTo(const LegacyCase &c, std::ostream *os)
{
    *os << c.label;
}

class MsgLegacy : public ::testing::TestWithParam<LegacyCase> {};

TEST_P(MsgLegacy, DecodesByRole)
{
    const LegacyCase &c = GetParam();
    kvc_msg_t         msg;
    ASSERT_EQ(Decode(c.input, c.is_producer, &msg), KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(msg.type, c.expect);
    EXPECT_STREQ(msg.transfer_id, "tx-0123abcd-ef");
    EXPECT_EQ(msg.legacy, 1);
    EXPECT_EQ(msg.consumer_tp_size, 1);
    EXPECT_EQ(msg.block_ids, nullptr);
    kvc_msg_fini(&msg);
}

const LegacyCase kLegacy[] = {
    {"PlainOnProducer", "tx-0123abcd-ef", 1, KVC_MSG_RELEASE},
    {"PlainOnConsumer", "tx-0123abcd-ef", 0, KVC_MSG_WRITE_DONE},
    {"PlainTrimmed", " \ttx-0123abcd-ef\r\n", 1, KVC_MSG_RELEASE},
    {"JsonStringOnProducer", "\"tx-0123abcd-ef\"", 1, KVC_MSG_RELEASE},
    {"JsonStringOnConsumer", " \"tx-0123abcd-ef\" ", 0, KVC_MSG_WRITE_DONE},
};

INSTANTIATE_TEST_SUITE_P(
    PlainIds, MsgLegacy, ::testing::ValuesIn(kLegacy),
    [](const ::testing::TestParamInfo<LegacyCase> &info) {
        return std::string(info.param.label);
    });

TEST(CtlMsg, LegacyEncodeIsRawId)
{
    kvc_msg_t msg{};
    msg.legacy = 1;
    msg.type   = KVC_MSG_RELEASE;
    snprintf(msg.transfer_id, sizeof(msg.transfer_id), "tx-raw");
    size_t len  = 0;
    char  *text = kvc_msg_encode(&msg, &len);
    ASSERT_NE(text, nullptr);
    EXPECT_EQ(len, 6u);
    EXPECT_STREQ(text, "tx-raw");
    kvc_msg_t out;
    ASSERT_EQ(kvc_msg_decode(text, len, 0, &out), KVX_OK);
    EXPECT_EQ(out.type, KVC_MSG_WRITE_DONE);
    EXPECT_STREQ(out.transfer_id, "tx-raw");
    free(text);
    kvc_msg_fini(&out);
}

// ---------------------------------------------------------------------------
// control messages: rejects

struct RejectCase {
    const char *label;
    std::string input;
    int         is_producer;
    const char *reason;
};

void PrintTo(const RejectCase &c, std::ostream *os)
{
    *os << c.label;
}

class MsgReject : public ::testing::TestWithParam<RejectCase> {};

TEST_P(MsgReject, BadMessageWithReason)
{
    const RejectCase &c = GetParam();
    kvc_msg_t         msg;
    msg.block_ids = reinterpret_cast<uint64_t *>(0x1); // overwritten
    kvc_error_clear();
    EXPECT_EQ(Decode(c.input, c.is_producer, &msg), KVX_ERR_BAD_MESSAGE);
    EXPECT_TRUE(ErrorHas(c.reason))
        << "reason '" << kvc_last_error() << "' lacks '" << c.reason << "'";
    EXPECT_TRUE(ErrorHas("control message")) << kvc_last_error();
    EXPECT_EQ(msg.block_ids, nullptr);
    EXPECT_EQ(msg.num_block_ids, 0u);
}

const std::string kBlocks =
    "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-1\",\"req_id\":\"r\","
    "\"decode_rank\":0,";

const RejectCase kRejects[] = {
    {"GarbageWithSpaces", "hello world, not json", 1,
     "byte 0x20 at offset 5: must be printable ASCII without spaces"},
    {"Empty", "", 1, "empty message"},
    {"OnlyWhitespace", " \n\t ", 0, "only whitespace"},
    {"ControlByte", "tx-\x01", 0, "byte 0x01 at offset 3"},
    {"LegacyTooLong", std::string(KVX_ID_MAX, 'a'), 1,
     "length 256 exceeds limit 255"},
    {"UnknownType", "{\"type\":\"foo\",\"transfer_id\":\"tx-1\"}", 1,
     "unknown type \"foo\""},
    {"TypeNotString", "{\"type\":3,\"transfer_id\":\"tx-1\"}", 1,
     "field type: value 3: must be a string"},
    {"NoTypeNoReqId", "{\"transfer_id\":\"tx-1\"}", 1, "field type: missing"},
    {"MissingTransferId", "{\"type\":\"release\"}", 1,
     "field transfer_id: missing"},
    {"TransferIdNotString", "{\"type\":\"release\",\"transfer_id\":12}", 1,
     "field transfer_id: value 12: must be a string"},
    {"TransferIdEmpty", "{\"type\":\"release\",\"transfer_id\":\"\"}", 1,
     "field transfer_id: empty string"},
    {"TransferIdEscapedNul",
     "{\"type\":\"release\",\"transfer_id\":\"a\\u0000b\"}", 1,
     "field transfer_id: byte 0x00 at offset 1"},
    {"TransferIdNewline",
     "{\"type\":\"write_done\",\"transfer_id\":\"a\\nb\"}", 0,
     "byte 0x0a at offset 1"},
    {"EmptyBlockList", kBlocks + "\"block_notify_list\":[]}", 1,
     "field block_notify_list: empty list"},
    {"MissingBlockList", kBlocks.substr(0, kBlocks.size() - 1) + "}", 1,
     "field block_notify_list: missing"},
    {"BlockListNotList", kBlocks + "\"block_notify_list\":7}", 1,
     "field block_notify_list: value 7: must be a list"},
    {"NegativeBlockId", kBlocks + "\"block_notify_list\":[1,-3]}", 1,
     "field block_notify_list[1]: value -3: must be an integer in "
     "0..9007199254740992"},
    {"DoubleBlockId", kBlocks + "\"block_notify_list\":[1.5]}", 1,
     "field block_notify_list[0]: value 1.5"},
    {"ExponentBlockId", kBlocks + "\"block_notify_list\":[1e3]}", 1,
     "field block_notify_list[0]: value 1e3"},
    {"StringBlockId", kBlocks + "\"block_notify_list\":[\"4\"]}", 1,
     "field block_notify_list[0]: value \"4\""},
    {"BlockIdAbove2Pow53", kBlocks + "\"block_notify_list\":[9007199254740993]}",
     1, "larger JSON integers are not exact"},
    {"BlockIdAboveUint64",
     kBlocks + "\"block_notify_list\":[99999999999999999999]}", 1,
     "field block_notify_list[0]"},
    {"DecodeRankNegative",
     "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-1\",\"req_id\":\"r\","
     "\"decode_rank\":-1,\"block_notify_list\":[1]}",
     1, "field decode_rank: value -1: must be an integer in 0..2147483647"},
    {"DecodeRankTooLarge",
     "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-1\",\"req_id\":\"r\","
     "\"decode_rank\":2147483648,\"block_notify_list\":[1]}",
     1, "field decode_rank: value 2147483648"},
    {"DecodeRankMissing",
     "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-1\",\"req_id\":\"r\","
     "\"block_notify_list\":[1]}",
     1, "field decode_rank: missing"},
    {"DoneByNoticeTwo", kBlocks + "\"done_by_notice\":2,\"block_notify_list\":[1]}",
     1, "field done_by_notice: value 2: must be an integer in 0..1"},
    {"DoneByNoticeBool",
     kBlocks + "\"done_by_notice\":true,\"block_notify_list\":[1]}", 1,
     "field done_by_notice: value true"},
    {"ReqIdMissing",
     "{\"type\":\"remote_blocks\",\"transfer_id\":\"tx-1\","
     "\"decode_rank\":0,\"block_notify_list\":[1]}",
     1, "field req_id: missing"},
    {"ConsumerTpSizeZero",
     "{\"type\":\"release\",\"transfer_id\":\"tx-1\",\"consumer_tp_size\":0}",
     1, "field consumer_tp_size: value 0: must be an integer in 1..65535"},
    {"ConsumerTpSizeBool",
     "{\"type\":\"release\",\"transfer_id\":\"tx-1\","
     "\"consumer_tp_size\":true}",
     1, "field consumer_tp_size: value true"},
    {"ReleaseOnConsumer", "{\"type\":\"release\",\"transfer_id\":\"tx-1\"}", 0,
     "type release not accepted by a consumer"},
    {"RemoteBlocksOnConsumer", kBlocks + "\"block_notify_list\":[1]}", 0,
     "type remote_blocks not accepted by a consumer"},
    {"WriteDoneOnProducer", "{\"type\":\"write_done\",\"transfer_id\":\"tx-1\"}",
     1, "type write_done not accepted by a producer"},
    {"EmbeddedNul",
     std::string("{\"type\":\"release\",\"transfer_id\":\"tx") + '\0' +
         "-1\"}",
     1, "embedded NUL byte at offset 35"},
    {"EmbeddedNulLegacy", std::string("tx-1\0junk", 9), 1,
     "embedded NUL byte at offset 4"},
    {"TruncatedJson", "{\"type\":\"release\",\"transfer_id\":\"tx-1\"", 1,
     "truncated JSON"},
    {"TruncatedJsonString", "\"tx-1", 1, "truncated JSON"},
    {"TrailingGarbage", "{\"type\":\"heartbeat\"} x", 1, "invalid JSON"},
    {"TwoObjects", "{\"type\":\"heartbeat\"}{}", 1, "invalid JSON"},
    {"BadJson", "{\"type\":}", 1, "invalid JSON at offset 8"},
    {"InvalidUtf8", "{\"type\":\"heartbeat\",\"x\":\"\xff\xfe\"}", 1,
     "byte 0xff at offset 25: not well-formed UTF-8"},
    // found by fuzz_ctlmsg (corpus/ctlmsg/finding-overlong-utf8): json-c
    // lets the overlong C1 87 through; quoted in an error it made the text
    // (and the reply carrying it) invalid UTF-8
    {"OverlongUtf8", "{\"type\":\"heartbeat\",\"x\":\"A\xc1\x87\"}", 1,
     "byte 0xc1 at offset 26: not well-formed UTF-8"},
    {"SurrogateUtf8", "\"tx\xed\xa0\x80\"", 0,
     "byte 0xed at offset 3: not well-formed UTF-8"},
    {"TooDeep",
     "{\"type\":\"heartbeat\",\"x\":" + std::string(40, '[') +
         std::string(40, ']') + "}",
     1, "invalid JSON"},
    {"JsonStringWithSpace", "\"tx 1\"", 0,
     "field transfer_id (plain string): byte 0x20 at offset 2"},
    {"HeartbeatBadTransferId",
     "{\"type\":\"heartbeat\",\"transfer_id\":[1]}", 0,
     "field transfer_id: value [1]: must be a string"},
};

INSTANTIATE_TEST_SUITE_P(
    Table, MsgReject, ::testing::ValuesIn(kRejects),
    [](const ::testing::TestParamInfo<RejectCase> &info) {
        return std::string(info.param.label);
    });

// The UTF-8 check skips eight ASCII bytes at a time: a bad byte and a good
// multi-byte sequence at every offset around those words are still found
// (with the right offset) and accepted.
TEST(CtlMsg, Utf8CheckAtEveryOffset)
{
    const std::string head = "{\"type\":\"heartbeat\",\"x\":\"";

    for (size_t pad = 0; pad < 24; pad++) {
        std::string good = head + std::string(pad, 'a') + "\xc3\xa9" +
                           std::string(pad % 5, 'b') + "\"}";
        std::string bad  = head + std::string(pad, 'a') + "\xc1\x87" +
                           std::string(pad % 5, 'b') + "\"}";
        std::string cut  = head + std::string(pad, 'a') + "\"}\xe2\x82";
        kvc_msg_t   msg;
        char        want[96];

        EXPECT_EQ(kvc_msg_decode(good.data(), good.size(), 1, &msg), KVX_OK)
            << "pad " << pad << ": " << kvc_last_error();
        if (!HasFailure()) {
            kvc_msg_fini(&msg);
        }
        EXPECT_EQ(kvc_msg_decode(bad.data(), bad.size(), 1, &msg),
                  KVX_ERR_BAD_MESSAGE);
        snprintf(want, sizeof(want),
                 "byte 0xc1 at offset %zu: not well-formed UTF-8",
                 head.size() + pad);
        EXPECT_TRUE(ErrorHas(want)) << "pad " << pad << ": "
                                    << kvc_last_error();
        EXPECT_EQ(kvc_msg_decode(cut.data(), cut.size(), 1, &msg),
                  KVX_ERR_BAD_MESSAGE);
        snprintf(want, sizeof(want),
                 "byte 0xe2 at offset %zu: not well-formed UTF-8",
                 head.size() + pad + 2);
        EXPECT_TRUE(ErrorHas(want)) << "pad " << pad << ": "
                                    << kvc_last_error();
    }
}

TEST(CtlMsg, OversizedRejectedBeforeParsing)
{
    std::vector<char> big(KVC_MSG_MAX_BYTES + 1, 'a');
    kvc_msg_t         msg;
    EXPECT_EQ(kvc_msg_decode(big.data(), big.size(), 1, &msg),
              KVX_ERR_BAD_MESSAGE);
    EXPECT_TRUE(ErrorHas("control message: 4194305 bytes exceeds limit "
                         "4194304"))
        << kvc_last_error();

    // exactly at the limit is parsed (and here rejected for its content)
    big.pop_back();
    EXPECT_EQ(kvc_msg_decode(big.data(), big.size(), 1, &msg),
              KVX_ERR_BAD_MESSAGE);
    EXPECT_TRUE(ErrorHas("length 4194304 exceeds limit 255"))
        << kvc_last_error();
}

TEST(CtlMsg, NeverReadsPastLen)
{
    // a heap buffer of exactly len bytes, no terminator: ASan catches reads
    const std::string json = "{\"type\":\"release\",\"transfer_id\":\"tx-1\"}";
    for (const std::string &s : {json, std::string("tx-77"),
                                 std::string("\"tx-7\""), std::string("{")}) {
        char *buf = static_cast<char *>(malloc(s.size()));
        ASSERT_NE(buf, nullptr);
        memcpy(buf, s.data(), s.size());
        kvc_msg_t msg;
        kvx_status_t st = kvc_msg_decode(buf, s.size(), 1, &msg);
        EXPECT_EQ(st, s == "{" ? KVX_ERR_BAD_MESSAGE : KVX_OK) << s;
        kvc_msg_fini(&msg);
        free(buf);
    }
}

TEST(CtlMsg, DecodeNullArguments)
{
    EXPECT_EQ(kvc_msg_decode("x", 1, 1, nullptr), KVX_ERR_INVALID_PARAM);
    kvc_msg_t msg;
    EXPECT_EQ(kvc_msg_decode(nullptr, 0, 1, &msg), KVX_ERR_BAD_MESSAGE);
    EXPECT_TRUE(ErrorHas("empty message"));
}

// ---------------------------------------------------------------------------
// replies and the handshake request

TEST(CtlReply, RoundTrip)
{
    size_t      len = 0;
    std::string ok  = Take(kvc_reply_encode(1, "ignored", &len));
    EXPECT_EQ(ok, "{\"ok\":true}");
    EXPECT_EQ(len, ok.size());

    int  flag      = -1;
    char reason[64] = "stale";
    ASSERT_EQ(kvc_reply_decode(ok.data(), ok.size(), &flag, reason,
                               sizeof(reason)),
              KVX_OK);
    EXPECT_EQ(flag, 1);
    EXPECT_STREQ(reason, "");

    std::string err =
        Take(kvc_reply_encode(0, "unknown transfer tx-1", nullptr));
    ASSERT_EQ(kvc_reply_decode(err.data(), err.size(), &flag, reason,
                               sizeof(reason)),
              KVX_OK);
    EXPECT_EQ(flag, 0);
    EXPECT_STREQ(reason, "unknown transfer tx-1");

    // truncation to the caller's buffer, control bytes neutralised
    std::string odd = "{\"ok\":false,\"error\":\"line1\\nline2 and more\"}";
    char        small[8];
    ASSERT_EQ(kvc_reply_decode(odd.data(), odd.size(), &flag, small,
                               sizeof(small)),
              KVX_OK);
    EXPECT_STREQ(small, "line1?l");
}

// A hold's reply carries how many more milliseconds the replier holds the
// blocks (0 .. 2^32-1); only an ok reply carries it, and a value out of
// range or of another type is refused naming the field.
TEST(CtlReply, HoldMsRoundTripsAndIsRangeChecked)
{
    for (uint32_t ms : {0u, 1u, 1999u, 4294967295u}) {
        kvc_reply_info_t in{}, out{};
        char             reason[64];
        in.ok       = 1;
        in.instance = 42;
        in.has_hold = 1;
        in.hold_ms  = ms;
        std::string text = Take(kvc_reply_encode_info(&in, "", nullptr));
        ASSERT_EQ(kvc_reply_decode_info(text.data(), text.size(), &out, reason,
                                        sizeof(reason)),
                  KVX_OK)
            << text << ": " << kvc_last_error();
        EXPECT_EQ(out.has_hold, 1) << text;
        EXPECT_EQ(out.hold_ms, ms) << text;
        EXPECT_EQ(out.instance, 42u);
    }
    kvc_reply_info_t none{}, out{};
    char             reason[64];
    none.ok = 1;
    std::string plain = Take(kvc_reply_encode_info(&none, "", nullptr));
    EXPECT_EQ(plain.find("hold_ms"), std::string::npos) << plain;
    ASSERT_EQ(kvc_reply_decode_info(plain.data(), plain.size(), &out, reason,
                                    sizeof(reason)),
              KVX_OK);
    EXPECT_EQ(out.has_hold, 0);
    kvc_reply_info_t refused{};
    refused.has_hold = 1;
    refused.hold_ms  = 5;
    std::string no = Take(kvc_reply_encode_info(&refused, "ended", nullptr));
    EXPECT_EQ(no.find("hold_ms"), std::string::npos) << no;
    for (const char *bad : {R"({"ok":true,"hold_ms":4294967296})",
                            R"({"ok":true,"hold_ms":-1})",
                            R"({"ok":true,"hold_ms":"5"})",
                            R"({"ok":true,"hold_ms":1.5})"}) {
        EXPECT_EQ(kvc_reply_decode_info(bad, strlen(bad), &out, reason,
                                        sizeof(reason)),
                  KVX_ERR_BAD_MESSAGE)
            << bad;
        EXPECT_TRUE(ErrorHas("hold_ms")) << bad << ": " << kvc_last_error();
    }
}

// Issue 15, defect 2 (reproducer tests/fuzz/corpus/ctlmsg/defect2-*): the
// JSON string "{" decoded to write_done with id "{", re-encoded as raw "{",
// which decodes as truncated JSON. An id that raw text would misread ('{'
// or '"' first) is encoded as a JSON string; every legacy id round-trips.
TEST(CtlMsg, LegacyIdThatReadsAsJsonRoundTripsAsJsonString)
{
    const char *inputs[] = {"\"{\"", "\"{tx\"", "\"\\\"q\"", "\"x{\""};
    for (const char *in : inputs) {
        for (int prod = 0; prod <= 1; prod++) {
            kvc_msg_t msg, back;
            ASSERT_EQ(kvc_msg_decode(in, strlen(in), prod, &msg), KVX_OK)
                << in << ": " << kvc_last_error();
            std::string text = EncodeMsg(msg);
            ASSERT_EQ(kvc_msg_decode(text.data(), text.size(), prod, &back),
                      KVX_OK)
                << in << " -> " << text << ": " << kvc_last_error();
            EXPECT_EQ(back.type, msg.type);
            EXPECT_EQ(back.legacy, 1);
            EXPECT_STREQ(back.transfer_id, msg.transfer_id);
            EXPECT_EQ(EncodeMsg(back), text);
        }
    }
    kvc_msg_t msg;
    ASSERT_EQ(kvc_msg_decode("\"{\"", 3, 0, &msg), KVX_OK);
    EXPECT_STREQ(msg.transfer_id, "{");
    EXPECT_EQ(EncodeMsg(msg), "\"{\"");
}

// Issue 15, defect 3 (reproducer tests/fuzz/corpus/reply/defect3-*): a
// decoder error quoted a value cut at 64 bytes inside a multi-byte
// character, and the reply carrying it was invalid UTF-8, so the peer lost
// the reason. The quote ends on a character boundary, and the reply encoder
// makes any reason valid UTF-8.
TEST(CtlReply, ErrorQuotingMultiByteValueStaysDecodable)
{
    std::string value = "a";
    for (int i = 0; i < 40; i++) {
        value += "\xc3\xa9"; // é
    }
    const std::string in =
        "{\"type\":\"release\",\"transfer_id\":[\"" + value + "\"]}";
    kvc_msg_t msg;
    ASSERT_EQ(kvc_msg_decode(in.data(), in.size(), 1, &msg),
              KVX_ERR_BAD_MESSAGE);
    const std::string err = kvc_last_error();
    // ["a then 30 whole é: 63 bytes, not 64 ending in half a character
    EXPECT_NE(err.find("[\"a" + value.substr(1, 60) + ": must"), std::string::npos)
        << err;

    // found by fuzz_ctlmsg (corpus/ctlmsg/finding-cut-at-window-edge): a
    // character starting at byte 63 of the quote was cut too
    const std::string edge = "{\"type\":\"" + std::string(62, 'x') +
                             "\xee\xa2\xa2yz\"}";
    ASSERT_EQ(kvc_msg_decode(edge.data(), edge.size(), 1, &msg),
              KVX_ERR_BAD_MESSAGE);
    const std::string edge_err = kvc_last_error();
    EXPECT_EQ(edge_err.substr(edge_err.size() - 76),
              "unknown type \"" + std::string(62, 'x'))
        << edge_err;

    size_t      len = 0;
    std::string reply = Take(kvc_reply_encode(0, err.c_str(), &len));
    int         flag  = -1;
    char        reason[512];
    ASSERT_EQ(kvc_reply_decode(reply.data(), reply.size(), &flag, reason,
                               sizeof(reason)),
              KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(flag, 0);
    EXPECT_EQ(std::string(reason), err);

    // invalid UTF-8 of any kind: replaced byte by byte with '?'
    const std::string bad = "x\xc3" "y\xff\xed\xa0\x80z\xf0\x9f\x98\x80";
    reply = Take(kvc_reply_encode(0, bad.c_str(), &len));
    ASSERT_EQ(kvc_reply_decode(reply.data(), reply.size(), &flag, reason,
                               sizeof(reason)),
              KVX_OK)
        << kvc_last_error();
    EXPECT_STREQ(reason, "x?y????z\xf0\x9f\x98\x80");
}

TEST(CtlReply, RejectsGarbage)
{
    const struct {
        std::string input;
        const char *reason;
    } cases[] = {
        {"garbage", "invalid JSON"},
        {"", "empty message"},
        {"[true]", "not a JSON object"},
        {"\"ok\"", "not a JSON object"},
        {"null", "JSON null"},
        {"{}", "field ok: missing"},
        {"{\"ok\":1}", "field ok: value 1: must be a boolean"},
        {"{\"ok\":false}", "field error: missing"},
        {"{\"ok\":false,\"error\":5}", "field error: value 5: must be a string"},
        {"{\"ok\":true", "truncated JSON"},
    };
    for (const auto &c : cases) {
        int  flag = -1;
        char reason[32];
        EXPECT_EQ(kvc_reply_decode(c.input.data(), c.input.size(), &flag,
                                   reason, sizeof(reason)),
                  KVX_ERR_BAD_MESSAGE)
            << c.input;
        EXPECT_TRUE(ErrorHas(c.reason)) << c.input << ": " << kvc_last_error();
        EXPECT_TRUE(ErrorHas("control reply")) << kvc_last_error();
        EXPECT_EQ(flag, -1);
    }
}

TEST(CtlHsRequest, RoundTripAndRejects)
{
    size_t      len  = 0;
    std::string text = Take(kvc_hs_request_encode(&len));
    EXPECT_EQ(text, "{\"type\":\"get_meta\",\"version\":2}");
    EXPECT_EQ(len, text.size());
    uint32_t version = 0;
    ASSERT_EQ(kvc_hs_request_decode(text.data(), text.size(), &version),
              KVX_OK);
    EXPECT_EQ(version, static_cast<uint32_t>(KVC_PROTO_VERSION));

    std::string v7 = "{\"version\":7,\"type\":\"get_meta\"}";
    ASSERT_EQ(kvc_hs_request_decode(v7.data(), v7.size(), &version), KVX_OK);
    EXPECT_EQ(version, 7u);

    const struct {
        std::string input;
        const char *reason;
    } cases[] = {
        {"get_meta_msg", "invalid JSON"},
        {"{\"type\":\"meta\",\"version\":1}", "must be \"get_meta\""},
        {"{\"version\":1}", "field type: missing"},
        {"{\"type\":\"get_meta\"}", "field version: missing"},
        {"{\"type\":\"get_meta\",\"version\":-1}", "field version: value -1"},
        {"{\"type\":\"get_meta\",\"version\":4294967296}",
         "field version: value 4294967296"},
    };
    for (const auto &c : cases) {
        version = 99;
        EXPECT_EQ(kvc_hs_request_decode(c.input.data(), c.input.size(),
                                        &version),
                  KVX_ERR_BAD_MESSAGE)
            << c.input;
        EXPECT_TRUE(ErrorHas(c.reason)) << c.input << ": " << kvc_last_error();
        EXPECT_EQ(version, 99u);
    }
}

// ---------------------------------------------------------------------------
// handshake metadata

kvc_geom_t MakeGeom(kvc_layout_kind_t kind, uint64_t num_blocks,
                    uint64_t block_len)
{
    kvc_geom_t g{};
    g.kind                = kind;
    g.num_blocks          = num_blocks;
    g.block_len           = block_len;
    g.block_stride        = block_len * 2;
    g.kv_stride           = block_len * num_blocks;
    g.transfers_per_block = kind == KVC_LAYOUT_SPLIT ? 2 : 1;
    g.elem_size           = 2;
    g.block_size          = 16;
    g.kernel_block_size   = kind == KVC_LAYOUT_SPLIT_KERNEL ? 8 : 16;
    g.num_kv_heads        = 8;
    g.head_size           = 128;
    g.head_size_v         = kind == KVC_LAYOUT_PACKED ? 64 : 128;
    g.key_only            = kind == KVC_LAYOUT_KEY_ONLY ? 1 : 0;
    return g;
}

// MetaFixture owns a meta with three layers of different kinds.
class CtlMeta : public ::testing::Test {
protected:
    void SetUp() override
    {
        static const kvc_layout_kind_t kinds[] = {
            KVC_LAYOUT_SPLIT, KVC_LAYOUT_KEY_ONLY, KVC_LAYOUT_PACKED};
        meta_ = kvc_hs_meta_t{};
        layers_.clear();
        meta_.version = KVC_PROTO_VERSION;
        snprintf(meta_.engine_id, sizeof(meta_.engine_id), "10.0.0.1:6301");
        snprintf(meta_.host, sizeof(meta_.host), "10.0.0.1");
        meta_.handshake_port = 6301;
        meta_.notify_port    = 61005;
        meta_.dp_rank        = 1;
        meta_.dp_size        = 2;
        meta_.tp_rank        = 3;
        meta_.tp_size        = 4;
        meta_.is_producer    = 1;
        meta_.epoch          = 0xfedcba9876543210ull; // > 2^63
        addr_.assign({0x00, 0xff, 0x10, 0x20, 0x7f});
        meta_.worker_addr     = addr_.data();
        meta_.worker_addr_len = addr_.size();
        for (size_t i = 0; i < 3; i++) {
            kvc_hs_layer_t l{};
            snprintf(l.name, sizeof(l.name), "model.layers.%zu.attn", i);
            l.base     = 0xffff800000000000ull + i * 0x100000; // > 2^53
            l.length   = 1ull << 40;
            rkeys_[i]  = std::vector<uint8_t>(17 + i, uint8_t(0xa0 + i));
            rkeys_[i][0] = 0;
            l.rkey     = rkeys_[i].data();
            l.rkey_len = rkeys_[i].size();
            l.mem_type = i == 2 ? KVX_MEM_ROCM : KVX_MEM_HOST;
            l.geom     = MakeGeom(kinds[i], 1000 + i, 4096 * (i + 1));
            layers_.push_back(l);
        }
        meta_.layers     = layers_.data();
        meta_.num_layers = layers_.size();
        Redigest();
    }

    void Redigest()
    {
        meta_.digest = kvc_hs_digest(meta_.layers, meta_.num_layers);
    }

    std::string Encode()
    {
        size_t len  = 0;
        char  *text = kvc_hs_encode(&meta_, &len);
        EXPECT_NE(text, nullptr);
        if (text == nullptr) {
            return "";
        }
        EXPECT_EQ(len, strlen(text));
        return Take(text);
    }

    void ExpectReject(const std::string &text, const char *reason)
    {
        kvc_hs_meta_t out;
        memset(&out, 0x5a, sizeof(out));
        kvc_error_clear();
        EXPECT_EQ(kvc_hs_decode(text.data(), text.size(), &out),
                  KVX_ERR_BAD_MESSAGE);
        EXPECT_TRUE(ErrorHas(reason))
            << "reason '" << kvc_last_error() << "' lacks '" << reason << "'";
        EXPECT_TRUE(ErrorHas("handshake metadata")) << kvc_last_error();
        EXPECT_EQ(out.layers, nullptr);
        EXPECT_EQ(out.worker_addr, nullptr);
        kvc_hs_fini(&out); // no-op
    }

    kvc_hs_meta_t               meta_{};
    std::vector<uint8_t>        addr_;
    std::vector<uint8_t>        rkeys_[3];
    std::vector<kvc_hs_layer_t> layers_;
};

// Replace the first occurrence of `from` in `s` (which must be present).
std::string Replace(std::string s, const std::string &from,
                    const std::string &to)
{
    size_t pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    if (pos != std::string::npos) {
        s.replace(pos, from.size(), to);
    }
    return s;
}

void ExpectGeomEq(const kvc_geom_t &a, const kvc_geom_t &b)
{
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.num_blocks, b.num_blocks);
    EXPECT_EQ(a.block_len, b.block_len);
    EXPECT_EQ(a.block_stride, b.block_stride);
    EXPECT_EQ(a.kv_stride, b.kv_stride);
    EXPECT_EQ(a.transfers_per_block, b.transfers_per_block);
    EXPECT_EQ(a.elem_size, b.elem_size);
    EXPECT_EQ(a.block_size, b.block_size);
    EXPECT_EQ(a.kernel_block_size, b.kernel_block_size);
    EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
    EXPECT_EQ(a.head_size, b.head_size);
    EXPECT_EQ(a.head_size_v, b.head_size_v);
    EXPECT_EQ(a.key_only, b.key_only);
}

TEST_F(CtlMeta, RoundTripThreeLayers)
{
    std::string   text = Encode();
    kvc_hs_meta_t out;
    ASSERT_EQ(kvc_hs_decode(text.data(), text.size(), &out), KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(out.version, meta_.version);
    EXPECT_EQ(out.digest, meta_.digest);
    EXPECT_STREQ(out.engine_id, meta_.engine_id);
    EXPECT_STREQ(out.host, meta_.host);
    EXPECT_EQ(out.handshake_port, 6301u);
    EXPECT_EQ(out.notify_port, 61005u);
    EXPECT_EQ(out.dp_rank, 1u);
    EXPECT_EQ(out.dp_size, 2u);
    EXPECT_EQ(out.tp_rank, 3u);
    EXPECT_EQ(out.tp_size, 4u);
    EXPECT_EQ(out.is_producer, 1u);
    EXPECT_EQ(out.epoch, 0xfedcba9876543210ull);
    ASSERT_EQ(out.worker_addr_len, addr_.size());
    EXPECT_EQ(0, memcmp(out.worker_addr, addr_.data(), addr_.size()));
    ASSERT_EQ(out.num_layers, 3u);
    for (size_t i = 0; i < 3; i++) {
        const kvc_hs_layer_t &a = out.layers[i];
        const kvc_hs_layer_t &b = layers_[i];
        EXPECT_STREQ(a.name, b.name);
        EXPECT_EQ(a.base, b.base);
        EXPECT_EQ(a.length, b.length);
        EXPECT_EQ(a.mem_type, b.mem_type);
        ASSERT_EQ(a.rkey_len, b.rkey_len);
        EXPECT_EQ(0, memcmp(a.rkey, b.rkey, b.rkey_len));
        EXPECT_NE(a.rkey, b.rkey); // a decoded copy, owned by out
        ExpectGeomEq(a.geom, b.geom);
    }
    // 64-bit values travel as decimal strings
    EXPECT_NE(text.find("\"epoch\":\"18364758544493064720\""),
              std::string::npos)
        << text;
    kvc_hs_fini(&out);
    EXPECT_EQ(out.layers, nullptr);
    EXPECT_EQ(out.num_layers, 0u);
    kvc_hs_fini(&out); // idempotent
}

TEST_F(CtlMeta, RoundTripConsumerNoLayers)
{
    meta_.is_producer = 0;
    meta_.num_layers  = 0;
    meta_.layers      = nullptr;
    Redigest();
    std::string   text = Encode();
    kvc_hs_meta_t out;
    ASSERT_EQ(kvc_hs_decode(text.data(), text.size(), &out), KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(out.is_producer, 0u);
    EXPECT_EQ(out.num_layers, 0u);
    EXPECT_EQ(out.layers, nullptr);
    kvc_hs_fini(&out);
}

TEST_F(CtlMeta, RejectsStructFaults)
{
    const struct {
        const char *label;
        void (*mutate)(kvc_hs_meta_t *m);
        const char *reason;
    } cases[] = {
        {"DigestMismatch", [](kvc_hs_meta_t *m) { m->digest ^= 1; },
         "digest mismatch"},
        {"TpRankTooLarge", [](kvc_hs_meta_t *m) { m->tp_rank = 4; },
         "field tp_rank: value 4: must be below tp_size 4"},
        {"DpRankTooLarge", [](kvc_hs_meta_t *m) { m->dp_rank = 2; },
         "field dp_rank: value 2: must be below dp_size 2"},
        {"TpSizeZero",
         [](kvc_hs_meta_t *m) {
             m->tp_size = 0;
             m->tp_rank = 0;
         },
         "field tp_size: value 0: must be an integer in 1..2147483647"},
        {"PortZero", [](kvc_hs_meta_t *m) { m->notify_port = 0; },
         "field notify_port: value 0: must be an integer in 1..65535"},
        {"PortTooLarge", [](kvc_hs_meta_t *m) { m->handshake_port = 70000; },
         "field handshake_port: value 70000"},
        {"EmptyWorkerAddr", [](kvc_hs_meta_t *m) { m->worker_addr_len = 0; },
         "field worker_addr: empty"},
        {"EmptyRkey", [](kvc_hs_meta_t *m) { m->layers[1].rkey_len = 0; },
         "field layers[1].rkey: empty"},
        {"EmptyHost", [](kvc_hs_meta_t *m) { m->host[0] = '\0'; },
         "field host: empty string"},
        {"EmptyEngineId", [](kvc_hs_meta_t *m) { m->engine_id[0] = '\0'; },
         "field engine_id: empty string"},
        {"EmptyLayerName",
         [](kvc_hs_meta_t *m) {
             m->layers[2].name[0] = '\0';
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[2].name: empty string"},
        {"DuplicateLayerName",
         [](kvc_hs_meta_t *m) {
             snprintf(m->layers[2].name, sizeof(m->layers[2].name), "%s",
                      m->layers[0].name);
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[2].name: value \"model.layers.0.attn\": duplicate of "
         "layers[0]"},
        {"GeomKindZero",
         [](kvc_hs_meta_t *m) {
             m->layers[0].geom.kind = static_cast<kvc_layout_kind_t>(0);
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[0].geom.kind: value 0: must be an integer in 1..6"},
        {"GeomKindSeven",
         [](kvc_hs_meta_t *m) {
             m->layers[0].geom.kind = static_cast<kvc_layout_kind_t>(7);
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[0].geom.kind: value 7"},
        {"BlockLenZero",
         [](kvc_hs_meta_t *m) {
             m->layers[1].geom.block_len = 0;
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[1].geom.block_len: value 0"},
        {"TpbThree",
         [](kvc_hs_meta_t *m) {
             m->layers[1].geom.transfers_per_block = 3;
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[1].geom.tpb: value 3: must be an integer in 1..2"},
        {"ElemSizeThree",
         [](kvc_hs_meta_t *m) {
             m->layers[2].geom.elem_size = 3;
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[2].geom.elem_size: value 3: must be 1, 2, 4 or 8"},
        {"ElemSizeSixteen",
         [](kvc_hs_meta_t *m) {
             m->layers[2].geom.elem_size = 16;
             m->digest = kvc_hs_digest(m->layers, m->num_layers);
         },
         "field layers[2].geom.elem_size: value 16"},
        {"MemTypeUnknown", [](kvc_hs_meta_t *m) { m->layers[0].mem_type = 2; },
         "field layers[0].mem_type: value 2"},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.label);
        SetUp(); // fresh copy of the valid meta
        c.mutate(&meta_);
        ExpectReject(Encode(), c.reason);
    }
}

TEST_F(CtlMeta, RejectsTextFaults)
{
    const std::string good = Encode();
    const struct {
        const char *label;
        std::string from, to;
        const char *reason;
    } cases[] = {
        {"BadBase64Length", "\"rkey\":\"", "\"rkey\":\"!",
         "field layers[0].rkey: base64: length 25 is not a multiple of 4"},
        {"BadBase64Alphabet", "\"worker_addr\":\"", "\"worker_addr\":\"!!!!",
         "field worker_addr: base64: character 0x21 at offset 0: not in the "
         "alphabet"},
        {"MissingEpoch", "\"epoch\":", "\"epochs\":", "field epoch: missing"},
        {"MissingVersion", "\"version\":", "\"versio\":",
         "field version: missing"},
        {"MissingGeom", "\"geom\":", "\"geometry\":",
         "field layers[0].geom: missing"},
        {"MissingNumBlocks", "\"num_blocks\":", "\"nb\":",
         "field layers[0].geom.num_blocks: missing"},
        {"EpochNotDecimal", "\"epoch\":\"", "\"epoch\":\"x",
         "field epoch: value \"x"},
        {"EpochNumber", "\"epoch\":\"18364758544493064720\"", "\"epoch\":5",
         "field epoch: value 5: must be a string"},
        {"EpochOverflow", "\"epoch\":\"18364758544493064720\"",
         "\"epoch\":\"18446744073709551616\"", "field epoch: value"},
        {"DigestLeadingZero", "\"digest\":\"", "\"digest\":\"0",
         "field digest: value \"0"},
        {"IsProducerInt", "\"is_producer\":true", "\"is_producer\":1",
         "field is_producer: value 1: must be a boolean"},
        {"LayersNotList", "\"layers\":[", "\"layers\":7,\"x\":[",
         "field layers: value 7: must be a list"},
        {"LayerNotObject", "\"layers\":[", "\"layers\":[3,",
         "field layers[0]: value 3: must be an object"},
        {"NameTooLong", "\"name\":\"", "\"name\":\"" + std::string(128, 'n'),
         "field layers[0].name: length"},
        {"NotObject", good, "[1,2]", "not a JSON object"},
        {"Truncated", good, good.substr(0, good.size() - 2),
         "truncated JSON"},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.label);
        ExpectReject(Replace(good, c.from, c.to), c.reason);
    }
}

TEST_F(CtlMeta, RejectsTooManyLayers)
{
    layers_.resize(4097);
    for (size_t i = 0; i < layers_.size(); i++) {
        layers_[i] = layers_[i % 3];
        snprintf(layers_[i].name, sizeof(layers_[i].name), "l%zu", i);
    }
    meta_.layers     = layers_.data();
    meta_.num_layers = layers_.size();
    Redigest();
    ExpectReject(Encode(), "field layers: 4097 entries exceeds limit 4096");

    // 4096 is accepted
    meta_.num_layers = 4096;
    Redigest();
    std::string   text = Encode();
    kvc_hs_meta_t out;
    ASSERT_EQ(kvc_hs_decode(text.data(), text.size(), &out), KVX_OK)
        << kvc_last_error();
    EXPECT_EQ(out.num_layers, 4096u);
    kvc_hs_fini(&out);
}

TEST_F(CtlMeta, DigestCoversShapeNotSize)
{
    const uint64_t base = kvc_hs_digest(meta_.layers, meta_.num_layers);
    EXPECT_EQ(base, meta_.digest);
    EXPECT_NE(base, kvc_hs_digest(meta_.layers, 2));

    const struct {
        const char *label;
        void (*mutate)(kvc_hs_layer_t *l);
        bool changes;
    } cases[] = {
        {"NumBlocks", [](kvc_hs_layer_t *l) { l->geom.num_blocks += 7; },
         false},
        {"BlockStride", [](kvc_hs_layer_t *l) { l->geom.block_stride *= 2; },
         false},
        {"KvStride", [](kvc_hs_layer_t *l) { l->geom.kv_stride += 4096; },
         false},
        {"Base", [](kvc_hs_layer_t *l) { l->base += 4096; }, false},
        {"Length", [](kvc_hs_layer_t *l) { l->length *= 2; }, false},
        {"Rkey", [](kvc_hs_layer_t *l) { l->rkey_len = 1; }, false},
        {"BlockLen", [](kvc_hs_layer_t *l) { l->geom.block_len += 2; }, true},
        {"Kind",
         [](kvc_hs_layer_t *l) { l->geom.kind = KVC_LAYOUT_INTERLEAVED; },
         true},
        {"ElemSize", [](kvc_hs_layer_t *l) { l->geom.elem_size = 4; }, true},
        {"BlockSize", [](kvc_hs_layer_t *l) { l->geom.block_size = 32; },
         true},
        {"KernelBlockSize",
         [](kvc_hs_layer_t *l) { l->geom.kernel_block_size = 4; }, true},
        {"NumKvHeads", [](kvc_hs_layer_t *l) { l->geom.num_kv_heads = 4; },
         true},
        {"HeadSize", [](kvc_hs_layer_t *l) { l->geom.head_size = 64; }, true},
        {"HeadSizeV", [](kvc_hs_layer_t *l) { l->geom.head_size_v = 32; },
         true},
        {"KeyOnly", [](kvc_hs_layer_t *l) { l->geom.key_only ^= 1; }, true},
        {"Tpb",
         [](kvc_hs_layer_t *l) { l->geom.transfers_per_block ^= 3; }, true},
        {"Name", [](kvc_hs_layer_t *l) { l->name[0] = 'M'; }, true},
    };
    for (const auto &c : cases) {
        SCOPED_TRACE(c.label);
        std::vector<kvc_hs_layer_t> copy = layers_;
        c.mutate(&copy[1]);
        uint64_t d = kvc_hs_digest(copy.data(), copy.size());
        EXPECT_EQ(d != base, c.changes);
    }
}

TEST(CtlDigest, KnownValues)
{
    // FNV-1a 64 offset basis for no layers
    EXPECT_EQ(kvc_hs_digest(nullptr, 0), 0xcbf29ce484222325ull);

    // one layer named "a", all-zero geometry: hash of the bytes
    // 'a' 00 | kind(4) | block_len(8) | 8 x u32, all zero
    kvc_hs_layer_t l{};
    l.name[0] = 'a';
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char bytes0[2] = {'a', 0};
    for (unsigned char b : bytes0) {
        h = (h ^ b) * 0x100000001b3ull;
    }
    for (int i = 0; i < 4 + 8 + 8 * 4; i++) {
        h = (h ^ 0) * 0x100000001b3ull;
    }
    EXPECT_EQ(kvc_hs_digest(&l, 1), h);

    // little-endian field order: block_len = 0x0102 hashes 02 01 00 ...
    l.geom.block_len = 0x0102;
    h                = 0xcbf29ce484222325ull;
    std::vector<unsigned char> seq = {'a', 0, 0, 0, 0, 0, 2, 1};
    seq.resize(2 + 4 + 8 + 8 * 4, 0);
    for (unsigned char b : seq) {
        h = (h ^ b) * 0x100000001b3ull;
    }
    EXPECT_EQ(kvc_hs_digest(&l, 1), h);
}

// ---------------------------------------------------------------------------
// base64

TEST(CtlBase64, Rfc4648Vectors)
{
    const struct {
        const char *plain, *coded;
    } vectors[] = {
        {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
        {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
        {"foobar", "Zm9vYmFy"},
    };
    for (const auto &v : vectors) {
        SCOPED_TRACE(v.plain);
        std::string enc = Take(kvc_b64_encode(
            reinterpret_cast<const uint8_t *>(v.plain), strlen(v.plain)));
        EXPECT_EQ(enc, v.coded);

        uint8_t *data = nullptr;
        size_t   len  = 99;
        ASSERT_EQ(kvc_b64_decode(v.coded, strlen(v.coded), &data, &len),
                  KVX_OK)
            << kvc_last_error();
        ASSERT_NE(data, nullptr);
        EXPECT_EQ(std::string(reinterpret_cast<char *>(data), len), v.plain);
        free(data);
    }
}

TEST(CtlBase64, AllByteValuesRoundTrip)
{
    std::vector<uint8_t> all(256);
    for (size_t i = 0; i < all.size(); i++) {
        all[i] = static_cast<uint8_t>(i);
    }
    for (size_t n = 0; n <= all.size(); n += 37) {
        std::string enc = Take(kvc_b64_encode(all.data(), n));
        EXPECT_EQ(enc.size(), (n + 2) / 3 * 4);
        uint8_t *data = nullptr;
        size_t   len  = 0;
        ASSERT_EQ(kvc_b64_decode(enc.data(), enc.size(), &data, &len), KVX_OK);
        ASSERT_EQ(len, n);
        EXPECT_EQ(0, memcmp(data, all.data(), n));
        free(data);
    }
}

TEST(CtlBase64, RejectsBadInput)
{
    const struct {
        std::string text;
        const char *reason;
    } cases[] = {
        {"Zg=", "length 3 is not a multiple of 4"},
        {"Zm9vY", "length 5 is not a multiple of 4"},
        {"Zm9v!A==", "character 0x21 at offset 4: not in the alphabet"},
        {"Zm9v YE=", "character 0x20 at offset 4"},
        {"Zm-_", "character 0x2d at offset 2"},
        {"Zg==Zg==", "padding 0x3d at offset 2"},
        {"Z===", "padding 0x3d at offset 1"},
        {"====", "padding 0x3d at offset 0"},
        {"Zm=v", "padding 0x3d at offset 2"},
        {"Zh==", "non-zero unused bits"},
        {"Zm9=", "non-zero unused bits"},
        {std::string("Zg\0=", 4), "character 0x00 at offset 2"},
    };
    for (const auto &c : cases) {
        uint8_t *data = reinterpret_cast<uint8_t *>(0x1);
        size_t   len  = 7;
        EXPECT_EQ(kvc_b64_decode(c.text.data(), c.text.size(), &data, &len),
                  KVX_ERR_BAD_MESSAGE)
            << c.text;
        EXPECT_TRUE(ErrorHas(c.reason)) << c.text << ": " << kvc_last_error();
        EXPECT_TRUE(ErrorHas("base64")) << kvc_last_error();
        EXPECT_EQ(data, reinterpret_cast<uint8_t *>(0x1)); // untouched
        EXPECT_EQ(len, 7u);
    }
}

// ---------------------------------------------------------------------------
// idset

TEST(CtlIdSet, EvictsOldestAtCapacity)
{
    kvc_idset_t set;
    ASSERT_EQ(kvc_idset_init(&set, 3), KVX_OK);
    EXPECT_EQ(set.cap, 3u);
    EXPECT_EQ(set.count, 0u);
    EXPECT_FALSE(kvc_idset_contains(&set, "a"));

    for (const char *id : {"a", "b", "c"}) {
        ASSERT_EQ(kvc_idset_add(&set, id), KVX_OK);
    }
    EXPECT_EQ(set.count, 3u);
    // re-adding a present id is a no-op: nothing is evicted
    ASSERT_EQ(kvc_idset_add(&set, "a"), KVX_OK);
    EXPECT_EQ(set.count, 3u);
    EXPECT_TRUE(kvc_idset_contains(&set, "a"));

    ASSERT_EQ(kvc_idset_add(&set, "d"), KVX_OK); // evicts a
    EXPECT_EQ(set.count, 3u);
    EXPECT_FALSE(kvc_idset_contains(&set, "a"));
    for (const char *id : {"b", "c", "d"}) {
        EXPECT_TRUE(kvc_idset_contains(&set, id)) << id;
    }
    ASSERT_EQ(kvc_idset_add(&set, "e"), KVX_OK); // evicts b
    ASSERT_EQ(kvc_idset_add(&set, "f"), KVX_OK); // evicts c
    EXPECT_FALSE(kvc_idset_contains(&set, "b"));
    EXPECT_FALSE(kvc_idset_contains(&set, "c"));
    for (const char *id : {"d", "e", "f"}) {
        EXPECT_TRUE(kvc_idset_contains(&set, id)) << id;
    }
    EXPECT_FALSE(kvc_idset_contains(&set, "de")); // exact match only
    kvc_idset_fini(&set);
    EXPECT_EQ(set.ids, nullptr);
    kvc_idset_fini(&set); // zeroed: no-op
}

TEST(CtlIdSet, LargeSetKeepsLastCap)
{
    const size_t cap = 4096;
    kvc_idset_t  set;
    ASSERT_EQ(kvc_idset_init(&set, cap), KVX_OK);
    char id[32];
    for (size_t i = 0; i < cap + 100; i++) {
        snprintf(id, sizeof(id), "tx-%zu", i);
        ASSERT_EQ(kvc_idset_add(&set, id), KVX_OK);
    }
    EXPECT_EQ(set.count, cap);
    for (size_t i : {size_t(0), size_t(99)}) {
        snprintf(id, sizeof(id), "tx-%zu", i);
        EXPECT_FALSE(kvc_idset_contains(&set, id)) << id;
    }
    for (size_t i : {size_t(100), size_t(2000), cap + 99}) {
        snprintf(id, sizeof(id), "tx-%zu", i);
        EXPECT_TRUE(kvc_idset_contains(&set, id)) << id;
    }
    kvc_idset_fini(&set);
}

TEST(CtlIdSet, RejectsBadArguments)
{
    kvc_idset_t set;
    EXPECT_EQ(kvc_idset_init(&set, 0), KVX_ERR_INVALID_PARAM);
    EXPECT_TRUE(ErrorHas("capacity 0")) << kvc_last_error();
    EXPECT_EQ(set.ids, nullptr);
    ASSERT_EQ(kvc_idset_init(&set, 1), KVX_OK);
    EXPECT_EQ(kvc_idset_add(&set, nullptr), KVX_ERR_INVALID_PARAM);
    EXPECT_FALSE(kvc_idset_contains(&set, nullptr));
    ASSERT_EQ(kvc_idset_add(&set, "x"), KVX_OK);
    ASSERT_EQ(kvc_idset_add(&set, "y"), KVX_OK);
    EXPECT_FALSE(kvc_idset_contains(&set, "x"));
    EXPECT_TRUE(kvc_idset_contains(&set, "y"));
    EXPECT_EQ(set.count, 1u);
    kvc_idset_fini(&set);
}

} // namespace

namespace {

// The hash index must agree with the FIFO ring under eviction churn.
TEST(CtlIdSetModel, RandomChurnMatchesAFifoModel)
{
    for (size_t cap : {1u, 2u, 7u, 37u, 300u}) {
        kvc_idset_t set;
        ASSERT_EQ(KVX_OK, kvc_idset_init(&set, cap));
        std::deque<std::string> fifo;
        unsigned                seed = 12345u + (unsigned)cap;
        for (int step = 0; step < 20000; step++) {
            seed = seed * 1103515245u + 12345u;
            std::string id = "tx-" + std::to_string((seed >> 8) % (3 * cap + 5));
            bool in_model = std::find(fifo.begin(), fifo.end(), id) != fifo.end();
            ASSERT_EQ(in_model, kvc_idset_contains(&set, id.c_str()) != 0)
                << "cap " << cap << " step " << step << " id " << id;
            if ((seed >> 4) % 3 != 0) {
                ASSERT_EQ(KVX_OK, kvc_idset_add(&set, id.c_str()));
                if (!in_model) {
                    if (fifo.size() == cap) {
                        fifo.pop_front();
                    }
                    fifo.push_back(id);
                }
            }
        }
        kvc_idset_fini(&set);
    }
}

} // namespace

// The handshake responder adds the requester's data-plane session to its
// encoded metadata (kvc_hs_with_session); the requester decodes it, and
// metadata without one decodes as session 0.
TEST_F(CtlMeta, SessionIsAddedPerRequesterAndDecoded)
{
    std::string   text = Encode();
    kvc_hs_meta_t out;

    ASSERT_EQ(kvc_hs_decode(text.data(), text.size(), &out), KVX_OK);
    EXPECT_EQ(out.session, 0u);
    EXPECT_EQ(text.find("session"), std::string::npos);
    kvc_hs_fini(&out);

    size_t len  = 0;
    char  *with = kvc_hs_with_session(text.data(), text.size(),
                                      0xfedcba9876543211ull,
                                      "10.0.2.1:40123", &len);
    ASSERT_NE(with, nullptr);
    EXPECT_EQ(len, strlen(with));
    ASSERT_EQ(kvc_hs_decode(with, len, &out), KVX_OK) << kvc_last_error();
    EXPECT_EQ(out.session, 0xfedcba9876543211ull);
    EXPECT_STREQ(out.seen_as, "10.0.2.1:40123");
    EXPECT_EQ(out.epoch, 0xfedcba9876543210ull); // the rest unchanged
    EXPECT_EQ(out.num_layers, 3u);
    kvc_hs_fini(&out);
    free(with);

    // Only an object takes a member; "{}" takes no comma. A seen_as that
    // is no address (or none) is left out.
    with = kvc_hs_with_session("{}", 2, 7, nullptr, &len);
    ASSERT_NE(with, nullptr);
    EXPECT_STREQ(with, "{\"session\":\"7\"}");
    free(with);
    with = kvc_hs_with_session("{}", 2, 7, "a\"b", &len);
    ASSERT_NE(with, nullptr);
    EXPECT_STREQ(with, "{\"session\":\"7\"}");
    free(with);
    with = kvc_hs_with_session("{}", 2, 7, "[::1]:80", &len);
    ASSERT_NE(with, nullptr);
    EXPECT_STREQ(with, "{\"session\":\"7\",\"seen_as\":\"[::1]:80\"}");
    free(with);
    EXPECT_EQ(kvc_hs_with_session("[1]", 3, 7, nullptr, &len), nullptr);
    EXPECT_EQ(kvc_hs_with_session("", 0, 7, nullptr, &len), nullptr);

    // seen_as is a hint: one that is no address (or no string, or too
    // long) is dropped, the handshake stands (READ releases then go over
    // the control plane).
    for (const char *v : {"\"host name\"", "\"fe80::1%eth0:5\"", "7",
                          "\"1111111111111111111111111111111111111111111111"
                          "111111111111111111:1\""}) {
        std::string odd = text;
        odd.insert(odd.size() - 1, std::string(",\"seen_as\":") + v);
        ASSERT_EQ(kvc_hs_decode(odd.data(), odd.size(), &out), KVX_OK)
            << v << ": " << kvc_last_error();
        EXPECT_STREQ(out.seen_as, "") << v;
        kvc_hs_fini(&out);
    }

    // A session that is no decimal string is refused, naming the field.
    std::string bad = text;
    bad.insert(bad.size() - 1, ",\"session\":\"-1\"");
    EXPECT_EQ(kvc_hs_decode(bad.data(), bad.size(), &out),
              KVX_ERR_BAD_MESSAGE);
    EXPECT_NE(strstr(kvc_last_error(), "field session"), nullptr)
        << kvc_last_error();
}
