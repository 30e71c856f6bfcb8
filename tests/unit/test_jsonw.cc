// jsonw: the writer prints what json-c prints (JSON_C_TO_STRING_PLAIN) for
// the same members in the same order, byte for byte, for every byte a
// string can hold; its output parses back to the values written.
#include <gtest/gtest.h>
#include <json-c/json.h>

#include <cstdint>
#include <random>
#include <string>

extern "C" {
#include "jsonw.h"
}

namespace {

std::string JsonC(json_object *o)
{
    std::string s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
    json_object_put(o);
    return s;
}

std::string Take(kvc_jw_t *w)
{
    char *s = kvc_jw_take(w);
    EXPECT_NE(s, nullptr);
    std::string r = s != nullptr ? s : "";
    free(s);
    return r;
}

// OneElement: "[x]" as the writer prints it, x written by put.
template <typename Put> std::string OneElement(Put put)
{
    kvc_jw_t w = KVC_JW_INIT;

    kvc_jw_open(&w, '[');
    put(&w);
    kvc_jw_close(&w, ']');
    return Take(&w);
}

// OneElementC: json-c's array of the one value v.
json_object *OneElementC(json_object *v)
{
    json_object *a = json_object_new_array();

    json_object_array_add(a, v);
    return a;
}

TEST(JsonW, EveryByteIsEscapedAsJsonCEscapesIt)
{
    for (int c = 1; c < 256; c++) {
        std::string s = "a";
        s += static_cast<char>(c);
        s += "b";
        s += static_cast<char>(c);

        json_object *o = json_object_new_object();
        json_object_object_add(o, s.c_str(), json_object_new_string(s.c_str()));
        kvc_jw_t w = KVC_JW_INIT;
        kvc_jw_open(&w, '{');
        kvc_jw_key(&w, s.c_str());
        kvc_jw_str(&w, s.c_str());
        kvc_jw_close(&w, '}');
        std::string got = Take(&w);
        EXPECT_EQ(got, JsonC(o)) << "byte " << c;

        // and it reads back to the same string
        json_object *back = json_tokener_parse(got.c_str());
        ASSERT_NE(back, nullptr) << "byte " << c << ": " << got;
        json_object *v = nullptr;
        ASSERT_TRUE(json_object_object_get_ex(back, s.c_str(), &v));
        EXPECT_EQ(std::string(json_object_get_string(v)), s);
        json_object_put(back);
    }
}

TEST(JsonW, NestedMembersIntsAndBoolsMatchJsonC)
{
    std::mt19937_64 rng(20261206);
    const int64_t   edge[] = {0, -1, 1, INT64_MIN, INT64_MAX, 4294967295,
                              -2147483648LL};

    for (int round = 0; round < 200; round++) {
        json_object *o   = json_object_new_object();
        json_object *arr = json_object_new_array();
        json_object *in  = json_object_new_object();
        kvc_jw_t     w   = KVC_JW_INIT;
        size_t       n   = rng() % 6;

        kvc_jw_open(&w, '{');
        kvc_jw_key(&w, "t");
        kvc_jw_bool(&w, 1);
        json_object_object_add(o, "t", json_object_new_boolean(1));
        kvc_jw_key(&w, "ids");
        kvc_jw_open(&w, '[');
        for (size_t i = 0; i < n; i++) {
            int64_t v = i < 7 && round < 7 ? edge[(round + i) % 7]
                                           : static_cast<int64_t>(rng());
            kvc_jw_int(&w, v);
            json_object_array_add(arr, json_object_new_int64(v));
        }
        kvc_jw_close(&w, ']');
        json_object_object_add(o, "ids", arr);
        kvc_jw_key(&w, "in");
        kvc_jw_open(&w, '{');
        if (round % 2 == 0) {
            kvc_jw_key(&w, "f");
            kvc_jw_bool(&w, 0);
            json_object_object_add(in, "f", json_object_new_boolean(0));
            kvc_jw_key(&w, "e");
            kvc_jw_open(&w, '[');
            kvc_jw_close(&w, ']');
            json_object_object_add(in, "e", json_object_new_array());
        }
        kvc_jw_close(&w, '}');
        json_object_object_add(o, "in", in);
        kvc_jw_key(&w, "s");
        kvc_jw_str(&w, "http://h/x\"y\\z");
        json_object_object_add(o, "s", json_object_new_string("http://h/x\"y\\z"));
        kvc_jw_close(&w, '}');
        EXPECT_EQ(Take(&w), JsonC(o)) << "round " << round;
    }
}

TEST(JsonW, EdgeIntegersPrintAsJsonCPrintsThem)
{
    const int64_t edge[] = {0,          -1,         1,          9,
                            10,         -10,        INT64_MIN,  INT64_MIN + 1,
                            INT64_MAX,  4294967295, -2147483648LL,
                            2147483647, 1000000000000000000LL};

    for (int64_t v : edge) {
        EXPECT_EQ(OneElement([v](kvc_jw_t *w) { kvc_jw_int(w, v); }),
                  JsonC(OneElementC(json_object_new_int64(v))))
            << v;
    }
}

// noslash: what json-c prints with JSON_C_TO_STRING_NOSLASHESCAPE, every
// byte; the control messages are written so.
TEST(JsonW, NoSlashEscapesAsJsonCNoSlashEscape)
{
    for (int c = 1; c < 256; c++) {
        std::string s = "a/";
        s += static_cast<char>(c);

        json_object *o = json_object_new_object();
        json_object_object_add(o, s.c_str(), json_object_new_string(s.c_str()));
        kvc_jw_t w = KVC_JW_INIT;
        w.noslash  = 1;
        kvc_jw_open(&w, '{');
        kvc_jw_key(&w, s.c_str());
        kvc_jw_str(&w, s.c_str());
        kvc_jw_close(&w, '}');
        EXPECT_EQ(Take(&w),
                  std::string(json_object_to_json_string_ext(
                      o, JSON_C_TO_STRING_PLAIN |
                             JSON_C_TO_STRING_NOSLASHESCAPE)))
            << "byte " << c;
        json_object_put(o);
    }
}

TEST(JsonW, UnsignedIntegersPrintAsJsonCPrintsThem)
{
    const uint64_t edge[] = {0, 1, 9, 10, 9007199254740992ULL,
                             (uint64_t)INT64_MAX, (uint64_t)INT64_MAX + 1,
                             UINT64_MAX - 1, UINT64_MAX};

    for (uint64_t v : edge) {
        EXPECT_EQ(OneElement([v](kvc_jw_t *w) { kvc_jw_uint(w, v); }),
                  JsonC(OneElementC(json_object_new_uint64(v))))
            << v;
    }
}

TEST(JsonW, ANewWriterTakenAtOnceGivesAnEmptyString)
{
    kvc_jw_t w = KVC_JW_INIT;
    EXPECT_EQ(Take(&w), "");
    kvc_jw_open(&w, '[');
    kvc_jw_fini(&w); // an unfinished buffer is freed (ASan would see a leak)
}

TEST(JsonW, AWriterThatRanOutOfMemoryGivesNull)
{
    kvc_jw_t w = KVC_JW_INIT;

    kvc_jw_open(&w, '{');
    kvc_jw_key(&w, "k");
    w.oom = 1; // as kvc_jw_room sets it when realloc fails
    kvc_jw_str(&w, "later writes are skipped");
    kvc_jw_close(&w, '}');
    EXPECT_EQ(std::string(w.buf), "{\"k\":");
    EXPECT_EQ(kvc_jw_take(&w), nullptr); // and the buffer is freed
    EXPECT_EQ(w.buf, nullptr);
}

} // namespace
