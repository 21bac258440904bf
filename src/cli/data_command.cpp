// `exatrain data prepare` (text -> tokenizer + shards + manifest) and `exatrain data verify`
// (checks a prepared directory: sizes, checksums, token ids; prints a summary).
#include <cstdio>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "data/loader.hpp"
#include "data/manifest.hpp"
#include "data/prepare.hpp"

namespace exatrain::cli {

void add_data_command(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "prepare and check token datasets");
  data->require_subcommand(1);

  auto prep = std::make_shared<data::PrepareOptions>();
  CLI::App* p = data->add_subcommand(
      "prepare", "tokenize text files into token shards (SentencePiece BPE or bytes)");
  p->add_option("--input", prep->inputs, "text files (.xz and .gz are read through xz/gzip)")
      ->required();
  p->add_option("--out", prep->out_dir, "output directory")->required();
  p->add_option("--tokenizer", prep->tokenizer, "bpe (SentencePiece) or byte")
      ->check(CLI::IsMember({"bpe", "byte"}))
      ->capture_default_str();
  p->add_option("--vocab-size", prep->vocab_size, "BPE vocabulary size")->capture_default_str();
  p->add_option("--sample-lines", prep->sample_lines,
                "lines sampled (seeded reservoir) to train the tokenizer")
      ->capture_default_str();
  p->add_option("--shard-tokens", prep->shard_tokens, "tokens per shard")->capture_default_str();
  p->add_option("--seed", prep->seed, "seed of the tokenizer sample")->capture_default_str();
  p->add_flag("--verbose-tokenizer", prep->verbose_tokenizer, "show SentencePiece's training log");
  auto reuse = std::make_shared<bool>(false);
  p->add_flag("--reuse", *reuse,
              "do nothing when --out already holds this preparation (same inputs and settings)");
  p->callback([prep, reuse] {
    bool reused = false;
    data::DatasetManifest m =
        *reuse ? data::prepare_if_needed(*prep, &reused) : data::prepare_dataset(*prep);
    fmt::print("{} {}: {} tokens in {} shard(s), tokenizer {} (vocab {}), {} bytes/token\n",
               reused ? "reusing" : "prepared", prep->out_dir, m.total_tokens, m.shards.size(),
               m.tokenizer_type, m.vocab_size, m.token_bytes);
  });

  auto dir = std::make_shared<std::string>();
  CLI::App* v = data->add_subcommand(
      "verify", "check a prepared dataset (sizes, sha256 checksums, token ids) and summarise it");
  v->add_option("DIR", *dir, "directory written by `exatrain data prepare`")->required();
  v->callback([dir] {
    data::LoaderOptions lo;
    lo.seq_len = 1;
    lo.val_fraction = 0;
    data::TokenLoader loader(*dir, lo);  // verifies the shards on open
    data::open_dataset_tokenizer(*dir);   // and the tokenizer against its checksum
    const auto& m = loader.manifest();
    fmt::print("{}: OK: {} tokens in {} shard(s), tokenizer {} (vocab {}), {} input file(s)\n",
               *dir, m.total_tokens, m.shards.size(), m.tokenizer_type, m.vocab_size,
               m.inputs.size());
  });
}

}  // namespace exatrain::cli
