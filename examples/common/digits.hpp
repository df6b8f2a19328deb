#pragma once
// The scikit-learn handwritten digits (1797 8x8 images, 10 classes), as shipped by Debian's
// python3-sklearn package: real data, no download. Found at run time; a clear error names the
// package when it is missing.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

struct Digits {
  std::vector<float> pixels;  // n x 64, scaled to [0, 1]
  std::vector<int64_t> labels;
  int64_t n = 0;
};

// EMBER_DIGITS_CSV, when set, is the only place looked at (a machine whose Python lives in a
// virtual environment has no Debian python3-sklearn: tools/gpu-check.sh sets it to a carried
// copy); a path set but missing is an error that names it, not a silent fall-back.
inline std::string find_digits_file() {
  if (const char* env = std::getenv("EMBER_DIGITS_CSV"); env && *env) {
    if (std::filesystem::is_regular_file(env)) return env;
    throw std::runtime_error(std::string("digits data not found: EMBER_DIGITS_CSV is set to '") + env +
                             "', which is not a file (it must be scikit-learn's digits.csv.gz)");
  }
  const char* candidates[] = {
      "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz",
      "/usr/local/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz",
  };
  for (const char* c : candidates)
    if (std::filesystem::exists(c)) return c;
  // Any Python's site-packages (pip installs).
  for (const char* root : {"/usr/lib", "/usr/local/lib"}) {
    std::error_code ec;
    if (!std::filesystem::exists(root)) continue;
    for (auto& e : std::filesystem::directory_iterator(root, ec)) {
      if (e.path().filename().string().rfind("python3", 0) != 0) continue;
      for (const char* sub : {"dist-packages", "site-packages"}) {
        auto p = e.path() / sub / "sklearn/datasets/data/digits.csv.gz";
        if (std::filesystem::exists(p)) return p.string();
      }
    }
  }
  throw std::runtime_error(
      "digits data not found: install Debian's python3-sklearn package (apt-get install python3-sklearn), "
      "which ships sklearn/datasets/data/digits.csv.gz, or set EMBER_DIGITS_CSV to that file");
}

inline Digits load_digits() {
  std::string path = find_digits_file();
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string text;
  char buf[1 << 16];
  int got;
  while ((got = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(got));
  gzclose(f);
  Digits d;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::vector<float> row;
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) row.push_back(std::stof(cell));
    if (row.size() != 65) throw std::runtime_error("digits: a row of " + std::to_string(row.size()) + " values in " + path);
    for (int i = 0; i < 64; ++i) d.pixels.push_back(row[static_cast<size_t>(i)] / 16.0f);
    d.labels.push_back(static_cast<int64_t>(row[64]));
    d.n++;
  }
  return d;
}

// A fixed-seed shuffled split: the first (1 - test_fraction) for training, the rest for testing.
inline void split_digits(const Digits& all, double test_fraction, uint64_t seed, Digits& train, Digits& test) {
  std::vector<int64_t> order(static_cast<size_t>(all.n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t n_test = static_cast<int64_t>(static_cast<double>(all.n) * test_fraction);
  for (int64_t k = 0; k < all.n; ++k) {
    Digits& dst = k < all.n - n_test ? train : test;
    int64_t i = order[static_cast<size_t>(k)];
    dst.pixels.insert(dst.pixels.end(), all.pixels.begin() + i * 64, all.pixels.begin() + (i + 1) * 64);
    dst.labels.push_back(all.labels[static_cast<size_t>(i)]);
    dst.n++;
  }
}

}  // namespace examples
