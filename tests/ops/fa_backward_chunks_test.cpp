// FlashAttentionScoreGrad, the fused scheme's chunk split (ops/flash_attention_score/bwd_chunks.hpp):
// the split is a function of the problem alone and respects its bounds; problems with fewer
// (sequence, kv head) pairs than the split aims at are cut into several chunks per head, and
// those give the same bits for 1, 2, 3 and 7 threads and pass the reference's tolerance rule
// (single head, GQA, TND with empty and one-row sequences, causal and band masks, sink, dropout,
// pse, fp32/bf16/fp16), with the default choice and with every fused entry forced.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cpu/isa.hpp"
#include "amx_fused.hpp"
#include "forced_impl.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "threads_guard.hpp"

namespace fa = attnops::fa;
namespace chunks = attnops::fa::chunks;
using attnops::testsupport::ForcedImpl;
using attnops::testsupport::ThreadsGuard;
using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::fixed;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;

namespace {

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;

// Query blocks of the two vector fused entries (cpu::Avx2::kQueryRows, cpu::Avx512::kQueryRows).
// (The AMX one's chunks, of at least its chunkGroupRows, are checked in amx_test.cpp.)
constexpr int64_t kQueryBlocks[] = {120, 64};

fa::ForwardParams paramsOf(const FaProblem& p) {
    FaInstance inst(p);
    FaGrads g = attnops::tools::makeGrads(inst);
    return attnops::tools::backwardParams(inst, g).fwd;
}

void expectValidSplit(const fa::ForwardParams& p, int64_t queryRows, const std::string& what) {
    const int64_t rows = chunks::chunkRows(p, queryRows);
    ASSERT_GT(rows, 0) << what;
    EXPECT_EQ(rows % queryRows, 0) << what << ": " << rows << " rows";
    EXPECT_LE(rows, (std::max<int64_t>(1, p.seq.maxQLen) + queryRows - 1) / queryRows * queryRows) << what;
    EXPECT_LE(chunks::partialFloats(p, rows) * sizeof(float), chunks::kMaxPartialBytes) << what;
    EXPECT_LE(chunks::chunkRowsFloats(p, rows) * sizeof(float), chunks::kMaxChunkRowsBytes) << what;
    EXPECT_EQ(chunks::chunkRows(p, queryRows), rows) << what << ": not a function of the problem";
}

TEST(FaBackwardChunks, SplitIsAFunctionOfTheProblemWithinItsBounds) {
    for (const int64_t qr : kQueryBlocks) {
        // Enough (sequence, kv head) pairs: one chunk per sequence, no partials.
        {
            const fa::ForwardParams p = paramsOf(fixed("BNSD", F32, 8, 300, 300, 16, 8, 16));
            expectValidSplit(p, qr, "64 pairs");
            EXPECT_GE(chunks::chunkRows(p, qr), p.seq.maxQLen);
            EXPECT_EQ(chunks::partialFloats(p, chunks::chunkRows(p, qr)), 0u);
        }
        // One head: cut, at least kMinGroupRows rows a chunk.
        {
            const fa::ForwardParams p = paramsOf(fixed("BNSD", F32, 1, 2000, 2000, 1, 1, 16));
            expectValidSplit(p, qr, "one head");
            const int64_t rows = chunks::chunkRows(p, qr);
            EXPECT_LT(rows, p.seq.maxQLen);
            EXPECT_GE(rows, chunks::kMinGroupRows);
            EXPECT_GT(chunks::partialFloats(p, rows), 0u);
        }
        // GQA: the group's heads count towards the rows of a chunk.
        {
            const fa::ForwardParams p = paramsOf(fixed("BNSD", F32, 1, 900, 900, 8, 1, 16));
            expectValidSplit(p, qr, "GQA 8/1");
            EXPECT_LT(chunks::chunkRows(p, qr), p.seq.maxQLen);
        }
        // Long keys: the partials' bound makes chunks longer (never more than kMaxPartialBytes).
        {
            const fa::ForwardParams p = paramsOf(fixed("BNSD", F32, 1, 3000, 150000, 1, 1, 128));
            expectValidSplit(p, qr, "S2 = 150000");
            EXPECT_GT(chunks::chunkRows(p, qr), int64_t(chunks::kMinGroupRows));
        }
        // TND, lengths 0 and 1 among others.
        {
            const fa::ForwardParams p = paramsOf(tnd(F32, {0, 1, 700, 5, 333}, {3, 1, 650, 0, 400}, 2, 1, 16));
            expectValidSplit(p, qr, "TND");
            EXPECT_EQ(chunks::chunksOf(0, chunks::chunkRows(p, qr)), 1);
        }
    }
}

// From kWholePairs (sequence, kv head) pairs on, each pair is one unit with no partials (their
// traffic cost more than the cut gained there); one pair fewer is still cut.
TEST(FaBackwardChunks, ManyPairsRunWholeFewerAreCut) {
    static_assert(chunks::kWholePairs == 16, "the shapes below straddle kWholePairs");
    for (const int64_t qr : kQueryBlocks) {
        for (const auto& [what, problem] :
             std::vector<std::pair<std::string, FaProblem>>{{"B=1 N=16", fixed("BNSD", F32, 1, 2048, 2048, 16, 16, 16)},
              {"B=2 N=8", fixed("BNSD", F32, 2, 2048, 2048, 8, 8, 16)},
              {"B=4 GQA 16/4", withMode(fixed("BNSD", BF16, 4, 2048, 2048, 16, 4, 16), 3)}}) {
            const fa::ForwardParams p = paramsOf(problem);
            expectValidSplit(p, qr, what);
            EXPECT_GE(chunks::chunkRows(p, qr), p.seq.maxQLen) << what;
            EXPECT_EQ(chunks::partialFloats(p, chunks::chunkRows(p, qr)), 0u) << what;
        }
        for (const auto& [what, problem] :
             std::vector<std::pair<std::string, FaProblem>>{{"B=1 N=15", fixed("BNSD", F32, 1, 2048, 2048, 15, 15, 16)},
              {"B=1 GQA 32/8", withMode(fixed("BNSD", BF16, 1, 2048, 2048, 32, 8, 16), 3)}}) {
            const fa::ForwardParams p = paramsOf(problem);
            expectValidSplit(p, qr, what);
            EXPECT_LT(chunks::chunkRows(p, qr), p.seq.maxQLen) << what;
            EXPECT_GT(chunks::partialFloats(p, chunks::chunkRows(p, qr)), 0u) << what;
        }
    }
}

FaProblem withSink(FaProblem p) {
    p.sink = true;
    return p;
}

FaProblem withDropout(FaProblem p, double keep) {
    p.keepProb = keep;
    p.seed = 99;
    p.offset = 7;
    return p;
}

// Problems the fused entries cut into several chunks per head (checked below).
std::vector<FaProblem> splitProblems() {
    std::vector<FaProblem> v;
    v.push_back(fixed("BNSD", F32, 1, 800, 700, 1, 1, 40));                                   // one head
    v.push_back(withSink(withMode(fixed("BSND", BF16, 1, 610, 610, 4, 1, 64), 3)));            // GQA, causal, sink
    v.push_back(withMode(tnd(F16, {0, 1, 500, 130, 900}, {4, 1, 520, 0, 880}, 2, 1, 32), 3));  // TND varlen, causal
    v.push_back(withMode(fixed("SBH", F32, 1, 700, 650, 2, 2, 24), 4, 100, 30));               // band
    v.push_back(withDropout(withPse(fixed("BNSD", BF16, 1, 520, 300, 2, 1, 16), 1), 0.85));    // pse, dropout: row steps
    return v;
}

void poison(FaGrads& g) {
    for (attnops::tools::HostTensor* t : {&g.dq, &g.dk, &g.dv, &g.dsink})
        if (!t->empty()) std::fill(t->bytes().begin(), t->bytes().end(), uint8_t(0xFF));
}

void expectSameBytes(const FaGrads& a, const FaGrads& b, const std::string& what) {
    EXPECT_TRUE(a.dq.bytes() == b.dq.bytes()) << what << ": dq differs";
    EXPECT_TRUE(a.dk.bytes() == b.dk.bytes()) << what << ": dk differs";
    EXPECT_TRUE(a.dv.bytes() == b.dv.bytes()) << what << ": dv differs";
    EXPECT_TRUE(a.dsink.bytes() == b.dsink.bytes()) << what << ": dsink differs";
}

TEST(FaBackwardChunks, SplitHeadsGiveTheSameBitsForAnyThreadCount) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!(f.avx2 && f.fma && f.f16c)) GTEST_SKIP() << "no fused entry runs on this CPU (needs AVX2, FMA, F16C)";
    ThreadsGuard guard;
    int ran = 0;
    for (const FaProblem& problem : splitProblems()) {
        // The problem is cut for both entries' query blocks.
        const fa::ForwardParams params = paramsOf(problem);
        for (const int64_t qr : kQueryBlocks)
            EXPECT_LT(chunks::chunkRows(params, qr), params.seq.maxQLen) << problem.describe() << " not split";
        ASSERT_EQ(attnopsSetDeviceThreads(0, 2), ATTNOPS_SUCCESS);
        FaInstance inst(problem);
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        for (const char* impl : {"", "amx-fused", "avx512-bf16-fused", "avx512-fused", "avx2-fused", "amx-emulated-fused"}) {
            ForcedImpl forced(impl);
            std::vector<FaGrads> runs;
            bool unsupported = false;
            for (const int32_t threads : {1, 2, 3, 7}) {
                ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                runs.push_back(attnops::tools::makeGrads(inst));
                poison(runs.back());
                const attnopsStatus st = attnops::tools::runBackward(inst, runs.back());
                // (avx512-bf16-fused takes bf16 problems only, the AMX ones 16-bit problems
                // without pse, explicit mask or dropout.)
                const bool declines = attnops::testsupport::isAmxFused(impl)
                                          ? attnops::testsupport::amxFusedDeclines(impl, inst)
                                          : problem.dtype != BF16;
                if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE || (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && declines)) {
                    unsupported = true;
                    break;
                }
                ASSERT_EQ(st, ATTNOPS_SUCCESS) << impl << " " << problem.describe() << ": " << attnopsGetLastErrorMessage();
            }
            if (unsupported) continue;
            ++ran;
            const attnops::tools::GradCheck rc = attnops::tools::checkBackward(inst, runs[0]);
            EXPECT_TRUE(rc.passed) << impl << " " << problem.describe() << ": " << rc.failure;
            for (size_t r = 1; r < runs.size(); ++r)
                expectSameBytes(runs[0], runs[r], std::string(impl) + " " + problem.describe() + " run " + std::to_string(r));
        }
    }
    EXPECT_GT(ran, 0);
}

}  // namespace
