#pragma once
// The kernel table: the abstract Backend, the problem descriptions its kernels take, and memory
// statistics. Kernel implementations (backend/cpu, backend/cuda) include this file; code that asks
// for a device's backend includes core/backend_registry.hpp (backend_for), which adds the CPU
// backend when it is header-only.
//
// Every device-specific operation goes through the
// abstract `Backend`. The CPU backend is defined inline in headers; the CUDA backend is defined in
// the one translation unit compiled by nvcc (include/ember/backend/cuda/ember_cuda.cu), which
// registers it at start-up. So every other translation unit sees the same inline definitions,
// whether or not CUDA is present, and mixing g++ and nvcc units is not an ODR violation.
//
// All pointers are raw device (or host) pointers to contiguous buffers; sizes and strides are in
// elements unless the name says bytes. Ops validate shapes and dtypes before calling in here.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/error.hpp"
#include "ember/core/shape.hpp"

namespace ember {

struct MemoryStats {
  int64_t current_bytes = 0;     // bytes held by live tensors
  int64_t peak_bytes = 0;        // maximum of current_bytes since the last reset_peak
  int64_t num_allocations = 0;   // allocations served since start
  int64_t limit_bytes = -1;      // allocations beyond this throw OutOfMemory; -1: no limit
  int64_t cached_bytes = 0;      // freed memory kept for reuse, not in use (see empty_cache)
};

enum class UnaryOp : uint8_t {
  Neg, Exp, Log, Sqrt, Abs, Relu, Gelu, GeluTanh, Silu, Tanh, Sigmoid,
  Pow,        // x ^ a
  Clamp,      // min(max(x, a), b)
  AddScalar,  // x + a
  MulScalar,  // x * a
  RSubScalar, // a - x
  RDivScalar, // a / x
  Square,
  Reciprocal,
  Sign,
  FakeQuantize,  // clamp(round_half_even(x / a), -b - 1, b) * a: symmetric integer quantization, dequantized
};

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div, Pow, Maximum, Minimum };
enum class CompareOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
enum class ReduceOp : uint8_t { Sum, Mean, Max, Min, ArgMax, ArgMin };

// An N-d strided view used by broadcasting kernels: `shape` of the output, and for each input the
// element strides to walk it (0 along a broadcast dimension).
struct StridedArgs {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride_a[kMaxDims] = {};
  int64_t stride_b[kMaxDims] = {};
  int64_t stride_c[kMaxDims] = {};  // third operand (where: the condition)
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
};

struct GemmArgs {
  DType dtype = DType::Float32;
  bool trans_a = false, trans_b = false;  // row-major: C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr; int64_t lda = 0; int64_t stride_a = 0;
  const void* b = nullptr; int64_t ldb = 0; int64_t stride_b = 0;
  void* c = nullptr; int64_t ldc = 0; int64_t stride_c = 0;
  int64_t batch = 1;
  double alpha = 1.0, beta = 0.0;
};

// A 2-D convolution problem, NCHW: x [n, c_in, h, w], weight [c_out, c_in/groups, kh, kw],
// y [n, c_out, out_h, out_w] (cross-correlation, as every deep-learning framework computes).
struct Conv2dArgs {
  DType dtype = DType::Float32;
  int64_t n = 0, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, kh = 0, kw = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
  int64_t out_h = 0, out_w = 0;
};

// A 2-D pooling problem, NCHW. Window o along an axis spans [o*stride - pad, o*stride - pad + k)
// clipped to the input, or, when `adaptive`, [floor(o*in/out), ceil((o+1)*in/out)).
struct Pool2dArgs {
  DType dtype = DType::Float32;
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;
  bool count_include_pad = true;  // average pooling: padding counts in the divisor
  bool adaptive = false;
};

// Fused image preprocessing (data/device_preprocess.hpp): x uint8 [n, h, w, c] (c <= 4) ->
// y [n, c, out_h, out_w] of out_dtype (float32, float16 or bfloat16), where y(i, ch, oy, ox) =
// (v * scale - mean[ch]) * inv_std[ch] and v is x at (top + oy, left + (flip ? out_w-1-ox : ox))
// of sample i, or 0 outside the image; params int32 [n, 3] = (top, left, flip) per sample, on the
// device. Each operation is rounded on its own, so the CPU transforms give the same numbers.
struct PreprocessArgs {
  int64_t n = 0, h = 0, w = 0, c = 0;
  int64_t out_h = 0, out_w = 0;
  DType out_dtype = DType::Float32;
  float scale = 1.0f / 255.0f;
  float mean[4] = {0, 0, 0, 0};
  float inv_std[4] = {1, 1, 1, 1};
};

