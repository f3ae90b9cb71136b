// The objects behind the public opaque handles, and a registry that tells live handles from
// stale or foreign pointers so that misuse is an error instead of a crash.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "attnops/runtime.h"
#include "attnops/tensor.h"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace attnops {

// Keeps the set of live objects of one handle kind. Lookups are O(1) and thread-safe.
template <typename T>
class HandleRegistry {
public:
    void add(const T* p) {
        std::lock_guard<std::mutex> lock(mutex_);
        live_.insert(p);
    }
    bool remove(const T* p) {
        std::lock_guard<std::mutex> lock(mutex_);
        return live_.erase(p) != 0;
    }
    bool contains(const T* p) const {
        std::lock_guard<std::mutex> lock(mutex_);
        return live_.count(p) != 0;
    }
    size_t size() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return live_.size();
    }

private:
    mutable std::mutex mutex_;
    std::unordered_set<const T*> live_;
};

}  // namespace attnops

struct attnopsTensor {
    void* data = nullptr;
    attnops::DType dtype = attnops::DType::F32;
    int32_t rank = 0;
    std::array<int64_t, ATTNOPS_MAX_RANK> shape{};
    std::array<int64_t, ATTNOPS_MAX_RANK> strides{};
    int32_t device = ATTNOPS_HOST_MEMORY;

    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < rank; ++i) n *= shape[i];
        return n;
    }
    bool isContiguous() const {
        int64_t expect = 1;
        for (int i = rank - 1; i >= 0; --i) {
            if (shape[i] != 1 && strides[i] != expect) return false;
            expect *= shape[i];
        }
        return true;
    }
};

struct attnopsIntArray {
    std::vector<int64_t> values;
};

namespace attnops {

HandleRegistry<attnopsTensor>& tensorRegistry();
HandleRegistry<attnopsIntArray>& intArrayRegistry();

// "[2,3,4]"
std::string dimsText(const int64_t* dims, size_t count);
std::string shapeString(const attnopsTensor& t);

// Resolves an optional tensor argument: NULL stays NULL, a live handle is returned, anything
// else is an error naming the argument.
const attnopsTensor* liveTensorOrNull(const attnopsTensor* t, const char* argument);
const attnopsTensor& requireTensor(const attnopsTensor* t, const char* argument);
const attnopsIntArray* liveIntArrayOrNull(const attnopsIntArray* a, const char* argument);

// Tensor arguments of an operator planned on `device`: live handles whose memory is host memory
// or that device's; errors name the argument.
const attnopsTensor& requireTensorOn(const attnopsTensor* t, const char* argument, int32_t device);
const attnopsTensor* optionalTensorOn(const attnopsTensor* t, const char* argument, int32_t device);

bool shapeIs(const attnopsTensor& t, const std::vector<int64_t>& shape);
std::string dimsText(const std::vector<int64_t>& dims);

}  // namespace attnops
