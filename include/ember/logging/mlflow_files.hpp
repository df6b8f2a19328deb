#pragma once
// The pieces of MLflow's file store (an mlruns/ folder) that logging::MlflowRun (mlflow.hpp)
// writes and reads back: the names MLflow accepts, meta.yaml's scalars, file:// URIs.
//
// The format is the one mlflow.store.tracking.file_store.FileStore reads:
//   <root>/<experiment_id>/meta.yaml           name, experiment_id, artifact_location, ...
//   <root>/<experiment_id>/<run_id>/meta.yaml  run_id, run_uuid, status (an int: RUNNING 1,
//                                              FINISHED 3, FAILED 4, KILLED 5), start_time, ...
//   .../<run_id>/metrics/<key>                 lines "<timestamp_ms> <value> <step>"; a key
//                                              "train/loss" is the file metrics/train/loss
//   .../<run_id>/params/<key>, tags/<key>      the value, no line break
//   .../<run_id>/artifacts/                    files as logged
// Only what ember writes is parsed: flat "key: scalar" YAML lines, scalars plain, 'single' or
// "double" quoted, folded over indented continuation lines as PyYAML writes long ones.
#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>

#include "ember/core/error.hpp"
#include "ember/logging/json_text.hpp"

namespace ember::logging::mlflow_files {

// MLflow's limits (mlflow/utils/validation.py).
inline constexpr size_t kMaxKeyLength = 250;
inline constexpr size_t kMaxParamValueLength = 6000;
inline constexpr size_t kMaxTagValueLength = 8000;
inline constexpr size_t kMaxExperimentNameLength = 500;

// A metric, param or tag key as MLflow accepts it: ASCII letters, digits, '_', '-', '.', ' ',
// ':' and '/', at most 250 characters, and a path that names itself ("a/b", not "/a", "a/",
// "a//b", "a/./b" or "../a"): the key is a file's path under metrics/, params/ or tags/.
inline void check_key(std::string_view what, const std::string& key) {
  EMBER_CHECK(!key.empty(), ValueError, "MLflow: a ", what, " key must not be empty");
  EMBER_CHECK(key.size() <= kMaxKeyLength, ValueError, "MLflow: the ", what, " key '", key.substr(0, 40),
              "...' has ", key.size(), " characters; MLflow allows at most ", kMaxKeyLength);
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.' || c == ' ' || c == ':' || c == '/';
    EMBER_CHECK(ok, ValueError, "MLflow: the ", what, " key '", key,
                "' has a character MLflow refuses: keys may only contain letters, digits, '_', '-', "
                "'.', ' ', ':' and '/'");
  }
  bool ok = key.front() != '/' && key.back() != '/';
  size_t start = 0;
  while (ok && start <= key.size()) {
    const size_t end = std::min(key.find('/', start), key.size());
    const std::string_view part(key.data() + start, end - start);
    ok = !part.empty() && part != "." && part != "..";
    start = end + 1;
  }
  EMBER_CHECK(ok, ValueError, "MLflow: the ", what, " key '", key,
              "' is not a plain path (a leading or trailing '/', '//', '.' or '..'): MLflow stores "
              "it as a file and refuses a name that resolves to another");
}

// A YAML double-quoted scalar: JSON's string escapes are YAML's.
inline std::string yaml_string(std::string_view s) { return json_string(s); }

