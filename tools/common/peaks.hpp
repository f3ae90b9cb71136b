// Small in-process microbenchmarks of this machine's ceilings, so that benchmarks can report a
// ratio measured in the same run (design.md, "Performance method").
#pragma once

#include <cstdint>
#include <string>

namespace attnops::tools {

// DRAM read bandwidth in GB/s: `threads` threads each sum their share of a `bytes` buffer
// (first touched by the same threads), the best of `repeats` passes after a warm-up pass.
double measureReadBandwidth(uint64_t bytes = uint64_t(512) << 20, int threads = 0, int repeats = 5);

// An arithmetic peak in GFLOP/s over `threads` threads (0: device 0's worker count), the best
// of `repeats` timed passes of about `seconds` each; `unit` names the instructions used. A peak
// this CPU (or OS) lacks has gflops 0 and says why in `unit`.
struct ArithmeticPeak {
    double gflops = 0.0;
    std::string unit;
};
// fp32 multiply-add: AVX-512 FMA, else AVX2 FMA.
ArithmeticPeak measureFp32Peak(int threads = 0, double seconds = 0.2, int repeats = 3);
// bf16 products on the path the kernels take: AMX tiles where the OS grants them, else
// AVX512-BF16 vdpbf16ps where this CPU's bf16 path is "dot", else the fp32 FMA peak (bf16
// widened to fp32).
ArithmeticPeak measureBf16Peak(int threads = 0, double seconds = 0.2, int repeats = 3);

// This process's bf16 path and why (cpu/bf16_path.hpp), or why it could not be decided.
std::string bf16PathText();

}  // namespace attnops::tools
