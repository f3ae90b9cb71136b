// The runtime: devices, streams, asynchronous errors, executors, workspace memory, the plan cache
// under concurrent use, and behaviour that needs a fresh process (cold start, device count from
// the environment), checked in child processes that re-run this binary with a hidden test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "child_process.hpp"
#include "problem.hpp"
#include "runtime/device.hpp"
#include "threads_guard.hpp"

extern char** environ;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTNOPS_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTNOPS_TEST_SANITIZED 1
#endif
#endif
#ifdef ATTNOPS_TEST_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace {

using attnops::testing::expectChildPasses;
using attnops::testing::isChild;
using attnops::testing::runChild;

using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

// ------------------------------------------------------------------ helpers

std::string lastError() { return attnopsGetLastErrorMessage(); }

// Workspace from attnopsMalloc, freed on scope exit.
class Workspace {
public:
    explicit Workspace(uint64_t bytes) {
        if (bytes > 0) {
            EXPECT_EQ(attnopsMalloc(bytes, &ptr_), ATTNOPS_SUCCESS) << lastError();
        }
    }
    ~Workspace() { attnopsFree(ptr_); }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* get() const { return ptr_; }

private:
    void* ptr_ = nullptr;
};

// A planned and enqueued call: its workspace must outlive the queued work.
struct Launch {
    attnopsStatus status = ATTNOPS_SUCCESS;
    std::unique_ptr<Workspace> workspace;
};

Launch enqueue(FaInstance& inst, attnopsStream* stream) {
    Launch l;
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    l.status = inst.plan(&size, &executor);
    if (l.status != ATTNOPS_SUCCESS) return l;
    l.workspace = std::make_unique<Workspace>(size);
    l.status = attnopsFlashAttentionScore(l.workspace->get(), size, executor, stream);
    return l;
}

// The bytes of every output of an instance.
struct Outputs {
    std::vector<uint8_t> out, max, sum;
    bool operator==(const Outputs&) const = default;
};
Outputs outputsOf(const FaInstance& inst) {
    return {inst.attentionOut.bytes(), inst.softmaxMax.empty() ? std::vector<uint8_t>() : inst.softmaxMax.bytes(),
            inst.softmaxSum.empty() ? std::vector<uint8_t>() : inst.softmaxSum.bytes()};
}

bool allZero(const std::vector<uint8_t>& bytes) {
    for (uint8_t b : bytes)
        if (b != 0) return false;
    return true;
}

// A few small problems of different kinds (layouts, dtypes, masks, GQA, dropout, TND).
FaProblem smallProblem(int kind) {
    FaProblem p;
    p.heads = 2;
    p.kvHeads = 2;
    p.dim = 32;
    p.qSeqLen = 70;
    p.kvSeqLen = 90;
    p.dataSeed = uint64_t(100 + kind);
    switch (kind % 6) {
        case 0: break;
        case 1: p.dtype = ATTNOPS_BFLOAT16; p.sparseMode = 2; p.layout = "BSND"; break;
        case 2: p.dtype = ATTNOPS_FLOAT16; p.heads = 4; p.kvHeads = 1; p.layout = "BSH"; break;
        case 3: p.keepProb = 0.8; p.seed = 11; p.batch = 2; break;
        case 4:
            p.layout = "TND";
            p.qSeqLens = {5, 0, 70, 1, 33};
            p.kvSeqLens = {9, 3, 64, 1, 0};
            p.sparseMode = 3;
            p.kvHeads = 1;
            break;
        case 5: p.dtype = ATTNOPS_BFLOAT16; p.layout = "SBH"; p.batch = 3; p.vDim = 16; break;
    }
    return p;
}

// A problem heavy enough (tens of milliseconds) that queued work is still running a while later.
FaProblem heavyProblem(uint64_t seed) {
    FaProblem p;
    p.batch = 2;
    p.heads = 4;
    p.kvHeads = 4;
    p.qSeqLen = 320;
    p.kvSeqLen = 320;
    p.dim = 64;
    p.dataSeed = seed;
    return p;
}

Outputs expectedOutputs(const FaProblem& p) {
    FaInstance inst(p);
    const attnopsStatus st = inst.runForward();
    EXPECT_EQ(st, ATTNOPS_SUCCESS) << lastError();
    EXPECT_FALSE(allZero(inst.attentionOut.bytes()));
    return outputsOf(inst);
}

int32_t deviceThreads(int32_t device) {
    attnopsDeviceInfo info{};
    EXPECT_EQ(attnopsGetDeviceInfo(device, &info), ATTNOPS_SUCCESS) << lastError();
    return info.threads;
}

using attnops::testsupport::ThreadsGuard;

// Sets an environment variable for the scope (the flags are read at each launch).
class EnvGuard {
public:
    EnvGuard(const char* name, const char* value) : name_(name) {
        const char* old = std::getenv(name);
        if (old) old_ = old;
        had_ = old != nullptr;
        setenv(name, value, 1);
    }
    ~EnvGuard() {
        if (had_)
            setenv(name_.c_str(), old_.c_str(), 1);
        else
            unsetenv(name_.c_str());
    }

private:
    std::string name_, old_;
    bool had_ = false;
};

// Plans `inst` at the current thread count, then raises the device's thread count so that the
// execution fails inside the queued work (the driver refuses a pool larger than the plan).
struct DoomedCall {
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    std::unique_ptr<Workspace> workspace;
};
DoomedCall planThenAddThread(FaInstance& inst, int32_t device) {
    DoomedCall c;
    EXPECT_EQ(inst.plan(&c.size, &c.executor), ATTNOPS_SUCCESS) << lastError();
    c.workspace = std::make_unique<Workspace>(c.size);
    EXPECT_EQ(attnopsSetDeviceThreads(device, deviceThreads(device) + 1), ATTNOPS_SUCCESS) << lastError();
    return c;
}

bool isAsyncThreadError(const std::string& message) {
    return message.rfind("FlashAttentionScore: ", 0) == 0 && message.find("worker threads") != std::string::npos;
}

// ------------------------------------------------------------------ child processes

