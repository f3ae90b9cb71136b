// The forward's vector steps for pse, explicit attenMask and dropout (cpu/simd/fa_bias_steps.hpp):
// their exp against cpu::fastExp's bits on a sweep of every x <= 0; FlashAttentionScore forwards
// with every pse form, explicit masks, dropout, GQA, bands with masks, block edges, empty and
// length-1 sequences, fully masked rows and NaN inputs give the same bytes as the row steps
// (ATTNOPS_FA_ROW_STEPS=1) and pass the double reference under the tolerance rule; the same bits
// for 1, 2 and 3 threads; FusedInferAttentionScore's prefill route takes pseShift and explicit
// masks and gives the row steps' bytes too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/generic/fast_exp.hpp"
#include "cpu/isa.hpp"
#include "bias_steps.hpp"
#include "cpu/simd/fa_bias_steps.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using attnops::testsupport::ForcedImpl;
using attnops::testsupport::RowSteps;
using attnops::testsupport::canonicalBytes;
using attnops::testsupport::dropout;
using attnops::testsupport::maskSomeRowsFully;
using attnops::testsupport::masked;
using attnops::testsupport::pseMinusInfRows;
using attnops::testsupport::ThreadsGuard;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::FiaInstance;
using attnops::tools::FiaProblem;
using attnops::tools::HostTensor;
using attnops::tools::fixed;
using attnops::tools::kNoBand;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;

namespace {

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;

// ---------------------------------------------------------------- exp

using Avx2 = attnops::cpu::Avx2;

// fastExp as the row steps run it: compiled for the same target (FMA contraction included).
__attribute__((noinline)) ATTNOPS_AVX2_FN void scalarExps(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = attnops::cpu::fastExp(x[i]);
}
__attribute__((noinline)) ATTNOPS_AVX2_FN void vectorExps(const float* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; i += Avx2::kLanes)
        Avx2::store(y + i, attnops::fa::simd_bias::rowExp<Avx2>(Avx2::load(x + i)));
}

TEST(FaBiasSteps, RowExpHasFastExpBits) {
    const auto& f = attnops::cpu::isa();
    if (!(f.avx2 && f.fma && f.f16c)) GTEST_SKIP() << "no AVX2/FMA on this CPU";
    // Every 37th float from -0 down to -88 (the live range ends at -87.3), the ends, +0, -inf, NaN.
    std::vector<float> x;
    for (uint64_t bits = 0x80000000u; bits <= 0xC2B00000u; bits += 37) {
        float v;
        const uint32_t b = uint32_t(bits);
        std::memcpy(&v, &b, sizeof v);
        x.push_back(v);
    }
    // Where n = round(x log2 e) rounded once (fma) and twice (mul, then round) differ.
    for (float v : {-0x1.a56ef8p+2f, -0x1.fe2804p+2f, -0x1.842994p+3f, -0x1.b0861ap+3f, -0x1.dce2ap+3f}) x.push_back(v);
    for (float v : {0.0f, -0.0f, -87.3f, std::nextafter(-87.3f, 0.0f), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), -1e-30f})
        x.push_back(v);
    while (x.size() % Avx2::kLanes != 0) x.push_back(-1.0f);
    std::vector<float> a(x.size()), b(x.size());
    scalarExps(x.data(), a.data(), int64_t(x.size()));
    vectorExps(x.data(), b.data(), int64_t(x.size()));
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && differ++ < 5)
            ADD_FAILURE() << "x = " << x[i] << ": fastExp " << a[i] << ", rowExp " << b[i];
    EXPECT_EQ(differ, 0) << "of " << x.size();
}

// ---------------------------------------------------------------- FlashAttentionScore


void poison(FaInstance& inst) {
    for (HostTensor* t : {&inst.attentionOut, &inst.softmaxMax, &inst.softmaxSum})
        if (!t->empty()) std::fill(t->bytes().begin(), t->bytes().end(), uint8_t(0xFF));
}

using Edit = void (*)(FaInstance&);

// The instance of p after `edit`, run on the current settings.
FaInstance runFa(const FaProblem& p, Edit edit) {
    FaInstance inst(p);
    if (edit != nullptr) edit(inst);
    poison(inst);
    EXPECT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << p.describe() << ": " << attnopsGetLastErrorMessage();
    return inst;
}

