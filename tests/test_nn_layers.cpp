// Layers: LayerNorm, BatchNorm1d/2d, Dropout, MultiheadAttention, TransformerBlock. Forward values
// against references written here with plain loops, PyTorch's parameter/buffer names, running
// statistics, the Philox dropout mask, the causal mask, gradients by finite differences in double
// (module parameters included, 3 seeds), and error messages; a tree of layers as named_modules()
// lists it and as it prints.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gradcheck.hpp"

using namespace ember;
using Catch::Contains;
namespace F = ember::nn::functional;

namespace {

std::vector<double> host(const AnyTensor& t) { return t.to_double_vector(); }

std::vector<std::string> names_of(const nn::StateDict& sd) {
  std::vector<std::string> v;
  for (auto& [n, t] : sd) v.push_back(n);
  return v;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == Approx(want[i]).epsilon(tol).margin(tol));
  }
}

// Fills every parameter of a module with values from N(mean, std) (not the defaults ones/zeros,
// which would hide a missing or transposed weight).
void randomize(nn::Module& m, uint64_t seed, double mean = 0.0, double std = 0.5) {
  Generator gen(seed);
  for (auto& p : m.parameters()) nn::init::normal_(p, mean, std, gen);
}

// The gradients of m's forward (its parameters included) at a random input of `shape` (from
// `seed`) against finite differences.
template <class M>
void check_forward_gradients(M& m, const Shape& shape, uint64_t seed) {
  CHECK_MODULE_GRADIENTS([&](const std::vector<AnyTensor>& in) { return m.forward_any(in[0]); },
                         testing::random_inputs({shape}, seed), m);
}

// Rows of length `row` normalised with the biased variance, then * w + b (w, b of length row).
std::vector<double> layer_norm_ref(const std::vector<double>& x, size_t row, const std::vector<double>& w,
                                   const std::vector<double>& b, double eps = 1e-5) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / row; ++r) {
    double m = 0, v = 0;
    for (size_t i = 0; i < row; ++i) m += x[r * row + i];
    m /= static_cast<double>(row);
    for (size_t i = 0; i < row; ++i) v += (x[r * row + i] - m) * (x[r * row + i] - m);
    v /= static_cast<double>(row);
    for (size_t i = 0; i < row; ++i)
      y[r * row + i] = (x[r * row + i] - m) / std::sqrt(v + eps) * (w.empty() ? 1.0 : w[i]) + (b.empty() ? 0.0 : b[i]);
  }
  return y;
}

// Per-channel batch statistics of x laid out [N, C, R] (R = product of the trailing dims).
struct ChannelStats {
  std::vector<double> mean, var_biased, var_unbiased;
};
ChannelStats channel_stats(const std::vector<double>& x, int64_t N, int64_t C, int64_t R) {
  ChannelStats s;
  const double n = static_cast<double>(N * R);
  for (int64_t c = 0; c < C; ++c) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t r = 0; r < R; ++r) m += x[static_cast<size_t>((i * C + c) * R + r)];
    m /= n;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t r = 0; r < R; ++r) {
        double d = x[static_cast<size_t>((i * C + c) * R + r)] - m;
        v += d * d;
      }
    s.mean.push_back(m);
    s.var_biased.push_back(v / n);
    s.var_unbiased.push_back(v / (n - 1));
  }
  return s;
}
std::vector<double> batch_norm_ref(const std::vector<double>& x, int64_t N, int64_t C, int64_t R,
                                   const std::vector<double>& mean, const std::vector<double>& var,
                                   const std::vector<double>& w, const std::vector<double>& b, double eps = 1e-5) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r) {
        size_t k = static_cast<size_t>((i * C + c) * R + r);
        size_t cc = static_cast<size_t>(c);
        y[k] = (x[k] - mean[cc]) / std::sqrt(var[cc] + eps) * (w.empty() ? 1.0 : w[cc]) + (b.empty() ? 0.0 : b[cc]);
      }
  return y;
}

