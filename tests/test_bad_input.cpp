// Bad inputs. Every op's (wrong shapes, empty and 0-d tensors, dimensions out of range, absurd
// sizes, out-of-range indices, operands on different devices) are declared in the registry of op
// cases (tests/op_cases.hpp); this harness runs them: one test per op, "bad input: <op>". Each
// call must raise the declared type with every declared fragment in its message (the op, and the
// shapes, dtypes or devices where they matter). The tables below are the same check for what is
// not an op: the layers, the optimizers, options and the tensor's own entry points.
//
// Where PyTorch accepts an empty or 0-d input, the op family's file checks the result
// (tests/test_<family>.cpp, "... accept ..."). Not repeated here: the cases of test_errors.cpp (one
// of each kind) and test_size_overflow.cpp (overflowing sizes).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include <ember/ember.hpp>

#include "op_cases.hpp"
#include "pretend_gpu.hpp"

using namespace ember;
using namespace ember::testing;

namespace {

// Runs each call; reports a failing one by name, with what it raised.
void check_raises(const std::vector<BadInput>& cases) {
  for (const BadInput& c : cases) {
    INFO("case: " << c.what);
    bool threw = false, right_type = false;
    std::string what, seen = "(nothing)";
    try {
      c.call();
    } catch (const std::exception& e) {
      threw = true;
      right_type = c.is_type(e);
      what = e.what();
      seen = typeid(e).name();
    } catch (...) {
      threw = true;
      seen = "a non-std exception";
    }
    INFO("expected " << c.type_name << ", got " << seen << ": \"" << what << "\"");
    CHECK(threw);
    CHECK(right_type);
    for (const std::string& s : c.fragments) {
      INFO("the message must contain \"" << s << "\"");
      CHECK(what.find(s) != std::string::npos);
    }
  }
}

bool needs_device(const OpSpec& op) {
  for (const BadInput& b : op.bad)
    if (b.on_device) return true;
  return false;
}

const bool registered = [] {
  for (const OpSpec& op : op_registry()) {
    if (op.bad.empty()) continue;
    register_test_case("bad input: " + op.name, "[bad_input][" + op.family + "]", [&op] {
      // cuda:0 made of CPU kernels where there is no GPU, for the calls on two devices
      std::optional<PretendGpu> pretend;
      if (needs_device(op)) pretend.emplace();
      check_raises(op.bad);
    });
  }
  return true;
}();

using F = Tensor<float>;
using D = Tensor<double>;
using I64 = Tensor<int64_t>;

I64 idx(const std::vector<int64_t>& v) { return I64::from_vector(v); }
F scalar_f(float v) { return F::scalar(v); }

}  // namespace

