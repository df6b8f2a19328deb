// train::Trainer under mpirun (2 ranks): a data-parallel fit on MpiProcessGroup equals the
// single-process fit on the whole batch (each rank also runs that one locally), only rank 0
// prints and writes checkpoints, and a run resumed by every rank from rank 0's epoch checkpoint
// continues the uninterrupted data-parallel run bitwise.
//   mpirun -np 2 test_trainer_mpi <scratch folder>
// Plain checks (mpi_harness.hpp); any failure makes the job exit non-zero ("FAILED" in the output).
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/mpi.hpp>
#include <ember/ember.hpp>
#include <ember/train/trainer.hpp>

#include "mpi_harness.hpp"

using namespace ember;
using testing::mpi::expect;
using testing::mpi::relative_error;

namespace {

constexpr int64_t kSamples = 48;

std::shared_ptr<data::TensorDataset> make_data() {
  Generator g(7);
  auto x = Tensor<float>::randn({kSamples, 6}, Device::cpu(), 0.0, 1.0, g);
  std::vector<int64_t> y(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) y[static_cast<size_t>(i)] = (i * 5) % 3;
  return std::make_shared<data::TensorDataset>(std::vector<std::pair<std::string, AnyTensor>>{
      {"image", x}, {"label", Tensor<int64_t>::from_vector(y, {kSamples})}});
}

struct Run {
  std::vector<AnyTensor> params;
  std::vector<double> losses;
  train::FitResult result;
  std::string printed;
  int checkpoints = 0;
};

// world == 1: the single process on batches of 4 * ranks; else this rank's share, batches of 4.
Run fit(dist::ProcessGroup* pg, int64_t epochs, const std::filesystem::path& dir) {
  const int world = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  const int64_t batch = pg ? 4 : 4 * 2;
  auto model = testing::mpi::seeded_mlp(6, 16, 3);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  data::DataLoader loader(make_data(), {.batch_size = batch, .drop_last = true,
                                        .sampler = data::DistributedSampler(kSamples, world, rank, {.shuffle = true, .seed = 3})});
  std::ostringstream os;
  train::TrainerOptions o{.epochs = epochs, .accumulation = 2,
                          .progress = {.mode = train::ProgressMode::Lines, .out = &os, .every_steps = 1}};
  if (!dir.empty()) o.checkpoint = {.dir = dir, .every_epochs = 1};
  train::Trainer t(o);
  Run out;
  auto cb = std::make_shared<train::LambdaCallback>();
  cb->checkpoint = [&](const train::TrainerState&, const std::filesystem::path&) { ++out.checkpoints; };
  t.add_callback(cb);
  if (pg) {
    dist::DataParallel dp(model, *pg);
    out.result = t.fit(dp, loader, sgd, train::cross_entropy_loss());
  } else {
    out.result = t.fit(*model, loader, sgd, train::cross_entropy_loss());
  }
  for (auto& p : model->parameters()) out.params.push_back(p.detach().clone());
  out.losses = out.result.train_losses;
  out.printed = os.str();
  return out;
}

bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  return testing::mpi::run_job("Trainer over mpi", {.timeout = std::chrono::seconds(60)},
                               [&](dist::MpiProcessGroup& pg) {
    const int r = pg.rank();
    expect(pg.size() == 2, "this test runs on 2 ranks");
    const auto dir = testing::mpi::scratch_folder(pg, argc, argv, "trainer_mpi");
    const Run single = fit(nullptr, 2, {});
    const Run dp = fit(&pg, 2, dir / "full");
    expect(dp.result.steps == single.result.steps && dp.result.steps == 6, "6 optimizer steps in both runs");
    for (size_t i = 0; i < single.params.size(); ++i)
      expect(relative_error(dp.params[i], single.params[i]) < 1e-5,
             "parameter " + std::to_string(i) + " equals the single-process run's");
    expect(r == 0 ? dp.printed.find("step 6/6") != std::string::npos : dp.printed.empty(),
           r == 0 ? "rank 0 prints its progress" : "ranks other than 0 print nothing");
    expect(dp.checkpoints == (r == 0 ? 2 : 0), "rank 0 alone writes the checkpoints");
    // Stop after epoch 1, resume on every rank from rank 0's checkpoint.
    const Run first = fit(&pg, 1, dir / "a");
    const Run resumed = fit(&pg, 2, dir / "a");
    expect(resumed.result.start_step == 3, "every rank resumes at step 3");
    std::vector<double> losses = first.losses;
    losses.insert(losses.end(), resumed.losses.begin(), resumed.losses.end());
    expect(losses == dp.losses, "the losses of fit + resumed fit equal the uninterrupted run bitwise");
    for (size_t i = 0; i < dp.params.size(); ++i)
      expect(same_bytes(resumed.params[i], dp.params[i]), "parameter " + std::to_string(i) + " bitwise after resume");
  });
}
