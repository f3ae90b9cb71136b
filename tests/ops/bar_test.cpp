// BlockAttentionResiduals and its grad: forward and backward against the double reference over
// shapes, dtypes, layouts and strided views; edge cases (T = 0, N = 0 in the grad, H = 1,
// NaN/Inf); the identities of the spec (section 3); the reference backward against central
// finite differences; determinism over thread counts, runs and forced implementations; the grad
// as the first call of a fresh process; and every validation rule.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "core/dtype.hpp"
#include "ops/block_attention_residuals/check.hpp"
#include "ops/block_attention_residuals/plan.hpp"
#include "ops/block_attention_residuals/reference.hpp"
#include "child_process.hpp"
#include "forced_impl.hpp"
#include "problem_bar.hpp"
#include "threads_guard.hpp"

extern char** environ;

namespace {

using attnops::testing::expectChildPasses;
using attnops::testing::isChild;
using attnops::testing::runChild;

using attnops::tools::BarCheck;
using attnops::tools::BarInstance;
using attnops::tools::BarProblem;
using attnops::tools::HostTensor;
using attnops::tools::launchAndWait;
namespace bar = attnops::bar;

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
const float kNaNf = std::numeric_limits<float>::quiet_NaN();
const float kInff = std::numeric_limits<float>::infinity();

std::string lastError() { return attnopsGetLastErrorMessage(); }
attnops::DType dtypeOf(attnopsDataType d) { return attnops::DType(int32_t(d)); }
const char* dtypeName(attnopsDataType d) { return attnopsDataTypeName(d); }
// Half an ulp of the dtype at 1 (0 for fp32 outputs, whose rounding the fp32 bounds include).
double unitRoundoff(attnopsDataType d) {
    return d == BF16 ? std::ldexp(1.0, -9) : d == F16 ? std::ldexp(1.0, -12) : std::ldexp(1.0, -24);
}

BarProblem makeProblem(attnopsDataType dtype, int64_t tokens, int64_t blocks, int64_t hidden, double eps = 1e-6) {
    BarProblem p;
    p.dtype = dtype;
    p.tokens = tokens;
    p.blocks = blocks;
    p.hidden = hidden;
    p.eps = eps;
    return p;
}

std::string describe(const BarProblem& p) {
    return p.describe() + (p.projWeight2d ? " projWeight[1,H]" : " projWeight[H]") + " scale=" + std::to_string(p.dataScale) +
           " seed=" + std::to_string(p.dataSeed);
}

// ---------------------------------------------------------------- calls


bar::ForwardArgs forwardArgs(const BarInstance& inst, int64_t validBlockNum = -1, bool needBackward = true) {
    return bar::ForwardArgs{inst.partialBlock.handle(), inst.blockRes.handle(), inst.projWeight.handle(),
                            inst.normWeight.handle(), validBlockNum, inst.problem.eps, needBackward,
                            inst.hiddenStates.handle(), inst.invNorm.handle(), inst.probs.handle()};
}

bar::BackwardArgs backwardArgs(const BarInstance& inst, int64_t validBlockNum = -1) {
    return bar::BackwardArgs{inst.partialBlock.handle(), inst.blockRes.handle(), inst.projWeight.handle(),
                             inst.normWeight.handle(), inst.gradHiddenStates.handle(), inst.invNorm.handle(),
                             inst.probs.handle(), validBlockNum, inst.gradPartialBlock.handle(), inst.gradBlockRes.handle(),
                             inst.gradProjWeight.handle(), inst.gradNormWeight.handle()};
}

attnopsStatus runForward(const bar::ForwardArgs& a, attnopsStream* stream = nullptr) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsBlockAttentionResidualsGetWorkspaceSize(
        a.partialBlock, a.blockRes, a.projWeight, a.normWeight, a.validBlockNum, a.normEps, a.needBackward,
        a.hiddenStates, a.invNorm, a.probs, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsBlockAttentionResiduals, stream);
}

attnopsStatus runGrad(const bar::BackwardArgs& a, attnopsStream* stream = nullptr) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsBlockAttentionResidualsGradGetWorkspaceSize(
        a.partialBlock, a.blockRes, a.projWeight, a.normWeight, a.gradHiddenStates, a.invNorm, a.probs,
        a.validBlockNum, a.gradPartialBlock, a.gradBlockRes, a.gradProjWeight, a.gradNormWeight, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsBlockAttentionResidualsGrad, stream);
}

// The saved statistics of the double reference forward (rounded to fp32), without calling attnops.
void fillStatsFromReference(BarInstance& inst) {
    const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
    const int64_t k = bp.src.blocks + 1;
    for (int64_t t = 0; t < bp.src.tokens; ++t) {
        const bar::ReferenceToken r = bar::referenceForwardToken(bp.src, inst.problem.eps, t);
        for (int64_t i = 0; i < k; ++i) {
            inst.invNorm.set(t * k + i, float(r.invNorm[size_t(i)]));
            inst.probs.set(t * k + i, float(r.probs[size_t(i)]));
        }
    }
}

void fillAll(HostTensor& t, float v) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
}

// Forward with statistics and the grad, each against the double reference.
void expectForwardAndGradChecked(BarInstance& inst) {
    ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
    const BarCheck f = attnops::tools::checkBarForward(inst);
    EXPECT_TRUE(f.passed) << "forward: " << f.failure;
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    const BarCheck b = attnops::tools::checkBarBackward(inst);
    EXPECT_TRUE(b.passed) << "backward: " << b.failure;
}

void expectProblemChecked(const BarProblem& p) {
    SCOPED_TRACE(describe(p));
    BarInstance inst(p);
    expectForwardAndGradChecked(inst);
}

// ================================================================ 1. matrix against the reference

const double kEps[3] = {1e-6, 1e-2, 0.3};
const double kScales[3] = {1.0, 0.05, 8.0};

class BarMatrix : public ::testing::TestWithParam<attnopsDataType> {
protected:
    // Varies eps, data scale, projWeight's shape and the seed with the case index.
    BarProblem variant(int64_t t, int64_t n, int64_t h, bool sourceMajor) {
        BarProblem p = makeProblem(GetParam(), t, n, h, kEps[index_ % 3]);
        p.dataScale = kScales[(index_ / 3) % 3];
        p.projWeight2d = index_ % 2 == 1;
        p.sourceMajor = sourceMajor;
        p.dataSeed = uint64_t(100 + index_);
        ++index_;
        return p;
    }
    int64_t index_ = 0;
};

TEST_P(BarMatrix, SmallShapesBothLayouts) {
    for (int64_t n : {1, 2, 8, 33})
        for (int64_t h : {1, 15, 16, 17, 255})
            for (int64_t t : {1, 37})
                for (bool sourceMajor : {false, true}) expectProblemChecked(variant(t, n, h, sourceMajor));
}

TEST_P(BarMatrix, ThousandTokens) {
    for (int64_t n : {1, 2, 8})
        for (int64_t h : {1, 15, 16, 17})
            expectProblemChecked(variant(1000, n, h, n % 2 == 0));
    for (bool sourceMajor : {false, true}) expectProblemChecked(variant(1000, 8, 255, sourceMajor));
    expectProblemChecked(variant(1000, 33, 255, GetParam() != F16));
}

TEST_P(BarMatrix, LargeBlockCounts) {
    // No cap on N (upstream: 100 forward, 128 backward).
    for (int64_t h : {1, 16, 17, 255})
        for (int64_t t : {1, 37}) expectProblemChecked(variant(t, 200, h, h % 2 == 1));
    expectProblemChecked(variant(1000, 200, 16, true));
    expectProblemChecked(variant(3, 1000, 9, false));
}

TEST_P(BarMatrix, WideHidden) {
    // H = 4096 with a few tokens, around the backward's 1 MiB tile ((N+1) * H fp32 values kept
    // between its two passes): N = 63 fits exactly, N = 64 and 200 re-read the rows.
    for (int64_t n : {1, 2, 8, 33})
        for (int64_t t : {1, 3}) expectProblemChecked(variant(t, n, 4096, t == 3));
    for (int64_t n : {63, 64, 200}) expectProblemChecked(variant(2, n, 4096, n != 64));
    expectProblemChecked(variant(5, 3, 1023, false));
    expectProblemChecked(variant(5, 3, 1025, true));
}

TEST_P(BarMatrix, PeakedSoftmax) {
    // One probability close to 1 (the others between 1e-7 and 1e-3): a_i - a-bar then cancels to
    // a few ulps of a-bar, which an fp32 a-bar turns into % errors of the weight gradients. The
    // pseudo-query is scaled so that token 0's two largest logits are `gap` apart.
    for (int64_t n : {1, 2, 5})
        for (int64_t h : {64, 255})
            for (int64_t t : {1, 3})
                for (double gap : {7.0, 10.0, 13.0, 15.5}) {
                    BarProblem p = variant(t, n, h, n == 2);
                    BarInstance inst(p);
                    const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
                    std::vector<double> logp = bar::referenceForwardToken(bp.src, p.eps, 0).probs;
                    for (double& x : logp) x = std::log(x);
                    std::sort(logp.begin(), logp.end(), std::greater<>());
                    const double gain = gap / (logp[0] - logp[1]);
                    SCOPED_TRACE(describe(p) + " logit gap " + std::to_string(gap));
                    for (int64_t e = 0; e < h; ++e) inst.projWeight.set(e, float(inst.projWeight.get(e) * gain));
                    expectForwardAndGradChecked(inst);
                }
}

TEST_P(BarMatrix, SamePlanDifferentEps) {
    // The plan cache key has no eps: the eps of each call must reach its kernel.
    for (double eps : {1e-6, 0.3, 1e-2, 1e-6}) {
        BarProblem p = makeProblem(GetParam(), 40, 3, 48, eps);
        p.dataScale = 0.1;
        expectProblemChecked(p);
    }
}

std::string dtypeParamName(const ::testing::TestParamInfo<attnopsDataType>& p) { return dtypeName(p.param); }
INSTANTIATE_TEST_SUITE_P(Dtypes, BarMatrix, ::testing::Values(F32, F16, BF16), dtypeParamName);

// ================================================================ 1b. strided views

// A view over its own buffer with arbitrary strides; the buffer's other elements (and a tail past
// the view's last element) hold a fill pattern, so that writes outside the view are seen.
class View {
public:
    View(attnopsDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides)
        : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
        int64_t span = 1;
        for (size_t i = 0; i < shape_.size(); ++i) span += (shape_[i] - 1) * strides_[i];
        elements_ = span + 7;
        bytes_.assign(size_t(elements_) * attnopsDataTypeSize(dtype), kFill);
        EXPECT_EQ(attnopsCreateTensor(bytes_.data(), dtype, int64_t(shape_.size()), shape_.data(), strides_.data(),
                                      ATTNOPS_HOST_MEMORY, &handle_),
                  ATTNOPS_SUCCESS)
            << lastError();
    }
    ~View() { attnopsDestroyTensor(handle_); }
    View(const View&) = delete;
    View& operator=(const View&) = delete;

    attnopsTensor* h() const { return handle_; }
    int64_t offset(const std::vector<int64_t>& idx) const {
        int64_t off = 0;
        for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides_[i];
        return off;
    }
    float get(const std::vector<int64_t>& idx) const { return attnops::loadAsFloat(bytes_.data(), offset(idx), dtypeOf(dtype_)); }
    void set(const std::vector<int64_t>& idx, float v) { attnops::storeFromFloat(bytes_.data(), offset(idx), dtypeOf(dtype_), v); }
    void forEach(const std::function<void(const std::vector<int64_t>&)>& f) const {
        std::vector<int64_t> idx(shape_.size(), 0);
        for (int64_t s : shape_)
            if (s == 0) return;
        for (;;) {
            f(idx);
            size_t d = shape_.size();
            while (d > 0) {
                --d;
                if (++idx[d] < shape_[d]) break;
                idx[d] = 0;
                if (d == 0) return;
            }
            if (shape_.empty()) return;
        }
    }
    // Every element the view does not cover still holds the fill pattern.
    bool untouchedOutside() const {
        std::vector<bool> inside(size_t(elements_), false);
        forEach([&](const std::vector<int64_t>& idx) { inside[size_t(offset(idx))] = true; });
        const size_t es = attnopsDataTypeSize(dtype_);
        for (int64_t e = 0; e < elements_; ++e)
            if (!inside[size_t(e)])
                for (size_t b = 0; b < es; ++b)
                    if (bytes_[size_t(e) * es + b] != kFill) return false;
        return true;
    }

