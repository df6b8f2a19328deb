#pragma once
// data::DataLoader: batches from a Dataset, loaded by persistent worker threads into a bounded
// prefetch queue and delivered in order.
//
//   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .seed = 1, .num_workers = 2});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (data::Batch& b : loader) train_step(b["image"], b["label"]);
//
// Determinism: epoch e's order is a permutation from Philox keyed by (seed, e) (or the
// DistributedSampler's share), a transform draws from SampleRandom(seed, e, sample index), and
// batches are delivered in order, so every batch is bitwise the same for any num_workers and
// after load_state(). The state is two numbers, (epoch, batches consumed): resuming mid-epoch
// starts loading at the next batch, with no replay.
//
// Threads: num_workers threads live as long as the loader (no start-up stall per epoch). Each
// takes the next batch number within a window of `prefetch * num_workers` batches past the one
// the training thread is waiting for, loads and collates it into that batch's slot of a ring,
// and the training thread takes the slots in order. num_workers = 0 loads on the calling thread.
// An exception while loading (a corrupt record) is kept with its batch and thrown from next() when
// that batch is due, with the dataset, the sample index and the cause in the message; the batch
// is then skipped. Destroying the loader mid-epoch waits for the batches being loaded (one per
// worker) and never for the queue to drain.
//
// With a CUDA device and pin_memory, workers copy each collated batch into a pinned host buffer
// of its slot (a ring allocated once, grown only when a batch is larger), and next() queues the
// upload on the device's copy stream (Backend::upload_async_fresh) into memory allocated in that
// stream's order (allocate_for_upload), so the copy overlaps the step still running on the GPU:
// the step's kernels, queued after it on the compute stream, wait for it by an event, and the
// host never synchronises. A slot's pinned buffer is rewritten only after its previous upload
// finished.
//
// next() records how long the training thread waited (Batch::wait_seconds, wait statistics),
// inside trace::PhaseScope(DataWait); uploads run inside PhaseScope(HostToDevice).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ember/core/backend_registry.hpp"
#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"
#include "ember/core/trace.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/distributed_sampler.hpp"
#include "ember/data/sample_random.hpp"

namespace ember::data {

// A sample transform: gets the example and its random stream, returns the transformed example.
using Transform = std::function<Example(Example, SampleRandom&)>;
// Batch assembly from the batch's examples (in order).
using Collate = std::function<Example(std::vector<Example>&)>;

// The default collate: each field stacked along a new first dimension. Every example must have
// the same fields with the same dtype and shape.
inline Example stack_examples(std::vector<Example>& examples) {
  EMBER_CHECK(!examples.empty(), ValueError, "collate: empty batch");
  const Example& first = examples.front();
  Example out;
  for (const auto& [name, t0] : first.fields()) {
    EMBER_CHECK(t0.device().is_cpu(), DeviceError, "collate: field '", name, "' is on ", t0.device().str(),
                "; examples must be host tensors");
    Shape s;
    s.push_back(static_cast<int64_t>(examples.size()));
    for (int64_t d : t0.shape()) s.push_back(d);
    AnyTensor batch = AnyTensor::empty(s, t0.dtype());
    const size_t bytes = t0.nbytes();
    auto* dst = static_cast<uint8_t*>(batch.data_ptr());
    for (size_t k = 0; k < examples.size(); ++k) {
      const AnyTensor& t = examples[k][name];
      EMBER_CHECK(t.dtype() == t0.dtype() && t.shape() == t0.shape(), ShapeError, "collate: field '", name,
                  "' of batch element ", k, " is ", dtype_name(t.dtype()), " ", t.shape().str(), " but element 0's is ",
                  dtype_name(t0.dtype()), " ", t0.shape().str(), " (use a custom collate for ragged fields)");
      EMBER_CHECK(t.device().is_cpu(), DeviceError, "collate: field '", name, "' is on ", t.device().str());
      if (bytes) std::memcpy(dst + k * bytes, t.data_ptr(), bytes);
    }
    out.set(name, std::move(batch));
  }
  return out;
}

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  int num_workers = 0;
  int prefetch = 2;            // batches per worker that may be loaded ahead (ring size prefetch * max(1, workers))
  bool pin_memory = true;      // with a CUDA device: pinned staging ring and asynchronous uploads
  Device device = Device::cpu();
  std::optional<DistributedSampler> sampler;  // this rank's share instead of the whole dataset
  Transform transform;         // per sample, on the worker
  Collate collate;             // default: stack_examples
};

