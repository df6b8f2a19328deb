// pack_dataset: turns a dataset of many small records (an image folder, IDX files, a CSV file,
// .npy files) into one LMDB database of ember records (data/record.hpp), an HDF5 file with one
// dataset per field, or a TFRecord file of tf.train.Example records, with a progress bar, then
// reads every record back and compares it with the source.
//
//   pack_dataset --out DB --images ROOT [--keep-encoded 1]     root/<class>/<file>.png|jpg
//   pack_dataset --out DB --idx-images F --idx-labels F        MNIST-style IDX (gzip or plain)
//   pack_dataset --out DB --fashion-mnist train|test           Debian's dataset-fashion-mnist
//   pack_dataset --out DB --csv FILE [--label-column NAME] [--header 1] [--skip-rows 0]
//   pack_dataset --out DB --npy FIELD=FILE[,FIELD=FILE...]
//   common: [--limit N] (first N samples) [--overwrite 0|1] [--format lmdb|hdf5|tfrecord] [--gzip 0-9]
//
// --keep-encoded 1 stores image files' PNG/JPEG bytes as they are (read back with
// LmdbDataset(path, data::decode_image)); otherwise decoded uint8 [H, W, C]. Prints one JSON line.
// --format: lmdb unless given or the output ends in .h5 or .hdf5. HDF5 (data/hdf5.hpp) stores
// field F as the dataset F of shape [samples, field shape...], chunked and gzip-compressed at
// level --gzip (default 4; 0 for none): every sample's field must have the first one's shape and
// dtype (encoded images, whose byte counts differ, are LMDB only). Read back with
// data::Hdf5Dataset(out, {fields...}). TFRecord (also chosen by a .tfrecord output; data/tfrecord.hpp):
// uint8 fields as one bytes value, int32/int64 as int64 lists, float32/16/bf16 as float lists
// (float64 is refused: TFRecord's floats are float32); --gzip N > 0 compresses the file as a whole
// (plain by default).
// TFRecord stores no shapes: read back with TfRecordDataset(out, {.spec = {{field, {dtype, shape}}}}).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>

#include <ember/data/csv.hpp>
#include <ember/data/idx.hpp>
#include <ember/data/images.hpp>
#include <ember/data/tfrecord.hpp>
#include <ember/data/lmdb.hpp>
#include <ember/data/npy.hpp>
#include <ember/ember.hpp>
#ifdef EMBER_HAVE_HDF5
#include <ember/data/hdf5.hpp>
#endif

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

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

#ifdef EMBER_HAVE_HDF5
// One dataset per field, shaped and typed by sample 0; returns the bytes of the rows written.
int64_t pack_hdf5(const data::Dataset& source, int64_t n, const std::string& out, int gzip,
                  const std::function<void(int64_t)>& progress) {
  data::Hdf5Writer writer(out);
  int64_t bytes = 0;
  std::vector<std::pair<std::string, AnyTensor>> first;
  for (int64_t i = 0; i < n; ++i) {
    const data::Example ex = source.get(i);
    if (i == 0)
      for (const auto& [name, t] : ex.fields()) {
        writer.create(name, t.dtype(), t.shape(), {.gzip_level = gzip});
        first.emplace_back(name, t);
      }
    for (const auto& [name, t] : first) {
      const AnyTensor& v = ex[name];
      if (v.dtype() != t.dtype() || v.shape() != t.shape())
        throw ShapeError("pack_dataset: sample " + std::to_string(i) + " field '" + name + "' is " + v.desc() +
                         " but sample 0's is " + t.desc() + "; an HDF5 dataset needs one row shape (use --format lmdb)");
      writer.append(name, v);
      bytes += static_cast<int64_t>(v.nbytes());
    }
    progress(i + 1);
  }
  writer.finish();
  return bytes;
}
#endif

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      {{"out", ""}, {"images", ""}, {"keep-encoded", "0"}, {"idx-images", ""}, {"idx-labels", ""},
                       {"fashion-mnist", ""}, {"csv", ""}, {"label-column", ""}, {"header", "1"}, {"skip-rows", "0"},
                       {"npy", ""}, {"limit", "0"}, {"overwrite", "0"}, {"format", ""}, {"gzip", ""}});
  const std::string out = args.str("out");
  if (out.empty()) throw ValueError("--out DB is required");
  const bool keep_encoded = args.integer("keep-encoded") != 0;
  std::string format = args.str("format");
  if (format.empty())
    format = ends_with(out, ".h5") || ends_with(out, ".hdf5") ? "hdf5" : ends_with(out, ".tfrecord") ? "tfrecord" : "lmdb";
  if (format != "lmdb" && format != "hdf5" && format != "tfrecord")
    throw ValueError("--format is lmdb, hdf5 or tfrecord, got '" + format + "'");