private:
    static constexpr uint8_t kFill = 0x5A;
    attnopsDataType dtype_;
    std::vector<int64_t> shape_, strides_;
    int64_t elements_ = 0;
    std::vector<uint8_t> bytes_;
    attnopsTensor* handle_ = nullptr;
};

bool sameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Strided views of every tensor hold the values of a contiguous instance; the op must give the
// same bits (the kernels' arithmetic does not depend on strides) and write nothing outside.
void expectStridedMatchesContiguous(attnopsDataType dtype, int64_t tt, int64_t n, int64_t hh, bool broadcast) {
    SCOPED_TRACE(std::string(dtypeName(dtype)) + " T=" + std::to_string(tt) + " N=" + std::to_string(n) +
                 " H=" + std::to_string(hh) + (broadcast ? " broadcast inputs" : " strided"));
    BarProblem p = makeProblem(dtype, tt, n, hh, 1e-2);
    p.projWeight2d = true;
    BarInstance base(p);
    const int64_t k = n + 1;
    if (broadcast)  // every token shares token 0's blocks and gradient row
        for (int64_t t = 1; t < tt; ++t)
            for (int64_t h = 0; h < hh; ++h) {
                for (int64_t i = 0; i < n; ++i) base.blockRes.set({t, i, h}, base.blockRes.get({0, i, h}));
                base.gradHiddenStates.set(t * hh + h, base.gradHiddenStates.get(h));
            }
    expectForwardAndGradChecked(base);
    if (::testing::Test::HasFatalFailure()) return;

    View pb(dtype, {tt, hh}, {2 * hh, 1});                  // every other row of a [2T, H] buffer
    View br = broadcast ? View(dtype, {tt, n, hh}, {0, hh, 1})           // one [N,H] for all tokens
                        : View(dtype, {tt, n, hh}, {n, 1, tt * n});     // an [H,T,N] buffer
    View pw(dtype, {1, hh}, {2 * hh, 2});
    View nw(dtype, {hh}, {3});
    View out(dtype, {tt, hh}, {hh + 3, 1});
    View inv(F32, {tt, k}, {1, tt});                        // transposed statistics
    View pr(F32, {tt, k}, {1, tt + 2});
    View dy = broadcast ? View(dtype, {tt, hh}, {0, 1}) : View(dtype, {tt, hh}, {1, tt});
    View dpb(dtype, {tt, hh}, {2 * hh, 2});
    View dbr(dtype, {tt, n, hh}, {hh, tt * hh, 1});          // source-major gradient
    View dpw(dtype, {1, hh}, {hh, 2});
    View dnw(dtype, {hh}, {2});
    pb.forEach([&](const std::vector<int64_t>& i) { pb.set(i, base.partialBlock.get(i[0] * hh + i[1])); });
    br.forEach([&](const std::vector<int64_t>& i) { br.set(i, base.blockRes.get(i)); });
    pw.forEach([&](const std::vector<int64_t>& i) { pw.set(i, base.projWeight.get(i[1])); });
    nw.forEach([&](const std::vector<int64_t>& i) { nw.set(i, base.normWeight.get(i[0])); });
    dy.forEach([&](const std::vector<int64_t>& i) { dy.set(i, base.gradHiddenStates.get(i[0] * hh + i[1])); });

    ASSERT_EQ(runForward(bar::ForwardArgs{pb.h(), br.h(), pw.h(), nw.h(), -1, p.eps, true, out.h(), inv.h(), pr.h()}),
              ATTNOPS_SUCCESS)
        << lastError();
    ASSERT_EQ(runGrad(bar::BackwardArgs{pb.h(), br.h(), pw.h(), nw.h(), dy.h(), inv.h(), pr.h(), -1, dpb.h(), dbr.h(),
                                        dpw.h(), dnw.h()}),
              ATTNOPS_SUCCESS)
        << lastError();

    int mismatches = 0;
    auto expectSame = [&](const char* what, float got, float want) {
        if (!sameBits(got, want) && ++mismatches <= 5) ADD_FAILURE() << what << ": " << got << " != " << want;
    };
    out.forEach([&](const std::vector<int64_t>& i) { expectSame("hiddenStates", out.get(i), base.hiddenStates.get(i[0] * hh + i[1])); });
    inv.forEach([&](const std::vector<int64_t>& i) { expectSame("invNorm", inv.get(i), base.invNorm.get(i[0] * k + i[1])); });
    pr.forEach([&](const std::vector<int64_t>& i) { expectSame("probs", pr.get(i), base.probs.get(i[0] * k + i[1])); });
    dpb.forEach([&](const std::vector<int64_t>& i) { expectSame("gradPartialBlock", dpb.get(i), base.gradPartialBlock.get(i[0] * hh + i[1])); });
    dbr.forEach([&](const std::vector<int64_t>& i) { expectSame("gradBlockRes", dbr.get(i), base.gradBlockRes.get((i[0] * n + i[1]) * hh + i[2])); });
    dpw.forEach([&](const std::vector<int64_t>& i) { expectSame("gradProjWeight", dpw.get(i), base.gradProjWeight.get(i[1])); });
    dnw.forEach([&](const std::vector<int64_t>& i) { expectSame("gradNormWeight", dnw.get(i), base.gradNormWeight.get(i[0])); });
    EXPECT_EQ(mismatches, 0);
    for (const View* v : {&out, &inv, &pr, &dpb, &dbr, &dpw, &dnw})
        EXPECT_TRUE(v->untouchedOutside()) << "an output was written outside its view";
}

TEST(BarStrided, ViewsGiveTheContiguousBits) {
    for (attnopsDataType d : {F32, F16, BF16}) {
        expectStridedMatchesContiguous(d, 37, 5, 33, false);
        expectStridedMatchesContiguous(d, 9, 2, 300, false);
        expectStridedMatchesContiguous(d, 21, 4, 40, true);
        // Several 64-column blocks and a 40-column tail: on fp16/bf16 the contiguous run's forward
        // reads its rows again in the weighting pass, the strided run weighs fp32 copies.
        expectStridedMatchesContiguous(d, 5, 3, 1000, false);
    }
}

TEST(BarStrided, SourceMajorCacheGivesTheTokenMajorBits) {
    // The same values in a [N,T,H] cache viewed as [T,N,H] and in a token-major tensor.
    for (attnopsDataType d : {F32, BF16}) {
        BarProblem p = makeProblem(d, 50, 6, 70, 1e-6);
        BarInstance tokenMajor(p);
        p.sourceMajor = true;
        BarInstance sourceMajor(p);
        for (int64_t t = 0; t < p.tokens; ++t)
            for (int64_t i = 0; i < p.blocks; ++i)
                for (int64_t h = 0; h < p.hidden; ++h) sourceMajor.blockRes.set({t, i, h}, tokenMajor.blockRes.get({t, i, h}));
        for (BarInstance* inst : {&tokenMajor, &sourceMajor}) {
            ASSERT_EQ(inst->runForward(true), ATTNOPS_SUCCESS) << lastError();
            ASSERT_EQ(inst->runBackward(), ATTNOPS_SUCCESS) << lastError();
        }
        EXPECT_EQ(tokenMajor.hiddenStates.bytes(), sourceMajor.hiddenStates.bytes());
        EXPECT_EQ(tokenMajor.probs.bytes(), sourceMajor.probs.bytes());
        EXPECT_EQ(tokenMajor.gradBlockRes.bytes(), sourceMajor.gradBlockRes.bytes());
        EXPECT_EQ(tokenMajor.gradProjWeight.bytes(), sourceMajor.gradProjWeight.bytes());
    }
}

// ================================================================ 2. edge cases

TEST(BarEdge, EmptyTokens) {
    for (attnopsDataType d : {F32, F16, BF16})
        for (bool proj2d : {false, true}) {
            BarProblem p = makeProblem(d, 0, 3, 17);
            p.projWeight2d = proj2d;
            SCOPED_TRACE(describe(p));
            BarInstance inst(p);
            EXPECT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
            EXPECT_EQ(inst.runForward(false), ATTNOPS_SUCCESS) << lastError();
            fillAll(inst.gradProjWeight, 7.0f);
            fillAll(inst.gradNormWeight, -7.0f);
            ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
            for (int64_t h = 0; h < p.hidden; ++h) {
                EXPECT_EQ(inst.gradProjWeight.get(h), 0.0f) << h;
                EXPECT_EQ(inst.gradNormWeight.get(h), 0.0f) << h;
            }
        }
}

// H = 0 (accepted, section 0): empty rows with NULL data. Found by the fuzzer: the prefetch of the
// next source did pointer arithmetic on the NULL base (UBSan). Probabilities are uniform, as
// every score is 0.
TEST(BarEdge, EmptyHiddenSize) {
    for (attnopsDataType d : {F32, BF16}) {
        BarProblem p = makeProblem(d, 5, 3, 0);
        SCOPED_TRACE(describe(p));
        BarInstance inst(p);
        ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
        for (int64_t t = 0; t < p.tokens; ++t)
            for (int64_t i = 0; i <= p.blocks; ++i) EXPECT_EQ(inst.probs.get(t * (p.blocks + 1) + i), 0.25f);
        EXPECT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    }
}

TEST(BarEdge, NoBlocksInTheGrad) {
    // N = 0: p = 1, so dv = dy exactly and the weight gradients are 0 (spec section 3).
    for (attnopsDataType d : {F32, F16, BF16})
        for (int64_t t : {1, 37, 1000})
            for (int64_t valid : {-1, 0}) {
                BarProblem p = makeProblem(d, t, 0, t == 1000 ? 17 : 65, 1e-2);
                p.projWeight2d = t == 37;
                SCOPED_TRACE(describe(p) + " validBlockNum=" + std::to_string(valid));
                BarInstance inst(p);
                fillStatsFromReference(inst);
                for (int64_t tt = 0; tt < t; ++tt) ASSERT_EQ(inst.probs.get(tt), 1.0f);
                fillAll(inst.gradProjWeight, 7.0f);
                fillAll(inst.gradNormWeight, 7.0f);
                fillAll(inst.gradPartialBlock, 7.0f);
                ASSERT_EQ(runGrad(backwardArgs(inst, valid)), ATTNOPS_SUCCESS) << lastError();
                EXPECT_EQ(inst.gradPartialBlock.bytes(), inst.gradHiddenStates.bytes());
                for (int64_t h = 0; h < p.hidden; ++h) {
                    EXPECT_EQ(inst.gradProjWeight.get(h), 0.0f) << h;
                    EXPECT_EQ(inst.gradNormWeight.get(h), 0.0f) << h;
                }
                const BarCheck b = attnops::tools::checkBarBackward(inst);
                EXPECT_TRUE(b.passed) << b.failure;
            }
}

