#include "data/manifest.hpp"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
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

DatasetManifest manifest_from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    EXA_FAIL("{} is not valid JSON: {}", source, e.what());
  }
  DatasetManifest m;
  try {
    EXA_CHECK(j.at("format") == "exatrain-token-shards",
              "{}: \"format\" is {}, expected \"exatrain-token-shards\"", source,
              j.at("format").dump());
    EXA_CHECK(j.at("version") == 1, "{}: \"version\" is {}, expected 1", source,
              j.at("version").dump());
    const json& t = j.at("tokenizer");
    m.tokenizer_type = t.at("type");
    m.tokenizer_file = t.at("file");
    m.tokenizer_sha256 = t.at("sha256");
    m.vocab_size = t.at("vocab_size");
    m.separator_id = t.at("separator_id");
    m.token_bytes = j.at("token_bytes");
    m.total_tokens = j.at("total_tokens");
    for (const json& s : j.at("shards")) {
      m.shards.push_back({s.at("file"), s.at("tokens"), s.at("bytes"), s.at("sha256")});
    }
    for (const json& in : j.at("inputs")) {
      m.inputs.push_back({in.at("path"), in.at("bytes"), in.at("lines"), in.at("file_bytes")});
    }
    const json& st = j.at("settings");
    m.vocab_size_requested = st.at("vocab_size_requested");
    m.sample_lines = st.at("sample_lines");
    m.sample_lines_used = st.at("sample_lines_used");
    m.seed = st.at("seed");
    m.shard_tokens = st.at("shard_tokens");
  } catch (const json::exception& e) {
    EXA_FAIL("{}: missing or mistyped field: {}", source, e.what());
  }
  EXA_CHECK(m.tokenizer_type == "byte" || m.tokenizer_type == "sentencepiece-bpe",
            "{}: tokenizer type \"{}\", expected \"byte\" or \"sentencepiece-bpe\"", source,
            m.tokenizer_type);
  EXA_CHECK(m.token_bytes == 2 || m.token_bytes == 4, "{}: token_bytes {}, expected 2 or 4",
            source, m.token_bytes);
  uint64_t sum = 0;
  for (const auto& s : m.shards) sum += s.tokens;
  EXA_CHECK(sum == m.total_tokens, "{}: shards hold {} tokens but total_tokens is {}", source, sum,
            m.total_tokens);
  return m;
}

DatasetManifest read_manifest(const std::string& dataset_dir) {
  std::string path = (std::filesystem::path(dataset_dir) / kManifestName).string();
  EXA_CHECK(std::filesystem::exists(path),
            "{} not found: is {} a directory written by `exatrain data prepare` (and did it "
            "finish)?",
            path, dataset_dir);
  return manifest_from_json(read_file_bytes(path), path);
}

std::string read_dataset_tokenizer_model(const std::string& dataset_dir) {
  DatasetManifest m = read_manifest(dataset_dir);
  if (m.tokenizer_type == "byte") return "";
  std::string path = (std::filesystem::path(dataset_dir) / m.tokenizer_file).string();
  std::string bytes = read_file_bytes(path);
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
