// The vector forward's shared packed blocks (cpu/simd/fa_forward.hpp): the query heads of a GQA
// group per pass (TileShape::headsPerPass) and the query blocks per work unit
// (TileShape::blocksPerUnit) that share each packed key and value block. The choices from the L2
// (and, for blocks, the thread count) and the ATTNOPS_FA_HEADS_PER_PASS / ATTNOPS_FA_BLOCKS_PER_UNIT
// overrides are checked on the functions themselves; through the public API, FlashAttentionScore
// forwards (fp32, bf16, fp16; causal, band, TND with empty and length-1 sequences, pse, explicit
// masks with fully masked rows, dropout, sinks, NaN inputs that send blocks through the row steps)
// and FusedInferAttentionScore's prefill route give the same bytes with 1, 2, 3 and all the heads
// of the group per pass and 1, 2, 3 and 8 query blocks per unit, on every vector forward this CPU
// runs, and pass the double reference under the tolerance rule.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "bias_steps.hpp"
#include "cpu/avx2/simd_avx2.hpp"
#include "cpu/isa.hpp"
#include "cpu/simd/fa_forward.hpp"
#include "ops/flash_attention_score/plan.hpp"
#include "fia_problems.hpp"
#include "forced_impl.hpp"
#include "problem.hpp"
#include "problem_fia.hpp"

using attnops::testsupport::ForcedImpl;
using attnops::testsupport::canonicalBytes;
using attnops::testsupport::dropout;
using attnops::testsupport::maskSomeRowsFully;
using attnops::testsupport::masked;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;
using attnops::tools::FiaInstance;
using attnops::tools::FiaProblem;
using attnops::tools::fixed;
using attnops::tools::kNoBand;
using attnops::tools::tnd;
using attnops::tools::withMode;
using attnops::tools::withPse;

