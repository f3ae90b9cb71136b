// The extended FlashAttentionScore(Grad) entry points (attnops/flash_attention_score_ex.h), what
// context parallelism needs from the kernels:
// - dropout keyed by global positions: every local keep bit of a sharded call (rows split
//   contiguously or zigzag, heads split as Ulysses does, TND sequences spread) is the bit the
//   unsharded problem draws (attnopsFlashAttentionGenDropMask of the global problem), and sharded
//   forward/backward calls reproduce the unsharded outputs;
// - fp32 attentionOut and fp32 gradients from bf16/fp16 inputs, and gradients added into fp32
//   accumulators;
// - validation of the extras, naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "attnops/attnops.hpp"
#include "core/dtype.hpp"
#include "ops/flash_attention_score/check.hpp"
#include "ops/flash_attention_score/semantics.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"

namespace {

using attnops::IntArray;
using attnops::Tensor;
using attnops::tools::launchAndWait;
using attnops::tools::Rng;

constexpr double kKeep = 0.7;
constexpr int64_t kSeed = 0x5eed1234, kOffset = 7;

// A dense host tensor of any float dtype, held as raw bytes, with fp32 accessors.
struct Buf {
    attnopsDataType dtype = ATTNOPS_FLOAT32;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
    Tensor t;

    Buf(attnopsDataType dt, std::vector<int64_t> s) : dtype(dt), shape(std::move(s)) {
        const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
        bytes.assign(size_t(n) * attnopsDataTypeSize(dt), 0);
        t = Tensor(bytes.data(), dtype, shape);
    }
    int64_t numel() const { return int64_t(bytes.size() / attnopsDataTypeSize(dtype)); }
    float get(int64_t i) const { return attnops::loadAsFloat(bytes.data(), i, attnops::DType(dtype)); }
    void set(int64_t i, float v) { attnops::storeFromFloat(bytes.data(), i, attnops::DType(dtype), v); }
    const attnopsTensor* h() const { return t.get(); }
};

void fillRandom(Buf& b, uint64_t seed) {
    Rng rng(seed);
    for (int64_t i = 0; i < b.numel(); ++i) b.set(i, rng.symmetric(1.0));
}

// Rows `rows` (of axis 1 of a [B,S,N,D] tensor; axis 0 of [T,N,D] when b == 0) and heads
// [h0, h0 + nh) of `src` copied into a new tensor.
Buf takeRows(const Buf& src, const std::vector<int64_t>& rows, int64_t h0, int64_t nh, bool tnd) {
    const int64_t batch = tnd ? 1 : src.shape[0];
    const int64_t heads = src.shape[tnd ? 1 : 2], d = src.shape[tnd ? 2 : 3], s = src.shape[tnd ? 0 : 1];
    std::vector<int64_t> shape = tnd ? std::vector<int64_t>{int64_t(rows.size()), nh, d}
                                     : std::vector<int64_t>{batch, int64_t(rows.size()), nh, d};
    Buf out(src.dtype, shape);
    for (int64_t b = 0; b < batch; ++b)
        for (size_t r = 0; r < rows.size(); ++r)
            for (int64_t n = 0; n < nh; ++n)
                for (int64_t c = 0; c < d; ++c)
                    out.set(((b * int64_t(rows.size()) + int64_t(r)) * nh + n) * d + c,
                            src.get(((b * s + rows[r]) * heads + h0 + n) * d + c));
    return out;
}

std::vector<int64_t> range(int64_t a, int64_t b) {
    std::vector<int64_t> r(size_t(b - a));
    std::iota(r.begin(), r.end(), a);
    return r;
}
std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}
// Zigzag rows of rank r of W over a sequence of s rows starting at `start`: chunks r, 2W-1-r.
std::vector<int64_t> zigzag(int64_t s, int64_t w, int64_t r, int64_t start = 0) {
    const int64_t c = s / (2 * w);
    return concat(range(start + r * c, start + (r + 1) * c), range(start + (2 * w - 1 - r) * c, start + (2 * w - r) * c));
}

// Extras for a fixed-layout shard: global N and S, head offset, the query/key row maps.
struct ExtrasHolder {
    attnopsFlashAttentionExtras e{};
    IntArray qRows, kvRows, gq, gkv, index;
    ExtrasHolder() { EXPECT_EQ(attnopsFlashAttentionExtrasInit(&e), ATTNOPS_SUCCESS); }
    void rows(const std::vector<int64_t>& q, const std::vector<int64_t>& kv) {
        qRows = IntArray(q);
        kvRows = IntArray(kv);
        e.dropQRows = qRows.get();
        e.dropKvRows = kvRows.get();
    }
    void tnd(const std::vector<int64_t>& q, const std::vector<int64_t>& kv, const std::vector<int64_t>& idx) {
        gq = IntArray(q);
        gkv = IntArray(kv);
        e.dropActualSeqQLen = gq.get();
        e.dropActualSeqKvLen = gkv.get();
        if (!idx.empty()) {
            index = IntArray(idx);
            e.dropSeqIndex = index.get();
        }
    }
};

