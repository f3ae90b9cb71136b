// The stream kernels' backward on fp16/bf16 outputs above the non-temporal threshold (32 MiB):
// its column pass writes whole 64-byte lines of every gradient row with non-temporal stores from
// the first line boundary of the row (the columns before it and the row's tail with cached
// stores). Checked against the double reference on sampled tokens, the weight gradients in full.
// (The same pass on small outputs is compared bit for bit with the row-by-row pass that strided
// views take: BarStrided.ViewsGiveTheContiguousBits in bar_test.cpp.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "attnops/attnops.h"
#include "forced_impl.hpp"
#include "problem_bar.hpp"

namespace {

using attnops::testsupport::ForcedImpl;
using attnops::tools::BarCheck;
using attnops::tools::BarInstance;
using attnops::tools::BarProblem;

bool implementationRuns(const char* name) {
    ForcedImpl forced(name);
    BarProblem p;
    p.tokens = 1;
    p.blocks = 1;
    p.hidden = 4;
    BarInstance probe(p);
    return probe.runForward(true) == ATTNOPS_SUCCESS;
}

TEST(BarStreamColumns, LargeHalfPrecisionGradientsAreStreamed) {
    int ran = 0;
    for (const char* impl : {"stream-avx512-bf16", "stream-avx512", "stream-avx2"}) {
        if (!implementationRuns(impl)) {
            std::printf("[  NOTE    ] %s is not available on this CPU\n", impl);
            continue;
        }
        ++ran;
        ForcedImpl forced(impl);
        for (attnopsDataType dtype : {ATTNOPS_BFLOAT16, ATTNOPS_FLOAT16}) {
            for (int64_t hidden : {4096, 4096 + 24}) {
                // gradBlockRes over 2304 * 2 * 4096 * 2 bytes = 37.7 MB. H = 4096: every row at the
                // same offset within a line; 4120: rows at different offsets, a 24-column tail.
                BarProblem p;
                p.tokens = 2304;
                p.blocks = 2;
                p.hidden = hidden;
                p.dtype = dtype;
                SCOPED_TRACE(std::string(impl) + " " + p.describe());
                BarInstance inst(p);
                ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS);
                ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS);
                const BarCheck b = attnops::tools::checkBarBackward(inst, 48);
                EXPECT_TRUE(b.passed) << b.failure;
            }
        }
    }
    if (ran == 0) GTEST_SKIP() << "no stream kernel runs on this CPU (needs AVX2+FMA+F16C or AVX-512)";
}

}  // namespace
