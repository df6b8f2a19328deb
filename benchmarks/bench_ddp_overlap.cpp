// How much of DataParallel's communication hides behind backward, on CPU MPI:
//   mpirun -np 2 ./build/benchmarks/bench_ddp_overlap [steps] [width] [depth]
// Times three versions of the same training step (forward, backward, SGD step) on an MLP of
// `depth` Linear(width, width) layers with several gradient buckets:
//   local    - no communication at all (the floor),
//   ddp      - DataParallel: bucket all-reduces start from the gradient-ready hooks during backward,
//   blocking - the same all-reduces issued one after another after backward (no overlap).
// Reports medians and the fraction of the communication time hidden:
//   hidden = (blocking - ddp) / (blocking - local). The target is that all but the last bucket is
//   hidden, i.e. ddp - local close to one bucket's all-reduce time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>

using namespace ember;

namespace {

std::shared_ptr<nn::Sequential> make_mlp(int64_t width, int64_t depth) {
  manual_seed(1);
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    m->emplace<nn::Linear>(width, width);
    m->emplace<nn::Tanh>();
  }
  return m;
}

template <class F>
double median_ms(dist::ProcessGroup& pg, int steps, F&& step) {
  std::vector<double> t;
  for (int i = 0; i < steps + 2; ++i) {
    pg.barrier();
    auto t0 = std::chrono::steady_clock::now();
    step();
    auto t1 = std::chrono::steady_clock::now();
    if (i >= 2) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());  // 2 warm-up steps
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto pg = dist::init_from_environment();
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int64_t width = argc > 2 ? std::atoll(argv[2]) : 512, depth = argc > 3 ? std::atoll(argv[3]) : 8;
  auto x = Tensor<float>::randn({64, width});
  // Buckets of ~2 layers each, so that there are several to overlap.
  const size_t bucket = static_cast<size_t>(2 * width * (width + 1) * 4);
  auto run = [&](nn::Sequential& m, optim::SGD& opt) {
    opt.zero_grad();
    mean(square(m(x))).backward();
  };

  auto local = make_mlp(width, depth);
  optim::SGD opt_local(local->parameters(), {.lr = 1e-3});
  const double t_local = median_ms(*pg, steps, [&] {
    run(*local, opt_local);
    opt_local.step();
  });

  auto ddp_model = make_mlp(width, depth);
  dist::DataParallel ddp(ddp_model, *pg, {.bucket_cap_bytes = bucket, .first_bucket_bytes = bucket});
  optim::SGD opt_ddp(ddp_model->parameters(), {.lr = 1e-3});
  const double t_ddp = median_ms(*pg, steps, [&] {
    run(*ddp_model, opt_ddp);  // all-reduces overlap backward; waited for at its end
    opt_ddp.step();
  });

  auto blocking = make_mlp(width, depth);
  optim::SGD opt_blocking(blocking->parameters(), {.lr = 1e-3});
  auto params = blocking->parameters();
  const double t_blocking = median_ms(*pg, steps, [&] {
    run(*blocking, opt_blocking);
    // The same buckets, reduced after backward, one at a time.
    for (size_t i = 0; i < params.size(); i += 4) {  // 2 layers = 4 tensors per bucket
      std::vector<AnyTensor> grads;
      for (size_t j = i; j < std::min(params.size(), i + 4); ++j) grads.push_back(params[j].grad().reshape({-1}));
      AnyTensor flat = op::concat(grads, 0);
      pg->all_reduce(flat, dist::ReduceOp::Avg);
    }
    opt_blocking.step();
  });

  if (pg->rank() == 0) {
    const double comm = t_blocking - t_local, exposed = t_ddp - t_local;
    std::printf("ranks %d, MLP %lldx%lld (%lld buckets of %.1f MB), median of %d steps:\n", pg->size(),
                static_cast<long long>(depth), static_cast<long long>(width), static_cast<long long>(depth / 2),
                static_cast<double>(bucket) / 1e6, steps);
    std::printf("  local (no communication) %8.2f ms\n  ddp (overlapped)         %8.2f ms\n"
                "  blocking all-reduces     %8.2f ms\n",
                t_local, t_ddp, t_blocking);
    std::printf("  communication %.2f ms, exposed with ddp %.2f ms: %.0f%% hidden behind backward\n", comm, exposed,
                comm > 0 ? 100.0 * (comm - exposed) / comm : 0.0);
  }
  return 0;
}
