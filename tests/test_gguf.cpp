// GGUF (include/ember/io/gguf.hpp, io/gguf_format.hpp) and the GPT export to llama.cpp's gpt2
// (include/ember/deploy/gguf_export.hpp): the writer's bytes against hand-computed ones, every value
// and tensor type through ember's reader, Q8_0 against known blocks and its error bound, the reader
// on truncated and malformed files, the export's names, ggml dimensions, types and bytes, and
// gguf-py (llama.cpp's own Python package) reading ember's files bit-exact and writing one for
// ember (tests/interop/check_gguf.py; without the `gguf` package those cases print SKIPPED).
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ember/deploy/gguf_export.hpp"
#include "ember/ember.hpp"
#include "ember/nn/gpt.hpp"
#include "ember/io/safetensors.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::message_of;
namespace gg = ember::io::gguf;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using gg::GGMLType;
using gg::Value;

namespace {

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("ember-gguf") {}
};


// Little-endian pieces of a hand-built file.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& raw(const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

gg::Contents parse(const std::vector<uint8_t>& b, const char* name = "x.gguf") {
  return gg::parse_gguf(b.data(), b.size(), name);
}
std::string parse_error(const std::vector<uint8_t>& b) {
  try {
    parse(b);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no FormatError)";
}

// The tiny file of the first test: two values, an F32 [2, 3] and a Q8_0 [1, 32] tensor.
gg::Writer tiny_writer(std::vector<float>& f32, std::vector<uint8_t>& q8) {
  f32 = {0, 1, 2, 3, 4, 5};
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(127 - 8 * j);  // max |x| = 127: d = 1
  q8.resize(34);
  gg::quantize_q8_0(x.data(), 32, q8.data());
  gg::Writer w;
  w.add("a.b", Value::of<uint32_t>(7)).add("s", Value::string("hi"));
  w.add_tensor("t", {2, 3}, GGMLType::F32, f32.data());
  w.add_tensor("q", {1, 32}, GGMLType::Q8_0, q8.data());
  return w;
}

// Runs tests/interop/check_gguf.py with `args`; nothing (and prints SKIPPED) without Python or gguf.
std::optional<std::string> run_python(const std::string& args, int& rc) {
  const std::string py = EMBER_PYTHON_EXE;
  if (py.empty()) {
    std::printf("SKIPPED: no Python interpreter configured (EMBER_PYTHON)\n");
    return std::nullopt;
  }
  const std::string cmd = "'" + py + "' '" + EMBER_SOURCE_DIR + "/tests/interop/check_gguf.py' " + args + " 2>&1";
  const auto [out, status] = testing::run_command(cmd);
  rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 127 || out.find("SKIPPED: ") != std::string::npos) {
    std::printf("SKIPPED: %s\n", out.c_str());
    return std::nullopt;
  }
  return out;
}

// A GPT with every parameter drawn at random (biases and norms too, so that a swap shows).
std::shared_ptr<nn::GPT> tiny_gpt(const nn::GPTConfig& cfg, uint64_t seed) {
  auto m = std::make_shared<nn::GPT>(cfg);
  Generator gen(seed);
  for (auto& [name, p] : m->named_parameters()) nn::init::normal_(p, 0.0, 0.5, gen);
  return m;
}
nn::GPTConfig tiny_config() { return {.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32}; }

