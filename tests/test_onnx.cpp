// ONNX export (include/ember/deploy/onnx.hpp): the wire format against hand-encoded bytes, every nn
// layer exported and checked by the reference implementations (onnx's full checker, onnxruntime
// with its optimisations off and on, against ember's forward: 1e-5 in fp32, 1e-3 in fp16),
// symbolic batch and sequence dimensions, opsets 17 to 25, fp16/bf16 graphs, batch norm folded
// into the convolution, external data aligned to 4096 bytes, metadata, custom modules through a
// hook, and the errors. The Python side is tests/interop/check_onnx.py; without onnx or
// onnxruntime the interop cases print SKIPPED.
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ember/data/dataloader.hpp"
#include "ember/deploy/onnx.hpp"
#include "ember/ember.hpp"
#include "ember/nn/gpt.hpp"
#include "ember/quant/quantize.hpp"
#include "python_check.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::message_of;
namespace onnx = ember::io::onnx;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("ember-onnx") {}
};


std::string hex(const std::string& bytes) {
  std::string s;
  char b[4];
  for (unsigned char c : bytes) {
    std::snprintf(b, sizeof b, "%02x", c);
    s += b;
  }
  return s;
}

// One model to check: exported with inputs[0] as the example, then every input run through ember
// (eval, no grad) for the expected outputs that onnxruntime must reproduce.
struct Case {
  std::string name;
  std::shared_ptr<nn::Module> model;
  std::vector<AnyTensor> inputs;
  onnx::ExportOptions options = {};
  double atol = 1e-5, rtol = 1e-5;
  std::map<std::string, std::string> expect_metadata = {};
  bool qdq = false;              // INT8: lint TensorRT's rules, report onnxruntime's integer kernels
  bool integer_kernels = false;  // and require one
  double atol_optimised = -1;    // with onnxruntime's optimisations on, where they approximate (-1: atol)
};

onnx::ExportResult export_case(const fs::path& dir, const Case& c) {
  const onnx::ExportResult r = onnx::export_model(*c.model, {c.inputs[0]}, dir / (c.name + ".onnx"), c.options);
  io::TensorList io;
  c.model->eval();
  NoGradGuard no_grad;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    const AnyTensor& x = c.inputs[k];
    AnyTensor y = c.model->forward_any(x);
    // Stored as fp32 / int64: the checker casts the input to the model's input type.
    io.emplace_back("input." + std::to_string(k), is_floating(x.dtype()) ? x.to(DType::Float32) : x);
    io.emplace_back("expected." + std::to_string(k), y.to(DType::Float32));
  }
  nlohmann::json meta = c.expect_metadata;
  io::save_file(dir / (c.name + ".io.safetensors"), io,
                {{"atol", std::to_string(c.atol)}, {"rtol", std::to_string(c.rtol)}, {"expect_metadata", meta.dump()},
                 {"expect_producer", "ember"}, {"qdq", c.qdq ? "1" : "0"},
                 {"require_integer_kernels", c.integer_kernels ? "1" : "0"},
                 {"atol_on", std::to_string(c.atol_optimised >= 0 ? c.atol_optimised : c.atol)}});
  return r;
}

// Runs the checker over a folder; returns its JSON lines by case, or nothing (and prints SKIPPED)
// when Python or its packages are missing.
std::optional<std::map<std::string, nlohmann::json>> check_folder(const fs::path& dir, std::string& out) {
  const auto run = testing::run_python_check("check_onnx.py", {dir.string()});
  if (!run) return std::nullopt;
  out += run->out;
  return testing::json_lines_by(run->out, "case");
}

// Exports every case into one folder, checks them in one Python run, and requires each to pass.
void check_cases(const std::vector<Case>& cases) {
  TempDir dir;
  for (const Case& c : cases) {
    INFO("case " << c.name);
    export_case(dir.path, c);
  }
  std::string out;
  auto result = check_folder(dir.path, out);
  if (!result) return;
  INFO(out);
  CHECK(result->size() == cases.size());
  for (const Case& c : cases) {
    INFO("case " << c.name);
    REQUIRE(result->count(c.name));
    CHECK((*result)[c.name]["ok"] == true);
    if ((*result)[c.name].contains("on_values"))  // a processor without VNNI (check_onnx.py)
      WARN("SKIPPED: " << c.name << ", optimised graph: " << (*result)[c.name]["on_values"].get<std::string>());
  }
}

FloatTensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return FloatTensor::randn(s, Device::cpu(), 0.0, 1.0, g);
}

template <class M>
std::shared_ptr<nn::Sequential> seq_of(std::shared_ptr<M> m) {
  auto s = std::make_shared<nn::Sequential>();
  s->push_back(m);
  return s;
}

// Running statistics and affine parameters away from the defaults, so that a wrong use shows.
void randomise_batch_norm(nn::BatchNorm2d& bn, uint64_t seed) {
  NoGradGuard no_grad;
  const int64_t c = bn.num_features();
  bn.running_mean.copy_(randn({c}, seed) * 0.5f);
  bn.running_var.copy_(abs(randn({c}, seed + 1)) + 0.5f);
  bn.weight.copy_(randn({c}, seed + 2) * 0.3f + 1.0f);
  bn.bias.copy_(randn({c}, seed + 3) * 0.2f);
}

std::shared_ptr<nn::Sequential> make_cnn(uint64_t seed) {
  Generator g(seed);
  GeneratorScope scope(g);  // the layers' initial weights
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = {1, 1}});
  auto bn = m->emplace<nn::BatchNorm2d>(8);
  randomise_batch_norm(*bn, seed);
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);
  m->emplace<nn::Conv2d>(8, 6, std::array<int64_t, 2>{3, 3},
                         nn::Conv2dOptions{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2});
  m->emplace<nn::AvgPool2d>(std::array<int64_t, 2>{2, 2}, std::array<int64_t, 2>{1, 1}, std::array<int64_t, 2>{1, 1},
                            false, false);
  m->emplace<nn::AdaptiveAvgPool2d>(1);
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(6, 5);
  return m;
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, LinearActivation act = LinearActivation::Relu) {
  Generator g(seed);
  GeneratorScope scope(g);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(12, 16, nn::LinearOptions{.activation = act});
  m->emplace<nn::Dropout>(0.3);
  m->emplace<nn::Linear>(16, 16);
  m->emplace<nn::Tanh>();
  m->emplace<nn::Linear>(16, 4, nn::LinearOptions{.bias = false});
  m->emplace<nn::LogSoftmax>(-1);
  return m;
}

std::shared_ptr<nn::TransformerBlock> make_block(uint64_t seed, bool causal = true) {
  Generator g(seed);
  GeneratorScope scope(g);
  auto b = std::make_shared<nn::TransformerBlock>(16, 4, nn::TransformerBlockOptions{.is_causal = causal});
  // Non-trivial norms and biases.
  NoGradGuard no_grad;
  for (auto& [name, p] : b->named_parameters())
    if (p.dim() == 1) p.copy_(randn(p.shape(), seed + p.numel()) * 0.1f + (name.find("weight") != std::string::npos ? 1.0f : 0.0f));
  return b;
}

}  // namespace

TEST_CASE("onnx wire format: varints, keys, fields and a value's type as protobuf encodes them", "[onnx]") {
  std::string s;
  onnx::wire::varint(s, 300);
  CHECK(hex(s) == "ac02");
  s.clear();
  onnx::wire::int_field(s, 1, -1);  // int64 -1: ten bytes of two's complement
  CHECK(hex(s) == "08ffffffffffffffffff01");
  s.clear();
  onnx::wire::bytes_field(s, 4, "Relu");
  CHECK(hex(s) == "220452656c75");
  s.clear();
  onnx::wire::float_field(s, 2, 1.0f);
  CHECK(hex(s) == "150000803f");
  s.clear();
  onnx::wire::packed_ints(s, 8, {1, 2, 300});
  CHECK(hex(s) == "42040102ac02");
  // ValueInfoProto "x": float, [batch, 3], and a dimension of unknown size.
  const onnx::ValueInfo v{"x", onnx::ElemType::Float, {onnx::Dim::symbol("b"), onnx::Dim::fixed(3), onnx::Dim::unknown()}};
  CHECK(hex(onnx::detail::encode_value_info(v)) == "0a0178" "1211" "0a0f" "0801" "120b" "0a03" "120162" "0a02" "0803" "0a00");
  CHECK(onnx::ir_version_for_opset(17) == 8);
  CHECK(onnx::ir_version_for_opset(21) == 10);
  CHECK(onnx::ir_version_for_opset(25) == 13);
}

