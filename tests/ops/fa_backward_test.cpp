// FlashAttentionScoreGrad: the double reference backward against central finite differences of
// the double reference forward; attnops' backward against the reference over layouts, dtypes,
// head geometries, lengths on and around the kernel's block edges, sparse modes, pse types,
// dropout, sink and statistics forms; TND tails and empty sequences; strided gradients;
// determinism over thread counts, runs and implementations; a TND batch of 100,000 sequences;
// validation of the backward's own arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "amx_fused.hpp"
#include "cpu/isa.hpp"
#include "forced_impl.hpp"
#include "ops/flash_attention_score/reference.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "threads_guard.hpp"

namespace fa = attnops::fa;
using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::fixed;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;
using attnops::tools::GradCheck;
using attnops::tools::HostTensor;
using attnops::tools::kNoBand;

namespace {

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;

// ---------------------------------------------------------------- problems





FaProblem withDropout(FaProblem p, double keep, bool explicitMask, int64_t seed = 1234, int64_t offset = 56) {
    p.keepProb = keep;
    p.explicitDropMask = explicitMask;
    p.seed = seed;
    p.offset = offset;
    return p;
}

FaProblem withSink(FaProblem p) {
    p.sink = true;
    return p;
}

FaProblem withDtype(FaProblem p, attnopsDataType dt) {
    p.dtype = dt;
    return p;
}

std::string dtName(attnopsDataType dt) { return dt == F32 ? "f32" : (dt == F16 ? "f16" : "bf16"); }

std::string tok(int64_t v) {
    if (v == kNoBand) return "inf";
    return v < 0 ? "m" + std::to_string(-v) : std::to_string(v);
}

// ---------------------------------------------------------------- running

// Gradient outputs start as 0xFF bytes (NaN in every float dtype), so that an element the
// kernel forgets to write cannot pass.
void poison(FaGrads& g) {
    for (HostTensor* t : {&g.dq, &g.dk, &g.dv, &g.dsink})
        if (!t->empty()) std::fill(t->bytes().begin(), t->bytes().end(), uint8_t(0xFF));
}

void runForward(FaInstance& inst) {
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << inst.problem.describe() << ": " << attnopsGetLastErrorMessage();
}

void runGrad(const FaInstance& inst, FaGrads& g) {
    poison(g);
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS)
        << inst.problem.describe() << ": " << attnopsGetLastErrorMessage();
}

std::string describe(const GradCheck& rc) {
    std::string s;
    const char* names[4] = {"dq", "dk", "dv", "dsink"};
    for (int t = 0; t < 4; ++t)
        s += std::string(" ") + names[t] + " err " + std::to_string(rc.maxAbsError[t]) + " tol " + std::to_string(rc.tolerance[t]) +
             " naive " + std::to_string(rc.maxAbsNaiveError[t]) + " |ref| " + std::to_string(rc.maxAbsReference[t]) + ";";
    return s + " " + rc.failure;
}

GradCheck expectGradChecked(const FaInstance& inst, const FaGrads& g) {
    const GradCheck rc = attnops::tools::checkBackward(inst, g);
    EXPECT_TRUE(rc.passed) << inst.problem.describe() << ":" << describe(rc);
    return rc;
}

// Rows of the packed TND tensors beyond the last sequence: rows [used, T) of a [T, N, D] tensor.
int64_t usedRows(const std::vector<int64_t>& cumulative) {
    int64_t used = 0;
    for (int64_t v : cumulative) used = std::max(used, v);
    return used;
}

void expectZeroRows(const HostTensor& t, int64_t from, const char* name) {
    if (t.empty() || t.shape().empty()) return;
    const int64_t rowElems = t.numel() / std::max<int64_t>(1, t.shape()[0]);
    for (int64_t e = from * rowElems; e < t.numel(); ++e) {
        const float v = t.get(e);
        ASSERT_TRUE(v == 0.0f && !std::signbit(v)) << name << " tail element " << e << " (row " << e / rowElems << ") = " << v;
    }
}

void expectTndTails(const FaInstance& inst, const FaGrads& g) {
    if (!inst.problem.tnd()) return;
    expectZeroRows(g.dq, usedRows(inst.qCumulative), "dq");
    expectZeroRows(g.dk, usedRows(inst.kvCumulative), "dk");
    expectZeroRows(g.dv, usedRows(inst.kvCumulative), "dv");
}

// Forward, backward from poisoned gradients, reference check, tails.
void expectGradMatches(const FaProblem& p) {
    FaInstance inst(p);
    runForward(inst);
    if (::testing::Test::HasFatalFailure()) return;
    FaGrads g = attnops::tools::makeGrads(inst);
    runGrad(inst, g);
    if (::testing::Test::HasFatalFailure()) return;
    expectGradChecked(inst, g);
    expectTndTails(inst, g);
}

bool sameBytes(const HostTensor& a, const HostTensor& b) { return a.bytes() == b.bytes(); }

void expectSameGrads(const FaGrads& a, const FaGrads& b, const std::string& what) {
    EXPECT_TRUE(sameBytes(a.dq, b.dq)) << what << ": dq differs";
    EXPECT_TRUE(sameBytes(a.dk, b.dk)) << what << ": dk differs";
    EXPECT_TRUE(sameBytes(a.dv, b.dv)) << what << ": dv differs";
    EXPECT_TRUE(sameBytes(a.dsink, b.dsink)) << what << ": dsink differs";
}

// Element offset of (b, n, row, c) in a contiguous tensor of `layout` with `heads` heads of head
// dim `dim` and the given shape (TND: b ignored).
int64_t elemOffset(const std::string& layout, const std::vector<int64_t>& sh, int64_t heads, int64_t dim, int64_t b, int64_t n,
                   int64_t s, int64_t c) {
    if (layout == "BSH" || layout == "BSND") return ((b * sh[1] + s) * heads + n) * dim + c;
    if (layout == "SBH") return ((s * sh[1] + b) * heads + n) * dim + c;
    if (layout == "BNSD") return ((b * heads + n) * sh[2] + s) * dim + c;
    return (s * heads + n) * dim + c;  // TND
}

// ================================================================ 1. reference vs finite differences

// L = sum over every (sequence, head, row) of dy . out with out from the double reference
// forward; dL/dx by central differences (x stored in fp32: the step is the representable one)
// against referenceBackwardHead.
class FiniteDifferences {
public:
    explicit FiniteDifferences(FaInstance& inst)
        : inst_(inst), grads_(attnops::tools::makeGrads(inst)), bp_(attnops::tools::backwardParams(inst, grads_)) {
        const fa::ForwardParams& p = bp_.fwd;
        heads_.resize(size_t(p.seq.count * p.n1));
        for (int64_t b = 0; b < p.seq.count; ++b)
            for (int64_t n1 = 0; n1 < p.n1; ++n1) heads_[size_t(b * p.n1 + n1)] = fa::referenceBackwardHead(bp_, b, n1);
    }

    void checkAll() {
        const fa::ForwardParams& p = bp_.fwd;
        Stat dq, dk, dv, dsink;
        for (int64_t b = 0; b < p.seq.count; ++b) {
            const int64_t qRow0 = p.seq.qStart[size_t(b)], kvRow0 = p.seq.kvStart[size_t(b)];
            for (int64_t n1 = 0; n1 < p.n1; ++n1)
                for (int64_t i = 0; i < p.seq.qLen[size_t(b)]; ++i)
                    for (int64_t c = 0; c < p.d; ++c) {
                        const double an = head(b, n1).dq[size_t(i * p.d + c)];
                        const double fd = derivative(inst_.query, p.q.offset(b, n1, qRow0 + i, c), [&] { return rowLoss(b, n1, i); });
                        dq.add(fd, an, b, n1, i, c);
                    }
            for (int64_t n2 = 0; n2 < p.n2; ++n2)
                for (int64_t j = 0; j < p.seq.kvLen[size_t(b)]; ++j) {
                    auto groupLoss = [&] {
                        double l = 0;
                        for (int64_t g = 0; g < p.group; ++g) l += headLoss(b, n2 * p.group + g);
                        return l;
                    };
                    for (int64_t c = 0; c < p.d; ++c) {
                        double an = 0;
                        for (int64_t g = 0; g < p.group; ++g) an += head(b, n2 * p.group + g).dk[size_t(j * p.d + c)];
                        dk.add(derivative(inst_.key, p.k.offset(b, n2, kvRow0 + j, c), groupLoss), an, b, n2, j, c);
                    }
                    for (int64_t c = 0; c < p.dv; ++c) {
                        double an = 0;
                        for (int64_t g = 0; g < p.group; ++g) an += head(b, n2 * p.group + g).dv[size_t(j * p.dv + c)];
                        dv.add(derivative(inst_.value, p.v.offset(b, n2, kvRow0 + j, c), groupLoss), an, b, n2, j, c);
                    }
                }
        }
        if (p.sink != nullptr)
            for (int64_t n1 = 0; n1 < p.n1; ++n1) {
                double an = 0;
                for (int64_t b = 0; b < p.seq.count; ++b) an += head(b, n1).dsink;
                const double fd = derivative(inst_.sink, n1, [&] {
                    double l = 0;
                    for (int64_t b = 0; b < p.seq.count; ++b) l += headLoss(b, n1);
                    return l;
                });
                dsink.add(fd, an, 0, n1, 0, 0);
            }
        dq.expectClose("dq", inst_.problem);
        dk.expectClose("dk", inst_.problem);
        dv.expectClose("dv", inst_.problem);
        dsink.expectClose("dsink", inst_.problem);
        // Something was compared, and the gradients are not all zero (a vacuous pass).
        EXPECT_GT(dq.count + dk.count + dv.count, 0);
        EXPECT_GT(dv.maxAnalytic, 0.0) << inst_.problem.describe();
        if (p.sink != nullptr) {
            EXPECT_GT(dsink.maxAnalytic, 0.0) << inst_.problem.describe();
        }
    }

    const fa::ReferenceHeadGrads& head(int64_t b, int64_t n1) const { return heads_[size_t(b * bp_.fwd.n1 + n1)]; }
    const fa::BackwardParams& params() const { return bp_; }

private:
    struct Stat {
        double maxErr = 0, maxAnalytic = 0;
        int64_t count = 0;
        std::string worst;
        void add(double fd, double an, int64_t b, int64_t n, int64_t r, int64_t c) {
            ++count;
            maxAnalytic = std::max(maxAnalytic, std::fabs(an));
            const double err = std::fabs(fd - an);
            if (!(err <= maxErr)) {
                maxErr = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
                worst = "b " + std::to_string(b) + " head " + std::to_string(n) + " row " + std::to_string(r) + " col " +
                        std::to_string(c) + ": fd " + std::to_string(fd) + " analytic " + std::to_string(an);
            }
        }
        void expectClose(const char* name, const FaProblem& p) const {
            EXPECT_LE(maxErr, 1e-5 * std::max(1.0, maxAnalytic)) << p.describe() << " " << name << " worst at " << worst;
        }
    };

    double rowLoss(int64_t b, int64_t n1, int64_t i) const {
        const fa::ForwardParams& p = bp_.fwd;
        const fa::ReferenceRow r = fa::referenceRow(p, b, n1, i);
        double l = 0;
        for (int64_t c = 0; c < p.dv; ++c) l += double(bp_.dy.load(b, n1, p.seq.qStart[size_t(b)] + i, c)) * r.out[size_t(c)];
        return l;
    }
    double headLoss(int64_t b, int64_t n1) const {
        double l = 0;
        for (int64_t i = 0; i < bp_.fwd.seq.qLen[size_t(b)]; ++i) l += rowLoss(b, n1, i);
        return l;
    }

    // Central difference of `loss` in element `index` of t (fp32), restoring it after.
    template <typename Loss>
    static double derivative(HostTensor& t, int64_t index, Loss&& loss) {
        constexpr double h = 1e-3;
        const float x = t.get(index);
        const float xp = float(double(x) + h), xm = float(double(x) - h);
        t.set(index, xp);
        const double lp = loss();
        t.set(index, xm);
        const double lm = loss();
        t.set(index, x);
        return (lp - lm) / (double(xp) - double(xm));
    }

    FaInstance& inst_;
    FaGrads grads_;
    fa::BackwardParams bp_;
    std::vector<fa::ReferenceHeadGrads> heads_;
};

struct FdCase {
    std::string name;
    FaProblem problem;
    std::function<void(FaInstance&)> tweak;  // optional: edit inputs (masks) after construction
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name << " (" << c.problem.describe() << ")"; }

