// BlockAttentionResiduals with AVX-512 intrinsics, built to run at memory speed:
//   - each source row is read from memory once per token, converted to fp32 as it is loaded
//     (vcvtph2ps for fp16, a shift for bf16) while the sum of squares and u . v are accumulated
//     in the same pass; the fp32 copy stays in L1/L2 for the rest of the token's work;
//   - the backward writes each gradient row in the same loop that accumulates du;
//   - large outputs are written with non-temporal stores (from the first vector-aligned element
//     of each row), so written rows do not first cost a read for ownership: the backward writes
//     nearly as many bytes as it reads (fp32 backward: 29 -> 35 GB/s);
//   - the loads run a software prefetch 4 KiB ahead: the rows of consecutive sources and tokens
//     are usually adjacent, and the hardware prefetcher alone left bf16 latency-bound.
// Rows whose hidden stride is not 1 are gathered through the generic row conversion first.
//
// Every reduction over H uses four 16-lane accumulators over fixed 64-column groups, combined in
// a fixed order, so results are the same on every run and for any thread count.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() values, which its flow analysis
// reports as "may be used uninitialized" once inlined here (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/bar_scratch.hpp"
#include "cpu/generic/convert.hpp"
#include "cpu/isa.hpp"
#include "ops/block_attention_residuals/kernel.hpp"

#if defined(__clang__)
#define ATTNOPS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"), min_vector_width(512)))
#else
#define ATTNOPS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#endif
#define ATTNOPS_AVX512_INLINE ATTNOPS_AVX512 static inline __attribute__((always_inline))

