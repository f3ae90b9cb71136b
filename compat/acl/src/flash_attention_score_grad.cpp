// aclnnFlashAttentionScoreGrad V1-V4 and aclnnFlashAttentionUnpaddingScoreGrad V1-V5 on
// attnopsFlashAttentionScoreGradGetWorkspaceSize: every version fills the arguments of the
// widest one (upstream defaults for the rest) and takes the same path.
#include "attnops/flash_attention_score_grad.h"

#include "aclnnop/aclnn_flash_attention_score_grad.h"
#include "shim.hpp"

namespace attnops::acl {
namespace {

constexpr const char* kRopeOut = "rope gradients are not produced by attnops";

struct BackwardCall {
    Layouts layouts = Layouts::Any;
    const aclTensor* query = nullptr;
    const aclTensor* queryRope = nullptr;
    const aclTensor* key = nullptr;
    const aclTensor* keyRope = nullptr;
    const aclTensor* value = nullptr;
    const aclTensor* dy = nullptr;
    const aclTensor* pseShift = nullptr;
    const aclTensor* dropMask = nullptr;
    const aclTensor* paddingMask = nullptr;
    const aclTensor* attenMask = nullptr;
    const aclTensor* softmaxMax = nullptr;
    const aclTensor* softmaxSum = nullptr;
    const aclTensor* softmaxIn = nullptr;
    const aclTensor* attentionIn = nullptr;
    const aclTensor* sinkIn = nullptr;
    const aclTensor* dScaleQ = nullptr;
    const aclTensor* dScaleK = nullptr;
    const aclTensor* dScaleV = nullptr;
    const aclTensor* dScaleDy = nullptr;
    const aclTensor* dScaleO = nullptr;
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
    const char* softmaxInLayout = nullptr;
    int64_t innerPrecise = 0;
    int64_t sparseMode = 0;
    int64_t pseType = 1;
    int64_t seed = 0;
    int64_t offset = 0;
    int64_t outDtype = 0;
    const aclTensor* dq = nullptr;
    const aclTensor* dqRope = nullptr;
    const aclTensor* dk = nullptr;
    const aclTensor* dkRope = nullptr;
    const aclTensor* dv = nullptr;
    const aclTensor* dpse = nullptr;
    const aclTensor* dsink = nullptr;
    uint64_t* workspaceSize = nullptr;
    aclOpExecutor** executor = nullptr;
};

aclnnStatus backward(const char* api, const BackwardCall& c) {
    return guardedOp(api, [&] {
        requireLayout(c.inputLayout, c.layouts);
        requireNoRopeOrQuant({{c.queryRope, "queryRope"}, {c.keyRope, "keyInRope"}},
                             {{c.dScaleQ, "dScaleQ"}, {c.dScaleK, "dScaleK"}, {c.dScaleV, "dScaleV"},
                              {c.dScaleDy, "dScaleDy"}, {c.dScaleO, "dScaleO"}},
                             c.outDtype);
        requireAbsentOrEmpty(c.dqRope, "dqRopeOut", kRopeOut);
        requireAbsentOrEmpty(c.dkRope, "dkRopeOut", kRopeOut);
        const StatsOrder order = statsOrder(c.softmaxInLayout, "softmaxInLayout");
        const attnops::Tensor query = view(c.query, "query"), key = view(c.key, "keyIn"), value = view(c.value, "value"),
                              dy = view(c.dy, "dy"), pse = view(c.pseShift, "pseShift"),
                              dropMask = view(c.dropMask, "dropMask"), paddingMask = view(c.paddingMask, "paddingMask"),
                              attenMask = view(c.attenMask, "attenMask"),
                              softmaxMax = statsView(c.softmaxMax, "softmaxMax", order),
                              softmaxSum = statsView(c.softmaxSum, "softmaxSum", order),
                              softmaxIn = view(c.softmaxIn, "softmaxIn"), attentionIn = view(c.attentionIn, "attentionIn"),
                              sink = view(c.sinkIn, "sinkIn"), dq = view(c.dq, "dqOut"), dk = view(c.dk, "dkOut"),
                              dv = view(c.dv, "dvOut"), dpse = view(c.dpse, "dpseOut"), dsink = view(c.dsink, "dsinkOut");
        const attnops::IntArray prefix = view(c.prefix, "prefix"), qLen = view(c.actualSeqQLen, "actualSeqQLen"),
                                kvLen = view(c.actualSeqKvLen, "actualSeqKvLen"),
                                qStart = view(c.qStartIdx, "qStartIdx"), kvStart = view(c.kvStartIdx, "kvStartIdx");
        attnopsExecutor* executor = nullptr;
        attnops::check(attnopsFlashAttentionScoreGradGetWorkspaceSize(
            query.get(), key.get(), value.get(), dy.get(), pse.get(), dropMask.get(), paddingMask.get(),
            attenMask.get(), softmaxMax.get(), softmaxSum.get(), softmaxIn.get(), attentionIn.get(), prefix.get(),
            qLen.get(), kvLen.get(), qStart.get(), kvStart.get(), sink.get(), c.scaleValue, c.keepProb, c.preTokens,
            c.nextTokens, c.headNum, c.inputLayout, c.innerPrecise, c.sparseMode, c.pseType, c.seed, c.offset, dq.get(),
            dk.get(), dv.get(), dpse.get(), dsink.get(), c.workspaceSize, c.executor == nullptr ? nullptr : &executor));
        *c.executor = toAclnn(executor);
    });
}

}  // namespace
}  // namespace attnops::acl

