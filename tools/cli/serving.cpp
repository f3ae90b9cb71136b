// The demo's serving step. Requests with log-normal prompt lengths and tens of generated tokens:
// one causal prefill of all prompts (FIA, TND, sparse mode 3), whose keys and values are appended
// into two paged caches (BnBsH: bf16, and int8 with per-token scales computed as each token
// arrives); then every request decodes one token per step (FIA, BSH, Q_S = 1, actualSeqLengthsKv,
// blockTable) from each cache, its new K/V appended first. Pages are handed out as tokens arrive,
// so the requests' pages interleave as in a serving engine. Sampled steps and requests are checked
// against the double reference; the int8 check is against the dequantised cache (the operator's
// semantics), and the distance between the two caches' outputs shows what int8 costs.
#include "serving.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <numeric>
#include <string>
#include <vector>

#include "problem_fia.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

using tools::FiaInstance;
using tools::FiaProblem;
using tools::HostTensor;

struct ServingShape {
    int64_t requests;
    double promptMedian, promptSigma;  // log-normal prompt lengths, clamped
    int64_t promptMin, promptMax;
    int64_t genMin, genMax;            // generated tokens, uniform
    int64_t blockSize;
    int64_t checkEvery;                // decode steps between checks (the last step is checked too)
    int64_t checkRequests;             // requests checked per checked decode step
};
// The full step: 32 requests, 12,950 prompt tokens (65..1332), 2,052 generated. On the 2-vCPU
// AMD EPYC Zen 3 VM (the avx2 FIA kernel; load average 5, other engineers' builds running):
// 18.5 s, of which prefill 2.2 s (5,900 tokens/s) and decode 1.5 s from the bf16 cache (1,330
// tokens/s, 2.5 GB/s of KV read) and 0.9 s from the int8 one (2,200 tokens/s); the rest is input
// generation and the reference checks. --quick: under a second.
constexpr ServingShape kFull{32, 384.0, 0.7, 32, 2048, 32, 96, 128, 16, 3};
constexpr ServingShape kQuick{8, 64.0, 0.6, 16, 256, 8, 24, 32, 4, 2};

// A GQA model's attention layer: 32 query heads, 8 kv heads, D = 128 (Llama-3-8B's shape).
constexpr int64_t kHeads = 32, kKvHeads = 8, kDim = 128;
constexpr int64_t kCausalMode = 3;
constexpr uint64_t kServingSeed = 4242;
constexpr int64_t kPrefillCheckRequests = 2;

// Dynamic int8 quantisation of one token (all kv heads and dims): scale = max|x| / 127, no
// offset. The operator's per-token mode dequantises with (q + 0) * scale.
constexpr float kInt8Max = 127.0f;

