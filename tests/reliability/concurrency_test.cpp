// Concurrency: several host threads drive several devices (ATTNOPS_NUM_DEVICES=3, each with its own
// worker count) through their own streams and the shared default streams at once, with a mix of
// FlashAttentionScore forward and grad and BlockAttentionResiduals forward and grad calls of
// different shapes and dtypes; every result must be bitwise equal to the same call run alone.
// Meanwhile another thread creates streams, queues work on them and destroys them while the work
// is queued, and synchronizes devices it does not drive. Plan caches and workspace memory of
// every device are shared by all the host threads. The ThreadSanitizer step of scripts/test.sh
// runs a reduced number of iterations (the child reads ATTNOPS_TEST_ITERATIONS).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attnops/attnops.h"
#include "child_process.hpp"
#include "problem.hpp"
#include "problem_bar.hpp"
#include "problem_grad.hpp"

#if defined(__SANITIZE_THREAD__)
#define ATTNOPS_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTNOPS_TEST_TSAN 1
#endif
#endif

namespace {

using attnops::tools::BarInstance;
using attnops::tools::BarProblem;
using attnops::tools::FaGrads;
using attnops::tools::FaInstance;
using attnops::tools::FaProblem;

std::string lastError() { return attnopsGetLastErrorMessage(); }

constexpr int32_t kDevices = 3;
constexpr int kHostThreads = 4;

std::vector<FaProblem> faProblems() {
    using attnops::tools::fixed;
    std::vector<FaProblem> ps;
    ps.push_back(fixed("BNSD", ATTNOPS_FLOAT32, 1, 70, 90, 2, 2, 32));
    FaProblem p = fixed("BSND", ATTNOPS_BFLOAT16, 2, 65, 65, 4, 2, 64);
    p.sparseMode = 3;
    ps.push_back(p);
    p = fixed("BSH", ATTNOPS_FLOAT16, 1, 33, 130, 4, 1, 40, 24);
    p.keepProb = 0.8;
    p.seed = 9;
    ps.push_back(p);
    p = attnops::tools::tnd(ATTNOPS_BFLOAT16, {5, 0, 70, 1, 33}, {9, 3, 64, 1, 0}, 2, 1, 48);
    p.sparseMode = 3;
    ps.push_back(p);
    for (size_t i = 0; i < ps.size(); ++i) ps[i].dataSeed = 50 + i;
    return ps;
}

std::vector<BarProblem> barProblems() {
    BarProblem a;
    a.tokens = 40;
    a.blocks = 4;
    a.hidden = 96;
    BarProblem b = a;
    b.tokens = 17;
    b.blocks = 9;
    b.hidden = 200;
    b.dtype = ATTNOPS_BFLOAT16;
    b.sourceMajor = true;
    return {a, b};
}

// One host thread's copies of every problem (own outputs), and the calls on them.
struct Instances {
    std::vector<std::unique_ptr<FaInstance>> fa;
    std::vector<FaGrads> grads;
    std::vector<std::unique_ptr<BarInstance>> bar;

    Instances() {
        for (const FaProblem& p : faProblems()) {
            fa.push_back(std::make_unique<FaInstance>(p));
            grads.push_back(attnops::tools::makeGrads(*fa.back()));
        }
        for (const BarProblem& p : barProblems()) bar.push_back(std::make_unique<BarInstance>(p));
    }
    // Jobs: FA forward i, FA grad i, BAR forward i, BAR grad i. Grads need the forward outputs,
    // which the forward jobs rewrite with the same bits.
    size_t jobs() const { return 2 * fa.size() + 2 * bar.size(); }
    static void zero(std::vector<uint8_t>& v) { std::fill(v.begin(), v.end(), uint8_t(0)); }
    static void append(std::vector<uint8_t>& all, const std::vector<uint8_t>& v) { all.insert(all.end(), v.begin(), v.end()); }

