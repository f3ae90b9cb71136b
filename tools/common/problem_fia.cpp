// FiaProblem / FiaInstance: deterministic inputs per logical element, the API call, and the
// reference comparison.
#include "problem_fia.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/dtype.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "ops/fused_infer_attention_score/reference.hpp"

namespace attnops::tools {
namespace {

constexpr float kUnwritten = 777.0f;  // outputs start with it: every element must be written
constexpr int64_t kCompressedMask = 2048;

void check(attnopsStatus status, const char* what) {
    if (status != ATTNOPS_SUCCESS)
        throw std::runtime_error(fmt::format("{} failed: {} ({})", what, attnopsStatusName(status), attnopsGetLastErrorMessage()));
}

// Input kinds, so that query, key and value of one position differ.
enum Kind : uint64_t {
    kQuery = 1, kKey, kValue, kKeyScale, kKeyOffset, kValueScale, kValueOffset, kMask, kSink, kOutScale, kOutOffset, kPse, kQueryRope,
    kKeyRope, kQueryScale
};
constexpr int64_t kNotPassed = -1;

// A deterministic random source per logical element.
Rng elementRng(uint64_t seed, Kind kind, int64_t b, int64_t h, int64_t t, int64_t d) {
    uint64_t key = seed;
    for (uint64_t v : {uint64_t(kind), uint64_t(b), uint64_t(h), uint64_t(t), uint64_t(d)}) key = key * 0x100000001B3ull ^ (v + 0x9E37ull);
    return Rng(key);
}

float logical(uint64_t seed, Kind kind, int64_t b, int64_t h, int64_t t, int64_t d) {
    return elementRng(seed, kind, b, h, t, d).symmetric(1.0);
}

int8_t logicalInt8(uint64_t seed, Kind kind, int64_t b, int64_t h, int64_t t, int64_t d) {
    return int8_t(int64_t(elementRng(seed, kind, b, h, t, d).next() % 201) - 100);
}

int8_t logicalInt4(uint64_t seed, Kind kind, int64_t b, int64_t h, int64_t t, int64_t d) {
    return int8_t(int64_t(elementRng(seed, kind, b, h, t, d).next() % 16) - 8);
}

float quantScale(uint64_t seed, Kind kind, int64_t a, int64_t c) {
    return float(0.004 + 0.008 * elementRng(seed, kind, a, 0, c, 0).uniform());
}
float quantOffset(uint64_t seed, Kind kind, int64_t a, int64_t c) {
    return float(int64_t(elementRng(seed, kind, a, 0, c, 0).next() % 9) - 4);
}

std::vector<int64_t> layoutShape(const std::string& layout, int64_t b, int64_t s, int64_t n, int64_t d) {
    if (layout == "BSH") return {b, s, n * d};
    if (layout == "BSND") return {b, s, n, d};
    if (layout == "BNSD") return {b, n, s, d};
    if (layout == "TND") return {s, n, d};
    if (layout == "NTD") return {n, s, d};
    if (layout == "NBSD") return {n, b, s, d};
    throw std::invalid_argument("unknown layout " + layout);
}

// Contiguous index of (b, n, row, d) in a layout tensor with S rows, N heads of D.
int64_t layoutIndex(const std::string& layout, int64_t s, int64_t n, int64_t d, int64_t bi, int64_t ni, int64_t row,
                    int64_t di) {
    if (layout == "BNSD") return ((bi * n + ni) * s + row) * d + di;
    if (layout == "TND") return (row * n + ni) * d + di;
    if (layout == "NTD") return (ni * s + row) * d + di;
    return ((bi * s + row) * n + ni) * d + di;  // BSH, BSND
}

void fill(HostTensor& t, float value) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
}

// Element `index` of a float, int8, or int32-packed int4 (nibble index, low nibble first) tensor.
void setElement(HostTensor& t, int64_t index, float value, int8_t q) {
    if (t.dtype() == ATTNOPS_INT8) {
        static_cast<int8_t*>(t.data())[index] = q;
    } else if (t.dtype() == ATTNOPS_INT32) {
        auto* word = static_cast<uint32_t*>(t.data()) + index / 8;
        const int shift = int(index % 8) * 4;
        *word = (*word & ~(0xfu << shift)) | (uint32_t(q & 0xf) << shift);
    } else {
        t.set(index, value);
    }
}

// [2, shape...] (mode-0 per tensor: [2]) holding key's then value's parameters.
HostTensor stacked(const HostTensor& key, const HostTensor& value, bool perTensor) {
    std::vector<int64_t> shape = {2};
    if (!perTensor) shape.insert(shape.end(), key.shape().begin(), key.shape().end());
    HostTensor r(key.dtype(), shape);
    std::copy(key.bytes().begin(), key.bytes().end(), r.bytes().begin());
    std::copy(value.bytes().begin(), value.bytes().end(), r.bytes().begin() + std::ptrdiff_t(key.bytes().size()));
    return r;
}

std::vector<int64_t> cumulativeOf(const std::vector<int64_t>& lens) {
    std::vector<int64_t> c;
    int64_t sum = 0;
    for (int64_t v : lens) c.push_back(sum += v);
    return c;
}

}  // namespace

std::string FiaProblem::inLayout() const { return layout.substr(0, layout.find('_')); }

std::string FiaProblem::outLayout() const {
    const size_t at = layout.find('_');
    return at == std::string::npos ? layout : layout.substr(at + 1);
}

int64_t FiaProblem::qLen(int64_t b) const {
    if (tnd()) return qLens[size_t(b)];
    if (qSeqLen == 1 || qLens.empty()) return qSeqLen;  // decode ignores actualSeqLengths
    return qLens[qLens.size() == 1 ? 0 : size_t(b)];
}

