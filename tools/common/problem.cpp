// FaProblem / FaInstance: deterministic inputs, the API call, and the reference comparison.
#include "problem.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "core/dtype.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/reference.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::tools {
namespace {

void check(attnopsStatus status, const char* what) {
    if (status != ATTNOPS_SUCCESS)
        throw std::runtime_error(fmt::format("{} failed: {} ({})", what, attnopsStatusName(status), attnopsGetLastErrorMessage()));
}

void fillRandom(HostTensor& t, Rng& rng, double scale) {
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.symmetric(scale));
}

std::vector<int64_t> layoutShape(const std::string& layout, int64_t b, int64_t s, int64_t n, int64_t d) {
    if (layout == "BSH") return {b, s, n * d};
    if (layout == "SBH") return {s, b, n * d};
    if (layout == "BSND") return {b, s, n, d};
    if (layout == "BNSD") return {b, n, s, d};
    if (layout == "TND") return {s, n, d};
    throw std::invalid_argument("unknown layout " + layout);
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths) {
    std::vector<int64_t> c(lengths.size());
    int64_t sum = 0;
    for (size_t i = 0; i < lengths.size(); ++i) c[i] = sum += lengths[i];
    return c;
}

float alibiSlope(int64_t n, int64_t heads) { return std::pow(2.0f, -8.0f * float(n + 1) / float(heads)); }

attnopsStatus getWorkspace(const FaInstance& inst, const FaArrays& arrays, uint64_t* ws, attnopsExecutor** exec) {
    const fa::ForwardArgs a = forwardArgs(inst, arrays);
    return attnopsFlashAttentionScoreGetWorkspaceSize(
        a.query, a.key, a.value, a.realShift, a.dropMask, a.paddingMask, a.attenMask, a.prefix, a.actualSeqQLen,
        a.actualSeqKvLen, a.qStartIdx, a.kvStartIdx, a.sink, a.scaleValue, a.keepProb, a.preTokens, a.nextTokens,
        a.headNum, a.inputLayout, a.innerPrecise, a.sparseMode, a.pseType, a.seed, a.offset, a.softmaxMax,
        a.softmaxSum, a.softmaxOut, a.attentionOut, ws, exec);
}

}  // namespace

// ---------------------------------------------------------------- call arguments

FaArrays::FaArrays(const FaInstance& inst) {
    const auto make = [](const std::vector<int64_t>& v, bool present, attnopsIntArray*& out) {
        if (present) check(attnopsCreateIntArray(v.data(), v.size(), &out), "attnopsCreateIntArray");
    };
    try {
        make(inst.prefix, !inst.prefix.empty(), prefix);
        make(inst.qCumulative, inst.problem.tnd(), qCumulative);
        make(inst.kvCumulative, inst.problem.tnd(), kvCumulative);
        make(inst.qStartIdx, !inst.qStartIdx.empty(), qStartIdx);
        make(inst.kvStartIdx, !inst.kvStartIdx.empty(), kvStartIdx);
    } catch (...) {
        release();
        throw;
    }
}

FaArrays::~FaArrays() { release(); }

void FaArrays::release() {
    for (attnopsIntArray* a : {prefix, qCumulative, kvCumulative, qStartIdx, kvStartIdx}) attnopsDestroyIntArray(a);
}

