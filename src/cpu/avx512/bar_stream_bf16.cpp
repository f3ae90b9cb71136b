// stream-avx512-bf16: stream-avx512 (bar_stream.cpp) with the bf16 outputs rounded by vcvtneps2bf16
// (AVX512-BF16) instead of nine integer instructions per vector; listed before stream-avx512 and
// chosen where the CPU has AVX512-BF16. The same bits: vcvtneps2bf16 rounds to nearest even and
// keeps NaN quiet as cpu::floatToBf16 does, except that it reads denormal inputs as zero (checked
// over all 2^32 fp32 values on AMD EPYC Zen 4), so vectors with a denormal lane take the integer
// rounding of stream-avx512 (a branch that exact zeros and normal values never take). fp16 and
// fp32 are unchanged. On AMD EPYC Zen 4 the bf16 forward (whose weighting pass rounds every
// output vector after 9 fused multiply-adds) takes 0.87x the time at one thread and 0.95x at two,
// the backward 0.97-1.01x (the rounding is not what bounds the backward)
// (bench/results/amd-epyc-zen4-avx512/bar-bf16-rounding-ab-20261207.txt).
#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "cpu/isa.hpp"

#if defined(__clang__)
#define ATTNOPS_BAR_STREAM_TARGET \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"), min_vector_width(512)))
#else
#define ATTNOPS_BAR_STREAM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#endif
#include "cpu/avx512/bar_stream_trait.hpp"
#include "cpu/bar_stream.hpp"

namespace attnops::bar {
namespace {

struct Avx512Bf16 : Avx512 {
    // cpu::floatToBf16's bits: vcvtneps2bf16, and where a lane is denormal (exponent 0, mantissa
    // not 0), which it would flush, stream-avx512's integer rounding of the whole vector.
    ATTNOPS_AVX512_FN H narrowBf16(F v) {
        const __m512i bits = _mm512_castps_si512(v);
        const __mmask16 expZero = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000));
        const __mmask16 denormal = _mm512_mask_test_epi32_mask(expZero, bits, _mm512_set1_epi32(0x007fffff));
        if (__builtin_expect(denormal != 0, 0)) return Avx512::narrowBf16(v);
        const __m256bh rounded = _mm512_cvtneps_pbh(v);
        H out;
        __builtin_memcpy(&out, &rounded, sizeof out);
        return out;
    }
};

bool hasAvx512Bf16() { return hasAvx512() && cpu::isa().avx512bf16; }

}  // namespace

const Kernel& kernelStreamAvx512Bf16() {
    static const Kernel k{"stream-avx512-bf16", hasAvx512Bf16, scratch::ForwardTile::bytes, forwardTokens<Avx512Bf16>,
                          scratch::Backward::bytes, backwardTokens<Avx512Bf16>};
    return k;
}

}  // namespace attnops::bar
