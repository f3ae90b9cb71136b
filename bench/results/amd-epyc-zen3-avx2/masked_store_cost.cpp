// The cost of AVX2 masked loads and stores (vmaskmovps, all-ones mask) against plain vmovups in a
// load-FMA-store stream shaped like the fused backward's softmax step (one block of 120 rows x 128
// keys, rows 144 floats apart: 2 loads and 2 stores per 8 floats), one thread, best of 3000 passes
// (wall clock; a pass takes microseconds, so the minimum is an undisturbed one even on a loaded host).
// Build: g++ -O2 -std=c++20 THIS -o masked_store_cost
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
alignas(64) static float s[120 * 144], dp[120 * 144];

template <bool MaskedLoads, bool MaskedStores>
__attribute__((target("avx2,fma"), noinline)) void pass() {
    const __m256i all = _mm256_set1_epi32(-1);
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
    for (int r = 0; r < 120; ++r)
        for (int j = 0; j < 128; j += 8) {
            float* x = s + r * 144 + j;
            float* y = dp + r * 144 + j;
            __m256 u = MaskedLoads ? _mm256_maskload_ps(x, all) : _mm256_loadu_ps(x);
            __m256 v = MaskedLoads ? _mm256_maskload_ps(y, all) : _mm256_loadu_ps(y);
            u = _mm256_fmadd_ps(u, a, b);
            v = _mm256_fmadd_ps(v, u, b);
            if (MaskedStores) {
                _mm256_maskstore_ps(x, all, u);
                _mm256_maskstore_ps(y, all, v);
            } else {
                _mm256_storeu_ps(x, u);
                _mm256_storeu_ps(y, v);
            }
        }
}

int main() {
    double plain = 1e9, loads = 1e9, stores = 1e9;
    for (int t = 0; t < 3000; ++t) {
        double t0 = now();
        pass<false, false>();
        double t1 = now();
        pass<true, false>();
        double t2 = now();
        pass<false, true>();
        double t3 = now();
        plain = std::min(plain, t1 - t0);
        loads = std::min(loads, t2 - t1);
        stores = std::min(stores, t3 - t2);
    }
    std::printf("120 x 128 block (3840 loads, 3840 stores), best of 3000: plain %.1f us, masked loads %.1f us, "
                "masked stores %.1f us (%.2f ns more per masked store)\n",
                plain * 1e6, loads * 1e6, stores * 1e6, (stores - plain) * 1e9 / 3840);
    return s[5] > 1e30f;
}
