// Compressed data-parallel communication in the planner ([comm], parallel/compressors.hpp;
// docs/compression.md, "The planner's model"): what each compressor puts on the wire in one
// reduction of a rank's gradients over its dp group, the alpha-beta time of its collectives (the
// time model of plan/comm.hpp), the selection / error-feedback / decompression compute (memory
// bound: passes over the gradients counted from the runtime's code, at the device's streaming
// bandwidth; PowerSGD's GEMMs at its fp32 GEMM rate), and the break-even density below which a
// sparsifier beats the dense fp32 reduction. The compressed exchange is not overlapped with
// backward (the runtime runs it blocking); the dense one is compared as predict charges it: its
// time less the backward it overlaps (`overlap_s`), so where the dense reduction hides behind
// backward, compression cannot pay.
//
// Bytes (per rank per reduction, P ranks, N_c compressible elements, k = density N_c, N_d dense):
//   topk, dgc          all-gather: (P-1) (b k / 8 + 4 [+ 9 per piece packed]), b = pair_bits (64 unpacked)
//                                                             split_reduce: (P-1)/P 16 k + 4 (P-1) + 4 (P-1)
//   temporal           (refresh + (R-1) shared-index all-reduces of k values, 2 (P-1)/P 4 k) / R
//   blocktopk          (P-1) (4 + 4 B) k / B   (one index per block of B)
//   powersgd           2 (P-1)/P 4 sum over matrices (rows + cols) r
//   sign               (P-1) (N_c / 8 + 4 per entry)
//   + the dense pieces (1-D entries: norms, biases): a ring all-reduce of N_d fp32, or with
//     small_pieces = "sign" (P-1) (N_d / 8 + 4 per piece), as sign's.
// The runtime's exact count is its ledger (metrics.jsonl bytes_sent); this model uses k = density
// N_c where the runtime rounds k up per entry and bucket, counts pieces by the planner's entry
// classes (plan/optimizer_cost.hpp: one bias entry per layer, where the runtime has one piece per
// entry per bucket), and takes every 1-D entry as a small piece (the runtime compresses a 1-D
// piece of min_compress elements or more, e.g. GPT-2's 3072-wide fc bias); the packed pairs'
// padding to a 32-bit word per message is left out.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "catalog/device.hpp"
#include "job/job.hpp"
#include "plan/plan.hpp"

namespace exatrain::plan {

struct CompressionCost {
  std::string compressor;
  double density = 0;       // sent values / compressible elements (powersgd: factor elements; sign: 1/32)
  double elements = 0;      // compressible elements per rank
  double dense_bytes = 0;   // what the dense fp32 reduction sends per rank (ring)
  double bytes = 0;         // what the compressor sends per rank
  double comm_s = 0;        // its collectives
  double compute_s = 0;     // selection, error feedback, decompression, PowerSGD's GEMMs
  // Of compute_s, what the sparse collective itself does beside the wire (the collectives
  // benchmark times it with the collective): zeroing the n outputs, scatter-adding the received
  // pairs, split-and-reduce's passes over the owned region, and the packed codec. 0 for powersgd
  // and sign, which are not sparse collectives (their decoding stays in compute_s).
  double decode_s = 0;
  double dense_s = 0;       // the dense fp32 reduction of the same gradients, exposed (less the overlap)
  // Sparsifiers: the density at which comm_s + compute_s = dense_s (compression pays below it);
  // 0 when it never pays, 1 when it pays at any density. None for powersgd and sign.
  std::optional<double> break_even_density;
  double seconds() const { return comm_s + compute_s; }
  bool pays() const { return seconds() < dense_s; }
};

// One reduction of pipeline rank `pp_rank`'s gradients over the plan's dp x cp replicas under its
// [comm] compressor (p.comm.active(), dp x cp > 1); reduce_scatter: ZeRO 1/2's dense reference;
// overlap_s: the backward time the dense reduction would hide behind (predict's bwd_mb).
CompressionCost compression_cost(const ModelSpec& m, const MachineSpec& mach, const Device& d, const Plan& p,
                                 int64_t pp_rank, bool reduce_scatter, double overlap_s);

// The same model for `elements` compressible fp32 elements (no dense pieces) over a group of `ranks`
// ranks placed `stride` apart: the collectives benchmark's predicted break-even (bench/comm).
CompressionCost compression_cost_flat(const CommSpec& c, const MachineSpec& mach, const Device& d, double elements,
                                      int64_t ranks, int64_t stride);

// The bits one sent pair of the all-gather of pairs takes ([comm] values, indices;
// parallel/pair_codec.hpp): the value's 32 (fp32), 16 (bf16) or 1 (sign) bits plus the index's 32
// (int32) or the expected length of a Rice code of the gaps (golomb), which for gaps about
// geometric with mean 1/density is b + 1 + q^m / (1 - q^m) bits, q = 1 - density, m = 2^b, at the
// best b (about log2(1/density) + 1.5).
double pair_bits(const CommSpec& c, double density);

// predict's "compression" object and its lines in the table.
nlohmann::json to_json(const CompressionCost& c);
std::string to_lines(const CompressionCost& c);

}  // namespace exatrain::plan
