// The inference family called as upstream host programs call it: aclnnFusedInferAttentionScoreV4
// decoding from a paged fp16 KV cache (key/value as one-tensor aclTensorLists, a block table,
// actualSeqLengthsKv, softmaxLse), aclnnIncreFlashAttentionV4 on the same cache (its
// actualSeqLengths are the KV lengths), aclnnPromptFlashAttentionV3 prefill with the compressed
// causal mask (sparse mode 3), each checked against attention evaluated in double precision here;
// then bad input: a block table entry outside the cache and a two-token IncreFlashAttention
// query return ACLNN_ERR_PARAM_INVALID with messages naming the argument. Also ACL_INT4 key/value
// (packed two per byte) with per-channel dequantisation, equal to the int32-container form.
#include <cmath>
#include <cstdint>
#include <vector>

#include "aclnn/opdev/fp16_t.h"
#include "aclnnop/aclnn_fused_infer_attention_score_v4.h"
#include "aclnnop/aclnn_incre_flash_attention_v4.h"
#include "aclnnop/aclnn_prompt_flash_attention_v3.h"
#include "common.h"

namespace {

constexpr int64_t B = 2, N = 4, KVN = 2, D = 64, BLOCK = 16, BLOCKS = 8, MAXB = 4;

std::vector<op::fp16_t> Half(const std::vector<float>& v) {
    std::vector<op::fp16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = op::fp16_t(v[i]);
    return h;
}

std::vector<double> HalfAsDouble(const std::vector<op::fp16_t>& h) {
    std::vector<double> d(h.size());
    for (size_t i = 0; i < h.size(); ++i) d[i] = double(float(h[i]));
    return d;
}

}  // namespace

