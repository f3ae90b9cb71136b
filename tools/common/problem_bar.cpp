// BarProblem / BarInstance: inputs, calls and reference checks for BlockAttentionResiduals.
#include "problem_bar.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/dtype.hpp"
#include "ops/block_attention_residuals/check.hpp"
#include "ops/block_attention_residuals/plan.hpp"
#include "ops/block_attention_residuals/reference.hpp"

namespace attnops::tools {
namespace {

void check(attnopsStatus st, const char* what) {
    if (st != ATTNOPS_SUCCESS)
        throw std::runtime_error(fmt::format("{} failed: {} ({})", what, attnopsStatusName(st), attnopsGetLastErrorMessage()));
}

struct Lcg {
    uint64_t state;
    float next(double scale) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return float((double(state >> 11) * (2.0 / 9007199254740992.0) - 1.0) * scale);
    }
};

double elementBytes(attnopsDataType d) { return double(attnopsDataTypeSize(d)); }

bar::ForwardArgs forwardArgs(const BarInstance& inst, bool needBackward) {
    return bar::ForwardArgs{inst.partialBlock.handle(), inst.blockRes.handle(), inst.projWeight.handle(),
                            inst.normWeight.handle(), inst.problem.validBlockNum, inst.problem.eps, needBackward, inst.hiddenStates.handle(),
                            inst.invNorm.handle(), inst.probs.handle()};
}

bar::BackwardArgs backwardArgs(const BarInstance& inst) {
    return bar::BackwardArgs{inst.partialBlock.handle(), inst.blockRes.handle(), inst.projWeight.handle(),
                             inst.normWeight.handle(), inst.gradHiddenStates.handle(), inst.invNorm.handle(),
                             inst.probs.handle(), inst.problem.validBlockNum, inst.gradPartialBlock.handle(), inst.gradBlockRes.handle(),
                             inst.gradProjWeight.handle(), inst.gradNormWeight.handle()};
}


}  // namespace

std::string BarProblem::describe() const {
    return fmt::format("BAR T={} N={} H={} {} eps={}{}{}", tokens, blocks, hidden, attnopsDataTypeName(dtype), eps,
                       sourceMajor ? " source-major" : "", zeroProjWeight ? " w=0" : "");
}

double BarProblem::forwardBytes(bool withStats) const {
    const double k = double(blocks + 1);
    return double(tokens) * ((k + 1) * double(hidden) * elementBytes(dtype) + (withStats ? 8.0 * k : 0.0));
}

double BarProblem::backwardBytes() const {
    const double k = double(blocks + 1);
    return double(tokens) * ((2 * k + 1) * double(hidden) * elementBytes(dtype) + 8.0 * k);
}

// ---------------------------------------------------------------- StridedTensor

StridedTensor::StridedTensor(attnopsDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                             int64_t bufferElements)
    : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
    bytes_.assign(size_t(bufferElements) * attnopsDataTypeSize(dtype), 0);
    check(attnopsCreateTensor(bytes_.empty() ? nullptr : bytes_.data(), dtype, int64_t(shape_.size()), shape_.data(),
                              strides_.data(), ATTNOPS_HOST_MEMORY, &handle_),
          "attnopsCreateTensor");
}
StridedTensor::~StridedTensor() { attnopsDestroyTensor(handle_); }
StridedTensor::StridedTensor(StridedTensor&& o) noexcept
    : dtype_(o.dtype_), shape_(std::move(o.shape_)), strides_(std::move(o.strides_)), bytes_(std::move(o.bytes_)), handle_(o.handle_) {
    o.handle_ = nullptr;
}
StridedTensor& StridedTensor::operator=(StridedTensor&& o) noexcept {
    if (this != &o) {
        attnopsDestroyTensor(handle_);
        dtype_ = o.dtype_;
        shape_ = std::move(o.shape_);
        strides_ = std::move(o.strides_);
        bytes_ = std::move(o.bytes_);
        handle_ = o.handle_;
        o.handle_ = nullptr;
    }
    return *this;
}
int64_t StridedTensor::offset(const std::vector<int64_t>& index) const {
    int64_t off = 0;
    for (size_t i = 0; i < index.size(); ++i) off += index[i] * strides_[i];
    return off;
}
float StridedTensor::get(const std::vector<int64_t>& index) const {
    return loadAsFloat(bytes_.data(), offset(index), DType(int32_t(dtype_)));
}
void StridedTensor::set(const std::vector<int64_t>& index, float v) {
    storeFromFloat(bytes_.data(), offset(index), DType(int32_t(dtype_)), v);
}

