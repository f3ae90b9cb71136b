// Double-precision reference forward, the naive low-precision variant used by the tolerance rule,
// and the "reference" entry of the kernel list.
#include "ops/flash_attention_score/reference.hpp"

#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

// Scores S(i, j) of one row in double; masked keys get -inf and kept[j] = false.
template <typename Real>
void scoreRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, std::vector<Real>& s,
              std::vector<char>& kept) {
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
    const SeqRule rule = seqRule(p.mask, b, sq, skv);
    const int64_t n2 = n1 / p.group;
    const int64_t qRow = p.seq.qStart[size_t(b)] + i, kvRow0 = p.seq.kvStart[size_t(b)];
    s.assign(size_t(skv), Real(0));
    kept.assign(size_t(skv), 0);
    for (int64_t j = 0; j < skv; ++j) {
        if (!rule.keeps(i, j) || explicitMasked(p, b, n1, i, j)) {
            s[size_t(j)] = -std::numeric_limits<Real>::infinity();
            continue;
        }
        Real dot = 0;
        for (int64_t c = 0; c < p.d; ++c)
            dot += Real(p.q.load(b, n1, qRow, c)) * Real(p.k.load(b, n2, kvRow0 + j, c));
        const PseTerm t = pseTerm(p, b, n1, i, j);
        s[size_t(j)] = Real(p.scale) * (dot + Real(t.before)) + Real(t.after);
        kept[size_t(j)] = 1;
    }
}

bool keepBit(const ForwardParams& p, int64_t b, int64_t n1, int64_t i, int64_t j) {
    if (!p.dropout.enabled) return true;
    uint8_t keep = 0;
    dropoutKeepRow(p, b, n1, i, j, 1, &keep);
    return keep != 0;
}

}  // namespace

ReferenceRow referenceRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i) {
    std::vector<double> s;
    std::vector<char> kept;
    scoreRow(p, b, n1, i, s, kept);
    const int64_t skv = int64_t(s.size());
    const double negInf = -std::numeric_limits<double>::infinity();
    double m = negInf;
    bool any = false;
    for (int64_t j = 0; j < skv; ++j)
        if (kept[size_t(j)]) {
            any = true;
            if (s[size_t(j)] > m || std::isnan(s[size_t(j)])) m = s[size_t(j)];
        }
    const bool hasSink = p.sink != nullptr;
    const double sink = hasSink ? double(p.sink[n1 * p.sinkStride]) : 0.0;
    if (hasSink) m = any ? std::max(m, sink) : sink;
    ReferenceRow row;
    row.out.assign(size_t(p.dv), 0.0);
    // m = -inf: no key kept, or every kept key's score -inf (a pse of -inf), and no sink: a fully
    // masked row (spec decision: output 0, max -inf, sum 0), not exp(-inf - -inf) = NaN.
    if (m == negInf) {
        row.max = negInf;
        row.sum = 0.0;
        return row;
    }
    double l = hasSink ? std::exp(sink - m) : 0.0;
    for (int64_t j = 0; j < skv; ++j)
        if (kept[size_t(j)]) l += std::exp(s[size_t(j)] - m);
    const int64_t n2 = n1 / p.group, kvRow0 = p.seq.kvStart[size_t(b)];
    for (int64_t j = 0; j < skv; ++j) {
        if (!kept[size_t(j)]) continue;
        double prob = std::exp(s[size_t(j)] - m) / l;
        if (p.dropout.enabled) prob = keepBit(p, b, n1, i, j) ? prob / double(p.dropout.keepProb) : 0.0;
        for (int64_t c = 0; c < p.dv; ++c) row.out[size_t(c)] += prob * double(p.v.load(b, n2, kvRow0 + j, c));
    }
    row.max = m;
    row.sum = l;
    return row;
}

std::vector<float> naiveLowPrecisionRow(const ForwardParams& p, int64_t b, int64_t n1, int64_t i) {
    std::vector<float> s;
    std::vector<char> kept;
    scoreRow(p, b, n1, i, s, kept);
    const int64_t skv = int64_t(s.size());
    float m = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (int64_t j = 0; j < skv; ++j)
        if (kept[size_t(j)]) {
            any = true;
            m = std::max(m, s[size_t(j)]);
        }
    const bool hasSink = p.sink != nullptr;
    const float sink = hasSink ? p.sink[n1 * p.sinkStride] : 0.0f;
    if (hasSink) m = any ? std::max(m, sink) : sink;
    std::vector<float> out(size_t(p.dv), 0.0f);
    if (!any || m == -std::numeric_limits<float>::infinity()) return out;  // fully masked (referenceRow)
    float l = hasSink ? std::exp(sink - m) : 0.0f;
    for (int64_t j = 0; j < skv; ++j)
        if (kept[size_t(j)]) l += std::exp(s[size_t(j)] - m);
    const int64_t n2 = n1 / p.group, kvRow0 = p.seq.kvStart[size_t(b)];
    const DType lowp = p.q.dtype;
    for (int64_t j = 0; j < skv; ++j) {
        if (!kept[size_t(j)]) continue;
        float prob = std::exp(s[size_t(j)] - m) / l;
        if (p.dropout.enabled) prob = keepBit(p, b, n1, i, j) ? prob / p.dropout.keepProb : 0.0f;
        prob = roundTo(lowp, prob);
        for (int64_t c = 0; c < p.dv; ++c) out[size_t(c)] += prob * p.v.load(b, n2, kvRow0 + j, c);
    }
    for (auto& x : out) x = roundTo(p.out.dtype, x);
    return out;
}

