#include "train/machine_peak.hpp"

#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.hpp"

namespace exatrain {

double measure_sgemm_gflops(Backend& backend, int64_t n, int repeats) {
  float* a = backend.alloc(n * n);
  float* b = backend.alloc(n * n);
  float* c = backend.alloc(n * n);
  std::vector<float> host(size_t(n * n));
  for (size_t i = 0; i < host.size(); i++) host[i] = float(i % 97) * 0.01f;
  backend.upload(a, host.data(), sizeof(float) * host.size());
  backend.upload(b, host.data(), sizeof(float) * host.size());
  double best = 1e30;
  for (int r = 0; r < repeats + 1; r++) {  // the first run warms up
    double t0 = omp_get_wtime();
    backend.gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double dt = omp_get_wtime() - t0;
    if (r > 0) best = std::min(best, dt);
  }
  backend.free_bytes(a);
  backend.free_bytes(b);
  backend.free_bytes(c);
  return 2.0 * double(n) * double(n) * double(n) / best / 1e9;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");  // absent or without "model name": not an error
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t first = line.find_first_not_of(" \t", colon + 1);
    if (first != std::string::npos) return line.substr(first);
  }
  return "unknown-cpu";
}

std::string sgemm_peak_cache_name(const std::string& cpu_model, int threads) {
  std::string key;
  for (char c : cpu_model) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
    if (keep) key += c;
    else if (!key.empty() && key.back() != '_') key += '_';  // runs of others -> one '_'
  }
  while (!key.empty() && key.back() == '_') key.pop_back();
  if (key.empty()) key = "unknown-cpu";
  return "sgemm_peak_" + key + "_t" + std::to_string(threads) + ".txt";
}

double cached_sgemm_peak_gflops(Backend& backend, int threads) {
  namespace fs = std::filesystem;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path dir = xdg ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
  // Keyed by CPU model as well as thread count: a home directory shared by the login and
  // compute nodes of a cluster must not mix their peaks.
  fs::path file = dir / "exatrain" / sgemm_peak_cache_name(cpu_model_name(), threads);
  double cached = 0;
  {
    std::ifstream in(file);
    if (!(in >> cached) || !(cached > 0)) cached = 0;
  }
  const double now = measure_sgemm_gflops(backend, 1024, 3);
  if (now <= cached) return cached;
  std::error_code ec;  // a read-only cache directory is not an error: just measure next time
  fs::create_directories(file.parent_path(), ec);
  // Written under a temporary name and renamed: concurrent runs never read half a number.
  fs::path tmp = file;
  tmp += ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (out) out << now << "\n";
  }
  fs::rename(tmp, file, ec);
  return now;
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  EXA_SYSCHECK(getrusage(RUSAGE_SELF, &ru) == 0, "getrusage");
  return int64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");  // "size resident shared ..." in pages
  int64_t size = 0, resident = -1;
  if (!(statm >> size >> resident)) return -1;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

}  // namespace exatrain