#define SKIP_UNLESS_CHILD() \
    if (!isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test"


// ------------------------------------------------------------------ devices

TEST(Device, CountInfoAndSelection) {
    int32_t count = 0;
    ASSERT_EQ(attnopsGetDeviceCount(&count), ATTNOPS_SUCCESS);
    ASSERT_GE(count, 1);
    EXPECT_EQ(attnopsGetDeviceCount(nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    for (int32_t d = 0; d < count; ++d) {
        attnopsDeviceInfo info{};
        ASSERT_EQ(attnopsGetDeviceInfo(d, &info), ATTNOPS_SUCCESS) << lastError();
        EXPECT_EQ(info.kind, ATTNOPS_DEVICE_CPU);
        EXPECT_EQ(info.index, d);
        EXPECT_GE(info.threads, 1);
        EXPECT_GE(info.usableCores, 1);
        EXPECT_GT(info.l1dBytes, 0u);
        EXPECT_GT(info.l2Bytes, 0u);
        EXPECT_GT(info.l3Bytes, 0u);
    }
    attnopsDeviceInfo info{};
    EXPECT_EQ(attnopsGetDeviceInfo(count, &info), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("device"), std::string::npos) << lastError();
    EXPECT_EQ(attnopsGetDeviceInfo(-1, &info), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsGetDeviceInfo(0, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);

    int32_t current = -1;
    ASSERT_EQ(attnopsGetDevice(&current), ATTNOPS_SUCCESS);
    EXPECT_EQ(current, 0);
    EXPECT_EQ(attnopsGetDevice(nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsSetDevice(count), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsSetDevice(-1), ATTNOPS_ERROR_INVALID_ARGUMENT);
    ASSERT_EQ(attnopsGetDevice(&current), ATTNOPS_SUCCESS);
    EXPECT_EQ(current, 0) << "a failed SetDevice leaves the current device";
    EXPECT_EQ(attnopsSetDevice(count - 1), ATTNOPS_SUCCESS);
    std::thread([&] {
        int32_t other = -1;
        EXPECT_EQ(attnopsGetDevice(&other), ATTNOPS_SUCCESS);
        EXPECT_EQ(other, 0) << "a new thread starts on device 0";
    }).join();
    EXPECT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDeviceSynchronize(0), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDeviceSynchronize(count), ATTNOPS_ERROR_INVALID_ARGUMENT);
}

TEST(Device, Version) {
    ASSERT_NE(attnopsVersion(), nullptr);
    EXPECT_TRUE(std::regex_match(attnopsVersion(), std::regex("[0-9]+\\.[0-9]+\\.[0-9]+"))) << attnopsVersion();
}

TEST(Device, SetThreads) {
    ThreadsGuard guard(0);
    EXPECT_EQ(attnopsSetDeviceThreads(0, 0), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsSetDeviceThreads(0, -3), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsSetDeviceThreads(0, 4097), ATTNOPS_ERROR_INVALID_ARGUMENT);
    int32_t count = 0;
    attnopsGetDeviceCount(&count);
    EXPECT_EQ(attnopsSetDeviceThreads(count, 2), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(deviceThreads(0), guard.original()) << "failed calls change nothing";
    const FaProblem p = smallProblem(0);
    const Outputs want = expectedOutputs(p);
    for (int32_t threads : {3, 1, 5}) {
        ASSERT_EQ(attnopsSetDeviceThreads(0, threads), ATTNOPS_SUCCESS) << lastError();
        EXPECT_EQ(deviceThreads(0), threads);
        FaInstance inst(p);
        ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
        EXPECT_TRUE(outputsOf(inst) == want) << threads << " threads";
    }
}

// Changing the thread count waits for queued work, which still runs with its planned threads.
TEST(Device, SetThreadsWaitsForQueuedWork) {
    ThreadsGuard guard(0);
    const FaProblem p = heavyProblem(3);
    const Outputs want = expectedOutputs(p);
    std::vector<std::unique_ptr<FaInstance>> insts;
    std::vector<Launch> launches;
    for (int i = 0; i < 4; ++i) {
        insts.push_back(std::make_unique<FaInstance>(p));
        launches.push_back(enqueue(*insts.back(), nullptr));
        ASSERT_EQ(launches.back().status, ATTNOPS_SUCCESS) << lastError();
    }
    ASSERT_EQ(attnopsSetDeviceThreads(0, guard.original() + 1), ATTNOPS_SUCCESS);
    for (auto& inst : insts) EXPECT_TRUE(outputsOf(*inst) == want) << "SetDeviceThreads returned before the work ended";
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << lastError();
}

// ------------------------------------------------------------------ streams

TEST(Stream, CreateSynchronizeDestroy) {
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << "the default stream";
    const FaProblem p = smallProblem(1);
    const Outputs want = expectedOutputs(p);
    FaInstance inst(p);
    ASSERT_EQ(inst.runForward(s), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(outputsOf(inst) == want);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamCreate(nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(attnopsStreamDestroy(nullptr), ATTNOPS_ERROR_NULL_ARGUMENT) << "the default stream cannot be destroyed";
}

TEST(Stream, QueuedCallsMatchSynchronousCalls) {
    constexpr int kCalls = 24;
    std::vector<Outputs> want;
    for (int i = 0; i < kCalls; ++i) want.push_back(expectedOutputs(smallProblem(i)));
    for (bool explicitStream : {false, true}) {
        attnopsStream* s = nullptr;
        if (explicitStream) {
            ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
        }
        std::vector<std::unique_ptr<FaInstance>> insts;
        std::vector<Launch> launches;
        for (int i = 0; i < kCalls; ++i) {
            insts.push_back(std::make_unique<FaInstance>(smallProblem(i)));
            launches.push_back(enqueue(*insts.back(), s));
            ASSERT_EQ(launches.back().status, ATTNOPS_SUCCESS) << lastError();
        }
        ASSERT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS) << lastError();
        for (int i = 0; i < kCalls; ++i) EXPECT_TRUE(outputsOf(*insts[size_t(i)]) == want[size_t(i)]) << "call " << i;
        if (s) {
            EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
        }
    }
}

TEST(Stream, InOrderOnOneStream) {
    // The same output tensor written by two queued calls: the later one wins.
    FaProblem a = smallProblem(0), b = smallProblem(0);
    b.dataSeed = 999;
    const Outputs wantB = expectedOutputs(b);
    FaInstance instA(a), instB(b);
    // Let call A write into B's outputs: swap the output tensors into A's instance.
    std::swap(instA.attentionOut, instB.attentionOut);
    std::swap(instA.softmaxMax, instB.softmaxMax);
    std::swap(instA.softmaxSum, instB.softmaxSum);
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    std::vector<Launch> launches;
    for (int round = 0; round < 5; ++round) {
        launches.push_back(enqueue(instA, s));
        std::swap(instA.attentionOut, instB.attentionOut);
        std::swap(instA.softmaxMax, instB.softmaxMax);
        std::swap(instA.softmaxSum, instB.softmaxSum);
        launches.push_back(enqueue(instB, s));
        std::swap(instA.attentionOut, instB.attentionOut);
        std::swap(instA.softmaxMax, instB.softmaxMax);
        std::swap(instA.softmaxSum, instB.softmaxSum);
    }
    for (const Launch& l : launches) ASSERT_EQ(l.status, ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS) << lastError();
    // After the swaps, A holds the shared output tensors; B's call ran last.
    EXPECT_TRUE(outputsOf(instA) == wantB);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
}

TEST(Stream, DestroyWaitsForQueuedWork) {
    std::vector<Outputs> want;
    for (int i = 0; i < 4; ++i) want.push_back(expectedOutputs(heavyProblem(uint64_t(i))));
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    std::vector<std::unique_ptr<FaInstance>> insts;
    std::vector<Launch> launches;
    for (int i = 0; i < 4; ++i) insts.push_back(std::make_unique<FaInstance>(heavyProblem(uint64_t(i))));
    for (int i = 0; i < 4; ++i) {
        launches.push_back(enqueue(*insts[size_t(i)], s));
        ASSERT_EQ(launches.back().status, ATTNOPS_SUCCESS) << lastError();
    }
    ASSERT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS) << lastError();
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(outputsOf(*insts[size_t(i)]) == want[size_t(i)]) << "call " << i;
    EXPECT_EQ(attnopsDeviceSynchronize(0), ATTNOPS_SUCCESS);  // had destroy not waited, wait before the tensors go
    // The handle is stale now: every use is an error, not a crash.
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("stream"), std::string::npos) << lastError();
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    FaInstance inst(smallProblem(0));
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
    Workspace ws(size);
    EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, s), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_ERROR_RUNTIME) << "the failed launch consumed the executor";
    EXPECT_TRUE(allZero(inst.attentionOut.bytes()));
    // A pointer that never was a stream.
    int notAStream = 0;
    EXPECT_EQ(attnopsStreamSynchronize(reinterpret_cast<attnopsStream*>(&notAStream)), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(attnopsStreamDestroy(reinterpret_cast<attnopsStream*>(&notAStream)), ATTNOPS_ERROR_INVALID_ARGUMENT);
}

TEST(Stream, SynchronizeFromAnotherThread) {
    std::vector<Outputs> want;
    for (int i = 0; i < 3; ++i) want.push_back(expectedOutputs(heavyProblem(uint64_t(10 + i))));
    for (bool explicitStream : {true, false}) {
        attnopsStream* s = nullptr;
        if (explicitStream) {
            ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
        }
        std::vector<std::unique_ptr<FaInstance>> insts;
        std::vector<Launch> launches;
        for (int i = 0; i < 3; ++i) {
            insts.push_back(std::make_unique<FaInstance>(heavyProblem(uint64_t(10 + i))));
            launches.push_back(enqueue(*insts.back(), s));
            ASSERT_EQ(launches.back().status, ATTNOPS_SUCCESS) << lastError();
        }
        attnopsStatus st = ATTNOPS_ERROR_INTERNAL;
        bool complete = false;
        std::thread waiter([&] {
            st = attnopsStreamSynchronize(s);
            complete = true;
            for (int i = 0; i < 3; ++i) complete = complete && outputsOf(*insts[size_t(i)]) == want[size_t(i)];
        });
        waiter.join();
        EXPECT_EQ(st, ATTNOPS_SUCCESS);
        EXPECT_TRUE(complete) << "the other thread's synchronize returned before the work ended";
        if (s) {
            EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
        }
    }
}

TEST(Stream, TwoStreamsFromTwoHostThreads) {
    constexpr int kCalls = 12;
    std::vector<Outputs> want;
    for (int i = 0; i < 2 * kCalls; ++i) want.push_back(expectedOutputs(smallProblem(i)));
    std::vector<std::string> failures(2);
    auto body = [&](int t) {
        attnopsStream* s = nullptr;
        if (attnopsStreamCreate(&s) != ATTNOPS_SUCCESS) {
            failures[size_t(t)] = "create: " + lastError();
            return;
        }
        for (int round = 0; round < 3; ++round) {
            std::vector<std::unique_ptr<FaInstance>> insts;
            std::vector<Launch> launches;
            for (int i = 0; i < kCalls; ++i) {
                insts.push_back(std::make_unique<FaInstance>(smallProblem(t * kCalls + i)));
                launches.push_back(enqueue(*insts.back(), s));
                if (launches.back().status != ATTNOPS_SUCCESS) failures[size_t(t)] = "launch: " + lastError();
            }
            if (attnopsStreamSynchronize(s) != ATTNOPS_SUCCESS) failures[size_t(t)] = "sync: " + lastError();
            for (int i = 0; i < kCalls; ++i)
                if (!(outputsOf(*insts[size_t(i)]) == want[size_t(t * kCalls + i)]))
                    failures[size_t(t)] = "mismatch in call " + std::to_string(i);
        }
        if (attnopsStreamDestroy(s) != ATTNOPS_SUCCESS) failures[size_t(t)] = "destroy: " + lastError();
    };
    std::thread a(body, 0), b(body, 1);
    a.join();
    b.join();
    EXPECT_EQ(failures[0], "");
    EXPECT_EQ(failures[1], "");
}

// ------------------------------------------------------------------ asynchronous errors

TEST(AsyncError, ReportedBySynchronizeWithOpNameThenCleared) {
    ThreadsGuard guard(0);
    const FaProblem p = smallProblem(0);
    const Outputs want = expectedOutputs(p);
    attnopsStream *a = nullptr, *b = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&a), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsStreamCreate(&b), ATTNOPS_SUCCESS);

    FaInstance doomed(p);
    DoomedCall c = planThenAddThread(doomed, 0);
    // Work planned after the change succeeds, on another stream and on the default stream.
    FaInstance onB(p), onDefault(p);
    Launch lb = enqueue(onB, b);
    ASSERT_EQ(lb.status, ATTNOPS_SUCCESS) << lastError();
    ASSERT_EQ(attnopsFlashAttentionScore(c.workspace->get(), c.size, c.executor, a), ATTNOPS_SUCCESS)
        << "the failure happens inside the queued work, not at submission: " << lastError();
    Launch ld = enqueue(onDefault, nullptr);
    ASSERT_EQ(ld.status, ATTNOPS_SUCCESS) << lastError();

    EXPECT_EQ(attnopsStreamSynchronize(a), ATTNOPS_ERROR_RUNTIME);
    EXPECT_TRUE(isAsyncThreadError(lastError())) << lastError();
    EXPECT_TRUE(allZero(doomed.attentionOut.bytes())) << "the failed call wrote nothing";
    EXPECT_EQ(attnopsStreamSynchronize(a), ATTNOPS_SUCCESS) << "the error is cleared once reported";

    EXPECT_EQ(attnopsStreamSynchronize(b), ATTNOPS_SUCCESS) << "other streams are not poisoned: " << lastError();
    EXPECT_TRUE(outputsOf(onB) == want);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(outputsOf(onDefault) == want);

    // The stream stays usable.
    FaInstance again(p);
    ASSERT_EQ(again.runForward(a), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(outputsOf(again) == want);
    EXPECT_EQ(attnopsStreamDestroy(a), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(b), ATTNOPS_SUCCESS);
}

TEST(AsyncError, FirstErrorIsKeptUntilSynchronize) {
    ThreadsGuard guard(0);
    const FaProblem p = smallProblem(2);
    const Outputs want = expectedOutputs(p);
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    FaInstance doomed1(p), doomed2(p), fine(p);
    DoomedCall c1 = planThenAddThread(doomed1, 0);
    DoomedCall c2 = planThenAddThread(doomed2, 0);
    ASSERT_EQ(attnopsFlashAttentionScore(c1.workspace->get(), c1.size, c1.executor, s), ATTNOPS_SUCCESS);
    Launch l = enqueue(fine, s);  // planned at the current count: runs fine between the failures
    ASSERT_EQ(l.status, ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsFlashAttentionScore(c2.workspace->get(), c2.size, c2.executor, s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_ERROR_RUNTIME);
    const std::string message = lastError();
    EXPECT_TRUE(isAsyncThreadError(message)) << message;
    EXPECT_NE(message.find("planned for " + std::to_string(guard.original())), std::string::npos)
        << "the first failure is the one reported: " << message;
    EXPECT_TRUE(outputsOf(fine) == want) << "work queued after a failure still runs";
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
}

TEST(AsyncError, DefaultStreamErrorReturnedByDeviceSynchronize) {
    ThreadsGuard guard(0);
    FaInstance doomed(smallProblem(3));
    DoomedCall c = planThenAddThread(doomed, 0);
    ASSERT_EQ(attnopsFlashAttentionScore(c.workspace->get(), c.size, c.executor, nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDeviceSynchronize(0), ATTNOPS_ERROR_RUNTIME);
    EXPECT_TRUE(isAsyncThreadError(lastError())) << lastError();
    EXPECT_EQ(attnopsDeviceSynchronize(0), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << "reported once";
}

TEST(AsyncError, LaunchBlockingReportsAtLaunch) {
    ThreadsGuard guard(0);
    const FaProblem p = heavyProblem(21);
    const Outputs want = expectedOutputs(p);
    attnopsStream* s = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&s), ATTNOPS_SUCCESS);
    FaInstance doomed(p);
    DoomedCall c = planThenAddThread(doomed, 0);
    {
        EnvGuard blocking("ATTNOPS_LAUNCH_BLOCKING", "1");
        for (attnopsStream* stream : {s, static_cast<attnopsStream*>(nullptr)}) {
            FaInstance inst(p);
            Launch l = enqueue(inst, stream);
            ASSERT_EQ(l.status, ATTNOPS_SUCCESS) << lastError();
            EXPECT_TRUE(outputsOf(inst) == want) << "blocking launch returned before the work ended";
            EXPECT_EQ(attnopsStreamSynchronize(stream), ATTNOPS_SUCCESS);  // before inst goes, whatever happened
        }
        EXPECT_EQ(attnopsFlashAttentionScore(c.workspace->get(), c.size, c.executor, s), ATTNOPS_ERROR_RUNTIME);
        EXPECT_TRUE(isAsyncThreadError(lastError())) << lastError();
        EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_SUCCESS) << "already reported by the launch";
    }
    // Back to asynchronous mode (read at each launch): the error waits for synchronize again.
    FaInstance doomed2(p);
    DoomedCall c2 = planThenAddThread(doomed2, 0);
    ASSERT_EQ(attnopsFlashAttentionScore(c2.workspace->get(), c2.size, c2.executor, s), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(s), ATTNOPS_ERROR_RUNTIME);
    EXPECT_TRUE(isAsyncThreadError(lastError())) << lastError();
    EXPECT_EQ(attnopsStreamDestroy(s), ATTNOPS_SUCCESS);
}

// ------------------------------------------------------------------ executors

TEST(Executor, SingleUse) {
    const FaProblem p = smallProblem(0);
    const Outputs want = expectedOutputs(p);
    FaInstance inst(p);
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS) << lastError();
    ASSERT_NE(executor, nullptr);
    Workspace ws(size);
    ASSERT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, nullptr), ATTNOPS_ERROR_RUNTIME);
    EXPECT_NE(lastError().find("executor"), std::string::npos) << lastError();
    EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_ERROR_RUNTIME);
    ASSERT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(outputsOf(inst) == want);
}

