#pragma once
// The checks of anomaly detection (autograd/anomaly.hpp), run by record() in forward and by the
// engine after each node in backward. Included by autograd/node.hpp once the tensor handles and
// Node are complete; include <ember/autograd/anomaly.hpp> rather than this file.
#include <string>
#include <vector>

#include "ember/autograd/anomaly.hpp"

namespace ember::autograd::detail {

// 0 when every element is finite, else 1 for a NaN somewhere, 2 for infinities only. Reads two
// flags back from the device.
inline int nonfinite_kind(const AnyTensor& t) {
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype())) return 0;
  Backend& be = t.backend();
  AnyTensor flags = AnyTensor::zeros(Shape{2}, DType::UInt8, t.device());
  uint8_t* f = static_cast<uint8_t*>(flags.data_ptr());
  be.nonfinite_check(t.dtype(), t.data_ptr(), t.numel(), f);
  uint8_t host[2] = {0, 0};
  be.copy_to_host(host, f, 1);
  if (!host[0]) return 0;
  // Which kind: NaN is the only value unequal to itself. Reduce x != x to its maximum.
  AnyTensor ne = AnyTensor::empty(Shape{t.numel()}, DType::UInt8, t.device());
  Shape s{t.numel()};
  StridedArgs args;
  args.ndim = 1;
  args.shape[0] = t.numel();
  args.stride_a[0] = args.stride_b[0] = args.stride_c[0] = 1;
  be.compare(CompareOp::Ne, t.dtype(), t.data_ptr(), t.data_ptr(), static_cast<uint8_t*>(ne.data_ptr()), args);
  be.reduce(ReduceOp::Max, DType::UInt8, ne.data_ptr(), f + 1, 1, t.numel(), 1);
  be.copy_to_host(host, f, 2);
  return host[1] ? 1 : 2;
}

inline const char* ordinal_suffix(size_t i) {
  const size_t m100 = i % 100, m10 = i % 10;
  if (m100 >= 11 && m100 <= 13) return "th";
  return m10 == 1 ? "st" : m10 == 2 ? "nd" : m10 == 3 ? "rd" : "th";
}

// Forward: called by record() for an op's outputs. Returns where the node was made, which the
// node keeps for the backward message.
inline std::string check_forward_anomaly(const char* op, const std::vector<AnyTensor>& outputs) {
  const std::string where = current_module_where();
  const bool reject_inf = anomaly_state().forward_inf;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int kind = nonfinite_kind(outputs[i]);
    if (kind == 1 || (kind == 2 && reject_inf))
      throw AutogradError(::ember::detail::str_cat(
          "detect_anomaly: op '", op, "' returned ", kind == 1 ? "nan" : "inf", " values in its ", i,
          ordinal_suffix(i), " output (", outputs[i].desc(), ") in forward", where));
  }
  return ::ember::detail::str_cat("by op '", op, "'", where);
}

// Backward: called by the engine for the gradients a node returned (one per input).
inline void check_backward_anomaly(const Node& node, const std::vector<AnyTensor>& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const int kind = nonfinite_kind(grads[i]);
    if (kind == 0) continue;
    throw AutogradError(::ember::detail::str_cat(
        "detect_anomaly: the backward of '", node.name(), "' returned ", kind == 1 ? "nan" : "inf", " values in its ",
        i, ordinal_suffix(i), " output (the gradient of input ", i, ", ", grads[i].desc(), "); the node was created ",
        node.anomaly_context.empty() ? std::string("before anomaly detection was enabled")
                                     : "in forward " + node.anomaly_context));
  }
}

}  // namespace ember::autograd::detail
