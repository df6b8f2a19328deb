// Scaled dot-product attention (nn::functional::scaled_dot_product_attention; its fused kernel,
// op::fused_attention) and MultiheadAttention's fused path: the fused kernel against the composite
// (masks, causal, L != S, blocks), rows with every key masked, float16's composite, results
// independent of the thread count, and CPU-versus-CUDA parity (a real GPU, else skipped; the
// pretend device checks the device plumbing in CI). The gradient checks and bad inputs come from
// the registry (tests/op_cases.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <ember/ember.hpp>

#include "gpu_skip.hpp"
#include "pretend_gpu.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::testing;

namespace {

// Largest |a - b| / (1 + |b|); NaN must be at the same places in both (else +inf).
double attn_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]) / (1.0 + std::abs(b[i])));
  }
  return m;
}

// The output and the gradients of q, k, v (through sum(out * w)) of one attention call.
template <class T>
std::vector<std::vector<double>> attention_run(const Tensor<T>& q0, const Tensor<T>& k0, const Tensor<T>& v0,
                                               const Tensor<T>& w, nn::functional::AttentionOptions o, bool fused,
                                               Device dev = Device::cpu()) {
  auto q = Tensor<T>(q0.to(dev)).detach().set_requires_grad();
  auto k = Tensor<T>(k0.to(dev)).detach().set_requires_grad();
  auto v = Tensor<T>(v0.to(dev)).detach().set_requires_grad();
  if (o.attn_mask.defined()) o.attn_mask = o.attn_mask.to(dev);
  o.allow_fused = fused;
  auto out = nn::functional::scaled_dot_product_attention(q, k, v, o);
  sum(out * Tensor<T>(w.to(dev))).backward();
  auto host = [](const AnyTensor& t) { return t.to(Device::cpu()).to_double_vector(); };
  return {host(out), host(q.grad()), host(k.grad()), host(v.grad())};
}

struct AttnCase {
  int64_t L, S, D, Dv;
  bool causal;
  int mask;  // 0 none, 1 bool [L, S], 2 float [N, 1, L, S], 3 bool key padding [N, 1, 1, S], 4 float [N, H, L, S]
};

AnyTensor attention_mask_for(const AttnCase& c, int64_t N, int64_t H, DType t, Generator& gen) {
  switch (c.mask) {
    case 1: {
      std::vector<uint8_t> m(static_cast<size_t>(c.L * c.S));
      for (size_t i = 0; i < m.size(); ++i) m[i] = (i % 7 == 3) ? 1 : 0;
      return Tensor<uint8_t>::from_vector(m, {c.L, c.S});
    }
    case 2: return Tensor<double>::randn({N, 1, c.L, c.S}, Device::cpu(), 0.0, 1.0, gen).to(t);
    case 3: {
      std::vector<uint8_t> m(static_cast<size_t>(N * c.S));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < c.S; ++j) m[static_cast<size_t>(n * c.S + j)] = j >= c.S - n ? 1 : 0;  // pad the tail
      return Tensor<uint8_t>::from_vector(m, {N, 1, 1, c.S});
    }
    case 4: return Tensor<double>::randn({N, H, c.L, c.S}, Device::cpu(), 0.0, 1.0, gen).to(t);
    default: return {};
  }
}

const AttnCase kAttnCases[] = {
    {5, 5, 8, 8, false, 0},     {5, 5, 8, 8, true, 0},      {70, 130, 16, 12, false, 1},
    {130, 70, 16, 12, true, 2}, {1, 1, 4, 4, false, 0},     {64, 200, 8, 8, true, 3},
    {33, 33, 32, 32, true, 4},  {129, 129, 8, 16, true, 1}, {200, 64, 8, 8, false, 3},
};

}  // namespace

