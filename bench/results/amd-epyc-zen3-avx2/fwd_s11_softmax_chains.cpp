// Session 11: the forward's softmax exp pass (softmaxUpdate's fast path, fa_forward.hpp) on AVX2, AMD EPYC Zen 3,
// one thread, best of many short timings, for a loaded machine. One 120-row x 128-key block of scaled scores
// (a later block whose maximum did not move: alpha = 1, so no accumulator rescale in either). The library's pass (kExpChains = 4 keys, exps stage-interleaved, the
// state live/t/r/poly per chain: 16 registers) against passes with G chains whose per-chain state is r, poly,
// 2^n only (2^n taken from t's bits as soon as n is used, the live mask recomputed at the end from the score
// still in st), so that more chains fit the 16 ymm registers. Every variant is checked for the same bits
// (probabilities and l) as the library.
// Build from a configured tree: g++ -O3 -std=c++20 -Isrc -Ibuild/include -Iinclude THIS
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using namespace attnops;
using V = cpu::Avx2;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

ATTNOPS_SIMD_FN __attribute__((noinline)) static void lib(const fa::ForwardParams& p, int64_t qr, int64_t nk, float* st,
                                                          float* m, float* l, float* acc, const float* mx) {
    for (int64_t r0 = 0; r0 < qr; r0 += 8)
        fa::simd_forward::softmaxUpdate<V>(p, r0, qr, nk, fa::KeyRange{0, nk}, qr, st, m, l, acc, V::load(mx + r0),
                                           V::none());
}

// The fast path of softmaxUpdate for a block that leaves the maximum (alpha = 1): e = exp(x - mNew), l = l + sum.
template <int G>
ATTNOPS_SIMD_FN __attribute__((noinline)) static void chains(int64_t qr, int64_t nk, float* st, float* m, float* l,
                                                             const float* mx) {
    for (int64_t r0 = 0; r0 < qr; r0 += 8) {
        const auto mNew = V::load(mx + r0);
        auto sum = V::zero();
        int64_t j = 0;
        for (; j + G <= nk; j += G) {
            typename V::Vec r[G], poly[G], p2[G];
            const auto shifter = V::set1(12582912.0f);
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                const auto x = V::sub(V::load(st + (j + g) * qr + r0), mNew);
                const auto t = V::add(V::mul(x, V::set1(1.44269504088896341f)), shifter);
                const auto n = V::sub(t, shifter);
                r[g] = V::fnmadd(n, V::set1(0.693359375f), x);
                r[g] = V::fnmadd(n, V::set1(-2.12194440e-4f), r[g]);
                p2[g] = V::pow2OfShifted(t);
            }
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) poly[g] = V::fmadd(V::set1(1.0f / 5040.0f), r[g], V::set1(1.0f / 720.0f));
            constexpr float kC[] = {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma GCC unroll 6
            for (int i = 0; i < 6; ++i)
#pragma GCC unroll 8
                for (int g = 0; g < G; ++g) poly[g] = V::fmadd(poly[g], r[g], V::set1(kC[i]));
#pragma GCC unroll 8
            for (int g = 0; g < G; ++g) {
                float* s = st + (j + g) * qr + r0;
                const auto live = V::greater(V::sub(V::load(s), mNew), V::set1(-87.3f));
                const auto e = V::zeroUnless(live, V::mul(poly[g], p2[g]));
                V::store(s, e);
                sum = V::add(sum, e);
            }
        }
        for (; j < nk; ++j) {
            const auto e = fa::simd_forward::expNonPositive<V>(V::sub(V::load(st + j * qr + r0), mNew));
            V::store(st + j * qr + r0, e);
            sum = V::add(sum, e);
        }
        V::store(l + r0, V::fmadd(V::load(l + r0), V::set1(1.0f), sum));
        V::store(m + r0, mNew);
    }
}

int main(int argc, char** argv) {
    const int trials = argc > 1 ? std::atoi(argv[1]) : 3000;
    const int64_t qr = 120, nk = 128, dv = 128;
    fa::ForwardParams p{};
    p.dv = dv;
    std::mt19937 gen(3);
    std::normal_distribution<float> nd(0, 3);
    std::vector<float> src(nk * qr), st(nk * qr), mx(qr, -INFINITY), m(qr), l(qr), acc(qr * dv), ref, refL;
    for (auto& x : src) x = nd(gen);
    for (int64_t j = 0; j < nk; ++j)
        for (int64_t r = 0; r < qr; ++r) mx[r] = std::max(mx[r], src[j * qr + r]);
    src[5 * qr + 3] = mx[3] - 100.0f;  // a dead lane (x - m <= -87.3)
    auto reset = [&] {
        st = src;
        m = mx;  // the maximum did not move: alpha = 1, no rescale of the accumulator
        std::fill(l.begin(), l.end(), 0.0f);
    };
    reset();
    lib(p, qr, nk, st.data(), m.data(), l.data(), acc.data(), mx.data());
    ref = st;
    refL = l;
    using Fn = void (*)(int64_t, int64_t, float*, float*, float*, const float*);
    const Fn fns[] = {chains<4>, chains<5>, chains<6>, chains<8>};
    const char* names[] = {"G = 4", "G = 5", "G = 6", "G = 8"};
    for (int i = 0; i < 4; ++i) {
        reset();
        fns[i](qr, nk, st.data(), m.data(), l.data(), mx.data());
        std::printf("%s same bits as the library: %s\n", names[i],
                    std::memcmp(st.data(), ref.data(), st.size() * 4) == 0 && std::memcmp(l.data(), refL.data(), qr * 4) == 0
                        ? "yes"
                        : "NO");
    }
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
    for (int t = 0; t < trials; ++t)
        for (int k = 0; k < 5; ++k) {
            const int w = (k + t) % 5;
            reset();
            const double t0 = now();
            if (w == 4)
                lib(p, qr, nk, st.data(), m.data(), l.data(), acc.data(), mx.data());
            else
                fns[w](qr, nk, st.data(), m.data(), l.data(), mx.data());
            best[w] = std::min(best[w], now() - t0);
        }
    std::printf("AMD EPYC Zen 3 (family 25 model 1, 2 vCPUs, under load), 1 thread, best of %d, 120 x 128 block:\n", trials);
    std::printf("  library (4 chains, live/t/r/poly)  %.2f us\n", best[4] * 1e6);
    for (int i = 0; i < 4; ++i) std::printf("  %s (r/poly/2^n, live at end)    %.2f us\n", names[i], best[i] * 1e6);
}