TEST(Executor, DestroyWithoutExecuting) {
    FaInstance inst(smallProblem(4));
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS) << lastError();
    EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_ERROR_RUNTIME);
    Workspace ws(size);
    EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, nullptr), ATTNOPS_ERROR_RUNTIME);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_TRUE(allZero(inst.attentionOut.bytes()));
    EXPECT_EQ(attnopsDestroyExecutor(nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, nullptr, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    int notAnExecutor = 0;
    EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, reinterpret_cast<attnopsExecutor*>(&notAnExecutor), nullptr),
              ATTNOPS_ERROR_RUNTIME);
    EXPECT_EQ(attnopsDestroyExecutor(reinterpret_cast<attnopsExecutor*>(&notAnExecutor)), ATTNOPS_ERROR_RUNTIME);
}

TEST(Executor, WorkspaceChecks) {
    FaInstance inst(smallProblem(0));
    for (int variant = 0; variant < 2; ++variant) {
        uint64_t size = 0;
        attnopsExecutor* executor = nullptr;
        ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS) << lastError();
        ASSERT_GT(size, 0u) << "this problem needs a workspace";
        Workspace ws(size);
        if (variant == 0) {
            EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size - 1, executor, nullptr), ATTNOPS_ERROR_INVALID_ARGUMENT);
            EXPECT_NE(lastError().find("workspaceSize"), std::string::npos) << lastError();
        } else {
            EXPECT_EQ(attnopsFlashAttentionScore(nullptr, size, executor, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
            EXPECT_NE(lastError().find("workspace"), std::string::npos) << lastError();
        }
        // Consumed, whatever the outcome.
        EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, nullptr), ATTNOPS_ERROR_RUNTIME);
    }
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_TRUE(allZero(inst.attentionOut.bytes()));
    // A larger workspace than asked for is fine.
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
    Workspace big(size + 4096);
    EXPECT_EQ(attnopsFlashAttentionScore(big.get(), size + 4096, executor, nullptr), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsStreamSynchronize(nullptr), ATTNOPS_SUCCESS);
    EXPECT_FALSE(allZero(inst.attentionOut.bytes()));
}

