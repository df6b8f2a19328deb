#pragma once
// The CUDA backend: ember::Backend (core/backend.hpp) for one device. Everything runs on the
// device's ember stream (runtime.hpp), in stream order, so a kernel never needs a synchronisation
// before the next one; the host waits only where the contract says it must (copy_to_host,
// synchronize, and a large copy_from_host).
//
// Each kernel-table entry forwards to the launch_* function of its family (kernels/<family>.cuh,
// next to the kernels), to cuBLAS / cuBLASLt / cuDNN (cublas.hpp, cublas_lt.hpp, conv.hpp), or to
// the host machinery of its own header: copies (device_copy.hpp), upload staging and the copy
// stream (upload_staging.hpp, upload_queue.hpp), timing events (timing_events.hpp).
//
// Compiled only by nvcc, in the one translation unit ember_cuda.cu, which registers it in the
// kernel table; everything here has internal linkage (anonymous namespace), so two programs'
// or two libraries' copies of that translation unit never clash.
#if defined(__CUDACC__)
#include "ember/backend/allocator_backend.hpp"
#include "ember/backend/composite.hpp"
#include "ember/backend/cuda/allocator.hpp"
#include "ember/backend/cuda/conv.hpp"
#include "ember/backend/cuda/cublas.hpp"
#include "ember/backend/cuda/cublas_lt.hpp"
#include "ember/backend/cuda/device_copy.hpp"
#include "ember/backend/cuda/kernels/attention.cuh"
#include "ember/backend/cuda/kernels/loss.cuh"
#include "ember/backend/cuda/kernels/elementwise.cuh"
#include "ember/backend/cuda/kernels/index.cuh"
#include "ember/backend/cuda/kernels/norm.cuh"
#include "ember/backend/cuda/kernels/optim_step.cuh"
#include "ember/backend/cuda/kernels/pool.cuh"
#include "ember/backend/cuda/kernels/preprocess.cuh"
#include "ember/backend/cuda/kernels/reduce.cuh"
#include "ember/backend/cuda/kernels/softmax.cuh"
#include "ember/backend/cuda/launch_context.hpp"
#include "ember/backend/cuda/runtime.hpp"
#include "ember/backend/cuda/timing_events.hpp"
#include "ember/backend/cuda/upload_queue.hpp"
#include "ember/backend/cuda/upload_staging.hpp"

namespace ember::cuda_impl {
namespace {

class CudaBackend final : public AllocatorBackend<::ember::cuda::DeviceAllocator> {
 public:
  explicit CudaBackend(int device)
      : AllocatorBackend(device, ::ember::cuda::current_stream(device)),
        device_(device),
        stream_(::ember::cuda::current_stream(device)),
        sm_count_(::ember::cuda::multiprocessor_count(device)),
        ctx_{device_, sm_count_, stream_, &alloc_},
        uploads_(device, stream_),
        timing_(device, stream_) {}

  Device device() const override { return Device::cuda(device_); }

