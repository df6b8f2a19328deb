#pragma once
// All op families.
#include "ember/ops/attention.hpp"
#include "ember/ops/compare.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/index.hpp"
#include "ember/ops/linalg.hpp"
#include "ember/ops/norm.hpp"
#include "ember/ops/pool.hpp"
#include "ember/ops/reduce.hpp"
#include "ember/ops/shape.hpp"
#include "ember/ops/softmax.hpp"
