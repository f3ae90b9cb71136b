// The int8 KV decode's score dots two ways, alone: 128 int8 key rows (D 128, in L1) against 4
// query rows, per key:
//  - fma: the avx512 kernel's scheme (cpu/simd/fia_forward.hpp dotStep at 4 keys x 4 rows):
//    each key vector converted to fp32 (vpmovsxbd + vcvtdq2ps), 16 accumulators, summed across
//    their lanes by the sum16 tree and stored row by row;
//  - vnni: the keys as bytes on vpdpbusd. Each query row q becomes Q = round(q * 2^E) (|Q| < 2^22)
//    in three balanced base-256 digits; the key bytes are made unsigned (k XOR 0x80, the digit
//    dot starting from -128 sum D); 16 keys at a time are transposed as dwords (16 x 16 dword
//    transposes), so lane j of each of the 4 rows x 3 digits int32 accumulators is key j, with
//    no sums across lanes; each score is (A2 * 2^16 + A1 * 2^8 + A0) * 2^-E in fp32.
// The design of the "avx512-vnni" decode entry tried in the sixth AMX session (NOTES.md): a
// little faster here with GCC, slower in the kernel; not kept. Not part of the build.
//   g++ -O3 -std=c++20 int8_dots_vnni.cpp -o int8_dots_vnni && ./int8_dots_vnni
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07 18:50 UTC, one thread, ns per key (three runs of medians of 7):
//   GCC 12.2 -O3 (the project's Release flags): fma 10.3-10.6, vnni 9.6-9.9 (GCC keeps part of
//   the transposed keys and accumulators in memory); clang 14 -O3: fma 9.7, vnni 6.8-6.9.
//   (At -O2 GCC leaves the kernel's own loops rolled: its dotRows took 14.2 there, 10.0 at -O3.)
//   vnni's largest error against the double product, relative to the sum of |q k|: 7.2e-08.
//   vpdpbusd zmm issued 2 per cycle on this CPU (12 independent chains), as vfmadd231ps did.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define INL static inline __attribute__((always_inline)) TARGET

constexpr int D = 128, R = 4, NK = 128;

// 16 vectors -> one, lane i the sum of x[i]'s lanes (the kernel's sum16 tree), stored as 4 rows of 4.
INL void sum16Rows(const __m512* x, float* out, int64_t ld) {
    __m512 t[8], a[4], b[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[i], x[i + 8], 0x44), _mm512_shuffle_f32x4(x[i], x[i + 8], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
        a[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x88), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xDD));
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
        b[i] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0x88), _mm512_shuffle_ps(a[2 * i], a[2 * i + 1], 0xDD));
    const __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
    const __m512 s = _mm512_shuffle_f32x4(c, c, 0xD8);
    _mm_storeu_ps(out, _mm512_extractf32x4_ps(s, 0));
    _mm_storeu_ps(out + ld, _mm512_extractf32x4_ps(s, 1));
    _mm_storeu_ps(out + 2 * ld, _mm512_extractf32x4_ps(s, 2));
    _mm_storeu_ps(out + 3 * ld, _mm512_extractf32x4_ps(s, 3));
}

TARGET __attribute__((noinline)) void fmaDots(const int8_t* const* keys, const float* q, float* st) {
    for (int j = 0; j < NK; j += 4) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; c < D; c += 16) {
            __m512 x[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k)
                x[k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(keys[j + k] + c))));
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r) {
                const __m512 qv = _mm512_loadu_ps(q + r * D + c);
#pragma GCC unroll 4
                for (int k = 0; k < 4; ++k) acc[r * 4 + k] = _mm512_fmadd_ps(qv, x[k], acc[r * 4 + k]);
            }
        }
        sum16Rows(acc, st + j, NK);
    }
}

INL void transpose16(__m512i* x) {
    __m512i t[16], u[16], v[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
        u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            v[8 * i + k] = _mm512_shuffle_i32x4(u[8 * i + k], u[8 * i + 4 + k], 0x88);
            v[8 * i + 4 + k] = _mm512_shuffle_i32x4(u[8 * i + k], u[8 * i + 4 + k], 0xdd);
        }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
        x[k] = _mm512_shuffle_i32x4(v[k], v[8 + k], 0x88);
        x[8 + k] = _mm512_shuffle_i32x4(v[k], v[8 + k], 0xdd);
    }
}

