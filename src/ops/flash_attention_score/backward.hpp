// FlashAttentionScoreGrad: the driver that runs a backward plan on a device's pool, and the
// executor handed to the caller between the two API phases.
#pragma once

#include <memory>

#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/plan.hpp"
#include "runtime/executor.hpp"
#include "runtime/thread_pool.hpp"

namespace attnops::fa {

// Key units (dk, dv), then query units (dq), then dsink and the TND tails.
void runBackward(const BackwardParams& p, const BackwardPlan& plan, void* workspace, ThreadPool& pool);

// accumulate mode (extended entry point): bytes of the fp32 dq, dk, dv the kernels write before
// they are added into the caller's tensors, and the run that does it (the gradients land in
// workspace + offset, then out += grad element by element: one addition, deterministic).
uint64_t accumulateBytes(const BackwardParams& p);
void runBackwardAccumulating(const BackwardParams& p, const BackwardPlan& plan, void* workspace, uint64_t offset,
                             ThreadPool& pool);

class BackwardExecutor final : public attnopsExecutor {
public:
    BackwardExecutor(BackwardParams params, std::shared_ptr<const BackwardPlan> plan)
        : params_(std::move(params)), plan_(std::move(plan)) {
        workspaceBytes = plan_->workspaceBytes;
        if (params_.accumulate) workspaceBytes += accumulateBytes(params_);
    }
    const char* opName() const override { return "FlashAttentionScoreGrad"; }
    const char* implementation() const override { return plan_->kernel->name; }
    void run(void* workspace, ThreadPool& pool) override {
        if (params_.dsink != nullptr)
            params_.sinkRowTerms = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan_->sinkTermsOffset);
        if (params_.accumulate)
            runBackwardAccumulating(params_, *plan_, workspace, plan_->workspaceBytes, pool);
        else
            runBackward(params_, *plan_, workspace, pool);
    }

private:
    BackwardParams params_;
    std::shared_ptr<const BackwardPlan> plan_;
};

}  // namespace attnops::fa
