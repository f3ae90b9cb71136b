// Live executors: phase 1 registers one, phase 2 (or attnopsDestroyExecutor) takes it out, so a
// second execute or a foreign pointer is an error instead of a crash.
#pragma once

#include <memory>

#include "attnops/runtime.h"
#include "runtime/executor.hpp"

namespace attnops {

attnopsExecutor* registerExecutor(std::unique_ptr<attnopsExecutor> executor);
// Executors planned and not yet executed or destroyed (tests: nothing leaks on a failure path).
size_t liveExecutorCount();
// Removes a live executor and returns its ownership; throws naming `argument` otherwise.
std::unique_ptr<attnopsExecutor> takeExecutor(attnopsExecutor* executor, const char* argument);
// A live executor, still owned by the caller; throws naming `argument` otherwise.
const attnopsExecutor& liveExecutor(const attnopsExecutor* executor, const char* argument);
// Checks, submits to the stream's device, and (ATTNOPS_LAUNCH_BLOCKING=1) waits.
void launchExecutor(std::unique_ptr<attnopsExecutor> executor, void* workspace, uint64_t workspaceSize,
                    attnopsStream* stream);

}  // namespace attnops