// A Linear layer with its activation (ops/linalg.hpp linear_act): z = x W^T + b and y = act(z),
// for x [rows, in], w [out, in], b [out] or null, z and y [rows, out], all contiguous and of one
// floating dtype. z is written only where the backward needs it (not for None and Relu, whose
// derivative reads y: y > 0 exactly where z > 0, and NaN passes in both) and may be null there.
enum class LinearActivation : uint8_t { None, Relu, Gelu, GeluTanh };
struct LinearActArgs {
  DType dtype = DType::Float32;
  int64_t rows = 0, in = 0, out = 0;
  LinearActivation act = LinearActivation::None;
};
inline bool linear_act_needs_z(LinearActivation a) {
  return a == LinearActivation::Gelu || a == LinearActivation::GeluTanh;
}

// Layer normalisation over the last axis of a contiguous [rows, cols] matrix (ops/norm.hpp):
// y = (x - mean) * rstd * w + b with rstd = 1 / sqrt(var + eps), var biased; RMSNorm when `rms`
// (mean taken as 0: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), no bias). w and b are
// [cols] of the same dtype, or null. mean and rstd are [rows] in the statistics type: double for
// float64, float otherwise (mean is not written for rms and may be null).
struct NormArgs {
  DType dtype = DType::Float32;
  int64_t rows = 0, cols = 0;
  double eps = 1e-5;
  bool rms = false;
};

// Batch normalisation with batch statistics (ops/batch_norm.hpp, what nn::BatchNorm1d/2d compute
// in training): x and y [n, c, s] contiguous (s = the product of the spatial dimensions; 1 for
// [N, C]); weight and bias [c] or null (no affine); mean, var (biased) and invstd = 1 / sqrt(var +
// eps) [c]; all of x's dtype. Forward writes y, mean, var and invstd; backward writes (overwrites)
// gx = d/dx, gw = sum(gy * xhat) and gb = sum(gy) per channel, each when non-null, with xhat
// recomputed from x, mean and invstd.
struct BatchNormArgs {
  DType dtype = DType::Float32;
  int64_t n = 0, c = 0, s = 0;
  double eps = 1e-5;
};

