#pragma once
// The registry of op cases: every op declared once (tests/op_case.hpp says what a declaration
// holds), in one header per family. Four harnesses read it, each registering one Catch2 test per
// op (and dtype) that has something for it:
//   tests/test_gradcheck.cpp     "gradcheck float64: <op>"          finite differences, every seed
//   tests/test_op_parity.cpp     "parity CPU vs CUDA <dtype>: <op>" forward and backward on a GPU;
//                                "parity harness, pretend device, <dtypes>: <op>" the harness in CI
//   tests/test_bad_input.cpp     "bad input: <op>"                  the declared type and fragments
//   tests/test_nan_semantics.cpp "nan <dtypes>: <op>"               NaN and infinities as PyTorch
// Tests of one op's particular semantics (values against a reference, ties, edge cases, thread
// counts, a fused kernel's own parity) stay in its family's file, tests/test_<family>.cpp.
// `ctest -R ': <op>$'` runs one op's four.
//
// A new op gets all four by one entry in its family's header, for example (for an op hardtanh):
//
//   ops.push_back(
//       {.name = "hardtanh",  // as its error messages name it
//        .family = "elementwise",
//        .cases = {{.variant = "[7, 9]", .inputs = {{{7, 9}, -2, 2}},
//                   .fn = [](V x) { return op::hardtanh(x[0]); },
//                   .prepare = away_from({-1.0, 1.0})}},  // off the kinks for finite differences
//        .bad = {bad<DTypeError>("hardtanh of int64", [] { op::hardtanh(Tensor<int64_t>::ones({2})); },
//                                {"hardtanh", "int64"})},
//        .nan = {{.what = "hardtanh of NaN, +inf, -inf", .values = {{kNan, kInf, -kInf}}, .shapes = {Shape{3}},
//                 .fn = [](V x) { return op::hardtanh(x[0]); }, .want = {kNan, 1.0, -1.0},
//                 .dtypes = {DType::Float32, DType::Float64}}}});
//
// Defaults: differentiable, in the gradient check (seeds 1, 2, 3) and the parity check (float32,
// float16, bfloat16, the elementwise tolerance); `.differentiable = false`, `.gradcheck = false`,
// `.parity = false`, `.tolerance = Tolerance::Gemm`, `.dtypes` and `.seeds` change that.
#include <vector>

#include "op_case.hpp"
#include "op_cases_attention.hpp"
#include "op_cases_conv_pool.hpp"
#include "op_cases_elementwise.hpp"
#include "op_cases_index.hpp"
#include "op_cases_linalg.hpp"
#include "op_cases_loss.hpp"
#include "op_cases_norm.hpp"
#include "op_cases_reduce.hpp"
#include "op_cases_shape.hpp"

namespace ember::testing {

// Every op of every family, in a fixed order (each op's name once).
inline const std::vector<OpSpec>& op_registry() {
  static const std::vector<OpSpec> all = [] {
    std::vector<OpSpec> v;
    for (auto family : {elementwise_ops, reduce_ops, linalg_ops, index_ops, shape_ops, conv_pool_ops, norm_ops,
                        loss_ops, attention_ops})
      for (OpSpec& s : family()) v.push_back(std::move(s));
    return v;
  }();
  return all;
}

}  // namespace ember::testing
