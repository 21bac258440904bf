// The gradient compressors of the job's [comm] table (docs/compression.md), plugged into the
// compressor slot (parallel/compressor.hpp) by make_compressor, chosen once at start-up:
//
//   "topk"       the k = density x n entries of largest magnitude, with error feedback (what is not
//                sent is kept and added to the next step's gradient: Seide et al. 2014, Stich et al.
//                2018, GRACE's residual memory); per parameter entry (scope = "entry": every layer
//                gets its density, role_density sets one per role) or per bucket; selection exact
//                (radix selection) or by a sampled threshold (DGC); all-gather of (index, value) pairs
//                or Ok-Topk-style split-and-reduce (parallel/sparse_collectives.hpp).
//   "dgc"        Deep Gradient Compression (Lin et al., ICLR 2018): momentum correction (the
//                velocity u = m u + g is accumulated, v += u, and v is sparsified), local gradient
//                clipping, momentum-factor masking (u and v cleared where sent), exponential density
//                warm-up; the optimizer is SGD without momentum (job/parse.cpp refuses others).
//   "blocktopk"  spatial: the blocks of block_size elements with the largest norms (one index per
//                block on the wire), per entry or per bucket, with error feedback.
//   "temporal"   temporal: the index set is chosen every refresh_every steps (a top-k step) and
//                reused in between, where one shared-index all-reduce of the values suffices (large
//                gradients stay where they are: the measured overlap of successive sets is in
//                metrics.jsonl), with error feedback.
//   "powersgd"   PowerSGD (Vogels et al., NeurIPS 2019; PyTorch's powerSGD_hook): rank-r P = M Q,
//                all-reduce, orthogonalise, Q = M^T P, all-reduce, M ~ P Q^T; Q warm-started across
//                steps; error feedback; entries that are not matrices, or not compressible by 2x
//                (PyTorch's min_compression_rate), are all-reduced dense.
//   "sign"       1-bit: sign bits and one scale (mean |x|) per entry, all-gathered, with error
//                feedback (EF-SignSGD, Karimireddy et al., ICML 2019).
// Every compressor is deterministic and gives every rank the same bits (pairs and signs are added
// in rank order), so data-parallel replicas stay identical. Pieces of an entry with fewer than
// min_compress elements go dense (one all-reduce per bucket). The collectives run blocking in
// start() (a sparse exchange has data-dependent sizes; the dense identity overlaps backward).
// At dp 1 every compressor is the identity. Each reports its step figures (step_stats): elements,
// density, residual_norm, index_overlap (topk-family: |S_t ∩ S_t-1| / |S_t-1| of this rank's
// successive sent sets; temporal: of the new set and the old at a refresh), gradient_overlap (the
// same for the raw gradient's top-k sets, before error feedback, every overlap_every steps),
// refreshed, threshold_fallbacks, dense_equivalent_bytes (what the fp32 collective of the same
// buckets sends).
//
// Owns: the compressors. May use: backend/, job/ (CommSpec), parallel/ (comm, compressor,
// sparse_collectives).
#pragma once
#include <cstdint>
#include <memory>

#include "job/job.hpp"
#include "parallel/compressor.hpp"

namespace exatrain::parallel {

struct CompressorContext {
  uint64_t seed = 0;        // PowerSGD's initial Q, the sampled threshold's draws
  double grad_clip = 0;     // [train] grad_clip: DGC's local clipping threshold (0: none)
  int64_t total_params = 0; // elements of this rank's gradient arenas (DGC's per-bucket clip share)
  bool reduce_bf16 = false; // [train] grad_reduce_dtype = "bf16": "none" is the dense bf16 collective
};

// The compressor of `spec` ("none": the identity, or Bf16ReduceCompressor with ctx.reduce_bf16).
// The spec was checked by the job parser.
std::shared_ptr<Compressor> make_compressor(const CommSpec& spec, const CompressorContext& ctx);

}  // namespace exatrain::parallel
