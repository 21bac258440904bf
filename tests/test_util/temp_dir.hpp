// A fresh directory under /tmp for one test, removed afterwards.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "/tmp/exatrain-test-XXXXXX";
    char* p = ::mkdtemp(name);
    if (!p) std::abort();
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};
