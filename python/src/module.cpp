// attnops._C: the C API of the operators for Python. Arrays arrive by DLPack (PyTorch CPU
// tensors, NumPy arrays, anything with __dlpack__) and are described to attnops in place, with
// their strides: nothing is copied. Outputs are allocated by the caller (the Python layer) and
// filled here. Every call runs on its own stream with the GIL released, so Python threads run
// operators concurrently and a stream error can only belong to the call that raised it.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.hpp"

namespace nb = nanobind;

// The C API through the header-only C++ layer (attnops.hpp: handles, workspace, streams,
// attnops::Error carrying the library's status and message).
namespace {

using attnops::check;
using attnops::Error;
using attnops::IntArray;
using attnops::Stream;
using attnops::Tensor;
using attnops::Workspace;
using Executor = attnops::Handle<attnopsExecutor, attnopsDestroyExecutor>;

using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;
using OptInts = std::optional<std::vector<int64_t>>;

// Python exceptions carrying the library's message: a failure the caller can fix by changing the
// arguments is a ValueError, everything else (unsupported configuration, runtime, memory,
// internal) a RuntimeError.
[[noreturn]] void raise(const Error& e) {
    const attnopsStatus s = e.status();
    if (s == ATTNOPS_ERROR_INVALID_ARGUMENT || s == ATTNOPS_ERROR_NULL_ARGUMENT) throw nb::value_error(e.what());
    throw std::runtime_error(e.what());
}

attnopsDataType dataType(const nb::dlpack::dtype& t, const char* name) {
    using Code = nb::dlpack::dtype_code;
    const auto code = Code(t.code);
    if (t.lanes == 1) {
        if (code == Code::Float && t.bits == 32) return ATTNOPS_FLOAT32;
        if (code == Code::Float && t.bits == 16) return ATTNOPS_FLOAT16;
        if (code == Code::Float && t.bits == 64) return ATTNOPS_FLOAT64;
        if (code == Code::Bfloat && t.bits == 16) return ATTNOPS_BFLOAT16;
        if (code == Code::Bool && t.bits == 8) return ATTNOPS_BOOL;
        if (code == Code::UInt && t.bits == 8) return ATTNOPS_UINT8;
        if (code == Code::Int && t.bits == 8) return ATTNOPS_INT8;
        if (code == Code::Int && t.bits == 32) return ATTNOPS_INT32;
        if (code == Code::Int && t.bits == 64) return ATTNOPS_INT64;
        if (code == Code::UInt && t.bits == 64) return ATTNOPS_UINT64;  // full quant's deq scales (float19 in the low half)
    }
    throw nb::value_error((std::string(name) + ": unsupported element type (DLPack code " + std::to_string(t.code) +
                           ", " + std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) + " lanes)")
                              .c_str());
}

// Describes a DLPack array to attnops: same memory, shape and element strides.
template <typename Array>
Tensor describe(const Array& a, const char* name) {
    std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
    for (size_t i = 0; i < a.ndim(); ++i) {
        shape[i] = int64_t(a.shape(i));
        strides[i] = a.stride(i);
        if (strides[i] < 0)
            throw nb::value_error((std::string(name) + ": negative stride " + std::to_string(strides[i]) +
                                   " in dimension " + std::to_string(i) + ": attnops reads non-negative strides only")
                                      .c_str());
    }
    const attnopsDataType dtype = dataType(a.dtype(), name);
    try {
        return Tensor(const_cast<void*>(static_cast<const void*>(a.data())), dtype, shape, strides);
    } catch (const Error& e) {
        raise(e);
    }
}

template <typename Array>
Tensor describe(const std::optional<Array>& a, const char* name) {
    return a ? describe(*a, name) : Tensor();
}

IntArray intArray(const OptInts& v) {
    if (!v) return {};
    try {
        return IntArray(*v);
    } catch (const Error& e) {
        raise(e);
    }
}

// Host integer arrays may also come as 1-D integer tensors (cumulative sequence lengths kept in a
// tensor keep torch.compile graphs free of .tolist()).
IntArray intArray(const std::optional<In>& t, const char* name) {
    if (!t) return {};
    const In& a = *t;
    if (a.ndim() != 1)
        throw nb::value_error((std::string(name) + ": rank " + std::to_string(a.ndim()) + ": must be 1-D").c_str());
    const attnopsDataType dt = dataType(a.dtype(), name);
    if (dt != ATTNOPS_INT32 && dt != ATTNOPS_INT64)
        throw nb::value_error((std::string(name) + ": dtype " + attnopsDataTypeName(dt) + ": must be int32 or int64").c_str());
    std::vector<int64_t> v(a.shape(0));
    for (size_t i = 0; i < v.size(); ++i) {
        const int64_t at = int64_t(i) * a.stride(0);
        v[i] = dt == ATTNOPS_INT32 ? static_cast<const int32_t*>(a.data())[at] : static_cast<const int64_t*>(a.data())[at];
    }
    return intArray(OptInts(std::move(v)));
}

