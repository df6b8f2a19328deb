// safetensors (io/safetensors*.hpp), atomic writes (io/atomic_file.hpp), Module::save/load and the
// optimizer's state file (optim/state_io.hpp); interop with the Python reference both ways
// (fixtures made by tests/interop/make_fixtures.py, and a live round trip through
// tests/interop/check_ember_files.py when the package is importable).
#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "ember/io/io.hpp"
#include "ember/optim/state_io.hpp"
#include "pretend_gpu.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::same_bytes;
namespace fs = std::filesystem;

namespace {

// A fresh folder under the system's temporary folder, removed at scope exit.
struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("ember-st") {}
};

fs::path fixture(const std::string& name) { return fs::path(EMBER_SOURCE_DIR) / "tests" / "interop" / name; }

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0);
  return out;
}

// The FormatError message for these bytes (empty when they parse).
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    io::parse_safetensors(bytes.data(), bytes.size(), "bad.safetensors");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}
std::string parse_error(const std::string& header, size_t data_bytes) { return parse_error(file_bytes(header, data_bytes)); }

// The tensors of python_dtypes.safetensors, made the way make_fixtures.py's python_values() makes them.
io::TensorList reference_dtypes() {
  io::TensorList t;
  std::vector<double> f64;
  for (int i = 0; i < 6; ++i) f64.push_back(i * 0.5 - 1.0);
  t.emplace_back("f64", Tensor<double>::from_vector(f64, {2, 3}));
  std::vector<float> f32;
  for (int i = 0; i < 6; ++i) f32.push_back(static_cast<float>(i) * 0.25f + 2.0f);
  t.emplace_back("f32", Tensor<float>::from_vector(f32, {3, 2}));
  std::vector<half> f16;
  for (int i = 0; i < 8; ++i) f16.push_back(half(static_cast<float>(i) * -0.5f));
  t.emplace_back("f16", Tensor<half>::from_vector(f16, {2, 2, 2}));
  t.emplace_back("i64", Tensor<int64_t>::from_vector({-3, int64_t{1} << 40, 7}, {3}));
  t.emplace_back("i32", Tensor<int32_t>::from_vector({-1, 2, 3, INT32_MIN}, {2, 2}));
  t.emplace_back("u8", Tensor<uint8_t>::from_vector({0, 255, 7}, {3}));
  t.emplace_back("scalar", Tensor<float>::scalar(3.5f));
  t.emplace_back("empty", Tensor<float>::empty({0, 3}));
  t.emplace_back("bf16", Tensor<bfloat16>::from_vector({bfloat16(1.0f), bfloat16(-2.0f), bfloat16(0.5f), bfloat16(3.0f)},
                                                       {2, 2}));
  return t;
}

const AnyTensor& by_name(const io::TensorList& l, const std::string& name) {
  for (const auto& [k, v] : l)
    if (k == name) return v;
  FAIL("no tensor " << name);
  throw 0;
}

}  // namespace

