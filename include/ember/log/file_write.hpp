#pragma once
// File writes for the metrics logger and the profiler (DESIGN.md decision 10).
//
// - write_file_atomic: a whole file (the Chrome trace, hparams.json) goes to a temporary file in
//   the target's folder, which is fsynced, renamed over the target, and the folder fsynced: a
//   reader sees the old file or the new one, never half of one.
// - AppendFile: an append-only log (JSON lines, CSV, TensorBoard event file), flushed to the
//   kernel after every record so that a killed program leaves every record written before it;
//   fsync on request (flush(true)) and at close.
// Errors are ember::IOError naming the path and the system's reason.
// (io/atomic_file.hpp does the same for the checkpoint files; this copy keeps log/ and profile/
// free of the file-format layer until that lands for everyone.)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "ember/core/error.hpp"

namespace ember::logging {

namespace detail {
[[noreturn]] inline void throw_io(const std::string& what, const std::string& path, int err) {
  throw IOError(what + " '" + path + "': " + std::strerror(err));
}
inline void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io("write failed for", path, errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}
inline void fsync_dir(const std::filesystem::path& dir) {
  const std::string d = dir.empty() ? std::string(".") : dir.string();
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // some file systems do not open folders; the rename is done anyway
  ::fsync(fd);
  ::close(fd);
}
}  // namespace detail

inline void write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  const std::filesystem::path dir = path.parent_path();
  const std::string temp = (dir.empty() ? std::filesystem::path(".") : dir).string() + "/." +
                           path.filename().string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) detail::throw_io("cannot create a temporary file to write", path.string(), errno);
  try {
    detail::write_all(fd, bytes.data(), bytes.size(), path.string());
    if (::fsync(fd) != 0) detail::throw_io("fsync failed for", path.string(), errno);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    detail::throw_io("close failed for", path.string(), err);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    detail::throw_io("rename into place failed for", path.string(), err);
  }
  detail::fsync_dir(dir);
}

// An append-only file, opened for appending (created when missing).
class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) detail::throw_io("cannot open for appending", path_, errno);
  }
  AppendFile(AppendFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_) { o.fd_ = -1; }
  AppendFile& operator=(AppendFile&& o) noexcept {
    if (this != &o) {
      close_quietly();
      path_ = std::move(o.path_);
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  ~AppendFile() { close_quietly(); }

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // One record, handed to the kernel at once (visible to readers, kept if the program dies).
  void append(std::string_view bytes) {
    EMBER_CHECK(fd_ >= 0, IOError, "AppendFile: '", path_, "' is not open");
    detail::write_all(fd_, bytes.data(), bytes.size(), path_);
  }
  // To the disk (survives a power loss).
  void sync() {
    if (fd_ >= 0 && ::fsync(fd_) != 0) detail::throw_io("fsync failed for", path_, errno);
  }
  void close() {
    if (fd_ < 0) return;
    sync();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) detail::throw_io("close failed for", path_, errno);
  }

 private:
  void close_quietly() noexcept {
    if (fd_ >= 0) {
      ::fsync(fd_);
      ::close(fd_);
      fd_ = -1;
    }
  }
  std::string path_;
  int fd_ = -1;
};

}  // namespace ember::logging
