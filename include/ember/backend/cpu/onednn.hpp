#pragma once
// fp32 convolution through oneDNN (Debian's libdnnl-dev, the library PyTorch's CPU convolutions
// use), when the build found it (EMBER_HAVE_ONEDNN, set for every consumer of ember::ember alike,
// like EMBER_HAVE_CBLAS, so no translation unit sees a different definition). Without it this
// header declares onednn::available() == false and the CPU backend keeps im2col + GEMM.
//
// Layouts: the caller's tensors are in ember's plain layouts (src/dst nchw, weights oihw or
// goihw); oneDNN computes either on them directly or in the blocked layouts it prefers, reordered
// in and out around each call (see Layouts; docs/performance-conv.md has the measured choice).
// oneDNN's CPU runtime is OpenMP, so it uses the thread count ember::set_num_threads gives OpenMP.
//
// Primitives are cached per thread (a primitive must not run concurrently on two threads with the
// same scratchpad), keyed by the problem; oneDNN's own primitive cache also keeps the JIT code.
// Threads prepare their problems one at a time (see prepare_lock): oneDNN's process-wide cache
// hands a primitive made on one thread to the others.
#include <cstdint>

#include "ember/backend/cpu/parallel.hpp"
#include "ember/core/backend.hpp"

#if defined(EMBER_HAVE_ONEDNN)
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

// oneDNN's C API: its C++ header (dnnl.hpp) crashes nvcc 13's front end, and the CUDA backend's
// translation unit must see the same CPU kernels as every g++ one (one definition of each).
#include <dnnl.h>

#include "ember/core/error.hpp"
#endif

namespace ember::cpu::onednn {

enum class ConvDirection { Forward = 0, BackwardInput = 1, BackwardWeight = 2 };

// Blocked: oneDNN chooses the layouts it computes in (nChw16c and blocked weights on AVX-512, its
// JIT kernels), with reorders from and to ember's plain layouts around the primitive. Plain: the
// primitive works on ember's layouts directly (oneDNN then falls back to its own im2col + GEMM).
// Both are measured in benchmarks/bench_conv_cpu.cpp; the backend uses Plain (conv.hpp says when).
enum class Layouts { Blocked = 0, Plain = 1 };

#if defined(EMBER_HAVE_ONEDNN)

inline constexpr bool available() { return true; }

namespace detail {

// Each call of the C API returns a status; any failure while preparing a problem makes it "not
// taken" (the backend then uses im2col + GEMM), a failure while running one is an Error.
struct Failed {};
inline void ok_or_fail(dnnl_status_t s) {
  if (s != dnnl_success) throw Failed{};
}

// Runs one primitive (a reorder of one float) on `e`. libdnnl 2.6 reads a setting on the first
// execution of any primitive in the process (its ITT task level, from the environment) into a
// global without synchronisation; two threads' first convolutions wrote it at once (the same
// value: harmless on x86, but a data race that ThreadSanitizer reports against a libdnnl built
// with it). Done once here, inside the engine's initialisation, every later thread is ordered
// after it. Failure only means that the warm-up did not run.
inline void execute_once(dnnl_engine_t e) {
  const dnnl_dims_t one{1};
  dnnl_memory_desc_t md;
  if (dnnl_memory_desc_init_by_tag(&md, 1, one, dnnl_f32, dnnl_a) != dnnl_success) return;
  dnnl_primitive_desc_t pd = nullptr;
  if (dnnl_reorder_primitive_desc_create(&pd, &md, e, &md, e, nullptr) != dnnl_success) return;
  dnnl_primitive_t reorder = nullptr;
  const bool made = dnnl_primitive_create(&reorder, pd) == dnnl_success;
  dnnl_primitive_desc_destroy(pd);
  if (!made) return;
  float from = 0.0f, to = 0.0f;
  dnnl_memory_t src = nullptr, dst = nullptr;
  dnnl_stream_t stream = nullptr;
  if (dnnl_memory_create(&src, &md, e, &from) == dnnl_success && dnnl_memory_create(&dst, &md, e, &to) == dnnl_success &&
      dnnl_stream_create(&stream, e, dnnl_stream_default_flags) == dnnl_success) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    if (dnnl_primitive_execute(reorder, stream, 2, args) == dnnl_success) dnnl_stream_wait(stream);
  }
  if (stream) dnnl_stream_destroy(stream);
  if (dst) dnnl_memory_destroy(dst);
  if (src) dnnl_memory_destroy(src);
  dnnl_primitive_destroy(reorder);
}

inline dnnl_engine_t engine() {
  static dnnl_engine_t e = [] {
    dnnl_engine_t h = nullptr;
    if (dnnl_engine_create(&h, dnnl_cpu, 0) != dnnl_success) return static_cast<dnnl_engine_t>(nullptr);
    execute_once(h);
    return h;
  }();
  return e;
}

using Key = std::array<int64_t, 19>;

inline Key key_of(const Conv2dArgs& a, ConvDirection d, Layouts l) {
  return {static_cast<int64_t>(a.dtype), static_cast<int64_t>(l), static_cast<int64_t>(d), a.n, a.c_in, a.h, a.w,
          a.c_out, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, a.out_h, a.out_w};
}

// One tensor of a problem: ember's plain layout over the caller's buffer (`user`, its handle set
// per call) and, where the primitive computes in another layout, a buffer in that layout and the
// reorder between the two.
struct Operand {
  dnnl_memory_desc_t plain{}, used{};
  dnnl_memory_t user = nullptr, buffer = nullptr;
  dnnl_primitive_t reorder = nullptr;
  bool reordered = false;

