#pragma once
// What the HDF5 reader and writer (data/hdf5_reader.hpp, data/hdf5_writer.hpp) share: the global
// lock, RAII handles for hid_t, the HDF5 error stack as exception text, and the mapping between
// HDF5 types and ember dtypes. Needs the HDF5 C library (Debian libhdf5-dev; CMake: FindHDF5 with
// the C component; link HDF5::HDF5 or -lhdf5 with -I/usr/include/hdf5/serial).
//
// Thread safety: every HDF5 call is made under one process-wide lock (hdf5_mutex()). The HDF5
// library keeps global state (the identifier tables, the free lists, the metadata and chunk
// caches, the error stack), and a build without --enable-threadsafe (Debian's libhdf5, like most
// distributions' serial builds) must not be entered by two threads at once, whatever file or
// handle each uses: one file handle per loader worker is not enough. A thread-safe build takes its
// own global lock, so it would not run reads in parallel either. The lock is recursive, so a
// handle closed while the lock is held (in a destructor on an error path) does not deadlock. What
// it costs is measured by benchmarks/bench_hdf5.cpp (docs/data.md, "HDF5").
//
// Errors: HDF5 prints its error stack to stderr by default; under the lock that printing is off
// (and restored afterwards), and a failed call throws an ember error whose message is the file,
// the dataset and HDF5's error stack, outermost first.
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"

