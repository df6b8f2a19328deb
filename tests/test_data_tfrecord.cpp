// TFRecord datasets (data/tfrecord.hpp, data/tf_example.hpp): the framing and both CRCs, the
// tf.train.Example codec, the per-feature spec, sharded patterns, gzip files, the index cache,
// concurrent reads, and the error for each kind of malformed input. The reference is the PyPI
// `tfrecord` package (tests/interop/make_tfrecord_fixtures.py makes the fixtures into a temporary
// folder at test time and prints what the package decodes); without Python or the package, the
// cases that need it print SKIPPED.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ember/data/tfrecord.hpp"
#include "ember/io/crc32c.hpp"
#include "python_check.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::data;
using ember::testing::TempDir;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// The message of the FormatError a call throws; anything else (another error, none) fails the test.
template <class F>
std::string format_error_of(F&& f) {
  try {
    f();
  } catch (const FormatError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a FormatError, got: " << e.what());
  }
  FAIL("expected a FormatError, got no exception");
  return "";
}

std::vector<uint8_t> read_all(const fs::path& p) { return read_file_bytes(p.string()); }
void write_all(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Runs the fixture script; nullopt (after printing SKIPPED) where Python or the package is missing.
std::optional<std::string> run_script(const std::vector<std::string>& args) {
  const auto r = testing::run_python_check("make_tfrecord_fixtures.py", args);
  if (!r) return std::nullopt;
  INFO(r->out);
  REQUIRE(WIFEXITED(r->status));
  REQUIRE(WEXITSTATUS(r->status) == 0);
  return r->out;
}

bool make_fixtures(const TempDir& dir) { return run_script({"make", dir.path.string()}).has_value(); }

// What the reference decodes: per record, per feature, its kind and the value tokens.
struct RefFeature {
  std::string kind;
  std::vector<std::string> values;
};
using RefRecord = std::map<std::string, RefFeature>;

std::optional<std::vector<RefRecord>> reference_dump(const std::string& file) {
  auto out = run_script({"dump", file});
  if (!out) return std::nullopt;
  std::vector<RefRecord> recs;
  std::istringstream in(*out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    if (tag == "R") {
      recs.emplace_back();
    } else if (tag == "F") {
      REQUIRE(!recs.empty());
      std::string name;
      RefFeature f;
      size_t n = 0;
      ls >> name >> f.kind >> n;
      for (size_t i = 0; i < n; ++i) {
        std::string v;
        ls >> v;  // an empty bytes value leaves v empty
        f.values.push_back(v);
      }
      recs.back()[name] = f;
    } else {
      FAIL("unexpected line from the reference: " << line);
    }
  }
  return recs;
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

// ember's example (no spec) holds exactly what the reference decoded.
void check_same(const Example& ex, const RefRecord& ref, const std::string& where) {
  INFO(where);
  REQUIRE(ex.size() == ref.size());
  for (const auto& [name, f] : ref) {
    INFO("feature " << name);
    REQUIRE(ex.has(name));
    const AnyTensor& t = ex[name];
    if (f.kind == "bytes") {
      REQUIRE(t.dtype() == DType::UInt8);
      const auto bytes = testing::to_vec<uint8_t>(t);
      if (f.values.size() == 1) {
        CHECK(t.shape() == Shape{static_cast<int64_t>(bytes.size())});
        CHECK(hex(bytes.data(), bytes.size()) == f.values[0]);
      } else {
        REQUIRE(t.dim() == 2);
        REQUIRE(t.size(0) == static_cast<int64_t>(f.values.size()));
        for (size_t k = 0; k < f.values.size(); ++k)
          CHECK(hex(bytes.data() + k * t.size(1), static_cast<size_t>(t.size(1))) == f.values[k]);
      }
    } else if (f.kind == "float") {
      REQUIRE(t.dtype() == DType::Float32);
      REQUIRE(t.shape() == Shape{static_cast<int64_t>(f.values.size())});
      const auto v = testing::to_vec<float>(t);
      for (size_t k = 0; k < v.size(); ++k) CHECK(v[k] == static_cast<float>(std::strtod(f.values[k].c_str(), nullptr)));
    } else {
      REQUIRE(f.kind == "int64");
      REQUIRE(t.dtype() == DType::Int64);
      REQUIRE(t.shape() == Shape{static_cast<int64_t>(f.values.size())});
      const auto v = testing::to_vec<int64_t>(t);
      for (size_t k = 0; k < v.size(); ++k) CHECK(v[k] == std::stoll(f.values[k]));
    }
  }
}

// Examples of every feature kind, written by ember.
TfFeatures features_of(int i) {
  std::vector<std::string> image = {std::string(6, '\0')};
  for (int k = 0; k < 6; ++k) image[0][static_cast<size_t>(k)] = static_cast<char>(i * 5 + k);
  return {{"image", TfFeature::of_bytes(image)},
          {"label", TfFeature::of_ints({i % 3})},
          {"ids", TfFeature::of_ints({i, -i, int64_t{1} << 50})},
          {"scores", TfFeature::of_floats({0.25f * static_cast<float>(i), -3.5f})},
          {"pair", TfFeature::of_bytes({"x" + std::to_string(i % 10), "y" + std::to_string(i % 10)})}};
}

void write_file(const std::string& path, int n, bool gzip = false, int first = 0) {
  TfRecordWriter w(path, gzip);
  for (int i = 0; i < n; ++i) w.write(features_of(first + i));
  w.finish();
}

}  // namespace

TEST_CASE("tfrecord: the fixtures decode as the tfrecord package decodes them (plain, gzip, packed, unpacked)",
          "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  if (!make_fixtures(dir)) return;
  for (const char* name : {"plain.tfrecord", "plain.tfrecord.gz"}) {
    auto ref = reference_dump(dir / name);
    if (!ref) return;
    TfRecordDataset ds(dir / name);
    REQUIRE(ds.size() == 5);
    REQUIRE(ref->size() == 5);
    CHECK(ds.files()[0].gzip == (std::string(name).find(".gz") != std::string::npos));
    for (int64_t i = 0; i < ds.size(); ++i) check_same(ds.get(i), (*ref)[static_cast<size_t>(i)], name);
  }
}

TEST_CASE("tfrecord: a sharded pattern reads its files in name order, as the tfrecord package reads each",
          "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  if (!make_fixtures(dir)) return;
  TfRecordDataset ds(dir / "shard-?????" "-of-00003");  // split: "??-" would read as a trigraph
  REQUIRE(ds.files().size() == 3);
  REQUIRE(ds.size() == 6);
  int64_t i = 0;
  for (int k = 0; k < 3; ++k) {
    const std::string file = dir / ("shard-0000" + std::to_string(k) + "-of-00003");
    CHECK(ds.files()[static_cast<size_t>(k)].path == file);
    auto ref = reference_dump(file);
    if (!ref) return;
    for (const auto& r : *ref) check_same(ds.get(i++), r, file);
  }
  CHECK(i == 6);
  // The shards hold examples 0..5: the labels say the order.
  for (int64_t j = 0; j < 6; ++j) CHECK(ds.get(j).get<int64_t>("label").to_vector()[0] == j % 10);
  // A list of files and patterns concatenates in the order given; no match is an IOError.
  TfRecordDataset two({dir / "shard-00002-of-00003", dir / "shard-0000[01]-of-00003"});
  REQUIRE(two.size() == 6);
  CHECK(two.get(0).get<int64_t>("label").to_vector()[0] == 5);
  CHECK(two.get(1).get<int64_t>("label").to_vector()[0] == 0);
  CHECK(TfRecordDataset({dir / "shard-00001-of-00003"}, TfRecordOptions{}).size() == 3);  // a braced list of one
  CHECK_THROWS_AS(TfRecordDataset(dir / "nothing-*"), IOError);
}

TEST_CASE("tfrecord: files ember writes read back identically in the tfrecord package (plain and gzip)",
          "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  for (bool gzip : {false, true}) {
    const std::string path = dir / (gzip ? "ember.tfrecord.gz" : "ember.tfrecord");
    write_file(path, 7, gzip);
    const auto bytes = read_all(path);
    CHECK(is_gzip(bytes.data(), bytes.size()) == gzip);
    TfRecordDataset ds(path);
    REQUIRE(ds.size() == 7);
    auto ref = reference_dump(path);
    if (!ref) return;
    REQUIRE(ref->size() == 7);
    for (int64_t i = 0; i < 7; ++i) {
      check_same(ds.get(i), (*ref)[static_cast<size_t>(i)], path);
      // What was written: the reference's values are the features given.
      const TfFeatures f = features_of(static_cast<int>(i));
      const RefRecord& r = (*ref)[static_cast<size_t>(i)];
      CHECK(r.at("image").values[0] == hex(reinterpret_cast<const uint8_t*>(f[0].second.bytes[0].data()), 6));
      CHECK(std::stoll(r.at("ids").values[2]) == (int64_t{1} << 50));
      CHECK(std::stoll(r.at("ids").values[1]) == -i);
      CHECK(static_cast<float>(std::strtod(r.at("scores").values[0].c_str(), nullptr)) == 0.25f * static_cast<float>(i));
      CHECK(r.at("pair").values == std::vector<std::string>{hex(reinterpret_cast<const uint8_t*>(f[4].second.bytes[0].data()), 2),
                                                            hex(reinterpret_cast<const uint8_t*>(f[4].second.bytes[1].data()), 2)});
    }
  }
}

