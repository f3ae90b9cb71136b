// The int8 KV decode's score dots on AMX-INT8, alone: 128 int8 key rows (D 128, row stride 128
// bytes, in L1) against 4 query rows, per key. S^T = K . Q^T on TDPBSSD: the key rows are the A
// tile as they lie in a BnNBsD page (tileloadd with the row stride, two tiles of 64 dims), the
// query the B tile: each row as the integer round(q * 2^E) (|Q| < 2^22) in three balanced
// base-256 digits (4 rows x 3 digits = 12 of the 16 int32 columns), in the VNNI layout; the 16 x 16
// int32 result is combined per key (digits weighted 1, 2^8, 2^16, two fp32 roundings, times 2^-E)
// and transposed to 4 rows of 16 keys. Two C tiles alternate so that one group's tiles run while
// the previous group's vector work does.
// Tried in the seventh AMX session (NOTES.md) inside the avx512 decode kernel as a scratch build:
// correct (attnops run --check), but slower end to end; not kept. Not part of the build.
//   g++ -O3 -march=native -std=c++20 amx_int8_dots.cpp -o amx_int8_dots && ./amx_int8_dots
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07 20:25 UTC, one thread, GCC 12.2 -O3:
//   AMX: 2.29 ns per key pipelined (two C tiles), 3.21-3.24 ns with one; the kernel's FMA scheme
//   (int8_dots_vnni.cpp's "fma") took 10.0-10.6 ns per key on the same machine.
//   Largest error against the double product, relative to the sum of |q k|: 8.75e-08.
// In the kernel (one thread, B=1 x 8,192 int8 pages in L3): the dots took 0.78 ms of 2.10 against
// 0.89 of 1.94 for the FMA dots, the tile loads waiting on L2/L3 (perf: the samples on tdpbssd
// and tileloadd); the per-unit query digits cost 10% more; B=32 x 4,096 from DRAM, 2 threads:
// 24.3-25.4 ms against 22.1-22.5.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t colsb[16] = {}; uint8_t rows[16] = {}; };
#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl")))
static const int D = 128, NK = 128, R = 4, STRIDE = 128;
alignas(64) int8_t K[NK * STRIDE];
alignas(64) int8_t B[2][16][64];   // q digits, VNNI layout: B[h][i][4 n + b] = digit(n / 4) of row n % 4 at dim 64 h + 4 i + b
alignas(64) int32_t C[2][16][16];
alignas(64) float st[R][NK];
float q[R][D];
float qexp[R];
// row r -> integer q_int = round(q * 2^e) < 2^22 in magnitude, digits d0 + 256 d1 + 65536 d2, each in [-128, 127]
static void digits() {
    memset(B, 0, sizeof B);
    for (int r = 0; r < R; ++r) {
        float mx = 0;
        for (int d = 0; d < D; ++d) mx = std::fmax(mx, std::fabs(q[r][d]));
        int e = 0;
        if (mx > 0) { int ex; std::frexp(mx, &ex); e = 22 - ex; }  // mx * 2^e < 2^22
        qexp[r] = std::ldexp(1.0f, -e);
        for (int d = 0; d < D; ++d) {
            int32_t v = (int32_t)std::nearbyint(std::ldexp(q[r][d], e));
            int d0 = int8_t(v & 255); v = (v - d0) >> 8;
            int d1 = int8_t(v & 255); v = (v - d1) >> 8;
            int d2 = v;  // |v| < 2^22 -> d2 in [-64, 64]
            int digs[3] = {d0, d1, d2};
            for (int g = 0; g < 3; ++g) B[d / 64][(d % 64) / 4][4 * (g * 4 + r) + d % 4] = int8_t(digs[g]);
        }
    }
}
AMX __attribute__((noinline)) void dotsAmx() {
    const __m512 w = _mm512_setr_ps(1, 1, 1, 1, 256, 256, 256, 256, 65536, 65536, 65536, 65536, 0, 0, 0, 0);
    const __m512 sc = _mm512_setr_ps(qexp[0], qexp[1], qexp[2], qexp[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _tile_loadd(0, B[0], 64);
    _tile_loadd(1, B[1], 64);
    auto issue = [&](int jj) __attribute__((always_inline)) {
        const int bb = (jj / 16) & 1;
        if (bb == 0) {
            _tile_zero(4); _tile_loadd(2, K + jj * STRIDE, STRIDE); _tile_loadd(3, K + jj * STRIDE + 64, STRIDE);
            _tile_dpbssd(4, 2, 0); _tile_dpbssd(4, 3, 1); _tile_stored(4, C[0], 64);
        } else {
            _tile_zero(5); _tile_loadd(6, K + jj * STRIDE, STRIDE); _tile_loadd(7, K + jj * STRIDE + 64, STRIDE);
            _tile_dpbssd(5, 6, 0); _tile_dpbssd(5, 7, 1); _tile_stored(5, C[1], 64);
        }
    };
    issue(0);
    for (int j = 0; j < NK; j += 16) {
        const int buf = (j / 16) & 1;
        if (j + 16 < NK) issue(j + 16);
        __m512 z[4];
        for (int m = 0; m < 4; ++m) {
            __m512 t[4];
            for (int i = 0; i < 4; ++i) {
                __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(C[buf][4 * m + i])), w);
                __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(f, f, 0x02), _mm512_shuffle_f32x4(f, f, 0x01));  // g2 + g1
                t[i] = _mm512_mul_ps(_mm512_add_ps(s, f), sc);
            }
            __m512 a = _mm512_shuffle_f32x4(t[0], t[1], 0x00), b = _mm512_shuffle_f32x4(t[2], t[3], 0x00);  // [k0 k0 k1 k1], [k2 k2 k3 k3]
            z[m] = _mm512_permutexvar_ps(tr, _mm512_shuffle_f32x4(a, b, 0x88));  // [k0 k1 k2 k3] x rows -> rows x keys
        }
        // z[m] lane 4 r + i = row r, key 4 m + i ; out_r lane 4 m + i
        __m512 a01 = _mm512_shuffle_f32x4(z[0], z[1], 0x44), a23 = _mm512_shuffle_f32x4(z[2], z[3], 0x44);  // rows 0,1
        __m512 b01 = _mm512_shuffle_f32x4(z[0], z[1], 0xee), b23 = _mm512_shuffle_f32x4(z[2], z[3], 0xee);  // rows 2,3
        _mm512_store_ps(st[0] + j, _mm512_shuffle_f32x4(a01, a23, 0x88));
        _mm512_store_ps(st[1] + j, _mm512_shuffle_f32x4(a01, a23, 0xdd));
        _mm512_store_ps(st[2] + j, _mm512_shuffle_f32x4(b01, b23, 0x88));
        _mm512_store_ps(st[3] + j, _mm512_shuffle_f32x4(b01, b23, 0xdd));
    }
}
int main() {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { puts("no AMX permission"); return 1; }
    std::mt19937 g(3);
    std::uniform_int_distribution<int> k8(-128, 127);
    std::normal_distribution<float> nq(0, 1);
    for (auto& x : K) x = int8_t(k8(g));
    for (auto& row : q) for (auto& x : row) x = nq(g) * 0.01f;
    digits();
    Cfg cfg;
    for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    dotsAmx();
    double worst = 0;
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < NK; ++j) {
            double e = 0, a = 0;
            for (int d = 0; d < D; ++d) e += double(q[r][d]) * K[j * STRIDE + d], a += std::fabs(double(q[r][d]) * K[j * STRIDE + d]);
            worst = std::fmax(worst, std::fabs(st[r][j] - e) / a);
        }
    printf("max |amx - exact| / sum|q k| = %.3g\n", worst);
    double best = 1e9;
    for (int rep = 0; rep < 20; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < 10000; ++it) { dotsAmx(); __asm__ volatile("" ::: "memory"); }
        best = std::fmin(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("amx dots: %.2f ns per key (4 rows, D 128)\n", best / 10000 / NK * 1e9);
    _tile_release();
}
