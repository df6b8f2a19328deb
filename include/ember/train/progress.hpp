#pragma once
// train::ProgressBar: what a training run shows while it runs (train::Trainer uses it; usable on
// its own). On a terminal, one line redrawn in place with '\r':
//
//   epoch 2/5 [########............]  412/1170  loss 0.4312  2301 samples/s  ETA 0:41
//
// Elsewhere (a log file, a pipe, CI) the same fields as plain lines, one every `every_steps` steps
// (default: about 20 lines per run) and one at each epoch's end, so a log stays short and greppable.
//
//   train::ProgressBar bar({.mode = train::ProgressMode::Auto});   // Bar on a tty, Lines elsewhere
//   bar.update({.epoch = e, .epochs = 5, .step = s, .total_steps = n, .loss = l, .samples = k, .seconds = t});
//   bar.epoch_end(info, "val/accuracy 0.91");
//   bar.finish();
//
// Time is passed in (ProgressInfo::seconds): the bar reads no clock, so its output is a function
// of its inputs and testable on a std::ostringstream. Silent (writes nothing at all) when
// `enabled` is false: data-parallel ranks other than 0 make their bar with enabled = false.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <string>

#include "ember/core/error.hpp"

namespace ember::train {

enum class ProgressMode {
  Auto,   // Bar when the stream is std::cout or std::cerr and that is a terminal (isatty), else Lines
  Bar,    // a line redrawn in place ('\r'), a newline at each epoch's end
  Lines,  // plain lines every `every_steps` steps and at each epoch's end
  Off,    // nothing
};

struct ProgressOptions {
  ProgressMode mode = ProgressMode::Auto;
  std::ostream* out = nullptr;  // default: std::cout
  int64_t every_steps = 0;      // Lines: a line every this many steps (0: total_steps / 20, at least 1)
  int width = 20;               // Bar: characters of the bar itself
  bool enabled = true;          // false: silent (ranks other than 0)
};

// One update's figures. epoch is 0-based (shown 1-based); step counts optimizer steps done in the
// whole run (1-based after the first), total_steps is the run's budget (0: unknown).
struct ProgressInfo {
  int64_t epoch = 0, epochs = 0;
  int64_t step = 0, total_steps = 0;
  double loss = 0;
  int64_t samples = 0;   // samples processed so far in this run (for samples/s)
  double seconds = 0;    // wall time since the run (or the resumed part) began
  int64_t start_step = 0;  // the step the run resumed from (time left is estimated from the steps since)
};

// "1:02:03" or "2:03": hours only when needed; "?" for an unknown or absurd duration.
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>((s / 60) % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

class ProgressBar {
 public:
  explicit ProgressBar(ProgressOptions options = {}) : opt_(options) {
    EMBER_CHECK(opt_.every_steps >= 0, ValueError, "ProgressBar: every_steps must be >= 0, got ", opt_.every_steps);
    EMBER_CHECK(opt_.width >= 0 && opt_.width <= 200, ValueError, "ProgressBar: width must be in [0, 200], got ",
                opt_.width);
    out_ = opt_.out ? opt_.out : &std::cout;
    mode_ = opt_.mode;
    if (mode_ == ProgressMode::Auto) {
      int fd = -1;
      if (out_ == &std::cout) fd = STDOUT_FILENO;
      if (out_ == &std::cerr || out_ == &std::clog) fd = STDERR_FILENO;
      mode_ = fd >= 0 && ::isatty(fd) ? ProgressMode::Bar : ProgressMode::Lines;
    }
    if (!opt_.enabled) mode_ = ProgressMode::Off;
  }

  // The mode in effect (Auto resolved; Off when disabled).
  ProgressMode mode() const { return mode_; }

  // After an optimizer step.
  void update(const ProgressInfo& info) {
    if (mode_ == ProgressMode::Off) return;
    if (mode_ == ProgressMode::Bar) {
      const std::string line = bar_line(info);
      // Pad over the remains of a longer previous line.
      *out_ << '\r' << line << std::string(last_len_ > line.size() ? last_len_ - line.size() : 0, ' ') << std::flush;
      last_len_ = line.size();
      open_line_ = true;
      return;
    }
    const int64_t every = opt_.every_steps > 0 ? opt_.every_steps : std::max<int64_t>(1, info.total_steps / 20);
    if (info.step % every == 0) *out_ << fields(info) << '\n' << std::flush;
  }

  // At an epoch's end, with extra text (validation metrics, or ""): the bar's line is closed with a
  // newline (the epoch stays on screen); Lines prints one line.
  void epoch_end(const ProgressInfo& info, const std::string& extra = "") {
    if (mode_ == ProgressMode::Off) return;
    const std::string tail = extra.empty() ? "" : "  " + extra;
    if (mode_ == ProgressMode::Bar) {
      const std::string line = bar_line(info) + tail;
      *out_ << '\r' << line << std::string(last_len_ > line.size() ? last_len_ - line.size() : 0, ' ') << '\n'
            << std::flush;
    } else {
      *out_ << fields(info) << tail << '\n' << std::flush;
    }
    last_len_ = 0;
    open_line_ = false;
  }

  // A line of its own (a validation result, the profiler's verdict): on a terminal the bar's line
  // is closed first so the message does not overwrite it.
  void message(const std::string& text) {
    if (mode_ == ProgressMode::Off) return;
    if (open_line_) *out_ << '\n';
    *out_ << text << '\n' << std::flush;
    open_line_ = false;
    last_len_ = 0;
  }

  // Ends an open bar line.
  void finish() {
    if (mode_ == ProgressMode::Off) return;
    if (open_line_) *out_ << '\n' << std::flush;
    open_line_ = false;
    last_len_ = 0;
  }

  // The plain fields: "epoch 2/5  step 412/1170  loss 0.4312  2301 samples/s  ETA 0:41".
  static std::string fields(const ProgressInfo& i) {
    std::string s = "epoch " + std::to_string(i.epoch + 1);
    if (i.epochs > 0) s += "/" + std::to_string(i.epochs);
    s += "  step " + std::to_string(i.step);
    if (i.total_steps > 0) s += "/" + std::to_string(i.total_steps);
    return s + tail(i);
  }

 private:
  static std::string tail(const ProgressInfo& i) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  loss %.4f  %.0f samples/s", i.loss, samples_per_second(i));
    std::string s = buf;
    s += "  ETA " + format_duration(time_left(i));
    return s;
  }
  static double samples_per_second(const ProgressInfo& i) {
    return i.seconds > 0 ? static_cast<double>(i.samples) / i.seconds : 0.0;
  }
  // From the rate of the steps run since start_step; -1 (unknown) before the first or without a total.
  static double time_left(const ProgressInfo& i) {
    const int64_t done = i.step - i.start_step;
    if (i.total_steps <= 0 || done <= 0 || i.seconds <= 0) return i.total_steps > 0 && i.step >= i.total_steps ? 0 : -1;
    return i.seconds / static_cast<double>(done) * static_cast<double>(std::max<int64_t>(0, i.total_steps - i.step));
  }
  std::string bar_line(const ProgressInfo& i) const {
    std::string s = "epoch " + std::to_string(i.epoch + 1);
    if (i.epochs > 0) s += "/" + std::to_string(i.epochs);
    if (opt_.width > 0) {
      const double frac = i.total_steps > 0 ? std::clamp(static_cast<double>(i.step) / static_cast<double>(i.total_steps), 0.0, 1.0) : 0.0;
      const int filled = static_cast<int>(frac * opt_.width);
      s += " [" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(opt_.width - filled), '.') + "]";
    }
    s += " " + std::to_string(i.step);
    if (i.total_steps > 0) s += "/" + std::to_string(i.total_steps);
    return s + tail(i);
  }

  ProgressOptions opt_;
  std::ostream* out_ = nullptr;
  ProgressMode mode_ = ProgressMode::Lines;
  size_t last_len_ = 0;
  bool open_line_ = false;
};

}  // namespace ember::train
