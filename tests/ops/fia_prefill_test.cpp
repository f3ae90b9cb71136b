// FusedInferAttentionScore's prefill route ("avx2-prefill" / "avx512-prefill", and for bf16
// "avx512-bf16-prefill" where the CPU's bf16 path is vdpbf16ps, cpu/simd/fia_prefill.hpp; "amx-prefill"
// where the CPU has AMX and "amx-emulated-prefill" everywhere, cpu/amx/fia_amx_prefill.hpp): the FlashAttentionScore forward's structure with FIA's rounding of
// the probabilities. Checked against the double reference under the tolerance rule on prefill
// shapes around the query tile (120 rows on AVX2) and key block edges, empty and length-1
// sequences, GQA, sparse modes 0-4, left padding, TND with tail rows, fully masked rows, sinks,
// lse and int8 output; which problems take the route by default and which it refuses; bit for
// bit equality with FlashAttentionScore's own kernel where the two operators' maths coincide
// (probabilities that the rounding leaves exact); the same bits for any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::testsupport::ForcedImpl;

namespace {

const char* const kRoutes[] = {"avx512-prefill", "avx2-prefill"};

FiaProblem prefill(const std::string& layout, attnopsDataType dt, int64_t batch, int64_t qS, int64_t kvS, int64_t heads,
                   int64_t kvHeads, int64_t dim) {
    FiaProblem p = attnops::testing::fiaProblem(layout, batch, qS, kvS, heads, kvHeads, dim);
    p.dtype = dt;
    return p;
}

FiaProblem packed(attnopsDataType dt, std::vector<int64_t> qLens, std::vector<int64_t> kvLens, int64_t heads, int64_t kvHeads,
                  int64_t dim) {
    FiaProblem p = attnops::testing::fiaPacked("TND", std::move(qLens), std::move(kvLens), heads, kvHeads, dim);
    p.dtype = dt;
    return p;
}

FiaProblem mode(FiaProblem p, int64_t sparseMode, int64_t pre = kNoBand, int64_t next = kNoBand) {
    return attnops::testing::withMode(std::move(p), sparseMode, pre, next);
}

// Prefill problems the route must take and get right.
std::vector<FiaProblem> routeProblems() {
    std::vector<FiaProblem> ps;
    ps.push_back(prefill("BNSD", ATTNOPS_FLOAT16, 2, 120, 120, 4, 2, 64));  // exactly one query tile
    ps.push_back(mode(prefill("BSND", ATTNOPS_BFLOAT16, 1, 121, 257, 4, 1, 128), 3));  // one row past it, GQA 4
    ps.push_back(mode(prefill("BSH", ATTNOPS_FLOAT16, 3, 240, 241, 2, 2, 32), 4, 100, 10));  // band
    ps.push_back(mode(prefill("BNSD", ATTNOPS_BFLOAT16, 1, 200, 130, 4, 2, 64), 3));  // 70 fully masked rows
    ps.push_back(mode(prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 300, 2, 1, 64), 2));   // top-left causal
    {
        FiaProblem p = prefill("BNSD", ATTNOPS_BFLOAT16, 4, 130, 300, 4, 2, 64);  // empty and length-1 sequences
        p.qLens = {0, 1, 130, 129};
        p.kvLens = {5, 0, 300, 1};
        ps.push_back(p);
    }
    {
        FiaProblem p = mode(packed(ATTNOPS_FLOAT16, {1, 0, 150, 7, 121}, {3, 9, 150, 0, 513}, 8, 2, 64), 3);
        p.extraQRows = 5;  // tail rows beyond the last sequence: 0, lse +inf
        p.extraKvRows = 3;
        ps.push_back(p);
    }
    ps.push_back(packed(ATTNOPS_BFLOAT16, {255, 256, 1}, {255, 257, 1023}, 2, 2, 128));  // key block edges
    {
        FiaProblem p = mode(prefill("BSND", ATTNOPS_BFLOAT16, 2, 125, 200, 4, 2, 64), 3);
        p.sink = true;  // learnable sink (FIA's end of row)
        ps.push_back(p);
    }
    {
        FiaProblem p = prefill("BNSD", ATTNOPS_FLOAT16, 1, 160, 90, 2, 1, 64);
        p.int8Out = true;  // post-quant of the output (per tensor: per channel excludes softmaxLse)
        ps.push_back(p);
    }
    {
        FiaProblem p = mode(prefill("BSND", ATTNOPS_FLOAT16, 2, 140, 120, 2, 2, 32), 3);  // left padding
        p.qLens = {130, 125};
        p.kvLens = {100, 117};
        p.queryPadding = 3;
        p.kvPadding = 2;
        ps.push_back(p);
    }
    ps.push_back(mode(prefill("BSH_BNSD", ATTNOPS_BFLOAT16, 2, 130, 140, 4, 2, 64), 3));  // transposed output
    ps.push_back(mode(packed(ATTNOPS_FLOAT16, {121, 9}, {121, 30}, 4, 2, 32), 3));
    ps.back().layout = "NTD_TND";
    ps.push_back(prefill("BNSD", ATTNOPS_BFLOAT16, 1, 150, 70, 2, 1, 24));   // D below one vector
    ps.push_back(prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 140, 2, 1, 256));  // wide head
    {
        FiaProblem p = prefill("BSND", ATTNOPS_FLOAT16, 1, 150, 200, 2, 1, 64);
        p.vDim = 32;  // Dv != D
        ps.push_back(p);
    }
    return ps;
}

