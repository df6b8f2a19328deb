#pragma once
// dist::FullyShardedDataParallel: ZeRO stage 2 and stage 3 (torch's FSDP, DeepSpeed's ZeRO) over
// any ProcessGroup (NCCL on GPUs, MPI processes or thread ranks on the CPU).
//
//   dist::FullyShardedDataParallel fsdp(model, group, {.stage = 3});   // units: every block
//   optim::AdamW opt(fsdp.parameters(), {.lr = 3e-4});                  // this rank's shards
//   for (...) {
//     auto loss = loss_fn(fsdp(x), y);      // or (*model)(x), model->forward_any(x)
//     opt.zero_grad();
//     loss.backward();                      // gradients reduce-scattered into the shards
//     fsdp.clip_grad_norm_(1.0);            // optional: the global norm over every rank
//     opt.step();                           // steps this rank's shards only
//   }
//
// Layout. The parameters are grouped into units: the modules named in
// FullyShardedOptions::units (default: auto_units(), every layer of the top-most Sequentials, so
// each block of a GPT or each layer of a Sequential model) plus the root unit, the parameters no
// unit holds (a GPT's embeddings and final norm). A unit's parameters, in registration order, form
// one flat vector of N elements padded to world * S (S = ceil(N / world)); rank r owns
// [r*S, (r+1)*S) as its *master shard*: an fp32 (the parameters' dtype) leaf that requires grad,
// which the optimizer steps, so optimizer state is 1/world per rank (ZeRO-1).
//
// The module's parameter tensors stay the module's own handles, but their memory becomes views
// of the unit's *gathered* buffer (world * S elements of param_dtype), filled by an all_gather of
// the shards:
// - Stage 3: the gathered buffer exists only while needed. The unit's forward hook
//   (nn::Module::set_forward_hook) gathers it before the unit's forward and frees it after; the
//   forward's output passes through a node whose backward gathers it again before the unit's
//   backward; after the unit's last gradient it is freed. With `prefetch`, the next unit's
//   all_gather starts while this one computes (forward order, recorded in the first step; reverse
//   order in the backward). The root unit is gathered at the root module's forward and freed at the
//   end of backward (or after a forward without grad).
// - Stage 2: the gathered buffers stay (the parameters are replicated, as in DDP); after each
//   synchronised backward they are marked stale, and each unit is gathered again, from the
//   stepped shards, just before its next forward.
// Gradients (both stages): each parameter's gradient is written into the unit's flat gradient
// buffer (AnyTensor::set_grad_destination); when the unit's last gradient is ready its
// reduce_scatter (Avg) starts asynchronously while backward goes on (each unit is one bucket), the
// flat buffer is freed when it has finished, and at the end of backward the averaged shard is
// added into the master shard's .grad (in the master dtype). The module's parameters have no
// .grad afterwards: the gradients live in the shards.
//
// Mixed precision: `param_dtype` (bf16 or fp16) makes the gathered copies, hence the module's
// parameters, the activations' gradients and the reduce_scatter, that dtype; the masters and
// their gradients stay fp32. With fp16 and a GradScaler, dist::sync_found_inf(scaler, opt, group)
// agrees on the inf check across ranks as with DataParallel (opt is over the shards).
//
// What must hold:
// - Call the model so that its hooks run: fsdp(x), (*model)(x) or model->forward_any(x) (a typed
//   model->forward(x) skips the root's hook: the root unit then simply stays gathered in stage 3,
//   and is an error in stage 2 when it is stale), and each unit as (*unit)(x) or forward_any (as
//   Sequential and GPT call their layers). Code that calls a unit's forward() directly (GPT's
//   generation with a cache) runs inside `auto full = fsdp.gather_full_parameters();`.
// - Every rank runs the same forwards and backwards (collectives are matched by order), as with
//   DataParallel. A parameter used by two units, or used again after its unit's gradients went out
//   in the same backward, is an error naming it.
// - Unused parameters count as zero gradients (as DataParallel). no_sync(): backward passes only
//   accumulate into the unsharded gradient buffers (memory of a full gradient per unit, as torch's
//   no_sync); the next synchronised backward reduce-scatters the sums.
// - Elementwise optimizers (SGD, Adam, AdamW, RMSprop) give the same parameters as DataParallel
//   with the same optimizer: the reduction sums in the same order. Weight decay applies to every
//   element of a shard alike (one parameter group).
// - Gradient checkpointing (nn::recompute around a unit or inside it) works: the recomputed
//   forward gathers the unit again (and does not free it, being inside the backward).
// - The wrapper owns the layout: do not move the model (to(device), to(dtype)) after wrapping.
//   full_state_dict() / load_full_state_dict() give and take the unsharded parameters (fp32,
//   Module::state_dict names); dist/sharded_checkpoint.hpp saves and loads the shards.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ember/autograd/engine.hpp"
#include "ember/dist/data_parallel.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/dist/same_settings.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/ops.hpp"

