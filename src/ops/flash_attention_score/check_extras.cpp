// Validation of the extended entry points' extras (attnops/flash_attention_score_ex.h): the struct
// itself and the global dropout geometry, turned into the DropoutGlobal tables the kernels read.
#include <fmt/format.h>

#include "core/error.hpp"
#include "core/fault.hpp"
#include "core/handles.hpp"
#include "ops/flash_attention_score/check.hpp"

namespace attnops::fa {
namespace {

int64_t mulOrFail(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) unsupported("the global dropout problem overflows 64-bit indexing ({} x {})", a, b);
    return r;
}
int64_t addOrFail(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) unsupported("the global dropout problem overflows 64-bit indexing ({} + {})", a, b);
    return r;
}

void requireFlag(int32_t v, const char* name) {
    if (v != 0 && v != 1) invalidArgument(fmt::format("extras.{}", name), v, "must be 0 or 1");
}

// Global position of every local row (`rows` of them): the map, or row - start(row's sequence)
// + offset. `startOf(row)` gives the first row of the sequence holding `row`, or -1 for a row
// outside every sequence (TND tails: not read, set to 0).
template <typename StartOf>
std::vector<int64_t> rowTable(const attnopsIntArray* map, const char* mapName, int64_t offset, const char* offsetName,
                              int64_t rows, StartOf startOf) {
    allocationPoint();
    std::vector<int64_t> table(size_t(rows), 0);
    if (map != nullptr) {
        if (int64_t(map->values.size()) != rows)
            invalidArgument(fmt::format("extras.{}.size", mapName), map->values.size(),
                            "must equal the local row count {} (one global position per local row)", rows);
        for (int64_t r = 0; r < rows; ++r) table[size_t(r)] = startOf(r) < 0 ? 0 : map->values[size_t(r)];
        return table;
    }
    constexpr int64_t kMaxOffset = int64_t(1) << 62;
    if (offset < 0 || offset > kMaxOffset)
        invalidArgument(fmt::format("extras.{}", offsetName), offset, "must be in [0, 2^62]");
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t start = startOf(r);
        table[size_t(r)] = start < 0 ? 0 : r - start + offset;
    }
    return table;
}

// Every row of every local sequence must map into [0, global length).
void checkRows(const std::vector<int64_t>& table, const char* what, int64_t b, int64_t start, int64_t len, int64_t global) {
    for (int64_t r = start; r < start + len; ++r) {
        const int64_t v = table[size_t(r)];
        if (v < 0 || v >= global)
            invalidArgument(fmt::format("extras.{} (local row {} of sequence {})", what, r - start, b), v,
                            "must be a global position in [0, {}) (the global sequence length)", global);
    }
}

}  // namespace

void checkExtras(const attnopsFlashAttentionExtras* e) {
    if (e->structSize != sizeof(attnopsFlashAttentionExtras))
        invalidArgument("extras.structSize", e->structSize, "must be sizeof(attnopsFlashAttentionExtras) = {} (use attnopsFlashAttentionExtrasInit)",
                        sizeof(attnopsFlashAttentionExtras));
    requireFlag(e->dropGlobal, "dropGlobal");
    requireFlag(e->accumulateGrads, "accumulateGrads");
    if (e->reserved != 0) invalidArgument("extras.reserved", e->reserved, "must be 0");
    for (auto [a, name] : {std::pair{e->dropQRows, "dropQRows"}, std::pair{e->dropKvRows, "dropKvRows"},
                           std::pair{e->dropActualSeqQLen, "dropActualSeqQLen"},
                           std::pair{e->dropActualSeqKvLen, "dropActualSeqKvLen"}, std::pair{e->dropSeqIndex, "dropSeqIndex"}})
        liveIntArrayOrNull(a, name);  // a destroyed handle is an error, not a crash
}