int64_t FiaProblem::kvLen(int64_t b) const {
    if (tnd()) return kvLens[size_t(b)];
    if (kvLens.empty()) return kvList ? kvSeqLen + b % 3 : kvSeqLen;
    return kvLens[kvLens.size() == 1 ? 0 : size_t(b)];
}

std::string FiaProblem::describe() const {
    return fmt::format("{} {} B={} Q_S={} KV_S={} qLens=[{}] kvLens=[{}] N={}/{} D={}/{} mode={} pre={} next={} mask={} cache={} bs={} "
                       "int8={} int4={} ({}/{}{}{}){} sink={} int8Out={}{} pad={}/{} prefix={}/{} list={} pse={} rope={}",
                       layout, attnopsDataTypeName(dtype), batches(), qSeqLen, kvSeqLen, fmt::join(qLens, ","), fmt::join(kvLens, ","),
                       heads, kvHeads, dim, vdim(), sparseMode, preTokens, nextTokens, maskKind, cache, blockSize, int8Kv,
                       int4Kv, keyQuantMode, valueQuantMode, combinedQuant ? " combined" : "", quantPerTensor ? " per-tensor" : "",
                       fullQuant ? (deqScaleDType == ATTNOPS_UINT64 ? " full-quant(uint64)" : " full-quant") : mlaFullQuant ? " mla-full-quant" : "", sink,
                       int8Out, int8Out ? (outQuantPerChannel ? " per-channel" : " per-tensor") : "", queryPadding, kvPadding,
                       prefixRows, prefixLen, kvList, pse, ropeDim);
}

