#pragma once
// train::GradientAccumulator: gradient accumulation over k micro-batches per optimizer step.
//
// Backward adds into .grad, so k backward passes between two zero_grad()
// calls leave the sum of the k micro-batch gradients in .grad. With each micro-batch's loss
// divided by k, that sum is the gradient of the mean over the k micro-batches, which for a loss
// that is a mean over samples (reduction "mean") and micro-batches of equal size b is the gradient
// of one batch of k*b samples, up to rounding:
//
//   train::GradientAccumulator acc(4);              // 4 micro-batches per step
//   amp::GradScaler scaler;
//   for (auto& [x, y] : micro_batches) {
//     auto loss = acc.scale_loss(loss_fn(model(x.to<half>()), y));   // loss / 4
//     scaler.scale(loss).backward();                // the gradients accumulate in fp32 .grad
//     if (acc.sync_step()) {                        // true after the 4th micro-batch
//       scaler.step(opt);                           // one unscale_, one inf check, one step
//       scaler.update();
//       opt.zero_grad();
//     }
//   }
//
// - With a GradScaler, an inf/NaN in ANY micro-batch's gradients stays in the accumulated .grad
//   (inf + finite = inf, NaN + anything = NaN), so the one unscale_ at the end of the step finds
//   it and the whole step is skipped. Do not unscale_ between micro-batches: the scaler allows one
//   unscale_ per update(), and the scale must not change within a step (update() once per step).
// - Data parallelism: a DataParallel wrapper should all-reduce gradients only during the backward
//   of the last micro-batch (torch DDP's no_sync()); should_sync() says whether the micro-batch
//   about to run its backward is that one. The counter advances in sync_step(), so consult
//   should_sync() before backward() and call sync_step() after it.
// - The loss is divided by k in its own dtype (a true division, not a multiplication by 1/k).
// - BatchNorm (and anything else that mixes samples of a batch) is NOT equivalent: in training,
//   BatchNorm normalises each micro-batch with that micro-batch's mean and variance, so k
//   micro-batches of b samples give different activations, losses and gradients than one batch of
//   k*b, and update the running statistics k times with noisier estimates. Per-sample layers
//   (Linear, Conv2d, LayerNorm, attention within a sequence) accumulate exactly. Use a larger
//   micro-batch, or GroupNorm/LayerNorm, where batch statistics matter (as with torch).
// - A last, partial group of micro-batches (a dataset that does not divide into k) still divides
//   each loss by k; call set_accumulation_steps() before it to divide by the true count.
#include <cstdint>

#include "ember/ops/ops.hpp"

namespace ember::train {

class GradientAccumulator {
 public:
  explicit GradientAccumulator(int64_t accumulation_steps) { set_accumulation_steps(accumulation_steps); }

  int64_t accumulation_steps() const { return k_; }
  // Changes k and starts a new step (the next micro-batch is the first).
  void set_accumulation_steps(int64_t k) {
    EMBER_CHECK(k >= 1, ValueError, "GradientAccumulator: accumulation_steps must be >= 1, got ", k);
    k_ = k;
    micro_batch_ = 0;
  }

  // The index, in [0, k), of the micro-batch being processed (advanced by sync_step()).
  int64_t micro_batch() const { return micro_batch_; }
  bool is_first_micro_batch() const { return micro_batch_ == 0; }
  bool is_last_micro_batch() const { return micro_batch_ == k_ - 1; }
  // Whether gradients must be communicated during this micro-batch's backward (data parallel):
  // only for the last micro-batch of a step.
  bool should_sync() const { return is_last_micro_batch(); }

  // loss / k (differentiable), in the loss's dtype. k == 1 returns the loss itself.
  AnyTensor scale_loss(const AnyTensor& loss) const {
    EMBER_CHECK(loss.defined(), ValueError, "GradientAccumulator.scale_loss: the loss is an undefined tensor");
    EMBER_CHECK(is_floating(loss.dtype()), DTypeError, "GradientAccumulator.scale_loss: the loss must be floating "
                "point, got ", loss.desc());
    if (k_ == 1) return loss;
    return op::div(loss, AnyTensor::full(Shape{}, static_cast<double>(k_), loss.dtype(), loss.device()));
  }
  template <Element T>
  Tensor<T> scale_loss(const Tensor<T>& loss) const {
    return Tensor<T>(scale_loss(AnyTensor(loss)));
  }

  // Call after each micro-batch's backward. Returns true when it was the last micro-batch of the
  // step (now: step the optimizer and zero the gradients), and moves to the next micro-batch.
  bool sync_step() {
    const bool last = is_last_micro_batch();
    micro_batch_ = last ? 0 : micro_batch_ + 1;
    return last;
  }
  // Forgets a partly accumulated step (the next micro-batch is the first).
  void reset() { micro_batch_ = 0; }

 private:
  int64_t k_ = 1;
  int64_t micro_batch_ = 0;
};

}  // namespace ember::train