namespace ember::dist {

struct FullyShardedOptions {
  int stage = 3;  // 2: parameters replicated, gradients and optimizer state sharded; 3: all sharded
  // Dotted module names (as named_modules gives them) that each become a unit; empty:
  // auto_units(model). A unit may not contain another.
  std::vector<std::string> units;
  // The dtype of the gathered parameters (and of the gradients reduced): bf16/fp16 for mixed
  // precision; unset: the parameters' own dtype. The master shards keep the parameters' dtype.
  std::optional<DType> param_dtype;
  bool prefetch = true;               // gather the next unit while this one computes
  bool broadcast_from_rank0 = true;   // parameters and buffers, at construction
  SameSettingsOptions same_settings;  // as DataParallelOptions::same_settings
};

// The layout of one unit, the same on every rank (sharded checkpoints are written from it).
struct ShardedUnitInfo {
  struct Param {
    std::string name;  // the module's dotted parameter name (Module::state_dict's)
    Shape shape;
    int64_t offset = 0;  // in the unit's flat vector
    int64_t numel = 0;
  };
  std::string name;  // the unit module's dotted name; "" for the root unit
  std::vector<Param> params;
  int64_t numel = 0;        // N: the parameters' elements
  int64_t shard_numel = 0;  // S = ceil(N / world) (at least 1)
};

// The default units: every child with parameters of the top-most Sequential modules (a Sequential
// model's layers; a GPT's blocks h.0, h.1, ...). Empty when the model has no Sequential.
inline std::vector<std::string> auto_units(nn::Module& model) {
  std::vector<std::string> units;
  std::vector<std::string> taken;  // Sequentials whose layers are units
  for (auto& [module_name, m] : model.named_modules()) {
    if (m->type_name() != "Sequential") continue;
    const std::string& name = module_name;  // (clang 14 does not capture structured bindings)
    const bool inside = std::any_of(taken.begin(), taken.end(), [&](const std::string& t) {
      return t.empty() || name.rfind(t + ".", 0) == 0;
    });
    if (inside) continue;
    taken.push_back(name);
    for (auto& [child, c] : m->named_children())
      if (!c->named_parameters().empty()) units.push_back(name.empty() ? child : name + "." + child);
  }
  return units;
}

class FullyShardedDataParallel {
  struct State;

