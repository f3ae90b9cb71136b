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
    std::string layout = "BNSD";           // any inputLayout: BSH, BSND, BNSD, TND, NTD, or X_Y (output Y)
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
    int64_t maxBlocksPerSeq = 0;           // blockTable columns; 0: what the longest sequence needs
    bool int8Kv = false;
    int64_t keyQuantMode = 0, valueQuantMode = 0;  // 0 per-channel, 1 per-token, 2-5 (spec 9.1)
    bool quantOffset = true;
    bool int4Kv = false;                   // int4 key/value in int32 containers of eight
    bool combinedQuant = false;            // antiquantScale/Offset [2, ...], antiquantMode = keyQuantMode
    bool quantPerTensor = false;           // mode 0: one scale ([1]; combined [2])
    // int8 attentionOut through quantScale2 / quantOffset2: per tensor or per channel, fp32 or bf16.
    bool int8Out = false, outQuantPerChannel = false, outQuantOffset = true;
    attnopsDataType outQuantDType = ATTNOPS_FLOAT32;
    bool lse = true;
    bool sink = false;
    // Left padding (non-packed): queryPaddingSize / kvPaddingSize, < 0: not passed. The valid rows
    // of batch b are the last qLen(b) (kvLen(b)) rows before the padding.
    int64_t queryPadding = -1, kvPadding = -1;
    // Shared prefix of prefixRows rows (0: none); actualSharedPrefixLen, < 0: not passed. Prefix
    // row t holds batch 0's logical row t, and every batch's own row t its logical row Lp + t, so
    // that with B = 1 the call equals a plain one over Lp + kvLen rows.
    int64_t prefixRows = 0, prefixLen = -1;
    bool kvList = false;                   // tensor-list key/value: batch b's tensor holds kvListRows(b) rows
    // pseShift: "none", "batch" [B, N, Q_S, K] or "shared" [1, N, Q_S, K] (K: the mask's columns).
    std::string pse = "none";
    int64_t ropeDim = 0;                   // MLA: queryRope/keyRope of this width (64), 0: none
    // Full int8 quantisation (spec 9.2): int8 query (with int8Kv: int8 key/value, no antiquant
    // operands), per-tensor deqScale1 / quantScale1 / deqScale2; deq scales fp32 or uint64 (the
    // fp32 bits in the low half). dtype is then the output's (fp16) and pseShift's.
    bool fullQuant = false;
    attnopsDataType deqScaleDType = ATTNOPS_FLOAT32;
    // MLA full quantisation (spec 9.2, with ropeDim 64, dim 512, int8Kv, a paged cache): int8
    // query with dequantScaleQuery (queryQuantMode 3, fp32 per token and head), per-tensor fp32
    // key/valueAntiquantScale, rope and output in dtype (bf16).
    bool mlaFullQuant = false;
    uint64_t dataSeed = 1;

    std::string inLayout() const;          // the query/key/value layout (before '_')
    std::string outLayout() const;         // attentionOut's layout (after '_', else the same)
    bool tnd() const { return inLayout() == "TND" || inLayout() == "NTD"; }  // packed rows
    int64_t sharedPrefix() const { return prefixRows == 0 ? 0 : prefixLen < 0 ? prefixRows : prefixLen; }
    // Tensor list: batch b's S; without kvLens that is its length (kvSeqLen + b % 3), with them
    // some spare rows follow.
    int64_t kvListRows(int64_t b) const { return kvLen(b) + (kvLens.empty() ? 0 : b % 3); }
    bool paged() const { return cache != "none"; }
    int64_t vdim() const { return vDim < 0 ? dim : vDim; }
    bool quantKv() const { return int8Kv || int4Kv; }
    bool int8Query() const { return fullQuant || mlaFullQuant; }
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
    HostTensor antiquantScale, antiquantOffset, quantScale2, quantOffset2;
    HostTensor deqScale1, quantScale1, deqScale2;  // full int8 quantisation
    HostTensor dequantScaleQuery;                  // MLA full quantisation
    HostTensor queryPaddingSize, kvPaddingSize, keySharedPrefix, valueSharedPrefix;
    std::vector<HostTensor> keyList, valueList;  // tensor-list key/value (problem.kvList)
    std::vector<int64_t> prefixLenArg;          // actualSharedPrefixLen (empty: not passed)
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
    attnopsIntArray *qLens = nullptr, *kvLens = nullptr, *prefixLen = nullptr;
    std::vector<const attnopsTensor*> keys, values;  // the key/value arrays (tensor list or one each)
};

// The call's arguments (handles borrowed from inst and arrays; key/value point into `kv`, or
// into arrays.keys/values for a tensor list).
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

// attentionOut's shape for the problem's output layout (qRows: Q_S, or T of a packed layout).
std::vector<int64_t> fiaOutputShape(const FiaProblem& p, int64_t qRows);

// Mask-aware FLOPs of the call (2 (D + Dv) per score the sparse mode's band keeps, per query
// head; the holes of an explicit mask are counted, decode counts every key), and the bytes of K and V it must read at least:
// every key and value of the actual KV lengths once per kv head (int8: 1 byte an element, plus
// the per-token scales and offsets); shared-prefix rows count once per batch (each batch reads them);
// MLA: the key rope too, and decode MLA reads its key once as key and value.
double fiaForwardFlops(const FiaProblem& p);
double fiaKvBytes(const FiaProblem& p);

}  // namespace attnops::tools
