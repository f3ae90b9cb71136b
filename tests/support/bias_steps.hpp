// Shared by the tests of the forward's and the backward's vector pse / mask / dropout steps
// (tests/ops/fa_bias_steps_test.cpp, tests/ops/fa_bwd_bias_steps_test.cpp): the switch to the row
// steps, NaN-canonical bytes, and the problem edits both sweep.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "forced_impl.hpp"
#include "problem.hpp"

namespace attnops::testsupport {

// Sets ATTNOPS_FA_ROW_STEPS for a scope.
class RowSteps : ScopedEnv {
public:
    RowSteps() : ScopedEnv("ATTNOPS_FA_ROW_STEPS", "1") {}
};

// The bytes of a tensor with every NaN written as one pattern: NaN payloads and signs depend on
// the order of the operands of the instruction that made them (the paths multiply acc * alpha
// and alpha * acc), not on the semantics.
inline std::vector<uint8_t> canonicalBytes(const tools::HostTensor& t) {
    if (t.empty()) return {};
    std::vector<uint8_t> bytes = t.bytes();
    const int64_t n = t.numel();
    if (n == 0) return bytes;
    const size_t width = bytes.size() / size_t(n);
    for (int64_t i = 0; i < n; ++i)
        if (std::isnan(t.get(i))) std::memset(bytes.data() + size_t(i) * width, 0x7f, width);
    return bytes;
}

inline tools::FaProblem masked(tools::FaProblem p, const char* kind = "random") {
    p.maskKind = kind;
    return p;
}

inline tools::FaProblem dropout(tools::FaProblem p, double keep = 0.9, bool explicitMask = false) {
    p.keepProb = keep;
    p.explicitDropMask = explicitMask;
    p.seed = 5;
    p.offset = 17;
    return p;
}

// Rows 3, 8 and the last query row of the explicit mask fully masked (every plane).
inline void maskSomeRowsFully(tools::FaInstance& inst) {
    tools::HostTensor& m = inst.attenMask;
    const auto& shape = m.shape();
    const int64_t rows = shape[shape.size() - 2], cols = shape.back(), planes = m.numel() / (rows * cols);
    for (int64_t pl = 0; pl < planes; ++pl)
        for (int64_t r : {int64_t(3), int64_t(8), rows - 1})
            if (r < rows)
                for (int64_t c = 0; c < cols; ++c) m.set((pl * rows + r) * cols + c, 1.0f);
}

// A dense [.., S1, S2] pse with -inf over the first 130 keys of query row 5 (a row the first key
// block drops entirely and later blocks keep) and over the whole of row 9 (a row with no key of
// finite score: fully masked).
// (minusInfRows: the same on any [.., rows, cols] tensor, such as FusedInferAttentionScore's pseShift.)
inline void minusInfRows(tools::HostTensor& t) {
    const auto& shape = t.shape();
    const int64_t rows = shape[shape.size() - 2], cols = shape.back(), planes = t.numel() / (rows * cols);
    const float negInf = -std::numeric_limits<float>::infinity();
    for (int64_t pl = 0; pl < planes; ++pl) {
        if (rows > 5)
            for (int64_t c = 0; c < std::min<int64_t>(cols, 130); ++c) t.set((pl * rows + 5) * cols + c, negInf);
        if (rows > 9)
            for (int64_t c = 0; c < cols; ++c) t.set((pl * rows + 9) * cols + c, negInf);
    }
}
inline void pseMinusInfRows(tools::FaInstance& inst) { minusInfRows(inst.pse); }

}  // namespace attnops::testsupport