// llama.cpp's gpt2 names for ember's parameters, written out here once more (independently of
// deploy/gguf_export.hpp) since this mapping is what the test checks.
std::vector<std::pair<std::string, AnyTensor>> gpt2_tensors(const nn::GPT& m) {
  std::vector<std::pair<std::string, AnyTensor>> out = {{"token_embd.weight", m.wte->weight},
                                                        {"position_embd.weight", m.wpe->weight}};
  auto bias = [](const AnyTensor& b, int64_t n) { return b.defined() ? b : AnyTensor::zeros({n}, DType::Float32); };
  const int64_t E = m.config().n_embd;
  for (size_t i = 0; i < m.blocks().size(); ++i) {
    const auto& b = *m.blocks()[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    const int64_t F = b.mlp->c_fc->weight.shape()[0];
    out.insert(out.end(), {{p + "attn_norm.weight", b.ln_1->weight},
                           {p + "attn_norm.bias", bias(b.ln_1->bias, E)},
                           {p + "attn_qkv.weight", b.attn->in_proj_weight},
                           {p + "attn_qkv.bias", bias(b.attn->in_proj_bias, 3 * E)},
                           {p + "attn_output.weight", b.attn->out_proj->weight},
                           {p + "attn_output.bias", bias(b.attn->out_proj->bias, E)},
                           {p + "ffn_norm.weight", b.ln_2->weight},
                           {p + "ffn_norm.bias", bias(b.ln_2->bias, E)},
                           {p + "ffn_up.weight", b.mlp->c_fc->weight},
                           {p + "ffn_up.bias", bias(b.mlp->c_fc->bias, F)},
                           {p + "ffn_down.weight", b.mlp->c_proj->weight},
                           {p + "ffn_down.bias", bias(b.mlp->c_proj->bias, E)}});
  }
  out.insert(out.end(), {{"output_norm.weight", m.ln_f->weight}, {"output_norm.bias", bias(m.ln_f->bias, E)}});
  return out;
}
// The converter's type rule: 1-D tensors and position_embd F32; 2-D weights `type`; Q8_0 rows
// that are no multiple of 32 F16.
GGMLType expected_type(const std::string& name, const AnyTensor& t, GGMLType type) {
  if (t.dim() != 2 || name == "position_embd.weight") return GGMLType::F32;
  return type == GGMLType::Q8_0 && t.shape()[1] % 32 != 0 ? GGMLType::F16 : type;
}
// The bytes of `t` as `type`, computed directly (not through the writer).
std::vector<uint8_t> expected_bytes(const AnyTensor& t, GGMLType type) {
  const std::vector<float> v = Tensor<float>(t.to(DType::Float32)).to_vector();
  std::vector<uint8_t> out;
  if (type == GGMLType::F32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else if (type == GGMLType::F16) {
    for (float x : v) {
      const uint16_t h = half(x).bits;
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
  } else {
    out.resize(v.size() / 32 * 34);
    gg::quantize_q8_0(v.data(), static_cast<int64_t>(v.size()), out.data());
  }
  return out;
}

// What check_gguf.py is told to expect of <dir>/<stem>.gguf.
struct Expect {
  gg::KeyValues metadata;
  std::vector<gg::TensorInfo> tensors;
  uint32_t alignment = 32;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bytes;
  io::TensorList sources;  // float32, row-major
};
nlohmann::json value_json(const Value& v) {
  using VT = gg::ValueType;
  auto scalar = [](VT t, auto get) -> nlohmann::json {
    switch (t) {
      case VT::UInt8: return get(uint8_t{});
      case VT::Int8: return get(int8_t{});
      case VT::UInt16: return get(uint16_t{});
      case VT::Int16: return get(int16_t{});
      case VT::UInt32: return get(uint32_t{});
      case VT::Int32: return get(int32_t{});
      case VT::Float32: return static_cast<double>(get(float{}));
      case VT::Bool: return get(bool{});
      case VT::UInt64: return get(uint64_t{});
      case VT::Int64: return get(int64_t{});
      default: return get(double{});
    }
  };
  if (v.type() == VT::String) return v.str();
  if (v.type() != VT::Array) return scalar(v.type(), [&](auto x) { return v.get<decltype(x)>(); });
  if (v.element_type() == VT::String) return v.strings();
  nlohmann::json a = nlohmann::json::array();
  for (size_t i = 0; i < v.size(); ++i)
    a.push_back(scalar(v.element_type(), [&](auto x) { return v.array<decltype(x)>()[i]; }));
  return a;
}
void write_expect(const fs::path& dir, const std::string& stem, const Expect& e) {
  nlohmann::json j;
  j["alignment"] = e.alignment;
  j["metadata"] = nlohmann::json::array();
  for (const auto& kv : e.metadata) {
    nlohmann::json m = {{"key", kv.key}, {"type", gg::value_type_name(kv.value.type())}, {"value", value_json(kv.value)}};
    if (kv.value.type() == gg::ValueType::Array) m["element"] = gg::value_type_name(kv.value.element_type());
    j["metadata"].push_back(m);
  }
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : e.tensors)
    j["tensors"].push_back({{"name", t.name}, {"type", gg::type_name(t.type)}, {"ne", t.ne}, {"offset", t.offset}});
  std::ofstream(dir / (stem + ".expect.json")) << j.dump();
  io::TensorList bytes;
  for (const auto& [name, b] : e.bytes)
    bytes.emplace_back(name, Tensor<uint8_t>::from_vector(b, {static_cast<int64_t>(b.size())}));
  if (!bytes.empty()) io::save_file(dir / (stem + ".bytes.safetensors"), bytes);
  if (!e.sources.empty()) io::save_file(dir / (stem + ".sources.safetensors"), e.sources);
}
// Exports `m` to <dir>/<stem>.gguf and writes what check_gguf.py must find in it.
gg::GPTExportResult export_case(const fs::path& dir, const std::string& stem, const nn::GPT& m,
                                const gg::GPTExportOptions& o) {
  const gg::GPTExportResult r = gg::export_gpt(m, dir / (stem + ".gguf"), o);
  Expect e{r.metadata, r.tensors, o.alignment, {}, {}};
  for (const auto& [name, t] : gpt2_tensors(m)) {
    e.bytes.emplace_back(name, expected_bytes(t, expected_type(name, t, o.type)));
    e.sources.emplace_back(name, t.to(DType::Float32).clone());
  }
  write_expect(dir, stem, e);
  // ember's logits with the weights as the file stores them (dequantized), for check_gguf.py to
  // match with llama.cpp's gpt2 graph run on the file.
  gg::GGUFFile f(dir / (stem + ".gguf"));
  nn::GPT same(m.config());
  {
    NoGradGuard no_grad;
    for (auto& [name, t] : gpt2_tensors(same))
      if (f.contents().tensor(name)) t.copy_(f.get(name).to(DType::Float32));
  }
  same.eval();
  const int64_t L = m.config().block_size, V = m.config().vocab_size;
  std::vector<int64_t> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) ids[static_cast<size_t>(i)] = (i * 7 + 3) % V;
  const Tensor<int64_t> idt = Tensor<int64_t>::from_vector(ids, {1, L});
  NoGradGuard no_grad;
  const Tensor<float> logits = same(idt).reshape({L, V});
  io::save_file(dir / (stem + ".logits.safetensors"), {{"ids", idt.reshape({L}).clone()}, {"logits", logits.clone()}},
                {{"atol", "1e-4"}});
  return r;
}

}  // namespace

TEST_CASE("gguf writer: a tiny file's bytes are the hand-computed ones", "[gguf][format]") {
  std::vector<float> f32;
  std::vector<uint8_t> q8;
  const std::vector<uint8_t> got = tiny_writer(f32, q8).serialize();
  Bytes e;
  e.raw("GGUF", 4).u32(3).u64(2).u64(2);          // magic, version 3, 2 tensors, 2 key/values (24 bytes)
  e.str("a.b").u32(4).u32(7);                     // UINT32 = 4                                    (43)
  e.str("s").u32(8).str("hi");                    // STRING = 8                                    (66)
  e.str("t").u32(2).u64(3).u64(2).u32(0).u64(0);  // [2, 3] row-major is ne {3, 2}; F32 = 0; at 0 (107)
  e.str("q").u32(2).u64(32).u64(1).u32(8).u64(32);  // Q8_0 = 8, at 32: t's 24 bytes padded to 32 (148)
  e.zeros(12);                                    // to 160, the next multiple of 32
  e.raw(f32.data(), 24).zeros(8);                 // t, padded to 32
  const uint8_t d_one[2] = {0x00, 0x3c};          // fp16 1.0: max |x| = 127 makes d = 1
  e.raw(d_one, 2);
  for (int j = 0; j < 32; ++j) {
    const auto q = static_cast<int8_t>(127 - 8 * j);  // q = x / d = x
    e.raw(&q, 1);
  }
  e.zeros(30);                                    // q's 34 bytes padded to 64: 256 in all
  REQUIRE(e.b.size() == 256);
  CHECK(got.size() == 256);
  CHECK(got == e.b);
  CHECK(tiny_writer(f32, q8).file_size() == 256);
  CHECK(tiny_writer(f32, q8).data_start() == 160);

  const gg::Contents c = parse(got);
  CHECK(c.version == 3);
  CHECK(c.data_start == 160);
  REQUIRE(c.tensors.size() == 2);
  CHECK(c.tensors[1].name == "q");
  CHECK(c.tensors[1].offset == 32);
  CHECK(c.tensors[1].nbytes == 34);
  CHECK(c.tensors[1].shape() == std::vector<int64_t>{1, 32});
}

TEST_CASE("gguf writer: every value type and tensor type round-trips through ember's reader, alignment 64",
          "[gguf][format]") {
  const std::vector<float> vals = {1.5f, -2.25f, 3.0f, 0.0f};
  const uint16_t h[4] = {half(1.5f).bits, half(-2.25f).bits, half(3.0f).bits, 0};
  gg::Writer w;
  w.add("general.alignment", Value::of<uint32_t>(64))
      .add("u8", Value::of<uint8_t>(200)).add("i8", Value::of<int8_t>(-100))
      .add("u16", Value::of<uint16_t>(60000)).add("i16", Value::of<int16_t>(-30000))
      .add("u32", Value::of<uint32_t>(4000000000u)).add("i32", Value::of<int32_t>(-2000000000))
      .add("f32", Value::of(0.1f)).add("bool", Value::of(true))
      .add("u64", Value::of<uint64_t>(uint64_t{1} << 63)).add("i64", Value::of<int64_t>(-(int64_t{1} << 62)))
      .add("f64", Value::of(0.1)).add("str", Value::string(std::string("a\0b", 3)))
      .add("strs", Value::array(std::vector<std::string>{"x", "", "yz"}))
      .add("ints", Value::array(std::vector<int32_t>{1, -2, 3})).add("floats", Value::array(std::vector<float>{0.5f, -1.0f}))
      .add("bools", Value::array(std::vector<bool>{true, false, true}))
      .add("empty", Value::array(std::vector<uint64_t>{}));
  w.add_tensor("f32", {4}, GGMLType::F32, vals.data());
  w.add_tensor("f16", {2, 2}, GGMLType::F16, h);
  w.add_tensor("z", {0, 3}, GGMLType::F32, static_cast<const void*>(nullptr));  // no elements, still an entry
  const std::vector<uint8_t> bytes = w.serialize();
  CHECK(bytes.size() == w.file_size());
  const gg::Contents c = parse(bytes);
  CHECK(c.alignment == 64);
  CHECK(c.data_start % 64 == 0);
  REQUIRE(c.metadata.size() == 18);
  CHECK(c.find("u8")->get<uint8_t>() == 200);
  CHECK(c.find("i8")->get<int8_t>() == -100);
  CHECK(c.find("u16")->get<uint16_t>() == 60000);
  CHECK(c.find("i16")->get<int16_t>() == -30000);
  CHECK(c.find("u32")->get<uint32_t>() == 4000000000u);
  CHECK(c.find("i32")->get<int32_t>() == -2000000000);
  CHECK(c.find("f32")->get<float>() == 0.1f);
  CHECK(c.find("bool")->get<bool>());
  CHECK(c.find("u64")->get<uint64_t>() == uint64_t{1} << 63);
  CHECK(c.find("i64")->get<int64_t>() == -(int64_t{1} << 62));
  CHECK(c.find("f64")->get<double>() == 0.1);
  CHECK(c.find("str")->str() == std::string("a\0b", 3));
  CHECK(c.find("strs")->strings() == std::vector<std::string>{"x", "", "yz"});
  CHECK(c.find("ints")->array<int32_t>() == std::vector<int32_t>{1, -2, 3});
  CHECK(c.find("floats")->array<float>() == std::vector<float>{0.5f, -1.0f});
  CHECK(c.find("bools")->array<bool>() == std::vector<bool>{true, false, true});
  CHECK(c.find("empty")->size() == 0);
  CHECK(c.find("empty")->element_type() == gg::ValueType::UInt64);
  CHECK_THROWS_WITH(c.find("u32")->get<int32_t>(), Contains("holds UINT32, not INT32"));
  CHECK_THROWS_WITH(c.find("ints")->array<float>(), Contains("ARRAY of INT32"));
  REQUIRE(c.tensors.size() == 3);
  CHECK(c.tensors[0].offset == 0);
  CHECK(c.tensors[1].offset == 64);  // 16 bytes padded to 64
  CHECK(c.tensors[1].ne == std::vector<int64_t>{2, 2});
  CHECK(c.tensors[2].nbytes == 0);
  CHECK(std::memcmp(bytes.data() + c.data_start + 64, h, 8) == 0);
  CHECK(std::memcmp(bytes.data() + c.data_start, vals.data(), 16) == 0);
}

TEST_CASE("gguf Q8_0: known blocks, ties away from zero, the fp16 scale", "[gguf][q8_0]") {
  auto quantize = [](const std::vector<float>& x) {
    std::vector<uint8_t> out(34);
    gg::quantize_q8_0(x.data(), 32, out.data());
    return out;
  };
  auto scale_bits = [](const std::vector<uint8_t>& b) { return static_cast<uint16_t>(b[0] | (b[1] << 8)); };
  auto q = [](const std::vector<uint8_t>& b, int j) { return static_cast<int8_t>(b[static_cast<size_t>(2 + j)]); };

  // max |x| = 254: d = 2, 1/d = 0.5 exactly, so x * (1/d) lands on .5 for odd x: roundf takes
  // those away from zero (1 -> 1, 3 -> 2, -1 -> -1, -3 -> -2); round-half-even would give 0 and 2.
  std::vector<float> x(32, 0.0f);
  x[0] = 254, x[1] = 1, x[2] = 3, x[3] = -1, x[4] = -3, x[5] = -254, x[6] = 5, x[7] = 2;
  auto b = quantize(x);
  CHECK(scale_bits(b) == 0x4000);  // fp16 2.0
  CHECK(q(b, 0) == 127);
  CHECK(q(b, 1) == 1);
  CHECK(q(b, 2) == 2);
  CHECK(q(b, 3) == -1);
  CHECK(q(b, 4) == -2);
  CHECK(q(b, 5) == -127);
  CHECK(q(b, 6) == 3);
  CHECK(q(b, 7) == 1);
  CHECK(q(b, 8) == 0);

  // max |x| = 12.7: d = 12.7f / 127 (float), stored as fp16 0x2E66 (0.0999755859375), and x = k / 10
  // quantizes to k.
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j * 8 - 127) / 10.0f;
  x[31] = 12.7f;
  b = quantize(x);
  CHECK(scale_bits(b) == 0x2E66);
  for (int j = 0; j < 31; ++j) CHECK(q(b, j) == j * 8 - 127);
  CHECK(q(b, 31) == 127);

  // All zeros: d = 0, every q = 0 (ggml's id = 0 branch).
  b = quantize(std::vector<float>(32, 0.0f));
  CHECK(b == std::vector<uint8_t>(34, 0));

  // Dequantized: fp16(d) * q.
  std::vector<float> y(32);
  x.assign(32, 0.0f);
  x[0] = -254, x[1] = 7;
  b = quantize(x);
  gg::dequantize_q8_0(b.data(), 32, y.data());
  CHECK(y[0] == -254.0f);
  CHECK(y[1] == 8.0f);  // 7 * 0.5 = 3.5 -> 4 (away from zero) -> 4 * 2
  CHECK(y[2] == 0.0f);
}

TEST_CASE("gguf Q8_0: dequantized values stay within d/2 + 127 |fp16(d) - d|, and the bound is nearly reached",
          "[gguf][q8_0]") {
  const int64_t n = 32 * 4096;
  Generator gen(5);
  std::vector<float> x = Tensor<float>::randn({n}, Device::cpu(), 0.0, 1.0, gen).to_vector();
  for (int64_t i = 0; i < n; i += 32 * 7) x[static_cast<size_t>(i)] *= 1000.0f;  // some blocks with one large value
  std::vector<uint8_t> b(static_cast<size_t>(n / 32 * 34));
  gg::quantize_q8_0(x.data(), n, b.data());
  std::vector<float> y(static_cast<size_t>(n));
  gg::dequantize_q8_0(b.data(), n, y.data());
  double worst_ratio = 0;  // error / bound, over all values
  for (int64_t blk = 0; blk < n / 32; ++blk) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[static_cast<size_t>(blk * 32 + j)]));
    const double d = amax / 127.0f, d16 = half(static_cast<float>(d));
    const double bound = d / 2 + 127 * std::fabs(d16 - d) + 1e-12;
    for (int j = 0; j < 32; ++j) {
      const size_t i = static_cast<size_t>(blk * 32 + j);
      const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
      CHECK(err <= bound);
      worst_ratio = std::max(worst_ratio, err / bound);
    }
    // The scale's own rounding is at most half an fp16 ulp: 2^-11 of d (d is a normal fp16 here).
    CHECK(std::fabs(d16 - d) <= d * std::ldexp(1.0, -11));
  }
  CHECK(worst_ratio > 0.9);  // the bound is not loose: some value comes within 10% of it
}

TEST_CASE("gguf Q8_0: refuses lengths no multiple of 32 and non-finite values", "[gguf][q8_0]") {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> b(68);
  CHECK_THROWS_WITH(gg::quantize_q8_0(x.data(), 33, b.data()), Contains("blocks of 32 values, got 33"));
  x[40] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(gg::quantize_q8_0(x.data(), 64, b.data(), "w"), ValueError);
  CHECK_THROWS_WITH(gg::quantize_q8_0(x.data(), 64, b.data(), "w"), Contains("w: value 40 is inf"));
  x[40] = std::nanf("");
  CHECK_THROWS_WITH(gg::quantize_q8_0(x.data(), 64, b.data(), "w"), Contains("value 40 is nan"));
}

TEST_CASE("gguf reader: every truncation that cuts a header or tensor data is a FormatError naming the file and offset",
          "[gguf][reader]") {
  std::vector<float> f32;
  std::vector<uint8_t> q8;
  const std::vector<uint8_t> full = tiny_writer(f32, q8).serialize();
  const size_t data_end = 160 + 32 + 34;  // q's data ends at 226; the rest is padding
  int failures = 0;
  for (size_t n = 0; n < data_end; ++n) {
    const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string msg = parse_error(cut);
    INFO("prefix of " << n << " bytes: " << msg);
    CHECK_THAT(msg, Contains("gguf file 'x.gguf' at offset "));
    failures += msg.find("(no FormatError)") == std::string::npos;
  }
  CHECK(failures == static_cast<int>(data_end));
  // The trailing padding is not data: files cut inside it still hold every tensor.
  for (size_t n = data_end; n <= full.size(); ++n)
    CHECK_NOTHROW(parse(std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n))));
  CHECK_THAT(parse_error({}), Contains("at offset 0: the magic 'GGUF' needs 4 bytes, but the file has 0 left"));
  CHECK_THAT(parse_error(std::vector<uint8_t>(full.begin(), full.begin() + 30)),
             Contains("at offset 16: a metadata count of 2 cannot fit in the file"));
  CHECK_THAT(parse_error(std::vector<uint8_t>(full.begin(), full.begin() + 60)),
             Contains("at offset 56: a string value needs 8 bytes, but the file has 4 left"));
}

