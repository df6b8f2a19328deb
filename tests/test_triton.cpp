// Triton model repositories (include/ember/deploy/triton.hpp): config.pbtxt's text, the ONNX
// signature reader, repositories of a CNN with its INT8 variant, an fp16 MLP without batching, a
// GPT, a graph whose input is only the batch and an earlier export with external data, checked by
// tests/interop/check_triton.py with Triton's own ModelConfig schema (tritonclient), onnx and
// onnxruntime (batches of 3 and of max_batch_size); folders complete or absent; the errors.
// Without tritonclient, onnx or onnxruntime the interop case prints SKIPPED.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ember/deploy/triton.hpp"
#include "ember/ember.hpp"
#include "ember/nn/gpt.hpp"
#include "ember/quant/quantize.hpp"
#include "python_check.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::message_of;
namespace onnx = ember::io::onnx;
namespace triton = ember::io::triton;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("ember-triton") {}
};

FloatTensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return FloatTensor::randn(s, Device::cpu(), 0.0, 1.0, g);
}

std::shared_ptr<nn::Sequential> make_cnn(uint64_t seed) {
  Generator g(seed);
  GeneratorScope scope(g);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = {1, 1}});
  m->emplace<nn::ReLU>();
  m->emplace<nn::MaxPool2d>(2);
  m->emplace<nn::Flatten>();
  m->emplace<nn::Linear>(8 * 5 * 5, 5);
  return m;
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  Generator g(seed);
  GeneratorScope scope(g);
  auto m = std::make_shared<nn::Sequential>();
  m->emplace<nn::Linear>(12, 16, nn::LinearOptions{.activation = LinearActivation::Relu});
  m->emplace<nn::Linear>(16, 4);
  return m;
}

onnx::Dim sym(const std::string& s) { return onnx::Dim::symbol(s); }
onnx::Dim fix(int64_t v) { return onnx::Dim::fixed(v); }

// A one-node graph (Identity from the first input to the first output), written by hand:
// shapes and element types a module export would not give.
fs::path write_graph(const fs::path& path, std::vector<onnx::ValueInfo> inputs, std::vector<onnx::ValueInfo> outputs,
                     std::vector<onnx::TensorData> initializers = {}) {
  onnx::Model m;
  m.opsets = {{"", 21}};
  m.graph.name = "hand";
  m.graph.nodes.push_back(onnx::Node{"Identity", "id", "", {inputs[0].name}, {outputs[0].name}, {}});
  m.graph.inputs = std::move(inputs);
  m.graph.outputs = std::move(outputs);
  m.graph.initializers = std::move(initializers);
  io::write_file_atomic(path, onnx::encode_model(m));
  return path;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Hidden entries: temporary folders a failed or finished write must not leave.
bool has_hidden(const fs::path& repo) {
  if (!fs::exists(repo)) return false;
  for (const auto& e : fs::directory_iterator(repo))
    if (e.path().filename().string()[0] == '.') return true;
  return false;
}

// Runs check_triton.py over a repository: its JSON lines by model, or nothing (SKIPPED printed)
// when Python or its packages are missing.
std::optional<std::map<std::string, nlohmann::json>> check_repository(const fs::path& repo, std::string& out) {
  const auto run = testing::run_python_check("check_triton.py", {repo.string()});
  if (!run) return std::nullopt;
  out = run->out;
  return testing::json_lines_by(run->out, "model");
}

using Entries = std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>;
Entries entries(const nlohmann::json& j) {
  Entries e;
  for (const auto& x : j) e.emplace_back(x[0].get<std::string>(), x[1].get<std::string>(), x[2].get<std::vector<int64_t>>());
  return e;
}

}  // namespace