// Multi-head attention by explicit loops, in double. q [N, L, E], k and v [N, S, E]; W [3E, E],
// b [3E], Wo [E, E], bo [E]; mask(n, h, i, j) is added to the scaled scores.
struct MhaRef {
  std::vector<double> out, weights;  // [N, L, E], head-averaged [N, L, S]
};
using MaskFn = std::function<double(int64_t, int64_t, int64_t, int64_t)>;
MhaRef mha_ref(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v, int64_t N,
               int64_t L, int64_t S, int64_t E, int64_t H, const std::vector<double>& W, const std::vector<double>& b,
               const std::vector<double>& Wo, const std::vector<double>& bo, const MaskFn& mask = {}) {
  const int64_t D = E / H;
  auto proj = [&](const std::vector<double>& x, int64_t rows, int64_t part) {
    std::vector<double> y(static_cast<size_t>(rows * E));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < E; ++o) {
        double s = b.empty() ? 0.0 : b[static_cast<size_t>(part * E + o)];
        for (int64_t e = 0; e < E; ++e) s += x[static_cast<size_t>(r * E + e)] * W[static_cast<size_t>((part * E + o) * E + e)];
        y[static_cast<size_t>(r * E + o)] = s;
      }
    return y;
  };
  auto Q = proj(q, N * L, 0), K = proj(k, N * S, 1), V = proj(v, N * S, 2);
  std::vector<double> ctx(static_cast<size_t>(N * L * E), 0.0);
  MhaRef r;
  r.weights.assign(static_cast<size_t>(N * L * S), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(S));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += Q[static_cast<size_t>((n * L + i) * E + h * D + d)] * K[static_cast<size_t>((n * S + j) * E + h * D + d)];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(D)) + (mask ? mask(n, h, i, j) : 0.0);
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - mx));
        for (int64_t j = 0; j < S; ++j) {
          double p = s[static_cast<size_t>(j)] / z;
          r.weights[static_cast<size_t>((n * L + i) * S + j)] += p / static_cast<double>(H);
          for (int64_t d = 0; d < D; ++d)
            ctx[static_cast<size_t>((n * L + i) * E + h * D + d)] += p * V[static_cast<size_t>((n * S + j) * E + h * D + d)];
        }
      }
  r.out.assign(static_cast<size_t>(N * L * E), 0.0);
  for (int64_t t = 0; t < N * L; ++t)
    for (int64_t o = 0; o < E; ++o) {
      double s = bo.empty() ? 0.0 : bo[static_cast<size_t>(o)];
      for (int64_t e = 0; e < E; ++e) s += ctx[static_cast<size_t>(t * E + e)] * Wo[static_cast<size_t>(o * E + e)];
      r.out[static_cast<size_t>(t * E + o)] = s;
    }
  return r;
}

MhaRef mha_ref(const nn::MultiheadAttention& m, const std::vector<double>& q, const std::vector<double>& k,
               const std::vector<double>& v, int64_t N, int64_t L, int64_t S, const MaskFn& mask = {}) {
  return mha_ref(q, k, v, N, L, S, m.embed_dim(), m.num_heads(), host(m.in_proj_weight),
                 m.in_proj_bias.defined() ? host(m.in_proj_bias) : std::vector<double>{}, host(m.out_proj->weight),
                 m.out_proj->bias.defined() ? host(m.out_proj->bias) : std::vector<double>{}, mask);
}

const double kInf = std::numeric_limits<double>::infinity();
MaskFn causal() {
  return [](int64_t, int64_t, int64_t i, int64_t j) { return j > i ? -kInf : 0.0; };
}

// y = x W^T + b for rows of x.
std::vector<double> linear_ref(const std::vector<double>& x, int64_t in, int64_t out, const std::vector<double>& W,
                               const std::vector<double>& b) {
  const size_t rows = x.size() / static_cast<size_t>(in);
  std::vector<double> y(rows * static_cast<size_t>(out));
  for (size_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[static_cast<size_t>(o)];
      for (int64_t e = 0; e < in; ++e) s += x[r * static_cast<size_t>(in) + static_cast<size_t>(e)] * W[static_cast<size_t>(o * in + e)];
      y[r * static_cast<size_t>(out) + static_cast<size_t>(o)] = s;
    }
  return y;
}

}  // namespace

// ---------------------------------------------------------------- LayerNorm

TEST_CASE("LayerNorm: parameters, forward against a hand loop, affine options", "[nn][norm][layernorm]") {
  nn::LayerNorm ln(std::vector<int64_t>{3, 4});
  CHECK(names_of(ln.state_dict()) == std::vector<std::string>{"weight", "bias"});
  CHECK(ln.weight.shape() == Shape{3, 4});
  CHECK(host(ln.weight) == std::vector<double>(12, 1.0));
  CHECK(host(ln.bias) == std::vector<double>(12, 0.0));
  randomize(ln, 5, 1.0, 0.5);
  auto x = Tensor<float>::randn({2, 3, 4}, Device::cpu(), 1.0, 3.0);
  auto y = ln(x);
  CHECK(y.shape() == x.shape());
  check_close(host(y), layer_norm_ref(host(x), 12, host(ln.weight), host(ln.bias)), 1e-5);

  nn::LayerNorm plain(4, {.elementwise_affine = false});
  CHECK(plain.parameters().empty());
  check_close(host(plain(x)), layer_norm_ref(host(x), 4, {}, {}), 1e-5);
  nn::LayerNorm nobias(4, {.bias = false});
  CHECK(names_of(nobias.state_dict()) == std::vector<std::string>{"weight"});
  // eps matters for a constant row: (x - m) / sqrt(0 + eps) = 0, and with a large eps values shrink.
  nn::LayerNorm big_eps(4, {.eps = 1.0, .elementwise_affine = false});
  check_close(host(big_eps(x)), layer_norm_ref(host(x), 4, {}, {}, 1.0), 1e-5);

  CHECK_THROWS_AS(ln(Tensor<float>::zeros({2, 3, 5})), ShapeError);
  CHECK_THROWS_WITH(ln(Tensor<float>::zeros({4})), Contains("layer_norm") && Contains("[3, 4]"));
  CHECK_THROWS_AS(nn::LayerNorm(std::vector<int64_t>{}), ValueError);
}

