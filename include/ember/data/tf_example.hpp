#pragma once
// tf.train.Example, read and written by a small protobuf codec of ember's own (no protobuf
// library): the records of a TFRecord dataset (data/tfrecord.hpp) are serialized Examples.
//
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }      (entries: key = 1, value = 2)
//   Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1; }  Int64List { repeated int64 value = 1; }
//
// Parsing follows protobuf's rules: packed and unpacked repeated values are both accepted, unknown
// fields are skipped, a message field that appears twice is merged, a later oneof member replaces
// an earlier one, and a later map entry replaces an earlier one with the same key. Every length is
// checked against the bytes that are there: malformed input is a FormatError naming the source,
// the byte offset in the record and the rule broken, never a read out of bounds.
//
// Features become Example fields (data/dataset.hpp). Without a spec:
//   float_list -> float32 [n]      int64_list -> int64 [n]      a Feature with no list set -> float32 [0]
//   bytes_list with one value -> uint8 [length]; with k values of one length L -> uint8 [k, L];
//   with no value -> uint8 [0]; with values of different lengths -> FormatError (give it a spec).
// A TfFeatureSpec {dtype, shape} per feature reshapes and converts: "label" {Int64, {}} is an int64
// scalar; "image" {UInt8, {28, 28}} is the bytes as a 28x28 image. A bytes feature's values are
// concatenated and reinterpreted as the dtype's elements (little-endian, row-major); a float or
// int64 feature's values are converted to the dtype (integers range-checked). The element count
// must match the shape (one dimension may be -1: inferred). A feature the spec names that the
// record lacks is a FormatError.
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/half.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"

namespace ember::data {

// One feature's values as the record holds them.
struct TfFeature {
  enum class Kind : uint8_t { None, Bytes, Float, Int64 };
  Kind kind = Kind::None;
  std::vector<std::string> bytes;
  std::vector<float> floats;
  std::vector<int64_t> ints;

  static TfFeature of_bytes(std::vector<std::string> v) {
    TfFeature f;
    f.kind = Kind::Bytes;
    f.bytes = std::move(v);
    return f;
  }
  static TfFeature of_floats(std::vector<float> v) {
    TfFeature f;
    f.kind = Kind::Float;
    f.floats = std::move(v);
    return f;
  }
  static TfFeature of_ints(std::vector<int64_t> v) {
    TfFeature f;
    f.kind = Kind::Int64;
    f.ints = std::move(v);
    return f;
  }
  size_t count() const { return kind == Kind::Bytes ? bytes.size() : kind == Kind::Float ? floats.size() : ints.size(); }
};

inline const char* tf_kind_name(TfFeature::Kind k) {
  switch (k) {
    case TfFeature::Kind::Bytes: return "bytes_list";
    case TfFeature::Kind::Float: return "float_list";
    case TfFeature::Kind::Int64: return "int64_list";
    case TfFeature::Kind::None: break;
  }
  return "no list";
}

// Features by name, in the order the record first names them.
using TfFeatures = std::vector<std::pair<std::string, TfFeature>>;

// How one feature becomes a tensor: its dtype and shape (one dimension may be -1; {} is a scalar).
struct TfFeatureSpec {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
};
using TfSpec = std::map<std::string, TfFeatureSpec>;

namespace detail {

// Reads protobuf wire format from [p, p + n); offsets in messages count from the record's start
// (base is the offset of p in the record).
class ProtoReader {
 public:
  ProtoReader(const uint8_t* p, size_t n, size_t base, const std::string& source)
      : p_(p), n_(n), base_(base), source_(source) {}
  bool done() const { return pos_ >= n_; }
  size_t offset() const { return base_ + pos_; }

  [[noreturn]] void fail(const std::string& rule, size_t at) const {
    throw FormatError(::ember::detail::str_cat("tf.Example: ", source_, ": at byte ", at, " of the record: ", rule));
  }

