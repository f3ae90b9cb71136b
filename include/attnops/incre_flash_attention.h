/* IncreFlashAttention (decode attention, one query token per sequence) V1-V4: two-phase API with
 * the argument lists of aclnnIncreFlashAttention, V2, V3 and V4. It runs FusedInferAttentionScore's
 * core (spec section A, "one core"): each call is the FusedInferAttentionScore V4 call with
 *   - actualSeqLengths as the KV lengths (upstream's IFA meaning; messages name it so),
 *   - antiquantScale/antiquantOffset as the combined [key; value] dequantisation (antiquantMode 0),
 *   - blocktable/blockSize the paged cache, kvPaddingSize the KV left padding,
 *   - no query lengths, preTokens/nextTokens or sparseMode (decode ignores them), no softmaxLse.
 * Extra rules: inputLayout BSH, BSND or BNSD; the query's S is 1. Every other rule of
 * fused_infer_attention_score.h applies, including what is not implemented yet (the combined
 * antiquantisation and quantisation are rejected with ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
 * kvPaddingSize and tensor-list key/value follow its rules. V1: query, key, value, pseShift, attenMask,
 * actualSeqLengths, numHeads, scaleValue, inputLayout, numKeyValueHeads; V2 adds the quantisation
 * tensors; V3 adds antiquantScale, antiquantOffset, blocktable, blockSize, innerPrecise; V4 adds
 * kvPaddingSize. key/value are arrays of keyCount/valueCount tensors (aclnn's aclTensorList). */
#ifndef ATTNOPS_INCRE_FLASH_ATTENTION_H
#define ATTNOPS_INCRE_FLASH_ATTENTION_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, int64_t numHeads, double scaleValue, const char* inputLayout,
    int64_t numKeyValueHeads, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsIncreFlashAttention(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                     attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV2GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    int64_t numHeads, double scaleValue, const char* inputLayout, int64_t numKeyValueHeads,
    const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV2(void* workspace, uint64_t workspaceSize,
                                                       attnopsExecutor* executor, attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV3GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    const attnopsTensor* antiquantScale, const attnopsTensor* antiquantOffset, const attnopsTensor* blocktable,
    int64_t numHeads, double scaleValue, const char* inputLayout, int64_t numKeyValueHeads, int64_t blockSize,
    int64_t innerPrecise, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV3(void* workspace, uint64_t workspaceSize,
                                                       attnopsExecutor* executor, attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV4GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount, const attnopsTensor* const* value,
    uint64_t valueCount, const attnopsTensor* pseShift, const attnopsTensor* attenMask,
    const attnopsIntArray* actualSeqLengths, const attnopsTensor* dequantScale1, const attnopsTensor* quantScale1,
    const attnopsTensor* dequantScale2, const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2,
    const attnopsTensor* antiquantScale, const attnopsTensor* antiquantOffset, const attnopsTensor* blocktable,
    const attnopsTensor* kvPaddingSize, int64_t numHeads, double scaleValue, const char* inputLayout,
    int64_t numKeyValueHeads, int64_t blockSize, int64_t innerPrecise, const attnopsTensor* attentionOut,
    uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsIncreFlashAttentionV4(void* workspace, uint64_t workspaceSize,
                                                       attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
