// FusedInferAttentionScore problems built field by field, and the check of a problem against the
// double reference under forced implementations, shared by the FIA test files.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "problem_fia.hpp"

namespace attnops::testing {

// `batch` requests of qS queries against kvS keys each (non-packed layouts); every other field is
// the generator's default.
inline tools::FiaProblem fiaProblem(const std::string& layout, int64_t batch, int64_t qS, int64_t kvS, int64_t heads,
                                    int64_t kvHeads, int64_t dim) {
    tools::FiaProblem p;
    p.layout = layout;
    p.batch = batch;
    p.qSeqLen = qS;
    p.kvSeqLen = kvS;
    p.heads = heads;
    p.kvHeads = kvHeads;
    p.dim = dim;
    return p;
}

// The FusedInferAttentionScore prefill route this CPU runs (its ATTNOPS_FORCE_IMPL name), or
// nullptr where none does.
inline const char* prefillRouteHere() {
    for (const char* route : {"avx512-prefill", "avx2-prefill"}) {
        testsupport::ForcedImpl force(route);
        tools::FiaInstance inst(fiaProblem("BNSD", 1, 130, 20, 1, 1, 16));
        if (inst.run() == ATTNOPS_SUCCESS) return route;
    }
    return nullptr;
}

// Packed sequences (TND, NTD and their output forms) with their own query and key lengths.
inline tools::FiaProblem fiaPacked(const std::string& layout, std::vector<int64_t> qLens, std::vector<int64_t> kvLens,
                                   int64_t heads, int64_t kvHeads, int64_t dim) {
    tools::FiaProblem p = fiaProblem(layout, 1, 1, 1, heads, kvHeads, dim);
    p.qLens = std::move(qLens);
    p.kvLens = std::move(kvLens);
    return p;
}

// Decode MLA (vLLM-Ascend's call): `batch` requests of qS query rows, Q_N `heads`, KV_N 1, D 512 +
// rope 64, bf16, one context length per request, paged.
inline tools::FiaProblem mlaDecode(const std::string& layout, int64_t batch, int64_t qS, int64_t heads,
                                   std::vector<int64_t> kvLens, const std::string& cache, int64_t blockSize) {
    tools::FiaProblem p = fiaProblem(layout, batch, qS, 0, heads, 1, 512);
    p.ropeDim = 64;
    p.dtype = ATTNOPS_BFLOAT16;
    p.cache = cache;
    p.blockSize = blockSize;
    p.kvLens = std::move(kvLens);
    p.scale = 1.0 / std::sqrt(512.0 + 64.0);
    return p;
}

// Decode MLA full quantisation (spec 9.2, queryQuantMode 3): an int8 query with dequantScaleQuery
// and an int8 key (read as the value) with per-tensor scales; everything else as `p` (mlaDecode).
inline tools::FiaProblem mlaFullQuant(tools::FiaProblem p) {
    p.int8Kv = true;
    p.mlaFullQuant = true;
    return p;
}

inline tools::FiaProblem paged(tools::FiaProblem p, const std::string& cache, int64_t blockSize) {
    p.cache = cache;
    p.blockSize = blockSize;
    return p;
}

inline tools::FiaProblem withMode(tools::FiaProblem p, int64_t mode, int64_t pre = tools::kNoBand,
                                  int64_t next = tools::kNoBand) {
    p.sparseMode = mode;
    p.preTokens = pre;
    p.nextTokens = next;
    return p;
}

// Runs `p` with each of `impls` forced ("" = the planner's choice, which must be `automatic`) and
// checks every row against the double reference; the case must attend something.
inline void expectFiaMatchesReference(const tools::FiaProblem& p, std::initializer_list<const char*> impls,
                                      const std::string& automatic) {
    for (const char* impl : impls) {
        SCOPED_TRACE(std::string(impl[0] ? impl : "automatic") + ": " + p.describe());
        tools::FiaInstance inst(p);
        attnopsStatus st;
        {
            testsupport::ForcedImpl force(impl);
            st = inst.run();
        }
        ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(tools::lastImplementation(), impl[0] ? std::string(impl) : automatic);
        const tools::FiaCheck r = tools::checkFia(inst);
        EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance "
                              << r.tolerance << ", lse error " << r.maxLseError << ")";
        EXPECT_GT(r.rows, 0);
        EXPECT_GT(r.maxAbsReference, 0.0);
    }
}

// Runs p with the vector kernel `impl` forced; false (and nothing checked) when this CPU lacks
// it. The kernel must take the problem (no fallback), attend something and match the reference.
inline bool expectVectorKernel(const char* impl, const tools::FiaProblem& p) {
    SCOPED_TRACE(std::string(impl) + ": " + p.describe());
    tools::FiaInstance inst(p);
    attnopsStatus st;
    {
        testsupport::ForcedImpl force(impl);
        st = inst.run();
    }
    if (st == ATTNOPS_ERROR_UNSUPPORTED_HARDWARE) return false;
    EXPECT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    if (st != ATTNOPS_SUCCESS) return true;
    EXPECT_EQ(tools::lastImplementation(), impl);
    const tools::FiaCheck r = tools::checkFia(inst);
    EXPECT_TRUE(r.passed) << r.firstFailure << " (rows " << r.rows << ", error " << r.maxAbsError << ", tolerance "
                          << r.tolerance << ", lse error " << r.maxLseError << ")";
    EXPECT_GT(r.rows, 0);
    EXPECT_GT(r.maxAbsReference, 0.0);
    return true;
}

}  // namespace attnops::testing
