// AttentionMerge (attnops/attention_merge.h): argument checks, the per-row fp32 merge, the
// executor and the C API in one file (the op is one loop over rows; nothing to plan).
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attention_merge.h"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/handles.hpp"
#include "runtime/device.hpp"
#include "runtime/executor.hpp"
#include "runtime/executor_registry.hpp"

namespace attnops::merge {
namespace {

constexpr int64_t kRowsPerTask = 256;

struct Operand {
    const attnopsTensor* t = nullptr;
    const char* name = "";
};

struct Params {
    int rowRank = 0;                    // leading dims (rank - 1)
    std::vector<int64_t> rowShape;      // leading dims
    int64_t rows = 0, d = 0;
    bool lse = false;                   // log-sum-exp form (no sum tensors)
    // prevOut, curOut, outOut, prevMax, curMax, maxOut, prevSum, curSum, sumOut
    attnopsTensor t[9];
    bool present[9] = {};
};

std::string dtypeName(DType d) { return attnopsDataTypeName(attnopsDataType(int(d))); }

// Byte range [lo, hi) touched by a view (hi == lo: no elements).
struct Span {
    uintptr_t lo = 0, hi = 0;
};
Span spanOf(const attnopsTensor& t) {
    if (t.numel() == 0) return {};
    int64_t last = 0;
    for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.strides[i];
    const auto base = reinterpret_cast<uintptr_t>(t.data);
    const uint64_t size = attnopsDataTypeSize(attnopsDataType(int(t.dtype)));
    return {base, base + uintptr_t(last + 1) * size};
}
bool sameView(const attnopsTensor& a, const attnopsTensor& b) {
    if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
        if (a.shape[i] != b.shape[i] || (a.shape[i] != 1 && a.strides[i] != b.strides[i])) return false;
    return true;
}

Params check(const Operand (&ops)[9], int32_t device) {
    Params p;
    const bool anySum = ops[6].t || ops[7].t || ops[8].t;
    p.lse = !anySum;
    if (anySum)
        for (int i = 6; i < 9; ++i)
            if (!ops[i].t)
                nullArgument(ops[i].name, "prevSum, curSum and sumOut are given together (max/sum form) or all NULL "
                                          "(log-sum-exp form)");
    for (int i = 0; i < 9; ++i) {
        if (i >= 6 && p.lse) continue;
        p.t[i] = requireTensorOn(ops[i].t, ops[i].name, device);
        p.present[i] = true;
    }
    const attnopsTensor& o = p.t[0];
    if (o.rank < 1) invalidArgument(fmt::format("{}.shape", ops[0].name), shapeString(o), "must have rank >= 1 ([R..., D])");
    p.rowRank = o.rank - 1;
    p.rowShape.assign(o.shape.begin(), o.shape.begin() + p.rowRank);
    p.d = o.shape[size_t(p.rowRank)];
    p.rows = 1;
    for (int64_t x : p.rowShape) p.rows *= x;
    for (int i = 0; i < 3; ++i) {
        const attnopsTensor& t = p.t[i];
        if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
            invalidArgument(fmt::format("{}.dtype", ops[i].name), dtypeName(t.dtype), "must be fp32, fp16 or bf16");
        if (!shapeIs(t, std::vector<int64_t>(o.shape.begin(), o.shape.begin() + o.rank)))
            invalidArgument(fmt::format("{}.shape", ops[i].name), shapeString(t), "must equal {}.shape {}", ops[0].name,
                            shapeString(o));
    }
    for (int i = 3; i < 9; ++i) {
        if (!p.present[i]) continue;
        const attnopsTensor& t = p.t[i];
        if (t.dtype != DType::F32) invalidArgument(fmt::format("{}.dtype", ops[i].name), dtypeName(t.dtype), "must be fp32");
        bool ok = t.rank == o.rank && t.shape[size_t(p.rowRank)] >= 1;
        for (int r = 0; ok && r < p.rowRank; ++r) ok = t.shape[size_t(r)] == o.shape[size_t(r)];
        if (!ok)
            invalidArgument(fmt::format("{}.shape", ops[i].name), shapeString(t),
                            "must be [R..., L] with the leading dims of {}.shape {} and L >= 1 lanes", ops[0].name,
                            shapeString(o));
    }
    // Outputs: no zero strides over more than one element; no overlap with anything but the
    // identical view of their own kind's input (in place).
    const int outputs[3] = {2, 5, 8};
    for (int oi : outputs) {
        if (!p.present[oi]) continue;
        const attnopsTensor& t = p.t[oi];
        for (int r = 0; r < t.rank; ++r)
            if (t.shape[size_t(r)] > 1 && t.strides[size_t(r)] == 0)
                invalidArgument(fmt::format("{}.strides", ops[oi].name), dimsText(t.strides.data(), size_t(t.rank)),
                                "an output must not have zero strides (elements would alias)");
        const Span so = spanOf(t);
        for (int j = 0; j < 9; ++j) {
            if (j == oi || !p.present[j]) continue;
            const Span sj = spanOf(p.t[j]);
            if (so.hi <= sj.lo || sj.hi <= so.lo) continue;
            const bool inPlace = (j == oi - 2 || j == oi - 1) && sameView(t, p.t[j]);
            if (!inPlace)
                invalidArgument(ops[oi].name, "overlapping memory",
                                "must not overlap {} (only the identical view of {} or {} is allowed: in place)", ops[j].name,
                                ops[oi - 2].name, ops[oi - 1].name);
        }
    }
    return p;
}

// Offset (elements) of row `row` (row-major over the leading dims) in tensor t.
int64_t rowOffset(const Params& p, const attnopsTensor& t, int64_t row) {
    int64_t off = 0;
    for (int r = p.rowRank - 1; r >= 0; --r) {
        const int64_t n = p.rowShape[size_t(r)];
        off += (row % n) * t.strides[size_t(r)];
        row /= n;
    }
    return off;
}

void mergeRow(const Params& p, int64_t row) {
    const float negInf = -std::numeric_limits<float>::infinity();
    const attnopsTensor *o1 = &p.t[0], *o2 = &p.t[1], *out = &p.t[2];
    const attnopsTensor *m1t = &p.t[3], *m2t = &p.t[4], *mOut = &p.t[5];
    const float m1 = static_cast<const float*>(m1t->data)[rowOffset(p, *m1t, row)];
    const float m2 = static_cast<const float*>(m2t->data)[rowOffset(p, *m2t, row)];
    float s1, s2;
    if (p.lse) {
        s1 = m1 == negInf ? 0.0f : 1.0f;
        s2 = m2 == negInf ? 0.0f : 1.0f;
    } else {
        s1 = static_cast<const float*>(p.t[6].data)[rowOffset(p, p.t[6], row)];
        s2 = static_cast<const float*>(p.t[7].data)[rowOffset(p, p.t[7], row)];
    }
    const float m = (std::isnan(m1) || std::isnan(m2)) ? std::numeric_limits<float>::quiet_NaN() : std::max(m1, m2);
    const float shift = m == negInf ? 0.0f : m;
    const float a = s1 * std::exp(m1 - shift), b = s2 * std::exp(m2 - shift);
    const float s = a + b;
    const bool live = s > 0.0f;
    const float wa = live ? a / s : 0.0f, wb = live ? b / s : 0.0f;
    const int64_t b1 = rowOffset(p, *o1, row), b2 = rowOffset(p, *o2, row), bo = rowOffset(p, *out, row);
    const int64_t c1 = o1->strides[size_t(p.rowRank)], c2 = o2->strides[size_t(p.rowRank)];
    const int64_t co = out->strides[size_t(p.rowRank)];
    for (int64_t c = 0; c < p.d; ++c) {
        const float x = loadAsFloat(o1->data, b1 + c * c1, o1->dtype), y = loadAsFloat(o2->data, b2 + c * c2, o2->dtype);
        const float prod1 = x * wa, prod2 = y * wb;  // two roundings, then the sum (no contraction)
        storeFromFloat(out->data, bo + c * co, out->dtype, prod1 + prod2);
    }
    const float mergedMax = p.lse ? (live ? m + std::log(s) : m) : m;
    const auto writeLanes = [&](const attnopsTensor& t, float v) {
        auto* dst = static_cast<float*>(t.data) + rowOffset(p, t, row);
        const int64_t lanes = t.shape[size_t(p.rowRank)], stride = t.strides[size_t(p.rowRank)];
        for (int64_t l = 0; l < lanes; ++l) dst[l * stride] = v;
    };
    writeLanes(*mOut, mergedMax);
    if (!p.lse) writeLanes(p.t[8], s);
}

class MergeExecutor final : public attnopsExecutor {
public:
    explicit MergeExecutor(Params p) : p_(std::move(p)) {}
    const char* opName() const override { return "AttentionMerge"; }
    const char* implementation() const override { return "rows-fp32"; }
    void run(void*, ThreadPool& pool) override {
        const int64_t tasks = (p_.rows + kRowsPerTask - 1) / kRowsPerTask;
        pool.parallelFor(tasks, [&](int64_t task, int) {
            const int64_t end = std::min(p_.rows, (task + 1) * kRowsPerTask);
            for (int64_t row = task * kRowsPerTask; row < end; ++row) mergeRow(p_, row);
        });
    }

private:
    Params p_;
};

}  // namespace
}  // namespace attnops::merge