using namespace attnops::acl;

namespace {

// UnpaddingScoreGradV5 and its GetMaxWorkspaceSize share one argument list.
aclnnStatus unpaddingV5(const char* api, const aclTensor* query, const aclTensor* queryRope, const aclTensor* keyIn,
                        const aclTensor* keyInRope, const aclTensor* value, const aclTensor* dy,
                        const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional,
                        const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
                        const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
                        const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional,
                        const aclTensor* sinkInOptional, const aclIntArray* prefixOptional,
                        const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
                        const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
                        double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
                        int64_t innerPrecise, int64_t sparseMode, int64_t pseType, char* softmaxInLayout,
                        const aclTensor* dqOut, const aclTensor* dqRopeOut, const aclTensor* dkOut,
                        const aclTensor* dkRopeOut, const aclTensor* dvOut, const aclTensor* dpseOut,
                        const aclTensor* dsinkOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward(api, {.layouts = Layouts::Tnd, .query = query, .queryRope = queryRope, .key = keyIn,
                          .keyRope = keyInRope, .value = value, .dy = dy, .pseShift = pseShiftOptional,
                          .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                          .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                          .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                          .attentionIn = attentionInOptional, .sinkIn = sinkInOptional, .prefix = prefixOptional,
                          .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                          .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                          .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                          .inputLayout = inputLayout, .softmaxInLayout = softmaxInLayout,
                          .innerPrecise = innerPrecise, .sparseMode = sparseMode, .pseType = pseType, .dq = dqOut,
                          .dqRope = dqRopeOut, .dk = dkOut, .dkRope = dkRopeOut, .dv = dvOut, .dpse = dpseOut,
                          .dsink = dsinkOut, .workspaceSize = workspaceSize, .executor = executor});
}

}  // namespace

