// bench_data: the small-files case and loader overlap (docs/data.md has the figures).
//
// 1. Fashion-MNIST (70,000 images, 28x28) written out as one PNG file per image
//    (root/<label>/<index>.png) versus the same samples packed in LMDB (raw uint8 records), in
//    HDF5 (one chunked dataset per field, no compression, a chunk cache that holds the file; built
//    with HDF5 only) and in TFRecord (tf.train.Example records: the image as bytes, the label as
//    int64): samples per second read and decoded through data::DataLoader with 0, 1 and 2 workers
//    (and the IDX tensors in memory, for reference).
// 2. Overlap: a loop whose step is emulated compute (a sleep of --step-ms per batch), over the
//    PNG folder: the share of the step the training thread waits for data, by worker count.
//    With workers and prefetch it must fall under 5% whenever loading is faster than compute.
//
//   bench_data [--dir /tmp/ember_bench_data] [--samples 70000] [--batch 256] [--workers 0,1,2]
//              [--step-ms 0 (auto: 1.5x the 2-worker load time per batch)] [--overlap-batches 60]
//
// The first run writes the PNG folder, the LMDB database, the HDF5 and the TFRecord files under
// --dir (kept for later runs).
// Prints a table and one JSON line per measurement. benchmarks/bench_data_torch.py is the
// PyTorch twin (its DataLoader over the same PNG folder and over in-memory tensors).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <ember/data/dataloader.hpp>
#include <ember/data/idx.hpp>
#include <ember/data/images.hpp>
#include <ember/data/lmdb.hpp>
#include <ember/data/tfrecord.hpp>
#ifdef EMBER_HAVE_HDF5
#include <ember/data/hdf5.hpp>
#endif
#include <ember/ember.hpp>

using namespace ember;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

namespace {

std::string flag(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return def;
}
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Fashion-MNIST train + test as one dataset (70,000 samples).
class Both : public data::Dataset {
 public:
  Both(const data::Dataset& a, const data::Dataset& b) : a_(a), b_(b) {}
  int64_t size() const override { return a_.size() + b_.size(); }
  data::Example get(int64_t i) const override { return i < a_.size() ? a_.get(i) : b_.get(i - a_.size()); }

