// dist::NcclProcessGroup with one GPU: a one-rank group from a locally made unique id, and the
// single-process mode (create_all) with one device. With one rank every reduction is the identity,
// so the checks that matter are the values after out-of-place collectives (all_gather,
// reduce_scatter: NCCL copies input to output on its own stream) and the stream ordering: the input
// is produced by an ember op just before the collective, and the output is consumed by an ember op
// just after wait(), on large tensors, so a missing event wait would read stale data. A timeout test
// holds ember's stream with a blocking host function so that a collective cannot finish, and checks
// that a host wait with a deadline aborts the communicator and throws DistributedError.
// Built only with the CUDA backend (tests/CMakeLists.txt); without a GPU the GPU tests print
// "SKIPPED: no GPU" (the unique-id bootstrap and the argument checks run anyway).
#include <catch2/catch.hpp>

#if __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <ember/core/tensor.hpp>
#include <ember/dist/fsdp.hpp>
#include <ember/dist/nccl.hpp>
#include <ember/nn/nn.hpp>
#include <ember/optim/adam.hpp>
#include <ember/dist/thread_group.hpp>
#include <ember/ops/elementwise.hpp>

#include "gpu_skip.hpp"

using namespace ember;
using dist::NcclProcessGroup;

namespace {

constexpr DType kAllDTypes[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                DType::Int32,   DType::Int64,   DType::UInt8};

Device gpu() { return Device::cuda(0); }

// Small integers (exact in every dtype, also after x2): i % 50.
std::vector<double> pattern(int64_t n, int64_t shift = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i + shift) % 50);
  return v;
}

// On the GPU, produced by an ember op (x2) on ember's stream.
AnyTensor produced_on_gpu(int64_t n, DType t, int64_t shift = 0) {
  AnyTensor host = Tensor<double>::from_vector(pattern(n, shift)).to(t);
  return op::mul(host.to(gpu()), 2.0);
}

std::vector<double> read_back(const AnyTensor& t) {
  return Tensor<double>(t.to(Device::cpu()).to(DType::Float64)).to_vector();
}

bool equals_pattern(const AnyTensor& t, double factor, int64_t shift = 0) {
  const std::vector<double> got = read_back(t);
  const std::vector<double> want = pattern(static_cast<int64_t>(got.size()), shift);
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != factor * want[i]) {
      UNSCOPED_INFO("element " << i << ": got " << got[i] << ", want " << factor * want[i]);
      return false;
    }
  }
  return true;
}

// 60 s instead of the 5-minute default, so that a hang fails its test well inside the GPU check's
// time (tools/gpu-check.sh gives each test 120 s).
dist::NcclOptions test_options() {
  dist::NcclOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

std::unique_ptr<NcclProcessGroup> one_rank_group(dist::NcclOptions options = test_options()) {
  return std::make_unique<NcclProcessGroup>(dist::nccl_unique_id(), 0, 1, 0, options);
}

}  // namespace

TEST_CASE("nccl one rank: all_reduce sum, avg, max in place for every dtype", "[nccl]") {
  EMBER_REQUIRE_GPU();
  auto pg = one_rank_group();
  CHECK(pg->rank() == 0);
  CHECK(pg->size() == 1);
  CHECK(pg->backend_name() == "nccl");
  for (DType t : kAllDTypes) {
    INFO("dtype " << dtype_name(t));
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
      INFO("op " << dist::reduce_op_name(op));
      AnyTensor x = produced_on_gpu(1 << 16, t);
      pg->all_reduce(x, op);
      CHECK(equals_pattern(x, 2.0));
    }
  }
}

