#include "checkpoint/export.hpp"

#include <cstdio>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "job/parse.hpp"

namespace exatrain::checkpoint {
namespace {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// The checkpoint's tensor `name`, which must have `shape` (the model's job.toml says which): a
// tensor missing or of another shape is an error naming it, never an out-of-range access.
const Tensor& need(const std::map<std::string, Tensor>& W, const std::string& name, const std::vector<int64_t>& shape) {
  auto it = W.find(name);
  EXA_CHECK(it != W.end(), "export: the checkpoint has no tensor \"{}\" (expected shape {}, from its job.toml)", name,
            shape_string(shape));
  EXA_CHECK(it->second.shape == shape, "export: tensor \"{}\" has shape {}, but the checkpoint's job.toml implies {}",
            name, shape_string(it->second.shape), shape_string(shape));
  return it->second;
}

// Every model tensor of the checkpoint as a whole (global) tensor, assembled from the slices of
// all model*.safetensors files (one per rank when the run was split).
std::map<std::string, Tensor> load_global_tensors(const CheckpointReader& r) {
  std::vector<std::unique_ptr<SafetensorsReader>> owned;
  std::vector<const SafetensorsReader*> files;
  for (const auto& [name, entry] : r.files())
    if (name.rfind("model", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") {
      owned.push_back(r.safetensors(name));
      files.push_back(owned.back().get());
    }
  EXA_CHECK(!files.empty(), "{}: no model*.safetensors file in the checkpoint", r.dir());
  std::map<std::string, Tensor> out;
  for (const auto* f : files)
    for (const auto& [name, info] : f->tensors())
      if (!out.count(name)) {
        Tensor t;
        t.data = assemble_global(files, name, &t.shape);
        out.emplace(name, std::move(t));
      }
  return out;
}

// out[c, r] = in[r, c] for a [rows, cols] matrix (Hugging Face GPT-2's Conv1D stores [in, out]).
Tensor transpose(const Tensor& in) {
  EXA_CHECK(in.shape.size() == 2, "export: expected a matrix to transpose, got shape {}", shape_string(in.shape));
  const int64_t R = in.shape[0], C = in.shape[1];
  Tensor out{{C, R}, std::vector<float>(in.data.size())};
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out.data[size_t(c * R + r)] = in.data[size_t(r * C + c)];
  return out;
}

// Concatenation along dimension 0.
Tensor concat_rows(const std::vector<const Tensor*>& parts) {
  Tensor out;
  out.shape = parts[0]->shape;
  out.shape[0] = 0;
  for (const Tensor* p : parts) {
    out.shape[0] += p->shape[0];
    out.data.insert(out.data.end(), p->data.begin(), p->data.end());
  }
  return out;
}

struct Exported {
  std::map<std::string, Tensor> tensors;
  nlohmann::json config;
};

Exported to_hf_gpt2(const std::map<std::string, Tensor>& W, const ModelSpec& m) {
  EXA_CHECK(m.bias, "export --format hf: a GPT-2-style model has biases on every linear layer (GPT2LMHeadModel "
                    "cannot load one without); this model has bias = false");
  EXA_CHECK(m.activation == Activation::gelu && m.norm == Norm::layernorm && m.position == Position::learned &&
                m.kv_heads == m.heads,
            "export --format hf: a GPT-2-style model needs activation = \"gelu\", norm = \"layernorm\", position = "
            "\"learned\" and kv_heads = heads; a Llama-style one needs \"swiglu\", \"rmsnorm\", \"rope\"; this model "
            "has {}, {}, {}, kv_heads = {} of heads = {}",
            to_string(m.activation), to_string(m.norm), to_string(m.position), m.kv_heads, m.heads);
  Exported e;
  auto& T = e.tensors;
  const int64_t h = m.hidden, f = m.ffn_hidden, V = m.vocab;
  T["transformer.wte.weight"] = need(W, "wte.weight", {V, h});
  T["transformer.wpe.weight"] = need(W, "wpe.weight", {m.seq_len, h});
  for (int64_t i = 0; i < m.layers; ++i) {
    std::string p = fmt::format("h.{}.", i), q = fmt::format("transformer.h.{}.", i);
    T[q + "ln_1.weight"] = need(W, p + "ln_1.weight", {h});
    T[q + "ln_1.bias"] = need(W, p + "ln_1.bias", {h});
    // Conv1D: y = x W + b with W [in, out]; ours is torch.nn.Linear's [out, in].
    T[q + "attn.c_attn.weight"] = transpose(concat_rows({&need(W, p + "attn.q_proj.weight", {h, h}),
                                                         &need(W, p + "attn.k_proj.weight", {h, h}),
                                                         &need(W, p + "attn.v_proj.weight", {h, h})}));
    T[q + "attn.c_attn.bias"] = concat_rows({&need(W, p + "attn.q_proj.bias", {h}), &need(W, p + "attn.k_proj.bias", {h}),
                                             &need(W, p + "attn.v_proj.bias", {h})});
    T[q + "attn.c_proj.weight"] = transpose(need(W, p + "attn.o_proj.weight", {h, h}));
    T[q + "attn.c_proj.bias"] = need(W, p + "attn.o_proj.bias", {h});
    T[q + "ln_2.weight"] = need(W, p + "ln_2.weight", {h});
    T[q + "ln_2.bias"] = need(W, p + "ln_2.bias", {h});
    T[q + "mlp.c_fc.weight"] = transpose(need(W, p + "mlp.fc1.weight", {f, h}));
    T[q + "mlp.c_fc.bias"] = need(W, p + "mlp.fc1.bias", {f});
    T[q + "mlp.c_proj.weight"] = transpose(need(W, p + "mlp.fc2.weight", {h, f}));
    T[q + "mlp.c_proj.bias"] = need(W, p + "mlp.fc2.bias", {h});
  }
  T["transformer.ln_f.weight"] = need(W, "ln_f.weight", {h});
  T["transformer.ln_f.bias"] = need(W, "ln_f.bias", {h});
  if (!m.tie_embeddings) T["lm_head.weight"] = need(W, "lm_head.weight", {V, h});
  e.config = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", m.vocab},
              {"n_positions", m.seq_len}, {"n_embd", m.hidden}, {"n_layer", m.layers}, {"n_head", m.heads},
              {"n_inner", m.ffn_hidden}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", m.norm_eps},
              {"resid_pdrop", 0.0}, {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0},
              {"tie_word_embeddings", m.tie_embeddings}, {"torch_dtype", "float32"}};
  return e;
}

Exported to_hf_llama(const std::map<std::string, Tensor>& W, const ModelSpec& m) {
  Exported e;
  auto& T = e.tensors;
  const int64_t h = m.hidden, f = m.ffn_hidden, V = m.vocab, kv = m.kv_heads * m.head_dim();
  T["model.embed_tokens.weight"] = need(W, "wte.weight", {V, h});
  // [out, in] of each projection (torch.nn.Linear's layout, ours too).
  const std::map<std::string, std::pair<int64_t, int64_t>> attn = {
      {"q_proj", {h, h}}, {"k_proj", {kv, h}}, {"v_proj", {kv, h}}, {"o_proj", {h, h}}};
  const std::map<std::string, std::pair<int64_t, int64_t>> mlp = {
      {"gate_proj", {f, h}}, {"up_proj", {f, h}}, {"down_proj", {h, f}}};
  for (int64_t i = 0; i < m.layers; ++i) {
    std::string p = fmt::format("h.{}.", i), q = fmt::format("model.layers.{}.", i);
    T[q + "input_layernorm.weight"] = need(W, p + "ln_1.weight", {h});
    for (const auto& [proj, dims] : attn) {
      T[fmt::format("{}self_attn.{}.weight", q, proj)] = need(W, fmt::format("{}attn.{}.weight", p, proj), {dims.first, dims.second});
      if (m.bias) T[fmt::format("{}self_attn.{}.bias", q, proj)] = need(W, fmt::format("{}attn.{}.bias", p, proj), {dims.first});
    }
    T[q + "post_attention_layernorm.weight"] = need(W, p + "ln_2.weight", {h});
    for (const auto& [proj, dims] : mlp) {
      T[fmt::format("{}mlp.{}.weight", q, proj)] = need(W, fmt::format("{}mlp.{}.weight", p, proj), {dims.first, dims.second});
      if (m.bias) T[fmt::format("{}mlp.{}.bias", q, proj)] = need(W, fmt::format("{}mlp.{}.bias", p, proj), {dims.first});
    }
  }
  T["model.norm.weight"] = need(W, "ln_f.weight", {h});
  if (!m.tie_embeddings) T["lm_head.weight"] = need(W, "lm_head.weight", {V, h});
  // With model.bias our linear layers carry biases: attention_bias and mlp_bias tell transformers to load them.
  e.config = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", m.vocab},
              {"hidden_size", m.hidden}, {"intermediate_size", m.ffn_hidden}, {"num_hidden_layers", m.layers},
              {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads}, {"head_dim", m.head_dim()},
              {"max_position_embeddings", m.seq_len}, {"rms_norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
              {"hidden_act", "silu"}, {"attention_bias", m.bias}, {"mlp_bias", m.bias},
              {"tie_word_embeddings", m.tie_embeddings}, {"torch_dtype", "float32"}};
  return e;
}

}  // namespace

std::string export_checkpoint(const std::string& dir, const ExportOptions& o) {
  EXA_CHECK(o.format == "safetensors" || o.format == "hf", "export: --format {}: expected safetensors or hf", o.format);
  EXA_CHECK(o.dtype == "fp32" || o.dtype == "bf16", "export: --dtype {}: expected fp32 or bf16", o.dtype);
  EXA_CHECK(!o.out_dir.empty(), "export: --out is empty: expected the directory to write into");
  CheckpointReader r(dir);  // verifies every file
  Job job = parse_job(r.blob("job.toml"), dir + "/job.toml");
  const ModelSpec& m = job.model;
  std::map<std::string, Tensor> W = load_global_tensors(r);
  // Weights of a diverged run (NaN or Inf) are refused: exported, they would only move the
  // failure to whoever loads them. --allow-nonfinite turns this into a warning.
  std::string bad;
  int listed = 0;
  for (const auto& [name, t] : W) {
    int64_t first = -1;
    const int64_t n = count_nonfinite(t.data.data(), int64_t(t.data.size()), &first);
    if (n > 0 && listed++ < 5)
      bad += fmt::format("\n  {}: {} of {} values are NaN or Inf (first at element {})", name, n, t.data.size(), first);
  }
  if (!bad.empty()) {
    const std::string msg = fmt::format("checkpoint {} holds non-finite weights ({} tensor{}; the run diverged?):{}", dir,
                                        listed, listed == 1 ? "" : "s", bad);
    EXA_CHECK(o.allow_nonfinite, "export: {}\nexpected finite weights; pass --allow-nonfinite to export them anyway",
              msg);
    std::fprintf(stderr, "exatrain: WARNING: %s\nexatrain: WARNING: exporting them anyway (--allow-nonfinite)\n",
                 msg.c_str());
  }

  Exported e;
  if (o.format == "safetensors") {
    e.tensors = std::move(W);
  } else if (m.position == Position::rope || m.norm == Norm::rmsnorm || m.activation == Activation::swiglu) {
    EXA_CHECK(m.position == Position::rope && m.norm == Norm::rmsnorm && m.activation == Activation::swiglu,
              "export --format hf: a Llama-style model needs position = \"rope\", norm = \"rmsnorm\" and activation = "
              "\"swiglu\"; this model has {}, {}, {}", to_string(m.position), to_string(m.norm), to_string(m.activation));
    e = to_hf_llama(W, m);
  } else {
    e = to_hf_gpt2(W, m);
  }
  if (o.dtype == "bf16" && !e.config.is_null()) e.config["torch_dtype"] = "bfloat16";

  make_directories(o.out_dir, "export --out");
  SafetensorsWriter w;
  const DType dt = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  for (const auto& [name, t] : e.tensors) w.add(name, t.shape, t.data.data(), dt);
  w.set_metadata("format", "pt");  // transformers refuses safetensors files without it
  // Temporary name, fsync, rename: an interrupted export never leaves a half-written file.
  const std::string final_path = o.out_dir + "/model.safetensors", tmp = final_path + ".tmp";
  const std::string sha = write_safetensors(tmp, w);
  EXA_SYSCHECK(std::rename(tmp.c_str(), final_path.c_str()) == 0, "cannot rename '{}' to '{}'", tmp, final_path);
  fsync_directory(o.out_dir);
  write_file_atomic(o.out_dir + "/model.safetensors.sha256", sha + "  model.safetensors\n");
  if (o.format == "hf") {
    write_file_atomic(o.out_dir + "/config.json", e.config.dump(2) + "\n");
    if (r.has("tokenizer.model")) write_file_atomic(o.out_dir + "/tokenizer.model", r.blob("tokenizer.model"));
  } else {
    write_file_atomic(o.out_dir + "/job.toml", r.blob("job.toml"));
  }
  return fmt::format("exported {} tensors ({}, {}) of {} to {}", e.tensors.size(), o.format, o.dtype, dir, o.out_dir);
}

}  // namespace exatrain::checkpoint
