// FlashAttentionScore bad input: for every validation rule (check.cpp, the API layer, tensor and
// int-array creation, executors, streams, dropout-mask helpers) one call with exactly one thing
// wrong. Each asserts the status and that the message names the argument and the value received;
// after each failure the library must still run a valid call (checked in TearDown).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "problem.hpp"

namespace {

// Two CPU devices (unless the environment says otherwise), so that cross-device misuse can be
// tested; set before main, i.e. before the runtime reads it.
const bool kTwoDevices = setenv("ATTNOPS_NUM_DEVICES", "2", 0) == 0;

constexpr attnopsDataType F32 = ATTNOPS_FLOAT32;
constexpr attnopsDataType F16 = ATTNOPS_FLOAT16;
constexpr attnopsDataType BF16 = ATTNOPS_BFLOAT16;
constexpr attnopsDataType U8 = ATTNOPS_UINT8;
constexpr int64_t kNoBand = 2147483647;
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// A host tensor owning its (zeroed) bytes; strides optional.
class Tensor {
public:
    Tensor() = default;
    Tensor(attnopsDataType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides = {}, int32_t device = ATTNOPS_HOST_MEMORY)
        : shape_(std::move(shape)) {
        int64_t span = 1;  // elements the view can reach
        for (size_t i = 0; i < shape_.size(); ++i)
            span += (shape_[i] > 0 ? shape_[i] - 1 : 0) * (strides.empty() ? 1 : strides[i]) *
                    (strides.empty() ? tailProduct(i + 1) : 1);
        bytes_.assign(size_t(std::max<int64_t>(span, 1)) * std::max<uint64_t>(1, attnopsDataTypeSize(dtype)), 0);
        const attnopsStatus st = attnopsCreateTensor(bytes_.data(), dtype, int64_t(shape_.size()), shape_.data(),
                                                     strides.empty() ? nullptr : strides.data(), device, &handle_);
        EXPECT_EQ(st, ATTNOPS_SUCCESS) << attnopsGetLastErrorMessage();
    }
    ~Tensor() { attnopsDestroyTensor(handle_); }
    Tensor(const Tensor&) = delete;
    Tensor& operator=(const Tensor&) = delete;
    Tensor(Tensor&& o) noexcept : shape_(std::move(o.shape_)), bytes_(std::move(o.bytes_)), handle_(o.handle_) { o.handle_ = nullptr; }
    Tensor& operator=(Tensor&& o) noexcept {
        if (this != &o) {
            attnopsDestroyTensor(handle_);
            shape_ = std::move(o.shape_);
            bytes_ = std::move(o.bytes_);
            handle_ = o.handle_;
            o.handle_ = nullptr;
        }
        return *this;
    }
    attnopsTensor* h() const { return handle_; }
    // Destroys the handle but returns the (now stale) pointer.
    attnopsTensor* destroyKeepingPointer() {
        attnopsTensor* p = handle_;
        EXPECT_EQ(attnopsDestroyTensor(handle_), ATTNOPS_SUCCESS);
        handle_ = nullptr;
        return p;
    }
    std::vector<uint8_t>& bytes() { return bytes_; }

private:
    int64_t tailProduct(size_t from) const {
        int64_t p = 1;
        for (size_t i = from; i < shape_.size(); ++i) p *= std::max<int64_t>(shape_[i], 1);
        return p;
    }
    std::vector<int64_t> shape_;
    std::vector<uint8_t> bytes_;
    attnopsTensor* handle_ = nullptr;
};

class IntArray {
public:
    IntArray() = default;
    explicit IntArray(const std::vector<int64_t>& v) {
        EXPECT_EQ(attnopsCreateIntArray(v.data(), v.size(), &handle_), ATTNOPS_SUCCESS);
    }
    ~IntArray() { attnopsDestroyIntArray(handle_); }
    IntArray(const IntArray&) = delete;
    IntArray& operator=(const IntArray&) = delete;
    attnopsIntArray* h() const { return handle_; }
    attnopsIntArray* destroyKeepingPointer() {
        attnopsIntArray* p = handle_;
        EXPECT_EQ(attnopsDestroyIntArray(handle_), ATTNOPS_SUCCESS);
        handle_ = nullptr;
        return p;
    }

private:
    attnopsIntArray* handle_ = nullptr;
};

// Every argument of attnopsFlashAttentionScoreGetWorkspaceSize.
struct Args {
    const attnopsTensor *q = nullptr, *k = nullptr, *v = nullptr, *pse = nullptr, *drop = nullptr, *padding = nullptr,
                        *mask = nullptr;
    const attnopsIntArray *prefix = nullptr, *qCum = nullptr, *kvCum = nullptr, *qStart = nullptr, *kvStart = nullptr;
    const attnopsTensor* sink = nullptr;
    double scale = 0.25, keepProb = 1.0;
    int64_t pre = kNoBand, next = kNoBand, headNum = 4;
    const char* layout = "BNSD";
    int64_t innerPrecise = 0, sparseMode = 0, pseType = 1, seed = 0, offset = 0;
    const attnopsTensor *smax = nullptr, *ssum = nullptr, *softmaxOut = nullptr, *out = nullptr;
    bool nullWorkspaceSize = false, nullExecutor = false;

    attnopsStatus plan(uint64_t* ws, attnopsExecutor** exec) const {
        return attnopsFlashAttentionScoreGetWorkspaceSize(q, k, v, pse, drop, padding, mask, prefix, qCum, kvCum, qStart, kvStart,
                                                          sink, scale, keepProb, pre, next, headNum, layout, innerPrecise,
                                                          sparseMode, pseType, seed, offset, smax, ssum, softmaxOut, out,
                                                          nullWorkspaceSize ? nullptr : ws, nullExecutor ? nullptr : exec);
    }
    // Plans, executes on the default stream and synchronises.
    attnopsStatus run() const {
        uint64_t ws = 0;
        attnopsExecutor* exec = nullptr;
        attnopsStatus st = plan(&ws, &exec);
        return attnops::tools::launchAndWait(st, ws, exec, attnopsFlashAttentionScore, nullptr);
    }
};

std::string lastMessage() { return attnopsGetLastErrorMessage(); }

void expectMessage(const std::vector<std::string>& parts) {
    const std::string msg = lastMessage();
    for (const std::string& part : parts)
        EXPECT_NE(msg.find(part), std::string::npos) << "message \"" << msg << "\" lacks \"" << part << "\"";
}

void expectStatus(attnopsStatus got, attnopsStatus want, const std::vector<std::string>& parts) {
    EXPECT_EQ(got, want) << attnopsStatusName(got) << " instead of " << attnopsStatusName(want) << ": " << lastMessage();
    if (got != ATTNOPS_SUCCESS) expectMessage(parts);
}

// Phase 1 with one thing wrong: the status, the message, and no executor handed out.
void expectPlanError(const Args& a, attnopsStatus want, const std::vector<std::string>& parts) {
    uint64_t ws = 12345;
    attnopsExecutor* exec = reinterpret_cast<attnopsExecutor*>(uintptr_t(0x10));
    const attnopsStatus got = a.plan(&ws, &exec);
    if (got == ATTNOPS_SUCCESS) {
        attnopsDestroyExecutor(exec);
        ADD_FAILURE() << "planned successfully; expected " << attnopsStatusName(want);
        return;
    }
    expectStatus(got, want, parts);
    if (!a.nullWorkspaceSize && !a.nullExecutor) {
        EXPECT_EQ(exec, nullptr) << "a failed call must not hand out an executor";
        EXPECT_EQ(ws, 0u);
    }
}

void expectPlanOk(const Args& a) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(a.plan(&ws, &exec), ATTNOPS_SUCCESS) << lastMessage();
    EXPECT_NE(exec, nullptr);
    EXPECT_EQ(attnopsDestroyExecutor(exec), ATTNOPS_SUCCESS);
}

#define EXPECT_PLAN_ERROR(args, status, ...)      \
    do {                                          \
        SCOPED_TRACE("called from here");         \
        expectPlanError(args, status, __VA_ARGS__); \
    } while (0)

#define EXPECT_STATUS(call, status, ...)        \
    do {                                        \
        SCOPED_TRACE("called from here");       \
        expectStatus(call, status, __VA_ARGS__); \
    } while (0)

constexpr attnopsStatus NUL = ATTNOPS_ERROR_NULL_ARGUMENT;
constexpr attnopsStatus INV = ATTNOPS_ERROR_INVALID_ARGUMENT;
constexpr attnopsStatus UNS = ATTNOPS_ERROR_UNSUPPORTED_CONFIGURATION;
constexpr attnopsStatus RTE = ATTNOPS_ERROR_RUNTIME;