  Operand() = default;
  Operand(const Operand&) = delete;
  Operand& operator=(const Operand&) = delete;
  void init(const dnnl_memory_desc_t& p, const dnnl_memory_desc_t* u, bool input) {
    if (!u) throw Failed{};
    plain = p;
    used = *u;
    ok_or_fail(dnnl_memory_create(&user, &plain, engine(), DNNL_MEMORY_NONE));
    reordered = dnnl_memory_desc_equal(&plain, &used) == 0;
    if (!reordered) return;
    ok_or_fail(dnnl_memory_create(&buffer, &used, engine(), DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd = nullptr;
    const dnnl_memory_desc_t& from = input ? plain : used;
    const dnnl_memory_desc_t& to = input ? used : plain;
    ok_or_fail(dnnl_reorder_primitive_desc_create(&rpd, &from, engine(), &to, engine(), nullptr));
    const dnnl_status_t st = dnnl_primitive_create(&reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    ok_or_fail(st);
  }
  ~Operand() {
    if (reorder) dnnl_primitive_destroy(reorder);
    if (buffer) dnnl_memory_destroy(buffer);
    if (user) dnnl_memory_destroy(user);
  }
};

// A problem ready to run (or refused: ok false).
struct Prepared {
  Operand src, weights, dst;
  dnnl_primitive_t prim = nullptr;
  bool ok = false;
  Prepared() = default;
  Prepared(const Prepared&) = delete;
  Prepared& operator=(const Prepared&) = delete;
  ~Prepared() {
    if (prim) dnnl_primitive_destroy(prim);
  }
};

// Descriptors of the problem. oneDNN's dilation counts the gaps (0 = none); its right padding is
// what makes the output size exact, at least 0 (PyTorch's output size floors, so a right padding
// of up to stride - 1 more gives the same size and reads no extra input).
struct Geometry {
  dnnl_memory_desc_t src{}, weights{}, dst{};              // ember's plain layouts
  dnnl_memory_desc_t src_any{}, weights_any{}, dst_any{};  // the primitive's choice (Blocked)
  dnnl_dims_t strides{}, dilates{}, pad_l{}, pad_r{};
  Geometry(const Conv2dArgs& a, Layouts l) {
    const dnnl_dims_t sd{a.n, a.c_in, a.h, a.w}, dd{a.n, a.c_out, a.out_h, a.out_w};
    const dnnl_dims_t wd1{a.c_out, a.c_in, a.kh, a.kw};
    const dnnl_dims_t wdg{a.groups, a.c_out / a.groups, a.c_in / a.groups, a.kh, a.kw};
    const bool grouped = a.groups > 1;
    ok_or_fail(dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, dnnl_nchw));
    ok_or_fail(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, dnnl_nchw));
    ok_or_fail(dnnl_memory_desc_init_by_tag(&weights, grouped ? 5 : 4, grouped ? wdg : wd1, dnnl_f32,
                                            grouped ? dnnl_goihw : dnnl_oihw));
    const bool any = l == Layouts::Blocked;
    ok_or_fail(dnnl_memory_desc_init_by_tag(&src_any, 4, sd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
    ok_or_fail(dnnl_memory_desc_init_by_tag(&dst_any, 4, dd, dnnl_f32, any ? dnnl_format_tag_any : dnnl_nchw));
    ok_or_fail(dnnl_memory_desc_init_by_tag(&weights_any, grouped ? 5 : 4, grouped ? wdg : wd1, dnnl_f32,
                                            any ? dnnl_format_tag_any : (grouped ? dnnl_goihw : dnnl_oihw)));
    strides[0] = a.stride_h;
    strides[1] = a.stride_w;
    dilates[0] = a.dil_h - 1;
    dilates[1] = a.dil_w - 1;
    pad_l[0] = a.pad_h;
    pad_l[1] = a.pad_w;
    const int64_t rh = (a.out_h - 1) * a.stride_h + (a.kh - 1) * a.dil_h + 1 - a.h - a.pad_h;
    const int64_t rw = (a.out_w - 1) * a.stride_w + (a.kw - 1) * a.dil_w + 1 - a.w - a.pad_w;
    pad_r[0] = rh > 0 ? rh : 0;
    pad_r[1] = rw > 0 ? rw : 0;
  }
};

// Owns a primitive descriptor for the scope of prepare().
struct PdHolder {
  dnnl_primitive_desc_t pd = nullptr;
  ~PdHolder() {
    if (pd) dnnl_primitive_desc_destroy(pd);
  }
};

inline void prepare_or_fail(Prepared& p, const Conv2dArgs& a, ConvDirection dir, Layouts l) {
  if (!engine()) throw Failed{};
  Geometry g(a, l);
  dnnl_convolution_desc_t fd;
  ok_or_fail(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &g.src_any,
                                                &g.weights_any, nullptr, &g.dst_any, g.strides, g.dilates, g.pad_l,
                                                g.pad_r));
  PdHolder fwd;
  ok_or_fail(dnnl_primitive_desc_create(&fwd.pd, &fd, nullptr, engine(), nullptr));
  PdHolder bwd;
  const_dnnl_primitive_desc_t pd = fwd.pd;
  if (dir == ConvDirection::BackwardInput) {
    dnnl_convolution_desc_t bd;
    ok_or_fail(dnnl_dilated_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, &g.src_any, &g.weights_any,
                                                        &g.dst_any, g.strides, g.dilates, g.pad_l, g.pad_r));
    ok_or_fail(dnnl_primitive_desc_create(&bwd.pd, &bd, nullptr, engine(), fwd.pd));
    pd = bwd.pd;
  } else if (dir == ConvDirection::BackwardWeight) {
    dnnl_convolution_desc_t bd;
    ok_or_fail(dnnl_dilated_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct, &g.src_any,
                                                           &g.weights_any, nullptr, &g.dst_any, g.strides,
                                                           g.dilates, g.pad_l, g.pad_r));
    ok_or_fail(dnnl_primitive_desc_create(&bwd.pd, &bd, nullptr, engine(), fwd.pd));
    pd = bwd.pd;
  }
  auto md = [&](dnnl_query_t q) { return dnnl_primitive_desc_query_md(pd, q, 0); };
  switch (dir) {
    case ConvDirection::Forward:
      p.src.init(g.src, md(dnnl_query_src_md), true);
      p.weights.init(g.weights, md(dnnl_query_weights_md), true);
      p.dst.init(g.dst, md(dnnl_query_dst_md), false);
      break;
    case ConvDirection::BackwardInput:
      p.dst.init(g.dst, md(dnnl_query_diff_dst_md), true);
      p.weights.init(g.weights, md(dnnl_query_weights_md), true);
      p.src.init(g.src, md(dnnl_query_diff_src_md), false);
      break;
    case ConvDirection::BackwardWeight:
      p.src.init(g.src, md(dnnl_query_src_md), true);
      p.dst.init(g.dst, md(dnnl_query_diff_dst_md), true);
      p.weights.init(g.weights, md(dnnl_query_diff_weights_md), false);
      break;
  }
  ok_or_fail(dnnl_primitive_create(&p.prim, pd));
  p.ok = true;
}

// An empty problem, a type other than fp32 or one oneDNN has no implementation for is marked
// not ok, once; the backend then computes it with im2col + GEMM.
inline std::unique_ptr<Prepared> prepare(const Conv2dArgs& a, ConvDirection dir, Layouts l) {
  auto p = std::make_unique<Prepared>();
  if (a.dtype != DType::Float32 || a.n <= 0 || a.c_in <= 0 || a.c_out <= 0 || a.out_h <= 0 || a.out_w <= 0 ||
      a.groups <= 0)
    return p;
  try {
    prepare_or_fail(*p, a, dir, l);
  } catch (const Failed&) {
    p = std::make_unique<Prepared>();
  }
  return p;
}

// A bounded per-thread cache (a primitive must not run on two threads at once with one
// scratchpad): a training loop sees a handful of shapes; a program that sweeps shapes starts over
// every kMaxCached entries instead of growing without end.
inline constexpr size_t kMaxCached = 64;

// Held while a thread prepares a problem. oneDNN's primitive cache (one for the process) gives a
// thread that asks for a problem another thread already made that thread's primitive and
// primitive descriptor, ordered by a std::shared_future inside libdnnl; it also makes its own
// reader-writer lock on first use inside a function-local static. Both orders are real, but they
// live in libdnnl's uninstrumented code, so ThreadSanitizer saw neither: with two thread ranks it
// reported this thread's first read of a descriptor another rank had made (in Operand::init) and
// its first use of the cache's lock as races (docs/architecture.md, "Threads and oneDNN"). Under
// one lock of ember's, the thread that made a primitive is ordered, visibly, before every later
// thread that asks for it; the lock also keeps two threads from writing oneDNN's own lazily set
// globals of primitive creation at once (its fp32-math mode, brgemm's cache sizes: the same
// values, but unsynchronised writes). It costs nothing in a training loop: each thread prepares a
// shape once, every later call is answered by its own cache without the lock, and a thread asking
// for a shape that another is making would wait for oneDNN's future anyway.
inline std::mutex& prepare_lock() {
  static std::mutex m;
  return m;
}

// Releasing a problem drops this thread's references to primitives other threads may share: under
// the same lock, so that the thread that frees one last is ordered after the one that made it.
struct ReleaseUnderLock {
  void operator()(Prepared* p) const {
    std::lock_guard<std::mutex> lock(prepare_lock());
    delete p;
  }
};
using PreparedPtr = std::unique_ptr<Prepared, ReleaseUnderLock>;

inline Prepared& cached(const Conv2dArgs& a, ConvDirection dir, Layouts l) {
  thread_local std::map<Key, PreparedPtr> cache;
  const Key k = key_of(a, dir, l);
  auto it = cache.find(k);
  if (it != cache.end()) return *it->second;
  if (cache.size() >= kMaxCached) cache.clear();
  PreparedPtr made;
  {
    std::lock_guard<std::mutex> lock(prepare_lock());
    made.reset(prepare(a, dir, l).release());
  }
  return *cache.emplace(k, std::move(made)).first->second;
}

inline void run_or_throw(dnnl_status_t s, const char* what) {
  EMBER_CHECK(s == dnnl_success, Error, "conv2d (oneDNN): ", what, " failed with status ", static_cast<int>(s));
}

// Runs one problem: inputs reordered into the primitive's layouts where they differ, the
// primitive, the output reordered back into the caller's buffer.
inline void run(Prepared& p, int arg0, Operand& in0, const void* ptr0, int arg1, Operand& in1, const void* ptr1,
                int out_arg, Operand& out, void* out_ptr) {
#if defined(_OPENMP)
  // oneDNN sizes its OpenMP team by this thread's nthreads setting, which omp_set_num_threads in
  // ember::set_num_threads changed only on the thread that called it. Set for the call only and
  // put back (also when a step throws), as the fp32 GEMM does: a program's own OpenMP setting on
  // this thread is left as it was.
  const ::ember::detail::OmpThreadsForCall omp_threads(get_num_threads());
#endif
  thread_local struct Stream {
    dnnl_stream_t s = nullptr;
    ~Stream() {
      if (s) dnnl_stream_destroy(s);
    }
  } stream;
  if (!stream.s) run_or_throw(dnnl_stream_create(&stream.s, engine(), dnnl_stream_default_flags), "stream creation");
  auto reorder = [&](dnnl_primitive_t r, dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    run_or_throw(dnnl_primitive_execute(r, stream.s, 2, args), "reorder");
  };
  dnnl_exec_arg_t args[3];
  int k = 0;
  for (auto [arg, o, ptr] : {std::tuple<int, Operand*, const void*>{arg0, &in0, ptr0}, {arg1, &in1, ptr1}}) {
    run_or_throw(dnnl_memory_set_data_handle(o->user, const_cast<void*>(ptr)), "set_data_handle");
    if (o->reordered) reorder(o->reorder, o->user, o->buffer);
    args[k++] = {arg, o->reordered ? o->buffer : o->user};
  }
  run_or_throw(dnnl_memory_set_data_handle(out.user, out_ptr), "set_data_handle");
  args[k++] = {out_arg, out.reordered ? out.buffer : out.user};
  run_or_throw(dnnl_primitive_execute(p.prim, stream.s, k, args), "convolution");
  if (out.reordered) reorder(out.reorder, out.buffer, out.user);
  run_or_throw(dnnl_stream_wait(stream.s), "stream wait");
}

// Runs problem `a` in direction `dir` on the operands in the order the public functions take
// them; false, computing nothing, when oneDNN does not take the problem.
inline bool run_if_taken(const Conv2dArgs& a, ConvDirection dir, Layouts l, const float* in0, const float* in1,
                         float* out) {
  Prepared& p = cached(a, dir, l);
  if (!p.ok) return false;
  switch (dir) {
    case ConvDirection::Forward:  // x, w -> y
      run(p, DNNL_ARG_SRC, p.src, in0, DNNL_ARG_WEIGHTS, p.weights, in1, DNNL_ARG_DST, p.dst, out);
      break;
    case ConvDirection::BackwardInput:  // gy, w -> gx
      run(p, DNNL_ARG_DIFF_DST, p.dst, in0, DNNL_ARG_WEIGHTS, p.weights, in1, DNNL_ARG_DIFF_SRC, p.src, out);
      break;
    case ConvDirection::BackwardWeight:  // x, gy -> gw
      run(p, DNNL_ARG_SRC, p.src, in0, DNNL_ARG_DIFF_DST, p.dst, in1, DNNL_ARG_DIFF_WEIGHTS, p.weights, out);
      break;
  }
  return true;
}

}  // namespace detail

