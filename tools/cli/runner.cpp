// Shared pieces of the CLI commands: timing, library errors, check reports.
#include "runner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

namespace attnops::cli {

std::string notNan(const std::string& text) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && std::isnan(v))
        return "NaN is not a value here (leave the flag out for the default); the library refuses a non-finite scaleValue";
    return "";
}

std::string libraryError(attnopsStatus status) {
    const std::string message = attnopsGetLastErrorMessage();
    return message.empty() ? attnopsStatusName(status) : fmt::format("{}: {}", attnopsStatusName(status), message);
}

int32_t useThreads(int32_t threads) {
    if (threads > 0) {
        const attnopsStatus st = attnopsSetDeviceThreads(0, threads);
        if (st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
    }
    attnopsDeviceInfo info{};
    const attnopsStatus st = attnopsGetDeviceInfo(0, &info);
    if (st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
    return info.threads;
}

double Timing::median() const {
    if (ms.empty()) return 0.0;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double Timing::min() const { return ms.empty() ? 0.0 : *std::min_element(ms.begin(), ms.end()); }

Timing timeForward(tools::FaInstance& inst, int64_t repeat, int64_t warmUps) {
    return timeCalls([&] { return inst.runForward(); }, repeat, warmUps);
}

Timing timeCalls(const std::function<attnopsStatus()>& call, int64_t repeat, int64_t warmUps) {
    auto once = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        const attnopsStatus st = call();
        const auto t1 = std::chrono::steady_clock::now();
        if (st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
        return std::chrono::duration<double, std::milli>(t1 - t0).count();
    };
    Timing t;
    for (t.warmUps = 0; t.warmUps < warmUps; ++t.warmUps) once();
    for (int64_t i = 0; i < repeat; ++i) t.ms.push_back(once());
    return t;
}

nlohmann::json timingJson(const Timing& t) {
    return {{"warmUpRuns", t.warmUps}, {"runsMs", t.ms}, {"medianMs", t.median()}, {"minMs", t.min()}};
}

std::string timingText(const Timing& t) {
    return fmt::format("median {} of {} run{} after {} warm-up{} (min {})", formatMs(t.median()), t.ms.size(),
                       t.ms.size() == 1 ? "" : "s", t.warmUps, t.warmUps == 1 ? "" : "s", formatMs(t.min()));
}

std::string formatMs(double ms) {
    return ms >= 10000.0 ? fmt::format("{:.2f} s", ms / 1000.0) : fmt::format("{:.3f} ms", ms);
}

std::string formatRate(double flops, double ms) {
    if (ms <= 0.0) return "- GFLOP/s";
    return fmt::format("{:.1f} GFLOP/s", flops / (ms * 1e-3) / 1e9);
}

std::string formatBandwidth(double bytes, double ms) {
    if (ms <= 0.0) return "- GB/s";
    return fmt::format("{:.1f} GB/s", bytes / (ms * 1e-3) / 1e9);
}

nlohmann::json checkJson(const tools::RowCheck& rc) {
    nlohmann::json j = {{"rows", rc.rows},
                        {"maxAbsError", rc.maxAbsError},
                        {"tolerance", rc.tolerance},
                        {"maxAbsNaiveError", rc.maxAbsNaiveError},
                        {"maxAbsReference", rc.maxAbsReference},
                        {"maxStatError", rc.maxStatError},
                        {"statTolerance", rc.statTolerance},
                        {"nanMismatch", rc.nanMismatch},
                        {"passed", rc.passed}};
    if (!rc.firstFailure.empty()) j["firstFailure"] = rc.firstFailure;
    return j;
}

std::string checkLine(const tools::RowCheck& rc) {
    std::string naive =
        rc.maxAbsNaiveError > 0 ? fmt::format(" (naive low precision {:.3g})", rc.maxAbsNaiveError) : "";
    std::string line = fmt::format(
        "{} rows, max abs error {:.3g} vs tolerance {:.3g}{}, statistics {:.3g} vs {:.3g}: {}", rc.rows, rc.maxAbsError,
        rc.tolerance, naive, rc.maxStatError, rc.statTolerance, rc.passed ? "PASS" : "FAIL");
    if (!rc.passed && !rc.firstFailure.empty()) line += " -- " + rc.firstFailure;
    return line;
}

}  // namespace attnops::cli
