// Platform information (usable cores, cache sizes), obtained lazily on first need and never 0:
// the cold-start failure of upstream (core count read as 0 before platform info existed) cannot
// happen here.
#pragma once

#include <cstdint>
#include <string>

namespace attnops {

struct PlatformInfo {
    int32_t usableCores = 1;  // affinity mask and cgroup CPU quota honoured; always >= 1
    uint64_t l1dBytes = 0;    // per-core data caches; defaults used when the OS does not say
    uint64_t l2Bytes = 0;
    uint64_t l3Bytes = 0;
};

// Thread-safe; probed once.
const PlatformInfo& platform();

// Reads an integer environment variable; `fallback` when unset or unparsable (with a warning).
int64_t envInt(const char* name, int64_t fallback);
bool envFlag(const char* name);
std::string envString(const char* name);

void logWarning(const std::string& message);

namespace testing {
// Tests only (internal): read the cgroup CPU quota files (cpu.max; cpu/cpu.cfs_quota_us and
// cpu/cpu.cfs_period_us) under `root` instead of /sys/fs/cgroup. Call before the first platform().
void setCgroupRoot(const std::string& root);
// Tests only (internal): read the cache sizes from <root>/cpu<N>/cache/index<i>/{level,type,size}
// instead of /sys/devices/system/cpu. Call before the first platform().
void setSysfsCpuRoot(const std::string& root);
}  // namespace testing

}  // namespace attnops
