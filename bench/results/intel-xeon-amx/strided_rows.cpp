// One thread reading 1 GiB (4 KiB pages) as rows: `use` bytes out of every `stride`, with a
// prefetch to L2 (prefetcht1) `ahead` rows ahead; GB/s of the bytes used. The access of a decode
// unit that reads one kv head of a cache whose rows hold 8 kv heads side by side (BnBsH pages:
// 256 bytes of bf16 at D 128 out of each 2 KiB row), against contiguous rows (BnNBsD pages).
// The evidence for the FusedInferAttentionScore units of several kv heads (seventh AMX session,
// NOTES.md; interleavedHeads in src/ops/fused_infer_attention_score/plan.cpp). Not part of the build.
//   g++ -O3 -march=native strided_rows.cpp -o strided_rows && ./strided_rows
// Intel(R) Xeon(R) Processor, GenuineIntel family 6 model 167 as its KVM guest reported it,
// 2026-12-07 20:20 UTC, GCC 12.2, best of 3:
//   stride   256 use 256 ahead  32 pf 1: 9.50 GB/s useful   (contiguous)
//   stride  2048 use 256 ahead  32 pf 1: 5.04 GB/s useful
//   stride  2048 use 256 ahead 128 pf 1: 6.51 GB/s useful
//   stride  2048 use 256 ahead  32 pf 0: 6.40 GB/s useful
//   stride  2048 use 512 ahead  32 pf 1: 6.53 GB/s useful
//   stride  1024 use 256 ahead  32 pf 1: 5.83 GB/s useful
//   stride  4096 use 256 ahead  32 pf 1: 4.21 GB/s useful
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <sys/mman.h>
// read `use` bytes out of every `stride` bytes, prefetching (t1) `ahead` rows ahead
__attribute__((noinline)) float run(const char* buf, size_t rows, size_t stride, size_t use, size_t ahead, int pf) {
    __m512 acc = _mm512_setzero_ps();
    for (size_t r = 0; r < rows; ++r) {
        const char* p = buf + r * stride;
        if (pf && r + ahead < rows) for (size_t l = 0; l < use; l += 64) _mm_prefetch(p + ahead * stride + l, _MM_HINT_T1);
        for (size_t l = 0; l < use; l += 64) acc = _mm512_add_ps(acc, _mm512_load_ps((const float*)(p + l)));
    }
    return _mm512_reduce_add_ps(acc);
}
int main() {
    size_t bytes = size_t(1) << 30;
    char* buf = (char*)aligned_alloc(1 << 21, bytes);
    madvise(buf, bytes, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < bytes; i += 64) buf[i] = 1;
    volatile float sink = 0;
    struct C { size_t stride, use, ahead; int pf; } cs[] = {{256, 256, 32, 1}, {2048, 256, 32, 1}, {2048, 256, 128, 1}, {2048, 256, 32, 0}, {2048, 512, 32, 1}, {1024, 256, 32, 1}, {4096, 256, 32, 1}};
    for (auto c : cs) {
        size_t rows = bytes / c.stride;
        if (c.stride == 256) rows /= 8;  // the same useful bytes as stride 2048
        double best = 1e9;
        for (int rep = 0; rep < 3; ++rep) {
            auto t0 = std::chrono::steady_clock::now();
            sink = sink + run(buf, rows, c.stride, c.use, c.ahead, c.pf);
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        printf("stride %5zu use %3zu ahead %3zu pf %d: %.2f GB/s useful\n", c.stride, c.use, c.ahead, c.pf, rows * c.use / best / 1e9);
    }
}