TEST_CASE("LayerNorm: half/bfloat16 in, statistics in fp32, same type out", "[nn][norm][layernorm][precision]") {
  nn::LayerNorm ln(8);
  randomize(ln, 2, 1.0, 0.3);
  // A large offset: a half-precision mean/variance would lose the small spread.
  auto x = Tensor<float>::randn({4, 8}, Device::cpu(), 0.0, 0.5) + 300.0;
  auto xh = x.to<half>();
  auto yh = ln(xh);
  static_assert(std::is_same_v<decltype(yh), Tensor<half>>);
  auto ref = host(ln(xh.to<float>()));  // fp32 on the same rounded inputs
  auto got = host(yh);
  for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).margin(5e-3 * (1 + std::fabs(ref[i]))));
  auto yb = ln(x.to<bfloat16>());
  CHECK(yb.dtype() == DType::BFloat16);
}

TEST_CASE("LayerNorm: gradients in double, parameters included (3 seeds)", "[nn][norm][layernorm][grad]") {
  nn::LayerNorm ln(std::vector<int64_t>{2, 3});
  ln.to(DType::Float64);
  nn::LayerNorm ln1(5, {.bias = false});
  ln1.to(DType::Float64);
  for (uint64_t seed : {1, 2, 3}) {
    randomize(ln, seed, 1.0, 0.5);
    randomize(ln1, seed + 7, 1.0, 0.5);
    check_forward_gradients(ln, {3, 2, 3}, seed);
    check_forward_gradients(ln1, {4, 5}, seed);
  }
}

// ---------------------------------------------------------------- BatchNorm

TEST_CASE("BatchNorm: PyTorch's names, initial values and buffer dtypes", "[nn][norm][batchnorm]") {
  nn::BatchNorm1d bn(3);
  CHECK(names_of(bn.state_dict()) ==
        std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"});
  CHECK(bn.parameters().size() == 2);
  CHECK(host(bn.weight) == std::vector<double>(3, 1.0));
  CHECK(host(bn.bias) == std::vector<double>(3, 0.0));
  CHECK(host(bn.running_mean) == std::vector<double>(3, 0.0));
  CHECK(host(bn.running_var) == std::vector<double>(3, 1.0));
  CHECK(bn.num_batches_tracked.dtype() == DType::Int64);
  CHECK(bn.num_batches_tracked.dim() == 0);
  bn.to(DType::Float64);
  CHECK(bn.running_mean.dtype() == DType::Float64);
  CHECK(bn.num_batches_tracked.dtype() == DType::Int64);
  CHECK(names_of(nn::BatchNorm2d(4, {.affine = false}).state_dict()) ==
        std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"});
  CHECK(nn::BatchNorm2d(4, {.track_running_stats = false}).state_dict().size() == 2);
  CHECK(nn::BatchNorm2d(4).type_name() == "BatchNorm2d");
}

TEST_CASE("BatchNorm1d: train uses batch statistics, running stats after 2 steps use the unbiased variance",
          "[nn][norm][batchnorm]") {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{5, 3}, std::vector<int64_t>{4, 3, 6}}) {
    const int64_t N = shape[0], C = 3, R = shape.size() == 3 ? shape[2] : 1;
    INFO("input " << Shape(shape));
    nn::BatchNorm1d bn(C);
    randomize(bn, 11, 1.0, 0.5);
    auto x1 = Tensor<float>::randn(Shape(shape), Device::cpu(), 2.0, 3.0).set_requires_grad();
    auto x2 = Tensor<float>::randn(Shape(shape), Device::cpu(), -1.0, 0.5);
    auto y1 = bn(x1);
    auto s1 = channel_stats(host(x1), N, C, R);
    check_close(host(y1), batch_norm_ref(host(x1), N, C, R, s1.mean, s1.var_biased, host(bn.weight), host(bn.bias)),
                1e-5);
    bn(x2);
    auto s2 = channel_stats(host(x2), N, C, R);
    std::vector<double> rm(3), rv(3);
    for (size_t c = 0; c < 3; ++c) {
      rm[c] = 0.9 * (0.9 * 0.0 + 0.1 * s1.mean[c]) + 0.1 * s2.mean[c];
      rv[c] = 0.9 * (0.9 * 1.0 + 0.1 * s1.var_unbiased[c]) + 0.1 * s2.var_unbiased[c];
    }
    check_close(host(bn.running_mean), rm, 1e-5);
    check_close(host(bn.running_var), rv, 1e-5);
    CHECK(bn.num_batches_tracked.item_double() == 2.0);
    // The updates were not recorded: the buffers are plain tensors even though x1 required grad.
    CHECK_FALSE(bn.running_mean.requires_grad());
    CHECK(bn.running_mean.grad_fn() == nullptr);
    CHECK(bn.running_var.grad_fn() == nullptr);
    // Eval: the running statistics, not the batch's.
    bn.eval();
    auto y3 = bn(x2);
    check_close(host(y3), batch_norm_ref(host(x2), N, C, R, rm, rv, host(bn.weight), host(bn.bias)), 1e-5);
    CHECK(bn.num_batches_tracked.item_double() == 2.0);  // eval does not count
    check_close(host(bn.running_mean), rm, 1e-5);
  }
}

