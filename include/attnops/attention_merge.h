/* AttentionMerge: the exact merge of two partial attention results by their softmax statistics,
 * in fp32: the step that combines the key blocks of ring attention (context parallelism), and
 * the arithmetic of torch_npu's npu_ring_attention_update. Two-phase like every operator.
 *
 * A partial result over a block of keys is (out_i, max_i, sum_i): out_i the softmax over the
 * block applied to its values, max_i the row maximum of the scaled scores, sum_i = sum
 * exp(score - max_i) (CANN's softmax_max / softmax_sum). Per row, in fp32:
 *     m = max(m1, m2)  (NaN propagates);  shift = m == -inf ? 0 : m
 *     a = s1 exp(m1 - shift);  b = s2 exp(m2 - shift);  s = a + b
 *     out = out1 (a / s) + out2 (b / s)  (both weights 0 when s == 0: an empty row stays out = 0,
 *           max -inf, sum 0; a block whose row is empty (max -inf, sum 0) contributes nothing)
 *     merged max = m, merged sum = s
 * Log-sum-exp form: pass prevSum, curSum and sumOut all NULL; the max tensors then hold
 * lse = max + log(sum) (-inf: empty row), read as (m = lse, s = lse == -inf ? 0 : 1), and
 * maxOut receives the merged lse = s > 0 ? m + log(s) : m.
 *
 * Shapes: the three out tensors are [R..., D] (rank 1-8, equal shapes; D >= 0; any strides),
 * the statistics [R..., L] with the same leading dims and L >= 1 lanes (lane 0 is read, every
 * lane of maxOut/sumOut is written with the row's value; the statistics may have different
 * lane counts). Dtypes: out tensors fp32, fp16 or bf16, each its own (arithmetic is fp32, the
 * merged out is rounded once); statistics fp32. Outputs must not overlap any input, except that
 * outOut may be exactly prevOut or curOut (the same memory and strides: an in-place update),
 * likewise maxOut/sumOut with prevMax/curMax and prevSum/curSum; outputs with zero strides are
 * rejected. Deterministic: each row is computed by one thread, the same way for any thread count. */
#ifndef ATTNOPS_ATTENTION_MERGE_H
#define ATTNOPS_ATTENTION_MERGE_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

ATTNOPS_API attnopsStatus attnopsAttentionMergeGetWorkspaceSize(
    const attnopsTensor* prevOut, const attnopsTensor* prevMax, const attnopsTensor* prevSumOptional,
    const attnopsTensor* curOut, const attnopsTensor* curMax, const attnopsTensor* curSumOptional,
    const attnopsTensor* outOut, const attnopsTensor* maxOut, const attnopsTensor* sumOutOptional,
    uint64_t* workspaceSize, attnopsExecutor** executor);

ATTNOPS_API attnopsStatus attnopsAttentionMerge(void* workspace, uint64_t workspaceSize,
                                                attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