TEST_CASE("triton config: the text for a batched CNN, an unbatched graph and a per-example scalar", "[triton]") {
  const std::vector<onnx::ValueInfo> in{{"input", onnx::ElemType::Float, {sym("batch"), fix(3), fix(32), fix(32)}}};
  const std::vector<onnx::ValueInfo> out{{"output", onnx::ElemType::Float, {sym("batch"), fix(10)}}};
  CHECK(triton::model_config(in, out,
                             {.name = "classifier", .max_batch_size = 8, .instance_kind = triton::InstanceKind::Cpu,
                              .instance_count = 2, .preferred_batch_sizes = {4, 8}, .max_queue_delay_us = 100}) ==
        "name: \"classifier\"\n"
        "platform: \"onnxruntime_onnx\"\n"
        "backend: \"onnxruntime\"\n"
        "max_batch_size: 8\n"
        "input [\n  {\n    name: \"input\"\n    data_type: TYPE_FP32\n    dims: [ 3, 32, 32 ]\n  }\n]\n"
        "output [\n  {\n    name: \"output\"\n    data_type: TYPE_FP32\n    dims: [ 10 ]\n  }\n]\n"
        "instance_group [\n  {\n    count: 2\n    kind: KIND_CPU\n  }\n]\n"
        "dynamic_batching {\n  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 100\n}\n");
  // No batching: the whole shape, symbolic and unknown dimensions -1; token ids are TYPE_INT64.
  const std::string unbatched = triton::model_config(
      {{"ids", onnx::ElemType::Int64, {sym("batch"), sym("sequence")}}, {"mask", onnx::ElemType::Bool, {fix(2), onnx::Dim::unknown()}}},
      {{"logits", onnx::ElemType::Float16, {sym("batch"), sym("sequence"), fix(40)}}},
      {.name = "lm", .max_batch_size = 0, .instance_kind = triton::InstanceKind::Gpu, .dynamic_batching = false});
  CHECK_THAT(unbatched, Contains("max_batch_size: 0\n") &&
                            Contains("name: \"ids\"\n    data_type: TYPE_INT64\n    dims: [ -1, -1 ]\n") &&
                            Contains("name: \"mask\"\n    data_type: TYPE_BOOL\n    dims: [ 2, -1 ]\n") &&
                            Contains("name: \"logits\"\n    data_type: TYPE_FP16\n    dims: [ -1, -1, 40 ]\n") &&
                            Contains("kind: KIND_GPU"));
  CHECK_THAT(unbatched, !Contains("dynamic_batching"));
  // A tensor that is only the batch: dims [ 1 ] reshaped to a scalar per example. Names are quoted.
  const std::string scalar = triton::model_config({{"x\"1", onnx::ElemType::BFloat16, {sym("n")}}},
                                                  {{"y", onnx::ElemType::Double, {sym("n")}}}, {.name = "s"});
  CHECK_THAT(scalar, Contains("name: \"x\\\"1\"\n    data_type: TYPE_BF16\n    dims: [ 1 ]\n    reshape: { shape: [ ] }\n") &&
                         Contains("data_type: TYPE_FP64") && Contains("kind: KIND_AUTO") &&
                         Contains("dynamic_batching {\n  max_queue_delay_microseconds: 0\n}\n"));
}