TEST_CASE("onnx export: every nn layer, fp32, matches onnxruntime (optimisations off and on) to 1e-5",
          "[onnx][interop][python]") {
  std::vector<Case> cases;
  cases.push_back({"mlp_relu", make_mlp(1), {randn({5, 12}, 2), randn({2, 12}, 3)}});
  cases.push_back({"mlp_gelu", make_mlp(4, LinearActivation::Gelu), {randn({3, 12}, 5)}});
  cases.push_back({"mlp_gelu_tanh_opset17", make_mlp(6, LinearActivation::GeluTanh), {randn({3, 12}, 7)},
                   {.opset = 17}});
  cases.push_back({"cnn", make_cnn(8), {randn({2, 3, 10, 10}, 9), randn({1, 3, 10, 10}, 10)}});
  cases.push_back({"cnn_folded", make_cnn(8), {randn({2, 3, 10, 10}, 9)}, {.fold_batch_norm = true}});
  {
    auto m = std::make_shared<nn::Sequential>();
    Generator g(11);
    GeneratorScope scope(g);
    m->emplace<nn::LayerNorm>(8);
    m->emplace<nn::GELU>("tanh");
    m->emplace<nn::RMSNorm>(8);
    m->emplace<nn::SiLU>();
    m->emplace<nn::LayerNorm>(std::vector<int64_t>{3, 8}, nn::LayerNormOptions{.eps = 1e-3, .bias = false});
    m->emplace<nn::Sigmoid>();
    m->emplace<nn::RMSNorm>(std::vector<int64_t>{3, 8}, nn::RMSNormOptions{.eps = 1e-4, .elementwise_affine = false});
    m->emplace<nn::GELU>();
    m->emplace<nn::Softmax>(1);
    m->emplace<nn::Identity>();
    {
      NoGradGuard no_grad;
      for (auto& p : m->parameters()) p.copy_(randn(p.shape(), 12 + p.numel()) * 0.2f + 1.0f);
    }
    cases.push_back({"norms_activations", m, {randn({4, 3, 8}, 13)}});
    cases.push_back({"norms_activations_opset23", m, {randn({4, 3, 8}, 13)}, {.opset = 23}});
    cases.push_back({"norms_activations_opset17", m, {randn({4, 3, 8}, 13)}, {.opset = 17}});
  }
  {
    auto m = std::make_shared<nn::Sequential>();
    Generator g(14);
    GeneratorScope scope(g);
    m->emplace<nn::Embedding>(20, 6);
    m->emplace<nn::Linear>(6, 3);
    cases.push_back({"embedding", m, {Tensor<int64_t>::from_vector({0, 5, 19, 7, 7, 1}, {2, 3})}});
  }
  {
    Generator g(15);
    GeneratorScope scope(g);
    auto a = std::make_shared<nn::MultiheadAttention>(16, 4);
    cases.push_back({"attention", a, {randn({2, 5, 16}, 16)}});
  }
  cases.push_back({"transformer_block_causal", make_block(17), {randn({2, 6, 16}, 18)}});
  cases.push_back({"transformer_block_encoder", make_block(19, false), {randn({2, 6, 16}, 20)}});
  check_cases(cases);
}

