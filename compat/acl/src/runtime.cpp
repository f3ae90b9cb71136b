// acl.h / acl_rt.h on attnops' runtime: devices, contexts, streams and memory. Device memory is
// host memory from the device's attnops pool, so every copy kind is a plain memory copy.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>

#include "shim.hpp"

namespace attnops::acl {
namespace {

std::atomic<bool> initialised{false};

struct Context {
    int32_t device;
};

void requireDevice(int32_t deviceId) {
    int32_t count = 0;
    attnops::check(attnopsGetDeviceCount(&count));
    if (deviceId < 0 || deviceId >= count)
        fail(ACL_ERROR_RT_INVALID_DEVICEID, "deviceId = {}: must be in [0, {}) (ATTNOPS_NUM_DEVICES sets the count)",
             deviceId, count);
}

void requirePointer(const void* p, const char* name) {
    if (p == nullptr) fail(ACL_ERROR_INVALID_PARAM, "{} = NULL: required", name);
}

void* allocate(size_t size) {
    if (size == 0) fail(ACL_ERROR_INVALID_PARAM, "size = 0: must be > 0");
    void* p = nullptr;
    attnops::check(attnopsMalloc(size, &p));
    return p;
}

bool knownPolicy(int policy) {
    const int placement = policy & 0xff;
    const int flags = policy & ~0xff;
    return placement <= ACL_MEM_MALLOC_HUGE1G_ONLY_P2P &&
           (flags & ~(ACL_MEM_TYPE_LOW_BAND_WIDTH | ACL_MEM_TYPE_HIGH_BAND_WIDTH)) == 0;
}

}  // namespace
}  // namespace attnops::acl

using namespace attnops::acl;

extern "C" {

aclError aclInit(const char* configPath) {
    return guardedRt("aclInit", [&] {
        if (configPath != nullptr && configPath[0] != '\0') {
            std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(configPath, "r"), std::fclose);
            if (!file) fail(ACL_ERROR_INVALID_FILE, "configPath = \"{}\": cannot be opened", configPath);
        }
        if (initialised.exchange(true))
            fail(ACL_ERROR_REPEAT_INITIALIZE, "called again without aclFinalize");
    });
}

aclError aclFinalize(void) {
    return guardedRt("aclFinalize", [&] {
        if (!initialised.exchange(false)) fail(ACL_ERROR_REPEAT_FINALIZE, "called without a preceding aclInit");
        int32_t count = 0;
        attnops::check(attnopsGetDeviceCount(&count));
        for (int32_t d = 0; d < count; ++d) attnopsDeviceSynchronize(d);  // stored errors are dropped, as a reset does
    });
}

aclError aclrtSetDevice(int32_t deviceId) {
    return guardedRt("aclrtSetDevice", [&] {
        requireDevice(deviceId);
        attnops::check(attnopsSetDevice(deviceId));
    });
}

aclError aclrtResetDevice(int32_t deviceId) {
    return guardedRt("aclrtResetDevice", [&] {
        requireDevice(deviceId);
        attnopsDeviceSynchronize(deviceId);  // waits; an error still stored on the device is dropped
    });
}

aclError aclrtGetDevice(int32_t* deviceId) {
    return guardedRt("aclrtGetDevice", [&] {
        requirePointer(deviceId, "deviceId");
        attnops::check(attnopsGetDevice(deviceId));
    });
}

aclError aclrtGetDeviceCount(uint32_t* count) {
    return guardedRt("aclrtGetDeviceCount", [&] {
        requirePointer(count, "count");
        int32_t n = 0;
        attnops::check(attnopsGetDeviceCount(&n));
        *count = uint32_t(n);
    });
}

aclError aclrtSynchronizeDevice(void) {
    return guardedRt("aclrtSynchronizeDevice", [&] {
        int32_t device = 0;
        attnops::check(attnopsGetDevice(&device));
        attnops::check(attnopsDeviceSynchronize(device));
    });
}

