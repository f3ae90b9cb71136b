// What the CLI's commands share: exit codes, library error text, the thread setting, timed
// forward runs and the printing of a reference check.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "problem.hpp"

namespace attnops::cli {

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;  // a reference check or a compare failed
constexpr int kExitError = 2;        // invalid problem, library error, unreadable input
constexpr int kExitUsage = 64;       // bad command line (EX_USAGE)

// An error the CLI reports as "error: <what>" with kExitError.
struct CliError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A CLI11 check for a floating-point flag whose unset value is NaN (--scale: "not given, the
// default"): refuses a NaN typed on the command line, which would otherwise mean the default.
std::string notNan(const std::string& text);

// "ATTNOPS_ERROR_INVALID_ARGUMENT: <the library's last message>".
std::string libraryError(attnopsStatus status);

// Sets device 0's worker threads (threads > 0) and returns the count the device now runs.
int32_t useThreads(int32_t threads);

// `warmUps` untimed calls, then `repeat` timed calls of the whole two-phase API (check, plan,
// workspace, execute, synchronize). Throws CliError with the library's message on failure.
struct Timing {
    int64_t warmUps = 0;
    std::vector<double> ms;
    double median() const;
    double min() const;
};
Timing timeForward(tools::FaInstance& inst, int64_t repeat, int64_t warmUps = 1);
// The same for any call returning a status (a backward, another operator).
Timing timeCalls(const std::function<attnopsStatus()>& call, int64_t repeat, int64_t warmUps = 1);
// {"warmUpRuns", "runsMs", "medianMs", "minMs"} and "median 1.2 ms of 3 runs after 1 warm-up (min ...)".
nlohmann::json timingJson(const Timing& t);
std::string timingText(const Timing& t);

// "1.234 ms" / "12.3 s" style durations, and rates.
std::string formatMs(double ms);
std::string formatRate(double flops, double ms);
std::string formatBandwidth(double bytes, double ms);  // "12.3 GB/s" (10^9 bytes)

nlohmann::json checkJson(const tools::RowCheck& rc);
// One line: rows, errors against the tolerance, PASS/FAIL (and the first failure).
std::string checkLine(const tools::RowCheck& rc);

}  // namespace attnops::cli