TEST_CASE("tfrecord: a spec gives image uint8 [2, 3], label int64 [], and converts numbers", "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  const std::string path = dir / "spec.tfrecord";
  write_file(path, 4);
  TfRecordOptions opt;
  opt.spec = {{"image", {DType::UInt8, {2, 3}}},
              {"label", {DType::Int64, {}}},
              {"ids", {DType::Float64, {-1}}},
              {"scores", {DType::Float32, {2, 1}}},
              {"pair", {DType::UInt8, {-1}}}};
  TfRecordDataset ds(path, opt);
  const Example e = ds.get(3);
  CHECK(e["image"].shape() == Shape{2, 3});
  CHECK(testing::to_vec<uint8_t>(e["image"]) == std::vector<uint8_t>{15, 16, 17, 18, 19, 20});
  CHECK(e["label"].dim() == 0);
  CHECK(e["label"].dtype() == DType::Int64);
  CHECK(testing::to_vec<int64_t>(e["label"])[0] == 0);
  CHECK(e["ids"].dtype() == DType::Float64);
  CHECK(testing::to_vec<double>(e["ids"]) == std::vector<double>{3, -3, 1125899906842624.0});
  CHECK(e["scores"].shape() == Shape{2, 1});
  CHECK(testing::to_vec<uint8_t>(e["pair"]) == std::vector<uint8_t>{'x', '3', 'y', '3'});
  // Each rule the spec adds, broken.
  TfRecordOptions bad;
  bad.spec = {{"image", {DType::Int32, {-1}}}};
  CHECK_THAT(format_error_of([&] { TfRecordDataset(path, bad).get(0); }),
             Contains("feature 'image'") && Contains("6 bytes are not a whole number of int32 elements"));
  bad.spec = {{"ids", {DType::Int64, {2}}}};
  CHECK_THAT(format_error_of([&] { TfRecordDataset(path, bad).get(0); }),
             Contains("feature 'ids'") && Contains("3 elements, but spec shape [2] holds 2"));
  bad.spec = {{"ids", {DType::UInt8, {3}}}};
  CHECK_THAT(format_error_of([&] { TfRecordDataset(path, bad).get(1); }),
             Contains("value -1 at position 1 is out of range"));
  bad.spec = {{"scores", {DType::Int64, {2}}}};
  CHECK_THAT(format_error_of([&] { TfRecordDataset(path, bad).get(0); }), Contains("a float_list cannot become int64"));
  bad.spec = {{"missing", {DType::Int64, {}}}};
  CHECK_THAT(format_error_of([&] { TfRecordDataset(path, bad).get(0); }),
             Contains("feature 'missing' named in the spec is missing") && Contains("image, label, ids, scores, pair"));
}

