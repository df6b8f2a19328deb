#pragma once
// TFRecord datasets: TfRecordDataset reads them (random access, several files or a sharded
// pattern), TfRecordWriter writes them. Records are serialized tf.train.Examples
// (data/tf_example.hpp: how features become fields, and the per-feature spec).
//
// A TFRecord file is a sequence of records, each framed as
//   uint64 length (little-endian) | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C of data
// (masked: ((crc >> 15) | (crc << 17)) + 0xa282ead8, io/crc32c.hpp). A whole file may be gzip-compressed
// (TF's compression_type="GZIP").
//
//   data::TfRecordDataset train("mnist/train-*-of-00004",
//                               {.spec = {{"image", {DType::UInt8, {28, 28}}}, {"label", {DType::Int64, {}}}}});
//   data::Example e = train.get(0);   // "image" uint8 [28, 28], "label" int64 []
//
// Random access: the byte offset of every record is found once per file (reading the headers
// only) and cached beside it as <file>.ember-index, written atomically; the cache is used while
// the file's size and modification time are the ones it records, and rebuilt otherwise. Where the
// folder is not writable the index stays in memory. Plain files are memory-mapped; a gzip file is
// decompressed into memory when the dataset opens (it costs its uncompressed size in RAM; its
// index is not cached, since decompressing reads every record anyway). Both CRCs of a record are
// checked when it is read; a malformed record is a FormatError naming the file, the record's byte
// offset and the rule broken. get() is thread-safe (the dataset is immutable once built).
#include <glob.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/gzip.hpp"
#include "ember/data/read_file.hpp"
#include "ember/data/tf_example.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/crc32c.hpp"
#include "ember/io/mapped_file.hpp"

namespace ember::data {

// Whole-file compression: Auto takes a file for gzip when it starts with gzip's magic bytes and
// not with a valid record header (the length CRC tells the two apart).
enum class TfCompression { Auto, None, Gzip };

struct TfRecordOptions {
  TfSpec spec;                                    // per-feature dtype and shape (tf_example.hpp)
  TfCompression compression = TfCompression::Auto;
  bool cache_index = true;                        // read and write <file>.ember-index
};

// Where a file's record index came from.
enum class TfIndexSource { Cache, BuiltAndCached, BuiltInMemory };

inline constexpr const char* kTfIndexSuffix = ".ember-index";

namespace detail {
inline uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
inline uint32_t le32(const uint8_t* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; }
inline void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}
inline uint32_t tf_masked_crc(const uint8_t* p, size_t n) { return io::mask_crc32c(io::crc32c(p, n)); }

[[noreturn]] inline void tfrecord_fail(const std::string& source, uint64_t offset, const std::string& rule) {
  throw FormatError(::ember::detail::str_cat("tfrecord: '", source, "': record at byte ", offset, ": ", rule));
}

// The record at `offset` of the bytes [data, data + size): its data, with the length CRC checked,
// the record's end inside the bytes, and (check_data) the data CRC checked.
inline std::pair<const uint8_t*, size_t> tfrecord_at(const uint8_t* data, size_t size, uint64_t offset,
                                                     const std::string& source, bool check_data = true) {
  const uint64_t avail = offset <= size ? size - offset : 0;
  if (avail < 12)
    tfrecord_fail(source, offset, ::ember::detail::str_cat("truncated record: ", avail, " bytes of 12 (the header)"));
  const uint8_t* h = data + offset;
  const uint32_t stored = le32(h + 8), computed = tf_masked_crc(h, 8);
  if (stored != computed)
    tfrecord_fail(source, offset, ::ember::detail::str_cat("length CRC mismatch (stored ", hex32(stored), ", computed ",
                                                           hex32(computed), ")"));
  const uint64_t len = le64(h);
  if (avail < 16 || len > avail - 16)
    tfrecord_fail(source, offset, ::ember::detail::str_cat("truncated record: ", avail, " bytes of ",
                                                           len > UINT64_MAX - 16 ? len : len + 16));
  if (check_data) {
    const uint32_t dstored = le32(h + 12 + len), dcomputed = tf_masked_crc(h + 12, static_cast<size_t>(len));
    if (dstored != dcomputed)
      tfrecord_fail(source, offset, ::ember::detail::str_cat("data CRC mismatch (stored ", hex32(dstored), ", computed ",
                                                             hex32(dcomputed), ")"));
  }
  return {h + 12, static_cast<size_t>(len)};
}

inline bool tfrecord_looks_gzip(const uint8_t* data, size_t size) {
  if (!is_gzip(data, size)) return false;
  return size < 12 || le32(data + 8) != tf_masked_crc(data, 8);
}

inline int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}
}  // namespace detail