namespace {

// Head gradients with arithmetic in Real; `lowp` (F16/BF16) rounds P_d, dP, dS and the results.
// In double (the reference) delta = sum_j P_d dP_d, exact; in float (the naive implementation)
// delta = dO . attentionIn, the operator's formula on its input (spec 3.3 step 4), which carries
// the forward output's rounding into dS: the error a naive backward has from its inputs.
template <typename Real>
ReferenceHeadGrads backwardHead(const BackwardParams& bp, int64_t b, int64_t n1, DType lowp) {
    const ForwardParams& p = bp.fwd;
    const int64_t sq = p.seq.qLen[size_t(b)], skv = p.seq.kvLen[size_t(b)];
    const int64_t n2 = n1 / p.group, qRow0 = p.seq.qStart[size_t(b)], kvRow0 = p.seq.kvStart[size_t(b)];
    const auto round = [&](Real x) { return lowp == DType::F32 ? x : Real(roundTo(lowp, float(x))); };
    ReferenceHeadGrads g;
    g.dq.assign(size_t(sq * p.d), 0.0);
    g.dk.assign(size_t(skv * p.d), 0.0);
    g.dv.assign(size_t(skv * p.dv), 0.0);
    g.dsinkRows.assign(size_t(sq), 0.0);
    const bool hasSink = p.sink != nullptr;
    const Real sink = hasSink ? Real(p.sink[n1 * p.sinkStride]) : Real(0);
    std::vector<Real> s, prob(static_cast<size_t>(skv)), pd(static_cast<size_t>(skv)), dpd(static_cast<size_t>(skv));
    std::vector<char> kept;
    double dsink = 0.0;
    for (int64_t i = 0; i < sq; ++i) {
        scoreRow(p, b, n1, i, s, kept);
        Real m = -std::numeric_limits<Real>::infinity();
        bool any = false;
        for (int64_t j = 0; j < skv; ++j)
            if (kept[size_t(j)]) {
                any = true;
                if (s[size_t(j)] > m || std::isnan(s[size_t(j)])) m = s[size_t(j)];
            }
        if (!any) continue;  // fully masked: P = 0 (with a sink, its probability times delta = 0)
        if (hasSink) m = std::max(m, sink);
        if (m == -std::numeric_limits<Real>::infinity()) continue;  // every kept score -inf: as fully masked
        Real l = hasSink ? std::exp(sink - m) : Real(0);
        for (int64_t j = 0; j < skv; ++j)
            if (kept[size_t(j)]) l += std::exp(s[size_t(j)] - m);
        Real delta = 0;
        for (int64_t j = 0; j < skv; ++j) {
            prob[size_t(j)] = pd[size_t(j)] = dpd[size_t(j)] = 0;
            if (!kept[size_t(j)]) continue;
            prob[size_t(j)] = std::exp(s[size_t(j)] - m) / l;
            pd[size_t(j)] = prob[size_t(j)];
            if (p.dropout.enabled) pd[size_t(j)] = keepBit(p, b, n1, i, j) ? pd[size_t(j)] / Real(p.dropout.keepProb) : Real(0);
            Real dot = 0;
            for (int64_t c = 0; c < p.dv; ++c)
                dot += Real(bp.dy.load(b, n1, qRow0 + i, c)) * Real(p.v.load(b, n2, kvRow0 + j, c));
            dpd[size_t(j)] = round(dot);
            if constexpr (!std::is_same_v<Real, float>) delta += pd[size_t(j)] * dpd[size_t(j)];
        }
        if constexpr (std::is_same_v<Real, float>) {
            for (int64_t c = 0; c < p.dv; ++c)
                delta += Real(bp.dy.load(b, n1, qRow0 + i, c)) *
                         Real(loadAsFloat(p.out.data, p.out.offset(b, n1, qRow0 + i, c), p.out.dtype));
        }
        for (int64_t j = 0; j < skv; ++j) {
            if (!kept[size_t(j)]) continue;
            Real dp = dpd[size_t(j)];
            if (p.dropout.enabled) dp = keepBit(p, b, n1, i, j) ? dp / Real(p.dropout.keepProb) : Real(0);
            const Real ds = round(prob[size_t(j)] * (dp - delta)) * Real(p.scale);
            const Real pdj = round(pd[size_t(j)]);
            for (int64_t c = 0; c < p.d; ++c) {
                g.dq[size_t(i * p.d + c)] += double(ds * Real(p.k.load(b, n2, kvRow0 + j, c)));
                g.dk[size_t(j * p.d + c)] += double(ds * Real(p.q.load(b, n1, qRow0 + i, c)));
            }
            for (int64_t c = 0; c < p.dv; ++c)
                g.dv[size_t(j * p.dv + c)] += double(pdj * Real(bp.dy.load(b, n1, qRow0 + i, c)));
        }
        if (hasSink) {
            g.dsinkRows[size_t(i)] = -double(std::exp(sink - m) / l * delta);
            dsink += g.dsinkRows[size_t(i)];
        }
    }
    if (lowp != DType::F32)
        for (auto* v : {&g.dq, &g.dk, &g.dv})
            for (double& x : *v) x = roundTo(lowp, float(x));
    g.dsink = dsink;
    return g;
}

}  // namespace

