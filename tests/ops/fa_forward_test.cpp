// FlashAttentionScore forward against the double reference: every layout, dtype, head geometry,
// length on and around the kernel's block edges, sparse mode, pse type, dropout, sink and
// statistics form; cross-checks that do not go through the shared mask rules; non-contiguous
// views; NaN/Inf inputs; determinism over thread counts, runs and implementations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "child_process.hpp"
#include "cpu/isa.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "threads_guard.hpp"

using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::fixed;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;
using attnops::tools::HostTensor;
using attnops::tools::kNoBand;

namespace {

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;
const float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------- helpers

// Outputs start as NaN bytes so that a row the kernel forgets to write cannot pass.
void poisonOutputs(FaInstance& inst) {
    for (HostTensor* t : {&inst.attentionOut, &inst.softmaxMax, &inst.softmaxSum})
        if (!t->empty()) std::fill(t->bytes().begin(), t->bytes().end(), uint8_t(0xFF));
}

// Element offset of attentionOut (b, n1, row, c); TND rows are absolute (b ignored).
int64_t outOffset(const FaInstance& inst, int64_t b, int64_t n, int64_t s, int64_t c) {
    const FaProblem& p = inst.problem;
    const auto& sh = inst.attentionOut.shape();
    const int64_t dv = p.vdim(), n1 = p.heads;
    if (p.layout == "BSH" || p.layout == "BSND") return ((b * sh[1] + s) * n1 + n) * dv + c;
    if (p.layout == "SBH") return ((s * sh[1] + b) * n1 + n) * dv + c;
    if (p.layout == "BNSD") return ((b * n1 + n) * sh[2] + s) * dv + c;
    return (s * n1 + n) * dv + c;  // TND
}

// Offset of statistic lane `lane` of (b, n1, row): [B,N1,S1,L] or [T1,N1,L].
int64_t statOffset(const FaInstance& inst, int64_t b, int64_t n, int64_t s, int64_t lane) {
    const auto& sh = inst.softmaxMax.shape();
    if (inst.problem.tnd()) return (s * sh[1] + n) * sh[2] + lane;
    return ((b * sh[1] + n) * sh[2] + s) * sh[3] + lane;
}

// Element offset of query (b, n1, row, c) in a contiguous layout (TND: b ignored).
int64_t qOffset(const FaInstance& inst, int64_t b, int64_t n, int64_t s, int64_t c) {
    const FaProblem& p = inst.problem;
    const auto& sh = inst.query.shape();
    const int64_t d = p.dim, n1 = p.heads;
    if (p.layout == "BSH" || p.layout == "BSND") return ((b * sh[1] + s) * n1 + n) * d + c;
    if (p.layout == "SBH") return ((s * sh[1] + b) * n1 + n) * d + c;
    if (p.layout == "BNSD") return ((b * n1 + n) * sh[2] + s) * d + c;
    return (s * n1 + n) * d + c;
}

// Element offset of key/value (b, n2, row, c) of head dim `dim` in BNSD.
int64_t kvOffsetBnsd(const FaInstance& inst, int64_t b, int64_t n, int64_t s, int64_t c, int64_t dim) {
    const auto& sh = inst.key.shape();
    return ((b * sh[1] + n) * sh[2] + s) * dim + c;
}

// The statistics rows of the tails and their attentionOut rows, checked directly.
void expectTndTails(const FaInstance& inst) {
    const FaProblem& p = inst.problem;
    if (!p.tnd()) return;
    int64_t used = 0;
    for (int64_t v : inst.qCumulative) used = std::max(used, v);
    const int64_t t1 = inst.query.shape()[0];
    for (int64_t row = used; row < t1; ++row)
        for (int64_t n = 0; n < p.heads; ++n) {
            for (int64_t c = 0; c < p.vdim(); ++c)
                ASSERT_EQ(inst.attentionOut.get(outOffset(inst, 0, n, row, c)), 0.0f) << "tail row " << row << " head " << n;
            if (inst.softmaxMax.empty()) continue;
            for (int64_t lane = 0; lane < p.statLanes; ++lane) {
                ASSERT_EQ(inst.softmaxMax.get(statOffset(inst, 0, n, row, lane)), kNegInf) << "tail row " << row;
                ASSERT_EQ(inst.softmaxSum.get(statOffset(inst, 0, n, row, lane)), 0.0f) << "tail row " << row;
            }
        }
}

void runInstance(FaInstance& inst) {
    poisonOutputs(inst);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << inst.problem.describe() << ": " << attnopsGetLastErrorMessage();
}

attnops::tools::RowCheck expectChecked(const FaInstance& inst, int64_t rows) {
    const auto rc = attnops::tools::checkForwardRows(inst, rows);
    EXPECT_TRUE(rc.passed) << inst.problem.describe() << ": err " << rc.maxAbsError << " tol " << rc.tolerance << " naive "
                           << rc.maxAbsNaiveError << " stat " << rc.maxStatError << (rc.nanMismatch ? " NaN mismatch" : "") << " " << rc.firstFailure;
    return rc;
}

void expectMatches(const FaProblem& p, int64_t rows = -1) {
    FaInstance inst(p);
    runInstance(inst);
    if (::testing::Test::HasFatalFailure()) return;
    expectChecked(inst, rows);
    expectTndTails(inst);
}

bool sameBytes(const HostTensor& a, const HostTensor& b) { return a.bytes() == b.bytes(); }

double maxAbsDiff(const HostTensor& a, const HostTensor& b) {
    double m = 0;
    for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::fabs(a.get(i) - b.get(i))));
    return m;
}

// An attnops int array for the duration of a call.
struct IntArray {
    attnopsIntArray* handle = nullptr;
    explicit IntArray(const std::vector<int64_t>& v) {
        EXPECT_EQ(attnopsCreateIntArray(v.data(), v.size(), &handle), ATTNOPS_SUCCESS);
    }
    ~IntArray() { attnopsDestroyIntArray(handle); }
    IntArray(const IntArray&) = delete;
    IntArray& operator=(const IntArray&) = delete;
};

// A tensor view with explicit strides over a buffer this object owns.
struct ViewTensor {
    std::vector<uint8_t> bytes;
    attnopsTensor* handle = nullptr;
    attnopsDataType dtype;
    ViewTensor(attnopsDataType dt, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
               int64_t storageElements, int64_t offsetElements = 0)
        : bytes(size_t(storageElements) * attnopsDataTypeSize(dt), 0xCD), dtype(dt) {
        EXPECT_EQ(attnopsCreateTensor(bytes.data() + offsetElements * attnopsDataTypeSize(dt), dt, int64_t(shape.size()),
                                      shape.data(), strides.data(), ATTNOPS_HOST_MEMORY, &handle),
                  ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
    }
    ~ViewTensor() { attnopsDestroyTensor(handle); }
    ViewTensor(const ViewTensor&) = delete;
    ViewTensor& operator=(const ViewTensor&) = delete;
    void copyElement(int64_t dst, const HostTensor& src, int64_t srcIndex) {
        const size_t es = attnopsDataTypeSize(dtype);
        std::memcpy(bytes.data() + size_t(dst) * es, src.bytes().data() + size_t(srcIndex) * es, es);
    }
};

// Every argument of one GetWorkspaceSize call, taken from an instance; fields may be replaced
// before run() (other views of the operands, other outputs).
struct Call {
    const attnopsTensor *q, *k, *v, *pse, *drop, *mask, *sink, *smax, *ssum, *out;
    std::unique_ptr<IntArray> prefix, qCum, kvCum, qStart, kvStart;
    FaProblem p;
    int64_t innerPrecise = 0;

    explicit Call(const FaInstance& inst)
        : q(inst.query.handle()), k(inst.key.handle()), v(inst.value.handle()), pse(inst.pse.handle()),
          drop(inst.dropMask.handle()), mask(inst.attenMask.handle()), sink(inst.sink.handle()),
          smax(inst.softmaxMax.handle()), ssum(inst.softmaxSum.handle()), out(inst.attentionOut.handle()), p(inst.problem) {
        if (!inst.prefix.empty()) prefix = std::make_unique<IntArray>(inst.prefix);
        if (p.tnd()) {
            qCum = std::make_unique<IntArray>(inst.qCumulative);
            kvCum = std::make_unique<IntArray>(inst.kvCumulative);
        }
        if (!inst.qStartIdx.empty()) qStart = std::make_unique<IntArray>(inst.qStartIdx);
        if (!inst.kvStartIdx.empty()) kvStart = std::make_unique<IntArray>(inst.kvStartIdx);
    }

    static attnopsIntArray* h(const std::unique_ptr<IntArray>& a) { return a ? a->handle : nullptr; }

