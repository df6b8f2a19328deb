#pragma once
// Small helpers shared by the test files: double tensors from literals, values out, closeness
// checks, seeded random inputs, exact comparisons (bytes, bits), an exception's message, an op's
// output and gradients on a device, and a guard that restores the thread count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include <ember/backend/cpu/parallel.hpp>
#include <ember/core/random.hpp>
#include <ember/core/tensor.hpp>

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

// Largest |a - b| / (1 + |b|).
inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]) / (1.0 + std::abs(b[i])));
  return m;
}

// max_rel_diff after forgiving each element one rounding step of a `mantissa_bits` format at |b|:
// two fp32 results that differ in their last bits can round to neighbouring fp16/bf16 values.
inline double max_rel_diff_beyond_ulp(const std::vector<double>& a, const std::vector<double>& b, int mantissa_bits) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double ulp = b[i] == 0 ? 0 : std::ldexp(1.0, std::ilogb(b[i]) - mantissa_bits);
    m = std::max(m, std::max(0.0, std::abs(a[i] - b[i]) - ulp) / (1.0 + std::abs(b[i])));
  }
  return m;
}

// One random double tensor of shape s, values in [lo, hi), from a seed.
inline AnyTensor rand1(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator gen(seed);
  return Tensor<double>::rand(s, Device::cpu(), lo, hi, gen);
}

// The same dtype, shape and bytes (on whichever device they are).
inline bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  AnyTensor ca = a.to(Device::cpu()), cb = b.to(Device::cpu());
  return a.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), a.nbytes()) == 0;
}

// The bytes of a tensor (brought to the CPU), for exact comparisons that also hold at NaN.
inline std::vector<uint8_t> bits_of(const AnyTensor& t) {
  AnyTensor c = t.to(Device::cpu());
  std::vector<uint8_t> v(c.nbytes());
  if (!v.empty()) std::memcpy(v.data(), c.data_ptr(), v.size());
  return v;
}

// A tensor's elements as T, copied straight from its storage.
template <class T>
std::vector<T> to_vec(const AnyTensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) t.backend().copy_to_host(v.data(), t.data_ptr(), t.nbytes());
  return v;
}

// The message of the exception a call throws, or "(no exception)": for the tests that check
// what an error says (CHECK_THAT(message_of([&] { ... }), Contains(...))).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// The elements of a list as "{1,2,3}" (or with other brackets), for a test's INFO lines.
template <class T>
std::string list_str(const std::vector<T>& v, const char* open = "{", const char* close = "}") {
  std::ostringstream s;
  s << open;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  s << close;
  return s.str();
}

// What a shell command printed (with its own redirections, e.g. "2>&1") and its status as
// pclose gives it (WIFEXITED / WEXITSTATUS read it).
struct CommandOutput {
  std::string out;
  int status = -1;
};

inline CommandOutput run_command(const std::string& cmd) {
  CommandOutput r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  r.status = ::pclose(p);
  return r;
}

// For CPU-versus-device parity of a layer-like op y = f(x, w, b): f on copies of the CPU tensors
// x, w and b (b may be undefined) on device d, then backward with the upstream gradient gy. Returns
// y and the gradients of x, w (and b where defined), on the CPU as doubles.
template <class F>
std::vector<std::vector<double>> output_and_grads_on(Device d, const AnyTensor& x, const AnyTensor& w,
                                                     const AnyTensor& b, const AnyTensor& gy, F&& f) {
  AnyTensor xd = x.to(d).detach(), wd = w.to(d).detach(), bd = b.defined() ? b.to(d).detach() : AnyTensor();
  xd.set_requires_grad(true);
  wd.set_requires_grad(true);
  if (bd.defined()) bd.set_requires_grad(true);
  AnyTensor y = f(xd, wd, bd);
  y.backward(gy.to(d));
  std::vector<std::vector<double>> out{y.to(Device::cpu()).to_double_vector(),
                                       xd.grad().to(Device::cpu()).to_double_vector(),
                                       wd.grad().to(Device::cpu()).to_double_vector()};
  if (bd.defined()) out.push_back(bd.grad().to(Device::cpu()).to_double_vector());
  return out;
}

// Restores the thread count a test changed.
struct ThreadsGuard {
  int saved = get_num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};

}  // namespace ember::testing
