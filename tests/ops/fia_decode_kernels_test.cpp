// The decode microkernels of the vector FusedInferAttentionScore kernels (cpu/simd/fia_forward.hpp)
// on the shapes that select each of their code paths, against the double reference with the
// vector kernel forced and required to run:
//  - the score dot takes three keys per step and the last step of a key block one or two: key
//    lengths 1, 2, 3 and around the 64-key blocks (and a key split) leave every remainder;
//  - P.V takes three value vectors per strip with AVX2 and four with AVX-512, then three, two or
//    one: head dims of 2, 6, 8, 10 and 16 AVX2 vectors (strips 2; 3 + 3; 3 + 3 + 2; 3 + 3 + 2 + 2;
//    four of 3, then 2 + 2) and of 1, 3, 4, 5 and 8 AVX-512 ones (1; 3; 4; 3 + 2; 4 + 4) end on each;
//  - rows whose vectors are unit stride compute their offsets (contiguous BNSD rows, strided BSH
//    rows, BnNBsD and BnBsH pages) and NZ rows read the chunk table; rows back to back in memory
//    are prefetched as one span, the others row by row;
//  - GQA groups of 1 to 5 query heads (row tiles of 1 to 4 rows, and 4 + 1);
//  - bf16, fp16 and int8 key/value (per channel with offsets, per token).
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::fia::kSplitKeys;
using attnops::testing::expectVectorKernel;

namespace {

const char* const kVectorImplementations[] = {"avx512", "avx2"};

enum class Kv { Bf16, Fp16, Int8PerChannel, Int8PerToken };

// One decode step: a batch per key length of interest, `form` = "BNSD", "BSH" (unpaged) or a
// cache format (block 32: int8 caches need a multiple of 32).
FiaProblem decodeCase(const std::string& form, int64_t dim, std::pair<int64_t, int64_t> group, Kv kv) {
    FiaProblem p;
    const bool paged = form != "BNSD" && form != "BSH";
    p.layout = paged ? "BSH" : form;
    p.cache = paged ? form : "none";
    p.blockSize = 32;
    p.qSeqLen = 1;
    // Lengths around the key blocks of the kernels (64 keys in tiled-generic, 128 in the vector
    // kernels' kKeyRows) and their kDotKeys steps of 3.
    p.kvLens = {1, 2, 3, 64, 65, 66, 127, 128, 129, 257};
    p.batch = int64_t(p.kvLens.size());
    p.kvSeqLen = 257;
    p.heads = group.first;
    p.kvHeads = group.second;
    p.dim = dim;
    p.dtype = kv == Kv::Fp16 ? ATTNOPS_FLOAT16 : ATTNOPS_BFLOAT16;
    p.int8Kv = kv == Kv::Int8PerChannel || kv == Kv::Int8PerToken;
    p.keyQuantMode = p.valueQuantMode = kv == Kv::Int8PerToken ? 1 : 0;
    return p;
}

}  // namespace

TEST(FiaDecodeKernels, KeyStepsStripsRowFormsAndGroupsAgainstReference) {
    const std::pair<int64_t, int64_t> groups[] = {{4, 4}, {6, 3}, {9, 3}, {8, 2}, {10, 2}};  // 1..5 rows a unit
    const Kv kvs[] = {Kv::Bf16, Kv::Int8PerChannel, Kv::Fp16, Kv::Int8PerToken};
    int ran = 0;
    for (const char* impl : kVectorImplementations) {
        int cases = 0;
        for (const char* form : {"BNSD", "BSH", "BnNBsD", "BnBsH", "NZ"})
            for (int64_t dim : {16, 48, 64, 80, 128}) {
                const Kv kv = kvs[size_t(cases % 4)];
                ++cases;
                // NZ int8 caches hold 32-lane dim groups.
                const Kv use = std::string(form) == "NZ" && dim % 32 != 0 && kv != Kv::Fp16 ? Kv::Bf16 : kv;
                if (!expectVectorKernel(impl, decodeCase(form, dim, groups[size_t(cases % 5)], use))) break;
                ++ran;
            }
    }
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

// Key splits (the last split of 2 keys), with int8 and bf16 pages, every group size.
TEST(FiaDecodeKernels, KeySplitRemaindersAgainstReference) {
    int ran = 0;
    for (const char* impl : kVectorImplementations)
        for (auto group : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {10, 2}})
            for (Kv kv : {Kv::Int8PerChannel, Kv::Bf16}) {
                FiaProblem p = decodeCase("BnNBsD", 128, group, kv);
                p.kvLens = {kSplitKeys + 2, 1, kSplitKeys + 64};
                p.batch = 3;
                p.kvSeqLen = kSplitKeys + 64;
                if (!expectVectorKernel(impl, p)) break;
                ++ran;
            }
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

// The bf16-pair decode ("avx512-bf16": vdpbf16ps on the query's and keys' dim pairs, and on
// pairs of keys for P.V) where the CPU has AVX512-BF16: every row form (NZ takes the entry's fp32
// dots), head dims ending on a half pair vector (16, 48, 80) or whole ones, groups of 1 to 5
// rows, key lengths leaving every remainder of the three-key steps and an odd last key pair, key
// splits, and masked blocks (a sliding window and a pse: keys whose probability is 0 in every row
// of a tile leave the value pairs). Problems other than a bf16 query on a bf16 cache are refused.
TEST(FiaDecodeKernels, Bf16PairDecodeAgainstReference) {
    const std::pair<int64_t, int64_t> groups[] = {{4, 4}, {6, 3}, {9, 3}, {8, 2}, {10, 2}};
    int ran = 0, cases = 0;
    for (const char* form : {"BNSD", "BSH", "BnNBsD", "BnBsH", "NZ"})
        for (int64_t dim : {16, 48, 64, 80, 128}) {
            if (!expectVectorKernel("avx512-bf16", decodeCase(form, dim, groups[size_t(cases++ % 5)], Kv::Bf16)))
                GTEST_SKIP() << "no AVX512-BF16 on this CPU";
            ++ran;
        }
    {
        FiaProblem p = decodeCase("BnNBsD", 128, {8, 2}, Kv::Bf16);
        p.kvLens = {kSplitKeys + 3, 1, kSplitKeys + 64};
        p.batch = 3;
        p.kvSeqLen = kSplitKeys + 64;
        expectVectorKernel("avx512-bf16", p);
    }
    {
        FiaProblem p = decodeCase("BnBsH", 64, {8, 2}, Kv::Bf16);
        p.sparseMode = 4;  // a sliding window of 40 keys before the query's
        p.preTokens = 40;
        p.nextTokens = 0;
        expectVectorKernel("avx512-bf16", p);
        p.sparseMode = 0;
        p.preTokens = p.nextTokens = kNoBand;
        p.pse = "batch";
        expectVectorKernel("avx512-bf16", p);
    }
    for (Kv kv : {Kv::Fp16, Kv::Int8PerChannel}) {
        FiaInstance inst(decodeCase("BnNBsD", 64, {4, 2}, kv));
        attnops::testsupport::ForcedImpl force("avx512-bf16");
        EXPECT_EQ(inst.run(), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) << inst.problem.describe();
    }
    EXPECT_EQ(ran, 25);
}