TEST_CASE("gguf reader: malformed headers, values and tensor infos are FormatErrors saying what and where",
          "[gguf][reader]") {
  std::vector<float> f32;
  std::vector<uint8_t> q8;
  const std::vector<uint8_t> good = tiny_writer(f32, q8).serialize();
  auto patched = [&](size_t at, std::vector<uint8_t> with) {
    std::vector<uint8_t> b = good;
    std::copy(with.begin(), with.end(), b.begin() + static_cast<std::ptrdiff_t>(at));
    return b;
  };
  CHECK_THAT(parse_error(patched(0, {'G', 'G', 'U', 'X'})), Contains("at offset 0: not a GGUF file"));
  CHECK_THAT(parse_error(patched(4, {1, 0, 0, 0})), Contains("at offset 4: version 1; ember reads versions 2 and 3"));
  CHECK_THAT(parse_error(patched(4, {0, 0, 0, 3})), Contains("big-endian"));
  CHECK_THAT(parse_error(patched(16, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})),
             Contains("at offset 16: a metadata count of 9223372036854775807 cannot fit"));
  CHECK_THAT(parse_error(patched(8, {0, 0, 0, 0, 1, 0, 0, 0})), Contains("at offset 8: a tensor count of 4294967296"));
  CHECK_THAT(parse_error(patched(24, {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})),
             Contains("at offset 32: a metadata key needs 4294967295 bytes"));
  // The layout (first test): "a.b"'s type at 35; "s"'s string length at 56; tensor "t"'s info at 66
  // (n_dims at 75, ne at 79 and 87, type at 95), "q"'s at 107 (name at 115, ne[0] at 120, offset at 140).
  CHECK_THAT(parse_error(patched(35, {13, 0, 0, 0})), Contains("at offset 35: value type 13 is no GGUF value type"));
  CHECK_THAT(parse_error(patched(56, {0xe8, 0x03})), Contains("at offset 64: a string value needs 1000 bytes"));
  CHECK_THAT(parse_error(patched(95, {4, 0, 0, 0})), Contains("at offset 66: tensor 't' has type 4, which is no ggml type"));
  CHECK_THAT(parse_error(patched(140, {16})),
             Contains("at offset 107: tensor 'q' has offset 16, not a multiple of the alignment 32"));
  CHECK_THAT(parse_error(patched(140, {0})), Contains("at offset 107: the data of tensors 't' and 'q' overlap"));
  CHECK_THAT(parse_error(patched(140, {0, 1})), Contains("tensor 'q' takes bytes 256 to 290 of the data, which has 96"));
  CHECK_THAT(parse_error(patched(120, {31})), Contains("tensor 'q' has rows of 31 values; Q8_0 stores blocks of 32"));
  CHECK_THAT(parse_error(patched(75, {5})), Contains("at offset 66: tensor 't' has 5 dimensions; ggml holds at most 4"));
  CHECK_THAT(parse_error(patched(87, {0, 0, 0, 0, 0, 0, 0, 0x80})), Contains("tensor 't' has more elements than int64 counts"));
  CHECK_THAT(parse_error(patched(115, {'t'})), Contains("at offset 107: the tensor name 't' appears twice"));
  Bytes dup;
  dup.raw("GGUF", 4).u32(3).u64(0).u64(2).str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  CHECK_THAT(parse_error(dup.b), Contains("at offset 41: the key 'k' appears twice"));

  // Values the writer refuses to make, built by hand: a BOOL of 2, a nested array, an oversized
  // array, general.alignment of the wrong type or not a power of two, a 64-byte tensor name.
  auto one_kv = [](const std::string& key, auto&& value) {
    Bytes b;
    b.raw("GGUF", 4).u32(3).u64(0).u64(1).str(key);
    value(b);
    return b.b;
  };
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(7).raw("\x02", 1); })), Contains("a BOOL is 2, not 0 or 1"));
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(9).u32(7).u64(2).raw("\x01\x05", 2); })),
             Contains("element 1 of a BOOL array is 5"));
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(9).u32(9).u64(1); })), Contains("nested arrays are not supported"));
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(9).u32(8).u64(uint64_t{1} << 60); })),
             Contains("an array of 1152921504606846976 strings cannot fit"));
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(9).u32(10).u64(1000); })),
             Contains("an array of 1000 UINT64 cannot fit"));
  CHECK_THAT(parse_error(one_kv("k", [](Bytes& b) { b.u32(9).u32(42).u64(1); })),
             Contains("array element type 42 is no GGUF value type"));
  CHECK_THAT(parse_error(one_kv("general.alignment", [](Bytes& b) { b.u32(10).u64(32); })),
             Contains("general.alignment is UINT64, not UINT32"));
  CHECK_THAT(parse_error(one_kv("general.alignment", [](Bytes& b) { b.u32(4).u32(48); })),
             Contains("general.alignment 48 is not a power of two"));
  Bytes long_name;
  long_name.raw("GGUF", 4).u32(3).u64(1).u64(0).str(std::string(64, 'n')).u32(1).u64(1).u32(0).u64(0).zeros(64);
  CHECK_THAT(parse_error(long_name.b), Contains("has 64 bytes; ggml allows 63"));
  // Version 2 (same layout) is read, as gguf-py does.
  CHECK_NOTHROW(parse(patched(4, {2, 0, 0, 0})));
}

TEST_CASE("gguf reader: GGUFFile maps a file, decodes its tensors, and refuses a missing file or a folder",
          "[gguf][reader]") {
  TempDir dir;
  std::vector<float> f32;
  std::vector<uint8_t> q8;
  tiny_writer(f32, q8).write(dir.path / "tiny.gguf");
  gg::GGUFFile f(dir.path / "tiny.gguf");
  CHECK(f.file_size() == 256);
  CHECK(f.value("a.b").get<uint32_t>() == 7);
  CHECK(f.value("s").str() == "hi");
  CHECK_THROWS_WITH(f.value("nope"), Contains("has no metadata key 'nope'"));
  const Tensor<float> t(f.get("t"));
  CHECK(t.shape().vec() == std::vector<int64_t>{2, 3});
  CHECK(t.to_vector() == f32);
  const Tensor<float> q(f.get("q"));
  CHECK(q.shape().vec() == std::vector<int64_t>{1, 32});
  const std::vector<float> qv = q.to_vector();
  for (int j = 0; j < 32; ++j) CHECK(qv[static_cast<size_t>(j)] == static_cast<float>(127 - 8 * j));
  CHECK(std::memcmp(f.data("q"), q8.data(), 34) == 0);
  CHECK_THROWS_WITH(f.get("x"), Contains("has no tensor 'x'"));
  CHECK_THROWS_AS(gg::GGUFFile(dir.path / "missing.gguf"), IOError);
  CHECK_THROWS_WITH(gg::GGUFFile(dir.path / "missing.gguf"), Contains("missing.gguf"));
  CHECK_THROWS_WITH(gg::GGUFFile(dir.path), Contains("not a regular file"));
  std::ofstream(dir.path / "junk.gguf") << "junk";
  CHECK_THROWS_AS(gg::GGUFFile(dir.path / "junk.gguf"), FormatError);
  CHECK_THROWS_WITH(gg::GGUFFile(dir.path / "junk.gguf"), Contains("junk.gguf' at offset 0: not a GGUF file"));
}

