#pragma once
// dist::ThreadProcessGroup: N ranks as N threads of one process. The ranks share a rendezvous
// object; the k-th collective of every rank meets the k-th collective of the others there, and
// the last rank to arrive does the reduction for all of them (CPU tensors only, every dtype).
//
//   auto groups = dist::ThreadProcessGroup::create(3);         // one group per rank
//   std::vector<std::thread> ts;
//   for (int r = 0; r < 3; ++r) ts.emplace_back([&, r] { train(*groups[r]); });
//
// Asynchronous calls return a Work that completes when every rank has arrived; wait() throws
// ember::DistributedError when ProcessGroupOptions::timeout passes first (counted from the call
// that issued the collective), naming the ranks that never arrived: a rank that stops
// participating is an error on the others, not a hang. A mismatch between ranks (another kind of
// collective, another element count or dtype, another root) is a DistributedError on every rank.
//
// Each rank's group is used by one thread at a time (its rank's), as a process's MPI group would
// be by that process; collectives are matched by their order on each rank. In-place all_gather
// (the input a chunk of the output) is allowed.
//
// Reductions accumulate in double (floating types) or int64 (integer types) in rank order, so
// every rank gets bit-identical results; Avg divides the sum by the world size (integer Avg
// truncates toward zero). Meant for tests of data-parallel code and for in-process data
// parallelism on the CPU (for several processes or machines use MpiProcessGroup, or NCCL on GPUs).
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "ember/core/error.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist {

namespace thread_group_detail {

enum class Kind : uint8_t { AllReduce, Broadcast, ReduceScatter, AllGather, Barrier };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllGather: return "all_gather";
    case Kind::Barrier: return "barrier";
  }
  return "?";
}

// One collective in flight: what each rank brought, and whether it is done.
struct Op {
  Kind kind{};
  ReduceOp reduce{};
  int root = 0;
  DType dtype{};
  int64_t in_numel = 0, out_numel = 0;
  std::vector<AnyTensor> in, out;  // per rank (handles share the callers' storage)
  std::vector<bool> arrived;
  int count = 0;
  bool done = false;
  std::string error;  // set when the ranks disagree
};

template <class T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

template <class T>
void reduce_into(T* dst, const std::vector<const T*>& srcs, int64_t n, ReduceOp op) {
  using A = acc_t<T>;
  const int world = static_cast<int>(srcs.size());
  for (int64_t i = 0; i < n; ++i) {
    A a = static_cast<A>(static_cast<compute_t<T>>(srcs[0][i]));
    for (int r = 1; r < world; ++r) {
      const A v = static_cast<A>(static_cast<compute_t<T>>(srcs[static_cast<size_t>(r)][i]));
      if (op == ReduceOp::Max) {
        if (v > a || v != v) a = v;  // NaN wins, as an inf/NaN flag must
      } else {
        a += v;
      }
    }
    if (op == ReduceOp::Avg) a = a / static_cast<A>(world);
    dst[i] = static_cast<T>(static_cast<compute_t<T>>(a));
  }
}

// Runs under the rendezvous lock once every rank has arrived.
inline void execute(Op& op) {
  const int world = static_cast<int>(op.in.size());
  switch (op.kind) {
    case Kind::Barrier: return;
    case Kind::Broadcast: {
      const AnyTensor& src = op.in[static_cast<size_t>(op.root)];
      for (int r = 0; r < world; ++r)
        if (r != op.root && src.nbytes() > 0) std::memcpy(op.out[r].data_ptr(), src.data_ptr(), src.nbytes());
      return;
    }
    case Kind::AllGather: {
      const size_t chunk = op.in[0].nbytes();
      for (int r = 0; r < world; ++r)
        for (int s = 0; s < world; ++s)
          if (chunk > 0)
            std::memmove(static_cast<char*>(op.out[r].data_ptr()) + chunk * static_cast<size_t>(s),
                        op.in[static_cast<size_t>(s)].data_ptr(), chunk);
      return;
    }
    case Kind::AllReduce:
    case Kind::ReduceScatter: {
      dispatch_dtype(op.dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t n = op.out_numel;
        if (n == 0) return;
        std::vector<T> result(static_cast<size_t>(n) * (op.kind == Kind::AllReduce ? 1 : world));
        if (op.kind == Kind::AllReduce) {
          std::vector<const T*> srcs;
          for (auto& t : op.in) srcs.push_back(static_cast<const T*>(t.data_ptr()));
          reduce_into(result.data(), srcs, n, op.reduce);
          for (auto& t : op.out) std::memcpy(t.data_ptr(), result.data(), sizeof(T) * static_cast<size_t>(n));
        } else {
          for (int r = 0; r < world; ++r) {
            std::vector<const T*> srcs;
            for (auto& t : op.in) srcs.push_back(static_cast<const T*>(t.data_ptr()) + n * r);
            reduce_into(result.data() + n * r, srcs, n, op.reduce);
          }
          for (int r = 0; r < world; ++r)
            std::memcpy(op.out[static_cast<size_t>(r)].data_ptr(), result.data() + n * r,
                        sizeof(T) * static_cast<size_t>(n));
        }
      });
      return;
    }
  }
}