TEST_CASE("BatchNorm: momentum = None is a cumulative average, no running stats means batch stats always",
          "[nn][norm][batchnorm]") {
  nn::BatchNorm1d cum(2, {.momentum = std::nullopt});
  auto a = Tensor<float>::randn({6, 2}, Device::cpu(), 1.0, 2.0);
  auto b = Tensor<float>::randn({6, 2}, Device::cpu(), -3.0, 1.0);
  auto c = Tensor<float>::randn({6, 2}, Device::cpu(), 0.5, 0.2);
  cum(a);
  cum(b);
  cum(c);
  auto sa = channel_stats(host(a), 6, 2, 1), sb = channel_stats(host(b), 6, 2, 1), sc = channel_stats(host(c), 6, 2, 1);
  std::vector<double> rm, rv;
  for (size_t k = 0; k < 2; ++k) {
    rm.push_back((sa.mean[k] + sb.mean[k] + sc.mean[k]) / 3);
    rv.push_back((sa.var_unbiased[k] + sb.var_unbiased[k] + sc.var_unbiased[k]) / 3);
  }
  check_close(host(cum.running_mean), rm, 1e-5);
  check_close(host(cum.running_var), rv, 1e-5);
  CHECK(cum.num_batches_tracked.item_double() == 3.0);

  nn::BatchNorm1d nostats(2, {.affine = false, .track_running_stats = false});
  CHECK(nostats.state_dict().empty());
  auto yt = nostats(a);
  nostats.eval();
  CHECK(nostats(a).to_vector() == yt.to_vector());
  check_close(host(yt), batch_norm_ref(host(a), 6, 2, 1, sa.mean, sa.var_biased, {}, {}), 1e-5);
}

TEST_CASE("BatchNorm2d: per-channel over N, H, W in train, running stats in eval", "[nn][norm][batchnorm]") {
  nn::BatchNorm2d bn(3, {.eps = 1e-3, .momentum = 0.3});
  randomize(bn, 4, 1.0, 0.5);
  auto x = Tensor<float>::randn({2, 3, 4, 5}, Device::cpu(), 1.0, 2.0);
  auto y = bn(x);
  auto s = channel_stats(host(x), 2, 3, 20);
  check_close(host(y), batch_norm_ref(host(x), 2, 3, 20, s.mean, s.var_biased, host(bn.weight), host(bn.bias), 1e-3),
              1e-5);
  std::vector<double> rm, rv;
  for (size_t c = 0; c < 3; ++c) {
    rm.push_back(0.3 * s.mean[c]);
    rv.push_back(0.7 + 0.3 * s.var_unbiased[c]);
  }
  check_close(host(bn.running_mean), rm, 1e-5);
  check_close(host(bn.running_var), rv, 1e-5);
  bn.eval();
  check_close(host(bn(x)), batch_norm_ref(host(x), 2, 3, 20, rm, rv, host(bn.weight), host(bn.bias), 1e-3), 1e-5);
  // Half in, half out, statistics in fp32.
  bn.train();
  auto yh = bn(x.to<half>());
  CHECK(yh.dtype() == DType::Float16);
}

TEST_CASE("BatchNorm: gradients in double through the batch statistics (train) and in eval (3 seeds)",
          "[nn][norm][batchnorm][grad]") {
  nn::BatchNorm1d bn1(3);
  bn1.to(DType::Float64);
  nn::BatchNorm2d bn2(2);
  bn2.to(DType::Float64);
  for (uint64_t seed : {1, 2, 3}) {
    randomize(bn1, seed, 1.0, 0.5);
    randomize(bn2, seed + 3, 1.0, 0.5);
    bn1.train();
    bn2.train();
    INFO("seed " << seed << " (train)");
    check_forward_gradients(bn1, {4, 3}, seed);
    check_forward_gradients(bn1, {3, 3, 2}, seed);
    check_forward_gradients(bn2, {2, 2, 2, 3}, seed);
    // Eval, with running statistics that are not the initial 0 / 1.
    bn1.eval();
    bn2.eval();
    INFO("seed " << seed << " (eval)");
    check_forward_gradients(bn1, {4, 3}, seed);
    check_forward_gradients(bn2, {2, 2, 2, 3}, seed);
  }
  CHECK(host(bn1.running_mean) != std::vector<double>(3, 0.0));
}

TEST_CASE("BatchNorm: input errors", "[nn][norm][batchnorm][errors]") {
  nn::BatchNorm1d bn(3);
  CHECK_THROWS_WITH(bn(Tensor<float>::zeros({2, 3, 4, 5})), Contains("BatchNorm1d(3)") && Contains("2-D"));
  CHECK_THROWS_WITH(bn(Tensor<float>::zeros({2, 4})), Contains("4 channels, expected 3"));
  CHECK_THROWS_AS(nn::BatchNorm2d(3)(Tensor<float>::zeros({2, 3, 4})), ShapeError);
  CHECK_THROWS_WITH(bn(Tensor<float>::zeros({1, 3})), Contains("more than 1 value per channel"));
  bn.eval();
  CHECK_NOTHROW(bn(Tensor<float>::zeros({1, 3})));
  CHECK_THROWS_AS(nn::BatchNorm1d(0), ValueError);
  CHECK_THROWS_AS(nn::BatchNorm1d(3, {.momentum = 1.5}), ValueError);
}

// ---------------------------------------------------------------- Dropout

