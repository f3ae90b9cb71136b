// MLA full quantisation (spec 9.2 "MLA full quant": int8 query with dequantScaleQuery, int8 paged
// key read as the value with per-tensor key/value scales, bf16 rope and output) in the vector
// decode kernels of cpu/simd/fia_forward.hpp, each forced and required to take the problem,
// against the double reference:
//  - the three cache formats (NZ: 32-lane int8 key groups beside the bf16 key rope's 16-lane
//    ones), blocks of 32 and 128 (int8 caches take multiples of 32), context lengths on and
//    around the block edges (1, 15, 16, 17, 31-33, 127-129) and empty batches;
//  - query-head counts whose rows are dotted straight from the cache (1-8 rows a unit) and those
//    whose key blocks are first converted to packed fp32 runs (16 rows and more), up to 128 heads;
//  - several query rows per batch (speculative decode: causal, sliding window, no mask; the tree
//    mask of mode 9 takes no int8 cache), TND;
//  - key splits (split-K) with their deterministic merge, and the same bits for 1, 2 and 3 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::fia::kSplitKeys;
using attnops::testing::expectVectorKernel;
using attnops::testing::mlaDecode;
using attnops::testing::mlaFullQuant;

namespace {

const char* const kVectorImplementations[] = {"avx512", "avx2"};

// A decode MLA full-quant step: a batch per context length, Q_N `heads`, KV_N 1, D 512 + 64.
FiaProblem mlaQuant(const std::string& cache, int64_t blockSize, std::vector<int64_t> kvLens, int64_t heads, int64_t qRows = 1) {
    const auto batch = int64_t(kvLens.size());
    FiaProblem p = mlaFullQuant(mlaDecode("BSND", batch, qRows, heads, std::move(kvLens), cache, blockSize));
    p.kvSeqLen = 1;
    return p;
}

// Runs `cases(impl)` for each vector kernel; the number that ran (cases returns false when this
// CPU lacks the kernel).
template <typename Cases>
int forEachVectorKernel(Cases&& cases) {
    int ran = 0;
    for (const char* impl : kVectorImplementations)
        if (cases(impl)) ++ran;
    return ran;
}

}  // namespace

TEST(FiaSimdMlaQuant, CachesBlocksLengthsAndHeads) {
    const int64_t heads[] = {1, 2, 4, 8, 16, 32};  // 1-8: rows straight from the cache; 16, 32: packed runs
    const int ran = forEachVectorKernel([&](const char* impl) {
        int cases = 0;
        for (const char* cache : {"BnBsH", "BnNBsD", "NZ"})
            for (int64_t blockSize : {32, 128}) {
                const std::vector<int64_t> lens = blockSize == 32 ? std::vector<int64_t>{1, 15, 16, 17, 31, 32, 33, 0, 65}
                                                                  : std::vector<int64_t>{127, 128, 129, 0, 1, 16};
                FiaProblem p = mlaQuant(cache, blockSize, lens, heads[size_t(cases % 6)]);
                p.layout = cases % 2 == 0 ? "BSND" : "BSH";
                ++cases;
                if (!expectVectorKernel(impl, p)) return false;
            }
        // BNSD (dequantScaleQuery [B, N, S]) and the largest group, 128 heads.
        FiaProblem bnsd = mlaQuant("BnNBsD", 32, {40, 0, 97}, 8);
        bnsd.layout = "BNSD";
        return expectVectorKernel(impl, bnsd) && expectVectorKernel(impl, mlaQuant("BnBsH", 128, {129, 3}, 128));
    });
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

TEST(FiaSimdMlaQuant, QueryRowsMasksAndTnd) {
    const int ran = forEachVectorKernel([&](const char* impl) {
        // Causal speculative decode: 2 rows x 2 heads (from the cache), 4 x 4 and 16 x 8 (packed).
        for (auto [rows, heads] : {std::pair<int64_t, int64_t>{2, 2}, {4, 4}, {16, 8}}) {
            FiaProblem p = mlaQuant("NZ", 32, {70, 16, 129}, heads, rows);
            p.sparseMode = 3;
            if (!expectVectorKernel(impl, p)) return false;
        }
        FiaProblem win = mlaQuant("BnBsH", 128, {260, 130}, 2, 3);  // sliding window
        win.sparseMode = 4;
        win.preTokens = 40;
        win.nextTokens = 0;
        const FiaProblem open = mlaQuant("BnNBsD", 32, {50, 4}, 8, 3);  // mode 0: every row sees every key
        FiaProblem tnd = mlaQuant("BnNBsD", 32, {70, 1, 140}, 4);  // TND: dequantScaleQuery [T, N]
        tnd.layout = "TND";
        tnd.qLens = {2, 1, 3};
        tnd.sparseMode = 3;
        tnd.lse = false;  // decode MLA with TND takes no softmaxLse
        return expectVectorKernel(impl, win) && expectVectorKernel(impl, open) && expectVectorKernel(impl, tnd);
    });
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

// Contexts cut into key splits (the last split of 1 or 129 keys) with their fixed-order merge,
// rows from the cache (4 heads) and packed (16 heads), every cache format.
TEST(FiaSimdMlaQuant, KeySplitsAgainstReference) {
    const int ran = forEachVectorKernel([&](const char* impl) {
        int cases = 0;
        for (const char* cache : {"BnBsH", "BnNBsD", "NZ"}) {
            const FiaProblem p = mlaQuant(cache, 128, {kSplitKeys + 129, 0, 2 * kSplitKeys + 1}, cases++ % 2 == 0 ? 4 : 16);
            if (!expectVectorKernel(impl, p)) return false;
        }
        return true;
    });
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

TEST(FiaSimdMlaQuant, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    int ran = 0;
    for (const char* impl : kVectorImplementations)
        for (int64_t heads : {4, 16}) {
            FiaProblem p = mlaQuant("NZ", 128, {kSplitKeys + 300, 17, 2 * kSplitKeys + 5}, heads, 2);
            p.sparseMode = 3;
            const auto bytes = [&](int32_t threads, attnopsStatus& st) {
                EXPECT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
                FiaInstance inst(p);
                testsupport::ForcedImpl force(impl);
                st = inst.run();
                if (st == ATTNOPS_SUCCESS) {
                    EXPECT_EQ(lastImplementation(), impl);
                }
                return std::make_pair(inst.attentionOut.bytes(), inst.softmaxLse.bytes());
            };
            attnopsStatus st;
            const auto one = bytes(1, st);
            if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << impl << ": " << attnopsGetLastErrorMessage();
            ++ran;
            for (int32_t threads : {2, 3}) {
                EXPECT_TRUE(bytes(threads, st) == one) << impl << ", " << heads << " heads, " << threads << " threads";
                EXPECT_EQ(st, ATTNOPS_SUCCESS);
            }
        }
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

// The planner's own choice for MLA full quantisation is a vector kernel where the CPU has one.
TEST(FiaSimdMlaQuant, AutomaticChoiceIsAVectorKernel) {
    const FiaProblem p = mlaQuant("BnNBsD", 32, {33, 64}, 4);
    std::string best = "tiled-generic";  // the first vector kernel of the list that runs here
    for (const char* impl : kVectorImplementations) {
        FiaInstance forced(p);
        testsupport::ForcedImpl force(impl);
        if (forced.run() == ATTNOPS_SUCCESS) {
            best = impl;
            break;
        }
    }
    FiaInstance inst(p);
    ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(lastImplementation(), best);
}
