// aclnnFusedInferAttentionScore V1-V4, aclnnPromptFlashAttention V1-V3 and aclnnIncreFlashAttention
// V1-V4 on attnops' C API (include/attnops/{fused_infer_attention_score,prompt_flash_attention,
// incre_flash_attention}.h, which take the same arguments with tensor lists as arrays).
#include "attnops/fused_infer_attention_score.h"

#include <fmt/ranges.h>

#include <vector>

#include "aclnnop/aclnn_fused_infer_attention_score.h"
#include "aclnnop/aclnn_fused_infer_attention_score_v2.h"
#include "aclnnop/aclnn_fused_infer_attention_score_v3.h"
#include "aclnnop/aclnn_fused_infer_attention_score_v4.h"
#include "aclnnop/aclnn_incre_flash_attention.h"
#include "aclnnop/aclnn_incre_flash_attention_v2.h"
#include "aclnnop/aclnn_incre_flash_attention_v3.h"
#include "aclnnop/aclnn_incre_flash_attention_v4.h"
#include "aclnnop/aclnn_prompt_flash_attention.h"
#include "aclnnop/aclnn_prompt_flash_attention_v2.h"
#include "aclnnop/aclnn_prompt_flash_attention_v3.h"
#include "attnops/incre_flash_attention.h"
#include "attnops/prompt_flash_attention.h"
#include "shim.hpp"

using namespace attnops::acl;

namespace {

constexpr int64_t kInt4PerInt32 = 8;

// A key or value tensor: ACL_INT4 (packed two per byte, low nibble first; dims, strides and
// offset counting int4 elements) becomes the int32 containers of eight int4 that attnops takes
// (spec 9.1: element 8d + i is bits [4i, 4i + 4) of container d, the same bytes on a
// little-endian host); any other dtype goes through unchanged.
attnops::Tensor kvView(const aclTensor* t, const char* name) {
    if (t == nullptr || !isLive(t, Kind::Tensor) || t->dataType != ACL_INT4) return view(t, name);
    const size_t rank = t->viewDims.size();
    if (rank == 0) fail(ACLNN_ERR_PARAM_INVALID, "{}: an ACL_INT4 key/value needs rank >= 1", name);
    const auto dims = [](const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); };
    if (t->strides[rank - 1] != 1)
        fail(ACLNN_ERR_PARAM_INVALID, "{}.stride = {}: an ACL_INT4 key/value needs stride 1 on its last dim", name, dims(t->strides));
    if (t->viewDims[rank - 1] % kInt4PerInt32 != 0)
        fail(ACLNN_ERR_PARAM_INVALID, "{}.viewDims = {}: an ACL_INT4 key/value needs its last dim a multiple of {} (whole int32 containers)",
             name, dims(t->viewDims), kInt4PerInt32);
    for (size_t i = 0; i + 1 < rank; ++i)
        if (t->strides[i] % kInt4PerInt32 != 0)
            fail(ACLNN_ERR_PARAM_INVALID, "{}.stride = {}: an ACL_INT4 key/value needs every stride but the last a multiple of {}", name,
                 dims(t->strides), kInt4PerInt32);
    if (t->offset % kInt4PerInt32 != 0)
        fail(ACLNN_ERR_PARAM_INVALID, "{}.offset = {}: an ACL_INT4 key/value needs an offset that is a multiple of {}", name, t->offset,
             kInt4PerInt32);
    std::vector<int64_t> shape = t->viewDims, strides = t->strides;
    shape[rank - 1] /= kInt4PerInt32;
    for (size_t i = 0; i + 1 < rank; ++i) strides[i] /= kInt4PerInt32;
    void* first = t->data == nullptr ? nullptr : static_cast<char*>(t->data) + t->offset / 2;  // two per byte
    return attnops::Tensor(first, ATTNOPS_INT32, shape, strides);
}

