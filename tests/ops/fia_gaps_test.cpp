// FusedInferAttentionScore combinations taken since session 8 (issue 14): tensor-list key/value
// holding int4 (int32 containers of eight, each tensor its own S), MLA with the NTD and
// output-transposing layouts its two forms allow (decode D 512: *_NBSD, TND_NTD; prefill D 128:
// NTD, NTD_TND, the batched layouts, *_BNSD, BNSD_BSND), and MLA with tensor lists refused with
// the rule. Each case is checked against the double reference on every implementation that takes
// it and, independently of the addressing code that reference shares with the kernels, against a
// plain call holding the same logical values (one batched tensor, the TND or BSND layout); the
// same bits for 1, 2 and 3 threads; bad input gives the right status and message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "fia_plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "ops/fused_infer_attention_score/check.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::fia::kSplitKeys;
using attnops::testing::expectFiaMatchesReference;
using attnops::testing::expectRejected;
using attnops::testing::expectVectorKernel;
using attnops::testing::fiaPacked;
using attnops::testing::fiaProblem;
using attnops::testing::mlaDecode;
using attnops::testing::planWith;

namespace {

const char* const kVectorImplementations[] = {"avx512", "avx2"};

// Decode on a tensor list of int4 key/value: batch b's tensor holds kvListRows(b) rows.
FiaProblem int4List(const std::string& layout, std::vector<int64_t> kvLens, int64_t heads, int64_t kvHeads, int64_t dim,
                    int64_t keyMode, int64_t valueMode) {
    FiaProblem p = fiaProblem(layout, int64_t(kvLens.size()), 1, 0, heads, kvHeads, dim);
    for (int64_t len : kvLens) p.kvSeqLen = std::max(p.kvSeqLen, len);
    p.kvLens = std::move(kvLens);
    p.kvList = true;
    p.int4Kv = true;
    p.keyQuantMode = keyMode;
    p.valueQuantMode = valueMode;
    p.quantOffset = keyMode != 1;
    return p;
}

// Prefill MLA: Q_N = KV_N, D 128 + rope 64, bf16, not paged (packed layouts: qLens/kvLens per
// sequence; batched ones: batch x qS against kvS).
FiaProblem mlaPrefill(const std::string& layout, std::vector<int64_t> qLens, std::vector<int64_t> kvLens, int64_t heads) {
    FiaProblem p = fiaPacked(layout, std::move(qLens), std::move(kvLens), heads, heads, 128);
    p.ropeDim = 64;
    p.dtype = ATTNOPS_BFLOAT16;
    p.scale = 1.0 / std::sqrt(128.0 + 64.0);
    return p;
}

FiaProblem mlaPrefillBatched(const std::string& layout, int64_t batch, int64_t qS, int64_t kvS, int64_t heads) {
    FiaProblem p = fiaProblem(layout, batch, qS, kvS, heads, heads, 128);
    p.ropeDim = 64;
    p.dtype = ATTNOPS_BFLOAT16;
    p.scale = 1.0 / std::sqrt(128.0 + 64.0);
    return p;
}

FiaProblem withLayout(FiaProblem p, const std::string& layout) {
    p.layout = layout;
    return p;
}

FiaInstance runDefault(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << p.describe() << ": " << attnopsGetLastErrorMessage();
    return inst;
}

// Whether this CPU runs the implementation `impl` (the vector kernels need their instructions).
bool supported(const char* impl) {
    testsupport::ForcedImpl force(impl);
    FiaInstance inst(int4List("BSND", {8}, 2, 2, 64, 0, 0));
    return inst.run() != ATTNOPS_ERROR_UNSUPPORTED_HARDWARE;
}

FiaInstance runForced(const char* impl, const FiaProblem& p) {
    testsupport::ForcedImpl force(impl);
    return runDefault(p);
}

// Every output element (b, n, row, c) of `got` equals `want`'s, read through each call's own
// output view (any layout), bitwise; and so does every softmaxLse value. The two calls hold the
// same logical problem.
void expectSameLogicalOutput(const FiaInstance& got, const FiaInstance& want) {
    SCOPED_TRACE(got.problem.describe() + " against " + want.problem.describe());
    const FiaArrays ga(got), wa(want);
    const attnopsTensor *gkv[2], *wkv[2];
    const fia::Params g = fia::checkForward(fiaArgs(got, ga, gkv), 0), w = fia::checkForward(fiaArgs(want, wa, wkv), 0);
    ASSERT_EQ(g.core.seq.count, w.core.seq.count);
    ASSERT_EQ(g.core.out.dtype, w.core.out.dtype);
    int64_t compared = 0;
    for (int64_t b = 0; b < g.core.seq.count; ++b) {
        ASSERT_EQ(g.core.seq.qLen[size_t(b)], w.core.seq.qLen[size_t(b)]) << "batch " << b;
        for (int64_t n = 0; n < g.core.n1; ++n)
            for (int64_t i = 0; i < g.core.seq.qLen[size_t(b)]; ++i) {
                const int64_t gr = g.core.seq.qStart[size_t(b)] + i, wr = w.core.seq.qStart[size_t(b)] + i;
                for (int64_t c = 0; c < g.core.dv; ++c) {
                    const float x = loadAsFloat(g.core.out.data, g.core.out.offset(b, n, gr, c), g.core.out.dtype);
                    const float y = loadAsFloat(w.core.out.data, w.core.out.offset(b, n, wr, c), w.core.out.dtype);
                    ASSERT_EQ(std::memcmp(&x, &y, sizeof x), 0) << "b " << b << " n " << n << " i " << i << " c " << c << ": " << x
                                                                << " vs " << y;
                    ++compared;
                }
                if (g.writeLse && w.writeLse) {
                    const float x = static_cast<const float*>(g.lse.data)[g.lse.offset(b, n, gr, 0)];
                    const float y = static_cast<const float*>(w.lse.data)[w.lse.offset(b, n, wr, 0)];
                    ASSERT_EQ(std::memcmp(&x, &y, sizeof x), 0) << "lse b " << b << " n " << n << " i " << i;
                }
            }
    }
    EXPECT_GT(compared, 0);
}

std::vector<uint8_t> outputBytes(const FiaProblem& p) {
    const FiaInstance inst = runDefault(p);
    std::vector<uint8_t> bytes = inst.attentionOut.bytes();
    if (!inst.softmaxLse.empty()) bytes.insert(bytes.end(), inst.softmaxLse.bytes().begin(), inst.softmaxLse.bytes().end());
    return bytes;
}

void expectSameBitsForAnyThreadCount(const FiaProblem& p) {
    testsupport::ThreadsGuard guard;
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    const std::vector<uint8_t> one = outputBytes(p);
    for (int32_t threads : {2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        EXPECT_EQ(outputBytes(p), one) << threads << " threads: " << p.describe();
    }
}

}  // namespace

// ---- Tensor-list key/value with int4 -----------------------------------------------------

// Every int4 mode (spec 9.1: per channel, per token, per token and head, key per channel with
// value per token), batched layouts with their NBSD output, GQA; contexts on both sides of a key
// split and a length-0 and length-1 batch.
TEST(FiaGapsInt4List, EveryModeAndLayoutMatchesReference) {
    for (const char* layout : {"BSH", "BSND", "BNSD", "BSND_NBSD"})
        for (auto [km, vm] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}}) {
            const FiaProblem p = int4List(layout, {70, 1, 0, 17}, 4, 2, 64, km, vm);
            expectFiaMatchesReference(p, {"tiled-generic", "reference"}, "");
            for (const char* impl : kVectorImplementations) expectVectorKernel(impl, p);
        }
    FiaProblem wide = int4List("BNSD", {kSplitKeys + 65, kSplitKeys, 3}, 8, 1, 128, 0, 0);  // key splits, GQA 8
    wide.dtype = ATTNOPS_BFLOAT16;
    expectFiaMatchesReference(wide, {"tiled-generic"}, "");
    for (const char* impl : kVectorImplementations) expectVectorKernel(impl, wide);
    FiaProblem own = int4List("BSH", {}, 4, 4, 64, 3, 3);  // no lengths: each batch its own S (kvSeqLen + b % 3)
    own.batch = 3;
    own.kvSeqLen = 40;
    expectFiaMatchesReference(own, {"tiled-generic", "reference"}, "");
    for (const char* impl : kVectorImplementations) expectVectorKernel(impl, own);
}

