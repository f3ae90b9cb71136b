/* PromptFlashAttention (prefill attention) V1-V3: two-phase API with the argument lists of
 * aclnnPromptFlashAttention, V2 and V3. It runs FusedInferAttentionScore's core (spec section A,
 * "one core"): each call is the FusedInferAttentionScore V4 call with key and value as one-tensor
 * lists, no block table, antiquantisation, padding, shared prefix, rope, sink or softmaxLse.
 * Every rule of fused_infer_attention_score.h applies (layouts BSH, BSND, BNSD, TND; sparseMode
 * 0-4; actual lengths). V1 has no actualSeqLengthsKv, quantisation arguments or sparseMode (0);
 * V2 adds them; V3 adds innerPrecise (which changes nothing in the result). Note that upstream
 * recommends nextTokens = 0 for prefill (the torch_npu default): the band then hides the future. */
#ifndef ATTNOPS_PROMPT_FLASH_ATTENTION_H
#define ATTNOPS_PROMPT_FLASH_ATTENTION_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

ATTNOPS_API attnopsStatus attnopsPromptFlashAttentionGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* pseShift,
    const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads,
    const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsPromptFlashAttention(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                                      attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsPromptFlashAttentionV2GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* pseShift,
    const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths, const attnopsIntArray* actualSeqLengthsKv,
    const attnopsTensor* deqScale1, const attnopsTensor* quantScale1, const attnopsTensor* deqScale2,
    const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsPromptFlashAttentionV2(void* workspace, uint64_t workspaceSize,
                                                        attnopsExecutor* executor, attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsPromptFlashAttentionV3GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value, const attnopsTensor* pseShift,
    const attnopsTensor* attenMask, const attnopsIntArray* actualSeqLengths, const attnopsIntArray* actualSeqLengthsKv,
    const attnopsTensor* deqScale1, const attnopsTensor* quantScale1, const attnopsTensor* deqScale2,
    const attnopsTensor* quantScale2, const attnopsTensor* quantOffset2, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    int64_t innerPrecise, const attnopsTensor* attentionOut, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsPromptFlashAttentionV3(void* workspace, uint64_t workspaceSize,
                                                        attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
