// C API of FlashAttentionScore: unpack arguments, check, plan (cached per device), hand back the
// executor; no maths here.
#include <fmt/format.h>

#include <cstring>

#include "attnops/flash_attention_score.h"
#include "attnops/flash_attention_score_ex.h"
#include "core/error.hpp"
#include "core/handles.hpp"
#include "core/philox.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/forward.hpp"
#include "ops/flash_attention_score/plan.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

namespace {

// Number of scores (dropout bits) of a mask request: fixed (batch, S1, S2) or TND arrays. The
// fixed count is arithmetic: nothing is allocated per sequence.
int64_t dropMaskElements(int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen,
                         const attnopsIntArray* qArr, const attnopsIntArray* kvArr) {
    if (headNum <= 0) invalidArgument("headNum", headNum, "must be > 0");
    qArr = liveIntArrayOrNull(qArr, "actualSeqQLen");
    kvArr = liveIntArrayOrNull(kvArr, "actualSeqKvLen");
    if ((qArr == nullptr) != (kvArr == nullptr))
        nullArgument(qArr ? "actualSeqKvLen" : "actualSeqQLen", "both TND arrays are given, or neither");
    if (qArr) {
        if (batch != 0 || qSeqLen != 0 || kvSeqLen != 0)
            invalidArgument("batch/qSeqLen/kvSeqLen", fmt::format("{}/{}/{}", batch, qSeqLen, kvSeqLen),
                            "must be 0 when the TND arrays are given");
        const int64_t big = int64_t(1) << 62;
        return fa::tndSequences(*qArr, *kvArr, big, big, headNum).totalElements;
    }
    if (batch < 0) invalidArgument("batch", batch, "must be >= 0");
    if (qSeqLen < 0) invalidArgument("qSeqLen", qSeqLen, "must be >= 0");
    if (kvSeqLen < 0) invalidArgument("kvSeqLen", kvSeqLen, "must be >= 0");
    int64_t total = 0;
    if (__builtin_mul_overflow(batch, headNum, &total) || __builtin_mul_overflow(total, qSeqLen, &total) ||
        __builtin_mul_overflow(total, kvSeqLen, &total))
        unsupported("B*N1*S1*S2 overflows 64-bit indexing ({} x {} x {} x {})", batch, headNum, qSeqLen, kvSeqLen);
    return total;
}

}  // namespace

extern "C" {

attnopsStatus attnopsFlashAttentionScoreGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
    const attnopsTensor* realShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional,
    const attnopsIntArray* prefixOptional, const attnopsIntArray* actualSeqQLenOptional,
    const attnopsIntArray* actualSeqKvLenOptional, const attnopsIntArray* qStartIdxOptional,
    const attnopsIntArray* kvStartIdxOptional, const attnopsTensor* sinkOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, const char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset,
    const attnopsTensor* softmaxMaxOut, const attnopsTensor* softmaxSumOut, const attnopsTensor* softmaxOutOut,
    const attnopsTensor* attentionOutOut, uint64_t* workspaceSize, attnopsExecutor** executor) {
    return attnopsFlashAttentionScoreExGetWorkspaceSize(
        query, key, value, realShiftOptional, dropMaskOptional, paddingMaskOptional, attenMaskOptional, prefixOptional,
        actualSeqQLenOptional, actualSeqKvLenOptional, qStartIdxOptional, kvStartIdxOptional, sinkOptional, scaleValue,
        keepProb, preTokens, nextTokens, headNum, inputLayout, innerPrecise, sparseMode, pseType, seed, offset,
        softmaxMaxOut, softmaxSumOut, softmaxOutOut, attentionOutOut, nullptr, workspaceSize, executor);
}

