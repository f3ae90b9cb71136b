// The backward's vector steps for pse, explicit attenMask and dropout
// (cpu/simd/fa_backward_bias_steps.hpp): FlashAttentionScoreGrad with every pse form, explicit
// masks (with fully masked rows), dropout at several keep probabilities, sinks, every sparse
// mode, GQA, TND with uneven lengths, fp32/bf16/fp16 and block edges gives the same dq, dk, dv
// and dsink bytes as the row steps (ATTNOPS_FA_ROW_STEPS=1) in both schemes (fused and two-kind)
// and passes the double reference under the tolerance rule; non-finite inputs and pse rows of
// -inf follow the row steps; 1, 2 and 3 threads give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "bias_steps.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "threads_guard.hpp"

using attnops::testsupport::ForcedImpl;
using attnops::testsupport::RowSteps;
using attnops::testsupport::canonicalBytes;
using attnops::testsupport::dropout;
using attnops::testsupport::maskSomeRowsFully;
using attnops::testsupport::masked;
using attnops::testsupport::pseMinusInfRows;
using attnops::testsupport::ThreadsGuard;
using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::GradCheck;
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

// The fp32 backward entries: fused scheme, then the two-kind scheme.
constexpr const char* kSchemes[] = {"avx512-fused", "avx512", "avx2-fused", "avx2"};


// Gradient outputs start as 0xFF bytes, so that an element the kernel forgets cannot pass.
void poison(FaGrads& g) {
    for (HostTensor* t : {&g.dq, &g.dk, &g.dv, &g.dsink})
        if (!t->empty()) std::fill(t->bytes().begin(), t->bytes().end(), uint8_t(0xFF));
}

// The backward with the current settings under `impl`; false where this CPU lacks the entry.
bool runGrads(const FaInstance& inst, const char* impl, FaGrads& g) {
    ForcedImpl force(impl);
    poison(g);
    const attnopsStatus st = attnops::tools::runBackward(inst, g);
    if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) return false;
    EXPECT_EQ(st, ATTNOPS_SUCCESS) << impl << ": " << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnops::tools::lastImplementation(), impl);
    return st == ATTNOPS_SUCCESS;
}

void expectSameGrads(const FaGrads& a, const FaGrads& b, const std::string& what) {
    EXPECT_TRUE(canonicalBytes(a.dq) == canonicalBytes(b.dq)) << what << ": dq";
    EXPECT_TRUE(canonicalBytes(a.dk) == canonicalBytes(b.dk)) << what << ": dk";
    EXPECT_TRUE(canonicalBytes(a.dv) == canonicalBytes(b.dv)) << what << ": dv";
    EXPECT_TRUE(canonicalBytes(a.dsink) == canonicalBytes(b.dsink)) << what << ": dsink";
}

using Edit = void (*)(FaInstance&);

// For each scheme this CPU runs: vector steps vs row steps byte for byte, and (unless the inputs
// hold NaN or inf, whose rows other suites check) the vector steps vs the double reference.
void expectRowStepBits(const FaProblem& p, Edit edit = nullptr, bool checkReference = true) {
    SCOPED_TRACE(p.describe());
    FaInstance inst(p);
    if (edit != nullptr) edit(inst);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    int ran = 0;
    for (const char* impl : kSchemes) {
        FaGrads vec = attnops::tools::makeGrads(inst);
        if (!runGrads(inst, impl, vec)) continue;
        ++ran;
        FaGrads row = attnops::tools::makeGrads(inst);
        {
            RowSteps force;
            ASSERT_TRUE(runGrads(inst, impl, row));
        }
        expectSameGrads(vec, row, std::string(impl) + " vector vs row steps");
        if (!checkReference) continue;
        const GradCheck rc = attnops::tools::checkBackward(inst, vec);
        EXPECT_TRUE(rc.passed) << impl << ": " << rc.failure << " (dq err " << rc.maxAbsError[0] << " tol "
                               << rc.tolerance[0] << ", dk err " << rc.maxAbsError[1] << " tol " << rc.tolerance[1]
                               << ", dv err " << rc.maxAbsError[2] << " tol " << rc.tolerance[2] << ")";
    }
    EXPECT_GT(ran, 0) << "no vector backward runs on this CPU";
}