namespace ember::data {

// The lock around every HDF5 call in this process (see the header comment). Never destroyed, so
// that a dataset or writer in a static object can still close its handles at exit.
inline std::recursive_mutex& hdf5_mutex() {
  static auto* mu = new std::recursive_mutex;
  return *mu;
}

namespace detail {

// Holds hdf5_mutex() and silences HDF5's automatic error printing for its scope.
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Hdf5Lock() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5's error stack, outermost call first, as one line; the stack is cleared. Call under the lock.
inline std::string hdf5_error_stack() {
  std::string s;
  auto walk = [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
    auto& text = *static_cast<std::string*>(out);
    if (!text.empty()) text += "; ";
    text += e->func_name ? e->func_name : "?";
    text += ": ";
    text += e->desc ? e->desc : "(no description)";
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? std::string("no HDF5 error recorded") : s;
}

// "'file.h5' dataset 'images'" (or just the file) for messages.
inline std::string hdf5_where(const std::string& path, const std::string& dataset = {}) {
  return dataset.empty() ? "'" + path + "'" : ::ember::detail::str_cat("'", path, "' dataset '", dataset, "'");
}

template <class E = IOError>
[[noreturn]] inline void throw_hdf5(const char* call, const std::string& where) {
  throw E(::ember::detail::str_cat("hdf5: ", call, " failed for ", where, ": ", hdf5_error_stack()));
}

// hid_t and herr_t results: negative is failure.
template <class E = IOError>
inline hid_t hdf5_check(hid_t id, const char* call, const std::string& where) {
  if (id < 0) throw_hdf5<E>(call, where);
  return id;
}

// An owned HDF5 identifier, closed (under the lock) with the close function of its kind.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && close_) {
      Hdf5Lock lock;
      close_(id_);
      H5Eclear2(H5E_DEFAULT);
    }
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// The IEEE half layout (sign bit 15, exponent bits 10-14 with bias 15, mantissa bits 0-9), as
// h5py and HDF5 1.14+ store numpy's float16; bfloat16 is the upper half of a float32 (exponent
// bits 7-14 with bias 127, mantissa bits 0-6), as HDF5 2.0 stores it (H5T_FLOAT_BFLOAT16LE).
// HDF5 1.10 has neither predefined, so both are built from IEEE_F32LE, the way h5py does.
inline Hid hdf5_float16_type(bool bfloat) {
  Hid t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
  const bool ok = t.valid() && H5Tset_fields(t.get(), 15, bfloat ? 7 : 10, bfloat ? 8 : 5, 0, bfloat ? 7 : 10) >= 0 &&
                  H5Tset_size(t.get(), 2) >= 0 && H5Tset_ebias(t.get(), bfloat ? 127 : 15) >= 0;
  if (!ok) throw_hdf5("building the 16-bit float type", bfloat ? "bfloat16" : "float16");
  return t;
}

// The in-memory type ember's elements of `dtype` have (little-endian x86/ARM hosts).
inline Hid hdf5_memory_type(DType dtype) {
  auto copy = [](hid_t predefined) { return Hid(H5Tcopy(predefined), H5Tclose); };
  switch (dtype) {
    case DType::Float32: return copy(H5T_NATIVE_FLOAT);
    case DType::Float64: return copy(H5T_NATIVE_DOUBLE);
    case DType::Float16: return hdf5_float16_type(false);
    case DType::BFloat16: return hdf5_float16_type(true);
    case DType::Int32: return copy(H5T_NATIVE_INT32);
    case DType::Int64: return copy(H5T_NATIVE_INT64);
    case DType::UInt8: return copy(H5T_NATIVE_UINT8);
  }
  throw DTypeError(::ember::detail::str_cat("hdf5: no HDF5 type for dtype ", dtype_name(dtype)));
}

// What a file's element type is read as: the ember dtype and the memory type HDF5 converts into.
struct Hdf5ReadType {
  DType dtype = DType::Float32;
  Hid memory_type;
  std::string file_type;  // "16-bit unsigned integer", for messages and Hdf5Dataset::fields()
};

// Maps a dataset's element type to an ember dtype. Integers that ember lacks are widened without
// loss (int8, int16, uint16 -> int32; uint32 -> int64); h5py's bool (an enum FALSE = 0, TRUE = 1
// over int8) reads as uint8 0/1, like numpy's bool in data/npy.hpp. Refused with a FormatError:
// uint64 (no lossless ember dtype), floats other than 16/32/64-bit IEEE and bfloat16, strings,
// compounds, arrays, other enums, references, opaque and variable-length types.
inline Hdf5ReadType hdf5_read_type(hid_t file_type, const std::string& where) {
  Hdf5ReadType r;
  const H5T_class_t cls = H5Tget_class(file_type);
  const size_t size = H5Tget_size(file_type);
  auto refuse = [&](const std::string& what, const char* why) {
    throw FormatError(::ember::detail::str_cat("hdf5: ", where, " holds ", what, ", which ember cannot read: ", why));
  };
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(file_type) == H5T_SGN_2;
    r.file_type = ::ember::detail::str_cat(8 * size, "-bit ", is_signed ? "signed" : "unsigned", " integer");
    if (size == 1 && !is_signed) r.dtype = DType::UInt8;
    else if (size <= 2 || (size == 4 && is_signed)) r.dtype = DType::Int32;
    else if (size == 4 || (size == 8 && is_signed)) r.dtype = DType::Int64;
    else refuse(r.file_type, "ember's widest integer is int64, which cannot hold every value (convert to int64 or float64)");
  } else if (cls == H5T_FLOAT) {
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    H5Tget_fields(file_type, &spos, &epos, &esize, &mpos, &msize);
    const size_t ebias = H5Tget_ebias(file_type);
    r.file_type = ::ember::detail::str_cat(8 * size, "-bit float (", esize, "-bit exponent, ", msize, "-bit mantissa)");
    if (size == 4 && esize == 8 && msize == 23) r.dtype = DType::Float32;
    else if (size == 8 && esize == 11 && msize == 52) r.dtype = DType::Float64;
    else if (size == 2 && spos == 15 && esize == 5 && msize == 10 && mpos == 0 && ebias == 15) r.dtype = DType::Float16;
    else if (size == 2 && spos == 15 && esize == 8 && msize == 7 && mpos == 0 && ebias == 127) r.dtype = DType::BFloat16;
    else refuse(r.file_type, "ember reads IEEE float16, float32, float64 and bfloat16");
  } else if (cls == H5T_ENUM) {
    r.file_type = "an enum";
    int members = H5Tget_nmembers(file_type);
    int8_t v0 = -1, v1 = -1;
    char* n0 = members == 2 ? H5Tget_member_name(file_type, 0) : nullptr;
    char* n1 = members == 2 ? H5Tget_member_name(file_type, 1) : nullptr;
    const bool is_bool = size == 1 && n0 && n1 && std::string(n0) == "FALSE" && std::string(n1) == "TRUE" &&
                         H5Tget_member_value(file_type, 0, &v0) >= 0 && H5Tget_member_value(file_type, 1, &v1) >= 0 &&
                         v0 == 0 && v1 == 1;
    if (n0) H5free_memory(n0);
    if (n1) H5free_memory(n1);
    if (!is_bool) refuse(r.file_type, "the only enum ember reads is h5py's bool (FALSE = 0, TRUE = 1), as uint8");
    r.file_type = "bool (h5py's enum)";
    r.dtype = DType::UInt8;
    // Enums convert by member name: a uint8 enum with the same two members gives 0 and 1.
    r.memory_type = Hid(H5Tenum_create(H5T_NATIVE_UINT8), H5Tclose);
    uint8_t f = 0, t = 1;
    if (!r.memory_type.valid() || H5Tenum_insert(r.memory_type.get(), "FALSE", &f) < 0 ||
        H5Tenum_insert(r.memory_type.get(), "TRUE", &t) < 0)
      throw_hdf5("H5Tenum_create (bool)", where);
    return r;
  } else {
    const char* names[] = {"an integer", "a float", "a time type", "a string", "a bitfield", "an opaque type",
                           "a compound type", "a reference", "an enum", "a variable-length type", "an array type"};
    const std::string what = cls >= 0 && cls < static_cast<int>(std::size(names)) ? names[cls] : "an unknown type class";
    refuse(what, "Hdf5Dataset reads numeric datasets (integers, IEEE floats, h5py's bool)");
  }
  r.memory_type = hdf5_memory_type(r.dtype);
  return r;
}

}  // namespace detail
}  // namespace ember::data
