// pack_dataset: turns a dataset of many small records (an image folder, IDX files, a CSV file,
// .npy files) into one LMDB database of ember records (data/record.hpp), with a progress bar, then
// reads every record back and compares it with the source.
//
//   pack_dataset --out DB --images ROOT [--keep-encoded 1]     root/<class>/<file>.png|jpg
//   pack_dataset --out DB --idx-images F --idx-labels F        MNIST-style IDX (gzip or plain)
//   pack_dataset --out DB --fashion-mnist train|test           Debian's dataset-fashion-mnist
//   pack_dataset --out DB --csv FILE [--label-column NAME] [--header 1] [--skip-rows 0]
//   pack_dataset --out DB --npy FIELD=FILE[,FIELD=FILE...]
//   common: [--limit N] (first N samples) [--overwrite 0|1]
//
// --keep-encoded 1 stores image files' PNG/JPEG bytes as they are (read back with
// LmdbDataset(path, data::decode_image)); otherwise decoded uint8 [H, W, C]. Prints one JSON line.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include <ember/data/csv.hpp>
#include <ember/data/idx.hpp>
#include <ember/data/images.hpp>
#include <ember/data/lmdb.hpp>
#include <ember/data/npy.hpp>
#include <ember/ember.hpp>

#include "../common/args.hpp"

using namespace ember;

namespace {

// Redrawn at most every 0.2 s, and at the end.
void progress_bar(const char* what, int64_t done, int64_t total, double seconds) {
  static double last = -1;
  if (done != total && seconds - last < 0.2 && last >= 0) return;
  last = done == total ? -1 : seconds;
  const int width = 40;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r%-7s [%.*s%*s] %lld/%lld  %.0f/s", what, filled, "########################################",
               width - filled, "", static_cast<long long>(done), static_cast<long long>(total),
               seconds > 0 ? static_cast<double>(done) / seconds : 0.0);
  if (done == total) std::fprintf(stderr, "\n");
}

bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      {{"out", ""}, {"images", ""}, {"keep-encoded", "0"}, {"idx-images", ""}, {"idx-labels", ""},
                       {"fashion-mnist", ""}, {"csv", ""}, {"label-column", ""}, {"header", "1"}, {"skip-rows", "0"},
                       {"npy", ""}, {"limit", "0"}, {"overwrite", "0"}});
  const std::string out = args.str("out");
  if (out.empty()) throw ValueError("--out DB is required");
  const bool keep_encoded = args.integer("keep-encoded") != 0;

  std::unique_ptr<data::Dataset> source;
  const data::ImageFolderDataset* folder = nullptr;
  if (!args.str("images").empty()) {
    auto f = std::make_unique<data::ImageFolderDataset>(args.str("images"));
    folder = f.get();
    source = std::move(f);
  } else if (!args.str("fashion-mnist").empty()) {
    source = std::make_unique<data::IdxDataset>(data::fashion_mnist(args.str("fashion-mnist")));
  } else if (!args.str("idx-images").empty()) {
    source = std::make_unique<data::IdxDataset>(args.str("idx-images"), args.str("idx-labels"));
  } else if (!args.str("csv").empty()) {
    data::CsvOptions o;
    o.label_column = args.str("label-column");
    o.header = args.integer("header") != 0;
    o.skip_rows = static_cast<int>(args.integer("skip-rows"));
    source = std::make_unique<data::CsvDataset>(args.str("csv"), o);
  } else if (!args.str("npy").empty()) {
    std::vector<std::pair<std::string, std::string>> fields;
    std::stringstream ss(args.str("npy"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      const auto eq = item.find('=');
      if (eq == std::string::npos) throw ValueError("--npy takes FIELD=FILE[,FIELD=FILE...], got '" + item + "'");
      fields.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
    source = std::make_unique<data::NpyDataset>(fields);
  } else {
    throw ValueError("one of --images, --fashion-mnist, --idx-images, --csv, --npy is required");
  }
  int64_t n = source->size();
  if (args.integer("limit") > 0) n = std::min(n, args.integer("limit"));
  if (args.integer("overwrite") && std::filesystem::exists(out)) std::filesystem::remove_all(out);

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  int64_t bytes = 0;
  {
    data::LmdbWriter writer(out);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<data::RecordField> fields;
      if (folder && keep_encoded) {
        std::vector<uint8_t> file = data::read_file_bytes(folder->path(i));
        fields.push_back({"image", Tensor<uint8_t>::from_vector(file), true});
        fields.push_back({"label", Tensor<int64_t>::scalar(folder->label(i))});
      } else {
        const data::Example ex = source->get(i);  // named: fields() refers into it
        for (const auto& [name, t] : ex.fields()) fields.push_back({name, t.clone()});
      }
      std::vector<uint8_t> rec = data::encode_record(fields);
      bytes += static_cast<int64_t>(rec.size());
      writer.append(rec);
      progress_bar("pack", i + 1, n, since(t0));
    }
    writer.finish();
  }
  const double pack_seconds = since(t0);

  // Verification: every record read back equals its source sample.
  const auto t1 = clock::now();
  data::LmdbDataset packed(out, keep_encoded ? data::ImageDecoder(data::decode_image) : data::ImageDecoder());
  if (packed.size() != n)
    throw FormatError("verify: '" + out + "' holds " + std::to_string(packed.size()) + " records, wrote " + std::to_string(n));
  for (int64_t i = 0; i < n; ++i) {
    data::Example want = source->get(i), got = packed.get(i);
    for (const auto& [name, t] : want.fields())
      if (!same_bytes(t, got[name]))
        throw FormatError("verify: '" + out + "' record " + std::to_string(i) + " field '" + name +
                          "' differs from the source");
    progress_bar("verify", i + 1, n, since(t1));
  }
  std::printf("{\"example\": \"pack_dataset\", \"out\": \"%s\", \"records\": %lld, \"record_bytes\": %lld, "
              "\"pack_seconds\": %.3f, \"verify_seconds\": %.3f, \"verified\": true}\n",
              out.c_str(), static_cast<long long>(n), static_cast<long long>(bytes), pack_seconds, since(t1));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pack_dataset: %s\n", e.what());
  return 1;
}