TEST_CASE("Dropout: the mask is Philox's uniform < 1 - p, survivors scaled by 1 / (1 - p)", "[nn][dropout]") {
  auto x = Tensor<float>::randn({40, 50}) + 5.0;  // no zeros in x
  Generator g(42);
  nn::Dropout drop(0.3, g);
  auto y = host(drop(x));
  Generator replay(42);
  auto u = Tensor<float>::rand(x.shape(), Device::cpu(), 0.0, 1.0, replay).to_vector();
  auto xv = host(x);
  int64_t kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const bool keep = u[i] < 0.7f;
    kept += keep;
    if (keep)
      CHECK(y[i] == Approx(xv[i] / 0.7).epsilon(1e-6));
    else
      CHECK(y[i] == 0.0);
  }
  CHECK(std::fabs(static_cast<double>(kept) / 2000.0 - 0.7) < 0.04);
  // The generator advanced: the next mask differs; a reset generator repeats it.
  CHECK(host(drop(x)) != y);
  g.set_state(42, 0);
  CHECK(host(drop(x)) == y);
  // The default generator, seeded.
  nn::Dropout d2(0.5);
  manual_seed(9);
  auto a = host(d2(x));
  manual_seed(9);
  CHECK(host(d2(x)) == a);
  CHECK(host(F::dropout(x, 0.3, true, g)) != host(F::dropout(x, 0.3, true, g)));
}

TEST_CASE("Dropout: eval and p = 0 are the identity, p = 1 zeros, invalid p", "[nn][dropout]") {
  auto x = Tensor<float>::randn({8, 8});
  nn::Dropout d(0.5);
  d.eval();
  CHECK(d(x).same(x));
  CHECK(nn::Dropout(0.0)(x).same(x));
  auto z = nn::Dropout(1.0)(x);
  CHECK(host(z) == std::vector<double>(64, 0.0));
  CHECK(F::dropout(x, 0.9, false).same(x));
  CHECK_THROWS_WITH(nn::Dropout(1.5), Contains("between 0 and 1") && Contains("1.5"));
  CHECK_THROWS_AS(nn::Dropout(-0.1), ValueError);
  CHECK_THROWS_AS(F::dropout(x, 2.0), ValueError);
  CHECK(nn::Dropout(0.2).state_dict().empty());
}

TEST_CASE("Dropout: the gradient is the mask times 1 / (1 - p), finite differences (3 seeds)", "[nn][dropout][grad]") {
  Generator g(7);
  auto x = (Tensor<double>::randn({6, 7}) + 3.0).detach().set_requires_grad();
  auto y = F::dropout(x, 0.25, true, g);
  sum(y).backward();
  auto gx = host(x.grad()), yv = host(y);
  for (size_t i = 0; i < gx.size(); ++i) CHECK(gx[i] == (yv[i] != 0.0 ? 1.0 / 0.75 : 0.0));
  for (uint64_t seed : {1, 2, 3}) {
    Generator gen(seed);
    nn::Dropout drop(0.4, gen);
    // Every evaluation replays the same mask.
    CHECK_GRADIENTS(
        [&](const std::vector<AnyTensor>& in) {
          gen.set_state(seed, 0);
          return drop.forward_any(in[0]);
        },
        testing::random_inputs({{5, 6}}, seed));
  }
}

// ---------------------------------------------------------------- MultiheadAttention

