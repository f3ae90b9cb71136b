// One-time, thread-safe probe of the CPU's instruction sets and of the OS support for them.
// The only place that reads CPUID/XCR0 or asks Linux for AMX permission.
#pragma once

#include <string>

namespace attnops::cpu {

struct IsaFeatures {
    bool avx2 = false;
    bool fma = false;
    bool f16c = false;
    bool avx512f = false;
    bool avx512bw = false;
    bool avx512vl = false;
    bool avx512bf16 = false;
    bool avx512fp16 = false;
    bool amxTile = false;      // CPUID says the CPU has it
    bool amxBf16 = false;
    bool amxGranted = false;   // the OS enabled tile state and granted this process permission
    std::string vendor;  // CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...
    std::string brand;
};

// Probed on first call; the same object afterwards.
const IsaFeatures& isa();

}  // namespace attnops::cpu
