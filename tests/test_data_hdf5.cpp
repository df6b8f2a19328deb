// HDF5 datasets (include/ember/data/hdf5.hpp): files h5py writes (tests/interop/hdf5_fixtures.py: every
// dtype, contiguous, chunked and gzip layouts) read bit-exact against the .npy copies it writes
// too; ember-written files read back by h5py bit-exact; the errors for bad inputs; reads from four
// threads against serial ones; and Fashion-MNIST packed to HDF5 against its IDX files, down to the
// losses of a short training. Without HDF5 (EMBER_HAVE_HDF5 unset) or h5py the cases say SKIPPED.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ember/ember.hpp"
#include "python_check.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

#ifdef EMBER_HAVE_HDF5
#include "ember/data/dataloader.hpp"
#include "ember/data/hdf5.hpp"
#include "ember/data/idx.hpp"
#include "ember/data/npy.hpp"
#include "ember/data/transforms.hpp"

using namespace ember;
using namespace ember::data;
using Catch::Matchers::Contains;
using ember::testing::message_of;
using ember::testing::TempDir;
namespace fs = std::filesystem;

namespace {

bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Runs tests/interop/hdf5_fixtures.py; its output, or nothing (and prints SKIPPED) without Python or h5py.
std::optional<std::string> run_python(const std::string& mode, const std::string& arg) {
  const auto run = testing::run_python_check("hdf5_fixtures.py", {mode, arg});
  if (!run) return std::nullopt;
  INFO(run->out);
  REQUIRE(run->status == 0);
  return run->out;
}

// The fixtures, made once per test process (each test case is its own process under ctest).
const TempDir* fixtures() {
  static TempDir dir("ember-hdf5");
  static const bool made = run_python("make", dir.path.string()).has_value();
  return made ? &dir : nullptr;
}

const std::vector<std::string> kDtypes = {"int8",    "int16",   "int32",   "int64", "uint8", "uint16", "uint32",
                                          "float16", "float32", "float64", "bool",  ">i4",   ">f8"};

}  // namespace

TEST_CASE("Hdf5Dataset: every dtype in contiguous, chunked and gzip layouts reads bit-exact", "[data][hdf5]") {
  const TempDir* dir = fixtures();
  if (!dir) return;
  const std::string file = *dir / "dtypes.h5";
  int compared = 0;
  for (const std::string layout : {"contiguous", "chunked", "gzip"})
    for (const std::string& dt : kDtypes) {
      const std::string ds = layout + "/" + dt;
      std::string npy = dt;
      if (npy[0] == '>') npy = "be_" + npy.substr(1);
      const NpyArray want(*dir / (layout + "_" + npy + ".npy"));
      Hdf5Dataset h5(file, {ds});
      INFO(ds << " (" << h5.fields()[0].file_type << ") read as " << dtype_name(h5.fields()[0].dtype));
      REQUIRE(h5.size() == 37);
      CHECK(h5.fields()[0].name == dt);
      CHECK(h5.fields()[0].row_shape == Shape{3, 4});
      CHECK(same_bytes(h5.rows(0, 37)[dt], want.to_tensor()));
      CHECK(same_bytes(h5.rows(5, 19)[dt], want.rows(5, 19)));
      CHECK(h5.rows(7, 7)[dt].shape() == Shape{0, 3, 4});
      for (int64_t i : {0, 1, 8, 36}) CHECK(same_bytes(h5.get(i)[dt], want.rows(i, i + 1).select(0)));
      ++compared;
    }
  CHECK(compared == 39);
  // The widenings: what each HDF5 integer type reads as.
  Hdf5Dataset h5(file, {"gzip/int8", "gzip/int16", "gzip/uint16", "gzip/uint32", "gzip/bool", "gzip/float16"});
  const std::vector<DType> want = {DType::Int32, DType::Int32, DType::Int32, DType::Int64, DType::UInt8, DType::Float16};
  for (size_t k = 0; k < want.size(); ++k) CHECK(h5.fields()[k].dtype == want[k]);
  CHECK(h5.fields()[4].file_type == "bool (h5py's enum)");
  CHECK_THROWS_AS(h5.get(37), IndexError);
  CHECK_THAT(message_of([&] { h5.rows(30, 38); }), Contains("rows [30, 38) out of range [0, 37)"));
}

