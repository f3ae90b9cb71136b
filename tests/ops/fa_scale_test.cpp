// FlashAttentionScore at scale: packed TND batches of 100,000+ mostly short sequences (upstream
// crashed above ~2K), checked against the double reference on sampled rows, with per-sequence
// metadata that stays O(B); a million sequences (about 14 s in Release on 2 cores: default
// suite) and one S = 65,536 head (about 105 s: suite LongSequenceLarge, CTest label `large`),
// forward and backward; and determinism: every thread count gives bitwise identical results.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "child_process.hpp"
#include "forced_impl.hpp"
#include "ops/flash_attention_score/bwd_chunks.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "threads_guard.hpp"

namespace {

using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

std::string lastError() { return attnopsGetLastErrorMessage(); }

// Mostly short lengths: many 0 and 1, most in [2, 16], about 1% in [17, 200].
std::vector<int64_t> shortLengths(int64_t count, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::uniform_int_distribution<int64_t> shortLen(2, 16), longLen(17, 200);
    std::vector<int64_t> lengths(static_cast<size_t>(count));
    for (auto& len : lengths) {
        const double r = u(rng);
        len = r < 0.25 ? 0 : r < 0.45 ? 1 : r < 0.99 ? shortLen(rng) : longLen(rng);
    }
    return lengths;
}

FaProblem manySequences(int64_t count, attnopsDataType dtype, uint64_t seed) {
    FaProblem p;
    p.layout = "TND";
    p.dtype = dtype;
    p.qSeqLens = shortLengths(count, seed);
    p.kvSeqLens = shortLengths(count, seed + 1);
    p.extraQRows = 3;
    p.extraKvRows = 2;
    p.statLanes = 1;
    p.dataSeed = seed;
    return p;
}

uint64_t workspaceOf(FaInstance& inst) {
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    EXPECT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS) << lastError();
    attnopsDestroyExecutor(executor);
    return size;
}

// The workspace FlashAttentionScoreGrad asks for with inst's forward tensors and g.
uint64_t gradWorkspaceOf(const FaInstance& inst, FaGrads& g) {
    const attnops::tools::FaArrays arrays(inst);
    const attnops::fa::ForwardArgs a = attnops::tools::forwardArgs(inst, arrays);
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    EXPECT_EQ(attnopsFlashAttentionScoreGradGetWorkspaceSize(
                  a.query, a.key, a.value, g.dy.handle(), a.realShift, a.dropMask, nullptr, a.attenMask, a.softmaxMax,
                  a.softmaxSum, nullptr, a.attentionOut, a.prefix, a.actualSeqQLen, a.actualSeqKvLen, a.qStartIdx,
                  a.kvStartIdx, a.sink, a.scaleValue, a.keepProb, a.preTokens, a.nextTokens, a.headNum, a.inputLayout,
                  a.innerPrecise, a.sparseMode, a.pseType, a.seed, a.offset, g.dq.handle(), g.dk.handle(),
                  g.dv.handle(), nullptr, nullptr, &ws, &exec),
              ATTNOPS_SUCCESS)
        << lastError();
    attnopsDestroyExecutor(exec);
    return ws;
}