const attnopsTensor* raw(const Tensor& t) { return t.get(); }
const attnopsIntArray* raw(const IntArray& a) { return a.get(); }

// Phase 1 (validation and planning) and phase 2 (the kernels) run without the GIL, on a stream of
// this call's own; the call returns when the work is done.
template <typename Plan>
void run(Plan plan, attnopsStatus (*launch)(void*, uint64_t, attnopsExecutor*, attnopsStream*)) {
    try {
        nb::gil_scoped_release unlocked;
        uint64_t bytes = 0;
        attnopsExecutor* executor = nullptr;
        check(plan(&bytes, &executor));
        Executor owned(executor);  // until launched
        Workspace workspace(bytes);
        const Stream stream = Stream::create();
        check(launch(workspace.data(), bytes, owned.release(), stream.get()));
        stream.synchronize();
    } catch (const Error& e) {
        raise(e);
    }
}

void flashAttentionScore(const In& query, const In& key, const In& value, const OptIn& pse, const OptIn& dropMask,
                         const OptIn& attenMask, const OptInts& prefix, const OptIn& actualSeqQLen,
                         const OptIn& actualSeqKvLen, const OptInts& qStartIdx, const OptInts& kvStartIdx,
                         const OptIn& sink, double scale, double keepProb, int64_t preTokens, int64_t nextTokens,
                         int64_t headNum, const std::string& layout, int64_t innerPrecise, int64_t sparseMode,
                         int64_t pseType, int64_t seed, int64_t offset, const Out& attentionOut,
                         const OptOut& softmaxMax, const OptOut& softmaxSum) {
    const auto q = describe(query, "query"), k = describe(key, "key"), v = describe(value, "value");
    const auto p = describe(pse, "pse"), dm = describe(dropMask, "drop_mask"), am = describe(attenMask, "atten_mask");
    const auto sk = describe(sink, "sink"), out = describe(attentionOut, "attention_out");
    const auto mx = describe(softmaxMax, "softmax_max"), sm = describe(softmaxSum, "softmax_sum");
    const auto pre = intArray(prefix), qs = intArray(qStartIdx), ks = intArray(kvStartIdx);
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsFlashAttentionScoreGetWorkspaceSize(
                raw(q), raw(k), raw(v), raw(p), raw(dm), nullptr, raw(am), raw(pre), raw(aq), raw(ak), raw(qs), raw(ks),
                raw(sk), scale, keepProb, preTokens, nextTokens, headNum, layout.c_str(), innerPrecise, sparseMode,
                pseType, seed, offset, raw(mx), raw(sm), nullptr, raw(out), bytes, ex);
        },
        attnopsFlashAttentionScore);
}

void flashAttentionScoreGrad(const In& query, const In& key, const In& value, const In& dy, const OptIn& pse,
                             const OptIn& dropMask, const OptIn& attenMask, const In& softmaxMax, const In& softmaxSum,
                             const In& attentionIn, const OptInts& prefix, const OptIn& actualSeqQLen,
                             const OptIn& actualSeqKvLen, const OptInts& qStartIdx, const OptInts& kvStartIdx,
                             const OptIn& sink, double scale, double keepProb, int64_t preTokens, int64_t nextTokens,
                             int64_t headNum, const std::string& layout, int64_t innerPrecise, int64_t sparseMode,
                             int64_t pseType, int64_t seed, int64_t offset, const Out& dq, const Out& dk,
                             const Out& dv, const OptOut& dsink) {
    const auto q = describe(query, "query"), k = describe(key, "key"), v = describe(value, "value");
    const auto g = describe(dy, "dy"), p = describe(pse, "pse"), dm = describe(dropMask, "drop_mask");
    const auto am = describe(attenMask, "atten_mask"), mx = describe(softmaxMax, "softmax_max");
    const auto sm = describe(softmaxSum, "softmax_sum"), o = describe(attentionIn, "attention_in");
    const auto sk = describe(sink, "sink");
    const auto gq = describe(dq, "dq"), gk = describe(dk, "dk"), gv = describe(dv, "dv");
    const auto gs = describe(dsink, "dsink");
    const auto pre = intArray(prefix), qs = intArray(qStartIdx), ks = intArray(kvStartIdx);
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsFlashAttentionScoreGradGetWorkspaceSize(
                raw(q), raw(k), raw(v), raw(g), raw(p), raw(dm), nullptr, raw(am), raw(mx), raw(sm), nullptr, raw(o),
                raw(pre), raw(aq), raw(ak), raw(qs), raw(ks), raw(sk), scale, keepProb, preTokens, nextTokens, headNum,
                layout.c_str(), innerPrecise, sparseMode, pseType, seed, offset, raw(gq), raw(gk), raw(gv), nullptr,
                raw(gs), bytes, ex);
        },
        attnopsFlashAttentionScoreGrad);
}