TEST_CASE("tfrecord: each malformed record is a FormatError naming the file, the byte offset and the rule",
          "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  if (!make_fixtures(dir)) return;
  std::map<std::string, std::vector<long>> meta;
  std::ifstream m(dir / "meta.txt");
  for (std::string name; m >> name;) {
    long v;
    while (m.peek() == ' ' && m >> v) meta[name].push_back(v);
  }
  REQUIRE(meta.size() == 4);
  const auto at = [&](const std::string& name) { return "record at byte " + std::to_string(meta[name][0]); };
  // A bad length CRC is found while indexing (the dataset does not open).
  std::string msg = format_error_of([&] { TfRecordDataset(dir / "bad_length_crc.tfrecord"); });
  CHECK_THAT(msg, Contains(dir / "bad_length_crc.tfrecord") && Contains(at("bad_length_crc.tfrecord")) &&
                      Contains("length CRC mismatch"));
  // A bad data CRC is found when that record is read; the others read.
  TfRecordDataset ds(dir / "bad_data_crc.tfrecord");
  REQUIRE(ds.size() == 3);
  CHECK(ds.get(1).has("image"));
  msg = format_error_of([&] { ds.get(2); });
  CHECK_THAT(msg, Contains(dir / "bad_data_crc.tfrecord") && Contains(at("bad_data_crc.tfrecord")) &&
                      Contains("data CRC mismatch"));
  msg = format_error_of([&] { TfRecordDataset(dir / "truncated.tfrecord"); });
  const auto& t = meta["truncated.tfrecord"];
  CHECK_THAT(msg, Contains(dir / "truncated.tfrecord") && Contains(at("truncated.tfrecord")) &&
                      Contains("truncated record: " + std::to_string(t[1]) + " bytes of " + std::to_string(t[2])));
  TfRecordDataset wire(dir / "bad_wire_type.tfrecord");
  msg = format_error_of([&] { wire.get(1); });
  CHECK_THAT(msg, Contains(dir / "bad_wire_type.tfrecord") && Contains("record 1 (at byte " + std::to_string(meta["bad_wire_type.tfrecord"][0])) &&
                      Contains("at byte 0 of the record: bad protobuf wire type 3 (field 1)"));
  // A header cut short, and a gzip file cut short.
  auto bytes = read_all(dir / "plain.tfrecord");
  bytes.resize(bytes.size() - 186 + 5);
  write_all(dir.path / "short_header.tfrecord", bytes);
  CHECK_THAT(format_error_of([&] { TfRecordDataset(dir / "short_header.tfrecord"); }),
             Contains("record at byte " + std::to_string(bytes.size() - 5)) &&
                 Contains("truncated record: 5 bytes of 12 (the header)"));
  bytes = read_all(dir / "plain.tfrecord.gz");
  bytes.resize(bytes.size() / 2);
  write_all(dir.path / "cut.tfrecord.gz", bytes);
  CHECK_THAT(format_error_of([&] { TfRecordDataset(dir / "cut.tfrecord.gz"); }), Contains("gzip: '") && Contains("truncated"));
}

