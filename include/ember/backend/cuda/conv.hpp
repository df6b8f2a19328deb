#pragma once
// 2-D convolution on CUDA through cuDNN (host code). For each distinct problem (shapes, strides,
// padding, dilation, groups, dtype, device) the descriptors and the algorithms of the three
// passes are chosen once, by cuDNN's heuristics (cudnnGet*Algorithm_v7, the first algorithm
// whose workspace fits), and cached; later calls only launch. fp32 runs without TF32 (FMA math),
// so results match the CPU reference; fp16/bf16 use tensor cores with fp32 accumulation.
//
// This uses cuDNN's classic convolution API, which cuDNN 9 still ships (marked deprecated in
// favour of the graph API); the deprecation warnings are silenced here, and only here.
#include <cudnn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "ember/backend/cuda/cudnn.hpp"
#include "ember/backend/cuda/launch_context.hpp"
#include "ember/core/backend.hpp"
#include "ember/core/checked_math.hpp"

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
#if defined(__NVCC__)
#pragma nv_diag_suppress 1444  // "declared deprecated"
#endif

namespace ember::cuda {

inline cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: throw DTypeError(::ember::detail::str_cat("conv2d: unsupported dtype ", dtype_name(t), " on cuda"));
  }
}

// Descriptors and chosen algorithms for one convolution problem.
class ConvPlan {
 public:
  ConvPlan(const Conv2dArgs& a, int device) : device_(device) {
    const cudnnDataType_t dt = cudnn_dtype(a.dtype);
    // Accumulate in fp32 for the 16-bit types, in the data type otherwise.
    const cudnnDataType_t compute = (a.dtype == DType::Float64) ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    EMBER_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x_));
    EMBER_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y_));
    EMBER_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_));
    EMBER_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    // cuDNN's 4-d descriptors take ints: a larger size raises (ShapeError) instead of wrapping.
    auto to_int = [](int64_t v, const char* what) { return checked::to_int(v, "conv2d (cuDNN descriptor)", what); };
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NCHW, dt, to_int(a.n, "n"),
                                                 to_int(a.c_in, "c_in"), to_int(a.h, "h"), to_int(a.w, "w")));
    EMBER_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_, dt, CUDNN_TENSOR_NCHW, to_int(a.c_out, "c_out"),
                                                 to_int(a.c_in / a.groups, "c_in/groups"), to_int(a.kh, "kh"),
                                                 to_int(a.kw, "kw")));
    EMBER_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_, to_int(a.pad_h, "pad_h"), to_int(a.pad_w, "pad_w"),
                                                      to_int(a.stride_h, "stride_h"), to_int(a.stride_w, "stride_w"),
                                                      to_int(a.dil_h, "dil_h"), to_int(a.dil_w, "dil_w"),
                                                      CUDNN_CROSS_CORRELATION, compute));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv_, to_int(a.groups, "groups")));
    half_precision_ = a.dtype == DType::Float16 || a.dtype == DType::BFloat16;
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, half_precision_ ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NCHW, dt, to_int(a.n, "n"),
                                                 to_int(a.c_out, "c_out"), to_int(a.out_h, "out_h"),
                                                 to_int(a.out_w, "out_w")));
    cudnnHandle_t h = cudnn_handle(device);
    constexpr int kMax = 16;
    int got = 0;
    {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      EMBER_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, kMax, &got, perf));
      choose(perf, got, fwd_, fwd_math_);
      EMBER_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, fwd_, &fwd_ws_));
    }
    {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, kMax, &got, perf));
      choose(perf, got, bwd_data_, bwd_data_math_);
      EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, bwd_data_, &bwd_data_ws_));
    }
    {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, kMax, &got, perf));
      choose(perf, got, bwd_filter_, bwd_filter_math_);
      EMBER_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, bwd_filter_, &bwd_filter_ws_));
    }
  }
  ~ConvPlan() {
    cudnnDestroyTensorDescriptor(x_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyFilterDescriptor(w_);
    cudnnDestroyConvolutionDescriptor(conv_);
  }
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  void forward(const void* x, const void* w, void* y, DType t, DeviceAllocator& memory) {
    Workspace ws(memory, fwd_ws_);
    Scalars s(t);
    use_math(fwd_math_);
    EMBER_CUDNN_CHECK(cudnnConvolutionForward(cudnn_handle(device_), s.one(), x_, x, w_, w, conv_, fwd_, ws.ptr,
                                              fwd_ws_, s.zero(), y_, y));
  }
  void backward_input(const void* gy, const void* w, void* gx, DType t, DeviceAllocator& memory) {
    Workspace ws(memory, bwd_data_ws_);
    Scalars s(t);
    use_math(bwd_data_math_);
    EMBER_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_handle(device_), s.one(), w_, w, y_, gy, conv_, bwd_data_,
                                                   ws.ptr, bwd_data_ws_, s.zero(), x_, gx));
  }
  void backward_weight(const void* x, const void* gy, void* gw, DType t, DeviceAllocator& memory) {
    Workspace ws(memory, bwd_filter_ws_);
    Scalars s(t);
    use_math(bwd_filter_math_);
    EMBER_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_handle(device_), s.one(), x_, x, y_, gy, conv_,
                                                     bwd_filter_, ws.ptr, bwd_filter_ws_, s.zero(), w_, gw));
  }

 private:
  static constexpr size_t kMaxWorkspace = size_t{1} << 30;

  // cuDNN's Get*Algorithm_v7 reports the math type each algorithm was timed with, and the caller
  // must set it on the descriptor (else cuDNN may run a slower kernel). The three passes share the
  // descriptor, so each sets its own before its call. fp32/fp64 keep CUDNN_FMA_MATH whatever is
  // reported: another math type could allow TF32, which ember's fp32 does not use.
  cudnnMathType_t math_for(cudnnMathType_t reported) const { return half_precision_ ? reported : CUDNN_FMA_MATH; }
  void use_math(cudnnMathType_t m) { EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_, m)); }

  // The fastest successful algorithm within the workspace limit (the list is sorted by speed), and
  // its math type, set on the descriptor for the workspace query that follows.
  // fp32/fp64 prefer the fastest algorithm cuDNN timed with FMA math: an entry timed with another
  // math type (TF32 tensor ops) would be chosen for a speed it does not have once FMA math is
  // forced on it. Only when no FMA entry qualifies is the fastest other one taken (as before).
  template <class Perf, class Algo>
  void choose(const Perf* perf, int n, Algo& algo, cudnnMathType_t& math) {
    auto usable = [&](int i) { return perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspace; };
    for (int pass = half_precision_ ? 1 : 0; pass < 2; ++pass)
      for (int i = 0; i < n; ++i)
        if (usable(i) && (pass == 1 || perf[i].mathType == CUDNN_FMA_MATH)) {
          algo = perf[i].algo;
          math = math_for(perf[i].mathType);
          use_math(math);
          return;
        }
    throw CudnnError("conv2d: cuDNN found no algorithm for this convolution");
  }

  // Workspace from the device's stream-ordered allocator, returned when the call has been queued.
  struct Workspace {
    Workspace(DeviceAllocator& memory, size_t bytes) : memory(memory), bytes(bytes) {
      if (bytes) ptr = memory.allocate(bytes);
    }
    ~Workspace() {
      if (ptr) memory.deallocate(ptr, bytes);
    }
    DeviceAllocator& memory;
    size_t bytes;
    void* ptr = nullptr;
  };

  // alpha = 1, beta = 0 in the type cuDNN expects: double for double data, float otherwise.
  struct Scalars {
    explicit Scalars(DType t) : is_double(t == DType::Float64) {}
    const void* one() const { return is_double ? static_cast<const void*>(&d1) : static_cast<const void*>(&f1); }
    const void* zero() const { return is_double ? static_cast<const void*>(&d0) : static_cast<const void*>(&f0); }
    bool is_double;
    float f1 = 1.0f, f0 = 0.0f;
    double d1 = 1.0, d0 = 0.0;
  };

  int device_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwd_data_{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter_{};
  size_t fwd_ws_ = 0, bwd_data_ws_ = 0, bwd_filter_ws_ = 0;
  bool half_precision_ = false;
  cudnnMathType_t fwd_math_ = CUDNN_FMA_MATH, bwd_data_math_ = CUDNN_FMA_MATH, bwd_filter_math_ = CUDNN_FMA_MATH;
};

