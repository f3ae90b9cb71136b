// Tensor and int-array handle registries and helpers.
#include "core/handles.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace attnops {

HandleRegistry<attnopsTensor>& tensorRegistry() {
    static HandleRegistry<attnopsTensor> registry;
    return registry;
}

HandleRegistry<attnopsIntArray>& intArrayRegistry() {
    static HandleRegistry<attnopsIntArray> registry;
    return registry;
}

std::string dimsText(const int64_t* dims, size_t count) {
    return fmt::format("[{}]", fmt::join(dims, dims + count, ","));
}

std::string shapeString(const attnopsTensor& t) { return dimsText(t.shape.data(), size_t(t.rank)); }

const attnopsTensor* liveTensorOrNull(const attnopsTensor* t, const char* argument) {
    if (t == nullptr) return nullptr;
    if (!tensorRegistry().contains(t))
        invalidArgument(argument, fmt::format("{}", static_cast<const void*>(t)),
                        "not a live tensor handle (destroyed, or not made by attnopsCreateTensor)");
    return t;
}

const attnopsTensor& requireTensor(const attnopsTensor* t, const char* argument) {
    if (t == nullptr) nullArgument(argument);
    return *liveTensorOrNull(t, argument);
}

const attnopsIntArray* liveIntArrayOrNull(const attnopsIntArray* a, const char* argument) {
    if (a == nullptr) return nullptr;
    if (!intArrayRegistry().contains(a))
        invalidArgument(argument, fmt::format("{}", static_cast<const void*>(a)),
                        "not a live int-array handle (destroyed, or not made by attnopsCreateIntArray)");
    return a;
}

const attnopsTensor* optionalTensorOn(const attnopsTensor* t, const char* argument, int32_t device) {
    const attnopsTensor* r = liveTensorOrNull(t, argument);
    if (r && r->device != ATTNOPS_HOST_MEMORY && r->device != device)
        invalidArgument(fmt::format("{}.device", argument), r->device,
                        "must be ATTNOPS_HOST_MEMORY (-1) or the current device {}", device);
    return r;
}

const attnopsTensor& requireTensorOn(const attnopsTensor* t, const char* argument, int32_t device) {
    if (t == nullptr) nullArgument(argument);
    return *optionalTensorOn(t, argument, device);
}

bool shapeIs(const attnopsTensor& t, const std::vector<int64_t>& shape) {
    if (t.rank != int(shape.size())) return false;
    for (int i = 0; i < t.rank; ++i)
        if (t.shape[size_t(i)] != shape[size_t(i)]) return false;
    return true;
}

std::string dimsText(const std::vector<int64_t>& dims) { return dimsText(dims.data(), dims.size()); }

}  // namespace attnops