  uint64_t varint(const char* what) {
    const size_t start = offset();
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= n_) fail(::ember::detail::str_cat("truncated varint (", what, ")"), start);
      const uint8_t b = p_[pos_++];
      v |= static_cast<uint64_t>(b & 0x7F) << (shift < 64 ? shift : 63);
      if (!(b & 0x80)) return v;
    }
    fail(::ember::detail::str_cat("varint longer than 10 bytes (", what, ")"), start);
  }
  // A field's tag: (field number, wire type). Wire types 3 and 4 (groups) and 6, 7 are not protobuf 3.
  std::pair<uint64_t, int> tag() {
    const size_t at = offset();
    const uint64_t t = varint("a field tag");
    const int wire = static_cast<int>(t & 7);
    const uint64_t field = t >> 3;
    if (field == 0) fail("field number 0", at);
    if (wire != 0 && wire != 1 && wire != 2 && wire != 5)
      fail(::ember::detail::str_cat("bad protobuf wire type ", wire, " (field ", field, ")"), at);
    return {field, wire};
  }
  // A length-delimited field's bytes, as a reader of its own.
  ProtoReader sub(const char* what) {
    const size_t at = offset();
    const uint64_t len = varint(what);
    if (len > n_ - pos_)
      fail(::ember::detail::str_cat("length ", len, " of ", what, " runs past the end (", n_ - pos_, " bytes left)"), at);
    ProtoReader r(p_ + pos_, static_cast<size_t>(len), offset(), source_);
    pos_ += static_cast<size_t>(len);
    return r;
  }
  const uint8_t* fixed(size_t bytes, const char* what) {
    if (bytes > n_ - pos_) fail(::ember::detail::str_cat("truncated ", what), offset());
    const uint8_t* at = p_ + pos_;
    pos_ += bytes;
    return at;
  }
  void skip(int wire) {
    if (wire == 0) varint("an unknown field");
    else if (wire == 1) fixed(8, "fixed64 field");
    else if (wire == 5) fixed(4, "fixed32 field");
    else sub("an unknown field");
  }
  void expect_wire(int wire, int want, const char* field, size_t at) const {
    if (wire != want)
      fail(::ember::detail::str_cat("bad protobuf wire type ", wire, " for ", field, " (expected ", want, ")"), at);
  }
  // The next occurrence of length-delimited field `number` (other fields skipped), or nothing at the end.
  std::optional<ProtoReader> next_message(uint64_t number, const char* name) {
    while (!done()) {
      const size_t at = offset();
      const auto [field, wire] = tag();
      if (field != number) {
        skip(wire);
        continue;
      }
      expect_wire(wire, 2, name, at);
      return sub(name);
    }
    return std::nullopt;
  }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_, pos_ = 0, base_;
  const std::string& source_;
};

inline void parse_tf_list(ProtoReader r, TfFeature& f) {
  while (!r.done()) {
    const size_t at = r.offset();
    const auto [field, wire] = r.tag();
    if (field != 1) {
      r.skip(wire);
      continue;
    }
    if (f.kind == TfFeature::Kind::Bytes) {
      r.expect_wire(wire, 2, "BytesList.value", at);
      ProtoReader v = r.sub("a bytes value");
      f.bytes.emplace_back(reinterpret_cast<const char*>(v.data()), v.size());
    } else if (f.kind == TfFeature::Kind::Float) {
      if (wire == 5) {
        float x;
        std::memcpy(&x, r.fixed(4, "float value"), 4);
        f.floats.push_back(x);
      } else {
        r.expect_wire(wire, 2, "FloatList.value (packed or fixed32)", at);
        ProtoReader v = r.sub("a packed float list");
        if (v.size() % 4 != 0) r.fail(::ember::detail::str_cat("packed float list of ", v.size(), " bytes (not a multiple of 4)"), at);
        const size_t old = f.floats.size();
        f.floats.resize(old + v.size() / 4);
        if (v.size()) std::memcpy(f.floats.data() + old, v.data(), v.size());
      }
    } else {
      if (wire == 0) {
        f.ints.push_back(static_cast<int64_t>(r.varint("an int64 value")));
      } else {
        r.expect_wire(wire, 2, "Int64List.value (packed or varint)", at);
        ProtoReader v = r.sub("a packed int64 list");
        while (!v.done()) f.ints.push_back(static_cast<int64_t>(v.varint("a packed int64 value")));
      }
    }
  }
}

inline void parse_tf_feature(ProtoReader r, TfFeature& f) {
  while (!r.done()) {
    const size_t at = r.offset();
    const auto [field, wire] = r.tag();
    if (field < 1 || field > 3) {
      r.skip(wire);
      continue;
    }
    r.expect_wire(wire, 2, "a Feature list", at);
    const auto kind = static_cast<TfFeature::Kind>(field);  // 1 bytes, 2 float, 3 int64
    if (f.kind != kind) f = TfFeature{kind, {}, {}, {}};    // a later oneof member replaces
    parse_tf_list(r.sub("a Feature list"), f);
  }
}

