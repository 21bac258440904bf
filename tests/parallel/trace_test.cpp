// check_trace_writable: a bad --trace PATH is refused before training, naming the path; a good
// one passes and leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/check.hpp"
#include "parallel/trace.hpp"

using namespace exatrain;
namespace fs = std::filesystem;

TEST(Trace, WritablePathPassesAndLeavesNoFile) {
  const fs::path dir = fs::temp_directory_path() / "exatrain_trace_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "trace.json").string();
  parallel::check_trace_writable(path);
  EXPECT_FALSE(fs::exists(path));
  { std::ofstream(path) << "kept"; }  // an existing file is not truncated by the check
  parallel::check_trace_writable(path);
  EXPECT_EQ(fs::file_size(path), 4u);
  fs::remove_all(dir);
}

TEST(Trace, UnwritablePathIsAnErrorNamingIt) {
  const std::string path = "/nonexistent_exatrain_dir/trace.json";
  try {
    parallel::check_trace_writable(path);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--trace /nonexistent_exatrain_dir/trace.json: cannot write the trace there: "
                                         "No such file or directory"),
              std::string::npos)
        << e.what();
  }
}
