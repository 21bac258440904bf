#include "harness.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace exatrain::fuzz {

namespace {
struct Scratch {
  std::string path;
  Scratch() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "exatrain-fuzz-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    path = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

const std::string& scratch_dir() {
  static Scratch s;
  return s.path;
}

std::string write_scratch(const std::string& name, const std::string& bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) std::abort();
  return path;
}

}  // namespace exatrain::fuzz
