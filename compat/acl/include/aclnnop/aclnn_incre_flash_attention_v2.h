/* attnops aclnn compatibility: IncreFlashAttention V2. Mapped onto attnopsIncreFlashAttention*GetWorkspaceSize
 * (include/attnops/incre_flash_attention.h), the key/value lists onto arrays of attnops tensors. */
#ifndef ATTNOPS_COMPAT_ACLNN_INCRE_FLASH_ATTENTION_V2_H
#define ATTNOPS_COMPAT_ACLNN_INCRE_FLASH_ATTENTION_V2_H

#include <stdbool.h>

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnIncreFlashAttentionV2GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pseShift,
    const aclTensor* attenMask, const aclIntArray* actualSeqLengths, const aclTensor* dequantScale1,
    const aclTensor* quantScale1, const aclTensor* dequantScale2, const aclTensor* quantScale2,
    const aclTensor* quantOffset2, int64_t numHeads, double scaleValue, char* inputLayout, int64_t numKeyValueHeads,
    const aclTensor* attentionOut, uint64_t* workspaceSize, aclOpExecutor** executor);
ACLNN_API aclnnStatus aclnnIncreFlashAttentionV2(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                 aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif
