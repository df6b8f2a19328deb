#pragma once
// Mixed precision: the GradScaler (dynamic loss scaling for fp16) and the
// weight cast cache. Activations change precision by type (model(x.to<half>())); parameters stay
// fp32 master weights. See docs/api.md "Mixed precision".
#include "ember/amp/autocast.hpp"
#include "ember/amp/grad_scaler.hpp"
