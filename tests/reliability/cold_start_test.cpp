// Cold start: every operator x direction x dtype (FlashAttentionScore forward and grad,
// BlockAttentionResiduals forward and grad; fp32, fp16, bf16) as the first call of a fresh process
// (one process per case), with and without ATTNOPS_LAUNCH_BLOCKING=1, and with the CPU affinity
// reduced to one core before that call (what `taskset -c N` does); and the cgroup CPU quota
// (v2 cpu.max, v1 cfs files) read from a fake cgroup root (internal hook), a 0.5-CPU quota giving
// one usable core. Nothing may depend on another call having run first: the grad cases get their
// forward statistics from the double reference, not from the library.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "child_process.hpp"
#include "ops/block_attention_residuals/check.hpp"
#include "ops/block_attention_residuals/reference.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/reference.hpp"
#include "problem.hpp"
#include "problem_bar.hpp"
#include "problem_grad.hpp"
#include "runtime/platform.hpp"

namespace {

using attnops::testing::expectChildPasses;
using attnops::testing::isChild;
using attnops::tools::BarInstance;
using attnops::tools::BarProblem;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

std::string lastError() { return attnopsGetLastErrorMessage(); }

std::string env(const char* name, const char* fallback = "") {
    const char* v = std::getenv(name);
    return v ? v : fallback;
}

attnopsDataType dtypeOf(const std::string& name) {
    return name == "fp16" ? ATTNOPS_FLOAT16 : name == "bf16" ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32;
}

// Pins the process to the first CPU of its current mask (before any attnops call).
void pinToOneCore() {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &set)) ++first;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
}

FaProblem faProblem(attnopsDataType dtype) {
    FaProblem p = attnops::tools::fixed("BNSD", dtype, 2, 67, 75, 4, 2, 40);
    p.sparseMode = 3;
    p.keepProb = 0.9;
    p.seed = 21;
    return p;
}

BarProblem barProblem(attnopsDataType dtype) {
    BarProblem p;
    p.tokens = 29;
    p.blocks = 6;
    p.hidden = 136;
    p.dtype = dtype;
    return p;
}

// The forward outputs a grad call reads (attentionIn, softmax statistics), from the double
// reference: the argument checks and the reference are pure functions, no runtime call.
void referenceForwardOutputs(FaInstance& inst) {
    const attnops::tools::FaArrays arrays(inst);
    const attnops::fa::ForwardParams p = attnops::fa::checkForward(attnops::tools::forwardArgs(inst, arrays), 0);
    for (int64_t b = 0; b < p.seq.count; ++b)
        for (int64_t n = 0; n < p.n1; ++n)
            for (int64_t i = 0; i < p.seq.qLen[size_t(b)]; ++i) {
                const attnops::fa::ReferenceRow r = attnops::fa::referenceRow(p, b, n, i);
                const int64_t row = p.seq.qStart[size_t(b)] + i;
                for (int64_t c = 0; c < p.dv; ++c) p.out.store(b, n, row, c, float(r.out[size_t(c)]));
                for (int64_t lane = 0; lane < p.statLanes; ++lane) {
                    p.softmaxMax.store(b, n, row, lane, float(r.max));
                    p.softmaxSum.store(b, n, row, lane, float(r.sum));
                }
            }
}

void referenceBarStatistics(BarInstance& inst) {
    const BarProblem& pr = inst.problem;
    attnops::bar::ForwardArgs a{inst.partialBlock.handle(), inst.blockRes.handle(), inst.projWeight.handle(),
                                inst.normWeight.handle(), pr.validBlockNum, pr.eps, true, inst.hiddenStates.handle(),
                                inst.invNorm.handle(), inst.probs.handle()};
    const attnops::bar::ForwardParams p = attnops::bar::checkForward(a, 0);
    for (int64_t t = 0; t < pr.tokens; ++t) {
        const attnops::bar::ReferenceToken r = attnops::bar::referenceForwardToken(p.src, p.eps, t);
        for (int64_t i = 0; i <= pr.blocks; ++i) {
            p.invNorm.store(t, i, 0, float(r.invNorm[size_t(i)]));
            p.probs.store(t, i, 0, float(r.probs[size_t(i)]));
        }
    }
}