TEST_CASE("bad input: nn layers' forward", "[bad_input]") {
  nn::Linear lin(4, 3);
  nn::Conv2d conv(2, 4, 3);
  nn::Embedding emb(5, 2);
  nn::LayerNorm ln(std::vector<int64_t>{3, 4});
  nn::RMSNorm rms(4);
  nn::BatchNorm1d bn1(3);
  nn::BatchNorm2d bn2(3);
  nn::MultiheadAttention mha(4, 2);
  nn::MaxPool2d pool(2);
  const F q = F::ones({2, 5, 4});
  check_raises({
      bad<ShapeError>("Linear(4, 3) on [2, 5]", [&] { lin(F::ones({2, 5})); },
                      {"Linear(4, 3)", "[2, 5]", "4 features"}),
      bad<ShapeError>("Linear(4, 3) on a 0-d tensor", [&] { lin(scalar_f(1)); }, {"Linear(4, 3)", "float32[]"}),
      bad<ShapeError>("Linear(4, 3) on [4, 0]", [&] { lin(F::ones({4, 0})); }, {"Linear(4, 3)", "[4, 0]"}),
      bad<ValueError>("Linear(0, 3)", [&] { nn::Linear(0, 3); }, {"Linear", "positive", "0 -> 3"}),
      bad<ShapeError>("Conv2d(2, 4) on 3 channels", [&] { conv(F::ones({1, 3, 5, 5})); }, {"conv2d", "[1, 3, 5, 5]"}),
      bad<ShapeError>("Conv2d on an unbatched [2, 5, 5]", [&] { conv(F::ones({2, 5, 5})); }, {"conv2d", "[2, 5, 5]"}),
      bad<ShapeError>("Conv2d on a 2x2 image", [&] { conv(F::ones({1, 2, 2, 2})); }, {"conv2d", "too small"}),
      bad<ShapeError>("Conv2d(1, 1, 3) on a 2x2 image", [&] { nn::Conv2d(1, 1, 3)(F::ones({1, 1, 2, 2})); },
                      {"conv2d"}),
      bad<ValueError>("Conv2d groups 3 for 2 channels", [&] { nn::Conv2d(2, 4, 3, {.groups = 3}); },
                      {"Conv2d", "groups 3"}),
      bad<IndexError>("Embedding(5, 2) id 5", [&] { emb(idx({0, 5})); }, {"embedding", "index 5", "size 5"}),
      bad<IndexError>("Embedding(5, 2) id -1", [&] { emb(idx({-1})); }, {"embedding", "index -1"}),
      bad<DTypeError>("Embedding float ids", [&] { emb(F::zeros({2})); }, {"Embedding", "int64 or int32", "float32"}),
      bad<ValueError>("Embedding(5, 0)", [&] { nn::Embedding(5, 0); }, {"Embedding", "5 x 0"}),
      // Absurd sizes: refused before anything is allocated, naming the layer.
      bad<ShapeError>("Linear(2^40, 2^40)", [&] { nn::Linear(int64_t{1} << 40, int64_t{1} << 40); },
                      {"Linear", "[1099511627776, 1099511627776]"}),
      bad<OutOfMemory>("Embedding(2^31, 2^31)", [&] { nn::Embedding(int64_t{1} << 31, int64_t{1} << 31); },
                       {"Embedding", "4611686018427387904 elements"}),
      bad<ShapeError>("Conv2d(2^32, 2^32, 3)", [&] { nn::Conv2d(int64_t{1} << 32, int64_t{1} << 32, 3); },
                      {"Conv2d", "4294967296"}),
      bad<ShapeError>("LayerNorm([3, 4]) on [2, 4, 3]", [&] { ln(F::ones({2, 4, 3})); },
                      {"layer_norm", "[2, 4, 3]", "[3, 4]"}),
      bad<ShapeError>("LayerNorm([3, 4]) on [4]", [&] { ln(F::ones({4})); }, {"layer_norm", "[4]"}),
      bad<ValueError>("LayerNorm([2, -1])", [&] { nn::LayerNorm(std::vector<int64_t>{2, -1}); },
                      {"LayerNorm", "[2, -1]", "positive"}),
      bad<ValueError>("RMSNorm(0)", [&] { nn::RMSNorm(0); }, {"RMSNorm", "[0]"}),
      bad<ShapeError>("RMSNorm(4) on [4, 3]", [&] { rms(F::ones({4, 3})); }, {"rms_norm", "[4, 3]"}),
      bad<ShapeError>("BatchNorm1d(3) on [2, 4]", [&] { bn1(F::ones({2, 4})); },
                      {"BatchNorm1d(3)", "[2, 4]", "4 channels"}),
      bad<ShapeError>("BatchNorm1d(3) on [2, 3, 4, 5]", [&] { bn1(F::ones({2, 3, 4, 5})); }, {"BatchNorm1d(3)", "2-D"}),
      bad<ShapeError>("BatchNorm1d(3) on [3]", [&] { bn1(F::ones({3})); }, {"BatchNorm1d(3)", "[3]"}),
      bad<ShapeError>("BatchNorm2d(3) on [2, 3, 4]", [&] { bn2(F::ones({2, 3, 4})); }, {"BatchNorm2d(3)", "4-D"}),
      bad<ValueError>("BatchNorm2d(3) training on one value per channel", [&] { bn2(F::ones({1, 3, 1, 1})); },
                      {"BatchNorm2d", "more than 1 value per channel", "[1, 3, 1, 1]"}),
      bad<ValueError>("BatchNorm1d(0)", [&] { nn::BatchNorm1d(0); }, {"BatchNorm1d", "num_features"}),
      bad<ShapeError>("MaxPool2d on a 1x1 image", [&] { pool(F::ones({1, 1, 1, 1})); }, {"max_pool2d", "[1, 1, 1, 1]"}),
      bad<ShapeError>("MaxPool2d(3) on a 2x2 image", [&] { nn::MaxPool2d(3)(F::ones({1, 1, 2, 2})); }, {"max_pool2d"}),
      bad<ShapeError>("MultiheadAttention(4, 2) on embed 3", [&] { mha(F::ones({2, 5, 3})); },
                      {"MultiheadAttention(4, 2)", "[2, 5, 3]", "embed_dim 4"}),
      bad<ShapeError>("MultiheadAttention on a 4-d query", [&] { mha(F::ones({1, 2, 5, 4})); },
                      {"MultiheadAttention", "3-D", "[1, 2, 5, 4]"}),
      bad<ShapeError>("MultiheadAttention on a 1-d query", [&] { mha(F::ones({4})); }, {"MultiheadAttention", "[4]"}),
      bad<ShapeError>("MultiheadAttention key of rank 2, query of rank 3",
                      [&] { mha.forward(q, F::ones({5, 4}), F::ones({5, 4})); },
                      {"MultiheadAttention", "[5, 4]"}),
      bad<ShapeError>("MultiheadAttention batch 2 against 3",
                      [&] { mha.forward(q, F::ones({3, 5, 4}), F::ones({3, 5, 4})); },
                      {"MultiheadAttention", "batch sizes differ", "[3, 5, 4]"}),
      bad<ShapeError>("MultiheadAttention key 6 against value 5", [&] { mha.forward(q, F::ones({2, 6, 4}), q); },
                      {"MultiheadAttention", "sequence length", "[2, 6, 4]"}),
      bad<ShapeError>("MultiheadAttention attn_mask [5, 4]",
                      [&] { mha.forward(q, nn::AttentionMask{.attn_mask = F::zeros({5, 4})}); },
                      {"MultiheadAttention", "attn_mask", "[5, 4]", "[5, 5]"}),
      bad<ShapeError>("MultiheadAttention attn_mask [3, 5, 5]",
                      [&] { mha.forward(q, nn::AttentionMask{.attn_mask = F::zeros({3, 5, 5})}); },
                      {"MultiheadAttention", "attn_mask", "[4, 5, 5]"}),
      bad<ShapeError>("MultiheadAttention key_padding_mask [5, 2]",
                      [&] { mha.forward(q, nn::AttentionMask{.key_padding_mask = Tensor<uint8_t>::zeros({5, 2})}); },
                      {"MultiheadAttention", "key_padding_mask", "[5, 2]", "[2, 5]"}),
      bad<DTypeError>("MultiheadAttention int64 attn_mask",
                      [&] { mha.forward(q, nn::AttentionMask{.attn_mask = I64::zeros({5, 5})}); },
                      {"MultiheadAttention", "mask", "int64"}),
      bad<ValueError>("MultiheadAttention(6, 4)", [&] { nn::MultiheadAttention(6, 4); },
                      {"MultiheadAttention", "embed_dim 6", "num_heads 4"}),
  });
  // Accepted: empty batches pass through every layer with the right output shape.
  CHECK(lin(F::zeros({0, 4})).shape() == Shape{0, 3});
  CHECK(lin(F::ones({4})).shape() == Shape{3});
  CHECK(conv(F::zeros({0, 2, 5, 5})).shape() == Shape{0, 4, 3, 3});
  CHECK(emb(I64::zeros({0})).shape() == Shape{0, 2});
  CHECK(ln(F::zeros({0, 3, 4})).shape() == Shape{0, 3, 4});
  CHECK(mha(F::ones({5, 4})).shape() == Shape{5, 4});        // unbatched [L, E]
  CHECK(mha(F::ones({2, 0, 4})).shape() == Shape{2, 0, 4});  // no positions: an empty output
  // BatchNorm of an empty batch: an empty output and unchanged running statistics, as PyTorch.
  auto before = bn1.running_mean.to_double_vector();
  CHECK(bn1(F::zeros({0, 3})).shape() == Shape{0, 3});
  CHECK(bn1.running_mean.to_double_vector() == before);
  CHECK(bn1.num_batches_tracked.item_double() == 0.0);
  // In eval mode, one value per channel is fine (the running statistics are used).
  bn2.eval();
  CHECK(bn2(F::ones({1, 3, 1, 1})).shape() == Shape{1, 3, 1, 1});
}