// The byte offset of every record in a TFRecord file's bytes (a mapped file, a decompressed gzip
// file, a fuzzer's input): each header's length CRC and each record's extent are checked; with
// check_data, each data CRC too.
inline std::vector<uint64_t> index_tfrecord(const uint8_t* data, size_t size, const std::string& source,
                                            bool check_data = false) {
  std::vector<uint64_t> offsets;
  uint64_t pos = 0;
  while (pos < size) {
    const auto rec = detail::tfrecord_at(data, size, pos, source, check_data);
    offsets.push_back(pos);
    pos += 16 + rec.second;
  }
  return offsets;
}

// The index cache's bytes: "EMBERTFI" u32 version u32 0 | u64 file size | i64 mtime (ns) | u64 count |
// count x u64 offset | u32 CRC-32C of everything before (all little-endian).
inline std::vector<uint8_t> encode_tfrecord_index(const std::vector<uint64_t>& offsets, uint64_t file_size,
                                                  int64_t mtime_ns) {
  std::vector<uint8_t> out = {'E', 'M', 'B', 'E', 'R', 'T', 'F', 'I'};
  detail::put_le(out, 1, 4);
  detail::put_le(out, 0, 4);
  detail::put_le(out, file_size, 8);
  detail::put_le(out, static_cast<uint64_t>(mtime_ns), 8);
  detail::put_le(out, offsets.size(), 8);
  for (uint64_t o : offsets) detail::put_le(out, o, 8);
  detail::put_le(out, io::crc32c(out.data(), out.size()), 4);
  return out;
}

// The offsets an index cache holds, or nothing where it is damaged, of another version, or for
// another state of the file (size or mtime differ). Offsets must rise and lie inside the file.
inline std::optional<std::vector<uint64_t>> decode_tfrecord_index(const uint8_t* p, size_t n, uint64_t file_size,
                                                                  int64_t mtime_ns) {
  if (n < 44 || std::memcmp(p, "EMBERTFI", 8) != 0 || detail::le32(p + 8) != 1) return std::nullopt;
  if (detail::le32(p + n - 4) != io::crc32c(p, n - 4)) return std::nullopt;
  const uint64_t count = detail::le64(p + 32);
  if (detail::le64(p + 16) != file_size || static_cast<int64_t>(detail::le64(p + 24)) != mtime_ns) return std::nullopt;
  if (count != (n - 44) / 8 || (n - 44) % 8 != 0) return std::nullopt;
  std::vector<uint64_t> offsets(static_cast<size_t>(count));
  for (size_t i = 0; i < offsets.size(); ++i) {
    offsets[i] = detail::le64(p + 40 + 8 * i);
    if (file_size < 16 || offsets[i] > file_size - 16 || (i > 0 && offsets[i] <= offsets[i - 1]) ||
        (i == 0 && offsets[0] != 0))
      return std::nullopt;
  }
  return offsets;
}

