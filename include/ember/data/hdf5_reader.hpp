#pragma once
// data::Hdf5Dataset: samples from one or more datasets of an HDF5 file, each a field of the
// Example, sliced along the first dimension (the sample axis, which must agree across them).
//
//   data::Hdf5Dataset train("fashion.h5", {"train/images", "train/labels"});
//   train.get(7)["images"];          // uint8 [28, 28], read as one hyperslab
//   train.rows(0, 512)["labels"];    // int64 [512], rows [0, 512) in one read
//
// A field is named after the last component of its dataset's path ("train/images" -> "images")
// unless Hdf5Options::fields maps it. get(i) and rows(a, b) read only the rows asked for (a
// hyperslab), from contiguous, chunked or compressed (gzip, shuffle, ...) layouts alike; the file
// is never loaded whole. Element types: data/hdf5_common.hpp (hdf5_read_type) says what each HDF5
// type reads as and which are refused. Every HDF5 call holds the process-wide hdf5_mutex(): see
// data/hdf5_common.hpp for why, and docs/data.md for what it costs.
#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/hdf5_common.hpp"

namespace ember::data {

namespace detail {
// Hash slots for a chunk cache of `bytes`: a prime, about one per KiB (HDF5 advises about 100 per
// chunk that fits; chunks of 64 KiB, Hdf5Writer's default, get 64), at least HDF5's default 521.
inline size_t hdf5_cache_slots(size_t bytes) {
  size_t n = std::max<size_t>(521, std::min<size_t>(bytes >> 10, size_t{1} << 24)) | 1;
  auto prime = [](size_t v) {
    for (size_t d = 3; d * d <= v; d += 2)
      if (v % d == 0) return false;
    return true;
  };
  while (!prime(n)) n += 2;
  return n;
}
}  // namespace detail

struct Hdf5Options {
  // Dataset path -> field name, for the datasets whose field is not the last path component.
  std::vector<std::pair<std::string, std::string>> fields;
  // HDF5's chunk cache per dataset, in bytes (0: HDF5's default, 1 MiB). A chunked, compressed
  // dataset decompresses a whole chunk to read one row; shuffled reads revisit every chunk each
  // epoch, so a cache that holds the whole decompressed dataset (when memory allows) decompresses
  // each chunk once instead of about once per row (bench_hdf5 measures both).
  size_t chunk_cache_bytes = 0;
};

class Hdf5Dataset : public Dataset {
 public:
  struct Field {
    std::string name;     // the Example's field
    std::string dataset;  // the path in the file
    DType dtype = DType::Float32;
    Shape row_shape;        // the dataset's shape without the first dimension
    std::string file_type;  // the HDF5 element type, in words
  };

  Hdf5Dataset(const std::string& path, const std::vector<std::string>& datasets, Hdf5Options options = {})
      : path_(path), name_("hdf5(" + path + ")") {
    EMBER_CHECK(!datasets.empty(), ValueError, "Hdf5Dataset: '", path, "': needs at least one dataset name");
    std::error_code ec;
    EMBER_CHECK(std::filesystem::is_regular_file(path, ec), IOError, "hdf5: cannot open '", path,
                "': no such file");
    detail::Hdf5Lock lock;
#if H5_VERSION_GE(1, 12, 0)
    const htri_t is_hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
    const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
#endif
    EMBER_CHECK(is_hdf5 > 0, FormatError, "hdf5: '", path,
                "' is not an HDF5 file (no HDF5 signature): ", detail::hdf5_error_stack());
    file_ = detail::Hid(detail::hdf5_check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen",
                                           detail::hdf5_where(path)),
                        H5Fclose);
    for (const std::string& ds : datasets) open_field(ds, options);
  }

  int64_t size() const override { return n_; }
  std::string name() const override { return name_; }
  const std::vector<Field>& fields() const { return fields_; }