TEST_CASE("gguf export: a tiny nn::GPT in F32, F16 and Q8_0 has llama.cpp's gpt2 names, ggml dims, types and bytes",
          "[gguf][export]") {
  TempDir dir;
  const auto m = tiny_gpt(tiny_config(), 11);
  const auto expected = gpt2_tensors(*m);
  REQUIRE(expected.size() == 2 + 2 * 12 + 2);
  for (GGMLType type : {GGMLType::F32, GGMLType::F16, GGMLType::Q8_0}) {
    INFO("type " << gg::type_name(type));
    const fs::path path = dir.path / (std::string(gg::type_name(type)) + ".gguf");
    const gg::GPTExportResult r = gg::export_gpt(*m, path, {.type = type, .name = "tiny"});
    CHECK(r.file_bytes == fs::file_size(path));
    gg::GGUFFile f(path);
    CHECK(f.value("general.architecture").str() == "gpt2");
    CHECK(f.value("general.name").str() == "tiny");
    CHECK(f.value("general.alignment").get<uint32_t>() == 32);
    CHECK(f.value("gpt2.context_length").get<uint32_t>() == 16);
    CHECK(f.value("gpt2.embedding_length").get<uint32_t>() == 32);
    CHECK(f.value("gpt2.feed_forward_length").get<uint32_t>() == 128);
    CHECK(f.value("gpt2.block_count").get<uint32_t>() == 2);
    CHECK(f.value("gpt2.attention.head_count").get<uint32_t>() == 2);
    CHECK(f.value("gpt2.attention.layer_norm_epsilon").get<float>() == 1e-5f);
    CHECK(f.value("general.file_type").get<uint32_t>() == (type == GGMLType::F32 ? 0u : type == GGMLType::F16 ? 1u : 7u));
    CHECK(f.value("general.quantization_version").get<uint32_t>() == 2);
    CHECK(f.value("gpt2.vocab_size").get<uint32_t>() == 64);
    CHECK(f.value("tokenizer.ggml.model").str() == "none");
    CHECK(f.metadata().size() == 13);
    REQUIRE(f.tensors().size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& [name, src] = expected[i];
      const gg::TensorInfo& t = f.tensors()[i];
      INFO("tensor " << name);
      CHECK(t.name == name);
      const std::vector<int64_t> shape = src.shape().vec();
      CHECK(t.ne == std::vector<int64_t>(shape.rbegin(), shape.rend()));  // ggml order
      CHECK(t.type == expected_type(name, src, type));
      const std::vector<uint8_t> want = expected_bytes(src, t.type);
      REQUIRE(t.nbytes == want.size());
      CHECK(std::memcmp(f.data(name), want.data(), want.size()) == 0);
      CHECK(t.offset % 32 == 0);
    }
    // The weights that get the file's type, and those that stay F32 whatever it is.
    CHECK(f.info("blk.1.ffn_down.weight").type == type);
    CHECK(f.info("token_embd.weight").type == type);
    CHECK(f.info("position_embd.weight").type == GGMLType::F32);
    CHECK(f.info("blk.0.attn_qkv.bias").type == GGMLType::F32);
    CHECK(f.info("blk.0.attn_qkv.weight").ne == std::vector<int64_t>{32, 96});
    CHECK(f.info("blk.0.ffn_up.weight").ne == std::vector<int64_t>{32, 128});
    CHECK(f.info("blk.0.ffn_down.weight").ne == std::vector<int64_t>{128, 32});
    CHECK_FALSE(f.contents().tensor("output.weight"));  // tied: llama.cpp reuses token_embd.weight
    // Read back through get(): F32 exactly, F16 as the rounded halves, Q8_0 within its bound.
    const std::vector<float> w = Tensor<float>(m->blocks()[1]->attn->out_proj->weight).to_vector();
    const std::vector<float> back = Tensor<float>(f.get("blk.1.attn_output.weight").to(DType::Float32)).to_vector();
    REQUIRE(back.size() == w.size());
    double worst = 0;
    for (size_t k = 0; k < w.size(); ++k) worst = std::max(worst, std::fabs(static_cast<double>(back[k]) - w[k]));
    if (type == GGMLType::F32) CHECK(worst == 0.0);
    if (type == GGMLType::F16) CHECK(worst < 1e-3);
    if (type == GGMLType::Q8_0) CHECK((worst > 0 && worst < 0.02));
  }
  // Sizes: F16 and Q8_0 shrink the 2-D weights to 1/2 and 34/128 of F32.
  const auto size = [&](const char* t) { return fs::file_size(dir.path / (std::string(t) + ".gguf")); };
  CHECK(size("F16") < size("F32") * 0.6);
  CHECK(size("Q8_0") < size("F16") * 0.7);
}

TEST_CASE("gguf export: Q8_0 falls back to F16 (or F32) for rows no multiple of 32, a bias-free GPT gets zero biases, "
          "a tokenizer section",
          "[gguf][export]") {
  TempDir dir;
  // n_embd 40: every matrix with rows of 40 falls back; ffn_down's rows are 160 = 5 * 32.
  const auto m = tiny_gpt({.vocab_size = 50, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 40}, 12);
  gg::export_gpt(*m, dir.path / "a.gguf", {.type = GGMLType::Q8_0});
  gg::GGUFFile a(dir.path / "a.gguf");
  CHECK(a.info("token_embd.weight").type == GGMLType::F16);
  CHECK(a.info("blk.0.attn_qkv.weight").type == GGMLType::F16);
  CHECK(a.info("blk.0.ffn_up.weight").type == GGMLType::F16);
  CHECK(a.info("blk.0.ffn_down.weight").type == GGMLType::Q8_0);
  gg::export_gpt(*m, dir.path / "b.gguf", {.type = GGMLType::Q8_0, .q8_0_fallback = GGMLType::F32});
  CHECK(gg::GGUFFile(dir.path / "b.gguf").info("blk.0.attn_output.weight").type == GGMLType::F32);

  nn::GPTConfig cfg = tiny_config();
  cfg.bias = false;
  const auto nb = tiny_gpt(cfg, 13);
  gg::export_gpt(*nb, dir.path / "nb.gguf");
  gg::GGUFFile f(dir.path / "nb.gguf");
  CHECK(f.tensors().size() == 28);
  for (const char* name : {"blk.0.attn_norm.bias", "blk.1.attn_qkv.bias", "blk.1.ffn_up.bias", "output_norm.bias"}) {
    INFO(name);
    const std::vector<float> v = Tensor<float>(f.get(name)).to_vector();
    CHECK(!v.empty());
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  }
  CHECK(f.info("blk.1.ffn_up.bias").ne == std::vector<int64_t>{128});

  gg::GPTTokenizer tok;
  for (int i = 0; i < 64; ++i) tok.tokens.push_back(i < 63 ? std::string(1, static_cast<char>('!' + i)) : "<|endoftext|>");
  tok.merges = {"a b", "ab c"};
  tok.token_types.assign(64, 1);
  tok.token_types[63] = 3;
  tok.bos_id = tok.eos_id = 63;
  gg::export_gpt(*tiny_gpt(tiny_config(), 14), dir.path / "tok.gguf", {.type = GGMLType::F16, .tokenizer = tok});
  gg::GGUFFile t(dir.path / "tok.gguf");
  CHECK(t.value("tokenizer.ggml.model").str() == "gpt2");
  CHECK(t.value("tokenizer.ggml.pre").str() == "gpt-2");
  CHECK(t.value("tokenizer.ggml.tokens").strings() == tok.tokens);
  CHECK(t.value("tokenizer.ggml.merges").strings() == tok.merges);
  CHECK(t.value("tokenizer.ggml.token_type").array<int32_t>() == tok.token_types);
  CHECK(t.value("tokenizer.ggml.eos_token_id").get<uint32_t>() == 63);
}

