// aclnnFlashAttentionScore V1-V4 and aclnnFlashAttentionVarLenScore V1-V5 called as upstream
// host programs call them, checked against a dense attention in double precision; then
// invalid arguments and their upstream return codes and messages.

#include "aclnnop/aclnn_flash_attention_score.h"
#include "common.h"

namespace {

constexpr int64_t B = 2, N1 = 4, N2 = 2, S = 37, D = 64;
constexpr int64_t H = N1 + 2 * N2;  // heads of one packed QKV row
constexpr double kScale = 0.125;
constexpr int64_t kPre = 65536, kNext = 65536;

using GetWorkspace = std::function<aclnnStatus(const aclTensor* out, const aclTensor* smax, const aclTensor* ssum,
                                               uint64_t*, aclOpExecutor**)>;

// Runs one two-phase call into fresh fp16 output and fp32 statistics tensors; returns the output
// and the statistics.
struct Outputs {
    std::vector<double> out, softmaxMax;
};

int Run(const char* name, aclrtStream stream, const std::vector<int64_t>& outShape,
        const std::vector<int64_t>& statShape, const GetWorkspace& getWorkspace, ExecuteFn execute, Outputs* result) {
    DeviceTensor out = MakeTensor(std::vector<op::fp16_t>(GetShapeSize(outShape)), outShape, ACL_FLOAT16),
                 smax = MakeTensor(std::vector<float>(GetShapeSize(statShape)), statShape, ACL_FLOAT),
                 ssum = MakeTensor(std::vector<float>(GetShapeSize(statShape)), statShape, ACL_FLOAT);
    const int ret = RunTwoPhase(
        name, stream,
        [&](uint64_t* ws, aclOpExecutor** ex) { return getWorkspace(out.tensor, smax.tensor, ssum.tensor, ws, ex); },
        execute);
    result->out = ReadAsDouble<op::fp16_t>(out);
    result->softmaxMax = ReadAsDouble(smax);
    for (DeviceTensor* t : {&out, &smax, &ssum}) Release(*t);
    return ret;
}

// Reference of the packed BSND problem: qkv [B,S,H,D] holds q heads, then k heads, then v heads.
std::vector<double> ReferenceBsnd(const std::vector<op::fp16_t>& qkv) {
    std::vector<double> q, k, v;
    for (int64_t row = 0; row < B * S; ++row)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t c = 0; c < D; ++c)
                (h < N1 ? q : h < N1 + N2 ? k : v).push_back(float(qkv[(row * H + h) * D + c]));
    std::vector<int64_t> ends;  // every batch is a sequence of S rows
    for (int64_t b = 1; b <= B; ++b) ends.push_back(b * S);
    return ReferencePacked(q, k, v, {}, ends, N1, N2, D, kScale).out;
}

std::vector<op::fp16_t> HalfValues(int64_t count, uint32_t seed) {
    std::vector<op::fp16_t> values;
    for (float x : RandomValues(count, seed)) values.emplace_back(x);
    return values;
}

}  // namespace

