#pragma once
// dist::ZeroRedundancyOptimizer: ZeRO stage 1 (optimizer-state sharding), as
// torch.distributed.optim.ZeroRedundancyOptimizer in spirit. The parameters (one floating dtype,
// one device) are viewed as one flat vector of N elements, padded to a multiple of the world
// size W; rank r owns the contiguous shard [r*S, (r+1)*S), S = ceil(N / W), and its local
// optimizer (made by the factory) sees only a tensor of S elements, so it keeps state for 1/W of
// the parameters.
//
//   dist::ZeroRedundancyOptimizer zero(model->parameters(), group,
//       [](std::vector<AnyTensor> ps) { return std::make_unique<optim::Adam>(std::move(ps)); });
//   loss.backward();       // plain local backward (no DataParallel needed)
//   zero.step();           // reduce_scatter(Avg) of the gradients, local step on the shard,
//   zero.zero_grad();      // all_gather of the updated parameters
//
// - step(): the gradients are copied into a flat buffer (a parameter without .grad counts as
//   zeros: unlike a plain optimizer, its shard is still stepped, so momentum still moves it),
//   reduce_scatter(Avg) gives each rank the average gradient of its shard, the local optimizer
//   steps the shard, and all_gather puts the updated values back into every parameter.
// - Elementwise optimizers (SGD, Adam, AdamW, RMSprop) give the same parameters as plain data
//   parallelism with the same optimizer. Optimizers that look at a whole parameter (norms,
//   LAMB-style trust ratios) would not.
// - Used together with DataParallel, the gradients are already averaged; the reduce_scatter
//   averages identical values (correct, redundant communication).
// - The construction compares the ranks' settings that change numerics (same_settings: a warning
//   from rank 0 by default, see dist/same_settings.hpp), then broadcasts rank 0's
//   parameters, so all replicas start equal.
// - local_optimizer() is the shard's optimizer (hyperparameters, lr schedulers, its state_dict:
//   each rank saves its own shard's state).
#include <functional>
#include <memory>

#include "ember/dist/process_group.hpp"
#include "ember/dist/same_settings.hpp"
#include "ember/optim/optimizer.hpp"

namespace ember::dist {

class ZeroRedundancyOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<AnyTensor>)>;

  ZeroRedundancyOptimizer(std::vector<AnyTensor> params, ProcessGroup& group, Factory factory,
                          SameSettingsOptions same_settings = {})
      : params_(std::move(params)), group_(group) {
    EMBER_CHECK(!params_.empty(), ValueError, "ZeroRedundancyOptimizer: no parameters");
    check_same_settings(group_, "ZeroRedundancyOptimizer", same_settings);
    dtype_ = params_[0].dtype();
    device_ = params_[0].device();
    for (const AnyTensor& p : params_) {
      EMBER_CHECK(p.dtype() == dtype_ && p.device() == device_, DTypeError,
                  "ZeroRedundancyOptimizer: all parameters must share one dtype and device; got ", p.desc(),
                  " and ", params_[0].desc());
      offsets_.push_back(numel_);
      numel_ += p.numel();
    }
    const int64_t w = group_.size();
    shard_ = (numel_ + w - 1) / w;
    if (shard_ == 0) shard_ = 1;
    flat_ = AnyTensor::zeros(Shape{shard_ * w}, dtype_, device_);
    NoGradGuard no_grad;
    fill_from_params();
    group_.broadcast(flat_, 0);
    copy_to_params();
    shard_param_ = AnyTensor::zeros(Shape{shard_}, dtype_, device_);
    shard_param_.copy_(flat_.slice(begin(), begin() + shard_));
    shard_param_.set_requires_grad(true);
    optimizer_ = factory({shard_param_});
    EMBER_CHECK(optimizer_ != nullptr, ValueError, "ZeroRedundancyOptimizer: the factory returned no optimizer");
  }

  void step() {
    NoGradGuard no_grad;
    fill_from_grads();
    AnyTensor g = AnyTensor::zeros(Shape{shard_}, dtype_, device_);
    group_.reduce_scatter(g, flat_, ReduceOp::Avg);
    shard_param_.set_grad(g);
    optimizer_->step();
    shard_param_.zero_grad();
    group_.all_gather(flat_, shard_param_.detach());
    copy_to_params();
  }

  void zero_grad(bool set_to_none = true) {
    for (AnyTensor& p : params_) {
      if (set_to_none) {
        p.zero_grad();
      } else if (AnyTensor g = p.grad(); g.defined() && g.numel() > 0) {
        g.backend().fill(g.dtype(), g.data_ptr(), g.numel(), 0.0);
      }
    }
  }

  optim::Optimizer& local_optimizer() { return *optimizer_; }
  // This rank's shard of the flat parameter vector: [shard_begin(), shard_end()) (the end may
  // pass numel() on the last rank: padding).
  int64_t shard_begin() const { return begin(); }
  int64_t shard_end() const { return begin() + shard_; }
  int64_t numel() const { return numel_; }
  // Bytes of optimizer state this rank holds (the local optimizer's state tensors).
  int64_t state_bytes() const {
    const optim::ParamState* st = optimizer_->state(shard_param_);
    int64_t b = 0;
    if (st)
      for (const auto& [k, v] : *st) b += static_cast<int64_t>(v.nbytes());
    return b;
  }

 private:
  int64_t begin() const { return shard_ * group_.rank(); }
  AnyTensor view(size_t i) const {
    return flat_.slice(offsets_[i], offsets_[i] + params_[i].numel()).reshape(params_[i].shape());
  }
  void fill_from_params() {
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].numel() > 0) view(i).copy_(params_[i].detach());
  }
  void fill_from_grads() {
    flat_.backend().fill(dtype_, flat_.data_ptr(), flat_.numel(), 0.0);
    for (size_t i = 0; i < params_.size(); ++i) {
      AnyTensor g = params_[i].grad();
      if (g.defined() && g.numel() > 0) view(i).copy_(g.dtype() == dtype_ ? g : g.to(dtype_));
    }
  }
  void copy_to_params() {
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].numel() > 0) {
        AnyTensor d = params_[i].detach();
        d.copy_(view(i));
      }
  }

  std::vector<AnyTensor> params_;
  ProcessGroup& group_;
  DType dtype_{};
  Device device_ = Device::cpu();
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0, shard_ = 0;
  AnyTensor flat_, shard_param_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

}  // namespace ember::dist
