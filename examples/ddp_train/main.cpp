// ddp_train: the digits CNN (examples/digits_cnn) trained with data parallelism
// (dist::DataParallel): every rank holds a replica, trains on its share of each batch, and the
// gradients are averaged during backward.
//
//   mpirun -np 4 ddp_train [--epochs 10] ...    built with ember::mpi: one process per rank (MPI)
//   ddp_train --ranks 3 [--epochs 10] ...       otherwise: 3 ranks as threads of this process
//
// --batch-size is per rank (the global batch is ranks x batch-size). data::DistributedSampler
// (drop_last) gives each rank its share of every epoch's shuffled order, the same count on every
// rank, so every rank runs the same number of steps. --zero 1 uses ZeRO-1 (dist::ZeroRedundancyOptimizer, the
// Adam state sharded over the ranks) instead of DataParallel + Adam; --zero 2 and --zero 3 use
// dist::FullyShardedDataParallel (ZeRO-2: gradients and Adam state sharded; ZeRO-3: the parameters
// too, gathered layer by layer as each layer runs) with Adam over each rank's shards. At the end
// every rank gathers the whole model (full_state_dict) for the accuracy and --save. CPU only (the MPI and thread
// process groups move CPU tensors). Rank 0 prints one JSON line at the end. A rank that fails
// makes the others raise DistributedError after --timeout-s seconds (default: EMBER_DIST_TIMEOUT_S,
// else 300): under MPI the first to time out prints it and aborts the job with status 75
// (MpiOptions::abort_on_timeout; EMBER_DIST_ABORT_ON_TIMEOUT=0: print it and exit 1), the thread
// ranks print it and exit 1 (--fail-rank R makes rank R stop at its third step, to see this happen).
//
// --save PATH: rank 0 writes the trained weights (safetensors; under MPI too, the other ranks do
// not write); --load PATH starts every rank from such a file (--epochs 0: only evaluates it).
//
// --device cpu (the default) | cuda | cuda:N | auto. On GPUs the gradients travel over NCCL, one
// process per GPU: `mpirun -np 2 ddp_train --device cuda` gives rank r the GPU r % (GPUs on its
// host) (cuda:N pins every rank to N). NCCL's one-process-many-GPUs mode needs one thread to issue
// every device's collectives, which DataParallel's per-rank backward hooks cannot do, so the
// thread ranks (--ranks) run on the CPU only and refuse a GPU. auto: the GPU under MPI when the
// build has NCCL and the host a GPU, else the CPU.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <thread>

#include <ember/data/distributed_sampler.hpp>
#include <ember/dist/data_parallel.hpp>
#include <ember/dist/fsdp.hpp>
#include <ember/dist/thread_group.hpp>
#include <ember/dist/zero.hpp>
#include <ember/ember.hpp>

#if defined(EMBER_EXAMPLE_MPI) && __has_include(<mpi.h>)
#include <ember/dist/mpi.hpp>
#define DDP_TRAIN_HAVE_MPI 1
#else
#define DDP_TRAIN_HAVE_MPI 0
#endif
#if DDP_TRAIN_HAVE_MPI && defined(EMBER_EXAMPLE_NCCL)
#include <ember/dist/nccl.hpp>
#define DDP_TRAIN_HAVE_NCCL 1
#else
#define DDP_TRAIN_HAVE_NCCL 0
#endif

#include "../common/args.hpp"
#include "../common/digits.hpp"
#include "../common/digits_cnn_model.hpp"
#include "../common/progress.hpp"

using namespace ember;

