// Latency window: quantiles by nearest rank over the last KVC_LAT_WINDOW
// samples; count, sum and max over all samples.
#include <gtest/gtest.h>

extern "C" {
#include "latency.h"
}

TEST(Latency, EmptyIsZero)
{
    kvc_lat_t l = {};
    EXPECT_EQ(0u, kvc_lat_quantile(&l, 0.5));
    EXPECT_EQ(0u, kvc_lat_quantile(&l, 0.99));
}

TEST(Latency, NearestRankOverOneToHundred)
{
    kvc_lat_t l = {};
    // Insert 100..1 in reverse so the order of arrival does not matter.
    for (uint64_t v = 100; v >= 1; v--) {
        kvc_lat_add(&l, v);
    }
    EXPECT_EQ(100u, l.count);
    EXPECT_EQ(5050u, l.sum_us);
    EXPECT_EQ(100u, l.max_us);
    EXPECT_EQ(50u, kvc_lat_quantile(&l, 0.5));
    EXPECT_EQ(99u, kvc_lat_quantile(&l, 0.99));
    EXPECT_EQ(1u, kvc_lat_quantile(&l, 0.0));
    EXPECT_EQ(100u, kvc_lat_quantile(&l, 1.0));
}

TEST(Latency, WindowKeepsTheLatestSamplesOnly)
{
    kvc_lat_t l = {};
    for (int i = 0; i < KVC_LAT_WINDOW; i++) {
        kvc_lat_add(&l, 1000000); // old, slow
    }
    for (int i = 0; i < KVC_LAT_WINDOW; i++) {
        kvc_lat_add(&l, 7);
    }
    EXPECT_EQ(7u, kvc_lat_quantile(&l, 0.99));
    EXPECT_EQ(1000000u, l.max_us); // max is over all samples
    EXPECT_EQ(2u * KVC_LAT_WINDOW, l.count);
}

TEST(Latency, HugeSampleSaturatesInTheWindow)
{
    kvc_lat_t l = {};
    kvc_lat_add(&l, UINT64_C(1) << 40);
    EXPECT_EQ(UINT32_MAX, kvc_lat_quantile(&l, 0.5));
    EXPECT_EQ(UINT64_C(1) << 40, l.max_us);
}