TEST_CASE("scaled_dot_product_attention: the fused kernel equals the composite (masks, causal, L != S, blocks)",
          "[attention]") {
  const int64_t N = 2, H = 3;
  for (const AttnCase& c : kAttnCases) {
    for (DType t : {DType::Float64, DType::Float32}) {
      Generator gen(static_cast<uint64_t>(c.L * 1000 + c.S * 10 + c.mask));
      auto q = Tensor<double>::randn({N, H, c.L, c.D}, Device::cpu(), 0.0, 1.0, gen);
      auto k = Tensor<double>::randn({N, H, c.S, c.D}, Device::cpu(), 0.0, 1.0, gen);
      auto v = Tensor<double>::randn({N, H, c.S, c.Dv}, Device::cpu(), 0.0, 1.0, gen);
      auto w = Tensor<double>::randn({N, H, c.L, c.Dv}, Device::cpu(), 0.0, 1.0, gen);
      nn::functional::AttentionOptions o{.attn_mask = attention_mask_for(c, N, H, t, gen), .is_causal = c.causal};
      INFO(dtype_name(t) << " L " << c.L << " S " << c.S << " D " << c.D << " Dv " << c.Dv << " causal " << c.causal
                         << " mask " << c.mask);
      std::vector<std::vector<double>> f, r;
      if (t == DType::Float64) {
        f = attention_run<double>(q, k, v, w, o, true);
        r = attention_run<double>(q, k, v, w, o, false);
      } else {
        auto cf = [](const Tensor<double>& x) { return Tensor<float>(x.to(DType::Float32)); };
        f = attention_run<float>(cf(q), cf(k), cf(v), cf(w), o, true);
        r = attention_run<float>(cf(q), cf(k), cf(v), cf(w), o, false);
      }
      const double tol = t == DType::Float64 ? 1e-12 : 2e-5;
      for (size_t i = 0; i < f.size(); ++i) {
        INFO("output " << i << " (0: out, 1-3: grad q, k, v)");
        REQUIRE(attn_diff(f[i], r[i]) < tol);
      }
    }
  }
}

TEST_CASE("scaled_dot_product_attention: a row whose keys are all masked is NaN on both paths", "[attention]") {
  Generator gen(5);
  auto q = Tensor<double>::randn({1, 3, 4}, Device::cpu(), 0.0, 1.0, gen);
  auto k = Tensor<double>::randn({1, 2, 4}, Device::cpu(), 0.0, 1.0, gen);
  auto v = Tensor<double>::randn({1, 2, 4}, Device::cpu(), 0.0, 1.0, gen);
  auto m = Tensor<uint8_t>::from_vector({0, 0, 1, 1, 0, 1}, {3, 2});  // row 1 sees no key
  nn::functional::AttentionOptions o{.attn_mask = m};
  auto f = nn::functional::scaled_dot_product_attention(q, k, v, o).to_double_vector();
  o.allow_fused = false;
  auto r = nn::functional::scaled_dot_product_attention(q, k, v, o).to_double_vector();
  for (int d = 0; d < 4; ++d) {
    REQUIRE(std::isnan(f[static_cast<size_t>(4 + d)]));
    REQUIRE(std::isnan(r[static_cast<size_t>(4 + d)]));
  }
  REQUIRE(attn_diff(f, r) < 1e-12);
  // row 2 sees key 0 only: its output is v[0]
  for (int d = 0; d < 4; ++d)
    REQUIRE(f[static_cast<size_t>(8 + d)] == Approx(v.to_double_vector()[static_cast<size_t>(d)]));
}