void expectSameBytes(const FaInstance& a, const FaInstance& b, const std::string& what) {
    EXPECT_TRUE(canonicalBytes(a.attentionOut) == canonicalBytes(b.attentionOut)) << what << ": attentionOut";
    EXPECT_TRUE(canonicalBytes(a.softmaxMax) == canonicalBytes(b.softmaxMax)) << what << ": softmaxMax";
    EXPECT_TRUE(canonicalBytes(a.softmaxSum) == canonicalBytes(b.softmaxSum)) << what << ": softmaxSum";
}

// Vector steps vs row steps, byte for byte; vector steps vs the reference (unless the inputs hold
// NaN, whose rows the other suites check).
void expectRowStepBits(const FaProblem& p, Edit edit = nullptr, bool checkReference = true) {
    SCOPED_TRACE(p.describe());
    const FaInstance vec = runFa(p, edit);
    FaInstance row = [&] {
        RowSteps force;
        return runFa(p, edit);
    }();
    expectSameBytes(vec, row, "vector vs row steps");
    if (!checkReference) return;
    const auto rc = attnops::tools::checkForwardRows(vec, -1);
    EXPECT_TRUE(rc.passed) << "err " << rc.maxAbsError << " tol " << rc.tolerance << " stat " << rc.maxStatError
                           << (rc.nanMismatch ? " NaN mismatch " : " ") << rc.firstFailure;
}

void nanInQueryAndPse(FaInstance& inst) {
    inst.query.set(5, std::numeric_limits<float>::quiet_NaN());
    if (!inst.pse.empty()) inst.pse.set(inst.pse.numel() / 2, std::numeric_limits<float>::quiet_NaN());
}

void infInValue(FaInstance& inst) { inst.value.set(inst.value.numel() / 3, std::numeric_limits<float>::infinity()); }

TEST(FaBiasSteps, EveryPseFormHasRowStepBits) {
    expectRowStepBits(withPse(fixed("BNSD", F32, 2, 130, 257, 4, 2, 64), 1, "full"));
    expectRowStepBits(withPse(fixed("BSH", BF16, 1, 121, 129, 2, 1, 32), 0, "full"));
    expectRowStepBits(withPse(withMode(fixed("BSND", F16, 2, 129, 65, 2, 2, 32), 3), 1, "row"));
    expectRowStepBits(withPse(withMode(fixed("SBH", F32, 2, 64, 200, 2, 1, 32), 0, 7, 3), 0, "row"));
    expectRowStepBits(withPse(withMode(fixed("BNSD", F32, 1, 1100, 1100, 1, 1, 8), 3), 1, "compressed"));
    expectRowStepBits(withPse(withMode(fixed("BSH", BF16, 1, 1030, 1030, 1, 1, 8), 0, 100, -3), 0, "compressed"));
    const FaProblem t = tnd(F32, {5, 130, 1, 0, 70}, {9, 129, 1, 4, 3}, 4, 2, 32);
    expectRowStepBits(withPse(t, 1, "full"));
    expectRowStepBits(withPse(withMode(t, 3), 0, "row"));
    for (int type : {2, 3}) {
        expectRowStepBits(withPse(fixed("BNSD", F32, 2, 127, 255, 4, 1, 64), type));
        expectRowStepBits(withPse(withMode(fixed("BSND", BF16, 1, 241, 130, 4, 4, 32), 2), type));
    }
}

TEST(FaBiasSteps, ExplicitMasksHaveRowStepBits) {
    expectRowStepBits(masked(fixed("BNSD", F32, 2, 120, 128, 4, 2, 64)));  // one query tile, one key block
    expectRowStepBits(masked(fixed("BSND", F16, 1, 121, 129, 2, 1, 64)));
    expectRowStepBits(masked(fixed("BNSD", BF16, 1, 7, 300, 2, 2, 32), "causal"));
    expectRowStepBits(masked(withMode(fixed("BSH", F32, 2, 200, 150, 2, 1, 32), 0, 40, 5)));  // band and mask
    expectRowStepBits(masked(withMode(fixed("BNSD", F32, 1, 150, 150, 2, 1, 32), 1)));
    expectRowStepBits(withMode(fixed("BNSD", BF16, 2, 130, 170, 2, 1, 32), 5));  // prefix with its mask
    FaProblem t = masked(tnd(F16, {0, 1, 130, 9}, {3, 1, 257, 0}, 4, 1, 32));
    expectRowStepBits(t);
    expectRowStepBits(masked(fixed("BNSD", F32, 2, 130, 140, 2, 1, 32)), maskSomeRowsFully);
    expectRowStepBits(masked(withMode(fixed("BSND", BF16, 1, 125, 260, 4, 2, 64), 0, kNoBand, 0)), maskSomeRowsFully);
}

