#pragma once
// The safetensors header parser (io/safetensors_header.hpp declares it): nlohmann-json, compiled
// once into the library under EMBER_COMPILED_LIB, included by the header otherwise.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ember/io/safetensors_header.hpp"

namespace ember::io {

EMBER_LIB_INLINE const SafetensorsDType* find_safetensors_dtype(std::string_view name) {
  static const SafetensorsDType kTable[] = {
      {"F64", 8, DType::Float64}, {"F32", 4, DType::Float32},  {"F16", 2, DType::Float16},
      {"BF16", 2, DType::BFloat16}, {"I64", 8, DType::Int64},  {"I32", 4, DType::Int32},
      {"U8", 1, DType::UInt8},    {"I16", 2, std::nullopt},    {"I8", 1, std::nullopt},
      {"BOOL", 1, std::nullopt},  {"U16", 2, std::nullopt},    {"U32", 4, std::nullopt},
      {"U64", 8, std::nullopt},   {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
  };
  for (const auto& d : kTable)
    if (name == d.name) return &d;
  return nullptr;
}

namespace detail {
[[noreturn]] inline void format_fail(std::string_view file, const std::string& what) {
  throw FormatError(::ember::detail::str_cat("safetensors file '", file, "': ", what));
}

inline uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// An integer JSON value >= 0 (nlohmann parses "3.0" as a float and "-1" as a signed integer).
inline bool json_to_u64(const nlohmann::json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

inline TensorEntry parse_entry(std::string_view file, const std::string& name, const nlohmann::json& v) {
  auto fail = [&](const std::string& rule) { format_fail(file, ::ember::detail::str_cat("tensor '", name, "': ", rule)); };
  if (!v.is_object()) fail(::ember::detail::str_cat("entry must be an object, got a JSON ", v.type_name()));
  for (const auto& [k, x] : v.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail(::ember::detail::str_cat("unexpected field '", k, "' (allowed: dtype, shape, data_offsets)"));
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!v.contains(k)) fail(::ember::detail::str_cat("missing field '", k, "'"));

  TensorEntry e;
  e.name = name;
  const auto& jd = v["dtype"];
  if (!jd.is_string()) fail(::ember::detail::str_cat("field 'dtype' must be a string, got a JSON ", jd.type_name()));
  e.dtype_name = jd.get<std::string>();
  const SafetensorsDType* d = find_safetensors_dtype(e.dtype_name);
  if (!d) fail(::ember::detail::str_cat("unknown dtype '", e.dtype_name, "'"));
  e.dtype = d->ember;
  e.element_size = d->size;

  const auto& js = v["shape"];
  if (!js.is_array()) fail(::ember::detail::str_cat("field 'shape' must be an array, got a JSON ", js.type_name()));
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < js.size(); ++i) {
    uint64_t dim;
    if (!json_to_u64(js[i], dim) || dim > static_cast<uint64_t>(INT64_MAX))
      fail(::ember::detail::str_cat("shape dimension ", i, " must be a non-negative integer, got ", js[i].dump()));
    e.shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(e.element_size), &nbytes) ||
      numel > static_cast<uint64_t>(INT64_MAX))
    fail("element count overflows 64 bits (shape x dtype size)");
  // A dimension of 0 makes an empty tensor even when another dimension is huge: overflow of the
  // other dimensions' product alone is still refused above (the Rust reader does the same).

  const auto& jo = v["data_offsets"];
  if (!jo.is_array() || jo.size() != 2)
    fail(::ember::detail::str_cat("field 'data_offsets' must be an array [begin, end], got ", jo.dump()));
  if (!json_to_u64(jo[0], e.begin) || !json_to_u64(jo[1], e.end))
    fail(::ember::detail::str_cat("data_offsets must be non-negative integers, got ", jo.dump()));
  if (e.end < e.begin) fail(::ember::detail::str_cat("data_offsets end ", e.end, " is before begin ", e.begin));
  if (e.end - e.begin != nbytes)
    fail(::ember::detail::str_cat("data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                                  " bytes but shape x dtype size is ", nbytes, " (", e.dtype_name, ")"));
  return e;
}
}  // namespace detail

EMBER_LIB_INLINE uint64_t safetensors_header_size(const uint8_t* first8, uint64_t file_size, std::string_view file) {
  if (file_size < 8)
    detail::format_fail(file, ::ember::detail::str_cat("file is ", file_size, " bytes, shorter than the 8-byte header size"));
  const uint64_t n = detail::read_u64_le(first8);
  if (n > kMaxSafetensorsHeader)
    detail::format_fail(file, ::ember::detail::str_cat("header size ", n, " is beyond the 100 MB limit"));
  if (n > file_size - 8)
    detail::format_fail(file, ::ember::detail::str_cat("header size ", n, " is beyond the end of the file (",
                                                       file_size, " bytes)"));
  return n;
}

EMBER_LIB_INLINE SafetensorsHeader parse_safetensors_header(const uint8_t* prefix, uint64_t prefix_size,
                                                            uint64_t file_size, std::string_view file) {
  if (prefix_size < 8 || file_size < 8)
    detail::format_fail(file, ::ember::detail::str_cat("file is ", file_size, " bytes, shorter than the 8-byte header size"));
  SafetensorsHeader h;
  h.header_size = safetensors_header_size(prefix, file_size, file);
  h.data_start = 8 + h.header_size;
  h.data_size = file_size - h.data_start;
  EMBER_CHECK(prefix_size >= h.data_start, ValueError, "parse_safetensors_header: '", file, "': ", prefix_size,
              " bytes given, the header needs ", h.data_start);
  const char* json_begin = reinterpret_cast<const char*>(prefix + 8);
  const char* json_end = json_begin + h.header_size;
  if (h.header_size == 0 || *json_begin != '{')
    detail::format_fail(file, "header does not start with '{' (not a safetensors file?)");

  // nlohmann's default object (std::map) keeps the last of duplicate keys: the callback sees each
  // top-level key as it is parsed and remembers a duplicate.
  std::unordered_set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_begin, json_end, on_event, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    detail::format_fail(file, ::ember::detail::str_cat("header is not valid UTF-8 JSON: ", e.what()));
  }
  if (!j.is_object())
    detail::format_fail(file, ::ember::detail::str_cat("header must be a JSON object, got a JSON ", j.type_name()));
  if (!duplicate.empty())
    detail::format_fail(file, ::ember::detail::str_cat("duplicate tensor name '", duplicate, "'"));

  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        detail::format_fail(file, ::ember::detail::str_cat("__metadata__ must be an object, got a JSON ", it->type_name()));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          detail::format_fail(file, ::ember::detail::str_cat("__metadata__ value of '", m.key(),
                                                             "' must be a string, got a JSON ", m->type_name()));
        h.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    h.tensors.push_back(detail::parse_entry(file, it.key(), *it));
  }

  // Sorted by offset (ties: an empty tensor before a non-empty one at the same place), the regions
  // must tile [0, data_size).
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.end > h.data_size)
      detail::format_fail(file, ::ember::detail::str_cat("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end,
                                                         "] are out of range (the data has ", h.data_size, " bytes)"));
    if (t.begin < pos)
      detail::format_fail(file, ::ember::detail::str_cat("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end,
                                                         "] overlap tensor '", prev->name, "' (ends at ", pos, ")"));
    if (t.begin > pos)
      detail::format_fail(file, ::ember::detail::str_cat("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end,
                                                         "] leave a hole of ", t.begin - pos, " bytes at ", pos));
    pos = t.end;
    prev = &t;
  }
  if (pos != h.data_size)
    detail::format_fail(file, ::ember::detail::str_cat(h.data_size - pos, " trailing bytes after the last tensor's data (at ",
                                                       pos, " of ", h.data_size, ")"));
  return h;
}

EMBER_LIB_INLINE SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size, std::string_view name) {
  if (size < 8)
    detail::format_fail(name, ::ember::detail::str_cat("file is ", size, " bytes, shorter than the 8-byte header size"));
  safetensors_header_size(data, size, name);
  return parse_safetensors_header(data, size, size, name);
}

}  // namespace ember::io
