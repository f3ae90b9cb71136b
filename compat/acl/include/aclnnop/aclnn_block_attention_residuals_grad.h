/* attnops aclnn compatibility: BlockAttentionResidualsGrad, mapped onto
 * attnopsBlockAttentionResidualsGradGetWorkspaceSize. validBlockNum: -1, 0 or N. */
#ifndef ATTNOPS_COMPAT_ACLNN_BLOCK_ATTENTION_RESIDUALS_GRAD_H
#define ATTNOPS_COMPAT_ACLNN_BLOCK_ATTENTION_RESIDUALS_GRAD_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnBlockAttentionResidualsGradGetWorkspaceSize(
    const aclTensor* partialBlock, const aclTensor* blockRes, const aclTensor* projWeight, const aclTensor* normWeight,
    const aclTensor* gradHiddenStates, const aclTensor* invNorm, const aclTensor* probs, int64_t validBlockNum,
    const aclTensor* gradPartialBlock, const aclTensor* gradBlockRes, const aclTensor* gradProjWeight,
    const aclTensor* gradNormWeight, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnBlockAttentionResidualsGrad(void* workspace, uint64_t workspaceSize,
                                                       aclOpExecutor* executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
