// FusedInferAttentionScore pseShift, MLA rope and the tree mask (sparse mode 9): results against
// the double reference on every layout, broadcast pse, paged caches (pse columns covering
// maxBlocksPerSeq * blockSize), masks with pse, decode MLA (KV_N 1, D 512 + rope 64, the key read
// as the value, every cache format, sparse 3/4/9, key splits), prefill MLA (TND, D 128 + 64) and
// tree masks (every layout, TND, paged, one draft token); every implementation this CPU runs; the
// same bits for any thread count; and each documented constraint rejected with a message naming
// the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
using attnops::testing::fiaProblem;
using attnops::testing::mlaDecode;
using attnops::testing::Outcome;
using attnops::testing::expectRejected;
using attnops::testing::planWith;
using attnops::fia::kSplitKeys;
using attnops::testsupport::ForcedImpl;

namespace {

using attnops::testing::expectRejected;  // the overloads below add to it

const char* const kImplementations[] = {"avx512", "avx2", "tiled-generic", "reference"};

FiaProblem withPse(FiaProblem p, const std::string& kind) {
    p.pse = kind;
    return p;
}

// Prefill MLA: TND, Q_N = KV_N, D 128 + rope 64, bf16.
FiaProblem mlaPrefill(std::vector<int64_t> qLens, std::vector<int64_t> kvLens, int64_t heads) {
    FiaProblem p;
    p.layout = "TND";
    p.qLens = std::move(qLens);
    p.kvLens = std::move(kvLens);
    p.heads = p.kvHeads = heads;
    p.dim = 128;
    p.ropeDim = 64;
    p.dtype = ATTNOPS_BFLOAT16;
    return p;
}

void expectEveryImplementation(const FiaProblem& p, int& ran) {
    for (const char* impl : kImplementations) {
        SCOPED_TRACE(std::string(impl) + ": " + p.describe());
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
        EXPECT_TRUE(r.passed) << r.firstFailure << " (error " << r.maxAbsError << ", tolerance " << r.tolerance
                              << ", lse error " << r.maxLseError << ")";
        EXPECT_GT(r.rows, 0);
    }
}


void expectRejected(const Outcome& o, const std::string& needle, attnopsStatus status = ATTNOPS_ERROR_INVALID_ARGUMENT) {
    EXPECT_EQ(o.status, status) << o.message;
    EXPECT_NE(o.message.find(needle), std::string::npos) << "message: " << o.message << "\nexpected to contain: " << needle;
}

}  // namespace

// ---------------------------------------------------------------- pseShift

TEST(FiaPse, EveryLayoutBroadcastAndPagedMatchReference) {
    int ran = 0;
    for (const char* layout : {"BSH", "BSND", "BNSD"}) {
        expectEveryImplementation(withPse(fiaProblem(layout, 3, 1, 70, 4, 2, 32), "batch"), ran);    // decode
        expectEveryImplementation(withPse(fiaProblem(layout, 2, 33, 65, 4, 4, 16), "shared"), ran);  // prefill
    }
    // Paged: the pse columns cover maxBlocksPerSeq * blockSize; lengths on and beside page edges,
    // an empty batch, a context cut into key splits.
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
        FiaProblem p = withPse(fiaProblem("BNSD", 4, 1, 0, 8, 2, 64), "batch");
        p.cache = cache;
        p.blockSize = 32;
        p.dtype = ATTNOPS_BFLOAT16;
        p.kvLens = {kSplitKeys + 33, 0, 32, 1};
        expectEveryImplementation(p, ran);
    }
    FiaProblem extra = withPse(fiaProblem("BSND", 2, 5, 40, 2, 1, 16), "batch");
    extra.qLens = {5, 2};  // rows beyond the actual lengths stay 0
    extra.kvLens = {40, 17};
    expectEveryImplementation(extra, ran);
    EXPECT_GT(ran, 0);
}

