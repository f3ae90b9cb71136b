/* attnops aclnn compatibility: PromptFlashAttention. Mapped onto attnopsPromptFlashAttention*GetWorkspaceSize
 * (include/attnops/prompt_flash_attention.h). */
#ifndef ATTNOPS_COMPAT_ACLNN_PROMPT_FLASH_ATTENTION_H
#define ATTNOPS_COMPAT_ACLNN_PROMPT_FLASH_ATTENTION_H

#include <stdbool.h>

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnPromptFlashAttentionGetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, int64_t numHeads, double scaleValue,
    int64_t preTokens, int64_t nextTokens, char* inputLayout, int64_t numKeyValueHeads, const aclTensor* attentionOut,
    uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnPromptFlashAttention(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
