/* attnops aclnn compatibility: the aclnn object types (tensors, integer arrays, tensor lists,
 * executors) and the functions that create and destroy them. */
#ifndef ATTNOPS_COMPAT_ACLNN_ACL_META_H
#define ATTNOPS_COMPAT_ACLNN_ACL_META_H

#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ACLNN_API ACL_FUNC_VISIBILITY

typedef int32_t aclnnStatus;

/* Return codes of the aclnn functions. */
#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001
#define ACLNN_ERR_INNER 561000
#define ACLNN_ERR_INNER_INFERSHAPE_ERROR 561001
#define ACLNN_ERR_INNER_TILING_ERROR 561002
#define ACLNN_ERR_INNER_FIND_KERNEL_ERROR 561003
#define ACLNN_ERR_INNER_CREATE_EXECUTOR 561101
#define ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR 561102
#define ACLNN_ERR_INNER_NULLPTR 561103

typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclIntArray aclIntArray;
typedef struct aclTensorList aclTensorList;

/* A view of `tensorData`: element (i0, i1, ...) of the view lives at element
 * offset + sum(ik * stride[k]) of the storage, which holds prod(storageDims) elements. A NULL
 * stride means contiguous row-major over viewDims. Returns NULL (message in aclGetRecentErrMsg)
 * for an invalid description: rank above 8, negative dims, strides or offset, unknown dtype or
 * format, or a view reaching outside the storage. */
ACLNN_API aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType,
                                     const int64_t* stride, int64_t offset, aclFormat format,
                                     const int64_t* storageDims, uint64_t storageDimsNum, void* tensorData);
ACLNN_API aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size);
/* The list takes ownership of its tensors: aclDestroyTensorList destroys them. */
ACLNN_API aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size);
ACLNN_API aclnnStatus aclDestroyTensor(const aclTensor* tensor);
ACLNN_API aclnnStatus aclDestroyIntArray(const aclIntArray* array);
ACLNN_API aclnnStatus aclDestroyTensorList(const aclTensorList* array);

/* Read-back helpers: the arrays stay owned by the object. */
ACLNN_API aclnnStatus aclGetViewShape(const aclTensor* tensor, int64_t** viewDims, uint64_t* viewDimsNum);
ACLNN_API aclnnStatus aclGetDataType(const aclTensor* tensor, aclDataType* dataType);
ACLNN_API aclnnStatus aclGetIntArraySize(const aclIntArray* array, uint64_t* size);
ACLNN_API aclnnStatus aclGetTensorListSize(const aclTensorList* tensorList, uint64_t* size);

#ifdef __cplusplus
}
#endif

#endif
