#pragma once
// dist::DataParallel: torch DistributedDataParallel for ember. Every rank holds a replica of the
// module, runs forward and backward on its own slice of the batch, and the wrapper averages the
// gradients over the ranks during backward, so that after backward every replica holds the
// gradient of the whole batch (for a loss that is a mean over samples and equal slices).
//
//   auto dp = dist::DataParallel(model, group);   // checks the replicas agree, broadcasts rank 0's
//   auto loss = loss_fn(dp(x_slice), y_slice);
//   loss.backward();                              // all-reduces (Avg) overlap with the backward
//   opt.step();                                   // every rank takes the same step
//
// How (as torch's Reducer):
// - At construction the ranks first compare the settings that change numerics
//   (DataParallelOptions::same_settings, dist/same_settings.hpp: a warning from rank 0 by
//   default). Then the parameter names, shapes and dtypes of every rank are compared (each
//   rank's fingerprints are all-gathered); a mismatch is a DistributedError on every rank that
//   names the first differing parameter and the ranks. Then rank 0's parameters and buffers are
//   broadcast to all ranks.
// - Gradients are grouped into buckets: parameters in reverse registration order (roughly the
//   order backward produces their gradients), the first bucket capped at first_bucket_bytes
//   (1 MiB), the others at bucket_cap_bytes (25 MiB); a bucket holds one dtype.
// - A gradient-ready hook per parameter marks it ready; when the last gradient of a bucket is
//   ready, the bucket's gradients are copied into its flat buffer and an asynchronous all_reduce
//   (Avg) starts while backward goes on. A callback queued with autograd::queue_callback waits for
//   every bucket at the end of backward and copies the averages back into each .grad.
// - With gradient_as_bucket_view, backward writes the gradients straight into the flat buffers
//   (AnyTensor::set_grad_destination) and .grad stays a view of them: nothing is copied.
// - Reduction dtype: each bucket is all-reduced in the gradients' own dtype (fp16/bf16 gradients
//   in fp16/bf16; the backend may accumulate wider: ThreadProcessGroup in double).
// - Unused parameters (torch's find_unused_parameters, always on): a parameter whose hook did
//   not fire in a synchronised backward contributes its current .grad (what no_sync() backward
//   passes accumulated) or zeros when it has none; after the backward it holds the average, a
//   zero tensor when no rank produced a gradient for it (torch leaves None there: an optimizer
//   with momentum or weight decay will still move such a parameter).
// - no_sync(): an RAII guard during which the hooks do nothing, so gradients accumulate locally;
//   the next backward outside the guard reduces the accumulated gradients.
// - Recomputation (nn::recompute): parameters inside a recomputed segment get their gradients in a
//   nested backward pass, whose end also runs the queued callback. If at that point a parameter
//   still lacks its gradient, the wrapper cannot tell "unused" from "comes later in the outer
//   pass": it reduces then, and when a later hook fires in the same outer pass it reduces again
//   at the end of that pass (already-averaged gradients are identical on every rank, so their
//   average is unchanged; it costs a second round of communication).
// - A gradient that arrives again after its bucket was sent (a parameter used both inside and
//   outside a recomputed segment) marks the bucket for a second all_reduce at the end.
//   With gradient_as_bucket_view that is an error instead, raised before the second gradient
//   touches the bucket: while a bucket's all_reduce is in flight its views are taken off the
//   parameters (.grad reads as undefined until the end of backward), so that a second arrival
//   asks for a gradient destination and gets the error there, rather than adding into a buffer the
//   other ranks are reading (and the group is writing the average into).
// - Every rank must run the same sequence of backward passes (same graph shape): collectives are
//   matched by order. A rank that diverges or stops makes the others raise DistributedError when
//   ProcessGroupOptions::timeout passes (thrown out of backward()).
#include <functional>
#include <memory>
#include <sstream>
#include <unordered_set>

#include "ember/amp/grad_scaler.hpp"
#include "ember/autograd/engine.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/dist/same_settings.hpp"
#include "ember/nn/module.hpp"
#include "ember/optim/optimizer.hpp"

