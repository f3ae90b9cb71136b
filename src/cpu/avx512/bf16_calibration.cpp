// The bf16 path calibration: the AVX-512 GEMM microkernel on fp32 (bf16 widened at pack time)
// and on bf16 pairs (vdpbf16ps), timed on the same L1-resident block with the same FLOPs. About
// 1.5 ms in all, run once per process on first need (cpu/bf16_path.cpp), never at library load.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "cpu/avx512/microkernels.hpp"
#include "cpu/bf16_path.hpp"

namespace attnops::cpu {
namespace {

// C[48 x 64] = A[48 x 64] * B[64 x 64]: A, B and C take 40 KiB, inside every L1d we target.
constexpr int64_t kRows = 48, kCols = 64, kDepth = 64;
constexpr double kPassSeconds = 2e-4;
constexpr int kPasses = 3;

// Median GFLOP/s of kPasses passes of about kPassSeconds each, after one warm-up pass.
template <typename Gemm>
double rate(Gemm&& gemm) {
    using Clock = std::chrono::steady_clock;
    constexpr double kFlops = 2.0 * kRows * kCols * kDepth;
    std::vector<double> rates;
    for (int pass = -1; pass < kPasses; ++pass) {
        int64_t calls = 0;
        const auto t0 = Clock::now();
        double seconds = 0.0;
        do {
            gemm();
            ++calls;
            seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        } while (seconds < kPassSeconds);
        if (pass >= 0) rates.push_back(double(calls) * kFlops / seconds / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
}

}  // namespace

Bf16Calibration calibrateBf16Avx512() {
    std::vector<float> a(size_t(kRows * kDepth), 0.5f), b(size_t(kDepth * kCols), 0.25f), c(size_t(kRows * kCols));
    // The same values as bf16 pairs (0.5 and 0.25 are exact in bf16): k counts pairs.
    std::vector<uint32_t> ap(size_t(kRows * kDepth / 2), 0x3F003F00u), bp(size_t(kDepth / 2 * kCols), 0x3E803E80u);
    Bf16Calibration cal;
    cal.widenGflops = rate(
        [&] { avx512::gemm<false>(kRows, kCols, kDepth, a.data(), kDepth, b.data(), kCols, c.data(), kCols, false); });
    cal.dotGflops = rate([&] {
        avx512::gemm<false, avx512::Bf16PairDot>(kRows, kCols, kDepth / 2, ap.data(), kDepth / 2, bp.data(), kCols,
                                                 c.data(), kCols, false);
    });
    return cal;
}

}  // namespace attnops::cpu