// The extended entry points' extras (attnops/flash_attention_score_ex.h), built from the
// binding's arguments: drop_ints = (head_offset, head_num, q_seq_len, kv_seq_len, q_row_offset,
// kv_row_offset); the int arrays come as 1-D int32/int64 tensors or None.
struct Extras {
    attnopsFlashAttentionExtras raw{};
    IntArray qRows, kvRows, gq, gkv, index;

    Extras(bool dropGlobal, const std::vector<int64_t>& ints, const OptIn& qRowsIn, const OptIn& kvRowsIn,
           const OptIn& gqIn, const OptIn& gkvIn, const OptIn& indexIn, bool accumulate)
        : qRows(intArray(qRowsIn, "drop_q_rows")), kvRows(intArray(kvRowsIn, "drop_kv_rows")),
          gq(intArray(gqIn, "drop_actual_seq_qlen")), gkv(intArray(gkvIn, "drop_actual_seq_kvlen")),
          index(intArray(indexIn, "drop_seq_index")) {
        if (ints.size() != 6)
            throw nb::value_error("drop_ints: must hold 6 values (head_offset, head_num, q_seq_len, kv_seq_len, "
                                  "q_row_offset, kv_row_offset)");
        try {
            check(attnopsFlashAttentionExtrasInit(&raw));
        } catch (const Error& e) {
            raise(e);
        }
        raw.dropGlobal = dropGlobal ? 1 : 0;
        raw.dropHeadOffset = ints[0];
        raw.dropHeadNum = ints[1];
        raw.dropQSeqLen = ints[2];
        raw.dropKvSeqLen = ints[3];
        raw.dropQRowOffset = ints[4];
        raw.dropKvRowOffset = ints[5];
        raw.dropQRows = qRows.get();
        raw.dropKvRows = kvRows.get();
        raw.dropActualSeqQLen = gq.get();
        raw.dropActualSeqKvLen = gkv.get();
        raw.dropSeqIndex = index.get();
        raw.accumulateGrads = accumulate ? 1 : 0;
    }
};

void flashAttentionScoreEx(const In& query, const In& key, const In& value, const OptIn& pse, const OptIn& dropMask,
                           const OptIn& attenMask, const OptInts& prefix, const OptIn& actualSeqQLen,
                           const OptIn& actualSeqKvLen, const OptInts& qStartIdx, const OptInts& kvStartIdx,
                           const OptIn& sink, double scale, double keepProb, int64_t preTokens, int64_t nextTokens,
                           int64_t headNum, const std::string& layout, int64_t innerPrecise, int64_t sparseMode,
                           int64_t pseType, int64_t seed, int64_t offset, const Out& attentionOut,
                           const OptOut& softmaxMax, const OptOut& softmaxSum, bool dropGlobal,
                           const std::vector<int64_t>& dropInts, const OptIn& dropQRows, const OptIn& dropKvRows,
                           const OptIn& dropActualSeqQLen, const OptIn& dropActualSeqKvLen, const OptIn& dropSeqIndex) {
    const auto q = describe(query, "query"), k = describe(key, "key"), v = describe(value, "value");
    const auto p = describe(pse, "pse"), dm = describe(dropMask, "drop_mask"), am = describe(attenMask, "atten_mask");
    const auto sk = describe(sink, "sink"), out = describe(attentionOut, "attention_out");
    const auto mx = describe(softmaxMax, "softmax_max"), sm = describe(softmaxSum, "softmax_sum");
    const auto pre = intArray(prefix), qs = intArray(qStartIdx), ks = intArray(kvStartIdx);
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    const Extras ex(dropGlobal, dropInts, dropQRows, dropKvRows, dropActualSeqQLen, dropActualSeqKvLen, dropSeqIndex,
                    false);
    run(
        [&](uint64_t* bytes, attnopsExecutor** e) {
            return attnopsFlashAttentionScoreExGetWorkspaceSize(
                raw(q), raw(k), raw(v), raw(p), raw(dm), nullptr, raw(am), raw(pre), raw(aq), raw(ak), raw(qs), raw(ks),
                raw(sk), scale, keepProb, preTokens, nextTokens, headNum, layout.c_str(), innerPrecise, sparseMode,
                pseType, seed, offset, raw(mx), raw(sm), nullptr, raw(out), &ex.raw, bytes, e);
        },
        attnopsFlashAttentionScore);
}