TEST(FaBiasSteps, DropoutHasRowStepBits) {
    expectRowStepBits(dropout(fixed("BNSD", F32, 2, 130, 129, 4, 2, 64)));
    expectRowStepBits(dropout(withMode(fixed("BSH", BF16, 1, 241, 241, 2, 1, 32), 3), 0.7, true));
    expectRowStepBits(dropout(tnd(F16, {1, 0, 150, 7}, {3, 9, 130, 0}, 2, 2, 32), 0.5));
    expectRowStepBits(dropout(masked(withPse(withMode(fixed("BNSD", F32, 1, 121, 300, 4, 1, 32), 0, kNoBand, 0), 1, "full"))));
    expectRowStepBits(dropout(withPse(fixed("SBH", BF16, 2, 1, 129, 2, 1, 64), 2), 0.8));  // length-1 queries
}

TEST(FaBiasSteps, NonFiniteInputsFollowTheRowSteps) {
    // NaN in a query row and in the pse; an infinite value (its block keeps the row steps).
    expectRowStepBits(masked(withPse(fixed("BNSD", F32, 1, 130, 140, 2, 1, 32), 1, "full")), nanInQueryAndPse, false);
    expectRowStepBits(withPse(withMode(fixed("BSND", F32, 1, 125, 200, 2, 1, 32), 3), 2), nanInQueryAndPse, false);
    expectRowStepBits(masked(withPse(fixed("BNSD", F32, 1, 130, 300, 2, 1, 32), 0, "full")), infInValue, false);
    expectRowStepBits(dropout(fixed("BNSD", F32, 1, 130, 140, 2, 1, 32)), infInValue, false);
}

TEST(FaBiasSteps, MinusInfPseRowsMatchTheReference) {
    // Row 5's first key block has only -inf scores (the row steps skip it; the vector steps once
    // gave exp(-inf - -inf) = NaN there), row 9 has no finite score at all (fully masked).
    expectRowStepBits(withPse(fixed("BNSD", F32, 1, 130, 260, 2, 1, 32), 0, "full"), pseMinusInfRows);
    expectRowStepBits(withPse(fixed("BSND", BF16, 2, 130, 200, 4, 2, 32), 1, "full"), pseMinusInfRows);
    expectRowStepBits(dropout(withPse(withMode(fixed("BNSD", F16, 1, 140, 300, 2, 1, 32), 3), 1, "full")),
                      pseMinusInfRows);
}

