// The object behind attnopsExecutor: a planned operator call, bound to one device, run once.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/thread_pool.hpp"

struct attnopsExecutor {
    virtual ~attnopsExecutor() = default;
    // Operator name used in asynchronous error messages ("FlashAttentionScore").
    virtual const char* opName() const = 0;
    // Name of the implementation the plan chose (a string with static storage).
    virtual const char* implementation() const = 0;
    // Runs the call on the device's pool; `workspace` holds at least workspaceBytes.
    virtual void run(void* workspace, attnops::ThreadPool& pool) = 0;

    int32_t device = 0;
    uint64_t workspaceBytes = 0;
};
