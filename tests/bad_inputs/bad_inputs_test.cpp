// Every input of ../shared/bad-inputs/ (copied into fuzz/corpus/ as seeds, and here) and the cases its
// README lists without a file: each gives a clear error naming the file, the key or tensor, the
// value and what was expected, never a crash or a silent acceptance. The end-to-end cases (the
// CLI, FIFOs, unwritable directories, a real run's checkpoints) are in tests/cli/bad_inputs.sh.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.hpp"
#include "cli/job_plan.hpp"
#include "core/sha256.hpp"
#include "data/loader.hpp"
#include "data/manifest.hpp"
#include "data/shard.hpp"
#include "job/parse.hpp"
#include "../test_util/error_of.hpp"
#include "../test_util/temp_dir.hpp"
#include "train/loss_scaler.hpp"
#include "train/resume_check.hpp"

using namespace exatrain;
namespace fs = std::filesystem;

namespace {

std::string corpus(const std::string& harness, const std::string& name) {
  return std::string(EXATRAIN_SOURCE_DIR) + "/fuzz/corpus/" + harness + "/" + name;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The problems `check` reports for a job file (the parser's and the catalog's).
std::string check_error(const std::string& file) {
  const std::string path = corpus("job", file);
  return error_of([&] { load_job(path, {}, cli::check_job_catalog); });
}

}  // namespace

// ---- job files -------------------------------------------------------------------------------

TEST(BadInputs, DeeplyNestedTomlIsRefusedNotAStackOverflow) {
  for (const char* f : {"job_deep_arrays.toml", "job_deep_inline_tables.toml"}) {
    const std::string e = check_error(f);
    EXPECT_TRUE(has(e, std::string(f) + ":2:")) << e;  // the line and column of the 33rd level
    EXPECT_TRUE(has(e, "not valid TOML: arrays and inline tables nested deeper than 32 levels")) << e;
  }
}

TEST(BadInputs, InvalidUtf8InALiteralStringIsRefused) {
  std::string e = check_error("job_literal_string_oob.toml");
  EXPECT_TRUE(has(e, "job_literal_string_oob.toml:2:11: not valid TOML: invalid UTF-8 (byte 0xea); TOML files are "
                     "UTF-8")) << e;
  e = check_error("fuzz_job_toml11_literal_string_oob.min");
  EXPECT_TRUE(has(e, "fuzz_job_toml11_literal_string_oob.min:1:2: not valid TOML: invalid UTF-8 (byte 0xea)")) << e;
}

TEST(BadInputs, IntegerOutOfRangeIsRefusedNotClamped) {
  const std::string e = check_error("job_seed_clamp.toml");
  EXPECT_TRUE(has(e, "job_seed_clamp.toml:2:8: not valid TOML: the integer 18446744073709551615 is outside the 64-bit "
                     "range of TOML integers (-2^63 .. 2^63-1); refused, not clamped")) << e;
  // Hexadecimal, negative and underscored forms too; the extremes still read.
  EXPECT_TRUE(has(error_of([] { parse_job("[train]\nseed = 0x1_0000_0000_0000_0000\n", "j.toml"); }),
                  "j.toml:2:8: not valid TOML: the integer 0x1_0000_0000_0000_0000 is outside"));
  EXPECT_TRUE(has(error_of([] { parse_job("[train]\nsteps = -9223372036854775809\n", "j.toml"); }),
                  "the integer -9223372036854775809 is outside"));
  EXPECT_TRUE(has(error_of([] { parse_job("[train]\nseed = 9_223_372_036_854_775_807\n", "j.toml"); }), ""));
  EXPECT_EQ(parse_job("[train]\nseed = 9_223_372_036_854_775_807\n", "j.toml").train.seed, uint64_t(INT64_MAX));
}

TEST(BadInputs, ModelTooLargeToCountIsRefusedWithTheFigure) {
  const std::string e = check_error("job_param_overflow.toml");
  EXPECT_TRUE(has(e, "job_param_overflow.toml: [model] layers = 100000, hidden = 1099511627776, ffn_hidden = "
                     "4398046511104, vocab = 1099511627776: the model has 1.45e+30 parameters, more than the "
                     "7.21e+16 (2^56) that exatrain counts")) << e;
}

TEST(BadInputs, PresetIsANameNotAPath) {
  std::string e = check_error("job_preset_traversal.toml");
  EXPECT_TRUE(has(e, "job_preset_traversal.toml: [model] preset = \"../jobs/default\": expected the name of a preset "
                     "in models/ (one of: gpt2, ")) << e;
  EXPECT_TRUE(has(e, "a file of your own goes in preset_file = \"PATH\"")) << e;
  // The NUL is shown escaped, the message is whole, and it is reported once.
  e = check_error("job_nul_in_preset.toml");
  EXPECT_TRUE(has(e, "1 problem in job")) << e;
  EXPECT_TRUE(has(e, "[model] preset = \"gpt2.toml\\u0000junk\": expected a string without NUL characters")) << e;
}

TEST(BadInputs, PresetFileIsAnExplicitPath) {
  TempDir dir;
  std::ofstream(dir / "mine.toml") << "[model]\nlayers = 3\nhidden = 96\nheads = 4\n";
  std::ofstream(dir / "job.toml") << "[model]\npreset_file = \"mine.toml\"\nlayers = 5\n";
  const Job j = load_job(dir / "job.toml");  // relative to the job file's directory
  EXPECT_EQ(j.model.preset_file, "mine.toml");
  EXPECT_EQ(j.model.hidden, 96);
  EXPECT_EQ(j.model.layers, 5);  // the file's keys override the preset file's
  EXPECT_EQ(j.origins.at("model.hidden"), dir / "mine.toml");
  std::ofstream(dir / "both.toml") << "[model]\npreset = \"gpt2\"\npreset_file = \"mine.toml\"\n";
  EXPECT_TRUE(has(error_of([&] { load_job(dir / "both.toml"); }), "expected one of them")) << "both";
}

TEST(BadInputs, UnknownDeviceIsRefusedByEveryCommand) {
  const std::string e = check_error("job_device_unknown.toml");
  EXPECT_TRUE(has(e, "job_device_unknown.toml: [machine] device = \"tpu-v9\": expected a device of ")) << e;
  EXPECT_TRUE(has(e, "devices.toml (a100-40g, ")) << e;
}

TEST(BadInputs, NewlineInRunDirRoundTrips) {
  const Job a = load_job(corpus("job", "job_run_dir_newline.toml"));
  ASSERT_NE(a.train.run_dir.find('\n'), std::string::npos);
  const Job b = parse_job(job_to_toml(a), "written.toml");
  EXPECT_EQ(b.train.run_dir, a.train.run_dir);
  EXPECT_TRUE(same_settings(a, b));
}

TEST(BadInputs, ResolvedJobReadsBack) {
  // ffn_hidden defaults to 4 * hidden, which the parser's limit now always admits; `check` refuses
  // this model for its size, with the figure (it has 1.09e25 parameters).
  const Job a = load_job(corpus("job", "job_roundtrip_ffn_min.toml"));
  EXPECT_EQ(a.model.ffn_hidden, 4 * a.model.hidden);
  EXPECT_TRUE(same_settings(a, parse_job(job_to_toml(a), "written.toml")));
  EXPECT_TRUE(has(check_error("job_roundtrip_ffn_min.toml"), "the model has 1.09e+25 parameters"));
}

TEST(BadInputs, EmptyRunDirAndBadPlainWordsAreRefused) {
  EXPECT_TRUE(has(error_of([] { parse_job("[train]\nrun_dir = \"\"\n", "j.toml"); }),
                  "j.toml: [train] run_dir = \"\": expected a non-empty string"));
  EXPECT_TRUE(has(error_of([] { parse_job("", "j.toml", {"train.run_dir=a' # b"}); }),
                  "--set train.run_dir=a' # b: the value is neither a TOML value nor a plain word"));
  EXPECT_EQ(parse_job("", "j.toml", {"train.run_dir=runs/my run"}).train.run_dir, "runs/my run");
}

TEST(BadInputs, KeepCheckpointsZeroKeepsAll) {
  EXPECT_EQ(parse_job("[train]\nkeep_checkpoints = 0\n", "j.toml").train.keep_checkpoints, 0);
}

// ---- safetensors -----------------------------------------------------------------------------

namespace {
std::string st_error(const std::string& file, bool assemble = false) {
  const std::string path = corpus("safetensors", file);
  return error_of([&] {
    checkpoint::SafetensorsReader r(path);
    if (assemble)
      for (const auto& [name, info] : r.tensors()) checkpoint::assemble_global({&r}, name, nullptr);
  });
}
}  // namespace

TEST(BadInputs, SafetensorsShapesAreChecked) {
  std::string e = st_error("st_shape_overflow.safetensors");
  EXPECT_TRUE(has(e, "st_shape_overflow.safetensors: tensor \"w\": shape [4294967296, 4294967296] has more elements "
                     "than can be counted (or stored)")) << e;
  e = st_error("st_shape_negative.safetensors");
  EXPECT_TRUE(has(e, "st_shape_negative.safetensors: tensor \"w\" shape[0] = -2: expected an integer in [0, ")) << e;
}

TEST(BadInputs, SafetensorsSlicesAreCheckedAgainstTheGlobalShape) {
  std::string e = st_error("fuzz_st_assemble_global_oob.safetensors", true);
  EXPECT_TRUE(has(e, "exatrain.slices of tensor \"b\": the slice of shape [4] at offset [1] does not fit in the global "
                     "shape [4] (dimension 0: 1 + 4 > 4)")) << e;
  e = st_error("st_slice_neg_offset.safetensors");
  EXPECT_TRUE(has(e, "exatrain.slices of tensor \"w\" offset[1] = -3: expected an integer in [0, ")) << e;
  e = st_error("st_slice_offset_oob.safetensors");
  EXPECT_TRUE(has(e, "the slice of shape [2, 2] at offset [0, 100000] does not fit in the global shape [2, 2] "
                     "(dimension 1: 100000 + 2 > 2)")) << e;
  e = st_error("st_slice_rank_mismatch.safetensors");
  EXPECT_TRUE(has(e, "global shape [4] and offset [0] must have the rank of the tensor's shape [2, 2]")) << e;
}

TEST(BadInputs, SafetensorsLayoutErrorsStayRefused) {
  EXPECT_TRUE(has(st_error("st_dtype_odd.safetensors"), "tensor w has dtype F64, expected F32 or BF16"));
  EXPECT_TRUE(has(st_error("st_offsets_outside.safetensors"), "has data_offsets [0, 1099511627776], expected [0, 16]"));
  EXPECT_TRUE(has(st_error("st_offsets_overlap.safetensors"), "tensor b (shape [4], F32) has data_offsets [0, 16], "
                                                              "expected [16, 32]"));
}

TEST(BadInputs, SliceOffsetOf2Pow36IsRefused) {
  // A checkpoint whose exatrain.slices puts a tensor at offset 2^36 (export crashed on it).
  TempDir dir;
  const std::vector<float> w(8, 1.0f);
  checkpoint::SafetensorsWriter sw;
  sw.add("w", {2, 4}, w.data());
  write_safetensors(dir / "m.safetensors", sw);
  const std::string bytes = read(dir / "m.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  std::string header = bytes.substr(8, n);
  const std::string from = "\\\"offset\\\":[0,0]", to = "\\\"offset\\\":[68719476736,0]";
  ASSERT_NE(header.find(from), std::string::npos) << header;
  header.replace(header.find(from), from.size(), to);
  while (header.back() == ' ') header.pop_back();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char(uint8_t(header.size() >> (8 * i)));
  out += header + bytes.substr(8 + n);
  std::ofstream(dir / "bad.safetensors", std::ios::binary) << out;
  const std::string e = error_of([&] { checkpoint::SafetensorsReader r(dir / "bad.safetensors"); });
  EXPECT_TRUE(has(e, "the slice of shape [2, 4] at offset [68719476736, 0] does not fit in the global shape [2, 4]"))
      << e;
}

// ---- datasets --------------------------------------------------------------------------------

namespace {
// A dataset directory from the evil_wrap files of data_shard_count_wrap.tgz (kept in fuzz/corpus).
std::string evil_wrap(const TempDir& dir) {
  fs::copy_file(corpus("manifest", "data_shard_count_wrap_manifest.json"), dir / "manifest.json");
  fs::copy_file(corpus("shard", "data_shard_count_wrap_shard_00000.bin"), dir / "shard_00000.bin");
  fs::copy_file(corpus("tokenizer", "real_kjv_bpe4096.model"), dir / "tokenizer.model");
  return dir.path;
}
data::LoaderOptions verify_options() {
  data::LoaderOptions o;
  o.seq_len = 1;
  o.val_fraction = 0;
  return o;
}
}  // namespace

TEST(BadInputs, ShardTokenCountThatWrapsIsRefused) {
  TempDir dir;
  const std::string e = error_of([&] { data::TokenLoader l(evil_wrap(dir), verify_options()); });
  EXPECT_TRUE(has(e, "manifest.json: shards[0]: 9223372036854775808 tokens of 2 bytes need a file of 64 + "
                     "9223372036854775808 x 2 bytes, but bytes = 64")) << e;
  // The shard header alone, read as the loader reads it: the count is compared by division.
  const std::string shard = read(dir / "shard_00000.bin");
  const std::string h = error_of([&] {
    data::parse_shard_header("s.bin", reinterpret_cast<const uint8_t*>(shard.data()), shard.size());
  });
  EXPECT_TRUE(has(h, "token shard s.bin is truncated or damaged: 64 bytes on disk hold 0 tokens of 2 bytes, but the "
                     "header says 9223372036854775808 tokens")) << h;
}

TEST(BadInputs, ManifestNumbersOutOfRangeAreRefused) {
  const std::string good = read(corpus("manifest", "real_byte_manifest.json"));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return error_of([&] { data::manifest_from_json(j.dump(), "d/manifest.json"); });
  };
  std::string e = with([](nlohmann::json& j) { j["tokenizer"]["vocab_size"] = 1e300; });
  EXPECT_TRUE(has(e, "d/manifest.json: tokenizer.vocab_size = 1e+300: expected an integer in [1, 4294967295]")) << e;
  e = with([](nlohmann::json& j) { j["tokenizer"]["vocab_size"] = -1; });
  EXPECT_TRUE(has(e, "tokenizer.vocab_size = -1: expected an integer in [1, 4294967295]")) << e;
  e = with([](nlohmann::json& j) { j["token_bytes"] = (uint64_t(1) << 32) + 2; });
  EXPECT_TRUE(has(e, "d/manifest.json: token_bytes = 4294967298: expected an integer in [2, 4]")) << e;
  e = with([](nlohmann::json& j) { j["shards"][0]["file"] = "../../etc/passwd"; });
  EXPECT_TRUE(has(e, "shards[0].file = \"../../etc/passwd\": expected a plain file name inside the dataset")) << e;
  EXPECT_EQ(with([](nlohmann::json&) {}), "");  // the real one reads
}

// ---- trainer state ---------------------------------------------------------------------------

namespace {
// The trainer_state harness's dataset and job (fuzz/trainer_state_fuzz.cpp), whose valid state is
// fuzz/corpus/trainer_state/real_valid_state.json.
struct Resume {
  TempDir dir;
  Job job = parse_job("[model]\nseq_len = 4\n[parallel]\nglobal_batch = 2\n[train]\nsteps = 50\nseed = 7\n", "job.toml");
  Resume() {
    data::ShardWriter w(dir / "shard_00000.bin", 256);
    std::vector<uint32_t> ids(203);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = uint32_t((i * 37) % 256);
    w.append(ids.data(), ids.size());
    data::DatasetManifest m;
    m.tokenizer_type = "byte", m.vocab_size = 256, m.separator_id = 10, m.token_bytes = 2;
    m.shards.push_back({"shard_00000.bin", ids.size(), 64 + 2 * ids.size(), w.finish()});
    m.total_tokens = ids.size();
    std::ofstream(dir / "manifest.json") << data::manifest_to_json(m);
  }
  std::string error(const std::string& file) {
    data::LoaderOptions o;
    o.seq_len = 4, o.seed = 7, o.step_windows = 2;
    data::TokenLoader loader(dir.path, o);
    return error_of([&] {
      int64_t step = 0;
      const TrainerExtras s = parse_trainer_state(read(corpus("trainer_state", file)), "ck/trainer_state.json", &step);
      check_and_restore_cursor("ck", step, step, "", s.data_cursor_json, job, loader);
    });
  }
};
}  // namespace

TEST(BadInputs, TrainerStateIsCheckedAgainstTheJobAndData) {
  Resume r;
  EXPECT_EQ(r.error("real_valid_state.json"), "");
  std::string e = r.error("step_2pow62.json");
  EXPECT_TRUE(has(e, "ck/trainer_state.json: \"step\" = 4611686018427387904: expected an integer in [0, 1099511627776]"))
      << e;
  e = r.error("step_negative.json");
  EXPECT_TRUE(has(e, "ck/trainer_state.json: \"step\" = -5: expected an integer in [0, 1099511627776]")) << e;
  // One window short of the end: not a step boundary of the global batch 2 (resume crashed on it).
  e = r.error("cursor_one_window_short.json");
  EXPECT_TRUE(has(e, "data cursor \"position\" = 47 is not at a step boundary: expected a multiple of the global batch "
                     "(2 windows per step) in [0, 48]")) << e;
  e = r.error("cursor_epoch_beyond_step.json");
  EXPECT_TRUE(has(e, "checkpoint ck: the data cursor (epoch 11, position 20) does not fit step 10")) << e;
  e = r.error("cursor_position_float.json");
  EXPECT_TRUE(has(e, "data cursor \"position\" = 1e+300: expected an integer in [0, 48]")) << e;
}

// fp16's loss scaler in trainer_state.json (train/resume_check.cpp): format 2 with the hysteresis
// left, format 1 (before the hysteresis) without it, and the refusals naming the field.
TEST(BadInputs, TrainerStateLossScalerFormatsAndRanges) {
  Resume r;
  EXPECT_EQ(r.error("fp16_scaler_format2.json"), "");
  EXPECT_EQ(r.error("fp16_scaler_format1.json"), "");
  int64_t step = 0;
  const auto scaler = [&](const std::string& file) {
    return *parse_trainer_state(read(corpus("trainer_state", file)), "ck/trainer_state.json", &step).loss_scaler;
  };
  EXPECT_EQ(scaler("fp16_scaler_format2.json"), (LossScalerState{32768, 3, 2, 1}));
  EXPECT_EQ(scaler("fp16_scaler_format1.json"), (LossScalerState{32768, 3, 2, kHysteresisNotSaved}));
  const auto error = [&](const std::string& scaler_json) {
    return error_of([&] {
      parse_trainer_state("{\"step\": 1, \"data_cursor\": {}, \"loss_scaler\": " + scaler_json + "}",
                          "ck/trainer_state.json", &step);
    });
  };
  std::string e = error("{\"format\": 2, \"scale\": 8, \"good_steps\": 0, \"skipped_steps\": 0}");
  EXPECT_TRUE(has(e, "ck/trainer_state.json: \"loss_scaler\"")) << e;
  EXPECT_TRUE(has(e, "hysteresis_left")) << e;
  e = error("{\"format\": 2, \"scale\": 8, \"good_steps\": 0, \"skipped_steps\": 0, \"hysteresis_left\": -1}");
  EXPECT_TRUE(has(e, "ck/trainer_state.json: \"loss_scaler\".hysteresis_left = -1: expected an integer in [0, "
                     "2147483647]")) << e;
  e = error("{\"format\": 3, \"scale\": 8, \"good_steps\": 0, \"skipped_steps\": 0}");
  EXPECT_TRUE(has(e, "\"loss_scaler\".format = 3: expected 1 or 2")) << e;
}

TEST(BadInputs, TrainerStepBeyondTheJobIsRefused) {
  Resume r;
  data::LoaderOptions o;
  o.seq_len = 4, o.seed = 7, o.step_windows = 2;
  data::TokenLoader loader(r.dir.path, o);
  const std::string e = error_of([&] { check_and_restore_cursor("ck", 60, 60, "60", "{}", r.job, loader); });
  EXPECT_TRUE(has(e, "checkpoint ck: trainer_state.json step = 60, beyond job.toml: [train] steps = 50")) << e;
  const std::string m = error_of([&] { check_and_restore_cursor("ck", 10, 12, "", "{}", r.job, loader); });
  EXPECT_TRUE(has(m, "trainer_state.json says step 10 but manifest.json says step 12")) << m;
}