struct Rendezvous {
  explicit Rendezvous(int n) : world(n) {}
  const int world;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<Op>> pending;
};

}  // namespace thread_group_detail

class ThreadProcessGroup : public ProcessGroup {
 public:
  // One group per rank (index = rank), all sharing one rendezvous.
  static std::vector<std::shared_ptr<ThreadProcessGroup>> create(int world_size, ProcessGroupOptions options = {}) {
    EMBER_CHECK(world_size >= 1, ValueError, "ThreadProcessGroup::create: world size must be >= 1, got ", world_size);
    auto rv = std::make_shared<thread_group_detail::Rendezvous>(world_size);
    std::vector<std::shared_ptr<ThreadProcessGroup>> out;
    for (int r = 0; r < world_size; ++r)
      out.push_back(std::shared_ptr<ThreadProcessGroup>(new ThreadProcessGroup(rv, r, options)));
    return out;
  }

  int rank() const override { return rank_; }
  int size() const override { return rv_->world; }
  std::string backend_name() const override { return "thread"; }
  const ProcessGroupOptions& options() const { return options_; }
  void set_timeout(std::chrono::milliseconds t) { options_.timeout = t; }

  std::shared_ptr<Work> all_reduce_async(AnyTensor& t, ReduceOp op = ReduceOp::Sum) override {
    check_cpu(t, "all_reduce");
    return arrive(thread_group_detail::Kind::AllReduce, op, 0, t, t, t.numel(), t.numel());
  }
  std::shared_ptr<Work> broadcast_async(AnyTensor& t, int root = 0) override {
    check_cpu(t, "broadcast");
    EMBER_CHECK(root >= 0 && root < size(), ValueError, "ThreadProcessGroup.broadcast: root ", root,
                " is not a rank of a group of ", size());
    return arrive(thread_group_detail::Kind::Broadcast, ReduceOp::Sum, root, t, t, t.numel(), t.numel());
  }
  std::shared_ptr<Work> reduce_scatter_async(AnyTensor& output, const AnyTensor& input,
                                             ReduceOp op = ReduceOp::Sum) override {
    check_cpu(output, "reduce_scatter");
    check_cpu(input, "reduce_scatter");
    EMBER_CHECK(input.numel() == output.numel() * size() && input.dtype() == output.dtype(), ShapeError,
                "ThreadProcessGroup.reduce_scatter: input ", input.desc(), " must have ", size(),
                " x output's elements and its dtype (output ", output.desc(), ")");
    return arrive(thread_group_detail::Kind::ReduceScatter, op, 0, input, output, input.numel(), output.numel());
  }
  std::shared_ptr<Work> all_gather_async(AnyTensor& output, const AnyTensor& input) override {
    check_cpu(output, "all_gather");
    check_cpu(input, "all_gather");
    EMBER_CHECK(output.numel() == input.numel() * size() && input.dtype() == output.dtype(), ShapeError,
                "ThreadProcessGroup.all_gather: output ", output.desc(), " must have ", size(),
                " x input's elements and its dtype (input ", input.desc(), ")");
    return arrive(thread_group_detail::Kind::AllGather, ReduceOp::Sum, 0, input, output, input.numel(),
                  output.numel());
  }
  void barrier() override {
    AnyTensor none;
    arrive(thread_group_detail::Kind::Barrier, ReduceOp::Sum, 0, none, none, 0, 0)->wait();
  }

 private:
  using Op = thread_group_detail::Op;
  using Clock = std::chrono::steady_clock;