// ---------------------------------------------------------------- BarInstance

BarInstance::BarInstance(const BarProblem& p) : problem(p) {
    const int64_t t = p.tokens, n = p.blocks, h = p.hidden;
    Lcg rng{p.dataSeed * 0x9E3779B97F4A7C15ull + 11};
    partialBlock = HostTensor(p.dtype, {t, h});
    projWeight = p.projWeight2d ? HostTensor(p.dtype, {1, h}) : HostTensor(p.dtype, {h});
    normWeight = HostTensor(p.dtype, {h});
    if (p.sourceMajor)
        blockRes = StridedTensor(p.dtype, {t, n, h}, {h, t * h, 1}, n * t * h);
    else
        blockRes = StridedTensor(p.dtype, {t, n, h}, {n * h, h, 1}, t * n * h);
    // Sources with different magnitudes per block, like the residual stream's growth (stored
    // through the strides directly: set() builds an index vector per element).
    const std::vector<int64_t>& st = blockRes.strides();
    for (int64_t tt = 0; tt < t; ++tt)
        for (int64_t i = 0; i < n; ++i) {
            const double scale = p.dataScale * (1.0 + 0.5 * double(i));
            for (int64_t e = 0; e < h; ++e)
                storeFromFloat(blockRes.data(), tt * st[0] + i * st[1] + e * st[2], DType(int32_t(p.dtype)), rng.next(scale));
        }
    for (int64_t i = 0; i < partialBlock.numel(); ++i) partialBlock.set(i, rng.next(p.dataScale));
    for (int64_t e = 0; e < h; ++e) {
        projWeight.set(e, p.zeroProjWeight ? 0.0f : rng.next(0.5));
        normWeight.set(e, 1.0f + rng.next(0.2));
    }
    hiddenStates = HostTensor(p.dtype, {t, h});
    invNorm = HostTensor(ATTNOPS_FLOAT32, {t, n + 1});
    probs = HostTensor(ATTNOPS_FLOAT32, {t, n + 1});
    gradHiddenStates = HostTensor(p.dtype, {t, h});
    for (int64_t i = 0; i < gradHiddenStates.numel(); ++i) gradHiddenStates.set(i, rng.next(1.0));
    gradPartialBlock = HostTensor(p.dtype, {t, h});
    gradBlockRes = HostTensor(p.dtype, {t, n, h});
    gradProjWeight = HostTensor(p.dtype, projWeight.shape());
    gradNormWeight = HostTensor(p.dtype, {h});
}

attnopsStatus BarInstance::runForward(bool needBackward, attnopsStream* stream) {
    const bar::ForwardArgs a = forwardArgs(*this, needBackward);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsBlockAttentionResidualsGetWorkspaceSize(
        a.partialBlock, a.blockRes, a.projWeight, a.normWeight, a.validBlockNum, a.normEps, a.needBackward,
        a.hiddenStates, a.invNorm, a.probs, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsBlockAttentionResiduals, stream);
}

attnopsStatus BarInstance::runBackward(attnopsStream* stream) {
    const bar::BackwardArgs a = backwardArgs(*this);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsBlockAttentionResidualsGradGetWorkspaceSize(
        a.partialBlock, a.blockRes, a.projWeight, a.normWeight, a.gradHiddenStates, a.invNorm, a.probs,
        a.validBlockNum, a.gradPartialBlock, a.gradBlockRes, a.gradProjWeight, a.gradNormWeight, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsBlockAttentionResidualsGrad, stream);
}

// ---------------------------------------------------------------- checks