namespace ember::dist {

struct DataParallelOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_bytes = size_t{1} << 20;
  bool broadcast_from_rank0 = true;  // parameters and buffers at construction
  // torch's gradient_as_bucket_view: each .grad is a view into its bucket's buffer (backward puts
  // a missing gradient there: AnyTensor::set_grad_destination, and accumulates into it), so the
  // buffer that is all-reduced needs no filling and .grad holds the average afterwards: two fewer
  // passes over every gradient per step (the copy into the bucket, the copy back).
  // Caveats, as in torch: a .grad kept across steps is overwritten by the next backward, and a
  // parameter whose gradient arrives twice in one backward (used both inside and outside a
  // recomputed segment) is an error (a ValueError raised before the second gradient is added
  // into the bucket, which the other ranks may be reading). While a bucket's all_reduce is in
  // flight during backward, its parameters' .grad reads as undefined (the buffer is being
  // reduced); at the end of backward .grad is the view again, holding the average.
  bool gradient_as_bucket_view = false;
  // At construction the ranks compare the settings that change numerics (ember's version, thread
  // counts, the BLAS kernel, OPENBLAS_CORETYPE, OMP_NUM_THREADS, ...: dist/same_settings.hpp):
  // rank 0 warns when they disagree (default), or every rank throws DistributedError
  // (SettingsCheck::Error, or EMBER_REQUIRE_SAME_SETTINGS=1). One all_gather; Off skips it.
  SameSettingsOptions same_settings;
};

namespace dp_detail {
inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}
inline std::string param_desc(const std::string& name, const AnyTensor& p) {
  return name + " " + dtype_name(p.dtype()) + p.shape().str();
}
}  // namespace dp_detail

class DataParallel {
  struct State;