// Files named by paths and glob patterns ("data/train-?????-of-00016", "shards/*.tfrecord"): each
// pattern's matches in name order, the entries in the order given. Index caches are never matches.
inline std::vector<std::string> expand_tfrecord_paths(const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) {
    if (e.find_first_of("*?[") == std::string::npos) {
      out.push_back(e);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(e.c_str(), 0, nullptr, &g);  // sorted by name
    std::vector<std::string> found;
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
      std::string p = g.gl_pathv[i];
      const size_t sl = std::strlen(kTfIndexSuffix);
      if (p.size() < sl || p.compare(p.size() - sl, sl, kTfIndexSuffix) != 0) found.push_back(std::move(p));
    }
    ::globfree(&g);
    EMBER_CHECK(!found.empty(), IOError, "TfRecordDataset: no file matches '", e, "'");
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

class TfRecordDataset : public Dataset {
 public:
  struct File {
    std::string path;
    bool gzip = false;
    TfIndexSource index = TfIndexSource::BuiltInMemory;
    std::vector<uint64_t> offsets;  // of each record, in the (decompressed) bytes
  };

  TfRecordDataset(const std::vector<std::string>& files_or_patterns, TfRecordOptions options = {})
      : options_(std::move(options)) {
    const auto paths = expand_tfrecord_paths(files_or_patterns);
    EMBER_CHECK(!paths.empty(), ValueError, "TfRecordDataset: no files given");
    for (const auto& p : paths) open(p);
    for (const auto& f : files_) {
      starts_.push_back(n_);
      n_ += static_cast<int64_t>(f.offsets.size());
    }
  }
  // One path or pattern. A template, so that a braced list ({"a"}, {"a", "b"}) always means the list.
  template <class S, class = std::enable_if_t<std::is_convertible_v<const S&, std::string_view>>>
  explicit TfRecordDataset(const S& file_or_pattern, TfRecordOptions options = {})
      : TfRecordDataset(std::vector<std::string>{std::string(std::string_view(file_or_pattern))}, std::move(options)) {}

  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    const auto [k, j] = locate(i);
    const auto rec = record_bytes(k, j);
    return decode_tf_example(rec.first, rec.second, source(k, j), options_.spec);
  }
  // Record i's data (the serialized Example), both CRCs checked.
  std::vector<uint8_t> record(int64_t i) const {
    const auto [k, j] = locate(i);
    const auto rec = record_bytes(k, j);
    return std::vector<uint8_t>(rec.first, rec.first + rec.second);
  }
  std::string name() const override {
    return ::ember::detail::str_cat("tfrecord(", files_[0].path, files_.size() > 1 ? " and " : "",
                                    files_.size() > 1 ? std::to_string(files_.size() - 1) + " more" : "", ")");
  }
  const std::vector<File>& files() const { return files_; }

 private:
  struct Bytes {
    std::unique_ptr<io::detail::MappedFile> map;
    std::vector<uint8_t> inflated;
    const uint8_t* data() const { return map ? map->data() : inflated.data(); }
    size_t size() const { return map ? static_cast<size_t>(map->size()) : inflated.size(); }
  };

  void open(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) io::detail::throw_io("TfRecordDataset: cannot open", path, errno);
    Bytes b;
    b.map = std::make_unique<io::detail::MappedFile>(path, "tfrecord");
    File f;
    f.path = path;
    const TfCompression c = options_.compression;
    f.gzip = c == TfCompression::Gzip || (c == TfCompression::Auto && detail::tfrecord_looks_gzip(b.data(), b.size()));
    if (f.gzip) {
      b.inflated = gunzip(b.data(), b.size(), path);
      b.map.reset();
      f.offsets = index_tfrecord(b.inflated.data(), b.inflated.size(), path);
    } else {
      f.offsets = indexed(path, b, static_cast<uint64_t>(st.st_size), detail::mtime_ns(st), f.index);
    }
    files_.push_back(std::move(f));
    bytes_.push_back(std::move(b));
  }

  std::vector<uint64_t> indexed(const std::string& path, const Bytes& b, uint64_t size, int64_t mtime,
                                TfIndexSource& source) const {
    const std::string cache = path + kTfIndexSuffix;
    if (options_.cache_index && b.size() == size) {
      try {
        const auto bytes = read_file_bytes(cache);
        if (auto offsets = decode_tfrecord_index(bytes.data(), bytes.size(), size, mtime)) {
          source = TfIndexSource::Cache;
          return std::move(*offsets);
        }
      } catch (const Error&) {  // no cache, or not readable: build the index
      }
    }
    std::vector<uint64_t> offsets = index_tfrecord(b.data(), b.size(), path);
    source = TfIndexSource::BuiltInMemory;
    if (options_.cache_index) {
      try {
        const auto bytes = encode_tfrecord_index(offsets, size, mtime);
        io::write_file_atomic(cache, bytes.data(), bytes.size());
        source = TfIndexSource::BuiltAndCached;
      } catch (const IOError&) {  // a read-only folder: the index stays in memory
      }
    }
    return offsets;
  }

  std::pair<size_t, size_t> locate(int64_t i) const {
    check_index(i);
    const size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
    return {k, static_cast<size_t>(i - starts_[k])};
  }
  std::pair<const uint8_t*, size_t> record_bytes(size_t k, size_t j) const {
    return detail::tfrecord_at(bytes_[k].data(), bytes_[k].size(), files_[k].offsets[j], files_[k].path);
  }
  std::string source(size_t k, size_t j) const {
    return ::ember::detail::str_cat("'", files_[k].path, "' record ", j, " (at byte ", files_[k].offsets[j], ")");
  }

  TfRecordOptions options_;
  std::vector<File> files_;
  std::vector<Bytes> bytes_;
  std::vector<int64_t> starts_;
  int64_t n_ = 0;
};

