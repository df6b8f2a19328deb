#pragma once
// The pooling window rules shared by the CPU and CUDA kernels (as elementwise_math.hpp is for
// elementwise ops), so the two backends cannot drift apart: where a window starts and ends, and
// the divisor of an average.
#include <cstdint>

#include "ember/core/backend.hpp"
#include "ember/core/macros.hpp"

namespace ember::pool_math {

// [start, end) of output index o's window along one axis (rows: height, else width); may reach
// into the padding (callers clip to the input). Adaptive windows follow torch:
// [floor(o*in/out), ceil((o+1)*in/out)).
EMBER_HD inline void window(const Pool2dArgs& p, bool rows, int64_t o, int64_t& start, int64_t& end) {
  const int64_t in = rows ? p.h : p.w, out = rows ? p.out_h : p.out_w;
  if (p.adaptive) {
    start = (o * in) / out;
    end = ((o + 1) * in + out - 1) / out;
    return;
  }
  const int64_t k = rows ? p.kh : p.kw, s = rows ? p.stride_h : p.stride_w, pad = rows ? p.pad_h : p.pad_w;
  start = o * s - pad;
  end = start + k;
}

EMBER_HD inline int64_t min_(int64_t a, int64_t b) { return a < b ? a : b; }
EMBER_HD inline int64_t max_(int64_t a, int64_t b) { return a > b ? a : b; }

// The divisor of one average-pooling window (torch: padding counts unless count_include_pad is
// false; the window is clipped to the padded input either way; adaptive windows count their size).
EMBER_HD inline int64_t avg_divisor(const Pool2dArgs& p, int64_t y0, int64_t y1, int64_t x0, int64_t x1) {
  if (p.adaptive) return (y1 - y0) * (x1 - x0);
  if (p.count_include_pad) return (min_(y1, p.h + p.pad_h) - y0) * (min_(x1, p.w + p.pad_w) - x0);
  return (min_(y1, p.h) - max_(y0, 0)) * (min_(x1, p.w) - max_(x0, 0));
}

}  // namespace ember::pool_math
