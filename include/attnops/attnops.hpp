// attnops C++ layer: RAII handles and exceptions over the C API. Header-only; everything here
// calls the functions of attnops.h and adds no semantics of its own.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"

namespace attnops {

// A failed status, with the library's message.
class Error : public std::runtime_error {
public:
    Error(attnopsStatus status, const std::string& message)
        : std::runtime_error(std::string(attnopsStatusName(status)) + ": " + message), status_(status) {}
    attnopsStatus status() const noexcept { return status_; }

private:
    attnopsStatus status_;
};

inline void check(attnopsStatus status) {
    if (status != ATTNOPS_SUCCESS) throw Error(status, attnopsGetLastErrorMessage());
}

// Owning handle of one C object.
template <typename T, attnopsStatus (*Destroy)(T*)>
class Handle {
public:
    Handle() = default;
    explicit Handle(T* raw) : raw_(raw) {}
    ~Handle() { reset(); }
    Handle(Handle&& o) noexcept : raw_(std::exchange(o.raw_, nullptr)) {}
    Handle& operator=(Handle&& o) noexcept {
        if (this != &o) {
            reset();
            raw_ = std::exchange(o.raw_, nullptr);
        }
        return *this;
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;

    T* get() const noexcept { return raw_; }
    T* release() noexcept { return std::exchange(raw_, nullptr); }
    void reset() noexcept {
        if (raw_) Destroy(raw_);
        raw_ = nullptr;
    }
    explicit operator bool() const noexcept { return raw_ != nullptr; }

private:
    T* raw_ = nullptr;
};

// A view of caller-owned memory. Strides in elements; empty strides mean contiguous.
class Tensor : public Handle<attnopsTensor, attnopsDestroyTensor> {
public:
    Tensor() = default;
    Tensor(void* data, attnopsDataType dtype, const std::vector<int64_t>& shape,
           const std::vector<int64_t>& strides = {}, int32_t device = ATTNOPS_HOST_MEMORY) {
        if (!strides.empty() && strides.size() != shape.size())
            throw Error(ATTNOPS_ERROR_INVALID_ARGUMENT, "strides must have as many entries as shape");
        attnopsTensor* raw = nullptr;
        check(attnopsCreateTensor(data, dtype, int64_t(shape.size()), shape.data(),
                                  strides.empty() ? nullptr : strides.data(), device, &raw));
        *this = Tensor(raw);
    }

private:
    explicit Tensor(attnopsTensor* raw) : Handle(raw) {}
};

class IntArray : public Handle<attnopsIntArray, attnopsDestroyIntArray> {
public:
    IntArray() = default;
    explicit IntArray(const std::vector<int64_t>& values) {
        attnopsIntArray* raw = nullptr;
        check(attnopsCreateIntArray(values.data(), values.size(), &raw));
        *this = IntArray(raw);
    }

private:
    explicit IntArray(attnopsIntArray* raw) : Handle(raw) {}
};

class Stream : public Handle<attnopsStream, attnopsStreamDestroy> {
public:
    // A new stream on the calling thread's current device.
    static Stream create() {
        attnopsStream* raw = nullptr;
        check(attnopsStreamCreate(&raw));
        return Stream(raw);
    }
    void synchronize() const { check(attnopsStreamSynchronize(get())); }

private:
    using Handle::Handle;
};

// Workspace memory from the current device.
class Workspace {
public:
    explicit Workspace(uint64_t bytes = 0) : bytes_(bytes) {
        if (bytes > 0) check(attnopsMalloc(bytes, &ptr_));
    }
    ~Workspace() { attnopsFree(ptr_); }
    Workspace(Workspace&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Workspace& operator=(Workspace&& o) noexcept {
        if (this != &o) {
            attnopsFree(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* data() const noexcept { return ptr_; }
    uint64_t size() const noexcept { return bytes_; }

private:
    void* ptr_ = nullptr;
    uint64_t bytes_ = 0;
};

// Every argument of FlashAttentionScore, with the C API's defaults. Pointers are borrowed.
struct FlashAttentionScoreArgs {
    const Tensor* query = nullptr;
    const Tensor* key = nullptr;
    const Tensor* value = nullptr;
    const Tensor* realShift = nullptr;
    const Tensor* dropMask = nullptr;
    const Tensor* attenMask = nullptr;
    const IntArray* prefix = nullptr;
    const IntArray* actualSeqQLen = nullptr;
    const IntArray* actualSeqKvLen = nullptr;
    const IntArray* qStartIdx = nullptr;
    const IntArray* kvStartIdx = nullptr;
    const Tensor* sink = nullptr;
    double scaleValue = 1.0;  // upstream default; pass 1/sqrt(D) for the usual scaling
    double keepProb = 1.0;
    int64_t preTokens = 2147483647;
    int64_t nextTokens = 2147483647;
    int64_t headNum = 0;
    std::string inputLayout = "BNSD";
    int64_t innerPrecise = 0;
    int64_t sparseMode = 0;
    int64_t pseType = 1;
    int64_t seed = 0;
    int64_t offset = 0;
    const Tensor* softmaxMax = nullptr;
    const Tensor* softmaxSum = nullptr;
    const Tensor* attentionOut = nullptr;
};

// Both phases on `stream` (NULL: default stream) with a workspace from the device; waits for the
// result when `synchronize` is true (otherwise the caller keeps `workspace` alive until then).
inline void flashAttentionScore(const FlashAttentionScoreArgs& a, attnopsStream* stream = nullptr,
                                Workspace* workspace = nullptr, bool synchronize = true) {
    auto raw = [](const auto* h) { return h ? h->get() : nullptr; };
    uint64_t bytes = 0;
    attnopsExecutor* executor = nullptr;
    check(attnopsFlashAttentionScoreGetWorkspaceSize(
        raw(a.query), raw(a.key), raw(a.value), raw(a.realShift), raw(a.dropMask), nullptr, raw(a.attenMask),
        raw(a.prefix), raw(a.actualSeqQLen), raw(a.actualSeqKvLen), raw(a.qStartIdx), raw(a.kvStartIdx), raw(a.sink),
        a.scaleValue, a.keepProb, a.preTokens, a.nextTokens, a.headNum, a.inputLayout.c_str(), a.innerPrecise,
        a.sparseMode, a.pseType, a.seed, a.offset, raw(a.softmaxMax), raw(a.softmaxSum), nullptr,
        raw(a.attentionOut), &bytes, &executor));
    Workspace local;
    Workspace& ws = workspace ? *workspace : local;
    if (ws.size() < bytes) {
        try {
            ws = Workspace(bytes);
        } catch (...) {
            attnopsDestroyExecutor(executor);
            throw;
        }
    }
    check(attnopsFlashAttentionScore(ws.data(), ws.size(), executor, stream));
    if (synchronize || !workspace) check(attnopsStreamSynchronize(stream));
}

}  // namespace attnops