namespace {

struct Setup {
  int64_t epochs, batch;
  double lr;
  uint64_t seed;
  int zero;  // 0: DataParallel + Adam; 1: ZeRO-1; 2, 3: FullyShardedDataParallel of that stage
  int fail_rank;  // this rank stops (throws) at its third step: shows the failure path
  const examples::Digits* train;
  const examples::Digits* test;
  Device device = Device::cpu();  // where this rank's replica, data and collectives live
};

// One rank's training loop. Returns the JSON line on rank 0, "" elsewhere. With --zero 2|3 the
// wrapper owns the trained parameters' layout: `model` is replaced by an unwrapped copy of them.
std::string train_rank(dist::ProcessGroup& g, std::shared_ptr<nn::Sequential>& model, const Setup& s,
                       const std::string& backend) {
  const int rank = g.rank(), world = g.size();
  const examples::Digits& train = *s.train;
  auto x_train = Tensor<float>::from_vector(train.pixels, {train.n, 1, 8, 8}).to(s.device);
  auto y_train = Tensor<int64_t>::from_vector(train.labels, {train.n}).to(s.device);
  model->to(s.device);

  // Checks the replicas agree and broadcasts rank 0's weights. gradient_as_bucket_view: backward
  // writes the gradients straight into the buffers that are all-reduced (no copies in and out;
  // bench_ddp_overlap measures the difference); .grad from an earlier step is not kept.
  // FullyShardedDataParallel (--zero 2|3) also checks and broadcasts, then shards: every layer
  // with parameters is a unit.
  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
  if (s.zero >= 2)
    fsdp = std::make_unique<dist::FullyShardedDataParallel>(model, g, dist::FullyShardedOptions{.stage = s.zero});
  else
    dp = std::make_unique<dist::DataParallel>(model, g, dist::DataParallelOptions{.gradient_as_bucket_view = true});
  std::unique_ptr<optim::Adam> adam;
  std::unique_ptr<dist::ZeroRedundancyOptimizer> zero;
  if (s.zero == 1) {
    zero = std::make_unique<dist::ZeroRedundancyOptimizer>(model->parameters(), g, [&](std::vector<AnyTensor> ps) {
      return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = s.lr});
    });
  } else {
    adam = std::make_unique<optim::Adam>(fsdp ? fsdp->parameters() : model->parameters(), optim::AdamOptions{.lr = s.lr});
  }

  examples::Progress progress;
  double last_loss = 0;
  int64_t step = 0, step_count = 0;
  // The same shuffled order on every rank, cut to a multiple of the ranks (drop_last: every rank
  // runs the same number of steps); rank r reads positions r, r + R, ... of it.
  data::DistributedSampler sampler(train.n, world, rank, {.seed = s.seed, .drop_last = true});
  const int64_t per_rank = sampler.num_samples();
  for (int64_t epoch = 0; epoch < s.epochs; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    std::vector<int64_t> mine = sampler.indices();
    auto perm = Tensor<int64_t>::from_vector(mine).to(s.device);
    double epoch_loss = 0;
    int64_t batches = 0;
    for (int64_t b0 = 0; b0 < per_rank; b0 += s.batch) {
      if (rank == s.fail_rank && step_count == 2)
        throw std::runtime_error("--fail-rank: rank " + std::to_string(rank) + " stops here");
      ++step_count;
      auto idx = perm.slice(b0, std::min(per_rank, b0 + s.batch));
      auto x = index_select(x_train, 0, idx);
      auto loss = nn::functional::cross_entropy(fsdp ? (*fsdp)(x) : (*dp)(x), index_select(y_train, 0, idx));
      if (s.zero == 1) {
        zero->zero_grad();
        // ZeRO averages the gradients itself (reduce_scatter): skip DataParallel's all-reduce.
        auto guard = dp->no_sync();
        loss.backward();
        zero->step();
      } else {
        adam->zero_grad();
        loss.backward();  // the gradients are averaged (FSDP: reduce-scattered into the shards) here
        adam->step();
      }
      last_loss = loss.item();
      epoch_loss += last_loss;
      ++batches;
      if (rank == 0) progress.step(epoch, s.epochs, ++step, last_loss, idx.numel() * world);
    }
    AnyTensor mean_loss = Tensor<double>::from_vector({epoch_loss / static_cast<double>(batches)}).to(s.device);
    g.all_reduce(mean_loss, dist::ReduceOp::Avg);
    if (rank == 0)
      progress.epoch(epoch, s.epochs, "loss " + examples::num(mean_loss.to_double_vector()[0], 4), 5);
  }
  if (fsdp) {  // every rank: the unsharded parameters (a collective), into an unwrapped model
    const nn::StateDict full = fsdp->full_state_dict();
    fsdp.reset();
    model = examples::make_digits_cnn();
    model->to(s.device);
    model->load_state_dict(full);
  }
  if (rank != 0) return "";
  progress.finish();
  const double seconds = progress.seconds();
  auto x_test = Tensor<float>::from_vector(s.test->pixels, {s.test->n, 1, 8, 8}).to(s.device);
  auto y_test = Tensor<int64_t>::from_vector(s.test->labels, {s.test->n}).to(s.device);
  const double acc = examples::accuracy(*model, x_test, y_test);
  return examples::json_line({{"example", examples::quoted("ddp_train")},
                              {"backend", examples::quoted(backend)},
                              {"device", examples::quoted(s.device.str())},
                              {"ranks", std::to_string(world)},
                              {"optimizer", examples::quoted(s.zero == 0 ? "adam" : "zero" + std::to_string(s.zero) + "_adam")},
                              {"epochs", std::to_string(s.epochs)},
                              {"final_train_loss", examples::num(last_loss)},
                              {"test_accuracy", examples::num(acc, 4)},
                              {"seconds", examples::num(seconds, 4)},
                              {"samples_per_second", examples::num(progress.samples_per_second(), 6)}});
}