// Valid problems: fixed BNSD B=2 N1=4 N2=2 S1=8 S2=12 D=16, and TND T1=10 T2=14 with sequences
// (4, 6) x (6, 8).
class FaCheck : public ::testing::Test {
protected:
    Tensor fq{F32, {2, 4, 8, 16}}, fk{F32, {2, 2, 12, 16}}, fv{F32, {2, 2, 12, 16}}, fout{F32, {2, 4, 8, 16}};
    Tensor smax{F32, {2, 4, 8, 8}}, ssum{F32, {2, 4, 8, 8}};
    Tensor tq{F32, {10, 4, 16}}, tk{F32, {14, 2, 16}}, tv{F32, {14, 2, 16}}, tout{F32, {10, 4, 16}};
    Tensor tmax{F32, {10, 4, 8}}, tsum{F32, {10, 4, 8}};
    IntArray qCum{{4, 10}}, kvCum{{6, 14}};

    Args fixedArgs() const {
        Args a;
        a.q = fq.h();
        a.k = fk.h();
        a.v = fv.h();
        a.out = fout.h();
        a.smax = smax.h();
        a.ssum = ssum.h();
        return a;
    }
    Args tndArgs() const {
        Args a;
        a.q = tq.h();
        a.k = tk.h();
        a.v = tv.h();
        a.out = tout.h();
        a.smax = tmax.h();
        a.ssum = tsum.h();
        a.layout = "TND";
        a.qCum = qCum.h();
        a.kvCum = kvCum.h();
        return a;
    }
    // After every failure the library still plans and runs a valid call.
    void TearDown() override {
        EXPECT_EQ(fixedArgs().run(), ATTNOPS_SUCCESS) << lastMessage();
        EXPECT_EQ(tndArgs().run(), ATTNOPS_SUCCESS) << lastMessage();
    }
};

TEST_F(FaCheck, BaseProblemsAreValid) {
    expectPlanOk(fixedArgs());
    expectPlanOk(tndArgs());
    Args a = fixedArgs();
    a.smax = a.ssum = nullptr;  // statistics are optional
    expectPlanOk(a);
}

// ---------------------------------------------------------------- 1. required operands, layout

TEST_F(FaCheck, NullRequiredArguments) {
    Args a = fixedArgs();
    a.q = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"query = NULL"});
    a = fixedArgs();
    a.k = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"key = NULL"});
    a = fixedArgs();
    a.v = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"value = NULL"});
    a = fixedArgs();
    a.out = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"attentionOut = NULL"});
    a = fixedArgs();
    a.layout = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"inputLayout = NULL"});
    a = fixedArgs();
    a.nullWorkspaceSize = true;
    EXPECT_PLAN_ERROR(a, NUL, {"workspaceSize = NULL"});
    a = fixedArgs();
    a.nullExecutor = true;
    EXPECT_PLAN_ERROR(a, NUL, {"executor = NULL"});
}

