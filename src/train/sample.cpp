#include "train/sample.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "checkpoint/checkpoint.hpp"
#include "core/check.hpp"
#include "data/tokenizer.hpp"
#include "job/parse.hpp"
#include "model/gpt.hpp"
#include "plan/flops.hpp"
#include "train/state_io.hpp"

namespace exatrain {

SampleResult sample_from_checkpoint(const std::string& dir, const SampleOptions& so) {
  EXA_CHECK(so.temperature >= 0, "sample: --temperature {}: expected a number >= 0 (0 = greedy)", so.temperature);
  EXA_CHECK(so.top_k >= 0, "sample: --top-k {}: expected an integer >= 0 (0 = the whole vocabulary)", so.top_k);
  EXA_CHECK(so.max_new_tokens >= 1, "sample: --tokens {}: expected at least 1", so.max_new_tokens);
  checkpoint::CheckpointReader reader(dir);  // verifies every file
  Job job = parse_job(reader.blob("job.toml"), dir + "/job.toml");
  int64_t step = 0;
  const TrainerExtras extras = read_trainer_blobs(reader, &step);  // fields checked
  EXA_CHECK(extras.tokenizer_type == "byte" || !extras.tokenizer_model.empty(),
            "checkpoint {}: its tokenizer is \"{}\" but it has no tokenizer.model: expected the byte tokenizer or "
            "a SentencePiece model", dir, extras.tokenizer_type);
  std::unique_ptr<data::Tokenizer> tok =
      extras.tokenizer_type == "byte"
          ? data::make_byte_tokenizer()
          : data::make_sentencepiece_tokenizer(extras.tokenizer_model, dir + "/tokenizer.model");
  // Every id the tokenizer makes must index the model's embedding.
  EXA_CHECK(int64_t(tok->vocab_size()) <= job.model.vocab,
            "checkpoint {}: its tokenizer has {} pieces but job.toml's [model] vocab = {}: token ids would fall "
            "outside the embedding; expected vocab >= {}", dir, tok->vocab_size(), job.model.vocab, tok->vocab_size());
  // The model job.toml describes must be the one the weights hold, before anything is allocated
  // for it: a job.toml may claim any size, the weights are in the file.
  auto weights = reader.safetensors("model.safetensors");
  int64_t held = 0;
  for (const auto& [name, info] : weights->tensors()) held += info.numel();  // each fits, sum bounded by the file
  const int64_t described = plan::total_parameters(job.model);  // checked: refuses a model too large to count
  EXA_CHECK(held == described, "checkpoint {}: job.toml describes a model of {} parameters, but model.safetensors "
            "holds {}: expected the weights of that model", dir, described, held);
  // Weights of a diverged run are refused (or, with --allow-nonfinite, sampled after a warning).
  if (const std::string bad = checkpoint::nonfinite_tensors(*weights); !bad.empty()) {
    const std::string msg = fmt::format("checkpoint {} holds non-finite weights (the run diverged?):{}", dir, bad);
    EXA_CHECK(so.allow_nonfinite, "sample: {}\nexpected finite weights; pass --allow-nonfinite to sample anyway", msg);
    std::fprintf(stderr, "exatrain: WARNING: %s\nexatrain: WARNING: sampling anyway (--allow-nonfinite)\n", msg.c_str());
  }

  // One sequence of the model's full context; causal attention means the padding after the
  // current position cannot influence the logits at it.
  const int64_t T = job.model.seq_len, V = job.model.vocab;
  std::unique_ptr<Backend> backend_owner = make_cpu_backend(so.threads > 0 ? so.threads : omp_get_num_procs());
  Backend& backend = *backend_owner;
  GptOptions go;
  go.model = job.model;
  go.micro_batch = 1;
  go.seq = T;
  Gpt model(backend, go);
  load_model_params(reader, backend, model);

  std::vector<uint32_t> ids;
  tok->encode(so.prompt, ids);
  EXA_CHECK(!ids.empty(), "sample: the prompt is empty; expected some text (--prompt TEXT)");
  SampleResult out;
  out.prompt_tokens = int64_t(ids.size());
  std::vector<int32_t> window(static_cast<size_t>(T), 0), targets(static_cast<size_t>(T), 0);
  std::mt19937_64 rng(so.seed);
  for (int64_t n = 0; n < so.max_new_tokens; ++n) {
    // The last T tokens (or fewer) form the context.
    const int64_t len = std::min<int64_t>(int64_t(ids.size()), T), start = int64_t(ids.size()) - len;
    for (int64_t i = 0; i < T; ++i) window[size_t(i)] = i < len ? int32_t(ids[size_t(start + i)]) : 0;
    model.forward(window.data(), nullptr, targets.data());
    const std::vector<float> logits = model.download_logits();  // [T, V]
    const float* row = logits.data() + (len - 1) * V;
    // Temperature and top-k, then a draw (argmax when temperature is 0).
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    int64_t k = so.top_k > 0 ? std::min<int64_t>(so.top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    int32_t next = order[0];
    if (so.temperature > 0) {
      std::vector<double> p(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) p[size_t(i)] = std::exp((row[order[size_t(i)]] - row[order[0]]) / so.temperature);
      std::discrete_distribution<int64_t> pick(p.begin(), p.end());
      next = order[size_t(pick(rng))];
    }
    ids.push_back(uint32_t(next));
    ++out.new_tokens;
  }
  out.text = tok->decode(ids);
  return out;
}

}  // namespace exatrain
