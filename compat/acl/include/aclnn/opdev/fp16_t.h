// attnops aclnn compatibility: op::fp16_t, a 2-byte IEEE 754 half-precision value as host
// programs use it to fill fp16 buffers (constructed from int, float or double, read back as
// float). Conversion rounds to nearest even; overflow gives infinity, NaN stays NaN.
#ifndef ATTNOPS_COMPAT_ACLNN_OPDEV_FP16_T_H
#define ATTNOPS_COMPAT_ACLNN_OPDEV_FP16_T_H

#include <cstdint>
#include <cstring>

namespace op {

struct fp16_t {
    uint16_t val = 0;

    fp16_t() = default;
    fp16_t(float f) : val(fromFloat(f)) {}
    fp16_t(double d) : val(fromFloat(static_cast<float>(d))) {}
    fp16_t(int i) : val(fromFloat(static_cast<float>(i))) {}

    operator float() const { return toFloat(val); }
    float toFloat() const { return toFloat(val); }

    static uint16_t fromFloat(float f) {
        uint32_t x;
        std::memcpy(&x, &f, sizeof x);
        const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
        const uint32_t absx = x & 0x7fffffffu;
        if (absx >= 0x7f800000u)  // inf or NaN (NaN keeps a quiet payload bit)
            return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x0200u : 0u));
        if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
        if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
            if (absx < 0x33000000u) return sign;  // below half the smallest subnormal
            const uint32_t mant = (absx & 0x007fffffu) | 0x00800000u;
            const int shift = 126 - static_cast<int>(absx >> 23);  // value / 2^-24 = mant >> shift
            uint32_t h = mant >> shift;
            const uint32_t rest = mant & ((1u << shift) - 1u);
            const uint32_t halfway = 1u << (shift - 1);
            if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
            return static_cast<uint16_t>(sign | h);
        }
        uint32_t h = ((absx >> 13) - (112u << 10));  // rebias exponent 127 -> 15
        const uint32_t rest = absx & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
        return static_cast<uint16_t>(sign | h);
    }

    static float toFloat(uint16_t h) {
        const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
        const uint32_t exp = (h >> 10) & 0x1fu;
        uint32_t mant = h & 0x3ffu;
        uint32_t x;
        if (exp == 0x1fu) {
            x = sign | 0x7f800000u | (mant << 13);
        } else if (exp != 0) {
            x = sign | ((exp + 112u) << 23) | (mant << 13);
        } else if (mant == 0) {
            x = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            x = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
        }
        float f;
        std::memcpy(&f, &x, sizeof f);
        return f;
    }
};

static_assert(sizeof(fp16_t) == 2, "fp16_t is a 2-byte value");

}  // namespace op

#endif
