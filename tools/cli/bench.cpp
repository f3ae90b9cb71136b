// `attnops bench`: the workload catalogue of issue 6, each workload timed per dtype and direction
// through the public two-phase API (median of repeated runs after warm-up), with the implementation
// that ran and the ratio to a peak of this machine measured in the same run (the higher of the
// start-up measurement and a sample right after the row, RowPeaks):
//   fp32 and fp16 attention -> the fp32 FMA peak (the fp16 paths compute in fp32),
//   bf16 attention          -> the peak of this CPU's bf16 path (AMX where granted, else
//                              AVX512-BF16 vdpbf16ps or the fp32 FMA peak, as cpu/bf16_path.hpp chose),
//   Block Attention Residuals -> the DRAM read bandwidth,
//   FusedInferAttentionScore decode -> the DRAM read bandwidth (GB/s of key/value cache read:
//                              the compulsory traffic of a decode step), and int8 KV against bf16
//                              KV on the same context,
//   FusedInferAttentionScore prefill -> FlashAttentionScore's forward on the same shape, timed
//                              just before it (fia-prefill-*: the ratio of the two rates).
#include "bench.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>
#include <utility>
#include <numbers>
#include <numeric>
#include <optional>

#include "cpu/isa.hpp"
#include "flash_attention_cmd.hpp"
#include "peaks.hpp"
#include "realistic_lengths.hpp"
#include "problem_bar.hpp"
#include "problem_fia.hpp"
#include "problem_grad.hpp"
#include "runner.hpp"