TEST_CASE("triton: the ONNX signature reader gives an exported GPT's inputs and outputs, and skips weights listed "
          "as inputs", "[triton]") {
  TempDir dir;
  Generator g(1);
  GeneratorScope scope(g);
  nn::GPT gpt(nn::GPTConfig{.vocab_size = 40, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 8});
  onnx::export_model(gpt, {Tensor<int64_t>::from_vector({1, 2, 3, 4}, {2, 2})}, dir.path / "gpt.onnx",
                     {.input_name = "ids", .output_name = "logits", .external_data = onnx::ExternalData::Always,
                      .external_min_tensor_bytes = 256});
  const auto sig = triton::read_onnx_signature(dir.path / "gpt.onnx");
  REQUIRE(sig.inputs.size() == 1);
  REQUIRE(sig.outputs.size() == 1);
  CHECK(sig.inputs[0].name == "ids");
  CHECK(sig.inputs[0].type == onnx::ElemType::Int64);
  REQUIRE(sig.inputs[0].shape.size() == 2);
  CHECK(sig.inputs[0].shape[0].param == "batch");
  CHECK(sig.inputs[0].shape[1].param == "sequence");
  CHECK(sig.outputs[0].name == "logits");
  CHECK(sig.outputs[0].type == onnx::ElemType::Float);
  REQUIRE(sig.outputs[0].shape.size() == 3);
  CHECK(sig.outputs[0].shape[2].value == 40);
  REQUIRE(sig.data_files.size() == 1);
  CHECK(fs::exists(dir.path / sig.data_files[0]));
  // An older producer lists its weights among the graph inputs: they are not inputs to serve.
  onnx::TensorData w{"w", onnx::ElemType::Float, {2}, std::string(8, '\0')};
  write_graph(dir.path / "old.onnx",
              {{"x", onnx::ElemType::Float, {sym("b"), fix(2)}}, {"w", onnx::ElemType::Float, {fix(2)}}},
              {{"y", onnx::ElemType::Float, {sym("b"), fix(2)}}}, {w});
  const auto old = triton::read_onnx_signature(dir.path / "old.onnx");
  REQUIRE(old.inputs.size() == 1);
  CHECK(old.inputs[0].name == "x");
  CHECK(old.data_files.empty());
}

