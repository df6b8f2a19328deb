#pragma once
// io::gguf::export_gpt: an nn::GPT to a GGUF file in llama.cpp's `gpt2` architecture, in F32, F16
// or Q8_0 (the GGUF format: io/gguf.hpp and io/gguf_format.hpp; the whole mapping: docs/gguf.md).
//
//   io::gguf::export_gpt(gpt, "model.gguf");                                        // F32
//   io::gguf::export_gpt(gpt, "model-q8_0.gguf", {.type = io::gguf::GGMLType::Q8_0, .name = "my-gpt"});
//
// Names and layouts are those of llama.cpp's gpt2 loader (src/models/gpt2.cpp) and gguf-py's
// tensor names. ember's Linear and attention weights are [out, in] row-major, which is what
// llama.cpp wants (ne = {in, out}); Hugging Face's Conv1D weights are [in, out], which is why
// llama.cpp's converter transposes them and ember does not:
//   wte.weight [V, E]                  -> token_embd.weight       ne {E, V}
//   wpe.weight [B, E]                  -> position_embd.weight    ne {E, B}
//   h.i.ln_1.{weight,bias} [E]         -> blk.i.attn_norm.{weight,bias}
//   h.i.attn.in_proj_weight [3E, E]    -> blk.i.attn_qkv.weight   ne {E, 3E}  (q, k, v rows in that order)
//   h.i.attn.in_proj_bias [3E]         -> blk.i.attn_qkv.bias
//   h.i.attn.out_proj.{weight,bias}    -> blk.i.attn_output.{weight,bias}     ne {E, E}
//   h.i.ln_2.{weight,bias}             -> blk.i.ffn_norm.{weight,bias}
//   h.i.mlp.c_fc.{weight,bias} [F, E]  -> blk.i.ffn_up.{weight,bias}          ne {E, F}
//   h.i.mlp.c_proj.{weight,bias} [E, F]-> blk.i.ffn_down.{weight,bias}        ne {F, E}
//   ln_f.{weight,bias}                 -> output_norm.{weight,bias}
// No output.weight: the head is wte.weight, and llama.cpp uses token_embd.weight when output.weight
// is absent. A model built with bias = false gets zero biases, since llama.cpp's gpt2 requires
// them (a zero bias computes what no bias does).
//
// Types follow llama.cpp's converter (convert_hf_to_gguf.py, ModelBase.prepare_tensors): 1-D
// tensors (norms, biases) and position_embd stay F32; the 2-D weights get `type`; a Q8_0 matrix
// whose rows are no multiple of 32 falls back to q8_0_fallback (F16, as the converter does).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ember/io/gguf.hpp"
#include "ember/nn/gpt.hpp"