struct Outputs {
    Buf out, mx, sm;
};

// Forward through the extended entry point (extras may be NULL), BSND or TND.
attnopsStatus forward(const Buf& q, const Buf& k, const Buf& v, int64_t heads, bool tnd, const IntArray* aq,
                      const IntArray* akv, const attnopsFlashAttentionExtras* ex, Outputs& o, double keep = kKeep,
                      int64_t mode = 0) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsFlashAttentionScoreExGetWorkspaceSize(
        q.h(), k.h(), v.h(), nullptr, nullptr, nullptr, nullptr, nullptr, aq ? aq->get() : nullptr,
        akv ? akv->get() : nullptr, nullptr, nullptr, nullptr, 0.25, keep, 2147483647, mode == 0 ? 2147483647 : 0,
        heads, tnd ? "TND" : "BSND", 0, mode, 1, kSeed, kOffset, o.mx.h(), o.sm.h(), nullptr, o.out.h(), ex, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsFlashAttentionScore);
}

Outputs outputsFor(const Buf& q, const Buf& v, attnopsDataType outType, bool tnd) {
    const int64_t dv = v.shape.back();
    std::vector<int64_t> os = q.shape;
    os.back() = dv;
    const std::vector<int64_t> ss = tnd ? std::vector<int64_t>{q.shape[0], q.shape[1], 1}
                                        : std::vector<int64_t>{q.shape[0], q.shape[2], q.shape[1], 1};
    return Outputs{Buf(outType, os), Buf(ATTNOPS_FLOAT32, ss), Buf(ATTNOPS_FLOAT32, ss)};
}

struct Grads {
    Buf dq, dk, dv;
};

attnopsStatus backward(const Buf& q, const Buf& k, const Buf& v, const Buf& dy, const Outputs& o, int64_t heads,
                       bool tnd, const IntArray* aq, const IntArray* akv, const attnopsFlashAttentionExtras* ex,
                       Grads& g, double keep = kKeep) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    const attnopsStatus st = attnopsFlashAttentionScoreGradExGetWorkspaceSize(
        q.h(), k.h(), v.h(), dy.h(), nullptr, nullptr, nullptr, nullptr, o.mx.h(), o.sm.h(), nullptr, o.out.h(), nullptr,
        aq ? aq->get() : nullptr, akv ? akv->get() : nullptr, nullptr, nullptr, nullptr, 0.25, keep, 2147483647,
        2147483647, heads, tnd ? "TND" : "BSND", 0, 0, 1, kSeed, kOffset, g.dq.h(), g.dk.h(), g.dv.h(), nullptr, nullptr,
        ex, &ws, &exec);
    return launchAndWait(st, ws, exec, attnopsFlashAttentionScoreGrad);
}

Grads gradsLike(const Buf& q, const Buf& k, const Buf& v, attnopsDataType dt) {
    return Grads{Buf(dt, q.shape), Buf(dt, k.shape), Buf(dt, v.shape)};
}

// The keep bits the unsharded problem draws.
std::vector<uint8_t> globalMask(int64_t b, int64_t n, int64_t s1, int64_t s2, const IntArray* aq, const IntArray* akv) {
    uint64_t bytes = 0;
    EXPECT_EQ(attnopsFlashAttentionDropMaskBytes(b, n, s1, s2, aq ? aq->get() : nullptr, akv ? akv->get() : nullptr, &bytes),
              ATTNOPS_SUCCESS);
    std::vector<uint8_t> mask(bytes);
    Tensor t(mask.data(), ATTNOPS_UINT8, {int64_t(bytes)});
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(b, n, s1, s2, aq ? aq->get() : nullptr, akv ? akv->get() : nullptr, kKeep,
                                               kSeed, kOffset, t.get()),
              ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    return mask;
}
bool bit(const std::vector<uint8_t>& m, int64_t i) { return (m[size_t(i >> 3)] >> (i & 7)) & 1; }

// The keep bits a checked (sharded) call uses, compared with the global mask at the mapped index.
// qMap/kvMap: global row of each local row (fixed) or, for TND, of each packed row with
// `globalSeq[b]` and the global per-sequence starts/lengths.
struct Shard {
    std::vector<int64_t> qRows, kvRows;  // global rows (fixed: sequence rows; TND: global packed rows)
    int64_t h0 = 0, nh = 0;
};

