// 64-bit offsets: FlashAttentionScore (forward and grad) and BlockAttentionResiduals (forward and
// grad) on views whose element offsets pass 2^31 and 2^32, without the memory: every operand
// lives in its own sparse mmap(MAP_NORESERVE) reservation of tens of GiB with a huge token stride,
// and only the rows a view reaches are touched. The results must be bitwise equal to the same
// call on contiguous tensors, which is itself checked against the double reference.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "ops/flash_attention_score/check.hpp"
#include "problem.hpp"
#include "problem_bar.hpp"
#include "problem_grad.hpp"

namespace {

using attnops::tools::BarInstance;
using attnops::tools::BarProblem;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

std::string lastError() { return attnopsGetLastErrorMessage(); }

constexpr int64_t kTwo31 = int64_t(1) << 31;
// Elements between consecutive tokens: a little over 2^27, so that row 16 of a view already sits
// past 2^31 elements (and batch 1 past 2^32).
constexpr int64_t kTokenStride = (int64_t(1) << 27) + 96;

std::vector<int64_t> rowMajorStrides(const std::vector<int64_t>& shape) {
    std::vector<int64_t> s(shape.size());
    int64_t e = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        s[i] = e;
        e *= std::max<int64_t>(shape[i], 1);
    }
    return s;
}

// Calls f(offsetA, offsetB) for every index of `shape` (element offsets under two stride sets).
template <typename F>
void forEachIndex(const std::vector<int64_t>& shape, const std::vector<int64_t>& a, const std::vector<int64_t>& b, F f) {
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t s : shape)
        if (s == 0) return;
    for (;;) {
        int64_t oa = 0, ob = 0;
        for (size_t i = 0; i < shape.size(); ++i) {
            oa += idx[i] * a[i];
            ob += idx[i] * b[i];
        }
        f(oa, ob);
        size_t d = shape.size();
        while (d > 0 && ++idx[d - 1] == shape[d - 1]) idx[--d] = 0;
        if (d == 0) return;
    }
}

// A tensor inside a sparse reservation: `shape` with the given strides (elements).
class SparseTensor {
public:
    SparseTensor(attnopsDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides)
        : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
        int64_t last = 0;
        for (size_t i = 0; i < shape_.size(); ++i) last += (shape_[i] - 1) * strides_[i];
        maxOffset_ = last;
        bytes_ = size_t(last + 1) * attnopsDataTypeSize(dtype);
        void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return;
        base_ = p;
        EXPECT_EQ(attnopsCreateTensor(base_, dtype, int64_t(shape_.size()), shape_.data(), strides_.data(),
                                      ATTNOPS_HOST_MEMORY, &handle_),
                  ATTNOPS_SUCCESS)
            << lastError();
    }
    ~SparseTensor() {
        attnopsDestroyTensor(handle_);
        if (base_) munmap(base_, bytes_);
    }
    SparseTensor(const SparseTensor&) = delete;
    SparseTensor& operator=(const SparseTensor&) = delete;

    bool mapped() const { return base_ != nullptr; }
    attnopsTensor* handle() const { return handle_; }
    int64_t maxOffset() const { return maxOffset_; }
    // Copies a contiguous (row-major) buffer of the same shape in, or the view out to one.
    void scatter(const void* contiguous) {
        const size_t e = attnopsDataTypeSize(dtype_);
        forEachIndex(shape_, strides_, rowMajorStrides(shape_), [&](int64_t mine, int64_t theirs) {
            std::memcpy(static_cast<char*>(base_) + mine * int64_t(e), static_cast<const char*>(contiguous) + theirs * int64_t(e), e);
        });
    }
    std::vector<uint8_t> gather() const {
        const size_t e = attnopsDataTypeSize(dtype_);
        int64_t n = 1;
        for (int64_t s : shape_) n *= s;
        std::vector<uint8_t> out(size_t(n) * e);
        forEachIndex(shape_, strides_, rowMajorStrides(shape_), [&](int64_t mine, int64_t theirs) {
            std::memcpy(out.data() + theirs * int64_t(e), static_cast<const char*>(base_) + mine * int64_t(e), e);
        });
        return out;
    }

private:
    attnopsDataType dtype_;
    std::vector<int64_t> shape_, strides_;
    void* base_ = nullptr;
    size_t bytes_ = 0;
    int64_t maxOffset_ = 0;
    attnopsTensor* handle_ = nullptr;
};

#define SKIP_UNLESS_MAPPED(t) \
    if (!(t).mapped()) GTEST_SKIP() << "mmap(MAP_NORESERVE) of a sparse reservation failed (vm.overcommit_memory=2?)"

// BSND [B,S,N,D] with a huge token stride: strides {S*ts, ts, D, 1}.
std::unique_ptr<SparseTensor> sparseBsnd(const attnops::tools::HostTensor& like, bool copy) {
    const auto& s = like.shape();
    auto t = std::make_unique<SparseTensor>(like.dtype(), s,
                                            std::vector<int64_t>{s[1] * kTokenStride, kTokenStride, s[3], 1});
    if (t->mapped() && copy) t->scatter(like.data());
    return t;
}