// The plan for a problem, created on first use and kept for the life of the program.
inline ConvPlan& conv_plan(const Conv2dArgs& a, int device) {
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static auto* cache = new std::map<Key, std::unique_ptr<ConvPlan>>();  // never freed: outlives static destruction
  Key k{device, static_cast<int>(a.dtype), a.n, a.c_in, a.h, a.w, a.c_out, a.kh, a.kw, a.stride_h, a.stride_w,
        a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, 0};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(k);
  if (it == cache->end()) it = cache->emplace(k, std::make_unique<ConvPlan>(a, device)).first;
  return *it->second;
}

// The kernel table's convolutions. cuDNN rejects tensors with a zero dimension
// (CUDNN_STATUS_BAD_PARAM); an empty batch or no input channels gives what the CPU twin gives:
// zeros in whichever result is not empty itself.
inline void conv2d_zero_fill(const LaunchContext& c, void* p, int64_t numel, DType t) {
  if (numel > 0) EMBER_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(numel) * dtype_size(t), c.stream));
}
inline void conv2d_forward(const LaunchContext& c, const Conv2dArgs& a, const void* x, const void* w, void* y) {
  DeviceGuard g(c.device);
  if (a.n == 0 || a.c_in == 0) return conv2d_zero_fill(c, y, a.n * a.c_out * a.out_h * a.out_w, a.dtype);
  conv_plan(a, c.device).forward(x, w, y, a.dtype, *c.memory);
}
inline void conv2d_backward_input(const LaunchContext& c, const Conv2dArgs& a, const void* gy, const void* w,
                                  void* gx) {
  DeviceGuard g(c.device);
  if (a.n == 0 || a.c_in == 0) return conv2d_zero_fill(c, gx, a.n * a.c_in * a.h * a.w, a.dtype);
  conv_plan(a, c.device).backward_input(gy, w, gx, a.dtype, *c.memory);
}
inline void conv2d_backward_weight(const LaunchContext& c, const Conv2dArgs& a, const void* x, const void* gy,
                                   void* gw) {
  DeviceGuard g(c.device);
  if (a.n == 0 || a.c_in == 0)
    return conv2d_zero_fill(c, gw, a.c_out * (a.c_in / std::max<int64_t>(a.groups, 1)) * a.kh * a.kw, a.dtype);
  conv_plan(a, c.device).backward_weight(x, gy, gw, a.dtype, *c.memory);
}

}  // namespace ember::cuda

#if defined(__NVCC__)
#pragma nv_diag_default 1444
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
