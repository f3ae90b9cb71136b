// FusedInferAttentionScore KV and output addressing: the NTD and output-transposing layouts,
// left padding, the shared prefix and tensor-list key/value. Each is checked against the double
// reference and, independently of the addressing code that reference shares with the kernels,
// against a plain call holding the same logical values: the transposed output equals the plain
// layout's output element by element, padded rows equal unpadded ones, a prefix equals its rows
// concatenated in front of the KV, a tensor list equals one batched tensor. Every implementation
// this CPU runs is forced on each feature; bad input gives the right status and message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fia_plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "threads_guard.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::testing::fiaPacked;
using attnops::testing::fiaProblem;
using attnops::testing::withMode;
using attnops::testing::Outcome;
using attnops::testing::expectRejected;
using attnops::testing::planWith;

namespace {

using attnops::testing::expectRejected;  // the overloads below add to it

const char* const kImplementations[] = {"avx512", "avx2", "tiled-generic", "reference"};

// Runs p on every implementation that runs here and accepts it, each checked against the
// reference; returns the default choice's instance.
FiaInstance expectMatches(const FiaProblem& p) {
    SCOPED_TRACE(p.describe());
    for (const char* impl : kImplementations) {
        SCOPED_TRACE(impl);
        FiaInstance inst(p);
        attnopsStatus st;
        {
            attnops::testsupport::ForcedImpl force(impl);
            st = inst.run();
        }
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        const int64_t lanes = std::string(impl) == "avx512" ? 16 : std::string(impl) == "avx2" ? 8 : 1;
        if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && (p.dim % lanes != 0 || p.vdim() % lanes != 0)) continue;
        EXPECT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        if (st != ATTNOPS_SUCCESS) continue;
        const FiaCheck r = checkFia(inst);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance " << r.tolerance
                              << ", lse error " << r.maxLseError << ")";
        EXPECT_GT(r.rows + r.emptyRows, 0);
    }
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    return inst;
}

FiaInstance runDefault(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << p.describe() << ": " << attnopsGetLastErrorMessage();
    return inst;
}

uint16_t halfAt(const HostTensor& t, int64_t i) { return static_cast<const uint16_t*>(t.data())[i]; }
float floatAt(const HostTensor& t, int64_t i) { return static_cast<const float*>(t.data())[i]; }



void expectRejected(const FiaProblem& p, attnopsStatus status, const std::string& needle) {
    SCOPED_TRACE(p.describe());
    FiaInstance inst(p);
    expectRejected(planWith(inst, [](fia::Args&) {}), status, needle);
}

}  // namespace

// ---- Layouts -------------------------------------------------------------------------------

TEST(FiaAddressingLayouts, NewLayoutsMatchReference) {
    expectMatches(fiaPacked("NTD", {5, 0, 17}, {9, 3, 70}, 4, 2, 32));
    expectMatches(withMode(fiaPacked("NTD_TND", {4, 9}, {4, 12}, 4, 1, 16), 3));
    expectMatches(withMode(fiaPacked("TND_NTD", {1, 7, 2}, {33, 7, 0}, 2, 2, 16), 4, 3, 0));
    expectMatches(withMode(fiaProblem("BNSD_BSND", 2, 17, 40, 4, 2, 32), 3));
    expectMatches(fiaProblem("BSH_BNSD", 2, 9, 33, 4, 2, 64));
    expectMatches(withMode(fiaProblem("BSND_BNSD", 1, 20, 20, 2, 2, 128), 2));
    for (const char* layout : {"BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"}) {
        expectMatches(fiaProblem(layout, 3, 1, 70, 8, 2, 32));   // decode
        expectMatches(withMode(fiaProblem(layout, 2, 16, 50, 4, 1, 16), 3));  // MTP rows
    }
    FiaProblem unequal = fiaProblem("BSH_NBSD", 2, 3, 21, 4, 2, 32);
    unequal.vDim = 16;
    expectMatches(unequal);
}

