#pragma once
// GGUF, the model file of ggml and llama.cpp (version 3), from bytes alone: the ggml tensor types,
// typed metadata values, the Q8_0 quantizer and the validating parser (the writer is
// io/gguf_writer.hpp). No tensor and no file mapping here (io/gguf.hpp adds them), so the fuzzer
// (tests/fuzz/fuzz_gguf.cpp) can call parse_gguf on arbitrary bytes. The reference is ggml's
// docs/gguf.md with its reader (ggml/src/gguf.cpp) and gguf-py's GGUFReader.
//
// Layout, little-endian throughout:
//   "GGUF"  u32 version (3)  u64 tensor_count  u64 metadata_kv_count
//   metadata: { string key, u32 value_type, value }*      string = u64 length + UTF-8 bytes
//   tensor infos: { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }*
//   zero padding to the alignment (general.alignment, a u32 power of two; 32 when absent)
//   data: each tensor at its offset (relative to the data's start, a multiple of the alignment),
//         followed by zero padding to the alignment
// ne is in ggml's order, the fastest-varying dimension first: a row-major [rows, cols] tensor has
// ne = {cols, rows}. A quantized type stores each row as blocks (Q8_0: 32 values per 34 bytes).
//
// The parser refuses what ggml's reader refuses (names of 64 bytes or more, more than 4 dims,
// nested arrays, duplicate keys or tensor names, an unknown type, a row length that is no multiple
// of the type's block, an unaligned offset) and anything that would read outside the bytes; each
// refusal is an ember::FormatError "gguf file '<name>' at offset <n>: <what>".
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/half.hpp"

namespace ember::io::gguf {

static_assert(std::endian::native == std::endian::little,
              "ember's GGUF reader and writer assume a little-endian host (as GGUF files are by default)");

inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION (general.quantization_version)
inline constexpr size_t kMaxNameBytes = 63;          // ggml's GGML_MAX_NAME is 64 with the terminating NUL
inline constexpr int kMaxGGMLDims = 4;               // GGML_MAX_DIMS
inline constexpr size_t kMaxKeyBytes = 65535;        // the spec's limit on a key
inline constexpr int64_t kQ8_0Block = 32;            // QK8_0
inline constexpr size_t kQ8_0BlockBytes = 34;        // fp16 scale + 32 int8

// ggml's tensor types (ggml.h, gguf-py's GGMLQuantizationType). The writer writes F32, F16 and Q8_0;
// the parser knows every type's block size, so it validates files of any of them.
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9, Q2_K = 10, Q3_K = 11,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19,
  IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41,
};

struct TypeTraits {
  GGMLType type;
  const char* name;
  int64_t block;  // values per block (1 for plain types)
  int64_t bytes;  // bytes per block (gguf-py's GGML_QUANT_SIZES)
};

// nullptr for a number that is no ggml type.
inline const TypeTraits* find_type(uint32_t raw) {
  using T = GGMLType;
  static const TypeTraits kTable[] = {
      {T::F32, "F32", 1, 4},          {T::F16, "F16", 1, 2},           {T::Q4_0, "Q4_0", 32, 18},
      {T::Q4_1, "Q4_1", 32, 20},      {T::Q5_0, "Q5_0", 32, 22},       {T::Q5_1, "Q5_1", 32, 24},
      {T::Q8_0, "Q8_0", 32, 34},      {T::Q8_1, "Q8_1", 32, 40},       {T::Q2_K, "Q2_K", 256, 84},
      {T::Q3_K, "Q3_K", 256, 110},    {T::Q4_K, "Q4_K", 256, 144},     {T::Q5_K, "Q5_K", 256, 176},
      {T::Q6_K, "Q6_K", 256, 210},    {T::Q8_K, "Q8_K", 256, 292},     {T::IQ2_XXS, "IQ2_XXS", 256, 66},
      {T::IQ2_XS, "IQ2_XS", 256, 74}, {T::IQ3_XXS, "IQ3_XXS", 256, 98}, {T::IQ1_S, "IQ1_S", 256, 50},
      {T::IQ4_NL, "IQ4_NL", 32, 18},  {T::IQ3_S, "IQ3_S", 256, 110},   {T::IQ2_S, "IQ2_S", 256, 82},
      {T::IQ4_XS, "IQ4_XS", 256, 136}, {T::I8, "I8", 1, 1},            {T::I16, "I16", 1, 2},
      {T::I32, "I32", 1, 4},          {T::I64, "I64", 1, 8},           {T::F64, "F64", 1, 8},
      {T::IQ1_M, "IQ1_M", 256, 56},   {T::BF16, "BF16", 1, 2},         {T::TQ1_0, "TQ1_0", 256, 54},
      {T::TQ2_0, "TQ2_0", 256, 66},   {T::MXFP4, "MXFP4", 32, 17},     {T::NVFP4, "NVFP4", 64, 36},
      {T::Q1_0, "Q1_0", 128, 18},
  };
  for (const auto& t : kTable)
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  return nullptr;
}
inline const TypeTraits& traits(GGMLType t) {
  const TypeTraits* p = find_type(static_cast<uint32_t>(t));
  EMBER_CHECK(p != nullptr, ValueError, "gguf: ", static_cast<uint32_t>(t), " is no ggml type");
  return *p;
}
inline const char* type_name(GGMLType t) {
  const TypeTraits* p = find_type(static_cast<uint32_t>(t));
  return p ? p->name : "?";
}

