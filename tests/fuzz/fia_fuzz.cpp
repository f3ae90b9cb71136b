// libFuzzer target over the inference family's two-phase APIs (FusedInferAttentionScore V4,
// PromptFlashAttention V3, IncreFlashAttention V4): layouts, shapes (including 0), GQA ratios,
// dtypes (fp16/bf16, int8 and int32-packed int4 key/value with dequantisation scales of any shape
// in both styles and every mode, int8 output with quantScale2/quantOffset2), paged caches in the
// three formats with block tables whose entries and widths are fuzzed, actual lengths (per batch
// and cumulative, wrong sizes, negative, too long), masks, sparse modes, tokens, sinks and NULL
// arguments; buffers are sized exactly to their views, so AddressSanitizer sees any read outside
// the cache or the table. Accepted problems are executed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fuzz_input.hpp"

namespace {

using attnops::fuzz::Bytes;
using attnops::fuzz::execute;
using attnops::fuzz::FuzzArray;
using attnops::fuzz::FuzzTensor;

const attnopsDataType kHalf[] = {ATTNOPS_FLOAT16, ATTNOPS_BFLOAT16, ATTNOPS_FLOAT32, ATTNOPS_INT8};
const char* const kFiaLayouts[] = {"BSH", "BSND", "BNSD", "TND", "SBH", "bsnd", "", "NTD", "BNSD_NBSD", "BSH_BNSD", "TND_NTD",
                                   "BNSD_BSND"};

// Shape of an operand in one form of an inputLayout (X of X_Y for inputs, Y for the output).
std::vector<int64_t> formShape(const std::string& form, int64_t b, int64_t s, int64_t n, int64_t d) {
    if (form == "NTD") return {n, s, d};
    if (form == "NBSD") return {n, b, s, d};
    return attnops::fuzz::layoutShape(form, b, s, n, d);
}
const attnopsDataType kMaskTypes[] = {ATTNOPS_BOOL, ATTNOPS_UINT8, ATTNOPS_INT8, ATTNOPS_FLOAT16};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    attnops::fuzz::launchBlockingOnce();
    Bytes in(data, size);
    const std::string layout = kFiaLayouts[in.small(0, 11)];
    const std::string base = layout.substr(0, layout.find('_'));
    const std::string outForm = layout.find('_') == std::string::npos ? layout : layout.substr(layout.find('_') + 1);
    const bool packed = base == "TND" || base == "NTD";
    const attnopsDataType qType = kHalf[in.small(0, 1) + (in.small(0, 15) == 0 ? 2 : 0)];
    const attnopsDataType kvType = in.small(0, 3) == 0 ? (in.small(0, 3) == 0 ? ATTNOPS_INT32 : ATTNOPS_INT8)
                                                       : (in.small(0, 15) == 0 ? kHalf[in.small(0, 3)] : qType);
    const int64_t b = in.small(0, 3), sq = in.small(0, 5) == 0 ? in.small(0, 20) : 1, skv = in.small(0, 40);
    const int64_t kvn = in.small(1, 3), n = kvn * in.small(1, 3) + (in.small(0, 15) == 0 ? 1 : 0);
    const int64_t mlaScale = in.small(0, 7) == 0 ? 8 : 1;  // D 128-512: reaches the MLA rules
    const int64_t d = in.small(0, 3) == 0 ? in.small(0, 40) : 16 * in.small(1, 4) * mlaScale;
    const auto pick = [&](int64_t v) { return in.small(0, 15) == 0 ? v + 1 : v; };  // occasionally wrong
    FuzzTensor q, k, v, out, lse, mask, table, kScale, kOffset, vScale, vOffset, sink, aScale, aOffset, oScale, oOffset;
    FuzzArray qLens, kvLens;
    q.make(in, qType, formShape(base, b, sq, n, d));
    const int cache = in.small(0, 3);  // 0: contiguous; 1 BnBsH, 2 BnNBsD, 3 NZ
    const int64_t blockSize = in.small(0, 3) == 0 ? in.small(0, 40) : 16 * in.small(1, 2);
    const int64_t blocks = in.small(0, 6), perSeq = in.small(0, 4);
    if (cache == 0) {
        k.make(in, kvType, formShape(base, pick(b), skv, kvn, d));
        v.make(in, kvType, formShape(base, b, pick(skv), kvn, pick(d)));
    } else {
        const int64_t d0 = kvType == ATTNOPS_INT8 ? 32 : 16;
        const std::vector<int64_t> shape = cache == 1   ? std::vector<int64_t>{blocks, blockSize, kvn * d}
                                           : cache == 2 ? std::vector<int64_t>{blocks, kvn, blockSize, d}
                                                        : std::vector<int64_t>{blocks, kvn, d / d0, blockSize, d0};
        k.make(in, kvType, shape);
        v.make(in, kvType, shape);
        std::vector<int64_t> tshape = {pick(b), perSeq};
        table.make(in, in.small(0, 7) == 0 ? ATTNOPS_INT64 : ATTNOPS_INT32, tshape);
        // Block ids: mostly in range, sometimes outside or negative.
        if (table.bytes && in.flag()) {
            auto* ids = reinterpret_cast<int32_t*>(table.bytes.get());
            for (int64_t i = 0; i < b * perSeq && table.bytes; ++i) ids[i] = int32_t(in.small(-1, blocks));
        }
    }
    const bool int8Out = in.small(0, 5) == 0;
    out.make(in, int8Out ? ATTNOPS_INT8 : in.small(0, 15) == 0 ? ATTNOPS_FLOAT32 : qType, formShape(outForm, b, sq, n, pick(d)));
    if (int8Out || in.small(0, 15) == 0) {  // quantScale2 per tensor or per channel, fp32 or bf16
        const std::vector<int64_t> shape = in.flag() ? std::vector<int64_t>{1} : std::vector<int64_t>{n, pick(d)};
        const attnopsDataType t = in.small(0, 3) == 0 ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32;
        oScale.make(in, t, shape);
        if (in.flag()) oOffset.make(in, t, shape);
    }
    const bool lseFlag = in.flag();
    if (lseFlag) lse.make(in, ATTNOPS_FLOAT32, packed ? std::vector<int64_t>{sq, n, 1} : std::vector<int64_t>{b, n, pick(sq), 1});
    // Tensor-list key/value (one pair per batch, each its own S), left padding, shared prefix.
    FuzzTensor listK[3], listV[3], qPad, kvPad, kPrefix, vPrefix;
    FuzzArray prefixLen;
    const bool list = cache == 0 && b > 1 && in.small(0, 5) == 0;
    for (int64_t i = 0; list && i < b; ++i) {
        const int64_t rows = in.small(0, 40);
        listK[i].make(in, kvType, formShape(base, pick(1), rows, kvn, d));
        listV[i].make(in, kvType, formShape(base, 1, pick(rows), kvn, pick(d)));
    }
    if (in.small(0, 5) == 0) qPad.make(in, in.small(0, 7) == 0 ? ATTNOPS_INT32 : ATTNOPS_INT64, {pick(1)});
    if (in.small(0, 5) == 0) kvPad.make(in, in.small(0, 7) == 0 ? ATTNOPS_INT32 : ATTNOPS_INT64, {pick(1)});
    if (in.small(0, 5) == 0) {
        const int64_t rows = in.small(0, 40);
        kPrefix.make(in, kvType, formShape(base, pick(1), rows, kvn, d));
        if (in.small(0, 7) != 0) vPrefix.make(in, kvType, formShape(base, 1, pick(rows), kvn, pick(d)));
        if (in.flag()) prefixLen.make(in, in.small(0, 7) == 0 ? 2 : 1);
    }
    const int64_t mode = in.small(0, 7) == 0 ? in.small(-1, 10) : in.small(0, 4);
    if (in.flag()) {
        const bool compressed = mode >= 2 && in.flag();
        mask.make(in, kMaskTypes[in.small(0, 3)],
                  compressed ? std::vector<int64_t>{2048, 2048} : std::vector<int64_t>{pick(b), 1, sq, pick(skv)});
    }
    if (kvType == ATTNOPS_INT8 || kvType == ATTNOPS_INT32) {
        // The shapes of modes 0-5 (spec 9.1), each with its dtype; sometimes a neighbour's.
        const std::vector<int64_t> shapes[] = {{kvn * d}, {b, skv + in.small(0, 2)}, {kvn}, {b, kvn, skv + in.small(-1, 1)},
                                               {blocks, blockSize}, {blocks, kvn, blockSize}, {1}};
        const auto quantTensor = [&](FuzzTensor& t, int64_t shapeMode) {
            const bool half = shapeMode == 0 || shapeMode == 2 || shapeMode == 6;
            t.make(in, half != (in.small(0, 15) == 0) ? qType : ATTNOPS_FLOAT32, shapes[shapeMode]);
        };
        if (in.small(0, 3) != 0) {
            const int64_t keyShape = in.small(0, 6), valueShape = in.small(0, 6);
            quantTensor(kScale, keyShape);
            quantTensor(vScale, valueShape);
            if (in.flag()) quantTensor(kOffset, keyShape);
            if (in.flag()) quantTensor(vOffset, valueShape);
        }
        if (in.small(0, 3) == 0) {  // the combined style [2, ...]
            const std::vector<int64_t> combined[] = {{2}, {2, kvn, 1, d}, {2, kvn * d}, {2, pick(b), skv}};
            const int64_t c = in.small(0, 3);
            aScale.make(in, c == 3 ? ATTNOPS_FLOAT32 : qType, combined[c]);
            if (in.flag()) aOffset.make(in, c == 3 ? ATTNOPS_FLOAT32 : qType, combined[c]);
        }
    }
    if (in.small(0, 3) == 0) sink.make(in, qType, {pick(n)});
    // Full int8 quantisation (check_fullquant.cpp): per-tensor deqScale1/quantScale1/deqScale2,
    // fp32 or uint64, sometimes missing or misshapen.
    FuzzTensor deq1, qs1, deq2;
    if (qType == ATTNOPS_INT8 || in.small(0, 15) == 0) {
        if (in.small(0, 7) != 0) deq1.make(in, in.flag() ? ATTNOPS_UINT64 : ATTNOPS_FLOAT32, {pick(1)});
        if (in.small(0, 7) != 0) qs1.make(in, in.small(0, 7) == 0 ? ATTNOPS_FLOAT16 : ATTNOPS_FLOAT32, {pick(1)});
        if (in.small(0, 7) != 0) deq2.make(in, in.flag() ? ATTNOPS_UINT64 : ATTNOPS_FLOAT32, {pick(1)});
    }
    // pseShift and the MLA rope inputs (check_features.cpp): shapes near the valid ones.
    FuzzTensor pse, qRope, kRope;
    if (in.small(0, 3) == 0)
        pse.make(in, in.small(0, 7) == 0 ? kHalf[in.small(0, 1)] : qType,
                 {in.flag() ? 1 : pick(b), pick(n), pick(sq), pick(cache == 0 ? skv : perSeq * blockSize)});
    if (in.small(0, 3) == 0) {
        const int64_t rd = in.small(0, 7) == 0 ? in.small(0, 80) : 64, d0 = kvType == ATTNOPS_INT8 ? 32 : 16;
        qRope.make(in, qType, attnops::fuzz::layoutShape(layout, b, sq, n, rd));
        if (in.small(0, 7) != 0)
            kRope.make(in, kvType,
                       cache == 0   ? attnops::fuzz::layoutShape(layout, b, skv, kvn, rd)
                       : cache == 1 ? std::vector<int64_t>{blocks, blockSize, kvn * rd}
                       : cache == 2 ? std::vector<int64_t>{blocks, kvn, blockSize, rd}
                                    : std::vector<int64_t>{blocks, kvn, rd / d0, blockSize, d0});
    }
    if (in.flag()) qLens.make(in, in.small(0, 3) == 0 ? in.small(0, 4) : b);
    if (in.flag() || cache != 0 || layout == "TND") kvLens.make(in, in.small(0, 3) == 0 ? in.small(0, 4) : b);
    const int64_t keyMode = in.small(0, 6), valueMode = in.small(0, 6), antiquantMode = in.small(0, 2);
    const int64_t pre = in.flag() ? in.wide() : 2147483647, next = in.flag() ? in.wide() : 2147483647;
    const double scale = in.flag() ? 0.125 : -1.0;
    const attnopsTensor* keys[3] = {k.handle, nullptr, nullptr};
    const attnopsTensor* values[3] = {v.handle, nullptr, nullptr};
    for (int64_t i = 0; list && i < b; ++i) {
        keys[i] = listK[i].handle;
        values[i] = listV[i].handle;
    }
    const uint64_t count = in.small(0, 15) == 0 ? 0 : list ? uint64_t(b) : 1;
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    switch (in.small(0, 2)) {
        case 0: {
            const attnopsStatus st = attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
                in.small(0, 15) == 0 ? nullptr : q.handle, keys, count, values, count, pse.handle, mask.handle, qLens.handle,
                kvLens.handle, deq1.handle, qs1.handle, deq2.handle, oScale.handle, oOffset.handle, aScale.handle, aOffset.handle,
                table.handle, qPad.handle, kvPad.handle, kScale.handle, kOffset.handle, vScale.handle, vOffset.handle,
                kPrefix.handle, vPrefix.handle, prefixLen.handle, qRope.handle, kRope.handle, nullptr, nullptr, sink.handle, n,
                scale, pre, next, layout.c_str(), pick(kvn), mode, in.small(0, 4), blockSize, antiquantMode, lseFlag, keyMode,
                valueMode, 0, out.handle, lse.handle, &ws, &exec);
            execute(st, ws, exec, attnopsFusedInferAttentionScoreV4);
            break;
        }
        case 1: {
            const attnopsStatus st = attnopsPromptFlashAttentionV3GetWorkspaceSize(
                q.handle, k.handle, v.handle, nullptr, mask.handle, qLens.handle, kvLens.handle, deq1.handle, qs1.handle,
                deq2.handle, nullptr, nullptr, n, scale, pre, next, layout.c_str(), kvn, mode, 1, out.handle, &ws, &exec);
            execute(st, ws, exec, attnopsPromptFlashAttentionV3);
            break;
        }
        default: {
            const attnopsStatus st = attnopsIncreFlashAttentionV4GetWorkspaceSize(
                q.handle, keys, count, values, count, nullptr, mask.handle, kvLens.handle, nullptr, nullptr, nullptr,
                oScale.handle, oOffset.handle, aScale.handle, aOffset.handle, table.handle, kvPad.handle, n, scale, layout.c_str(),
                kvn, blockSize, 1,
                out.handle, &ws, &exec);
            execute(st, ws, exec, attnopsIncreFlashAttentionV4);
            break;
        }
    }
    return 0;
}
