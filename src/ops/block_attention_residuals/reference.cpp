// Double-precision BlockAttentionResiduals reference, its naive low-precision twin, and the
// "reference" entry of the kernel list.
#include "ops/block_attention_residuals/reference.hpp"

#include <cmath>
#include <limits>

#include "ops/block_attention_residuals/kernel.hpp"

namespace attnops::bar {

ReferenceToken referenceForwardToken(const Sources& s, double eps, int64_t t) {
    const int64_t k = s.blocks + 1, h = s.hidden;
    ReferenceToken r;
    r.hidden.assign(size_t(h), 0.0);
    r.invNorm.resize(size_t(k));
    r.probs.resize(size_t(k));
    std::vector<double> score(static_cast<size_t>(k));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < k; ++i) {
        double ss = 0, dot = 0;
        for (int64_t c = 0; c < h; ++c) {
            const double v = s.source(t, i, c);
            ss += v * v;
            dot += double(s.normWeight.load(0, 0, c)) * double(s.projWeight.load(0, 0, c)) * v;
        }
        const double inv = 1.0 / std::sqrt((h > 0 ? ss / double(h) : 0.0) + eps);
        r.invNorm[size_t(i)] = inv;
        score[size_t(i)] = inv * dot;
        if (score[size_t(i)] > m || std::isnan(score[size_t(i)])) m = score[size_t(i)];
    }
    double l = 0;
    for (int64_t i = 0; i < k; ++i) l += std::exp(score[size_t(i)] - m);
    for (int64_t i = 0; i < k; ++i) {
        r.probs[size_t(i)] = std::exp(score[size_t(i)] - m) / l;
        for (int64_t c = 0; c < h; ++c) r.hidden[size_t(c)] += r.probs[size_t(i)] * double(s.source(t, i, c));
    }
    return r;
}

ReferenceTokenGrad referenceBackwardToken(const BackwardParams& p, int64_t t) {
    const Sources& s = p.src;
    const int64_t k = s.blocks + 1, h = s.hidden;
    ReferenceTokenGrad g;
    g.dv.assign(size_t(k * h), 0.0);
    g.du.assign(size_t(h), 0.0);
    g.duAbs.assign(size_t(h), 0.0);
    std::vector<double> a(static_cast<size_t>(k)), c(static_cast<size_t>(k)), ds(static_cast<size_t>(k));
    double abar = 0;
    for (int64_t i = 0; i < k; ++i) {
        double ai = 0, ci = 0;
        for (int64_t e = 0; e < h; ++e) {
            const double v = s.source(t, i, e);
            ai += double(p.gradHidden.load(t, 0, e)) * v;
            ci += double(s.normWeight.load(0, 0, e)) * double(s.projWeight.load(0, 0, e)) * v;
        }
        a[size_t(i)] = ai;
        c[size_t(i)] = ci;
        abar += double(p.probs.load(t, i, 0)) * ai;
    }
    for (int64_t i = 0; i < k; ++i) {
        const double pi = p.probs.load(t, i, 0), ri = p.invNorm.load(t, i, 0);
        ds[size_t(i)] = pi * (a[size_t(i)] - abar);
        const double coef = ds[size_t(i)] * ri * ri * ri * c[size_t(i)] / double(h);
        for (int64_t e = 0; e < h; ++e) {
            const double v = s.source(t, i, e);
            const double u = double(s.normWeight.load(0, 0, e)) * double(s.projWeight.load(0, 0, e));
            g.dv[size_t(i * h + e)] = pi * double(p.gradHidden.load(t, 0, e)) + ds[size_t(i)] * ri * u - coef * v;
            g.du[size_t(e)] += ds[size_t(i)] * ri * v;
            g.duAbs[size_t(e)] += std::fabs(ds[size_t(i)] * ri * v);
        }
    }
    return g;
}