    attnopsStatus run() const {
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        attnopsStatus st = attnopsFlashAttentionScoreGetWorkspaceSize(
            q, k, v, pse, drop, nullptr, mask, h(prefix), h(qCum), h(kvCum), h(qStart), h(kvStart), sink,
            p.effectiveScale(), p.keepProb, p.preTokens, p.nextTokens, p.heads, p.layout.c_str(), innerPrecise, p.sparseMode,
            p.pseType < 0 ? 1 : p.pseType, p.seed, p.offset, smax, ssum, nullptr, out, &ws, &exec);
        return attnops::tools::launchAndWait(st, ws, exec, attnopsFlashAttentionScore, nullptr);
    }
};




std::string dtName(attnopsDataType dt) { return dt == F32 ? "f32" : (dt == F16 ? "f16" : "bf16"); }

std::string tok(int64_t v) {
    if (v == kNoBand) return "inf";
    return v < 0 ? "m" + std::to_string(-v) : std::to_string(v);
}

// ---------------------------------------------------------------- the parameterised matrix

struct Case {
    std::string name;
    FaProblem problem;
    int64_t rows = -1;  // rows compared against the reference (-1: all)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << c.problem.describe() << ")"; }

class FaForwardMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(FaForwardMatrix, MatchesReference) { expectMatches(GetParam().problem, GetParam().rows); }

std::string caseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

std::vector<Case> layoutCases() {
    std::vector<Case> cases;
    for (const char* layout : {"BSH", "SBH", "BSND", "BNSD"})
        for (attnopsDataType dt : {F32, F16, BF16}) {
            cases.push_back({std::string(layout) + "_" + dtName(dt), fixed(layout, dt, 2, 65, 129, 4, 2, 64)});
            cases.push_back({std::string(layout) + "_" + dtName(dt) + "_causal",
                             withMode(fixed(layout, dt, 2, 129, 65, 4, 2, 64), 3)});
        }
    for (attnopsDataType dt : {F32, F16, BF16}) {
        FaProblem p = tnd(dt, {1, 64, 0, 65, 128}, {3, 64, 0, 129, 127}, 4, 2, 64);
        p.extraQRows = 3;
        p.extraKvRows = 2;
        cases.push_back({"TND_" + dtName(dt), p});
        cases.push_back({"TND_" + dtName(dt) + "_causal", withMode(p, 3)});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, FaForwardMatrix, ::testing::ValuesIn(layoutCases()), caseName);

std::vector<Case> headCases() {
    std::vector<Case> cases;
    // GQA (N1 = 8, N2 = 2) and MQA (N2 = 1) in folded, 4-D and packed layouts.
    cases.push_back({"GQA_BSH_bf16", fixed("BSH", BF16, 2, 70, 90, 8, 2, 32)});
    cases.push_back({"GQA_BNSD_f32_causal", withMode(fixed("BNSD", F32, 1, 70, 90, 8, 2, 32), 2)});
    cases.push_back({"GQA_TND_f16", tnd(F16, {10, 0, 70}, {20, 5, 66}, 8, 2, 32)});
    cases.push_back({"MQA_SBH_f16", fixed("SBH", F16, 2, 70, 90, 4, 1, 32)});
    cases.push_back({"MQA_BSND_f32", fixed("BSND", F32, 2, 70, 90, 4, 1, 32)});
    cases.push_back({"MQA_TND_bf16_causal", withMode(tnd(BF16, {10, 65, 1}, {20, 70, 1}, 4, 1, 32), 3)});
    // Dv < D, including folded layouts where value's hidden size is N2 * Dv.
    cases.push_back({"Dv_BSH_f32_64_32", fixed("BSH", F32, 2, 40, 70, 4, 2, 64, 32)});
    cases.push_back({"Dv_SBH_f16_256_128", fixed("SBH", F16, 1, 40, 70, 2, 1, 256, 128)});
    cases.push_back({"Dv_BNSD_bf16_128_64", fixed("BNSD", BF16, 2, 40, 70, 4, 2, 128, 64)});
    cases.push_back({"Dv_TND_f32_65_1", tnd(F32, {30, 0, 40}, {33, 2, 70}, 2, 2, 65, 1)});
    cases.push_back({"Dv_BSND_f32_768_512", fixed("BSND", F32, 1, 17, 40, 2, 1, 768, 512)});
    // Head dims on and around the block-size thresholds (64 keys per block up to D = 128, 32 up
    // to 256, 16 above).
    for (int64_t d : {1, 63, 64, 65, 127, 128, 129, 256, 257, 768})
        cases.push_back({"D" + std::to_string(d) + "_f32", fixed("BNSD", F32, 1, 33, 70, 2, 1, d)});
    for (int64_t d : {1, 65, 256, 768}) {
        cases.push_back({"D" + std::to_string(d) + "_bf16_causal", withMode(fixed("BSH", BF16, 1, 33, 70, 2, 1, d), 3)});
        cases.push_back({"D" + std::to_string(d) + "_f16", fixed("SBH", F16, 1, 33, 50, 2, 2, d)});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Heads, FaForwardMatrix, ::testing::ValuesIn(headCases()), caseName);

std::vector<Case> lengthCases() {
    std::vector<Case> cases;
    for (int64_t s : {1, 63, 64, 65, 127, 128, 129}) {
        const std::string n = std::to_string(s);
        cases.push_back({"S" + n + "_f32", fixed("BNSD", F32, 2, s, s, 2, 1, 32)});
        cases.push_back({"S" + n + "_bf16_causal", withMode(fixed("BSND", BF16, 1, s, s, 2, 2, 32), 2)});
    }
    const std::pair<int64_t, int64_t> rect[] = {{1, 129}, {129, 1}, {64, 127}, {127, 64}, {65, 128}, {200, 63}, {63, 200}};
    for (auto [s1, s2] : rect) {
        const std::string n = std::to_string(s1) + "x" + std::to_string(s2);
        cases.push_back({"S" + n + "_f32", fixed("BSH", F32, 1, s1, s2, 2, 1, 32)});
        cases.push_back({"S" + n + "_f16_mode3", withMode(fixed("BNSD", F16, 1, s1, s2, 2, 1, 32), 3)});
        cases.push_back({"S" + n + "_f32_mode2", withMode(fixed("SBH", F32, 2, s1, s2, 2, 2, 16), 2)});
    }
    // Empty problems: no rows (success, nothing written) and no keys (rows fully masked).
    cases.push_back({"Empty_B0", fixed("BNSD", F32, 0, 16, 16, 2, 1, 16)});
    cases.push_back({"Empty_S1_0", fixed("BSH", F32, 2, 0, 16, 2, 1, 16)});
    cases.push_back({"Empty_S2_0", fixed("BSND", BF16, 2, 16, 0, 2, 1, 16)});
    cases.push_back({"Empty_TND_all0", tnd(F32, {0, 0}, {0, 0}, 2, 1, 16)});
    cases.push_back({"Empty_TND_no_sequences_tails", [] {
                         FaProblem p = tnd(F32, {}, {}, 2, 1, 16);
                         p.extraQRows = 3;
                         p.extraKvRows = 2;
                         return p;
                     }()});
    cases.push_back({"Empty_Dv0", fixed("BNSD", F32, 2, 16, 20, 2, 1, 16, 0)});
    cases.push_back({"TND_3000_sequences", [] {
                         std::vector<int64_t> q, kv;
                         for (int64_t i = 0; i < 3000; ++i) {
                             q.push_back((i * 7) % 6);
                             kv.push_back((i * 5 + 3) % 7);
                         }
                         FaProblem p = withMode(tnd(BF16, q, kv, 2, 1, 16), 0, 3, 1);
                         p.extraQRows = 5;
                         return p;
                     }(),
                     600});
    // TND: zero-length sequences first/middle/last, length-1 sequences, Sq != Skv per sequence,
    // tails (rows beyond the last cumulative end) in q and kv.
    FaProblem z = tnd(F32, {0, 5, 64}, {0, 7, 64}, 2, 1, 32);
    cases.push_back({"TND_zero_first", z});
    z.qSeqLens = {3, 0, 65};
    z.kvSeqLens = {5, 0, 66};
    cases.push_back({"TND_zero_middle", z});
    z.qSeqLens = {64, 1, 0};
    z.kvSeqLens = {64, 3, 0};
    cases.push_back({"TND_zero_last", z});
    z.qSeqLens = {5, 9, 0};
    z.kvSeqLens = {0, 0, 7};  // queries without keys and keys without queries
    cases.push_back({"TND_q_without_kv", z});
    z.qSeqLens = {1, 1, 1, 1};
    z.kvSeqLens = {1, 1, 1, 1};
    cases.push_back({"TND_len1", z});
    cases.push_back({"TND_len1_causal", withMode(z, 3)});
    z.qSeqLens = {1, 70, 5, 129};
    z.kvSeqLens = {129, 5, 70, 1};
    cases.push_back({"TND_rect_bf16", [&] {
                         FaProblem q = z;
                         q.dtype = BF16;
                         return q;
                     }()});
    z.extraQRows = 7;
    z.extraKvRows = 3;
    cases.push_back({"TND_tails", z});
    z.statLanes = 1;
    cases.push_back({"TND_tails_lanes1", z});
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Lengths, FaForwardMatrix, ::testing::ValuesIn(lengthCases()), caseName);

std::vector<Case> sparseCases() {
    std::vector<Case> cases;
    const std::pair<int64_t, int64_t> sizes[] = {{65, 129}, {129, 65}, {128, 128}};
    const char* layouts[] = {"BNSD", "BSH", "SBH", "BSND"};
    int variant = 0;
    for (auto [s1, s2] : sizes)
    for (attnopsDataType dt : {F32, F16, BF16}) {
        const char* layout = layouts[variant++ % 4];
        const std::string sz = std::to_string(s1) + "x" + std::to_string(s2) + "_" + layout + "_" + dtName(dt);
        const FaProblem base = fixed(layout, dt, 2, s1, s2, 2, 1, 32);
        auto add = [&](const std::string& name, FaProblem p) { cases.push_back({name + "_" + sz, std::move(p)}); };
        const std::pair<int64_t, int64_t> bands[] = {{10, 5}, {-5, 20}, {30, -10}, {0, 0}, {kNoBand, 0}, {3, kNoBand}};
        for (auto [pre, next] : bands) add("m0_band_" + tok(pre) + "_" + tok(next), withMode(base, 0, pre, next));
        for (const char* kind : {"random", "causal"}) {
            FaProblem p = withMode(base, 0);
            p.maskKind = kind;
            add(std::string("m0_mask_") + kind, p);
            p = withMode(p, 0, 20, 20);
            add(std::string("m0_mask_band_") + kind, p);
        }
        {
            FaProblem p = withMode(base, 1);
            p.maskKind = "random";
            add("m1_random", p);
        }
        add("m2", withMode(base, 2));
        add("m3", withMode(base, 3));
        const std::pair<int64_t, int64_t> bands4[] = {{20, 3}, {-3, 10}, {5, -2}, {kNoBand, 0}};
        for (auto [pre, next] : bands4) add("m4_" + tok(pre) + "_" + tok(next), withMode(base, 4, pre, next));
        add("m5", withMode(base, 5));
        {
            FaProblem p = withMode(base, 5);
            p.maskKind = "random";
            add("m5_random", p);
            const int64_t lo = s1 > s2 ? 0 : s2 - s1;
            p.prefix = {lo, s2};
            add("m5_random_prefix_edges", p);
        }
        add("m6", withMode(base, 6));
        {
            FaProblem p = withMode(base, 6);
            const int64_t lo = s1 > s2 ? 0 : s2 - s1;
            p.prefix = {s2, lo};
            add("m6_prefix_edges", p);
        }
        for (int64_t mode : {2, 3, 4, 6}) {
            FaProblem p = withMode(base, mode, mode == 4 ? 40 : kNoBand, mode == 4 ? 0 : kNoBand);
            p.maskKind = "compressed";
            add("m" + std::to_string(mode) + "_compressed", p);
        }
    }
    // TND: zero-length first and last (modes 7/8 pick the last/first non-empty sequence), and a
    // list whose last sequence has Sq > Skv.
    const std::vector<int64_t> qa{0, 30, 65, 1, 0}, kva{0, 40, 70, 1, 0};
    const std::vector<int64_t> qb{64, 0, 129}, kvb{70, 5, 100};
    int set = 0;
    for (const auto& [q, kv] : {std::pair{qa, kva}, std::pair{qb, kvb}}) {
        const std::string sfx = set == 0 ? "_A" : "_B";
        const FaProblem base = tnd(set == 0 ? F32 : BF16, q, kv, 2, 1, 32);
        ++set;
        auto add = [&](const std::string& name, FaProblem p) { cases.push_back({"TND_" + name + sfx, std::move(p)}); };
        add("m0_band_10_5", withMode(base, 0, 10, 5));
        add("m0_band_m5_20", withMode(base, 0, -5, 20));
        add("m0_band_20_m5", withMode(base, 0, 20, -5));
        {
            FaProblem p = withMode(base, 0);
            p.maskKind = "random";
            add("m0_random", p);
            p.sparseMode = 1;
            add("m1_random", p);
        }
        add("m2", withMode(base, 2));
        add("m3", withMode(base, 3));
        add("m4_20_3", withMode(base, 4, 20, 3));
        add("m4_m3_10", withMode(base, 4, -3, 10));
        add("m6", withMode(base, 6));
        add("m7_50_0", withMode(base, 7, 50, 0));
        add("m7_5_m2", withMode(base, 7, 5, -2));
        add("m8_100_10", withMode(base, 8, 100, 10));
        add("m8_m2_7", withMode(base, 8, -2, 7));
        for (int64_t mode : {2, 3, 4, 6, 7, 8}) {
            FaProblem p = withMode(base, mode, mode == 4 || mode >= 7 ? 30 : kNoBand, mode == 4 || mode >= 7 ? 2 : kNoBand);
            p.maskKind = "compressed";
            add("m" + std::to_string(mode) + "_compressed", p);
        }
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(SparseModes, FaForwardMatrix, ::testing::ValuesIn(sparseCases()), caseName);

std::vector<Case> pseCases() {
    std::vector<Case> cases;
    cases.push_back({"pse1_full_BNSD_f32", withPse(fixed("BNSD", F32, 2, 65, 129, 2, 1, 32), 1, "full")});
    cases.push_back({"pse0_full_BSH_bf16", withPse(fixed("BSH", BF16, 2, 65, 129, 2, 1, 32), 0, "full")});
    cases.push_back({"pse1_row_BSND_f16_causal", withPse(withMode(fixed("BSND", F16, 2, 129, 65, 2, 2, 32), 3), 1, "row")});
    cases.push_back({"pse0_row_SBH_f32_band", withPse(withMode(fixed("SBH", F32, 2, 64, 64, 2, 1, 32), 0, 7, 3), 0, "row")});
    cases.push_back({"pse1_full_mode4_bf16", withPse(withMode(fixed("BNSD", BF16, 1, 64, 100, 2, 1, 32), 4, 10, 10), 1, "full")});
    // Compressed alibi: S > 1024 in a cheap configuration (D = 8, N = 1), lower-triangular masks.
    for (int64_t mode : {2, 3}) {
        FaProblem p = withMode(fixed("BNSD", F32, 1, 1100, 1100, 1, 1, 8), mode);
        cases.push_back({"pse1_compressed_alibi_m" + std::to_string(mode), withPse(p, 1, "compressed")});
    }
    cases.push_back({"pse0_compressed_alibi_m0_next0_bf16",
                     withPse(withMode(fixed("BSH", BF16, 2, 1100, 1100, 1, 1, 8), 0, kNoBand, 0), 0, "compressed"), 300});
    cases.push_back({"pse1_compressed_alibi_m0_band_f16",
                     withPse(withMode(fixed("SBH", F16, 1, 1030, 1030, 1, 1, 8), 0, 100, -3), 1, "compressed")});
    // TND forms: flattened [sum N1*Sq*Skv], row broadcast [sum N1*Skv], compressed 4-D.
    const FaProblem t = tnd(F32, {5, 64, 1, 70}, {9, 65, 1, 3}, 2, 1, 32);
    cases.push_back({"pse1_TND_full", withPse(t, 1, "full")});
    cases.push_back({"pse0_TND_full_bf16", withPse([&] {
                                                      FaProblem q = t;
                                                      q.dtype = BF16;
                                                      return q;
                                                  }(), 0, "full")});
    cases.push_back({"pse1_TND_row_causal", withPse(withMode(t, 3), 1, "row")});
    cases.push_back({"pse0_TND_row_m8", withPse(withMode(t, 8, 100, 4), 0, "row")});
    const FaProblem sq = tnd(F32, {5, 64, 100, 1}, {5, 64, 100, 1}, 2, 1, 16);
    cases.push_back({"pse1_TND_compressed_m3", withPse(withMode(sq, 3), 1, "compressed")});
    cases.push_back({"pse0_TND_compressed_m2_f16", withPse(withMode([&] {
                                                                        FaProblem q = sq;
                                                                        q.dtype = F16;
                                                                        return q;
                                                                    }(), 2),
                                                                    0, "compressed")});
    // Inner alibi slopes (pseType 2: linear distance, 3: square root).
    for (int type : {2, 3}) {
        const std::string n = std::to_string(type);
        cases.push_back({"pse" + n + "_BNSD_f32", withPse(fixed("BNSD", F32, 2, 65, 65, 4, 2, 32), type, "full")});
        cases.push_back({"pse" + n + "_BSH_bf16_causal", withPse(withMode(fixed("BSH", BF16, 1, 70, 129, 4, 1, 32), 3), type, "full")});
        cases.push_back({"pse" + n + "_TND_f16", withPse(tnd(F16, {5, 0, 64}, {5, 3, 64}, 2, 1, 32), type, "full")});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Pse, FaForwardMatrix, ::testing::ValuesIn(pseCases()), caseName);

std::vector<Case> featureCases() {
    std::vector<Case> cases;
    auto drop = [](FaProblem p, double keep, bool explicitMask) {
        p.keepProb = keep;
        p.explicitDropMask = explicitMask;
        p.seed = 1234;
        p.offset = 56;
        return p;
    };
    for (double keep : {0.5, 0.9})
        for (bool ex : {false, true}) {
            const std::string n = std::string(keep == 0.5 ? "k50" : "k90") + (ex ? "_explicit" : "_generated");
            cases.push_back({"drop_" + n + "_BNSD_f32", drop(fixed("BNSD", F32, 2, 65, 70, 2, 1, 32), keep, ex)});
            cases.push_back({"drop_" + n + "_BSH_bf16_causal", drop(withMode(fixed("BSH", BF16, 1, 70, 65, 4, 2, 32), 3), keep, ex)});
            cases.push_back({"drop_" + n + "_TND_f16", drop(tnd(F16, {5, 0, 64, 1}, {7, 3, 65, 1}, 2, 1, 32), keep, ex)});
        }
    auto sink = [](FaProblem p) {
        p.sink = true;
        return p;
    };
    cases.push_back({"sink_BNSD_f32", sink(fixed("BNSD", F32, 2, 65, 70, 4, 2, 32))});
    cases.push_back({"sink_BSH_bf16_mode3_masked_rows", sink(withMode(fixed("BSH", BF16, 1, 129, 64, 2, 1, 32), 3))});
    cases.push_back({"sink_TND_f32_mode2", sink(withMode(tnd(F32, {0, 65, 3}, {4, 70, 0}, 2, 1, 32), 2))});
    cases.push_back({"sink_drop_pse", [&] {
                         FaProblem p = sink(drop(fixed("SBH", F16, 1, 64, 65, 2, 1, 32), 0.8, false));
                         p.pseType = 1;
                         return p;
                     }()});
    cases.push_back({"drop_k01_BNSD_f32", drop(fixed("BNSD", F32, 1, 64, 129, 2, 1, 32), 0.01, false)});
    cases.push_back({"heads64_mqa_BSND_bf16", fixed("BSND", BF16, 1, 17, 33, 64, 1, 16)});
    cases.push_back({"heads16_gqa4_TND_f32_m6", withMode(tnd(F32, {3, 0, 20}, {9, 4, 20}, 16, 4, 16), 6)});
    cases.push_back({"pse1_TND_full_with_empty", [] {
                         FaProblem p = tnd(F32, {5, 0, 30, 2}, {0, 4, 31, 2}, 2, 1, 16);
                         p.pseType = 1;
                         return p;
                     }()});
    FaProblem lanes = fixed("BSND", F32, 2, 65, 65, 2, 1, 32);
    lanes.statLanes = 1;
    cases.push_back({"stats_lanes1", lanes});
    lanes.statLanes = 0;
    cases.push_back({"stats_none", lanes});
    FaProblem scaled = fixed("BNSD", BF16, 1, 65, 65, 2, 1, 32);
    scaled.scale = 1.0;  // attnops' C API default: no implicit 1/sqrt(D)
    scaled.dataScale = 2.0;
    cases.push_back({"scale1_data2_bf16", scaled});
    scaled.scale = -0.3;
    scaled.dtype = F32;
    cases.push_back({"scale_negative_f32", scaled});
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Features, FaForwardMatrix, ::testing::ValuesIn(featureCases()), caseName);

// Larger problems (many query blocks, many work chunks per thread), sampled rows.
std::vector<Case> largeCases() {
    std::vector<Case> cases;
    cases.push_back({"BNSD_bf16_causal_S700_D128", withMode(fixed("BNSD", BF16, 1, 700, 700, 4, 2, 128), 2), 256});
    cases.push_back({"TND_f16_mode3_D64", withMode(tnd(F16, {513, 0, 300, 1000}, {513, 7, 301, 1000}, 4, 1, 64), 3), 256});
    cases.push_back({"BSH_f32_mode4_D96", withMode(fixed("BSH", F32, 2, 600, 900, 2, 2, 96), 4, 100, 50), 200});
    cases.push_back({"SBH_bf16_D256_dropout", [] {
                         FaProblem p = fixed("SBH", BF16, 1, 400, 400, 2, 1, 256);
                         p.keepProb = 0.9;
                         p.seed = 5;
                         return p;
                     }(),
                     128});
    cases.push_back({"BSND_f32_D768_pse", [] {
                         FaProblem p = fixed("BSND", F32, 1, 150, 170, 2, 1, 768);
                         p.pseType = 0;
                         return p;
                     }(),
                     64});
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Large, FaForwardMatrix, ::testing::ValuesIn(largeCases()), caseName);

// Random combinations of everything above (deterministic): layout, dtype, GQA, D/Dv, lengths
// around the block edges, sparse mode and tokens, explicit/compressed masks, pse, dropout, sink,
// statistics lanes, TND tails.
std::vector<Case> randomCases() {
    std::vector<Case> cases;
    uint64_t state = 0x5EED;
    auto next = [&](uint64_t n) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return int64_t((state >> 33) % n);
    };
    auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + next(v.size())); };
    const char* layouts[] = {"BSH", "SBH", "BSND", "BNSD", "TND"};
    const attnopsDataType dtypes[] = {F32, F16, BF16};
    for (int c = 0; c < 500; ++c) {
        FaProblem p;
        p.layout = layouts[next(5)];
        p.dtype = dtypes[next(3)];
        p.kvHeads = pick({1, 2});
        p.heads = p.kvHeads * pick({1, 2, 4});
        p.dim = pick({1, 8, 31, 64, 65, 128, 129, 200, 256, 300});
        p.vDim = next(3) == 0 ? 1 + next(uint64_t(p.dim)) : -1;
        auto len = [&] { return pick({1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129}); };
        if (p.tnd()) {
            const int64_t n = 1 + next(4);
            for (int64_t i = 0; i < n; ++i) {
                p.qSeqLens.push_back(next(5) == 0 ? 0 : len());
                p.kvSeqLens.push_back(next(5) == 0 ? 0 : len());
            }
            p.extraQRows = next(2) * next(5);
            p.extraKvRows = next(2) * next(5);
        } else {
            p.batch = 1 + next(3);
            p.qSeqLen = len();
            p.kvSeqLen = len();
        }
        const std::vector<int64_t> modes = p.tnd() ? std::vector<int64_t>{0, 1, 2, 3, 4, 6, 7, 8}
                                                   : std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6};
        p.sparseMode = modes[size_t(next(modes.size()))];
        if (p.sparseMode == 0 || p.sparseMode == 4 || p.sparseMode >= 7) {
            p.preTokens = pick({-20, -1, 0, 5, 64, 200, kNoBand});
            p.nextTokens = pick({-20, -1, 0, 5, 64, 200, kNoBand});
            if (p.preTokens + p.nextTokens < 0) p.nextTokens = -p.preTokens + next(10);
        }
        if (p.sparseMode == 1) p.maskKind = next(2) ? "random" : "causal";
        else if (p.sparseMode == 0 || p.sparseMode == 5) p.maskKind = pick({0, 0, 1, 2}) == 1 ? "random" : (next(4) == 0 ? "causal" : "auto");
        else if (next(3) == 0) p.maskKind = "compressed";
        const int64_t pse = next(6);  // 0-1: none, 2: pse 0, 3: pse 1, 4: slopes 2, 5: slopes 3
        if (pse >= 2) {
            p.pseType = int(pse - 2);
            p.pseShape = next(2) ? "full" : "row";
        }
        if (next(3) == 0) {
            p.keepProb = pick({5, 8, 9}) / 10.0;
            p.explicitDropMask = next(2);
            p.seed = next(1000);
            p.offset = next(1000);
        }
        p.sink = next(4) == 0;
        p.statLanes = pick({8, 8, 1, 0});
        p.dataSeed = uint64_t(c) + 100;
        cases.push_back({"r" + std::to_string(c) + "_" + p.layout + "_" + dtName(p.dtype) + "_m" + std::to_string(p.sparseMode), p, 160});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Random, FaForwardMatrix, ::testing::ValuesIn(randomCases()), caseName);

// The AMX kernel over the matrix: "amx-emulated", the kernel on the tile emulator, on every
// machine, and "amx" where the CPU grants AMX (listed only there: hundreds of skipped cases cost
// a process start each). Both multiply 16-bit operands only, so the fp32 cases run as bf16.
struct ImplCase {
    std::string impl;
    Case c;
};

void PrintTo(const ImplCase& c, std::ostream* os) { *os << c.impl << " " << c.c.name << " (" << c.c.problem.describe() << ")"; }

class FaForwardAmxMatrix : public ::testing::TestWithParam<ImplCase> {};

TEST_P(FaForwardAmxMatrix, MatchesReference) {
    const ImplCase& ic = GetParam();
    FaInstance inst(ic.c.problem);
    poisonOutputs(inst);
    attnopsStatus st;
    {
        attnops::testsupport::ForcedImpl force(ic.impl.c_str());
        st = inst.runForward();
    }
    if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) GTEST_SKIP() << ic.impl << ": " << attnopsGetLastErrorMessage();
    if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && ic.impl == "amx" && ic.c.problem.dtype == F16)
        GTEST_SKIP() << "amx takes fp16 only on CPUs with AMX-FP16";
    ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    expectChecked(inst, ic.c.rows);
    expectTndTails(inst);
}

std::vector<ImplCase> amxCases() {
    std::vector<ImplCase> cases;
    for (const char* impl : {"amx", "amx-emulated"}) {
        if (std::string(impl) == "amx" && !attnops::cpu::isa().amxGranted) continue;
        for (const auto& list : {layoutCases(), headCases(), lengthCases(), sparseCases(), pseCases(), featureCases()})
            for (const Case& c : list) {
                Case bf = c;
                if (c.problem.dtype == F32) {
                    bf.name += "_as_bf16";
                    bf.problem.dtype = BF16;
                }
                cases.push_back({impl, bf});
            }
    }
    return cases;
}

std::string amxCaseName(const ::testing::TestParamInfo<ImplCase>& info) {
    return (info.param.impl == "amx" ? "amx_" : "emulated_") + info.param.c.name;
}

INSTANTIATE_TEST_SUITE_P(Amx, FaForwardAmxMatrix, ::testing::ValuesIn(amxCases()), amxCaseName);

// ---------------------------------------------------------------- explicit mask forms

void expectMaskedRow(const FaInstance& inst, int64_t b, int64_t n, int64_t i);

TEST(FaForwardMask, BroadcastFormsAndDtypesAgree) {
    // One random [S1,S2] pattern given as [S1,S2], [1,1,S1,S2], [B,1,S1,S2] and [B,N1,S1,S2],
    // as bool and as uint8 with nonzero values other than 1: all bitwise equal.
    const int64_t b = 2, n1 = 2, s1 = 65, s2 = 70;
    FaProblem p = fixed("BSND", BF16, b, s1, s2, n1, 1, 16);
    p.maskKind = "causal";
    FaInstance base(p);
    for (int64_t e = 0; e < s1 * s2; ++e) base.attenMask.set(e, ((e * 7919) % 11) < 4 ? 1.0f : 0.0f);
    runInstance(base);
    expectChecked(base, -1);
    const std::vector<std::vector<int64_t>> shapes{{1, 1, s1, s2}, {b, 1, s1, s2}, {b, n1, s1, s2}};
    for (const auto& shape : shapes)
        for (attnopsDataType dt : {ATTNOPS_BOOL, ATTNOPS_UINT8}) {
            FaInstance other(p);
            other.attenMask = HostTensor(dt, shape);
            for (int64_t e = 0; e < other.attenMask.numel(); ++e)
                other.attenMask.bytes()[size_t(e)] = base.attenMask.bytes()[size_t(e % (s1 * s2))] * (dt == ATTNOPS_UINT8 ? 9 : 1);
            runInstance(other);
            EXPECT_TRUE(sameBytes(base.attentionOut, other.attentionOut)) << shape.size() << " " << shape[0] << " " << shape[1];
            EXPECT_TRUE(sameBytes(base.softmaxSum, other.softmaxSum));
        }
}

TEST(FaForwardMask, PerHeadAndPerBatchMasks) {
    // [B,N1,S1,S2] with a different pattern in every (b, n1): against the reference, and head 1
    // of batch 1 fully masked.
    const int64_t b = 2, n1 = 4, s1 = 40, s2 = 65;
    for (int64_t mode : {0, 1, 5}) {
        FaProblem p = withMode(fixed("BNSD", F32, b, s1, s2, n1, 2, 16), mode);
        p.maskKind = "random";
        p.sink = mode == 5;
        FaInstance inst(p);
        inst.attenMask = HostTensor(ATTNOPS_UINT8, {b, n1, s1, s2});
        for (int64_t e = 0; e < inst.attenMask.numel(); ++e) inst.attenMask.set(e, ((e * 2654435761u) >> 7) % 3 == 0 ? 1.0f : 0.0f);
        for (int64_t e = 0; e < s1 * s2; ++e) inst.attenMask.set((1 * n1 + 1) * s1 * s2 + e, 1.0f);
        runInstance(inst);
        expectChecked(inst, -1);
        for (int64_t i = 0; i < s1; ++i) expectMaskedRow(inst, 1, 1, i);
    }
}

// ---------------------------------------------------------------- cross-checks without semantics.hpp

// Runs two instances and checks that both match the reference and agree with each other within
// the sum of their bounds (|a - b| <= |a - ref| + |ref - b|).
void expectAgree(FaInstance& a, FaInstance& b) {
    runInstance(a);
    runInstance(b);
    if (::testing::Test::HasFatalFailure()) return;
    const auto ra = expectChecked(a, -1), rb = expectChecked(b, -1);
    EXPECT_LE(maxAbsDiff(a.attentionOut, b.attentionOut), ra.tolerance + rb.tolerance)
        << a.problem.describe() << " vs " << b.problem.describe();
    if (!a.softmaxMax.empty()) {
        for (int64_t i = 0; i < a.softmaxMax.numel(); ++i) {
            const float ma = a.softmaxMax.get(i), mb = b.softmaxMax.get(i);
            ASSERT_TRUE(ma == mb || std::fabs(ma - mb) <= 1e-5f * std::max(1.0f, std::fabs(ma))) << i << ": " << ma << " " << mb;
            ASSERT_NEAR(a.softmaxSum.get(i), b.softmaxSum.get(i), 1e-5f * std::max(1.0f, std::fabs(a.softmaxSum.get(i))));
        }
    }
}

TEST(FaForwardCross, Mode2EqualsMode0WithExplicitCausalMask) {
    for (auto [s1, s2] : {std::pair<int64_t, int64_t>{65, 129}, {129, 65}, {128, 128}}) {
        FaProblem m2 = withMode(fixed("BNSD", F32, 1, s1, s2, 2, 1, 32), 2);
        FaProblem m0 = withMode(m2, 0);
        m0.maskKind = "causal";  // [S1,S2], masked iff j > i
        FaInstance a(m2), b(m0);
        expectAgree(a, b);
        // And with tokens alone: top-left band pre = inf, next = 0.
        FaInstance c(withMode(m2, 0, kNoBand, 0));
        runInstance(c);
        EXPECT_LE(maxAbsDiff(a.attentionOut, c.attentionOut), 2 * expectChecked(c, -1).tolerance);
    }
}

TEST(FaForwardCross, Mode2FirstRowIsFirstValueRow) {
    // Row 0 keeps key 0 alone: its probability is exactly 1, so out row 0 = value row 0.
    FaInstance inst(withMode(fixed("BNSD", BF16, 1, 70, 90, 2, 1, 32), 2));
    runInstance(inst);
    for (int64_t n = 0; n < 2; ++n)
        for (int64_t c = 0; c < 32; ++c)
            EXPECT_EQ(inst.attentionOut.get(outOffset(inst, 0, n, 0, c)), inst.value.get(kvOffsetBnsd(inst, 0, 0, 0, c, 32)));
}

TEST(FaForwardCross, Mode3EqualsTopLeftBand) {
    // Sq < Skv: bottom-right causal is the top-left band pre = Sq (or more), next = Skv - Sq.
    for (auto [s1, s2] : {std::pair<int64_t, int64_t>{65, 129}, {1, 70}, {64, 65}}) {
        FaProblem m3 = withMode(fixed("BSH", F16, 2, s1, s2, 2, 2, 32), 3);
        FaInstance a(m3), b(withMode(m3, 0, s1, s2 - s1));
        expectAgree(a, b);
    }
}

TEST(FaForwardCross, Mode4EqualsConvertedMode0) {
    // Bottom-right band (pre, next) == top-left band (pre + Sq - Skv, next + Skv - Sq).
    const int64_t bands[][2] = {{20, 3}, {-3, 10}, {5, -2}, {100, 0}};
    for (auto [s1, s2] : {std::pair<int64_t, int64_t>{65, 129}, {129, 65}}) {
        for (const auto& band : bands) {
            const int64_t pre = band[0], next = band[1];
            FaProblem m4 = withMode(fixed("BNSD", F32, 1, s1, s2, 2, 1, 32), 4, pre, next);
            FaInstance a(m4), b(withMode(m4, 0, pre + s1 - s2, next + s2 - s1));
            expectAgree(a, b);
        }
    }
}

TEST(FaForwardCross, PrefixMode5EqualsExplicitMask) {
    // Mode 5 with an all-zero mask: kept iff j <= i + Skv - Sq or j < prefix. Build that mask by hand.
    const int64_t s1 = 65, s2 = 129;
    FaProblem m5 = withMode(fixed("BNSD", F32, 1, s1, s2, 2, 1, 32), 5);
    m5.prefix = {s2 - s1 + 20};
    FaProblem m0 = withMode(m5, 0);
    m0.prefix.clear();
    m0.maskKind = "causal";
    FaInstance a(m5), b(m0);
    for (int64_t i = 0; i < s1; ++i)
        for (int64_t j = 0; j < s2; ++j) b.attenMask.set(i * s2 + j, (j <= i + s2 - s1 || j < m5.prefix[0]) ? 0.0f : 1.0f);
    expectAgree(a, b);
}

// ---------------------------------------------------------------- a NULL attenMask (spec section 0)

// Runs p without an attenMask and expects the bits of full attention (mode 1, no mask).
void expectFullAttention(FaProblem p, const std::string& what) {
    p.maskKind = "none";
    FaInstance inst(p), full(withMode(p, 1));
    runInstance(inst);
    runInstance(full);
    if (::testing::Test::HasFatalFailure()) return;
    expectChecked(inst, -1);
    EXPECT_TRUE(sameBytes(inst.attentionOut, full.attentionOut)) << what;
    EXPECT_TRUE(sameBytes(inst.softmaxMax, full.softmaxMax)) << what;
    EXPECT_TRUE(sameBytes(inst.softmaxSum, full.softmaxSum)) << what;
}

TEST(FaForwardNullMask, EveryModeIsFullAttention) {
    // Whatever the mode and tokens (here a band that a mask would make narrow, and one that
    // would be empty), no mask means no masking.
    const FaProblem base = fixed("BNSD", F32, 2, 37, 70, 4, 2, 16);
    for (int64_t mode : {0, 2, 3, 4, 5, 6}) {
        for (auto [pre, next] : {std::pair<int64_t, int64_t>{3, -1}, {-5, -5}}) {
            FaProblem p = withMode(base, mode, pre, next);
            if (mode >= 5) p.prefix = {40, 50};
            expectFullAttention(p, "mode " + std::to_string(mode) + " pre " + tok(pre) + " next " + tok(next));
        }
    }
    const FaProblem packed = tnd(BF16, {5, 0, 9, 70}, {6, 3, 9, 64}, 2, 1, 8);
    for (int64_t mode : {2, 3, 4, 7, 8}) expectFullAttention(withMode(packed, mode, 2, -1), "TND mode " + std::to_string(mode));
}

TEST(FaForwardNullMask, MindSpeedRingCallPatterns) {
    // The kernel calls of MindSpeed's ring attention on SBH shards of 2 chunks of c tokens
    // (shared/context-parallel.md 2.3): an earlier rank's K/V, all queries x its first chunk
    // (Sq = 2 Skv), mode 0 with pre = next = Skv and no mask; a later rank's K/V, the second query
    // chunk x all of it; non-causal blocks, mode 1 without a mask: full attention, all three.
    // Diagonal blocks: mode 3 with the compressed mask, causal.
    const int64_t c = 48;
    for (attnopsDataType dt : {F32, BF16}) {
        const FaProblem earlier = withMode(fixed("SBH", dt, 2, 2 * c, c, 4, 4, 32), 0, c, c);
        const FaProblem later = withMode(fixed("SBH", dt, 2, c, 2 * c, 4, 4, 32), 0, 2 * c, 2 * c);
        const FaProblem general = withMode(fixed("SBH", dt, 2, 2 * c, 2 * c, 4, 4, 32), 1);
        for (const FaProblem& p : {earlier, later, general}) expectFullAttention(p, p.describe());
        FaProblem diagonal = withMode(fixed("SBH", dt, 2, 2 * c, 2 * c, 4, 4, 32), 3, 2 * c, 0);
        diagonal.maskKind = "compressed";
        FaProblem causal = withMode(diagonal, 0);
        causal.maskKind = "causal";
        FaInstance a(diagonal), b(causal);
        expectAgree(a, b);
    }
}

TEST(FaForwardNullMaskChild, DISABLED_WarnsOncePerProcess) {
    // Runs in a child process (the warning is once per process): three causal modes without a mask.
    for (int64_t mode : {3, 2, 7}) {
        FaProblem p = withMode(mode == 7 ? tnd(F32, {4, 6}, {4, 6}, 2, 1, 8) : fixed("BNSD", F32, 1, 8, 8, 2, 1, 8), mode);
        p.maskKind = "none";
        FaInstance inst(p);
        runInstance(inst);
    }
}

TEST(FaForwardNullMask, WarnsOncePerProcess) {
    const auto r = attnops::testing::runChild("FaForwardNullMaskChild.DISABLED_WarnsOncePerProcess", {});
    EXPECT_EQ(r.exitCode, 0) << r.output;
    const std::string warning = "attnops warning: sparseMode = 3 with attenMask = NULL: no masking is applied";
    const size_t first = r.output.find(warning);
    EXPECT_NE(first, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("attnops warning", first + 1), std::string::npos) << r.output;
}

// Rows with no key: out = 0, max = -inf, sum = 0; with a sink: max = sink, sum = 1.
void expectMaskedRow(const FaInstance& inst, int64_t b, int64_t n, int64_t i) {
    for (int64_t c = 0; c < inst.problem.vdim(); ++c)
        ASSERT_EQ(inst.attentionOut.get(outOffset(inst, b, n, i, c)), 0.0f) << "b " << b << " n " << n << " i " << i;
    for (int64_t lane = 0; lane < inst.problem.statLanes; ++lane) {
        const float m = inst.softmaxMax.get(statOffset(inst, b, n, i, lane));
        const float l = inst.softmaxSum.get(statOffset(inst, b, n, i, lane));
        if (inst.problem.sink) {
            ASSERT_EQ(m, inst.sink.get(n)) << "row " << i;
            ASSERT_EQ(l, 1.0f) << "row " << i;
        } else {
            ASSERT_EQ(m, kNegInf) << "row " << i;
            ASSERT_EQ(l, 0.0f) << "row " << i;
        }
    }
}

void expectLiveRow(const FaInstance& inst, int64_t b, int64_t n, int64_t i) {
    const float m = inst.softmaxMax.get(statOffset(inst, b, n, i, 0));
    ASSERT_TRUE(std::isfinite(m)) << "row " << i;
    ASSERT_GT(inst.softmaxSum.get(statOffset(inst, b, n, i, 0)), 0.0f) << "row " << i;
}

TEST(FaForwardCross, FullyMaskedRowsMode3SqGreaterThanSkv) {
    for (bool sink : {false, true})
        for (attnopsDataType dt : {F32, BF16}) {
            FaProblem p = withMode(fixed("BSND", dt, 2, 129, 40, 2, 1, 32), 3);
            p.sink = sink;
            FaInstance inst(p);
            runInstance(inst);
            expectChecked(inst, -1);
            for (int64_t b = 0; b < 2; ++b)
                for (int64_t n = 0; n < 2; ++n) {
                    for (int64_t i = 0; i < 129 - 40; ++i) expectMaskedRow(inst, b, n, i);
                    for (int64_t i = 129 - 40; i < 129; ++i) expectLiveRow(inst, b, n, i);
                }
        }
}

TEST(FaForwardCross, FullyMaskedRowsOutsideBand) {
    // Top-left band pre = 10, next = 0 with Sq = 100 > Skv = 20: rows i > 29 keep no key.
    // Band pre = -5, next = 10 excludes rows i > Skv - 1 - 5.
    for (bool sink : {false, true}) {
        FaProblem p = withMode(fixed("BNSD", F32, 1, 100, 20, 2, 1, 16), 0, 10, 0);
        p.sink = sink;
        FaInstance inst(p);
        runInstance(inst);
        expectChecked(inst, -1);
        for (int64_t n = 0; n < 2; ++n) {
            for (int64_t i = 0; i < 30; ++i) expectLiveRow(inst, 0, n, i);
            for (int64_t i = 30; i < 100; ++i) expectMaskedRow(inst, 0, n, i);
        }
        FaInstance inst2(withMode(p, 0, -5, 10));
        runInstance(inst2);
        expectChecked(inst2, -1);
        for (int64_t n = 0; n < 2; ++n) {
            for (int64_t i = 0; i < 15; ++i) expectLiveRow(inst2, 0, n, i);
            for (int64_t i = 15; i < 100; ++i) expectMaskedRow(inst2, 0, n, i);
        }
    }
}

TEST(FaForwardCross, FullyMaskedRowsTndAndExplicitMask) {
    // TND mode 3 with a sequence Sq > Skv, and an explicit mask with an all-ones row.
    FaProblem p = withMode(tnd(F32, {10, 40}, {30, 5}, 2, 1, 16), 3);
    p.sink = true;
    FaInstance inst(p);
    runInstance(inst);
    expectChecked(inst, -1);
    for (int64_t n = 0; n < 2; ++n) {
        for (int64_t i = 10; i < 10 + 35; ++i) expectMaskedRow(inst, 0, n, i);
        for (int64_t i = 45; i < 50; ++i) expectLiveRow(inst, 0, n, i);
    }
    FaProblem q = fixed("BNSD", BF16, 1, 20, 30, 2, 1, 16);
    q.maskKind = "causal";
    FaInstance inst2(q);
    for (int64_t j = 0; j < 30; ++j) inst2.attenMask.set(7 * 30 + j, 1.0f);
    runInstance(inst2);
    expectChecked(inst2, -1);
    for (int64_t n = 0; n < 2; ++n) expectMaskedRow(inst2, 0, n, 7);
}

TEST(FaForwardCross, CompressedAlibiEqualsDenseAlibi) {
    // The compressed [1,N1,1024,S] form reads row 1023 at column S-1-(i-j); a dense pse with the
    // same Toeplitz values must give bitwise the same result.
    FaProblem p = withMode(fixed("BNSD", F32, 2, 1100, 1100, 1, 1, 8), 3);
    p.pseType = 1;
    p.pseShape = "compressed";
    FaInstance comp(p);
    FaInstance dense(p);
    dense.pse = HostTensor(F32, {1, 1, 1100, 1100});
    for (int64_t i = 0; i < 1100; ++i)
        for (int64_t j = 0; j < 1100; ++j)
            dense.pse.set(i * 1100 + j, j <= i ? comp.pse.get(1023 * 1100 + (1100 - 1 - (i - j))) : 0.0f);
    runInstance(comp);
    runInstance(dense);
    expectChecked(comp, 200);
    expectChecked(dense, 200);
    EXPECT_TRUE(sameBytes(comp.attentionOut, dense.attentionOut));
    EXPECT_TRUE(sameBytes(comp.softmaxMax, dense.softmaxMax));
    // Alibi values: pse(i, j) = -slope * (i - j) with slope 2^-8 for N1 = 1.
    EXPECT_FLOAT_EQ(dense.pse.get(1099 * 1100 + 99), -std::ldexp(1.0f, -8) * 1000.0f);
}

// ---------------------------------------------------------------- pse forms built here

TEST(FaForwardPse, BatchBroadcastEqualsRepeated) {
    for (int type : {0, 1}) {
        FaProblem p = fixed("BNSD", F32, 2, 33, 70, 2, 1, 16);
        p.pseType = type;
        FaInstance rep(p), bc(p);
        const int64_t per = 2 * 33 * 70;
        bc.pse = HostTensor(F32, {1, 2, 33, 70});
        for (int64_t e = 0; e < per; ++e) {
            bc.pse.set(e, rep.pse.get(e));
            rep.pse.set(per + e, rep.pse.get(e));
        }
        runInstance(rep);
        runInstance(bc);
        expectChecked(bc, -1);
        EXPECT_TRUE(sameBytes(rep.attentionOut, bc.attentionOut));
    }
}

TEST(FaForwardPse, SlopesWithStartIndices) {
    for (int type : {2, 3})
        for (auto [qs, ks] : {std::pair<int64_t, int64_t>{5, 2}, {0, 40}, {-7, 3}}) {
            FaProblem p = fixed("BSND", F32, 2, 40, 65, 4, 2, 16);
            p.pseType = type;
            FaInstance inst(p);
            inst.qStartIdx = {qs, 99};  // only element 0 is used
            inst.kvStartIdx = {ks};
            runInstance(inst);
            expectChecked(inst, -1);
            // Shifting both starts by the same amount changes nothing.
            FaInstance shifted(p);
            shifted.qStartIdx = {qs + 11};
            shifted.kvStartIdx = {ks + 11};
            runInstance(shifted);
            EXPECT_TRUE(sameBytes(inst.attentionOut, shifted.attentionOut)) << type << " " << qs << " " << ks;
        }
}

TEST(FaForwardPse, SlopesPerBatch) {
    FaProblem p = withMode(fixed("BNSD", BF16, 2, 40, 40, 2, 1, 16), 2);
    p.pseType = 2;
    FaInstance inst(p);
    inst.pse = HostTensor(F32, {2, 2});
    const float slopes[] = {0.5f, 0.25f, 0.1f, 0.0f};
    for (int64_t e = 0; e < 4; ++e) inst.pse.set(e, slopes[e]);
    runInstance(inst);
    expectChecked(inst, -1);
}

TEST(FaForwardPse, TndMaskGlobalRowsForm) {
    // attenMask [T1, T2] indexed by absolute rows, against the reference and against the
    // equivalent [maxSq, maxSkv] mask.
    FaProblem p = tnd(F32, {5, 0, 40, 3}, {7, 2, 33, 3}, 2, 1, 16);
    p.maskKind = "random";
    FaInstance local(p);
    FaInstance global(p);
    const int64_t t1 = 48, t2 = 45, mq = 40, mk = 33;
    global.attenMask = HostTensor(ATTNOPS_BOOL, {t1, t2});
    for (int64_t e = 0; e < t1 * t2; ++e) global.attenMask.set(e, 1.0f);
    int64_t q0 = 0, k0 = 0;
    for (size_t b = 0; b < p.qSeqLens.size(); ++b) {
        for (int64_t i = 0; i < p.qSeqLens[b]; ++i)
            for (int64_t j = 0; j < p.kvSeqLens[b]; ++j)
                global.attenMask.set((q0 + i) * t2 + k0 + j, local.attenMask.get(i * mk + j));
        q0 += p.qSeqLens[b];
        k0 += p.kvSeqLens[b];
    }
    ASSERT_EQ(local.attenMask.numel(), mq * mk);
    runInstance(local);
    runInstance(global);
    expectChecked(global, -1);
    EXPECT_TRUE(sameBytes(local.attentionOut, global.attentionOut));
}

// ---------------------------------------------------------------- dropout

TEST(FaForwardDropout, GeneratedEqualsExplicitMaskBitwise) {
    for (double keep : {0.5, 0.9})
        for (const FaProblem& base : {fixed("BSH", BF16, 2, 65, 70, 2, 1, 32), tnd(F32, {5, 0, 64, 1}, {7, 3, 65, 1}, 2, 1, 32)}) {
            FaProblem p = withMode(base, 3);
            p.keepProb = keep;
            p.seed = 77;
            p.offset = 5;
            FaInstance gen(p);
            p.explicitDropMask = true;
            FaInstance ex(p);
            ASSERT_FALSE(ex.dropMask.empty());
            runInstance(gen);
            runInstance(ex);
            expectChecked(gen, -1);
            EXPECT_TRUE(sameBytes(gen.attentionOut, ex.attentionOut)) << p.describe();
            EXPECT_TRUE(sameBytes(gen.softmaxMax, ex.softmaxMax));
            EXPECT_TRUE(sameBytes(gen.softmaxSum, ex.softmaxSum));
            // The materialised mask keeps about keepProb of the bits.
            int64_t ones = 0;
            for (uint8_t byte : ex.dropMask.bytes()) ones += __builtin_popcount(byte);
            const double frac = double(ones) / double(ex.dropMask.numel() * 8);
            EXPECT_NEAR(frac, keep, 0.05);
        }
}

TEST(FaForwardDropout, OffsetAndSeedChangeTheOutput) {
    FaProblem p = fixed("BNSD", F32, 1, 64, 64, 2, 1, 32);
    p.keepProb = 0.7;
    p.seed = 3;
    p.offset = 0;
    FaInstance a(p);
    p.offset = 12;
    FaInstance b(p);
    p.offset = 0;
    p.seed = 4;
    FaInstance c(p);
    runInstance(a);
    runInstance(b);
    runInstance(c);
    expectChecked(b, -1);
    expectChecked(c, -1);
    EXPECT_FALSE(sameBytes(a.attentionOut, b.attentionOut));
    EXPECT_FALSE(sameBytes(a.attentionOut, c.attentionOut));
    // Statistics are those of the softmax before dropout: identical.
    EXPECT_TRUE(sameBytes(a.softmaxMax, b.softmaxMax));
    EXPECT_TRUE(sameBytes(a.softmaxSum, b.softmaxSum));
}

TEST(FaForwardDropout, KeepProbOneIgnoresMasksAndSeeds) {
    FaProblem p = fixed("BSND", F16, 2, 40, 50, 2, 1, 16);
    FaInstance plain(p);
    FaInstance masked(p);
    masked.dropMask = HostTensor(ATTNOPS_UINT8, {1});  // far too small and all zero: not read
    masked.problem.seed = 99;
    masked.problem.offset = 1234;
    runInstance(plain);
    runInstance(masked);
    EXPECT_TRUE(sameBytes(plain.attentionOut, masked.attentionOut));
}

TEST(FaForwardDropout, ExplicitMaskBitsAreHonoured) {
    // All-zero keep mask: every output is 0; all-ones mask: output = no dropout / keepProb.
    FaProblem p = fixed("BNSD", F32, 1, 33, 40, 2, 1, 16);
    FaInstance ref(p);
    runInstance(ref);
    p.keepProb = 0.5;
    p.explicitDropMask = true;
    FaInstance zeros(p), ones(p);
    std::fill(zeros.dropMask.bytes().begin(), zeros.dropMask.bytes().end(), uint8_t(0));
    std::fill(ones.dropMask.bytes().begin(), ones.dropMask.bytes().end(), uint8_t(0xFF));
    runInstance(zeros);
    runInstance(ones);
    for (int64_t e = 0; e < zeros.attentionOut.numel(); ++e) ASSERT_EQ(zeros.attentionOut.get(e), 0.0f);
    for (int64_t e = 0; e < ones.attentionOut.numel(); ++e)
        ASSERT_NEAR(ones.attentionOut.get(e), 2.0f * ref.attentionOut.get(e), 1e-5f);
    expectChecked(zeros, -1);
    expectChecked(ones, -1);
}

// ---------------------------------------------------------------- statistics

TEST(FaForwardStats, LanesOneAndEightAgree) {
    FaProblem p = withMode(tnd(F32, {0, 65, 3}, {4, 70, 9}, 2, 1, 32), 3);
    p.extraQRows = 2;
    p.statLanes = 8;
    FaInstance eight(p);
    p.statLanes = 1;
    FaInstance one(p);
    p.statLanes = 0;
    FaInstance none(p);
    runInstance(eight);
    runInstance(one);
    runInstance(none);
    expectChecked(eight, -1);
    expectChecked(one, -1);
    EXPECT_TRUE(sameBytes(eight.attentionOut, one.attentionOut));
    EXPECT_TRUE(sameBytes(eight.attentionOut, none.attentionOut));
    for (int64_t r = 0; r < one.softmaxMax.numel(); ++r)
        for (int64_t lane = 0; lane < 8; ++lane) {
            ASSERT_EQ(std::memcmp(&one.softmaxMax.bytes()[size_t(r) * 4], &eight.softmaxMax.bytes()[size_t(r * 8 + lane) * 4], 4), 0);
            ASSERT_EQ(std::memcmp(&one.softmaxSum.bytes()[size_t(r) * 4], &eight.softmaxSum.bytes()[size_t(r * 8 + lane) * 4], 4), 0);
        }
}

TEST(FaForwardStats, MatchSoftmaxOfScoresDirectly) {
    // One head, one key: max = scale * q.k, sum = 1 (checked without the reference).
    FaProblem p = fixed("BNSD", F32, 1, 3, 1, 1, 1, 4);
    FaInstance inst(p);
    runInstance(inst);
    for (int64_t i = 0; i < 3; ++i) {
        double dot = 0;
        for (int64_t c = 0; c < 4; ++c) dot += double(inst.query.get(i * 4 + c)) * inst.key.get(c);
        EXPECT_NEAR(inst.softmaxMax.get(i * 8), 0.5 * dot, 1e-6);
        EXPECT_EQ(inst.softmaxSum.get(i * 8 + 7), 1.0f);
        for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(inst.attentionOut.get(i * 4 + c), inst.value.get(c));
    }
}

// ---------------------------------------------------------------- non-contiguous inputs

TEST(FaForwardStrides, PackedQkvSliceEqualsContiguous) {
    // q, k, v as slices of one packed [B, S, 3, N, D] buffer (BSND views with row stride 3*N*D).
    for (attnopsDataType dt : {F32, BF16}) {
        const int64_t b = 2, s = 65, n = 2, d = 32;
        FaProblem p = withMode(fixed("BSND", dt, b, s, s, n, n, d), 2);
        FaInstance inst(p);
        runInstance(inst);
        FaInstance again(p);
        poisonOutputs(again);
        const int64_t storage = b * s * 3 * n * d;
        const std::vector<int64_t> shape{b, s, n, d}, strides{s * 3 * n * d, 3 * n * d, d, 1};
        ViewTensor packed(dt, shape, strides, storage);
        ViewTensor kview(dt, shape, strides, storage, n * d);  // separate buffers, same layout
        ViewTensor vview(dt, shape, strides, storage, 2 * n * d);
        for (int64_t bb = 0; bb < b; ++bb)
            for (int64_t ss = 0; ss < s; ++ss)
                for (int64_t e = 0; e < n * d; ++e) {
                    const int64_t src = (bb * s + ss) * n * d + e;
                    const int64_t dst = (bb * s + ss) * 3 * n * d + e;
                    packed.copyElement(dst, inst.query, src);
                    kview.copyElement(dst + n * d, inst.key, src);
                    vview.copyElement(dst + 2 * n * d, inst.value, src);
                }
        Call call(again);
        call.q = packed.handle;
        call.k = kview.handle;
        call.v = vview.handle;
        ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_TRUE(sameBytes(inst.attentionOut, again.attentionOut));
        EXPECT_TRUE(sameBytes(inst.softmaxMax, again.softmaxMax));
        EXPECT_TRUE(sameBytes(inst.softmaxSum, again.softmaxSum));
    }
}

TEST(FaForwardStrides, PaddedBnsdOperandsAndOutputs) {
    // Every operand and output with padded row and head strides; padding must stay untouched.
    const int64_t b = 2, n1 = 4, n2 = 2, s1 = 40, s2 = 70, d = 24, dv = 16, pad = 5;
    FaProblem p = fixed("BNSD", F16, b, s1, s2, n1, n2, d, dv);
    FaInstance inst(p);
    runInstance(inst);
    FaInstance again(p);
    auto stridesFor = [&](int64_t n, int64_t s, int64_t dim) {
        return std::vector<int64_t>{n * (s + 1) * (dim + pad), (s + 1) * (dim + pad), dim + pad, 1};
    };
    ViewTensor q(F16, {b, n1, s1, d}, stridesFor(n1, s1, d), b * n1 * (s1 + 1) * (d + pad));
    ViewTensor k(F16, {b, n2, s2, d}, stridesFor(n2, s2, d), b * n2 * (s2 + 1) * (d + pad));
    ViewTensor v(F16, {b, n2, s2, dv}, stridesFor(n2, s2, dv), b * n2 * (s2 + 1) * (dv + pad));
    ViewTensor out(F16, {b, n1, s1, dv}, stridesFor(n1, s1, dv), b * n1 * (s1 + 1) * (dv + pad));
    // Statistics as [B,N1,S1,8] views into a [B,N1,S1,16] buffer.
    const std::vector<int64_t> statStrides{n1 * s1 * 16, s1 * 16, 16, 1};
    ViewTensor smax(F32, {b, n1, s1, 8}, statStrides, b * n1 * s1 * 16);
    ViewTensor ssum(F32, {b, n1, s1, 8}, statStrides, b * n1 * s1 * 16);
    auto fill = [&](ViewTensor& view, const HostTensor& src, int64_t n, int64_t s, int64_t dim) {
        const auto st = stridesFor(n, s, dim);
        for (int64_t bb = 0; bb < b; ++bb)
            for (int64_t nn = 0; nn < n; ++nn)
                for (int64_t ss = 0; ss < s; ++ss)
                    for (int64_t c = 0; c < dim; ++c)
                        view.copyElement(bb * st[0] + nn * st[1] + ss * st[2] + c, src, ((bb * n + nn) * s + ss) * dim + c);
    };
    fill(q, inst.query, n1, s1, d);
    fill(k, inst.key, n2, s2, d);
    fill(v, inst.value, n2, s2, dv);
    const std::vector<uint8_t> outBefore = out.bytes, statBefore = smax.bytes;
    Call call(again);
    call.q = q.handle;
    call.k = k.handle;
    call.v = v.handle;
    call.out = out.handle;
    call.smax = smax.handle;
    call.ssum = ssum.handle;
    ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const auto st = stridesFor(n1, s1, dv);
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t nn = 0; nn < n1; ++nn)
            for (int64_t ss = 0; ss < s1; ++ss) {
                const int64_t rowAt = bb * st[0] + nn * st[1] + ss * st[2];
                ASSERT_EQ(std::memcmp(out.bytes.data() + rowAt * 2,
                                      inst.attentionOut.bytes().data() + ((bb * n1 + nn) * s1 + ss) * dv * 2, size_t(dv) * 2),
                          0)
                    << bb << " " << nn << " " << ss;
                for (int64_t c = dv; c < dv + pad; ++c)  // padding of this row untouched
                    ASSERT_EQ(out.bytes[size_t((rowAt + c) * 2)], outBefore[size_t((rowAt + c) * 2)]);
                const int64_t statAt = ((bb * n1 + nn) * s1 + ss) * 16;
                ASSERT_EQ(std::memcmp(smax.bytes.data() + statAt * 4,
                                      inst.softmaxMax.bytes().data() + ((bb * n1 + nn) * s1 + ss) * 8 * 4, 32),
                          0);
                ASSERT_EQ(std::memcmp(smax.bytes.data() + (statAt + 8) * 4, statBefore.data() + (statAt + 8) * 4, 32), 0);
            }
}

TEST(FaForwardStrides, StridedOptionalInputs) {
    // attenMask, pse, sink and dropMask as padded / strided views: bitwise the contiguous result.
    const int64_t b = 2, n1 = 2, s1 = 33, s2 = 40;
    FaProblem p = fixed("BNSD", F32, b, s1, s2, n1, 1, 16);
    p.maskKind = "causal";  // [S1, S2]
    p.pseType = 1;
    p.sink = true;
    p.keepProb = 0.75;
    p.explicitDropMask = true;
    p.seed = 9;
    FaInstance inst(p);
    for (int64_t e = 0; e < s1 * s2; ++e) inst.attenMask.set(e, (e % 7) == 3 ? 1.0f : inst.attenMask.get(e));
    runInstance(inst);
    expectChecked(inst, -1);
    FaInstance again(p);
    poisonOutputs(again);
    ViewTensor mask(ATTNOPS_UINT8, {s1, s2}, {s2 + 3, 1}, s1 * (s2 + 3));
    for (int64_t i = 0; i < s1; ++i)
        for (int64_t j = 0; j < s2; ++j) mask.copyElement(i * (s2 + 3) + j, inst.attenMask, i * s2 + j);
    // pse [B,N1,S1,S2] with the column axis strided by 2 and padded rows.
    const std::vector<int64_t> pseStrides{n1 * s1 * (2 * s2 + 1), s1 * (2 * s2 + 1), 2 * s2 + 1, 2};
    ViewTensor pse(F32, {b, n1, s1, s2}, pseStrides, b * n1 * s1 * (2 * s2 + 1));
    for (int64_t e = 0; e < b * n1 * s1; ++e)
        for (int64_t j = 0; j < s2; ++j) pse.copyElement(e * (2 * s2 + 1) + 2 * j, inst.pse, e * s2 + j);
    ViewTensor sink(F32, {n1}, {3}, 3 * n1);
    for (int64_t n = 0; n < n1; ++n) sink.copyElement(3 * n, inst.sink, n);
    const int64_t bytes = inst.dropMask.numel();
    ViewTensor drop(ATTNOPS_UINT8, {bytes}, {2}, 2 * bytes);
    for (int64_t e = 0; e < bytes; ++e) drop.copyElement(2 * e, inst.dropMask, e);
    Call call(again);
    call.mask = mask.handle;
    call.pse = pse.handle;
    call.sink = sink.handle;
    call.drop = drop.handle;
    ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_TRUE(sameBytes(inst.attentionOut, again.attentionOut));
    EXPECT_TRUE(sameBytes(inst.softmaxMax, again.softmaxMax));
    EXPECT_TRUE(sameBytes(inst.softmaxSum, again.softmaxSum));
}

TEST(FaForwardStrides, StridedTndOperandsAndPse) {
    // TND q/k/v with padded token rows and a strided 1-D pse.
    FaProblem p = withMode(tnd(BF16, {5, 0, 40}, {7, 3, 33}, 2, 1, 16), 3);
    p.pseType = 0;
    FaInstance inst(p);
    runInstance(inst);
    expectChecked(inst, -1);
    FaInstance again(p);
    poisonOutputs(again);
    const int64_t t1 = 45, t2 = 43, rowQ = 2 * 16 + 8, rowK = 16 + 5;
    ViewTensor q(BF16, {t1, 2, 16}, {rowQ, 16, 1}, t1 * rowQ), k(BF16, {t2, 1, 16}, {rowK, 16, 1}, t2 * rowK),
        v(BF16, {t2, 1, 16}, {rowK, 16, 1}, t2 * rowK);
    for (int64_t t = 0; t < t1; ++t)
        for (int64_t e = 0; e < 32; ++e) q.copyElement(t * rowQ + e, inst.query, t * 32 + e);
    for (int64_t t = 0; t < t2; ++t)
        for (int64_t e = 0; e < 16; ++e) {
            k.copyElement(t * rowK + e, inst.key, t * 16 + e);
            v.copyElement(t * rowK + e, inst.value, t * 16 + e);
        }
    const int64_t n = inst.pse.numel();
    ViewTensor pse(BF16, {n}, {3}, 3 * n);
    for (int64_t e = 0; e < n; ++e) pse.copyElement(3 * e, inst.pse, e);
    Call call(again);
    call.q = q.handle;
    call.k = k.handle;
    call.v = v.handle;
    call.pse = pse.handle;
    ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_TRUE(sameBytes(inst.attentionOut, again.attentionOut));
    EXPECT_TRUE(sameBytes(inst.softmaxMax, again.softmaxMax));
}

TEST(FaForwardAttributes, ExtremeTokenValues) {
    // Token values far outside int32 are clamped, never overflow: (INT64_MIN, INT64_MAX) and
    // (INT64_MAX, INT64_MIN) keep nothing (band j - i >= 2^60, resp. <= -2^60); (MAX, MAX) keeps all.
    const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    for (auto [pre, next] : {std::pair<int64_t, int64_t>{lo, hi}, {hi, lo}}) {
        for (int64_t mode : {0, 4}) {
            FaInstance inst(withMode(fixed("BNSD", F32, 1, 20, 30, 2, 1, 8), mode, pre, next));
            runInstance(inst);
            expectChecked(inst, -1);
            for (int64_t n = 0; n < 2; ++n)
                for (int64_t i = 0; i < 20; ++i) expectMaskedRow(inst, 0, n, i);
        }
    }
    FaInstance all(withMode(fixed("BNSD", F32, 1, 20, 30, 2, 1, 8), 0, hi, hi));
    FaInstance full(fixed("BNSD", F32, 1, 20, 30, 2, 1, 8));
    runInstance(all);
    runInstance(full);
    EXPECT_TRUE(sameBytes(all.attentionOut, full.attentionOut));
    FaInstance tndBand(withMode(tnd(F32, {5, 9}, {6, 9}, 2, 1, 8), 8, hi, lo + 1));
    runInstance(tndBand);
    expectChecked(tndBand, -1);
}

TEST(FaForwardAttributes, InnerPreciseChangesNothing) {
    FaProblem p = withMode(fixed("BSH", F16, 1, 70, 40, 2, 1, 16), 3);  // rows 0..29 fully masked
    FaInstance base(p);
    runInstance(base);
    for (int64_t precise : {1, 2}) {
        FaInstance other(p);
        poisonOutputs(other);
        Call call(other);
        call.innerPrecise = precise;
        ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_TRUE(sameBytes(base.attentionOut, other.attentionOut)) << precise;
        EXPECT_TRUE(sameBytes(base.softmaxMax, other.softmaxMax)) << precise;
    }
}

TEST(FaForwardStrides, TransposedBshViewOfSbhData) {
    // A BSH-shaped view over SBH-ordered memory (batch stride H, sequence stride B*H).
    const int64_t b = 2, s = 33, n = 2, d = 16;
    FaProblem sbh = fixed("SBH", F32, b, s, s, n, n, d);
    FaInstance src(sbh);
    runInstance(src);
    FaProblem bsh = sbh;
    bsh.layout = "BSH";
    FaInstance dst(bsh);
    poisonOutputs(dst);
    const std::vector<int64_t> shape{b, s, n * d}, strides{n * d, b * n * d, 1};
    ViewTensor q(F32, shape, strides, s * b * n * d), k(F32, shape, strides, s * b * n * d), v(F32, shape, strides, s * b * n * d);
    for (int64_t e = 0; e < s * b * n * d; ++e) {
        q.copyElement(e, src.query, e);
        k.copyElement(e, src.key, e);
        v.copyElement(e, src.value, e);
    }
    Call call(dst);
    call.q = q.handle;
    call.k = k.handle;
    call.v = v.handle;
    ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    for (int64_t bb = 0; bb < b; ++bb)
        for (int64_t ss = 0; ss < s; ++ss)
            for (int64_t e = 0; e < n * d; ++e)
                ASSERT_EQ(dst.attentionOut.get((bb * s + ss) * n * d + e), src.attentionOut.get((ss * b + bb) * n * d + e));
}

// ---------------------------------------------------------------- NaN / Inf

TEST(FaForwardNonFinite, NanInQueryMakesThatRowNan) {
    for (attnopsDataType dt : {F32, BF16}) {
        FaProblem p = fixed("BNSD", dt, 1, 70, 70, 2, 1, 32);
        FaInstance inst(p);
        inst.query.set(qOffset(inst, 0, 1, 5, 3), std::numeric_limits<float>::quiet_NaN());
        runInstance(inst);
        expectChecked(inst, -1);
        // The statistics of that row are NaN too (as the reference's), not -inf / 0.
        EXPECT_TRUE(std::isnan(inst.softmaxMax.get(statOffset(inst, 0, 1, 5, 0))));
        EXPECT_TRUE(std::isnan(inst.softmaxSum.get(statOffset(inst, 0, 1, 5, 7))));
        expectLiveRow(inst, 0, 0, 5);
        for (int64_t c = 0; c < 32; ++c) {
            EXPECT_TRUE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 1, 5, c)))) << c;
            EXPECT_FALSE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 0, 5, c))));
            EXPECT_FALSE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 1, 4, c))));
        }
    }
}

