#pragma once
// How this ember was built: the settings that change which kernels run and so the last bits of
// results (README "Using ember in a project" lists the flags and which must agree across files).
//
//   std::printf("%s\n", ember::build_info().str().c_str());
//   // ember 0.1.0, compiled library, BLAS OpenBLAS (OpenMP build, kernel Zen), fp32 GEMM oneDNN sgemm
//   // (A-transposed on >1 thread: BLAS), oneDNN conv yes, OpenMP yes, CUDA backend no
//
// In the compiled library (EMBER_COMPILED_LIB) the answer is the library's, where the kernels are
// compiled; header-only it is the calling file's, which in a correct program is every file's.
#include <string>

#include "ember/backend/cpu/gemm_choice.hpp"
#include "ember/backend/cpu/parallel.hpp"
#include "ember/core/backend_registry.hpp"
#include "ember/core/macros.hpp"
#include "ember/version.hpp"

namespace ember {

struct BuildInfo {
  std::string version;            // ember's, "0.1.0"
  bool compiled_library = false;  // EMBER_COMPILED_LIB: the library compiled once; false: header-only
  bool blas = false;              // EMBER_HAVE_CBLAS: CPU GEMM through a BLAS (else the plain loop)
  std::string blas_library;       // "OpenBLAS (OpenMP build, kernel Zen)", another BLAS, "none"
  bool onednn_gemm = false;       // EMBER_HAVE_ONEDNN and EMBER_ONEDNN_GEMM: fp32 GEMM through oneDNN
  bool onednn_conv = false;       // EMBER_HAVE_ONEDNN: fp32 convolutions through oneDNN
  std::string fp32_gemm;          // which library takes an fp32 GEMM (cpu::sgemm_libraries())
  bool openmp = false;            // -fopenmp: the CPU kernels are threaded
  bool cuda_compiled = false;     // the CUDA backend (ember_cuda.cu) is linked into the program
  // One line with all of the above.
  std::string str() const {
    auto yes_no = [](bool b) { return b ? "yes" : "no"; };
    return "ember " + version + (compiled_library ? ", compiled library" : ", header-only") + ", BLAS " +
           blas_library + ", fp32 GEMM " + fp32_gemm + ", oneDNN conv " + yes_no(onednn_conv) + ", OpenMP " +
           yes_no(openmp) + ", CUDA backend " + yes_no(cuda_compiled);
  }
};

// This program's build (see the top of this file for whose settings they are).
EMBER_LIB_INLINE BuildInfo build_info();

namespace detail {
// The settings of the file that calls it (the library's own source calls it in compiled mode).
inline BuildInfo build_info_of_this_file() {
  BuildInfo b;
  b.version = kVersionString;
#if defined(EMBER_COMPILED_LIB)
  b.compiled_library = true;
#endif
#if defined(EMBER_HAVE_CBLAS)
  b.blas = true;
  b.blas_library = "sgemm_/dgemm_ of a BLAS other than OpenBLAS";
  const std::string core = blas_core_name();  // set only where OpenBLAS is linked
  if (!core.empty()) {
    b.blas_library = "OpenBLAS (";
#if defined(EMBER_OPENBLAS_WEAK)
    if (openblas_get_config) {
      const std::string config = openblas_get_config() ? openblas_get_config() : "";
      if (config.find("USE_OPENMP") != std::string::npos) b.blas_library += "OpenMP build, ";
    }
#endif
    b.blas_library += "kernel " + core + ")";
  }
#else
  b.blas_library = "none";
#endif
#if defined(EMBER_HAVE_ONEDNN)
  b.onednn_conv = true;
#endif
#if defined(EMBER_CPU_GEMM_ONEDNN)
  b.onednn_gemm = true;
#endif
  b.fp32_gemm = cpu::sgemm_libraries();
  b.openmp = has_openmp();
  b.cuda_compiled = cuda::is_compiled();
  return b;
}
}  // namespace detail

#if !defined(EMBER_COMPILED_LIB)
inline BuildInfo build_info() { return detail::build_info_of_this_file(); }
#endif

}  // namespace ember