// ---------------------------------------------------------------- keep bits

TEST(FaCpExtras, FixedShardsDrawTheGlobalBits) {
    const int64_t B = 2, N = 4, N2 = 2, S = 24, D = 8;
    Buf q(ATTNOPS_FLOAT32, {B, S, N, D}), k(ATTNOPS_FLOAT32, {B, S, N2, D}), v(ATTNOPS_FLOAT32, {B, S, N2, D});
    fillRandom(q, 1);
    fillRandom(k, 2);
    fillRandom(v, 3);
    const auto mask = globalMask(B, N, S, S, nullptr, nullptr);
    std::vector<Shard> shards;
    for (int64_t w : {2, 3})
        for (int64_t r = 0; r < w; ++r) shards.push_back({range(r * S / w, (r + 1) * S / w), range(0, S), 0, N});
    for (int64_t r = 0; r < 2; ++r)  // ring zigzag steps: both chunks x the other rank's chunks
        shards.push_back({zigzag(S, 2, r), zigzag(S, 2, 1 - r), 0, N});
    shards.push_back({zigzag(S, 3, 1), range(4, 8), 0, N});    // zigzag q x first chunk of another rank
    shards.push_back({range(0, S), range(0, S), 2, 2});         // Ulysses: heads 2, 3 of 4 (kv heads 1)
    shards.push_back({range(5, 17), concat(range(20, 24), range(0, 3)), 2, 2});
    for (const Shard& sh : shards) {
        const Buf lq = takeRows(q, sh.qRows, sh.h0, sh.nh, false);
        const Buf lk = takeRows(k, sh.kvRows, sh.h0 / 2, sh.nh / 2, false);
        const Buf lv = takeRows(v, sh.kvRows, sh.h0 / 2, sh.nh / 2, false);
        Outputs o = outputsFor(lq, lv, ATTNOPS_FLOAT32, false);
        ExtrasHolder ex;
        ex.e.dropGlobal = 1;
        ex.e.dropHeadOffset = sh.h0;
        ex.e.dropHeadNum = N;
        ex.e.dropQSeqLen = S;
        ex.e.dropKvSeqLen = S;
        ex.rows(sh.qRows, sh.kvRows);
        attnops::fa::ForwardArgs a;
        a.query = lq.h();
        a.key = lk.h();
        a.value = lv.h();
        a.attentionOut = o.out.h();
        a.keepProb = kKeep;
        a.seed = kSeed;
        a.offset = kOffset;
        a.headNum = sh.nh;
        a.inputLayout = "BSND";
        a.extras = &ex.e;
        const attnops::fa::ForwardParams p = attnops::fa::checkForward(a, 0);
        ASSERT_TRUE(p.dropout.global.enabled);
        int64_t mismatches = 0, kept = 0, total = 0;
        for (int64_t b = 0; b < B; ++b)
            for (int64_t n = 0; n < sh.nh; ++n)
                for (size_t i = 0; i < sh.qRows.size(); ++i) {
                    std::vector<uint8_t> keep(sh.kvRows.size());
                    attnops::fa::dropoutKeepRow(p, b, n, int64_t(i), 0, int64_t(keep.size()), keep.data());
                    for (size_t j = 0; j < sh.kvRows.size(); ++j) {
                        const int64_t g = ((b * N + sh.h0 + n) * S + sh.qRows[i]) * S + sh.kvRows[j];
                        mismatches += (keep[j] != 0) != bit(mask, g);
                        kept += keep[j];
                        ++total;
                    }
                }
        EXPECT_EQ(mismatches, 0) << "shard of " << sh.qRows.size() << " rows, heads from " << sh.h0;
        EXPECT_GT(kept, total / 2);  // about keepProb of them: the bits are not all equal
        EXPECT_LT(kept, total);
    }
}