TEST(BarEdge, ValidBlockNumValuesGiveTheSameResult) {
    BarProblem p = makeProblem(BF16, 29, 4, 40, 1e-2);
    BarInstance inst(p);
    ASSERT_EQ(runForward(forwardArgs(inst, -1)), ATTNOPS_SUCCESS) << lastError();
    const std::vector<uint8_t> hidden = inst.hiddenStates.bytes(), probs = inst.probs.bytes();
    fillAll(inst.hiddenStates, 0.0f);
    ASSERT_EQ(runForward(forwardArgs(inst, 4)), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(inst.hiddenStates.bytes(), hidden);
    EXPECT_EQ(inst.probs.bytes(), probs);
    std::vector<uint8_t> grads[3];
    for (int j = 0; j < 3; ++j) {
        const int64_t valid = j == 0 ? -1 : j == 1 ? 0 : 4;
        fillAll(inst.gradBlockRes, 0.0f);
        ASSERT_EQ(runGrad(backwardArgs(inst, valid)), ATTNOPS_SUCCESS) << lastError();
        grads[j] = inst.gradBlockRes.bytes();
        grads[j].insert(grads[j].end(), inst.gradProjWeight.bytes().begin(), inst.gradProjWeight.bytes().end());
    }
    EXPECT_EQ(grads[0], grads[1]);
    EXPECT_EQ(grads[0], grads[2]);
}

TEST(BarEdge, NeedBackwardFalseLeavesTheStatisticsAlone) {
    for (attnopsDataType d : {F32, F16}) {
        BarProblem p = makeProblem(d, 33, 3, 50);
        BarInstance inst(p);
        ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
        const std::vector<uint8_t> hidden = inst.hiddenStates.bytes();
        fillAll(inst.hiddenStates, 0.0f);
        fillAll(inst.invNorm, 42.0f);
        fillAll(inst.probs, 42.0f);
        const std::vector<uint8_t> inv = inst.invNorm.bytes(), probs = inst.probs.bytes();
        ASSERT_EQ(inst.runForward(false), ATTNOPS_SUCCESS) << lastError();
        EXPECT_EQ(inst.hiddenStates.bytes(), hidden);
        EXPECT_EQ(inst.invNorm.bytes(), inv);
        EXPECT_EQ(inst.probs.bytes(), probs);
        // Without statistics tensors at all.
        fillAll(inst.hiddenStates, 0.0f);
        bar::ForwardArgs a = forwardArgs(inst, -1, false);
        a.invNorm = a.probs = nullptr;
        ASSERT_EQ(runForward(a), ATTNOPS_SUCCESS) << lastError();
        EXPECT_EQ(inst.hiddenStates.bytes(), hidden);
    }
}

TEST(BarEdge, UserStream) {
    attnopsStream* stream = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&stream), ATTNOPS_SUCCESS) << lastError();
    BarInstance inst(makeProblem(F16, 100, 5, 64));
    EXPECT_EQ(inst.runForward(true, stream), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(inst.runBackward(stream), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(attnops::tools::checkBarForward(inst).passed);
    EXPECT_TRUE(attnops::tools::checkBarBackward(inst).passed);
    EXPECT_EQ(attnopsStreamDestroy(stream), ATTNOPS_SUCCESS) << lastError();
}

// ---------------------------------------------------------------- NaN / Inf

enum class Stage { BeforeForward, BeforeGrad };

struct Poison {
    const char* what;
    Stage stage;
    std::function<void(BarInstance&)> apply;
};

std::vector<Poison> poisons() {
    return {
        {"NaN in blockRes", Stage::BeforeForward, [](BarInstance& x) { x.blockRes.set({1, 0, 3}, kNaNf); }},
        {"+Inf in partialBlock", Stage::BeforeForward, [](BarInstance& x) { x.partialBlock.set(3 * x.problem.hidden, kInff); }},
        {"-Inf in blockRes", Stage::BeforeForward,
         [](BarInstance& x) { x.blockRes.set({5, x.problem.blocks - 1, x.problem.hidden - 1}, -kInff); }},
        {"NaN in projWeight", Stage::BeforeForward, [](BarInstance& x) { x.projWeight.set(2, kNaNf); }},
        {"+Inf in normWeight", Stage::BeforeForward, [](BarInstance& x) { x.normWeight.set(0, kInff); }},
        {"NaN in gradHiddenStates", Stage::BeforeGrad, [](BarInstance& x) { x.gradHiddenStates.set(2 * x.problem.hidden + 5, kNaNf); }},
        {"+Inf in gradHiddenStates", Stage::BeforeGrad, [](BarInstance& x) { x.gradHiddenStates.set(4 * x.problem.hidden, kInff); }},
        {"NaN in probs", Stage::BeforeGrad, [](BarInstance& x) { x.probs.set(6 * (x.problem.blocks + 1) + 1, kNaNf); }},
        {"+Inf in invNorm", Stage::BeforeGrad, [](BarInstance& x) { x.invNorm.set(7 * (x.problem.blocks + 1), kInff); }},
    };
}

// got is NaN / +Inf / -Inf exactly when want is, and close to it otherwise.
bool likeReference(double got, double want, double tol) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::isfinite(got) && std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

void expectPropagatesLikeReference(attnopsDataType d, const Poison& poison) {
    SCOPED_TRACE(std::string(poison.what) + " " + dtypeName(d));
    BarProblem p = makeProblem(d, 9, 3, 20, 1e-6);
    BarInstance inst(p);
    const int64_t k = p.blocks + 1, h = p.hidden;
    if (poison.stage == Stage::BeforeForward) poison.apply(inst);
    ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
    const double tol = d == F32 ? 1e-4 : 3e-2;
    int bad = 0;
    auto expectLike = [&](const char* what, int64_t idx, double got, double want) {
        if (!likeReference(got, want, tol) && ++bad <= 5)
            ADD_FAILURE() << what << "[" << idx << "]: " << got << " vs reference " << want;
    };
    const bar::ForwardParams fp = bar::checkForward(forwardArgs(inst), 0);
    for (int64_t t = 0; t < p.tokens; ++t) {
        const bar::ReferenceToken r = bar::referenceForwardToken(fp.src, p.eps, t);
        for (int64_t e = 0; e < h; ++e) expectLike("hiddenStates", t * h + e, inst.hiddenStates.get(t * h + e), r.hidden[size_t(e)]);
        for (int64_t i = 0; i < k; ++i) {
            expectLike("invNorm", t * k + i, inst.invNorm.get(t * k + i), r.invNorm[size_t(i)]);
            expectLike("probs", t * k + i, inst.probs.get(t * k + i), r.probs[size_t(i)]);
        }
    }
    if (poison.stage == Stage::BeforeGrad) poison.apply(inst);
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
    std::vector<double> du(size_t(h), 0.0);
    for (int64_t t = 0; t < p.tokens; ++t) {
        const bar::ReferenceTokenGrad g = bar::referenceBackwardToken(bp, t);
        for (int64_t i = 0; i < k; ++i)
            for (int64_t e = 0; e < h; ++e) {
                const double got = i < p.blocks ? inst.gradBlockRes.get((t * p.blocks + i) * h + e) : inst.gradPartialBlock.get(t * h + e);
                expectLike("dv", (t * k + i) * h + e, got, g.dv[size_t(i * h + e)]);
            }
        for (int64_t e = 0; e < h; ++e) du[size_t(e)] += g.du[size_t(e)];
    }
    for (int64_t e = 0; e < h; ++e) {
        expectLike("gradProjWeight", e, inst.gradProjWeight.get(e), du[size_t(e)] * double(bp.src.normWeight.load(0, 0, e)));
        expectLike("gradNormWeight", e, inst.gradNormWeight.get(e), du[size_t(e)] * double(bp.src.projWeight.load(0, 0, e)));
    }
}

const char* const kImplementations[] = {"stream-avx512-bf16", "stream-avx512", "stream-avx2",  "vector-avx512",
                                        "vector-avx2",        "vector-generic", "reference"};

// Sets ATTNOPS_FORCE_IMPL for the scope (read when a call is planned).
using attnops::testsupport::ForcedImpl;

// Whether this CPU runs the implementation (planning answers UNSUPPORTED_HARDWARE otherwise).
bool implementationRuns(const char* name) {
    ForcedImpl forced(name);
    BarInstance probe(makeProblem(F32, 1, 1, 4));
    const attnopsStatus st = probe.runForward(true);
    EXPECT_TRUE(st == ATTNOPS_SUCCESS || st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) << name << ": " << lastError();
    return st == ATTNOPS_SUCCESS;
}

TEST(BarEdge, NanAndInfPropagateLikeTheReference) {
    for (const char* impl : kImplementations) {
        if (!implementationRuns(impl)) continue;
        ForcedImpl forced(impl);
        SCOPED_TRACE(impl);
        for (attnopsDataType d : {F32, F16, BF16})
            for (const Poison& poison : poisons()) expectPropagatesLikeReference(d, poison);
    }
}

// ================================================================ 3. identities (spec section 3)

TEST(BarIdentities, ZeroPseudoQueryGivesUniformProbabilities) {
    for (attnopsDataType d : {F32, F16, BF16})
        for (int64_t n : {1, 2, 7, 33}) {
            BarProblem p = makeProblem(d, 37, n, 40, n == 7 ? 0.3 : 1e-6);
            p.zeroProjWeight = true;
            p.sourceMajor = n == 2;
            p.projWeight2d = n == 33;
            SCOPED_TRACE(describe(p));
            BarInstance inst(p);
            expectForwardAndGradChecked(inst);
            if (HasFatalFailure()) return;
            const int64_t k = n + 1, h = p.hidden;
            const float uniform = 1.0f / float(k);
            int bad = 0;
            for (int64_t t = 0; t < p.tokens; ++t)
                for (int64_t i = 0; i < k; ++i)
                    if (inst.probs.get(t * k + i) != uniform && ++bad <= 3)
                        ADD_FAILURE() << "probs[" << t << "," << i << "] = " << inst.probs.get(t * k + i);
            // dv_i = p_i dy: the key path vanishes with u = 0.
            const double rel = 2 * unitRoundoff(d) + std::ldexp(1.0, -23);
            const double subnormal = d == F16 ? std::ldexp(1.0, -24) : 0.0;  // fp16's subnormal spacing
            for (int64_t t = 0; t < p.tokens; ++t)
                for (int64_t i = 0; i < k; ++i)
                    for (int64_t e = 0; e < h; ++e) {
                        const float dy = inst.gradHiddenStates.get(t * h + e);
                        const float dv = i < n ? inst.gradBlockRes.get((t * n + i) * h + e) : inst.gradPartialBlock.get(t * h + e);
                        const float exact = attnops::roundTo(dtypeOf(d), uniform * dy);
                        const double want = double(dy) / double(k);
                        const bool close = std::fabs(double(dv) - want) <= rel * std::fabs(want) + subnormal;
                        if ((dv != exact || !close) && ++bad <= 6)
                            ADD_FAILURE() << "dv[" << t << "," << i << "," << e << "] = " << dv << ", dy/(N+1) = " << want;
                    }
            // dg = w * du = 0 exactly, dw = g * du is not.
            bool anyNonZero = false;
            for (int64_t e = 0; e < h; ++e) {
                EXPECT_EQ(inst.gradNormWeight.get(e), 0.0f) << e;
                anyNonZero = anyNonZero || inst.gradProjWeight.get(e) != 0.0f;
            }
            EXPECT_TRUE(anyNonZero) << "gradProjWeight is all 0: the pseudo-query could never leave 0";
        }
}

// A problem whose hidden column c0 is 0 in every source and in dy, with u[c0] != 0: then the
// library's dv_i[c0] = ds_i r_i u[c0] exposes its ds_i.
constexpr int64_t kColumn = 5;

void expectSoftmaxBackwardIdentities(attnopsDataType d, int64_t n, double eps, bool sourceMajor) {
    BarProblem p = makeProblem(d, 20, n, 48, eps);
    p.sourceMajor = sourceMajor;
    p.dataScale = 2.0;
    SCOPED_TRACE(describe(p));
    BarInstance inst(p);
    const int64_t k = n + 1, h = p.hidden, tt = p.tokens;
    for (int64_t t = 0; t < tt; ++t) {
        for (int64_t i = 0; i < n; ++i) inst.blockRes.set({t, i, kColumn}, 0.0f);
        inst.partialBlock.set(t * h + kColumn, 0.0f);
        inst.gradHiddenStates.set(t * h + kColumn, 0.0f);
    }
    inst.projWeight.set(kColumn, 0.375f);
    expectForwardAndGradChecked(inst);
    if (::testing::Test::HasFatalFailure()) return;
    const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
    const bar::Sources& s = bp.src;
    const double u0 = double(s.normWeight.load(0, 0, kColumn) * s.projWeight.load(0, 0, kColumn));
    const double u32 = std::ldexp(1.0, -24), ulp = unitRoundoff(d);
    for (int64_t t = 0; t < tt; ++t) {
        std::vector<double> a(static_cast<size_t>(k)), ds(static_cast<size_t>(k));
        double sumP = 0, sumDs = 0, sumAbsDs = 0, sumAbsPa = 0, dyO = 0, scaleA = 0;
        for (int64_t i = 0; i < k; ++i) {
            for (int64_t e = 0; e < h; ++e) {
                a[size_t(i)] += double(bp.gradHidden.load(t, 0, e)) * double(s.source(t, i, e));
                scaleA += std::fabs(double(bp.gradHidden.load(t, 0, e)) * double(s.source(t, i, e)));
            }
            const double pi = inst.probs.get(t * k + i), ri = inst.invNorm.get(t * k + i);
            const double dv0 = i < n ? inst.gradBlockRes.get((t * n + i) * h + kColumn) : inst.gradPartialBlock.get(t * h + kColumn);
            ds[size_t(i)] = dv0 / (ri * u0);
            sumP += pi;
            sumDs += ds[size_t(i)];
            sumAbsDs += std::fabs(ds[size_t(i)]);
            sumAbsPa += std::fabs(pi * a[size_t(i)]);
        }
        for (int64_t e = 0; e < h; ++e) dyO += double(bp.gradHidden.load(t, 0, e)) * double(inst.hiddenStates.get(t * h + e));
        // The library's probabilities sum to 1.
        EXPECT_NEAR(sumP, 1.0, (4.0 * double(k) + 8.0) * u32) << "token " << t;
        // sum_i ds_i = 0.
        EXPECT_LE(std::fabs(sumDs), (4.0 * double(k) + 8.0) * u32 * sumAbsPa + 4.0 * ulp * sumAbsDs + 1e-30) << "token " << t;
        // a-bar = dy . o: the library's a-bar is a_i - ds_i / p_i (taken at the largest p_i).
        int64_t best = 0;
        for (int64_t i = 1; i < k; ++i)
            if (inst.probs.get(t * k + i) > inst.probs.get(t * k + best)) best = i;
        const double abar = a[size_t(best)] - ds[size_t(best)] / double(inst.probs.get(t * k + best));
        const double tolAbar = d == F32 ? 1e-5 * scaleA : 8.0 * ulp * scaleA;
        EXPECT_NEAR(abar, dyO, tolAbar) << "token " << t;
    }
    // dw * w = dg * g (both u * du).
    for (int64_t e = 0; e < h; ++e) {
        const double lhs = double(inst.gradProjWeight.get(e)) * double(s.projWeight.load(0, 0, e));
        const double rhs = double(inst.gradNormWeight.get(e)) * double(s.normWeight.load(0, 0, e));
        EXPECT_NEAR(lhs, rhs, 2.0 * std::max(ulp, u32) * (std::fabs(lhs) + std::fabs(rhs)) + 1e-30) << e;
    }
    // Near scale invariance: sum_i v_i . dv_i = a-bar + sum_i ds_i s_i eps / (ms_i + eps), both
    // in double from the saved statistics the backward used.
    for (int64_t t = 0; t < tt; ++t) {
        double lhs = 0, lhsAbs = 0, correction = 0, abar = 0;
        std::vector<double> a(static_cast<size_t>(k));
        for (int64_t i = 0; i < k; ++i) {
            for (int64_t e = 0; e < h; ++e) {
                const double v = s.source(t, i, e);
                const double dv = i < n ? inst.gradBlockRes.get((t * n + i) * h + e) : inst.gradPartialBlock.get(t * h + e);
                lhs += v * dv;
                lhsAbs += std::fabs(v * dv);
                a[size_t(i)] += double(bp.gradHidden.load(t, 0, e)) * v;
            }
            abar += double(bp.probs.load(t, i, 0)) * a[size_t(i)];
        }
        for (int64_t i = 0; i < k; ++i) {
            double ms = 0, c = 0;
            for (int64_t e = 0; e < h; ++e) {
                const double v = s.source(t, i, e);
                ms += v * v / double(h);
                c += double(s.normWeight.load(0, 0, e)) * double(s.projWeight.load(0, 0, e)) * v;
            }
            const double ri = bp.invNorm.load(t, i, 0);
            const double dsi = double(bp.probs.load(t, i, 0)) * (a[size_t(i)] - abar);
            correction += dsi * ri * c * p.eps / (ms + p.eps);
        }
        const double tol = (d == F32 ? 1e-5 : 8.0 * ulp) * lhsAbs + 1e-6 * std::fabs(correction);
        EXPECT_NEAR(lhs, abar + correction, tol) << "token " << t << " (correction " << correction << ")";
    }
}

TEST(BarIdentities, SoftmaxBackwardOfTheLibrary) {
    for (attnopsDataType d : {F32, F16, BF16})
        for (int64_t n : {1, 4, 33})
            for (double eps : {1e-6, 0.3}) expectSoftmaxBackwardIdentities(d, n, eps, n == 4);
}

TEST(BarIdentities, SoftmaxBackwardOfTheReference) {
    // With the reference forward's own probabilities: a-bar = dy . o and sum_i ds_i = 0 to double
    // precision.
    BarProblem p = makeProblem(F32, 16, 6, 33, 1e-2);
    BarInstance inst(p);
    const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
    for (int64_t t = 0; t < p.tokens; ++t) {
        const bar::ReferenceToken r = bar::referenceForwardToken(bp.src, p.eps, t);
        double abar = 0, dyO = 0, scale = 0, sumP = 0;
        std::vector<double> a(size_t(p.blocks + 1));
        for (int64_t i = 0; i <= p.blocks; ++i) {
            for (int64_t e = 0; e < p.hidden; ++e) {
                a[size_t(i)] += double(bp.gradHidden.load(t, 0, e)) * double(bp.src.source(t, i, e));
                scale += std::fabs(double(bp.gradHidden.load(t, 0, e)) * double(bp.src.source(t, i, e)));
            }
            abar += r.probs[size_t(i)] * a[size_t(i)];
            sumP += r.probs[size_t(i)];
        }
        for (int64_t e = 0; e < p.hidden; ++e) dyO += double(bp.gradHidden.load(t, 0, e)) * r.hidden[size_t(e)];
        EXPECT_NEAR(abar, dyO, 1e-13 * scale);
        double sumDs = 0;
        for (int64_t i = 0; i <= p.blocks; ++i) sumDs += r.probs[size_t(i)] * (a[size_t(i)] - abar);
        EXPECT_NEAR(sumDs, 0.0, 1e-13 * scale);
        EXPECT_NEAR(sumP, 1.0, 1e-14);
    }
}

// ================================================================ 4. finite differences

struct FdCase {
    int64_t tokens, blocks, hidden;
    double eps, scale;
    bool projWeight2d;
};

// Errors of one tensor relative to its scale S = max(max |analytic|, cancelled): normwise
// max |analytic - fd| / S, and elementwise |analytic - fd| / |analytic| over entries >= 1e-2 S.
// `cancelled` is the size of the terms a weight gradient sums (sum over t, i of |ds r v|): the
// fp32 statistics the reference backward reads perturb it on that scale, and du can be far
// smaller than its terms (H = 1).
struct FdError {
    double normwise = 0, elementwise = 0, maxAnalytic = 0;
};

FdError compare(const std::vector<double>& analytic, const std::vector<double>& fd, double cancelled = 0) {
    FdError e;
    for (double x : analytic) e.maxAnalytic = std::max(e.maxAnalytic, std::fabs(x));
    const double scale = std::max(e.maxAnalytic, cancelled);
    for (size_t j = 0; j < analytic.size(); ++j) {
        const double diff = std::fabs(analytic[j] - fd[j]);
        e.normwise = std::max(e.normwise, diff / scale);
        if (std::fabs(analytic[j]) >= 1e-2 * scale) e.elementwise = std::max(e.elementwise, diff / std::fabs(analytic[j]));
    }
    return e;
}

TEST(BarFiniteDifferences, ReferenceBackwardMatchesCentralDifferences) {
    const FdCase cases[] = {
        {2, 1, 5, 1e-6, 1.0, false}, {3, 3, 9, 1e-2, 0.05, true}, {2, 4, 17, 0.3, 24.0, false},
        {1, 6, 33, 1e-6, 3.0, true}, {2, 8, 7, 1e-2, 0.5, false}, {2, 2, 1, 1e-2, 1.0, true},
    };
    for (const FdCase& c : cases) {
        BarProblem p = makeProblem(F32, c.tokens, c.blocks, c.hidden, c.eps);
        p.dataScale = c.scale;
        p.projWeight2d = c.projWeight2d;
        p.sourceMajor = c.blocks % 2 == 0;
        SCOPED_TRACE(describe(p));
        BarInstance inst(p);
        fillStatsFromReference(inst);
        const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
        const int64_t tt = c.tokens, n = c.blocks, h = c.hidden, k = n + 1;

        // Analytic: the reference backward with the reference forward's statistics.
        std::vector<double> dPartial(static_cast<size_t>(tt * h)), dBlocks(static_cast<size_t>(tt * n * h)), du(size_t(h), 0.0),
            duAbs(size_t(h), 0.0);
        for (int64_t t = 0; t < tt; ++t) {
            const bar::ReferenceTokenGrad g = bar::referenceBackwardToken(bp, t);
            for (int64_t i = 0; i < k; ++i)
                for (int64_t e = 0; e < h; ++e)
                    (i < n ? dBlocks[size_t((t * n + i) * h + e)] : dPartial[size_t(t * h + e)]) = g.dv[size_t(i * h + e)];
            for (int64_t e = 0; e < h; ++e) {
                du[size_t(e)] += g.du[size_t(e)];
                duAbs[size_t(e)] += g.duAbs[size_t(e)];
            }
        }
        double projTerms = 0, normTerms = 0;
        for (int64_t e = 0; e < h; ++e) {
            projTerms = std::max(projTerms, std::fabs(double(inst.normWeight.get(e))) * duAbs[size_t(e)]);
            normTerms = std::max(normTerms, std::fabs(double(inst.projWeight.get(e))) * duAbs[size_t(e)]);
        }
        std::vector<double> dProj(static_cast<size_t>(h)), dNorm(static_cast<size_t>(h));
        for (int64_t e = 0; e < h; ++e) {
            dProj[size_t(e)] = double(inst.normWeight.get(e)) * du[size_t(e)];
            dNorm[size_t(e)] = double(inst.projWeight.get(e)) * du[size_t(e)];
        }

        // L = sum dy * hidden of the double reference forward.
        auto loss = [&] {
            double l = 0;
            for (int64_t t = 0; t < tt; ++t) {
                const bar::ReferenceToken r = bar::referenceForwardToken(bp.src, p.eps, t);
                for (int64_t e = 0; e < h; ++e) l += double(inst.gradHiddenStates.get(t * h + e)) * r.hidden[size_t(e)];
            }
            return l;
        };
        // Central difference with exactly representable steps.
        auto central = [&](const std::function<float()>& get, const std::function<void(float)>& set, double typical) {
            const float x = get();
            const double step = 1e-4 * std::max(std::fabs(double(x)), 0.1 * typical);
            const float xp = float(double(x) + step), xm = float(double(x) - step);
            set(xp);
            const double lp = loss();
            set(xm);
            const double lm = loss();
            set(x);
            return (lp - lm) / (double(xp) - double(xm));
        };
        std::vector<double> fdPartial(dPartial.size()), fdBlocks(dBlocks.size());
        std::vector<double> fdProj(static_cast<size_t>(h)), fdNorm(static_cast<size_t>(h));
        for (int64_t j = 0; j < tt * h; ++j)
            fdPartial[size_t(j)] = central([&] { return inst.partialBlock.get(j); }, [&](float v) { inst.partialBlock.set(j, v); }, c.scale);
        for (int64_t t = 0; t < tt; ++t)
            for (int64_t i = 0; i < n; ++i)
                for (int64_t e = 0; e < h; ++e)
                    fdBlocks[size_t((t * n + i) * h + e)] = central([&] { return inst.blockRes.get({t, i, e}); },
                                                                    [&](float v) { inst.blockRes.set({t, i, e}, v); }, c.scale);
        for (int64_t e = 0; e < h; ++e) {
            fdProj[size_t(e)] = central([&] { return inst.projWeight.get(e); }, [&](float v) { inst.projWeight.set(e, v); }, 0.5);
            fdNorm[size_t(e)] = central([&] { return inst.normWeight.get(e); }, [&](float v) { inst.normWeight.set(e, v); }, 1.0);
        }
        const std::pair<const char*, FdError> errors[] = {{"partialBlock", compare(dPartial, fdPartial)},
                                                          {"blockRes", compare(dBlocks, fdBlocks)},
                                                          {"projWeight", compare(dProj, fdProj, projTerms)},
                                                          {"normWeight", compare(dNorm, fdNorm, normTerms)}};
        for (const auto& [name, e] : errors) {
            EXPECT_GT(e.maxAnalytic, 0.0) << name;
            EXPECT_LE(e.normwise, 1e-6) << name;
            EXPECT_LE(e.elementwise, 2e-5) << name;
        }
    }
}

// ================================================================ 5. determinism

using attnops::testsupport::ThreadsGuard;

std::vector<uint8_t> outputBytes(const BarInstance& inst) {
    std::vector<uint8_t> all;
    for (const HostTensor* t : {&inst.hiddenStates, &inst.invNorm, &inst.probs, &inst.gradPartialBlock, &inst.gradBlockRes,
                                &inst.gradProjWeight, &inst.gradNormWeight})
        all.insert(all.end(), t->bytes().begin(), t->bytes().end());
    return all;
}

std::vector<BarProblem> determinismProblems() {
    std::vector<BarProblem> ps;
    ps.push_back(makeProblem(BF16, 1000, 8, 255, 1e-6));
    ps.back().sourceMajor = true;
    ps.push_back(makeProblem(F32, 333, 33, 64, 1e-2));
    ps.push_back(makeProblem(F16, 70, 2, 4096, 1e-6));
    ps.back().projWeight2d = true;
    ps.push_back(makeProblem(F32, 20, 64, 4096, 0.3));  // rows re-read in the backward
    ps.push_back(makeProblem(BF16, 4100, 1, 1025, 1e-6));  // 257 du chunks, a partial reduce item
    return ps;
}

TEST(BarDeterminism, ThreadCountsAndRepeatedRunsAreBitwiseEqual) {
    ThreadsGuard guard;
    for (const BarProblem& p : determinismProblems()) {
        SCOPED_TRACE(describe(p));
        BarInstance inst(p);
        std::vector<std::vector<uint8_t>> runs;
        for (int32_t threads : {1, 2, 3, 1, 2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS) << lastError();
            for (HostTensor* t : {&inst.hiddenStates, &inst.gradBlockRes, &inst.gradProjWeight}) fillAll(*t, 0.0f);
            ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
            ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
            runs.push_back(outputBytes(inst));
            if (runs.size() == 1) {
                EXPECT_TRUE(attnops::tools::checkBarForward(inst, 64).passed);
                EXPECT_TRUE(attnops::tools::checkBarBackward(inst).passed);
            }
        }
        for (size_t r = 1; r < runs.size(); ++r) EXPECT_TRUE(runs[r] == runs[0]) << "run " << r << " differs from run 0";
    }
}

TEST(BarDeterminism, EveryImplementationAgainstTheReference) {
    std::vector<BarProblem> ps;
    ps.push_back(makeProblem(F32, 37, 8, 255, 1e-6));
    ps.push_back(makeProblem(BF16, 100, 33, 17, 1e-2));
    ps.back().sourceMajor = true;
    ps.push_back(makeProblem(F16, 5, 2, 1, 0.3));
    ps.push_back(makeProblem(F32, 3, 70, 4096, 1e-6));  // rows re-read in the backward
    ps.back().projWeight2d = true;
    ps.push_back(makeProblem(BF16, 2, 200, 1500, 1e-6));
    int ran = 0;
    for (const char* impl : kImplementations) {
        if (!implementationRuns(impl)) {
            std::printf("[  NOTE    ] %s is not available on this CPU\n", impl);
            continue;
        }
        ForcedImpl forced(impl);
        SCOPED_TRACE(impl);
        ++ran;
        for (const BarProblem& p : ps) {
            expectProblemChecked(p);
            // Repeated runs of one implementation are bitwise equal.
            BarInstance a(p), b(p);
            ASSERT_EQ(a.runForward(true), ATTNOPS_SUCCESS);
            ASSERT_EQ(a.runBackward(), ATTNOPS_SUCCESS);
            ASSERT_EQ(b.runForward(true), ATTNOPS_SUCCESS);
            ASSERT_EQ(b.runBackward(), ATTNOPS_SUCCESS);
            EXPECT_TRUE(outputBytes(a) == outputBytes(b));
        }
    }
    EXPECT_GE(ran, 2) << "vector-generic and reference run everywhere";
}

// Row tails (H not a multiple of the 16-lane vectors, H = 1, H = 0), N = 0 in the grad and strided
// or source-major views, for every implementation this CPU runs.
TEST(BarDeterminism, EveryImplementationOnTailsAndViews) {
    for (const char* impl : kImplementations) {
        if (!implementationRuns(impl)) continue;
        ForcedImpl forced(impl);
        SCOPED_TRACE(impl);
        for (attnopsDataType d : {F32, F16, BF16}) {
            for (int64_t h : {1, 7, 15, 16, 17, 63, 64, 65, 79, 130})
                expectProblemChecked(makeProblem(d, 3, 3, h, 1e-2));
            {
                BarProblem noBlocks = makeProblem(d, 9, 0, 33, 1e-2);
                SCOPED_TRACE(describe(noBlocks));
                BarInstance inst(noBlocks);
                fillStatsFromReference(inst);
                ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
                EXPECT_EQ(inst.gradPartialBlock.bytes(), inst.gradHiddenStates.bytes());  // dv = dy
            }
            BarInstance empty(makeProblem(d, 4, 2, 0));
            EXPECT_EQ(empty.runForward(true), ATTNOPS_SUCCESS) << lastError();
            EXPECT_EQ(empty.runBackward(), ATTNOPS_SUCCESS) << lastError();
            BarProblem sourceMajor = makeProblem(d, 11, 5, 70, 1e-6);
            sourceMajor.sourceMajor = true;
            expectProblemChecked(sourceMajor);
            expectStridedMatchesContiguous(d, 7, 3, 37, false);
            expectStridedMatchesContiguous(d, 5, 2, 20, true);
        }
    }
}

// Bf16 values with a zero exponent field and a nonzero mantissa (denormals).
int64_t denormalBf16(const HostTensor& t) {
    int64_t n = 0;
    const std::vector<uint8_t>& b = t.bytes();
    for (size_t i = 0; i + 1 < b.size(); i += 2) {
        const unsigned v = unsigned(b[i]) | unsigned(b[i + 1]) << 8;
        n += (v & 0x7f80u) == 0 && (v & 0x7fu) != 0;
    }
    return n;
}

// stream-avx2 keeps stream-avx512's 16 lanes and operation order, and stream-avx512-bf16 rounds
// bf16 like it (vcvtneps2bf16, with the integer rounding where a lane is denormal, which the
// instruction would flush): the same bits, wherever two or more of them run. The last two
// problems make bf16 outputs denormal: the forward's (sources near the smallest normal) and the
// backward's (a gradient of 1e-39), so the denormal branch is taken and checked.
TEST(BarDeterminism, StreamKernelsGiveTheSameBits) {
    std::vector<const char*> impls;
    for (const char* impl : {"stream-avx512-bf16", "stream-avx512", "stream-avx2"})
        if (implementationRuns(impl)) impls.push_back(impl);
    if (impls.size() < 2) GTEST_SKIP() << "needs a CPU that runs at least two of the stream kernels";
    struct Case {
        BarProblem p;
        float gradScale = 1.0f;  // gradHiddenStates scaled by this
    };
    std::vector<Case> cases;
    for (attnopsDataType d : {F32, F16, BF16}) {
        cases.push_back({makeProblem(d, 40, 8, 4096 + 17, 1e-6)});
        cases.push_back({makeProblem(d, 30, 3, 33, 1e-2)});
        cases.back().p.sourceMajor = true;
        cases.push_back({makeProblem(d, 3, 70, 4096, 0.3)});  // rows re-read in the backward
    }
    cases.push_back({makeProblem(F32, 2304, 2, 4096, 1e-6)});   // non-temporal stores
    cases.push_back({makeProblem(BF16, 2304, 2, 4096, 1e-6)});  // non-temporal bf16 stores
    cases.push_back({makeProblem(BF16, 20, 4, 1000, 1e-6)});
    cases.back().p.dataScale = 2e-38;  // denormal forward outputs
    cases.push_back({makeProblem(BF16, 20, 4, 1000, 1e-6), 1e-39f});  // denormal gradients
    for (const Case& c : cases) {
        SCOPED_TRACE(describe(c.p) + " gradScale=" + std::to_string(c.gradScale));
        std::vector<std::vector<uint8_t>> bits;
        for (const char* impl : impls) {
            ForcedImpl forced(impl);
            BarInstance inst(c.p);
            if (c.gradScale != 1.0f)
                for (int64_t i = 0; i < inst.gradHiddenStates.numel(); ++i)
                    inst.gradHiddenStates.set(i, inst.gradHiddenStates.get(i) * c.gradScale);
            ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
            ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
            if (c.p.dataScale < 1e-30) {
                EXPECT_GT(denormalBf16(inst.hiddenStates), 0) << impl;
            }
            if (c.gradScale < 1e-30f) {
                EXPECT_GT(denormalBf16(inst.gradBlockRes), 0) << impl;
            }
            bits.push_back(outputBytes(inst));
        }
        for (size_t k = 1; k < bits.size(); ++k) EXPECT_TRUE(bits[k] == bits[0]) << impls[k] << " against " << impls[0];
    }
}

// On fp32 inputs the stream kernels compute the statistics the backward reads (invNorm, probs)
// with fp64 dots and an fp64 softmax (fp16/bf16 inputs keep fp32 dots: see loadWithStats):
// invNorm is the double reference rounded once to fp32 (within half an ulp, with a margin far
// below the next rounding); probs likewise, except for the pseudo-query u = g * w, which every
// kernel forms in fp32: its rounding moves score i by at most 2^-24 r_i sum|u_e x_e|, and
// p_i = exp(s_i - logsumexp(s)) by at most twice the largest such move, relatively. Peaked
// softmaxes (one probability near 1) are where fp32 statistics made the weight gradients as
// inexact as a naive fp32 implementation's.
TEST(BarDeterminism, StreamKernelsRoundTheStatisticsOnce) {
    int ran = 0;
    for (const char* impl : {"stream-avx512-bf16", "stream-avx512", "stream-avx2"}) {
        if (!implementationRuns(impl)) {
            std::printf("[  NOTE    ] %s is not available on this CPU\n", impl);
            continue;
        }
        ForcedImpl forced(impl);
        ++ran;
        for (double scale : {1.0, 6.0})
            for (int64_t h : {1, 17, 130, 4096 + 17}) {
                BarProblem p = makeProblem(F32, 5, 9, h, 1e-5);
                p.dataScale = scale;
                SCOPED_TRACE(std::string(impl) + " " + describe(p));
                BarInstance inst(p);
                ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
                const bar::BackwardParams bp = bar::checkBackward(backwardArgs(inst), 0);
                const int64_t k = bp.src.blocks + 1;
                for (int64_t t = 0; t < bp.src.tokens; ++t) {
                    const bar::ReferenceToken r = bar::referenceForwardToken(bp.src, p.eps, t);
                    double uMove = 0.0;  // the largest score move from rounding u to fp32
                    for (int64_t i = 0; i < k; ++i) {
                        double sum = 0.0;
                        for (int64_t e = 0; e < h; ++e)
                            sum += std::fabs(double(bp.src.normWeight.load(0, 0, e)) * bp.src.projWeight.load(0, 0, e) *
                                             bp.src.source(t, i, e));
                        uMove = std::max(uMove, std::ldexp(r.invNorm[size_t(i)] * sum, -24));
                    }
                    for (int64_t i = 0; i < k; ++i) {
                        const double wantInv = r.invNorm[size_t(i)], wantP = r.probs[size_t(i)];
                        const double halfUlpInv = 0.5 * std::ldexp(1.0, std::ilogb(wantInv) - 23);
                        const double halfUlpP = wantP > 0 ? 0.5 * std::ldexp(1.0, std::ilogb(wantP) - 23) : 0.0;
                        EXPECT_LE(std::fabs(double(inst.invNorm.get(t * k + i)) - wantInv), halfUlpInv * (1 + 1e-6))
                            << "token " << t << " source " << i;
                        EXPECT_LE(std::fabs(double(inst.probs.get(t * k + i)) - wantP),
                                  halfUlpP * (1 + 1e-6) + wantP * 2.0 * uMove * (1 + 1e-6) + 1e-45)
                            << "token " << t << " source " << i << " p " << wantP;
                    }
                }
            }
    }
    if (ran == 0) GTEST_SKIP() << "no stream kernel runs on this CPU (needs AVX2+FMA+F16C or AVX-512)";
}

// Outputs above the stream-* kernels' threshold (32 MiB) are written with non-temporal stores: the
// same values as the cached path, checked on sampled tokens (and the weight gradients in full).
TEST(BarDeterminism, LargeOutputsTakeTheStreamingPath) {
    BarProblem p = makeProblem(F32, 2304, 2, 4096, 1e-6);  // hiddenStates 37.7 MB, gradients 113 MB
    BarInstance inst(p);
    ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
    EXPECT_FALSE(attnops::tools::lastImplementation().empty());
    const BarCheck f = attnops::tools::checkBarForward(inst, 48);
    EXPECT_TRUE(f.passed) << f.failure;
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    const BarCheck b = attnops::tools::checkBarBackward(inst, 48);
    EXPECT_TRUE(b.passed) << b.failure;
}

// ================================================================ 6. first call of a process

TEST(BarFirstCall, GradIsTheFirstOperationOfAFreshProcess) {
    for (const char* dtype : {"fp32", "fp16", "bf16"})
        for (const char* blocking : {"0", "1"})
            expectChildPasses("BarFirstCall.DISABLED_ChildGradFirst",
                              {{"ATTNOPS_TEST_BAR_DTYPE", dtype}, {"ATTNOPS_LAUNCH_BLOCKING", blocking}});
}

// The child: no attnops call before the grad except creating tensors (the saved statistics
// come from the reference, not from the forward).
TEST(BarFirstCall, DISABLED_ChildGradFirst) {
    if (!isChild()) GTEST_SKIP() << "runs in a fresh process started by GradIsTheFirstOperationOfAFreshProcess";
    const char* name = std::getenv("ATTNOPS_TEST_BAR_DTYPE");
    const std::string dt = name ? name : "fp32";
    const attnopsDataType d = dt == "bf16" ? BF16 : dt == "fp16" ? F16 : F32;
    BarInstance inst(makeProblem(d, 300, 4, 64, 1e-6));
    fillStatsFromReference(inst);
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    const BarCheck b = attnops::tools::checkBarBackward(inst);
    EXPECT_TRUE(b.passed) << b.failure;
    ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(attnops::tools::checkBarForward(inst).passed);
}

// ================================================================ 7. bad input

constexpr attnopsStatus NUL = ATTNOPS_ERROR_NULL_ARGUMENT;
constexpr attnopsStatus INV = ATTNOPS_ERROR_INVALID_ARGUMENT;
constexpr attnopsStatus RTE = ATTNOPS_ERROR_RUNTIME;

// A zero-filled tensor; contiguous unless strides are given.
class Tensor {
public:
    Tensor(attnopsDataType dtype, std::vector<int64_t> shape, int32_t device = ATTNOPS_HOST_MEMORY) {
        int64_t numel = 1;
        for (int64_t s : shape) numel *= s;
        bytes_.assign(size_t(std::max<int64_t>(numel, 1)) * attnopsDataTypeSize(dtype), 0);
        EXPECT_EQ(attnopsCreateTensor(bytes_.data(), dtype, int64_t(shape.size()), shape.data(), nullptr, device, &handle_),
                  ATTNOPS_SUCCESS)
            << lastError();
    }
    ~Tensor() { attnopsDestroyTensor(handle_); }
    Tensor(const Tensor&) = delete;
    Tensor& operator=(const Tensor&) = delete;
    attnopsTensor* h() const { return handle_; }
    void fillF32(float v) {
        for (size_t i = 0; i + 4 <= bytes_.size(); i += 4) std::memcpy(bytes_.data() + i, &v, 4);
    }
    // Destroys the handle and returns the stale pointer.
    attnopsTensor* destroyKeepingPointer() {
        attnopsTensor* p = handle_;
        EXPECT_EQ(attnopsDestroyTensor(handle_), ATTNOPS_SUCCESS);
        handle_ = nullptr;
        return p;
    }

private:
    std::vector<uint8_t> bytes_;
    attnopsTensor* handle_ = nullptr;
};

void expectMessage(const std::vector<std::string>& parts) {
    const std::string msg = lastError();
    for (const std::string& part : parts)
        EXPECT_NE(msg.find(part), std::string::npos) << "message \"" << msg << "\" lacks \"" << part << "\"";
}

struct FwdCall {
    bar::ForwardArgs a;
    bool nullWorkspaceSize = false, nullExecutor = false;
    attnopsStatus plan(uint64_t* ws, attnopsExecutor** exec) const {
        return attnopsBlockAttentionResidualsGetWorkspaceSize(a.partialBlock, a.blockRes, a.projWeight, a.normWeight,
                                                              a.validBlockNum, a.normEps, a.needBackward, a.hiddenStates,
                                                              a.invNorm, a.probs, nullWorkspaceSize ? nullptr : ws,
                                                              nullExecutor ? nullptr : exec);
    }
};

struct GradCall {
    bar::BackwardArgs a;
    bool nullWorkspaceSize = false, nullExecutor = false;
    attnopsStatus plan(uint64_t* ws, attnopsExecutor** exec) const {
        return attnopsBlockAttentionResidualsGradGetWorkspaceSize(
            a.partialBlock, a.blockRes, a.projWeight, a.normWeight, a.gradHiddenStates, a.invNorm, a.probs, a.validBlockNum,
            a.gradPartialBlock, a.gradBlockRes, a.gradProjWeight, a.gradNormWeight, nullWorkspaceSize ? nullptr : ws,
            nullExecutor ? nullptr : exec);
    }
};

template <typename Call>
void expectPlanError(const Call& c, attnopsStatus want, const std::vector<std::string>& parts) {
    uint64_t ws = 12345;
    attnopsExecutor* exec = reinterpret_cast<attnopsExecutor*>(uintptr_t(0x10));
    const attnopsStatus got = c.plan(&ws, &exec);
    if (got == ATTNOPS_SUCCESS) {
        attnopsDestroyExecutor(exec);
        ADD_FAILURE() << "planned successfully; expected " << attnopsStatusName(want);
        return;
    }
    EXPECT_EQ(got, want) << attnopsStatusName(got) << ": " << lastError();
    expectMessage(parts);
    if (!c.nullWorkspaceSize && !c.nullExecutor) {
        EXPECT_EQ(exec, nullptr) << "a failed call must not hand out an executor";
        EXPECT_EQ(ws, 0u);
    }
}

// Plans, executes and synchronises.
template <typename Call>
void expectRuns(const Call& c) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = c.plan(&ws, &exec);
    ASSERT_EQ(st, ATTNOPS_SUCCESS) << lastError();
    const bool grad = std::is_same_v<Call, GradCall>;
    EXPECT_EQ(launchAndWait(st, ws, exec, grad ? attnopsBlockAttentionResidualsGrad : attnopsBlockAttentionResiduals), ATTNOPS_SUCCESS)
        << lastError();
}

