// The AMX path without AMX hardware: the emulator's TDPBF16PS/TDPFP16PS arithmetic on
// hand-computed cases and its shape rules (death tests), the packing functions against their
// scalar definitions, the tile GEMM against an SDM-order scalar GEMM, the CPUID/palette decision,
// and the whole emulated kernels (forward and backward) against the double reference under the
// tolerance rule, with determinism over thread counts. Where Linux grants AMX, the hardware tiles
// and kernels are compared with the emulator bit for bit; elsewhere those tests skip with the
// reason.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/amx/emu_tiles.hpp"
#include "cpu/amx/hw_tiles.hpp"
#include "cpu/amx/pack.hpp"
#include "cpu/isa.hpp"
#include "child_process.hpp"
#include "ops/flash_attention_score/kernel.hpp"
#include "problem.hpp"
#include "problem_grad.hpp"
#include "amx_fused.hpp"
#include "forced_impl.hpp"
#include "threads_guard.hpp"

#define ATTNOPS_AMX_FN
#include "cpu/amx/tile_gemm.hpp"

namespace {

namespace amx = attnops::cpu::amx;
using amx::DotKind;
using amx::EmuTiles;
using amx::tmm;
using attnops::bf16ToFloat;
using attnops::floatToBf16;
using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::fixed;
using attnops::tools::kNoBand;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;

constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;

// ---------------------------------------------------------------- one tile product

// A 16 x 32 A tile, a 16 x 32 VNNI B tile and a 16 x 16 C tile in memory.
struct TileOperands {
    uint16_t a[16][32] = {};
    uint16_t b[16][32] = {};  // b[k][2n + j]: pair element j of (k, n)
    float c[16][16] = {};
};

uint16_t bf(float x) { return floatToBf16(x); }

float fromBits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

uint32_t toBits(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
}

// C += A . B on one configured tile set of the backend (tmm0 = C, tmm1 = A, tmm2 = B). The AMX
// target lets the hardware backend inline; the emulator's instantiation contains no AMX code.
template <DotKind kind, class Tiles>
__attribute__((target(ATTNOPS_AMX_TARGET_LIST))) void dotOnce(Tiles& t, TileOperands& x) {
    t.configure(amx::fullTiles());
    t.load(tmm<0>, x.c, 64);
    t.load(tmm<1>, x.a, 64);
    t.load(tmm<2>, x.b, 64);
    t.template dot<kind>(tmm<0>, tmm<1>, tmm<2>);
    t.store(tmm<0>, x.c, 64);
    t.release();
}

template <DotKind kind>
__attribute__((target(ATTNOPS_AMX_TARGET_LIST))) void dotOnceHardware(TileOperands& x) {
    if constexpr (kind == DotKind::Bf16 || amx::HwTiles::kHasFp16) {
        amx::HwTiles t;
        dotOnce<kind>(t, x);
    }
}

float emulatedC00(TileOperands x, DotKind kind = DotKind::Bf16) {
    EmuTiles t;
    if (kind == DotKind::Bf16)
        dotOnce<DotKind::Bf16>(t, x);
    else
        dotOnce<DotKind::Fp16>(t, x);
    return x.c[0][0];
}

TEST(AmxEmulatorDot, SmallIntegersAreExact) {
    TileOperands x;
    for (int m = 0; m < 16; ++m)
        for (int k = 0; k < 32; ++k) x.a[m][k] = bf(float((m + k) % 5 - 2));
    for (int k = 0; k < 16; ++k)
        for (int e = 0; e < 32; ++e) x.b[k][e] = bf(float((3 * k + e) % 7 - 3));
    TileOperands y = x;
    EmuTiles t;
    dotOnce<DotKind::Bf16>(t, y);
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) {
            float expected = 0;
            for (int k = 0; k < 32; ++k) expected += bf16ToFloat(x.a[m][k]) * bf16ToFloat(x.b[k / 2][2 * n + k % 2]);
            ASSERT_EQ(y.c[m][n], expected) << m << "," << n;
        }
}

TEST(AmxEmulatorDot, PairSumsAreAddedToCOnce) {
    // SDM order: even and odd sums from 0, then C += (even + odd) = 2^24 + 2 exactly. Adding the
    // products to C one at a time (the Intrinsics Guide's pseudocode) would round twice to 2^24.
    TileOperands x;
    x.c[0][0] = 16777216.0f;
    x.a[0][0] = x.a[0][1] = bf(1.0f);
    x.b[0][0] = x.b[0][1] = bf(1.0f);
    EXPECT_EQ(emulatedC00(x), 16777218.0f);
}

TEST(AmxEmulatorDot, EvenAndOddLanesAccumulateSeparatelyOverKAscending) {
    // even: 2^30 (k=0), -2^30 (k=1) -> 0; odd: 1 (k=0), 1 (k=1) -> 2. One chain over all products
    // in k order would give 2^30 + 1 -> 2^30 (rounded), + 1 -> 2^30, - 2^30 -> 0... and 1.
    TileOperands x;
    x.a[0][0] = bf(1073741824.0f);
    x.a[0][2] = bf(-1073741824.0f);
    x.a[0][1] = x.a[0][3] = bf(1.0f);
    x.b[0][0] = x.b[0][1] = x.b[1][0] = x.b[1][1] = bf(1.0f);
    EXPECT_EQ(emulatedC00(x), 2.0f);
    // Within one lane the fused chain rounds after every step: 2^30 + 1 - 2^30 = 0, not 1.
    TileOperands y;
    y.a[0][0] = bf(1073741824.0f);
    y.a[0][2] = bf(1.0f);
    y.a[0][4] = bf(-1073741824.0f);
    y.b[0][0] = y.b[1][0] = y.b[2][0] = bf(1.0f);
    EXPECT_EQ(emulatedC00(y), 0.0f);
}

TEST(AmxEmulatorDot, DenormalsAreFlushed) {
    // A denormal bf16 input is zero (DAZ): 2^-133 * 2^100 gives 0, not 2^-33.
    TileOperands x;
    x.a[0][0] = 0x0001;
    x.b[0][0] = bf(std::ldexp(1.0f, 100));
    EXPECT_EQ(emulatedC00(x), 0.0f);
    // A product below the normal range is flushed (FTZ): 2^-70 * 2^-70 = 2^-140 gives 0.
    TileOperands y;
    y.a[0][0] = bf(std::ldexp(1.0f, -70));
    y.b[0][0] = bf(std::ldexp(1.0f, -70));
    EXPECT_EQ(emulatedC00(y), 0.0f);
    // A denormal C is read as zero.
    TileOperands z;
    z.c[0][0] = fromBits(0x000116C2);
    EXPECT_EQ(toBits(emulatedC00(z)), 0u);
    // A result in the normal range is kept: 2^-60 * 2^-60 = 2^-120.
    TileOperands w;
    w.a[0][0] = bf(std::ldexp(1.0f, -60));
    w.b[0][0] = bf(std::ldexp(1.0f, -60));
    EXPECT_EQ(emulatedC00(w), std::ldexp(1.0f, -120));
}