// A list of int4 tensors holding the same nibbles as one batched int4 tensor gives the same bytes
// on the same kernel.
TEST(FiaGapsInt4List, EqualsOneTensor) {
    for (auto [km, vm] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}}) {
        const FiaProblem list = int4List("BSND", {50, 0, 1, 33}, 8, 2, 64, km, vm);
        FiaProblem one = list;
        one.kvList = false;
        for (const char* impl : {"avx512", "avx2", "tiled-generic", "reference"}) {
            SCOPED_TRACE(impl);
            if (!supported(impl)) continue;
            expectSameLogicalOutput(runForced(impl, list), runForced(impl, one));
        }
    }
}

TEST(FiaGapsInt4List, SameBitsForAnyThreadCount) {
    expectSameBitsForAnyThreadCount(int4List("BSH_NBSD", {2 * kSplitKeys + 7, 5, 700}, 8, 2, 64, 1, 1));
}

TEST(FiaGapsInt4List, Rules) {
    const FiaProblem p = int4List("BSND", {30, 4, 11}, 4, 2, 64, 0, 0);
    FiaInstance inst(p);
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS) << planWith(inst, [](fia::Args&) {}).message;
    // An int8 tensor among int4 ones, and an int4 value beside an int8 key.
    FiaProblem i8 = p;
    i8.int4Kv = false;
    i8.int8Kv = true;
    const FiaInstance other(i8);
    const attnopsTensor* keys[3] = {inst.keyList[0].handle(), other.keyList[1].handle(), inst.keyList[2].handle()};
    expectRejected(planWith(inst, [&](fia::Args& a) { a.key = keys; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "key[1].dtype");
    // A container count that does not match the other tensors' D (D 64 is 8 int32; 4 here).
    HostTensor narrow(ATTNOPS_INT32, {1, 4, 2, 4});
    const attnopsTensor* narrowKeys[3] = {inst.keyList[0].handle(), inst.keyList[1].handle(), narrow.handle()};
    expectRejected(planWith(inst, [&](fia::Args& a) { a.key = narrowKeys; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "key[2].shape");
    FiaProblem d32 = p;
    d32.dim = 32;
    expectRejected(planWith(FiaInstance(d32), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "multiple of 64");
    FiaProblem prefill = p;
    prefill.qSeqLen = 2;
    expectRejected(planWith(FiaInstance(prefill), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "needs a decode query");
    FiaProblem m2 = p;
    m2.keyQuantMode = m2.valueQuantMode = 2;
    expectRejected(planWith(FiaInstance(m2), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "int8 key/value only");
    FiaProblem padded = p;
    padded.kvPadding = 0;
    expectRejected(planWith(FiaInstance(padded), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "kvPaddingSize");
    // Per-token scales must cover the longest tensor's S (batch 2 holds 13 rows).
    FiaInstance shortScale(int4List("BSND", {30, 4, 11}, 4, 2, 64, 1, 1));
    shortScale.keyScale = HostTensor(ATTNOPS_FLOAT32, {3, 12});
    expectRejected(planWith(shortScale, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "keyAntiquantScale");
}

// ---- MLA layouts -------------------------------------------------------------------------

// Decode MLA with the NBSD outputs and TND_NTD: every implementation that runs here (the vector
// kernels required to take it), contexts on page and split edges, an empty batch, MTP rows.
TEST(FiaGapsMlaLayouts, DecodeTransposedOutputsMatchReference) {
    for (const char* layout : {"BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"}) {
        const bool bnsd = std::string(layout) == "BNSD_NBSD";
        const FiaProblem p = mlaDecode(layout, 4, 1, 16, {kSplitKeys + 129, 0, 128, 1}, bnsd ? "BnNBsD" : "BnBsH", 128);
        expectFiaMatchesReference(p, {"tiled-generic", "reference"}, "");
        for (const char* impl : kVectorImplementations) expectVectorKernel(impl, p);
        FiaProblem mtp = mlaDecode(layout, 2, 3, 8, {150, 3}, bnsd ? "BnBsH" : "NZ", 64);
        mtp.sparseMode = 3;
        expectFiaMatchesReference(mtp, {"tiled-generic"}, "");
        for (const char* impl : kVectorImplementations) expectVectorKernel(impl, mtp);
    }
    FiaProblem t = mlaDecode("TND_NTD", 0, 0, 16, {70, 129, 0, 1}, "BnBsH", 128);
    t.qLens = {1, 2, 1, 1};
    t.sparseMode = 3;
    t.lse = false;  // not with TND D 512 MLA
    expectFiaMatchesReference(t, {"tiled-generic", "reference"}, "");
    for (const char* impl : kVectorImplementations) expectVectorKernel(impl, t);
}

// The transposed outputs hold the plain layouts' values, element by element.
TEST(FiaGapsMlaLayouts, DecodeTransposedEqualsPlain) {
    for (const char* base : {"BSH", "BSND", "BNSD"}) {
        const FiaProblem plain = mlaDecode(base, 3, 2, 8, {300, 0, 65}, "BnNBsD", 64);
        FiaProblem t = plain;
        t.layout = std::string(base) + "_NBSD";
        t.sparseMode = 3;
        FiaProblem p3 = plain;
        p3.sparseMode = 3;
        expectSameLogicalOutput(runDefault(t), runDefault(p3));
    }
    FiaProblem tnd = mlaDecode("TND", 0, 0, 8, {40, 0, 200}, "NZ", 32);
    tnd.qLens = {2, 1, 3};
    tnd.sparseMode = 3;
    tnd.lse = false;
    expectSameLogicalOutput(runDefault(withLayout(tnd, "TND_NTD")), runDefault(tnd));
}

// Prefill MLA (D 128 + 64) on NTD, NTD_TND, the batched layouts and their BNSD/BSND outputs.
TEST(FiaGapsMlaLayouts, PrefillEveryLayoutMatchesReference) {
    for (const char* layout : {"NTD", "NTD_TND"}) {
        expectFiaMatchesReference(mlaPrefill(layout, {5, 1, 17, 0}, {9, 64, 17, 3}, 2), {"tiled-generic", "reference"}, "");
        FiaProblem causal = mlaPrefill(layout, {4, 16}, {20, 70}, 4);
        causal.sparseMode = 3;
        expectFiaMatchesReference(causal, {"tiled-generic"}, "");
        for (const char* impl : kVectorImplementations) expectVectorKernel(impl, causal);
    }
    for (const char* layout : {"BSH", "BSND", "BNSD", "BSH_BNSD", "BSND_BNSD", "BNSD_BSND"}) {
        FiaProblem p = mlaPrefillBatched(layout, 3, 9, 40, 2);
        p.qLens = {9, 1, 0};
        p.kvLens = {40, 17, 5};
        p.sparseMode = 3;
        expectFiaMatchesReference(p, {"tiled-generic", "reference"}, "");
        for (const char* impl : kVectorImplementations) expectVectorKernel(impl, p);
    }
    FiaProblem decodeRow = mlaPrefillBatched("BSND", 2, 1, 33, 2);  // Q_S 1 with rope is not the decode branch
    expectFiaMatchesReference(decodeRow, {"tiled-generic"}, "");
}

TEST(FiaGapsMlaLayouts, PrefillEqualsPlain) {
    const FiaProblem tnd = mlaPrefill("TND", {3, 0, 12}, {7, 4, 12}, 2);
    for (const char* layout : {"NTD", "NTD_TND"}) expectSameLogicalOutput(runDefault(withLayout(tnd, layout)), runDefault(tnd));
    FiaProblem bsnd = mlaPrefillBatched("BSND", 2, 6, 20, 2);
    bsnd.sparseMode = 3;
    for (const char* layout : {"BSH", "BNSD", "BSH_BNSD", "BSND_BNSD", "BNSD_BSND"})
        expectSameLogicalOutput(runDefault(withLayout(bsnd, layout)), runDefault(bsnd));
}

TEST(FiaGapsMlaLayouts, SameBitsForAnyThreadCount) {
    FiaProblem t = mlaDecode("TND_NTD", 0, 0, 16, {3 * kSplitKeys + 5, 77}, "BnBsH", 128);
    t.qLens = {1, 3};
    t.sparseMode = 3;
    t.lse = false;
    expectSameBitsForAnyThreadCount(t);
    expectSameBitsForAnyThreadCount(mlaDecode("BSND_NBSD", 2, 1, 16, {2 * kSplitKeys + 9, 40}, "NZ", 128));
    expectSameBitsForAnyThreadCount(mlaPrefill("NTD", {40, 3}, {90, 200}, 2));
}

TEST(FiaGapsMlaLayouts, Rules) {
    // Decode MLA takes the NBSD outputs and TND_NTD, not NTD, NTD_TND or the BNSD outputs.
    FiaProblem ntd = mlaDecode("NTD", 0, 0, 8, {30}, "BnBsH", 16);
    ntd.qLens = {1};
    ntd.lse = false;
    expectRejected(planWith(FiaInstance(ntd), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "MLA with D 512 takes BSH, BSND, BNSD, BSH_NBSD, BSND_NBSD, BNSD_NBSD, TND, TND_NTD");
    expectRejected(planWith(FiaInstance(withLayout(ntd, "NTD_TND")), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "MLA with D 512 takes");
    expectRejected(planWith(FiaInstance(mlaDecode("BNSD_BSND", 1, 2, 8, {30}, "BnBsH", 16)), [](fia::Args&) {}),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "MLA with D 512 takes");
    // Prefill MLA takes neither TND_NTD nor the NBSD outputs.
    expectRejected(planWith(FiaInstance(mlaPrefill("TND_NTD", {4}, {4}, 2)), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "MLA with D 128 takes BSH, BSND, BNSD, TND, NTD, BSH_BNSD, BSND_BNSD, BNSD_BSND, NTD_TND");
    expectRejected(planWith(FiaInstance(mlaPrefillBatched("BSND_NBSD", 1, 4, 4, 2)), [](fia::Args&) {}),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "MLA with D 128 takes");
    // NZ with a BNSD query stays refused with the NBSD output too.
    expectRejected(planWith(FiaInstance(mlaDecode("BNSD_NBSD", 1, 1, 8, {30}, "NZ", 16)), [](fia::Args&) {}),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "NZ cache takes BSH, BSND or TND");
    // The rope parts follow the input layout: an NTD query's rope in TND order is the wrong shape.
    FiaInstance ropeOrder(mlaPrefill("NTD", {3, 5}, {4, 6}, 2));
    ropeOrder.queryRope = HostTensor(ATTNOPS_BFLOAT16, {8, 2, 64});
    expectRejected(planWith(ropeOrder, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "queryRope.shape");
    FiaInstance keyRopeOrder(mlaPrefill("NTD", {3, 5}, {4, 6}, 2));
    keyRopeOrder.keyRope = HostTensor(ATTNOPS_BFLOAT16, {10, 2, 64});
    expectRejected(planWith(keyRopeOrder, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "keyRope.shape");
    FiaInstance ropeWidth(mlaDecode("BSND_NBSD", 2, 1, 8, {40, 20}, "BnBsH", 16));
    ropeWidth.queryRope = HostTensor(ATTNOPS_BFLOAT16, {2, 1, 8, 32});
    expectRejected(planWith(ropeWidth, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "queryRope.shape");
}

// ---- MLA with tensor lists: refused (spec 4: tensor lists exclude decode MLA, which reads a
// paged cache, and paged caches exclude tensor lists, spec 8; prefill MLA excludes them too) ----

TEST(FiaGapsMlaList, RefusedCitingTheRule) {
    // Prefill MLA on a batched layout with a list of one tensor per batch.
    FiaProblem prefill = mlaPrefillBatched("BSND", 2, 4, 10, 2);
    FiaInstance listed(prefill);
    FiaProblem asList = prefill;
    asList.ropeDim = 0;
    asList.kvList = true;
    const FiaInstance keys(asList);
    const attnopsTensor* k[2] = {keys.keyList[0].handle(), keys.keyList[1].handle()};
    const attnopsTensor* v[2] = {keys.valueList[0].handle(), keys.valueList[1].handle()};
    const auto useList = [&](fia::Args& a) {
        a.key = k;
        a.value = v;
        a.keyCount = a.valueCount = 2;
    };
    expectRejected(planWith(listed, useList), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "tensor-list key/value are not supported with MLA (queryRope/keyRope given)");
    expectRejected(planWith(listed, useList), ATTNOPS_ERROR_INVALID_ARGUMENT, "paged cache, which excludes tensor lists (spec 4, 8)");
    expectRejected(planWith(listed, useList), ATTNOPS_ERROR_INVALID_ARGUMENT, "keyCount = 2");
    // Decode MLA (D 512): the same rule, whatever else is wrong with the call.
    FiaProblem dec = mlaDecode("BSND", 2, 1, 8, {40, 20}, "BnBsH", 16);
    dec.cache = "none";
    dec.kvSeqLen = 40;
    dec.kvLens = {};
    FiaInstance decInst(dec);
    FiaProblem decList = dec;
    decList.ropeDim = 0;
    decList.kvList = true;
    const FiaInstance decKeys(decList);
    const attnopsTensor* dk[2] = {decKeys.keyList[0].handle(), decKeys.keyList[1].handle()};
    expectRejected(planWith(decInst, [&](fia::Args& a) {
                       a.key = a.value = dk;
                       a.keyCount = a.valueCount = 2;
                   }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "not supported with MLA");
}
