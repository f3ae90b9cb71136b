// The serving step of `attnops demo`: a batch of requests prefilled through
// FusedInferAttentionScore (TND, causal) and then decoded token by token from a paged bf16 cache
// and from a paged int8 one, with each new token's K/V appended into the pages.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

namespace attnops::cli {

struct ServingResult {
    nlohmann::json summary;  // the step's figures, for --json
    bool passed = false;
};

// Runs the step (--quick: a small batch), printing a few lines unless `json`; `step` / `steps`
// number it among the demo's steps.
ServingResult runServing(bool quick, bool json, int32_t threads, size_t step, size_t steps);

}  // namespace attnops::cli