TEST_F(FaCheck, StaleTensorHandles) {
    Tensor doomed(F32, {2, 4, 8, 16});
    attnopsTensor* stale = doomed.destroyKeepingPointer();
    Args a = fixedArgs();
    a.q = stale;
    EXPECT_PLAN_ERROR(a, INV, {"query = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.out = stale;
    EXPECT_PLAN_ERROR(a, INV, {"attentionOut = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.mask = stale;
    EXPECT_PLAN_ERROR(a, INV, {"attenMask = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.pse = stale;
    EXPECT_PLAN_ERROR(a, INV, {"realShift = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.padding = stale;
    EXPECT_PLAN_ERROR(a, INV, {"paddingMask = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.sink = stale;
    EXPECT_PLAN_ERROR(a, INV, {"sink = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.keepProb = 0.5;
    a.drop = stale;
    EXPECT_PLAN_ERROR(a, INV, {"dropMask = 0x", "not a live tensor handle"});
    a = fixedArgs();
    a.smax = stale;
    EXPECT_PLAN_ERROR(a, INV, {"softmaxMax = 0x", "not a live tensor handle"});
    // A pointer that never was a handle.
    int64_t junk[16] = {};
    a = fixedArgs();
    a.k = reinterpret_cast<const attnopsTensor*>(junk);
    EXPECT_PLAN_ERROR(a, INV, {"key = 0x", "not a live tensor handle"});
}

TEST_F(FaCheck, StaleIntArrayHandles) {
    IntArray doomed({4, 10});
    attnopsIntArray* stale = doomed.destroyKeepingPointer();
    Args a = tndArgs();
    a.qCum = stale;
    EXPECT_PLAN_ERROR(a, INV, {"actualSeqQLen = 0x", "not a live int-array handle"});
    a = tndArgs();
    a.kvCum = stale;
    EXPECT_PLAN_ERROR(a, INV, {"actualSeqKvLen = 0x", "not a live int-array handle"});
    a = fixedArgs();
    a.sparseMode = 6;
    a.prefix = stale;
    EXPECT_PLAN_ERROR(a, INV, {"prefix = 0x", "not a live int-array handle"});
    a = fixedArgs();
    a.qStart = stale;
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx = 0x", "not a live int-array handle"});
    a = fixedArgs();
    a.kvStart = stale;
    EXPECT_PLAN_ERROR(a, INV, {"kvStartIdx = 0x", "not a live int-array handle"});
}

TEST_F(FaCheck, TensorOnAnotherDevice) {
    Tensor q5(F32, {2, 4, 8, 16}, {}, 5);
    Args a = fixedArgs();
    a.q = q5.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.device = 5", "ATTNOPS_HOST_MEMORY"});
    Tensor sink5(F32, {4}, {}, 3);
    a = fixedArgs();
    a.sink = sink5.h();
    EXPECT_PLAN_ERROR(a, INV, {"sink.device = 3"});
    Tensor q0(F32, {2, 4, 8, 16}, {}, 0);  // device 0 is the current device: fine
    a = fixedArgs();
    a.q = q0.h();
    expectPlanOk(a);
}

TEST_F(FaCheck, LayoutNames) {
    for (const char* bad : {"bnsd", "Bnsd", "BNS", "", "NSD", "TND "}) {
        Args a = fixedArgs();
        a.layout = bad;
        EXPECT_PLAN_ERROR(a, INV, {std::string("inputLayout = \"") + bad + "\"", "upper case"});
    }
}

TEST_F(FaCheck, Ranks) {
    Tensor q3(F32, {2, 4, 128}), k5(F32, {2, 2, 12, 16, 1}), v3(F32, {2, 12, 32}), t4(F32, {10, 4, 16, 1});
    Args a = fixedArgs();
    a.q = q3.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [2,4,128]", "rank 4", "BNSD"});
    a = fixedArgs();
    a.k = k5.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.shape = [2,2,12,16,1]", "rank 4"});
    a = fixedArgs();
    a.v = v3.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [2,12,32]", "rank 4"});
    a = tndArgs();
    a.q = t4.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [10,4,16,1]", "rank 3", "TND"});
    a = fixedArgs();
    a.layout = "BSH";  // 4-D operands with a 3-D layout
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [2,4,8,16]", "rank 3", "BSH"});
}

// ---------------------------------------------------------------- 2. dtypes

TEST_F(FaCheck, DataTypes) {
    Tensor qi(ATTNOPS_INT32, {2, 4, 8, 16}), qd(ATTNOPS_FLOAT64, {2, 4, 8, 16}), k16(F16, {2, 2, 12, 16}),
        vb(BF16, {2, 2, 12, 16}), o16(F16, {2, 4, 8, 16});
    Args a = fixedArgs();
    a.q = qi.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.dtype = int32", "fp32, fp16 or bf16"});
    a.q = qd.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.dtype = fp64"});
    a = fixedArgs();
    a.k = k16.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.dtype = fp16", "query.dtype (fp32)"});
    a = fixedArgs();
    a.v = vb.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.dtype = bf16", "query.dtype (fp32)"});
    a = fixedArgs();
    a.out = o16.h();
    EXPECT_PLAN_ERROR(a, INV, {"attentionOut.dtype = fp16", "query.dtype (fp32)"});
}

// ---------------------------------------------------------------- 3. heads and head dims

TEST_F(FaCheck, HeadNum) {
    for (int64_t bad : {0, -1, -100}) {
        Args a = fixedArgs();
        a.headNum = bad;
        EXPECT_PLAN_ERROR(a, INV, {"headNum = " + std::to_string(bad), "> 0"});
    }
    Args a = fixedArgs();
    a.headNum = 3;
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [2,4,8,16]", "N1 = 4", "headNum = 3"});
    a = tndArgs();
    a.headNum = 8;
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [10,4,16]", "headNum = 8"});
}

TEST_F(FaCheck, FoldedLayoutHiddenSizes) {
    // BSH: q [2,8,64] (N1 4, D 16), k/v [2,12,32] (N2 2).
    Tensor bq(F32, {2, 8, 64}), bk(F32, {2, 12, 32}), bv(F32, {2, 12, 32}), o(F32, {2, 8, 64});
    Tensor q0(F32, {2, 8, 0}), k24(F32, {2, 12, 24}), k0(F32, {2, 12, 0}), v33(F32, {2, 12, 33});
    Args a;
    a.layout = "BSH";
    a.q = bq.h();
    a.k = bk.h();
    a.v = bv.h();
    a.out = o.h();
    expectPlanOk(a);
    Args b = a;
    b.headNum = 3;
    EXPECT_PLAN_ERROR(b, INV, {"query.shape = [2,8,64]", "hidden size 64", "headNum = 3"});
    b = a;
    b.q = q0.h();
    EXPECT_PLAN_ERROR(b, INV, {"query.shape = [2,8,0]", "hidden size 0"});
    b = a;
    b.k = k24.h();
    EXPECT_PLAN_ERROR(b, INV, {"key.shape = [2,12,24]", "hidden size 24", "D = 16"});
    b = a;
    b.k = k0.h();
    EXPECT_PLAN_ERROR(b, INV, {"key.shape = [2,12,0]", "hidden size 0"});
    b = a;
    b.v = v33.h();
    EXPECT_PLAN_ERROR(b, INV, {"value.shape = [2,12,33]", "hidden size 33", "N2 = 2"});
    // SBH with the same dims is valid; a BSH-shaped output is not.
    Tensor sq(F32, {8, 2, 64}), sk(F32, {12, 2, 32}), sv(F32, {12, 2, 32}), so(F32, {8, 2, 64});
    b = a;
    b.layout = "SBH";
    b.q = sq.h();
    b.k = sk.h();
    b.v = sv.h();
    b.out = so.h();
    expectPlanOk(b);
    b.out = o.h();
    EXPECT_PLAN_ERROR(b, INV, {"attentionOut.shape = [2,8,64]", "must be [8,2,64]"});
}

TEST_F(FaCheck, HeadDims) {
    Tensor q0(F32, {2, 4, 8, 0}), k0(F32, {2, 2, 12, 0}), v0(F32, {2, 2, 12, 0}), o0(F32, {2, 4, 8, 0});
    Args a = fixedArgs();
    a.q = q0.h();
    a.k = k0.h();
    a.v = v0.h();
    a.out = o0.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [2,4,8,0]", "D must be >= 1"});
    Tensor q769(F32, {1, 1, 1, 769}), k769(F32, {1, 1, 1, 769}), o769(F32, {1, 1, 1, 769});
    a = Args{};
    a.headNum = 1;
    a.q = q769.h();
    a.k = k769.h();
    a.v = k769.h();
    a.out = o769.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.shape = [1,1,1,769]", "D = 769", "<= 768"});
    Tensor k8(F32, {2, 2, 12, 8});
    a = fixedArgs();
    a.k = k8.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.shape = [2,2,12,8]", "head dim 8", "D = 16"});
    Tensor kn0(F32, {2, 0, 12, 16}), vn0(F32, {2, 0, 12, 16});
    a = fixedArgs();
    a.k = kn0.h();
    a.v = vn0.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.shape = [2,0,12,16]", "at least one head"});
    Tensor v1h(F32, {2, 1, 12, 16});
    a = fixedArgs();
    a.v = v1h.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [2,1,12,16]", "heads 1", "N2 = 2"});
    Tensor v32(F32, {2, 2, 12, 32});
    a = fixedArgs();
    a.v = v32.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [2,2,12,32]", "Dv = 32", "D = 16"});
    Tensor k3(F32, {2, 3, 12, 16}), v3(F32, {2, 3, 12, 16});
    a = fixedArgs();
    a.k = k3.h();
    a.v = v3.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.shape = [2,3,12,16]", "N1 = 4", "multiple of N2 = 3"});
    // Dv < D is valid with an output of Dv columns; D = 768 is the largest head dim.
    Tensor v8(F32, {2, 2, 12, 8}), o8(F32, {2, 4, 8, 8});
    a = fixedArgs();
    a.v = v8.h();
    a.out = o8.h();
    expectPlanOk(a);
    a.out = fout.h();
    EXPECT_PLAN_ERROR(a, INV, {"attentionOut.shape = [2,4,8,16]", "must be [2,4,8,8]", "Dv"});
    Tensor q768(F32, {1, 1, 1, 768});
    a = Args{};
    a.headNum = 1;
    a.q = a.k = a.v = a.out = q768.h();
    expectPlanOk(a);
}

TEST_F(FaCheck, BatchAndSequenceMismatch) {
    Tensor k3(F32, {3, 2, 12, 16}), v3(F32, {3, 2, 12, 16}), v11(F32, {2, 2, 11, 16});
    Args a = fixedArgs();
    a.k = k3.h();
    EXPECT_PLAN_ERROR(a, INV, {"key.shape = [3,2,12,16]", "batch 3", "B = 2"});
    a = fixedArgs();
    a.v = v3.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [3,2,12,16]", "batch 3", "B = 2"});
    a = fixedArgs();
    a.v = v11.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [2,2,11,16]", "sequence length 11", "12"});
    Tensor tv13(F32, {13, 2, 16});
    a = tndArgs();
    a.v = tv13.h();
    EXPECT_PLAN_ERROR(a, INV, {"value.shape = [13,2,16]", "sequence length 13", "14"});
}

// ---------------------------------------------------------------- 4. output shape

TEST_F(FaCheck, OutputShape) {
    Tensor o1(F32, {2, 4, 9, 16}), o2(F32, {2, 4, 8, 16, 1}), o3(F32, {2, 8, 4, 16}), ot(F32, {11, 4, 16});
    Args a = fixedArgs();
    for (const Tensor* t : {&o1, &o2, &o3}) {
        a.out = t->h();
        EXPECT_PLAN_ERROR(a, INV, {"attentionOut.shape = [", "must be [2,4,8,16]"});
    }
    a = tndArgs();
    a.out = ot.h();
    EXPECT_PLAN_ERROR(a, INV, {"attentionOut.shape = [11,4,16]", "must be [10,4,16]"});
}

// ---------------------------------------------------------------- 5. TND sequences

TEST_F(FaCheck, TndArraysRequiredAndOnlyWithTnd) {
    Args a = tndArgs();
    a.qCum = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"actualSeqQLen = NULL", "TND"});
    a = tndArgs();
    a.kvCum = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"actualSeqKvLen = NULL", "TND"});
    a = fixedArgs();
    a.qCum = qCum.h();
    EXPECT_PLAN_ERROR(a, INV, {"actualSeqQLen = non-NULL", "only used with inputLayout TND"});
    a = fixedArgs();
    a.kvCum = kvCum.h();
    EXPECT_PLAN_ERROR(a, INV, {"actualSeqKvLen = non-NULL", "only used with inputLayout TND"});
}

TEST_F(FaCheck, TndCumulativeArrays) {
    struct Bad {
        std::vector<int64_t> q, kv;
        std::vector<std::string> parts;
    };
    const std::vector<Bad> bad = {
        {{4, 10, 10}, {6, 14}, {"actualSeqKvLen.size = 2", "actualSeqQLen.size = 3"}},
        {{4}, {6, 14}, {"actualSeqKvLen.size = 2", "actualSeqQLen.size = 1"}},
        {{4, 3}, {6, 14}, {"actualSeqQLen[1] = 3", "must not decrease", "previous 4"}},
        {{4, 10}, {6, 5}, {"actualSeqKvLen[1] = 5", "must not decrease", "previous 6"}},
        {{-1, 10}, {6, 14}, {"actualSeqQLen[0] = -1", ">= 0"}},
        {{4, 10}, {6, -14}, {"actualSeqKvLen[1] = -14", ">= 0"}},
        {{4, 11}, {6, 14}, {"actualSeqQLen[1] = 11", "T1 = 10"}},
        {{4, 10}, {15, 15}, {"actualSeqKvLen[0] = 15", "T2 = 14"}},
        {{4, 0, 6}, {6, 0, 8}, {"actualSeqQLen[2] = 6", "trailing 0"}},
        {{4, 0, 4}, {6, 14, 14}, {"actualSeqQLen[2] = 4", "trailing 0"}},
        {{4, 10}, {6, 0}, {}},  // trailing zero: valid
        {{0, 0}, {0, 0}, {}},   // all empty: valid
        {{}, {}, {}},           // no sequence at all: valid (every row is a tail)
    };
    for (const Bad& c : bad) {
        IntArray qa(c.q), kva(c.kv);
        Args a = tndArgs();
        a.qCum = qa.h();
        a.kvCum = kva.h();
        if (c.parts.empty()) {
            EXPECT_EQ(a.run(), ATTNOPS_SUCCESS) << lastMessage();
        } else {
            EXPECT_PLAN_ERROR(a, INV, c.parts);
        }
    }
}

// ---------------------------------------------------------------- 6. attributes

TEST_F(FaCheck, ScaleInnerPreciseKeepProb) {
    for (double bad : {kNaN, kInf, -kInf}) {
        Args a = fixedArgs();
        a.scale = bad;
        EXPECT_PLAN_ERROR(a, INV, {"scaleValue = ", "must be finite"});
    }
    Args a = fixedArgs();
    a.scale = kNaN;
    EXPECT_PLAN_ERROR(a, INV, {"scaleValue = nan"});
    a.scale = -kInf;
    EXPECT_PLAN_ERROR(a, INV, {"scaleValue = -inf"});
    for (int64_t bad : {3, -1, 100}) {
        a = fixedArgs();
        a.innerPrecise = bad;
        EXPECT_PLAN_ERROR(a, INV, {"innerPrecise = " + std::to_string(bad), "0, 1 or 2"});
    }
    for (int64_t ok : {0, 1, 2}) {
        a = fixedArgs();
        a.innerPrecise = ok;
        expectPlanOk(a);
    }
    const std::pair<double, const char*> keeps[] = {{0.0, "keepProb = 0"}, {1.5, "keepProb = 1.5"}, {kNaN, "keepProb = nan"},
                                                    {-0.5, "keepProb = -0.5"}, {kInf, "keepProb = inf"}};
    for (auto [keep, text] : keeps) {
        a = fixedArgs();
        a.keepProb = keep;
        EXPECT_PLAN_ERROR(a, INV, {text, "(0, 1]"});
    }
    a = fixedArgs();
    a.keepProb = 1e-9;
    expectPlanOk(a);
}

// ---------------------------------------------------------------- 7. sparse mode and tokens

TEST_F(FaCheck, SparseModeRange) {
    for (int64_t bad : {-1, 9, 100}) {
        Args a = fixedArgs();
        a.sparseMode = bad;
        EXPECT_PLAN_ERROR(a, INV, {"sparseMode = " + std::to_string(bad), "[0, 8]"});
    }
    for (int64_t mode : {7, 8}) {
        Args a = fixedArgs();
        a.sparseMode = mode;
        EXPECT_PLAN_ERROR(a, INV, {"sparseMode = " + std::to_string(mode), "inputLayout TND"});
        a = tndArgs();
        a.sparseMode = mode;
        expectPlanOk(a);
    }
    Args a = tndArgs();
    a.sparseMode = 5;
    EXPECT_PLAN_ERROR(a, INV, {"sparseMode = 5", "not available with inputLayout TND"});
}

TEST_F(FaCheck, EmptyBand) {
    // The tokens are checked only when a mask is given: without one they are ignored (section 0).
    Tensor full(U8, {8, 12}), compressed(U8, {2048, 2048});
    for (int64_t mode : {0, 4}) {
        Args a = fixedArgs();
        a.sparseMode = mode;
        a.pre = -5;
        a.next = 2;
        expectPlanOk(a);
        a.mask = mode == 0 ? full.h() : compressed.h();
        a.pre = -5;
        a.next = 2;
        EXPECT_PLAN_ERROR(a, INV, {"preTokens + nextTokens = -5 + 2", ">= 0"});
        a.pre = 2;
        a.next = -3;
        EXPECT_PLAN_ERROR(a, INV, {"preTokens + nextTokens = 2 + -3"});
        a.pre = std::numeric_limits<int64_t>::min();
        a.next = 0;
        EXPECT_PLAN_ERROR(a, INV, {"preTokens + nextTokens = -9223372036854775808 + 0"});
        a.pre = -4;
        a.next = 4;  // a single diagonal: valid
        expectPlanOk(a);
        a.pre = std::numeric_limits<int64_t>::min();
        a.next = std::numeric_limits<int64_t>::max();  // clamped to +-2^60: sum 0, valid
        expectPlanOk(a);
    }
    for (int64_t mode : {7, 8}) {
        Args a = tndArgs();
        a.sparseMode = mode;
        a.pre = -1;
        a.next = 0;
        expectPlanOk(a);
        a.mask = compressed.h();
        EXPECT_PLAN_ERROR(a, INV, {"preTokens + nextTokens = -1 + 0"});
    }
    for (int64_t mode : {2, 3}) {  // tokens ignored by these modes
        Args a = fixedArgs();
        a.sparseMode = mode;
        a.pre = -5;
        a.next = -5;
        expectPlanOk(a);
    }
}

// ---------------------------------------------------------------- 8. masks

TEST_F(FaCheck, PaddingMaskIsReserved) {
    Tensor pad(U8, {2, 8});
    Args a = fixedArgs();
    a.padding = pad.h();
    EXPECT_PLAN_ERROR(a, INV, {"paddingMask = non-NULL", "reserved"});
}

TEST_F(FaCheck, AttenMask) {
    Args a = fixedArgs();
    a.sparseMode = 1;
    expectPlanOk(a);  // mode 1 without a mask: full attention (section 0)
    Tensor mf(F32, {8, 12}), mi(ATTNOPS_INT8, {8, 12});
    a = fixedArgs();
    a.mask = mf.h();
    EXPECT_PLAN_ERROR(a, INV, {"attenMask.dtype = fp32", "bool or uint8"});
    a.mask = mi.h();
    EXPECT_PLAN_ERROR(a, INV, {"attenMask.dtype = int8"});
    // Shapes for the explicit modes 0, 1, 5.
    const std::vector<std::vector<int64_t>> badShapes = {{8, 13}, {9, 12}, {1, 8, 12}, {2, 2, 8, 12}, {3, 1, 8, 12},
                                                         {1, 4, 8, 12}, {2, 4, 8, 11}, {12, 8}, {2, 1, 1, 8, 12}};
    for (int64_t mode : {0, 1, 5}) {
        for (const auto& shape : badShapes) {
            Tensor m(U8, shape);
            a = fixedArgs();
            a.sparseMode = mode;
            a.mask = m.h();
            IntArray prefix({4, 8});
            if (mode == 5) a.prefix = prefix.h();
            EXPECT_PLAN_ERROR(a, INV, {"attenMask.shape = [", "sparseMode " + std::to_string(mode), "[B,N1,S1,S2]"});
        }
        const std::vector<std::vector<int64_t>> goodShapes = {{8, 12}, {1, 1, 8, 12}, {2, 1, 8, 12}, {2, 4, 8, 12}};
        for (const auto& shape : goodShapes) {
            Tensor m(ATTNOPS_BOOL, shape);
            a = fixedArgs();
            a.sparseMode = mode;
            a.mask = m.h();
            IntArray prefix({4, 8});
            if (mode == 5) a.prefix = prefix.h();
            expectPlanOk(a);
        }
    }
    // TND: [maxSq, maxSkv] = [6, 8] or [T1, T2] = [10, 14].
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{6, 9}, {10, 13}, {1, 6, 8}, {4, 6}}) {
        Tensor m(U8, shape);
        a = tndArgs();
        a.mask = m.h();
        EXPECT_PLAN_ERROR(a, INV, {"attenMask.shape = [", "TND", "[6,8]", "[10,14]"});
    }
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{6, 8}, {10, 14}}) {
        Tensor m(U8, shape);
        a = tndArgs();
        a.mask = m.h();
        expectPlanOk(a);
    }
}

TEST_F(FaCheck, CompressedMaskShapes) {
    Tensor c2048(U8, {2048, 2048}), c3072(U8, {3072, 2048}), c2047(U8, {2048, 2047}), full(U8, {8, 12});
    for (int64_t mode : {2, 3, 4, 6}) {
        Args a = fixedArgs();
        a.sparseMode = mode;
        IntArray prefix({4, 8});
        if (mode == 6) a.prefix = prefix.h();
        const bool six = mode == 6;
        const std::string want = six ? "[3072,2048]" : "[2048,2048]";
        for (const Tensor* t : {six ? &c2048 : &c3072, &c2047, &full}) {
            a.mask = t->h();
            EXPECT_PLAN_ERROR(a, INV, {"attenMask.shape = [", "sparseMode " + std::to_string(mode), want});
        }
        a.mask = six ? c3072.h() : c2048.h();
        expectPlanOk(a);
    }
    for (int64_t mode : {7, 8}) {
        Args a = tndArgs();
        a.sparseMode = mode;
        a.mask = c3072.h();
        EXPECT_PLAN_ERROR(a, INV, {"attenMask.shape = [3072,2048]", "[2048,2048]"});
        a.mask = c2048.h();
        expectPlanOk(a);
    }
}

// ---------------------------------------------------------------- 9. prefix

TEST_F(FaCheck, Prefix) {
    // S1 = 8, S2 = 12: prefix must lie in [4, 12].
    for (int64_t mode : {5, 6}) {
        Args a = fixedArgs();
        a.sparseMode = mode;
        EXPECT_PLAN_ERROR(a, NUL, {"prefix = NULL", "sparseMode " + std::to_string(mode)});
        IntArray one({4}), three({4, 4, 4}), low({3, 12}), high({4, 13}), ok({4, 12});
        a.prefix = one.h();
        EXPECT_PLAN_ERROR(a, INV, {"prefix.size = 1", "batch size 2"});
        a.prefix = three.h();
        EXPECT_PLAN_ERROR(a, INV, {"prefix.size = 3", "batch size 2"});
        a.prefix = low.h();
        EXPECT_PLAN_ERROR(a, INV, {"prefix[0] = 3", "[4, 12]"});
        a.prefix = high.h();
        EXPECT_PLAN_ERROR(a, INV, {"prefix[1] = 13", "[4, 12]"});
        a.prefix = ok.h();
        expectPlanOk(a);
    }
    // TND mode 6: per-sequence ranges, (Sq, Skv) = (4, 6) -> [2, 6], (6, 8) -> [2, 8].
    IntArray tlow({1, 2}), thigh({2, 9}), tok({2, 8});
    Args a = tndArgs();
    a.sparseMode = 6;
    a.prefix = tlow.h();
    EXPECT_PLAN_ERROR(a, INV, {"prefix[0] = 1", "[2, 6]"});
    a.prefix = thigh.h();
    EXPECT_PLAN_ERROR(a, INV, {"prefix[1] = 9", "[2, 8]"});
    a.prefix = tok.h();
    expectPlanOk(a);
    // A prefix with another mode.
    for (int64_t mode : {0, 2, 3}) {
        a = fixedArgs();
        a.sparseMode = mode;
        IntArray ok({4, 12});
        a.prefix = ok.h();
        EXPECT_PLAN_ERROR(a, INV, {"prefix = non-NULL", "got sparseMode " + std::to_string(mode)});
    }
}

// ---------------------------------------------------------------- 10. start indices

TEST_F(FaCheck, StartIndices) {
    IntArray empty(std::vector<int64_t>{}), huge({(int64_t(1) << 62) + 1}), ok({-7, 100});
    Args a = fixedArgs();
    a.qStart = empty.h();
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx.size = 0", ">= 1"});
    a = fixedArgs();
    a.kvStart = empty.h();
    EXPECT_PLAN_ERROR(a, INV, {"kvStartIdx.size = 0", ">= 1"});
    a = fixedArgs();
    a.qStart = huge.h();
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx/kvStartIdx = 4611686018427387905/0", "2^62"});
    IntArray minimum({std::numeric_limits<int64_t>::min()}), negHuge({-(int64_t(1) << 62) - 1});
    a = fixedArgs();
    a.kvStart = negHuge.h();
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx/kvStartIdx = 0/-4611686018427387905", "2^62"});
    a = fixedArgs();
    a.kvStart = minimum.h();  // |INT64_MIN| is not representable: must still be rejected
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx/kvStartIdx = 0/-9223372036854775808", "2^62"});
    a = fixedArgs();
    a.qStart = minimum.h();
    EXPECT_PLAN_ERROR(a, INV, {"qStartIdx/kvStartIdx = -9223372036854775808/0"});
    a = fixedArgs();
    a.qStart = ok.h();
    a.kvStart = ok.h();
    expectPlanOk(a);
}

// ---------------------------------------------------------------- 11. pse

TEST_F(FaCheck, PseTypeAndPresence) {
    for (int64_t bad : {-1, 4}) {
        Args a = fixedArgs();
        a.pseType = bad;
        EXPECT_PLAN_ERROR(a, INV, {"pseType = " + std::to_string(bad), "0, 1, 2 or 3"});
    }
    for (int64_t type : {0, 2, 3}) {
        Args a = fixedArgs();
        a.pseType = type;
        EXPECT_PLAN_ERROR(a, INV, {"pseType = " + std::to_string(type), "must be 1 when realShift is NULL"});
    }
}

TEST_F(FaCheck, PseDenseForms) {
    Tensor good(F32, {2, 4, 8, 12}), bcast(F32, {1, 4, 1, 12}), half(F16, {2, 4, 8, 12}), r3(F32, {4, 8, 12}),
        r1(F32, {768}), b3(F32, {3, 4, 8, 12}), n2(F32, {2, 2, 8, 12}), s7(F32, {2, 4, 7, 12}), k11(F32, {2, 4, 8, 11});
    for (int64_t type : {0, 1}) {
        const std::string t = std::to_string(type);
        Args a = fixedArgs();
        a.pseType = type;
        a.pse = good.h();
        expectPlanOk(a);
        a.pse = bcast.h();
        expectPlanOk(a);
        a.pse = half.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.dtype = fp16", "query.dtype (fp32)", "pseType " + t});
        a.pse = r3.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [4,8,12]", "4-D", "pseType " + t});
        a.pse = r1.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [768]", "4-D"});
        a.pse = b3.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [3,4,8,12]", "batch dim must be 1 or B = 2"});
        a.pse = n2.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [2,2,8,12]", "head dim must be N1 = 4"});
        a.pse = s7.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [2,4,7,12]", "S1 = 8, S2 = 12"});
        a.pse = k11.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [2,4,8,11]", "S1 = 8, S2 = 12"});
    }
}

TEST_F(FaCheck, PseSlopes) {
    Tensor byHead(F32, {4}), byBatch(F32, {2, 4}), half(F16, {4}), three(F32, {3}), wrongB(F32, {3, 4}), dense(F32, {2, 4, 8, 12});
    for (int64_t type : {2, 3}) {
        const std::string t = std::to_string(type);
        Args a = fixedArgs();
        a.pseType = type;
        a.pse = byHead.h();
        expectPlanOk(a);
        a.pse = byBatch.h();
        expectPlanOk(a);
        a.pse = half.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.dtype = fp16", "fp32 (slopes)", "pseType " + t});
        a.pse = three.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [3]", "[B,N1] = [2,4]", "[N1] = [4]"});
        a.pse = wrongB.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [3,4]", "slopes"});
        a.pse = dense.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [2,4,8,12]", "slopes"});
    }
    // TND: B is the number of sequences.
    Args a = tndArgs();
    a.pseType = 2;
    a.pse = byBatch.h();
    expectPlanOk(a);
    a.pse = wrongB.h();
    EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [3,4]", "[B,N1] = [2,4]"});
}

TEST_F(FaCheck, PseTndForms) {
    // Sequences (4, 6) x (6, 8), N1 = 4: dense sum N1*Sq*Skv = 4*(24+48) = 288, rows sum N1*Skv = 56.
    Tensor dense(F32, {288}), rows(F32, {56}), bad(F32, {287}), half(F16, {288}), twoD(F32, {4, 72});
    for (int64_t type : {0, 1}) {
        Args a = tndArgs();
        a.pseType = type;
        a.pse = dense.h();
        expectPlanOk(a);
        a.pse = rows.h();
        expectPlanOk(a);
        a.pse = bad.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [287]", "[sum N1*Sq_i*Skv_i] = [288]", "[sum N1*Skv_i] = [56]"});
        a.pse = half.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.dtype = fp16"});
        a.pse = twoD.h();
        EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [4,72]", "4-D (or 1-D with TND)"});
    }
}

TEST_F(FaCheck, PseCompressedAlibiPreconditions) {
    // Fixed layouts: S1 == S2 > 1024, last dim S2, lower-triangular mask (an attenMask with mode 2/3,
    // or 0 with next <= 0): without a mask nothing is masked, so the upper triangle would be undefined.
    const int64_t s = 1100;
    Tensor compressed(U8, {2048, 2048}), full(U8, {s, s});
    Tensor aq(F32, {1, 1, s, 8}), o(F32, {1, 1, s, 8}), pse(F32, {1, 1, 1024, s}), pseNarrow(F32, {1, 1, 1024, s - 1});
    Tensor kShort(F32, {1, 1, s - 1, 8}), pseShort(F32, {1, 1, 1024, s - 1});
    Tensor q1000(F32, {1, 1, 1000, 8}), pse1000(F32, {1, 1, 1024, 1000});
    Args a;
    a.headNum = 1;
    a.q = aq.h();
    a.k = aq.h();
    a.v = aq.h();
    a.out = o.h();
    a.pse = pse.h();
    const std::vector<std::string> rule = {"realShift.shape = [1,1,1024,", "compressed alibi", "lower-triangular"};
    for (int64_t mode : {2, 3}) {
        a.sparseMode = mode;
        a.mask = nullptr;
        EXPECT_PLAN_ERROR(a, INV, rule);
        a.mask = compressed.h();
        expectPlanOk(a);
    }
    a.sparseMode = 0;
    a.mask = full.h();
    a.next = 0;
    expectPlanOk(a);
    a.next = -3;
    expectPlanOk(a);
    a.next = 1;
    EXPECT_PLAN_ERROR(a, INV, rule);
    a.next = kNoBand;
    EXPECT_PLAN_ERROR(a, INV, rule);
    a.sparseMode = 4;
    a.mask = compressed.h();
    a.pre = 10;
    a.next = 0;
    EXPECT_PLAN_ERROR(a, INV, rule);
    a.pre = kNoBand;
    a.next = kNoBand;
    a.sparseMode = 2;
    a.pse = pseNarrow.h();  // last dim != S2
    EXPECT_PLAN_ERROR(a, INV, rule);
    a.pse = pseShort.h();  // S1 != S2
    a.k = kShort.h();
    a.v = kShort.h();
    EXPECT_PLAN_ERROR(a, INV, rule);
    a.q = q1000.h();  // S1 = S2 <= 1024
    a.k = q1000.h();
    a.v = q1000.h();
    a.out = q1000.h();
    a.pse = pse1000.h();
    EXPECT_PLAN_ERROR(a, INV, rule);
    // TND: every sequence Sq == Skv <= last dim; the default sequences (4,6) x (6,8) are unequal.
    Tensor tpse(F32, {1, 4, 1024, 8});
    a = tndArgs();
    a.sparseMode = 3;
    a.mask = compressed.h();
    a.pse = tpse.h();
    EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [1,4,1024,8]", "compressed alibi"});
    Tensor tk10(F32, {10, 2, 16});
    IntArray eq({4, 10});
    a.k = tk10.h();
    a.v = tk10.h();
    a.kvCum = eq.h();
    expectPlanOk(a);
    Tensor tpse5(F32, {1, 4, 1024, 5});  // 5 < longest sequence 6
    a.pse = tpse5.h();
    EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [1,4,1024,5]", "compressed alibi"});
    a.pse = tpse.h();
    a.sparseMode = 7;
    EXPECT_PLAN_ERROR(a, INV, {"realShift.shape = [1,4,1024,8]", "compressed alibi"});
}

// ---------------------------------------------------------------- 12. dropout

TEST_F(FaCheck, DropMask) {
    // B*N1*S1*S2 = 768 bits = 96 bytes.
    Tensor ok(U8, {96}), small(U8, {95}), f32(F32, {96}), strided(U8, {96}, {2}), md(U8, {2, 48}), mdStrided(U8, {2, 48}, {100, 1});
    Args a = fixedArgs();
    a.keepProb = 0.5;
    a.drop = ok.h();
    expectPlanOk(a);
    a.drop = strided.h();
    expectPlanOk(a);
    a.drop = md.h();
    expectPlanOk(a);
    a.drop = small.h();
    EXPECT_PLAN_ERROR(a, INV, {"dropMask.numel = 95", "ceil(768 / 8) = 96"});
    a.drop = f32.h();
    EXPECT_PLAN_ERROR(a, INV, {"dropMask.dtype = fp32", "uint8"});
    a.drop = mdStrided.h();
    EXPECT_PLAN_ERROR(a, UNS, {"dropMask = [2,48]", "contiguous"});
    // keepProb 1: the mask is not used, so it is not checked.
    a.keepProb = 1.0;
    a.drop = f32.h();
    expectPlanOk(a);
    // TND: N1 * sum Sq*Skv = 288 bits = 36 bytes.
    Tensor t35(U8, {35}), t36(U8, {36});
    a = tndArgs();
    a.keepProb = 0.9;
    a.drop = t35.h();
    EXPECT_PLAN_ERROR(a, INV, {"dropMask.numel = 35", "ceil(288 / 8) = 36"});
    a.drop = t36.h();
    expectPlanOk(a);
}

// ---------------------------------------------------------------- 13. sink

TEST_F(FaCheck, Sink) {
    Tensor ok(F32, {4}), half(F16, {4}), three(F32, {3}), twoD(F32, {1, 4}), strided(F32, {4}, {3});
    Args a = fixedArgs();
    a.sink = ok.h();
    expectPlanOk(a);
    a.sink = strided.h();
    expectPlanOk(a);
    a.sink = half.h();
    EXPECT_PLAN_ERROR(a, INV, {"sink.dtype = fp16", "fp32"});
    a.sink = three.h();
    EXPECT_PLAN_ERROR(a, INV, {"sink.shape = [3]", "[N1] = [4]"});
    a.sink = twoD.h();
    EXPECT_PLAN_ERROR(a, INV, {"sink.shape = [1,4]", "[N1] = [4]"});
}

// ---------------------------------------------------------------- 14. statistics

TEST_F(FaCheck, StatisticsOutputs) {
    Args a = fixedArgs();
    a.ssum = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"softmaxSum = NULL", "together"});
    a = fixedArgs();
    a.smax = nullptr;
    EXPECT_PLAN_ERROR(a, NUL, {"softmaxMax = NULL", "together"});
    Tensor half(F16, {2, 4, 8, 8}), lanes4(F32, {2, 4, 8, 4}), rows9(F32, {2, 4, 9, 8}), lanes1(F32, {2, 4, 8, 1}),
        r3(F32, {2, 4, 8}), nsd(F32, {4, 2, 8, 8});
    a = fixedArgs();
    a.smax = half.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxMax.dtype = fp16", "fp32"});
    a = fixedArgs();
    a.ssum = half.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxSum.dtype = fp16", "fp32"});
    for (const Tensor* t : {&lanes4, &rows9, &r3, &nsd}) {
        a = fixedArgs();
        a.smax = t->h();
        EXPECT_PLAN_ERROR(a, INV, {"softmaxMax.shape = [", "[B,N1,S1,8|1] = [2,4,8,8|1]"});
        a = fixedArgs();
        a.ssum = t->h();
        EXPECT_PLAN_ERROR(a, INV, {"softmaxSum.shape = [", "trailing 8 or 1"});
    }
    a = fixedArgs();
    a.ssum = lanes1.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxSum.shape = [2,4,8,1]", "same trailing dim as softmaxMax [2,4,8,8]"});
    Tensor lanes1b(F32, {2, 4, 8, 1});
    a.smax = lanes1b.h();
    expectPlanOk(a);
    // TND: [T1, N1, 8|1] in true T, N order.
    Tensor ntd(F32, {4, 10, 8}), t9(F32, {9, 4, 8}), t1(F32, {10, 4, 1}), t1b(F32, {10, 4, 1});
    a = tndArgs();
    a.smax = ntd.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxMax.shape = [4,10,8]", "[T1,N1,8|1] = [10,4,8|1]"});
    a = tndArgs();
    a.ssum = t9.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxSum.shape = [9,4,8]"});
    a.smax = t1.h();
    a.ssum = t1b.h();
    expectPlanOk(a);
}

TEST_F(FaCheck, SoftmaxOutIsReserved) {
    Tensor full(F32, {2, 4, 8, 8}), empty1(F32, {0}), empty4(F32, {0, 0, 0, 0});
    Args a = fixedArgs();
    a.softmaxOut = full.h();
    EXPECT_PLAN_ERROR(a, INV, {"softmaxOut.shape = [2,4,8,8]", "reserved"});
    a.softmaxOut = empty1.h();
    expectPlanOk(a);
    a.softmaxOut = empty4.h();
    expectPlanOk(a);
}

// ---------------------------------------------------------------- 64-bit overflow of the geometry

TEST_F(FaCheck, GeometryOverflow) {
    // Element counts whose products overflow int64 are rejected, not wrapped. The tensors are
    // views with zero strides over one element, so nothing large is allocated.
    const int64_t big = int64_t(1) << 31;
    Tensor gq(F32, {1, 1, big, 1}, {0, 0, 0, 0}), gk(F32, {1, 1, big, 1}, {0, 0, 0, 0}), o(F32, {1, 1, big, 1}, {0, 0, 0, 0});
    Tensor k2(F32, {1, 1, big * 4, 1}, {0, 0, 0, 0});
    Args a;
    a.headNum = 1;
    a.q = gq.h();
    a.k = gk.h();
    a.v = gk.h();
    a.out = o.h();
    a.smax = a.ssum = nullptr;
    // 2^31 x 2^31 = 2^62 fits; 2^31 x 2^33 = 2^64 does not.
    a.k = a.v = k2.h();
    EXPECT_PLAN_ERROR(a, UNS, {"overflows 64-bit indexing"});
}

// ---------------------------------------------------------------- tensor and int-array creation

TEST_F(FaCheck, TensorCreation) {
    float data[16] = {};
    const int64_t shape[] = {2, 3}, strides[] = {3, 1};
    attnopsTensor* t = reinterpret_cast<attnopsTensor*>(uintptr_t(0x10));
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, nullptr), NUL, {"tensor = NULL"});
    for (int bad : {5, 13, 100, -1}) {
        EXPECT_STATUS(attnopsCreateTensor(data, attnopsDataType(bad), 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t), INV,
                      {"dtype = " + std::to_string(bad), "not an attnopsDataType"});
        EXPECT_EQ(t, nullptr);
    }
    const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 9, nine, nullptr, ATTNOPS_HOST_MEMORY, &t), INV, {"rank = 9", "[0, 8]"});
    EXPECT_STATUS(attnopsCreateTensor(data, F32, -1, shape, nullptr, ATTNOPS_HOST_MEMORY, &t), INV, {"rank = -1"});
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, nullptr, nullptr, ATTNOPS_HOST_MEMORY, &t), NUL, {"shape = NULL", "rank > 0"});
    const int64_t negative[] = {2, -2};
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, negative, nullptr, ATTNOPS_HOST_MEMORY, &t), INV, {"shape[1] = -2", ">= 0"});
    const int64_t negStride[] = {-1, 1};
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, shape, negStride, ATTNOPS_HOST_MEMORY, &t), INV, {"strides[0] = -1", ">= 0"});
    const int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, huge, nullptr, ATTNOPS_HOST_MEMORY, &t), INV, {"shape = (too large)", "overflows"});
    const int64_t hugeStride[] = {std::numeric_limits<int64_t>::max(), 1};
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, shape, hugeStride, ATTNOPS_HOST_MEMORY, &t), INV, {"strides = (too large)", "overflows"});
    EXPECT_STATUS(attnopsCreateTensor(data, F32, 2, shape, nullptr, -2, &t), INV, {"device = -2"});
    EXPECT_STATUS(attnopsCreateTensor(nullptr, F32, 2, shape, strides, ATTNOPS_HOST_MEMORY, &t), NUL, {"data = NULL", "elements"});
    EXPECT_EQ(t, nullptr);
    // Valid edge cases: NULL data without elements, rank 0, rank 8.
    const int64_t empty[] = {2, 0};
    ASSERT_EQ(attnopsCreateTensor(nullptr, F32, 2, empty, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsCreateTensor(data, F32, 0, nullptr, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
    const int64_t eight[8] = {1, 1, 1, 1, 1, 1, 2, 2};
    ASSERT_EQ(attnopsCreateTensor(data, BF16, 8, eight, nullptr, 0, &t), ATTNOPS_SUCCESS);
    // Destroying twice: the second is a stale handle, not a crash. NULL is a no-op.
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsDestroyTensor(t), INV, {"tensor = 0x", "not a live tensor handle"});
    EXPECT_EQ(attnopsDestroyTensor(nullptr), ATTNOPS_SUCCESS);
}

TEST_F(FaCheck, IntArrayCreation) {
    const int64_t values[] = {1, 2, 3};
    attnopsIntArray* arr = nullptr;
    EXPECT_STATUS(attnopsCreateIntArray(values, 3, nullptr), NUL, {"array = NULL"});
    EXPECT_STATUS(attnopsCreateIntArray(nullptr, 3, &arr), NUL, {"values = NULL", "size > 0"});
    EXPECT_EQ(arr, nullptr);
    ASSERT_EQ(attnopsCreateIntArray(nullptr, 0, &arr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyIntArray(arr), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsCreateIntArray(values, 3, &arr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyIntArray(arr), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsDestroyIntArray(arr), INV, {"array = 0x", "not a live int-array handle"});
    EXPECT_EQ(attnopsDestroyIntArray(nullptr), ATTNOPS_SUCCESS);
}

// ---------------------------------------------------------------- executors and streams

attnopsExecutor* planned(const Args& a, uint64_t* ws) {
    attnopsExecutor* exec = nullptr;
    EXPECT_EQ(a.plan(ws, &exec), ATTNOPS_SUCCESS) << lastMessage();
    return exec;
}

TEST_F(FaCheck, ExecutorIsSingleUse) {
    uint64_t ws = 0;
    attnopsExecutor* exec = planned(fixedArgs(), &ws);
    ASSERT_GT(ws, 0u);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsFlashAttentionScore(workspace, ws, exec, nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, exec, nullptr), RTE, {"executor = 0x", "not a live executor", "single-use"});
    EXPECT_STATUS(attnopsDestroyExecutor(exec), RTE, {"executor = 0x", "not a live executor"});
    // Destroyed, then executed.
    exec = planned(fixedArgs(), &ws);
    EXPECT_EQ(attnopsDestroyExecutor(exec), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, exec, nullptr), RTE, {"executor = 0x", "not a live executor"});
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, nullptr, nullptr), NUL, {"executor = NULL"});
    EXPECT_EQ(attnopsDestroyExecutor(nullptr), ATTNOPS_SUCCESS);
    // A pointer that never was an executor.
    int64_t junk[8] = {};
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, reinterpret_cast<attnopsExecutor*>(junk), nullptr), RTE,
                  {"not a live executor"});
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
}

