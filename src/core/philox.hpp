// Philox4x32-10 (Salmon et al., Random123) and the dropout keep-bit recipe of the spec
// (section 2.7a): the same construction as cuRAND's Philox uniform.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace attnops {

using PhiloxBlock = std::array<uint32_t, 4>;

// The round multipliers and the key schedule's Weyl increments (also the vector generators'
// constants: cpu/avx2/simd_avx2.hpp, Avx2::PhiloxKeep).
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;

inline PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key) {
    constexpr uint32_t kMul0 = kPhiloxMul0, kMul1 = kPhiloxMul1, kWeyl0 = kPhiloxWeyl0, kWeyl1 = kPhiloxWeyl1;
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = uint64_t(kMul0) * counter[0];
        uint64_t p1 = uint64_t(kMul1) * counter[2];
        counter = {uint32_t(p1 >> 32) ^ counter[1] ^ key[0], uint32_t(p1),
                   uint32_t(p0 >> 32) ^ counter[3] ^ key[1], uint32_t(p0)};
        key[0] += kWeyl0;
        key[1] += kWeyl1;
    }
    return counter;
}

// Generates keep bits of the flat dropout index space: element i uses word (i mod 4) of the
// Philox output for counter (low 64 bits = i/4, high 64 bits = offset), key = seed.
class DropoutBits {
public:
    DropoutBits(uint64_t seed, uint64_t offset, float keepProb)
        : DropoutBits(seed, offset, keepThreshold(keepProb), Threshold{}) {}
    // With keepThreshold(keepProb) computed once by the caller (a call costs 33 uniform()s).
    struct Threshold {};
    DropoutBits(uint64_t seed, uint64_t offset, uint64_t threshold, Threshold)
        : key_{uint32_t(seed), uint32_t(seed >> 32)}, offset_(offset), threshold_(threshold) {}

    // Uniform in (0, 1) as float32(float32(x) * 2^-32 + 2^-33).
    static float uniform(uint32_t x) { return float(x) * 2.3283064365386963e-10f + 1.1641532182693481e-10f; }

    // The smallest x in [0, 2^32] with !(uniform(x) < keepProb) (2^32: every word keeps), so that
    // uniform(x) < keepProb exactly when x < threshold: uniform is non-decreasing in x (a
    // correctly rounded conversion, an exact product by 2^-32, one rounded addition), so the test
    // fails on one upper range of x. An integer compare, the same for every target, instead of a
    // float conversion per word. NaN keepProb: 0 (nothing keeps, as uniform(x) < NaN).
    static uint64_t keepThreshold(float keepProb) {
        uint64_t lo = 0, hi = uint64_t(1) << 32;  // the answer is in [lo, hi]
        while (lo < hi) {
            const uint64_t mid = lo + (hi - lo) / 2;
            if (uniform(uint32_t(mid)) < keepProb)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo;
    }

    PhiloxBlock words(uint64_t group) const {
        return philox4x32_10({uint32_t(group), uint32_t(group >> 32), uint32_t(offset_), uint32_t(offset_ >> 32)},
                             key_);
    }

    // uniform(word) < keepProb, as the integer test (keepThreshold).
    bool keep(uint64_t index) const { return words(index >> 2)[index & 3] < threshold_; }

    // Keep flags (0/1) of the whole groups [group, group + groups) (4 elements each) into out,
    // one block at a time: the default of fill's WholeGroups.
    struct BlockByBlock {
        void operator()(const DropoutBits& bits, uint64_t group, int64_t groups, uint8_t* out) const {
            for (int64_t g = 0; g < groups; ++g) {
                const PhiloxBlock w = bits.words(group + uint64_t(g));
                for (int word = 0; word < 4; ++word) out[4 * g + word] = w[size_t(word)] < bits.threshold() ? 1 : 0;
            }
        }
    };

    // Writes keep flags (0/1) of elements [first, first + count) into out: the partial groups at
    // the ends here, the whole groups between through `whole` (BlockByBlock, or a vector
    // generator such as the AVX2 steps' Avx2::philoxKeep, which must give the same flags).
    template <class WholeGroups = BlockByBlock>
    void fill(uint64_t first, int64_t count, uint8_t* out, WholeGroups whole = {}) const {
        const int64_t head = std::min<int64_t>(count, int64_t((4 - (first & 3)) & 3));  // to a group boundary
        const int64_t groups = (count - head) / 4;
        partialGroup(first, head, out);
        if (groups > 0) whole(*this, (first + uint64_t(head)) >> 2, groups, out + head);
        const int64_t done = head + 4 * groups;
        partialGroup(first + uint64_t(done), count - done, out + done);
    }

    uint32_t key(int word) const { return key_[size_t(word)]; }
    uint64_t offset() const { return offset_; }
    uint64_t threshold() const { return threshold_; }

private:
    // Flags of [first, first + count), count < 4, all within one group.
    void partialGroup(uint64_t first, int64_t count, uint8_t* out) const {
        if (count <= 0) return;
        const PhiloxBlock w = words(first >> 2);
        for (int64_t e = 0; e < count; ++e) out[e] = w[(first + uint64_t(e)) & 3] < threshold_ ? 1 : 0;
    }

    std::array<uint32_t, 2> key_;
    uint64_t offset_;
    uint64_t threshold_;
};

}  // namespace attnops
