// FusedInferAttentionScore MLA full quantisation (spec 9.2 "MLA full quant", queryQuantMode 3):
// an int8 query with per-token-per-head dequantScaleQuery, an int8 paged key (read as the value)
// with per-tensor key/valueAntiquantScale, bf16 rope parts and output. Against the double
// reference on layouts, cache formats, heads, query rows, lengths around the blocks and the
// masks of decode MLA; one case written out independently of the shared code (every scale
// indexed by hand from the raw tensors); determinism across threads; every bad operand a clear
// error naming it.
#include <gtest/gtest.h>

#include <cmath>
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
using attnops::testing::mlaDecode;
using attnops::testing::mlaFullQuant;
using attnops::testing::planWith;

namespace {

// `batch` requests of `qRows` query rows against `kvLen` cached tokens each, blocks of 128.
FiaProblem mlaQuant(const std::string& layout, const std::string& cache, int64_t batch, int64_t qRows, int64_t kvLen, int64_t heads) {
    FiaProblem p = mlaFullQuant(mlaDecode(layout, batch, qRows, heads, {}, cache, 128));
    p.kvSeqLen = kvLen;
    return p;
}

// The planner's choice: the first vector kernel this CPU runs (fia_simd_mlaquant_test.cpp tests
// them on every path), else tiled-generic.
std::string automaticKernel(const FiaProblem& p) {
    for (const char* impl : {"avx512", "avx2"}) {
        FiaInstance inst(p);
        testsupport::ForcedImpl force(impl);
        if (inst.run() == ATTNOPS_SUCCESS) return impl;
    }
    return "tiled-generic";
}

void expectMatchesReference(const FiaProblem& p) {
    attnops::testing::expectFiaMatchesReference(p, {"", "tiled-generic", "reference"}, automaticKernel(p));
}

}  // namespace

TEST(FiaMlaQuant, LayoutsCachesAndHeads) {
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"})
        for (const char* layout : {"BSH", "BSND"}) expectMatchesReference(mlaQuant(layout, cache, 2, 1, 200, 8));
    expectMatchesReference(mlaQuant("BNSD", "BnNBsD", 2, 1, 130, 4));  // BNSD: dequantScaleQuery [B, N, S]
    expectMatchesReference(mlaQuant("BSND", "NZ", 1, 1, 5, 1));        // one head
    expectMatchesReference(mlaQuant("BSND", "BnNBsD", 1, 1, 40, 32));  // 32 heads
}

TEST(FiaMlaQuant, LengthsRowsAndMasks) {
    FiaProblem lens = mlaQuant("BSND", "BnNBsD", 4, 1, 300, 4);
    lens.kvLens = {1, 128, 129, 0};  // block edges and an empty batch
    lens.maxBlocksPerSeq = 3;
    expectMatchesReference(lens);
    FiaProblem mtp = mlaQuant("BSH", "NZ", 2, 4, 150, 8);  // speculative decode: 4 query rows, causal
    mtp.sparseMode = 3;
    expectMatchesReference(mtp);
    FiaProblem win = mlaQuant("BSND", "BnBsH", 2, 3, 260, 2);
    win.sparseMode = 4;
    win.preTokens = 40;
    win.nextTokens = 0;
    expectMatchesReference(win);
    FiaProblem tnd = mlaQuant("TND", "BnNBsD", 1, 1, 1, 4);  // TND: dequantScaleQuery [T, N]
    tnd.qLens = {2, 1, 3};
    tnd.kvLens = {70, 1, 140};
    tnd.sparseMode = 3;
    tnd.lse = false;  // decode MLA with TND takes no softmaxLse
    expectMatchesReference(tnd);
}

