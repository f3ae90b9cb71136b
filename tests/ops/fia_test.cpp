// FusedInferAttentionScore: results against the double reference under the tolerance rule on
// every layout, GQA ratio, sparse mode, actual-length pattern, paged cache format and int8
// dequantisation mode; every implementation this CPU runs, forced, on the same problems; key
// splits of long decode contexts around their edges; paged equals contiguous bit for bit;
// determinism across thread counts; and bad input giving the right status and a message naming
// the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fia_plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::testing::paged;
using attnops::testing::withMode;
using attnops::testing::Outcome;
using attnops::testing::expectRejected;
using attnops::testing::planWith;

namespace {

FiaProblem decode(const std::string& layout, int64_t batch, int64_t kvSeqLen, int64_t heads, int64_t kvHeads, int64_t dim) {
    FiaProblem p;
    p.layout = layout;
    p.batch = batch;
    p.qSeqLen = 1;
    p.kvSeqLen = kvSeqLen;
    p.heads = heads;
    p.kvHeads = kvHeads;
    p.dim = dim;
    return p;
}

FiaProblem prefill(const std::string& layout, int64_t batch, int64_t qSeqLen, int64_t kvSeqLen, int64_t heads, int64_t kvHeads,
                   int64_t dim) {
    FiaProblem p = decode(layout, batch, kvSeqLen, heads, kvHeads, dim);
    p.qSeqLen = qSeqLen;
    return p;
}

FiaProblem tnd(std::vector<int64_t> qLens, std::vector<int64_t> kvLens, int64_t heads, int64_t kvHeads, int64_t dim) {
    return attnops::testing::fiaPacked("TND", std::move(qLens), std::move(kvLens), heads, kvHeads, dim);
}

// Runs the problem and checks every row against the reference.
void expectMatches(const FiaProblem& p) {
    SCOPED_TRACE(p.describe());
    FiaInstance inst(p);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const FiaCheck r = checkFia(inst);
    EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance "
                          << r.tolerance << ", lse error " << r.maxLseError << ")";
    EXPECT_GT(r.rows + r.emptyRows, 0);
}

std::vector<uint8_t> runBytes(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    std::vector<uint8_t> bytes = inst.attentionOut.bytes();
    if (!inst.softmaxLse.empty()) bytes.insert(bytes.end(), inst.softmaxLse.bytes().begin(), inst.softmaxLse.bytes().end());
    return bytes;
}



}  // namespace

TEST(FiaLayouts, DecodeAndPrefillOnEveryLayout) {
    for (const char* layout : {"BSH", "BSND", "BNSD"}) {
        expectMatches(decode(layout, 3, 70, 4, 2, 32));
        expectMatches(prefill(layout, 2, 33, 65, 4, 4, 16));
    }
    expectMatches(tnd({5, 1, 17}, {9, 64, 17}, 4, 2, 32));
}

TEST(FiaLayouts, Bf16AndHeadDims) {
    FiaProblem p = prefill("BSND", 1, 9, 40, 2, 1, 128);
    p.dtype = ATTNOPS_BFLOAT16;
    expectMatches(p);
    p = decode("BNSD", 2, 130, 2, 2, 8);
    p.dtype = ATTNOPS_BFLOAT16;
    expectMatches(p);
    p = prefill("BSH", 1, 6, 12, 2, 1, 32);
    p.vDim = 16;  // Dv < D
    expectMatches(p);
}

TEST(FiaGqa, AnyRatio) {
    for (auto [n1, n2] : {std::pair<int64_t, int64_t>{3, 3}, {6, 2}, {8, 1}, {5, 1}, {12, 4}}) {
        expectMatches(decode("BSND", 2, 45, n1, n2, 16));
        expectMatches(prefill("BNSD", 1, 20, 31, n1, n2, 16));
    }
}