TEST_CASE("safetensors: every dtype, 0-d and empty tensors round-trip bitwise through a file", "[safetensors]") {
  TempDir dir;
  io::TensorList ref = reference_dtypes();
  io::save_file(dir / "a.safetensors", ref, {{"k", "v"}, {"json", "{\"x\": [1]}"}});
  io::TensorList got = io::load_file(dir / "a.safetensors");
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO(ref[i].first);
    CHECK(got[i].first == ref[i].first);  // the order written is the order read
    CHECK(same_bytes(got[i].second, ref[i].second));
  }
  CHECK(io::load_metadata(dir / "a.safetensors") == io::Metadata{{"k", "v"}, {"json", "{\"x\": [1]}"}});
  // The file is exactly serialize()'s bytes; the data starts at a multiple of 8.
  std::vector<uint8_t> mem = io::serialize(ref, {{"k", "v"}, {"json", "{\"x\": [1]}"}});
  std::ifstream f(dir / "a.safetensors", std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(disk == mem);
  uint64_t n;
  std::memcpy(&n, mem.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(mem[8] == '{');
  io::TensorList back = io::deserialize(mem.data(), mem.size());
  CHECK(same_bytes(by_name(back, "bf16"), by_name(ref, "bf16")));
  // No temporary file is left next to it.
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

TEST_CASE("safetensors: the memory-mapped reader hands out one tensor at a time", "[safetensors]") {
  TempDir dir;
  io::save_file(dir / "m.safetensors", reference_dtypes(), {{"a", "b"}});
  io::SafetensorsFile f(dir / "m.safetensors");
  CHECK(f.size() == 9);
  CHECK(f.contains("i64"));
  CHECK_FALSE(f.contains("nope"));
  CHECK(f.keys().front() == "f64");
  CHECK(f.metadata().at("a") == "b");
  CHECK(f.entry("i32").dtype_name == "I32");
  CHECK(Tensor<int64_t>(f.get("i64")).to_vector() == std::vector<int64_t>{-3, int64_t{1} << 40, 7});
  CHECK(f.get("scalar").dim() == 0);
  CHECK(f.get("empty").shape() == Shape{0, 3});
  try {
    f.get("nope");
    FAIL("no error");
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("m.safetensors") && Catch::Contains("no tensor 'nope'"));
  }
  io::SafetensorsFile moved = std::move(f);
  CHECK(Tensor<float>(moved.get("f32")).to_vector()[5] == 3.25f);
}

TEST_CASE("safetensors: loading onto a device goes through the double-buffered pinned staging", "[safetensors][device]") {
  testing::PretendGpu gpu;  // cuda:0 made of CPU kernels when there is no GPU
  TempDir dir;
  std::vector<float> v(2500);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
  io::save_file(dir / "d.safetensors", {{"big", Tensor<float>::from_vector(v, {50, 50})},
                                        {"small", Tensor<int64_t>::from_vector({3, -4}, {2})},
                                        {"none", Tensor<float>::empty({0})}});
  io::SafetensorsFile f(dir / "d.safetensors");
  f.set_staging_bytes(1000);  // 10 chunks for "big", alternating between the two buffers
  AnyTensor big = f.get("big", Device::cuda(0));
  CHECK(big.device() == Device::cuda(0));
  CHECK(Tensor<float>(big.to(Device::cpu())).to_vector() == v);
  CHECK(Tensor<int64_t>(f.get("small", Device::cuda(0)).to(Device::cpu())).to_vector() == std::vector<int64_t>{3, -4});
  CHECK(f.get("none", Device::cuda(0)).numel() == 0);
  f.set_staging_bytes(3);  // chunks that split elements
  CHECK(Tensor<float>(f.get("big", Device::cuda(0)).to(Device::cpu())).to_vector() == v);
  io::TensorList all = io::load_file(dir / "d.safetensors", Device::cuda(0));
  CHECK(Tensor<float>(all[0].second.to(Device::cpu())).to_vector() == v);
}

TEST_CASE("safetensors: reads the files the Python package wrote (fixtures)", "[safetensors][interop]") {
  io::SafetensorsFile f(fixture("python_dtypes.safetensors"));
  CHECK(f.metadata() == io::Metadata{{"format", "pt"}, {"source", "python"}});
  io::TensorList got = f.load_all();
  io::TensorList ref = reference_dtypes();
  REQUIRE(got.size() == ref.size());
  for (const auto& [name, t] : ref) {
    INFO(name);
    CHECK(same_bytes(by_name(got, name), t));
  }
}

TEST_CASE("safetensors: a format dtype ember cannot hold is a DTypeError naming the tensor", "[safetensors][interop]") {
  io::SafetensorsFile f(fixture("python_unsupported.safetensors"));
  CHECK(Tensor<float>(f.get("ok")).to_vector() == std::vector<float>{1.5f});  // the rest stays readable
  for (auto [name, dt] : {std::pair{"i16", "I16"}, {"i8", "I8"}, {"bool", "BOOL"}}) {
    try {
      f.get(name);
      FAIL("no error for " << name);
    } catch (const DTypeError& e) {
      CHECK_THAT(e.what(), Catch::Contains(std::string("tensor '") + name + "'") && Catch::Contains(dt) &&
                               Catch::Contains("python_unsupported.safetensors"));
    }
  }
  CHECK_THROWS_AS(io::load_file(fixture("python_unsupported.safetensors")), DTypeError);
}

namespace {
// The model of make_fixtures.py, with torch.nn's names.
struct Net : nn::Module {
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::MultiheadAttention> attn;
  std::shared_ptr<nn::Linear> fc;
  Net() {
    nn::Conv2dOptions co;
    co.padding = {1, 1};
    conv = register_module("conv", std::make_shared<nn::Conv2d>(2, 4, std::array<int64_t, 2>{3, 3}, co));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{4}));
    attn = register_module("attn", std::make_shared<nn::MultiheadAttention>(4, 2));
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
  }
  Tensor<float> forward(const Tensor<float>& x) {
    auto h = relu((*bn)(( *conv)(x)));                    // [N, 4, H, W]
    const int64_t n = h.size(0), c = h.size(1), hw = h.size(2) * h.size(3);
    auto tok = transpose(h.reshape({n, c, hw}), 1, 2);  // [N, HW, 4]
    tok = (*ln)(tok);
    tok = (*attn)(tok);
    return (*fc)(mean(tok, {1}));
  }
};
}  // namespace

