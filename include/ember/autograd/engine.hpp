#pragma once
// Public entry to the backward engine: ember::autograd::backward(roots, grads, retain_graph)
// and AnyTensor::backward. The definitions live with the tensor handles (core/tensor.hpp).
#include "ember/core/tensor.hpp"