// ---------------------------------------------------------------------------------------- values
enum class ValueType : uint32_t {
  UInt8 = 0, Int8 = 1, UInt16 = 2, Int16 = 3, UInt32 = 4, Int32 = 5, Float32 = 6, Bool = 7, String = 8,
  Array = 9, UInt64 = 10, Int64 = 11, Float64 = 12,
};
inline const char* value_type_name(ValueType t) {
  static const char* kNames[] = {"UINT8", "INT8",  "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                 "BOOL",  "STRING", "ARRAY", "UINT64", "INT64",  "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "?";
}
// Bytes of a scalar type; 0 for String, Array and numbers that are no type.
inline size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UInt8: case ValueType::Int8: case ValueType::Bool: return 1;
    case ValueType::UInt16: case ValueType::Int16: return 2;
    case ValueType::UInt32: case ValueType::Int32: case ValueType::Float32: return 4;
    case ValueType::UInt64: case ValueType::Int64: case ValueType::Float64: return 8;
    default: return 0;
  }
}

template <class T> struct ValueTypeOf;
template <> struct ValueTypeOf<uint8_t> { static constexpr ValueType value = ValueType::UInt8; };
template <> struct ValueTypeOf<int8_t> { static constexpr ValueType value = ValueType::Int8; };
template <> struct ValueTypeOf<uint16_t> { static constexpr ValueType value = ValueType::UInt16; };
template <> struct ValueTypeOf<int16_t> { static constexpr ValueType value = ValueType::Int16; };
template <> struct ValueTypeOf<uint32_t> { static constexpr ValueType value = ValueType::UInt32; };
template <> struct ValueTypeOf<int32_t> { static constexpr ValueType value = ValueType::Int32; };
template <> struct ValueTypeOf<float> { static constexpr ValueType value = ValueType::Float32; };
template <> struct ValueTypeOf<bool> { static constexpr ValueType value = ValueType::Bool; };
template <> struct ValueTypeOf<uint64_t> { static constexpr ValueType value = ValueType::UInt64; };
template <> struct ValueTypeOf<int64_t> { static constexpr ValueType value = ValueType::Int64; };
template <> struct ValueTypeOf<double> { static constexpr ValueType value = ValueType::Float64; };
template <class T>
concept Scalar = requires { ValueTypeOf<T>::value; };

