// The program of ember's package tests (tests/package): a consumer that takes ember in through
// find_package, add_subdirectory or a plain `g++ -std=c++20 -I<include>` (header-only, or with the
// compiled library), builds a tensor, runs an op through the kernel table and prints a computed
// value and how ember was built, which the test checks; it also returns non-zero on a wrong value.
#include <ember/ember.hpp>

#include <cstdio>

int main() {
  using namespace ember;
  // a = [[1 2 3] [4 5 6]], b = [[1 2] [3 4] [5 6]]: a @ b = [[22 28] [49 64]] (CBLAS or plain GEMM).
  auto a = Tensor<float>::arange(1, 7).reshape({2, 3});
  auto b = Tensor<float>::arange(1, 7).reshape({3, 2});
  auto c = matmul(a, b);
  const double total = sum(c).item();

  double expected = 0;  // the same sum, computed here independently of ember
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k) expected += (i * 3 + k + 1) * (k * 2 + j + 1);

#if defined(EMBER_HAVE_CBLAS)
  const char* cblas = "yes";
#else
  const char* cblas = "no";
#endif
  const BuildInfo build = build_info();
  std::printf("ember %s consumer: sum(a @ b) = %g (cblas %s, cuda backend %s, %s)\n", kVersionString, total, cblas,
              ember::cuda::is_compiled() ? "compiled" : "absent",
              build.compiled_library ? "compiled library" : "header-only");
  std::printf("%s\n", build.str().c_str());
  // build_info() agrees with how this file was compiled (all files of a program agree).
  bool compiled = false, openmp = false, onednn = false;
#if defined(EMBER_COMPILED_LIB)
  compiled = true;
#endif
#if defined(_OPENMP)
  openmp = true;
#endif
#if defined(EMBER_HAVE_ONEDNN)
  onednn = true;
#endif
  if (build.compiled_library != compiled || build.blas != (cblas[0] == 'y') || build.openmp != openmp ||
      build.onednn_conv != onednn || build.cuda_compiled != ember::cuda::is_compiled() ||
      build.version != kVersionString) {
    std::fprintf(stderr, "ember consumer: build_info() does not describe this build: %s\n", build.str().c_str());
    return 1;
  }
  if (total != expected) {
    std::fprintf(stderr, "ember consumer: wrong result %g, expected %g\n", total, expected);
    return 1;
  }
  return 0;
}