TEST_CASE("onnx export: symbolic batch and sequence: one graph runs two batch sizes and two sequence lengths",
          "[onnx][interop][python]") {
  std::vector<Case> cases;
  cases.push_back({"block_dynamic", make_block(21),
                   {randn({2, 7, 16}, 22), randn({3, 7, 16}, 23), randn({2, 4, 16}, 24), randn({1, 11, 16}, 25)},
                   {.dynamic_axes = {{0, "batch"}, {1, "sequence"}}}});
  {
    auto m = std::make_shared<nn::Sequential>();
    Generator g(26);
    GeneratorScope scope(g);
    m->emplace<nn::Embedding>(30, 16);
    m->push_back(make_block(27));
    m->emplace<nn::LayerNorm>(16);
    m->emplace<nn::Linear>(16, 30);
    // Token ids: batch and sequence are symbolic by default.
    cases.push_back({"tiny_lm_dynamic", m,
                     {Tensor<int64_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}),
                      Tensor<int64_t>::from_vector({7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 10}),
                      Tensor<int64_t>::from_vector({29, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {3, 4})}});
  }
  {
    Generator g(50);
    GeneratorScope scope(g);
    auto gpt = std::make_shared<nn::GPT>(nn::GPTConfig{.vocab_size = 40, .block_size = 16, .n_layer = 2, .n_head = 2,
                                                       .n_embd = 16});
    cases.push_back({"gpt_dynamic", gpt,
                     {Tensor<int64_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}),
                      Tensor<int64_t>::from_vector({7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 39, 0}, {1, 12}),
                      Tensor<int64_t>::from_vector({9, 0, 1, 2, 3, 4, 5, 6}, {4, 2})},
                     {.training_step = 7},
                     1e-5,
                     1e-5,
                     {{"training_step", "7"}, {"ember.module", "GPT"}}});
  }
  check_cases(cases);
  // The graph says which dimensions are symbolic.
  TempDir dir;
  const auto r = export_case(dir.path, cases[0]);
  CHECK(r.input.shape[0].param == "batch");
  CHECK(r.input.shape[1].param == "sequence");
  CHECK(r.input.shape[2].value == 16);
  CHECK(r.output.shape[1].param == "sequence");
}

TEST_CASE("onnx export: opsets 17 to 25 all load and match, and the IR version follows the opset",
          "[onnx][interop][python]") {
  std::vector<Case> cases;
  for (int64_t opset = 17; opset <= 25; ++opset)
    cases.push_back({"block_opset" + std::to_string(opset), make_block(28), {randn({2, 5, 16}, 29)}, {.opset = opset}});
  check_cases(cases);
  CHECK_THROWS_WITH(onnx::export_model(*make_block(28), {randn({2, 5, 16}, 29)}, "/tmp/never.onnx", {.opset = 16}),
                    Contains("opset 16 is not supported") && Contains("17 to 25"));
  CHECK_THROWS_WITH(onnx::export_model(*make_block(28), {randn({2, 5, 16}, 29)}, "/tmp/never.onnx", {.opset = 26}),
                    Contains("opset 26"));
}

TEST_CASE("onnx export: fp16 graphs match onnxruntime to 1e-3, and bf16 graphs pass the full checker",
          "[onnx][interop][python]") {
  std::vector<Case> cases;
  auto to16 = [](const FloatTensor& x) { return AnyTensor(x).to(DType::Float16); };
  cases.push_back({"mlp_fp16", make_mlp(30), {to16(randn({4, 12}, 31))}, {}, 1e-3, 1e-3});
  cases.push_back({"block_fp16", make_block(32), {to16(randn({2, 5, 16}, 33))}, {}, 1e-3, 1e-3});
  cases.push_back({"cnn_fp16", make_cnn(34), {to16(randn({2, 3, 10, 10}, 35))}, {}, 1e-3, 1e-3});
  check_cases(cases);

  // bf16: the graph's types are bf16 throughout; onnxruntime's CPU kernels for bf16 are few, so
  // the full checker (with shape inference) is the reference here.
  TempDir dir;
  const auto r = onnx::export_model(*make_block(36), {AnyTensor(randn({2, 5, 16}, 37)).to(DType::BFloat16)},
                                    dir.path / "block_bf16.onnx");
  CHECK(r.input.type == onnx::ElemType::BFloat16);
  CHECK(r.output.type == onnx::ElemType::BFloat16);
  const std::string py = EMBER_PYTHON_EXE;
  if (py.empty()) return;
  const std::string cmd = "'" + py + "' -c \"import onnx,sys; m=onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); "
                          "print('BF16', sum(1 for t in m.graph.initializer if t.data_type==16), len(m.graph.initializer))\" '" +
                          (dir.path / "block_bf16.onnx").string() + "' 2>&1";
  const std::string out = testing::run_command(cmd).out;
  if (out.find("No module named") != std::string::npos) {
    std::printf("SKIPPED: onnx is not importable: %s\n", out.c_str());
    return;
  }
  INFO(out);
  // Every weight bf16 (the int64 shape constants aside).
  CHECK(out.find("BF16 ") != std::string::npos);
}