fa::ForwardArgs forwardArgs(const FaInstance& inst, const FaArrays& arrays) {
    const FaProblem& p = inst.problem;
    fa::ForwardArgs a;
    a.query = inst.query.handle();
    a.key = inst.key.handle();
    a.value = inst.value.handle();
    a.realShift = inst.pse.handle();
    a.dropMask = inst.dropMask.handle();
    a.attenMask = inst.attenMask.handle();
    a.prefix = arrays.prefix;
    a.actualSeqQLen = arrays.qCumulative;
    a.actualSeqKvLen = arrays.kvCumulative;
    a.qStartIdx = arrays.qStartIdx;
    a.kvStartIdx = arrays.kvStartIdx;
    a.sink = inst.sink.handle();
    a.scaleValue = p.effectiveScale();
    a.keepProb = p.keepProb;
    a.preTokens = p.preTokens;
    a.nextTokens = p.nextTokens;
    a.headNum = p.heads;
    a.inputLayout = p.layout.c_str();
    a.innerPrecise = p.innerPrecise;
    a.sparseMode = p.sparseMode;
    a.pseType = p.pseType < 0 ? 1 : p.pseType;
    a.seed = p.seed;
    a.offset = p.offset;
    a.softmaxMax = inst.softmaxMax.handle();
    a.softmaxSum = inst.softmaxSum.handle();
    a.attentionOut = inst.attentionOut.handle();
    return a;
}

// ---------------------------------------------------------------- HostTensor

HostTensor::HostTensor(attnopsDataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_.assign(size_t(numel()) * attnopsDataTypeSize(dtype), 0);
    check(attnopsCreateTensor(bytes_.empty() ? nullptr : bytes_.data(), dtype, int64_t(shape_.size()), shape_.data(),
                              nullptr, ATTNOPS_HOST_MEMORY, &handle_),
          "attnopsCreateTensor");
}

HostTensor::~HostTensor() { attnopsDestroyTensor(handle_); }

HostTensor::HostTensor(HostTensor&& o) noexcept
    : dtype_(o.dtype_), shape_(std::move(o.shape_)), bytes_(std::move(o.bytes_)), handle_(o.handle_) {
    o.handle_ = nullptr;
}

HostTensor& HostTensor::operator=(HostTensor&& o) noexcept {
    if (this != &o) {
        attnopsDestroyTensor(handle_);
        dtype_ = o.dtype_;
        shape_ = std::move(o.shape_);
        bytes_ = std::move(o.bytes_);
        handle_ = o.handle_;
        o.handle_ = nullptr;
    }
    return *this;
}

int64_t HostTensor::numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
}

float HostTensor::get(int64_t i) const {
    switch (dtype_) {
        case ATTNOPS_UINT8:
        case ATTNOPS_BOOL: return float(bytes_[size_t(i)]);
        case ATTNOPS_INT8: return float(int8_t(bytes_[size_t(i)]));
        default: return loadAsFloat(bytes_.data(), i, DType(int32_t(dtype_)));
    }
}

void HostTensor::set(int64_t i, float value) {
    switch (dtype_) {
        case ATTNOPS_UINT8:
        case ATTNOPS_BOOL: bytes_[size_t(i)] = value != 0.0f ? 1 : 0; break;
        default: storeFromFloat(bytes_.data(), i, DType(int32_t(dtype_)), value);
    }
}

// ---------------------------------------------------------------- FaProblem

double FaProblem::effectiveScale() const { return std::isnan(scale) ? 1.0 / std::sqrt(double(dim)) : scale; }

std::string FaProblem::resolvedMaskKind() const {
    if (maskKind != "auto") return maskKind;
    if (sparseMode >= 2 && sparseMode != 5) return "compressed";
    if (sparseMode == 5 || (sparseMode == 0 && (preTokens != kNoBand || nextTokens != kNoBand))) return "zeros";
    return "none";
}

