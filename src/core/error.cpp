// Per-thread last-error message and status names.
#include <string>

#include "core/error.hpp"

namespace attnops {
namespace {
thread_local std::string lastErrorMessage;
}

void setLastError(attnopsStatus, const std::string& message) noexcept {
    try {
        lastErrorMessage = message;
    } catch (...) {
        lastErrorMessage.clear();
    }
}

void clearLastError() noexcept { lastErrorMessage.clear(); }

const char* lastError() noexcept { return lastErrorMessage.c_str(); }

}  // namespace attnops