class FaBackwardReferenceFd : public ::testing::TestWithParam<FdCase> {};

TEST_P(FaBackwardReferenceFd, MatchesFiniteDifferences) {
    FaInstance inst(GetParam().problem);
    if (GetParam().tweak) GetParam().tweak(inst);
    FiniteDifferences fd(inst);
    fd.checkAll();
}

// Rows of query (b, n1, i) masked in every head by an explicit [B,1,S1,S2] / [S1,S2] mask.
void maskRows(FaInstance& inst, std::initializer_list<int64_t> rows) {
    const auto& sh = inst.attenMask.shape();
    const int64_t s1 = sh[sh.size() - 2], s2 = sh.back();
    const int64_t planes = inst.attenMask.numel() / (s1 * s2);
    for (int64_t pl = 0; pl < planes; ++pl)
        for (int64_t i : rows)
            for (int64_t j = 0; j < s2; ++j) inst.attenMask.set((pl * s1 + i) * s2 + j, 1.0f);
}

std::vector<FdCase> fdCases() {
    std::vector<FdCase> c;
    const FaProblem base = fixed("BNSD", F32, 2, 10, 12, 4, 2, 8, 6);  // GQA, Dv < D
    c.push_back({"plain_gqa_dv", base, nullptr});
    c.push_back({"mqa_bsh", fixed("BSH", F32, 1, 9, 7, 3, 1, 5), nullptr});
    c.push_back({"causal_m2", withMode(base, 2), nullptr});
    // Sq > Skv bottom-right causal: the first Sq - Skv rows keep no key (with a sink too).
    c.push_back({"causal_m3_masked_rows_sink", withSink(withMode(fixed("BSND", F32, 1, 12, 7, 2, 1, 8), 3)), nullptr});
    c.push_back({"band_m0", withMode(base, 0, 3, 1), nullptr});
    c.push_back({"band_m4", withMode(base, 4, 2, 2), nullptr});
    {
        FaProblem p = withMode(fixed("SBH", F32, 2, 11, 12, 2, 1, 8), 0);
        p.maskKind = "random";
        c.push_back({"explicit_mask_masked_rows", p, [](FaInstance& inst) { maskRows(inst, {0, 5}); }});
        p.sink = true;
        c.push_back({"explicit_mask_masked_rows_sink", p, [](FaInstance& inst) { maskRows(inst, {3, 10}); }});
    }
    c.push_back({"prefix_m5", withMode(fixed("BNSD", F32, 2, 8, 12, 2, 2, 4), 5), nullptr});
    c.push_back({"pse0_full", withPse(base, 0), nullptr});
    c.push_back({"pse1_full", withPse(base, 1), nullptr});
    c.push_back({"pse1_row", withPse(withMode(base, 3), 1, "row"), nullptr});
    c.push_back({"pse2_slopes", withPse(fixed("BNSD", F32, 1, 12, 12, 4, 2, 8), 2), nullptr});
    c.push_back({"pse3_slopes_causal", withPse(withMode(fixed("BSH", F32, 1, 12, 12, 2, 1, 8), 2), 3), nullptr});
    c.push_back({"sink", withSink(base), nullptr});
    c.push_back({"dropout_explicit", withDropout(base, 0.7, true), nullptr});
    c.push_back({"dropout_generated_sink", withSink(withDropout(withMode(base, 3), 0.6, false)), nullptr});
    {
        FaProblem p = withSink(withMode(tnd(F32, {3, 0, 8, 1, 6}, {5, 2, 6, 1, 0}, 4, 2, 8, 4), 3));
        p.extraQRows = 2;
        p.extraKvRows = 3;
        c.push_back({"tnd_zero_len_tails_sink", p, nullptr});
        c.push_back({"tnd_m7", withMode(tnd(F32, {4, 6, 5}, {6, 7, 9}, 2, 1, 8), 7, 9, -1), nullptr});
        c.push_back({"tnd_m8_dropout", withDropout(withMode(tnd(F32, {4, 6, 5}, {6, 7, 9}, 2, 1, 8), 8, 2, 3), 0.8, true), nullptr});
        c.push_back({"tnd_pse0_row", withPse(tnd(F32, {4, 6, 5}, {6, 7, 9}, 2, 1, 8), 0, "row"), nullptr});
        c.push_back({"tnd_pse1_full", withPse(tnd(F32, {4, 6, 5}, {6, 7, 9}, 2, 1, 8), 1, "full"), nullptr});
    }
    {
        FaProblem p = withSink(base);
        p.scale = -0.7;
        p.dataScale = 2.0;
        c.push_back({"negative_scale_large_scores_sink", p, nullptr});
    }
    return c;
}

std::string fdName(const ::testing::TestParamInfo<FdCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Cases, FaBackwardReferenceFd, ::testing::ValuesIn(fdCases()), fdName);

// The reference's per-row dsink terms add up to its dsink, and masked rows give zero rows.
TEST(FaBackwardReference, MaskedRowsGiveZeroAndDsinkRowsSum) {
    FaInstance inst(withSink(withMode(fixed("BSND", F32, 1, 12, 7, 2, 1, 8), 3)));
    FiniteDifferences fd(inst);
    for (int64_t n1 = 0; n1 < 2; ++n1) {
        const fa::ReferenceHeadGrads& h = fd.head(0, n1);
        double sum = 0;
        for (double t : h.dsinkRows) sum += t;
        EXPECT_NEAR(sum, h.dsink, 1e-12);
        for (int64_t i = 0; i < 12 - 7; ++i) {
            EXPECT_EQ(h.dsinkRows[size_t(i)], 0.0) << i;
            for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(h.dq[size_t(i * 8 + c)], 0.0) << i;
        }
    }
}

// ================================================================ 2. attnops vs the reference

struct Case {
    std::string name;
    FaProblem problem;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << c.problem.describe() << ")"; }

class FaBackwardMatrix : public ::testing::TestWithParam<Case> {};

TEST_P(FaBackwardMatrix, MatchesReference) { expectGradMatches(GetParam().problem); }

std::string caseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

