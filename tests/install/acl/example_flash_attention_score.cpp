// The README's example: an aclnnFlashAttentionScore host program in the upstream style, built
// unchanged against attnops::acl. BNSD fp16, causal (sparse mode 2 with the compressed
// 2048x2048 mask), checked against a dense attention computed in double precision.
#include <cmath>
#include <cstdio>
#include <vector>

#include "acl/acl.h"
#include "aclnn/opdev/fp16_t.h"
#include "aclnnop/aclnn_flash_attention_score.h"

#define CHECK_RET(cond, return_expr) \
    do {                             \
        if (!(cond)) {               \
            return_expr;             \
        }                            \
    } while (0)

#define LOG_PRINT(message, ...)         \
    do {                                \
        printf(message, ##__VA_ARGS__); \
    } while (0)

int64_t GetShapeSize(const std::vector<int64_t>& shape) {
    int64_t shapeSize = 1;
    for (auto i : shape) shapeSize *= i;
    return shapeSize;
}

template <typename T>
int CreateAclTensor(const std::vector<T>& hostData, const std::vector<int64_t>& shape, void** deviceAddr,
                    aclDataType dataType, aclTensor** tensor) {
    auto size = GetShapeSize(shape) * sizeof(T);
    auto ret = aclrtMalloc(deviceAddr, size, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMalloc failed. ERROR: %d\n", ret); return ret);
    ret = aclrtMemcpy(*deviceAddr, size, hostData.data(), size, ACL_MEMCPY_HOST_TO_DEVICE);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMemcpy failed. ERROR: %d\n", ret); return ret);
    std::vector<int64_t> strides(shape.size(), 1);
    for (int64_t i = int64_t(shape.size()) - 2; i >= 0; i--) strides[i] = shape[i + 1] * strides[i + 1];
    *tensor = aclCreateTensor(shape.data(), shape.size(), dataType, strides.data(), 0, aclFormat::ACL_FORMAT_ND,
                              shape.data(), shape.size(), *deviceAddr);
    return 0;
}

int main() {
    // 1. Device and stream.
    int32_t deviceId = 0;
    aclrtStream stream;
    CHECK_RET(aclInit(nullptr) == ACL_SUCCESS, return 1);
    CHECK_RET(aclrtSetDevice(deviceId) == ACL_SUCCESS, return 1);
    CHECK_RET(aclrtCreateStream(&stream) == ACL_SUCCESS, return 1);

    // 2. Inputs and outputs: q, k, v [B,N,S,D] fp16; causal via the compressed mask.
    const int64_t B = 1, N = 2, S = 128, D = 64;
    std::vector<int64_t> qShape = {B, N, S, D}, maskShape = {2048, 2048}, statShape = {B, N, S, 8};
    std::vector<op::fp16_t> qHost(GetShapeSize(qShape)), kHost(qHost.size()), vHost(qHost.size());
    for (size_t i = 0; i < qHost.size(); ++i) {
        qHost[i] = std::sin(0.1 * double(i));
        kHost[i] = std::cos(0.7 * double(i));
        vHost[i] = float(i % 17) / 17.0f;
    }
    std::vector<uint8_t> maskHost(2048 * 2048);
    for (int64_t i = 0; i < 2048; ++i)
        for (int64_t j = 0; j < 2048; ++j) maskHost[i * 2048 + j] = j > i;
    void *qAddr, *kAddr, *vAddr, *maskAddr, *maxAddr, *sumAddr, *outAddr;
    aclTensor *q, *k, *v, *mask, *softmaxMax, *softmaxSum, *out;
    CreateAclTensor(qHost, qShape, &qAddr, ACL_FLOAT16, &q);
    CreateAclTensor(kHost, qShape, &kAddr, ACL_FLOAT16, &k);
    CreateAclTensor(vHost, qShape, &vAddr, ACL_FLOAT16, &v);
    CreateAclTensor(maskHost, maskShape, &maskAddr, ACL_BOOL, &mask);
    CreateAclTensor(std::vector<float>(GetShapeSize(statShape)), statShape, &maxAddr, ACL_FLOAT, &softmaxMax);
    CreateAclTensor(std::vector<float>(GetShapeSize(statShape)), statShape, &sumAddr, ACL_FLOAT, &softmaxSum);
    CreateAclTensor(std::vector<op::fp16_t>(qHost.size()), qShape, &outAddr, ACL_FLOAT16, &out);

    // 3. The two phases, then wait for the stream.
    double scaleValue = 1.0 / std::sqrt(double(D));
    char layout[] = "BNSD";
    uint64_t workspaceSize = 0;
    aclOpExecutor* executor;
    auto ret = aclnnFlashAttentionScoreGetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, mask, nullptr, scaleValue,
                                                        1.0, 65536, 65536, N, layout, 0, 2, softmaxMax, softmaxSum,
                                                        nullptr, out, &workspaceSize, &executor);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("GetWorkspaceSize failed: %d %s\n", ret, aclGetRecentErrMsg()); return ret);
    void* workspaceAddr = nullptr;
    if (workspaceSize > 0) aclrtMalloc(&workspaceAddr, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
    ret = aclnnFlashAttentionScore(workspaceAddr, workspaceSize, executor, stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclnnFlashAttentionScore failed: %d\n", ret); return ret);
    CHECK_RET(aclrtSynchronizeStream(stream) == ACL_SUCCESS, return 1);

    // 4. Results back to the host, compared with a dense causal attention in double.
    std::vector<op::fp16_t> outHost(qHost.size());
    aclrtMemcpy(outHost.data(), outHost.size() * 2, outAddr, outHost.size() * 2, ACL_MEMCPY_DEVICE_TO_HOST);
    double maxError = 0;
    for (int64_t h = 0; h < B * N; ++h)
        for (int64_t i = 0; i < S; ++i) {
            std::vector<double> p(i + 1);
            double maxScore = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; ++j) {
                double s = 0;
                for (int64_t c = 0; c < D; ++c) s += float(qHost[(h * S + i) * D + c]) * float(kHost[(h * S + j) * D + c]);
                maxScore = std::max(maxScore, p[j] = s * scaleValue);
            }
            for (double& x : p) sum += (x = std::exp(x - maxScore));
            for (int64_t c = 0; c < D; ++c) {
                double o = 0;
                for (int64_t j = 0; j <= i; ++j) o += p[j] / sum * float(vHost[(h * S + j) * D + c]);
                maxError = std::max(maxError, std::fabs(o - float(outHost[(h * S + i) * D + c])));
            }
        }
    LOG_PRINT("out[0][0][127][0..3] = %.4f %.4f %.4f %.4f, max |error| vs double = %.2e\n",
              float(outHost[127 * D]), float(outHost[127 * D + 1]), float(outHost[127 * D + 2]),
              float(outHost[127 * D + 3]), maxError);

    // 5. Release.
    for (aclTensor* t : {q, k, v, mask, softmaxMax, softmaxSum, out}) aclDestroyTensor(t);
    for (void* p : {qAddr, kAddr, vAddr, maskAddr, maxAddr, sumAddr, outAddr}) aclrtFree(p);
    if (workspaceSize > 0) aclrtFree(workspaceAddr);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    return maxError < 2e-3 ? 0 : 1;
}
