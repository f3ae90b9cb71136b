// Shared pieces of the libFuzzer targets: a byte reader and tensors over buffers of exactly the
// bytes their shape and strides reach (so AddressSanitizer sees any access outside a view).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "attnops/attnops.h"

namespace attnops::fuzz {

class Bytes {
public:
    Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
    uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
    int64_t small(int64_t lo, int64_t hi) { return lo + int64_t(u8()) % (hi - lo + 1); }
    bool flag() { return (u8() & 1) != 0; }
    // Mostly small values, sometimes extremes.
    int64_t wide() {
        switch (u8() % 8) {
            case 0: return std::numeric_limits<int64_t>::max();
            case 1: return std::numeric_limits<int64_t>::min();
            case 2: return -small(0, 40);
            case 3: return int64_t(1) << small(0, 62);
            default: return small(0, 40);
        }
    }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

// A tensor over a buffer of exactly the bytes its shape and strides reach.
struct FuzzTensor {
    std::unique_ptr<uint8_t[]> bytes;
    attnopsTensor* handle = nullptr;
    FuzzTensor() = default;
    FuzzTensor(const FuzzTensor&) = delete;
    FuzzTensor& operator=(const FuzzTensor&) = delete;
    ~FuzzTensor() { attnopsDestroyTensor(handle); }

    void make(Bytes& in, attnopsDataType dtype, std::vector<int64_t> shape) {
        std::vector<int64_t> strides(shape.size());
        int64_t expect = 1, reach = 0;
        const bool padded = in.flag();
        for (size_t i = shape.size(); i-- > 0;) {
            strides[i] = padded ? expect + in.small(0, 2) : expect;
            expect = strides[i] * std::max<int64_t>(shape[i], 1);
        }
        bool empty = false;
        for (size_t i = 0; i < shape.size(); ++i) {
            if (shape[i] == 0) empty = true;
            reach += (shape[i] - 1) * strides[i];
        }
        const size_t elementBytes = attnopsDataTypeSize(dtype);
        const size_t n = empty ? 0 : size_t(reach + 1) * elementBytes;
        if (n > (size_t(64) << 20)) return;  // keep the fuzzer's memory bounded
        bytes.reset(n ? new uint8_t[n] : nullptr);
        for (size_t i = 0; i < n; ++i) bytes[i] = in.u8();
        attnopsCreateTensor(bytes.get(), dtype, int64_t(shape.size()), shape.data(), strides.data(), ATTNOPS_HOST_MEMORY,
                            &handle);
    }
};

struct FuzzArray {
    attnopsIntArray* handle = nullptr;
    ~FuzzArray() { attnopsDestroyIntArray(handle); }
    void make(Bytes& in, int64_t size) {
        std::vector<int64_t> v(static_cast<size_t>(size));
        int64_t acc = 0;
        for (auto& x : v) x = in.flag() ? (acc += in.small(0, 6)) : in.wide();
        attnopsCreateIntArray(v.data(), v.size(), &handle);
    }
};

// Phase 2 of a planned call (when planning succeeded) with a workspace of the planned size; the
// status of the work.
inline attnopsStatus execute(attnopsStatus planned, uint64_t ws, attnopsExecutor* exec,
                      attnopsStatus (*run)(void*, uint64_t, attnopsExecutor*, attnopsStream*)) {
    if (planned != ATTNOPS_SUCCESS) return planned;
    void* workspace = nullptr;
    if (ws > 0 && attnopsMalloc(ws, &workspace) != ATTNOPS_SUCCESS) {
        attnopsDestroyExecutor(exec);
        return ATTNOPS_ERROR_OUT_OF_MEMORY;
    }
    run(workspace, ws, exec, nullptr);
    const attnopsStatus st = attnopsStreamSynchronize(nullptr);
    attnopsFree(workspace);
    return st;
}

// Every call completes before the API returns, so a fault is reported at the call that made it.
inline void launchBlockingOnce() {
    static const bool set = setenv("ATTNOPS_LAUNCH_BLOCKING", "1", 1) == 0;
    (void)set;
}

// FlashAttentionScore inputs: the dtypes (one not floating) and layouts (valid ones, wrong case,
// empty) the targets draw from, and a layout's shape for (batch, seq, heads, dim).
inline const attnopsDataType kFloatTypes[] = {ATTNOPS_FLOAT32, ATTNOPS_FLOAT16, ATTNOPS_BFLOAT16, ATTNOPS_UINT8};
inline const char* const kLayouts[] = {"BSH", "SBH", "BSND", "BNSD", "TND", "bnsd", "tnd", ""};
constexpr int64_t kLayoutCount = int64_t(sizeof(kLayouts) / sizeof(kLayouts[0]));

inline std::vector<int64_t> layoutShape(const std::string& layout, int64_t b, int64_t s, int64_t n, int64_t d) {
    if (layout == "BSH") return {b, s, n * d};
    if (layout == "SBH") return {s, b, n * d};
    if (layout == "BSND") return {b, s, n, d};
    if (layout == "TND") return {s, n, d};
    return {b, n, s, d};
}

}  // namespace attnops::fuzz
