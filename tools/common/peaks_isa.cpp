// Arithmetic-peak microbenchmarks: tight loops of independent multiply-adds in the instruction
// set each peak names, compiled through target attributes (the only ISA-specific code of the
// tools). Each returns the FLOPs it performed; peaks.cpp times them on every worker thread.
#include "peaks_isa.hpp"

#include <immintrin.h>

#include "cpu/amx/hw_tiles.hpp"

#include <cstring>

namespace attnops::tools::isa_loops {
namespace {
// (Not _mm512_reduce_add_ps: GCC 12 warns that its expansion reads an uninitialised register.)
__attribute__((target("avx512f"))) float sum16(__m512 v) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    float s = 0.0f;
    for (float x : lanes) s += x;
    return s;
}
}  // namespace

// 12 independent accumulator chains cover FMA latency x issue width on current x86 cores
// (4-cycle latency x 2 ports = 8 in flight), so the loop is throughput-bound.
__attribute__((target("avx512f"))) double fmaAvx512(int64_t iterations, float* sink) {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int64_t it = 0; it < iterations; ++it)
        for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
    *sink += sum16(s);
    return double(iterations) * 12 * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fmaAvx2(int64_t iterations, float* sink) {
    __m256 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int64_t it = 0; it < iterations; ++it)
        for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    for (float x : lanes) *sink += x;
    return double(iterations) * 12 * 8 * 2;
}

// vdpbf16ps: 16 lanes x 2 bf16 products each, accumulated in fp32 (64 FLOPs per instruction).
__attribute__((target("avx512f,avx512bf16"))) double dotBf16Avx512(int64_t iterations, float* sink) {
    __m512 acc[12];
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
    const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(3e-4f));
    for (int64_t it = 0; it < iterations; ++it)
        for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
    *sink += sum16(s);
    return double(iterations) * 12 * 16 * 2 * 2;
}

// AMX: four 16x16 fp32 accumulator tiles, each updated by a 16x32 bf16 A tile times a 32x16
// (VNNI-paired) B tile per iteration: 16 * 16 * 32 * 2 FLOPs per tdpbf16ps. The caller must hold
// the AMX permission (cpu::isa() asks Linux for it). Through the kernels' tile backend, which
// carries the GCC 12 ldtilecfg workaround.
__attribute__((target(ATTNOPS_AMX_TARGET_LIST))) double dotBf16Amx(int64_t iterations, float* sink) {
    using cpu::amx::tmm;
    constexpr auto bf16 = cpu::amx::DotKind::Bf16;
    static constexpr cpu::amx::TileConfig kConfig = cpu::amx::fullTiles();
    alignas(64) uint16_t operand[16 * 32];
    for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3a83;  // bf16 ~1e-3
    alignas(64) float out[16 * 16] = {};
    cpu::amx::HwTiles t;
    t.configure(kConfig);
    t.zero(tmm<0>);
    t.zero(tmm<1>);
    t.zero(tmm<2>);
    t.zero(tmm<3>);
    t.load(tmm<4>, operand, 64);
    t.load(tmm<5>, operand, 64);
    t.load(tmm<6>, operand, 64);
    t.load(tmm<7>, operand, 64);
    for (int64_t it = 0; it < iterations; ++it) {
        t.dot<bf16>(tmm<0>, tmm<4>, tmm<6>);
        t.dot<bf16>(tmm<1>, tmm<4>, tmm<7>);
        t.dot<bf16>(tmm<2>, tmm<5>, tmm<6>);
        t.dot<bf16>(tmm<3>, tmm<5>, tmm<7>);
    }
    t.store(tmm<0>, out, 64);
    t.release();
    *sink += out[0];
    return double(iterations) * 4 * 16 * 16 * 32 * 2;
}

}  // namespace attnops::tools::isa_loops
