#pragma once
// Post-training quantization and quantization-aware training over a model's Linear and Conv2d
// layers (quant/modules.hpp has the scheme):
//
//   auto q = quant::prepare(*model, {.observer = {.kind = quant::ObserverKind::Percentile}});  // wraps the layers
//   quant::calibrate(*q, loader, [](const data::Batch& b) { return b.get<float>("image"); }, 32);
//   // q now computes as INT8 would (FakeQuant); train it further for QAT, or export it:
//   io::onnx::export_model(*q, {x}, "model_int8.onnx");                         // Q/DQ pairs
//
//   auto w8 = quant::weight_only_int8(*model);   // Linear -> Int8Linear (a quarter of the weights' memory)
//
// prepare() and weight_only_int8() walk nn::Sequential trees (nested ones too) and share the
// layers' parameters with the original model; other containers wrap their layers by hand.
#include <functional>
#include <memory>

#include "ember/nn/sequential.hpp"
#include "ember/quant/modules.hpp"

namespace ember::quant {

inline std::shared_ptr<nn::Sequential> prepare(const nn::Sequential& model, QuantOptions o = {}) {
  auto out = std::make_shared<nn::Sequential>();
  for (const auto& layer : model.layers()) {
    if (auto l = std::dynamic_pointer_cast<nn::Linear>(layer)) out->push_back(std::make_shared<QuantLinear>(l, o));
    else if (auto c = std::dynamic_pointer_cast<nn::Conv2d>(layer)) out->push_back(std::make_shared<QuantConv2d>(c, o));
    else if (auto s = std::dynamic_pointer_cast<nn::Sequential>(layer)) out->push_back(prepare(*s, o));
    else out->push_back(layer);
  }
  out->train(model.is_training());
  return out;
}

// Calls f on every quantized layer of the tree.
inline void for_each_quant_layer(nn::Module& model, const std::function<void(nn::Module&)>& f) {
  for (auto& [name, m] : model.named_modules())
    if (dynamic_cast<QuantLinear*>(m) || dynamic_cast<QuantConv2d*>(m)) f(*m);
}

inline void set_mode(nn::Module& model, QuantMode mode) {
  int n = 0;
  for_each_quant_layer(model, [&](nn::Module& m) {
    if (auto* l = dynamic_cast<QuantLinear*>(&m)) l->set_mode(mode);
    if (auto* c = dynamic_cast<QuantConv2d*>(&m)) c->set_mode(mode);
    ++n;
  });
  EMBER_CHECK(n > 0, ValueError, "quant::set_mode: ", model.type_name(),
              " has no QuantLinear or QuantConv2d layer (wrap it with quant::prepare first)");
}

inline void finish_calibration(nn::Module& model) {
  for_each_quant_layer(model, [](nn::Module& m) {
    if (auto* l = dynamic_cast<QuantLinear*>(&m)) l->finish_calibration();
    if (auto* c = dynamic_cast<QuantConv2d*>(&m)) c->finish_calibration();
  });
}

// Post-training calibration: up to max_batches batches of `batches` (a DataLoader or any range of
// batches) through the model in eval mode without gradients, every quantized layer's input
// observed; then the ranges are fixed and the model left in FakeQuant mode (and its training flag
// as it was). input_of(batch) gives the model's input.
template <class Batches, class InputOf>
int64_t calibrate(nn::Module& model, Batches& batches, InputOf&& input_of, int64_t max_batches = -1) {
  const bool was_training = model.is_training();
  set_mode(model, QuantMode::Calibrate);
  model.eval();
  int64_t n = 0;
  {
    NoGradGuard no_grad;
    for (auto& batch : batches) {
      if (max_batches >= 0 && n >= max_batches) break;
      model.forward_any(input_of(batch));
      ++n;
    }
  }
  EMBER_CHECK(n > 0, ValueError, "quant::calibrate: no batch came from the loader");
  finish_calibration(model);
  set_mode(model, QuantMode::FakeQuant);
  model.train(was_training);
  return n;
}

// Every Linear of a Sequential tree as a weight-only Int8Linear (a new model; the rest shared).
inline std::shared_ptr<nn::Sequential> weight_only_int8(const nn::Sequential& model) {
  auto out = std::make_shared<nn::Sequential>();
  for (const auto& layer : model.layers()) {
    if (auto l = std::dynamic_pointer_cast<nn::Linear>(layer)) out->push_back(std::make_shared<Int8Linear>(*l));
    else if (auto s = std::dynamic_pointer_cast<nn::Sequential>(layer)) out->push_back(weight_only_int8(*s));
    else out->push_back(layer);
  }
  out->train(model.is_training());
  return out;
}

}  // namespace ember::quant
