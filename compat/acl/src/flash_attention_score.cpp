// aclnnFlashAttentionScore V1-V4 and aclnnFlashAttentionVarLenScore V1-V5 on
// attnopsFlashAttentionScoreGetWorkspaceSize: every version fills the arguments of the widest
// one (upstream defaults for the rest) and takes the same path.
#include "attnops/flash_attention_score.h"

#include "aclnnop/aclnn_flash_attention_score.h"
#include "shim.hpp"

namespace attnops::acl {
namespace {

struct ForwardCall {
    Layouts layouts = Layouts::Any;
    const aclTensor* query = nullptr;
    const aclTensor* queryRope = nullptr;
    const aclTensor* key = nullptr;
    const aclTensor* keyRope = nullptr;
    const aclTensor* value = nullptr;
    const aclTensor* realShift = nullptr;
    const aclTensor* dropMask = nullptr;
    const aclTensor* paddingMask = nullptr;
    const aclTensor* attenMask = nullptr;
    const aclTensor* dScaleQ = nullptr;
    const aclTensor* dScaleK = nullptr;
    const aclTensor* dScaleV = nullptr;
    const aclTensor* sink = nullptr;
    const aclIntArray* prefix = nullptr;
    const aclIntArray* actualSeqQLen = nullptr;
    const aclIntArray* actualSeqKvLen = nullptr;
    const aclIntArray* qStartIdx = nullptr;
    const aclIntArray* kvStartIdx = nullptr;
    double scaleValue = 1.0;
    double keepProb = 1.0;
    int64_t preTokens = 2147483647;
    int64_t nextTokens = 2147483647;
    int64_t headNum = 0;
    const char* inputLayout = nullptr;
    int64_t innerPrecise = 0;
    int64_t sparseMode = 0;
    int64_t outDtype = 0;
    int64_t pseType = 1;
    const char* softmaxOutLayout = nullptr;
    int64_t seed = 0;
    int64_t offset = 0;
    const aclTensor* softmaxMax = nullptr;
    const aclTensor* softmaxSum = nullptr;
    const aclTensor* softmaxOut = nullptr;
    const aclTensor* attentionOut = nullptr;
    uint64_t* workspaceSize = nullptr;
    aclOpExecutor** executor = nullptr;
};

aclnnStatus forward(const char* api, const ForwardCall& c) {
    return guardedOp(api, [&] {
        requireLayout(c.inputLayout, c.layouts);
        requireNoRopeOrQuant({{c.queryRope, "queryRope"}, {c.keyRope, "keyRope"}},
                             {{c.dScaleQ, "dScaleQ"}, {c.dScaleK, "dScaleK"}, {c.dScaleV, "dScaleV"}}, c.outDtype);
        const StatsOrder order = statsOrder(c.softmaxOutLayout, "softmaxOutLayout");
        const attnops::Tensor query = view(c.query, "query"), key = view(c.key, "key"), value = view(c.value, "value"),
                              realShift = view(c.realShift, "realShift"), dropMask = view(c.dropMask, "dropMask"),
                              paddingMask = view(c.paddingMask, "paddingMask"),
                              attenMask = view(c.attenMask, "attenMask"), sink = view(c.sink, "sink"),
                              softmaxMax = statsView(c.softmaxMax, "softmaxMax", order),
                              softmaxSum = statsView(c.softmaxSum, "softmaxSum", order),
                              softmaxOut = view(c.softmaxOut, "softmaxOut"),
                              attentionOut = view(c.attentionOut, "attentionOut");
        const attnops::IntArray prefix = view(c.prefix, "prefix"), qLen = view(c.actualSeqQLen, "actualSeqQLen"),
                                kvLen = view(c.actualSeqKvLen, "actualSeqKvLen"),
                                qStart = view(c.qStartIdx, "qStartIdx"), kvStart = view(c.kvStartIdx, "kvStartIdx");
        attnopsExecutor* executor = nullptr;
        attnops::check(attnopsFlashAttentionScoreGetWorkspaceSize(
            query.get(), key.get(), value.get(), realShift.get(), dropMask.get(), paddingMask.get(), attenMask.get(),
            prefix.get(), qLen.get(), kvLen.get(), qStart.get(), kvStart.get(), sink.get(), c.scaleValue, c.keepProb,
            c.preTokens, c.nextTokens, c.headNum, c.inputLayout, c.innerPrecise, c.sparseMode, c.pseType, c.seed,
            c.offset, softmaxMax.get(), softmaxSum.get(), softmaxOut.get(), attentionOut.get(), c.workspaceSize,
            c.executor == nullptr ? nullptr : &executor));
        *c.executor = toAclnn(executor);
    });
}

}  // namespace
}  // namespace attnops::acl

using namespace attnops::acl;