TEST_CASE("tfrecord: the Example codec reads packed and unpacked lists, merges, skips unknown fields, and "
          "rejects malformed protobuf", "[tfrecord]") {
  // Example{features{feature{"a": int64_list{1, 300 unpacked}}, feature{"a": float_list{...}}}} etc.,
  // written out by hand.
  const std::vector<uint8_t> unpacked_ints = {0x0a, 0x0f,                                      // Example.features
                                              0x0a, 0x0d,                                      // map entry
                                              0x0a, 0x01, 'a',                                 // key "a"
                                              0x12, 0x08, 0x1a, 0x06, 0x08, 0x01, 0x08, 0xac, 0x02, 0x28};
  // The last byte (0x28: field 5, varint, no value) is a truncated unknown field inside the Int64List.
  CHECK_THAT(format_error_of([&] { parse_tf_example(unpacked_ints.data(), unpacked_ints.size(), "hand"); }),
             Contains("tf.Example: hand: at byte 17 of the record: truncated varint (an unknown field)"));
  std::vector<uint8_t> ok = unpacked_ints;
  ok.back() = 0x08;  // field 1 varint
  ok.push_back(0x7f);
  ok[1] = 0x10, ok[3] = 0x0e, ok[8] = 0x09, ok[10] = 0x07;
  auto f = parse_tf_example(ok.data(), ok.size(), "hand");
  REQUIRE(f.size() == 1);
  CHECK(f[0].first == "a");
  CHECK(f[0].second.kind == TfFeature::Kind::Int64);
  CHECK(f[0].second.ints == std::vector<int64_t>{1, 300, 127});
  // Encoded by ember (packed), merged with a second Features message that replaces "a" by a
  // float_list and adds "b"; an unknown field 9 of Example is skipped.
  const auto first = encode_tf_example(TfFeatures{{"a", TfFeature::of_ints({5})}});
  auto second = encode_tf_example(TfFeatures{{"a", TfFeature::of_floats({1.5f, -2.f})}, {"b", TfFeature::of_bytes({"xyz"})}});
  std::vector<uint8_t> both = first;
  both.insert(both.end(), {0x4a, 0x02, 0x00, 0x00});  // field 9, length 2
  both.insert(both.end(), second.begin(), second.end());
  const Example ex = decode_tf_example(both.data(), both.size(), "merged");
  REQUIRE(ex.size() == 2);
  CHECK(testing::to_vec<float>(ex["a"]) == std::vector<float>{1.5f, -2.f});
  CHECK(testing::to_vec<uint8_t>(ex["b"]) == std::vector<uint8_t>{'x', 'y', 'z'});
  // Bytes values of different lengths make no tensor without a spec.
  const auto uneven = encode_tf_example(TfFeatures{{"s", TfFeature::of_bytes({"ab", "cde"})}});
  CHECK_THAT(format_error_of([&] { decode_tf_example(uneven.data(), uneven.size(), "uneven"); }),
             Contains("feature 's': 2 bytes values of different lengths (2 and 3)"));
  const Example joined = decode_tf_example(uneven.data(), uneven.size(), "uneven", {{"s", {DType::UInt8, {5}}}});
  CHECK(testing::to_vec<uint8_t>(joined["s"]) == std::vector<uint8_t>{'a', 'b', 'c', 'd', 'e'});
  // Malformed: a length past the end, a packed float list of 5 bytes, a wrong wire type, 11-byte varint.
  std::vector<uint8_t> bad = {0x0a, 0x05, 0x01};
  CHECK_THAT(format_error_of([&] { parse_tf_example(bad.data(), bad.size(), "b"); }),
             Contains("at byte 1 of the record: length 5 of Example.features runs past the end (1 bytes left)"));
  bad = {0x0a, 0x0b, 0x0a, 0x09, 0x12, 0x07, 0x12, 0x05, 0x0a, 0x03, 0x00, 0x00, 0x00};
  CHECK_THAT(format_error_of([&] { parse_tf_example(bad.data(), bad.size(), "b"); }),
             Contains("at byte 8 of the record: packed float list of 3 bytes (not a multiple of 4)"));
  bad = {0x08, 0x01};
  CHECK_THAT(format_error_of([&] { parse_tf_example(bad.data(), bad.size(), "b"); }),
             Contains("bad protobuf wire type 0 for Example.features (expected 2)"));
  bad = {0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  CHECK_THAT(format_error_of([&] { parse_tf_example(bad.data(), bad.size(), "b"); }),
             Contains("at byte 1 of the record: varint longer than 10 bytes"));
}

TEST_CASE("tfrecord: encode_tf_example stores an Example of each dtype, read back with a spec", "[tfrecord]") {
  Example ex;
  ex.set("u8", Tensor<uint8_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}));
  ex.set("i32", Tensor<int32_t>::from_vector({-7, 8}, {2}));
  ex.set("i64", Tensor<int64_t>::from_vector({int64_t{1} << 40}, {1}));
  ex.set("f64", Tensor<double>::from_vector({0.5, -0.25}, {2}));
  ex.set("f32", Tensor<float>::from_vector({1.f, 2.f, 3.f, 4.f}, {2, 2}));
  const auto bytes = encode_tf_example(ex);
  const TfSpec spec = {{"u8", {DType::UInt8, {2, 3}}},
                       {"i32", {DType::Int32, {2}}},
                       {"f64", {DType::Float64, {2}}},
                       {"f32", {DType::Float32, {2, 2}}}};
  const Example back = decode_tf_example(bytes.data(), bytes.size(), "round trip", spec);
  REQUIRE(back.size() == 5);
  CHECK(back["u8"].shape() == Shape{2, 3});
  CHECK(testing::to_vec<uint8_t>(back["u8"]) == std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  CHECK(testing::to_vec<int32_t>(back["i32"]) == std::vector<int32_t>{-7, 8});
  CHECK(testing::to_vec<int64_t>(back["i64"]) == std::vector<int64_t>{int64_t{1} << 40});
  CHECK(testing::to_vec<double>(back["f64"]) == std::vector<double>{0.5, -0.25});
  CHECK(back["f32"].shape() == Shape{2, 2});
  CHECK(testing::to_vec<float>(back["f32"]) == std::vector<float>{1.f, 2.f, 3.f, 4.f});
}

