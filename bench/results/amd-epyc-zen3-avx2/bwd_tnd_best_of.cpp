// The tnd-32k-causal backward (attnops bench's packed log-normal lengths, N1=16 N2=4 D=128,
// causal), scaled to `tokens` tokens, fp32 and bf16 in one process: the two dtypes' calls
// alternate, and each one's best process CPU time (CLOCK_PROCESS_CPUTIME_ID: every thread of the
// process, other processes not counted; with 2 threads the figure is the two threads' sum) and
// best wall time are printed, so that a loaded shared machine still shows each one's undisturbed
// cost. usage: <binary> tokens trials [threads=1] [heads=16] [kvHeads=4] [dtypes=fp32,bf16]
// Build (from the repository root, after building the library and its problem library):
//   g++ -O2 -std=c++20 -Iinclude -Isrc -Itools THIS build/libattnops_problem.a build/libattnops.a -lpthread
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "common/problem.hpp"
#include "common/problem_grad.hpp"
#include "common/realistic_lengths.hpp"

namespace {

double clockNow(clockid_t id) {
    timespec t;
    clock_gettime(id, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Case {
    const char* name;
    attnops::tools::FaInstance inst;
    attnops::tools::FaGrads grads;
    double bestCpu = 1e30, bestWall = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
    using namespace attnops;
    const int64_t tokens = argc > 1 ? atoll(argv[1]) : 4096;
    const int trials = argc > 2 ? atoi(argv[2]) : 10;
    const int threads = argc > 3 ? atoi(argv[3]) : 1;
    const int64_t heads = argc > 4 ? atoll(argv[4]) : 16, kvHeads = argc > 5 ? atoll(argv[5]) : 4;
    const std::string dtypes = argc > 6 ? argv[6] : "fp32,bf16";
    attnopsSetDeviceThreads(0, threads);
    const std::vector<int64_t> lengths = tools::realisticLengths(tokens);
    std::vector<Case*> cases;
    for (const char* name : {"fp32", "bf16"}) {
        if (dtypes.find(name) == std::string::npos) continue;
        tools::FaProblem p = tools::withMode(
            tools::tnd(std::string(name) == "bf16" ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32, lengths, lengths, heads, kvHeads,
                       128),
            3);
        auto* c = new Case{name, tools::FaInstance(p), {}};
        if (c->inst.runForward() != ATTNOPS_SUCCESS) return 1;
        c->grads = tools::makeGrads(c->inst);
        if (tools::runBackward(c->inst, c->grads) != ATTNOPS_SUCCESS) return 1;  // warm-up
        cases.push_back(c);
    }
    for (int t = 0; t < trials; ++t)
        for (Case* c : cases) {
            const double c0 = clockNow(CLOCK_PROCESS_CPUTIME_ID), w0 = clockNow(CLOCK_MONOTONIC);
            tools::runBackward(c->inst, c->grads);
            c->bestCpu = std::min(c->bestCpu, clockNow(CLOCK_PROCESS_CPUTIME_ID) - c0);
            c->bestWall = std::min(c->bestWall, clockNow(CLOCK_MONOTONIC) - w0);
        }
    std::printf("TND %zu sequences, %lld tokens, N1=%lld N2=%lld D=128 causal, %d thread(s), best of %d (%s): %s\n",
                lengths.size(), (long long)tokens, (long long)heads, (long long)kvHeads, threads, trials,
                tools::lastImplementation().c_str(), dtypes.c_str());
    for (Case* c : cases)
        std::printf("  %s  cpu %.2f ms  wall %.2f ms\n", c->name, c->bestCpu * 1e3, c->bestWall * 1e3);
    return 0;
}
