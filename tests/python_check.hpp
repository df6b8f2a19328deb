#pragma once
// Runs one of the reference checkers in tests/interop under the configured Python (the test
// venv's, EMBER_PYTHON_EXE; its target defines it and EMBER_SOURCE_DIR) and collects its output.
// A checker that cannot import its package prints "SKIPPED: <why>"; so does this helper when no
// interpreter is configured or it cannot start. Then the result is empty and the test reports
// itself skipped instead of failing.
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.hpp"

namespace ember::testing {

// Single-quotes a shell argument (no quote characters in our paths; refused if there are).
inline std::string shell_quote(const std::string& s) {
  REQUIRE(s.find('\'') == std::string::npos);
  return "'" + s + "'";
}

// The checker's combined stdout and stderr and its exit status, or nothing (SKIPPED printed).
inline std::optional<CommandOutput> run_python_check(const std::string& script_in_interop,
                                                     const std::vector<std::string>& args) {
  const std::string py = EMBER_PYTHON_EXE;
  if (py.empty()) {
    std::printf("SKIPPED: no Python interpreter configured (EMBER_PYTHON)\n");
    return std::nullopt;
  }
  std::string cmd = shell_quote(py) + " " + shell_quote(std::string(EMBER_SOURCE_DIR) + "/tests/interop/" + script_in_interop);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  CommandOutput run = run_command(cmd + " 2>&1");
  if ((WIFEXITED(run.status) && WEXITSTATUS(run.status) == 127) || run.out.find("SKIPPED: ") != std::string::npos) {
    std::printf("SKIPPED: %s\n", run.out.c_str());
    return std::nullopt;
  }
  return run;
}

// The JSON objects the checker printed one per line, by the value of their field `key`.
inline std::map<std::string, nlohmann::json> json_lines_by(const std::string& out, const std::string& key) {
  std::map<std::string, nlohmann::json> by_key;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') {
      nlohmann::json j = nlohmann::json::parse(line);
      by_key[j.at(key).get<std::string>()] = j;
    }
  return by_key;
}

}  // namespace ember::testing
