// The MPI program of ember's package tests (tests/package, package.find_package_mpi): a consumer
// that takes ember::mpi from an installed ember (find_package(ember COMPONENTS mpi)), joins the
// process group of its launch (one rank when started directly, N under mpirun) and all-reduces a
// small float tensor. Rank r contributes (r + 1) * [1 2 3 4]; every rank checks the sum against
// the value it computes itself, rank 0 prints it, and any wrong value exits non-zero.
#include <ember/dist/mpi.hpp>
#include <ember/version.hpp>

#include <cstdio>
#include <vector>

int main() {
  using namespace ember;
  static_assert(dist::kHaveMpi, "ember::mpi did not put mpi.h on the include path");
  auto pg = dist::init_from_environment();
  const int r = pg->rank(), n = pg->size();

  std::vector<float> mine;
  for (int i = 1; i <= 4; ++i) mine.push_back(static_cast<float>(i * (r + 1)));
  FloatTensor t = FloatTensor::from_vector(mine);
  pg->all_reduce(t, dist::ReduceOp::Sum);

  double total = 0;
  for (float v : t.to_vector()) total += v;
  const double expected = 10.0 * n * (n + 1) / 2;  // (1 + 2 + 3 + 4) * (1 + 2 + ... + n)
  if (total != expected) {
    std::fprintf(stderr, "ember mpi consumer, rank %d: wrong all_reduce sum %g, expected %g\n", r, total, expected);
    return 1;
  }
  if (r == 0) std::printf("ember %s mpi consumer: %d rank(s), sum(all_reduce) = %g\n", kVersionString, n, total);
  return 0;
}