TEST_CASE("triton repository: a CNN and its INT8 variant, an fp16 MLP, a GPT, a per-example scalar and an earlier "
          "export with external data pass Triton's schema, onnx and onnxruntime",
          "[triton][interop][python]") {
  TempDir dir;
  const fs::path repo = dir.path / "models";
  // The CNN, batched up to 8, with its INT8 Q/DQ variant calibrated on random batches.
  auto cnn = make_cnn(2);
  auto q = quant::prepare(*cnn, {.observer = {.kind = quant::ObserverKind::Max}});
  std::vector<AnyTensor> batches;
  for (uint64_t k = 0; k < 3; ++k) batches.push_back(randn({4, 3, 10, 10}, 10 + k));
  quant::calibrate(*q, batches, [](const AnyTensor& x) { return x; });
  const auto r = triton::export_model(*cnn, {randn({2, 3, 10, 10}, 3)}, repo,
                                      {.config = {.name = "cnn", .max_batch_size = 8,
                                                  .instance_kind = triton::InstanceKind::Cpu, .instance_count = 2,
                                                  .preferred_batch_sizes = {4, 8}, .max_queue_delay_us = 100},
                                       .int8 = q});
  CHECK(r.model_dir == repo / "cnn");
  CHECK(r.int8_dir == repo / "cnn_int8");
  CHECK(fs::exists(repo / "cnn" / "1" / "model.onnx"));
  CHECK(fs::exists(repo / "cnn_int8" / "1" / "model.onnx"));
  CHECK(read_text(repo / "cnn" / "config.pbtxt") == r.config);
  CHECK(read_text(repo / "cnn_int8" / "config.pbtxt") == r.int8_config);
  CHECK_THAT(r.int8_config, Contains("name: \"cnn_int8\"") && Contains("dims: [ 3, 10, 10 ]"));
  // An fp16 MLP that Triton does not batch.
  triton::export_model(*make_mlp(4), {AnyTensor(randn({3, 12}, 5)).to(DType::Float16)}, repo,
                       {.config = {.name = "mlp_fp16", .max_batch_size = 0, .dynamic_batching = false}});
  // A GPT: token ids [batch, sequence] in, logits out.
  {
    Generator g(6);
    GeneratorScope scope(g);
    nn::GPT gpt(nn::GPTConfig{.vocab_size = 40, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 8});
    triton::export_model(gpt, {Tensor<int64_t>::from_vector({1, 2, 3, 4}, {2, 2})}, repo,
                         {.config = {.name = "gpt", .max_batch_size = 4}});
  }
  // A graph whose input and output are only the batch.
  triton::add_onnx_model(write_graph(dir.path / "scalar.onnx", {{"x", onnx::ElemType::Float, {sym("n")}}},
                                     {{"y", onnx::ElemType::Float, {sym("n")}}}),
                         repo, {.config = {.name = "scalar", .max_batch_size = 8}});
  // An earlier export whose weights sit in a data file, added as version 2.
  onnx::export_model(*make_mlp(7), {randn({2, 12}, 8)}, dir.path / "mlp.onnx",
                     {.external_data = onnx::ExternalData::Always, .external_min_tensor_bytes = 64});
  const auto added = triton::add_onnx_model(dir.path / "mlp.onnx", repo,
                                            {.config = {.name = "mlp_external", .max_batch_size = 16}, .version = 2});
  REQUIRE(added.signature.data_files.size() == 1);
  CHECK(fs::exists(repo / "mlp_external" / "2" / added.signature.data_files[0]));
  CHECK_FALSE(has_hidden(repo));

  std::string out;
  const auto result = check_repository(repo, out);
  if (!result) return;
  INFO(out);
  REQUIRE(result->size() == 6);
  for (const auto& [name, j] : *result) {
    INFO("model " << name);
    CHECK(j["ok"] == true);
  }
  const auto& c = result->at("cnn");
  CHECK(c["max_batch_size"] == 8);
  CHECK(c["ran_batches"] == nlohmann::json::array({3, 8}));
  CHECK(entries(c["inputs"]) == Entries{{"input", "TYPE_FP32", {3, 10, 10}}});
  CHECK(entries(c["outputs"]) == Entries{{"output", "TYPE_FP32", {5}}});
  CHECK(c["instance_group"] == nlohmann::json::array({nlohmann::json::array({2, "KIND_CPU"})}));
  CHECK(c["preferred_batch_size"] == nlohmann::json::array({4, 8}));
  CHECK(c["max_queue_delay_microseconds"] == 100);
  CHECK(entries(result->at("cnn_int8")["inputs"]) == Entries{{"input", "TYPE_FP32", {3, 10, 10}}});
  const auto& m = result->at("mlp_fp16");
  CHECK(m["max_batch_size"] == 0);
  CHECK(m["dynamic_batching"] == false);
  CHECK(entries(m["inputs"]) == Entries{{"input", "TYPE_FP16", {-1, 12}}});
  CHECK(entries(m["outputs"]) == Entries{{"output", "TYPE_FP16", {-1, 4}}});
  CHECK(entries(result->at("gpt")["inputs"]) == Entries{{"input", "TYPE_INT64", {-1}}});
  CHECK(entries(result->at("gpt")["outputs"]) == Entries{{"output", "TYPE_FP32", {-1, 40}}});
  CHECK(result->at("gpt")["ran_batches"] == nlohmann::json::array({3, 4}));
  CHECK(entries(result->at("scalar")["inputs"]) == Entries{{"x", "TYPE_FP32", {1}}});
  CHECK(result->at("mlp_external")["versions"] == nlohmann::json::array({"2"}));
  CHECK(result->at("mlp_external")["ran_batches"] == nlohmann::json::array({3, 16}));
}