TEST_CASE("gguf interop: gguf-py reads every tensor of ember's files bit-exact and every metadata value",
          "[gguf][interop]") {
  TempDir dir;
  const auto m = tiny_gpt(tiny_config(), 21);
  std::map<std::string, size_t> tensor_counts;
  for (GGMLType type : {GGMLType::F32, GGMLType::F16, GGMLType::Q8_0}) {
    const std::string stem = std::string("gpt_") + gg::type_name(type);
    tensor_counts[stem] = export_case(dir.path, stem, *m, {.type = type, .name = "tiny " + stem}).tensors.size();
  }
  // Q8_0 with F16 fallbacks, a tokenizer and extra keys, at alignment 64.
  gg::GPTTokenizer tok;
  for (int i = 0; i < 50; ++i) tok.tokens.push_back("t" + std::to_string(i) + (i % 7 == 0 ? " \u00e9" : ""));
  tok.merges = {"t 1", "t1 0"};
  tok.eos_id = 49;
  gg::GPTExportOptions o{.type = GGMLType::Q8_0, .name = "odd", .alignment = 64, .tokenizer = tok};
  o.metadata = {{"general.author", Value::string("ember tests")}, {"ember.step", Value::of<uint64_t>(1234)}};
  const auto odd = tiny_gpt({.vocab_size = 50, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 40}, 22);
  tensor_counts["gpt_odd"] = export_case(dir.path, "gpt_odd", *odd, o).tensors.size();
  // The writer's every value type (no tensors from a model).
  std::vector<float> f32;
  std::vector<uint8_t> q8;
  gg::Writer w = tiny_writer(f32, q8);
  w.add("u8", Value::of<uint8_t>(255)).add("i8", Value::of<int8_t>(-128)).add("u16", Value::of<uint16_t>(65535))
      .add("i16", Value::of<int16_t>(-32768)).add("i32", Value::of<int32_t>(-7)).add("f32", Value::of(-0.1f))
      .add("b", Value::of(false)).add("u64", Value::of<uint64_t>(~uint64_t{0})).add("i64", Value::of<int64_t>(-(int64_t{1} << 60)))
      .add("f64", Value::of(1.0 / 3)).add("strs", Value::array(std::vector<std::string>{"", "\u00fc", "two words"}))
      .add("i32s", Value::array(std::vector<int32_t>{-1, 0, 1})).add("f32s", Value::array(std::vector<float>{1e-3f, 3e38f}))
      .add("u8s", Value::array(std::vector<uint8_t>{0, 255})).add("u64s", Value::array(std::vector<uint64_t>{1, uint64_t{1} << 63}));
  // A block whose products x * (1/d) land on .5 (d = 2): gguf-py must round them as ember does.
  std::vector<float> ties(64);
  for (int j = 0; j < 64; ++j) ties[static_cast<size_t>(j)] = j == 0 ? 254.0f : static_cast<float>(j % 9 - 4) * (j < 32 ? 1 : 3);
  ties[32] = -254.0f;
  std::vector<uint8_t> ties_q8(68);
  gg::quantize_q8_0(ties.data(), 64, ties_q8.data());
  w.add_tensor("ties", {2, 32}, GGMLType::Q8_0, ties_q8.data());
  w.write(dir.path / "values.gguf");
  Expect e{w.metadata(), w.tensors(), 32, {}, {}};
  e.bytes = {{"t", std::vector<uint8_t>(reinterpret_cast<uint8_t*>(f32.data()), reinterpret_cast<uint8_t*>(f32.data()) + 24)},
             {"q", q8}, {"ties", ties_q8}};
  e.sources.emplace_back("t", Tensor<float>::from_vector(f32, {2, 3}));
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(127 - 8 * j);
  e.sources.emplace_back("q", Tensor<float>::from_vector(x, {1, 32}));
  e.sources.emplace_back("ties", Tensor<float>::from_vector(ties, {2, 32}));
  write_expect(dir.path, "values", e);
  tensor_counts["values"] = 3;

  int rc = 0;
  const auto out = run_python("check '" + dir.path.string() + "'", rc);
  if (!out) return;
  INFO(*out);
  REQUIRE(rc == 0);
  REQUIRE(out->find("\nOK") != std::string::npos);
  size_t files = 0;
  for (size_t at = 0; at < out->size();) {
    const size_t end = out->find('\n', at);
    const std::string line = out->substr(at, end - at);
    at = end == std::string::npos ? out->size() : end + 1;
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line);
    const std::string file = j["file"];
    INFO("file " << file);
    REQUIRE(tensor_counts.count(file));
    CHECK(j["tensors"] == tensor_counts[file]);
    CHECK(j["bytes_checked"] == tensor_counts[file]);      // every tensor's bytes as ember meant them
    CHECK(j["reference_checked"] == tensor_counts[file]);  // and as gguf-py encodes the same values
    if (file == "gpt_Q8_0" || file == "gpt_odd") CHECK(j["q8_0_max_err_over_d"].get<double>() <= 0.5625);
    if (file != "values") CHECK(j["logits_max_diff"].get<double>() <= 1e-4);  // llama.cpp's graph = ember's forward
    ++files;
  }
  CHECK(files == tensor_counts.size());
}