namespace attnops::cli {
namespace {

using nlohmann::json;

constexpr int64_t kCausal = 3;  // sparse mode 3: causal aligned bottom-right

struct Workload {
    std::string name;
    std::string description;
    bool bar = false;
    bool fia = false;  // a FusedInferAttentionScore decode step (bf16 query; the KV dtype in fiaProblem)
    tools::FaProblem fa;
    tools::BarProblem barProblem;
    tools::FiaProblem fiaProblem;
    // A FusedInferAttentionScore prefill (fiaProblem) timed right after FlashAttentionScore's
    // forward on the same shape (fa): the rate and the ratio to FA's (issue 14: >= 90%).
    bool fiaPrefill = false;
};

// A decode step of `requests` requests with `context` cached tokens each, GQA 32/8, D 128, a
// paged cache of 128-token blocks, bf16 query, bf16 or int8 KV (int8: per-channel bf16 scales, no
// offset, as vLLM-Ascend's C8). BnNBsD: each block of a kv head is one contiguous 32 KiB run;
// BnBsH (vLLM's and flash-attn's page layout): a block's token rows hold the 8 kv heads side by
// side.
tools::FiaProblem decodeStep(int64_t requests, int64_t context, bool int8Kv, const char* cache = "BnNBsD") {
    tools::FiaProblem p;
    p.layout = "BSND";
    p.batch = requests;
    p.qSeqLen = 1;
    p.kvLens.assign(size_t(requests), context);
    p.heads = 32;
    p.kvHeads = 8;
    p.dim = 128;
    p.dtype = ATTNOPS_BFLOAT16;
    p.cache = cache;
    p.blockSize = 128;
    p.int8Kv = int8Kv;
    p.quantOffset = false;
    p.lse = false;
    return p;
}

// A decode MLA step (DeepSeek, vLLM-Ascend's mla_v1): `requests` requests of `context` cached
// tokens, Q_N `heads`, KV_N 1, D 512 + rope 64, the key cache read as the value, paged BnBsH of
// 128-token blocks, bf16.
tools::FiaProblem mlaDecodeStep(int64_t requests, int64_t context, int64_t heads) {
    tools::FiaProblem p = decodeStep(requests, context, false);
    p.heads = heads;
    p.kvHeads = 1;
    p.dim = 512;
    p.ropeDim = 64;
    p.cache = "BnBsH";
    p.scale = 1.0 / std::sqrt(512.0 + 64.0);
    return p;
}

// The MLA step of mlaDecodeStep with full int8 quantisation (spec 9.2 "MLA full quant"): int8
// query with a per-token-per-head scale, int8 key cache (read as the value) with per-tensor
// scales, the key rope left bf16 beside it.
tools::FiaProblem mlaQuantDecodeStep(int64_t requests, int64_t context, int64_t heads) {
    tools::FiaProblem p = mlaDecodeStep(requests, context, heads);
    p.int8Kv = true;
    p.mlaFullQuant = true;
    return p;
}

// Bytes of key and value cache a decode step must read (plus per-token scales if any; MLA: the
// key rope, bf16 beside an int8 key with full quantisation, and a key that is also the value once).
double kvBytes(const tools::FiaProblem& p) {
    const double element = p.int8Kv ? 1.0 : 2.0, ropeElement = p.mlaFullQuant ? 2.0 : element;
    double bytes = 0.0;
    for (int64_t b = 0; b < p.batches(); ++b) {
        const double rows = double(p.kvLen(b)) * double(p.kvHeads);
        bytes += rows * (double(p.dim + (p.valueIsKey() ? 0 : p.vdim())) * element + double(p.ropeDim) * ropeElement);
        if (p.int8Kv) bytes += double(p.kvLen(b)) * 4.0 * double(p.keyQuantMode + p.valueQuantMode);
    }
    return bytes;
}

tools::FaProblem bnsd(int64_t heads, int64_t kvHeads, int64_t seq, int64_t dim, bool causal) {
    tools::FaProblem p = tools::fixed("BNSD", ATTNOPS_FLOAT32, 1, seq, seq, heads, kvHeads, dim);
    return causal ? tools::withMode(p, kCausal) : p;
}

tools::FaProblem packed(std::vector<int64_t> lengths, int64_t heads, int64_t kvHeads, int64_t dim) {
    tools::FaProblem p = tools::tnd(ATTNOPS_FLOAT32, lengths, lengths, heads, kvHeads, dim);
    return tools::withMode(p, kCausal);
}

std::vector<int64_t> shortLengths(int64_t sequences) {
    tools::Rng rng(100000);
    std::vector<int64_t> lengths(static_cast<size_t>(sequences));
    for (int64_t& l : lengths) l = 1 + int64_t(rng.next() % 16);
    return lengths;
}

std::vector<Workload> catalogue(const BenchOptions& o) {
    const int64_t q = o.quick ? 8 : 1;
    std::vector<Workload> w;
    auto fa = [&](std::string name, std::string what, tools::FaProblem p) {
        w.push_back({std::move(name), std::move(what), false, false, std::move(p), {}, {}, false});
    };
    const int64_t s4k = 4096 / q, s2k = 2048 / q;
    fa(fmt::format("bnsd-s{}-d128", s4k), fmt::format("BNSD B=1 N=16 S={} D=128, no mask", s4k), bnsd(16, 16, s4k, 128, false));
    fa(fmt::format("bnsd-s{}-d128-causal", s4k), fmt::format("BNSD B=1 N=16 S={} D=128, causal", s4k),
       bnsd(16, 16, s4k, 128, true));
    fa(fmt::format("gqa32x8-s{}-d128-causal", s2k), fmt::format("BNSD B=1 N1=32 N2=8 S={} D=128, causal", s2k),
       bnsd(32, 8, s2k, 128, true));
    fa(fmt::format("bnsd-s{}-d64", s4k), fmt::format("BNSD B=1 N=16 S={} D=64, no mask", s4k), bnsd(16, 16, s4k, 64, false));
    fa(fmt::format("bnsd-s{}-d256", s2k), fmt::format("BNSD B=1 N=16 S={} D=256, no mask", s2k),
       bnsd(16, 16, s2k, 256, false));
    const std::vector<int64_t> real = tools::realisticLengths(32768 / q);
    fa(fmt::format("tnd-{}k-causal", 32 / q),
       fmt::format("TND {} sequences (log-normal lengths, median 512), {} tokens, N1=16 N2=4 D=128, causal", real.size(),
                   std::accumulate(real.begin(), real.end(), int64_t(0))),
       packed(real, 16, 4, 128));
    const std::vector<int64_t> tiny = shortLengths(100000 / q);
    // Few heads and D = 64 keep the 850,000 tokens' fp32 tensors (forward and backward) near 2 GB.
    fa(fmt::format("tnd-{}-short-causal", tiny.size()),
       fmt::format("TND {} sequences of length 1-16, {} tokens, N1=4 N2=1 D=64, causal", tiny.size(),
                   std::accumulate(tiny.begin(), tiny.end(), int64_t(0))),
       packed(tiny, 4, 1, 64));
    for (int64_t s : o.sweep)
        fa(fmt::format("sweep-s{}-d128", s), fmt::format("BNSD B=1 N=16 S={} D=128, no mask", s), bnsd(16, 16, s, 128, false));
    {
        Workload pf;
        pf.fiaPrefill = true;
        pf.fa = bnsd(16, 16, s2k, 128, false);
        pf.fiaProblem.layout = "BNSD";
        pf.fiaProblem.qSeqLen = pf.fiaProblem.kvSeqLen = s2k;
        pf.fiaProblem.heads = pf.fiaProblem.kvHeads = 16;
        pf.fiaProblem.dim = 128;
        pf.fiaProblem.maskKind = "none";
        pf.name = fmt::format("fia-prefill-s{}-d128", s2k);
        pf.description = fmt::format("FIA prefill BNSD B=1 N=16 S={} D=128, no mask, softmaxLse; against the FA forward "
                                     "on the same shape (fp16/bf16 only)",
                                     s2k);
        w.push_back(std::move(pf));
    }
    auto decode = [&](int64_t requests, int64_t context, bool int8Kv, const char* cache) {
        Workload d;
        d.fia = true;
        d.fiaProblem = decodeStep(requests, context, int8Kv, cache);
        const bool bsh = std::string(cache) == "BnBsH";
        d.name = fmt::format("decode-{}b{}-s{}-{}kv", bsh ? "bsh-" : "", requests, context, int8Kv ? "int8" : "bf16");
        d.description = fmt::format("FIA decode B={} context={} N1=32 N2=8 D=128, paged {} block 128, bf16 Q, {} KV",
                                    requests, context, cache, int8Kv ? "int8 (per-channel scale)" : "bf16");
        w.push_back(std::move(d));
    };
    for (bool int8Kv : {false, true}) decode(32, 4096 / q, int8Kv, "BnNBsD");
    for (bool int8Kv : {false, true}) decode(1, 131072 / q, int8Kv, "BnNBsD");
    for (bool int8Kv : {false, true}) decode(32, 4096 / q, int8Kv, "BnBsH");
    {
        Workload d;
        d.fia = true;
        const int64_t requests = 32, context = 4096 / q, heads = 16;
        d.fiaProblem = mlaDecodeStep(requests, context, heads);
        d.name = fmt::format("mla-decode-b{}-s{}-h{}", requests, context, heads);
        d.description = fmt::format("FIA decode MLA B={} context={} N1={} N2=1 D=512+64 rope, value = key, paged BnBsH "
                                    "block 128, bf16",
                                    requests, context, heads);
        w.push_back(std::move(d));
        Workload quant;
        quant.fia = true;
        quant.fiaProblem = mlaQuantDecodeStep(requests, context, heads);
        quant.name = fmt::format("mla-decode-b{}-s{}-h{}-int8", requests, context, heads);
        quant.description = fmt::format("FIA decode MLA full quant B={} context={} N1={} N2=1 D=512+64 rope, int8 query "
                                        "(per token and head scale), int8 key = value (per-tensor scales), bf16 rope, paged "
                                        "BnBsH block 128",
                                        requests, context, heads);
        w.push_back(std::move(quant));
    }
    Workload bar;
    bar.bar = true;
    bar.barProblem.tokens = 8192 / q;
    bar.barProblem.blocks = 8;
    bar.barProblem.hidden = 4096;
    bar.name = fmt::format("bar-t{}-n8-h4096", bar.barProblem.tokens);
    bar.description = fmt::format("BlockAttentionResiduals T={} N=8 H=4096 (token-major cache)", bar.barProblem.tokens);
    w.push_back(std::move(bar));
    return w;
}

// A --workloads pattern names the workloads whose names start with it.
bool matches(const Workload& w, const std::string& pattern) { return w.name.rfind(pattern, 0) == 0; }

bool selected(const Workload& w, const BenchOptions& o) {
    if (o.workloads.empty()) return !matches(w, "sweep-") || !o.sweep.empty();
    return std::any_of(o.workloads.begin(), o.workloads.end(), [&](const std::string& pattern) { return matches(w, pattern); });
}

attnopsDataType dtypeOf(const std::string& name) {
    if (name == "fp16") return ATTNOPS_FLOAT16;
    if (name == "bf16") return ATTNOPS_BFLOAT16;
    return ATTNOPS_FLOAT32;
}

struct Peaks {
    tools::ArithmeticPeak fp32, bf16;
    double readGBs = 0.0;
};

enum class PeakKind { Fp32, Bf16, Read };

struct PeakNames {
    const char* table;  // in the "of peak" column
    const char* range;  // in the closing range line
    const char* json;   // key of peakRange
};
constexpr PeakNames kPeakNames[] = {{"fp32 FMA", "fp32", "fp32"}, {"bf16", "bf16", "bf16"}, {"DRAM read", "DRAM read", "dramReadGBs"}};

// The peak a row's rate is divided by: the higher of the run's start-up measurement and a short
// sample taken right after the row. On a shared host one sample can fall in a slow moment (on the
// 2-vCPU Zen 3 VM a start-up fp32 peak read 96 GFLOP/s and the forward right after it ran at 134),
// and a low peak overstates every ratio; the higher of two samples cannot. The range of the
// samples is printed at the end, as a measure of the host's noise. Disabled (--no-peaks): 0, no
// ratio.
class RowPeaks {
public:
    RowPeaks(const Peaks& start, int32_t threads, bool enabled) : start_(start), threads_(threads), enabled_(enabled) {}