    attnopsStatus run(size_t job, attnopsStream* stream) {
        const size_t nf = fa.size(), nb = bar.size();
        if (job < nf) {
            zero(fa[job]->attentionOut.bytes());
            return fa[job]->runForward(stream);
        }
        if ((job -= nf) < nf) {
            zero(grads[job].dq.bytes());
            zero(grads[job].dk.bytes());
            zero(grads[job].dv.bytes());
            return attnops::tools::runBackward(*fa[job], grads[job], stream);
        }
        if ((job -= nf) < nb) {
            zero(bar[job]->hiddenStates.bytes());
            return bar[job]->runForward(true, stream);
        }
        job -= nb;
        zero(bar[job]->gradBlockRes.bytes());
        zero(bar[job]->gradNormWeight.bytes());
        return bar[job]->runBackward(stream);
    }
    std::vector<uint8_t> outputs(size_t job) const {
        const size_t nf = fa.size(), nb = bar.size();
        std::vector<uint8_t> all;
        if (job < nf) {
            append(all, fa[job]->attentionOut.bytes());
            append(all, fa[job]->softmaxMax.bytes());
        } else if ((job -= nf) < nf) {
            append(all, grads[job].dq.bytes());
            append(all, grads[job].dk.bytes());
            append(all, grads[job].dv.bytes());
        } else if ((job -= nf) < nb) {
            append(all, bar[job]->hiddenStates.bytes());
            append(all, bar[job]->probs.bytes());
        } else {
            job -= nb;
            append(all, bar[job]->gradBlockRes.bytes());
            append(all, bar[job]->gradPartialBlock.bytes());
            append(all, bar[job]->gradProjWeight.bytes());
            append(all, bar[job]->gradNormWeight.bytes());
        }
        return all;
    }
};

int iterations() {
    const char* v = std::getenv("ATTNOPS_TEST_ITERATIONS");
    return v ? std::max(1, std::atoi(v)) : 300;
}

TEST(ConcurrencyChild, DISABLED_MixedOpsOnDevicesAndStreams) {
    if (!attnops::testing::isChild()) GTEST_SKIP() << "runs in a fresh process started by its parent test";
    int32_t count = 0;
    ASSERT_EQ(attnopsGetDeviceCount(&count), ATTNOPS_SUCCESS);
    ASSERT_EQ(count, kDevices);
    for (int32_t d = 0; d < kDevices; ++d) ASSERT_EQ(attnopsSetDeviceThreads(d, d + 1), ATTNOPS_SUCCESS);

    // Each call alone, serially, on device 0's default stream; checked against the reference.
    Instances alone;
    std::vector<std::vector<uint8_t>> want;
    for (size_t j = 0; j < alone.jobs(); ++j) {
        ASSERT_EQ(alone.run(j, nullptr), ATTNOPS_SUCCESS) << "job " << j << ": " << lastError();
        want.push_back(alone.outputs(j));
    }
    for (const auto& inst : alone.fa) EXPECT_TRUE(attnops::tools::checkForwardRows(*inst, -1).passed);
    for (size_t i = 0; i < alone.fa.size(); ++i)
        EXPECT_TRUE(attnops::tools::checkBackward(*alone.fa[i], alone.grads[i]).passed) << i;
    for (const auto& inst : alone.bar) {
        EXPECT_TRUE(attnops::tools::checkBarForward(*inst).passed);
        EXPECT_TRUE(attnops::tools::checkBarBackward(*inst).passed);
    }

    const std::vector<uint8_t> wantDisturber = alone.fa[1]->attentionOut.bytes();
    const int rounds = iterations();
    std::vector<std::string> failures(kHostThreads + 1);
    std::barrier start(kHostThreads + 1);
    std::atomic<bool> done{false};
    auto driver = [&](int t) {
        std::string& failure = failures[size_t(t)];
        Instances mine;
        std::vector<attnopsStream*> streams(kDevices, nullptr);
        for (int32_t d = 0; d < kDevices; ++d) {
            if (attnopsSetDevice(d) != ATTNOPS_SUCCESS || attnopsStreamCreate(&streams[size_t(d)]) != ATTNOPS_SUCCESS)
                failure = "stream create: " + lastError();
        }
        attnopsSetDevice(0);
        for (size_t j = 0; j < mine.jobs(); ++j)  // forward outputs for the grad jobs
            if (mine.run(j, streams[0]) != ATTNOPS_SUCCESS) failure = "setup: " + lastError();
        start.arrive_and_wait();
        for (int i = 0; i < rounds && failure.empty(); ++i) {
            const size_t job = size_t(t * 5 + i * 3) % mine.jobs();
            const int32_t device = (t + i) % kDevices;
            attnopsStream* stream = (i + t) % 4 == 3 ? nullptr : streams[size_t(device)];  // some on the default stream
            if (attnopsSetDevice(device) != ATTNOPS_SUCCESS) failure = "set device: " + lastError();
            if (mine.run(job, stream) != ATTNOPS_SUCCESS)
                failure = "job " + std::to_string(job) + " on device " + std::to_string(device) + ": " + lastError();
            else if (mine.outputs(job) != want[job])
                failure = "job " + std::to_string(job) + " on device " + std::to_string(device) + " iteration " +
                          std::to_string(i) + ": result differs from the call run alone";
        }
        for (attnopsStream* s : streams)
            if (s && attnopsStreamDestroy(s) != ATTNOPS_SUCCESS) failure = "destroy: " + lastError();
    };
    // Streams destroyed while their work is queued, and devices synchronized from a thread that
    // does not drive them, while the drivers run.
    auto disturber = [&] {
        std::string& failure = failures[kHostThreads];
        FaInstance inst(faProblems()[1]);
        start.arrive_and_wait();
        for (int i = 0; !done.load() && failure.empty(); ++i) {
            const int32_t device = i % kDevices;
            attnopsSetDevice(device);
            attnopsStream* s = nullptr;
            uint64_t size = 0;
            attnopsExecutor* exec = nullptr;
            void* ws = nullptr;
            std::fill(inst.attentionOut.bytes().begin(), inst.attentionOut.bytes().end(), uint8_t(0));
            if (attnopsStreamCreate(&s) != ATTNOPS_SUCCESS || inst.plan(&size, &exec) != ATTNOPS_SUCCESS ||
                attnopsMalloc(size, &ws) != ATTNOPS_SUCCESS ||
                attnopsFlashAttentionScore(ws, size, exec, s) != ATTNOPS_SUCCESS) {
                failure = "disturber launch: " + lastError();
                break;
            }
            if (attnopsStreamDestroy(s) != ATTNOPS_SUCCESS) failure = "destroy with queued work: " + lastError();
            if (inst.attentionOut.bytes() != wantDisturber) failure = "work queued on a destroyed stream did not complete";
            attnopsFree(ws);
            if (attnopsDeviceSynchronize((device + 1) % kDevices) != ATTNOPS_SUCCESS)
                failure = "device synchronize from another thread: " + lastError();
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < kHostThreads; ++t) threads.emplace_back(driver, t);
    std::thread other(disturber);
    for (auto& th : threads) th.join();
    done = true;
    other.join();
    for (size_t t = 0; t < failures.size(); ++t) EXPECT_EQ(failures[t], "") << "host thread " << t;
}

TEST(Concurrency, MixedOpsFromFourHostThreadsOnThreeDevices) {
#ifdef ATTNOPS_TEST_TSAN
    const char* rounds = "20";  // ThreadSanitizer: a reduced run
#else
    const char* rounds = "300";
#endif
    attnops::testing::expectChildPasses("ConcurrencyChild.DISABLED_MixedOpsOnDevicesAndStreams",
                                        {{"ATTNOPS_NUM_DEVICES", "3"}, {"ATTNOPS_TEST_ITERATIONS", rounds}});
    attnops::testing::expectChildPasses(
        "ConcurrencyChild.DISABLED_MixedOpsOnDevicesAndStreams",
        {{"ATTNOPS_NUM_DEVICES", "3"}, {"ATTNOPS_TEST_ITERATIONS", "4"}, {"ATTNOPS_LAUNCH_BLOCKING", "1"}});
}

}  // namespace