inline void parse_tf_features(ProtoReader r, TfFeatures& out, std::unordered_map<std::string, size_t>& where) {
  while (auto e = r.next_message(1, "Features.feature")) {
    ProtoReader& entry = *e;
    std::string key;
    TfFeature value;
    while (!entry.done()) {
      const size_t eat = entry.offset();
      const auto [ef, ew] = entry.tag();
      if (ef == 1) {
        entry.expect_wire(ew, 2, "a feature name", eat);
        ProtoReader k = entry.sub("a feature name");
        key.assign(reinterpret_cast<const char*>(k.data()), k.size());
      } else if (ef == 2) {
        entry.expect_wire(ew, 2, "a Feature", eat);
        parse_tf_feature(entry.sub("a Feature"), value);
      } else {
        entry.skip(ew);
      }
    }
    auto it = where.find(key);
    if (it == where.end()) {
      where.emplace(key, out.size());
      out.emplace_back(std::move(key), std::move(value));
    } else {
      out[it->second].second = std::move(value);  // a later entry with the same key replaces
    }
  }
}

template <class To, class From>
void convert_values(const std::vector<From>& in, To* out, const std::string& what) {
  for (size_t i = 0; i < in.size(); ++i) {
    if constexpr (std::is_integral_v<To> && std::is_integral_v<From>) {
      EMBER_CHECK(in[i] >= static_cast<From>(std::numeric_limits<To>::min()) &&
                      in[i] <= static_cast<From>(std::numeric_limits<To>::max()),
                  FormatError, what, ": value ", in[i], " at position ", i, " is out of range of the spec's dtype");
      out[i] = static_cast<To>(in[i]);
    } else if constexpr (std::is_integral_v<To>) {
      static_assert(sizeof(To) == 0, "float values convert to floating dtypes only");
    } else if constexpr (std::is_same_v<To, double>) {
      out[i] = static_cast<double>(in[i]);
    } else {
      out[i] = To(static_cast<float>(in[i]));
    }
  }
}

// The spec's shape with its -1 filled in for `count` elements, or a FormatError.
inline Shape resolve_spec_shape(const std::vector<int64_t>& spec, int64_t count, const std::string& what) {
  std::string text = "[";
  for (size_t d = 0; d < spec.size(); ++d) text += (d ? ", " : "") + std::to_string(spec[d]);
  text += "]";
  int64_t known = 1;
  int infer = -1;
  EMBER_CHECK(spec.size() <= static_cast<size_t>(kMaxDims), ValueError, what, ": spec shape ", text, " has more than ",
              kMaxDims, " dimensions");
  for (size_t d = 0; d < spec.size(); ++d) {
    EMBER_CHECK(spec[d] >= -1 && !(spec[d] == -1 && infer >= 0) && (spec[d] <= 0 || known <= (int64_t{1} << 48) / spec[d]),
                ValueError, what, ": spec shape ", text, " (dimensions are >= 0, at most one -1)");
    if (spec[d] == -1) infer = static_cast<int>(d);
    else known *= spec[d];
  }
  std::vector<int64_t> dims = spec;
  if (infer >= 0) {
    EMBER_CHECK(known > 0 && count % known == 0, FormatError, what, ": ", count, " elements do not fill spec shape ",
                text);
    dims[static_cast<size_t>(infer)] = count / known;
  } else {
    EMBER_CHECK(known == count, FormatError, what, ": ", count, " elements, but spec shape ", text, " holds ", known);
  }
  return Shape(dims);
}

