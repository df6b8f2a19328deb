#pragma once
// data::DistributedSampler: which dataset indices this rank reads in an epoch, with the semantics of
// torch.utils.data.DistributedSampler:
// - the epoch order is a permutation of [0, n) drawn from (seed + epoch) with ember's Philox
//   generator (Fisher-Yates), so every rank computes the same permutation without communicating
//   (shuffle = false: the identity order);
// - unless drop_last, the order is padded by repeating its beginning up to a multiple of
//   num_replicas (every rank gets the same number of samples, some samples appear twice);
//   with drop_last the tail is cut to a multiple of num_replicas instead;
// - rank r takes elements r, r + R, r + 2R, ... of that order.
// Call set_epoch(e) at the start of every epoch, or every epoch has the same order.
#include <cstdint>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/random.hpp"

namespace ember::data {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {})
      : n_(dataset_size), replicas_(num_replicas), rank_(rank), options_(options) {
    EMBER_CHECK(dataset_size >= 0, ValueError, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size);
    EMBER_CHECK(num_replicas >= 1, ValueError, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
    EMBER_CHECK(rank >= 0 && rank < num_replicas, ValueError, "DistributedSampler: rank ", rank,
                " is not in [0, ", num_replicas, ")");
    if (options_.drop_last) {
      num_samples_ = n_ / replicas_;
    } else {
      num_samples_ = (n_ + replicas_ - 1) / replicas_;
    }
    total_size_ = num_samples_ * replicas_;
  }

  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  // Samples this rank gets per epoch (the same on every rank).
  int64_t num_samples() const { return num_samples_; }
  int64_t size() const { return num_samples_; }
  // Samples all ranks get together per epoch (num_samples() * num_replicas).
  int64_t total_size() const { return total_size_; }
  int num_replicas() const { return replicas_; }
  int rank() const { return rank_; }
  const DistributedSamplerOptions& options() const { return options_; }

  // The epoch's order of all n indices (before padding / cutting), the same on every rank.
  std::vector<int64_t> permutation() const {
    std::vector<int64_t> order(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) order[static_cast<size_t>(i)] = i;
    if (!options_.shuffle || n_ < 2) return order;
    Generator gen(options_.seed + epoch_);
    // Two 32-bit lanes per swap: a 64-bit draw, reduced to [0, i] (bias below 2^-30 for any n
    // that fits in memory).
    const uint64_t offset = gen.reserve(2 * n_);
    int64_t k = 0;
    for (int64_t i = n_ - 1; i > 0; --i, k += 2) {
      uint64_t hi = ember::detail::philox_lane(gen.seed(), offset, k);
      uint64_t lo = ember::detail::philox_lane(gen.seed(), offset, k + 1);
      uint64_t r = (hi << 32) | lo;
      int64_t j = static_cast<int64_t>(r % static_cast<uint64_t>(i + 1));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    return order;
  }

  // This rank's indices for the current epoch, in order.
  std::vector<int64_t> indices() const {
    std::vector<int64_t> order = permutation();
    if (options_.drop_last) {
      order.resize(static_cast<size_t>(total_size_));
    } else if (n_ > 0) {
      // Pad by repeating the beginning (as many times as needed when n < num_replicas).
      const size_t base = order.size();
      for (size_t i = 0; order.size() < static_cast<size_t>(total_size_); ++i) order.push_back(order[i % base]);
    }
    std::vector<int64_t> mine;
    mine.reserve(static_cast<size_t>(num_samples_));
    for (int64_t i = rank_; i < total_size_; i += replicas_) mine.push_back(order[static_cast<size_t>(i)]);
    return mine;
  }

 private:
  int64_t n_;
  int replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  uint64_t epoch_ = 0;
  int64_t num_samples_ = 0;
  int64_t total_size_ = 0;
};

}  // namespace ember::data
