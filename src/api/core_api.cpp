// C API: status names, last-error message, tensors and int arrays.
#include <fmt/format.h>

#include <memory>

#include "attnops/status.h"
#include "attnops/tensor.h"
#include "core/error.hpp"
#include "core/fault.hpp"
#include "core/handles.hpp"

namespace attnops {
const char* lastError() noexcept;
}

using namespace attnops;

extern "C" {

const char* attnopsStatusName(attnopsStatus status) {
    switch (status) {
        case ATTNOPS_SUCCESS: return "ATTNOPS_SUCCESS";
        case ATTNOPS_ERROR_NULL_ARGUMENT: return "ATTNOPS_ERROR_NULL_ARGUMENT";
        case ATTNOPS_ERROR_INVALID_ARGUMENT: return "ATTNOPS_ERROR_INVALID_ARGUMENT";
        case ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION: return "ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION";
        case ATTNOPS_ERROR_UNSUPPORTED_HARDWARE: return "ATTNOPS_ERROR_UNSUPPORTED_HARDWARE";
        case ATTNOPS_ERROR_RUNTIME: return "ATTNOPS_ERROR_RUNTIME";
        case ATTNOPS_ERROR_OUT_OF_MEMORY: return "ATTNOPS_ERROR_OUT_OF_MEMORY";
        case ATTNOPS_ERROR_INTERNAL: return "ATTNOPS_ERROR_INTERNAL";
    }
    return "ATTNOPS_UNKNOWN_STATUS";
}

const char* attnopsGetLastErrorMessage(void) { return lastError(); }

uint64_t attnopsDataTypeSize(attnopsDataType dtype) {
    switch (dtype) {
        case ATTNOPS_FLOAT32: case ATTNOPS_INT32: case ATTNOPS_UINT32: return 4;
        case ATTNOPS_FLOAT16: case ATTNOPS_BFLOAT16: case ATTNOPS_INT16: case ATTNOPS_UINT16: return 2;
        case ATTNOPS_INT8: case ATTNOPS_UINT8: case ATTNOPS_BOOL: return 1;
        case ATTNOPS_INT64: case ATTNOPS_UINT64: case ATTNOPS_FLOAT64: return 8;
    }
    return 0;
}

const char* attnopsDataTypeName(attnopsDataType dtype) {
    switch (dtype) {
        case ATTNOPS_FLOAT32: return "fp32";
        case ATTNOPS_FLOAT16: return "fp16";
        case ATTNOPS_BFLOAT16: return "bf16";
        case ATTNOPS_INT8: return "int8";
        case ATTNOPS_INT16: return "int16";
        case ATTNOPS_INT32: return "int32";
        case ATTNOPS_INT64: return "int64";
        case ATTNOPS_UINT8: return "uint8";
        case ATTNOPS_UINT16: return "uint16";
        case ATTNOPS_UINT32: return "uint32";
        case ATTNOPS_UINT64: return "uint64";
        case ATTNOPS_FLOAT64: return "fp64";
        case ATTNOPS_BOOL: return "bool";
    }
    return "unknown";
}

attnopsStatus attnopsCreateTensor(void* data, attnopsDataType dtype, int64_t rank, const int64_t* shape,
                                  const int64_t* strides, int32_t device, attnopsTensor** tensor) {
    return guarded([&] {
        if (tensor == nullptr) nullArgument("tensor");
        *tensor = nullptr;
        if (attnopsDataTypeSize(dtype) == 0) invalidArgument("dtype", int(dtype), "is not an attnopsDataType value");
        if (rank < 0 || rank > ATTNOPS_MAX_RANK) invalidArgument("rank", rank, "must be in [0, {}]", ATTNOPS_MAX_RANK);
        if (rank > 0 && shape == nullptr) nullArgument("shape", "is required when rank > 0");
        if (device < ATTNOPS_HOST_MEMORY) invalidArgument("device", device, "must be a device index or ATTNOPS_HOST_MEMORY (-1)");
        allocationPoint();
        auto t = std::make_unique<attnopsTensor>();
        t->data = data;
        t->dtype = DType(int32_t(dtype));
        t->rank = int32_t(rank);
        t->device = device;
        int64_t numel = 1;
        for (int64_t i = 0; i < rank; ++i) {
            if (shape[i] < 0) invalidArgument(fmt::format("shape[{}]", i), shape[i], "must be >= 0");
            t->shape[size_t(i)] = shape[i];
            if (__builtin_mul_overflow(numel, shape[i], &numel))
                invalidArgument("shape", "(too large)", "the element count overflows int64");
        }
        int64_t expect = 1;
        for (int64_t i = rank - 1; i >= 0; --i) {
            if (strides != nullptr) {
                if (strides[i] < 0) invalidArgument(fmt::format("strides[{}]", i), strides[i], "must be >= 0");
                t->strides[size_t(i)] = strides[i];
            } else {
                t->strides[size_t(i)] = expect;
            }
            expect *= std::max<int64_t>(shape[i], 1);
        }
        if (numel > 0) {
            // The last element's offset must be representable.
            int64_t last = 0, term;
            for (int64_t i = 0; i < rank; ++i)
                if (__builtin_mul_overflow(shape[i] - 1, t->strides[size_t(i)], &term) || __builtin_add_overflow(last, term, &last))
                    invalidArgument("strides", "(too large)", "the offset of the last element overflows int64");
            if (data == nullptr) nullArgument("data", "is required for a tensor with elements");
        }
        tensorRegistry().add(t.get());
        *tensor = t.release();
    });
}

attnopsStatus attnopsDestroyTensor(attnopsTensor* tensor) {
    return guarded([&] {
        if (tensor == nullptr) return;
        if (!tensorRegistry().remove(tensor))
            invalidArgument("tensor", fmt::format("{}", static_cast<void*>(tensor)), "not a live tensor handle (already destroyed?)");
        delete tensor;
    });
}

attnopsStatus attnopsCreateIntArray(const int64_t* values, uint64_t size, attnopsIntArray** array) {
    return guarded([&] {
        if (array == nullptr) nullArgument("array");
        *array = nullptr;
        if (size > 0 && values == nullptr) nullArgument("values", "is required when size > 0");
        allocationPoint();
        auto a = std::make_unique<attnopsIntArray>();
        a->values.assign(values, values + size);
        intArrayRegistry().add(a.get());
        *array = a.release();
    });
}

attnopsStatus attnopsDestroyIntArray(attnopsIntArray* array) {
    return guarded([&] {
        if (array == nullptr) return;
        if (!intArrayRegistry().remove(array))
            invalidArgument("array", fmt::format("{}", static_cast<void*>(array)), "not a live int-array handle (already destroyed?)");
        delete array;
    });
}

}  // extern "C"
