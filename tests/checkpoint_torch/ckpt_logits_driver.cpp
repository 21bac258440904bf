// Makes a real checkpoint (a few training steps of a tiny model on a byte dataset), then runs our
// forward pass on fixed tokens and writes what torch_loads_checkpoint.py compares against:
//   OUT/ckpt -> the checkpoint directory (model.safetensors), OUT/logits.bin float32 [T, V],
//   OUT/tokens.bin int32 [T], OUT/config.json (the model section), OUT/hf_fp32 and OUT/hf_bf16
//   (`exatrain export --format hf` of the checkpoint).
// Usage: ckpt_logits_driver OUT_DIR gpt2|llama|llama_nobias
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/export.hpp"
#include "data/prepare.hpp"
#include "job/parse.hpp"
#include "model/gpt.hpp"
#include "train/session.hpp"
#include "train/state_io.hpp"

using namespace exatrain;

int main(int argc, char** argv) {
  if (argc != 3) return fmt::print(stderr, "usage: {} OUT_DIR gpt2|llama|llama_nobias\n", argv[0]), 2;
  const std::string out = argv[1], variant = argv[2];
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  {
    std::ofstream text(out + "/text.txt");
    for (int i = 0; i < 200; ++i) text << "sentence number " << i << " goes here, with words.\n";
  }
  data::PrepareOptions po;
  po.inputs = {out + "/text.txt"};
  po.out_dir = out + "/data";
  po.tokenizer = "byte";
  po.progress = false;
  data::prepare_dataset(po);

  std::string model = variant == "gpt2"
      ? "layers = 2\nhidden = 32\nheads = 4\nseq_len = 16\ntie_embeddings = true\n"
      : "layers = 2\nhidden = 32\nheads = 4\nkv_heads = 2\nseq_len = 16\nactivation = \"swiglu\"\n"
        "norm = \"rmsnorm\"\nposition = \"rope\"\ntie_embeddings = false\nffn_hidden = 48\n";
  if (variant == "llama_nobias") model += "bias = false\n";  // as the real Llama
  Job job = parse_job(fmt::format("[model]\n{}[parallel]\nglobal_batch = 2\n[train]\nsteps = 3\nthreads = 1\n"
                                  "lr = 1e-2\ndata = \"{}\"\nrun_dir = \"{}/run\"\n", model, po.out_dir, out),
                      "ckpt_logits.toml");
  TrainRunOptions o;
  o.interactive = 0;
  o.out = stderr;
  TrainRunResult r = run_training(job, o);

  // Our logits from the checkpoint's weights, through the same loading path as `sample`.
  checkpoint::CheckpointReader reader(r.last_checkpoint);
  Job saved = parse_job(reader.blob("job.toml"), "job.toml");
  std::unique_ptr<Backend> be_owner = make_cpu_backend(1);
  Backend& be = *be_owner;
  GptOptions go;
  go.model = saved.model;
  go.micro_batch = 1;
  Gpt gpt(be, go);
  load_model_params(reader, be, gpt);
  const int64_t T = saved.model.seq_len, V = saved.model.vocab;
  std::vector<int32_t> tokens(static_cast<size_t>(T)), targets(static_cast<size_t>(T), 0);
  for (int64_t i = 0; i < T; ++i) tokens[size_t(i)] = int32_t((i * 37 + 11) % V);
  gpt.forward(tokens.data(), nullptr, targets.data());
  const std::vector<float> logits = gpt.download_logits();  // [T, V]
  std::ofstream(out + "/logits.bin", std::ios::binary).write(reinterpret_cast<const char*>(logits.data()),
                                                             std::streamsize(logits.size() * sizeof(float)));
  std::ofstream(out + "/tokens.bin", std::ios::binary).write(reinterpret_cast<char*>(tokens.data()),
                                                             std::streamsize(tokens.size() * sizeof(int32_t)));
  const ModelSpec& m = saved.model;
  nlohmann::json cfg = {{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads}, {"kv_heads", m.kv_heads},
                        {"seq_len", m.seq_len}, {"vocab", m.vocab}, {"activation", to_string(m.activation)},
                        {"norm", to_string(m.norm)}, {"position", to_string(m.position)},
                        {"norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta}, {"bias", m.bias},
                        {"checkpoint", r.last_checkpoint}};
  std::ofstream(out + "/config.json") << cfg.dump(2);
  // Hugging Face exports of the same checkpoint, in both dtypes.
  for (const char* dtype : {"fp32", "bf16"}) {
    checkpoint::ExportOptions eo;
    eo.format = "hf";
    eo.dtype = dtype;
    eo.out_dir = out + "/hf_" + dtype;
    checkpoint::export_checkpoint(r.last_checkpoint, eo);
  }
  return 0;
}