// One metadata value: a scalar, a string, or an array of scalars or of strings (GGUF allows nested
// arrays, but ggml's reader refuses them, so ember neither writes nor reads them). Scalars keep
// their bytes as the file has them; get<T>() and array<T>() need T to be the stored type exactly.
class Value {
 public:
  Value() = default;
  template <Scalar T>
  static Value of(T v) {
    Value r;
    r.type_ = ValueTypeOf<T>::value;
    std::memcpy(&r.bits_, &v, sizeof(T));
    return r;
  }
  static Value string(std::string s) {
    Value r;
    r.type_ = ValueType::String;
    r.str_ = std::move(s);
    return r;
  }
  template <Scalar T>
  static Value array(const std::vector<T>& items) {
    Value r;
    r.type_ = ValueType::Array;
    r.elem_ = ValueTypeOf<T>::value;
    r.n_ = items.size();
    r.data_.resize(items.size() * sizeof(T));
    for (size_t i = 0; i < items.size(); ++i) std::memcpy(r.data_.data() + i * sizeof(T), &items[i], sizeof(T));
    return r;
  }
  static Value array(const std::vector<bool>& items) {  // std::vector<bool> holds bits, not bools
    std::vector<uint8_t> b(items.begin(), items.end());
    return raw_array(ValueType::Bool, b.size(), b.data());
  }
  static Value array(std::vector<std::string> items) {
    Value r;
    r.type_ = ValueType::Array;
    r.elem_ = ValueType::String;
    r.n_ = items.size();
    r.strs_ = std::move(items);
    return r;
  }
  // An array of scalars from its bytes in the file (`n` elements of `elem`).
  static Value raw_array(ValueType elem, size_t n, const uint8_t* bytes) {
    Value r;
    r.type_ = ValueType::Array;
    r.elem_ = elem;
    r.n_ = n;
    r.data_.assign(bytes, bytes + n * scalar_size(elem));
    return r;
  }

  ValueType type() const { return type_; }
  ValueType element_type() const { return elem_; }  // arrays only
  size_t size() const { return n_; }                 // elements of an array

  template <Scalar T>
  T get() const {
    EMBER_CHECK(type_ == ValueTypeOf<T>::value, ValueError, "gguf value: holds ", describe_type(), ", not ",
                value_type_name(ValueTypeOf<T>::value));
    T v;
    std::memcpy(&v, &bits_, sizeof(T));
    return v;
  }
  const std::string& str() const {
    EMBER_CHECK(type_ == ValueType::String, ValueError, "gguf value: holds ", describe_type(), ", not STRING");
    return str_;
  }
  template <Scalar T>
  std::vector<T> array() const {
    EMBER_CHECK(type_ == ValueType::Array && elem_ == ValueTypeOf<T>::value, ValueError, "gguf value: holds ",
                describe_type(), ", not ARRAY of ", value_type_name(ValueTypeOf<T>::value));
    if constexpr (std::is_same_v<T, bool>) {
      return std::vector<bool>(data_.begin(), data_.end());
    } else {
      std::vector<T> out(n_);
      if (n_ > 0) std::memcpy(out.data(), data_.data(), n_ * sizeof(T));
      return out;
    }
  }
  const std::vector<std::string>& strings() const {
    EMBER_CHECK(type_ == ValueType::Array && elem_ == ValueType::String, ValueError, "gguf value: holds ",
                describe_type(), ", not ARRAY of STRING");
    return strs_;
  }
  std::string describe_type() const {
    return type_ == ValueType::Array ? std::string("ARRAY of ") + value_type_name(elem_) : value_type_name(type_);
  }

  // The value's bytes as the file stores them (after its u32 type).
  template <class Sink>
  void emit(Sink&& put) const {
    auto put_str = [&](const std::string& s) {
      const uint64_t n = s.size();
      put(&n, 8);
      put(s.data(), s.size());
    };
    if (type_ == ValueType::String) return put_str(str_);
    if (type_ != ValueType::Array) return put(&bits_, scalar_size(type_));
    const auto elem = static_cast<uint32_t>(elem_);
    const uint64_t n = n_;
    put(&elem, 4);
    put(&n, 8);
    if (elem_ == ValueType::String) {
      for (const auto& s : strs_) put_str(s);
    } else {
      put(data_.data(), data_.size());
    }
  }

 private:
  ValueType type_ = ValueType::UInt32, elem_ = ValueType::UInt8;
  uint64_t bits_ = 0;
  std::string str_;
  std::vector<std::string> strs_;
  std::vector<uint8_t> data_;
  size_t n_ = 0;
};

struct KeyValue {
  std::string key;
  Value value;
};
using KeyValues = std::vector<KeyValue>;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;          // ggml order: ne[0] is the row length
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;              // from the start of the data, a multiple of the alignment
  uint64_t nbytes = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
  }
  std::vector<int64_t> shape() const { return {ne.rbegin(), ne.rend()}; }  // row-major, as ember's
};