extern "C" {

aclnnStatus aclnnFlashAttentionScoreGradGetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionScoreGradGetWorkspaceSize",
                    {.layouts = Layouts::Fixed, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .prefix = prefixOptional, .scaleValue = scaleValue,
                     .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .dq = dqOut, .dk = dkOut, .dv = dvOut, .dpse = dpseOut, .workspaceSize = workspaceSize,
                     .executor = executor});
}

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize",
                    {.layouts = Layouts::Tnd, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .prefix = prefixOptional,
                     .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                     .scaleValue = scaleValue, .keepProb = keepProb, .preTokens = preTokens,
                     .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                     .innerPrecise = innerPrecise, .sparseMode = sparseMode, .dq = dqOut, .dk = dkOut, .dv = dvOut,
                     .dpse = dpseOut, .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreGradV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionScoreGradV2GetWorkspaceSize",
                    {.layouts = Layouts::Fixed, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .prefix = prefixOptional, .qStartIdx = qStartIdxOptional,
                     .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue, .keepProb = keepProb,
                     .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .pseType = pseType, .dq = dqOut, .dk = dkOut, .dv = dvOut, .dpse = dpseOut,
                     .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreGradV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclTensor* sinkInOptional,
    const aclIntArray* prefixOptional, const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionScoreGradV3GetWorkspaceSize",
                    {.layouts = Layouts::Fixed, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .sinkIn = sinkInOptional, .prefix = prefixOptional,
                     .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                     .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .pseType = pseType, .dq = dqOut, .dk = dkOut, .dv = dvOut, .dpse = dpseOut, .dsink = dsinkOut,
                     .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionScoreGradV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclTensor* sinkInOptional,
    const aclTensor* queryRopeOptional, const aclTensor* keyRopeOptional, const aclTensor* dScaleQOptional,
    const aclTensor* dScaleKOptional, const aclTensor* dScaleVOptional, const aclTensor* dScaleDyOptional,
    const aclTensor* dScaleOOptional, const aclIntArray* prefixOptional, const aclIntArray* actualSeqQLenOptional,
    const aclIntArray* actualSeqKvLenOptional, const aclIntArray* qStartIdxOptional,
    const aclIntArray* kvStartIdxOptional, double scaleValue, double keepProb, int64_t preTokens,
    int64_t nextTokens, int64_t headNum, char* inputLayout, char* softmaxInLayout, int64_t innerPrecise,
    int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset, int64_t outDtype, const aclTensor* dqOut,
    const aclTensor* dkOut, const aclTensor* dvOut, const aclTensor* dqRopeOut, const aclTensor* dkRopeOut,
    const aclTensor* dpseOut, const aclTensor* dsinkOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionScoreGradV4GetWorkspaceSize",
                    {.layouts = Layouts::Any, .query = query, .queryRope = queryRopeOptional, .key = keyIn,
                     .keyRope = keyRopeOptional, .value = value, .dy = dy, .pseShift = pseShiftOptional,
                     .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional, .attenMask = attenMaskOptional,
                     .softmaxMax = softmaxMaxOptional, .softmaxSum = softmaxSumOptional,
                     .softmaxIn = softmaxInOptional, .attentionIn = attentionInOptional, .sinkIn = sinkInOptional,
                     .dScaleQ = dScaleQOptional, .dScaleK = dScaleKOptional, .dScaleV = dScaleVOptional,
                     .dScaleDy = dScaleDyOptional, .dScaleO = dScaleOOptional, .prefix = prefixOptional,
                     .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                     .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                     .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .softmaxInLayout = softmaxInLayout, .innerPrecise = innerPrecise,
                     .sparseMode = sparseMode, .pseType = pseType, .seed = seed, .offset = offset,
                     .outDtype = outDtype, .dq = dqOut, .dqRope = dqRopeOut, .dk = dkOut, .dkRope = dkRopeOut,
                     .dv = dvOut, .dpse = dpseOut, .dsink = dsinkOut, .workspaceSize = workspaceSize,
                     .executor = executor});
}

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV2GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionUnpaddingScoreGradV2GetWorkspaceSize",
                    {.layouts = Layouts::Tnd, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .prefix = prefixOptional,
                     .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                     .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                     .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .pseType = pseType, .dq = dqOut, .dk = dkOut, .dv = dvOut, .dpse = dpseOut,
                     .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV3GetWorkspaceSize(
    const aclTensor* query, const aclTensor* queryRope, const aclTensor* keyIn, const aclTensor* keyInRope,
    const aclTensor* value, const aclTensor* dy, const aclTensor* pseShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional, const aclTensor* softmaxInOptional,
    const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional,
    const aclIntArray* qStartIdxOptional, const aclIntArray* kvStartIdxOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, int64_t pseType, const aclTensor* dqOut, const aclTensor* dqRopeOut,
    const aclTensor* dkOut, const aclTensor* dkRopeOut, const aclTensor* dvOut, const aclTensor* dpseOut,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionUnpaddingScoreGradV3GetWorkspaceSize",
                    {.layouts = Layouts::Tnd, .query = query, .queryRope = queryRope, .key = keyIn,
                     .keyRope = keyInRope, .value = value, .dy = dy, .pseShift = pseShiftOptional,
                     .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional, .attenMask = attenMaskOptional,
                     .softmaxMax = softmaxMaxOptional, .softmaxSum = softmaxSumOptional,
                     .softmaxIn = softmaxInOptional, .attentionIn = attentionInOptional, .prefix = prefixOptional,
                     .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                     .qStartIdx = qStartIdxOptional, .kvStartIdx = kvStartIdxOptional, .scaleValue = scaleValue,
                     .keepProb = keepProb, .preTokens = preTokens, .nextTokens = nextTokens, .headNum = headNum,
                     .inputLayout = inputLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .pseType = pseType, .dq = dqOut, .dqRope = dqRopeOut, .dk = dkOut, .dkRope = dkRopeOut,
                     .dv = dvOut, .dpse = dpseOut, .workspaceSize = workspaceSize, .executor = executor});
}

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV4GetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    const aclIntArray* actualSeqQLenOptional, const aclIntArray* actualSeqKvLenOptional, double scaleValue,
    double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut,
    const aclTensor* dvOut, const aclTensor* dpseOut, char* softmaxInLayout, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
    return backward("aclnnFlashAttentionUnpaddingScoreGradV4GetWorkspaceSize",
                    {.layouts = Layouts::Tnd, .query = query, .key = keyIn, .value = value, .dy = dy,
                     .pseShift = pseShiftOptional, .dropMask = dropMaskOptional, .paddingMask = paddingMaskOptional,
                     .attenMask = attenMaskOptional, .softmaxMax = softmaxMaxOptional,
                     .softmaxSum = softmaxSumOptional, .softmaxIn = softmaxInOptional,
                     .attentionIn = attentionInOptional, .prefix = prefixOptional,
                     .actualSeqQLen = actualSeqQLenOptional, .actualSeqKvLen = actualSeqKvLenOptional,
                     .scaleValue = scaleValue, .keepProb = keepProb, .preTokens = preTokens,
                     .nextTokens = nextTokens, .headNum = headNum, .inputLayout = inputLayout,
                     .softmaxInLayout = softmaxInLayout, .innerPrecise = innerPrecise, .sparseMode = sparseMode,
                     .dq = dqOut, .dk = dkOut, .dv = dvOut, .dpse = dpseOut, .workspaceSize = workspaceSize,
                     .executor = executor});
}