TEST(AmxEmulatorDot, TiesRoundToEven) {
    // 1 + 2^-24 is halfway between 1 and 1 + 2^-23: to even, 1. (1 + 2^-23) + 2^-24 is halfway
    // between 1 + 2^-23 and 1 + 2^-22: to even, 1 + 2^-22.
    TileOperands x;
    x.c[0][0] = 1.0f;
    x.a[0][0] = bf(std::ldexp(1.0f, -12));
    x.b[0][0] = bf(std::ldexp(1.0f, -12));
    EXPECT_EQ(emulatedC00(x), 1.0f);
    x.c[0][0] = 1.0f + std::ldexp(1.0f, -23);
    EXPECT_EQ(emulatedC00(x), 1.0f + std::ldexp(1.0f, -22));
}

TEST(AmxEmulatorDot, Fp16DenormalInputsKeepTheirValue) {
    // TDPFP16PS widens fp16 exactly (an fp16 denormal is a normal fp32): 2^-24 * 2^10 = 2^-14.
    TileOperands x;
    x.a[0][0] = 0x0001;
    x.b[0][0] = 0x6400;  // 1024
    EXPECT_EQ(emulatedC00(x, DotKind::Fp16), std::ldexp(1.0f, -14));
}

TEST(AmxEmulatorDot, RowsAndColumnsPastTheShapeAreZeroed) {
    TileOperands x;
    for (auto& row : x.c)
        for (float& v : row) v = 7.0f;
    EmuTiles t;
    amx::TileConfig cfg = amx::fullTiles();
    cfg.rows[0] = cfg.rows[1] = 3;  // M = 3
    cfg.colsb[0] = cfg.colsb[2] = 8;  // N = 2
    t.configure(cfg);
    t.load(tmm<0>, x.c, 64);
    t.load(tmm<1>, x.a, 64);
    t.load(tmm<2>, x.b, 64);
    t.dot<DotKind::Bf16>(tmm<0>, tmm<1>, tmm<2>);
    cfg = amx::fullTiles();
    t.configure(cfg);  // a new config zeroes the tiles
    float out[16][16];
    t.store(tmm<0>, out, 64);
    for (const auto& row : out)
        for (float v : row) EXPECT_EQ(v, 0.0f);
    EXPECT_EQ(t.dots(), 1u);
    EXPECT_EQ(t.loads(), 3u);
}

// ---------------------------------------------------------------- shape rules

using AmxEmulatorDeathTest = ::testing::Test;

TEST(AmxEmulatorDeathTest, InvalidConfigsAbort) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto configure = [](const amx::TileConfig& cfg) {
        EmuTiles t;
        t.configure(cfg);
    };
    amx::TileConfig palette0 = amx::fullTiles();
    palette0.palette = 0;
    EXPECT_DEATH(configure(palette0), "only palette 1");
    amx::TileConfig rows = amx::fullTiles();
    rows.rows[3] = 17;
    EXPECT_DEATH(configure(rows), "more than 16 rows");
    amx::TileConfig cols = amx::fullTiles();
    cols.colsb[5] = 68;
    EXPECT_DEATH(configure(cols), "more than 64 bytes");
    amx::TileConfig half = amx::fullTiles();
    half.rows[2] = 0;
    EXPECT_DEATH(configure(half), "not both zero");
    amx::TileConfig ninth = amx::fullTiles();
    ninth.rows[8] = 16;
    ninth.colsb[8] = 64;
    EXPECT_DEATH(configure(ninth), "8 tiles");
    amx::TileConfig reserved = amx::fullTiles();
    reserved.reserved[3] = 1;
    EXPECT_DEATH(configure(reserved), "reserved");
}

TEST(AmxEmulatorDeathTest, TileUseOutsideTheRulesAborts) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    static TileOperands x;
    EXPECT_DEATH(
        {
            EmuTiles t;
            t.load(tmm<1>, x.a, 64);
        },
        "not configured");
    EXPECT_DEATH(
        {
            EmuTiles t;
            t.configure(amx::fullTiles());
            t.release();
            t.zero(tmm<0>);
        },
        "not configured");
    EXPECT_DEATH(
        {
            EmuTiles t;
            t.configure(amx::fullTiles());
            t.dot<DotKind::Bf16>(tmm<0>, tmm<0>, tmm<2>);
        },
        "distinct");
    EXPECT_DEATH(
        {
            EmuTiles t;
            amx::TileConfig cfg = amx::fullTiles();
            cfg.rows[2] = 8;  // B has 8 rows, A 16 dwords per row: K disagrees
            t.configure(cfg);
            t.dot<DotKind::Bf16>(tmm<0>, tmm<1>, tmm<2>);
        },
        "B rows differ");
    EXPECT_DEATH(
        {
            EmuTiles t;
            amx::TileConfig cfg = amx::fullTiles();
            cfg.rows[1] = 8;  // A has 8 rows, C 16: M disagrees
            t.configure(cfg);
            t.dot<DotKind::Bf16>(tmm<0>, tmm<1>, tmm<2>);
        },
        "A rows differ");
    EXPECT_DEATH(
        {
            EmuTiles t;
            amx::TileConfig cfg = amx::fullTiles();
            cfg.colsb[2] = 32;  // B 8 columns, C 16: N disagrees
            t.configure(cfg);
            t.dot<DotKind::Bf16>(tmm<0>, tmm<1>, tmm<2>);
        },
        "B colsb differs");
    EXPECT_DEATH(
        {
            EmuTiles t;
            amx::TileConfig cfg = amx::fullTiles();
            cfg.colsb[1] = 6;
            t.configure(cfg);
            t.load(tmm<1>, x.a, 64);
        },
        "multiple of 4");
}

// ---------------------------------------------------------------- packing

