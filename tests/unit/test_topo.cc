// test_topo.cc - transports/ucx/kvu_topo.c: hwloc placement of a rank near
// its GPU's NIC (SPEC §11), tested without the hardware through hand-written
// hwloc XML topologies in tests/data (directory given by KVT_DATA), plus the
// HIP memory-type probe on this machine.
extern "C" {
#include "config.h"
#include "error.h"
}

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

// kvu.h cannot be included from C++ (its kvu_op_t has _Atomic members), so
// the declarations of its placement block are repeated here; they must stay
// identical to transports/ucx/kvu.h.
extern "C" {
int          kvu_hip_mem_type(const void *ptr);
kvx_status_t kvu_topo_pick_nic(const char *xml_path, const char *gpu_busid,
                               char *buf, size_t len);
kvx_status_t kvu_topo_cpuset(const char *xml_path, const char *gpu_busid,
                             char *buf, size_t len);
}

namespace {

std::string Data(const char *name)
{
    const char *dir = std::getenv("KVT_DATA");

    return std::string(dir != nullptr ? dir : "KVT_DATA-is-not-set") + "/" +
           name;
}

bool Contains(const std::string &haystack, const std::string &needle)
{
    return haystack.find(needle) != std::string::npos;
}

// Answer holds a status and the text written to the buffer.
struct Answer {
    kvx_status_t status;
    std::string  text;
    std::string  error;
};

Answer Nic(const std::string &xml, const char *busid)
{
    char         buf[64] = "untouched";
    kvx_status_t st =
        kvu_topo_pick_nic(xml.empty() ? nullptr : xml.c_str(), busid, buf,
                          sizeof(buf));
    return Answer{st, st == KVX_OK ? buf : "", kvc_last_error()};
}

Answer Cpus(const std::string &xml, const char *busid)
{
    char         buf[256] = "untouched";
    kvx_status_t st =
        kvu_topo_cpuset(xml.empty() ? nullptr : xml.c_str(), busid, buf,
                        sizeof(buf));
    return Answer{st, st == KVX_OK ? buf : "", kvc_last_error()};
}

class Topo : public ::testing::Test {
  protected:
    void SetUp() override
    {
        ASSERT_NE(nullptr, std::getenv("KVT_DATA"))
            << "run through meson test (KVT_DATA names tests/data)";
        ASSERT_EQ(0, access(two_numa_.c_str(), R_OK)) << two_numa_;
    }