TEST_CASE(
    "scaled_dot_product_attention: float16 takes the composite (fp32 scores), float32's result within fp16 rounding",
    "[attention]") {
  using nn::functional::scaled_dot_product_attention;
  Generator gen(2);
  auto qh = Tensor<float>::randn({2, 4, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto kh = Tensor<float>::randn({2, 5, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto vh = Tensor<float>::randn({2, 5, 6}, Device::cpu(), 0.0, 1.0, gen);
  auto r16 = scaled_dot_product_attention(Tensor<ember::half>(qh.to(DType::Float16)),
                                          Tensor<ember::half>(kh.to(DType::Float16)),
                                          Tensor<ember::half>(vh.to(DType::Float16)), {.is_causal = true});
  auto r32 = scaled_dot_product_attention(qh, kh, vh, {.is_causal = true});
  REQUIRE(attn_diff(r16.to_double_vector(), r32.to_double_vector()) < 1e-2);
}

TEST_CASE("scaled_dot_product_attention fused: results do not depend on the thread count", "[attention][threads]") {
  ThreadsGuard guard;
  Generator gen(8);
  // Six heads (threaded over heads), and one long head, which runs outside a parallel region: its
  // block GEMMs must stay on one thread (oneDNN's sgemm would split K over threads).
  for (Shape shape : {Shape{2, 3, 150, 16}, Shape{1, 1, 400, 64}}) {
    INFO("shape " << shape.str());
    auto q = Tensor<float>::randn(shape, Device::cpu(), 0.0, 1.0, gen);
    auto k = Tensor<float>::randn(shape, Device::cpu(), 0.0, 1.0, gen);
    auto v = Tensor<float>::randn(shape, Device::cpu(), 0.0, 1.0, gen);
    auto w = Tensor<float>::randn(shape, Device::cpu(), 0.0, 1.0, gen);
    std::vector<std::vector<double>> first;
    for (int threads : {1, 2, 3, 4}) {
      set_num_threads(threads);
      auto r = attention_run<float>(q, k, v, w, {.is_causal = true}, true);
      if (first.empty()) first = r;
      for (size_t i = 0; i < r.size(); ++i) REQUIRE(r[i] == first[i]);  // bitwise
    }
  }
}

TEST_CASE("MultiheadAttention: the fused path (forward) equals the composite (forward_with_weights)", "[attention]") {
  Generator gen(17);
  nn::MultiheadAttention mha(32, 4, {.dtype = DType::Float64});
  auto x = Tensor<double>::randn({3, 20, 32}, Device::cpu(), 0.0, 1.0, gen);
  std::vector<uint8_t> pad(3 * 20, 0);
  for (int j = 15; j < 20; ++j) pad[static_cast<size_t>(2 * 20 + j)] = 1;
  auto kpm = Tensor<uint8_t>::from_vector(pad, {3, 20});
  auto am = Tensor<double>::randn({20, 20}, Device::cpu(), 0.0, 0.5, gen);
  for (const nn::AttentionMask& m : {nn::AttentionMask{}, nn::AttentionMask{.is_causal = true},
                                     nn::AttentionMask{.attn_mask = am, .key_padding_mask = kpm, .is_causal = true}}) {
    auto fused = mha.forward(x, m).to_double_vector();
    auto comp = mha.forward_with_weights(x, x, x, m).first.to_double_vector();
    REQUIRE(attn_diff(fused, comp) < 1e-12);
  }
}

TEST_CASE("scaled_dot_product_attention on a device (pretend cuda:0 in CI) equals the CPU", "[attention]") {
  testing::PretendGpu pretend;
  if (!testing::cuda_device_or_skip()) return;
  Generator gen(23);
  auto q = Tensor<float>::randn({2, 2, 9, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto k = Tensor<float>::randn({2, 2, 11, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto v = Tensor<float>::randn({2, 2, 11, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto w = Tensor<float>::randn({2, 2, 9, 8}, Device::cpu(), 0.0, 1.0, gen);
  auto m = Tensor<float>::randn({2, 1, 9, 11}, Device::cpu(), 0.0, 1.0, gen);
  nn::functional::AttentionOptions o{.attn_mask = m, .is_causal = true};
  auto c = attention_run<float>(q, k, v, w, o, true);
  auto g = attention_run<float>(q, k, v, w, o, true, Device::cuda(0));
  for (size_t i = 0; i < c.size(); ++i) REQUIRE(attn_diff(g[i], c[i]) < 2e-5);
}

TEST_CASE("parity: fused attention, CPU versus CUDA", "[attention][cuda][parity]") {
  EMBER_REQUIRE_GPU();
  const int64_t N = 2, H = 4;
  const AttnCase cases[] = {{128, 128, 64, 64, true, 0}, {77, 300, 128, 128, false, 3}, {300, 77, 32, 48, true, 2},
                            {16, 16, 256, 256, true, 4}, {1, 5, 8, 8, false, 1},        {200, 200, 16, 16, false, 0}};
  for (const AttnCase& c : cases) {
    for (DType t : {DType::Float32, DType::Float64}) {
      Generator gen(static_cast<uint64_t>(c.L + c.S + c.D));
      auto q = Tensor<double>::randn({N, H, c.L, c.D}, Device::cpu(), 0.0, 1.0, gen);
      auto k = Tensor<double>::randn({N, H, c.S, c.D}, Device::cpu(), 0.0, 1.0, gen);
      auto v = Tensor<double>::randn({N, H, c.S, c.Dv}, Device::cpu(), 0.0, 1.0, gen);
      auto w = Tensor<double>::randn({N, H, c.L, c.Dv}, Device::cpu(), 0.0, 1.0, gen);
      nn::functional::AttentionOptions o{.attn_mask = attention_mask_for(c, N, H, t, gen), .is_causal = c.causal};
      INFO(dtype_name(t) << " L " << c.L << " S " << c.S << " D " << c.D << " causal " << c.causal << " mask "
                         << c.mask);
      std::vector<std::vector<double>> cpu_r, gpu_r;
      if (t == DType::Float64) {
        cpu_r = attention_run<double>(q, k, v, w, o, true);
        gpu_r = attention_run<double>(q, k, v, w, o, true, Device::cuda(0));
      } else {
        auto cf = [](const Tensor<double>& x) { return Tensor<float>(x.to(DType::Float32)); };
        cpu_r = attention_run<float>(cf(q), cf(k), cf(v), cf(w), o, true);
        gpu_r = attention_run<float>(cf(q), cf(k), cf(v), cf(w), o, true, Device::cuda(0));
      }
      const double tol = t == DType::Float64 ? 1e-11 : 5e-5;
      for (size_t i = 0; i < cpu_r.size(); ++i) REQUIRE(attn_diff(gpu_r[i], cpu_r[i]) < tol);
    }
  }
}
