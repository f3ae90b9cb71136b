// BlockAttentionResiduals drivers and the executors handed to the caller between the two phases.
#pragma once

#include <memory>

#include "ops/block_attention_residuals/params.hpp"
#include "ops/block_attention_residuals/plan.hpp"
#include "runtime/executor.hpp"
#include "runtime/thread_pool.hpp"

namespace attnops::bar {

void runForward(const ForwardParams& p, const Plan& plan, void* workspace, ThreadPool& pool);
void runBackward(const BackwardParams& p, const Plan& plan, void* workspace, ThreadPool& pool);

template <typename Params, void (*Run)(const Params&, const Plan&, void*, ThreadPool&)>
class Executor final : public attnopsExecutor {
public:
    Executor(const char* name, Params params, std::shared_ptr<const Plan> plan)
        : name_(name), params_(std::move(params)), plan_(std::move(plan)) {
        workspaceBytes = plan_->workspaceBytes;
    }
    const char* opName() const override { return name_; }
    const char* implementation() const override { return plan_->kernel->name; }
    void run(void* workspace, ThreadPool& pool) override { Run(params_, *plan_, workspace, pool); }

private:
    const char* name_;
    Params params_;
    std::shared_ptr<const Plan> plan_;
};

using ForwardExecutor = Executor<ForwardParams, runForward>;
using BackwardExecutor = Executor<BackwardParams, runBackward>;

}  // namespace attnops::bar
