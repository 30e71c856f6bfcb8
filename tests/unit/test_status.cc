// Status table: every code has a distinct name and a non-empty message.
extern "C" {
#include "error.h"
}
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <cstring>

namespace {

struct StatusRow {
    kvx_status_t code;
    const char  *name;
};

#define KVT_ROW(name, value, msg) {name, #name},
const StatusRow kRows[] = {KVX_STATUS_MAP(KVT_ROW)};
#undef KVT_ROW

TEST(Status, EveryCodeHasDistinctNameAndMessage)
{
    std::set<std::string> names, msgs;
    std::set<int>         values;

    for (const StatusRow &r : kRows) {
        EXPECT_STREQ(r.name, kvc_status_name(r.code));
        EXPECT_GT(strlen(kvc_status_string(r.code)), 0u);
        EXPECT_TRUE(names.insert(kvc_status_name(r.code)).second);
        EXPECT_TRUE(msgs.insert(kvc_status_string(r.code)).second);
        EXPECT_TRUE(values.insert((int)r.code).second);
    }
    EXPECT_GE(names.size(), 20u);
}

TEST(Status, UnknownCodeHasConstantText)
{
    EXPECT_STREQ("unknown status", kvc_status_name((kvx_status_t)-77));
    EXPECT_STREQ("unknown status", kvc_status_string((kvx_status_t)12345));
}

TEST(Status, RangeMacrosClassify)
{
    EXPECT_TRUE(KVX_IS_CONFIG_ERROR(KVX_ERR_CONFIG));
    EXPECT_TRUE(KVX_IS_PEER_ERROR(KVX_ERR_HANDSHAKE_TIMEOUT));
    EXPECT_TRUE(KVX_IS_TRANSFER_ERROR(KVX_ERR_OUT_OF_BOUNDS));
    EXPECT_TRUE(KVX_IS_INTERNAL_ERROR(KVX_ERR_NO_MEMORY));
    EXPECT_FALSE(KVX_IS_PEER_ERROR(KVX_OK));
    EXPECT_FALSE(KVX_IS_CONFIG_ERROR(KVX_INPROGRESS));
}

TEST(Status, ErrorTextIsPerThread)
{
    kvc_error_clear();
    EXPECT_EQ(KVX_ERR_CONFIG, kvc_error(KVX_ERR_CONFIG, "key %s: value %d",
                                        "tp_size", 0));
    EXPECT_STREQ("key tp_size: value 0", kvc_last_error());
    std::string other;
    std::thread t([&] { other = kvc_last_error(); });
    t.join();
    EXPECT_EQ("", other);
}

} // namespace

namespace {
TEST(Status, ErrorMayWrapThePreviousMessage)
{
    kvc_error(KVX_ERR_CONFIG, "inner %d", 7);
    kvc_error(KVX_ERR_HANDSHAKE, "outer: %s", kvc_last_error());
    EXPECT_STREQ("outer: inner 7", kvc_last_error());
}
} // namespace
