/* attnops aclnn compatibility: FlashAttentionScoreGrad V1-V4 (BSH/SBH/BSND/BNSD, V4 also TND)
 * and FlashAttentionUnpaddingScoreGrad V1-V5 (TND). Each maps onto
 * attnopsFlashAttentionScoreGradGetWorkspaceSize (include/attnops/flash_attention_score_grad.h)
 * with the arguments the version lacks set to their upstream defaults. Not supported
 * (ACLNN_ERR_PARAM_INVALID with a message): rope inputs (queryRope/keyInRope; dqRopeOut/dkRopeOut
 * must then be NULL or empty), fp8 dequantisation scales. dpseOut: NULL or empty (not produced).
 * softmaxInLayout: NULL or "" (statistics [T,N,8] stored in T,N order) or "same_as_input"
 * (stored in N,T order). */
#ifndef ATTNOPS_COMPAT_ACLNN_FLASH_ATTENTION_SCORE_GRAD_H
#define ATTNOPS_COMPAT_ACLNN_FLASH_ATTENTION_SCORE_GRAD_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradGetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGrad(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                   const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGrad(void* workspace, uint64_t workspaceSize,
                                                            aclOpExecutor* executor, const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV2(void* workspace, uint64_t workspaceSize,
                                                     aclOpExecutor* executor, const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclTensor* sinkInOptional,
    const aclIntArray* prefixOptional, const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize,
    aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV3(void* workspace, uint64_t workspaceSize,
                                                     aclOpExecutor* executor, const aclrtStream stream);

/* outDtype (fp8 inputs only upstream): 0 or 1, the gradients keep the inputs' dtype. */
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclTensor* sinkInOptional,
    const aclTensor* queryRopeOptional, const aclTensor* keyRopeOptional, const aclTensor* dScaleQOptional,
    const aclTensor* dScaleKOptional, const aclTensor* dScaleVOptional, const aclTensor* dScaleDyOptional,
    const aclTensor* dScaleOOptional, const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, const aclIntArray* qStartIdxOptional,
    const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char* inputLayout, char* softmaxInLayout, int64_t innerPrecise,
    int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset, int64_t outDtype, const aclTensor* dqOut,
    const aclTensor* dkOut, const aclTensor* dvOut, const aclTensor* dqRopeOut, const aclTensor* dkRopeOut,
    const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionScoreGradV4(void* workspace, uint64_t workspaceSize,
                                                     aclOpExecutor* executor, aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV2(void* workspace, uint64_t workspaceSize,
                                                              aclOpExecutor* executor, const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* queryRope, const aclTensor* keyIn, const aclTensor* keyInRope,
    const aclTensor* value, const aclTensor* dy, const aclTensor* pseShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional, const aclTensor* softmaxInOptional,
    const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dqRopeOut,
    const aclTensor* dkOut, const aclTensor* dkRopeOut, const aclTensor* dvOut, const aclTensor* dpseOut,
    uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV3(void* workspace, uint64_t workspaceSize,
                                                              aclOpExecutor* executor, const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, char* softmaxInLayout, uint64_t* workspaceSize,
    aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV4(void* workspace, uint64_t workspaceSize,
                                                              aclOpExecutor* executor, const aclrtStream stream);

ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV5GetWorkspaceSize(
    const aclTensor* query, const aclTensor* queryRope, const aclTensor* keyIn, const aclTensor* keyInRope,
    const aclTensor* value, const aclTensor* dy, const aclTensor* pseShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional, const aclTensor* softmaxInOptional,
    const aclTensor* attentionInOptional, const aclTensor* sinkInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, char* softmaxInLayout, const aclTensor* dqOut,
    const aclTensor* dqRopeOut, const aclTensor* dkOut, const aclTensor* dkRopeOut, const aclTensor* dvOut,
    const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize, aclOpExecutor** executor);
/* Here the same as GetWorkspaceSize: this problem's workspace and an executor. */
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV5GetMaxWorkspaceSize(
    const aclTensor* query, const aclTensor* queryRope, const aclTensor* keyIn, const aclTensor* keyInRope,
    const aclTensor* value, const aclTensor* dy, const aclTensor* pseShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional, const aclTensor* softmaxInOptional,
    const aclTensor* attentionInOptional, const aclTensor* sinkInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, char* softmaxInLayout, const aclTensor* dqOut,
    const aclTensor* dqRopeOut, const aclTensor* dkOut, const aclTensor* dkRopeOut, const aclTensor* dvOut,
    const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV5(void* workspace, uint64_t workspaceSize,
                                                              aclOpExecutor* executor, const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