inline AnyTensor tf_feature_to_tensor(const TfFeature& f, const TfFeatureSpec* spec, const std::string& what) {
  using K = TfFeature::Kind;
  if (f.kind == K::Bytes) {
    size_t total = 0;
    for (const auto& b : f.bytes) total += b.size();
    Shape shape;
    DType dt = DType::UInt8;
    if (spec) {
      dt = spec->dtype;
      const size_t es = dtype_size(dt);
      EMBER_CHECK(total % es == 0, FormatError, what, ": ", total, " bytes are not a whole number of ",
                  dtype_name(dt), " elements");
      shape = resolve_spec_shape(spec->shape, static_cast<int64_t>(total / es), what);
    } else if (f.bytes.size() == 1) {
      shape = Shape{static_cast<int64_t>(total)};
    } else if (f.bytes.empty()) {
      shape = Shape{0};
    } else {
      for (const auto& b : f.bytes)
        EMBER_CHECK(b.size() == f.bytes[0].size(), FormatError, what, ": ", f.bytes.size(),
                    " bytes values of different lengths (", f.bytes[0].size(), " and ", b.size(),
                    ") make no one tensor; give the feature a TfFeatureSpec to concatenate them");
      shape = Shape{static_cast<int64_t>(f.bytes.size()), static_cast<int64_t>(f.bytes[0].size())};
    }
    AnyTensor t = AnyTensor::empty(shape, dt);
    auto* out = static_cast<uint8_t*>(t.data_ptr());
    for (const auto& b : f.bytes) {
      if (!b.empty()) std::memcpy(out, b.data(), b.size());
      out += b.size();
    }
    return t;
  }
  const int64_t count = static_cast<int64_t>(f.count());
  if (!spec) {
    AnyTensor t = AnyTensor::empty(Shape{count}, f.kind == K::Int64 ? DType::Int64 : DType::Float32);
    if (count && f.kind == K::Int64) std::memcpy(t.data_ptr(), f.ints.data(), f.ints.size() * 8);
    if (count && f.kind == K::Float) std::memcpy(t.data_ptr(), f.floats.data(), f.floats.size() * 4);
    return t;
  }
  AnyTensor t = AnyTensor::empty(resolve_spec_shape(spec->shape, count, what), spec->dtype);
  void* p = t.data_ptr();
  const DType dt = spec->dtype;
  const bool floating = dt == DType::Float32 || dt == DType::Float64 || dt == DType::Float16 || dt == DType::BFloat16;
  EMBER_CHECK(f.kind != K::Float || floating, FormatError, what, ": a float_list cannot become ", dtype_name(dt),
              " (the spec asks an integer dtype)");
  auto fill = [&](const auto& values) {
    switch (dt) {
      case DType::Float32: convert_values(values, static_cast<float*>(p), what); break;
      case DType::Float64: convert_values(values, static_cast<double*>(p), what); break;
      case DType::Float16: convert_values(values, static_cast<half*>(p), what); break;
      case DType::BFloat16: convert_values(values, static_cast<bfloat16*>(p), what); break;
      case DType::Int32:
        if constexpr (std::is_integral_v<typename std::decay_t<decltype(values)>::value_type>)
          convert_values(values, static_cast<int32_t*>(p), what);
        break;
      case DType::Int64:
        if constexpr (std::is_integral_v<typename std::decay_t<decltype(values)>::value_type>)
          convert_values(values, static_cast<int64_t*>(p), what);
        break;
      case DType::UInt8:
        if constexpr (std::is_integral_v<typename std::decay_t<decltype(values)>::value_type>)
          convert_values(values, static_cast<uint8_t*>(p), what);
        break;
    }
  };
  if (f.kind == K::Float) fill(f.floats);
  else fill(f.ints);  // an empty Feature (no list) has no values: the spec's shape must hold 0
  return t;
}

}  // namespace detail

// The features of one serialized tf.train.Example. `source` names the record in messages.
inline TfFeatures parse_tf_example(const uint8_t* data, size_t size, const std::string& source) {
  TfFeatures out;
  std::unordered_map<std::string, size_t> where;
  detail::ProtoReader r(data, size, 0, source);
  while (auto features = r.next_message(1, "Example.features"))
    detail::parse_tf_features(*features, out, where);  // a repeated message field is merged
  return out;
}

// Features as Example fields (the mapping above), in the record's order.
inline Example tf_features_to_example(const TfFeatures& features, const TfSpec& spec, const std::string& source) {
  Example ex;
  for (const auto& [name, s] : spec) {
    bool found = false;
    for (const auto& f : features) found = found || f.first == name;
    if (!found) {
      std::string have;
      for (const auto& f : features) have += (have.empty() ? "" : ", ") + f.first;
      throw FormatError(::ember::detail::str_cat("tf.Example: ", source, ": feature '", name,
                                                 "' named in the spec is missing (the record has: ",
                                                 have.empty() ? std::string("none") : have, ")"));
    }
  }
  for (const auto& [name, f] : features) {
    auto it = spec.find(name);
    ex.set(name, detail::tf_feature_to_tensor(f, it == spec.end() ? nullptr : &it->second,
                                              ::ember::detail::str_cat("tf.Example: ", source, ": feature '", name, "'")));
  }
  return ex;
}