TEST_CASE("safetensors: a torch.nn state dict (Linear, Conv2d, BatchNorm2d, LayerNorm, MultiheadAttention) loads and "
          "gives PyTorch's outputs",
          "[safetensors][interop]") {
  Net net;
  // The names and order are torch's: the file's order equals ember's state_dict order.
  io::SafetensorsFile f(fixture("torch_model.safetensors"));
  std::vector<std::string> mine;
  for (auto& [k, v] : net.state_dict()) mine.push_back(k);
  CHECK(mine.size() == f.size());
  nn::Module::LoadResult r = net.load(fixture("torch_model.safetensors").string());
  CHECK(r.missing_keys.empty());
  CHECK(r.unexpected_keys.empty());
  CHECK(Tensor<int64_t>(net.bn->num_batches_tracked).item() == 17);
  net.eval();
  io::TensorList xy = io::load_file(fixture("torch_model_io.safetensors"));
  NoGradGuard ng;
  std::vector<float> y = net.forward(Tensor<float>(by_name(xy, "x"))).to_vector();
  std::vector<float> want = Tensor<float>(by_name(xy, "y")).to_vector();
  REQUIRE(y.size() == 6);
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == Approx(want[i]).epsilon(1e-4).margin(1e-5));
}

TEST_CASE("Module::save / load: strict and non-strict", "[safetensors][module]") {
  TempDir dir;
  manual_seed(3);
  nn::Linear a(3, 2), b(3, 2);
  a.save(dir / "lin.safetensors", {{"epoch", "4"}});
  CHECK(io::load_metadata(dir / "lin.safetensors").at("epoch") == "4");
  b.load(dir / "lin.safetensors");
  CHECK(same_bytes(a.weight, b.weight));
  CHECK(same_bytes(a.bias, b.bias));

  nn::Linear nobias(3, 2, {.bias = false});
  try {
    nobias.load(dir / "lin.safetensors");
    FAIL("no error");
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains("unexpected keys: bias") && Catch::Contains("lin.safetensors"));
  }
  nn::Module::LoadResult r = nobias.load(dir / "lin.safetensors", /*strict=*/false);
  CHECK(r.unexpected_keys == std::vector<std::string>{"bias"});
  CHECK(r.missing_keys.empty());
  CHECK(same_bytes(nobias.weight, a.weight));
  nobias.save(dir / "nb.safetensors");
  r = b.load(dir / "nb.safetensors", false);
  CHECK(r.missing_keys == std::vector<std::string>{"bias"});
  nn::Linear wrong(4, 2);
  CHECK_THROWS_AS(wrong.load(dir / "lin.safetensors"), ShapeError);
}

