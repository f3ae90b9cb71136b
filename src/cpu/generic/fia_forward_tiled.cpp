// The tiled FusedInferAttentionScore forward in portable C++: the query rows of a whole GQA group
// against blocks of keys gathered once per block (strided, paged, or int8 dequantised), an online
// softmax with fp32 statistics, and the upstream precision model (probabilities rounded to the
// query dtype before P.V, division by the sum at the end).
//
// Takes key splits (kernel.hpp). Per score row the order of every reduction is fixed (head dim ascending for Q.K, keys
// ascending for the sums and P.V), so results depend on neither threads nor scheduling.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/generic/score_row.hpp"
#include "ops/fused_infer_attention_score/fullquant.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"

namespace attnops::fia {
namespace {

using fa::tile::kNegInf;
constexpr int64_t kAlignFloats = 16;    // 64-byte alignment of scratch arrays
constexpr int64_t kRowsPerUnit = 64;    // query rows of one unit, all heads of the group together
constexpr int64_t kKeyRows = 64;        // keys per block

int64_t alignUp(int64_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

// Width of a score dot: the head dim plus the MLA rope part, which the kernel appends to each
// query and key row (spec 5 step 4).
int64_t dotDim(const Params& p) { return p.core.d + p.ropeDim; }

// Scratch arrays of one thread, carved from its workspace slice. Rows are (head g, row r) pairs.
struct Scratch {
    float* q;       // [G * rows][dk], dk = d + ropeDim
    float* kt;      // [dk][keyRows], transposed so a score row is an axpy over keys
    float* v;       // [keyRows][dv]
    float* acc;     // [G * rows][dv]
    float* s;       // [keyRows] scores of one row
    float* m;       // [G * rows] running max
    float* l;       // [G * rows] running sum
    float* row;     // [max(dk, dv)] one gathered key or value row
    uint8_t* kept;  // [keyRows]

    static int64_t floats(const Params& p, TileShape t) {
        const int64_t rows = p.core.group * t.queryRows, dk = dotDim(p);
        return alignUp(rows * dk) + alignUp(dk * t.keyRows) + alignUp(t.keyRows * p.core.dv) + alignUp(rows * p.core.dv) +
               alignUp(t.keyRows) + 2 * alignUp(rows) + alignUp(std::max(dk, p.core.dv)) + alignUp(t.keyRows);
    }

    Scratch(const Params& p, TileShape t, void* base) {
        float* f = static_cast<float*>(base);
        auto take = [&](int64_t n) {
            float* r = f;
            f += alignUp(n);
            return r;
        };
        const int64_t rows = p.core.group * t.queryRows, dk = dotDim(p);
        q = take(rows * dk);
        kt = take(dk * t.keyRows);
        v = take(t.keyRows * p.core.dv);
        acc = take(rows * p.core.dv);
        s = take(t.keyRows);
        m = take(rows);
        l = take(rows);
        row = take(std::max(dk, p.core.dv));
        kept = reinterpret_cast<uint8_t*>(take(t.keyRows));
    }
};

TileShape chooseTile(const Params& p) {
    // A decode step (one row) shares every gathered key block among the group's heads; prefill
    // keeps the group's rows near kRowsPerUnit in total.
    return TileShape{std::max<int64_t>(1, kRowsPerUnit / p.core.group), kKeyRows};
}

uint64_t scratchBytes(const Params& p, TileShape t) { return uint64_t(Scratch::floats(p, t)) * sizeof(float); }

// Row t of kv head m of batch b, dequantised or converted to fp32, `dim` elements.
void gatherRow(const Params& p, const KvSource& src, const AntiquantSpec& quant, int64_t b, int64_t m, int64_t t,
               int64_t dim, float* __restrict dst) {
    if (quant.mode != Antiquant::None) {
        for (int64_t d = 0; d < dim; ++d) dst[d] = kvElement(p, src, quant, b, m, t, d);
        return;
    }
    if (hasKvParts(src)) {  // shared prefix or tensor-list rows (never NZ)
        const KvAddress a = kvAddress(p, src, b, m, t);
        cpu::loadRow(a.data, a.at, a.dimStride, src.dtype, dim, dst);
        return;
    }
    const int64_t at = kvRowOffset(p, src, b, m, t);
    if (src.dimGroup == 0) {
        cpu::loadRow(src.data, at, src.dimStride, src.dtype, dim, dst);
        return;
    }
    for (int64_t d0 = 0; d0 < dim; d0 += src.dimGroup)  // NZ: D0 contiguous lanes per group
        cpu::loadRow(src.data, at + (d0 / src.dimGroup) * src.dimGroupStride, src.dimStride, src.dtype,
                     std::min(src.dimGroup, dim - d0), dst + d0);
}

void loadKeyValueBlock(const Params& p, const WorkUnit& u, int64_t k0, int64_t nk, int64_t keyRows, Scratch& sc) {
    const int64_t d = p.core.d, dv = p.core.dv, dk = dotDim(p);
    for (int64_t j = 0; j < nk; ++j) {
        gatherRow(p, p.key, p.keyQuant, u.b, u.n2, k0 + j, d, sc.row);
        if (p.ropeDim > 0) gatherRow(p, p.keyRope, AntiquantSpec{}, u.b, u.n2, k0 + j, p.ropeDim, sc.row + d);
        for (int64_t c = 0; c < dk; ++c) sc.kt[c * keyRows + j] = sc.row[c];
        gatherRow(p, p.value, p.valueQuant, u.b, u.n2, k0 + j, dv, sc.v + j * dv);
    }
}

// Online-softmax update of one row with a block of scores, then acc += round(P).V.
void accumulateRow(const Params& p, int64_t nk, float rowMax, float* __restrict s, const uint8_t* kept,
                   const float* __restrict v, float& m, float& l, float* __restrict acc) {
    const float mNew = (rowMax > m || rowMax != rowMax) ? rowMax : m;
    const float alpha = m == kNegInf ? 0.0f : cpu::fastExp(m - mNew);
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; ++j) {
        const float e = kept[j] ? cpu::fastExp(s[j] - mNew) : 0.0f;
        sum += e;
        s[j] = roundTo(p.probDType, e);
    }
    l = l * alpha + sum;
    m = mNew;
    const int64_t dv = p.core.dv;
    for (int64_t c = 0; c < dv; ++c) acc[c] *= alpha;
    for (int64_t j = 0; j < nk; ++j) {
        if (!kept[j]) continue;
        const float pj = s[j];
        const float* __restrict vrow = v + j * dv;
        for (int64_t c = 0; c < dv; ++c) acc[c] += pj * vrow[c];
    }
}

void runUnit(const Params& p, TileShape t, const WorkUnit& u, void* scratch) {
    if (p.fullQuant.on) return runFullQuantUnit(p, u);  // int8 query: its own rounding steps (spec 9.2)
    const fa::ForwardParams& c = p.core;
    Scratch sc(p, t, scratch);
    const int64_t sq = c.seq.qLen[size_t(u.b)], skv = c.seq.kvLen[size_t(u.b)];
    const fa::SeqRule rule = fa::seqRule(c.mask, u.b, sq, skv);
    const int64_t rows = u.q1 - u.q0, qRow0 = c.seq.qStart[size_t(u.b)] + u.q0, dk = dotDim(p);
    for (int64_t g = 0; g < c.group; ++g) {
        const int64_t n1 = u.n2 * c.group + g;
        for (int64_t r = 0; r < rows; ++r) {  // [q ; qRope] per row
            float* q = sc.q + (g * rows + r) * dk;
            if (p.queryDequant.scale == nullptr) {
                fa::tile::loadRows(c.q, u.b, n1, qRow0 + r, 1, c.d, q);
            } else {  // MLA full quant: the int8 query dequantised once per row
                for (int64_t e = 0; e < c.d; ++e) q[e] = queryElement(p, u.b, n1, qRow0 + r, e);
            }
            if (p.ropeDim > 0) fa::tile::loadRows(p.queryRope, u.b, n1, qRow0 + r, 1, p.ropeDim, q + c.d);
        }
        for (int64_t r = g * rows; r < (g + 1) * rows; ++r) {
            sc.m[r] = kNegInf;
            sc.l[r] = 0.0f;
            std::fill(sc.acc + r * c.dv, sc.acc + (r + 1) * c.dv, 0.0f);
        }
    }
    for (int64_t k0 = u.k0; k0 < u.k1; k0 += t.keyRows) {
        const int64_t nk = std::min(t.keyRows, u.k1 - k0);
        loadKeyValueBlock(p, u, k0, nk, t.keyRows, sc);
        for (int64_t g = 0; g < c.group; ++g)
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t at = g * rows + r;
                fa::tile::rowScores(sc.q + at * dk, sc.kt, dk, nk, t.keyRows, sc.s);
                float rowMax = fa::tile::finishScores(c, u.b, u.n2 * c.group + g, rule, u.q0 + r, k0, nk, skv, sc.s, sc.kept);
                if (p.tree != nullptr) rowMax = applyTreeMask(p, u.b, u.q0 + r, k0, nk, sc.s, sc.kept);
                if (rowMax == kNegInf) continue;  // nothing kept in this block for this row
                accumulateRow(p, nk, rowMax, sc.s, sc.kept, sc.v, sc.m[at], sc.l[at], sc.acc + at * c.dv);
            }
    }
    for (int64_t g = 0; g < c.group; ++g)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t at = g * rows + r;
            emitRow(p, u, g, r, sc.m[at], sc.l[at], sc.acc + at * c.dv);
        }
}

bool acceptsAll(const Params&) { return true; }
bool always() { return true; }

}  // namespace

const ForwardKernel& forwardKernelTiled() {
    static const ForwardKernel k{"tiled-generic", always, acceptsAll, chooseTile, scratchBytes, runUnit, true};
    return k;
}

}  // namespace attnops::fia
