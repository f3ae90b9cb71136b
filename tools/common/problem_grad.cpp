// FaGrads: the backward call and its reference comparison.
#include "problem_grad.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/dtype.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/reference.hpp"

namespace attnops::tools {
namespace {

fa::BackwardArgs backwardArgs(const FaInstance& inst, const FaGrads& g, const FaArrays& a) {
    fa::BackwardArgs args;
    args.forward = forwardArgs(inst, a);
    args.forward.attentionOutName = "attentionIn";
    args.dy = g.dy.handle();
    args.dq = g.dq.handle();
    args.dk = g.dk.handle();
    args.dv = g.dv.handle();
    args.dsink = g.dsink.handle();
    return args;
}

}  // namespace

FaGrads makeGrads(const FaInstance& inst, uint64_t seed) {
    FaGrads g;
    g.dy = HostTensor(inst.attentionOut.dtype(), inst.attentionOut.shape());
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int64_t i = 0; i < g.dy.numel(); ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        g.dy.set(i, float(double(state >> 11) * (2.0 / 9007199254740992.0) - 1.0));
    }
    g.dq = HostTensor(inst.query.dtype(), inst.query.shape());
    g.dk = HostTensor(inst.key.dtype(), inst.key.shape());
    g.dv = HostTensor(inst.value.dtype(), inst.value.shape());
    if (!inst.sink.empty()) g.dsink = HostTensor(ATTNOPS_FLOAT32, {inst.problem.heads});
    return g;
}

attnopsStatus runBackward(const FaInstance& inst, FaGrads& g, attnopsStream* stream) {
    const FaArrays a(inst);
    const fa::BackwardArgs args = backwardArgs(inst, g, a);
    const fa::ForwardArgs& f = args.forward;
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    attnopsStatus st = attnopsFlashAttentionScoreGradGetWorkspaceSize(
        f.query, f.key, f.value, args.dy, f.realShift, f.dropMask, nullptr, f.attenMask, f.softmaxMax, f.softmaxSum,
        nullptr, f.attentionOut, f.prefix, f.actualSeqQLen, f.actualSeqKvLen, f.qStartIdx, f.kvStartIdx, f.sink,
        f.scaleValue, f.keepProb, f.preTokens, f.nextTokens, f.headNum, f.inputLayout, f.innerPrecise, f.sparseMode,
        f.pseType, f.seed, f.offset, args.dq, args.dk, args.dv, nullptr, args.dsink, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsFlashAttentionScoreGrad, stream);
}

fa::BackwardParams backwardParams(const FaInstance& inst, const FaGrads& g) {
    const FaArrays a(inst);
    return fa::checkBackward(backwardArgs(inst, g, a), 0);
}

GradCheck checkBackward(const FaInstance& inst, const FaGrads& g) {
    std::vector<int64_t> all(size_t(inst.problem.tnd() ? int64_t(inst.qCumulative.size()) : inst.problem.batch));
    for (size_t b = 0; b < all.size(); ++b) all[b] = int64_t(b);
    return checkBackwardSequences(inst, g, all);
}

