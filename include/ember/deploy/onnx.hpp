#pragma once
// ONNX export (not in the umbrella ember.hpp: include this where a program exports):
//   io::onnx::export_model(module, {example}, "model.onnx", options)   deploy/onnx_export.hpp
//   io::onnx::Exporter, GraphBuilder: the ONNX forms of nn's layers and the builder for custom
//   modules' hooks (ExportOptions::exporters)                          deploy/onnx_layers.hpp
//   the file format itself, written without protobuf                   io/onnx_proto.hpp
#include "ember/deploy/onnx_export.hpp"