TEST_CASE("tfrecord: four threads read the same dataset at once and see what one thread sees", "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  write_file(dir / "a.tfrecord", 150);
  write_file(dir / "b.tfrecord.gz", 150, true, 150);
  TfRecordDataset ds({dir / "a.tfrecord", dir / "b.tfrecord.gz"});
  REQUIRE(ds.size() == 300);
  // An example's fields, names, dtypes, shapes and bytes, as one string.
  const auto fingerprint = [](const Example& e) {
    std::string s;
    for (const auto& [name, t] : e.fields()) {
      s += name + dtype_name(t.dtype()) + t.shape().str();
      s.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
    return s;
  };
  std::vector<std::string> expected;
  for (int64_t i = 0; i < ds.size(); ++i) expected.push_back(fingerprint(ds.get(i)));
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int rep = 0; rep < 3; ++rep)
          for (int64_t k = 0; k < ds.size(); ++k) {
            const int64_t i = (k * 7 + t * 31) % ds.size();
            const Example e = ds.get(i);
            const auto ids = testing::to_vec<int64_t>(e["ids"]);
            if (ids[0] != i || fingerprint(e) != expected[static_cast<size_t>(i)]) ++mismatches;
          }
      } catch (...) {
        ++errors;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == 0);
  CHECK(errors == 0);
}