inline Example decode_tf_example(const uint8_t* data, size_t size, const std::string& source, const TfSpec& spec = {}) {
  return tf_features_to_example(parse_tf_example(data, size, source), spec, source);
}

namespace detail {
inline void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}
inline void put_len_field(std::vector<uint8_t>& out, int field, const std::vector<uint8_t>& body) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, body.size());
  out.insert(out.end(), body.begin(), body.end());
}
inline std::vector<uint8_t> encode_tf_feature(const TfFeature& f) {
  std::vector<uint8_t> list, packed;
  if (f.kind == TfFeature::Kind::Bytes) {
    for (const auto& b : f.bytes) put_len_field(list, 1, std::vector<uint8_t>(b.begin(), b.end()));
  } else if (f.kind == TfFeature::Kind::Float) {
    packed.resize(f.floats.size() * 4);
    if (!packed.empty()) std::memcpy(packed.data(), f.floats.data(), packed.size());
  } else if (f.kind == TfFeature::Kind::Int64) {
    for (int64_t v : f.ints) put_varint(packed, static_cast<uint64_t>(v));
  }
  if (!packed.empty()) put_len_field(list, 1, packed);  // packed, as proto3 writes repeated scalars
  std::vector<uint8_t> feature;
  if (f.kind != TfFeature::Kind::None) put_len_field(feature, static_cast<int>(f.kind), list);
  return feature;
}
}  // namespace detail

// A serialized tf.train.Example holding these features (repeated numbers packed).
inline std::vector<uint8_t> encode_tf_example(const TfFeatures& features) {
  std::vector<uint8_t> map;
  for (const auto& [name, f] : features) {
    std::vector<uint8_t> entry;
    detail::put_len_field(entry, 1, std::vector<uint8_t>(name.begin(), name.end()));
    detail::put_len_field(entry, 2, detail::encode_tf_feature(f));
    detail::put_len_field(map, 1, entry);
  }
  std::vector<uint8_t> out;
  detail::put_len_field(out, 1, map);
  return out;
}

// An Example's fields as features: float32, float64, float16 and bfloat16 -> float_list (as float32);
// int32 and int64 -> int64_list; uint8 -> bytes_list with one value (the elements' bytes). Shapes
// are not stored (TFRecord has no place for them): a reader gives a TfFeatureSpec to get them back.
inline TfFeatures example_to_tf_features(const Example& ex) {
  TfFeatures out;
  for (const auto& [name, t] : ex.fields()) {
    EMBER_CHECK(t.defined() && t.device().is_cpu(), ValueError, "encode_tf_example: field '", name,
                "' must be a defined host tensor");
    const size_t n = static_cast<size_t>(t.numel());
    const void* p = n ? t.data_ptr() : nullptr;
    const auto as = [&](auto to, auto from) {  // the n elements at p, as `to`'s type
      using From = decltype(from);
      const auto* q = static_cast<const From*>(p);
      return std::vector<decltype(to)>(q, q + n);
    };
    TfFeature f;
    switch (t.dtype()) {
      case DType::UInt8: f = TfFeature::of_bytes({std::string(static_cast<const char*>(p), n)}); break;
      case DType::Int64: f = TfFeature::of_ints(as(int64_t{}, int64_t{})); break;
      case DType::Int32: f = TfFeature::of_ints(as(int64_t{}, int32_t{})); break;
      case DType::Float32: f = TfFeature::of_floats(as(float{}, float{})); break;
      case DType::Float64: f = TfFeature::of_floats(as(float{}, double{})); break;
      case DType::Float16: f = TfFeature::of_floats(as(float{}, half{})); break;
      case DType::BFloat16: f = TfFeature::of_floats(as(float{}, bfloat16{})); break;
    }
    out.emplace_back(name, std::move(f));
  }
  return out;
}

inline std::vector<uint8_t> encode_tf_example(const Example& ex) { return encode_tf_example(example_to_tf_features(ex)); }

}  // namespace ember::data