#define EXPECT_PLAN_ERROR(call, status, ...)        \
    do {                                            \
        SCOPED_TRACE("called from here");           \
        expectPlanError(call, status, __VA_ARGS__); \
    } while (0)

#define EXPECT_RUNS(call)                 \
    do {                                  \
        SCOPED_TRACE("called from here"); \
        expectRuns(call);                 \
    } while (0)

// Valid fp32 tensors for T = 4, N = 3, H = 8 (and N = 0 for the grad).
class BarCheckTest : public ::testing::Test {
protected:
    Tensor pb{F32, {4, 8}}, br{F32, {4, 3, 8}}, pw{F32, {8}}, pw2{F32, {1, 8}}, nw{F32, {8}};
    Tensor out{F32, {4, 8}}, inv{F32, {4, 4}}, pr{F32, {4, 4}};
    Tensor dy{F32, {4, 8}}, dpb{F32, {4, 8}}, dbr{F32, {4, 3, 8}}, dpw{F32, {8}}, dpw2{F32, {1, 8}}, dnw{F32, {8}};
    Tensor br0{F32, {4, 0, 8}}, stats0{F32, {4, 1}}, dbr0{F32, {4, 0, 8}};

    BarCheckTest() {
        // Statistics a forward could have written: inv = 1, p = 1/4.
        inv.fillF32(1.0f);
        pr.fillF32(0.25f);
        stats0.fillF32(1.0f);
    }
    FwdCall fwd() const { return FwdCall{bar::ForwardArgs{pb.h(), br.h(), pw.h(), nw.h(), -1, 1e-6, true, out.h(), inv.h(), pr.h()}}; }
    GradCall grad() const {
        return GradCall{bar::BackwardArgs{pb.h(), br.h(), pw.h(), nw.h(), dy.h(), inv.h(), pr.h(), -1, dpb.h(), dbr.h(), dpw.h(), dnw.h()}};
    }
    // After any failure the library still runs valid calls.
    void TearDown() override {
        EXPECT_RUNS(fwd());
        EXPECT_RUNS(grad());
    }
};

