// 16 lanes of 32 bits for the fp32 steps and the packing of the AMX kernels, in GCC/clang vector
// extensions: one source that compiles to zmm instructions in the hardware build (fa_amx.cpp,
// AVX-512 target, which these always-inlined functions take through ATTNOPS_AMX_FN) and
// to SSE2 in the emulated build (x86-64 baseline). Every operation is elementwise IEEE arithmetic
// or a move of bits, and both kernel translation units are built with -ffp-contract=off, so a
// lane gets the same bits in both builds (fused multiply-adds through fmaLanes), and bf16Lanes
// the same bits as floatToBf16. Loads and stores go through memcpy: any alignment.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(ATTNOPS_AMX_HW_LANES)
#include <immintrin.h>
#endif

// In a kernel translation unit these functions take its target (ATTNOPS_AMX_FN, defined before
// the include: AVX-512 in fa_amx.cpp, none in the emulated build): clang refuses a 64-byte vector
// argument or result between a caller with AVX-512 and a callee without.
#ifdef ATTNOPS_AMX_FN
#define ATTNOPS_AMX_LANES static inline __attribute__((always_inline)) ATTNOPS_AMX_FN
#else
#define ATTNOPS_AMX_LANES static inline __attribute__((always_inline))
#endif

// GCC and clang warn that 64-byte vector arguments change the ABI where AVX-512 is off (the
// baseline build); these functions are always inlined and have internal linkage, so no call has
// an ABI: the translation units that include this file build with -Wno-psabi (CMakeLists.txt).