TEST(FaCpExtras, TndShardsDrawTheGlobalBits) {
    // Global sequences of lengths 12, 0, 8, 4; local: each sequence's zigzag share (W = 2) and a
    // call holding only sequences 2 and 0 (whole sequences spread over ranks), in that order.
    const std::vector<int64_t> lens = {12, 0, 8, 4};
    const std::vector<int64_t> cum = {12, 12, 20, 24}, starts = {0, 12, 12, 20};
    const int64_t N = 2, D = 8, T = 24;
    Buf q(ATTNOPS_FLOAT32, {T, N, D}), k(ATTNOPS_FLOAT32, {T, N, D}), v(ATTNOPS_FLOAT32, {T, N, D});
    fillRandom(q, 4);
    fillRandom(k, 5);
    fillRandom(v, 6);
    const IntArray gcum(cum);
    const auto mask = globalMask(0, N, 0, 0, &gcum, &gcum);
    struct Case {
        std::vector<int64_t> seqs;                    // global sequence of each local one
        std::vector<std::vector<int64_t>> qPos, kvPos;  // per local sequence: positions in the sequence
    };
    std::vector<Case> cases;
    for (int64_t r = 0; r < 2; ++r) {
        Case c{{0, 1, 2, 3}, {}, {}};
        for (int64_t s = 0; s < 4; ++s) {
            c.qPos.push_back(lens[size_t(s)] ? zigzag(lens[size_t(s)], 2, r) : std::vector<int64_t>{});
            c.kvPos.push_back(lens[size_t(s)] ? zigzag(lens[size_t(s)], 2, 1 - r) : std::vector<int64_t>{});
        }
        cases.push_back(c);
    }
    cases.push_back({{2, 0}, {range(0, 8), range(0, 12)}, {range(0, 8), range(3, 9)}});
    for (const Case& c : cases) {
        std::vector<int64_t> qRows, kvRows, qMap, kvMap, lq, lkv;
        for (size_t s = 0; s < c.seqs.size(); ++s) {
            for (int64_t x : c.qPos[s]) qRows.push_back(starts[size_t(c.seqs[s])] + x), qMap.push_back(x);
            for (int64_t x : c.kvPos[s]) kvRows.push_back(starts[size_t(c.seqs[s])] + x), kvMap.push_back(x);
            lq.push_back(int64_t(qRows.size()));
            lkv.push_back(int64_t(kvRows.size()));
        }
        const Buf sq = takeRows(q, qRows, 0, N, true), sk = takeRows(k, kvRows, 0, N, true);
        const Buf sv = takeRows(v, kvRows, 0, N, true);
        Outputs o = outputsFor(sq, sv, ATTNOPS_FLOAT32, true);
        ExtrasHolder ex;
        ex.e.dropGlobal = 1;
        ex.e.dropHeadNum = N;
        ex.rows(qMap, kvMap);
        ex.tnd(cum, cum, c.seqs);
        const IntArray aq(lq), akv(lkv);
        attnops::fa::ForwardArgs a;
        a.query = sq.h();
        a.key = sk.h();
        a.value = sv.h();
        a.attentionOut = o.out.h();
        a.actualSeqQLen = aq.get();
        a.actualSeqKvLen = akv.get();
        a.keepProb = kKeep;
        a.seed = kSeed;
        a.offset = kOffset;
        a.headNum = N;
        a.inputLayout = "TND";
        a.extras = &ex.e;
        const attnops::fa::ForwardParams p = attnops::fa::checkForward(a, 0);
        int64_t mismatches = 0, total = 0;
        for (size_t s = 0; s < c.seqs.size(); ++s) {
            const int64_t g = c.seqs[s], len = lens[size_t(g)];
            int64_t base = 0;
            for (int64_t h = 0; h < g; ++h) base += N * lens[size_t(h)] * lens[size_t(h)];
            for (int64_t n = 0; n < N; ++n)
                for (size_t i = 0; i < c.qPos[s].size(); ++i) {
                    std::vector<uint8_t> keep(c.kvPos[s].size() + 1);
                    attnops::fa::dropoutKeepRow(p, int64_t(s), n, int64_t(i), 0, int64_t(c.kvPos[s].size()), keep.data());
                    for (size_t j = 0; j < c.kvPos[s].size(); ++j) {
                        const int64_t gi = base + (n * len + c.qPos[s][i]) * len + c.kvPos[s][j];
                        mismatches += (keep[j] != 0) != bit(mask, gi);
                        ++total;
                    }
                }
        }
        EXPECT_EQ(mismatches, 0);
        EXPECT_GT(total, 0);
    }
}

// ---------------------------------------------------------------- sharded calls