// Problems the route refuses (they stay with the FIA kernels): decode, short queries, paged,
// int8 key/value, shared prefix, tensor lists. (pseShift and explicit masks take the route:
// tests/ops/fa_bias_steps_test.cpp.)
// queryTile: the route's query tile (V::kQueryRows: 120 on AVX2, 64 on AVX-512).
std::vector<FiaProblem> otherProblems(int64_t queryTile) {
    std::vector<FiaProblem> ps;
    ps.push_back(prefill("BNSD", ATTNOPS_FLOAT16, 2, 1, 300, 4, 2, 64));              // decode
    ps.push_back(prefill("BNSD", ATTNOPS_FLOAT16, 2, queryTile - 1, 300, 4, 2, 64));  // below one query tile
    FiaProblem paged = prefill("BNSD", ATTNOPS_BFLOAT16, 2, 130, 300, 4, 2, 64);
    paged.cache = "BnBsH";
    paged.blockSize = 128;
    ps.push_back(paged);
    FiaProblem int8 = prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 140, 2, 1, 64);
    int8.int8Kv = true;
    ps.push_back(int8);
    FiaProblem prefix = prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 140, 2, 1, 64);
    prefix.prefixRows = 20;
    ps.push_back(prefix);
    FiaProblem list = prefill("BSND", ATTNOPS_FLOAT16, 2, 130, 140, 2, 1, 64);
    list.kvList = true;
    ps.push_back(list);
    return ps;
}

void expectPasses(const FiaInstance& inst) {
    const FiaCheck r = checkFia(inst);
    EXPECT_TRUE(r.passed) << r.firstFailure << " (error " << r.maxAbsError << ", tolerance " << r.tolerance << ", lse error "
                          << r.maxLseError << ")";
    EXPECT_GT(r.rows, 0);
}

// The route a prefill problem of dtype dt takes by default here, "" if none: bf16 problems take
// "avx512-bf16-prefill" where the CPU's bf16 path is the dot one (vdpbf16ps), the others the
// fp32 route of routeHere().
std::string defaultRoute(attnopsDataType dt) {
    FiaInstance inst(prefill("BNSD", dt, 1, 130, 20, 1, 1, 16));
    if (inst.run() != ATTNOPS_SUCCESS) return "";
    const std::string impl = lastImplementation();
    return impl.find("-prefill") != std::string::npos ? impl : "";
}