using namespace attnops;

extern "C" {

attnopsStatus attnopsAttentionMergeGetWorkspaceSize(const attnopsTensor* prevOut, const attnopsTensor* prevMax,
                                                    const attnopsTensor* prevSumOptional, const attnopsTensor* curOut,
                                                    const attnopsTensor* curMax, const attnopsTensor* curSumOptional,
                                                    const attnopsTensor* outOut, const attnopsTensor* maxOut,
                                                    const attnopsTensor* sumOutOptional, uint64_t* workspaceSize,
                                                    attnopsExecutor** executor) {
    return guarded([&] {
        if (workspaceSize == nullptr) nullArgument("workspaceSize");
        if (executor == nullptr) nullArgument("executor");
        *executor = nullptr;
        *workspaceSize = 0;
        Device& device = Runtime::get().currentDevice();
        const merge::Operand ops[9] = {{prevOut, "prevOut"}, {curOut, "curOut"},   {outOut, "outOut"},
                                       {prevMax, "prevMax"}, {curMax, "curMax"},   {maxOut, "maxOut"},
                                       {prevSumOptional, "prevSum"}, {curSumOptional, "curSum"},
                                       {sumOutOptional, "sumOut"}};
        auto exec = std::make_unique<merge::MergeExecutor>(merge::check(ops, device.index()));
        exec->device = device.index();
        *executor = registerExecutor(std::move(exec));
    });
}

attnopsStatus attnopsAttentionMerge(void* workspace, uint64_t workspaceSize, attnopsExecutor* executor,
                                    attnopsStream* stream) {
    return guarded([&] { launchExecutor(takeExecutor(executor, "executor"), workspace, workspaceSize, stream); });
}

}  // extern "C"
