// One description of a FusedInferAttentionScore problem for the tests (and, next, the CLI and
// the benchmarks): deterministic inputs defined per logical element (batch, head, row, dim), so
// that every layout and cache format of one problem holds the same values; the API call; and the
// comparison against the double reference under the tolerance rule.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "ops/fused_infer_attention_score/check.hpp"
#include "problem.hpp"

namespace attnops::tools {

struct FiaProblem {
    std::string layout = "BNSD";           // BSH, BSND, BNSD, TND
    int64_t batch = 1;                     // non-TND
    int64_t qSeqLen = 1, kvSeqLen = 64;    // non-TND: Q_S, KV_S (paged: KV_S is derived)
    std::vector<int64_t> qLens, kvLens;    // actual lengths per batch; non-TND: empty = not passed
    int64_t extraQRows = 0, extraKvRows = 0;  // TND rows beyond the last cumulative end
    int64_t heads = 4, kvHeads = 2, dim = 64, vDim = -1;  // vDim < 0: = dim
    attnopsDataType dtype = ATTNOPS_FLOAT16;
    double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: 1/sqrt(dim)
    int64_t sparseMode = 0, preTokens = kNoBand, nextTokens = kNoBand;
    // attenMask: "auto" (compressed for modes 2-4, none for mode 0, random for mode 1), "none",
    // "random" (a full mask, about a quarter masked, some rows fully masked), "tree" (mode 9's
    // [B, Q_S, Q_S] tree mask; "auto" with mode 9).
    std::string maskKind = "auto";
    std::string cache = "none";            // "none", "BnBsH", "BnNBsD", "NZ"
    int64_t blockSize = 16;
    bool shuffleBlocks = true;             // physical blocks in a scrambled order
    int64_t maxBlocksPerSeq = 0;           // 0: what the longest sequence needs
    bool int8Kv = false;
    int64_t keyQuantMode = 0, valueQuantMode = 0;  // 0 per-channel, 1 per-token
    bool quantOffset = true;
    bool lse = true;
    bool sink = false;
    // pseShift: "none", "batch" [B, N, Q_S, K] or "shared" [1, N, Q_S, K] (K: the mask's columns).
    std::string pse = "none";
    int64_t ropeDim = 0;                   // MLA: queryRope/keyRope of this width (64), 0: none
    uint64_t dataSeed = 1;

    bool tnd() const { return layout == "TND"; }
    bool paged() const { return cache != "none"; }
    int64_t vdim() const { return vDim < 0 ? dim : vDim; }
    int64_t batches() const { return tnd() ? int64_t(qLens.size()) : batch; }
    bool valueIsKey() const { return ropeDim > 0 && dim == 512; }  // decode MLA: the value holds the key
    int64_t qLen(int64_t b) const;   // actual (effective) query length of batch b
    int64_t kvLen(int64_t b) const;  // actual key/value length of batch b
    std::string describe() const;
};

// All tensors of one call, built from a problem with every input filled.
struct FiaInstance {
    FiaProblem problem;
    HostTensor query, key, value, attenMask, blockTable, keyScale, keyOffset, valueScale, valueOffset, sink;
    HostTensor pseShift, queryRope, keyRope;
    HostTensor attentionOut, softmaxLse;
    std::vector<int64_t> qLensArg, kvLensArg;  // the actualSeqLengths(Kv) arrays passed (may be empty)
    bool passQLens = false, passKvLens = false;

    explicit FiaInstance(const FiaProblem& p);
    // The problem alone, every tensor empty: for callers that bring their own tensors (the CLI's
    // --load, the demo's growing paged cache) and set the members and the length arrays.
    struct NoInputs {};
    FiaInstance(const FiaProblem& p, NoInputs) : problem(p) {}
    // GetWorkspaceSize + execute + synchronize. Returns the first failing status.
    attnopsStatus run(attnopsStream* stream = nullptr);
};

// The instance's host arrays as attnops handles, alive as long as this object.
class FiaArrays {
public:
    explicit FiaArrays(const FiaInstance& inst);
    ~FiaArrays();
    FiaArrays(const FiaArrays&) = delete;
    FiaArrays& operator=(const FiaArrays&) = delete;
    attnopsIntArray *qLens = nullptr, *kvLens = nullptr;
};

// The call's arguments (handles borrowed from inst and arrays; key/value point into `kv`).
fia::Args fiaArgs(const FiaInstance& inst, const FiaArrays& arrays, const attnopsTensor* kv[2]);

// Calls phase 1 with `a` unpacked (tests change single arguments of fiaArgs' result).
attnopsStatus fiaGetWorkspace(const fia::Args& a, uint64_t* workspaceSize, attnopsExecutor** executor);

struct FiaCheck {
    double maxAbsError = 0, maxAbsNaiveError = 0, maxAbsReference = 0, tolerance = 0;
    double maxLseError = 0, lseTolerance = 0;
    int64_t rows = 0, emptyRows = 0;  // rows compared; rows that must be 0 / +inf
    bool passed = true;
    std::string firstFailure;
};

// Compares every output row (and softmaxLse) against the reference: computed rows under the
// tolerance rule, rows outside the actual lengths exactly 0 (lse +inf).
FiaCheck checkFia(const FiaInstance& inst);
// The same on the rows of the listed batches (sequences) only: a sampled check of a large call.
FiaCheck checkFiaBatches(const FiaInstance& inst, const std::vector<int64_t>& batches);

// Mask-aware FLOPs of the call (2 (D + Dv) per score the sparse mode's band keeps, per query
// head; the holes of an explicit mask are counted, decode counts every key), and the bytes of K and V it must read at least:
// every key and value of the actual KV lengths once per kv head (int8: 1 byte an element, plus
// the per-token scales and offsets; MLA: the key rope too, and decode MLA reads its key once as
// key and value).
double fiaForwardFlops(const FiaProblem& p);
double fiaKvBytes(const FiaProblem& p);

}  // namespace attnops::tools