FaProblem withSink(FaProblem p) {
    p.sink = true;
    return p;
}

FaProblem withDtype(FaProblem p, attnopsDataType dt) {
    p.dtype = dt;
    return p;
}

void nanInQuery(FaInstance& inst) { inst.query.set(5, std::numeric_limits<float>::quiet_NaN()); }
void infInKey(FaInstance& inst) { inst.key.set(inst.key.numel() / 3, std::numeric_limits<float>::infinity()); }
void infInValue(FaInstance& inst) { inst.value.set(inst.value.numel() / 3, std::numeric_limits<float>::infinity()); }

TEST(FaBwdBiasSteps, EveryPseFormHasRowStepBits) {
    expectRowStepBits(withPse(fixed("BNSD", F32, 2, 130, 257, 4, 2, 64), 1, "full"));  // inner (before the scale)
    expectRowStepBits(withPse(fixed("BSH", BF16, 1, 121, 129, 2, 1, 32), 0, "full"));   // outer
    expectRowStepBits(withPse(withMode(fixed("BSND", F16, 2, 129, 65, 2, 2, 32), 3), 1, "row"));
    expectRowStepBits(withPse(withMode(fixed("SBH", F32, 2, 64, 200, 2, 1, 32), 0, 7, 3), 0, "row"));
    expectRowStepBits(withPse(withMode(fixed("BNSD", F32, 1, 1100, 1100, 1, 1, 8), 3), 1, "compressed"));
    expectRowStepBits(withPse(withMode(fixed("BSH", BF16, 1, 1030, 1030, 1, 1, 8), 0, 100, -3), 0, "compressed"));
    const FaProblem t = tnd(F32, {5, 130, 1, 0, 70}, {9, 129, 1, 4, 3}, 4, 2, 32);
    expectRowStepBits(withPse(t, 1, "full"));
    expectRowStepBits(withPse(withMode(t, 3), 0, "row"));
    for (int type : {2, 3}) {  // alibi slopes
        expectRowStepBits(withPse(fixed("BNSD", F32, 2, 127, 255, 4, 1, 64), type));
        expectRowStepBits(withPse(withMode(fixed("BSND", BF16, 1, 241, 130, 4, 4, 32), 2), type));
        expectRowStepBits(withSink(withPse(withMode(withDtype(t, F16), 2), type)));
    }
}

TEST(FaBwdBiasSteps, ExplicitMasksHaveRowStepBits) {
    expectRowStepBits(masked(fixed("BNSD", F32, 2, 120, 128, 4, 2, 64)));  // one query tile, one key block
    expectRowStepBits(masked(fixed("BSND", F16, 1, 121, 129, 2, 1, 64)));
    expectRowStepBits(masked(fixed("BNSD", BF16, 1, 7, 300, 2, 2, 32), "causal"));
    expectRowStepBits(masked(withMode(fixed("BSH", F32, 2, 200, 150, 2, 1, 32), 0, 40, 5)));  // band and mask
    expectRowStepBits(masked(withMode(fixed("BNSD", F32, 1, 150, 150, 2, 1, 32), 1)));
    expectRowStepBits(withMode(fixed("BNSD", BF16, 2, 130, 170, 2, 1, 32), 5));  // prefix with its mask
    expectRowStepBits(masked(tnd(F16, {0, 1, 130, 9}, {3, 1, 257, 0}, 4, 1, 32)));
    expectRowStepBits(masked(fixed("BNSD", F32, 2, 130, 140, 2, 1, 32)), maskSomeRowsFully);
    expectRowStepBits(withSink(masked(withMode(fixed("BSND", BF16, 1, 125, 260, 4, 2, 64), 0, kNoBand, 0))),
                      maskSomeRowsFully);
}