TEST_F(BarCheckTest, ValidCallsRun) {
    EXPECT_RUNS(fwd());
    EXPECT_RUNS(grad());
    FwdCall f = fwd();
    f.a.projWeight = pw2.h();
    EXPECT_RUNS(f);
    GradCall g = grad();
    g.a.projWeight = pw2.h();
    g.a.gradProjWeight = dpw2.h();
    EXPECT_RUNS(g);
    // Tensors on the current device (0) are accepted like host tensors.
    Tensor pbDev(F32, {4, 8}, 0);
    f = fwd();
    f.a.partialBlock = pbDev.h();
    EXPECT_RUNS(f);
}

TEST_F(BarCheckTest, PhaseOneOutputPointers) {
    FwdCall f = fwd();
    f.nullWorkspaceSize = true;
    EXPECT_PLAN_ERROR(f, NUL, {"workspaceSize = NULL"});
    f = fwd();
    f.nullExecutor = true;
    EXPECT_PLAN_ERROR(f, NUL, {"executor = NULL"});
    GradCall g = grad();
    g.nullWorkspaceSize = true;
    EXPECT_PLAN_ERROR(g, NUL, {"workspaceSize = NULL"});
    g = grad();
    g.nullExecutor = true;
    EXPECT_PLAN_ERROR(g, NUL, {"executor = NULL"});
}

