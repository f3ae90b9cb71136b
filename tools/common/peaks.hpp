// Small in-process microbenchmarks of this machine's ceilings, so that benchmarks can report a
// ratio measured in the same run (design.md, "Performance method").
#pragma once

#include <cstdint>

namespace attnops::tools {

// DRAM read bandwidth in GB/s: `threads` threads each sum their share of a `bytes` buffer
// (first touched by the same threads), median of `repeats` passes after a warm-up pass.
double measureReadBandwidth(uint64_t bytes = uint64_t(512) << 20, int threads = 0, int repeats = 5);

}  // namespace attnops::tools
