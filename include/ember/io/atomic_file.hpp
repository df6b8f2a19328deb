#pragma once
// Atomic file writes: the bytes go to a temporary file in the target's
// folder, which is fsynced, renamed over the target, and the folder fsynced. A reader therefore
// sees the old file or the new one, never a mix; a failure (disk full, read-only folder, a
// missing folder, a file-size limit) is an ember::IOError naming the path and the system's
// reason, removes the temporary file and leaves the previous file as it was.
//
//   io::AtomicWriter w("weights.safetensors");
//   w.write(header.data(), header.size());
//   w.write(data, n);
//   w.commit();            // without commit(), the destructor removes the temporary file
//
// POSIX only (open/write/fsync/rename). A process killed between the rename and the folder's
// fsync may, after a power loss (not a process kill), come back with either version; both are
// complete files.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

#include "ember/core/error.hpp"

namespace ember::io {

namespace detail {
inline std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] inline void throw_io(const std::string& what, const std::string& path, int err) {
  throw IOError(::ember::detail::str_cat(what, " '", path, "': ", errno_text(err)));
}

// A name no other writer in this or another process picks: pid and a per-process counter.
inline std::string temp_name_for(const std::filesystem::path& target) {
  static std::atomic<uint64_t> counter{0};
  return ::ember::detail::str_cat(".", target.filename().string(), ".tmp.", ::getpid(), ".",
                                  counter.fetch_add(1, std::memory_order_relaxed));
}
}  // namespace detail

// Makes a folder's entries (a rename, a new file) durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  const std::string d = dir.empty() ? std::string(".") : dir.string();
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) detail::throw_io("fsync of folder: cannot open", d, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on folders (EINVAL); the rename is still atomic.
  if (rc != 0 && err != EINVAL) detail::throw_io("fsync of folder failed for", d, err);
}

// Writes `bytes` to an open descriptor in full (retrying short writes and EINTR).
inline void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most 0x7ffff000 bytes per call.
    const size_t chunk = bytes < (size_t{1} << 30) ? bytes : (size_t{1} << 30);
    ssize_t n = ::write(fd, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_io("write failed for", path, errno);
    }
    if (n == 0) detail::throw_io("write made no progress for", path, EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

class AtomicWriter {
 public:
  explicit AtomicWriter(std::filesystem::path target) : target_(std::move(target)) {
    dir_ = target_.parent_path();
    temp_ = (dir_.empty() ? std::filesystem::path(".") : dir_) / detail::temp_name_for(target_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) detail::throw_io("cannot create a temporary file to write", target_.string(), errno);
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter() { abandon(); }

  void write(const void* data, size_t bytes) {
    EMBER_CHECK(fd_ >= 0, IOError, "AtomicWriter: write after commit or failure for '", target_.string(), "'");
    try {
      write_all(fd_, data, bytes, target_.string());
    } catch (...) {
      abandon();
      throw;
    }
    written_ += bytes;
  }
  size_t bytes_written() const { return written_; }

  // fsync, close, rename over the target, fsync the folder. After a failure the temporary file
  // is gone and the target untouched.
  void commit() {
    EMBER_CHECK(fd_ >= 0, IOError, "AtomicWriter: commit twice or after a failure for '", target_.string(), "'");
    if (::fsync(fd_) != 0) fail("fsync failed for", errno);
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close failed for", errno);  // NFS reports write errors here
    if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("rename into place failed for", errno);
    temp_.clear();
    fsync_directory(dir_);
  }

  const std::filesystem::path& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const char* what, int err) {
    abandon();
    detail::throw_io(what, target_.string(), err);
  }
  void abandon() noexcept {
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
    if (!temp_.empty()) {
      ::unlink(temp_.c_str());
      temp_.clear();
    }
  }

  std::filesystem::path target_, dir_, temp_;
  int fd_ = -1;
  size_t written_ = 0;
};

// The whole file at once.
inline void write_file_atomic(const std::filesystem::path& path, const void* data, size_t bytes) {
  AtomicWriter w(path);
  w.write(data, bytes);
  w.commit();
}
inline void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  write_file_atomic(path, text.data(), text.size());
}

}  // namespace ember::io
