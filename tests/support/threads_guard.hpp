// Restores a device's worker-thread count when the scope ends (tests that change it with
// attnopsSetDeviceThreads must not leak the change into the tests that follow).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "attnops/attnops.h"

namespace attnops::testsupport {

class ThreadsGuard {
public:
    explicit ThreadsGuard(int32_t device = 0) : device_(device) {
        attnopsDeviceInfo info{};
        EXPECT_EQ(attnopsGetDeviceInfo(device, &info), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
        threads_ = info.threads;
    }
    ~ThreadsGuard() {
        EXPECT_EQ(attnopsSetDeviceThreads(device_, threads_), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    ThreadsGuard(const ThreadsGuard&) = delete;
    ThreadsGuard& operator=(const ThreadsGuard&) = delete;
    int32_t original() const { return threads_; }

private:
    int32_t device_;
    int32_t threads_ = 1;
};

}  // namespace attnops::testsupport