GradCheck checkBackwardSequences(const FaInstance& inst, const FaGrads& g, const std::vector<int64_t>& sequences) {
    const fa::BackwardParams bp = backwardParams(inst, g);
    const fa::ForwardParams& p = bp.fwd;
    const bool lowp = inst.problem.dtype != ATTNOPS_FLOAT32;
    const char* names[4] = {"dq", "dk", "dv", "dsink"};
    // Reference and naive errors of every element, dk/dv summed over each group. fp32 problems
    // compute the naive fp32 gradients only when the relative bound alone fails (below).
    GradCheck rc;
    const auto measure = [&](bool withNaive) {
        rc = GradCheck{};
        auto compare = [&](int t, double got, double want, double naive) {
            if (std::isnan(want) || std::isnan(got)) {
                if (std::isnan(want) != std::isnan(got) && rc.failure.empty())
                    rc.failure = fmt::format("{}: NaN mismatch (got {}, want {})", names[t], got, want);
                if (std::isnan(want) != std::isnan(got)) {
                    rc.passed = false;
                    rc.nanMismatch[t] = true;
                }
                return;
            }
            rc.maxAbsError[t] = std::max(rc.maxAbsError[t], std::fabs(got - want));
            rc.maxAbsNaiveError[t] = std::max(rc.maxAbsNaiveError[t], std::fabs(naive - want));
            rc.maxAbsReference[t] = std::max(rc.maxAbsReference[t], std::fabs(want));
        };
        for (const int64_t b : sequences) {
            if (b < 0 || b >= p.seq.count) throw std::invalid_argument(fmt::format("sequence {} out of range", b));
            const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
            for (int64_t n2 = 0; n2 < p.n2; ++n2) {
                std::vector<double> dk(size_t(skv * p.d), 0.0), dv(size_t(skv * p.dv), 0.0);
                std::vector<double> ndk(dk), ndv(dv);
                for (int64_t gi = 0; gi < p.group; ++gi) {
                    const int64_t n1 = n2 * p.group + gi;
                    const fa::ReferenceHeadGrads ref = fa::referenceBackwardHead(bp, b, n1);
                    const fa::ReferenceHeadGrads naive = withNaive ? fa::naiveLowPrecisionBackwardHead(bp, b, n1) : ref;
                    for (int64_t i = 0; i < sq; ++i)
                        for (int64_t c = 0; c < p.d; ++c)
                            compare(0, loadAsFloat(bp.dq.data, bp.dq.offset(b, n1, p.seq.qStart[size_t(b)] + i, c), bp.dq.dtype),
                                    ref.dq[size_t(i * p.d + c)], naive.dq[size_t(i * p.d + c)]);
                    for (size_t e = 0; e < dk.size(); ++e) {
                        dk[e] += ref.dk[e];
                        ndk[e] += naive.dk[e];
                    }
                    for (size_t e = 0; e < dv.size(); ++e) {
                        dv[e] += ref.dv[e];
                        ndv[e] += naive.dv[e];
                    }
                }
                // The naive implementation sums its group's rounded dk/dv and rounds the sum: the
                // output is a low-precision number whatever the group size.
                if (lowp) {
                    for (double& x : ndk) x = roundTo(p.q.dtype, float(x));
                    for (double& x : ndv) x = roundTo(p.q.dtype, float(x));
                }
                for (int64_t j = 0; j < skv; ++j) {
                    const int64_t row = p.seq.kvStart[size_t(b)] + j;
                    for (int64_t c = 0; c < p.d; ++c)
                        compare(1, loadAsFloat(bp.dk.data, bp.dk.offset(b, n2, row, c), bp.dk.dtype), dk[size_t(j * p.d + c)],
                                ndk[size_t(j * p.d + c)]);
                    for (int64_t c = 0; c < p.dv; ++c)
                        compare(2, loadAsFloat(bp.dv.data, bp.dv.offset(b, n2, row, c), bp.dv.dtype), dv[size_t(j * p.dv + c)],
                                ndv[size_t(j * p.dv + c)]);
                }
            }
        }
        if (bp.dsink != nullptr)
            for (int64_t n1 = 0; n1 < p.n1; ++n1) {
                double want = 0, naive = 0;
                for (int64_t b = 0; b < p.seq.count; ++b) {
                    want += fa::referenceBackwardHead(bp, b, n1).dsink;
                    naive += withNaive ? fa::naiveLowPrecisionBackwardHead(bp, b, n1).dsink : 0.0;
                }
                compare(3, bp.dsink[n1 * bp.dsinkStride], want, withNaive ? naive : want);
            }
    };
    measure(lowp);
    // Tolerances: the forward's rule, per tensor.
    const double u = std::ldexp(1.0, -24);
    const double lengths = double(p.seq.maxQLen + p.seq.maxKvLen + p.d + p.dv) * double(p.group);
    // fp32: the relative bound of the reduction lengths, plus twice the naive fp32 error where
    // that bound alone fails: the gradients' error grows with the scores' magnitude (P's relative
    // error is about |scale * s| * 2^-24, and dS = P (dP - delta) cancels), which no length-only
    // bound covers (FaScaleExtremes: scale 100).
    const auto fp32Bound = [&](int t) { return u * (16.0 * lengths + 128.0) * rc.maxAbsReference[t] + 1e-7; };
    if (!lowp)
        for (int t = 0; t < 4; ++t)
            if (!rc.nanMismatch[t] && rc.maxAbsError[t] > fp32Bound(t)) {
                measure(true);
                break;
            }
    for (int t = 0; t < 4; ++t) {
        if (lowp)
            rc.tolerance[t] = 2.0 * rc.maxAbsNaiveError[t] + 1e-5 * rc.maxAbsReference[t] + 1e-6;
        else
            rc.tolerance[t] = 2.0 * rc.maxAbsNaiveError[t] + fp32Bound(t);
        if (rc.maxAbsError[t] > rc.tolerance[t]) {
            rc.passed = false;
            if (rc.failure.empty())
                rc.failure = fmt::format("{}: max error {} > tolerance {} (naive {}, max |ref| {})", names[t], rc.maxAbsError[t],
                                         rc.tolerance[t], rc.maxAbsNaiveError[t], rc.maxAbsReference[t]);
        }
    }
    return rc;
}

}  // namespace attnops::tools
