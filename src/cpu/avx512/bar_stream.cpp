// stream-avx512: the streaming BlockAttentionResiduals kernel (cpu/bar_stream.hpp) over zmm
// registers (the trait: cpu/avx512/bar_stream_trait.hpp). stream-avx512-bf16 (bar_stream_bf16.cpp)
// is the same kernel with one-instruction bf16 rounding.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() values, which its flow analysis
// reports as "may be used uninitialized" once inlined here (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "cpu/isa.hpp"

#if defined(__clang__)
#define ATTNOPS_BAR_STREAM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), min_vector_width(512)))
#else
#define ATTNOPS_BAR_STREAM_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif
#include "cpu/avx512/bar_stream_trait.hpp"
#include "cpu/bar_stream.hpp"

namespace attnops::bar {

const Kernel& kernelStreamAvx512() {
    static const Kernel k{"stream-avx512", hasAvx512, scratch::ForwardTile::bytes, forwardTokens<Avx512>,
                          scratch::Backward::bytes, backwardTokens<Avx512>};
    return k;
}

}  // namespace attnops::bar
