// aclnnFlashAttentionScoreGrad V1-V4 and aclnnFlashAttentionUnpaddingScoreGrad V1-V5 called as
// upstream host programs call them (forward first, for the statistics and attentionIn), checked
// against the gradients of a dense attention in double precision.
#include <functional>

#include "aclnnop/aclnn_flash_attention_score.h"
#include "aclnnop/aclnn_flash_attention_score_grad.h"
#include "common.h"

namespace {

constexpr int64_t N1 = 4, N2 = 2, D = 32;
constexpr double kScale = 0.17;
constexpr int64_t kPre = 65536, kNext = 65536;

DeviceTensor Make(const std::vector<float>& host, const std::vector<int64_t>& shape) {
    return MakeTensor(host, shape, ACL_FLOAT);
}

bool Check(const char* name, const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv,
           const HeadResult& want) {
    const bool match = AllClose("dq", ReadAsDouble(dq), want.dq, 1e-4, 1e-3) &&
                       AllClose("dk", ReadAsDouble(dk), want.dk, 1e-4, 1e-3) &&
                       AllClose("dv", ReadAsDouble(dv), want.dv, 1e-4, 1e-3);
    LOG_PRINT("%s: dq, dk, dv %s\n", name, match ? "match the reference" : "MISMATCH");
    return match;
}

}  // namespace

