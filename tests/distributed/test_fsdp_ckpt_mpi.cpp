// Sharded checkpoints of FullyShardedDataParallel across processes (mpirun), with a rank killed
// in the middle of a save and the job resumed on fewer ranks:
//   mpirun -np 4 test_fsdp_ckpt_mpi kill <folder>
//     runs 8 steps uninterrupted (rank 0 writes the mean loss of each step to
//     <folder>/reference.txt), then trains again saving every 2 steps into <folder>/ckpt; in the
//     save of step 6 rank 1 SIGKILLs itself while writing its shard file (through the manager's
//     on_write progress callback, set by this program). The job must end non-zero.
//   mpirun -np 2 test_fsdp_ckpt_mpi resume <folder>
//     finds the dead job's temporary folder, makes the manager (which removes it), resumes from
//     step 4 (the last complete checkpoint, written by 4 ranks) and checks that the mean loss of
//     steps 4..7 equals the 4-rank reference within the reduction-order tolerance; consolidates
//     step 4 into one file.
// Plain checks (mpi_harness.hpp); any failure makes the job exit non-zero ("FAILED" in the output).
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <ember/dist/fsdp.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/dist/sharded_checkpoint.hpp>
#include <ember/ember.hpp>

#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSteps = 8, kGlobalBatch = 12, kIn = 8, kOut = 3;

// This rank's rows of step s's global batch (12 rows split evenly over the world).
std::pair<Tensor<float>, Tensor<float>> batch(int64_t step, int rank, int world) {
  std::mt19937 rng(static_cast<uint32_t>(100 * step + 3));
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x, y;
  for (int64_t i = 0; i < kGlobalBatch * kIn; ++i) x.push_back(n(rng));
  for (int64_t i = 0; i < kGlobalBatch * kOut; ++i) y.push_back(n(rng));
  const int64_t b = kGlobalBatch / world;
  return {Tensor<float>::from_vector(std::vector<float>(x.begin() + rank * b * kIn, x.begin() + (rank + 1) * b * kIn), {b, kIn}),
          Tensor<float>::from_vector(std::vector<float>(y.begin() + rank * b * kOut, y.begin() + (rank + 1) * b * kOut),
                                     {b, kOut})};
}

struct Job {
  std::shared_ptr<nn::Sequential> model = testing::mpi::seeded_mlp(kIn, 64, kOut);
  dist::FullyShardedDataParallel fsdp;
  optim::AdamW opt;
  optim::StepLR sched;
  explicit Job(dist::ProcessGroup& pg)
      : fsdp(model, pg, {.stage = 3}), opt(fsdp.parameters(), {.lr = 1e-2, .weight_decay = 0.01}), sched(opt, 3, 0.5) {}
  dist::ShardedCheckpointTargets targets() { return {.fsdp = &fsdp, .optimizer = &opt, .scheduler = &sched}; }
};

// Steps [begin, kSteps): the mean loss over the ranks of each; after_step(s + 1) after each.
template <class After>
std::vector<double> train(dist::ProcessGroup& pg, Job& job, int64_t begin, After&& after_step) {
  std::vector<double> losses;
  for (int64_t s = begin; s < kSteps; ++s) {
    auto [x, y] = batch(s, pg.rank(), pg.size());
    job.opt.zero_grad();
    auto loss = nn::functional::mse_loss(job.fsdp(x), y);
    AnyTensor sum = Tensor<double>::scalar(static_cast<double>(loss.item())).reshape({1});
    pg.all_reduce(sum, dist::ReduceOp::Sum);
    losses.push_back(sum.item_double() / pg.size());
    loss.backward();
    job.opt.step();
    job.sched.step();
    after_step(s + 1);
  }
  return losses;
}

