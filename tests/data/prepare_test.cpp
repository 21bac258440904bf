// `data prepare`: exact shard contents (byte tokenizer), the binary format, multi-shard output,
// determinism (byte-identical reruns, any thread count), BPE round trips, compressed inputs.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"
#include "data/manifest.hpp"
#include "data/prepare.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "../test_util/temp_dir.hpp"

using namespace exatrain;
using namespace exatrain::data;

namespace {

const std::string kCorpus = std::string(EXATRAIN_SOURCE_DIR) + "/corpus/kjv.txt.xz";

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The first `n` lines of the bundled corpus, as one text with '\n' after each line.
std::string corpus_head(size_t n) {
  LineReader reader(kCorpus);
  std::string line, text;
  for (size_t i = 0; i < n && reader.next(line); i++) text += line + "\n";
  return text;
}

// All tokens of a prepared dataset, read straight from the shard files.
std::vector<uint32_t> read_all_tokens(const std::string& dir) {
  DatasetManifest m = read_manifest(dir);
  std::vector<uint32_t> out;
  for (const auto& s : m.shards) {
    std::string bytes = read_file_bytes(dir + "/" + s.file);
    ShardHeader h = parse_shard_header(s.file, reinterpret_cast<const uint8_t*>(bytes.data()),
                                       bytes.size());
    for (uint64_t i = 0; i < h.tokens; i++) {
      uint32_t v = 0;
      std::memcpy(&v, bytes.data() + kShardHeaderBytes + i * h.token_bytes, h.token_bytes);
      out.push_back(v);
    }
  }
  return out;
}

PrepareOptions options(const std::string& input, const std::string& out) {
  PrepareOptions o;
  o.inputs = {input};
  o.out_dir = out;
  o.progress = false;
  return o;
}

}  // namespace

TEST(Prepare, ByteTokenizerShardsHoldExactlyTheTextBytes) {
  TempDir dir;
  std::string text = "Hello, world.\n\nSecond line: caf\xc3\xa9\nno trailing newline";
  write_text(dir / "in.txt", text);
  PrepareOptions o = options(dir / "in.txt", dir / "out");
  o.tokenizer = "byte";
  o.shard_tokens = 10;  // several shards, split mid-line
  DatasetManifest m = prepare_dataset(o);

  std::string expected = text + "\n";  // every line ends with the separator, the last too
  EXPECT_EQ(m.total_tokens, expected.size());
  EXPECT_EQ(m.shards.size(), (expected.size() + 9) / 10);
  EXPECT_EQ(m.vocab_size, 256u);
  EXPECT_EQ(m.token_bytes, 2u);
  EXPECT_EQ(m.inputs.at(0).lines, 4u);
  std::vector<uint32_t> tokens = read_all_tokens(dir / "out");
  ASSERT_EQ(tokens.size(), expected.size());
  for (size_t i = 0; i < expected.size(); i++) {
    EXPECT_EQ(tokens[i], uint32_t(static_cast<unsigned char>(expected[i]))) << "token " << i;
  }
  // Each shard's recorded checksum and size are those of the file on disk.
  for (const auto& s : m.shards) {
    EXPECT_EQ(sha256_file(dir / "out/" + s.file), s.sha256);
    EXPECT_EQ(file_size_or_throw(dir / "out/" + s.file), s.bytes);
  }
}

TEST(Prepare, ShardHeaderLayoutIsAsDocumented) {
  TempDir dir;
  write_text(dir / "in.txt", "abc\n");
  PrepareOptions o = options(dir / "in.txt", dir / "out");
  o.tokenizer = "byte";
  prepare_dataset(o);
  std::string b = read_file_bytes(dir / "out/shard_00000.bin");
  ASSERT_EQ(b.size(), 64u + 4 * 2);
  EXPECT_EQ(std::memcmp(b.data(), "EXATOKS\0", 8), 0);
  auto u32 = [&](size_t off) { uint32_t v; std::memcpy(&v, b.data() + off, 4); return v; };
  uint64_t count;
  std::memcpy(&count, b.data() + 16, 8);
  EXPECT_EQ(u32(8), 1u);    // version
  EXPECT_EQ(u32(12), 2u);   // token bytes
  EXPECT_EQ(count, 4u);     // "abc" + '\n'
  EXPECT_EQ(u32(24), 256u); // vocab
  EXPECT_EQ(u32(28), 64u);  // header bytes
  EXPECT_EQ(uint8_t(b[64]), 'a');
  EXPECT_EQ(uint8_t(b[70]), '\n');
}

