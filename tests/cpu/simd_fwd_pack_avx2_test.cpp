// The forward kernel's AVX2 packing and score GEMM (cpu/simd/microkernels.hpp) against scalar
// definitions, bit for bit: loadRowsStrips (fp32, bf16, fp16; unit and strided columns; widths
// that are not a multiple of a vector or of a strip; zero padding), loadRowsFast, gemmScores (overwriting)
// and gemmStrips (accumulating) (every element a chain of FMAs over k ascending, so equal to a scalar fmaf chain)
// over shapes at and around the 4 x 24 register tile. Skipped on CPUs without AVX2, FMA and F16C.
#include "cpu/avx2/simd_avx2.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/isa.hpp"
#include "avx2_tests.hpp"

namespace {

using attnops::floatToBits;

using attnops::DType;
using attnops::cpu::Avx2;
namespace simd = attnops::cpu::simd;

ATTNOPS_AVX2_FN void packStrips(const attnops::fa::View4& v, int64_t row0, int64_t rows, int64_t cols, float* dst) {
    simd::loadRowsStrips<Avx2>(v, 0, 1, row0, rows, cols, dst);
}
ATTNOPS_AVX2_FN void packFast(const attnops::fa::View4& v, int64_t row0, int64_t rows, int64_t cols, float* dst) {
    simd::loadRowsFast<Avx2>(v, 0, 1, row0, rows, cols, dst);
}
ATTNOPS_AVX2_FN void scores(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                            float* c, int64_t ldc, bool transA) {
    if (transA)
        simd::gemmScores<Avx2, true>(m, n, k, a, lda, b, ldb, c, ldc);
    else
        simd::gemmScores<Avx2, false>(m, n, k, a, lda, b, ldb, c, ldc);
}
ATTNOPS_AVX2_FN void strips(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* bs, float* c,
                            int64_t ldc) {
    simd::gemmStrips<Avx2, true>(m, n, k, a, lda, bs, c, ldc, true);
}

// A [1, 2, rows, cols] tensor of dtype dt (head 1 is packed; head 0 is other data), with column
// stride cs; returns the view and fills `logical` with the fp32 value of each element of head 1.
struct Tensor {
    std::vector<uint16_t> half;
    std::vector<float> f32;
    attnops::fa::View4 view;
};

Tensor makeTensor(DType dt, int64_t rows, int64_t cols, int64_t cs, std::mt19937& rng, std::vector<float>& logical) {
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    const int64_t rowStride = cols * cs + 3, headStride = rows * rowStride;
    Tensor t;
    const int64_t n = 2 * headStride;
    if (dt == DType::F32)
        t.f32.resize(size_t(n));
    else
        t.half.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
        const float x = u(rng);
        if (dt == DType::F32)
            t.f32[size_t(i)] = x;
        else if (dt == DType::BF16)
            t.half[size_t(i)] = uint16_t(floatToBits(x) >> 16);
        else
            t.half[size_t(i)] = attnops::floatToF16(x);
    }
    t.view.data = dt == DType::F32 ? static_cast<const void*>(t.f32.data()) : t.half.data();
    t.view.dtype = dt;
    t.view.stride[0] = n;
    t.view.stride[1] = headStride;
    t.view.stride[2] = rowStride;
    t.view.stride[3] = cs;
    logical.assign(size_t(rows * cols), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) logical[size_t(r * cols + c)] = t.view.load(0, 1, r, c);
    return t;
}

