#pragma once
// CSV datasets: numeric columns, one of them the label (chosen by name or by index), an optional
// header row, optional rows to skip first. Files ending in gzip magic are decompressed (link zlib:
// ZLIB::ZLIB, -lz). Fields may be surrounded by spaces or double quotes; blank lines are skipped;
// "\r\n" line ends are accepted.
//
// parse_csv works on a byte buffer (the fuzz target calls it); a malformed file is a
// FormatError naming the source, the record (1-based, after skipped rows and the header) and its
// line, and the rule (field count, a field that is not a number, a label that is not an integer).
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/gzip.hpp"

namespace ember::data {

struct CsvOptions {
  std::string label_column;        // the label's column name (needs a header or `names`) ...
  int label_index = -1;            // ... or, when label_column is empty, its index (negative: from the end)
  bool header = true;              // the first row after skip_rows holds the column names
  int skip_rows = 0;               // rows to skip before it (scikit-learn's wine_data.csv has a counts row)
  std::vector<std::string> names;  // column names when header is false (optional)
  char delimiter = ',';
  bool integer_labels = true;      // label as int64 (each must be an integer) or float32
};

struct CsvTable {
  std::vector<std::string> names;  // empty when neither a header nor names were given
  int64_t rows = 0, cols = 0;
  std::vector<double> values;      // rows x cols, row-major
};

namespace detail {
inline std::string_view csv_trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}
inline std::vector<std::string_view> csv_split(std::string_view line, char delim) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t p = line.find(delim, start);
    out.push_back(csv_trim(line.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start)));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}
}  // namespace detail

inline CsvTable parse_csv(const uint8_t* data, size_t size, const std::string& source, const CsvOptions& o = {}) {
  EMBER_CHECK(o.skip_rows >= 0, ValueError, "csv: '", source, "': skip_rows must be >= 0, got ", o.skip_rows);
  std::string_view text(reinterpret_cast<const char*>(data), size);
  CsvTable t;
  if (!o.header) t.names = o.names;
  size_t pos = 0;
  int64_t line_no = 0;
  bool header_pending = o.header;
  int skipped = 0;
  char number[128];
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (skipped < o.skip_rows) {
      ++skipped;
      continue;
    }
    if (detail::csv_trim(line).empty()) continue;
    std::vector<std::string_view> fields = detail::csv_split(line, o.delimiter);
    if (header_pending) {
      for (auto f : fields) t.names.emplace_back(f);
      header_pending = false;
      continue;
    }
    if (t.cols == 0) {
      t.cols = static_cast<int64_t>(fields.size());
      EMBER_CHECK(t.names.empty() || static_cast<int64_t>(t.names.size()) == t.cols, FormatError, "csv: '", source,
                  "': record 1 (line ", line_no, ") has ", t.cols, " fields but there are ", t.names.size(),
                  " column names");
    }
    const int64_t record = t.rows + 1;
    EMBER_CHECK(static_cast<int64_t>(fields.size()) == t.cols, FormatError, "csv: '", source, "': record ", record,
                " (line ", line_no, ") has ", fields.size(), " fields, expected ", t.cols);
    for (size_t c = 0; c < fields.size(); ++c) {
      std::string_view f = fields[c];
      // strtod on a NUL-terminated copy (std::from_chars for double is missing from some standard
      // libraries, libc++ 19 among them); the whole field must be the number.
      double v = 0;
      bool ok = !f.empty() && f.size() < sizeof number;
      if (ok) {
        std::memcpy(number, f.data(), f.size());
        number[f.size()] = 0;
        char* end = nullptr;
        errno = 0;
        v = std::strtod(number, &end);
        ok = end == number + f.size() && !(errno == ERANGE && std::isinf(v)) && !std::isspace(static_cast<unsigned char>(number[0]));
      }
      if (!ok) {
        const std::string col = c < t.names.size() ? " '" + t.names[c] + "'" : std::string();
        throw FormatError(::ember::detail::str_cat("csv: '", source, "': record ", record, " (line ", line_no,
                                                   "): field", col, " (column ", c + 1, ") is '", f,
                                                   "', not a number"));
      }
      t.values.push_back(v);
    }
    ++t.rows;
  }
  EMBER_CHECK(!header_pending, FormatError, "csv: '", source, "': no header row (the file has ", line_no,
              " lines, ", o.skip_rows, " skipped)");
  return t;
}