ReferenceHeadGrads referenceBackwardHead(const BackwardParams& p, int64_t b, int64_t n1) {
    return backwardHead<double>(p, b, n1, DType::F32);
}

ReferenceHeadGrads naiveLowPrecisionBackwardHead(const BackwardParams& p, int64_t b, int64_t n1) {
    return backwardHead<float>(p, b, n1, p.fwd.q.dtype);
}

namespace {

TileShape referenceTile(const ForwardParams&, const PlatformInfo&) { return TileShape{16, 0}; }
uint64_t referenceScratch(const ForwardParams&, TileShape) { return 0; }
bool always(const ForwardParams&) { return true; }
bool available() { return true; }

void referenceRun(const ForwardParams& p, TileShape, const WorkUnit& u, void*) {
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        for (int64_t i = u.q0; i < u.q1; ++i) {
            const ReferenceRow r = referenceRow(p, u.b, n1, i);
            const int64_t row = p.seq.qStart[size_t(u.b)] + i;
            for (int64_t c = 0; c < p.dv; ++c) p.out.store(u.b, n1, row, c, float(r.out[size_t(c)]));
            if (p.writeStats)
                for (int64_t lane = 0; lane < p.statLanes; ++lane) {
                    p.softmaxMax.store(u.b, n1, row, lane, float(r.max));
                    p.softmaxSum.store(u.b, n1, row, lane, float(r.sum));
                }
        }
    }
}

}  // namespace

const ForwardKernel& forwardKernelReference() {
    static const ForwardKernel k{"reference", available, always, referenceTile, referenceScratch, referenceRun};
    return k;
}

namespace {

TileShape referenceBackwardTile(const BackwardParams&, const PlatformInfo&) { return TileShape{16, 16}; }
uint64_t referenceBackwardScratch(const BackwardParams&, TileShape) { return 0; }
bool acceptsBackward(const BackwardParams&) { return true; }

void referenceKeyUnit(const BackwardParams& p, TileShape, const KeyUnit& u, void*) {
    const ForwardParams& f = p.fwd;
    const int64_t nk = u.k1 - u.k0;
    std::vector<double> dk(size_t(nk * f.d), 0.0), dv(size_t(nk * f.dv), 0.0);
    for (int64_t g = 0; g < f.group; ++g) {
        const ReferenceHeadGrads h = referenceBackwardHead(p, u.b, u.n2 * f.group + g);
        for (int64_t j = 0; j < nk; ++j) {
            for (int64_t c = 0; c < f.d; ++c) dk[size_t(j * f.d + c)] += h.dk[size_t((u.k0 + j) * f.d + c)];
            for (int64_t c = 0; c < f.dv; ++c) dv[size_t(j * f.dv + c)] += h.dv[size_t((u.k0 + j) * f.dv + c)];
        }
    }
    const int64_t row0 = f.seq.kvStart[size_t(u.b)] + u.k0;
    for (int64_t j = 0; j < nk; ++j) {
        for (int64_t c = 0; c < f.d; ++c) p.dk.store(u.b, u.n2, row0 + j, c, float(dk[size_t(j * f.d + c)]));
        for (int64_t c = 0; c < f.dv; ++c) p.dv.store(u.b, u.n2, row0 + j, c, float(dv[size_t(j * f.dv + c)]));
    }
}

void referenceQueryUnit(const BackwardParams& p, TileShape, const WorkUnit& u, void*) {
    const ForwardParams& f = p.fwd;
    for (int64_t g = 0; g < f.group; ++g) {
        const int64_t n1 = u.n2 * f.group + g;
        const ReferenceHeadGrads h = referenceBackwardHead(p, u.b, n1);
        const int64_t row0 = f.seq.qStart[size_t(u.b)];
        for (int64_t i = u.q0; i < u.q1; ++i) {
            for (int64_t c = 0; c < f.d; ++c) p.dq.store(u.b, n1, row0 + i, c, float(h.dq[size_t(i * f.d + c)]));
            if (p.sinkRowTerms) p.sinkRowTerms[p.sinkRowIndex(u.b, i) * f.n1 + n1] = float(h.dsinkRows[size_t(i)]);
        }
    }
}

}  // namespace

const BackwardKernel& backwardKernelReference() {
    static const BackwardKernel k{"reference", available, acceptsBackward, referenceBackwardTile,
                                  referenceBackwardScratch, referenceKeyUnit, referenceQueryUnit};
    return k;
}

}  // namespace attnops::fa