  // ---- memory (allocation: AllocatorBackend)
  void synchronize() override {
    DeviceGuard g(device_);
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ---- copies (device_copy.hpp, upload_staging.hpp)
  void copy(void* dst, const void* src, size_t bytes) override { ::ember::cuda::copy_device(ctx_, dst, src, bytes); }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
               size_t rows) override {
    ::ember::cuda::copy_device_2d(ctx_, dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard g(device_);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // No synchronisation: the caller synchronises once after queueing all its downloads.
  void download_async(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard g(device_);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard g(device_);
    if (staging_.upload(dst, host_src, bytes, stream_)) return;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free host_src on return
  }

  // ---- pinned host memory and uploads on the copy stream (upload_queue.hpp)
  void* allocate_pinned(size_t bytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      throw OutOfMemory(::ember::detail::str_cat("cudaHostAlloc of ", bytes, " bytes of pinned host memory failed (",
                                                 cudaGetErrorName(e), ") for cuda:", device_),
                        static_cast<int64_t>(bytes), 0, -1);
    }
    return p;
  }
  void free_pinned(void* p, size_t) noexcept override {
    if (p) (void)cudaFreeHost(p);
  }
  void* allocate_for_upload(size_t bytes) override { return alloc_.allocate(bytes, uploads_.copy_stream()); }
  uint64_t upload_async(void* dst, const void* host_src, size_t bytes) override {
    return uploads_.queue(dst, host_src, bytes, true);
  }
  uint64_t upload_async_fresh(void* dst, const void* host_src, size_t bytes) override {
    return uploads_.queue(dst, host_src, bytes, false);
  }
  bool upload_finished(uint64_t ticket) override { return uploads_.finished(ticket); }
  void wait_upload(uint64_t ticket) override { uploads_.wait(ticket); }

  // ---- timing events, the profiler's device time (timing_events.hpp)
  uint64_t timing_event_record() override { return timing_.record(); }
  double timing_event_elapsed_ms(uint64_t start, uint64_t end) override { return timing_.elapsed_ms(start, end); }
  void timing_events_release() override { timing_.release(); }

  // ---- fills, conversions, random numbers, elementwise (kernels/elementwise.cuh)
  void fill(DType t, void* dst, int64_t n, double value) override { launch_fill(ctx_, t, dst, n, value); }
  void arange(DType t, void* dst, int64_t n, double start, double step) override {
    launch_arange(ctx_, t, dst, n, start, step);
  }
  void cast(DType st, const void* src, DType dt, void* dst, int64_t n) override {
    launch_cast(ctx_, st, src, dt, dst, n);
  }
  void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override {
    launch_random_uniform(ctx_, t, dst, n, seed, offset, lo, hi);
  }
  void random_normal(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double mean,
                     double stddev) override {
    launch_random_normal(ctx_, t, dst, n, seed, offset, mean, stddev);
  }
  void unary(UnaryOp op, DType t, const void* x, void* out, int64_t n, double a, double b) override {
    launch_unary(ctx_, op, t, x, out, n, a, b);
  }
  void unary_backward(UnaryOp op, DType t, const void* x, const void* y, const void* gy, void* gx, int64_t n, double a,
                      double b) override {
    launch_unary_backward(ctx_, op, t, x, y, gy, gx, n, a, b);
  }
  void binary(BinaryOp op, DType t, const void* a, const void* b, void* out, const StridedArgs& args) override {
    launch_binary(ctx_, op, t, a, b, out, args);
  }
  void compare(CompareOp op, DType t, const void* a, const void* b, uint8_t* out, const StridedArgs& args) override {
    launch_compare(ctx_, op, t, a, b, out, args);
  }
  void where(DType t, const uint8_t* cond, const void* a, const void* b, void* out, const StridedArgs& args) override {
    launch_where(ctx_, t, cond, a, b, out, args);
  }
  void strided_copy(DType t, const void* src, void* out, const StridedArgs& args) override {
    launch_strided_copy(ctx_, t, src, out, args);
  }
  void nonfinite_check(DType t, const void* x, int64_t n, uint8_t* flag) override {
    launch_nonfinite_check(ctx_, t, x, n, flag);
  }

  // ---- reductions (kernels/reduce.cuh), matrix products (cublas.hpp, cublas_lt.hpp)
  void reduce(ReduceOp op, DType t, const void* x, void* out, int64_t outer, int64_t n, int64_t inner) override {
    launch_reduce(ctx_, op, t, x, out, outer, n, inner);
  }
  void gemm(const GemmArgs& args) override { ::ember::cuda::gemm(device_, args); }
  // Bias and activation in cuBLASLt's epilogue where it has them, else the composite.
  void linear_act_forward(const LinearActArgs& a, const void* x, const void* w, const void* b, void* z,
                          void* y) override {
    auto workspace = [this](size_t bytes) { return ctx_.scratch(bytes); };
    auto release = [this](void* p, size_t bytes) { ctx_.release(p, bytes); };
    if (::ember::cuda::linear_act_lt(device_, stream_, a, x, w, b, z, y, workspace, release)) return;
    linear_act_composite(*this, a, x, w, b, z, y);
  }

  // ---- softmax (kernels/softmax.cuh)
  void softmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log) override {
    launch_softmax_forward(ctx_, t, x, y, rows, cols, log);
  }
  void softmax_backward(DType t, const void* y, const void* gy, void* gx, int64_t rows, int64_t cols,
                        bool log) override {
    launch_softmax_backward(ctx_, t, y, gy, gx, rows, cols, log);
  }

  // ---- fused layer norm / RMSNorm (kernels/norm.cuh)
  void norm_forward(const NormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                    void* rstd) override {
    launch_norm_forward(ctx_, a, x, w, b, y, mean, rstd);
  }
  void norm_backward(const NormArgs& a, const void* x, const void* w, const void* mean, const void* rstd,
                     const void* gy, void* gx, void* gw, void* gb) override {
    launch_norm_backward(ctx_, a, x, w, mean, rstd, gy, gx, gw, gb);
  }