// A batch: the collated fields (on the loader's device), which samples, and the wait.
struct Batch {
  Example data;
  std::vector<int64_t> indices;  // dataset indices, in batch order
  uint64_t epoch = 0;
  int64_t index = 0;             // batch number within the epoch
  double wait_seconds = 0;       // how long next() waited for it

  const AnyTensor& operator[](const std::string& name) const { return data[name]; }
  template <class T>
  Tensor<T> get(const std::string& name) const {
    return data.get<T>(name);
  }
};

// What a checkpoint stores (data/dataloader_json.hpp converts it to and from JSON).
struct DataLoaderState {
  uint64_t epoch = 0;
  int64_t batches_consumed = 0;  // batches of that epoch already delivered
  uint64_t seed = 0;             // checked on load: another seed would give other batches
  bool operator==(const DataLoaderState&) const = default;
};

namespace detail {
// Rethrows the exception in flight as the same ember kind, with `context` in front of its message.
[[noreturn]] inline void rethrow_with_context(const std::string& context) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    throw OutOfMemory(context + e.what(), e.requested_bytes, e.in_use_bytes, e.limit_bytes);
  } catch (const FormatError& e) {
    throw FormatError(context + e.what());
  } catch (const IOError& e) {
    throw IOError(context + e.what());
  } catch (const IndexError& e) {
    throw IndexError(context + e.what());
  } catch (const ShapeError& e) {
    throw ShapeError(context + e.what());
  } catch (const DTypeError& e) {
    throw DTypeError(context + e.what());
  } catch (const ValueError& e) {
    throw ValueError(context + e.what());
  } catch (const DeviceError& e) {
    throw DeviceError(context + e.what());
  } catch (const std::exception& e) {
    throw Error(context + e.what());
  } catch (...) {
    throw Error(context + "unknown exception");
  }
}
}  // namespace detail

