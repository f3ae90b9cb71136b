// `attnops bench`: a named catalogue of workloads, timed (median after warm-up), reported in
// TFLOP/s (mask-aware FLOPs) or GB/s (compulsory traffic) with the ratio to this machine's peaks
// measured in the same run.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace attnops::cli {

struct BenchOptions {
    std::vector<std::string> workloads;   // names or prefixes; empty: the whole catalogue
    std::vector<std::string> dtypes = {"fp32", "bf16", "fp16"};
    std::vector<std::string> directions = {"fwd", "bwd"};
    std::vector<int64_t> sweep;           // extra BNSD workloads over these sequence lengths
    int64_t repeat = 5;
    int64_t warmUps = 1;
    bool quick = false;                   // shapes / 8 (a smoke run)
    bool list = false;
    bool noPeaks = false;
    bool json = false;
    std::string jsonFile;
    int32_t threads = 0;
};

void addBenchOptions(CLI::App& cmd, BenchOptions& o);
int runBench(const BenchOptions& o);

}  // namespace attnops::cli