double seconds(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Pages of a BnBsH cache handed out in arrival order, per request a list of physical blocks.
class PagedCache {
public:
    PagedCache(int64_t blocks, int64_t blockSize, int64_t requests, bool int8)
        : blockSize_(blockSize), int8_(int8), pages_(size_t(requests)), scales_(2, std::vector<std::vector<float>>(size_t(requests))) {
        const attnopsDataType type = int8 ? ATTNOPS_INT8 : ATTNOPS_BFLOAT16;
        key = HostTensor(type, {blocks, blockSize, kKvHeads * kDim});
        value = HostTensor(type, {blocks, blockSize, kKvHeads * kDim});
    }

    // Appends token `pos` (= the request's current length) of request r: k and v hold
    // kKvHeads * kDim values each.
    void append(int64_t r, int64_t pos, const std::vector<float>& k, const std::vector<float>& v) {
        std::vector<int32_t>& pages = pages_[size_t(r)];
        if (pos / blockSize_ >= int64_t(pages.size())) pages.push_back(int32_t(nextBlock_++));
        const int64_t base = (int64_t(pages[size_t(pos / blockSize_)]) * blockSize_ + pos % blockSize_) * kKvHeads * kDim;
        store(key, base, k, scales_[0][size_t(r)]);
        store(value, base, v, scales_[1][size_t(r)]);
    }

    // The call's blockTable [B, maxBlocks] (-1 past a request's pages) and, for int8, the
    // per-token scales [B, maxBlocks * blockSize] of K (which = 0) and V (1), for `active`.
    HostTensor blockTable(const std::vector<int64_t>& active) const {
        HostTensor t(ATTNOPS_INT32, {int64_t(active.size()), maxBlocks(active)});
        auto* d = static_cast<int32_t*>(t.data());
        for (size_t b = 0; b < active.size(); ++b)
            for (int64_t j = 0; j < maxBlocks(active); ++j) {
                const std::vector<int32_t>& pages = pages_[size_t(active[b])];
                d[int64_t(b) * maxBlocks(active) + j] = j < int64_t(pages.size()) ? pages[size_t(j)] : -1;
            }
        return t;
    }
    HostTensor scales(const std::vector<int64_t>& active, int which) const {
        const int64_t tokens = maxBlocks(active) * blockSize_;
        HostTensor t(ATTNOPS_FLOAT32, {int64_t(active.size()), tokens});
        for (size_t b = 0; b < active.size(); ++b) {
            const std::vector<float>& s = scales_[size_t(which)][size_t(active[b])];
            for (int64_t i = 0; i < tokens; ++i) t.set(int64_t(b) * tokens + i, i < int64_t(s.size()) ? s[size_t(i)] : 0.0f);
        }
        return t;
    }
    bool int8() const { return int8_; }

    HostTensor key, value;

private:
    int64_t maxBlocks(const std::vector<int64_t>& active) const {
        size_t m = 1;
        for (int64_t r : active) m = std::max(m, pages_[size_t(r)].size());
        return int64_t(m);
    }
    void store(HostTensor& t, int64_t base, const std::vector<float>& x, std::vector<float>& tokenScales) {
        if (!int8_) {
            for (size_t i = 0; i < x.size(); ++i) t.set(base + int64_t(i), x[i]);
            return;
        }
        float absMax = 0;
        for (float e : x) absMax = std::max(absMax, std::fabs(e));
        const float scale = absMax > 0 ? absMax / kInt8Max : 1.0f;
        auto* q = static_cast<int8_t*>(t.data()) + base;
        for (size_t i = 0; i < x.size(); ++i) q[i] = int8_t(std::lround(std::clamp(x[i] / scale, -kInt8Max, kInt8Max)));
        tokenScales.push_back(scale);
    }

    int64_t blockSize_;
    bool int8_;
    int64_t nextBlock_ = 0;
    std::vector<std::vector<int32_t>> pages_;
    std::vector<std::vector<std::vector<float>>> scales_;  // [K/V][request][token]
};

std::vector<int64_t> promptLengths(const ServingShape& s) {
    tools::Rng rng(kServingSeed);
    std::vector<int64_t> lengths;
    while (int64_t(lengths.size()) < s.requests) {
        const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();  // Box-Muller, u1 in (0, 1]
        const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        lengths.push_back(std::clamp(int64_t(std::llround(s.promptMedian * std::exp(s.promptSigma * normal))),
                                     s.promptMin, s.promptMax));
    }
    return lengths;
}

std::vector<int64_t> generationLengths(const ServingShape& s) {
    tools::Rng rng(kServingSeed + 1);
    std::vector<int64_t> lengths;
    for (int64_t r = 0; r < s.requests; ++r)
        lengths.push_back(s.genMin + int64_t(rng.next() % uint64_t(s.genMax - s.genMin + 1)));
    return lengths;
}

// The `count` requests whose prompts are nearest the median length: the prefill check's sample
// (the reference's cost grows with the square of the length; the longest prompts would dominate).
std::vector<int64_t> nearMedian(const std::vector<int64_t>& prompts, int64_t count) {
    std::vector<int64_t> order(prompts.size());
    std::iota(order.begin(), order.end(), int64_t(0));
    std::vector<int64_t> sorted = prompts;
    std::sort(sorted.begin(), sorted.end());
    const int64_t median = sorted[sorted.size() / 2];
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return std::llabs(prompts[size_t(a)] - median) < std::llabs(prompts[size_t(b)] - median);
    });
    order.resize(size_t(std::min<int64_t>(count, int64_t(order.size()))));
    return order;
}