TEST(Executor, GetWorkspaceSizeNullOutputs) {
    FaInstance inst(smallProblem(0));
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    EXPECT_EQ(inst.plan(nullptr, &executor), ATTNOPS_ERROR_NULL_ARGUMENT);
    EXPECT_EQ(inst.plan(&size, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
}

// ------------------------------------------------------------------ plan cache under load

TEST(PlanCache, HammeredFromFourHostThreadsMatchesSerialRun) {
    constexpr int kThreads = 4, kIterations = 60, kShapes = 3;
    std::vector<Outputs> want;
    for (int k = 0; k < kShapes; ++k) want.push_back(expectedOutputs(smallProblem(k)));
    // Small problems of many shapes, planned and thrown away: more than the cache holds.
    auto churnProblem = [](int t, int i) {
        FaProblem p;
        p.heads = 1;
        p.kvHeads = 1;
        p.dim = 8;
        p.qSeqLen = 3 + (t * 7 + i) % 11;
        p.kvSeqLen = 5 + (t * 131 + i * 17) % 97;
        return p;
    };
    std::vector<std::string> failures(kThreads);
    std::barrier start(kThreads);
    auto body = [&](int t) {
        attnopsStream* s = nullptr;
        if (t % 2 == 1 && attnopsStreamCreate(&s) != ATTNOPS_SUCCESS) failures[size_t(t)] = "create";
        std::vector<std::unique_ptr<FaInstance>> mine;
        for (int k = 0; k < kShapes; ++k) mine.push_back(std::make_unique<FaInstance>(smallProblem(k)));
        start.arrive_and_wait();
        for (int i = 0; i < kIterations && failures[size_t(t)].empty(); ++i) {
            const int k = (i + t) % kShapes;
            FaInstance& inst = *mine[size_t(k)];
            std::fill(inst.attentionOut.bytes().begin(), inst.attentionOut.bytes().end(), 0);
            uint64_t size = 0;
            attnopsExecutor* executor = nullptr;
            if (inst.plan(&size, &executor) != ATTNOPS_SUCCESS) {
                failures[size_t(t)] = "plan: " + lastError();
                break;
            }
            if ((i + t) % 4 == 0) {
                if (attnopsDestroyExecutor(executor) != ATTNOPS_SUCCESS) failures[size_t(t)] = "destroy: " + lastError();
            } else {
                Workspace ws(size);
                if (attnopsFlashAttentionScore(ws.get(), size, executor, s) != ATTNOPS_SUCCESS ||
                    attnopsStreamSynchronize(s) != ATTNOPS_SUCCESS)
                    failures[size_t(t)] = "run: " + lastError();
                else if (!(outputsOf(inst) == want[size_t(k)]))
                    failures[size_t(t)] = "mismatch at iteration " + std::to_string(i);
            }
            FaInstance churn(churnProblem(t, i));
            if (churn.plan(&size, &executor) != ATTNOPS_SUCCESS || attnopsDestroyExecutor(executor) != ATTNOPS_SUCCESS)
                failures[size_t(t)] = "churn: " + lastError();
        }
        if (s) attnopsStreamDestroy(s);
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) threads.emplace_back(body, t);
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[size_t(t)], "") << "host thread " << t;
}

TEST(PlanCache, SameShapeIsPlannedOnce) {
    attnops::PlanCache& cache = attnops::Runtime::get().device(0, "device").planCache();
    FaProblem p = smallProblem(5);
    p.qSeqLen = 61;  // a shape no other test uses
    FaInstance first(p);
    uint64_t size = 0;
    attnopsExecutor* executor = nullptr;
    ASSERT_EQ(first.plan(&size, &executor), ATTNOPS_SUCCESS);
    attnopsDestroyExecutor(executor);
    const auto before = cache.hitsAndMisses();
    p.dataSeed = 77;  // other data, same shape
    FaInstance second(p);
    for (int i = 0; i < 3; ++i) {
        uint64_t again = 0;
        ASSERT_EQ(second.plan(&again, &executor), ATTNOPS_SUCCESS);
        EXPECT_EQ(again, size);
        attnopsDestroyExecutor(executor);
    }
    const auto after = cache.hitsAndMisses();
    EXPECT_EQ(after.second, before.second) << "no new plan for a cached shape";
    EXPECT_EQ(after.first, before.first + 3);
}

// ------------------------------------------------------------------ workspace memory

TEST(Memory, MallocIsAlignedAndFreeChecksOwnership) {
    for (uint64_t bytes : {uint64_t(0), uint64_t(1), uint64_t(63), uint64_t(64), uint64_t(1000), uint64_t(1) << 20}) {
        void* p = nullptr;
        ASSERT_EQ(attnopsMalloc(bytes, &p), ATTNOPS_SUCCESS) << bytes;
        ASSERT_NE(p, nullptr) << bytes;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
        std::memset(p, 0x5a, size_t(bytes));
        EXPECT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);
        EXPECT_EQ(attnopsFree(p), ATTNOPS_ERROR_INVALID_ARGUMENT) << "double free is an error";
    }
    EXPECT_EQ(attnopsFree(nullptr), ATTNOPS_SUCCESS);
    int onStack = 0;
    EXPECT_EQ(attnopsFree(&onStack), ATTNOPS_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(lastError().find("ptr"), std::string::npos) << lastError();
    auto heap = std::make_unique<int[]>(16);
    EXPECT_EQ(attnopsFree(heap.get()), ATTNOPS_ERROR_INVALID_ARGUMENT);
    void* p = nullptr;
    ASSERT_EQ(attnopsMalloc(256, &p), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(static_cast<char*>(p) + 64), ATTNOPS_ERROR_INVALID_ARGUMENT) << "interior pointer";
    EXPECT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsMalloc(64, nullptr), ATTNOPS_ERROR_NULL_ARGUMENT);
    p = reinterpret_cast<void*>(&onStack);
    EXPECT_EQ(attnopsMalloc(~uint64_t(0), &p), ATTNOPS_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(p, nullptr);
    if (!kSanitized) {  // sanitizer allocators abort on this unless allocator_may_return_null=1
        EXPECT_EQ(attnopsMalloc(uint64_t(1) << 62, &p), ATTNOPS_ERROR_OUT_OF_MEMORY);
        EXPECT_EQ(p, nullptr);
    }
}

// A freed block of 1 MiB or more is kept by its device and handed out again for a request of at
// least half its size; smaller blocks go back at once; a double free stays an error. 37 MiB: a
// size no other test leaves in the cache (blocks of 2 MiB and more are whole 2 MiB pages: 38 MiB).
void expectFreedBlocksReused(uint64_t limitBytes) {
    attnops::Device& device = attnops::Runtime::get().device(0, "device");
    const uint64_t mib = uint64_t(1) << 20, bytes = 37 * mib, size = 38 * mib;
    const bool cached = limitBytes >= size;
    const size_t live = device.liveAllocations();
    void* p = nullptr;
    ASSERT_EQ(attnopsMalloc(bytes, &p), ATTNOPS_SUCCESS) << lastError();
    std::memset(p, 0x5a, size_t(bytes));
    const uint64_t before = device.cachedBytes();
    ASSERT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);
    EXPECT_EQ(device.liveAllocations(), live);
    if (cached) {
        EXPECT_GE(device.cachedBytes(), size);
        EXPECT_LE(device.cachedBytes(), limitBytes);
    } else {
        EXPECT_EQ(device.cachedBytes(), before);
    }
    EXPECT_EQ(attnopsFree(p), ATTNOPS_ERROR_INVALID_ARGUMENT) << "double free is an error, cached or not";
    void* small = nullptr;  // 16 MiB: less than half of the cached block
    ASSERT_EQ(attnopsMalloc(16 * mib, &small), ATTNOPS_SUCCESS) << lastError();
    EXPECT_NE(small, p);
    void* q = nullptr;
    ASSERT_EQ(attnopsMalloc(20 * mib, &q), ATTNOPS_SUCCESS) << lastError();
    if (cached) {
        EXPECT_EQ(q, p) << "the cached 38 MiB block serves 20 MiB";
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % (2 * mib), 0u);
    std::memset(q, 0x33, size_t(20 * mib));
    EXPECT_EQ(device.liveAllocations(), live + 2);
    EXPECT_EQ(attnopsFree(q), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(small), ATTNOPS_SUCCESS);
    EXPECT_EQ(device.liveAllocations(), live);
    EXPECT_LE(device.cachedBytes(), limitBytes);
    void* tiny = nullptr;  // under 1 MiB: never cached
    const uint64_t cachedNow = device.cachedBytes();
    ASSERT_EQ(attnopsMalloc(4096, &tiny), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(tiny), ATTNOPS_SUCCESS);
    EXPECT_EQ(device.cachedBytes(), cachedNow);
}

