// Philox4x32-10 (Salmon et al., Random123) and the dropout keep-bit recipe of the spec
// (section 2.7a): the same construction as cuRAND's Philox uniform.
#pragma once

#include <array>
#include <cstdint>

namespace attnops {

using PhiloxBlock = std::array<uint32_t, 4>;

inline PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
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
        : key_{uint32_t(seed), uint32_t(seed >> 32)}, offset_(offset), keepProb_(keepProb) {}

    // Uniform in (0, 1) as float32(float32(x) * 2^-32 + 2^-33).
    static float uniform(uint32_t x) { return float(x) * 2.3283064365386963e-10f + 1.1641532182693481e-10f; }

    PhiloxBlock words(uint64_t group) const {
        return philox4x32_10({uint32_t(group), uint32_t(group >> 32), uint32_t(offset_), uint32_t(offset_ >> 32)},
                             key_);
    }

    bool keep(uint64_t index) const { return uniform(words(index >> 2)[index & 3]) < keepProb_; }

    // Writes keep flags (0/1) of elements [first, first + count) into out.
    void fill(uint64_t first, int64_t count, uint8_t* out) const {
        int64_t done = 0;
        while (done < count) {
            uint64_t index = first + uint64_t(done);
            PhiloxBlock w = words(index >> 2);
            for (uint64_t lane = index & 3; lane < 4 && done < count; ++lane, ++done)
                out[done] = uniform(w[lane]) < keepProb_ ? 1 : 0;
        }
    }

private:
    std::array<uint32_t, 2> key_;
    uint64_t offset_;
    float keepProb_;
};

}  // namespace attnops