// Query-row shards with all keys: every shard's forward rows and dq rows equal the unsharded
// call's bit for bit (a row's computation does not depend on the other rows of its call), and the
// shards' dk/dv sum to the unsharded ones.
void expectShardedEqualsWhole(bool tnd) {
    const int64_t B = tnd ? 1 : 2, N = 4, N2 = 2, S = 24, D = 16;
    const std::vector<int64_t> lens = {10, 14};  // TND: two sequences (each shard takes rows of both)
    const std::vector<int64_t> qs = tnd ? std::vector<int64_t>{S, N, D} : std::vector<int64_t>{B, S, N, D};
    const std::vector<int64_t> ks = tnd ? std::vector<int64_t>{S, N2, D} : std::vector<int64_t>{B, S, N2, D};
    Buf q(ATTNOPS_FLOAT32, qs), k(ATTNOPS_FLOAT32, ks), v(ATTNOPS_FLOAT32, ks), dy(ATTNOPS_FLOAT32, qs);
    fillRandom(q, 7);
    fillRandom(k, 8);
    fillRandom(v, 9);
    fillRandom(dy, 10);
    const IntArray cum(std::vector<int64_t>{10, 24});
    Outputs whole = outputsFor(q, v, ATTNOPS_FLOAT32, tnd);
    ASSERT_EQ(forward(q, k, v, N, tnd, tnd ? &cum : nullptr, tnd ? &cum : nullptr, nullptr, whole), ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    Grads wg = gradsLike(q, k, v, ATTNOPS_FLOAT32);
    ASSERT_EQ(backward(q, k, v, dy, whole, N, tnd, tnd ? &cum : nullptr, tnd ? &cum : nullptr, nullptr, wg),
              ATTNOPS_SUCCESS)
        << attnopsGetLastErrorMessage();
    for (int64_t w : {2, 3}) {
        std::vector<double> dkSum(size_t(k.numel()), 0.0), dvSum(size_t(v.numel()), 0.0);
        for (int64_t r = 0; r < w; ++r) {
            // Global rows of this shard: zigzag per sequence (TND) or of the sequence.
            std::vector<int64_t> rows, map, lq;
            if (tnd) {
                int64_t start = 0;
                for (int64_t len : lens) {
                    // contiguous shares of unequal size (len / w rows, the last takes the rest)
                    const int64_t c = len / w, a = r * c, e = r == w - 1 ? len : a + c;
                    for (int64_t x = a; x < e; ++x) rows.push_back(start + x), map.push_back(x);
                    lq.push_back(int64_t(rows.size()));
                    start += len;
                }
            } else {
                rows = w == 2 ? zigzag(S, 2, r) : range(r * S / w, (r + 1) * S / w);
                map = rows;
            }
            const Buf lq_ = takeRows(q, rows, 0, N, tnd), ldy = takeRows(dy, rows, 0, N, tnd);
            ExtrasHolder ex;
            ex.e.dropGlobal = 1;
            ex.e.dropHeadNum = N;
            if (tnd) {
                ex.tnd({10, 24}, {10, 24}, {});
                ex.rows(map, concat(range(0, 10), range(0, 14)));
            } else {
                ex.e.dropQSeqLen = S;
                ex.e.dropKvSeqLen = S;
                ex.rows(map, range(0, S));
            }
            const IntArray aq(lq);
            Outputs o = outputsFor(lq_, v, ATTNOPS_FLOAT32, tnd);
            ASSERT_EQ(forward(lq_, k, v, N, tnd, tnd ? &aq : nullptr, tnd ? &cum : nullptr, &ex.e, o), ATTNOPS_SUCCESS)
                << attnopsGetLastErrorMessage();
            Grads g = gradsLike(lq_, k, v, ATTNOPS_FLOAT32);
            ASSERT_EQ(backward(lq_, k, v, ldy, o, N, tnd, tnd ? &aq : nullptr, tnd ? &cum : nullptr, &ex.e, g),
                      ATTNOPS_SUCCESS)
                << attnopsGetLastErrorMessage();
            const Buf wantOut = takeRows(whole.out, rows, 0, N, tnd), wantDq = takeRows(wg.dq, rows, 0, N, tnd);
            for (int64_t i = 0; i < o.out.numel(); ++i)
                ASSERT_EQ(o.out.get(i), wantOut.get(i)) << "W " << w << " rank " << r << " out element " << i;
            for (int64_t i = 0; i < g.dq.numel(); ++i)
                ASSERT_EQ(g.dq.get(i), wantDq.get(i)) << "W " << w << " rank " << r << " dq element " << i;
            for (int64_t i = 0; i < k.numel(); ++i) dkSum[size_t(i)] += g.dk.get(i);
            for (int64_t i = 0; i < v.numel(); ++i) dvSum[size_t(i)] += g.dv.get(i);
        }
        double maxRef = 0, maxErr = 0;
        for (int64_t i = 0; i < k.numel(); ++i) {
            maxRef = std::max({maxRef, std::fabs(double(wg.dk.get(i))), std::fabs(double(wg.dv.get(i)))});
            maxErr = std::max({maxErr, std::fabs(dkSum[size_t(i)] - wg.dk.get(i)), std::fabs(dvSum[size_t(i)] - wg.dv.get(i))});
        }
        EXPECT_LE(maxErr, 1e-5 * maxRef) << "W " << w << ": summed shard dk/dv vs unsharded";
        EXPECT_GT(maxRef, 0.0);
    }
}

TEST(FaCpExtras, ShardedForwardBackwardEqualUnshardedFixed) { expectShardedEqualsWhole(false); }
TEST(FaCpExtras, ShardedForwardBackwardEqualUnshardedTnd) { expectShardedEqualsWhole(true); }

TEST(FaCpExtras, ZeroExtrasAreThePlainCall) {
    const int64_t B = 1, N = 2, S = 20, D = 8;
    Buf q(ATTNOPS_FLOAT32, {B, S, N, D}), k(ATTNOPS_FLOAT32, {B, S, N, D}), v(ATTNOPS_FLOAT32, {B, S, N, D});
    fillRandom(q, 11);
    fillRandom(k, 12);
    fillRandom(v, 13);
    Outputs a = outputsFor(q, v, ATTNOPS_FLOAT32, false), b = outputsFor(q, v, ATTNOPS_FLOAT32, false);
    ExtrasHolder ex;
    ASSERT_EQ(forward(q, k, v, N, false, nullptr, nullptr, nullptr, a), ATTNOPS_SUCCESS);
    ASSERT_EQ(forward(q, k, v, N, false, nullptr, nullptr, &ex.e, b), ATTNOPS_SUCCESS);
    EXPECT_EQ(a.out.bytes, b.out.bytes);
    // Global geometry equal to the local problem: the plain bits too.
    Outputs c = outputsFor(q, v, ATTNOPS_FLOAT32, false);
    ex.e.dropGlobal = 1;
    ex.e.dropHeadNum = N;
    ex.e.dropQSeqLen = ex.e.dropKvSeqLen = S;
    ASSERT_EQ(forward(q, k, v, N, false, nullptr, nullptr, &ex.e, c), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    EXPECT_EQ(a.out.bytes, c.out.bytes);
}

// ---------------------------------------------------------------- fp32 outputs from half inputs

double maxAbsDiff(const Buf& a, const Buf& b) {
    double m = 0;
    for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.get(i)) - double(b.get(i))));
    return m;
}