TEST_F(FaCheck, ExecutorWorkspace) {
    uint64_t ws = 0;
    attnopsExecutor* exec = planned(fixedArgs(), &ws);
    ASSERT_GT(ws, 0u);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws - 1, exec, nullptr), INV,
                  {"workspaceSize = " + std::to_string(ws - 1), "must be >= " + std::to_string(ws)});
    // The executor is consumed whatever the outcome.
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, exec, nullptr), RTE, {"not a live executor"});
    exec = planned(fixedArgs(), &ws);
    EXPECT_STATUS(attnopsFlashAttentionScore(nullptr, ws, exec, nullptr), NUL,
                  {"workspace = NULL", std::to_string(ws) + " bytes are required"});
    exec = planned(fixedArgs(), &ws);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, 0, exec, nullptr), INV, {"workspaceSize = 0"});
    // A larger workspace is fine.
    Args a = fixedArgs();
    exec = planned(a, &ws);
    void* bigger = nullptr;
    ASSERT_EQ(attnopsMalloc(ws + 4096, &bigger), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScore(bigger, ws + 4096, exec, nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(bigger), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
}

TEST_F(FaCheck, Streams) {
    attnopsStream* stream = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&stream), ATTNOPS_SUCCESS);
    uint64_t ws = 0;
    attnopsExecutor* exec = planned(fixedArgs(), &ws);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsFlashAttentionScore(workspace, ws, exec, stream), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(stream), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(stream), ATTNOPS_SUCCESS);
    // The destroyed stream is stale everywhere.
    exec = planned(fixedArgs(), &ws);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, exec, stream), INV, {"stream = 0x", "not a live stream"});
    EXPECT_STATUS(attnopsStreamSynchronize(stream), INV, {"stream = 0x", "not a live stream"});
    EXPECT_STATUS(attnopsStreamDestroy(stream), INV, {"stream = 0x", "already destroyed"});
    EXPECT_STATUS(attnopsStreamDestroy(nullptr), NUL, {"stream = NULL", "default stream"});
    EXPECT_STATUS(attnopsStreamCreate(nullptr), NUL, {"stream = NULL"});
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
}

