// C API: devices, streams, workspace memory, executors.
#include <fmt/format.h>

#include <memory>

#include "attnops/runtime.h"
#include "core/error.hpp"
#include "core/handles.hpp"
#include "cpu/isa.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"

using namespace attnops;

namespace {
// Throws (and clears) the first error stored on a stream by its queued work; the caller holds
// the stream's lock.
void raiseStoredError(attnopsStream& s) {
    if (s.errorStatus == ATTNOPS_SUCCESS) return;
    const attnopsStatus status = s.errorStatus;
    const std::string message = s.errorMessage;
    s.errorStatus = ATTNOPS_SUCCESS;
    s.errorMessage.clear();
    fail(status, message);
}
}  // namespace

extern "C" {

const char* attnopsVersion(void) { return ATTNOPS_VERSION_STRING; }

attnopsStatus attnopsGetDeviceCount(int32_t* count) {
    return guarded([&] {
        if (count == nullptr) nullArgument("count");
        *count = Runtime::get().deviceCount();
    });
}

attnopsStatus attnopsSetDevice(int32_t device) {
    return guarded([&] { Runtime::get().setCurrent(device); });
}

attnopsStatus attnopsGetDevice(int32_t* device) {
    return guarded([&] {
        if (device == nullptr) nullArgument("device");
        *device = Runtime::get().currentIndex();
    });
}

attnopsStatus attnopsGetDeviceInfo(int32_t device, attnopsDeviceInfo* info) {
    return guarded([&] {
        if (info == nullptr) nullArgument("info");
        Device& d = Runtime::get().device(device, "device");
        const PlatformInfo& p = platform();
        info->kind = ATTNOPS_DEVICE_CPU;
        info->index = device;
        info->threads = d.threads();
        info->usableCores = p.usableCores;
        info->l1dBytes = p.l1dBytes;
        info->l2Bytes = p.l2Bytes;
        info->l3Bytes = p.l3Bytes;
    });
}

attnopsStatus attnopsSetDeviceThreads(int32_t device, int32_t threads) {
    return guarded([&] {
        Device& d = Runtime::get().device(device, "device");
        if (threads < 1 || threads > 4096) invalidArgument("threads", threads, "must be in [1, 4096]");
        d.setThreads(threads);
    });
}

attnopsStatus attnopsDeviceSynchronize(int32_t device) {
    return guarded([&] {
        Device& d = Runtime::get().device(device, "device");
        d.drain();
        const StreamPtr s = d.defaultStream();
        std::lock_guard<std::mutex> lock(s->mutex);
        raiseStoredError(*s);
    });
}

attnopsStatus attnopsStreamCreate(attnopsStream** stream) {
    return guarded([&] {
        if (stream == nullptr) nullArgument("stream");
        *stream = nullptr;
        Runtime& rt = Runtime::get();
        *stream = rt.createStream(rt.currentDevice()).get();
    });
}

namespace {
// Waits for the stream, then returns (and clears) its first stored error.
void synchronizeStream(const StreamPtr& s) {
    std::unique_lock<std::mutex> lock(s->mutex);
    s->idle.wait(lock, [&] { return s->pending == 0; });
    raiseStoredError(*s);
}
}  // namespace

attnopsStatus attnopsStreamDestroy(attnopsStream* stream) {
    return guarded([&] {
        if (stream == nullptr) nullArgument("stream", "the default stream cannot be destroyed");
        const StreamPtr s = Runtime::get().removeStream(stream);
        std::unique_lock<std::mutex> lock(s->mutex);
        s->idle.wait(lock, [&] { return s->pending == 0; });
    });
}

attnopsStatus attnopsStreamSynchronize(attnopsStream* stream) {
    return guarded([&] { synchronizeStream(Runtime::get().resolveStream(stream)); });
}

attnopsStatus attnopsMalloc(uint64_t bytes, void** ptr) {
    return guarded([&] {
        if (ptr == nullptr) nullArgument("ptr");
        *ptr = nullptr;
        void* p = Runtime::get().currentDevice().allocate(bytes);
        if (p == nullptr) fail(ATTNOPS_ERROR_OUT_OF_MEMORY, fmt::format("attnopsMalloc({}): out of memory", bytes));
        *ptr = p;
    });
}

attnopsStatus attnopsFree(void* ptr) {
    return guarded([&] {
        if (ptr == nullptr) return;
        Runtime& rt = Runtime::get();
        for (int32_t i = 0; i < rt.deviceCount(); ++i)
            if (rt.device(i, "device").release(ptr)) return;
        invalidArgument("ptr", fmt::format("{}", ptr), "was not returned by attnopsMalloc (or was already freed)");
    });
}

attnopsStatus attnopsDestroyExecutor(attnopsExecutor* executor) {
    return guarded([&] {
        if (executor == nullptr) return;
        delete takeExecutor(executor, "executor").release();
    });
}

attnopsStatus attnopsGetExecutorImplementation(const attnopsExecutor* executor, const char** name) {
    return guarded([&] {
        if (name == nullptr) nullArgument("name");
        *name = liveExecutor(executor, "executor").implementation();
    });
}

}  // extern "C"

namespace attnops {

void launchExecutor(std::unique_ptr<attnopsExecutor> executor, void* workspace, uint64_t workspaceSize,
                    attnopsStream* stream) {
    const StreamPtr s = Runtime::get().resolveStream(stream);
    if (s->device.index() != executor->device)
        invalidArgument("stream", fmt::format("on device {}", s->device.index()),
                        "the executor was planned on device {}; use a stream of that device", executor->device);
    if (workspaceSize < executor->workspaceBytes)
        invalidArgument("workspaceSize", workspaceSize, "must be >= {} (the size phase 1 returned)", executor->workspaceBytes);
    if (executor->workspaceBytes > 0 && workspace == nullptr)
        nullArgument("workspace", fmt::format("{} bytes are required", executor->workspaceBytes));
    s->device.submit(s, std::move(executor), workspace);
    if (envFlag("ATTNOPS_LAUNCH_BLOCKING")) synchronizeStream(s);
}

}  // namespace attnops
