// Checkpoint directories: round trip, keep-last-K, verification errors that name the file,
// resume-auto skipping incomplete checkpoints (and saying loudly when there is none), and a
// full disk during a save leaving the previous checkpoint intact and loadable.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"
#include "../test_util/temp_dir.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::checkpoint;
namespace fs = std::filesystem;

namespace {

std::vector<float> weights(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = scale * float(i % 113 - 56) / 9.0f;
  return v;
}

// A checkpoint as the trainer would write it: weights, optimizer moments, opaque blobs.
std::string save(const std::string& root, int64_t step, int64_t keep, int64_t n = 1000) {
  std::vector<float> w = weights(n, float(step)), m = weights(n, 0.5f), v = weights(n, 0.25f);
  SafetensorsWriter model, optim;
  model.add("wte", {n / 10, 10}, w.data());
  optim.add("wte.m", {n / 10, 10}, m.data());
  optim.add("wte.v", {n / 10, 10}, v.data());
  CheckpointWriter ckpt(root, step);
  ckpt.add_safetensors("model.safetensors", model);
  ckpt.add_safetensors("optimizer.safetensors", optim);
  ckpt.add_blob("rng.bin", std::string("\x01\x02\x00\x03", 4));
  ckpt.add_blob("data_cursor.json", "{\"epoch\":0,\"position\":" + std::to_string(step) + "}");
  ckpt.add_blob("job.toml", "[train]\nsteps = 10\n");
  return ckpt.commit(keep);
}

// Everything written to `log` by f, as text.
std::string log_of(const std::function<void(std::FILE*)>& f) {
  std::FILE* log = std::tmpfile();
  f(log);
  std::rewind(log);
  std::string text;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), log)) text.append(buf, n);
  std::fclose(log);
  return text;
}

bool no_temporaries(const std::string& root) {
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().filename().string()[0] == '.') return false;
  }
  return true;
}

}  // namespace

TEST(Checkpoint, SaveLoadRoundTrip) {
  TempDir dir;
  std::string path = save(dir.path, 7, 3);
  EXPECT_EQ(path, dir / "step_00000007");
  CheckpointReader r(path);
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.blob("data_cursor.json"), "{\"epoch\":0,\"position\":7}");
  EXPECT_EQ(r.blob("rng.bin"), std::string("\x01\x02\x00\x03", 4));
  EXPECT_EQ(r.blob("job.toml"), "[train]\nsteps = 10\n");
  EXPECT_EQ(r.safetensors("model.safetensors")->read_f32("wte"), weights(1000, 7.0f));
  EXPECT_EQ(r.safetensors("optimizer.safetensors")->read_f32("wte.v"), weights(1000, 0.25f));
  EXPECT_EQ(r.files().size(), 5u);
  EXPECT_TRUE(fs::exists(dir / "step_00000007/COMPLETE"));
  EXPECT_TRUE(no_temporaries(dir.path));
}

TEST(Checkpoint, KeepsTheLastK) {
  TempDir dir;
  for (int64_t step : {10, 20, 30, 40}) save(dir.path, step, 2);
  std::vector<CheckpointRef> all = list_checkpoints(dir.path);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 30);
  EXPECT_EQ(all[1].step, 40);
  save(dir.path, 40, 2);  // saving an existing step again replaces it
  EXPECT_EQ(list_checkpoints(dir.path).size(), 2u);
  EXPECT_EQ(CheckpointReader(dir / "step_00000040").step(), 40);
  // After resuming from an older step, the checkpoint just written survives the pruning.
  save(dir.path, 35, 2);
  std::vector<CheckpointRef> now = list_checkpoints(dir.path);
  ASSERT_EQ(now.size(), 2u);
  EXPECT_EQ(now[0].step, 35);
  EXPECT_EQ(now[1].step, 40);
}

TEST(Checkpoint, TruncatedFileIsNamedWithSizes) {
  TempDir dir;
  std::string path = save(dir.path, 1, 3);
  std::string file = path + "/model.safetensors";
  uint64_t size = file_size_or_throw(file);
  ASSERT_EQ(::truncate(file.c_str(), off_t(size / 2)), 0);
  std::string err = error_of([&] { CheckpointReader r(path); });
  EXPECT_NE(err.find("checkpoint file " + file + " is truncated or damaged: " +
                     std::to_string(size / 2) + " bytes on disk, the manifest expects " +
                     std::to_string(size)),
            std::string::npos)
      << err;
}