DropoutGlobal checkDropoutGlobal(const attnopsFlashAttentionExtras& e, const ForwardParams& p, int64_t qRows,
                                 int64_t kvRows) {
    DropoutGlobal g;
    g.enabled = true;
    if (e.dropHeadOffset < 0) invalidArgument("extras.dropHeadOffset", e.dropHeadOffset, "must be >= 0");
    if (e.dropHeadNum < 1 || e.dropHeadNum - p.n1 < e.dropHeadOffset)
        invalidArgument("extras.dropHeadNum", e.dropHeadNum, "must be >= dropHeadOffset + N1 = {} + {} (the global head count)",
                        e.dropHeadOffset, p.n1);
    g.headOffset = e.dropHeadOffset;
    const size_t count = size_t(p.seq.count);
    allocationPoint();
    g.base.resize(count);
    g.qLen.resize(count);
    g.kvLen.resize(count);
    if (!p.varlen) {
        for (auto [v, name] : {std::pair{e.dropQSeqLen, "dropQSeqLen"}, std::pair{e.dropKvSeqLen, "dropKvSeqLen"}})
            if (v < 1) invalidArgument(fmt::format("extras.{}", name), v, "must be >= 1 (the global sequence length) with a fixed layout");
        if (e.dropActualSeqQLen || e.dropActualSeqKvLen || e.dropSeqIndex)
            invalidArgument("extras.dropActualSeqQLen/dropActualSeqKvLen/dropSeqIndex", "non-NULL", "are only used with inputLayout TND");
        const int64_t perBatch = mulOrFail(mulOrFail(e.dropHeadNum, e.dropQSeqLen), e.dropKvSeqLen);
        g.totalElements = mulOrFail(perBatch, p.batch);
        for (size_t b = 0; b < count; ++b) {
            g.base[b] = int64_t(b) * perBatch;
            g.qLen[b] = e.dropQSeqLen;
            g.kvLen[b] = e.dropKvSeqLen;
        }
        const auto zero = [](int64_t) { return int64_t(0); };
        g.qRow = rowTable(e.dropQRows, "dropQRows", e.dropQRowOffset, "dropQRowOffset", qRows, zero);
        g.kvRow = rowTable(e.dropKvRows, "dropKvRows", e.dropKvRowOffset, "dropKvRowOffset", kvRows, zero);
        checkRows(g.qRow, "dropQRows", 0, 0, qRows, e.dropQSeqLen);
        checkRows(g.kvRow, "dropKvRows", 0, 0, kvRows, e.dropKvSeqLen);
        return g;
    }
    // TND: the global sequences' lengths and element bases, then the local -> global map.
    const attnopsIntArray* gq = e.dropActualSeqQLen;
    const attnopsIntArray* gkv = e.dropActualSeqKvLen;
    if (!gq) nullArgument("extras.dropActualSeqQLen", "is required with inputLayout TND and dropGlobal = 1");
    if (!gkv) nullArgument("extras.dropActualSeqKvLen", "is required with inputLayout TND and dropGlobal = 1");
    if (e.dropQSeqLen != 0 || e.dropKvSeqLen != 0)
        invalidArgument("extras.dropQSeqLen/dropKvSeqLen", fmt::format("{}/{}", e.dropQSeqLen, e.dropKvSeqLen),
                        "must be 0 with inputLayout TND (the global lengths come from dropActualSeqQLen/dropActualSeqKvLen)");
    if (gq->values.size() != gkv->values.size())
        invalidArgument("extras.dropActualSeqKvLen.size", gkv->values.size(), "must equal dropActualSeqQLen.size = {}",
                        gq->values.size());
    const size_t globalCount = gq->values.size();
    std::vector<int64_t> gBase(globalCount), gQLen(globalCount), gKvLen(globalCount);
    int64_t qPrev = 0, kvPrev = 0, elements = 0;
    for (size_t h = 0; h < globalCount; ++h) {
        const int64_t qe = gq->values[h], kve = gkv->values[h];
        if (qe < qPrev)
            invalidArgument(fmt::format("extras.dropActualSeqQLen[{}]", h), qe, "cumulative ends must not decrease (previous {})", qPrev);
        if (kve < kvPrev)
            invalidArgument(fmt::format("extras.dropActualSeqKvLen[{}]", h), kve, "cumulative ends must not decrease (previous {})", kvPrev);
        gQLen[h] = qe - qPrev;
        gKvLen[h] = kve - kvPrev;
        gBase[h] = elements;
        elements = addOrFail(elements, mulOrFail(e.dropHeadNum, mulOrFail(gQLen[h], gKvLen[h])));
        qPrev = qe;
        kvPrev = kve;
    }
    g.totalElements = elements;
    const attnopsIntArray* index = e.dropSeqIndex;
    if (index == nullptr && globalCount != count)
        invalidArgument("extras.dropSeqIndex", "NULL", "is required when the local sequence count {} differs from the global {}", count,
                        globalCount);
    if (index != nullptr && index->values.size() != count)
        invalidArgument("extras.dropSeqIndex.size", index->values.size(), "must equal the local sequence count {}", count);
    for (size_t b = 0; b < count; ++b) {
        const int64_t h = index ? index->values[b] : int64_t(b);
        if (h < 0 || h >= int64_t(globalCount))
            invalidArgument(fmt::format("extras.dropSeqIndex[{}]", b), h, "must be a global sequence in [0, {})", globalCount);
        g.base[b] = gBase[size_t(h)];
        g.qLen[b] = gQLen[size_t(h)];
        g.kvLen[b] = gKvLen[size_t(h)];
    }
    // Row -> first row of its local sequence (-1: a tail row outside every sequence).
    std::vector<int64_t> qOwner(size_t(qRows), -1), kvOwner(size_t(kvRows), -1);
    for (size_t b = 0; b < count; ++b) {
        for (int64_t r = p.seq.qStart[b]; r < p.seq.qStart[b] + p.seq.qLen[b]; ++r) qOwner[size_t(r)] = p.seq.qStart[b];
        for (int64_t r = p.seq.kvStart[b]; r < p.seq.kvStart[b] + p.seq.kvLen[b]; ++r) kvOwner[size_t(r)] = p.seq.kvStart[b];
    }
    g.qRow = rowTable(e.dropQRows, "dropQRows", e.dropQRowOffset, "dropQRowOffset", qRows,
                      [&](int64_t r) { return qOwner[size_t(r)]; });
    g.kvRow = rowTable(e.dropKvRows, "dropKvRows", e.dropKvRowOffset, "dropKvRowOffset", kvRows,
                       [&](int64_t r) { return kvOwner[size_t(r)]; });
    for (size_t b = 0; b < count; ++b) {
        checkRows(g.qRow, "dropQRows", int64_t(b), p.seq.qStart[b], p.seq.qLen[b], g.qLen[b]);
        checkRows(g.kvRow, "dropKvRows", int64_t(b), p.seq.kvStart[b], p.seq.kvLen[b], g.kvLen[b]);
    }
    return g;
}

}  // namespace attnops::fa