namespace {

void record(BarCheck& rc, int idx, double got, double want, double scale = 1.0) {
    if (std::isnan(got) != std::isnan(want)) {
        rc.passed = false;
        if (rc.failure.empty()) rc.failure = fmt::format("output {}: NaN mismatch (got {}, want {})", idx, got, want);
        rc.nanMismatch[idx] = true;
        return;
    }
    if (std::isnan(want)) return;
    rc.maxAbsError[idx] = std::max(rc.maxAbsError[idx], std::fabs(got - want) / scale);
}

double ulpOf(attnopsDataType d) { return d == ATTNOPS_BFLOAT16 ? std::ldexp(1.0, -8) : d == ATTNOPS_FLOAT16 ? std::ldexp(1.0, -11) : 0.0; }

}  // namespace

BarCheck checkBarForward(const BarInstance& inst, int64_t sample, bool checkStats) {
    const BarProblem& pr = inst.problem;
    const bar::ForwardParams p = bar::checkForward(forwardArgs(inst, true), 0);
    const bar::Sources& s = p.src;
    const int64_t k = s.blocks + 1;
    const double u = std::ldexp(1.0, -24);
    BarCheck rc;
    double maxRef = 0, maxV = 0, scoreAbs = 0;
    const int64_t step = sample > 0 && sample < s.tokens ? std::max<int64_t>(1, s.tokens / sample) : 1;
    for (int64_t t = 0; t < s.tokens; t += step) {
        const bar::ReferenceToken ref = bar::referenceForwardToken(s, double(p.eps), t);
        const std::vector<float> naive = pr.dtype == ATTNOPS_FLOAT32 ? std::vector<float>() : bar::naiveForwardToken(s, p.eps, t);
        for (int64_t i = 0; i < k; ++i) {
            double a = 0;
            for (int64_t e = 0; e < s.hidden; ++e) {
                const double v = s.source(t, i, e);
                maxV = std::max(maxV, std::fabs(v));
                a += std::fabs(double(s.normWeight.load(0, 0, e)) * double(s.projWeight.load(0, 0, e)) * v);
            }
            scoreAbs = std::max(scoreAbs, a * ref.invNorm[size_t(i)]);
            if (!checkStats) continue;
            record(rc, 1, p.invNorm.load(t, i, 0), ref.invNorm[size_t(i)], ref.invNorm[size_t(i)]);
            record(rc, 2, p.probs.load(t, i, 0), ref.probs[size_t(i)]);
        }
        ++rc.tokens;
        for (int64_t e = 0; e < s.hidden; ++e) {
            record(rc, 0, p.hidden.load(t, 0, e), ref.hidden[size_t(e)]);
            maxRef = std::max(maxRef, std::fabs(ref.hidden[size_t(e)]));
            if (!naive.empty()) rc.maxAbsNaiveError = std::max(rc.maxAbsNaiveError, std::fabs(double(naive[size_t(e)]) - ref.hidden[size_t(e)]));
        }
    }
    // fp32 bound: the kernels sum over H in 16 lanes (H/16 terms each, then 16 lane sums), so a
    // score's error is about (H/16 + 16) u |s|abs; the output's is (score error + K u) max|v|.
    const double h = double(std::max<int64_t>(1, s.hidden));
    const double terms = h / 16.0 + 16.0;
    const double scoreError = u * (4.0 * terms * scoreAbs + 16.0);
    rc.tolerance[1] = u * (4.0 * terms + 16.0);
    rc.tolerance[2] = 2.0 * scoreError + u * (4.0 * double(k) + 16.0);
    rc.tolerance[0] = pr.dtype == ATTNOPS_FLOAT32 ? (2.0 * scoreError + u * (4.0 * double(k) + 16.0)) * maxV + 1e-7
                                                  : 2.0 * rc.maxAbsNaiveError + 1e-5 * maxRef + 1e-6;
    const char* names[3] = {"hiddenStates", "invNorm (relative)", "probs"};
    for (int i = 0; i < (checkStats ? 3 : 1); ++i)
        if (rc.maxAbsError[i] > rc.tolerance[i]) {
            rc.passed = false;
            if (rc.failure.empty()) rc.failure = fmt::format("{}: error {} > tolerance {}", names[i], rc.maxAbsError[i], rc.tolerance[i]);
        }
    return rc;
}

