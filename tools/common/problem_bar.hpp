// One description of a BlockAttentionResiduals problem for the tests, the CLI and the benchmarks:
// deterministic inputs (token-major or source-major block cache), the forward and grad calls, and
// comparisons with the double reference under the tolerance rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.hpp"

namespace attnops::tools {

struct BarProblem {
    int64_t tokens = 64, blocks = 8, hidden = 256;
    attnopsDataType dtype = ATTNOPS_FLOAT32;
    double eps = 1e-6;
    bool sourceMajor = false;     // blockRes is a [N,T,H] buffer viewed as [T,N,H] (strided, no copy)
    bool zeroProjWeight = false;  // the paper's initialisation: uniform probabilities
    bool projWeight2d = false;    // projWeight [1,H] instead of [H]
    int64_t validBlockNum = -1;   // passed to both calls (forward: -1 or N; grad: -1, 0 or N)
    uint64_t dataSeed = 3;
    double dataScale = 1.0;

    std::string describe() const;
    // Compulsory bytes per call (spec section 5): forward (K+1)*H*b (+8K with statistics),
    // backward (2K+1)*H*b + 8K.
    double forwardBytes(bool withStats) const;
    double backwardBytes() const;
};

// A tensor over its own buffer with arbitrary strides (HostTensor is always contiguous).
class StridedTensor {
public:
    StridedTensor() = default;
    StridedTensor(attnopsDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t bufferElements);
    ~StridedTensor();
    StridedTensor(StridedTensor&& o) noexcept;
    StridedTensor& operator=(StridedTensor&& o) noexcept;
    StridedTensor(const StridedTensor&) = delete;
    StridedTensor& operator=(const StridedTensor&) = delete;
    attnopsTensor* handle() const { return handle_; }
    attnopsDataType dtype() const { return dtype_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    const std::vector<int64_t>& strides() const { return strides_; }
    void* data() { return bytes_.data(); }
    const void* data() const { return bytes_.data(); }
    int64_t offset(const std::vector<int64_t>& index) const;
    float get(const std::vector<int64_t>& index) const;
    void set(const std::vector<int64_t>& index, float v);

private:
    attnopsDataType dtype_ = ATTNOPS_FLOAT32;
    std::vector<int64_t> shape_, strides_;
    std::vector<uint8_t> bytes_;
    attnopsTensor* handle_ = nullptr;
};

struct BarInstance {
    BarProblem problem;
    HostTensor partialBlock, projWeight, normWeight;
    StridedTensor blockRes;
    HostTensor hiddenStates, invNorm, probs;
    HostTensor gradHiddenStates, gradPartialBlock, gradBlockRes, gradProjWeight, gradNormWeight;

    explicit BarInstance(const BarProblem& p);
    attnopsStatus runForward(bool needBackward = true, attnopsStream* stream = nullptr);
    // Uses invNorm/probs of the forward run.
    attnopsStatus runBackward(attnopsStream* stream = nullptr);
};

struct BarCheck {
    double maxAbsError[4] = {0, 0, 0, 0};   // forward: hidden, invNorm (relative), probs, -
    double tolerance[4] = {0, 0, 0, 0};
    double maxAbsNaiveError = 0;
    bool passed = true;
    std::string failure;
    // Per tensor, for comparisons of single outputs: NaN on one side only by index, and the
    // backward's index 0 split into gradPartialBlock's and gradBlockRes's parts.
    bool nanMismatch[4] = {false, false, false, false};
    double maxAbsErrorPartial = 0, maxAbsErrorBlockRes = 0;
    bool nanMismatchPartial = false, nanMismatchBlockRes = false;
    int64_t tokens = 0;  // tokens compared (weight gradients: always every token)
};

// Forward outputs of every token (or `sample` evenly spaced tokens) against the reference;
// invNorm/probs only when `checkStats` (the forward wrote them: needBackward).
BarCheck checkBarForward(const BarInstance& inst, int64_t sample = -1, bool checkStats = true);
// Backward: gradBlockRes/gradPartialBlock (index 0), gradProjWeight (1), gradNormWeight (2).
BarCheck checkBarBackward(const BarInstance& inst);
// The same with gradBlockRes/gradPartialBlock compared on `sample` evenly spaced tokens (-1:
// every token); the weight gradients, reduced over all tokens, are still checked in full.
BarCheck checkBarBackward(const BarInstance& inst, int64_t sample);

}  // namespace attnops::tools