TEST_F(FaCheck, ThreadCountChangedBetweenPhases) {
    // Planned for 1 worker thread, run on 2: the error surfaces at synchronise, on that stream
    // only, and the stream stays usable.
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    uint64_t ws = 0;
    attnopsExecutor* exec = planned(fixedArgs(), &ws);
    ASSERT_EQ(attnopsSetDeviceThreads(0, 2), ATTNOPS_SUCCESS);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    attnopsStream* stream = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&stream), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsFlashAttentionScore(workspace, ws, exec, stream), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);  // the default stream is not poisoned
    EXPECT_STATUS(attnopsStreamSynchronize(stream), RTE, {"FlashAttentionScore", "2 worker threads", "planned for 1"});
    EXPECT_EQ(attnopsStreamSynchronize(stream), ATTNOPS_SUCCESS);  // the error was cleared
    // Planned for 2, run on 1: fine.
    exec = planned(fixedArgs(), &ws);
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsFlashAttentionScore(workspace, ws, exec, stream), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(stream), ATTNOPS_SUCCESS) << lastMessage();
    EXPECT_EQ(attnopsStreamDestroy(stream), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsSetDeviceThreads(0, info.threads), ATTNOPS_SUCCESS);
}

TEST_F(FaCheck, CrossDeviceMisuse) {
    int32_t count = 0;
    ASSERT_EQ(attnopsGetDeviceCount(&count), ATTNOPS_SUCCESS);
    if (!kTwoDevices || count < 2) GTEST_SKIP() << "needs ATTNOPS_NUM_DEVICES >= 2 (have " << count << ")";
    // A tensor bound to device 1 while planning on device 0.
    Tensor q1(F32, {2, 4, 8, 16}, {}, 1);
    Args a = fixedArgs();
    a.q = q1.h();
    EXPECT_PLAN_ERROR(a, INV, {"query.device = 1", "current device 0"});
    // Planned on device 1, launched on device 0's stream.
    ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
    expectPlanOk(a);
    uint64_t ws = 0;
    attnopsExecutor* exec = planned(fixedArgs(), &ws);
    void* workspace = nullptr;
    ASSERT_EQ(attnopsMalloc(ws, &workspace), ATTNOPS_SUCCESS);
    attnopsStream* stream1 = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&stream1), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFlashAttentionScore(workspace, ws, exec, nullptr), INV, {"stream = on device 0", "planned on device 1"});
    // On a stream of its own device it runs, whatever the calling thread's current device.
    exec = nullptr;
    ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
    exec = planned(fixedArgs(), &ws);
    ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScore(workspace, ws, exec, stream1), ATTNOPS_SUCCESS) << lastMessage();
    EXPECT_EQ(attnopsStreamSynchronize(stream1), ATTNOPS_SUCCESS) << lastMessage();
    EXPECT_EQ(attnopsStreamDestroy(stream1), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(workspace), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsSetDevice(count), INV, {"device = " + std::to_string(count)});
}