TEST(FaForwardNonFinite, NanInValueReachesOnlyRowsThatSeeIt) {
    // Causal: value row 40 is seen by query rows >= 40 only.
    FaProblem p = withMode(fixed("BNSD", F32, 1, 70, 70, 1, 1, 16), 2);
    FaInstance inst(p);
    inst.value.set(kvOffsetBnsd(inst, 0, 0, 40, 2, 16), std::numeric_limits<float>::quiet_NaN());
    runInstance(inst);
    expectChecked(inst, -1);
    EXPECT_FALSE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 0, 39, 2))));
    EXPECT_TRUE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 0, 40, 2))));
    EXPECT_TRUE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 0, 69, 2))));
    EXPECT_FALSE(std::isnan(inst.attentionOut.get(outOffset(inst, 0, 0, 69, 3))));
}

TEST(FaForwardNonFinite, InfInKeyAndQueryNoCrash) {
    const float inf = std::numeric_limits<float>::infinity();
    FaProblem p = fixed("BSH", F16, 1, 70, 70, 2, 1, 16);
    FaInstance inst(p);
    inst.key.set(30 * 16 + 4, inf);  // key row 30, head 0, column 4
    inst.query.set(qOffset(inst, 0, 1, 10, 0), -inf);
    runInstance(inst);
    expectChecked(inst, -1);
    // Huge finite inputs: the max subtraction keeps everything finite.
    FaProblem big = fixed("BNSD", F32, 1, 40, 40, 1, 1, 8);
    big.dataScale = 1e18;
    big.scale = 1e-18;
    FaInstance hb(big);
    runInstance(hb);
    for (int64_t e = 0; e < hb.attentionOut.numel(); ++e) ASSERT_TRUE(std::isfinite(hb.attentionOut.get(e)));
}

