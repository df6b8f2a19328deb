#pragma once
// The append-only file for the metrics logger, and how the logger writes whole files.
//
// - Whole files (the Chrome trace, hparams.json) are written with io::write_file_atomic
//   (io/atomic_file.hpp: temporary file in the target's folder, fsync, rename, fsync the folder):
//   a reader sees the old file or the new one, never half of one. log/ sits above io/, so it
//   uses that one implementation rather than a copy.
// - AppendFile: an append-only log (JSON lines, CSV, TensorBoard event file), flushed to the
//   kernel after every record so that a killed program leaves every record written before it;
//   fsync on request (flush(true)) and at close. io/ has no append-only file, so it lives here.
// Errors are ember::IOError naming the path and the system's reason.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>

#include "ember/core/error.hpp"
#include "ember/io/atomic_file.hpp"

namespace ember::logging {

// An append-only file, opened for appending (created when missing).
class AppendFile {
 public:
  AppendFile() = default;
  explicit AppendFile(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) io::detail::throw_io("cannot open for appending", path_, errno);
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
    io::write_all(fd_, bytes.data(), bytes.size(), path_);
  }
  // To the disk (survives a power loss).
  void sync() {
    if (fd_ >= 0 && ::fsync(fd_) != 0) io::detail::throw_io("fsync failed for", path_, errno);
  }
  void close() {
    if (fd_ < 0) return;
    sync();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io::detail::throw_io("close failed for", path_, errno);
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