TEST_CASE("Hdf5Dataset: bfloat16 in HDF5 2.0's layout, several fields, groups and a field mapping", "[data][hdf5]") {
  const TempDir* dir = fixtures();
  if (!dir) return;
  Hdf5Dataset bf(*dir / "dtypes.h5", {"bf16"});
  REQUIRE(bf.fields()[0].dtype == DType::BFloat16);
  const AnyTensor bits = NpyArray(*dir / "bf16_bits.npy").to_tensor();
  const AnyTensor got = bf.rows(0, bf.size())["bf16"];
  REQUIRE(got.numel() == bits.numel());
  const auto* g = static_cast<const uint16_t*>(got.data_ptr());
  const auto* w = static_cast<const int32_t*>(bits.data_ptr());
  int64_t same = 0;
  for (int64_t k = 0; k < got.numel(); ++k) same += g[k] == static_cast<uint16_t>(w[k]);
  CHECK(same == got.numel());

  Hdf5Dataset set(*dir / "dtypes.h5", {"set/x", "/set/y"}, {.fields = {{"/set/y", "label"}}});
  REQUIRE(set.size() == 37);
  const Example e = set.get(4);
  CHECK(e.field_names() == "x, label");
  CHECK(e.get<float>("x").to_vector() == std::vector<float>{20, 21, 22, 23, 24});
  CHECK(e["label"].dim() == 0);
  CHECK(e.get<int64_t>("label").item() == 12);
  CHECK_THAT(message_of([&] { Hdf5Dataset(*dir / "dtypes.h5", {"gzip/int8", "chunked/int8"}); }),
             Contains("both give the field 'int8'"));
}

TEST_CASE("Hdf5Dataset: bad inputs are errors naming the file, the dataset and the reason", "[data][hdf5]") {
  const TempDir* dir = fixtures();
  if (!dir) return;
  const std::string bad = *dir / "bad.h5";
  auto open = [&](std::vector<std::string> ds) { Hdf5Dataset h(bad, ds); };
  CHECK_THROWS_AS(open({"rows10", "rows11"}), ShapeError);
  CHECK_THAT(message_of([&] { open({"rows10", "rows11"}); }),
             Contains("'" + bad + "': dataset 'rows11' has 11 rows (first dimension) but dataset 'rows10' has 10"));
  CHECK_THROWS_AS(open({"nope"}), FormatError);
  CHECK_THAT(message_of([&] { open({"nope"}); }), Contains("'" + bad + "' has no dataset 'nope' (it has: compound, rows10"));
  CHECK_THAT(message_of([&] { open({"group/deeper/nope"}); }), Contains("has no dataset 'group/deeper/nope'"));
  CHECK_THROWS_AS(open({"strings"}), FormatError);
  CHECK_THAT(message_of([&] { open({"strings"}); }),
             Contains("'" + bad + "' dataset 'strings' holds a string, which ember cannot read"));
  CHECK_THAT(message_of([&] { open({"uint64"}); }), Contains("dataset 'uint64' holds 64-bit unsigned integer"));
  CHECK_THAT(message_of([&] { open({"compound"}); }), Contains("dataset 'compound' holds a compound type"));
  CHECK_THROWS_AS(open({"scalar"}), ShapeError);
  CHECK_THAT(message_of([&] { open({"scalar"}); }), Contains("dataset 'scalar' is a scalar"));
  CHECK_THAT(message_of([&] { open({"group"}); }), Contains("dataset 'group' is not a dataset (a group?)"));
  CHECK_THROWS_AS(Hdf5Dataset(*dir / "missing.h5", {"x"}), IOError);
  CHECK_THAT(message_of([&] { Hdf5Dataset(*dir / "missing.h5", {"x"}); }), Contains("missing.h5': no such file"));
  const std::string npy = *dir / "gzip_int8.npy";
  CHECK_THROWS_AS(Hdf5Dataset(npy, {"x"}), FormatError);
  CHECK_THAT(message_of([&] { Hdf5Dataset(npy, {"x"}); }), Contains("is not an HDF5 file"));
}

