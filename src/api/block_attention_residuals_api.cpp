// C API of BlockAttentionResiduals and its grad: unpack arguments, check, plan (cached per
// device), hand back the executor; no maths here.
#include "attnops/block_attention_residuals.h"
#include "core/error.hpp"
#include "ops/block_attention_residuals/check.hpp"
#include "ops/block_attention_residuals/ops.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

namespace {

template <typename Executor, typename Params, typename MakePlan>
void planAndBind(const char* direction, const char* opName, Params params, MakePlan makePlan, uint64_t* workspaceSize,
                 attnopsExecutor** executor, Device& device) {
    const int32_t threads = device.threads();
    const std::string forced = envString("ATTNOPS_FORCE_IMPL");
    auto plan = device.planCache().getOrMake<bar::Plan>(bar::planKey(direction, params.src, threads, forced),
                                                        [&] { return makePlan(params, threads, forced); });
    auto exec = std::make_unique<Executor>(opName, std::move(params), std::move(plan));
    exec->device = device.index();
    *workspaceSize = exec->workspaceBytes;
    *executor = registerExecutor(std::move(exec));
}

}  // namespace

extern "C" {

attnopsStatus attnopsBlockAttentionResidualsGetWorkspaceSize(
    const attnopsTensor* partialBlock, const attnopsTensor* blockRes, const attnopsTensor* projWeight,
    const attnopsTensor* normWeight, int64_t validBlockNum, double normEps, bool needBackward,
    const attnopsTensor* hiddenStates, const attnopsTensor* invNorm, const attnopsTensor* probs, uint64_t* workspaceSize,
    attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        Device& device = Runtime::get().currentDevice();
        bar::ForwardArgs a{partialBlock, blockRes, projWeight, normWeight, validBlockNum, normEps, needBackward,
                           hiddenStates, invNorm, probs};
        planAndBind<bar::ForwardExecutor>("forward", "BlockAttentionResiduals", bar::checkForward(a, device.index()),
                                          bar::makeForwardPlan, workspaceSize, executor, device);
    });
}

attnopsStatus attnopsBlockAttentionResiduals(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                             attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

attnopsStatus attnopsBlockAttentionResidualsGradGetWorkspaceSize(
    const attnopsTensor* partialBlock, const attnopsTensor* blockRes, const attnopsTensor* projWeight,
    const attnopsTensor* normWeight, const attnopsTensor* gradHiddenStates, const attnopsTensor* invNorm,
    const attnopsTensor* probs, int64_t validBlockNum, const attnopsTensor* gradPartialBlock,
    const attnopsTensor* gradBlockRes, const attnopsTensor* gradProjWeight, const attnopsTensor* gradNormWeight,
    uint64_t* workspaceSize, attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        Device& device = Runtime::get().currentDevice();
        bar::BackwardArgs a{partialBlock, blockRes, projWeight, normWeight, gradHiddenStates, invNorm, probs,
                            validBlockNum, gradPartialBlock, gradBlockRes, gradProjWeight, gradNormWeight};
        planAndBind<bar::BackwardExecutor>("backward", "BlockAttentionResidualsGrad", bar::checkBackward(a, device.index()),
                                           bar::makeBackwardPlan, workspaceSize, executor, device);
    });
}

attnopsStatus attnopsBlockAttentionResidualsGrad(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                 attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

}  // extern "C"