  // Example i: per field, row i (a tensor of the row shape; a scalar for a 1-D dataset).
  Example get(int64_t i) const override {
    check_index(i);
    Example e;
    detail::Hdf5Lock lock;
    for (size_t k = 0; k < fields_.size(); ++k) e.set(fields_[k].name, read_rows(k, i, 1).select(0));
    return e;
  }

  // Rows [begin, end) of every field, each a tensor [end - begin, row shape...], in one read per field.
  Example rows(int64_t begin, int64_t end) const {
    EMBER_CHECK(begin >= 0 && begin <= end && end <= n_, IndexError, name_, ": rows [", begin, ", ", end,
                ") out of range [0, ", n_, ")");
    Example e;
    detail::Hdf5Lock lock;
    for (size_t k = 0; k < fields_.size(); ++k) e.set(fields_[k].name, read_rows(k, begin, end - begin));
    return e;
  }

 private:
  struct Open {
    detail::Hid dataset, file_space, memory_type;
    std::vector<hsize_t> dims;
  };

  void open_field(const std::string& ds, const Hdf5Options& options) {
    const std::string where = detail::hdf5_where(path_, ds);
    const htri_t exists = path_exists(ds);
    EMBER_CHECK(exists > 0, FormatError, "hdf5: '", path_, "' has no dataset '", ds, "' (it has: ", dataset_list(), ")");
    Hid access(H5Pcreate(H5P_DATASET_ACCESS), H5Pclose);
    if (options.chunk_cache_bytes > 0)
      detail::hdf5_check(H5Pset_chunk_cache(access.get(), detail::hdf5_cache_slots(options.chunk_cache_bytes),
                                            options.chunk_cache_bytes, H5D_CHUNK_CACHE_W0_DEFAULT),
                         "H5Pset_chunk_cache", where);
    Open o;
    o.dataset = Hid(H5Dopen2(file_.get(), ds.c_str(), access.get()), H5Dclose);
    if (!o.dataset.valid())
      throw FormatError(::ember::detail::str_cat("hdf5: ", where, " is not a dataset (a group?): ",
                                                 detail::hdf5_error_stack()));
    Hid type(detail::hdf5_check(H5Dget_type(o.dataset.get()), "H5Dget_type", where), H5Tclose);
    detail::Hdf5ReadType rt = detail::hdf5_read_type(type.get(), where);
    o.memory_type = std::move(rt.memory_type);
    o.file_space = Hid(detail::hdf5_check(H5Dget_space(o.dataset.get()), "H5Dget_space", where), H5Sclose);
    const int rank = H5Sget_simple_extent_ndims(o.file_space.get());
    EMBER_CHECK(rank >= 1, ShapeError, "hdf5: ", where, rank == 0 ? " is a scalar" : " has no simple shape",
                "; a field needs a first dimension (the sample axis)");
    EMBER_CHECK(rank <= kMaxDims + 1, ShapeError, "hdf5: ", where, " has ", rank, " dimensions; ember tensors have at most ",
                kMaxDims, " and a row drops the first");
    o.dims.resize(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(o.file_space.get(), o.dims.data(), nullptr);

    Field f;
    f.dataset = ds;
    f.name = ds.substr(ds.find_last_of('/') == std::string::npos ? 0 : ds.find_last_of('/') + 1);
    for (const auto& [d, field] : options.fields)
      if (d == ds) f.name = field;
    f.dtype = rt.dtype;
    f.file_type = rt.file_type;
    for (int d = 1; d < rank; ++d) f.row_shape.push_back(static_cast<int64_t>(o.dims[static_cast<size_t>(d)]));
    for (const Field& other : fields_)
      EMBER_CHECK(other.name != f.name, ValueError, "Hdf5Dataset: '", path_, "': datasets '", other.dataset, "' and '", ds,
                  "' both give the field '", f.name, "' (name one in Hdf5Options::fields)");
    const int64_t rows = static_cast<int64_t>(o.dims[0]);
    if (!fields_.empty())
      EMBER_CHECK(rows == n_, ShapeError, "Hdf5Dataset: '", path_, "': dataset '", ds, "' has ", rows,
                  " rows (first dimension) but dataset '", fields_.front().dataset, "' has ", n_,
                  "; the first dimension is the sample axis and must agree");
    n_ = rows;
    fields_.push_back(std::move(f));
    open_.push_back(std::move(o));
  }

  // Rows [begin, begin + count) of field k as a tensor [count, row shape...]. Under the lock.
  // Nothing is allocated but the tensor (get() runs this per row: bench_hdf5 measures it).
  AnyTensor read_rows(size_t k, int64_t begin, int64_t count) const {
    const Field& f = fields_[k];
    const Open& o = open_[k];
    Shape shape;
    shape.push_back(count);
    for (int d = 0; d < f.row_shape.dim(); ++d) shape.push_back(f.row_shape[d]);
    AnyTensor t = AnyTensor::empty(shape, f.dtype);
    if (t.numel() == 0) return t;
    std::array<hsize_t, kMaxDims + 1> start{}, extent{};
    const int rank = static_cast<int>(o.dims.size());
    for (int d = 0; d < rank; ++d) extent[static_cast<size_t>(d)] = o.dims[static_cast<size_t>(d)];
    start[0] = static_cast<hsize_t>(begin);
    extent[0] = static_cast<hsize_t>(count);
    const char* failed = nullptr;
    hid_t memory_space = H5I_INVALID_HID;
    if (H5Sselect_hyperslab(o.file_space.get(), H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr) < 0)
      failed = "H5Sselect_hyperslab";
    else if ((memory_space = H5Screate_simple(rank, extent.data(), nullptr)) < 0)
      failed = "H5Screate_simple";
    else if (H5Dread(o.dataset.get(), o.memory_type.get(), memory_space, o.file_space.get(), H5P_DEFAULT, t.data_ptr()) < 0)
      failed = "H5Dread";
    if (memory_space >= 0) H5Sclose(memory_space);
    if (failed)
      detail::throw_hdf5(failed, ::ember::detail::str_cat(detail::hdf5_where(path_, f.dataset), " rows [", begin, ", ",
                                                          begin + count, ")"));
    return t;
  }

  // Whether every link on the way to `ds` exists (H5Lexists on "a/b/c" fails, rather than saying
  // no, when "a" is missing).
  htri_t path_exists(const std::string& ds) const {
    std::string prefix;
    size_t at = ds.front() == '/' ? 1 : 0;
    if (at) prefix = "/";
    while (at <= ds.size()) {
      const size_t slash = ds.find('/', at);
      const std::string part = ds.substr(at, slash == std::string::npos ? std::string::npos : slash - at);
      if (!part.empty()) {
        prefix += (prefix.empty() || prefix.back() == '/' ? "" : "/") + part;
        const htri_t e = H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT);
        if (e <= 0) {
          H5Eclear2(H5E_DEFAULT);
          return 0;
        }
      }
      if (slash == std::string::npos) break;
      at = slash + 1;
    }
    return prefix.empty() ? 0 : 1;
  }

  // The file's datasets, for the message when one is missing (the first 20).
  std::string dataset_list() const {
    std::vector<std::string> names;
    auto visit = [](hid_t root, const char* name, const auto*, void* out) -> herr_t {
      auto& list = *static_cast<std::vector<std::string>*>(out);
      hid_t obj = H5Oopen(root, name, H5P_DEFAULT);
      if (obj >= 0) {
        if (H5Iget_type(obj) == H5I_DATASET) list.push_back(name);
        H5Oclose(obj);
      }
      return list.size() >= 20 ? 1 : 0;
    };
    H5Lvisit(file_.get(), H5_INDEX_NAME, H5_ITER_INC, visit, &names);
    H5Eclear2(H5E_DEFAULT);
    if (names.empty()) return "no datasets";
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return names.size() >= 20 ? s + ", ..." : s;
  }

  using Hid = detail::Hid;
  std::string path_, name_;
  Hid file_;
  std::vector<Field> fields_;
  std::vector<Open> open_;
  int64_t n_ = 0;
};

}  // namespace ember::data