double FaProblem::forwardFlops() const {
    fa::MaskSpec mask;  // a NULL attenMask means full attention whatever the mode
    const bool masked = resolvedMaskKind() != "none";
    mask.sparseMode = masked ? sparseMode : 1;
    mask.preTokens = masked ? preTokens : kNoBand;
    mask.nextTokens = masked ? nextTokens : kNoBand;
    mask.prefix = prefix;
    for (int64_t b = 0; b < sequenceCount(); ++b)
        if (qLen(b) > 0 && kvLen(b) > 0) {
            if (mask.firstNonEmpty < 0) mask.firstNonEmpty = b;
            mask.lastNonEmpty = b;
        }
    double kept = 0;
    for (int64_t b = 0; b < sequenceCount(); ++b) {
        const int64_t sq = qLen(b), skv = kvLen(b);
        if (mask.prefix.size() < size_t(b + 1)) mask.prefix.resize(size_t(b + 1), 0);
        const fa::SeqRule rule = fa::seqRule(mask, b, sq, skv);
        for (int64_t i = 0; i < sq; ++i) {
            const fa::KeyRange band = fa::rowBand(rule, i, skv);
            const int64_t prefixEnd = std::min(rule.prefix, skv);
            int64_t count = band.hi - band.lo;
            if (prefixEnd > 0) count += std::max<int64_t>(0, std::min(prefixEnd, band.lo));
            kept += double(count);
        }
    }
    return kept * double(heads) * 2.0 * double(dim + vdim());
}

std::string FaProblem::describe() const {
    std::string seqs = tnd() ? fmt::format("TND B={} T1={}", qSeqLens.size(), cumulative(qSeqLens).empty() ? 0 : cumulative(qSeqLens).back())
                             : fmt::format("{} B={} S1={} S2={}", layout, batch, qSeqLen, kvSeqLen);
    return fmt::format("{} N1={} N2={} D={} Dv={} {} mode={} pse={} keep={}{}", seqs, heads, kvHeads, dim, vdim(),
                       attnopsDataTypeName(dtype), sparseMode, pseType, keepProb, sink ? " sink" : "");
}

FaProblem fixed(const std::string& layout, attnopsDataType dt, int64_t b, int64_t s1, int64_t s2, int64_t n1,
                int64_t n2, int64_t d, int64_t dv) {
    FaProblem p;
    p.layout = layout;
    p.dtype = dt;
    p.batch = b;
    p.qSeqLen = s1;
    p.kvSeqLen = s2;
    p.heads = n1;
    p.kvHeads = n2;
    p.dim = d;
    p.vDim = dv;
    return p;
}

FaProblem tnd(attnopsDataType dt, std::vector<int64_t> q, std::vector<int64_t> kv, int64_t n1, int64_t n2, int64_t d,
              int64_t dv) {
    FaProblem p = fixed("TND", dt, 0, 0, 0, n1, n2, d, dv);
    p.qSeqLens = std::move(q);
    p.kvSeqLens = std::move(kv);
    return p;
}

FaProblem withMode(FaProblem p, int64_t mode, int64_t pre, int64_t next) {
    p.sparseMode = mode;
    p.preTokens = pre;
    p.nextTokens = next;
    return p;
}

FaProblem withPse(FaProblem p, int type, const char* shape) {
    p.pseType = type;
    p.pseShape = shape;
    return p;
}

// ---------------------------------------------------------------- FaInstance