namespace ember::io::gguf {

// A GPT-2 BPE tokenizer section (what llama.cpp needs to turn text into ids; ember has no
// tokenizer of its own, so this comes from the caller, e.g. Hugging Face's vocab.json and merges.txt).
struct GPTTokenizer {
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens: the text of every id, vocab_size of them
  std::vector<std::string> merges;   // tokenizer.ggml.merges: "a b" merge rules by rank
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (1 normal, 3 control); empty: all 1
  std::string pre = "gpt-2";         // tokenizer.ggml.pre: llama.cpp's pre-tokenizer for GPT-2
  std::optional<uint32_t> bos_id, eos_id;  // GPT-2: 50256 for both
};

struct GPTExportOptions {
  GGMLType type = GGMLType::F32;            // of the 2-D weights: F32, F16 or Q8_0
  GGMLType q8_0_fallback = GGMLType::F16;   // rows no multiple of 32 under Q8_0: F16 or F32
  std::string name = "ember-gpt";           // general.name
  uint32_t alignment = kDefaultAlignment;   // general.alignment, a power of two
  // Without a tokenizer the file says tokenizer.ggml.model = "none" and gpt2.vocab_size, which
  // lets llama.cpp load the model and run it on token ids (it cannot tokenize text then).
  std::optional<GPTTokenizer> tokenizer;
  KeyValues metadata;                       // more keys, written after ember's (a repeated key is an error)
};

struct GPTExportResult {
  uint64_t file_bytes = 0;
  KeyValues metadata;
  std::vector<TensorInfo> tensors;  // with their types and offsets
};

// Everything export_gpt writes, as a Writer that holds the model's tensors (converted when it
// writes). Checks the model and the options first: a parameter whose shape is not what the
// config and llama.cpp's gpt2 say is a ShapeError naming it.
inline Writer gpt_writer(const nn::GPT& model, const GPTExportOptions& o = {}) {
  const std::string who = "io::gguf::export_gpt";
  EMBER_CHECK(o.type == GGMLType::F32 || o.type == GGMLType::F16 || o.type == GGMLType::Q8_0, ValueError, who,
              ": type must be F32, F16 or Q8_0, got ", type_name(o.type));
  EMBER_CHECK(o.q8_0_fallback == GGMLType::F32 || o.q8_0_fallback == GGMLType::F16, ValueError, who,
              ": q8_0_fallback must be F32 or F16, got ", type_name(o.q8_0_fallback));
  const nn::GPTConfig& c = model.config();
  const int64_t V = c.vocab_size, B = c.block_size, E = c.n_embd, L = c.n_layer;
  const int64_t F = c.n_inner > 0 ? c.n_inner : 4 * E;
  auto u32 = [&](const char* key, int64_t v) {
    EMBER_CHECK(v >= 0 && v <= int64_t{0xffffffff}, ValueError, who, ": ", key, " = ", v, " does not fit GGUF's uint32");
    return Value::of(static_cast<uint32_t>(v));
  };
  EMBER_CHECK(static_cast<int64_t>(model.blocks().size()) == L, ValueError, who, ": the model has ", model.blocks().size(),
              " blocks, its config n_layer ", L);

  Writer w;
  w.add("general.architecture", Value::string("gpt2"));
  w.add("general.name", Value::string(o.name));
  w.add("general.alignment", Value::of(o.alignment));  // the writer checks it is a power of two
  w.add("gpt2.context_length", u32("block_size", B));
  w.add("gpt2.embedding_length", u32("n_embd", E));
  w.add("gpt2.feed_forward_length", u32("n_inner", F));
  w.add("gpt2.block_count", u32("n_layer", L));
  w.add("gpt2.attention.head_count", u32("n_head", c.n_head));
  w.add("gpt2.attention.layer_norm_epsilon", Value::of(static_cast<float>(c.layer_norm_eps)));
  // llama_ftype: ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q8_0 = 7.
  w.add("general.file_type", Value::of(uint32_t{o.type == GGMLType::F32 ? 0u : o.type == GGMLType::F16 ? 1u : 7u}));
  w.add("general.quantization_version", Value::of(kQuantizationVersion));
  w.add("gpt2.vocab_size", u32("vocab_size", V));
  if (!o.tokenizer) {
    w.add("tokenizer.ggml.model", Value::string("none"));
  } else {
    const GPTTokenizer& t = *o.tokenizer;
    EMBER_CHECK(static_cast<int64_t>(t.tokens.size()) == V, ValueError, who, ": the tokenizer has ", t.tokens.size(),
                " tokens, the model's vocab_size is ", V);
    EMBER_CHECK(t.token_types.empty() || t.token_types.size() == t.tokens.size(), ValueError, who, ": ",
                t.token_types.size(), " token types for ", t.tokens.size(), " tokens");
    for (const auto* id : {&t.bos_id, &t.eos_id})
      EMBER_CHECK(!*id || static_cast<int64_t>(**id) < V, ValueError, who, ": special token id ", id->value_or(0),
                  " is outside the vocabulary of ", V);
    w.add("tokenizer.ggml.model", Value::string("gpt2"));
    w.add("tokenizer.ggml.pre", Value::string(t.pre));
    w.add("tokenizer.ggml.tokens", Value::array(t.tokens));
    w.add("tokenizer.ggml.token_type",
          Value::array(t.token_types.empty() ? std::vector<int32_t>(t.tokens.size(), 1) : t.token_types));
    w.add("tokenizer.ggml.merges", Value::array(t.merges));
    if (t.bos_id) w.add("tokenizer.ggml.bos_token_id", Value::of(*t.bos_id));
    if (t.eos_id) w.add("tokenizer.ggml.eos_token_id", Value::of(*t.eos_id));
  }
  for (const auto& kv : o.metadata) w.add(kv.key, kv.value);

  auto shape_text = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  };
  // One tensor: checked against the shape llama.cpp's gpt2 needs, with the converter's type.
  auto put = [&](const std::string& gguf_name, const std::string& ember_name, const AnyTensor& t,
                 const std::vector<int64_t>& want, bool is_bias = false) {
    AnyTensor x = t;
    if (!x.defined() && is_bias && !c.bias) x = AnyTensor::zeros(Shape(want), DType::Float32);
    EMBER_CHECK(x.defined(), ValueError, who, ": ", ember_name, " is undefined; llama.cpp's gpt2 needs ", gguf_name);
    EMBER_CHECK(is_floating(x.dtype()), DTypeError, who, ": ", ember_name, " is ", x.desc(), "; GGUF weights are floating");
    EMBER_CHECK(x.shape().vec() == want, ShapeError, who, ": ", ember_name, " is ", x.desc(), ", but ", gguf_name,
                " must be ", shape_text(want), " (vocab_size ", V, ", block_size ", B, ", n_embd ", E, ", n_inner ", F,
                "): this is not GPT-2's layout");
    GGMLType type = GGMLType::F32;
    if (want.size() == 2 && gguf_name != "position_embd.weight")
      type = o.type == GGMLType::Q8_0 && want[1] % kQ8_0Block != 0 ? o.q8_0_fallback : o.type;
    add_tensor(w, gguf_name, x, type);
  };
  put("token_embd.weight", "wte.weight", model.wte->weight, {V, E});
  put("position_embd.weight", "wpe.weight", model.wpe->weight, {B, E});
  for (int64_t i = 0; i < L; ++i) {
    const nn::TransformerBlock& b = *model.blocks()[static_cast<size_t>(i)];
    const std::string g = "blk." + std::to_string(i) + ".", e = "h." + std::to_string(i) + ".";
    put(g + "attn_norm.weight", e + "ln_1.weight", b.ln_1->weight, {E});
    put(g + "attn_norm.bias", e + "ln_1.bias", b.ln_1->bias, {E}, true);
    put(g + "attn_qkv.weight", e + "attn.in_proj_weight", b.attn->in_proj_weight, {3 * E, E});
    put(g + "attn_qkv.bias", e + "attn.in_proj_bias", b.attn->in_proj_bias, {3 * E}, true);
    put(g + "attn_output.weight", e + "attn.out_proj.weight", b.attn->out_proj->weight, {E, E});
    put(g + "attn_output.bias", e + "attn.out_proj.bias", b.attn->out_proj->bias, {E}, true);
    put(g + "ffn_norm.weight", e + "ln_2.weight", b.ln_2->weight, {E});
    put(g + "ffn_norm.bias", e + "ln_2.bias", b.ln_2->bias, {E}, true);
    put(g + "ffn_up.weight", e + "mlp.c_fc.weight", b.mlp->c_fc->weight, {F, E});
    put(g + "ffn_up.bias", e + "mlp.c_fc.bias", b.mlp->c_fc->bias, {F}, true);
    put(g + "ffn_down.weight", e + "mlp.c_proj.weight", b.mlp->c_proj->weight, {E, F});
    put(g + "ffn_down.bias", e + "mlp.c_proj.bias", b.mlp->c_proj->bias, {E}, true);
  }
  put("output_norm.weight", "ln_f.weight", model.ln_f->weight, {E});
  put("output_norm.bias", "ln_f.bias", model.ln_f->bias, {E}, true);
  return w;
}

// Writes the model atomically (io/atomic_file.hpp): on any error the previous file stays as it was.
inline GPTExportResult export_gpt(const nn::GPT& model, const std::filesystem::path& path,
                                  const GPTExportOptions& options = {}) {
  const Writer w = gpt_writer(model, options);
  w.write(path);
  return {w.file_size(), w.metadata(), w.tensors()};
}

}  // namespace ember::io::gguf