std::vector<float> naiveForwardToken(const Sources& s, float eps, int64_t t) {
    const int64_t k = s.blocks + 1, h = s.hidden;
    const DType lowp = s.partial.dtype;
    std::vector<float> score(static_cast<size_t>(k)), out(size_t(h), 0.0f);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < k; ++i) {
        float ss = 0;
        for (int64_t c = 0; c < h; ++c) ss += s.source(t, i, c) * s.source(t, i, c);
        const float inv = 1.0f / std::sqrt((h > 0 ? ss / float(h) : 0.0f) + eps);
        float dot = 0;
        for (int64_t c = 0; c < h; ++c) {
            const float normed = roundTo(lowp, s.normWeight.load(0, 0, c) * roundTo(lowp, s.source(t, i, c) * inv));
            dot += s.projWeight.load(0, 0, c) * normed;
        }
        score[size_t(i)] = roundTo(lowp, dot);
        m = std::max(m, score[size_t(i)]);
    }
    float l = 0;
    for (int64_t i = 0; i < k; ++i) l += std::exp(score[size_t(i)] - m);
    for (int64_t i = 0; i < k; ++i) {
        const float pi = roundTo(lowp, std::exp(score[size_t(i)] - m) / l);
        for (int64_t c = 0; c < h; ++c) out[size_t(c)] += pi * s.source(t, i, c);
    }
    for (float& x : out) x = roundTo(lowp, x);
    return out;
}

std::vector<float> naiveBackwardToken(const BackwardParams& p, int64_t t) {
    const Sources& s = p.src;
    const int64_t k = s.blocks + 1, h = s.hidden;
    const DType lowp = s.partial.dtype;
    std::vector<float> a(static_cast<size_t>(k)), c(static_cast<size_t>(k)), dv(static_cast<size_t>(k * h));
    float abar = 0;
    for (int64_t i = 0; i < k; ++i) {
        float ai = 0, ci = 0;
        for (int64_t e = 0; e < h; ++e) {
            ai += p.gradHidden.load(t, 0, e) * s.source(t, i, e);
            ci += roundTo(lowp, s.normWeight.load(0, 0, e) * s.projWeight.load(0, 0, e)) * s.source(t, i, e);
        }
        a[size_t(i)] = roundTo(lowp, ai);
        c[size_t(i)] = roundTo(lowp, ci);
        abar += p.probs.load(t, i, 0) * a[size_t(i)];
    }
    for (int64_t i = 0; i < k; ++i) {
        const float pi = p.probs.load(t, i, 0), ri = p.invNorm.load(t, i, 0);
        const float ds = roundTo(lowp, pi * (a[size_t(i)] - abar));
        for (int64_t e = 0; e < h; ++e) {
            const float u = roundTo(lowp, s.normWeight.load(0, 0, e) * s.projWeight.load(0, 0, e));
            dv[size_t(i * h + e)] = roundTo(lowp, pi * p.gradHidden.load(t, 0, e) + ds * ri * u -
                                                      ds * ri * ri * ri * c[size_t(i)] / float(h) * s.source(t, i, e));
        }
    }
    return dv;
}

namespace {

bool available() { return true; }
uint64_t noScratchForward(const ForwardParams&) { return 0; }
uint64_t noScratchBackward(const BackwardParams&) { return 0; }

void forwardTokens(const ForwardParams& p, const float*, int64_t t0, int64_t t1, void*) {
    for (int64_t t = t0; t < t1; ++t) {
        const ReferenceToken r = referenceForwardToken(p.src, p.eps, t);
        for (int64_t c = 0; c < p.src.hidden; ++c) p.hidden.store(t, 0, c, float(r.hidden[size_t(c)]));
        if (p.saveStats)
            for (int64_t i = 0; i <= p.src.blocks; ++i) {
                p.invNorm.store(t, i, 0, float(r.invNorm[size_t(i)]));
                p.probs.store(t, i, 0, float(r.probs[size_t(i)]));
            }
    }
}

void backwardTokens(const BackwardParams& p, const float*, int64_t t0, int64_t t1, float* du, void*) {
    const int64_t h = p.src.hidden, n = p.src.blocks;
    for (int64_t t = t0; t < t1; ++t) {
        const ReferenceTokenGrad g = referenceBackwardToken(p, t);
        for (int64_t i = 0; i <= n; ++i)
            for (int64_t e = 0; e < h; ++e) {
                const float v = float(g.dv[size_t(i * h + e)]);
                if (i < n) p.gradBlockRes.store(t, i, e, v);
                else p.gradPartial.store(t, 0, e, v);
            }
        for (int64_t e = 0; e < h; ++e) du[e] += float(g.du[size_t(e)]);
    }
}

}  // namespace

const Kernel& kernelReference() {
    static const Kernel k{"reference", available, noScratchForward, forwardTokens, noScratchBackward, backwardTokens};
    return k;
}

}  // namespace attnops::bar