FaInstance::FaInstance(const FaProblem& p) : problem(p) {
    Rng rng(p.dataSeed);
    const int64_t n1 = p.heads, n2 = p.kvHeads, d = p.dim, dv = p.vdim();
    int64_t s1 = p.qSeqLen, s2 = p.kvSeqLen, b = p.batch;
    if (p.tnd()) {
        if (p.qSeqLens.size() != p.kvSeqLens.size()) throw std::invalid_argument("q and kv sequence lists differ in length");
        qCumulative = cumulative(p.qSeqLens);
        kvCumulative = cumulative(p.kvSeqLens);
        s1 = (qCumulative.empty() ? 0 : qCumulative.back()) + p.extraQRows;
        s2 = (kvCumulative.empty() ? 0 : kvCumulative.back()) + p.extraKvRows;
        b = int64_t(p.qSeqLens.size());
    }
    query = HostTensor(p.dtype, layoutShape(p.layout, b, s1, n1, d));
    key = HostTensor(p.dtype, layoutShape(p.layout, b, s2, n2, d));
    value = HostTensor(p.dtype, layoutShape(p.layout, b, s2, n2, dv));
    fillRandom(query, rng, p.dataScale);
    fillRandom(key, rng, p.dataScale);
    fillRandom(value, rng, p.dataScale);

    const int64_t maxSq = p.tnd() ? (p.qSeqLens.empty() ? 0 : *std::max_element(p.qSeqLens.begin(), p.qSeqLens.end())) : s1;
    const int64_t maxSkv = p.tnd() ? (p.kvSeqLens.empty() ? 0 : *std::max_element(p.kvSeqLens.begin(), p.kvSeqLens.end())) : s2;

    if (p.pseType == 0 || p.pseType == 1) {
        if (p.pseShape == "compressed") {
            const int64_t w = maxSkv;
            pse = HostTensor(p.dtype, {1, n1, 1024, w});
            for (int64_t n = 0; n < n1; ++n)
                for (int64_t r = 0; r < 1024; ++r)
                    for (int64_t c = 0; c < w; ++c)
                        pse.set((n * 1024 + r) * w + c, -alibiSlope(n, n1) * float(std::llabs(c - (w - 1024 + r))));
        } else if (p.tnd()) {
            int64_t total = 0;
            for (size_t i = 0; i < p.qSeqLens.size(); ++i)
                total += n1 * (p.pseShape == "row" ? 1 : p.qSeqLens[i]) * p.kvSeqLens[i];
            pse = HostTensor(p.dtype, {total});
            fillRandom(pse, rng, 1.0);
        } else {
            pse = HostTensor(p.dtype, {b, n1, p.pseShape == "row" ? 1 : s1, s2});
            fillRandom(pse, rng, 1.0);
        }
    } else if (p.pseType == 2 || p.pseType == 3) {
        pse = HostTensor(ATTNOPS_FLOAT32, {n1});
        for (int64_t n = 0; n < n1; ++n) pse.set(n, alibiSlope(n, n1));
        qStartIdx = {0};
        kvStartIdx = {0};
    }

    const std::string maskKind = p.resolvedMaskKind();
    if (maskKind == "random" || maskKind == "causal" || maskKind == "zeros") {
        const std::vector<int64_t> shape = p.tnd() ? std::vector<int64_t>{maxSq, maxSkv}
                                                   : (maskKind == "random" ? std::vector<int64_t>{b, 1, s1, s2}
                                                                           : std::vector<int64_t>{s1, s2});
        attenMask = HostTensor(ATTNOPS_UINT8, shape);
        const int64_t rows = shape[shape.size() - 2], cols = shape.back();
        const int64_t planes = attenMask.numel() / std::max<int64_t>(1, rows * cols);
        for (int64_t pl = 0; pl < planes; ++pl)
            for (int64_t i = 0; i < rows; ++i)
                for (int64_t j = 0; j < cols; ++j) {
                    const bool masked = maskKind == "causal" ? j > i : maskKind == "random" && rng.uniform() < 0.3;
                    attenMask.set((pl * rows + i) * cols + j, masked ? 1.0f : 0.0f);
                }
    } else if (p.sparseMode >= 2 && p.sparseMode != 5 && maskKind == "compressed") {
        attenMask = HostTensor(ATTNOPS_UINT8, {p.sparseMode == 6 ? 3072 : 2048, 2048});
    }

    if (p.sparseMode == 5 || p.sparseMode == 6) {
        prefix = p.prefix;
        if (prefix.empty())
            for (int64_t i = 0; i < b; ++i) {
                const int64_t sq = p.qLen(i), skv = p.kvLen(i);
                const int64_t lo = sq > skv ? 0 : skv - sq;
                prefix.push_back(lo + (skv - lo) / 2);
            }
    }

    if (p.keepProb < 1.0 && p.explicitDropMask) dropMask = generatedDropMask(*this);

    if (p.sink) {
        sink = HostTensor(ATTNOPS_FLOAT32, {n1});
        fillRandom(sink, rng, 1.0);
    }
    allocateOutputs(*this);
}