TEST_CASE("triton repository: a model folder is replaced whole or not at all", "[triton]") {
  TempDir dir;
  const fs::path repo = dir.path / "models";
  triton::export_model(*make_mlp(1), {randn({2, 12}, 2)}, repo, {.config = {.name = "mlp"}});
  const std::string first = read_text(repo / "mlp" / "config.pbtxt");
  // Without replace: an error naming the folder, and the folder as it was.
  CHECK_THROWS_WITH(triton::export_model(*make_mlp(1), {randn({2, 12}, 2)}, repo,
                                         {.config = {.name = "mlp", .max_batch_size = 4}, .version = 2}),
                    Contains("models/mlp' already exists") && Contains("replace = true"));
  CHECK(fs::exists(repo / "mlp" / "1" / "model.onnx"));
  // A failure while the new folder is built (a module with no ONNX form) leaves the old one.
  auto bad = std::make_shared<nn::Sequential>();
  bad->emplace<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{3, 3});
  CHECK_THROWS_WITH(triton::export_model(*bad, {randn({1, 2, 8, 8}, 3)}, repo,
                                         {.config = {.name = "mlp"}, .replace = true}),
                    Contains("AdaptiveAvgPool2d '0'"));
  CHECK(read_text(repo / "mlp" / "config.pbtxt") == first);
  CHECK_FALSE(has_hidden(repo));
  // A batch dimension exported fixed (only the sequence symbolic) cannot be batched by Triton.
  {
    Generator g(5);
    GeneratorScope scope(g);
    nn::GPT gpt(nn::GPTConfig{.vocab_size = 40, .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 8});
    CHECK_THROWS_WITH(triton::export_model(gpt, {Tensor<int64_t>::from_vector({1, 2, 3, 4}, {2, 2})}, repo,
                                           {.config = {.name = "mlp", .max_batch_size = 4}, .replace = true,
                                            .onnx = {.dynamic_axes = {{1, "sequence"}}}}),
                      Contains("dimension 0 of input 'input' [2, sequence] to be symbolic") && Contains("fixed at 2"));
  }
  CHECK(read_text(repo / "mlp" / "config.pbtxt") == first);
  // The INT8 variant failing (a model still calibrating) leaves both folders as they were.
  auto mlp = make_mlp(1);
  auto q = quant::prepare(*mlp);
  quant::set_mode(*q, quant::QuantMode::Calibrate);
  CHECK_THROWS_WITH(triton::export_model(*mlp, {randn({2, 12}, 2)}, repo,
                                         {.config = {.name = "mlp", .max_batch_size = 4}, .replace = true, .int8 = q}),
                    Contains("still calibrating"));
  CHECK(read_text(repo / "mlp" / "config.pbtxt") == first);
  CHECK_FALSE(fs::exists(repo / "mlp_int8"));
  CHECK_FALSE(has_hidden(repo));
  // With replace: the new folder, and the old one's version 1 is gone with it.
  const auto r = triton::export_model(*make_mlp(1), {randn({2, 12}, 2)}, repo,
                                      {.config = {.name = "mlp", .max_batch_size = 4}, .version = 2, .replace = true});
  CHECK(read_text(repo / "mlp" / "config.pbtxt") == r.config);
  CHECK_THAT(r.config, Contains("max_batch_size: 4"));
  CHECK(fs::exists(repo / "mlp" / "2" / "model.onnx"));
  CHECK_FALSE(fs::exists(repo / "mlp" / "1"));
  CHECK_FALSE(has_hidden(repo));
}

