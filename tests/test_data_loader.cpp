// data::DataLoader (include/ember/data/dataloader.hpp) and the CPU transforms: order, shuffling
// keyed by (seed, epoch), bitwise-identical batches for 0/1/2/4 workers with random transforms,
// resume mid-epoch through state()/load_state() (and its JSON), DistributedSampler shares, worker
// exceptions delivered with their batch, destruction mid-epoch, wait-time recording and trace
// phases, and the pinned upload path through a pretend cuda:0.
//
// Also built with -fsanitize=thread (see docs/data.md) to check the worker threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <set>
#include <thread>

#include "ember/backend/cpu/cpu_backend.hpp"
#include "ember/data/dataloader.hpp"
#include "ember/data/dataloader_json.hpp"
#include "ember/data/transforms.hpp"
#include "pretend_gpu.hpp"
#include "test_util.hpp"

using namespace ember;
using namespace ember::data;
using ember::testing::message_of;
using Catch::Matchers::Contains;

namespace {

// n uint8 "images" [H, W] whose pixels encode the index, and int64 labels = index.
TensorDataset image_dataset(int64_t n, int64_t h = 6, int64_t w = 5) {
  std::vector<uint8_t> px(static_cast<size_t>(n * h * w));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 7 + i / 30) % 251);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i;
  return TensorDataset({{"image", Tensor<uint8_t>::from_vector(px, {n, h, w})},
                        {"label", Tensor<int64_t>::from_vector(labels, {n})}},
                       "images");
}

Transform augment() {
  return Compose({ToFloat{}, RandomCrop{6, 5, 2}, RandomHorizontalFlip{0.5}, Normalize{{0.5f}, {0.25f}}});
}

// Every batch of `epochs` epochs as raw bytes of each field, plus the label lists.
struct Run {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<int64_t>> labels;
};
void append(Run& r, const Batch& b) {
  std::vector<uint8_t> all;
  for (const auto& [name, t] : b.data.fields()) {
    AnyTensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
    auto* p = static_cast<const uint8_t*>(h.data_ptr());
    all.insert(all.end(), p, p + h.nbytes());
  }
  r.bytes.push_back(std::move(all));
  r.labels.push_back(Tensor<int64_t>(b["label"].device().is_cpu() ? b["label"] : b["label"].to(Device::cpu())).to_vector());
}
Run run_epochs(const Dataset& ds, DataLoaderOptions o, int epochs) {
  DataLoader loader(ds, std::move(o));
  Run r;
  for (int e = 0; e < epochs; ++e)
    for (Batch& b : loader) append(r, b);
  return r;
}

// Throws a FormatError for one index, like a corrupt record.
class CorruptAt : public Dataset {
 public:
  CorruptAt(const Dataset& base, int64_t bad) : base_(base), bad_(bad) {}
  int64_t size() const override { return base_.size(); }
  Example get(int64_t i) const override {
    if (i == bad_) throw FormatError("record " + std::to_string(i) + ": bad checksum");
    return base_.get(i);
  }
  std::string name() const override { return "corrupt_at"; }

 private:
  const Dataset& base_;
  int64_t bad_;
};

// Sleeps per sample (loading slower than the consumer), counts calls.
class SlowDataset : public Dataset {
 public:
  SlowDataset(const Dataset& base, std::chrono::microseconds delay) : base_(base), delay_(delay) {}
  int64_t size() const override { return base_.size(); }
  Example get(int64_t i) const override {
    calls_.fetch_add(1);
    std::this_thread::sleep_for(delay_);
    return base_.get(i);
  }
  int64_t calls() const { return calls_.load(); }

 private:
  const Dataset& base_;
  std::chrono::microseconds delay_;
  mutable std::atomic<int64_t> calls_{0};
};

}  // namespace