FaProblem offsetsProblem() {
    // Causal GQA with dropout: the mask, the dropout bit positions and the kv grouping all use the
    // row and batch indices whose element offsets are now past 2^31.
    FaProblem p = attnops::tools::fixed("BSND", ATTNOPS_BFLOAT16, 2, 20, 24, 4, 2, 16);
    p.sparseMode = 3;
    p.keepProb = 0.9;
    p.seed = 17;
    return p;
}

TEST(Offsets64, FlashAttentionForwardAndBackwardPast2To31) {
    FaInstance inst(offsetsProblem());
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    const auto rc = attnops::tools::checkForwardRows(inst, -1);
    ASSERT_TRUE(rc.passed) << rc.firstFailure;
    attnops::tools::FaGrads g = attnops::tools::makeGrads(inst);
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << lastError();
    const auto gc = attnops::tools::checkBackward(inst, g);
    ASSERT_TRUE(gc.passed) << gc.failure;
    const std::vector<uint8_t> wantMax = inst.softmaxMax.bytes(), wantSum = inst.softmaxSum.bytes();

    auto q = sparseBsnd(inst.query, true), k = sparseBsnd(inst.key, true), v = sparseBsnd(inst.value, true);
    auto out = sparseBsnd(inst.attentionOut, false);
    SKIP_UNLESS_MAPPED(*q);
    for (const auto* t : {q.get(), k.get(), v.get(), out.get()}) ASSERT_TRUE(t->mapped());
    EXPECT_GT(q->maxOffset(), 2 * kTwo31) << "the views must reach past 2^32 elements";
    EXPECT_GT(out->maxOffset(), 2 * kTwo31);

    // Forward with the sparse views, everything else as the contiguous call.
    const attnops::tools::FaArrays arrays(inst);
    attnops::fa::ForwardArgs a = attnops::tools::forwardArgs(inst, arrays);
    a.query = q->handle();
    a.key = k->handle();
    a.value = v->handle();
    a.attentionOut = out->handle();
    std::fill(inst.softmaxMax.bytes().begin(), inst.softmaxMax.bytes().end(), 0);
    std::fill(inst.softmaxSum.bytes().begin(), inst.softmaxSum.bytes().end(), 0);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    attnopsStatus st = attnopsFlashAttentionScoreGetWorkspaceSize(
        a.query, a.key, a.value, a.realShift, a.dropMask, a.paddingMask, a.attenMask, a.prefix, a.actualSeqQLen,
        a.actualSeqKvLen, a.qStartIdx, a.kvStartIdx, a.sink, a.scaleValue, a.keepProb, a.preTokens, a.nextTokens,
        a.headNum, a.inputLayout, a.innerPrecise, a.sparseMode, a.pseType, a.seed, a.offset, a.softmaxMax,
        a.softmaxSum, a.softmaxOut, a.attentionOut, &ws, &exec);
    ASSERT_EQ(attnops::tools::launchAndWait(st, ws, exec, attnopsFlashAttentionScore), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(out->gather() == inst.attentionOut.bytes()) << "attention_out differs from the contiguous call";
    EXPECT_TRUE(inst.softmaxMax.bytes() == wantMax && inst.softmaxSum.bytes() == wantSum);

    // Backward: dy, attentionIn and every gradient in sparse views too.
    auto dy = sparseBsnd(g.dy, true);
    auto dq = sparseBsnd(g.dq, false), dk = sparseBsnd(g.dk, false), dv = sparseBsnd(g.dv, false);
    for (const auto* t : {dy.get(), dq.get(), dk.get(), dv.get()}) ASSERT_TRUE(t->mapped());
    st = attnopsFlashAttentionScoreGradGetWorkspaceSize(
        a.query, a.key, a.value, dy->handle(), a.realShift, a.dropMask, nullptr, a.attenMask, a.softmaxMax,
        a.softmaxSum, nullptr, out->handle(), a.prefix, a.actualSeqQLen, a.actualSeqKvLen, a.qStartIdx, a.kvStartIdx,
        a.sink, a.scaleValue, a.keepProb, a.preTokens, a.nextTokens, a.headNum, a.inputLayout, a.innerPrecise,
        a.sparseMode, a.pseType, a.seed, a.offset, dq->handle(), dk->handle(), dv->handle(), nullptr, nullptr, &ws, &exec);
    ASSERT_EQ(attnops::tools::launchAndWait(st, ws, exec, attnopsFlashAttentionScoreGrad), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(dq->gather() == g.dq.bytes()) << "dq differs from the contiguous call";
    EXPECT_TRUE(dk->gather() == g.dk.bytes()) << "dk differs from the contiguous call";
    EXPECT_TRUE(dv->gather() == g.dv.bytes()) << "dv differs from the contiguous call";
}

TEST(Offsets64, BlockAttentionResidualsForwardAndBackwardPast2To31) {
    BarProblem p;
    p.tokens = 35;
    p.blocks = 3;
    p.hidden = 40;
    p.dtype = ATTNOPS_FLOAT32;
    BarInstance inst(p);
    ASSERT_EQ(inst.runForward(true), ATTNOPS_SUCCESS) << lastError();
    ASSERT_TRUE(attnops::tools::checkBarForward(inst).passed);
    ASSERT_EQ(inst.runBackward(), ATTNOPS_SUCCESS) << lastError();
    ASSERT_TRUE(attnops::tools::checkBarBackward(inst).passed);
    const std::vector<uint8_t> wantInv = inst.invNorm.bytes(), wantProbs = inst.probs.bytes();
    const std::vector<uint8_t> wantGpw = inst.gradProjWeight.bytes(), wantGnw = inst.gradNormWeight.bytes();

    const int64_t t = p.tokens, n = p.blocks, h = p.hidden;
    // [T,H] and [T,N,H] views whose token stride is huge; blockRes is source-major inside a token.
    auto tokenMajor = [&](const std::vector<int64_t>& shape) {
        return std::make_unique<SparseTensor>(p.dtype, shape,
                                              shape.size() == 2 ? std::vector<int64_t>{kTokenStride, 1}
                                                                : std::vector<int64_t>{kTokenStride, h, 1});
    };
    auto pb = tokenMajor({t, h}), br = tokenMajor({t, n, h}), hidden = tokenMajor({t, h});
    SKIP_UNLESS_MAPPED(*pb);
    for (const auto* x : {br.get(), hidden.get()}) ASSERT_TRUE(x->mapped());
    EXPECT_GT(br->maxOffset(), 2 * kTwo31);
    pb->scatter(inst.partialBlock.data());
    std::vector<uint8_t> brContiguous(size_t(t * n * h) * sizeof(float));
    {
        // inst.blockRes has its own strides: copy it out element by element.
        std::vector<float> values;
        for (int64_t i = 0; i < t; ++i)
            for (int64_t j = 0; j < n; ++j)
                for (int64_t c = 0; c < h; ++c) values.push_back(inst.blockRes.get({i, j, c}));
        std::memcpy(brContiguous.data(), values.data(), brContiguous.size());
    }
    br->scatter(brContiguous.data());
    std::fill(inst.invNorm.bytes().begin(), inst.invNorm.bytes().end(), 0);
    std::fill(inst.probs.bytes().begin(), inst.probs.bytes().end(), 0);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    attnopsStatus st = attnopsBlockAttentionResidualsGetWorkspaceSize(
        pb->handle(), br->handle(), inst.projWeight.handle(), inst.normWeight.handle(), p.validBlockNum, p.eps, true,
        hidden->handle(), inst.invNorm.handle(), inst.probs.handle(), &ws, &exec);
    ASSERT_EQ(attnops::tools::launchAndWait(st, ws, exec, attnopsBlockAttentionResiduals), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(hidden->gather() == inst.hiddenStates.bytes()) << "hiddenStates differs from the contiguous call";
    EXPECT_TRUE(inst.invNorm.bytes() == wantInv && inst.probs.bytes() == wantProbs);

    auto gh = tokenMajor({t, h}), gpb = tokenMajor({t, h}), gbr = tokenMajor({t, n, h});
    for (const auto* x : {gh.get(), gpb.get(), gbr.get()}) ASSERT_TRUE(x->mapped());
    gh->scatter(inst.gradHiddenStates.data());
    std::fill(inst.gradProjWeight.bytes().begin(), inst.gradProjWeight.bytes().end(), 0);
    std::fill(inst.gradNormWeight.bytes().begin(), inst.gradNormWeight.bytes().end(), 0);
    st = attnopsBlockAttentionResidualsGradGetWorkspaceSize(
        pb->handle(), br->handle(), inst.projWeight.handle(), inst.normWeight.handle(), gh->handle(), inst.invNorm.handle(),
        inst.probs.handle(), p.validBlockNum, gpb->handle(), gbr->handle(), inst.gradProjWeight.handle(),
        inst.gradNormWeight.handle(), &ws, &exec);
    ASSERT_EQ(attnops::tools::launchAndWait(st, ws, exec, attnopsBlockAttentionResidualsGrad), ATTNOPS_SUCCESS)
        << lastError();
    EXPECT_TRUE(gpb->gather() == inst.gradPartialBlock.bytes()) << "gradPartialBlock differs";
    EXPECT_TRUE(gbr->gather() == inst.gradBlockRes.bytes()) << "gradBlockRes differs";
    EXPECT_TRUE(inst.gradProjWeight.bytes() == wantGpw && inst.gradNormWeight.bytes() == wantGnw);
}

}  // namespace
