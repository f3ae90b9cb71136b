/* FlashAttentionScoreGrad (backward): two-phase API with the semantics of the CANN operator
 * (aclnnFlashAttentionScoreGrad V1-V4 and aclnnFlashAttentionUnpaddingScoreGrad in one entry
 * point). Deterministic: the same bits for any thread count. */
#ifndef ATTNOPS_FLASH_ATTENTION_SCORE_GRAD_H
#define ATTNOPS_FLASH_ATTENTION_SCORE_GRAD_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Phase 1. Inputs and attributes are those of the forward call (see flash_attention_score.h),
 * with the same pse, masks, dropout (the same dropMask, or the same seed/offset) and sink, plus:
 *   dy:              gradient of attentionOut (its shape and dtype)
 *   softmaxMax/Sum:  the forward's statistics, fp32 [B,N1,S1,8|1] or [T1,N1,8|1]; lane 0 is read
 *   softmaxIn:       reserved, must be NULL or empty
 *   attentionIn:     the forward's attentionOut
 * Outputs: dqOut, dkOut, dvOut with the shapes and dtype of query, key, value (for GQA, dk/dv are
 * summed over each kv head's query-head group in a fixed order); dpseOut reserved (NULL or
 * empty); dsinkOut fp32 [N1], required when sinkIn is given and ignored otherwise. Fully masked
 * rows give dq = 0 and contribute nothing; TND tail rows of dq/dk/dv are written as 0. */
ATTNOPS_API attnopsStatus attnopsFlashAttentionScoreGradGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
    const attnopsTensor* dy, const attnopsTensor* pseShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional,
    const attnopsTensor* softmaxMax, const attnopsTensor* softmaxSum, const attnopsTensor* softmaxInOptional,
    const attnopsTensor* attentionIn, const attnopsIntArray* prefixOptional,
    const attnopsIntArray* actualSeqQLenOptional, const attnopsIntArray* actualSeqKvLenOptional,
    const attnopsIntArray* qStartIdxOptional, const attnopsIntArray* kvStartIdxOptional,
    const attnopsTensor* sinkInOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, const char* inputLayout, int64_t innerPrecise, int64_t sparseMode,
    int64_t pseType, int64_t seed, int64_t offset, const attnopsTensor* dqOut, const attnopsTensor* dkOut,
    const attnopsTensor* dvOut, const attnopsTensor* dpseOutOptional, const attnopsTensor* dsinkOutOptional,
    uint64_t* workspaceSize, attnopsExecutor** executor);

/* Phase 2: enqueues the planned work on `stream` (NULL: default stream); consumes the executor. */
ATTNOPS_API attnopsStatus attnopsFlashAttentionScoreGrad(void* workspace, uint64_t workspaceSize,
                                                         attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