// An aclTensorList as the array of attnops tensors the C API takes (NULL: no list).
class TensorListView {
public:
    TensorListView(const aclTensorList* list, const char* name) {
        if (list == nullptr) return;
        if (!isLive(list, Kind::TensorList)) fail(ACLNN_ERR_PARAM_INVALID, "{} is not a live aclTensorList", name);
        for (size_t i = 0; i < list->tensors.size(); ++i) {
            const std::string item = std::string(name) + "[" + std::to_string(i) + "]";
            views_.push_back(kvView(list->tensors[i], item.c_str()));  // ACL_INT4: int32 containers
            raw_.push_back(views_.back().get());
        }
    }
    const attnopsTensor* const* data() const { return raw_.empty() ? nullptr : raw_.data(); }
    uint64_t size() const { return raw_.size(); }

private:
    std::vector<attnops::Tensor> views_;
    std::vector<const attnopsTensor*> raw_;
};

// Phase 1 of every FusedInferAttentionScore version: the newest version's arguments (earlier versions pass what
// they lack as NULL / their defaults), converted and handed to attnops.
aclnnStatus planFusedInferAttentionScore(
    const char* api, const aclTensor* query, const aclTensorList* key, const aclTensorList* value,
    const aclTensor* pseShiftOptional, const aclTensor* attenMaskOptional, const aclIntArray* actualSeqLengthsOptional,
    const aclIntArray* actualSeqLengthsKvOptional, const aclTensor* deqScale1Optional,
    const aclTensor* quantScale1Optional, const aclTensor* deqScale2Optional, const aclTensor* quantScale2Optional,
    const aclTensor* quantOffset2Optional, const aclTensor* antiquantScaleOptional,
    const aclTensor* antiquantOffsetOptional, const aclTensor* blockTableOptional,
    const aclTensor* queryPaddingSizeOptional, const aclTensor* kvPaddingSizeOptional,
    const aclTensor* keyAntiquantScaleOptional, const aclTensor* keyAntiquantOffsetOptional,
    const aclTensor* valueAntiquantScaleOptional, const aclTensor* valueAntiquantOffsetOptional,
    const aclTensor* keySharedPrefixOptional, const aclTensor* valueSharedPrefixOptional,
    const aclIntArray* actualSharedPrefixLenOptional, const aclTensor* queryRopeOptional,
    const aclTensor* keyRopeOptional, const aclTensor* keyRopeAntiquantScaleOptional,
    const aclTensor* dequantScaleQueryOptional, const aclTensor* learnableSinkOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, int64_t queryQuantMode, const aclTensor* attentionOut,
    const aclTensor* softmaxLse, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return guardedOp(api, [&] {
        const attnops::Tensor queryV = view(query, "query");
        const TensorListView keyV(key, "key");
        const TensorListView valueV(value, "value");
        const attnops::Tensor pseShiftOptionalV = view(pseShiftOptional, "pseShift");
        const attnops::Tensor attenMaskOptionalV = view(attenMaskOptional, "attenMask");
        const attnops::IntArray actualSeqLengthsOptionalV = view(actualSeqLengthsOptional, "actualSeqLengths");
        const attnops::IntArray actualSeqLengthsKvOptionalV = view(actualSeqLengthsKvOptional, "actualSeqLengthsKv");
        const attnops::Tensor deqScale1OptionalV = view(deqScale1Optional, "deqScale1");
        const attnops::Tensor quantScale1OptionalV = view(quantScale1Optional, "quantScale1");
        const attnops::Tensor deqScale2OptionalV = view(deqScale2Optional, "deqScale2");
        const attnops::Tensor quantScale2OptionalV = view(quantScale2Optional, "quantScale2");
        const attnops::Tensor quantOffset2OptionalV = view(quantOffset2Optional, "quantOffset2");
        const attnops::Tensor antiquantScaleOptionalV = view(antiquantScaleOptional, "antiquantScale");
        const attnops::Tensor antiquantOffsetOptionalV = view(antiquantOffsetOptional, "antiquantOffset");
        const attnops::Tensor blockTableOptionalV = view(blockTableOptional, "blockTable");
        const attnops::Tensor queryPaddingSizeOptionalV = view(queryPaddingSizeOptional, "queryPaddingSize");
        const attnops::Tensor kvPaddingSizeOptionalV = view(kvPaddingSizeOptional, "kvPaddingSize");
        const attnops::Tensor keyAntiquantScaleOptionalV = view(keyAntiquantScaleOptional, "keyAntiquantScale");
        const attnops::Tensor keyAntiquantOffsetOptionalV = view(keyAntiquantOffsetOptional, "keyAntiquantOffset");
        const attnops::Tensor valueAntiquantScaleOptionalV = view(valueAntiquantScaleOptional, "valueAntiquantScale");
        const attnops::Tensor valueAntiquantOffsetOptionalV =
            view(valueAntiquantOffsetOptional, "valueAntiquantOffset");
        const attnops::Tensor keySharedPrefixOptionalV = view(keySharedPrefixOptional, "keySharedPrefix");
        const attnops::Tensor valueSharedPrefixOptionalV = view(valueSharedPrefixOptional, "valueSharedPrefix");
        const attnops::IntArray actualSharedPrefixLenOptionalV =
            view(actualSharedPrefixLenOptional, "actualSharedPrefixLen");
        const attnops::Tensor queryRopeOptionalV = view(queryRopeOptional, "queryRope");
        const attnops::Tensor keyRopeOptionalV = view(keyRopeOptional, "keyRope");
        const attnops::Tensor keyRopeAntiquantScaleOptionalV =
            view(keyRopeAntiquantScaleOptional, "keyRopeAntiquantScale");
        const attnops::Tensor dequantScaleQueryOptionalV = view(dequantScaleQueryOptional, "dequantScaleQuery");
        const attnops::Tensor learnableSinkOptionalV = view(learnableSinkOptional, "learnableSink");
        const attnops::Tensor attentionOutV = view(attentionOut, "attentionOut");
        const attnops::Tensor softmaxLseV = view(softmaxLse, "softmaxLse");
        attnopsExecutor* created = nullptr;
        attnops::check(attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
            queryV.get(), keyV.data(), keyV.size(), valueV.data(), valueV.size(), pseShiftOptionalV.get(),
            attenMaskOptionalV.get(), actualSeqLengthsOptionalV.get(), actualSeqLengthsKvOptionalV.get(),
            deqScale1OptionalV.get(), quantScale1OptionalV.get(), deqScale2OptionalV.get(), quantScale2OptionalV.get(),
            quantOffset2OptionalV.get(), antiquantScaleOptionalV.get(), antiquantOffsetOptionalV.get(),
            blockTableOptionalV.get(), queryPaddingSizeOptionalV.get(), kvPaddingSizeOptionalV.get(),
            keyAntiquantScaleOptionalV.get(), keyAntiquantOffsetOptionalV.get(), valueAntiquantScaleOptionalV.get(),
            valueAntiquantOffsetOptionalV.get(), keySharedPrefixOptionalV.get(), valueSharedPrefixOptionalV.get(),
            actualSharedPrefixLenOptionalV.get(), queryRopeOptionalV.get(), keyRopeOptionalV.get(),
            keyRopeAntiquantScaleOptionalV.get(), dequantScaleQueryOptionalV.get(), learnableSinkOptionalV.get(),
            numHeads, scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise,
            blockSize, antiquantMode, softmaxLseFlag, keyAntiquantMode, valueAntiquantMode, queryQuantMode,
            attentionOutV.get(), softmaxLseV.get(), workspaceSize, executor == nullptr ? nullptr : &created));
        *executor = toAclnn(created);
    });
}

