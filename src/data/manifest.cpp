#include "data/manifest.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/checked.hpp"
#include "core/json_fields.hpp"
#include "data/shard.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"

namespace exatrain::data {

using nlohmann::json;

std::string manifest_to_json(const DatasetManifest& m) {
  json j;
  j["format"] = "exatrain-token-shards";
  j["version"] = 1;
  j["tokenizer"] = {{"type", m.tokenizer_type},
                    {"file", m.tokenizer_file},
                    {"sha256", m.tokenizer_sha256},
                    {"vocab_size", m.vocab_size},
                    {"separator_id", m.separator_id}};
  j["token_bytes"] = m.token_bytes;
  j["dtype"] = m.token_bytes == 2 ? "uint16" : "uint32";
  j["total_tokens"] = m.total_tokens;
  j["shards"] = json::array();
  for (const auto& s : m.shards) {
    j["shards"].push_back(
        {{"file", s.file}, {"tokens", s.tokens}, {"bytes", s.bytes}, {"sha256", s.sha256}});
  }
  j["inputs"] = json::array();
  for (const auto& in : m.inputs) {
    j["inputs"].push_back({{"path", in.path},
                           {"bytes", in.bytes},
                           {"lines", in.lines},
                           {"file_bytes", in.file_bytes}});
  }
  j["settings"] = {{"vocab_size_requested", m.vocab_size_requested},
                   {"sample_lines", m.sample_lines},
                   {"sample_lines_used", m.sample_lines_used},
                   {"seed", m.seed},
                   {"shard_tokens", m.shard_tokens}};
  return j.dump(2) + "\n";
}

namespace {
// The shard list, each entry checked: a plain file name, a size that is exactly the header plus
// its tokens (computed without overflow), a SHA-256.
void read_shards(const json& shards, const std::string& source, DatasetManifest& m) {
  EXA_CHECK(shards.is_array(), "{}: \"shards\" must be an array", source);
  uint64_t sum = 0;
  for (size_t i = 0; i < shards.size(); i++) {
    const std::string where = fmt::format("{}: shards[{}]", source, i);
    const json& s = shards[i];
    ShardEntry e;
    e.file = json_to_string(json_member(s, "file", where), where + ".file");
    EXA_CHECK(is_plain_file_name(e.file), "{}.file = {}: expected a plain file name inside the dataset directory",
              where, json_shown(s["file"]));
    e.tokens = json_to_uint(json_member(s, "tokens", where), where + ".tokens");
    e.bytes = json_to_uint(json_member(s, "bytes", where), where + ".bytes");
    e.sha256 = json_to_sha256(json_member(s, "sha256", where), where + ".sha256");
    const auto body = mul_u64(e.tokens, m.token_bytes);
    const auto size = body ? add_u64(*body, kShardHeaderBytes) : std::nullopt;
    EXA_CHECK(size && *size == e.bytes,
              "{}: {} tokens of {} bytes need a file of {} + {} x {} bytes, but bytes = {}", where, e.tokens,
              m.token_bytes, kShardHeaderBytes, e.tokens, m.token_bytes, e.bytes);
    const auto next = add_u64(sum, e.tokens);
    EXA_CHECK(next.has_value(), "{}: the shards' token counts overflow a 64-bit count", source);
    sum = *next;
    m.shards.push_back(e);
  }
  EXA_CHECK(sum == m.total_tokens, "{}: shards hold {} tokens but total_tokens is {}", source, sum, m.total_tokens);
}

void read_tokenizer(const json& t, const std::string& source, DatasetManifest& m) {
  const std::string where = source + ": tokenizer";
  m.tokenizer_type = json_to_string(json_member(t, "type", where), where + ".type");
  EXA_CHECK(m.tokenizer_type == "byte" || m.tokenizer_type == "sentencepiece-bpe",
            "{}: tokenizer type \"{}\", expected \"byte\" or \"sentencepiece-bpe\"", source, m.tokenizer_type);
  m.tokenizer_file = json_to_string(json_member(t, "file", where), where + ".file");
  m.tokenizer_sha256 = json_to_string(json_member(t, "sha256", where), where + ".sha256");
  if (m.tokenizer_type == "sentencepiece-bpe") {
    EXA_CHECK(is_plain_file_name(m.tokenizer_file), "{}.file = {}: expected a plain file name inside the dataset "
              "directory", where, json_shown(t["file"]));
    json_to_sha256(t["sha256"], where + ".sha256");
  }
  m.vocab_size = uint32_t(json_to_uint(json_member(t, "vocab_size", where), where + ".vocab_size", 1, UINT32_MAX));
  m.separator_id = uint32_t(json_to_uint(json_member(t, "separator_id", where), where + ".separator_id", 0,
                                         m.vocab_size - 1));
}
}  // namespace

DatasetManifest manifest_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    EXA_FAIL("{} is not valid JSON: {}", source, e.what());
  }
  // Untrusted input (docs/security.md): every number an integer of the type and range expected,
  // every name a plain name, every size consistent; nothing wraps.
  DatasetManifest m;
  try {
    EXA_CHECK(json_member(j, "format", source) == "exatrain-token-shards",
              "{}: \"format\" is {}, expected \"exatrain-token-shards\"", source, json_shown(j.at("format")));
    EXA_CHECK(json_member(j, "version", source) == 1, "{}: \"version\" is {}, expected 1", source,
              json_shown(j.at("version")));
    read_tokenizer(json_member(j, "tokenizer", source), source, m);
    m.token_bytes = uint32_t(json_to_uint(json_member(j, "token_bytes", source), source + ": token_bytes", 2, 4));
    EXA_CHECK(m.token_bytes == 2 || m.token_bytes == 4, "{}: token_bytes {}, expected 2 or 4", source, m.token_bytes);
    EXA_CHECK(m.token_bytes == 4 || m.vocab_size <= 65536,
              "{}: token_bytes 2 holds ids below 65536, but vocab_size is {} (expected token_bytes 4)", source,
              m.vocab_size);
    m.total_tokens = json_to_uint(json_member(j, "total_tokens", source), source + ": total_tokens");
    read_shards(json_member(j, "shards", source), source, m);
    const json& inputs = json_member(j, "inputs", source);
    EXA_CHECK(inputs.is_array(), "{}: \"inputs\" must be an array", source);
    for (size_t i = 0; i < inputs.size(); i++) {
      const std::string w = fmt::format("{}: inputs[{}]", source, i);
      const json& in = inputs[i];
      m.inputs.push_back({json_to_string(json_member(in, "path", w), w + ".path"),
                          json_to_uint(json_member(in, "bytes", w), w + ".bytes"),
                          json_to_uint(json_member(in, "lines", w), w + ".lines"),
                          json_to_uint(json_member(in, "file_bytes", w), w + ".file_bytes")});
    }
    const std::string ws = source + ": settings";
    const json& st = json_member(j, "settings", source);
    m.vocab_size_requested =
        uint32_t(json_to_uint(json_member(st, "vocab_size_requested", ws), ws + ".vocab_size_requested", 0, UINT32_MAX));
    m.sample_lines = json_to_uint(json_member(st, "sample_lines", ws), ws + ".sample_lines");
    m.sample_lines_used = json_to_uint(json_member(st, "sample_lines_used", ws), ws + ".sample_lines_used");
    m.seed = json_to_uint(json_member(st, "seed", ws), ws + ".seed");
    m.shard_tokens = json_to_uint(json_member(st, "shard_tokens", ws), ws + ".shard_tokens");
  } catch (const json::exception& e) {
    EXA_FAIL("{}: missing or mistyped field: {}", source, e.what());
  }
  return m;
}