// Runs the forward of a many-sequence problem and checks it: sampled rows against the reference,
// every fully masked row (a query row of a sequence without keys, or masked by the mode), every
// tail row, and no NaN anywhere.
void runAndCheckManySequences(FaInstance& inst, int64_t sampledRows) {
    const FaProblem& p = inst.problem;
    const int64_t count = int64_t(p.qSeqLens.size());
    // Per-sequence metadata is O(B): the workspace does not grow with the number of sequences. (The
    // tile may: two query blocks per unit take a larger scratch where there are enough units to
    // share one, so the comparison holds the blocks per unit fixed, at each count.)
    FaProblem few = p;
    few.qSeqLens = {p.qSeqLens.begin(), p.qSeqLens.begin() + 3};
    few.kvSeqLens = {p.kvSeqLens.begin(), p.kvSeqLens.begin() + 3};
    FaInstance small(few);
    for (const char* blocks : {"1", "2"}) {
        attnops::testsupport::ScopedEnv perUnit("ATTNOPS_FA_BLOCKS_PER_UNIT", blocks);
        EXPECT_EQ(workspaceOf(inst), workspaceOf(small)) << blocks << " query blocks per unit";
    }

    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    const auto rc = attnops::tools::checkForwardRows(inst, sampledRows);
    EXPECT_TRUE(rc.passed) << p.describe() << ": rows " << rc.rows << " err " << rc.maxAbsError << " tol " << rc.tolerance
                           << " naive " << rc.maxAbsNaiveError << " stat " << rc.maxStatError << " " << rc.firstFailure;
    EXPECT_GE(rc.rows, sampledRows);

    const int64_t n1 = p.heads, dv = p.vdim();
    const auto& out = inst.attentionOut;
    int64_t nanCount = 0;
    for (int64_t i = 0; i < out.numel(); ++i) nanCount += std::isnan(out.get(i)) ? 1 : 0;
    EXPECT_EQ(nanCount, 0);

    // Layout [T1, N1, Dv] and statistics [T1, N1, 1].
    auto expectMaskedRow = [&](int64_t row, const char* why) {
        for (int64_t n = 0; n < n1; ++n) {
            for (int64_t c = 0; c < dv; ++c)
                if (out.get((row * n1 + n) * dv + c) != 0.0f) {
                    ADD_FAILURE() << why << " row " << row << " head " << n << " has a nonzero output";
                    return false;
                }
            const float m = inst.softmaxMax.get(row * n1 + n), s = inst.softmaxSum.get(row * n1 + n);
            if (!(std::isinf(m) && m < 0) || s != 0.0f) {
                ADD_FAILURE() << why << " row " << row << " head " << n << ": max " << m << " sum " << s;
                return false;
            }
        }
        return true;
    };
    int64_t checkedRows = 0;
    int64_t row = 0;
    for (int64_t b = 0; b < count; ++b) {
        const int64_t sq = p.qSeqLens[size_t(b)], skv = p.kvSeqLens[size_t(b)];
        for (int64_t i = 0; i < sq; ++i, ++row) {
            // Mode 3 (bottom-right causal): row i sees keys j <= i + skv - sq.
            const bool fullyMasked = skv == 0 || (p.sparseMode == 3 && i + skv - sq < 0);
            if (fullyMasked) {
                if (!expectMaskedRow(row, "fully masked")) return;
                ++checkedRows;
            }
        }
    }
    EXPECT_GT(checkedRows, 1000) << "the lengths should give many fully masked rows";
    for (int64_t tail = 0; tail < p.extraQRows; ++tail, ++row)
        if (!expectMaskedRow(row, "tail")) return;
    EXPECT_EQ(row, inst.query.shape()[0]);
}

TEST(FaScale, TndHundredThousandSequencesBf16Gqa) {
    FaProblem p = manySequences(100000, ATTNOPS_BFLOAT16, 1);
    p.heads = 4;
    p.kvHeads = 2;
    p.dim = 32;
    FaInstance inst(p);
    runAndCheckManySequences(inst, 2000);
}

TEST(FaScale, TndHundredThousandSequencesFp32GqaCausal) {
    FaProblem p = manySequences(120000, ATTNOPS_FLOAT32, 7);
    p.heads = 6;
    p.kvHeads = 2;
    p.dim = 16;
    p.vDim = 12;
    p.sparseMode = 3;
    FaInstance inst(p);
    runAndCheckManySequences(inst, 2000);
}

