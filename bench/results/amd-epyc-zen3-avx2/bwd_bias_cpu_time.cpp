// FlashAttentionScoreGrad with dropout, an alibi pse, a dense pse or a random explicit mask, through the problem
// builders of tools/common (the tests' and the CLI's): process CPU time of the backward call, best of N calls,
// 1 worker thread (the forward that makes its inputs runs once, untimed). ATTNOPS_FA_ROW_STEPS=1 in the
// environment gives the row steps (the code before the backward's vector pse/mask/dropout steps); or build one
// copy against each tree:
//   g++ -O2 -std=c++20 -I<tree>/include -I<tree>/tools/common -I<tree>/src THIS <tree>/build/libattnops_problem.a \
//       <tree>/build/libattnops.a -lpthread -o bwd_bias_cpu_time
// usage: bwd_bias_cpu_time <workload> [S] [trials] [impl]; workloads: dropout (keep 0.9), alibi (slopes, pseType 2),
// pse (dense, pseType 1), mask (random explicit mask), none (no bias: the cost the others add to); bf16 BNSD B=1 N=8 D=128; impl: ATTNOPS_FORCE_IMPL
// (default: the planner's choice, avx2-fused on AVX2 machines).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "attnops/attnops.h"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "measure.hpp"

using namespace attnops::tools;

int main(int argc, char** argv) {
    const std::string w = argc > 1 ? argv[1] : "dropout";
    const int64_t S = argc > 2 ? atoll(argv[2]) : 1024, N = 8, D = 128;
    const int trials = argc > 3 ? atoi(argv[3]) : 5;
    if (argc > 4) setenv("ATTNOPS_FORCE_IMPL", argv[4], 1);
    attnopsSetDeviceThreads(0, 1);
    FaProblem p = fixed("BNSD", ATTNOPS_BFLOAT16, 1, S, S, N, N, D);
    if (w == "dropout") {
        p.keepProb = 0.9;
        p.seed = 5;
        p.offset = 17;
    } else if (w == "alibi") {
        p = withPse(p, 2);
    } else if (w == "pse") {
        p = withPse(p, 1, "full");
    } else if (w == "mask") {
        p.maskKind = "random";
    } else if (w != "none") {
        std::fprintf(stderr, "unknown workload %s\n", w.c_str());
        return 2;
    }
    FaInstance inst(p);
    if (inst.runForward() != ATTNOPS_SUCCESS) {
        std::fprintf(stderr, "forward: %s\n", attnopsGetLastErrorMessage());
        return 1;
    }
    FaGrads g = makeGrads(inst);
    double best = 1e30;
    for (int t = 0; t < trials; ++t) {
        const double c0 = cpuNow();
        if (runBackward(inst, g) != ATTNOPS_SUCCESS) {
            std::fprintf(stderr, "backward: %s\n", attnopsGetLastErrorMessage());
            return 1;
        }
        const double c = cpuNow() - c0;
        best = c < best ? c : best;
    }
    const char* rowSteps = std::getenv("ATTNOPS_FA_ROW_STEPS");
    std::printf("%s %s rowSteps=%s impl=%s: best of %d %.1f ms CPU\n", w.c_str(), p.describe().c_str(),
                rowSteps != nullptr ? rowSteps : "0", lastImplementation().c_str(), trials, best * 1e3);
    return 0;
}
