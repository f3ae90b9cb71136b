// aclnnBlockAttentionResiduals and aclnnBlockAttentionResidualsGrad called as the upstream
// example calls them. The forward is checked against the formula evaluated in double
// precision here; the grad against attnops' double-precision reference implementation
// (ATTNOPS_FORCE_IMPL=reference, chosen per call). blockRes is read in place from a
// source-major [N,T,H] block cache (a strided view).
#include <cstdlib>
#include <functional>

#include "aclnnop/aclnn_block_attention_residuals.h"
#include "aclnnop/aclnn_block_attention_residuals_grad.h"
#include "common.h"

namespace {

constexpr int64_t T = 6, N = 3, H = 64;
constexpr double kEps = 1e-6;

struct DeviceTensor {
    void* addr = nullptr;
    aclTensor* tensor = nullptr;
    int64_t count = 0;
};

DeviceTensor Make(const std::vector<float>& host, const std::vector<int64_t>& shape) {
    DeviceTensor t;
    t.count = GetShapeSize(shape);
    CreateAclTensor(host, shape, &t.addr, ACL_FLOAT, &t.tensor);
    return t;
}

std::vector<double> Read(const DeviceTensor& t) {
    const std::vector<float> host = CopyToHost<float>(t.addr, t.count);
    return {host.begin(), host.end()};
}

void Release(DeviceTensor& t) {
    aclDestroyTensor(t.tensor);
    aclrtFree(t.addr);
}

int Run(const char* name, aclrtStream stream, const std::function<aclnnStatus(uint64_t*, aclOpExecutor**)>& getWs,
        aclnnStatus (*execute)(void*, uint64_t, aclOpExecutor*, aclrtStream)) {
    uint64_t workspaceSize = 0;
    aclOpExecutor* executor = nullptr;
    auto ret = getWs(&workspaceSize, &executor);
    CHECK_RET(ret == ACL_SUCCESS,
              LOG_PRINT("%sGetWorkspaceSize failed. ERROR: %d %s\n", name, ret, aclGetRecentErrMsg()); return ret);
    void* workspaceAddr = nullptr;
    if (workspaceSize > 0) {
        ret = aclrtMalloc(&workspaceAddr, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
        CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("allocate workspace failed. ERROR: %d\n", ret); return ret);
    }
    ret = execute(workspaceAddr, workspaceSize, executor, stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("%s failed. ERROR: %d %s\n", name, ret, aclGetRecentErrMsg()); return ret);
    ret = aclrtSynchronizeStream(stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSynchronizeStream failed. ERROR: %d\n", ret); return ret);
    if (workspaceSize > 0) aclrtFree(workspaceAddr);
    return 0;
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
    ret = Run("aclnnBlockAttentionResiduals", stream,
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
    const bool forwardOk = AllClose("hiddenStates", Read(hidden), wantHidden, 1e-5, 1e-4) &&
                           AllClose("probs", Read(probs), wantProbs, 1e-6, 1e-4);
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
        ret = Run("aclnnBlockAttentionResidualsGrad", stream,
                  [&](uint64_t* ws, aclOpExecutor** ex) {
                      return aclnnBlockAttentionResidualsGradGetWorkspaceSize(
                          partialBlock.tensor, blockRes, projWeight.tensor, normWeight.tensor, grad.tensor,
                          invNorm.tensor, probs.tensor, 0, gradPartial.tensor, gradBlockRes.tensor, gradProj.tensor,
                          gradNorm.tensor, ws, ex);
                  },
                  aclnnBlockAttentionResidualsGrad);
        CHECK_RET(ret == 0, return ret);
        results[pass] = {Read(gradPartial), Read(gradBlockRes), Read(gradProj), Read(gradNorm)};
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

    aclDestroyTensor(blockRes);
    for (DeviceTensor* t : {&partialBlock, &projWeight, &normWeight, &hidden, &invNorm, &probs, &cache, &grad})
        Release(*t);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    LOG_PRINT("%s\n", ok ? "aclnnBlockAttentionResiduals family: ok" : "aclnnBlockAttentionResiduals family: FAILED");
    return ok ? 0 : 1;
}