// A [2 batches][3 heads][rows][cols] bf16 tensor viewed with a column stride of 2, so that the
// gathering paths run as well as the contiguous ones.
struct StridedView {
    std::vector<uint16_t> data;
    attnops::fa::View4 view;
    StridedView(int64_t rows, int64_t cols, int64_t colStride) {
        data.resize(size_t(2 * 3 * rows * cols * colStride));
        for (size_t i = 0; i < data.size(); ++i) data[i] = uint16_t(i * 2654435761u >> 7);
        view.data = data.data();
        view.dtype = attnops::DType::BF16;
        view.stride[3] = colStride;
        view.stride[2] = cols * colStride;
        view.stride[1] = rows * view.stride[2];
        view.stride[0] = 3 * view.stride[1];
    }
    uint16_t at(int64_t row, int64_t col) const { return data[size_t(view.offset(1, 2, row, col))]; }
};

TEST(AmxPack, OperandsMatchTheirScalarDefinitions) {
    for (int64_t colStride : {1, 2})
        for (const auto& shape :
             {std::pair<int64_t, int64_t>{37, 45}, {16, 32}, {1, 1}, {64, 70}, {70, 64}, {96, 130}, {33, 17}}) {
            const int64_t rows = shape.first, cols = shape.second;
            StridedView x(rows + 3, cols, colStride);
            const int64_t row0 = 2;
            // A operand.
            const int64_t rowsPad = amx::roundUp(rows, 16), ld = amx::roundUp(cols, 32);
            std::vector<uint16_t> a(size_t(rowsPad * ld), 0xDEAD);
            amx::packRows(x.view, 1, 2, row0, rows, cols, rowsPad, ld, a.data());
            for (int64_t r = 0; r < rowsPad; ++r)
                for (int64_t c = 0; c < ld; ++c)
                    ASSERT_EQ(a[size_t(r * ld + c)], r < rows && c < cols ? x.at(row0 + r, c) : 0) << r << "," << c;
            // Transposed A operand: At[c][r] == X(r, c), cols padded to 16 rows, rows to 32 columns.
            const int64_t colsPad = amx::roundUp(cols, 16), ldt = amx::roundUp(rows, 32);
            std::vector<uint16_t> at(size_t(colsPad * ldt), 0xDEAD);
            amx::packRowsTransposed(x.view, 1, 2, row0, rows, cols, colsPad, ldt, at.data());
            for (int64_t c = 0; c < colsPad; ++c)
                for (int64_t r = 0; r < ldt; ++r)
                    ASSERT_EQ(at[size_t(c * ldt + r)], r < rows && c < cols ? x.at(row0 + r, c) : 0)
                        << "transposed " << c << "," << r;
            // B operands: Bt[r][2n + j] == X(32 kc + 2r + j, 16 nt + n), zero outside.
            auto checkB = [&](bool kAlongRows) {
                const int64_t kLen = kAlongRows ? rows : cols, nLen = kAlongRows ? cols : rows;
                const int64_t kChunks = (kLen + 31) / 32, nTiles = (nLen + 15) / 16;
                std::vector<uint16_t> bt(size_t(kChunks * nTiles * 512), 0xDEAD);
                if (kAlongRows)
                    amx::packRowPairs(x.view, 1, 2, row0, rows, cols, kChunks, nTiles, bt.data());
                else
                    amx::packColumnPairs(x.view, 1, 2, row0, rows, cols, kChunks, nTiles, bt.data());
                for (int64_t kc = 0; kc < kChunks; ++kc)
                    for (int64_t nt = 0; nt < nTiles; ++nt)
                        for (int64_t r = 0; r < 16; ++r)
                            for (int64_t n = 0; n < 16; ++n)
                                for (int64_t j = 0; j < 2; ++j) {
                                    const int64_t k = 32 * kc + 2 * r + j, col = 16 * nt + n;
                                    const bool inside = k < kLen && col < nLen;
                                    const uint16_t expected =
                                        !inside ? 0 : (kAlongRows ? x.at(row0 + k, col) : x.at(row0 + col, k));
                                    ASSERT_EQ(bt[size_t((kc * nTiles + nt) * 512 + r * 32 + 2 * n + j)], expected)
                                        << (kAlongRows ? "row pairs " : "column pairs ") << kc << "," << nt << "," << r
                                        << "," << n << "," << j;
                                }
            };
            checkB(true);
            checkB(false);
        }
}

TEST(AmxPack, FloatsRoundToNearestEvenAndTranspose) {
    const int64_t rows = 19, cols = 23, lds = 30;
    std::vector<float> src(size_t(rows * lds));
    for (size_t i = 0; i < src.size(); ++i) src[i] = std::ldexp(float(int64_t(i * 7919 % 2001) - 1000), -7) + 1e-5f;
    src[0] = fromBits(0x3F808000);  // a tie: rounds to even (0x3F80)
    src[1] = fromBits(0x3F818000);  // a tie: rounds to even (0x3F82)
    const int64_t ld = 32, pad = 32;
    std::vector<uint16_t> plain(size_t(pad * ld)), transposed(size_t(pad * ld)), half(size_t(pad * ld));
    amx::packFloats<DotKind::Bf16, false>(src.data(), lds, rows, cols, pad, ld, plain.data());
    amx::packFloats<DotKind::Bf16, true>(src.data(), lds, rows, cols, pad, ld, transposed.data());
    amx::packFloats<DotKind::Fp16, false>(src.data(), lds, rows, cols, pad, ld, half.data());
    EXPECT_EQ(plain[0], 0x3F80);
    EXPECT_EQ(plain[1], 0x3F82);
    for (int64_t r = 0; r < pad; ++r)
        for (int64_t c = 0; c < ld; ++c) {
            const bool inside = r < rows && c < cols;
            const float v = inside ? src[size_t(r * lds + c)] : 0.0f;
            ASSERT_EQ(plain[size_t(r * ld + c)], inside ? floatToBf16(v) : 0);
            ASSERT_EQ(half[size_t(r * ld + c)], inside ? attnops::floatToF16(v) : 0);
            const bool insideT = c < rows && r < cols;
            ASSERT_EQ(transposed[size_t(r * ld + c)], insideT ? floatToBf16(src[size_t(c * lds + r)]) : 0);
        }
}

// ---------------------------------------------------------------- the tile GEMM

// C (+)= A . B per the SDM, one TDP per (16-row, 16-column, 32-deep) block, k chunks ascending:
// the specification the kernels' tile loop must meet bit for bit.
float flush(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }

TEST(AmxGemm, TileLoopEqualsTheSdmOrderBitForBit) {
    attnops::tools::Rng rng(5);
    for (const auto& shape : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 2}, {1, 1, 1}, {2, 3, 3}, {4, 1, 1}})
        for (bool accumulate : {false, true}) {
            const auto [mTiles, nTiles, kChunks] = shape;
            const int64_t m = 16 * mTiles, n = 16 * nTiles, k = 32 * kChunks, lda = k + 32, ldc = n + 16;
            std::vector<uint16_t> a(size_t(m * lda));
            std::vector<uint16_t> b(size_t(kChunks * nTiles * 512));
            for (auto& e : a) e = bf(rng.symmetric(4.0) * (rng.uniform() < 0.1 ? 1e-38f : 1.0f));
            for (auto& e : b) e = bf(rng.symmetric(4.0));
            std::vector<float> c(size_t(m * ldc)), expected;
            for (auto& e : c) e = rng.symmetric(100.0);
            expected = c;
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    float acc = accumulate ? expected[size_t(i * ldc + j)] : 0.0f;
                    for (int64_t kc = 0; kc < kChunks; ++kc) {
                        float even = 0, odd = 0;
                        const uint16_t* bt = b.data() + (kc * nTiles + j / 16) * 512;
                        for (int64_t p = 0; p < 16; ++p) {
                            const float a0 = flush(bf16ToFloat(a[size_t(i * lda + 32 * kc + 2 * p)]));
                            const float a1 = flush(bf16ToFloat(a[size_t(i * lda + 32 * kc + 2 * p + 1)]));
                            even = flush(std::fma(a0, flush(bf16ToFloat(bt[p * 32 + 2 * (j % 16)])), even));
                            odd = flush(std::fma(a1, flush(bf16ToFloat(bt[p * 32 + 2 * (j % 16) + 1])), odd));
                        }
                        acc = flush(flush(acc) + flush(even + odd));
                    }
                    expected[size_t(i * ldc + j)] = acc;
                }
            amx::gemm<DotKind::Bf16, EmuTiles>(mTiles, nTiles, kChunks, a.data(), lda, b.data(), c.data(), ldc,
                                                      accumulate);
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j)
                    ASSERT_EQ(toBits(c[size_t(i * ldc + j)]), toBits(expected[size_t(i * ldc + j)]))
                        << mTiles << "x" << nTiles << "x" << kChunks << " (" << i << "," << j << ")";
        }
}

// ---------------------------------------------------------------- CPUID, permission

attnops::cpu::AmxCpuid graniteRapids() {
    attnops::cpu::AmxCpuid c;
    c.tile = c.bf16 = c.osEnabled = true;
    c.maxLeaf = 0x23;
    c.maxPalette = 1;
    c.palette1[0] = (1024u << 16) | 8192u;  // bytes per tile, total bytes
    c.palette1[1] = (8u << 16) | 64u;       // names, bytes per row
    c.palette1[2] = 16u;                    // rows
    c.tmul = (64u << 8) | 16u;              // maxN, maxK
    return c;
}

TEST(AmxIsa, PaletteAndTmulDecideUsability) {
    using attnops::cpu::amxUnusableReason;
    EXPECT_EQ(amxUnusableReason(graniteRapids()), "");
    auto c = graniteRapids();
    c.tile = false;
    EXPECT_EQ(amxUnusableReason(c), "no AMX: CPUID.7.0:EDX[24]=0");
    c = graniteRapids();
    c.osEnabled = false;
    EXPECT_NE(amxUnusableReason(c).find("XCR0"), std::string::npos);
    c = graniteRapids();
    c.maxPalette = 0;  // a VM that advertises AMX without a palette: every tile instruction would #UD
    c.palette1[0] = c.palette1[1] = c.palette1[2] = 0;
    EXPECT_NE(amxUnusableReason(c).find("palette 1"), std::string::npos);
    c = graniteRapids();
    c.maxLeaf = 0x1C;
    EXPECT_NE(amxUnusableReason(c).find("0x1D"), std::string::npos);
    c = graniteRapids();
    c.tmul = (32u << 8) | 16u;
    EXPECT_NE(amxUnusableReason(c).find("TMUL"), std::string::npos);
}

TEST(AmxIsa, ProbeAgreesWithItsStatus) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    EXPECT_EQ(f.amxGranted, f.amxStatus == "granted") << f.amxStatus;
    if (!f.amxTile) {
        EXPECT_EQ(f.amxStatus, "no AMX: CPUID.7.0:EDX[24]=0");
    }
    std::cout << "[   INFO   ] AMX: " << f.amxStatus << "\n";
}

// Run in a fresh child by the test below: an alternate signal stack too small for the AMX
// signal frame, installed before the first probe (as a sanitizer runtime or crash handler
// would), makes Linux refuse the permission. The probe must say so and calls must still run.
TEST(AmxIsaChild, DISABLED_SmallAltStackBeforeTheProbe) {
    constexpr size_t kSmallStack = 4096;  // MINSIGSTKSZ-sized; an AMX signal frame needs over 11 KiB
    static char small[kSmallStack];
    stack_t ss{};
    ss.ss_sp = small;
    ss.ss_size = sizeof small;
    ASSERT_EQ(sigaltstack(&ss, nullptr), 0);
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    std::cout << "[   INFO   ] AMX with a small alternate stack: " << f.amxStatus << "\n";
    if (!f.amxGranted) {
        EXPECT_NE(f.amxStatus.find("arch_prctl"), std::string::npos) << f.amxStatus;
    }
    FaInstance inst(fixed("BNSD", BF16, 1, 20, 20, 1, 1, 32));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
}

// Run in a fresh child with ATTNOPS_NO_AMX=1 by the test below.
TEST(AmxIsaChild, DISABLED_NoAmxVariable) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    EXPECT_FALSE(f.amxGranted);
    EXPECT_EQ(f.amxStatus, "disabled by ATTNOPS_NO_AMX") << f.amxStatus;
    FaInstance inst(fixed("BNSD", BF16, 1, 20, 20, 1, 1, 32));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnops::tools::lastImplementation().rfind("amx", 0), std::string::npos)
        << attnops::tools::lastImplementation();
    FaGrads g = attnops::tools::makeGrads(inst);
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnops::tools::lastImplementation().rfind("amx", 0), std::string::npos)
        << attnops::tools::lastImplementation();
}

TEST(AmxIsa, NoAmxVariableRunsTheOtherKernels) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!f.amxGranted) GTEST_SKIP() << "AMX is not usable here anyway: " << f.amxStatus;
    attnops::testing::expectChildPasses("AmxIsaChild.DISABLED_NoAmxVariable", {{"ATTNOPS_NO_AMX", "1"}});
}

TEST(AmxIsa, RefusedPermissionFallsBackWithoutSigill) {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!f.amxTile) GTEST_SKIP() << f.amxStatus;
    attnops::testing::expectChildPasses("AmxIsaChild.DISABLED_SmallAltStackBeforeTheProbe", {});
}

