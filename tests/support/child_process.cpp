// Child processes for tests (posix_spawn of /proc/self/exe).
#include "child_process.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace attnops::testing {

bool isChild() { return std::getenv("ATTNOPS_TEST_CHILD") != nullptr; }

ChildResult runChild(const std::string& test, const Environment& env) {
    ChildResult r;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        r.output = "readlink(/proc/self/exe) failed";
        return r;
    }
    exe[n] = '\0';
    std::vector<std::string> envStore;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string entry(*e);
        if (entry.rfind("GTEST_", 0) != 0 && entry.rfind("ATTNOPS_", 0) != 0) envStore.push_back(entry);
    }
    envStore.push_back("ATTNOPS_TEST_CHILD=1");
    for (const auto& [k, v] : env) envStore.push_back(k + "=" + v);
    std::vector<std::string> argStore = {exe, "--gtest_also_run_disabled_tests", "--gtest_filter=" + test};
    std::vector<char*> argv, envp;
    for (auto& a : argStore) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : envStore) envp.push_back(e.data());
    envp.push_back(nullptr);

    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        r.output = "pipe2 failed";
        return r;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe, &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        r.output = std::string("posix_spawn failed: ") + std::strerror(rc);
        return r;
    }
    char buf[4096];
    for (;;) {
        const ssize_t got = read(fds[0], buf, sizeof buf);
        if (got > 0) {
            r.output.append(buf, size_t(got));
        } else if (got < 0 && errno == EINTR) {
            continue;
        } else {
            break;
        }
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return r;
}


ChildResult expectChildPasses(const std::string& test, const Environment& env) {
    const ChildResult r = runChild(test, env);
    std::string envText;
    for (const auto& [k, v] : env) envText += k + "=" + v + " ";
    EXPECT_EQ(r.exitCode, 0) << envText << test << " output:\n" << r.output;
    EXPECT_NE(r.output.find("[  PASSED  ] 1 test."), std::string::npos) << envText << test << " output:\n" << r.output;
    EXPECT_EQ(r.output.find("[  SKIPPED ]"), std::string::npos) << envText << test << " output:\n" << r.output;
    return r;
}

}  // namespace attnops::testing
