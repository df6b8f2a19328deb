#pragma once
// Packed datasets in LMDB (Debian's liblmdb: link -llmdb; CMake has no module for it: find_library(... lmdb)):
// one record (data/record.hpp) per sample under the key = its index as 8 big-endian bytes, and the
// count under "__len__". Written by LmdbWriter (examples/pack_dataset), read by LmdbDataset.
//
// LmdbDataset opens the environment read-only and gives every thread that reads (each loader
// worker) its own read-only transaction, opened on its first get() and kept until the dataset is
// destroyed (MDB_NOTLS: the dataset, not LMDB's thread-local slot, ties transactions to threads).
// Records are copied out of the memory map while decoding, so a returned Example owns its data.
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/record.hpp"

namespace ember::data {

namespace detail {
inline void lmdb_check(int rc, const char* call, const std::string& path) {
  if (rc != MDB_SUCCESS)
    throw IOError(::ember::detail::str_cat("lmdb: ", call, " on '", path, "' failed: ", mdb_strerror(rc)));
}
inline void index_key(int64_t i, uint8_t out[8]) {
  for (int b = 0; b < 8; ++b) out[b] = static_cast<uint8_t>(static_cast<uint64_t>(i) >> (56 - 8 * b));
}
inline constexpr const char* kLenKey = "__len__";
}  // namespace detail

class LmdbDataset : public Dataset {
 public:
  // `decoder` turns encoded-image fields into tensors (images.hpp: data::decode_image); without
  // one they stay uint8 [bytes].
  explicit LmdbDataset(const std::string& path, ImageDecoder decoder = {}) : path_(path), decoder_(std::move(decoder)) {
    detail::lmdb_check(mdb_env_create(&env_), "mdb_env_create", path_);
    const unsigned flags = MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK | (std::filesystem::is_directory(path) ? 0 : MDB_NOSUBDIR);
    int rc = mdb_env_open(env_, path.c_str(), flags, 0644);
    if (rc != MDB_SUCCESS) {
      mdb_env_close(env_);
      env_ = nullptr;
      detail::lmdb_check(rc, "mdb_env_open", path_);
    }
    MDB_txn* txn = nullptr;
    try {
      detail::lmdb_check(mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn), "mdb_txn_begin", path_);
      detail::lmdb_check(mdb_dbi_open(txn, nullptr, 0, &dbi_), "mdb_dbi_open", path_);
      MDB_val k{std::strlen(detail::kLenKey), const_cast<char*>(detail::kLenKey)}, v{};
      rc = mdb_get(txn, dbi_, &k, &v);
      EMBER_CHECK(rc == MDB_SUCCESS && v.mv_size == 8, FormatError, "lmdb: '", path_,
                  "' has no 8-byte __len__ record (not written by ember's packer, or the packing did not finish)");
      uint64_t n;
      std::memcpy(&n, v.mv_data, 8);
      EMBER_CHECK(n < (uint64_t{1} << 48), FormatError, "lmdb: '", path_, "': __len__ is ", n);
      n_ = static_cast<int64_t>(n);
      mdb_txn_abort(txn);
    } catch (...) {
      if (txn) mdb_txn_abort(txn);
      mdb_env_close(env_);
      env_ = nullptr;
      throw;
    }
  }
  ~LmdbDataset() override {
    for (auto& [id, txn] : txns_) mdb_txn_abort(txn);
    if (env_) mdb_env_close(env_);
  }
  LmdbDataset(const LmdbDataset&) = delete;
  LmdbDataset& operator=(const LmdbDataset&) = delete;

  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    check_index(i);
    MDB_txn* txn = thread_txn();
    uint8_t key[8];
    detail::index_key(i, key);
    MDB_val k{8, key}, v{};
    const int rc = mdb_get(txn, dbi_, &k, &v);
    EMBER_CHECK(rc != MDB_NOTFOUND, FormatError, "lmdb: '", path_, "': record ", i, " is missing (__len__ says ", n_, ")");
    detail::lmdb_check(rc, "mdb_get", path_);
    return decode_record(static_cast<const uint8_t*>(v.mv_data), v.mv_size,
                         ::ember::detail::str_cat("'", path_, "' record ", i), decoder_);
  }
  std::string name() const override { return "lmdb(" + path_ + ")"; }
  // Read-only transactions opened so far (one per thread that has read).
  size_t num_transactions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return txns_.size();
  }

 private:
  MDB_txn* thread_txn() const {
    std::lock_guard<std::mutex> lock(mu_);
    MDB_txn*& txn = txns_[std::this_thread::get_id()];
    if (!txn) {
      int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
      if (rc != MDB_SUCCESS) {
        txn = nullptr;
        txns_.erase(std::this_thread::get_id());
        detail::lmdb_check(rc, "mdb_txn_begin (read-only, per worker)", path_);
      }
    }
    return txn;
  }

  std::string path_;
  ImageDecoder decoder_;
  MDB_env* env_ = nullptr;
  MDB_dbi dbi_ = 0;
  int64_t n_ = 0;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::thread::id, MDB_txn*> txns_;
};