 public:
  DataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group, DataParallelOptions options = {})
      : module_(std::move(module)), group_(group), state_(std::make_shared<State>()) {
    EMBER_CHECK(module_ != nullptr, ValueError, "DataParallel: null module");
    state_->group = &group_;
    check_same_settings(group_, "DataParallel", options.same_settings);
    auto named = module_->named_parameters();
    check_replicas(named, group_);
    state_->as_view = options.gradient_as_bucket_view;
    if (options.broadcast_from_rank0) broadcast_module_state(*module_, group_);
    // Buckets over the parameters that require grad, in reverse registration order.
    State& st = *state_;
    for (auto it = named.rbegin(); it != named.rend(); ++it)
      if (it->second.requires_grad()) {
        st.params.push_back(it->second);
        st.names.push_back(it->first);
      }
    st.ready.assign(st.params.size(), false);
    st.parked.assign(st.params.size(), false);
    st.bucket_of.assign(st.params.size(), 0);
    for (size_t i = 0; i < st.params.size(); ++i) {
      const AnyTensor& p = st.params[i];
      const size_t bytes = p.nbytes();
      // The open bucket is the first one while there is at most one.
      const size_t cap = st.buckets.size() <= 1 ? options.first_bucket_bytes : options.bucket_cap_bytes;
      if (st.buckets.empty() || st.buckets.back().dtype != p.dtype() || st.buckets.back().device != p.device() ||
          (st.buckets.back().bytes > 0 && st.buckets.back().bytes + bytes > cap)) {
        Bucket b;
        b.dtype = p.dtype();
        b.device = p.device();
        st.buckets.push_back(std::move(b));
      }
      Bucket& b = st.buckets.back();
      b.params.push_back(i);
      b.offsets.push_back(b.numel);
      b.numel += p.numel();
      b.bytes += bytes;
      st.bucket_of[i] = st.buckets.size() - 1;
    }
    for (Bucket& b : st.buckets) {
      b.flat = AnyTensor::zeros(Shape{b.numel}, b.dtype, b.device);
      b.pending = static_cast<int>(b.params.size());
    }
    std::weak_ptr<State> weak = state_;
    for (size_t i = 0; i < st.params.size(); ++i)
      st.params[i].register_grad_ready_hook([weak, i](const AnyTensor&) {
        if (auto s = weak.lock()) s->on_ready(i, s);
      });
    // gradient_as_bucket_view: backward writes a parameter's first gradient of a step straight into
    // its slice of the bucket (and accumulates there afterwards, until the bucket is sent).
    if (st.as_view)
      for (Bucket& b : st.buckets)
        for (size_t k = 0; k < b.params.size(); ++k) {
          const size_t bucket = static_cast<size_t>(&b - st.buckets.data());
          st.params[b.params[k]].set_grad_destination([weak, bucket, k]() -> AnyTensor {
            auto s = weak.lock();
            return s ? s->destination(s->buckets[bucket], k) : AnyTensor();
          });
        }
  }

  ~DataParallel() {
    if (state_->as_view) {
      state_->unpark_all();  // a backward that failed elsewhere: .grad is the view again
      for (AnyTensor& p : state_->params) p.set_grad_destination({});
    }
  }

  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& group() { return group_; }
  // Number of gradient buckets and the parameter names of bucket i (reverse registration order).
  size_t bucket_count() const { return state_->buckets.size(); }
  // Bucket i's flat buffer (what its all_reduce moves; with gradient_as_bucket_view, the .grad
  // tensors are views into it).
  const AnyTensor& bucket_buffer(size_t i) const { return state_->buckets.at(i).flat; }
  std::vector<std::string> bucket_parameter_names(size_t i) const {
    std::vector<std::string> out;
    for (size_t p : state_->buckets.at(i).params) out.push_back(state_->names[p]);
    return out;
  }

  AnyTensor forward_any(const AnyTensor& x) { return module_->forward_any(x); }
  template <Element T>
  Tensor<T> operator()(const Tensor<T>& x) {
    return Tensor<T>(module_->forward_any(x));
  }
  AnyTensor operator()(const AnyTensor& x) { return module_->forward_any(x); }

  // While the guard lives, backward passes only accumulate gradients locally.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& dp) : state_(dp.state_), prev_(dp.state_->sync) { state_->sync = false; }
    ~NoSyncGuard() { state_->sync = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    std::shared_ptr<State> state_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool require_backward_grad_sync() const { return state_->sync; }

 private:
  struct Bucket {
    DType dtype{};
    Device device = Device::cpu();
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    int64_t numel = 0;
    size_t bytes = 0;
    AnyTensor flat;
    int pending = 0;
    bool launched = false, dirty = false;
    std::shared_ptr<Work> work;
    int64_t launch_ns = 0;  // for the profiler: when the all_reduce started
    bool timed = false;     // its interval has been reported
  };

  struct State {
    ProcessGroup* group = nullptr;
    std::vector<AnyTensor> params;
    std::vector<std::string> names;
    std::vector<bool> ready;
    // gradient_as_bucket_view: the parameter's .grad (its view) is taken off it while its bucket's
    // all_reduce is in flight (see unpark), so that a second arrival comes to destination().
    std::vector<bool> parked;
    std::vector<size_t> bucket_of;
    std::vector<Bucket> buckets;
    bool sync = true;
    bool as_view = false;                          // DataParallelOptions::gradient_as_bucket_view
    std::unordered_set<const void*> queued_lists;  // backward passes holding our callback

    AnyTensor view(Bucket& b, size_t k) {
      const AnyTensor& p = params[b.params[k]];
      return b.flat.slice(b.offsets[k], b.offsets[k] + p.numel()).reshape(p.shape());
    }
    bool grad_is_view(Bucket& b, size_t k) {
      const AnyTensor g = params[b.params[k]].grad();
      return g.defined() && g.numel() > 0 && g.data_ptr() == view(b, k).data_ptr();
    }
    void fill_flat(Bucket& b) {
      NoGradGuard no_grad;
      for (size_t k = 0; k < b.params.size(); ++k) {
        const AnyTensor& p = params[b.params[k]];
        AnyTensor v = view(b, k);
        AnyTensor g = p.grad();
        if (v.numel() == 0 || grad_is_view(b, k)) continue;  // already in place
        if (g.defined())
          v.copy_(g.dtype() == b.dtype ? g : g.to(b.dtype));
        else
          v.backend().fill(b.dtype, v.data_ptr(), v.numel(), 0.0);
      }
    }
    // The gradient destination of b's k-th parameter (gradient_as_bucket_view): its view, or, when
    // the parameter's gradient already went out with its bucket in this backward, the error. It is
    // asked before anything is written, so the bucket the other ranks are reducing stays intact.
    AnyTensor destination(Bucket& b, size_t k) {
      const size_t i = b.params[k];
      if (parked[i]) {
        reset();
        throw ValueError(::ember::detail::str_cat(
            "DataParallel (gradient_as_bucket_view): the gradient of ", names[i],
            " arrived a second time in one backward, after its bucket's all_reduce had started (it was not "
            "accumulated: the buffer is being reduced, and the rank's gradient for this step is incomplete). Use "
            "gradient_as_bucket_view = false for models that use a parameter both inside and outside a "
            "recomputed segment (nn::recompute)."));
      }
      return view(b, k);
    }
    // While b's all_reduce is in flight, its parameters whose .grad is their view hold no .grad:
    // backward then asks destination() for a second arrival instead of adding into the buffer
    // being reduced, and nothing reads the view while the group writes the average there.
    void park(Bucket& b) {
      if (!as_view) return;
      for (size_t k = 0; k < b.params.size(); ++k)
        if (grad_is_view(b, k)) {
          params[b.params[k]].set_grad(AnyTensor());
          parked[b.params[k]] = true;
        }
    }
    // Puts the views back as .grad (once the all_reduce has finished, or on an error).
    void unpark(Bucket& b) {
      for (size_t k = 0; k < b.params.size(); ++k)
        if (parked[b.params[k]]) {
          params[b.params[k]].set_grad(view(b, k));
          parked[b.params[k]] = false;
        }
    }
    void unpark_all() {
      for (Bucket& b : buckets) unpark(b);
    }
    void launch(Bucket& b) {
      fill_flat(b);
      b.launched = true;
      b.timed = false;
      b.launch_ns = trace::now_ns();
      b.work = group->all_reduce_async(b.flat, ReduceOp::Avg);
      park(b);
    }
    // Reports a finished all_reduce to the profiler, from its launch to when it was seen done
    // (a poll during backward or the wait at its end): the total communication time, of which the
    // Communication phase around the waits is the part not hidden behind backward.
    static void report_done(Bucket& b) {
      if (b.timed) return;
      b.timed = true;
      trace::interval(trace::Phase::Communication, "all_reduce", b.launch_ns, trace::now_ns());
    }
    void reset() {
      unpark_all();
      ready.assign(ready.size(), false);
      for (Bucket& b : buckets) {
        b.pending = static_cast<int>(b.params.size());
        b.launched = b.dirty = false;
        b.work.reset();
      }
    }

    void on_ready(size_t i, const std::shared_ptr<State>& self) {
      if (!sync) return;
      const void* list = autograd::detail::current_backward_callbacks();
      if (list != nullptr && queued_lists.insert(list).second) {
        std::weak_ptr<State> weak = self;
        autograd::queue_callback([weak, list] {
          if (auto s = weak.lock()) s->on_backward_end(list);
        });
      }
      // Poll the all-reduces in flight. MpiProcessGroup's communication thread runs them anyway; for
      // a group without one (MpiOptions::comm_thread = false, or an MPI without
      // MPI_THREAD_MULTIPLE) these polls are the only MPI calls during backward, without which a
      // bucket's reduction would wait for the end of backward.
      for (Bucket& other : buckets)
        if (other.launched && other.work && other.work->is_completed()) report_done(other);
      Bucket& b = buckets[bucket_of[i]];
      if (ready[i]) {
        // Again after its bucket was sent: reduced a second time at the end. (A gradient that is
        // its bucket's view never gets here: destination() raised the error before it was added.)
        if (b.launched) b.dirty = true;
        return;
      }
      ready[i] = true;
      if (--b.pending == 0) {
        try {
          launch(b);
        } catch (...) {
          reset();
          throw;
        }
      }
    }

    void on_backward_end(const void* list) {
      queued_lists.erase(list);
      if (!queued_lists.empty()) return;  // an enclosing pass holds our callback: finish there
      try {
        finalize();
      } catch (...) {
        reset();
        throw;
      }
      reset();
    }

    void finalize() {
      NoGradGuard no_grad;
      for (Bucket& b : buckets)
        if (!b.launched) launch(b);
      for (Bucket& b : buckets) {
        {
          trace::PhaseScope exposed(trace::Phase::Communication);  // the training thread waits
          b.work->wait();
          report_done(b);
          unpark(b);  // before fill_flat: the views are the gradients
          if (b.dirty) {
            const int64_t t0 = trace::now_ns();
            fill_flat(b);
            group->all_reduce(b.flat, ReduceOp::Avg);
            trace::interval(trace::Phase::Communication, "all_reduce", t0, trace::now_ns());
          }
        }
        for (size_t k = 0; k < b.params.size(); ++k) {
          AnyTensor& p = params[b.params[k]];
          AnyTensor v = view(b, k);
          AnyTensor g = p.grad();
          if (as_view) {
            if (!grad_is_view(b, k) && v.numel() > 0) p.set_grad(v);  // the average is in the view
            continue;
          }
          if (g.defined() && g.dtype() == b.dtype) {
            g.copy_(v);
          } else if (g.defined()) {
            g.copy_(v.to(g.dtype()));
          } else {
            p.set_grad(v.detach().clone());
          }
        }
      }
    }
  };

 public:
  // Every rank's parameters and buffers become rank 0's (in place).
  static void broadcast_module_state(nn::Module& module, ProcessGroup& g) {
    NoGradGuard no_grad;
    for (auto& [n, p] : module.named_parameters()) {
      AnyTensor t = p.detach();
      g.broadcast(t, 0);
    }
    for (auto& [n, b] : module.named_buffers()) {
      AnyTensor t = b.detach();
      g.broadcast(t, 0);
    }
  }

  // All-gathers per-parameter fingerprints and throws on the first difference (`who` names the
  // caller in the error: FullyShardedDataParallel uses it too).
  static void check_replicas(const std::vector<std::pair<std::string, AnyTensor>>& named, ProcessGroup& g,
                             const char* who = "DataParallel") {
    const int world = g.size();
    if (world == 1) return;
    const Device dev = g.device();  // NCCL takes only tensors on its GPU
    AnyTensor count = Tensor<int64_t>::scalar(static_cast<int64_t>(named.size())).reshape({1}).to(dev);
    AnyTensor counts = AnyTensor::zeros(Shape{world}, DType::Int64, dev);
    g.all_gather(counts, count);
    auto cv = Tensor<int64_t>(counts).to_vector();
    const int64_t n = *std::min_element(cv.begin(), cv.end());
    std::vector<int64_t> mine(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const auto& [name, p] = named[static_cast<size_t>(i)];
      mine[static_cast<size_t>(i)] = static_cast<int64_t>(dp_detail::fnv1a(dp_detail::param_desc(name, p)));
    }
    std::vector<int64_t> all_v;
    if (n > 0) {
      AnyTensor local = Tensor<int64_t>::from_vector(mine).to(dev);
      AnyTensor all = AnyTensor::zeros(Shape{n * world}, DType::Int64, dev);
      g.all_gather(all, local);
      all_v = Tensor<int64_t>(all).to_vector();
    }
    for (int64_t i = 0; i < n; ++i)
      for (int r = 1; r < world; ++r)
        if (all_v[static_cast<size_t>(r * n + i)] != all_v[static_cast<size_t>(i)]) {
          const auto& [name, p] = named[static_cast<size_t>(i)];
          std::ostringstream e;
          e << who << ": the model replicas differ: parameter #" << i << " differs between rank 0 and rank "
            << r << " (name, dtype or shape); on rank " << g.rank() << " it is " << dp_detail::param_desc(name, p)
            << ". Every rank must build the same model.";
          throw DistributedError(e.str());
        }
    for (int r = 1; r < world; ++r)
      if (cv[static_cast<size_t>(r)] != cv[0]) {
        std::ostringstream e;
        e << who << ": the model replicas differ: rank 0 has " << cv[0] << " parameters, rank " << r << " has "
          << cv[static_cast<size_t>(r)] << " (the first " << n << " agree)";
        if (static_cast<int64_t>(named.size()) > n)
          e << "; on rank " << g.rank() << " parameter #" << n << " is "
            << dp_detail::param_desc(named[static_cast<size_t>(n)].first, named[static_cast<size_t>(n)].second);
        e << ". Every rank must build the same model.";
        throw DistributedError(e.str());
      }
  }

 private:
  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  std::shared_ptr<State> state_;
};

