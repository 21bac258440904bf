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
  // Devices of one silicon (a100-40g and a100-80g; h100-sxm, h100-96g and h200) share the
  // constants fitted to measured runs (`sustained`): `exatrain validate` fits one per family.
  // Default: the device's own name.
  std::string family;
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
  // Fitted (docs/planner.md "Calibrated constants"): the fraction of the measured compute rates
  // (gemm_efficiency and the attention figures) sustained over a training run (clocks under
  // sustained power, gaps between kernels). 1 for a device measured by `exatrain profile`.
  double sustained = 1.0;
  // Whether this family's `sustained` was fitted to published runs (`exatrain validate`): where it
  // was, `exatrain calibrate` starts from it with a narrow prior on `sustained` (plan/calibrate.hpp
  // CalibrationPrior); elsewhere (no published run of the family, or `exatrain profile`'s devices)
  // with a wide one.
  bool sustained_fitted = false;
  // The figures were measured on this machine (`exatrain profile`, the shipped CPU entries), not
  // taken from datasheets and papers: the fitted corrections for GPUs (sustained, the attention
  // kernels' attention_relative) do not apply.
  bool measured = false;
  // Optional per-device GEMM shape constants (devices.toml keys gemm_dim_half and
  // gemm_tokens_half): efficiency falls as gemm_efficiency / (1 + dim_half / (h/tp)) /
  // (1 + tokens_half / tokens). Set on the CPU devices `exatrain profile` measured (a CPU's BLAS
  // reaches its rate on far smaller shapes); unset, a GPU has the tile model below.
  std::optional<double> gemm_dim_half, gemm_tokens_half;
  // The GEMM tile model of a GPU (plan/compute.hpp; absent on devices with the smooth model):
  // compute units (SMs, CUs), the output tile of its large-GEMM kernels, the fixed cost per tile in
  // elements of K (prologue and epilogue), and the shape at which gemm_efficiency was measured.
  double compute_units = 0;  // 0: no tile model
  double gemm_tile_m = 128, gemm_tile_n = 256, gemm_k_overhead = 64;
  double gemm_best_m = 8192, gemm_best_n = 8192, gemm_best_k = 8192;
  // fp8 GEMMs: the fraction of the fp8 peak large GEMMs reach (absent: gemm_efficiency).
  std::optional<double> gemm_efficiency_fp8;
  // Fused attention kernels: the fraction of the 16-bit peak their forward + backward reach on
  // long sequences (the executed FLOPs: the causal half of the square, the backward's recomputed
  // scores). flash1: FlashAttention-1 and Triton's kernel; flash3: Hopper's kernels. Absent: the
  // device has no such kernels.
  std::optional<double> flash1_efficiency, flash2_efficiency, flash3_efficiency;
  // A device capped below its thermal design power clocks lower under load: its compute rates
  // scale by (power_limit_w / tdp_w)^(1/3) (dynamic power ~ f V^2 with V ~ f). 0: not capped.
  double tdp_w = 0, power_limit_w = 0;
  // This runtime's CPU backend gives the memory of released buffers back to the OS
  // (Backend::release: madvise(MADV_DONTNEED); ZeRO 2's gradient buckets after their
  // reduce-scatter, ZeRO 3's units after each pass and their gradients after the backward), and
  // the next write faults every page back in, zero-filled. `refault_gbs`: released bytes written
  // again per second of that extra time over a plain write (`exatrain profile` measures it;
  // devices.toml key, optional). 0: free or not paid (GPUs: the CUDA backend zeroes released
  // memory in place at HBM speed, not modelled; a profile that could not tell the two writes apart).
  double refault_gbs = 0;
  double power_clock_factor() const { return power_factor; }
  double power_factor = 1;  // (power_limit_w / tdp_w)^(1/3), set when the catalog is read

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

// The catalog also reads this machine's profile (core/profile_cache.hpp): its [cpu-local] and
// [cpu-local-2c] replace the shipped entries, its [machine] the measured keys of the cluster `local`.

// Root folder of the catalog (EXATRAIN_SOURCE_DIR/catalog unless EXATRAIN_CATALOG is set).
std::string catalog_dir();

}  // namespace exatrain