// ------------------------------------------------------------------------------------------ Q8_0
// ggml's quantize_row_q8_0_ref, which llama.cpp uses for model files (gguf-py's Q8_0 is written to
// match it bit for bit): per block of 32, d = max|x| / 127 in float, q = roundf(x * (1/d)) (ties
// away from zero), the block stores fp16(d) (round to nearest even) then the 32 int8 q. Error per
// value: at most d/2 from the rounding plus 127 |fp16(d) - d| from the stored scale. Where ggml's
// code has undefined behaviour (x * (1/d) is inf or nan: blocks with max|x| below ~4e-37, whose
// fp16 scale is 0 anyway), q is clamped to +-127, or 0 for nan. Non-finite inputs are refused.
// `what` names the values in errors; `first` is the index of x[0] in them (for messages).
inline void quantize_q8_0(const float* x, int64_t n, uint8_t* out, std::string_view what = "gguf::quantize_q8_0",
                          int64_t first = 0) {
  EMBER_CHECK(n % kQ8_0Block == 0, ValueError, what, ": Q8_0 quantizes blocks of 32 values, got ", n);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const float* v = x + b * kQ8_0Block;
    float amax = 0.0f;
    for (int j = 0; j < kQ8_0Block; ++j) {
      EMBER_CHECK(std::isfinite(v[j]), ValueError, what, ": value ", first + b * kQ8_0Block + j, " is ", v[j],
                  ", which Q8_0 cannot store");
      amax = std::max(amax, std::fabs(v[j]));
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = out + static_cast<size_t>(b) * kQ8_0BlockBytes;
    const uint16_t dh = ::ember::detail::float_to_half_bits(d);
    std::memcpy(blk, &dh, 2);
    for (int j = 0; j < kQ8_0Block; ++j) {
      const float q = v[j] * id;
      const float r = std::isnan(q) ? 0.0f : std::round(std::clamp(q, -127.0f, 127.0f));
      blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(r));
    }
  }
}
// ggml's dequantize_row_q8_0: x = fp16(d) * q.
inline void dequantize_q8_0(const uint8_t* in, int64_t n, float* y) {
  EMBER_CHECK(n % kQ8_0Block == 0, ValueError, "gguf::dequantize_q8_0: Q8_0 holds blocks of 32 values, got ", n);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const uint8_t* blk = in + static_cast<size_t>(b) * kQ8_0BlockBytes;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = ::ember::detail::half_bits_to_float(dh);
    for (int j = 0; j < kQ8_0Block; ++j) y[b * kQ8_0Block + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  }
}

inline uint64_t align_up(uint64_t n, uint64_t alignment) { return n + (alignment - n % alignment) % alignment; }

// ---------------------------------------------------------------------------------------- parser
// A parsed, validated file: every tensor's data lies inside it.
struct Contents {
  uint32_t version = kVersion;
  KeyValues metadata;
  std::vector<TensorInfo> tensors;  // in file order
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_start = 0;          // the data section's offset in the file
  uint64_t file_size = 0;