#ifndef EMBER_HAVE_HDF5
  if (format == "hdf5") throw ValueError("--format hdf5: this pack_dataset was built without HDF5 (libhdf5-dev)");
#endif
  if (format != "lmdb" && keep_encoded)
    throw ValueError("--keep-encoded 1 stores PNG/JPEG files as they are, which only --format lmdb reads back as images");

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
  if (format != "lmdb" && std::filesystem::exists(out))  // as LmdbWriter refuses to
    throw IOError("'" + out + "' exists; remove it first (or --overwrite 1)");
  if (format != "lmdb" && n == 0)
    throw ValueError("--format " + format + ": no samples to pack (the file takes sample 0's shapes)");
  // TFRecord keeps no shapes or dtypes: the reader's spec comes from sample 0 (every sample must match it).
  data::TfSpec tf_spec;
  if (format == "tfrecord") {
    const data::Example sample0 = source->get(0);
    for (const auto& [name, t] : sample0.fields()) {
      if (t.dtype() == DType::Float64)
        throw ValueError("--format tfrecord: field '" + name + "' is float64, which TFRecord stores as float32; use lmdb or hdf5");
      tf_spec[name] = {t.dtype(), std::vector<int64_t>(t.shape().begin(), t.shape().end())};
    }
  }

  // --gzip: HDF5 compresses its chunks at level 4 unless told; TFRecord files are plain unless told
  // (a gzip file is read into memory whole and gets no cached index).
  const int gzip_level = args.str("gzip").empty() ? (format == "hdf5" ? 4 : 0) : static_cast<int>(args.integer("gzip"));
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  int64_t bytes = 0;
#ifdef EMBER_HAVE_HDF5
  if (format == "hdf5")
    bytes = pack_hdf5(*source, n, out, gzip_level,
                      [&](int64_t done) { progress_bar("pack", done, n, since(t0)); });
#endif
  if (format == "tfrecord") {
    data::TfRecordWriter writer(out, gzip_level > 0);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<uint8_t> rec = data::encode_tf_example(source->get(i));
      bytes += static_cast<int64_t>(rec.size());
      writer.write(rec);
      progress_bar("pack", i + 1, n, since(t0));
    }
    writer.finish();
  }
  if (format == "lmdb") {
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
  std::unique_ptr<data::Dataset> packed_file;
  if (format == "tfrecord") {
    packed_file = std::make_unique<data::TfRecordDataset>(out, data::TfRecordOptions{.spec = tf_spec});
  } else if (format == "lmdb") {
    packed_file = std::make_unique<data::LmdbDataset>(out, keep_encoded ? data::ImageDecoder(data::decode_image)
                                                                        : data::ImageDecoder());
  } else {
#ifdef EMBER_HAVE_HDF5
    std::vector<std::string> names;
    const data::Example sample0 = source->get(0);  // named: fields() refers into it
    for (const auto& [name, t] : sample0.fields()) names.push_back(name);
    packed_file = std::make_unique<data::Hdf5Dataset>(out, names);
#endif
  }
  const data::Dataset& packed = *packed_file;
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
  std::printf("{\"example\": \"pack_dataset\", \"out\": \"%s\", \"format\": \"%s\", \"records\": %lld, "
              "\"record_bytes\": %lld, \"pack_seconds\": %.3f, \"verify_seconds\": %.3f, \"verified\": true}\n",
              out.c_str(), format.c_str(), static_cast<long long>(n), static_cast<long long>(bytes), pack_seconds,
              since(t1));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pack_dataset: %s\n", e.what());
  return 1;
}