// ---------------------------------------------------------------- hardware vs emulator

void requireAmx() {
    const attnops::cpu::IsaFeatures& f = attnops::cpu::isa();
    if (!f.amxGranted) GTEST_SKIP() << f.amxStatus;
}

TEST(AmxHardware, DotMatchesTheEmulatorBitForBit) {
    requireAmx();
    if (IsSkipped()) return;
    attnops::tools::Rng rng(17);
    std::vector<TileOperands> probes(6);
    // Order probes: a large C with cancelling pairs in the even lanes only, in the odd lanes only.
    for (int m = 0; m < 16; ++m) {
        probes[0].c[m][0] = 16777216.0f;
        probes[0].a[m][0] = probes[0].a[m][1] = bf(1.0f);
        probes[1].a[m][0] = bf(1073741824.0f);
        probes[1].a[m][2] = bf(-1073741824.0f);
        probes[1].a[m][1] = probes[1].a[m][3] = bf(1.0f);
        probes[2].a[m][1] = bf(1073741824.0f);
        probes[2].a[m][3] = bf(-1073741824.0f);
        probes[2].a[m][0] = probes[2].a[m][2] = bf(1.0f);
    }
    for (int k = 0; k < 16; ++k)
        for (int e = 0; e < 32; ++e) probes[0].b[k][e] = probes[1].b[k][e] = probes[2].b[k][e] = bf(1.0f);
    // Denormal inputs, denormal C, products that fall below the normal range, ties.
    for (int m = 0; m < 16; ++m)
        for (int i = 0; i < 32; ++i) {
            const bool denormal = rng.next() % 3 == 0;
            probes[3].a[m][i] = denormal ? uint16_t(rng.next() % 0x80) : bf(std::ldexp(rng.symmetric(1.0), -60));
            probes[3].b[m][i] = bf(std::ldexp(rng.symmetric(1.0), -60));
            probes[4].a[m][i] = bf(std::ldexp(1.0f, -12 - int(rng.next() % 3)));
            probes[4].b[m][i] = bf(std::ldexp(1.0f, -12));
            probes[5].a[m][i] = bf(rng.symmetric(1.0));
            probes[5].b[m][i] = bf(rng.symmetric(1.0));
        }
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 16; ++n) {
            probes[3].c[m][n] = fromBits(uint32_t(rng.next() % 0x7FFFFF));
            probes[4].c[m][n] = 1.0f + std::ldexp(float(rng.next() % 2), -23);
            probes[5].c[m][n] = rng.symmetric(1e3);
        }
    for (size_t i = 0; i < probes.size(); ++i) {
        TileOperands hw = probes[i], emu = probes[i];
        dotOnceHardware<DotKind::Bf16>(hw);
        EmuTiles t;
        dotOnce<DotKind::Bf16>(t, emu);
        EXPECT_EQ(std::memcmp(hw.c, emu.c, sizeof hw.c), 0) << "probe " << i;
    }
}

// ---------------------------------------------------------------- the emulated kernels

using attnops::testsupport::ForcedImpl;

struct Case {
    std::string name;
    FaProblem problem;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << c.problem.describe() << ")"; }

FaProblem withDropout(FaProblem p, double keep) {
    p.keepProb = keep;
    p.seed = 77;
    p.offset = 5;
    return p;
}

FaProblem withSink(FaProblem p) {
    p.sink = true;
    return p;
}

// Small shapes on and around the tile edges (16 rows, 32-element k chunks, 64-row blocks), every
// mask family, pse, dropout, sinks, GQA, varlen, fp16 (the emulator models AMX-FP16).
std::vector<Case> emulatedCases() {
    std::vector<Case> cases;
    cases.push_back({"BNSD_bf16", fixed("BNSD", BF16, 2, 65, 70, 2, 1, 64)});
    cases.push_back({"BSH_bf16_causal", withMode(fixed("BSH", BF16, 1, 70, 65, 4, 2, 32), 3)});
    cases.push_back({"SBH_f16", fixed("SBH", F16, 1, 33, 40, 2, 2, 48, 20)});
    cases.push_back({"TND_bf16_causal", withMode(tnd(BF16, {0, 17, 1, 66}, {3, 31, 1, 64}, 2, 1, 32), 2)});
    for (int64_t d : {1, 15, 33, 65})
        cases.push_back({"D" + std::to_string(d) + "_bf16", fixed("BSND", BF16, 1, 17, 33, 2, 1, d)});
    cases.push_back({"Dv_128_16_bf16", fixed("BNSD", BF16, 1, 20, 129, 2, 1, 128, 16)});
    for (int64_t s : {1, 15, 16, 31, 129})
        cases.push_back({"S" + std::to_string(s) + "_bf16", withMode(fixed("BNSD", BF16, 1, s, s, 1, 1, 32), 2)});
    cases.push_back({"m0_band_bf16", withMode(fixed("BNSD", BF16, 1, 70, 80, 2, 1, 32), 0, 10, 5)});
    cases.push_back({"m4_band_f16", withMode(fixed("BNSD", F16, 1, 70, 60, 2, 1, 32), 4, 20, 3)});
    {
        FaProblem p = withMode(fixed("BNSD", BF16, 1, 40, 50, 2, 1, 32), 1);
        p.maskKind = "random";
        cases.push_back({"m1_random_mask_bf16", p});
    }
    cases.push_back({"m6_prefix_bf16", withMode(fixed("BNSD", BF16, 2, 40, 50, 2, 1, 32), 6)});
    cases.push_back({"m8_tnd_bf16", withMode(tnd(BF16, {0, 20, 30}, {0, 25, 33}, 2, 1, 32), 8, 8, 1)});
    cases.push_back({"pse1_bf16", withPse(fixed("BNSD", BF16, 1, 33, 40, 2, 1, 32), 1)});
    cases.push_back({"pse2_slopes_f16", withPse(withMode(fixed("BNSD", F16, 1, 33, 40, 2, 1, 32), 3), 2)});
    cases.push_back({"dropout_bf16", withDropout(fixed("BNSD", BF16, 1, 40, 70, 2, 1, 32), 0.8)});
    cases.push_back({"sink_gqa_bf16", withSink(withMode(fixed("BSND", BF16, 1, 40, 50, 4, 2, 32), 3))});
    // A group of 10 query heads: the forward shares each packed key block among 8, then 2.
    cases.push_back({"group10_bf16", withMode(fixed("BNSD", BF16, 1, 20, 40, 20, 2, 16), 0, 10, 2)});
    // 64 kv heads: enough units for the largest blocks of the transposed kernels (forward 256
    // query rows with a band; backward query units of up to 512 rows, here one of 272 rows in 9
    // strips, and 256-key key units), with partial tails.
    cases.push_back({"wide_rows_bf16_causal", withMode(fixed("BNSD", BF16, 1, 272, 280, 64, 64, 16), 2)});
    cases.push_back({"wide_keys_bf16", fixed("BNSD", BF16, 1, 40, 300, 64, 64, 16)});
    // Backward key units of 1024 keys and a partial one of 76, in key strips of 32, the causal
    // band skipping the strips past a query block's last key.
    cases.push_back({"key_units_1024_bf16_causal", withMode(fixed("BNSD", BF16, 1, 40, 1100, 64, 64, 16), 3)});
    // The transposed forward packs keys by superblocks of 512: three of them, the last partial,
    // with and without a band that starts and ends inside them.
    cases.push_back({"superblocks_bf16", fixed("BNSD", BF16, 1, 40, 1100, 2, 1, 32)});
    cases.push_back({"superblocks_band_bf16", withMode(fixed("BNSD", BF16, 1, 300, 1100, 2, 1, 32), 4, 500, 100)});
    // The fused backward cuts a kv head with few (sequence, kv head) pairs into chunks of query
    // rows (at least 2048 over the group's heads) whose partial dK, dV are added by the
    // reduction: groups of 8, 3 chunks of 256 + 256 + 188 rows (a partial 128-row block), key
    // blocks of 128 with a partial one, causal, with sinks; and varlen sequences (an empty one,
    // one of a single row) with a band (AmxEmulated.FusedChunkCasesAreCut checks the cuts).
    cases.push_back({"chunks_bf16_causal_sink", withSink(withMode(fixed("BNSD", BF16, 1, 700, 650, 8, 1, 16), 3))});
    cases.push_back({"chunks_tnd_gqa_bf16_band",
                     withMode(tnd(BF16, {0, 600, 1, 40}, {3, 610, 1, 40}, 8, 1, 16), 4, 300, 20)});
    return cases;
}