// ---------------------------------------------------------------- determinism and implementations

using attnops::testsupport::ThreadsGuard;

using attnops::testsupport::ForcedImpl;

// The default choice ("") and every register-blocked entry this CPU runs.
TEST(FaForwardDeterminism, ThreadCountsAndRepeatedRunsAreBitwiseEqual) {
    ThreadsGuard guard;
    std::vector<FaProblem> problems;
    problems.push_back(withMode(tnd(BF16, {0, 300, 1, 129, 64}, {5, 310, 1, 100, 64}, 4, 2, 64), 3));
    problems.push_back([] {
        FaProblem p = withMode(fixed("BSH", F32, 2, 200, 190, 4, 1, 32), 0, 50, 10);
        p.keepProb = 0.8;
        p.sink = true;
        p.pseType = 2;
        return p;
    }());
    // GQA causal with several query blocks per head: the plan's largest-first order interleaves
    // the heads' last blocks, and the chunks differ with the thread count.
    problems.push_back(withMode(fixed("BNSD", F32, 1, 700, 700, 4, 2, 64), 3));
    for (const char* impl : {"", "amx", "avx512-bf16", "avx512", "avx2"}) {
        ForcedImpl force(impl);
        for (const FaProblem& p : problems) {
            std::vector<std::unique_ptr<FaInstance>> runs;
            ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
            const attnopsStatus st = FaInstance(p).runForward();
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
            const bool bf16Only = std::string(impl) == "avx512-bf16" || std::string(impl) == "amx";
            if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && bf16Only && p.dtype != BF16) continue;
            for (int32_t threads : {1, 2, 1, 2, 3, 4, 7}) {
                ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                runs.push_back(std::make_unique<FaInstance>(p));
                runInstance(*runs.back());
            }
            expectChecked(*runs[0], 400);
            for (size_t r = 1; r < runs.size(); ++r) {
                EXPECT_TRUE(sameBytes(runs[0]->attentionOut, runs[r]->attentionOut)) << impl << " " << p.describe() << " run " << r;
                EXPECT_TRUE(sameBytes(runs[0]->softmaxMax, runs[r]->softmaxMax)) << impl << " run " << r;
                EXPECT_TRUE(sameBytes(runs[0]->softmaxSum, runs[r]->softmaxSum)) << impl << " run " << r;
            }
        }
    }
}