extern "C" {

aclnnStatus aclnnFlashAttentionScoreGetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens,
    int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode, const aclTensor* softmaxMaxOut,
    const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionScoreGetWorkspaceSize",
                   {.layouts = Layouts::Fixed, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .prefix = prefixOptional, .scaleValue = scaleValue,
                    .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                    .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                    .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut,
                    .attentionOut = attentionOutOut, .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionVarLenScoreGetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode,
    const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut,
    const aclTensor* attentionOutOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionVarLenScoreGetWorkspaceSize",
                   {.layouts = Layouts::Tnd, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .prefix = prefixOptional, .actualSeqQLen = actualSeqQLenOptional,
                    .actualSeqKvLen = actualSeqKvLenOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                    .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                    .innerPrecise = innerPrecise, .sparseMode = sparseMode, .softmaxMax = softmaxMaxOut,
                    .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut, .attentionOut = attentionOutOut,
                    .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* softmaxMaxOut,
    const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionScoreV2GetWorkspaceSize",
                   {.layouts = Layouts::Fixed, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .prefix = prefixOptional, .qStartIdx = qStartIdxOptional,
                    .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                    .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                    .innerPrecise = innerPrecise, .sparseMode = sparseMode, .pseType = pseType,
                    .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut,
                    .attentionOut = attentionOutOut, .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* sinkOptional, const aclIntArray* prefixOptional, const aclIntArray* qStartIdxOptional,
    const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens,
    int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode, int64_t pseType,
    const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut,
    const aclTensor* attentionOutOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionScoreV3GetWorkspaceSize",
                   {.layouts = Layouts::Fixed, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .sink = sinkOptional, .prefix = prefixOptional,
                    .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                    .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                    .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                    .pseType = pseType, .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut,
                    .softmaxOut = softmaxOutOut, .attentionOut = attentionOutOut, .workspaceSize = workspaceSize,
                    .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* queryRopeOptional, const aclTensor* keyRopeOptional, const aclTensor* dScaleQOptional,
    const aclTensor* dScaleKOptional, const aclTensor* dScaleVOptional, const aclTensor* sinkOptional,
    const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, const aclIntArray* qStartIdxOptional,
    const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode,
    int64_t outDtype, int64_t pseType, char* softmaxOutLayout, int64_t seed, int64_t offset,
    const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut,
    const aclTensor* attentionOutOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionScoreV4GetWorkspaceSize",
                   {.layouts = Layouts::Any, .query = query, .queryRope = queryRopeOptional, .key = key,
                    .keyRope = keyRopeOptional, .value = value, .realShift = realShiftOptional,
                    .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional, .attenMask = attenMaskOptional,
                    .dScaleQ = dScaleQOptional, .dScaleK = dScaleKOptional, .dScaleV = dScaleVOptional,
                    .sink = sinkOptional, .prefix = prefixOptional, .actualSeqQLen = actualSeqQLenOptional,
                    .actualSeqKvLen = actualSeqKvLenOptional, .qStartIdx = qStartIdxOptional,
                    .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                    .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                    .innerPrecise = innerPrecise, .sparseMode = sparseMode, .outDtype = outDtype, .pseType = pseType,
                    .softmaxOutLayout = softmaxOutLayout, .seed = seed, .offset = offset, .softmaxMax = softmaxMaxOut,
                    .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut, .attentionOut = attentionOutOut,
                    .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionVarLenScoreV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, const aclIntArray* qStartIdxOptional,
    const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens,
    int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode, int64_t pseType,
    const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut,
    const aclTensor* attentionOutOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionVarLenScoreV2GetWorkspaceSize",
                   {.layouts = Layouts::Tnd, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .prefix = prefixOptional, .actualSeqQLen = actualSeqQLenOptional,
                    .actualSeqKvLen = actualSeqKvLenOptional, .qStartIdx = qStartIdxOptional,
                    .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                    .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                    .innerPrecise = innerPrecise, .sparseMode = sparseMode, .pseType = pseType,
                    .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut,
                    .attentionOut = attentionOutOut, .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionVarLenScoreV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* queryRope, const aclTensor* key, const aclTensor* keyRope,
    const aclTensor* value, const aclTensor* realShiftOptional, const aclTensor* dropMaskOptional,
    const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb,
    int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise,
    int64_t sparseMode, int64_t pseType, const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut,
    const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionVarLenScoreV3GetWorkspaceSize",
                   {.layouts = Layouts::Tnd, .query = query, .queryRope = queryRope, .key = key, .keyRope = keyRope,
                    .value = value, .realShift = realShiftOptional, .dropMask = dropMaskOptional,
                    .paddingMask = paddingMaskOptional, .attenMask = attenMaskOptional, .prefix = prefixOptional,
                    .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                    .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                    .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                    .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                    .pseType = pseType, .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut,
                    .softmaxOut = softmaxOutOut, .attentionOut = attentionOutOut, .workspaceSize = workspaceSize,
                    .executor = executor});
}

aclnnStatus aclnnFlashAttentionVarLenScoreV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode,
    char* softmaxOutLayout, const aclTensor* softmaxMaxOut, const aclTensor* softmaxSumOut,
    const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
    return forward("aclnnFlashAttentionVarLenScoreV4GetWorkspaceSize",
                   {.layouts = Layouts::Tnd, .query = query, .key = key, .value = value,
                    .realShift = realShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                    .attenMask = attenMaskOptional, .prefix = prefixOptional, .actualSeqQLen = actualSeqQLenOptional,
                    .actualSeqKvLen = actualSeqKvLenOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                    .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                    .innerPrecise = innerPrecise, .sparseMode = sparseMode, .softmaxOutLayout = softmaxOutLayout,
                    .softmaxMax = softmaxMaxOut, .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut,
                    .attentionOut = attentionOutOut, .workspaceSize = workspaceSize, .executor = executor});
}

}  // extern "C"

namespace {

// V5 and its GetMaxWorkspaceSize share one argument list.
aclnnStatus varLenScoreV5(const char* api, const aclTensor* query, const aclTensor* queryRope, const aclTensor* key,
                          const aclTensor* keyRope, const aclTensor* value, const aclTensor* realShiftOptional,
                          const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
                          const aclTensor* attenMaskOptional, const aclTensor* sinkOptional,
                          const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
                          const aclIntArray* actualSeqKvLenOptional, const aclIntArray* qStartIdxOptional,
                          const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens,
                          int64_t nextTokens, int64_t headNum, char* inputLayout, int64_t innerPrecise,
                          int64_t sparseMode, int64_t pseType, char* softmaxOutLayout, const aclTensor* softmaxMaxOut,
                          const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut,
                          const aclTensor* attentionOutOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return forward(api, {.layouts = Layouts::Tnd, .query = query, .queryRope = queryRope, .key = key,
                         .keyRope = keyRope, .value = value, .realShift = realShiftOptional,
                         .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                         .attenMask = attenMaskOptional, .sink = sinkOptional, .prefix = prefixOptional,
                         .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                         .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                         .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                         .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                         .pseType = pseType, .softmaxOutLayout = softmaxOutLayout, .softmaxMax = softmaxMaxOut,
                         .softmaxSum = softmaxSumOut, .softmaxOut = softmaxOutOut, .attentionOut = attentionOutOut,
                         .workspaceSize = workspaceSize, .executor = executor});
}

}  // namespace

extern "C" {

#define ATTNOPS_V5_PARAMS                                                                                           \
    const aclTensor *query, const aclTensor *queryRope, const aclTensor *key, const aclTensor *keyRope,            \
        const aclTensor *value, const aclTensor *realShiftOptional, const aclTensor *dropMaskOptional,              \
        const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional, const aclTensor *sinkOptional,    \
        const aclIntArray *prefixOptional, const aclIntArray *actualSeqQLenOptional,                                \
        const aclIntArray *actualSeqKvLenOptional, const aclIntArray *qStartIdxOptional,                            \
        const aclIntArray *kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens,               \
        int64_t nextTokens, int64_t headNum, char *inputLayout, int64_t innerPrecise, int64_t sparseMode,           \
        int64_t pseType, char *softmaxOutLayout, const aclTensor *softmaxMaxOut, const aclTensor *softmaxSumOut,    \
        const aclTensor *softmaxOutOut, const aclTensor *attentionOutOut, uint64_t *workspaceSize,                 \
        aclOpExecutor **executor
#define ATTNOPS_V5_ARGS                                                                                             \
    query, queryRope, key, keyRope, value, realShiftOptional, dropMaskOptional, paddingMaskOptional,                \
        attenMaskOptional, sinkOptional, prefixOptional, actualSeqQLenOptional, actualSeqKvLenOptional,             \
        qStartIdxOptional, kvStartIdxOptional, scaleValue, keepProb, preTokens, nextTokens, headNum, inputLayout,   \
        innerPrecise, sparseMode, pseType, softmaxOutLayout, softmaxMaxOut, softmaxSumOut, softmaxOutOut,           \
        attentionOutOut, workspaceSize, executor

aclnnStatus aclnnFlashAttentionVarLenScoreV5GetWorkspaceSize(ATTNOPS_V5_PARAMS) {
    return varLenScoreV5("aclnnFlashAttentionVarLenScoreV5GetWorkspaceSize", ATTNOPS_V5_ARGS);
}

aclnnStatus aclnnFlashAttentionVarLenScoreV5GetMaxWorkspaceSize(ATTNOPS_V5_PARAMS) {
    return varLenScoreV5("aclnnFlashAttentionVarLenScoreV5GetMaxWorkspaceSize", ATTNOPS_V5_ARGS);
}

#undef ATTNOPS_V5_PARAMS
#undef ATTNOPS_V5_ARGS

ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScore, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionVarLenScore, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreV2, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreV3, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreV4, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionVarLenScoreV2, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionVarLenScoreV3, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionVarLenScoreV4, attnopsFlashAttentionScore)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionVarLenScoreV5, attnopsFlashAttentionScore)

}  // extern "C"
