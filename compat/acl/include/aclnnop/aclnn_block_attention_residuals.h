/* attnops aclnn compatibility: BlockAttentionResiduals, mapped onto
 * attnopsBlockAttentionResidualsGetWorkspaceSize (include/attnops/block_attention_residuals.h). */
#ifndef ATTNOPS_COMPAT_ACLNN_BLOCK_ATTENTION_RESIDUALS_H
#define ATTNOPS_COMPAT_ACLNN_BLOCK_ATTENTION_RESIDUALS_H

#include <stdbool.h>

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnBlockAttentionResidualsGetWorkspaceSize(
    const aclTensor* partialBlock, const aclTensor* blockRes, const aclTensor* projWeight, const aclTensor* normWeight,
    int64_t validBlockNum, double normEps, bool needBackward, aclTensor* hiddenStates, aclTensor* invNorm,
    aclTensor* probs, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnBlockAttentionResiduals(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                   aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
