// The vector FusedInferAttentionScore kernels (avx2, avx512) on int4 key/value in int32
// containers (nibbles unpacked in registers) and on packed key/value blocks (several row tiles
// sharing one fp32 copy of each block):
//  - every int4 antiquant mode the tiled kernel takes (spec 9.1: per channel, per token, per
//    token and head, key per channel with value per token; offsets or not; per tensor and per
//    head are int8 only), layouts, GQA ratios on both sides of the packing threshold, key
//    splits, against the double reference, with the vector kernel forced and required to run;
//  - the same bits as int8 key/value holding the same values (both conversions are exact and
//    the arithmetic after them is shared), and for any thread count;
//  - packing changes no bits: query heads (or rows) computed in a wide group (packed) equal the
//    same heads computed in a narrow one (converted per row tile).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "ops/fused_infer_attention_score/plan.hpp"
#include "problem_fia.hpp"
#include "threads_guard.hpp"

using namespace attnops;
using namespace attnops::tools;
using attnops::fia::kSplitKeys;
using attnops::testing::expectVectorKernel;
using attnops::testsupport::ForcedImpl;

namespace {

const char* const kVectorImplementations[] = {"avx512", "avx2"};

FiaProblem int4Decode(const std::string& layout, int64_t heads, int64_t kvHeads, int64_t dim, int64_t keyMode, int64_t valueMode) {
    FiaProblem p;
    p.layout = layout;
    p.batch = 3;
    p.qSeqLen = 1;
    p.kvSeqLen = 70;
    p.kvLens = {70, 1, 0};
    p.heads = heads;
    p.kvHeads = kvHeads;
    p.dim = dim;
    p.int4Kv = true;
    p.keyQuantMode = keyMode;
    p.valueQuantMode = valueMode;
    return p;
}

struct Outputs {
    std::vector<uint8_t> out, lse;
};

Outputs runForced(const char* impl, FiaInstance& inst, attnopsStatus* status) {
    ForcedImpl force(impl);
    *status = inst.run();
    return {inst.attentionOut.bytes(), inst.softmaxLse.empty() ? std::vector<uint8_t>{} : inst.softmaxLse.bytes()};
}

// Nibble e of packed int4 data, two's complement.
int8_t nibble(const std::vector<uint8_t>& bytes, size_t e) {
    const int v = (e & 1) ? bytes[e / 2] >> 4 : bytes[e / 2] & 0xf;
    return int8_t(v >= 8 ? v - 16 : v);
}

void copyBytes(HostTensor& to, const HostTensor& from, const char* what) {
    ASSERT_EQ(to.empty(), from.empty()) << what;
    if (from.empty()) return;
    ASSERT_EQ(to.bytes().size(), from.bytes().size()) << what;
    to.bytes() = from.bytes();
}

}  // namespace

TEST(FiaInt4Simd, EveryModeLayoutAndGroupAgainstReference) {
    const std::pair<int64_t, int64_t> modes[] = {{0, 0}, {1, 1}, {3, 3}, {0, 1}};  // mode 2: int8 only
    const std::pair<int64_t, int64_t> groups[] = {{4, 2}, {4, 4}, {16, 1}};  // rows per unit 2, 1, 16 (packed)
    int ran = 0;
    for (const char* impl : kVectorImplementations)
        for (const char* layout : {"BSH", "BSND", "BNSD"})
            for (auto [km, vm] : modes)
                for (bool offset : {true, false}) {
                    const auto [heads, kvHeads] = groups[size_t(ran % 3)];  // every group meets every mode
                    FiaProblem p = int4Decode(layout, heads, kvHeads, 64, km, vm);
                    p.quantOffset = offset;
                    p.dtype = (km + (offset ? 1 : 0)) % 2 == 0 ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT16;
                    if (!expectVectorKernel(impl, p)) break;
                    ++ran;
                }
    EXPECT_GT(ran, 0) << "no vector kernel runs on this CPU";
}

