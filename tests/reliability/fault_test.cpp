// Faults: injected allocation failures (attnops::testing::failAllocationsAfter, internal) at every
// allocation point a call passes — checks, plans, executors, workspace, queue entries, the worker
// pool built by the queue thread — must each give ATTNOPS_ERROR_OUT_OF_MEMORY with a message,
// leak no handle or block (the ASan run's LeakSanitizer checks the heap), and leave the library
// usable; executor misuse is an error, not a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "core/fault.hpp"
#include "core/handles.hpp"
#include "problem.hpp"
#include "problem_bar.hpp"
#include "problem_grad.hpp"
#include "runtime/device.hpp"
#include "runtime/executor_registry.hpp"
#include "threads_guard.hpp"

namespace {

using attnops::tools::BarInstance;
using attnops::tools::BarProblem;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

std::string lastError() { return attnopsGetLastErrorMessage(); }

// Stops the injected allocation failures, then restores device 0's worker-thread count.
struct ThreadsGuard : attnops::testsupport::ThreadsGuard {
    ~ThreadsGuard() { attnops::testing::stopFailingAllocations(); }
};

struct Counts {
    size_t executors, tensors, arrays, blocks;
    bool operator==(const Counts&) const = default;
};
Counts liveCounts() {
    return {attnops::liveExecutorCount(), attnops::tensorRegistry().size(), attnops::intArrayRegistry().size(),
            attnops::Runtime::get().device(0, "device").liveAllocations()};
}

// Runs `call` (both phases and a synchronize) with the n-th allocation point failing, for
// n = 0, 1, 2, ... until it succeeds. Every failure must be OOM with a message and leave nothing
// behind; after each failure the same call, without injection, must succeed with the bits
// `outputs` returned by an uninjected run. The worker count alternates between 1 and 2 so that
// the queue thread rebuilds its pool inside every injected call (a failure in queued work).
// Returns the number of failing points seen before the first success.
int64_t failEachAllocationInTurn(const std::function<attnopsStatus()>& call,
                                 const std::function<std::vector<uint8_t>()>& outputs) {
    ThreadsGuard guard;
    EXPECT_EQ(attnopsSetDeviceThreads(0, 1), ATTNOPS_SUCCESS);
    EXPECT_EQ(call(), ATTNOPS_SUCCESS) << lastError();
    const std::vector<uint8_t> want = outputs();
    const Counts before = liveCounts();
    for (int64_t n = 0; n < 200; ++n) {
        EXPECT_EQ(attnopsSetDeviceThreads(0, int32_t(2 - n % 2)), ATTNOPS_SUCCESS);
        attnops::Runtime::get().device(0, "device").planCache().clear();
        attnops::testing::failAllocationsAfter(n);
        const attnopsStatus st = call();
        attnops::testing::stopFailingAllocations();
        const std::string message = lastError();
        if (st == ATTNOPS_SUCCESS) {
            EXPECT_EQ(attnops::testing::injectedFailures(), 0) << "a failed allocation point went unreported";
            EXPECT_TRUE(outputs() == want) << "success after " << n << " allocation points";
            EXPECT_TRUE(liveCounts() == before);
            return n;
        }
        EXPECT_EQ(st, ATTNOPS_ERROR_OUT_OF_MEMORY) << "allocation point " << n << ": " << message;
        EXPECT_NE(message.find("out of memory"), std::string::npos) << "allocation point " << n << ": " << message;
        EXPECT_GE(attnops::testing::injectedFailures(), 1) << "allocation point " << n;
        EXPECT_TRUE(liveCounts() == before) << "allocation point " << n << " leaked a handle or block";
        EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << "reported once: " << lastError();
        EXPECT_EQ(call(), ATTNOPS_SUCCESS) << "after a failure at point " << n << ": " << lastError();
        EXPECT_TRUE(outputs() == want) << "after a failure at point " << n;
        if (::testing::Test::HasFailure()) return n;
    }
    ADD_FAILURE() << "the call never succeeded";
    return -1;
}

FaProblem faProblem(attnopsDataType dtype) {
    FaProblem p = attnops::tools::fixed("BSND", dtype, 2, 40, 56, 4, 2, 32);
    p.sparseMode = 2;
    p.keepProb = 0.9;
    p.seed = 3;
    return p;
}

TEST(Fault, ForwardFailsCleanlyAtEveryAllocationPoint) {
    FaInstance inst(faProblem(ATTNOPS_BFLOAT16));
    const int64_t points = failEachAllocationInTurn([&] { return inst.runForward(); },
                                                    [&] { return inst.attentionOut.bytes(); });
    // check tables, plan, executor, workspace, queue entry, worker pool
    EXPECT_GE(points, 6);
}

TEST(Fault, BackwardFailsCleanlyAtEveryAllocationPoint) {
    FaInstance inst(faProblem(ATTNOPS_FLOAT16));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    attnops::tools::FaGrads g = attnops::tools::makeGrads(inst);
    const int64_t points = failEachAllocationInTurn([&] { return attnops::tools::runBackward(inst, g); }, [&] {
        std::vector<uint8_t> all = g.dq.bytes();
        all.insert(all.end(), g.dk.bytes().begin(), g.dk.bytes().end());
        all.insert(all.end(), g.dv.bytes().begin(), g.dv.bytes().end());
        return all;
    });
    EXPECT_GE(points, 6);
}

TEST(Fault, BlockAttentionResidualsFailsCleanlyAtEveryAllocationPoint) {
    BarProblem p;
    p.tokens = 33;
    p.blocks = 5;
    p.hidden = 72;
    p.dtype = ATTNOPS_BFLOAT16;
    BarInstance inst(p);
    const int64_t forwardPoints = failEachAllocationInTurn([&] { return inst.runForward(true); }, [&] {
        std::vector<uint8_t> all = inst.hiddenStates.bytes();
        all.insert(all.end(), inst.probs.bytes().begin(), inst.probs.bytes().end());
        return all;
    });
    EXPECT_GE(forwardPoints, 5);  // plan, executor, workspace, queue entry, worker pool
    const int64_t backwardPoints = failEachAllocationInTurn([&] { return inst.runBackward(); }, [&] {
        std::vector<uint8_t> all = inst.gradBlockRes.bytes();
        all.insert(all.end(), inst.gradProjWeight.bytes().begin(), inst.gradProjWeight.bytes().end());
        all.insert(all.end(), inst.gradNormWeight.bytes().begin(), inst.gradNormWeight.bytes().end());
        return all;
    });
    EXPECT_GE(backwardPoints, 5);
}

TEST(Fault, HandleAndStreamCreationReportOutOfMemory) {
    const Counts before = liveCounts();
    const int64_t shape[2] = {2, 3};
    float data[6] = {};
    const int64_t values[3] = {1, 2, 3};
    attnopsTensor* t = nullptr;
    attnopsIntArray* a = nullptr;
    attnopsStream* s = nullptr;
    void* p = nullptr;
    attnops::testing::failAllocationsAfter(0);
    EXPECT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t),
              ATTNOPS_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(lastError().find("out of memory"), std::string::npos) << lastError();
    EXPECT_EQ(attnopsCreateIntArray(values, 3, &a), ATTNOPS_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(attnopsStreamCreate(&s), ATTNOPS_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(attnopsMalloc(100, &p), ATTNOPS_ERROR_OUT_OF_MEMORY);
    EXPECT_NE(lastError().find("attnopsMalloc(100): out of memory"), std::string::npos) << lastError();
    attnops::testing::stopFailingAllocations();
    EXPECT_EQ(t, nullptr);
    EXPECT_EQ(a, nullptr);
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(p, nullptr);
    EXPECT_EQ(attnops::testing::injectedFailures(), 4);
    EXPECT_TRUE(liveCounts() == before);
    // And everything works again.
    ASSERT_EQ(attnopsCreateTensor(data, ATTNOPS_FLOAT32, 2, shape, nullptr, ATTNOPS_HOST_MEMORY, &t), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsCreateIntArray(values, 3, &a), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyIntArray(a), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyTensor(t), ATTNOPS_SUCCESS);
}

// A launch refused at submission (its queue entry could not be made) must not leave the stream
// waiting for work that never ran.
TEST(Fault, RefusedSubmissionDoesNotHangSynchronize) {
    FaInstance inst(faProblem(ATTNOPS_FLOAT32));
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS) << lastError();
    void* ws = nullptr;
    ASSERT_EQ(attnopsMalloc(size, &ws), ATTNOPS_SUCCESS);
    const size_t executors = attnops::liveExecutorCount();
    attnops::testing::failAllocationsAfter(0);
    EXPECT_EQ(attnopsFlashAttentionScore(ws, size, executor, s), ATTNOPS_ERROR_OUT_OF_MEMORY);
    attnops::testing::stopFailingAllocations();
    EXPECT_EQ(attnops::liveExecutorCount(), executors - 1) << "the executor is consumed";
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(ws), ATTNOPS_SUCCESS);
}

