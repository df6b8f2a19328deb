// Checkpoint and resume under data parallelism (mpirun, 2 ranks): rank 0 writes the checkpoint,
// every rank loads it, and the continued run equals the uninterrupted one bitwise (losses,
// parameters, optimizer state) on every rank.
//   mpirun -np 2 test_ckpt_mpi <folder>
// Plain checks; any failure makes the job exit non-zero ("FAILED" in the output).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>
#include <ember/data/distributed_sampler.hpp>
#include <ember/train/checkpoint_manager.hpp>

using namespace ember;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    std::printf("rank %d: FAILED %s\n", rank, what.c_str());
  }
}
bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

struct RunResult {
  std::vector<float> losses;
  nn::StateDict params;
  optim::OptimizerStateDict opt;
};

constexpr int64_t kSteps = 9, kPerRank = 4;

// Steps [0 or the checkpoint's step, kSteps); saves after step `save_after` (rank 0 writes).
RunResult run(dist::ProcessGroup& pg, const std::filesystem::path& dir, int64_t save_after, bool resume,
              int64_t stop = kSteps) {
  const int R = pg.size(), r = pg.rank();
  manual_seed(42);
  auto model = std::make_shared<nn::Sequential>();
  model->emplace<nn::Linear>(8, 16);
  model->emplace<nn::Tanh>();
  model->emplace<nn::Linear>(16, 3);
  dist::DataParallel dp(model, pg);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  optim::WarmupCosineLR sched(opt, {.warmup_steps = 2, .total_steps = kSteps});
  data::DistributedSampler sampler(40, R, r, {.shuffle = true, .seed = 9});
  Generator g(7);
  auto x = Tensor<float>::randn({40, 8}, Device::cpu(), 0.0, 1.0, g);
  auto y = Tensor<float>::randn({40, 3}, Device::cpu(), 0.0, 1.0, g);
  train::CheckpointManager ckpt(dir, {.keep_last = 2, .clean_stale = r == 0});
  train::CheckpointTargets t{.model = model.get(), .optimizer = &opt, .scheduler = &sched};
  int64_t step = 0, pos = 0;
  if (resume) {
    auto loaded = ckpt.load_latest(t);
    expect(loaded.has_value(), "a checkpoint to resume from", r);
    if (!loaded) return {};
    step = loaded->step;
    pos = train::sampler_position_from(loaded->data, &sampler).index;
  }
  auto order = sampler.indices();
  RunResult out;
  for (; step < stop; ++step) {
    if (pos + kPerRank > static_cast<int64_t>(order.size())) {
      sampler.set_epoch(sampler.epoch() + 1);
      order = sampler.indices();
      pos = 0;
    }
    auto idx = Tensor<int64_t>::from_vector(std::vector<int64_t>(order.begin() + pos, order.begin() + pos + kPerRank));
    pos += kPerRank;
    opt.zero_grad();
    auto loss = nn::functional::mse_loss((*model)(index_select(x, 0, idx)), index_select(y, 0, idx));
    out.losses.push_back(loss.item());
    loss.backward();
    opt.step();
    sched.step();
    if (step + 1 == save_after) {
      if (r == 0)
        ckpt.save(step + 1, t, {.epoch = static_cast<int64_t>(sampler.epoch()),
                                .data = train::sampler_position(sampler, pos)});
      pg.barrier();  // the checkpoint is committed before any rank looks for it
    }
  }
  for (auto& [k, v] : model->state_dict()) out.params.emplace_back(k, v.detach().clone());
  out.opt = opt.state_dict();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  auto pg = dist::init_from_environment({.timeout = std::chrono::seconds(60)});
  const int r = pg->rank();
  const std::filesystem::path dir = argc > 1 ? argv[1] : "ckpt_mpi";
  try {
    if (r == 0) std::filesystem::remove_all(dir);
    pg->barrier();
    RunResult straight = run(*pg, dir, -1, false);
    const int64_t k = 3;  // mid-epoch (2 ranks: 20 samples each per epoch, 4 per step)
    RunResult first = run(*pg, dir, k, false, k);
    RunResult resumed = run(*pg, dir, -1, true);
    std::vector<float> losses = first.losses;
    losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
    expect(losses.size() == straight.losses.size() &&
               std::memcmp(losses.data(), straight.losses.data(), losses.size() * sizeof(float)) == 0,
           "losses of save + resume equal the uninterrupted run bitwise", r);
    expect(resumed.params.size() == straight.params.size(), "parameter count", r);
    for (size_t i = 0; i < straight.params.size() && i < resumed.params.size(); ++i)
      expect(same_bytes(straight.params[i].second, resumed.params[i].second),
             "parameter " + straight.params[i].first + " bitwise equal", r);
    for (auto& [i, st] : straight.opt.state)
      for (size_t s = 0; s < st.size(); ++s)
        expect(resumed.opt.state.count(i) && same_bytes(st[s].second, resumed.opt.state[i][s].second),
               "optimizer state " + std::to_string(i) + "." + st[s].first + " bitwise equal", r);
  } catch (const std::exception& e) {
    std::printf("rank %d: FAILED with an exception: %s\n", r, e.what());
    ++failures;
  }
  AnyTensor f = Tensor<int64_t>::scalar(failures);
  pg->all_reduce(f, dist::ReduceOp::Sum);
  if (r == 0)
    std::printf("checkpoint resume over mpi, %d ranks: %s (%lld failures)\n", pg->size(),
                f.item_double() == 0 ? "all checks passed" : "FAILURES", static_cast<long long>(f.item_double()));
  if (r == 0 && f.item_double() == 0) std::filesystem::remove_all(dir);
  return f.item_double() == 0 ? 0 : 1;
}