// `count` request indices spread over [0, n).
std::vector<int64_t> spread(int64_t n, int64_t count) {
    std::vector<int64_t> v;
    for (int64_t i = 0; i < std::min(n, count); ++i) v.push_back(i * n / std::min(n, count));
    return v;
}

// A token's K or V row as the model would produce it: bf16 values, deterministic per
// (request, position, K/V).
std::vector<float> newTokenRow(int64_t r, int64_t pos, int which) {
    tools::Rng rng(kServingSeed * 31 + uint64_t(r) * 1000003 + uint64_t(pos) * 7 + uint64_t(which));
    HostTensor round(ATTNOPS_BFLOAT16, {1});
    std::vector<float> row(size_t(kKvHeads * kDim));
    for (float& e : row) {
        round.set(0, rng.symmetric(1.0));
        e = round.get(0);
    }
    return row;
}

// The decode call of one cache for the active requests: BSH, one query row each.
FiaProblem decodeProblem(const ServingShape& s, const std::vector<int64_t>& lengths, bool int8) {
    FiaProblem p;
    p.layout = "BSH";
    p.batch = int64_t(lengths.size());
    p.qSeqLen = 1;
    p.kvLens = lengths;
    p.kvSeqLen = *std::max_element(lengths.begin(), lengths.end());
    p.heads = kHeads;
    p.kvHeads = kKvHeads;
    p.dim = kDim;
    p.dtype = ATTNOPS_BFLOAT16;
    p.maskKind = "none";
    p.cache = "BnBsH";
    p.blockSize = s.blockSize;
    p.int8Kv = int8;
    p.keyQuantMode = p.valueQuantMode = 1;  // per token
    p.quantOffset = false;
    p.lse = false;
    return p;
}

struct DecodeTotals {
    double seconds = 0, kvBytes = 0;
    int64_t tokens = 0, checkedRows = 0;
    double worst = 0;  // max error / tolerance over the checks
    std::string implementation, failure;
    bool passed = true;
};

}  // namespace

