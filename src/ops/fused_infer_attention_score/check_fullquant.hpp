// Validation of full int8 quantisation of FusedInferAttentionScore (spec 9.2): an int8 query with
// int8 key and value, deqScale1 / quantScale1 / deqScale2, and the output rules of 9.3 that go
// with it. Called by checkForward in place of the key/value dequantisation rules.
#pragma once

#include <cstdint>

#include "attnops/tensor.h"
#include "ops/fused_infer_attention_score/check.hpp"

namespace attnops::fia {

// What the full-quant rules need to know of the problem checkForward has read so far.
struct FullQuantShapes {
    int64_t d = 0;          // the head dim (32-aligned for int8)
    bool decode = false;    // Q_S = 1, not TND: the incremental branch (no full quant there)
    bool paged = false;     // blockTable given
    bool prefix = false;    // shared prefix given
    bool rope = false;      // queryRope/keyRope given (MLA): MLA full quantisation (check_mlaquant.cpp)
    DType query = DType::F16, key = DType::F16, out = DType::F16;
    const attnopsTensor* queryTensor = nullptr;  // MLA: dequantScaleQuery's shape follows it
    fa::Layout layout = fa::Layout::BSH;
    int64_t n1 = 0, dv = 0;
};

// The float value of a per-tensor deqScale1/deqScale2: fp32, or uint64 whose low 32 bits hold an
// fp32; both truncated to "float19" (the low 13 mantissa bits cleared) where the spec says so.
float decodeDeqScale(const attnopsTensor& t, bool truncate);

// deqScale1/quantScale1/deqScale2 and the dequantisation operands: with an int8 query fills
// p.fullQuant (core.scale becomes 1, the scale moving into fullQuant.scale); with a float query
// every full-quant operand must be absent. An int8 query with queryRope is MLA full quantisation
// (checkMlaFullQuant: p.queryDequant, key/value scales). Returns whether the int8-query rules took
// the key/value dequantisation operands (then checkAntiquant is not called).
bool checkFullQuant(const Args& a, const FullQuantShapes& s, int32_t device, Params& p);

}  // namespace attnops::fia
