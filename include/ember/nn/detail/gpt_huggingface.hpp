#pragma once
// nn::GPT <-> Hugging Face transformers' GPT2LMHeadModel (part of nn/gpt.hpp, which includes it
// after the class). The names, per block i (HF's file keys carry "transformer." in front, and
// checkpoints converted from GPT2Model, such as openai-community/gpt2's, carry none):
//
//   ember                          transformers                      layout
//   wte.weight                     transformer.wte.weight            [V, E] as is
//   wpe.weight                     transformer.wpe.weight            [P, E] as is
//   h.i.ln_1.{weight,bias}         transformer.h.i.ln_1.*            as is
//   h.i.attn.in_proj_weight        transformer.h.i.attn.c_attn.weight  [3E, E] = Conv1D's [E, 3E] transposed
//   h.i.attn.in_proj_bias          transformer.h.i.attn.c_attn.bias  [3E] (q, k, v: the same order)
//   h.i.attn.out_proj.weight       transformer.h.i.attn.c_proj.weight  transposed
//   h.i.attn.out_proj.bias         transformer.h.i.attn.c_proj.bias
//   h.i.ln_2.{weight,bias}         transformer.h.i.ln_2.*
//   h.i.mlp.c_fc.{weight,bias}     transformer.h.i.mlp.c_fc.*        weight [4E, E] <- [E, 4E] transposed
//   h.i.mlp.c_proj.{weight,bias}   transformer.h.i.mlp.c_proj.*      weight [E, 4E] <- [4E, E] transposed
//   ln_f.{weight,bias}             transformer.ln_f.*
//   (wte.weight, tied)             lm_head.weight                    not written (transformers' own
//                                                                    save_pretrained drops it too); on load,
//                                                                    accepted only when equal to wte's
// Older checkpoints' causal-mask buffers h.i.attn.bias and h.i.attn.masked_bias are skipped.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <tuple>

#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::nn {

namespace gpt_hf_detail {
// (ember name, HF name without "transformer.", transposed) for every parameter, in state-dict order.
inline std::vector<std::tuple<std::string, std::string, bool>> name_table(int64_t n_layer) {
  std::vector<std::tuple<std::string, std::string, bool>> t{{"wte.weight", "wte.weight", false},
                                                            {"wpe.weight", "wpe.weight", false}};
  for (int64_t i = 0; i < n_layer; ++i) {
    const std::string e = "h." + std::to_string(i) + ".";
    for (const char* ln : {"ln_1", "attn", "ln_2", "mlp"}) {
      const std::string m = ln;
      if (m == "attn") {
        t.emplace_back(e + "attn.in_proj_weight", e + "attn.c_attn.weight", true);
        t.emplace_back(e + "attn.in_proj_bias", e + "attn.c_attn.bias", false);
        t.emplace_back(e + "attn.out_proj.weight", e + "attn.c_proj.weight", true);
        t.emplace_back(e + "attn.out_proj.bias", e + "attn.c_proj.bias", false);
      } else if (m == "mlp") {
        for (const char* fc : {"c_fc", "c_proj"}) {
          t.emplace_back(e + "mlp." + fc + ".weight", e + "mlp." + fc + ".weight", true);
          t.emplace_back(e + "mlp." + fc + ".bias", e + "mlp." + fc + ".bias", false);
        }
      } else {
        t.emplace_back(e + m + ".weight", e + m + ".weight", false);
        t.emplace_back(e + m + ".bias", e + m + ".bias", false);
      }
    }
  }
  t.emplace_back("ln_f.weight", "ln_f.weight", false);
  t.emplace_back("ln_f.bias", "ln_f.bias", false);
  return t;
}

// "h.<digits>.attn.bias" / "h.<digits>.attn.masked_bias": the causal-mask buffers old GPT-2
// checkpoints saved (no weights).
inline bool is_mask_buffer(const std::string& k) {
  if (k.rfind("h.", 0) != 0) return false;
  size_t i = 2;
  while (i < k.size() && k[i] >= '0' && k[i] <= '9') ++i;
  if (i == 2) return false;
  const std::string rest = k.substr(i);
  return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

inline nlohmann::json read_json(const std::filesystem::path& p, const char* who) {
  std::ifstream in(p, std::ios::binary);
  EMBER_CHECK(static_cast<bool>(in), IOError, who, ": cannot open '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(::ember::detail::str_cat(who, ": '", p.string(), "' is not valid JSON: ", e.what()));
  }
}

// The shard files a safetensors index (model.safetensors.index.json) names, in order of first
// mention, as paths in `dir`. `where` names the index in errors (FormatError).
inline std::vector<std::filesystem::path> index_shards(const nlohmann::json& j, const std::filesystem::path& dir,
                                                       const std::string& where, const char* who) {
  EMBER_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), FormatError, who, ": '",
              where, "' has no \"weight_map\" object (a safetensors index maps tensor names to files)");
  std::vector<std::filesystem::path> shards;
  std::set<std::string> seen;
  for (const auto& [name, file] : j["weight_map"].items()) {
    EMBER_CHECK(file.is_string(), FormatError, who, ": '", where, "': the file of '", name, "' is not a string");
    const std::string s = file.get<std::string>();
    // Shards live beside the index: a name with a folder in it would read files elsewhere.
    EMBER_CHECK(!s.empty() && s.find('/') == std::string::npos && s.find('\0') == std::string::npos && s != "." &&
                    s != "..",
                FormatError, who, ": '", where, "': the file '", s, "' of '", name,
                "' is not a file name in the index's folder");
    if (seen.insert(s).second) shards.push_back(dir / s);
  }
  EMBER_CHECK(!shards.empty(), FormatError, who, ": '", where, "' names no shard");
  return shards;
}