TEST(FiaInt4Simd, WideHeadsBlockEdgesAndKeySplits) {
    for (const char* impl : kVectorImplementations) {
        FiaProblem p = int4Decode("BNSD", 8, 2, 128, 0, 0);
        p.dtype = ATTNOPS_BFLOAT16;
        p.kvSeqLen = kSplitKeys + 65;
        p.kvLens = {kSplitKeys + 65, 64, 63};
        if (!expectVectorKernel(impl, p)) continue;
        FiaProblem tok = int4Decode("BSH", 32, 2, 192, 3, 3);  // 16 heads a group: packed blocks
        tok.kvSeqLen = 2 * kSplitKeys + 1;
        tok.kvLens = {2 * kSplitKeys + 1, 65, 1};
        expectVectorKernel(impl, tok);
        FiaProblem split = int4Decode("BSND", 4, 1, 256, 0, 1);
        split.kvSeqLen = 129;
        split.kvLens = {129, 128, 127};
        expectVectorKernel(impl, split);
    }
}

// int4 and int8 key/value holding the same values (and the same scales and offsets) give the
// same bits through each vector kernel, packed or not.
TEST(FiaInt4Simd, SameBitsAsInt8WithTheSameValues) {
    const std::pair<int64_t, int64_t> modes[] = {{0, 0}, {1, 1}, {3, 3}, {0, 1}};  // mode 2: int8 only
    for (const char* impl : kVectorImplementations)
        for (auto [km, vm] : modes)
            for (auto [heads, kvHeads] : {std::pair<int64_t, int64_t>{8, 2}, {16, 1}}) {
                FiaProblem p4 = int4Decode("BNSD", heads, kvHeads, 64, km, vm);
                p4.kvSeqLen = kSplitKeys + 70;
                p4.kvLens = {kSplitKeys + 70, 1, 65};
                p4.dtype = km == 1 ? ATTNOPS_FLOAT16 : ATTNOPS_BFLOAT16;
                FiaProblem p8 = p4;
                p8.int4Kv = false;
                p8.int8Kv = true;
                SCOPED_TRACE(std::string(impl) + ": " + p4.describe());
                FiaInstance i4(p4), i8(p8);
                ASSERT_EQ(i8.key.bytes().size(), 2 * i4.key.bytes().size());
                ASSERT_EQ(i8.value.bytes().size(), 2 * i4.value.bytes().size());
                for (size_t e = 0; e < i8.key.bytes().size(); ++e) i8.key.bytes()[e] = uint8_t(nibble(i4.key.bytes(), e));
                for (size_t e = 0; e < i8.value.bytes().size(); ++e) i8.value.bytes()[e] = uint8_t(nibble(i4.value.bytes(), e));
                copyBytes(i8.keyScale, i4.keyScale, "keyScale");
                copyBytes(i8.keyOffset, i4.keyOffset, "keyOffset");
                copyBytes(i8.valueScale, i4.valueScale, "valueScale");
                copyBytes(i8.valueOffset, i4.valueOffset, "valueOffset");
                attnopsStatus s4, s8;
                const Outputs o4 = runForced(impl, i4, &s4);
                if (s4 == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
                ASSERT_EQ(s4, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
                EXPECT_EQ(lastImplementation(), impl);
                const Outputs o8 = runForced(impl, i8, &s8);
                ASSERT_EQ(s8, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
                EXPECT_EQ(lastImplementation(), impl);
                EXPECT_EQ(o4.out, o8.out);
                EXPECT_EQ(o4.lse, o8.lse);
                EXPECT_TRUE(checkFia(i4).passed);
            }
}

TEST(FiaInt4Simd, SameBitsForAnyThreadCount) {
    testsupport::ThreadsGuard guard;
    FiaProblem p = int4Decode("BSH", 16, 2, 128, 1, 1);
    p.kvSeqLen = 3 * kSplitKeys + 5;
    p.kvLens = {3 * kSplitKeys + 5, 17, kSplitKeys};
    for (const char* impl : kVectorImplementations) {
        SCOPED_TRACE(impl);
        ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
        FiaInstance first(p);
        attnopsStatus st;
        const Outputs one = runForced(impl, first, &st);
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        for (int32_t threads : {2, 3}) {
            ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
            FiaInstance again(p);
            const Outputs o = runForced(impl, again, &st);
            ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_EQ(o.out, one.out) << threads << " threads";
            EXPECT_EQ(o.lse, one.lse) << threads << " threads";
        }
    }
}

// Packing changes no bits. The inputs are defined per logical element, so query head n (row i)
// of a wide problem equals head n (row i) of a narrow one: decode heads 0-3 of a 16-head group
// (packed blocks) against a 4-head group (per row tile), prefill rows 0-2 of 32 rows against a
// 3-row query, for bf16, fp16, int8 and int4 key/value and MLA.
TEST(FiaPackedBlocks, SameBitsAsPerTileConversion) {
    struct Case {
        FiaProblem wide, narrow;
        int64_t rowsCompared;  // leading query heads (decode) or rows (prefill) of batch 0, head 0
        bool prefill;
    };
    std::vector<Case> cases;
    for (int kv = 0; kv < 4; ++kv) {
        FiaProblem w;
        w.layout = "BNSD";
        w.batch = 1;
        w.qSeqLen = 1;
        w.kvSeqLen = 131;  // two full 64-key blocks and a partial one
        w.heads = 16;
        w.kvHeads = 1;
        w.dim = 128;
        w.dtype = kv == 1 ? ATTNOPS_FLOAT16 : ATTNOPS_BFLOAT16;
        w.int8Kv = kv == 2;
        w.int4Kv = kv == 3;
        w.keyQuantMode = w.valueQuantMode = kv == 3 ? 1 : 0;
        FiaProblem n = w;
        n.heads = 4;
        cases.push_back({w, n, 4, false});
    }
    FiaProblem pre;
    pre.layout = "BNSD";
    pre.batch = 1;
    pre.qSeqLen = 32;
    pre.kvSeqLen = 200;
    pre.heads = 1;
    pre.kvHeads = 1;
    pre.dim = 64;
    pre.dtype = ATTNOPS_BFLOAT16;
    FiaProblem preNarrow = pre;
    preNarrow.qSeqLen = 3;
    cases.push_back({pre, preNarrow, 3, true});
    FiaProblem mla;  // decode MLA: the key (512 + rope 64) is the value, 16 heads on one kv head
    mla.layout = "BSND";
    mla.batch = 1;
    mla.qSeqLen = 1;
    mla.kvSeqLen = 100;
    mla.heads = 16;
    mla.kvHeads = 1;
    mla.dim = 512;
    mla.ropeDim = 64;
    mla.dtype = ATTNOPS_BFLOAT16;
    mla.cache = "BnBsH";
    mla.blockSize = 16;
    FiaProblem mlaNarrow = mla;
    mlaNarrow.heads = 4;
    cases.push_back({mla, mlaNarrow, 4, false});
    for (const char* impl : kVectorImplementations)
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(impl) + ": " + c.wide.describe());
            FiaInstance wide(c.wide), narrow(c.narrow);
            attnopsStatus sw, sn;
            runForced(impl, wide, &sw);
            if (sw == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) break;
            ASSERT_EQ(sw, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            EXPECT_EQ(lastImplementation(), impl);
            runForced(impl, narrow, &sn);
            ASSERT_EQ(sn, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            const int64_t dv = c.wide.vdim();
            // BNSD (batch 1): heads, then rows; BSND decode (one row): heads. Either way the
            // compared heads (decode) or rows of head 0 (prefill) lead the output.
            for (int64_t i = 0; i < c.rowsCompared * dv; ++i)
                ASSERT_EQ(wide.attentionOut.get(i), narrow.attentionOut.get(i)) << "element " << i;
            if (!wide.softmaxLse.empty()) {
                for (int64_t i = 0; i < c.rowsCompared; ++i) ASSERT_EQ(wide.softmaxLse.get(i), narrow.softmaxLse.get(i)) << i;
            }
            EXPECT_TRUE(checkFia(wide).passed);
        }
}
