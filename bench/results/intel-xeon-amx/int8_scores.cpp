// The int8 KV decode's scores on AMX-INT8 tiles, alone: 128 int8 key rows (D 128) against 4 query
// rows, the query rows as exact integers (rounded 22 bits below each row's largest element) in
// three balanced base-256 digits as 12 of the 16 columns of B, TDPBSSD over 2 k chunks of 64 dims
// per 16 keys, C stored, and each score formed as (d0 + 256 d1 + 65536 d2) * 2^-e in fp32 (16
// keys at a time, by gathers). The design of the AMX-INT8 decode hook tried in the fifth AMX
// session (NOTES.md), which lost in the kernel; this is what its scores cost without the kernel
// around them. Not part of the build.
//   g++ -O2 -std=c++20 -mamx-tile -mamx-int8 int8_scores.cpp -o int8_scores && ./int8_scores
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07, one thread, 16 blocks of keys (256 KiB, in L2), two runs (15:25 UTC, the program in
// /tmp; 16:50 UTC as kept here, on a busier VM):
//   387-400 / 438 ns per block of 128 keys x 4 rows: 3.0-3.4 ns per key (the vector decode's dots: about
//   17 ns per key and kv head in the kernel, at 57 of its 120 cycles, NOTES.md)
//   largest error against the double product, relative to the sum of |q k|: 1.04e-07
#include <cmath>
#include <cstdio>
#include <random>

#include "amx_bench.hpp"

#define DPI(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

constexpr int D = 128, R = 4, NK = 128, NB = 16;
alignas(64) int8_t K[NB][NK * D];
alignas(64) int8_t Bq[2][16 * 64];  // 2 k chunks x 16 dim quads x (16 columns x 4 bytes)
alignas(64) int32_t C[NK * 16];
alignas(64) float st[R * NK];
float q[R][D];
float inv[R];

__attribute__((target("avx512f,avx512bw,avx512vl"))) void scores(const int8_t* k) {
    for (int j = 0; j < NK; j += 16) {
        ZR(0);
        LD(6, Bq[0], 64); LD(7, Bq[1], 64);
        LD(4, k + j * D, D); LD(5, k + j * D + 64, D);
        DPI(0, 4, 6); DPI(0, 5, 7);
        ST(0, C + j * 16, 64);
    }
    const __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NK; j += 16) {
            const int32_t* c = C + j * 16;
            const __m512 d0 = _mm512_cvtepi32_ps(_mm512_i32gather_epi32(idx, c + r, 4));
            const __m512 d1 = _mm512_cvtepi32_ps(_mm512_i32gather_epi32(idx, c + R + r, 4));
            const __m512 d2 = _mm512_cvtepi32_ps(_mm512_i32gather_epi32(idx, c + 2 * R + r, 4));
            const __m512 s = _mm512_fmadd_ps(d2, _mm512_set1_ps(65536.0f), _mm512_fmadd_ps(d1, _mm512_set1_ps(256.0f), d0));
            _mm512_store_ps(st + r * NK + j, _mm512_mul_ps(s, _mm512_set1_ps(inv[r])));
        }
}

int main() {
    if (!startTiles()) { std::printf("AMX not granted\n"); return 1; }
    std::mt19937 g(1);
    for (auto& b : K)
        for (auto& x : b) x = int8_t(int(g() % 256) - 128);
    std::normal_distribution<float> nd(0, 1);
    for (auto& row : q)
        for (auto& x : row) x = nd(g);
    for (int r = 0; r < R; ++r) {  // the digits: column t * R + r holds digit t of row r
        float mx = 0;
        for (float x : q[r]) mx = std::max(mx, std::fabs(x));
        int e;
        std::frexp(mx, &e);  // mx < 2^e
        const float scale = std::ldexp(1.0f, 22 - e);
        inv[r] = 1.0f / scale;
        for (int c = 0; c < D; ++c) {
            int32_t Q = int32_t(std::nearbyint(q[r][c] * scale));
            int8_t d[3];
            for (int t = 0; t < 2; ++t) {
                const int32_t lo = ((Q + 128) & 255) - 128;
                d[t] = int8_t(lo);
                Q = (Q - lo) / 256;
            }
            d[2] = int8_t(Q);
            for (int t = 0; t < 3; ++t) Bq[c / 64][((c % 64) / 4) * 64 + (t * R + r) * 4 + c % 4] = d[t];
        }
    }
    scores(K[0]);
    double worst = 0;
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NK; ++j) {
            double ref = 0, mag = 0;
            for (int c = 0; c < D; ++c) {
                ref += double(q[r][c]) * K[0][j * D + c];
                mag += std::fabs(double(q[r][c]) * K[0][j * D + c]);
            }
            worst = std::max(worst, std::fabs(st[r * NK + j] - ref) / mag);
        }
    std::printf("largest error relative to the sum of |q k|: %.3g\n", worst);
    const double ns = medianNs(200, [] { for (int b = 0; b < NB; ++b) scores(K[b]); }) / NB;
    std::printf("scores of 128 keys x 4 rows on tiles: %.0f ns per block (%.1f ns per key)\n", ns, ns / NK);
    _tile_release();
}
