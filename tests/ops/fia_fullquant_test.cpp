// FusedInferAttentionScore full int8 quantisation (spec 9.2, with the int8 output of 9.3): int8
// query/key/value against the double reference on many shapes (layouts, GQA, masks, actual
// lengths with empty batches, key counts around the 1024-key softmax blocks, pse, left padding,
// tensor-list key/value, uint64 "float19" scales); a hand-computed case that pins the rounding
// steps independently of the shared code; determinism across threads; and every bad operand a
// clear error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "core/dtype.hpp"
#include "fia_plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::testing::expectRejected;
using attnops::testing::planWith;

namespace {

FiaProblem fullQuant(const std::string& layout, int64_t batch, int64_t qSeqLen, int64_t kvSeqLen, int64_t heads, int64_t kvHeads,
                     int64_t dim) {
    FiaProblem p = attnops::testing::fiaProblem(layout, batch, qSeqLen, kvSeqLen, heads, kvHeads, dim);
    p.dtype = ATTNOPS_FLOAT16;
    p.int8Kv = true;
    p.fullQuant = true;
    return p;
}

// The automatic choice (tiled-generic) and the reference, each against the double reference.
void expectMatchesReference(const FiaProblem& p) {
    attnops::testing::expectFiaMatchesReference(p, {"", "tiled-generic", "reference"}, "tiled-generic");
}

std::vector<uint8_t> outputBytes(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    return inst.attentionOut.bytes();
}

}  // namespace

TEST(FiaFullQuant, LayoutsGqaAndBlockEdges) {
    for (const char* layout : {"BSH", "BSND", "BNSD", "BNSD_BSND"})
        expectMatchesReference(fullQuant(layout, 2, 17, 65, 4, 2, 32));
    expectMatchesReference(fullQuant("BNSD", 1, 2, 1, 8, 1, 64));     // one key, GQA 8
    expectMatchesReference(fullQuant("BSND", 1, 65, 64, 2, 2, 96));   // query rows over one unit
    // Keys around the 1024-key softmax blocks: the int8 probabilities follow the running max.
    for (int64_t kv : {1023, 1024, 1025, 2100}) expectMatchesReference(fullQuant("BNSD", 1, 3, kv, 2, 1, 32));
}

TEST(FiaFullQuant, MasksLengthsAndPse) {
    FiaProblem p = fullQuant("BSND", 3, 20, 50, 4, 2, 32);
    p.qLens = {20, 0, 7};
    p.kvLens = {50, 13, 0};
    expectMatchesReference(p);
    for (int64_t mode : {1, 2, 3, 4}) {
        FiaProblem m = fullQuant("BNSD", 2, 19, 40, 2, 1, 64);
        m.sparseMode = mode;
        if (mode == 4) {
            m.preTokens = 5;
            m.nextTokens = 2;
        }
        expectMatchesReference(m);  // mode 1: a random full mask with a fully masked row
    }
    for (const char* pse : {"batch", "shared"}) {
        FiaProblem w = fullQuant("BSH", 2, 5, 30, 2, 2, 32);
        w.pse = pse;
        w.sparseMode = 3;
        expectMatchesReference(w);
    }
    FiaProblem tnd = fullQuant("TND", 1, 1, 1, 4, 2, 32);
    tnd.qLens = {3, 0, 9};
    tnd.kvLens = {12, 5, 30};
    tnd.sparseMode = 3;
    expectMatchesReference(tnd);
}