 public:
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroup& group,
                           FullyShardedOptions options = {})
      : module_(std::move(module)), group_(group), state_(std::make_shared<State>()) {
    EMBER_CHECK(module_ != nullptr, ValueError, "FullyShardedDataParallel: null module");
    EMBER_CHECK(options.stage == 2 || options.stage == 3, ValueError,
                "FullyShardedDataParallel: stage must be 2 or 3, got ", options.stage,
                " (stage 1 is dist::ZeroRedundancyOptimizer)");
    EMBER_CHECK(module_->forward_hook() == nullptr, ValueError,
                "FullyShardedDataParallel: the model already has a forward hook (wrapped twice?)");
    State& st = *state_;
    st.group = &group_;
    st.stage = options.stage;
    st.prefetch = options.prefetch;
    check_same_settings(group_, "FullyShardedDataParallel", options.same_settings);
    auto named = module_->named_parameters();
    EMBER_CHECK(!named.empty(), ValueError, "FullyShardedDataParallel: the model has no parameters");
    DataParallel::check_replicas(named, group_, "FullyShardedDataParallel");
    if (options.broadcast_from_rank0) DataParallel::broadcast_module_state(*module_, group_);
    st.master_dtype = named[0].second.dtype();
    st.device = named[0].second.device();
    st.param_dtype = options.param_dtype.value_or(st.master_dtype);
    EMBER_CHECK(is_floating(st.param_dtype), DTypeError, "FullyShardedDataParallel: param_dtype must be floating, got ",
                dtype_name(st.param_dtype));
    for (auto& [n, p] : named) {
      EMBER_CHECK(p.requires_grad(), ValueError, "FullyShardedDataParallel: parameter ", n,
                  " does not require grad; frozen parameters are not supported (keep the frozen part outside "
                  "the wrapped model)");
      EMBER_CHECK(p.dtype() == st.master_dtype && p.device() == st.device, DTypeError,
                  "FullyShardedDataParallel: every parameter must share one dtype and device; ", n, " is ", p.desc(),
                  ", ", named[0].first, " is ", named[0].second.desc());
    }
    EMBER_CHECK(st.device == group_.device(), DeviceError,
                "FullyShardedDataParallel: the parameters are on ", st.device.str(), " but the group (",
                group_.backend_name(), ") communicates on ", group_.device().str());

    // Which unit owns each parameter: the named units first, the rest to the root.
    std::vector<std::string> unit_names = options.units.empty() ? auto_units(*module_) : options.units;
    std::unordered_map<std::string, nn::Module*> modules;
    for (auto& [n, m] : module_->named_modules()) modules[n] = m;
    for (const std::string& u : unit_names) {
      EMBER_CHECK(modules.count(u) && !u.empty(), ValueError, "FullyShardedDataParallel: no module named '", u,
                  "' (units name submodules as named_modules() gives them)");
      for (const std::string& v : unit_names)
        EMBER_CHECK(v == u || v.rfind(u + ".", 0) != 0, ValueError, "FullyShardedDataParallel: unit '", v,
                    "' lies inside unit '", u, "' (units may not nest)");
    }
    std::unordered_map<const TensorImpl*, size_t> owner;
    auto add_unit = [&](const std::string& name, nn::Module* m, const std::string& prefix) {
      Unit u;
      u.info.name = name;
      u.module = m;
      for (auto& [pn, p] : (m ? m->named_parameters() : named)) {
        const std::string full = m ? prefix + pn : pn;
        if (owner.count(p.impl())) {
          EMBER_CHECK(m == nullptr, ValueError, "FullyShardedDataParallel: parameter ", full,
                      " is shared between units (tied parameters must live outside the units, in the root)");
          continue;
        }
        owner[p.impl()] = st.units.size();
        ShardedUnitInfo::Param info{full, p.shape(), u.info.numel, p.numel()};
        u.info.numel += p.numel();
        u.info.params.push_back(info);
        u.params.push_back(p);
      }
      if (u.params.empty()) return;
      st.units.push_back(std::move(u));
    };
    for (const std::string& u : unit_names) add_unit(u, modules[u], u + ".");
    add_unit("", nullptr, "");  // the root: what no unit holds
    st.root = (!st.units.empty() && st.units.back().module == nullptr) ? st.units.size() - 1 : SIZE_MAX;

    const int64_t world = group_.size(), rank = group_.rank();
    NoGradGuard no_grad;
    for (size_t ui = 0; ui < st.units.size(); ++ui) {
      Unit& u = st.units[ui];
      u.info.shard_numel = std::max<int64_t>(1, (u.info.numel + world - 1) / world);
      const int64_t S = u.info.shard_numel;
      // The master shard from the (broadcast) parameter values.
      AnyTensor flat = AnyTensor::zeros(Shape{S * world}, st.master_dtype, st.device);
      for (size_t k = 0; k < u.params.size(); ++k)
        flat.slice(u.info.params[k].offset, u.info.params[k].offset + u.info.params[k].numel)
            .copy_(u.params[k].detach().reshape(Shape{u.params[k].numel()}));
      u.master = flat.slice(rank * S, (rank + 1) * S).clone();
      u.master.set_requires_grad(true);
      // The module's parameters become views of the gathered buffer.
      const size_t bytes = static_cast<size_t>(S * world) * dtype_size(st.param_dtype);
      u.gathered = std::make_shared<Storage>(st.device, bytes);
      auto gi = std::make_shared<TensorImpl>();
      gi->dtype = st.param_dtype;
      gi->device = st.device;
      gi->shape = Shape{S * world};
      gi->storage = u.gathered;
      u.gathered_view = AnyTensor(gi);
      u.gathered_view.copy_(st.param_dtype == st.master_dtype ? flat : flat.to(st.param_dtype));
      for (size_t k = 0; k < u.params.size(); ++k) {
        TensorImpl& p = *u.params[k].impl();
        p.storage = u.gathered;
        p.offset = u.info.params[k].offset;
        p.dtype = st.param_dtype;
        p.grad.reset();
      }
      u.is_gathered = true;
      u.ready.assign(u.params.size(), false);
      std::weak_ptr<State> weak = state_;
      for (size_t k = 0; k < u.params.size(); ++k) {
        u.params[k].set_grad_destination([weak, ui, k]() -> AnyTensor {
          auto s = weak.lock();
          return s ? s->grad_destination(ui, k) : AnyTensor();
        });
        u.params[k].register_grad_ready_hook([weak, ui, k](const AnyTensor&) {
          if (auto s = weak.lock()) s->on_grad_ready(ui, k, s);
        });
      }
      auto hook = std::make_shared<UnitHook>(weak, ui);
      if (u.module) u.module->set_forward_hook(hook);
    }
    // The root module's hook gathers the root unit (and, for stage 2, refreshes it).
    st.root_hook = std::make_shared<UnitHook>(state_, st.root);
    st.root_hook->is_root_hook = true;
    module_->set_forward_hook(st.root_hook);
    // Stage 3 starts sharded: nothing gathered until the first forward (the root waits for its
    // hook: see State::free).
    for (Unit& u : st.units) st.free(u);
  }