// Cross-entropy from logits (ops/loss.hpp): x [rows, classes] (class dimension last, contiguous),
// target int64 [rows], optional class weights w [classes] of x's dtype. Forward writes, per row,
// loss (x's dtype: -(1-eps) w[y] logp[y] - (eps/C) sum_c w[c] logp[c], 0 where y == ignore_index),
// the weight of the row's target wt (0 where ignored; for the mean's divisor) and the row's
// log-sum-exp lse (statistics type: double for float64, else float). No probabilities are stored;
// backward recomputes them from lse. Targets are already validated (in [0, classes) or ignored).
struct CrossEntropyArgs {
  DType dtype = DType::Float32;
  int64_t rows = 0, classes = 0;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

// One Adam / AdamW step over the n elements of one parameter (optim/adam.hpp): the parameter
// (param_dtype: float32, float64, float16 or bfloat16) and its gradient (grad_dtype, any floating
// type) are read as the state type S (float32; float64 for float64 parameters: state_dtype);
// exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq (else null) are S, updated in place; the
// parameter is rounded back once. Per element, in this order, each scalar rounded to S:
//   g = maximize ? -g : g
//   weight_decay != 0: decoupled ? p = p * (1 - lr * weight_decay) : g = g + p * weight_decay
//   exp_avg = lerp(exp_avg, g, 1 - beta1)   (|w| < 0.5: m + (g - m) * w, else g - (g - m) * (1 - w))
//   exp_avg_sq = exp_avg_sq * beta2 + (g * (1 - beta2)) * g
//   v = amsgrad ? (max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq)) : exp_avg_sq   (NaN wins)
//   p = p + (exp_avg * -step_size) / (sqrt(v) * (1 / bias_correction2_sqrt) + eps)
//
// All three steps take `grad_unscale`, the GradScaler's unscale fused in (amp/grad_scaler.hpp):
// when it is not 1, each gradient element is first multiplied by it in the gradient's own
// computation type and rounded to the gradient's type, exactly as UnaryOp::MulScalar would (the
// unscale_ pass it replaces), and that value is written back into grad and used by the step. So
// grad is read once and written once, and ends as unscale_ would leave it.
struct AdamStepArgs {
  DType param_dtype = DType::Float32, grad_dtype = DType::Float32, state_dtype = DType::Float32;
  int64_t n = 0;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = false, amsgrad = false, maximize = false;
  double step_size = 0.0;              // lr / (1 - beta1^step)
  double bias_correction2_sqrt = 1.0;  // sqrt(1 - beta2^step)
  double grad_unscale = 1.0;           // the GradScaler's 1 / scale, or 1 (see above)
};

// One SGD step (optim/sgd.hpp's update): momentum_buffer is null when momentum == 0, and on the
// first step with momentum (`first_step`) it is written with g rather than read.
struct SgdStepArgs {
  DType param_dtype = DType::Float32, grad_dtype = DType::Float32, state_dtype = DType::Float32;
  int64_t n = 0;
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false, maximize = false, first_step = false;
  double grad_unscale = 1.0;  // as AdamStepArgs::grad_unscale
};

// One RMSprop step (optim/rmsprop.hpp's update): grad_avg is null unless centered,
// momentum_buffer null unless momentum > 0.
struct RmspropStepArgs {
  DType param_dtype = DType::Float32, grad_dtype = DType::Float32, state_dtype = DType::Float32;
  int64_t n = 0;
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0.0, momentum = 0.0;
  bool centered = false, maximize = false;
  double grad_unscale = 1.0;  // as AdamStepArgs::grad_unscale
};

// Scaled dot-product attention (ops/attention.hpp) over bh independent heads (batch x heads), all
// contiguous: q [bh, L, D], k [bh, S, D], v [bh, S, Dv], out [bh, L, Dv]; float32 or float64.
//   scores[b, i, j] = scale * q[b, i] . k[b, j] + mask(b, i, j), -inf where causal and j > i
//   out[b, i] = sum_j softmax_j(scores[b, i]) v[b, j]
// The optional additive mask (q's dtype) has element (b, i, j) at
// mask[(b / mask_group) * mask_batch_stride + i * S + j] (mask_batch_stride 0: one [L, S] mask for
// every head; mask_group = heads: one mask per batch element shared by its heads). Forward writes
// out and lse [bh, L], each row's log-sum-exp of the scores in the statistics type (double for
// float64, else float); no [L, S] matrix is kept. A row with every score -inf gets NaN (as
// softmax). Backward recomputes the probabilities from lse and writes (overwrites) gq, gk, gv;
// delta [bh, L] (statistics type) is its workspace: delta[b, i] = gout[b, i] . out[b, i].
struct AttentionArgs {
  DType dtype = DType::Float32;
  int64_t bh = 0, L = 0, S = 0, D = 0, Dv = 0;
  double scale = 1.0;
  bool causal = false;
  int64_t mask_group = 1, mask_batch_stride = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // Memory. `allocate` throws OutOfMemory; `deallocate` gets back the size it was given.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual MemoryStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  virtual void set_memory_limit(int64_t bytes) = 0;  // -1 removes the limit
  // Freed memory the allocator keeps for reuse (the CPU's cache of large blocks, CUDA's memory
  // pool): empty_cache returns it to the system; set_cache_limit bounds it (0: keep none; on CUDA
  // the pool's release threshold, applied at synchronisations; -1: no bound on CUDA).
  virtual void empty_cache() {}
  virtual void set_cache_limit(int64_t bytes) { (void)bytes; }
  virtual void synchronize() = 0;

  // Copies within this device, and between this device and host memory.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  // rows x row_bytes blocks with pitches (concat / split / slicing copies).
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                       size_t rows) = 0;