Buf converted(const Buf& src, attnopsDataType dt) {
    Buf out(dt, src.shape);
    for (int64_t i = 0; i < src.numel(); ++i) out.set(i, src.get(i));
    return out;
}

TEST(FaCpExtras, Fp32OutputsAndGradientsFromHalfInputs) {
    for (attnopsDataType half : {ATTNOPS_BFLOAT16, ATTNOPS_FLOAT16}) {
        for (double keep : {1.0, kKeep}) {
            const int64_t B = 2, N = 4, N2 = 2, S = 33, D = 16;
            Buf q(half, {B, S, N, D}), k(half, {B, S, N2, D}), v(half, {B, S, N2, D}), dy(half, {B, S, N, D});
            fillRandom(q, 21);
            fillRandom(k, 22);
            fillRandom(v, 23);
            fillRandom(dy, 24);
            // fp32 results of the same (exactly representable) inputs: the target.
            const Buf q32 = converted(q, ATTNOPS_FLOAT32), k32 = converted(k, ATTNOPS_FLOAT32);
            const Buf v32 = converted(v, ATTNOPS_FLOAT32), dy32 = converted(dy, ATTNOPS_FLOAT32);
            Outputs want = outputsFor(q32, v32, ATTNOPS_FLOAT32, false);
            ASSERT_EQ(forward(q32, k32, v32, N, false, nullptr, nullptr, nullptr, want, keep), ATTNOPS_SUCCESS);
            Outputs got = outputsFor(q, v, ATTNOPS_FLOAT32, false), plain = outputsFor(q, v, half, false);
            ExtrasHolder ex;
            ASSERT_EQ(forward(q, k, v, N, false, nullptr, nullptr, &ex.e, got, keep), ATTNOPS_SUCCESS)
                << attnopsGetLastErrorMessage();
            ASSERT_EQ(forward(q, k, v, N, false, nullptr, nullptr, nullptr, plain, keep), ATTNOPS_SUCCESS);
            const double outErr = maxAbsDiff(got.out, want.out), halfErr = maxAbsDiff(plain.out, want.out);
            EXPECT_LE(outErr, 1e-5) << "fp32 output from half inputs vs the fp32 call";
            EXPECT_GT(halfErr, 10 * outErr) << "the half output is rounded; the fp32 one must not be";
            EXPECT_LE(maxAbsDiff(got.mx, want.mx), 1e-5);

            Grads wantG = gradsLike(q32, k32, v32, ATTNOPS_FLOAT32);
            ASSERT_EQ(backward(q32, k32, v32, dy32, want, N, false, nullptr, nullptr, nullptr, wantG, keep), ATTNOPS_SUCCESS);
            Grads g = gradsLike(q, k, v, ATTNOPS_FLOAT32);
            ASSERT_EQ(backward(q, k, v, dy, got, N, false, nullptr, nullptr, &ex.e, g, keep), ATTNOPS_SUCCESS)
                << attnopsGetLastErrorMessage();
            for (auto [a, b, name] : {std::tuple{&g.dq, &wantG.dq, "dq"}, std::tuple{&g.dk, &wantG.dk, "dk"},
                                      std::tuple{&g.dv, &wantG.dv, "dv"}})
                EXPECT_LE(maxAbsDiff(*a, *b), 2e-5) << name;

            // Accumulate: acc = X + grad, one fp32 addition per element.
            Grads acc = gradsLike(q, k, v, ATTNOPS_FLOAT32);
            for (Buf* t : {&acc.dq, &acc.dk, &acc.dv}) fillRandom(*t, 31);
            const Grads before = {converted(acc.dq, ATTNOPS_FLOAT32), converted(acc.dk, ATTNOPS_FLOAT32),
                                  converted(acc.dv, ATTNOPS_FLOAT32)};
            ex.e.accumulateGrads = 1;
            ASSERT_EQ(backward(q, k, v, dy, got, N, false, nullptr, nullptr, &ex.e, acc, keep), ATTNOPS_SUCCESS)
                << attnopsGetLastErrorMessage();
            for (auto [a, x, gr] : {std::tuple{&acc.dq, &before.dq, &g.dq}, std::tuple{&acc.dk, &before.dk, &g.dk},
                                    std::tuple{&acc.dv, &before.dv, &g.dv}})
                for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(a->get(i), x->get(i) + gr->get(i)) << i;
        }
    }
}

