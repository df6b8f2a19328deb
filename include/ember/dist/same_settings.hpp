#pragma once
// dist::check_same_settings: at start-up, the ranks of a process group compare the settings ember
// knows change numerics, and say so when they disagree. Ranks that mpirun starts on other hosts
// do not inherit the launching shell's environment: with another OPENBLAS_CORETYPE a remote rank
// runs other BLAS kernels and the replicas' losses differ in the last digits, with nothing to say
// why. DataParallel and ZeroRedundancyOptimizer call this at construction.
//
//   dist::check_same_settings(group, "DataParallel");   // one all_gather of 4 KiB per rank
//
// What is compared (local_numeric_settings()): ember's version, the thread count of ember's CPU
// kernels (ember::get_num_threads), OpenBLAS's thread count and the kernel it chose for this CPU
// (when the program links OpenBLAS), whether OpenMP, a CBLAS, oneDNN and CUDA are compiled in,
// which library the CPU's fp32 GEMM uses (backend/cpu/gemm.hpp),
// and the environment variables of numeric_env_vars() (BLAS kernel selection and threads, OpenMP
// threads, MKL's reproducibility settings, oneDNN's ISA and fp-math mode, TF32 on NVIDIA GPUs).
//
// - SettingsCheck::Warn (default): rank 0 writes one warning (SameSettingsOptions::warn, default
//   std::cerr) naming every differing setting with each rank's value, and what to do.
// - SettingsCheck::Error (or EMBER_REQUIRE_SAME_SETTINGS=1 on ANY rank): every rank throws the
//   same DistributedError. The mode travels in the exchanged bytes, so ranks whose environments
//   disagree on the mode itself still all throw (none is left waiting in the next collective).
// - SettingsCheck::Off: no collective at all. Like every option that changes which collectives
//   run, it must be the same on every rank (it is set in code, never from the environment).
// Cost: one all_gather of kSettingsBytes per rank, at construction; nothing per step.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ember/backend/cpu/gemm_choice.hpp"
#include "ember/backend/cpu/parallel.hpp"
#include "ember/core/error.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/version.hpp"

#if defined(EMBER_OPENBLAS_WEAK)
extern "C" int openblas_get_num_threads(void) __attribute__((weak));
#endif