// Child: ATTNOPS_TEST_OP (fa_fwd, fa_bwd, bar_fwd, bar_bwd) in ATTNOPS_TEST_DTYPE is the first
// runtime call of this process (tensor handles aside); ATTNOPS_TEST_ONE_CORE=1 pins the process
// to one core first. The result is checked against the double reference.
TEST(ColdStartMatrixChild, DISABLED_FirstCall) {
    if (!isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test";
    const bool oneCore = env("ATTNOPS_TEST_ONE_CORE") == "1";
    if (oneCore) pinToOneCore();
    const std::string op = env("ATTNOPS_TEST_OP");
    const attnopsDataType dtype = dtypeOf(env("ATTNOPS_TEST_DTYPE", "fp32"));
    if (op == "fa_fwd" || op == "fa_bwd") {
        FaInstance inst(faProblem(dtype));
        if (op == "fa_fwd") {
            ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
            const auto rc = attnops::tools::checkForwardRows(inst, -1);
            EXPECT_TRUE(rc.passed) << rc.firstFailure;
        } else {
            referenceForwardOutputs(inst);
            attnops::tools::FaGrads g = attnops::tools::makeGrads(inst);
            ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << lastError();
            const auto gc = attnops::tools::checkBackward(inst, g);
            EXPECT_TRUE(gc.passed) << gc.failure;
        }
    } else if (op == "bar_fwd" || op == "bar_bwd") {
        BarInstance inst(barProblem(dtype));
        if (op == "bar_fwd") {
            ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
            const auto rc = attnops::tools::checkBarForward(inst);
            EXPECT_TRUE(rc.passed) << rc.failure;
        } else {
            referenceBarStatistics(inst);
            ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
            const auto rc = attnops::tools::checkBarBackward(inst);
            EXPECT_TRUE(rc.passed) << rc.failure;
        }
    } else {
        FAIL() << "unknown ATTNOPS_TEST_OP \"" << op << "\"";
    }
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    EXPECT_GE(info.threads, 1);
    EXPECT_GE(info.usableCores, 1);
    if (oneCore) {
        EXPECT_EQ(info.usableCores, 1) << "the affinity mask is honoured";
        EXPECT_EQ(info.threads, 1);
    }
}

void runMatrix(const char* op) {
    for (const char* dtype : {"fp32", "fp16", "bf16"})
        for (const char* blocking : {"0", "1"})
            for (const char* oneCore : {"0", "1"})
                expectChildPasses("ColdStartMatrixChild.DISABLED_FirstCall", {{"ATTNOPS_TEST_OP", op},
                                                                              {"ATTNOPS_TEST_DTYPE", dtype},
                                                                              {"ATTNOPS_LAUNCH_BLOCKING", blocking},
                                                                              {"ATTNOPS_TEST_ONE_CORE", oneCore}});
}

TEST(ColdStartMatrix, FlashAttentionForwardFirst) { runMatrix("fa_fwd"); }
TEST(ColdStartMatrix, FlashAttentionGradFirst) { runMatrix("fa_bwd"); }
TEST(ColdStartMatrix, BlockAttentionResidualsForwardFirst) { runMatrix("bar_fwd"); }
TEST(ColdStartMatrix, BlockAttentionResidualsGradFirst) { runMatrix("bar_bwd"); }

// ------------------------------------------------------------------ cgroup CPU quota

// Child: the platform reads its quota from ATTNOPS_TEST_CGROUP_ROOT; the device must report
// min(affinity cores, ceil(quota)) usable cores, run with that many threads, and a BAR grad (the
// upstream cold-start failure) as the first call must succeed.
TEST(CgroupQuotaChild, DISABLED_UsableCores) {
    if (!isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test";
    attnops::testing::setCgroupRoot(env("ATTNOPS_TEST_CGROUP_ROOT"));
    BarInstance inst(barProblem(ATTNOPS_BFLOAT16));
    referenceBarStatistics(inst);
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(attnops::tools::checkBarBackward(inst).passed);
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    const int affinity = CPU_COUNT(&set);
    const int quota = std::atoi(env("ATTNOPS_TEST_EXPECT_QUOTA_CORES").c_str());  // 0: no quota
    const int want = quota > 0 ? std::min(affinity, quota) : affinity;
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    EXPECT_EQ(info.usableCores, want) << "affinity " << affinity << ", quota " << quota;
    EXPECT_EQ(info.threads, want);
}

// A temporary folder tree of small text files (a fake /sys/fs/cgroup or /sys/devices/system/cpu).
class TempTree {
public:
    TempTree() {
        char templ[] = "/tmp/attnops-cgroup-XXXXXX";
        const char* made = mkdtemp(templ);
        EXPECT_NE(made, nullptr);
        path_ = made ? made : "";
    }
    ~TempTree() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    void write(const std::string& file, const std::string& text) const {
        std::filesystem::create_directories(std::filesystem::path(path_ + "/" + file).parent_path());
        std::ofstream(path_ + "/" + file) << text;
    }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

void expectQuota(const TempTree& root, const char* cores) {
    expectChildPasses("CgroupQuotaChild.DISABLED_UsableCores",
                      {{"ATTNOPS_TEST_CGROUP_ROOT", root.path()}, {"ATTNOPS_TEST_EXPECT_QUOTA_CORES", cores}});
}

TEST(CgroupQuota, V2HalfCpuGivesOneCore) {
    TempTree root;
    root.write("cpu.max", "50000 100000\n");
    expectQuota(root, "1");
}

TEST(CgroupQuota, V2FractionalQuotaRoundsUpAndMaxMeansNone) {
    TempTree a, b;
    a.write("cpu.max", "250000 100000\n");
    expectQuota(a, "3");
    b.write("cpu.max", "max 100000\n");
    expectQuota(b, "0");
}

TEST(CgroupQuota, V1CfsQuota) {
    TempTree a, b;
    a.write("cpu/cpu.cfs_quota_us", "50000\n");
    a.write("cpu/cpu.cfs_period_us", "100000\n");
    expectQuota(a, "1");
    b.write("cpu/cpu.cfs_quota_us", "-1\n");
    b.write("cpu/cpu.cfs_period_us", "100000\n");
    expectQuota(b, "0");
}

TEST(CgroupQuota, MissingOrGarbageFilesMeanNoQuota) {
    TempTree empty, garbage;
    expectQuota(empty, "0");
    garbage.write("cpu.max", "lots\n");
    expectQuota(garbage, "0");
}

// ------------------------------------------------------------------ cache sizes

// Child: the platform reads the cache sizes under ATTNOPS_TEST_SYSFS_CPU_ROOT (the layout of
// /sys/devices/system/cpu); the device info must give the sizes expected (0: what sysconf says,
// the fallback when sysfs has nothing).
TEST(CacheSizesChild, DISABLED_FromSysfs) {
    if (!isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test";
    attnops::testing::setSysfsCpuRoot(env("ATTNOPS_TEST_SYSFS_CPU_ROOT"));
    auto expected = [](const char* name, int sysconfName, uint64_t fallback) {
        const uint64_t want = std::strtoull(env(name).c_str(), nullptr, 10);
        if (want > 0) return want;
        const long v = sysconf(sysconfName);
        return v > 0 ? uint64_t(v) : fallback;
    };
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    EXPECT_EQ(info.l1dBytes, expected("ATTNOPS_TEST_EXPECT_L1D", _SC_LEVEL1_DCACHE_SIZE, 32 * 1024));
    EXPECT_EQ(info.l2Bytes, expected("ATTNOPS_TEST_EXPECT_L2", _SC_LEVEL2_CACHE_SIZE, 1024 * 1024));
    EXPECT_EQ(info.l3Bytes, expected("ATTNOPS_TEST_EXPECT_L3", _SC_LEVEL3_CACHE_SIZE, 8 * 1024 * 1024));
}

// Writes cache index `index` of every CPU this process may run on (the platform reads the first).
void writeCache(const TempTree& root, int index, const char* level, const char* type, const char* size) {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &set)) continue;
        const std::string dir = "cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(index) + "/";
        root.write(dir + "level", std::string(level) + "\n");
        root.write(dir + "type", std::string(type) + "\n");
        root.write(dir + "size", std::string(size) + "\n");
    }
}

// The kernel's sizes win over sysconf's (glibc reads CPUID and on AMD can report the whole
// package's L3: 256 MiB on a 2-vCPU Zen 3 VM whose sysfs says 32 MiB); sizes no machine has, so
// the test fails if any comes from anywhere else. The instruction cache is not the data cache.
TEST(CacheSizes, SysfsWinsOverSysconf) {
    TempTree root;
    writeCache(root, 0, "1", "Instruction", "24K");
    writeCache(root, 1, "1", "Data", "40K");
    writeCache(root, 2, "2", "Unified", "1536K");
    writeCache(root, 3, "3", "Unified", "3M");
    expectChildPasses("CacheSizesChild.DISABLED_FromSysfs", {{"ATTNOPS_TEST_SYSFS_CPU_ROOT", root.path()},
                                                             {"ATTNOPS_TEST_EXPECT_L1D", "40960"},
                                                             {"ATTNOPS_TEST_EXPECT_L2", "1572864"},
                                                             {"ATTNOPS_TEST_EXPECT_L3", "3145728"}});
}

// Nothing in sysfs (a container without it): sysconf, then the documented defaults.
TEST(CacheSizes, NoSysfsFallsBackToSysconf) {
    TempTree empty;
    expectChildPasses("CacheSizesChild.DISABLED_FromSysfs", {{"ATTNOPS_TEST_SYSFS_CPU_ROOT", empty.path()}});
}

}  // namespace