TEST_CASE("MultiheadAttention: PyTorch's parameter names, shapes and initialisation", "[nn][attention]") {
  nn::MultiheadAttention m(8, 2);
  CHECK(names_of(m.state_dict()) ==
        std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK(m.in_proj_weight.shape() == Shape{24, 8});
  CHECK(m.in_proj_bias.shape() == Shape{24});
  CHECK(m.out_proj->weight.shape() == Shape{8, 8});
  CHECK(host(m.in_proj_bias) == std::vector<double>(24, 0.0));
  CHECK(host(m.out_proj->bias) == std::vector<double>(8, 0.0));
  const double bound = std::sqrt(6.0 / (8 + 24));  // xavier_uniform on [3E, E]
  double mx = 0;
  for (double v : host(m.in_proj_weight)) mx = std::max(mx, std::fabs(v));
  CHECK(mx <= bound);
  CHECK(mx > 0.7 * bound);
  CHECK(m.head_dim() == 4);
  CHECK(names_of(nn::MultiheadAttention(4, 2, {.bias = false}).state_dict()) ==
        std::vector<std::string>{"in_proj_weight", "out_proj.weight"});
  CHECK_THROWS_WITH(nn::MultiheadAttention(6, 4), Contains("divisible"));
}

TEST_CASE("MultiheadAttention: forward against explicit loops (self, causal, masks, cross, layouts)",
          "[nn][attention]") {
  const int64_t N = 2, L = 3, E = 4, H = 2;
  nn::MultiheadAttention m(E, H);
  m.to(DType::Float64);
  randomize(m, 3, 0.0, 0.6);  // biases too
  auto x = Tensor<double>::randn({N, L, E});
  auto xv = host(x);

  SECTION("self-attention, no mask") {
    auto r = mha_ref(m, xv, xv, xv, N, L, L);
    check_close(host(m(x)), r.out, 1e-12);
    auto [out, w] = m.forward_with_weights(x, x, x);
    check_close(host(out), r.out, 1e-12);
    check_close(host(w), r.weights, 1e-12);
    CHECK(w.shape() == Shape{N, L, L});
  }
  SECTION("causal") {
    auto r = mha_ref(m, xv, xv, xv, N, L, L, causal());
    check_close(host(m.forward(x, {.is_causal = true})), r.out, 1e-12);
    auto [out, w] = m.forward_with_weights(x, x, x, {.is_causal = true});
    auto wv = host(w);
    check_close(wv, r.weights, 1e-12);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < L; ++i) {
        double s = 0;
        for (int64_t j = 0; j < L; ++j) {
          double p = wv[static_cast<size_t>((n * L + i) * L + j)];
          s += p;
          if (j > i) CHECK(p == 0.0);
        }
        CHECK(s == Approx(1.0));
      }
    // The causal mask equals an explicit -inf float mask and a boolean mask.
    auto cm = F::causal_mask<double>(L, L);
    CHECK(host(cm) == std::vector<double>{0, -kInf, -kInf, 0, 0, -kInf, 0, 0, 0});
    check_close(host(m.forward(x, {.attn_mask = cm})), r.out, 1e-12);
    auto bm = Tensor<uint8_t>::from_vector({0, 1, 1, 0, 0, 1, 0, 0, 0}, {L, L});
    check_close(host(m.forward(x, {.attn_mask = bm})), r.out, 1e-12);
  }
  SECTION("float attn_mask [L, S] and [N * H, L, S], key_padding_mask") {
    auto am = Tensor<double>::randn({L, L});
    auto amv = host(am);
    auto r = mha_ref(m, xv, xv, xv, N, L, L,
                     [&](int64_t, int64_t, int64_t i, int64_t j) { return amv[static_cast<size_t>(i * L + j)]; });
    check_close(host(m.forward(x, {.attn_mask = am})), r.out, 1e-12);
    auto am3 = Tensor<double>::randn({N * H, L, L});
    auto am3v = host(am3);
    auto r3 = mha_ref(m, xv, xv, xv, N, L, L, [&](int64_t n, int64_t h, int64_t i, int64_t j) {
      return am3v[static_cast<size_t>(((n * H + h) * L + i) * L + j)];
    });
    check_close(host(m.forward(x, {.attn_mask = am3})), r3.out, 1e-12);
    auto kp = Tensor<uint8_t>::from_vector({0, 0, 1, 0, 1, 0}, {N, L});
    auto rk = mha_ref(m, xv, xv, xv, N, L, L, [&](int64_t n, int64_t, int64_t, int64_t j) {
      return (n == 0 && j == 2) || (n == 1 && j == 1) ? -kInf : 0.0;
    });
    check_close(host(m.forward(x, {.key_padding_mask = kp})), rk.out, 1e-12);
  }
  SECTION("cross-attention: separate query, key, value of another length") {
    const int64_t S = 5;
    auto k = Tensor<double>::randn({N, S, E});
    auto v = Tensor<double>::randn({N, S, E});
    auto r = mha_ref(m, xv, host(k), host(v), N, L, S);
    auto out = m.forward(x, k, v);
    CHECK(out.shape() == Shape{N, L, E});
    check_close(host(out), r.out, 1e-12);
    // A different tensor with the same values as x takes the unfused path and agrees.
    auto xc = x.clone();
    check_close(host(m.forward(x, xc, xc)), host(m(x)), 1e-12);
  }
  SECTION("batch_first = false and unbatched inputs") {
    nn::MultiheadAttention seq_first(E, H, {.batch_first = false});
    seq_first.to(DType::Float64);
    seq_first.load_state_dict(m.state_dict());
    auto xt = transpose(x, 0, 1);  // [L, N, E]
    auto yt = seq_first.forward(xt, {.is_causal = true});
    CHECK(yt.shape() == Shape{L, N, E});
    check_close(host(transpose(yt, 0, 1)), host(m.forward(x, {.is_causal = true})), 1e-12);
    auto x0 = x.select(0);  // [L, E]
    auto y0 = m.forward(x0, {.is_causal = true});
    CHECK(y0.shape() == Shape{L, E});
    check_close(host(y0), host(m.forward(x, {.is_causal = true}).select(0)), 1e-12);
  }
}

TEST_CASE("MultiheadAttention: with the causal mask, position i depends only on positions <= i", "[nn][attention]") {
  const int64_t N = 2, L = 4, E = 8;
  nn::MultiheadAttention m(E, 2);
  randomize(m, 8, 0.0, 0.5);
  auto x = Tensor<float>::randn({N, L, E});
  auto xv = x.to_vector();
  auto xp = xv;
  for (int64_t e = 0; e < E; ++e) xp[static_cast<size_t>((0 * L + 2) * E + e)] += 1.0f;  // batch 0, position 2
  auto x2 = Tensor<float>::from_vector(xp, {N, L, E});
  auto a = m.forward(x, {.is_causal = true}).to_vector(), b = m.forward(x2, {.is_causal = true}).to_vector();
  auto row_changed = [&](const std::vector<float>& p, const std::vector<float>& q, int64_t n, int64_t i) {
    bool changed = false;
    for (int64_t e = 0; e < E; ++e) changed |= p[static_cast<size_t>((n * L + i) * E + e)] != q[static_cast<size_t>((n * L + i) * E + e)];
    return changed;
  };
  CHECK_FALSE(row_changed(a, b, 0, 0));
  CHECK_FALSE(row_changed(a, b, 0, 1));
  CHECK(row_changed(a, b, 0, 2));
  CHECK(row_changed(a, b, 0, 3));
  for (int64_t i = 0; i < L; ++i) CHECK_FALSE(row_changed(a, b, 1, i));  // the other batch entry
  // Without the mask, position 0 sees position 2.
  CHECK(row_changed(m(x).to_vector(), m(x2).to_vector(), 0, 0));
}

