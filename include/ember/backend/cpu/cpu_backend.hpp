#pragma once
// The CPU backend: the reference implementation of every kernel in the table (core/backend.hpp).
#include <cstring>

#include "ember/backend/allocator_backend.hpp"
#include "ember/backend/composite.hpp"
#include "ember/backend/cpu/allocator.hpp"
#include "ember/backend/cpu/attention.hpp"
#include "ember/backend/cpu/batch_norm.hpp"
#include "ember/backend/cpu/conv.hpp"
#include "ember/backend/cpu/elementwise.hpp"
#include "ember/backend/cpu/gemm.hpp"
#include "ember/backend/cpu/index.hpp"
#include "ember/backend/cpu/pool.hpp"
#include "ember/backend/cpu/loss.hpp"
#include "ember/backend/cpu/norm.hpp"
#include "ember/backend/cpu/optim_step.hpp"
#include "ember/backend/cpu/preprocess.hpp"
#include "ember/backend/cpu/reduce.hpp"
#include "ember/backend/cpu/softmax.hpp"

namespace ember::cpu {

namespace detail {
// The dtypes of the fused kernels that take float32 and float64 only (attention, batch norm; their
// ops take the composite path otherwise).
template <class F>
void dispatch_f32_f64(DType t, const char* op, F&& f) {
  if (t == DType::Float32) return f(float{});
  if (t == DType::Float64) return f(double{});
  throw DTypeError(std::string(op) + ": the fused kernel takes float32 or float64, got " + dtype_name(t) + " on cpu");
}
}  // namespace detail

class CpuBackend : public AllocatorBackend<HostAllocator> {
 public:
  // A fused optimizer step (`op`: adam_step, sgd_step, rmsprop_step): dispatches the state type
  // (float32 or float64) and the parameter's and the gradient's dtypes, then calls
  // kernel.template operator()<P, G, S>(). (The dtype test sits in optim_step_typed: written inside
  // the nested generic lambdas, GCC 12 evaluated std::is_floating_point_v<compute_t<P>> as false
  // for P = double.)
  template <class Kernel>
  static void optim_step(const char* op, DType state, DType param, DType grad, Kernel&& kernel) {
    if (state == DType::Float32)
      optim_step_as<float>(op, param, grad, kernel);
    else if (state == DType::Float64)
      optim_step_as<double>(op, param, grad, kernel);
    else
      throw DTypeError(std::string(op) + ": the state is float32 or float64, got " + dtype_name(state));
  }
  template <class S, class Kernel>
  static void optim_step_as(const char* op, DType param, DType grad, Kernel& kernel) {
    dispatch_dtype(param, [&](auto ptag) {
      dispatch_dtype(grad, [&](auto gtag) {
        optim_step_typed<S, decltype(ptag), decltype(gtag)>(op, param, grad, kernel);
      });
    });
  }
  template <class S, class P, class G, class Kernel>
  static void optim_step_typed(const char* op, DType param, DType grad, Kernel& kernel) {
    if constexpr (std::is_floating_point_v<compute_t<P>> && std::is_floating_point_v<compute_t<G>>) {
      kernel.template operator()<P, G, S>();
    } else {
      throw DTypeError(std::string(op) + ": floating parameters and gradients only, got " + dtype_name(param) +
                       " and " + dtype_name(grad));
    }
  }

  Device device() const override { return Device::cpu(); }

  void synchronize() override {}

  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memmove(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
               size_t rows) override {
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
  }

  void fill(DType t, void* dst, int64_t n, double v) override {
    dispatch_dtype(t, [&](auto tag) { cpu::fill(static_cast<decltype(tag)*>(dst), n, v); });
  }
  void arange(DType t, void* dst, int64_t n, double start, double step) override {
    dispatch_dtype(t, [&](auto tag) { cpu::arange(static_cast<decltype(tag)*>(dst), n, start, step); });
  }
  void cast(DType st, const void* src, DType dt, void* dst, int64_t n) override {
    dispatch_dtype(st, [&](auto s) {
      dispatch_dtype(dt, [&](auto d) {
        cpu::cast(static_cast<const decltype(s)*>(src), static_cast<decltype(d)*>(dst), n);
      });
    });
  }
  void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override {
    dispatch_dtype(t, [&](auto tag) { cpu::random_uniform(static_cast<decltype(tag)*>(dst), n, seed, offset, lo, hi); });
  }
  void random_normal(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double mean,
                     double stddev) override {
    dispatch_dtype(t, [&](auto tag) {
      cpu::random_normal(static_cast<decltype(tag)*>(dst), n, seed, offset, mean, stddev);
    });
  }