TEST(FiaPse, WithMasksSparseModesAndSink) {
    int ran = 0;
    FiaProblem masked = withPse(fiaProblem("BNSD", 2, 9, 50, 4, 2, 32), "batch");
    masked.maskKind = "random";  // mode 0 with a full mask, one row fully masked
    expectEveryImplementation(masked, ran);
    for (int64_t mode : {2, 3}) {
        FiaProblem p = withPse(fiaProblem("BSH", 2, 20, 37, 4, 1, 16), "shared");
        p.sparseMode = mode;
        expectEveryImplementation(p, ran);
    }
    FiaProblem band = withPse(fiaProblem("BSND", 1, 30, 64, 2, 2, 32), "batch");
    band.sparseMode = 4;
    band.preTokens = 5;
    band.nextTokens = 2;
    expectEveryImplementation(band, ran);
    FiaProblem decodeMask = withPse(fiaProblem("BSH", 2, 1, 90, 4, 2, 16), "batch");
    decodeMask.maskKind = "random";
    decodeMask.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(decodeMask, ran);
    FiaProblem int8 = withPse(fiaProblem("BNSD", 2, 1, 77, 4, 2, 32), "batch");
    int8.int8Kv = true;
    int8.keyQuantMode = 1;
    int8.valueQuantMode = 1;
    expectEveryImplementation(int8, ran);
    EXPECT_GT(ran, 0);
}

// The pse is added after the scale: with scale 0 the output is softmax(pse) . V, which a pse of
// one large entry per row turns into (nearly) that key's value.
TEST(FiaPse, AddedUnscaledAfterTheScale) {
    FiaProblem p = withPse(fiaProblem("BNSD", 1, 2, 8, 1, 1, 16), "batch");
    p.scale = 0.0;
    p.dtype = ATTNOPS_FLOAT16;
    FiaInstance inst(p);
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 8; ++j) inst.pseShift.set(i * 8 + j, j == 3 + i ? 30.0f : 0.0f);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    FiaInstance plain(p);  // the value rows the two query rows must pick
    for (int64_t i = 0; i < 2; ++i)
        for (int64_t c = 0; c < 16; ++c)
            EXPECT_NEAR(inst.attentionOut.get(i * 16 + c), plain.value.get((3 + i) * 16 + c), 2e-3) << "row " << i << " col " << c;
    EXPECT_TRUE(checkFia(inst).passed);
}

TEST(FiaPse, ConstraintsRejectedNamingTheArgument) {
    const FiaInstance base(withPse(fiaProblem("BNSD", 2, 4, 40, 4, 2, 32), "batch"));
    const FiaInstance decodeOdd(withPse(fiaProblem("BNSD", 2, 1, 40, 4, 2, 24), "batch"));
    FiaInstance wrongDtype(withPse(fiaProblem("BNSD", 2, 4, 40, 4, 2, 32), "batch"));
    wrongDtype.pseShift = HostTensor(ATTNOPS_BFLOAT16, {2, 4, 4, 40});
    FiaInstance shortCols(base.problem);
    shortCols.pseShift = HostTensor(ATTNOPS_FLOAT16, {2, 4, 4, 39});
    FiaInstance shortRows(base.problem);
    shortRows.pseShift = HostTensor(ATTNOPS_FLOAT16, {1, 4, 3, 40});
    FiaInstance badBatch(base.problem);
    badBatch.pseShift = HostTensor(ATTNOPS_FLOAT16, {3, 4, 4, 40});
    FiaInstance badHeads(base.problem);
    badHeads.pseShift = HostTensor(ATTNOPS_FLOAT16, {2, 2, 4, 40});
    FiaInstance rank3(base.problem);
    rank3.pseShift = HostTensor(ATTNOPS_FLOAT16, {4, 4, 40});
    expectRejected(planWith(wrongDtype, [](fia::Args&) {}), "pseShift.dtype");
    expectRejected(planWith(shortCols, [](fia::Args&) {}), "P_S2 >= 40");
    expectRejected(planWith(shortRows, [](fia::Args&) {}), "P_S1 >= Q_S = 4");
    expectRejected(planWith(badBatch, [](fia::Args&) {}), "pseShift.shape");
    expectRejected(planWith(badHeads, [](fia::Args&) {}), "pseShift.shape");
    expectRejected(planWith(rank3, [](fia::Args&) {}), "pseShift.shape");
    expectRejected(planWith(decodeOdd, [](fia::Args&) {}), "multiple of 16");
    // Paged: the columns must cover maxBlocksPerSeq * blockSize, not just the longest length.
    FiaProblem pp = withPse(fiaProblem("BNSD", 2, 1, 0, 4, 2, 32), "batch");
    pp.cache = "BnBsH";
    pp.blockSize = 16;
    pp.kvLens = {20, 5};
    pp.maxBlocksPerSeq = 3;
    FiaInstance pagedShort(pp);
    pagedShort.pseShift = HostTensor(ATTNOPS_FLOAT16, {2, 4, 1, 32});
    expectRejected(planWith(pagedShort, [](fia::Args&) {}), "P_S2 >= 48 (maxBlocksPerSeq * blockSize");
    // Not with TND, sink, D-unequal, int8 decode with P_S1 > 1.
    FiaProblem t;
    t.layout = "TND";
    t.qLens = {3, 2};
    t.kvLens = {4, 5};
    t.pse = "batch";
    expectRejected(planWith(FiaInstance(t), [](fia::Args&) {}), "inputLayout TND");
    FiaProblem s = base.problem;
    s.sink = true;
    expectRejected(planWith(FiaInstance(s), [](fia::Args&) {}), "learnableSink");
    FiaProblem dv = base.problem;
    dv.vDim = 16;
    expectRejected(planWith(FiaInstance(dv), [](fia::Args&) {}), "value's D (16)");
    FiaProblem i8 = withPse(fiaProblem("BNSD", 2, 1, 40, 4, 2, 32), "batch");
    i8.int8Kv = true;
    FiaInstance i8Rows(i8);
    i8Rows.pseShift = HostTensor(ATTNOPS_FLOAT16, {2, 4, 2, 40});
    expectRejected(planWith(i8Rows, [](fia::Args&) {}), "P_S1 = 1");
}

