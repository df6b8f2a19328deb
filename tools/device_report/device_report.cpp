// ember_device_report: one screen, in about a second, of what this machine's GPU stack really is:
// the driver and runtime versions, the cuBLAS, cuBLASLt, cuDNN and NCCL versions together with the
// file each was loaded from, every device's properties, whether it supports stream-ordered memory
// pools (ember's allocator needs them), and why ember sees no device when it sees none. The GPU
// check (tools/gpu-check.sh) runs it before building anything else, so that a wrong library on
// LD_LIBRARY_PATH or a missing driver is known in the first minute.
//
//   ember_device_report [--allow-no-gpu]
// Exit status: 0 when at least one device works and every library loaded (or with --allow-no-gpu,
// whenever the report could be printed: CI runs it that way on machines without a GPU); 1 otherwise.
//
// Only the CUDA runtime is linked. The libraries are opened with dlopen from the files this build
// found (EMBER_REPORT_* from tools/device_report/CMakeLists.txt), then by soname, so that one
// missing library is a line of the report rather than a loader error before main.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ember/backend/cuda/runtime.hpp>

#ifndef EMBER_REPORT_CUBLAS
#define EMBER_REPORT_CUBLAS ""
#endif
#ifndef EMBER_REPORT_CUBLASLT
#define EMBER_REPORT_CUBLASLT ""
#endif
#ifndef EMBER_REPORT_CUDNN
#define EMBER_REPORT_CUDNN ""
#endif
#ifndef EMBER_REPORT_NCCL
#define EMBER_REPORT_NCCL ""
#endif

namespace {

std::string cuda_version(int v) {  // 13000 -> "13.0"
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// The file a loaded symbol lives in (dladdr), or "?".
std::string file_of(const void* symbol) {
  Dl_info info{};
  if (!symbol || !dladdr(symbol, &info) || !info.dli_fname) return "?";
  std::string f = info.dli_fname;
  if (char* real = realpath(info.dli_fname, nullptr)) {  // the versioned file behind a symlink
    if (f != real) f += std::string(" (") + real + ")";
    std::free(real);
  }
  return f;
}

// Opens the first of `names` that loads; `tried` collects each failure's dlerror().
void* open_first(const std::vector<std::string>& names, std::string& tried) {
  for (const std::string& n : names) {
    if (n.empty()) continue;
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    tried += "\n      " + n + ": " + (e ? e : "dlopen failed");
  }
  return nullptr;
}

int failures = 0;

void line(const char* key, const std::string& value) { std::printf("%-13s: %s\n", key, value.c_str()); }

// One library: its version (from `version`, given the looked-up symbol) and where it came from.
template <class Version>
void report_library(const char* key, const std::vector<std::string>& names, const char* symbol, Version version) {
  std::string tried;
  void* h = open_first(names, tried);
  if (!h) {
    line(key, "NOT LOADED; tried:" + tried);
    ++failures;
    return;
  }
  void* sym = dlsym(h, symbol);
  if (!sym) {
    line(key, std::string("loaded from ") + file_of(h) + " but it has no " + symbol);
    ++failures;
    return;
  }
  line(key, version(sym) + " from " + file_of(sym));
}

// Every loaded object whose file name contains one of `parts` (the driver, the runtime).
void report_loaded(const char* key, const char* part) {
  struct Ctx {
    const char* part;
    std::string found;
  } ctx{part, ""};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) {
        auto* c = static_cast<Ctx*>(p);
        if (info->dlpi_name && std::strstr(info->dlpi_name, c->part))
          c->found += (c->found.empty() ? "" : ", ") + std::string(info->dlpi_name);
        return 0;
      },
      &ctx);
  line(key, ctx.found.empty() ? std::string("not loaded") : ctx.found);
}