// The config.json and the safetensors files of a model folder, index file or weights file.
struct HFFiles {
  std::filesystem::path config;
  std::vector<std::filesystem::path> weights;
};
inline HFFiles resolve(const std::filesystem::path& p, const char* who) {
  namespace fs = std::filesystem;
  std::error_code ec;
  HFFiles f;
  fs::path dir, index;
  if (fs::is_directory(p, ec)) {
    dir = p;
    if (fs::is_regular_file(p / "model.safetensors", ec))
      f.weights.push_back(p / "model.safetensors");
    else if (fs::is_regular_file(p / "model.safetensors.index.json", ec))
      index = p / "model.safetensors.index.json";
    else
      throw IOError(::ember::detail::str_cat(who, ": no model.safetensors or model.safetensors.index.json in '",
                                             p.string(), "' (a pytorch_model.bin must be converted to safetensors)"));
  } else if (fs::is_regular_file(p, ec)) {
    dir = p.parent_path();
    if (p.extension() == ".json")
      index = p;
    else
      f.weights.push_back(p);
  } else {
    throw IOError(::ember::detail::str_cat(who, ": no such file or folder '", p.string(), "'"));
  }
  f.config = dir / "config.json";
  if (!index.empty()) f.weights = index_shards(read_json(index, who), dir, index.string(), who);
  return f;
}

