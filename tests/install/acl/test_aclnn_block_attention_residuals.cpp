// aclnnBlockAttentionResiduals and aclnnBlockAttentionResidualsGrad called as the upstream
// example calls them (unique_ptr deleters included), plus the rest of the host-side surface
// such programs use (contexts, tensor lists, memset, fp16_t, securec). The forward is checked against the formula evaluated in double
// precision here; the grad against attnops' double-precision reference implementation
// (ATTNOPS_FORCE_IMPL=reference, chosen per call). blockRes is read in place from a
// source-major [N,T,H] block cache (a strided view).
#include <cstdlib>
#include <memory>

#include "aclnnop/aclnn_block_attention_residuals.h"
#include "aclnnop/aclnn_block_attention_residuals_grad.h"
#include "common.h"
#include "securec.h"

namespace {

constexpr int64_t T = 6, N = 3, H = 64;
constexpr double kEps = 1e-6;

DeviceTensor Make(const std::vector<float>& host, const std::vector<int64_t>& shape) {
    return MakeTensor(host, shape, ACL_FLOAT);
}

}  // namespace

int main() {
    int32_t deviceId = 0;
    aclrtStream stream = nullptr;
    auto ret = Init(deviceId, &stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d\n", ret); return ret);
    bool ok = true;

    const std::vector<float> partialHost = RandomValues(T * H, 31), cacheHost = RandomValues(N * T * H, 32),
                             projHost = RandomValues(H, 33), normHost = RandomValues(H, 34),
                             gradHost = RandomValues(T * H, 35);
    DeviceTensor partialBlock = Make(partialHost, {T, H}), projWeight = Make(projHost, {1, H}),
                 normWeight = Make(normHost, {H}), hidden = Make(std::vector<float>(T * H), {T, H}),
                 invNorm = Make(std::vector<float>(T * (N + 1)), {T, N + 1}),
                 probs = Make(std::vector<float>(T * (N + 1)), {T, N + 1}), cache = Make(cacheHost, {N, T, H});
    // blockRes [T,N,H] read in place from the [N,T,H] cache.
    const std::vector<int64_t> viewShape = {T, N, H}, viewStride = {H, T * H, 1}, storage = {N, T, H};
    aclTensor* blockRes = aclCreateTensor(viewShape.data(), 3, ACL_FLOAT, viewStride.data(), 0, ACL_FORMAT_ND,
                                          storage.data(), 3, cache.addr);
    CHECK_RET(blockRes != nullptr, LOG_PRINT("aclCreateTensor failed: %s\n", aclGetRecentErrMsg()); return 1);

    // 1. Forward with needBackward: hiddenStates, invNorm, probs.
    ret = RunTwoPhase("aclnnBlockAttentionResiduals", stream,
              [&](uint64_t* ws, aclOpExecutor** ex) {
                  return aclnnBlockAttentionResidualsGetWorkspaceSize(partialBlock.tensor, blockRes, projWeight.tensor,
                                                                      normWeight.tensor, -1, kEps, true, hidden.tensor,
                                                                      invNorm.tensor, probs.tensor, ws, ex);
              },
              aclnnBlockAttentionResiduals);
    CHECK_RET(ret == 0, return ret);
    std::vector<double> wantHidden(T * H), wantProbs(T * (N + 1));
    for (int64_t t = 0; t < T; ++t) {
        std::vector<double> score(N + 1);
        auto source = [&](int64_t i, int64_t h) -> double {
            return i < N ? cacheHost[(i * T + t) * H + h] : partialHost[t * H + h];
        };
        double maxScore = -INFINITY;
        for (int64_t i = 0; i <= N; ++i) {
            double squares = 0, dot = 0;
            for (int64_t h = 0; h < H; ++h) {
                squares += source(i, h) * source(i, h);
                dot += source(i, h) * double(float(normHost[h] * projHost[h]));
            }
            score[i] = dot / std::sqrt(squares / H + kEps);
            maxScore = std::max(maxScore, score[i]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - maxScore));
        for (int64_t i = 0; i <= N; ++i) {
            wantProbs[t * (N + 1) + i] = score[i] / sum;
            for (int64_t h = 0; h < H; ++h) wantHidden[t * H + h] += score[i] / sum * source(i, h);
        }
    }
    const bool forwardOk = AllClose("hiddenStates", ReadAsDouble(hidden), wantHidden, 1e-5, 1e-4) &&
                           AllClose("probs", ReadAsDouble(probs), wantProbs, 1e-6, 1e-4);
    LOG_PRINT("aclnnBlockAttentionResiduals (fp32, blockRes a strided view): %s\n",
              forwardOk ? "matches the reference" : "MISMATCH");
    ok &= forwardOk;

    // 2. Grad, by the default implementation and by the reference one.
    DeviceTensor grad = Make(gradHost, {T, H});
    std::vector<std::vector<double>> results[2];
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) setenv("ATTNOPS_FORCE_IMPL", "reference", 1);
        DeviceTensor gradPartial = Make(std::vector<float>(T * H), {T, H}),
                     gradBlockRes = Make(std::vector<float>(T * N * H), {T, N, H}),
                     gradProj = Make(std::vector<float>(H), {1, H}), gradNorm = Make(std::vector<float>(H), {H});
        ret = RunTwoPhase("aclnnBlockAttentionResidualsGrad", stream,
                  [&](uint64_t* ws, aclOpExecutor** ex) {
                      return aclnnBlockAttentionResidualsGradGetWorkspaceSize(
                          partialBlock.tensor, blockRes, projWeight.tensor, normWeight.tensor, grad.tensor,
                          invNorm.tensor, probs.tensor, 0, gradPartial.tensor, gradBlockRes.tensor, gradProj.tensor,
                          gradNorm.tensor, ws, ex);
                  },
                  aclnnBlockAttentionResidualsGrad);
        CHECK_RET(ret == 0, return ret);
        results[pass] = {ReadAsDouble(gradPartial), ReadAsDouble(gradBlockRes), ReadAsDouble(gradProj), ReadAsDouble(gradNorm)};
        for (DeviceTensor* t : {&gradPartial, &gradBlockRes, &gradProj, &gradNorm}) Release(*t);
    }
    unsetenv("ATTNOPS_FORCE_IMPL");
    const char* names[] = {"gradPartialBlock", "gradBlockRes", "gradProjWeight", "gradNormWeight"};
    bool gradOk = true;
    for (int i = 0; i < 4; ++i) gradOk &= AllClose(names[i], results[0][i], results[1][i], 1e-5, 1e-4);
    LOG_PRINT("aclnnBlockAttentionResidualsGrad: %s\n", gradOk ? "matches the reference" : "MISMATCH");
    ok &= gradOk;

    // 3. Invalid arguments.
    uint64_t ws = 0;
    aclOpExecutor* ex = nullptr;
    ok &= ExpectError("validBlockNum 2",
                      aclnnBlockAttentionResidualsGetWorkspaceSize(partialBlock.tensor, blockRes, projWeight.tensor,
                                                                   normWeight.tensor, 2, kEps, false, hidden.tensor,
                                                                   nullptr, nullptr, &ws, &ex),
                      ACLNN_ERR_PARAM_INVALID, "validBlockNum");
    ok &= ExpectError("normEps 0",
                      aclnnBlockAttentionResidualsGetWorkspaceSize(partialBlock.tensor, blockRes, projWeight.tensor,
                                                                   normWeight.tensor, -1, 0.0, false, hidden.tensor,
                                                                   nullptr, nullptr, &ws, &ex),
                      ACLNN_ERR_PARAM_INVALID, "normEps");
    ok &= ExpectError("needBackward without probs",
                      aclnnBlockAttentionResidualsGetWorkspaceSize(partialBlock.tensor, blockRes, projWeight.tensor,
                                                                   normWeight.tensor, -1, kEps, true, hidden.tensor,
                                                                   invNorm.tensor, nullptr, &ws, &ex),
                      ACLNN_ERR_PARAM_NULLPTR, "probs");

    // 4. The rest of the surface: contexts, tensor lists, memset, fp16_t, aclFloat16ToFloat, securec.
    aclrtContext context = nullptr;
    ok &= aclrtCreateContext(&context, deviceId) == ACL_SUCCESS && aclrtSetCurrentContext(context) == ACL_SUCCESS &&
          aclrtDestroyContext(context) == ACL_SUCCESS;
    const aclTensor* members[] = {aclCreateTensor(viewShape.data(), 3, ACL_FLOAT, viewStride.data(), 0, ACL_FORMAT_ND,
                                                  storage.data(), 3, cache.addr)};
    aclTensorList* list = aclCreateTensorList(members, 1);
    uint64_t listSize = 0;
    ok &= list != nullptr && aclGetTensorListSize(list, &listSize) == ACLNN_SUCCESS && listSize == 1 &&
          aclDestroyTensorList(list) == ACLNN_SUCCESS;  // destroys its tensors too
    ok &= aclrtMemset(hidden.addr, T * H * sizeof(float), 0, T * H * sizeof(float)) == ACL_SUCCESS &&
          ReadAsDouble(hidden) == std::vector<double>(T * H, 0.0);
    const op::fp16_t one(1), tenth(0.1), big(70000.0f), tiny(1e-8);
    ok &= one.val == 0x3C00 && float(tenth) == 0.0999755859375f && big.val == 0x7C00 && tiny.val == 0 &&
          op::fp16_t(-2.5f).val == 0xC100 && aclFloat16ToFloat(0x3C00) == 1.0f &&
          aclFloatToFloat16(65504.0f) == 0x7BFF && float(op::fp16_t(5.96046448e-8f)) == 5.96046448e-8f &&
          aclDataTypeSize(ACL_BF16) == 2 && aclDataTypeSize(ACL_FLOAT) == 4 && aclDataTypeSize(ACL_BOOL) == 1;
    float copied[4] = {0, 0, 0, 0};
    const float source[4] = {1, 2, 3, 4};
    ok &= memcpy_s(copied, sizeof copied, source, sizeof source) == EOK && copied[3] == 4.0f &&
          memcpy_s(copied, 2 * sizeof(float), source, sizeof source) != EOK && copied[0] == 0.0f;
    LOG_PRINT("contexts, tensor lists, aclrtMemset, fp16_t, aclFloat16ToFloat, memcpy_s: %s\n", ok ? "ok" : "FAILED");

    // 5. Release, with the deleters upstream examples use.
    std::unique_ptr<aclTensor, aclnnStatus (*)(const aclTensor*)> blockResPtr(blockRes, aclDestroyTensor);
    std::unique_ptr<void, aclError (*)(void*)> spareAddrPtr(nullptr, aclrtFree);
    for (DeviceTensor* t : {&partialBlock, &projWeight, &normWeight, &hidden, &invNorm, &probs, &cache, &grad})
        Release(*t);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    LOG_PRINT("%s\n", ok ? "aclnnBlockAttentionResiduals family: ok" : "aclnnBlockAttentionResiduals family: FAILED");
    return ok ? 0 : 1;
}