// ---------------------------------------------------------------- MLA

TEST(FiaMla, DecodeEveryCacheFormatAndLayoutMatchesReference) {
    int ran = 0;
    // Contexts on and beside page and split edges, an empty batch; BSH/BSND/TND with BnBsH/NZ.
    expectEveryImplementation(mlaDecode("BSND", 4, 1, 16, {kSplitKeys + 129, 0, 128, 1}, "BnBsH", 128), ran);
    expectEveryImplementation(mlaDecode("BSH", 2, 1, 8, {300, 17}, "NZ", 128), ran);
    expectEveryImplementation(mlaDecode("BNSD", 2, 1, 4, {100, 33}, "BnNBsD", 16), ran);
    FiaProblem mtp = mlaDecode("BSND", 2, 3, 8, {150, 3}, "BnBsH", 64);  // MTP rows: causal (mode 3)
    mtp.sparseMode = 3;
    mtp.maskKind = "auto";
    expectEveryImplementation(mtp, ran);
    FiaProblem window = mlaDecode("BSND", 2, 1, 4, {200, 50}, "BnNBsD", 32);  // sliding window (mode 4)
    window.sparseMode = 4;
    window.preTokens = 40;
    window.nextTokens = 0;
    expectEveryImplementation(window, ran);
    FiaProblem t = mlaDecode("TND", 0, 0, 16, {70, 129, 0}, "BnBsH", 128);
    t.qLens = {1, 2, 1};
    t.sparseMode = 3;
    t.lse = false;  // softmaxLse is not supported with TND D 512 MLA
    expectEveryImplementation(t, ran);
    EXPECT_GT(ran, 0);
}

