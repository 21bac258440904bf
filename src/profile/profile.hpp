// `exatrain profile`: measures the machine it runs on and writes the catalog entries of the
// `local` machine (catalog/device.hpp profile cache): the devices `cpu-local` (one rank on one
// core) and `cpu-local-2c` (one rank on every core), and, under mpirun, the `[machine]` of the
// cluster `local`. What it measures, each the fastest of a few repetitions (the machine may be
// shared):
//   * GEMM rates over the shapes plans use: the twelve GEMMs of a transformer layer at hidden 256
//     and 512, tp 1 and 4 and 128, 512, 1024 tokens, through the engine's backend; the planner's smooth
//     shape model (gemm_efficiency, gemm_dim_half, gemm_tokens_half) fitted in log space with the
//     largest rate as the peak;
//   * the backend's attention forward + backward, as the efficiency of its executed FLOPs
//     (plan/compute.hpp's convention: flash2_efficiency);
//   * memory bandwidth: a large copy (hbm_bw_gbs, bytes read + written per second) and the
//     element-wise kernels the layers run (layernorm, GELU: bw_efficiency = their rate / the copy's);
//   * released memory written again (refault_gbs): what ZeRO 2 and 3 pay each micro-batch on a CPU;
//   * with several MPI ranks: a ping-pong between ranks 0 and 1 (latency) and an all-reduce sweep
//     over all ranks (bus bandwidth: intra_node_bw_gbs is set so that plan/comm.hpp's ring model
//     reproduces the largest all-reduce).
// Tests check the structure and sanity of the result, never the speeds.
//
// Owns (room profile/): the measurements and the profile's TOML. May use: core/, job/, catalog/,
// backend/ (+ MPI).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace exatrain::profile {

struct ProfileOptions {
  int reps = 3;        // repetitions per measurement (the fastest is kept), in each of 2 rounds
  bool quick = false;  // fewer shapes and repetitions (tests)
};

struct GemmPoint { int64_t hidden = 0, tp = 1, tokens = 0; double gflops = 0; };

// One rank's device: threads it used and what was measured.
struct DeviceProfile {
  std::string name;  // "cpu-local" or "cpu-local-2c"
  int threads = 1;
  double peak_gflops = 0;                    // the largest GEMM rate measured
  double gemm_efficiency = 1, dim_half = 0, tokens_half = 0, fit_rms = 0;  // the shape model
  int dropped = 0;  // shapes left out of the fit: far below the others (disturbed by other work)
  std::vector<GemmPoint> gemms;
  double attention_efficiency = 0;  // of peak, on the executed FLOPs
  double copy_gbs = 0;              // hbm_bw_gbs
  double elementwise_gbs = 0;       // bw_efficiency = elementwise_gbs / copy_gbs
  double refault_gbs = 0;           // released memory written again (catalog/device.hpp refault_gbs)
  double memory_gib = 0;            // the machine's memory shared by the ranks of this kind
};

struct NetworkProfile {
  int ranks = 1;
  double latency_us = 0;             // ping-pong, half the round trip of 8 bytes
  double pingpong_gbs = 0;           // 64 MiB messages
  std::vector<std::pair<double, double>> all_reduce;  // (bytes, bus GB/s)
  double intra_node_bw_gbs = 0;      // for plan/comm.hpp (bus bandwidth / kBusEfficiency)
};

struct MachineProfile {
  std::string fingerprint;  // catalog/device.hpp profile_fingerprint() when measured
  std::string measured_at;  // UTC
  std::vector<DeviceProfile> devices;
  std::optional<NetworkProfile> network;  // with 2+ ranks
  double seconds = 0;
};

// Measures this machine. Collective over MPI_COMM_WORLD when MPI is initialised with 2+ ranks
// (every rank calls it; rank 0's result is the one to write).
MachineProfile profile_machine(const ProfileOptions& options);

// The profile as the catalog reads it (catalog/device.hpp profile_cache_path): [cpu-local],
// [cpu-local-2c] as devices.toml tables, [machine] as a cluster file, [profile] the fingerprint.
std::string profile_toml(const MachineProfile& p);
// A summary for a person.
std::string profile_summary(const MachineProfile& p);

}  // namespace exatrain::profile
