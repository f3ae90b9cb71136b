// C API of the inference family (FusedInferAttentionScore V1-V4, PromptFlashAttention V1-V3,
// IncreFlashAttention V1-V4): unpack arguments into FusedInferAttentionScore's, check, plan (cached
// per device), hand back the executor; no maths here. One core serves them all (spec section A).
#include "attnops/fused_infer_attention_score.h"
#include "attnops/incre_flash_attention.h"
#include "attnops/prompt_flash_attention.h"
#include "core/error.hpp"
#include "ops/fused_infer_attention_score/check.hpp"
#include "ops/fused_infer_attention_score/forward.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

namespace {

// Phase 1 of every entry point, from FusedInferAttentionScore's arguments.
attnopsStatus plan(const fia::Args& a, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
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

// FusedInferAttentionScore's V1 arguments; addV2/addV3 add what V2 and V3 inserted.
fia::Args v1Args(const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
                 const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShift,
                 const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths,
                 const attnopsIntArray* actualSeqLengthsKv, const attnopsTensor* deqScale1, const attnopsTensor* quantScale1,
                 const attnopsTensor* deqScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
                 const attnopsTensor* antiquantScale, const attnopsTensor* antiquantOffset, const attnopsTensor* blockTable,
                 const attnopsTensor* queryPaddingSize, const attnopsTensor* kvPaddingSize, int64_t numHeads,
                 double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
                 int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
                 const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse) {
    fia::Args a;
    a.query = query;
    a.key = key;
    a.keyCount = keyCount;
    a.value = value;
    a.valueCount = valueCount;
    a.pseShift = pseShift;
    a.attenMask = attenMask;
    a.actualSeqLengths = actualSeqLengths;
    a.actualSeqLengthsKv = actualSeqLengthsKv;
    a.deqScale1 = deqScale1;
    a.quantScale1 = quantScale1;
    a.deqScale2 = deqScale2;
    a.quantScale2 = quantScale2;
    a.quantOffset2 = quantOffset2;
    a.antiquantScale = antiquantScale;
    a.antiquantOffset = antiquantOffset;
    a.blockTable = blockTable;
    a.queryPaddingSize = queryPaddingSize;
    a.kvPaddingSize = kvPaddingSize;
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
    a.attentionOut = attentionOut;
    a.softmaxLse = softmaxLse;
    return a;
}

void addV2(fia::Args& a, const attnopsTensor* keyAntiquantScale, const attnopsTensor* keyAntiquantOffset,
           const attnopsTensor* valueAntiquantScale, const attnopsTensor* valueAntiquantOffset,
           const attnopsTensor* keySharedPrefix, const attnopsTensor* valueSharedPrefix,
           const attnopsIntArray* actualSharedPrefixLen, int64_t keyAntiquantMode, int64_t valueAntiquantMode) {
    a.keyAntiquantScale = keyAntiquantScale;
    a.keyAntiquantOffset = keyAntiquantOffset;
    a.valueAntiquantScale = valueAntiquantScale;
    a.valueAntiquantOffset = valueAntiquantOffset;
    a.keySharedPrefix = keySharedPrefix;
    a.valueSharedPrefix = valueSharedPrefix;
    a.actualSharedPrefixLen = actualSharedPrefixLen;
    a.keyAntiquantMode = keyAntiquantMode;
    a.valueAntiquantMode = valueAntiquantMode;
}

void addV3(fia::Args& a, const attnopsTensor* queryRope, const attnopsTensor* keyRope, const attnopsTensor* keyRopeAntiquantScale) {
    a.queryRope = queryRope;
    a.keyRope = keyRope;
    a.keyRopeAntiquantScale = keyRopeAntiquantScale;
}

// PromptFlashAttention V3's arguments (V1 and V2 pass the defaults of what they lack).
attnopsStatus planPrompt(const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
                         const attnopsTensor* pseShift, const attnopsTensor* attenMask,
                         const attnopsIntArray* actualSeqLengths, const attnopsIntArray* actualSeqLengthsKv,
                         const attnopsTensor* deqScale1, const attnopsTensor* quantScale1, const attnopsTensor* deqScale2,
                         const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2, int64_t numHeads,
                         double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout,
                         int64_t numKeyValueHeads, int64_t sparseMode, int64_t innerPrecise,
                         const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    // One-tensor lists: key and value are plain tensors in PromptFlashAttention.
    const attnopsTensor* const keys[1] = {key};
    const attnopsTensor* const values[1] = {value};
    fia::Args a = v1Args(query, key ? keys : nullptr, 1, value ? values : nullptr, 1, pseShift, attenMask, actualSeqLengths,
                         actualSeqLengthsKv, deqScale1, quantScale1, deqScale2, quantScale2, quantOffset2, nullptr, nullptr,
                         nullptr, nullptr, nullptr, numHeads, scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads,
                         sparseMode, innerPrecise, 0, 0, false, attentionOut, nullptr);
    a.entry = fia::Entry::PromptFlashAttention;
    return plan(a, workspaceSize, executor);
}

// IncreFlashAttention V4's arguments (V1-V3 pass the defaults of what they lack).
attnopsStatus planIncre(const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
                        const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShift,
                        const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths,
                        const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
                        const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2,
                        const attnopsTensor* quantOffset2, const attnopsTensor* antiquantScale,
                        const attnopsTensor* antiquantOffset, const attnopsTensor* blocktable,
                        const attnopsTensor* kvPaddingSize, int64_t numHeads, double scaleValue, const char* inputLayout,
                        int64_t numKeyValueHeads, int64_t blockSize, int64_t innerPrecise,
                        const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    // IncreFlashAttention's actualSeqLengths are KV lengths; decode ignores the tokens and mode.
    fia::Args a = v1Args(query, key, keyCount, value, valueCount, pseShift, attenMask, nullptr, actualSeqLengths, dequantScale1,
                         quantScale1, dequantScale2, quantScale2, quantOffset2, antiquantScale, antiquantOffset, blocktable,
                         nullptr, kvPaddingSize, numHeads, scaleValue, 2147483647, 2147483647, inputLayout, numKeyValueHeads, 0,
                         innerPrecise, blockSize, 0, false, attentionOut, nullptr);
    a.entry = fia::Entry::IncreFlashAttention;
    a.kvLengthsName = "actualSeqLengths";
    return plan(a, workspaceSize, executor);
}

attnopsStatus launch(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor, attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

}  // namespace

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
    fia::Args a = v1Args(query, key, keyCount, value, valueCount, pseShiftOptional, attenMaskOptional, actualSeqLengthsOptional,
                         actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
                         quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional,
                         blockTableOptional, queryPaddingSizeOptional, kvPaddingSizeOptional, numHeads, scaleValue, preTokens,
                         nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode,
                         softmaxLseFlag, attentionOut, softmaxLse);
    addV2(a, keyAntiquantScaleOptional, keyAntiquantOffsetOptional, valueAntiquantScaleOptional, valueAntiquantOffsetOptional,
          keySharedPrefixOptional, valueSharedPrefixOptional, actualSharedPrefixLenOptional, keyAntiquantMode, valueAntiquantMode);
    addV3(a, queryRopeOptional, keyRopeOptional, keyRopeAntiquantScaleOptional);
    a.dequantScaleQuery = dequantScaleQueryOptional;
    a.learnableSink = learnableSinkOptional;
    a.queryQuantMode = queryQuantMode;
    return plan(a, workspaceSize, executor);
}

attnopsStatus attnopsFusedInferAttentionScoreV4(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsFusedInferAttentionScoreGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShiftOptional, const attnopsTensor* attenMaskOptional,
    const attnopsIntArray* actualSeqLengthsOptional, const attnopsIntArray* actualSeqLengthsKvOptional,
    const attnopsTensor* deqScale1Optional, const attnopsTensor* quantScale1Optional,
    const attnopsTensor* deqScale2Optional, const attnopsTensor* quantScale2Optional,
    const attnopsTensor* quantOffset2Optional, const attnopsTensor* antiquantScaleOptional,
    const attnopsTensor* antiquantOffsetOptional, const attnopsTensor* blockTableOptional,
    const attnopsTensor* queryPaddingSizeOptional, const attnopsTensor* kvPaddingSizeOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return plan(v1Args(query, key, keyCount, value, valueCount, pseShiftOptional, attenMaskOptional, actualSeqLengthsOptional,
                       actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
                       quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional,
                       blockTableOptional, queryPaddingSizeOptional, kvPaddingSizeOptional, numHeads, scaleValue, preTokens,
                       nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode,
                       softmaxLseFlag, attentionOut, softmaxLse),
                workspaceSize, executor);
}

attnopsStatus attnopsFusedInferAttentionScore(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                              attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsFusedInferAttentionScoreV2GetWorkspaceSize(
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
    const attnopsIntArray* actualSharedPrefixLenOptional, int64_t numHeads, double scaleValue, int64_t preTokens,
    int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode, int64_t innerPrecise,
    int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag, int64_t keyAntiquantMode, int64_t valueAntiquantMode,
    const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse, uint64_t* workspaceSize, attnopsExecutor** executor) {
    fia::Args a = v1Args(query, key, keyCount, value, valueCount, pseShiftOptional, attenMaskOptional, actualSeqLengthsOptional,
                         actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
                         quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional,
                         blockTableOptional, queryPaddingSizeOptional, kvPaddingSizeOptional, numHeads, scaleValue, preTokens,
                         nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode,
                         softmaxLseFlag, attentionOut, softmaxLse);
    addV2(a, keyAntiquantScaleOptional, keyAntiquantOffsetOptional, valueAntiquantScaleOptional, valueAntiquantOffsetOptional,
          keySharedPrefixOptional, valueSharedPrefixOptional, actualSharedPrefixLenOptional, keyAntiquantMode, valueAntiquantMode);
    return plan(a, workspaceSize, executor);
}

attnopsStatus attnopsFusedInferAttentionScoreV2(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsFusedInferAttentionScoreV3GetWorkspaceSize(
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
    const attnopsTensor* keyRopeOptional, const attnopsTensor* keyRopeAntiquantScaleOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse,
    uint64_t* workspaceSize, attnopsExecutor** executor) {
    fia::Args a = v1Args(query, key, keyCount, value, valueCount, pseShiftOptional, attenMaskOptional, actualSeqLengthsOptional,
                         actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
                         quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional,
                         blockTableOptional, queryPaddingSizeOptional, kvPaddingSizeOptional, numHeads, scaleValue, preTokens,
                         nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode,
                         softmaxLseFlag, attentionOut, softmaxLse);
    addV2(a, keyAntiquantScaleOptional, keyAntiquantOffsetOptional, valueAntiquantScaleOptional, valueAntiquantOffsetOptional,
          keySharedPrefixOptional, valueSharedPrefixOptional, actualSharedPrefixLenOptional, keyAntiquantMode, valueAntiquantMode);
    addV3(a, queryRopeOptional, keyRopeOptional, keyRopeAntiquantScaleOptional);
    return plan(a, workspaceSize, executor);
}

attnopsStatus attnopsFusedInferAttentionScoreV3(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsPromptFlashAttentionGetWorkspaceSize(const attnopsTensor* query, const attnopsTensor* key,
                                                          const attnopsTensor* value, const attnopsTensor* pseShift,
                                                          const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths,
                                                          int64_t numHeads, double scaleValue, int64_t preTokens,
                                                          int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
                                                          const attnopsTensor* attentionOut, uint64_t* workspaceSize,
                                                          attnopsExecutor** executor) {
    return planPrompt(query, key, value, pseShift, attenMask, actualSeqLengths, nullptr, nullptr, nullptr, nullptr, nullptr,
                      nullptr, numHeads, scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads, 0, 1, attentionOut,
                      workspaceSize, executor);
}

attnopsStatus attnopsPromptFlashAttention(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                          attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsPromptFlashAttentionV2GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* pseShift,
    const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths, const attnopsIntArray* actualSeqLengthsKv,
    const attnopsTensor* deqScale1, const attnopsTensor* quantScale1, const attnopsTensor* deqScale2,
    const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planPrompt(query, key, value, pseShift, attenMask, actualSeqLengths, actualSeqLengthsKv, deqScale1, quantScale1,
                      deqScale2, quantScale2, quantOffset2, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
                      numKeyValueHeads, sparseMode, 1, attentionOut, workspaceSize, executor);
}

attnopsStatus attnopsPromptFlashAttentionV2(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                            attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsPromptFlashAttentionV3GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* pseShift,
    const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths, const attnopsIntArray* actualSeqLengthsKv,
    const attnopsTensor* deqScale1, const attnopsTensor* quantScale1, const attnopsTensor* deqScale2,
    const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    int64_t innerPrecise, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planPrompt(query, key, value, pseShift, attenMask, actualSeqLengths, actualSeqLengthsKv, deqScale1, quantScale1,
                      deqScale2, quantScale2, quantOffset2, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
                      numKeyValueHeads, sparseMode, innerPrecise, attentionOut, workspaceSize, executor);
}

attnopsStatus attnopsPromptFlashAttentionV3(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                            attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsIncreFlashAttentionGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, int64_t numHeads, double scaleValue, const char* inputLayout,
    int64_t numKeyValueHeads, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planIncre(query, key, keyCount, value, valueCount, pseShift, attenMask, actualSeqLengths, nullptr, nullptr, nullptr,
                     nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, numHeads, scaleValue, inputLayout, numKeyValueHeads, 0,
                     1, attentionOut, workspaceSize, executor);
}

attnopsStatus attnopsIncreFlashAttention(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                         attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsIncreFlashAttentionV2GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    int64_t numHeads, double scaleValue, const char* inputLayout, int64_t numKeyValueHeads,
    const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planIncre(query, key, keyCount, value, valueCount, pseShift, attenMask, actualSeqLengths, dequantScale1, quantScale1,
                     dequantScale2, quantScale2, quantOffset2, nullptr, nullptr, nullptr, nullptr, numHeads, scaleValue,
                     inputLayout, numKeyValueHeads, 0, 1, attentionOut, workspaceSize, executor);
}

attnopsStatus attnopsIncreFlashAttentionV2(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                           attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsIncreFlashAttentionV3GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    const attnopsTensor* antiquantScale, const attnopsTensor* antiquantOffset, const attnopsTensor* blocktable,
    int64_t numHeads, double scaleValue, const char* inputLayout, int64_t numKeyValueHeads, int64_t blockSize,
    int64_t innerPrecise, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planIncre(query, key, keyCount, value, valueCount, pseShift, attenMask, actualSeqLengths, dequantScale1, quantScale1,
                     dequantScale2, quantScale2, quantOffset2, antiquantScale, antiquantOffset, blocktable, nullptr, numHeads,
                     scaleValue, inputLayout, numKeyValueHeads, blockSize, innerPrecise, attentionOut, workspaceSize, executor);
}

attnopsStatus attnopsIncreFlashAttentionV3(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                           attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}

attnopsStatus attnopsIncreFlashAttentionV4GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    const attnopsTensor* antiquantScale, const attnopsTensor* antiquantOffset, const attnopsTensor* blocktable,
    const attnopsTensor* kvPaddingSize, int64_t numHeads, double scaleValue, const char* inputLayout,
    int64_t numKeyValueHeads, int64_t blockSize, int64_t innerPrecise, const attnopsTensor* attentionOut,
    uint64_t* workspaceSize, attnopsExecutor** executor) {
    return planIncre(query, key, keyCount, value, valueCount, pseShift, attenMask, actualSeqLengths, dequantScale1, quantScale1,
                     dequantScale2, quantScale2, quantOffset2, antiquantScale, antiquantOffset, blocktable, kvPaddingSize,
                     numHeads, scaleValue, inputLayout, numKeyValueHeads, blockSize, innerPrecise, attentionOut, workspaceSize,
                     executor);
}

attnopsStatus attnopsIncreFlashAttentionV4(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                           attnopsStream* stream) {
    return launch(workspace, workspaceSize, executor, stream);
}
}  // extern "C"
