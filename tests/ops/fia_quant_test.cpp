// FusedInferAttentionScore quantisation (spec 9.1, 9.3): the combined [key; value] antiquant style
// (and the separate style winning over it), separate modes 2-5 and (0, 1), int4 key/value in
// int32 containers, and the int8 output, each against the double reference with every
// implementation this CPU runs; equal values through both styles give the same bits; bad
// quantisation operands give the right status and a message naming the argument.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fia_plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "core/handles.hpp"
#include "ops/fused_infer_attention_score/check_quant.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::testing::paged;
using attnops::testing::Outcome;
using attnops::testing::expectRejected;
using attnops::testing::planWith;
using attnops::fia::kSplitKeys;

namespace {

const char* const kImplementations[] = {"avx512", "avx2", "tiled-generic", "reference"};

FiaProblem decode(const std::string& layout, int64_t batch, int64_t kvSeqLen, int64_t heads, int64_t kvHeads, int64_t dim) {
    FiaProblem p;
    p.layout = layout;
    p.batch = batch;
    p.qSeqLen = 1;
    p.kvSeqLen = kvSeqLen;
    p.heads = heads;
    p.kvHeads = kvHeads;
    p.dim = dim;
    return p;
}

FiaProblem quantised(FiaProblem p, int64_t keyMode, int64_t valueMode) {
    p.int8Kv = true;
    p.keyQuantMode = keyMode;
    p.valueQuantMode = valueMode;
    return p;
}

// Every implementation that runs here and takes the problem, forced, against the reference.
// Returns how many ran.
int expectEveryImplementation(const FiaProblem& p) {
    int ran = 0;
    for (const char* impl : kImplementations) {
        SCOPED_TRACE(std::string(impl) + ": " + p.describe());
        FiaInstance inst(p);
        attnopsStatus st;
        {
            testsupport::ForcedImpl force(impl);
            st = inst.run();
        }
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && p.dim % 8 != 0) continue;  // vector kernels: D a multiple of 8
        EXPECT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        if (st != ATTNOPS_SUCCESS) continue;
        EXPECT_EQ(lastImplementation(), impl);
        ++ran;
        const FiaCheck r = checkFia(inst);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance " << r.tolerance
                              << ", lse error " << r.maxLseError << ")";
        EXPECT_GT(r.rows + r.emptyRows, 0);
    }
    EXPECT_GE(ran, 2);  // at least tiled-generic and the reference
    return ran;
}

std::vector<uint8_t> outputBytes(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    return inst.attentionOut.bytes();
}



}  // namespace

// ------------------------------------------------------------------------ combined style

TEST(FiaQuantCombined, PerChannelPerTensorPerToken) {
    for (const char* layout : {"BSH", "BNSD"})
        for (int64_t mode : {0, 1})
            for (bool offset : {true, false}) {
                FiaProblem p = quantised(decode(layout, 3, 70, 4, 2, 32), mode, mode);
                p.combinedQuant = true;
                p.quantOffset = offset;
                p.kvLens = {70, 0, 33};
                expectEveryImplementation(p);
                if (mode == 0) {
                    p.quantPerTensor = true;
                    expectEveryImplementation(p);
                }
            }
    FiaProblem pre = quantised(decode("BSND", 2, 40, 2, 1, 32), 0, 0);  // prefill
    pre.qSeqLen = 9;
    pre.combinedQuant = true;
    expectEveryImplementation(pre);
    FiaProblem pa = paged(quantised(decode("BNSD", 2, 0, 4, 2, 32), 1, 1), "BnBsH", 32);
    pa.kvLens = {kSplitKeys + 31, 64};
    pa.combinedQuant = true;
    pa.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(pa);
}