namespace attnops::cpu::amx {

constexpr int64_t kLanes = 16;
typedef float F16x __attribute__((vector_size(64)));     // 16 floats
typedef int32_t I16x __attribute__((vector_size(64)));   // 16 int32 (comparison results: 0 or -1)
typedef uint32_t U16x __attribute__((vector_size(64)));  // 16 uint32
typedef uint16_t H16x __attribute__((vector_size(32)));  // 16 uint16
typedef uint16_t H32x __attribute__((vector_size(64)));  // 32 uint16

ATTNOPS_AMX_LANES F16x loadLanes(const float* p) {
    F16x x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
ATTNOPS_AMX_LANES void storeLanes(float* p, F16x x) { std::memcpy(p, &x, sizeof x); }
ATTNOPS_AMX_LANES void storeLanes(uint16_t* p, U16x x) { std::memcpy(p, &x, sizeof x); }
ATTNOPS_AMX_LANES F16x splat(float x) { return F16x{} + x; }
ATTNOPS_AMX_LANES U16x bitsOf(F16x x) {
    U16x u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
ATTNOPS_AMX_LANES F16x floatsOf(U16x u) {
    F16x x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}
// Lanes of a where mask is -1 (a comparison's true), of b where it is 0; written with bit
// operations because GCC 12 expands the vector ?: lane by lane.
ATTNOPS_AMX_LANES F16x select(I16x mask, F16x a, F16x b) {
    const U16x m = reinterpret_cast<U16x>(mask);
    return floatsOf((bitsOf(a) & m) | (bitsOf(b) & ~m));
}
ATTNOPS_AMX_LANES I16x laneIndex() { return I16x{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
ATTNOPS_AMX_LANES bool anyLane(I16x mask) {
    int32_t any = 0;
    for (int i = 0; i < kLanes; ++i) any |= mask[i];
    return any != 0;
}

// a * b + c in each lane, rounded once: __builtin_fmaf, which the hardware build (its target has
// FMA) compiles to vfmadd and the emulated one (x86-64 baseline) to glibc's correctly rounded
// fmaf: the same bits.
ATTNOPS_AMX_LANES F16x fmaLanes(F16x a, F16x b, F16x c) {
    F16x r;
    for (int i = 0; i < kLanes; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
    return r;
}

// exp's reduction and polynomial of clamped lanes x: n = round(x / ln 2) and p(x - n ln 2), so that
// exp(x) = p * 2^n.
ATTNOPS_AMX_LANES F16x expPolynomial(F16x x, F16x& n) {
    n = fmaLanes(x, splat(1.44269504088896341f), splat(12582912.0f)) - 12582912.0f;
    const F16x r = fmaLanes(n, splat(2.12194440e-4f), fmaLanes(n, splat(-0.693359375f), x));
    F16x poly = splat(1.0f / 5040.0f);
    poly = fmaLanes(poly, r, splat(1.0f / 720.0f));
    poly = fmaLanes(poly, r, splat(1.0f / 120.0f));
    poly = fmaLanes(poly, r, splat(1.0f / 24.0f));
    poly = fmaLanes(poly, r, splat(1.0f / 6.0f));
    poly = fmaLanes(poly, r, splat(0.5f));
    poly = fmaLanes(poly, r, splat(1.0f));
    return fmaLanes(poly, r, splat(1.0f));
}

// exp per lane: cpu::fastExp's reduction and polynomial with fused multiply-adds (13 steps fewer
// than separate multiplies and adds; not fastExp's bits: at most 0.92 ulp from exp, fastExp 1.22,
// bench/results/intel-xeon-amx/exp_ulp.cpp). expLanes<false> is for
// lanes that are at most 0 or NaN (a score less its row's maximum): the same bits without the
// upper clamp, which only lanes above 88.7 reach (NaN meets the lower one, which maps it to -87.3
// until the last step gives it back).
template <bool kClampAbove = true>
ATTNOPS_AMX_LANES F16x expLanes(F16x x) {
    const F16x input = x;
    x = select(x > -87.3f, x, splat(-87.3f));
    if constexpr (kClampAbove) x = select(x < 88.7f, x, splat(88.7f));
    F16x n;
    const F16x poly = expPolynomial(x, n);
    const I16x bits = (__builtin_convertvector(n, I16x) + 127) << 23;
    F16x scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const F16x result = poly * scale;
    return select(input != input, input, select(x <= -87.3f, splat(0.0f), result));
}

// floatToBf16 of each lane (round to nearest even, NaN quieted), in the low 16 bits.
ATTNOPS_AMX_LANES U16x bf16Lanes(F16x x) {
    const U16x bits = bitsOf(x);
    const U16x rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const U16x nan = reinterpret_cast<U16x>((bits & 0x7fffffffu) > 0x7f800000u);
    return (((bits >> 16) | 0x40u) & nan) | (rounded & ~nan);
}

// The forward softmax's fast steps (fa_amx_forward.hpp), for lanes known to hold no NaN. The
// hardware build (ATTNOPS_AMX_HW_LANES, defined by fa_amx.cpp, whose target has AVX512-BF16) uses
// masked AVX-512 instructions; the portable definitions give the same bits on such lanes and are
// what the emulated build runs.

// m if it is larger than x, else x: MAXPS's rule (x where either is NaN, x on a tie).
ATTNOPS_AMX_LANES F16x maxLanesFast(F16x m, F16x x) {
#if defined(ATTNOPS_AMX_HW_LANES)
    // (the masked form: GCC 12's _mm512_max_ps warns about its undefined pass-through operand)
    return F16x(_mm512_mask_max_ps(__m512(m), __mmask16(0xFFFF), __m512(m), __m512(x)));
#else
    return select(m > x, m, x);
#endif
}

// expLanes<false>(x) for lanes that are at most 0 and not NaN: clamped below with MAXPS (-87.3
// for the lanes under it), the power of two 2^n applied with VSCALEFPS, which equals the
// multiplication by the power's bits because both are exact there (n in [-126, 0], and at
// n = -126 the polynomial is above 1: the product is a normal number), the clamped lanes zeroed
// by the mask of that instruction.
ATTNOPS_AMX_LANES F16x expLanesNotNaN(F16x x) {
#if defined(ATTNOPS_AMX_HW_LANES)
    const __m512 c = _mm512_mask_max_ps(__m512(x), __mmask16(0xFFFF), __m512(x), _mm512_set1_ps(-87.3f));
    const __mmask16 live = _mm512_cmp_ps_mask(c, _mm512_set1_ps(-87.3f), _CMP_GT_OQ);
    F16x n;
    const F16x poly = expPolynomial(F16x(c), n);
    return F16x(_mm512_maskz_scalef_ps(live, __m512(poly), __m512(n)));
#else
    return expLanes<false>(x);
#endif
}

// Two lanes' floatToBf16 as pairs (lo in the low halves, hi in the high ones), for lanes that are
// not denormal (VCVTNE2PS2BF16 flushes those; it equals floatToBf16 on every other input, NaN
// included).
ATTNOPS_AMX_LANES U16x bf16PairsNotDenormal(F16x lo, F16x hi) {
#if defined(ATTNOPS_AMX_HW_LANES)
    // 16-bit elements 0-15 from lo, 16-31 from hi; then lo[i] and hi[i] side by side
    const __m512i both = __m512i(_mm512_cvtne2ps_pbh(__m512(hi), __m512(lo)));
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                           6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return U16x(_mm512_permutexvar_epi16(order, both));
#else
    return bf16Lanes(lo) | (bf16Lanes(hi) << 16);
#endif
}

// floatToBf16 of two vectors' lanes with denormal inputs first flushed to a zero of their sign
// (VCVTNE2PS2BF16's rule; the tile products flush denormal operands anyway), lo's lanes in
// elements 0-15 of the result and hi's in 16-31: two consecutive 16-element rows.
ATTNOPS_AMX_LANES H32x bf16RowsFlushed(F16x lo, F16x hi) {
#if defined(ATTNOPS_AMX_HW_LANES)
    return H32x(_mm512_cvtne2ps_pbh(__m512(hi), __m512(lo)));
#else
    auto flushed = [](F16x x) {
        const U16x bits = bitsOf(x);
        const U16x zero = reinterpret_cast<U16x>((bits & 0x7f800000u) == 0u);
        return __builtin_convertvector(bf16Lanes(floatsOf((bits & 0x80000000u & zero) | (bits & ~zero))), H16x);
    };
    const H16x a = flushed(lo), b = flushed(hi);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                   22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
#endif
}

// Two rows of 16 (elements 0-15 and 16-31) as 16 pairs: row 0's element i in the low half of
// pair i, row 1's in its high half.
ATTNOPS_AMX_LANES U16x pairsOfRows(H32x rows) {
    const H32x pairs = __builtin_shufflevector(rows, rows, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8,
                                               24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    U16x u;
    std::memcpy(&u, &pairs, sizeof u);
    return u;
}

// Two key rows' 16 16-bit elements as 16 pairs: lo in the low halves, hi in the high ones.
ATTNOPS_AMX_LANES U16x pairLanes(const uint16_t* lo, const uint16_t* hi) {
    H16x a, b;
    std::memcpy(&a, lo, sizeof a);
    std::memcpy(&b, hi, sizeof b);
    return __builtin_convertvector(a, U16x) | (__builtin_convertvector(b, U16x) << 16);
}

// Transposes 16 x 16 lanes in place: for each bit s of the index, element (i, c) with bit s of i
// clear and of c set trades places with (i + s, c - s).
ATTNOPS_AMX_LANES void transposeLanes(U16x* x) {
    for (int i = 0; i < 16; ++i)
        if ((i & 8) == 0) {
            const U16x a = x[i], b = x[i + 8];
            x[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
            x[i + 8] = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
        }
    for (int i = 0; i < 16; ++i)
        if ((i & 4) == 0) {
            const U16x a = x[i], b = x[i + 4];
            x[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
            x[i + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        }
    for (int i = 0; i < 16; ++i)
        if ((i & 2) == 0) {
            const U16x a = x[i], b = x[i + 2];
            x[i] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
            x[i + 2] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        }
    for (int i = 0; i < 16; ++i)
        if ((i & 1) == 0) {
            const U16x a = x[i], b = x[i + 1];
            x[i] = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
            x[i + 1] = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
        }
}

}  // namespace attnops::cpu::amx
