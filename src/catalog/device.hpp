// The device catalog: public peak figures of each accelerator (catalog/devices.toml, each number
// with its source) plus the few calibrated efficiency constants the planner uses for it.
//
// Owns (room catalog/): the device figures read from catalog/devices.toml. May use: core/, job/.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "job/job.hpp"

namespace exatrain {

struct Device {
  std::string name;
  std::string description;
  // Dense (no 2:4 sparsity) peak math throughput, TFLOP/s, per precision. A device without a
  // faster unit for a precision lists the rate it actually runs at (A100 fp8 = its bf16 rate).
  double peak_tflops_fp32 = 0, peak_tflops_fp16 = 0, peak_tflops_bf16 = 0, peak_tflops_fp8 = 0;
  double hbm_gib = 0;        // device memory, GiB
  double hbm_bw_gbs = 0;     // device memory bandwidth, GB/s (1e9 B/s)
  // Calibrated (docs/planner.md): the fraction of peak that large, well-shaped GEMMs reach in
  // training (cuBLAS/hipBLASLt on big tiles), and the fraction of hbm_bw that streaming
  // element-wise kernels reach.
  double gemm_efficiency = 0.7;
  double bw_efficiency = 0.7;
  // Optional per-device GEMM shape constants (devices.toml keys gemm_dim_half and
  // gemm_tokens_half): efficiency falls as gemm_efficiency / (1 + dim_half / (h/tp)) /
  // (1 + tokens_half / tokens). Unset = the global calibration (plan::Calibration), fitted to GPU
  // tiles; a CPU's BLAS reaches its rate on far smaller shapes.
  std::optional<double> gemm_dim_half, gemm_tokens_half;

  double peak_tflops(Precision p) const;
};

// All devices of catalog/devices.toml, sorted by name (read once, cached).
const std::vector<Device>& all_devices();
// The device called `name`; throws Error listing the known names when there is none.
const Device& find_device(const std::string& name);

// The [machine] table of catalog/clusters/NAME.toml as a MachineSpec (preset = NAME); throws
// Error listing the known clusters when there is none.
MachineSpec find_cluster(const std::string& name);
std::vector<std::string> cluster_names();

// Root folder of the catalog (EXATRAIN_SOURCE_DIR/catalog unless EXATRAIN_CATALOG is set).
std::string catalog_dir();

}  // namespace exatrain
