// CPU devices, their queue threads, and the process-wide runtime.
#include "runtime/device.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/error.hpp"
#include "core/fault.hpp"

namespace attnops {

namespace {

// Bound on the freed blocks a device keeps for reuse (ATTNOPS_DEVICE_CACHE_MB overrides; 0 turns
// the cache off). Under AddressSanitizer nothing is kept, so that a use after attnopsFree is
// still reported.
#if defined(__SANITIZE_ADDRESS__)  // GCC
#define ATTNOPS_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)  // Clang
#define ATTNOPS_ADDRESS_SANITIZER 1
#endif
#endif
uint64_t cacheLimitBytes() {
#if defined(ATTNOPS_ADDRESS_SANITIZER)
    return 0;
#else
    constexpr int64_t kDefaultCacheMiB = 1024;
    const int64_t mib = envInt("ATTNOPS_DEVICE_CACHE_MB", kDefaultCacheMiB);
    return mib <= 0 ? 0 : uint64_t(std::min<int64_t>(mib, int64_t(1) << 30)) << 20;
#endif
}

}  // namespace

Device::Device(int32_t index, int32_t threads)
    : index_(index),
      threads_(threads),
      defaultStream_(std::make_shared<attnopsStream>(*this, true)),
      cacheLimit_(cacheLimitBytes()) {}

Device::~Device() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    if (queueThread_.joinable()) queueThread_.join();
    std::lock_guard<std::mutex> lock(allocMutex_);
    flushCache();
}

int32_t Device::threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
}

void Device::ensureQueueThread() {
    if (!queueThread_.joinable()) queueThread_ = std::thread([this] { queueLoop(); });
}

void Device::submit(const StreamPtr& stream, std::unique_ptr<attnopsExecutor> executor, void* workspace) {
    {
        std::lock_guard<std::mutex> lock(stream->mutex);
        ++stream->pending;
    }
    try {
        std::lock_guard<std::mutex> lock(mutex_);
        ensureQueueThread();
        allocationPoint();
        queue_.push_back(Task{stream, std::move(executor), workspace});
    } catch (...) {
        // Not queued: a synchronize must not wait for it.
        {
            std::lock_guard<std::mutex> lock(stream->mutex);
            --stream->pending;
        }
        stream->idle.notify_all();
        throw;
    }
    wake_.notify_one();
}

void Device::queueLoop() {
    for (;;) {
        Task task;
        int32_t threads = 0;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_ && queue_.empty()) return;
            task = std::move(queue_.front());
            queue_.pop_front();
            running_ = true;
            threads = threads_;
        }
        attnopsStatus status = ATTNOPS_SUCCESS;
        std::string message;
        try {
            // The pool belongs to this thread; a failure to make one is the task's error.
            if (!pool_ || pool_->size() != threads) {
                pool_.reset();
                allocationPoint();
                pool_ = std::make_unique<ThreadPool>(threads);
            }
            task.executor->run(task.workspace, *pool_);
        } catch (const StatusError& e) {
            status = e.status();
            message = e.what();
        } catch (const std::bad_alloc&) {
            status = ATTNOPS_ERROR_OUT_OF_MEMORY;
            message = "host allocation failed: out of memory";
        } catch (const std::exception& e) {
            status = ATTNOPS_ERROR_INTERNAL;
            message = std::string("internal error (please report): ") + e.what();
        }
        const std::string op = task.executor->opName();
        task.executor.reset();
        {
            std::lock_guard<std::mutex> lock(task.stream->mutex);
            if (status != ATTNOPS_SUCCESS && task.stream->errorStatus == ATTNOPS_SUCCESS) {
                task.stream->errorStatus = status;
                task.stream->errorMessage = op + ": " + message;
            }
            --task.stream->pending;
        }
        task.stream->idle.notify_all();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            running_ = false;
        }
        idle_.notify_all();
    }
}

void Device::drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && !running_; });
}

void Device::setThreads(int32_t threads) {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return queue_.empty() && !running_; });
    threads_ = threads;
}

// Blocks of kHugeBytes and more start on a 2 MiB boundary and are advised for transparent huge
// pages (Linux, MADV_HUGEPAGE: honoured where the system's policy is `madvise` or `always`, a no-op
// under `never`). KV caches and workspaces are read once per step from scattered pages; on 4 KiB
// pages every 4 KiB costs a TLB walk, nested in a VM. On the Intel Xeon VM with AMX (2 threads,
// B=32 x 4,096 paged decode, `attnops bench -w decode-` and `attnops run fused-infer-attention`
// with the system's policy set to `always` for the test, bench/results/intel-xeon-amx/NOTES.md)
// the caches on huge pages took about 0.88x (bf16 KV) and 0.83x (int8 KV) the time.
//
// Freed blocks of kMinCachedBytes and more are kept (up to cacheLimit_ bytes, the oldest given
// back first) and handed out again for a request of at least half their size: the aclnn pattern,
// a workspace allocated before each call and freed after it, otherwise maps fresh pages on every
// call and the kernel zeroes each on first touch. The fused backward of GQA 32/8 S=2048 fp32
// spent 11% of its time in those page faults (one thread, Intel Xeon with AMX, perf). A reused
// block holds whatever its last user left in it, as memory from malloc may.
void* Device::allocate(uint64_t bytes) {
    constexpr uint64_t kAlign = 64, kHugeBytes = uint64_t(2) << 20;
    uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < bytes || allocationFails()) return nullptr;
    const uint64_t align = rounded >= kHugeBytes ? kHugeBytes : kAlign;
    // aligned_alloc wants a whole number of alignments
    const uint64_t size = rounded == 0 ? kAlign : (rounded + align - 1) / align * align;
    if (size < rounded) return nullptr;
    try {
        std::lock_guard<std::mutex> lock(allocMutex_);
        if (void* p = reuse(size)) return p;
    } catch (const std::bad_alloc&) {
        return nullptr;
    }
    void* p = std::aligned_alloc(align, size);
    if (p == nullptr) {  // the cache's blocks back to the system, then once more
        {
            std::lock_guard<std::mutex> lock(allocMutex_);
            flushCache();
        }
        p = std::aligned_alloc(align, size);
        if (p == nullptr) return nullptr;
    }
