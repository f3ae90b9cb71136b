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
#endif

namespace attnops::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t readXcr0() {
    uint32_t eax = 0, edx = 0;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return (uint64_t(edx) << 32) | eax;
}

bool requestAmxPermission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kArchGetXcompPerm = 0x1022;
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
    return (mask & (1ul << kXfeatureXtiledata)) != 0;
#else
    return false;
#endif
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
    const bool osAmx = (xcr0 & 0x60000) == 0x60000;
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
    }
    f.amxGranted = f.amxTile && osAmx && requestAmxPermission();
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
IsaFeatures probe() { return {}; }
#endif

}  // namespace

const IsaFeatures& isa() {
    static const IsaFeatures features = probe();
    return features;
}

}  // namespace attnops::cpu