namespace {

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;

namespace fwd = attnops::fa::simd_forward;

// Sets ATTNOPS_FA_HEADS_PER_PASS for a scope.
class HeadsPerPass : attnops::testsupport::ScopedEnv {
public:
    explicit HeadsPerPass(int64_t heads) : ScopedEnv("ATTNOPS_FA_HEADS_PER_PASS", std::to_string(heads)) {}
};

// Sets ATTNOPS_FA_BLOCKS_PER_UNIT for a scope.
class BlocksPerUnit : attnops::testsupport::ScopedEnv {
public:
    explicit BlocksPerUnit(int64_t blocks) : ScopedEnv("ATTNOPS_FA_BLOCKS_PER_UNIT", std::to_string(blocks)) {}
};

// (heads per pass, query blocks per unit) settings compared; the first is the reference run.
struct Sharing {
    int64_t heads, blocks;
};
std::vector<Sharing> sharings(int64_t group) {
    std::vector<Sharing> s;
    for (Sharing c : {Sharing{1, 1}, Sharing{2, 1}, Sharing{3, 1}, Sharing{group, 1}, Sharing{1, 2}, Sharing{2, 2},
                      Sharing{1, 3}, Sharing{group, 3}, Sharing{1, 8}})
        if (c.heads <= group) s.push_back(c);
    return s;
}

TEST(FaHeadsPerPass, ChosenFromTheL2AndOverridden) {
    attnops::fa::ForwardParams p;
    p.d = p.dv = 128;
    p.group = 4;
    attnops::fa::TileShape t;
    t.queryRows = 120;
    t.keyRows = 128;
    // L2 held by a pass: key rows, value strips and scores (128 x (128 + 128 + 120) floats), and
    // per head its query block, accumulators and statistics (2 x 120 x 128 + 240 floats).
    const uint64_t shared = 128 * (128 + 128 + 120) * 4, perHead = (2 * 120 * 128 + 240) * 4;
    EXPECT_EQ(fwd::headsPerPass(p, t, 512 << 10), 2);  // Zen 3: (512 KiB - 188 KiB) / 121 KiB
    EXPECT_EQ(fwd::headsPerPass(p, t, shared + 3 * perHead), 3);
    EXPECT_EQ(fwd::headsPerPass(p, t, shared + 3 * perHead - 1), 2);
    EXPECT_EQ(fwd::headsPerPass(p, t, 2 << 20), 4);  // all of the group
    EXPECT_EQ(fwd::headsPerPass(p, t, 256 << 10), 1);
    EXPECT_EQ(fwd::headsPerPass(p, t, shared + perHead), 1);  // room for one head only
    p.group = 1;
    EXPECT_EQ(fwd::headsPerPass(p, t, 2 << 20), 1);
    p.group = 8;
    p.headsPerPass = 3;
    EXPECT_EQ(fwd::headsPerPass(p, t, 256 << 10), 3);
    p.headsPerPass = 20;
    EXPECT_EQ(fwd::headsPerPass(p, t, 256 << 10), 8);
    // The scratch holds every head of a pass after the shared blocks.
    t.headsPerPass = 3;
    EXPECT_EQ(fwd::Scratch::floats(p, t), fwd::Scratch::sharedFloats(p, t) + 3 * fwd::HeadState::floats(p, t));
    // ... and each of its query blocks.
    t.blocksPerUnit = 2;
    EXPECT_EQ(fwd::Scratch::floats(p, t), fwd::Scratch::sharedFloats(p, t) + 6 * fwd::HeadState::floats(p, t));
}

TEST(FaBlocksPerUnit, ChosenFromTheL2AndTheThreads) {
    attnops::fa::ForwardParams p;
    p.d = p.dv = 128;
    attnops::fa::TileShape t;
    t.queryRows = 120;
    t.keyRows = 128;
    const uint64_t shared = 128 * (128 + 128 + 120) * 4, perState = (2 * 120 * 128 + 240) * 4;
    p.group = 1;  // MHA: the states the L2 holds beside the shared blocks go to query blocks, at most 2
    t.headsPerPass = fwd::headsPerPass(p, t, 512 << 10);
    EXPECT_EQ(t.headsPerPass, 1);
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 512 << 10), 2);  // Zen 3
    EXPECT_EQ(fwd::blocksPerUnit(p, t, shared + 2 * perState - 1), 1);
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 2 << 20), fwd::kMaxBlocksPerUnit);
    EXPECT_EQ(fwd::blocksPerUnit(p, t, shared + 5 * perState), 5);  // what the L2 holds, below the maximum
    p.group = 4;  // a GQA group of 4 fills 2 states with heads on Zen 3, all 4 on a 2 MiB L2 with room for more
    t.headsPerPass = fwd::headsPerPass(p, t, 512 << 10);
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 512 << 10), 1);
    t.headsPerPass = fwd::headsPerPass(p, t, 2 << 20);
    EXPECT_EQ(t.headsPerPass, 4);
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 2 << 20), 3);  // 15 states fit: 3 query blocks of 4 heads
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 8 << 20), fwd::kMaxStatesPerPass / 4);  // at most 16 states per pass
    p.blocksPerUnit = 3;  // ATTNOPS_FA_BLOCKS_PER_UNIT
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 256 << 10), 3);
    p.blocksPerUnit = 1000;
    EXPECT_EQ(fwd::blocksPerUnit(p, t, 256 << 10), fwd::kMaxForcedBlocksPerUnit);
    // The plan keeps single blocks where two per unit leave a thread fewer than 8 units, unless forced:
    // 2 kv heads x 1,920 rows = 16 blocks each, 8 units of two blocks each.
    t.blocksPerUnit = 2;
    p.blocksPerUnit = 0;
    p.n2 = 2;
    p.seq.count = 1;
    p.seq.qLen = {1920};
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 2);  // 16 units
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 3).blocksPerUnit, 1);
    p.seq.qLen = {1800};  // 15 blocks: 8 units per head still (the last of one block)
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 2);
    p.seq.qLen = {1680};  // 14 blocks: 7 units per head
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 1);
    p.seq.count = 100;  // 100 sequences of one block each: nothing to share
    p.seq.qLen.assign(100, 120);
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 1);
    p.blocksPerUnit = 2;
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 8).blocksPerUnit, 2);
    // More blocks per unit are halved until every thread has 8 units: 2 kv heads x 16 blocks.
    p.blocksPerUnit = 0;
    p.seq.count = 1;
    p.seq.qLen = {1920};
    t.blocksPerUnit = 8;
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 1).blocksPerUnit, 4);  // 8 units
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 2);  // 16 units
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 4).blocksPerUnit, 1);
    t.blocksPerUnit = 5;  // 4 units per head
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 1).blocksPerUnit, 5);
    EXPECT_EQ(attnops::fa::fitUnitsToThreads(p, t, 2).blocksPerUnit, 2);  // 5 -> 2: 16 units
}