#if defined(MADV_HUGEPAGE)
    if (align == kHugeBytes) (void)madvise(p, size, MADV_HUGEPAGE);  // advice only: its failure changes nothing
#endif
    try {
        std::lock_guard<std::mutex> lock(allocMutex_);
        allocations_[p] = Block{p, size};
    } catch (const std::bad_alloc&) {
        std::free(p);
        return nullptr;
    }
    return p;
}

// The smallest cached block of [size, 2 size] bytes, moved from the cache to allocations_.
void* Device::reuse(uint64_t size) {
    size_t best = cache_.size();
    for (size_t i = 0; i < cache_.size(); ++i)
        if (cache_[i].size >= size && cache_[i].size / 2 <= size &&
            (best == cache_.size() || cache_[i].size < cache_[best].size))
            best = i;
    if (best == cache_.size()) return nullptr;
    const Block b = cache_[best];
    allocations_[b.ptr] = b;  // may throw: the cache is unchanged then
    cache_.erase(cache_.begin() + std::ptrdiff_t(best));
    cached_ -= b.size;
    return b.ptr;
}

void Device::flushCache() {
    for (const Block& b : cache_) std::free(b.ptr);
    cache_.clear();
    cached_ = 0;
}

size_t Device::liveAllocations() {
    std::lock_guard<std::mutex> lock(allocMutex_);
    return allocations_.size();
}

uint64_t Device::cachedBytes() {
    std::lock_guard<std::mutex> lock(allocMutex_);
    return cached_;
}

bool Device::release(void* ptr) {
    constexpr uint64_t kMinCachedBytes = uint64_t(1) << 20;
    std::lock_guard<std::mutex> lock(allocMutex_);
    const auto it = allocations_.find(ptr);
    if (it == allocations_.end()) return false;
    const Block b = it->second;
    allocations_.erase(it);
    if (b.size < kMinCachedBytes || b.size > cacheLimit_) {
        std::free(ptr);
        return true;
    }
    try {
        cache_.push_back(b);
    } catch (const std::bad_alloc&) {
        std::free(ptr);
        return true;
    }
    cached_ += b.size;
    while (cached_ > cacheLimit_) {  // the oldest blocks back to the system
        std::free(cache_.front().ptr);
        cached_ -= cache_.front().size;
        cache_.erase(cache_.begin());
    }
    return true;
}

namespace {
thread_local int32_t currentDeviceIndex = 0;
}

Runtime::Runtime() {
    const PlatformInfo& info = platform();
    int64_t count = envInt("ATTNOPS_NUM_DEVICES", 1);
    if (count < 1 || count > 1024) {
        logWarning(fmt::format("ATTNOPS_NUM_DEVICES={} is outside [1, 1024]; using 1", count));
        count = 1;
    }
    int64_t threads = envInt("ATTNOPS_NUM_THREADS", 0);
    if (threads < 0 || threads > 4096) {
        logWarning(fmt::format("ATTNOPS_NUM_THREADS={} is outside [1, 4096]; using the default", threads));
        threads = 0;
    }
    if (threads == 0) threads = std::max<int64_t>(1, info.usableCores / count);
    for (int32_t i = 0; i < count; ++i) devices_.push_back(std::make_unique<Device>(i, int32_t(threads)));
}

Runtime& Runtime::get() {
    static Runtime* runtime = new Runtime();  // intentionally never destroyed (see header)
    return *runtime;
}

Device& Runtime::device(int32_t index, const char* argument) {
    if (index < 0 || index >= deviceCount())
        invalidArgument(argument, index, "must be a device index in [0, {}) (ATTNOPS_NUM_DEVICES)", deviceCount());
    return *devices_[size_t(index)];
}

Device& Runtime::currentDevice() { return device(currentDeviceIndex, "current device"); }
int32_t Runtime::currentIndex() const { return currentDeviceIndex; }
void Runtime::setCurrent(int32_t index) {
    device(index, "device");
    currentDeviceIndex = index;
}

StreamPtr Runtime::createStream(Device& device) {
    allocationPoint();
    auto stream = std::make_shared<attnopsStream>(device, false);
    std::lock_guard<std::mutex> lock(streamsMutex_);
    streams_[stream.get()] = stream;
    return stream;
}

StreamPtr Runtime::resolveStream(const attnopsStream* handle) {
    if (handle == nullptr) return currentDevice().defaultStream();
    std::lock_guard<std::mutex> lock(streamsMutex_);
    auto it = streams_.find(handle);
    if (it == streams_.end())
        invalidArgument("stream", fmt::format("{}", static_cast<const void*>(handle)),
                        "not a live stream (destroyed, or not made by attnopsStreamCreate); pass NULL for the default stream");
    return it->second;
}

StreamPtr Runtime::removeStream(const attnopsStream* handle) {
    std::lock_guard<std::mutex> lock(streamsMutex_);
    auto it = streams_.find(handle);
    if (it == streams_.end())
        invalidArgument("stream", fmt::format("{}", static_cast<const void*>(handle)),
                        "not a live stream (already destroyed, or not made by attnopsStreamCreate)");
    StreamPtr s = it->second;
    streams_.erase(it);
    return s;
}

}  // namespace attnops
