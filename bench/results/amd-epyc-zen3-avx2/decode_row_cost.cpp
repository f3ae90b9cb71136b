// Per-row cost of the decode microkernels of src/cpu/simd/fia_forward.hpp (avx2): the score dot
// (dotRows, 4 query rows = one GQA group of 4, D 128, 3 keys per step) and P.V (accumulateRows),
// each on 64-key blocks, with the key/value rows either in cache (the same 64 rows again and
// again) or streamed (every block a fresh 64 rows of a 1 GiB cache, i.e. DRAM). Process CPU
// time, best of N, one thread. Build from the repository root after a Release build:
//   g++ -O2 -std=c++20 -I src -I include -I build/include -DATTNOPS_STATIC_DEFINE
//       bench/results/amd-epyc-zen3-avx2/decode_row_cost.cpp -o /tmp/rowcost && /tmp/rowcost 5
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/simd/fia_forward.hpp"

using namespace attnops;
using namespace attnops::fia::simd_forward;
using V = cpu::Avx2;

static double cpuNs() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + double(t.tv_nsec);
}

constexpr int64_t kD = 128, kRows = 4, kBlock = 64;

ATTNOPS_SIMD_FN void prefetchValues(const Scratch& sc) {
    for (int64_t j = 0; j < sc.nextRows; ++j) prefetchRow(sc.vNext[j], sc.vLines, sc.vLineCount);
}

// Key rows and value rows of block b: in cache, the same 2 x 64 rows every time; streamed,
// fresh rows of a 1 GiB buffer, keys and values in separate contiguous runs (as in a BnNBsD
// page), with the kernel's own prefetch of the next block's rows (dotRows' `pre`).
template <DType T>
void measure(const char* name, int64_t elemBytes, int reps) {
    const int64_t rowBytes = kD * elemBytes, cacheBytes = int64_t(1) << 30, cacheRows = cacheBytes / rowBytes;
    std::vector<char> cache(static_cast<size_t>(cacheBytes));
    for (size_t i = 0; i < cache.size(); ++i) cache[i] = char((i * 2654435761u >> 13) & 0x3f);  // small finite values
    std::vector<float> q(kRows * kD, 0.01f), st(kRows * kBlock, 0.001f), acc(kRows * kD, 0.0f);
    const int64_t blocks = 2048;  // 131,072 rows per timing
    std::vector<const char*> kr(size_t((blocks + 1) * kBlock)), vr(size_t((blocks + 1) * kBlock));
    fia::Params p{};
    p.core.group = kRows;
    p.core.d = p.core.dv = kD;
    p.key.dtype = p.value.dtype = T;
    const fia::TileShape t{1, kBlock};
    std::vector<float> scratch(size_t(Scratch::floats(p, t)));
    Scratch sc(p, t, scratch.data());
    for (int64_t v = 0; v < kD / 8; ++v) sc.kChunk[v] = sc.vChunk[v] = v * 8;
    sc.kLineCount = sc.vLineCount = 0;
    for (int64_t at = 0; at < rowBytes; at += 64) sc.kLines[sc.kLineCount++] = sc.vLines[sc.vLineCount++] = at;
    sc.prefetchValues = true;
    for (int streamed = 0; streamed < 2; ++streamed) {
        double best[3] = {1e30, 1e30, 1e30};
        for (int r = 0; r < reps; ++r) {
            for (int part = 0; part < 3; ++part) {  // dot alone, P.V alone, both
                const int64_t base = (int64_t(r) * 3 + part) * (blocks + 1) * kBlock, half = cacheRows / 2;
                for (int64_t i = 0; i < (blocks + 1) * kBlock; ++i) {
                    kr[size_t(i)] = cache.data() + (streamed ? (base + i) % half : i % kBlock) * rowBytes;
                    vr[size_t(i)] = cache.data() + (streamed ? half + (base + i) % half : kBlock + i % kBlock) * rowBytes;
                }
                const double t0 = cpuNs();
                for (int64_t b = 0; b < blocks; ++b) {
                    sc.kNext = kr.data() + (b + 1) * kBlock;
                    sc.vNext = vr.data() + (b + 1) * kBlock;
                    sc.nextRows = kBlock;
                    sc.prefetchValues = part != 0;
                    if (part == 1) {  // the value rows only: prefetched by hand as dotRows would
                        prefetchValues(sc);
                    } else {
                        dotRows<V, T, T, kRows, true, false>(kD, kr.data() + b * kBlock, sc.kChunk, 0, nullptr, nullptr,
                                                             kBlock, q.data(), kD, st.data(), nullptr, kBlock,
                                                             streamed ? &sc : nullptr);
                    }
                    if (part != 0)
                        accumulateRows<V, T, kRows, false, true>(kD, vr.data() + b * kBlock, sc.vChunk, kBlock, st.data(),
                                                                 kBlock, acc.data(), kD);
                }
                best[part] = std::min(best[part], cpuNs() - t0);
            }
        }
        const double n = double(blocks * kBlock);
        std::printf("%-5s %-9s dot %5.1f  P.V %5.1f  both %5.1f ns per (token, kv head) row; both: %.2f GB/s of K+V\n",
                    name, streamed ? "streamed" : "in-cache", best[0] / n, best[1] / n, best[2] / n,
                    2.0 * rowBytes / (best[2] / n));
    }
    std::printf("  (checksum %g)\n", double(acc[0] + st[0]));
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
    measure<DType::BF16>("bf16", 2, reps);
    measure<DType::I8>("int8", 1, reps);
    measure<DType::F16>("fp16", 2, reps);
}