inline int64_t get_int(const nlohmann::json& j, const char* key, const std::string& src, std::optional<int64_t> def) {
  if (!j.contains(key) || j[key].is_null()) {
    EMBER_CHECK(def.has_value(), FormatError, "GPT::config_from_huggingface: ", src, " has no \"", key, "\"");
    return *def;
  }
  EMBER_CHECK(j[key].is_number_integer() &&
                  (!j[key].is_number_unsigned() ||
                   j[key].get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
              FormatError, "GPT::config_from_huggingface: ", src, ": \"", key, "\" must be an integer, got ",
              j[key].dump());
  return j[key].get<int64_t>();
}
inline double get_real(const nlohmann::json& j, const char* key, const std::string& src, double def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  EMBER_CHECK(j[key].is_number(), FormatError, "GPT::config_from_huggingface: ", src, ": \"", key,
              "\" must be a number, got ", j[key].dump());
  return j[key].get<double>();
}
inline bool get_bool(const nlohmann::json& j, const char* key, const std::string& src, bool def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  EMBER_CHECK(j[key].is_boolean(), FormatError, "GPT::config_from_huggingface: ", src, ": \"", key,
              "\" must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}
inline std::string get_string(const nlohmann::json& j, const char* key, const std::string& src,
                              const std::string& def) {
  if (!j.contains(key) || j[key].is_null()) return def;
  EMBER_CHECK(j[key].is_string(), FormatError, "GPT::config_from_huggingface: ", src, ": \"", key,
              "\" must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}

// The MLP's width: n_inner, or 4 * n_embd for 0 (-1 where n_embd is not positive or 4 * n_embd
// overflows: sizes come from a file).
inline int64_t mlp_width(int64_t n_inner, int64_t n_embd) {
  if (n_inner > 0) return n_inner;
  return n_embd > 0 && n_embd <= std::numeric_limits<int64_t>::max() / 4 ? 4 * n_embd : -1;
}

inline bool same_bytes(const AnyTensor& a, const AnyTensor& b) {
  if (a.dtype() != b.dtype() || !(a.shape() == b.shape())) return false;
  const AnyTensor ca = a.to(Device::cpu()), cb = b.to(Device::cpu());
  return a.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), a.nbytes()) == 0;
}

inline std::string join(const std::vector<std::string>& v, size_t max = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += ::ember::detail::str_cat(", ... (", v.size(), " in all)");
  return s;
}
}  // namespace gpt_hf_detail

inline GPTConfig GPT::config_from_huggingface(const nlohmann::json& j, const std::string& source,
                                              const HuggingFaceOptions& options) {
  namespace d = gpt_hf_detail;
  const char* who = "GPT::config_from_huggingface";
  EMBER_CHECK(j.is_object(), FormatError, who, ": ", source, " must be a JSON object, got ", j.type_name());
  const std::string type = d::get_string(j, "model_type", source, "gpt2");
  EMBER_CHECK(type == "gpt2", ValueError, who, ": ", source, " describes a '", type,
              "' model; nn::GPT reads GPT-2 (model_type \"gpt2\")");
  const std::string act = d::get_string(j, "activation_function", source, "gelu_new");
  EMBER_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", ValueError, who, ": ", source,
              ": activation_function \"", act, "\" is not GELU's tanh approximation (gelu_new), which ",
              "nn::TransformerBlock's MLP computes");
  EMBER_CHECK(d::get_bool(j, "scale_attn_weights", source, true), ValueError, who, ": ", source,
              ": scale_attn_weights = false (unscaled attention scores) is not GPT-2's attention");
  EMBER_CHECK(!d::get_bool(j, "scale_attn_by_inverse_layer_idx", source, false), ValueError, who, ": ", source,
              ": scale_attn_by_inverse_layer_idx = true is not supported (nn::MultiheadAttention scales by "
              "1/sqrt(head_dim) only)");
  EMBER_CHECK(!d::get_bool(j, "add_cross_attention", source, false), ValueError, who, ": ", source,
              ": add_cross_attention = true (an encoder-decoder GPT-2) is not supported");
  EMBER_CHECK(d::get_bool(j, "tie_word_embeddings", source, true), ValueError, who, ": ", source,
              ": tie_word_embeddings = false: nn::GPT's LM head is always wte.weight");
  GPTConfig c;
  c.vocab_size = d::get_int(j, "vocab_size", source, std::nullopt);
  c.block_size = j.contains("n_positions") ? d::get_int(j, "n_positions", source, std::nullopt)
                                           : d::get_int(j, "n_ctx", source, std::nullopt);
  c.n_layer = d::get_int(j, "n_layer", source, std::nullopt);
  c.n_head = d::get_int(j, "n_head", source, std::nullopt);
  c.n_embd = d::get_int(j, "n_embd", source, std::nullopt);
  c.n_inner = d::get_int(j, "n_inner", source, 0);
  if (c.n_inner > 0 && c.n_inner == d::mlp_width(0, c.n_embd)) c.n_inner = 0;  // one way to say GPT-2's default
  c.layer_norm_eps = d::get_real(j, "layer_norm_epsilon", source, 1e-5);
  // GPT2Config's defaults are 0.1 each.
  const double pa = d::get_real(j, "attn_pdrop", source, 0.1), pr = d::get_real(j, "resid_pdrop", source, 0.1),
               pe = d::get_real(j, "embd_pdrop", source, 0.1);
  if (options.dropout) {
    c.dropout = *options.dropout;
  } else {
    EMBER_CHECK(pa == pr && pr == pe, ValueError, who, ": ", source, " has attn_pdrop ", pa, ", resid_pdrop ", pr,
                " and embd_pdrop ", pe, "; nn::GPT has one dropout rate: choose it with HuggingFaceOptions::dropout");
    c.dropout = pr;
  }
  EMBER_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 &&
                  c.n_inner >= 0 && c.n_embd % c.n_head == 0,
              ValueError, who, ": ", source, ": vocab_size ", c.vocab_size, ", n_positions ", c.block_size,
              ", n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd, ", n_inner ", c.n_inner,
              " (sizes must be positive, n_embd divisible by n_head)");
  EMBER_CHECK(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps >= 0.0, ValueError, who, ": ", source,
              ": layer_norm_epsilon must be finite and >= 0, got ", c.layer_norm_eps);
  EMBER_CHECK(c.dropout >= 0.0 && c.dropout <= 1.0, ValueError, who, ": ", source, ": the dropout rate must be in ",
              "[0, 1], got ", c.dropout);
  c.bias = true;
  c.dtype = options.dtype;
  c.device = options.device;
  return c;
}

