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

namespace {
[[noreturn]] void notLive(const attnopsExecutor* executor, const char* argument) {
    fail(ATTNOPS_ERROR_RUNTIME, fmt::format("{} = {}: not a live executor (already executed or destroyed, or not made by a "
                                            "GetWorkspaceSize call); executors are single-use",
                                            argument, static_cast<const void*>(executor)));
}
}  // namespace

size_t liveExecutorCount() { return registry().size(); }

std::unique_ptr<attnopsExecutor> takeExecutor(attnopsExecutor* executor, const char* argument) {
    if (executor == nullptr) nullArgument(argument);
    if (!registry().remove(executor)) notLive(executor, argument);
    return std::unique_ptr<attnopsExecutor>(executor);
}

const attnopsExecutor& liveExecutor(const attnopsExecutor* executor, const char* argument) {
    if (executor == nullptr) nullArgument(argument);
    if (!registry().contains(executor)) notLive(executor, argument);
    return *executor;
}

}  // namespace attnops
