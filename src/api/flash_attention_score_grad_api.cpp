// C API of FlashAttentionScoreGrad: unpack arguments, check, plan (cached per device), hand back
// the executor; no maths here.
#include <fmt/format.h>

#include "attnops/flash_attention_score_ex.h"
#include "attnops/flash_attention_score_grad.h"
#include "core/error.hpp"
#include "ops/flash_attention_score/backward.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/plan.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

extern "C" {

attnopsStatus attnopsFlashAttentionScoreGradGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* dy,
    const attnopsTensor* pseShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional, const attnopsTensor* softmaxMax,
    const attnopsTensor* softmaxSum, const attnopsTensor* softmaxInOptional, const attnopsTensor* attentionIn,
    const attnopsIntArray* prefixOptional, const attnopsIntArray* actualSeqQLenOptional,
    const attnopsIntArray* actualSeqKvLenOptional, const attnopsIntArray* qStartIdxOptional,
    const attnopsIntArray* kvStartIdxOptional, const attnopsTensor* sinkInOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, const char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset,
    const attnopsTensor* dqOut, const attnopsTensor* dkOut, const attnopsTensor* dvOut,
    const attnopsTensor* dpseOutOptional, const attnopsTensor* dsinkOutOptional, uint64_t* workspaceSize,
    attnopsExecutor** executor) {
    return attnopsFlashAttentionScoreGradExGetWorkspaceSize(
        query, key, value, dy, pseShiftOptional, dropMaskOptional, paddingMaskOptional, attenMaskOptional, softmaxMax,
        softmaxSum, softmaxInOptional, attentionIn, prefixOptional, actualSeqQLenOptional, actualSeqKvLenOptional,
        qStartIdxOptional, kvStartIdxOptional, sinkInOptional, scaleValue, keepProb, preTokens, nextTokens, headNum,
        inputLayout, innerPrecise, sparseMode, pseType, seed, offset, dqOut, dkOut, dvOut, dpseOutOptional,
        dsinkOutOptional, nullptr, workspaceSize, executor);
}

attnopsStatus attnopsFlashAttentionScoreGradExGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* dy,
    const attnopsTensor* pseShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional, const attnopsTensor* softmaxMax,
    const attnopsTensor* softmaxSum, const attnopsTensor* softmaxInOptional, const attnopsTensor* attentionIn,
    const attnopsIntArray* prefixOptional, const attnopsIntArray* actualSeqQLenOptional,
    const attnopsIntArray* actualSeqKvLenOptional, const attnopsIntArray* qStartIdxOptional,
    const attnopsIntArray* kvStartIdxOptional, const attnopsTensor* sinkInOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, const char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset,
    const attnopsTensor* dqOut, const attnopsTensor* dkOut, const attnopsTensor* dvOut,
    const attnopsTensor* dpseOutOptional, const attnopsTensor* dsinkOutOptional,
    const attnopsFlashAttentionExtras* extras, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        fa::BackwardArgs args;
        fa::ForwardArgs& f = args.forward;
        f.query = query;
        f.key = key;
        f.value = value;
        f.realShift = pseShiftOptional;
        f.dropMask = dropMaskOptional;
        f.paddingMask = paddingMaskOptional;
        f.attenMask = attenMaskOptional;
        f.prefix = prefixOptional;
        f.actualSeqQLen = actualSeqQLenOptional;
        f.actualSeqKvLen = actualSeqKvLenOptional;
        f.qStartIdx = qStartIdxOptional;
        f.kvStartIdx = kvStartIdxOptional;
        f.sink = sinkInOptional;
        f.scaleValue = scaleValue;
        f.keepProb = keepProb;
        f.preTokens = preTokens;
        f.nextTokens = nextTokens;
        f.headNum = headNum;
        f.inputLayout = inputLayout;
        f.innerPrecise = innerPrecise;
        f.sparseMode = sparseMode;
        f.pseType = pseType;
        f.seed = seed;
        f.offset = offset;
        f.softmaxMax = softmaxMax;
        f.softmaxSum = softmaxSum;
        f.attentionOut = attentionIn;
        f.attentionOutName = "attentionIn";
        f.extras = extras;
        args.dy = dy;
        args.softmaxIn = softmaxInOptional;
        args.dq = dqOut;
        args.dk = dkOut;
        args.dv = dvOut;
        args.dpse = dpseOutOptional;
        args.dsink = dsinkOutOptional;

        Device& device = Runtime::get().currentDevice();
        fa::BackwardParams params = fa::checkBackward(args, device.index());
        const int32_t threads = device.threads();
        const std::string forced = envString("ATTNOPS_FORCE_IMPL");
        // The extended entry point may read/write fp32 tensors from half inputs: its own plans.
        const std::string kind =
            extras ? fmt::format("fa.backward.ex{}.{}.{}.{}|", int(params.fwd.out.dtype), int(params.dq.dtype),
                                 int(params.dk.dtype), int(params.dv.dtype))
                   : "fa.backward|";
        auto plan = device.planCache().getOrMake<fa::BackwardPlan>(
            kind + fa::forwardPlanKey(params.fwd, threads, forced),
            [&] { return fa::makeBackwardPlan(params, threads, platform(), forced); });
        auto exec = std::make_unique<fa::BackwardExecutor>(std::move(params), std::move(plan));
        exec->device = device.index();
        *workspaceSize = exec->workspaceBytes;
        *executor = registerExecutor(std::move(exec));
    });
}

attnopsStatus attnopsFlashAttentionScoreGrad(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                             attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

}  // extern "C"
