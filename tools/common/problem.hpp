// One description of a FlashAttentionScore problem that the tests, the CLI and the benchmarks
// share: it builds deterministic random inputs (with the pse, masks and dropout mask the
// options ask for), calls the C API, and compares rows against the double reference.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "ops/flash_attention_score/check.hpp"

namespace attnops::tools {

// splitmix64: small, fast, deterministic; the source of every generated input.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
    float symmetric(double scale) { return float((uniform() * 2.0 - 1.0) * scale); }

private:
    uint64_t state_;
};

// A host tensor owning its bytes, with an attnops handle over them.
class HostTensor {
public:
    HostTensor() = default;
    HostTensor(attnopsDataType dtype, std::vector<int64_t> shape);
    ~HostTensor();
    HostTensor(HostTensor&& other) noexcept;
    HostTensor& operator=(HostTensor&& other) noexcept;
    HostTensor(const HostTensor&) = delete;
    HostTensor& operator=(const HostTensor&) = delete;

    bool empty() const { return handle_ == nullptr; }
    attnopsTensor* handle() const { return handle_; }
    attnopsDataType dtype() const { return dtype_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    int64_t numel() const;
    void* data() { return bytes_.data(); }
    const void* data() const { return bytes_.data(); }
    std::vector<uint8_t>& bytes() { return bytes_; }
    const std::vector<uint8_t>& bytes() const { return bytes_; }
    float get(int64_t index) const;       // floating dtypes (and uint8/bool as 0/1)
    void set(int64_t index, float value);

private:
    attnopsDataType dtype_ = ATTNOPS_FLOAT32;
    std::vector<int64_t> shape_;
    std::vector<uint8_t> bytes_;
    attnopsTensor* handle_ = nullptr;
};

constexpr int64_t kNoBand = 2147483647;

// Phase 2 of any operator (attnopsFlashAttentionScore, ...Grad, attnopsBlockAttentionResiduals,
// ...Grad) for the executor phase 1 returned: workspace from the current device, launch on
// `stream`, synchronize, free. A failed `planned` status is returned as it is.
using LaunchFn = attnopsStatus (*)(void*, uint64_t, attnopsExecutor*, attnopsStream*);
attnopsStatus launchAndWait(attnopsStatus planned, uint64_t workspaceSize, attnopsExecutor* executor, LaunchFn launch,
                            attnopsStream* stream = nullptr);
// The implementation the last launchAndWait of this thread ran ("tiled-avx512", ...).
const std::string& lastImplementation();

struct FaProblem {
    std::string layout = "BNSD";          // BSH, SBH, BSND, BNSD, TND
    int64_t batch = 1;                    // fixed layouts
    int64_t qSeqLen = 128, kvSeqLen = 128;
    std::vector<int64_t> qSeqLens, kvSeqLens;  // TND: per-sequence lengths (not cumulative)
    int64_t extraQRows = 0, extraKvRows = 0;   // TND tail rows beyond the last sequence
    int64_t heads = 4, kvHeads = 4, dim = 64, vDim = -1;  // vDim < 0: = dim
    attnopsDataType dtype = ATTNOPS_FLOAT32;
    double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: 1/sqrt(dim)
    int64_t sparseMode = 0;
    int64_t preTokens = kNoBand, nextTokens = kNoBand;
    std::vector<int64_t> prefix;          // modes 5/6; empty: generated
    int pseType = -1;                     // -1: no pse; 0/1: dense pse of the usual shape; 2/3: slopes
    std::string pseShape = "full";        // 0/1: "full", "row" (row broadcast), "compressed"
    // attenMask: "auto" (what the mode needs: the compressed tensor for modes 2-4 and 6-8, an
    // all-zero one for a mode-0 band or mode 5, none otherwise), "none" (NULL: no masking at all,
    // whatever the mode), "random", "causal" (explicit masks), "zeros", "compressed".
    std::string maskKind = "auto";
    double keepProb = 1.0;
    bool explicitDropMask = false;        // materialise the Philox mask and pass it as dropMask
    int64_t seed = 0, offset = 0;         // dropout
    bool sink = false;
    int64_t statLanes = 8;                // 8, 1, or 0 (no statistics)
    uint64_t dataSeed = 1;                // inputs
    double dataScale = 1.0;               // inputs ~ U(-dataScale, dataScale)
    int64_t innerPrecise = 0;             // passed through to the API