TEST_CASE("Hdf5Writer: every dtype, chunked and gzip, read back by h5py and by ember bit-exact", "[data][hdf5]") {
  TempDir dir("ember-hdf5-w");
  const std::string file = dir / "written.h5";
  // Element k of each dataset (row-major), as tests/interop/hdf5_fixtures.py's written_value() computes it.
  auto values = [](DType dt, const Shape& s) {
    AnyTensor t = AnyTensor::empty(s, dt);
    dispatch_dtype(dt, [&](auto zero) {
      using T = decltype(zero);
      auto* p = static_cast<T*>(t.data_ptr());
      for (int64_t k = 0; k < t.numel(); ++k) {
        if constexpr (std::is_same_v<T, float>) p[k] = static_cast<float>(k * 0.37 - 5);
        else if constexpr (std::is_same_v<T, double>) p[k] = k * 0.37 - 5;
        else if constexpr (std::is_same_v<T, int32_t>) p[k] = static_cast<int32_t>((k * 2654435761LL) % 4294967296LL - 2147483648LL);
        else if constexpr (std::is_same_v<T, int64_t>) p[k] = k * 1000003 - 7;
        else if constexpr (std::is_same_v<T, uint8_t>) p[k] = static_cast<uint8_t>(k * 37 % 251);
        else p[k] = T(static_cast<float>(((k % 61) - 30) * 0.5));  // half and bfloat16: exact
      }
    });
    return t;
  };
  struct Case { std::string name; DType dtype; Shape shape; Hdf5DatasetOptions options; };
  const std::vector<Case> cases = {
      {"float32", DType::Float32, {50, 3, 2}, {.chunk_rows = 8}},
      {"float64", DType::Float64, {50, 4}, {.gzip_level = 4, .shuffle = true}},
      {"float16", DType::Float16, {50, 5}, {.chunk_rows = 7, .gzip_level = 1}},
      {"bfloat16", DType::BFloat16, {50, 5}, {.chunk_rows = 16}},
      {"int32", DType::Int32, {50}, {}},
      {"int64", DType::Int64, {50, 2}, {.chunk_rows = 50, .gzip_level = 9}},
      {"uint8", DType::UInt8, {50, 28, 28}, {.chunk_rows = 16, .gzip_level = 6}},
  };
  {
    Hdf5Writer w(file);
    for (const Case& c : cases) {
      Shape row;
      for (int d = 1; d < c.shape.dim(); ++d) row.push_back(c.shape[d]);
      w.create(c.name, c.dtype, row, c.options);
      const AnyTensor all = values(c.dtype, c.shape);
      // Appended as single rows, then a block of rows, then the rest: the chunk buffering's cases.
      for (int64_t i = 0; i < 3; ++i) w.append(c.name, all.select(i));
      w.append(c.name, all.slice(3, 30));
      w.append(c.name, all.slice(30, 50));
      CHECK(w.rows(c.name) == 50);
    }
    CHECK_FALSE(fs::exists(file));  // not before finish()
    w.finish();
  }
  REQUIRE(fs::exists(file));
  std::vector<std::string> names;
  for (const Case& c : cases) names.push_back(c.name);
  Hdf5Dataset back(file, names);
  REQUIRE(back.size() == 50);
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(same_bytes(back.rows(0, 50)[c.name], values(c.dtype, c.shape)));
    CHECK(same_bytes(back.get(17)[c.name], values(c.dtype, c.shape).select(17)));
  }
  for (const auto& entry : fs::directory_iterator(dir.path)) CHECK(entry.path().filename() == "written.h5");

  const auto out = run_python("check", file);
  if (!out) return;
  INFO(*out);
  for (const Case& c : cases) CHECK_THAT(*out, Contains("OK " + c.name + " "));
  CHECK_THAT(*out, Contains("OK uint8 uint8 (50, 28, 28) chunks=(16, 28, 28) compression=gzip"));
  CHECK_THAT(*out, Contains("OK float16 float16 (50, 5) chunks=(7, 5) compression=gzip"));
  CHECK(out->find("MISMATCH") == std::string::npos);
}