FiaInstance::FiaInstance(const FiaProblem& p) : problem(p) {
    const int64_t batches = p.batches(), n1 = p.heads, n2 = p.kvHeads, d = p.dim, dv = p.vdim();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const attnopsDataType kvType = p.int4Kv ? ATTNOPS_INT32 : p.int8Kv ? ATTNOPS_INT8 : p.dtype;
    const int64_t kvPack = p.int4Kv ? 8 : 1;  // int4: the last dim holds eight per int32
    const std::string in = p.inLayout();
    const int64_t lp = p.sharedPrefix();

    // Query: rows outside the actual lengths hold NaN (they must never be read).
    std::vector<int64_t> qStart(size_t(batches), 0), kvStart(size_t(batches), 0);
    int64_t qRows = p.qSeqLen, kvRows = p.kvSeqLen;
    if (p.tnd()) {
        const std::vector<int64_t> qc = cumulativeOf(p.qLens), kc = cumulativeOf(p.kvLens);
        for (int64_t b = 0; b < batches; ++b) {
            qStart[size_t(b)] = qc[size_t(b)] - p.qLens[size_t(b)];
            kvStart[size_t(b)] = kc[size_t(b)] - p.kvLens[size_t(b)];
        }
        qRows = (qc.empty() ? 0 : qc.back()) + p.extraQRows;
        kvRows = (kc.empty() ? 0 : kc.back()) + p.extraKvRows;
        qLensArg = qc;
        kvLensArg = p.paged() ? p.kvLens : kc;
        passQLens = passKvLens = true;
    } else {
        qLensArg = p.qLens;
        kvLensArg = p.kvLens.empty() && p.paged() ? std::vector<int64_t>{p.kvSeqLen} : p.kvLens;
        passQLens = !qLensArg.empty();
        passKvLens = !kvLensArg.empty();
        // Left padding: the valid rows end `padding` rows before the end (a KV window that would
        // start before row 0 in decode stays empty: the batch attends nothing).
        for (int64_t b = 0; b < batches; ++b) {
            if (p.queryPadding != kNotPassed && p.qSeqLen > 1)
                qStart[size_t(b)] = p.qSeqLen - std::max<int64_t>(0, p.queryPadding) - p.qLen(b);
            if (p.kvPadding != kNotPassed) kvStart[size_t(b)] = p.kvSeqLen - std::max<int64_t>(0, p.kvPadding) - p.kvLen(b);
        }
    }
    query = HostTensor(p.int8Query() ? ATTNOPS_INT8 : p.dtype, layoutShape(in, batches, qRows, n1, d));
    if (!p.int8Query()) fill(query, nan);
    for (int64_t b = 0; b < batches; ++b)
        for (int64_t n = 0; n < n1 && qStart[size_t(b)] >= 0; ++n)  // padding past row 0: refused by the call
            for (int64_t i = 0; i < p.qLen(b); ++i)
                for (int64_t c = 0; c < d; ++c)
                    setElement(query, layoutIndex(in, qRows, n1, d, b, n, qStart[size_t(b)] + i, c), logical(p.dataSeed, kQuery, b, n, i, c),
                               logicalInt8(p.dataSeed, kQuery, b, n, i, c));
    const int64_t dr = p.ropeDim;
    if (dr > 0) {
        queryRope = HostTensor(p.dtype, layoutShape(in, batches, qRows, n1, dr));
        fill(queryRope, nan);
        for (int64_t b = 0; b < batches; ++b)
            for (int64_t n = 0; n < n1; ++n)
                for (int64_t i = 0; i < p.qLen(b); ++i)
                    for (int64_t c = 0; c < dr; ++c)
                        queryRope.set(layoutIndex(in, qRows, n1, dr, b, n, qStart[size_t(b)] + i, c),
                                      logical(p.dataSeed, kQueryRope, b, n, i, c));
    }

    // MLA full quantisation: the key rope stays in dtype (bf16) beside the int8 cache.
    const attnopsDataType ropeType = p.mlaFullQuant ? p.dtype : kvType;
    const int64_t ropeLanes = ropeType == ATTNOPS_INT8 ? 32 : 16;
    // Key and value: layout tensors, or paged caches with a (shuffled) block table.
    int64_t maxBlocks = 0, blockNum = 0;
    const int64_t bs = p.blockSize;
    std::vector<int64_t> firstBlock(size_t(batches), 0);
    std::vector<int32_t> physical;  // paged: sequence b's block j is physical[firstBlock[b] + j]
    if (p.paged()) {
        for (int64_t b = 0; b < batches; ++b) {
            firstBlock[size_t(b)] = blockNum;
            const int64_t need = (p.kvLen(b) + bs - 1) / bs;
            blockNum += need;
            maxBlocks = std::max(maxBlocks, need);
        }
        // A requested width is kept even when narrower than a sequence needs: the library must then
        // refuse the call (actualSeqLengthsKv past maxBlocksPerSeq * blockSize), as it would an
        // NPU program's table of that width.
        maxBlocks = p.maxBlocksPerSeq > 0 ? p.maxBlocksPerSeq : std::max(maxBlocks, int64_t(1));
        blockNum += 2;  // spare blocks nobody uses
        physical.resize(static_cast<size_t>(blockNum));
        for (int64_t i = 0; i < blockNum; ++i) physical[size_t(i)] = int32_t(i);
        if (p.shuffleBlocks) {
            Rng rng(p.dataSeed + 99);
            for (int64_t i = blockNum - 1; i > 0; --i) std::swap(physical[size_t(i)], physical[rng.next() % uint64_t(i + 1)]);
        }
        blockTable = HostTensor(ATTNOPS_INT32, {batches, maxBlocks});
        auto* table = static_cast<int32_t*>(blockTable.data());
        for (int64_t b = 0; b < batches; ++b)
            for (int64_t j = 0; j < maxBlocks; ++j)
                table[b * maxBlocks + j] = j < (p.kvLen(b) + bs - 1) / bs ? physical[size_t(firstBlock[size_t(b)] + j)] : -1;
        // (The cache rows below are written through `physical`, so a narrower table is never overrun.)
        const int64_t lanes = p.int8Kv ? 32 : 16;
        std::vector<int64_t> shape;
        if (p.cache == "BnBsH") shape = {blockNum, bs, n2 * d};
        else if (p.cache == "BnNBsD") shape = {blockNum, n2, bs, d};
        else shape = {blockNum, n2, d / lanes, bs, lanes};
        key = HostTensor(kvType, shape);
        value = HostTensor(kvType, shape);
        if (dr > 0) {
            std::vector<int64_t> ropeShape = shape;
            if (p.cache == "NZ") ropeShape[2] = dr / ropeLanes, ropeShape[4] = ropeLanes;
            else ropeShape.back() = p.cache == "BnBsH" ? n2 * dr : dr;
            keyRope = HostTensor(ropeType, ropeShape);
        }
    } else if (p.kvList) {
        for (int64_t b = 0; b < batches; ++b) {
            std::vector<int64_t> kShape = layoutShape(in, 1, p.kvListRows(b), n2, d), vShape = layoutShape(in, 1, p.kvListRows(b), n2, dv);
            kShape.back() /= kvPack;  // int4: eight per int32
            vShape.back() /= kvPack;
            keyList.emplace_back(kvType, kShape);
            valueList.emplace_back(kvType, vShape);
            if (!p.quantKv()) {
                fill(keyList.back(), nan);
                fill(valueList.back(), nan);
            }
        }
    } else {
        std::vector<int64_t> kShape = layoutShape(in, batches, kvRows, n2, d), vShape = layoutShape(in, batches, kvRows, n2, dv);
        kShape.back() /= kvPack;
        vShape.back() /= kvPack;
        key = HostTensor(kvType, kShape);
        value = HostTensor(kvType, vShape);
        if (dr > 0) keyRope = HostTensor(ropeType, layoutShape(in, batches, kvRows, n2, dr));
    }
    if (!p.quantKv() && !p.kvList) {
        fill(key, nan);
        fill(value, nan);
    }
    if (dr > 0 && !p.kvList && ropeType != ATTNOPS_INT8) fill(keyRope, nan);
    const auto kvIndex = [&](int64_t b, int64_t m, int64_t t, int64_t c, int64_t dim) {
        if (p.kvList) return layoutIndex(in, p.kvListRows(b), n2, dim, 0, m, t, c);
        if (!p.paged()) return layoutIndex(in, kvRows, n2, dim, b, m, kvStart[size_t(b)] + t, c);
        const int64_t blk = physical[size_t(firstBlock[size_t(b)] + t / bs)], slot = t % bs;
        if (p.cache == "BnBsH") return ((blk * bs + slot) * n2 + m) * dim + c;
        if (p.cache == "BnNBsD") return ((blk * n2 + m) * bs + slot) * dim + c;
        const int64_t lanes = p.int8Kv && !(p.mlaFullQuant && dim == dr) ? 32 : 16;  // MLA full quant: a bf16 rope
        return (((blk * n2 + m) * (dim / lanes) + c / lanes) * bs + slot) * lanes + c % lanes;
    };
    const auto lowBits = p.int4Kv ? logicalInt4 : logicalInt8;  // the stored integers of a quantised source
    for (int64_t b = 0; b < batches; ++b) {
        if (kvStart[size_t(b)] < 0) continue;  // left padding past row 0 (decode): never read
        HostTensor& kt = p.kvList ? keyList[size_t(b)] : key;
        HostTensor& vt = p.kvList ? valueList[size_t(b)] : value;
        for (int64_t m = 0; m < n2; ++m)
            for (int64_t t = 0; t < p.kvLen(b); ++t) {
                const int64_t lt = lp + t;  // logical row (after the shared prefix)
                for (int64_t c = 0; c < d; ++c)
                    setElement(kt, kvIndex(b, m, t, c, d), logical(p.dataSeed, kKey, b, m, lt, c), lowBits(p.dataSeed, kKey, b, m, lt, c));
                const Kind valueKind = p.valueIsKey() ? kKey : kValue;  // decode MLA: value = key
                for (int64_t c = 0; c < dv; ++c)
                    setElement(vt, kvIndex(b, m, t, c, dv), logical(p.dataSeed, valueKind, b, m, lt, c),
                               lowBits(p.dataSeed, valueKind, b, m, lt, c));
                for (int64_t c = 0; c < dr; ++c) keyRope.set(kvIndex(b, m, t, c, dr), logical(p.dataSeed, kKeyRope, b, m, lt, c));
            }
    }
    // Shared prefix: batch 0's logical rows [0, Lp); rows beyond Lp hold NaN (never read).
    if (p.prefixRows > 0) {
        keySharedPrefix = HostTensor(kvType, layoutShape(in, 1, p.prefixRows, n2, d));
        valueSharedPrefix = HostTensor(kvType, layoutShape(in, 1, p.prefixRows, n2, dv));
        if (!p.quantKv()) {
            fill(keySharedPrefix, nan);
            fill(valueSharedPrefix, nan);
        }
        for (int64_t m = 0; m < n2; ++m)
            for (int64_t t = 0; t < std::min(lp, p.prefixRows); ++t) {
                for (int64_t c = 0; c < d; ++c)
                    setElement(keySharedPrefix, layoutIndex(in, p.prefixRows, n2, d, 0, m, t, c), logical(p.dataSeed, kKey, 0, m, t, c),
                               lowBits(p.dataSeed, kKey, 0, m, t, c));
                for (int64_t c = 0; c < dv; ++c)
                    setElement(valueSharedPrefix, layoutIndex(in, p.prefixRows, n2, dv, 0, m, t, c),
                               logical(p.dataSeed, kValue, 0, m, t, c), lowBits(p.dataSeed, kValue, 0, m, t, c));
            }
        if (p.prefixLen != kNotPassed) prefixLenArg = {p.prefixLen};
    }
    if (p.queryPadding != kNotPassed) {
        queryPaddingSize = HostTensor(ATTNOPS_INT64, {1});
        static_cast<int64_t*>(queryPaddingSize.data())[0] = p.queryPadding;
    }
    if (p.kvPadding != kNotPassed) {
        kvPaddingSize = HostTensor(ATTNOPS_INT64, {1});
        static_cast<int64_t*>(kvPaddingSize.data())[0] = p.kvPadding;
    }
    int64_t listRows = 0;
    for (int64_t b = 0; p.kvList && b < batches; ++b) listRows = std::max(listRows, p.kvListRows(b));

    // Dequantisation parameters.
    const int64_t tokens = p.paged() ? maxBlocks * bs : p.kvList ? listRows : kvRows;
    if (p.fullQuant) {  // spec 9.2 [guess] values: deqScale1 = s_q s_k, quantScale1 = 127, deqScale2 = s_v / 127
        const double u = elementRng(p.dataSeed, kOutScale, 7, 0, 0, 0).uniform();
        const auto deqScale = [&](double v) {
            HostTensor t(p.deqScaleDType, {1});
            if (p.deqScaleDType == ATTNOPS_UINT64) {
                const uint64_t word = uint64_t(floatToBits(float(v)) & 0xffffe000u);  // float19 in the low half
                std::memcpy(t.data(), &word, sizeof word);
            } else {
                t.set(0, float(v));
            }
            return t;
        };
        deqScale1 = deqScale(0.0004 * (0.75 + 0.5 * u));
        quantScale1 = HostTensor(ATTNOPS_FLOAT32, {1});
        quantScale1.set(0, 127.0f);
        deqScale2 = deqScale(0.01 / 127.0);
    }
    if (p.mlaFullQuant) {  // spec 9.2 MLA: per token and head query scales, per-tensor key/value scales
        std::vector<int64_t> shape = query.shape();
        shape.pop_back();
        if (in == "BSH") shape.push_back(n1);
        dequantScaleQuery = HostTensor(ATTNOPS_FLOAT32, shape);
        for (int64_t b = 0; b < batches; ++b)
            for (int64_t n = 0; n < n1; ++n)
                for (int64_t i = 0; i < qRows; ++i) {
                    if (p.tnd() && b > 0) break;  // TND: [T, N], one pass over the packed rows
                    const int64_t at = in == "BNSD" ? (b * n1 + n) * qRows + i : in == "TND" ? i * n1 + n : (b * qRows + i) * n1 + n;
                    dequantScaleQuery.set(at, quantScale(p.dataSeed, kQueryScale, b * n1 + n, i));
                }
        keyScale = HostTensor(ATTNOPS_FLOAT32, {1});
        keyScale.set(0, quantScale(p.dataSeed, kKeyScale, 0, 0));
        valueScale = HostTensor(ATTNOPS_FLOAT32, {1});
        valueScale.set(0, quantScale(p.dataSeed, kValueScale, 0, 0));
    }
    if (p.quantKv() && !p.fullQuant && !p.mlaFullQuant) {
        // Each mode's shape (spec 9.1), values per index: mode 0 [KV_N, D] (or [1]) and 2 [KV_N] in
        // the query dtype; 1 [B, S], 3 [B, KV_N, S], 4 [blockNum, bs], 5 [blockNum, KV_N, bs] fp32.
        const auto quant = [&](int64_t mode, int64_t dim, Kind scaleKind, Kind offsetKind, HostTensor& scale, HostTensor& offset) {
            std::vector<int64_t> shape;
            attnopsDataType type = ATTNOPS_FLOAT32;
            switch (mode) {
                case 0: shape = p.quantPerTensor ? std::vector<int64_t>{1} : std::vector<int64_t>{n2, dim}, type = p.dtype; break;
                case 1: shape = {batches, tokens}; break;
                case 2: shape = {n2}, type = p.dtype; break;
                case 3: shape = {batches, n2, tokens}; break;
                case 4: shape = {blockNum, bs}; break;
                default: shape = {blockNum, n2, bs}; break;
            }
            const int64_t last = shape.back();
            scale = HostTensor(type, shape);
            for (int64_t i = 0; i < scale.numel(); ++i) scale.set(i, quantScale(p.dataSeed, scaleKind, i / last, i % last));
            if (p.quantOffset) {
                offset = HostTensor(type, shape);
                for (int64_t i = 0; i < offset.numel(); ++i) offset.set(i, quantOffset(p.dataSeed, offsetKind, i / last, i % last));
            }
        };
        quant(p.keyQuantMode, d, kKeyScale, kKeyOffset, keyScale, keyOffset);
        quant(p.valueQuantMode, dv, kValueScale, kValueOffset, valueScale, valueOffset);
        if (p.combinedQuant) {
            antiquantScale = stacked(keyScale, valueScale, p.keyQuantMode == 0 && p.quantPerTensor);
            if (p.quantOffset) antiquantOffset = stacked(keyOffset, valueOffset, p.keyQuantMode == 0 && p.quantPerTensor);
            keyScale = HostTensor();
            keyOffset = HostTensor();
            valueScale = HostTensor();
            valueOffset = HostTensor();
        }
    }
    if (p.int8Out) {  // scales near 127 / max|O| so that the int8 range is used
        const std::vector<int64_t> shape = p.outQuantPerChannel ? std::vector<int64_t>{n1, dv} : std::vector<int64_t>{1};
        quantScale2 = HostTensor(p.outQuantDType, shape);
        for (int64_t i = 0; i < quantScale2.numel(); ++i)
            quantScale2.set(i, float(150.0 + 200.0 * elementRng(p.dataSeed, kOutScale, i, 0, 0, 0).uniform()));
        if (p.outQuantOffset) {
            quantOffset2 = HostTensor(p.outQuantDType, shape);
            for (int64_t i = 0; i < quantOffset2.numel(); ++i) quantOffset2.set(i, quantOffset(p.dataSeed, kOutOffset, i, 0) * 1.5f);
        }
    }

    // Mask.
    std::string maskKind = p.maskKind;
    if (maskKind == "auto")
        maskKind = p.sparseMode == 1 ? "random" : p.sparseMode == 9 ? "tree" : p.sparseMode >= 2 ? "compressed" : "none";
    const int64_t maskCols = (p.paged() ? maxBlocks * bs : p.kvList ? listRows : kvRows) + lp;
    if (maskKind == "compressed") {
        attenMask = HostTensor(ATTNOPS_UINT8, {kCompressedMask, kCompressedMask});
        auto* m = static_cast<uint8_t*>(attenMask.data());
        for (int64_t i = 0; i < kCompressedMask; ++i)
            for (int64_t j = 0; j < kCompressedMask; ++j) m[i * kCompressedMask + j] = j > i ? 1 : 0;
    } else if (maskKind == "tree") {
        // Sparse mode 9: each draft token sees itself and, at random, earlier draft tokens (its
        // ancestors); [B, Q_S, Q_S], or TND's sq x sq blocks one after another.
        std::vector<int64_t> base;
        int64_t total = 0;
        for (int64_t b = 0; b < batches; ++b) {
            base.push_back(total);
            total += p.tnd() ? p.qLen(b) * p.qLen(b) : p.qSeqLen * p.qSeqLen;
        }
        attenMask = p.tnd() ? HostTensor(ATTNOPS_BOOL, {total}) : HostTensor(ATTNOPS_BOOL, {batches, p.qSeqLen, p.qSeqLen});
        auto* m = static_cast<uint8_t*>(attenMask.data());
        for (int64_t b = 0; b < batches; ++b) {
            const int64_t side = p.tnd() ? p.qLen(b) : p.qSeqLen;
            for (int64_t i = 0; i < side; ++i)
                for (int64_t c = 0; c < side; ++c)
                    m[base[size_t(b)] + i * side + c] = c > i || (c < i && elementRng(p.dataSeed, kMask, b, 1, i, c).next() % 2 == 0);
        }
    } else if (maskKind == "random") {
        const bool decode = !p.tnd() && p.qSeqLen == 1;
        const int64_t rows = decode ? 1 : p.qSeqLen;
        attenMask = HostTensor(ATTNOPS_BOOL, decode ? std::vector<int64_t>{batches, 1, 1, maskCols}
                                                    : std::vector<int64_t>{batches, rows, maskCols});
        auto* m = static_cast<uint8_t*>(attenMask.data());
        // Logical element (b, i, j) at the physical position (left padding shifts it).
        std::fill(m, m + attenMask.numel(), uint8_t(1));
        for (int64_t b = 0; b < batches; ++b)
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < maskCols; ++j) {
                    const int64_t row = (decode ? 0 : qStart[size_t(b)]) + i, col = std::max<int64_t>(0, kvStart[size_t(b)]) + j;
                    if (row < 0 || row >= rows || col >= maskCols) continue;
                    const bool fullyMasked = b == 0 && i == 1;  // a row that attends nothing
                    m[(b * rows + row) * maskCols + col] = fullyMasked || elementRng(p.dataSeed, kMask, b, 0, i, j).next() % 4 == 0;
                }
    }
    if (p.pse != "none") {
        const int64_t pseRows = p.tnd() ? qRows : p.qSeqLen, pseBatch = p.pse == "shared" ? 1 : batches;
        pseShift = HostTensor(p.dtype, {pseBatch, n1, pseRows, maskCols});
        const bool padded = p.queryPadding != kNotPassed || p.kvPadding != kNotPassed;
        if (padded && p.pse == "batch") {
            // Left padding: logical (b, n, i, j) at the windows' physical (q0 + i, k0 + j) (spec 5
            // step 6), NaN elsewhere (never read), so that the call equals the unpadded one.
            fill(pseShift, nan);
            for (int64_t b = 0; b < pseBatch; ++b)
                for (int64_t n = 0; n < n1; ++n)
                    for (int64_t i = 0; i < p.qLen(b) && qStart[size_t(b)] >= 0; ++i)
                        for (int64_t j = 0; j < p.kvLen(b) && kvStart[size_t(b)] >= 0; ++j)
                            pseShift.set(((b * n1 + n) * pseRows + std::max<int64_t>(0, qStart[size_t(b)]) + i) * maskCols + kvStart[size_t(b)] + j,
                                         2.0f * logical(p.dataSeed, kPse, b, n, i, j));
        } else {
            for (int64_t b = 0; b < pseBatch; ++b)
                for (int64_t n = 0; n < n1; ++n)
                    for (int64_t i = 0; i < pseRows; ++i)
                        for (int64_t j = 0; j < maskCols; ++j)
                            pseShift.set(((b * n1 + n) * pseRows + i) * maskCols + j, 2.0f * logical(p.dataSeed, kPse, b, n, i, j));
        }
    }
    if (p.sink) {
        sink = HostTensor(p.dtype, {n1});
        for (int64_t n = 0; n < n1; ++n) sink.set(n, float(1.5 * logical(p.dataSeed, kSink, 0, n, 0, 0) + 0.5));
    }

    attentionOut = HostTensor(p.int8Out ? ATTNOPS_INT8 : p.dtype, fiaOutputShape(p, qRows));
    if (p.int8Out)
        std::fill(attentionOut.bytes().begin(), attentionOut.bytes().end(), uint8_t(0x5a));  // every element must be written
    else
        fill(attentionOut, kUnwritten);
    if (p.lse) {
        softmaxLse = HostTensor(ATTNOPS_FLOAT32, p.tnd() ? std::vector<int64_t>{qRows, n1, 1}
                                                         : std::vector<int64_t>{batches, n1, qRows, 1});
        fill(softmaxLse, -kUnwritten);
    }
}