void allocateOutputs(FaInstance& inst) {
    const FaProblem& p = inst.problem;
    const auto& qs = inst.query.shape();
    std::vector<int64_t> outShape = qs;
    if (p.layout == "BSH" || p.layout == "SBH")
        outShape.back() = p.heads * p.vdim();
    else
        outShape.back() = p.vdim();
    inst.attentionOut = HostTensor(p.dtype, outShape);
    if (p.statLanes > 0) {
        std::vector<int64_t> statShape;
        if (p.tnd()) {
            statShape = {qs[0], p.heads, p.statLanes};
        } else {
            const int64_t b = p.layout == "SBH" ? qs[1] : qs[0];
            const int64_t s = p.layout == "BSH" || p.layout == "BSND" ? qs[1] : (p.layout == "SBH" ? qs[0] : qs[2]);
            statShape = {b, p.heads, s, p.statLanes};
        }
        inst.softmaxMax = HostTensor(ATTNOPS_FLOAT32, statShape);
        inst.softmaxSum = HostTensor(ATTNOPS_FLOAT32, statShape);
    }
}

HostTensor generatedDropMask(const FaInstance& inst) {
    const FaProblem& p = inst.problem;
    const bool tnd = p.tnd();
    const int64_t b = tnd ? 0 : p.batch, s1 = tnd ? 0 : p.qSeqLen, s2 = tnd ? 0 : p.kvSeqLen;
    const FaArrays arrays(inst);
    uint64_t bytes = 0;
    check(attnopsFlashAttentionDropMaskBytes(b, p.heads, s1, s2, arrays.qCumulative, arrays.kvCumulative, &bytes),
          "attnopsFlashAttentionDropMaskBytes");
    HostTensor mask(ATTNOPS_UINT8, {int64_t(bytes)});
    check(attnopsFlashAttentionGenDropMask(b, p.heads, s1, s2, arrays.qCumulative, arrays.kvCumulative, p.keepProb,
                                           p.seed, p.offset, mask.handle()),
          "attnopsFlashAttentionGenDropMask");
    return mask;
}

attnopsStatus FaInstance::plan(uint64_t* workspaceSize, attnopsExecutor** executor) {
    const FaArrays a(*this);
    return getWorkspace(*this, a, workspaceSize, executor);
}

namespace {
std::string& lastImplementationName() {
    thread_local std::string name;
    return name;
}
}  // namespace

const std::string& lastImplementation() { return lastImplementationName(); }

attnopsStatus launchAndWait(attnopsStatus planned, uint64_t workspaceSize, attnopsExecutor* executor, LaunchFn launch,
                            attnopsStream* stream) {
    if (planned != ATTNOPS_SUCCESS) return planned;
    const char* implementation = nullptr;
    if (attnopsGetExecutorImplementation(executor, &implementation) == ATTNOPS_SUCCESS)
        lastImplementationName() = implementation;
    void* workspace = nullptr;
    attnopsStatus st = ATTNOPS_SUCCESS;
    if (workspaceSize > 0 && (st = attnopsMalloc(workspaceSize, &workspace)) != ATTNOPS_SUCCESS) {
        attnopsDestroyExecutor(executor);
        return st;
    }
    st = launch(workspace, workspaceSize, executor, stream);
    if (st == ATTNOPS_SUCCESS) st = attnopsStreamSynchronize(stream);
    attnopsFree(workspace);
    return st;
}

attnopsStatus FaInstance::runForward(attnopsStream* stream) {
    const FaArrays a(*this);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    attnopsStatus st = getWorkspace(*this, a, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsFlashAttentionScore, stream);
}

// ---------------------------------------------------------------- checking