// Rules shared by both directions (checkSources), applied through a setter of the call.
template <typename Call>
void expectSourceRules(const Call& valid, const char* direction) {
    SCOPED_TRACE(direction);
    auto with = [&](auto change) {
        Call c = valid;
        change(c.a);
        return c;
    };
    // Null inputs.
    EXPECT_PLAN_ERROR(with([](auto& a) { a.partialBlock = nullptr; }), NUL, {"partialBlock = NULL"});
    EXPECT_PLAN_ERROR(with([](auto& a) { a.blockRes = nullptr; }), NUL, {"blockRes = NULL"});
    EXPECT_PLAN_ERROR(with([](auto& a) { a.projWeight = nullptr; }), NUL, {"projWeight = NULL"});
    EXPECT_PLAN_ERROR(with([](auto& a) { a.normWeight = nullptr; }), NUL, {"normWeight = NULL"});
    // Destroyed handles.
    {
        Tensor dead(F32, {4, 8});
        attnopsTensor* stale = dead.destroyKeepingPointer();
        EXPECT_PLAN_ERROR(with([&](auto& a) { a.partialBlock = stale; }), INV, {"partialBlock = 0x", "not a live tensor handle"});
        EXPECT_PLAN_ERROR(with([&](auto& a) { a.normWeight = stale; }), INV, {"normWeight = 0x", "not a live tensor handle"});
    }
    // Devices other than the host and the current one.
    Tensor pbDev(F32, {4, 8}, 5), brDev(F32, {4, 3, 8}, 7), pwDev(F32, {8}, 2), nwDev(F32, {8}, 9);
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.partialBlock = pbDev.h(); }), INV, {"partialBlock.device = 5", "ATTNOPS_HOST_MEMORY"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = brDev.h(); }), INV, {"blockRes.device = 7"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pwDev.h(); }), INV, {"projWeight.device = 2"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.normWeight = nwDev.h(); }), INV, {"normWeight.device = 9"});
    // partialBlock dtype and rank.
    for (attnopsDataType d : {ATTNOPS_FLOAT64, ATTNOPS_INT32, ATTNOPS_UINT8, ATTNOPS_INT16}) {
        Tensor x(d, {4, 8});
        EXPECT_PLAN_ERROR(with([&](auto& a) { a.partialBlock = x.h(); }), INV,
                          {std::string("partialBlock.dtype = ") + dtypeName(d), "fp32, fp16 or bf16"});
    }
    Tensor pb3(F32, {4, 8, 1}), pb1(F32, {32});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.partialBlock = pb3.h(); }), INV, {"partialBlock.shape = [4,8,1]", "rank 2"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.partialBlock = pb1.h(); }), INV, {"partialBlock.shape = [32]", "rank 2"});
    // blockRes rank, T and H.
    Tensor br2(F32, {4, 24}), brT(F32, {5, 3, 8}), brH(F32, {4, 3, 9}), br4(F32, {4, 3, 8, 1});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = br2.h(); }), INV, {"blockRes.shape = [4,24]", "rank 3"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = br4.h(); }), INV, {"blockRes.shape = [4,3,8,1]", "rank 3"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = brT.h(); }), INV, {"blockRes.shape = [5,3,8]", "T = 4", "H = 8"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = brH.h(); }), INV, {"blockRes.shape = [4,3,9]", "T = 4", "H = 8"});
    // dtypes must all be partialBlock's.
    Tensor brF16(F16, {4, 3, 8}), pwBF16(BF16, {8}), nwF16(F16, {8});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.blockRes = brF16.h(); }), INV, {"blockRes.dtype = fp16", "must be fp32"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pwBF16.h(); }), INV, {"projWeight.dtype = bf16", "must be fp32"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.normWeight = nwF16.h(); }), INV, {"normWeight.dtype = fp16", "must be fp32"});
    // projWeight [H] or [1,H]; normWeight [H].
    Tensor pw9(F32, {9}), pw28(F32, {2, 8}), pw81(F32, {8, 1}), pw118(F32, {1, 1, 8}), pw0(F32, {});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pw9.h(); }), INV, {"projWeight.shape = [9]", "[H] or [1,H]", "H = 8"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pw28.h(); }), INV, {"projWeight.shape = [2,8]", "[H] or [1,H]"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pw81.h(); }), INV, {"projWeight.shape = [8,1]", "[H] or [1,H]"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pw118.h(); }), INV, {"projWeight.shape = [1,1,8]"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.projWeight = pw0.h(); }), INV, {"projWeight.shape = []"});
    Tensor nw18(F32, {1, 8}), nw9(F32, {9});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.normWeight = nw18.h(); }), INV, {"normWeight.shape = [1,8]", "must be [8]"});
    EXPECT_PLAN_ERROR(with([&](auto& a) { a.normWeight = nw9.h(); }), INV, {"normWeight.shape = [9]", "must be [8]"});
}