inline nlohmann::ordered_json GPT::huggingface_config() const {
  nlohmann::ordered_json j;
  j["activation_function"] = "gelu_new";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["attn_pdrop"] = cfg_.dropout;
  // GPT-2's <|endoftext|> when the vocabulary has it; GPTConfig keeps no token ids of its own,
  // and transformers warns about ids outside a smaller vocabulary.
  if (cfg_.vocab_size > 50256)
    j["bos_token_id"] = 50256;
  else
    j["bos_token_id"] = nullptr;
  const std::string dt = dtype_name(wte->weight.dtype());
  j["dtype"] = dt;  // transformers 5 reads "dtype", 4.x "torch_dtype"
  j["embd_pdrop"] = cfg_.dropout;
  j["eos_token_id"] = j["bos_token_id"];
  j["initializer_range"] = 0.02;
  j["layer_norm_epsilon"] = cfg_.layer_norm_eps;
  j["model_type"] = "gpt2";
  j["n_embd"] = cfg_.n_embd;
  j["n_head"] = cfg_.n_head;
  if (cfg_.n_inner > 0)
    j["n_inner"] = cfg_.n_inner;
  else
    j["n_inner"] = nullptr;
  j["n_layer"] = cfg_.n_layer;
  j["n_positions"] = cfg_.block_size;
  j["reorder_and_upcast_attn"] = false;
  j["resid_pdrop"] = cfg_.dropout;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = dt;
  j["use_cache"] = true;
  j["vocab_size"] = cfg_.vocab_size;
  return j;
}

inline io::TensorList GPT::huggingface_state_dict() const {
  const char* who = "GPT::huggingface_state_dict";
  EMBER_CHECK(cfg_.bias, ValueError, who, ": transformers' GPT-2 has a bias in every LayerNorm and Conv1D; this ",
              "model was made with bias = false");
  const StateDict mine = state_dict();
  io::TensorList out;
  for (const auto& [ember_name, hf_name, transposed] : gpt_hf_detail::name_table(cfg_.n_layer)) {
    const AnyTensor* t = find_entry(mine, ember_name);
    EMBER_CHECK(t != nullptr, ValueError, who, ": the model has no parameter '", ember_name, "'");
    NoGradGuard no_grad;
    // Conv1D stores [in, out]; a fresh tensor either way, so nothing shares the model's storage.
    out.emplace_back("transformer." + hf_name, transposed ? op::transpose(t->detach(), 0, 1) : t->detach().clone());
  }
  return out;
}

inline void GPT::load_huggingface_state_dict(const io::TensorList& tensors, const std::string& source) {
  namespace d = gpt_hf_detail;
  const char* who = "GPT::load_huggingface";
  std::vector<std::pair<std::string, const AnyTensor*>> by_key;  // without "transformer."
  const AnyTensor* lm_head = nullptr;
  std::vector<std::string> unexpected;
  auto find = [&](const std::string& k) -> const AnyTensor* {
    for (const auto& [n, t] : by_key)
      if (n == k) return t;
    return nullptr;
  };
  for (const auto& [name, t] : tensors) {
    const std::string k = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (k == "lm_head.weight") {
      lm_head = &t;
      continue;
    }
    if (d::is_mask_buffer(k)) continue;
    EMBER_CHECK(find(k) == nullptr, ValueError, who, ": ", source, " holds '", k, "' twice (with and without the ",
                "\"transformer.\" prefix)");
    by_key.emplace_back(k, &t);
  }
  const StateDict mine = state_dict();
  StateDict sd;
  std::vector<std::string> missing, mismatched;
  std::set<std::string> known;
  for (const auto& [ember_name, hf_name, transposed] : d::name_table(cfg_.n_layer)) {
    known.insert(hf_name);
    const AnyTensor* src = find(hf_name);
    if (!src) {
      missing.push_back("transformer." + hf_name);
      continue;
    }
    const AnyTensor& dst = *find_entry(mine, ember_name);
    Shape want = dst.shape();
    if (transposed) want = Shape{want[1], want[0]};
    EMBER_CHECK(is_floating(src->dtype()), DTypeError, who, ": ", source, ": 'transformer.", hf_name, "' is ",
                src->desc(), ", expected floating point");
    if (!(src->shape() == want)) {
      mismatched.push_back(::ember::detail::str_cat("transformer.", hf_name, " is ", src->shape().str(), ", expected ",
                                                    want.str(), transposed ? " (Conv1D [in, out])" : ""));
      continue;
    }
    sd.emplace_back(ember_name, transposed ? op::transpose(*src, 0, 1) : *src);
  }
  for (const auto& [k, t] : by_key)
    if (!known.count(k)) unexpected.push_back(k);
  EMBER_CHECK(mismatched.empty(), ShapeError, who, ": ", source, " does not fit this model (vocab_size ",
              cfg_.vocab_size, ", n_positions ", cfg_.block_size, ", n_embd ", cfg_.n_embd, ", n_layer ",
              cfg_.n_layer, "): ", d::join(mismatched));
  EMBER_CHECK(missing.empty() && unexpected.empty(), ValueError, who, ": ", source, " is not this GPT-2's ",
              "GPT2LMHeadModel state", missing.empty() ? "" : ": missing " + d::join(missing),
              unexpected.empty() ? "" : "; unexpected " + d::join(unexpected));
  if (lm_head) {
    const AnyTensor* wte_src = find("wte.weight");
    EMBER_CHECK(d::same_bytes(*lm_head, *wte_src), ValueError, who, ": ", source, ": lm_head.weight ",
                lm_head->desc(), " differs from transformer.wte.weight ", wte_src->desc(),
                "; nn::GPT's LM head is wte.weight itself (untied heads are not supported)");
  }
  load_state_dict(sd);
}

