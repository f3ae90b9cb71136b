// Double-precision reference forward, its naive low-precision twin, and the "reference" entry of
// the implementation list.
#include "ops/fused_infer_attention_score/reference.hpp"

#include <cmath>
#include <limits>

#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/fullquant.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"

namespace attnops::fia {
namespace {

// Scores of row i against every key of batch b in Real; kept[j] = 0 for masked keys.
template <typename Real>
void scoreRow(const Params& p, int64_t b, int64_t n1, int64_t i, std::vector<Real>& s, std::vector<char>& kept) {
    const fa::ForwardParams& c = p.core;
    const int64_t sq = c.seq.qLen[size_t(b)], skv = c.seq.kvLen[size_t(b)];
    const fa::SeqRule rule = fa::seqRule(c.mask, b, sq, skv);
    const int64_t m = n1 / c.group, qRow = c.seq.qStart[size_t(b)] + i;
    s.assign(size_t(skv), Real(0));
    kept.assign(size_t(skv), 0);
    for (int64_t j = 0; j < skv; ++j) {
        if (!rule.keeps(i, j) || fa::explicitMasked(c, b, n1, i, j)) continue;
        if (p.tree != nullptr && treeMasked(p, b, sq, skv, i, j)) continue;
        Real dot = 0;
        if (p.queryDequant.scale == nullptr) {
            for (int64_t d = 0; d < c.d; ++d)
                dot += Real(c.q.load(b, n1, qRow, d)) * Real(kvElement(p, p.key, p.keyQuant, b, m, j, d));
        } else {  // MLA full quant: the int8 query's per-token scale applied once to its exact dot
            for (int64_t d = 0; d < c.d; ++d)
                dot += Real(static_cast<const int8_t*>(c.q.data)[c.q.offset(b, n1, qRow, d)]) *
                       Real(kvElement(p, p.key, p.keyQuant, b, m, j, d));
            dot *= Real(p.queryDequant.at(b, n1, qRow));
        }
        for (int64_t d = 0; d < p.ropeDim; ++d)  // MLA: the rope parts join the dot (spec 5 step 4)
            dot += Real(p.queryRope.load(b, n1, qRow, d)) * Real(kvElement(p, p.keyRope, AntiquantSpec{}, b, m, j, d));
        // pseShift is added after the scale (spec 5 step 6; form Dense, type 0).
        const fa::PseTerm pse = fa::pseTerm(c, b, n1, i, j);
        s[size_t(j)] = (dot + Real(pse.before)) * Real(c.scale) + Real(pse.after);
        kept[size_t(j)] = 1;
    }
}

template <typename Real>
Real rowMax(const std::vector<Real>& s, const std::vector<char>& kept, bool& any) {
    Real mx = -std::numeric_limits<Real>::infinity();
    any = false;
    for (size_t j = 0; j < s.size(); ++j)
        if (kept[j]) {
            any = true;
            if (s[j] > mx || std::isnan(s[j])) mx = s[j];
        }
    return mx;
}

}  // namespace

ReferenceRow referenceRow(const Params& p, int64_t b, int64_t n1, int64_t i) {
    if (p.fullQuant.on) return fullQuantReferenceRow(p, b, n1, i);  // spec 9.2's own rounding steps
    std::vector<double> s;
    std::vector<char> kept;
    scoreRow(p, b, n1, i, s, kept);
    ReferenceRow row;
    row.out.assign(size_t(p.core.dv), 0.0);
    row.lse = std::numeric_limits<double>::infinity();
    bool any = false;
    const double mx = rowMax(s, kept, any);
    // spec A: rows that attend nothing are 0, lse +inf; so are rows whose every kept score is -inf
    // (a pse of -inf), where exp(-inf - -inf) would be NaN (the kernels skip such blocks).
    if (!any || mx == -std::numeric_limits<double>::infinity()) return row;
    double sum = p.sink.empty() ? 0.0 : std::exp(double(p.sink[size_t(n1)]) - mx);
    for (size_t j = 0; j < s.size(); ++j)
        if (kept[j]) sum += std::exp(s[j] - mx);
    const int64_t m = n1 / p.core.group;
    for (size_t j = 0; j < s.size(); ++j) {
        if (!kept[j]) continue;
        const double prob = std::exp(s[j] - mx) / sum;
        for (int64_t c = 0; c < p.core.dv; ++c)
            row.out[size_t(c)] += prob * double(kvElement(p, p.value, p.valueQuant, b, m, int64_t(j), c));
    }
    row.lse = std::log(sum) + mx;
    return row;
}

std::vector<float> naiveLowPrecisionRow(const Params& p, int64_t b, int64_t n1, int64_t i) {
    if (p.fullQuant.on) return fullQuantNaiveRow(p, b, n1, i);
    std::vector<float> s;
    std::vector<char> kept;
    scoreRow(p, b, n1, i, s, kept);
    std::vector<float> out(size_t(p.core.dv), 0.0f);
    bool any = false;
    const float mx = rowMax(s, kept, any);
    if (!any) return out;
    float sum = p.sink.empty() ? 0.0f : std::exp(p.sink[size_t(n1)] - mx);
    const int64_t m = n1 / p.core.group;
    for (size_t j = 0; j < s.size(); ++j) {
        if (!kept[j]) continue;
        const float e = std::exp(s[j] - mx);
        sum += e;
        const float pj = roundTo(p.probDType, e);
        for (int64_t c = 0; c < p.core.dv; ++c) out[size_t(c)] += pj * kvElement(p, p.value, p.valueQuant, b, m, int64_t(j), c);
    }
    for (float& x : out) x = roundTo(p.core.out.dtype, x / sum);
    return out;
}

namespace {

TileShape referenceTile(const Params&) { return TileShape{16, 0}; }
uint64_t referenceScratch(const Params&, TileShape) { return 0; }
bool always(const Params&) { return true; }
bool available() { return true; }

void referenceRun(const Params& p, TileShape, const WorkUnit& u, void*) {
    for (int64_t g = 0; g < p.core.group; ++g) {
        const int64_t n1 = u.n2 * p.core.group + g;
        for (int64_t i = u.q0; i < u.q1; ++i) {
            const ReferenceRow r = referenceRow(p, u.b, n1, i);
            const int64_t row = p.core.seq.qStart[size_t(u.b)] + i;
            for (int64_t c = 0; c < p.core.dv; ++c) storeOut(p, u.b, n1, row, c, float(r.out[size_t(c)]));
            if (p.writeLse) p.lse.store(u.b, n1, row, 0, float(r.lse));
        }
    }
}

}  // namespace

const ForwardKernel& forwardKernelReference() {
    static const ForwardKernel k{"reference", available, always, referenceTile, referenceScratch, referenceRun};
    return k;
}

}  // namespace attnops::fia