// The device's bound: 1 GiB by default, ATTNOPS_DEVICE_CACHE_MB when set, 0 (nothing kept) under
// AddressSanitizer (sanitized builds only check that the blocks follow the bound they report).
TEST(Memory, FreedBlocksAreReused) {
    const uint64_t limit = attnops::Runtime::get().device(0, "device").cacheLimit();
    if (!kSanitized) {
        EXPECT_EQ(limit, uint64_t(1024) << 20);
    }
    expectFreedBlocksReused(limit);
}

TEST(MemoryChild, DISABLED_CacheLimit) {
    const char* env = std::getenv("ATTNOPS_DEVICE_CACHE_MB");
    ASSERT_NE(env, nullptr);
    const uint64_t limit = attnops::Runtime::get().device(0, "device").cacheLimit();
    if (!kSanitized) {
        EXPECT_EQ(limit, uint64_t(std::max(0, std::atoi(env))) << 20);
    }
    expectFreedBlocksReused(limit);
}

TEST(Memory, CacheLimitIsReadFromTheEnvironment) {
    expectChildPasses("MemoryChild.DISABLED_CacheLimit", {{"ATTNOPS_DEVICE_CACHE_MB", "0"}});
    expectChildPasses("MemoryChild.DISABLED_CacheLimit", {{"ATTNOPS_DEVICE_CACHE_MB", "16"}});
    expectChildPasses("MemoryChild.DISABLED_CacheLimit", {{"ATTNOPS_DEVICE_CACHE_MB", "64"}});
}