FiaArrays::FiaArrays(const FiaInstance& inst) {
    if (inst.passQLens) check(attnopsCreateIntArray(inst.qLensArg.data(), inst.qLensArg.size(), &qLens), "attnopsCreateIntArray");
    if (inst.passKvLens) check(attnopsCreateIntArray(inst.kvLensArg.data(), inst.kvLensArg.size(), &kvLens), "attnopsCreateIntArray");
    if (!inst.prefixLenArg.empty())
        check(attnopsCreateIntArray(inst.prefixLenArg.data(), inst.prefixLenArg.size(), &prefixLen), "attnopsCreateIntArray");
    for (size_t b = 0; b < inst.keyList.size(); ++b) {
        keys.push_back(inst.keyList[b].handle());
        values.push_back(inst.valueList[b].handle());
    }
}

FiaArrays::~FiaArrays() {
    attnopsDestroyIntArray(qLens);
    attnopsDestroyIntArray(kvLens);
    attnopsDestroyIntArray(prefixLen);
}

fia::Args fiaArgs(const FiaInstance& inst, const FiaArrays& arrays, const attnopsTensor* kv[2]) {
    const FiaProblem& p = inst.problem;
    const auto handle = [](const HostTensor& t) -> const attnopsTensor* { return t.empty() ? nullptr : t.handle(); };
    fia::Args a;
    kv[0] = handle(inst.key);
    kv[1] = handle(inst.value);
    a.query = inst.query.handle();
    a.key = &kv[0];
    a.keyCount = 1;
    a.value = &kv[1];
    a.valueCount = 1;
    if (!arrays.keys.empty()) {  // tensor list
        a.key = arrays.keys.data();
        a.keyCount = arrays.keys.size();
        a.value = arrays.values.data();
        a.valueCount = arrays.values.size();
    }
    a.queryPaddingSize = handle(inst.queryPaddingSize);
    a.kvPaddingSize = handle(inst.kvPaddingSize);
    a.keySharedPrefix = handle(inst.keySharedPrefix);
    a.valueSharedPrefix = handle(inst.valueSharedPrefix);
    a.actualSharedPrefixLen = arrays.prefixLen;
    a.attenMask = handle(inst.attenMask);
    a.actualSeqLengths = arrays.qLens;
    a.actualSeqLengthsKv = arrays.kvLens;
    a.blockTable = handle(inst.blockTable);
    a.keyAntiquantScale = handle(inst.keyScale);
    a.keyAntiquantOffset = handle(inst.keyOffset);
    a.valueAntiquantScale = handle(inst.valueScale);
    a.valueAntiquantOffset = handle(inst.valueOffset);
    a.learnableSink = handle(inst.sink);
    a.antiquantScale = handle(inst.antiquantScale);
    a.antiquantOffset = handle(inst.antiquantOffset);
    a.antiquantMode = p.combinedQuant ? p.keyQuantMode : 0;
    a.deqScale1 = handle(inst.deqScale1);
    a.quantScale1 = handle(inst.quantScale1);
    a.deqScale2 = handle(inst.deqScale2);
    a.quantScale2 = handle(inst.quantScale2);
    a.quantOffset2 = handle(inst.quantOffset2);
    a.pseShift = handle(inst.pseShift);
    a.queryRope = handle(inst.queryRope);
    a.keyRope = handle(inst.keyRope);
    a.dequantScaleQuery = handle(inst.dequantScaleQuery);
    a.queryQuantMode = p.mlaFullQuant ? 3 : 0;
    a.numHeads = p.heads;
    a.scaleValue = std::isnan(p.scale) ? 1.0 / std::sqrt(double(p.dim)) : p.scale;
    a.preTokens = p.preTokens;
    a.nextTokens = p.nextTokens;
    a.inputLayout = p.layout.c_str();
    a.numKeyValueHeads = p.kvHeads;
    a.sparseMode = p.sparseMode;
    a.blockSize = p.paged() ? p.blockSize : 0;
    a.softmaxLseFlag = p.lse;
    a.keyAntiquantMode = p.keyQuantMode;
    a.valueAntiquantMode = p.valueQuantMode;
    a.attentionOut = inst.attentionOut.handle();
    a.softmaxLse = handle(inst.softmaxLse);
    return a;
}

