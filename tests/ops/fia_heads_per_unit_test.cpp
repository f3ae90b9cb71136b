// Decode units of several kv heads (Plan::headsPerUnit, cpu/simd/fia_forward.hpp runUnit): where
// a cache row holds the kv heads side by side (BnBsH pages, BSH caches) a vector kernel's unit
// takes up to kHeadsPerUnit heads, block by block in blocks of kInterleavedKeyRows keys. Checked
// against the double reference, and for the same bits at 1 and 3 threads: heads not a multiple of
// the unit (12 = 8 + 4, 3), key splits whose blocks differ in length, bf16 and int8 caches (per
// channel, per token), every group size of the row tiles, and the bf16-pair decode where the CPU
// has it. The plan takes several heads only there: not for BnNBsD pages, nor for prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "ops/fused_infer_attention_score/check.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::fia::kSplitKeys;
using attnops::testsupport::ThreadsGuard;

namespace {

FiaProblem decode(const std::string& cache, std::pair<int64_t, int64_t> heads, int64_t dim, int quant) {
    FiaProblem p;
    p.layout = "BSH";
    p.cache = cache;
    p.blockSize = 128;
    p.qSeqLen = 1;
    p.kvLens = {kSplitKeys + 130, 1, 129, 2 * kSplitKeys + 5};
    p.batch = int64_t(p.kvLens.size());
    p.kvSeqLen = 2 * kSplitKeys + 5;
    p.heads = heads.first;
    p.kvHeads = heads.second;
    p.dim = dim;
    p.dtype = ATTNOPS_BFLOAT16;
    p.int8Kv = quant > 0;
    p.keyQuantMode = p.valueQuantMode = quant == 2 ? 1 : 0;
    return p;
}

struct Output {
    attnopsStatus status;
    std::string impl;
    std::vector<uint8_t> out, lse;
    FiaCheck check;
};

Output runForced(const char* impl, const FiaProblem& p) {
    FiaInstance inst(p);
    Output o;
    {
        testsupport::ForcedImpl force(impl);
        o.status = inst.run();
    }
    if (o.status != ATTNOPS_SUCCESS) return o;
    o.impl = lastImplementation();
    o.out = inst.attentionOut.bytes();
    o.lse = inst.softmaxLse.bytes();
    o.check = checkFia(inst);
    return o;
}

}  // namespace

TEST(FiaHeadsPerUnit, InterleavedPagesAgainstReferenceAndThreadCounts) {
    ThreadsGuard guard;
    const std::pair<int64_t, int64_t> groups[] = {{32, 8}, {12, 12}, {24, 12}, {15, 3}, {10, 2}};
    int compared = 0;
    for (const char* impl : {"avx512", "avx2", "avx512-bf16"})
        for (int i = 0; i < 5; ++i) {
            const int quant = std::string(impl) == "avx512-bf16" ? 0 : i % 3;  // the pairs take bf16 caches only
            const int64_t dim = i % 2 == 0 ? 128 : 64;
            const FiaProblem p = decode("BnBsH", groups[i], dim, quant);
            SCOPED_TRACE(std::string(impl) + ": " + p.describe());
            ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
            const Output one = runForced(impl, p);
            if (one.status == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
            ASSERT_EQ(one.status, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            ASSERT_EQ(one.impl, impl);
            EXPECT_TRUE(one.check.passed) << one.check.firstFailure << " (rows " << one.check.rows << ", error "
                                          << one.check.maxAbsError << ", tolerance " << one.check.tolerance << ")";
            EXPECT_GT(one.check.rows, 0);
            ASSERT_EQ(attnopsSetDeviceThreads(0, 3), ATTNOPS_SUCCESS);
            const Output three = runForced(impl, p);
            ASSERT_EQ(three.status, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_TRUE(one.out == three.out) << "attentionOut differs between 1 and 3 threads";
            EXPECT_TRUE(one.lse == three.lse) << "softmaxLse differs between 1 and 3 threads";
            ++compared;
        }
    EXPECT_GT(compared, 0) << "no vector kernel runs on this CPU";
}

// The plan: several heads a unit for interleaved rows in decode, with the kernels that honour
// WorkUnit::heads; one otherwise.
TEST(FiaHeadsPerUnit, PlanTakesSeveralHeadsOnlyForInterleavedDecode) {
    struct Case {
        const char* cache;
        int64_t qSeqLen, kvHeads, expected;
    };
    const Case cases[] = {{"BnBsH", 1, 8, 8}, {"BnBsH", 1, 12, 8}, {"BnBsH", 1, 3, 3},
                          {"BnNBsD", 1, 8, 1}, {"BnBsH", 300, 8, 1}, {"BnBsH", 1, 1, 1}};
    if (!fia::forwardKernelAvx512().available()) GTEST_SKIP() << "the avx512 kernel is not available on this CPU";
    for (const Case& c : cases) {
        FiaProblem p = decode(c.cache, {2 * c.kvHeads, c.kvHeads}, 64, 0);
        p.qSeqLen = c.qSeqLen;
        p.kvLens = {300, 600};
        p.batch = 2;
        p.kvSeqLen = 600;
        SCOPED_TRACE(p.describe());
        const FiaInstance inst(p);
        const FiaArrays arrays(inst);
        const attnopsTensor* kv[2];
        const fia::Params params = fia::checkForward(fiaArgs(inst, arrays, kv), 0);
        for (int32_t threads : {1, 2}) {
            const fia::Plan plan = fia::makePlan(params, threads, "avx512");
            EXPECT_EQ(plan.headsPerUnit, c.expected);
            EXPECT_EQ(plan.tile.keyRows, c.expected > 1 ? fia::kInterleavedKeyRows : 128);
            // Every (batch, kv head, split) once: the units' heads add up to the kv heads.
            int64_t heads = 0;
            for (int64_t b = 0; b < params.core.seq.count; ++b)
                for (int64_t local = 0; local < plan.units.base[size_t(b) + 1] - plan.units.base[size_t(b)]; ++local) {
                    const fia::WorkUnit u = fia::unitAt(params, plan, b, local, nullptr);
                    EXPECT_EQ(u.n2 % plan.headsPerUnit, 0);
                    EXPECT_EQ(u.heads, std::min(plan.headsPerUnit, params.core.n2 - u.n2));
                    heads += u.heads * (u.q1 - u.q0 > 0 ? 1 : 0);
                }
            int64_t expected = 0;
            for (int64_t b = 0; b < params.core.seq.count; ++b)
                expected += params.core.n2 * plan.splits[size_t(b)] * ((params.core.seq.qLen[size_t(b)] + plan.tile.unitRows() - 1) / plan.tile.unitRows());
            EXPECT_EQ(heads, expected);
        }
    }
}