// The VmFlags of the mapping that holds p, from /proc/self/smaps ("" if not found).
std::string vmFlagsOf(const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        uintptr_t lo = 0, hi = 0;
        if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 && line.find(':') > line.find('-'))
            inside = lo <= at && at < hi;
        else if (inside && line.rfind("VmFlags:", 0) == 0)
            return line;
    }
    return "";
}

// Blocks of 2 MiB and more start on a 2 MiB boundary and carry the huge-page advice (VmFlags
// "hg") wherever the kernel has transparent huge pages; smaller ones keep the 64-byte alignment.
TEST(Memory, LargeBlocksAreHugePageAlignedAndAdvised) {
    constexpr uint64_t kHuge = uint64_t(2) << 20;
    const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
    for (uint64_t bytes : {kHuge - 64, kHuge, kHuge + 1, 5 * kHuge + 7}) {
        void* p = nullptr;
        ASSERT_EQ(attnopsMalloc(bytes, &p), ATTNOPS_SUCCESS) << bytes;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (bytes >= kHuge ? kHuge : 64), 0u) << bytes;
        std::memset(p, 0x5a, size_t(bytes));
        if (bytes >= kHuge && thp && !kSanitized) {
            const std::string flags = vmFlagsOf(p);
            EXPECT_NE(flags.find(" hg"), std::string::npos) << bytes << ": " << flags;
        }
        EXPECT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);
    }
}