aclError aclrtCreateContext(aclrtContext* context, int32_t deviceId) {
    return guardedRt("aclrtCreateContext", [&] {
        requirePointer(context, "context");
        requireDevice(deviceId);
        attnops::check(attnopsSetDevice(deviceId));
        auto created = std::make_unique<Context>(Context{deviceId});
        registerObject(created.get(), Kind::Context);
        *context = created.release();
    });
}

aclError aclrtDestroyContext(aclrtContext context) {
    return guardedRt("aclrtDestroyContext", [&] {
        requirePointer(context, "context");
        if (!unregisterObject(context, Kind::Context))
            fail(ACL_ERROR_INVALID_PARAM, "context = {}: not a live context (destroyed twice?)", context);
        delete static_cast<Context*>(context);
    });
}

aclError aclrtSetCurrentContext(aclrtContext context) {
    return guardedRt("aclrtSetCurrentContext", [&] {
        requirePointer(context, "context");
        if (!isLive(context, Kind::Context)) fail(ACL_ERROR_INVALID_PARAM, "context = {}: not a live context", context);
        attnops::check(attnopsSetDevice(static_cast<Context*>(context)->device));
    });
}

aclError aclrtCreateStream(aclrtStream* stream) {
    return guardedRt("aclrtCreateStream", [&] {
        requirePointer(stream, "stream");
        attnopsStream* created = nullptr;
        attnops::check(attnopsStreamCreate(&created));
        *stream = created;
    });
}

aclError aclrtDestroyStream(aclrtStream stream) {
    return guardedRt("aclrtDestroyStream", [&] {
        requirePointer(stream, "stream");
        attnops::check(attnopsStreamDestroy(toAttnops(stream)));
    });
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
    return guardedRt("aclrtSynchronizeStream", [&] { attnops::check(attnopsStreamSynchronize(toAttnops(stream))); });
}

aclError aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy policy) {
    return guardedRt("aclrtMalloc", [&] {
        requirePointer(devPtr, "devPtr");
        if (!knownPolicy(int(policy)))
            fail(ACL_ERROR_INVALID_PARAM, "policy = {:#x}: not an aclrtMemMallocPolicy value", int(policy));
        *devPtr = allocate(size);
    });
}

aclError aclrtFree(void* devPtr) {
    return guardedRt("aclrtFree", [&] {
        requirePointer(devPtr, "devPtr");
        attnops::check(attnopsFree(devPtr));
    });
}

aclError aclrtMallocHost(void** hostPtr, size_t size) {
    return guardedRt("aclrtMallocHost", [&] {
        requirePointer(hostPtr, "hostPtr");
        *hostPtr = allocate(size);
    });
}

aclError aclrtFreeHost(void* hostPtr) {
    return guardedRt("aclrtFreeHost", [&] {
        requirePointer(hostPtr, "hostPtr");
        attnops::check(attnopsFree(hostPtr));
    });
}

aclError aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind) {
    return guardedRt("aclrtMemcpy", [&] {
        requirePointer(dst, "dst");
        requirePointer(src, "src");
        if (int(kind) < ACL_MEMCPY_HOST_TO_HOST || int(kind) > ACL_MEMCPY_INTER_DEVICE_TO_DEVICE)
            fail(ACL_ERROR_INVALID_PARAM, "kind = {}: not an aclrtMemcpyKind value", int(kind));
        if (count > destMax) fail(ACL_ERROR_INVALID_PARAM, "count = {}: must be <= destMax = {}", count, destMax);
        if (count > 0) std::memmove(dst, src, count);
    });
}

aclError aclrtMemset(void* devPtr, size_t maxCount, int32_t value, size_t count) {
    return guardedRt("aclrtMemset", [&] {
        requirePointer(devPtr, "devPtr");
        if (count > maxCount) fail(ACL_ERROR_INVALID_PARAM, "count = {}: must be <= maxCount = {}", count, maxCount);
        std::memset(devPtr, value, count);
    });
}

}  // extern "C"
