// Validation of FusedInferAttentionScore features kept apart from the core rules of check.cpp:
// the additive position shift pseShift (spec 10), the MLA rope inputs queryRope/keyRope (spec 10
// "Rope", 1 "Decode MLA") and the tree mask (sparse mode 9, spec 6). Each fills its part of
// Params or throws a StatusError.
#pragma once

#include <cstdint>

#include "ops/fused_infer_attention_score/check.hpp"
#include "ops/fused_infer_attention_score/layouts.hpp"

namespace attnops::fia {

// What the core rules established, as the feature rules need it.
struct CheckedShapes {
    fa::Layout layout = fa::Layout::BNSD;
    int64_t batch = 0, qS = 0, n1 = 0, n2 = 0, d = 0, dv = 0;
    int64_t maskCols = 0;  // KV extent of a full mask (paged: maxBlocksPerSeq * blockSize)
    bool int8Kv = false;
    LayoutPair layoutPair;    // inputLayout: the operand forms (NTD is not `layout`'s TND order)
    bool tensorList = false;  // key/value given as one tensor per batch (keyCount > 1)
};

// Rope width (spec 10: queryRope/keyRope D).
constexpr int64_t kRopeDim = 64;

// pseShift: [B|1, Q_N, P_S1, P_S2] of the query's dtype, added unscaled to the scores.
void checkPseShift(const Args& a, const attnopsTensor& pse, const CheckedShapes& s, Params& p);

// queryRope/keyRope (both or none): fills p.ropeDim, p.queryRope, p.keyRope and, for decode MLA
// (D 512), makes the value the key (the value input is not read). Called after the mask rules.
void checkRope(const Args& a, const attnopsTensor& query, const attnopsTensor& key, const attnopsTensor& value,
               const attnopsTensor* queryRope, const attnopsTensor* keyRope, const CheckedShapes& s, Params& p);

// sparseMode 9: the tree mask [B, Q_S, Q_S] (TND: 1-D, the batches' sq x sq blocks one after
// another); mask NULL is an error. Called after the lengths are known.
void checkTreeMask(const Args& a, const attnopsTensor* mask, const CheckedShapes& s, Params& p);

// Key or value source of a paged cache in `f` (check.cpp).
KvSource pagedSource(const attnopsTensor& t, CacheFormat f, int64_t headDim);

}  // namespace attnops::fia