TEST(FiaSparse, ModesZeroToFour) {
    for (const char* layout : {"BSH", "BNSD"}) {
        for (auto [sq, skv] : {std::pair<int64_t, int64_t>{17, 40}, {40, 17}, {24, 24}}) {
            const FiaProblem base = prefill(layout, 2, sq, skv, 4, 2, 16);
            expectMatches(withMode(base, 0));  // no mask: full attention
            FiaProblem masked = withMode(base, 0, 5, 3);
            masked.maskKind = "random";  // explicit mask and the top-left band
            expectMatches(masked);
            expectMatches(withMode(base, 1));
            expectMatches(withMode(base, 2));
            expectMatches(withMode(base, 3));  // sq > skv: the first rows attend nothing
            expectMatches(withMode(base, 4, 6, 0));
            expectMatches(withMode(base, 4, 3, 2));
            expectMatches(withMode(base, 4, -2, 7));
        }
    }
}

TEST(FiaSparse, TndCausalAndBand) {
    const FiaProblem base = tnd({7, 0, 1, 20}, {7, 5, 33, 20}, 4, 1, 16);
    expectMatches(withMode(base, 0));
    expectMatches(withMode(base, 3));
    expectMatches(withMode(base, 4, 4, 0));
    expectMatches(withMode(base, 4, 2, 3));
}

TEST(FiaSparse, DecodeIgnoresModeAndTakesAMask) {
    FiaProblem p = withMode(decode("BSH", 3, 50, 4, 2, 16), 3, 1, 0);  // ignored with Q_S = 1
    expectMatches(p);
    p.maskKind = "random";
    expectMatches(p);
}

TEST(FiaLengths, ActualLengthsIncludingZeroAndOne) {
    FiaProblem p = prefill("BSND", 4, 12, 30, 2, 1, 16);
    p.qLens = {12, 0, 1, 5};
    p.kvLens = {30, 7, 0, 1};
    expectMatches(p);
    expectMatches(withMode(p, 3));
    p.qLens = {3};  // one entry broadcasts
    p.kvLens = {17, 1, 30, 2, 99};  // more entries than batches: the first B
    expectMatches(withMode(p, 2));
    FiaProblem d = decode("BNSD", 3, 40, 4, 4, 16);
    d.qLens = {0, 0, 0};  // ignored on the decode branch
    d.kvLens = {0, 1, 40};
    expectMatches(d);
    FiaProblem t = tnd({0, 3, 0, 1}, {4, 0, 0, 9}, 2, 2, 16);
    t.extraQRows = 3;  // rows beyond the last cumulative end are written 0
    t.extraKvRows = 2;
    expectMatches(t);
    expectMatches(withMode(t, 3));
}

TEST(FiaPaged, EveryCacheFormatAroundBlockEdges) {
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
        for (int64_t bs : {16, 128}) {
            FiaProblem d = paged(decode("BNSD", 4, 0, 4, 2, 32), cache, bs);
            d.kvLens = {1, bs - 1, bs, 2 * bs + 3};
            expectMatches(d);
            FiaProblem t = paged(withMode(tnd({3, 1, 9}, {bs + 5, 2, 9}, 4, 2, 32), 3), cache, bs);
            expectMatches(t);
        }
        FiaProblem pre = paged(withMode(prefill("BSH", 2, 20, 0, 2, 1, 16), 3), cache, 16);
        pre.kvLens = {40, 20};
        expectMatches(pre);
    }
}

TEST(FiaPaged, PagedEqualsContiguousBitwise) {
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
        FiaProblem c = decode("BNSD", 3, 0, 4, 2, 32);
        c.kvLens = {5, 16, 37};
        c.kvSeqLen = 48;
        FiaProblem p = paged(c, cache, 16);
        p.maxBlocksPerSeq = 3;
        c.kvLens = {5, 16, 37};
        EXPECT_EQ(runBytes(c), runBytes(p)) << cache;
        FiaProblem tc = withMode(tnd({2, 6}, {20, 6}, 4, 1, 16), 3);
        EXPECT_EQ(runBytes(tc), runBytes(paged(tc, cache, 16))) << cache;
    }
}

TEST(FiaAntiquant, Int8PerChannelAndPerToken) {
    for (auto [km, vm] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {0, 1}}) {
        for (bool offset : {true, false}) {
            FiaProblem p = decode("BSND", 2, 50, 4, 2, 32);
            p.int8Kv = true;
            p.keyQuantMode = km;
            p.valueQuantMode = vm;
            p.quantOffset = offset;
            expectMatches(p);
            p.dtype = ATTNOPS_BFLOAT16;
            expectMatches(paged(p, "BnNBsD", 32));
            expectMatches(paged(p, "NZ", 32));
        }
    }
    FiaProblem pre = prefill("BNSD", 1, 9, 33, 2, 1, 32);
    pre.int8Kv = true;
    expectMatches(withMode(pre, 3));
    FiaProblem t = withMode(tnd({2, 5}, {40, 5}, 4, 2, 32), 3);
    t.int8Kv = true;
    t.keyQuantMode = t.valueQuantMode = 1;
    expectMatches(t);
    expectMatches(paged(t, "BnBsH", 32));
}