int main() {
    int32_t deviceId = 0;
    aclrtStream stream;
    auto ret = Init(deviceId, &stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d\n", ret); return ret);
    bool ok = true;
    std::vector<float> maskHost(2048 * 2048);
    for (int64_t i = 0; i < 2048; ++i)
        for (int64_t j = 0; j < 2048; ++j) maskHost[i * 2048 + j] = j > i ? 1.0f : 0.0f;
    DeviceTensor mask = MakeTensor(std::vector<uint8_t>(maskHost.begin(), maskHost.end()), {2048, 2048}, ACL_BOOL);
    const int64_t innerPrecise = 0, pseType = 1;

    // 1. BSND, B = 2, S = 19, fp32, sparse mode 2 (causal): forward (V1), then every grad version.
    {
        constexpr int64_t B = 2, S = 19;
        char layout[] = "BSND";
        const int64_t mode = 2;
        const std::vector<float> qh = RandomValues(B * S * N1 * D, 11), kh = RandomValues(B * S * N2 * D, 12),
                                 vh = RandomValues(B * S * N2 * D, 13), dyh = RandomValues(B * S * N1 * D, 14);
        DeviceTensor q = Make(qh, {B, S, N1, D}), k = Make(kh, {B, S, N2, D}), v = Make(vh, {B, S, N2, D}),
                     dy = Make(dyh, {B, S, N1, D}), out = Make(std::vector<float>(qh.size()), {B, S, N1, D}),
                     smax = Make(std::vector<float>(B * N1 * S * 8), {B, N1, S, 8}),
                     ssum = Make(std::vector<float>(B * N1 * S * 8), {B, N1, S, 8});
        ret = RunTwoPhase("aclnnFlashAttentionScore", stream,
                  [&](uint64_t* ws, aclOpExecutor** ex) {
                      return aclnnFlashAttentionScoreGetWorkspaceSize(
                          q.tensor, k.tensor, v.tensor, nullptr, nullptr, nullptr, mask.tensor, nullptr, kScale, 1.0,
                          kPre, kNext, N1, layout, innerPrecise, mode, smax.tensor, ssum.tensor, nullptr, out.tensor,
                          ws, ex);
                  },
                  aclnnFlashAttentionScore);
        CHECK_RET(ret == 0, return ret);
        const HeadResult want =  // BSND: B sequences of S rows
            ReferencePacked(AsDouble(qh), AsDouble(kh), AsDouble(vh), AsDouble(dyh), {S, 2 * S}, N1, N2, D, kScale);
        DeviceTensor dq = Make(std::vector<float>(qh.size()), {B, S, N1, D}),
                     dk = Make(std::vector<float>(kh.size()), {B, S, N2, D}),
                     dv = Make(std::vector<float>(vh.size()), {B, S, N2, D}), dsink = Make(std::vector<float>(N1), {N1});
        char empty[] = "";
        const struct {
            const char* name;
            GetWorkspaceFn getWorkspace;
            ExecuteFn execute;
        } versions[] = {
            {"aclnnFlashAttentionScoreGrad",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionScoreGradGetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, kScale, 1.0, kPre, kNext, N1, layout, innerPrecise,
                     mode, dq.tensor, dk.tensor, dv.tensor, nullptr, ws, ex);
             },
             aclnnFlashAttentionScoreGrad},
            {"aclnnFlashAttentionScoreGradV2",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionScoreGradV2GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, layout,
                     innerPrecise, mode, pseType, dq.tensor, dk.tensor, dv.tensor, nullptr, ws, ex);
             },
             aclnnFlashAttentionScoreGradV2},
            {"aclnnFlashAttentionScoreGradV3",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionScoreGradV3GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, nullptr, nullptr, nullptr, kScale, 1.0, kPre, kNext,
                     N1, layout, innerPrecise, mode, pseType, dq.tensor, dk.tensor, dv.tensor, nullptr, dsink.tensor,
                     ws, ex);
             },
             aclnnFlashAttentionScoreGradV3},
            {"aclnnFlashAttentionScoreGradV4",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionScoreGradV4GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                     nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, layout, empty,
                     innerPrecise, mode, pseType, 0, 0, 0, dq.tensor, dk.tensor, dv.tensor, nullptr, nullptr, nullptr,
                     dsink.tensor, ws, ex);
             },
             aclnnFlashAttentionScoreGradV4},
        };
        for (const auto& version : versions) {
            ret = RunTwoPhase(version.name, stream, version.getWorkspace, version.execute);
            CHECK_RET(ret == 0, return ret);
            ok &= Check(version.name, dq, dk, dv, want);
        }
        // dy with the wrong shape: the upstream code and a message naming dy.
        DeviceTensor badDy = Make(std::vector<float>(B * S * N1 * 2 * D), {B, S, N1, 2 * D});
        uint64_t ws = 0;
        aclOpExecutor* ex = nullptr;
        ok &= ExpectError("dy [2,19,4,64]",
                          aclnnFlashAttentionScoreGradGetWorkspaceSize(
                              q.tensor, k.tensor, v.tensor, badDy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                              smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, kScale, 1.0, kPre, kNext, N1,
                              layout, innerPrecise, mode, dq.tensor, dk.tensor, dv.tensor, nullptr, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "dy");
        ok &= ExpectError("null dqOut",
                          aclnnFlashAttentionScoreGradGetWorkspaceSize(
                              q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                              smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, kScale, 1.0, kPre, kNext, N1,
                              layout, innerPrecise, mode, nullptr, dk.tensor, dv.tensor, nullptr, &ws, &ex),
                          ACLNN_ERR_PARAM_NULLPTR, "dq");
        ok &= ExpectError("fp8 scale to GradV4",
                          aclnnFlashAttentionScoreGradV4GetWorkspaceSize(
                              q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                              smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, nullptr, nullptr, dsink.tensor,
                              nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, kScale,
                              1.0, kPre, kNext, N1, layout, empty, innerPrecise, mode, pseType, 0, 0, 0, dq.tensor,
                              dk.tensor, dv.tensor, nullptr, nullptr, nullptr, nullptr, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "dScaleQ");
        for (DeviceTensor* t : {&q, &k, &v, &dy, &out, &smax, &ssum, &dq, &dk, &dv, &dsink, &badDy}) Release(*t);
    }

    // 2. TND, lengths 7, 0, 12 (cumulative 7, 7, 19), sparse mode 3: forward (VarLenScore), then
    //    every Unpadding version, the statistics passed in N,T order where the version allows it.
    {
        const std::vector<int64_t> ends = {7, 7, 19};
        const int64_t T = ends.back(), mode = 3;
        char layout[] = "TND";
        char empty[] = "";
        char sameAsInput[] = "same_as_input";
        const std::vector<float> qh = RandomValues(T * N1 * D, 21), kh = RandomValues(T * N2 * D, 22),
                                 vh = RandomValues(T * N2 * D, 23), dyh = RandomValues(T * N1 * D, 24);
        DeviceTensor q = Make(qh, {T, N1, D}), k = Make(kh, {T, N2, D}), v = Make(vh, {T, N2, D}),
                     dy = Make(dyh, {T, N1, D}), out = Make(std::vector<float>(qh.size()), {T, N1, D}),
                     smax = Make(std::vector<float>(T * N1 * 8), {T, N1, 8}),
                     ssum = Make(std::vector<float>(T * N1 * 8), {T, N1, 8}),
                     smaxNt = Make(std::vector<float>(T * N1 * 8), {T, N1, 8}),
                     ssumNt = Make(std::vector<float>(T * N1 * 8), {T, N1, 8});
        aclIntArray* seq = aclCreateIntArray(ends.data(), ends.size());
        ret = RunTwoPhase("aclnnFlashAttentionVarLenScore", stream,
                  [&](uint64_t* ws, aclOpExecutor** ex) {
                      return aclnnFlashAttentionVarLenScoreGetWorkspaceSize(
                          q.tensor, k.tensor, v.tensor, nullptr, nullptr, nullptr, mask.tensor, nullptr, seq, seq,
                          kScale, 1.0, kPre, kNext, N1, layout, innerPrecise, mode, smax.tensor, ssum.tensor, nullptr,
                          out.tensor, ws, ex);
                  },
                  aclnnFlashAttentionVarLenScore);
        CHECK_RET(ret == 0, return ret);
        ret = RunTwoPhase("aclnnFlashAttentionVarLenScoreV4", stream,
                  [&](uint64_t* ws, aclOpExecutor** ex) {
                      return aclnnFlashAttentionVarLenScoreV4GetWorkspaceSize(
                          q.tensor, k.tensor, v.tensor, nullptr, nullptr, nullptr, mask.tensor, nullptr, seq, seq,
                          kScale, 1.0, kPre, kNext, N1, layout, innerPrecise, mode, sameAsInput, smaxNt.tensor,
                          ssumNt.tensor, nullptr, out.tensor, ws, ex);
                  },
                  aclnnFlashAttentionVarLenScoreV4);
        CHECK_RET(ret == 0, return ret);
        const HeadResult want =
            ReferencePacked(AsDouble(qh), AsDouble(kh), AsDouble(vh), AsDouble(dyh), ends, N1, N2, D, kScale);
        DeviceTensor dq = Make(std::vector<float>(qh.size()), {T, N1, D}),
                     dk = Make(std::vector<float>(kh.size()), {T, N2, D}),
                     dv = Make(std::vector<float>(vh.size()), {T, N2, D}), dsink = Make(std::vector<float>(N1), {N1});
        const struct {
            const char* name;
            GetWorkspaceFn getWorkspace;
            ExecuteFn execute;
        } versions[] = {
            {"aclnnFlashAttentionUnpaddingScoreGrad",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, seq, seq, kScale, 1.0, kPre, kNext, N1, layout,
                     innerPrecise, mode, dq.tensor, dk.tensor, dv.tensor, nullptr, ws, ex);
             },
             aclnnFlashAttentionUnpaddingScoreGrad},
            {"aclnnFlashAttentionUnpaddingScoreGradV2",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionUnpaddingScoreGradV2GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smax.tensor,
                     ssum.tensor, nullptr, out.tensor, nullptr, seq, seq, nullptr, nullptr, kScale, 1.0, kPre, kNext,
                     N1, layout, innerPrecise, mode, pseType, dq.tensor, dk.tensor, dv.tensor, nullptr, ws, ex);
             },
             aclnnFlashAttentionUnpaddingScoreGradV2},
            {"aclnnFlashAttentionUnpaddingScoreGradV3",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionUnpaddingScoreGradV3GetWorkspaceSize(
                     q.tensor, nullptr, k.tensor, nullptr, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                     smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, seq, seq, nullptr, nullptr, kScale, 1.0,
                     kPre, kNext, N1, layout, innerPrecise, mode, pseType, dq.tensor, nullptr, dk.tensor, nullptr,
                     dv.tensor, nullptr, ws, ex);
             },
             aclnnFlashAttentionUnpaddingScoreGradV3},
            {"aclnnFlashAttentionUnpaddingScoreGradV4",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionUnpaddingScoreGradV4GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smaxNt.tensor,
                     ssumNt.tensor, nullptr, out.tensor, nullptr, seq, seq, kScale, 1.0, kPre, kNext, N1, layout,
                     innerPrecise, mode, dq.tensor, dk.tensor, dv.tensor, nullptr, sameAsInput, ws, ex);
             },
             aclnnFlashAttentionUnpaddingScoreGradV4},
            {"aclnnFlashAttentionUnpaddingScoreGradV5",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionUnpaddingScoreGradV5GetWorkspaceSize(
                     q.tensor, nullptr, k.tensor, nullptr, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                     smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, nullptr, seq, seq, nullptr, nullptr,
                     kScale, 1.0, kPre, kNext, N1, layout, innerPrecise, mode, pseType, empty, dq.tensor, nullptr,
                     dk.tensor, nullptr, dv.tensor, nullptr, dsink.tensor, ws, ex);
             },
             aclnnFlashAttentionUnpaddingScoreGradV5},
            {"aclnnFlashAttentionScoreGradV4",
             [&](uint64_t* ws, aclOpExecutor** ex) {
                 return aclnnFlashAttentionScoreGradV4GetWorkspaceSize(
                     q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor, smaxNt.tensor,
                     ssumNt.tensor, nullptr, out.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                     nullptr, nullptr, seq, seq, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, layout, sameAsInput,
                     innerPrecise, mode, pseType, 0, 0, 0, dq.tensor, dk.tensor, dv.tensor, nullptr, nullptr, nullptr,
                     dsink.tensor, ws, ex);
             },
             aclnnFlashAttentionScoreGradV4},
        };
        for (const auto& version : versions) {
            ret = RunTwoPhase(version.name, stream, version.getWorkspace, version.execute);
            CHECK_RET(ret == 0, return ret);
            ok &= Check(version.name, dq, dk, dv, want);
        }
        uint64_t ws = 0;
        aclOpExecutor* ex = nullptr;
        ok &= ExpectError("BSND to the Unpadding API",
                          aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
                              q.tensor, k.tensor, v.tensor, dy.tensor, nullptr, nullptr, nullptr, mask.tensor,
                              smax.tensor, ssum.tensor, nullptr, out.tensor, nullptr, seq, seq, kScale, 1.0, kPre,
                              kNext, N1, empty, innerPrecise, mode, dq.tensor, dk.tensor, dv.tensor, nullptr, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "inputLayout");
        aclDestroyIntArray(seq);
        for (DeviceTensor* t : {&q, &k, &v, &dy, &out, &smax, &ssum, &smaxNt, &ssumNt, &dq, &dk, &dv, &dsink})
            Release(*t);
    }

    Release(mask);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    LOG_PRINT("%s\n", ok ? "aclnnFlashAttentionScoreGrad family: ok" : "aclnnFlashAttentionScoreGrad family: FAILED");
    return ok ? 0 : 1;
}