TEST_CASE("MultiheadAttention: gradients in double, parameters included (3 seeds)", "[nn][attention][grad]") {
  nn::MultiheadAttention m(4, 2);
  m.to(DType::Float64);
  for (uint64_t seed : {1, 2, 3}) {
    randomize(m, seed, 0.0, 0.6);
    INFO("seed " << seed);
    CHECK_MODULE_GRADIENTS(
        [&](const std::vector<AnyTensor>& in) {
          return m.forward(Tensor<double>(in[0]), nn::AttentionMask{.is_causal = true});
        },
        testing::random_inputs({{2, 3, 4}}, seed), m);
    // Cross-attention with distinct query, key and value, and a float mask.
    auto am = Tensor<double>::rand({3, 2}, Device::cpu(), -1.0, 1.0);
    CHECK_MODULE_GRADIENTS(
        [&](const std::vector<AnyTensor>& in) {
          return m.forward(Tensor<double>(in[0]), Tensor<double>(in[1]), Tensor<double>(in[2]), {.attn_mask = am});
        },
        testing::random_inputs({{2, 3, 4}, {2, 2, 4}, {2, 2, 4}}, seed), m);
  }
}

TEST_CASE("MultiheadAttention: half activations, fp32 softmax, input errors", "[nn][attention][errors]") {
  nn::MultiheadAttention m(8, 2);
  randomize(m, 1, 0.0, 0.3);
  auto x = Tensor<float>::randn({2, 3, 8});
  auto yh = m.forward(x.to<half>(), {.is_causal = true});
  static_assert(std::is_same_v<decltype(yh), Tensor<half>>);
  auto yf = host(m.forward(x.to<half>().to<float>(), {.is_causal = true}));
  auto got = host(yh);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(yf[i]).margin(2e-2));

  CHECK_THROWS_WITH(m(Tensor<float>::zeros({2, 3, 6})), Contains("MultiheadAttention(8, 2)") && Contains("embed_dim 8"));
  CHECK_THROWS_AS(m(Tensor<float>::zeros({2, 3, 4, 8})), ShapeError);
  CHECK_THROWS_WITH(m.forward(x, {.attn_mask = Tensor<float>::zeros({3, 4})}), Contains("attn_mask"));
  CHECK_THROWS_AS(m.forward(x, {.attn_mask = Tensor<int32_t>::zeros({3, 3})}), DTypeError);
  CHECK_THROWS_WITH(m.forward(x, {.key_padding_mask = Tensor<uint8_t>::zeros({3, 3})}), Contains("key_padding_mask"));
  CHECK_THROWS_WITH(m.forward(x, Tensor<float>::zeros({2, 4, 8}), Tensor<float>::zeros({2, 5, 8})),
                    Contains("same sequence length"));
  CHECK_THROWS_AS(m.forward(x, Tensor<float>::zeros({3, 4, 8}), Tensor<float>::zeros({3, 4, 8})), ShapeError);
}

TEST_CASE("MultiheadAttention: dropout on the attention weights in training only", "[nn][attention][dropout]") {
  nn::MultiheadAttention m(8, 2, {.dropout = 0.5});
  auto x = Tensor<float>::randn({2, 4, 8});
  manual_seed(1);
  auto a = m(x).to_vector();
  auto b = m(x).to_vector();
  CHECK(a != b);
  m.eval();
  auto c = m(x).to_vector();
  CHECK(c == m(x).to_vector());
  nn::MultiheadAttention plain(8, 2);
  plain.load_state_dict(m.state_dict());
  CHECK(plain(x).to_vector() == c);
  CHECK_THROWS_AS(nn::MultiheadAttention(8, 2, {.dropout = 1.5}), ValueError);
}

// ---------------------------------------------------------------- TransformerBlock

