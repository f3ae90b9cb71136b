// Session 10 (fwd): the band softmax of a causal diagonal block (120 query rows x 128 keys, the unit's rows q0 = k0,
// as on the diagonal) with the hull-limited key loop (the kernel now) against the whole-block loop (the hull rule set
// to keep every key: the pass before session 10), thread CPU time, best of N, the two alternating in one process;
// results checked bit for bit. Also a block whose diagonal starts inside it (q0 = 120, k0 = 128).
// Build (from the repository root, after building the library): g++ -O3 -std=c++20 -Isrc -Iinclude -Ibuild/include
//   THIS -o /tmp/fwd_s10_band_softmax
#include <time.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fa_forward.hpp"

using attnops::cpu::Avx2;
namespace fwd = attnops::fa::simd_forward;
namespace simd = attnops::cpu::simd;
using attnops::fa::SeqRule;

static double threadCpu() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct State {
    std::vector<float> st, m, l, acc;
};

ATTNOPS_AVX2_FN static double run(const State& start, State& s, const SeqRule& rule, const SeqRule& hull, int64_t q0,
                                  int64_t k0) {
    const int64_t rows = 120, nk = 128, qr = 120, skv = 4096;
    attnops::fa::ForwardParams p;
    p.scale = 0.0884f;
    p.dv = 128;
    const simd::BandLanes<Avx2> lanes = simd::bandLanes<Avx2>(rule, skv);
    const fwd::SoftmaxBand<Avx2> band{lanes, hull, skv};
    s = start;
    const double t0 = threadCpu();
    fwd::softmaxBlock<Avx2>(p, rows, nk, qr, s.st.data(), s.m.data(), s.l.data(), s.acc.data(), &band, q0, k0);
    return threadCpu() - t0;
}

int main(int argc, char** argv) {
    const int trials = argc > 1 ? atoi(argv[1]) : 2000;
    const SeqRule causal{-attnops::fa::kUnbounded, 0, 0};
    const SeqRule everyKey{-attnops::fa::kUnbounded, attnops::fa::kUnbounded, 0};
    std::mt19937 g(3);
    std::uniform_real_distribution<float> u(-4, 4);
    State start;
    start.st.resize(128 * 120);
    for (float& x : start.st) x = u(g);
    start.m.assign(120, 1.0f);
    start.l.assign(120, 2.0f);
    start.acc.resize(120 * 128);
    for (float& x : start.acc) x = u(g);
    struct Block { const char* name; int64_t q0, k0; };
    for (const Block& b : {Block{"diagonal block (q0 = k0 = 240)", 240, 240}, Block{"diagonal from key 8 (q0 = 120, k0 = 128)", 120, 128}}) {
        State a, n;
        double bestOld = 1e9, bestNew = 1e9;
        for (int t = 0; t < trials; ++t) {
            if (t % 2 == 0) {
                bestOld = std::min(bestOld, run(start, a, causal, everyKey, b.q0, b.k0));
                bestNew = std::min(bestNew, run(start, n, causal, causal, b.q0, b.k0));
            } else {
                bestNew = std::min(bestNew, run(start, n, causal, causal, b.q0, b.k0));
                bestOld = std::min(bestOld, run(start, a, causal, everyKey, b.q0, b.k0));
            }
        }
        const bool same = std::memcmp(a.st.data(), n.st.data(), a.st.size() * 4) == 0 &&
                          std::memcmp(a.m.data(), n.m.data(), 480) == 0 && std::memcmp(a.l.data(), n.l.data(), 480) == 0 &&
                          std::memcmp(a.acc.data(), n.acc.data(), a.acc.size() * 4) == 0;
        std::printf("%s: whole block %.2f us, hull %.2f us (%.1f%%), same bits %s\n", b.name, bestOld * 1e6,
                    bestNew * 1e6, 100.0 * (bestNew / bestOld - 1.0), same ? "yes" : "NO");
    }
}