class DataLoader {
 public:
  // The dataset must outlive the loader (shared_ptr overload: the loader keeps it alive).
  DataLoader(const Dataset& dataset, DataLoaderOptions options) : dataset_(&dataset), opt_(std::move(options)) {
    init();
  }
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
      : owned_(std::move(dataset)), dataset_(owned_.get()), opt_(std::move(options)) {
    EMBER_CHECK(dataset_ != nullptr, ValueError, "DataLoader: null dataset");
    init();
  }
  ~DataLoader() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
    if (pinned_backend_) {
      // Uploads may still read the pinned buffers: wait for them before freeing.
      if (last_ticket_) pinned_backend_->wait_upload(last_ticket_);
      for (auto& s : slots_)
        if (s.pinned) pinned_backend_->free_pinned(s.pinned, s.pinned_capacity);
    }
  }
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch.
  int64_t num_batches() const { return num_batches_; }
  int64_t size() const { return num_batches_; }
  const DataLoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return *dataset_; }

  // The next batch of the current epoch, or nullopt at its end (the state then moves to the
  // next epoch, whose first batches the workers start loading at once).
  std::optional<Batch> next() {
    if (consumed_ >= num_batches_) {
      start_epoch(epoch_ + 1, 0);
      return std::nullopt;
    }
    const int64_t b = consumed_;
    Loaded taken;
    const auto t0 = std::chrono::steady_clock::now();
    {
      trace::PhaseScope phase(trace::Phase::DataWait);
      if (workers_.empty()) {
        Slot& s = slots_[static_cast<size_t>(b % ring_)];
        load_into(s, batches_[static_cast<size_t>(b)], epoch_, b);
        taken = std::move(s.result);
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        Slot& s = slots_[static_cast<size_t>(b % ring_)];
        ready_cv_.wait(lock, [&] { return s.ready && s.batch == b; });
        taken = std::move(s.result);
        s.ready = false;
      }
    }
    const double wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    wait_total_ += wait;
    wait_last_ = wait;
    ++wait_count_;

    Batch out;
    std::exception_ptr error = taken.error;
    if (!error) {
      try {
        out.data = deliver(taken, b);
      } catch (...) {
        error = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++consumed_;  // opens the window for batch b + ring_ (its slot's upload is now queued)
    }
    work_cv_.notify_all();
    if (error) std::rethrow_exception(error);
    out.indices = std::move(taken.indices);
    out.epoch = epoch_;
    out.index = b;
    out.wait_seconds = wait;
    return out;
  }

  // Checkpointing: (epoch, batches consumed, seed).
  DataLoaderState state() const { return {epoch_, consumed_, opt_.seed}; }
  void load_state(const DataLoaderState& s) {
    EMBER_CHECK(s.seed == opt_.seed, ValueError, "DataLoader::load_state: the state was saved with seed ", s.seed,
                " but this loader's seed is ", opt_.seed, " (its batches would differ)");
    EMBER_CHECK(s.batches_consumed >= 0 && s.batches_consumed <= num_batches_, ValueError,
                "DataLoader::load_state: batches_consumed ", s.batches_consumed, " is not in [0, ", num_batches_,
                "] (batches per epoch of this loader: dataset, batch size or sampler changed?)");
    start_epoch(s.epoch, s.batches_consumed);
  }
  // Starts epoch e from its first batch (what load_state({e, 0, seed}) does).
  void set_epoch(uint64_t e) { start_epoch(e, 0); }
  uint64_t epoch() const { return epoch_; }

  // Time the training thread spent waiting in next().
  double last_wait_seconds() const { return wait_last_; }
  double total_wait_seconds() const { return wait_total_; }
  int64_t num_waits() const { return wait_count_; }
  void reset_wait_stats() { wait_total_ = wait_last_ = 0, wait_count_ = 0; }

  // Range-for over the rest of the current epoch.
  class Iterator {
   public:
    using value_type = Batch;
    Iterator() = default;
    explicit Iterator(DataLoader* l) : loader_(l) { ++*this; }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      if (!current_) loader_ = nullptr;
      return *this;
    }
    bool operator==(const Iterator& o) const { return loader_ == o.loader_; }
    bool operator!=(const Iterator& o) const { return loader_ != o.loader_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  Iterator begin() { return Iterator(this); }
  Iterator end() { return Iterator(); }

 private:
  struct Loaded {
    Example data;                  // collated on the host
    std::vector<int64_t> indices;
    std::exception_ptr error;
    bool pinned = false;           // data also copied into the slot's pinned buffer
  };
  struct Slot {
    int64_t batch = -1;
    bool ready = false;
    Loaded result;
    void* pinned = nullptr;        // pinned staging (CUDA device with pin_memory)
    size_t pinned_capacity = 0;
    uint64_t upload_ticket = 0;    // the last upload from `pinned`
  };

  void init() {
    EMBER_CHECK(opt_.batch_size >= 1, ValueError, "DataLoader: batch_size must be >= 1, got ", opt_.batch_size);
    EMBER_CHECK(opt_.num_workers >= 0, ValueError, "DataLoader: num_workers must be >= 0, got ", opt_.num_workers);
    EMBER_CHECK(opt_.prefetch >= 1, ValueError, "DataLoader: prefetch must be >= 1, got ", opt_.prefetch);
    EMBER_CHECK(!(opt_.shuffle && opt_.sampler), ValueError,
                "DataLoader: shuffle and sampler are exclusive (the DistributedSampler shuffles: set its shuffle)");
    (void)backend_for(opt_.device);  // a device that does not exist fails here, not in a worker
    const int64_t n = opt_.sampler ? opt_.sampler->num_samples() : dataset_->size();
    num_batches_ = opt_.drop_last ? n / opt_.batch_size : (n + opt_.batch_size - 1) / opt_.batch_size;
    ring_ = static_cast<int64_t>(opt_.prefetch) * std::max(1, opt_.num_workers);
    slots_.resize(static_cast<size_t>(ring_));
    if (opt_.device.is_cuda() && opt_.pin_memory) pinned_backend_ = &backend_for(opt_.device);
    plan(0);
    for (int w = 0; w < opt_.num_workers; ++w) workers_.emplace_back([this] { worker_loop(); });
  }

  // The batches' indices for epoch e.
  void plan(uint64_t e) {
    std::vector<int64_t> order;
    if (opt_.sampler) {
      opt_.sampler->set_epoch(e);
      order = opt_.sampler->indices();
      for (int64_t i : order)
        EMBER_CHECK(i >= 0 && i < dataset_->size(), IndexError, "DataLoader: the sampler gives index ", i, " but ",
                    dataset_->name(), " has ", dataset_->size(), " samples");
    } else if (opt_.shuffle) {
      order = epoch_permutation(dataset_->size(), opt_.seed, e);
    } else {
      order.resize(static_cast<size_t>(dataset_->size()));
      for (int64_t i = 0; i < dataset_->size(); ++i) order[static_cast<size_t>(i)] = i;
    }
    batches_.assign(static_cast<size_t>(num_batches_), {});
    for (int64_t b = 0; b < num_batches_; ++b) {
      const int64_t lo = b * opt_.batch_size;
      const int64_t hi = std::min<int64_t>(lo + opt_.batch_size, static_cast<int64_t>(order.size()));
      batches_[static_cast<size_t>(b)].assign(order.begin() + lo, order.begin() + hi);
    }
  }

  // Restarts the pipeline at (e, consumed): waits for the batches being loaded, drops the rest.
  void start_epoch(uint64_t e, int64_t consumed) {
    std::unique_lock<std::mutex> lock(mu_);
    ++generation_;
    idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
    for (auto& s : slots_) {
      s.ready = false;
      s.batch = -1;
      s.result = Loaded{};
    }
    epoch_ = e;
    plan(e);
    consumed_ = consumed;
    next_load_ = consumed;
    lock.unlock();
    work_cv_.notify_all();
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || (next_load_ < num_batches_ && next_load_ < consumed_ + ring_); });
      if (stop_) return;
      const int64_t b = next_load_++;
      const uint64_t gen = generation_;
      const uint64_t e = epoch_;
      std::vector<int64_t> indices = batches_[static_cast<size_t>(b)];
      Slot& s = slots_[static_cast<size_t>(b % ring_)];
      ++in_flight_;
      lock.unlock();
      load_into(s, indices, e, b);  // only this worker touches s until it is marked ready
      lock.lock();
      --in_flight_;
      if (gen == generation_) {
        s.batch = b;
        s.ready = true;
        ready_cv_.notify_all();
      }
      if (in_flight_ == 0) idle_cv_.notify_all();
    }
  }

  // Loads, transforms and collates batch b into s.result (and s.pinned); exceptions are kept.
  void load_into(Slot& s, const std::vector<int64_t>& indices, uint64_t e, int64_t b) {
    Loaded r;
    r.indices = indices;
    try {
      std::vector<Example> examples;
      examples.reserve(indices.size());
      for (int64_t i : indices) {
        try {
          Example ex = dataset_->get(i);
          if (opt_.transform) {
            SampleRandom rng(opt_.seed, e, i);
            ex = opt_.transform(std::move(ex), rng);
          }
          examples.push_back(std::move(ex));
        } catch (...) {
          detail::rethrow_with_context(::ember::detail::str_cat("DataLoader: ", dataset_->name(), " index ", i,
                                                                " (batch ", b, " of epoch ", e, "): "));
        }
      }
      try {
        r.data = opt_.collate ? opt_.collate(examples) : stack_examples(examples);
      } catch (...) {
        detail::rethrow_with_context(::ember::detail::str_cat("DataLoader: ", dataset_->name(), " collate of batch ", b,
                                                              " of epoch ", e, ": "));
      }
      if (pinned_backend_) {
        // The slot's previous upload must be done before its pinned buffer is rewritten.
        if (s.upload_ticket) pinned_backend_->wait_upload(s.upload_ticket);
        size_t total = 0;
        for (const auto& f : r.data.fields()) total += align(f.second.nbytes());
        if (total > s.pinned_capacity) {
          if (s.pinned) pinned_backend_->free_pinned(s.pinned, s.pinned_capacity);
          s.pinned = nullptr;
          s.pinned_capacity = 0;
          s.pinned = pinned_backend_->allocate_pinned(total);
          s.pinned_capacity = total;
        }
        size_t off = 0;
        for (const auto& f : r.data.fields()) {
          EMBER_CHECK(f.second.device().is_cpu(), DeviceError, "DataLoader: collate returned field '", f.first,
                      "' on ", f.second.device().str(), "; it must return host tensors");
          if (f.second.nbytes()) std::memcpy(static_cast<uint8_t*>(s.pinned) + off, f.second.data_ptr(), f.second.nbytes());
          off += align(f.second.nbytes());
        }
        r.pinned = true;
      }
    } catch (...) {
      r.error = std::current_exception();
    }
    s.result = std::move(r);
  }

  static size_t align(size_t bytes) { return (bytes + 255) / 256 * 256; }

  // An uninitialised device tensor shaped as t in memory from Backend::allocate_for_upload (on
  // CUDA in the copy stream's order, so that the upload need not wait for the step in flight),
  // freed as any device tensor.
  AnyTensor upload_destination(const AnyTensor& t) const {
    const Device dev = opt_.device;
    Backend* b = pinned_backend_;
    return AnyTensor::empty_from(
        t.shape(), t.dtype(), dev, [b](size_t bytes) { return b->allocate_for_upload(bytes); },
        [dev](void* q, size_t n) { backend_for(dev).deallocate(q, n); }, "DataLoader upload");
  }

  // The batch as the caller gets it: on the host, or uploaded to the device.
  Example deliver(const Loaded& r, int64_t b) {
    if (opt_.device.is_cpu()) return r.data;
    trace::PhaseScope phase(trace::Phase::HostToDevice);
    Example out;
    if (r.pinned) {
      Slot& s = slots_[static_cast<size_t>(b % ring_)];
      size_t off = 0;
      uint64_t ticket = 0;
      for (const auto& [name, t] : r.data.fields()) {
        AnyTensor d = upload_destination(t);
        ticket = pinned_backend_->upload_async_fresh(d.data_ptr(), static_cast<const uint8_t*>(s.pinned) + off,
                                                     t.nbytes());
        off += align(t.nbytes());
        out.set(name, std::move(d));
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (ticket) s.upload_ticket = last_ticket_ = ticket;
    } else {
      for (const auto& [name, t] : r.data.fields()) out.set(name, t.to(opt_.device));
    }
    return out;
  }

  std::shared_ptr<const Dataset> owned_;
  const Dataset* dataset_;
  DataLoaderOptions opt_;
  int64_t num_batches_ = 0;
  int64_t ring_ = 1;
  Backend* pinned_backend_ = nullptr;

  // Guarded by mu_ (the training thread also reads epoch_/consumed_ without it: only it writes them).
  std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_, idle_cv_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int64_t>> batches_;
  uint64_t epoch_ = 0;
  int64_t consumed_ = 0;
  int64_t next_load_ = 0;
  uint64_t generation_ = 0;
  int in_flight_ = 0;
  bool stop_ = false;
  uint64_t last_ticket_ = 0;
  std::vector<std::thread> workers_;

  double wait_total_ = 0, wait_last_ = 0;
  int64_t wait_count_ = 0;
};

}  // namespace ember::data
