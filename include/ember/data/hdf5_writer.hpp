#pragma once
// data::Hdf5Writer: writes datasets that data::Hdf5Dataset (and h5py) read, row by row.
//
//   data::Hdf5Writer w("fashion.h5");
//   w.create("images", DType::UInt8, {28, 28}, {.gzip_level = 4});
//   w.create("labels", DType::Int64, {});
//   w.append(example);                 // each field to the dataset of its name
//   w.append("images", batch);         // or a row [28, 28], or rows [k, 28, 28]
//   w.finish();                        // without finish(), the destructor discards the file
//
// Each dataset is chunked along the first dimension (unlimited there) and optionally gzip-
// compressed; rows are buffered and written a chunk at a time. The file is written under a
// temporary name in the target's folder and, by finish(), flushed, fsynced and renamed over the
// target (io/atomic_file.hpp's pattern), so a reader sees the old file or the complete new one.
// Types: float32, float64, int32, int64, uint8 as HDF5's predefined little-endian types; float16
// as the IEEE half type h5py writes for numpy's float16; bfloat16 in the layout HDF5 2.0 calls
// H5T_FLOAT_BFLOAT16LE (HDF5 1.10 and h5py have no name for it; data::Hdf5Dataset reads it back).
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/hdf5_common.hpp"
#include "ember/io/atomic_file.hpp"