namespace ember::dist {

// One setting as one rank sees it; value empty (std::nullopt) when unset or unknown.
struct NumericSetting {
  std::string name;
  std::optional<std::string> value;
};
using NumericSettings = std::vector<NumericSetting>;

// Environment variables that select BLAS/DNN kernels or thread counts, and so can change results
// in the last digits. Unset and set-to-empty are told apart.
inline const std::vector<std::string>& numeric_env_vars() {
  static const std::vector<std::string> kVars = {
      "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS", "OMP_DYNAMIC",
      "OMP_THREAD_LIMIT", "MKL_NUM_THREADS", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
      "BLIS_NUM_THREADS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
      "DNNL_DEFAULT_FPMATH_MODE", "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG"};
  return kVars;
}

// This process's settings, in a fixed order (settings that are not environment variables have a
// space in their name).
inline NumericSettings local_numeric_settings() {
  NumericSettings s;
  auto yes_no = [](bool b) { return std::string(b ? "yes" : "no"); };
  s.push_back({"ember version", std::string(kVersionString)});
  s.push_back({"ember CPU threads", std::to_string(get_num_threads())});
  std::optional<std::string> blas_threads;
#if defined(EMBER_OPENBLAS_WEAK)
  if (openblas_get_num_threads) blas_threads = std::to_string(openblas_get_num_threads());
#endif
  s.push_back({"OpenBLAS threads", blas_threads});
  const std::string core = blas_core_name();
  s.push_back({"OpenBLAS kernel", core.empty() ? std::nullopt : std::optional<std::string>(core)});
  bool cblas = false, onednn = false, cuda = false;
#if defined(EMBER_HAVE_CBLAS)
  cblas = true;
#endif
#if defined(EMBER_HAVE_ONEDNN)
  onednn = true;
#endif
#if defined(EMBER_HAVE_CUDA)
  cuda = true;
#endif
  s.push_back({"compiled with OpenMP", yes_no(has_openmp())});
  s.push_back({"compiled with CBLAS", yes_no(cblas)});
  s.push_back({"compiled with oneDNN", yes_no(onednn)});
  s.push_back({"compiled with CUDA", yes_no(cuda)});
  s.push_back({"CPU fp32 GEMM", std::string(cpu::sgemm_libraries())});
  for (const std::string& v : numeric_env_vars()) {
    const char* e = std::getenv(v.c_str());
    s.push_back({v, e ? std::optional<std::string>(e) : std::nullopt});
  }
  return s;
}

enum class SettingsCheck : uint8_t { Off = 0, Warn = 1, Error = 2 };

// The default mode: Error when EMBER_REQUIRE_SAME_SETTINGS is "1", Warn when it is unset, empty
// or "0"; any other value is a ValueError naming the variable.
inline SettingsCheck default_settings_check() {
  const char* v = std::getenv("EMBER_REQUIRE_SAME_SETTINGS");
  if (!v || !*v || std::strcmp(v, "0") == 0) return SettingsCheck::Warn;
  EMBER_CHECK(std::strcmp(v, "1") == 0, ValueError, "EMBER_REQUIRE_SAME_SETTINGS='", v,
              "' must be 1 (ranks that disagree on settings that change numerics are an error) or 0 (a warning)");
  return SettingsCheck::Error;
}

struct SameSettingsOptions {
  SettingsCheck mode = default_settings_check();
  // This rank's settings instead of local_numeric_settings(): for tests (thread ranks share one
  // environment) and for programs that add settings of their own.
  std::optional<NumericSettings> settings;
  // Where rank 0's warning goes; default: std::cerr.
  std::function<void(const std::string&)> warn;
};

// Bytes each rank contributes: a format byte, the mode byte, then "name=value\n" lines ("name\n"
// when unset), NUL-padded. Values are cut to kMaxSettingValue characters; lines that do not fit
// are dropped (and show as "(not sent)" on the other ranks).
inline constexpr size_t kSettingsBytes = 4096;
inline constexpr size_t kMaxSettingValue = 200;
inline constexpr uint8_t kSettingsFormat = 1;

namespace settings_detail {

inline std::vector<uint8_t> encode(const NumericSettings& s, SettingsCheck mode) {
  std::vector<uint8_t> out(kSettingsBytes, 0);
  out[0] = kSettingsFormat;
  out[1] = static_cast<uint8_t>(mode);
  size_t pos = 2;
  auto clean = [](const std::string& t, size_t cap) {
    std::string r = t.substr(0, cap);
    for (char& c : r)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';  // no NUL, no line breaks
    return r;
  };
  for (const NumericSetting& e : s) {
    std::string name = clean(e.name, 100);
    for (char& c : name)
      if (c == '=') c = '?';
    std::string line = name;
    if (e.value) line += "=" + clean(*e.value, kMaxSettingValue);
    line += "\n";
    if (pos + line.size() >= kSettingsBytes) continue;  // keep the last byte a NUL
    std::memcpy(out.data() + pos, line.data(), line.size());
    pos += line.size();
  }
  return out;
}

struct Decoded {
  uint8_t format = 0;
  uint8_t mode = 0;
  NumericSettings settings;
};

// Never trusts the bytes: stops at the first NUL or the end, takes the first of repeated names.
inline Decoded decode(const uint8_t* p, size_t n) {
  Decoded d;
  if (n < 2) return d;
  d.format = p[0];
  d.mode = p[1];
  size_t end = 2;
  while (end < n && p[end] != 0) ++end;
  const std::string body(reinterpret_cast<const char*>(p) + 2, end - 2);
  size_t start = 0;
  while (start < body.size()) {
    size_t nl = body.find('\n', start);
    if (nl == std::string::npos) nl = body.size();
    const std::string line = body.substr(start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    NumericSetting e{line.substr(0, eq), std::nullopt};
    if (eq != std::string::npos) e.value = line.substr(eq + 1);
    bool seen = false;
    for (const NumericSetting& o : d.settings) seen = seen || o.name == e.name;
    if (!seen) d.settings.push_back(std::move(e));
  }
  return d;
}

inline bool is_env_name(const std::string& name) { return name.find(' ') == std::string::npos; }

// "0-3,5"
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// The disagreement message, or "" when every rank sent the same settings.
inline std::string compare(const std::vector<Decoded>& all, const std::string& who) {
  const int world = static_cast<int>(all.size());
  // Names in order of first appearance over the ranks.
  std::vector<std::string> names;
  for (const Decoded& d : all)
    for (const NumericSetting& e : d.settings) {
      bool seen = false;
      for (const std::string& n : names) seen = seen || n == e.name;
      if (!seen) names.push_back(e.name);
    }
  auto shown = [](const Decoded& d, const std::string& name) -> std::string {
    for (const NumericSetting& e : d.settings)
      if (e.name == name) return e.value ? *e.value : (is_env_name(name) ? "(unset)" : "(unknown)");
    return "(not sent)";
  };
  std::vector<std::string> parts, env_names;
  bool threads = false, build = false;
  {
    bool formats_differ = false;
    for (const Decoded& d : all) formats_differ = formats_differ || d.format != all[0].format;
    if (formats_differ) {
      std::string p = "settings format";
      for (int r = 0; r < world; ++r)
        p += " rank" + std::to_string(r) + "=" + std::to_string(all[static_cast<size_t>(r)].format);
      parts.push_back(p);
      build = true;
    }
  }
  for (const std::string& name : names) {
    std::vector<std::string> vals;
    for (const Decoded& d : all) vals.push_back(shown(d, name));
    bool same = true;
    for (const std::string& v : vals) same = same && v == vals[0];
    if (same) continue;
    std::string p = name;
    if (world <= 8) {
      for (int r = 0; r < world; ++r) p += " rank" + std::to_string(r) + "=" + vals[static_cast<size_t>(r)];
    } else {  // grouped by value: "ZEN on ranks 0-3,5; (unset) on ranks 4"
      std::vector<std::string> distinct;
      for (const std::string& v : vals) {
        bool seen = false;
        for (const std::string& o : distinct) seen = seen || o == v;
        if (!seen) distinct.push_back(v);
      }
      p += ":";
      for (size_t k = 0; k < distinct.size(); ++k) {
        std::vector<int> rs;
        for (int r = 0; r < world; ++r)
          if (vals[static_cast<size_t>(r)] == distinct[k]) rs.push_back(r);
        p += (k ? ", " : " ") + distinct[k] + " on ranks " + rank_list(rs);
      }
    }
    parts.push_back(p);
    if (is_env_name(name))
      env_names.push_back(name);
    else if (name.find("threads") != std::string::npos)
      threads = true;
    else
      build = true;
  }
  if (parts.empty()) return {};
  std::ostringstream m;
  m << "ember " << who << ": ranks disagree on settings that change numerics: ";
  for (size_t i = 0; i < parts.size(); ++i) m << (i ? "; " : "") << parts[i];
  m << "; results may differ in the last digits.";
  if (!env_names.empty()) {
    m << " Pass them to every rank: mpirun";
    for (const std::string& n : env_names) m << " -x " << n;
    m << " (Slurm: srun --export=ALL).";
  }
  if (threads) m << " Give every rank the same thread count (ember::set_num_threads, the same cores per rank).";
  if (build) m << " Run the same build of ember on every rank.";
  return m.str();
}

}  // namespace settings_detail

// Exchanges this rank's settings with the group's other ranks (one all_gather) and reports a
// disagreement as SameSettingsOptions::mode says: rank 0 warns (Warn), every rank throws
// DistributedError (Error, when any rank asks for it). `who` names the caller in the message
// ("DataParallel"). Returns the message ("" when the ranks agree, or for Off or one rank).
inline std::string check_same_settings(ProcessGroup& group, const std::string& who,
                                       const SameSettingsOptions& options = {}) {
  if (options.mode == SettingsCheck::Off || group.size() <= 1) return {};
  const int world = group.size();
  const std::vector<uint8_t> mine =
      settings_detail::encode(options.settings ? *options.settings : local_numeric_settings(), options.mode);
  const Device dev = group.device();  // NCCL takes only tensors on its GPU
  AnyTensor local = Tensor<uint8_t>::from_vector(mine).to(dev);
  // Not zero-filled: the all_gather writes every byte.
  AnyTensor all = AnyTensor::empty(Shape{static_cast<int64_t>(kSettingsBytes) * world}, DType::UInt8, dev);
  group.all_gather(all, local);
  const std::vector<uint8_t> bytes = Tensor<uint8_t>(all).to_vector();
  std::vector<settings_detail::Decoded> decoded;
  bool error = false;
  for (int r = 0; r < world; ++r) {
    decoded.push_back(settings_detail::decode(bytes.data() + static_cast<size_t>(r) * kSettingsBytes, kSettingsBytes));
    error = error || decoded.back().mode == static_cast<uint8_t>(SettingsCheck::Error);
  }
  std::string msg = settings_detail::compare(decoded, who);
  if (msg.empty()) return msg;
  if (error)
    throw DistributedError(msg + " (An error because SettingsCheck::Error or EMBER_REQUIRE_SAME_SETTINGS=1 is set "
                                 "on some rank.)");
  if (group.rank() == 0) {
    const std::string text = msg + " (EMBER_REQUIRE_SAME_SETTINGS=1 makes this an error.)";
    if (options.warn)
      options.warn(text);
    else
      std::cerr << "warning: " << text << "\n" << std::flush;
  }
  return msg;
}

}  // namespace ember::dist