// The value input does not take effect in decode MLA: a value cache of NaN gives the same bits.
TEST(FiaMla, DecodeReadsTheKeyAsTheValue) {
    const FiaProblem p = mlaDecode("BSND", 2, 1, 8, {130, 40}, "BnBsH", 128);
    FiaInstance real(p);
    ASSERT_EQ(real.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    FiaInstance nanValue(p);
    for (int64_t i = 0; i < nanValue.value.numel(); ++i) nanValue.value.set(i, std::numeric_limits<float>::quiet_NaN());
    ASSERT_EQ(nanValue.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(real.attentionOut.bytes(), nanValue.attentionOut.bytes());
    EXPECT_TRUE(checkFia(real).passed);
}

TEST(FiaMla, PrefillTndMatchesReference) {
    int ran = 0;
    expectEveryImplementation(mlaPrefill({5, 1, 17, 0}, {9, 64, 17, 3}, 2), ran);
    FiaProblem causal = mlaPrefill({4, 16}, {20, 70}, 4);
    causal.sparseMode = 3;
    expectEveryImplementation(causal, ran);
    EXPECT_GT(ran, 0);
}

TEST(FiaMla, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    const FiaProblem p = mlaDecode("BSND", 2, 1, 16, {3 * kSplitKeys + 5, 77}, "NZ", 128);
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    FiaInstance one(p);
    ASSERT_EQ(one.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    for (int32_t threads : {2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        FiaInstance again(p);
        ASSERT_EQ(again.run(), ATTNOPS_SUCCESS);
        EXPECT_EQ(again.attentionOut.bytes(), one.attentionOut.bytes()) << threads << " threads";
        EXPECT_EQ(again.softmaxLse.bytes(), one.softmaxLse.bytes()) << threads << " threads";
    }
}

TEST(FiaMla, ConstraintsRejectedNamingTheArgument) {
    const FiaInstance dec(mlaDecode("BSND", 2, 1, 8, {40, 20}, "BnBsH", 16));
    expectRejected(planWith(dec, [](fia::Args& a) { a.keyRope = nullptr; }), "keyRope", ATTNOPS_ERROR_NULL_ARGUMENT);
    expectRejected(planWith(dec, [](fia::Args& a) { a.queryRope = nullptr; }), "queryRope", ATTNOPS_ERROR_NULL_ARGUMENT);
    FiaInstance qrType(dec.problem);
    qrType.queryRope = HostTensor(ATTNOPS_FLOAT16, {2, 1, 8, 64});
    expectRejected(planWith(qrType, [](fia::Args&) {}), "queryRope.dtype");
    FiaInstance qrShape(dec.problem);
    qrShape.queryRope = HostTensor(ATTNOPS_BFLOAT16, {2, 1, 8, 32});
    expectRejected(planWith(qrShape, [](fia::Args&) {}), "queryRope.shape");
    FiaInstance krShape(dec.problem);
    krShape.keyRope = HostTensor(ATTNOPS_BFLOAT16, {4, 16, 32});
    expectRejected(planWith(krShape, [](fia::Args&) {}), "keyRope.shape");
    FiaProblem d256 = dec.problem;
    d256.dim = 256;
    expectRejected(planWith(FiaInstance(d256), [](fia::Args&) {}), "D must be 128 or 512");
    FiaProblem kvHeads = dec.problem;
    kvHeads.kvHeads = 2;
    expectRejected(planWith(FiaInstance(kvHeads), [](fia::Args&) {}), "numKeyValueHeads");
    FiaProblem heads = dec.problem;
    heads.heads = 12;
    expectRejected(planWith(FiaInstance(heads), [](fia::Args&) {}), "power of two");
    FiaProblem contiguous = dec.problem;
    contiguous.cache = "none";
    contiguous.kvSeqLen = 40;
    expectRejected(planWith(FiaInstance(contiguous), [](fia::Args&) {}), "blockTable", ATTNOPS_ERROR_NULL_ARGUMENT);
    FiaProblem rows = mlaDecode("BSND", 1, 17, 8, {40}, "BnBsH", 16);
    rows.sparseMode = 3;
    expectRejected(planWith(FiaInstance(rows), [](fia::Args&) {}), "1-16 query rows");
    FiaProblem masked = dec.problem;
    masked.maskKind = "random";
    expectRejected(planWith(FiaInstance(masked), [](fia::Args&) {}), "sparseMode 0 without attenMask, 3, 4 or 9");
    FiaProblem pse = dec.problem;
    pse.pse = "batch";
    expectRejected(planWith(FiaInstance(pse), [](fia::Args&) {}), "MLA");
    FiaProblem sink = dec.problem;
    sink.sink = true;
    expectRejected(planWith(FiaInstance(sink), [](fia::Args&) {}), "learnableSink");
    FiaProblem tndLse = mlaDecode("TND", 0, 0, 8, {30}, "BnBsH", 16);
    tndLse.qLens = {1};
    expectRejected(planWith(FiaInstance(tndLse), [](fia::Args&) {}), "softmaxLseFlag");
    FiaInstance valueShape(dec.problem);
    valueShape.value = HostTensor(ATTNOPS_BFLOAT16, {4, 16, 256});
    expectRejected(planWith(valueShape, [](fia::Args&) {}), "value.shape");
    // Prefill MLA: its layouts (TND_NTD is decode MLA's), bf16, Q_N = KV_N, not paged.
    FiaProblem tndNtd = mlaPrefill({4}, {4}, 2);
    tndNtd.layout = "TND_NTD";
    expectRejected(planWith(FiaInstance(tndNtd), [](fia::Args&) {}), "MLA with D 128 takes BSH, BSND, BNSD, TND, NTD");
    FiaProblem fp16 = mlaPrefill({4}, {4}, 2);
    fp16.dtype = ATTNOPS_FLOAT16;
    expectRejected(planWith(FiaInstance(fp16), [](fia::Args&) {}), "takes bf16");
    FiaProblem gqa = mlaPrefill({4}, {4}, 2);
    gqa.kvHeads = 1;
    expectRejected(planWith(FiaInstance(gqa), [](fia::Args&) {}), "must equal numHeads");
}

// ---------------------------------------------------------------- tree mask (sparse mode 9)

namespace {

FiaProblem tree(FiaProblem p) {
    p.sparseMode = 9;
    p.preTokens = -7;  // ignored by mode 9
    p.nextTokens = -7;
    return p;
}

}  // namespace

TEST(FiaTree, EveryLayoutPagedAndTndMatchReference) {
    int ran = 0;
    for (const char* layout : {"BSH", "BSND", "BNSD"}) expectEveryImplementation(tree(fiaProblem(layout, 3, 5, 40, 4, 2, 32)), ran);
    FiaProblem lens = tree(fiaProblem("BSND", 3, 6, 70, 4, 1, 16));
    lens.qLens = {6, 1, 4};
    lens.kvLens = {70, 1, 9};  // Skv = Sq: no context, only the tree
    lens.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(lens, ran);
    FiaProblem pagedTree = tree(fiaProblem("BNSD", 2, 8, 0, 8, 2, 64));
    pagedTree.cache = "BnBsH";
    pagedTree.blockSize = 16;
    pagedTree.kvLens = {kSplitKeys + 9, 8};
    expectEveryImplementation(pagedTree, ran);
    FiaProblem t;
    t.layout = "TND";
    t.qLens = {3, 0, 5, 1};
    t.kvLens = {10, 4, 5, 30};
    t.heads = 4;
    t.kvHeads = 2;
    t.dim = 32;
    expectEveryImplementation(tree(t), ran);
    FiaProblem decodeOne = tree(fiaProblem("BSH", 2, 1, 33, 2, 2, 16));  // one draft token: it sees itself
    expectEveryImplementation(decodeOne, ran);
    FiaProblem mla = tree(mlaDecode("BSND", 2, 4, 8, {150, 4}, "NZ", 128));  // MTP decode MLA with a tree
    expectEveryImplementation(mla, ran);
    EXPECT_GT(ran, 0);
}

// The draft tokens' keys follow the tree, the context before them is always visible: a tree that
// hides every draft token but the row's own gives the same output as an explicit mode-1 mask of
// that pattern.
TEST(FiaTree, SameAsTheEquivalentFullMask) {
    FiaProblem p = tree(fiaProblem("BNSD", 1, 4, 12, 2, 2, 16));
    FiaInstance withTree(p);
    auto* m = static_cast<uint8_t*>(withTree.attenMask.data());
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t c = 0; c < 4; ++c) m[i * 4 + c] = c != i;
    ASSERT_EQ(withTree.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    FiaProblem full = fiaProblem("BNSD", 1, 4, 12, 2, 2, 16);
    full.sparseMode = 1;
    FiaInstance withFull(full);
    withFull.attenMask = HostTensor(ATTNOPS_BOOL, {4, 12});
    auto* f = static_cast<uint8_t*>(withFull.attenMask.data());
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 12; ++j) f[i * 12 + j] = j >= 8 && j - 8 != i;
    ASSERT_EQ(withFull.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(withTree.attentionOut.bytes(), withFull.attentionOut.bytes());
    EXPECT_EQ(withTree.softmaxLse.bytes(), withFull.softmaxLse.bytes());
}

TEST(FiaTree, ConstraintsRejectedNamingTheArgument) {
    const FiaInstance base(tree(fiaProblem("BSND", 2, 5, 40, 4, 2, 32)));
    expectRejected(planWith(base, [](fia::Args& a) { a.attenMask = nullptr; }), "attenMask = NULL", ATTNOPS_ERROR_NULL_ARGUMENT);
    FiaInstance wrongShape(base.problem);
    wrongShape.attenMask = HostTensor(ATTNOPS_BOOL, {2, 5, 6});
    expectRejected(planWith(wrongShape, [](fia::Args&) {}), "[B, Q_S, Q_S] = [2, 5, 5]");
    FiaProblem shortKv = base.problem;
    shortKv.kvLens = {40, 4};
    expectRejected(planWith(FiaInstance(shortKv), [](fia::Args&) {}), "actualSeqLengthsKv[1]");
    expectRejected(planWith(FiaInstance(withPse(base.problem, "batch")), [](fia::Args&) {}), "pseShift");
    FiaProblem i8 = base.problem;
    i8.int8Kv = true;
    expectRejected(planWith(FiaInstance(i8), [](fia::Args&) {}), "non-quantised");
    FiaProblem t;
    t.layout = "TND";
    t.qLens = {3, 2};
    t.kvLens = {4, 5};
    FiaInstance tndShape(tree(t));
    tndShape.attenMask = HostTensor(ATTNOPS_BOOL, {12});
    expectRejected(planWith(tndShape, [](fia::Args&) {}), "must be [13]");
}