TEST_CASE("TransformerBlock: documented parameter names and sizes", "[nn][transformer]") {
  nn::TransformerBlock blk(8, 2);
  CHECK(names_of(blk.state_dict()) ==
        std::vector<std::string>{"ln_1.weight", "ln_1.bias", "attn.in_proj_weight", "attn.in_proj_bias",
                                 "attn.out_proj.weight", "attn.out_proj.bias", "ln_2.weight", "ln_2.bias",
                                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"});
  CHECK(blk.mlp->c_fc->weight.shape() == Shape{32, 8});
  CHECK(blk.mlp->c_proj->weight.shape() == Shape{8, 32});
  CHECK(blk.parameter_count() == 2 * 8 + (24 * 8 + 24 + 64 + 8) + 2 * 8 + (32 * 8 + 32 + 8 * 32 + 8));
  CHECK(nn::TransformerBlock(8, 2, {.hidden_dim = 12}).mlp->c_fc->weight.shape() == Shape{12, 8});
}

TEST_CASE("TransformerBlock: forward against loops (pre-LN, causal attention, GELU-tanh MLP, residuals)",
          "[nn][transformer]") {
  const int64_t N = 2, L = 3, E = 4, H = 2, Hd = 16;
  nn::TransformerBlock blk(E, H);
  blk.to(DType::Float64);
  randomize(blk, 21, 0.2, 0.5);
  auto x = Tensor<double>::randn({N, L, E});
  auto xv = host(x);
  auto h = layer_norm_ref(xv, E, host(blk.ln_1->weight), host(blk.ln_1->bias));
  auto a = mha_ref(*blk.attn, h, h, h, N, L, L, causal()).out;
  std::vector<double> y(xv.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = xv[i] + a[i];
  auto h2 = layer_norm_ref(y, E, host(blk.ln_2->weight), host(blk.ln_2->bias));
  auto f = linear_ref(h2, E, Hd, host(blk.mlp->c_fc->weight), host(blk.mlp->c_fc->bias));
  for (double& v : f) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  auto mo = linear_ref(f, Hd, E, host(blk.mlp->c_proj->weight), host(blk.mlp->c_proj->bias));
  std::vector<double> want(y.size());
  for (size_t i = 0; i < y.size(); ++i) want[i] = y[i] + mo[i];
  check_close(host(blk(x)), want, 1e-10);

  // Causal: perturbing the last position leaves the earlier ones unchanged.
  auto xp = xv;
  for (int64_t e = 0; e < E; ++e) xp[static_cast<size_t>((L - 1) * E + e)] += 0.5;
  auto y1 = host(blk(x)), y2 = host(blk(Tensor<double>::from_vector(xp, {N, L, E})));
  for (int64_t i = 0; i < (L - 1) * E; ++i) CHECK(y1[static_cast<size_t>(i)] == y2[static_cast<size_t>(i)]);
  bool last_changed = false;
  for (int64_t e = 0; e < E; ++e) last_changed |= y1[static_cast<size_t>((L - 1) * E + e)] != y2[static_cast<size_t>((L - 1) * E + e)];
  CHECK(last_changed);
}

TEST_CASE("TransformerBlock: gradients in double, every parameter (3 seeds)", "[nn][transformer][grad]") {
  nn::TransformerBlock blk(4, 2);
  blk.to(DType::Float64);
  for (uint64_t seed : {1, 2, 3}) {
    randomize(blk, seed, 0.1, 0.5);
    INFO("seed " << seed);
    check_forward_gradients(blk, {2, 3, 4}, seed);
  }
}

TEST_CASE("TransformerBlock: dropout in training only, float16 activations", "[nn][transformer]") {
  nn::TransformerBlock blk(8, 2, {.dropout = 0.3});
  auto x = Tensor<float>::randn({2, 5, 8});
  CHECK(blk(x).to_vector() != blk(x).to_vector());
  blk.eval();
  nn::TransformerBlock ref(8, 2);
  ref.load_state_dict(blk.state_dict());
  ref.eval();
  CHECK(blk(x).to_vector() == ref(x).to_vector());
  auto yh = ref(x.to<half>());
  CHECK(yh.dtype() == DType::Float16);
  auto yf = host(ref(x)), got = host(yh);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(yf[i]).margin(5e-2));
}

// ---------------------------------------------------------------- a tree of layers

namespace {
class Block : public nn::ModuleBase<Block> {
 public:
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    act = register_module("act", std::make_shared<nn::ReLU>());
    scale = register_parameter("scale", Tensor<float>::ones({3}));
  }
  std::string type_name() const override { return "Block"; }
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*act)((*fc)(x));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::ReLU> act;
  AnyTensor scale;
};
}  // namespace

TEST_CASE("gaps: named_modules lists the tree depth first, shared modules once", "[gaps][module]") {
  auto shared = std::make_shared<nn::Linear>(3, 3);
  nn::Sequential seq(std::make_shared<Block>(), shared, shared);
  auto mods = seq.named_modules();
  std::vector<std::string> names;
  for (auto& [n, m] : mods) names.push_back(n);
  CHECK(names == std::vector<std::string>{"", "0", "0.fc", "0.act", "1"});
  CHECK(mods[0].second == &seq);
  CHECK(mods[4].second == shared.get());
  CHECK(mods[2].second->type_name() == "Linear");
  // The modules are live: switching one to eval mode shows.
  mods[3].second->eval();
  CHECK_FALSE(seq[0].named_children()[1].second->is_training());
}

TEST_CASE("gaps: printing a module gives its tree with shapes and parameter counts", "[gaps][module]") {
  nn::Sequential seq(std::make_shared<Block>(), std::make_shared<nn::Linear>(3, 2, nn::LinearOptions{.bias = false}));
  std::ostringstream os;
  os << seq;
  const std::string want =
      "Sequential(  # 24 parameters\n"
      "  (0): Block(  # 18 parameters\n"
      "    scale=[3]\n"
      "    (fc): Linear(weight=[3, 4], bias=[3])  # 15 parameters\n"
      "    (act): ReLU()\n"
      "  )\n"
      "  (1): Linear(weight=[2, 3])  # 6 parameters\n"
      ")";
  CHECK(os.str() == want);
  std::ostringstream leaf;
  leaf << nn::ReLU();
  CHECK(leaf.str() == "ReLU()");
}