  // ---- fused cross-entropy (kernels/loss.cuh)
  void cross_entropy_forward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                             void* loss, void* lse, void* wt) override {
    launch_cross_entropy_forward(ctx_, a, x, target, w, loss, lse, wt);
  }
  void cross_entropy_backward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                              const void* lse, const void* gloss, void* gx) override {
    launch_cross_entropy_backward(ctx_, a, x, target, w, lse, gloss, gx);
  }

  // ---- fused scaled dot-product attention (kernels/attention.cuh)
  void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                         void* out, void* lse) override {
    launch_attention_forward(ctx_, a, q, k, v, mask, out, lse);
  }
  void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                          const void* out, const void* lse, const void* gout, void* delta, void* gq, void* gk,
                          void* gv) override {
    launch_attention_backward(ctx_, a, q, k, v, mask, out, lse, gout, delta, gq, gk, gv);
  }

  // ---- fused optimizer steps (kernels/optim_step.cuh)
  void adam_step(const AdamStepArgs& a, void* param, void* grad, void* exp_avg, void* exp_avg_sq,
                 void* max_exp_avg_sq) override {
    launch_adam_step(ctx_, a, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq);
  }
  void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* momentum_buffer) override {
    launch_sgd_step(ctx_, a, param, grad, momentum_buffer);
  }
  void rmsprop_step(const RmspropStepArgs& a, void* param, void* grad, void* square_avg, void* grad_avg,
                    void* momentum_buffer) override {
    launch_rmsprop_step(ctx_, a, param, grad, square_avg, grad_avg, momentum_buffer);
  }

  // ---- indexing (kernels/index.cuh)
  void index_select(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n,
                    int64_t idx_n, int64_t inner) override {
    launch_index(ctx_, IndexKernel::Select, t, x, idx, out, outer, src_n, idx_n, inner);
  }
  void index_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n, int64_t idx_n,
                 int64_t inner) override {
    launch_index(ctx_, IndexKernel::Add, t, gy, idx, gx, outer, src_n, idx_n, inner);
  }
  void gather(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n, int64_t idx_n,
              int64_t inner) override {
    launch_index(ctx_, IndexKernel::Gather, t, x, idx, out, outer, src_n, idx_n, inner);
  }
  void scatter_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n,
                   int64_t idx_n, int64_t inner) override {
    launch_index(ctx_, IndexKernel::ScatterAdd, t, gy, idx, gx, outer, src_n, idx_n, inner);
  }

  // ---- convolution (conv.hpp, cuDNN) and pooling (kernels/pool.cuh)
  void conv2d_forward(const Conv2dArgs& a, const void* x, const void* w, void* y) override {
    ::ember::cuda::conv2d_forward(ctx_, a, x, w, y);
  }
  void conv2d_backward_input(const Conv2dArgs& a, const void* gy, const void* w, void* gx) override {
    ::ember::cuda::conv2d_backward_input(ctx_, a, gy, w, gx);
  }
  void conv2d_backward_weight(const Conv2dArgs& a, const void* x, const void* gy, void* gw) override {
    ::ember::cuda::conv2d_backward_weight(ctx_, a, x, gy, gw);
  }
  void max_pool2d_forward(const Pool2dArgs& p, const void* x, void* y, int64_t* indices) override {
    launch_max_pool2d_forward(ctx_, p, x, y, indices);
  }
  void max_pool2d_backward(const Pool2dArgs& p, const void* gy, const int64_t* indices, void* gx) override {
    launch_max_pool2d_backward(ctx_, p, gy, indices, gx);
  }
  void avg_pool2d_forward(const Pool2dArgs& p, const void* x, void* y) override {
    launch_avg_pool2d_forward(ctx_, p, x, y);
  }
  void avg_pool2d_backward(const Pool2dArgs& p, const void* gy, void* gx) override {
    launch_avg_pool2d_backward(ctx_, p, gy, gx);
  }

  // ---- fused image preprocessing (kernels/preprocess.cuh)
  void preprocess_images(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, void* y) override {
    launch_preprocess_images(ctx_, a, x, params, y);
  }

 private:
  int device_;
  cudaStream_t stream_;
  int sm_count_;
  const LaunchContext ctx_;  // device_, sm_count_, stream_ and alloc_, for the launch_* functions
  UploadStaging staging_;
  UploadQueue uploads_;
  TimingEvents timing_;
};

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