TEST(Checkpoint, CorruptedFileFailsItsChecksum) {
  TempDir dir;
  std::string path = save(dir.path, 1, 3);
  std::string file = path + "/optimizer.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  std::string err = error_of([&] { CheckpointReader r(path); });
  EXPECT_NE(err.find("checkpoint file " + file + " is corrupted: sha256"), std::string::npos)
      << err;
}

TEST(Checkpoint, ResumeAutoSkipsIncompleteCheckpoints) {
  TempDir dir;
  save(dir.path, 100, 5);
  save(dir.path, 200, 5);
  // A newer save that died before its marker (as a crash between rename and marker would look
  // if the protocol were broken), and one whose file was damaged afterwards.
  fs::create_directory(dir / "step_00000300");
  std::ofstream(dir / "step_00000300/model.safetensors") << "partial";
  save(dir.path, 250, 5);
  ASSERT_EQ(::truncate((dir / "step_00000250/rng.bin").c_str(), 1), 0);
  std::optional<CheckpointRef> found;
  std::string log = log_of([&](std::FILE* f) { found = resolve_resume("auto", dir.path, f); });
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 200);
  EXPECT_EQ(found->dir, dir / "step_00000200");
  EXPECT_NE(log.find("skipping checkpoint: checkpoint " + (dir / "step_00000300") +
                     " is incomplete: no COMPLETE marker"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("checkpoint file " + (dir / "step_00000250/rng.bin") + " is truncated"),
            std::string::npos)
      << log;
  // The newer ones that failed are moved aside, kept whole: no later save of step 300 or 250
  // overwrites them (the run resumes at 200 and will save those steps again).
  EXPECT_FALSE(fs::exists(dir / "step_00000300"));
  EXPECT_TRUE(fs::exists(dir / "step_00000300.incomplete/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "step_00000250.damaged/rng.bin"));
  EXPECT_NE(log.find("moved " + (dir / "step_00000300") + " aside to " + (dir / "step_00000300.incomplete")),
            std::string::npos)
      << log;
  // An explicit checkpoint that does not verify is an error, not a silent fallback.
  std::string err = error_of([&] { resolve_resume(dir / "step_00000300.incomplete", dir.path, nullptr); });
  EXPECT_NE(err.find("is incomplete"), std::string::npos) << err;
}

TEST(Checkpoint, ResumeAutoWithNothingSaysSoLoudly) {
  TempDir dir;
  std::optional<CheckpointRef> found = CheckpointRef{};
  std::string log =
      log_of([&](std::FILE* f) { found = resolve_resume("auto", dir / "checkpoints", f); });
  EXPECT_FALSE(found.has_value());
  EXPECT_NE(log.find("WARNING: --resume auto found NO complete checkpoint in " +
                     (dir / "checkpoints")),
            std::string::npos)
      << log;
  EXPECT_FALSE(resolve_resume("none", dir.path, nullptr).has_value());
}

TEST(Checkpoint, FullDiskDuringSaveKeepsThePreviousCheckpoint) {
  TempDir dir;
  save(dir.path, 1, 1);  // keep_last = 1: a successful save 2 would delete it
  // The disk fills up 3000 bytes into the next save (inside model.safetensors).
  inject_write_failure_after(3000);
  std::string err = error_of([&] { save(dir.path, 2, 1); });
  inject_write_failure_after(-1);
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_TRUE(no_temporaries(dir.path));
  EXPECT_FALSE(fs::exists(dir / "step_00000002"));
  auto found = find_latest_valid(dir.path, nullptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 1);
  CheckpointReader r(found->dir);
  EXPECT_EQ(r.safetensors("model.safetensors")->read_f32("wte"), weights(1000, 1.0f));

  // Failing anywhere else (other files, the manifest, the marker) must not publish anything
  // either. `total` is what a whole save writes; with exactly that budget the save succeeds.
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir / "step_00000001")) total += e.file_size();
  for (uint64_t budget = 0; budget < total; budget += total / 23 + 1) {
    for (uint64_t b : {budget, total - 1 - budget / 50}) {
      inject_write_failure_after(int64_t(b));
      std::string e = error_of([&] { save(dir.path, 3, 1); });
      inject_write_failure_after(-1);
      EXPECT_NE(e.find("No space left on device"), std::string::npos) << b << ": " << e;
      EXPECT_FALSE(fs::exists(dir / "step_00000003")) << b;
      EXPECT_EQ(find_latest_valid(dir.path, nullptr)->step, 1) << b;
      EXPECT_TRUE(no_temporaries(dir.path)) << b;
    }
  }
  inject_write_failure_after(int64_t(total));
  EXPECT_NO_THROW(save(dir.path, 3, 1));
  inject_write_failure_after(-1);
  EXPECT_EQ(find_latest_valid(dir.path, nullptr)->step, 3);
}

