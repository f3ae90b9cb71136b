// HwTiles: the AMX instructions behind the tile interface of tiles.hpp. Include only from files
// whose AMX code runs behind the cpu::isa().amxGranted check; every function carries the AMX
// target attribute.
//
// Compiler hazards handled here (machine-limits.md, amx-and-bf16.md section 4.1):
// - GCC 12's _tile_loadconfig declares an 8-byte memory operand, so the stores that fill a
//   config may be deleted as dead: a compiler barrier that takes the config's address goes first.
// - GCC's tile intrinsics are macros that paste the register number as a token, so they cannot
//   take a template parameter, and its tileloadd has no memory input: the stores that packed a
//   buffer could be sunk past the load. The register-numbered instructions are therefore written
//   as inline asm with the number as an immediate operand and a "memory" clobber, identically for
//   GCC and clang (the same instructions the intrinsics emit).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/amx/tiles.hpp"

// The compilers that declare _tile_dpfp16ps (GCC 13, clang 16 and later) also assemble
// tdpfp16ps; older ones (Debian 12's GCC 12 and clang 14) build the bf16 kernels only.
#if defined(_tile_dpfp16ps)
#define ATTNOPS_AMX_TARGET_LIST "amx-tile,amx-bf16,amx-fp16"
#define ATTNOPS_AMX_HW_FP16 1
#else
#define ATTNOPS_AMX_TARGET_LIST "amx-tile,amx-bf16"
#define ATTNOPS_AMX_HW_FP16 0
#endif
#define ATTNOPS_AMX_HW_INLINE static inline __attribute__((always_inline, target(ATTNOPS_AMX_TARGET_LIST)))

namespace attnops::cpu::amx {

struct HwTiles {
    static constexpr bool kHasFp16 = ATTNOPS_AMX_HW_FP16 != 0;

    ATTNOPS_AMX_HW_INLINE void configure(const TileConfig& cfg) {
        __asm__ volatile("" ::"r"(&cfg) : "memory");
        _tile_loadconfig(&cfg);
    }
    ATTNOPS_AMX_HW_INLINE void release() { _tile_release(); }

    template <int I>
    ATTNOPS_AMX_HW_INLINE void zero(Tmm<I>) {
        __asm__ volatile("tilezero %%tmm%c0" ::"i"(I));
    }
    template <int I>
    ATTNOPS_AMX_HW_INLINE void load(Tmm<I>, const void* base, int64_t strideBytes) {
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(strideBytes), "i"(I) : "memory");
    }
    template <int I>
    ATTNOPS_AMX_HW_INLINE void store(Tmm<I>, void* base, int64_t strideBytes) {
        __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(strideBytes), "i"(I) : "memory");
    }
    template <DotKind kind, int C, int A, int B>
    ATTNOPS_AMX_HW_INLINE void dot(Tmm<C>, Tmm<A>, Tmm<B>) {
        static_assert(kind == DotKind::Bf16 || kHasFp16, "tdpfp16ps needs a compiler that knows AMX-FP16");
        if constexpr (kind == DotKind::Bf16)
            __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
        else
            __asm__ volatile("tdpfp16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
    }
};

}  // namespace attnops::cpu::amx