TEST(Prepare, BpeIsDeterministicAndRoundTrips) {
  TempDir dir;
  std::string text = corpus_head(1500);
  write_text(dir / "in.txt", text);
  PrepareOptions o = options(dir / "in.txt", dir / "a");
  o.vocab_size = 600;
  o.sample_lines = 700;  // a real sample: fewer lines than the input
  omp_set_num_threads(2);
  DatasetManifest a = prepare_dataset(o);
  o.out_dir = dir / "b";
  omp_set_num_threads(1);
  DatasetManifest b = prepare_dataset(o);
  omp_set_num_threads(2);

  EXPECT_EQ(a.sample_lines_used, 700u);
  EXPECT_EQ(a.tokenizer_type, "sentencepiece-bpe");
  EXPECT_LE(a.vocab_size, 600u);
  EXPECT_GT(a.vocab_size, 500u);
  for (const char* f : {"manifest.json", "tokenizer.model", "shard_00000.bin"}) {
    EXPECT_EQ(read_file_bytes(dir / "a/" + std::string(f)),
              read_file_bytes(dir / "b/" + std::string(f)))
        << f << " differs between two identical runs";
  }
  // BPE compresses: clearly fewer tokens than bytes.
  EXPECT_LT(a.total_tokens, text.size() / 2);
  // Decoding the shards gives back the input text exactly.
  auto tok = open_dataset_tokenizer(dir / "a");
  EXPECT_EQ(tok->decode(read_all_tokens(dir / "a")), text);
  // Byte fallback: a character never seen in training still round-trips.
  std::vector<uint32_t> ids;
  std::string snow = "snow \xe2\x98\x83 man";
  tok->encode(snow, ids);
  EXPECT_EQ(tok->decode(ids), snow);
}

TEST(Prepare, CompressedInputGivesTheSameShards) {
  TempDir dir;
  write_text(dir / "in.txt", corpus_head(300));
  ASSERT_EQ(std::system(("xz -k -1 " + (dir / "in.txt")).c_str()), 0);
  ASSERT_EQ(std::system(("gzip -k " + (dir / "in.txt")).c_str()), 0);
  for (const char* ext : {"", ".xz", ".gz"}) {
    PrepareOptions o = options(dir / ("in.txt" + std::string(ext)), dir / ("out" + std::string(ext)));
    o.tokenizer = "byte";
    prepare_dataset(o);
  }
  std::string plain = read_file_bytes(dir / "out/shard_00000.bin");
  EXPECT_EQ(read_file_bytes(dir / "out.xz/shard_00000.bin"), plain);
  EXPECT_EQ(read_file_bytes(dir / "out.gz/shard_00000.bin"), plain);
}

TEST(Prepare, MissingOrBrokenInputIsNamed) {
  TempDir dir;
  PrepareOptions o = options(dir / "nope.txt", dir / "out");
  try {
    prepare_dataset(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.txt does not exist"), std::string::npos) << e.what();
  }
  write_text(dir / "bad.xz", "this is not xz data");
  o = options(dir / "bad.xz", dir / "out");
  o.tokenizer = "byte";
  try {
    prepare_dataset(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decompressing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.xz"), std::string::npos) << e.what();
  }
}

TEST(Prepare, SampleIsBoundedSeededAndInInputOrder) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; i++) text += "line " + std::to_string(i) + "\n";
  write_text(dir / "in.txt", text);
  auto s1 = sample_lines({dir / "in.txt"}, 100, 7, false);
  auto s2 = sample_lines({dir / "in.txt"}, 100, 7, false);
  auto s3 = sample_lines({dir / "in.txt"}, 100, 8, false);
  ASSERT_EQ(s1.size(), 100u);
  EXPECT_EQ(s1, s2);
  EXPECT_NE(s1, s3);
  int prev = -1, late = 0;
  for (const auto& l : s1) {
    int n = std::stoi(l.substr(5));
    EXPECT_GT(n, prev);  // input order
    prev = n;
    late += n >= 500;
  }
  EXPECT_GT(late, 25);  // drawn from the whole input, not just its head
}

