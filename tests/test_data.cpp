// Datasets and readers (include/ember/data/): Example, TensorDataset, IDX (plain and gzip, and
// the real Fashion-MNIST files), CSV (scikit-learn's CSVs as real fixtures), memory-mapped .npy.
// Every malformed input: the exception type and a message naming the file and the rule.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "ember/data/csv.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/idx.hpp"
#include "ember/data/npy.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::data;
using ember::testing::message_of;
using Catch::Matchers::Contains;

namespace {

std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("ember_test_data_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::string write_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = (temp_dir() / name).string();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}
std::string write_text(const std::string& name, const std::string& text) {
  return write_file(name, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& in) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// An IDX file: magic, dims (big-endian), payload.
std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    b.push_back(static_cast<uint8_t>(d >> 24));
    b.push_back(static_cast<uint8_t>(d >> 16));
    b.push_back(static_cast<uint8_t>(d >> 8));
    b.push_back(static_cast<uint8_t>(d));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

const char* kSklearn = "/usr/lib/python3/dist-packages/sklearn/datasets/data";

}  // namespace

// ------------------------------------------------------------------ Example / TensorDataset

TEST_CASE("Example: fields by name, replace, missing field names the fields", "[data]") {
  Example e{{"x", Tensor<float>::from_vector({1, 2}, {2})}, {"y", Tensor<int64_t>::scalar(3)}};
  CHECK(e.size() == 2);
  CHECK(e.get<int64_t>("y").item() == 3);
  e.set("y", Tensor<int64_t>::scalar(4));
  CHECK(e.size() == 2);
  CHECK(e.get<int64_t>("y").item() == 4);
  CHECK(e.fields()[0].first == "x");
  CHECK_THROWS_AS(e["z"], ValueError);
  CHECK_THAT(message_of([&] { (void)e["z"]; }), Contains("no field 'z'") && Contains("x, y"));
}

TEST_CASE("TensorDataset: examples are rows of every field", "[data]") {
  auto x = Tensor<float>::from_vector({0, 1, 2, 3, 4, 5}, {3, 2});
  auto y = Tensor<int64_t>::from_vector({7, 8, 9}, {3});
  TensorDataset ds({{"x", x}, {"y", y}});
  REQUIRE(ds.size() == 3);
  Example e = ds.get(2);
  CHECK(e.get<float>("x").to_vector() == std::vector<float>{4, 5});
  CHECK(e.get<int64_t>("y").item() == 9);
  CHECK_THROWS_AS(ds.get(3), IndexError);
  CHECK_THROWS_AS(ds.get(-1), IndexError);
  CHECK_THAT(message_of([&] { ds.get(3); }), Contains("index 3 out of range [0, 3)"));
  CHECK_THROWS_AS(TensorDataset({{"x", x}, {"y", Tensor<int64_t>::from_vector({1, 2}, {2})}}), ShapeError);
  CHECK_THAT(message_of([&] { TensorDataset({{"x", x}, {"y", Tensor<int64_t>::from_vector({1, 2}, {2})}}); }),
             Contains("field 'y' has 2 rows but field 'x' has 3"));
  CHECK_THROWS_AS(TensorDataset({{"s", Tensor<float>::scalar(1)}}), ShapeError);
  CHECK_THROWS_AS(TensorDataset({}), ValueError);
}

// ------------------------------------------------------------------ IDX

TEST_CASE("IDX: uint8, int16, int32, float32, float64 payloads decode big-endian", "[data][idx]") {
  auto bu8 = idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 250});
  auto u8 = parse_idx(bu8.data(), bu8.size(), "u8");
  CHECK(u8.dtype() == DType::UInt8);
  CHECK(u8.shape() == Shape{2, 3});
  CHECK(Tensor<uint8_t>(u8).to_vector() == std::vector<uint8_t>{1, 2, 3, 4, 5, 250});

  auto b16 = idx_bytes(0x0B, {2}, {0xFF, 0xFE, 0x01, 0x00});
  auto i16 = parse_idx(b16.data(), b16.size(), "i16");
  CHECK(i16.dtype() == DType::Int32);
  CHECK(Tensor<int32_t>(i16).to_vector() == std::vector<int32_t>{-2, 256});

  auto b8 = idx_bytes(0x09, {2}, {0xFF, 0x05});
  CHECK(Tensor<int32_t>(parse_idx(b8.data(), b8.size(), "i8")).to_vector() == std::vector<int32_t>{-1, 5});