attnopsStatus fiaGetWorkspace(const fia::Args& a, uint64_t* ws, attnopsExecutor** exec) {
    return attnopsFusedInferAttentionScoreV4GetWorkspaceSize(
        a.query, a.key, a.keyCount, a.value, a.valueCount, a.pseShift, a.attenMask, a.actualSeqLengths,
        a.actualSeqLengthsKv, a.deqScale1, a.quantScale1, a.deqScale2, a.quantScale2, a.quantOffset2, a.antiquantScale,
        a.antiquantOffset, a.blockTable, a.queryPaddingSize, a.kvPaddingSize, a.keyAntiquantScale, a.keyAntiquantOffset,
        a.valueAntiquantScale, a.valueAntiquantOffset, a.keySharedPrefix, a.valueSharedPrefix, a.actualSharedPrefixLen,
        a.queryRope, a.keyRope, a.keyRopeAntiquantScale, a.dequantScaleQuery, a.learnableSink, a.numHeads, a.scaleValue,
        a.preTokens, a.nextTokens, a.inputLayout, a.numKeyValueHeads, a.sparseMode, a.innerPrecise, a.blockSize,
        a.antiquantMode, a.softmaxLseFlag, a.keyAntiquantMode, a.valueAntiquantMode, a.queryQuantMode, a.attentionOut,
        a.softmaxLse, ws, exec);
}