TEST(Memory, ConcurrentMallocFree) {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            std::vector<void*> held;
            for (int i = 0; i < 2000; ++i) {
                void* p = nullptr;
                if (attnopsMalloc(uint64_t(1 + (i * 37 + t) % 5000), &p) != ATTNOPS_SUCCESS) ++failures;
                held.push_back(p);
                if (i % 3 == 2) {
                    if (attnopsFree(held.front()) != ATTNOPS_SUCCESS) ++failures;
                    held.erase(held.begin());
                }
            }
            for (void* p : held)
                if (attnopsFree(p) != ATTNOPS_SUCCESS) ++failures;
        });
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
}

// ------------------------------------------------------------------ fresh processes

// The problem a cold-start child runs: a causal GQA forward with dropout in the given dtype.
FaProblem coldStartProblem(const std::string& dtype, int variant) {
    FaProblem p;
    p.dtype = dtype == "fp16" ? ATTNOPS_FLOAT16 : dtype == "bf16" ? ATTNOPS_BFLOAT16 : ATTNOPS_FLOAT32;
    p.heads = 4;
    p.kvHeads = 2;
    p.dim = 48;
    p.qSeqLen = 100 + variant;
    p.kvSeqLen = 130;
    p.sparseMode = 3;
    p.keepProb = 0.9;
    p.seed = 5;
    p.dataSeed = uint64_t(3 + variant);
    return p;
}

const char* envOr(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v ? v : fallback;
}

// Child: the forward is the first runtime call of this process (tensor handles aside), from
// ATTNOPS_TEST_HOST_THREADS threads at once; each result is checked against the reference.
TEST(ColdStartChild, DISABLED_Forward) {
    SKIP_UNLESS_CHILD();
    const std::string dtype = envOr("ATTNOPS_TEST_DTYPE", "fp32");
    const int hostThreads = std::atoi(envOr("ATTNOPS_TEST_HOST_THREADS", "1"));
    ASSERT_GE(hostThreads, 1);
    std::vector<std::unique_ptr<FaInstance>> insts;
    for (int t = 0; t < hostThreads; ++t) insts.push_back(std::make_unique<FaInstance>(coldStartProblem(dtype, t)));
    std::vector<attnopsStatus> status(size_t(hostThreads), ATTNOPS_ERROR_INTERNAL);
    std::vector<std::string> messages(static_cast<size_t>(hostThreads));
    std::barrier start(hostThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < hostThreads; ++t)
        threads.emplace_back([&, t] {
            start.arrive_and_wait();
            status[size_t(t)] = insts[size_t(t)]->runForward();
            messages[size_t(t)] = lastError();
        });
    for (auto& th : threads) th.join();
    for (int t = 0; t < hostThreads; ++t) {
        ASSERT_EQ(status[size_t(t)], ATTNOPS_SUCCESS) << messages[size_t(t)];
        const auto rc = attnops::tools::checkForwardRows(*insts[size_t(t)], -1);
        EXPECT_TRUE(rc.passed) << insts[size_t(t)]->problem.describe() << ": err " << rc.maxAbsError << " tol "
                               << rc.tolerance << " " << rc.firstFailure;
    }
    attnopsDeviceInfo info{};
    ASSERT_EQ(attnopsGetDeviceInfo(0, &info), ATTNOPS_SUCCESS);
    EXPECT_GE(info.threads, 1);
    EXPECT_GE(info.usableCores, 1);
}

TEST(ColdStart, ForwardIsFirstCallOfFreshProcess) {
    for (const char* dtype : {"fp32", "fp16", "bf16"})
        for (const char* blocking : {"0", "1"})
            expectChildPasses("ColdStartChild.DISABLED_Forward",
                              {{"ATTNOPS_TEST_DTYPE", dtype}, {"ATTNOPS_LAUNCH_BLOCKING", blocking}});
}

TEST(ColdStart, ConcurrentFirstCalls) {
    for (const char* blocking : {"0", "1"})
        expectChildPasses("ColdStartChild.DISABLED_Forward", {{"ATTNOPS_TEST_DTYPE", "bf16"},
                                                              {"ATTNOPS_TEST_HOST_THREADS", "4"},
                                                              {"ATTNOPS_LAUNCH_BLOCKING", blocking},
                                                              {"ATTNOPS_NUM_THREADS", "3"}});
}

// Child: device count and threads from ATTNOPS_NUM_DEVICES / ATTNOPS_NUM_THREADS.
TEST(EnvironmentChild, DISABLED_DeviceConfiguration) {
    SKIP_UNLESS_CHILD();
    const int32_t wantDevices = std::atoi(envOr("ATTNOPS_TEST_EXPECT_DEVICES", "1"));
    const int32_t wantThreads = std::atoi(envOr("ATTNOPS_TEST_EXPECT_THREADS", "0"));  // 0: cores / devices
    int32_t count = 0;
    ASSERT_EQ(attnopsGetDeviceCount(&count), ATTNOPS_SUCCESS);
    EXPECT_EQ(count, wantDevices);
    for (int32_t d = 0; d < count; ++d) {
        attnopsDeviceInfo info{};
        ASSERT_EQ(attnopsGetDeviceInfo(d, &info), ATTNOPS_SUCCESS);
        EXPECT_EQ(info.threads, wantThreads > 0 ? wantThreads : std::max(1, info.usableCores / count)) << "device " << d;
    }
    FaInstance inst(smallProblem(1));
    ASSERT_EQ(inst.runForward(), ATTNOPS_SUCCESS) << lastError();
    EXPECT_TRUE(attnops::tools::checkForwardRows(inst, -1).passed);
}

TEST(Environment, DeviceCountAndThreadsAreReadAtFirstUse) {
    expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration", {{"ATTNOPS_TEST_EXPECT_DEVICES", "1"}});
    expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration",
                      {{"ATTNOPS_NUM_DEVICES", "3"}, {"ATTNOPS_TEST_EXPECT_DEVICES", "3"}});
    expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration",
                      {{"ATTNOPS_NUM_THREADS", "3"}, {"ATTNOPS_TEST_EXPECT_THREADS", "3"}});
    expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration",
                      {{"ATTNOPS_NUM_DEVICES", "2"}, {"ATTNOPS_NUM_THREADS", "1"}, {"ATTNOPS_TEST_EXPECT_DEVICES", "2"},
                       {"ATTNOPS_TEST_EXPECT_THREADS", "1"}});
    // Invalid values fall back to the defaults (with a warning), they do not fail.
    for (const char* bad : {"0", "-2", "abc", "100000"})
        expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration",
                          {{"ATTNOPS_NUM_DEVICES", bad}, {"ATTNOPS_TEST_EXPECT_DEVICES", "1"}});
    expectChildPasses("EnvironmentChild.DISABLED_DeviceConfiguration", {{"ATTNOPS_NUM_THREADS", "x"}});
}

