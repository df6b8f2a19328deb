#pragma once
// Training-loop helpers: gradient accumulation.
#include "ember/train/accumulate.hpp"
