// Helpers of the aclnn-style test programs, written the way the upstream operator examples
// ("调用示例") write theirs: CHECK_RET/LOG_PRINT, Init, CreateAclTensor over aclrtMalloc'ed
// memory; plus a dense attention in double precision to check results against.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/aclnn_base.h"
#include "aclnn/opdev/fp16_t.h"

// The upstream values programs (and files of saved tensors) rely on.
static_assert(ACL_FLOAT == 0 && ACL_FLOAT16 == 1 && ACL_INT8 == 2 && ACL_INT32 == 3 && ACL_UINT8 == 4 &&
                  ACL_INT64 == 9 && ACL_BOOL == 12 && ACL_BF16 == 27 && ACL_FORMAT_ND == 2 &&
                  ACL_MEMCPY_HOST_TO_DEVICE == 1 && ACL_MEMCPY_DEVICE_TO_HOST == 2 && ACL_MEM_MALLOC_HUGE_FIRST == 0,
              "aclnn enum values");
static_assert(ACLNN_ERR_PARAM_NULLPTR == 161001 && ACLNN_ERR_PARAM_INVALID == 161002 &&
                  ACLNN_ERR_RUNTIME_ERROR == 361001 && ACLNN_ERR_INNER == 561000,
              "aclnn return codes");

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

inline int64_t GetShapeSize(const std::vector<int64_t>& shape) {
    int64_t shapeSize = 1;
    for (auto i : shape) shapeSize *= i;
    return shapeSize;
}

