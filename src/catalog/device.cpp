#include "catalog/device.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <toml.hpp>

#include "core/check.hpp"
#include "core/profile_cache.hpp"

namespace exatrain {

double Device::peak_tflops(Precision p) const {
  switch (p) {
    case Precision::fp32: return peak_tflops_fp32;
    case Precision::fp16: return peak_tflops_fp16;
    case Precision::bf16: return peak_tflops_bf16;
    case Precision::fp8: return peak_tflops_fp8;
  }
  return 0;
}

std::string catalog_dir() {
  if (const char* env = std::getenv("EXATRAIN_CATALOG")) return env;
  return std::string(EXATRAIN_SOURCE_DIR) + "/catalog";
}

namespace {

double positive(const toml::value& table, const std::string& file, const std::string& section,
                const std::string& key) {
  EXA_CHECK(table.contains(key), "{}: [{}] lacks key '{}'", file, section, key);
  const toml::value& v = table.at(key);
  double x = v.is_integer() ? double(v.as_integer()) : v.is_floating() ? v.as_floating() : -1;
  EXA_CHECK(x > 0, "{}: [{}] {} = {} must be a positive number", file, section, key,
            toml::format(v));
  return x;
}

// An optional key that may be 0 (a shape constant: 0 = no fall-off with that dimension).
std::optional<double> optional_non_negative(const toml::value& table, const std::string& file,
                                            const std::string& section, const std::string& key) {
  if (!table.contains(key)) return std::nullopt;
  const toml::value& v = table.at(key);
  double x = v.is_integer() ? double(v.as_integer()) : v.is_floating() ? v.as_floating() : -1;
  EXA_CHECK(x >= 0, "{}: [{}] {} = {} must be a number >= 0", file, section, key, toml::format(v));
  return x;
}

// An optional true/false key (absent: false).
bool boolean(const toml::value& table, const std::string& file, const std::string& section, const std::string& key) {
  if (!table.contains(key)) return false;
  const toml::value& v = table.at(key);
  EXA_CHECK(v.is_boolean(), "{}: [{}] {} = {} must be true or false", file, section, key, toml::format(v));
  return v.as_boolean();
}

// One [NAME] table of devices.toml (or of a profile) as a Device.
Device device_from_table(const std::string& name, const toml::value& t, const std::string& file) {
  EXA_CHECK(t.is_table(), "{}: '{}' must be a table [{}]", file, name, name);
  Device d;
  d.name = name;
  if (t.contains("description")) d.description = t.at("description").as_string();
  d.family = t.contains("family") ? std::string(t.at("family").as_string()) : name;
  d.peak_tflops_fp32 = positive(t, file, name, "peak_tflops_fp32");
  d.peak_tflops_fp16 = positive(t, file, name, "peak_tflops_fp16");
  d.peak_tflops_bf16 = positive(t, file, name, "peak_tflops_bf16");
  d.peak_tflops_fp8 = positive(t, file, name, "peak_tflops_fp8");
  d.hbm_gib = positive(t, file, name, "hbm_gib");
  d.hbm_bw_gbs = positive(t, file, name, "hbm_bw_gbs");
  d.gemm_efficiency = positive(t, file, name, "gemm_efficiency");
  d.bw_efficiency = positive(t, file, name, "bw_efficiency");
  if (t.contains("sustained")) d.sustained = positive(t, file, name, "sustained");
  d.measured = boolean(t, file, name, "measured");
  d.sustained_fitted = boolean(t, file, name, "sustained_fitted");
  d.gemm_dim_half = optional_non_negative(t, file, name, "gemm_dim_half");
  d.gemm_tokens_half = optional_non_negative(t, file, name, "gemm_tokens_half");
  if (t.contains("compute_units")) {
    d.compute_units = positive(t, file, name, "compute_units");
    d.gemm_tile_m = positive(t, file, name, "gemm_tile_m");
    d.gemm_tile_n = positive(t, file, name, "gemm_tile_n");
    d.gemm_k_overhead = positive(t, file, name, "gemm_k_overhead");
    d.gemm_best_m = positive(t, file, name, "gemm_best_m");
    d.gemm_best_n = positive(t, file, name, "gemm_best_n");
    d.gemm_best_k = positive(t, file, name, "gemm_best_k");
  }
  if (t.contains("gemm_efficiency_fp8")) d.gemm_efficiency_fp8 = positive(t, file, name, "gemm_efficiency_fp8");
  if (t.contains("flash1_efficiency")) d.flash1_efficiency = positive(t, file, name, "flash1_efficiency");
  if (t.contains("flash2_efficiency")) d.flash2_efficiency = positive(t, file, name, "flash2_efficiency");
  if (t.contains("flash3_efficiency")) d.flash3_efficiency = positive(t, file, name, "flash3_efficiency");
  if (t.contains("tdp_w")) d.tdp_w = positive(t, file, name, "tdp_w");
  if (t.contains("power_limit_w")) d.power_limit_w = positive(t, file, name, "power_limit_w");
  d.refault_gbs = optional_non_negative(t, file, name, "refault_gbs").value_or(0.0);
  if (d.tdp_w > 0 && d.power_limit_w > 0 && d.power_limit_w < d.tdp_w) d.power_factor = std::cbrt(d.power_limit_w / d.tdp_w);
  EXA_CHECK(d.gemm_efficiency <= 1 && d.bw_efficiency <= 1 && d.sustained <= 1,
            "{}: [{}] efficiencies must be <= 1", file, name);
  return d;
}

std::vector<Device> read_devices() {
  std::string file = catalog_dir() + "/devices.toml";
  EXA_CHECK(std::filesystem::exists(file), "device catalog {} not found", file);
  toml::value root = toml::parse(file);
  std::vector<Device> devices;
  for (const auto& [name, t] : root.as_table()) devices.push_back(device_from_table(name, t, file));
  // This machine's devices as `exatrain profile` measured them replace the shipped entries.
  if (const std::optional<std::string> profile = active_profile()) {
    toml::value prof = toml::parse(*profile);
    for (const auto& [name, t] : prof.as_table()) {
      if (name == "profile" || name == "machine") continue;
      Device d = device_from_table(name, t, *profile);
      auto it = std::find_if(devices.begin(), devices.end(), [&](const Device& x) { return x.name == d.name; });
      // A profile written before `exatrain profile` measured refault_gbs keeps the shipped figure.
      if (it != devices.end() && !t.contains("refault_gbs")) d.refault_gbs = it->refault_gbs;
      if (it != devices.end()) *it = d;
      else devices.push_back(d);
    }
  }
  std::sort(devices.begin(), devices.end(),
            [](const Device& a, const Device& b) { return a.name < b.name; });
  return devices;
}

}  // namespace

const std::vector<Device>& all_devices() {
  static std::once_flag once;
  static std::vector<Device> devices;
  std::call_once(once, [] { devices = read_devices(); });
  return devices;
}

const Device& find_device(const std::string& name) {
  for (const Device& d : all_devices())
    if (d.name == name) return d;
  std::string known;
  for (const Device& d : all_devices()) known += (known.empty() ? "" : ", ") + d.name;
  EXA_FAIL("unknown device '{}': the catalog ({}/devices.toml) knows {}", name, catalog_dir(),
           known);
}

std::vector<std::string> cluster_names() {
  std::vector<std::string> names;
  std::string dir = catalog_dir() + "/clusters";
  if (!std::filesystem::exists(dir)) return names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

MachineSpec find_cluster(const std::string& name) {
  std::string file = catalog_dir() + "/clusters/" + name + ".toml";
  if (!std::filesystem::exists(file)) {
    std::string known;
    for (const auto& n : cluster_names()) known += (known.empty() ? "" : ", ") + n;
    EXA_FAIL("unknown cluster '{}': known clusters are {}", name, known);
  }
  toml::value root = toml::parse(file);
  EXA_CHECK(root.contains("machine"), "{}: lacks the [machine] table", file);
  const toml::value& m = root.at("machine");
  MachineSpec spec;
  spec.preset = name;
  EXA_CHECK(m.contains("device"), "{}: [machine] lacks key 'device'", file);
  spec.device = m.at("device").as_string();
  find_device(spec.device);  // fail early on a typo
  spec.gpus_per_node = int64_t(positive(m, file, "machine", "gpus_per_node"));
  spec.intra_node_bw_gbs = positive(m, file, "machine", "intra_node_bw_gbs");
  spec.inter_node_bw_gbs = positive(m, file, "machine", "inter_node_bw_gbs");
  spec.intra_node_latency_us = positive(m, file, "machine", "intra_node_latency_us");
  spec.inter_node_latency_us = positive(m, file, "machine", "inter_node_latency_us");
  spec.storage_bw_gbs = positive(m, file, "machine", "storage_bw_gbs");
  if (m.contains("node_mtbf_hours"))
    spec.node_mtbf_hours = positive(m, file, "machine", "node_mtbf_hours");
  // The `local` cluster as `exatrain profile` measured it (under mpirun: its collectives).
  if (name == "local")
    if (const std::optional<std::string> profile = active_profile()) {
      const toml::value prof = toml::parse(*profile);
      if (prof.contains("machine")) {
        const toml::value& pm = prof.at("machine");
        if (pm.contains("intra_node_bw_gbs")) spec.intra_node_bw_gbs = positive(pm, *profile, "machine", "intra_node_bw_gbs");
        if (pm.contains("intra_node_latency_us"))
          spec.intra_node_latency_us = positive(pm, *profile, "machine", "intra_node_latency_us");
      }
    }
  return spec;
}

}  // namespace exatrain