TEST(FiaQuantCombined, SameBitsAsSeparateAndSeparateWins) {
    for (int64_t mode : {0, 1}) {
        FiaProblem sep = quantised(decode("BSND", 2, 90, 4, 2, 32), mode, mode);
        FiaProblem comb = sep;
        comb.combinedQuant = true;
        EXPECT_EQ(outputBytes(sep), outputBytes(comb)) << mode;
        // Both styles passed: the separate one is used, whatever the combined operands hold.
        FiaInstance both(sep);
        const FiaArrays arrays(both);
        const attnopsTensor* kv[2];
        fia::Args a = fiaArgs(both, arrays, kv);
        a.antiquantScale = both.query.handle();  // not even a valid combined shape
        a.antiquantMode = 1 - mode;
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        const attnopsStatus planned = fiaGetWorkspace(a, &ws, &exec);
        ASSERT_EQ(launchAndWait(planned, ws, exec, attnopsFusedInferAttentionScoreV4), ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
        EXPECT_EQ(both.attentionOut.bytes(), outputBytes(sep));
    }
}

// --------------------------------------------------------------- separate modes 2-5, (0, 1)

TEST(FiaQuantModes, PerHeadAndPerTokenPerHead) {
    for (const char* layout : {"BSH", "BSND", "BNSD"})
        for (int64_t mode : {2, 3})
            for (bool offset : {true, false}) {
                FiaProblem p = quantised(decode(layout, 3, 0, 6, 3, 32), mode, mode);
                p.quantOffset = offset;
                p.kvSeqLen = 80;
                p.kvLens = {1, 80, 0};
                expectEveryImplementation(p);
            }
    FiaProblem longer = quantised(decode("BNSD", 2, 2 * kSplitKeys + 9, 8, 1, 64), 3, 3);  // key splits, G = 8
    longer.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(longer);
    FiaProblem pa = paged(quantised(decode("BNSD", 3, 0, 4, 2, 32), 2, 2), "NZ", 32);
    pa.kvLens = {31, 32, 97};
    expectEveryImplementation(pa);
    pa.keyQuantMode = pa.valueQuantMode = 3;
    expectEveryImplementation(pa);
}

TEST(FiaQuantModes, PagedManagedPerToken) {
    for (const char* cache : {"BnBsH", "BnNBsD", "NZ"})
        for (int64_t mode : {4, 5})
            for (int64_t bs : {32, 128}) {
                FiaProblem p = paged(quantised(decode("BNSD", 4, 0, 4, 2, 32), mode, mode), cache, bs);
                p.kvLens = {1, bs - 1, bs + 1, 2 * bs + 5};
                p.quantOffset = bs == 32;
                expectEveryImplementation(p);
            }
    FiaProblem longer = paged(quantised(decode("BSH", 2, 0, 4, 1, 64), 5, 5), "BnBsH", 128);
    longer.kvLens = {kSplitKeys + 200, 0};
    longer.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(longer);
}

TEST(FiaQuantModes, KeyPerChannelValuePerTokenAndPerTensor) {
    FiaProblem p = quantised(decode("BSND", 2, 77, 4, 2, 32), 0, 1);
    p.quantPerTensor = true;  // key per tensor [1]
    expectEveryImplementation(p);
    FiaProblem pc = paged(quantised(decode("BNSD", 2, 0, 4, 4, 32), 0, 1), "BnNBsD", 64);
    pc.kvLens = {65, 3};
    expectEveryImplementation(pc);
}

// --------------------------------------------------------------------------- int4 key/value

TEST(FiaQuantInt4, DecodeModesLayoutsAndGqa) {
    for (const char* layout : {"BSH", "BSND", "BNSD"})
        for (auto [km, vm] : {std::pair<int64_t, int64_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}}) {
            FiaProblem p = quantised(decode(layout, 3, 0, 4, 2, 64), km, vm);
            p.int8Kv = false;
            p.int4Kv = true;
            p.kvSeqLen = 70;
            p.kvLens = {70, 1, 0};
            p.quantOffset = km != 1;
            expectEveryImplementation(p);
        }
    FiaProblem wide = quantised(decode("BNSD", 2, kSplitKeys + 65, 8, 2, 128), 0, 0);
    wide.int8Kv = false;
    wide.int4Kv = true;
    wide.dtype = ATTNOPS_BFLOAT16;
    expectEveryImplementation(wide);
}

