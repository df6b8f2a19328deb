#pragma once
// Training-loop helpers: gradient accumulation.
#include "ember/train/accumulate.hpp"
#include "ember/train/batch_size_finder.hpp"
#include "ember/train/checkpoint_manager.hpp"