TEST(FiaSink, LearnableSink) {
    FiaProblem p = decode("BSH", 2, 20, 4, 2, 16);
    p.sink = true;
    expectMatches(p);
    FiaProblem t = withMode(tnd({4, 6}, {4, 30}, 4, 4, 16), 3);
    t.sink = true;
    expectMatches(t);
}

TEST(FiaDeterminism, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    const FiaProblem problems[] = {paged(withMode(tnd({33, 1, 70}, {40, 90, 70}, 8, 2, 32), 3), "BnBsH", 16),
                                   decode("BSND", 5, 300, 8, 1, 64)};
    for (const FiaProblem& p : problems) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
        const std::vector<uint8_t> one = runBytes(p);
        for (int32_t threads : {2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
            EXPECT_EQ(runBytes(p), one) << threads << " threads: " << p.describe();
        }
    }
}

TEST(FiaCheck, BlockTableEntriesThatAreRead) {
    FiaProblem p = paged(decode("BNSD", 2, 0, 2, 2, 16), "BnBsH", 16);
    p.kvLens = {20, 5};
    FiaInstance inst(p);
    auto* table = static_cast<int32_t*>(inst.blockTable.data());
    const int64_t cols = inst.blockTable.shape()[1], blockNum = inst.key.shape()[0];
    const int32_t saved = table[1];
    table[1] = int32_t(blockNum);  // batch 0 reads two blocks
    expectRejected(planWith(inst, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "blockTable[0][1] = ");
    table[1] = -3;
    expectRejected(planWith(inst, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "blockTable[0][1] = -3");
    table[1] = saved;
    table[cols + 1] = 12345;  // batch 1 reads one block: entry 1 is never read
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_TRUE(checkFia(inst).passed);
    expectRejected(planWith(inst, [](fia::Args& a) { a.actualSeqLengthsKv = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT,
                   "actualSeqLengthsKv = NULL");
    expectRejected(planWith(inst, [](fia::Args& a) { a.blockSize = 32; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "blockSize = 32");
}

TEST(FiaCheck, InconsistentLengths) {
    FiaProblem p = prefill("BSND", 3, 8, 10, 2, 2, 16);
    p.kvLens = {10, 11, 3};
    FiaInstance inst(p);
    expectRejected(planWith(inst, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "actualSeqLengthsKv[1] = 11");
    p.kvLens = {10, 3};
    expectRejected(planWith(FiaInstance(p), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "actualSeqLengthsKv.size = 2");
    FiaProblem t = tnd({3, 5}, {4, 4}, 2, 2, 16);
    FiaInstance ti(t);
    ti.qLensArg = {3, 2};  // decreasing cumulative ends
    expectRejected(planWith(ti, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "actualSeqLengths[1] = 2");
    ti.qLensArg = {3, 8};
    ti.kvLensArg = {4};
    expectRejected(planWith(ti, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "actualSeqLengthsKv.size = 1");
    ti.kvLensArg = {4, 9};
    expectRejected(planWith(ti, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "exceeds T_kv = 8");
}

TEST(FiaCheck, MismatchedShapesAndModes) {
    FiaInstance inst(prefill("BNSD", 2, 8, 10, 4, 2, 16));
    expectRejected(planWith(inst, [](fia::Args& a) { a.numKeyValueHeads = 3; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "numKeyValueHeads = 3");
    expectRejected(planWith(inst, [](fia::Args& a) { a.numKeyValueHeads = 4; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "key.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.inputLayout = "BSND"; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "query.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.inputLayout = "bnsd"; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "inputLayout");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.attentionOut = inst.key.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.sparseMode = 2; }), ATTNOPS_ERROR_NULL_ARGUMENT, "attenMask = NULL");
    expectRejected(planWith(inst, [](fia::Args& a) { a.sparseMode = 6; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "sparseMode = 6");
    expectRejected(planWith(inst, [](fia::Args& a) { a.sparseMode = 9; }), ATTNOPS_ERROR_NULL_ARGUMENT, "sparseMode 9");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.pseShift = inst.key.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "pseShift.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.keyCount = a.valueCount = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "one batch: B must be 1");
    expectRejected(planWith(inst, [](fia::Args& a) { a.softmaxLse = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "softmaxLse = NULL");
    FiaProblem masked = withMode(prefill("BSH", 2, 8, 10, 2, 2, 16), 1);
    FiaInstance mi(masked);
    expectRejected(planWith(mi, [&](fia::Args& a) { a.attenMask = mi.query.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attenMask.dtype");
    expectRejected(planWith(mi, [](fia::Args& a) { a.sparseMode = 0, a.preTokens = -5, a.nextTokens = 2; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "preTokens + nextTokens");
    FiaProblem t = withMode(tnd({3}, {3}, 2, 2, 16), 3);
    FiaInstance tm(t);
    expectRejected(planWith(tm, [](fia::Args& a) { a.sparseMode = 1; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "with inputLayout TND");
}

TEST(FiaCheck, TheComparisonCatchesAWrongElement) {
    FiaProblem p = prefill("BSND", 2, 5, 9, 2, 1, 16);
    p.qLens = {5, 3};
    FiaInstance inst(p);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_NE(lastImplementation(), "reference");  // the comparison is not checking the oracle against itself
    ASSERT_TRUE(checkFia(inst).passed);
    const int64_t computed = 7, padding = ((1 * 5 + 4) * 2 + 1) * 16;  // (b 1, row 4, head 1): beyond qLens[1]
    const float saved = inst.attentionOut.get(computed);
    inst.attentionOut.set(computed, saved + 0.01f);
    EXPECT_FALSE(checkFia(inst).passed);
    inst.attentionOut.set(computed, saved);
    inst.attentionOut.set(padding, 1e-3f);
    EXPECT_FALSE(checkFia(inst).passed);
}

TEST(FiaCheck, QuantSinkAndAttributeRules) {
    FiaProblem q = decode("BSND", 2, 50, 4, 2, 32);
    q.int8Kv = true;
    FiaInstance qi(q);
    expectRejected(planWith(qi, [](fia::Args& a) { a.keyAntiquantScale = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT,
                   "keyAntiquantScale = NULL");
    expectRejected(planWith(qi, [](fia::Args& a) { a.keyAntiquantMode = 1; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantMode/valueAntiquantMode = 1/0");
    expectRejected(planWith(qi, [](fia::Args& a) { a.keyAntiquantMode = 3; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantMode/valueAntiquantMode = 3/0");
    expectRejected(planWith(qi, [&](fia::Args& a) { a.valueAntiquantOffset = qi.query.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "valueAntiquantOffset.shape");
    FiaInstance fi(decode("BSH", 2, 10, 4, 2, 16));
    expectRejected(planWith(fi, [&](fia::Args& a) { a.keyAntiquantScale = fi.query.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantScale = non-NULL");
    expectRejected(planWith(fi, [&](fia::Args& a) { a.learnableSink = fi.query.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "learnableSink.shape");
    expectRejected(planWith(fi, [](fia::Args& a) { a.innerPrecise = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "innerPrecise = 2");
    expectRejected(planWith(fi, [](fia::Args& a) { a.queryQuantMode = 3; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "queryQuantMode = 3");  // 3 is MLA full quantisation: an int8 query only
    expectRejected(planWith(fi, [](fia::Args& a) { a.queryQuantMode = 6; }), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION,
                   "queryQuantMode = 6");
    FiaInstance ti(withMode(tnd({3}, {3}, 2, 2, 16), 4, -5, 10));
    expectRejected(planWith(ti, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "preTokens/nextTokens = -5/10");
}

// ---------------------------------------------------------------- implementations and key splits

namespace {

using attnops::fia::kSplitKeys;
using attnops::testsupport::ForcedImpl;

// Every entry of the implementation list, fastest first.
const char* const kImplementations[] = {"avx512", "avx2", "tiled-generic", "reference"};

// Problems every implementation must get right: each cache format and source dtype, int8 modes,
// masks, sinks, decode contexts cut into several key splits, MTP-style TND rows.
std::vector<FiaProblem> implementationProblems() {
    std::vector<FiaProblem> ps;
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
        FiaProblem p = paged(decode("BNSD", 3, 0, 8, 2, 64), cache, 128);
        p.dtype = ATTNOPS_BFLOAT16;
        p.kvLens = {kSplitKeys + 130, 1, 2 * kSplitKeys};
        ps.push_back(p);
        p.int8Kv = true;
        p.kvLens = {kSplitKeys - 1, 0, 300};
        ps.push_back(p);
    }
    for (auto [km, vm] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {0, 1}}) {
        FiaProblem p = decode("BSND", 2, kSplitKeys + 77, 4, 1, 32);
        p.int8Kv = true;
        p.keyQuantMode = km;
        p.valueQuantMode = vm;
        ps.push_back(p);
    }
    FiaProblem masked = decode("BSH", 2, kSplitKeys + 40, 4, 2, 16);
    masked.maskKind = "random";
    masked.sink = true;
    ps.push_back(masked);
    ps.push_back(paged(withMode(tnd({3, 1, 16}, {kSplitKeys + 500, 1, 40}, 8, 2, 32), 3), "BnNBsD", 64));
    ps.push_back(withMode(prefill("BNSD", 2, 70, 90, 4, 2, 64), 3));
    ps.push_back(decode("BNSD", 2, 50, 2, 2, 8));  // D = 8: below one AVX-512 vector
    return ps;
}

// The implementations that run here and accept p, each forced: its status is SUCCESS, or
// UNSUPPORTED_HARDWARE (not this CPU), or UNSUPPORTED_CONFIGURATION for a vector kernel whose
// vectors do not divide the head dim.
void expectEveryImplementation(const FiaProblem& p, int& ran) {
    for (const char* impl : kImplementations) {
        SCOPED_TRACE(impl);
        FiaInstance inst(p);
        attnopsStatus st;
        {
            ForcedImpl force(impl);
            st = inst.run();
        }
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        const int64_t lanes = std::string(impl) == "avx512" ? 16 : std::string(impl) == "avx2" ? 8 : 1;
        if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && p.dim % lanes != 0) continue;
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(lastImplementation(), impl);
        ++ran;
        const FiaCheck r = checkFia(inst);
        EXPECT_TRUE(r.passed) << p.describe() << ": " << r.firstFailure << " (error " << r.maxAbsError << ", tolerance "
                              << r.tolerance << ", lse error " << r.maxLseError << ")";
    }
}

}  // namespace

TEST(FiaImplementations, EachAvailableImplementationMatchesReference) {
    int ran = 0;
    const std::vector<FiaProblem> problems = implementationProblems();
    for (const FiaProblem& p : problems) expectEveryImplementation(p, ran);
    EXPECT_GE(ran, 2 * int(problems.size()));  // at least tiled-generic and reference ran every problem
}

TEST(FiaImplementations, UnknownForcedNameIsAnError) {
    ForcedImpl force("tiled-nonexistent");
    FiaInstance inst(decode("BNSD", 1, 8, 2, 2, 16));
    EXPECT_EQ(inst.run(), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("tiled-nonexistent"), std::string::npos);
}

// Split edges: contexts of one key, just below, at and just above one and two splits, on and
// beside page boundaries; empty batches (length 0) between long ones.
TEST(FiaSplits, ContextLengthsAroundSplitAndPageEdges) {
    int ran = 0;
    for (int64_t bs : {16, 128}) {
        FiaProblem p = paged(decode("BNSD", 8, 0, 4, 1, 32), "BnBsH", bs);
        p.dtype = ATTNOPS_BFLOAT16;
        p.kvLens = {1, 0, kSplitKeys - 1, kSplitKeys, kSplitKeys + 1, 0, 2 * kSplitKeys - bs, 2 * kSplitKeys + bs + 1};
        expectEveryImplementation(p, ran);
    }
    FiaProblem empty = decode("BSND", 3, kSplitKeys + 8, 4, 2, 16);
    empty.kvLens = {0, 0, 0};  // every batch empty: output 0, lse +inf
    expectEveryImplementation(empty, ran);
    FiaProblem mtp = withMode(tnd({0, 2, 1}, {kSplitKeys + 3, 2 * kSplitKeys + 1, 0}, 4, 2, 16), 3);
    expectEveryImplementation(mtp, ran);
    EXPECT_GT(ran, 0);
}

// The same bits for 1, 2 and 3 worker threads with every implementation: key splits are cut from
// the lengths alone and merged in their fixed order.
TEST(FiaDeterminism, SplitKeysSameBitsForAnyThreadCountAndImplementation) {
    testsupport::ThreadsGuard guard;
    FiaProblem bf = paged(decode("BNSD", 3, 0, 8, 2, 64), "BnNBsD", 128);
    bf.dtype = ATTNOPS_BFLOAT16;
    bf.kvLens = {3 * kSplitKeys + 5, 17, kSplitKeys};
    FiaProblem i8 = paged(decode("BSND", 2, 0, 4, 1, 32), "NZ", 32);
    i8.int8Kv = true;
    i8.keyQuantMode = 0;
    i8.valueQuantMode = 1;
    i8.kvLens = {2 * kSplitKeys + 31, kSplitKeys - 3};
    FiaProblem single = decode("BSH", 1, 4 * kSplitKeys, 4, 4, 16);  // one request: parallel only by splits
    single.sink = true;
    for (const char* impl : kImplementations)
        for (const FiaProblem& p : {bf, i8, single}) {
            SCOPED_TRACE(std::string(impl) + " " + p.describe());
            ForcedImpl force(impl);
            ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
            FiaInstance first(p);
            const attnopsStatus st = first.run();
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            const std::vector<uint8_t> one = runBytes(p);
            for (int32_t threads : {2, 3}) {
                ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                EXPECT_EQ(runBytes(p), one) << threads << " threads";
            }
        }
}

// ---------------------------------------------------------------- the other entry points
// FusedInferAttentionScore V1-V3, PromptFlashAttention V1-V3 and IncreFlashAttention V1-V4 map their
// arguments onto V4's (one core): each must give V4's bits on the calls it can express.

namespace {

using Phase2 = attnopsStatus (*)(void*, uint64_t, attnopsExecutor*, attnopsStream*);

// attentionOut of the problem planned by `plan` (given the V4 arguments) and run by `phase2`.
template <typename Plan>
std::vector<uint8_t> outputVia(const FiaProblem& p, Plan&& plan, Phase2 phase2) {
    FiaInstance inst(p);
    const FiaArrays arrays(inst);
    const attnopsTensor* kv[2];
    const fia::Args a = fiaArgs(inst, arrays, kv);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = plan(a, &ws, &exec);
    EXPECT_EQ(launchAndWait(st, ws, exec, phase2, nullptr), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    return inst.attentionOut.bytes();
}

std::vector<uint8_t> outputV4(FiaProblem p) {
    p.lse = false;
    std::vector<uint8_t> bytes = runBytes(p);
    EXPECT_TRUE(std::any_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b != 0; })) << "an all-zero output compares nothing";
    return bytes;
}

auto fiaV1 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsFusedInferAttentionScoreGetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengths, a.actualSeqLengthsKv,
        a.deqScale1, a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale, a.antiquantOffset,
        a.blockTable, a.queryPaddingSize, a.kvPaddingSize, a.numHeads, a.scaleValue, a.preTokens, a.nextTokens, a.inputLayout,
        a.numKeyValueHeads, a.sparseMode, a.innerPrecise, a.blockSize, a.antiquantMode, false, a.attentionOut, nullptr, ws, e);
};
auto fiaV2 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsFusedInferAttentionScoreV2GetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengths, a.actualSeqLengthsKv,
        a.deqScale1, a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale, a.antiquantOffset,
        a.blockTable, a.queryPaddingSize, a.kvPaddingSize, a.keyAntiquantScale, a.keyAntiquantOffset, a.valueAntiquantScale,
        a.valueAntiquantOffset, a.keySharedPrefix, a.valueSharedPrefix, a.actualSharedPrefixLen, a.numHeads, a.scaleValue,
        a.preTokens, a.nextTokens, a.inputLayout, a.numKeyValueHeads, a.sparseMode, a.innerPrecise, a.blockSize,
        a.antiquantMode, false, a.keyAntiquantMode, a.valueAntiquantMode, a.attentionOut, nullptr, ws, e);
};
auto fiaV3 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsFusedInferAttentionScoreV3GetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengths, a.actualSeqLengthsKv,
        a.deqScale1, a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale, a.antiquantOffset,
        a.blockTable, a.queryPaddingSize, a.kvPaddingSize, a.keyAntiquantScale, a.keyAntiquantOffset, a.valueAntiquantScale,
        a.valueAntiquantOffset, a.keySharedPrefix, a.valueSharedPrefix, a.actualSharedPrefixLen, a.queryRope, a.keyRope,
        a.keyRopeAntiquantScale, a.numHeads, a.scaleValue, a.preTokens, a.nextTokens, a.inputLayout, a.numKeyValueHeads,
        a.sparseMode, a.innerPrecise, a.blockSize, a.antiquantMode, false, a.keyAntiquantMode, a.valueAntiquantMode,
        a.attentionOut, nullptr, ws, e);
};
auto pfaV1 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsPromptFlashAttentionGetWorkspaceSize(a.query, a.key[0], a.value[0], a.pseShift, a.attenMask, a.actualSeqLengths,
                                                       a.numHeads, a.scaleValue, a.preTokens, a.nextTokens, a.inputLayout,
                                                       a.numKeyValueHeads, a.attentionOut, ws, e);
};
auto pfaV2 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsPromptFlashAttentionV2GetWorkspaceSize(
        a.query, a.key[0], a.value[0], a.pseShift, a.attenMask, a.actualSeqLengths, a.actualSeqLengthsKv, a.deqScale1,
        a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.numHeads, a.scaleValue, a.preTokens, a.nextTokens,
        a.inputLayout, a.numKeyValueHeads, a.sparseMode, a.attentionOut, ws, e);
};
auto pfaV3 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsPromptFlashAttentionV3GetWorkspaceSize(
        a.query, a.key[0], a.value[0], a.pseShift, a.attenMask, a.actualSeqLengths, a.actualSeqLengthsKv, a.deqScale1,
        a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.numHeads, a.scaleValue, a.preTokens, a.nextTokens,
        a.inputLayout, a.numKeyValueHeads, a.sparseMode, 2, a.attentionOut, ws, e);
};
// IncreFlashAttention: its actualSeqLengths are the KV lengths.
auto ifaV1 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsIncreFlashAttentionGetWorkspaceSize(a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask,
                                                      a.actualSeqLengthsKv, a.numHeads, a.scaleValue, a.inputLayout,
                                                      a.numKeyValueHeads, a.attentionOut, ws, e);
};
auto ifaV2 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsIncreFlashAttentionV2GetWorkspaceSize(a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift,
                                                        a.attenMask, a.actualSeqLengthsKv, a.deqScale1, a.quantScale1,
                                                        a.deqScale2, a.quantScale2, a.quantOffset2, a.numHeads, a.scaleValue,
                                                        a.inputLayout, a.numKeyValueHeads, a.attentionOut, ws, e);
};
auto ifaV3 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsIncreFlashAttentionV3GetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengthsKv, a.deqScale1,
        a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale, a.antiquantOffset, a.blockTable,
        a.numHeads, a.scaleValue, a.inputLayout, a.numKeyValueHeads, a.blockSize, 1, a.attentionOut, ws, e);
};
auto ifaV4 = [](const fia::Args& a, uint64_t* ws, attnopsExecutor** e) {
    return attnopsIncreFlashAttentionV4GetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengthsKv, a.deqScale1,
        a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale, a.antiquantOffset, a.blockTable,
        a.kvPaddingSize, a.numHeads, a.scaleValue, a.inputLayout, a.numKeyValueHeads, a.blockSize, 0, a.attentionOut, ws, e);
};

}  // namespace

TEST(FiaEntryPoints, FusedInferAttentionScoreV1ToV3GiveV4sBits) {
    FiaProblem tndBand = withMode(tnd({5, 0, 33}, {9, 4, 40}, 8, 2, 64), 4, 7, 3);
    for (const FiaProblem& p : {withMode(prefill("BSH", 2, 37, 41, 8, 2, 64), 3), paged(decode("BNSD", 3, 70, 8, 1, 128), "NZ", 32),
                                tndBand}) {
        SCOPED_TRACE(p.describe());
        const std::vector<uint8_t> want = outputV4(p);
        FiaProblem noLse = p;
        noLse.lse = false;
        EXPECT_TRUE(outputVia(noLse, fiaV1, attnopsFusedInferAttentionScore) == want);
        EXPECT_TRUE(outputVia(noLse, fiaV2, attnopsFusedInferAttentionScoreV2) == want);
        EXPECT_TRUE(outputVia(noLse, fiaV3, attnopsFusedInferAttentionScoreV3) == want);
    }
}

TEST(FiaEntryPoints, PromptFlashAttentionGivesV4sBits) {
    FiaProblem plain = prefill("BSND", 2, 19, 23, 4, 4, 64);  // no mask, mode 0: what V1 expresses
    plain.lse = false;
    for (const FiaProblem& p : {plain, withMode(plain, 0, 5, 0)}) {
        SCOPED_TRACE(p.describe());
        EXPECT_TRUE(outputVia(p, pfaV1, attnopsPromptFlashAttention) == outputV4(p));
    }
    FiaProblem lengths = withMode(prefill("BNSD", 3, 33, 40, 8, 2, 64), 3);
    lengths.qLens = {33, 1, 20};
    lengths.kvLens = {40, 7, 0};
    lengths.lse = false;
    for (const FiaProblem& p : {lengths, withMode(tnd({17, 3}, {17, 30}, 4, 2, 128), 3)}) {
        SCOPED_TRACE(p.describe());
        FiaProblem q = p;
        q.lse = false;
        const std::vector<uint8_t> want = outputV4(q);
        EXPECT_TRUE(outputVia(q, pfaV2, attnopsPromptFlashAttentionV2) == want);
        EXPECT_TRUE(outputVia(q, pfaV3, attnopsPromptFlashAttentionV3) == want);
    }
}

TEST(FiaEntryPoints, IncreFlashAttentionGivesV4sBits) {
    FiaProblem contiguous = decode("BSH", 3, 50, 8, 2, 64);
    contiguous.kvLens = {50, 1, 17};
    contiguous.lse = false;
    EXPECT_TRUE(outputVia(contiguous, ifaV1, attnopsIncreFlashAttention) == outputV4(contiguous));
    EXPECT_TRUE(outputVia(contiguous, ifaV2, attnopsIncreFlashAttentionV2) == outputV4(contiguous));
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
        FiaProblem p = paged(decode("BNSD", 2, 100, 16, 2, 128), cache, 32);
        p.kvLens = {100, 33};
        p.lse = false;
        SCOPED_TRACE(p.describe());
        const std::vector<uint8_t> want = outputV4(p);
        EXPECT_TRUE(outputVia(p, ifaV3, attnopsIncreFlashAttentionV3) == want);
        EXPECT_TRUE(outputVia(p, ifaV4, attnopsIncreFlashAttentionV4) == want);
    }
}

TEST(FiaEntryPoints, IncreFlashAttentionRulesAndNames) {
    const auto planIfa = [](const FiaProblem& p, auto&& edit) {
        FiaInstance inst(p);
        const FiaArrays arrays(inst);
        const attnopsTensor* kv[2];
        fia::Args a = fiaArgs(inst, arrays, kv);
        edit(a);
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        const attnopsStatus st = ifaV4(a, &ws, &exec);
        Outcome o{st, attnopsGetLastErrorMessage()};
        if (st == ATTNOPS_SUCCESS) attnopsDestroyExecutor(exec);
        return o;
    };
    expectRejected(planIfa(prefill("BSH", 1, 2, 8, 4, 4, 64), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "IncreFlashAttention decodes one token: the query's S must be 1, not 2");
    expectRejected(planIfa(tnd({1, 1}, {4, 5}, 4, 4, 64), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "IncreFlashAttention takes BSH, BSND or BNSD");
    FiaProblem p = paged(decode("BNSD", 2, 64, 4, 2, 64), "BnNBsD", 16);
    p.kvLens = {64, 3};
    expectRejected(planIfa(p, [](fia::Args& a) { a.actualSeqLengthsKv = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT,
                   "actualSeqLengths = NULL: is required with a paged cache");
    const Outcome fine = planIfa(p, [](fia::Args&) {});
    EXPECT_EQ(fine.status, ATTNOPS_SUCCESS) << fine.message;
}