  auto b32 = idx_bytes(0x0C, {1}, {0x00, 0x01, 0x00, 0x02});
  CHECK(Tensor<int32_t>(parse_idx(b32.data(), b32.size(), "i32")).item() == 65538);

  auto bf = idx_bytes(0x0D, {1}, {0x3F, 0xC0, 0x00, 0x00});  // 1.5f
  CHECK(Tensor<float>(parse_idx(bf.data(), bf.size(), "f32")).item() == 1.5f);

  auto bd = idx_bytes(0x0E, {1}, {0xC0, 0x04, 0, 0, 0, 0, 0, 0});  // -2.5
  CHECK(Tensor<double>(parse_idx(bd.data(), bd.size(), "f64")).item() == -2.5);
}

TEST_CASE("IDX: plain and gzip files give the same tensor, and IdxDataset pairs images with labels", "[data][idx]") {
  std::vector<uint8_t> pix(3 * 2 * 2);
  std::iota(pix.begin(), pix.end(), 0);
  auto images = idx_bytes(0x08, {3, 2, 2}, pix);
  auto labels = idx_bytes(0x08, {3}, {4, 0, 9});
  const std::string ip = write_file("img.idx", images), lp = write_file("lab.idx", labels);
  const std::string ipz = write_file("img.idx.gz", gzip_bytes(images)), lpz = write_file("lab.idx.gz", gzip_bytes(labels));
  CHECK(Tensor<uint8_t>(read_idx(ip)).to_vector() == Tensor<uint8_t>(read_idx(ipz)).to_vector());

  IdxDataset ds(ipz, lpz);
  REQUIRE(ds.size() == 3);
  Example e = ds.get(1);
  CHECK(e["image"].shape() == Shape{2, 2});
  CHECK(e.get<uint8_t>("image").to_vector() == std::vector<uint8_t>{4, 5, 6, 7});
  CHECK(e["label"].dtype() == DType::Int64);
  CHECK(e.get<int64_t>("label").item() == 0);
  CHECK(ds.get(2).get<int64_t>("label").item() == 9);

  auto short_labels = write_file("lab2.idx", idx_bytes(0x08, {2}, {1, 2}));
  CHECK_THROWS_AS(IdxDataset(ip, short_labels), FormatError);
  CHECK_THAT(message_of([&] { IdxDataset(ip, short_labels); }),
             Contains("sizes disagree") && Contains("has 3 records") && Contains("lab2.idx") && Contains("has 2"));
}

TEST_CASE("IDX: malformed files are FormatErrors naming the file and the rule", "[data][idx]") {
  auto bad = [](std::vector<uint8_t> b) { return message_of([&] { parse_idx(b.data(), b.size(), "bad.idx"); }); };
  auto throws_format = [](std::vector<uint8_t> b) {
    CHECK_THROWS_AS(parse_idx(b.data(), b.size(), "bad.idx"), FormatError);
  };
  throws_format({0, 0});
  CHECK_THAT(bad({0, 0}), Contains("'bad.idx'") && Contains("truncated"));
  throws_format({1, 0, 8, 1, 0, 0, 0, 0});
  CHECK_THAT(bad({1, 0, 8, 1, 0, 0, 0, 0}), Contains("wrong magic"));
  CHECK_THAT(bad({0, 0, 0x07, 1, 0, 0, 0, 0}), Contains("unknown element type byte 0x7"));
  CHECK_THAT(bad({0, 0, 0x08, 0}), Contains("0 dimensions"));
  CHECK_THAT(bad({0, 0, 0x08, 3, 0, 0, 0, 1}), Contains("truncated header"));
  auto truncated = idx_bytes(0x08, {2, 2}, {1, 2, 3});
  throws_format(truncated);
  CHECK_THAT(bad(truncated), Contains("sizes disagree") && Contains("[2, 2]") && Contains("truncated"));
  CHECK_THAT(bad(idx_bytes(0x08, {1}, {1, 2})), Contains("trailing bytes"));
  CHECK_THAT(bad(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF}, {})), Contains("more than"));

  // gzip: corrupt and truncated streams, and an unreadable file.
  auto gz = gzip_bytes(idx_bytes(0x08, {64}, std::vector<uint8_t>(64, 7)));
  auto cut = gz;
  cut.resize(gz.size() / 2);
  const std::string cut_path = write_file("cut.idx.gz", cut);
  CHECK_THROWS_AS(read_idx(cut_path), FormatError);
  CHECK_THAT(message_of([&] { read_idx(cut_path); }), Contains("gzip") && Contains("cut.idx.gz") && Contains("truncated"));
  auto corrupt = gz;
  for (size_t i = 10; i < corrupt.size() - 8; ++i) corrupt[i] ^= 0x5A;
  const std::string corrupt_path = write_file("corrupt.idx.gz", corrupt);
  CHECK_THROWS_AS(read_idx(corrupt_path), FormatError);
  CHECK_THAT(message_of([&] { read_idx(corrupt_path); }), Contains("corrupt.idx.gz"));
  auto garbage = gz;
  garbage.push_back('x');
  CHECK_THAT(message_of([&] { read_idx(write_file("garbage.idx.gz", garbage)); }), Contains("garbage after gzip member"));
  CHECK_THROWS_AS(read_idx((temp_dir() / "missing.idx").string()), IOError);
  CHECK_THAT(message_of([&] { read_idx((temp_dir() / "missing.idx").string()); }),
             Contains("missing.idx") && Contains("No such file"));
  // A small file that claims a huge output is refused by the limit.
  std::vector<uint8_t> zeros(1 << 20, 0);
  auto bomb = gzip_bytes(zeros);
  CHECK_THROWS_AS(gunzip(bomb.data(), bomb.size(), "bomb", 1000), FormatError);
  CHECK(gunzip(bomb.data(), bomb.size(), "bomb").size() == zeros.size());
}