TEST(FaBwdBiasSteps, DropoutHasRowStepBits) {
    expectRowStepBits(dropout(fixed("BNSD", F32, 2, 130, 129, 4, 2, 64)));
    expectRowStepBits(dropout(withMode(fixed("BSH", BF16, 1, 241, 241, 2, 1, 32), 3), 0.7, true));
    expectRowStepBits(dropout(tnd(F16, {1, 0, 150, 7}, {3, 9, 130, 0}, 2, 2, 32), 0.5));
    expectRowStepBits(withSink(dropout(fixed("BSND", F32, 1, 200, 135, 2, 1, 48), 0.3)));
    expectRowStepBits(dropout(masked(withPse(withMode(fixed("BNSD", F32, 1, 121, 300, 4, 1, 32), 0, kNoBand, 0), 1, "full"))));
    expectRowStepBits(dropout(withPse(fixed("SBH", BF16, 2, 1, 129, 2, 1, 64), 2), 0.8));  // length-1 queries
}

TEST(FaBwdBiasSteps, EverySparseModeHasRowStepBits) {
    const FaProblem base = dropout(withPse(fixed("BNSD", F32, 2, 250, 260, 4, 2, 32), 0, "full"), 0.85);
    for (int64_t mode : {0, 1, 2, 3, 4, 5, 6}) {
        FaProblem p = mode == 0 ? withMode(base, 0, 70, 30) : (mode == 4 ? withMode(base, 4, 60, 10) : withMode(base, mode));
        if (mode == 1) p = masked(p);
        expectRowStepBits(p);
    }
    const FaProblem t = dropout(tnd(BF16, {0, 130, 1, 70, 5}, {4, 129, 1, 80, 3}, 4, 1, 32), 0.8);
    expectRowStepBits(withMode(t, 7, 20, 5));
    expectRowStepBits(withMode(withPse(t, 1, "full"), 8, 30, 2));
    expectRowStepBits(withSink(withMode(t, 2)));
}

TEST(FaBwdBiasSteps, NonFiniteInputsAndMinusInfPseFollowTheRowSteps) {
    // Rows of -inf pse against the reference too (a row with no finite score is fully masked).
    expectRowStepBits(withPse(fixed("BNSD", F32, 1, 130, 260, 2, 1, 32), 0, "full"), pseMinusInfRows);
    expectRowStepBits(withSink(dropout(withPse(withMode(fixed("BNSD", F32, 1, 140, 300, 2, 1, 32), 3), 1, "full"))),
                      pseMinusInfRows);
    expectRowStepBits(withPse(fixed("BSND", BF16, 2, 130, 200, 4, 2, 32), 1, "full"), pseMinusInfRows);
    expectRowStepBits(masked(withPse(fixed("BNSD", F32, 1, 130, 140, 2, 1, 32), 1, "full")), nanInQuery, false);
    expectRowStepBits(withSink(dropout(fixed("BNSD", F32, 1, 130, 140, 2, 1, 32))), nanInQuery, false);
    expectRowStepBits(masked(withPse(fixed("BNSD", F32, 1, 130, 300, 2, 1, 32), 0, "full")), infInKey, false);
    expectRowStepBits(withSink(dropout(withMode(fixed("BNSD", F32, 1, 130, 140, 2, 1, 32), 2))), infInValue, false);
}

TEST(FaBwdBiasSteps, ThreadCountsGiveTheSameBits) {
    ThreadsGuard guard;
    const FaProblem problems[] = {
        withSink(dropout(masked(withPse(withMode(fixed("BNSD", F32, 2, 250, 300, 4, 2, 32), 0, 100, 20), 1, "full")))),
        masked(withPse(tnd(BF16, {130, 1, 0, 241}, {129, 300, 5, 241}, 4, 1, 64), 0, "row")),
        dropout(withPse(withMode(fixed("BSND", F16, 1, 700, 700, 2, 1, 64), 2), 3), 0.6),
    };
    for (const FaProblem& p : problems) {
        SCOPED_TRACE(p.describe());
        FaInstance inst(p);
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        for (const char* impl : kSchemes) {
            FaGrads first = attnops::tools::makeGrads(inst);
            for (int32_t threads : {1, 2, 3}) {
                ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                FaGrads g = attnops::tools::makeGrads(inst);
                if (!runGrads(inst, impl, g)) break;
                if (threads == 1)
                    first = std::move(g);
                else
                    expectSameGrads(first, g, std::string(impl) + " " + std::to_string(threads) + " threads");
            }
        }
    }
}

}  // namespace