TEST_F(BarCheckTest, SourceRulesForward) { expectSourceRules(fwd(), "forward"); }
TEST_F(BarCheckTest, SourceRulesGrad) { expectSourceRules(grad(), "grad"); }

TEST_F(BarCheckTest, ForwardNeedsABlock) {
    FwdCall f = fwd();
    f.a.blockRes = br0.h();
    f.a.invNorm = f.a.probs = stats0.h();
    EXPECT_PLAN_ERROR(f, INV, {"blockRes.shape = [4,0,8]", "N = 0 must be >= 1"});
}

TEST_F(BarCheckTest, ForwardValidBlockNum) {
    for (int64_t ok : {-1, 3}) {
        FwdCall f = fwd();
        f.a.validBlockNum = ok;
        EXPECT_RUNS(f);
    }
    for (int64_t bad : {int64_t(0), int64_t(1), int64_t(2), int64_t(4), int64_t(-2), std::numeric_limits<int64_t>::min(),
                        std::numeric_limits<int64_t>::max()}) {
        FwdCall f = fwd();
        f.a.validBlockNum = bad;
        EXPECT_PLAN_ERROR(f, INV, {"validBlockNum = " + std::to_string(bad), "-1 or N = 3"});
    }
}

TEST_F(BarCheckTest, GradValidBlockNum) {
    for (int64_t ok : {-1, 0, 3}) {
        GradCall g = grad();
        g.a.validBlockNum = ok;
        EXPECT_RUNS(g);
    }
    for (int64_t bad : {int64_t(1), int64_t(2), int64_t(4), int64_t(-2), std::numeric_limits<int64_t>::min()}) {
        GradCall g = grad();
        g.a.validBlockNum = bad;
        EXPECT_PLAN_ERROR(g, INV, {"validBlockNum = " + std::to_string(bad), "-1, 0 or N = 3"});
    }
    // N = 0: -1 and 0 (= N).
    for (int64_t valid : {int64_t(-1), int64_t(0), int64_t(1)}) {
        GradCall g = grad();
        g.a.blockRes = br0.h();
        g.a.gradBlockRes = dbr0.h();
        g.a.invNorm = g.a.probs = stats0.h();
        g.a.validBlockNum = valid;
        if (valid == 1)
            EXPECT_PLAN_ERROR(g, INV, {"validBlockNum = 1", "-1, 0 or N = 0"});
        else
            EXPECT_RUNS(g);
    }
}

TEST_F(BarCheckTest, NormEps) {
    for (double ok : {1e-6, 0.3, 1e3, 1e-40 /* an fp32 subnormal */}) {
        FwdCall f = fwd();
        f.a.normEps = ok;
        EXPECT_RUNS(f);
    }
    const std::pair<double, const char*> bad[] = {{0.0, "normEps = 0"}, {-0.0, "normEps = -0"}, {-1.0, "normEps = -1"},
                                                  {kNaN, "normEps = nan"}, {kInf, "normEps = inf"}, {-kInf, "normEps = -inf"}};
    for (const auto& [eps, text] : bad) {
        FwdCall f = fwd();
        f.a.normEps = eps;
        EXPECT_PLAN_ERROR(f, INV, {text, "finite and > 0"});
    }
    // Positive doubles that are 0 or Inf in fp32.
    for (const auto& [eps, text] : {std::pair{1e-50, "normEps = 1e-50"}, std::pair{1e39, "normEps = 1e+39"}}) {
        FwdCall f = fwd();
        f.a.normEps = eps;
        EXPECT_PLAN_ERROR(f, INV, {text, "positive finite fp32"});
    }
}