TEST_CASE("onnx export: batch norm folded into the convolution computes what conv + batch norm compute",
          "[onnx]") {
  auto m = make_cnn(38);
  m->eval();
  auto& conv = dynamic_cast<nn::Conv2d&>((*m)[0]);
  auto& bn = dynamic_cast<nn::BatchNorm2d&>((*m)[1]);
  auto [w, b] = onnx::Exporter::fold_batch_norm(conv, bn);
  const FloatTensor x = randn({2, 3, 10, 10}, 39);
  NoGradGuard no_grad;
  const FloatTensor two = bn(conv(x));
  const FloatTensor one = conv2d(x, FloatTensor(w), FloatTensor(b), {{1, 1}, {1, 1}, {1, 1}, 1});
  const auto a = two.to_vector(), c = one.to_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - c[i])));
  CHECK(worst < 1e-5);
  CHECK(a.size() == 2 * 8 * 10 * 10);
  // nn::fold_batch_norm: the model with the pair as one Conv2d computes the same.
  auto f = nn::fold_batch_norm(*m);
  CHECK(f->size() == m->size() - 1);
  CHECK(f->layers()[2] == m->layers()[3]);  // the other layers are shared
  const auto fm = f->forward(x).to_vector(), mm = m->forward(x).to_vector();
  double worst_model = 0;
  for (size_t i = 0; i < fm.size(); ++i) worst_model = std::max(worst_model, static_cast<double>(std::abs(fm[i] - mm[i])));
  CHECK(worst_model < 1e-5);
  // And the folded graph has one node fewer than the unfolded one.
  TempDir dir;
  const auto unfolded = onnx::export_model(*m, {x}, dir.path / "a.onnx");
  const auto folded = onnx::export_model(*m, {x}, dir.path / "b.onnx", {.fold_batch_norm = true});
  CHECK(folded.nodes == unfolded.nodes - 1);
  CHECK(m->is_training() == false);  // export leaves the training flags as they were
}