TEST_CASE("tfrecord: the index cache is written beside the file, reused, rebuilt when the file changes, and kept "
          "in memory when it cannot be written", "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  const std::string path = dir / "c.tfrecord";
  const std::string cache = path + ".ember-index";
  write_file(path, 5);
  {
    TfRecordDataset ds(path);
    CHECK(ds.files()[0].index == TfIndexSource::BuiltAndCached);
    CHECK(fs::exists(cache));
  }
  TfRecordDataset again(path);
  CHECK(again.files()[0].index == TfIndexSource::Cache);
  CHECK(again.size() == 5);
  CHECK(again.get(4).get<int64_t>("ids").to_vector()[0] == 4);
  // A pattern never matches the cache itself.
  CHECK(TfRecordDataset(dir / "c.*").files().size() == 1);
  // Rewritten with more records (size changes): rebuilt.
  write_file(path, 8, false, 1);
  TfRecordDataset grown(path);
  CHECK(grown.files()[0].index == TfIndexSource::BuiltAndCached);
  CHECK(grown.size() == 8);
  // Same size, other records, another mtime: rebuilt (the offsets happen to agree; the mtime decides).
  const auto size8 = fs::file_size(path);
  write_file(path, 8, false, 11);
  REQUIRE(fs::file_size(path) == size8);
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(5));
  TfRecordDataset touched(path);
  CHECK(touched.files()[0].index == TfIndexSource::BuiltAndCached);
  CHECK(touched.get(0).get<int64_t>("ids").to_vector()[0] == 11);
  // A damaged cache is ignored and replaced.
  auto bytes = read_all(cache);
  bytes[45] ^= 0x40;
  write_all(cache, bytes);
  CHECK(TfRecordDataset(path).files()[0].index == TfIndexSource::BuiltAndCached);
  CHECK(TfRecordDataset(path).files()[0].index == TfIndexSource::Cache);
  // The cache cannot be written (a folder stands in its way, as a read-only folder would refuse it;
  // the tests may run as root, whom permissions do not stop): the index stays in memory.
  const std::string other = dir / "d.tfrecord";
  write_file(other, 3);
  fs::create_directory(other + ".ember-index");
  TfRecordDataset mem(other);
  CHECK(mem.files()[0].index == TfIndexSource::BuiltInMemory);
  CHECK(mem.size() == 3);
  CHECK(fs::is_directory(other + ".ember-index"));
  // Caching off: nothing written; gzip files: never cached.
  const std::string off = dir / "e.tfrecord";
  write_file(off, 2);
  TfRecordOptions no_cache;
  no_cache.cache_index = false;
  CHECK(TfRecordDataset(off, no_cache).files()[0].index == TfIndexSource::BuiltInMemory);
  CHECK(!fs::exists(off + ".ember-index"));
  write_file(dir / "g.tfrecord.gz", 2, true);
  CHECK(TfRecordDataset(dir / "g.tfrecord.gz").files()[0].index == TfIndexSource::BuiltInMemory);
  CHECK(!fs::exists(dir / "g.tfrecord.gz.ember-index"));
}