std::vector<Case> layoutCases() {
    std::vector<Case> cases;
    for (const char* layout : {"BSH", "SBH", "BSND", "BNSD"})
        for (attnopsDataType dt : {F32, F16, BF16}) {
            const std::string n = std::string(layout) + "_" + dtName(dt);
            cases.push_back({n, fixed(layout, dt, 2, 65, 129, 4, 2, 32)});
            cases.push_back({n + "_causal", withMode(fixed(layout, dt, 2, 129, 65, 2, 2, 32), 3)});
        }
    for (attnopsDataType dt : {F32, F16, BF16}) {
        FaProblem p = tnd(dt, {1, 64, 0, 65, 128}, {3, 64, 0, 129, 127}, 4, 2, 32);
        p.extraQRows = 3;
        p.extraKvRows = 2;
        cases.push_back({"TND_" + dtName(dt), p});
        cases.push_back({"TND_" + dtName(dt) + "_causal", withMode(p, 3)});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, FaBackwardMatrix, ::testing::ValuesIn(layoutCases()), caseName);

std::vector<Case> headCases() {
    std::vector<Case> cases;
    // GQA (N1 = 8, N2 = 2) and MQA (N2 = 1): dk/dv summed over each group.
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
    // Head dims on and around the key-block thresholds (64 keys per block up to D = 128, 32 up
    // to 256, 16 above); Skv = 70 crosses a key block in each.
    for (int64_t d : {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 768})
        cases.push_back({"D" + std::to_string(d) + "_f32", fixed("BNSD", F32, 1, 33, 70, 2, 1, d)});
    for (int64_t d : {1, 65, 128, 256, 257, 768}) {
        cases.push_back({"D" + std::to_string(d) + "_bf16_causal", withMode(fixed("BSH", BF16, 1, 33, 70, 2, 1, d), 3)});
        cases.push_back({"D" + std::to_string(d) + "_f16", fixed("SBH", F16, 1, 33, 50, 2, 2, d)});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Heads, FaBackwardMatrix, ::testing::ValuesIn(headCases()), caseName);

std::vector<Case> lengthCases() {
    std::vector<Case> cases;
    for (int64_t s : {1, 63, 64, 65, 127, 128, 129}) {
        const std::string n = std::to_string(s);
        cases.push_back({"S" + n + "_f32", fixed("BNSD", F32, 2, s, s, 2, 1, 32)});
        cases.push_back({"S" + n + "_bf16_causal", withMode(fixed("BSND", BF16, 1, s, s, 2, 2, 32), 2)});
        // D = 160 (32 keys per block) and D = 300 (16 keys per block) at the same lengths.
        cases.push_back({"S" + n + "_f32_D160_mode3", withMode(fixed("BSH", F32, 1, s, s, 1, 1, 160), 3)});
    }
    cases.push_back({"S33_f16_D300", fixed("SBH", F16, 1, 33, 33, 1, 1, 300)});
    cases.push_back({"S17x47_f32_D300_band", withMode(fixed("BNSD", F32, 1, 17, 47, 2, 1, 300), 4, 5, 7)});
    const std::pair<int64_t, int64_t> rect[] = {{1, 129}, {129, 1}, {64, 127}, {127, 64}, {65, 128}, {200, 63}, {63, 200}};
    for (auto [s1, s2] : rect) {
        const std::string n = std::to_string(s1) + "x" + std::to_string(s2);
        cases.push_back({"S" + n + "_f32", fixed("BSH", F32, 1, s1, s2, 2, 1, 32)});
        cases.push_back({"S" + n + "_f16_mode3", withMode(fixed("BNSD", F16, 1, s1, s2, 2, 1, 32), 3)});
        cases.push_back({"S" + n + "_f32_mode2", withMode(fixed("SBH", F32, 2, s1, s2, 2, 2, 16), 2)});
    }
    // Empty problems: nothing to compute; no keys (dq = 0); no queries (dk = dv = 0).
    cases.push_back({"Empty_B0_sink", withSink(fixed("BNSD", F32, 0, 16, 16, 2, 1, 16))});
    cases.push_back({"Empty_S1_0", fixed("BSH", F32, 2, 0, 16, 2, 1, 16)});
    cases.push_back({"Empty_S2_0_sink", withSink(fixed("BSND", BF16, 2, 16, 0, 2, 1, 16))});
    cases.push_back({"Empty_TND_all0", tnd(F32, {0, 0}, {0, 0}, 2, 1, 16)});
    {
        FaProblem p = tnd(F32, {0, 0}, {0, 0}, 2, 1, 16);
        p.extraQRows = 3;
        p.extraKvRows = 4;
        cases.push_back({"Empty_TND_only_tails", p});
    }
    // TND: zero-length sequences first/middle/last, length-1 sequences, Sq != Skv per sequence,
    // queries without keys and keys without queries, tails in q and kv.
    FaProblem z = tnd(F32, {0, 5, 64}, {0, 7, 64}, 2, 1, 32);
    cases.push_back({"TND_zero_first", z});
    z.qSeqLens = {3, 0, 65};
    z.kvSeqLens = {5, 0, 66};
    cases.push_back({"TND_zero_middle", z});
    z.qSeqLens = {64, 1, 0};
    z.kvSeqLens = {64, 3, 0};
    cases.push_back({"TND_zero_last", z});
    z.qSeqLens = {5, 9, 0, 4};
    z.kvSeqLens = {0, 0, 7, 0};
    cases.push_back({"TND_q_without_kv", z});
    cases.push_back({"TND_q_without_kv_sink", withSink(z)});
    z.qSeqLens = {1, 1, 1, 1};
    z.kvSeqLens = {1, 1, 1, 1};
    cases.push_back({"TND_len1", z});
    cases.push_back({"TND_len1_causal_bf16", withDtype(withMode(z, 3), BF16)});
    z.qSeqLens = {1, 70, 5, 129};
    z.kvSeqLens = {129, 5, 70, 1};
    cases.push_back({"TND_rect_bf16", withDtype(z, BF16)});
    z.extraQRows = 7;
    z.extraKvRows = 3;
    cases.push_back({"TND_tails", z});
    cases.push_back({"TND_tails_f16_sink", withSink(withDtype(z, F16))});
    z.statLanes = 1;
    cases.push_back({"TND_tails_lanes1", z});
    {
        FaProblem q = tnd(BF16, {0, 1, 0, 1}, {1, 0, 0, 1}, 2, 2, 16);
        q.extraQRows = 1;
        q.extraKvRows = 65;
        cases.push_back({"TND_tiny_long_kv_tail", q});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Lengths, FaBackwardMatrix, ::testing::ValuesIn(lengthCases()), caseName);

std::vector<Case> sparseCases() {
    std::vector<Case> cases;
    const std::pair<int64_t, int64_t> sizes[] = {{65, 129}, {129, 65}, {128, 128}};
    const char* layouts[] = {"BNSD", "BSH", "SBH", "BSND"};
    int variant = 0;
    for (auto [s1, s2] : sizes)
        for (attnopsDataType dt : {F32, F16, BF16}) {
            const char* layout = layouts[variant++ % 4];
            const std::string sz = std::to_string(s1) + "x" + std::to_string(s2) + "_" + layout + "_" + dtName(dt);
            const FaProblem base = fixed(layout, dt, 1, s1, s2, 2, 1, 16);
            auto add = [&](const std::string& name, FaProblem p) { cases.push_back({name + "_" + sz, std::move(p)}); };
            const std::pair<int64_t, int64_t> bands[] = {{10, 5}, {-5, 20}, {30, -10}, {0, 0}, {kNoBand, 0}};
            for (auto [pre, next] : bands) add("m0_band_" + tok(pre) + "_" + tok(next), withMode(base, 0, pre, next));
            {
                FaProblem p = withMode(base, 0);
                p.maskKind = "random";
                add("m0_mask_random", p);
                p = withMode(p, 0, 20, 20);
                add("m0_mask_band_random", p);
                FaProblem q = withMode(base, 0);
                q.maskKind = "causal";
                add("m0_mask_causal", q);
            }
            {
                FaProblem p = withMode(base, 1);
                p.maskKind = "random";
                add("m1_random", p);
            }
            add("m2", withMode(base, 2));
            add("m3", withMode(base, 3));
            const std::pair<int64_t, int64_t> bands4[] = {{20, 3}, {-3, 10}, {5, -2}};
            for (auto [pre, next] : bands4) add("m4_" + tok(pre) + "_" + tok(next), withMode(base, 4, pre, next));
            add("m5", withMode(base, 5));
            {
                FaProblem p = withMode(base, 5);
                p.maskKind = "random";
                const int64_t lo = s1 > s2 ? 0 : s2 - s1;
                p.prefix = {lo};
                add("m5_random_prefix_lo", p);
            }
            add("m6", withMode(base, 6));
            {
                FaProblem p = withMode(base, 6);
                p.prefix = {s2};
                add("m6_prefix_all", p);
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
        const FaProblem base = tnd(set == 0 ? F32 : BF16, q, kv, 2, 1, 16);
        ++set;
        auto add = [&](const std::string& name, FaProblem p) { cases.push_back({"TND_" + name + sfx, std::move(p)}); };
        add("m0_band_10_5", withMode(base, 0, 10, 5));
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
INSTANTIATE_TEST_SUITE_P(SparseModes, FaBackwardMatrix, ::testing::ValuesIn(sparseCases()), caseName);

std::vector<Case> pseCases() {
    std::vector<Case> cases;
    cases.push_back({"pse1_full_BNSD_f32", withPse(fixed("BNSD", F32, 2, 65, 129, 2, 1, 32), 1)});
    cases.push_back({"pse0_full_BSH_bf16", withPse(fixed("BSH", BF16, 2, 65, 129, 2, 1, 32), 0)});
    cases.push_back({"pse1_row_BSND_f16_causal", withPse(withMode(fixed("BSND", F16, 2, 129, 65, 2, 2, 32), 3), 1, "row")});
    cases.push_back({"pse0_row_SBH_f32_band", withPse(withMode(fixed("SBH", F32, 2, 64, 64, 2, 1, 32), 0, 7, 3), 0, "row")});
    cases.push_back({"pse1_full_mode4_bf16", withPse(withMode(fixed("BNSD", BF16, 1, 64, 100, 2, 1, 32), 4, 10, 10), 1)});
    // Compressed alibi: S > 1024 in a cheap configuration (D = 8, N = 1), lower-triangular masks.
    cases.push_back({"pse1_compressed_alibi_m2_f32", withPse(withMode(fixed("BNSD", F32, 1, 1100, 1100, 1, 1, 8), 2), 1, "compressed")});
    cases.push_back({"pse0_compressed_alibi_m3_bf16", withPse(withMode(fixed("BSH", BF16, 1, 1030, 1030, 1, 1, 8), 3), 0, "compressed")});
    cases.push_back({"pse1_compressed_alibi_m0_band_f16",
                     withPse(withMode(fixed("SBH", F16, 1, 1030, 1030, 1, 1, 8), 0, 100, -3), 1, "compressed")});
    // TND forms: flattened [sum N1*Sq*Skv], row broadcast [sum N1*Skv], compressed 4-D.
    const FaProblem t = tnd(F32, {5, 64, 1, 70}, {9, 65, 1, 3}, 2, 1, 32);
    cases.push_back({"pse1_TND_full", withPse(t, 1)});
    cases.push_back({"pse0_TND_full_bf16", withPse(withDtype(t, BF16), 0)});
    cases.push_back({"pse1_TND_row_causal", withPse(withMode(t, 3), 1, "row")});
    cases.push_back({"pse0_TND_row_m8_f16", withPse(withMode(withDtype(t, F16), 8, 100, 4), 0, "row")});
    const FaProblem sq = tnd(F32, {5, 64, 100, 1}, {5, 64, 100, 1}, 2, 1, 16);
    cases.push_back({"pse1_TND_compressed_m3", withPse(withMode(sq, 3), 1, "compressed")});
    cases.push_back({"pse0_TND_compressed_m2_f16", withPse(withMode(withDtype(sq, F16), 2), 0, "compressed")});
    // Inner alibi slopes (pseType 2: linear distance, 3: square root).
    for (int type : {2, 3}) {
        const std::string n = std::to_string(type);
        cases.push_back({"pse" + n + "_BNSD_f32", withPse(fixed("BNSD", F32, 2, 65, 65, 4, 2, 32), type)});
        cases.push_back({"pse" + n + "_BSH_bf16_causal", withPse(withMode(fixed("BSH", BF16, 1, 70, 70, 4, 1, 32), 3), type)});
        cases.push_back({"pse" + n + "_TND_f16", withPse(tnd(F16, {5, 0, 64}, {5, 3, 64}, 2, 1, 32), type)});
    }
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Pse, FaBackwardMatrix, ::testing::ValuesIn(pseCases()), caseName);

std::vector<Case> featureCases() {
    std::vector<Case> cases;
    for (double keep : {0.5, 0.9})
        for (bool ex : {false, true}) {
            const std::string n = std::string(keep == 0.5 ? "k50" : "k90") + (ex ? "_explicit" : "_generated");
            cases.push_back({"drop_" + n + "_BNSD_f32", withDropout(fixed("BNSD", F32, 2, 65, 70, 2, 1, 32), keep, ex)});
            cases.push_back({"drop_" + n + "_BSH_bf16_causal", withDropout(withMode(fixed("BSH", BF16, 1, 70, 65, 4, 2, 32), 3), keep, ex)});
            cases.push_back({"drop_" + n + "_TND_f16", withDropout(tnd(F16, {5, 0, 64, 1}, {7, 3, 65, 1}, 2, 1, 32), keep, ex)});
        }
    cases.push_back({"drop_k10_SBH_f32_sink", withSink(withDropout(fixed("SBH", F32, 1, 40, 70, 2, 2, 16), 0.1, false, 7, 3))});
    cases.push_back({"sink_BNSD_f32_gqa", withSink(fixed("BNSD", F32, 2, 65, 70, 4, 2, 32))});
    cases.push_back({"sink_BSH_bf16_mode3_masked_rows", withSink(withMode(fixed("BSH", BF16, 1, 129, 64, 2, 1, 32), 3))});
    cases.push_back({"sink_TND_f32_mode2", withSink(withMode(tnd(F32, {0, 65, 3}, {4, 70, 0}, 2, 1, 32), 2))});
    cases.push_back({"sink_drop_pse_f16", [] {
                         FaProblem p = withSink(withDropout(fixed("SBH", F16, 1, 64, 65, 2, 1, 32), 0.8, false));
                         p.pseType = 1;
                         return p;
                     }()});
    FaProblem lanes = fixed("BSND", F32, 2, 65, 65, 2, 1, 32);
    lanes.statLanes = 1;
    cases.push_back({"stats_lanes1_f32", lanes});
    cases.push_back({"stats_lanes1_bf16_sink_tnd", withSink(withDtype([] {
                                                        FaProblem p = tnd(F32, {3, 66, 0}, {9, 65, 2}, 2, 1, 32);
                                                        p.statLanes = 1;
                                                        return p;
                                                    }(),
                                                    BF16))});
    FaProblem scaled = fixed("BNSD", BF16, 1, 65, 65, 2, 1, 32);
    scaled.scale = 1.0;
    scaled.dataScale = 2.0;
    cases.push_back({"scale1_data2_bf16", scaled});
    scaled.scale = -0.3;
    scaled.dtype = F32;
    cases.push_back({"scale_negative_f32", scaled});
    FaProblem ip = fixed("BSH", F16, 1, 40, 40, 2, 1, 16);
    ip.innerPrecise = 2;
    cases.push_back({"inner_precise2_f16", ip});
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Features, FaBackwardMatrix, ::testing::ValuesIn(featureCases()), caseName);

// Several query and key blocks per unit row, many work chunks per thread.
std::vector<Case> biggerCases() {
    std::vector<Case> cases;
    cases.push_back({"BNSD_bf16_causal_S300_D128_gqa", withMode(fixed("BNSD", BF16, 1, 300, 300, 4, 2, 128), 2)});
    cases.push_back({"TND_f16_mode3_D64", withMode(tnd(F16, {200, 0, 130, 257}, {200, 7, 131, 257}, 2, 1, 64), 3)});
    cases.push_back({"BSH_f32_mode4_D96", withMode(fixed("BSH", F32, 1, 250, 330, 2, 2, 96), 4, 60, 30)});
    cases.push_back({"SBH_bf16_D256_dropout_sink", withSink(withDropout(fixed("SBH", BF16, 1, 150, 150, 2, 1, 256), 0.9, false, 5))});
    cases.push_back({"BNSD_f32_D160_mode4_multiblock", withMode(fixed("BNSD", F32, 1, 200, 260, 2, 1, 160), 4, 50, -10)});
    cases.push_back({"BSND_bf16_D300_band_multiblock", withMode(fixed("BSND", BF16, 1, 150, 150, 2, 2, 300), 0, 20, 20)});
    cases.push_back({"BSH_f16_prefix_m6_multiblock", withMode(fixed("BSH", F16, 2, 200, 300, 2, 1, 32), 6)});
    cases.push_back({"TND_f32_m7_multiblock", withMode(tnd(F32, {0, 150, 90, 200, 0}, {3, 170, 90, 190, 0}, 2, 1, 48), 7, 250, -5)});
    cases.push_back({"TND_bf16_m8_multiblock_sink", withSink(withMode(tnd(BF16, {130, 200, 70}, {140, 200, 80}, 4, 2, 40), 8, 30, 20))});
    return cases;
}
INSTANTIATE_TEST_SUITE_P(Bigger, FaBackwardMatrix, ::testing::ValuesIn(biggerCases()), caseName);

// ---------------------------------------------------------------- specific behaviours

// Element offset of dq/query (b, n1, row, c).
int64_t qOffset(const FaInstance& inst, int64_t b, int64_t n, int64_t s, int64_t c) {
    return elemOffset(inst.problem.layout, inst.query.shape(), inst.problem.heads, inst.problem.dim, b, n, s, c);
}

void expectZeroDqRow(const FaInstance& inst, const FaGrads& g, int64_t b, int64_t n, int64_t row) {
    for (int64_t c = 0; c < inst.problem.dim; ++c) {
        const float v = g.dq.get(qOffset(inst, b, n, row, c));
        ASSERT_EQ(v, 0.0f) << "dq b " << b << " head " << n << " row " << row << " col " << c;
    }
}

TEST(FaBackwardMasked, FullyMaskedRowsGiveZeroDqExactly) {
    for (bool sink : {false, true})
        for (attnopsDataType dt : {F32, BF16}) {
            // Bottom-right causal with Sq > Skv: rows i < Sq - Skv keep no key.
            FaProblem p = withMode(fixed("BSND", dt, 2, 129, 40, 2, 1, 32), 3);
            p.sink = sink;
            FaInstance inst(p);
            runForward(inst);
            FaGrads g = attnops::tools::makeGrads(inst);
            runGrad(inst, g);
            if (HasFatalFailure()) return;
            expectGradChecked(inst, g);
            for (int64_t b = 0; b < 2; ++b)
                for (int64_t n = 0; n < 2; ++n)
                    for (int64_t i = 0; i < 129 - 40; ++i) expectZeroDqRow(inst, g, b, n, i);
            if (HasFatalFailure()) return;
        }
    // Band rows outside the matrix, and an explicit [B,N1,S1,S2] mask with a whole (b, n1) plane
    // masked (its rows give dq = 0 and nothing to dk/dv: the other head alone is checked).
    {
        FaProblem p = withSink(withMode(fixed("BNSD", F32, 1, 100, 20, 2, 1, 16), 0, 10, 0));
        FaInstance inst(p);
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        expectGradChecked(inst, g);
        for (int64_t n = 0; n < 2; ++n)
            for (int64_t i = 30; i < 100; ++i) expectZeroDqRow(inst, g, 0, n, i);
    }
    {
        const int64_t b = 2, n1 = 2, s1 = 40, s2 = 65;
        FaProblem p = withMode(fixed("BNSD", F32, b, s1, s2, n1, 1, 16), 0);
        p.maskKind = "random";
        FaInstance inst(p);
        inst.attenMask = HostTensor(ATTNOPS_UINT8, {b, n1, s1, s2});
        for (int64_t e = 0; e < inst.attenMask.numel(); ++e) inst.attenMask.set(e, ((e * 2654435761u) >> 7) % 3 == 0 ? 1.0f : 0.0f);
        for (int64_t e = 0; e < s1 * s2; ++e) inst.attenMask.set((1 * n1 + 1) * s1 * s2 + e, 1.0f);
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        expectGradChecked(inst, g);
        for (int64_t i = 0; i < s1; ++i) expectZeroDqRow(inst, g, 1, 1, i);
    }
}

TEST(FaBackwardMasked, TndQueriesWithoutKeysGiveZeroDq) {
    // Sequence 1 has queries and no keys; sequence 2 keys and no queries (dk = dv = 0 there).
    FaProblem p = withSink(tnd(F32, {4, 6, 0, 3}, {5, 0, 7, 3}, 2, 1, 16));
    FaInstance inst(p);
    runForward(inst);
    FaGrads g = attnops::tools::makeGrads(inst);
    runGrad(inst, g);
    if (HasFatalFailure()) return;
    expectGradChecked(inst, g);
    for (int64_t row = 4; row < 10; ++row)
        for (int64_t n = 0; n < 2; ++n) expectZeroDqRow(inst, g, 0, n, row);
    for (int64_t row = 5; row < 12; ++row)
        for (int64_t c = 0; c < 16; ++c) {
            EXPECT_EQ(g.dk.get(row * 16 + c), 0.0f) << row;
            EXPECT_EQ(g.dv.get(row * 16 + c), 0.0f) << row;
        }
}

TEST(FaBackwardDropout, GeneratedAndExplicitMasksGiveBitwiseEqualGradients) {
    const FaProblem problems[] = {
        withDropout(fixed("BNSD", F32, 2, 65, 70, 2, 1, 32), 0.7, false, 99, 12),
        withSink(withDropout(withMode(fixed("BSH", BF16, 1, 129, 64, 4, 2, 32), 3), 0.5, false, 1, 0)),
        withDropout(tnd(F16, {5, 0, 64, 1, 70}, {7, 3, 65, 1, 70}, 2, 1, 32), 0.9, false, 123456789012345ll, 77),
    };
    for (const FaProblem& p : problems) {
        FaProblem e = p;
        e.explicitDropMask = true;
        FaInstance gen(p), ex(e);
        ASSERT_FALSE(ex.dropMask.empty());
        runForward(gen);
        runForward(ex);
        ASSERT_TRUE(sameBytes(gen.attentionOut, ex.attentionOut)) << p.describe();
        FaGrads gg = attnops::tools::makeGrads(gen), ge = attnops::tools::makeGrads(ex);
        runGrad(gen, gg);
        runGrad(ex, ge);
        if (HasFatalFailure()) return;
        expectSameGrads(gg, ge, p.describe());
        expectGradChecked(gen, gg);
    }
}

TEST(FaBackwardDropout, BackwardHonoursTheMaskBits) {
    // The same forward outputs with a different dropout mask in the backward give different
    // gradients (the mask is read, not ignored), and keepProb = 1 ignores seed and mask.
    FaProblem p = withDropout(fixed("BNSD", F32, 1, 40, 40, 2, 1, 16), 0.6, true);
    FaInstance inst(p);
    runForward(inst);
    FaGrads a = attnops::tools::makeGrads(inst);
    runGrad(inst, a);
    for (auto& byte : inst.dropMask.bytes()) byte = uint8_t(byte ^ 0x10);
    FaGrads b = attnops::tools::makeGrads(inst);
    runGrad(inst, b);
    if (HasFatalFailure()) return;
    EXPECT_FALSE(sameBytes(a.dv, b.dv));
    EXPECT_FALSE(sameBytes(a.dq, b.dq));

    FaProblem one = fixed("BNSD", F32, 1, 40, 40, 2, 1, 16);
    FaInstance plain(one);
    one.seed = 5;
    one.offset = 9;
    FaInstance seeded(one);
    seeded.dropMask = HostTensor(ATTNOPS_UINT8, {int64_t(40 * 40 * 2 / 8)});  // all drop: ignored at keepProb 1
    runForward(plain);
    runForward(seeded);
    FaGrads gp = attnops::tools::makeGrads(plain), gs = attnops::tools::makeGrads(seeded);
    runGrad(plain, gp);
    runGrad(seeded, gs);
    if (HasFatalFailure()) return;
    expectSameGrads(gp, gs, "keepProb 1");
}

TEST(FaBackwardStats, OnlyLaneZeroIsRead) {
    // Lanes 1..7 overwritten with garbage: the gradients do not change; and [..,1] statistics
    // give the same gradients as [..,8].
    for (const FaProblem& base : {withSink(fixed("BSND", F32, 2, 65, 65, 2, 1, 32)),
                                  withMode(tnd(BF16, {3, 66, 0, 9}, {9, 65, 2, 9}, 2, 1, 32), 3)}) {
        FaInstance inst(base);
        runForward(inst);
        FaGrads a = attnops::tools::makeGrads(inst);
        runGrad(inst, a);
        for (HostTensor* t : {&inst.softmaxMax, &inst.softmaxSum})
            for (int64_t e = 0; e < t->numel(); ++e)
                if (e % 8 != 0) t->set(e, e % 3 == 0 ? std::numeric_limits<float>::quiet_NaN() : 1e30f);
        FaGrads b = attnops::tools::makeGrads(inst);
        runGrad(inst, b);
        if (HasFatalFailure()) return;
        expectSameGrads(a, b, "garbage in lanes 1..7");

        FaProblem one = base;
        one.statLanes = 1;
        FaInstance inst1(one);
        runForward(inst1);
        ASSERT_TRUE(sameBytes(inst.attentionOut, inst1.attentionOut));
        FaGrads c = attnops::tools::makeGrads(inst1);
        runGrad(inst1, c);
        if (HasFatalFailure()) return;
        expectSameGrads(a, c, "lanes 1 vs 8");
    }
}

TEST(FaBackwardTnd, TrailingZeroCumulativeArraysMeanNotComputed) {
    // [2,5,9,0,0]: sequences 3 and 4 are not computed; rows beyond 9 are tails.
    FaProblem p = withSink(tnd(F32, {2, 3, 4, 0, 0}, {3, 2, 4, 0, 0}, 2, 1, 16));
    p.extraQRows = 3;
    p.extraKvRows = 2;
    FaInstance inst(p);
    inst.qCumulative = {2, 5, 9, 0, 0};
    inst.kvCumulative = {3, 5, 9, 0, 0};
    runForward(inst);
    FaGrads g = attnops::tools::makeGrads(inst);
    runGrad(inst, g);
    if (HasFatalFailure()) return;
    expectGradChecked(inst, g);
    expectTndTails(inst, g);

    // The same as the plain list of three sequences.
    FaProblem q = p;
    q.qSeqLens = {2, 3, 4};
    q.kvSeqLens = {3, 2, 4};
    FaInstance plain(q);
    runForward(plain);
    FaGrads h = attnops::tools::makeGrads(plain);
    runGrad(plain, h);
    if (HasFatalFailure()) return;
    expectSameGrads(g, h, "trailing zeros");
}

TEST(FaBackwardTnd, SequencesDoNotSeeEachOther) {
    // Changing sequence 0's inputs leaves sequence 1's gradients bitwise unchanged.
    FaProblem p = tnd(F32, {40, 70}, {50, 66}, 2, 1, 32);
    FaInstance a(p), b(p);
    for (int64_t e = 0; e < 40 * 2 * 32; ++e) b.query.set(e, 0.5f * a.query.get(e) + 0.1f);
    for (int64_t e = 0; e < 50 * 1 * 32; ++e) {
        b.key.set(e, -a.key.get(e));
        b.value.set(e, a.value.get(e) * 3.0f);
    }
    runForward(a);
    runForward(b);
    FaGrads ga = attnops::tools::makeGrads(a), gb = attnops::tools::makeGrads(b);
    runGrad(a, ga);
    runGrad(b, gb);
    if (HasFatalFailure()) return;
    auto tailBytesEqual = [](const HostTensor& x, const HostTensor& y, int64_t fromElem) {
        const size_t es = attnopsDataTypeSize(x.dtype());
        return std::equal(x.bytes().begin() + long(size_t(fromElem) * es), x.bytes().end(), y.bytes().begin() + long(size_t(fromElem) * es));
    };
    EXPECT_TRUE(tailBytesEqual(ga.dq, gb.dq, 40 * 2 * 32));
    EXPECT_TRUE(tailBytesEqual(ga.dk, gb.dk, 50 * 32));
    EXPECT_TRUE(tailBytesEqual(ga.dv, gb.dv, 50 * 32));
    EXPECT_FALSE(sameBytes(ga.dq, gb.dq));
}

TEST(FaBackwardCross, GqaEqualsRepeatedKvHeads) {
    // N1 = 4 over N2 = 2 equals N1 = 4 over N2 = 4 with each kv head repeated, when the repeated
    // heads' dk/dv are added: within both runs' tolerances.
    const int64_t s = 70, d = 16;
    FaProblem g = fixed("BNSD", F32, 1, s, s, 4, 2, d);
    FaProblem m = fixed("BNSD", F32, 1, s, s, 4, 4, d);
    FaInstance gi(g), mi(m);
    for (int64_t e = 0; e < gi.query.numel(); ++e) mi.query.set(e, gi.query.get(e));
    for (int64_t n = 0; n < 4; ++n)
        for (int64_t e = 0; e < s * d; ++e) {
            mi.key.set(n * s * d + e, gi.key.get((n / 2) * s * d + e));
            mi.value.set(n * s * d + e, gi.value.get((n / 2) * s * d + e));
        }
    runForward(gi);
    runForward(mi);
    FaGrads gg = attnops::tools::makeGrads(gi), gm = attnops::tools::makeGrads(mi);
    runGrad(gi, gg);
    runGrad(mi, gm);
    if (HasFatalFailure()) return;
    const GradCheck rg = expectGradChecked(gi, gg), rm = expectGradChecked(mi, gm);
    EXPECT_EQ(gg.dq.bytes(), gm.dq.bytes());  // dq does not depend on the grouping
    double dkErr = 0, dvErr = 0;
    for (int64_t n2 = 0; n2 < 2; ++n2)
        for (int64_t e = 0; e < s * d; ++e) {
            const double dkSum = double(gm.dk.get((2 * n2) * s * d + e)) + gm.dk.get((2 * n2 + 1) * s * d + e);
            const double dvSum = double(gm.dv.get((2 * n2) * s * d + e)) + gm.dv.get((2 * n2 + 1) * s * d + e);
            dkErr = std::max(dkErr, std::fabs(dkSum - gg.dk.get(n2 * s * d + e)));
            dvErr = std::max(dvErr, std::fabs(dvSum - gg.dv.get(n2 * s * d + e)));
        }
    EXPECT_LE(dkErr, rg.tolerance[1] + 2 * rm.tolerance[1] + 1e-6);
    EXPECT_LE(dvErr, rg.tolerance[2] + 2 * rm.tolerance[2] + 1e-6);
}

TEST(FaBackwardCross, LayoutsAgreeBitwise) {
    // One problem in the five layouts (TND as B = 1): the same gradient values element by element.
    const int64_t s1 = 70, s2 = 65, n1 = 4, n2 = 2, d = 32;
    std::vector<std::vector<float>> results;  // dq, dk, dv in (n, s, c) order per layout
    for (const char* layout : {"BNSD", "BSH", "SBH", "BSND", "TND"}) {
        FaProblem p = std::string(layout) == "TND" ? tnd(BF16, {s1}, {s2}, n1, n2, d) : fixed(layout, BF16, 1, s1, s2, n1, n2, d);
        p = withSink(withMode(p, 4, 20, 5));
        // Inputs in BNSD order, copied into this layout.
        FaInstance ref(withSink(withMode(fixed("BNSD", BF16, 1, s1, s2, n1, n2, d), 4, 20, 5)));
        FaInstance inst(p);
        for (int64_t n = 0; n < n1; ++n)
            for (int64_t s = 0; s < s1; ++s)
                for (int64_t c = 0; c < d; ++c)
                    inst.query.set(elemOffset(layout, inst.query.shape(), n1, d, 0, n, s, c), ref.query.get((n * s1 + s) * d + c));
        for (int64_t n = 0; n < n2; ++n)
            for (int64_t s = 0; s < s2; ++s)
                for (int64_t c = 0; c < d; ++c) {
                    inst.key.set(elemOffset(layout, inst.key.shape(), n2, d, 0, n, s, c), ref.key.get((n * s2 + s) * d + c));
                    inst.value.set(elemOffset(layout, inst.value.shape(), n2, d, 0, n, s, c), ref.value.get((n * s2 + s) * d + c));
                }
        for (int64_t n = 0; n < n1; ++n) inst.sink.set(n, ref.sink.get(n));
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        FaGrads gref = attnops::tools::makeGrads(ref);
        for (int64_t n = 0; n < n1; ++n)
            for (int64_t s = 0; s < s1; ++s)
                for (int64_t c = 0; c < d; ++c)
                    g.dy.set(elemOffset(layout, g.dy.shape(), n1, d, 0, n, s, c), gref.dy.get((n * s1 + s) * d + c));
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        expectGradChecked(inst, g);
        std::vector<float> flat;
        for (int64_t n = 0; n < n1; ++n)
            for (int64_t s = 0; s < s1; ++s)
                for (int64_t c = 0; c < d; ++c) flat.push_back(g.dq.get(elemOffset(layout, g.dq.shape(), n1, d, 0, n, s, c)));
        for (const HostTensor* t : {&g.dk, &g.dv})
            for (int64_t n = 0; n < n2; ++n)
                for (int64_t s = 0; s < s2; ++s)
                    for (int64_t c = 0; c < d; ++c) flat.push_back(t->get(elemOffset(layout, t->shape(), n2, d, 0, n, s, c)));
        for (int64_t n = 0; n < n1; ++n) flat.push_back(g.dsink.get(n));
        results.push_back(std::move(flat));
    }
    for (size_t l = 1; l < results.size(); ++l) EXPECT_TRUE(results[l] == results[0]) << "layout " << l;
}

TEST(FaBackwardPse, SlopesWithStartIndicesAndPerBatchSlopes) {
    // Inner alibi with start offsets (only element 0 of each array is used): against the
    // reference; shifting both starts by the same amount changes no bit. Then [B,N1] slopes.
    for (int type : {2, 3})
        for (auto [qs, ks] : {std::pair<int64_t, int64_t>{5, 2}, {0, 40}, {-7, 3}}) {
            FaProblem p = withSink(withPse(fixed("BSND", F32, 2, 40, 65, 4, 2, 16), type));
            FaInstance inst(p), shifted(p);
            inst.qStartIdx = {qs, 99};
            inst.kvStartIdx = {ks};
            shifted.qStartIdx = {qs + 11};
            shifted.kvStartIdx = {ks + 11};
            runForward(inst);
            runForward(shifted);
            FaGrads a = attnops::tools::makeGrads(inst), b = attnops::tools::makeGrads(shifted);
            runGrad(inst, a);
            runGrad(shifted, b);
            if (HasFatalFailure()) return;
            expectGradChecked(inst, a);
            expectSameGrads(a, b, "shifted starts");
        }
    FaProblem p = withPse(withMode(fixed("BNSD", BF16, 3, 50, 50, 2, 1, 16), 3), 3);
    FaInstance inst(p);
    inst.pse = HostTensor(F32, {3, 2});
    for (int64_t e = 0; e < 6; ++e) inst.pse.set(e, 0.05f + 0.2f * float(e));
    runForward(inst);
    FaGrads g = attnops::tools::makeGrads(inst);
    runGrad(inst, g);
    if (HasFatalFailure()) return;
    expectGradChecked(inst, g);
}

TEST(FaBackwardMask, TndGlobalRowsMaskAndBoolDtype) {
    // attenMask [T1, T2] (absolute rows, bool) equals the [maxSq, maxSkv] uint8 form bitwise.
    FaProblem p = withSink(tnd(F32, {5, 0, 40, 3}, {7, 2, 33, 3}, 2, 1, 16));
    p.maskKind = "random";
    p.extraQRows = 2;
    p.extraKvRows = 1;
    FaInstance local(p), global(p);
    const int64_t t1 = 50, t2 = 46, mk = 33;
    global.attenMask = HostTensor(ATTNOPS_BOOL, {t1, t2});
    for (int64_t e = 0; e < t1 * t2; ++e) global.attenMask.set(e, 1.0f);
    int64_t q0 = 0, k0 = 0;
    for (size_t b = 0; b < p.qSeqLens.size(); ++b) {
        for (int64_t i = 0; i < p.qSeqLens[b]; ++i)
            for (int64_t j = 0; j < p.kvSeqLens[b]; ++j) global.attenMask.set((q0 + i) * t2 + k0 + j, local.attenMask.get(i * mk + j));
        q0 += p.qSeqLens[b];
        k0 += p.kvSeqLens[b];
    }
    runForward(local);
    runForward(global);
    FaGrads a = attnops::tools::makeGrads(local), b = attnops::tools::makeGrads(global);
    runGrad(local, a);
    runGrad(global, b);
    if (HasFatalFailure()) return;
    expectGradChecked(global, b);
    expectTndTails(global, b);
    expectSameGrads(a, b, "[T1,T2] bool vs [maxSq,maxSkv] uint8");
}

// ---------------------------------------------------------------- a NULL attenMask (spec section 0)

// The gradients of p without an attenMask: checked against the reference, and the bits of full
// attention (mode 1, no mask).
void expectFullAttentionGrads(FaProblem p, const std::string& what) {
    p.maskKind = "none";
    FaInstance inst(p), full(withMode(p, 1));
    runForward(inst);
    runForward(full);
    FaGrads a = attnops::tools::makeGrads(inst), b = attnops::tools::makeGrads(full);
    runGrad(inst, a);
    runGrad(full, b);
    if (::testing::Test::HasFatalFailure()) return;
    expectGradChecked(inst, a);
    expectSameGrads(a, b, what);
}

TEST(FaBackwardNullMask, EveryModeIsFullAttention) {
    const FaProblem base = withSink(fixed("BSND", F32, 2, 37, 70, 4, 2, 16));
    for (int64_t mode : {0, 2, 3, 4, 5, 6}) {
        FaProblem p = withMode(base, mode, 3, -1);
        if (mode >= 5) p.prefix = {40, 50};
        expectFullAttentionGrads(p, "mode " + std::to_string(mode));
    }
    const FaProblem packed = tnd(BF16, {5, 0, 9, 70}, {6, 3, 9, 64}, 2, 1, 8);
    for (int64_t mode : {3, 7, 8}) expectFullAttentionGrads(withMode(packed, mode, 2, -1), "TND mode " + std::to_string(mode));
}

TEST(FaBackwardNullMask, MindSpeedRingCallPatterns) {
    // MindSpeed's ring attention backward calls (shared/context-parallel.md 2.3), SBH shards of
    // two chunks of c tokens: mode 0 with pre = next = Skv and no mask on Sq = 2 Skv and on
    // Sq = Skv / 2 blocks, mode 1 without a mask (full attention), mode 3 with the compressed mask
    // on diagonal blocks (causal, against the reference).
    const int64_t c = 48;
    for (attnopsDataType dt : {F32, BF16}) {
        expectFullAttentionGrads(withMode(fixed("SBH", dt, 2, 2 * c, c, 4, 4, 32), 0, c, c), "earlier rank's block");
        expectFullAttentionGrads(withMode(fixed("SBH", dt, 2, c, 2 * c, 4, 4, 32), 0, 2 * c, 2 * c), "later rank's block");
        expectFullAttentionGrads(withMode(fixed("SBH", dt, 2, 2 * c, 2 * c, 4, 4, 32), 1), "non-causal block");
        FaProblem diagonal = withMode(fixed("SBH", dt, 2, 2 * c, 2 * c, 4, 4, 32), 3, 2 * c, 0);
        diagonal.maskKind = "compressed";
        expectGradMatches(diagonal);
    }
}

TEST(FaBackwardNonFinite, NanInDyStaysInItsRow) {
    // dy row i of head n NaN: dq of that (head, row) is NaN, every other dq row stays finite
    // and equal to the clean run; nothing crashes with an infinite key either.
    FaProblem p = fixed("BNSD", F32, 1, 70, 70, 2, 1, 16);
    FaInstance inst(p);
    runForward(inst);
    FaGrads clean = attnops::tools::makeGrads(inst), dirty = attnops::tools::makeGrads(inst);
    dirty.dy.set((1 * 70 + 33) * 16 + 5, std::numeric_limits<float>::quiet_NaN());
    runGrad(inst, clean);
    runGrad(inst, dirty);
    if (HasFatalFailure()) return;
    for (int64_t n = 0; n < 2; ++n)
        for (int64_t i = 0; i < 70; ++i) {
            const bool hit = n == 1 && i == 33;
            for (int64_t c = 0; c < 16; ++c) {
                const int64_t e = (n * 70 + i) * 16 + c;
                if (hit)
                    EXPECT_TRUE(std::isnan(dirty.dq.get(e))) << c;
                else
                    ASSERT_EQ(dirty.dq.get(e), clean.dq.get(e)) << n << " " << i << " " << c;
            }
        }
    FaInstance inf(p);
    inf.key.set(3 * 16 + 2, std::numeric_limits<float>::infinity());
    inf.query.set(10 * 16 + 1, -std::numeric_limits<float>::infinity());
    runForward(inf);
    FaGrads g = attnops::tools::makeGrads(inf);
    runGrad(inf, g);
}

// ---------------------------------------------------------------- strided gradient outputs

// A tensor view with explicit strides over a buffer this object owns (filled with 0xCD).
struct ViewTensor {
    std::vector<uint8_t> bytes;
    attnopsTensor* handle = nullptr;
    ViewTensor(attnopsDataType dt, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t storageElements)
        : bytes(size_t(storageElements) * attnopsDataTypeSize(dt), 0xCD) {
        EXPECT_EQ(attnopsCreateTensor(bytes.data(), dt, int64_t(shape.size()), shape.data(), strides.data(), ATTNOPS_HOST_MEMORY, &handle),
                  ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
    }
    ~ViewTensor() { attnopsDestroyTensor(handle); }
    ViewTensor(const ViewTensor&) = delete;
    ViewTensor& operator=(const ViewTensor&) = delete;
};

// An attnops int array for the duration of a call.
struct IntArray {
    attnopsIntArray* handle = nullptr;
    explicit IntArray(const std::vector<int64_t>& v) { EXPECT_EQ(attnopsCreateIntArray(v.data(), v.size(), &handle), ATTNOPS_SUCCESS); }
    ~IntArray() { attnopsDestroyIntArray(handle); }
    IntArray(const IntArray&) = delete;
    IntArray& operator=(const IntArray&) = delete;
};

// Every argument of one backward GetWorkspaceSize call, taken from an instance and its
// gradients; fields may be replaced before plan() / run().
struct GradCall {
    const attnopsTensor *q, *k, *v, *dy, *pse, *drop, *padding = nullptr, *mask, *smax, *ssum, *softmaxIn = nullptr, *attnIn,
                                                                          *sink;
    const attnopsTensor *dq, *dk, *dv, *dpse = nullptr, *dsink;
    std::unique_ptr<IntArray> prefix, qCum, kvCum, qStart, kvStart;
    FaProblem p;
    const char* layout;

    GradCall(const FaInstance& inst, const FaGrads& g)
        : q(inst.query.handle()), k(inst.key.handle()), v(inst.value.handle()), dy(g.dy.handle()), pse(inst.pse.handle()),
          drop(inst.dropMask.handle()), mask(inst.attenMask.handle()), smax(inst.softmaxMax.handle()),
          ssum(inst.softmaxSum.handle()), attnIn(inst.attentionOut.handle()), sink(inst.sink.handle()), dq(g.dq.handle()),
          dk(g.dk.handle()), dv(g.dv.handle()), dsink(g.dsink.handle()), p(inst.problem), layout(nullptr) {
        if (!inst.prefix.empty()) prefix = std::make_unique<IntArray>(inst.prefix);
        if (p.tnd()) {
            qCum = std::make_unique<IntArray>(inst.qCumulative);
            kvCum = std::make_unique<IntArray>(inst.kvCumulative);
        }
        if (!inst.qStartIdx.empty()) qStart = std::make_unique<IntArray>(inst.qStartIdx);
        if (!inst.kvStartIdx.empty()) kvStart = std::make_unique<IntArray>(inst.kvStartIdx);
        layout = p.layout.c_str();
    }

    static attnopsIntArray* h(const std::unique_ptr<IntArray>& a) { return a ? a->handle : nullptr; }

    attnopsStatus plan(uint64_t* ws, attnopsExecutor** exec) const {
        return attnopsFlashAttentionScoreGradGetWorkspaceSize(
            q, k, v, dy, pse, drop, padding, mask, smax, ssum, softmaxIn, attnIn, h(prefix), h(qCum), h(kvCum), h(qStart),
            h(kvStart), sink, p.effectiveScale(), p.keepProb, p.preTokens, p.nextTokens, p.heads, layout, p.innerPrecise,
            p.sparseMode, p.pseType < 0 ? 1 : p.pseType, p.seed, p.offset, dq, dk, dv, dpse, dsink, ws, exec);
    }

    attnopsStatus run() const {
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        attnopsStatus st = plan(&ws, &exec);
        return attnops::tools::launchAndWait(st, ws, exec, attnopsFlashAttentionScoreGrad, nullptr);
    }
};

TEST(FaBackwardStrides, PaddedGradientViewsMatchContiguousAndPaddingIsUntouched) {
    // BNSD gradients whose rows are padded (row stride > D) and heads spaced apart: the logical
    // elements equal the contiguous run bitwise, the padding keeps its 0xCD bytes.
    const int64_t b = 2, n1 = 4, n2 = 2, s1 = 65, s2 = 70, d = 32, dv = 16;
    for (attnopsDataType dt : {F32, BF16}) {
        FaProblem p = withSink(withMode(fixed("BNSD", dt, b, s1, s2, n1, n2, d, dv), 3));
        FaInstance inst(p);
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        expectGradChecked(inst, g);
        auto padded = [&](int64_t n, int64_t s, int64_t dim) {
            const int64_t rowStride = dim + 5, headStride = s * rowStride + 3, batchStride = n * headStride + 7;
            return std::make_unique<ViewTensor>(dt, std::vector<int64_t>{b, n, s, dim},
                                                std::vector<int64_t>{batchStride, headStride, rowStride, 1}, b * batchStride);
        };
        auto vq = padded(n1, s1, d), vk = padded(n2, s2, d), vv = padded(n2, s2, dv);
        ViewTensor vsink(F32, {n1}, {3}, 3 * n1);
        GradCall call(inst, g);
        call.dq = vq->handle;
        call.dk = vk->handle;
        call.dv = vv->handle;
        call.dsink = vsink.handle;
        ASSERT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        const size_t es = attnopsDataTypeSize(dt);
        auto expectView = [&](const ViewTensor& view, const HostTensor& contiguous, int64_t n, int64_t s, int64_t dim, const char* name) {
            const int64_t rowStride = dim + 5, headStride = s * rowStride + 3, batchStride = n * headStride + 7;
            std::vector<char> touched(view.bytes.size() / es, 0);
            for (int64_t bb = 0; bb < b; ++bb)
                for (int64_t nn = 0; nn < n; ++nn)
                    for (int64_t ss = 0; ss < s; ++ss)
                        for (int64_t c = 0; c < dim; ++c) {
                            const int64_t at = bb * batchStride + nn * headStride + ss * rowStride + c;
                            const int64_t from = ((bb * n + nn) * s + ss) * dim + c;
                            touched[size_t(at)] = 1;
                            ASSERT_EQ(std::memcmp(view.bytes.data() + size_t(at) * es, contiguous.bytes().data() + size_t(from) * es, es), 0)
                                << name << " " << bb << "," << nn << "," << ss << "," << c;
                        }
            for (size_t e = 0; e < touched.size(); ++e) {
                if (touched[e]) continue;
                for (size_t k = 0; k < es; ++k) ASSERT_EQ(view.bytes[e * es + k], 0xCD) << name << " padding element " << e;
            }
        };
        expectView(*vq, g.dq, n1, s1, d, "dq");
        expectView(*vk, g.dk, n2, s2, d, "dk");
        expectView(*vv, g.dv, n2, s2, dv, "dv");
        for (int64_t n = 0; n < n1; ++n) {
            float got;
            std::memcpy(&got, vsink.bytes.data() + size_t(3 * n) * 4, 4);
            EXPECT_EQ(got, g.dsink.get(n));
            for (int64_t k = 1; k < 3; ++k)
                for (int64_t byte = 0; byte < 4; ++byte) EXPECT_EQ(vsink.bytes[size_t(3 * n + k) * 4 + size_t(byte)], 0xCD);
        }
    }
}

TEST(FaBackwardStrides, PackedQkvAndPaddedDyEqualContiguous) {
    // query/key/value as slices of one packed [B, S, 3, N, D] buffer (BSND views), dy and
    // attentionIn with padded rows: the same gradient bits as the contiguous tensors.
    const int64_t b = 2, s = 70, n = 2, d = 32;
    for (attnopsDataType dt : {F32, F16}) {
        FaProblem p = withSink(withMode(fixed("BSND", dt, b, s, s, n, n, d), 2));
        FaInstance inst(p);
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        const size_t es = attnopsDataTypeSize(dt);
        const std::vector<int64_t> shape{b, s, n, d}, packedStrides{s * 3 * n * d, 3 * n * d, d, 1};
        const HostTensor* sources[3] = {&inst.query, &inst.key, &inst.value};
        std::vector<uint8_t> packed(size_t(b * s * 3 * n * d) * es);
        for (int64_t part = 0; part < 3; ++part)
            for (int64_t e = 0; e < b * s * n * d; ++e) {
                const int64_t bb = e / (s * n * d), ss = (e / (n * d)) % s, rest = e % (n * d);
                std::memcpy(packed.data() + size_t(((bb * s + ss) * 3 + part) * n * d + rest) * es,
                            sources[part]->bytes().data() + size_t(e) * es, es);
            }
        std::vector<attnopsTensor*> handles(3, nullptr);
        for (int64_t part = 0; part < 3; ++part)
            ASSERT_EQ(attnopsCreateTensor(packed.data() + size_t(part * n * d) * es, dt, 4, shape.data(), packedStrides.data(),
                                          ATTNOPS_HOST_MEMORY, &handles[size_t(part)]),
                      ATTNOPS_SUCCESS);
        const std::vector<int64_t> paddedStrides{s * (n * d + 8), n * d + 8, d, 1};
        ViewTensor dy(dt, shape, paddedStrides, b * s * (n * d + 8)), attnIn(dt, shape, paddedStrides, b * s * (n * d + 8));
        for (int64_t e = 0; e < b * s * n * d; ++e) {
            const int64_t row = e / (n * d), rest = e % (n * d);
            std::memcpy(dy.bytes.data() + size_t(row * (n * d + 8) + rest) * es, g.dy.bytes().data() + size_t(e) * es, es);
            std::memcpy(attnIn.bytes.data() + size_t(row * (n * d + 8) + rest) * es, inst.attentionOut.bytes().data() + size_t(e) * es, es);
        }
        FaGrads h = attnops::tools::makeGrads(inst);
        poison(h);
        GradCall call(inst, h);
        call.q = handles[0];
        call.k = handles[1];
        call.v = handles[2];
        call.dy = dy.handle;
        call.attnIn = attnIn.handle;
        EXPECT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        for (attnopsTensor* t : handles) attnopsDestroyTensor(t);
        expectSameGrads(g, h, "packed qkv, padded dy");
    }
}

// Column strides other than 1 (every other element of an interleaved buffer) and a dy broadcast
// from one element (all strides 0, as autograd passes the gradient of a sum): the same gradient
// bits as the contiguous tensors, for every dtype (the bf16-pair kernels gather such rows).
TEST(FaBackwardStrides, ColumnStridedOperandsAndBroadcastDyEqualContiguous) {
    const int64_t b = 1, s = 37, n = 2, d = 24;
    for (attnopsDataType dt : {F32, F16, BF16}) {
        SCOPED_TRACE(attnopsDataTypeName(dt));
        FaProblem p = withMode(fixed("BNSD", dt, b, s, s, n, n, d), 3);
        FaInstance inst(p);
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        for (int64_t e = 0; e < g.dy.numel(); ++e) g.dy.set(e, 0.75f);  // what a broadcast dy holds
        runGrad(inst, g);
        if (HasFatalFailure()) return;
        const size_t es = attnopsDataTypeSize(dt);
        const std::vector<int64_t> shape{b, n, s, d}, interleaved{n * s * d * 2, s * d * 2, d * 2, 2};
        const HostTensor* sources[3] = {&inst.query, &inst.key, &inst.value};
        std::vector<std::unique_ptr<ViewTensor>> views;
        for (const HostTensor* src : sources) {
            views.push_back(std::make_unique<ViewTensor>(dt, shape, interleaved, b * n * s * d * 2));
            for (int64_t e = 0; e < b * n * s * d; ++e)
                std::memcpy(views.back()->bytes.data() + size_t(2 * e) * es, src->bytes().data() + size_t(e) * es, es);
        }
        const std::vector<int64_t> broadcast{0, 0, 0, 0};
        ViewTensor dy(dt, shape, broadcast, 1);
        std::memcpy(dy.bytes.data(), g.dy.bytes().data(), es);
        FaGrads h = attnops::tools::makeGrads(inst);
        poison(h);
        GradCall call(inst, h);
        call.q = views[0]->handle;
        call.k = views[1]->handle;
        call.v = views[2]->handle;
        call.dy = dy.handle;
        EXPECT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        expectSameGrads(g, h, "column-strided q/k/v, broadcast dy");
    }
}

// ================================================================ 3. determinism

using attnops::testsupport::ThreadsGuard;

std::vector<FaProblem> determinismProblems() {
    std::vector<FaProblem> problems;
    problems.push_back(withSink(withMode(fixed("BNSD", F32, 2, 200, 170, 4, 2, 64), 3)));
    problems.push_back(withSink(withDropout(withMode(tnd(BF16, {0, 130, 1, 70, 5}, {4, 129, 1, 80, 0}, 4, 1, 32), 2), 0.8, false)));
    problems.push_back(withPse(withMode(fixed("SBH", F16, 1, 150, 150, 2, 2, 160), 4, 40, 10), 1));
    problems.push_back(withMode(fixed("BSH", F32, 1, 70, 90, 2, 1, 300), 0, 30, 20));
    return problems;
}

using attnops::testsupport::ForcedImpl;
using attnops::testsupport::amxFusedDeclines;
using attnops::testsupport::isAmxFused;

// The entries that take bf16 problems only (amx: fp16 too on CPUs with AMX-FP16).
bool bf16OnlyEntry(const std::string& impl) {
    return impl == "avx512-bf16-fused" || impl == "avx512-bf16" || impl == "amx";
}

// The default choice ("") and every register-blocked entry this CPU runs.
TEST(FaBackwardDeterminism, ThreadCountsAndRepeatedRunsAreBitwiseEqual) {
    ThreadsGuard guard;
    for (const FaProblem& p : determinismProblems()) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, 2), ATTNOPS_SUCCESS);
        FaInstance inst(p);
        runForward(inst);
        for (const char* impl : {"", "amx-fused", "amx", "avx512-bf16-fused", "avx512-bf16", "avx512-fused", "avx512", "avx2-fused", "avx2"}) {
            ForcedImpl forced(impl);
            ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
            FaGrads probe = attnops::tools::makeGrads(inst);
            const attnopsStatus st = attnops::tools::runBackward(inst, probe);
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
            if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && bf16OnlyEntry(impl) && p.dtype != BF16) continue;
            if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && isAmxFused(impl) && amxFusedDeclines(impl, inst)) continue;
            std::vector<FaGrads> runs;
            for (int32_t threads : {1, 2, 3, 1, 2, 3, 4, 7}) {
                ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                runs.push_back(attnops::tools::makeGrads(inst));
                runGrad(inst, runs.back());
                if (HasFatalFailure()) return;
            }
            expectGradChecked(inst, runs[0]);
            for (size_t r = 1; r < runs.size(); ++r)
                expectSameGrads(runs[0], runs[r], std::string(impl) + " " + p.describe() + " run " + std::to_string(r));
        }
    }
}

TEST(FaBackwardDeterminism, ConcurrentStreamsGiveTheSerialResult) {
    // Two streams of the same device run the same backward at once: both equal a serial run.
    FaProblem p = withSink(withMode(fixed("BSND", BF16, 2, 129, 100, 4, 2, 32), 3));
    FaInstance inst(p);
    runForward(inst);
    FaGrads serial = attnops::tools::makeGrads(inst);
    runGrad(inst, serial);
    attnopsStream *s1 = nullptr, *s2 = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s1), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsStreamCreate(&s2), ATTNOPS_SUCCESS);
    FaGrads a = attnops::tools::makeGrads(inst), b = attnops::tools::makeGrads(inst);
    poison(a);
    poison(b);
    EXPECT_EQ(attnops::tools::runBackward(inst, a, s1), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnops::tools::runBackward(inst, b, s2), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnopsStreamDestroy(s1), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(s2), ATTNOPS_SUCCESS);
    expectSameGrads(serial, a, "stream 1");
    expectSameGrads(serial, b, "stream 2");
}

