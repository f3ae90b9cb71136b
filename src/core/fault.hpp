// Allocation points and the fault injection behind them. Every allocation the library makes for a
// call (handles, sequence tables, plans, executors, queue entries, worker pools, workspace) first
// passes an allocation point, so that tests can make the N-th one fail and check that the call
// returns ATTNOPS_ERROR_OUT_OF_MEMORY with a message, leaks nothing and leaves the library usable.
// Internal: not in the public headers; tests reach it through the attnops_internal target.
#pragma once

#include <cstdint>

namespace attnops {

// True when an injected failure is due for this allocation (one relaxed load when none is armed).
bool allocationFails() noexcept;

// Throws std::bad_alloc when an injected failure is due (the API turns it into the OOM status).
void allocationPoint();

namespace testing {

// From now on the first `n` allocation points pass and every later one fails, on every thread,
// until stopFailingAllocations(). n >= 0.
void failAllocationsAfter(int64_t n);
void stopFailingAllocations();
// Allocation points that failed since the last failAllocationsAfter.
int64_t injectedFailures();

}  // namespace testing
}  // namespace attnops
