#pragma once
// Public entry to the autograd tape: ember::autograd::Node, FunctionNode, record(), Edge.
// The definitions live with the tensor handles they need (core/tensor.hpp includes them).
#include "ember/core/tensor.hpp"
