// Session 11, issue 13: the forward's idle tail at 2 (and 3) threads by the plan's cost model, through the library's own
// partitionUnits (index order vs largest-first), for GQA 32/8 S=2048 causal and tnd-32k-causal (bench.cpp's realistic
// lengths, as listed in fwd-s10-causal-tnd-under-load.txt). Cost of a query block [q0, q1): group x ((q1-q0) x q1 + 64),
// 120-row blocks (the AVX2 forward's units). Idle tail = makespan of dynamic claiming in chunk order / (total / threads) - 1.
// Build: c++ -std=c++20 -O2 -Isrc -Iinclude -DFMT_HEADER_ONLY=1 bench/results/amd-epyc-zen3-avx2/fwd_s11_lpt_tail.cpp
//        build/libattnops.a -lpthread -o /tmp/lpt_tail
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <queue>
#include <vector>

#include "ops/flash_attention_score/plan.hpp"

namespace fa = attnops::fa;

struct Workload {
    const char* name;
    std::vector<int64_t> lens;
    int64_t n2, group, perThread;
};

int main() {
    const int64_t qr = 120;
    const std::vector<int64_t> tnd = {52,  87,  100, 215, 235, 270, 271, 285,  292,  301,  316,  338,  344,  379,
                                      406, 449, 475, 480, 560, 570, 592, 608,  616,  672,  689,  690,  764,  772,
                                      788, 793, 826, 832, 882, 1165, 1210, 1480, 1502, 2484, 2507, 3154, 3317};
    const std::vector<Workload> loads = {{"GQA 32/8 S=2048 causal, 64 chunks/thread", {2048}, 8, 4, 64},
                                         {"tnd-32k-causal, 64 chunks/thread", tnd, 4, 4, 64},
                                         {"GQA 32/8 S=2048 causal, 16 chunks/thread", {2048}, 8, 4, 16},
                                         {"tnd-32k-causal, 16 chunks/thread", tnd, 4, 4, 16}};
    for (const Workload& w : loads) {
        auto blocks = [&](int64_t b) { return (w.lens[size_t(b)] + qr - 1) / qr; };
        auto cost = [&](int64_t b, int64_t local) {
            const int64_t q0 = (local % blocks(b)) * qr, q1 = std::min(w.lens[size_t(b)], q0 + qr);
            return double(w.group) * double((q1 - q0) * q1 + 64);
        };
        for (int threads : {2, 3}) {
            for (fa::UnitOrder order : {fa::UnitOrder::Index, fa::UnitOrder::LargestFirst}) {
                const fa::UnitSpace s = fa::partitionUnits(
                    int64_t(w.lens.size()), threads, [&](int64_t b) { return w.n2 * blocks(b); }, cost, w.perThread,
                    order);
                std::priority_queue<double, std::vector<double>, std::greater<double>> free;
                for (int t = 0; t < threads; ++t) free.push(0.0);
                double total = 0, makespan = 0;
                for (int64_t c = 0; c < s.chunks(); ++c) {
                    double chunk = 0;
                    s.forEachInChunk(c, [&](int64_t b, int64_t l) { chunk += cost(b, l); });
                    total += chunk;
                    const double end = free.top() + chunk;
                    free.pop();
                    free.push(end);
                    makespan = std::max(makespan, end);
                }
                std::printf("%-42s %d threads, %-13s: %4lld units, %4lld chunks, idle tail %.3f%%\n", w.name, threads,
                            order == fa::UnitOrder::Index ? "index order" : "largest-first",
                            (long long)s.base.back(), (long long)s.chunks(), 100.0 * (makespan / (total / threads) - 1.0));
            }
        }
    }
}