void flashAttentionScoreGradEx(const In& query, const In& key, const In& value, const In& dy, const OptIn& pse,
                               const OptIn& dropMask, const OptIn& attenMask, const In& softmaxMax,
                               const In& softmaxSum, const In& attentionIn, const OptInts& prefix,
                               const OptIn& actualSeqQLen, const OptIn& actualSeqKvLen, const OptInts& qStartIdx,
                               const OptInts& kvStartIdx, const OptIn& sink, double scale, double keepProb,
                               int64_t preTokens, int64_t nextTokens, int64_t headNum, const std::string& layout,
                               int64_t innerPrecise, int64_t sparseMode, int64_t pseType, int64_t seed, int64_t offset,
                               const Out& dq, const Out& dk, const Out& dv, const OptOut& dsink, bool dropGlobal,
                               const std::vector<int64_t>& dropInts, const OptIn& dropQRows, const OptIn& dropKvRows,
                               const OptIn& dropActualSeqQLen, const OptIn& dropActualSeqKvLen,
                               const OptIn& dropSeqIndex, bool accumulate) {
    const auto q = describe(query, "query"), k = describe(key, "key"), v = describe(value, "value");
    const auto g = describe(dy, "dy"), p = describe(pse, "pse"), dm = describe(dropMask, "drop_mask");
    const auto am = describe(attenMask, "atten_mask"), mx = describe(softmaxMax, "softmax_max");
    const auto sm = describe(softmaxSum, "softmax_sum"), o = describe(attentionIn, "attention_in");
    const auto sk = describe(sink, "sink");
    const auto gq = describe(dq, "dq"), gk = describe(dk, "dk"), gv = describe(dv, "dv");
    const auto gs = describe(dsink, "dsink");
    const auto pre = intArray(prefix), qs = intArray(qStartIdx), ks = intArray(kvStartIdx);
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    const Extras ex(dropGlobal, dropInts, dropQRows, dropKvRows, dropActualSeqQLen, dropActualSeqKvLen, dropSeqIndex,
                    accumulate);
    run(
        [&](uint64_t* bytes, attnopsExecutor** e) {
            return attnopsFlashAttentionScoreGradExGetWorkspaceSize(
                raw(q), raw(k), raw(v), raw(g), raw(p), raw(dm), nullptr, raw(am), raw(mx), raw(sm), nullptr, raw(o),
                raw(pre), raw(aq), raw(ak), raw(qs), raw(ks), raw(sk), scale, keepProb, preTokens, nextTokens, headNum,
                layout.c_str(), innerPrecise, sparseMode, pseType, seed, offset, raw(gq), raw(gk), raw(gv), nullptr,
                raw(gs), &ex.raw, bytes, e);
        },
        attnopsFlashAttentionScoreGrad);
}

// AttentionMerge (attnops/attention_merge.h): sums NULL on all three = log-sum-exp form.
void attentionMerge(const In& prevOut, const In& prevMax, const OptIn& prevSum, const In& curOut, const In& curMax,
                    const OptIn& curSum, const Out& out, const Out& maxOut, const OptOut& sumOut) {
    const auto o1 = describe(prevOut, "prev_out"), m1 = describe(prevMax, "prev_max"), s1 = describe(prevSum, "prev_sum");
    const auto o2 = describe(curOut, "cur_out"), m2 = describe(curMax, "cur_max"), s2 = describe(curSum, "cur_sum");
    const auto o = describe(out, "out"), m = describe(maxOut, "max_out"), s = describe(sumOut, "sum_out");
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsAttentionMergeGetWorkspaceSize(raw(o1), raw(m1), raw(s1), raw(o2), raw(m2), raw(s2), raw(o),
                                                         raw(m), raw(s), bytes, ex);
        },
        attnopsAttentionMerge);
}