std::string caseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class AmxEmulatedForward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxEmulatedForward, MatchesReference) {
    FaInstance inst(GetParam().problem);
    {
        ForcedImpl force("amx-emulated");
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        EXPECT_EQ(attnops::tools::lastImplementation(), "amx-emulated");
    }
    const auto rc = attnops::tools::checkForwardRows(inst, -1);
    EXPECT_TRUE(rc.passed) << inst.problem.describe() << ": err " << rc.maxAbsError << " tol " << rc.tolerance
                           << " naive " << rc.maxAbsNaiveError << " " << rc.firstFailure;
}

INSTANTIATE_TEST_SUITE_P(Cases, AmxEmulatedForward, ::testing::ValuesIn(emulatedCases()), caseName);

class AmxEmulatedBackward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxEmulatedBackward, MatchesReference) {
    FaInstance inst(GetParam().problem);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    FaGrads g = attnops::tools::makeGrads(inst);
    {
        ForcedImpl force("amx-emulated");
        ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    const attnops::tools::GradCheck rc = attnops::tools::checkBackward(inst, g);
    std::string detail;
    for (int t = 0; t < 4; ++t)
        detail += " err " + std::to_string(rc.maxAbsError[t]) + " tol " + std::to_string(rc.tolerance[t]) + ";";
    EXPECT_TRUE(rc.passed) << inst.problem.describe() << ":" << detail << " " << rc.failure;
}

INSTANTIATE_TEST_SUITE_P(Cases, AmxEmulatedBackward, ::testing::ValuesIn(emulatedCases()), caseName);

// The fused backward on the emulator: every case it takes (no pse, explicit mask or dropout)
// passes; it declines the others.
class AmxEmulatedFusedBackward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxEmulatedFusedBackward, MatchesReference) {
    FaInstance inst(GetParam().problem);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    FaGrads g = attnops::tools::makeGrads(inst);
    attnopsStatus st;
    {
        ForcedImpl force("amx-emulated-fused");
        st = attnops::tools::runBackward(inst, g);
    }
    if (attnops::testsupport::amxFusedDeclines("amx-emulated-fused", inst)) {
        EXPECT_EQ(st, ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION) << attnopsGetLastErrorMessage();
        return;
    }
    ASSERT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(attnops::tools::lastImplementation(), "amx-emulated-fused");
    const attnops::tools::GradCheck rc = attnops::tools::checkBackward(inst, g);
    std::string detail;
    for (int t = 0; t < 4; ++t)
        detail += " err " + std::to_string(rc.maxAbsError[t]) + " tol " + std::to_string(rc.tolerance[t]) + ";";
    EXPECT_TRUE(rc.passed) << inst.problem.describe() << ":" << detail << " " << rc.failure;
}

INSTANTIATE_TEST_SUITE_P(Cases, AmxEmulatedFusedBackward, ::testing::ValuesIn(emulatedCases()), caseName);

TEST(AmxEmulated, NonFiniteInputsTakeTheRowSteps) {
    // Inf in a value row that a causal mask hides from early rows, and in a key and a query row:
    // masked zeros must never multiply them.
    FaProblem p = withMode(fixed("BNSD", BF16, 1, 40, 40, 1, 1, 32), 2);
    FaInstance inst(p);
    inst.value.set(30 * 32 + 3, std::numeric_limits<float>::infinity());
    inst.key.set(35 * 32 + 1, std::numeric_limits<float>::infinity());
    inst.query.set(5 * 32 + 2, -std::numeric_limits<float>::infinity());
    ForcedImpl force("amx-emulated");
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const auto rc = attnops::tools::checkForwardRows(inst, -1);
    EXPECT_TRUE(rc.passed) << rc.firstFailure << (rc.nanMismatch ? " NaN mismatch" : "");
    FaGrads g = attnops::tools::makeGrads(inst);
    ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const attnops::tools::GradCheck grc = attnops::tools::checkBackward(inst, g);
    EXPECT_TRUE(grc.passed) << grc.failure;
}

// A NaN key element makes every score of its key NaN, and every output row NaN. The fast maxima
// test the scores of even and odd keys in separate sums (stripMaximaFast): a NaN at either
// parity, at the start, the middle or the end of a block, must send the block to the fp32 steps.
void expectNaNKeysGiveNaNRows(const char* impl) {
    for (int64_t key : {0, 6, 7, 38, 39}) {
        FaInstance inst(fixed("BNSD", BF16, 1, 40, 40, 1, 1, 32));
        inst.key.set(key * 32 + 1, std::numeric_limits<float>::quiet_NaN());
        ForcedImpl force(impl);
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        const auto rc = attnops::tools::checkForwardRows(inst, -1);
        EXPECT_TRUE(rc.passed) << impl << " key " << key << ": " << rc.firstFailure
                               << (rc.nanMismatch ? " NaN mismatch" : "");
    }
}

