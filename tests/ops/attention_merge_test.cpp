// AttentionMerge (attnops/attention_merge.h): two partial results over disjoint key blocks merge
// to the attention over all keys (against a double reference), both statistic forms, empty rows
// and blocks, in-place updates, strided/broadcast views, half outputs, determinism, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.hpp"
#include "problem.hpp"

namespace {

using attnops::Tensor;
using attnops::tools::launchAndWait;
using attnops::tools::Rng;
const float kNegInf = -std::numeric_limits<float>::infinity();

// Partial attention of one row over keys [k0, k1): out (fp32), max, sum, from scores and values.
struct Partial {
    std::vector<float> out, max, sum;
};

struct Problem {
    int64_t rows, d, keys;
    std::vector<double> s, v;  // scores [rows][keys], values [keys][d]
    Partial partial(int64_t k0, int64_t k1, const std::vector<char>& masked) const {
        Partial p{std::vector<float>(size_t(rows * d), 0.0f), std::vector<float>(size_t(rows), kNegInf),
                  std::vector<float>(size_t(rows), 0.0f)};
        for (int64_t r = 0; r < rows; ++r) {
            double m = -INFINITY, l = 0;
            for (int64_t j = k0; j < k1; ++j)
                if (!masked[size_t(r * keys + j)]) m = std::max(m, s[size_t(r * keys + j)]);
            if (m == -INFINITY) continue;
            std::vector<double> acc(size_t(d), 0.0);
            for (int64_t j = k0; j < k1; ++j) {
                if (masked[size_t(r * keys + j)]) continue;
                const double e = std::exp(s[size_t(r * keys + j)] - m);
                l += e;
                for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += e * v[size_t(j * d + c)];
            }
            for (int64_t c = 0; c < d; ++c) p.out[size_t(r * d + c)] = float(acc[size_t(c)] / l);
            p.max[size_t(r)] = float(m);
            p.sum[size_t(r)] = float(l);
        }
        return p;
    }
};

attnopsStatus merge(const Tensor& o1, const Tensor& m1, const Tensor* s1, const Tensor& o2, const Tensor& m2,
                    const Tensor* s2, const Tensor& o, const Tensor& m, const Tensor* s) {
    uint64_t ws = 0;
    attnopsExecutor* ex = nullptr;
    const attnopsStatus st = attnopsAttentionMergeGetWorkspaceSize(
        o1.get(), m1.get(), s1 ? s1->get() : nullptr, o2.get(), m2.get(), s2 ? s2->get() : nullptr, o.get(), m.get(),
        s ? s->get() : nullptr, &ws, &ex);
    return launchAndWait(st, ws, ex, attnopsAttentionMerge);
}

Problem makeProblem(int64_t rows, int64_t d, int64_t keys, uint64_t seed) {
    Problem p{rows, d, keys, {}, {}};
    Rng rng(seed);
    for (int64_t i = 0; i < rows * keys; ++i) p.s.push_back(rng.symmetric(8.0));
    for (int64_t i = 0; i < keys * d; ++i) p.v.push_back(rng.symmetric(1.0));
    return p;
}

TEST(AttentionMerge, TwoBlocksGiveTheWholeAttentionBothForms) {
    const int64_t rows = 37, d = 5, keys = 20, cut = 7;
    const Problem pb = makeProblem(rows, d, keys, 3);
    std::vector<char> masked(size_t(rows * keys), 0);
    for (int64_t j = 0; j < cut; ++j) masked[size_t(3 * keys + j)] = 1;         // row 3: first block empty
    for (int64_t j = cut; j < keys; ++j) masked[size_t(4 * keys + j)] = 1;      // row 4: second block empty
    for (int64_t j = 0; j < keys; ++j) masked[size_t(5 * keys + j)] = 1;        // row 5: empty everywhere
    Partial a = pb.partial(0, cut, masked), b = pb.partial(cut, keys, masked), w = pb.partial(0, keys, masked);
    for (bool lse : {false, true}) {
        std::vector<float> la = a.max, lb = b.max;
        if (lse)
            for (int64_t r = 0; r < rows; ++r) {
                if (a.sum[size_t(r)] > 0) la[size_t(r)] += std::log(a.sum[size_t(r)]);
                if (b.sum[size_t(r)] > 0) lb[size_t(r)] += std::log(b.sum[size_t(r)]);
            }
        std::vector<float> out(size_t(rows * d), NAN), mx(size_t(rows * 8), NAN), sm(size_t(rows * 8), NAN);
        Tensor o1(a.out.data(), ATTNOPS_FLOAT32, {rows, d}), o2(b.out.data(), ATTNOPS_FLOAT32, {rows, d});
        Tensor m1(la.data(), ATTNOPS_FLOAT32, {rows, 1}), m2(lb.data(), ATTNOPS_FLOAT32, {rows, 1});
        Tensor s1(a.sum.data(), ATTNOPS_FLOAT32, {rows, 1}), s2(b.sum.data(), ATTNOPS_FLOAT32, {rows, 1});
        Tensor o(out.data(), ATTNOPS_FLOAT32, {rows, d}), m(mx.data(), ATTNOPS_FLOAT32, {rows, 8});
        Tensor s(sm.data(), ATTNOPS_FLOAT32, {rows, 8});
        ASSERT_EQ(merge(o1, m1, lse ? nullptr : &s1, o2, m2, lse ? nullptr : &s2, o, m, lse ? nullptr : &s),
                  ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < d; ++c)
                EXPECT_NEAR(out[size_t(r * d + c)], w.out[size_t(r * d + c)], 2e-6) << "row " << r;
            for (int64_t l = 0; l < 8; ++l) {
                if (r == 5) {
                    EXPECT_EQ(mx[size_t(r * 8 + l)], kNegInf);
                    if (!lse) {
                        EXPECT_EQ(sm[size_t(r * 8 + l)], 0.0f);
                    }
                    continue;
                }
                const double want = lse ? double(w.max[size_t(r)]) + std::log(double(w.sum[size_t(r)])) : w.max[size_t(r)];
                EXPECT_NEAR(mx[size_t(r * 8 + l)], want, 1e-5 * std::max(1.0, std::fabs(want))) << "row " << r;
                if (!lse) {
                    EXPECT_NEAR(sm[size_t(r * 8 + l)], w.sum[size_t(r)], 1e-5 * w.sum[size_t(r)]) << "row " << r;
                }
            }
            if (r == 3 || r == 4) {  // one block empty: the other is copied exactly
                const Partial& live = r == 3 ? b : a;
                for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[size_t(r * d + c)], live.out[size_t(r * d + c)]);
            }
        }
        for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[size_t(5 * d + c)], 0.0f);
    }
}