TEST_CASE("safetensors writer: refuses shared storage, reserved and repeated names", "[safetensors][errors]") {
  TempDir dir;
  auto w = Tensor<float>::zeros({4, 2});
  auto check = [&](const io::TensorList& l, const std::string& what) {
    try {
      io::save_file(dir / "x.safetensors", l);
      FAIL("no error");
    } catch (const ValueError& e) {
      CHECK_THAT(e.what(), Catch::Contains(what) && Catch::Contains("x.safetensors"));
    }
    CHECK_FALSE(fs::exists(dir / "x.safetensors"));
  };
  check({{"wte", w}, {"lm_head", w}}, "tensors 'wte' and 'lm_head' share storage");
  check({{"a", w}, {"b", w.slice(0, 2)}}, "share storage");
  check({{"__metadata__", w}}, "'__metadata__' is reserved");
  check({{"a", w}, {"a", w.clone()}}, "the name 'a' appears twice");
  check({{"u", AnyTensor()}}, "tensor 'u' is undefined");
}

TEST_CASE("safetensors reader: each broken rule is its own FormatError", "[safetensors][errors]") {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  CHECK(parse_error(ok, 8).empty());
  std::vector<std::pair<std::string, std::string>> cases = {
      {R"([1])", "does not start with '{'"},
      {R"({"a":)", "not valid UTF-8 JSON"},
      {"{\"a\xff\":1}", "not valid UTF-8 JSON"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x)", "not valid UTF-8 JSON"},
      {R"({"a":[]})", "tensor 'a': entry must be an object"},
      {R"({"a":{"shape":[2],"data_offsets":[0,8]}})", "tensor 'a': missing field 'dtype'"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", "tensor 'a': missing field 'shape'"},
      {R"({"a":{"dtype":"F32","shape":[2]}})", "tensor 'a': missing field 'data_offsets'"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", "tensor 'a': unexpected field 'x'"},
      {R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", "field 'dtype' must be a string"},
      {R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", "tensor 'a': unknown dtype 'F31'"},
      {R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", "field 'shape' must be an array"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "shape dimension 0 must be a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", "shape dimension 0 must be a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", "shape dimension 0 must be a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", "element count overflows"},
      {R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", "element count overflows"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", "must be an array [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", "must be non-negative integers"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", "end 0 is before begin 8"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "hold 8 bytes but shape x dtype size is 12"},
      {R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "are out of range (the data has 8 bytes)"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       "overlap tensor 'a'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "leave a hole of 4 bytes at 0"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "4 trailing bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "duplicate tensor name 'a'"},
      {R"({"__metadata__":[1]})", "__metadata__ must be an object"},
      {R"({"__metadata__":{"k":1}})", "__metadata__ value of 'k' must be a string"},
  };
  for (const auto& [header, rule] : cases) {
    INFO(header);
    std::string msg = parse_error(header, 8);
    CHECK_THAT(msg, Catch::Contains(rule) && Catch::Contains("bad.safetensors"));
  }
  // Header size rules.
  CHECK_THAT(parse_error(std::vector<uint8_t>{1, 2, 3}), Catch::Contains("3 bytes, shorter than the 8-byte header size"));
  std::vector<uint8_t> big = file_bytes("{}", 0);
  const uint64_t n = 200'000'000;
  std::memcpy(big.data(), &n, 8);
  CHECK_THAT(parse_error(big), Catch::Contains("beyond the 100 MB limit"));
  const uint64_t m = 64;
  std::memcpy(big.data(), &m, 8);
  CHECK_THAT(parse_error(big), Catch::Contains("header size 64 is beyond the end of the file (10 bytes)"));
  CHECK_THAT(parse_error(file_bytes("", 0)), Catch::Contains("does not start with '{'"));
  // Valid corner cases: an empty object, spaces after it, an empty tensor at the end.
  CHECK(parse_error("{}      ", 0).empty());
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"BOOL","shape":[0],"data_offsets":[8,8]}})", 8)
            .empty());
}

TEST_CASE("safetensors reader: files on disk that are short, truncated or not files", "[safetensors][errors]") {
  TempDir dir;
  io::save_file(dir / "t.safetensors", reference_dtypes());
  fs::resize_file(dir / "t.safetensors", fs::file_size(dir / "t.safetensors") - 1);
  CHECK_THROWS_WITH(io::load_file(dir / "t.safetensors"), Catch::Contains("t.safetensors") && Catch::Contains("out of range"));
  CHECK_THROWS_AS(io::load_file(dir / "t.safetensors"), FormatError);
  { std::ofstream(dir / "e.safetensors"); }
  CHECK_THROWS_WITH(io::load_file(dir / "e.safetensors"), Catch::Contains("0 bytes, shorter than"));
  try {
    io::load_file(dir / "missing.safetensors");
    FAIL("no error");
  } catch (const IOError& e) {
    CHECK_THAT(e.what(), Catch::Contains("missing.safetensors") && Catch::Contains("No such file"));
  }
  CHECK_THROWS_AS(io::load_file(dir.path), IOError);  // a folder
}

TEST_CASE("atomic writes: I/O failures are IOErrors that leave the previous file intact", "[safetensors][errors]") {
  TempDir dir;
  io::TensorList ref = reference_dtypes();
  // A missing folder, and a "folder" that is a file.
  try {
    io::save_file(dir / "no/such/dir/x.safetensors", ref);
    FAIL("no error");
  } catch (const IOError& e) {
    CHECK_THAT(e.what(), Catch::Contains("no/such/dir/x.safetensors") && Catch::Contains("No such file or directory"));
  }
  { std::ofstream(dir / "plain"); }
  CHECK_THROWS_WITH(io::save_file(dir / "plain/x.safetensors", ref), Catch::Contains("Not a directory"));

  // Disk full: a child process under a 64 KiB file-size limit (SIGXFSZ ignored, so write fails
  // with EFBIG) overwrites a good file with a 4 MB one.
  io::save_file(dir / "keep.safetensors", ref);
  io::TensorList big{{"big", Tensor<float>::zeros({1 << 20})}};
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {65536, 65536};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int code = 1;
    try {
      io::save_file(dir / "keep.safetensors", big);
    } catch (const IOError& e) {
      code = std::string(e.what()).find("keep.safetensors") != std::string::npos &&
                     std::string(e.what()).find("File too large") != std::string::npos
                 ? 0
                 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  io::TensorList back = io::load_file(dir / "keep.safetensors");
  CHECK(same_bytes(by_name(back, "i64"), by_name(ref, "i64")));
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir.path)) entries += e.path().filename().string().find(".tmp.") != std::string::npos;
  CHECK(entries == 0);  // the temporary file is gone
}

TEST_CASE("optimizer state file: AdamW state and groups load back bitwise", "[safetensors][optim]") {
  TempDir dir;
  manual_seed(11);
  nn::Linear lin(4, 3);
  optim::AdamW opt(lin.parameters(), {.lr = 1e-2, .weight_decay = 0.05, .amsgrad = true});
  auto x = Tensor<float>::randn({5, 4});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    sum(square(lin(x))).backward();
    opt.step();
  }
  opt.param_groups()[0]["lr"] = 1.0 / 3.0;  // a double that only round-trips with 17 digits
  optim::save_state(opt, dir / "opt.safetensors");
  io::SafetensorsFile f(dir / "opt.safetensors");
  CHECK(f.contains("state.0.exp_avg"));
  CHECK(f.contains("state.1.max_exp_avg_sq"));
  CHECK(f.metadata().at("optimizer") == "AdamW");

  manual_seed(12);
  nn::Linear lin2(4, 3);
  lin2.load_state_dict(lin.state_dict());
  optim::AdamW opt2(lin2.parameters(), {.lr = 5.0});
  optim::load_state(opt2, dir / "opt.safetensors");
  CHECK(opt2.param_groups()[0].options == opt.param_groups()[0].options);
  CHECK(opt2.param_groups()[0].lr() == 1.0 / 3.0);
  optim::OptimizerStateDict a = opt.state_dict(), b = opt2.state_dict();
  REQUIRE(a.state.size() == b.state.size());
  for (auto& [i, st] : a.state) {
    REQUIRE(b.state[i].size() == st.size());
    for (size_t k = 0; k < st.size(); ++k) {
      CHECK(b.state[i][k].first == st[k].first);
      CHECK(same_bytes(b.state[i][k].second, st[k].second));
    }
  }
  // The next step is the same on both.
  for (auto* o : {&opt, &opt2}) o->zero_grad();
  sum(square(lin(x))).backward();
  sum(square(lin2(x))).backward();
  opt.step();
  opt2.step();
  CHECK(same_bytes(lin.weight, lin2.weight));

  optim::SGD sgd(lin2.parameters());
  CHECK_THROWS_WITH(optim::load_state(sgd, dir / "opt.safetensors"), Catch::Contains("AdamW optimizer, not of a SGD"));
  lin.save(dir / "model.safetensors");
  CHECK_THROWS_WITH(optim::load_state(opt2, dir / "model.safetensors"), Catch::Contains("has no 'format'"));
}