// A million sequences (design.md: "one million sequences tested"), forward and backward: the
// forward as above; the backward's workspace is that of a problem of a few sequences with the
// same longest one (metadata O(B), no quadratic host structure; the fused backward's scratch
// grows with the longest query sequence; as many sequences as threads the machine may run, so
// that the default choice of scheme is the same), its gradients match the reference on 2,000
// sampled sequences (the longest included), and dq's tail rows are 0.
TEST(FaScale, TndOneMillionSequencesForwardAndBackward) {
    FaProblem p = manySequences(1000000, ATTNOPS_BFLOAT16, 3);
    p.heads = 2;
    p.kvHeads = 1;
    p.dim = 8;
    FaInstance inst(p);
    runAndCheckManySequences(inst, 2000);

    FaGrads g = attnops::tools::makeGrads(inst);
    {
        FaProblem few = p;
        const auto fewCount = std::max<std::ptrdiff_t>(3, std::thread::hardware_concurrency());
        few.qSeqLens = {p.qSeqLens.begin(), p.qSeqLens.begin() + fewCount};
        few.kvSeqLens = {p.kvSeqLens.begin(), p.kvSeqLens.begin() + fewCount};
        const auto longest = std::max_element(p.qSeqLens.begin(), p.qSeqLens.end()) - p.qSeqLens.begin();
        few.qSeqLens.push_back(p.qSeqLens[size_t(longest)]);
        few.kvSeqLens.push_back(p.kvSeqLens[size_t(longest)]);
        FaInstance small(few);
        FaGrads smallGrads = attnops::tools::makeGrads(small);
        EXPECT_EQ(gradWorkspaceOf(inst, g), gradWorkspaceOf(small, smallGrads));
    }
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << lastError();
    const int64_t count = int64_t(p.qSeqLens.size());
    std::vector<int64_t> sampled;
    for (int64_t b = 0; b < count; b += count / 2000) sampled.push_back(b);
    sampled.push_back(int64_t(std::max_element(p.qSeqLens.begin(), p.qSeqLens.end()) - p.qSeqLens.begin()));
    sampled.push_back(count - 1);
    const auto gc = attnops::tools::checkBackwardSequences(inst, g, sampled);
    EXPECT_TRUE(gc.passed) << p.describe() << ": " << gc.failure;
    const int64_t rowWidth = p.heads * p.dim;
    const int64_t tailStart = inst.query.shape()[0] - p.extraQRows;
    for (int64_t e = tailStart * rowWidth; e < g.dq.numel(); ++e) ASSERT_EQ(g.dq.get(e), 0.0f) << "dq tail element " << e;
    int64_t nanCount = 0;
    for (const auto* t : {&g.dq, &g.dk, &g.dv})
        for (int64_t e = 0; e < t->numel(); ++e) nanCount += std::isnan(t->get(e)) ? 1 : 0;
    EXPECT_EQ(nanCount, 0);
}

// ------------------------------------------------------------------ one long sequence

// One head of S = 65,536 rows, causal, D = 64, fp32, forward and backward as the only work of a
// fresh process, with the peak resident memory (getrusage ru_maxrss) measured, printed, and
// bounded by inputs + outputs + the workspaces the calls reported (O(threads x blocks),
// independent of S) + a stated slack. Sampled rows and columns are checked in double precision:
// attention_out and dq rows from scratch; dk/dv columns from the inputs and the forward's saved
// statistics (the operator's own definition of P).
constexpr int64_t kSeq = 65536, kDim = 64;
// Slack over inputs + outputs + workspaces: the binary, its libraries, the worker threads'
// stacks, the test's own bookkeeping (row samples) and allocator overhead.
constexpr double kSlackMiB = 32.0;

double peakMiB() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

FaProblem longProblem(int64_t s) {
    FaProblem p = attnops::tools::fixed("BNSD", ATTNOPS_FLOAT32, 1, s, s, 1, 1, kDim);
    p.sparseMode = 3;  // causal (S1 = S2)
    p.statLanes = 1;
    return p;
}

// Double-precision checks of one causal head (B = N = 1, BNSD contiguous, one statistics lane).
struct HeadCheck {
    const FaInstance& inst;
    const FaGrads& g;
    double scale;
    double q(int64_t i, int64_t c) const { return inst.query.get(i * kDim + c); }
    double k(int64_t j, int64_t c) const { return inst.key.get(j * kDim + c); }
    double v(int64_t j, int64_t c) const { return inst.value.get(j * kDim + c); }
    double dy(int64_t i, int64_t c) const { return g.dy.get(i * kDim + c); }
    double dot(double (HeadCheck::*a)(int64_t, int64_t) const, int64_t i, double (HeadCheck::*b)(int64_t, int64_t) const,
               int64_t j) const {
        double s = 0;
        for (int64_t c = 0; c < kDim; ++c) s += (this->*a)(i, c) * (this->*b)(j, c);
        return s;
    }