TEST(AttentionMerge, InPlaceStridedHalfAndDeterministic) {
    // Out [S=6, B=2, N=3, D=4] (SBH-like), statistics a permuted [B, N, S, 8] view: strides only.
    const int64_t S = 6, B = 2, N = 3, D = 4, L = 8;
    Rng rng(9);
    std::vector<float> o1(size_t(S * B * N * D)), o2(o1.size()), st(size_t(4 * B * N * S * L));
    for (auto& x : o1) x = rng.symmetric(1);
    for (auto& x : o2) x = rng.symmetric(1);
    for (int64_t i = 0; i < int64_t(st.size()); ++i) st[size_t(i)] = i / (B * N * S * L) % 2 ? 0.5f + float(rng.uniform()) : rng.symmetric(4);
    const std::vector<int64_t> statShape = {S, B, N, L}, statStrides = {L, N * S * L, S * L, 1};
    const int64_t plane = B * N * S * L;
    Tensor m1(st.data(), ATTNOPS_FLOAT32, statShape, statStrides), s1(st.data() + plane, ATTNOPS_FLOAT32, statShape, statStrides);
    Tensor m2(st.data() + 2 * plane, ATTNOPS_FLOAT32, statShape, statStrides);
    Tensor s2(st.data() + 3 * plane, ATTNOPS_FLOAT32, statShape, statStrides);
    // Out-of-place fp32 result first.
    std::vector<float> ref(o1.size()), rm(size_t(S * B * N)), rs(rm.size());
    Tensor t1(o1.data(), ATTNOPS_FLOAT32, {S, B, N, D}), t2(o2.data(), ATTNOPS_FLOAT32, {S, B, N, D});
    Tensor tr(ref.data(), ATTNOPS_FLOAT32, {S, B, N, D}), trm(rm.data(), ATTNOPS_FLOAT32, {S, B, N, 1});
    Tensor trs(rs.data(), ATTNOPS_FLOAT32, {S, B, N, 1});
    ASSERT_EQ(merge(t1, m1, &s1, t2, m2, &s2, tr, trm, &trs), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    // Twice with other thread counts: the same bits; then in place over prev (out and stats).
    for (int threads : {1, 2, 3}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS);
        std::vector<float> again(o1.size());
        Tensor ta(again.data(), ATTNOPS_FLOAT32, {S, B, N, D});
        std::vector<float> am(rm.size()), as(rs.size());
        Tensor tam(am.data(), ATTNOPS_FLOAT32, {S, B, N, 1}), tas(as.data(), ATTNOPS_FLOAT32, {S, B, N, 1});
        ASSERT_EQ(merge(t1, m1, &s1, t2, m2, &s2, ta, tam, &tas), ATTNOPS_SUCCESS);
        EXPECT_EQ(again, ref);
        EXPECT_EQ(am, rm);
        EXPECT_EQ(as, rs);
    }
    std::vector<float> inPlace = o1, stCopy = st;
    Tensor ti(inPlace.data(), ATTNOPS_FLOAT32, {S, B, N, D});
    Tensor cm1(stCopy.data(), ATTNOPS_FLOAT32, statShape, statStrides);
    Tensor cs1(stCopy.data() + plane, ATTNOPS_FLOAT32, statShape, statStrides);
    ASSERT_EQ(merge(ti, cm1, &cs1, t2, m2, &s2, ti, cm1, &cs1), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(inPlace, ref);
    for (int64_t sI = 0; sI < S; ++sI)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < N; ++n)
                for (int64_t l = 0; l < L; ++l) {
                    const size_t row = size_t((sI * B + b) * N + n), at = size_t(sI * L + b * N * S * L + n * S * L + l);
                    ASSERT_EQ(stCopy[at], rm[row]);
                    ASSERT_EQ(stCopy[size_t(plane) + at], rs[row]);
                }
    // A bf16 output is the fp32 result rounded once.
    std::vector<uint16_t> half(o1.size());
    Tensor th(half.data(), ATTNOPS_BFLOAT16, {S, B, N, D});
    ASSERT_EQ(merge(t1, m1, &s1, t2, m2, &s2, th, trm, &trs), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    for (size_t i = 0; i < half.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &ref[i], 4);
        const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
        ASSERT_EQ(half[i], uint16_t(rounded)) << i;
    }
}

