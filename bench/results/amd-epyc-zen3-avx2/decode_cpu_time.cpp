// Build from the repository root after a Release build:
//   g++ -O2 -std=c++20 -I tools/common -I src -I include -DATTNOPS_STATIC_DEFINE -DFMT_HEADER_ONLY=1 \
//       bench/results/amd-epyc-zen3-avx2/decode_cpu_time.cpp build/libattnops_problem.a build/libattnops.a -lpthread -o /tmp/cpu2
//   /tmp/cpu2 x 32 4096 <0: bf16 KV | 1: int8 KV> 8
// CPU-time harness (one worker thread): min over runs of process CPU time per call, for a decode
// step and for a plain read of a 512 MiB buffer (the DRAM read peak's loop shape).
#include <time.h>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <immintrin.h>
#include "problem_fia.hpp"
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
    attnopsSetDeviceThreads(0, 1);
    int reps = atoi(argv[5]);
    size_t n = (size_t(512) << 20) / 4; std::vector<float> buf(n, 1.0f);
    double rbest = 1e9; volatile float sink = 0;
    for (int r = 0; r < reps; ++r) { double t0 = cpuMs(); sink = sink + sumAll(buf.data(), n); rbest = std::min(rbest, cpuMs() - t0); }
    int64_t B = atoi(argv[2]), S = atoi(argv[3]); bool i8 = atoi(argv[4]);
    FiaProblem p; p.layout = "BSND"; p.batch = B; p.qSeqLen = 1; p.kvLens.assign(B, S); p.heads = 32; p.kvHeads = 8; p.dim = 128;
    p.dtype = ATTNOPS_BFLOAT16; p.cache = "BnNBsD"; p.blockSize = 128; p.int8Kv = i8; p.quantOffset = false; p.lse = false;
    FiaInstance inst(p);
    inst.run();
    double best = 1e9;
    for (int r = 0; r < reps; ++r) { double t0 = cpuMs(); inst.run(); best = std::min(best, cpuMs() - t0); }
    double bytes = double(B) * S * 8 * 256 * (i8 ? 1 : 2);
    printf("%s: read %.2f GB per CPU-s; decode %s B=%ld S=%ld %.1f CPU-ms, %.2f GB per CPU-s (%.0f%% of read)\n", argv[1],
           (n * 4.0) / rbest / 1e6, i8 ? "int8" : "bf16", B, S, best, bytes / best / 1e6, 100.0 * (bytes / best) / ((n * 4.0) / rbest));
}
