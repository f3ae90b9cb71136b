// Synthetic copies of the decode dot inner loop of src/cpu/simd/fia_forward.hpp (dotStep: 3 keys x
// 4 query rows, 8 dims per iteration, D 128) with different key conversions, TSC ticks per
// iteration (min over many runs), data in L1. Shows what the int8/bf16 conversion costs the loop.
//   g++ -O2 -mavx2 -mfma -mf16c bench/results/amd-epyc-zen3-avx2/decode_s10_loop_cost.cpp -o /tmp/lc && /tmp/lc
#include <x86intrin.h>
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <algorithm>
#include <cstring>
alignas(64) int8_t k8[3][128 * 64];
alignas(64) uint16_t k16[3][128 * 64];
alignas(64) float k32[3][128 * 64];
alignas(64) float q[4][128];
static inline __m256 cvt8(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
static inline __m256 cvt16(const uint16_t* p) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16)); }
static inline __m256 cvt32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 cvt8pm(const int8_t* p) { return _mm256_castsi256_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); } // shuffle only
template <int K>
__attribute__((noinline)) float dot(int reps) {
    __m256 acc[12];
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_setzero_ps();
    for (int r = 0; r < reps; ++r)
    for (int c = 0; c < 128; c += 8) {
        __m256 x0, x1, x2;
        if (K == 0) { x0 = cvt8(k8[0] + c); x1 = cvt8(k8[1] + c); x2 = cvt8(k8[2] + c); }
        if (K == 1) { x0 = cvt16(k16[0] + c); x1 = cvt16(k16[1] + c); x2 = cvt16(k16[2] + c); }
        if (K == 2) { x0 = cvt32(k32[0] + c); x1 = cvt32(k32[1] + c); x2 = cvt32(k32[2] + c); }
        if (K == 3) { x0 = cvt8pm(k8[0] + c); x1 = cvt8pm(k8[1] + c); x2 = cvt8pm(k8[2] + c); }
#pragma GCC unroll 4
        for (int rr = 0; rr < 4; ++rr) {
            __m256 qv = _mm256_loadu_ps(q[rr] + c);
            __asm__("" : "+x"(qv));
            acc[rr] = _mm256_fmadd_ps(qv, x0, acc[rr]);
            acc[4 + rr] = _mm256_fmadd_ps(qv, x1, acc[4 + rr]);
            acc[8 + rr] = _mm256_fmadd_ps(qv, x2, acc[8 + rr]);
        }
    }
    __m256 s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
    float o[8]; _mm256_storeu_ps(o, s); return o[0];
}
template <int K> void run(const char* name) {
    double best = 1e30; float sink = 0;
    for (int r = 0; r < 3000; ++r) { uint64_t t0 = __rdtsc(); sink += dot<K>(20); uint64_t t1 = __rdtsc(); best = std::min(best, double(t1 - t0) / (20 * 16)); }
    printf("%-28s %.2f TSC ticks per iteration (12 FMAs; 6 cycles = %.2f ticks at 3.0 GHz)  %g\n", name, best, 6 * 2.445 / 3.0, sink);
}
int main() {
    memset(k8, 1, sizeof k8); for (auto& a : k16) for (auto& x : a) x = 0x3f80; for (auto& a : k32) for (auto& x : a) x = 1.0f;
    for (auto& a : q) for (auto& x : a) x = 1e-3f;
    for (int i = 0; i < 2; ++i) { run<0>("int8 vpmovsxbd+vcvtdq2ps"); run<1>("bf16 vpmovzxwd+vpslld"); run<2>("fp32 load"); run<3>("int8 vpmovsxbd only"); }
}