TEST_CASE("onnx export: external data at offsets aligned to 4096, the model names it, the old file goes",
          "[onnx][interop][python]") {
  TempDir dir;
  Case c{"mlp_external", make_mlp(40), {randn({3, 12}, 41)}, {.external_data = onnx::ExternalData::Always,
                                                             .external_min_tensor_bytes = 64}};
  c.options.training_step = 1234;
  c.options.metadata = {{"dataset", "synthetic"}};
  c.expect_metadata = {{"training_step", "1234"}, {"dataset", "synthetic"}, {"ember.module", "Sequential"}};
  const auto r = export_case(dir.path, c);
  REQUIRE(!r.data_path.empty());
  CHECK(fs::exists(r.data_path));
  CHECK(r.external_initializers >= 3);  // the three weights of at least 64 bytes
  CHECK(r.data_bytes % 4 == 0);
  CHECK(r.data_path.filename().string().rfind("mlp_external.onnx.", 0) == 0);
  CHECK(r.model_bytes < 4096);  // the weights are not in it
  // Every external tensor starts at a multiple of 4096: its offset is in the model as text.
  std::ifstream f(r.model_path, std::ios::binary);
  const std::string model((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t at = 0;
  int offsets = 0;
  while ((at = model.find("offset", at)) != std::string::npos) {
    at += 6;
    // StringStringEntryProto: key "offset", then field 2 (0x12), a length, the digits.
    REQUIRE(at + 2 <= model.size());
    REQUIRE(static_cast<unsigned char>(model[at]) == 0x12);
    const size_t len = static_cast<unsigned char>(model[at + 1]);
    const uint64_t off = std::stoull(model.substr(at + 2, len));
    CHECK(off % 4096 == 0);
    ++offsets;
  }
  CHECK(offsets == static_cast<int>(r.external_initializers));
  std::string out;
  auto result = check_folder(dir.path, out);
  if (result) {
    INFO(out);
    CHECK((*result)["mlp_external"]["ok"] == true);
  }
  // Exporting other weights to the same path writes a new data file and removes the old one.
  const fs::path old = r.data_path;
  const auto r2 = onnx::export_model(*make_mlp(42), {randn({3, 12}, 41)}, r.model_path,
                                     {.external_data = onnx::ExternalData::Always, .external_min_tensor_bytes = 64});
  CHECK(r2.data_path != old);
  CHECK(fs::exists(r2.data_path));
  CHECK_FALSE(fs::exists(old));
  // Inline again: no data file is left.
  const auto r3 = onnx::export_model(*make_mlp(42), {randn({3, 12}, 41)}, r.model_path);
  CHECK(r3.data_path.empty());
  CHECK_FALSE(fs::exists(r2.data_path));
}

namespace {
// A custom module: y = 2 x + 1, with its ONNX form given as a hook.
class AffineTwice : public nn::ModuleBase<AffineTwice> {
 public:
  std::string type_name() const override { return "AffineTwice"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return x * T(2.0f) + T(1.0f);
  }
};
}  // namespace

TEST_CASE("onnx export: a custom module exports through a hook, and without one the error names it",
          "[onnx][interop][python]") {
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(4, 4);
  m->emplace<AffineTwice>();
  const FloatTensor x = randn({2, 4}, 43);
  const std::string msg = message_of([&] { onnx::export_model(*m, {x}, "/tmp/never.onnx"); });
  CHECK_THAT(msg, Contains("module '1' of type AffineTwice") && Contains("[batch, 4]") &&
                      Contains("ExportOptions::exporters[\"AffineTwice\"]"));
  CHECK_FALSE(fs::exists("/tmp/never.onnx"));
  Case c{"custom", m, {x, randn({5, 4}, 44)}};
  c.options.exporters["AffineTwice"] = [](onnx::Exporter& ex, nn::Module&, const onnx::Value& in) {
    auto& b = ex.builder();
    const std::string y =
        b.node("Add", {b.node("Mul", {in.name, b.constant_scalar("two", 2.0)}), b.constant_scalar("one", 1.0)});
    return onnx::Exporter::same_shape(in, y);
  };
  check_cases({c});
}

TEST_CASE("onnx export: bad inputs and modules without an inference form are clear errors", "[onnx]") {
  TempDir dir;
  auto mlp = make_mlp(45);
  CHECK_THROWS_WITH(onnx::export_model(*mlp, {}, dir.path / "a.onnx"), Contains("one example input expected"));
  CHECK_THROWS_WITH(onnx::export_model(*mlp, {randn({2, 7}, 46)}, dir.path / "a.onnx"),
                    Contains("Linear '0'") && Contains("[batch, 7]") && Contains("must end in 12"));
  CHECK_THROWS_WITH(onnx::export_model(*mlp, {randn({2, 12}, 46)}, dir.path / "a.onnx", {.dynamic_axes = {{3, "x"}}}),
                    Contains("dynamic axis 3"));
  CHECK_THROWS_WITH(onnx::export_model(*mlp, {randn({2, 12}, 46)}, dir.path / "a.onnx", {.dtype = DType::Int64}),
                    Contains("must be floating point"));
  auto bn = std::make_shared<nn::BatchNorm2d>(3, nn::BatchNormOptions{.track_running_stats = false});
  CHECK_THROWS_WITH(onnx::export_model(*seq_of(bn), {randn({2, 3, 4, 4}, 47)}, dir.path / "a.onnx"),
                    Contains("BatchNorm2d '0'") && Contains("running statistics"));
  auto pool = std::make_shared<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{3, 3});
  CHECK_THROWS_WITH(onnx::export_model(*seq_of(pool), {randn({1, 2, 8, 8}, 48)}, dir.path / "a.onnx"),
                    Contains("AdaptiveAvgPool2d '0'") && Contains("no adaptive pooling"));
  CHECK_THROWS_AS(onnx::export_model(*mlp, {randn({2, 12}, 46)}, dir.path / "no" / "such" / "a.onnx"), IOError);
  CHECK(fs::is_empty(dir.path));  // nothing half-written anywhere
}

TEST_CASE("onnx export: INT8 as QuantizeLinear/DequantizeLinear pairs: onnxruntime matches ember's fake "
          "quantization, fuses integer kernels, and TensorRT's rules hold",
          "[onnx][interop][python][quant]") {
  // A CNN and an MLP calibrated on random batches (max and percentile observers), exported with
  // Q/DQ on every Conv2d/Linear input (per tensor) and weight (per channel).
  auto calibrated = [](std::shared_ptr<nn::Sequential> m, const Shape& in, quant::ObserverKind kind,
                       bool outputs = false) {
    auto q = quant::prepare(*m, {.observer = {.kind = kind, .percentile = 99.9}, .quantize_outputs = outputs});
    std::vector<AnyTensor> batches;
    for (uint64_t k = 0; k < 4; ++k) batches.push_back(randn(in, 100 + k));
    quant::calibrate(*q, batches, [](const AnyTensor& x) { return x; });
    return q;
  };
  std::vector<Case> cases;
  // The outputs are compared to one int8 step of the last layer's input: where ember and
  // onnxruntime round a tie differently or accumulate in another order, one integer differs.
  cases.push_back({"cnn_int8", calibrated(make_cnn(60), {4, 3, 10, 10}, quant::ObserverKind::Max),
                   {randn({4, 3, 10, 10}, 61), randn({2, 3, 10, 10}, 62)}, {}, 2e-2, 1e-3});
  cases.back().qdq = true;
  // With the outputs quantized too: onnxruntime runs the convolutions as QLinearConv.
  {
    auto m = make_cnn(69);
    auto folded = nn::fold_batch_norm(*m);
    folded->eval();
    cases.push_back({"cnn_int8_outputs", calibrated(folded, {4, 3, 10, 10}, quant::ObserverKind::Mse, true),
                     {randn({4, 3, 10, 10}, 70)}, {}, 2e-2, 1e-3});
    cases.back().qdq = true;
    cases.back().integer_kernels = true;
  }
  cases.push_back({"mlp_int8", calibrated(make_mlp(63), {8, 12}, quant::ObserverKind::Percentile),
                   {randn({8, 12}, 64)}, {}, 2e-2, 1e-3});
  cases.back().qdq = true;
  cases.back().integer_kernels = true;  // MatMulIntegerToFloat: int8 x int8 GEMMs
  {
    auto w8 = quant::weight_only_int8(*make_mlp(65));
    // Exact with optimisations off; on, onnxruntime rewrites DequantizeLinear -> MatMul into its
    // MatMulNBits kernel, which computes with its own approximation (differences of 1e-3).
    cases.push_back({"mlp_weight_only_int8", w8, {randn({3, 12}, 66)}});
    cases.back().qdq = true;
    cases.back().atol_optimised = 1e-2;
  }
  check_cases(cases);
  // A layer still calibrating is refused, naming it.
  auto q = quant::prepare(*make_mlp(67));
  quant::set_mode(*q, quant::QuantMode::Calibrate);
  CHECK_THROWS_WITH(onnx::export_model(*q, {randn({2, 12}, 68)}, "/tmp/never.onnx"),
                    Contains("QuantLinear '0' is still calibrating"));
}
