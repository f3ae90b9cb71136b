// Validation of FlashAttentionScore arguments: every rule in one ordered list, each failure a
// status and a message naming the argument, the value received and the rule broken. What passes
// becomes the ForwardParams a kernel sees.
#pragma once

#include <cstdint>

#include "attnops/flash_attention_score_ex.h"
#include "attnops/tensor.h"
#include "ops/flash_attention_score/params.hpp"

namespace attnops::fa {

// The API arguments, unpacked and untouched.
struct ForwardArgs {
    const attnopsTensor* query = nullptr;
    const attnopsTensor* key = nullptr;
    const attnopsTensor* value = nullptr;
    const attnopsTensor* realShift = nullptr;
    const attnopsTensor* dropMask = nullptr;
    const attnopsTensor* paddingMask = nullptr;
    const attnopsTensor* attenMask = nullptr;
    const attnopsIntArray* prefix = nullptr;
    const attnopsIntArray* actualSeqQLen = nullptr;
    const attnopsIntArray* actualSeqKvLen = nullptr;
    const attnopsIntArray* qStartIdx = nullptr;
    const attnopsIntArray* kvStartIdx = nullptr;
    const attnopsTensor* sink = nullptr;
    double scaleValue = 1.0;
    double keepProb = 1.0;
    int64_t preTokens = 2147483647;
    int64_t nextTokens = 2147483647;
    int64_t headNum = 0;
    const char* inputLayout = nullptr;
    int64_t innerPrecise = 0;
    int64_t sparseMode = 0;
    int64_t pseType = 1;
    int64_t seed = 0;
    int64_t offset = 0;
    const attnopsTensor* softmaxMax = nullptr;
    const attnopsTensor* softmaxSum = nullptr;
    const attnopsTensor* softmaxOut = nullptr;
    const attnopsTensor* attentionOut = nullptr;
    const char* attentionOutName = "attentionOut";  // "attentionIn" when the backward checks
    // Extended entry points only (NULL from the plain ones): checked by checkExtras.
    const attnopsFlashAttentionExtras* extras = nullptr;
};

// The backward's arguments: the forward's (statistics and attentionIn as inputs) plus these.
struct BackwardArgs {
    ForwardArgs forward;
    const attnopsTensor* dy = nullptr;
    const attnopsTensor* softmaxIn = nullptr;
    const attnopsTensor* dq = nullptr;
    const attnopsTensor* dk = nullptr;
    const attnopsTensor* dv = nullptr;
    const attnopsTensor* dpse = nullptr;
    const attnopsTensor* dsink = nullptr;
};

// Throws attnops::Error on the first rule broken; `device` is the planning device's index.
ForwardParams checkForward(const ForwardArgs& args, int32_t device);

BackwardParams checkBackward(const BackwardArgs& args, int32_t device);

// Parses a layout name (exact upper case); throws naming `argument`.
Layout parseLayout(const char* name, const char* argument);

// Per-sequence geometry from cumulative end offsets (TND), validated against T1/T2.
Sequences tndSequences(const attnopsIntArray& qCum, const attnopsIntArray& kvCum, int64_t t1, int64_t t2,
                       int64_t n1);
Sequences fixedSequences(int64_t batch, int64_t s1, int64_t s2, int64_t n1);

// check_extras.cpp: the extras struct itself (size, flags), then the global dropout geometry of
// a checked problem (qRows/kvRows: rows of the query/key tensors, T1/T2 or S1/S2).
void checkExtras(const attnopsFlashAttentionExtras* extras);
DropoutGlobal checkDropoutGlobal(const attnopsFlashAttentionExtras& extras, const ForwardParams& p, int64_t qRows,
                                 int64_t kvRows);

}  // namespace attnops::fa