std::string bytes_gib(size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

int attribute(cudaDeviceAttr a, int dev) {
  int v = -1;
  if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return v;
}

// One device: properties, memory, and a 1 MiB cudaMallocAsync on a fresh stream.
bool report_device(int dev) {
  cudaDeviceProp p{};
  if (cudaError_t e = cudaGetDeviceProperties(&p, dev); e != cudaSuccess) {
    (void)cudaGetLastError();
    std::printf("cuda:%d       : cudaGetDeviceProperties failed: %s\n", dev, cudaGetErrorString(e));
    return false;
  }
  bool ok = true;
  std::printf("cuda:%d       : %s, sm_%d%d, %d SMs, %s, bus %04x:%02x:%02x\n", dev, p.name, p.major, p.minor,
              p.multiProcessorCount, bytes_gib(p.totalGlobalMem).c_str(), p.pciDomainID, p.pciBusID, p.pciDeviceID);
  std::printf("  clocks     : SM %d MHz, memory %d MHz, bus %d bits, L2 %d MiB, ECC %s\n",
              attribute(cudaDevAttrClockRate, dev) / 1000, attribute(cudaDevAttrMemoryClockRate, dev) / 1000,
              attribute(cudaDevAttrGlobalMemoryBusWidth, dev), attribute(cudaDevAttrL2CacheSize, dev) >> 20,
              attribute(cudaDevAttrEccEnabled, dev) == 1 ? "on" : "off");
  std::printf("  limits     : %d threads/block, %zu KiB shared/block (opt-in %d KiB), compute mode %d\n",
              p.maxThreadsPerBlock, p.sharedMemPerBlock >> 10, attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) >> 10,
              attribute(cudaDevAttrComputeMode, dev));
  const int pools = attribute(cudaDevAttrMemoryPoolsSupported, dev);
  std::string pool = pools == 1 ? "supported" : pools == 0 ? "NOT SUPPORTED (ember's allocator needs cudaMallocAsync)" : "unknown";
  if (cudaSetDevice(dev) == cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      std::printf("  memory     : %s free of %s\n", bytes_gib(free_b).c_str(), bytes_gib(total_b).c_str());
    if (pools == 1) {
      cudaStream_t s = nullptr;
      void* ptr = nullptr;
      cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (e == cudaSuccess) e = cudaMallocAsync(&ptr, 1 << 20, s);
      if (e == cudaSuccess) e = cudaFreeAsync(ptr, s);
      if (e == cudaSuccess) e = cudaStreamSynchronize(s);
      if (s) (void)cudaStreamDestroy(s);
      pool += e == cudaSuccess ? "; cudaMallocAsync of 1 MiB works" : std::string("; cudaMallocAsync FAILED: ") + cudaGetErrorString(e);
      if (e != cudaSuccess) ok = false;
    } else {
      ok = false;
    }
  } else {
    (void)cudaGetLastError();
    ok = false;
  }
  std::printf("  memory pool: %s\n", pool.c_str());
  (void)cudaGetLastError();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const bool allow_no_gpu = argc > 1 && std::strcmp(argv[1], "--allow-no-gpu") == 0;
  std::printf("ember device report\n");
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  line("driver", "CUDA " + cuda_version(driver) + (driver == 0 ? " (no driver loaded)" : ""));
  line("runtime", "CUDA " + cuda_version(runtime) + " from " + file_of(reinterpret_cast<const void*>(&cudaRuntimeGetVersion)));

  // ember's own start-up query (what the tests' "SKIPPED: no GPU (...)" lines say).
  const int n = ember::cuda::runtime_device_count();
  line("devices", std::to_string(n) + (n == 0 ? " (" + ember::cuda::device_count_error() + ")" : std::string()));
  report_loaded("libcuda", "libcuda.so");

  report_library("cuBLAS", {EMBER_REPORT_CUBLAS, "libcublas.so.13", "libcublas.so.12", "libcublas.so"}, "cublasGetProperty",
                 [](void* f) {
                   auto get = reinterpret_cast<int (*)(int, int*)>(f);  // cublasGetProperty(libraryPropertyType, int*)
                   int v[3] = {-1, -1, -1};
                   for (int i = 0; i < 3; ++i) (void)get(i, &v[i]);  // MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                   return std::to_string(v[0]) + "." + std::to_string(v[1]) + "." + std::to_string(v[2]);
                 });
  report_library("cuBLASLt", {EMBER_REPORT_CUBLASLT, "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
                 "cublasLtGetVersion", [](void* f) {
                   const size_t v = reinterpret_cast<size_t (*)()>(f)();  // e.g. 130100 = 13.1.0
                   return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
                 });
  report_library("cuDNN", {EMBER_REPORT_CUDNN, "libcudnn.so.9", "libcudnn.so"}, "cudnnGetVersion", [](void* f) {
    const size_t v = reinterpret_cast<size_t (*)()>(f)();  // cuDNN 9: major*10000 + minor*100 + patch
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  });
  report_library("NCCL", {EMBER_REPORT_NCCL, "libnccl.so.2", "libnccl.so"}, "ncclGetVersion", [](void* f) {
    int v = 0;
    (void)reinterpret_cast<int (*)(int*)>(f)(&v);  // NCCL >= 2.9: major*10000 + minor*100 + patch
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  });

  int working = 0;
  for (int d = 0; d < n; ++d) working += report_device(d) ? 1 : 0;
  std::printf("result       : %d of %d device(s) usable by ember, %d librar%s missing\n", working, n, failures,
              failures == 1 ? "y" : "ies");
  if (allow_no_gpu) return 0;
  return working > 0 && failures == 0 ? 0 : 1;
}