#define ATTNOPS_V5_PARAMS                                                                                          \
    const aclTensor *query, const aclTensor *queryRope, const aclTensor *keyIn, const aclTensor *keyInRope,       \
        const aclTensor *value, const aclTensor *dy, const aclTensor *pseShiftOptional,                            \
        const aclTensor *dropMaskOptional, const aclTensor *paddingMaskOptional, const aclTensor *attenMaskOptional, \
        const aclTensor *softmaxMaxOptional, const aclTensor *softmaxSumOptional, const aclTensor *softmaxInOptional, \
        const aclTensor *attentionInOptional, const aclTensor *sinkInOptional, const aclIntArray *prefixOptional,  \
        const aclIntArray *actualSeqQLenOptional, const aclIntArray *actualSeqKvLenOptional,                       \
        const aclIntArray *qStartIdxOptional, const aclIntArray *kvStartIdxOptional, double scaleValue,            \
        double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char *inputLayout,                \
        int64_t innerPrecise, int64_t sparseMode, int64_t pseType, char *softmaxInLayout, const aclTensor *dqOut,  \
        const aclTensor *dqRopeOut, const aclTensor *dkOut, const aclTensor *dkRopeOut, const aclTensor *dvOut,    \
        const aclTensor *dpseOut, const aclTensor *dsinkOut, uint64_t *workspaceSize, aclOpExecutor **executor
#define ATTNOPS_V5_ARGS                                                                                            \
    query, queryRope, keyIn, keyInRope, value, dy, pseShiftOptional, dropMaskOptional, paddingMaskOptional,        \
        attenMaskOptional, softmaxMaxOptional, softmaxSumOptional, softmaxInOptional, attentionInOptional,         \
        sinkInOptional, prefixOptional, actualSeqQLenOptional, actualSeqKvLenOptional, qStartIdxOptional,          \
        kvStartIdxOptional, scaleValue, keepProb, preTokens, nextTokens, headNum, inputLayout, innerPrecise,       \
        sparseMode, pseType, softmaxInLayout, dqOut, dqRopeOut, dkOut, dkRopeOut, dvOut, dpseOut, dsinkOut,        \
        workspaceSize, executor

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV5GetWorkspaceSize(ATTNOPS_V5_PARAMS) {
    return unpaddingV5("aclnnFlashAttentionUnpaddingScoreGradV5GetWorkspaceSize", ATTNOPS_V5_ARGS);
}

aclnnStatus aclnnFlashAttentionUnpaddingScoreGradV5GetMaxWorkspaceSize(ATTNOPS_V5_PARAMS) {
    return unpaddingV5("aclnnFlashAttentionUnpaddingScoreGradV5GetMaxWorkspaceSize", ATTNOPS_V5_ARGS);
}

#undef ATTNOPS_V5_PARAMS
#undef ATTNOPS_V5_ARGS

ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreGrad, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionUnpaddingScoreGrad, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreGradV2, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreGradV3, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionScoreGradV4, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionUnpaddingScoreGradV2, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionUnpaddingScoreGradV3, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionUnpaddingScoreGradV4, attnopsFlashAttentionScoreGrad)
ATTNOPS_ACL_EXECUTE(aclnnFlashAttentionUnpaddingScoreGradV5, attnopsFlashAttentionScoreGrad)

}  // extern "C"
