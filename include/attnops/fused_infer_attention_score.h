/* FusedInferAttentionScore (inference attention: prefill and decode, paged KV caches): two-phase
 * API with the argument list of aclnnFusedInferAttentionScoreV4. Semantics:
 * shared/spec/fused-infer-attention-score.md (section A decides where upstream is unclear).
 *
 * Implemented so far (everything else is rejected with ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION
 * and a message naming the argument, never ignored):
 *   query fp16/bf16; key/value the query dtype, or int8 / int4 (int32 containers) dequantised as
 *   (x + offset) * scale in both parameter styles and modes 0-5; int8 output (quantScale2);
 *   inputLayout BSH, BSND, BNSD, TND, NTD and the output-transposing forms; GQA with any ratio;
 *   actual sequence lengths; sparseMode 0-4; paged KV caches (BnBsH, BnNBsD, NZ); tensor-list
 *   key/value; left padding; the shared prefix; softmaxLse; learnableSink. */
#ifndef ATTNOPS_FUSED_INFER_ATTENTION_SCORE_H
#define ATTNOPS_FUSED_INFER_ATTENTION_SCORE_H

#include <stdbool.h>
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
 * key, value: arrays of keyCount / valueCount tensor handles (aclnn's aclTensorList). A count of
 *   1 is a plain tensor. Tensor list: keyCount = valueCount = B (<= 256), key[i]/value[i] batch
 *   i's tensors in the layout with batch 1 and their own S (equal for key[i] and value[i]); the
 *   KV lengths default to each S and must not exceed it. Not with a paged cache, left padding,
 *   the shared prefix or TND/NTD.
 * Layouts (upper case), Q_N = numHeads, KV_N = numKeyValueHeads (0: Q_N), Q_N % KV_N == 0:
 *   BSH  query [B,Q_S,Q_N*D]   key/value [B,KV_S,KV_N*D]
 *   BSND query [B,Q_S,Q_N,D]   key/value [B,KV_S,KV_N,D]
 *   BNSD query [B,Q_N,Q_S,D]   key/value [B,KV_N,KV_S,D]
 *   TND  query [T,Q_N,D]       key/value [T_kv,KV_N,D]
 *   NTD  query [Q_N,T,D]       key/value [KV_N,T_kv,D]   (lengths as TND)
 *   attentionOut: the query's shape with D replaced by the value head dim Dv (Dv may differ from
 *   D only without a paged cache and with D, Dv <= 128). D <= 512.
 *   X_Y: inputs in layout X, attentionOut in layout Y: BNSD_BSND (Q_S > 1), BSH_BNSD, BSND_BNSD
 *   (D = Dv = 64 or 128, or D 192 with Dv 128), BSH_NBSD, BSND_NBSD, BNSD_NBSD (attentionOut
 *   [Q_N,B,Q_S,Dv], Q_S <= 16), NTD_TND, TND_NTD. Dv != D is refused with NTD, *_BNSD and
 *   BNSD_BSND (except 192/128 outside NTD).
 * queryPaddingSize / kvPaddingSize (left padding): int64 [1], negative counts as 0; require
 *   actualSeqLengths / actualSeqLengthsKv. Batch b's valid query rows are
 *   [Q_S - pad - len_b, Q_S - pad), its KV rows likewise in KV_S; other rows are written 0 and
 *   masks are read at these physical positions (mode 0's tokens are reset). A prefill window that
 *   would start before row 0 is invalid; a decode KV window that would is an empty batch (output
 *   0). Not with a paged cache, tensor lists, TND/NTD or *_BNSD layouts, nor (unsupported) with
 *   per-token dequantisation of kvPaddingSize's KV. Decode ignores queryPaddingSize.
 * keySharedPrefix / valueSharedPrefix: both or neither, the key's dtype, [1,prefix_S,KV_N*D] /
 *   [1,prefix_S,KV_N,D] / [1,KV_N,prefix_S,D] by layout (value with Dv); actualSharedPrefixLen one
 *   entry in [0, prefix_S] (NULL: prefix_S). The first Lp prefix rows precede every batch's KV and
 *   count in skv for the masks (a full mask covers Lp + KV_S columns). Not with a paged cache,
 *   tensor lists, left padding, TND/NTD, nor (unsupported) per-token dequantisation.
 * Paged KV (blockTableOptional given): blockTable int32 [B, maxBlocksPerSeq]; key/value are the
 *   caches BnBsH [blockNum,blockSize,KV_N*D], BnNBsD [blockNum,KV_N,blockSize,D] or NZ
 *   [blockNum,KV_N,D/D0,blockSize,D0] (D0 = 16 for fp16/bf16, 32 for int8); blockSize > 0 equals
 *   the cache's block dim, is a multiple of 16 (32 with int8) and at most 1024. Only the first
 *   ceil(skv_b / blockSize) entries of row b are read; each must be in [0, blockNum).
 * actualSeqLengths / actualSeqLengthsKv (host arrays): BSH/BSND/BNSD: per-batch lengths (1 entry:
 *   broadcast; >= B entries: the first B), <= Q_S / KV_S (paged: <= maxBlocksPerSeq*blockSize);
 *   NULL: Q_S / KV_S. With Q_S == 1 (decode) actualSeqLengths is ignored. TND: cumulative ends
 *   without a leading 0, non-decreasing, one per batch, the last <= T (rows beyond it are written
 *   0); both required; with a paged cache actualSeqLengthsKv holds per-batch lengths instead.
 *   A paged cache requires actualSeqLengthsKv.
 * attenMaskOptional: bool/int8/uint8, 1 = masked. sparseMode 0: optional; with it the band
 *   preTokens/nextTokens applies too; shapes [Q_S,KV_S], [B|1,Q_S,KV_S], [B|1,1,Q_S,KV_S] (last two
 *   dims may be larger; paged: last dim >= maxBlocksPerSeq*blockSize). 1: required, same shapes.
 *   2, 3, 4: the compressed [2048,2048] (or [1,2048,2048], [1,1,2048,2048]) mask is required and
 *   only its shape is checked; the rule is computed (2 top-left causal, 3 bottom-right causal, 4
 *   bottom-right band of preTokens/nextTokens). TND: mode 0 without a mask, 3 or 4. Decode
 *   (Q_S == 1, not TND): sparseMode and the tokens are ignored, and so is the compressed mask of
 *   modes 2-4; any other mask is [B,KV_S], [B,1,KV_S] or [B,1,1,KV_S] (last dim may be larger).
 *   Modes 5-8 are invalid; 9 (tree mask) is not yet implemented.
 * keyAntiquantScale/Offset, valueAntiquantScale/Offset with keyAntiquantMode/valueAntiquantMode
 *   (int8 key/value): mode 0 per-channel, scale of the query dtype shaped [KV_N*D], [KV_N,D],
 *   [KV_N,1,D], [1,KV_N*D], [1,KV_N,D], [1,KV_N,1,D], or [1] (per-tensor); mode 1 per-token, fp32
 *   [B,S] or [1,B,S] with S >= KV_S (paged: >= maxBlocksPerSeq*blockSize). Offsets are optional,
 *   shaped and typed as their scales. The key and value modes are equal, or key 0 and value 1.
 *   Decode only (Q_S == 1, not TND): mode 2 per head [KV_N] (query dtype); 3 per token and head
 *   fp32 [B,KV_N,S]; with a paged cache 4 per token [blockNum,blockSize] and 5 per token and head
 *   [blockNum,KV_N,blockSize] fp32, indexed like the cache through the block table.
 * antiquantScale/antiquantOffset (the combined style, int8 only; ignored when any separate operand
 *   is given): [2,...] = [key, value]; antiquantMode 0: [2] (per tensor), [2,KV_N,1,D], [2,KV_N,D]
 *   or [2,KV_N*D] of the query dtype; 1: fp32 [2,B,S], S as mode 1.
 * int4 key/value: int32 tensors holding eight int4 each (element 8i+j = bits [4j,4j+4) of int32 i,
 *   two's complement), the last dim 1/8 of the real one and unit-strided; decode only, not paged,
 *   D and Dv multiples of 64, modes 0 (per channel), 1, 3 and key 0 / value 1, no int8 output.
 * quantScale2/quantOffset2 (attentionOut int8): fp32 or bf16 (bf16 with a bf16 query), [1] or per
 *   channel with Q_N*Dv elements ([Q_N,Dv] with TND; Dv % 16 == 0, no softmaxLse): out =
 *   clamp(round_half_even(O * scale + offset), -128, 127); NaN gives 0; rows without a result hold
 *   the value for O = 0. Not with int4 key/value or learnableSink.
 * learnableSinkOptional: [Q_N] of the query dtype; joins each row's softmax sum (innerPrecise 0).
 * softmaxLseFlag: softmaxLse (fp32 [B,Q_N,Q_S,1], TND [T,Q_N,1]) receives log(sum) + max per row,
 *   +inf for rows that attend nothing or are not computed; untouched (may be NULL) when false.
 * scaleValue multiplies Q.K^T. innerPrecise 0-3 (decode 0/1) changes nothing in the result.
 * keyRopeAntiquantScaleOptional is reserved upstream and ignored; antiquantMode must be 0 or 1.
 * deqScale1/quantScale1/deqScale2 and an int8 query (full quantisation) are not implemented yet.
 * Rows that attend nothing, rows beyond a batch's actual length and TND rows beyond the last
 * cumulative end are written 0. Results are bitwise identical for any thread count. */
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
    const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShiftOptional,
    const attnopsTensor* attenMaskOptional, const attnopsIntArray* actualSeqLengthsOptional,
    const attnopsIntArray* actualSeqLengthsKvOptional, const attnopsTensor* deqScale1Optional,
    const attnopsTensor* quantScale1Optional, const attnopsTensor* deqScale2Optional,
    const attnopsTensor* quantScale2Optional, const attnopsTensor* quantOffset2Optional,
    const attnopsTensor* antiquantScaleOptional, const attnopsTensor* antiquantOffsetOptional,
    const attnopsTensor* blockTableOptional, const attnopsTensor* queryPaddingSizeOptional,
    const attnopsTensor* kvPaddingSizeOptional, const attnopsTensor* keyAntiquantScaleOptional,
    const attnopsTensor* keyAntiquantOffsetOptional, const attnopsTensor* valueAntiquantScaleOptional,
    const attnopsTensor* valueAntiquantOffsetOptional, const attnopsTensor* keySharedPrefixOptional,
    const attnopsTensor* valueSharedPrefixOptional, const attnopsIntArray* actualSharedPrefixLenOptional,
    const attnopsTensor* queryRopeOptional, const attnopsTensor* keyRopeOptional,
    const attnopsTensor* keyRopeAntiquantScaleOptional, const attnopsTensor* dequantScaleQueryOptional,
    const attnopsTensor* learnableSinkOptional, int64_t numHeads, double scaleValue, int64_t preTokens,
    int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, int64_t queryQuantMode,
    const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse, uint64_t* workspaceSize,
    attnopsExecutor** executor);

/* Phase 2: enqueues the planned work on `stream` (NULL: the current device's default stream).
 * `workspace` must hold at least the size phase 1 returned (it may be NULL when that is 0).
 * The executor is consumed, whatever the outcome. Tensors must stay alive until the work ends. */
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV4(void* workspace, uint64_t workspaceSize,
                                                            attnopsExecutor* executor, attnopsStream* stream);

/* Earlier versions, with aclnn's argument lists: each is the V4 call with the arguments later
 * versions added left absent (NULL tensors and arrays, mode attributes 0). V1 lacks
 * keyAntiquantScale..actualSharedPrefixLen, keyAntiquantMode, valueAntiquantMode; V2 adds them;
 * V3 adds queryRope, keyRope, keyRopeAntiquantScale; V4 adds dequantScaleQuery, learnableSink,
 * queryQuantMode. Phase 2 of every version takes any FusedInferAttentionScore executor. */
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
    const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShiftOptional,
    const attnopsTensor* attenMaskOptional, const attnopsIntArray* actualSeqLengthsOptional,
    const attnopsIntArray* actualSeqLengthsKvOptional, const attnopsTensor* deqScale1Optional,
    const attnopsTensor* quantScale1Optional, const attnopsTensor* deqScale2Optional,
    const attnopsTensor* quantScale2Optional, const attnopsTensor* quantOffset2Optional,
    const attnopsTensor* antiquantScaleOptional, const attnopsTensor* antiquantOffsetOptional,
    const attnopsTensor* blockTableOptional, const attnopsTensor* queryPaddingSizeOptional,
    const attnopsTensor* kvPaddingSizeOptional, int64_t numHeads, double scaleValue, int64_t preTokens,
    int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse, uint64_t* workspaceSize,
    attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScore(void* workspace, uint64_t workspaceSize,
                                                          attnopsExecutor* executor, attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV2GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
    const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShiftOptional,
    const attnopsTensor* attenMaskOptional, const attnopsIntArray* actualSeqLengthsOptional,
    const attnopsIntArray* actualSeqLengthsKvOptional, const attnopsTensor* deqScale1Optional,
    const attnopsTensor* quantScale1Optional, const attnopsTensor* deqScale2Optional,
    const attnopsTensor* quantScale2Optional, const attnopsTensor* quantOffset2Optional,
    const attnopsTensor* antiquantScaleOptional, const attnopsTensor* antiquantOffsetOptional,
    const attnopsTensor* blockTableOptional, const attnopsTensor* queryPaddingSizeOptional,
    const attnopsTensor* kvPaddingSizeOptional, const attnopsTensor* keyAntiquantScaleOptional,
    const attnopsTensor* keyAntiquantOffsetOptional, const attnopsTensor* valueAntiquantScaleOptional,
    const attnopsTensor* valueAntiquantOffsetOptional, const attnopsTensor* keySharedPrefixOptional,
    const attnopsTensor* valueSharedPrefixOptional, const attnopsIntArray* actualSharedPrefixLenOptional,
    int64_t numHeads, double scaleValue, int64_t preTokens, int64_t nextTokens, const char* inputLayout,
    int64_t numKeyValueHeads, int64_t sparseMode, int64_t innerPrecise, int64_t blockSize,
    int64_t antiquantMode, bool softmaxLseFlag, int64_t keyAntiquantMode, int64_t valueAntiquantMode,
    const attnopsTensor* attentionOut, const attnopsTensor* softmaxLse, uint64_t* workspaceSize,
    attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV2(void* workspace, uint64_t workspaceSize,
                                                            attnopsExecutor* executor, attnopsStream* stream);

ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV3GetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* const* key, uint64_t keyCount,
    const attnopsTensor* const* value, uint64_t valueCount, const attnopsTensor* pseShiftOptional,
    const attnopsTensor* attenMaskOptional, const attnopsIntArray* actualSeqLengthsOptional,
    const attnopsIntArray* actualSeqLengthsKvOptional, const attnopsTensor* deqScale1Optional,
    const attnopsTensor* quantScale1Optional, const attnopsTensor* deqScale2Optional,
    const attnopsTensor* quantScale2Optional, const attnopsTensor* quantOffset2Optional,
    const attnopsTensor* antiquantScaleOptional, const attnopsTensor* antiquantOffsetOptional,
    const attnopsTensor* blockTableOptional, const attnopsTensor* queryPaddingSizeOptional,
    const attnopsTensor* kvPaddingSizeOptional, const attnopsTensor* keyAntiquantScaleOptional,
    const attnopsTensor* keyAntiquantOffsetOptional, const attnopsTensor* valueAntiquantScaleOptional,
    const attnopsTensor* valueAntiquantOffsetOptional, const attnopsTensor* keySharedPrefixOptional,
    const attnopsTensor* valueSharedPrefixOptional, const attnopsIntArray* actualSharedPrefixLenOptional,
    const attnopsTensor* queryRopeOptional, const attnopsTensor* keyRopeOptional,
    const attnopsTensor* keyRopeAntiquantScaleOptional, int64_t numHeads, double scaleValue, int64_t preTokens,
    int64_t nextTokens, const char* inputLayout, int64_t numKeyValueHeads, int64_t sparseMode,
    int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, bool softmaxLseFlag,
    int64_t keyAntiquantMode, int64_t valueAntiquantMode, const attnopsTensor* attentionOut,
    const attnopsTensor* softmaxLse, uint64_t* workspaceSize, attnopsExecutor** executor);
ATTNOPS_API attnopsStatus attnopsFusedInferAttentionScoreV3(void* workspace, uint64_t workspaceSize,
                                                            attnopsExecutor* executor, attnopsStream* stream);

#ifdef __cplusplus
}
#endif

#endif