TEST(Checkpoint, RealWriteFailureFromTheKernelKeepsThePreviousCheckpoint) {
  // The kernel refuses writes past RLIMIT_FSIZE with EFBIG (SIGXFSZ ignored): a real failing
  // write(2), not our injection hook.
  TempDir dir;
  save(dir.path, 1, 1, 1000);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string err = error_of([&] { save(dir.path, 2, 1, 100000); });  // 400 kB of weights
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_TRUE(no_temporaries(dir.path));
  auto found = find_latest_valid(dir.path, nullptr);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 1);
  EXPECT_EQ(CheckpointReader(found->dir).safetensors("model.safetensors")->read_f32("wte"),
            weights(1000, 1.0f));
}

TEST(Checkpoint, StartOfARunClearsLeftoversOfInterruptedSaves) {
  TempDir dir;
  save(dir.path, 2, 0);
  save(dir.path, 4, 0);
  // A save of step 4 that crashed between its two renames: the complete step 4 sits aside.
  fs::rename(dir / "step_00000004", dir / ".old-step_00000004-999");
  // A second one of step 2 whose step_00000002 is still there; two interrupted saves.
  fs::create_directory(dir / ".old-step_00000002-998");
  for (const char* t : {".tmp-step_00000006-997", ".tmp-step_00000008-996"}) {
    fs::create_directory(dir / t);
    std::ofstream(dir / (std::string(t) + "/model.safetensors")) << std::string(500000, 'x');
  }
  const std::string log = log_of([&](std::FILE* f) { recover_checkpoint_root(dir.path, f); });
  EXPECT_TRUE(fs::exists(dir / "step_00000004/COMPLETE")) << log;  // restored, verifies
  EXPECT_EQ(CheckpointReader(dir / "step_00000004").step(), 4);
  EXPECT_TRUE(fs::exists(dir / "step_00000002/COMPLETE"));
  EXPECT_TRUE(no_temporaries(dir.path)) << log;
  EXPECT_NE(log.find("removed 2 temporary directories of interrupted checkpoint saves (1.0 MB)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("restored " + (dir / "step_00000004")), std::string::npos) << log;
}

TEST(Checkpoint, ASaveNeverOverwritesAnIncompleteDirectoryOfItsStep) {
  TempDir dir;
  fs::create_directory(dir / "step_00000003");
  std::ofstream(dir / "step_00000003/model.safetensors") << "all that is left";
  save(dir.path, 3, 0);
  EXPECT_EQ(CheckpointReader(dir / "step_00000003").step(), 3);
  std::ifstream kept(dir / "step_00000003.incomplete/model.safetensors");
  std::string text((std::istreambuf_iterator<char>(kept)), {});
  EXPECT_EQ(text, "all that is left");
}

TEST(Checkpoint, ManifestNamesAndStepsAreChecked) {
  TempDir dir;
  const std::string ck = save(dir.path, 5, 0);
  auto rewrite = [&](const std::string& from, const std::string& to) {
    std::ifstream in(ck + "/manifest.json");
    std::string m((std::istreambuf_iterator<char>(in)), {});
    m.replace(m.find(from), from.size(), to);
    write_file_atomic(ck + "/manifest.json", m);
    write_file_atomic(ck + "/COMPLETE", "{\"step\": 5, \"manifest_sha256\": \"" + sha256_hex(m) + "\"}\n");
  };
  rewrite("\"rng.bin\"", "\"../../etc/passwd\"");
  EXPECT_NE(error_of([&] { CheckpointReader r(ck); })
                .find("manifest.json: lists the file \"../../etc/passwd\", expected a plain file name inside the "
                      "checkpoint"),
            std::string::npos);
  rewrite("\"../../etc/passwd\"", "\"rng.bin\"");
  rewrite("\"step\": 5", "\"step\": 1e300");
  EXPECT_NE(error_of([&] { CheckpointReader r(ck); }).find("manifest.json: \"step\" = 1e+300: expected an integer in [0, "),
            std::string::npos);
  rewrite("\"step\": 1e300", "\"step\": 6");
  EXPECT_NE(error_of([&] { CheckpointReader r(ck); }).find("COMPLETE marks step 5 but manifest.json says step 6"),
            std::string::npos);
}
