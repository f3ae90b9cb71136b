/* BlockAttentionResiduals and its grad ("attention over depth", Attention Residuals): per token,
 * a softmax over N completed block representations plus the partial block, scored by an
 * RMS-normalised dot product with a learned pseudo-query, mixing the raw sources.
 * Math: shared/spec/block-attention-residuals.md. Deterministic for any thread count. */
#ifndef ATTNOPS_BLOCK_ATTENTION_RESIDUALS_H
#define ATTNOPS_BLOCK_ATTENTION_RESIDUALS_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Phase 1 of the forward.
 *   partialBlock [T,H], blockRes [T,N,H] (N >= 1, no cap but memory), projWeight [H] or [1,H],
 *   normWeight [H]: fp32, fp16 or bf16, all the same; any strides (a source-major [N,T,H]
 *   buffer viewed as [T,N,H] is read in place).
 *   validBlockNum: -1 or N (reserved; all N blocks take part). normEps: finite, > 0.
 *   hiddenStates [T,H] (main dtype). invNorm, probs: fp32 [T,N+1], written when needBackward
 *   (then required), column N belonging to the partial block. T = 0 is an empty success. */
ATTNOPS_API attnopsStatus attnopsBlockAttentionResidualsGetWorkspaceSize(
    const attnopsTensor* partialBlock, const attnopsTensor* blockRes, const attnopsTensor* projWeight,
    const attnopsTensor* normWeight, int64_t validBlockNum, double normEps, bool needBackward,
    const attnopsTensor* hiddenStates, const attnopsTensor* invNorm, const attnopsTensor* probs,
    uint64_t* workspaceSize, attnopsExecutor** executor);

ATTNOPS_API attnopsStatus attnopsBlockAttentionResiduals(void* workspace, uint64_t workspaceSize,
                                                         attnopsExecutor* executor, attnopsStream* stream);

/* Phase 1 of the backward. Inputs as in the forward plus gradHiddenStates [T,H] and the saved
 * invNorm, probs (fp32 [T,N+1]); N >= 0 (N = 0: blockRes [T,0,H]); validBlockNum -1, 0 or N.
 * Outputs gradPartialBlock [T,H], gradBlockRes [T,N,H], gradProjWeight (projWeight's shape),
 * gradNormWeight [H], all in the main dtype. gradProjWeight/gradNormWeight are reduced over tokens
 * in fixed chunks and a fixed order: the same bits for any thread count. */
ATTNOPS_API attnopsStatus attnopsBlockAttentionResidualsGradGetWorkspaceSize(
    const attnopsTensor* partialBlock, const attnopsTensor* blockRes, const attnopsTensor* projWeight,
    const attnopsTensor* normWeight, const attnopsTensor* gradHiddenStates, const attnopsTensor* invNorm,
    const attnopsTensor* probs, int64_t validBlockNum, const attnopsTensor* gradPartialBlock,
    const attnopsTensor* gradBlockRes, const attnopsTensor* gradProjWeight, const attnopsTensor* gradNormWeight,
    uint64_t* workspaceSize, attnopsExecutor** executor);

ATTNOPS_API attnopsStatus attnopsBlockAttentionResidualsGrad(void* workspace, uint64_t workspaceSize,
                                                             attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