TEST_CASE("safetensors interop, live: the Python package reads what ember writes, ember reads what it writes",
          "[safetensors][interop][python]") {
  const std::string py = EMBER_PYTHON_EXE;
  if (py.empty()) {
    std::printf("SKIPPED: no Python interpreter configured (EMBER_PYTHON)\n");
    return;
  }
  TempDir dir;
  io::save_file(dir / "ember_dtypes.safetensors", reference_dtypes(),
                {{"writer", "ember"}, {"note", "quotes \" and unicode \xc3\xa9"}});
  const int64_t kBig = 3 * (1 << 20) / 4 * 4;
  auto big = Tensor<float>::arange(0.0, static_cast<double>(kBig));
  big = big * 0.5f;
  auto big_i64 = Tensor<int64_t>::arange(0.0, static_cast<double>(kBig / 4)) - int64_t{5};
  io::save_file(dir / "ember_big.safetensors", {{"big", big}, {"big_i64", big_i64}});

  const std::string cmd = "'" + py + "' '" + EMBER_SOURCE_DIR + "/tests/interop/check_ember_files.py' '" +
                          dir.path.string() + "' 2>&1";
  const auto [out, rc] = testing::run_command(cmd);
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127) {  // the shell found no such interpreter
    std::printf("SKIPPED: the configured Python '%s' cannot be run: %s\n", py.c_str(), out.c_str());
    return;
  }
  if (out.find("SKIPPED: ") != std::string::npos) {
    std::printf("%s", out.c_str());
    return;
  }
  INFO(out);
  REQUIRE(rc == 0);
  REQUIRE(out.find("OK") != std::string::npos);
  io::SafetensorsFile f(dir / "python_big.safetensors");
  CHECK(f.metadata().at("writer") == "python");
  std::vector<float> v = Tensor<float>(f.get("big")).to_vector();
  REQUIRE(v.size() == static_cast<size_t>(kBig));
  bool ok = true;
  for (int64_t i = 0; i < kBig; ++i) ok = ok && v[static_cast<size_t>(i)] == static_cast<float>(i) * -0.25f;
  CHECK(ok);
  CHECK(Tensor<int32_t>(f.get("small")).to_vector() == std::vector<int32_t>{1, 2, 3});
}
