#include "core/profile_cache.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "core/fileio.hpp"
#include "core/toml.hpp"

namespace exatrain {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}
// The first line of `file` starting with `key`, after its ':' (trimmed); "" when none.
std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) return "";
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}
}  // namespace

std::string profile_cache_file() {
  std::string dir = env("EXATRAIN_PROFILE_DIR");
  if (dir.empty() && !env("XDG_CACHE_HOME").empty()) dir = env("XDG_CACHE_HOME") + "/exatrain";
  if (dir.empty()) dir = (env("HOME").empty() ? std::string("/tmp") : env("HOME")) + "/.cache/exatrain";
  return fmt::format("{}/profile-{}.toml", dir, host_name());
}

std::string machine_fingerprint() {
  std::string mem = proc_field("/proc/meminfo", "MemTotal");
  if (auto sp = mem.find(' '); sp != std::string::npos) mem.erase(sp);
  return fmt::format("host={}; cpu={}; cores={}; memory_kib={}", host_name(), proc_field("/proc/cpuinfo", "model name"),
                     std::thread::hardware_concurrency(), mem);
}

std::optional<std::string> active_profile(std::string* why) {
  auto no = [&](std::string reason) -> std::optional<std::string> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (env("EXATRAIN_PROFILE") == "off") return no("EXATRAIN_PROFILE=off");
  const std::string file = profile_cache_file();
  if (!std::filesystem::is_regular_file(file)) return no(fmt::format("no profile at {} (run `exatrain profile`)", file));
  try {
    const toml::value root = parse_toml(read_file_bytes(file, uint64_t(1) << 20), file);
    const std::string fp = toml::find<std::string>(root, "profile", "fingerprint");
    if (fp != machine_fingerprint())
      return no(fmt::format("{} was measured on another machine or configuration ({}; this one: {}): run `exatrain "
                            "profile` again", file, fp, machine_fingerprint()));
  } catch (const std::exception& e) {
    return no(fmt::format("{} is unreadable ({}): run `exatrain profile` again", file, e.what()));
  }
  if (why) why->clear();
  return file;
}

}  // namespace exatrain