TEST(AmxEmulated, NaNKeysOfEitherParityGiveNaNRows) { expectNaNKeysGiveNaNRows("amx-emulated"); }

TEST(AmxHardware, NaNKeysOfEitherParityGiveNaNRows) {
    requireAmx();
    if (IsSkipped()) return;
    expectNaNKeysGiveNaNRows("amx");
}

// Whether the fused AMX backward's plan cuts inst's longest sequence into chunks (its rows per
// chunk, as the plan takes them, below the longest query length).
bool fusedBackwardCuts(const FaInstance& inst) {
    FaGrads g = attnops::tools::makeGrads(inst);
    const attnops::fa::BackwardParams bp = attnops::tools::backwardParams(inst, g);
    const attnops::fa::BackwardKernel& k = attnops::fa::backwardKernelAmxEmulatedFused();
    const int64_t rows = attnops::fa::fusedChunkRowsOf(bp.fwd, k, k.tile(bp, attnops::platform()));
    return rows > 0 && rows < bp.fwd.seq.maxQLen;
}

TEST(AmxEmulated, FusedChunkCasesAreCut) {
    for (const Case& c : emulatedCases()) {
        if (c.name.rfind("chunks_", 0) != 0) continue;
        EXPECT_TRUE(fusedBackwardCuts(FaInstance(c.problem))) << c.name;
    }
}

// The forward's query rows per unit (fa_amx_forward.hpp): 512 without a band or where the
// sequences are 2,048 rows long on average, 256 under a band otherwise, halved while the problem
// has fewer than 64 units; from the shape alone.
TEST(AmxEmulated, ForwardUnitRowsFollowTheBandAndTheLengths) {
    const auto unitRows = [](const FaProblem& problem) {
        const FaInstance inst(problem);
        const attnops::tools::FaGrads g = attnops::tools::makeGrads(inst);
        const attnops::fa::ForwardParams p = attnops::tools::backwardParams(inst, g).fwd;
        return attnops::fa::forwardKernelAmxEmulated().tile(p, attnops::platform()).queryRows;
    };
    EXPECT_EQ(unitRows(fixed("BNSD", BF16, 1, 4096, 4096, 8, 8, 16)), 512);                 // no band: 64 units
    EXPECT_EQ(unitRows(withMode(fixed("BNSD", BF16, 1, 4096, 4096, 8, 8, 16), 3)), 512);    // causal, long
    EXPECT_EQ(unitRows(withMode(fixed("BNSD", BF16, 1, 4096, 4096, 8, 8, 16), 4, 700, 30)), 512);
    EXPECT_EQ(unitRows(withMode(fixed("BNSD", BF16, 1, 2040, 2040, 32, 32, 16), 3)), 256);  // causal, shorter
    EXPECT_EQ(unitRows(fixed("BNSD", BF16, 1, 2040, 2040, 32, 32, 16)), 512);
    EXPECT_EQ(unitRows(withMode(fixed("BNSD", BF16, 1, 4096, 4096, 2, 2, 16), 3)), 128);    // 2 x 32 units
}

