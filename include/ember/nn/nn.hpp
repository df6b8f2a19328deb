#pragma once
// All of ember::nn but the GPT model and its sampler (<ember/nn/gpt.hpp>, <ember/nn/sampling.hpp>):
// a program that uses them includes them, and the others do not compile them.
#include "ember/nn/activation.hpp"
#include "ember/nn/attention.hpp"
#include "ember/nn/conv.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/loss.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/norm.hpp"
#include "ember/nn/pool.hpp"
#include "ember/nn/recompute.hpp"
#include "ember/nn/sequential.hpp"
#include "ember/nn/transformer.hpp"
