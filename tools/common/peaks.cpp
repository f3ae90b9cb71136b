// Microbenchmarks of this machine's ceilings: DRAM read bandwidth and arithmetic peaks.
#include "peaks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "attnops/runtime.h"
#include "core/error.hpp"
#include "cpu/bf16_path.hpp"
#include "cpu/isa.hpp"
#include "peaks_isa.hpp"

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

int deviceThreads(int threads) {
    if (threads > 0) return threads;
    attnopsDeviceInfo info{};
    return attnopsGetDeviceInfo(0, &info) == ATTNOPS_SUCCESS ? info.threads : 1;
}

using Loop = double (*)(int64_t, float*);

// Runs `loop` on `threads` threads at once; iterations are calibrated on one thread so a pass
// lasts about `seconds`. The best GFLOP/s of the passes: a pass cannot beat the hardware, and on a
// shared host the others only show how much of it a neighbour took.
double timeLoop(Loop loop, int threads, double seconds, int repeats) {
    float sink = 0.0f;
    int64_t iterations = 1 << 12;
    for (;;) {  // calibrate
        const auto t0 = std::chrono::steady_clock::now();
        loop(iterations, &sink);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s >= seconds / 4 || iterations > (int64_t(1) << 40)) {
            iterations = std::max<int64_t>(1, int64_t(double(iterations) * seconds / std::max(s, 1e-9)));
            break;
        }
        iterations *= 4;
    }
    std::vector<double> rates;
    std::vector<float> sinks(size_t(threads), 0.0f);
    for (int r = 0; r < repeats; ++r) {
        std::vector<double> flops(size_t(threads), 0.0);
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] { flops[size_t(t)] = loop(iterations, &sinks[size_t(t)]); });
        for (auto& th : pool) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double total = 0.0;
        for (double f : flops) total += f;
        rates.push_back(total / s / 1e9);
    }
    volatile float keep = sink + sinks[0];
    (void)keep;
    return *std::max_element(rates.begin(), rates.end());
}

}  // namespace

ArithmeticPeak measureFp32Peak(int threads, double seconds, int repeats) {
    const cpu::IsaFeatures& f = cpu::isa();
    threads = deviceThreads(threads);
    if (f.avx512f) return {timeLoop(isa_loops::fmaAvx512, threads, seconds, repeats), "AVX-512 FMA (vfmadd, zmm)"};
    if (f.avx2 && f.fma) return {timeLoop(isa_loops::fmaAvx2, threads, seconds, repeats), "AVX2 FMA (vfmadd, ymm)"};
    return {0.0, "no FMA instructions on this CPU"};
}

ArithmeticPeak measureBf16Peak(int threads, double seconds, int repeats) {
    const cpu::IsaFeatures& f = cpu::isa();
    if (f.amxBf16 && f.amxGranted)
        return {timeLoop(isa_loops::dotBf16Amx, deviceThreads(threads), seconds, repeats), "AMX bf16 tiles (tdpbf16ps)"};
    if (cpu::bf16Path().path == cpu::Bf16Path::Dot)
        return {timeLoop(isa_loops::dotBf16Avx512, deviceThreads(threads), seconds, repeats),
                f.amxBf16 ? "AVX512-BF16 (vdpbf16ps; AMX present but not granted by the OS)"
                          : "AVX512-BF16 (vdpbf16ps; no AMX on this CPU)"};
    // The widened path multiplies with fp32 FMAs: its peak is theirs.
    ArithmeticPeak fma = measureFp32Peak(threads, seconds, repeats);
    fma.unit = "bf16 widened to fp32, " + fma.unit;
    return fma;
}

std::string bf16PathText() {
    try {
        const cpu::Bf16Choice& c = cpu::bf16Path();
        return std::string(cpu::bf16PathName(c.path)) + " (" + c.reason + ")";
    } catch (const StatusError& e) {
        return std::string("not decided: ") + e.what();
    }
}

double measureReadBandwidth(uint64_t bytes, int threads, int repeats) {
    threads = deviceThreads(threads);
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
    volatile float keep = sink[0];
    (void)keep;
    return *std::max_element(rates.begin(), rates.end());  // the best pass, as timeLoop
}

}  // namespace attnops::tools