TEST(FiaFullQuant, PaddingListsInt8OutAndUint64Scales) {
    FiaProblem pad = fullQuant("BSND", 2, 12, 40, 2, 1, 32);
    pad.qLens = {5, 9};
    pad.kvLens = {20, 33};
    pad.queryPadding = 2;
    pad.kvPadding = 3;
    expectMatchesReference(pad);
    FiaProblem list = fullQuant("BSH", 3, 4, 30, 2, 1, 32);
    list.kvList = true;
    expectMatchesReference(list);
    for (bool perChannel : {false, true}) {
        FiaProblem o = fullQuant("BNSD", 2, 6, 70, 4, 2, 32);
        o.int8Out = true;
        o.outQuantPerChannel = perChannel;
        o.lse = !perChannel;  // per-channel int8 output goes without softmaxLse
        expectMatchesReference(o);
    }
    FiaProblem u = fullQuant("BSND", 2, 9, 33, 2, 2, 32);
    u.deqScaleDType = ATTNOPS_UINT64;
    expectMatchesReference(u);
    // The same scales as fp32 holding the float19 values the uint64 words carry: the same bits
    // (fp32 deqScale2 is taken as given, so it is truncated here by hand).
    FiaProblem f = u;
    f.deqScaleDType = ATTNOPS_FLOAT32;
    FiaInstance fi(f);
    uint32_t bits;
    std::memcpy(&bits, fi.deqScale2.data(), sizeof bits);
    bits &= 0xffffe000u;
    std::memcpy(fi.deqScale2.data(), &bits, sizeof bits);
    ASSERT_EQ(fi.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(outputBytes(u), fi.attentionOut.bytes());
}

// deqScale1 is truncated to float19 whatever its dtype: fp32 low mantissa bits change nothing.
TEST(FiaFullQuant, DeqScale1TruncatedToFloat19) {
    const FiaProblem p = fullQuant("BSND", 1, 4, 20, 2, 1, 32);
    FiaInstance a(p), b(p);
    uint32_t bits;
    std::memcpy(&bits, b.deqScale1.data(), sizeof bits);
    bits |= 0x1fffu;
    std::memcpy(b.deqScale1.data(), &bits, sizeof bits);
    ASSERT_EQ(a.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    ASSERT_EQ(b.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(a.attentionOut.bytes(), b.attentionOut.bytes());
}

// The rounding steps of spec 9.2 written out by hand for one head, two query rows and 1100 keys:
// key 1050 (second block) has the largest score, so the first block's probabilities were
// quantised against a smaller running max and are rescaled, not requantised.
TEST(FiaFullQuant, HandComputedRoundingSteps) {
    constexpr int64_t kKeys = 1100, kDim = 32;
    FiaProblem p = fullQuant("BSND", 1, 2, kKeys, 1, 1, kDim);
    p.lse = true;
    FiaInstance inst(p);
    auto* q = static_cast<int8_t*>(inst.query.data());
    auto* k = static_cast<int8_t*>(inst.key.data());
    auto* v = static_cast<int8_t*>(inst.value.data());
    for (int64_t c = 0; c < 2 * kDim; ++c) q[c] = int8_t(c % kDim < 4 ? 3 : 0);  // both rows: q.k = 3 (k0+k1+k2+k3)
    for (int64_t t = 0; t < kKeys; ++t)
        for (int64_t c = 0; c < kDim; ++c) {
            k[t * kDim + c] = int8_t(c < 4 ? (t == 1050 ? 30 : int64_t(t % 7)) : 0);
            v[t * kDim + c] = int8_t((t * 3 + c) % 11 - 5);
        }
    const float deq1 = 0.01f, qs1 = 127.0f, deq2 = 0.5f;  // 0.01 truncated to float19 below
    std::memcpy(inst.deqScale1.data(), &deq1, 4);
    std::memcpy(inst.quantScale1.data(), &qs1, 4);
    std::memcpy(inst.deqScale2.data(), &deq2, 4);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();

    uint32_t bits;
    std::memcpy(&bits, &deq1, 4);
    bits &= 0xffffe000u;
    float deq1t;
    std::memcpy(&deq1t, &bits, 4);
    const float scale = roundTo(DType::F16, float(1.0 / std::sqrt(double(kDim))));
    std::vector<float> s(kKeys);
    for (int64_t t = 0; t < kKeys; ++t) {
        const int64_t dot = 3 * 4 * (t == 1050 ? 30 : t % 7);
        s[size_t(t)] = roundTo(DType::F16, roundTo(DType::F16, float(dot) * deq1t) * scale);
    }
    double m = -INFINITY, sum = 0;
    std::vector<double> acc(kDim, 0.0);
    for (int64_t blk = 0; blk < kKeys; blk += 1024) {
        float bm = -INFINITY;
        for (int64_t t = blk; t < std::min(kKeys, blk + 1024); ++t) bm = std::max(bm, s[size_t(t)]);
        const double mNew = std::max(m, double(bm)), alpha = std::isinf(m) ? 0.0 : std::exp(m - mNew);
        sum *= alpha;
        for (double& a : acc) a *= alpha;
        std::vector<int64_t> pv(kDim, 0);
        for (int64_t t = blk; t < std::min(kKeys, blk + 1024); ++t) {
            const float e = std::exp(s[size_t(t)] - float(mNew));
            sum += e;
            const int64_t p8 = int64_t(std::nearbyint(e * qs1));
            for (int64_t c = 0; c < kDim; ++c) pv[size_t(c)] += p8 * v[t * kDim + c];
        }
        for (int64_t c = 0; c < kDim; ++c) acc[size_t(c)] += double(float(pv[size_t(c)]) * deq2);
        m = mNew;
    }
    const auto* out = static_cast<const uint16_t*>(inst.attentionOut.data());
    const auto* lse = static_cast<const float*>(inst.softmaxLse.data());
    for (int64_t row = 0; row < 2; ++row) {
        for (int64_t c = 0; c < kDim; ++c) {
            const double want = acc[size_t(c)] / sum, got = f16ToFloat(out[row * kDim + c]);
            EXPECT_NEAR(got, want, std::fabs(want) * 1e-3 + 1e-6) << "row " << row << " col " << c;
        }
        EXPECT_NEAR(lse[row], std::log(sum) + m, 1e-5);
    }
    // The probabilities of the first block really were quantised against the smaller max: a
    // global-max model gives a different result.
    double gsum = 0;
    std::vector<double> gacc(kDim, 0.0);
    for (int64_t t = 0; t < kKeys; ++t) {
        const float e = std::exp(s[size_t(t)] - float(m));
        gsum += e;
        for (int64_t c = 0; c < kDim; ++c) gacc[size_t(c)] += std::nearbyint(e * qs1) * deq2 * v[t * kDim + c];
    }
    double diff = 0;
    for (int64_t c = 0; c < kDim; ++c) diff = std::max(diff, std::fabs(gacc[size_t(c)] / gsum - acc[size_t(c)] / sum));
    EXPECT_GT(diff, 1e-3);
}

TEST(FiaFullQuant, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    const FiaProblem p = fullQuant("BNSD", 3, 40, 1500, 4, 2, 32);
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    const std::vector<uint8_t> one = outputBytes(p);
    for (int32_t threads : {2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        EXPECT_EQ(outputBytes(p), one) << threads << " threads";
    }
}

TEST(FiaFullQuant, BadOperands) {
    const FiaInstance inst(fullQuant("BSND", 2, 4, 40, 2, 1, 32));
    HostTensor two(ATTNOPS_FLOAT32, {2}), half(ATTNOPS_FLOAT16, {1}), u64(ATTNOPS_UINT64, {1}), scale(ATTNOPS_FLOAT32, {1});
    scale.set(0, 0.5f);
    expectRejected(planWith(inst, [](fia::Args& a) { a.deqScale1 = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "deqScale1");
    expectRejected(planWith(inst, [](fia::Args& a) { a.quantScale1 = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "quantScale1");
    expectRejected(planWith(inst, [](fia::Args& a) { a.deqScale2 = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "deqScale2");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.deqScale2 = two.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "deqScale2.shape");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.deqScale1 = half.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "deqScale1.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.quantScale1 = u64.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "quantScale1.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keyAntiquantScale = scale.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantScale");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.dequantScaleQuery = scale.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "dequantScaleQuery");  // MLA full quantisation only (fia_mlaquant_test.cpp)
    // A float key with an int8 query, a float query with the full-quant scales.
    const FiaInstance plain([] {
        FiaProblem p = fullQuant("BSND", 2, 4, 40, 2, 1, 32);
        p.fullQuant = false;
        p.int8Kv = false;
        return p;
    }());
    expectRejected(planWith(plain, [&](fia::Args& a) { a.deqScale1 = scale.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "deqScale1");
    {
        const attnopsTensor* kv[2] = {plain.key.handle(), plain.value.handle()};
        expectRejected(planWith(inst, [&](fia::Args& a) {
                           a.key = &kv[0];
                           a.value = &kv[1];
                       }),
                       ATTNOPS_ERROR_INVALID_ARGUMENT, "key.dtype");
    }
    // The cases the operator does not define with an int8 query.
    FiaProblem dec = fullQuant("BSND", 2, 1, 40, 2, 1, 32);
    expectRejected(planWith(FiaInstance(dec), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "Q_S > 1");
    FiaProblem odd = fullQuant("BSND", 2, 4, 40, 2, 1, 48);
    expectRejected(planWith(FiaInstance(odd), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "multiple of 32");
    FiaProblem pre = fullQuant("BSND", 1, 4, 40, 2, 1, 32);
    pre.prefixRows = 8;
    expectRejected(planWith(FiaInstance(pre), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "keySharedPrefix");
    FiaProblem pa = fullQuant("BSND", 1, 4, 64, 2, 1, 32);
    pa.cache = "BnNBsD";
    pa.blockSize = 32;
    expectRejected(planWith(FiaInstance(pa), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "blockTable");
    HostTensor bf(ATTNOPS_BFLOAT16, fiaOutputShape(inst.problem, 4));
    expectRejected(planWith(inst, [&](fia::Args& a) { a.attentionOut = bf.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.dtype");
    FiaProblem pseBad = fullQuant("BSND", 1, 4, 40, 2, 1, 32);
    pseBad.pse = "batch";
    pseBad.dtype = ATTNOPS_BFLOAT16;  // a bf16 pse (the output stays fp16 below)
    FiaInstance pb(pseBad);
    HostTensor out16(ATTNOPS_FLOAT16, fiaOutputShape(pseBad, 4));
    expectRejected(planWith(pb, [&](fia::Args& a) { a.attentionOut = out16.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "pseShift.dtype");
    // A SIMD kernel forced onto full quantisation refuses it.
    for (const char* impl : {"avx2", "avx512"}) {
        FiaInstance run(inst.problem);
        testsupport::ForcedImpl force(impl);
        const attnopsStatus st = run.run();
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        EXPECT_EQ(st, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) << impl;
        EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("full int8"), std::string::npos) << attnopsGetLastErrorMessage();
    }
}
