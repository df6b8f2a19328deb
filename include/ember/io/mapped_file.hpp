#pragma once
// io::detail::MappedFile: a regular file mapped read-only, unmapped on destruction; move-only.
// The readers of safetensors and GGUF files hold one; `kind` ("safetensors", "gguf") names the
// format in the IOError a failed open, stat or mapping throws.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

#include "ember/io/atomic_file.hpp"

namespace ember::io::detail {

class MappedFile {
 public:
  MappedFile(std::string path, const std::string& kind) : path_(std::move(path)) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      throw_io("cannot open " + kind + " file", path_, err);
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw_io("cannot stat " + kind + " file", path_, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IOError(kind + " file '" + path_ + "' is not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      if (p == MAP_FAILED) throw_io("cannot map " + kind + " file", path_, err);
      map_ = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  MappedFile(MappedFile&& o) noexcept
      : path_(std::move(o.path_)), map_(std::exchange(o.map_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      unmap();
      path_ = std::move(o.path_);
      map_ = std::exchange(o.map_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { unmap(); }

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return map_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }

 private:
  void unmap() noexcept {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    map_ = nullptr;
  }

  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace ember::io::detail
