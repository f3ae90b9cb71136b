// Double-precision reference forward, the naive low-precision variant used by the tolerance rule,
// and the "reference" entry of the kernel list.
#include "ops/flash_attention_score/reference.hpp"

#include <cmath>
#include <limits>

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
    if (!any && !hasSink) {
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
    if (!any) return out;
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

}  // namespace attnops::fa
