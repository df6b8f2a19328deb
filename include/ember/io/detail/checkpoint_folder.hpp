#pragma once
// The on-disk layout of a checkpoint folder, shared by train::CheckpointManager and
// dist::ShardedCheckpointManager (docs/checkpoints.md): the step-<n> names and the scan for them,
// the verification of one checkpoint folder (state.json parses, each file has its recorded size
// and zlib CRC32, each safetensors header validates), the commit of a temporary folder as
// step-<n>, the retention of the newest ones, and the removal of temporary folders whose writer
// is gone.
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/core/error.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/version.hpp"

namespace ember::io::detail {

// zlib's CRC32 continued over n more bytes (in chunks zlib's uInt can count): the writer's while it
// writes a file, crc32_of_file's when verification reads it back.
inline uint32_t crc32_update(uint32_t crc, const void* p, size_t n) {
  const Bytef* b = static_cast<const Bytef*>(p);
  uLong c = crc;
  while (n > 0) {
    const uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    c = ::crc32(c, b, chunk);
    b += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

inline uint32_t crc32_of_file(const std::filesystem::path& p, uint64_t& size) {
  std::ifstream f(p, std::ios::binary);
  EMBER_CHECK(f.good(), IOError, "cannot open '", p.string(), "'");
  std::vector<char> buf(size_t{8} << 20);
  uint32_t crc = 0;
  size = 0;
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = f.gcount();
    if (got <= 0) break;
    crc = crc32_update(crc, buf.data(), static_cast<size_t>(got));
    size += static_cast<uint64_t>(got);
  }
  EMBER_CHECK(!f.bad(), IOError, "read error on '", p.string(), "'");
  return crc;
}

// step-<n> -> n; anything else -> nullopt.
inline std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

inline std::string version_string() {
  return ::ember::detail::str_cat(EMBER_VERSION_MAJOR, ".", EMBER_VERSION_MINOR, ".", EMBER_VERSION_PATCH);
}

// The steps of the folders named step-<n> in dir, newest first (not verified).
inline std::vector<int64_t> checkpoint_steps(const std::filesystem::path& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (auto s = step_of(e.path().filename().string())) out.push_back(*s);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Verifies a checkpoint folder; returns its state.json. Throws FormatError/IOError with the reason.
inline nlohmann::json verify_checkpoint_folder(const std::filesystem::path& p) {
  const std::string who = "checkpoint '" + p.string() + "'";
  std::ifstream f(p / "state.json");
  EMBER_CHECK(f.good(), IOError, who, ": no readable state.json");
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(who + ": state.json is not JSON: " + e.what());
  }
  EMBER_CHECK(st.is_object() && st.value("format", "") == "ember.checkpoint", FormatError, who,
              ": state.json is not an ember checkpoint state");
  for (const char* k : {"step", "epoch"})
    EMBER_CHECK(st.contains(k) && st[k].is_number_integer(), FormatError, who, ": state.json lacks '", k, "'");
  for (const char* k : {"files", "generators", "data", "user"})
    EMBER_CHECK(st.contains(k) && st[k].is_object(), FormatError, who, ": state.json lacks the object '", k, "'");
  for (auto it = st["files"].begin(); it != st["files"].end(); ++it) {
    const std::string name = it.key();
    EMBER_CHECK(name.find('/') == std::string::npos && name != ".." && it->contains("bytes") && it->contains("crc32"),
                FormatError, who, ": bad files entry '", name, "'");
    uint64_t size = 0;
    const std::filesystem::path fp = p / name;
    EMBER_CHECK(std::filesystem::exists(fp), IOError, who, ": ", name, " is missing");
    const uint32_t crc = crc32_of_file(fp, size);
    EMBER_CHECK(size == (*it)["bytes"].get<uint64_t>(), FormatError, who, ": ", name, " has ", size,
                " bytes, state.json says ", (*it)["bytes"].get<uint64_t>());
    EMBER_CHECK(crc == (*it)["crc32"].get<uint32_t>(), FormatError, who, ": ", name, " fails its CRC32 check (",
                crc, " != ", (*it)["crc32"].get<uint32_t>(), ")");
    SafetensorsFile check(fp);  // the header validates too
  }
  return st;
}

// Commits the written temporary folder `tmp` as dir/final_name: a checkpoint of that step that
// already exists (a resumed run saving the same step again) is moved aside first (rename cannot
// replace a non-empty folder), then tmp is renamed and dir fsynced. `who` names the caller in
// errors; `counter` makes the aside name unique within this process.
inline void commit_checkpoint_folder(const std::filesystem::path& tmp, const std::filesystem::path& dir,
                                     const std::string& final_name, const std::string& who, uint64_t& counter) {
  std::error_code ec;
  const std::filesystem::path final_path = dir / final_name;
  std::filesystem::path old;
  if (std::filesystem::exists(final_path, ec)) {
    old = dir / ::ember::detail::str_cat(".old-", final_name, "-", ::getpid(), "-", counter++);
    if (::rename(final_path.c_str(), old.c_str()) != 0)
      throw_io(who + ": cannot move the previous checkpoint aside:", final_path.string(), errno);
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) throw_io(who + ": cannot commit checkpoint", final_path.string(), errno);
  fsync_directory(dir);
  if (!old.empty()) std::filesystem::remove_all(old, ec);
}

// Keeps the newest keep_last checkpoints of dir (0: all), those whose step is a multiple of
// keep_every (0: none) and just_written; removes the others, each renamed out of the step-<n>
// namespace first so that a kill during the removal leaves nothing a scan could take for a
// checkpoint. Failures are warnings.
inline void apply_checkpoint_retention(const std::filesystem::path& dir, int keep_last, int64_t keep_every,
                                       int64_t just_written, const std::function<void(const std::string&)>& warn,
                                       uint64_t& counter) {
  if (keep_last == 0) return;
  int kept = 0;
  for (int64_t s : checkpoint_steps(dir)) {
    const bool newest = kept < keep_last;
    if (newest) ++kept;
    if (newest || s == just_written || (keep_every > 0 && s % keep_every == 0)) continue;
    const std::filesystem::path path = dir / ("step-" + std::to_string(s));
    const std::filesystem::path doomed = dir / ::ember::detail::str_cat(".old-step-", s, "-", ::getpid(), "-", counter++);
    std::error_code ec;
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      warn("cannot remove old checkpoint '" + path.string() + "': " + std::strerror(errno));
      continue;
    }
    std::filesystem::remove_all(doomed, ec);
    if (ec) warn("cannot remove '" + doomed.string() + "': " + ec.message());
  }
}

// Removes the folders .tmp-step-* / .old-step-* of dir whose writing process (the pid in their
// name, ...-<pid>-<k>) is no longer running on this machine.
inline void remove_stale_checkpoint_temporaries(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-step-", 0) != 0 && n.rfind(".old-step-", 0) != 0) continue;
    const size_t b = n.rfind('-');
    const size_t a = b == std::string::npos || b == 0 ? std::string::npos : n.rfind('-', b - 1);
    if (a == std::string::npos) continue;
    const long pid = std::strtol(n.c_str() + a + 1, nullptr, 10);
    if (pid > 0 && pid != ::getpid() && ::kill(static_cast<pid_t>(pid), 0) == 0) continue;  // still writing
    if (pid == ::getpid()) continue;
    std::error_code rm;
    std::filesystem::remove_all(e.path(), rm);
  }
}

}  // namespace ember::io::detail