TEST_CASE("nccl one rank: all_gather and reduce_scatter are ordered with ember's stream", "[nccl]") {
  EMBER_REQUIRE_GPU();
  auto pg = one_rank_group();
  const int64_t n = int64_t(1) << 24;  // 64 MiB of fp32: a missing event wait would read stale data
  for (int round = 0; round < 3; ++round) {
    AnyTensor in = produced_on_gpu(n, DType::Float32, round);
    AnyTensor out = AnyTensor::zeros(Shape{n}, DType::Float32, gpu());
    pg->all_gather(out, in);
    // Consumed on ember's stream right after wait(): must see the gathered values.
    CHECK(equals_pattern(op::mul(out, 3.0), 6.0, round));

    AnyTensor in2 = produced_on_gpu(n, DType::Float32, round + 7);
    AnyTensor out2 = AnyTensor::zeros(Shape{n}, DType::Float32, gpu());
    auto w = pg->reduce_scatter_async(out2, in2, dist::ReduceOp::Sum);
    w->wait();
    CHECK(w->is_completed() == w->is_completed());  // polls without throwing
    CHECK(equals_pattern(op::mul(out2, 0.5), 1.0, round + 7));
  }
  pg->synchronize();
}

TEST_CASE("nccl one rank: broadcast, every dtype out of place, barrier", "[nccl]") {
  EMBER_REQUIRE_GPU();
  auto pg = one_rank_group();
  for (DType t : kAllDTypes) {
    INFO("dtype " << dtype_name(t));
    AnyTensor x = produced_on_gpu(4099, t);
    pg->broadcast(x, 0);
    CHECK(equals_pattern(x, 2.0));
    AnyTensor out = AnyTensor::zeros(Shape{4099}, t, gpu());
    pg->all_gather(out, produced_on_gpu(4099, t, 3));
    CHECK(equals_pattern(out, 2.0, 3));
    AnyTensor out2 = AnyTensor::zeros(Shape{4099}, t, gpu());
    auto w = pg->reduce_scatter_async(out2, produced_on_gpu(4099, t, 5), dist::ReduceOp::Max);
    static_cast<dist::NcclWork&>(*w).synchronize();
    CHECK(w->is_completed());
    CHECK(equals_pattern(out2, 2.0, 5));
  }
  pg->barrier();
  AnyTensor empty = AnyTensor::zeros(Shape{0}, DType::Float32, gpu());
  pg->all_reduce(empty);
}

TEST_CASE("nccl one rank: wrong device, shape, dtype and root are errors", "[nccl]") {
  EMBER_REQUIRE_GPU();
  auto pg = one_rank_group();
  AnyTensor cpu = AnyTensor::zeros(Shape{4}, DType::Float32);
  CHECK_THROWS_AS(pg->all_reduce(cpu), DeviceError);
  AnyTensor g4 = AnyTensor::zeros(Shape{4}, DType::Float32, gpu());
  AnyTensor g3 = AnyTensor::zeros(Shape{3}, DType::Float32, gpu());
  AnyTensor g4i = AnyTensor::zeros(Shape{4}, DType::Int32, gpu());
  CHECK_THROWS_AS(pg->all_gather(g3, g4), ShapeError);
  CHECK_THROWS_AS(pg->reduce_scatter(g3, g4), ShapeError);
  CHECK_THROWS_AS(pg->all_gather(g4i, g4), DTypeError);
  CHECK_THROWS_AS(pg->broadcast(g4, 1), ValueError);
  CHECK_THROWS_AS(NcclProcessGroup(dist::nccl_unique_id(), 1, 1, 0), ValueError);
  CHECK_THROWS_AS(NcclProcessGroup(dist::nccl_unique_id(), 0, 1, cuda::runtime_device_count()), DeviceError);
  pg->all_reduce(g4);  // the group still works
}

