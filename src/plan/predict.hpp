// The performance and memory model of one resolved plan: assembles flops, memory, comm, pipeline
// and io into the JSON object of ../shared/contracts/job-file.md.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/compression.hpp"
#include "plan/memory.hpp"
#include "plan/optimizer_cost.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

// Per device (or device family) constants a fit may move: the values of catalog/devices.toml
// unless set here. `exatrain validate` fits `sustained` per family (leave-one-source-out too);
// `exatrain calibrate` fits them for one device from a user's runs and writes them to a
// calibration file (plan/fit.hpp, docs/planner.md "Calibration").
struct DeviceConstants {
  // Fraction of the device's measured compute rates (GEMM, attention: catalog data) sustained in
  // training: clocks under sustained power and the gaps between kernels.
  std::optional<double> sustained;
  // Fraction of the HBM bandwidth element-wise kernels reach.
  std::optional<double> bw_efficiency;
  // Multiplier on the collective bandwidths of plan/comm.hpp (1 = the cluster's link figures at
  // kBusEfficiency): what the machine's collectives reach of the model's.
  std::optional<double> network;
  // Multiplier on the fused attention kernel's rate (the catalog's flash efficiency times
  // attention_relative; 1 = the model's figure): what this machine's attention kernel reaches of
  // it, e.g. with a position bias (ALiBi) or the kernel a framework picks at run time. Unfused
  // attention (batched GEMMs) does not use it; the scaled catalog efficiency (a fraction of the
  // 16-bit peak) stops at 1.
  std::optional<double> attention;
  bool operator==(const DeviceConstants&) const = default;
};

// Global constants of the time model, each documented in docs/planner.md. Per-device constants
// live in catalog/devices.toml (and `devices` below overrides them).
struct Calibration {
  // AdamW update: bytes streamed per locally updated parameter (mixed precision); the other
  // optimizers' elementwise bytes are counted from it (plan/optimizer_cost.hpp).
  double optimizer_bytes_per_param = 32;
  // FP8 runs: linear layers' GEMMs reach this fraction of the device's 16-bit gemm_efficiency on
  // the fp8 peak (the casts and amax passes around them are counted separately, plan/compute.hpp);
  // attention stays 16-bit. Fitted (no measured fp8 GEMM ceiling in the catalog's sources).
  double fp8_relative = 0.985;
  // Fused attention kernels in training reach this fraction of their catalog figure (the kernel
  // papers' headline utilisation, catalog/devices.toml): causal masking's diagonal blocks, position
  // biases (ALiBi), head dimensions and sequence lengths off the papers' best case. Fitted.
  double attention_relative = 0.880;
  // Memory: the share the caching allocator reserves beyond what is allocated (fragmentation,
  // cached blocks of freed transients), on everything counted, at the peak a monitor reports
  // (Memory::peak). Fitted to measured peaks.
  double fragmentation = 0.205;
  // Memory: the share of everything counted that a run near its capacity still needs beyond it (the
  // allocator gives back its cache and retries; Memory::total, which `fits` compares). Fitted to
  // which runs ran and which failed out of memory.
  double fragmentation_at_capacity = 0.047;
  // By device name or family (catalog/devices.toml `family`); a device's own entry wins over
  // its family's.
  std::map<std::string, DeviceConstants> devices;

  // Sets one constant by name: a global one ("fp8_relative=0.95") or a device's / family's
  // ("h100-sxm.sustained=0.8", "a100.sustained=0.9"); throws Error naming the known constants.
  void set(const std::string& assignment);
  void set(const std::string& name, double value);
  // The value `name` has for predictions (a device constant: the device's override, else its
  // family's, else the catalog's value of that device or of the first device of that family).
  double get(const std::string& name) const;
  // The device with this calibration's constants applied.
  Device tuned(const Device& d) const;
  // The multiplier on collective bandwidths for this device (1 unless set).
  double network(const Device& d) const;
};
// The names of the global constants, and of the constants a device carries ("sustained", ...).
const std::vector<std::string>& global_constant_names();
const std::vector<std::string>& device_constant_names();
// Whether a device constant is a multiplier (network, attention: 1 = the model's figure, may exceed
// 1) rather than a fraction of a peak (sustained, bw_efficiency: at most 1).
bool is_multiplier_constant(const std::string& short_name);
const Calibration& default_calibration();

// The machine figures this plan's time model divides by must be positive: intra_node_bw_gbs
// when a group has ranks inside a node, inter_node_bw_gbs when the plan spans nodes, and the
// latencies must not be negative. Throws Error naming `source` (the job file) and the key.
void check_machine_for_plan(const MachineSpec& mach, const Plan& p, const std::string& source);

struct Breakdown {
  double compute = 0, tp_comm = 0, cp_comm = 0, pp_comm = 0, pp_bubble = 0, dp_comm = 0,
         optimizer = 0, other = 0;
  double sum() const {
    return compute + tp_comm + cp_comm + pp_comm + pp_bubble + dp_comm + optimizer + other;
  }
};

struct Prediction {
  Plan plan;
  std::string device;
  double step_time_s = 0, tokens_per_s = 0;
  double model_tflops_per_gpu = 0, hardware_tflops_per_gpu = 0, mfu = 0, hfu = 0;
  Memory memory;  // bytes
  double device_memory_bytes = 0;
  bool fits = false;
  Breakdown breakdown;
  // Extensions of the contract (extra keys).
  double parameters = 0;
  double bubble_fraction = 0;
  double checkpoint_write_s = 0;
  std::optional<double> checkpoint_interval_s;
  // breakdown.compute split by kind (plan/compute.hpp): linear-layer GEMMs, attention core,
  // element-wise kernels, fp8 casts, LM head, embedding (the slowest pipeline rank's, per step).
  struct ComputeParts { double linear = 0, attention = 0, elementwise = 0, casts = 0, head = 0, embedding = 0; };
  ComputeParts compute_parts;
  // breakdown.optimizer split into its elementwise and matrix parts (plan/optimizer_cost.hpp).
  OptimizerCost optimizer_step;
  // [comm] compressor: one compressed reduction of the slowest rank's gradients (plan/compression.hpp).
  std::optional<CompressionCost> compression;
};

// Predict one plan. Checks the plan first (Error with the failing equation).
Prediction predict(const ModelSpec& m, const MachineSpec& mach, const Plan& p,
                   const Calibration& cal = default_calibration());
// The same for a plan already checked, on a looked-up device (cal.tuned: with the calibration's
// device constants), with its memory already computed (the search's inner loop).
Prediction predict_checked(const ModelSpec& m, const MachineSpec& mach, const Device& d,
                           const Plan& p, const Memory& memory, const Calibration& cal);

// The contract's JSON object.
nlohmann::json to_json(const Prediction& pred);
// A table a person reads at a glance.
std::string to_table(const Prediction& pred, const ModelSpec& m);
// One line: "tp=8 pp=8 dp=1 cp=1 vp=3 zero=1 mb=1 recompute=selective sp=yes 1f1b".
std::string plan_summary(const Plan& p);

}  // namespace exatrain::plan
