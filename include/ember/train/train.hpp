#pragma once
// Training-loop helpers: gradient accumulation, the batch-size finder, checkpoints, the Trainer.
#include "ember/train/accumulate.hpp"
#include "ember/train/batch_size_finder.hpp"
#include "ember/train/checkpoint_manager.hpp"
#include "ember/train/trainer.hpp"
