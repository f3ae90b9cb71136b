// Which problems the fused AMX backward entries ("amx-fused" on the tile unit, "amx-emulated-fused"
// on its software model; cpu/amx/fa_amx_backward_fused.hpp) take, so that a test can require
// them to run every other problem and to decline exactly these.
#pragma once

#include <string>

#include "cpu/isa.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"

namespace attnops::testsupport {

inline bool isAmxFused(const std::string& impl) { return impl == "amx-fused" || impl == "amx-emulated-fused"; }

// Whether entry `impl` (one of the two) declines the problem of `inst` with
// ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION: problems with pse, an explicit mask or dropout (the
// AMX forward's row steps, whose backward is the two-kind one), and operands the entry does not
// multiply (bf16; fp16 on the emulator, and on the hardware where it has AMX-FP16).
inline bool amxFusedDeclines(const std::string& impl, const tools::FaInstance& inst) {
    tools::FaGrads g = tools::makeGrads(inst);
    const fa::ForwardParams p = tools::backwardParams(inst, g).fwd;
    const bool fp16 = impl == "amx-emulated-fused" || cpu::isa().amxFp16;
    const bool typed = p.q.dtype == DType::BF16 || (fp16 && p.q.dtype == DType::F16);
    return !typed || !fa::amxTransposedForward(p);
}

}  // namespace attnops::testsupport
