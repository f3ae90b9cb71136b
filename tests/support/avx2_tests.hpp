// Helpers shared by the tests of the AVX2 kernel pieces (tests/cpu/simd_*_avx2_test.cpp). For
// byte-for-byte comparisons they use floatToBits / bitsToFloat of core/dtype.hpp.
#pragma once

#include "cpu/isa.hpp"

// At the top of a test of AVX2 code: skip it, saying why, where this CPU cannot run it.
#define SKIP_WITHOUT_AVX2() \
    if (!attnops::testsupport::hasAvx2()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C"

namespace attnops::testsupport {

// Whether this CPU runs the AVX2 kernels (they need FMA and F16C too); the tests skip otherwise.
inline bool hasAvx2() {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    return f.avx2 && f.fma && f.f16c;
}

}  // namespace attnops::testsupport