double forwardTolerance(const FaProblem& p, double naiveError, double maxAbsReference, double scoreMagnitude) {
    if (p.dtype == ATTNOPS_FLOAT32) {
        const double u = std::ldexp(1.0, -24);
        const double skv = double(std::max(p.kvSeqLen, p.tnd() && !p.kvSeqLens.empty()
                                                            ? *std::max_element(p.kvSeqLens.begin(), p.kvSeqLens.end())
                                                            : 0));
        const double dropScale = p.keepProb < 1.0 ? 1.0 / p.keepProb : 1.0;
        return u * (4.0 * double(p.dim) * scoreMagnitude + 4.0 * skv + 64.0) * p.dataScale * dropScale + 1e-7;
    }
    return 2.0 * naiveError + 1e-5 * maxAbsReference + 1e-6;
}

RowCheck checkForwardRows(const FaInstance& inst, int64_t rows, uint64_t sampleSeed) {
    const FaProblem& pr = inst.problem;
    const FaArrays arrays(inst);
    const fa::ForwardArgs args = forwardArgs(inst, arrays);
    const fa::ForwardParams p = fa::checkForward(args, 0);

    // Bound on |scale * q.k| (Cauchy-Schwarz) plus the largest |pse|, for the fp32 rule.
    double maxQ = 0, maxK = 0, maxPse = 0;
    {
        const int64_t d = pr.dim;
        for (int64_t i = 0; i + d <= inst.query.numel(); i += d) {
            double s = 0;
            for (int64_t c = 0; c < d; ++c) s += double(inst.query.get(i + c)) * inst.query.get(i + c);
            maxQ = std::max(maxQ, std::sqrt(s));
        }
        for (int64_t i = 0; i + d <= inst.key.numel(); i += d) {
            double s = 0;
            for (int64_t c = 0; c < d; ++c) s += double(inst.key.get(i + c)) * inst.key.get(i + c);
            maxK = std::max(maxK, std::sqrt(s));
        }
        if ((pr.pseType == 0 || pr.pseType == 1) && !inst.pse.empty())
            for (int64_t i = 0; i < inst.pse.numel(); ++i) maxPse = std::max(maxPse, double(std::fabs(inst.pse.get(i))));
    }
    const double scoreMag = std::fabs(pr.effectiveScale()) * (maxQ * maxK + maxPse) + maxPse;

    // Rows to visit: every (sequence, head, row), or a deterministic sample.
    struct Row {
        int64_t b, n1, i;
    };
    std::vector<Row> visit;
    int64_t total = 0;
    for (int64_t b = 0; b < p.seq.count; ++b) total += p.seq.qLen[size_t(b)] * p.n1;
    auto rowAt = [&](int64_t flat) {
        for (int64_t b = 0; b < p.seq.count; ++b) {
            const int64_t n = p.seq.qLen[size_t(b)] * p.n1;
            if (flat < n) return Row{b, flat / p.seq.qLen[size_t(b)], flat % p.seq.qLen[size_t(b)]};
            flat -= n;
        }
        return Row{0, 0, 0};
    };
    if (rows < 0 || rows >= total) {
        for (int64_t b = 0; b < p.seq.count; ++b)
            for (int64_t n = 0; n < p.n1; ++n)
                for (int64_t i = 0; i < p.seq.qLen[size_t(b)]; ++i) visit.push_back({b, n, i});
    } else {
        Rng rng(sampleSeed);
        if (total > 0) {
            visit.push_back(rowAt(0));
            visit.push_back(rowAt(total - 1));
        }
        while (int64_t(visit.size()) < rows) visit.push_back(rowAt(int64_t(rng.next() % uint64_t(total))));
    }

    RowCheck rc;
    for (const Row& r : visit) {
        const fa::ReferenceRow ref = fa::referenceRow(p, r.b, r.n1, r.i);
        const std::vector<float> naive = pr.dtype == ATTNOPS_FLOAT32 ? std::vector<float>() : fa::naiveLowPrecisionRow(p, r.b, r.n1, r.i);
        const int64_t row = p.seq.qStart[size_t(r.b)] + r.i;
        for (int64_t c = 0; c < p.dv; ++c) {
            const double want = ref.out[size_t(c)];
            const double got = loadAsFloat(p.out.data, p.out.offset(r.b, r.n1, row, c), p.out.dtype);
            if (std::isnan(want) != std::isnan(got)) {
                rc.nanMismatch = true;
                if (rc.firstFailure.empty())
                    rc.firstFailure = fmt::format("NaN mismatch at b={} n1={} i={} c={}: got {} want {}", r.b, r.n1, r.i, c, got, want);
                continue;
            }
            if (std::isnan(want)) continue;
            const double err = std::fabs(got - want);
            if (err > rc.maxAbsError && !rc.nanMismatch)
                rc.firstFailure = fmt::format("largest error at b={} n1={} i={} c={}: got {} want {}", r.b, r.n1, r.i, c, got, want);
            rc.maxAbsError = std::max(rc.maxAbsError, err);
            rc.maxAbsReference = std::max(rc.maxAbsReference, std::fabs(want));
            if (!naive.empty()) rc.maxAbsNaiveError = std::max(rc.maxAbsNaiveError, std::fabs(double(naive[size_t(c)]) - want));
        }
        if (p.writeStats) {
            const double gotMax = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(r.b, r.n1, row, 0), DType::F32);
            const double gotSum = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(r.b, r.n1, row, 0), DType::F32);
            double eMax = 0;
            if (std::isinf(ref.max) || std::isinf(gotMax))
                eMax = (ref.max == gotMax) ? 0 : std::numeric_limits<double>::infinity();
            else
                eMax = std::fabs(gotMax - ref.max) / std::max(1.0, std::fabs(ref.max));
            double eSum = std::fabs(gotSum - ref.sum) / std::max(1.0, std::fabs(ref.sum));
            for (int64_t lane = 1; lane < p.statLanes; ++lane) {
                const double lm = loadAsFloat(p.softmaxMax.data, p.softmaxMax.offset(r.b, r.n1, row, lane), DType::F32);
                const double ls = loadAsFloat(p.softmaxSum.data, p.softmaxSum.offset(r.b, r.n1, row, lane), DType::F32);
                if (!(lm == gotMax || (std::isnan(lm) && std::isnan(gotMax)))) eMax = std::numeric_limits<double>::infinity();
                if (!(ls == gotSum || (std::isnan(ls) && std::isnan(gotSum)))) eSum = std::numeric_limits<double>::infinity();
            }
            if (!std::isnan(ref.max)) {
                rc.maxSoftmaxMaxError = std::max(rc.maxSoftmaxMaxError, eMax);
                rc.maxSoftmaxSumError = std::max(rc.maxSoftmaxSumError, eSum);
                rc.maxStatError = std::max(rc.maxStatError, std::max(eMax, eSum));
            }
        }
    }
    rc.rows = int64_t(visit.size());
    rc.tolerance = forwardTolerance(pr, rc.maxAbsNaiveError, rc.maxAbsReference, scoreMag);
    const double u = std::ldexp(1.0, -24);
    const double statTolerance = u * (4.0 * double(pr.dim) * scoreMag + 4.0 * double(std::max<int64_t>(1, p.seq.maxKvLen)) + 64.0);
    rc.statTolerance = statTolerance;
    rc.passed = !rc.nanMismatch && rc.maxAbsError <= rc.tolerance && rc.maxStatError <= statTolerance;
    if (rc.passed) rc.firstFailure.clear();
    else if (rc.maxStatError > statTolerance)
        rc.firstFailure += fmt::format(" statistics error {} > {}", rc.maxStatError, statTolerance);
    return rc;
}

}  // namespace attnops::tools
