// C API of FusedInferAttentionScore: unpack arguments, check, plan (cached per device), hand back
// the executor; no maths here.
#include "attnops/fused_infer_attention_score.h"
#include "core/error.hpp"
#include "ops/fused_infer_attention_score/check.hpp"
#include "ops/fused_infer_attention_score/forward.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

extern "C" {

attnopsStatus attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShiftOptional, const attnopsTensor* attenMaskOptional,
    const attnopsIntArray* actualSeqLengthsOptional, const attnopsIntArray* actualSeqLengthsKvOptional,
    const attnopsTensor* deqScale1Optional, const attnopsTensor* quantScale1Optional,
    const attnopsTensor* deqScale2Optional, const attnopsTensor* quantScale2Optional,
    const attnopsTensor* quantOffset2Optional, const attnopsTensor* antiquantScaleOptional,
    const attnopsTensor* antiquantOffsetOptional, const attnopsTensor* blockTableOptional,
    const attnopsTensor* queryPaddingSizeOptional, const attnopsTensor* kvPaddingSizeOptional,
    const attnopsTensor* keyAntiquantScaleOptional, const attnopsTensor* keyAntiquantOffsetOptional,
    const attnopsTensor* valueAntiquantScaleOptional, const attnopsTensor* valueAntiquantOffsetOptional,
    const attnopsTensor* keySharedPrefixOptional, const attnopsTensor* valueSharedPrefixOptional,
    const attnopsIntArray* actualSharedPrefixLenOptional, const attnopsTensor* queryRopeOptional,
    const attnopsTensor* keyRopeOptional, const attnopsTensor* keyRopeAntiquantScaleOptional,
    const attnopsTensor* dequantScaleQueryOptional, const attnopsTensor* learnableSinkOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, int64_t queryQuantMode, const attnopsTensor* attentionOut,
    const attnopsTensor* softmaxLse, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        fia::Args a;
        a.query = query;
        a.key = key;
        a.keyCount = keyCount;
        a.value = value;
        a.valueCount = valueCount;
        a.pseShift = pseShiftOptional;
        a.attenMask = attenMaskOptional;
        a.actualSeqLengths = actualSeqLengthsOptional;
        a.actualSeqLengthsKv = actualSeqLengthsKvOptional;
        a.deqScale1 = deqScale1Optional;
        a.quantScale1 = quantScale1Optional;
        a.deqScale2 = deqScale2Optional;
        a.quantScale2 = quantScale2Optional;
        a.quantOffset2 = quantOffset2Optional;
        a.antiquantScale = antiquantScaleOptional;
        a.antiquantOffset = antiquantOffsetOptional;
        a.blockTable = blockTableOptional;
        a.queryPaddingSize = queryPaddingSizeOptional;
        a.kvPaddingSize = kvPaddingSizeOptional;
        a.keyAntiquantScale = keyAntiquantScaleOptional;
        a.keyAntiquantOffset = keyAntiquantOffsetOptional;
        a.valueAntiquantScale = valueAntiquantScaleOptional;
        a.valueAntiquantOffset = valueAntiquantOffsetOptional;
        a.keySharedPrefix = keySharedPrefixOptional;
        a.valueSharedPrefix = valueSharedPrefixOptional;
        a.actualSharedPrefixLen = actualSharedPrefixLenOptional;
        a.queryRope = queryRopeOptional;
        a.keyRope = keyRopeOptional;
        a.keyRopeAntiquantScale = keyRopeAntiquantScaleOptional;
        a.dequantScaleQuery = dequantScaleQueryOptional;
        a.learnableSink = learnableSinkOptional;
        a.numHeads = numHeads;
        a.scaleValue = scaleValue;
        a.preTokens = preTokens;
        a.nextTokens = nextTokens;
        a.inputLayout = inputLayout;
        a.numKeyValueHeads = numKeyValueHeads;
        a.sparseMode = sparseMode;
        a.innerPrecise = innerPrecise;
        a.blockSize = blockSize;
        a.antiquantMode = antiquantMode;
        a.softmaxLseFlag = softmaxLseFlag;
        a.keyAntiquantMode = keyAntiquantMode;
        a.valueAntiquantMode = valueAntiquantMode;
        a.queryQuantMode = queryQuantMode;
        a.attentionOut = attentionOut;
        a.softmaxLse = softmaxLse;

        Device& device = Runtime::get().currentDevice();
        fia::Params params = fia::checkForward(a, device.index());
        const int32_t threads = device.threads();
        const std::string forced = envString("ATTNOPS_FORCE_IMPL");
        auto plan = device.planCache().getOrMake<fia::Plan>("fia.forward|" + fia::planKey(params, threads, forced),
                                                            [&] { return fia::makePlan(params, threads, forced); });
        auto exec = std::make_unique<fia::Executor>(std::move(params), std::move(plan));
        exec->device = device.index();
        *workspaceSize = exec->workspaceBytes;
        *executor = registerExecutor(std::move(exec));
    });
}

attnopsStatus attnopsFusedInferAttentionScoreV4(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

}  // extern "C"