// The transposed output holds the plain layout's values, element by element (bitwise: one
// kernel, one arithmetic), and so does softmaxLse.
TEST(FiaAddressingLayouts, TransposedOutputEqualsPlainOutput) {
    const int64_t b = 2, n = 4, s = 5, d = 16;
    const FiaProblem plain = fiaProblem("BNSD", b, s, 30, n, 2, d);
    const FiaInstance ref = runDefault(plain);
    for (const char* layout : {"BNSD_NBSD", "BNSD_BSND"}) {
        FiaProblem t = plain;
        t.layout = layout;
        const FiaInstance got = runDefault(t);
        const bool nbsd = std::string(layout) == "BNSD_NBSD";
        for (int64_t bi = 0; bi < b; ++bi)
            for (int64_t ni = 0; ni < n; ++ni)
                for (int64_t si = 0; si < s; ++si)
                    for (int64_t di = 0; di < d; ++di) {
                        const int64_t at = nbsd ? ((ni * b + bi) * s + si) * d + di : ((bi * s + si) * n + ni) * d + di;
                        ASSERT_EQ(halfAt(got.attentionOut, at), halfAt(ref.attentionOut, ((bi * n + ni) * s + si) * d + di))
                            << layout << " b " << bi << " n " << ni << " s " << si << " d " << di;
                    }
        EXPECT_EQ(got.softmaxLse.bytes(), ref.softmaxLse.bytes()) << layout;
    }
    // NTD against TND: (n, t, d) against (t, n, d); the lse is [T, N, 1] for both.
    const FiaProblem tnd = fiaPacked("TND", {3, 6}, {5, 6}, n, 2, d);
    const FiaInstance tref = runDefault(tnd);
    for (const char* layout : {"NTD", "TND_NTD"}) {
        FiaProblem t = tnd;
        t.layout = layout;
        const FiaInstance got = runDefault(t);
        for (int64_t row = 0; row < 9; ++row)
            for (int64_t ni = 0; ni < n; ++ni)
                for (int64_t di = 0; di < d; ++di)
                    ASSERT_EQ(halfAt(got.attentionOut, (ni * 9 + row) * d + di), halfAt(tref.attentionOut, (row * n + ni) * d + di))
                        << layout << " row " << row << " n " << ni << " d " << di;
        EXPECT_EQ(got.softmaxLse.bytes(), tref.softmaxLse.bytes()) << layout;
    }
}