void genDropMask(int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen, const OptIn& actualSeqQLen,
                 const OptIn& actualSeqKvLen, double keepProb, int64_t seed, int64_t offset, const Out& mask) {
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    const auto m = describe(mask, "drop_mask");
    try {
        nb::gil_scoped_release unlocked;
        check(attnopsFlashAttentionGenDropMask(batch, headNum, qSeqLen, kvSeqLen, raw(aq), raw(ak), keepProb,
                                                        seed, offset, raw(m)));
    } catch (const Error& e) {
        raise(e);
    }
}

uint64_t dropMaskBytes(int64_t batch, int64_t headNum, int64_t qSeqLen, int64_t kvSeqLen, const OptIn& actualSeqQLen,
                       const OptIn& actualSeqKvLen) {
    const auto aq = intArray(actualSeqQLen, "actual_seq_qlen"), ak = intArray(actualSeqKvLen, "actual_seq_kvlen");
    uint64_t bytes = 0;
    try {
        check(attnopsFlashAttentionDropMaskBytes(batch, headNum, qSeqLen, kvSeqLen, raw(aq), raw(ak), &bytes));
    } catch (const Error& e) {
        raise(e);
    }
    return bytes;
}

void blockAttentionResiduals(const In& partialBlock, const In& blockRes, const In& projWeight, const In& normWeight,
                             int64_t validBlockNum, double normEps, const Out& hiddenStates, const OptOut& invNorm,
                             const OptOut& probs) {
    const auto pb = describe(partialBlock, "partial_block"), br = describe(blockRes, "block_res");
    const auto pw = describe(projWeight, "proj_weight"), nw = describe(normWeight, "norm_weight");
    const auto hs = describe(hiddenStates, "hidden_states"), inv = describe(invNorm, "inv_norm");
    const auto pr = describe(probs, "probs");
    const bool needBackward = invNorm.has_value() || probs.has_value();
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsBlockAttentionResidualsGetWorkspaceSize(raw(pb), raw(br), raw(pw), raw(nw), validBlockNum,
                                                                  normEps, needBackward, raw(hs), raw(inv), raw(pr),
                                                                  bytes, ex);
        },
        attnopsBlockAttentionResiduals);
}

void blockAttentionResidualsGrad(const In& partialBlock, const In& blockRes, const In& projWeight,
                                 const In& normWeight, const In& gradHidden, const In& invNorm, const In& probs,
                                 int64_t validBlockNum, const Out& gradPartialBlock, const Out& gradBlockRes,
                                 const Out& gradProjWeight, const Out& gradNormWeight) {
    const auto pb = describe(partialBlock, "partial_block"), br = describe(blockRes, "block_res");
    const auto pw = describe(projWeight, "proj_weight"), nw = describe(normWeight, "norm_weight");
    const auto go = describe(gradHidden, "grad_hidden_states"), inv = describe(invNorm, "inv_norm");
    const auto pr = describe(probs, "probs");
    const auto gpb = describe(gradPartialBlock, "grad_partial_block"), gbr = describe(gradBlockRes, "grad_block_res");
    const auto gpw = describe(gradProjWeight, "grad_proj_weight"), gnw = describe(gradNormWeight, "grad_norm_weight");
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsBlockAttentionResidualsGradGetWorkspaceSize(raw(pb), raw(br), raw(pw), raw(nw), raw(go),
                                                                      raw(inv), raw(pr), validBlockNum, raw(gpb),
                                                                      raw(gbr), raw(gpw), raw(gnw), bytes, ex);
        },
        attnopsBlockAttentionResidualsGrad);
}