TEST_CASE("triton: bad names, options, shapes, types and files are clear errors that write nothing", "[triton]") {
  TempDir dir;
  const fs::path repo = dir.path / "models";
  const fs::path batched = write_graph(dir.path / "batched.onnx", {{"x", onnx::ElemType::Float, {sym("b"), fix(3)}}},
                                       {{"y", onnx::ElemType::Float, {sym("b"), fix(3)}}});
  auto add = [&](const fs::path& f, triton::ConfigOptions c, int64_t version = 1) {
    return message_of([&] { triton::add_onnx_model(f, repo, {.config = std::move(c), .version = version}); });
  };
  for (const char* name : {"", ".hidden", "..", "a/b", "a b", "caf\xc3\xa9"}) {
    INFO("name '" << name << "'");
    CHECK_THAT(add(batched, {.name = name}), Contains("Triton config: model name '" + std::string(name) + "'"));
  }
  CHECK_THAT(add(batched, {.name = "m", .max_batch_size = -1}), Contains("max_batch_size -1 is negative"));
  CHECK_THAT(add(batched, {.name = "m", .max_batch_size = 0}), Contains("dynamic_batching needs max_batch_size > 0"));
  CHECK_THAT(add(batched, {.name = "m", .max_batch_size = 8, .preferred_batch_sizes = {4, 16}}),
             Contains("preferred batch size 16 must be within 1..max_batch_size (8)"));
  CHECK_THAT(add(batched, {.name = "m", .instance_count = 0}), Contains("instance_count 0 must be at least 1"));
  CHECK_THAT(add(batched, {.name = "m"}, 0), Contains("model 'm' version 0 must be at least 1"));
  // A fixed batch dimension with batching on; served unbatched it is fine.
  const fs::path fixed = write_graph(dir.path / "fixed.onnx", {{"x", onnx::ElemType::Float, {fix(4), fix(12)}}},
                                     {{"y", onnx::ElemType::Float, {fix(4), fix(12)}}});
  CHECK_THAT(add(fixed, {.name = "m"}),
             Contains("Triton config 'm': max_batch_size 8 needs dimension 0 of input 'x' [4, 12] to be symbolic") &&
                 Contains("fixed at 4"));
  const auto unbatched = triton::add_onnx_model(fixed, dir.path / "other",
                                                {.config = {.name = "fixed", .max_batch_size = 0, .dynamic_batching = false}});
  CHECK_THAT(unbatched.config, Contains("max_batch_size: 0\n") && Contains("dims: [ 4, 12 ]"));
  const fs::path scalar = write_graph(dir.path / "scalar.onnx", {{"x", onnx::ElemType::Float, {}}},
                                      {{"y", onnx::ElemType::Float, {}}});
  CHECK_THAT(add(scalar, {.name = "m"}), Contains("input 'x' is a scalar, but max_batch_size 8"));
  // An element type Triton has no name for (complex64).
  const fs::path complex = write_graph(dir.path / "complex.onnx", {{"x", static_cast<onnx::ElemType>(14), {sym("b")}}},
                                       {{"y", static_cast<onnx::ElemType>(14), {sym("b")}}});
  CHECK_THAT(add(complex, {.name = "m"}), Contains("tensor 'x' has ONNX element type 14, which has no Triton data type"));
  // Files that are not models, or not there.
  {
    std::ofstream(dir.path / "junk.onnx") << "\xff\xff\xff";
  }
  CHECK_THAT(add(dir.path / "junk.onnx", {.name = "m"}), Contains("junk.onnx' is not a valid model"));
  {
    std::ofstream(dir.path / "text.onnx") << "hello";
  }
  CHECK_THAT(add(dir.path / "text.onnx", {.name = "m"}), Contains("text.onnx"));
  CHECK_THROWS_AS(triton::add_onnx_model(dir.path / "missing.onnx", repo, {.config = {.name = "m"}}), IOError);
  // External data outside the model's folder.
  onnx::TensorData w{"w", onnx::ElemType::Float, {1}, ""};
  onnx::Model m;
  m.opsets = {{"", 21}};
  m.graph.nodes.push_back(onnx::Node{"Add", "add", "", {"x", "w"}, {"y"}, {}});
  m.graph.inputs = {{"x", onnx::ElemType::Float, {sym("b")}}};
  m.graph.outputs = {{"y", onnx::ElemType::Float, {sym("b")}}};
  m.graph.initializers = {w};
  const onnx::ExternalPlace outside{"../secret.data", 0, 4};
  io::write_file_atomic(dir.path / "outside.onnx", onnx::encode_model(m, {&outside}));
  CHECK_THAT(add(dir.path / "outside.onnx", {.name = "m"}),
             Contains("names the external data file '../secret.data' outside its folder"));
  // export_model checks its options before it exports anything.
  CHECK_THAT(message_of([&] {
               triton::export_model(*make_mlp(1), {randn({2, 12}, 2)}, repo,
                                    {.config = {.name = "m", .max_batch_size = 0, .dynamic_batching = true}});
             }),
             Contains("dynamic_batching needs max_batch_size > 0"));
  // Nothing was written: no model folder, no temporary one.
  CHECK((!fs::exists(repo) || fs::is_empty(repo)));
}