TEST(FiaAddressingLayouts, LayoutRules) {
    expectRejected(fiaProblem("BNSD_BSND", 2, 1, 20, 2, 2, 32), ATTNOPS_ERROR_INVALID_ARGUMENT, "S > 1");
    expectRejected(fiaProblem("BSND_NBSD", 2, 17, 20, 2, 2, 32), ATTNOPS_ERROR_INVALID_ARGUMENT, "S <= 16");
    expectRejected(fiaProblem("BSH_BNSD", 2, 4, 20, 2, 2, 32), ATTNOPS_ERROR_INVALID_ARGUMENT, "D = V_D = 64 or 128");
    FiaProblem unequal = fiaPacked("NTD", {3}, {4}, 2, 2, 32);
    unequal.vDim = 16;
    expectRejected(unequal, ATTNOPS_ERROR_INVALID_ARGUMENT, "does not allow D = 32 != V_D = 16");
    expectRejected(withMode(fiaPacked("NTD", {3}, {4}, 2, 2, 16), 1), ATTNOPS_ERROR_INVALID_ARGUMENT, "with inputLayout TND or NTD");
    FiaInstance inst(fiaProblem("BNSD_NBSD", 2, 3, 20, 4, 2, 16));
    // The plain layout's output shape is not the NBSD one.
    FiaInstance plain(fiaProblem("BNSD", 2, 3, 20, 4, 2, 16));
    expectRejected(planWith(inst, [&](fia::Args& a) { a.attentionOut = plain.attentionOut.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.shape");
    FiaInstance lse(fiaProblem("BNSD_NBSD", 2, 3, 20, 4, 2, 16));
    lse.softmaxLse = HostTensor(ATTNOPS_FLOAT32, {4, 2, 3, 1});  // NBSD order is wrong for the lse
    expectRejected(planWith(lse, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "softmaxLse.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.inputLayout = "BNSD_TND"; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "inputLayout");
}

// ---- Left padding -------------------------------------------------------------------------

FiaProblem padded(FiaProblem p, int64_t qPad, int64_t kvPad) {
    p.queryPadding = qPad;
    p.kvPadding = kvPad;
    return p;
}

TEST(FiaAddressingPadding, PrefillAndDecodeMatchReference) {
    FiaProblem p = fiaProblem("BSND", 3, 12, 20, 4, 2, 16);
    p.qLens = {5, 10, 0};
    p.kvLens = {10, 17, 4};
    for (const FiaProblem& m : {p, withMode(p, 1), withMode(p, 3), withMode(p, 4, 2, 1), withMode(p, 0, 3, 0)}) {
        expectMatches(padded(m, 2, 3));
        expectMatches(padded(m, -4, 0));  // negative counts as 0
    }
    FiaProblem dec = fiaProblem("BNSD", 3, 1, 40, 4, 1, 32);
    dec.kvLens = {30, 1, 38};
    expectMatches(padded(dec, -1, 5));
    dec.maskKind = "random";
    expectMatches(padded(dec, -1, 7));
}

// Valid rows equal the unpadded call's rows bitwise; the padding rows are 0 (lse +inf, checked
// by checkFia); a decode window that starts before row 0 gives zeros.
TEST(FiaAddressingPadding, PaddedRowsEqualUnpaddedRows) {
    FiaProblem p = withMode(fiaProblem("BNSD", 2, 9, 16, 2, 1, 16), 1);
    p.qLens = {4, 9};
    p.kvLens = {7, 12};
    const FiaInstance plain = runDefault(p);
    const FiaInstance pad = runDefault(padded(p, 0, 2));
    expectRejected(padded(p, 3, 4), ATTNOPS_ERROR_INVALID_ARGUMENT, "queryPaddingSize = 3");  // batch 1 would start before row 0
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t n = 0; n < 2; ++n)
            for (int64_t i = 0; i < p.qLens[size_t(b)]; ++i) {
                const int64_t row = 9 - p.qLens[size_t(b)] + i;
                for (int64_t d = 0; d < 16; ++d)
                    ASSERT_EQ(halfAt(pad.attentionOut, ((b * 2 + n) * 9 + row) * 16 + d), halfAt(plain.attentionOut, ((b * 2 + n) * 9 + i) * 16 + d))
                        << "b " << b << " n " << n << " i " << i;
                ASSERT_EQ(floatAt(pad.softmaxLse, (b * 2 + n) * 9 + row), floatAt(plain.softmaxLse, (b * 2 + n) * 9 + i));
            }
    FiaProblem dec = fiaProblem("BSH", 2, 1, 10, 2, 2, 16);
    dec.kvLens = {4, 9};
    const FiaInstance z = expectMatches(padded(dec, -1, 3));  // batch 1: 10 - 3 - 9 < 0
    const FiaCheck r = checkFia(z);
    EXPECT_TRUE(r.passed) << r.firstFailure;
    for (int64_t i = 32; i < 64; ++i) EXPECT_EQ(z.attentionOut.get(i), 0.0f);
    EXPECT_NE(z.attentionOut.get(0), 0.0f);
}

TEST(FiaAddressingPadding, Rules) {
    FiaProblem p = fiaProblem("BSND", 2, 8, 10, 2, 2, 16);
    p.qLens = {3, 8};
    p.kvLens = {4, 10};
    FiaInstance inst(padded(p, 0, 0));
    expectRejected(planWith(inst, [](fia::Args& a) { a.actualSeqLengths = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "actualSeqLengths");
    expectRejected(planWith(inst, [](fia::Args& a) { a.actualSeqLengthsKv = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT,
                   "actualSeqLengthsKv");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.kvPaddingSize = inst.attentionOut.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "kvPaddingSize.dtype");
    HostTensor two(ATTNOPS_INT64, {2});
    expectRejected(planWith(inst, [&](fia::Args& a) { a.queryPaddingSize = two.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "queryPaddingSize.shape");
    expectRejected(padded(p, 1, -1), ATTNOPS_ERROR_INVALID_ARGUMENT, "queryPaddingSize = 1");
    expectRejected(padded(p, -1, 1), ATTNOPS_ERROR_INVALID_ARGUMENT, "kvPaddingSize = 1");
    FiaProblem t = fiaPacked("TND", {3}, {4}, 2, 2, 16);
    expectRejected(padded(t, -1, 0), ATTNOPS_ERROR_INVALID_ARGUMENT, "inputLayout TND");
    FiaProblem bnsdOut = fiaProblem("BSND_BNSD", 2, 8, 10, 2, 2, 64);
    bnsdOut.qLens = {3, 8};
    expectRejected(padded(bnsdOut, 0, -1), ATTNOPS_ERROR_INVALID_ARGUMENT, "inputLayout BSND_BNSD");
    FiaProblem pagedP = p;
    pagedP.cache = "BnNBsD";
    pagedP.layout = "BNSD";
    expectRejected(padded(pagedP, -1, 0), ATTNOPS_ERROR_INVALID_ARGUMENT, "paged cache");
}

// ---- Shared prefix ------------------------------------------------------------------------

FiaProblem prefixed(FiaProblem p, int64_t rows, int64_t len = -1) {
    p.prefixRows = rows;
    p.prefixLen = len;
    return p;
}

TEST(FiaAddressingPrefix, MatchesReference) {
    FiaProblem p = fiaProblem("BSH", 3, 6, 20, 4, 2, 16);
    p.kvLens = {9, 0, 20};
    for (const FiaProblem& m : {p, withMode(p, 1), withMode(p, 3), withMode(p, 4, 4, 0), withMode(p, 0, 2, 1)}) {
        expectMatches(prefixed(m, 7));
        expectMatches(prefixed(m, 7, 3));
    }
    FiaProblem dec = fiaProblem("BNSD", 2, 1, 30, 8, 2, 32);
    dec.kvLens = {0, 25};
    expectMatches(prefixed(dec, 40));
    expectMatches(prefixed(dec, 40, 0));
    dec.maskKind = "random";
    expectMatches(prefixed(dec, 33, 31));
    FiaProblem bsnd = fiaProblem("BSND", 2, 1, fia::kSplitKeys + 10, 4, 4, 64);
    bsnd.int8Kv = true;  // per-channel dequantisation applies to the prefix rows too
    expectMatches(prefixed(bsnd, fia::kSplitKeys - 3));
}

// With one batch the prefix rows followed by the batch's rows are the plain call's rows.
TEST(FiaAddressingPrefix, EqualsConcatenatedKv) {
    for (int64_t mode : {0, 3}) {
        for (const char* layout : {"BSH", "BNSD"}) {
            FiaProblem p = withMode(fiaProblem(layout, 1, 5, 24, 4, 2, 16), mode);
            p.kvLens = {19};
            const FiaProblem withPrefix = prefixed(p, 12, 9);
            FiaProblem plain = p;
            plain.kvSeqLen = 24 + 9;
            plain.kvLens = {19 + 9};
            const FiaInstance a = runDefault(withPrefix), b = runDefault(plain);
            EXPECT_EQ(a.attentionOut.bytes(), b.attentionOut.bytes()) << layout << " mode " << mode;
            EXPECT_EQ(a.softmaxLse.bytes(), b.softmaxLse.bytes()) << layout << " mode " << mode;
        }
    }
}

TEST(FiaAddressingPrefix, Rules) {
    FiaProblem p = prefixed(fiaProblem("BSND", 2, 4, 10, 2, 2, 16), 5);
    FiaInstance inst(p);
    expectRejected(planWith(inst, [](fia::Args& a) { a.valueSharedPrefix = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "valueSharedPrefix");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keySharedPrefix = inst.key.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keySharedPrefix.shape");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keySharedPrefix = inst.softmaxLse.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keySharedPrefix.dtype");
    expectRejected(prefixed(fiaProblem("BSND", 2, 4, 10, 2, 2, 16), 5, 6), ATTNOPS_ERROR_INVALID_ARGUMENT, "actualSharedPrefixLen[0] = 6");
    FiaProblem noTensors = fiaProblem("BSND", 2, 4, 10, 2, 2, 16);
    FiaInstance nt(noTensors);
    attnopsIntArray* len = nullptr;
    const int64_t one = 1;
    ASSERT_EQ(attnopsCreateIntArray(&one, 1, &len), ATTNOPS_SUCCESS);
    expectRejected(planWith(nt, [&](fia::Args& a) { a.actualSharedPrefixLen = len; }), ATTNOPS_ERROR_NULL_ARGUMENT, "keySharedPrefix");
    attnopsDestroyIntArray(len);
    FiaProblem padding = p;
    padding.kvLens = {4, 10};
    padding.kvPadding = 0;
    expectRejected(padding, ATTNOPS_ERROR_INVALID_ARGUMENT, "left padding");
    expectRejected(prefixed(fiaPacked("TND", {3}, {4}, 2, 2, 16), 2), ATTNOPS_ERROR_INVALID_ARGUMENT, "inputLayout TND");
    FiaProblem pagedP = prefixed(fiaProblem("BNSD", 2, 1, 10, 2, 2, 16), 3);
    pagedP.cache = "BnNBsD";
    expectRejected(pagedP, ATTNOPS_ERROR_INVALID_ARGUMENT, "paged cache");
    FiaProblem perToken = prefixed(fiaProblem("BNSD", 2, 1, 10, 2, 2, 32), 3);
    perToken.int8Kv = true;
    perToken.keyQuantMode = perToken.valueQuantMode = 1;
    expectRejected(perToken, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION, "per-token");
}

// ---- Tensor-list key/value ----------------------------------------------------------------

FiaProblem listed(FiaProblem p) {
    p.kvList = true;
    return p;
}

TEST(FiaAddressingTensorList, MatchesReference) {
    for (const char* layout : {"BSH", "BSND", "BNSD", "BNSD_NBSD"}) {
        FiaProblem dec = fiaProblem(layout, 3, 1, 50, 4, 2, 32);
        dec.kvLens = {50, 0, 17};
        expectMatches(listed(dec));
        FiaProblem pre = withMode(fiaProblem(layout, 2, 7, 20, 4, 1, 16), 3);
        pre.kvLens = {20, 9};
        expectMatches(listed(pre));
    }
    FiaProblem own = fiaProblem("BSND", 4, 3, 11, 2, 2, 16);  // no lengths: each batch its own S (11 + b % 3)
    expectMatches(listed(own));
    own.maskKind = "random";
    own.sparseMode = 1;
    expectMatches(listed(own));
    FiaProblem q = fiaProblem("BNSD", 2, 1, fia::kSplitKeys + 9, 2, 1, 32);
    q.kvLens = {fia::kSplitKeys + 9, 5};
    q.int8Kv = true;
    expectMatches(listed(q));
}

// A tensor list holding the same rows as one batched tensor gives the same bytes.
TEST(FiaAddressingTensorList, EqualsOneTensor) {
    for (const char* layout : {"BSH", "BNSD"}) {
        FiaProblem p = withMode(fiaProblem(layout, 3, 4, 30, 4, 2, 16), 3);
        p.kvLens = {30, 2, 0};
        const FiaInstance a = runDefault(listed(p)), b = runDefault(p);
        EXPECT_EQ(a.attentionOut.bytes(), b.attentionOut.bytes()) << layout;
        EXPECT_EQ(a.softmaxLse.bytes(), b.softmaxLse.bytes()) << layout;
    }
}

TEST(FiaAddressingTensorList, Rules) {
    FiaProblem p = fiaProblem("BSND", 3, 2, 10, 2, 2, 16);
    p.kvLens = {10, 4, 11};  // batch 2's tensor holds 12 rows
    FiaInstance inst(listed(p));
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    expectRejected(planWith(inst, [](fia::Args& a) { a.keyCount = a.valueCount = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "must equal the query's B = 3");
    expectRejected(planWith(inst, [](fia::Args& a) { a.valueCount = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "valueCount = 2");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keyCount = a.valueCount = 300; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "at most 256");
    const attnopsTensor* keys[3] = {inst.keyList[0].handle(), inst.keyList[1].handle(), inst.query.handle()};
    expectRejected(planWith(inst, [&](fia::Args& a) { a.key = keys; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "key[2].shape");
    keys[2] = nullptr;
    expectRejected(planWith(inst, [&](fia::Args& a) { a.key = keys; }), ATTNOPS_ERROR_NULL_ARGUMENT, "key[2]");
    const attnopsTensor* values[3] = {inst.valueList[0].handle(), inst.valueList[2].handle(), inst.valueList[2].handle()};
    expectRejected(planWith(inst, [&](fia::Args& a) { a.value = values; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "value[1].shape");
    FiaInstance tl(listed(p));
    tl.kvLensArg = {10, 6, 13};
    expectRejected(planWith(tl, [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "must be <= key[1]'s S = 5");
    FiaProblem withPad = listed(p);
    withPad.kvPadding = 0;
    expectRejected(withPad, ATTNOPS_ERROR_INVALID_ARGUMENT, "tensor-list");
    FiaProblem withPrefix = prefixed(listed(p), 3);
    expectRejected(withPrefix, ATTNOPS_ERROR_INVALID_ARGUMENT, "tensor-list");
}

// ---- Determinism --------------------------------------------------------------------------

std::vector<uint8_t> outputBytes(const FiaProblem& p) {
    const FiaInstance inst = runDefault(p);
    std::vector<uint8_t> bytes = inst.attentionOut.bytes();
    bytes.insert(bytes.end(), inst.softmaxLse.bytes().begin(), inst.softmaxLse.bytes().end());
    return bytes;
}

TEST(FiaAddressingDeterminism, SameBitsForAnyThreadCount) {
    attnops::testsupport::ThreadsGuard guard;
    FiaProblem list = fiaProblem("BSH_NBSD", 3, 1, fia::kSplitKeys + 50, 8, 2, 32);
    list.kvLens = {fia::kSplitKeys + 50, 3, 700};
    list.kvList = true;
    FiaProblem prefix = withMode(fiaProblem("BNSD", 2, 20, 300, 4, 1, 32), 3);
    prefix.prefixRows = 90;
    FiaProblem pad = withMode(fiaProblem("BSND", 2, 40, 200, 4, 2, 16), 1);
    pad.qLens = {33, 7};
    pad.kvLens = {150, 190};
    pad.queryPadding = 4;
    pad.kvPadding = 9;
    for (const FiaProblem& p : {list, prefix, pad, fiaPacked("NTD", {33, 1, 70}, {40, 90, 70}, 8, 2, 32)}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
        const std::vector<uint8_t> one = outputBytes(p);
        for (int32_t threads : {2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
            EXPECT_EQ(outputBytes(p), one) << threads << " threads: " << p.describe();
        }
    }
}
