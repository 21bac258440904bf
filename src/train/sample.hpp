// `exatrain sample CKPT --prompt TEXT`: text generation from a checkpoint (temperature, top-k).
#pragma once
#include <cstdint>
#include <string>

namespace exatrain {

struct SampleOptions {
  std::string prompt;
  int64_t max_new_tokens = 100;
  double temperature = 0.8;  // 0 = greedy
  int64_t top_k = 40;        // 0 = the whole vocabulary
  uint64_t seed = 1234;
  int threads = 0;           // 0 = all cores
  bool allow_nonfinite = false;  // NaN/Inf weights: a loud warning instead of an error
};

struct SampleResult {
  std::string text;          // the prompt followed by the generated continuation
  int64_t prompt_tokens = 0, new_tokens = 0;
};

SampleResult sample_from_checkpoint(const std::string& checkpoint_dir, const SampleOptions& options);

}  // namespace exatrain
