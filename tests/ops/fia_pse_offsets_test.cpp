// FusedInferAttentionScore pseShift with left padding and with the shared prefix (spec 5 step 6,
// 10): the pse is indexed from the padded windows' physical starts, pse[b, n, q0 + i, k0 + j],
// and with a prefix its columns follow the assembled KV (prefix first). Each case against the
// double reference on every implementation this CPU runs, and against the equivalent call
// without padding / without a prefix (same logical values: the same bits).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "problem_fia.hpp"

using namespace attnops;
using namespace attnops::tools;

namespace {

FiaProblem problem(const std::string& layout, int64_t batch, int64_t qS, int64_t kvS, int64_t heads, int64_t kvHeads, int64_t dim) {
    FiaProblem p = attnops::testing::fiaProblem(layout, batch, qS, kvS, heads, kvHeads, dim);
    p.pse = "batch";
    return p;
}

FiaProblem padded(FiaProblem p, int64_t qPad, int64_t kvPad) {
    p.queryPadding = qPad;
    p.kvPadding = kvPad;
    return p;
}

void expectMatches(const FiaProblem& p) {
    SCOPED_TRACE(p.describe());
    int ran = 0;
    for (const char* impl : {"avx512", "avx2", "tiled-generic", "reference"}) {
        SCOPED_TRACE(impl);
        FiaInstance inst(p);
        attnopsStatus st;
        {
            testsupport::ForcedImpl force(impl);
            st = inst.run();
        }
        if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) continue;
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        ++ran;
        const FiaCheck r = checkFia(inst);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance " << r.tolerance
                              << ")";
        EXPECT_GT(r.rows, 0);
    }
    EXPECT_GE(ran, 2);
}

FiaInstance runDefault(const FiaProblem& p) {
    FiaInstance inst(p);
    EXPECT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage() << " " << p.describe();
    return inst;
}

// Output element (b, n, row, d) of a BNSD fp16 output as raw bits.
uint16_t outBits(const FiaInstance& inst, int64_t b, int64_t n, int64_t row, int64_t d) {
    const FiaProblem& p = inst.problem;
    return static_cast<const uint16_t*>(inst.attentionOut.data())[((b * p.heads + n) * p.qSeqLen + row) * p.vdim() + d];
}

}  // namespace

TEST(FiaPseOffsets, LeftPaddingMatchesReference) {
    FiaProblem p = problem("BSND", 3, 12, 20, 4, 2, 32);
    p.qLens = {5, 10, 0};
    p.kvLens = {10, 17, 4};
    for (int64_t mode : {0, 1, 3}) {
        FiaProblem m = p;
        m.sparseMode = mode;
        expectMatches(padded(m, 2, 3));
        expectMatches(padded(m, 0, 1));
    }
    FiaProblem sharedPse = padded(p, 1, 2);  // one [1, N, Q_S, K] pse for every batch
    sharedPse.pse = "shared";
    expectMatches(sharedPse);
    FiaProblem dec = problem("BNSD", 3, 1, 40, 4, 1, 32);
    dec.kvLens = {30, 1, 38};
    expectMatches(padded(dec, -1, 5));  // batch 2's window starts before row 0: zeros
    FiaProblem i8 = padded(dec, -1, 2);
    i8.int8Kv = true;  // per-channel antiquant decode (P_S1 = 1)
    expectMatches(i8);
}

// The padded call's valid rows equal the unpadded call's rows bitwise: the pse element each
// score takes is the logical one (the generator puts it at the physical position, NaN around).
TEST(FiaPseOffsets, PaddedRowsEqualUnpaddedRows) {
    for (int64_t mode : {0, 1}) {
        FiaProblem p = problem("BNSD", 2, 9, 16, 2, 1, 32);
        p.sparseMode = mode;
        p.qLens = {4, 9};
        p.kvLens = {7, 12};
        const FiaInstance plain = runDefault(p);
        const FiaInstance pad = runDefault(padded(p, 0, 2));
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t n = 0; n < 2; ++n)
                for (int64_t i = 0; i < p.qLens[size_t(b)]; ++i) {
                    const int64_t row = 9 - p.qLens[size_t(b)] + i;
                    for (int64_t d = 0; d < 32; ++d)
                        ASSERT_EQ(outBits(pad, b, n, row, d), outBits(plain, b, n, i, d)) << "mode " << mode << " b " << b << " n " << n << " i " << i;
                }
    }
}

// Shared prefix: pse columns [0, Lp) belong to the prefix rows. With B = 1 the call equals a
// plain one over Lp + kvLen rows (the generator's prefix holds the first logical rows).
TEST(FiaPseOffsets, SharedPrefixMatchesReferenceAndPlainCall) {
    for (const char* layout : {"BSH", "BNSD"}) {
        FiaProblem p = problem(layout, 2, 6, 18, 4, 2, 32);
        p.prefixRows = 9;
        p.prefixLen = 7;
        p.kvLens = {18, 5};
        expectMatches(p);
        p.sparseMode = 3;
        expectMatches(p);
    }
    FiaProblem dec = problem("BNSD", 2, 1, 30, 4, 2, 32);
    dec.prefixRows = 5;
    expectMatches(dec);

    FiaProblem one = problem("BNSD", 1, 5, 12, 2, 2, 32);
    one.prefixRows = 6;
    FiaProblem flat = one;
    flat.prefixRows = 0;
    flat.kvSeqLen = 18;
    const FiaInstance a = runDefault(one), b = runDefault(flat);
    EXPECT_EQ(a.attentionOut.bytes(), b.attentionOut.bytes());
}