TEST_CASE("nccl single-process mode (create_all) with one device", "[nccl]") {
  EMBER_REQUIRE_GPU();
  auto groups = NcclProcessGroup::create_all({0}, test_options());
  REQUIRE(groups.size() == 1);
  NcclProcessGroup& pg = *groups[0];
  CHECK(pg.rank() == 0);
  CHECK(pg.size() == 1);
  CHECK(pg.device() == Device::cuda(0));

  AnyTensor x = produced_on_gpu(1 << 20, DType::Float32);
  AnyTensor in = produced_on_gpu(1 << 20, DType::BFloat16, 11);
  AnyTensor out = AnyTensor::zeros(Shape{1 << 20}, DType::BFloat16, gpu());
  std::vector<std::shared_ptr<dist::Work>> works;
  {
    dist::NcclGroup group;
    works.push_back(pg.all_reduce_async(x, dist::ReduceOp::Avg));
    works.push_back(pg.all_gather_async(out, in));
    // Not issued yet: waiting inside the scope is an error, not a hang.
    CHECK_THROWS_AS(works[0]->wait(), DistributedError);
  }
  for (auto& w : works) w->wait();
  CHECK(equals_pattern(x, 2.0));
  CHECK(equals_pattern(out, 2.0, 11));

  // Size 1: a collective outside a group scope is fine too.
  pg.all_reduce(x, dist::ReduceOp::Max);
  CHECK(equals_pattern(x, 2.0));
  CHECK_THROWS_AS(NcclProcessGroup::create_all({0, 0}), ValueError);
}

TEST_CASE("nccl one rank: FullyShardedDataParallel (ZeRO-3, ZeRO-2, bf16 gathers) trains as the plain model", "[nccl][fsdp]") {
  EMBER_REQUIRE_GPU();
  // One rank: every collective is a copy, so ZeRO-3 must give the plain model's losses exactly in
  // fp32 (the same kernels on the same values), and close with bf16 gathered parameters; between
  // steps no unit is gathered (stage 3).
  auto make = [] {
    manual_seed(21);
    auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(32, 64), std::make_shared<nn::Tanh>(),
                                              std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::Tanh>(),
                                              std::make_shared<nn::Linear>(64, 8));
    m->to(gpu());
    return m;
  };
  AnyTensor x = op::mul(Tensor<float>::rand({16, 32}, Device::cpu(), -1.0, 1.0).to(gpu()), 1.0);
  AnyTensor y = Tensor<float>::rand({16, 8}, Device::cpu(), -1.0, 1.0).to(gpu());
  auto losses = [&](int stage, std::optional<DType> param_dtype, bool* freed) {
    auto m = make();
    std::vector<double> out;
    auto step = [&](std::vector<AnyTensor> params, auto&& forward) {
      optim::AdamW opt(params, {.lr = 1e-2});
      for (int s = 0; s < 5; ++s) {
        opt.zero_grad();
        AnyTensor o = forward();
        AnyTensor loss = op::mean(op::square(op::sub(o.to(DType::Float32), y)));
        loss.backward();
        opt.step();
        out.push_back(loss.item_double());
      }
    };
    if (stage == 0) {
      step(m->parameters(), [&] { return m->forward_any(x); });
    } else {
      auto pg = one_rank_group();
      dist::FullyShardedDataParallel fsdp(m, *pg, {.stage = stage, .param_dtype = param_dtype});
      step(fsdp.parameters(), [&] { return fsdp(x); });
      if (freed) {
        *freed = true;
        for (size_t i = 0; i < fsdp.unit_count(); ++i) *freed = *freed && !fsdp.is_gathered(i);
      }
      pg->synchronize();
    }
    return out;
  };
  bool freed = false;
  const auto plain = losses(0, std::nullopt, nullptr);
  const auto z3 = losses(3, std::nullopt, &freed);
  const auto z2 = losses(2, std::nullopt, nullptr);
  const auto z3_bf16 = losses(3, DType::BFloat16, nullptr);
  CHECK(freed);
  for (size_t i = 0; i < plain.size(); ++i) {
    CHECK(z3[i] == Approx(plain[i]).epsilon(1e-6));
    CHECK(z2[i] == Approx(plain[i]).epsilon(1e-6));
    CHECK(z3_bf16[i] == Approx(plain[i]).epsilon(0.05));
  }
}

