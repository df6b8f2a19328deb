#pragma once
// Small helpers shared by the op test files: double tensors from literals, values out, an
// element-by-element closeness check that reports the first mismatches, and seeded random inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include "gradcheck.hpp"

namespace ember::testing {

inline AnyTensor dt(const std::vector<double>& v, const Shape& s) { return Tensor<double>::from_vector(v, s); }
inline std::vector<double> vals(const AnyTensor& t) { return t.to_double_vector(); }

// Element by element |got - want| <= atol + rtol * |want|; equal values (infinities) always pass.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol = 0.0,
                        double atol = 0.0) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  std::ostringstream rep;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    const double err = std::fabs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (bad++ < 5) rep << "element " << i << ": got " << got[i] << " want " << want[i] << "\n";
    }
  }
  INFO(rep.str());
  CHECK(bad == 0);
}

// One random double tensor of shape s, values in [lo, hi), from a seed.
inline AnyTensor rand1(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return random_inputs({s}, seed, lo, hi)[0];
}

}  // namespace ember::testing