attnopsStatus attnopsFlashAttentionScoreExGetWorkspaceSize(
    const attnopsTensor* query, const attnopsTensor* key, const attnopsTensor* value,
    const attnopsTensor* realShiftOptional, const attnopsTensor* dropMaskOptional,
    const attnopsTensor* paddingMaskOptional, const attnopsTensor* attenMaskOptional,
    const attnopsIntArray* prefixOptional, const attnopsIntArray* actualSeqQLenOptional,
    const attnopsIntArray* actualSeqKvLenOptional, const attnopsIntArray* qStartIdxOptional,
    const attnopsIntArray* kvStartIdxOptional, const attnopsTensor* sinkOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, const char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset,
    const attnopsTensor* softmaxMaxOut, const attnopsTensor* softmaxSumOut, const attnopsTensor* softmaxOutOut,
    const attnopsTensor* attentionOutOut, const attnopsFlashAttentionExtras* extras, uint64_t* workspaceSize,
    attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        fa::ForwardArgs args;
        args.query = query;
        args.key = key;
        args.value = value;
        args.realShift = realShiftOptional;
        args.dropMask = dropMaskOptional;
        args.paddingMask = paddingMaskOptional;
        args.attenMask = attenMaskOptional;
        args.prefix = prefixOptional;
        args.actualSeqQLen = actualSeqQLenOptional;
        args.actualSeqKvLen = actualSeqKvLenOptional;
        args.qStartIdx = qStartIdxOptional;
        args.kvStartIdx = kvStartIdxOptional;
        args.sink = sinkOptional;
        args.scaleValue = scaleValue;
        args.keepProb = keepProb;
        args.preTokens = preTokens;
        args.nextTokens = nextTokens;
        args.headNum = headNum;
        args.inputLayout = inputLayout;
        args.innerPrecise = innerPrecise;
        args.sparseMode = sparseMode;
        args.pseType = pseType;
        args.seed = seed;
        args.offset = offset;
        args.softmaxMax = softmaxMaxOut;
        args.softmaxSum = softmaxSumOut;
        args.softmaxOut = softmaxOutOut;
        args.attentionOut = attentionOutOut;
        args.extras = extras;

        Runtime& rt = Runtime::get();
        Device& device = rt.currentDevice();
        fa::ForwardParams params = fa::checkForward(args, device.index());
        const int32_t threads = device.threads();
        const std::string forced = envString("ATTNOPS_FORCE_IMPL");
        // The extended entry point may write an fp32 output from half inputs: its own plans.
        const std::string kind = extras ? fmt::format("fa.forward.ex{}|", int(params.out.dtype)) : "fa.forward|";
        auto plan = device.planCache().getOrMake<fa::ForwardPlan>(
            kind + fa::forwardPlanKey(params, threads, forced),
            [&] { return fa::makeForwardPlan(params, threads, platform(), forced); });
        auto exec = std::make_unique<fa::ForwardExecutor>(std::move(params), std::move(plan));
        exec->device = device.index();
        *workspaceSize = exec->workspaceBytes;
        *executor = registerExecutor(std::move(exec));
    });
}

attnopsStatus attnopsFlashAttentionExtrasInit(attnopsFlashAttentionExtras* extras) {
    return guarded([&] {
        if (extras == nullptr) nullArgument("extras");
        *extras = attnopsFlashAttentionExtras{};
        extras->structSize = sizeof(attnopsFlashAttentionExtras);
    });
}

attnopsStatus attnopsFlashAttentionScore(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                         attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

attnopsStatus attnopsFlashAttentionDropMaskBytes(int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen,
                                                 const attnopsIntArray* actualSeqQLenOptional,
                                                 const attnopsIntArray* actualSeqKvLenOptional, uint64_t* bytes) {
    return guarded([&] {
        if (bytes == nullptr) nullArgument("bytes");
        const int64_t elements =
            dropMaskElements(batch, headNum, qSeqLen, kvSeqLen, actualSeqQLenOptional, actualSeqKvLenOptional);
        *bytes = uint64_t((elements + 7) / 8);
    });
}

attnopsStatus attnopsFlashAttentionGenDropMask(int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen,
                                               const attnopsIntArray* actualSeqQLenOptional,
                                               const attnopsIntArray* actualSeqKvLenOptional, double keepProb,
                                               int64_t seed, int64_t offset, const attnopsTensor* dropMaskOut) {
    return guarded([&] {
        const attnopsTensor& out = requireTensor(dropMaskOut, "dropMaskOut");
        if (!(keepProb > 0.0 && keepProb <= 1.0)) invalidArgument("keepProb", keepProb, "must be in (0, 1]");
        const int64_t elements =
            dropMaskElements(batch, headNum, qSeqLen, kvSeqLen, actualSeqQLenOptional, actualSeqKvLenOptional);
        const int64_t bytes = (elements + 7) / 8;
        if (out.dtype != DType::U8) invalidArgument("dropMaskOut.dtype", attnopsDataTypeName(attnopsDataType(int(out.dtype))), "must be uint8");
        if (out.rank != 1 || out.strides[0] != 1)
            invalidArgument("dropMaskOut.shape", shapeString(out), "must be a contiguous 1-D tensor");
        if (out.shape[0] < bytes) invalidArgument("dropMaskOut.shape", shapeString(out), "must hold at least {} bytes", bytes);
        auto* dst = static_cast<uint8_t*>(out.data);
        std::memset(dst, 0, size_t(out.shape[0]));
        const DropoutBits bits{uint64_t(seed), uint64_t(offset), float(keepProb)};
        uint8_t flags[64];
        for (int64_t first = 0; first < elements; first += 64) {
            const int64_t n = std::min<int64_t>(64, elements - first);
            if (keepProb < 1.0)
                bits.fill(uint64_t(first), n, flags);
            else  // keepProb 1 is no dropout (as in the forward), even where a uniform rounds to 1.0f
                std::memset(flags, 1, size_t(n));
            for (int64_t e = 0; e < n; ++e)
                if (flags[e]) dst[(first + e) >> 3] |= uint8_t(1u << ((first + e) & 7));
        }
    });
}

}  // extern "C"
