// Forces one implementation (ATTNOPS_FORCE_IMPL) for the duration of a scope.
#pragma once

#include <cstdlib>

namespace attnops::testsupport {

class ForcedImpl {
public:
    explicit ForcedImpl(const char* name) { setenv("ATTNOPS_FORCE_IMPL", name, 1); }
    ~ForcedImpl() { unsetenv("ATTNOPS_FORCE_IMPL"); }
    ForcedImpl(const ForcedImpl&) = delete;
    ForcedImpl& operator=(const ForcedImpl&) = delete;
};

}  // namespace attnops::testsupport