// FusedInferAttentionScore V4 (also what the PromptFlashAttention / IncreFlashAttention Python
// entry points reach: one core). key/value are single tensors (torch_npu passes no tensor lists).
void fusedInferAttentionScore(const In& query, const In& key, const In& value, const OptIn& pseShift,
                              const OptIn& attenMask, const OptIn& actualSeqLengths, const OptIn& actualSeqLengthsKv,
                              const OptIn& dequantScale1, const OptIn& quantScale1, const OptIn& dequantScale2,
                              const OptIn& quantScale2, const OptIn& quantOffset2, const OptIn& antiquantScale,
                              const OptIn& antiquantOffset, const OptIn& blockTable, const OptIn& queryPaddingSize,
                              const OptIn& kvPaddingSize, const OptIn& keyAntiquantScale, const OptIn& keyAntiquantOffset,
                              const OptIn& valueAntiquantScale, const OptIn& valueAntiquantOffset,
                              const OptIn& keySharedPrefix, const OptIn& valueSharedPrefix,
                              const OptIn& actualSharedPrefixLen, const OptIn& queryRope, const OptIn& keyRope,
                              const OptIn& keyRopeAntiquantScale, const OptIn& dequantScaleQuery,
                              const OptIn& learnableSink, int64_t numHeads, double scale, int64_t preTokens,
                              int64_t nextTokens, const std::string& layout, int64_t numKeyValueHeads, int64_t sparseMode,
                              int64_t innerPrecise, int64_t blockSize, int64_t antiquantMode, int64_t keyAntiquantMode,
                              int64_t valueAntiquantMode, int64_t queryQuantMode, const Out& attentionOut,
                              const OptOut& softmaxLse) {
    const auto q = describe(query, "query"), k = describe(key, "key"), v = describe(value, "value");
    const auto pse = describe(pseShift, "pse_shift"), am = describe(attenMask, "atten_mask");
    const auto d1 = describe(dequantScale1, "dequant_scale1"), q1 = describe(quantScale1, "quant_scale1");
    const auto d2 = describe(dequantScale2, "dequant_scale2"), q2 = describe(quantScale2, "quant_scale2");
    const auto o2 = describe(quantOffset2, "quant_offset2"), as = describe(antiquantScale, "antiquant_scale");
    const auto ao = describe(antiquantOffset, "antiquant_offset"), bt = describe(blockTable, "block_table");
    const auto qp = describe(queryPaddingSize, "query_padding_size"), kp = describe(kvPaddingSize, "kv_padding_size");
    const auto ks = describe(keyAntiquantScale, "key_antiquant_scale"), ko = describe(keyAntiquantOffset, "key_antiquant_offset");
    const auto vs = describe(valueAntiquantScale, "value_antiquant_scale");
    const auto vo = describe(valueAntiquantOffset, "value_antiquant_offset");
    const auto kpre = describe(keySharedPrefix, "key_shared_prefix"), vpre = describe(valueSharedPrefix, "value_shared_prefix");
    const auto qr = describe(queryRope, "query_rope"), kr = describe(keyRope, "key_rope");
    const auto krs = describe(keyRopeAntiquantScale, "key_rope_antiquant_scale");
    const auto dsq = describe(dequantScaleQuery, "dequant_scale_query"), sink = describe(learnableSink, "learnable_sink");
    const auto out = describe(attentionOut, "attention_out"), lse = describe(softmaxLse, "softmax_lse");
    const auto aq = intArray(actualSeqLengths, "actual_seq_lengths"), ak = intArray(actualSeqLengthsKv, "actual_seq_lengths_kv");
    const auto apre = intArray(actualSharedPrefixLen, "actual_shared_prefix_len");
    const attnopsTensor* keys[1] = {raw(k)};
    const attnopsTensor* values[1] = {raw(v)};
    run(
        [&](uint64_t* bytes, attnopsExecutor** ex) {
            return attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
                raw(q), keys, 1, values, 1, raw(pse), raw(am), raw(aq), raw(ak), raw(d1), raw(q1), raw(d2), raw(q2), raw(o2),
                raw(as), raw(ao), raw(bt), raw(qp), raw(kp), raw(ks), raw(ko), raw(vs), raw(vo), raw(kpre), raw(vpre),
                raw(apre), raw(qr), raw(kr), raw(krs), raw(dsq), raw(sink), numHeads, scale, preTokens, nextTokens,
                layout.c_str(), numKeyValueHeads, sparseMode, innerPrecise, blockSize, antiquantMode, softmaxLse.has_value(),
                keyAntiquantMode, valueAntiquantMode, queryQuantMode, raw(out), raw(lse), bytes, ex);
        },
        attnopsFusedInferAttentionScoreV4);
}

}  // namespace

