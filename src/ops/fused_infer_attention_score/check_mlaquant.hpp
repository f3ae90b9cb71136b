// Validation of MLA full quantisation of FusedInferAttentionScore (spec 9.2 "MLA full quant"):
// int8 query with dequantScaleQuery (queryQuantMode 3), int8 key/value with per-tensor
// key/valueAntiquantScale, bf16 rope. Called by checkFullQuant for an int8 query with queryRope.
#pragma once

#include <cstdint>

#include "attnops/tensor.h"
#include "ops/fused_infer_attention_score/check.hpp"

namespace attnops::fia {

struct MlaQuantShapes {
    const attnopsTensor* query = nullptr;  // its shape gives dequantScaleQuery's
    fa::Layout layout = fa::Layout::BSH;
    int64_t n1 = 0, d = 0, dv = 0;
    DType key = DType::I8;
};

// Fills p.queryDequant, p.keyQuant and p.valueQuant, or throws naming the broken rule.
void checkMlaFullQuant(const Args& a, const MlaQuantShapes& s, int32_t device, Params& p);

}  // namespace attnops::fia