int main() {
    // 1. (fixed) device/stream initialisation
    int32_t deviceId = 0;
    aclrtStream stream;
    auto ret = Init(deviceId, &stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d\n", ret); return ret);
    bool ok = true;

    // 2. BSND inputs read in place from one packed [B,S,H,D] QKV buffer: views with strides and
    //    offsets over one storage; the compressed 2048x2048 causal mask for sparse mode 2.
    const std::vector<int64_t> packedShape = {B, S, H, D};
    const std::vector<op::fp16_t> qkvHost = HalfValues(GetShapeSize(packedShape), 1);
    void* qkvAddr = nullptr;
    ret = aclrtMalloc(&qkvAddr, qkvHost.size() * sizeof(op::fp16_t), ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, return ret);
    ret = aclrtMemcpy(qkvAddr, qkvHost.size() * sizeof(op::fp16_t), qkvHost.data(),
                      qkvHost.size() * sizeof(op::fp16_t), ACL_MEMCPY_HOST_TO_DEVICE);
    CHECK_RET(ret == ACL_SUCCESS, return ret);
    const std::vector<int64_t> qShape = {B, S, N1, D}, kvShape = {B, S, N2, D}, stride = {S * H * D, H * D, D, 1};
    aclTensor* q = aclCreateTensor(qShape.data(), 4, ACL_FLOAT16, stride.data(), 0, ACL_FORMAT_ND,
                                   packedShape.data(), 4, qkvAddr);
    aclTensor* k = aclCreateTensor(kvShape.data(), 4, ACL_FLOAT16, stride.data(), N1 * D, ACL_FORMAT_ND,
                                   packedShape.data(), 4, qkvAddr);
    aclTensor* v = aclCreateTensor(kvShape.data(), 4, ACL_FLOAT16, stride.data(), (N1 + N2) * D, ACL_FORMAT_ND,
                                   packedShape.data(), 4, qkvAddr);
    CHECK_RET(q && k && v, LOG_PRINT("aclCreateTensor failed: %s\n", aclGetRecentErrMsg()); return 1);
    std::vector<uint8_t> maskHost(2048 * 2048);
    for (int64_t i = 0; i < 2048; ++i)
        for (int64_t j = 0; j < 2048; ++j) maskHost[i * 2048 + j] = j > i ? 1 : 0;
    void* maskAddr = nullptr;
    aclTensor* attenMask = nullptr;
    ret = CreateAclTensor(maskHost, {2048, 2048}, &maskAddr, ACL_BOOL, &attenMask);
    CHECK_RET(ret == 0, return ret);
    const std::vector<int64_t> outShape = qShape, statShape = {B, N1, S, 8};
    char layout[] = "BSND";
    char empty[] = "";
    const int64_t sparseMode = 2, innerPrecise = 0, pseType = 1;
    const std::vector<double> wantBsnd = ReferenceBsnd(qkvHost);

    struct Version {
        const char* name;
        GetWorkspace getWorkspace;
        ExecuteFn execute;
    };
    const std::vector<Version> fixedVersions = {
        {"aclnnFlashAttentionScore",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionScoreGetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask, nullptr,
                                                             kScale, 1.0, kPre, kNext, N1, layout, innerPrecise,
                                                             sparseMode, mx, sm, nullptr, out, ws, ex);
         },
         aclnnFlashAttentionScore},
        {"aclnnFlashAttentionScoreV2",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionScoreV2GetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask, nullptr,
                                                               nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, layout,
                                                               innerPrecise, sparseMode, pseType, mx, sm, nullptr, out,
                                                               ws, ex);
         },
         aclnnFlashAttentionScoreV2},
        {"aclnnFlashAttentionScoreV3",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionScoreV3GetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask, nullptr,
                                                               nullptr, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1,
                                                               layout, innerPrecise, sparseMode, pseType, mx, sm,
                                                               nullptr, out, ws, ex);
         },
         aclnnFlashAttentionScoreV3},
        {"aclnnFlashAttentionScoreV4",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionScoreV4GetWorkspaceSize(
                 q, k, v, nullptr, nullptr, nullptr, attenMask, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                 nullptr, nullptr, nullptr, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, layout, innerPrecise,
                 sparseMode, 0, pseType, empty, 0, 0, mx, sm, nullptr, out, ws, ex);
         },
         aclnnFlashAttentionScoreV4},
    };
    for (const Version& version : fixedVersions) {
        Outputs got;
        ret = Run(version.name, stream, outShape, statShape, version.getWorkspace, version.execute, &got);
        CHECK_RET(ret == 0, return ret);
        const bool match = AllClose(version.name, got.out, wantBsnd, 2e-3, 5e-3);
        LOG_PRINT("%s (BSND views of packed QKV, GQA %ld/%ld, fp16, causal): %s\n", version.name, N1, N2,
                  match ? "matches the reference" : "MISMATCH");
        ok &= match;
    }

    // 3. TND: packed sequences of lengths 5, 0, 23, 9 (cumulative 5, 5, 28, 37), sparse mode 3.
    const std::vector<int64_t> ends = {5, 5, 28, 37};
    const int64_t T = ends.back();
    const std::vector<int64_t> tq = {T, N1, D}, tkv = {T, N2, D}, tstat = {T, N1, 8};
    const std::vector<op::fp16_t> qHost = HalfValues(T * N1 * D, 2), kHost = HalfValues(T * N2 * D, 3),
                                  vHost = HalfValues(T * N2 * D, 4);
    void *tqAddr = nullptr, *tkAddr = nullptr, *tvAddr = nullptr;
    aclTensor *tqT = nullptr, *tkT = nullptr, *tvT = nullptr;
    CHECK_RET(CreateAclTensor(qHost, tq, &tqAddr, ACL_FLOAT16, &tqT) == 0, return 1);
    CHECK_RET(CreateAclTensor(kHost, tkv, &tkAddr, ACL_FLOAT16, &tkT) == 0, return 1);
    CHECK_RET(CreateAclTensor(vHost, tkv, &tvAddr, ACL_FLOAT16, &tvT) == 0, return 1);
    aclIntArray* seqQ = aclCreateIntArray(ends.data(), ends.size());
    aclIntArray* seqKv = aclCreateIntArray(ends.data(), ends.size());
    char tnd[] = "TND";
    char sameAsInput[] = "same_as_input";
    const int64_t tndMode = 3;
    const std::vector<double> wantTnd =
        ReferencePacked(AsDouble(qHost), AsDouble(kHost), AsDouble(vHost), {}, ends, N1, N2, D, kScale).out;
    const std::vector<Version> tndVersions = {
        {"aclnnFlashAttentionVarLenScore",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionVarLenScoreGetWorkspaceSize(tqT, tkT, tvT, nullptr, nullptr, nullptr, attenMask,
                                                                   nullptr, seqQ, seqKv, kScale, 1.0, kPre, kNext, N1,
                                                                   tnd, innerPrecise, tndMode, mx, sm, nullptr, out,
                                                                   ws, ex);
         },
         aclnnFlashAttentionVarLenScore},
        {"aclnnFlashAttentionVarLenScoreV2",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionVarLenScoreV2GetWorkspaceSize(
                 tqT, tkT, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, seqQ, seqKv, nullptr, nullptr, kScale,
                 1.0, kPre, kNext, N1, tnd, innerPrecise, tndMode, pseType, mx, sm, nullptr, out, ws, ex);
         },
         aclnnFlashAttentionVarLenScoreV2},
        {"aclnnFlashAttentionVarLenScoreV3",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionVarLenScoreV3GetWorkspaceSize(
                 tqT, nullptr, tkT, nullptr, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, seqQ, seqKv, nullptr,
                 nullptr, kScale, 1.0, kPre, kNext, N1, tnd, innerPrecise, tndMode, pseType, mx, sm, nullptr, out, ws,
                 ex);
         },
         aclnnFlashAttentionVarLenScoreV3},
        {"aclnnFlashAttentionVarLenScoreV4",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionVarLenScoreV4GetWorkspaceSize(tqT, tkT, tvT, nullptr, nullptr, nullptr,
                                                                     attenMask, nullptr, seqQ, seqKv, kScale, 1.0,
                                                                     kPre, kNext, N1, tnd, innerPrecise, tndMode,
                                                                     sameAsInput, mx, sm, nullptr, out, ws, ex);
         },
         aclnnFlashAttentionVarLenScoreV4},
        {"aclnnFlashAttentionVarLenScoreV5",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionVarLenScoreV5GetWorkspaceSize(
                 tqT, nullptr, tkT, nullptr, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, nullptr, seqQ, seqKv,
                 nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, tnd, innerPrecise, tndMode, pseType, empty, mx, sm,
                 nullptr, out, ws, ex);
         },
         aclnnFlashAttentionVarLenScoreV5},
        {"aclnnFlashAttentionScoreV4",
         [&](const aclTensor* out, const aclTensor* mx, const aclTensor* sm, uint64_t* ws, aclOpExecutor** ex) {
             return aclnnFlashAttentionScoreV4GetWorkspaceSize(
                 tqT, tkT, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, nullptr, nullptr, nullptr, nullptr,
                 nullptr, nullptr, seqQ, seqKv, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, tnd, innerPrecise,
                 tndMode, 0, pseType, empty, 0, 0, mx, sm, nullptr, out, ws, ex);
         },
         aclnnFlashAttentionScoreV4},
    };
    std::vector<double> declaredMax, headMajorMax;
    for (const Version& version : tndVersions) {
        Outputs got;
        ret = Run(version.name, stream, tq, tstat, version.getWorkspace, version.execute, &got);
        CHECK_RET(ret == 0, return ret);
        const bool match = AllClose(version.name, got.out, wantTnd, 2e-3, 5e-3);
        LOG_PRINT("%s (TND, lengths 5,0,23,9, fp16, causal): %s\n", version.name,
                  match ? "matches the reference" : "MISMATCH");
        ok &= match;
        (version.execute == aclnnFlashAttentionVarLenScoreV4 ? headMajorMax : declaredMax) = got.softmaxMax;
    }
    // softmaxOutLayout "same_as_input" stores the [T,N,8] statistics in N,T order.
    bool transposed = true;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N1; ++n)
            for (int64_t l = 0; l < 8; ++l)
                transposed &= headMajorMax[(n * T + t) * 8 + l] == declaredMax[(t * N1 + n) * 8 + l];
    LOG_PRINT("softmaxOutLayout \"same_as_input\": statistics in N,T order: %s\n", transposed ? "yes" : "NO");
    ok &= transposed;

    // 4. Invalid arguments: upstream codes, messages naming the argument.
    {
        void* outAddr = nullptr;
        aclTensor* out = nullptr;
        CHECK_RET(CreateAclTensor(std::vector<op::fp16_t>(GetShapeSize(outShape)), outShape, &outAddr, ACL_FLOAT16,
                                  &out) == 0,
                  return 1);
        uint64_t ws = 0;
        aclOpExecutor* ex = nullptr;
        ok &= ExpectError("null query",
                          aclnnFlashAttentionScoreGetWorkspaceSize(nullptr, k, v, nullptr, nullptr, nullptr, attenMask,
                                                                   nullptr, kScale, 1.0, kPre, kNext, N1, layout, 0,
                                                                   sparseMode, nullptr, nullptr, nullptr, out, &ws, &ex),
                          ACLNN_ERR_PARAM_NULLPTR, "query");
        ok &= ExpectError("keepProb 1.5",
                          aclnnFlashAttentionScoreGetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask,
                                                                   nullptr, kScale, 1.5, kPre, kNext, N1, layout, 0,
                                                                   sparseMode, nullptr, nullptr, nullptr, out, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "keepProb");
        ok &= ExpectError("TND to V1",
                          aclnnFlashAttentionScoreGetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask,
                                                                   nullptr, kScale, 1.0, kPre, kNext, N1, tnd, 0,
                                                                   sparseMode, nullptr, nullptr, nullptr, out, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "inputLayout");
        ok &= ExpectError("queryRope to VarLenScoreV5",
                          aclnnFlashAttentionVarLenScoreV5GetWorkspaceSize(
                              tqT, tqT, tkT, nullptr, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, nullptr, seqQ,
                              seqKv, nullptr, nullptr, kScale, 1.0, kPre, kNext, N1, tnd, 0, tndMode, pseType, empty,
                              nullptr, nullptr, nullptr, out, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "queryRope");
        aclTensor* complexQuery = aclCreateTensor(qShape.data(), 4, ACL_COMPLEX64, nullptr, 0, ACL_FORMAT_ND,
                                                  qShape.data(), 4, qkvAddr);
        ok &= ExpectError("ACL_COMPLEX64 query",
                          aclnnFlashAttentionScoreGetWorkspaceSize(complexQuery, k, v, nullptr, nullptr, nullptr,
                                                                   attenMask, nullptr, kScale, 1.0, kPre, kNext, N1,
                                                                   layout, 0, sparseMode, nullptr, nullptr, nullptr,
                                                                   out, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "query");
        aclDestroyTensor(complexQuery);
        char bogus[] = "NT";
        ok &= ExpectError("softmaxOutLayout \"NT\"",
                          aclnnFlashAttentionVarLenScoreV4GetWorkspaceSize(
                              tqT, tkT, tvT, nullptr, nullptr, nullptr, attenMask, nullptr, seqQ, seqKv, kScale, 1.0,
                              kPre, kNext, N1, tnd, 0, tndMode, bogus, nullptr, nullptr, nullptr, out, &ws, &ex),
                          ACLNN_ERR_PARAM_INVALID, "softmaxOutLayout");
        // An executor runs once.
        ret = aclnnFlashAttentionScoreGetWorkspaceSize(q, k, v, nullptr, nullptr, nullptr, attenMask, nullptr, kScale,
                                                       1.0, kPre, kNext, N1, layout, 0, sparseMode, nullptr, nullptr,
                                                       nullptr, out, &ws, &ex);
        CHECK_RET(ret == ACLNN_SUCCESS, return ret);
        void* wsAddr = nullptr;
        if (ws > 0) aclrtMalloc(&wsAddr, ws, ACL_MEM_MALLOC_HUGE_FIRST);
        ret = aclnnFlashAttentionScore(wsAddr, ws, ex, stream);
        CHECK_RET(ret == ACLNN_SUCCESS, return ret);
        ok &= ExpectError("executor run twice", aclnnFlashAttentionScore(wsAddr, ws, ex, stream),
                          ACLNN_ERR_RUNTIME_ERROR, "executor");
        aclrtSynchronizeStream(stream);
        if (ws > 0) aclrtFree(wsAddr);
        aclDestroyTensor(out);
        aclrtFree(outAddr);

        const int64_t bad[] = {4, 4};
        const int64_t small[] = {8};
        ok &= aclCreateTensor(bad, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, small, 1, qkvAddr) == nullptr &&
              ExpectError("view outside its storage", ACL_ERROR_INVALID_PARAM, ACL_ERROR_INVALID_PARAM, "storageDims");
        ok &= ExpectError("aclrtMemcpy count > destMax",
                          aclrtMemcpy(maskHost.data(), 4, maskAddr, 8, ACL_MEMCPY_DEVICE_TO_HOST),
                          ACL_ERROR_INVALID_PARAM, "destMax");
        ok &= ExpectError("aclrtSetDevice(1000)", aclrtSetDevice(1000), ACL_ERROR_RT_INVALID_DEVICEID, "deviceId");
        ok &= ExpectError("aclrtMalloc policy", aclrtMalloc(&wsAddr, 64, aclrtMemMallocPolicy(99)),
                          ACL_ERROR_INVALID_PARAM, "policy");
        ok &= aclGetRecentErrMsg() == nullptr;  // read and cleared
    }

    // 5. Release, as upstream programs do.
    aclDestroyTensor(q);
    aclDestroyTensor(k);
    aclDestroyTensor(v);
    aclDestroyTensor(attenMask);
    aclDestroyTensor(tqT);
    aclDestroyTensor(tkT);
    aclDestroyTensor(tvT);
    aclDestroyIntArray(seqQ);
    aclDestroyIntArray(seqKv);
    ok &= ExpectError("tensor destroyed twice", aclDestroyTensor(q), ACLNN_ERR_PARAM_INVALID, "tensor");
    aclrtFree(qkvAddr);
    aclrtFree(maskAddr);
    aclrtFree(tqAddr);
    aclrtFree(tkAddr);
    aclrtFree(tvAddr);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    LOG_PRINT("%s\n", ok ? "aclnnFlashAttentionScore family: ok" : "aclnnFlashAttentionScore family: FAILED");
    return ok ? 0 : 1;
}