  void unary(UnaryOp op, DType t, const void* x, void* out, int64_t n, double a, double b) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::unary(op, static_cast<const T*>(x), static_cast<T*>(out), n, a, b);
    });
  }
  void unary_backward(UnaryOp op, DType t, const void* x, const void* y, const void* gy, void* gx, int64_t n, double a,
                      double b) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::unary_backward(op, static_cast<const T*>(x), static_cast<const T*>(y), static_cast<const T*>(gy),
                          static_cast<T*>(gx), n, a, b);
    });
  }
  void binary(BinaryOp op, DType t, const void* a, const void* b, void* out, const StridedArgs& s) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::binary(op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), s);
    });
  }
  void compare(CompareOp op, DType t, const void* a, const void* b, uint8_t* out, const StridedArgs& s) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::compare(op, static_cast<const T*>(a), static_cast<const T*>(b), out, s);
    });
  }
  void where(DType t, const uint8_t* cond, const void* a, const void* b, void* out, const StridedArgs& s) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::where(cond, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), s);
    });
  }
  void strided_copy(DType t, const void* src, void* out, const StridedArgs& s) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::strided_copy(static_cast<const T*>(src), static_cast<T*>(out), s);
    });
  }
  void reduce(ReduceOp op, DType t, const void* x, void* out, int64_t outer, int64_t n, int64_t inner) override {
    dispatch_dtype(t, [&](auto tag) { cpu::reduce(op, static_cast<const decltype(tag)*>(x), out, outer, n, inner); });
  }
  void nonfinite_check(DType t, const void* x, int64_t n, uint8_t* flag) override {
    dispatch_dtype(t, [&](auto tag) { cpu::nonfinite_check(static_cast<const decltype(tag)*>(x), n, flag); });
  }
  void gemm(const GemmArgs& g) override { cpu::gemm(g); }
  // No fused kernel: the composite, whose bits op::linear and the activation give.
  void linear_act_forward(const LinearActArgs& a, const void* x, const void* w, const void* b, void* z,
                          void* y) override {
    linear_act_composite(*this, a, x, w, b, z, y);
  }
  void softmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::softmax(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, log);
    });
  }
  void softmax_backward(DType t, const void* y, const void* gy, void* gx, int64_t rows, int64_t cols,
                        bool log) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::softmax_backward(static_cast<const T*>(y), static_cast<const T*>(gy), static_cast<T*>(gx), rows, cols, log);
    });
  }
  void norm_forward(const NormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                    void* rstd) override {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<compute_t<T>>) {
        using S = cpu::norm_stat_t<T>;
        cpu::norm_forward<T>(a, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                             static_cast<T*>(y), static_cast<S*>(mean), static_cast<S*>(rstd));
      } else {
        throw DTypeError(std::string("layer_norm: floating types only, got ") + dtype_name(a.dtype));
      }
    });
  }
  void norm_backward(const NormArgs& a, const void* x, const void* w, const void* mean, const void* rstd,
                     const void* gy, void* gx, void* gw, void* gb) override {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<compute_t<T>>) {
        using S = cpu::norm_stat_t<T>;
        cpu::norm_backward<T>(a, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const S*>(mean),
                              static_cast<const S*>(rstd), static_cast<const T*>(gy), static_cast<T*>(gx),
                              static_cast<T*>(gw), static_cast<T*>(gb));
      } else {
        throw DTypeError(std::string("layer_norm backward: floating types only, got ") + dtype_name(a.dtype));
      }
    });
  }
  // Batch norm (backend/cpu/batch_norm.hpp): fp32 and fp64.
  bool runs_batch_norm(const BatchNormArgs& a) const override {
    return a.dtype == DType::Float32 || a.dtype == DType::Float64;
  }
  void batch_norm_forward(const BatchNormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                          void* var, void* invstd) override {
    detail::dispatch_f32_f64(a.dtype, "batch_norm_forward", [&](auto tag) {
      using T = decltype(tag);
      cpu::batch_norm_forward<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), a.n,
                                 a.c, a.s, a.eps, static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(var),
                                 static_cast<T*>(invstd));
    });
  }
  void batch_norm_backward(const BatchNormArgs& a, const void* x, const void* w, const void* mean, const void* invstd,
                           const void* gy, void* gx, void* gw, void* gb) override {
    detail::dispatch_f32_f64(a.dtype, "batch_norm_backward", [&](auto tag) {
      using T = decltype(tag);
      cpu::batch_norm_backward<T>(static_cast<const T*>(x), static_cast<const T*>(gy), static_cast<const T*>(w),
                                  static_cast<const T*>(mean), static_cast<const T*>(invstd), a.n, a.c, a.s,
                                  static_cast<T*>(gx), static_cast<T*>(gw), static_cast<T*>(gb));
    });
  }
  void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                         void* out, void* lse) override {
    detail::dispatch_f32_f64(a.dtype, "scaled_dot_product_attention", [&](auto tag) {
      using T = decltype(tag);
      cpu::attention_forward<T>(a, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                static_cast<const T*>(mask), static_cast<T*>(out),
                                static_cast<cpu::norm_stat_t<T>*>(lse));
    });
  }
  void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v, const void* mask,
                          const void* out, const void* lse, const void* gout, void* delta, void* gq, void* gk,
                          void* gv) override {
    detail::dispatch_f32_f64(a.dtype, "scaled_dot_product_attention backward", [&](auto tag) {
      using T = decltype(tag);
      using S = cpu::norm_stat_t<T>;
      cpu::attention_backward<T>(a, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                 static_cast<const T*>(mask), static_cast<const T*>(out), static_cast<const S*>(lse),
                                 static_cast<const T*>(gout), static_cast<S*>(delta), static_cast<T*>(gq),
                                 static_cast<T*>(gk), static_cast<T*>(gv));
    });
  }
  void adam_step(const AdamStepArgs& a, void* param, void* grad, void* exp_avg, void* exp_avg_sq,
                 void* max_exp_avg_sq) override {
    optim_step("adam_step", a.state_dtype, a.param_dtype, a.grad_dtype, [&]<class P, class G, class S>() {
      cpu::adam_step<P, G, S>(a, static_cast<P*>(param), static_cast<G*>(grad), static_cast<S*>(exp_avg),
                              static_cast<S*>(exp_avg_sq), static_cast<S*>(max_exp_avg_sq));
    });
  }
  void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* momentum_buffer) override {
    optim_step("sgd_step", a.state_dtype, a.param_dtype, a.grad_dtype, [&]<class P, class G, class S>() {
      cpu::sgd_step<P, G, S>(a, static_cast<P*>(param), static_cast<G*>(grad), static_cast<S*>(momentum_buffer));
    });
  }
  void rmsprop_step(const RmspropStepArgs& a, void* param, void* grad, void* square_avg, void* grad_avg,
                    void* momentum_buffer) override {
    optim_step("rmsprop_step", a.state_dtype, a.param_dtype, a.grad_dtype, [&]<class P, class G, class S>() {
      cpu::rmsprop_step<P, G, S>(a, static_cast<P*>(param), static_cast<G*>(grad), static_cast<S*>(square_avg),
                                 static_cast<S*>(grad_avg), static_cast<S*>(momentum_buffer));
    });
  }
  void cross_entropy_forward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                             void* loss, void* lse, void* wt) override {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<compute_t<T>>) {
        cpu::cross_entropy_forward<T>(a, static_cast<const T*>(x), target, static_cast<const T*>(w),
                                      static_cast<T*>(loss), static_cast<cpu::norm_stat_t<T>*>(lse),
                                      static_cast<T*>(wt));
      } else {
        throw DTypeError(std::string("cross_entropy: floating types only, got ") + dtype_name(a.dtype));
      }
    });
  }
  void cross_entropy_backward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                              const void* lse, const void* gloss, void* gx) override {
    dispatch_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_floating_point_v<compute_t<T>>) {
        cpu::cross_entropy_backward<T>(a, static_cast<const T*>(x), target, static_cast<const T*>(w),
                                       static_cast<const cpu::norm_stat_t<T>*>(lse), static_cast<const T*>(gloss),
                                       static_cast<T*>(gx));
      } else {
        throw DTypeError(std::string("cross_entropy backward: floating types only, got ") + dtype_name(a.dtype));
      }
    });
  }
  void index_select(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n,
                    int64_t idx_n, int64_t inner) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::index_select(static_cast<const T*>(x), idx, static_cast<T*>(out), outer, src_n, idx_n, inner);
    });
  }
  void index_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n, int64_t idx_n,
                 int64_t inner) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::index_add(static_cast<const T*>(gy), idx, static_cast<T*>(gx), outer, src_n, idx_n, inner);
    });
  }
  void gather(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n, int64_t idx_n,
              int64_t inner) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::gather(static_cast<const T*>(x), idx, static_cast<T*>(out), outer, src_n, idx_n, inner);
    });
  }
  void scatter_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n,
                   int64_t idx_n, int64_t inner) override {
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      cpu::scatter_add(static_cast<const T*>(gy), idx, static_cast<T*>(gx), outer, src_n, idx_n, inner);
    });
  }

  void conv2d_forward(const Conv2dArgs& a, const void* x, const void* w, void* y) override {
    dispatch_float(a.dtype, "conv2d", [&](auto tag) {
      using T = decltype(tag);
      cpu::conv2d_forward(a, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y));
    });
  }
  void conv2d_backward_input(const Conv2dArgs& a, const void* gy, const void* w, void* gx) override {
    dispatch_float(a.dtype, "conv2d_backward", [&](auto tag) {
      using T = decltype(tag);
      cpu::conv2d_backward_input(a, static_cast<const T*>(gy), static_cast<const T*>(w), static_cast<T*>(gx));
    });
  }
  void conv2d_backward_weight(const Conv2dArgs& a, const void* x, const void* gy, void* gw) override {
    dispatch_float(a.dtype, "conv2d_backward", [&](auto tag) {
      using T = decltype(tag);
      cpu::conv2d_backward_weight(a, static_cast<const T*>(x), static_cast<const T*>(gy), static_cast<T*>(gw));
    });
  }
  void max_pool2d_forward(const Pool2dArgs& p, const void* x, void* y, int64_t* indices) override {
    dispatch_float(p.dtype, "max_pool2d", [&](auto tag) {
      using T = decltype(tag);
      cpu::max_pool2d_forward(p, static_cast<const T*>(x), static_cast<T*>(y), indices);
    });
  }
  void max_pool2d_backward(const Pool2dArgs& p, const void* gy, const int64_t* indices, void* gx) override {
    dispatch_float(p.dtype, "max_pool2d_backward", [&](auto tag) {
      using T = decltype(tag);
      cpu::max_pool2d_backward(p, static_cast<const T*>(gy), indices, static_cast<T*>(gx));
    });
  }
  void avg_pool2d_forward(const Pool2dArgs& p, const void* x, void* y) override {
    dispatch_float(p.dtype, "avg_pool2d", [&](auto tag) {
      using T = decltype(tag);
      cpu::avg_pool2d_forward(p, static_cast<const T*>(x), static_cast<T*>(y));
    });
  }
  void avg_pool2d_backward(const Pool2dArgs& p, const void* gy, void* gx) override {
    dispatch_float(p.dtype, "avg_pool2d_backward", [&](auto tag) {
      using T = decltype(tag);
      cpu::avg_pool2d_backward(p, static_cast<const T*>(gy), static_cast<T*>(gx));
    });
  }

  void* allocate_pinned(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + (bytes == 0 ? 64 : 0));
    if (!p) throw OutOfMemory(::ember::detail::str_cat("out of memory on cpu: allocating ", bytes,
                                                       " bytes of staging (pinned) host memory failed"),
                              static_cast<int64_t>(bytes), 0, -1);
    return p;
  }
  void free_pinned(void* p, size_t) noexcept override { std::free(p); }
  // Host to host: the copy is done when the call returns.
  uint64_t upload_async(void* dst, const void* src, size_t bytes) override {
    copy(dst, src, bytes);
    return upload_ticket_.fetch_add(1) + 1;
  }
  bool upload_finished(uint64_t) override { return true; }
  void wait_upload(uint64_t) override {}
  void download_async(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }

  void preprocess_images(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, void* y) override {
    switch (a.out_dtype) {
      case DType::Float32: cpu::preprocess_images(a, x, params, static_cast<float*>(y)); return;
      case DType::Float16: cpu::preprocess_images(a, x, params, static_cast<half*>(y)); return;
      case DType::BFloat16: cpu::preprocess_images(a, x, params, static_cast<bfloat16*>(y)); return;
      default:
        throw DTypeError(::ember::detail::str_cat("preprocess_images: output dtype ", dtype_name(a.out_dtype),
                                                  " (float32, float16 or bfloat16) on cpu"));
    }
  }

 private:
  // Floating types only; the ops check first, so another dtype here is a bug in the caller.
  template <class F>
  static void dispatch_float(DType t, const char* op, F&& f) {
    switch (t) {
      case DType::Float32: f(float{}); return;
      case DType::Float64: f(double{}); return;
      case DType::Float16: f(half{}); return;
      case DType::BFloat16: f(bfloat16{}); return;
      default: throw DTypeError(::ember::detail::str_cat(op, ": unsupported dtype ", dtype_name(t), " on cpu"));
    }
  }

  std::atomic<uint64_t> upload_ticket_{0};
};

}  // namespace ember::cpu

#if !defined(EMBER_COMPILED_LIB)
namespace ember {
inline Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}
}  // namespace ember
#endif