TEST(FaForwardImplementations, EachAvailableImplementationMatchesReference) {
    std::vector<FaProblem> problems;
    problems.push_back(withMode(fixed("BNSD", F32, 2, 65, 129, 4, 2, 64), 3));
    problems.push_back([] {
        FaProblem p = withMode(tnd(BF16, {0, 70, 1, 33}, {4, 65, 1, 40}, 2, 1, 256), 0, 20, 5);
        p.keepProb = 0.9;
        p.sink = true;
        p.extraQRows = 2;
        return p;
    }());
    problems.push_back([] {
        FaProblem p = fixed("SBH", F16, 1, 40, 50, 2, 2, 768, 300);
        p.pseType = 1;
        p.maskKind = "random";
        return p;
    }());
    int ran = 0;
    for (const char* impl : {"amx", "avx512-bf16", "avx512", "avx2", "tiled-avx512", "tiled-avx2", "tiled-generic", "amx-emulated", "reference"}) {
        for (const FaProblem& p : problems) {
            ForcedImpl force(impl);
            FaInstance inst(p);
            poisonOutputs(inst);
            const attnopsStatus st = inst.runForward();
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) {
                std::cout << "[   INFO   ] " << impl << " is not available on this CPU\n";
                break;
            }
            // Only the 16-bit-operand entries decline problems: avx512-bf16 and amx those whose
            // operands are not bf16 (amx takes fp16 on CPUs with AMX-FP16), amx-emulated fp32 ones.
            if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION &&
                (std::string(impl) == "amx-emulated" ? p.dtype == F32
                                                     : (std::string(impl) == "avx512-bf16" || std::string(impl) == "amx") && p.dtype != BF16))
                continue;
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << impl << ": " << attnopsGetLastErrorMessage();
            ++ran;
            const auto rc = attnops::tools::checkForwardRows(inst, -1);
            EXPECT_TRUE(rc.passed) << impl << " " << p.describe() << ": err " << rc.maxAbsError << " tol " << rc.tolerance << " "
                                   << rc.firstFailure;
            expectTndTails(inst);
            // Repeated runs of the forced implementation are bitwise equal.
            FaInstance again(p);
            ASSERT_EQ(again.runForward(), ATTNOPS_SUCCESS);
            EXPECT_TRUE(sameBytes(inst.attentionOut, again.attentionOut)) << impl;
        }
    }
    EXPECT_GE(ran, 6);  // at least tiled-generic and reference ran every problem
}