NB_MODULE(_C, m) {
    m.doc() = "attnops C API (low level; use attnops / attnops.torch)";
    m.def("version", [] { return std::string(attnopsVersion()); });
    m.def("set_threads", [](int32_t threads, int32_t device) {
        try {
            check(attnopsSetDeviceThreads(device, threads));
        } catch (const Error& e) {
            raise(e);
        }
    }, nb::arg("threads"), nb::arg("device") = 0);
    m.def("threads", [](int32_t device) {
        attnopsDeviceInfo info{};
        try {
            check(attnopsGetDeviceInfo(device, &info));
        } catch (const Error& e) {
            raise(e);
        }
        return info.threads;
    }, nb::arg("device") = 0);
    m.def("data_ptr", [](const In& a) { return reinterpret_cast<uintptr_t>(a.data()); }, nb::arg("array"),
          "Address attnops sees for an array (tests use it to check that nothing was copied).");

    m.def("flash_attention_score", &flashAttentionScore, nb::arg("query"), nb::arg("key"), nb::arg("value"),
          nb::arg("pse").none(), nb::arg("drop_mask").none(), nb::arg("atten_mask").none(), nb::arg("prefix").none(),
          nb::arg("actual_seq_qlen").none(), nb::arg("actual_seq_kvlen").none(), nb::arg("q_start_idx").none(),
          nb::arg("kv_start_idx").none(), nb::arg("sink").none(), nb::arg("scale"), nb::arg("keep_prob"),
          nb::arg("pre_tokens"), nb::arg("next_tokens"), nb::arg("head_num"), nb::arg("input_layout"),
          nb::arg("inner_precise"), nb::arg("sparse_mode"), nb::arg("pse_type"), nb::arg("seed"), nb::arg("offset"),
          nb::arg("attention_out"), nb::arg("softmax_max").none(), nb::arg("softmax_sum").none());
    m.def("flash_attention_score_grad", &flashAttentionScoreGrad, nb::arg("query"), nb::arg("key"), nb::arg("value"),
          nb::arg("dy"), nb::arg("pse").none(), nb::arg("drop_mask").none(), nb::arg("atten_mask").none(),
          nb::arg("softmax_max"), nb::arg("softmax_sum"), nb::arg("attention_in"), nb::arg("prefix").none(),
          nb::arg("actual_seq_qlen").none(), nb::arg("actual_seq_kvlen").none(), nb::arg("q_start_idx").none(),
          nb::arg("kv_start_idx").none(), nb::arg("sink").none(), nb::arg("scale"), nb::arg("keep_prob"),
          nb::arg("pre_tokens"), nb::arg("next_tokens"), nb::arg("head_num"), nb::arg("input_layout"),
          nb::arg("inner_precise"), nb::arg("sparse_mode"), nb::arg("pse_type"), nb::arg("seed"), nb::arg("offset"),
          nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsink").none());
    m.def("flash_attention_score_ex", &flashAttentionScoreEx, nb::arg("query"), nb::arg("key"), nb::arg("value"),
          nb::arg("pse").none(), nb::arg("drop_mask").none(), nb::arg("atten_mask").none(), nb::arg("prefix").none(),
          nb::arg("actual_seq_qlen").none(), nb::arg("actual_seq_kvlen").none(), nb::arg("q_start_idx").none(),
          nb::arg("kv_start_idx").none(), nb::arg("sink").none(), nb::arg("scale"), nb::arg("keep_prob"),
          nb::arg("pre_tokens"), nb::arg("next_tokens"), nb::arg("head_num"), nb::arg("input_layout"),
          nb::arg("inner_precise"), nb::arg("sparse_mode"), nb::arg("pse_type"), nb::arg("seed"), nb::arg("offset"),
          nb::arg("attention_out"), nb::arg("softmax_max").none(), nb::arg("softmax_sum").none(),
          nb::arg("drop_global"), nb::arg("drop_ints"), nb::arg("drop_q_rows").none(), nb::arg("drop_kv_rows").none(),
          nb::arg("drop_actual_seq_qlen").none(), nb::arg("drop_actual_seq_kvlen").none(),
          nb::arg("drop_seq_index").none());
    m.def("flash_attention_score_grad_ex", &flashAttentionScoreGradEx, nb::arg("query"), nb::arg("key"),
          nb::arg("value"), nb::arg("dy"), nb::arg("pse").none(), nb::arg("drop_mask").none(),
          nb::arg("atten_mask").none(), nb::arg("softmax_max"), nb::arg("softmax_sum"), nb::arg("attention_in"),
          nb::arg("prefix").none(), nb::arg("actual_seq_qlen").none(), nb::arg("actual_seq_kvlen").none(),
          nb::arg("q_start_idx").none(), nb::arg("kv_start_idx").none(), nb::arg("sink").none(), nb::arg("scale"),
          nb::arg("keep_prob"), nb::arg("pre_tokens"), nb::arg("next_tokens"), nb::arg("head_num"),
          nb::arg("input_layout"), nb::arg("inner_precise"), nb::arg("sparse_mode"), nb::arg("pse_type"),
          nb::arg("seed"), nb::arg("offset"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsink").none(),
          nb::arg("drop_global"), nb::arg("drop_ints"), nb::arg("drop_q_rows").none(), nb::arg("drop_kv_rows").none(),
          nb::arg("drop_actual_seq_qlen").none(), nb::arg("drop_actual_seq_kvlen").none(),
          nb::arg("drop_seq_index").none(), nb::arg("accumulate"));
    m.def("attention_merge", &attentionMerge, nb::arg("prev_out"), nb::arg("prev_max"), nb::arg("prev_sum").none(),
          nb::arg("cur_out"), nb::arg("cur_max"), nb::arg("cur_sum").none(), nb::arg("out"), nb::arg("max_out"),
          nb::arg("sum_out").none());
    m.def("flash_attention_gen_drop_mask", &genDropMask, nb::arg("batch"), nb::arg("head_num"), nb::arg("q_seq_len"),
          nb::arg("kv_seq_len"), nb::arg("actual_seq_qlen").none(), nb::arg("actual_seq_kvlen").none(),
          nb::arg("keep_prob"), nb::arg("seed"), nb::arg("offset"), nb::arg("drop_mask"));
    m.def("flash_attention_drop_mask_bytes", &dropMaskBytes, nb::arg("batch"), nb::arg("head_num"),
          nb::arg("q_seq_len"), nb::arg("kv_seq_len"), nb::arg("actual_seq_qlen").none(),
          nb::arg("actual_seq_kvlen").none());
    m.def("block_attention_residuals", &blockAttentionResiduals, nb::arg("partial_block"), nb::arg("block_res"),
          nb::arg("proj_weight"), nb::arg("norm_weight"), nb::arg("valid_block_num"), nb::arg("norm_eps"),
          nb::arg("hidden_states"), nb::arg("inv_norm").none(), nb::arg("probs").none());
    m.def("block_attention_residuals_grad", &blockAttentionResidualsGrad, nb::arg("partial_block"),
          nb::arg("block_res"), nb::arg("proj_weight"), nb::arg("norm_weight"), nb::arg("grad_hidden_states"),
          nb::arg("inv_norm"), nb::arg("probs"), nb::arg("valid_block_num"), nb::arg("grad_partial_block"),
          nb::arg("grad_block_res"), nb::arg("grad_proj_weight"), nb::arg("grad_norm_weight"));
    m.def("fused_infer_attention_score", &fusedInferAttentionScore, nb::arg("query"), nb::arg("key"), nb::arg("value"),
          nb::arg("pse_shift").none(), nb::arg("atten_mask").none(), nb::arg("actual_seq_lengths").none(),
          nb::arg("actual_seq_lengths_kv").none(), nb::arg("dequant_scale1").none(), nb::arg("quant_scale1").none(),
          nb::arg("dequant_scale2").none(), nb::arg("quant_scale2").none(), nb::arg("quant_offset2").none(),
          nb::arg("antiquant_scale").none(), nb::arg("antiquant_offset").none(), nb::arg("block_table").none(),
          nb::arg("query_padding_size").none(), nb::arg("kv_padding_size").none(), nb::arg("key_antiquant_scale").none(),
          nb::arg("key_antiquant_offset").none(), nb::arg("value_antiquant_scale").none(),
          nb::arg("value_antiquant_offset").none(), nb::arg("key_shared_prefix").none(),
          nb::arg("value_shared_prefix").none(), nb::arg("actual_shared_prefix_len").none(), nb::arg("query_rope").none(),
          nb::arg("key_rope").none(), nb::arg("key_rope_antiquant_scale").none(), nb::arg("dequant_scale_query").none(),
          nb::arg("learnable_sink").none(), nb::arg("num_heads"), nb::arg("scale"), nb::arg("pre_tokens"),
          nb::arg("next_tokens"), nb::arg("input_layout"), nb::arg("num_key_value_heads"), nb::arg("sparse_mode"),
          nb::arg("inner_precise"), nb::arg("block_size"), nb::arg("antiquant_mode"), nb::arg("key_antiquant_mode"),
          nb::arg("value_antiquant_mode"), nb::arg("query_quant_mode"), nb::arg("attention_out"),
          nb::arg("softmax_lse").none());
}