TEST_CASE("DataLoader: in-order batches, last partial batch, drop_last", "[data][loader]") {
  auto ds = image_dataset(10);
  DataLoader loader(ds, {.batch_size = 4});
  CHECK(loader.num_batches() == 3);
  std::vector<std::vector<int64_t>> got;
  for (Batch& b : loader) {
    CHECK(b["image"].shape()[0] == static_cast<int64_t>(b.indices.size()));
    CHECK(b["image"].shape()[1] == 6);
    got.push_back(b.get<int64_t>("label").to_vector());
    CHECK(got.back() == b.indices);
  }
  CHECK(got == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  // The stacked image rows are the dataset's rows.
  DataLoader again(ds, {.batch_size = 4});
  Batch b1 = *again.next();
  Batch b2 = *again.next();
  CHECK(Tensor<uint8_t>(b2["image"].select(1)).to_vector() == ds.get(5).get<uint8_t>("image").to_vector());
  CHECK(b2.index == 1);

  DataLoader dl(ds, {.batch_size = 4, .drop_last = true});
  CHECK(dl.num_batches() == 2);
  int n = 0;
  for (Batch& b : dl) n += static_cast<int>(b.indices.size());
  CHECK(n == 8);
  // The next iteration is the next epoch.
  CHECK(dl.epoch() == 1);
}

TEST_CASE("DataLoader: shuffled order is a permutation keyed by (seed, epoch)", "[data][loader]") {
  auto ds = image_dataset(50);
  auto order = [&](uint64_t seed, int epochs) {
    DataLoader l(ds, {.batch_size = 7, .shuffle = true, .seed = seed});
    std::vector<std::vector<int64_t>> all;
    for (int e = 0; e < epochs; ++e) {
      std::vector<int64_t> o;
      for (Batch& b : l) o.insert(o.end(), b.indices.begin(), b.indices.end());
      all.push_back(o);
    }
    return all;
  };
  auto a = order(3, 2), b = order(3, 2), c = order(4, 1);
  CHECK(a == b);
  CHECK(a[0] != a[1]);
  CHECK(a[0] != c[0]);
  for (const auto& o : a) {
    std::set<int64_t> s(o.begin(), o.end());
    CHECK(s.size() == 50);
    CHECK(*s.begin() == 0);
    CHECK(*s.rbegin() == 49);
  }
  CHECK(epoch_permutation(50, 3, 0) == a[0]);
  CHECK(epoch_permutation(50, 3, 1) == a[1]);
}

TEST_CASE("DataLoader: batches are bitwise identical for 0, 1, 2 and 4 workers with random transforms",
          "[data][loader][determinism]") {
  auto ds = image_dataset(37);
  auto opts = [&](int workers) {
    return DataLoaderOptions{.batch_size = 5, .shuffle = true, .seed = 11, .num_workers = workers,
                             .prefetch = 2, .transform = augment()};
  };
  Run r0 = run_epochs(ds, opts(0), 2);
  REQUIRE(r0.bytes.size() == 16);
  for (int w : {1, 2, 4}) {
    Run rw = run_epochs(ds, opts(w), 2);
    INFO("workers " << w);
    CHECK(rw.labels == r0.labels);
    CHECK(rw.bytes == r0.bytes);
  }
  // The transform really is random: another seed gives other pixels for the same samples.
  Run other = run_epochs(ds, {.batch_size = 37, .seed = 12, .transform = augment()}, 1);
  Run same = run_epochs(ds, {.batch_size = 37, .seed = 11, .transform = augment()}, 1);
  CHECK(other.bytes != same.bytes);
}

TEST_CASE("DataLoader: workers feeding a convolution model train to the same bits as no workers",
          "[data][loader][threads][onednn]") {
  // The workers make the batches (blocks of the host allocator's cache: a batch is 73,728 bytes,
  // above its 64 KiB threshold) that the training thread's convolutions, pooling and GEMMs read
  // and free; the cache hands the freed blocks back to the workers. With oneDNN built in and more
  // than one ember thread, the fp32 convolutions run through it. Under ThreadSanitizer this is
  // the loader-to-training hand-off over oneDNN's path (docs/architecture.md).
  const int threads_before = get_num_threads();
  set_num_threads(std::max(2, threads_before));
  auto ds = image_dataset(96, 24, 24);
  auto train = [&](int workers) {
    Generator gen(5);  // the initial weights
    GeneratorScope scope(gen);
    nn::Sequential model;
    model.emplace<nn::Conv2d>(1, 4, 3, nn::Conv2dOptions{.padding = {1, 1}});
    model.emplace<nn::ReLU>();
    model.emplace<nn::MaxPool2d>(2);
    model.emplace<nn::Flatten>();
    model.emplace<nn::Linear>(4 * 12 * 12, 3);
    optim::SGD opt(model.parameters(), {.lr = 0.01});
    DataLoader loader(ds, {.batch_size = 32, .shuffle = true, .seed = 4, .num_workers = workers, .prefetch = 2,
                           .transform = Compose({ToFloat{}, RandomHorizontalFlip{0.5}, Normalize{{0.5f}, {0.25f}}})});
    std::vector<float> losses;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (Batch& b : loader) {
        FloatTensor x = b.get<float>("image");
        FloatTensor y = b.get<int64_t>("label").to<float>() * (1.0f / 96);
        FloatTensor out = model(x.reshape({x.shape()[0], 1, 24, 24}));
        FloatTensor loss = nn::functional::mse_loss(sum(out, {1}), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        losses.push_back(loss.item());
      }
    for (const auto& [name, p] : model.named_parameters()) {
      const auto v = FloatTensor(p).to_vector();
      losses.insert(losses.end(), v.begin(), v.end());
    }
    return losses;
  };
  const std::vector<float> alone = train(0);
  const std::vector<float> fed = train(2);
  set_num_threads(threads_before);
  REQUIRE(alone.size() > 6);
  CHECK(fed.size() == alone.size());
  CHECK(std::memcmp(fed.data(), alone.data(), alone.size() * sizeof(float)) == 0);
}

TEST_CASE("DataLoader: resume mid-epoch from state() gives the remaining batches, no replay",
          "[data][loader][resume]") {
  auto ds = image_dataset(23);
  SlowDataset counted(ds, std::chrono::microseconds(0));
  DataLoaderOptions o{.batch_size = 4, .shuffle = true, .seed = 5, .num_workers = 2, .transform = augment()};
  Run full = run_epochs(ds, o, 2);  // 6 batches per epoch, 12 in all

  DataLoaderState saved;
  Run first;
  {
    DataLoader l(ds, o);
    for (Batch& b : l) append(first, b);  // epoch 0
    for (int k = 0; k < 2; ++k) append(first, *l.next());
    saved = l.state();
  }  // destroyed mid-epoch with batches prefetched
  CHECK(saved == DataLoaderState{1, 2, 5});
  nlohmann::json j = saved;
  CHECK(j.dump() == R"({"batches_consumed":2,"epoch":1,"seed":5})");

  DataLoader resumed(ds, o);
  resumed.load_state(j.get<DataLoaderState>());
  Run rest;
  for (Batch& b : resumed) append(rest, b);
  REQUIRE(first.bytes.size() + rest.bytes.size() == full.bytes.size());
  for (size_t k = 0; k < first.bytes.size(); ++k) CHECK(first.bytes[k] == full.bytes[k]);
  for (size_t k = 0; k < rest.bytes.size(); ++k) CHECK(rest.bytes[k] == full.bytes[first.bytes.size() + k]);
  CHECK(resumed.state() == DataLoaderState{2, 0, 5});
  // No replay: resumed without workers (no prefetch to blur the count), the loader reads exactly
  // the 15 samples of epoch 1 that were not consumed, and gives the same batches.
  o.num_workers = 0;
  DataLoader resumed0(counted, o);
  resumed0.load_state(saved);
  Run rest0;
  for (Batch& b : resumed0) append(rest0, b);
  CHECK(counted.calls() == 23 - 8);
  CHECK(rest0.bytes == rest.bytes);

  // Bad states.
  DataLoader l(ds, o);
  CHECK_THROWS_AS(l.load_state({0, 0, 6}), ValueError);
  CHECK_THAT(message_of([&] { l.load_state({0, 0, 6}); }), Contains("seed 6") && Contains("seed is 5"));
  CHECK_THROWS_AS(l.load_state({0, 7, 5}), ValueError);
  CHECK_THAT(message_of([&] { l.load_state({0, 7, 5}); }), Contains("batches_consumed 7 is not in [0, 6]"));
  CHECK_THROWS_AS(nlohmann::json::parse(R"({"epoch": 1, "seed": 5})").get<DataLoaderState>(), FormatError);
  CHECK_THAT(message_of([] { (void)nlohmann::json::parse(R"({"epoch": -1, "batches_consumed": 0, "seed": 5})").get<DataLoaderState>(); }),
             Contains("'epoch'"));
  CHECK_THROWS_AS(nlohmann::json::parse("[1]").get<DataLoaderState>(), FormatError);
  // A state at the end of an epoch resumes into the next one.
  l.load_state({3, 6, 5});
  CHECK_FALSE(l.next().has_value());
  CHECK(l.state() == DataLoaderState{4, 0, 5});
}

TEST_CASE("DataLoader: DistributedSampler shares are disjoint and follow set_epoch", "[data][loader][sampler]") {
  auto ds = image_dataset(20);
  std::set<int64_t> seen;
  int64_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    DataLoader l(ds, {.batch_size = 3, .num_workers = 1,
                      .sampler = DistributedSampler(20, 3, rank, {.shuffle = true, .seed = 9, .drop_last = true})});
    CHECK(l.num_batches() == 2);  // 6 samples per rank
    for (Batch& b : l)
      for (int64_t i : b.indices) {
        seen.insert(i);
        ++total;
      }
  }
  CHECK(total == 18);
  CHECK(seen.size() == 18);
  // Epoch 1 follows the sampler's epoch-1 order.
  DistributedSampler ref(20, 3, 1, {.shuffle = true, .seed = 9, .drop_last = true});
  ref.set_epoch(1);
  DataLoader l(ds, {.batch_size = 6, .sampler = DistributedSampler(20, 3, 1, {.shuffle = true, .seed = 9, .drop_last = true})});
  while (l.next()) {
  }
  CHECK(l.next()->indices == ref.indices());
  CHECK_THROWS_AS(DataLoader(ds, {.shuffle = true, .sampler = DistributedSampler(20, 2, 0)}), ValueError);
  CHECK_THROWS_AS(DataLoader(ds, {.sampler = DistributedSampler(30, 1, 0)}), IndexError);
}

TEST_CASE("DataLoader: a worker's exception arrives with its batch, naming dataset, index and cause",
          "[data][loader][errors]") {
  auto ds = image_dataset(12);
  CorruptAt bad(ds, 6);
  for (int workers : {0, 2}) {
    INFO("workers " << workers);
    DataLoader l(bad, {.batch_size = 4, .num_workers = workers});
    CHECK(l.next()->indices == std::vector<int64_t>{0, 1, 2, 3});
    std::string msg;
    try {
      l.next();
      FAIL("no exception");
    } catch (const FormatError& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Contains("corrupt_at") && Contains("index 6") && Contains("batch 1 of epoch 0") &&
                        Contains("bad checksum"));
    // The loader goes on with the next batch.
    CHECK(l.next()->indices == std::vector<int64_t>{8, 9, 10, 11});
    CHECK_FALSE(l.next().has_value());
  }
  // A collate failure names the field and the element.
  std::vector<Example> ragged{Example{{"x", Tensor<float>::zeros({2})}}, Example{{"x", Tensor<float>::zeros({3})}}};
  CHECK_THROWS_AS(stack_examples(ragged), ShapeError);
  CHECK_THAT(message_of([&] { stack_examples(ragged); }),
             Contains("field 'x' of batch element 1 is float32 [3] but element 0's is float32 [2]"));
  CHECK_THROWS_AS(DataLoader(ds, {.batch_size = 0}), ValueError);
  CHECK_THROWS_AS(DataLoader(ds, {.num_workers = -1}), ValueError);
  CHECK_THROWS_AS(DataLoader(ds, {.prefetch = 0}), ValueError);
}

TEST_CASE("DataLoader: a custom collate", "[data][loader]") {
  auto ds = image_dataset(6);
  DataLoader l(ds, {.batch_size = 3, .collate = [](std::vector<Example>& ex) {
                      int64_t sum = 0;
                      for (auto& e : ex) sum += e.get<int64_t>("label").item();
                      return Example{{"label", Tensor<int64_t>::scalar(sum)}};
                    }});
  CHECK(l.next()->get<int64_t>("label").item() == 3);
  CHECK(l.next()->get<int64_t>("label").item() == 12);
}

TEST_CASE("DataLoader: destroying it mid-epoch returns promptly", "[data][loader][threads]") {
  auto ds = image_dataset(400);
  SlowDataset slow(ds, std::chrono::microseconds(2000));
  const auto t0 = std::chrono::steady_clock::now();
  for (int workers : {1, 4}) {
    DataLoader l(slow, {.batch_size = 8, .num_workers = workers, .prefetch = 4});
    REQUIRE(l.next().has_value());
  }
  {
    DataLoader never_read(slow, {.batch_size = 8, .num_workers = 3});
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Each destruction waits for at most one batch per worker (8 samples x 2 ms), far below 400 samples.
  CHECK(s < 2.0);
  CHECK(slow.calls() < 400);
}

namespace {
struct PhaseCounter : trace::Listener {
  std::atomic<int> begins[trace::kNumPhases] = {};
  std::atomic<int> ends[trace::kNumPhases] = {};
  void phase_begin(trace::Phase p) override { begins[static_cast<int>(p)]++; }
  void phase_end(trace::Phase p) override { ends[static_cast<int>(p)]++; }
  void range_begin(const char*) override {}
  void range_end(const char*) override {}
};
struct ListenerScope {
  explicit ListenerScope(trace::Listener* l) { trace::listener_slot().store(l); }
  ~ListenerScope() { trace::listener_slot().store(nullptr); }
};
}  // namespace

TEST_CASE("DataLoader: records the training thread's wait per batch inside the DataWait phase", "[data][loader]") {
  auto ds = image_dataset(16);
  SlowDataset slow(ds, std::chrono::microseconds(3000));
  PhaseCounter counter;
  ListenerScope scope(&counter);
  DataLoader l(slow, {.batch_size = 4});
  double sum = 0;
  int n = 0;
  for (Batch& b : l) {
    CHECK(b.wait_seconds >= 0.011);  // 4 samples x 3 ms loaded on this thread
    sum += b.wait_seconds;
    ++n;
  }
  CHECK(n == 4);
  CHECK(l.num_waits() == 4);
  CHECK(l.total_wait_seconds() == Approx(sum));
  CHECK(counter.begins[static_cast<int>(trace::Phase::DataWait)] == 4);
  CHECK(counter.ends[static_cast<int>(trace::Phase::DataWait)] == 4);
  CHECK(counter.begins[static_cast<int>(trace::Phase::HostToDevice)] == 0);

  // With workers and prefetch and a consumer slower than loading, the waits nearly vanish.
  DataLoader fast(slow, {.batch_size = 4, .num_workers = 2, .prefetch = 2});
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  fast.reset_wait_stats();
  for (Batch& b : fast) {
    (void)b;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fast.total_wait_seconds() < 0.01);
}

namespace {
// cuda:0 made of CPU kernels that counts the pinned-memory and upload entries.
class CountingPretendCuda : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
  void* allocate_pinned(size_t bytes) override {
    pinned_allocs++;
    return cpu::CpuBackend::allocate_pinned(bytes);
  }
  void free_pinned(void* p, size_t bytes) noexcept override {
    pinned_frees++;
    cpu::CpuBackend::free_pinned(p, bytes);
  }
  uint64_t upload_async(void* dst, const void* src, size_t bytes) override {
    uploads++;
    return cpu::CpuBackend::upload_async(dst, src, bytes);
  }
  void* allocate_for_upload(size_t bytes) override {
    upload_allocs++;
    return cpu::CpuBackend::allocate_for_upload(bytes);
  }
  uint64_t upload_async_fresh(void* dst, const void* src, size_t bytes) override {
    fresh_uploads++;
    return cpu::CpuBackend::upload_async_fresh(dst, src, bytes);
  }
  void wait_upload(uint64_t t) override {
    waits++;
    cpu::CpuBackend::wait_upload(t);
  }
  std::atomic<int> pinned_allocs{0}, pinned_frees{0}, uploads{0}, fresh_uploads{0}, upload_allocs{0}, waits{0};
};
using CountingGpu = testing::StandIn<CountingPretendCuda, testing::CudaStandIn::Always>;
CountingPretendCuda& counting_backend() { return CountingGpu::backend(); }
}  // namespace

TEST_CASE("DataLoader: a CUDA device gets pinned staging (a ring allocated once) and async uploads (pretend cuda:0)",
          "[data][loader][device]") {
  if (cuda::is_available()) {
    std::cout << "SKIPPED: a real GPU is present; the pretend-device test runs only without one" << std::endl;
    return;
  }
  auto ds = image_dataset(30);
  Run host = run_epochs(ds, {.batch_size = 4, .shuffle = true, .seed = 2, .num_workers = 2, .transform = augment()}, 2);
  CountingGpu gpu;
  CountingPretendCuda& cb = counting_backend();
  const int64_t live_before = memory_stats(Device::cuda(0)).current_bytes;
  PhaseCounter counter;
  ListenerScope scope(&counter);
  Run dev;
  {
    DataLoader l(ds, {.batch_size = 4, .shuffle = true, .seed = 2, .num_workers = 2, .prefetch = 2,
                      .device = Device::cuda(0), .transform = augment()});
    for (int e = 0; e < 2; ++e)
      for (Batch& b : l) {
        CHECK(b["image"].device() == Device::cuda(0));
        CHECK(b["label"].device() == Device::cuda(0));
        append(dev, b);
      }
  }
  CHECK(dev.bytes == host.bytes);
  CHECK(dev.labels == host.labels);
  CHECK(cb.pinned_allocs == 4);   // ring of prefetch x workers slots, each allocated once
  CHECK(cb.pinned_frees == 4);
  CHECK(cb.uploads == 2 * 8 * 2);  // two fields per batch, 8 batches per epoch, 2 epochs
  // each into memory allocated for an upload (on CUDA in the copy stream's order), by the upload
  // that does not wait for the compute stream's queued work
  CHECK(cb.fresh_uploads == 2 * 8 * 2);
  CHECK(cb.upload_allocs == 2 * 8 * 2);
  CHECK(memory_stats(Device::cuda(0)).current_bytes == live_before);  // every batch's device memory freed
  CHECK(counter.begins[static_cast<int>(trace::Phase::HostToDevice)] == 16);

  // pin_memory = false: plain copies, no pinned memory.
  const int before = cb.pinned_allocs;
  DataLoader plain(ds, {.batch_size = 4, .pin_memory = false, .device = Device::cuda(0)});
  CHECK(plain.next()->data["image"].device() == Device::cuda(0));
  CHECK(cb.pinned_allocs == before);
}

TEST_CASE("DataLoader: a device that does not exist fails at construction", "[data][loader][device]") {
  if (cuda::is_available()) {
    std::cout << "SKIPPED: a real GPU is present" << std::endl;
    return;
  }
  auto ds = image_dataset(4);
  CHECK_THROWS_AS(DataLoader(ds, {.device = Device::cuda(0)}), DeviceError);
}

// ------------------------------------------------------------------ transforms

TEST_CASE("Transforms: ToFloat, RandomCrop with padding, flip, Normalize compute the expected pixels",
          "[data][transforms]") {
  SampleRandom rng(1, 0, 0);
  // [2, 3] uint8 -> [1, 2, 3] float; HWC [1, 2, 2] -> CHW [2, 1, 2].
  Example e{{"image", Tensor<uint8_t>::from_vector({0, 51, 102, 153, 204, 255}, {2, 3})}};
  Example f = ToFloat{}(e, rng);
  CHECK(f["image"].shape() == Shape{1, 2, 3});
  const float k = 1.0f / 255.0f;
  CHECK(f.get<float>("image").to_vector() == std::vector<float>{0, 51 * k, 102 * k, 153 * k, 204 * k, 255 * k});
  CHECK(f.get<float>("image").to_vector()[5] == Approx(1.0f));
  Example hwc{{"image", Tensor<uint8_t>::from_vector({1, 2, 3, 4}, {1, 2, 2})}};
  CHECK(ToFloat{.scale = 1}(hwc, rng).get<float>("image").to_vector() == std::vector<float>{1, 3, 2, 4});

  // A crop of the padded image equals the reference window for the offsets the stream draws.
  auto img = Tensor<float>::from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 3, 3});
  for (int64_t idx = 0; idx < 20; ++idx) {
    SampleRandom a(7, 1, idx), b(7, 1, idx);
    Example out = RandomCrop{3, 3, 1}(Example{{"image", img}}, a);
    const int64_t top = b.randint(0, 2) - 1, left = b.randint(0, 2) - 1;
    std::vector<float> want;
    for (int64_t y = 0; y < 3; ++y)
      for (int64_t x = 0; x < 3; ++x) {
        const int64_t sy = top + y, sx = left + x;
        want.push_back(sy < 0 || sy > 2 || sx < 0 || sx > 2 ? 0.0f : static_cast<float>(sy * 3 + sx + 1));
      }
    CHECK(out.get<float>("image").to_vector() == want);
  }
  // Flip with p = 1 mirrors each row; p = 0 leaves it.
  CHECK(RandomHorizontalFlip{1.0}(Example{{"image", img}}, rng).get<float>("image").to_vector() ==
        std::vector<float>{3, 2, 1, 6, 5, 4, 9, 8, 7});
  CHECK(RandomHorizontalFlip{0.0}(Example{{"image", img}}, rng).get<float>("image").to_vector() == img.to_vector());
  // Normalize per channel.
  auto two = Tensor<float>::from_vector({1, 3, 10, 20}, {2, 1, 2});
  CHECK(Normalize{{1, 10}, {2, 5}}(Example{{"image", two}}, rng).get<float>("image").to_vector() ==
        std::vector<float>{0, 1, 0, 2});
  // Flip of uint8 and the draw frequency of p = 0.5 over many samples.
  int flipped = 0;
  for (int64_t idx = 0; idx < 2000; ++idx) {
    SampleRandom r(3, 0, idx);
    flipped += r.bernoulli(0.5);
  }
  CHECK(flipped > 900);
  CHECK(flipped < 1100);
}