// The digits CNN, with the weights of --load PATH (a --save file) when given.
std::shared_ptr<nn::Sequential> make_model(const examples::Args& args) {
  auto model = examples::make_digits_cnn();
  if (!args.str("load").empty()) model->load(args.str("load"));
  return model;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args(argc, argv,
                      {{"device", "cpu"}, {"ranks", "2"}, {"epochs", "10"}, {"batch-size", "16"}, {"lr", "0.002"}, {"seed", "0"},
                       {"zero", "0"}, {"timeout-s", ""},
                       {"fail-rank", "-1"}, {"load", ""}});
  examples::Digits all = examples::load_digits(), train, test;
  const uint64_t seed = static_cast<uint64_t>(args.integer("seed"));
  examples::split_digits(all, 0.2, seed, train, test);
  Setup s{args.integer("epochs"), args.integer("batch-size"), args.real("lr"), seed, static_cast<int>(args.integer("zero")),
          static_cast<int>(args.integer("fail-rank")), &train, &test};
  EMBER_CHECK(s.zero >= 0 && s.zero <= 3, ValueError, "--zero must be 0 (DataParallel), 1, 2 or 3, got ", s.zero);
  dist::ProcessGroupOptions options;  // timeout: EMBER_DIST_TIMEOUT_S, else 300 s
  if (!args.str("timeout-s").empty())
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.real("timeout-s") * 1000.0));

  const std::string device_arg = args.str("device");
  auto wants_gpu = [&] {
    if (device_arg == "auto") return DDP_TRAIN_HAVE_NCCL && launched_by_mpi() && cuda::is_available();
    return args.device().is_cuda();  // validates cpu|cuda|cuda:N
  };
#if DDP_TRAIN_HAVE_MPI
  if (launched_by_mpi()) {
    auto pg = dist::init_from_environment(options);
    manual_seed(seed);
    if (wants_gpu()) {
#if DDP_TRAIN_HAVE_NCCL
      EMBER_CHECK(cuda::is_available(), DeviceError, "--device ", device_arg, " but no GPU is visible");
      const int n = cuda::device_count();
      const int index = device_arg == "cuda" || device_arg == "auto" ? pg->rank() % n : args.device().index();
      s.device = Device::cuda(index);
      dist::NcclOptions nccl_options;
      nccl_options.timeout = options.timeout;
      auto nccl = dist::NcclProcessGroup::create(*pg, index, nccl_options);
      auto model = make_model(args);
      std::string line = train_rank(*nccl, model, s, "nccl");
      if (pg->rank() == 0) args.save_model(*model);  // --save: rank 0 writes
      if (!line.empty()) std::printf("%s\n", line.c_str());
      return 0;
#else
      throw DeviceError("--device " + device_arg + " needs NCCL (a build with the CUDA backend)");
#endif
    }
    auto model = make_model(args);
    std::string line = train_rank(*pg, model, s, "mpi");
    if (pg->rank() == 0) args.save_model(*model);  // --save: rank 0 writes (the replicas are equal)
    if (!line.empty()) std::printf("%s\n", line.c_str());
    return 0;
  }
#else
  if (launched_by_mpi())
    std::fprintf(stderr, "ddp_train: started by an MPI launcher, but built without MPI: running one process "
                         "with --ranks threads (each MPI rank does the same)\n");
#endif

  if (device_arg != "auto" && wants_gpu())
    throw DeviceError("--device " + device_arg +
                      " needs one process per GPU (mpirun -np N ddp_train --device cuda); the thread ranks of "
                      "--ranks run on the CPU");
  const int ranks = static_cast<int>(args.integer("ranks"));
  auto groups = dist::ThreadProcessGroup::create(ranks, options);
  // The replicas are built here, one after the other (the default generator is shared); the
  // DataParallel constructor then broadcasts rank 0's weights anyway.
  std::vector<std::shared_ptr<nn::Sequential>> models;
  manual_seed(seed);
  for (int r = 0; r < ranks; ++r) models.push_back(make_model(args));
  std::vector<std::string> lines(static_cast<size_t>(ranks)), errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        lines[r] = train_rank(*groups[r], models[r], s, "threads");
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int r = 0; r < ranks; ++r)
    if (!errors[r].empty()) {
      std::fprintf(stderr, "ddp_train: rank %d: %s\n", r, errors[r].c_str());
      ++failed;
    }
  if (failed) return 1;
  args.save_model(*models[0]);  // --save: rank 0's replica (every replica holds the same weights)
  std::printf("%s\n", lines[0].c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ddp_train: %s\n", e.what());
  return 1;
}
