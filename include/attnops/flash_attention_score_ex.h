/* FlashAttentionScore(Grad) extended entry points: what context parallelism (one attention spread
 * over many processes, each holding a shard of the sequence or of the heads) needs from the
 * kernels, without changing the aclnn-compatible signatures of flash_attention_score.h and
 * flash_attention_score_grad.h (compat/acl is built on them).
 *
 * attnopsFlashAttentionScoreExGetWorkspaceSize / attnopsFlashAttentionScoreGradExGetWorkspaceSize
 * take every argument of the plain phase 1 plus one `extras` pointer (before workspaceSize); phase 2
 * is the plain attnopsFlashAttentionScore / attnopsFlashAttentionScoreGrad. With extras == NULL or
 * a zero-initialised struct (structSize set) the call is the plain one, bit for bit. What the
 * extras add:
 *
 * 1. Dropout keyed by global positions (dropGlobal = 1). The plain op keys the Philox keep bit of
 *    element (b, n, i, j) by its flat index in the [B,N1,S1,S2] order (TND: per-sequence
 *    [N1,Sq_i,Skv_i] blocks), so a shard of the problem would draw other bits than the whole. With
 *    dropGlobal the bit of local element (b, n, i, j) is that of element
 *    (g(b), dropHeadOffset + n, qRow(i), kvRow(j)) of a *global* problem, whose flat index is
 *      fixed layouts: ((b * dropHeadNum + n_g) * dropQSeqLen + qRow) * dropKvSeqLen + kvRow
 *      TND:           base(g) + (n_g * Sq_g + qRow) * Skv_g + kvRow, base(g) = dropHeadNum *
 *                     sum over global sequences h < g of Sq_h * Skv_h, with (Sq_g, Skv_g) the
 *                     lengths of global sequence g from dropActualSeqQLen/dropActualSeqKvLen
 *    (the same (seed, offset) recipe, spec section 2.7a), so every shard of a run draws exactly the
 *    bits attnopsFlashAttentionGenDropMask gives for the global problem. An explicit dropMask is
 *    then the global problem's mask (indexed by the global flat index; it must hold that many bits).
 *    qRow(i), kvRow(j): the global position (within its sequence) of local query row i / key row j:
 *      dropQRows / dropKvRows: int64 arrays, one entry per local row: fixed layouts [S1] / [S2]
 *        (the same for every batch), TND [T1] / [T2] (indexed by packed row; entries of rows
 *        outside every sequence are not read); NULL: the row (sequence-local) plus
 *        dropQRowOffset / dropKvRowOffset.
 *      Every position must be in [0, global length) of its sequence (checked).
 *    g(b): fixed layouts: b (the batch is never sharded). TND: dropSeqIndex[b] (one entry per local
 *      sequence, each in [0, number of global sequences)), NULL: b (then the local and global
 *      sequence counts must be equal).
 *    dropHeadOffset >= 0 and dropHeadNum >= dropHeadOffset + N1 (Ulysses shards the heads).
 *    dropQSeqLen/dropKvSeqLen (fixed layouts, >= 1) and dropActualSeqQLen/dropActualSeqKvLen (TND,
 *    required, cumulative ends without a leading 0, same size) describe the global problem; the
 *    global element count must fit in 63 bits. Ignored (not read) when keepProb == 1.
 *
 * 2. fp32 partial results from fp16/bf16 inputs. attentionOut (forward) may be fp32 whatever the
 *    input dtype (the accumulator is then rounded once, to fp32); softmaxMax/softmaxSum are fp32 as
 *    always. In the backward attentionIn may be fp32 too, and dqOut/dkOut/dvOut may each be fp32
 *    (dy keeps the input dtype). accumulateGrads = 1 adds the gradients into dqOut/dkOut/dvOut
 *    (which must then be fp32) instead of overwriting them: out += grad, one fp32 addition per
 *    element after the gradient is complete, so the result is the plain gradient added once
 *    (deterministic; the workspace grows by the fp32 size of the three gradients). dsinkOut is
 *    always overwritten. */
#ifndef ATTNOPS_FLASH_ATTENTION_SCORE_EX_H
#define ATTNOPS_FLASH_ATTENTION_SCORE_EX_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/flash_attention_score.h"
#include "attnops/flash_attention_score_grad.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct attnopsFlashAttentionExtras {
    uint32_t structSize; /* sizeof(attnopsFlashAttentionExtras) as the caller compiled it */
    int32_t dropGlobal;  /* 1: dropout bits keyed by global positions (fields below); 0: plain */
    int64_t dropHeadOffset;
    int64_t dropHeadNum;
    int64_t dropQSeqLen;
    int64_t dropKvSeqLen;
    int64_t dropQRowOffset;
    int64_t dropKvRowOffset;
    const attnopsIntArray* dropQRows;
    const attnopsIntArray* dropKvRows;
    const attnopsIntArray* dropActualSeqQLen;
    const attnopsIntArray* dropActualSeqKvLen;
    const attnopsIntArray* dropSeqIndex;
    int32_t accumulateGrads; /* backward: 1 adds into fp32 dq/dk/dv; 0 overwrites */
    int32_t reserved;        /* must be 0 */
} attnopsFlashAttentionExtras;

/* Sets *extras to the plain behaviour (all zero, structSize filled in). */
ATTNOPS_API attnopsStatus attnopsFlashAttentionExtrasInit(attnopsFlashAttentionExtras* extras);

ATTNOPS_API attnopsStatus attnopsFlashAttentionScoreExGetWorkspaceSize(
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
    const attnopsTensor* attentionOutOut, const attnopsFlashAttentionExtras* extras,
    uint64_t* workspaceSize, attnopsExecutor** executor);

ATTNOPS_API attnopsStatus attnopsFlashAttentionScoreGradExGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
    const attnopsTensor* dy, const attnopsTensor* pseShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional,
    const attnopsTensor* softmaxMax, const attnopsTensor* softmaxSum, const attnopsTensor* softmaxInOptional,
    const attnopsTensor* attentionIn, const attnopsIntArray* prefixOptional,
    const attnopsIntArray* actualSeqQLenOptional, const attnopsIntArray* actualSeqKvLenOptional,
    const attnopsIntArray* qStartIdxOptional, const attnopsIntArray* kvStartIdxOptional,
    const attnopsTensor* sinkInOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, const char* inputLayout, int64_t innerPrecise, int64_t sparseMode,
    int64_t pseType, int64_t seed, int64_t offset, const attnopsTensor* dqOut, const attnopsTensor* dkOut,
    const attnopsTensor* dvOut, const attnopsTensor* dpseOutOptional, const attnopsTensor* dsinkOutOptional,
    const attnopsFlashAttentionExtras* extras, uint64_t* workspaceSize, attnopsExecutor** executor);

#ifdef __cplusplus
}
#endif

#endif
