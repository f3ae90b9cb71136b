// Output bytes of FlashAttentionScore forwards with pse, explicit masks and dropout (and FIA prefill with pseShift
// and masks), one FNV-1a hash per problem over attentionOut and the statistics (NaNs written as one pattern), so
// that an old and a new build can be compared byte for byte: build one copy against each tree as
// bias_cpu_time.cpp says, run both, diff the outputs. 2 worker threads.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attnops/attnops.h"
#include "problem.hpp"
#include "problem_fia.hpp"

using namespace attnops::tools;

static uint64_t fnv(uint64_t h, const HostTensor& t) {
    const std::vector<uint8_t>& b = t.bytes();
    const int64_t n = t.numel();
    const size_t w = n > 0 ? b.size() / size_t(n) : 1;
    for (int64_t i = 0; i < n; ++i) {
        const bool nan = std::isnan(t.get(i));
        for (size_t k = 0; k < w; ++k) h = (h ^ (nan ? 0x7f : b[size_t(i) * w + k])) * 1099511628211ull;
    }
    return h;
}

int main() {
    attnopsSetDeviceThreads(0, 2);
    std::vector<FaProblem> ps;
    const attnopsDataType dts[] = {ATTNOPS_FLOAT32, ATTNOPS_BFLOAT16, ATTNOPS_FLOAT16};
    int k = 0;
    for (const char* layout : {"BNSD", "BSH", "BSND", "SBH"})
        for (int64_t s1 : {1, 9, 120, 121, 250})
            for (int64_t s2 : {1, 128, 129, 300}) {
                const attnopsDataType dt = dts[k % 3];
                FaProblem p = fixed(layout, dt, 2, s1, s2, 4, (k % 2) ? 2 : 1, (k % 4) ? 64 : 40);
                switch (k % 6) {
                    case 0: p = withPse(p, 1, "full"); p.maskKind = "random"; break;
                    case 1: p = withPse(p, 0, "row"); p = withMode(p, 0, 60, 3); p.maskKind = "random"; break;
                    case 2: p = withPse(p, 2 + (k / 6) % 2); p.keepProb = 0.8; break;
                    case 3: p.maskKind = "causal"; p.keepProb = 0.9; p.explicitDropMask = (k / 6) % 2; break;
                    case 4: p = withPse(withMode(p, 3), 1, "full"); break;
                    default: p = withMode(p, 5); p.keepProb = 0.7; break;
                }
                p.dataSeed = uint64_t(k) + 1;
                ps.push_back(p);
                ++k;
            }
    ps.push_back(withPse(withMode(tnd(ATTNOPS_FLOAT32, {0, 1, 130, 9, 241}, {3, 1, 257, 0, 200}, 4, 2, 32), 3), 1, "full"));
    ps.push_back(withPse(tnd(ATTNOPS_BFLOAT16, {5, 130, 1, 70}, {9, 129, 1, 3}, 4, 1, 64), 0, "row"));
    {
        FaProblem p = tnd(ATTNOPS_FLOAT16, {0, 1, 130, 9}, {3, 1, 257, 0}, 4, 1, 32);
        p.maskKind = "random";
        p.keepProb = 0.85;
        ps.push_back(p);
    }
    ps.push_back(withPse(withMode(fixed("BNSD", ATTNOPS_FLOAT32, 1, 1100, 1100, 1, 1, 8), 2), 1, "compressed"));
    for (const FaProblem& p : ps) {
        FaInstance inst(p);
        if (inst.runForward() != ATTNOPS_SUCCESS) {
            printf("%s: error %s\n", p.describe().c_str(), attnopsGetLastErrorMessage());
            continue;
        }
        uint64_t h = 1469598103934665603ull;
        for (const HostTensor* t : {&inst.attentionOut, &inst.softmaxMax, &inst.softmaxSum}) h = fnv(h, *t);
        printf("%016llx %s [%s]\n", (unsigned long long)h, p.describe().c_str(), lastImplementation().c_str());
    }
    for (int c = 0; c < 8; ++c) {
        FiaProblem p;
        p.layout = c % 2 ? "BSND" : "BNSD";
        p.batch = 2;
        p.qSeqLen = 120 + 61 * c;
        p.kvSeqLen = 100 + 97 * c;
        p.heads = 4;
        p.kvHeads = c % 3 ? 2 : 4;
        p.dim = 64;
        p.dtype = c % 2 ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT16;
        p.maskKind = c % 4 ? "random" : "auto";
        p.pse = c % 3 == 0 ? "batch" : (c % 3 == 1 ? "shared" : "none");
        FiaInstance inst(p);
        if (inst.run() != ATTNOPS_SUCCESS) {
            printf("%s: error %s\n", p.describe().c_str(), attnopsGetLastErrorMessage());
            continue;
        }
        const uint64_t h = fnv(fnv(1469598103934665603ull, inst.attentionOut), inst.softmaxLse);
        printf("%016llx %s [%s]\n", (unsigned long long)h, p.describe().c_str(), lastImplementation().c_str());
    }
}