TEST_CASE("nccl: a collective that cannot finish times out, aborts and throws", "[nccl]") {
  EMBER_REQUIRE_GPU();
  // The group with the tests' 60 s timeout: a 200 ms one would also bound the communicator's
  // initialisation, which in a fresh process (one per test case, run in parallel) can take longer.
  // The 200 ms deadline goes to the wait below instead.
  auto pg = one_rank_group();
  AnyTensor in = produced_on_gpu(1 << 20, DType::Float32);
  AnyTensor out = AnyTensor::zeros(Shape{1 << 20}, DType::Float32, gpu());
  cudaStream_t ember_stream = cuda::current_stream(0);
  // The same collective once, finished, before the stream is held: NCCL connects a communicator
  // and allocates its buffers lazily at its first collective, work that must not be what the
  // 200 ms deadline below measures (nor run while ember's stream is blocked).
  pg->all_gather(out, in);
  REQUIRE(cudaStreamSynchronize(ember_stream) == cudaSuccess);
  CHECK(equals_pattern(out, 2.0));

  // Hold ember's stream until released (at the latest after 5 s, so nothing can hang for good).
  static std::atomic<bool> release{false};
  release = false;
  REQUIRE(cudaLaunchHostFunc(
              ember_stream,
              [](void*) {
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
                while (!release.load() && std::chrono::steady_clock::now() < until) {
                  std::this_thread::sleep_for(std::chrono::milliseconds(1));
                }
              },
              nullptr) == cudaSuccess);
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    release = true;
  });

  auto w = pg->all_gather_async(out, in);  // waits for ember's stream: cannot finish before release
  CHECK_FALSE(w->is_completed());
  // The deadline (200 ms) passes long before the release (2 s). ncclCommAbort itself may wait
  // until the stream is released, so the elapsed time is not checked; the message says why it threw.
  CHECK_THROWS_WITH(static_cast<dist::NcclWork&>(*w).synchronize(std::chrono::milliseconds(200)),
                    Catch::Matchers::Contains("did not finish within 200 ms") &&
                        Catch::Matchers::Contains("aborted"));
  CHECK(pg->aborted());
  CHECK_THROWS_AS(pg->all_reduce(out), DistributedError);
  CHECK_THROWS_AS(pg->barrier(), DistributedError);

  releaser.join();
  w.reset();
  REQUIRE(cudaStreamSynchronize(ember_stream) == cudaSuccess);
}

// These need no GPU: the bootstrap of the unique id over a CPU group, and argument checks.
TEST_CASE("nccl: broadcast_nccl_unique_id gives every rank of a CPU group root's id", "[nccl]") {
  auto groups = dist::ThreadProcessGroup::create(3);
  ncclUniqueId ids[3];
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { ids[r] = dist::broadcast_nccl_unique_id(*groups[static_cast<size_t>(r)]); });
  }
  for (auto& t : threads) t.join();
  CHECK(std::memcmp(&ids[0], &ids[1], sizeof(ncclUniqueId)) == 0);
  CHECK(std::memcmp(&ids[0], &ids[2], sizeof(ncclUniqueId)) == 0);
  CHECK(std::count_if(std::begin(ids[0].internal), std::end(ids[0].internal), [](char c) { return c != 0; }) > 0);
}

TEST_CASE("nccl: bad rank, device list or device is an error before any NCCL call", "[nccl]") {
  const ncclUniqueId id{};
  CHECK_THROWS_AS(NcclProcessGroup(id, 2, 2, 0), ValueError);
  CHECK_THROWS_AS(NcclProcessGroup(id, 0, 0, 0), ValueError);
  CHECK_THROWS_AS(NcclProcessGroup(id, 0, 1, cuda::runtime_device_count()), DeviceError);
  CHECK_THROWS_AS(NcclProcessGroup::create_all({}), ValueError);
  CHECK_THROWS_AS(NcclProcessGroup::create_all({cuda::runtime_device_count()}), DeviceError);
  CHECK(std::string(dist::reduce_op_name(dist::ReduceOp::Avg)) == "avg");
  CHECK(dist::nccl_reduce_op(dist::ReduceOp::Avg) == ncclAvg);
  CHECK(dist::nccl_reduce_op(dist::ReduceOp::Max) == ncclMax);
}

#else
TEST_CASE("nccl: not built without the CUDA headers", "[nccl]") { SUCCEED(); }
#endif
