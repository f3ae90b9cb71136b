// Validation of the quantisation arguments of FusedInferAttentionScore (spec 9): int8/int4 key and
// value dequantisation in both parameter styles, and the int8 output. Called by checkForward.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/tensor.h"
#include "core/handles.hpp"
#include "ops/fused_infer_attention_score/check.hpp"

namespace attnops::fia {

// What the quantisation rules need to know of the problem checkForward has read so far.
struct QuantShapes {
    int64_t batch = 0, n1 = 0, n2 = 0, d = 0, dv = 0;
    int64_t tokens = 0;     // KV_S (paged: maxBlocksPerSeq * blockSize), the per-token S minimum
    int64_t blockNum = 0, blockSize = 0;  // paged cache (blockNum 0: not paged)
    bool decode = false;
    bool packed = false;    // inputLayout TND
    DType query = DType::F16;
    DType kv = DType::F16;  // after unpackInt4
};

// Every element of a small tensor as float, in row-major logical order (strides honoured).
std::vector<float> readAll(const attnopsTensor& t);

// An int32 key/value tensor holding eight int4 per element (low nibble first) as the internal
// packed int4 view: last dim x 8, every stride in nibbles. Other tensors come back unchanged.
attnopsTensor unpackInt4(const attnopsTensor& t, const char* name);

// Fills p.keyQuant / p.valueQuant for int8 or int4 key/value (spec 9.1): the separate style
// (key/valueAntiquantScale/Offset, modes 0-5 and (0, 1)) wins over the combined style
// (antiquantScale/antiquantOffset with leading dim 2 = [key, value], antiquantMode 0 or 1).
// Float key/value: every dequantisation operand must be absent.
void checkAntiquant(const Args& a, const QuantShapes& s, int32_t device, Params& p);

// Fills p.outQuant (spec 9.3): quantScale2 (and optional quantOffset2) for an int8 attentionOut.
void checkOutputQuant(const Args& a, const QuantShapes& s, int32_t device, Params& p);

}  // namespace attnops::fia