// The name of the implementation oneDNN picked for a problem ("jit:avx512_core", "gemm:jit", ...),
// for benchmarks and the documentation of the choice.
inline std::string implementation(const Conv2dArgs& a, ConvDirection dir, Layouts l = Layouts::Blocked) {
  detail::Prepared& p = detail::cached(a, dir, l);
  if (!p.ok) return "none (im2col + GEMM)";
  const_dnnl_primitive_desc_t pd = nullptr;
  const char* s = nullptr;
  if (dnnl_primitive_get_primitive_desc(p.prim, &pd) != dnnl_success ||
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &s) != dnnl_success || !s)
    return "?";
  return s;
}

#else

inline constexpr bool available() { return false; }

namespace detail {
inline bool run_if_taken(const Conv2dArgs&, ConvDirection, Layouts, const float*, const float*, float*) {
  return false;
}
}  // namespace detail

#endif

// y = conv(x, w) (no bias), dx = conv^T(dy, w), dw = sum over the batch (all three overwrite).
// Each returns false, computing nothing, when oneDNN does not take the problem (or the build has
// no oneDNN).
inline bool conv2d_forward(const Conv2dArgs& a, const float* x, const float* w, float* y,
                           Layouts l = Layouts::Blocked) {
  return detail::run_if_taken(a, ConvDirection::Forward, l, x, w, y);
}
inline bool conv2d_backward_input(const Conv2dArgs& a, const float* gy, const float* w, float* gx,
                                  Layouts l = Layouts::Blocked) {
  return detail::run_if_taken(a, ConvDirection::BackwardInput, l, gy, w, gx);
}
inline bool conv2d_backward_weight(const Conv2dArgs& a, const float* x, const float* gy, float* gw,
                                   Layouts l = Layouts::Blocked) {
  return detail::run_if_taken(a, ConvDirection::BackwardWeight, l, x, gy, gw);
}

}  // namespace ember::cpu::onednn
