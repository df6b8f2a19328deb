#pragma once
// All of ember::nn.
#include "ember/nn/activation.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/sequential.hpp"
