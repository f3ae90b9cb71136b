// Registry of live executors.
#include "runtime/executor_registry.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/fault.hpp"
#include "core/handles.hpp"

namespace attnops {
namespace {
HandleRegistry<attnopsExecutor>& registry() {
    static HandleRegistry<attnopsExecutor> r;
    return r;
}
}  // namespace

attnopsExecutor* registerExecutor(std::unique_ptr<attnopsExecutor> executor) {
    allocationPoint();
    registry().add(executor.get());
    return executor.release();
}

size_t liveExecutorCount() { return registry().size(); }

std::unique_ptr<attnopsExecutor> takeExecutor(attnopsExecutor* executor, const char* argument) {
    if (executor == nullptr) nullArgument(argument);
    if (!registry().remove(executor))
        fail(ATTNOPS_ERROR_RUNTIME, fmt::format("{} = {}: not a live executor (already executed or destroyed, or not made by a "
                                                "GetWorkspaceSize call); executors are single-use",
                                                argument, static_cast<void*>(executor)));
    return std::unique_ptr<attnopsExecutor>(executor);
}

}  // namespace attnops