// qd[(r * 3 + t) * D / 4 + g]: the digits t of row r for dims 4g..4g+3; corr: -128 sum of the
// digits; scale: 2^-E per row.
TARGET __attribute__((noinline)) void vnniDots(const int8_t* const* keys, const int32_t* qd, const int32_t* corr,
                                               const float* scale, float* st) {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int j = 0; j < NK; j += 16) {
        alignas(64) __m512i xt[D / 4];
#pragma GCC unroll 2
        for (int h = 0; h < D / 64; ++h) {
            __m512i x[16];
#pragma GCC unroll 16
            for (int k = 0; k < 16; ++k) x[k] = _mm512_xor_si512(_mm512_loadu_si512(keys[j + k] + 64 * h), flip);
            transpose16(x);
#pragma GCC unroll 16
            for (int g = 0; g < 16; ++g) _mm512_store_si512(&xt[16 * h + g], x[g]);
        }
        __m512i acc[4][3];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
#pragma GCC unroll 3
            for (int t = 0; t < 3; ++t) acc[r][t] = _mm512_set1_epi32(corr[r * 3 + t]);
#pragma GCC unroll 32
        for (int g = 0; g < D / 4; ++g) {
            const __m512i xg = _mm512_load_si512(&xt[g]);
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r)
#pragma GCC unroll 3
                for (int t = 0; t < 3; ++t)
                    acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], xg, _mm512_set1_epi32(qd[(r * 3 + t) * (D / 4) + g]));
        }
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
            const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][2]), _mm512_set1_ps(65536.0f),
                                              _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_set1_ps(256.0f)));
            const __m512 s = _mm512_add_ps(hi, _mm512_cvtepi32_ps(acc[r][0]));
            _mm512_storeu_ps(st + r * NK + j, _mm512_mul_ps(s, _mm512_set1_ps(scale[r])));
        }
    }
}

int main() {
    alignas(64) static int8_t kv[NK][D];
    std::mt19937 gen(1);
    for (auto& row : kv)
        for (auto& x : row) x = int8_t(int(gen() % 256) - 128);
    static float q[R * D], stFma[R * NK], stVnni[R * NK];
    for (auto& x : q) x = (float(gen() % 2000) / 1000.0f - 1.0f) * 0.01f;
    const int8_t* rows[NK];
    for (int j = 0; j < NK; ++j) rows[j] = kv[j];
    static int32_t qd[R * 3 * (D / 4)];
    int32_t corr[R * 3];
    float scale[R];
    for (int r = 0; r < R; ++r) {
        float mx = 0;
        for (int c = 0; c < D; ++c) mx = std::max(mx, std::fabs(q[r * D + c]));
        int e = 0;
        std::frexp(mx, &e);
        const int E = 22 - e;
        scale[r] = std::ldexp(1.0f, -E);
        int8_t digits[3][D];
        for (int c = 0; c < D; ++c) {
            int64_t v = std::llrint(std::ldexp(double(q[r * D + c]), E));
            for (int t = 0; t < 3; ++t) {
                const int64_t d = t < 2 ? ((v + 128) & 255) - 128 : v;
                digits[t][c] = int8_t(d);
                v = (v - d) / 256;
            }
        }
        for (int t = 0; t < 3; ++t) {
            int sum = 0;
            for (int c = 0; c < D; ++c) sum += digits[t][c];
            corr[r * 3 + t] = -128 * sum;
            std::memcpy(&qd[(r * 3 + t) * (D / 4)], digits[t], D);
        }
    }
    const int reps = 20000;
    auto time = [&](auto f) {
        std::vector<double> t;
        for (int round = 0; round < 7; ++round) {
            const auto a = std::chrono::steady_clock::now();
            for (int i = 0; i < reps; ++i) {
                f();
                __asm__ volatile("" ::: "memory");
            }
            const auto b = std::chrono::steady_clock::now();
            t.push_back(std::chrono::duration<double, std::nano>(b - a).count() / reps / NK);
        }
        std::sort(t.begin(), t.end());
        return t[3];
    };
    for (int round = 0; round < 3; ++round) {
        const double tf = time([&] { fmaDots(rows, q, stFma); });
        const double tv = time([&] { vnniDots(rows, qd, corr, scale, stVnni); });
        double err = 0;
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < NK; ++j) {
                double s = 0, a = 0;
                for (int c = 0; c < D; ++c) {
                    s += double(q[r * D + c]) * kv[j][c];
                    a += std::fabs(double(q[r * D + c]) * kv[j][c]);
                }
                err = std::max(err, std::fabs(s - stVnni[r * NK + j]) / a);
            }
        std::printf("fma %.2f ns per key, vnni %.2f ns per key; vnni error / sum |q k|: %.2e\n", tf, tv, err);
    }
}