  // Fills and conversions.
  virtual void fill(DType t, void* dst, int64_t n, double value) = 0;
  virtual void arange(DType t, void* dst, int64_t n, double start, double step) = 0;
  virtual void cast(DType src_t, const void* src, DType dst_t, void* dst, int64_t n) = 0;
  // Philox4x32-10 (see core/random.hpp): element i uses counter block (offset + i/4), lane i%4.
  virtual void random_uniform(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double lo,
                              double hi) = 0;
  virtual void random_normal(DType t, void* dst, int64_t n, uint64_t seed, uint64_t offset, double mean,
                             double stddev) = 0;

  // Elementwise. out may alias x.
  virtual void unary(UnaryOp op, DType t, const void* x, void* out, int64_t n, double a, double b) = 0;
  // gx = gy * d op(x)/dx, with y = op(x) available for ops whose derivative uses it.
  virtual void unary_backward(UnaryOp op, DType t, const void* x, const void* y, const void* gy, void* gx,
                              int64_t n, double a, double b) = 0;
  // out (contiguous, shape args.shape) = a op b, read through stride_a / stride_b.
  virtual void binary(BinaryOp op, DType t, const void* a, const void* b, void* out, const StridedArgs& args) = 0;
  virtual void compare(CompareOp op, DType t, const void* a, const void* b, uint8_t* out,
                       const StridedArgs& args) = 0;
  // out = cond ? a : b; cond read through stride_c.
  virtual void where(DType t, const uint8_t* cond, const void* a, const void* b, void* out,
                     const StridedArgs& args) = 0;
  // Strided gather into a contiguous buffer: out[i...] = src[sum(i_d * stride_a[d])].
  virtual void strided_copy(DType t, const void* src, void* out, const StridedArgs& args) = 0;

  // Reductions of a [outer, n, inner] view over the middle axis into [outer, inner].
  // Sum/Mean/Max/Min write dtype t; ArgMax/ArgMin write int64.
  virtual void reduce(ReduceOp op, DType t, const void* x, void* out, int64_t outer, int64_t n,
                      int64_t inner) = 0;
  // 1 when any element is inf or nan (written as uint8 to `flag`, which is not cleared first).
  virtual void nonfinite_check(DType t, const void* x, int64_t n, uint8_t* flag) = 0;

  virtual void gemm(const GemmArgs& g) = 0;

  // Linear with bias and activation (LinearActArgs). A backend without a fused kernel runs the
  // composite (backend/composite.hpp linear_act_composite: the order op::linear then the
  // activation take, so the CPU gives the composite's bits); the CUDA backend fuses bias and
  // activation into the GEMM's epilogue (cuBLASLt) where it can and falls back to the composite.
  virtual void linear_act_forward(const LinearActArgs& a, const void* x, const void* w, const void* b, void* z,
                                  void* y) = 0;

