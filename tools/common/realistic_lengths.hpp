// The packed sequence lengths of the tnd-32k-causal benchmark workload, shared by `attnops bench`
// and the measurement programs of bench/results that rebuild its shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "problem.hpp"

namespace attnops::tools {

// Realistic packed lengths: log-normal (median 512, sigma 0.8), clamped to [16, 4096], drawn until
// the batch holds `tokens` tokens (the last length trimmed). The same on every machine.
inline std::vector<int64_t> realisticLengths(int64_t tokens) {
    Rng rng(32768);
    std::vector<int64_t> lengths;
    int64_t total = 0;
    while (total < tokens) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
        const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        int64_t len = std::clamp(int64_t(std::llround(512.0 * std::exp(0.8 * normal))), int64_t(16), int64_t(4096));
        len = std::min(len, tokens - total);
        lengths.push_back(len);
        total += len;
    }
    return lengths;
}

}  // namespace attnops::tools
