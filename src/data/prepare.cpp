#include "data/prepare.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "core/check.hpp"
#include "core/splitmix.hpp"
#include "core/fileio.hpp"
#include "data/shard.hpp"

namespace exatrain::data {

namespace fs = std::filesystem;

namespace {


// Cuts at most `max_bytes` without splitting a UTF-8 character.
void cut_utf8(std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return;
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n--;  // continuation byte
  s.resize(n);
}

// Rate-limited progress lines on stderr ("\r" updates on a terminal, plain lines otherwise).
class Progress {
 public:
  Progress(bool enabled, std::string stage) : enabled_(enabled), stage_(std::move(stage)) {
    tty_ = enabled && ::isatty(STDERR_FILENO);
  }
  void update(uint64_t bytes, uint64_t total_bytes, uint64_t tokens, bool final = false) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    double since = std::chrono::duration<double>(now - last_).count();
    if (!final && since < (tty_ ? 0.5 : 5.0)) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    std::string pct = total_bytes ? fmt::format(" ({:.0f}%)", 100.0 * bytes / total_bytes) : "";
    std::string tok = tokens ? fmt::format(", {:.2f} M tokens", tokens / 1e6) : "";
    std::fprintf(stderr, "%s%s: %.1f MB read%s%s, %.1f MB/s%s", tty_ ? "\r" : "",
                 stage_.c_str(), bytes / 1e6, pct.c_str(), tok.c_str(),
                 secs > 0 ? bytes / 1e6 / secs : 0.0, (tty_ && !final) ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_, tty_ = false;
  std::string stage_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

uint64_t total_plain_bytes(const std::vector<std::string>& inputs) {
  uint64_t total = 0;
  for (const auto& in : inputs) {
    if (in.ends_with(".xz") || in.ends_with(".gz")) return 0;  // unknown before decompressing
    total += file_size_or_throw(in);
  }
  return total;
}

}  // namespace

std::vector<std::string> sample_lines(const std::vector<std::string>& inputs, uint64_t max_lines,
                                      uint64_t seed, bool progress) {
  EXA_CHECK(max_lines > 0, "the tokenizer sample needs at least one line (sample_lines = 0)");
  struct Sampled {
    uint64_t index;
    std::string text;
  };
  std::vector<Sampled> reservoir;
  uint64_t rng = seed, seen = 0, bytes_before = 0;
  uint64_t total = total_plain_bytes(inputs);
  Progress bar(progress, "sample");
  std::string line;
  for (const auto& path : inputs) {
    // Pieces of at most 64 KiB: a line is sampled by its first 4096 bytes, so its rest is
    // skipped without ever being held whole (a single-line input of any size stays bounded).
    LineReader reader(path, size_t(1) << 16);
    bool line_end = true, line_start = true;
    while (reader.next(line, &line_end)) {
      const bool first_piece = line_start;
      line_start = line_end;
      if (!first_piece || line.empty()) continue;
      cut_utf8(line, 4096);
      if (reservoir.size() < max_lines) {
        reservoir.push_back({seen, line});
      } else {
        uint64_t j = splitmix64(rng) % (seen + 1);  // keep with probability max_lines/(seen+1)
        if (j < max_lines) reservoir[j] = {seen, line};
      }
      seen++;
      bar.update(bytes_before + reader.bytes_read(), total, 0);
    }
    bytes_before += reader.bytes_read();
  }
  bar.update(bytes_before, total, 0, true);
  std::sort(reservoir.begin(), reservoir.end(),
            [](const Sampled& a, const Sampled& b) { return a.index < b.index; });
  std::vector<std::string> out;
  out.reserve(reservoir.size());
  for (auto& s : reservoir) out.push_back(std::move(s.text));
  return out;
}

namespace {

std::string shard_name(size_t i) { return fmt::format("shard_{:05d}.bin", i); }

// The byte tokenizer, or SentencePiece BPE trained on a sample of the inputs and written beside
// the shards (its hash in the manifest).
std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o, DatasetManifest& m) {
  if (o.tokenizer == "byte") return make_byte_tokenizer();
  std::vector<std::string> sample = sample_lines(o.inputs, o.sample_lines, o.seed, o.progress);
  m.sample_lines_used = sample.size();
  if (o.progress) {
    std::fprintf(stderr, "tokenizer: training SentencePiece BPE (vocab %u) on %zu lines\n",
                 o.vocab_size, sample.size());
  }
  std::string model = train_sentencepiece(sample, {o.vocab_size, o.seed, o.verbose_tokenizer});
  m.tokenizer_file = kTokenizerModelName;
  m.tokenizer_sha256 = sha256_hex(model);
  write_file_atomic((fs::path(o.out_dir) / kTokenizerModelName).string(), model);
  return make_sentencepiece_tokenizer(model, kTokenizerModelName);
}

// Token ids into shards of o.shard_tokens tokens each, every closed shard recorded in the manifest.
class ShardSink {
 public:
  ShardSink(const PrepareOptions& o, DatasetManifest& m) : o_(o), m_(m) {}
  void append(const std::vector<uint32_t>& ids) {
    size_t done = 0;
    while (done < ids.size()) {
      if (!shard_) {
        shard_ = std::make_unique<ShardWriter>(
            (fs::path(o_.out_dir) / shard_name(m_.shards.size())).string(), m_.vocab_size);
      }
      uint64_t room = o_.shard_tokens - shard_->tokens();
      uint64_t take = std::min<uint64_t>(room, ids.size() - done);
      shard_->append(ids.data() + done, take);
      done += take;
      if (shard_->tokens() == o_.shard_tokens) close();
    }
  }
  void close() {  // the open shard, if any
    if (!shard_) return;
    ShardEntry e;
    e.file = shard_name(m_.shards.size());
    e.tokens = shard_->tokens();
    e.sha256 = shard_->finish();
    e.bytes = kShardHeaderBytes + e.tokens * m_.token_bytes;
    m_.total_tokens += e.tokens;
    m_.shards.push_back(e);
    shard_.reset();
  }
  uint64_t tokens() const { return m_.total_tokens + (shard_ ? shard_->tokens() : 0); }

