// BlockAttentionResiduals kernels in portable C++, compiled for the x86-64 baseline, AVX2+FMA and
// AVX-512 through target attributes (like the attention kernels). Memory-bound: each source row
// is read from memory once per token (forward: one pass with an online softmax; backward: the
// token's rows are kept in a scratch tile between the two passes when they fit).
//
// Reductions over H use 16 fixed lanes combined in a fixed order, so they vectorise without
// depending on the compiler's reassociation, and results are the same on every run.
#include <cmath>
#include <limits>

#include "cpu/bar_scratch.hpp"
#include "cpu/generic/convert.hpp"
#include "cpu/isa.hpp"
#include "ops/block_attention_residuals/kernel.hpp"

#define ATTNOPS_INLINE static inline __attribute__((always_inline))

namespace attnops::bar {
namespace {

constexpr int64_t kLanes = 16;

ATTNOPS_INLINE float laneSum(const float* lanes) {
    float s = 0.0f;
    for (int64_t l = 0; l < kLanes; ++l) s += lanes[l];
    return s;
}

// sum_h a[h] * b[h] with 16 fixed lanes.
ATTNOPS_INLINE float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
    float lanes[kLanes] = {};
    int64_t h = 0;
    for (; h + kLanes <= n; h += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[h + l] * b[h + l];
    for (int64_t l = 0; h + l < n; ++l) lanes[l] += a[h + l] * b[h + l];
    return laneSum(lanes);
}

// Prefetches source i of token t line by line (contiguous rows only).
ATTNOPS_INLINE void prefetchSource(const Sources& s, int64_t t, int64_t i) {
    const View3& v = i < s.blocks ? s.blockRes : s.partial;
    if (s.hidden <= 0 || v.stride[2] != 1) return;
    const int64_t elementBytes = v.dtype == DType::F32 ? 4 : 2;
    const int64_t row = i < s.blocks ? i : 0;
    const char* p = static_cast<const char*>(v.data) + (t * v.stride[0] + row * v.stride[1]) * elementBytes;
    for (int64_t b = 0; b < s.hidden * elementBytes; b += 64) __builtin_prefetch(p + b);
}

// Loads source i of token t, prefetching source `next` of token nextT (nextT < 0: none) meanwhile:
// the rows are streamed from memory once, and the prefetch keeps that stream ahead of the maths.
ATTNOPS_INLINE void loadSource(const Sources& s, int64_t t, int64_t i, float* __restrict x, int64_t nextT,
                               int64_t next) {
    const View3& v = i < s.blocks ? s.blockRes : s.partial;
    const int64_t row = i < s.blocks ? i : 0;
    if (nextT >= 0) prefetchSource(s, nextT, next);
    cpu::loadRow(v.data, t * v.stride[0] + row * v.stride[1], v.stride[2], v.dtype, s.hidden, x);
}

ATTNOPS_INLINE void storeRowOf(const MutView3& v, int64_t t, int64_t i, int64_t n, const float* x) {
    cpu::storeRow(v.data, t * v.stride[0] + i * v.stride[1], v.stride[2], v.dtype, n, x);
}


ATTNOPS_INLINE void forwardBody(const ForwardParams& p, const float* __restrict u, int64_t t0, int64_t t1,
                                void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1;
    const scratch::Forward sc(s, scratchBase);
    float *x = sc.x, *acc = sc.acc, *score = sc.score, *inv = sc.inv;
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    for (int64_t t = t0; t < t1; ++t) {
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        for (int64_t e = 0; e < h; ++e) acc[e] = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            const bool last = i + 1 == k;
            loadSource(s, t, i, x, last ? (t + 1 < t1 ? t + 1 : -1) : t, last ? 0 : i + 1);
            const float ss = dot(x, x, h), c = dot(u, x, h);
            inv[i] = 1.0f / std::sqrt(ss * invH + p.eps);
            score[i] = inv[i] * c;
            const float mNew = (score[i] > m || score[i] != score[i]) ? score[i] : m;
            const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - mNew);
            const float w = std::exp(score[i] - mNew);
            for (int64_t e = 0; e < h; ++e) acc[e] = acc[e] * alpha + w * x[e];
            l = l * alpha + w;
            m = mNew;
        }
        const float invL = 1.0f / l;
        for (int64_t e = 0; e < h; ++e) acc[e] *= invL;
        storeRowOf(p.hidden, t, 0, h, acc);
        if (p.saveStats)
            for (int64_t i = 0; i < k; ++i) {
                p.invNorm.store(t, i, 0, inv[i]);
                p.probs.store(t, i, 0, std::exp(score[i] - m) * invL);
            }
    }
}

