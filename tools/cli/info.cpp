// `attnops info`: library version, CPU features (and whether the OS grants AMX), the bf16 path
// and why, devices, usable cores and caches, and the FusedInferAttentionScore implementations this
// CPU runs (the planner takes the first one that accepts a problem).
#include <fmt/format.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "cpu/isa.hpp"
#include "ops/fused_infer_attention_score/kernel.hpp"
#include "peaks.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

const char* const kEnvironment[] = {"ATTNOPS_NUM_DEVICES", "ATTNOPS_NUM_THREADS", "ATTNOPS_LAUNCH_BLOCKING",
                                    "ATTNOPS_FORCE_IMPL", "ATTNOPS_BF16_PATH"};

std::string bytesText(uint64_t bytes) {
    if (bytes >= (uint64_t(1) << 30) && bytes % (uint64_t(1) << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
    if (bytes >= (uint64_t(1) << 20) && bytes % (uint64_t(1) << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
    if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
    return fmt::format("{} B", bytes);
}

}  // namespace

int runInfo(bool asJson) {
    const cpu::IsaFeatures& f = cpu::isa();
    int32_t count = 0;
    attnopsStatus st = attnopsGetDeviceCount(&count);
    if (st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
    std::vector<attnopsDeviceInfo> devices(size_t(std::max(count, 0)));
    for (int32_t i = 0; i < count; ++i)
        if ((st = attnopsGetDeviceInfo(i, &devices[size_t(i)])) != ATTNOPS_SUCCESS) throw CliError(libraryError(st));

    const std::pair<const char*, bool> features[] = {
        {"avx2", f.avx2},
        {"fma", f.fma},
        {"f16c", f.f16c},
        {"avx512f", f.avx512f},
        {"avx512bw", f.avx512bw},
        {"avx512vl", f.avx512vl},
        {"avx512bf16", f.avx512bf16},
        {"avx512fp16", f.avx512fp16},
        {"amx-tile", f.amxTile},
        {"amx-bf16", f.amxBf16},
        {"amx-fp16", f.amxFp16},
    };
    std::vector<std::pair<std::string, bool>> fiaKernels;  // in the planner's order
    for (const fia::ForwardKernel* k : fia::forwardKernels()) fiaKernels.emplace_back(k->name, k->available());
    std::vector<std::pair<std::string, std::string>> environment;
    for (const char* name : kEnvironment)
        if (const char* v = std::getenv(name)) environment.emplace_back(name, v);

    if (asJson) {
        nlohmann::json cpuJson = {{"brand", f.brand},
                                  {"vendor", f.vendor},
                                  {"amxGranted", f.amxGranted},
                                  {"amxStatus", f.amxStatus},
                                  {"bf16Path", tools::bf16PathText()}};
        for (const auto& [name, has] : features) cpuJson["features"][name] = has;
        for (const auto& [name, runs] : fiaKernels)
            cpuJson["fusedInferAttentionScoreImplementations"].push_back({{"name", name}, {"available", runs}});
        nlohmann::json devs = nlohmann::json::array();
        for (const attnopsDeviceInfo& d : devices)
            devs.push_back({{"index", d.index},
                            {"kind", d.kind == ATTNOPS_DEVICE_CPU ? "cpu" : "unknown"},
                            {"threads", d.threads},
                            {"usableCores", d.usableCores},
                            {"l1dBytes", d.l1dBytes},
                            {"l2Bytes", d.l2Bytes},
                            {"l3Bytes", d.l3Bytes}});
        nlohmann::json env = nlohmann::json::object();
        for (const auto& [name, v] : environment) env[name] = v;
        const nlohmann::json j = {
            {"version", attnopsVersion()}, {"cpu", cpuJson}, {"devices", devs}, {"environment", env}};
        fmt::print("{}\n", j.dump(2));
        return kExitOk;
    }

    fmt::print("attnops {}\n", attnopsVersion());
    fmt::print("cpu: {} ({})\n", f.brand.empty() ? "(brand string unavailable)" : f.brand, f.vendor);
    std::string have, lack;
    for (const auto& [name, has] : features) (has ? have : lack) += fmt::format(" {}", name);
    fmt::print("  features:{}\n", have.empty() ? " (none of the below)" : have);
    if (!lack.empty()) fmt::print("  missing: {}\n", lack.substr(1));
    fmt::print("  AMX tile data granted by the OS: {} ({}); kernels \"amx\" {}, \"amx-emulated\" only when forced\n",
               f.amxGranted ? "yes" : "no", f.amxStatus, f.amxGranted ? "available" : "unavailable");
    fmt::print("  bf16 path: {}\n", tools::bf16PathText());
    std::string fiaText;
    for (const auto& [name, runs] : fiaKernels) fiaText += fmt::format(" {}{}", name, runs ? "" : " (not on this CPU)");
    fmt::print("  FusedInferAttentionScore implementations, first that accepts a problem:{}\n", fiaText);
    if (!devices.empty()) {
        const attnopsDeviceInfo& d = devices.front();
        fmt::print("usable cores: {}\n", d.usableCores);
        fmt::print("caches: L1d {}, L2 {} per core; L3 {}\n", bytesText(d.l1dBytes), bytesText(d.l2Bytes),
                   bytesText(d.l3Bytes));
    }
    fmt::print("devices: {}\n", count);
    for (const attnopsDeviceInfo& d : devices)
        fmt::print("  device {}: {}, {} worker thread{}\n", d.index, d.kind == ATTNOPS_DEVICE_CPU ? "cpu" : "unknown",
                   d.threads, d.threads == 1 ? "" : "s");
    for (const auto& [name, v] : environment) fmt::print("environment: {}={}\n", name, v);
    return kExitOk;
}

}  // namespace attnops::cli
