// Test support: running one (disabled) test of the current test binary in a fresh child
// process, for cold-start and environment tests. The child sees ATTNOPS_TEST_CHILD=1.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace attnops::testing {

using Environment = std::vector<std::pair<std::string, std::string>>;

// True inside a child started by runChild.
bool isChild();

struct ChildResult {
    int exitCode = -1;
    std::string output;  // stdout and stderr together
};

// Runs this test binary again with `--gtest_also_run_disabled_tests --gtest_filter=test`. The
// child's GTEST_* and ATTNOPS_* variables come from `env` only; everything else is inherited.
ChildResult runChild(const std::string& test, const Environment& env);

// Expects the child to exit 0 after running (not skipping) exactly its one test; returns its result.
ChildResult expectChildPasses(const std::string& test, const Environment& env);

}  // namespace attnops::testing
