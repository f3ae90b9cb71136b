// Build from the repository root after a Release build (LIB: build, or another tree's build folder):
//   g++ -O2 -std=c++20 -I tools/common -I src -I include -DATTNOPS_STATIC_DEFINE -DFMT_HEADER_ONLY=1 \
//       bench/results/amd-epyc-zen3-avx2/bar_bits_s11.cpp $LIB/libattnops_problem.a $LIB/libattnops.a -lpthread -o /tmp/barbits
//   /tmp/barbits > hashes.txt
// Session 11: one line per case (dtype, layout, T, N, H, threads, forward with/without stats) with
// an FNV-1a hash of every output's bytes (forward: hiddenStates, invNorm, probs; backward: all
// five gradients), so that two builds' lines can be diffed to show that a kernel change keeps the
// bits: block edges (H 1..4100), empty and length-1 sequences, N = 0..9, token- and source-major
// blockRes, 1/2/3 threads, and shapes large enough for the non-temporal (streamed) stores.
#include <cstdint>
#include <cstdio>
#include <vector>
#include "problem_bar.hpp"
using namespace attnops::tools;
static uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
    const unsigned char* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}
static uint64_t hashOf(const HostTensor& t, uint64_t h = 1469598103934665603ull) { return fnv(t.bytes().data(), t.bytes().size(), h); }
int main() {
    struct Shape { int64_t t, n, h; };
    std::vector<Shape> shapes = {{0, 3, 64},  {1, 0, 16},   {1, 1, 1},     {3, 2, 15},   {2, 3, 16},  {5, 8, 31},
                                 {4, 8, 33},  {7, 3, 64},   {3, 9, 65},    {9, 4, 130},  {6, 8, 1000}, {4, 2, 4096},
                                 {3, 8, 4100}, {2, 1, 20000}, {2, 8, 20000}, {2, 8, 40000}};
    const attnopsDataType dts[] = {ATTNOPS_BFLOAT16, ATTNOPS_FLOAT16, ATTNOPS_FLOAT32};
    const char* names[] = {"bf16", "fp16", "fp32"};
    for (int d = 0; d < 3; ++d)
        for (int major = 0; major < 2; ++major)
            for (const Shape& s : shapes)
                for (int threads = 1; threads <= 3; ++threads)
                    for (int stats = 0; stats < 2; ++stats) {
                        attnopsSetDeviceThreads(0, threads);
                        BarProblem p;
                        p.tokens = s.t; p.blocks = s.n; p.hidden = s.h; p.dtype = dts[d]; p.sourceMajor = major;
                        BarInstance inst(p);
                        const int rf = inst.runForward(stats == 1);
                        uint64_t hf = hashOf(inst.hiddenStates);
                        if (stats) hf = hashOf(inst.probs, hashOf(inst.invNorm, hf));
                        uint64_t hb = 0;
                        int rb = -1;
                        if (stats) {
                            rb = inst.runBackward();
                            hb = hashOf(inst.gradNormWeight, hashOf(inst.gradProjWeight, hashOf(inst.gradBlockRes,
                                 hashOf(inst.gradPartialBlock))));
                        }
                        std::printf("%s major=%d T=%lld N=%lld H=%lld threads=%d stats=%d rc=%d/%d fwd=%016llx bwd=%016llx\n",
                                    names[d], major, (long long)s.t, (long long)s.n, (long long)s.h, threads, stats, rf, rb,
                                    (unsigned long long)hf, (unsigned long long)hb);
                    }
    // Streamed outputs (forward output and backward gradients above 32 MiB), 2 threads.
    for (int d = 0; d < 2; ++d) {
        attnopsSetDeviceThreads(0, 2);
        BarProblem p;
        p.tokens = 4160; p.blocks = 2; p.hidden = 4096; p.dtype = dts[d];
        BarInstance inst(p);
        const int rf = inst.runForward(true), rb = inst.runBackward();
        std::printf("%s streamed T=4160 N=2 H=4096 rc=%d/%d fwd=%016llx bwd=%016llx\n", names[d], rf, rb,
                    (unsigned long long)hashOf(inst.probs, hashOf(inst.invNorm, hashOf(inst.hiddenStates))),
                    (unsigned long long)hashOf(inst.gradNormWeight, hashOf(inst.gradProjWeight,
                        hashOf(inst.gradBlockRes, hashOf(inst.gradPartialBlock)))));
    }
}
