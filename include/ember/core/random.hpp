#pragma once
// One random stream everywhere: the counter-based Philox4x32-10 generator.
// Element i of a draw at (seed, offset) uses counter block (offset + i / 4) and lane i % 4, so the
// CPU and CUDA backends produce the same numbers, and a draw can be replayed from (seed, offset).
#include <cmath>
#include <cstdint>
#include <mutex>

#include "ember/core/macros.hpp"

namespace ember {

namespace detail {
struct Philox4x32 {
  uint32_t v[4];
};

EMBER_HD inline void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11)
// on a full 128-bit counter and 64-bit key.
EMBER_HD inline Philox4x32 philox4x32_10(Philox4x32 ctr, uint32_t k0, uint32_t k1) {
  uint32_t c0 = ctr.v[0], c1 = ctr.v[1], c2 = ctr.v[2], c3 = ctr.v[3];
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, hi0, lo0);
    mulhilo32(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// ember's use: the counter is the 64-bit block number, the key the 64-bit seed.
EMBER_HD inline Philox4x32 philox4x32_10(uint64_t seed, uint64_t block) {
  Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

EMBER_HD inline uint32_t philox_lane(uint64_t seed, uint64_t offset, int64_t i) {
  Philox4x32 r = philox4x32_10(seed, offset + static_cast<uint64_t>(i) / 4u);
  return r.v[i % 4];
}

// [0, 1) with 24 random bits.
EMBER_HD inline float philox_uniform(uint64_t seed, uint64_t offset, int64_t i) {
  return static_cast<float>(philox_lane(seed, offset, i) >> 8) * 5.9604644775390625e-8f;
}

// Standard normal by Box-Muller over the lane pair (0,1) or (2,3) of element i's block.
EMBER_HD inline double philox_normal(uint64_t seed, uint64_t offset, int64_t i) {
  Philox4x32 r = philox4x32_10(seed, offset + static_cast<uint64_t>(i) / 4u);
  int lane = static_cast<int>(i % 4);
  int pair = lane & ~1;
  double u1 = (static_cast<double>(r.v[pair] >> 8) + 1.0) * 5.9604644775390625e-8;  // (0, 1]
  double u2 = static_cast<double>(r.v[pair + 1] >> 8) * 5.9604644775390625e-8;      // [0, 1)
  double rad = sqrt(-2.0 * log(u1));
  double theta = 6.283185307179586 * u2;
  return (lane & 1) ? rad * sin(theta) : rad * cos(theta);
}
}  // namespace detail

// A generator's whole state: the seed and the offset (in 4-number blocks) of its next draw.
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  bool operator==(const GeneratorState&) const = default;
};

// A seed and an offset (in 4-number blocks) that advances with every draw. The (seed, offset) pair
// is the whole state, so a checkpoint can store it exactly and a draw can be replayed from it.
// Thread-safe: draw() takes the seed and reserves the blocks under one lock, so two threads
// drawing from one generator never get the same numbers (which thread gets which depends on the
// interleaving; see "Random state and threads" below for reproducible concurrent use).
class Generator {
 public:
  static constexpr uint64_t kDefaultSeed = 0x853c49e6748fea9bULL;
  explicit Generator(uint64_t seed = kDefaultSeed) : seed_(seed) {}
  explicit Generator(GeneratorState state) : seed_(state.seed), offset_(state.offset) {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  void manual_seed(uint64_t seed) { set_state({seed, 0}); }
  uint64_t seed() const { return state().seed; }
  uint64_t offset() const { return state().offset; }
  // Both halves read together (reading seed() then offset() may straddle another thread's draw).
  GeneratorState state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {seed_, offset_};
  }
  void set_state(uint64_t seed, uint64_t offset) { set_state({seed, offset}); }
  void set_state(GeneratorState st) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = st.seed;
    offset_ = st.offset;
  }
  // Reserves the blocks for n numbers: returns the seed and the offset of the first block.
  GeneratorState draw(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    GeneratorState at{seed_, offset_};
    offset_ += (static_cast<uint64_t>(n) + 3u) / 4u;
    return at;
  }
  // Same, the offset only (callers that then read seed() race with a concurrent manual_seed:
  // prefer draw()).
  uint64_t reserve(int64_t n) { return draw(n).offset; }

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// ---- Random state and threads (docs/api.md, "Threads") ----
// default_generator() is the calling thread's *current* generator: the one a GeneratorScope
// installed on this thread, else the single process-wide generator.
// - The process-wide generator is shared by every thread that has no scope of its own. Draws
//   from it never race and never repeat (each reserves its own blocks), but with several threads
//   drawing, which thread gets which numbers depends on the scheduling: not reproducible.
// - A thread that must be reproducible while others draw (a training on its own thread, a
//   ThreadProcessGroup rank, a data transform worker) owns a Generator and installs it for its
//   scope: every default draw on that thread (rand, randn, dropout, nn::init) then comes from it,
//   and no other thread sees it.
// - nn::recompute (nn/recompute.hpp) replays its recomputation from a copy of the state
//   its forward started from, installed with a GeneratorScope on the backward thread: it never
//   rewinds the shared generator.
// - CheckpointManager saves and restores default_generator() of the thread that calls it, i.e.
//   the training thread's own generator when it has one.
namespace detail {
inline Generator& process_generator() {
  static Generator g;
  return g;
}
inline Generator*& thread_generator_slot() {
  thread_local Generator* current = nullptr;
  return current;
}
}  // namespace detail

inline Generator& default_generator() {
  Generator* g = detail::thread_generator_slot();
  return g ? *g : detail::process_generator();
}
// Seeds the calling thread's current generator (the process-wide one when the thread has none).
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

// Makes `gen` the calling thread's default generator while alive (nests; restores the previous
// one on destruction, also during unwinding). `gen` must outlive the scope; the scope must end on
// the thread that created it.
class GeneratorScope {
 public:
  explicit GeneratorScope(Generator& gen) : previous_(detail::thread_generator_slot()) {
    detail::thread_generator_slot() = &gen;
  }
  ~GeneratorScope() { detail::thread_generator_slot() = previous_; }
  GeneratorScope(const GeneratorScope&) = delete;
  GeneratorScope& operator=(const GeneratorScope&) = delete;

 private:
  Generator* previous_;
};

}  // namespace ember
