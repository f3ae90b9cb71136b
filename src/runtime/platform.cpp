// Usable-core detection (sched_getaffinity, cgroup v2 cpu.max, cgroup v1 CFS quota) and cache
// sizes (sysfs, then sysconf), with fallbacks.
#include "runtime/platform.hpp"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace attnops {
namespace {

// The CPUs this process may run on; false when the OS does not say.
bool allowedCpus(cpu_set_t* set) {
    CPU_ZERO(set);
    return sched_getaffinity(0, sizeof *set, set) == 0;
}

int affinityCores() {
    cpu_set_t set;
    if (allowedCpus(&set)) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? int(n) : 0;
}

std::string& cgroupRoot() {
    static std::string root = "/sys/fs/cgroup";
    return root;
}

// CPU quota in cores (rounded up), or 0 when there is none.
int cgroupQuotaCores() {
    const std::string& root = cgroupRoot();
    std::ifstream v2(root + "/cpu.max");
    if (v2) {
        std::string quota;
        double period = 0;
        if (v2 >> quota >> period && quota != "max" && period > 0) {
            double q = std::atof(quota.c_str());
            if (q > 0) return int(std::ceil(q / period));
        }
        return 0;
    }
    std::ifstream q1(root + "/cpu/cpu.cfs_quota_us"), p1(root + "/cpu/cpu.cfs_period_us");
    double q = 0, p = 0;
    if (q1 >> q && p1 >> p && q > 0 && p > 0) return int(std::ceil(q / p));
    return 0;
}

std::string& sysfsCpuRoot() {
    static std::string root = "/sys/devices/system/cpu";
    return root;
}

// The first CPU this process may run on (cache sizes can differ between core types: on hybrid
// parts an efficiency core's L2 is not a performance core's).
int firstAllowedCpu() {
    cpu_set_t set;
    if (!allowedCpus(&set)) return 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) return cpu;
    return 0;
}

// The size the kernel gives for this level's cache of `type` ("Data" or "Unified"), 0 if none.
uint64_t sysfsCacheBytes(int level, const char* type) {
    const std::string cpu = sysfsCpuRoot() + "/cpu" + std::to_string(firstAllowedCpu()) + "/cache/index";
    for (int index = 0; index < 8; ++index) {
        std::string base = cpu + std::to_string(index) + "/";
        std::ifstream lv(base + "level"), ty(base + "type"), sz(base + "size");
        int l = 0;
        std::string t, s;
        if (!(lv >> l) || !(ty >> t) || !(sz >> s)) continue;
        if (l != level || (t != type && t != "Unified")) continue;
        uint64_t value = std::strtoull(s.c_str(), nullptr, 10);
        if (!s.empty() && s.back() == 'K') value *= 1024;
        if (!s.empty() && s.back() == 'M') value *= 1024 * 1024;
        return value;
    }
    return 0;
}

// The kernel's sysfs first: it is the OS's view of this machine's (or this VM's) caches. glibc's
// sysconf comes second: on AMD it derives the L3 from CPUID and can report the whole package's
// (256 MiB on a 2-vCPU Zen 3 VM whose sysfs says 32 MiB).
uint64_t cacheBytes(int level, const char* type, int sysconfName, uint64_t fallback) {
    if (uint64_t s = sysfsCacheBytes(level, type); s > 0) return s;
    long v = sysconf(sysconfName);
    return v > 0 ? uint64_t(v) : fallback;
}

PlatformInfo probe() {
    PlatformInfo info;
    int cores = affinityCores();
    int quota = cgroupQuotaCores();
    if (quota > 0 && (cores == 0 || quota < cores)) cores = quota;
    if (cores <= 0) {
        logWarning("could not determine the number of usable cores; using 1");
        cores = 1;
    }
    info.usableCores = cores;
    info.l1dBytes = cacheBytes(1, "Data", _SC_LEVEL1_DCACHE_SIZE, 32 * 1024);
    info.l2Bytes = cacheBytes(2, "Unified", _SC_LEVEL2_CACHE_SIZE, 1024 * 1024);
    info.l3Bytes = cacheBytes(3, "Unified", _SC_LEVEL3_CACHE_SIZE, 8 * 1024 * 1024);
    return info;
}

}  // namespace

const PlatformInfo& platform() {
    static const PlatformInfo info = probe();
    return info;
}

namespace testing {
void setCgroupRoot(const std::string& root) { cgroupRoot() = root; }
void setSysfsCpuRoot(const std::string& root) { sysfsCpuRoot() = root; }
}  // namespace testing

void logWarning(const std::string& message) { std::fprintf(stderr, "attnops warning: %s\n", message.c_str()); }

int64_t envInt(const char* name, int64_t fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        logWarning(std::string(name) + "=" + text + " is not an integer; ignored");
        return fallback;
    }
    return v;
}

bool envFlag(const char* name) { return envInt(name, 0) != 0; }

std::string envString(const char* name) {
    const char* text = std::getenv(name);
    return text ? std::string(text) : std::string();
}

}  // namespace attnops