// Every nibble of one int32 is read in order, low nibble first, as two's complement: a key of
// eight channels whose values are exactly -8..7 against a one-hot query.
TEST(FiaQuantInt4, NibbleOrderAndSign) {
    FiaProblem p = quantised(decode("BNSD", 1, 1, 1, 1, 64), 0, 0);
    p.int8Kv = false;
    p.int4Kv = true;
    p.quantOffset = false;
    p.lse = false;
    FiaInstance inst(p);
    auto* v = static_cast<uint32_t*>(inst.value.data());
    for (int w = 0; w < 8; ++w) v[w] = 0x7654fed0u | uint32_t(w);  // nibbles low first: w, d, e, f, 4, 5, 6, 7
    for (int64_t c = 0; c < 64; ++c) inst.valueScale.set(c, 1.0f);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const int expect[8] = {0, -3, -2, -1, 4, 5, 6, 7};  // 0xd..0xf are -3..-1
    for (int w = 0; w < 8; ++w)
        for (int i = 0; i < 8; ++i)
            EXPECT_EQ(inst.attentionOut.get(w * 8 + i), float(i == 0 ? w : expect[i])) << w << "," << i;  // one key: O = V
}

// ------------------------------------------------------------------------------ int8 output

TEST(FiaQuantOutput, PerTensorAndPerChannel) {
    for (bool perChannel : {false, true})
        for (attnopsDataType sd : {ATTNOPS_FLOAT32, ATTNOPS_BFLOAT16})
            for (bool offset : {true, false}) {
                FiaProblem d = decode("BSH", 3, 60, 4, 2, 32);
                d.int8Out = true;
                d.outQuantPerChannel = perChannel;
                d.outQuantDType = sd;
                d.outQuantOffset = offset;
                d.lse = !perChannel;
                if (sd == ATTNOPS_BFLOAT16) d.dtype = ATTNOPS_BFLOAT16;
                d.kvLens = {60, 0, 17};
                expectEveryImplementation(d);
                FiaProblem pre = d;  // prefill with padding rows beyond the actual lengths
                pre.layout = "BNSD";
                pre.qSeqLen = 12;
                pre.qLens = {12, 3, 0};
                pre.sparseMode = 3;
                expectEveryImplementation(pre);
            }
    FiaProblem t;
    t.layout = "TND";
    t.qLens = {3, 0, 7};
    t.kvLens = {9, 4, 7};
    t.extraQRows = 2;
    t.heads = 4;
    t.kvHeads = 1;
    t.dim = 32;
    t.sparseMode = 3;
    t.int8Out = true;
    t.outQuantPerChannel = true;
    t.lse = false;
    expectEveryImplementation(t);
}

TEST(FiaQuantOutput, WithAntiquantAndSaturation) {
    FiaProblem p = paged(quantised(decode("BNSD", 2, 0, 4, 2, 32), 1, 1), "BnNBsD", 32);
    p.kvLens = {kSplitKeys + 10, 40};
    p.int8Out = true;
    expectEveryImplementation(p);
    FiaProblem sat = decode("BSND", 2, 20, 2, 2, 16);  // scales ~250 on |O| up to ~1: many clamp at +-127/-128
    sat.int8Out = true;
    sat.outQuantPerChannel = true;
    sat.lse = false;
    FiaInstance inst(sat);
    for (int64_t i = 0; i < inst.quantScale2.numel(); ++i) inst.quantScale2.set(i, 2000.0f);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_TRUE(checkFia(inst).passed);
    int clamped = 0;
    for (uint8_t byte : inst.attentionOut.bytes()) clamped += byte == 0x7f || byte == 0x80;
    EXPECT_GT(clamped, 0);
}

