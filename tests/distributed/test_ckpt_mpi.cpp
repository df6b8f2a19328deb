// Checkpoint and resume under data parallelism (mpirun, 2 ranks): rank 0 writes the checkpoint,
// every rank loads it, and the continued run equals the uninterrupted one bitwise (losses,
// parameters, optimizer state) on every rank.
//   mpirun -np 2 test_ckpt_mpi <folder>
// Plain checks (mpi_harness.hpp); any failure makes the job exit non-zero ("FAILED" in the output).
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>
#include <ember/data/distributed_sampler.hpp>
#include <ember/train/checkpoint_manager.hpp>

#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;

namespace {

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
  auto model = testing::mpi::seeded_mlp(8, 16, 3);
  dist::DataParallel dp(model, pg);
  optim::AdamW opt(model->parameters(), {.lr = 1e-2});
  optim::WarmupCosineLR sched(opt, {.warmup_steps = 2, .total_steps = kSteps});
  data::DistributedSampler sampler(40, R, r, {.shuffle = true, .seed = 9});
  auto [x, y] = testing::mpi::regression_data(40, 8, 3);
  train::CheckpointManager ckpt(dir, {.keep_last = 2, .clean_stale = r == 0});
  train::CheckpointTargets t{.model = model.get(), .optimizer = &opt, .scheduler = &sched};
  int64_t step = 0, pos = 0;
  if (resume) {
    auto loaded = ckpt.load_latest(t);
    expect(loaded.has_value(), "a checkpoint to resume from");
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
  return testing::mpi::run_job("checkpoint resume over mpi", {.timeout = std::chrono::seconds(60)},
                               [&](dist::MpiProcessGroup& pg) {
    const auto dir = testing::mpi::scratch_folder(pg, argc, argv, "ckpt_mpi");
    RunResult straight = run(pg, dir, -1, false);
    const int64_t k = 3;  // mid-epoch (2 ranks: 20 samples each per epoch, 4 per step)
    RunResult first = run(pg, dir, k, false, k);
    RunResult resumed = run(pg, dir, -1, true);
    std::vector<float> losses = first.losses;
    losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
    expect(losses.size() == straight.losses.size() &&
               std::memcmp(losses.data(), straight.losses.data(), losses.size() * sizeof(float)) == 0,
           "losses of save + resume equal the uninterrupted run bitwise");
    expect(resumed.params.size() == straight.params.size(), "parameter count");
    for (size_t i = 0; i < straight.params.size() && i < resumed.params.size(); ++i)
      expect(same_bytes(straight.params[i].second, resumed.params[i].second),
             "parameter " + straight.params[i].first + " bitwise equal");
    for (auto& [i, st] : straight.opt.state)
      for (size_t s = 0; s < st.size(); ++s)
        expect(resumed.opt.state.count(i) && same_bytes(st[s].second, resumed.opt.state[i][s].second),
               "optimizer state " + std::to_string(i) + "." + st[s].first + " bitwise equal");
  });
}