ServingResult runServing(bool quick, bool json, int32_t threads, size_t step, size_t steps) {
    const ServingShape& s = quick ? kQuick : kFull;
    const std::vector<int64_t> prompts = promptLengths(s), gens = generationLengths(s);
    const int64_t promptTokens = std::accumulate(prompts.begin(), prompts.end(), int64_t(0));
    const int64_t genTokens = std::accumulate(gens.begin(), gens.end(), int64_t(0));
    const int64_t maxGen = *std::max_element(gens.begin(), gens.end());

    // Prefill: every prompt in one packed causal call.
    FiaProblem pp;
    pp.layout = "TND";
    pp.qLens = pp.kvLens = prompts;
    pp.heads = kHeads;
    pp.kvHeads = kKvHeads;
    pp.dim = kDim;
    pp.dtype = ATTNOPS_BFLOAT16;
    pp.sparseMode = kCausalMode;
    pp.lse = false;
    FiaInstance prefill(pp);
    const Timing prefillTiming = timeCalls([&] { return prefill.run(); }, 1, 0);
    const std::string prefillKernel = tools::lastImplementation();
    const double prefillSeconds = prefillTiming.ms.front() * 1e-3, prefillFlops = tools::fiaForwardFlops(pp);
    const tools::FiaCheck prefillCheck = tools::checkFiaBatches(prefill, nearMedian(prompts, kPrefillCheckRequests));

    // The caches: room for every request's prompt and generation.
    int64_t blocks = 0;
    for (int64_t r = 0; r < s.requests; ++r) blocks += (prompts[size_t(r)] + gens[size_t(r)] + s.blockSize - 1) / s.blockSize;
    PagedCache caches[2] = {PagedCache(blocks, s.blockSize, s.requests, false), PagedCache(blocks, s.blockSize, s.requests, true)};
    std::vector<int64_t> lengths(size_t(s.requests), 0);
    std::vector<float> k(size_t(kKvHeads * kDim)), v(k.size());
    int64_t row = 0;  // the prompt's first row in the packed K/V
    for (int64_t r = 0; r < s.requests; ++r) {
        for (int64_t t = 0; t < prompts[size_t(r)]; ++t, ++row) {
            for (size_t i = 0; i < k.size(); ++i) {
                k[i] = prefill.key.get(row * int64_t(k.size()) + int64_t(i));
                v[i] = prefill.value.get(row * int64_t(k.size()) + int64_t(i));
            }
            for (PagedCache& c : caches) c.append(r, t, k, v);
        }
        lengths[size_t(r)] = prompts[size_t(r)];
    }

    // Decode: one token per active request per step, from each cache.
    DecodeTotals totals[2];
    double int8Distance = 0;  // max |int8-cache output - bf16-cache output|
    for (int64_t stepIndex = 0; stepIndex < maxGen; ++stepIndex) {
        std::vector<int64_t> active, activeLengths;
        for (int64_t r = 0; r < s.requests; ++r)
            if (gens[size_t(r)] > stepIndex) {
                for (int which = 0; which < 2; ++which) (which ? v : k) = newTokenRow(r, lengths[size_t(r)], which);
                for (PagedCache& c : caches) c.append(r, lengths[size_t(r)], k, v);
                activeLengths.push_back(++lengths[size_t(r)]);
                active.push_back(r);
            }
        HostTensor query(ATTNOPS_BFLOAT16, {int64_t(active.size()), 1, kHeads * kDim});
        tools::Rng rng(kServingSeed + 7 + uint64_t(stepIndex));
        for (int64_t i = 0; i < query.numel(); ++i) query.set(i, rng.symmetric(1.0));
        const bool check = stepIndex % s.checkEvery == 0 || stepIndex + 1 == maxGen;
        HostTensor outputs[2];
        for (int c = 0; c < 2; ++c) {
            PagedCache& cache = caches[c];
            FiaInstance call(decodeProblem(s, activeLengths, cache.int8()), FiaInstance::NoInputs{});
            std::swap(call.key, cache.key);
            std::swap(call.value, cache.value);
            std::swap(call.query, query);
            call.blockTable = cache.blockTable(active);
            if (cache.int8()) {
                call.keyScale = cache.scales(active, 0);
                call.valueScale = cache.scales(active, 1);
            }
            call.kvLensArg = activeLengths;
            call.passKvLens = true;
            call.attentionOut = HostTensor(ATTNOPS_BFLOAT16, {int64_t(active.size()), 1, kHeads * kDim});
            const auto t0 = std::chrono::steady_clock::now();
            const attnopsStatus st = call.run();
            const double callSeconds = seconds(t0);
            if (st != ATTNOPS_SUCCESS) throw CliError("serving decode: " + libraryError(st));
            DecodeTotals& tot = totals[c];
            tot.seconds += callSeconds;
            tot.kvBytes += tools::fiaKvBytes(call.problem);
            tot.tokens += int64_t(active.size());
            tot.implementation = tools::lastImplementation();
            if (check) {
                const tools::FiaCheck rc = tools::checkFiaBatches(call, spread(int64_t(active.size()), s.checkRequests));
                tot.checkedRows += rc.rows;
                if (rc.tolerance > 0) tot.worst = std::max(tot.worst, rc.maxAbsError / rc.tolerance);
                if (!rc.passed && tot.passed) tot.failure = fmt::format("decode step {}: {}", stepIndex + 1, rc.firstFailure);
                tot.passed = tot.passed && rc.passed;
            }
            std::swap(call.key, cache.key);
            std::swap(call.value, cache.value);
            std::swap(call.query, query);
            outputs[c] = std::move(call.attentionOut);
        }
        for (int64_t i = 0; i < outputs[0].numel(); ++i)
            int8Distance = std::max(int8Distance, double(std::fabs(outputs[0].get(i) - outputs[1].get(i))));
    }

    const bool passed = prefillCheck.passed && totals[0].passed && totals[1].passed;
    std::vector<int64_t> sorted = prompts;
    std::sort(sorted.begin(), sorted.end());
    const char* names[2] = {"bf16", "int8 (per-token scales)"};
    ServingResult result;
    result.passed = passed;
    nlohmann::json decode = nlohmann::json::array();
    for (int c = 0; c < 2; ++c)
        decode.push_back({{"cache", names[c]},
                          {"implementation", totals[c].implementation},
                          {"tokens", totals[c].tokens},
                          {"seconds", totals[c].seconds},
                          {"tokensPerSecond", double(totals[c].tokens) / totals[c].seconds},
                          {"kvBytes", totals[c].kvBytes},
                          {"kvGbPerSecond", totals[c].kvBytes / totals[c].seconds / 1e9},
                          {"checkedRows", totals[c].checkedRows},
                          {"worstErrorToTolerance", totals[c].worst},
                          {"passed", totals[c].passed}});
    result.summary = {{"requests", s.requests},
                      {"promptTokens", promptTokens},
                      {"generatedTokens", genTokens},
                      {"heads", kHeads},
                      {"kvHeads", kKvHeads},
                      {"dim", kDim},
                      {"blockSize", s.blockSize},
                      {"threads", threads},
                      {"prefill",
                       {{"implementation", prefillKernel},
                        {"seconds", prefillSeconds},
                        {"tokensPerSecond", double(promptTokens) / prefillSeconds},
                        {"gflops", prefillFlops / prefillSeconds / 1e9},
                        {"checkedRows", prefillCheck.rows},
                        {"passed", prefillCheck.passed}}},
                      {"decode", decode},
                      {"int8VsBf16MaxAbsDifference", int8Distance},
                      {"timingNote", "each call timed whole: check, plan, workspace, execute, synchronize"},
                      {"passed", passed}};
    if (!json) {
        fmt::print("step {}/{}: serving {} requests (prompts {}..{} tokens, median {}; {}..{} generated each), GQA "
                   "{}/{} D = {} bf16, paged BnBsH caches of block {}, {} threads; each call timed whole (check, plan, "
                   "workspace, execute)\n",
                   step, steps, s.requests, sorted.front(), sorted.back(), sorted[sorted.size() / 2],
                   *std::min_element(gens.begin(), gens.end()), maxGen,
                   kHeads, kKvHeads, kDim, s.blockSize, threads);
        fmt::print("  prefill: {} prompt tokens, causal (TND, sparse mode {}), kernel {}: {:.2f} s, {:.0f} tokens/s, "
                   "{:.1f} GFLOP/s; check {} rows of the {} requests nearest the median prompt: {}\n",
                   promptTokens, kCausalMode, prefillKernel, prefillSeconds, double(promptTokens) / prefillSeconds,
                   prefillFlops / prefillSeconds / 1e9, prefillCheck.rows, kPrefillCheckRequests,
                   prefillCheck.passed ? "PASS" : "FAIL -- " + prefillCheck.firstFailure);
        for (int c = 0; c < 2; ++c)
            fmt::print("  decode, {} cache: {} steps, {} tokens, kernel {}: {:.2f} s, {:.0f} tokens/s, {} of KV read; "
                       "check {} rows on sampled steps, worst error/tolerance {:.2f}: {}\n",
                       names[c], maxGen, totals[c].tokens, totals[c].implementation, totals[c].seconds,
                       double(totals[c].tokens) / totals[c].seconds,
                       formatBandwidth(totals[c].kvBytes, totals[c].seconds * 1e3), totals[c].checkedRows,
                       totals[c].worst, totals[c].passed ? "PASS" : "FAIL -- " + totals[c].failure);
        fmt::print("  int8 against bf16 cache outputs: max abs difference {:.3g} (the cost of int8 KV; the int8 check "
                   "is against the dequantised cache)\n",
                   int8Distance);
        std::fflush(stdout);
    }
    return result;
}

}  // namespace attnops::cli