TEST_CASE("IDX: Fashion-MNIST from /usr/share/datasets (or EMBER_FASHION_MNIST_DIR)", "[data][idx][fashion]") {
  const std::string dir = fashion_mnist_dir();
  if (!std::filesystem::exists(dir + "/t10k-labels-idx1-ubyte.gz")) {
    std::cout << "SKIPPED: Fashion-MNIST not found in " << dir << " (install dataset-fashion-mnist)" << std::endl;
    return;
  }
  IdxDataset test = fashion_mnist("test", dir);
  REQUIRE(test.size() == 10000);
  CHECK(test.images().shape() == Shape{10000, 28, 28});
  // First labels and the first image's pixel sum, from the published files.
  std::vector<int64_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(test.get(i).get<int64_t>("label").item());
  CHECK(first == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  auto px = test.get(0).get<uint8_t>("image").to_vector();
  CHECK(std::accumulate(px.begin(), px.end(), int64_t{0}) == 33456);
  CHECK_THROWS_AS(fashion_mnist("valid", dir), ValueError);
}

// ------------------------------------------------------------------ CSV

TEST_CASE("CSV: header, label column by name, quoted names, spaces, CRLF, blank lines", "[data][csv]") {
  const std::string text = "\"a\", b ,label,c\r\n1,2,0,3.5\r\n\r\n-4, +5e1 ,1,6\r\n";
  CsvDataset ds(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "mem.csv", {.label_column = "label"});
  REQUIRE(ds.size() == 2);
  CHECK(ds.feature_names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(ds.get(0).get<float>("features").to_vector() == std::vector<float>{1, 2, 3.5f});
  CHECK(ds.get(1).get<float>("features").to_vector() == std::vector<float>{-4, 50, 6});
  CHECK(ds.get(1).get<int64_t>("label").item() == 1);
  CsvDataset f(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "mem.csv",
               {.label_column = "c", .integer_labels = false});
  CHECK(f.get(0).get<float>("label").item() == 3.5f);
}

TEST_CASE("CSV: scikit-learn's digits.csv.gz (gzip, no header) and wine_data.csv (a counts row)", "[data][csv]") {
  const std::string digits = std::string(kSklearn) + "/digits.csv.gz";
  const std::string wine = std::string(kSklearn) + "/wine_data.csv";
  if (!std::filesystem::exists(digits) || !std::filesystem::exists(wine)) {
    std::cout << "SKIPPED: python3-sklearn's CSVs not found in " << kSklearn << std::endl;
    return;
  }
  CsvDataset d(digits, {.header = false});
  REQUIRE(d.size() == 1797);
  CHECK(d.features().shape() == Shape{1797, 64});
  auto first = d.get(0).get<float>("features").to_vector();
  CHECK(std::vector<float>(first.begin(), first.begin() + 5) == std::vector<float>{0, 0, 5, 13, 9});
  CHECK(d.get(0).get<int64_t>("label").item() == 0);
  CHECK(d.get(1).get<int64_t>("label").item() == 1);
  // Labels cover 0..9.
  auto labels = Tensor<int64_t>(d.labels()).to_vector();
  CHECK(*std::min_element(labels.begin(), labels.end()) == 0);
  CHECK(*std::max_element(labels.begin(), labels.end()) == 9);

  CsvDataset w(wine, {.header = false, .skip_rows = 1});
  REQUIRE(w.size() == 178);
  CHECK(w.features().shape() == Shape{178, 13});
  CHECK(w.get(0).get<float>("features").to_vector()[0] == 14.23f);
  CHECK(w.get(0).get<int64_t>("label").item() == 0);
  CHECK(w.get(177).get<int64_t>("label").item() == 2);
  // Without skipping the counts row its class names are not numbers.
  CHECK_THROWS_AS(CsvDataset(wine, {.header = false}), FormatError);
  CHECK_THAT(message_of([&] { CsvDataset(wine, {.header = false}); }),
             Contains("wine_data.csv") && Contains("record 1 (line 1)") && Contains("'class_0'"));
}

TEST_CASE("CSV: malformed input names the file, the record and the rule", "[data][csv]") {
  auto bad = [](const std::string& text, CsvOptions o = {.label_index = -1}) {
    return message_of([&] { CsvDataset(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "t.csv", o); });
  };
  auto throws = [](const std::string& text, CsvOptions o = {}) {
    CHECK_THROWS_AS(CsvDataset(reinterpret_cast<const uint8_t*>(text.data()), text.size(), "t.csv", o), FormatError);
  };
  throws("a,b\n1,2\n3\n");
  CHECK_THAT(bad("a,b\n1,2\n3\n"), Contains("'t.csv'") && Contains("record 2 (line 3) has 1 fields, expected 2"));
  CHECK_THAT(bad("a,b\n1,x2\n"), Contains("field 'b' (column 2) is 'x2', not a number"));
  CHECK_THAT(bad("a,b\n1,\n"), Contains("is '', not a number"));
  CHECK_THAT(bad("a,b\n1,2.5\n"), Contains("label 2.5") && Contains("not an integer"));
  CHECK_THAT(bad("a,b,c\n1,2\n"), Contains("2 fields but there are 3 column names"));
  CHECK_THAT(bad("a,b\n"), Contains("no data records"));
  CHECK_THAT(bad(""), Contains("no header row"));
  CHECK_THAT(bad("a\n1\n"), Contains("at least one feature column"));
  const std::string ok = "a,b\n1,2\n";
  CHECK_THROWS_AS(CsvDataset(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "t.csv", {.label_column = "z"}),
                  ValueError);
  CHECK_THAT(bad(ok, {.label_column = "z"}), Contains("no column named 'z'") && Contains("a, b"));
  CHECK_THAT(bad(ok, {.label_index = 5}), Contains("label_index 5 is out of range for 2 columns"));
  CHECK_THROWS_AS(CsvDataset((temp_dir() / "nope.csv").string()), IOError);
}

// ------------------------------------------------------------------ npy

namespace {
std::vector<uint8_t> npy_bytes(const std::string& dict, const std::vector<uint8_t>& payload, int major = 1) {
  std::string header = dict;
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  b.push_back(static_cast<uint8_t>(header.size()));
  b.push_back(static_cast<uint8_t>(header.size() >> 8));
  if (major > 1) b.insert(b.end(), {0, 0});
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}
template <class T>
std::vector<uint8_t> raw(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
}  // namespace

TEST_CASE("npy: memory-mapped arrays of every ember dtype, versions 1 and 2", "[data][npy]") {
  auto f = write_file("f.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                         raw<float>({1, 2, 3, 4, 5, 6})));
  NpyArray a(f);
  CHECK(a.dtype() == DType::Float32);
  CHECK(a.shape() == Shape{2, 3});
  CHECK(Tensor<float>(a.rows(1, 2)).to_vector() == std::vector<float>{4, 5, 6});
  CHECK(Tensor<float>(load_npy(f)).to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

  auto l = write_file("l.npy", npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                                         raw<int64_t>({-7, 1LL << 40}), 2));
  CHECK(Tensor<int64_t>(load_npy(l)).to_vector() == std::vector<int64_t>{-7, 1LL << 40});
  auto u = write_file("u.npy", npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", {3, 200}));
  CHECK(Tensor<uint8_t>(load_npy(u)).to_vector() == std::vector<uint8_t>{3, 200});
  auto d = write_file("d.npy", npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", raw<double>({2.5})));
  CHECK(Tensor<double>(load_npy(d)).item() == 2.5);
  auto h = write_file("h.npy", npy_bytes("{'descr': '<f2', 'fortran_order': False, 'shape': (1,), }", {0x00, 0x3C}));
  CHECK(load_npy(h).dtype() == DType::Float16);
  CHECK(load_npy(h).to_double_vector()[0] == 1.0);
  auto i = write_file("i.npy", npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
                                         raw<int32_t>({5, 6})));
  NpyDataset ds({{"x", f}, {"y", i}});
  REQUIRE(ds.size() == 2);
  CHECK(ds.get(1).get<float>("x").to_vector() == std::vector<float>{4, 5, 6});
  CHECK(ds.get(1).get<int32_t>("y").item() == 6);
  auto three = write_file("three.npy", npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", {1, 2, 3}));
  CHECK_THROWS_AS(NpyDataset({{"x", f}, {"y", three}}), FormatError);
  CHECK_THAT(message_of([&] { NpyDataset({{"x", f}, {"y", three}}); }),
             Contains("sizes disagree") && Contains("three.npy") && Contains("has 3 rows"));
  CHECK_THROWS_AS(NpyDataset({{"x", d}}), FormatError);
}

TEST_CASE("npy: numpy's own file (written by the reference Python)", "[data][npy]") {
#if defined(EMBER_TEST_PYTHON)
  if (std::string(EMBER_TEST_PYTHON).empty()) {
    std::cout << "SKIPPED: no reference Python configured (EMBER_PYTHON)" << std::endl;
    return;
  }
  const std::string path = (temp_dir() / "numpy.npy").string();
  const std::string cmd = std::string(EMBER_TEST_PYTHON) +
                          " -c \"import numpy as np; np.save('" + path +
                          "', np.arange(12, dtype=np.float32).reshape(3, 4) / 4)\" 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) {
    std::cout << "SKIPPED: numpy not importable by " << EMBER_TEST_PYTHON << std::endl;
    return;
  }
  NpyArray a(path);
  CHECK(a.shape() == Shape{3, 4});
  CHECK(Tensor<float>(a.rows(2, 3)).to_vector() == std::vector<float>{2, 2.25f, 2.5f, 2.75f});
#else
  std::cout << "SKIPPED: no reference Python configured (EMBER_PYTHON)" << std::endl;
#endif
}

TEST_CASE("npy: malformed files are FormatErrors naming the file and the rule", "[data][npy]") {
  auto bad = [](const std::vector<uint8_t>& b) { return message_of([&] { parse_npy_header(b.data(), b.size(), "x.npy"); }); };
  auto fmt = [](const std::vector<uint8_t>& b) { CHECK_THROWS_AS(parse_npy_header(b.data(), b.size(), "x.npy"), FormatError); };
  const std::vector<uint8_t> four = raw<float>({1, 2, 3, 4});
  fmt({1, 2, 3});
  CHECK_THAT(bad({1, 2, 3}), Contains("'x.npy'") && Contains("truncated"));
  CHECK_THAT(bad({'P', 'K', 3, 4, 5, 6, 7, 8, 9, 10}), Contains("wrong magic"));
  auto v9 = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four);
  v9[6] = 9;
  CHECK_THAT(bad(v9), Contains("format version 9.0"));
  auto big = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", four);
  big[8] = 0xFF;
  big[9] = 0xFF;
  CHECK_THAT(bad(big), Contains("truncated header"));
  CHECK_THAT(bad(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", four)),
             Contains("dtype '>f4' is not supported"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", four)), Contains("'<c8'"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }", four)), Contains("fortran_order is True"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<f4', 'shape': (4,), }", four)), Contains("no 'fortran_order' key"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (a,), }", four)),
             Contains("not a tuple of non-negative integers"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", four)),
             Contains("sizes disagree") && Contains("truncated"));
  CHECK_THAT(bad(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", four)), Contains("trailing bytes"));
  CHECK_THAT(bad(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", four)),
             Contains("structured dtypes"));
  CHECK_THROWS_AS(NpyArray((temp_dir() / "none.npy").string()), IOError);
  CHECK_THAT(message_of([&] { NpyArray((temp_dir() / "none.npy").string()); }), Contains("none.npy"));
}