// The route this CPU runs, forced on a problem it takes; "" if none runs here.
std::string routeHere() {
    for (const char* route : kRoutes) {
        ForcedImpl force(route);
        FiaInstance inst(prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 20, 1, 1, 16));
        if (inst.run() == ATTNOPS_SUCCESS) return route;
    }
    return "";
}

// The same output and softmaxLse bytes for 1, 2 and 3 worker threads (units are query blocks
// cut from the problem), under the implementation `forced` ("": the default choice).
void expectSameBitsForAnyThreadCount(const std::vector<FiaProblem>& problems, const char* forced) {
    testsupport::ThreadsGuard guard;
    for (const FiaProblem& p : problems) {
        SCOPED_TRACE(p.describe());
        std::vector<uint8_t> first;
        for (int32_t threads : {1, 2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
            ForcedImpl force(forced);
            FiaInstance inst(p);
            ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            std::vector<uint8_t> bytes = inst.attentionOut.bytes();
            bytes.insert(bytes.end(), inst.softmaxLse.bytes().begin(), inst.softmaxLse.bytes().end());
            if (threads == 1)
                first = bytes;
            else
                EXPECT_TRUE(bytes == first) << threads << " threads";
        }
    }
}

// A bf16 route problem with pseShift, and one with a mask whose content is read, refused by the
// implementation `forced` (they stay on the fp32 route's vector pse/mask steps).
void expectRefusesPseAndMasks(const char* forced) {
    for (const char* what : {"pse", "mask"}) {
        FiaProblem p = prefill("BNSD", ATTNOPS_BFLOAT16, 1, 130, 140, 2, 1, 64);
        (std::string(what) == "pse" ? p.pse : p.maskKind) = std::string(what) == "pse" ? "batch" : "random";
        SCOPED_TRACE(p.describe());
        ForcedImpl force(forced);
        FiaInstance inst(p);
        EXPECT_EQ(inst.run(), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
    }
}

}  // namespace

TEST(FiaPrefillRoute, MatchesReferenceAndIsTheDefaultChoice) {
    const std::string route = routeHere();
    if (route.empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    for (const FiaProblem& p : routeProblems()) {
        SCOPED_TRACE(p.describe());
        FiaInstance inst(p);
        ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(lastImplementation(), defaultRoute(p.dtype));
        expectPasses(inst);
    }
}

// The bf16-pair route (vdpbf16ps, where the CPU has AVX512-BF16), forced on every bf16 route
// problem: within the tolerance rule (its default use is checked above where the bf16 path is
// the dot one); it refuses fp16.
TEST(FiaPrefillRoute, Bf16PairsMatchTheReference) {
    int ran = 0, bf16 = 0;
    for (const FiaProblem& p : routeProblems()) {
        SCOPED_TRACE(p.describe());
        bf16 += p.dtype == ATTNOPS_BFLOAT16 ? 1 : 0;
        ForcedImpl force("avx512-bf16-prefill");
        FiaInstance inst(p);
        const attnopsStatus st = inst.run();
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
        if (p.dtype != ATTNOPS_BFLOAT16) {
            EXPECT_EQ(st, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
            continue;
        }
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        expectPasses(inst);
        ++ran;
    }
    EXPECT_EQ(ran, bf16);
    EXPECT_GE(bf16, 5);
    // pseShift and masks whose content is read stay on the fp32 route's vector pse/mask steps.
    expectRefusesPseAndMasks("avx512-bf16-prefill");
}

TEST(FiaPrefillRoute, RefusedProblemsKeepTheFiaKernels) {
    const std::string route = routeHere();
    if (route.empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    const int64_t queryTile = route == "avx512-prefill" ? 64 : 120;
    for (const FiaProblem& p : otherProblems(queryTile)) {
        SCOPED_TRACE(p.describe());
        {
            FiaInstance inst(p);
            ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_EQ(lastImplementation().find("-prefill"), std::string::npos)  // their results: the other FIA test files
                << lastImplementation();
        }
        ForcedImpl force(route.c_str());
        FiaInstance inst(p);
        EXPECT_EQ(inst.run(), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
        EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find(route), std::string::npos);
    }
}

// A plan made for a problem without pseShift is not reused for the same problem with it (the
// plan key holds the pse form): the second runs with its pse, on the route too.
TEST(FiaPrefillRoute, PlanOfARouteProblemIsNotReusedWithPse) {
    const std::string route = routeHere();
    if (route.empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    FiaProblem plain = prefill("BNSD", ATTNOPS_FLOAT16, 1, 130, 140, 2, 1, 64);
    FiaInstance first(plain);
    ASSERT_EQ(first.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(lastImplementation(), route);
    plain.pse = "batch";
    FiaInstance second(plain);
    ASSERT_EQ(second.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(lastImplementation(), route);
    expectPasses(second);
}

// Every implementation, forced, on a few route problems: the route and the kernels it replaces
// agree with the reference on the same inputs.
TEST(FiaPrefillRoute, EveryImplementationOnPrefillShapes) {
    FiaProblem sink = mode(prefill("BSND", ATTNOPS_BFLOAT16, 1, 121, 150, 2, 1, 64), 3);
    sink.sink = true;
    const FiaProblem varlen = mode(packed(ATTNOPS_FLOAT16, {1, 0, 122, 7}, {3, 9, 130, 0}, 4, 2, 32), 3);
    int ran = 0;
    for (const FiaProblem& p : {sink, varlen})
        for (const char* impl :
             {"amx-prefill", "amx-emulated-prefill", "avx512-bf16-prefill", "avx512-prefill", "avx2-prefill", "avx512", "avx2",
              "tiled-generic", "reference"}) {
            SCOPED_TRACE(std::string(impl) + " " + p.describe());
            ForcedImpl force(impl);
            FiaInstance inst(p);
            const attnopsStatus st = inst.run();
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
            if (st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION && p.dtype != ATTNOPS_BFLOAT16 &&
                (std::string(impl) == "avx512-bf16-prefill" || std::string(impl) == "amx-prefill"))
                continue;  // bf16 problems only (amx-prefill: fp16 where the CPU has AMX-FP16)
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_EQ(lastImplementation(), impl);
            expectPasses(inst);
            ++ran;
        }
    EXPECT_GE(ran, 4);  // tiled-generic and reference at least
}

// With a zero query every score is 0, every kept probability exp(0) = 1 (exact in fp16 and
// bf16), so FIA's rounding of P changes nothing and the two operators compute the same thing:
// the mean of the visible value rows. The route must then give FlashAttentionScore's own bits
// (same kernel structure, same sums), and softmaxLse must be FA's max + log(sum).
TEST(FiaPrefillRoute, SameBitsAsFlashAttentionWhereTheMathsCoincide) {
    const std::string route = routeHere();
    if (route.empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    struct Case {
        FiaProblem fia;
        FaProblem fa;
    };
    std::vector<Case> cases;
    for (attnopsDataType dt : {ATTNOPS_FLOAT16, ATTNOPS_BFLOAT16}) {
        cases.push_back({prefill("BNSD", dt, 2, 250, 300, 4, 2, 64), fixed("BNSD", dt, 2, 250, 300, 4, 2, 64)});
        cases.push_back({mode(prefill("BSND", dt, 1, 130, 257, 4, 4, 128), 3),
                         withMode(fixed("BSND", dt, 1, 130, 257, 4, 4, 128), 3)});
        cases.push_back({mode(prefill("BSH", dt, 1, 200, 150, 4, 2, 32), 4, 60, 5),
                         withMode(fixed("BSH", dt, 1, 200, 150, 4, 2, 32), 4, 60, 5)});
        cases.push_back({mode(packed(dt, {130, 3, 0, 140}, {130, 50, 7, 90}, 4, 1, 64), 3),
                         withMode(tnd(dt, {130, 3, 0, 140}, {130, 50, 7, 90}, 4, 1, 64), 3)});
    }
    for (Case& c : cases) {
        SCOPED_TRACE(c.fia.describe());
        const std::string dtypeRoute = defaultRoute(c.fia.dtype);  // bf16 pairs in both operators, or fp32 in both
        c.fa.statLanes = 8;
        FiaInstance fia(c.fia);
        FaInstance fa(c.fa);
        ASSERT_EQ(fia.query.bytes().size(), fa.query.bytes().size());
        ASSERT_EQ(fia.key.bytes().size(), fa.key.bytes().size());
        ASSERT_EQ(fia.value.bytes().size(), fa.value.bytes().size());
        std::fill(fia.query.bytes().begin(), fia.query.bytes().end(), uint8_t(0));
        fa.query.bytes() = fia.query.bytes();
        fa.key.bytes() = fia.key.bytes();
        fa.value.bytes() = fia.value.bytes();
        {
            const std::string faKernel = dtypeRoute.substr(0, dtypeRoute.find("-prefill"));  // avx2, avx512, avx512-bf16
            ForcedImpl force(faKernel.c_str());
            ASSERT_EQ(fa.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        ASSERT_EQ(fia.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(lastImplementation(), dtypeRoute);
        ASSERT_EQ(fia.attentionOut.bytes().size(), fa.attentionOut.bytes().size());
        EXPECT_TRUE(fia.attentionOut.bytes() == fa.attentionOut.bytes());
        // lse of row (n1, row) against FA's statistics (lane 0) of the same row.
        const int64_t rows = fia.softmaxLse.numel();
        ASSERT_EQ(rows * 8, fa.softmaxMax.numel());
        int64_t differing = 0, finite = 0;
        for (int64_t i = 0; i < rows; ++i) {
            const float m = fa.softmaxMax.get(i * 8), l = fa.softmaxSum.get(i * 8);
            const float want = l == 0.0f ? INFINITY : std::log(l) + m;
            const float got = fia.softmaxLse.get(i);
            if (std::memcmp(&want, &got, sizeof got) != 0) ++differing;
            finite += std::isfinite(got) ? 1 : 0;
        }
        EXPECT_EQ(differing, 0);
        EXPECT_GT(finite, 0);
    }
}

// The same bits for 1, 2 and 3 worker threads (units are query blocks cut from the problem).
TEST(FiaPrefillRoute, SameBitsForAnyThreadCount) {
    if (routeHere().empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    const std::vector<FiaProblem> all = routeProblems();
    expectSameBitsForAnyThreadCount({all[5], all[6], all[8]}, "");
}

// A block the causal band cuts whose values are not all finite takes the row steps (masked keys
// skipped, as the reference does) with the same rounding of P: value row 150 holds +inf in dim 0.
// Rows 120-149 share that block but never see key 150: they must match the reference of the same
// inputs with a finite row 150 under the tolerance rule; rows 150-199 see it and get +inf there.
// On the default route and on the AMX route's fp32 steps (the emulator).
TEST(FiaPrefillRoute, RowStepsOfABlockWithNonFiniteValues) {
    const std::string route = routeHere();
    if (route.empty()) GTEST_SKIP() << "no prefill route runs on this CPU";
    const FiaProblem p = mode(prefill("BNSD", ATTNOPS_BFLOAT16, 1, 200, 200, 1, 1, 32), 3);
    const int64_t d = 32, infKey = 150;
    FiaInstance reference(p);
    {
        ForcedImpl force("reference");
        ASSERT_EQ(reference.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    // The default route, and the AMX route's fp32 steps on the emulator.
    for (const std::string& impl : {std::string(), std::string("amx-emulated-prefill")}) {
        SCOPED_TRACE(impl);
        ForcedImpl force(impl.c_str());  // empty: the default choice
        FiaInstance finite(p);  // the route on finite values: the tolerance of this problem
        ASSERT_EQ(finite.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        const FiaCheck check = checkFia(finite);
        ASSERT_TRUE(check.passed) << check.firstFailure;
        FiaInstance withInf(p);
        withInf.value.set(infKey * d, INFINITY);
        ASSERT_EQ(withInf.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(lastImplementation(), impl.empty() ? defaultRoute(ATTNOPS_BFLOAT16) : impl);
        double worst = 0.0;
        for (int64_t row = 0; row < infKey; ++row)
            for (int64_t c = 0; c < d; ++c)
                worst = std::max(worst, double(std::fabs(withInf.attentionOut.get(row * d + c) -
                                                         reference.attentionOut.get(row * d + c))));
        EXPECT_LE(worst, check.tolerance);
        for (int64_t row = infKey; row < 200; ++row) {
            EXPECT_TRUE(std::isinf(withInf.attentionOut.get(row * d))) << "row " << row;
            EXPECT_TRUE(std::isfinite(withInf.attentionOut.get(row * d + 1))) << "row " << row;
        }
    }
}

// The AMX route (cpu/amx/fia_amx_prefill.hpp) on the tile emulator, which runs everywhere, and
// on the tiles where this CPU has AMX: every route problem it takes (bf16; fp16 on the emulator,
// which models AMX-FP16) within the tolerance rule, the hardware giving the emulator's bits;
// pseShift and masks whose content is read refused (they keep the vector routes).
TEST(FiaPrefillRoute, AmxRouteMatchesTheReference) {
    int emulated = 0;
    for (const FiaProblem& p : routeProblems()) {
        SCOPED_TRACE(p.describe());
        FiaInstance onEmulator(p);
        {
            ForcedImpl force("amx-emulated-prefill");
            ASSERT_EQ(onEmulator.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_EQ(lastImplementation(), "amx-emulated-prefill");
        }
        expectPasses(onEmulator);
        ++emulated;
        ForcedImpl force("amx-prefill");
        FiaInstance onTiles(p);
        const attnopsStatus st = onTiles.run();
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;  // no AMX here
        if (p.dtype == ATTNOPS_FLOAT16 && st == ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) continue;  // no AMX-FP16
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_TRUE(onTiles.attentionOut.bytes() == onEmulator.attentionOut.bytes());
        EXPECT_TRUE(onTiles.softmaxLse.bytes() == onEmulator.softmaxLse.bytes());
    }
    EXPECT_EQ(emulated, int(routeProblems().size()));
    expectRefusesPseAndMasks("amx-emulated-prefill");
    // Below one query tile of the route (64 rows) the FIA kernels keep the problem.
    ForcedImpl force("amx-emulated-prefill");
    FiaInstance shortQuery(prefill("BNSD", ATTNOPS_BFLOAT16, 2, 63, 300, 4, 2, 64));
    EXPECT_EQ(shortQuery.run(), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
}

// Where the two operators' maths coincide (a zero query: see above), the AMX route gives
// FlashAttentionScore's AMX bits, on the emulator; and the same bits for 1, 2 and 3 threads.
TEST(FiaPrefillRoute, AmxRouteSameBitsAsFlashAttentionAndForAnyThreadCount) {
    for (attnopsDataType dt : {ATTNOPS_BFLOAT16, ATTNOPS_FLOAT16}) {
        FiaProblem fiaP = mode(prefill("BSND", dt, 1, 130, 257, 4, 2, 128), 3);
        FaProblem faP = withMode(fixed("BSND", dt, 1, 130, 257, 4, 2, 128), 3);
        faP.statLanes = 8;
        SCOPED_TRACE(fiaP.describe());
        FiaInstance fia(fiaP);
        FaInstance fa(faP);
        std::fill(fia.query.bytes().begin(), fia.query.bytes().end(), uint8_t(0));
        fa.query.bytes() = fia.query.bytes();
        fa.key.bytes() = fia.key.bytes();
        fa.value.bytes() = fia.value.bytes();
        {
            ForcedImpl force("amx-emulated");
            ASSERT_EQ(fa.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        ForcedImpl force("amx-emulated-prefill");
        ASSERT_EQ(fia.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_TRUE(fia.attentionOut.bytes() == fa.attentionOut.bytes());
    }
    const std::vector<FiaProblem> all = routeProblems();
    expectSameBitsForAnyThreadCount({all[1], all[6], all[8]}, "amx-emulated-prefill");
}