TEST_F(BarCheckTest, ForwardOutputs) {
    Tensor outF16(F16, {4, 8}), out9(F32, {4, 9}), out3(F32, {4, 8, 1}), outDev(F32, {4, 8}, 3);
    FwdCall f = fwd();
    f.a.hiddenStates = nullptr;
    EXPECT_PLAN_ERROR(f, NUL, {"hiddenStates = NULL"});
    f.a.hiddenStates = outF16.h();
    EXPECT_PLAN_ERROR(f, INV, {"hiddenStates.dtype = fp16", "must be fp32"});
    f.a.hiddenStates = out9.h();
    EXPECT_PLAN_ERROR(f, INV, {"hiddenStates.shape = [4,9]", "must be [4,8]"});
    f.a.hiddenStates = out3.h();
    EXPECT_PLAN_ERROR(f, INV, {"hiddenStates.shape = [4,8,1]", "must be [4,8]"});
    f.a.hiddenStates = outDev.h();
    EXPECT_PLAN_ERROR(f, INV, {"hiddenStates.device = 3"});
}

TEST_F(BarCheckTest, ForwardStatistics) {
    FwdCall f = fwd();
    f.a.invNorm = nullptr;
    EXPECT_PLAN_ERROR(f, NUL, {"invNorm = NULL", "needBackward"});
    f = fwd();
    f.a.probs = nullptr;
    EXPECT_PLAN_ERROR(f, NUL, {"probs = NULL", "needBackward"});
    Tensor bf(BF16, {4, 4}), f16(F16, {4, 4}), s43(F32, {4, 3}), s54(F32, {5, 4}), s441(F32, {4, 4, 1}), s16(F32, {16}),
        dev(F32, {4, 4}, 4);
    const std::pair<const Tensor*, std::vector<std::string>> cases[] = {
        {&bf, {"dtype = bf16", "fp32"}},
        {&f16, {"dtype = fp16", "fp32"}},
        {&s43, {"shape = [4,3]", "must be [4,4]"}},
        {&s54, {"shape = [5,4]", "must be [4,4]"}},
        {&s441, {"shape = [4,4,1]", "must be [4,4]"}},
        {&s16, {"shape = [16]", "must be [4,4]"}},
        {&dev, {"device = 4"}},
    };
    for (const char* which : {"invNorm", "probs"})
        for (const auto& [tensor, parts] : cases) {
            f = fwd();
            (std::string(which) == "invNorm" ? f.a.invNorm : f.a.probs) = tensor->h();
            std::vector<std::string> want = parts;
            want[0] = std::string(which) + "." + want[0];
            EXPECT_PLAN_ERROR(f, INV, want);
            // Ignored without needBackward.
            f.a.needBackward = false;
            EXPECT_RUNS(f);
        }
    // A destroyed handle is refused even when it would be ignored.
    Tensor dead(F32, {4, 4});
    attnopsTensor* stale = dead.destroyKeepingPointer();
    f = fwd();
    f.a.needBackward = false;
    f.a.probs = stale;
    EXPECT_PLAN_ERROR(f, INV, {"probs = 0x", "not a live tensor handle"});
}

TEST_F(BarCheckTest, GradInputs) {
    Tensor dyF16(F16, {4, 8}), dy9(F32, {4, 9}), dyDev(F32, {4, 8}, 6);
    GradCall g = grad();
    g.a.gradHiddenStates = nullptr;
    EXPECT_PLAN_ERROR(g, NUL, {"gradHiddenStates = NULL"});
    g.a.gradHiddenStates = dyF16.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradHiddenStates.dtype = fp16", "must be fp32"});
    g.a.gradHiddenStates = dy9.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradHiddenStates.shape = [4,9]", "must be [4,8]"});
    g.a.gradHiddenStates = dyDev.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradHiddenStates.device = 6"});
    Tensor bf(BF16, {4, 4}), s43(F32, {4, 3}), s441(F32, {4, 4, 1}), s1(F32, {4, 1});
    for (const char* which : {"invNorm", "probs"}) {
        SCOPED_TRACE(which);
        const std::string w = which;
        auto set = [&](GradCall& c, const attnopsTensor* t) { (w == "invNorm" ? c.a.invNorm : c.a.probs) = t; };
        g = grad();
        set(g, nullptr);
        EXPECT_PLAN_ERROR(g, NUL, {w + " = NULL"});
        set(g, bf.h());
        EXPECT_PLAN_ERROR(g, INV, {w + ".dtype = bf16", "fp32"});
        set(g, s43.h());
        EXPECT_PLAN_ERROR(g, INV, {w + ".shape = [4,3]", "must be [4,4]"});
        set(g, s441.h());
        EXPECT_PLAN_ERROR(g, INV, {w + ".shape = [4,4,1]", "must be [4,4]"});
        set(g, s1.h());
        EXPECT_PLAN_ERROR(g, INV, {w + ".shape = [4,1]", "must be [4,4]"});
    }
    // N = 0 statistics are [T,1].
    g = grad();
    g.a.blockRes = br0.h();
    g.a.gradBlockRes = dbr0.h();
    EXPECT_PLAN_ERROR(g, INV, {"invNorm.shape = [4,4]", "must be [4,1]"});
}

TEST_F(BarCheckTest, GradOutputs) {
    Tensor bf48(BF16, {4, 8}), f48(F32, {4, 9}), bf438(BF16, {4, 3, 8}), f448(F32, {4, 4, 8}), f38(F32, {3, 8}),
        bf8(BF16, {8}), f9(F32, {9}), f18(F32, {1, 8}), dev48(F32, {4, 8}, 2), dev438(F32, {4, 3, 8}, 2), dev8(F32, {8}, 2);
    GradCall g = grad();
    g.a.gradPartialBlock = nullptr;
    EXPECT_PLAN_ERROR(g, NUL, {"gradPartialBlock = NULL"});
    g.a.gradPartialBlock = bf48.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradPartialBlock.dtype = bf16", "must be fp32"});
    g.a.gradPartialBlock = f48.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradPartialBlock.shape = [4,9]", "must be [4,8]"});
    g.a.gradPartialBlock = dev48.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradPartialBlock.device = 2"});

    g = grad();
    g.a.gradBlockRes = nullptr;
    EXPECT_PLAN_ERROR(g, NUL, {"gradBlockRes = NULL"});
    g.a.gradBlockRes = bf438.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradBlockRes.dtype = bf16", "must be fp32"});
    g.a.gradBlockRes = f448.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradBlockRes.shape = [4,4,8]", "must be [4,3,8]"});
    g.a.gradBlockRes = dbr0.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradBlockRes.shape = [4,0,8]", "must be [4,3,8]"});
    g.a.gradBlockRes = dev438.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradBlockRes.device = 2"});

    g = grad();
    g.a.gradProjWeight = nullptr;
    EXPECT_PLAN_ERROR(g, NUL, {"gradProjWeight = NULL"});
    g.a.gradProjWeight = bf8.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradProjWeight.dtype = bf16", "must be fp32"});
    g.a.gradProjWeight = f9.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradProjWeight.shape = [9]", "must be [8]"});
    // gradProjWeight has projWeight's shape.
    g.a.gradProjWeight = f18.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradProjWeight.shape = [1,8]", "must be [8]"});
    g.a.projWeight = pw2.h();
    g.a.gradProjWeight = dpw.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradProjWeight.shape = [8]", "must be [1,8]"});
    g.a.gradProjWeight = dev8.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradProjWeight.device = 2"});

    g = grad();
    g.a.gradNormWeight = nullptr;
    EXPECT_PLAN_ERROR(g, NUL, {"gradNormWeight = NULL"});
    g.a.gradNormWeight = bf8.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradNormWeight.dtype = bf16", "must be fp32"});
    g.a.gradNormWeight = f18.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradNormWeight.shape = [1,8]", "must be [8]"});
    g.a.gradNormWeight = dev8.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradNormWeight.device = 2"});
    // Row count.
    g = grad();
    g.a.gradPartialBlock = f38.h();
    EXPECT_PLAN_ERROR(g, INV, {"gradPartialBlock.shape = [3,8]", "must be [4,8]"});
}

template <typename Call>
void expectExecuteRules(const Call& c, attnopsStatus (*run)(void*, uint64_t, attnopsExecutor*, attnopsStream*)) {
    EXPECT_EQ(run(nullptr, 0, nullptr, nullptr), NUL);
    expectMessage({"executor = NULL"});
    // Twice: the executor is single-use.
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(c.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
    ASSERT_GT(ws, 0u);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    EXPECT_EQ(run(workspace, ws, exec, nullptr), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(run(workspace, ws, exec, nullptr), RTE);
    expectMessage({"executor = 0x", "not a live executor", "already executed"});
    // Destroyed.
    ASSERT_EQ(c.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(attnopsDestroyExecutor(exec), ATTNOPS_SUCCESS);
    EXPECT_EQ(run(workspace, ws, exec, nullptr), RTE);
    expectMessage({"not a live executor"});
    // Workspace too small, or missing.
    ASSERT_EQ(c.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(run(workspace, ws - 1, exec, nullptr), INV);
    expectMessage({"workspaceSize = " + std::to_string(ws - 1), "must be >= " + std::to_string(ws)});
    ASSERT_EQ(c.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(run(nullptr, ws, exec, nullptr), NUL);
    expectMessage({"workspace = NULL"});
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
}

TEST_F(BarCheckTest, ExecuteForward) { expectExecuteRules(fwd(), attnopsBlockAttentionResiduals); }
TEST_F(BarCheckTest, ExecuteGrad) { expectExecuteRules(grad(), attnopsBlockAttentionResidualsGrad); }

TEST_F(BarCheckTest, MoreThreadsThanPlannedFailsOnTheStream) {
    // The driver refuses a pool larger than the plan; the error comes back from synchronise,
    // naming the op.
    ThreadsGuard guard;
    for (int dir = 0; dir < 2; ++dir) {
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        ASSERT_EQ(dir == 0 ? fwd().plan(&ws, &exec) : grad().plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
        ASSERT_EQ(attnopsSetDeviceThreads(0, guard.original() + 1), ATTNOPS_SUCCESS) << lastError();
        void* workspace = nullptr;
        ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
        const attnopsStatus launched = dir == 0 ? attnopsBlockAttentionResiduals(workspace, ws, exec, nullptr)
                                                : attnopsBlockAttentionResidualsGrad(workspace, ws, exec, nullptr);
        const attnopsStatus synced = launched == ATTNOPS_SUCCESS ? attnopsStreamSynchronize(nullptr) : launched;
        EXPECT_EQ(synced, RTE);
        expectMessage({dir == 0 ? "BlockAttentionResiduals" : "BlockAttentionResidualsGrad", "worker threads"});
        EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
        ASSERT_EQ(attnopsSetDeviceThreads(0, guard.original()), ATTNOPS_SUCCESS) << lastError();
        // The stream is usable again.
        EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << lastError();
    }
}

TEST_F(BarCheckTest, UnknownForcedImplementation) {
    {
        ForcedImpl forced("fastest-please");
        EXPECT_PLAN_ERROR(fwd(), INV, {"ATTNOPS_FORCE_IMPL = fastest-please", "vector-avx512", "vector-generic", "reference"});
        EXPECT_PLAN_ERROR(grad(), INV, {"ATTNOPS_FORCE_IMPL = fastest-please", "reference"});
    }
}

}  // namespace
