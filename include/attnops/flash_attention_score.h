/* FlashAttentionScore (forward): two-phase API with the semantics of the CANN operator
 * (aclnnFlashAttentionScore V1-V4 and aclnnFlashAttentionVarLenScore in one entry point).
 * Semantics: shared/spec/flash-attention-score.md; attnops' own rules are listed in the README
 * ("Differences from upstream"). */
#ifndef ATTNOPS_FLASH_ATTENTION_SCORE_H
#define ATTNOPS_FLASH_ATTENTION_SCORE_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/runtime.h"
#include "attnops/status.h"
#include "attnops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Phase 1: validates every argument, plans the work on the calling thread's current device and
 * returns the workspace size and a single-use executor.
 *
 * Layouts ("BSH", "SBH", "BSND", "BNSD", "TND"; upper case):
 *   query [B,S1,N1*D] / [S1,B,N1*D] / [B,S1,N1,D] / [B,N1,S1,D] / [T1,N1,D]; key likewise with
 *   N2 heads and S2 (T2) rows; value likewise with head dim Dv <= D. N1 % N2 == 0, D <= 768.
 * query, key, value, attentionOutOut: fp32, fp16 or bf16, all the same. attentionOutOut has the
 *   query's shape with D replaced by Dv.
 * realShiftOptional (pse): pseType 0/1: query dtype, [B|1,N1,S1,S2], [B|1,N1,1,S2], compressed
 *   alibi [B|1,N1,1024,S2]; TND: 1-D [sum N1*Sq_i*Skv_i] or [sum N1*Skv_i], or the compressed
 *   4-D form. pseType 2/3: fp32 slopes [B,N1] or [N1].
 * dropMaskOptional: uint8 bit-packed keep mask (bit k at byte k/8, bit k%8, 1 = keep) over the
 *   flat [B,N1,S1,S2] order (TND: per-sequence [N1,Sq_i,Skv_i] blocks). When it is NULL and
 *   keepProb < 1 the mask is generated from (seed, offset) with Philox4x32-10
 *   (attnopsFlashAttentionGenDropMask materialises it).
 * paddingMaskOptional: reserved, must be NULL.
 * attenMaskOptional: bool/uint8, 1 = masked. Modes 0/1/5: [B,N1,S1,S2], [B,1,S1,S2],
 *   [1,1,S1,S2] or [S1,S2] (TND: [maxSq,maxSkv] or [T1,T2]). Modes 2/3/4/6/7/8 compute the mask
 *   from the mode; the compressed [2048,2048] ([3072,2048] for mode 6) tensor is given and only
 *   its shape is checked. NULL means no masking at all, whatever sparseMode, preTokens and
 *   nextTokens say (upstream rule; a mode of 2-8 without a mask warns once per process).
 * prefixOptional: int64[B], modes 5/6. actualSeqQLenOptional/actualSeqKvLenOptional: TND only,
 *   cumulative end offsets without a leading 0. qStartIdxOptional/kvStartIdxOptional: element 0
 *   is the global start row/column (inner alibi). sinkOptional: fp32 [N1] extra logit per head.
 * softmaxMaxOut/softmaxSumOut: optional fp32 [B,N1,S1,8|1] or [T1,N1,8|1] (every lane holds the
 *   value). softmaxOutOut: reserved, must be NULL or empty.
 * innerPrecise: 0, 1 or 2 (fully masked rows always give 0; the value changes nothing else). */
ATTNOPS_API attnopsStatus attnopsFlashAttentionScoreGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
    const attnopsTensor* realShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional,
    const attnopsIntArray* prefixOptional, const attnopsIntArray* actualSeqQLenOptional,
    const attnopsIntArray* actualSeqKvLenOptional, const attnopsIntArray* qStartIdxOptional,
    const attnopsIntArray* kvStartIdxOptional, const attnopsTensor* sinkOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum,
    const char* inputLayout, int64_t innerPrecise, int64_t sparseMode, int64_t pseType,
    int64_t seed, int64_t offset, const attnopsTensor* softmaxMaxOut,
    const attnopsTensor* softmaxSumOut, const attnopsTensor* softmaxOutOut,
    const attnopsTensor* attentionOutOut, uint64_t* workspaceSize, attnopsExecutor** executor);

/* Phase 2: enqueues the planned work on `stream` (NULL: the current device's default stream).
 * `workspace` must hold at least the size phase 1 returned (it may be NULL when that is 0).
 * The executor is consumed, whatever the outcome. Tensors must stay alive until the work ends. */
ATTNOPS_API attnopsStatus attnopsFlashAttentionScore(void* workspace, uint64_t workspaceSize,
                                                     attnopsExecutor* executor,
                                                     attnopsStream* stream);

/* Bytes of the bit-packed dropout mask for a problem: ceil(B*N1*S1*S2 / 8) for fixed layouts
 * (pass the arrays as NULL), ceil(N1 * sum Sq_i*Skv_i / 8) for TND (batch, qSeqLen, kvSeqLen
 * are then ignored and must be 0). */
ATTNOPS_API attnopsStatus attnopsFlashAttentionDropMaskBytes(
    int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen,
    const attnopsIntArray* actualSeqQLenOptional, const attnopsIntArray* actualSeqKvLenOptional,
    uint64_t* bytes);

/* Writes, synchronously on the calling thread, the keep mask that FlashAttentionScore generates
 * for (keepProb, seed, offset) when no dropMask is given, into `dropMaskOut` (uint8, 1-D,
 * contiguous, at least attnopsFlashAttentionDropMaskBytes bytes). */
ATTNOPS_API attnopsStatus attnopsFlashAttentionGenDropMask(
    int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen,
    const attnopsIntArray* actualSeqQLenOptional, const attnopsIntArray* actualSeqKvLenOptional,
    double keepProb, int64_t seed, int64_t offset, const attnopsTensor* dropMaskOut);

#ifdef __cplusplus
}
#endif

#endif