TEST_CASE("Transforms: bad inputs name the transform, the field and the shape", "[data][transforms]") {
  SampleRandom rng(1, 0, 0);
  Example f{{"image", Tensor<float>::zeros({2, 2})}};
  CHECK_THROWS_AS(ToFloat{}(f, rng), DTypeError);
  CHECK_THROWS_AS((RandomCrop{2, 2, 0}(f, rng)), ShapeError);
  CHECK_THAT(message_of([&] { RandomCrop{2, 2, 0}(f, rng); }), Contains("RandomCrop") && Contains("[2, 2]"));
  Example chw{{"image", Tensor<float>::zeros({1, 4, 4})}};
  CHECK_THROWS_AS((RandomCrop{7, 7, 1}(chw, rng)), ValueError);
  CHECK_THAT(message_of([&] { RandomCrop{7, 7, 1}(chw, rng); }), Contains("7x7 window with padding 1 does not fit"));
  CHECK_THROWS_AS((Normalize{{0, 0, 0}, {1, 1, 1}}(chw, rng)), ValueError);
  CHECK_THROWS_AS((Normalize{{0}, {0}}(chw, rng)), ValueError);
  CHECK_THROWS_AS(ToFloat{.field = "pixels"}(chw, rng), ValueError);
}

TEST_CASE("SampleRandom: keyed by (seed, epoch, index), uniform between 0 and 1", "[data][random]") {
  SampleRandom a(1, 2, 3), b(1, 2, 3), c(1, 2, 4), d(1, 3, 3), e(2, 2, 3);
  const uint64_t x = a.next_u64();
  CHECK(x == b.next_u64());
  CHECK(x != c.next_u64());
  CHECK(x != d.next_u64());
  CHECK(x != e.next_u64());
  double lo = 1, hi = 0, sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = a.uniform();
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(sum / 10000 == Approx(0.5).margin(0.02));
  for (int i = 0; i < 1000; ++i) {
    const int64_t r = a.randint(-2, 2);
    CHECK((r >= -2 && r <= 2));
  }
}
