#pragma once
// Optimizers (SGD, Adam, AdamW, RMSprop), gradient clipping and learning-rate schedulers, with
// torch.optim's semantics and defaults. See docs/api.md "Optimizers and schedulers".
#include "ember/optim/optimizer.hpp"
#include "ember/optim/optimizer_base.hpp"
#include "ember/optim/sgd.hpp"
#include "ember/optim/adam.hpp"
#include "ember/optim/rmsprop.hpp"
#include "ember/optim/clip.hpp"
#include "ember/optim/scheduler.hpp"
#include "ember/optim/state_io.hpp"