 private:
  const PrepareOptions& o_;
  DatasetManifest& m_;
  std::unique_ptr<ShardWriter> shard_;
};

// Batches of line pieces encoded in parallel, appended in input order. A batch holds at most
// 4096 pieces and 4 MiB of text; a piece is at most 1 MiB (LineReader::kDefaultMaxPiece; a longer
// line is tokenized piece by piece, its separator after the last piece), so memory stays bounded
// whatever the length of the input's lines: the batch's text, its ids (4 bytes per token, at most
// one token per byte) twice, and a shard's staging.
class BatchEncoder {
 public:
  static constexpr size_t kBatchLines = 4096, kBatchBytes = size_t(4) << 20;
  BatchEncoder(const Tokenizer& tok, ShardSink& sink) : tok_(tok), sink_(sink), encoded_(kBatchLines) {}
  // Adds a piece; true when the batch is full and was encoded.
  bool add(const std::string& piece, bool line_end) {
    bytes_ += piece.size();
    batch_.push_back(piece);
    ends_.push_back(line_end);
    if (batch_.size() < kBatchLines && bytes_ < kBatchBytes) return false;
    encode();
    return true;
  }
  void encode() {
    const int64_t n = int64_t(batch_.size());
    std::string error;  // an exception must not escape the parallel region
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < n; i++) {
      encoded_[i].clear();
      try {
        tok_.encode(batch_[i], encoded_[i]);
      } catch (const std::exception& e) {
#pragma omp critical
        error = e.what();
      }
      if (ends_[size_t(i)]) encoded_[i].push_back(tok_.separator_id());
    }
    EXA_CHECK(error.empty(), "data prepare: tokenizing failed: {}", error);
    flat_.clear();
    for (int64_t i = 0; i < n; i++) {
      flat_.insert(flat_.end(), encoded_[i].begin(), encoded_[i].end());
      // A slot that held a long piece gives its memory back: slots must not each keep the
      // largest piece they ever saw (4096 of them).
      if (encoded_[i].capacity() > (size_t(1) << 16)) std::vector<uint32_t>().swap(encoded_[i]);
    }
    sink_.append(flat_);
    batch_.clear();
    ends_.clear();
    bytes_ = 0;
  }

