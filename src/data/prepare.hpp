// `exatrain data prepare`: text files -> tokenizer + token shards + manifest (docs/data.md).
// Streams the inputs twice (sample for the tokenizer, then tokenize), so memory stays bounded
// by the sample and one batch of lines, whatever the input size.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/manifest.hpp"

namespace exatrain::data {

struct PrepareOptions {
  std::vector<std::string> inputs;   // text files (.xz / .gz are decompressed on the fly)
  std::string out_dir;
  std::string tokenizer = "bpe";     // "bpe" (SentencePiece) | "byte"
  uint32_t vocab_size = 8192;        // bpe only; may come out smaller on a tiny input
  uint64_t sample_lines = 200000;    // lines sampled (reservoir, seeded) to train the tokenizer
  uint64_t shard_tokens = uint64_t(1) << 27;  // tokens per shard (the last may hold fewer)
  uint64_t seed = 1234;
  bool progress = true;              // progress lines on stderr
  bool verbose_tokenizer = false;    // SentencePiece's own training log
};

// Deterministic: the same inputs and options give byte-identical output files.
DatasetManifest prepare_dataset(const PrepareOptions& options);

// For `make run` and `train` on the bundled corpus: reuses options.out_dir when its manifest
// was made from the same input paths (with the same sizes on disk) and the same settings, and
// its files verify; otherwise prepares it. `*reused` tells which happened.
DatasetManifest prepare_if_needed(const PrepareOptions& options, bool* reused);

// corpus/kjv.txt.xz in the source tree (see corpus/README.md).
std::string bundled_corpus_path();

// The deterministic sample: reservoir sampling of non-empty lines (each cut to 4096 bytes at a
// UTF-8 boundary) with a seeded splitmix64 generator, returned in input order.
std::vector<std::string> sample_lines(const std::vector<std::string>& inputs, uint64_t max_lines,
                                      uint64_t seed, bool progress);

}  // namespace exatrain::data