  // Softmax over the last axis of a [rows, cols] matrix (log_softmax when `log`).
  virtual void softmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log) = 0;
  virtual void softmax_backward(DType t, const void* y, const void* gy, void* gx, int64_t rows, int64_t cols,
                                bool log) = 0;

  // Fused layer norm / RMSNorm (NormArgs): one pass over x per direction. Backward: gx always;
  // gw = sum over rows of gy * xhat and gb = sum over rows of gy when non-null (overwritten),
  // xhat = (x - mean) * rstd recomputed from the saved statistics.
  virtual void norm_forward(const NormArgs& a, const void* x, const void* w, const void* b, void* y, void* mean,
                            void* rstd) = 0;
  virtual void norm_backward(const NormArgs& a, const void* x, const void* w, const void* mean, const void* rstd,
                             const void* gy, void* gx, void* gw, void* gb) = 0;

  // Fused batch normalisation with batch statistics (BatchNormArgs), an entry that a backend may
  // lack. The other fused entries are pure: each backend runs them, falling back inside itself to
  // a composite of its own primitives where it must (linear_act, backend/composite.hpp). Batch
  // norm's fallback is not a kernel but nn::BatchNorm's composition of differentiable ops (mean,
  // subtract, square, mean, rsqrt, multiply, add), each with its own kernel and autograd record,
  // so the choice is made above the table and the table has to answer a question first:
  // runs_batch_norm(a) says whether this backend runs problem `a` (its dtype and sizes). The
  // default says no, and the two kernels' defaults raise a DeviceError naming the op, the dtype
  // and the device, so a backend without the kernel (CUDA) needs no code for it, the op asks
  // before it calls (ops/batch_norm.hpp batch_norm_fused_applies) and nn::BatchNorm keeps the
  // composition where the answer is no. A backend that adds the kernel overrides all three.
  virtual bool runs_batch_norm(const BatchNormArgs& a) const {
    (void)a;
    return false;
  }
  virtual void batch_norm_forward(const BatchNormArgs& a, const void* x, const void* w, const void* b, void* y,
                                  void* mean, void* var, void* invstd) {
    (void)x, (void)w, (void)b, (void)y, (void)mean, (void)var, (void)invstd;
    no_batch_norm_kernel("batch_norm_forward", a);
  }
  virtual void batch_norm_backward(const BatchNormArgs& a, const void* x, const void* w, const void* mean,
                                   const void* invstd, const void* gy, void* gx, void* gw, void* gb) {
    (void)x, (void)w, (void)mean, (void)invstd, (void)gy, (void)gx, (void)gw, (void)gb;
    no_batch_norm_kernel("batch_norm_backward", a);
  }

  // Fused cross-entropy (CrossEntropyArgs). Backward: gx = gloss[i] * d loss_i / d x (overwrites).
  virtual void cross_entropy_forward(const CrossEntropyArgs& a, const void* x, const int64_t* target, const void* w,
                                     void* loss, void* lse, void* wt) = 0;
  virtual void cross_entropy_backward(const CrossEntropyArgs& a, const void* x, const int64_t* target,
                                      const void* w, const void* lse, const void* gloss, void* gx) = 0;

  // Fused scaled dot-product attention (AttentionArgs); mask may be null.
  virtual void attention_forward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                                 const void* mask, void* out, void* lse) = 0;
  virtual void attention_backward(const AttentionArgs& a, const void* q, const void* k, const void* v,
                                  const void* mask, const void* out, const void* lse, const void* gout, void* delta,
                                  void* gq, void* gk, void* gv) = 0;

  // Fused Adam / AdamW step (AdamStepArgs); max_exp_avg_sq is null without amsgrad.
  // grad is written only when a.grad_unscale != 1.
  virtual void adam_step(const AdamStepArgs& a, void* param, void* grad, void* exp_avg, void* exp_avg_sq,
                         void* max_exp_avg_sq) = 0;
  // Fused SGD step (SgdStepArgs) and RMSprop step (RmspropStepArgs): one pass over the parameter,
  // its gradient and the buffers, the composite's operations in its order.
  virtual void sgd_step(const SgdStepArgs& a, void* param, void* grad, void* momentum_buffer) = 0;
  virtual void rmsprop_step(const RmspropStepArgs& a, void* param, void* grad, void* square_avg,
                            void* grad_avg, void* momentum_buffer) = 0;

  // index_select on the middle axis of [outer, src_n, inner]: out[o, j, i] = x[o, idx[j], i].
  // Indices are int64 and already validated.
  virtual void index_select(DType t, const void* x, const int64_t* idx, void* out, int64_t outer,
                            int64_t src_n, int64_t idx_n, int64_t inner) = 0;
  // Backward of index_select: gx[o, idx[j], i] += gy[o, j, i] (gx already initialised).
  virtual void index_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer, int64_t src_n,
                         int64_t idx_n, int64_t inner) = 0;
  // torch.gather along the middle axis: out[o, j, i] = x[o, idx[o, j, i], i].
  virtual void gather(DType t, const void* x, const int64_t* idx, void* out, int64_t outer, int64_t src_n,
                      int64_t idx_n, int64_t inner) = 0;
  // Backward of gather: gx[o, idx[o, j, i], i] += gy[o, j, i].
  virtual void scatter_add(DType t, const void* gy, const int64_t* idx, void* gx, int64_t outer,
                           int64_t src_n, int64_t idx_n, int64_t inner) = 0;

  // Convolution (floating types; no bias: the op adds it). The backward passes overwrite.
  virtual void conv2d_forward(const Conv2dArgs& a, const void* x, const void* w, void* y) = 0;
  virtual void conv2d_backward_input(const Conv2dArgs& a, const void* gy, const void* w, void* gx) = 0;
  virtual void conv2d_backward_weight(const Conv2dArgs& a, const void* x, const void* gy, void* gw) = 0;
  // Pooling (floating types). Max pooling records the flat h*w index of each window's first
  // maximum (-1 for a window with no input element); the backward passes overwrite gx.
  virtual void max_pool2d_forward(const Pool2dArgs& p, const void* x, void* y, int64_t* indices) = 0;
  virtual void max_pool2d_backward(const Pool2dArgs& p, const void* gy, const int64_t* indices, void* gx) = 0;
  virtual void avg_pool2d_forward(const Pool2dArgs& p, const void* x, void* y) = 0;
  virtual void avg_pool2d_backward(const Pool2dArgs& p, const void* gy, void* gx) = 0;

  // Pinned (page-locked) host memory and asynchronous uploads, for the data loader's staging
  // ring (data/dataloader.hpp) and checkpoint staging. The CPU backend hands out ordinary aligned
  // host memory (not counted in memory_stats) and copies at once.
  virtual void* allocate_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p, size_t bytes) noexcept = 0;
  // Queues a copy of `bytes` from host memory (pinned, or the copy is not asynchronous) into
  // device memory on the device's copy stream, after the work already queued on the compute
  // stream (dst may be a fresh stream-ordered allocation), and makes every kernel queued later on
  // the compute stream wait for it (an event): no host synchronisation. Returns a ticket (> 0,
  // increasing); the host must not overwrite host_src before upload_finished(ticket).
  virtual uint64_t upload_async(void* dst, const void* host_src, size_t bytes) = 0;
  // Device memory for an upload's destination that upload_async_fresh may write without waiting
  // for the compute stream (the data loader's batches): on CUDA a stream-ordered allocation made
  // in the copy stream's order, whose reuse of memory freed on the compute stream the memory pool
  // orders itself; freed by deallocate like any other. Elsewhere it is allocate.
  virtual void* allocate_for_upload(size_t bytes) { return allocate(bytes); }
  // upload_async into memory from allocate_for_upload: the copy does not wait for the work queued
  // on the compute stream (the step in flight), so it overlaps it; the compute stream's later
  // kernels still wait for the copy. Same tickets as upload_async.
  virtual uint64_t upload_async_fresh(void* dst, const void* host_src, size_t bytes) {
    return upload_async(dst, host_src, bytes);
  }
  // True when that upload, and every earlier one, has finished reading its host buffer.
  virtual bool upload_finished(uint64_t ticket) = 0;
  virtual void wait_upload(uint64_t ticket) = 0;
  // Queues a copy of `bytes` of device memory into host memory (pinned, or the copy is not
  // asynchronous) on the compute stream, after the work queued so far, with no host
  // synchronisation: host_dst holds the bytes after the next synchronize(). Checkpoint staging
  // (train/checkpoint_manager.hpp) queues one per tensor, then synchronises once.
  virtual void download_async(void* host_dst, const void* src, size_t bytes) { copy_to_host(host_dst, src, bytes); }

  virtual void preprocess_images(const PreprocessArgs& a, const uint8_t* x, const int32_t* params, void* y) = 0;

  // Timing events, for the profiler's device time (profile/profiler.hpp): an event from a pool,
  // recorded on the compute stream after the work queued so far, with no synchronisation. The
  // profiler records one before and one after each op and reads them back at the end of a step.
  // Returns an id > 0, or 0 when the device has none (the CPU: its ops take the host's time).
  virtual uint64_t timing_event_record() { return 0; }
  // Milliseconds from event `start` to event `end`, waiting for `end` to complete; negative when
  // either is 0 or unknown.
  virtual double timing_event_elapsed_ms(uint64_t /*start*/, uint64_t /*end*/) { return -1.0; }
  // Returns every event recorded so far to the pool (their ids become invalid).
  virtual void timing_events_release() {}

 protected:
  // What an optional entry's default does when called anyway (its query said no).
  [[noreturn]] void no_batch_norm_kernel(const char* entry, const BatchNormArgs& a) const {
    throw DeviceError(detail::str_cat(entry, ": the ", device().str(), " backend has no fused batch norm kernel (",
                                      dtype_name(a.dtype), " input [", a.n, ", ", a.c, ", ", a.s,
                                      "]): runs_batch_norm() is false for it, and nn::BatchNorm uses the composition there"));
  }
};

}  // namespace ember