// Phase 1 of every PromptFlashAttention version: the newest version's arguments (earlier versions pass what
// they lack as NULL / their defaults), converted and handed to attnops.
aclnnStatus planPromptFlashAttention(const char* api, const aclTensor* query, const aclTensor* key,
                                     const aclTensor* value, const aclTensor* pseShift, const aclTensor* attenMask,
                                     const aclIntArray* actualSeqLengths, const aclIntArray* actualSeqLengthsKv,
                                     const aclTensor* deqScale1, const aclTensor* quantScale1,
                                     const aclTensor* deqScale2, const aclTensor* quantScale2,
                                     const aclTensor* quantOffset2, int64_t numHeads, double scaleValue,
                                     int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
                                     int64_t sparseMode, int64_t innerPrecise, const aclTensor* attentionOut,
                                     uint64_t* workspaceSize, aclOpExecutor** executor) {
    return guardedOp(api, [&] {
        const attnops::Tensor queryV = view(query, "query");
        const attnops::Tensor keyV = view(key, "key");
        const attnops::Tensor valueV = view(value, "value");
        const attnops::Tensor pseShiftV = view(pseShift, "pseShift");
        const attnops::Tensor attenMaskV = view(attenMask, "attenMask");
        const attnops::IntArray actualSeqLengthsV = view(actualSeqLengths, "actualSeqLengths");
        const attnops::IntArray actualSeqLengthsKvV = view(actualSeqLengthsKv, "actualSeqLengthsKv");
        const attnops::Tensor deqScale1V = view(deqScale1, "deqScale1");
        const attnops::Tensor quantScale1V = view(quantScale1, "quantScale1");
        const attnops::Tensor deqScale2V = view(deqScale2, "deqScale2");
        const attnops::Tensor quantScale2V = view(quantScale2, "quantScale2");
        const attnops::Tensor quantOffset2V = view(quantOffset2, "quantOffset2");
        const attnops::Tensor attentionOutV = view(attentionOut, "attentionOut");
        attnopsExecutor* created = nullptr;
        attnops::check(attnopsPromptFlashAttentionV3GetWorkspaceSize(
            queryV.get(), keyV.get(), valueV.get(), pseShiftV.get(), attenMaskV.get(), actualSeqLengthsV.get(),
            actualSeqLengthsKvV.get(), deqScale1V.get(), quantScale1V.get(), deqScale2V.get(), quantScale2V.get(),
            quantOffset2V.get(), numHeads, scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads, sparseMode,
            innerPrecise, attentionOutV.get(), workspaceSize, executor == nullptr ? nullptr : &created));
        *executor = toAclnn(created);
    });
}

