// trainer_state.json of a checkpoint (src/train/resume_check.cpp): parsed, checked against a job
// (steps 50, global batch 2) and a small dataset, the data cursor restored, then the batches
// the resumed run would read. The dataset is made once per process; a valid state for it is the
// seed (EXATRAIN_FUZZ_WRITE_SEED=FILE writes one there).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.hpp"
#include "data/manifest.hpp"
#include "data/shard.hpp"
#include "harness.hpp"
#include "job/parse.hpp"
#include "train/resume_check.hpp"

using namespace exatrain;

namespace {
struct Setup {
  std::string dir;
  Job job;
  Setup() {
    dir = fuzz::scratch_dir() + "/data";
    std::filesystem::create_directories(dir);
    data::ShardWriter w(dir + "/shard_00000.bin", 256);
    std::vector<uint32_t> ids(203);
    for (size_t i = 0; i < ids.size(); i++) ids[i] = uint32_t((i * 37) % 256);
    w.append(ids.data(), ids.size());
    data::DatasetManifest m;
    m.tokenizer_type = "byte";
    m.vocab_size = 256;
    m.separator_id = 10;
    m.token_bytes = 2;
    m.shards.push_back({"shard_00000.bin", ids.size(), 64 + 2 * ids.size(), w.finish()});
    m.total_tokens = ids.size();
    std::ofstream(dir + "/manifest.json") << data::manifest_to_json(m);
    job = parse_job("[model]\nseq_len = 4\n[parallel]\nglobal_batch = 2\n[train]\nsteps = 50\nseed = 7\n", "fuzz-job.toml");
    if (const char* out = std::getenv("EXATRAIN_FUZZ_WRITE_SEED")) {
      auto loader = make_loader();
      std::vector<int32_t> t(8), g(8);
      for (int i = 0; i < 10; i++) loader->next_batch(t.data(), g.data(), 2);
      nlohmann::json state = {{"step", 10}, {"seed", 7}, {"data_cursor", nlohmann::json::parse(loader->cursor_json())},
                              {"tokenizer_type", "byte"}};
      std::ofstream(out) << state.dump(2) << "\n";
    }
  }
  std::unique_ptr<data::TokenLoader> make_loader() const {
    data::LoaderOptions o;
    o.seq_len = job.model.seq_len;
    o.seed = job.train.seed;
    o.step_windows = job.parallel.global_batch;
    o.verify_checksums = false;  // made here, once
    return std::make_unique<data::TokenLoader>(dir, o);
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Setup setup;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clear_errors([&] {
    int64_t step = 0;
    const TrainerExtras saved = parse_trainer_state(text, "fuzz/trainer_state.json", &step);
    auto loader = setup.make_loader();
    check_and_restore_cursor("fuzz", step, step, std::to_string(step), saved.data_cursor_json, setup.job, *loader);
    // The resumed run reads its remaining steps (up to 5 here) without leaving the dataset.
    std::vector<int32_t> t(8), g(8);
    for (int64_t s = step; s < setup.job.train.steps && s < step + 5; s++) loader->next_batch(t.data(), g.data(), 2);
  });
  return 0;
}
