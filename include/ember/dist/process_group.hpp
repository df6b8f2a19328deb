#pragma once
// dist::ProcessGroup: the collectives data parallelism needs, over a backend that moves the
// tensors (NCCL for CUDA tensors, MPI for CPU tensors; no home-made transport). Every rank calls
// the same collectives in the same order with tensors of the same shape and dtype. Synchronous
// calls return when the result is in place; asynchronous ones return a Work handle to wait on
// (GPU work is ordered on streams with events: no host sync).
// Every wait has a deadline (ProcessGroupOptions::timeout): a peer that fails or vanishes
// becomes an ember::DistributedError on the ranks that wait for it, never a silent hang.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/tensor.hpp"

namespace ember::dist {

enum class ReduceOp : uint8_t { Sum, Avg, Max };

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

// The default of ProcessGroupOptions::timeout: the environment variable EMBER_DIST_TIMEOUT_S
// (seconds, fractions allowed, > 0) when it is set and not empty, else 300 s. 300 s because the
// deadline must outlast the longest legitimate wait of one rank for the others: rank 0 writing a
// checkpoint or evaluating alone, a first step that compiles or autotunes, a data-loading stall;
// shorter kills healthy jobs, longer wastes a whole allocation on a dead peer (see
// docs/distributed.md). Read when the options are made, so a launcher can set it per job
// (`mpirun -x EMBER_DIST_TIMEOUT_S=60`). A malformed value is a ValueError naming the variable.
inline std::chrono::milliseconds default_timeout() {
  const char* v = std::getenv("EMBER_DIST_TIMEOUT_S");
  if (!v || !*v) return std::chrono::minutes(5);
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  EMBER_CHECK(end && *end == '\0' && std::isfinite(s) && s > 0 && s <= 1e9, ValueError,
              "EMBER_DIST_TIMEOUT_S='", v, "' is not a number of seconds in (0, 1e9] (the default ",
              "ProcessGroupOptions::timeout)");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(std::llround(s * 1000.0))));
}

struct ProcessGroupOptions {
  // How long a collective may wait for the other ranks before it raises DistributedError.
  // Default: default_timeout() (EMBER_DIST_TIMEOUT_S, else 5 minutes).
  std::chrono::milliseconds timeout{default_timeout()};
};

// A pending collective. wait() blocks until it completes (or throws DistributedError on failure
// or timeout); is_completed() polls. For GPU collectives, completion means "ordered before any
// later work on ember's stream for that device", not that the host has seen the result.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend_name() const = 0;
  // Where this group's collectives take their tensors: the CPU (MPI, threads) or its GPU (NCCL).
  // Code that makes its own tensors to communicate (DataParallel's checks, sync_found_inf) puts
  // them here.
  virtual Device device() const { return Device::cpu(); }

  // In place: every rank ends with the reduction of all ranks' tensors.
  virtual std::shared_ptr<Work> all_reduce_async(AnyTensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // In place: every rank ends with root's tensor.
  virtual std::shared_ptr<Work> broadcast_async(AnyTensor& t, int root = 0) = 0;
  // input has size() * output.numel() elements: rank r gets the reduction of chunk r.
  virtual std::shared_ptr<Work> reduce_scatter_async(AnyTensor& output, const AnyTensor& input,
                                                     ReduceOp op = ReduceOp::Sum) = 0;
  // output has size() * input.numel() elements: chunk r is rank r's input.
  virtual std::shared_ptr<Work> all_gather_async(AnyTensor& output, const AnyTensor& input) = 0;
  virtual void barrier() = 0;

  void all_reduce(AnyTensor& t, ReduceOp op = ReduceOp::Sum) { all_reduce_async(t, op)->wait(); }
  void broadcast(AnyTensor& t, int root = 0) { broadcast_async(t, root)->wait(); }
  void reduce_scatter(AnyTensor& output, const AnyTensor& input, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(output, input, op)->wait();
  }
  void all_gather(AnyTensor& output, const AnyTensor& input) { all_gather_async(output, input)->wait(); }
};

namespace detail {

// reduce_scatter and all_gather of a group of group_size ranks: output and input of one dtype, the
// whole one (reduce_scatter's input, all_gather's output) with group_size times the elements of
// the other. `call` names the collective in the error ("MpiProcessGroup::all_gather").
inline void check_whole_and_part(const std::string& call, const AnyTensor& output, const AnyTensor& input,
                                 bool output_is_whole, int group_size) {
  EMBER_CHECK(output.dtype() == input.dtype(), DTypeError, call, ": output ", output.desc(), " and input ",
              input.desc(), " differ in dtype");
  const AnyTensor& whole = output_is_whole ? output : input;
  const AnyTensor& part = output_is_whole ? input : output;
  const char* whole_name = output_is_whole ? "output" : "input";
  const char* part_name = output_is_whole ? "input" : "output";
  EMBER_CHECK(whole.numel() == part.numel() * group_size, ShapeError, call, ": ", whole_name, " ", whole.desc(),
              " must have size() * ", part_name, ".numel() = ", group_size, " * ", part.numel(), " elements (",
              part_name, " ", part.desc(), ")");
}

}  // namespace detail

// A Work that is already done (single-rank groups, empty tensors).
class CompletedWork : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

}  // namespace ember::dist
