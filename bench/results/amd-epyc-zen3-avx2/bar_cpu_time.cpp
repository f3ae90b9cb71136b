// Build from the repository root after a Release build (LIB: build, or another tree's build folder):
//   g++ -O2 -std=c++20 -I tools/common -I src -I include -DATTNOPS_STATIC_DEFINE -DFMT_HEADER_ONLY=1 \
//       bench/results/amd-epyc-zen3-avx2/bar_cpu_time.cpp $LIB/libattnops_problem.a $LIB/libattnops.a -lpthread -o /tmp/barcpu
//   /tmp/barcpu <fp32|bf16|fp16> <runs> [T N H]
// CPU-time harness for BlockAttentionResiduals (one worker thread), for a machine too loaded for
// wall-clock timing: min over runs of the process CPU time per forward and per backward call, and
// per plain read of a 512 MiB buffer (the DRAM read peak's loop shape); GB per CPU-second of the
// bytes `attnops bench` credits (BarProblem::forwardBytes/backwardBytes), and that rate as a
// fraction of the plain read's.
#include <time.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <immintrin.h>
#include "problem_bar.hpp"
using namespace attnops::tools;
static double cpuMs() { timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec * 1e3 + t.tv_nsec * 1e-6; }
__attribute__((target("avx2"))) float sumAll(const float* a, size_t n) {
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (size_t i = 0; i < n; i += 32)
        for (int k = 0; k < 4; ++k) s[k] = _mm256_add_ps(s[k], _mm256_loadu_ps(a + i + 8 * k));
    float out[8]; _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
    return out[0] + out[7];
}
int main(int argc, char** argv) {
    if (argc < 3) { std::fprintf(stderr, "usage: %s fp32|bf16|fp16 runs [T N H]\n", argv[0]); return 64; }
    attnopsSetDeviceThreads(0, 1);
    const std::string d = argv[1];
    const int reps = atoi(argv[2]);
    BarProblem p;
    p.tokens = argc > 5 ? atoi(argv[3]) : 8192; p.blocks = argc > 5 ? atoi(argv[4]) : 8; p.hidden = argc > 5 ? atoi(argv[5]) : 4096;
    p.dtype = d == "bf16" ? ATTNOPS_BFLOAT16 : d == "fp16" ? ATTNOPS_FLOAT16 : ATTNOPS_FLOAT32;
    BarInstance inst(p);
    size_t n = (size_t(512) << 20) / 4; std::vector<float> buf(n, 1.0f);
    double rbest = 1e9, fbest = 1e9, bbest = 1e9; volatile float sink = 0;
    if (inst.runForward(true) != ATTNOPS_SUCCESS || inst.runBackward() != ATTNOPS_SUCCESS) return 2;
    for (int r = 0; r < reps; ++r) {
        double t0 = cpuMs(); sink = sink + sumAll(buf.data(), n); rbest = std::min(rbest, cpuMs() - t0);
        t0 = cpuMs(); inst.runForward(true); fbest = std::min(fbest, cpuMs() - t0);
        t0 = cpuMs(); inst.runBackward(); bbest = std::min(bbest, cpuMs() - t0);
    }
    const double readGBs = double(n) * 4 / (rbest * 1e6), fGBs = p.forwardBytes(true) / (fbest * 1e6), bGBs = p.backwardBytes() / (bbest * 1e6);
    std::printf("%s T=%lld N=%lld H=%lld, 1 thread, min of %d: read %.1f GB/cpu-s | fwd %.1f ms %.1f GB/cpu-s %.0f%% | bwd %.1f ms %.1f GB/cpu-s %.0f%%\n",
                d.c_str(), (long long)p.tokens, (long long)p.blocks, (long long)p.hidden, reps, readGBs, fbest, fGBs, 100 * fGBs / readGBs,
                bbest, bGBs, 100 * bGBs / readGBs);
    return 0;
}