TEST(AmxEmulated, FusedBackwardTakesTheFp32StepsForNonFiniteOperands) {
    // The fused backward decides per query block (Q and dO finite: the dK, dV GEMMs) and per key
    // block (K finite: the dQ GEMM): an infinite key only, an infinite query only, and both, in
    // causal problems whose masked pairs would multiply them; 200 rows and keys make two query
    // blocks and two key blocks, so finite blocks run beside the fp32 ones.
    struct Variant {
        const char* name;
        int64_t keyRow, queryRow;  // -1: none
    };
    for (const Variant v : {Variant{"key", 150, -1}, Variant{"query", -1, 20}, Variant{"both", 150, 20}}) {
        FaInstance inst(withMode(fixed("BNSD", BF16, 1, 200, 200, 1, 1, 32), 2));
        if (v.keyRow >= 0) inst.key.set(v.keyRow * 32 + 1, std::numeric_limits<float>::infinity());
        if (v.queryRow >= 0) inst.query.set(v.queryRow * 32 + 2, -std::numeric_limits<float>::infinity());
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        FaGrads g = attnops::tools::makeGrads(inst);
        {
            ForcedImpl force("amx-emulated-fused");
            ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        const attnops::tools::GradCheck grc = attnops::tools::checkBackward(inst, g);
        EXPECT_TRUE(grc.passed) << v.name << ": " << grc.failure;
    }
}

TEST(AmxEmulated, NonFiniteValuesInALaterSuperblockTakeTheRowSteps) {
    // 1100 keys: the last key block of the transposed forward's second superblock of 512 (keys
    // 896-1023) holds the infinite value, which the band (mode 4, no explicit mask: row i keeps
    // keys up to i + 900) hides from the first 50 rows, while the first strip's last k chunk
    // (keys 928-959) holds it.
    FaProblem p = withMode(fixed("BNSD", BF16, 1, 64, 1100, 1, 1, 32), 4, 2000, -136);
    FaInstance inst(p);
    inst.value.set(950 * 32 + 3, std::numeric_limits<float>::infinity());
    ForcedImpl force("amx-emulated");
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    const auto rc = attnops::tools::checkForwardRows(inst, -1);
    EXPECT_TRUE(rc.passed) << rc.firstFailure << (rc.nanMismatch ? " NaN mismatch" : "");
}

TEST(AmxEmulated, ANaNRowMaximumReachesTheGradients) {
    // The backward's gradient steps take exp's fast form only where every kept lane's argument is
    // at most 88 and not NaN (fastExpApplies); a saved maximum of NaN must give NaN gradients in
    // its row, as the general form does, and leave the others finite. On the hardware the fast
    // form (VSCALEFPS) would give 0 there; the emulated build runs its portable form, which keeps
    // the NaN, so this checks the choice where the CPU has AMX.
    FaProblem p = fixed("BNSD", BF16, 1, 40, 50, 1, 1, 32);
    FaInstance inst(p);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    constexpr int64_t kRow = 7;
    for (int64_t lane = 0; lane < 8; ++lane) inst.softmaxMax.set(kRow * 8 + lane, std::numeric_limits<float>::quiet_NaN());
    std::vector<std::string> impls = {"amx-emulated", "amx-emulated-fused"};
    if (attnops::cpu::isa().amxGranted) impls.insert(impls.end(), {"amx", "amx-fused"});
    for (const std::string& impl : impls) {
        FaGrads g = attnops::tools::makeGrads(inst);
        {
            ForcedImpl force(impl.c_str());
            ASSERT_EQ(attnops::tools::runBackward(inst, g), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            ASSERT_EQ(attnops::tools::lastImplementation(), impl);
        }
        for (int64_t row = 0; row < 40; ++row)
            for (int64_t c = 0; c < 32; ++c)
                EXPECT_EQ(std::isnan(g.dq.get(row * 32 + c)), row == kRow) << impl << ": dq row " << row << " column " << c;
    }
}

TEST(AmxEmulated, NeverChosenByDefaultAndRejectsFloat32) {
    FaInstance inst(fixed("BNSD", BF16, 1, 20, 20, 1, 1, 32));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS);
    EXPECT_NE(attnops::tools::lastImplementation(), "amx-emulated");
    ForcedImpl force("amx-emulated");
    FaInstance f32(fixed("BNSD", ATTNOPS_FLOAT32, 1, 20, 20, 1, 1, 32));
    EXPECT_EQ(f32.runForward(), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
}

TEST(AmxEmulated, ThreadCountsGiveTheSameBits) {
    attnops::testsupport::ThreadsGuard guard;
    const FaProblem p = withSink(withDropout(withMode(tnd(BF16, {0, 70, 1, 33}, {5, 80, 1, 20}, 4, 2, 32), 3), 0.9));
    ASSERT_EQ(attnopsSetDeviceThreads(0, 2), ATTNOPS_SUCCESS);
    FaInstance base(p);
    ASSERT_EQ(base.runForward(), ATTNOPS_SUCCESS);
    ForcedImpl force("amx-emulated");
    std::vector<std::unique_ptr<FaInstance>> runs;
    std::vector<FaGrads> grads;
    for (int32_t threads : {1, 2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        runs.push_back(std::make_unique<FaInstance>(p));
        ASSERT_EQ(runs.back()->runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        grads.push_back(attnops::tools::makeGrads(base));
        ASSERT_EQ(attnops::tools::runBackward(base, grads.back()), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    for (size_t r = 1; r < runs.size(); ++r) {
        EXPECT_EQ(runs[0]->attentionOut.bytes(), runs[r]->attentionOut.bytes()) << "run " << r;
        EXPECT_EQ(runs[0]->softmaxMax.bytes(), runs[r]->softmaxMax.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dq.bytes(), grads[r].dq.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dk.bytes(), grads[r].dk.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dv.bytes(), grads[r].dv.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dsink.bytes(), grads[r].dsink.bytes()) << "run " << r;
    }
}

TEST(AmxEmulated, FusedBackwardThreadCountsGiveTheSameBits) {
    // GQA over varlen sequences with sinks, causal: 4 (sequence, kv head) pairs, so the 700-row
    // sequence is cut into chunks whose partials the reduction adds.
    attnops::testsupport::ThreadsGuard guard;
    const FaProblem p = withSink(withMode(tnd(BF16, {0, 700, 1, 33}, {5, 680, 1, 20}, 8, 1, 16), 3));
    FaInstance inst(p);
    ASSERT_TRUE(fusedBackwardCuts(inst)) << "not cut into chunks";
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS);
    ForcedImpl force("amx-emulated-fused");
    std::vector<FaGrads> grads;
    for (int32_t threads : {1, 2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        grads.push_back(attnops::tools::makeGrads(inst));
        ASSERT_EQ(attnops::tools::runBackward(inst, grads.back()), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    const attnops::tools::GradCheck rc = attnops::tools::checkBackward(inst, grads[0]);
    EXPECT_TRUE(rc.passed) << rc.failure;
    for (size_t r = 1; r < grads.size(); ++r) {
        EXPECT_EQ(grads[0].dq.bytes(), grads[r].dq.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dk.bytes(), grads[r].dk.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dv.bytes(), grads[r].dv.bytes()) << "run " << r;
        EXPECT_EQ(grads[0].dsink.bytes(), grads[r].dsink.bytes()) << "run " << r;
    }
}

TEST(AmxHardware, KernelsMatchTheEmulatedKernelsBitForBit) {
    requireAmx();
    if (IsSkipped()) return;
    for (const Case& c : emulatedCases()) {
        if (c.problem.dtype == F16 && !(amx::HwTiles::kHasFp16 && attnops::cpu::isa().amxFp16)) continue;
        FaInstance hw(c.problem), emu(c.problem);
        {
            ForcedImpl force("amx");
            ASSERT_EQ(hw.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        {
            ForcedImpl force("amx-emulated");
            ASSERT_EQ(emu.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        EXPECT_EQ(hw.attentionOut.bytes(), emu.attentionOut.bytes()) << c.name;
        FaGrads gh = attnops::tools::makeGrads(hw), ge = attnops::tools::makeGrads(hw);
        {
            ForcedImpl force("amx");
            ASSERT_EQ(attnops::tools::runBackward(hw, gh), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        {
            ForcedImpl force("amx-emulated");
            ASSERT_EQ(attnops::tools::runBackward(hw, ge), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        EXPECT_EQ(gh.dq.bytes(), ge.dq.bytes()) << c.name;
        EXPECT_EQ(gh.dk.bytes(), ge.dk.bytes()) << c.name;
        EXPECT_EQ(gh.dv.bytes(), ge.dv.bytes()) << c.name;
        if (attnops::testsupport::amxFusedDeclines("amx-fused", hw)) continue;
        FaGrads fh = attnops::tools::makeGrads(hw), fe = attnops::tools::makeGrads(hw);
        {
            ForcedImpl force("amx-fused");
            ASSERT_EQ(attnops::tools::runBackward(hw, fh), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        {
            ForcedImpl force("amx-emulated-fused");
            ASSERT_EQ(attnops::tools::runBackward(hw, fe), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        }
        EXPECT_EQ(fh.dq.bytes(), fe.dq.bytes()) << c.name << " (fused)";
        EXPECT_EQ(fh.dk.bytes(), fe.dk.bytes()) << c.name << " (fused)";
        EXPECT_EQ(fh.dv.bytes(), fe.dv.bytes()) << c.name << " (fused)";
        EXPECT_EQ(fh.dsink.bytes(), fe.dsink.bytes()) << c.name << " (fused)";
    }
}

}  // namespace