TEST(FaBackwardImplementations, EachAvailableImplementationMatchesReference) {
    std::vector<FaProblem> problems;
    problems.push_back(withSink(withMode(fixed("BNSD", F32, 2, 65, 129, 4, 2, 64), 3)));
    problems.push_back(withDropout(withMode(tnd(BF16, {0, 70, 1, 33}, {4, 65, 1, 40}, 2, 1, 160), 0, 20, 5), 0.9, false));
    problems.push_back(withPse(fixed("SBH", F16, 1, 40, 40, 2, 1, 300, 100), 2));
    {
        FaProblem p = tnd(F32, {5, 0, 64}, {7, 3, 65}, 2, 1, 16);
        p.extraQRows = 2;
        p.extraKvRows = 3;
        problems.push_back(withSink(p));
    }
    for (const FaProblem& p : problems) {
        FaInstance inst(p);
        runForward(inst);  // with the default forward
        if (HasFatalFailure()) return;
        std::vector<std::pair<std::string, FaGrads>> results;
        for (const char* impl : {"amx-fused", "amx", "avx512-bf16-fused", "avx512-bf16", "avx512-fused", "avx512", "avx2-fused", "avx2", "tiled-avx512", "tiled-avx2", "tiled-generic", "amx-emulated-fused", "amx-emulated", "reference"}) {
            FaGrads g = attnops::tools::makeGrads(inst);
            poison(g);
            attnopsStatus st;
            {
                ForcedImpl forced(impl);
                st = attnops::tools::runBackward(inst, g);
            }
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) {
                std::cout << "[ skipped  ] " << impl << ": " << attnopsGetLastErrorMessage() << "\n";
                continue;
            }
            // Only the 16-bit-operand entries decline problems: the avx512-bf16 entries and amx
            // those whose operands are not bf16 (amx takes fp16 on CPUs with AMX-FP16),
            // amx-emulated fp32 ones; the fused AMX entries also those with pse, an explicit
            // mask or dropout.
            if (isAmxFused(impl)) {
                if (amxFusedDeclines(impl, inst)) {
                    EXPECT_EQ(st, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) << impl << " " << p.describe();
                    continue;
                }
            } else if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION &&
                       (std::string(impl) == "amx-emulated" ? p.dtype == F32 : bf16OnlyEntry(impl) && p.dtype != BF16)) {
                continue;
            }
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << impl << ": " << attnopsGetLastErrorMessage();
            const GradCheck rc = attnops::tools::checkBackward(inst, g);
            EXPECT_TRUE(rc.passed) << impl << " " << p.describe() << ":" << describe(rc);
            expectTndTails(inst, g);
            results.emplace_back(impl, std::move(g));
        }
        EXPECT_GE(results.size(), 2u);
        // The default choice equals one of the forced runs bitwise.
        FaGrads dflt = attnops::tools::makeGrads(inst);
        runGrad(inst, dflt);
        bool matched = false;
        for (const auto& [name, g] : results) matched = matched || (sameBytes(g.dq, dflt.dq) && sameBytes(g.dk, dflt.dk) && sameBytes(g.dv, dflt.dv));
        EXPECT_TRUE(matched) << p.describe();
    }
}

// The other entries (the matrix above runs the default, the first available) over the head-dim,
// length and feature cases; amx-emulated runs the AMX kernel on the tile emulator everywhere.
struct ImplCase {
    std::string impl;
    Case c;
};

void PrintTo(const ImplCase& c, std::ostream* os) { *os << c.impl << " " << c.c.name << " (" << c.c.problem.describe() << ")"; }

class FaBackwardForcedMatrix : public ::testing::TestWithParam<ImplCase> {};

TEST_P(FaBackwardForcedMatrix, MatchesReference) {
    const ImplCase& ic = GetParam();
    FaInstance inst(ic.c.problem);
    runForward(inst);
    if (HasFatalFailure()) return;
    FaGrads g = attnops::tools::makeGrads(inst);
    poison(g);
    attnopsStatus st;
    {
        ForcedImpl forced(ic.impl.c_str());
        st = attnops::tools::runBackward(inst, g);
    }
    if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) GTEST_SKIP() << ic.impl << ": " << attnopsGetLastErrorMessage();
    if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && bf16OnlyEntry(ic.impl) && ic.c.problem.dtype != BF16)
        GTEST_SKIP() << ic.impl << " takes bf16 problems only (amx: fp16 too with AMX-FP16)";
    if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && ic.impl == "amx-emulated" && ic.c.problem.dtype == F32)
        GTEST_SKIP() << "amx-emulated takes bf16 and fp16 problems";
    if (isAmxFused(ic.impl) && amxFusedDeclines(ic.impl, inst)) {
        EXPECT_EQ(st, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) << attnopsGetLastErrorMessage();
        GTEST_SKIP() << ic.impl << " declines problems with pse, an explicit mask or dropout";
    }
    ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    expectGradChecked(inst, g);
    expectTndTails(inst, g);
}

std::vector<ImplCase> forcedCases() {
    std::vector<ImplCase> cases;
    for (const char* impl : {"amx-fused", "amx", "avx512-bf16-fused", "avx512-bf16", "avx512-fused", "avx512", "avx2-fused", "avx2", "tiled-avx2", "tiled-generic", "amx-emulated-fused", "amx-emulated"}) {
        // The AMX kernels multiply 16-bit operands only: they take the fp32 cases as bf16, and
        // the avx512-bf16 entries every case as bf16. The AMX hardware entry is listed only where
        // AMX is granted (skips cost a process start each).
        const bool amx = std::string(impl).rfind("amx", 0) == 0;
        const bool pairs = std::string(impl).rfind("avx512-bf16", 0) == 0;
        if ((std::string(impl) == "amx" || std::string(impl) == "amx-fused") && !attnops::cpu::isa().amxGranted) continue;
        auto add = [&](const Case& c) {
            if ((amx && c.problem.dtype == F32) || (pairs && c.problem.dtype != BF16))
                cases.push_back({impl, Case{c.name + "_as_bf16", withDtype(c.problem, BF16)}});
            else
                cases.push_back({impl, c});
        };
        for (const auto& list : {headCases(), lengthCases()})
            for (const Case& c : list) add(c);
        for (const Case& c : featureCases()) add(c);
    }
    return cases;
}

std::string forcedName(const ::testing::TestParamInfo<ImplCase>& info) {
    std::string impl = info.param.impl;
    std::replace(impl.begin(), impl.end(), '-', '_');
    return impl + "_" + info.param.c.name;
}

INSTANTIATE_TEST_SUITE_P(Impl, FaBackwardForcedMatrix, ::testing::ValuesIn(forcedCases()), forcedName);

TEST(FaBackwardImplementations, UnknownForcedNameIsAnError) {
    FaInstance inst(fixed("BNSD", F32, 1, 8, 8, 1, 1, 8));
    runForward(inst);
    FaGrads g = attnops::tools::makeGrads(inst);
    ForcedImpl forced("no-such-kernel");
    EXPECT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_ERROR_INVALID_ARGUMENT);
    const std::string msg = attnopsGetLastErrorMessage();
    EXPECT_NE(msg.find("ATTNOPS_FORCE_IMPL"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no-such-kernel"), std::string::npos) << msg;
}

// The implementation a default plan chooses for inst and the workspace it books.
std::pair<std::string, uint64_t> defaultGradPlan(const FaInstance& inst, FaGrads& g) {
    const attnops::tools::FaArrays arrays(inst);
    const attnops::fa::ForwardArgs a = attnops::tools::forwardArgs(inst, arrays);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    EXPECT_EQ(attnopsFlashAttentionScoreGradGetWorkspaceSize(
                  a.query, a.key, a.value, g.dy.handle(), a.realShift, a.dropMask, nullptr, a.attenMask, a.softmaxMax,
                  a.softmaxSum, nullptr, a.attentionOut, a.prefix, a.actualSeqQLen, a.actualSeqKvLen, a.qStartIdx,
                  a.kvStartIdx, a.sink, a.scaleValue, a.keepProb, a.preTokens, a.nextTokens, a.headNum, a.inputLayout,
                  a.innerPrecise, a.sparseMode, a.pseType, a.seed, a.offset, g.dq.handle(), g.dk.handle(),
                  g.dv.handle(), nullptr, inst.problem.sink ? g.dsink.handle() : nullptr, &ws, &exec),
              ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    const char* name = nullptr;
    EXPECT_EQ(attnopsGetExecutorImplementation(exec, &name), ATTNOPS_SUCCESS);
    std::string impl = name != nullptr ? name : "";
    attnopsDestroyExecutor(exec);
    return {impl, ws};
}

// The fused scheme runs by default, with a sink too, and with fewer (sequence, kv head) pairs
// than cores (its chunk split keeps them busy); its workspace holds each thread's fp32 dQ of a
// chunk (here a whole sequence).
TEST(FaBackwardImplementations, DefaultFusedSchemeByHeadPairsAndCores) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!(f.avx2 && f.fma && f.f16c)) GTEST_SKIP() << "no fused entry runs on this CPU (needs AVX2, FMA, F16C)";
    if (f.amxGranted) GTEST_SKIP() << "the AMX entry comes first here";
    const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl;
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    const int64_t cores = info.usableCores, sq = 100, group = 2, d = 32;
    ThreadsGuard guard;
    ASSERT_EQ(attnopsSetDeviceThreads(0, 2), ATTNOPS_SUCCESS);
    {
        FaInstance inst(fixed("BNSD", F32, cores, sq, 90, 2 * group, 2, d));
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        const auto [impl, ws] = defaultGradPlan(inst, g);
        EXPECT_EQ(impl, avx512 ? "avx512-fused" : "avx2-fused");
        EXPECT_GE(ws, uint64_t(2 * group * sq * d) * sizeof(float)) << "2 threads' dQ accumulators";
    }
    {
        FaInstance inst(withSink(fixed("BNSD", F32, cores, sq, 90, 2 * group, 2, d)));
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        EXPECT_EQ(defaultGradPlan(inst, g).first, avx512 ? "avx512-fused" : "avx2-fused");
    }
    if (cores > 1) {
        FaInstance inst(fixed("BNSD", F32, 1, sq, 90, group, 1, d));
        runForward(inst);
        FaGrads g = attnops::tools::makeGrads(inst);
        EXPECT_EQ(defaultGradPlan(inst, g).first, avx512 ? "avx512-fused" : "avx2-fused");
    }
}

// ================================================================ 4. a TND batch of 100,000 sequences

TEST(FaBackwardTnd, HundredThousandSequences) {
    // Lengths mostly 0..16 (many 0 and 1), every 2,500th sequence 100..200 long; q and kv
    // lengths drawn independently. Forward, backward, then the reference on a deterministic
    // sample of sequences (first, last, the long ones, and a stride), dsink over all of them.
    const int64_t count = 100000;
    std::vector<int64_t> ql(static_cast<size_t>(count)), kl(static_cast<size_t>(count));
    uint64_t state = 12345;
    auto next = [&]() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return state >> 33;
    };
    auto draw = [&](int64_t b) -> int64_t {
        if (b % 2500 == 1234) return 100 + int64_t(next() % 101);
        const uint64_t r = next() % 10;
        if (r < 3) return 0;
        if (r < 5) return 1;
        return 2 + int64_t(next() % 15);
    };
    for (int64_t b = 0; b < count; ++b) {
        ql[size_t(b)] = draw(b);
        kl[size_t(b)] = draw(b);
    }
    FaProblem p = withSink(withMode(tnd(BF16, ql, kl, 2, 1, 16), 0, 40, 3));
    p.extraQRows = 5;
    p.extraKvRows = 1;
    FaInstance inst(p);
    runForward(inst);
    if (HasFatalFailure()) return;
    FaGrads g = attnops::tools::makeGrads(inst);
    runGrad(inst, g);
    if (HasFatalFailure()) return;
    std::vector<int64_t> sample = {0, 1, 2, count - 2, count - 1};
    for (int64_t b = 1234; b < count; b += 2500) sample.push_back(b);
    for (int64_t b = 17; b < count; b += 997) sample.push_back(b);
    const GradCheck rc = attnops::tools::checkBackwardSequences(inst, g, sample);
    EXPECT_TRUE(rc.passed) << describe(rc);
    expectTndTails(inst, g);
    // No gradient element is left unwritten anywhere (the tensors started as NaN).
    for (const HostTensor* t : {&g.dq, &g.dk, &g.dv, &g.dsink})
        for (int64_t e = 0; e < t->numel(); ++e) ASSERT_FALSE(std::isnan(t->get(e))) << e;
    // One thread gives the same bits.
    ThreadsGuard guard;
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    FaGrads one = attnops::tools::makeGrads(inst);
    runGrad(inst, one);
    expectSameGrads(g, one, "1 thread vs default");
}

// ================================================================ 5. validation of backward arguments

class FaBackwardValidation : public ::testing::Test {
protected:
    FaBackwardValidation()
        : inst_(withSink(fixed("BNSD", F32, 1, 8, 8, 2, 1, 8))), grads_(attnops::tools::makeGrads(inst_)) {}
    void SetUp() override { ASSERT_EQ(inst_.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage(); }
    // After every failure the library still runs a valid call.
    void TearDown() override {
        GradCall ok(inst_, grads_);
        EXPECT_EQ(ok.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }

    // Phase 1 fails with `status` and a message holding every fragment.
    void expectError(const GradCall& call, attnopsStatus status, std::initializer_list<const char*> fragments) {
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        EXPECT_EQ(call.plan(&ws, &exec), status);
        EXPECT_EQ(exec, nullptr);
        const std::string msg = attnopsGetLastErrorMessage();
        for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
        if (exec) attnopsDestroyExecutor(exec);
    }

    FaInstance inst_;
    FaGrads grads_;
};

TEST_F(FaBackwardValidation, NullRequiredArguments) {
    struct Null {
        const attnopsTensor* GradCall::*field;
        const char* name;
    };
    const Null nulls[] = {{&GradCall::dy, "dy = NULL"},           {&GradCall::smax, "softmaxMax = NULL"},
                          {&GradCall::ssum, "softmaxSum = NULL"}, {&GradCall::attnIn, "attentionIn = NULL"},
                          {&GradCall::dq, "dqOut = NULL"},        {&GradCall::dk, "dkOut = NULL"},
                          {&GradCall::dv, "dvOut = NULL"},        {&GradCall::q, "query = NULL"}};
    for (const Null& n : nulls) {
        GradCall call(inst_, grads_);
        call.*(n.field) = nullptr;
        expectError(call, ATTNOPS_ERROR_NULL_ARGUMENT, {n.name});
    }
    GradCall call(inst_, grads_);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    EXPECT_EQ(attnopsFlashAttentionScoreGradGetWorkspaceSize(call.q, call.k, call.v, call.dy, nullptr, nullptr, nullptr, nullptr,
                                                             call.smax, call.ssum, nullptr, call.attnIn, nullptr, nullptr, nullptr,
                                                             nullptr, nullptr, call.sink, 1.0, 1.0, kNoBand, kNoBand, 2, "BNSD", 0,
                                                             0, 1, 0, 0, call.dq, call.dk, call.dv, nullptr, call.dsink, nullptr, &exec),
              ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("workspaceSize"), std::string::npos);
    EXPECT_EQ(attnopsFlashAttentionScoreGradGetWorkspaceSize(call.q, call.k, call.v, call.dy, nullptr, nullptr, nullptr, nullptr,
                                                             call.smax, call.ssum, nullptr, call.attnIn, nullptr, nullptr, nullptr,
                                                             nullptr, nullptr, call.sink, 1.0, 1.0, kNoBand, kNoBand, 2, "BNSD", 0,
                                                             0, 1, 0, 0, call.dq, call.dk, call.dv, nullptr, call.dsink, &ws, nullptr),
              ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("executor"), std::string::npos);
}

TEST_F(FaBackwardValidation, DyShapeAndDtype) {
    {
        HostTensor bad(F32, {1, 2, 8, 7});
        GradCall call(inst_, grads_);
        call.dy = bad.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dy.shape", "[1,2,8,7]", "[1,2,8,8]"});
    }
    {
        HostTensor bad(F32, {1, 8, 2, 8});  // BSND order instead of BNSD
        GradCall call(inst_, grads_);
        call.dy = bad.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dy.shape", "[1,8,2,8]"});
    }
    {
        HostTensor bad(BF16, {1, 2, 8, 8});
        GradCall call(inst_, grads_);
        call.dy = bad.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dy.dtype", "bf16", "fp32"});
    }
}

TEST_F(FaBackwardValidation, AttentionInIsNamedAsSuch) {
    HostTensor badShape(F32, {1, 2, 7, 8}), badType(F16, {1, 2, 8, 8});
    GradCall call(inst_, grads_);
    call.attnIn = badShape.handle();
    expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"attentionIn.shape", "[1,2,7,8]"});
    call.attnIn = badType.handle();
    expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"attentionIn.dtype", "fp16"});
}

TEST_F(FaBackwardValidation, GradientShapesAndDtypes) {
    struct Bad {
        const attnopsTensor* GradCall::*field;
        attnopsDataType dtype;
        std::vector<int64_t> shape;
        std::vector<const char*> fragments;
    };
    const Bad bads[] = {
        {&GradCall::dq, F32, {1, 2, 8, 9}, {"dqOut.shape", "[1,2,8,9]", "query.shape [1,2,8,8]"}},
        {&GradCall::dq, F32, {1, 2, 8}, {"dqOut.shape", "[1,2,8]"}},
        {&GradCall::dq, F16, {1, 2, 8, 8}, {"dqOut.dtype", "fp16", "query.dtype"}},
        {&GradCall::dk, F32, {1, 2, 8, 8}, {"dkOut.shape", "[1,2,8,8]", "key.shape [1,1,8,8]"}},
        {&GradCall::dk, BF16, {1, 1, 8, 8}, {"dkOut.dtype", "bf16"}},
        {&GradCall::dv, F32, {1, 1, 9, 8}, {"dvOut.shape", "[1,1,9,8]", "value.shape [1,1,8,8]"}},
        {&GradCall::dv, ATTNOPS_FLOAT64, {1, 1, 8, 8}, {"dvOut.dtype", "fp64"}},
    };
    for (const Bad& b : bads) {
        HostTensor t(b.dtype, b.shape);
        GradCall call(inst_, grads_);
        call.*(b.field) = t.handle();
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        EXPECT_EQ(call.plan(&ws, &exec), ATTNOPS_ERROR_INVALID_ARGUMENT);
        const std::string msg = attnopsGetLastErrorMessage();
        for (const char* f : b.fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
    }
}

TEST_F(FaBackwardValidation, ReservedSoftmaxInAndDpse) {
    HostTensor nonEmpty(F32, {1, 2, 8, 8}), empty(F32, {0});
    {
        GradCall call(inst_, grads_);
        call.softmaxIn = nonEmpty.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"softmaxIn.shape", "[1,2,8,8]", "reserved"});
        call.softmaxIn = empty.handle();
        EXPECT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    {
        GradCall call(inst_, grads_);
        call.dpse = nonEmpty.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dpseOut.shape", "[1,2,8,8]", "reserved"});
        call.dpse = empty.handle();
        EXPECT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    {
        HostTensor pad(F32, {1});
        GradCall call(inst_, grads_);
        call.padding = pad.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"paddingMask", "reserved"});
    }
}

TEST_F(FaBackwardValidation, SinkGradient) {
    {
        GradCall call(inst_, grads_);
        call.dsink = nullptr;
        expectError(call, ATTNOPS_ERROR_NULL_ARGUMENT, {"dsinkOut = NULL", "sinkIn"});
    }
    {
        HostTensor bad(F16, {2});
        GradCall call(inst_, grads_);
        call.dsink = bad.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dsinkOut.dtype", "fp16", "fp32"});
    }
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3}, std::vector<int64_t>{1, 2}, std::vector<int64_t>{}}) {
        HostTensor bad(F32, shape);
        GradCall call(inst_, grads_);
        call.dsink = bad.handle();
        const std::string text = shape.empty() ? "[]" : (shape.size() == 1 ? "[3]" : "[1,2]");
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"dsinkOut.shape", text.c_str(), "[N1] = [2]"});
    }
    {
        // Without a sink, dsinkOut is ignored (not written).
        FaInstance plain(fixed("BNSD", F32, 1, 8, 8, 2, 1, 8));
        ASSERT_EQ(plain.runForward(), ATTNOPS_SUCCESS);
        FaGrads g = attnops::tools::makeGrads(plain);
        HostTensor ignored(F16, {5});
        std::fill(ignored.bytes().begin(), ignored.bytes().end(), uint8_t(0xAB));
        GradCall call(plain, g);
        call.dsink = ignored.handle();
        EXPECT_EQ(call.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        for (uint8_t byte : ignored.bytes()) EXPECT_EQ(byte, 0xAB);
    }
}

TEST_F(FaBackwardValidation, ForwardRulesApplyToTheBackward) {
    // A few of the forward's rules, reached through the backward's entry point.
    {
        GradCall call(inst_, grads_);
        call.p.heads = 3;
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"query.shape", "headNum = 3"});
    }
    {
        GradCall call(inst_, grads_);
        call.p.keepProb = 0.0;
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"keepProb = 0"});
    }
    {
        GradCall call(inst_, grads_);
        call.layout = "bnsd";
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"inputLayout", "\"bnsd\""});
    }
    {
        GradCall call(inst_, grads_);
        call.p.sparseMode = 7;
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"sparseMode = 7"});
    }
    {
        HostTensor badStats(F32, {1, 2, 8, 4});
        GradCall call(inst_, grads_);
        call.smax = badStats.handle();
        expectError(call, ATTNOPS_ERROR_INVALID_ARGUMENT, {"softmaxMax.shape", "[1,2,8,4]"});
    }
}

TEST_F(FaBackwardValidation, ExecutorIsSingleUseAndWorkspaceChecked) {
    GradCall call(inst_, grads_);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(call.plan(&ws, &exec), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    ASSERT_NE(exec, nullptr);
    ASSERT_GT(ws, 0u);  // the sink's per-row terms at least
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    // Too small a workspace: rejected; the executor is consumed whatever the outcome.
    EXPECT_EQ(attnopsFlashAttentionScoreGrad(workspace, ws - 1, exec, nullptr), ATTNOPS_ERROR_INVALID_ARGUMENT);
    {
        const std::string msg = attnopsGetLastErrorMessage();
        EXPECT_NE(msg.find("workspaceSize = " + std::to_string(ws - 1)), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(ws)), std::string::npos) << msg;
    }
    EXPECT_EQ(attnopsFlashAttentionScoreGrad(workspace, ws, exec, nullptr), ATTNOPS_ERROR_RUNTIME);
    exec = nullptr;
    ASSERT_EQ(call.plan(&ws, &exec), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScoreGrad(workspace, ws, exec, nullptr), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScoreGrad(workspace, ws, exec, nullptr), ATTNOPS_ERROR_RUNTIME);
    const std::string msg = attnopsGetLastErrorMessage();
    EXPECT_NE(msg.find("executor"), std::string::npos) << msg;
    EXPECT_NE(msg.find("single-use"), std::string::npos) << msg;
    EXPECT_EQ(attnopsFlashAttentionScoreGrad(workspace, ws, nullptr, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    attnopsFree(workspace);
}

}  // namespace