attnopsStatus FiaInstance::run(attnopsStream* stream) {
    const FiaArrays arrays(*this);
    const attnopsTensor* kv[2];
    const fia::Args a = fiaArgs(*this, arrays, kv);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = fiaGetWorkspace(a, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsFusedInferAttentionScoreV4, stream);
}

FiaCheck checkFia(const FiaInstance& inst) {
    std::vector<int64_t> all(size_t(inst.problem.batches()));
    for (size_t b = 0; b < all.size(); ++b) all[b] = int64_t(b);
    return checkFiaBatches(inst, all);
}

FiaCheck checkFiaBatches(const FiaInstance& inst, const std::vector<int64_t>& batches) {
    const FiaProblem& pr = inst.problem;
    const FiaArrays arrays(inst);
    const attnopsTensor* kv[2];
    const fia::Params p = fia::checkForward(fiaArgs(inst, arrays, kv), 0);
    const fa::ForwardParams& c = p.core;
    const float inf = std::numeric_limits<float>::infinity();
    FiaCheck r;
    const bool int8Out = p.outQuant.on;
    const auto outAt = [&](int64_t b, int64_t n, int64_t row, int64_t col) {
        if (int8Out) return float(static_cast<const int8_t*>(c.out.data)[c.out.offset(b, n, row, col)]);
        return loadAsFloat(c.out.data, c.out.offset(b, n, row, col), c.out.dtype);
    };
    // int8 output: the int8 value of attention result o (spec 9.3), in double.
    const auto quantised = [&](int64_t n, int64_t col, double o) {
        const fia::OutputQuant& q = p.outQuant;
        const size_t i = q.scale.size() == 1 ? 0 : size_t(n * q.headDim + col);
        const double y = std::nearbyint(o * double(q.scale[i]) + (q.offset.empty() ? 0.0 : double(q.offset[i])));
        return std::min(127.0, std::max(-128.0, y));
    };
    struct Int8Element {
        int64_t n, col;
        double got, want;
    };
    std::vector<Int8Element> int8Elements;  // judged once the tolerance is known
    const auto lseAt = [&](int64_t b, int64_t n, int64_t row) {
        return static_cast<const float*>(p.lse.data)[p.lse.offset(b, n, row, 0)];
    };
    const auto fail = [&](const std::string& what) {
        if (r.passed) r.firstFailure = what;
        r.passed = false;
    };
    const auto expectEmpty = [&](int64_t b, int64_t n, int64_t row) {
        ++r.emptyRows;
        for (int64_t col = 0; col < c.dv; ++col)
            if (outAt(b, n, row, col) != (int8Out ? quantised(n, col, 0.0) : 0.0)) fail(fmt::format("row (b {}, n {}, row {}) must be 0, got {}", b, n, row, outAt(b, n, row, col)));
        if (p.writeLse && lseAt(b, n, row) != inf) fail(fmt::format("lse of row (b {}, n {}, row {}) must be +inf, got {}", b, n, row, lseAt(b, n, row)));
    };
    const int64_t dotDim = c.d + p.ropeDim;  // pse adds up to 2 (the generator's range)
    const double scoreMag = std::fabs(double(c.scale)) * double(dotDim) * (pr.quantKv() ? 1.3 : 1.0) +
                            (c.pse.form != fa::PseForm::None ? 2.0 : 0.0);
    r.lseTolerance = std::ldexp(1.0, -24) * (4.0 * double(dotDim) * scoreMag + 4.0 * double(c.seq.maxKvLen) + 64.0) + 1e-6;
    for (const int64_t b : batches) {
        if (b < 0 || b >= c.seq.count) throw std::invalid_argument(fmt::format("checkFiaBatches: no batch {}", b));
        for (int64_t n = 0; n < c.n1; ++n) {
            const int64_t sq = c.seq.qLen[size_t(b)];
            for (int64_t i = 0; i < sq; ++i) {
                const int64_t row = c.seq.qStart[size_t(b)] + i;
                const fia::ReferenceRow ref = fia::referenceRow(p, b, n, i);
                const std::vector<float> naive = fia::naiveLowPrecisionRow(p, b, n, i);
                ++r.rows;
                for (int64_t col = 0; col < c.dv; ++col) {
                    const double got = outAt(b, n, row, col), want = ref.out[size_t(col)];
                    if (int8Out) {
                        int8Elements.push_back({n, col, got, want});
                    } else {
                        const double err = std::fabs(got - want);
                        r.maxAbsError = std::isnan(err) ? inf : std::max(r.maxAbsError, err);
                    }
                    r.maxAbsNaiveError = std::max(r.maxAbsNaiveError, std::fabs(double(naive[size_t(col)]) - want));
                    r.maxAbsReference = std::max(r.maxAbsReference, std::fabs(want));
                }
                if (p.writeLse) {
                    const double got = lseAt(b, n, row);
                    const double err = std::isinf(ref.lse) ? (got == ref.lse ? 0.0 : double(inf)) : std::fabs(got - ref.lse);
                    r.maxLseError = std::isnan(err) ? inf : std::max(r.maxLseError, err);
                    if (!(err <= r.lseTolerance * (1.0 + std::fabs(std::isinf(ref.lse) ? 0.0 : ref.lse))))
                        fail(fmt::format("lse of row (b {}, n {}, i {}) = {}, reference {}", b, n, i, got, ref.lse));
                }
            }
            if (!c.varlen)  // rows before (left padding) and after the valid ones
                for (int64_t i = 0; i < p.qSeqCapacity; ++i)
                    if (i < c.seq.qStart[size_t(b)] || i >= c.seq.qStart[size_t(b)] + sq) expectEmpty(b, n, i);
        }
    }
    if (c.varlen)
        for (int64_t row = c.seq.qRowsUsed; row < c.qRowsTotal; ++row)
            for (int64_t n = 0; n < c.n1; ++n) expectEmpty(0, n, row);
    r.tolerance = 2.0 * r.maxAbsNaiveError + 1e-5 * r.maxAbsReference + 1e-6;
    // An int8 element is right when it is the quantisation of some value within the tolerance of
    // the exact result (the quantiser is monotone, so one of the two ends' values or between).
    for (const Int8Element& e : int8Elements) {
        const double lo = quantised(e.n, e.col, e.want - r.tolerance), hi = quantised(e.n, e.col, e.want + r.tolerance);
        if (!(e.got >= std::min(lo, hi) && e.got <= std::max(lo, hi)))
            fail(fmt::format("int8 output {} of head {} col {}: exact result {} quantises to {}..{}", e.got, e.n, e.col, e.want, lo, hi));
    }
    if (!(r.maxAbsError <= r.tolerance)) fail(fmt::format("output error {} > tolerance {} (naive error {})", r.maxAbsError, r.tolerance, r.maxAbsNaiveError));
    return r;
}

