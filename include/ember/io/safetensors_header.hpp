#pragma once
// The safetensors header (https://github.com/huggingface/safetensors, the format's spec and its
// Rust reader are the reference), parsed and validated from bytes alone: no tensor, no file
// system. io/safetensors.hpp builds on it; the fuzzer (tests/fuzz/fuzz_safetensors.cpp) calls
// parse_safetensors on arbitrary bytes.
//
// Layout: u64 little-endian N; N bytes of UTF-8 JSON, an object, starting with '{' (writers pad
// it with spaces to a multiple of 8); then the data. The object maps each tensor's name to
// {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} (offsets relative to the start
// of the data) and may hold "__metadata__": {string: string}. The data regions, sorted by offset,
// tile the data exactly: no holes, no overlaps, no trailing bytes; each is shape x dtype size.
//
// Every broken rule is an ember::FormatError naming the file, the tensor (where there is one) and
// the rule. A dtype that the format defines but ember cannot hold (I16, I8, BOOL, U16, U32, U64,
// F8_*) parses (so the other tensors of the file stay readable) and is refused when that tensor
// is loaded (DTypeError naming the tensor and the dtype).
//
// The parser (nlohmann-json) is in io/detail/safetensors_header_impl.hpp, compiled once into the
// library under EMBER_COMPILED_LIB (core/macros.hpp), included here when header-only.
#include <bit>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/core/dtype.hpp"
#include "ember/core/error.hpp"
#include "ember/core/macros.hpp"

namespace ember::io {

static_assert(std::endian::native == std::endian::little,
              "ember's safetensors reader and writer assume a little-endian host (as the format's data is)");

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // 100 MB, the Rust reader's limit

// The format's dtypes. `ember` is set for those ember holds.
struct SafetensorsDType {
  const char* name;
  size_t size;
  std::optional<DType> ember;
};

// The format's dtype of that name; nullptr for a name the format does not define.
EMBER_LIB_INLINE const SafetensorsDType* find_safetensors_dtype(std::string_view name);

constexpr const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::Float64: return "F64";
    case DType::Float32: return "F32";
    case DType::Float16: return "F16";
    case DType::BFloat16: return "BF16";
    case DType::Int64: return "I64";
    case DType::Int32: return "I32";
    case DType::UInt8: return "U8";
  }
  return "?";
}

// One tensor's entry, validated.
struct TensorEntry {
  std::string name;
  std::string dtype_name;        // as in the file ("F32")
  std::optional<DType> dtype;    // nullopt: a format dtype ember cannot hold
  size_t element_size = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // relative to the start of the data
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in data order (sorted by begin), which is header order for
                                     // files that ember and the Python package write
  std::map<std::string, std::string> metadata;
  uint64_t header_size = 0;          // N
  uint64_t data_start = 0;           // 8 + N
  uint64_t data_size = 0;            // file size - 8 - N

  const TensorEntry* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

// The header size N from the first 8 bytes, checked against the file size and the 100 MB limit.
EMBER_LIB_INLINE uint64_t safetensors_header_size(const uint8_t* first8, uint64_t file_size, std::string_view file);

// Parses and validates the header. `prefix` holds at least the first 8 + N bytes of the file;
// file_size is the whole file's size (the data's extent is checked against it).
EMBER_LIB_INLINE SafetensorsHeader parse_safetensors_header(const uint8_t* prefix, uint64_t prefix_size,
                                                            uint64_t file_size, std::string_view file);

// A whole file in memory.
EMBER_LIB_INLINE SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size,
                                                     std::string_view name = "<buffer>");

}  // namespace ember::io

#if !defined(EMBER_COMPILED_LIB)
#include "ember/io/detail/safetensors_header_impl.hpp"
#endif