// Makes a GradScaler's inf/NaN verdict the same on every rank: unscales opt's gradients (as
// scaler.unscale_(opt)) and all-reduces (Max) the found-inf flags, so that scaler.step(opt) skips
// the step, and scaler.update() backs off, on every rank when any rank found an inf/NaN. Call it
// after backward instead of unscale_(opt) (not in addition to it), before scaler.step(opt).
// Returns whether an inf/NaN was found on some rank. A disabled scaler: returns false, no collective.
inline bool sync_found_inf(amp::GradScaler& scaler, optim::Optimizer& opt, ProcessGroup& group) {
  if (!scaler.is_enabled()) return false;
  scaler.unscale_(opt);
  std::vector<AnyTensor> flags = scaler.found_inf_flags(opt);
  uint8_t any = 0;
  for (const AnyTensor& f : flags) {
    uint8_t v = 0;
    f.backend().copy_to_host(&v, f.data_ptr(), 1);
    any = static_cast<uint8_t>(any | (v != 0 ? 1 : 0));
  }
  AnyTensor t = Tensor<uint8_t>::scalar(any).reshape({1}).to(group.device());
  group.all_reduce(t, ReduceOp::Max);
  const uint8_t all = Tensor<uint8_t>(t).to_vector()[0];
  for (AnyTensor& f : flags) f.backend().copy_from_host(f.data_ptr(), &all, 1);
  return all != 0;
}

}  // namespace ember::dist