// The kernels that round P (and dS) to the half dtype before a product (bf16 pairs, AMX tiles)
// take a half problem only when its results are half too: fp32 results promise the fp32
// computation. "amx-emulated" runs on every CPU; "avx512-bf16" where the CPU has AVX512-BF16.
TEST(FaCpExtras, HalfRoundingKernelsRefuseFp32Results) {
    const int64_t B = 1, N = 2, S = 20, D = 16;
    Buf q(ATTNOPS_BFLOAT16, {B, S, N, D}), k(ATTNOPS_BFLOAT16, {B, S, N, D}), v(ATTNOPS_BFLOAT16, {B, S, N, D});
    Buf dy(ATTNOPS_BFLOAT16, {B, S, N, D});
    fillRandom(q, 41);
    fillRandom(k, 42);
    fillRandom(v, 43);
    fillRandom(dy, 44);
    for (const char* impl : {"amx-emulated", "avx512-bf16"}) {
        SCOPED_TRACE(impl);
        attnops::testsupport::ForcedImpl force(impl);
        Outputs half = outputsFor(q, v, ATTNOPS_BFLOAT16, false);
        if (forward(q, k, v, N, false, nullptr, nullptr, nullptr, half, 1.0) != ATTNOPS_SUCCESS) {
            EXPECT_EQ(std::string(impl), "avx512-bf16") << attnopsGetLastErrorMessage();  // only where the CPU lacks it
            continue;
        }
        ExtrasHolder ex;
        Outputs wide = outputsFor(q, v, ATTNOPS_FLOAT32, false);
        EXPECT_EQ(forward(q, k, v, N, false, nullptr, nullptr, &ex.e, wide, 1.0), ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
        EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find(impl), std::string::npos) << attnopsGetLastErrorMessage();
        Grads g = gradsLike(q, k, v, ATTNOPS_BFLOAT16);
        EXPECT_EQ(backward(q, k, v, dy, half, N, false, nullptr, nullptr, nullptr, g, 1.0), ATTNOPS_SUCCESS)
            << attnopsGetLastErrorMessage();
        for (Buf Grads::*wideOne : {&Grads::dq, &Grads::dk, &Grads::dv}) {
            Grads mixed = gradsLike(q, k, v, ATTNOPS_BFLOAT16);
            mixed.*wideOne = Buf(ATTNOPS_FLOAT32, (mixed.*wideOne).shape);
            EXPECT_EQ(backward(q, k, v, dy, half, N, false, nullptr, nullptr, &ex.e, mixed, 1.0),
                      ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION);
        }
    }
}

// ---------------------------------------------------------------- validation

