// Kernel choice, tile shape, key splits and cost-balanced work partition of
// FusedInferAttentionScore.
#include "ops/fused_infer_attention_score/plan.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "cpu/bf16_path.hpp"
#include "ops/common/choose_kernel.hpp"
#include "ops/flash_attention_score/semantics.hpp"

namespace attnops::fia {
namespace {

constexpr int64_t kUnitOverhead = 64;  // cost of a unit that attends nothing (loads, stores)

template <typename T>
void append(std::string& key, const T& value) {
    key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

int64_t blocksOf(int64_t rows, int64_t blockRows) { return (rows + blockRows - 1) / blockRows; }

fa::KeyRange blockKeys(const Params& p, int64_t b, int64_t q0, int64_t q1) {
    const int64_t sq = p.core.seq.qLen[size_t(b)], skv = p.core.seq.kvLen[size_t(b)];
    return fa::keyRange(fa::seqRule(p.core.mask, b, sq, skv), q0, q1, skv);
}

void appendSource(std::string& key, const KvSource& s, const AntiquantSpec& q) {
    append(key, s.dtype);
    append(key, s.dimStride);
    append(key, s.dimGroup);
    append(key, q.mode);
    // Shared-prefix and tensor-list rows: their dim strides decide which kernels accept them.
    bool unitParts = s.prefixLen == 0 || s.prefix.dimStride == 1;
    for (const KvPart& e : s.perBatch) unitParts = unitParts && e.dimStride == 1;
    append(key, hasKvParts(s));
    append(key, unitParts);
}

// Whether a row of the source holds several kv heads side by side (BnBsH pages; BSH, BSND and
// TND caches): one head's rows are then slices (D x 2 bytes of bf16 at D 128) at the stride of
// a whole row (H_kv x D elements). Read a head at a time, such slices came from DRAM at about
// half the rate of contiguous rows (Intel Xeon with AMX: one thread read 256 bytes of every 2 KiB
// at 5.0-6.5 GB/s against 9.5 contiguous, bench/results/intel-xeon-amx/strided_rows.cpp; `attnops
// run fused-infer-attention` bf16 decode B=32 x 4,096 GQA 32/8 D 128, 2 threads, took 74-101 ms
// in BnBsH pages against 33-43 ms in BnNBsD, interleaved). Units of kHeadsPerUnit heads read
// them side by side.
bool interleavedHeads(const KvSource& s) {
    return !hasKvParts(s) && s.dimGroup == 0 && s.headStride > 0 && s.headStride < s.rowStride;
}

}  // namespace

WorkUnit unitAt(const Params& p, const Plan& plan, int64_t b, int64_t local, float* partialArea) {
    const int64_t sq = p.core.seq.qLen[size_t(b)], splits = plan.splits[size_t(b)];
    const int64_t blocks = blocksOf(sq, plan.tile.unitRows());
    const int64_t perHeads = blocks * splits, block = (local % perHeads) / splits, split = local % splits;
    WorkUnit u;
    u.b = b;
    u.n2 = local / perHeads * plan.headsPerUnit;
    u.heads = std::min(plan.headsPerUnit, p.core.n2 - u.n2);
    u.q0 = block * plan.tile.unitRows();
    u.q1 = std::min(sq, u.q0 + plan.tile.unitRows());
    const fa::KeyRange keys = blockKeys(p, b, u.q0, u.q1);
    u.k0 = keys.lo;
    u.k1 = keys.hi;
    if (splits > 1) {  // one query block: records of split s of kv head n2 at (n2 * splits + s)
        u.k0 = keys.lo + split * kSplitKeys;
        u.k1 = std::min(keys.hi, u.k0 + kSplitKeys);
        const uint64_t record = uint64_t(p.core.group * sq * partialRowFloats(p.core.dv));
        if (partialArea != nullptr) u.partial = partialArea + plan.partialAt[size_t(b)] + uint64_t(u.n2 * splits + split) * record;
        u.partialHeadStride = int64_t(uint64_t(splits) * record);
    }
    return u;
}

std::string planKey(const Params& p, int32_t threads, const std::string& forcedKernel) {
    const fa::ForwardParams& c = p.core;
    std::string key = forcedKernel + "|";
    append(key, threads);
    append(key, c.q.dtype);
    append(key, c.q.stride[3]);
    append(key, c.out.dtype);
    appendSource(key, p.key, p.keyQuant);
    appendSource(key, p.value, p.valueQuant);
    append(key, p.cache);
    append(key, interleavedHeads(p.key) && interleavedHeads(p.value));
    append(key, p.fullQuant.on);
    append(key, p.queryDequant.scale != nullptr);
    append(key, p.ropeDim);  // MLA: the kernels' acceptance depends on the key rope's layout
    if (p.ropeDim > 0) appendSource(key, p.keyRope, AntiquantSpec{});
    for (int64_t v : {c.batch, c.n1, c.n2, c.d, c.dv, c.mask.sparseMode, c.mask.preTokens, c.mask.nextTokens})
        append(key, v);
    append(key, c.mask.explicitMask);
    append(key, p.table.data != nullptr);
    // The prefill route (cpu/simd/fia_prefill.hpp) accepts problems by these too.
    append(key, c.pse.form);
    append(key, p.tree != nullptr);
    append(key, p.decode);
    append(key, p.probDType);
    append(key, c.headsPerPass);  // the prefill route's tile (ATTNOPS_FA_HEADS_PER_PASS)
    append(key, c.blocksPerUnit);  // and ATTNOPS_FA_BLOCKS_PER_UNIT
    for (const auto* lens : {&c.seq.qLen, &c.seq.kvLen}) {
        append(key, int64_t(lens->size()));
        key.append(reinterpret_cast<const char*>(lens->data()), lens->size() * sizeof(int64_t));
    }
    return key;
}

Plan makePlan(const Params& p, int32_t threads, const std::string& forcedKernel) {
    Plan plan;
    // Full int8 quantisation (spec 9.2) has its own rounding steps, in the portable kernels only:
    // the vector kernels' accepts() refuse it (cpu/simd/fia_forward.hpp, fia_prefill.hpp), while
    // they take MLA full quant (an int8 query dequantised per token). A forced vector kernel is told
    // why, rather than chooseKernel's generic "does not accept".
    const auto portable = [](const ForwardKernel& k) { return k.name == std::string("tiled-generic") || k.name == std::string("reference"); };
    if (p.fullQuant.on)
        for (const ForwardKernel* k : forwardKernels())
            if (forcedKernel == k->name && !portable(*k) && k->available())
                unsupported("ATTNOPS_FORCE_IMPL = {}: full int8 quantisation runs in tiled-generic or reference only", forcedKernel);
    // The bf16-pair entries (prefill route, decode) only where this CPU's bf16 path is the dot one
    // (cpu/bf16_path.hpp), as FlashAttentionScore's avx512-bf16; the emulated AMX route only when
    // forced.
    plan.kernel = &chooseKernel(forwardKernels(), p, forcedKernel, "FusedInferAttentionScore", [](const ForwardKernel& k) {
        const bool pairs = &k == &forwardKernelAvx512Bf16Prefill() || &k == &forwardKernelAvx512Bf16();
        return (pairs && cpu::bf16Path().path != cpu::Bf16Path::Dot) || &k == &forwardKernelAmxEmulatedPrefill();
    });
    plan.threads = std::max(1, threads);
    const fa::ForwardParams& c = p.core;
    const TileShape chosen = plan.kernel->tile(p);
    plan.tile = fa::fitUnitsToThreads(c, chosen, plan.threads);  // the prefill route's blocks per unit
    bool oneBlock = true;  // every batch's query rows are one unit's
    for (int64_t b = 0; b < c.seq.count; ++b) oneBlock = oneBlock && blocksOf(c.seq.qLen[size_t(b)], plan.tile.unitRows()) <= 1;
    if (plan.kernel->interleavesHeads && oneBlock && c.n2 > 1 && interleavedHeads(p.key) && interleavedHeads(p.value)) {
        plan.headsPerUnit = std::min(kHeadsPerUnit, c.n2);
        plan.tile.keyRows = std::min(plan.tile.keyRows, kInterleavedKeyRows);
    }
    // The scratch of the blocks per unit chosen before the fit (as FlashAttentionScore's plan).
    TileShape scratchTile = plan.tile;
    scratchTile.blocksPerUnit = chosen.blocksPerUnit;  // the fit only lowers it
    plan.scratchPerThread = headScratchBytes(plan.kernel->scratchBytes(p, scratchTile)) * uint64_t(plan.headsPerUnit);
    const TileShape tile = plan.tile;
    // Key splits: only where a batch's query rows form one block (its units would otherwise be
    // its kv heads alone), and from the lengths alone.
    plan.splits.assign(size_t(c.seq.count), 1);
    plan.partialAt.assign(size_t(c.seq.count), 0);
    uint64_t partialFloats = 0;
    for (int64_t b = 0; b < c.seq.count; ++b) {
        const int64_t sq = c.seq.qLen[size_t(b)];
        // Full quant: whole rows (its int8 probabilities depend on the running max of key blocks).
        if (!plan.kernel->splitsKeys || p.fullQuant.on || blocksOf(sq, tile.unitRows()) != 1) continue;
        const fa::KeyRange keys = blockKeys(p, b, 0, sq);
        const int64_t splits = std::max<int64_t>(1, blocksOf(keys.hi - keys.lo, kSplitKeys));
        if (splits == 1) continue;
        plan.splits[size_t(b)] = splits;
        plan.partialAt[size_t(b)] = partialFloats;
        partialFloats += uint64_t(c.n2 * splits * c.group * sq * partialRowFloats(c.dv));
    }
    plan.partialOffset = plan.scratchPerThread * uint64_t(plan.threads);
    plan.workspaceBytes = plan.partialOffset + (partialFloats * sizeof(float) + 63) / 64 * 64;
    plan.units = fa::partitionUnits(
        c.seq.count, plan.threads,
        [&](int64_t b) {
            return blocksOf(c.n2, plan.headsPerUnit) * blocksOf(c.seq.qLen[size_t(b)], tile.unitRows()) *
                   plan.splits[size_t(b)];
        },
        [&](int64_t b, int64_t local) {
            const WorkUnit u = unitAt(p, plan, b, local, nullptr);
            return double(u.heads * c.group) * double((u.q1 - u.q0) * (u.k1 - u.k0) + kUnitOverhead);
        });
    return plan;
}

}  // namespace attnops::fia