// Writes a packed dataset: records appended in index order into a temporary folder next to the
// destination, committed every `commit_every` records; finish() writes __len__, syncs, and renames
// the folder into place (so a crash leaves no half-written database under the final name).
class LmdbWriter {
 public:
  explicit LmdbWriter(const std::string& path, size_t map_bytes = size_t{1} << 36, int64_t commit_every = 2000)
      : path_(path), tmp_(path + ".tmp-" + std::to_string(::getpid())), commit_every_(commit_every) {
    namespace fs = std::filesystem;
    EMBER_CHECK(!fs::exists(path_), IOError, "LmdbWriter: '", path_, "' exists; remove it first");
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    detail::lmdb_check(mdb_env_create(&env_), "mdb_env_create", tmp_);
    detail::lmdb_check(mdb_env_set_mapsize(env_, map_bytes), "mdb_env_set_mapsize", tmp_);
    int rc = mdb_env_open(env_, tmp_.c_str(), MDB_NOSYNC, 0644);
    if (rc != MDB_SUCCESS) {
      mdb_env_close(env_);
      env_ = nullptr;
      detail::lmdb_check(rc, "mdb_env_open", tmp_);
    }
    begin();
    detail::lmdb_check(mdb_dbi_open(txn_, nullptr, 0, &dbi_), "mdb_dbi_open", tmp_);
  }
  ~LmdbWriter() {
    if (txn_) mdb_txn_abort(txn_);
    if (env_) mdb_env_close(env_);
    if (!finished_) {
      std::error_code ec;
      std::filesystem::remove_all(tmp_, ec);
    }
  }
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  // Appends the next record (index = count()).
  void append(const std::vector<uint8_t>& record) {
    uint8_t key[8];
    detail::index_key(n_, key);
    MDB_val k{8, key}, v{record.size(), const_cast<uint8_t*>(record.data())};
    detail::lmdb_check(mdb_put(txn_, dbi_, &k, &v, MDB_APPEND), "mdb_put", tmp_);
    if (++n_ % commit_every_ == 0) {
      commit();
      begin();
    }
  }
  int64_t count() const { return n_; }

  void finish() {
    const uint64_t n = static_cast<uint64_t>(n_);
    MDB_val k{std::strlen(detail::kLenKey), const_cast<char*>(detail::kLenKey)}, v{8, const_cast<uint64_t*>(&n)};
    detail::lmdb_check(mdb_put(txn_, dbi_, &k, &v, 0), "mdb_put(__len__)", tmp_);
    commit();
    detail::lmdb_check(mdb_env_sync(env_, 1), "mdb_env_sync", tmp_);
    mdb_env_close(env_);
    env_ = nullptr;
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    EMBER_CHECK(!ec, IOError, "LmdbWriter: renaming '", tmp_, "' to '", path_, "' failed: ", ec.message());
    // The rename itself reaches the disk with an fsync of the parent folder.
    const std::string parent = std::filesystem::absolute(path_).parent_path().string();
    const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
    finished_ = true;
  }

 private:
  void begin() { detail::lmdb_check(mdb_txn_begin(env_, nullptr, 0, &txn_), "mdb_txn_begin", tmp_); }
  void commit() {
    MDB_txn* t = txn_;
    txn_ = nullptr;
    detail::lmdb_check(mdb_txn_commit(t), "mdb_txn_commit", tmp_);
  }

  std::string path_, tmp_;
  int64_t commit_every_;
  MDB_env* env_ = nullptr;
  MDB_txn* txn_ = nullptr;
  MDB_dbi dbi_ = 0;
  int64_t n_ = 0;
  bool finished_ = false;
};

}  // namespace ember::data