TEST(FaCpExtras, InvalidExtrasNameTheField) {
    const int64_t B = 1, N = 2, S = 8, D = 8;
    Buf q(ATTNOPS_BFLOAT16, {B, S, N, D}), k(ATTNOPS_BFLOAT16, {B, S, N, D}), v(ATTNOPS_BFLOAT16, {B, S, N, D});
    fillRandom(q, 1);
    fillRandom(k, 2);
    fillRandom(v, 3);
    const auto expectError = [&](attnopsFlashAttentionExtras* e, const char* text, attnopsDataType outType = ATTNOPS_FLOAT32) {
        Outputs o = outputsFor(q, v, outType, false);
        EXPECT_NE(forward(q, k, v, N, false, nullptr, nullptr, e, o), ATTNOPS_SUCCESS) << text;
        EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find(text), std::string::npos) << attnopsGetLastErrorMessage();
    };
    ExtrasHolder ex;
    // The plain entry point keeps the aclnn rule: the output has the input dtype.
    expectError(nullptr, "attentionOut.dtype");
    ex.e.structSize = 3;
    expectError(&ex.e, "extras.structSize");
    ex.e.structSize = sizeof(attnopsFlashAttentionExtras);
    ex.e.dropGlobal = 2;
    expectError(&ex.e, "extras.dropGlobal");
    ex.e.dropGlobal = 1;
    ex.e.dropHeadNum = 1;
    expectError(&ex.e, "extras.dropHeadNum");
    ex.e.dropHeadNum = 2;
    ex.e.dropHeadOffset = -1;
    expectError(&ex.e, "extras.dropHeadOffset");
    ex.e.dropHeadOffset = 0;
    expectError(&ex.e, "extras.dropQSeqLen");
    ex.e.dropQSeqLen = ex.e.dropKvSeqLen = S;
    ex.rows(range(1, S + 1), range(0, S));  // row S is outside the global sequence
    expectError(&ex.e, "extras.dropQRows");
    ex.rows(range(0, S - 1), range(0, S));
    expectError(&ex.e, "extras.dropQRows.size");
    ex.e.dropQRows = ex.e.dropKvRows = nullptr;
    ex.e.dropKvRowOffset = 1;
    expectError(&ex.e, "extras.dropKvRows");
    ex.e.dropKvRowOffset = 0;
    ex.tnd({8}, {8}, {});
    expectError(&ex.e, "only used with inputLayout TND");
    ex.e.dropActualSeqQLen = ex.e.dropActualSeqKvLen = nullptr;
    ex.e.reserved = 1;
    expectError(&ex.e, "extras.reserved");
    ex.e.reserved = 0;
    Outputs ok = outputsFor(q, v, ATTNOPS_FLOAT32, false);
    EXPECT_EQ(forward(q, k, v, N, false, nullptr, nullptr, &ex.e, ok), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    // Accumulating needs fp32 gradients.
    Grads g = gradsLike(q, k, v, ATTNOPS_BFLOAT16);
    Buf dy(ATTNOPS_BFLOAT16, q.shape);
    ex.e.accumulateGrads = 1;
    EXPECT_NE(backward(q, k, v, dy, ok, N, false, nullptr, nullptr, &ex.e, g), ATTNOPS_SUCCESS);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("accumulateGrads"), std::string::npos)
        << attnopsGetLastErrorMessage();
    // TND needs the global cumulative lengths.
    Buf tq(ATTNOPS_FLOAT32, {S, N, D}), tk(ATTNOPS_FLOAT32, {S, N, D}), tv(ATTNOPS_FLOAT32, {S, N, D});
    Outputs to = outputsFor(tq, tv, ATTNOPS_FLOAT32, true);
    const IntArray cum(std::vector<int64_t>{S});
    ExtrasHolder te;
    te.e.dropGlobal = 1;
    te.e.dropHeadNum = N;
    EXPECT_NE(forward(tq, tk, tv, N, true, &cum, &cum, &te.e, to), ATTNOPS_SUCCESS);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("extras.dropActualSeqQLen"), std::string::npos)
        << attnopsGetLastErrorMessage();
    te.tnd({4, 8}, {4, 8}, {});
    EXPECT_NE(forward(tq, tk, tv, N, true, &cum, &cum, &te.e, to), ATTNOPS_SUCCESS);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("extras.dropSeqIndex"), std::string::npos)
        << attnopsGetLastErrorMessage();
    te.tnd({4, 8}, {4, 8}, {5});
    EXPECT_NE(forward(tq, tk, tv, N, true, &cum, &cum, &te.e, to), ATTNOPS_SUCCESS);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("extras.dropSeqIndex[0]"), std::string::npos)
        << attnopsGetLastErrorMessage();
    te.tnd({4, 8}, {4, 8}, {1});  // local sequence of 8 rows, global sequence 1 has 4
    EXPECT_NE(forward(tq, tk, tv, N, true, &cum, &cum, &te.e, to), ATTNOPS_SUCCESS);
    EXPECT_NE(std::string(attnopsGetLastErrorMessage()).find("extras.dropQRows"), std::string::npos)
        << attnopsGetLastErrorMessage();
}

}  // namespace
