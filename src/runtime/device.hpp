// CPU devices and streams. A device owns its worker pool, plan cache, workspace allocations and
// one queue thread that runs submitted operators in order; streams are in-order views of that
// queue that keep their own pending count and first error.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "attnops/runtime.h"
#include "runtime/executor.hpp"
#include "runtime/plan_cache.hpp"
#include "runtime/platform.hpp"
#include "runtime/thread_pool.hpp"

namespace attnops {
class Device;
}

struct attnopsStream {
    attnopsStream(attnops::Device& d, bool defaultStream) : device(d), isDefault(defaultStream) {}

    attnops::Device& device;
    const bool isDefault;
    std::mutex mutex;
    std::condition_variable idle;
    int64_t pending = 0;
    attnopsStatus errorStatus = ATTNOPS_SUCCESS;
    std::string errorMessage;
};

namespace attnops {

using StreamPtr = std::shared_ptr<attnopsStream>;

class Device {
public:
    Device(int32_t index, int32_t threads);
    ~Device();

    int32_t index() const { return index_; }
    int32_t threads() const;
    PlanCache& planCache() { return planCache_; }
    StreamPtr defaultStream() const { return defaultStream_; }

    // Queues `executor` on `stream`; returns at once. The executor is owned by the queue.
    void submit(const StreamPtr& stream, std::unique_ptr<attnopsExecutor> executor, void* workspace);
    // Waits until every stream of this device is idle.
    void drain();
    // Drains, then replaces the worker pool.
    void setThreads(int32_t threads);

    void* allocate(uint64_t bytes);
    bool release(void* ptr);
    size_t liveAllocations();  // attnopsMalloc blocks not yet freed
    uint64_t cachedBytes();    // freed blocks kept for reuse (see allocate)
    uint64_t cacheLimit() const { return cacheLimit_; }  // their bound (0 under AddressSanitizer)

private:
    struct Task {
        StreamPtr stream;
        std::unique_ptr<attnopsExecutor> executor;
        void* workspace = nullptr;
    };
    void queueLoop();
    void ensureQueueThread();  // caller holds mutex_

    const int32_t index_;
    int32_t threads_;
    PlanCache planCache_;
    StreamPtr defaultStream_;

    mutable std::mutex mutex_;
    std::condition_variable wake_, idle_;
    std::deque<Task> queue_;
    bool running_ = false;
    bool stop_ = false;
    std::unique_ptr<ThreadPool> pool_;  // the queue thread's alone: made (or remade) by it before a task
    std::thread queueThread_;

    struct Block {
        void* ptr;
        uint64_t size;  // as allocated (a whole number of its alignment)
    };
    void* reuse(uint64_t size);  // caller holds allocMutex_
    void flushCache();           // caller holds allocMutex_

    std::mutex allocMutex_;
    std::unordered_map<void*, Block> allocations_;  // live blocks
    std::vector<Block> cache_;                      // freed blocks, oldest first
    uint64_t cached_ = 0;
    const uint64_t cacheLimit_;
};

// The process-wide runtime: the devices (created on first use, from the environment) and the
// registry of live streams. Never destroyed, so work still queued at exit cannot touch freed state.
class Runtime {
public:
    static Runtime& get();

    int32_t deviceCount() const { return int32_t(devices_.size()); }
    Device& device(int32_t index, const char* argument);  // validated
    Device& currentDevice();
    int32_t currentIndex() const;
    void setCurrent(int32_t index);

    StreamPtr createStream(Device& device);
    // NULL means the current device's default stream; a stale handle is an error.
    StreamPtr resolveStream(const attnopsStream* handle);
    StreamPtr removeStream(const attnopsStream* handle);

private:
    Runtime();
    std::vector<std::unique_ptr<Device>> devices_;
    std::mutex streamsMutex_;
    std::unordered_map<const attnopsStream*, StreamPtr> streams_;
};

}  // namespace attnops
