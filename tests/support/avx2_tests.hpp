// Helpers shared by the tests of the AVX2 kernel pieces (tests/cpu/simd_*_avx2_test.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/isa.hpp"

namespace attnops::testsupport {

// Whether this CPU runs the AVX2 kernels (they need FMA and F16C too); the tests skip otherwise.
inline bool hasAvx2() {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

// The bits of a float, for byte-for-byte comparisons (signed zeros, NaN payloads).
inline uint32_t bitsOf(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

}  // namespace attnops::testsupport