    const std::string two_numa_ = Data("topo-2numa.xml");
};

// ---- the two-socket machine ----------------------------------------------

TEST_F(Topo, GpuOnPackage0GetsMlx5_0)
{
    Answer a = Nic(two_numa_, "0000:02:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_0:1", a.text);
}

TEST_F(Topo, GpuOnPackage1GetsMlx5_1)
{
    Answer a = Nic(two_numa_, "0000:82:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_1:1", a.text);
}

TEST_F(Topo, ShortAndUpperCaseBusIdsAreAccepted)
{
    Answer a = Nic(two_numa_, "82:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_1:1", a.text);

    a = Nic(two_numa_, "0000:C1:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_1:1", a.text);
}

// GPU 06:00.0 hangs directly off package 0's host bridge, next to eno1; the
// HCA mlx5_0 sits one level deeper behind a switch of the same host bridge.
// Both share the host bridge with the GPU: equal distance, RDMA wins even
// though eno1 is fewer hops away.
TEST_F(Topo, RdmaWinsAtEqualDistance)
{
    Answer a = Nic(two_numa_, "0000:06:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_0:1", a.text);
}

// GPU c1:00.0 has a host bridge of its own on package 1: the NIC of its
// package (mlx5_1) is nearer than package 0's (mlx5_0, eno1).
TEST_F(Topo, SamePackageBeatsTheOtherPackage)
{
    Answer a = Nic(two_numa_, "0000:c1:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_1:1", a.text);
}

// The NIC's own bus id: its own OpenFabrics device is nearest.
TEST_F(Topo, NicBusIdPicksItself)
{
    Answer a = Nic(two_numa_, "0000:83:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_1:1", a.text);
}

// No GPU: distances from the first NUMA node (package 0).
TEST_F(Topo, NoGpuMeasuresFromTheFirstNumaNode)
{
    for (const char *busid : {static_cast<const char *>(nullptr), ""}) {
        Answer a = Nic(two_numa_, busid);
        ASSERT_EQ(KVX_OK, a.status) << a.error;
        EXPECT_EQ("mlx5_0:1", a.text);
    }
}

TEST_F(Topo, CpusetOfEachPackagesGpu)
{
    Answer a = Cpus(two_numa_, "0000:02:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("0-3,8-11", a.text);

    a = Cpus(two_numa_, "0000:06:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("0-3,8-11", a.text);

    a = Cpus(two_numa_, "0000:82:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("4-7,12-15", a.text);

    a = Cpus(two_numa_, "c1:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("4-7,12-15", a.text);
}

TEST_F(Topo, CpusetWithoutGpuIsTheWholeMachine)
{
    Answer a = Cpus(two_numa_, nullptr);
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("0-15", a.text);
    a = Cpus(two_numa_, "");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("0-15", a.text);
}

// ---- errors ---------------------------------------------------------------

TEST_F(Topo, UnknownBusIdIsAConfigErrorNamingIt)
{
    Answer a = Nic(two_numa_, "0000:99:00.0");
    EXPECT_EQ(KVX_ERR_CONFIG, a.status);
    EXPECT_TRUE(Contains(a.error, "0000:99:00.0")) << a.error;
    EXPECT_TRUE(Contains(a.error, "topo-2numa.xml")) << a.error;

    a = Cpus(two_numa_, "0001:02:00.0"); // right bus, other domain
    EXPECT_EQ(KVX_ERR_CONFIG, a.status);
    EXPECT_TRUE(Contains(a.error, "0001:02:00.0")) << a.error;
}

TEST_F(Topo, MalformedBusIdIsAConfigErrorNamingIt)
{
    for (const char *bad : {"gpu0", "0000:02:00", "0000:02:00.0 ", "2:0.0",
                            "0000:02:20.0", "0000:02:00.8", "00000:02:00.0"}) {
        Answer a = Nic(two_numa_, bad);
        EXPECT_EQ(KVX_ERR_CONFIG, a.status) << bad;
        EXPECT_TRUE(Contains(a.error, std::string("'") + bad + "'"))
            << a.error;
        a = Cpus(two_numa_, bad);
        EXPECT_EQ(KVX_ERR_CONFIG, a.status) << bad;
    }
}

TEST_F(Topo, MissingFileIsAConfigErrorNamingThePath)
{
    const std::string missing = Data("topo-does-not-exist.xml");

    Answer a = Nic(missing, "0000:02:00.0");
    EXPECT_EQ(KVX_ERR_CONFIG, a.status);
    EXPECT_TRUE(Contains(a.error, missing)) << a.error;

    a = Cpus(missing, "0000:02:00.0");
    EXPECT_EQ(KVX_ERR_CONFIG, a.status);
    EXPECT_TRUE(Contains(a.error, missing)) << a.error;
}

TEST_F(Topo, NonXmlFileIsAConfigErrorNamingThePath)
{
    char path[] = "/tmp/kvt-topo-XXXXXX";
    int  fd     = mkstemp(path);
    ASSERT_GE(fd, 0);
    const char junk[] = "this is not an hwloc topology\n";
    ASSERT_EQ(static_cast<ssize_t>(sizeof(junk) - 1),
              write(fd, junk, sizeof(junk) - 1));
    close(fd);

    Answer a = Nic(path, nullptr);
    Answer c = Cpus(path, nullptr);
    unlink(path);
    EXPECT_EQ(KVX_ERR_CONFIG, a.status);
    EXPECT_TRUE(Contains(a.error, path)) << a.error;
    EXPECT_EQ(KVX_ERR_CONFIG, c.status);
    EXPECT_TRUE(Contains(c.error, path)) << c.error;
}

TEST_F(Topo, OutputBufferTooSmallOrMissing)
{
    char buf[16];

    // "mlx5_0:1" needs 9 bytes.
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvu_topo_pick_nic(two_numa_.c_str(), "0000:02:00.0", buf, 8));
    EXPECT_TRUE(Contains(kvc_last_error(), "8 bytes")) << kvc_last_error();
    ASSERT_EQ(KVX_OK,
              kvu_topo_pick_nic(two_numa_.c_str(), "0000:02:00.0", buf, 9))
        << kvc_last_error();
    EXPECT_STREQ("mlx5_0:1", buf);
    // "0-3,8-11" needs 9 bytes too.
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvu_topo_cpuset(two_numa_.c_str(), "0000:02:00.0", buf, 8));
    ASSERT_EQ(KVX_OK,
              kvu_topo_cpuset(two_numa_.c_str(), "0000:02:00.0", buf, 9))
        << kvc_last_error();
    EXPECT_STREQ("0-3,8-11", buf);
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvu_topo_pick_nic(two_numa_.c_str(), nullptr, nullptr, 64));
    EXPECT_EQ(KVX_ERR_INVALID_PARAM,
              kvu_topo_cpuset(two_numa_.c_str(), nullptr, buf, 0));
}

// ---- the other topologies -------------------------------------------------

// Only a plain Ethernet NIC, on the other package: its interface name, and
// never the NVMe block device next to the GPU.
TEST_F(Topo, PlainEthernetNicGivesTheInterfaceName)
{
    const std::string eth = Data("topo-eth.xml");

    Answer a = Nic(eth, "0000:41:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("eth0", a.text);
    a = Cpus(eth, "41:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("1", a.text);
}

TEST_F(Topo, NoNetworkDeviceIsNotFound)
{
    const std::string nonic = Data("topo-nonic.xml");

    Answer a = Nic(nonic, "0000:c1:00.0");
    EXPECT_EQ(KVX_ERR_NOT_FOUND, a.status);
    EXPECT_TRUE(Contains(a.error, "no network device")) << a.error;
    EXPECT_EQ(KVX_ERR_NOT_FOUND, Nic(nonic, nullptr).status);
    // The CPU set does not need a NIC.
    a = Cpus(nonic, "0000:c1:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("0-1", a.text);
}

// The GPU's PCI switch holds a plain Ethernet NIC, the host bridge above it
// an HCA: the switch is nearer, and nearness comes before the RDMA
// preference. Without a GPU (first NUMA node) both are at package level and
// RDMA wins.
TEST_F(Topo, SameSwitchBeatsSameHostBridge)
{
    const std::string sw = Data("topo-switch.xml");

    Answer a = Nic(sw, "0000:02:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("eth1", a.text);
    a = Nic(sw, nullptr);
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_0:1", a.text);
}

// Port 1 down, port 2 active: UCX must be pointed at port 2.
TEST_F(Topo, FirstActivePortIsChosen)
{
    Answer a = Nic(Data("topo-ports.xml"), "0000:01:00.0");
    ASSERT_EQ(KVX_OK, a.status) << a.error;
    EXPECT_EQ("mlx5_2:2", a.text);
}

// ---- this machine -----------------------------------------------------------

// No XML, no GPU: whatever this machine has (some NIC or none), never a
// crash; on success a non-empty device name.
TEST(TopoThisMachine, PickNicWithoutXmlOrGpu)
{
    char         buf[128] = "";
    kvx_status_t st = kvu_topo_pick_nic(nullptr, nullptr, buf, sizeof(buf));

    ASSERT_TRUE(st == KVX_OK || st == KVX_ERR_NOT_FOUND)
        << kvc_status_name(st) << ": " << kvc_last_error();
    if (st == KVX_OK) {
        EXPECT_GT(std::string(buf).size(), 0u);
        EXPECT_EQ(std::string::npos, std::string(buf).find(' ')) << buf;
    }
    st = kvu_topo_pick_nic("", "", buf, sizeof(buf)); // "" = defaults too
    EXPECT_TRUE(st == KVX_OK || st == KVX_ERR_NOT_FOUND)
        << kvc_status_name(st) << ": " << kvc_last_error();
}

TEST(TopoThisMachine, CpusetWithoutXmlOrGpuListsTheOnlineCpus)
{
    char buf[1024] = "";

    ASSERT_EQ(KVX_OK, kvu_topo_cpuset(nullptr, nullptr, buf, sizeof(buf)))
        << kvc_last_error();
    EXPECT_TRUE(std::string(buf).find_first_not_of("0123456789,-") ==
                std::string::npos)
        << buf;
    EXPECT_NE('\0', buf[0]);
}

TEST(TopoThisMachine, UnknownBusIdOnThisMachineNamesIt)
{
    char         buf[64];
    kvx_status_t st =
        kvu_topo_pick_nic(nullptr, "ffff:ff:1f.7", buf, sizeof(buf));

    EXPECT_EQ(KVX_ERR_CONFIG, st);
    EXPECT_TRUE(Contains(kvc_last_error(), "ffff:ff:1f.7"))
        << kvc_last_error();
    EXPECT_TRUE(Contains(kvc_last_error(), "this machine"))
        << kvc_last_error();
}

// A host pointer: 0 (host memory) when a ROCm device is present, else -1
// with a last error naming HIP (not compiled in, or no device).
TEST(TopoThisMachine, HipMemTypeOfAHostPointer)
{
    static int host_var = 42;

    kvc_error_clear();
    int type = kvu_hip_mem_type(&host_var);
    if (type == -1) {
        std::string err = kvc_last_error();
        EXPECT_TRUE(Contains(err, "HIP")) << err;
        EXPECT_TRUE(Contains(err, "no ROCm device") ||
                    Contains(err, "not compiled in"))
            << err;
    } else {
        EXPECT_EQ(0, type) << "a host pointer must not be device memory";
    }
}

} // namespace