// Phase 1 of every IncreFlashAttention version: the newest version's arguments (earlier versions pass what
// they lack as NULL / their defaults), converted and handed to attnops.
aclnnStatus planIncreFlashAttention(const char* api, const aclTensor* query, const aclTensorList* key,
                                    const aclTensorList* value, const aclTensor* pseShift, const aclTensor* attenMask,
                                    const aclIntArray* actualSeqLengths, const aclTensor* dequantScale1,
                                    const aclTensor* quantScale1, const aclTensor* dequantScale2,
                                    const aclTensor* quantScale2, const aclTensor* quantOffset2,
                                    const aclTensor* antiquantScale, const aclTensor* antiquantOffset,
                                    const aclTensor* blocktable, const aclTensor* kvPaddingSize, int64_t numHeads,
                                    double scaleValue, char* inputLayout, int64_t numKeyValueHeads, int64_t blockSize,
                                    int64_t innerPrecise, const aclTensor* attentionOut, uint64_t* workspaceSize,
                                    aclOpExecutor** executor) {
    return guardedOp(api, [&] {
        const attnops::Tensor queryV = view(query, "query");
        const TensorListView keyV(key, "key");
        const TensorListView valueV(value, "value");
        const attnops::Tensor pseShiftV = view(pseShift, "pseShift");
        const attnops::Tensor attenMaskV = view(attenMask, "attenMask");
        const attnops::IntArray actualSeqLengthsV = view(actualSeqLengths, "actualSeqLengths");
        const attnops::Tensor dequantScale1V = view(dequantScale1, "dequantScale1");
        const attnops::Tensor quantScale1V = view(quantScale1, "quantScale1");
        const attnops::Tensor dequantScale2V = view(dequantScale2, "dequantScale2");
        const attnops::Tensor quantScale2V = view(quantScale2, "quantScale2");
        const attnops::Tensor quantOffset2V = view(quantOffset2, "quantOffset2");
        const attnops::Tensor antiquantScaleV = view(antiquantScale, "antiquantScale");
        const attnops::Tensor antiquantOffsetV = view(antiquantOffset, "antiquantOffset");
        const attnops::Tensor blocktableV = view(blocktable, "blocktable");
        const attnops::Tensor kvPaddingSizeV = view(kvPaddingSize, "kvPaddingSize");
        const attnops::Tensor attentionOutV = view(attentionOut, "attentionOut");
        attnopsExecutor* created = nullptr;
        attnops::check(attnopsIncreFlashAttentionV4GetWorkspaceSize(
            queryV.get(), keyV.data(), keyV.size(), valueV.data(), valueV.size(), pseShiftV.get(), attenMaskV.get(),
            actualSeqLengthsV.get(), dequantScale1V.get(), quantScale1V.get(), dequantScale2V.get(), quantScale2V.get(),
            quantOffset2V.get(), antiquantScaleV.get(), antiquantOffsetV.get(), blocktableV.get(), kvPaddingSizeV.get(),
            numHeads, scaleValue, inputLayout, numKeyValueHeads, blockSize, innerPrecise, attentionOutV.get(),
            workspaceSize, executor == nullptr ? nullptr : &created));
        *executor = toAclnn(created);
    });
}

}  // namespace