// Executor misuse the runtime tests do not cover: a destroyed stream, and a launch on a stream
// of a destroyed handle after work was queued on it. (Run twice, too-small and NULL workspace:
// tests/runtime Executor.*.)
TEST(Fault, LaunchOnDestroyedStreamIsAnError) {
    FaInstance inst(faProblem(ATTNOPS_FLOAT32));
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    ASSERT_EQ(inst.runForward(s), ATTNOPS_SUCCESS) << lastError();
    const std::vector<uint8_t> want = inst.attentionOut.bytes();
    ASSERT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
    std::fill(inst.attentionOut.bytes().begin(), inst.attentionOut.bytes().end(), 0);
    const size_t executors = attnops::liveExecutorCount();
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
    void* ws = nullptr;
    ASSERT_EQ(attnopsMalloc(size, &ws), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScore(ws, size, executor, s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("not a live stream"), std::string::npos) << lastError();
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_ERROR_RUNTIME) << "consumed by the failed launch";
    EXPECT_EQ(attnops::liveExecutorCount(), executors);
    EXPECT_EQ(attnopsFree(ws), ATTNOPS_SUCCESS);
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(inst.attentionOut.bytes() == want);
}

// An out-of-memory inside queued work (the queue thread's pool) surfaces at synchronize with the
// operator's name; the stream stays usable and later work on it runs.
TEST(Fault, OutOfMemoryInQueuedWorkSurfacesAtSynchronize) {
    ThreadsGuard guard;
    FaInstance inst(faProblem(ATTNOPS_FLOAT32));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    const std::vector<uint8_t> want = inst.attentionOut.bytes();
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDeviceThreads(0, info.threads + 1), ATTNOPS_SUCCESS);  // the next task rebuilds the pool
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
    void* ws = nullptr;
    ASSERT_EQ(attnopsMalloc(size, &ws), ATTNOPS_SUCCESS);
    std::fill(inst.attentionOut.bytes().begin(), inst.attentionOut.bytes().end(), 0);
    attnops::testing::failAllocationsAfter(1);  // the queue entry passes, the pool fails
    ASSERT_EQ(attnopsFlashAttentionScore(ws, size, executor, s), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_ERROR_OUT_OF_MEMORY);
    attnops::testing::stopFailingAllocations();
    EXPECT_EQ(lastError(), "FlashAttentionScore: host allocation failed: out of memory");
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS);
    ASSERT_EQ(inst.runForward(s), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(inst.attentionOut.bytes() == want);
    EXPECT_EQ(attnopsFree(ws), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
}

}  // namespace