// A wrong int8 element is caught by the comparison (the check can fail).
TEST(FiaQuantOutput, TheComparisonCatchesAWrongElement) {
    FiaProblem p = decode("BSH", 2, 30, 2, 1, 16);
    p.int8Out = true;
    FiaInstance inst(p);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    ASSERT_TRUE(checkFia(inst).passed);
    auto* out = static_cast<int8_t*>(inst.attentionOut.data());
    out[5] = int8_t(out[5] > 0 ? out[5] - 3 : out[5] + 3);
    EXPECT_FALSE(checkFia(inst).passed);
}

// --------------------------------------------------------------------------------- bad input

TEST(FiaQuantCheck, CombinedStyleRules) {
    FiaProblem p = quantised(decode("BSND", 2, 50, 4, 2, 32), 0, 0);
    p.combinedQuant = true;
    FiaInstance inst(p);
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    expectRejected(planWith(inst, [](fia::Args& a) { a.antiquantScale = nullptr; }), ATTNOPS_ERROR_NULL_ARGUMENT, "keyAntiquantScale = NULL");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.antiquantScale = inst.query.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "antiquantOffset.shape");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.antiquantScale = inst.query.handle(), a.antiquantOffset = nullptr; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "antiquantScale.shape");
    expectRejected(planWith(inst, [](fia::Args& a) { a.antiquantMode = 1; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "antiquantScale.dtype");
    expectRejected(planWith(inst, [](fia::Args& a) { a.antiquantMode = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "antiquantMode = 2");
    FiaInstance fl(decode("BSND", 2, 50, 4, 2, 32));
    expectRejected(planWith(fl, [&](fia::Args& a) { a.antiquantScale = inst.antiquantScale.handle(); }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "antiquantScale = non-NULL");
}

TEST(FiaQuantCheck, SeparateModeRules) {
    FiaInstance m3(quantised(decode("BSND", 2, 50, 4, 2, 32), 3, 3));
    EXPECT_EQ(planWith(m3, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    expectRejected(planWith(m3, [&](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 2; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantScale.dtype");
    expectRejected(planWith(m3, [&](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 4; }), ATTNOPS_ERROR_NULL_ARGUMENT,
                   "blockTable = NULL");
    expectRejected(planWith(m3, [&](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 7; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantMode = 7");
    expectRejected(planWith(m3, [&](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 6; }),
                   ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION, "keyAntiquantMode = 6");
    expectRejected(planWith(m3, [&](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 1; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantScale.shape");
    FiaProblem short3 = quantised(decode("BSND", 2, 50, 4, 2, 32), 3, 3);
    FiaInstance s3(short3);
    FiaProblem other = short3;
    other.kvSeqLen = 40;  // its scales cover 40 tokens only
    FiaInstance o3(other);
    expectRejected(planWith(s3, [&](fia::Args& a) { a.keyAntiquantScale = o3.keyScale.handle(), a.keyAntiquantOffset = nullptr; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "S >= 50");
    FiaProblem pre = quantised(decode("BSND", 2, 50, 4, 2, 32), 3, 3);
    pre.qSeqLen = 4;
    expectRejected(planWith(FiaInstance(pre), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "modes 2-5 (per-head, PA-managed) need a decode query");
    FiaProblem m5 = paged(quantised(decode("BNSD", 2, 0, 4, 2, 32), 5, 5), "BnBsH", 32);
    m5.kvLens = {40, 3};
    FiaInstance i5(m5);
    EXPECT_EQ(planWith(i5, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    expectRejected(planWith(i5, [](fia::Args& a) { a.keyAntiquantMode = a.valueAntiquantMode = 4; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "[blockNum, blockSize]");
    expectRejected(planWith(i5, [](fia::Args& a) { a.valueAntiquantMode = 4; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "keyAntiquantMode/valueAntiquantMode = 5/4");
}

TEST(FiaQuantCheck, Int4Rules) {
    FiaProblem p = quantised(decode("BSND", 2, 50, 4, 2, 64), 0, 0);
    p.int8Kv = false;
    p.int4Kv = true;
    FiaInstance inst(p);
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    FiaProblem narrow = p;
    narrow.dim = 32;
    expectRejected(planWith(FiaInstance(narrow), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "multiple of 64");
    FiaProblem pre = p;
    pre.qSeqLen = 3;
    expectRejected(planWith(FiaInstance(pre), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "int4 key/value needs a decode query");
    FiaProblem m2 = p;
    m2.keyQuantMode = m2.valueQuantMode = 2;
    expectRejected(planWith(FiaInstance(m2), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "int8 key/value only");
    FiaProblem pt = p;
    pt.quantPerTensor = true;
    expectRejected(planWith(FiaInstance(pt), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "int8 key/value only");
    FiaProblem out = p;
    out.int8Out = true;
    expectRejected(planWith(FiaInstance(out), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "int4 key/value");
    FiaProblem comb = p;
    comb.combinedQuant = true;
    expectRejected(planWith(FiaInstance(comb), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "the combined style dequantises int8");
    // int32 key with float value, and a float key against int32 value.
    FiaInstance fl(decode("BSND", 2, 50, 4, 2, 64));
    expectRejected(planWith(inst, [&](fia::Args& a) { a.value = &a.query; }), ATTNOPS_ERROR_INVALID_ARGUMENT, "value.dtype");
}

TEST(FiaQuantCheck, OutputQuantRules) {
    FiaProblem p = decode("BSH", 2, 30, 4, 2, 32);
    p.int8Out = true;
    p.outQuantPerChannel = true;
    p.lse = false;
    FiaInstance inst(p);
    EXPECT_EQ(planWith(inst, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    expectRejected(planWith(inst, [](fia::Args& a) { a.quantScale2 = nullptr; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.dtype = int8");
    expectRejected(planWith(inst, [](fia::Args& a) { a.quantScale2 = a.quantOffset2 = nullptr; }), ATTNOPS_ERROR_INVALID_ARGUMENT,
                   "attentionOut.dtype = int8");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.quantScale2 = inst.query.handle(), a.quantOffset2 = nullptr; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "quantScale2.dtype = fp16");
    expectRejected(planWith(inst, [&](fia::Args& a) { a.quantOffset2 = inst.keyScale.empty() ? inst.query.handle() : nullptr; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "quantOffset2.dtype");
    FiaProblem lse = p;
    lse.lse = true;
    expectRejected(planWith(FiaInstance(lse), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "softmaxLseFlag");
    FiaProblem bf = p;
    bf.outQuantDType = ATTNOPS_BFLOAT16;  // with a fp16 query
    expectRejected(planWith(FiaInstance(bf), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "bf16 needs a bf16 query");
    FiaProblem tnd = p;
    tnd.layout = "TND";
    tnd.qLens = {1, 1};
    tnd.kvLens = {30, 30};
    FiaInstance ti(tnd);
    EXPECT_EQ(planWith(ti, [](fia::Args&) {}).status, ATTNOPS_SUCCESS);
    FiaProblem flat = p;
    flat.outQuantPerChannel = false;
    FiaInstance fi(flat);
    HostTensor wrong(ATTNOPS_FLOAT32, {4 * 32 + 1});
    expectRejected(planWith(fi, [&](fia::Args& a) { a.quantScale2 = wrong.handle(), a.quantOffset2 = nullptr; }),
                   ATTNOPS_ERROR_INVALID_ARGUMENT, "Q_N*Dv = 128");
    FiaProblem sink = flat;
    sink.sink = true;
    expectRejected(planWith(FiaInstance(sink), [](fia::Args&) {}), ATTNOPS_ERROR_INVALID_ARGUMENT, "learnableSink");
}

// The index maps of modes 3 and 5 checked independently of the shared dequantisation helper:
// the heads of kv head m's group under mode 3/5 equal a mode-1 run whose per-token scales and
// offsets are head m's slice (mode 5: read through the block table by hand).
TEST(FiaQuantModes, PerHeadModesEqualPerTokenRunsOnTheirSlices) {
    for (int64_t mode : {3, 5}) {
        FiaProblem base = quantised(decode("BNSD", 2, 0, 4, 2, 32), mode, mode);
        base.kvSeqLen = 70;
        base.kvLens = {40, 70};
        if (mode == 5) base = paged(base, "BnBsH", 32);
        FiaInstance headed(base);
        ASSERT_EQ(headed.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        FiaProblem flat = base;
        flat.keyQuantMode = flat.valueQuantMode = 1;
        const int64_t group = base.heads / base.kvHeads, dv = base.dim;
        for (int64_t m = 0; m < base.kvHeads; ++m) {
            FiaInstance one(flat);
            const int64_t tokens = one.keyScale.shape()[1];
            for (int64_t b = 0; b < 2; ++b)
                for (int64_t t = 0; t < base.kvLen(b); ++t) {
                    int64_t at = (b * base.kvHeads + m) * tokens + t;  // mode 3: [B, KV_N, S]
                    if (mode == 5) {                                   // [blockNum, KV_N, bs]
                        const int64_t blk = static_cast<const int32_t*>(headed.blockTable.data())[b * headed.blockTable.shape()[1] + t / 32];
                        at = (blk * base.kvHeads + m) * 32 + t % 32;
                    }
                    one.keyScale.set(b * tokens + t, headed.keyScale.get(at));
                    one.keyOffset.set(b * tokens + t, headed.keyOffset.get(at));
                    one.valueScale.set(b * tokens + t, headed.valueScale.get(at));
                    one.valueOffset.set(b * tokens + t, headed.valueOffset.get(at));
                }
            ASSERT_EQ(one.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            for (int64_t b = 0; b < 2; ++b)
                for (int64_t n = m * group; n < (m + 1) * group; ++n)
                    for (int64_t c = 0; c < dv; ++c) {
                        const int64_t i = (b * base.heads + n) * dv + c;
                        EXPECT_EQ(one.attentionOut.get(i), headed.attentionOut.get(i)) << mode << " b " << b << " n " << n << " c " << c;
                    }
        }
    }
}

// readAll (the scales, offsets and sinks a call reads): every element of a strided view, in
// row-major order of its logical indices, for ranks 0-4 with padded, permuted, broadcast (0) and
// unit strides, against the index arithmetic written out.
TEST(FiaQuantCheck, ReadAllReadsStridedViewsInRowMajorOrder) {
    std::vector<float> storage(4096);
    for (size_t i = 0; i < storage.size(); ++i) storage[i] = float(i) * 0.5f - 7.0f;
    struct View {
        std::vector<int64_t> shape, strides;
    };
    const View views[] = {{{}, {}},
                          {{7}, {3}},
                          {{5}, {0}},
                          {{3, 4}, {4, 1}},
                          {{3, 4}, {1, 3}},
                          {{2, 3, 5}, {40, 10, 2}},
                          {{4, 1, 6}, {6, 100, 1}},
                          {{2, 3, 2, 4}, {1, 2, 6, 12}},
                          {{2, 0, 3}, {3, 3, 1}}};
    for (const View& v : views) {
        attnopsTensor t;
        t.data = storage.data();
        t.dtype = DType::F32;
        t.rank = int32_t(v.shape.size());
        for (int i = 0; i < t.rank; ++i) {
            t.shape[size_t(i)] = v.shape[size_t(i)];
            t.strides[size_t(i)] = v.strides[size_t(i)];
        }
        const std::vector<float> got = attnops::fia::readAll(t);
        ASSERT_EQ(int64_t(got.size()), t.numel());
        for (int64_t flat = 0; flat < t.numel(); ++flat) {
            int64_t rest = flat, at = 0;
            for (int i = t.rank - 1; i >= 0; --i) {
                at += rest % t.shape[size_t(i)] * t.strides[size_t(i)];
                rest /= t.shape[size_t(i)];
            }
            ASSERT_EQ(got[size_t(flat)], storage[size_t(at)]) << "rank " << t.rank << " element " << flat;
        }
    }
}
