/* attnops aclnn compatibility: IncreFlashAttention. Mapped onto attnopsIncreFlashAttention*GetWorkspaceSize
 * (include/attnops/incre_flash_attention.h), the key/value lists onto arrays of attnops tensors. */
#ifndef ATTNOPS_COMPAT_ACLNN_INCRE_FLASH_ATTENTION_H
#define ATTNOPS_COMPAT_ACLNN_INCRE_FLASH_ATTENTION_H

#include <stdbool.h>

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnIncreFlashAttentionGetWorkspaceSize(const aclTensor* query, const aclTensorList* key,
                                                               const aclTensorList* value, const aclTensor* pseShift,
                                                               const aclTensor* attenMask,
                                                               const aclIntArray* actualSeqLengths, int64_t numHeads,
                                                               double scaleValue, char* inputLayout,
                                                               int64_t numKeyValueHeads, const aclTensor* attentionOut,
                                                               uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnIncreFlashAttention(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                               aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