    // Row i from scratch: attention_out and dq.
    void row(int64_t i, std::vector<double>& out, std::vector<double>& dq) const {
        std::vector<double> s(size_t(i + 1));
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) m = std::max(m, s[size_t(j)] = scale * dot(&HeadCheck::q, i, &HeadCheck::k, j));
        double l = 0;
        for (auto& x : s) l += (x = std::exp(x - m));
        out.assign(kDim, 0.0);
        dq.assign(kDim, 0.0);
        std::vector<double> dp(size_t(i + 1));
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
            const double pij = s[size_t(j)] / l;
            for (int64_t c = 0; c < kDim; ++c) out[size_t(c)] += pij * v(j, c);
            dp[size_t(j)] = dot(&HeadCheck::dy, i, &HeadCheck::v, j);
            delta += pij * dp[size_t(j)];
        }
        for (int64_t j = 0; j <= i; ++j) {
            const double ds = s[size_t(j)] / l * (dp[size_t(j)] - delta);
            for (int64_t c = 0; c < kDim; ++c) dq[size_t(c)] += scale * ds * k(j, c);
        }
    }

    // Column j: dk and dv, with P from the saved statistics and delta from attentionOut.
    void column(int64_t j, std::vector<double>& dk, std::vector<double>& dv) const {
        dk.assign(kDim, 0.0);
        dv.assign(kDim, 0.0);
        for (int64_t i = j; i < kSeq; ++i) {
            const double pij = std::exp(scale * dot(&HeadCheck::q, i, &HeadCheck::k, j) - inst.softmaxMax.get(i)) /
                               double(inst.softmaxSum.get(i));
            double delta = 0;
            for (int64_t c = 0; c < kDim; ++c) delta += dy(i, c) * double(inst.attentionOut.get(i * kDim + c));
            const double ds = pij * (dot(&HeadCheck::dy, i, &HeadCheck::v, j) - delta);
            for (int64_t c = 0; c < kDim; ++c) {
                dv[size_t(c)] += pij * dy(i, c);
                dk[size_t(c)] += scale * ds * q(i, c);
            }
        }
    }
};


