#pragma once
// Progress reporting shared by the examples: a self-overwriting line on a terminal (step, loss,
// samples/s), plain periodic lines otherwise, and the final one-line JSON record.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

namespace examples {

class Progress {
 public:
  Progress() : tty_(isatty(STDOUT_FILENO)), start_(std::chrono::steady_clock::now()) {}
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  // After every optimisation step.
  void step(int64_t epoch, int64_t epochs, int64_t step, double loss, int64_t samples) {
    samples_ += samples;
    if (!tty_) return;
    std::printf("\repoch %3lld/%lld  step %6lld  loss %.4f  %.0f samples/s   ", static_cast<long long>(epoch + 1),
                static_cast<long long>(epochs), static_cast<long long>(step), loss, samples_ / std::max(seconds(), 1e-9));
    std::fflush(stdout);
  }
  // After every epoch: a plain line when not on a terminal (logs stay short: every `every` epochs).
  void epoch(int64_t epoch, int64_t epochs, const std::string& metrics, int64_t every = 1) {
    if (tty_) return;
    if ((epoch + 1) % every == 0 || epoch + 1 == epochs)
      std::printf("epoch %lld/%lld  %s  %.1f s\n", static_cast<long long>(epoch + 1), static_cast<long long>(epochs),
                  metrics.c_str(), seconds());
  }
  void finish() {
    if (tty_) std::printf("\n");
  }
  double samples_per_second() const { return samples_ / std::max(seconds(), 1e-9); }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  double samples_ = 0;
};

// {"key": value, ...} on one line; values are numbers unless quoted by the caller.
inline std::string json_line(const std::map<std::string, std::string>& fields) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (auto& [k, v] : fields) {
    os << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  os << "}";
  return os.str();
}
inline std::string quoted(const std::string& s) { return "\"" + s + "\""; }
inline std::string num(double v, int precision = 6) {
  std::ostringstream os;
  os.precision(precision);
  os << v;
  return os.str();
}

}  // namespace examples
