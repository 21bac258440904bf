// The performance and memory model of one resolved plan: assembles flops, memory, comm, pipeline
// and io into the JSON object of ../shared/contracts/job-file.md.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/compression.hpp"
#include "plan/memory.hpp"
#include "plan/optimizer_cost.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

// Global constants of the time model, each documented in docs/planner.md. Per-device constants
// (gemm_efficiency, bw_efficiency) live in catalog/devices.toml.
struct Calibration {
  // GEMM efficiency falls for thin shapes: eff = gemm_efficiency / (1 + dim_half / (h/tp)) /
  // (1 + tokens_half / tokens). Tile-quantisation scale of 128x256 CUTLASS/hipBLASLt tiles. A
  // device with its own gemm_dim_half / gemm_tokens_half (devices.toml) uses those instead.
  double dim_half = 69;
  double tokens_half = 340;
  // Fused (flash) attention: its time is the counted attention FLOPs (4*s*h per token, the full
  // s x s square) at this fraction of the GEMM efficiency. One constant, not two: the kernel's own
  // efficiency and the share of the square a causal kernel executes (~half) enter only as their
  // ratio, so only the ratio is identifiable (it was 0.45 / 0.65 = 0.69 as two fitted constants).
  double flash_relative = 0.69;
  // Unfused attention runs QK^T and attn@V as batched GEMMs at this relative efficiency.
  double unfused_relative = 0.47;
  // Element-wise traffic per token per layer, forward, in elements: norms, residual adds, bias,
  // dropout and activation function (12 h + 2 f when nothing is fused; see docs).
  double elementwise_h = 19, elementwise_f = 4.7;
  // Unfused attention streams the a x s scores per token: softmax and dropout read/write.
  double score_passes = 4.8;
  // AdamW update: bytes streamed per locally updated parameter (mixed precision); the other
  // optimizers' elementwise bytes are counted from it (plan/optimizer_cost.hpp).
  double optimizer_bytes_per_param = 32;
  // FP8 runs: linear layers reach this fraction of the bf16-relative GEMM efficiency on the
  // fp8 peak (scaling, casts and amax reductions around each GEMM); attention stays bf16.
  double fp8_relative = 0.82;

  // Overrides one constant by name ("dim_half=64"); throws Error naming the known constants.
  void set(const std::string& assignment);
};
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
  // breakdown.optimizer split into its elementwise and matrix parts (plan/optimizer_cost.hpp).
  OptimizerCost optimizer_step;
  // [comm] compressor: one compressed reduction of the slowest rank's gradients (plan/compression.hpp).
  std::optional<CompressionCost> compression;
};

// Predict one plan. Checks the plan first (Error with the failing equation).
Prediction predict(const ModelSpec& m, const MachineSpec& mach, const Plan& p,
                   const Calibration& cal = default_calibration());
// The same for a plan already checked, on a looked-up device, with its memory already computed
// (the search's inner loop).
Prediction predict_checked(const ModelSpec& m, const MachineSpec& mach, const Device& d,
                           const Plan& p, const Memory& memory, const Calibration& cal);

// The contract's JSON object.
nlohmann::json to_json(const Prediction& pred);
// A table a person reads at a glance.
std::string to_table(const Prediction& pred, const ModelSpec& m);
// One line: "tp=8 pp=8 dp=1 cp=1 vp=3 zero=1 mb=1 recompute=selective sp=yes 1f1b".
std::string plan_summary(const Plan& p);

}  // namespace exatrain::plan