TEST_F(FaCheck, RuntimeArguments) {
    void* p = nullptr;
    EXPECT_STATUS(attnopsMalloc(64, nullptr), NUL, {"ptr = NULL"});
    int local = 0;
    EXPECT_STATUS(attnopsFree(&local), INV, {"ptr = 0x", "not returned by attnopsMalloc"});
    ASSERT_EQ(attnopsMalloc(64, &p), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFree(p), INV, {"ptr = 0x", "already freed"});
    EXPECT_EQ(attnopsFree(nullptr), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsSetDeviceThreads(0, 0), INV, {"threads = 0", "[1, 4096]"});
    EXPECT_STATUS(attnopsSetDeviceThreads(0, -3), INV, {"threads = -3"});
    EXPECT_STATUS(attnopsSetDeviceThreads(99, 1), INV, {"device = 99"});
    EXPECT_STATUS(attnopsSetDevice(-1), INV, {"device = -1"});
    EXPECT_STATUS(attnopsSetDevice(99), INV, {"device = 99"});
    EXPECT_STATUS(attnopsGetDeviceCount(nullptr), NUL, {"count = NULL"});
    EXPECT_STATUS(attnopsGetDevice(nullptr), NUL, {"device = NULL"});
    attnopsDeviceInfo info{};
    EXPECT_STATUS(attnopsGetDeviceInfo(0, nullptr), NUL, {"info = NULL"});
    EXPECT_STATUS(attnopsGetDeviceInfo(7, &info), INV, {"device = 7"});
    EXPECT_STATUS(attnopsDeviceSynchronize(7), INV, {"device = 7"});
    EXPECT_STREQ(attnopsStatusName(ATTNOPS_ERROR_INVALID_ARGUMENT), "ATTNOPS_ERROR_INVALID_ARGUMENT");
    EXPECT_STREQ(attnopsStatusName(attnopsStatus(42)), "ATTNOPS_UNKNOWN_STATUS");
}

