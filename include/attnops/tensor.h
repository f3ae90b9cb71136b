/* Tensor descriptors and host integer arrays passed to attnops operators.
 * A tensor describes memory the caller owns: attnops never frees or reallocates it. */
#ifndef ATTNOPS_TENSOR_H
#define ATTNOPS_TENSOR_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Values match aclDataType so code ported from aclnn keeps its constants. */
typedef ATTNOPS_ENUM(attnopsDataType) {
    ATTNOPS_FLOAT32 = 0,
    ATTNOPS_FLOAT16 = 1,
    ATTNOPS_INT8 = 2,
    ATTNOPS_INT32 = 3,
    ATTNOPS_UINT8 = 4,
    ATTNOPS_INT16 = 6,
    ATTNOPS_UINT16 = 7,
    ATTNOPS_UINT32 = 8,
    ATTNOPS_INT64 = 9,
    ATTNOPS_UINT64 = 10,
    ATTNOPS_FLOAT64 = 11,
    ATTNOPS_BOOL = 12,
    ATTNOPS_BFLOAT16 = 27
} attnopsDataType;

/* Highest tensor rank attnops accepts. */
#define ATTNOPS_MAX_RANK 8

/* Device index meaning "host memory, usable by every CPU device". */
#define ATTNOPS_HOST_MEMORY (-1)

typedef struct attnopsTensor attnopsTensor;
typedef struct attnopsIntArray attnopsIntArray;

/* Size in bytes of one element of `dtype`, or 0 for an unknown value. */
ATTNOPS_API uint64_t attnopsDataTypeSize(attnopsDataType dtype);

/* Short name of a data type ("bf16", "fp32", ...); "unknown" for an unknown value. */
ATTNOPS_API const char* attnopsDataTypeName(attnopsDataType dtype);

/* Describes `data` as a tensor. `shape` and `strides` hold `rank` entries (0 <= rank <= 8) and
 * are copied. Strides are in elements, may be any non-negative value (views are read in place);
 * NULL strides mean contiguous row-major. `device` is a device index or ATTNOPS_HOST_MEMORY.
 * `data` may be NULL only when the tensor has no elements. */
ATTNOPS_API attnopsStatus attnopsCreateTensor(void* data, attnopsDataType dtype, int64_t rank,
                                              const int64_t* shape, const int64_t* strides,
                                              int32_t device, attnopsTensor** tensor);
ATTNOPS_API attnopsStatus attnopsDestroyTensor(attnopsTensor* tensor);

/* A host array of int64 values (actual sequence lengths, prefix, start indices); copied. */
ATTNOPS_API attnopsStatus attnopsCreateIntArray(const int64_t* values, uint64_t size,
                                                attnopsIntArray** array);
ATTNOPS_API attnopsStatus attnopsDestroyIntArray(attnopsIntArray* array);

#ifdef __cplusplus
}
#endif

#endif