namespace ember::data {

struct Hdf5DatasetOptions {
  int64_t chunk_rows = 0;  // rows per chunk; 0: about 64 KiB of rows (at least 1)
  int gzip_level = 0;      // 0: no compression; 1..9: deflate at that level
  bool shuffle = false;    // the byte-shuffle filter before gzip (helps multi-byte numbers)
};

class Hdf5Writer {
 public:
  explicit Hdf5Writer(const std::string& path)
      : path_(path), temp_(((std::filesystem::path(path).parent_path().empty() ? std::filesystem::path(".")
                                                                                : std::filesystem::path(path).parent_path()) /
                             io::detail::temp_name_for(path))
                                .string()) {
    detail::Hdf5Lock lock;
    file_ = detail::Hid(detail::hdf5_check(H5Fcreate(temp_.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate",
                                           ::ember::detail::str_cat("'", path_, "' (temporary file '", temp_, "')")),
                        H5Fclose);
  }
  ~Hdf5Writer() {
    if (finished_) return;
    columns_.clear();
    file_.reset();
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
  Hdf5Writer(const Hdf5Writer&) = delete;
  Hdf5Writer& operator=(const Hdf5Writer&) = delete;

  // A dataset of rows of `row_shape` (its shape is [rows, row_shape...]); "group/name" makes the groups.
  void create(const std::string& dataset, DType dtype, const Shape& row_shape, Hdf5DatasetOptions options = {}) {
    check_open();
    EMBER_CHECK(!dataset.empty() && find(dataset) == nullptr, ValueError, "Hdf5Writer: '", path_, "': dataset '", dataset,
                dataset.empty() ? "' needs a name" : "' was created already");
    EMBER_CHECK(options.gzip_level >= 0 && options.gzip_level <= 9, ValueError, "Hdf5Writer: '", path_, "' dataset '",
                dataset, "': gzip_level ", options.gzip_level, " (0 for none, 1 to 9)");
    const std::string where = detail::hdf5_where(path_, dataset);
    Column c;
    c.name = dataset;
    c.dtype = dtype;
    c.row_shape = row_shape;
    c.row_bytes = static_cast<size_t>(row_shape.numel()) * dtype_size(dtype);
    c.chunk_rows = options.chunk_rows > 0 ? options.chunk_rows
                                          : std::max<int64_t>(1, static_cast<int64_t>((size_t{64} << 10) / std::max<size_t>(c.row_bytes, 1)));
    detail::Hdf5Lock lock;
    c.memory_type = detail::hdf5_memory_type(dtype);
    std::vector<hsize_t> dims = {0}, max_dims = {H5S_UNLIMITED}, chunk = {static_cast<hsize_t>(c.chunk_rows)};
    for (int d = 0; d < row_shape.dim(); ++d) {
      dims.push_back(static_cast<hsize_t>(row_shape[d]));
      max_dims.push_back(static_cast<hsize_t>(row_shape[d]));
      chunk.push_back(static_cast<hsize_t>(std::max<int64_t>(row_shape[d], 1)));
    }
    Hid space(detail::hdf5_check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()),
                                 "H5Screate_simple", where),
              H5Sclose);
    Hid create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    detail::hdf5_check(H5Pset_chunk(create.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk", where);
    if (options.gzip_level > 0) {
      if (options.shuffle) detail::hdf5_check(H5Pset_shuffle(create.get()), "H5Pset_shuffle", where);
      detail::hdf5_check(H5Pset_deflate(create.get(), static_cast<unsigned>(options.gzip_level)), "H5Pset_deflate", where);
    }
    Hid links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    detail::hdf5_check(H5Pset_create_intermediate_group(links.get(), 1), "H5Pset_create_intermediate_group", where);
    c.dataset = Hid(detail::hdf5_check(H5Dcreate2(file_.get(), dataset.c_str(), c.memory_type.get(), space.get(), links.get(),
                                                  create.get(), H5P_DEFAULT),
                                       "H5Dcreate2", where),
                    H5Dclose);
    columns_.push_back(std::move(c));
  }

  // Appends one row (a tensor of the row shape) or several (a tensor [k, row shape...]).
  void append(const std::string& dataset, const AnyTensor& rows) {
    check_open();
    Column* c = find(dataset);
    EMBER_CHECK(c != nullptr, ValueError, "Hdf5Writer: '", path_, "': no dataset '", dataset, "' (create() it first)");
    EMBER_CHECK(rows.defined() && rows.device().is_cpu(), DeviceError, "Hdf5Writer: '", path_, "' dataset '", dataset,
                "': rows must be a host tensor");
    EMBER_CHECK(rows.dtype() == c->dtype, DTypeError, "Hdf5Writer: '", path_, "' dataset '", dataset, "' is ",
                dtype_name(c->dtype), ", the rows are ", dtype_name(rows.dtype()));
    const Shape& s = rows.shape();
    bool one_row = s == c->row_shape, many = s.dim() == c->row_shape.dim() + 1;
    for (int d = 0; many && d < c->row_shape.dim(); ++d) many = s[d + 1] == c->row_shape[d];
    EMBER_CHECK(one_row || many, ShapeError, "Hdf5Writer: '", path_, "' dataset '", dataset, "' has rows of shape ",
                c->row_shape.str(), "; got a tensor of shape ", s.str(), " (a row, or [k, row...])");
    const int64_t k = one_row ? 1 : s[0];
    const auto* p = static_cast<const uint8_t*>(rows.data_ptr());
    c->buffer.insert(c->buffer.end(), p, p + static_cast<size_t>(k) * c->row_bytes);
    c->buffered += k;
    if (c->buffered >= c->chunk_rows) flush(*c);
  }

  // Appends each field of `e` to the dataset of the field's name.
  void append(const Example& e) {
    for (const auto& [name, t] : e.fields()) append(name, t);
  }

  int64_t rows(const std::string& dataset) const {
    const Column* c = find(dataset);
    EMBER_CHECK(c != nullptr, ValueError, "Hdf5Writer: '", path_, "': no dataset '", dataset, "'");
    return c->written + c->buffered;
  }

  // Writes what is buffered, closes the file and moves it into place. Datasets may differ in
  // rows (a file can hold a train and a test split); Hdf5Dataset checks the ones it reads together.
  void finish() {
    check_open();
    {
      detail::Hdf5Lock lock;
      for (Column& c : columns_) flush(c);
      detail::hdf5_check(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "H5Fflush", detail::hdf5_where(path_));
      columns_.clear();
      file_.reset();
    }
    const int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
    const int synced = fd >= 0 ? ::fsync(fd) : -1;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    EMBER_CHECK(synced == 0, IOError, "Hdf5Writer: fsync of '", temp_, "' failed: ", std::strerror(err));
    EMBER_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, IOError, "Hdf5Writer: renaming '", temp_, "' to '", path_,
                "' failed: ", std::strerror(errno));
    finished_ = true;
    io::fsync_directory(std::filesystem::path(path_).parent_path());
  }

 private:
  using Hid = detail::Hid;
  struct Column {
    std::string name;
    DType dtype = DType::Float32;
    Shape row_shape;
    size_t row_bytes = 0;
    int64_t chunk_rows = 1, written = 0, buffered = 0;
    std::vector<uint8_t> buffer;
    Hid dataset, memory_type;
  };

  Column* find(const std::string& name) {
    for (Column& c : columns_)
      if (c.name == name) return &c;
    return nullptr;
  }
  const Column* find(const std::string& name) const { return const_cast<Hdf5Writer*>(this)->find(name); }
  void check_open() const {
    EMBER_CHECK(file_.valid(), IOError, "Hdf5Writer: '", path_, "' was finished (or a finish failed); no more writes");
  }

  // Extends the dataset by the buffered rows and writes them as one hyperslab.
  void flush(Column& c) {
    if (c.buffered == 0) return;
    detail::Hdf5Lock lock;
    const std::string where = ::ember::detail::str_cat(detail::hdf5_where(path_, c.name), " rows [", c.written, ", ",
                                                       c.written + c.buffered, ")");
    std::vector<hsize_t> extent = {static_cast<hsize_t>(c.written + c.buffered)};
    std::vector<hsize_t> start(1 + static_cast<size_t>(c.row_shape.dim()), 0), count = {static_cast<hsize_t>(c.buffered)};
    for (int d = 0; d < c.row_shape.dim(); ++d) {
      extent.push_back(static_cast<hsize_t>(c.row_shape[d]));
      count.push_back(static_cast<hsize_t>(c.row_shape[d]));
    }
    start[0] = static_cast<hsize_t>(c.written);
    detail::hdf5_check(H5Dset_extent(c.dataset.get(), extent.data()), "H5Dset_extent", where);
    if (c.row_bytes > 0) {
      Hid file_space(detail::hdf5_check(H5Dget_space(c.dataset.get()), "H5Dget_space", where), H5Sclose);
      detail::hdf5_check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                         "H5Sselect_hyperslab", where);
      Hid memory_space(detail::hdf5_check(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
                                          "H5Screate_simple", where),
                       H5Sclose);
      detail::hdf5_check(H5Dwrite(c.dataset.get(), c.memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                                  c.buffer.data()),
                         "H5Dwrite", where);
    }
    c.written += c.buffered;
    c.buffered = 0;
    c.buffer.clear();
  }

  std::string path_, temp_;
  Hid file_;
  std::vector<Column> columns_;
  bool finished_ = false;
};

}  // namespace ember::data
