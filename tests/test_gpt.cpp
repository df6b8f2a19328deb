// nn::GPT (nn/gpt.hpp): its names and tied head, the KV cache (nn::KVCache in nn/attention.hpp,
// TransformerBlock, GPTCache), generate() and the sampler (nn/sampling.hpp), InferenceModeGuard
// (autograd/grad_mode.hpp), and the Hugging Face GPT-2 round trip against the fixture that
// tests/interop/make_gpt2_fixture.py made with transformers (tests/interop/gpt2_tiny/).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "ember/ember.hpp"
#include "ember/nn/gpt.hpp"
#include "gradcheck.hpp"
#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using ember::testing::same_bytes;
namespace fs = std::filesystem;

namespace {

// The fixture folder, found from this file's own path (CMake compiles it by its absolute path),
// so that the test needs no build-time definition.
fs::path fixture_dir() { return fs::path(__FILE__).parent_path() / "interop" / "gpt2_tiny"; }

nn::GPTConfig tiny_config() {
  return {.vocab_size = 64, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32};
}

double max_abs_diff(const AnyTensor& a, const AnyTensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// Random token ids [N, L] in [0, vocab).
Tensor<int64_t> random_ids(int64_t N, int64_t L, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> u = Tensor<double>::rand({N * L}, Device::cpu(), 0.0, static_cast<double>(vocab), gen).to_vector();
  std::vector<int64_t> ids;
  for (double v : u) ids.push_back(std::min<int64_t>(static_cast<int64_t>(v), vocab - 1));
  return Tensor<int64_t>::from_vector(ids, {N, L});
}

// Columns [b, e) of x [N, L, ...] as a tensor [N, e - b, ...] (slice() cuts the leading dimension only).
template <Element T>
Tensor<T> columns(const Tensor<T>& x, int64_t b, int64_t e) {
  return index_select(x, 1, Tensor<int64_t>::arange(static_cast<double>(b), static_cast<double>(e)));
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// A copy of the fixture folder with config.json edited by `edit` (nlohmann JSON).
template <class F>
void copy_fixture(const fs::path& to, F&& edit) {
  fs::create_directories(to);
  fs::copy_file(fixture_dir() / "model.safetensors", to / "model.safetensors", fs::copy_options::overwrite_existing);
  std::ifstream in(fixture_dir() / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  write_text(to / "config.json", j.dump(2));
}

}  // namespace

// ------------------------------------------------------------------------------------------ model

TEST_CASE("GPT: state-dict names, the head tied as one parameter, GPT-2 initialisation", "[gpt][model]") {
  manual_seed(3);
  nn::GPT gpt({.vocab_size = 50, .block_size = 16, .n_layer = 3, .n_head = 4, .n_embd = 64});
  const auto named = gpt.named_parameters();
  std::vector<std::string> names;
  for (const auto& [n, p] : named) names.push_back(n);
  const std::vector<std::string> block = {"ln_1.weight", "ln_1.bias", "attn.in_proj_weight", "attn.in_proj_bias",
                                          "attn.out_proj.weight", "attn.out_proj.bias", "ln_2.weight", "ln_2.bias",
                                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
  std::vector<std::string> want = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < 3; ++i)
    for (const auto& b : block) want.push_back("h." + std::to_string(i) + "." + b);
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");
  CHECK(names == want);
  const auto sd = gpt.state_dict();
  REQUIRE(sd.size() == want.size());  // no buffers, no lm_head entry
  // The head is wte.weight itself: no other parameter shares its storage (nor any two others).
  CHECK(gpt.lm_head_weight().same(gpt.wte->weight));
  std::set<const void*> storages;
  for (const auto& [n, p] : named) storages.insert(p.impl()->storage.get());
  CHECK(storages.size() == named.size());
  CHECK(gpt.parameter_count() == 50 * 64 + 16 * 64 + 3 * (4 * 64 + 4 * 64 * 64 + 4 * 64 + 8 * 64 * 64 + 5 * 64) + 2 * 64);
  CHECK(gpt.blocks().size() == 3);
  CHECK(&gpt.h->operator[](1) == gpt.blocks()[1].get());

  // nanoGPT's init: N(0, 0.02); the residual projections N(0, 0.02 / sqrt(2 n_layer)).
  auto sample_std = [](const AnyTensor& t) {
    const std::vector<double> v = t.to_double_vector();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double m = s / static_cast<double>(v.size());
    return std::sqrt(s2 / static_cast<double>(v.size()) - m * m);
  };
  const double proj = 0.02 / std::sqrt(6.0);
  CHECK(sample_std(gpt.wte->weight) == Approx(0.02).epsilon(0.05));
  CHECK(sample_std(gpt.wpe->weight) == Approx(0.02).epsilon(0.1));
  for (const auto& b : gpt.blocks()) {
    CHECK(sample_std(b->attn->in_proj_weight) == Approx(0.02).epsilon(0.05));
    CHECK(sample_std(b->mlp->c_fc->weight) == Approx(0.02).epsilon(0.05));
    CHECK(sample_std(b->attn->out_proj->weight) == Approx(proj).epsilon(0.05));
    CHECK(sample_std(b->mlp->c_proj->weight) == Approx(proj).epsilon(0.05));
    for (const AnyTensor* z : {&b->attn->in_proj_bias, &b->attn->out_proj->bias, &b->mlp->c_fc->bias,
                               &b->mlp->c_proj->bias, &b->ln_1->bias})
      CHECK(Tensor<float>(*z).to_vector() == std::vector<float>(static_cast<size_t>(z->numel()), 0.0f));
    CHECK(Tensor<float>(b->ln_2->weight).to_vector() == std::vector<float>(64, 1.0f));
  }
  // Seeded: the same seed, the same model.
  manual_seed(3);
  nn::GPT again({.vocab_size = 50, .block_size = 16, .n_layer = 3, .n_head = 4, .n_embd = 64});
  CHECK(same_bytes(again.h->named_parameters()[4].second, gpt.h->named_parameters()[4].second));
}

TEST_CASE("GPT: forward is embeddings, the blocks, ln_f and wte.weight^T, int32 ids too", "[gpt][model]") {
  manual_seed(5);
  nn::GPT gpt(tiny_config());
  const auto ids = random_ids(2, 7, 64, 1);
  const Tensor<float> logits = gpt(ids);
  REQUIRE(logits.shape() == (Shape{2, 7, 64}));
  // The same computation written out with the public modules (same ops, so the same bits).
  auto pos = Tensor<int64_t>::arange(0.0, 7.0);
  Tensor<float> x(op::add(gpt.wte->lookup(ids), gpt.wpe->lookup(pos)));
  for (const auto& b : gpt.blocks()) x = (*b)(x);
  const Tensor<float> want = matmul((*gpt.ln_f)(x), Tensor<float>(gpt.wte->weight), false, true);
  CHECK(max_abs_diff(logits, want) < 1e-6);
  // int32 ids, the untyped entry (as inside a Sequential) and hidden() + head() agree.
  CHECK(same_bytes(gpt(Tensor<int32_t>(ids.to(DType::Int32))), logits));
  CHECK(same_bytes(gpt.forward_any(ids), logits));
  CHECK(same_bytes(gpt.head(gpt.hidden(ids)), logits));
  // A position is not seen by the positions before it (causal), and the positions matter.
  auto ids2 = Tensor<int64_t>::from_vector(ids.to_vector(), {2, 7});
  ids2.data()[6] = (ids2.data()[6] + 1) % 64;
  const Tensor<float> l2 = gpt(ids2);
  CHECK(max_abs_diff(columns(l2, 0, 6), columns(logits, 0, 6)) == 0.0);
  CHECK(max_abs_diff(columns(l2, 6, 7), columns(logits, 6, 7)) > 1e-4);
}

TEST_CASE("GPT: gradients in double reach every parameter, the tied wte.weight gets both uses (finite differences)",
          "[gpt][model][grad]") {
  manual_seed(11);
  nn::GPT gpt({.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8});
  gpt.to(DType::Float64);
  const auto ids = random_ids(2, 5, 11, 2);
  auto r = testing::gradcheck([&](const std::vector<AnyTensor>&) { return AnyTensor(gpt.forward<double>(ids)); }, {},
                              gpt.parameters());
  INFO(r.report);
  CHECK(r.ok);
  CHECK(r.checked == gpt.parameter_count());
  // The same through the cache: three positions, then two more that read the first three's keys
  // and values from it (under grad mode the cache keeps their graph).
  auto cached = [&](const std::vector<AnyTensor>&) {
    nn::GPTCache cache;
    Tensor<double> a = gpt.forward<double>(columns(ids, 0, 3), cache);
    Tensor<double> b = gpt.forward<double>(columns(ids, 3, 5), cache);
    return AnyTensor(concat(std::vector<Tensor<double>>{a, b}, 1));
  };
  auto rc = testing::gradcheck(cached, {}, gpt.parameters());
  INFO(rc.report);
  CHECK(rc.ok);
}

TEST_CASE("GPT: bfloat16 and float16 activations with fp32 parameters", "[gpt][model][precision]") {
  manual_seed(7);
  nn::GPT gpt(tiny_config());
  const auto ids = random_ids(2, 9, 64, 3);
  const Tensor<float> ref = gpt(ids);
  const Tensor<bfloat16> lb = gpt.forward<bfloat16>(ids);
  const Tensor<half> lh = gpt.forward<half>(ids);
  CHECK(lb.dtype() == DType::BFloat16);
  CHECK(lh.dtype() == DType::Float16);
  CHECK(max_abs_diff(lb, ref) < 0.05);
  CHECK(max_abs_diff(lh, ref) < 0.01);
  CHECK(gpt.wte->weight.dtype() == DType::Float32);
}

TEST_CASE("GPT: a few AdamW steps on one batch lower the loss (the tied weight is stepped once)", "[gpt][model][train]") {
  manual_seed(1);
  nn::GPT gpt({.vocab_size = 16, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32});
  optim::AdamW opt(gpt.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  const auto x = random_ids(4, 12, 16, 4), y = random_ids(4, 12, 16, 5);
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    opt.zero_grad();
    auto loss = nn::functional::cross_entropy(gpt(x).reshape({-1, 16}), y.reshape({-1}));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("GPT: bad configurations and inputs raise errors naming GPT, the shapes and dtypes", "[gpt][model][errors]") {
  CHECK_THROWS_WITH(nn::GPT({.n_head = 4, .n_embd = 30}), Catch::Contains("n_embd 30 must be divisible by n_head 4"));
  CHECK_THROWS_AS(nn::GPT({.vocab_size = 0}), ValueError);
  CHECK_THROWS_AS(nn::GPT({.n_layer = -1}), ValueError);
  CHECK_THROWS_WITH(nn::GPT({.vocab_size = 8, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4, .dropout = 1.5}),
                    Catch::Contains("dropout probability"));
  CHECK_THROWS_AS(nn::GPT({.vocab_size = 8, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4,
                           .dtype = DType::Int64}),
                  DTypeError);
  nn::GPT gpt(tiny_config());
  CHECK_THROWS_WITH(gpt(Tensor<float>::zeros({2, 3})), Catch::Contains("GPT: ids must be int64 or int32") &&
                                                           Catch::Contains("float32[2, 3]"));
  CHECK_THROWS_AS(gpt.forward_any(Tensor<float>::zeros({2, 3})), DTypeError);
  CHECK_THROWS_WITH(gpt(Tensor<uint8_t>::zeros({2, 3})), Catch::Contains("uint8[2, 3]"));
  CHECK_THROWS_WITH(gpt(Tensor<int64_t>::zeros({6})), Catch::Contains("GPT: ids must be [N, L]") &&
                                                         Catch::Contains("int64[6]"));
  CHECK_THROWS_AS(gpt(Tensor<int64_t>::zeros({2, 0})), ShapeError);
  CHECK_THROWS_WITH(gpt(Tensor<int64_t>::zeros({1, 33})), Catch::Contains("33 positions exceed block_size 32"));
  CHECK_THROWS_AS(gpt(Tensor<int64_t>::full({1, 3}, 64.0)), IndexError);  // the embedding's range check
  CHECK_THROWS_WITH(gpt.head(Tensor<float>::zeros({2, 31})), Catch::Contains("must end in n_embd 32"));
}

// ---------------------------------------------------------------------------------------- KV cache

TEST_CASE("KV cache: incremental decoding gives the full forward's logits (fp32 to 1e-6, fp64 to 1e-12)",
          "[gpt][kvcache]") {
  const auto ids = random_ids(2, 24, 64, 8);
  // Steps of 7 (a prefill), then 1, 1, 4 (several new positions after cached ones: the causal
  // mask is then bottom-right aligned), then 1 until the end.
  const std::vector<int64_t> steps = {7, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  // max |cached - full| and max |full| over all 2 x 24 x 64 logits.
  auto run = [&](nn::GPT& gpt, auto tag) {
    using T = decltype(tag);
    const Tensor<T> full = gpt.forward<T>(ids);
    nn::GPTCache cache;
    std::vector<Tensor<T>> parts;
    int64_t at = 0;
    for (int64_t n : steps) {
      parts.push_back(gpt.forward<T>(columns(ids, at, at + n), cache));
      at += n;
      CHECK(cache.length() == at);
    }
    REQUIRE(at == 24);
    return std::make_pair(max_abs_diff(concat(parts, 1), full), max_abs_diff(full, Tensor<T>::zeros(full.shape())));
  };
  // GPT-2's initialisation: logits of order 0.1, where 1e-6 is many float32 ulps.
  manual_seed(8);
  nn::GPT init(tiny_config());
  const auto [d_init, s_init] = run(init, float{});
  std::printf("KV cache, fp32, GPT-2 init: max |cached - full| = %.3g (max |logit| %.3g)\n", d_init, s_init);
  CHECK(d_init <= 1e-6);
  // transformers' fixture weights: logits up to ~10, where one float32 ulp is ~1e-6; the bound
  // is relative to the largest logit there (rounding differs between GEMMs of 1 and of L rows).
  auto hf = nn::GPT::from_huggingface(fixture_dir());
  const auto [d_hf, s_hf] = run(*hf, float{});
  std::printf("KV cache, fp32, fixture weights: max |cached - full| = %.3g (max |logit| %.3g, relative %.3g)\n", d_hf,
              s_hf, d_hf / s_hf);
  CHECK(s_hf > 1.0);
  CHECK(d_hf <= 1e-6 * s_hf);
  hf->to(DType::Float64);
  const auto [d64, s64] = run(*hf, double{});
  std::printf("KV cache, fp64, fixture weights: max |cached - full| = %.3g\n", d64);
  CHECK(d64 <= 1e-12);
}

TEST_CASE("KV cache: MultiheadAttention with a padding mask, sequence-first layout, unbatched input", "[gpt][kvcache]") {
  manual_seed(2);
  for (bool batch_first : {true, false}) {
    nn::MultiheadAttention attn(12, 3, {.batch_first = batch_first, .dtype = DType::Float64});
    const int64_t N = 2, L = 6;
    auto x = Tensor<double>::randn(batch_first ? Shape{N, L, 12} : Shape{L, N, 12});
    // The second sequence may not attend to its first position (left padding).
    auto pad = Tensor<uint8_t>::from_vector({0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, {N, L});
    const Tensor<double> full = attn.forward(x, {.key_padding_mask = pad, .is_causal = true});
    nn::KVCache cache;
    std::vector<Tensor<double>> outs;
    for (int64_t t = 0; t < L; t += 2) {
      auto idx = Tensor<int64_t>::arange(static_cast<double>(t), static_cast<double>(t + 2));
      auto xt = index_select(x, batch_first ? 1 : 0, idx);
      auto pad_t = index_select(pad, 1, Tensor<int64_t>::arange(0.0, static_cast<double>(t + 2)));
      outs.push_back(attn.forward(xt, cache, {.key_padding_mask = pad_t, .is_causal = true}));
    }
    CHECK(cache.length() == L);
    CHECK(cache.key.shape() == (Shape{N, 3, L, 4}));
    CHECK(max_abs_diff(concat(outs, batch_first ? 1 : 0), full) < 1e-13);
  }
  // Unbatched [L, E]: the cache holds a batch of one.
  nn::MultiheadAttention attn(8, 2);
  auto x = Tensor<float>::randn({5, 8});
  const Tensor<float> full = attn.forward(x, {.is_causal = true});
  nn::KVCache cache;
  auto a = attn.forward(Tensor<float>(x.slice(0, 3)), cache, {.is_causal = true});
  auto b = attn.forward(Tensor<float>(x.slice(3, 5)), cache, {.is_causal = true});
  CHECK(max_abs_diff(concat(std::vector<Tensor<float>>{a, b}, 0), full) < 1e-6);
  // Without is_causal, a cached call sees all keys, the earlier and its own.
  nn::KVCache c2;
  attn.forward(Tensor<float>(x.slice(0, 3)), c2);
  auto all = attn.forward(Tensor<float>(x.slice(3, 5)), c2);
  CHECK(max_abs_diff(all, Tensor<float>(attn.forward(x).slice(3, 5))) < 1e-6);
}

TEST_CASE("KV cache: a cache of another batch, dtype, model or length is refused", "[gpt][kvcache][errors]") {
  manual_seed(4);
  nn::MultiheadAttention attn(8, 2);
  nn::KVCache cache;
  attn.forward(Tensor<float>::randn({2, 3, 8}), cache);
  CHECK_THROWS_WITH(attn.forward(Tensor<float>::randn({3, 1, 8}), cache),
                    Catch::Contains("MultiheadAttention(8, 2): the KV cache holds keys float32[2, 2, 3, 4]") &&
                        Catch::Contains("float32[3, 1, 8]"));
  CHECK_THROWS_AS(attn.forward(Tensor<double>::randn({2, 1, 8}), cache), DTypeError);
  nn::MultiheadAttention other(8, 4);
  CHECK_THROWS_AS(other.forward(Tensor<float>::randn({2, 1, 8}), cache), ShapeError);
  nn::KVCache broken;
  broken.key = broken.value = Tensor<float>::zeros({2, 3});
  CHECK_THROWS_WITH(attn.forward(Tensor<float>::randn({2, 1, 8}), broken),
                    Catch::Contains("the KV cache's key float32[2, 3] on cpu") &&
                        Catch::Contains("must both be [N, num_heads, S, head_dim]"));
  // A mask must span the cached keys too.
  CHECK_THROWS_WITH(attn.forward(Tensor<float>::randn({2, 1, 8}), cache,
                                 {.key_padding_mask = Tensor<uint8_t>::zeros({2, 1})}),
                    Catch::Contains("key_padding_mask uint8[2, 1]") && Catch::Contains("must be [N, S] = [2, 4]"));
  nn::GPT gpt(tiny_config());
  nn::GPTCache gc;
  gpt.forward(Tensor<int64_t>::zeros({2, 30}), gc);
  CHECK_THROWS_WITH(gpt.forward(Tensor<int64_t>::zeros({2, 3}), gc),
                    Catch::Contains("the cache's 30 positions + ids int64[2, 3]") &&
                        Catch::Contains("33 positions exceed block_size 32"));
  CHECK_THROWS_WITH(gpt.forward(Tensor<int64_t>::zeros({1, 1}), gc), Catch::Contains("the cache holds 2 sequences"));
  nn::GPT deeper({.vocab_size = 64, .block_size = 32, .n_layer = 3, .n_head = 2, .n_embd = 32});
  CHECK_THROWS_WITH(deeper.forward(Tensor<int64_t>::zeros({2, 1}), gc), Catch::Contains("the cache has 2 layers"));
  gc.clear();
  CHECK(gc.length() == 0);
  CHECK_NOTHROW(gpt.forward(Tensor<int64_t>::zeros({1, 32}), gc));
}

// ---------------------------------------------------------------------------------------- generate

TEST_CASE("generate: greedy is the argmax of full forwards, with or without the cache", "[gpt][generate]") {
  manual_seed(9);
  nn::GPT gpt(tiny_config());
  const auto prompt = random_ids(3, 5, 64, 10);
  const auto out = gpt.generate(prompt, {.max_new_tokens = 10, .temperature = 0.0});
  REQUIRE(out.shape() == (Shape{3, 15}));
  // The reference: the whole sequence each step, the argmax of the last position.
  Tensor<int64_t> seq = prompt;
  for (int step = 0; step < 10; ++step) {
    NoGradGuard no_grad;
    const Tensor<float> logits = gpt(seq);
    const Tensor<int64_t> last = argmax(Tensor<float>(columns(logits, seq.shape()[1] - 1, seq.shape()[1]).reshape({3, 64})), {1});
    seq = concat(std::vector<Tensor<int64_t>>{seq, last.reshape({3, 1})}, 1);
  }
  CHECK(out.to_vector() == seq.to_vector());
  CHECK(gpt.generate(prompt, {.max_new_tokens = 10, .temperature = 0.0, .use_cache = false}).to_vector() ==
        seq.to_vector());
  // Greedy draws nothing from the default generator.
  const auto before = default_generator().state();
  gpt.generate(prompt, {.max_new_tokens = 3, .temperature = 0.0});
  CHECK(default_generator().state() == before);
  // max_new_tokens = 0 is the prompt; the output never records a graph.
  CHECK(gpt.generate(prompt, {.max_new_tokens = 0}).to_vector() == prompt.to_vector());
  CHECK_FALSE(out.requires_grad());
}

TEST_CASE("generate: a seed repeats the same tokens, another seed gives others, no seed draws from the default generator",
          "[gpt][generate]") {
  manual_seed(12);
  nn::GPT gpt(tiny_config());
  const auto prompt = random_ids(2, 4, 64, 13);
  const nn::GenerateOptions o{.max_new_tokens = 20, .temperature = 1.5, .seed = 42};
  const auto a = gpt.generate(prompt, o).to_vector();
  const auto b = gpt.generate(prompt, o).to_vector();
  CHECK(a == b);
  nn::GenerateOptions o2 = o;
  o2.seed = 43;
  CHECK(gpt.generate(prompt, o2).to_vector() != a);
  o2.use_cache = false;  // the same draws and (to rounding, far from any boundary) the same tokens
  o2.seed = 42;
  CHECK(gpt.generate(prompt, o2).to_vector() == a);
  // Without a seed: the thread's default generator, which advances (two calls differ), and which
  // a GeneratorScope can supply (the same state, the same tokens).
  nn::GenerateOptions unseeded = o;
  unseeded.seed.reset();
  Generator g1(42);
  std::vector<int64_t> c;
  {
    GeneratorScope use(g1);
    c = gpt.generate(prompt, unseeded).to_vector();
    CHECK(gpt.generate(prompt, unseeded).to_vector() != c);
  }
  CHECK(c == a);  // Generator(42) as the default generator draws what seed = 42 draws
  // A model left in training mode with dropout draws its masks from the same generator: seeded,
  // it repeats too.
  nn::GPT noisy({.vocab_size = 64, .block_size = 32, .n_layer = 2, .n_head = 2, .n_embd = 32, .dropout = 0.2});
  CHECK(noisy.is_training());
  CHECK(noisy.generate(prompt, o).to_vector() == noisy.generate(prompt, o).to_vector());
}

TEST_CASE("sampling: top-k and top-p keep exactly the documented candidates, draws follow the probabilities",
          "[gpt][generate][sampling]") {
  // Logits whose softmax is 0.5, 0.3, 0.15, 0.05 (shuffled positions, one far below).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), -1e30f, std::log(0.05f), std::log(0.3f)};
  auto probs = [&](nn::SamplingOptions o) { return nn::sampling_probabilities(logits.data(), 5, o); };
  auto support = [&](const std::vector<double>& p) {
    std::vector<int> s;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0) s.push_back(static_cast<int>(i));
    return s;
  };
  CHECK(support(probs({})) == std::vector<int>{0, 1, 3, 4});
  CHECK(probs({})[1] == Approx(0.5));
  CHECK(support(probs({.top_k = 2})) == std::vector<int>{1, 4});
  CHECK(probs({.top_k = 2})[1] == Approx(0.5 / 0.8));
  CHECK(support(probs({.top_k = 1})) == std::vector<int>{1});
  CHECK(support(probs({.top_k = 99})) == std::vector<int>{0, 1, 3, 4});
  // top_p: ascending 0.05, 0.15, 0.3, 0.5 with cumulative 0.05, 0.2, 0.5, 1: with top_p = 0.75
  // those with cumulative <= 0.25 go; with top_p = 0.9 only the first (0.2 > 0.1).
  CHECK(support(probs({.top_p = 0.75})) == std::vector<int>{1, 4});
  CHECK(probs({.top_p = 0.75})[4] == Approx(0.3 / 0.8));
  CHECK(support(probs({.top_p = 0.9})) == std::vector<int>{0, 1, 4});
  CHECK(support(probs({.top_p = 1e-9})) == std::vector<int>{1});  // the most likely always stays
  CHECK(support(probs({.top_k = 3, .top_p = 0.7})) == std::vector<int>{1, 4});  // 0.5/0.95, 0.3/0.95 ...
  CHECK(support(probs({.temperature = 0.0})) == std::vector<int>{1});
  // Temperature: p^(1/t) renormalised.
  const double z = std::pow(0.5, 2) + std::pow(0.3, 2) + std::pow(0.15, 2) + std::pow(0.05, 2);
  CHECK(probs({.temperature = 0.5})[4] == Approx(0.09 / z));
  // Ties at the k-th logit are kept (HF's rule).
  const std::vector<float> tied = {1.f, 2.f, 2.f, 0.f};
  CHECK(support(nn::sampling_probabilities(tied.data(), 4, {.top_k = 1})) == std::vector<int>{1, 2});

  // Draws: 4000 rows of the same logits with top_k = 3: only tokens 1, 4, 0, at about 0.5/0.95,
  // 0.3/0.95, 0.15/0.95 of the time.
  std::vector<float> rows;
  for (int i = 0; i < 4000; ++i) rows.insert(rows.end(), logits.begin(), logits.end());
  Generator gen(5);
  const auto picks = nn::sample_next_token(Tensor<float>::from_vector(rows, {4000, 5}), {.top_k = 3}, gen).to_vector();
  std::map<int64_t, int> count;
  for (int64_t t : picks) ++count[t];
  CHECK(count.size() == 3);
  CHECK(count[1] / 4000.0 == Approx(0.5 / 0.95).margin(0.03));
  CHECK(count[4] / 4000.0 == Approx(0.3 / 0.95).margin(0.03));
  CHECK(count[0] / 4000.0 == Approx(0.15 / 0.95).margin(0.03));
  // In generate: top_k = 1 and a tiny top_p are greedy whatever the temperature.
  manual_seed(14);
  nn::GPT gpt(tiny_config());
  const auto prompt = random_ids(2, 3, 64, 15);
  const auto greedy = gpt.generate(prompt, {.max_new_tokens = 12, .temperature = 0.0}).to_vector();
  CHECK(gpt.generate(prompt, {.max_new_tokens = 12, .temperature = 2.0, .top_k = 1, .seed = 1}).to_vector() == greedy);
  CHECK(gpt.generate(prompt, {.max_new_tokens = 12, .temperature = 2.0, .top_p = 1e-9, .seed = 1}).to_vector() ==
        greedy);
  CHECK(gpt.generate(prompt, {.max_new_tokens = 12, .temperature = 2.0, .seed = 1}).to_vector() != greedy);
}

TEST_CASE("generate and sampling: bad arguments raise errors naming the op and the values", "[gpt][generate][errors]") {
  nn::GPT gpt(tiny_config());
  const auto p = Tensor<int64_t>::zeros({1, 4});
  CHECK_THROWS_WITH(gpt.generate(p, {.temperature = -1.0}), Catch::Contains("GPT::generate: temperature must be"));
  CHECK_THROWS_AS(gpt.generate(p, {.temperature = std::nan("")}), ValueError);
  CHECK_THROWS_WITH(gpt.generate(p, {.top_k = -2}), Catch::Contains("top_k must be >= 0") && Catch::Contains("-2"));
  CHECK_THROWS_WITH(gpt.generate(p, {.top_p = 0.0}), Catch::Contains("top_p must be in (0, 1]"));
  CHECK_THROWS_AS(gpt.generate(p, {.top_p = 1.5}), ValueError);
  CHECK_THROWS_WITH(gpt.generate(p, {.max_new_tokens = -1}), Catch::Contains("max_new_tokens must be >= 0"));
  CHECK_THROWS_WITH(gpt.generate(p, {.max_new_tokens = 30}),
                    Catch::Contains("the prompt int64[1, 4] on cpu and max_new_tokens 30 feed 33 positions") &&
                        Catch::Contains("block_size 32"));
  CHECK_NOTHROW(gpt.generate(p, {.max_new_tokens = 29}));  // the last token is never fed
  CHECK_THROWS_WITH(gpt.generate(Tensor<int64_t>::zeros({4})), Catch::Contains("[N, L]") && Catch::Contains("int64[4]"));
  CHECK_THROWS_AS(gpt.generate(Tensor<int64_t>::zeros({1, 0})), ShapeError);
  CHECK_THROWS_AS(gpt.generate(Tensor<int64_t>::full({1, 2}, -1.0)), IndexError);
  const std::vector<float> bad = {0.f, std::nanf(""), 1.f};
  CHECK_THROWS_WITH(nn::sampling_probabilities(bad.data(), 3, {}), Catch::Contains("contain NaN (token 1)"));
  CHECK_THROWS_WITH(nn::sample_next_token(Tensor<float>::from_vector(bad, {1, 3}), {.temperature = 0.0}),
                    Catch::Contains("sample_next_token: the logits of sequence 0 contain NaN"));
  const std::vector<float> none = {-INFINITY, -INFINITY};
  CHECK_THROWS_WITH(nn::sampling_probabilities(none.data(), 2, {}), Catch::Contains("every logit of sequence 0 is -inf"));
  CHECK_THROWS_WITH(nn::sample_next_token(Tensor<float>::zeros({2, 3, 4}), {}),
                    Catch::Contains("logits must be [N, V]") && Catch::Contains("float32[2, 3, 4]"));
  CHECK_THROWS_AS(nn::sample_next_token(Tensor<int64_t>::zeros({2, 3}), {}), DTypeError);
}

// ---------------------------------------------------------------------------------- inference mode

TEST_CASE("InferenceModeGuard: no graph, no saved tensors, GradModeGuard cannot re-enable it, nests and restores",
          "[gpt][inference_mode][autograd]") {
  manual_seed(6);
  nn::GPT gpt(tiny_config());
  const auto ids = random_ids(2, 16, 64, 7);
  const int64_t base = memory_stats(Device::cpu()).current_bytes;
  auto held = [&] { return memory_stats(Device::cpu()).current_bytes - base; };
  {
    const Tensor<float> out = gpt(ids);  // grad mode: the graph keeps every activation it needs
    CHECK(out.grad_fn() != nullptr);
    CHECK(held() > 8 * static_cast<int64_t>(out.nbytes()));
  }
  CHECK(held() == 0);  // the graph went with its output
  {
    Tensor<float> out;
    {
      InferenceModeGuard inference;
      CHECK(is_inference_mode_enabled());
      CHECK_FALSE(is_grad_enabled());
      GradModeGuard grad_on(true);  // no effect while inference mode is on
      CHECK_FALSE(is_grad_enabled());
      out = gpt(ids);
    }
    CHECK(out.grad_fn() == nullptr);
    CHECK_FALSE(out.requires_grad());
    CHECK(held() == static_cast<int64_t>(out.nbytes()));  // the output alone: nothing saved
    CHECK_THROWS_AS(sum(out).backward(), AutogradError);
  }
  {
    // A NoGradGuard is undone by a GradModeGuard(true) inside it: the difference.
    NoGradGuard no_grad;
    GradModeGuard grad_on(true);
    CHECK(gpt(ids).grad_fn() != nullptr);
  }
  // Nesting and restoring: InferenceModeGuard(false) switches it off for its scope.
  CHECK_FALSE(is_inference_mode_enabled());
  {
    InferenceModeGuard outer;
    {
      InferenceModeGuard off(false);
      CHECK_FALSE(is_inference_mode_enabled());
      CHECK(is_grad_enabled());
      {
        InferenceModeGuard inner;
        CHECK_FALSE(is_grad_enabled());
      }
      CHECK(is_grad_enabled());
    }
    CHECK(is_inference_mode_enabled());
    try {
      InferenceModeGuard again;
      throw ValueError("unwind");
    } catch (const ValueError&) {
    }
    CHECK(is_inference_mode_enabled());
    // Per thread: another thread records as usual.
    bool other_records = false;
    std::thread t([&] { other_records = is_grad_enabled() && !is_inference_mode_enabled(); });
    t.join();
    CHECK(other_records);
    // nn::recompute inside it is a plain call (nothing recorded).
    auto w = Tensor<float>::ones({3}).set_requires_grad();
    auto y = nn::recompute([&](const Tensor<float>& x) { return x * w; }, Tensor<float>::ones({3}));
    CHECK_FALSE(y.requires_grad());
  }
  CHECK_FALSE(is_inference_mode_enabled());
  CHECK(is_grad_enabled());
  // A backward run inside inference mode, of a graph made outside it, still works (nn::recompute's
  // recomputation inside it records).
  auto w = Tensor<float>::full({3}, 2.0).set_requires_grad();
  auto loss = sum(nn::recompute([&](const Tensor<float>& x) { return x * w; }, Tensor<float>::ones({3})));
  {
    InferenceModeGuard inference;
    loss.backward();
  }
  REQUIRE(w.grad().defined());
  CHECK(Tensor<float>(w.grad()).to_vector() == std::vector<float>{1.f, 1.f, 1.f});
}

TEST_CASE("init::SkipInitGuard: the init functions write and draw nothing inside it, nest and restore",
          "[gpt][init]") {
  AnyTensor t = Tensor<float>::full({4}, 7.0);
  const auto before = default_generator().state();
  {
    nn::init::SkipInitGuard skip;
    nn::init::normal_(t);
    nn::init::uniform_(t);
    nn::init::zeros_(t);
    nn::init::xavier_uniform_(t = Tensor<float>::full({2, 2}, 7.0));
    nn::Linear lin(3, 2);  // made without drawing
    {
      nn::init::SkipInitGuard again;
    }
    nn::init::ones_(t);
    CHECK(Tensor<float>(t).to_vector() == std::vector<float>(4, 7.0f));
  }
  CHECK(default_generator().state() == before);
  nn::init::ones_(t);
  CHECK(Tensor<float>(t).to_vector() == std::vector<float>(4, 1.0f));
  nn::init::normal_(t);
  CHECK_FALSE(default_generator().state() == before);
}

// ----------------------------------------------------------------------------------- Hugging Face

TEST_CASE("Hugging Face: transformers' GPT2LMHeadModel fixture, logits to 1e-5 and its greedy generation",
          "[gpt][huggingface][interop]") {
  const io::TensorList ref = io::load_file(fixture_dir() / "reference.safetensors");
  const Tensor<int64_t> ids(*nn::find_entry(ref, "input_ids"));
  const Tensor<float> want(*nn::find_entry(ref, "logits"));
  const Tensor<int64_t> generated(*nn::find_entry(ref, "generated"));
  auto gpt = nn::GPT::from_huggingface(fixture_dir());
  const nn::GPTConfig& c = gpt->config();
  CHECK((c.vocab_size == 64 && c.block_size == 32 && c.n_layer == 2 && c.n_head == 2 && c.n_embd == 32));
  CHECK(c.dropout == 0.1);
  CHECK_FALSE(gpt->is_training());  // as transformers' from_pretrained: ready for inference
  const Tensor<float> logits = gpt->forward(ids);
  const double d = max_abs_diff(logits, want);
  const double scale = max_abs_diff(want, Tensor<float>::zeros(want.shape()));
  std::printf("Hugging Face fixture: max |ember - transformers| over %lld logits = %.3g (max |logit| %.3g)\n",
              static_cast<long long>(want.numel()), d, scale);
  CHECK(d <= 1e-5);
  CHECK(scale > 1.0);  // far from a trivial match
  // Greedy decoding with ember's cache gives transformers' tokens (its own cache, its generate()).
  const int64_t new_tokens = generated.shape()[1] - ids.shape()[1];
  CHECK(gpt->generate(ids, {.max_new_tokens = new_tokens, .temperature = 0.0}).to_vector() == generated.to_vector());
  // The loader left the caller's generator alone (the scratch initialisation has its own).
  const auto before = default_generator().state();
  nn::GPT::from_huggingface(fixture_dir() / "model.safetensors");
  CHECK(default_generator().state() == before);
}

TEST_CASE("Hugging Face: save_huggingface writes transformers' own files, and loading them back is bitwise",
          "[gpt][huggingface][interop]") {
  testing::TempDir dir("ember-gpt");
  auto gpt = nn::GPT::from_huggingface(fixture_dir());
  gpt->save_huggingface(dir.path / "out");
  // The tensors are the fixture's, name for name and bit for bit: the transposes undo each other.
  const io::TensorList theirs = io::load_file(fixture_dir() / "model.safetensors");
  const io::TensorList ours = io::load_file(dir.path / "out" / "model.safetensors");
  REQUIRE(ours.size() == theirs.size());
  for (const auto& [name, t] : theirs) {
    const AnyTensor* o = nn::find_entry(ours, name);
    INFO(name);
    REQUIRE(o != nullptr);
    CHECK(same_bytes(*o, t));
  }
  CHECK(io::load_metadata(dir.path / "out" / "model.safetensors").at("format") == "pt");
  // config.json: the architecture fields of transformers' own.
  std::ifstream a(fixture_dir() / "config.json"), b(dir.path / "out" / "config.json");
  const nlohmann::json ja = nlohmann::json::parse(a), jb = nlohmann::json::parse(b);
  for (const char* k : {"model_type", "vocab_size", "n_positions", "n_layer", "n_head", "n_embd", "n_inner",
                        "layer_norm_epsilon", "activation_function", "attn_pdrop", "resid_pdrop", "embd_pdrop",
                        "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "tie_word_embeddings", "architectures"}) {
    INFO(k);
    CHECK(jb.at(k) == ja.at(k));
  }
  // Back into ember: every parameter bitwise, from the folder and from the file.
  auto back = nn::GPT::from_huggingface(dir.path / "out");
  const auto s1 = gpt->state_dict(), s2 = back->state_dict();
  REQUIRE(s1.size() == s2.size());
  for (size_t i = 0; i < s1.size(); ++i) {
    INFO(s1[i].first);
    CHECK(s1[i].first == s2[i].first);
    CHECK(same_bytes(s1[i].second, s2[i].second));
  }
  // A freshly initialised model (not from a file) round-trips as well, and save overwrites.
  manual_seed(21);
  nn::GPT fresh({.vocab_size = 40, .block_size = 12, .n_layer = 1, .n_head = 4, .n_embd = 16, .n_inner = 24});
  fresh.save_huggingface(dir.path / "out");
  nn::GPT target({.vocab_size = 40, .block_size = 12, .n_layer = 1, .n_head = 4, .n_embd = 16, .n_inner = 24});
  target.load_huggingface(dir.path / "out");
  for (size_t i = 0; i < fresh.state_dict().size(); ++i)
    CHECK(same_bytes(fresh.state_dict()[i].second, target.state_dict()[i].second));
  std::ifstream c(dir.path / "out" / "config.json");
  CHECK(nlohmann::json::parse(c).at("n_inner") == 24);
}

TEST_CASE("Hugging Face: GPT2Model-style names, old mask buffers, a tied lm_head.weight, sharded files, fp16 files",
          "[gpt][huggingface][interop]") {
  testing::TempDir dir("ember-gpt");
  const io::TensorList theirs = io::load_file(fixture_dir() / "model.safetensors");
  auto base = nn::GPT::from_huggingface(fixture_dir());
  const auto ids = Tensor<int64_t>::from_vector({1, 5, 9, 2, 7}, {1, 5});
  const Tensor<float> want = base->forward(ids);
  auto logits_of = [&](const fs::path& p) { return nn::GPT::from_huggingface(p)->forward(ids); };
  auto write_folder = [&](const std::string& name, const io::TensorList& tensors) {
    copy_fixture(dir.path / name, [](nlohmann::json&) {});
    io::save_file(dir.path / name / "model.safetensors", tensors);
    return dir.path / name;
  };
  // No "transformer." prefix and the causal-mask buffers (openai-community/gpt2's file).
  io::TensorList plain;
  for (const auto& [n, t] : theirs) plain.emplace_back(n.substr(12), t);
  plain.emplace_back("h.0.attn.bias", Tensor<float>::ones({1, 1, 32, 32}));
  plain.emplace_back("h.1.attn.masked_bias", Tensor<float>::full(Shape{}, -1e4));
  CHECK(same_bytes(logits_of(write_folder("plain", plain)), want));
  // lm_head.weight present (a copy of wte's values) is accepted.
  io::TensorList with_head = theirs;
  with_head.emplace_back("lm_head.weight", nn::find_entry(theirs, "transformer.wte.weight")->clone());
  CHECK(same_bytes(logits_of(write_folder("head", with_head)), want));
  // Two shards and an index.
  fs::create_directories(dir.path / "sharded");
  fs::copy_file(fixture_dir() / "config.json", dir.path / "sharded" / "config.json");
  io::TensorList s1(theirs.begin(), theirs.begin() + 10), s2(theirs.begin() + 10, theirs.end());
  io::save_file(dir.path / "sharded" / "model-00001-of-00002.safetensors", s1);
  io::save_file(dir.path / "sharded" / "model-00002-of-00002.safetensors", s2);
  nlohmann::json index;
  for (const auto& [n, t] : s1) index["weight_map"][n] = "model-00001-of-00002.safetensors";
  for (const auto& [n, t] : s2) index["weight_map"][n] = "model-00002-of-00002.safetensors";
  write_text(dir.path / "sharded" / "model.safetensors.index.json", index.dump());
  CHECK(same_bytes(logits_of(dir.path / "sharded"), want));
  CHECK(same_bytes(logits_of(dir.path / "sharded" / "model.safetensors.index.json"), want));
  // A float16 file loads into fp32 parameters (values rounded to fp16, so close, not equal).
  io::TensorList f16;
  for (const auto& [n, t] : theirs) f16.emplace_back(n, t.to(DType::Float16));
  const Tensor<float> l16 = logits_of(write_folder("f16", f16));
  CHECK(max_abs_diff(l16, want) < 0.05);
  CHECK(max_abs_diff(l16, want) > 0.0);
  // Loaded as float64 parameters: the same values widened.
  auto wide = nn::GPT::from_huggingface(fixture_dir(), {.dtype = DType::Float64});
  CHECK(wide->wte->weight.dtype() == DType::Float64);
  CHECK(max_abs_diff(wide->forward<double>(ids), want) < 1e-5);
}

TEST_CASE("Hugging Face: wrong files and configs raise errors naming the file, the tensor and the field",
          "[gpt][huggingface][errors]") {
  testing::TempDir dir("ember-gpt");
  const io::TensorList theirs = io::load_file(fixture_dir() / "model.safetensors");
  auto with_tensors = [&](const std::string& name, const io::TensorList& tensors) {
    copy_fixture(dir.path / name, [](nlohmann::json&) {});
    io::save_file(dir.path / name / "model.safetensors", tensors);
    return dir.path / name;
  };
  io::TensorList missing(theirs.begin() + 1, theirs.end());
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_tensors("missing", missing)),
                    Catch::Contains("missing transformer.h.0.attn.c_attn.bias") &&
                        Catch::Contains("missing/model.safetensors"));
  io::TensorList untransposed = theirs;
  for (auto& [n, t] : untransposed)
    if (n == "transformer.h.1.mlp.c_fc.weight") t = op::transpose(t, 0, 1);
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_tensors("shape", untransposed)),
                    Catch::Contains("transformer.h.1.mlp.c_fc.weight is [128, 32], expected [32, 128] (Conv1D [in, out])"));
  io::TensorList extra = theirs;
  extra.emplace_back("transformer.h.2.ln_1.weight", Tensor<float>::ones({32}));
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_tensors("extra", extra)),
                    Catch::Contains("unexpected h.2.ln_1.weight"));
  io::TensorList untied = theirs;
  untied.emplace_back("lm_head.weight", Tensor<float>::zeros({64, 32}));
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_tensors("untied", untied)),
                    Catch::Contains("lm_head.weight float32[64, 32] on cpu differs from transformer.wte.weight"));
  io::TensorList twice = theirs;
  twice.emplace_back("wte.weight", nn::find_entry(theirs, "transformer.wte.weight")->clone());
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_tensors("twice", twice)), Catch::Contains("holds 'wte.weight' twice"));

  auto with_config = [&](const std::string& name, auto edit) {
    copy_fixture(dir.path / name, edit);
    return dir.path / name;
  };
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_config("llama", [](nlohmann::json& j) { j["model_type"] = "llama"; })),
                    Catch::Contains("describes a 'llama' model"));
  CHECK_THROWS_WITH(
      nn::GPT::from_huggingface(with_config("gelu", [](nlohmann::json& j) { j["activation_function"] = "relu"; })),
      Catch::Contains("activation_function \"relu\""));
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_config("noembd", [](nlohmann::json& j) { j.erase("n_embd"); })),
                    Catch::Contains("has no \"n_embd\"") && Catch::Contains("noembd/config.json"));
  CHECK_THROWS_AS(nn::GPT::from_huggingface(with_config("str", [](nlohmann::json& j) { j["n_layer"] = "2"; })),
                  FormatError);
  // Sizes are checked where they are read (a fuzzed config must not reach the constructor's
  // arithmetic): negative, not divisible, beyond int64.
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fixture_dir() / "config.json"));
  auto with = [&](const char* k, nlohmann::json v) {
    nlohmann::json c = cfg;
    c[k] = v;
    return c;
  };
  CHECK_THROWS_WITH(nn::GPT::config_from_huggingface(with("vocab_size", -3)),
                    Catch::Contains("vocab_size -3") && Catch::Contains("sizes must be positive"));
  CHECK_THROWS_AS(nn::GPT::config_from_huggingface(with("n_head", 5)), ValueError);
  CHECK_THROWS_WITH(nn::GPT::config_from_huggingface(with("n_embd", 18446744073709551615ull)),
                    Catch::Contains("\"n_embd\" must be an integer, got 18446744073709551615"));
  CHECK_THROWS_AS(nn::GPT::config_from_huggingface(with("layer_norm_epsilon", -1.0)), ValueError);
  CHECK_THROWS_AS(nn::GPT::config_from_huggingface(with("resid_pdrop", 2.0)), ValueError);
  CHECK_THROWS_AS(nn::GPT::config_from_huggingface(nlohmann::json::array()), FormatError);
  CHECK(nn::GPT::config_from_huggingface(with("n_inner", 128)).n_inner == 0);  // 4 * n_embd: the default
  CHECK(nn::GPT::config_from_huggingface(with("n_inner", 100)).n_inner == 100);
  CHECK_THROWS_WITH(
      nn::GPT::from_huggingface(with_config("untie", [](nlohmann::json& j) { j["tie_word_embeddings"] = false; })),
      Catch::Contains("tie_word_embeddings = false"));
  CHECK_THROWS_AS(
      nn::GPT::from_huggingface(with_config("idx", [](nlohmann::json& j) { j["scale_attn_by_inverse_layer_idx"] = true; })),
      ValueError);
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(with_config("big", [](nlohmann::json& j) { j["n_embd"] = 64; })),
                    Catch::Contains("does not fit this model") && Catch::Contains("transformer.wte.weight is [64, 32]"));
  const fs::path drops = with_config("drops", [](nlohmann::json& j) { j["attn_pdrop"] = 0.0; });
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(drops), Catch::Contains("attn_pdrop 0, resid_pdrop 0.1"));
  CHECK(nn::GPT::from_huggingface(drops, {.dropout = 0.0})->config().dropout == 0.0);
  // Files that are not there or not JSON.
  CHECK_THROWS_AS(nn::GPT::from_huggingface(dir.path / "nowhere"), IOError);
  fs::create_directories(dir.path / "empty");
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(dir.path / "empty"), Catch::Contains("no model.safetensors"));
  fs::create_directories(dir.path / "noconfig");
  fs::copy_file(fixture_dir() / "model.safetensors", dir.path / "noconfig" / "model.safetensors");
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(dir.path / "noconfig"),
                    Catch::Contains("cannot open") && Catch::Contains("noconfig/config.json"));
  write_text(dir.path / "noconfig" / "config.json", "{\"n_embd\": ");
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(dir.path / "noconfig"), Catch::Contains("is not valid JSON"));
  write_text(dir.path / "noconfig" / "model.safetensors.index.json", "{\"weight_map\": {}}");
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(dir.path / "noconfig" / "model.safetensors.index.json"),
                    Catch::Contains("names no shard"));
  write_text(dir.path / "noconfig" / "model.safetensors.index.json", "{\"weight_map\": {\"wte.weight\": \"../x\"}}");
  CHECK_THROWS_WITH(nn::GPT::from_huggingface(dir.path / "noconfig" / "model.safetensors.index.json"),
                    Catch::Contains("the file '../x' of 'wte.weight' is not a file name in the index's folder"));
  // Into a model of another size; a model HF cannot hold; a folder that cannot be made.
  nn::GPT small({.vocab_size = 64, .block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32});
  CHECK_THROWS_WITH(small.load_huggingface(fixture_dir()), Catch::Contains("n_positions 32") &&
                                                               Catch::Contains("this model has 64, 16, 2"));
  nn::GPT no_bias({.vocab_size = 8, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4, .bias = false});
  CHECK_THROWS_WITH(no_bias.save_huggingface(dir.path / "nb"), Catch::Contains("bias = false"));
  write_text(dir.path / "file", "x");
  CHECK_THROWS_AS(small.save_huggingface(dir.path / "file" / "sub"), IOError);
}
