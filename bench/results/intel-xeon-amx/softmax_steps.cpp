// The elementwise steps of the AMX forward with transposed scores (fa_amx_forward.hpp) for one
// 256-row x 128-key block, timed alone on a CPU without AMX (AVX-512 builds of the same code):
// the commit before (scaleAndMask + softmaxBlock: a scaled copy of the block, the max in memory,
// exp with separate multiplies and adds) against the current one (blockMaxima from the raw
// scores, softmaxBlock fused with the scaling, rows outer, exp with fused multiply-adds). P^T
// may differ in a few last bits (the exp is not the same); the count is printed. Not built by CMake; see NOTES.md for the command.
#pragma GCC diagnostic ignored "-Wpsabi"
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cpu/amx/emu_tiles.hpp"
#define ATTNOPS_AMX_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prefer-vector-width=512")))
#include "cpu/amx/fa_amx_kernel.hpp"

namespace attnops::fa {
namespace {
// expLanes as it was before (separate multiplies and adds).
ATTNOPS_AMX_FN inline __attribute__((always_inline)) F16x oldExpLanes(F16x x) {
    const F16x input = x;
    x = select(x > -87.3f, x, splat(-87.3f));
    x = select(x < 88.7f, x, splat(88.7f));
    const F16x n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const F16x r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    F16x poly = splat(1.0f / 5040.0f);
    poly = poly * r + 1.0f / 720.0f;
    poly = poly * r + 1.0f / 120.0f;
    poly = poly * r + 1.0f / 24.0f;
    poly = poly * r + 1.0f / 6.0f;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const I16x bits = (__builtin_convertvector(n, I16x) + 127) << 23;
    F16x scale;
    std::memcpy(&scale, &bits, sizeof scale);
    const F16x result = poly * scale;
    return select(input != input, input, select(x <= -87.3f, splat(0.0f), result));
}

// The block of one head: scores [nk keys][R rows] in st, raw. Scales them, masks the keys outside
// each row's band and prefix (-inf), and takes each row's maximum over the block (NaN if a kept
// score is NaN), keys ascending.
ATTNOPS_AMX_FN void oldScaleAndMask(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t rows, int64_t k0,
                                 int64_t nk, int64_t R, float* __restrict st, float* __restrict blockMax) {
    const float scale = p.scale;
    for (int64_t r = 0; r < R; r += kLanes) storeLanes(blockMax + r, splat(tile::kNegInf));
    // Every row of the block keeps every key: no test per score.
    const bool whole = (rule.minDiff <= k0 - (q0 + rows - 1) && rule.maxDiff >= k0 + nk - 1 - q0) ||
                       k0 + nk <= rule.prefix;
    for (int64_t j = 0; j < nk; ++j) {
        float* __restrict s = st + j * R;
        const int64_t key = k0 + j;
        // Row q0 + r keeps the key iff minDiff <= key - q0 - r <= maxDiff: r in [rLo, rHi).
        int64_t rLo = 0, rHi = R;
        if (!whole && key >= rule.prefix) {
            rLo = std::clamp<int64_t>(key - q0 - rule.maxDiff, 0, R);
            rHi = std::clamp<int64_t>(key - q0 - rule.minDiff + 1, 0, R);
        }
        for (int64_t r = 0; r < R; r += kLanes) {
            const I16x index = cpu::amx::laneIndex() + int32_t(r);
            const I16x kept = (index >= int32_t(rLo)) & (index < int32_t(rHi));
            const F16x x = select(kept, loadLanes(s + r) * scale, splat(tile::kNegInf));
            storeLanes(s + r, x);
            const F16x m = loadLanes(blockMax + r);
            storeLanes(blockMax + r, select((x > m) | (x != x), x, m));
        }
    }
}

// The online-softmax update of one head's rows with the block's masked scores: m, l and alpha
// (the factor of the accumulator: 0 while nothing was accumulated, 1 where the max did not move),
// st becomes the probabilities and, with tiles, pb the P^T B operand (rounded; keys past nk 0).
template <DotKind kind>
ATTNOPS_AMX_FN void oldSoftmaxBlock(int64_t nk, int64_t keyChunks, int64_t R, float* __restrict st,
                                 const float* __restrict blockMax, float* __restrict m, float* __restrict l,
                                 float* __restrict alpha, uint16_t* __restrict pb, bool tiles) {
    alignas(64) float sum[kTileN * 32];  // R <= 512
    for (int64_t r = 0; r < R; r += kLanes) {
        const F16x mOld = loadLanes(m + r), bm = loadLanes(blockMax + r);
        const F16x mNew = select((bm > mOld) | (bm != bm), bm, mOld);
        storeLanes(alpha + r, select(mOld == tile::kNegInf, splat(0.0f), oldExpLanes(mOld - mNew)));
        storeLanes(m + r, mNew);
        storeLanes(sum + r, splat(0.0f));
    }
    const int64_t rowTiles = R / kTileN;
    for (int64_t j = 0; j < keyChunks * kTileK; j += 2) {
        // Keys j and j + 1: one row of pairs in each B tile of the chunk.
        uint16_t* pairRow = pb + (j / kTileK) * rowTiles * kTileElems + ((j % kTileK) / 2) * kTileK;
        float* __restrict s0 = st + j * R;
        float* __restrict s1 = s0 + R;
        for (int64_t r = 0; r < R; r += kLanes) {
            const F16x mr = loadLanes(m + r);
            F16x e0 = splat(0.0f), e1 = splat(0.0f), total = loadLanes(sum + r);
            if (j < nk) {
                const F16x x = loadLanes(s0 + r);
                e0 = select(x != tile::kNegInf, oldExpLanes(x - mr), splat(0.0f));
                storeLanes(s0 + r, e0);
                total = total + e0;
            }
            if (j + 1 < nk) {
                const F16x x = loadLanes(s1 + r);
                e1 = select(x != tile::kNegInf, oldExpLanes(x - mr), splat(0.0f));
                storeLanes(s1 + r, e1);
                total = total + e1;
            }
            storeLanes(sum + r, total);
            if (tiles)  // 16 pairs (row r + i: keys j, j + 1) fill one row of a B tile
                storeLanes(pairRow + (r / kTileN) * kTileElems, narrowLanes<kind>(e0) | (narrowLanes<kind>(e1) << 16));
        }
    }
    for (int64_t r = 0; r < R; r += kLanes)
        storeLanes(l + r, loadLanes(l + r) * loadLanes(alpha + r) + loadLanes(sum + r));
}


// Lanes r (rows q0 + r) that keep key `key`: the row's band or the prefix, and a saved sum > 0.
ATTNOPS_AMX_FN I16x oldKeptLanes(const SeqRule& rule, int64_t q0, int64_t key, int64_t r, int64_t R,
                              const float* invL) {
    int64_t rLo = 0, rHi = R;
    if (key >= rule.prefix) {
        rLo = std::clamp<int64_t>(key - q0 - rule.maxDiff, 0, R);
        rHi = std::clamp<int64_t>(key - q0 - rule.minDiff + 1, 0, R);
    }
    const I16x index = cpu::amx::laneIndex() + int32_t(r);
    return (index >= int32_t(rLo)) & (index < int32_t(rHi)) & (loadLanes(invL + r) != 0.0f);
}

// The gradients of a block: st (raw S^T) becomes P and dpt (raw dP^T) scale * dS for keys
// [k0, k0 + nk) and the R lanes, both 0 where a key is not kept; with exactDelta, adds
// sum_j P dP per lane (keys ascending).
ATTNOPS_AMX_FN void oldBlockGradients(const ForwardParams& p, const SeqRule& rule, int64_t q0, int64_t k0, int64_t nk,
                                   int64_t R, const HeadRows& hr, float* __restrict st, float* __restrict dpt,
                                   float* exactDelta) {
    const float scale = p.scale;
    for (int64_t j = 0; j < nk; ++j) {
        float* __restrict s = st + j * R;
        float* __restrict dp = dpt + j * R;
        for (int64_t r = 0; r < R; r += kLanes) {
            const I16x kept = oldKeptLanes(rule, q0, k0 + j, r, R, hr.invL);
            const F16x x = loadLanes(s + r) * scale;
            const F16x pr =
                select(kept, oldExpLanes(x - loadLanes(hr.m + r)) * loadLanes(hr.invL + r), splat(0.0f));
            const F16x dpr = loadLanes(dp + r);
            const F16x ds = pr * (dpr - loadLanes(hr.delta + r));
            storeLanes(s + r, pr);
            storeLanes(dp + r, select(kept, ds * scale, splat(0.0f)));
            if (exactDelta != nullptr)
                storeLanes(exactDelta + r, loadLanes(exactDelta + r) + select(kept, pr * dpr, splat(0.0f)));
        }
    }
}

// fp32 [nk][R] as an A operand [keyTiles * 16][ld]: rows are keys, k runs over the lanes.
template <DotKind kind>
ATTNOPS_AMX_FN void oldPackLanesAsRows(const float* __restrict src, int64_t nk, int64_t R, int64_t keyRowsPad, int64_t ld,
                                    uint16_t* __restrict dst) {
    for (int64_t j = 0; j < keyRowsPad; ++j) {
        uint16_t* out = dst + j * ld;
        int64_t r = 0;
        if (j < nk)
            for (; r < R; r += kLanes) {
                const cpu::amx::H16x h = __builtin_convertvector(narrowLanes<kind>(loadLanes(src + j * R + r)),
                                                                 cpu::amx::H16x);
                std::memcpy(out + r, &h, sizeof h);
            }
        std::fill(out + r, out + ld, uint16_t(0));
    }
}

// fp32 [nk][R] as a B operand whose k axis runs over the keys: keyChunks x R/16 tiles of pairs.
template <DotKind kind>
ATTNOPS_AMX_FN void oldPackLanesAsPairs(const float* __restrict src, int64_t nk, int64_t keyChunks, int64_t R,
                                     uint16_t* __restrict dst) {
    const int64_t rowTiles = R / kTileN;
    for (int64_t j = 0; j < keyChunks * kTileK; j += 2) {
        uint16_t* pairRow = dst + (j / kTileK) * rowTiles * kTileElems + ((j % kTileK) / 2) * kTileK;
        for (int64_t r = 0; r < R; r += kLanes) {
            const F16x e0 = j < nk ? loadLanes(src + j * R + r) : splat(0.0f);
            const F16x e1 = j + 1 < nk ? loadLanes(src + (j + 1) * R + r) : splat(0.0f);
            storeLanes(pairRow + (r / kTileN) * kTileElems, narrowLanes<kind>(e0) | (narrowLanes<kind>(e1) << 16));
        }
    }
}

}  // namespace
}  // namespace attnops::fa

