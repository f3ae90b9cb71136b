// Entry points of the `info` and `demo` commands (`run` is in flash_attention_cmd.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

namespace attnops::cli {

// `attnops info [--json]`; returns the exit status.
int runInfo(bool asJson);

struct DemoOptions {
    bool quick = false;
    bool json = false;
    int32_t threads = 0;
};

void addDemoOptions(CLI::App& cmd, DemoOptions& o);

// `attnops demo`: a packed varlen causal GQA batch, timed in slices and checked.
int runDemo(const DemoOptions& o);

}  // namespace attnops::cli