    double after(PeakKind kind) {
        if (!enabled_) return 0.0;
        double now = 0.0, atStart = 0.0;
        if (kind == PeakKind::Read) {
            now = tools::measureReadBandwidth(uint64_t(256) << 20, threads_, 3);
            atStart = start_.readGBs;
        } else if (kind == PeakKind::Bf16) {
            now = tools::measureBf16Peak(threads_, 0.05, 3).gflops;
            atStart = start_.bf16.gflops;
        } else {
            now = tools::measureFp32Peak(threads_, 0.05, 3).gflops;
            atStart = start_.fp32.gflops;
        }
        auto& [lo, hi] = range_[kind];
        if (lo == 0.0) lo = hi = atStart;
        lo = std::min(lo, now);
        hi = std::max(hi, now);
        return std::max(atStart, now);
    }

    bool sampled() const { return !range_.empty(); }  // some row was divided by a peak

    // "fp32 162.3-199.0 GFLOP/s, ..." over the start-up peaks and every row's sample.
    std::string rangeText() const {
        std::string text;
        for (const auto& [kind, r] : range_)
            text += fmt::format("{}{} {:.1f}-{:.1f} {}", text.empty() ? "" : ", ", kPeakNames[int(kind)].range, r.first, r.second,
                                kind == PeakKind::Read ? "GB/s" : "GFLOP/s");
        return text;
    }
    json rangeJson() const {
        json j = json::object();
        for (const auto& [kind, r] : range_) j[kPeakNames[int(kind)].json] = {{"low", r.first}, {"high", r.second}};
        return j;
    }

private:
    Peaks start_;
    int32_t threads_;
    bool enabled_;
    std::map<PeakKind, std::pair<double, double>> range_;
};

json problemJson(const Workload& w) {
    if (w.fia) {
        const tools::FiaProblem& p = w.fiaProblem;
        return {{"op", "fused-infer-attention-decode"}, {"layout", p.layout}, {"batch", p.batch}, {"kvLens", p.kvLens},
                {"heads", p.heads}, {"kvHeads", p.kvHeads}, {"dim", p.dim}, {"cache", p.cache}, {"blockSize", p.blockSize},
                {"kvDtype", p.int8Kv ? "int8" : "bf16"}, {"ropeDim", p.ropeDim}, {"valueIsKey", p.valueIsKey()},
                {"mlaFullQuant", p.mlaFullQuant}};
    }
    if (w.bar)
        return {{"op", "block-attention-residuals"}, {"tokens", w.barProblem.tokens}, {"blocks", w.barProblem.blocks},
                {"hidden", w.barProblem.hidden}, {"eps", w.barProblem.eps}};
    const tools::FaProblem& p = w.fa;
    json j = {{"op", "flash-attention"}, {"layout", p.layout},  {"heads", p.heads},
              {"kvHeads", p.kvHeads},    {"dim", p.dim},        {"sparseMode", p.sparseMode},
              {"causal", p.sparseMode == kCausal}, {"scale", 1.0 / std::sqrt(double(p.dim))}};
    if (p.tnd()) {
        j["seqLens"] = p.qSeqLens;
    } else {
        j["batch"] = p.batch;
        j["qSeqLen"] = p.qSeqLen;
        j["kvSeqLen"] = p.kvSeqLen;
    }
    return j;
}

struct Result {
    std::string implementation;
    Timing timing;
    double work = 0.0;  // FLOPs or bytes
};

Result runAttention(const Workload& w, attnopsDataType dt, bool backward, const BenchOptions& o) {
    tools::FaProblem p = w.fa;
    p.dtype = dt;
    tools::FaInstance inst(p);
    Result r;
    if (!backward) {
        r.timing = timeForward(inst, o.repeat, o.warmUps);
        r.work = p.forwardFlops();
    } else {
        if (const attnopsStatus st = inst.runForward(); st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
        tools::FaGrads grads = tools::makeGrads(inst);
        r.timing = timeCalls([&] { return tools::runBackward(inst, grads); }, o.repeat, o.warmUps);
        r.work = kBackwardFlopFactor * p.forwardFlops();
    }
    r.implementation = tools::lastImplementation();
    return r;
}

// One decode step: the bytes are the key/value cache read.
Result runDecode(const Workload& w, const BenchOptions& o) {
    tools::FiaInstance inst(w.fiaProblem);
    Result r;
    r.timing = timeCalls([&] { return inst.run(); }, o.repeat, o.warmUps);
    r.work = kvBytes(w.fiaProblem);
    r.implementation = tools::lastImplementation();
    return r;
}

Result runBar(const Workload& w, attnopsDataType dt, bool backward, const BenchOptions& o) {
    tools::BarProblem p = w.barProblem;
    p.dtype = dt;
    tools::BarInstance inst(p);
    Result r;
    if (!backward) {
        r.timing = timeCalls([&] { return inst.runForward(true); }, o.repeat, o.warmUps);
        r.work = p.forwardBytes(true);
    } else {
        if (const attnopsStatus st = inst.runForward(true); st != ATTNOPS_SUCCESS) throw CliError(libraryError(st));
        r.timing = timeCalls([&] { return inst.runBackward(); }, o.repeat, o.warmUps);
        r.work = p.backwardBytes();
    }
    r.implementation = tools::lastImplementation();
    return r;
}

}  // namespace

void addBenchOptions(CLI::App& cmd, BenchOptions& o) {
    cmd.add_option("--workloads,-w", o.workloads,
                   "Workload names or name prefixes, comma separated (default: the whole catalogue; --list shows it)")
        ->delimiter(',');
    cmd.add_option("--dtypes", o.dtypes, "Data types, comma separated")
        ->delimiter(',')
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
        ->capture_default_str();
    cmd.add_option("--directions", o.directions, "fwd and/or bwd, comma separated")
        ->delimiter(',')
        ->check(CLI::IsMember({"fwd", "bwd"}))
        ->capture_default_str();
    cmd.add_option("--sweep", o.sweep,
                   "Also run BNSD B=1 N=16 D=128 (no mask) at these sequence lengths (workloads sweep-s<S>-d128)")
        ->delimiter(',')
        ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    cmd.add_option("--repeat", o.repeat, "Timed runs per workload (the median is reported)")
        ->check(CLI::Range(int64_t(1), int64_t(1000)))
        ->capture_default_str();
    cmd.add_option("--warmup", o.warmUps, "Untimed runs before timing")
        ->check(CLI::Range(int64_t(0), int64_t(100)))
        ->capture_default_str();
    cmd.add_option("--threads", o.threads, "Worker threads of device 0 (default: every usable core)")
        ->check(CLI::Range(1, 4096));
    cmd.add_flag("--quick", o.quick, "Every shape divided by 8 (a smoke run, not a measurement)");
    cmd.add_flag("--list", o.list, "List the catalogue and exit");
    cmd.add_flag("--no-peaks", o.noPeaks, "Skip the peak microbenchmarks (no ratios)");
    cmd.add_flag("--json", o.json, "Print JSON instead of the table");
    cmd.add_option("--output,-o", o.jsonFile, "Also write the JSON to this file");
}

int runBench(const BenchOptions& o) {
    std::vector<Workload> all = catalogue(o);
    if (o.list) {
        for (const Workload& w : all) fmt::print("{:<28} {}\n", w.name, w.description);
        return kExitOk;
    }
    // Every pattern must name something: with --quick the shapes (and so the names) change, and a
    // pattern left silently unmatched would drop rows from a run that looks complete.
    for (const std::string& pattern : o.workloads)
        if (std::none_of(all.begin(), all.end(), [&](const Workload& w) { return matches(w, pattern); }))
            throw CliError(fmt::format("--workloads: '{}' matched no workload of the catalogue{} (see attnops bench --list{})",
                                       pattern, o.quick ? " with --quick shapes" : "", o.quick ? " --quick" : ""));
    std::vector<Workload> chosen;
    for (Workload& w : all)
        if (selected(w, o)) chosen.push_back(std::move(w));
    if (chosen.empty()) throw CliError("--workloads matched no workload of the catalogue (see attnops bench --list)");

    const int32_t threads = useThreads(o.threads);
    const cpu::IsaFeatures& isa = cpu::isa();
    Peaks peaks;
    if (!o.noPeaks) {
        peaks.fp32 = tools::measureFp32Peak(threads);
        peaks.bf16 = tools::measureBf16Peak(threads);
        peaks.readGBs = tools::measureReadBandwidth(uint64_t(512) << 20, threads);
    }
    RowPeaks rowPeaks(peaks, threads, !o.noPeaks);
    const std::string bf16Path = tools::bf16PathText();
    json doc = {{"cpu", isa.brand},
                {"vendor", isa.vendor},
                {"bf16Path", bf16Path},
                {"threads", threads},
                {"quick", o.quick},
                {"repeat", o.repeat},
                {"warmUpRuns", o.warmUps},
                {"flopsNote", fmt::format("attention: mask-aware FLOPs; backward {}", kBackwardFlopNote)},
                {"peaks",
                 {{"fp32", {{"gflops", peaks.fp32.gflops}, {"unit", peaks.fp32.unit}}},
                  {"bf16", {{"gflops", peaks.bf16.gflops}, {"unit", peaks.bf16.unit}}},
                  {"dramReadGBs", peaks.readGBs}}},
                {"results", json::array()}};
    const bool table = !o.json;
    if (table) {
        fmt::print("attnops bench on {} ({} threads){}\n", isa.brand, threads, o.quick ? ", --quick shapes" : "");
        fmt::print("bf16 path: {}\n", bf16Path);
        if (!o.noPeaks)
            fmt::print("peaks at start-up: fp32 {:.1f} GFLOP/s [{}]; bf16 {:.1f} GFLOP/s [{}]; DRAM read {:.1f} GB/s\n",
                       peaks.fp32.gflops, peaks.fp32.unit, peaks.bf16.gflops, peaks.bf16.unit, peaks.readGBs);
        fmt::print("median of {} runs after {} warm-up; attention FLOPs mask-aware, backward {}\n\n", o.repeat,
                   o.warmUps, kBackwardFlopNote);
        fmt::print("{:<28} {:<5} {:<4} {:<16} {:>11} {:>12} {:>10}\n", "workload", "dtype", "dir", "implementation",
                   "median", "rate", "of peak");
        std::fflush(stdout);
    }
    const bool forward = std::find(o.directions.begin(), o.directions.end(), "fwd") != o.directions.end();
    // By (rope dim, context, cache format): the bf16 KV time the int8 KV one (GQA, or MLA full
    // quant) is compared with.
    std::map<std::tuple<int64_t, int64_t, std::string>, double> bf16DecodeMs;
    for (const Workload& w : chosen) {
        if (w.fia) {  // a decode step: bf16 query whatever --dtypes says, forward only
            if (!forward) continue;
            const Result r = runDecode(w, o);
            const double seconds = r.timing.median() * 1e-3;
            const double rate = r.work / seconds / 1e9;
            const tools::FiaProblem& p = w.fiaProblem;
            const int64_t context = p.kvLen(0);
            json j = {{"workload", w.name},
                      {"description", w.description},
                      // The query (MLA full quant: the rope and output beside an int8 query, problem.mlaFullQuant);
                      // the KV dtype is in the name and problem.kvDtype.
                      {"dtype", "bf16"},
                      {"direction", "fwd"},
                      {"implementation", r.implementation},
                      {"problem", problemJson(w)},
                      {"timing", timingJson(r.timing)},
                      {"medianMs", r.timing.median()},
                      {"bytes", r.work},
                      {"GBs", rate},
                      {"tokensPerSecond", double(p.batch) / seconds}};
            const double readPeak = rowPeaks.after(PeakKind::Read);
            if (readPeak > 0) {
                j["peak"] = kPeakNames[int(PeakKind::Read)].table;
                j["peakValue"] = readPeak;
                j["ratioToPeak"] = rate / readPeak;
            }
            std::string speedText;
            const std::tuple<int64_t, int64_t, std::string> twin{p.ropeDim, context, p.cache};  // each against its bf16 KV run
            if (!p.int8Kv) bf16DecodeMs[twin] = r.timing.median();
            else if (bf16DecodeMs.count(twin) != 0) {
                const double speedup = bf16DecodeMs[twin] / r.timing.median();
                j["speedupOverBf16Kv"] = speedup;
                speedText = fmt::format(", {:.2f}x bf16 KV", speedup);
            }
            doc["results"].push_back(j);
            if (table) {
                const std::string ratioText =
                    readPeak > 0 ? fmt::format("{:.1f}% DRAM read", 100.0 * rate / readPeak) : "-";
                fmt::print("{:<28} {:<5} {:<4} {:<16} {:>11} {:>12} {} ({:.0f} tokens/s{})\n", w.name,
                           p.int8Kv ? "i8kv" : "bf16", "fwd", r.implementation, formatMs(r.timing.median()),
                           fmt::format("{:.1f} GB/s", rate), ratioText, double(p.batch) / seconds, speedText);
                std::fflush(stdout);
            }
            continue;
        }
        if (w.fiaPrefill) {  // forward only, fp16/bf16 (FIA has no fp32 query)
            if (!forward) continue;
            for (const std::string& dtype : o.dtypes) {
                const attnopsDataType dt = dtypeOf(dtype);
                if (dt == ATTNOPS_FLOAT32) continue;
                const Result fa = runAttention(w, dt, false, o);
                tools::FiaProblem p = w.fiaProblem;
                p.dtype = dt;
                tools::FiaInstance inst(p);
                const Timing timing = timeCalls([&] { return inst.run(); }, o.repeat, o.warmUps);
                const std::string implementation = tools::lastImplementation();
                const double flops = tools::fiaForwardFlops(p), rate = flops / (timing.median() * 1e-3) / 1e9;
                const double ratio = fa.timing.median() / timing.median();
                json problem = problemJson(w);  // FA's shape (bench/compare_torch.py times SDPA on it)
                problem["op"] = "fused-infer-attention-prefill";
                doc["results"].push_back({{"workload", w.name},
                                          {"description", w.description},
                                          {"dtype", dtype},
                                          {"direction", "fwd"},
                                          {"implementation", implementation},
                                          {"problem", problem},
                                          {"timing", timingJson(timing)},
                                          {"medianMs", timing.median()},
                                          {"flops", flops},
                                          {"TFLOPs", rate / 1e3},
                                          {"flashAttention", {{"implementation", fa.implementation}, {"medianMs", fa.timing.median()}}},
                                          {"ratioToFlashAttention", ratio}});
                if (table) {
                    fmt::print("{:<28} {:<5} {:<4} {:<16} {:>11} {:>12} {:.1f}% of FA ({}, {})\n", w.name, dtype, "fwd",
                               implementation, formatMs(timing.median()), fmt::format("{:.3f} TFLOP/s", rate / 1e3),
                               100.0 * ratio, fa.implementation, formatMs(fa.timing.median()));
                    std::fflush(stdout);
                }
            }
            continue;
        }
        for (const std::string& dtype : o.dtypes)
            for (const std::string& direction : o.directions) {
                const attnopsDataType dt = dtypeOf(dtype);
                const bool backward = direction == "bwd";
                const Result r = w.bar ? runBar(w, dt, backward, o) : runAttention(w, dt, backward, o);
                const double seconds = r.timing.median() * 1e-3;
                const double rate = r.work / seconds / 1e9;  // GFLOP/s or GB/s
                const PeakKind kind = w.bar ? PeakKind::Read : dt == ATTNOPS_BFLOAT16 ? PeakKind::Bf16 : PeakKind::Fp32;
                const double peak = rowPeaks.after(kind);
                const std::string peakName = kPeakNames[int(kind)].table;
                json j = {{"workload", w.name},
                          {"description", w.description},
                          {"dtype", dtype},
                          {"direction", direction},
                          {"implementation", r.implementation},
                          {"problem", problemJson(w)},
                          {"timing", timingJson(r.timing)},
                          {"medianMs", r.timing.median()}};
                if (w.bar) {
                    j["bytes"] = r.work;
                    j["GBs"] = rate;
                } else {
                    j["flops"] = r.work;
                    j["TFLOPs"] = rate / 1e3;
                }
                if (peak > 0) {
                    j["peak"] = peakName;
                    j["peakValue"] = peak;
                    j["ratioToPeak"] = rate / peak;
                }
                doc["results"].push_back(j);
                if (table) {
                    const std::string rateText =
                        w.bar ? fmt::format("{:.1f} GB/s", rate) : fmt::format("{:.3f} TFLOP/s", rate / 1e3);
                    const std::string ratioText = peak > 0 ? fmt::format("{:.1f}% {}", 100.0 * rate / peak, peakName) : "-";
                    fmt::print("{:<28} {:<5} {:<4} {:<16} {:>11} {:>12} {}\n", w.name, dtype, direction, r.implementation,
                               formatMs(r.timing.median()), rateText, ratioText);
                    std::fflush(stdout);
                }
            }
    }
    if (rowPeaks.sampled()) {  // (prefill rows are divided by FlashAttentionScore's rate)
        doc["peakRange"] = rowPeaks.rangeJson();
        if (table)
            fmt::print("\npeaks over the run (start-up and after each row): {}; each row's ratio is to the higher of the\n"
                       "start-up peak and its own sample\n",
                       rowPeaks.rangeText());
    }
    if (o.json) fmt::print("{}\n", doc.dump(2));
    if (!o.jsonFile.empty()) {
        std::ofstream out(o.jsonFile);
        out << doc.dump(2) << "\n";
        if (!out) throw CliError(fmt::format("--output = {}: cannot write the file", o.jsonFile));
    }
    return kExitOk;
}

}  // namespace attnops::cli
