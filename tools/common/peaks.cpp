// Memory-bandwidth microbenchmark.
#include "peaks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "attnops/runtime.h"

namespace attnops::tools {
namespace {

// 16 independent lanes keep the loads, not an add chain, the limit.
float sumRange(const float* a, uint64_t n) {
    float lanes[16] = {};
    for (uint64_t i = 0; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) lanes[l] += a[i + l];
    float s = 0;
    for (float x : lanes) s += x;
    return s;
}

}  // namespace

double measureReadBandwidth(uint64_t bytes, int threads, int repeats) {
    if (threads <= 0) {
        attnopsDeviceInfo info{};
        threads = attnopsGetDeviceInfo(0, &info) == ATTNOPS_SUCCESS ? info.threads : 1;
    }
    const uint64_t n = bytes / sizeof(float) / 16 * 16;
    std::vector<float> buffer(n);
    const uint64_t share = n / uint64_t(threads) / 16 * 16;
    std::vector<float> sink(size_t(threads), 0.0f);
    auto pass = [&](bool touch) {
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                float* a = buffer.data() + share * uint64_t(t);
                if (touch) std::fill(a, a + share, 1.0f);
                sink[size_t(t)] += sumRange(a, share);
            });
        for (auto& th : pool) th.join();
    };
    pass(true);
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pass(false);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(double(share) * double(threads) * sizeof(float) / s / 1e9);
    }
    std::sort(rates.begin(), rates.end());
    volatile float keep = sink[0];
    (void)keep;
    return rates[rates.size() / 2];
}

}  // namespace attnops::tools
