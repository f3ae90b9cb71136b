// FlashAttentionScore forwards with a pse, an explicit mask or dropout, and FusedInferAttentionScore's prefill
// route with a mask, through the problem builders of tools/common (the tests' and the CLI's): process CPU time,
// best of N calls, 1 worker thread. Build one copy against each tree (old: /work/main, new: a worktree):
//   g++ -O2 -std=c++20 -I<tree>/include -I<tree>/tools/common -I<tree>/src THIS <tree>/build/libattnops_problem.a \
//       <tree>/build/libattnops.a -lpthread -o bias_cpu_time_<tag>
// usage: bias_cpu_time <workload> [S] [trials]; workloads: slopes, pse, mask, dropout, fa-mask-bf16, fia-mask-bf16;
// any other name: the plain forward (no bias)
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "attnops/attnops.h"
#include "problem.hpp"
#include "problem_fia.hpp"
#include "measure.hpp"

using namespace attnops::tools;

int main(int argc, char** argv) {
    const std::string w = argc > 1 ? argv[1] : "mask";
    const int64_t S = argc > 2 ? atoll(argv[2]) : 1024, N = 8, D = 128;
    const int trials = argc > 3 ? atoi(argv[3]) : 5;
    attnopsSetDeviceThreads(0, 1);
    double best = 1e30;
    if (w.rfind("fia", 0) == 0) {
        FiaProblem p;
        p.layout = "BNSD";
        p.batch = 1;
        p.qSeqLen = S;
        p.kvSeqLen = S;
        p.heads = N;
        p.kvHeads = N;
        p.dim = D;
        p.dtype = ATTNOPS_BFLOAT16;
        p.maskKind = "random";
        FiaInstance inst(p);
        for (int t = 0; t < trials; ++t) {
            const double t0 = cpuNow();
            if (inst.run() != ATTNOPS_SUCCESS) return printf("error: %s\n", attnopsGetLastErrorMessage()), 2;
            best = std::min(best, cpuNow() - t0);
        }
        printf("%s S=%ld N=%ld D=%ld bf16 random mask: %s best of %d %.1f ms CPU\n", w.c_str(), long(S), long(N), long(D),
               lastImplementation().c_str(), trials, best * 1e3);
        return 0;
    }
    FaProblem p = fixed("BNSD", w == "fa-mask-bf16" ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32, 1, S, S, N, N, D);
    if (w == "slopes") p = withPse(p, 2);
    if (w == "pse") p = withPse(p, 1, "full");
    if (w == "mask" || w == "fa-mask-bf16") p.maskKind = "random";
    if (w == "dropout") p.keepProb = 0.9;
    FaInstance inst(p);
    for (int t = 0; t < trials; ++t) {
        const double t0 = cpuNow();
        if (inst.runForward() != ATTNOPS_SUCCESS) return printf("error: %s\n", attnopsGetLastErrorMessage()), 2;
        best = std::min(best, cpuNow() - t0);
    }
    printf("%s %s: best of %d %.1f ms CPU\n", w.c_str(), p.describe().c_str(), trials, best * 1e3);
    return 0;
}
