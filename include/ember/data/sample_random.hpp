#pragma once
// Random numbers keyed by (seed, epoch, sample index): a sample's random
// transform draws the same numbers whichever worker thread loads it, in whatever order, and after
// a resume. And the epoch permutation, keyed by (seed, epoch).
//
// Both are Philox4x32-10 (core/random.hpp) with the seed as key and the 128-bit counter
// {block, index low, index high, stream | epoch}, where stream separates the permutation's
// numbers from the transforms'. Epochs up to 2^28 and indices up to 2^64 are distinct.
#include <cstdint>
#include <utility>
#include <vector>

#include "ember/core/random.hpp"

namespace ember::data {

namespace detail {
inline constexpr uint32_t kStreamTransform = 1u << 28;
inline constexpr uint32_t kStreamPermutation = 2u << 28;
inline ::ember::detail::Philox4x32 data_philox(uint64_t seed, uint32_t stream, uint64_t epoch, uint64_t index,
                                               uint32_t block) {
  ::ember::detail::Philox4x32 ctr{{block, static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                   stream | (static_cast<uint32_t>(epoch) & 0x0FFFFFFFu)}};
  return ::ember::detail::philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
}  // namespace detail

// The random stream of one sample in one epoch. Cheap to make; not shared between threads.
class SampleRandom {
 public:
  SampleRandom(uint64_t seed, uint64_t epoch, int64_t index)
      : seed_(seed), epoch_(epoch), index_(static_cast<uint64_t>(index)) {}

  uint32_t next_u32() {
    if (lane_ == 4) {
      block_ = detail::data_philox(seed_, detail::kStreamTransform, epoch_, index_, counter_++);
      lane_ = 0;
    }
    return block_.v[lane_++];
  }
  uint64_t next_u64() {
    const uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi] (inclusive; bias below 2^-30 for ranges under 2^34).
  int64_t randint(int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + static_cast<int64_t>(next_u64() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool bernoulli(double p) { return uniform() < p; }

  uint64_t seed() const { return seed_; }
  uint64_t epoch() const { return epoch_; }
  int64_t index() const { return static_cast<int64_t>(index_); }

 private:
  uint64_t seed_, epoch_, index_;
  uint32_t counter_ = 0;
  int lane_ = 4;
  ::ember::detail::Philox4x32 block_{};
};

// The epoch's order of [0, n): Fisher-Yates with 64-bit draws from Philox keyed by (seed, epoch).
inline std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  uint32_t block = 0;
  uint64_t high = 0;  // the 128-bit counter's index words carry the block's upper bits
  ::ember::detail::Philox4x32 r{};
  int lane = 4;
  auto next64 = [&]() -> uint64_t {
    if (lane == 4) {
      r = detail::data_philox(seed, detail::kStreamPermutation, epoch, high, block);
      if (++block == 0) ++high;
      lane = 0;
    }
    const uint64_t v = (static_cast<uint64_t>(r.v[lane]) << 32) | r.v[lane + 1];
    lane += 2;
    return v;
  };
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(next64() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

}  // namespace ember::data