  class ThreadWork : public Work {
   public:
    ThreadWork(std::shared_ptr<thread_group_detail::Rendezvous> rv, std::shared_ptr<Op> op, uint64_t seq, int rank,
               Clock::time_point deadline, std::chrono::milliseconds timeout)
        : rv_(std::move(rv)), op_(std::move(op)), seq_(seq), rank_(rank), deadline_(deadline), timeout_(timeout) {}
    bool is_completed() override {
      std::lock_guard<std::mutex> lock(rv_->mu);
      return op_->done;
    }
    void wait() override {
      std::unique_lock<std::mutex> lock(rv_->mu);
      if (!rv_->cv.wait_until(lock, deadline_, [&] { return op_->done; })) {
        std::ostringstream missing;
        bool first = true;
        for (size_t r = 0; r < op_->arrived.size(); ++r)
          if (!op_->arrived[r]) {
            missing << (first ? "" : ", ") << r;
            first = false;
          }
        throw DistributedError("ThreadProcessGroup: rank " + std::to_string(rank_) + ": " +
                               thread_group_detail::kind_name(op_->kind) + " #" + std::to_string(seq_) +
                               " timed out after " + std::to_string(timeout_.count()) + " ms waiting for rank(s) " +
                               missing.str() + " (" + std::to_string(op_->count) + " of " +
                               std::to_string(op_->arrived.size()) + " arrived)");
      }
      if (!op_->error.empty())
        throw DistributedError("ThreadProcessGroup: rank " + std::to_string(rank_) + ": collective #" +
                               std::to_string(seq_) + ": " + op_->error);
    }

   private:
    std::shared_ptr<thread_group_detail::Rendezvous> rv_;
    std::shared_ptr<Op> op_;
    uint64_t seq_;
    int rank_;
    Clock::time_point deadline_;
    std::chrono::milliseconds timeout_;
  };

  ThreadProcessGroup(std::shared_ptr<thread_group_detail::Rendezvous> rv, int rank, ProcessGroupOptions options)
      : rv_(std::move(rv)), rank_(rank), options_(options) {}

  static void check_cpu(const AnyTensor& t, const char* what) {
    EMBER_CHECK(t.defined(), ValueError, "ThreadProcessGroup.", what, ": undefined tensor");
    EMBER_CHECK(t.device().is_cpu(), DeviceError, "ThreadProcessGroup.", what, ": CPU tensors only, got ", t.desc());
  }

  std::shared_ptr<Work> arrive(thread_group_detail::Kind kind, ReduceOp reduce, int root, const AnyTensor& in,
                               const AnyTensor& out, int64_t in_numel, int64_t out_numel) {
    const uint64_t seq = next_seq_++;
    const auto deadline = Clock::now() + options_.timeout;
    std::shared_ptr<Op> op;
    {
      std::lock_guard<std::mutex> lock(rv_->mu);
      auto& slot = rv_->pending[seq];
      const int world = rv_->world;
      if (!slot) {
        slot = std::make_shared<Op>();
        slot->kind = kind;
        slot->reduce = reduce;
        slot->root = root;
        slot->dtype = in.defined() ? in.dtype() : DType::UInt8;
        slot->in_numel = in_numel;
        slot->out_numel = out_numel;
        slot->in.resize(static_cast<size_t>(world));
        slot->out.resize(static_cast<size_t>(world));
        slot->arrived.assign(static_cast<size_t>(world), false);
      }
      op = slot;
      if (op->error.empty()) {
        std::ostringstream e;
        if (op->kind != kind)
          e << "rank " << rank_ << " called " << thread_group_detail::kind_name(kind) << " where another rank called "
            << thread_group_detail::kind_name(op->kind);
        else if (op->reduce != reduce && (kind == thread_group_detail::Kind::AllReduce ||
                                          kind == thread_group_detail::Kind::ReduceScatter))
          e << "rank " << rank_ << " reduces with " << reduce_op_name(reduce) << ", another rank with "
            << reduce_op_name(op->reduce);
        else if (op->root != root)
          e << "rank " << rank_ << " broadcasts from root " << root << ", another rank from " << op->root;
        else if (in.defined() && (op->dtype != in.dtype() || op->in_numel != in_numel || op->out_numel != out_numel))
          e << "rank " << rank_ << " brought " << in.desc() << " (" << in_numel << " -> " << out_numel
            << " elements), another rank " << dtype_name(op->dtype) << " (" << op->in_numel << " -> "
            << op->out_numel << " elements)";
        op->error = e.str();
      }
      op->in[static_cast<size_t>(rank_)] = in;
      op->out[static_cast<size_t>(rank_)] = out;
      op->arrived[static_cast<size_t>(rank_)] = true;
      if (++op->count == world) {
        if (op->error.empty()) execute(*op);
        op->done = true;
        op->in.assign(op->in.size(), AnyTensor());
        op->out.assign(op->out.size(), AnyTensor());
        rv_->pending.erase(seq);
        rv_->cv.notify_all();
      }
    }
    return std::make_shared<ThreadWork>(rv_, op, seq, rank_, deadline, options_.timeout);
  }

  std::shared_ptr<thread_group_detail::Rendezvous> rv_;
  int rank_;
  ProcessGroupOptions options_;
  uint64_t next_seq_ = 0;
};

}  // namespace ember::dist