  // Takes the hooks off the model. No collective runs here (a destructor may run on one rank
  // only, unwinding an error): in stage 3 the parameters of freed units stay without memory, so
  // take what is needed first (full_state_dict(), or a gather_full_parameters() guard whose
  // lifetime ends after this wrapper's).
  ~FullyShardedDataParallel() {
    State& st = *state_;
    for (Unit& u : st.units) {
      if (u.module) u.module->set_forward_hook(nullptr);
      for (AnyTensor& p : u.params) p.set_grad_destination({});
      try {
        if (u.gather_work) u.gather_work->wait();
      } catch (...) {  // a lost peer: nothing more to do here
      }
    }
    if (module_->forward_hook() == st.root_hook) module_->set_forward_hook(nullptr);
  }

  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& group() { return group_; }
  int stage() const { return state_->stage; }
  DType param_dtype() const { return state_->param_dtype; }

  // This rank's master shards, one per unit (the root last): give them to the optimizer.
  std::vector<AnyTensor> parameters() const {
    std::vector<AnyTensor> out;
    for (const Unit& u : state_->units) out.push_back(u.master);
    return out;
  }
  size_t unit_count() const { return state_->units.size(); }
  const ShardedUnitInfo& unit_info(size_t i) const { return state_->units.at(i).info; }
  std::vector<ShardedUnitInfo> unit_infos() const {
    std::vector<ShardedUnitInfo> out;
    for (const Unit& u : state_->units) out.push_back(u.info);
    return out;
  }
  // Unit i's master shard (S elements of the parameters' dtype; zeros past N on the last rank).
  const AnyTensor& shard(size_t i) const { return state_->units.at(i).master; }
  // Whether unit i's parameters are gathered now (tests, memory accounting).
  bool is_gathered(size_t i) const { return state_->units.at(i).is_gathered; }

  AnyTensor forward_any(const AnyTensor& x) { return module_->forward_any(x); }
  AnyTensor operator()(const AnyTensor& x) { return module_->forward_any(x); }
  template <Element T>
  Tensor<T> operator()(const Tensor<T>& x) {
    return Tensor<T>(module_->forward_any(x));
  }