namespace attnops::bar {
namespace {

constexpr int64_t kW = 16;                        // fp32 lanes of a zmm register
// Outputs larger than this bypass the caches. Not tuned: any size well above the last-level cache
// share of two cores would do; below it the output may still be read back from cache.
constexpr uint64_t kStreamOutputBytes = 32u << 20;
constexpr int64_t kPrefetchBytes = 4096;            // software prefetch distance


ATTNOPS_AVX512_INLINE __mmask16 tailMask(int64_t remaining) {
    return remaining >= kW ? __mmask16(0xffff) : __mmask16((1u << remaining) - 1u);
}

// Elements [index, index + 16) of a contiguous row, converted to fp32 (masked lanes read as 0).
// Masked loads and stores only for a row's tail: full vectors use plain ones, which are much
// cheaper on some cores (masked stores on AMD Zen 4).
ATTNOPS_AVX512_INLINE __m512 load16(const void* row, int64_t index, DType dtype, __mmask16 m) {
    const bool full = m == __mmask16(0xffff);
    if (dtype == DType::F32) {
        const float* p = static_cast<const float*>(row) + index;
        return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
    }
    const uint16_t* p = static_cast<const uint16_t*>(row) + index;
    const __m256i h = full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
    if (dtype == DType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

// Rounds to bf16 like cpu::floatToBf16: to nearest even, NaN kept quiet.
ATTNOPS_AVX512_INLINE __m256i toBf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Elements [index, index + 16) of a contiguous row = v rounded to dtype; `stream` asks for a
// non-temporal store, used when the whole vector is stored and its address is aligned.
ATTNOPS_AVX512_INLINE void store16(void* row, int64_t index, DType dtype, __m512 v, __mmask16 m, bool stream) {
    const bool full = m == __mmask16(0xffff);
    if (dtype == DType::F32) {
        float* p = static_cast<float*>(row) + index;
        if (stream && full && (reinterpret_cast<uintptr_t>(p) & 63u) == 0)
            _mm512_stream_ps(p, v);
        else if (full)
            _mm512_storeu_ps(p, v);
        else
            _mm512_mask_storeu_ps(p, m, v);
        return;
    }
    uint16_t* p = static_cast<uint16_t*>(row) + index;
    const __m256i h = dtype == DType::BF16 ? toBf16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream && full && (reinterpret_cast<uintptr_t>(p) & 31u) == 0)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
    else if (full)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    else
        _mm256_mask_storeu_epi16(p, m, h);
}

ATTNOPS_AVX512_INLINE float lanesSum(__m512 v) {
    alignas(64) float lanes[kW];
    _mm512_store_ps(lanes, v);
    float s = 0.0f;
    for (float x : lanes) s += x;
    return s;
}

// Four accumulators over fixed 64-column groups (column h goes to accumulator (h / 16) % 4),
// combined as (a0 + a1) + (a2 + a3), then the lanes in ascending order.
ATTNOPS_AVX512_INLINE float combine(const __m512 a[4]) {
    return lanesSum(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

// Where row i of token t starts, as a contiguous row (nullptr: its hidden stride is not 1, or
// the tensor is empty and may have a NULL base, which takes no offset).
ATTNOPS_AVX512_INLINE const void* contiguousRow(const View3& v, int64_t t, int64_t row) {
    if (v.stride[2] != 1 || v.data == nullptr) return nullptr;
    const int64_t bytes = v.dtype == DType::F32 ? 4 : 2;
    return static_cast<const char*>(v.data) + (t * v.stride[0] + row * v.stride[1]) * bytes;
}

ATTNOPS_AVX512_INLINE void* contiguousRow(const MutView3& v, int64_t t, int64_t row) {
    if (v.stride[2] != 1 || v.data == nullptr) return nullptr;
    const int64_t bytes = v.dtype == DType::F32 ? 4 : 2;
    return static_cast<char*>(v.data) + (t * v.stride[0] + row * v.stride[1]) * bytes;
}

// x[e..e+16) = the row's elements as fp32; ss += x * x, dy += y * x (y's padding may hold any
// bits, so its tail is loaded masked).
ATTNOPS_AVX512_INLINE void loadStep(const void* src, DType dtype, const float* y, float* x, int64_t e, __mmask16 m,
                                    __m512& ss, __m512& dy) {
    const __m512 xv = load16(src, e, dtype, m);
    _mm512_store_ps(x + e, xv);
    ss = _mm512_fmadd_ps(xv, xv, ss);
    const __m512 yv = m == __mmask16(0xffff) ? _mm512_load_ps(y + e) : _mm512_maskz_load_ps(m, y + e);
    dy = _mm512_fmadd_ps(yv, xv, dy);
}

// Loads source i of token t into x (fp32) and returns sum(x^2) and y . x in one pass.
ATTNOPS_AVX512_INLINE void loadWithDots(const Sources& s, int64_t t, int64_t i, const float* __restrict y,
                                        float* __restrict x, float& sumSquares, float& dotY) {
    const View3& v = i < s.blocks ? s.blockRes : s.partial;
    const int64_t row = i < s.blocks ? i : 0, h = s.hidden;
    const void* src = contiguousRow(v, t, row);
    DType dtype = v.dtype;
    if (src == nullptr) {  // strided hidden axis: gather first, then the same pass over fp32
        cpu::loadRow(v.data, t * v.stride[0] + row * v.stride[1], v.stride[2], v.dtype, h, x);
        src = x;
        dtype = DType::F32;
    }
    // Accumulators in registers: column group q = (e / 16) % 4 goes to ss[q] and dy[q]; the
    // 64-column main loop names them so the compiler keeps them out of memory.
    __m512 ss[4], dy[4];
    for (int q = 0; q < 4; ++q) ss[q] = dy[q] = _mm512_setzero_ps();
    int64_t e = 0;
    const char* ahead = static_cast<const char*>(src) + kPrefetchBytes;
    const int64_t elementBytes = dtype == DType::F32 ? 4 : 2;
    for (; e + 4 * kW <= h; e += 4 * kW) {
        // The rows of consecutive sources (and tokens) usually follow each other in memory: keep
        // the stream kPrefetchBytes ahead of the loads (a hint; it may run past the buffer).
        for (int64_t line = 0; line < 4 * kW * elementBytes; line += 64)
            _mm_prefetch(ahead + e * elementBytes + line, _MM_HINT_T0);
        loadStep(src, dtype, y, x, e, __mmask16(0xffff), ss[0], dy[0]);
        loadStep(src, dtype, y, x, e + kW, __mmask16(0xffff), ss[1], dy[1]);
        loadStep(src, dtype, y, x, e + 2 * kW, __mmask16(0xffff), ss[2], dy[2]);
        loadStep(src, dtype, y, x, e + 3 * kW, __mmask16(0xffff), ss[3], dy[3]);
    }
    if (e < h) loadStep(src, dtype, y, x, e, tailMask(h - e), ss[0], dy[0]);
    if ((e += kW) < h) loadStep(src, dtype, y, x, e, tailMask(h - e), ss[1], dy[1]);
    if ((e += kW) < h) loadStep(src, dtype, y, x, e, tailMask(h - e), ss[2], dy[2]);
    if ((e += kW) < h) loadStep(src, dtype, y, x, e, tailMask(h - e), ss[3], dy[3]);
    sumSquares = combine(ss);
    dotY = combine(dy);
}

// u . x over an fp32 row in L1 with the same fixed column grouping (u's padding: any bits).
ATTNOPS_AVX512_INLINE float dotRow(const float* u, const float* x, int64_t h) {
    __m512 a[4];
    for (__m512& q : a) q = _mm512_setzero_ps();
    int64_t e = 0;
    for (; e + 4 * kW <= h; e += 4 * kW)
        for (int q = 0; q < 4; ++q)
            a[q] = _mm512_fmadd_ps(_mm512_load_ps(u + e + q * kW), _mm512_load_ps(x + e + q * kW), a[q]);
    for (int q = 0; e < h; e += kW, ++q)
        a[q] = _mm512_fmadd_ps(_mm512_maskz_load_ps(tailMask(h - e), u + e), _mm512_load_ps(x + e), a[q]);
    return combine(a);
}

// Stores the fp32 row x (length h) as row `row` of token t of `out`.
ATTNOPS_AVX512_INLINE void storeRow(const MutView3& out, int64_t t, int64_t row, int64_t h, const float* x,
                                    bool stream) {
    void* dst = contiguousRow(out, t, row);
    if (dst == nullptr) {
        cpu::storeRow(out.data, t * out.stride[0] + row * out.stride[1], out.stride[2], out.dtype, h, x);
        return;
    }
    int64_t e = 0;
    if (stream) {  // the elements before the first vector-aligned address, one by one
        const uintptr_t vectorBytes = out.dtype == DType::F32 ? 64 : 32, elementBytes = out.dtype == DType::F32 ? 4 : 2;
        const uintptr_t misaligned = reinterpret_cast<uintptr_t>(dst) % vectorBytes;
        e = misaligned % elementBytes != 0 ? h : std::min<int64_t>(h, int64_t((vectorBytes - misaligned) % vectorBytes / elementBytes));
        cpu::storeRow(dst, 0, 1, out.dtype, e, x);
    }
    for (; e < h; e += kW) store16(dst, e, out.dtype, _mm512_loadu_ps(x + e), tailMask(h - e), stream);
}

uint64_t outputBytes(const MutView3& v, uint64_t elements) {
    return elements * (v.dtype == DType::F32 ? 4u : 2u);
}


ATTNOPS_AVX512 void forwardTokens(const ForwardParams& p, const float* u, int64_t t0, int64_t t1, void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1;
    const scratch::Forward sc(s, scratchBase);
    float *x = sc.x, *acc = sc.acc, *score = sc.score, *inv = sc.inv;
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    const bool stream = outputBytes(p.hidden, uint64_t(s.tokens) * uint64_t(h)) > kStreamOutputBytes;
    for (int64_t t = t0; t < t1; ++t) {
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        for (int64_t e = 0; e < h; e += kW) _mm512_store_ps(acc + e, _mm512_setzero_ps());
        for (int64_t i = 0; i < k; ++i) {
            float ss = 0.0f, c = 0.0f;
            loadWithDots(s, t, i, u, x, ss, c);
            inv[i] = 1.0f / std::sqrt(ss * invH + p.eps);
            score[i] = inv[i] * c;
            const float mNew = (score[i] > m || score[i] != score[i]) ? score[i] : m;
            const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - mNew);
            const float w = std::exp(score[i] - mNew);
            const __m512 va = _mm512_set1_ps(alpha), vw = _mm512_set1_ps(w);
            for (int64_t e = 0; e < h; e += kW)
                _mm512_store_ps(acc + e, _mm512_fmadd_ps(_mm512_load_ps(acc + e), va, _mm512_mul_ps(vw, _mm512_load_ps(x + e))));
            l = l * alpha + w;
            m = mNew;
        }
        const __m512 invL = _mm512_set1_ps(1.0f / l);
        for (int64_t e = 0; e < h; e += kW) _mm512_store_ps(acc + e, _mm512_mul_ps(_mm512_load_ps(acc + e), invL));
        storeRow(p.hidden, t, 0, h, acc, stream);
        if (p.saveStats)
            for (int64_t i = 0; i < k; ++i) {
                p.invNorm.store(t, i, 0, inv[i]);
                p.probs.store(t, i, 0, std::exp(score[i] - m) * (1.0f / l));
            }
    }
    if (stream) _mm_sfence();  // non-temporal stores are visible before the driver's join
}

ATTNOPS_AVX512 void backwardTokens(const BackwardParams& p, const float* u, int64_t t0, int64_t t1, float* du,
                                   void* scratchBase) {
    const Sources& s = p.src;
    const int64_t h = s.hidden, k = s.blocks + 1, n = s.blocks;
    const scratch::Backward sc(s, scratchBase);
    const bool cached = sc.cached;
    float *dy = sc.dy, *a = sc.a, *c = sc.c;
    const float invH = h > 0 ? 1.0f / float(h) : 0.0f;
    const bool stream = outputBytes(p.gradBlockRes, uint64_t(s.tokens) * uint64_t(k) * uint64_t(h)) > kStreamOutputBytes;
    for (int64_t t = t0; t < t1; ++t) {
        cpu::loadRow(p.gradHidden.data, t * p.gradHidden.stride[0], p.gradHidden.stride[2], p.gradHidden.dtype, h, dy);
        for (int64_t e = h; e < scratch::alignUp(h); ++e) dy[e] = 0.0f;
        // Pass 1: a_i = dy . v_i and c_i = u . v_i, reading each row once. a-bar in double: when
        // one p_i is close to 1, a_i - a-bar cancels to a few fp32 ulps (see bar_vector.cpp).
        double abar = 0.0;
        for (int64_t i = 0; i < k; ++i) {
            float* x = sc.row(i);
            float ss = 0.0f;
            loadWithDots(s, t, i, dy, x, ss, a[i]);
            // u . v_i: a second pass over the row, now in L1 (u has the same fixed grouping).
            c[i] = dotRow(u, x, h);
            abar += double(p.probs.load(t, i, 0)) * double(a[i]);
        }
        // Pass 2: dv_i = p_i dy + ds_i r_i u - (ds_i r_i^3 c_i / H) v_i; du += ds_i r_i v_i.
        for (int64_t i = 0; i < k; ++i) {
            float* x = sc.row(i);
            if (!cached) {
                float ss = 0.0f, unused = 0.0f;
                loadWithDots(s, t, i, dy, x, ss, unused);
            }
            const float pi = p.probs.load(t, i, 0), ri = p.invNorm.load(t, i, 0);
            const float ds = float(double(pi) * (double(a[i]) - abar));
            const float coefU = ds * ri, coefV = ds * ri * ri * ri * c[i] * invH;
            const __m512 vp = _mm512_set1_ps(pi), vu = _mm512_set1_ps(coefU), vv = _mm512_set1_ps(coefV);
            const MutView3& out = i < n ? p.gradBlockRes : p.gradPartial;
            void* dst = contiguousRow(out, t, i < n ? i : 0);
            for (int64_t e = 0; e < h; e += kW) {
                const __m512 xv = _mm512_load_ps(x + e);
                const __mmask16 m = tailMask(h - e);
                if (m == __mmask16(0xffff))
                    _mm512_storeu_ps(du + e, _mm512_fmadd_ps(vu, xv, _mm512_loadu_ps(du + e)));
                else
                    _mm512_mask_storeu_ps(du + e, m, _mm512_fmadd_ps(vu, xv, _mm512_maskz_loadu_ps(m, du + e)));
                const __m512 dv = _mm512_fnmadd_ps(vv, xv, _mm512_fmadd_ps(vu, _mm512_load_ps(u + e), _mm512_mul_ps(vp, _mm512_load_ps(dy + e))));
                if (dst != nullptr && !stream)
                    store16(dst, e, out.dtype, dv, m, false);
                else
                    _mm512_store_ps(x + e, dv);  // x (no longer needed) becomes dv_i
            }
            if (dst == nullptr || stream) storeRow(out, t, i < n ? i : 0, h, x, stream);
        }
    }
    if (stream) _mm_sfence();
}

bool hasAvx512() {
    const cpu::IsaFeatures& f = cpu::isa();
    return f.avx512f && f.avx512bw && f.avx512vl && f.avx2 && f.fma && f.f16c;
}

}  // namespace

const Kernel& kernelStreamAvx512() {
    static const Kernel k{"stream-avx512", hasAvx512, scratch::Forward::bytes, forwardTokens,
                          scratch::Backward::bytes, backwardTokens};
    return k;
}

}  // namespace attnops::bar
