// Why MpiProcessGroup runs its collectives on a communication thread: plain MPI, no ember.
//   mpirun -np 2 ./build/benchmarks/bench_mpi_progress [--sleep] [--rounds N]
// An emulated data-parallel step: compute in 4 chunks, and after each chunk an all-reduce of a
// 2 MB bucket starts; the step ends when all 4 are done. Five ways to run the all-reduces:
//   blocking after    - MPI_Allreduce x 4 after the compute (no overlap: the reference),
//   test per chunk    - MPI_Iallreduce, then MPI_Test on the pending ones after every chunk,
//   comm thread       - a thread runs MPI_Allreduce for each bucket in order (ember's choice),
//   polling thread    - MPI_Iallreduce, a thread polls MPI_Test (yield between polls),
//   polling + sleep   - the same, sleeping 100 us between polls.
// --sleep makes the compute a sleep (an accelerator computing while the host waits); without
// it the compute is a CPU loop that keeps a core busy. Reported: the median step and the share of
// the all-reduce time hidden, (blocking after - variant) / (blocking after - compute only).
// Open MPI's mpi_yield_when_idle is 1 unless set (--mca mpi_yield_when_idle 0), as under ember.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBuckets = 4;
constexpr int kBucketFloats = 1 << 19;  // 2 MB
bool g_sleep = false;

// About 4 ms of work: a sleep, or a CPU loop over a small matrix product.
void compute_chunk() {
  if (g_sleep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(4));
    return;
  }
  static std::vector<float> a(128 * 128, 1.0f), b(128 * 128, 0.5f), c(128 * 128);
  for (int rep = 0; rep < 8; ++rep)
    for (int i = 0; i < 128; ++i)
      for (int k = 0; k < 128; ++k)
        for (int j = 0; j < 128; ++j) c[i * 128 + j] += a[i * 128 + k] * b[k * 128 + j];
}

std::vector<std::vector<float>> g_buf(kBuckets, std::vector<float>(kBucketFloats, 1.0f));

void blocking_allreduce(int b) {
  MPI_Allreduce(MPI_IN_PLACE, g_buf[b].data(), kBucketFloats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}
void start_allreduce(int b, MPI_Request* r) {
  MPI_Iallreduce(MPI_IN_PLACE, g_buf[b].data(), kBucketFloats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r);
}

// Runs blocking all-reduces, in order, on its own thread.
class CommThread {
 public:
  CommThread() : t_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_one();
    t_.join();
  }
  void post(int b) {
    {
      std::lock_guard<std::mutex> l(m_);
      q_.push_back(b);
      ++issued_;
    }
    cv_.notify_one();
  }
  void wait_all() {
    std::unique_lock<std::mutex> l(m_);
    done_cv_.wait(l, [&] { return done_ == issued_; });
  }

 private:
  void loop() {
    while (true) {
      int b;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        b = q_.front();
        q_.pop_front();
      }
      blocking_allreduce(b);
      {
        std::lock_guard<std::mutex> l(m_);
        ++done_;
      }
      done_cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::deque<int> q_;
  int issued_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread t_;
};

// Polls the non-blocking all-reduces started by post() on its own thread.
class PollingThread {
 public:
  explicit PollingThread(int sleep_us) : sleep_us_(sleep_us), t_([this] { loop(); }) {}
  ~PollingThread() {
    stop_ = true;
    t_.join();
  }
  void post(int b) {
    std::lock_guard<std::mutex> l(m_);
    reqs_.emplace_back();
    start_allreduce(b, &reqs_.back());
    ++pending_;
  }
  void wait_all() {
    while (pending_.load() > 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
    std::lock_guard<std::mutex> l(m_);
    reqs_.clear();
  }

 private:
  void loop() {
    while (!stop_) {
      {
        std::lock_guard<std::mutex> l(m_);
        for (auto& r : reqs_) {
          if (r == MPI_REQUEST_NULL) continue;
          int flag = 0;
          MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          if (flag) --pending_;
        }
      }
      if (pending_.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // idle
      else if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
      else std::this_thread::yield();
    }
  }
  int sleep_us_;
  std::mutex m_;
  std::deque<MPI_Request> reqs_;  // a deque: requests keep their address as it grows
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::thread t_;
};

}  // namespace

int main(int argc, char** argv) {
  // As ember does when it initialises MPI: Open MPI yields the core while it busy-waits (the
  // thread variants put a second thread into MPI next to the computing one).
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rounds = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sleep") g_sleep = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (rank == 0) std::printf("MPI_THREAD_MULTIPLE is not provided: the thread variants cannot run\n");
    MPI_Finalize();
    return 1;
  }
  CommThread comm;
  PollingThread poll_yield(0), poll_sleep(100);
  struct Variant {
    const char* name;
    std::function<void()> step;
    std::vector<double> ms;
  };
  std::vector<Variant> variants = {
      {"compute only", [] { for (int b = 0; b < kBuckets; ++b) compute_chunk(); }, {}},
      {"blocking after", [] {
         for (int b = 0; b < kBuckets; ++b) compute_chunk();
         for (int b = 0; b < kBuckets; ++b) blocking_allreduce(b);
       }, {}},
      {"test per chunk", [] {
         std::vector<MPI_Request> reqs;
         reqs.reserve(kBuckets);
         for (int b = 0; b < kBuckets; ++b) {
           compute_chunk();
           reqs.emplace_back();
           start_allreduce(b, &reqs.back());
           for (auto& r : reqs) {
             int flag = 0;
             MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
           }
         }
         MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
       }, {}},
      {"comm thread", [&] {
         for (int b = 0; b < kBuckets; ++b) {
           compute_chunk();
           comm.post(b);
         }
         comm.wait_all();
       }, {}},
      {"polling thread", [&] {
         for (int b = 0; b < kBuckets; ++b) {
           compute_chunk();
           poll_yield.post(b);
         }
         poll_yield.wait_all();
       }, {}},
      {"polling + sleep 100 us", [&] {
         for (int b = 0; b < kBuckets; ++b) {
           compute_chunk();
           poll_sleep.post(b);
         }
         poll_sleep.wait_all();
       }, {}},
  };
  for (int r = 0; r < rounds + 2; ++r)
    for (auto& v : variants) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      v.step();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (r >= 2) v.ms.push_back(ms);
    }
  // The slowest rank's median of each variant.
  std::vector<double> med;
  for (auto& v : variants) {
    std::sort(v.ms.begin(), v.ms.end());
    med.push_back(v.ms[v.ms.size() / 2]);
  }
  MPI_Allreduce(MPI_IN_PLACE, med.data(), static_cast<int>(med.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::printf("%d ranks, %d buckets of 2 MB, compute: %s, slowest rank's median of %d rounds\n", size, kBuckets,
                g_sleep ? "sleep (an accelerator)" : "CPU loop", rounds);
    const double comm_ms = med[1] - med[0];
    for (size_t i = 0; i < variants.size(); ++i) {
      std::printf("  %-24s %8.2f ms", variants[i].name, med[i]);
      if (i >= 2) std::printf("   %4.0f%% hidden", comm_ms > 0 ? 100.0 * (med[1] - med[i]) / comm_ms : 0.0);
      std::printf("\n");
    }
  }
  MPI_Finalize();
  return 0;
}
