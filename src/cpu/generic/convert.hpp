// Row conversions between stored dtypes and fp32 for the kernels, with contiguous fast paths
// the compiler vectorises. Static so that every ISA-specific translation unit keeps its own copy.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"

namespace attnops::cpu {

// dst[k] = element (offset + k * stride) of base, k < n.
static inline __attribute__((always_inline)) void loadRow(const void* base, int64_t offset, int64_t stride,
                                                          DType dtype, int64_t n, float* __restrict dst) {
    if (n <= 0) return;  // empty rows may have a NULL base
    if (dtype == DType::F32) {
        const float* src = static_cast<const float*>(base) + offset;
        if (stride == 1) {
            std::memcpy(dst, src, size_t(n) * sizeof(float));
        } else {
            for (int64_t k = 0; k < n; ++k) dst[k] = src[k * stride];
        }
    } else if (dtype == DType::BF16) {
        const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
        if (stride == 1) {
            for (int64_t k = 0; k < n; ++k) {
                const uint32_t bits = uint32_t(src[k]) << 16;
                std::memcpy(&dst[k], &bits, sizeof(float));
            }
        } else {
            for (int64_t k = 0; k < n; ++k) dst[k] = bf16ToFloat(src[k * stride]);
        }
    } else {
        const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
        for (int64_t k = 0; k < n; ++k) dst[k] = f16ToFloat(src[k * stride]);
    }
}

// Element (offset + k * stride) of base = src[k] rounded to dtype, k < n.
static inline __attribute__((always_inline)) void storeRow(void* base, int64_t offset, int64_t stride, DType dtype,
                                                           int64_t n, const float* __restrict src) {
    if (n <= 0) return;
    if (dtype == DType::F32) {
        float* dst = static_cast<float*>(base) + offset;
        for (int64_t k = 0; k < n; ++k) dst[k * stride] = src[k];
    } else if (dtype == DType::BF16) {
        uint16_t* dst = static_cast<uint16_t*>(base) + offset;
        for (int64_t k = 0; k < n; ++k) dst[k * stride] = floatToBf16(src[k]);
    } else {
        uint16_t* dst = static_cast<uint16_t*>(base) + offset;
        for (int64_t k = 0; k < n; ++k) dst[k * stride] = floatToF16(src[k]);
    }
}

}  // namespace attnops::cpu
