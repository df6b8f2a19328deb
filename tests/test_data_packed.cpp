// Image files and packed datasets (data/images.hpp, data/record.hpp, data/lmdb.hpp): PNG and JPEG
// decoding (libpng, libjpeg-turbo), the image-folder dataset, the record format, LMDB write and
// read with one read-only transaction per loader worker, and malformed input of each.
#include <catch2/catch.hpp>

#include <jpeglib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "ember/data/dataloader.hpp"
#include "ember/data/images.hpp"
#include "ember/data/lmdb.hpp"
#include "ember/data/record.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::data;
using ember::testing::message_of;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("ember_test_packed_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}
void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
Tensor<uint8_t> pattern(int64_t h, int64_t w, int64_t c, int salt) {
  std::vector<uint8_t> v(static_cast<size_t>(h * w * c));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 37 + static_cast<size_t>(salt) * 11) % 256);
  return Tensor<uint8_t>::from_vector(v, {h, w, c});
}

// A flat-gray JPEG (decodes to almost exactly that gray) through libjpeg's encoder.
std::vector<uint8_t> encode_jpeg_gray(int h, int w, uint8_t value, int components) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = components;
  c.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(w * components), value);
  while (c.next_scanline < c.image_height) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&c);
  std::free(buf);
  return out;
}

}  // namespace

TEST_CASE("PNG: encode/decode round trip for 1, 3 and 4 channels, and corrupt and truncated files fail", "[data][images]") {
  for (int64_t c : {1, 3, 4}) {
    auto img = pattern(5, 7, c, static_cast<int>(c));
    auto png = encode_png(img);
    CHECK(is_png(png.data(), png.size()));
    AnyTensor back = decode_png(png.data(), png.size(), "mem.png");
    CHECK(back.shape() == Shape{5, 7, c});
    CHECK(Tensor<uint8_t>(back).to_vector() == img.to_vector());
  }
  auto png = encode_png(pattern(8, 8, 1, 0).reshape({8, 8}));
  auto cut = std::vector<uint8_t>(png.begin(), png.begin() + static_cast<long>(png.size() / 2));
  CHECK_THROWS_AS(decode_png(cut.data(), cut.size(), "cut.png"), FormatError);
  CHECK_THAT(message_of([&] { decode_png(cut.data(), cut.size(), "cut.png"); }), Contains("png: 'cut.png'"));
  auto bad = png;
  for (size_t i = 40; i < bad.size() - 12; ++i) bad[i] ^= 0xA5;
  CHECK_THROWS_AS(decode_image(bad.data(), bad.size(), "bad.png"), FormatError);
  const std::vector<uint8_t> junk = {1, 2, 3, 4, 5};
  CHECK_THAT(message_of([&] { decode_image(junk.data(), junk.size(), "x.bin"); }),
             Contains("'x.bin' is neither PNG nor JPEG"));
  CHECK_THROWS_AS(encode_png(Tensor<float>::zeros({2, 2})), ValueError);
}

TEST_CASE("JPEG: gray and RGB decode to the encoded value, and corrupt data is a FormatError", "[data][images]") {
  auto gray = encode_jpeg_gray(16, 24, 200, 1);
  CHECK(is_jpeg(gray.data(), gray.size()));
  AnyTensor g = decode_jpeg(gray.data(), gray.size(), "g.jpg");
  CHECK(g.shape() == Shape{16, 24, 1});
  for (uint8_t v : Tensor<uint8_t>(g).to_vector()) CHECK(std::abs(int{v} - 200) <= 2);
  auto rgb = encode_jpeg_gray(8, 8, 90, 3);
  AnyTensor r = decode_image(rgb.data(), rgb.size(), "r.jpg");
  CHECK(r.shape() == Shape{8, 8, 3});
  for (uint8_t v : Tensor<uint8_t>(r).to_vector()) CHECK(std::abs(int{v} - 90) <= 2);
  auto cut = std::vector<uint8_t>(gray.begin(), gray.begin() + 20);
  CHECK_THROWS_AS(decode_jpeg(cut.data(), cut.size(), "cut.jpg"), FormatError);
  CHECK_THAT(message_of([&] { decode_jpeg(cut.data(), cut.size(), "cut.jpg"); }), Contains("jpeg: 'cut.jpg'"));
}

TEST_CASE("ImageFolderDataset: sorted classes are labels, PNG and JPEG files decode in get()", "[data][images]") {
  const fs::path root = temp_dir() / "folder";
  write_bytes(root / "cat" / "b.png", encode_png(pattern(4, 4, 3, 1)));
  write_bytes(root / "cat" / "a.PNG", encode_png(pattern(4, 4, 3, 2)));
  write_bytes(root / "ant" / "x.jpg", encode_jpeg_gray(4, 4, 10, 3));
  write_bytes(root / "ant" / "notes.txt", {'h', 'i'});
  ImageFolderDataset ds(root.string());
  REQUIRE(ds.size() == 3);
  CHECK(ds.classes() == std::vector<std::string>{"ant", "cat"});
  CHECK(ds.label(0) == 0);
  CHECK(ds.get(1).get<int64_t>("label").item() == 1);
  CHECK(ds.get(1).get<uint8_t>("image").to_vector() == pattern(4, 4, 3, 2).to_vector());  // a.PNG sorts first
  CHECK(ds.get(0)["image"].shape() == Shape{4, 4, 3});
  write_bytes(root / "cat" / "c.png", {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0});
  ImageFolderDataset with_bad(root.string());
  CHECK_THROWS_AS(with_bad.get(3), FormatError);
  CHECK_THAT(message_of([&] { with_bad.get(3); }), Contains("c.png"));
  // Through the loader the bad file's error names the index.
  DataLoader l(with_bad, {.batch_size = 4, .num_workers = 1});
  CHECK_THAT(message_of([&] { l.next(); }), Contains("image_folder") && Contains("index 3") && Contains("c.png"));
  CHECK_THROWS_AS(ImageFolderDataset((temp_dir() / "none").string()), IOError);
  fs::create_directories(temp_dir() / "empty" / "k");
  CHECK_THROWS_AS(ImageFolderDataset((temp_dir() / "empty").string()), IOError);
}

