// libFuzzer target over the FlashAttentionScore two-phase API: the input bytes choose shapes,
// strides, dtypes, layout, modes, attribute values, sequence-length arrays (decreasing,
// negative, overflowing, mismatched) and NULL arguments. Every buffer is sized exactly to its
// declared shape and strides, so AddressSanitizer catches any read or write outside it. The
// library must return a status, never crash; accepted problems are executed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fuzz_input.hpp"

namespace {

using attnops::fuzz::Bytes;
using attnops::fuzz::FuzzArray;
using attnops::fuzz::FuzzTensor;
using attnops::fuzz::kFloatTypes;
using attnops::fuzz::kLayoutCount;
using attnops::fuzz::kLayouts;
using attnops::fuzz::layoutShape;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    attnops::fuzz::launchBlockingOnce();
    Bytes in(data, size);
    const std::string layout = kLayouts[in.small(0, kLayoutCount - 1)];
    const attnopsDataType dtype = kFloatTypes[in.small(0, 3)];
    const attnopsDataType otherDtype = in.small(0, 7) == 0 ? kFloatTypes[in.small(0, 3)] : dtype;
    const int64_t b = in.small(0, 3), s1 = in.small(0, 20), s2 = in.small(0, 20);
    const int64_t n2 = in.small(1, 3), n1 = n2 * in.small(1, 3) + (in.small(0, 9) == 0 ? 1 : 0);
    const int64_t d = in.small(0, 17), dv = in.small(0, 7) == 0 ? d + 1 : std::min<int64_t>(d, in.small(0, 17));
    FuzzTensor q, k, v, out, pse, drop, mask, sink, smax, ssum;
    q.make(in, dtype, layoutShape(layout, b, s1, n1, d));
    k.make(in, otherDtype, layoutShape(layout, b, s2, n2, d));
    v.make(in, dtype, layoutShape(layout, b, s2, n2, dv));
    // fp32 outputs from half inputs are legal through the extended entry point only.
    out.make(in, in.small(0, 7) == 0 ? ATTNOPS_FLOAT32 : dtype, layoutShape(layout, b, s1, n1, in.flag() ? dv : dv + 1));
    if (in.flag()) pse.make(in, in.flag() ? dtype : ATTNOPS_FLOAT32, in.flag() ? std::vector<int64_t>{b, n1, s1, s2}
                                                                               : std::vector<int64_t>{in.small(0, 400)});
    if (in.flag()) drop.make(in, ATTNOPS_UINT8, {in.small(0, 300)});
    if (in.flag()) mask.make(in, in.flag() ? ATTNOPS_BOOL : ATTNOPS_UINT8, in.flag() ? std::vector<int64_t>{s1, s2}
                                                                                     : std::vector<int64_t>{b, 1, s1, s2});
    if (in.flag()) sink.make(in, ATTNOPS_FLOAT32, {n1});
    if (in.flag()) {
        const int64_t lanes = in.flag() ? 8 : 1;
        const std::vector<int64_t> st = layout == "TND" ? std::vector<int64_t>{s1, n1, lanes}
                                                        : std::vector<int64_t>{b, n1, s1, lanes};
        smax.make(in, ATTNOPS_FLOAT32, st);
        ssum.make(in, ATTNOPS_FLOAT32, st);
    }
    FuzzArray prefix, qCum, kvCum, qStart, kvStart;
    if (in.flag()) prefix.make(in, in.small(0, 4));
    if (layout == "TND" || in.small(0, 7) == 0) {
        const int64_t seqs = in.small(0, 5);
        qCum.make(in, seqs);
        kvCum.make(in, in.small(0, 7) == 0 ? seqs + 1 : seqs);
    }
    if (in.flag()) qStart.make(in, in.small(0, 2));
    if (in.flag()) kvStart.make(in, in.small(0, 2));
    // The extended entry point (attnops/flash_attention_score_ex.h) with fuzzed extras: global
    // dropout geometry (row tables of any size and content, TND arrays, sequence index).
    attnopsFlashAttentionExtras extras{};
    FuzzArray dropQRows, dropKvRows, dropGq, dropGkv, dropIndex;
    const bool extended = in.small(0, 3) == 0;
    if (extended) {
        attnopsFlashAttentionExtrasInit(&extras);
        if (in.small(0, 15) == 0) extras.structSize = uint32_t(in.small(0, 200));
        extras.dropGlobal = int32_t(in.small(0, 2) == 0 ? in.small(-1, 2) : 1);
        extras.dropHeadOffset = in.flag() ? in.small(-1, 3) : in.wide();
        extras.dropHeadNum = in.flag() ? n1 + in.small(-1, 3) : in.wide();
        extras.dropQSeqLen = in.flag() ? s1 + in.small(-1, 5) : in.wide();
        extras.dropKvSeqLen = in.flag() ? s2 + in.small(-1, 5) : in.wide();
        extras.dropQRowOffset = in.flag() ? in.small(-1, 5) : in.wide();
        extras.dropKvRowOffset = in.flag() ? in.small(-1, 5) : in.wide();
        if (in.flag()) dropQRows.make(in, in.flag() ? s1 : in.small(0, 24));
        if (in.flag()) dropKvRows.make(in, in.flag() ? s2 : in.small(0, 24));
        if (in.flag()) dropGq.make(in, in.small(0, 5));
        if (in.flag()) dropGkv.make(in, in.small(0, 5));
        if (in.flag()) dropIndex.make(in, in.small(0, 5));
        extras.dropQRows = dropQRows.handle;
        extras.dropKvRows = dropKvRows.handle;
        extras.dropActualSeqQLen = dropGq.handle;
        extras.dropActualSeqKvLen = dropGkv.handle;
        extras.dropSeqIndex = dropIndex.handle;
        extras.accumulateGrads = int32_t(in.small(0, 1));
        extras.reserved = in.small(0, 15) == 0 ? 1 : 0;
    }
    const double keepProbs[] = {1.0, 0.5, 0.0, -1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), 1e-300};
    const double scales[] = {0.125, 1.0, -2.0, std::numeric_limits<double>::infinity(), 1e300};
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsFlashAttentionScoreExGetWorkspaceSize(
        in.small(0, 15) == 0 ? nullptr : q.handle, k.handle, v.handle, pse.handle, drop.handle, nullptr, mask.handle,
        prefix.handle, qCum.handle, kvCum.handle, qStart.handle, kvStart.handle, sink.handle, scales[in.small(0, 4)],
        keepProbs[in.small(0, 6)], in.wide(), in.wide(), in.small(0, 15) == 0 ? in.wide() : n1, layout.c_str(),
        in.small(0, 3), in.small(-1, 9), in.small(-1, 4), in.wide(), in.wide(), smax.handle, ssum.handle, nullptr,
        out.handle, extended ? &extras : nullptr, &ws, &exec);
    if (st != ATTNOPS_SUCCESS) return 0;
    void* workspace = nullptr;
    if (ws > 0 && attnopsMalloc(ws, &workspace) != ATTNOPS_SUCCESS) {
        attnopsDestroyExecutor(exec);
        return 0;
    }
    attnopsFlashAttentionScore(workspace, ws, exec, nullptr);
    attnopsStreamSynchronize(nullptr);
    attnopsFree(workspace);
    return 0;
}