TEST(FaBlocksPerUnit, BlocksSharePassesWhenTheirKeyBlocksLineUp) {
    const attnops::fa::WorkUnit u{0, 0, 0, 300};  // blocks [0, 120), [120, 240), [240, 300)
    auto rule = [](int64_t mode, int64_t pre, int64_t next) {
        attnops::fa::MaskSpec m;
        m.sparseMode = mode;
        m.preTokens = pre;
        m.nextTokens = next;
        return attnops::fa::seqRule(m, 0, 300, 300);
    };
    const auto none = rule(0, kNoBand, kNoBand), causal = rule(3, kNoBand, 0), band = rule(4, 100, 0);
    EXPECT_TRUE(fwd::sharePass(none, u, 120, 300, false));
    EXPECT_TRUE(fwd::sharePass(causal, u, 120, 300, false));  // every block from key 0
    EXPECT_FALSE(fwd::sharePass(band, u, 120, 300, false));   // sliding first keys
    EXPECT_FALSE(fwd::sharePass(none, attnops::fa::WorkUnit{0, 0, 0, 120}, 120, 300, false));  // one block
    // The pass covers the blocks' keys: causal rows [0, 300) see keys [0, 300).
    const attnops::fa::KeyRange k = fwd::passKeys(causal, u, 120, 0, 3, 300);
    EXPECT_EQ(k.lo, 0);
    EXPECT_EQ(k.hi, 300);
    EXPECT_EQ(fwd::passKeys(causal, u, 120, 0, 1, 300).hi, 120);
    // bf16 pairs: causal blocks end at 120 and 240 (even counts) and share; ending at 121 (odd) they do not.
    EXPECT_TRUE(fwd::sharePass(causal, u, 120, 300, true));
    const auto shifted = attnops::fa::seqRule([] {
        attnops::fa::MaskSpec m;
        m.sparseMode = 3;
        m.preTokens = kNoBand;
        m.nextTokens = 0;
        return m;
    }(), 0, 300, 301);  // bottom-right: row i sees keys [0, i + 2)
    EXPECT_FALSE(fwd::sharePass(shifted, u, 120, 301, true));
    EXPECT_TRUE(fwd::sharePass(shifted, u, 120, 301, false));
}

// The vector forwards this CPU runs (ATTNOPS_FORCE_IMPL names).
std::vector<const char*> vectorForwardsHere() {
    std::vector<const char*> names;
    for (const char* name : {"avx512-bf16", "avx512", "avx2"}) {
        ForcedImpl force(name);
        FaInstance inst(fixed("BNSD", BF16, 1, 8, 8, 2, 1, 32));
        if (inst.runForward() == ATTNOPS_SUCCESS) names.push_back(name);
    }
    return names;
}

using Edit = void (*)(FaInstance&);

std::vector<uint8_t> outputs(const FaInstance& inst) {
    std::vector<uint8_t> bytes = canonicalBytes(inst.attentionOut);
    for (const auto* t : {&inst.softmaxMax, &inst.softmaxSum}) {
        const std::vector<uint8_t> b = canonicalBytes(*t);
        bytes.insert(bytes.end(), b.begin(), b.end());
    }
    return bytes;
}

// p's forward with each of sharings(): the same bytes; the first within the reference's tolerance
// unless the inputs hold NaN.
void expectSameBytes(const FaProblem& p, Edit edit = nullptr, bool checkReference = true) {
    const int64_t group = p.heads / p.kvHeads;
    for (const char* impl : vectorForwardsHere()) {
        if (std::string(impl) == "avx512-bf16" && p.dtype != BF16) continue;  // bf16 problems only
        SCOPED_TRACE(p.describe() + " on " + impl);
        ForcedImpl force(impl);
        std::vector<uint8_t> first;
        for (const Sharing s : sharings(group)) {
            HeadsPerPass pass(s.heads);
            BlocksPerUnit unit(s.blocks);
            FaInstance inst(p);
            if (edit != nullptr) edit(inst);
            ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
            if (first.empty()) {
                first = outputs(inst);
                if (checkReference) {
                    const auto rc = attnops::tools::checkForwardRows(inst, -1);
                    EXPECT_TRUE(rc.passed) << "err " << rc.maxAbsError << " tol " << rc.tolerance << " "
                                           << rc.firstFailure;
                }
            } else {
                EXPECT_TRUE(outputs(inst) == first) << s.heads << " heads per pass, " << s.blocks << " blocks per unit";
            }
        }
    }
}

void nanInQuery(FaInstance& inst) { inst.query.set(inst.query.numel() / 2 + 5, std::numeric_limits<float>::quiet_NaN()); }
void infInValue(FaInstance& inst) { inst.value.set(inst.value.numel() / 3, std::numeric_limits<float>::infinity()); }