 private:
  const data::Dataset& a_;
  const data::Dataset& b_;
};

// One epoch (or `limit` samples) through the loader: samples per second.
double throughput(const data::Dataset& ds, int workers, int64_t batch, int64_t limit) {
  data::DataLoader l(ds, {.batch_size = batch, .shuffle = true, .seed = 1, .num_workers = workers, .prefetch = 4});
  const auto t0 = clock_type::now();
  int64_t n = 0;
  while (auto b = l.next()) {
    n += static_cast<int64_t>(b->indices.size());
    if (n >= limit) break;
  }
  return static_cast<double>(n) / since(t0);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string dir = flag(argc, argv, "dir", "/tmp/ember_bench_data");
  const int64_t samples = std::stoll(flag(argc, argv, "samples", "70000"));
  const int64_t batch = std::stoll(flag(argc, argv, "batch", "256"));
  double step_ms = std::stod(flag(argc, argv, "step-ms", "0"));
  const int64_t overlap_batches = std::stoll(flag(argc, argv, "overlap-batches", "60"));
  std::vector<int> workers;
  {
    std::stringstream ss(flag(argc, argv, "workers", "0,1,2"));
    std::string w;
    while (std::getline(ss, w, ',')) workers.push_back(std::stoi(w));
  }

  data::IdxDataset train = data::fashion_mnist("train"), test = data::fashion_mnist("test");
  Both all(train, test);
  const int64_t n = std::min<int64_t>(samples, all.size());
  const fs::path png_root = fs::path(dir) / ("png_" + std::to_string(n));
  const std::string lmdb_path = (fs::path(dir) / ("fashion_" + std::to_string(n) + ".lmdb")).string();
  fs::create_directories(dir);
  if (!fs::exists(png_root / "done")) {
    const auto t0 = clock_type::now();
    for (int64_t i = 0; i < n; ++i) {
      data::Example e = all.get(i);
      const fs::path p = png_root / std::to_string(e.get<int64_t>("label").item()) / (std::to_string(i) + ".png");
      fs::create_directories(p.parent_path());
      auto bytes = data::encode_png(e["image"]);
      std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<std::streamsize>(bytes.size()));
    }
    std::ofstream(png_root / "done") << n;
    std::fprintf(stderr, "wrote %lld PNG files in %.1f s\n", static_cast<long long>(n), since(t0));
  }
  if (!fs::exists(lmdb_path)) {
    data::LmdbWriter w(lmdb_path);
    for (int64_t i = 0; i < n; ++i) {
      data::Example e = all.get(i);
      w.append(data::encode_record({{"image", e["image"].clone()}, {"label", e["label"].clone()}}));
    }
    w.finish();
  }
  const std::string tfrecord_path = (fs::path(dir) / ("fashion_" + std::to_string(n) + ".tfrecord")).string();
  if (!fs::exists(tfrecord_path)) {
    data::TfRecordWriter w(tfrecord_path);
    for (int64_t i = 0; i < n; ++i) w.write(all.get(i));
    w.finish();
  }
  data::ImageFolderDataset pngs(png_root.string());
  data::LmdbDataset packed(lmdb_path);
  data::TfRecordDataset tfrecords(tfrecord_path, {.spec = {{"image", {DType::UInt8, {28, 28}}}, {"label", {DType::Int64, {}}}}});
  std::vector<std::pair<std::string, const data::Dataset*>> sources = {{"png", &pngs}, {"lmdb", &packed}};
#ifdef EMBER_HAVE_HDF5
  const std::string hdf5_path = (fs::path(dir) / ("fashion_" + std::to_string(n) + ".h5")).string();
  if (!fs::exists(hdf5_path)) {
    data::Hdf5Writer w(hdf5_path);
    w.create("image", DType::UInt8, Shape{28, 28});
    w.create("label", DType::Int64, Shape{});
    for (int64_t i = 0; i < n; ++i) w.append(all.get(i));
    w.finish();
  }
  // A chunk cache that holds the whole file (about 60 MB): shuffled reads then read each chunk
  // from the file once (docs/data.md, "HDF5").
  data::Hdf5Dataset hdf5(hdf5_path, {"image", "label"}, {.chunk_cache_bytes = size_t{128} << 20});
  sources.push_back({"hdf5", &hdf5});
#endif
  sources.push_back({"tfrecord", &tfrecords});
  sources.push_back({"memory", &all});

  std::printf("%-10s %8s %14s\n", "source", "workers", "samples/s");
  double png2 = 0;
  for (const auto& [src, ds] : sources) {
    const char* source = src.c_str();
    for (int w : workers) {
      const double sps = throughput(*ds, w, batch, n);
      if (src == "png" && w == 2) png2 = sps;
      std::printf("%-10s %8d %14.0f\n", source, w, sps);
      std::printf("{\"bench\": \"data_read\", \"source\": \"%s\", \"workers\": %d, \"batch\": %lld, \"samples\": %lld, "
                  "\"samples_per_second\": %.1f}\n",
                  source, w, static_cast<long long>(batch), static_cast<long long>(n), sps);
    }
  }

  // Overlap with emulated compute over the PNG folder (the slow source).
  if (step_ms <= 0) step_ms = png2 > 0 ? 1.5e3 * static_cast<double>(batch) / png2 : 50.0;
  std::printf("\noverlap: step = %.1f ms of emulated compute per batch of %lld (PNG files)\n", step_ms,
              static_cast<long long>(batch));
  std::printf("%8s %14s %12s\n", "workers", "wait/step %", "step ms");
  for (int w : workers) {
    data::DataLoader l(pngs, {.batch_size = batch, .shuffle = true, .seed = 2, .num_workers = w, .prefetch = 4});
    (void)l.next();  // the first batch is always a wait: start-up, not overlap
    l.reset_wait_stats();
    const auto t0 = clock_type::now();
    int64_t k = 0;
    while (k < overlap_batches) {
      auto b = l.next();
      if (!b) continue;
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
      ++k;
    }
    const double total = since(t0);
    const double wait_share = 100.0 * l.total_wait_seconds() / total;
    std::printf("%8d %14.2f %12.1f\n", w, wait_share, 1e3 * total / static_cast<double>(k));
    std::printf("{\"bench\": \"data_overlap\", \"workers\": %d, \"step_ms\": %.2f, \"batches\": %lld, "
                "\"wait_percent_of_step\": %.3f}\n",
                w, step_ms, static_cast<long long>(k), wait_share);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_data: %s\n", e.what());
  return 1;
}