void killed_job(dist::MpiProcessGroup& pg, const fs::path& dir) {
  if (pg.rank() == 0) fs::remove_all(dir);
  pg.barrier();
  {
    Job ref(pg);
    std::vector<double> losses = train(pg, ref, 0, [](int64_t) {});
    if (pg.rank() == 0) {
      fs::create_directories(dir);
      std::FILE* out = std::fopen((dir / "reference.txt").c_str(), "w");
      for (double l : losses) std::fprintf(out, "%.17g\n", l);
      std::fclose(out);
    }
  }
  pg.barrier();
  Job job(pg);
  int64_t saving = 0;
  dist::ShardedCheckpointOptions options{.keep_last = 5};
  options.on_write = [&](const std::string& file, uint64_t bytes) {
    if (saving == 6 && pg.rank() == 1 && bytes > 0) {
      std::printf("rank 1: raising SIGKILL while writing %s of step 6 (%llu bytes written)\n", file.c_str(),
                  static_cast<unsigned long long>(bytes));
      std::fflush(stdout);
      ::raise(SIGKILL);
    }
  };
  dist::ShardedCheckpointManager ckpt(dir / "ckpt", pg, options);
  train(pg, job, 0, [&](int64_t step) {
    if (step % 2 != 0) return;
    saving = step;
    ckpt.save(step, job.targets(), {.data = {{"step", step}}});
    if (pg.rank() == 0) std::printf("saved step %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  });
  std::printf("rank %d: the loop finished, the kill did not happen\n", pg.rank());
  expect(false, "rank 1 was killed in the save of step 6");
}

void resumed_job(dist::MpiProcessGroup& pg, const fs::path& dir) {
  std::vector<double> reference;
  {
    std::ifstream f(dir / "reference.txt");
    for (double v; f >> v;) reference.push_back(v);
  }
  expect(reference.size() == static_cast<size_t>(kSteps), "the killed job wrote its 8 reference losses");
  long dead_pid = 0;  // the killed job's rank 0, in the temporary folder's name .tmp-step-6-<pid>-<k>
  for (const auto& e : fs::directory_iterator(dir / "ckpt")) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp-step-6-", 0) == 0) dead_pid = std::strtol(n.c_str() + 12, nullptr, 10);
  }
  expect(dead_pid > 0, "the killed save left its temporary folder .tmp-step-6-*");
  // mpirun may return before the killed job's processes are gone: the manager removes the folder
  // only once its writer has ended.
  for (int i = 0; i < 200 && dead_pid > 0 && ::kill(static_cast<pid_t>(dead_pid), 0) == 0; ++i) ::usleep(50000);
  expect(!fs::exists(dir / "ckpt" / "step-6"), "no step-6 checkpoint was committed");
  pg.barrier();
  Job job(pg);
  dist::ShardedCheckpointManager ckpt(dir / "ckpt", pg);
  pg.barrier();
  if (pg.rank() == 0) {
    bool left = false;
    for (const auto& e : fs::directory_iterator(dir / "ckpt")) left |= e.path().filename().string().rfind(".tmp-", 0) == 0;
    expect(!left, "rank 0's manager removed the dead job's temporary folder");
  }
  auto loaded = ckpt.load_latest(job.targets());
  expect(loaded.has_value() && loaded->step == 4 && loaded->saved_world == 4,
         "resumed from step 4, saved by 4 ranks");
  if (!loaded || reference.size() != static_cast<size_t>(kSteps)) return;
  std::vector<double> losses = train(pg, job, loaded->step, [](int64_t) {});
  double worst = 0;
  for (size_t i = 0; i < losses.size(); ++i)
    worst = std::max(worst, std::fabs(losses[i] - reference[4 + i]) / std::max(1.0, std::fabs(reference[4 + i])));
  if (pg.rank() == 0) std::printf("resumed on %d ranks: worst relative loss difference to the 4-rank run %.3g\n", pg.size(), worst);
  expect(worst < 1e-6, "the resumed losses follow the uninterrupted 4-rank run within 1e-6");
  if (pg.rank() == 0) {
    const fs::path out = dir / "consolidated.safetensors";
    dist::consolidate_sharded_checkpoint(dir / "ckpt" / "step-4", out);
    expect(io::load_file(out.string()).size() == job.model->state_dict().size(),
           "consolidation writes every state_dict entry");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const fs::path dir = argc > 2 ? argv[2] : "fsdp_ckpt_mpi";
  return testing::mpi::run_job("fsdp sharded checkpoint " + mode + " over mpi", {}, [&](dist::MpiProcessGroup& pg) {
    if (mode == "kill") {
      killed_job(pg, dir);
    } else if (mode == "resume") {
      resumed_job(pg, dir);
      testing::mpi::tally().scratch = dir;  // removed when the job passed
    } else {
      expect(false, "mode must be kill or resume, got '" + mode + "'");
    }
  });
}
