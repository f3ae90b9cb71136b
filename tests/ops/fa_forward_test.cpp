// FlashAttentionScore forward against the double reference.
#include <gtest/gtest.h>

#include "problem.hpp"

using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

namespace {

void expectMatches(const FaProblem& p, int64_t rows = -1) {
    FaInstance inst(p);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const auto rc = attnops::tools::checkForwardRows(inst, rows);
    EXPECT_TRUE(rc.passed) << p.describe() << ": err " << rc.maxAbsError << " tol " << rc.tolerance << " naive "
                           << rc.maxAbsNaiveError << " stat " << rc.maxStatError << " " << rc.firstFailure;
}

TEST(FaForward, SmokeBnsdFp32) {
    FaProblem p;
    expectMatches(p);
}

TEST(FaForward, SmokeBf16Causal) {
    FaProblem p;
    p.dtype = ATTNOPS_BFLOAT16;
    p.sparseMode = 2;
    p.qSeqLen = 100;
    p.kvSeqLen = 130;
    expectMatches(p);
}

}  // namespace