// Example i: "features" float32 [cols - 1] (every column but the label, in file order) and
// "label" (int64 or float32 scalar).
class CsvDataset : public Dataset {
 public:
  CsvDataset(const std::string& path, const CsvOptions& o = {}) : name_("csv(" + path + ")") {
    std::vector<uint8_t> bytes = read_file_maybe_gzip(path);
    build(parse_csv(bytes.data(), bytes.size(), path, o), path, o);
  }
  // From bytes already in memory (`source` names them in messages).
  CsvDataset(const uint8_t* data, size_t size, const std::string& source, const CsvOptions& o = {})
      : name_("csv(" + source + ")") {
    build(parse_csv(data, size, source, o), source, o);
  }

  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    check_index(i);
    return Example{{"features", features_.select(i)}, {"label", labels_.select(i)}};
  }
  std::string name() const override { return name_; }
  const Tensor<float>& features() const { return features_; }
  const AnyTensor& labels() const { return labels_; }
  // Names of the feature columns (empty without a header or names).
  const std::vector<std::string>& feature_names() const { return feature_names_; }

 private:
  void build(const CsvTable& t, const std::string& source, const CsvOptions& o) {
    EMBER_CHECK(t.rows > 0, FormatError, "csv: '", source, "': no data records");
    EMBER_CHECK(t.cols >= 2, FormatError, "csv: '", source, "': ", t.cols,
                " column(s); needs at least one feature column and the label column");
    int64_t label = -1;
    if (!o.label_column.empty()) {
      for (size_t c = 0; c < t.names.size(); ++c)
        if (t.names[c] == o.label_column) label = static_cast<int64_t>(c);
      if (label < 0) {
        std::string all;
        for (const auto& n : t.names) all += (all.empty() ? "" : ", ") + n;
        throw ValueError(::ember::detail::str_cat("csv: '", source, "': no column named '", o.label_column,
                                                  "' (columns: ", all.empty() ? "no header" : all, ")"));
      }
    } else {
      label = o.label_index < 0 ? t.cols + o.label_index : o.label_index;
      EMBER_CHECK(label >= 0 && label < t.cols, ValueError, "csv: '", source, "': label_index ", o.label_index,
                  " is out of range for ", t.cols, " columns");
    }
    n_ = t.rows;
    const int64_t d = t.cols - 1;
    features_ = Tensor<float>::empty({n_, d});
    float* f = features_.data();
    std::vector<int64_t> ilabels;
    std::vector<float> flabels;
    for (int64_t r = 0; r < n_; ++r) {
      int64_t k = 0;
      for (int64_t c = 0; c < t.cols; ++c) {
        const double v = t.values[static_cast<size_t>(r * t.cols + c)];
        if (c == label) {
          if (o.integer_labels) {
            EMBER_CHECK(std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15, FormatError, "csv: '",
                        source, "': record ", r + 1, ": label ", v, " (column ", c + 1,
                        ") is not an integer (set integer_labels = false for float labels)");
            ilabels.push_back(static_cast<int64_t>(v));
          } else {
            flabels.push_back(static_cast<float>(v));
          }
        } else {
          f[r * d + k++] = static_cast<float>(v);
        }
      }
    }
    if (o.integer_labels) labels_ = Tensor<int64_t>::from_vector(ilabels);
    else labels_ = Tensor<float>::from_vector(flabels);
    for (int64_t c = 0; c < static_cast<int64_t>(t.names.size()); ++c)
      if (c != label) feature_names_.push_back(t.names[static_cast<size_t>(c)]);
  }

  std::string name_;
  Tensor<float> features_;
  AnyTensor labels_;
  std::vector<std::string> feature_names_;
  int64_t n_ = 0;
};

}  // namespace ember::data