DatasetManifest read_manifest(const std::string& dataset_dir) {
  std::string path = (std::filesystem::path(dataset_dir) / kManifestName).string();
  EXA_CHECK(std::filesystem::exists(path),
            "{} not found: is {} a directory written by `exatrain data prepare` (and did it "
            "finish)?",
            path, dataset_dir);
  return manifest_from_json(read_file_bytes(path, kMaxManifestBytes), path);
}

std::string read_dataset_tokenizer_model(const std::string& dataset_dir) {
  DatasetManifest m = read_manifest(dataset_dir);
  if (m.tokenizer_type == "byte") return "";
  std::string path = (std::filesystem::path(dataset_dir) / m.tokenizer_file).string();
  std::string bytes = read_file_bytes(path, kMaxTokenizerBytes);
  std::string actual = sha256_hex(bytes);
  EXA_CHECK(actual == m.tokenizer_sha256,
            "tokenizer model {} is corrupted: sha256 {} but the manifest says {}", path, actual,
            m.tokenizer_sha256);
  return bytes;
}

std::unique_ptr<Tokenizer> open_dataset_tokenizer(const std::string& dataset_dir) {
  DatasetManifest m = read_manifest(dataset_dir);
  if (m.tokenizer_type == "byte") return make_byte_tokenizer();
  std::string path = (std::filesystem::path(dataset_dir) / m.tokenizer_file).string();
  std::string bytes = read_dataset_tokenizer_model(dataset_dir);
  auto tok = make_sentencepiece_tokenizer(bytes, path);
  EXA_CHECK(tok->vocab_size() == m.vocab_size,
            "tokenizer model {} has {} pieces but the manifest says vocab_size {}", path,
            tok->vocab_size(), m.vocab_size);
  return tok;
}

}  // namespace exatrain::data
