// Validation of FusedInferAttentionScore arguments: every rule in one ordered list, each failure a
// status and a message naming the argument, the value received and the rule broken. What passes
// becomes the Params a kernel sees.
#pragma once

#include <cstdint>

#include "attnops/tensor.h"
#include "ops/fused_infer_attention_score/params.hpp"

namespace attnops::fia {

// The entry point that received the call: PromptFlashAttention and IncreFlashAttention map their
// arguments onto FusedInferAttentionScore's (one core, spec section A) and add their own rules.
enum class Entry { FusedInferAttentionScore, PromptFlashAttention, IncreFlashAttention };

// The V4 API arguments, unpacked and untouched.
struct Args {
    Entry entry = Entry::FusedInferAttentionScore;
    // The name the caller's API gives the KV lengths (IncreFlashAttention: actualSeqLengths), for
    // messages.
    const char* kvLengthsName = "actualSeqLengthsKv";
    const attnopsTensor* query = nullptr;
    const attnopsTensor* const* key = nullptr;
    uint64_t keyCount = 0;
    const attnopsTensor* const* value = nullptr;
    uint64_t valueCount = 0;
    const attnopsTensor* pseShift = nullptr;
    const attnopsTensor* attenMask = nullptr;
    const attnopsIntArray* actualSeqLengths = nullptr;
    const attnopsIntArray* actualSeqLengthsKv = nullptr;
    const attnopsTensor* deqScale1 = nullptr;
    const attnopsTensor* quantScale1 = nullptr;
    const attnopsTensor* deqScale2 = nullptr;
    const attnopsTensor* quantScale2 = nullptr;
    const attnopsTensor* quantOffset2 = nullptr;
    const attnopsTensor* antiquantScale = nullptr;
    const attnopsTensor* antiquantOffset = nullptr;
    const attnopsTensor* blockTable = nullptr;
    const attnopsTensor* queryPaddingSize = nullptr;
    const attnopsTensor* kvPaddingSize = nullptr;
    const attnopsTensor* keyAntiquantScale = nullptr;
    const attnopsTensor* keyAntiquantOffset = nullptr;
    const attnopsTensor* valueAntiquantScale = nullptr;
    const attnopsTensor* valueAntiquantOffset = nullptr;
    const attnopsTensor* keySharedPrefix = nullptr;
    const attnopsTensor* valueSharedPrefix = nullptr;
    const attnopsIntArray* actualSharedPrefixLen = nullptr;
    const attnopsTensor* queryRope = nullptr;
    const attnopsTensor* keyRope = nullptr;
    const attnopsTensor* keyRopeAntiquantScale = nullptr;
    const attnopsTensor* dequantScaleQuery = nullptr;
    const attnopsTensor* learnableSink = nullptr;
    int64_t numHeads = 1;
    double scaleValue = 1.0;
    int64_t preTokens = 2147483647;
    int64_t nextTokens = 2147483647;
    const char* inputLayout = "BSH";
    int64_t numKeyValueHeads = 0;
    int64_t sparseMode = 0;
    int64_t innerPrecise = 0;
    int64_t blockSize = 0;
    int64_t antiquantMode = 0;
    bool softmaxLseFlag = false;
    int64_t keyAntiquantMode = 0;
    int64_t valueAntiquantMode = 0;
    int64_t queryQuantMode = 0;
    const attnopsTensor* attentionOut = nullptr;
    const attnopsTensor* softmaxLse = nullptr;
};

// Throws a StatusError on the first rule broken; `device` is the planning device's index.
Params checkForward(const Args& args, int32_t device);

}  // namespace attnops::fia