TEST_F(FaCheck, ForcedImplementationName) {
    setenv("ATTNOPS_FORCE_IMPL", "fastest-please", 1);
    EXPECT_PLAN_ERROR(fixedArgs(), INV, {"ATTNOPS_FORCE_IMPL = fastest-please", "tiled-generic", "reference"});
    unsetenv("ATTNOPS_FORCE_IMPL");
}

TEST_F(FaCheck, ExecutorImplementationName) {
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(fixedArgs().plan(&ws, &exec), ATTNOPS_SUCCESS) << lastMessage();
    const char* name = nullptr;
    ASSERT_EQ(attnopsGetExecutorImplementation(exec, &name), ATTNOPS_SUCCESS) << lastMessage();
    ASSERT_NE(name, nullptr);
    EXPECT_NE(std::string(name), "");
    EXPECT_STATUS(attnopsGetExecutorImplementation(exec, nullptr), NUL, {"name = NULL"});
    ASSERT_EQ(attnopsDestroyExecutor(exec), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsGetExecutorImplementation(exec, &name), RTE, {"executor = ", "not a live executor"});
    EXPECT_STATUS(attnopsGetExecutorImplementation(nullptr, &name), NUL, {"executor = NULL"});

    setenv("ATTNOPS_FORCE_IMPL", "reference", 1);
    ASSERT_EQ(fixedArgs().plan(&ws, &exec), ATTNOPS_SUCCESS) << lastMessage();
    unsetenv("ATTNOPS_FORCE_IMPL");
    ASSERT_EQ(attnopsGetExecutorImplementation(exec, &name), ATTNOPS_SUCCESS) << lastMessage();
    EXPECT_STREQ(name, "reference");
    ASSERT_EQ(attnopsDestroyExecutor(exec), ATTNOPS_SUCCESS);
}