TEST_CASE("tfrecord: the writer replaces its file only on finish(), and frames records as TFRecord does",
          "[tfrecord]") {
  TempDir dir("ember-tfrecord");
  const std::string path = dir / "w.tfrecord";
  write_file(path, 2);
  const auto before = read_all(path);
  {
    TfRecordWriter w(path);
    w.write(features_of(9));
    CHECK(w.count() == 1);
  }  // no finish(): the old file stays, no temporary file is left
  CHECK(read_all(path) == before);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) entries += e.is_regular_file();
  CHECK(entries == 1);
  // The framing, byte by byte: length, masked CRC of the length, data, masked CRC of the data.
  {
    TfRecordWriter w(path);
    w.write(std::vector<uint8_t>{'h', 'i'});
    w.finish();
    CHECK_THROWS_AS(w.write(std::vector<uint8_t>{1}), IOError);
  }
  const auto b = read_all(path);
  REQUIRE(b.size() == 18);
  CHECK(data::detail::le64(b.data()) == 2);
  CHECK(data::detail::le32(b.data() + 8) == io::mask_crc32c(io::crc32c(b.data(), 8)));
  CHECK(data::detail::le32(b.data() + 14) == io::mask_crc32c(io::crc32c("hi", 2)));
  CHECK(index_tfrecord(b.data(), b.size(), "w", true) == std::vector<uint64_t>{0});
}