TEST_CASE("Records: encode/decode every dtype and encoded images, and malformed records name the rule", "[data][lmdb]") {
  auto f = Tensor<float>::from_vector({1.5f, -2}, {2});
  auto l = Tensor<int64_t>::scalar(7);
  auto png = encode_png(pattern(3, 2, 1, 5));
  auto rec = encode_record({{"x", f}, {"label", l}, {"img", Tensor<uint8_t>::from_vector(png), true}});
  Example raw = decode_record(rec.data(), rec.size(), "r");
  CHECK(raw.get<float>("x").to_vector() == f.to_vector());
  CHECK(raw.get<int64_t>("label").item() == 7);
  CHECK(raw["img"].shape() == Shape{static_cast<int64_t>(png.size())});
  Example dec = decode_record(rec.data(), rec.size(), "r", decode_image);
  CHECK(dec.get<uint8_t>("img").to_vector() == pattern(3, 2, 1, 5).to_vector());

  auto bad = [&](std::vector<uint8_t> b) { return message_of([&] { decode_record(b.data(), b.size(), "db record 4"); }); };
  auto fmt = [&](std::vector<uint8_t> b) { CHECK_THROWS_AS(decode_record(b.data(), b.size(), "r"), FormatError); };
  fmt({'E', 'M'});
  CHECK_THAT(bad({'E', 'M'}), Contains("db record 4") && Contains("truncated in the header"));
  CHECK_THAT(bad({'X', 'M', 'B', 'R', 1, 0}), Contains("wrong magic"));
  CHECK_THAT(bad({'E', 'M', 'B', 'R', 9, 0}), Contains("version 9"));
  auto cut = rec;
  cut.resize(rec.size() - 3);
  fmt(cut);
  CHECK_THAT(bad(cut), Contains("truncated in a field payload"));
  auto trailing = rec;
  trailing.push_back(0);
  CHECK_THAT(bad(trailing), Contains("1 trailing bytes"));
  auto kind = rec;
  kind[6 + 1 + 1] = 42;  // the first field's kind byte
  CHECK_THAT(bad(kind), Contains("unknown kind 42"));
  auto size = rec;
  size[6 + 1 + 1 + 1 + 1 + 8] ^= 1;  // the first field's payload length
  CHECK_THAT(bad(size), Contains("sizes disagree"));
  // Found by tests/fuzz/fuzz_record.cpp: an empty name, and a name twice.
  CHECK_THAT(bad({'E', 'M', 'B', 'R', 1, 1, 0, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0}), Contains("field 1 has an empty name"));
  std::vector<uint8_t> twice = {'E', 'M', 'B', 'R', 1, 2};
  for (int k = 0; k < 2; ++k) twice.insert(twice.end(), {1, 'a', 6, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9});
  CHECK_THAT(bad(twice), Contains("field 'a' appears twice"));
}

TEST_CASE("LMDB: packed records read back through the DataLoader, one read-only transaction per worker",
          "[data][lmdb]") {
  const std::string path = (temp_dir() / "packed.lmdb").string();
  {
    LmdbWriter w(path, size_t{1} << 26, 7);
    for (int64_t i = 0; i < 30; ++i)
      w.append(encode_record({{"image", pattern(4, 3, 1, static_cast<int>(i)).reshape({4, 3})},
                              {"label", Tensor<int64_t>::scalar(i % 10)}}));
    CHECK(w.count() == 30);
    CHECK_FALSE(fs::exists(path));  // only the temporary folder until finish()
    w.finish();
  }
  REQUIRE(fs::exists(path));
  CHECK_THROWS_AS(LmdbWriter(path), IOError);
  LmdbDataset ds(path);
  REQUIRE(ds.size() == 30);
  CHECK(ds.get(17).get<uint8_t>("image").to_vector() == pattern(4, 3, 1, 17).to_vector());
  CHECK(ds.get(17).get<int64_t>("label").item() == 7);
  CHECK_THROWS_AS(ds.get(30), IndexError);
  CHECK(ds.num_transactions() == 1);  // this thread's
  {
    DataLoader l(ds, {.batch_size = 4, .shuffle = true, .seed = 1, .num_workers = 3});
    std::set<int64_t> seen;
    for (Batch& b : l) {
      auto labels = b.get<int64_t>("label").to_vector();
      for (size_t k = 0; k < b.indices.size(); ++k) {
        CHECK(labels[k] == b.indices[k] % 10);
        seen.insert(b.indices[k]);
      }
    }
    CHECK(seen.size() == 30);
  }
  CHECK(ds.num_transactions() >= 2);
  CHECK(ds.num_transactions() <= 4);  // at most one per reading thread

  // Not a database / not ember's.
  CHECK_THROWS_AS(LmdbDataset((temp_dir() / "nothing.lmdb").string()), IOError);
  const std::string foreign = (temp_dir() / "foreign.lmdb").string();
  {
    LmdbWriter w(foreign, size_t{1} << 24);
    w.append({1, 2, 3});  // not a record
    w.finish();
  }
  LmdbDataset f(foreign);
  CHECK_THROWS_AS(f.get(0), FormatError);
  CHECK_THAT(message_of([&] { f.get(0); }), Contains("foreign.lmdb' record 0") && Contains("truncated"));
}