 private:
  const Tokenizer& tok_;
  ShardSink& sink_;
  std::vector<std::string> batch_;
  std::vector<char> ends_;  // does batch_[i] end its line (then the separator follows it)?
  size_t bytes_ = 0;
  std::vector<std::vector<uint32_t>> encoded_;
  std::vector<uint32_t> flat_;
};

}  // namespace

DatasetManifest prepare_dataset(const PrepareOptions& o) {
  EXA_CHECK(!o.inputs.empty(), "data prepare: no --input files given");
  EXA_CHECK(o.tokenizer == "bpe" || o.tokenizer == "byte",
            "data prepare: --tokenizer is \"{}\", expected \"bpe\" or \"byte\"", o.tokenizer);
  EXA_CHECK(o.shard_tokens > 0, "data prepare: --shard-tokens must be positive");
  for (const auto& in : o.inputs) {
    EXA_CHECK(fs::is_regular_file(in), "data prepare: input {} does not exist or is not a file",
              in);
  }
  make_directories(o.out_dir, "data prepare --out");
  // A stale manifest would describe old shards: remove it first, write the new one last.
  fs::remove(fs::path(o.out_dir) / kManifestName);

  DatasetManifest m;
  m.vocab_size_requested = o.tokenizer == "bpe" ? o.vocab_size : 256;
  m.sample_lines = o.sample_lines;
  m.seed = o.seed;
  m.shard_tokens = o.shard_tokens;
  std::unique_ptr<Tokenizer> tok = make_tokenizer(o, m);
  m.tokenizer_type = tok->type();
  m.vocab_size = tok->vocab_size();
  m.separator_id = tok->separator_id();
  m.token_bytes = token_bytes_for_vocab(m.vocab_size);

  ShardSink shards(o, m);
  BatchEncoder encoder(*tok, shards);
  uint64_t total = total_plain_bytes(o.inputs), bytes_before = 0;
  Progress bar(o.progress, "tokenize");
  for (const auto& path : o.inputs) {
    LineReader reader(path);
    InputEntry entry{path, 0, 0, file_size_or_throw(path)};
    std::string line;
    bool line_end = true;
    while (reader.next(line, &line_end)) {
      if (line_end) entry.lines++;
      if (encoder.add(line, line_end)) bar.update(bytes_before + reader.bytes_read(), total, shards.tokens());
    }
    encoder.encode();  // a batch never spans two files: the per-file line counts stay exact
    entry.bytes = reader.bytes_read();
    bytes_before += entry.bytes;
    m.inputs.push_back(entry);
  }
  shards.close();
  bar.update(bytes_before, total, m.total_tokens, true);
  EXA_CHECK(m.total_tokens > 0, "data prepare: the inputs hold no text");

  // Shards left by an earlier, larger preparation into the same directory would mislead.
  for (size_t i = m.shards.size();; i++) {
    if (!fs::remove(fs::path(o.out_dir) / shard_name(i))) break;
  }
  write_file_atomic((fs::path(o.out_dir) / kManifestName).string(), manifest_to_json(m));
  return m;
}

// The same input named another way (`make run`'s relative corpus/kjv.txt.xz, `train`'s absolute
// bundled path, a path through a symlink) is the same input: without this, the two rebuilt the
// cache in turn, and two processes could rewrite it at once. A relative recorded path resolves
// against the current directory; if that names another file, the sizes below still differ.
static bool same_input_path(const std::string& recorded, const std::string& given) {
  if (recorded == given) return true;
  std::error_code ea, eb;
  const fs::path a = fs::weakly_canonical(recorded, ea), b = fs::weakly_canonical(given, eb);
  return !ea && !eb && a == b;
}

DatasetManifest prepare_if_needed(const PrepareOptions& o, bool* reused) {
  if (reused) *reused = false;
  fs::path manifest_path = fs::path(o.out_dir) / kManifestName;
  if (fs::exists(manifest_path)) {
    try {
      DatasetManifest m = read_manifest(o.out_dir);
      bool same = m.inputs.size() == o.inputs.size() &&
                  m.vocab_size_requested == (o.tokenizer == "bpe" ? o.vocab_size : 256) &&
                  (m.tokenizer_type == "byte") == (o.tokenizer == "byte") &&
                  m.sample_lines == o.sample_lines && m.seed == o.seed &&
                  m.shard_tokens == o.shard_tokens;
      for (size_t i = 0; same && i < o.inputs.size(); i++) {
        same = same_input_path(m.inputs[i].path, o.inputs[i]) &&
               m.inputs[i].file_bytes == file_size_or_throw(o.inputs[i]);
      }
      if (same) {
        for (const auto& s : m.shards) {  // sizes only: the loader verifies the checksums
          fs::path p = fs::path(o.out_dir) / s.file;
          same = same && fs::exists(p) && file_size_or_throw(p.string()) == s.bytes;
        }
      }
      if (same) {
        if (reused) *reused = true;
        return m;
      }
    } catch (const Error&) {
      // An unreadable cache is rebuilt below.
    }
  }
  return prepare_dataset(o);
}

std::string bundled_corpus_path() { return std::string(EXATRAIN_SOURCE_DIR) + "/corpus/kjv.txt.xz"; }

}  // namespace exatrain::data