  // While the guard lives, backward passes accumulate the unsharded gradients locally.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedDataParallel& f) : state_(f.state_), prev_(f.state_->sync) {
      state_->sync = false;
    }
    ~NoSyncGuard() { state_->sync = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    std::shared_ptr<State> state_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Every unit gathered (from the current shards) while the guard lives; afterwards stage 3 frees
  // them again. A collective: every rank makes the guard at the same point.
  class FullParametersGuard {
   public:
    explicit FullParametersGuard(FullyShardedDataParallel& f) : state_(f.state_) {
      NoGradGuard no_grad;
      state_->full_guards += 1;
      for (Unit& u : state_->units) state_->start_gather(u);
      for (Unit& u : state_->units) state_->wait_gather(u);
    }
    ~FullParametersGuard() {
      state_->full_guards -= 1;
      if (state_->full_guards == 0 && state_->stage == 3)
        for (Unit& u : state_->units) state_->free(u);
    }
    FullParametersGuard(const FullParametersGuard&) = delete;
    FullParametersGuard& operator=(const FullParametersGuard&) = delete;

   private:
    std::shared_ptr<State> state_;
  };
  [[nodiscard]] FullParametersGuard gather_full_parameters() { return FullParametersGuard(*this); }

  // The sum of squares of every rank's shard gradients, all-reduced: the global gradient norm;
  // when it exceeds max_norm the shard gradients are scaled by max_norm / (norm + 1e-6) (as
  // nn::clip_grad_norm_). Returns the norm before clipping. A collective.
  double clip_grad_norm_(double max_norm) {
    NoGradGuard no_grad;
    EMBER_CHECK(max_norm >= 0.0, ValueError, "FullyShardedDataParallel::clip_grad_norm_: max_norm must be >= 0, got ",
                max_norm);
    double local = 0;
    for (Unit& u : state_->units) {
      AnyTensor g = u.master.grad();
      if (g.defined()) local += op::sum(op::square(g.detach().to(DType::Float64))).item_double();
    }
    AnyTensor t = Tensor<double>::scalar(local).reshape({1}).to(group_.device());
    group_.all_reduce(t, ReduceOp::Sum);
    const double norm = std::sqrt(Tensor<double>(t.to(Device::cpu())).to_vector()[0]);
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1)
      for (Unit& u : state_->units) {
        AnyTensor g = u.master.grad();
        if (g.defined()) g.copy_(op::mul(g.detach(), coef));
      }
    return norm;
  }

  // The unsharded parameters (master dtype, Module::state_dict's names and order, with the
  // buffers) on every rank: an all_gather per unit. Module::save of an unwrapped model writes the
  // same tensors.
  nn::StateDict full_state_dict() {
    NoGradGuard no_grad;
    State& st = *state_;
    std::unordered_map<std::string, AnyTensor> values;
    const int64_t world = group_.size();
    for (Unit& u : st.units) {
      const int64_t S = u.info.shard_numel;
      AnyTensor flat = AnyTensor::zeros(Shape{S * world}, st.master_dtype, st.device);
      group_.all_gather(flat, u.master.detach());
      for (const auto& p : u.info.params)
        values[p.name] = flat.slice(p.offset, p.offset + p.numel).reshape(p.shape).clone();
    }
    nn::StateDict out;
    for (auto& [name, t] : module_->state_dict()) {
      auto it = values.find(name);
      out.emplace_back(name, it != values.end() ? it->second : t.detach().clone());
    }
    return out;
  }

  // Sets the parameters from unsharded values (full_state_dict's names; every rank passes the
  // same values): each rank keeps its shard; buffers are copied. Strict: every parameter must be
  // present with its shape. Not a collective.
  void load_full_state_dict(const nn::StateDict& sd) {
    NoGradGuard no_grad;
    State& st = *state_;
    const int64_t rank = group_.rank();
    std::unordered_map<std::string, const AnyTensor*> by_name;
    for (auto& [n, t] : sd) by_name[n] = &t;
    for (Unit& u : st.units) {
      const int64_t S = u.info.shard_numel;
      AnyTensor flat = AnyTensor::zeros(Shape{S * group_.size()}, st.master_dtype, st.device);
      for (const auto& p : u.info.params) {
        auto it = by_name.find(p.name);
        EMBER_CHECK(it != by_name.end(), ValueError, "FullyShardedDataParallel::load_full_state_dict: missing ",
                    p.name);
        EMBER_CHECK(it->second->shape() == p.shape, ShapeError, "FullyShardedDataParallel::load_full_state_dict: ",
                    p.name, " is ", it->second->desc(), ", the model's is ", p.shape.str());
        AnyTensor v = it->second->detach().reshape(Shape{p.numel});
        flat.slice(p.offset, p.offset + p.numel).copy_(v.dtype() == st.master_dtype ? v : v.to(st.master_dtype));
      }
      u.master.detach().copy_(flat.slice(rank * S, (rank + 1) * S));
      u.stale = true;
    }
    for (auto& [n, b] : module_->named_buffers()) {
      auto it = by_name.find(n);
      if (it != by_name.end()) {
        AnyTensor dst = b.detach();
        dst.copy_(it->second->dtype() == b.dtype() ? *it->second : it->second->to(b.dtype()));
      }
    }
    st.refresh_gathered();
  }

  // Marks every unit's gathered parameters stale (after changing the shards by hand): stage 2
  // gathers them again before their next forward.
  void shards_changed() { state_->refresh_gathered(); }

 private:
  struct Unit {
    ShardedUnitInfo info;
    nn::Module* module = nullptr;  // null for the root unit
    std::vector<AnyTensor> params;
    std::shared_ptr<Storage> gathered;  // world * S of param_dtype; memory only while gathered
    AnyTensor gathered_view;            // [world * S] on `gathered`
    AnyTensor master;                   // [S] master dtype, requires grad: what the optimizer steps
    bool is_gathered = false;           // memory present, values current or an all_gather in flight
    bool stale = false;                 // the shards changed since the last gather
    AnyTensor gather_src;               // the shard being sent (cast to param_dtype)
    std::shared_ptr<Work> gather_work;
    int64_t gather_ns = 0;
    // Gradients of the current (or accumulating) backward.
    AnyTensor flat_grad;                // [world * S] param_dtype, uninitialised where nothing was written
    std::vector<bool> written;          // which parameters' slices of flat_grad hold a gradient
    std::vector<bool> ready;
    size_t n_ready = 0;
    bool reduced = false;               // reduce_scatter launched in this backward
    AnyTensor grad_shard;
    std::shared_ptr<Work> reduce_work;
    int64_t reduce_ns = 0;
  };

  struct UnitHook : nn::Module::ForwardHook {
    UnitHook(std::weak_ptr<State> s, size_t u) : state(std::move(s)), unit(u) {}
    void before(nn::Module&) override {
      if (auto s = state.lock()) s->pre_forward(unit, is_root_hook);
    }
    AnyTensor after(nn::Module&, const AnyTensor& y) override {
      auto s = state.lock();
      return s ? s->post_forward(unit, is_root_hook, y, s) : y;
    }
    std::weak_ptr<State> state;
    size_t unit;
    bool is_root_hook = false;
  };

  struct State {
    ProcessGroup* group = nullptr;
    std::vector<Unit> units;
    size_t root = SIZE_MAX;  // index of the root unit, SIZE_MAX when every parameter is in a unit
    std::shared_ptr<UnitHook> root_hook;
    bool root_hook_seen = false;  // the root's hook has run: the root unit may be freed
    int stage = 3;
    bool prefetch = true;
    bool sync = true;
    int full_guards = 0;
    DType master_dtype = DType::Float32, param_dtype = DType::Float32;
    Device device = Device::cpu();
    std::vector<size_t> order;   // units in the order of their first forward
    bool order_final = false;    // recorded by a whole forward and backward
    std::unordered_set<const void*> queued_lists;  // backward passes holding our callback
    std::vector<size_t> launch_order;  // units whose reduce_scatter started in this backward, in order

    static bool in_backward() { return autograd::detail::current_backward_callbacks() != nullptr; }

    void start_gather(Unit& u) {
      if (u.is_gathered && !u.stale) return;
      if (u.gather_work) return;
      NoGradGuard no_grad;
      u.gathered->reallocate();
      u.gather_src = u.master.detach();
      if (param_dtype != master_dtype) u.gather_src = u.gather_src.to(param_dtype);
      u.gather_ns = trace::now_ns();
      u.gather_work = group->all_gather_async(u.gathered_view, u.gather_src);
      u.is_gathered = true;
      u.stale = false;
    }
    void wait_gather(Unit& u) {
      if (!u.gather_work) return;
      {
        trace::PhaseScope exposed(trace::Phase::Communication);  // the part not hidden
        u.gather_work->wait();
      }
      trace::interval(trace::Phase::Communication, "all_gather", u.gather_ns, trace::now_ns());
      u.gather_work.reset();
      u.gather_src = AnyTensor();
    }
    void wait_all_gathers() {
      for (Unit& u : units) wait_gather(u);
    }
    void gather(Unit& u) {
      start_gather(u);
      wait_gather(u);
    }
    // Stage 3 gives a unit's gathered memory back. The root unit only once the root module's hook
    // has run: a model called past its hook (model->forward(x)) keeps its root gathered.
    void free(Unit& u) {
      if (stage != 3 || !u.is_gathered || full_guards > 0) return;
      if (&u - units.data() == static_cast<std::ptrdiff_t>(root) && !root_hook_seen) return;
      wait_gather(u);
      u.gathered->release_memory();
      u.is_gathered = false;
    }
    void refresh_gathered() {
      for (Unit& u : units) {
        u.stale = true;
        if (stage == 3 && full_guards == 0) free(u);
      }
    }
    size_t position(size_t ui) const {
      auto it = std::find(order.begin(), order.end(), ui);
      return it == order.end() ? SIZE_MAX : static_cast<size_t>(it - order.begin());
    }

    void pre_forward(size_t ui, bool is_root_hook) {
      if (ui == SIZE_MAX) return;  // a root hook on a model whose parameters are all in units
      Unit& u = units[ui];
      if (is_root_hook) {
        root_hook_seen = true;
      } else if (root != SIZE_MAX && ui != root && units[root].stale) {  // the root's hook did not run
        throw DistributedError(::ember::detail::str_cat(
            "FullyShardedDataParallel: unit '", u.info.name, "' runs but the root module's own parameters (",
            units[root].info.params[0].name, ", ...) were not gathered after the last step: the model was "
            "called past its hook (model->forward(x)); call it as fsdp(x), (*model)(x) or model->forward_any(x)"));
      }
      if (!order_final && std::find(order.begin(), order.end(), ui) == order.end()) order.push_back(ui);
      start_gather(u);
      if (prefetch && order_final && !in_backward()) {
        const size_t pos = position(ui);
        if (pos != SIZE_MAX && pos + 1 < order.size()) start_gather(units[order[pos + 1]]);
      }
      wait_gather(u);
    }

    AnyTensor post_forward(size_t ui, bool is_root_hook, const AnyTensor& y, const std::shared_ptr<State>& self) {
      if (ui == SIZE_MAX) return y;
      const bool recording = is_grad_enabled() && y.defined() && y.requires_grad();
      if (!recording) {
        // No backward will need the parameters: stage 3 frees them now (the root too).
        if (!in_backward()) free(units[ui]);
        if (is_root_hook && ui == root && !in_backward())
          for (Unit& u : units) free(u);
        return y;
      }
      AnyTensor out = y;
      if (ui != root) {
        std::weak_ptr<State> weak = self;
        out = y.detach();
        autograd::record(
            "FsdpPreBackward", {y}, {out},
            [weak, ui](const std::vector<AnyTensor>& grads) {
              if (auto s = weak.lock()) s->pre_backward(ui, s);
              return grads;
            });
        if (!in_backward()) free(units[ui]);  // gathered again by FsdpPreBackward
      }
      return out;
    }

    void queue_end_callback(const std::shared_ptr<State>& self) {
      const void* list = autograd::detail::current_backward_callbacks();
      if (list != nullptr && queued_lists.insert(list).second) {
        std::weak_ptr<State> weak = self;
        autograd::queue_callback([weak, list] {
          if (auto s = weak.lock()) s->on_backward_end(list);
        });
      }
    }

    void pre_backward(size_t ui, const std::shared_ptr<State>& self) {
      queue_end_callback(self);
      gather(units[ui]);
      if (prefetch && order_final) {
        const size_t pos = position(ui);
        if (pos != SIZE_MAX && pos > 0 && order[pos - 1] != root) start_gather(units[order[pos - 1]]);
      }
    }

    AnyTensor grad_view(Unit& u, size_t k) {
      const auto& p = u.info.params[k];
      return u.flat_grad.slice(p.offset, p.offset + p.numel).reshape(p.shape);
    }
    AnyTensor grad_destination(size_t ui, size_t k) {
      Unit& u = units[ui];
      if (u.reduced) {
        reset();
        throw ValueError(::ember::detail::str_cat(
            "FullyShardedDataParallel: the gradient of ", u.info.params[k].name, " arrived after unit '", u.info.name,
            "' had sent its gradients in this backward (a parameter used again outside its unit: keep it in the root, "
            "or list a unit that holds every use)"));
      }
      if (!u.flat_grad.defined()) {
        // Not zero-filled: backward copies each gradient into its slice (AccumulateGrad), and the
        // slices nothing wrote are zeroed when the reduce_scatter starts (launch_reduce).
        u.flat_grad = AnyTensor::empty(Shape{u.info.shard_numel * group->size()}, param_dtype, device);
        u.written.assign(u.params.size(), false);
      }
      u.written[k] = true;
      return grad_view(u, k);
    }

    void on_grad_ready(size_t ui, size_t k, const std::shared_ptr<State>& self) {
      queue_end_callback(self);
      Unit& u = units[ui];
      if (!sync) return;
      if (!u.ready[k]) {
        u.ready[k] = true;
        u.n_ready += 1;
      }
      if (ui != root && u.n_ready == u.params.size() && !u.reduced) launch_reduce(u);
      retire_reductions(/*wait_for_excess=*/false);
    }

    // Finished reductions give their gradient to the master shard and free their unsharded buffer
    // now rather than at the end of backward, so that a backward holds the full gradients of a few
    // units, not of the whole model. With wait_for_excess, more than max_in_flight reductions in
    // flight make the oldest one be waited for (the bound on that memory).
    static constexpr int max_in_flight = 2;
    void retire_reductions(bool wait_for_excess) {
      int in_flight = 0;
      for (Unit& u : units)
        if (u.reduce_work) {
          if (u.reduce_work->is_completed()) {
            retire(u);
          } else {
            in_flight += 1;
          }
        }
      if (!wait_for_excess) return;
      for (size_t i : launch_order) {
        if (in_flight <= max_in_flight) break;
        if (!units[i].reduce_work) continue;
        retire(units[i]);
        in_flight -= 1;
      }
    }
    // Waits for u's reduce_scatter and adds the averaged shard into its master's .grad.
    void retire(Unit& u) {
      NoGradGuard no_grad;
      {
        trace::PhaseScope exposed(trace::Phase::Communication);  // no-op wait when already done
        u.reduce_work->wait();
      }
      if (u.reduce_ns > 0) trace::interval(trace::Phase::Communication, "reduce_scatter", u.reduce_ns, trace::now_ns());
      AnyTensor g = u.grad_shard.dtype() == master_dtype ? u.grad_shard : u.grad_shard.to(master_dtype);
      AnyTensor mg = u.master.grad();
      if (mg.defined()) {
        autograd::detail::add_into(mg, g);
      } else {
        u.master.set_grad(g);
      }
      u.flat_grad = AnyTensor();
      u.written.clear();
      u.grad_shard = AnyTensor();
      u.reduce_work.reset();
      u.reduce_ns = 0;
    }

    void launch_reduce(Unit& u) {
      NoGradGuard no_grad;
      if (!u.flat_grad.defined()) {  // no gradient on this rank: zeros (other ranks may have some)
        u.flat_grad = AnyTensor::zeros(Shape{u.info.shard_numel * group->size()}, param_dtype, device);
      } else {  // zeros where no gradient was written: unused parameters and the padding
        Backend& be = u.flat_grad.backend();
        for (size_t k = 0; k < u.params.size(); ++k)
          if (!u.written[k]) {
            AnyTensor v = u.flat_grad.slice(u.info.params[k].offset, u.info.params[k].offset + u.info.params[k].numel);
            be.fill(param_dtype, v.data_ptr(), v.numel(), 0.0);
          }
        const int64_t total = u.info.shard_numel * group->size();
        if (total > u.info.numel) {
          AnyTensor pad = u.flat_grad.slice(u.info.numel, total);
          be.fill(param_dtype, pad.data_ptr(), pad.numel(), 0.0);
        }
      }
      u.reduced = true;
      for (AnyTensor& p : u.params) p.set_grad(AnyTensor());  // the buffer belongs to the collective now
      u.grad_shard = AnyTensor::empty(Shape{u.info.shard_numel}, param_dtype, device);
      u.reduce_ns = trace::now_ns();
      u.reduce_work = group->reduce_scatter_async(u.grad_shard, u.flat_grad, ReduceOp::Avg);
      launch_order.push_back(static_cast<size_t>(&u - units.data()));
      if (&u - units.data() != static_cast<std::ptrdiff_t>(root)) free(u);  // the root: at the end
      retire_reductions(/*wait_for_excess=*/true);
    }

    void on_backward_end(const void* list) {
      queued_lists.erase(list);
      if (!queued_lists.empty()) return;  // an enclosing backward holds our callback: finish there
      try {
        finish_backward();
      } catch (...) {
        reset();
        throw;
      }
      order_final = true;
    }

    void finish_backward() {
      NoGradGuard no_grad;
      if (!sync) {  // gradients stay in the unsharded buffers (the .grad views)
        for (Unit& u : units) {
          u.ready.assign(u.ready.size(), false);
          u.n_ready = 0;
          free(u);
        }
        return;
      }
      for (Unit& u : units)
        if (!u.reduced) launch_reduce(u);
      for (size_t i : launch_order)
        if (units[i].reduce_work) retire(units[i]);
      reset();
      // The optimizer steps the shards next: stage 2 gathers every unit again before its next
      // forward; stage 3 frees what is still gathered (the root).
      for (Unit& u : units) {
        u.stale = true;
        free(u);
      }
    }

    void reset() {
      launch_order.clear();
      for (Unit& u : units) {
        u.ready.assign(u.ready.size(), false);
        u.n_ready = 0;
        u.reduced = false;
      }
    }
  };

  std::shared_ptr<nn::Module> module_;
  ProcessGroup& group_;
  std::shared_ptr<State> state_;
};

}  // namespace ember::dist
