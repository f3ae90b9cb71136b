// The one catalogue of failures inside attnops: a StatusError carries a public status and a message
// in the house style "<argument> = <value>: <rule broken>". The API layer turns it into a status.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <string>
#include <utility>

#include "attnops/status.h"

namespace attnops {

class StatusError : public std::exception {
public:
    StatusError(attnopsStatus status, std::string message) : status_(status), message_(std::move(message)) {}
    attnopsStatus status() const noexcept { return status_; }
    const char* what() const noexcept override { return message_.c_str(); }

private:
    attnopsStatus status_;
    std::string message_;
};

[[noreturn]] inline void fail(attnopsStatus status, std::string message) { throw StatusError(status, std::move(message)); }

// "<argument> = <value>: <rule>" with status INVALID_ARGUMENT.
template <typename Value, typename... Args>
[[noreturn]] void invalidArgument(const std::string& argument, const Value& value,
                                  fmt::format_string<Args...> rule, Args&&... args) {
    fail(ATTNOPS_ERROR_INVALID_ARGUMENT,
         fmt::format("{} = {}: {}", argument, value, fmt::format(rule, std::forward<Args>(args)...)));
}

template <typename... Args>
[[noreturn]] void unsupported(fmt::format_string<Args...> rule, Args&&... args) {
    fail(ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION, fmt::format(rule, std::forward<Args>(args)...));
}

[[noreturn]] inline void nullArgument(const std::string& argument, const std::string& why = "is required") {
    fail(ATTNOPS_ERROR_NULL_ARGUMENT, fmt::format("{} = NULL: {}", argument, why));
}

template <typename... Args>
[[noreturn]] void runtimeError(fmt::format_string<Args...> rule, Args&&... args) {
    fail(ATTNOPS_ERROR_RUNTIME, fmt::format(rule, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void internalError(fmt::format_string<Args...> rule, Args&&... args) {
    fail(ATTNOPS_ERROR_INTERNAL, "internal error (please report): " + fmt::format(rule, std::forward<Args>(args)...));
}

// Runs `body`, returning its status; any failure becomes a status plus the calling thread's
// last-error message. Nothing escapes a public entry point.
template <typename Body>
attnopsStatus guarded(Body&& body) noexcept;

void setLastError(attnopsStatus status, const std::string& message) noexcept;
void clearLastError() noexcept;

template <typename Body>
attnopsStatus guarded(Body&& body) noexcept {
    try {
        body();
        return ATTNOPS_SUCCESS;
    } catch (const StatusError& e) {
        setLastError(e.status(), e.what());
        return e.status();
    } catch (const std::bad_alloc&) {
        setLastError(ATTNOPS_ERROR_OUT_OF_MEMORY, "host allocation failed: out of memory");
        return ATTNOPS_ERROR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        setLastError(ATTNOPS_ERROR_INTERNAL, std::string("internal error (please report): ") + e.what());
        return ATTNOPS_ERROR_INTERNAL;
    } catch (...) {
        setLastError(ATTNOPS_ERROR_INTERNAL, "internal error (please report): unknown exception");
        return ATTNOPS_ERROR_INTERNAL;
    }
}

}  // namespace attnops