BarCheck checkBarBackward(const BarInstance& inst) { return checkBarBackward(inst, -1); }

BarCheck checkBarBackward(const BarInstance& inst, int64_t sample) {
    const BarProblem& pr = inst.problem;
    const bar::BackwardParams p = bar::checkBackward(backwardArgs(inst), 0);
    const bar::Sources& s = p.src;
    const int64_t k = s.blocks + 1, h = s.hidden;
    const double u = std::ldexp(1.0, -24);
    BarCheck rc;
    std::vector<double> du(size_t(h), 0.0), duAbs(size_t(h), 0.0);
    double maxRef = 0;
    const int64_t step = sample > 0 && sample < s.tokens ? std::max<int64_t>(1, s.tokens / sample) : 1;
    for (int64_t t = 0; t < s.tokens; ++t) {
        const bar::ReferenceTokenGrad ref = bar::referenceBackwardToken(p, t);
        if (t % step == 0) {
            ++rc.tokens;
            const std::vector<float> naive = pr.dtype == ATTNOPS_FLOAT32 ? std::vector<float>() : bar::naiveBackwardToken(p, t);
            for (int64_t i = 0; i < k; ++i) {
                const bool fromBlockRes = i < s.blocks;
                double& partError = fromBlockRes ? rc.maxAbsErrorBlockRes : rc.maxAbsErrorPartial;
                bool& partNan = fromBlockRes ? rc.nanMismatchBlockRes : rc.nanMismatchPartial;
                for (int64_t e = 0; e < h; ++e) {
                    const double want = ref.dv[size_t(i * h + e)];
                    const double got = fromBlockRes ? p.gradBlockRes.load(t, i, e) : p.gradPartial.load(t, 0, e);
                    record(rc, 0, got, want);
                    if (std::isnan(got) != std::isnan(want))
                        partNan = true;
                    else if (!std::isnan(want))
                        partError = std::max(partError, std::fabs(got - want));
                    maxRef = std::max(maxRef, std::fabs(want));
                    if (!naive.empty()) rc.maxAbsNaiveError = std::max(rc.maxAbsNaiveError, std::fabs(double(naive[size_t(i * h + e)]) - want));
                }
            }
        }
        for (int64_t e = 0; e < h; ++e) {
            du[size_t(e)] += ref.du[size_t(e)];
            duAbs[size_t(e)] += ref.duAbs[size_t(e)];
        }
    }
    double maxW = 0;
    for (int64_t e = 0; e < h; ++e) {
        const double g = s.normWeight.load(0, 0, e), w = s.projWeight.load(0, 0, e);
        maxW = std::max({maxW, std::fabs(g) * duAbs[size_t(e)], std::fabs(w) * duAbs[size_t(e)]});
        record(rc, 1, p.gradProjWeight.load(0, 0, e), du[size_t(e)] * g);
        record(rc, 2, p.gradNormWeight.load(0, 0, e), du[size_t(e)] * w);
    }
    const double lengths = 16.0 * double(h) + 16.0 * double(k) + 4.0 * double(bar::backwardChunkTokens(s.tokens)) + 64.0;
    rc.tolerance[0] = pr.dtype == ATTNOPS_FLOAT32 ? u * lengths * maxRef + 1e-7 : 2.0 * rc.maxAbsNaiveError + 1e-5 * maxRef + 1e-6;
    // Weight gradients: the fp32 bound on the reduction, plus the final rounding to the dtype.
    rc.tolerance[1] = rc.tolerance[2] = u * lengths * maxW + ulpOf(pr.dtype) * maxW + 1e-7;
    const char* names[3] = {"gradBlockRes/gradPartialBlock", "gradProjWeight", "gradNormWeight"};
    for (int i = 0; i < 3; ++i)
        if (rc.maxAbsError[i] > rc.tolerance[i]) {
            rc.passed = false;
            if (rc.failure.empty()) rc.failure = fmt::format("{}: error {} > tolerance {}", names[i], rc.maxAbsError[i], rc.tolerance[i]);
        }
    return rc;
}

}  // namespace attnops::tools
