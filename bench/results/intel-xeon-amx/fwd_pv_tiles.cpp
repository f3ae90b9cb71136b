// The AVX-512 forward's P.V GEMM of one 64-row query block against a 128-key block (D 128),
// one thread, operands in L1/L2, against variants of its operand layout (eighth AMX session,
// bench/results/intel-xeon-amx/NOTES.md). Not built by the project:
//   g++ -O3 -std=c++20 -I src -I include bench/results/intel-xeon-amx/fwd_pv_tiles.cpp -o /tmp/fwd_pv_tiles
// Rows printed (GFLOP/s; the register-only FMA peak first):
//   "pv as built"   simd::gemmStrips (A = P^T [key][64 rows] broadcast 6 rows at a time, B = V strips)
//   "pv k by 64"    the same in two calls of 64 keys (V strip and P half fit L1 together)
//   "pv packed A"   A packed per 6-row tile ([tile][key][6]), B = V strips
//   "pv^T packed"   O^T = V^T.P^T: A = V packed per 6 columns, B = P^T rows (no strips)
//   "qk + pv ..."   gemmScoresScaledMax before each, as in the kernel
#include "cpu/avx512/microkernels.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>

using namespace attnops::cpu;
namespace simd = attnops::cpu::simd;

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

__attribute__((target("avx512f,fma"))) static double peak() {
    __m512 a[24];
    for (int i = 0; i < 24; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-7f);
    const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    const long n = 20000000;
    const double t = now();
    for (long k = 0; k < n; ++k) {
#pragma GCC unroll 24
        for (int i = 0; i < 24; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    const double s = now() - t;
    float sum = 0;
    for (int i = 0; i < 24; ++i) sum += _mm512_reduce_add_ps(a[i]);
    if (sum == 1234.5f) std::printf("x");
    return n * 24.0 * 32 / s / 1e9;
}

// C[MR x 16 NV] += A . B with A packed [k][MR].
template <int MR, int NV>
__attribute__((target("avx512f,fma"), noinline)) static void packedTile(int64_t k, const float* __restrict a,
                                                                       const float* __restrict b, int64_t ldb,
                                                                       float* __restrict c, int64_t ldc) {
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_loadu_ps(c + i * ldc + v * 16);
    for (int64_t kk = 0; kk < k; ++kk) {
        __m512 bv[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + kk * ldb + v * 16);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
            const __m512 av = _mm512_set1_ps(a[kk * MR + i]);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + i * ldc + v * 16, acc[i][v]);
}

int main() {
    alignas(64) static float st[128 * 64], vs[2 * 128 * 64], acc[64 * 128], acct[128 * 64], k[128 * 128],
        qt[2][128 * 64], ap[11 * 128 * 6], vg[22 * 128 * 6];
    for (float* a : {st, vs, k, qt[0], qt[1], ap, vg})
        for (int i = 0; i < 128 * 64; ++i) a[i] = std::rand() / float(RAND_MAX) * 1e-3f;
    alignas(64) float colMax[64];
    __mmask16 colNan[4];
    const simd::ColumnStats<Avx512> stats{colMax, colNan};
    const double flops = 2.0 * 64 * 128 * 128;
    const int n = 20000;
    auto scores = [&](int i) {
        for (int j = 0; j < 64; ++j) colMax[j] = -1e30f;
        for (int j = 0; j < 4; ++j) colNan[j] = 0;
        simd::gemmScoresScaledMax<Avx512>(128, 64, 128, k, 128, qt[i & 1], 64, st, 64, 0.088f, stats);
    };
    auto asBuilt = [&] { simd::gemmStrips<Avx512, true>(64, 128, 128, st, 64, vs, acc, 128, true, 128); };
    auto transposed = [&] {
        int m0 = 0;
        for (; m0 + 6 <= 128; m0 += 6) packedTile<6, 4>(128, vg + m0 * 128, st, 64, acct + m0 * 64, 64);
        packedTile<2, 4>(128, vg + m0 * 128, st, 64, acct + m0 * 64, 64);
    };
    for (int round = 0; round < 3; ++round) {
        std::printf("peak %.1f GFLOP/s\n", peak());
        double t = now();
        for (int i = 0; i < n; ++i) asBuilt();
        std::printf("pv as built   %.1f\n", n * flops / (now() - t) / 1e9);
        t = now();
        for (int i = 0; i < n; ++i)
            for (int k0 = 0; k0 < 128; k0 += 64)
                simd::gemmStrips<Avx512, true>(64, 128, 64, st + k0 * 64, 64, vs + k0 * 64, acc, 128, true, 128);
        std::printf("pv k by 64    %.1f\n", n * flops / (now() - t) / 1e9);
        t = now();
        for (int i = 0; i < n; ++i)
            for (int s = 0; s < 2; ++s) {
                int m0 = 0;
                for (; m0 + 6 <= 64; m0 += 6)
                    packedTile<6, 4>(128, ap + m0 * 128, vs + s * 128 * 64, 64, acc + m0 * 128 + s * 64, 128);
                packedTile<4, 4>(128, ap + m0 * 128, vs + s * 128 * 64, 64, acc + m0 * 128 + s * 64, 128);
            }
        std::printf("pv packed A   %.1f\n", n * flops / (now() - t) / 1e9);
        t = now();
        for (int i = 0; i < n; ++i) transposed();
        std::printf("pv^T packed   %.1f\n", n * flops / (now() - t) / 1e9);
        t = now();
        for (int i = 0; i < n; ++i) scores(i), asBuilt();
        std::printf("qk + pv as built  %.1f\n", 2 * n * flops / (now() - t) / 1e9);
        t = now();
        for (int i = 0; i < n; ++i) scores(i), transposed();
        std::printf("qk + pv^T packed  %.1f\n", 2 * n * flops / (now() - t) / 1e9);
    }
    std::printf("(%g)\n", double(acc[5] + acct[7] + st[3]));
}
