// FusedInferAttentionScore forward: the driver that runs a plan's work units on a device's pool,
// and the executor handed to the caller between the two API phases.
#pragma once

#include <memory>

#include "ops/fused_infer_attention_score/params.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "runtime/executor.hpp"
#include "runtime/thread_pool.hpp"

namespace attnops::fia {

// Runs every work unit of `plan`, then writes the rows no unit computes (beyond a batch's actual
// length, TND rows beyond the last cumulative end): output 0, softmaxLse +inf.
void runForward(const Params& p, const Plan& plan, void* workspace, ThreadPool& pool);

class Executor final : public attnopsExecutor {
public:
    Executor(Params params, std::shared_ptr<const Plan> plan) : params_(std::move(params)), plan_(std::move(plan)) {
        workspaceBytes = plan_->workspaceBytes;
    }
    const char* opName() const override { return "FusedInferAttentionScore"; }
    const char* implementation() const override { return plan_->kernel->name; }
    void run(void* workspace, ThreadPool& pool) override { runForward(params_, *plan_, workspace, pool); }

private:
    Params params_;
    std::shared_ptr<const Plan> plan_;
};

}  // namespace attnops::fia
