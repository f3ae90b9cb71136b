// Element types as the kernels see them, and exact conversions between fp32 and the 16-bit
// floating formats (round to nearest even, NaN kept quiet).
#pragma once

#include <cstdint>
#include <cstring>

#include "attnops/tensor.h"

namespace attnops {

enum class DType : int32_t {
    F32 = ATTNOPS_FLOAT32,
    F16 = ATTNOPS_FLOAT16,
    BF16 = ATTNOPS_BFLOAT16,
    I8 = ATTNOPS_INT8,
    I32 = ATTNOPS_INT32,
    U8 = ATTNOPS_UINT8,
    Bool = ATTNOPS_BOOL,
    I64 = ATTNOPS_INT64,
    // Internal only (not in the public enum): int4 packed two per byte, low nibble first; element
    // offsets count nibbles. The API takes int4 as int32 containers of eight (spec 9.1).
    I4 = 29,
};

inline float bitsToFloat(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}
inline uint32_t floatToBits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

inline float bf16ToFloat(uint16_t h) { return bitsToFloat(uint32_t(h) << 16); }

inline uint16_t floatToBf16(float f) {
    uint32_t bits = floatToBits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}

inline float f16ToFloat(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
    if (exp == 0) {
        if (mant == 0) return bitsToFloat(sign);
        // Subnormal: value = mant * 2^-24.
        float v = float(mant) * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t floatToF16(float f) {
    uint32_t bits = floatToBits(f);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t absBits = bits & 0x7fffffffu;
    if (absBits > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (absBits >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf (>= 65520)
    if (absBits < 0x38800000u) {                                  // below 2^-14: subnormal or 0
        // Scale so that one f16 subnormal ulp (2^-24) becomes 1, then round to nearest even.
        float a = bitsToFloat(absBits) * 16777216.0f;
        uint32_t q = uint32_t(a);
        float rem = a - float(q);
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
        return uint16_t(sign | q);
    }
    uint32_t rounded = absBits + 0xfffu + ((absBits >> 13) & 1u);
    return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

inline float loadAsFloat(const void* base, int64_t index, DType dtype) {
    switch (dtype) {
        case DType::F32: return static_cast<const float*>(base)[index];
        case DType::F16: return f16ToFloat(static_cast<const uint16_t*>(base)[index]);
        case DType::BF16: return bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
        default: return 0.0f;
    }
}

inline void storeFromFloat(void* base, int64_t index, DType dtype, float value) {
    switch (dtype) {
        case DType::F32: static_cast<float*>(base)[index] = value; break;
        case DType::F16: static_cast<uint16_t*>(base)[index] = floatToF16(value); break;
        case DType::BF16: static_cast<uint16_t*>(base)[index] = floatToBf16(value); break;
        default: break;
    }
}

// Rounds a float to the precision of `dtype` (identity for F32).
inline float roundTo(DType dtype, float value) {
    switch (dtype) {
        case DType::F16: return f16ToFloat(floatToF16(value));
        case DType::BF16: return bf16ToFloat(floatToBf16(value));
        default: return value;
    }
}

inline bool isFloatingDType(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

}  // namespace attnops