TEST_CASE("Hdf5Writer: unfinished files are discarded, finished ones replace the target, bad rows are refused",
          "[data][hdf5]") {
  TempDir dir("ember-hdf5-w");
  const std::string file = dir / "x.h5";
  {
    Hdf5Writer w(file);
    w.create("v", DType::Int64, {});
    w.append("v", Tensor<int64_t>::from_vector({1, 2, 3}));
    CHECK_THROWS_AS(w.append("v", Tensor<int32_t>::from_vector({1})), DTypeError);
    CHECK_THAT(message_of([&] { w.append("v", Tensor<int64_t>::zeros({2, 2})); }),
               Contains("dataset 'v' has rows of shape []; got a tensor of shape [2, 2]"));
    CHECK_THAT(message_of([&] { w.append("w", Tensor<int64_t>::from_vector({1})); }), Contains("no dataset 'w'"));
    CHECK_THAT(message_of([&] { w.create("v", DType::Int64, {}); }), Contains("dataset 'v' was created already"));
  }  // no finish(): nothing is left behind
  CHECK(fs::is_empty(dir.path));
  for (int64_t first : {10, 20}) {
    Hdf5Writer w(file);
    w.create("g/v", DType::Int64, {});
    w.create("g/u", DType::UInt8, {2});
    w.append("g/v", Tensor<int64_t>::from_vector({first, first + 1}));
    w.append("g/u", Tensor<uint8_t>::from_vector({1, 2, 3, 4}).reshape({2, 2}));
    w.finish();
    CHECK_THROWS_AS(w.append("g/v", Tensor<int64_t>::from_vector({1})), IOError);
    CHECK(Hdf5Dataset(file, {"g/v"}).get(1).get<int64_t>("v").item() == first + 1);
  }
  std::vector<fs::path> left;
  for (const auto& entry : fs::directory_iterator(dir.path)) left.push_back(entry.path().filename());
  CHECK(left == std::vector<fs::path>{"x.h5"});
}

