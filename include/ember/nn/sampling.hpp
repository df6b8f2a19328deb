#pragma once
// Choosing the next token from a language model's logits, as Hugging Face's generate() does with
// do_sample: temperature, then top-k, then top-p (nucleus), then one draw per sequence; greedy
// (argmax, the first of equal maxima) when the temperature is 0.
//
//   nn::SamplingOptions o{.temperature = 0.8, .top_k = 40, .top_p = 0.95};
//   Tensor<int64_t> next = nn::sample_next_token(logits, o, gen);   // logits [N, V] -> [N]
//   std::vector<double> p = nn::sampling_probabilities(row, V, o);  // the distribution drawn from
//
// The filtering runs on the host, in double, over one row of V logits per sequence: one copy of
// [N, V] to the host per generated token (V floats per sequence, small beside the forward).
//   temperature  logits / temperature (0: greedy; top_k and top_p then change nothing)
//   top_k        keep the tokens whose logit is >= the k-th largest (ties at the k-th are kept,
//                as HF's TopKLogitsWarper); 0 keeps all, k > V is V
//   top_p        over the probabilities left, sorted ascending, drop the tokens whose cumulative
//                probability is <= 1 - top_p, keeping at least the most likely one (HF's
//                TopPLogitsWarper); 1 keeps all
// A draw takes one uniform number u in [0, 1) per sequence from `gen` (Tensor<double>::rand on
// the CPU: ember's Philox stream, so a seed repeats the same tokens) and picks the first token,
// in vocabulary order, whose cumulative kept probability exceeds u. Greedy draws nothing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ember/ops/ops.hpp"

namespace ember::nn {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // 1: no top-p filter
};

// temperature finite and >= 0, top_k >= 0, top_p in (0, 1]: else a ValueError naming `op`.
inline void check_sampling_options(const char* op, const SamplingOptions& o) {
  EMBER_CHECK(std::isfinite(o.temperature) && o.temperature >= 0.0, ValueError, op,
              ": temperature must be finite and >= 0 (0: greedy), got ", o.temperature);
  EMBER_CHECK(o.top_k >= 0, ValueError, op, ": top_k must be >= 0 (0: no top-k filter), got ", o.top_k);
  EMBER_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, ValueError, op, ": top_p must be in (0, 1] (1: no top-p filter), got ",
              o.top_p);
}

namespace detail {
// The index of the first largest logit; a NaN anywhere is a ValueError (it has no order).
inline int64_t argmax_row(const char* op, const float* x, int64_t V, int64_t row) {
  int64_t best = 0;
  for (int64_t j = 0; j < V; ++j) {
    EMBER_CHECK(!std::isnan(x[j]), ValueError, op, ": the logits of sequence ", row, " contain NaN (token ", j, ")");
    if (x[j] > x[best]) best = j;
  }
  return best;
}
}  // namespace detail

// The distribution the sampler draws one token from, for one row of V logits: temperature, top-k
// and top-p applied, renormalised; zero for the tokens filtered out. With temperature 0, all the
// mass on the argmax. NaN logits, or logits all -inf, are a ValueError.
inline std::vector<double> sampling_probabilities(const float* logits, int64_t V, const SamplingOptions& o,
                                                  const char* op = "sampling_probabilities", int64_t row = 0) {
  check_sampling_options(op, o);
  EMBER_CHECK(V >= 1, ShapeError, op, ": needs at least one logit per sequence, got ", V);
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  if (o.temperature == 0.0) {
    p[static_cast<size_t>(detail::argmax_row(op, logits, V, row))] = 1.0;
    return p;
  }
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) {
    EMBER_CHECK(!std::isnan(logits[j]), ValueError, op, ": the logits of sequence ", row, " contain NaN (token ", j,
                ")");
    z[static_cast<size_t>(j)] = static_cast<double>(logits[j]) / o.temperature;
  }
  const double kNegInf = -std::numeric_limits<double>::infinity();
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (double& v : z)
      if (v < kth) v = kNegInf;
  }
  const double zmax = *std::max_element(z.begin(), z.end());
  EMBER_CHECK(zmax > kNegInf, ValueError, op, ": every logit of sequence ", row, " is -inf: nothing to sample");
  double total = 0.0;
  for (size_t j = 0; j < z.size(); ++j) total += p[j] = z[j] == kNegInf ? 0.0 : std::exp(z[j] - zmax);
  for (double& v : p) v /= total;
  if (o.top_p < 1.0) {
    // Ascending by probability (ties by index, so the order is the same everywhere); the tokens
    // whose cumulative probability stays <= 1 - top_p go, the most likely one always stays.
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p[static_cast<size_t>(a)] < p[static_cast<size_t>(b)]; });
    double cum = 0.0, kept = 0.0;
    for (size_t r = 0; r < order.size(); ++r) {
      double& v = p[static_cast<size_t>(order[r])];
      cum += v;
      if (cum <= 1.0 - o.top_p && r + 1 < order.size()) v = 0.0;
      kept += v;
    }
    for (double& v : p) v /= kept;
  }
  return p;
}

// One token per row of `logits` [N, V] (any floating type, any device): Tensor<int64_t> [N] on the
// logits' device. Draws N uniform numbers from `gen` unless greedy.
inline Tensor<int64_t> sample_next_token(const AnyTensor& logits, const SamplingOptions& o,
                                         Generator& gen = default_generator(), const char* op = "sample_next_token") {
  check_sampling_options(op, o);
  op::detail::check_defined(op, logits, "logits");
  EMBER_CHECK(is_floating(logits.dtype()), DTypeError, op, ": logits must be floating point, got ", logits.desc());
  EMBER_CHECK(logits.dim() == 2 && logits.shape()[1] >= 1, ShapeError, op, ": logits must be [N, V] with V >= 1, got ",
              logits.desc());
  const int64_t N = logits.shape()[0], V = logits.shape()[1];
  const std::vector<float> host = Tensor<float>(logits.to(DType::Float32).to(Device::cpu())).to_vector();
  std::vector<int64_t> next(static_cast<size_t>(N));
  if (o.temperature == 0.0) {
    for (int64_t n = 0; n < N; ++n) next[static_cast<size_t>(n)] = detail::argmax_row(op, host.data() + n * V, V, n);
  } else {
    const std::vector<double> u = Tensor<double>::rand({N}, Device::cpu(), 0.0, 1.0, gen).to_vector();
    for (int64_t n = 0; n < N; ++n) {
      const std::vector<double> p = sampling_probabilities(host.data() + n * V, V, o, op, n);
      int64_t pick = -1, last_kept = 0;
      double cum = 0.0;
      for (int64_t j = 0; j < V && pick < 0; ++j) {
        if (p[static_cast<size_t>(j)] == 0.0) continue;
        last_kept = j;
        cum += p[static_cast<size_t>(j)];
        if (u[static_cast<size_t>(n)] < cum) pick = j;
      }
      next[static_cast<size_t>(n)] = pick >= 0 ? pick : last_kept;  // u beyond a sum rounded below 1
    }
  }
  return Tensor<int64_t>::from_vector(next, {N}, logits.device());
}

}  // namespace ember::nn
