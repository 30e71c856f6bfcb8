// test_lanes.cc - transports/ucx/kvu_lanes.c: the lane report parsed from
// real ucp_ep_print_info output of both formats, captured into tests/data
// (ucx-<version>-ep-<tls>.txt, UCX 1.13.1 and 1.22.0; how they were
// captured: tests/data/README.md).
extern "C" {
#include "ucx/kvu_lanes.h"
}

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string Capture(const char *name)
{
    const char *dir = std::getenv("KVT_DATA");
    std::string path = std::string(dir != nullptr ? dir : "KVT_DATA-unset") +
                       "/" + name;
    std::ifstream     in(path);
    std::stringstream ss;

    EXPECT_TRUE(in.good()) << "cannot read " << path;
    ss << in.rdbuf();
    return ss.str();
}

struct Parsed {
    kvu_lanes_t lanes;
    std::string report;
};

Parsed Parse(const std::string &text)
{
    Parsed p;
    char   buf[512];

    kvu_lanes_parse(text.c_str(), &p.lanes);
    int n = kvu_lanes_format(&p.lanes, buf, sizeof(buf));
    EXPECT_GE(n, 0);
    EXPECT_LT(n, (int)sizeof(buf));
    p.report = buf;
    return p;
}

TEST(Lanes, Ucx113TcpIsEmulated)
{
    Parsed p = Parse(Capture("ucx-1.13-ep-tcp.txt"));

    ASSERT_EQ(1, p.lanes.n);
    EXPECT_EQ(0, p.lanes.proto_v2);
    EXPECT_EQ("tcp/lo[am am_bw#0 keepalive wireup]", p.report);
    EXPECT_EQ(1, kvu_lanes_rma_emulated(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_rma_shm_only(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_am_fifo(&p.lanes));
}

TEST(Lanes, Ucx113SmHasShmRmaLanesFromPutGetLines)
{
    Parsed p = Parse(Capture("ucx-1.13-ep-sm.txt"));

    ASSERT_EQ(2, p.lanes.n);
    EXPECT_EQ(0, p.lanes.proto_v2);
    EXPECT_EQ("sysv/memory[am am_bw#0 keepalive rma] posix/memory[rma]",
              p.report);
    EXPECT_EQ(0, kvu_lanes_rma_emulated(&p.lanes));
    EXPECT_EQ(1, kvu_lanes_rma_shm_only(&p.lanes));
    // Emulated gets go over the sysv FIFO: capped (kvu.c KVU_FIFO_MAX_GETS).
    EXPECT_EQ(1, kvu_lanes_am_fifo(&p.lanes));
}

// On 1.13 a cma lane is an rma_bw lane (rendezvous only): one-sided
// operations still use the put[i]/get[i] lanes, so it is not an RMA lane.
TEST(Lanes, Ucx113RmaBwLaneIsNotAnRmaLaneInV1)
{
    Parsed p = Parse(Capture("ucx-1.13-ep-sm-errnone.txt"));

    ASSERT_EQ(3, p.lanes.n);
    EXPECT_STREQ("cma", p.lanes.lane[2].tl);
    EXPECT_STREQ("rma_bw#0", p.lanes.lane[2].roles);
    EXPECT_EQ(0, p.lanes.lane[2].rma);
    EXPECT_EQ(1, kvu_lanes_rma_shm_only(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_rma_on(&p.lanes, "cma"));
}

// UCX 1.22 (protocol v2): "seg 4294967295" on every lane, protocol tables
// instead of put/get lines.
TEST(Lanes, Ucx122TcpIsEmulatedAndItsSegmentSizeIsNoRole)
{
    Parsed p = Parse(Capture("ucx-1.22-ep-tcp.txt"));

    ASSERT_EQ(1, p.lanes.n);
    EXPECT_EQ(1, p.lanes.proto_v2);
    EXPECT_EQ("tcp/lo[am keepalive wireup]", p.report);
    EXPECT_EQ(1, kvu_lanes_rma_emulated(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_am_fifo(&p.lanes));
}

TEST(Lanes, Ucx122SmLanesCopyDirectlyIntoUcxMemory)
{
    Parsed p = Parse(Capture("ucx-1.22-ep-sm.txt"));

    ASSERT_EQ(2, p.lanes.n);
    EXPECT_EQ(1, p.lanes.proto_v2);
    EXPECT_EQ("sysv/memory[am keepalive rma] posix/memory[rma]", p.report);
    EXPECT_EQ(0, kvu_lanes_rma_emulated(&p.lanes));
    EXPECT_EQ(1, kvu_lanes_rma_shm_only(&p.lanes));
    EXPECT_EQ(1, kvu_lanes_am_fifo(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_rma_on(&p.lanes, "cma"));
}

// In v2 an rma_bw lane carries zero-copy put/get (cma on app memory).
TEST(Lanes, Ucx122CmaRmaBwLaneIsAnRmaLane)
{
    Parsed p = Parse(Capture("ucx-1.22-ep-sm-errnone.txt"));

    ASSERT_EQ(3, p.lanes.n);
    EXPECT_STREQ("cma", p.lanes.lane[2].tl);
    EXPECT_EQ(1, p.lanes.lane[2].rma);
    EXPECT_EQ("sysv/memory[am rma] posix/memory[rma] cma/memory[rma_bw#0 rma]",
              p.report);
    EXPECT_EQ(0, kvu_lanes_rma_shm_only(&p.lanes));
    EXPECT_EQ(1, kvu_lanes_rma_on(&p.lanes, "cma"));
    EXPECT_EQ(0, kvu_lanes_rma_on(&p.lanes, "tcp"));
    EXPECT_EQ(1, kvu_lanes_rma_shm_or(&p.lanes, "cma"));
}

// A GPU or RDMA RMA lane beside cma: UCX keeps every run (device memory
// cannot cross kvxfer's active messages).
TEST(Lanes, CmaBesideAGpuLaneIsNotShmOrCma)
{
    Parsed p = Parse(
        "#                 lane[0]:  0:sysv/memory.0 md[0]  -> "
        "md[0]/sysv/sysdev[255] seg 4294967295 am keepalive\n"
        "#                 lane[1]:  1:rocm_ipc/rocm.0 md[1] -> "
        "md[1]/rocm_ipc/sysdev[255] seg 4294967295 rma_bw#0\n"
        "#                 lane[2]:  2:cma/memory.0 md[2]   -> "
        "md[2]/cma/sysdev[255] seg 4294967295 rma_bw#1\n");

    ASSERT_EQ(3, p.lanes.n);
    EXPECT_EQ(1, kvu_lanes_rma_on(&p.lanes, "cma"));
    EXPECT_EQ(0, kvu_lanes_rma_shm_or(&p.lanes, "cma"));
}

TEST(Lanes, SegmentSizeIsNeverARole)
{
    Parsed p = Parse(
        "#                 lane[0]:  3:tcp/lo.0 md[1]      -> "
        "md[1]/tcp/sysdev[255] seg 4294967295 rma_bw#0 am am_bw#0 "
        "keepalive wireup{tcp/lo}\n");

    ASSERT_EQ(1, p.lanes.n);
    EXPECT_EQ(1, p.lanes.proto_v2);
    EXPECT_EQ("tcp/lo[rma_bw#0 am am_bw#0 keepalive wireup rma]", p.report);
    EXPECT_EQ(std::string::npos, p.report.find("4294967295"));
    EXPECT_EQ(std::string::npos, p.report.find("seg"));
}

TEST(Lanes, UnknownTokensAndCmLanesAreSkipped)
{
    Parsed p = Parse(
        "# lane[0]: cm tcp\n"
        "# lane[1]:  2:eth0.100.1/x.0 md[0] -> md[0]/tcp/sysdev[3] seg 8192 "
        "future_role 17 am amo#x rkey_ptr\n");

    ASSERT_EQ(1, p.lanes.n);
    EXPECT_STREQ("eth0.100.1", p.lanes.lane[0].tl);
    EXPECT_STREQ("am rkey_ptr", p.lanes.lane[0].roles);
}

TEST(Lanes, QueryNamesReplaceParsedOnesOnlyWhenCountsMatch)
{
    Parsed      p    = Parse(Capture("ucx-1.13-ep-sm.txt"));
    const char *tl[] = {"sysv", "posix"}, *dev[] = {"memory", "memory"};

    EXPECT_EQ(-1, kvu_lanes_set_names(&p.lanes, tl, dev, 1));
    EXPECT_STREQ("sysv", p.lanes.lane[0].tl);
    tl[0] = "SYSV";
    EXPECT_EQ(0, kvu_lanes_set_names(&p.lanes, tl, dev, 2));
    EXPECT_STREQ("SYSV", p.lanes.lane[0].tl);
}

TEST(Lanes, EmptyTextHasNoLanesAndIsEmulated)
{
    Parsed p = Parse("");

    EXPECT_EQ(0, p.lanes.n);
    EXPECT_EQ("", p.report);
    EXPECT_EQ(1, kvu_lanes_rma_emulated(&p.lanes));
    EXPECT_EQ(0, kvu_lanes_rma_shm_only(&p.lanes));
}

}  // namespace