int main() {
    int32_t deviceId = 0;
    aclrtStream stream = nullptr;
    auto ret = Init(deviceId, &stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d\n", ret); return ret);
    bool ok = true;
    const double scale = 1.0 / std::sqrt(double(D));

    // 1. Decode: query BNSD [B,N,1,D]; caches BnBsH [BLOCKS, BLOCK, KVN*D]; block table [B, MAXB].
    const std::vector<op::fp16_t> qHost = Half(RandomValues(B * N * D, 41)),
                                  kHost = Half(RandomValues(BLOCKS * BLOCK * KVN * D, 42)),
                                  vHost = Half(RandomValues(BLOCKS * BLOCK * KVN * D, 43));
    const std::vector<int32_t> tableHost = {5, 1, 7, 0, 2, 6, 3, 4};
    const std::vector<int64_t> kvLens = {50, 17};
    DeviceTensor q = MakeTensor(qHost, {B, N, 1, D}, ACL_FLOAT16),
                 kCache = MakeTensor(kHost, {BLOCKS, BLOCK, KVN * D}, ACL_FLOAT16),
                 vCache = MakeTensor(vHost, {BLOCKS, BLOCK, KVN * D}, ACL_FLOAT16),
                 table = MakeTensor(tableHost, {B, MAXB}, ACL_INT32),
                 out = MakeTensor(std::vector<op::fp16_t>(B * N * D), {B, N, 1, D}, ACL_FLOAT16),
                 lse = MakeTensor(std::vector<float>(B * N), {B, N, 1, 1}, ACL_FLOAT);
    aclTensorList* keyList = aclCreateTensorList(&kCache.tensor, 1);
    aclTensorList* valueList = aclCreateTensorList(&vCache.tensor, 1);
    aclIntArray* kvLenArray = aclCreateIntArray(kvLens.data(), B);
    char layout[] = "BNSD";
    ret = RunTwoPhase("aclnnFusedInferAttentionScoreV4", stream,
              [&](uint64_t* ws, aclOpExecutor** ex) {
                  return aclnnFusedInferAttentionScoreV4GetWorkspaceSize(
                      q.tensor, keyList, valueList, nullptr, nullptr, nullptr, kvLenArray, nullptr, nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr, table.tensor, nullptr, nullptr, nullptr, nullptr, nullptr,
                      nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, scale,
                      2147483647, 2147483647, layout, KVN, 0, 0, BLOCK, 0, true, 0, 0, 0, out.tensor, lse.tensor, ws, ex);
              },
              aclnnFusedInferAttentionScoreV4);
    CHECK_RET(ret == 0, return ret);
    // The reference: gather each sequence's rows from its blocks.
    std::vector<double> want(B * N * D), wantLse(B * N);
    const std::vector<double> qd = HalfAsDouble(qHost), kd = HalfAsDouble(kHost), vd = HalfAsDouble(vHost);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t n = 0; n < N; ++n) {
            const int64_t m = n / (N / KVN), len = kvLens[b];
            std::vector<double> hq(qd.begin() + (b * N + n) * D, qd.begin() + (b * N + n + 1) * D), hk(len * D), hv(len * D);
            for (int64_t j = 0; j < len; ++j)
                for (int64_t c = 0; c < D; ++c) {
                    const int64_t at = (tableHost[b * MAXB + j / BLOCK] * BLOCK + j % BLOCK) * KVN * D + m * D + c;
                    hk[j * D + c] = kd[at];
                    hv[j * D + c] = vd[at];
                }
            const HeadResult r = ReferenceHead(hq, hk, hv, {}, 1, len, D, D, scale, false);
            for (int64_t c = 0; c < D; ++c) want[(b * N + n) * D + c] = r.out[c];
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; ++j) {
                double s = 0;
                for (int64_t c = 0; c < D; ++c) s += hq[c] * hk[j * D + c];
                mx = std::max(mx, s * scale);
            }
            for (int64_t j = 0; j < len; ++j) {
                double s = 0;
                for (int64_t c = 0; c < D; ++c) s += hq[c] * hk[j * D + c];
                sum += std::exp(s * scale - mx);
            }
            wantLse[b * N + n] = std::log(sum) + mx;
        }
    // fp16 output: half an ulp at |out| < 1 plus the fp16 rounding of the probabilities.
    ok &= AllClose("FIA V4 paged decode attentionOut", ReadAsDouble<op::fp16_t>(out), want, 2e-3, 2e-3);
    ok &= AllClose("FIA V4 softmaxLse", ReadAsDouble<float>(lse), wantLse, 1e-4, 1e-5);

    // 2. IncreFlashAttention V4 on the same cache: the same bits.
    const std::vector<double> fiaOut = ReadAsDouble<op::fp16_t>(out);
    DeviceTensor out2 = MakeTensor(std::vector<op::fp16_t>(B * N * D), {B, N, 1, D}, ACL_FLOAT16);
    ret = RunTwoPhase("aclnnIncreFlashAttentionV4", stream,
              [&](uint64_t* ws, aclOpExecutor** ex) {
                  return aclnnIncreFlashAttentionV4GetWorkspaceSize(
                      q.tensor, keyList, valueList, nullptr, nullptr, kvLenArray, nullptr, nullptr, nullptr, nullptr,
                      nullptr, nullptr, nullptr, table.tensor, nullptr, N, scale, layout, KVN, BLOCK, 1, out2.tensor, ws,
                      ex);
              },
              aclnnIncreFlashAttentionV4);
    CHECK_RET(ret == 0, return ret);
    ok &= AllClose("IFA V4 = FIA V4", ReadAsDouble<op::fp16_t>(out2), fiaOut, 0, 0);

    // 3. PromptFlashAttention V3: BSH prefill, causal through sparse mode 3 and the compressed mask.
    constexpr int64_t S = 24;
    const std::vector<op::fp16_t> pq = Half(RandomValues(S * N * D, 44)), pk = Half(RandomValues(S * N * D, 45)),
                                  pv = Half(RandomValues(S * N * D, 46));
    std::vector<uint8_t> maskHost(2048 * 2048);
    for (int64_t i = 0; i < 2048; ++i)
        for (int64_t j = i + 1; j < 2048; ++j) maskHost[i * 2048 + j] = 1;
    DeviceTensor pqT = MakeTensor(pq, {1, S, N * D}, ACL_FLOAT16), pkT = MakeTensor(pk, {1, S, N * D}, ACL_FLOAT16),
                 pvT = MakeTensor(pv, {1, S, N * D}, ACL_FLOAT16), mask = MakeTensor(maskHost, {2048, 2048}, ACL_BOOL),
                 pout = MakeTensor(std::vector<op::fp16_t>(S * N * D), {1, S, N * D}, ACL_FLOAT16);
    char bsh[] = "BSH";
    ret = RunTwoPhase("aclnnPromptFlashAttentionV3", stream,
              [&](uint64_t* ws, aclOpExecutor** ex) {
                  return aclnnPromptFlashAttentionV3GetWorkspaceSize(
                      pqT.tensor, pkT.tensor, pvT.tensor, nullptr, mask.tensor, nullptr, nullptr, nullptr, nullptr,
                      nullptr, nullptr, nullptr, N, scale, 2147483647, 0, bsh, N, 3, 1, pout.tensor, ws, ex);
              },
              aclnnPromptFlashAttentionV3);
    CHECK_RET(ret == 0, return ret);
    const HeadResult prefill = ReferencePacked(HalfAsDouble(pq), HalfAsDouble(pk), HalfAsDouble(pv), {}, {S}, N, N, D, scale);
    ok &= AllClose("PFA V3 causal prefill", ReadAsDouble<op::fp16_t>(pout), prefill.out, 2e-3, 2e-3);

    // 4. ACL_INT4 key/value (packed two per byte, low nibble first) with per-channel fp16
    // dequantisation scales: decode against the dequantised attention in double, then the same
    // bytes passed as the int32 containers of eight int4 give the same bits.
    constexpr int64_t S4 = 40;
    std::vector<uint8_t> k4Host(B * KVN * S4 * D / 2), v4Host(B * KVN * S4 * D / 2);
    std::vector<int> k4(B * KVN * S4 * D), v4(B * KVN * S4 * D);  // the int4 values, BNSD order
    for (size_t i = 0; i < k4.size(); ++i) {
        k4[i] = int((i * 7 + 3) % 16) - 8;
        v4[i] = int((i * 5 + 11) % 16) - 8;
        k4Host[i / 2] |= uint8_t((k4[i] & 0xf) << (4 * (i % 2)));
        v4Host[i / 2] |= uint8_t((v4[i] & 0xf) << (4 * (i % 2)));
    }
    const std::vector<op::fp16_t> kScaleHost = Half(RandomValues(KVN * D, 48)), vScaleHost = Half(RandomValues(KVN * D, 49));
    const auto packed = [](const std::vector<uint8_t>& bytes, const std::vector<int64_t>& dims, aclDataType type) {
        DeviceTensor t;
        t.shape = dims;
        aclrtMalloc(&t.addr, bytes.size(), ACL_MEM_MALLOC_HUGE_FIRST);
        aclrtMemcpy(t.addr, bytes.size(), bytes.data(), bytes.size(), ACL_MEMCPY_HOST_TO_DEVICE);
        t.tensor = aclCreateTensor(dims.data(), dims.size(), type, nullptr, 0, ACL_FORMAT_ND, dims.data(), dims.size(), t.addr);
        return t;
    };
    DeviceTensor k4T = packed(k4Host, {B, KVN, S4, D}, ACL_INT4), v4T = packed(v4Host, {B, KVN, S4, D}, ACL_INT4),
                 k32T = packed(k4Host, {B, KVN, S4, D / 8}, ACL_INT32), v32T = packed(v4Host, {B, KVN, S4, D / 8}, ACL_INT32),
                 kScale = MakeTensor(kScaleHost, {KVN, D}, ACL_FLOAT16), vScale = MakeTensor(vScaleHost, {KVN, D}, ACL_FLOAT16),
                 out4 = MakeTensor(std::vector<op::fp16_t>(B * N * D), {B, N, 1, D}, ACL_FLOAT16),
                 out32 = MakeTensor(std::vector<op::fp16_t>(B * N * D), {B, N, 1, D}, ACL_FLOAT16);
    const auto runInt4 = [&](DeviceTensor& kT, DeviceTensor& vT, DeviceTensor& o, const char* what) {
        aclTensorList* kl = aclCreateTensorList(&kT.tensor, 1);
        aclTensorList* vl = aclCreateTensorList(&vT.tensor, 1);
        const int r = RunTwoPhase(what, stream,
                                  [&](uint64_t* ws4, aclOpExecutor** ex4) {
                                      return aclnnFusedInferAttentionScoreV4GetWorkspaceSize(
                                          q.tensor, kl, vl, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                          nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, kScale.tensor, nullptr, vScale.tensor,
                                          nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, N, scale,
                                          2147483647, 2147483647, layout, KVN, 0, 0, 0, 0, false, 0, 0, 0, o.tensor, nullptr, ws4, ex4);
                                  },
                                  aclnnFusedInferAttentionScoreV4);
        aclDestroyTensorList(kl);  // destroys kT.tensor and vT.tensor (the memory stays)
        aclDestroyTensorList(vl);
        kT.tensor = vT.tensor = nullptr;
        return r;
    };
    ret = runInt4(k4T, v4T, out4, "aclnnFusedInferAttentionScoreV4 ACL_INT4");
    CHECK_RET(ret == 0, return ret);
    ret = runInt4(k32T, v32T, out32, "aclnnFusedInferAttentionScoreV4 int32 containers");
    CHECK_RET(ret == 0, return ret);
    {
        std::vector<double> want4(B * N * D);
        const std::vector<double> ks = HalfAsDouble(kScaleHost), vs = HalfAsDouble(vScaleHost);
        for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < N; ++n) {
                const int64_t m = n / (N / KVN);
                std::vector<double> hq(qd.begin() + (b * N + n) * D, qd.begin() + (b * N + n + 1) * D), hk(S4 * D), hv(S4 * D);
                for (int64_t j = 0; j < S4; ++j)
                    for (int64_t c = 0; c < D; ++c) {
                        const int64_t at = ((b * KVN + m) * S4 + j) * D + c;
                        hk[j * D + c] = k4[at] * ks[m * D + c];
                        hv[j * D + c] = v4[at] * vs[m * D + c];
                    }
                const HeadResult r = ReferenceHead(hq, hk, hv, {}, 1, S4, D, D, scale, false);
                for (int64_t c = 0; c < D; ++c) want4[(b * N + n) * D + c] = r.out[c];
            }
        ok &= AllClose("FIA V4 ACL_INT4 decode attentionOut", ReadAsDouble<op::fp16_t>(out4), want4, 2e-3, 2e-3);
        ok &= AllClose("ACL_INT4 = int32 containers", ReadAsDouble<op::fp16_t>(out4), ReadAsDouble<op::fp16_t>(out32), 0, 0);
    }
    // An ACL_INT4 view whose offset splits an int32 container is refused, naming the argument.
    {
        const std::vector<int64_t> dims = {B, KVN, S4, D - 8}, strides = {KVN * S4 * D, S4 * D, D, 1};
        aclTensor* odd = aclCreateTensor(dims.data(), 4, ACL_INT4, strides.data(), 4, ACL_FORMAT_ND, k4T.shape.data(), 4, k4T.addr);
        aclTensorList* kl = aclCreateTensorList(&odd, 1);
        uint64_t ws4 = 0;
        aclOpExecutor* ex4 = nullptr;
        ret = aclnnFusedInferAttentionScoreV4GetWorkspaceSize(
            q.tensor, kl, kl, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
            nullptr, nullptr, nullptr, kScale.tensor, nullptr, vScale.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
            nullptr, nullptr, nullptr, N, scale, 2147483647, 2147483647, layout, KVN, 0, 0, 0, 0, false, 0, 0, 0, out4.tensor,
            nullptr, &ws4, &ex4);
        ok &= ExpectError("ACL_INT4 key at an offset inside an int32 container", ret, ACLNN_ERR_PARAM_INVALID, "key[0].offset = 4");
        aclDestroyTensorList(kl);  // destroys `odd`
    }
    for (DeviceTensor* t : {&k4T, &v4T, &k32T, &v32T}) aclrtFree(t->addr);
    for (DeviceTensor* t : {&kScale, &vScale, &out4, &out32}) Release(*t);

    // 5. Bad input: upstream's code and a message naming the argument.
    std::vector<int32_t> badTable = tableHost;
    badTable[1] = BLOCKS;  // read for sequence 0 (50 tokens span 4 blocks)
    DeviceTensor bad = MakeTensor(badTable, {B, MAXB}, ACL_INT32);
    uint64_t ws = 0;
    aclOpExecutor* ex = nullptr;
    ret = aclnnFusedInferAttentionScoreV4GetWorkspaceSize(
        q.tensor, keyList, valueList, nullptr, nullptr, nullptr, kvLenArray, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr, nullptr, bad.tensor, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr, nullptr, nullptr, nullptr, nullptr, N, scale, 2147483647, 2147483647, layout, KVN, 0, 0, BLOCK, 0, false,
        0, 0, 0, out.tensor, nullptr, &ws, &ex);
    ok &= ExpectError("block table entry outside the cache", ret, ACLNN_ERR_PARAM_INVALID, "blockTable[0][1]");
    DeviceTensor q2 = MakeTensor(Half(RandomValues(B * N * 2 * D, 47)), {B, N, 2, D}, ACL_FLOAT16),
                 out3 = MakeTensor(std::vector<op::fp16_t>(B * N * 2 * D), {B, N, 2, D}, ACL_FLOAT16);
    ret = aclnnIncreFlashAttentionV4GetWorkspaceSize(q2.tensor, keyList, valueList, nullptr, nullptr, kvLenArray, nullptr,
                                                     nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, table.tensor,
                                                     nullptr, N, scale, layout, KVN, BLOCK, 1, out3.tensor, &ws, &ex);
    ok &= ExpectError("IncreFlashAttention with two query tokens", ret, ACLNN_ERR_PARAM_INVALID, "decodes one token");

    for (DeviceTensor* t : {&q, &table, &out, &lse, &out2, &pqT, &pkT, &pvT, &mask, &pout, &bad, &q2, &out3}) Release(*t);
    aclDestroyTensorList(keyList);  // destroys the cache tensors it holds, as upstream's does
    aclDestroyTensorList(valueList);
    aclrtFree(kCache.addr);
    aclrtFree(vCache.addr);
    aclDestroyIntArray(kvLenArray);
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    LOG_PRINT("%s\n", ok ? "inference family: all checks passed" : "inference family: FAILED");
    return ok ? 0 : 1;
}