// Child with ATTNOPS_NUM_DEVICES=2: per-thread current device, device-bound executors and
// streams, errors kept per device, two devices driven in parallel.
TEST(MultiDeviceChild, DISABLED_TwoDevices) {
    SKIP_UNLESS_CHILD();
    int32_t count = 0;
    ASSERT_EQ(attnopsGetDeviceCount(&count), ATTNOPS_SUCCESS);
    ASSERT_EQ(count, 2);
    EXPECT_EQ(attnopsSetDevice(2), ATTNOPS_ERROR_INVALID_ARGUMENT);
    std::vector<Outputs> want;
    for (int k = 0; k < 6; ++k) want.push_back(expectedOutputs(smallProblem(k)));

    // The current device is per thread.
    ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
    int32_t current = -1;
    attnopsGetDevice(&current);
    EXPECT_EQ(current, 1);
    std::thread([] {
        int32_t other = -1;
        attnopsGetDevice(&other);
        EXPECT_EQ(other, 0);
        EXPECT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    }).join();
    attnopsGetDevice(&current);
    EXPECT_EQ(current, 1);

    // A stream of device 1 cannot run an executor planned on device 0.
    attnopsStream* onDevice1 = nullptr;
    ASSERT_EQ(attnopsStreamCreate(&onDevice1), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    {
        FaInstance inst(smallProblem(0));
        uint64_t size = 0;
        attnopsExecutor* executor = nullptr;
        ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
        Workspace ws(size);
        EXPECT_EQ(attnopsFlashAttentionScore(ws.get(), size, executor, onDevice1), ATTNOPS_ERROR_INVALID_ARGUMENT);
        EXPECT_NE(lastError().find("device"), std::string::npos) << lastError();
        EXPECT_EQ(attnopsDestroyExecutor(executor), ATTNOPS_ERROR_RUNTIME) << "consumed";
        EXPECT_EQ(attnopsStreamSynchronize(onDevice1), ATTNOPS_SUCCESS);
        EXPECT_TRUE(allZero(inst.attentionOut.bytes()));
        // The same executor kind planned on device 1 runs there (from a device-0 thread).
        ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
        ASSERT_EQ(inst.plan(&size, &executor), ATTNOPS_SUCCESS);
        ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
        Workspace ws1(size);
        EXPECT_EQ(attnopsFlashAttentionScore(ws1.get(), size, executor, onDevice1), ATTNOPS_SUCCESS) << lastError();
        EXPECT_EQ(attnopsStreamSynchronize(onDevice1), ATTNOPS_SUCCESS) << lastError();
        EXPECT_TRUE(outputsOf(inst) == want[0]);
    }
    EXPECT_EQ(attnopsStreamDestroy(onDevice1), ATTNOPS_SUCCESS);

    // Workspace from device 1 can be freed from a thread on device 0.
    ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
    void* p = nullptr;
    ASSERT_EQ(attnopsMalloc(1000, &p), ATTNOPS_SUCCESS);
    ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
    EXPECT_EQ(attnopsFree(p), ATTNOPS_SUCCESS);

    // An asynchronous error on device 1's default stream stays there.
    {
        ThreadsGuard guard(1);
        ASSERT_EQ(attnopsSetDevice(1), ATTNOPS_SUCCESS);
        FaInstance doomed(smallProblem(2));
        DoomedCall c = planThenAddThread(doomed, 1);
        ASSERT_EQ(attnopsFlashAttentionScore(c.workspace->get(), c.size, c.executor, nullptr), ATTNOPS_SUCCESS);
        ASSERT_EQ(attnopsSetDevice(0), ATTNOPS_SUCCESS);
        FaInstance fine(smallProblem(2));
        ASSERT_EQ(fine.runForward(), ATTNOPS_SUCCESS) << "device 0 is not poisoned: " << lastError();
        EXPECT_EQ(attnopsDeviceSynchronize(0), ATTNOPS_SUCCESS);
        EXPECT_EQ(attnopsDeviceSynchronize(1), ATTNOPS_ERROR_RUNTIME);
        EXPECT_TRUE(isAsyncThreadError(lastError())) << lastError();
        EXPECT_EQ(attnopsDeviceSynchronize(1), ATTNOPS_SUCCESS);
    }

    // Both devices driven at once from two host threads, several rounds, results as serial.
    std::vector<std::string> failures(2);
    auto body = [&](int32_t device) {
        if (attnopsSetDevice(device) != ATTNOPS_SUCCESS) failures[size_t(device)] = "set device";
        for (int round = 0; round < 3; ++round) {
            std::vector<std::unique_ptr<FaInstance>> insts;
            std::vector<Launch> launches;
            for (int k = 0; k < 6; ++k) {
                insts.push_back(std::make_unique<FaInstance>(smallProblem(k)));
                launches.push_back(enqueue(*insts.back(), nullptr));
                if (launches.back().status != ATTNOPS_SUCCESS) failures[size_t(device)] = "launch: " + lastError();
            }
            if (attnopsStreamSynchronize(nullptr) != ATTNOPS_SUCCESS) failures[size_t(device)] = "sync: " + lastError();
            for (int k = 0; k < 6; ++k)
                if (!(outputsOf(*insts[size_t(k)]) == want[size_t(k)])) failures[size_t(device)] = "mismatch";
        }
    };
    std::thread d0(body, 0), d1(body, 1);
    d0.join();
    d1.join();
    EXPECT_EQ(failures[0], "");
    EXPECT_EQ(failures[1], "");
}

TEST(MultiDevice, TwoDevicesInChildProcess) {
    expectChildPasses("MultiDeviceChild.DISABLED_TwoDevices", {{"ATTNOPS_NUM_DEVICES", "2"}});
    expectChildPasses("MultiDeviceChild.DISABLED_TwoDevices",
                      {{"ATTNOPS_NUM_DEVICES", "2"}, {"ATTNOPS_NUM_THREADS", "2"}, {"ATTNOPS_LAUNCH_BLOCKING", "0"}});
}

}  // namespace
