// Golden-test driver: builds a tiny model of one variant, writes its initial weights, one
// batch, the logits, loss and every gradient, plus the losses of 10 Trainer (AdamW) steps,
// into a directory that golden_test.py compares against PyTorch.
//   golden_driver VARIANT OUT_DIR
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "model/gpt.hpp"
#include "train/trainer.hpp"

using namespace exatrain;

namespace {

ModelSpec variant_model(const std::string& v) {
  ModelSpec m;
  m.layers = 2;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 64;
  m.seq_len = 12;
  m.vocab = 53;
  if (v == "gpt2") {  // gelu, layernorm, learned positions, multi-head, tied
  } else if (v == "llama" || v == "llama_nobias") {  // swiglu, rmsnorm, rope, grouped-query (2 kv
    m.activation = Activation::swiglu;                // heads), untied; llama_nobias: no linear-layer
    m.norm = Norm::rmsnorm;                           // biases (the real Llama)
    m.position = Position::rope;
    m.kv_heads = 2;
    m.ffn_hidden = 48;
    m.tie_embeddings = false;
    m.bias = v == "llama";
  } else if (v == "gelu_rope_mqa") {  // gelu, layernorm, rope, one kv head
    m.position = Position::rope;
    m.kv_heads = 1;
  } else if (v == "swiglu_layernorm_learned") {
    m.activation = Activation::swiglu;
    m.kv_heads = 2;
  } else {
    EXA_FAIL("golden_driver: unknown variant '{}' (gpt2 | llama | llama_nobias | gelu_rope_mqa | "
             "swiglu_layernorm_learned)", v);
  }
  return m;
}

template <class T>
void write_bin(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  EXA_CHECK(f.good(), "cannot write {}", path);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(sizeof(T) * v.size()));
  EXA_CHECK(f.good(), "short write to {}", path);
}

std::vector<float> download(Backend& be, const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  be.download(h.data(), p, sizeof(float) * h.size());
  return h;
}

// Records every batch the trainer draws so PyTorch can replay the same data.
class RecordingSource final : public TokenSource {
 public:
  explicit RecordingSource(TokenSource& inner) : inner_(inner) {}
  void next_batch(int64_t B, int64_t T, int32_t* in, int32_t* tg) override {
    inner_.next_batch(B, T, in, tg);
    inputs.insert(inputs.end(), in, in + B * T);
    targets.insert(targets.end(), tg, tg + B * T);
  }
  uint64_t position() const override { return inner_.position(); }
  void seek(uint64_t p) override { inner_.seek(p); }
  std::vector<int32_t> inputs, targets;

 private:
  TokenSource& inner_;
};

}  // namespace

int main(int argc, char** argv) try {
  EXA_CHECK(argc == 3, "usage: golden_driver VARIANT OUT_DIR");
  const std::string variant = argv[1], dir = argv[2];
  const ModelSpec m = variant_model(variant);
  const int64_t B = 3, T = m.seq_len, N = B * T;
  const uint64_t seed = 1234;
  auto be = make_cpu_backend(2, 0);  // 0: parallel kernels even at this tiny size

  // A token stream with structure (a repeated 16-token phrase), so 10 steps lower the loss.
  std::vector<int32_t> stream;
  for (int i = 0; i < 4000; i++) stream.push_back(int32_t(((i % 16) * 7 + 3) % m.vocab));

  GptOptions o;
  o.model = m;
  o.micro_batch = B;
  o.recompute = variant == "llama" ? Recompute::selective : Recompute::none;
  Gpt g(*be, o);
  g.init_weights(seed);
  std::vector<int32_t> tok(static_cast<size_t>(N)), tgt(static_cast<size_t>(N));
  InMemoryTokenStream first_batch(stream);
  first_batch.seek(100);
  first_batch.next_batch(B, T, tok.data(), tgt.data());
  g.zero_grad();
  const float loss = g.forward(tok.data(), nullptr, tgt.data());
  write_bin(dir + "/logits.bin", g.download_logits());
  g.backward(nullptr, 1.0f);
  write_bin(dir + "/params.bin", download(*be, g.params(), g.num_params()));
  write_bin(dir + "/grads.bin", download(*be, g.grads(), g.num_params()));
  write_bin(dir + "/tokens.bin", tok);
  write_bin(dir + "/targets.bin", tgt);

  // 10 AdamW steps through the Trainer: warm-up 3, cosine to min_lr over 10, clip 1.0.
  TrainerOptions to;
  to.model = m;
  to.train.seed = seed;
  to.train.lr = 3e-2;
  to.train.min_lr = 1e-3;
  to.train.warmup_steps = 3;
  to.train.steps = 10;
  to.train.weight_decay = 0.1;
  to.train.grad_clip = 1.0;
  to.plan = single_rank_plan(/*micro_batch=*/2, /*micro_batches=*/2);
  to.peak_gflops = 1;
  InMemoryTokenStream inner(stream);
  RecordingSource rec(inner);
  auto rt = parallel::ParallelRuntime::local(*be);
  Trainer tr(*be, *rt, to, rec);
  nlohmann::json steps = nlohmann::json::array();
  for (int s = 0; s < 10; s++) {
    StepMetrics sm = tr.train_step();
    steps.push_back({{"loss", sm.loss}, {"lr", sm.lr}, {"grad_norm", sm.grad_norm}});
  }
  write_bin(dir + "/train_inputs.bin", rec.inputs);
  write_bin(dir + "/train_targets.bin", rec.targets);

  nlohmann::json meta;
  meta["variant"] = variant;
  meta["model"] = {{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads},
                   {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden},
                   {"seq_len", m.seq_len}, {"vocab", m.vocab},
                   {"activation", to_string(m.activation)}, {"norm", to_string(m.norm)},
                   {"position", to_string(m.position)}, {"tie_embeddings", m.tie_embeddings},
                   {"bias", m.bias}, {"norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta}};
  meta["batch"] = B;
  meta["loss"] = loss;
  meta["train"] = {{"micro_batch", to.plan.micro_batch}, {"grad_accum", to.plan.micro_batches()},
                   {"lr", to.train.lr}, {"min_lr", to.train.min_lr},
                   {"warmup_steps", to.train.warmup_steps}, {"steps", to.train.steps},
                   {"weight_decay", to.train.weight_decay}, {"beta1", to.train.beta1},
                   {"beta2", to.train.beta2}, {"eps", to.train.eps},
                   {"grad_clip", to.train.grad_clip}, {"history", steps}};
  nlohmann::json params = nlohmann::json::array();
  for (const ParamInfo& p : g.layout().entries())
    params.push_back({{"name", p.name}, {"shape", p.global_shape}, {"offset", p.offset},
                      {"numel", p.numel}, {"decay", p.decay}});
  meta["params"] = params;
  std::ofstream f(dir + "/meta.json");
  f << meta.dump(1) << "\n";
  EXA_CHECK(f.good(), "cannot write {}/meta.json", dir);
  return 0;
} catch (const std::exception& e) {
  std::cerr << "golden_driver: " << e.what() << "\n";
  return 1;
}