inline int Init(int32_t deviceId, aclrtStream* stream) {
    auto ret = aclInit(nullptr);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclInit failed. ERROR: %d\n", ret); return ret);
    ret = aclrtSetDevice(deviceId);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSetDevice failed. ERROR: %d\n", ret); return ret);
    ret = aclrtCreateStream(stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtCreateStream failed. ERROR: %d\n", ret); return ret);
    return 0;
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
    CHECK_RET(*tensor != nullptr, LOG_PRINT("aclCreateTensor failed: %s\n", aclGetRecentErrMsg()); return 1);
    return 0;
}

template <typename T>
std::vector<T> CopyToHost(void* deviceAddr, int64_t count) {
    std::vector<T> host(count);
    auto ret = aclrtMemcpy(host.data(), count * sizeof(T), deviceAddr, count * sizeof(T), ACL_MEMCPY_DEVICE_TO_HOST);
    if (ret != ACL_SUCCESS) LOG_PRINT("aclrtMemcpy to host failed. ERROR: %d\n", ret);
    return host;
}

// Values (float, op::fp16_t) as doubles.
template <typename T>
std::vector<double> AsDouble(const std::vector<T>& values) {
    std::vector<double> out;
    for (T x : values) out.push_back(static_cast<float>(x));
    return out;
}

// A tensor over aclrtMalloc'ed memory, with its shape.
struct DeviceTensor {
    void* addr = nullptr;
    aclTensor* tensor = nullptr;
    std::vector<int64_t> shape;
};

template <typename T>
DeviceTensor MakeTensor(const std::vector<T>& host, const std::vector<int64_t>& shape, aclDataType type) {
    DeviceTensor t;
    t.shape = shape;
    CreateAclTensor(host, shape, &t.addr, type, &t.tensor);
    return t;
}

// The tensor's elements (stored as T) as doubles.
template <typename T = float>
std::vector<double> ReadAsDouble(const DeviceTensor& t) {
    return AsDouble(CopyToHost<T>(t.addr, GetShapeSize(t.shape)));
}

inline void Release(DeviceTensor& t) {
    aclDestroyTensor(t.tensor);
    aclrtFree(t.addr);
}

// Both phases of one operator call (workspace from aclrtMalloc), then a stream synchronize.
using GetWorkspaceFn = std::function<aclnnStatus(uint64_t*, aclOpExecutor**)>;
using ExecuteFn = aclnnStatus (*)(void*, uint64_t, aclOpExecutor*, aclrtStream);

inline int RunTwoPhase(const char* name, aclrtStream stream, const GetWorkspaceFn& getWorkspace, ExecuteFn execute) {
    uint64_t workspaceSize = 0;
    aclOpExecutor* executor = nullptr;
    auto ret = getWorkspace(&workspaceSize, &executor);
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

// Deterministic inputs in [-1, 1).
inline std::vector<float> RandomValues(int64_t count, uint32_t seed) {
    std::vector<float> values(count);
    uint32_t x = seed * 2654435761u + 1u;
    for (auto& v : values) {
        x = x * 1664525u + 1013904223u;
        v = float(x >> 8) / float(1u << 23) - 1.0f;
    }
    return values;
}

// One attention head in double precision: q [sq][d], k [skv][d], v [skv][dv], dout [sq][dv].
// causal: key j is visible to query i when j <= i + (skv - sq) (bottom-right, sparse mode 3;
// equal lengths make it mode 2 too).
struct HeadResult {
    std::vector<double> out, dq, dk, dv;
};

inline HeadResult ReferenceHead(const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<double>& dout, int64_t sq,
                                int64_t skv, int64_t d, int64_t dv, double scale, bool causal) {
    HeadResult r{std::vector<double>(sq * dv, 0.0), std::vector<double>(sq * d, 0.0),
                 std::vector<double>(skv * d, 0.0), std::vector<double>(skv * dv, 0.0)};
    std::vector<double> p(skv), dp(skv);
    for (int64_t i = 0; i < sq; ++i) {
        double maxScore = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
            p[j] = -INFINITY;
            if (causal && j > i + (skv - sq)) continue;
            double s = 0;
            for (int64_t c = 0; c < d; ++c) s += q[i * d + c] * k[j * d + c];
            p[j] = s * scale;
            maxScore = std::max(maxScore, p[j]);
        }
        if (maxScore == -INFINITY) continue;  // fully masked row: zeros
        double sum = 0;
        for (int64_t j = 0; j < skv; ++j) sum += (p[j] = std::exp(p[j] - maxScore));
        for (int64_t j = 0; j < skv; ++j) p[j] /= sum;
        for (int64_t j = 0; j < skv; ++j)
            for (int64_t c = 0; c < dv; ++c) r.out[i * dv + c] += p[j] * v[j * dv + c];
        if (dout.empty()) continue;
        double rowDot = 0;  // sum_c dout * out = sum_j p_j dp_j
        for (int64_t j = 0; j < skv; ++j) {
            dp[j] = 0;
            for (int64_t c = 0; c < dv; ++c) dp[j] += dout[i * dv + c] * v[j * dv + c];
            rowDot += p[j] * dp[j];
        }
        for (int64_t j = 0; j < skv; ++j) {
            const double ds = p[j] * (dp[j] - rowDot) * scale;
            for (int64_t c = 0; c < d; ++c) {
                r.dq[i * d + c] += ds * k[j * d + c];
                r.dk[j * d + c] += ds * q[i * d + c];
            }
            for (int64_t c = 0; c < dv; ++c) r.dv[j * dv + c] += p[j] * dout[i * dv + c];
        }
    }
    return r;
}

// Causal attention over packed sequences (cumulative row ends) in a token-major [rows, heads, d]
// layout (TND; BSND is the case of equal lengths), GQA: query head n reads kv head n / (n1 / n2).
// With dy (else empty): the gradients too, dk/dv summed over each kv head's group.
inline HeadResult ReferencePacked(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<double>& dy,
                                  const std::vector<int64_t>& ends, int64_t n1, int64_t n2, int64_t d, double scale) {
    HeadResult all{std::vector<double>(q.size(), 0.0), std::vector<double>(q.size(), 0.0),
                   std::vector<double>(k.size(), 0.0), std::vector<double>(v.size(), 0.0)};
    int64_t start = 0;
    for (int64_t end : ends) {
        const int64_t len = end - start;
        for (int64_t n = 0; n < n1; ++n) {
            const int64_t kvHead = n / (n1 / n2);
            std::vector<double> hq(len * d), hk(len * d), hv(len * d), hdy(dy.empty() ? 0 : len * d);
            for (int64_t t = 0; t < len; ++t)
                for (int64_t c = 0; c < d; ++c) {
                    hq[t * d + c] = q[((start + t) * n1 + n) * d + c];
                    hk[t * d + c] = k[((start + t) * n2 + kvHead) * d + c];
                    hv[t * d + c] = v[((start + t) * n2 + kvHead) * d + c];
                    if (!dy.empty()) hdy[t * d + c] = dy[((start + t) * n1 + n) * d + c];
                }
            const HeadResult r = ReferenceHead(hq, hk, hv, hdy, len, len, d, d, scale, true);
            for (int64_t t = 0; t < len; ++t)
                for (int64_t c = 0; c < d; ++c) {
                    all.out[((start + t) * n1 + n) * d + c] = r.out[t * d + c];
                    all.dq[((start + t) * n1 + n) * d + c] = r.dq[t * d + c];
                    all.dk[((start + t) * n2 + kvHead) * d + c] += r.dk[t * d + c];
                    all.dv[((start + t) * n2 + kvHead) * d + c] += r.dv[t * d + c];
                }
        }
        start = end;
    }
    return all;
}

// |got - want| <= atol + rtol * |want| for every element; prints the first failure.
inline bool AllClose(const char* what, const std::vector<double>& got, const std::vector<double>& want, double atol,
                     double rtol) {
    if (got.size() != want.size()) {
        LOG_PRINT("%s: %zu values, expected %zu\n", what, got.size(), want.size());
        return false;
    }
    for (size_t i = 0; i < got.size(); ++i) {
        if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]))) {
            LOG_PRINT("%s[%zu] = %.6f, reference %.6f\n", what, i, got[i], want[i]);
            return false;
        }
    }
    return true;
}

// An expected failure: the return code, and a message naming `needle`.
inline bool ExpectError(const char* what, int ret, int code, const char* needle) {
    const char* msg = aclGetRecentErrMsg();
    if (ret != code || msg == nullptr || std::strstr(msg, needle) == nullptr) {
        LOG_PRINT("%s: returned %d (expected %d), message \"%s\" (expected to name %s)\n", what, ret, code,
                  msg ? msg : "(null)", needle);
        return false;
    }
    LOG_PRINT("%s: %d, \"%s\"\n", what, ret, msg);
    return true;
}