TEST(LongSequenceLargeChild, DISABLED_CausalHead65536) {
    if (!attnops::testing::isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test";
    const double startMiB = peakMiB();
    FaInstance inst(longProblem(kSeq));
    FaGrads g = attnops::tools::makeGrads(inst);
    uint64_t forwardWs = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(inst.plan(&forwardWs, &exec), ATTNOPS_SUCCESS) << lastError();
    attnopsDestroyExecutor(exec);
    const uint64_t backwardWs = gradWorkspaceOf(inst, g);
    // The forward workspace is O(threads x blocks): the same for a sequence 16 times shorter. The
    // backward's may grow with S only by the fused scheme's bounded arrays (its chunk partials and
    // each thread's chunk rows, fa::chunks); past those bounds it falls back to the two-kind
    // scheme, whose workspace is O(threads x blocks).
    {
        FaInstance shorter(longProblem(kSeq / 16));
        FaGrads gs = attnops::tools::makeGrads(shorter);
        uint64_t ws = 0;
        ASSERT_EQ(shorter.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastError();
        attnopsDestroyExecutor(exec);
        EXPECT_EQ(ws, forwardWs) << "forward workspace grows with S";
        attnopsDeviceInfo dev{};
        ASSERT_EQ(attnopsGetDeviceInfo(0, &dev), ATTNOPS_SUCCESS);
        const uint64_t fusedBound =
            attnops::fa::chunks::kMaxPartialBytes + uint64_t(dev.threads) * attnops::fa::chunks::kMaxChunkRowsBytes;
        EXPECT_LE(backwardWs, gradWorkspaceOf(shorter, gs) + fusedBound)
            << "backward workspace grows with S past the fused scheme's bounds";
    }

    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << lastError();
    const auto t2 = std::chrono::steady_clock::now();
    const double peak = peakMiB();

    const double tensorMiB = double(8 * kSeq * kDim * 4 + 2 * kSeq * 4) / (1 << 20);  // q k v out dy dq dk dv, stats
    const double wsMiB = double(forwardWs + backwardWs) / (1 << 20);
    const double bound = startMiB + tensorMiB + wsMiB + kSlackMiB;
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    std::printf("long-sequence: S=%lld D=%lld causal fp32, %d threads: forward %.2f s, backward %.2f s\n",
                (long long)kSeq, (long long)kDim, info.threads, std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    std::printf("long-sequence: peak RSS %.1f MiB <= bound %.1f MiB = start %.1f + tensors %.1f + workspace %.1f "
                "(forward %.2f + backward %.2f) + slack %.0f\n",
                peak, bound, startMiB, tensorMiB, wsMiB, double(forwardWs) / (1 << 20), double(backwardWs) / (1 << 20),
                kSlackMiB);
    EXPECT_LE(peak, bound);

    // Sampled rows (first, block edges, last: the longest reduction) and columns.
    const HeadCheck h{inst, g, inst.problem.effectiveScale()};
    const double u = std::ldexp(1.0, -24);
    double maxRef[4] = {0, 0, 0, 0}, maxErr[4] = {0, 0, 0, 0};
    auto compare = [&](int t, double got, double want) {
        maxRef[t] = std::max(maxRef[t], std::fabs(want));
        maxErr[t] = std::max(maxErr[t], std::fabs(got - want));
    };
    std::vector<double> a, b;
    for (int64_t i : {int64_t(0), int64_t(1), int64_t(63), int64_t(64), int64_t(4095), int64_t(32768), kSeq - 2, kSeq - 1}) {
        h.row(i, a, b);
        for (int64_t c = 0; c < kDim; ++c) {
            compare(0, inst.attentionOut.get(i * kDim + c), a[size_t(c)]);
            compare(1, g.dq.get(i * kDim + c), b[size_t(c)]);
        }
    }
    for (int64_t j : {int64_t(0), int64_t(1), int64_t(64), int64_t(40000), kSeq - 1}) {
        h.column(j, a, b);
        for (int64_t c = 0; c < kDim; ++c) {
            compare(2, g.dk.get(j * kDim + c), a[size_t(c)]);
            compare(3, g.dv.get(j * kDim + c), b[size_t(c)]);
        }
    }
    // The fp32 rules of the shared harness: forwardTolerance for the output; for gradients
    // u * (16 * (S1 + S2 + D + Dv) + 128) * max|ref| + 1e-7 (problem_grad.cpp).
    double maxQ = 0, maxK = 0;
    for (int64_t e = 0; e < kSeq * kDim; ++e) {
        maxQ = std::max(maxQ, double(std::fabs(inst.query.get(e))));
        maxK = std::max(maxK, double(std::fabs(inst.key.get(e))));
    }
    const double scoreMagnitude = std::fabs(h.scale) * maxQ * maxK;  // as checkForwardRows
    const char* names[4] = {"attention_out", "dq", "dk", "dv"};
    for (int t = 0; t < 4; ++t) {
        const double tol = t == 0 ? attnops::tools::forwardTolerance(inst.problem, 0.0, maxRef[0], scoreMagnitude)
                                  : u * (16.0 * double(2 * kSeq + 2 * kDim) + 128.0) * maxRef[t] + 1e-7;
        std::printf("long-sequence: %s max error %.3g (tolerance %.3g, max |ref| %.3g)\n", names[t], maxErr[t], tol,
                    maxRef[t]);
        EXPECT_LE(maxErr[t], tol) << names[t];
        EXPECT_GT(maxRef[t], 0.0) << names[t];
    }
}

TEST(LongSequenceLarge, CausalHead65536ForwardBackwardInFreshProcess) {
    const auto r = attnops::testing::expectChildPasses("LongSequenceLargeChild.DISABLED_CausalHead65536", {});
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("long-sequence:", 0) == 0) std::printf("%s\n", line.c_str());
}

// ------------------------------------------------------------------ determinism

struct Outputs {
    std::vector<uint8_t> out, max, sum;
    bool operator==(const Outputs&) const = default;
};

using attnops::testsupport::ThreadsGuard;

// Runs `p` with 1, 2, 3 and 7 worker threads: every output must be bitwise equal to the 1-thread
// run, which is checked against the reference.
void expectSameForEveryThreadCount(const FaProblem& p) {
    ThreadsGuard guard;
    Outputs first;
    for (int32_t threads : {1, 2, 3, 7}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS) << lastError();
        FaInstance inst(p);
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
        const Outputs o{inst.attentionOut.bytes(), inst.softmaxMax.bytes(), inst.softmaxSum.bytes()};
        if (threads == 1) {
            first = o;
            const auto rc = attnops::tools::checkForwardRows(inst, 400);
            EXPECT_TRUE(rc.passed) << p.describe() << ": err " << rc.maxAbsError << " tol " << rc.tolerance << " "
                                   << rc.firstFailure;
        } else {
            EXPECT_TRUE(o.out == first.out) << p.describe() << ": attention_out differs with " << threads << " threads";
            EXPECT_TRUE(o.max == first.max && o.sum == first.sum)
                << p.describe() << ": statistics differ with " << threads << " threads";
        }
    }
}

FaProblem causalTnd(attnopsDataType dtype) {
    FaProblem p;
    p.layout = "TND";
    p.dtype = dtype;
    p.heads = 4;
    p.kvHeads = 2;
    p.dim = 64;
    std::mt19937_64 rng(11);
    std::uniform_int_distribution<int64_t> len(0, 200);
    for (int i = 0; i < 150; ++i) {
        const int64_t q = i % 17 == 0 ? 0 : i % 13 == 0 ? 1 : len(rng);
        p.qSeqLens.push_back(q);
        p.kvSeqLens.push_back(i % 7 == 0 ? q : len(rng));
    }
    p.sparseMode = 3;
    p.extraQRows = 1;
    return p;
}

TEST(FaDeterminism, CausalTndAnyThreadCount) { expectSameForEveryThreadCount(causalTnd(ATTNOPS_FLOAT32)); }

TEST(FaDeterminism, CausalTndBf16AnyThreadCount) { expectSameForEveryThreadCount(causalTnd(ATTNOPS_BFLOAT16)); }

TEST(FaDeterminism, CausalTndWithDropoutAnyThreadCount) {
    FaProblem p = causalTnd(ATTNOPS_FLOAT16);
    p.keepProb = 0.7;
    p.seed = 99;
    p.offset = 5;
    expectSameForEveryThreadCount(p);
}

FaProblem bnsdDropout(attnopsDataType dtype) {
    FaProblem p;
    p.layout = "BNSD";
    p.dtype = dtype;
    p.batch = 2;
    p.heads = 4;
    p.kvHeads = 4;
    p.qSeqLen = 200;
    p.kvSeqLen = 260;
    p.dim = 64;
    p.keepProb = 0.85;
    p.seed = 123456789;
    p.offset = 12;
    return p;
}

TEST(FaDeterminism, BnsdDropoutAnyThreadCount) { expectSameForEveryThreadCount(bnsdDropout(ATTNOPS_FLOAT32)); }

TEST(FaDeterminism, BnsdDropoutBf16AnyThreadCount) { expectSameForEveryThreadCount(bnsdDropout(ATTNOPS_BFLOAT16)); }

TEST(FaDeterminism, BnsdExplicitDropMaskAnyThreadCount) {
    FaProblem p = bnsdDropout(ATTNOPS_FLOAT32);
    p.explicitDropMask = true;
    p.sparseMode = 2;
    expectSameForEveryThreadCount(p);
}

// Two runs of one problem on one thread count give the same bits.
TEST(FaDeterminism, RunToRun) {
    const FaProblem p = causalTnd(ATTNOPS_FLOAT32);
    FaInstance a(p), b(p);
    ASSERT_EQ(a.runForward(), ATTNOPS_SUCCESS) << lastError();
    ASSERT_EQ(b.runForward(), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(a.attentionOut.bytes() == b.attentionOut.bytes());
    EXPECT_TRUE(a.softmaxMax.bytes() == b.softmaxMax.bytes());
    EXPECT_TRUE(a.softmaxSum.bytes() == b.softmaxSum.bytes());
}

}  // namespace