// The scalar starting at text[i] (after "key: "), with its continuation lines; i ends past it.
// The value of a hex digit, or -1.
inline int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline std::string parse_yaml_scalar(const std::string& text, size_t& i) {
  // The raw value: the rest of the line, plus the following lines indented under the key.
  std::string raw;
  size_t eol = text.find('\n', i);
  if (eol == std::string::npos) eol = text.size();
  raw = text.substr(i, eol - i);
  i = eol < text.size() ? eol + 1 : eol;
  while (i < text.size() && (text[i] == ' ' || text[i] == '\n')) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    raw += '\n';
    raw += text.substr(i, e - i);
    i = e < text.size() ? e + 1 : e;
  }
  // Folding: a line break between lines is a space; an empty line is a line break.
  auto fold = [](const std::string& r) {
    std::string out;
    std::istringstream lines(r);
    std::string line;
    bool first = true, pending_break = false;
    while (std::getline(lines, line)) {
      const size_t a = line.find_first_not_of(' ');
      const std::string t = a == std::string::npos ? "" : line.substr(a);
      if (first) {
        out = line;
        first = false;
      } else if (t.empty()) {
        out += '\n';
        pending_break = true;
      } else {
        if (!pending_break) out += ' ';
        out += t;
        pending_break = false;
      }
    }
    while (!out.empty() && (out.back() == ' ' || out.back() == '\r')) out.pop_back();
    return out;
  };
  const std::string v = fold(raw);
  if (v.empty() || v == "null" || v == "~") return "";
  if (v.front() == '\'') {
    std::string out;
    for (size_t k = 1; k < v.size(); ++k) {
      if (v[k] == '\'') {
        if (k + 1 < v.size() && v[k + 1] == '\'') {
          out += '\'';
          ++k;
        } else {
          break;
        }
      } else {
        out += v[k];
      }
    }
    return out;
  }
  if (v.front() == '"') {
    std::string out;
    for (size_t k = 1; k < v.size() && v[k] != '"'; ++k) {
      if (v[k] != '\\' || k + 1 >= v.size()) {
        out += v[k];
        continue;
      }
      const char e = v[++k];
      auto hex = [&](int digits) {  // exactly `digits` hex digits, else a FormatError
        unsigned cp = 0;
        for (int d = 0; d < digits; ++d) {
          const size_t at = k + 1 + static_cast<size_t>(d);
          const int h = at < v.size() ? hex_value(v[at]) : -1;
          EMBER_CHECK(h >= 0 && cp <= 0x10FFFFu, FormatError, "MLflow meta.yaml: the escape \\", e, " in ", v.substr(0, 40),
                      " needs ", digits, " hex digits of a code point up to 10FFFF");
          cp = cp << 4 | static_cast<unsigned>(h);
        }
        EMBER_CHECK(cp <= 0x10FFFFu, FormatError, "MLflow meta.yaml: the escape \\", e, " in ", v.substr(0, 40),
                    " is past the last code point (10FFFF)");
        k += static_cast<size_t>(digits);
        if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
      };
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        case '\n': break;  // an escaped line break joins the lines
        default: out += e; break;  // \" \\ \/
      }
    }
    return out;
  }
  return v;
}

// The top-level "key: scalar" entries of a meta.yaml (lists and nested maps are skipped).
inline std::map<std::string, std::string> parse_meta_yaml(const std::string& text) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == '\n' || text[i] == '-' || text[i] == '#') {
      const size_t e = text.find('\n', i);
      i = e == std::string::npos ? text.size() : e + 1;
      continue;
    }
    const size_t colon = text.find(':', i), eol = text.find('\n', i);
    if (colon == std::string::npos || (eol != std::string::npos && colon > eol)) {
      i = eol == std::string::npos ? text.size() : eol + 1;
      continue;
    }
    const std::string key = text.substr(i, colon - i);
    i = colon + 1;
    while (i < text.size() && text[i] == ' ') ++i;
    out[key] = parse_yaml_scalar(text, i);
  }
  return out;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  EMBER_CHECK(f.good(), IOError, "MLflow: cannot read '", p.string(), "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// file:///abs/path, percent-encoded as Python's pathlib.Path.as_uri does.
inline std::string file_uri(const std::filesystem::path& p) {
  const std::string s = std::filesystem::absolute(p).lexically_normal().string();
  std::string out = "file://";
  for (unsigned char c : s) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '/' || c == '-' || c == '_' || c == '.' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  if (out.size() > 7 && out.back() == '/') out.pop_back();
  return out;
}

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The user name MLflow records (Python's getpass.getuser(): $LOGNAME, $USER, ..., the passwd entry).
inline std::string user_name() {
  for (const char* var : {"LOGNAME", "USER", "LNAME", "USERNAME"})
    if (const char* v = std::getenv(var); v && *v) return v;
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_name) return pw->pw_name;
  return "unknown";
}

// A metric value as Python's float() reads it back exactly: shortest round trip, nan, inf, -inf.
inline void append_metric_value(std::string& out, double v) {
  if (std::isnan(v)) out += "nan";
  else if (std::isinf(v)) out += v > 0 ? "inf" : "-inf";
  else append_json_number(out, v);
}

}  // namespace ember::logging::mlflow_files
