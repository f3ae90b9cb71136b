/* The attnops runtime: devices, streams, workspace memory and executors.
 *
 * A device owns worker threads, a plan cache and a workspace pool. A stream is an in-order
 * queue on one device; submitting work returns at once. Errors raised by queued work are kept
 * on the stream and returned, with the operator's name, by the next synchronize.
 *
 * Environment:
 *   ATTNOPS_NUM_DEVICES    number of CPU devices (default 1)
 *   ATTNOPS_NUM_THREADS    worker threads per CPU device (default: usable cores / devices, >= 1;
 *                          usable cores honour the affinity mask and the cgroup CPU quota)
 *   ATTNOPS_LAUNCH_BLOCKING=1  run every submitted operator before the submit call returns
 *   ATTNOPS_FORCE_IMPL     name of an implementation to force for every operator ("reference") */
#ifndef ATTNOPS_RUNTIME_H
#define ATTNOPS_RUNTIME_H

#include <stdint.h>

#include "attnops/export.h"
#include "attnops/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct attnopsStream attnopsStream;
typedef struct attnopsExecutor attnopsExecutor;

/* Version of the library, "MAJOR.MINOR.PATCH". */
ATTNOPS_API const char* attnopsVersion(void);

typedef ATTNOPS_ENUM(attnopsDeviceKind) { ATTNOPS_DEVICE_CPU = 0 } attnopsDeviceKind;

typedef struct attnopsDeviceInfo {
    attnopsDeviceKind kind;
    int32_t index;
    int32_t threads;          /* worker threads the device runs operators on */
    int32_t usableCores;      /* cores this process may use (affinity, cgroup quota), >= 1 */
    uint64_t l1dBytes;        /* per-core data cache sizes (a documented default when unknown) */
    uint64_t l2Bytes;
    uint64_t l3Bytes;
} attnopsDeviceInfo;

ATTNOPS_API attnopsStatus attnopsGetDeviceCount(int32_t* count);
/* Selects the calling thread's current device (default 0). */
ATTNOPS_API attnopsStatus attnopsSetDevice(int32_t device);
ATTNOPS_API attnopsStatus attnopsGetDevice(int32_t* device);
ATTNOPS_API attnopsStatus attnopsGetDeviceInfo(int32_t device, attnopsDeviceInfo* info);
/* Changes a device's worker-thread count (>= 1). Waits for the device's queued work first.
 * Results do not depend on the thread count: operators are deterministic. */
ATTNOPS_API attnopsStatus attnopsSetDeviceThreads(int32_t device, int32_t threads);
/* Waits for all work queued on the device (every stream); then returns, and clears, the error
 * stored on the device's default stream, if any (other streams report theirs at their own
 * synchronize). */
ATTNOPS_API attnopsStatus attnopsDeviceSynchronize(int32_t device);

/* Creates a stream on the calling thread's current device. */
ATTNOPS_API attnopsStatus attnopsStreamCreate(attnopsStream** stream);
/* Waits for the stream's queued work, then destroys it. The handle is invalid afterwards. An
 * error stored by that work and not yet read by attnopsStreamSynchronize is discarded:
 * synchronize first to see it. */
ATTNOPS_API attnopsStatus attnopsStreamDestroy(attnopsStream* stream);
/* Waits for the stream (NULL: the current device's default stream). Returns the first error
 * raised by queued work since the last synchronize, then clears it: the stream stays usable. */
ATTNOPS_API attnopsStatus attnopsStreamSynchronize(attnopsStream* stream);

/* Workspace memory (64-byte aligned) from the current device's pool. Blocks of 2 MiB and more
 * start on a 2 MiB boundary and, on Linux, are advised for transparent huge pages (madvise
 * MADV_HUGEPAGE): a KV cache or workspace allocated here is read through fewer TLB entries. */
ATTNOPS_API attnopsStatus attnopsMalloc(uint64_t bytes, void** ptr);
ATTNOPS_API attnopsStatus attnopsFree(void* ptr);

/* Releases an executor that will not be executed. Executing an executor consumes it. */
ATTNOPS_API attnopsStatus attnopsDestroyExecutor(attnopsExecutor* executor);

/* The name of the implementation a live (not yet executed) executor will run, e.g. "tiled-avx512"
 * or "reference" (the names ATTNOPS_FORCE_IMPL accepts; `attnops info` lists them). *name stays
 * valid for the life of the process. */
ATTNOPS_API attnopsStatus attnopsGetExecutorImplementation(const attnopsExecutor* executor, const char** name);

#ifdef __cplusplus
}
#endif

#endif
