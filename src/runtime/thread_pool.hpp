// A fork-join pool: parallelFor runs a loop body over [0, n) on the pool's threads, the caller
// included. Used by one caller at a time (the device's queue thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace attnops {

class ThreadPool {
public:
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // A plan gives each of `planned` threads its own scratch: running it on more threads would
    // share scratch, so that is a runtime error telling the caller to plan again (the device's
    // thread count changed between the two phases).
    void requirePlannedFor(int planned) const;

    // Calls body(i, worker) for every i in [0, n); `worker` in [0, size()) identifies the thread
    // (for per-thread scratch). Items are claimed dynamically, so which thread runs an item varies:
    // bodies must write results that depend on i alone. The first exception is rethrown here.
    void parallelFor(int64_t n, const std::function<void(int64_t, int)>& body);

private:
    void workerLoop(int worker);
    void stopWorkers();
    void runItems(int worker);

    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    const std::function<void(int64_t, int)>* body_ = nullptr;
    int64_t count_ = 0;
    int64_t next_ = 0;
    int active_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
};

}  // namespace attnops
