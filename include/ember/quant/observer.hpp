#pragma once
// Calibration observers: what range of a tensor's values INT8 keeps. A symmetric scheme (zero
// point 0, integers -128..127, scale = amax / 127: TensorRT's explicit quantization) needs one
// number per tensor, amax, and the observers differ in how they choose it from what they saw:
//   Max         the largest |x| seen (no value clipped; one outlier widens every step)
//   Percentile  the given percentile of |x| (e.g. 99.99: the rare largest values clip)
//   Mse         the amax whose quantization of the seen distribution has the least squared error
// Percentile and Mse keep a histogram of |x| (`bins` bins from 0 to the largest |x| seen, widened
// by merging bins when a larger value arrives), so calibration over many batches takes constant
// memory. The histogram is computed on the host (a copy of each observed tensor).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"

namespace ember::quant {

enum class ObserverKind { Max, Percentile, Mse };

struct ObserverOptions {
  ObserverKind kind = ObserverKind::Max;
  double percentile = 99.99;  // Percentile: in (0, 100]
  int bins = 2048;            // Percentile and Mse
};

inline const char* observer_name(ObserverKind k) {
  switch (k) {
    case ObserverKind::Max: return "max";
    case ObserverKind::Percentile: return "percentile";
    case ObserverKind::Mse: return "mse";
  }
  return "?";
}

class Observer {
 public:
  explicit Observer(ObserverOptions o = {}) : o_(o) {
    EMBER_CHECK(o.bins >= 16, ValueError, "quant::Observer: bins must be at least 16, got ", o.bins);
    EMBER_CHECK(o.percentile > 0.0 && o.percentile <= 100.0, ValueError,
                "quant::Observer: percentile must be in (0, 100], got ", o.percentile);
  }
  const ObserverOptions& options() const { return o_; }

  void observe(const AnyTensor& x) {
    EMBER_CHECK(x.defined() && is_floating(x.dtype()), DTypeError, "quant::Observer(", observer_name(o_.kind),
                "): a floating-point tensor expected, got ", x.defined() ? x.desc() : std::string("undefined"));
    const std::vector<double> v = x.detach().to_double_vector();
    double m = 0;
    for (double a : v) {
      EMBER_CHECK(std::isfinite(a), ValueError, "quant::Observer(", observer_name(o_.kind), "): a non-finite value in ",
                  x.desc(), " (calibrate on finite activations)");
      m = std::max(m, std::abs(a));
    }
    seen_ += static_cast<int64_t>(v.size());
    if (o_.kind == ObserverKind::Max) {
      max_ = std::max(max_, m);
      return;
    }
    if (m > range_) widen(m);
    max_ = std::max(max_, m);
    if (range_ <= 0) return;  // all zeros so far
    const double per = static_cast<double>(o_.bins) / range_;
    for (double a : v) hist_[static_cast<size_t>(std::min<double>(o_.bins - 1, std::abs(a) * per))] += 1;
  }

  int64_t values_seen() const { return seen_; }
  double max_abs() const { return max_; }

  // The range kept: see the header. 0 when nothing but zeros was seen.
  double amax() const {
    EMBER_CHECK(seen_ > 0, ValueError, "quant::Observer(", observer_name(o_.kind),
                "): nothing observed yet; run calibration batches first");
    if (o_.kind == ObserverKind::Max || max_ == 0) return max_;
    return o_.kind == ObserverKind::Percentile ? percentile_amax() : mse_amax();
  }
  // The int8 step for amax (1 for an all-zero tensor, where any step is exact).
  double scale() const {
    const double a = amax();
    return a > 0 ? a / 127.0 : 1.0;
  }

 private:
  double bin_width() const { return range_ / o_.bins; }

  // A new largest value: the histogram's range grows by a power of two, old bins merged in pairs.
  void widen(double m) {
    if (range_ <= 0) {
      range_ = m;
      hist_.assign(static_cast<size_t>(o_.bins), 0);
      return;
    }
    while (range_ < m) {
      for (int i = 0; i < o_.bins / 2; ++i)
        hist_[static_cast<size_t>(i)] = hist_[static_cast<size_t>(2 * i)] + hist_[static_cast<size_t>(2 * i + 1)];
      std::fill(hist_.begin() + o_.bins / 2, hist_.end(), 0.0);
      range_ *= 2;
    }
  }

  double percentile_amax() const {
    double total = 0;
    for (double c : hist_) total += c;
    const double want = total * o_.percentile / 100.0;
    double acc = 0;
    for (int i = 0; i < o_.bins; ++i) {
      acc += hist_[static_cast<size_t>(i)];
      if (acc >= want) return std::min(max_, (i + 1) * bin_width());
    }
    return max_;
  }

  // The squared error of quantizing the histogram (bin centres, weighted by counts) with step
  // amax / 127, clamping above amax, for candidate amax at bin edges; the smallest wins.
  double mse_amax() const {
    const double w = bin_width();
    double best = max_, best_err = -1;
    const int last = std::max(1, static_cast<int>(std::ceil(max_ / w)));
    for (int e = std::max(1, last / 16); e <= last; ++e) {
      const double amax = std::min(max_, e * w), step = amax / 127.0;
      double err = 0;
      for (int i = 0; i < o_.bins; ++i) {
        const double n = hist_[static_cast<size_t>(i)];
        if (n == 0) continue;
        const double c = (i + 0.5) * w;
        const double q = std::min(127.0, std::nearbyint(c / step)) * step;
        err += n * (c - q) * (c - q);
      }
      if (best_err < 0 || err < best_err) {
        best_err = err;
        best = amax;
      }
    }
    return best;
  }

  ObserverOptions o_;
  std::vector<double> hist_;
  double range_ = 0, max_ = 0;
  int64_t seen_ = 0;
};

}  // namespace ember::quant
