// Phase 1 of a FusedInferAttentionScore call built from a FiaInstance and then edited: the
// status and the message, for the tests of bad input (shared by the FIA test files).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "attnops/attnops.h"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"

namespace attnops::testing {

struct Outcome {
    attnopsStatus status;
    std::string message;
};

template <typename Edit>
Outcome planWith(const tools::FiaInstance& inst, Edit&& edit) {
    const tools::FiaArrays arrays(inst);
    const attnopsTensor* kv[2];
    fia::Args a = tools::fiaArgs(inst, arrays, kv);
    std::forward<Edit>(edit)(a);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = tools::fiaGetWorkspace(a, &ws, &exec);
    const std::string message = attnopsGetLastErrorMessage();
    if (st == ATTNOPS_SUCCESS) attnopsDestroyExecutor(exec);
    return {st, message};
}

inline void expectRejected(const Outcome& o, attnopsStatus status, const std::string& needle) {
    EXPECT_EQ(o.status, status) << o.message;
    EXPECT_NE(o.message.find(needle), std::string::npos) << "message: " << o.message << "\nexpected to contain: " << needle;
}

}  // namespace attnops::testing