  const Value* find(std::string_view key) const {
    for (const auto& kv : metadata)
      if (kv.key == key) return &kv.value;
    return nullptr;
  }
  const TensorInfo* tensor(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

namespace detail {
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, std::string_view file) : p_(data), size_(size), file_(file) {}
  [[noreturn]] void fail(uint64_t at, const std::string& what) const {
    throw FormatError(::ember::detail::str_cat("gguf file '", file_, "' at offset ", at, ": ", what));
  }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  void need(uint64_t n, const char* what) const {
    if (n > left()) fail(pos_, ::ember::detail::str_cat(what, " needs ", n, " bytes, but the file has ", left(), " left"));
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  const uint8_t* take(uint64_t n, const char* what) {
    need(n, what);
    const uint8_t* q = p_ + pos_;
    pos_ += n;
    return q;
  }
  std::string string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    const uint8_t* q = take(n, what);
    return std::string(reinterpret_cast<const char*>(q), static_cast<size_t>(n));
  }

 private:
  const uint8_t* p_;
  uint64_t size_, pos_ = 0;
  std::string_view file_;
};

inline Value parse_value(Cursor& c, uint32_t raw_type) {
  const uint64_t at = c.pos();
  const auto type = static_cast<ValueType>(raw_type);
  if (type == ValueType::String) return Value::string(c.string("a string value"));
  if (type == ValueType::Array) {
    const uint32_t raw_elem = c.read<uint32_t>("an array's element type");
    const auto elem = static_cast<ValueType>(raw_elem);
    if (elem == ValueType::Array) c.fail(at, "nested arrays are not supported (ggml's reader refuses them too)");
    const uint64_t n = c.read<uint64_t>("an array's length");
    if (elem == ValueType::String) {
      if (n > c.left() / 8) c.fail(at, ::ember::detail::str_cat("an array of ", n, " strings cannot fit in the ", c.left(), " bytes left"));
      std::vector<std::string> items(static_cast<size_t>(n));
      for (auto& s : items) s = c.string("a string in an array");
      return Value::array(std::move(items));
    }
    const size_t es = scalar_size(elem);
    if (es == 0) c.fail(at, ::ember::detail::str_cat("array element type ", raw_elem, " is no GGUF value type"));
    if (n > c.left() / es) c.fail(at, ::ember::detail::str_cat("an array of ", n, " ", value_type_name(elem), " cannot fit in the ", c.left(), " bytes left"));
    const uint8_t* q = c.take(n * es, "an array");
    if (elem == ValueType::Bool)
      for (uint64_t i = 0; i < n; ++i)
        if (q[i] > 1) c.fail(at, ::ember::detail::str_cat("element ", i, " of a BOOL array is ", int(q[i]), ", not 0 or 1"));
    return Value::raw_array(elem, static_cast<size_t>(n), q);
  }
  const size_t size = scalar_size(type);
  if (size == 0) c.fail(at - 4, ::ember::detail::str_cat("value type ", raw_type, " is no GGUF value type"));
  const uint8_t* q = c.take(size, "a value");
  if (type == ValueType::Bool && *q > 1) c.fail(at, ::ember::detail::str_cat("a BOOL is ", int(*q), ", not 0 or 1"));
  Value v;
  switch (type) {  // through the typed factory, so that get<T>() sees the stored type
    case ValueType::UInt8: { uint8_t x; std::memcpy(&x, q, 1); v = Value::of(x); break; }
    case ValueType::Int8: { int8_t x; std::memcpy(&x, q, 1); v = Value::of(x); break; }
    case ValueType::UInt16: { uint16_t x; std::memcpy(&x, q, 2); v = Value::of(x); break; }
    case ValueType::Int16: { int16_t x; std::memcpy(&x, q, 2); v = Value::of(x); break; }
    case ValueType::UInt32: { uint32_t x; std::memcpy(&x, q, 4); v = Value::of(x); break; }
    case ValueType::Int32: { int32_t x; std::memcpy(&x, q, 4); v = Value::of(x); break; }
    case ValueType::Float32: { float x; std::memcpy(&x, q, 4); v = Value::of(x); break; }
    case ValueType::Bool: v = Value::of(*q != 0); break;
    case ValueType::UInt64: { uint64_t x; std::memcpy(&x, q, 8); v = Value::of(x); break; }
    case ValueType::Int64: { int64_t x; std::memcpy(&x, q, 8); v = Value::of(x); break; }
    default: { double x; std::memcpy(&x, q, 8); v = Value::of(x); break; }
  }
  return v;
}
}  // namespace detail