TEST(Prepare, RerunIntoTheSameDirectoryLeavesNoStaleShards) {
  TempDir dir;
  write_text(dir / "in.txt", corpus_head(20));
  PrepareOptions o = options(dir / "in.txt", dir / "out");
  o.tokenizer = "byte";
  o.shard_tokens = 500;
  size_t many = prepare_dataset(o).shards.size();
  ASSERT_GT(many, 2u);
  o.shard_tokens = 1000000;
  EXPECT_EQ(prepare_dataset(o).shards.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir / "out/shard_00000.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out/shard_00001.bin"));
}

TEST(Prepare, PrepareIfNeededReusesOnlyAMatchingCache) {
  TempDir dir;
  write_text(dir / "in.txt", corpus_head(50));
  PrepareOptions o = options(dir / "in.txt", dir / "out");
  o.tokenizer = "byte";
  bool reused = true;
  DatasetManifest first = prepare_if_needed(o, &reused);
  EXPECT_FALSE(reused);
  EXPECT_EQ(first.inputs.at(0).file_bytes, file_size_or_throw(dir / "in.txt"));
  prepare_if_needed(o, &reused);
  EXPECT_TRUE(reused);
  o.shard_tokens = 100;  // other settings: rebuilt
  EXPECT_GT(prepare_if_needed(o, &reused).shards.size(), 1u);
  EXPECT_FALSE(reused);
  write_text(dir / "in.txt", corpus_head(60));  // the input changed: rebuilt
  EXPECT_GT(prepare_if_needed(o, &reused).total_tokens, first.total_tokens);
  EXPECT_FALSE(reused);
  EXPECT_TRUE(std::filesystem::exists(bundled_corpus_path()));
}

// `make run` prepares the bundled corpus as "corpus/kjv.txt.xz", `train` asks for it by its
// absolute path: the same file named another way (relative, absolute, through a symlink) reuses
// the cache instead of rebuilding it (they used to rebuild it in turn).
TEST(Prepare, PrepareIfNeededReusesTheSameInputNamedAnotherWay) {
  TempDir dir;
  write_text(dir / "in.txt", corpus_head(50));
  std::filesystem::create_symlink(dir.path, dir / "link");
  PrepareOptions o = options(dir / "in.txt", dir / "out");
  o.tokenizer = "byte";
  bool reused = true;
  prepare_if_needed(o, &reused);
  EXPECT_FALSE(reused);
  o.inputs = {dir / "link/in.txt"};  // through a symlink
  prepare_if_needed(o, &reused);
  EXPECT_TRUE(reused);
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path);
  o.inputs = {"./in.txt"};  // relative to the current directory
  prepare_if_needed(o, &reused);
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(reused);
  write_text(dir / "other.txt", corpus_head(50));  // another file of the same size: rebuilt
  o.inputs = {dir / "other.txt"};
  prepare_if_needed(o, &reused);
  EXPECT_FALSE(reused);
}

// A crafted tokenizer.model whose piece is zero bytes long makes libsentencepiece throw from its
// darts trie (found by fuzz/tokenizer_fuzz.cpp): an Error naming the model, not a crash.
TEST(Tokenizer, ACraftedModelThatLibsentencepieceThrowsOnIsNamed) {
  const std::string bytes = read_file_bytes("fuzz/regressions/tokenizer/zero_length_piece.model");
  std::string err;
  try {
    data::make_sentencepiece_tokenizer(bytes, "crafted/tokenizer.model");
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("SentencePiece model crafted/tokenizer.model: loading failed inside libsentencepiece: "),
            std::string::npos) << err;
}
