// FlashAttentionScore forward parameters: the only thing a kernel sees. Built by check.cpp from
// the API tensors; every operand is a strided view indexed by logical axes, every offset 64-bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace attnops::fa {

// Largest head dim D (and Dv) accepted; kernels may size stack buffers by it.
constexpr int64_t kMaxHeadDim = 768;

enum class Layout { BSH, SBH, BSND, BNSD, TND };

const char* layoutName(Layout layout);

// Read-only strided view over logical axes (batch, head, row, column). For TND the batch stride
// is 0 and rows are absolute token rows (a sequence's first row comes from Sequences).
struct View4 {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int64_t stride[4] = {0, 0, 0, 0};  // elements

    int64_t offset(int64_t b, int64_t n, int64_t row, int64_t col) const {
        return b * stride[0] + n * stride[1] + row * stride[2] + col * stride[3];
    }
    float load(int64_t b, int64_t n, int64_t row, int64_t col) const {
        return loadAsFloat(data, offset(b, n, row, col), dtype);
    }
};

struct MutView4 {
    void* data = nullptr;
    DType dtype = DType::F32;
    int64_t stride[4] = {0, 0, 0, 0};

    int64_t offset(int64_t b, int64_t n, int64_t row, int64_t col) const {
        return b * stride[0] + n * stride[1] + row * stride[2] + col * stride[3];
    }
    void store(int64_t b, int64_t n, int64_t row, int64_t col, float v) const {
        storeFromFloat(data, offset(b, n, row, col), dtype, v);
    }
};

// Per-sequence geometry. Fixed layouts: `count` = B sequences of S1/S2 rows starting at row 0 of
// their batch. TND: rows [qStart, qStart + qLen) of the packed query, likewise for key/value.
struct Sequences {
    int64_t count = 0;
    std::vector<int64_t> qStart, qLen, kvStart, kvLen;
    // Flat index of element (b, n=0, i=0, j=0) in the [B,N1,S1,S2] order (fixed layouts) or the
    // concatenated per-sequence [N1,Sq_i,Skv_i] blocks (TND): dropout bits and flattened pse.
    std::vector<int64_t> elementBase;
    // TND row-broadcast pse: start of sequence b's [N1,Skv_i] block.
    std::vector<int64_t> rowBroadcastBase;
    int64_t maxQLen = 0, maxKvLen = 0;
    int64_t qRowsUsed = 0;   // TND: sum of Sq_i; rows beyond it are tails (zeroed)
    int64_t totalElements = 0;  // N1 * sum Sq_i * Skv_i (dropout bit count)
};

// Mask: the sparse mode's analytic rule per sequence plus an optional explicit mask tensor.
struct MaskSpec {
    int64_t sparseMode = 0;
    int64_t preTokens = 0, nextTokens = 0;
    std::vector<int64_t> prefix;       // modes 5/6: prefix width per batch
    int64_t firstNonEmpty = -1, lastNonEmpty = -1;  // TND modes 8 / 7: the band sequence
    bool explicitMask = false;         // content of attenMask is read (modes 0, 1, 5)
    const uint8_t* maskData = nullptr; // bool/uint8, nonzero = masked
    int64_t maskStride[4] = {0, 0, 0, 0};  // (b, n, i, j); broadcast axes have stride 0
    bool maskGlobalRows = false;       // TND [T1,T2] form: index by absolute rows
};

enum class PseForm {
    None,
    Dense,            // [B|1, N1, S1|1, S2] read through strides (row-broadcast: row stride 0)
    CompressedAlibi,  // [B|1, N1, 1024, W]: pse(i, j) = comp[.., 1023, W - 1 - (i - j)]
    TndDense,         // 1-D [sum N1*Sq_i*Skv_i]
    TndRowBroadcast,  // 1-D [sum N1*Skv_i]
    Slopes,           // pseType 2/3: fp32 slopes [B,N1] or [N1]
};

struct PseSpec {
    PseForm form = PseForm::None;
    int64_t type = 1;                  // 0: scale*R + pse; 1: scale*(R + pse); 2/3: inner alibi
    View4 view;                        // strides (b, n, i, j); 1-D forms use stride[3]
    int64_t compressedCols = 0;        // W of the compressed alibi form
    int64_t qStartIdx = 0, kvStartIdx = 0;
    // Dense: index rows and columns from the sequence's physical start (seq.qStart/kvStart), as
    // FusedInferAttentionScore's pseShift does with left padding.
    bool physicalRows = false;
};

// Dropout keyed by the positions of a global problem (context parallelism; see
// attnops/flash_attention_score_ex.h): the keep bit of local (b, n, i, j) is the one of global
// flat index base[b] + ((headOffset + n) * qLen[b] + qRow[qStart_b + i]) * kvLen[b] +
// kvRow[kvStart_b + j]. Row tables are indexed by the local absolute row (fixed layouts: the
// sequence row; TND: the packed row).
struct DropoutGlobal {
    bool enabled = false;
    int64_t headOffset = 0;
    std::vector<int64_t> base, qLen, kvLen;  // per local sequence (global sequence's values)
    std::vector<int64_t> qRow, kvRow;        // per local row: global position in its sequence
    int64_t totalElements = 0;               // bits of the global problem
};