// ---------------------------------------------------------------- dropout-mask helpers

TEST_F(FaCheck, DropMaskBytes) {
    uint64_t bytes = 0;
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(2, 4, 8, 12, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 96u);
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(1, 1, 3, 3, nullptr, nullptr, &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 2u);  // ceil(9 / 8)
    ASSERT_EQ(attnopsFlashAttentionDropMaskBytes(0, 4, 0, 0, qCum.h(), kvCum.h(), &bytes), ATTNOPS_SUCCESS);
    EXPECT_EQ(bytes, 36u);  // 4 * (4*6 + 6*8) / 8
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(2, 4, 8, 12, nullptr, nullptr, nullptr), NUL, {"bytes = NULL"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(2, 0, 8, 12, nullptr, nullptr, &bytes), INV, {"headNum = 0", "> 0"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(-1, 4, 8, 12, nullptr, nullptr, &bytes), INV, {"batch = -1", ">= 0"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(2, 4, -8, 12, nullptr, nullptr, &bytes), INV, {"qSeqLen = -8"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(2, 4, 8, -12, nullptr, nullptr, &bytes), INV, {"kvSeqLen = -12"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(0, 4, 0, 0, qCum.h(), nullptr, &bytes), NUL, {"actualSeqKvLen = NULL", "both"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(0, 4, 0, 0, nullptr, kvCum.h(), &bytes), NUL, {"actualSeqQLen = NULL", "both"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(2, 4, 0, 0, qCum.h(), kvCum.h(), &bytes), INV,
                  {"batch/qSeqLen/kvSeqLen = 2/0/0", "must be 0"});
    IntArray three({1, 2, 3}), down({5, 4});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(0, 4, 0, 0, qCum.h(), three.h(), &bytes), INV, {"actualSeqKvLen.size = 3"});
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(0, 4, 0, 0, down.h(), kvCum.h(), &bytes), INV, {"actualSeqQLen[1] = 4"});
    const int64_t big = int64_t(1) << 40;
    EXPECT_STATUS(attnopsFlashAttentionDropMaskBytes(big, 4, big, 12, nullptr, nullptr, &bytes), UNS, {"overflows"});
}

TEST_F(FaCheck, GenDropMask) {
    Tensor ok(U8, {96}), small(U8, {95}), f32(F32, {96}), twoD(U8, {2, 48}), strided(U8, {96}, {2});
    EXPECT_EQ(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, ok.h()), ATTNOPS_SUCCESS);
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, nullptr), NUL, {"dropMaskOut = NULL"});
    for (double bad : {0.0, 1.5, kNaN, -1.0})
        EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, bad, 1, 2, ok.h()), INV, {"keepProb = ", "(0, 1]"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, f32.h()), INV, {"dropMaskOut.dtype = fp32", "uint8"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, twoD.h()), INV,
                  {"dropMaskOut.shape = [2,48]", "contiguous 1-D"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, strided.h()), INV,
                  {"dropMaskOut.shape = [96]", "contiguous 1-D"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, small.h()), INV,
                  {"dropMaskOut.shape = [95]", "at least 96 bytes"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, -4, 8, 12, nullptr, nullptr, 0.5, 1, 2, ok.h()), INV, {"headNum = -4"});
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(0, 4, 0, 0, qCum.h(), nullptr, 0.5, 1, 2, ok.h()), NUL, {"actualSeqKvLen = NULL"});
    IntArray doomed({4, 10});
    attnopsIntArray* stale = doomed.destroyKeepingPointer();
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(0, 4, 0, 0, stale, kvCum.h(), 0.5, 1, 2, ok.h()), INV,
                  {"actualSeqQLen = 0x", "not a live int-array handle"});
    Tensor dead(U8, {96});
    attnopsTensor* staleOut = dead.destroyKeepingPointer();
    EXPECT_STATUS(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, staleOut), INV,
                  {"dropMaskOut = 0x", "not a live tensor handle"});
    // The failures wrote nothing: the valid mask from the first call is intact.
    Tensor again(U8, {96});
    ASSERT_EQ(attnopsFlashAttentionGenDropMask(2, 4, 8, 12, nullptr, nullptr, 0.5, 1, 2, again.h()), ATTNOPS_SUCCESS);
    EXPECT_EQ(ok.bytes(), again.bytes());
}

TEST_F(FaCheck, LastErrorMessageIsPerCallAndPerThread) {
    Args a = fixedArgs();
    a.headNum = 0;
    uint64_t ws = 0;
    attnopsExecutor* exec = nullptr;
    ASSERT_EQ(a.plan(&ws, &exec), INV);
    const std::string first = lastMessage();
    EXPECT_NE(first.find("headNum = 0"), std::string::npos);
    // A new failure replaces the message.
    a = fixedArgs();
    a.scale = kNaN;
    ASSERT_EQ(a.plan(&ws, &exec), INV);
    EXPECT_EQ(lastMessage().find("headNum"), std::string::npos);
    EXPECT_NE(lastMessage().find("scaleValue = nan"), std::string::npos);
}

}  // namespace
