// exp(x) for float in plain C++ that compilers vectorize: Cody-Waite reduction to
// [-ln2/2, ln2/2] and a degree-7 Taylor polynomial (error below 1 ulp over the reduced range,
// 2 ulp overall). Inputs below -87.3 give 0, NaN gives NaN; callers handle -inf (masked scores)
// themselves.
#pragma once

#include <cstdint>
#include <cstring>

namespace attnops::cpu {

inline float fastExp(float x) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
    constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float input = x;
    // Comparisons written so that NaN clamps too (no float-to-int conversion of NaN); the NaN is
    // given back at the end.
    x = x > -87.3f ? x : -87.3f;
    x = x < 88.7f ? x : 88.7f;
    const float n = (x * kLog2e + kRoundMagic) - kRoundMagic;
    const float r = (x - n * kLn2Hi) - n * kLn2Lo;
    float poly = 1.0f / 5040.0f;
    poly = poly * r + 1.0f / 720.0f;
    poly = poly * r + 1.0f / 120.0f;
    poly = poly * r + 1.0f / 24.0f;
    poly = poly * r + 1.0f / 6.0f;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const int32_t bits = (int32_t(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const float result = poly * scale;
    return input != input ? input : (x <= -87.3f ? 0.0f : result);
}

}  // namespace attnops::cpu
