// FlashAttentionScore forward: the driver that runs a plan's work units on a device's pool, and
// the executor handed to the caller between the two API phases.
#pragma once

#include <memory>

#include "ops/flash_attention_score/params.hpp"
#include "ops/flash_attention_score/plan.hpp"
#include "runtime/executor.hpp"
#include "runtime/thread_pool.hpp"

namespace attnops::fa {

// Runs every work unit of `plan`, then writes the TND tail rows. `workspace` holds
// plan.workspaceBytes; the pool must not have more threads than the plan booked scratch for.
void runForward(const ForwardParams& p, const ForwardPlan& plan, void* workspace, ThreadPool& pool);

class ForwardExecutor final : public attnopsExecutor {
public:
    ForwardExecutor(ForwardParams params, std::shared_ptr<const ForwardPlan> plan)
        : params_(std::move(params)), plan_(std::move(plan)) {
        workspaceBytes = plan_->workspaceBytes;
    }
    const char* opName() const override { return "FlashAttentionScore"; }
    const char* implementation() const override { return plan_->kernel->name; }
    void run(void* workspace, ThreadPool& pool) override { runForward(params_, *plan_, workspace, pool); }
    const ForwardPlan& plan() const { return *plan_; }

private:
    ForwardParams params_;
    std::shared_ptr<const ForwardPlan> plan_;
};

}  // namespace attnops::fa