// The maths written out from the raw tensors (BSND query [B, S, N, 512], dequantScaleQuery
// [B, S, N], BnNBsD cache [blocks, 1, bs, 512] through the block table): an error in the scale
// strides or the per-tensor scales shows up here even if the reference shared it.
TEST(FiaMlaQuant, IndependentOfTheSharedCode) {
    FiaProblem p = mlaQuant("BSND", "BnNBsD", 2, 2, 70, 2);
    p.blockSize = 32;
    p.sparseMode = 3;
    p.lse = false;
    FiaInstance inst(p);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const auto* q = static_cast<const int8_t*>(inst.query.data());
    const auto* qr = static_cast<const uint16_t*>(inst.queryRope.data());
    const auto* k = static_cast<const int8_t*>(inst.key.data());
    const auto* kr = static_cast<const uint16_t*>(inst.keyRope.data());
    const auto* dq = static_cast<const float*>(inst.dequantScaleQuery.data());
    const auto* table = static_cast<const int32_t*>(inst.blockTable.data());
    const auto* out = static_cast<const uint16_t*>(inst.attentionOut.data());
    const double sk = inst.keyScale.get(0), sv = inst.valueScale.get(0), scale = 1.0 / std::sqrt(576.0);
    const int64_t maxBlocks = inst.blockTable.shape()[1], bs = 32, S = 2, N = 2, D = 512, R = 64, kv = 70;
    double worst = 0, largest = 0;
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < S; ++i)
            for (int64_t n = 0; n < N; ++n) {
                const int64_t visible = kv - S + i + 1;  // sparse mode 3: bottom-right causal
                std::vector<double> s(static_cast<size_t>(visible));
                double mx = -INFINITY;
                for (int64_t t = 0; t < visible; ++t) {
                    const int64_t blk = table[b * maxBlocks + t / bs], slot = t % bs;
                    double dot = 0, rope = 0;
                    for (int64_t d = 0; d < D; ++d) dot += double(q[((b * S + i) * N + n) * D + d]) * k[(blk * bs + slot) * D + d];
                    for (int64_t d = 0; d < R; ++d)
                        rope += double(bf16ToFloat(qr[((b * S + i) * N + n) * R + d])) * bf16ToFloat(kr[(blk * bs + slot) * R + d]);
                    s[size_t(t)] = scale * (dot * double(dq[(b * S + i) * N + n]) * sk + rope);
                    mx = std::max(mx, s[size_t(t)]);
                }
                double sum = 0;
                for (double& x : s) sum += (x = std::exp(x - mx));
                for (int64_t c = 0; c < D; ++c) {
                    double o = 0;
                    for (int64_t t = 0; t < visible; ++t) {
                        const int64_t blk = table[b * maxBlocks + t / bs], slot = t % bs;
                        o += s[size_t(t)] * double(k[(blk * bs + slot) * D + c]) * sv;  // the key is the value
                    }
                    o /= sum;
                    const double got = bf16ToFloat(out[((b * S + i) * N + n) * D + c]);
                    worst = std::max(worst, std::fabs(got - o));
                    largest = std::max(largest, std::fabs(o));
                }
            }
    EXPECT_GT(largest, 0.05);
    EXPECT_LT(worst, largest * 0.02) << "largest " << largest;  // bf16 probabilities and output: ~2^-8 relative each
}

TEST(FiaMlaQuant, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    FiaProblem p = mlaQuant("BSND", "NZ", 3, 2, 1500, 4);
    p.sparseMode = 3;
    const auto bytes = [&] {
        FiaInstance inst(p);
        EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        return inst.attentionOut.bytes();
    };
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    const std::vector<uint8_t> one = bytes();
    for (int32_t threads : {2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        EXPECT_EQ(bytes(), one) << threads << " threads";
    }
}

TEST(FiaMlaQuant, BadOperands) {
    const FiaInstance inst(mlaQuant("BSND", "BnNBsD", 2, 1, 100, 4));
    ASSERT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    HostTensor two(ATTNOPS_FLOAT32, {2}), bf1(ATTNOPS_BFLOAT16, {1}), f1(ATTNOPS_FLOAT32, {1});
    f1.set(0, 0.01f);
    HostTensor dqHalf(ATTNOPS_BFLOAT16, inst.dequantScaleQuery.shape()), dqWrong(ATTNOPS_FLOAT32, {2, 1, 2});
    expectRejected(planWith(inst, [](fia::Args& a) { a.dequantScaleQuery = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "dequantScaleQuery");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.dequantScaleQuery = dqHalf.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "dequantScaleQuery.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.dequantScaleQuery = dqWrong.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "dequantScaleQuery.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.queryQuantMode = 0; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "queryQuantMode = 0");
    expectRejected(planWith(inst, [](fia::Args& a) { a.queryQuantMode = 2; }), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION, "queryQuantMode = 2");
    expectRejected(planWith(inst, [](fia::Args& a) { a.keyAntiquantScale = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "keyAntiquantScale");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.valueAntiquantScale = two.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "valueAntiquantScale.shape");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keyAntiquantScale = bf1.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantScale.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keyAntiquantOffset = f1.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantOffset");
    expectRejected(planWith(inst, [](fia::Args& a) { a.valueAntiquantMode = 1; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "valueAntiquantMode");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.deqScale1 = f1.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT, "deqScale1");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.keyRopeAntiquantScale = f1.handle(); }), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION,
                   "keyRopeAntiquantScale");
    // The rope must be bf16, the output the rope's dtype.
    HostTensor qr16(ATTNOPS_FLOAT16, inst.queryRope.shape()), out16(ATTNOPS_FLOAT16, inst.attentionOut.shape());
    expectRejected(planWith(inst, [&](fia::Args& a) { a.queryRope = qr16.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT, "attentionOut.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) {
                       a.queryRope = qr16.handle();
                       a.attentionOut = out16.handle();
                   }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "queryRope.dtype");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.attentionOut = out16.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.dtype");
    // A float query does not take the MLA quant operands; a bf16 MLA with int8 key/value needs an int8 query.
    FiaProblem plainP = mlaQuant("BSND", "BnNBsD", 2, 1, 100, 4);
    plainP.mlaFullQuant = false;
    plainP.int8Kv = false;
    const FiaInstance plain(plainP);
    expectRejected(planWith(plain, [&](fia::Args& a) { a.dequantScaleQuery = inst.dequantScaleQuery.handle(); }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "dequantScaleQuery");
    {
        const attnopsTensor* kv[2] = {inst.key.handle(), inst.value.handle()};
        expectRejected(planWith(plain, [&](fia::Args& a) {
                           a.key = &kv[0];
                           a.value = &kv[1];
                           a.keyRope = inst.keyRope.handle();
                       }),
                       ATTNOPS_ERROR_INVALID_ARGUMENT, "key.dtype");
    }
}