ATTNOPS_INLINE void backwardBody(const BackwardParams& p, const float* __restrict u, int64_t t0, int64_t t1,
                                 float* __restrict du, void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1, n = s.blocks;
    const scratch::Backward sc(s, scratchBase);
    const bool cached = sc.cached;
    float *dy = sc.dy, *a = sc.a, *c = sc.c;
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    for (int64_t t = t0; t < t1; ++t) {
        cpu::loadRow(p.gradHidden.data, t * p.gradHidden.stride[0], p.gradHidden.stride[2], p.gradHidden.dtype, h, dy);
        // Pass 1: a_i = dy . v_i and c_i = u . v_i, reading each row once.
        // a-bar in double: when one p_i is close to 1, a_i - a-bar cancels to a few fp32 ulps of
        // a-bar, so an fp32 a-bar would leave ds_i (and the weight gradients) with % errors.
        double abar = 0.0;
        for (int64_t i = 0; i < k; ++i) {
            float* x = sc.row(i);
            loadSource(s, t, i, x, i + 1 < k ? t : (t + 1 < t1 ? t + 1 : -1), i + 1 < k ? i + 1 : 0);
            a[i] = dot(dy, x, h);
            c[i] = dot(u, x, h);
            abar += double(p.probs.load(t, i, 0)) * double(a[i]);
        }
        // Pass 2: dv_i = p_i dy + ds_i r_i u - (ds_i r_i^3 c_i / H) v_i; du += ds_i r_i v_i.
        for (int64_t i = 0; i < k; ++i) {
            float* x = sc.row(i);
            if (!cached) loadSource(s, t, i, x, -1, 0);
            const float pi = p.probs.load(t, i, 0), ri = p.invNorm.load(t, i, 0);
            const float ds = float(double(pi) * (double(a[i]) - abar));
            const float coefU = ds * ri, coefV = ds * ri * ri * ri * c[i] * invH;
            for (int64_t e = 0; e < h; ++e) du[e] += coefU * x[e];
            for (int64_t e = 0; e < h; ++e) x[e] = pi * dy[e] + coefU * u[e] - coefV * x[e];  // x becomes dv_i
            if (i < n)
                storeRowOf(p.gradBlockRes, t, i, h, x);
            else
                storeRowOf(p.gradPartial, t, 0, h, x);
        }
    }
}

__attribute__((flatten)) void forwardBaseline(const ForwardParams& p, const float* u, int64_t t0, int64_t t1, void* s) {
    forwardBody(p, u, t0, t1, s);
}
__attribute__((flatten)) void backwardBaseline(const BackwardParams& p, const float* u, int64_t t0, int64_t t1,
                                               float* du, void* s) {
    backwardBody(p, u, t0, t1, du, s);
}
__attribute__((flatten, target("avx2,fma"))) void forwardAvx2(const ForwardParams& p, const float* u, int64_t t0,
                                                              int64_t t1, void* s) {
    forwardBody(p, u, t0, t1, s);
}
__attribute__((flatten, target("avx2,fma"))) void backwardAvx2(const BackwardParams& p, const float* u, int64_t t0,
                                                               int64_t t1, float* du, void* s) {
    backwardBody(p, u, t0, t1, du, s);
}
#if defined(__clang__)
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma"), min_vector_width(512)
#else
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")
#endif
__attribute__((ATTNOPS_TARGET_AVX512)) void forwardAvx512(const ForwardParams& p, const float* u, int64_t t0,
                                                          int64_t t1, void* s) {
    forwardBody(p, u, t0, t1, s);
}
__attribute__((ATTNOPS_TARGET_AVX512)) void backwardAvx512(const BackwardParams& p, const float* u, int64_t t0,
                                                           int64_t t1, float* du, void* s) {
    backwardBody(p, u, t0, t1, du, s);
}

bool always() { return true; }
bool hasAvx2() { return cpu::isa().avx2 && cpu::isa().fma; }
bool hasAvx512() { return cpu::isa().avx512f && cpu::isa().avx512bw && cpu::isa().avx512vl && hasAvx2(); }

}  // namespace

const Kernel& kernelVectorAvx512() {
    static const Kernel k{"vector-avx512", hasAvx512, scratch::Forward::bytes, forwardAvx512,
                          scratch::Backward::bytes, backwardAvx512};
    return k;
}
const Kernel& kernelVectorAvx2() {
    static const Kernel k{"vector-avx2", hasAvx2, scratch::Forward::bytes, forwardAvx2,
                          scratch::Backward::bytes, backwardAvx2};
    return k;
}
const Kernel& kernelVectorGeneric() {
    static const Kernel k{"vector-generic", always, scratch::Forward::bytes, forwardBaseline,
                          scratch::Backward::bytes, backwardBaseline};
    return k;
}

}  // namespace attnops::bar