TEST_CASE("gguf interop: ember reads the file gguf-py's GGUFWriter writes", "[gguf][interop]") {
  TempDir dir;
  const fs::path path = dir.path / "py.gguf";
  int rc = 0;
  const auto out = run_python("write '" + path.string() + "'", rc);
  if (!out) return;
  INFO(*out);
  REQUIRE(rc == 0);
  gg::GGUFFile f(path);
  CHECK(f.value("general.architecture").str() == "gpt2");
  CHECK(f.value("general.name").str() == "written by gguf-py");
  CHECK(f.value("test.u32").get<uint32_t>() == 7);
  CHECK(f.value("test.i32").get<int32_t>() == -5);
  CHECK(f.value("test.f32").get<float>() == 0.25f);
  CHECK(f.value("test.u64").get<uint64_t>() == uint64_t{1} << 40);
  CHECK(f.value("test.i64").get<int64_t>() == -(int64_t{1} << 40));
  CHECK(f.value("test.f64").get<double>() == -1.5);
  CHECK(f.value("test.bool").get<bool>());
  CHECK(f.value("test.str").str() == "h\u00e9llo");
  CHECK(f.value("test.strs").strings() == std::vector<std::string>{"a", "bc", ""});
  CHECK(f.value("test.ints").array<int32_t>() == std::vector<int32_t>{1, -2, 3});
  CHECK(f.value("test.floats").array<float>() == std::vector<float>{0.5f, -2.0f});
  REQUIRE(f.tensors().size() == 3);
  CHECK(Tensor<float>(f.get("f32")).to_vector() == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(f.info("f32").ne == std::vector<int64_t>{3, 2});
  const AnyTensor h = f.get("f16");
  CHECK(h.dtype() == DType::Float16);
  const std::vector<float> hv = Tensor<float>(h.to(DType::Float32)).to_vector();
  for (int i = 0; i < 128; ++i) CHECK(hv[static_cast<size_t>(i)] == static_cast<float>(i) / 8 - 7);
  // gguf-py's Q8_0 blocks are ember's, bit for bit, for the same float32 values.
  std::vector<float> src(128);
  for (int i = 0; i < 128; ++i) src[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 23 - 11) / 3.0f;
  std::vector<uint8_t> mine(4 * 34);
  gg::quantize_q8_0(src.data(), 128, mine.data());
  REQUIRE(f.info("q8_0").type == GGMLType::Q8_0);
  CHECK(f.info("q8_0").ne == std::vector<int64_t>{64, 2});
  CHECK(std::memcmp(f.data("q8_0"), mine.data(), mine.size()) == 0);
}

TEST_CASE("gguf export: bad inputs are clear errors and leave the previous file as it was", "[gguf][export][errors]") {
  TempDir dir;
  auto m = tiny_gpt(tiny_config(), 31);
  const fs::path path = dir.path / "m.gguf";
  gg::export_gpt(*m, path);
  const auto before = fs::file_size(path);
  auto listing = [&] {
    size_t n = 0;
    for (const auto& entry : fs::directory_iterator(dir.path)) n += entry.is_regular_file();
    return n;
  };

  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, {.type = GGMLType::BF16}); }),
             Contains("type must be F32, F16 or Q8_0, got BF16"));
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, {.type = GGMLType::Q8_0, .q8_0_fallback = GGMLType::Q4_0}); }),
             Contains("q8_0_fallback must be F32 or F16"));
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, {.alignment = 48}); }), Contains("power of two, got 48"));
  gg::GPTExportOptions dup;
  dup.metadata = {{"general.name", Value::string("again")}};
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, dup); }), Contains("the key 'general.name' is added twice"));
  gg::GPTTokenizer tok;
  tok.tokens = {"a", "b"};
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, {.tokenizer = tok}); }),
             Contains("the tokenizer has 2 tokens, the model's vocab_size is 64"));

  // A missing folder: an IOError naming the path; nothing is created.
  const fs::path nowhere = dir.path / "no" / "such" / "m.gguf";
  CHECK_THROWS_AS(gg::export_gpt(*m, nowhere), IOError);
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, nowhere); }), Contains(nowhere.string()));
  CHECK_FALSE(fs::exists(dir.path / "no"));

  // Shapes that are not GPT-2's, and a weight that is not floating point.
  const AnyTensor keep = m->blocks()[0]->mlp->c_fc->weight;
  m->blocks()[0]->mlp->c_fc->weight = AnyTensor::zeros({5, 5}, DType::Float32);
  const std::string shape_msg = message_of([&] { gg::export_gpt(*m, path); });
  CHECK_THAT(shape_msg, Contains("h.0.mlp.c_fc.weight is"));
  CHECK_THAT(shape_msg, Contains("blk.0.ffn_up.weight must be [128, 32]"));
  CHECK_THROWS_AS(gg::export_gpt(*m, path), ShapeError);
  m->blocks()[0]->mlp->c_fc->weight = keep;
  const AnyTensor keep_wte = m->wte->weight;
  m->wte->weight = AnyTensor::zeros({64, 32}, DType::Int64);
  CHECK_THROWS_AS(gg::export_gpt(*m, path), DTypeError);
  m->wte->weight = keep_wte;

  // A non-finite weight fails the Q8_0 export while it writes: the old file stays, no temp file.
  {
    NoGradGuard no_grad;
    Tensor<float> w(m->blocks()[1]->mlp->c_proj->weight);
    w.data()[7] = std::numeric_limits<float>::quiet_NaN();
  }
  CHECK_THAT(message_of([&] { gg::export_gpt(*m, path, {.type = GGMLType::Q8_0}); }),
             Contains("blk.1.ffn_down.weight: value 7 is nan"));
  CHECK(fs::file_size(path) == before);
  CHECK(listing() == 1);
  CHECK_NOTHROW(gg::GGUFFile(path));
  // F32 and F16 store the nan as it is.
  CHECK_NOTHROW(gg::export_gpt(*m, path, {.type = GGMLType::F16}));

  // The writer's own checks.
  gg::Writer w;
  CHECK_THROWS_WITH(w.add("", Value::of(1.0)), Contains("a key must have 1 to 65535 bytes"));
  CHECK_THROWS_WITH(w.add("a\tb", Value::of(1.0)), Contains("printable ASCII"));
  CHECK_THROWS_WITH(w.add("general.alignment", Value::of<uint64_t>(32)), Contains("must be UINT32"));
  const float one[64] = {};
  CHECK_THROWS_WITH(w.add_tensor(std::string(64, 'n'), {1}, GGMLType::F32, one), Contains("1 to 63 bytes"));
  CHECK_THROWS_WITH(w.add_tensor("t", {1, 2, 3, 4, 5}, GGMLType::F32, one), Contains("ggml holds 1 to 4"));
  CHECK_THROWS_WITH(w.add_tensor("t", {2, 31}, GGMLType::Q8_0, one), Contains("rows of 31 values; Q8_0"));
  CHECK_THROWS_WITH(w.add_tensor("t", {2}, GGMLType::F32, static_cast<const void*>(nullptr)), Contains("has no data"));
  w.add_tensor("short", {4}, GGMLType::F32, gg::TensorBytes([](const gg::ByteSink& s) { s("abc", 3); }));
  CHECK_THROWS_WITH(w.write(dir.path / "w.gguf"), Contains("tensor 'short' produced 3 bytes; its type F32 and shape make 16"));
  CHECK_FALSE(fs::exists(dir.path / "w.gguf"));
  CHECK(listing() == 1);
}
