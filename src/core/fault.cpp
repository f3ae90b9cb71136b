// Allocation points: a countdown shared by every thread, off (-1) unless a test arms it.
#include "core/fault.hpp"

#include <atomic>
#include <new>

namespace attnops {
namespace {
std::atomic<int64_t> remaining{-1};  // < 0: off; 0: every point fails; n: n more points pass
std::atomic<int64_t> failed{0};
}  // namespace

bool allocationFails() noexcept {
    int64_t r = remaining.load(std::memory_order_relaxed);
    while (r > 0)
        if (remaining.compare_exchange_weak(r, r - 1, std::memory_order_relaxed)) return false;
    if (r < 0) return false;
    failed.fetch_add(1, std::memory_order_relaxed);
    return true;
}

void allocationPoint() {
    if (allocationFails()) throw std::bad_alloc();
}

namespace testing {

void failAllocationsAfter(int64_t n) {
    failed.store(0);
    remaining.store(n < 0 ? 0 : n);
}

void stopFailingAllocations() { remaining.store(-1); }

int64_t injectedFailures() { return failed.load(); }

}  // namespace testing
}  // namespace attnops