TEST_CASE("bad input: optimizers given mismatched state or gradients", "[bad_input]") {
  auto p = F::ones({2, 3});
  p.set_requires_grad(true);
  auto q = F::ones({4});
  q.set_requires_grad(true);
  optim::SGD sgd({p, q}, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam({p, q});
  optim::RMSprop rmsprop({p});
  // A state dict of the same optimizer over other parameters.
  auto other = F::ones({3, 2});
  other.set_requires_grad(true);
  optim::SGD sgd_other({other, q}, {.lr = 0.1, .momentum = 0.9});
  other.set_grad(F::ones({3, 2}));
  q.set_grad(F::ones({4}));
  sgd_other.step();
  const auto other_sd = sgd_other.state_dict();
  optim::SGD sgd_one({q}, {.lr = 0.1});
  auto sd_dup = sgd.state_dict();
  sd_dup.param_groups[0].params = {0, 0};
  auto sd_stray = sgd.state_dict();
  sd_stray.state[7] = optim::ParamState{{"momentum_buffer", F::zeros({2, 3})}};
  auto sd_step = adam.state_dict();
  sd_step.state[0] = optim::ParamState{{"step", F::zeros({2})}};
  check_raises({
      bad<ShapeError>("SGD.load_state_dict with a [3, 2] momentum buffer for a [2, 3] parameter",
                      [&] { sgd.load_state_dict(other_sd); },
                      {"SGD.load_state_dict", "momentum_buffer", "[3, 2]", "[2, 3]"}),
      bad<ValueError>("SGD.load_state_dict with 1 parameter for 2", [&] { sgd.load_state_dict(sgd_one.state_dict()); },
                      {"SGD.load_state_dict", "1 parameter", "2"}),
      bad<ValueError>("Adam.load_state_dict of an SGD state dict", [&] { adam.load_state_dict(sgd.state_dict()); },
                      {"Adam.load_state_dict", "beta1"}),
      bad<ValueError>("SGD.load_state_dict with a repeated parameter index", [&] { sgd.load_state_dict(sd_dup); },
                      {"SGD.load_state_dict", "more than once"}),
      bad<ValueError>("SGD.load_state_dict with state for index 7", [&] { sgd.load_state_dict(sd_stray); },
                      {"SGD.load_state_dict", "index 7"}),
      bad<ShapeError>("Adam.load_state_dict with a 2-element step", [&] { adam.load_state_dict(sd_step); },
                      {"Adam.load_state_dict", "step", "[2]"}),
      bad<ValueError>("SGD hyperparameter 'lrr'", [&] { sgd.param_groups()[0]["lrr"] = 1.0; }, {"lrr", "lr"}),
      bad<ValueError>("Adam beta1 1.0", [&] { optim::Adam({p}, {.beta1 = 1.0}); }, {"Adam", "beta1=1"}),
      bad<ValueError>("SGD negative lr", [&] { optim::SGD({p}, {.lr = -1.0}); }, {"SGD", "lr=-1"}),
      bad<ValueError>("SGD of no parameters", [&] { optim::SGD(std::vector<AnyTensor>{}); },
                      {"SGD", "empty parameter list"}),
      bad<ValueError>("SGD of an undefined parameter", [&] { optim::SGD({AnyTensor()}); }, {"SGD", "undefined"}),
      bad<DTypeError>("SGD of an int64 parameter", [&] { optim::SGD({I64::ones({2})}); }, {"SGD", "int64"}),
      bad<ValueError>("SGD with a parameter twice", [&] { optim::SGD({p, p}); }, {"SGD", "more than once"}),
      // A gradient of another shape than its parameter (set by hand) is refused by step(), naming
      // the optimizer and both shapes: it used to broadcast ([1] into [2, 3]) silently, or fail in add.
      bad<ShapeError>("SGD.step with a [1] gradient for a [2, 3] parameter",
                      [&] { p.set_grad(F::ones({1})); sgd.step(); },
                      {"SGD", "gradient", "[1]", "[2, 3]"}),
      bad<ShapeError>("Adam.step with a [3, 2] gradient", [&] { p.set_grad(F::ones({3, 2})); adam.step(); },
                      {"Adam", "gradient", "[3, 2]", "[2, 3]"}),
      bad<ShapeError>("RMSprop.step with a [2, 3, 1] gradient", [&] { p.set_grad(F::ones({2, 3, 1})); rmsprop.step(); },
                      {"RMSprop", "gradient", "[2, 3, 1]"}),
      bad<DTypeError>("SGD.step with an int64 gradient", [&] { p.set_grad(I64::ones({2, 3})); sgd.step(); },
                      {"SGD", "gradient", "int64"}),
  });
  // Nothing was changed by the refused steps.
  CHECK(p.to_vector() == std::vector<float>(6, 1.0f));
  // The right gradient steps.
  p.set_grad(F::ones({2, 3}));
  q.zero_grad();
  sgd.step();
  CHECK(p.to_vector() == std::vector<float>(6, 0.9f));
}

TEST_CASE("bad input: operands on different devices", "[bad_input][device]") {
  // The ops' own are in the registry (bad_on_device); these are the layers' and an optimizer's.
  testing::PretendGpu pretend;  // cuda:0 made of CPU kernels where there is no GPU
  const Device gpu = Device::cuda(0);
  const F x = F::ones({2, 3});
  const F xg = F::ones({2, 3}, gpu);
  nn::MultiheadAttention mha(4, 2);
  nn::Linear lin(3, 2);
  nn::BatchNorm1d bn(3);
  auto p = F::ones({2});
  p.set_requires_grad(true);
  optim::SGD sgd({p});
  check_raises({
      bad<DeviceError>("Linear on cpu given a cuda:0 input", [&] { lin(xg); }, {"linear", "cuda:0", "on cpu"}),
      bad<DeviceError>("MultiheadAttention cuda:0 key",
                       [&] { mha.forward(F::ones({1, 2, 4}), F::ones({1, 2, 4}, gpu), F::ones({1, 2, 4})); },
                       {"MultiheadAttention", "cuda:0"}),
      bad<DeviceError>("MultiheadAttention cuda:0 attn_mask",
                       [&] { mha.forward(F::ones({1, 2, 4}), nn::AttentionMask{.attn_mask = F::zeros({2, 2}, gpu)}); },
                       {"MultiheadAttention", "cuda:0"}),
      bad<DeviceError>("BatchNorm1d on cpu given a cuda:0 input", [&] { bn(F::ones({4, 3}, gpu)); },
                       {"BatchNorm1d(3)", "cuda:0", "on cpu"}),
      bad<DeviceError>("SGD.step with a cuda:0 gradient for a cpu parameter",
                       [&] { p.set_grad(F::ones({2}, gpu)); sgd.step(); },
                       {"SGD.step", "cuda:0", "on cpu"}),
  });
  CHECK(p.to_vector() == std::vector<float>{1, 1});
  // Moving the operand fixes it.
  CHECK(sub(x, xg.to(Device::cpu())).to_vector() == std::vector<float>(6, 0.0f));
}

TEST_CASE("bad input: layer, scheduler and clipping options", "[bad_input]") {
  auto p = F::ones({2});
  p.set_requires_grad(true);
  optim::SGD sgd({p}, {.lr = 0.1});
  check_raises({
      bad<ValueError>("Dropout(1.5)", [&] { nn::Dropout(1.5); }, {"Dropout", "between 0 and 1", "1.5"}),
      bad<ValueError>("dropout p -0.5", [&] { nn::functional::dropout(F::ones({2}), -0.5); }, {"dropout", "-0.5"}),
      bad<ValueError>("GELU('fast')", [&] { nn::GELU("fast"); }, {"GELU", "'fast'"}),
      bad<ValueError>("MultiheadAttention dropout 2", [&] { nn::MultiheadAttention(4, 2, {.dropout = 2.0}); },
                      {"MultiheadAttention", "2"}),
      bad<ValueError>("BatchNorm2d momentum 1.5", [&] { nn::BatchNorm2d(3, {.momentum = 1.5}); },
                      {"BatchNorm2d", "momentum", "1.5"}),
      bad<ValueError>("BatchNorm1d eps -1", [&] { nn::BatchNorm1d(3, {.eps = -1.0}); }, {"BatchNorm1d", "eps"}),
      bad<ValueError>("TransformerBlock hidden_dim -1", [&] { nn::TransformerBlock(4, 2, {.hidden_dim = -1}); },
                      {"TransformerBlock", "hidden_dim", "-1"}),
      bad<ShapeError>("TransformerBlock(4, 2) on embed 5", [&] { nn::TransformerBlock(4, 2)(F::ones({1, 3, 5})); },
                      {"layer_norm", "[1, 3, 5]", "[4]"}),
      bad<ShapeError>("TransformerBlock(4, 2) on a 4-d input",
                      [&] { nn::TransformerBlock(4, 2)(F::ones({1, 1, 3, 4})); },
                      {"MultiheadAttention", "[1, 1, 3, 4]"}),
      bad<ValueError>("SmoothL1Loss beta -2", [&] { nn::SmoothL1Loss("mean", -2.0); }, {"SmoothL1Loss", "beta", "-2"}),
      bad<ValueError>("StepLR step_size 0", [&] { optim::StepLR(sgd, 0); }, {"StepLR", "step_size", "0"}),
      bad<ValueError>("CosineAnnealingLR T_max 0", [&] { optim::CosineAnnealingLR(sgd, 0); },
                      {"CosineAnnealingLR", "T_max"}),
      bad<ValueError>("WarmupCosineLR total below warmup",
                      [&] { optim::WarmupCosineLR(sgd, {.warmup_steps = 10, .total_steps = 5}); },
                      {"WarmupCosineLR", "total_steps", "5"}),
      bad<ValueError>("clip_grad_norm_ max_norm -1", [&] { optim::clip_grad_norm_({p}, -1.0); },
                      {"clip_grad_norm_", "max_norm", "-1"}),
      bad<ValueError>("clip_grad_norm_ norm_type 0", [&] { optim::clip_grad_norm_({p}, 1.0, 0.0); },
                      {"clip_grad_norm_", "norm_type", "0"}),
      bad<ValueError>("clip_grad_value_ -1", [&] { optim::clip_grad_value_({p}, -1.0); }, {"clip_grad_value_", "-1"}),
      bad<ValueError>("CrossEntropyLoss label_smoothing -0.1", [&] { nn::CrossEntropyLoss({.label_smoothing = -0.1}); },
                      {"CrossEntropyLoss", "label_smoothing"}),
      bad<ValueError>("MSELoss reduction 'mean '", [&] { nn::MSELoss("mean "); }, {"MSELoss", "'mean '"}),
      bad<ValueError>("RMSNorm over no dimensions", [&] { nn::RMSNorm(std::vector<int64_t>{}); }, {"RMSNorm"}),
      bad<ValueError>("Conv2d(3, 4, 3) groups 2", [&] { nn::Conv2d(3, 4, 3, {.groups = 2}); }, {"Conv2d", "groups 2"}),
  });
  // An unbatched [L, E] input goes through a block, as through MultiheadAttention.
  CHECK(nn::TransformerBlock(4, 2)(F::ones({3, 4})).shape() == Shape{3, 4});
  // A parameter without a gradient is skipped: clipping returns 0 and changes nothing.
  CHECK(optim::clip_grad_norm_({p}, 1.0) == 0.0);
  CHECK(p.to_vector() == std::vector<float>{1, 1});
}

TEST_CASE("bad input: tensor basics and autograd entry points", "[bad_input]") {
  const F x = F::ones({2, 3});
  auto leaf = F::ones({3});
  leaf.set_requires_grad(true);
  check_raises({
      bad<ShapeError>("item() of [2]", [&] { F::ones({2}).item(); }, {"item()", "[2]"}),
      bad<ShapeError>("item() of an empty tensor", [&] { F::zeros({0}).item(); }, {"item()", "[0]"}),
      bad<ShapeError>("copy_ [3] into [2, 3]", [&] { F::zeros({2, 3}).copy_(F::ones({3})); },
                      {"copy_", "[3]", "[2, 3]"}),
      bad<ShapeError>("from_vector 3 values for [2, 2]", [&] { F::from_vector({1, 2, 3}, Shape{2, 2}); },
                      {"from_vector", "3", "[2, 2]"}),
      bad<ValueError>("arange step 0", [&] { F::arange(0, 5, 0); }, {"arange", "step"}),
      bad<ShapeError>("zeros with a negative dimension", [&] { F::zeros({2, -1}); }, {"negative dimension -1"}),
      bad<ShapeError>("zeros of 9 dimensions", [&] { F::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}); },
                      {"more than 8 dimensions"}),
      bad<DTypeError>("Tensor<double> of a float32 tensor", [&] { D{AnyTensor(x)}; }, {"Tensor<float64>", "float32"}),
      bad<DTypeError>("set_requires_grad on int64", [&] { I64::ones({2}).set_requires_grad(true); },
                      {"set_requires_grad", "int64"}),
      bad<AutogradError>("set_requires_grad on a non-leaf", [&] { (leaf * 2.0).set_requires_grad(true); },
                         {"set_requires_grad", "leaf"}),
      bad<AutogradError>("backward of a non-scalar", [&] { (leaf * 2.0).backward(); },
                         {"backward", "non-scalar", "[3]"}),
      bad<AutogradError>("backward of a tensor that needs no grad", [&] { sum(x).backward(); },
                         {"backward", "does not require grad"}),
      bad<ShapeError>("backward with a [2] gradient for [3]", [&] { (leaf * 2.0).backward(F::ones({2})); },
                      {"backward", "gradient", "[2]", "[3]"}),
      bad<ShapeError>("backward with a float64 gradient for float32", [&] { (leaf * 2.0).backward(D::ones({3})); },
                      {"backward", "float64[3]", "float32[3]"}),
      bad<IndexError>("size(-3) of rank 2", [&] { x.size(-3); }, {"size", "dimension -3"}),
      bad<ValueError>("shape() of an undefined tensor", [&] { AnyTensor().shape(); }, {"undefined tensor"}),
      bad<ValueError>("reshape of an undefined tensor", [&] { AnyTensor().reshape({2}); }, {"reshape", "undefined"}),
      bad<ValueError>("reshape(Shape) of an undefined tensor", [&] { AnyTensor().reshape(Shape{2}); },
                      {"reshape", "undefined"}),
      bad<ValueError>("slice of an undefined tensor", [&] { AnyTensor().slice(0, 1); }, {"slice", "undefined"}),
      bad<ValueError>("select of an undefined tensor", [&] { AnyTensor().select(0); }, {"select", "undefined"}),
      bad<ValueError>("clone of an undefined tensor", [&] { AnyTensor().clone(); }, {"clone", "undefined"}),
      bad<ValueError>("to(device) of an undefined tensor", [&] { AnyTensor().to(Device::cpu()); },
                      {"to(device)", "undefined"}),
      bad<ValueError>("to(dtype) of an undefined tensor", [&] { AnyTensor().to(DType::Float64); },
                      {"to(dtype)", "undefined"}),
      bad<ValueError>("copy_ from an undefined tensor", [&] { F::zeros({2}).copy_(AnyTensor()); },
                      {"copy_ (source)", "undefined"}),
  });
  // Accepted: one-element tensors of any rank give item(); backward from a 0-d result.
  CHECK(scalar_f(7).item() == 7.0f);
  CHECK(F::full({1, 1, 1}, 3.0).item() == 3.0f);
  sum(leaf * 2.0).backward();
  CHECK(leaf.grad().to_vector() == std::vector<float>{2, 2, 2});
  auto e = D::zeros({0});
  e.set_requires_grad(true);
  sum(e).backward();  // a sum of nothing is 0 and its gradient is empty
  CHECK(e.grad().shape() == Shape{0});
}
