// The tiled flash-attention forward kernel in portable C++: query blocks against key blocks
// with an online softmax, fp32 accumulation, O(block) scratch per thread. It is compiled three
// times from one body (x86-64 baseline, AVX2+FMA, AVX-512) through target attributes, so the
// compiler vectorises the inner loops for each ISA; the ISA probe picks the entry.
//
// Per score row the order of every reduction is fixed (head dim ascending for Q.K, keys
// ascending for the softmax sums and P.V), so results depend on neither threads nor scheduling.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/generic/fast_exp.hpp"
#include "cpu/generic/score_row.hpp"
#include "cpu/isa.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fa {
namespace {

using tile::kNegInf;
constexpr int64_t kAlignFloats = 16;  // 64-byte alignment of scratch arrays

int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Scratch arrays of one thread, carved from its workspace slice.
struct Scratch {
    float* q;     // [queryRows][d]
    float* kt;    // [d][keyRows]   (transposed so a score row is a vectorisable axpy over keys)
    float* v;     // [keyRows][dv]
    float* acc;   // [queryRows][dv]
    float* s;     // [keyRows] scores of one row
    float* m;     // [queryRows] running max
    float* l;     // [queryRows] running sum
    uint8_t* kept;  // [keyRows]
    uint8_t* keep;  // [keyRows] dropout keep flags

    static int64_t floats(const ForwardParams& p, TileShape t) {
        return alignUp(t.queryRows * p.d) + alignUp(p.d * t.keyRows) + alignUp(t.keyRows * p.dv) +
               alignUp(t.queryRows * p.dv) + alignUp(t.keyRows) + 2 * alignUp(t.queryRows) +
               2 * alignUp(t.keyRows);  // byte arrays rounded up generously
    }

    Scratch(const ForwardParams& p, TileShape t, void* base) {
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        q = take(t.queryRows * p.d);
        kt = take(p.d * t.keyRows);
        v = take(t.keyRows * p.dv);
        acc = take(t.queryRows * p.dv);
        s = take(t.keyRows);
        m = take(t.queryRows);
        l = take(t.queryRows);
        kept = reinterpret_cast<uint8_t*>(take(t.keyRows));
        keep = reinterpret_cast<uint8_t*>(take(t.keyRows));
    }
};

TileShape chooseTile(const ForwardParams& p, const PlatformInfo&) {
    TileShape t;
    t.queryRows = 64;
    // Keep the transposed key block (d x keyRows floats) within about half of L1.
    t.keyRows = p.d <= 128 ? 64 : (p.d <= 256 ? 32 : 16);
    return t;
}

uint64_t scratchBytes(const ForwardParams& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

// --- steps of one work unit, always inlined into the ISA-specific entry points ---

ATTNOPS_INLINE void loadQueryBlock(const ForwardParams& p, const WorkUnit& u, int64_t n1, float* q) {
    tile::loadRows(p.q, u.b, n1, p.seq.qStart[size_t(u.b)] + u.q0, u.q1 - u.q0, p.d, q);
}

ATTNOPS_INLINE void loadKeyValueBlock(const ForwardParams& p, const WorkUnit& u, int64_t k0, int64_t nk,
                                      int64_t keyRows, float* kt, float* v) {
    const int64_t row0 = p.seq.kvStart[size_t(u.b)] + k0;
    tile::loadRowsTransposed(p.k, u.b, u.n2, row0, nk, p.d, keyRows, kt);
    tile::loadRows(p.v, u.b, u.n2, row0, nk, p.dv, v);
}

ATTNOPS_INLINE void runUnitBody(const ForwardParams& p, TileShape t, const WorkUnit& u, void* scratch) {
    Scratch sc(p, t, scratch);
    const int64_t sq = p.seq.qLen[size_t(u.b)], skv = p.seq.kvLen[size_t(u.b)];
    const SeqRule rule = seqRule(p.mask, u.b, sq, skv);
    const KeyRange keys = keyRange(rule, u.q0, u.q1, skv);
    const int64_t rows = u.q1 - u.q0;
    for (int64_t g = 0; g < p.group; ++g) {
        const int64_t n1 = u.n2 * p.group + g;
        loadQueryBlock(p, u, n1, sc.q);
        for (int64_t r = 0; r < rows; ++r) {
            sc.m[r] = kNegInf;
            sc.l[r] = 0.0f;
            std::fill(sc.acc + r * p.dv, sc.acc + (r + 1) * p.dv, 0.0f);
        }
        for (int64_t k0 = keys.lo; k0 < keys.hi; k0 += t.keyRows) {
            const int64_t nk = std::min(t.keyRows, keys.hi - k0);
            loadKeyValueBlock(p, u, k0, nk, t.keyRows, sc.kt, sc.v);
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t i = u.q0 + r;
                tile::rowScores(sc.q + r * p.d, sc.kt, p.d, nk, t.keyRows, sc.s);
                const float rowMax = tile::finishScores(p, u.b, n1, rule, i, k0, nk, skv, sc.s, sc.kept);
                if (rowMax == kNegInf) continue;  // nothing kept in this block for this row
                tile::accumulateRow(p, u, n1, i, k0, nk, rowMax, sc.s, sc.kept, sc.keep, sc.v, sc.m[r], sc.l[r],
                                    sc.acc + r * p.dv);
            }
        }
        for (int64_t r = 0; r < rows; ++r) tile::storeRow(p, u, n1, u.q0 + r, sc.m[r], sc.l[r], sc.acc + r * p.dv);
    }
}

bool acceptsAll(const ForwardParams&) { return true; }

__attribute__((flatten)) void runBaseline(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    runUnitBody(p, t, u, s);
}
__attribute__((flatten, target("avx2,fma"))) void runAvx2(const ForwardParams& p, TileShape t, const WorkUnit& u,
                                                          void* s) {
    runUnitBody(p, t, u, s);
}
// 512-bit vectors: GCC and clang otherwise prefer 256-bit ones for auto-vectorised code.
#if defined(__clang__)
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma"), min_vector_width(512)
#else
#define ATTNOPS_TARGET_AVX512 flatten, target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")
#endif
__attribute__((ATTNOPS_TARGET_AVX512)) void runAvx512(const ForwardParams& p, TileShape t, const WorkUnit& u, void* s) {
    runUnitBody(p, t, u, s);
}

bool always() { return true; }
bool hasAvx2() { return cpu::isa().avx2 && cpu::isa().fma; }
bool hasAvx512() { return cpu::isa().avx512f && cpu::isa().avx512bw && cpu::isa().avx512vl && hasAvx2(); }

}  // namespace

const ForwardKernel& forwardKernelTiledAvx512() {
    static const ForwardKernel k{"tiled-avx512", hasAvx512, acceptsAll, chooseTile, scratchBytes, runAvx512};
    return k;
}
const ForwardKernel& forwardKernelTiledAvx2() {
    static const ForwardKernel k{"tiled-avx2", hasAvx2, acceptsAll, chooseTile, scratchBytes, runAvx2};
    return k;
}
const ForwardKernel& forwardKernelTiledGeneric() {
    static const ForwardKernel k{"tiled-generic", always, acceptsAll, chooseTile, scratchBytes, runBaseline};
    return k;
}

}  // namespace attnops::fa
