// Fork-join thread pool.
#include "runtime/thread_pool.hpp"

#include "core/error.hpp"

namespace attnops {

ThreadPool::ThreadPool(int threads) {
    try {
        for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { workerLoop(w); });
    } catch (...) {
        stopWorkers();  // the workers already started, or std::thread's destructor would terminate
        throw;
    }
}

ThreadPool::~ThreadPool() { stopWorkers(); }

void ThreadPool::requirePlannedFor(int planned) const {
    if (size() > planned)
        runtimeError("the device has {} worker threads but the call was planned for {}; plan the call again "
                     "after attnopsSetDeviceThreads",
                     size(), planned);
}

void ThreadPool::stopWorkers() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::runItems(int worker) {
    for (;;) {
        int64_t item;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (next_ >= count_ || error_) return;
            item = next_++;
        }
        try {
            (*body_)(item, worker);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
        }
    }
}

void ThreadPool::workerLoop(int worker) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            ++active_;
        }
        runItems(worker);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            --active_;
        }
        done_.notify_all();
    }
}

void ThreadPool::parallelFor(int64_t n, const std::function<void(int64_t, int)>& body) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {
        for (int64_t i = 0; i < n; ++i) body(i, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        body_ = &body;
        count_ = n;
        next_ = 0;
        error_ = nullptr;
        ++generation_;
    }
    wake_.notify_all();
    runItems(0);
    std::exception_ptr error;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        // Every item has been claimed; wait for the workers still running theirs.
        done_.wait(lock, [&] { return active_ == 0; });
        next_ = count_;
        body_ = nullptr;
        error = error_;
        error_ = nullptr;
    }
    if (error) std::rethrow_exception(error);
}

}  // namespace attnops