using namespace attnops;
using namespace attnops::fa;

ATTNOPS_AMX_FN int run(int argc) {
    const int64_t R = 256, nk = 128, keyChunks = 4, rows = 256;
    ForwardParams p{};
    p.scale = 0.088f;
    std::vector<float> raw(nk * R), st(nk * R), bm(R), m(R), l(R), alpha(R);
    std::vector<uint16_t> pb(nk * R), pbOld(nk * R);
    std::mt19937 gen(1);
    std::normal_distribution<float> dist(0.0f, 8.0f);
    for (auto& x : raw) x = dist(gen);
    for (int causal = 0; causal < 2; ++causal) {
        SeqRule rule{};
        int64_t q0 = 0, k0 = 0;
        if (causal) rule = SeqRule{-(int64_t(1) << 40), 0, 0};  // diagonal block: q0 == k0
        const bool whole = blockFullyKept(rule, q0, q0 + rows, k0, k0 + nk, nk);
        double best[2] = {1e9, 1e9};
        for (int rep = 0; rep < 200 * argc; ++rep)
            for (int v = 0; v < 2; ++v) {
                std::fill(m.begin(), m.end(), -1.0f);
                std::fill(l.begin(), l.end(), 1.0f);
                std::memcpy(st.data(), raw.data(), raw.size() * 4);
                const auto t0 = std::chrono::steady_clock::now();
                if (v == 0) {
                    oldScaleAndMask(p, rule, q0, rows, k0, nk, R, st.data(), bm.data());
                    oldSoftmaxBlock<DotKind::Bf16>(nk, keyChunks, R, st.data(), bm.data(), m.data(), l.data(),
                                                   alpha.data(), pbOld.data(), true);
                } else {
                    blockMaxima(p, rule, q0, k0, nk, R, whole, st.data(), bm.data());
                    softmaxBlock<DotKind::Bf16>(p, rule, q0, k0, nk, keyChunks, R, whole, st.data(), bm.data(),
                                                m.data(), l.data(), alpha.data(), pb.data(), true);
                }
                const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
                best[v] = std::min(best[v], ns);
            }
        int64_t differ = 0;
        for (size_t i = 0; i < pb.size(); ++i) differ += pb[i] != pbOld[i];
        std::printf("%s block 256 rows x 128 keys: before %.0f ns (%.3f ns/score), now %.0f ns (%.3f ns/score), "
                    "%lld of %zu bf16 P^T elements differ\n",
                    causal ? "diagonal (causal)" : "whole", best[0], best[0] / (R * nk), best[1], best[1] / (R * nk),
                    (long long)differ, pb.size());
    }
    // The backward's key unit: P and scale * dS of a 128-row query block x 256 keys, then both as
    // bf16 A rows (packLanesAsRows twice). Before: keptLanes per score, exp with separate
    // multiplies and adds; now: no band test in whole blocks, exp with fused multiply-adds. (A
    // version that rounded P and dS to bf16 in the gradient loop itself ran at 1.0 ns per score.)
    {
        const int64_t Rb = 128, nkb = 256, ld = 128;
        std::vector<float> dpRaw(nkb * Rb), dp(nkb * Rb), mm(Rb), ll(Rb), inv(Rb), delta(Rb), ex(Rb);
        std::vector<uint16_t> pa(nkb * ld), dsa(nkb * ld), paOld(nkb * ld), dsaOld(nkb * ld);
        for (int64_t r = 0; r < Rb; ++r) {
            float mx = -1e30f;
            for (int64_t j = 0; j < nkb; ++j) mx = std::max(mx, raw[j * Rb + r] * p.scale);
            mm[r] = mx, ll[r] = 10.0f, inv[r] = 0.1f, delta[r] = 0.5f;
        }
        for (auto& x : dpRaw) x = dist(gen) * 0.1f;
        HeadRows hr{nullptr, nullptr, mm.data(), ll.data(), inv.data(), delta.data(), ex.data(), nullptr};
        SeqRule rule{};
        double best[2] = {1e9, 1e9};
        for (int rep = 0; rep < 200 * argc; ++rep)
            for (int v = 0; v < 2; ++v) {
                std::memcpy(st.data(), raw.data(), nkb * Rb * 4);
                std::memcpy(dp.data(), dpRaw.data(), dp.size() * 4);
                const auto t0 = std::chrono::steady_clock::now();
                if (v == 0) {
                    oldBlockGradients(p, rule, 0, 0, nkb, Rb, hr, st.data(), dp.data(), nullptr);
                    oldPackLanesAsRows<DotKind::Bf16>(st.data(), nkb, Rb, nkb, ld, paOld.data());
                    oldPackLanesAsRows<DotKind::Bf16>(dp.data(), nkb, Rb, nkb, ld, dsaOld.data());
                } else {
                    blockGradients(p, rule, 0, Rb, 0, nkb, nkb, Rb, hr, st.data(), dp.data(), nullptr);
                    packLanesAsRows<DotKind::Bf16>(st.data(), nkb, Rb, nkb, ld, pa.data());
                    packLanesAsRows<DotKind::Bf16>(dp.data(), nkb, Rb, nkb, ld, dsa.data());
                }
                const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
                best[v] = std::min(best[v], ns);
            }
        int64_t differ = 0;
        for (size_t i = 0; i < pa.size(); ++i) differ += (pa[i] != paOld[i]) + (dsa[i] != dsaOld[i]);
        std::printf("backward key-unit block 128 rows x 256 keys, P and dS to bf16 rows: before %.0f ns (%.3f ns/score), "
                    "now %.0f ns (%.3f ns/score), %lld of %zu bf16 elements differ\n",
                    best[0], best[0] / (Rb * nkb), best[1], best[1] / (Rb * nkb), (long long)differ, 2 * pa.size());
    }
    return 0;
}

int main(int argc, char**) { return run(argc); }
