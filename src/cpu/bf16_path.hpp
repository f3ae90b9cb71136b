// How bf16 products are computed on this CPU, chosen once per process: vdpbf16ps on bf16 pairs
// ("dot") or bf16 widened to fp32 and multiplied with fp32 FMAs ("widen"). CPUID/XCR0 decide
// what is legal; among legal paths the vendor gives the default (AMD: dot, about 2x the fp32
// FMA rate on Zen 4/5; Intel: widen, vdpbf16ps is half the FMA rate there), which a short
// calibration confirms or overturns; ATTNOPS_BF16_PATH=dot|widen|auto pins it. Never from the
// CPU model number, never per shape or thread count (so results are bitwise reproducible).
#pragma once

#include <functional>
#include <string>

#include "cpu/isa.hpp"

namespace attnops::cpu {

enum class Bf16Path { Dot, Widen };
enum class Bf16Pin { Auto, Dot, Widen };

// GFLOP/s of the two GEMM microkernels on the same L1-resident block, one thread.
struct Bf16Calibration {
    double dotGflops = 0.0;
    double widenGflops = 0.0;
};

struct Bf16Choice {
    Bf16Path path = Bf16Path::Widen;
    std::string reason;       // why, in words (printed by attnops info and bench)
    bool calibrated = false;  // whether `calibration` was measured
    Bf16Calibration calibration;
};

// The calibration overturns the vendor default only when the other path is this much faster:
// the two differ by about 2x in opposite directions, so VM noise (+-15%) cannot flip a choice.
constexpr double kBf16SwitchRatio = 1.3;

const char* bf16PathName(Bf16Path path);

// ATTNOPS_BF16_PATH: empty or "auto", "dot", "widen"; anything else is an invalid argument.
Bf16Pin parseBf16Pin(const std::string& value);

// The decision from its inputs (tests inject them). `calibrate` runs only when it can change
// the result: dot legal and not pinned.
Bf16Choice decideBf16Path(const IsaFeatures& features, Bf16Pin pin, const std::function<Bf16Calibration()>& calibrate);

// This process's choice: decided on first call (thread-safe), the same object afterwards.
const Bf16Choice& bf16Path();

// Both microkernels timed on this CPU (cpu/avx512/bf16_calibration.cpp); needs AVX512_BF16.
Bf16Calibration calibrateBf16Avx512();

}  // namespace attnops::cpu
