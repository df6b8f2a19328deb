// bench_hdf5: what the process-wide HDF5 lock (data/hdf5_common.hpp) costs. Reads 70,000 28x28
// uint8 images (Fashion-MNIST's train and test images, or synthetic ones without the dataset) one
// row at a time, by index in a shuffled order, from an HDF5 file written by data::Hdf5Writer:
//   raw        HDF5's C calls alone (a hyperslab and H5Dread per row), one thread, no lock
//   raw+lock   the same calls under data::detail::Hdf5Lock (the lock, error printing off and on)
//   dataset    data::Hdf5Dataset::get (the lock, the reads, a tensor and an Example), 1 thread
//   dataset    the same from 2 and 4 threads at once (total rows per second)
// for a chunked file without compression and one with gzip level 4 (64 KiB chunks, Hdf5Writer's
// default), each with HDF5's default chunk cache (1 MiB) and with --cache-mb (the whole file).
//
//   bench_hdf5 [--dir /tmp] [--samples 70000] [--reps 2] [--cache-mb 64] [--gzip-default-cache-rows 5000]
// The gzip file with the default cache decompresses a chunk for about every row (~2,400 rows/s on
// a 2-core machine): it reads only the first --gzip-default-cache-rows of the order.
// Prints a table and one JSON line per measurement: the best of --reps passes after a warm-up
// pass (docs/data.md, "HDF5", has the figures).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ember/data/hdf5.hpp>
#include <ember/data/idx.hpp>
#include <ember/ember.hpp>

using namespace ember;
namespace fs = std::filesystem;

namespace {

std::string flag(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == "--" + name) return argv[i + 1];
  return def;
}

AnyTensor images(int64_t n) {
  const std::string dir = data::fashion_mnist_dir();
  if (fs::exists(dir + "/train-images-idx3-ubyte.gz")) {
    AnyTensor train = data::fashion_mnist("train").images(), test = data::fashion_mnist("test").images();
    AnyTensor all = AnyTensor::empty({train.size(0) + test.size(0), 28, 28}, DType::UInt8);
    std::memcpy(all.data_ptr(), train.data_ptr(), train.nbytes());
    std::memcpy(static_cast<uint8_t*>(all.data_ptr()) + train.nbytes(), test.data_ptr(), test.nbytes());
    if (all.size(0) >= n) return all.slice(0, n);
  }
  AnyTensor t = AnyTensor::empty({n, 28, 28}, DType::UInt8);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t k = 0; k < t.nbytes(); ++k) p[k] = static_cast<uint8_t>((k * 2654435761u) >> 24);
  return t;
}

// Rows per second of `read(i)` over `order`, split across `threads` threads.
template <class F>
double rate(const std::vector<int64_t>& order, int threads, F&& read) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (size_t k = static_cast<size_t>(t); k < order.size(); k += static_cast<size_t>(threads)) read(order[k]);
    });
  for (auto& th : pool) th.join();
  return static_cast<double>(order.size()) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The reads Hdf5Dataset::get makes, with HDF5's calls alone: no lock, no Example.
struct RawReader {
  hid_t file, dataset, space, memory;
  RawReader(const std::string& path, size_t cache_bytes) {
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t access = H5Pcreate(H5P_DATASET_ACCESS);
    if (cache_bytes)
      H5Pset_chunk_cache(access, data::detail::hdf5_cache_slots(cache_bytes), cache_bytes, H5D_CHUNK_CACHE_W0_DEFAULT);
    dataset = H5Dopen2(file, "image", access);
    H5Pclose(access);
    space = H5Dget_space(dataset);
    memory = H5Tcopy(H5T_NATIVE_UINT8);
  }
  ~RawReader() {
    H5Tclose(memory);
    H5Sclose(space);
    H5Dclose(dataset);
    H5Fclose(file);
  }
  void read(int64_t i, uint8_t* out) const {
    const hsize_t start[3] = {static_cast<hsize_t>(i), 0, 0}, count[3] = {1, 28, 28};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    const hid_t mem = H5Screate_simple(3, count, nullptr);
    if (H5Dread(dataset, memory, mem, space, H5P_DEFAULT, out) < 0) std::abort();
    H5Sclose(mem);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = flag(argc, argv, "dir", fs::temp_directory_path().string());
  const int64_t n = std::stoll(flag(argc, argv, "samples", "70000"));
  const int reps = std::stoi(flag(argc, argv, "reps", "2"));
  const size_t cache = std::stoull(flag(argc, argv, "cache-mb", "64")) << 20;
  const int64_t gzip_rows = std::stoll(flag(argc, argv, "gzip-default-cache-rows", "5000"));
  const AnyTensor all = images(n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));

  std::printf("%-8s %-6s %-9s %7s %12s\n", "file", "cache", "reader", "threads", "rows/s");
  for (int gzip : {0, 4}) {
    const std::string path = dir + "/ember_bench_hdf5_gzip" + std::to_string(gzip) + ".h5";
    {
      data::Hdf5Writer w(path);
      w.create("image", DType::UInt8, {28, 28}, {.gzip_level = gzip});
      w.append("image", all);
      w.finish();
    }
    for (size_t cache_bytes : {size_t{0}, cache}) {
      const std::string file = gzip ? "gzip4" : "chunked", cache_name = cache_bytes ? std::to_string(cache_bytes >> 20) + "M" : "1M";
      const std::vector<int64_t> rows(order.begin(), order.begin() + (gzip && !cache_bytes ? std::min<int64_t>(gzip_rows, n) : n));
      auto report = [&](const char* reader, int threads, double best) {
        std::printf("%-8s %-6s %-9s %7d %12.0f\n", file.c_str(), cache_name.c_str(), reader, threads, best);
        std::printf("{\"bench\": \"hdf5\", \"file\": \"%s\", \"cache\": \"%s\", \"reader\": \"%s\", \"threads\": %d, "
                    "\"rows\": %zu, \"rows_per_s\": %.0f}\n",
                    file.c_str(), cache_name.c_str(), reader, threads, rows.size(), best);
      };
      // Best of `reps` after one warm-up pass (which fills the chunk cache where it holds the file).
      auto best_of = [&](int threads, auto&& read) {
        double best = 0;
        for (int r = 0; r <= reps; ++r) {
          const double v = rate(rows, threads, read);
          if (r > 0) best = std::max(best, v);
        }
        return best;
      };
      {
        RawReader raw(path, cache_bytes);
        std::vector<uint8_t> buf(784);
        report("raw", 1, best_of(1, [&](int64_t i) { raw.read(i, buf.data()); }));
        report("raw+lock", 1, best_of(1, [&](int64_t i) {
                 data::detail::Hdf5Lock lock;
                 raw.read(i, buf.data());
               }));
      }
      const data::Hdf5Dataset ds(path, {"image"}, {.chunk_cache_bytes = cache_bytes});
      for (int threads : {1, 2, 4}) report("dataset", threads, best_of(threads, [&](int64_t i) { (void)ds.get(i); }));
    }
    fs::remove(path);
  }
  return 0;
}