TEST_CASE("Hdf5Dataset: four threads read the same rows as one thread", "[data][hdf5][threads]") {
  const TempDir* dir = fixtures();
  if (!dir) return;
  const Hdf5Dataset h5(*dir / "dtypes.h5", {"gzip/float32", "chunked/int64", "contiguous/uint8", "gzip/float16"},
                       {.fields = {{"gzip/float32", "a"}, {"chunked/int64", "b"}, {"contiguous/uint8", "c"}, {"gzip/float16", "d"}}});
  std::vector<Example> serial;
  for (int64_t i = 0; i < h5.size(); ++i) serial.push_back(h5.get(i));
  std::vector<std::vector<Example>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (int64_t i = 0; i < h5.size(); ++i) got[t].push_back(h5.get((i * 7 + t + rep) % h5.size()));
    });
  for (auto& th : threads) th.join();
  int64_t mismatches = 0;
  for (int t = 0; t < 4; ++t) {
    REQUIRE(got[t].size() == static_cast<size_t>(20 * h5.size()));
    for (int rep = 0; rep < 20; ++rep)
      for (int64_t i = 0; i < h5.size(); ++i) {
        const Example& e = got[t][static_cast<size_t>(rep * h5.size() + i)];
        const Example& want = serial[static_cast<size_t>((i * 7 + t + rep) % h5.size())];
        for (const char* f : {"a", "b", "c", "d"}) mismatches += !same_bytes(e[f], want[f]);
      }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("Hdf5Dataset: Fashion-MNIST packed to HDF5 equals its IDX files and trains to the same losses",
          "[data][hdf5][fashion]") {
  if (!fs::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz")) {
    std::printf("SKIPPED: Fashion-MNIST not found in %s (dataset-fashion-mnist)\n", fashion_mnist_dir().c_str());
    return;
  }
  TempDir dir("ember-hdf5-fm");
  const std::string file = dir / "fashion.h5";
  const IdxDataset train = fashion_mnist("train"), test = fashion_mnist("test");
  {
    Hdf5Writer w(file);
    for (const auto& [split, ds, n] : {std::tuple{"train", &train, 2000}, std::tuple{"test", &test, 500}}) {
      w.create(std::string(split) + "/image", DType::UInt8, {28, 28}, {.gzip_level = 4});
      w.create(std::string(split) + "/label", DType::Int64, {});
      for (int64_t i = 0; i < n; ++i) {
        const Example e = ds->get(i);
        w.append(std::string(split) + "/image", e["image"]);
        w.append(std::string(split) + "/label", e["label"]);
      }
    }
    w.finish();
  }
  const Hdf5Dataset h5_train(file, {"train/image", "train/label"}), h5_test(file, {"test/image", "test/label"});
  REQUIRE(h5_train.size() == 2000);
  REQUIRE(h5_test.size() == 500);
  int64_t differ = 0;
  for (const auto& [h5, idx] : {std::pair{&h5_train, &train}, std::pair{&h5_test, &test}})
    for (int64_t i = 0; i < h5->size(); ++i) {
      const Example a = h5->get(i), b = idx->get(i);
      differ += !same_bytes(a["image"], b["image"]) || !same_bytes(a["label"], b["label"]);
    }
  CHECK(differ == 0);

  // 150 steps of an MLP, data shuffled by two loader workers: identical data, identical losses.
  auto train_losses = [](const Dataset& ds) {
    Generator gen(3);
    GeneratorScope scope(gen);
    nn::Sequential model;
    model.emplace<nn::Flatten>();
    model.emplace<nn::Linear>(784, 32);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(32, 10);
    optim::SGD opt(model.parameters(), {.lr = 0.1});
    DataLoader loader(ds, {.batch_size = 40, .shuffle = true, .seed = 9, .num_workers = 2, .transform = ToFloat{}});
    std::vector<float> losses;
    for (int epoch = 0; epoch < 3; ++epoch)
      for (Batch& b : loader) {
        FloatTensor loss = nn::functional::cross_entropy(model(b.get<float>("image")), b["label"]);
        opt.zero_grad();
        loss.backward();
        opt.step();
        losses.push_back(loss.item());
      }
    return losses;
  };
  // Fields named as IdxDataset's: "image" and "label".
  const std::vector<float> from_idx = train_losses(TensorDataset({{"image", train.images().slice(0, 2000)},
                                                                  {"label", train.labels().slice(0, 2000)}}));
  const std::vector<float> from_h5 = train_losses(h5_train);
  REQUIRE(from_idx.size() == 150);
  CHECK(from_h5.size() == from_idx.size());
  CHECK(std::memcmp(from_h5.data(), from_idx.data(), from_idx.size() * sizeof(float)) == 0);
  CHECK(from_idx.back() < from_idx.front() * 0.6f);  // it learns
}

#else
TEST_CASE("Hdf5Dataset: HDF5 is not built in", "[data][hdf5]") {
  std::printf("SKIPPED: HDF5 not found when configuring (Debian: libhdf5-dev): HDF5 datasets off\n");
}
#endif