struct DropoutSpec {
    bool enabled = false;              // keepProb < 1
    float keepProb = 1.0f;
    float invKeepProb = 1.0f;
    uint64_t keepThreshold = uint64_t(1) << 32;  // DropoutBits::keepThreshold(keepProb)
    const uint8_t* mask = nullptr;     // explicit bit mask, or NULL: generated from seed/offset
    int64_t maskByteStride = 1;
    uint64_t seed = 0, offset = 0;
    DropoutGlobal global;              // enabled: indices of a global problem
};

struct ForwardParams {
    Layout layout = Layout::BSND;
    bool varlen = false;
    int64_t batch = 0, n1 = 0, n2 = 0, group = 1, d = 0, dv = 0;
    Sequences seq;
    View4 q, k, v;                     // (b, n, row, dim)
    MutView4 out;                      // (b, n1, row, dv)
    bool writeStats = false;
    MutView4 softmaxMax, softmaxSum;   // fp32 (b, n1, row, lane)
    int64_t statLanes = 0;
    int64_t qRowsTotal = 0;            // TND: T1 (rows of the packed query)
    float scale = 1.0f;
    MaskSpec mask;
    PseSpec pse;
    DropoutSpec dropout;
    const float* sink = nullptr;       // fp32 [N1] or NULL
    int64_t sinkStride = 1;
    // ATTNOPS_FA_ROW_STEPS=1 when the call was checked: the vector kernels' blocks with a pse, an
    // explicit mask or dropout take the row steps (tests compare the two paths byte for byte).
    bool rowSteps = false;
    // ATTNOPS_FA_HEADS_PER_PASS when the call was checked (0: unset): the query heads of a GQA
    // group that the vector forward runs per pass over the key blocks, instead of as many as the
    // L2 holds (cpu/simd/fa_forward.hpp: headsPerPass). The same bytes whatever it is.
    int64_t headsPerPass = 0;
    // ATTNOPS_FA_BLOCKS_PER_UNIT likewise (0: unset): the query blocks of a vector forward work
    // unit, which share each packed block too (cpu/simd/fa_forward.hpp: blocksPerUnit), instead of
    // the count chosen from the L2 and the thread count. The same bytes whatever it is.
    int64_t blocksPerUnit = 0;
};

// FlashAttentionScoreGrad: the forward's problem (the statistics views are inputs here and
// `out` is the forward output attentionIn), plus the incoming gradient and the outputs.
struct BackwardParams {
    ForwardParams fwd;
    View4 dy;                          // (b, n1, row, dv), like attentionIn
    MutView4 dq, dk, dv;               // like q, k, v
    int64_t kvRowsTotal = 0;           // TND: T2 (rows of the packed key/value)
    int64_t kvRowsUsed = 0;            // TND: sum of Skv_i; rows beyond are zeroed
    float* dsink = nullptr;            // fp32 [N1] or NULL
    int64_t dsinkStride = 1;
    // With a sink: workspace for each query row's dsink term -p_sink * delta, [rows][N1] with
    // rows = T1 (TND) or B * S1, written by query units and summed in a fixed order. Set by the
    // executor when it runs (it points into the workspace).
    float* sinkRowTerms = nullptr;
    int64_t sinkRows = 0;
    // Extended entry point: dq/dk/dv (fp32) receive += the gradient instead of =.
    bool accumulate = false;
    int64_t sinkRowIndex(int64_t b, int64_t i) const {
        return fwd.varlen ? fwd.seq.qStart[size_t(b)] + i : b * fwd.seq.maxQLen + i;
    }
};

// Whether the problem's operands and results are all of dtype `dt`. The kernels that round the
// probabilities (and, backward, dS) to a half dtype before a product (bf16 pairs, AMX tiles) take
// only such problems: fp32 results from half inputs (flash_attention_score_ex.h) promise the fp32
// computation, rounded once, which those kernels cannot give (FaCpExtras.Fp32OutputsAndGradients-
// FromHalfInputs). The backward's attentionIn (fwd.out) is only read into fp32 and may be any dtype.
inline bool allIn(const ForwardParams& p, DType dt) {
    return p.q.dtype == dt && p.k.dtype == dt && p.v.dtype == dt && p.out.dtype == dt;
}
inline bool allIn(const BackwardParams& p, DType dt) {
    const ForwardParams& f = p.fwd;
    return f.q.dtype == dt && f.k.dtype == dt && f.v.dtype == dt && p.dy.dtype == dt && p.dq.dtype == dt &&
           p.dk.dtype == dt && p.dv.dtype == dt;
}

}  // namespace attnops::fa