TEST(FaBiasSteps, ThreadCountsGiveTheSameBits) {
    ThreadsGuard guard;
    const FaProblem problems[] = {
        dropout(masked(withPse(withMode(fixed("BNSD", F32, 2, 250, 300, 4, 2, 32), 0, 100, 20), 1, "full"))),
        masked(withPse(tnd(BF16, {130, 1, 0, 241}, {129, 300, 5, 241}, 4, 1, 64), 0, "row")),
    };
    for (const FaProblem& p : problems) {
        SCOPED_TRACE(p.describe());
        std::vector<uint8_t> first;
        for (int32_t threads : {1, 2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
            const FaInstance inst = runFa(p, nullptr);
            std::vector<uint8_t> bytes = inst.attentionOut.bytes();
            for (const HostTensor* t : {&inst.softmaxMax, &inst.softmaxSum})
                bytes.insert(bytes.end(), t->bytes().begin(), t->bytes().end());
            if (threads == 1)
                first = bytes;
            else
                EXPECT_TRUE(bytes == first) << threads << " threads";
        }
    }
}

// ---------------------------------------------------------------- FusedInferAttentionScore

FiaInstance runFia(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << p.describe() << ": " << attnopsGetLastErrorMessage();
    return inst;
}

TEST(FaBiasSteps, FiaPrefillTakesPseAndMasksWithRowStepBits) {
    const char* route = attnops::testing::prefillRouteHere();
    if (route == nullptr) GTEST_SKIP() << "no prefill route runs on this CPU";
    std::vector<FiaProblem> ps;
    {
        FiaProblem p = attnops::testing::fiaProblem("BNSD", 2, 130, 257, 4, 2, 64);
        p.pse = "batch";
        ps.push_back(p);
    }
    {
        FiaProblem p = attnops::testing::fiaProblem("BSND", 1, 121, 129, 4, 1, 64);
        p.dtype = BF16;
        p.maskKind = "random";  // about a quarter masked, some rows fully
        p.pse = "shared";
        ps.push_back(p);
    }
    {
        FiaProblem p = attnops::testing::withMode(attnops::testing::fiaProblem("BSH", 2, 240, 300, 2, 2, 32), 1);
        p.maskKind = "random";
        ps.push_back(p);
    }
    {
        FiaProblem p = attnops::testing::fiaProblem("BSND", 2, 140, 130, 2, 2, 32);  // left padding, pse by physical rows
        p.qLens = {130, 125};
        p.kvLens = {100, 117};
        p.queryPadding = 3;
        p.kvPadding = 2;
        p.pse = "batch";
        p.maskKind = "random";
        ps.push_back(p);
    }
    {
        FiaProblem p = attnops::testing::fiaProblem("BNSD", 4, 150, 513, 4, 2, 32);  // empty and length-1 sequences
        p.qLens = {1, 0, 150, 121};
        p.kvLens = {3, 9, 150, 513};
        p.maskKind = "random";
        p.pse = "batch";
        ps.push_back(p);
    }
    for (const FiaProblem& p : ps) {
        SCOPED_TRACE(p.describe());
        const FiaInstance vec = runFia(p);
        EXPECT_EQ(attnops::tools::lastImplementation(), route);  // the planner's choice
        const attnops::tools::FiaCheck r = attnops::tools::checkFia(vec);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (error " << r.maxAbsError << ", tolerance " << r.tolerance << ")";
        EXPECT_GT(r.rows, 0);
        RowSteps force;
        const FiaInstance row = runFia(p);
        EXPECT_TRUE(canonicalBytes(vec.attentionOut) == canonicalBytes(row.attentionOut)) << "attentionOut";
        EXPECT_TRUE(canonicalBytes(vec.softmaxLse) == canonicalBytes(row.softmaxLse)) << "softmaxLse";
    }
}

TEST(FaBiasSteps, FiaMinusInfPseRowsMatchTheReference) {
    // pseShift rows of -inf through the prefill route (minusInfRows: row 9 has no finite score, so
    // output 0 and lse +inf; row 5 none in its first key block) and, with one query row, the
    // decode kernels (batch 0: the first 130 keys -inf; batch 1: every key).
    FiaProblem prefill = attnops::testing::fiaProblem("BNSD", 1, 130, 260, 2, 1, 32);
    prefill.pse = "shared";
    FiaProblem decode = attnops::testing::fiaProblem("BSND", 2, 1, 300, 4, 1, 32);
    decode.pse = "batch";
    for (const FiaProblem& p : {prefill, decode}) {
        SCOPED_TRACE(p.describe());
        FiaInstance inst(p);
        HostTensor& pse = inst.pseShift;
        if (p.qSeqLen > 1) {
            attnops::testsupport::minusInfRows(pse);
        } else {  // [B, N, 1, K]
            const int64_t cols = pse.shape().back(), perBatch = pse.numel() / pse.shape()[0];
            for (int64_t at = 0; at < pse.numel(); ++at)
                if (at >= perBatch || at % cols < 130) pse.set(at, -std::numeric_limits<float>::infinity());
        }
        ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        const attnops::tools::FiaCheck r = attnops::tools::checkFia(inst);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (error " << r.maxAbsError << ", tolerance " << r.tolerance << ")";
        EXPECT_GT(r.rows, 0);
    }
}

}  // namespace