// Parses and validates `size` bytes of a GGUF file; `file` names it in error messages.
inline Contents parse_gguf(const uint8_t* data, uint64_t size, std::string_view file) {
  detail::Cursor c(data, size, file);
  Contents out;
  out.file_size = size;
  const uint8_t* magic = c.take(4, "the magic 'GGUF'");
  if (std::memcmp(magic, "GGUF", 4) != 0) c.fail(0, "not a GGUF file (the first 4 bytes are not 'GGUF')");
  out.version = c.read<uint32_t>("the version");
  if (out.version != 0 && (out.version & 0xffffu) == 0) c.fail(4, "a big-endian GGUF file, which ember does not read");
  if (out.version != 2 && out.version != 3)
    c.fail(4, ::ember::detail::str_cat("version ", out.version, "; ember reads versions 2 and 3 (as gguf-py)"));
  const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t n_kv = c.read<uint64_t>("the metadata count");
  // Each key/value takes at least 13 bytes, each tensor info at least 24: counts beyond what the
  // bytes can hold are refused before anything is reserved for them (the tensors' after the metadata).
  if (n_kv > c.left() / 13) c.fail(16, ::ember::detail::str_cat("a metadata count of ", n_kv, " cannot fit in the file"));
  std::unordered_set<std::string> seen;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.string("a metadata key");
    if (!seen.insert(key).second) c.fail(at, "the key '" + key + "' appears twice");
    const uint32_t type = c.read<uint32_t>("a value type");
    Value v = detail::parse_value(c, type);
    if (key == "general.alignment") {
      if (v.type() != ValueType::UInt32) c.fail(at, "general.alignment is " + v.describe_type() + ", not UINT32");
      const uint32_t a = v.get<uint32_t>();
      if (a == 0 || (a & (a - 1)) != 0) c.fail(at, ::ember::detail::str_cat("general.alignment ", a, " is not a power of two"));
      out.alignment = a;
    }
    out.metadata.push_back({std::move(key), std::move(v)});
  }
  if (n_tensors > c.left() / 24) c.fail(8, ::ember::detail::str_cat("a tensor count of ", n_tensors, " cannot fit in the file"));
  seen.clear();
  std::vector<uint64_t> info_at;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    TensorInfo t;
    t.name = c.string("a tensor name");
    if (t.name.size() > kMaxNameBytes)
      c.fail(at, ::ember::detail::str_cat("tensor name '", t.name.substr(0, 80), "' has ", t.name.size(), " bytes; ggml allows ", kMaxNameBytes));
    if (!seen.insert(t.name).second) c.fail(at, "the tensor name '" + t.name + "' appears twice");
    const uint32_t nd = c.read<uint32_t>("a tensor's dimension count");
    if (nd > static_cast<uint32_t>(kMaxGGMLDims))
      c.fail(at, ::ember::detail::str_cat("tensor '", t.name, "' has ", nd, " dimensions; ggml holds at most ", kMaxGGMLDims));
    uint64_t numel = 1;
    for (uint32_t k = 0; k < nd; ++k) {
      const uint64_t d = c.read<uint64_t>("a tensor dimension");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || __builtin_mul_overflow(numel, d, &numel) ||
          numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        c.fail(at, "tensor '" + t.name + "' has more elements than int64 counts");
      t.ne.push_back(static_cast<int64_t>(d));
    }
    const uint32_t raw_type = c.read<uint32_t>("a tensor's type");
    const TypeTraits* tt = find_type(raw_type);
    if (!tt) c.fail(at, ::ember::detail::str_cat("tensor '", t.name, "' has type ", raw_type, ", which is no ggml type"));
    t.type = tt->type;
    const int64_t row = t.ne.empty() ? 1 : t.ne[0];
    if (row % tt->block != 0)
      c.fail(at, ::ember::detail::str_cat("tensor '", t.name, "' has rows of ", row, " values; ", tt->name, " stores blocks of ", tt->block));
    t.nbytes = numel / static_cast<uint64_t>(tt->block) * static_cast<uint64_t>(tt->bytes);  // < 2^63 / block * 292: no overflow
    t.offset = c.read<uint64_t>("a tensor's offset");
    if (t.offset % out.alignment != 0)
      c.fail(at, ::ember::detail::str_cat("tensor '", t.name, "' has offset ", t.offset, ", not a multiple of the alignment ", out.alignment));
    out.tensors.push_back(std::move(t));
    info_at.push_back(at);
  }
  out.data_start = align_up(c.pos(), out.alignment);
  if (!out.tensors.empty() && out.data_start > size)
    c.fail(c.pos(), ::ember::detail::str_cat("the data section would start at ", out.data_start, ", past the end of the file (", size, " bytes)"));
  const uint64_t data_size = out.data_start <= size ? size - out.data_start : 0;
  std::vector<size_t> order(out.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorInfo& t = out.tensors[i];
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      c.fail(info_at[i], ::ember::detail::str_cat("tensor '", t.name, "' takes bytes ", t.offset, " to ", t.offset + t.nbytes,
                                                   " of the data, which has ", data_size));
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return out.tensors[a].offset < out.tensors[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo &a = out.tensors[order[k - 1]], &b = out.tensors[order[k]];
    if (a.offset + a.nbytes > b.offset)
      c.fail(info_at[order[k]], "the data of tensors '" + a.name + "' and '" + b.name + "' overlap");
  }
  return out;
}

}  // namespace ember::io::gguf
