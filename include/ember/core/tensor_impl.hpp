#pragma once
// The untyped tensor body shared by AnyTensor and Tensor<T> handles.
#include <functional>
#include <memory>
#include <vector>

#include "ember/core/storage.hpp"

namespace ember {

class AnyTensor;
namespace autograd {
class Node;
}

struct TensorImpl {
  DType dtype = DType::Float32;
  Device device;
  Shape shape;
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements; views (reshape, leading-dimension slices) share storage

  // Autograd state. A leaf that requires grad accumulates into `grad`; a non-leaf has `grad_fn`.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  int output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;
  // Called on a leaf right after a backward pass has accumulated into its gradient.
  std::vector<std::function<void(const AnyTensor&)>> grad_ready_hooks;
  // Where a backward puts a leaf's gradient when the leaf has none yet: the tensor this returns
  // (same shape, dtype and device) receives a copy and becomes .grad. Unset, or returning an
  // undefined tensor: a fresh tensor. (DataParallel's gradient_as_bucket_view: views of buckets.)
  std::function<AnyTensor()> grad_destination;

  void* data() const {
    if (!storage) return nullptr;
    void* base = storage->data();
    if (base == nullptr) [[unlikely]] {
      if (storage->bytes() > 0) throw_released();
      return nullptr;
    }
    return static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype));
  }
  int64_t numel() const { return shape.numel(); }
  // Reading a tensor whose storage gave its memory back (Storage::release_memory) is an error, not
  // a read through a null pointer.
  [[noreturn]] static void throw_released() {
    throw ValueError(
        "a tensor's memory is released (Storage::release_memory): a parameter of a FullyShardedDataParallel unit "
        "used while its unit is not gathered; call the model as fsdp(x), (*model)(x) or model->forward_any(x) so "
        "its hooks gather it, or hold fsdp.gather_full_parameters()");
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

}  // namespace ember
