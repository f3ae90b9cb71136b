// The hardware build of cpu/amx/lanes.hpp (AVX-512 with AVX512-BF16, the fast steps as their
// instructions), for amx_lanes_test.cpp, which compares it with the portable build of its own
// translation unit. Call only where the CPU has AVX512-BF16.
#include <cstdint>
#include <cstring>

#include "cpu/amx/hw_build.hpp"
#include "cpu/amx/lanes.hpp"

namespace attnops::testsupport {

ATTNOPS_AMX_FN void amxLanesHwBf16RowsFlushed(const float* lo, const float* hi, uint16_t* out) {
    const cpu::amx::H32x rows = cpu::amx::bf16RowsFlushed(cpu::amx::loadLanes(lo), cpu::amx::loadLanes(hi));
    std::memcpy(out, &rows, sizeof rows);
}

}  // namespace attnops::testsupport