    int64_t vdim() const { return vDim < 0 ? dim : vDim; }
    std::string resolvedMaskKind() const;  // maskKind with "auto" resolved
    bool tnd() const { return layout == "TND"; }
    double effectiveScale() const;
    int64_t sequenceCount() const { return tnd() ? int64_t(qSeqLens.size()) : batch; }
    int64_t qLen(int64_t b) const { return tnd() ? qSeqLens[size_t(b)] : qSeqLen; }
    int64_t kvLen(int64_t b) const { return tnd() ? kvSeqLens[size_t(b)] : kvSeqLen; }
    // Causal FLOPs of the forward with a mask-aware count (4 * D-ish per kept score).
    double forwardFlops() const;
    std::string describe() const;
};

// Problem builders shared by the tests: fixed layouts, TND, and the common variations.
FaProblem fixed(const std::string& layout, attnopsDataType dt, int64_t b, int64_t s1, int64_t s2, int64_t n1,
                int64_t n2, int64_t d, int64_t dv = -1);
FaProblem tnd(attnopsDataType dt, std::vector<int64_t> q, std::vector<int64_t> kv, int64_t n1, int64_t n2, int64_t d,
              int64_t dv = -1);
FaProblem withMode(FaProblem p, int64_t mode, int64_t pre = kNoBand, int64_t next = kNoBand);
FaProblem withPse(FaProblem p, int type, const char* shape = "full");

// All tensors of one forward call. Built from a problem; inputs filled deterministically.
struct FaInstance {
    FaProblem problem;
    HostTensor query, key, value, pse, dropMask, attenMask, sink;
    HostTensor attentionOut, softmaxMax, softmaxSum;
    std::vector<int64_t> qCumulative, kvCumulative, prefix, qStartIdx, kvStartIdx;

    explicit FaInstance(const FaProblem& p);
    // Inputs loaded from elsewhere (the CLI's --load) replace the generated ones by name: the
    // members are public; call allocateOutputs after replacing the query.
    // GetWorkspaceSize + execute + synchronize on `stream`. Returns the first failing status;
    // the message is attnopsGetLastErrorMessage().
    attnopsStatus runForward(attnopsStream* stream = nullptr);
    // Phase 1 only (for tests of planning); the executor must be executed or destroyed.
    attnopsStatus plan(uint64_t* workspaceSize, attnopsExecutor** executor);
};

// The instance's host int arrays as attnops handles, alive as long as this object.
class FaArrays {
public:
    explicit FaArrays(const FaInstance& inst);
    ~FaArrays();
    FaArrays(const FaArrays&) = delete;
    FaArrays& operator=(const FaArrays&) = delete;
    attnopsIntArray *prefix = nullptr, *qCumulative = nullptr, *kvCumulative = nullptr, *qStartIdx = nullptr,
                    *kvStartIdx = nullptr;

private:
    void release();
};

// The forward call's arguments for an instance (handles borrowed from inst and arrays).
fa::ForwardArgs forwardArgs(const FaInstance& inst, const FaArrays& arrays);

// Allocates the output tensors of an instance (after its inputs are set).
void allocateOutputs(FaInstance& inst);

// The keep mask the operator generates from (keepProb, seed, offset) when no dropMask is given,
// materialised as the uint8 dropMask tensor that gives the same result (keepProb < 1).
HostTensor generatedDropMask(const FaInstance& inst);

// Error of attnops' output against the double reference on a set of rows.
struct RowCheck {
    int64_t rows = 0;
    double maxAbsError = 0;        // attnops vs reference, attention_out
    double maxAbsNaiveError = 0;   // naive low precision vs reference (bf16/fp16 rule)
    double maxAbsReference = 0;    // largest |reference| seen
    double maxStatError = 0;       // |max| and relative |sum| errors of the statistics
    double maxSoftmaxMaxError = 0; // the same, split: softmax_max only
    double maxSoftmaxSumError = 0; //                  softmax_sum only
    double statTolerance = 0;      // the bound the statistics must meet
    double tolerance = 0;          // the bound attnops must meet
    bool passed = true;
    bool nanMismatch = false;
    std::string firstFailure;
};

// Compares `rows` (sequence, head, row) of inst.attentionOut and the statistics against the
// reference; rows < 0 compares every row. Sampling is deterministic.
RowCheck checkForwardRows(const FaInstance& inst, int64_t rows, uint64_t sampleSeed = 7);

// The tolerance rule of design.md: low precision: 2 x naive error + 1e-5 * max|ref| + 1e-6;
// fp32: a bound derived from the reduction lengths.
double forwardTolerance(const FaProblem& p, double naiveError, double maxAbsReference, double scoreMagnitude);

}  // namespace attnops::tools
