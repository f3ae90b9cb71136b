// The ISA-specific loops behind the arithmetic peaks (peaks_isa.cpp). Call one only where the
// CPU (and for AMX the OS) supports it; each returns the FLOPs it performed.
#pragma once

#include <cstdint>

namespace attnops::tools::isa_loops {

double fmaAvx512(int64_t iterations, float* sink);
double fmaAvx2(int64_t iterations, float* sink);
double dotBf16Avx512(int64_t iterations, float* sink);
double dotBf16Amx(int64_t iterations, float* sink);

}  // namespace attnops::tools::isa_loops