TEST(FaHeadsPerPass, PlainForwardsGiveTheSameBytes) {
    expectSameBytes(fixed("BNSD", F32, 1, 250, 300, 8, 2, 64));                  // group 4, two key blocks
    expectSameBytes(withMode(fixed("BNSD", F32, 2, 241, 241, 6, 2, 128), 3));     // group 3, causal
    expectSameBytes(withMode(fixed("BSND", BF16, 1, 130, 400, 8, 1, 64), 2));     // group 8, bottom-right causal
    expectSameBytes(withMode(fixed("BSH", F16, 1, 300, 300, 4, 2, 32), 0, 70, 5)); // band
    expectSameBytes(tnd(F32, {130, 0, 1, 241}, {129, 5, 300, 241}, 6, 2, 64));
    expectSameBytes(withMode(tnd(BF16, {1, 250, 0, 121}, {1, 260, 3, 300}, 8, 2, 32), 3));
    FaProblem s = withMode(fixed("BNSD", F32, 1, 200, 333, 4, 1, 64), 3);
    s.sink = true;
    expectSameBytes(s);
    expectSameBytes(fixed("BNSD", F32, 1, 120, 128, 4, 4, 64));  // group 1: one head per pass anyway
}

TEST(FaHeadsPerPass, BiasAndRowStepsGiveTheSameBytes) {
    expectSameBytes(withPse(fixed("BNSD", F32, 1, 130, 257, 4, 2, 64), 1, "full"));
    expectSameBytes(withPse(withMode(fixed("BSND", BF16, 1, 241, 130, 6, 2, 32), 2), 2));
    expectSameBytes(masked(fixed("BNSD", F32, 2, 130, 140, 4, 1, 32)), maskSomeRowsFully);
    expectSameBytes(dropout(withMode(fixed("BSH", F16, 1, 241, 241, 4, 2, 32), 3), 0.7, true));
    expectSameBytes(withMode(fixed("BNSD", F32, 1, 200, 300, 4, 1, 64), 3), infInValue);  // row steps, lazily loaded rows
    expectSameBytes(fixed("BNSD", F32, 1, 150, 150, 4, 2, 32), nanInQuery, false);
}

TEST(FaHeadsPerPass, FiaPrefillGivesTheSameBytes) {
    const char* route = attnops::testing::prefillRouteHere();
    if (route == nullptr) GTEST_SKIP() << "no prefill route runs on this CPU";
    std::vector<FiaProblem> ps;
    {
        FiaProblem p = attnops::testing::withMode(attnops::testing::fiaProblem("BNSD", 2, 300, 300, 8, 2, 128), 3);
        p.dtype = BF16;
        ps.push_back(p);
    }
    {
        FiaProblem p = attnops::testing::fiaProblem("BSND", 2, 140, 260, 6, 2, 64);  // left padding, mask, pse
        p.dtype = F16;
        p.qLens = {130, 125};
        p.kvLens = {200, 257};
        p.queryPadding = 3;
        p.kvPadding = 2;
        p.maskKind = "random";
        p.pse = "batch";
        ps.push_back(p);
    }
    // The route, and for bf16 the bf16-pair route where the CPU has AVX512-BF16.
    for (const FiaProblem& p : ps)
        for (const char* impl : {route, "avx512-bf16-prefill"}) {
            if (std::string(impl) == "avx512-bf16-prefill" && (p.dtype != BF16 || !attnops::cpu::isa().avx512bf16)) continue;
            SCOPED_TRACE(p.describe() + " on " + impl);
            ForcedImpl force(impl);
            std::vector<uint8_t> first;
            for (const Sharing s : sharings(p.heads / p.kvHeads)) {
                HeadsPerPass pass(s.heads);
                BlocksPerUnit unit(s.blocks);
                FiaInstance inst(p);
                ASSERT_EQ(inst.run(), ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
                EXPECT_EQ(attnops::tools::lastImplementation(), impl);
                std::vector<uint8_t> bytes = canonicalBytes(inst.attentionOut);
                const std::vector<uint8_t> lse = canonicalBytes(inst.softmaxLse);
                bytes.insert(bytes.end(), lse.begin(), lse.end());
                if (first.empty()) {
                    first = bytes;
                    const attnops::tools::FiaCheck r = attnops::tools::checkFia(inst);
                    EXPECT_TRUE(r.passed) << r.firstFailure << " (error " << r.maxAbsError << ", tolerance " << r.tolerance
                                          << ")";
                } else {
                    EXPECT_TRUE(bytes == first) << s.heads << " heads per pass, " << s.blocks << " blocks per unit";
                }
            }
        }
}

}  // namespace