TEST(FaForwardImplementations, UnknownForcedNameIsAnError) {
    ForcedImpl force("tiled-nonexistent");
    FaInstance inst(fixed("BNSD", F32, 1, 8, 8, 1, 1, 8));
    EXPECT_EQ(inst.runForward(), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("tiled-nonexistent"), std::string::npos);
}

// ---------------------------------------------------------------- TND cumulative arrays

TEST(FaForwardTnd, TrailingZeroCumulativeArraysMeanNotComputed) {
    // Lengths {10, 20, 0, 0}: cumulative [10, 30, 0, 0] (trailing zeros) must equal
    // [10, 30, 30, 30]; rows 30.. of the packed tensors are tails.
    for (int64_t mode : {0, 3, 7, 8}) {
        FaProblem p = withMode(tnd(F32, {10, 20, 0, 0}, {12, 25, 0, 0}, 2, 1, 16), mode, mode >= 7 ? 8 : kNoBand,
                               mode >= 7 ? 1 : kNoBand);
        p.extraQRows = 4;
        p.extraKvRows = 3;
        FaInstance repeated(p), zeros(p);
        zeros.qCumulative = {10, 30, 0, 0};
        zeros.kvCumulative = {12, 37, 0, 0};
        runInstance(repeated);
        runInstance(zeros);
        expectChecked(zeros, -1);
        expectTndTails(zeros);
        EXPECT_TRUE(sameBytes(repeated.attentionOut, zeros.attentionOut)) << "mode " << mode;
        EXPECT_TRUE(sameBytes(repeated.softmaxMax, zeros.softmaxMax));
    }
}

TEST(FaForwardTnd, SequencesDoNotSeeEachOther) {
    // Changing keys of sequence 0 leaves sequence 1's rows bitwise unchanged.
    FaProblem p = tnd(BF16, {20, 30}, {25, 35}, 2, 1, 16);
    FaInstance a(p), b(p);
    for (int64_t e = 0; e < 25 * 16; ++e) b.key.set(e, 0.25f);
    for (int64_t e = 0; e < 25 * 16; ++e) b.value.set(e, -3.0f);
    runInstance(a);
    runInstance(b);
    const int64_t rowBytes = 2 * 16 * 2;
    EXPECT_EQ(std::memcmp(a.attentionOut.bytes().data() + 20 * rowBytes, b.attentionOut.bytes().data() + 20 * rowBytes,
                          size_t(30 * rowBytes)),
              0);
    EXPECT_NE(std::memcmp(a.attentionOut.bytes().data(), b.attentionOut.bytes().data(), size_t(20 * rowBytes)), 0);
    expectChecked(b, -1);
}

}  // namespace