extern "C" {

aclnnStatus aclnnFusedInferAttentionScoreGetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShiftOptional,
    const aclTensor* attenMaskOptional, const aclIntArray* actualSeqLengthsOptional,
    const aclIntArray* actualSeqLengthsKvOptional, const aclTensor* deqScale1Optional,
    const aclTensor* quantScale1Optional, const aclTensor* deqScale2Optional, const aclTensor* quantScale2Optional,
    const aclTensor* quantOffset2Optional, const aclTensor* antiquantScaleOptional,
    const aclTensor* antiquantOffsetOptional, const aclTensor* blockTableOptional,
    const aclTensor* queryPaddingSizeOptional, const aclTensor* kvPaddingSizeOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    const aclTensor* attentionOut, const aclTensor* softmaxLse, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planFusedInferAttentionScore(
        "aclnnFusedInferAttentionScoreGetWorkspaceSize", query, key, value, pseShiftOptional, attenMaskOptional,
        actualSeqLengthsOptional, actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
        quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional, blockTableOptional,
        queryPaddingSizeOptional, kvPaddingSizeOptional, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr, nullptr, nullptr, nullptr, nullptr, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
        numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode, softmaxLseFlag, 0, 0, 0, attentionOut,
        softmaxLse, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnFusedInferAttentionScore, attnopsFusedInferAttentionScoreV4)

aclnnStatus aclnnFusedInferAttentionScoreV2GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShiftOptional,
    const aclTensor* attenMaskOptional, const aclIntArray* actualSeqLengthsOptional,
    const aclIntArray* actualSeqLengthsKvOptional, const aclTensor* deqScale1Optional,
    const aclTensor* quantScale1Optional, const aclTensor* deqScale2Optional, const aclTensor* quantScale2Optional,
    const aclTensor* quantOffset2Optional, const aclTensor* antiquantScaleOptional,
    const aclTensor* antiquantOffsetOptional, const aclTensor* blockTableOptional,
    const aclTensor* queryPaddingSizeOptional, const aclTensor* kvPaddingSizeOptional,
    const aclTensor* keyAntiquantScaleOptional, const aclTensor* keyAntiquantOffsetOptional,
    const aclTensor* valueAntiquantScaleOptional, const aclTensor* valueAntiquantOffsetOptional,
    const aclTensor* keySharedPrefixOptional, const aclTensor* valueSharedPrefixOptional,
    const aclIntArray* actualSharedPrefixLenOptional, int64_t numHeads, double scaleValue, int64_t preTokens,
    int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode, int64_t innerPrecise,
    int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag, int64_t keyAntiquantMode, int64_t valueAntiquantMode,
    const aclTensor* attentionOut, const aclTensor* softmaxLse, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planFusedInferAttentionScore(
        "aclnnFusedInferAttentionScoreV2GetWorkspaceSize", query, key, value, pseShiftOptional, attenMaskOptional,
        actualSeqLengthsOptional, actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
        quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional, blockTableOptional,
        queryPaddingSizeOptional, kvPaddingSizeOptional, keyAntiquantScaleOptional, keyAntiquantOffsetOptional,
        valueAntiquantScaleOptional, valueAntiquantOffsetOptional, keySharedPrefixOptional, valueSharedPrefixOptional,
        actualSharedPrefixLenOptional, nullptr, nullptr, nullptr, nullptr, nullptr, numHeads, scaleValue, preTokens,
        nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode, softmaxLseFlag,
        keyAntiquantMode, valueAntiquantMode, 0, attentionOut, softmaxLse, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnFusedInferAttentionScoreV2, attnopsFusedInferAttentionScoreV4)

aclnnStatus aclnnFusedInferAttentionScoreV3GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShiftOptional,
    const aclTensor* attenMaskOptional, const aclIntArray* actualSeqLengthsOptional,
    const aclIntArray* actualSeqLengthsKvOptional, const aclTensor* deqScale1Optional,
    const aclTensor* quantScale1Optional, const aclTensor* deqScale2Optional, const aclTensor* quantScale2Optional,
    const aclTensor* quantOffset2Optional, const aclTensor* antiquantScaleOptional,
    const aclTensor* antiquantOffsetOptional, const aclTensor* blockTableOptional,
    const aclTensor* queryPaddingSizeOptional, const aclTensor* kvPaddingSizeOptional,
    const aclTensor* keyAntiquantScaleOptional, const aclTensor* keyAntiquantOffsetOptional,
    const aclTensor* valueAntiquantScaleOptional, const aclTensor* valueAntiquantOffsetOptional,
    const aclTensor* keySharedPrefixOptional, const aclTensor* valueSharedPrefixOptional,
    const aclIntArray* actualSharedPrefixLenOptional, const aclTensor* queryRopeOptional,
    const aclTensor* keyRopeOptional, const aclTensor* keyRopeAntiquantScaleOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, const aclTensor* attentionOut, const aclTensor* softmaxLse,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planFusedInferAttentionScore(
        "aclnnFusedInferAttentionScoreV3GetWorkspaceSize", query, key, value, pseShiftOptional, attenMaskOptional,
        actualSeqLengthsOptional, actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
        quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional, blockTableOptional,
        queryPaddingSizeOptional, kvPaddingSizeOptional, keyAntiquantScaleOptional, keyAntiquantOffsetOptional,
        valueAntiquantScaleOptional, valueAntiquantOffsetOptional, keySharedPrefixOptional, valueSharedPrefixOptional,
        actualSharedPrefixLenOptional, queryRopeOptional, keyRopeOptional, keyRopeAntiquantScaleOptional, nullptr,
        nullptr, numHeads, scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads, sparseMode, innerPrecise,
        blockSize, antiquantMode, softmaxLseFlag, keyAntiquantMode, valueAntiquantMode, 0, attentionOut, softmaxLse,
        workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnFusedInferAttentionScoreV3, attnopsFusedInferAttentionScoreV4)

aclnnStatus aclnnFusedInferAttentionScoreV4GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShiftOptional,
    const aclTensor* attenMaskOptional, const aclIntArray* actualSeqLengthsOptional,
    const aclIntArray* actualSeqLengthsKvOptional, const aclTensor* deqScale1Optional,
    const aclTensor* quantScale1Optional, const aclTensor* deqScale2Optional, const aclTensor* quantScale2Optional,
    const aclTensor* quantOffset2Optional, const aclTensor* antiquantScaleOptional,
    const aclTensor* antiquantOffsetOptional, const aclTensor* blockTableOptional,
    const aclTensor* queryPaddingSizeOptional, const aclTensor* kvPaddingSizeOptional,
    const aclTensor* keyAntiquantScaleOptional, const aclTensor* keyAntiquantOffsetOptional,
    const aclTensor* valueAntiquantScaleOptional, const aclTensor* valueAntiquantOffsetOptional,
    const aclTensor* keySharedPrefixOptional, const aclTensor* valueSharedPrefixOptional,
    const aclIntArray* actualSharedPrefixLenOptional, const aclTensor* queryRopeOptional,
    const aclTensor* keyRopeOptional, const aclTensor* keyRopeAntiquantScaleOptional,
    const aclTensor* dequantScaleQueryOptional, const aclTensor* learnableSinkOptional, int64_t numHeads,
    double scaleValue, int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
    int64_t sparseMode, int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, int64_t queryQuantMode, const aclTensor* attentionOut,
    const aclTensor* softmaxLse, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planFusedInferAttentionScore(
        "aclnnFusedInferAttentionScoreV4GetWorkspaceSize", query, key, value, pseShiftOptional, attenMaskOptional,
        actualSeqLengthsOptional, actualSeqLengthsKvOptional, deqScale1Optional, quantScale1Optional, deqScale2Optional,
        quantScale2Optional, quantOffset2Optional, antiquantScaleOptional, antiquantOffsetOptional, blockTableOptional,
        queryPaddingSizeOptional, kvPaddingSizeOptional, keyAntiquantScaleOptional, keyAntiquantOffsetOptional,
        valueAntiquantScaleOptional, valueAntiquantOffsetOptional, keySharedPrefixOptional, valueSharedPrefixOptional,
        actualSharedPrefixLenOptional, queryRopeOptional, keyRopeOptional, keyRopeAntiquantScaleOptional,
        dequantScaleQueryOptional, learnableSinkOptional, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
        numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode, softmaxLseFlag, keyAntiquantMode,
        valueAntiquantMode, queryQuantMode, attentionOut, softmaxLse, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnFusedInferAttentionScoreV4, attnopsFusedInferAttentionScoreV4)

aclnnStatus aclnnPromptFlashAttentionGetWorkspaceSize(const aclTensor* query, const aclTensor* key,
                                                      const aclTensor* value, const aclTensor* pseShift,
                                                      const aclTensor* attenMask, const aclIntArray* actualSeqLengths,
                                                      int64_t numHeads, double scaleValue, int64_t preTokens,
                                                      int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads,
                                                      const aclTensor* attentionOut, uint64_t* workspaceSize,
                                                      aclOpExecutor** executor) {
    return planPromptFlashAttention("aclnnPromptFlashAttentionGetWorkspaceSize", query, key, value, pseShift, attenMask,
                                    actualSeqLengths, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, numHeads,
                                    scaleValue, preTokens, nextTokens, inputLayout, numKeyValueHeads, 0, 1,
                                    attentionOut, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnPromptFlashAttention, attnopsPromptFlashAttentionV3)

aclnnStatus aclnnPromptFlashAttentionV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclIntArray* actualSeqLengthsKv,
    const aclTensor* deqScale1, const aclTensor* quantScale1, const aclTensor* deqScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, int64_t numHeads, double scaleValue, int64_t preTokens, int64_t nextTokens,
    char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode, const aclTensor* attentionOut,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planPromptFlashAttention("aclnnPromptFlashAttentionV2GetWorkspaceSize", query, key, value, pseShift,
                                    attenMask, actualSeqLengths, actualSeqLengthsKv, deqScale1, quantScale1, deqScale2,
                                    quantScale2, quantOffset2, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
                                    numKeyValueHeads, sparseMode, 1, attentionOut, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnPromptFlashAttentionV2, attnopsPromptFlashAttentionV3)

aclnnStatus aclnnPromptFlashAttentionV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclIntArray* actualSeqLengthsKv,
    const aclTensor* deqScale1, const aclTensor* quantScale1, const aclTensor* deqScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, int64_t numHeads, double scaleValue, int64_t preTokens, int64_t nextTokens,
    char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode, int64_t innerPrecise,
    const aclTensor* attentionOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planPromptFlashAttention("aclnnPromptFlashAttentionV3GetWorkspaceSize", query, key, value, pseShift,
                                    attenMask, actualSeqLengths, actualSeqLengthsKv, deqScale1, quantScale1, deqScale2,
                                    quantScale2, quantOffset2, numHeads, scaleValue, preTokens, nextTokens, inputLayout,
                                    numKeyValueHeads, sparseMode, innerPrecise, attentionOut, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnPromptFlashAttentionV3, attnopsPromptFlashAttentionV3)

aclnnStatus aclnnIncreFlashAttentionGetWorkspaceSize(const aclTensor* query, const aclTensorList* key,
                                                     const aclTensorList* value, const aclTensor* pseShift,
                                                     const aclTensor* attenMask, const aclIntArray* actualSeqLengths,
                                                     int64_t numHeads, double scaleValue, char* inputLayout,
                                                     int64_t numKeyValueHeads, const aclTensor* attentionOut,
                                                     uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planIncreFlashAttention("aclnnIncreFlashAttentionGetWorkspaceSize", query, key, value, pseShift, attenMask,
                                   actualSeqLengths, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, nullptr, numHeads, scaleValue, inputLayout, numKeyValueHeads, 0, 1,
                                   attentionOut, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnIncreFlashAttention, attnopsIncreFlashAttentionV4)

aclnnStatus aclnnIncreFlashAttentionV2GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclTensor* dequantScale1,
    const aclTensor* quantScale1, const aclTensor* dequantScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, int64_t numHeads, double scaleValue, char* inputLayout, int64_t numKeyValueHeads,
    const aclTensor* attentionOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planIncreFlashAttention("aclnnIncreFlashAttentionV2GetWorkspaceSize", query, key, value, pseShift, attenMask,
                                   actualSeqLengths, dequantScale1, quantScale1, dequantScale2, quantScale2,
                                   quantOffset2, nullptr, nullptr, nullptr, nullptr, numHeads, scaleValue, inputLayout,
                                   numKeyValueHeads, 0, 1, attentionOut, workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnIncreFlashAttentionV2, attnopsIncreFlashAttentionV4)

aclnnStatus aclnnIncreFlashAttentionV3GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclTensor* dequantScale1,
    const aclTensor* quantScale1, const aclTensor* dequantScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, const aclTensor* antiquantScale, const aclTensor* antiquantOffset,
    const aclTensor* blocktable, int64_t numHeads, double scaleValue, char* inputLayout, int64_t numKeyValueHeads,
    int64_t blockSize, int64_t innerPrecise, const aclTensor* attentionOut, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
    return planIncreFlashAttention("aclnnIncreFlashAttentionV3GetWorkspaceSize", query, key, value, pseShift, attenMask,
                                   actualSeqLengths, dequantScale1, quantScale1, dequantScale2, quantScale2,
                                   quantOffset2, antiquantScale, antiquantOffset, blocktable, nullptr, numHeads,
                                   scaleValue, inputLayout, numKeyValueHeads, blockSize, innerPrecise, attentionOut,
                                   workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnIncreFlashAttentionV3, attnopsIncreFlashAttentionV4)

aclnnStatus aclnnIncreFlashAttentionV4GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclTensor* dequantScale1,
    const aclTensor* quantScale1, const aclTensor* dequantScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, const aclTensor* antiquantScale, const aclTensor* antiquantOffset,
    const aclTensor* blocktable, const aclTensor* kvPaddingSize, int64_t numHeads, double scaleValue, char* inputLayout,
    int64_t numKeyValueHeads, int64_t blockSize, int64_t innerPrecise, const aclTensor* attentionOut,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return planIncreFlashAttention("aclnnIncreFlashAttentionV4GetWorkspaceSize", query, key, value, pseShift, attenMask,
                                   actualSeqLengths, dequantScale1, quantScale1, dequantScale2, quantScale2,
                                   quantOffset2, antiquantScale, antiquantOffset, blocktable, kvPaddingSize, numHeads,
                                   scaleValue, inputLayout, numKeyValueHeads, blockSize, innerPrecise, attentionOut,
                                   workspaceSize, executor);
}

ATTNOPS_ACL_EXECUTE(aclnnIncreFlashAttentionV4, attnopsIncreFlashAttentionV4)

}  // extern "C"