TEST(FwdPackAvx2, StripsAndRowsMatchScalarBitwise) {
    SKIP_WITHOUT_AVX2();
    constexpr int64_t W = simd::stripWidth<Avx2>();
    std::mt19937 rng(7);
    for (DType dt : {DType::F32, DType::BF16, DType::F16})
        for (int64_t cs : {1, 2})
            for (int64_t cols : {1, 7, 8, 16, 23, 24, 25, 64, 100, 128})
                for (int64_t rows : {1, 5, 17}) {
                    std::vector<float> logical;
                    const int64_t total = rows + 2;
                    Tensor t = makeTensor(dt, total, cols, cs, rng, logical);
                    const int64_t row0 = 2, strips = (cols + W - 1) / W;
                    std::vector<float> packed(size_t(strips * W * rows), -1.0f), rowsOut(size_t(rows * cols), -1.0f);
                    packStrips(t.view, row0, rows, cols, packed.data());
                    packFast(t.view, row0, rows, cols, rowsOut.data());
                    for (int64_t r = 0; r < rows; ++r)
                        for (int64_t c = 0; c < strips * W; ++c) {
                            const float want = c < cols ? logical[size_t((row0 + r) * cols + c)] : 0.0f;
                            const float got = packed[size_t((c / W) * rows * W + r * W + c % W)];
                            ASSERT_EQ(floatToBits(got), floatToBits(want)) << "strips dtype " << int(dt) << " cs " << cs
                                                                 << " cols " << cols << " r " << r << " c " << c;
                            if (c < cols) {
                                ASSERT_EQ(floatToBits(rowsOut[size_t(r * cols + c)]), floatToBits(want))
                                    << "rows dtype " << int(dt) << " cs " << cs << " cols " << cols;
                            }
                        }
                }
}

TEST(FwdPackAvx2, ScoreGemmMatchesScalarFmaChainBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (bool transA : {false, true})
        for (bool acc : {false})
            for (int64_t m : {1, 3, 4, 5, 9, 128, 130})
                for (int64_t n : {1, 8, 16, 23, 24, 25, 48, 120})
                    for (int64_t k : {1, 7, 64}) {
                        const int64_t lda = (transA ? m : k) + 1, ldb = n + 3, ldc = n + 5;
                        std::vector<float> a(size_t((transA ? k : m) * lda)), b(size_t(k * ldb)), c(size_t(m * ldc));
                        for (float& x : a) x = u(rng);
                        for (float& x : b) x = u(rng);
                        for (float& x : c) x = u(rng);
                        std::vector<float> want = c;
                        for (int64_t i = 0; i < m; ++i)
                            for (int64_t j = 0; j < n; ++j) {
                                float s = acc ? c[size_t(i * ldc + j)] : 0.0f;
                                for (int64_t kk = 0; kk < k; ++kk)
                                    s = std::fma(transA ? a[size_t(kk * lda + i)] : a[size_t(i * lda + kk)],
                                                 b[size_t(kk * ldb + j)], s);
                                want[size_t(i * ldc + j)] = s;
                            }
                        scores(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, transA);
                        for (int64_t i = 0; i < m; ++i)
                            for (int64_t j = 0; j < ldc; ++j)  // columns past n untouched
                                ASSERT_EQ(floatToBits(c[size_t(i * ldc + j)]), floatToBits(want[size_t(i * ldc + j)]))
                                    << "transA " << transA << " acc " << acc << " m " << m << " n " << n << " k " << k
                                    << " at " << i << "," << j;
                    }
}

TEST(FwdPackAvx2, StripGemmOverPackedValuesMatchesScalarBitwise) {
    SKIP_WITHOUT_AVX2();
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t dv : {1, 16, 17, 40, 128})
        for (int64_t keys : {1, 9, 128})
            for (int64_t rows : {1, 6, 120}) {
                std::vector<float> logical;
                Tensor t = makeTensor(DType::BF16, keys, dv, 1, rng, logical);
                constexpr int64_t W = simd::stripWidth<Avx2>();
                std::vector<float> vs(size_t((dv + W - 1) / W * W * keys));
                packStrips(t.view, 0, keys, dv, vs.data());
                const int64_t ldp = rows + 2;
                std::vector<float> p(size_t(keys * ldp)), acc(size_t(rows * dv));
                for (float& x : p) x = u(rng);
                for (float& x : acc) x = u(rng);
                std::vector<float> want = acc;
                for (int64_t i = 0; i < rows; ++i)
                    for (int64_t j = 0; j < dv; ++j) {
                        float s = acc[size_t(i * dv + j)];
                        for (int64_t kk = 0; kk < keys; ++kk)
                            s = std::fma(p[size_t(kk * ldp + i)], logical[size_t(kk * dv + j)], s);
                        want[size_t(i * dv + j)] = s;
                    }
                strips(rows, dv, keys, p.data(), ldp, vs.data(), acc.data(), dv);
                for (size_t i = 0; i < acc.size(); ++i)
                    ASSERT_EQ(floatToBits(acc[i]), floatToBits(want[i])) << "dv " << dv << " keys " << keys << " rows " << rows;
            }
}

}  // namespace
