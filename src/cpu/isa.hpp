// One-time, thread-safe probe of the CPU's instruction sets and of the OS support for them.
// The only place that reads CPUID/XCR0 or asks Linux for AMX permission.
#pragma once

#include <cstdint>
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
    bool amxFp16 = false;
    bool amxGranted = false;   // usable: sane palette, tile state enabled by the OS, permission granted
    std::string amxStatus;     // "granted", or why AMX is not used (CPUID bit, XCR0, palette, permission)
    std::string vendor;        // CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...
    std::string brand;
};

// The CPUID and XCR0 words that decide whether the AMX tile unit can be used.
struct AmxCpuid {
    bool tile = false;          // CPUID.(7,0):EDX[24]
    bool bf16 = false;          // CPUID.(7,0):EDX[22]
    bool osEnabled = false;     // XCR0[17] and XCR0[18]: XTILECFG and XTILEDATA state
    uint32_t maxLeaf = 0;       // CPUID.0:EAX
    uint32_t maxPalette = 0;    // CPUID.(1D,0):EAX
    uint32_t palette1[3] = {};  // CPUID.(1D,1):EAX, EBX, ECX
    uint32_t tmul = 0;          // CPUID.(1E,0):EBX
};

// Empty if the words describe a tile unit with the shapes the AMX kernels use (palette 1 with 8
// tiles of 16 rows x 64 bytes, TMUL maxK 16 and maxN 64), else the reason it cannot be used.
// Catches the virtual machines that set the AMX bits but report no palette, on which every tile
// instruction raises #UD.
std::string amxUnusableReason(const AmxCpuid& c);

// Probed on first call; the same object afterwards.
const IsaFeatures& isa();

}  // namespace attnops::cpu
