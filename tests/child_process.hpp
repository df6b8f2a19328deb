#pragma once
// Tests that need a process of their own (a crash, a resume in a fresh process) run this test
// executable again on one hidden test case ("[.]"), passing it what to do in environment variables.
#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ember::testing {

// An environment variable, "" where it is not set.
inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Runs this executable on one (hidden) test case with extra environment variables ("NAME=value"),
// its stdout and stderr into `log` (if given); returns the exit status (128 + the signal where a
// signal ended it), the output in `out`. With wait = false it returns 0 at once and the child's
// pid in `pid_out`.
inline int run_child(const std::string& test_name, const std::vector<std::string>& vars, const std::string& log = "",
                     std::string* out = nullptr, pid_t* pid_out = nullptr, bool wait = true) {
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& v : vars) ::putenv(const_cast<char*>(v.c_str()));
    if (!log.empty()) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    ::execl(exe.c_str(), exe.c_str(), test_name.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid_out) *pid_out = pid;
  if (!wait) return 0;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out && !log.empty()) {
    std::ifstream f(log);
    out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace ember::testing
