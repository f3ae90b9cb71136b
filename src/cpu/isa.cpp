// CPUID / XCR0 probe and the Linux AMX permission request (ARCH_REQ_XCOMP_PERM).
#include "cpu/isa.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

#include <fmt/format.h>

#include "runtime/platform.hpp"

namespace attnops::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t readXcr0() {
    uint32_t eax = 0, edx = 0;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (uint64_t(edx) << 32) | eax;
}

// Asks Linux for the tile data state (permission is per process and covers every thread). It is
// refused, among other reasons, when some thread's alternate signal stack is too small for the
// larger signal frame (sanitizer runtimes and crash handlers install such stacks; see README).
// Empty on success, else the reason.
std::string requestAmxPermission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kArchGetXcompPerm = 0x1022;
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
        return fmt::format("arch_prctl(ARCH_REQ_XCOMP_PERM) refused (errno {})", errno);
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0 || (mask & (1ul << kXfeatureXtiledata)) == 0)
        return "arch_prctl(ARCH_GET_XCOMP_PERM) does not report the tile data state";
    return {};
#else
    return "the OS has no AMX permission request";
#endif
}

AmxCpuid readAmxCpuid(unsigned maxLeaf, uint64_t xcr0, unsigned edx7) {
    AmxCpuid c;
    c.maxLeaf = maxLeaf;
    c.tile = (edx7 >> 24) & 1;
    c.bf16 = (edx7 >> 22) & 1;
    c.osEnabled = (xcr0 & 0x60000) == 0x60000;
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (maxLeaf >= 0x1D) {
        __cpuid_count(0x1D, 0, a, b, cx, d);
        c.maxPalette = a;
        if (a >= 1) {
            __cpuid_count(0x1D, 1, a, b, cx, d);
            c.palette1[0] = a;
            c.palette1[1] = b;
            c.palette1[2] = cx;
        }
    }
    if (maxLeaf >= 0x1E) {
        __cpuid_count(0x1E, 0, a, b, cx, d);
        c.tmul = b;
    }
    return c;
}

IsaFeatures probe() {
    IsaFeatures f;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
    const unsigned maxLeaf = a;
    char vendor[13] = {};
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    f.vendor = vendor;
    __get_cpuid(1, &a, &b, &c, &d);
    const bool osxsave = (c >> 27) & 1;
    const bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    const uint64_t xcr0 = osxsave ? readXcr0() : 0;
    const bool osAvx = (xcr0 & 0x6) == 0x6;
    const bool osAvx512 = osAvx && (xcr0 & 0xe0) == 0xe0;
    if (maxLeaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f.avx2 = osAvx && ((b >> 5) & 1);
        f.fma = osAvx && fma;
        f.f16c = osAvx && f16c;
        f.avx512f = osAvx512 && ((b >> 16) & 1);
        f.avx512bw = osAvx512 && ((b >> 30) & 1);
        f.avx512vl = osAvx512 && ((b >> 31) & 1);
        f.avx512fp16 = osAvx512 && ((d >> 23) & 1);
        f.amxBf16 = (d >> 22) & 1;
        f.amxTile = (d >> 24) & 1;
        unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        f.avx512bf16 = osAvx512 && ((a1 >> 5) & 1);
        f.amxFp16 = (a1 >> 21) & 1;
    }
    const AmxCpuid amx = readAmxCpuid(maxLeaf, xcr0, maxLeaf >= 7 ? d : 0);
    f.amxStatus = amxUnusableReason(amx);
    // ATTNOPS_NO_AMX=1: run as a CPU without the tile unit would (measuring the other kernels on an
    // AMX machine), without asking Linux for the tile state.
    if (f.amxStatus.empty() && envFlag("ATTNOPS_NO_AMX")) f.amxStatus = "disabled by ATTNOPS_NO_AMX";
    if (f.amxStatus.empty()) f.amxStatus = requestAmxPermission();  // only for a tile unit we can use
    f.amxGranted = f.amxStatus.empty();
    if (f.amxGranted) f.amxStatus = "granted";
    __get_cpuid(0x80000000, &a, &b, &c, &d);
    if (a >= 0x80000004) {
        char brand[49] = {};
        for (unsigned leaf = 0; leaf < 3; ++leaf) {
            unsigned r[4];
            __get_cpuid(0x80000002 + leaf, &r[0], &r[1], &r[2], &r[3]);
            std::memcpy(brand + 16 * leaf, r, 16);
        }
        f.brand = brand;
        while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    }
    return f;
}
#else
IsaFeatures probe() {
    IsaFeatures f;
    f.amxStatus = "no AMX: not an x86 CPU";
    return f;
}
#endif

}  // namespace

std::string amxUnusableReason(const AmxCpuid& c) {
    if (!c.tile) return "no AMX: CPUID.7.0:EDX[24]=0";
    if (!c.bf16) return "no AMX-BF16: CPUID.7.0:EDX[22]=0";
    if (!c.osEnabled) return "AMX tile state not enabled by the OS (XCR0[17:18])";
    if (c.maxLeaf < 0x1E) return fmt::format("AMX without the tile leaves 0x1D/0x1E (CPUID.0:EAX={:#x})", c.maxLeaf);
    if (c.maxPalette < 1) return "AMX without palette 1 (CPUID.1D.0:EAX=0), as some virtual machines report";
    const uint32_t bytesPerTile = c.palette1[0] >> 16, bytesPerRow = c.palette1[1] & 0xFFFF;
    const uint32_t names = c.palette1[1] >> 16, rows = c.palette1[2] & 0xFFFF;
    if (bytesPerTile < 1024 || bytesPerRow < 64 || names < 8 || rows < 16)
        return fmt::format("AMX palette 1 smaller than 8 tiles of 16 x 64 bytes (CPUID.1D.1: {} names, {} rows, {} "
                           "bytes per row, {} bytes per tile)",
                           names, rows, bytesPerRow, bytesPerTile);
    const uint32_t maxK = c.tmul & 0xFF, maxN = (c.tmul >> 8) & 0xFFFF;
    if (maxK < 16 || maxN < 64)
        return fmt::format("AMX TMUL smaller than maxK 16, maxN 64 (CPUID.1E.0: {}, {})", maxK, maxN);
    return {};
}

const IsaFeatures& isa() {
    static const IsaFeatures features = probe();
    return features;
}

}  // namespace attnops::cpu