inline void GPT::load_huggingface(const std::filesystem::path& dir_or_file) {
  const char* who = "GPT::load_huggingface";
  const gpt_hf_detail::HFFiles f = gpt_hf_detail::resolve(dir_or_file, who);
  const GPTConfig c = config_from_huggingface(gpt_hf_detail::read_json(f.config, who), f.config.string(),
                                              {.dropout = cfg_.dropout});
  const int64_t inner = gpt_hf_detail::mlp_width(cfg_.n_inner, cfg_.n_embd);
  const int64_t c_inner = gpt_hf_detail::mlp_width(c.n_inner, c.n_embd);
  EMBER_CHECK(c.vocab_size == cfg_.vocab_size && c.block_size == cfg_.block_size && c.n_layer == cfg_.n_layer &&
                  c.n_head == cfg_.n_head && c.n_embd == cfg_.n_embd && c_inner == inner &&
                  c.layer_norm_eps == cfg_.layer_norm_eps,
              ValueError, who, ": ", f.config.string(), " describes vocab_size ", c.vocab_size, ", n_positions ",
              c.block_size, ", n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd, ", n_inner ",
              c_inner, ", layer_norm_epsilon ", c.layer_norm_eps, "; this model has ", cfg_.vocab_size, ", ",
              cfg_.block_size, ", ", cfg_.n_layer, ", ", cfg_.n_head, ", ", cfg_.n_embd, ", ", inner, ", ",
              cfg_.layer_norm_eps, " (GPT::from_huggingface makes a model from the file's config)");
  io::TensorList all;
  for (const auto& w : f.weights)
    for (auto& e : io::load_file(w)) all.push_back(std::move(e));
  const std::string source = f.weights.size() == 1 ? "'" + f.weights[0].string() + "'"
                                                   : "the shards of '" + f.weights[0].parent_path().string() + "'";
  load_huggingface_state_dict(all, source);
}

inline std::shared_ptr<GPT> GPT::from_huggingface(const std::filesystem::path& dir_or_file,
                                                  const HuggingFaceOptions& options) {
  const char* who = "GPT::from_huggingface";
  const gpt_hf_detail::HFFiles f = gpt_hf_detail::resolve(dir_or_file, who);
  const GPTConfig c = config_from_huggingface(gpt_hf_detail::read_json(f.config, who), f.config.string(), options);
  std::shared_ptr<GPT> gpt;
  {
    // Every parameter is loaded next (strictly: a file lacking one is an error and the model is
    // dropped), so no initialisation: no time spent drawing it, the caller's generator untouched.
    init::SkipInitGuard no_init;
    gpt = std::make_shared<GPT>(c);
  }
  gpt->load_huggingface(dir_or_file);
  gpt->eval();  // as transformers' from_pretrained: dropout off until train()
  return gpt;
}

inline void GPT::save_huggingface(const std::filesystem::path& dir) const {
  const io::TensorList tensors = huggingface_state_dict();  // refuses a model HF cannot hold, first
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  EMBER_CHECK(!ec, IOError, "GPT::save_huggingface: cannot make the folder '", dir.string(), "': ", ec.message());
  io::save_file(dir / "model.safetensors", tensors, {{"format", "pt"}});
  io::write_file_atomic(dir / "config.json", huggingface_config().dump(2) + "\n");
}

}  // namespace ember::nn
