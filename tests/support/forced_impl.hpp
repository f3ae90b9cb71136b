// Environment settings for the duration of a scope: a generic one (ScopedEnv) and the forced
// implementation (ATTNOPS_FORCE_IMPL).
#pragma once

#include <cstdlib>
#include <string>

namespace attnops::testsupport {

// Sets the variable `name` to `value` for the scope, and unsets it at the end.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
    ~ScopedEnv() { unsetenv(name_); }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
};

class ForcedImpl : ScopedEnv {
public:
    explicit ForcedImpl(const char* name) : ScopedEnv("ATTNOPS_FORCE_IMPL", name) {}
};

}  // namespace attnops::testsupport