std::vector<int64_t> fiaOutputShape(const FiaProblem& p, int64_t qRows) {
    return layoutShape(p.outLayout(), p.batches(), qRows, p.heads, p.vdim());
}

double fiaForwardFlops(const FiaProblem& p) {
    fa::MaskSpec mask;  // modes 0-4: the FlashAttentionScore geometry; decode ignores the mode
    const bool decode = !p.tnd() && p.qSeqLen == 1;
    mask.sparseMode = decode ? 1 : p.sparseMode;
    mask.preTokens = decode ? kNoBand : p.preTokens;
    mask.nextTokens = decode ? kNoBand : p.nextTokens;
    double kept = 0;
    for (int64_t b = 0; b < p.batches(); ++b) {
        const int64_t sq = p.qLen(b), skv = p.kvLen(b) + p.sharedPrefix();
        mask.prefix.assign(size_t(b + 1), 0);
        const fa::SeqRule rule = fa::seqRule(mask, b, sq, skv);
        for (int64_t i = 0; i < sq; ++i) {
            const fa::KeyRange band = fa::rowBand(rule, i, skv);
            kept += double(std::max<int64_t>(0, band.hi - band.lo));
        }
    }
    return kept * double(p.heads) * 2.0 * double(p.dim + p.ropeDim + p.vdim());
}

double fiaKvBytes(const FiaProblem& p) {
    const double element = p.int4Kv ? 0.5 : p.int8Kv ? 1.0 : double(attnopsDataTypeSize(p.dtype));
    const double ropeElement = p.mlaFullQuant ? double(attnopsDataTypeSize(p.dtype)) : element;  // MLA full quant: a bf16 rope
    // Per-token scales (fp32) and offsets: one of each per token for K and V in mode 1.
    const double perToken = p.quantKv() ? 4.0 * ((p.keyQuantMode == 1) + (p.valueQuantMode == 1)) * (p.quantOffset ? 2 : 1) : 0.0;
    double bytes = 0;
    for (int64_t b = 0; b < p.batches(); ++b)
        bytes += double(p.kvLen(b) + p.sharedPrefix()) *  // decode MLA reads the key once as key and value
                 (double(p.kvHeads) * (double(p.dim + (p.valueIsKey() ? 0 : p.vdim())) * element + double(p.ropeDim) * ropeElement) +
                  perToken);
    return bytes;
}

}  // namespace attnops::tools
