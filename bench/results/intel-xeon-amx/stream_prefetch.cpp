// One thread streaming 1 GiB (4 KiB pages) in 16 KiB chunks taken in random order (a paged KV
// cache), each 64-byte line converted from int8 and added, with `work` x 3 dependent fp32 FMAs a
// line, prefetching the chunk `dist` ahead with each hint (none, t0 = L1, t1 = L2, t2, nta).
// The per-thread ceiling the int8 KV decode is compared with in NOTES.md (seventh AMX session):
// the decode kernel streams 5.9-6.2 GB/s a thread at about 5.5 ns of vector work a line.
// Not part of the build.
//   g++ -O3 -march=native -std=c++20 stream_prefetch.cpp -o stream_prefetch && ./stream_prefetch 0
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07 20:15 UTC, GCC 12.2, best of 3 (GB/s, ns per line):
//   work 0: none 7.04 (9.1), t0 d1 7.68, t1 d1 8.23 (7.8), t1 d2/d4 8.21-8.23, t2 d1/d2 8.13-8.47, nta 4.58
//   work 4: none 5.65 (11.3), t0 d1 6.77, t1 d1-d4 6.93-7.02 (9.1-9.2), t2 7.07-7.09, nta 5.09
//   work 8: none 3.66, t0 d1 5.37 (11.9), t1 4.88-5.11, t2 4.98-5.02, nta 4.59 (the FMA chain bounds it)
// Per-thread streaming rates on this CPU: 16 KiB chunks in random order (a paged KV cache),
// read whole, with different prefetch schemes, optionally with compute per line.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <random>
#include <algorithm>
#include <sys/mman.h>
static const size_t kChunk = 16384, kBytes = size_t(1) << 30, kChunks = kBytes / kChunk;
template <int Hint>
static inline void pf(const char* p) { _mm_prefetch(p, Hint == 3 ? _MM_HINT_T0 : Hint == 2 ? _MM_HINT_T1 : Hint == 1 ? _MM_HINT_T2 : _MM_HINT_NTA); }
// mode: -1 no prefetch, else hint; dist chunks ahead; work: FMAs per line
template <int Hint>
__attribute__((noinline)) float run(const char* buf, const std::vector<size_t>& order, int dist, int work, bool usePf) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const __m512 m = _mm512_set1_ps(1.0000001f);
    for (size_t i = 0; i < order.size(); ++i) {
        const char* c = buf + order[i] * kChunk;
        const char* n = i + dist < order.size() ? buf + order[i + dist] * kChunk : nullptr;
        for (size_t l = 0; l < kChunk; l += 64) {
            if (usePf && n) pf<Hint>(n + l);
            __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128((const __m128i*)(c + l))));
            acc0 = _mm512_add_ps(acc0, x);
            for (int w = 0; w < work; ++w) {
                acc1 = _mm512_fmadd_ps(acc1, m, x);
                acc2 = _mm512_fmadd_ps(acc2, m, x);
                acc3 = _mm512_fmadd_ps(acc3, m, x);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}
int main(int argc, char** argv) {
    bool huge = argc > 1 && atoi(argv[1]);
    char* buf = (char*)aligned_alloc(1 << 21, kBytes);
    madvise(buf, kBytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t i = 0; i < kBytes; i += 64) buf[i] = char(i * 7);
    std::vector<size_t> order(kChunks);
    for (size_t i = 0; i < kChunks; ++i) order[i] = i;
    std::mt19937 g(1);
    std::shuffle(order.begin(), order.end(), g);
    volatile float sink = 0;
    for (int work : {0, 4, 8}) {
        struct Cfg { const char* name; int hint; int dist; bool pf; };
        Cfg cfgs[] = {{"none", 2, 1, false}, {"t0 d1", 3, 1, true}, {"t1 d1", 2, 1, true}, {"t1 d2", 2, 2, true}, {"t1 d4", 2, 4, true},
                      {"t2 d1", 1, 1, true}, {"t2 d2", 1, 2, true}, {"nta d1", 0, 1, true}};
        for (auto& c : cfgs) {
            double best = 1e9;
            for (int rep = 0; rep < 3; ++rep) {
                auto t0 = std::chrono::steady_clock::now();
                float r = c.hint == 3 ? run<3>(buf, order, c.dist, work, c.pf) : c.hint == 2 ? run<2>(buf, order, c.dist, work, c.pf)
                        : c.hint == 1 ? run<1>(buf, order, c.dist, work, c.pf) : run<0>(buf, order, c.dist, work, c.pf);
                sink = sink + r;
                double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                best = std::min(best, s);
            }
            printf("huge %d work %d %-7s %6.2f GB/s  %5.1f ns/line\n", huge, work, c.name, kBytes / best / 1e9, best / (kBytes / 64) * 1e9);
        }
    }
}