TEST(AttentionMerge, ValidationNamesTheArgument) {
    std::vector<float> a(24), b(24), c(24), m(6), n(6), k(6), x(6), y(6), z(6);
    Tensor o1(a.data(), ATTNOPS_FLOAT32, {6, 4}), o2(b.data(), ATTNOPS_FLOAT32, {6, 4}), o(c.data(), ATTNOPS_FLOAT32, {6, 4});
    Tensor m1(m.data(), ATTNOPS_FLOAT32, {6, 1}), m2(n.data(), ATTNOPS_FLOAT32, {6, 1}), mo(k.data(), ATTNOPS_FLOAT32, {6, 1});
    Tensor s1(x.data(), ATTNOPS_FLOAT32, {6, 1}), s2(y.data(), ATTNOPS_FLOAT32, {6, 1}), so(z.data(), ATTNOPS_FLOAT32, {6, 1});
    const auto expectError = [](attnopsStatus st, const char* text) {
        EXPECT_NE(st, ATTNOPS_SUCCESS) << text;
        EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find(text), std::string::npos) << attnopsGetLastErrorMessage();
    };
    expectError(merge(o1, m1, &s1, o2, m2, nullptr, o, mo, &so), "curSum");
    Tensor bad(c.data(), ATTNOPS_FLOAT32, {6, 3});
    expectError(merge(o1, m1, &s1, o2, m2, &s2, bad, mo, &so), "outOut.shape");
    Tensor badStat(k.data(), ATTNOPS_FLOAT32, {5, 1});
    expectError(merge(o1, m1, &s1, o2, m2, &s2, o, badStat, &so), "maxOut.shape");
    std::vector<uint16_t> h(6);
    Tensor halfStat(h.data(), ATTNOPS_FLOAT16, {6, 1});
    expectError(merge(o1, halfStat, &s1, o2, m2, &s2, o, mo, &so), "prevMax.dtype");
    Tensor overlap(a.data() + 4, ATTNOPS_FLOAT32, {5, 4});  // shifted view of prevOut
    Tensor o15(a.data(), ATTNOPS_FLOAT32, {5, 4}), o25(b.data(), ATTNOPS_FLOAT32, {5, 4});
    Tensor m15(m.data(), ATTNOPS_FLOAT32, {5, 1}), m25(n.data(), ATTNOPS_FLOAT32, {5, 1}), mo5(k.data(), ATTNOPS_FLOAT32, {5, 1});
    Tensor s15(x.data(), ATTNOPS_FLOAT32, {5, 1}), s25(y.data(), ATTNOPS_FLOAT32, {5, 1}), so5(z.data(), ATTNOPS_FLOAT32, {5, 1});
    expectError(merge(o15, m15, &s15, o25, m25, &s25, overlap, mo5, &so5), "outOut");
    Tensor zeroStride(c.data(), ATTNOPS_FLOAT32, {6, 4}, {0, 1});
    expectError(merge(o1, m1, &s1, o2, m2, &s2, zeroStride, mo, &so), "outOut.strides");
    EXPECT_EQ(merge(o1, m1, &s1, o2, m2, &s2, o, mo, &so), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
}

}  // namespace