// Writes a TFRecord file: records go to a temporary file beside `path` (gzip-compressed as a whole
// with gzip = true), which finish() renames into place; without finish() (an exception, an early
// return) the temporary file is removed and `path` stays as it was.
class TfRecordWriter {
 public:
  explicit TfRecordWriter(const std::string& path, bool gzip = false) : path_(path), out_(path), gzip_(gzip) {
    if (gzip_) {
      EMBER_CHECK(deflateInit2(&zs_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK,
                  IOError, "TfRecordWriter: '", path_, "': zlib deflateInit2 failed");
    }
  }
  ~TfRecordWriter() {
    if (gzip_) deflateEnd(&zs_);
  }
  TfRecordWriter(const TfRecordWriter&) = delete;
  TfRecordWriter& operator=(const TfRecordWriter&) = delete;

  void write(const uint8_t* data, size_t n) {
    EMBER_CHECK(!finished_, IOError, "TfRecordWriter: '", path_, "': write after finish()");
    uint8_t head[12];
    for (int i = 0; i < 8; ++i) head[i] = static_cast<uint8_t>(static_cast<uint64_t>(n) >> (8 * i));
    store32(head + 8, detail::tf_masked_crc(head, 8));
    uint8_t tail[4];
    store32(tail, detail::tf_masked_crc(data, n));
    put(head, 12, Z_NO_FLUSH);
    put(data, n, Z_NO_FLUSH);
    put(tail, 4, Z_NO_FLUSH);
    ++count_;
  }
  void write(const std::vector<uint8_t>& record) { write(record.data(), record.size()); }
  void write(const Example& ex) { write(encode_tf_example(ex)); }
  void write(const TfFeatures& features) { write(encode_tf_example(features)); }
  int64_t count() const { return count_; }

  void finish() {
    EMBER_CHECK(!finished_, IOError, "TfRecordWriter: '", path_, "': finish() twice");
    if (gzip_) put(nullptr, 0, Z_FINISH);
    out_.commit();
    finished_ = true;
  }

 private:
  static void store32(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
  void put(const uint8_t* p, size_t n, int flush) {
    if (!gzip_) {
      if (n) out_.write(p, n);
      return;
    }
    EMBER_CHECK(n <= UINT32_MAX, ValueError, "TfRecordWriter: '", path_, "': a record of ", n,
                " bytes is too large for zlib's one-call input (4 GiB)");
    zs_.next_in = const_cast<Bytef*>(p);
    zs_.avail_in = static_cast<uInt>(n);
    uint8_t buf[1 << 16];
    int rc;
    do {
      zs_.next_out = buf;
      zs_.avail_out = sizeof buf;
      rc = deflate(&zs_, flush);
      EMBER_CHECK(rc != Z_STREAM_ERROR, IOError, "TfRecordWriter: '", path_, "': zlib deflate failed");
      out_.write(buf, sizeof buf - zs_.avail_out);
    } while (zs_.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  }

  std::string path_;
  io::AtomicWriter out_;
  bool gzip_;
  z_stream zs_{};
  int64_t count_ = 0;
  bool finished_ = false;
};

}  // namespace ember::data
