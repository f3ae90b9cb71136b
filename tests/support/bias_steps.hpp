// Shared by the tests of the forward's and the backward's vector pse / mask / dropout steps
// (tests/ops/fa_bias_steps_test.cpp, tests/ops/fa_bwd_bias_steps_test.cpp): the switch to the row
// steps, NaN-canonical bytes, and the problem edits both sweep.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "problem.hpp"

namespace attnops::testsupport {

// Sets ATTNOPS_FA_ROW_STEPS for a scope.
class RowSteps {
public:
    RowSteps() { setenv("ATTNOPS_FA_ROW_STEPS", "1", 1); }
    ~RowSteps() { unsetenv("ATTNOPS_FA_ROW_STEPS"); }
    RowSteps(const RowSteps&) = delete;
    RowSteps& operator=(const RowSteps&) = delete;
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

}  // namespace attnops::testsupport
