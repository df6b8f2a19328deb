// data::DistributedSampler (torch.utils.data.DistributedSampler semantics), without MPI: every
// rank's share computed in one process. Disjoint shares that cover the epoch, the same permutation
// for the same (seed, epoch), another one for another epoch, padding and drop_last sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "ember/data/distributed_sampler.hpp"

using ember::data::DistributedSampler;
using ember::data::DistributedSamplerOptions;

namespace {
std::vector<std::vector<int64_t>> all_shares(int64_t n, int replicas, DistributedSamplerOptions o, uint64_t epoch = 0) {
  std::vector<std::vector<int64_t>> shares;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, o);
    s.set_epoch(epoch);
    shares.push_back(s.indices());
  }
  return shares;
}
}  // namespace

TEST_CASE("DistributedSampler: shares are disjoint and cover the epoch when n divides evenly", "[sampler]") {
  auto shares = all_shares(12, 3, {});
  std::vector<int64_t> all;
  for (auto& s : shares) {
    CHECK(s.size() == 4);
    all.insert(all.end(), s.begin(), s.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expect(12);
  std::iota(expect.begin(), expect.end(), 0);
  CHECK(all == expect);
}

TEST_CASE("DistributedSampler: padding repeats the beginning of the order", "[sampler]") {
  const int64_t n = 10;
  const int R = 4;
  auto shares = all_shares(n, R, {});
  DistributedSampler s0(n, R, 0);
  CHECK(s0.num_samples() == 3);
  CHECK(s0.total_size() == 12);
  std::vector<int64_t> perm = s0.permutation();
  std::set<int64_t> seen;
  for (int r = 0; r < R; ++r) {
    REQUIRE(shares[r].size() == 3);
    for (size_t k = 0; k < shares[r].size(); ++k) {
      size_t pos = static_cast<size_t>(r) + k * R;  // position in the padded order
      CHECK(shares[r][k] == perm[pos % n]);
      seen.insert(shares[r][k]);
    }
  }
  CHECK(seen.size() == static_cast<size_t>(n));  // every sample at least once
}

TEST_CASE("DistributedSampler: drop_last cuts the tail and keeps shares disjoint", "[sampler]") {
  auto shares = all_shares(10, 4, {.shuffle = true, .seed = 3, .drop_last = true});
  std::set<int64_t> seen;
  for (auto& s : shares) {
    CHECK(s.size() == 2);
    for (int64_t i : s) CHECK(seen.insert(i).second);
  }
  CHECK(seen.size() == 8);
  DistributedSampler s(10, 4, 0, {.drop_last = true});
  CHECK(s.total_size() == 8);
}

TEST_CASE("DistributedSampler: fewer samples than replicas pads by repeating", "[sampler]") {
  auto shares = all_shares(2, 5, {.shuffle = false});
  for (int r = 0; r < 5; ++r) {
    REQUIRE(shares[r].size() == 1);
    CHECK(shares[r][0] == r % 2);
  }
  auto dropped = all_shares(2, 5, {.drop_last = true});
  for (auto& s : dropped) CHECK(s.empty());
}

TEST_CASE("DistributedSampler: without shuffle rank r takes r, r+R, r+2R", "[sampler]") {
  DistributedSampler s(7, 3, 1, {.shuffle = false});
  CHECK(s.indices() == std::vector<int64_t>{1, 4, 0});
}

TEST_CASE("DistributedSampler: same seed and epoch give the same permutation, on every rank", "[sampler]") {
  DistributedSampler a(1000, 4, 0, {.seed = 42});
  DistributedSampler b(1000, 4, 3, {.seed = 42});
  a.set_epoch(5);
  b.set_epoch(5);
  CHECK(a.permutation() == b.permutation());
  std::vector<int64_t> p = a.permutation();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expect(1000);
  std::iota(expect.begin(), expect.end(), 0);
  CHECK(sorted == expect);  // a permutation
  CHECK(p != expect);       // shuffled
}

TEST_CASE("DistributedSampler: different epochs and seeds give different orders", "[sampler]") {
  DistributedSampler s(1000, 2, 0, {.seed = 7});
  s.set_epoch(0);
  auto e0 = s.indices();
  s.set_epoch(1);
  auto e1 = s.indices();
  CHECK(e0 != e1);
  DistributedSampler t(1000, 2, 0, {.seed = 8});
  CHECK(t.indices() != e0);
  // seed + epoch: (seed 7, epoch 1) is (seed 8, epoch 0), as in torch.
  CHECK(t.indices() == e1);
}

TEST_CASE("DistributedSampler: bad arguments are ValueErrors", "[sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), ember::ValueError);
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), ember::ValueError);
  CHECK_THROWS_AS(DistributedSampler(-1, 2, 0), ember::ValueError);
  CHECK(DistributedSampler(0, 2, 1).indices().empty());
}
