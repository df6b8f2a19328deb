#pragma once
// The CUDA backend: ember::Backend (core/backend.hpp) for one device. Everything runs on the
// device's ember stream (runtime.hpp), in stream order, so a kernel never needs a synchronisation
// before the next one; the host waits only where the contract says it must (copy_to_host,
// synchronize, and a large copy_from_host).
//
// Compiled only by nvcc, in the one translation unit ember_cuda.cu, which registers it in the
// kernel table; everything here has internal linkage (anonymous namespace), so two programs'
// or two libraries' copies of that translation unit never clash.
#if defined(__CUDACC__)
#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "ember/backend/composite.hpp"
#include "ember/backend/cpu/elementwise.hpp"  // cpu::from_calc: fill values converted as on the CPU
#include "ember/backend/cuda/allocator.hpp"
#include "ember/backend/cuda/conv.hpp"
#include "ember/backend/cuda/cublas.hpp"
#include "ember/backend/cuda/cublas_lt.hpp"
#include "ember/backend/cuda/kernels/elementwise.cuh"
#include "ember/backend/cuda/kernels/index.cuh"
#include "ember/backend/cuda/kernels/pool.cuh"
#include "ember/backend/cuda/kernels/preprocess.cuh"
#include "ember/backend/cuda/kernels/reduce.cuh"
#include "ember/backend/cuda/kernels/softmax.cuh"
#include "ember/backend/cuda/kernels/norm.cuh"
#include "ember/backend/cuda/kernels/cross_entropy.cuh"
#include "ember/backend/cuda/kernels/attention.cuh"
#include "ember/backend/cuda/kernels/optim_step.cuh"
#include "ember/backend/cuda/runtime.hpp"

namespace ember::cuda_impl {
namespace {

// ---------------------------------------------------------------- dtype dispatch
// Every dtype (like ember::dispatch_dtype).
template <class F>
void dispatch_all(DType t, F&& f) {
  dispatch_dtype(t, std::forward<F>(f));
}

// Floating types only; any other dtype is a DTypeError naming the op, the dtype and the device.
template <class F>
void dispatch_floating(DType t, const char* op, int device, F&& f) {
  switch (t) {
    case DType::Float32: f(float{}); return;
    case DType::Float64: f(double{}); return;
    case DType::Float16: f(half{}); return;
    case DType::BFloat16: f(bfloat16{}); return;
    default:
      throw DTypeError(::ember::detail::str_cat(op, ": unsupported dtype ", dtype_name(t), " on cuda:", device,
                                                " (float32, float64, float16 and bfloat16 are supported)"));
  }
}

// By element size, for kernels that only move elements: f(unsigned integer of that size).
template <class F>
void dispatch_bits(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
    default: throw DTypeError(::ember::detail::str_cat("unknown dtype ", static_cast<int>(t), " on cuda"));
  }
}

// ---------------------------------------------------------------- pinned staging for uploads
// copy_from_host must leave the caller free to reuse its buffer on return. Rather than waiting for
// the stream (which would stall the host behind all queued kernels at every batch upload), small
// and medium uploads are copied into a pinned staging buffer first; a buffer is reused once the
// event recorded after its transfer has completed.
class UploadStaging {
 public:
  static constexpr size_t kMaxBytes = size_t{32} << 20;  // larger uploads copy directly and synchronise
  static constexpr size_t kMaxBuffers = 8;

  // Copies host_src to dst on `stream` through a staging buffer; false when no buffer is available
  // (the caller then copies directly and synchronises).
  bool upload(void* dst, const void* host_src, size_t bytes, cudaStream_t stream) {
    if (bytes > kMaxBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    Buffer* buf = nullptr;
    for (Buffer& b : buffers_) {
      if (b.capacity < bytes) continue;
      cudaError_t q = cudaEventQuery(b.done);
      if (q == cudaSuccess) {
        buf = &b;
        break;
      }
      if (q != cudaErrorNotReady) ::ember::cuda::internal::check_cuda(q, "cudaEventQuery(staging)", __FILE__, __LINE__);
    }
    if (buf == nullptr) {
      if (buffers_.size() >= kMaxBuffers) return false;
      size_t cap = size_t{1} << 20;  // at least 1 MiB, so a buffer serves many later uploads
      while (cap < bytes) cap *= 2;
      Buffer b;
      if (cudaHostAlloc(&b.ptr, cap, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      b.capacity = cap;
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
      buffers_.push_back(b);
      buf = &buffers_.back();
    }
    std::memcpy(buf->ptr, host_src, bytes);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, buf->ptr, bytes, cudaMemcpyHostToDevice, stream));
    EMBER_CUDA_CHECK(cudaEventRecord(buf->done, stream));
    return true;
  }

 private:
  struct Buffer {
    void* ptr = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  std::mutex mu_;
  std::vector<Buffer> buffers_;  // never freed (pinned memory must outlive static destruction)
};

// ---------------------------------------------------------------- the backend
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device)
      : device_(device),
        stream_(::ember::cuda::current_stream(device)),
        alloc_(device, stream_),
        sm_count_(::ember::cuda::multiprocessor_count(device)),
        staging_() {
    Guard g(device_);
    // The copy stream of upload_async: non-blocking, never destroyed (the backend lives for the
    // whole program).
    EMBER_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }

  Device device() const override { return Device::cuda(device_); }

  // ---- memory
  void* allocate(size_t bytes) override { return alloc_.allocate(bytes); }
  void deallocate(void* p, size_t bytes) noexcept override { alloc_.deallocate(p, bytes); }
  MemoryStats memory_stats() const override { return alloc_.stats(); }
  void reset_peak_memory() override { alloc_.reset_peak(); }
  void set_memory_limit(int64_t bytes) override { alloc_.set_limit(bytes); }
  void empty_cache() override { alloc_.empty_cache(); }
  void set_cache_limit(int64_t bytes) override { alloc_.set_cache_limit(bytes); }
  void synchronize() override {
    Guard g(device_);
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // ---- copies
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    Guard g(device_);
    const char* d = static_cast<const char*>(dst);
    const char* s = static_cast<const char*>(src);
    if (d < s + bytes && s < d + bytes) {  // overlapping (memmove semantics): go through a temporary
      void* tmp = alloc_.allocate(bytes);
      cudaError_t e = cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_);
      if (e == cudaSuccess) e = cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, stream_);
      alloc_.deallocate(tmp, bytes);
      ::ember::cuda::internal::check_cuda(e, "cudaMemcpyAsync (overlapping copy)", __FILE__, __LINE__);
      return;
    }
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Guard g(device_);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // No synchronisation: the caller synchronises once after queueing all its downloads.
  void download_async(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    Guard g(device_);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    Guard g(device_);
    if (staging_.upload(dst, host_src, bytes, stream_)) return;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may free host_src on return
  }
  // ---- pinned host memory and uploads on the copy stream (core/backend.hpp)
  void* allocate_pinned(size_t bytes) override {
    Guard g(device_);
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
  void* allocate_for_upload(size_t bytes) override { return alloc_.allocate(bytes, copy_stream_); }
  uint64_t upload_async(void* dst, const void* host_src, size_t bytes) override {
    return queue_upload(dst, host_src, bytes, true);
  }
  uint64_t upload_async_fresh(void* dst, const void* host_src, size_t bytes) override {
    return queue_upload(dst, host_src, bytes, false);
  }
  // after_compute: dst is the compute stream's (a fresh allocation there may reuse memory its
  // queued kernels still use), so the copy waits for that queued work; memory from
  // allocate_for_upload is already in the copy stream's order and needs no wait.
  uint64_t queue_upload(void* dst, const void* host_src, size_t bytes, bool after_compute) {
    Guard g(device_);
    std::lock_guard<std::mutex> lock(upload_mu_);
    retire_uploads();
    Upload u;
    if (!free_uploads_.empty()) {
      u = free_uploads_.back();
      free_uploads_.pop_back();
    } else {
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&u.ready, cudaEventDisableTiming));
      EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&u.done, cudaEventDisableTiming));
    }
    // copy stream after the compute stream's queued work (dst's stream-ordered allocation) ...
    if (after_compute) {
      EMBER_CUDA_CHECK(cudaEventRecord(u.ready, stream_));
      EMBER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, u.ready, 0));
    }
    if (bytes > 0) EMBER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, copy_stream_));
    // ... and the compute stream's later kernels after the copy.
    EMBER_CUDA_CHECK(cudaEventRecord(u.done, copy_stream_));
    EMBER_CUDA_CHECK(cudaStreamWaitEvent(stream_, u.done, 0));
    u.ticket = ++last_ticket_;
    pending_uploads_.push_back(u);
    return u.ticket;
  }
  bool upload_finished(uint64_t ticket) override {
    Guard g(device_);
    std::lock_guard<std::mutex> lock(upload_mu_);
    retire_uploads();
    return ticket <= finished_ticket_;
  }
  void wait_upload(uint64_t ticket) override {
    Guard g(device_);
    std::lock_guard<std::mutex> lock(upload_mu_);
    for (const Upload& u : pending_uploads_)
      if (u.ticket >= ticket) {
        EMBER_CUDA_CHECK(cudaEventSynchronize(u.done));
        break;
      }
    retire_uploads();
  }

  // ---- timing events (the profiler's device time): a pool that only grows; ids are 1 + index.
  uint64_t timing_event_record() override {
    Guard g(device_);
    std::lock_guard<std::mutex> lock(timing_mu_);
    if (timing_used_ == timing_events_.size()) {
      cudaEvent_t e = nullptr;
      EMBER_CUDA_CHECK(cudaEventCreate(&e));  // with timing (the default flags)
      timing_events_.push_back(e);
    }
    EMBER_CUDA_CHECK(cudaEventRecord(timing_events_[timing_used_], stream_));
    return ++timing_used_;
  }
  double timing_event_elapsed_ms(uint64_t start, uint64_t end) override {
    Guard g(device_);
    std::lock_guard<std::mutex> lock(timing_mu_);
    if (start == 0 || end == 0 || start > timing_used_ || end > timing_used_) return -1.0;
    EMBER_CUDA_CHECK(cudaEventSynchronize(timing_events_[end - 1]));
    float ms = 0;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_events_[start - 1], timing_events_[end - 1]));
    return ms;
  }
  void timing_events_release() override {
    std::lock_guard<std::mutex> lock(timing_mu_);
    timing_used_ = 0;
  }

  // ---- fused image preprocessing (kernels/preprocess.cuh)
  void preprocess_images(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, void* y) override {
    const int64_t total = a.n * a.c * a.out_h * a.out_w;
    if (total <= 0) return;
    Guard g(device_);
    switch (a.out_dtype) {
      case DType::Float32:
        preprocess_images_kernel<float><<<grid(total), kThreads, 0, stream_>>>(a, x, params, static_cast<float*>(y));
        break;
      case DType::Float16:
        preprocess_images_kernel<half><<<grid(total), kThreads, 0, stream_>>>(a, x, params, static_cast<half*>(y));
        break;
      case DType::BFloat16:
        preprocess_images_kernel<bfloat16><<<grid(total), kThreads, 0, stream_>>>(a, x, params, static_cast<bfloat16*>(y));
        break;
      default:
        throw DTypeError(::ember::detail::str_cat("preprocess_images: output dtype ", dtype_name(a.out_dtype),
                                                  " (float32, float16 or bfloat16) on cuda:", device_));
    }
    EMBER_CUDA_CHECK_LAUNCH();
  }

  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
               size_t rows) override {
    if (rows == 0 || row_bytes == 0) return;
    if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes)) {
      copy(dst, src, rows == 1 ? row_bytes : row_bytes * rows);
      return;
    }
    Guard g(device_);
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, stream_);
    if (e == cudaErrorInvalidPitchValue || e == cudaErrorInvalidValue) {
      // Pitches beyond what the copy engine takes (cudaDevAttrMaxPitch): one copy per row.
      (void)cudaGetLastError();
      for (size_t r = 0; r < rows; ++r)
        EMBER_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + r * dst_pitch,
                                         static_cast<const char*>(src) + r * src_pitch, row_bytes,
                                         cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    ::ember::cuda::internal::check_cuda(e, "cudaMemcpy2DAsync", __FILE__, __LINE__);
  }

  // ---- fills and conversions
  void fill(DType t, void* dst, int64_t n, double value) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      using B = typename BitsOf<sizeof(T)>::type;
      const T v = cpu::from_calc<T>(static_cast<cpu::calc_t<T>>(value));  // converted exactly as the CPU does
      B bits;
      std::memcpy(&bits, &v, sizeof(T));
      if (bits == 0) {
        EMBER_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(T), stream_));
      } else {
        fill_kernel<B><<<grid(n), kThreads, 0, stream_>>>(static_cast<B*>(dst), n, bits);
        EMBER_CUDA_CHECK_LAUNCH();
      }
    });
  }
  void arange(DType t, void* dst, int64_t n, double start, double step) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      arange_kernel<T><<<grid(n), kThreads, 0, stream_>>>(static_cast<T*>(dst), n, start, step);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void cast(DType st, const void* src, DType dt, void* dst, int64_t n) override {
    if (n <= 0) return;
    if (st == dt) {
      copy(dst, src, static_cast<size_t>(n) * dtype_size(st));
      return;
    }
    Guard g(device_);
    dispatch_all(st, [&](auto s) {
      dispatch_all(dt, [&](auto d) {
        using S = decltype(s);
        using D = decltype(d);
        if constexpr (!std::is_same_v<S, D>)
          cast_kernel<S, D><<<grid(n), kThreads, 0, stream_>>>(static_cast<const S*>(src), static_cast<D*>(dst), n);
      });
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      random_uniform_kernel<T><<<grid((n + 3) / 4), kThreads, 0, stream_>>>(static_cast<T*>(dst), n, seed, offset, lo,
                                                                           hi - lo);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void random_normal(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double mean,
                     double stddev) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      random_normal_kernel<T><<<grid((n + 3) / 4), kThreads, 0, stream_>>>(static_cast<T*>(dst), n, seed, offset, mean,
                                                                          stddev);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }

  // ---- elementwise
  void unary(UnaryOp op, DType t, const void* x, void* out, int64_t n, double a, double b) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      using C = calc_t<T>;
      if (aligned16(x) && aligned16(out))
        unary_dense_kernel<T><<<grid(n / Pack<T>::kSize + 1), kThreads, 0, stream_>>>(
            op, static_cast<const T*>(x), static_cast<T*>(out), n, static_cast<C>(a), static_cast<C>(b));
      else
        unary_kernel<T><<<grid(n), kThreads, 0, stream_>>>(op, static_cast<const T*>(x), static_cast<T*>(out), n,
                                                          static_cast<C>(a), static_cast<C>(b));
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void unary_backward(UnaryOp op, DType t, const void* x, const void* y, const void* gy, void* gx, int64_t n, double a,
                      double b) override {
    if (n <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      using C = calc_t<T>;
      unary_backward_kernel<T><<<grid(n), kThreads, 0, stream_>>>(op, static_cast<const T*>(x), static_cast<const T*>(y),
                                                                 static_cast<const T*>(gy), static_cast<T*>(gx), n,
                                                                 static_cast<C>(a), static_cast<C>(b));
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void binary(BinaryOp op, DType t, const void* a, const void* b, void* out, const StridedArgs& args) override {
    const int64_t n = args.numel();
    if (n <= 0) return;
    const Strided s = coalesce(args, 2);
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      // One dense dimension, each input dense or a broadcast element, aligned: the packed kernel.
      const bool one_dim = s.ndim == 1 && (s.stride[0][0] == 0 || s.stride[0][0] == 1) &&
                           (s.stride[1][0] == 0 || s.stride[1][0] == 1);
      const bool a_scalar = one_dim && s.stride[0][0] == 0, b_scalar = one_dim && s.stride[1][0] == 0;
      if (one_dim && (a_scalar || aligned16(a)) && (b_scalar || aligned16(b)) && aligned16(out))
        binary_dense_kernel<T><<<grid(n / Pack<T>::kSize + 1), kThreads, 0, stream_>>>(
            op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, a_scalar, b_scalar);
      else
        binary_kernel<T><<<grid(n), kThreads, 0, stream_>>>(op, static_cast<const T*>(a), static_cast<const T*>(b),
                                                           static_cast<T*>(out), s, n);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void compare(CompareOp op, DType t, const void* a, const void* b, uint8_t* out, const StridedArgs& args) override {
    const int64_t n = args.numel();
    if (n <= 0) return;
    const Strided s = coalesce(args, 2);
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      compare_kernel<T><<<grid(n), kThreads, 0, stream_>>>(op, static_cast<const T*>(a), static_cast<const T*>(b), out,
                                                          s, n);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void where(DType t, const uint8_t* cond, const void* a, const void* b, void* out, const StridedArgs& args) override {
    const int64_t n = args.numel();
    if (n <= 0) return;
    const Strided s = coalesce(args, 3);
    Guard g(device_);
    dispatch_bits(t, [&](auto tag) {
      using B = decltype(tag);
      where_kernel<B><<<grid(n), kThreads, 0, stream_>>>(cond, static_cast<const B*>(a), static_cast<const B*>(b),
                                                        static_cast<B*>(out), s, n);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void strided_copy(DType t, const void* src, void* out, const StridedArgs& args) override {
    const int64_t n = args.numel();
    if (n <= 0) return;
    const Strided s = coalesce(args, 1);
    if (s.ndim <= 1 && (s.ndim == 0 || s.stride[0][0] == 1)) {  // already contiguous
      copy(out, src, static_cast<size_t>(n) * dtype_size(t));
      return;
    }
    Guard g(device_);
    dispatch_bits(t, [&](auto tag) {
      using B = decltype(tag);
      strided_copy_kernel<B><<<grid(n), kThreads, 0, stream_>>>(static_cast<const B*>(src), static_cast<B*>(out), s, n);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }

  // ---- reductions
  void reduce(ReduceOp op, DType t, const void* x, void* out, int64_t outer, int64_t n, int64_t inner) override {
    if (outer <= 0 || inner <= 0) return;
    Guard g(device_);
    auto workspace = [this](size_t bytes) { return alloc_.allocate(bytes); };
    auto release = [this](void* p, size_t bytes) { alloc_.deallocate(p, bytes); };
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      const T* xt = static_cast<const T*>(x);
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean: {
          const SumReducer<T> r{op == ReduceOp::Mean ? 1.0 / static_cast<double>(n) : 1.0};
          launch_reduce(xt, static_cast<T*>(out), outer, n, inner, r, sm_count_, stream_, workspace, release);
          return;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: {
          const MaxMinReducer<T> r{op == ReduceOp::Max};
          launch_reduce(xt, static_cast<T*>(out), outer, n, inner, r, sm_count_, stream_, workspace, release);
          return;
        }
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin: {
          const ArgReducer<T> r{op == ReduceOp::ArgMax};
          launch_reduce(xt, static_cast<int64_t*>(out), outer, n, inner, r, sm_count_, stream_, workspace, release);
          return;
        }
      }
      throw ValueError(::ember::detail::str_cat("reduce: unknown op ", static_cast<int>(op), " on cuda:", device_));
    });
  }
  void nonfinite_check(DType t, const void* x, int64_t n, uint8_t* flag) override {
    if (n <= 0 || !is_floating(t)) return;  // integers are always finite (as on the CPU)
    Guard g(device_);
    dispatch_floating(t, "nonfinite_check", device_, [&](auto tag) {
      using T = decltype(tag);
      nonfinite_kernel<T><<<grid(n), kThreads, 0, stream_>>>(static_cast<const T*>(x), n, flag);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }

  void gemm(const GemmArgs& args) override { ::ember::cuda::gemm(device_, args); }
  // Bias and activation in cuBLASLt's epilogue (backend/cuda/cublas_lt.hpp), else the composite.
  void linear_act_forward(const LinearActArgs& a, const void* x, const void* w, const void* b, void* z,
                          void* y) override {
    auto workspace = [this](size_t bytes) { return alloc_.allocate(bytes); };
    auto release = [this](void* p, size_t bytes) { alloc_.deallocate(p, bytes); };
    if (::ember::cuda::linear_act_lt(device_, stream_, a, x, w, b, z, y, workspace, release)) return;
    linear_act_composite(*this, a, x, w, b, z, y);
  }

  // ---- softmax
  void softmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log) override {
    dispatch_floating(t, log ? "log_softmax" : "softmax", device_, [&](auto tag) {
      using T = decltype(tag);
      if (rows <= 0 || cols <= 0) return;
      Guard g(device_);
      launch_softmax_forward<T>(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log, sm_count_, stream_);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  }
  void softmax_backward(DType t, const void* y, const void* gy, void* gx, int64_t rows, int64_t cols,
                        bool log) override {
    dispatch_floating(t, log ? "log_softmax_backward" : "softmax_backward", device_, [&](auto tag) {
      using T = decltype(tag);
      if (rows <= 0 || cols <= 0) return;
      Guard g(device_);
      launch_softmax_backward<T>(static_cast<const T*>(y), static_cast<const T*>(gy), static_cast<T*>(gx), rows, cols,
                                 log, sm_count_, stream_);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  }

  // ---- fused layer norm / RMSNorm (kernels/norm.cuh)
  void norm_forward(const NormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                    void* rstd) override {
    dispatch_floating(a.dtype, a.rms ? "rms_norm" : "layer_norm", device_, [&](auto tag) {
      using T = decltype(tag);
      using S = norm_stat_t<T>;
      if (a.rows <= 0 || a.cols <= 0) return;
      Guard g(device_);
      launch_norm_forward<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                             static_cast<T*>(y), static_cast<S*>(mean), static_cast<S*>(rstd), a.rows, a.cols, a.eps,
                             a.rms, sm_count_, stream_);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  }
  void norm_backward(const NormArgs& a, const void* x, const void* w, const void* mean, const void* rstd,
                     const void* gy, void* gx, void* gw, void* gb) override {
    dispatch_floating(a.dtype, a.rms ? "rms_norm_backward" : "layer_norm_backward", device_, [&](auto tag) {
      using T = decltype(tag);
      using S = norm_stat_t<T>;
      if (a.cols <= 0) return;
      Guard g(device_);
      if (a.rows > 0) {
        launch_norm_backward<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const S*>(mean),
                                static_cast<const S*>(rstd), static_cast<const T*>(gy), static_cast<T*>(gx), a.rows,
                                a.cols, a.rms, sm_count_, stream_);
        EMBER_CUDA_CHECK_LAUNCH();
      }
      if (gw || gb) {
        using C = calc_t<T>;
        const unsigned blocks = static_cast<unsigned>((a.cols + kNormColThreads - 1) / kNormColThreads);
        const int64_t chunk = a.rows > 0 ? norm_param_grad_chunk(a.rows, a.cols, sm_count_) : 1;
        const int64_t chunks = a.rows > 0 ? (a.rows + chunk - 1) / chunk : 1;
        const dim3 grid(blocks, static_cast<unsigned>(chunks)), block(kNormColThreads, kNormRowPhases);
        const T* xt = static_cast<const T*>(x);
        const S* mt = static_cast<const S*>(mean);
        const S* rt = static_cast<const S*>(rstd);
        const T* gyt = static_cast<const T*>(gy);
        if (chunks == 1) {
          norm_param_grad_kernel<T><<<grid, block, 0, stream_>>>(xt, mt, rt, gyt, static_cast<T*>(gw),
                                                                 static_cast<T*>(gb), nullptr, nullptr, a.rows,
                                                                 a.cols, chunk, a.rms);
          EMBER_CUDA_CHECK_LAUNCH();
        } else {
          const size_t bytes = static_cast<size_t>(2 * chunks * a.cols) * sizeof(C);
          C* pw = static_cast<C*>(alloc_.allocate(bytes));
          C* pb = pw + chunks * a.cols;
          norm_param_grad_kernel<T><<<grid, block, 0, stream_>>>(xt, mt, rt, gyt, nullptr, nullptr, pw, pb, a.rows,
                                                                 a.cols, chunk, a.rms);
          cudaError_t e = cudaGetLastError();
          if (e == cudaSuccess) {
            norm_param_grad_finish_kernel<T><<<grid_for(a.cols, sm_count_), kThreads, 0, stream_>>>(
                pw, pb, static_cast<T*>(gw), static_cast<T*>(gb), chunks, a.cols);
            e = cudaGetLastError();
          }
          alloc_.deallocate(pw, bytes);
          ::ember::cuda::internal::check_cuda(e, "norm_param_grad kernel launch", __FILE__, __LINE__);
        }
      }
    });
  }

  // ---- fused cross-entropy (kernels/cross_entropy.cuh)
  void cross_entropy_forward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                             void* loss, void* lse, void* wt) override {
    dispatch_floating(a.dtype, "cross_entropy", device_, [&](auto tag) {
      using T = decltype(tag);
      using S = norm_stat_t<T>;
      if (a.rows <= 0 || a.classes <= 0) return;
      Guard g(device_);
      const SoftmaxLaunch l = softmax_launch(a.rows, a.classes, sm_count_);
      const T* xt = static_cast<const T*>(x);
      const T* wt_ = static_cast<const T*>(w);
      T* lt = static_cast<T*>(loss);
      S* st = static_cast<S*>(lse);
      T* wo = static_cast<T*>(wt);
      if (l.block_per_row)
        cross_entropy_forward_kernel<T, true><<<l.grid, l.threads, 0, stream_>>>(
            xt, target, wt_, lt, st, wo, a.rows, a.classes, a.ignore_index, a.label_smoothing);
      else
        cross_entropy_forward_kernel<T, false><<<l.grid, l.threads, 0, stream_>>>(
            xt, target, wt_, lt, st, wo, a.rows, a.classes, a.ignore_index, a.label_smoothing);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  }
  void cross_entropy_backward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                              const void* lse, const void* gloss, void* gx) override {
    dispatch_floating(a.dtype, "cross_entropy_backward", device_, [&](auto tag) {
      using T = decltype(tag);
      using S = norm_stat_t<T>;
      if (a.rows <= 0 || a.classes <= 0) return;
      Guard g(device_);
      const SoftmaxLaunch l = softmax_launch(a.rows, a.classes, sm_count_);
      const T* xt = static_cast<const T*>(x);
      const T* wt_ = static_cast<const T*>(w);
      const S* st = static_cast<const S*>(lse);
      const T* gl = static_cast<const T*>(gloss);
      T* gxt = static_cast<T*>(gx);
      if (l.block_per_row)
        cross_entropy_backward_kernel<T, true><<<l.grid, l.threads, 0, stream_>>>(
            xt, target, wt_, st, gl, gxt, a.rows, a.classes, a.ignore_index, a.label_smoothing);
      else
        cross_entropy_backward_kernel<T, false><<<l.grid, l.threads, 0, stream_>>>(
            xt, target, wt_, st, gl, gxt, a.rows, a.classes, a.ignore_index, a.label_smoothing);
      EMBER_CUDA_CHECK_LAUNCH();
    });
  }

  // ---- fused scaled dot-product attention (kernels/attention.cuh)
  void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                         void* out, void* lse) override {
    Guard g(device_);
    launch_attention_forward(a, q, k, v, mask, out, lse, device_, sm_count_, stream_);
  }
  void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                          const void* out, const void* lse, const void* gout, void* delta, void* gq, void* gk,
                          void* gv) override {
    Guard g(device_);
    launch_attention_backward(a, q, k, v, mask, out, lse, gout, delta, gq, gk, gv, device_, sm_count_, stream_);
  }

  // ---- fused optimizer steps (kernels/optim_step.cuh)
  void adam_step(const AdamStepArgs& a, void* param, void* grad, void* exp_avg, void* exp_avg_sq,
                 void* max_exp_avg_sq) override {
    Guard g(device_);
    launch_adam_step(a, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, device_, grid(a.n), stream_);
  }
  void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* momentum_buffer) override {
    Guard g(device_);
    launch_sgd_step(a, param, grad, momentum_buffer, device_, grid(a.n), stream_);
  }
  void rmsprop_step(const RmspropStepArgs& a, void* param, void* grad, void* square_avg, void* grad_avg,
                    void* momentum_buffer) override {
    Guard g(device_);
    launch_rmsprop_step(a, param, grad, square_avg, grad_avg, momentum_buffer, device_, grid(a.n), stream_);
  }

  // ---- indexing
  void index_select(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n,
                    int64_t idx_n, int64_t inner) override {
    const int64_t total = outer * idx_n * inner;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_bits(t, [&](auto tag) {
      using B = decltype(tag);
      index_select_kernel<B><<<grid(total), kThreads, 0, stream_>>>(static_cast<const B*>(x), idx, static_cast<B*>(out),
                                                                   src_n, idx_n, inner, total);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void index_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n, int64_t idx_n,
                 int64_t inner) override {
    const int64_t total = outer * idx_n * inner;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      index_add_kernel<T><<<grid(total), kThreads, 0, stream_>>>(static_cast<const T*>(gy), idx, static_cast<T*>(gx),
                                                                src_n, idx_n, inner, total);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void gather(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n, int64_t idx_n,
              int64_t inner) override {
    const int64_t total = outer * idx_n * inner;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_bits(t, [&](auto tag) {
      using B = decltype(tag);
      gather_kernel<B><<<grid(total), kThreads, 0, stream_>>>(static_cast<const B*>(x), idx, static_cast<B*>(out), src_n,
                                                             idx_n, inner, total);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void scatter_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n,
                   int64_t idx_n, int64_t inner) override {
    const int64_t total = outer * idx_n * inner;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_all(t, [&](auto tag) {
      using T = decltype(tag);
      scatter_add_kernel<T><<<grid(total), kThreads, 0, stream_>>>(static_cast<const T*>(gy), idx, static_cast<T*>(gx),
                                                                  src_n, idx_n, inner, total);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }

  // ---- convolution (cuDNN) and pooling
  // cuDNN rejects tensors with a zero dimension (CUDNN_STATUS_BAD_PARAM); an empty batch or no input
  // channels gives what the CPU twin gives: zeros in whichever result is not empty itself.
  void conv2d_forward(const Conv2dArgs& a, const void* x, const void* w, void* y) override {
    Guard g(device_);
    if (a.n == 0 || a.c_in == 0) return zero_fill(y, a.n * a.c_out * a.out_h * a.out_w, a.dtype);
    ::ember::cuda::conv_plan(a, device_).forward(x, w, y, a.dtype);
  }
  void conv2d_backward_input(const Conv2dArgs& a, const void* gy, const void* w, void* gx) override {
    Guard g(device_);
    if (a.n == 0 || a.c_in == 0) return zero_fill(gx, a.n * a.c_in * a.h * a.w, a.dtype);
    ::ember::cuda::conv_plan(a, device_).backward_input(gy, w, gx, a.dtype);
  }
  void conv2d_backward_weight(const Conv2dArgs& a, const void* x, const void* gy, void* gw) override {
    Guard g(device_);
    if (a.n == 0 || a.c_in == 0)
      return zero_fill(gw, a.c_out * (a.c_in / std::max<int64_t>(a.groups, 1)) * a.kh * a.kw, a.dtype);
    ::ember::cuda::conv_plan(a, device_).backward_weight(x, gy, gw, a.dtype);
  }
  void zero_fill(void* p, int64_t numel, DType t) {
    if (numel > 0) EMBER_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(numel) * dtype_size(t), stream_));
  }
  void max_pool2d_forward(const Pool2dArgs& p, const void* x, void* y, int64_t* indices) override {
    const int64_t total = p.n * p.c * p.out_h * p.out_w;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_floating(p.dtype, "max_pool2d", device_, [&](auto tag) {
      using T = decltype(tag);
      max_pool2d_forward_kernel<T><<<grid(total), kThreads, 0, stream_>>>(p, static_cast<const T*>(x), static_cast<T*>(y),
                                                                          indices);
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void max_pool2d_backward(const Pool2dArgs& p, const void* gy, const int64_t* indices, void* gx) override {
    const int64_t total = p.n * p.c * p.h * p.w;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_floating(p.dtype, "max_pool2d_backward", device_, [&](auto tag) {
      using T = decltype(tag);
      max_pool2d_backward_kernel<T><<<grid(total), kThreads, 0, stream_>>>(p, static_cast<const T*>(gy), indices,
                                                                           static_cast<T*>(gx));
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void avg_pool2d_forward(const Pool2dArgs& p, const void* x, void* y) override {
    const int64_t total = p.n * p.c * p.out_h * p.out_w;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_floating(p.dtype, "avg_pool2d", device_, [&](auto tag) {
      using T = decltype(tag);
      avg_pool2d_forward_kernel<T><<<grid(total), kThreads, 0, stream_>>>(p, static_cast<const T*>(x), static_cast<T*>(y));
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }
  void avg_pool2d_backward(const Pool2dArgs& p, const void* gy, void* gx) override {
    const int64_t total = p.n * p.c * p.h * p.w;
    if (total <= 0) return;
    Guard g(device_);
    dispatch_floating(p.dtype, "avg_pool2d_backward", device_, [&](auto tag) {
      using T = decltype(tag);
      avg_pool2d_backward_kernel<T><<<grid(total), kThreads, 0, stream_>>>(p, static_cast<const T*>(gy), static_cast<T*>(gx));
    });
    EMBER_CUDA_CHECK_LAUNCH();
  }

 private:
  using Guard = ::ember::cuda::DeviceGuard;
  unsigned grid(int64_t n) const { return grid_for(n, sm_count_); }

  int device_;
  cudaStream_t stream_;
  ::ember::cuda::DeviceAllocator alloc_;
  int sm_count_;
  UploadStaging staging_;

  // upload_async's events: pending in ticket order (the copy stream runs them in that order).
  struct Upload {
    cudaEvent_t ready = nullptr;
    cudaEvent_t done = nullptr;
    uint64_t ticket = 0;
  };
  // Moves the finished uploads (a prefix of pending_uploads_) to the free list. Holds upload_mu_.
  void retire_uploads() {
    while (!pending_uploads_.empty()) {
      cudaError_t q = cudaEventQuery(pending_uploads_.front().done);
      if (q == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return;
      }
      ::ember::cuda::internal::check_cuda(q, "cudaEventQuery(upload)", __FILE__, __LINE__);
      finished_ticket_ = pending_uploads_.front().ticket;
      free_uploads_.push_back(pending_uploads_.front());
      pending_uploads_.erase(pending_uploads_.begin());
    }
  }
  cudaStream_t copy_stream_ = nullptr;
  std::mutex upload_mu_;
  std::mutex timing_mu_;                     // the timing event pool
  std::vector<cudaEvent_t> timing_events_;   // never destroyed (the backend lives for the program)
  size_t timing_used_ = 0;
  std::vector<Upload> pending_uploads_, free_uploads_;
  uint64_t last_ticket_ = 0, finished_ticket_ = 0;
};

}  // namespace
}  // namespace ember::cuda_impl
#endif  // __CUDACC__
