// The build of the AMX kernels on the tile instructions (fa_amx.cpp, fia_amx_prefill.cpp): the
// attributes of every kernel function (ATTNOPS_AMX_FN: AVX-512 with AVX512-BF16, FMA and the AMX
// targets, 512-bit vectors for the auto-vectorised steps, which GCC and clang otherwise keep at
// 256 bits), lanes.hpp's fast steps as AVX-512 instructions (ATTNOPS_AMX_HW_LANES; the emulated
// build runs their portable forms), and whether this CPU can run them (hasAmx). Include first,
// before the kernel headers, which take these definitions.
#pragma once

#include "cpu/amx/hw_tiles.hpp"
#include "cpu/isa.hpp"

#if defined(__clang__)
#define ATTNOPS_AMX_FN                                                                                     \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c," ATTNOPS_AMX_TARGET_LIST), \
                   min_vector_width(512)))
#else
#define ATTNOPS_AMX_FN                                                                                  \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c,prefer-vector-width=512," \
                          ATTNOPS_AMX_TARGET_LIST)))
#endif
#define ATTNOPS_AMX_HW_LANES 1

namespace attnops::cpu::amx {

// AMX-TILE and AMX-BF16 with a sane palette, the tile state granted by Linux (cpu::isa()), and
// the vector instructions the kernels' fp32 steps use.
inline bool hasAmx() {
    const IsaFeatures& f = isa();
    return f.amxGranted && f.amxBf16 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512bf16 && f.avx2 && f.fma &&
           f.f16c;
}

}  // namespace attnops::cpu::amx
