#pragma once
// A fresh, empty folder for one test under the system temp folder, removed with its contents
// when the test leaves the scope. The name is <prefix>-<pid>-<counter>: the pid keeps the
// folders of child processes and parallel ctest runs apart, the counter those of one process.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace ember::testing {

struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& prefix) {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;  // never throw from a destructor; a leftover folder is harmless
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // dir / "a.safetensors": the path of a file in the folder, as a string.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace ember::testing
