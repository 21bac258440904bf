#include "plan/compression.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "core/check.hpp"
#include "plan/comm.hpp"
#include "plan/optimizer_cost.hpp"

namespace exatrain::plan {
namespace {

struct Matrix { double count = 0, rows = 0, cols = 0; };

// What one rank reduces: compressible elements (and PowerSGD's matrices), dense elements.
struct Gradients {
  double compressible = 0, dense = 0, pieces = 0, dense_pieces = 0;
  std::vector<Matrix> matrices;  // PowerSGD: the 2-D entries worth compressing
};

struct Setting {
  const CommSpec& c;
  const MachineSpec& mach;
  const Device& d;
  Group g;
  bool reduce_scatter = false;
  double overlap_s = 0;  // backward the dense reduction hides behind
};

double stream_rate(const Device& d) { return d.hbm_bw_gbs * 1e9 * d.bw_efficiency; }  // bytes/s

// The dense fp32 reduction of n elements: ring bytes and the best algorithm's time.
void dense(const Setting& s, double n, double* bytes, double* seconds) {
  const double p = double(s.g.size);
  *bytes += (s.reduce_scatter ? 1.0 : 2.0) * (p - 1) / p * 4 * n;
  *seconds += s.reduce_scatter ? best_reduce_scatter_time(4 * n, s.g, s.mach) : best_all_reduce_time(4 * n, s.g, s.mach);
}

}  // namespace

double pair_bits(const CommSpec& c, double density) {
  const double value = c.values == "sign" ? 1 : c.values == "bf16" ? 16 : 32;
  if (c.indices != "golomb") return value + 32;
  const double q = 1 - std::clamp(density, 1e-12, 1.0);
  double best = 32;
  for (int b = 0; b < 31; b++) {
    const double qm = std::pow(q, std::ldexp(1.0, b));  // P(gap >= 2^b)
    best = std::min(best, double(b) + 1 + (qm < 1 ? qm / (1 - qm) : 1e9));
  }
  return value + best;
}

namespace {

// The small pieces (1-D entries: norms, biases): a ring all-reduce of their fp32 elements, or with
// small_pieces = "sign" their scaled signs and one scale per piece, all-gathered (as sign's).
void small_pieces(const Setting& s, const Gradients& x, CompressionCost& out) {
  if (x.dense <= 0) return;
  const double p = double(s.g.size);
  if (s.c.small_pieces == "sign") {
    out.bytes += (p - 1) * (x.dense / 8 + 4 * x.dense_pieces);
    out.comm_s += best_all_gather_time(p * x.dense / 8, s.g, s.mach) +
                  best_all_gather_time(4 * p * x.dense_pieces, s.g, s.mach);
    out.compute_s += (4 + 2 * p) * 4 * x.dense / stream_rate(s.d);  // |x| sum, pack, every rank's unpack, the residual's
    return;
  }
  Setting all_reduce = s;
  all_reduce.reduce_scatter = false;  // the dense pieces are all-reduced
  double bytes = 0, seconds = 0;
  dense(all_reduce, x.dense, &bytes, &seconds);
  out.bytes += bytes;
  out.comm_s += seconds;
}

// Packed pairs beyond their bits: each piece's header (a 32-bit count; Rice's b, 5 bits; the sign
// magnitude, 32 bits; the message's padding to a word is left out) and the host codec, bit-serial:
// this rank's k pairs quantized and encoded, every rank's decoded, at kCodecSecondsPerPair each.
// Measured with bench_sparse_collectives at one rank (the packed all-gather less the plain one:
// 2 k pairs coded, encoded and decoded): 12.9 to 13.9 ns per pair on this 2-core machine at load
// average 3 (4M and 16M floats at densities 1% and 10%; `OMPI_ALLOW_RUN_AS_ROOT=1 mpirun -np 1
// build/bench/comm/bench_sparse_collectives --sizes 4194304,16777216 --densities 0.01,0.1 --reps 5`),
// after the Rice parameter's search went from 31 passes over the gaps to a few (pair_codec.cpp
// best_rice); 41-118 ns before, under load average 8.5. A host's figure, not a fitted constant.
constexpr double kCodecSecondsPerPair = 1.3e-8;
void packed_extras(const Setting& s, const Gradients& x, double k, CompressionCost& out) {
  const double p = double(s.g.size);
  const double header_bits = 32 + (s.c.indices == "golomb" ? 5 : 0) + (s.c.values == "sign" ? 32 : 0);
  out.bytes += (p - 1) * header_bits / 8 * x.pieces;
  out.compute_s += (1 + p) * k * kCodecSecondsPerPair;
  out.decode_s += (1 + p) * k * kCodecSecondsPerPair;
}

// The compressors that send (index, value) pairs or blocks over a sparse collective, with a density
// and a break-even: not powersgd and sign.
bool sparsifier(const CommSpec& c) {
  return c.compressor == "topk" || c.compressor == "dgc" || c.compressor == "temporal" || c.compressor == "blocktopk";
}

// PowerSGD rank r: the two factor all-reduces (P = M Q, then Q = M^T P) of each matrix entry and
// the GEMMs at the fp32 GEMM rate; returns the element-wise passes it adds (residual -= M' / P).
double powersgd_cost(const Setting& s, const Gradients& x, CompressionCost& out) {
  const double p = double(s.g.size), r = double(s.c.rank);
  double factors = 0, flops = 0, prow = 0, qcol = 0;
  for (const Matrix& m : x.matrices) {
    factors += m.count * (m.rows + m.cols) * r;
    flops += m.count * (6 * m.rows * m.cols * r + 2 * m.rows * r * r);  // P = MQ, Q = M^T P, M' = P Q^T; Gram-Schmidt
    out.bytes += 2 * (p - 1) / p * 4 * m.count * (m.rows + m.cols) * r;
    prow += m.count * m.rows * r, qcol += m.count * m.cols * r;
  }
  out.comm_s += best_all_reduce_time(4 * prow, s.g, s.mach) + best_all_reduce_time(4 * qcol, s.g, s.mach);
  out.compute_s += flops / (s.d.peak_tflops(Precision::fp32) * 1e12 * s.d.gemm_efficiency);
  out.density = x.compressible > 0 ? factors / x.compressible : 0;
  return 3;
}

// 1-bit: every element's sign and one scale per piece, all-gathered; returns the passes it adds
// (|x| sum, pack, every rank's unpack, the residual's).
double sign_cost(const Setting& s, const Gradients& x, CompressionCost& out) {
  const double p = double(s.g.size), n = x.compressible;
  out.density = 1.0 / 32;
  out.bytes += (p - 1) * (n / 8 + 4 * x.pieces);
  out.comm_s += best_all_gather_time(p * n / 8, s.g, s.mach) + best_all_gather_time(4 * p * x.pieces, s.g, s.mach);
  return 4 + 2 * p;
}

// The compressed reduction at density `density` (sparsifiers) of the gradients x.
CompressionCost cost_at(const Setting& s, const Gradients& x, double density) {
  const CommSpec& c = s.c;
  const double p = double(s.g.size), n = x.compressible, rate = stream_rate(s.d);
  CompressionCost out;
  out.compressor = c.compressor;
  out.elements = n;
  dense(s, n + x.dense, &out.dense_bytes, &out.dense_s);
  out.dense_s = std::max(0.0, out.dense_s - s.overlap_s);
  double passes = c.error_feedback || c.compressor == "dgc" ? 7 : 4;  // accumulate, residual norm, result copy, zero fill
  // Of those passes, the collective's own (decode_s): the zero fill and what each branch adds.
  double decode_passes = 1;
  const double k = density * n;
  auto gather = [&](double elem_bytes, double count) {  // all-gather of `count` items per rank (+ the counts)
    out.bytes += (p - 1) * (elem_bytes * count + 4);
    out.comm_s += best_all_gather_time(p * elem_bytes * count, s.g, s.mach) + best_all_gather_time(4 * p, s.g, s.mach);
  };
  auto topk_exchange = [&] {
    // Select above a sampled threshold (one pass), or the exact radix selection (three passes over
    // the magnitudes: two histograms and the collection, backend cpu_compress_ops.cpp topk_abs).
    passes += c.selection == "sample" ? 1 : 3;
    if (c.collective == "allgather") {
      gather(pair_bits(c, density) / 8, k);
      passes += 3 * p * density;  // scatter every rank's pairs
      decode_passes += 3 * p * density;
      if (c.packs_pairs()) packed_extras(s, x, k, out);
      return;
    }
    // Split, the counts (an all-to-all of P counts: 4 (P - 1) bytes, timed as an all-gather of P
    // counts, Bruck's log P rounds for small blocks), the kept pairs' all-gather and its counts.
    out.bytes += (p - 1) / p * 16 * k + 4 * (p - 1) + 4 * (p - 1);
    out.comm_s += (p - 1) * p2p_time(8 * k / p, s.g.per_node == s.g.size, s.mach) +
                  best_all_gather_time(4 * p, s.g, s.mach) + best_all_gather_time(8 * k, s.g, s.mach) +
                  best_all_gather_time(4 * p, s.g, s.mach);
    passes += 3 * density + 5;  // scatters, the add-back of what the kept set dropped
    // The owner's region (n / P): its zero fill and the selection of the kept pairs (one pass,
    // three more when more than `keep` are nonzero; one counted), and the scatters.
    decode_passes += 2 / p + 3 * density;
  };
  if (c.compressor == "topk" || c.compressor == "dgc") {
    out.density = density;
    topk_exchange();
    if (c.compressor == "dgc") passes += 7;  // clip norm, momentum, v += u
  } else if (c.compressor == "temporal") {
    out.density = density;
    // One refresh (a top-k step) and R - 1 shared-index all-reduces of k values, averaged.
    const double r = double(c.refresh_every);
    topk_exchange();
    const double reuse_bytes = 2 * (p - 1) / p * 4 * k, reuse_s = best_all_reduce_time(4 * k, s.g, s.mach);
    out.bytes = (out.bytes + (r - 1) * reuse_bytes) / r;
    out.comm_s = (out.comm_s + (r - 1) * reuse_s) / r;
    passes = (passes + (r - 1) * (7 + 4 * density)) / r;  // gather k, clear k, scatter k, fill
    decode_passes = (decode_passes + (r - 1) * (1 + 3 * density)) / r;  // the reuse steps: fill, scatter k
  } else if (c.compressor == "blocktopk") {
    out.density = density;
    const double block = double(c.block_size), kb = density * n / block;
    gather(4 + 4 * block, kb);
    passes += 1 + 3 * p * density + 2 * density;  // block norms, gather, scatter every rank's, clear
    decode_passes += 3 * p * density;
  } else if (c.compressor == "powersgd") {
    passes += powersgd_cost(s, x, out);
  } else if (c.compressor == "sign") {
    passes += sign_cost(s, x, out);
  } else {
    EXA_FAIL("compression_cost: compressor \"{}\" has no model", c.compressor);
  }
  out.compute_s += passes * 4 * n / rate;
  if (sparsifier(c)) out.decode_s += decode_passes * 4 * n / rate;
  small_pieces(s, x, out);
  return out;
}

CompressionCost cost(const Setting& s, const Gradients& x) {
  const bool sparse = sparsifier(s.c);
  CompressionCost out = cost_at(s, x, sparse ? s.c.density : 0);
  if (!sparse) return out;
  // Bisection on the density: the cost grows with it (more pairs sent and scattered).
  auto excess = [&](double d) { const CompressionCost c = cost_at(s, x, d); return c.seconds() - c.dense_s; };
  if (excess(1e-7) >= 0 || out.dense_s <= 0) out.break_even_density = 0.0;
  else if (excess(1.0) < 0) out.break_even_density = 1.0;
  else {
    double lo = 1e-7, hi = 1.0;
    for (int i = 0; i < 60; i++) {
      const double mid = std::sqrt(lo * hi);  // geometric: densities span decades
      (excess(mid) < 0 ? lo : hi) = mid;
    }
    out.break_even_density = lo;
  }
  return out;
}

}  // namespace

CompressionCost compression_cost(const ModelSpec& m, const MachineSpec& mach, const Device& d, const Plan& p,
                                 int64_t pp_rank, bool reduce_scatter, double overlap_s) {
  EXA_CHECK(p.comm.active() && p.dp * p.cp > 1, "compression_cost: no compressor or no dp group");
  Gradients x;
  for (const EntryClass& e : entry_classes(m, p, pp_rank)) {
    const double elems = e.elements();
    const bool small = double(e.rows) * double(e.cols) < double(p.comm.min_compress);
    if (!e.two_d || small) {  // 1-D entries (norms, biases) and small ones: dense
      x.dense += elems;
      x.dense_pieces += double(e.count);
      continue;
    }
    if (p.comm.compressor == "powersgd") {
      const double r = double(p.comm.rank), rows = double(e.rows), cols = double(e.cols);
      if (2 * (rows + cols) * r >= rows * cols) {  // PyTorch's min_compression_rate 2
        x.dense += elems;
        x.dense_pieces += double(e.count);
        continue;
      }
      x.matrices.push_back({double(e.count), rows, cols});
    }
    x.compressible += elems;
    x.pieces += double(e.count);
  }
  const Setting s{p.comm, mach, d, group_on_machine(p.dp * p.cp, p.tp, mach.gpus_per_node), reduce_scatter, overlap_s};
  return cost(s, x);
}

CompressionCost compression_cost_flat(const CommSpec& c, const MachineSpec& mach, const Device& d, double elements,
                                      int64_t ranks, int64_t stride) {
  Gradients x;
  x.compressible = elements;
  x.pieces = 1;
  const double side = std::sqrt(elements);
  x.matrices.push_back({1, side, side});
  const Setting s{c, mach, d, group_on_machine(ranks, stride, mach.gpus_per_node), false, 0.0};
  return cost(s, x);
}

nlohmann::json to_json(const CompressionCost& c) {
  nlohmann::json j = {{"compressor", c.compressor},       {"density", c.density},
                      {"elements", c.elements},           {"dense_bytes", c.dense_bytes},
                      {"bytes", c.bytes},                 {"reduction", c.bytes > 0 ? c.dense_bytes / c.bytes : 0.0},
                      {"comm_s", c.comm_s},               {"compute_s", c.compute_s},
                      {"decode_s", c.decode_s},           {"dense_s", c.dense_s},             {"pays", c.pays()}};
  j["break_even_density"] = c.break_even_density ? nlohmann::json(*c.break_even_density) : nlohmann::json(nullptr);
  return j;
}

std::string to_lines(const CompressionCost& c) {
  std::string s = fmt::format("compression  {}: {:.4g} MB per rank per reduction instead of {:.4g} ({:.1f}x fewer); "
                              "{:.4g} s (comm {:.4g} + compute {:.4g}) against {:.4g} s dense (exposed): {}\n",
                              c.compressor, c.bytes / 1e6, c.dense_bytes / 1e6, c.bytes > 0 ? c.dense_bytes / c.bytes : 0.0,
                              c.seconds(), c.comm_s, c.compute_s, c.dense_s, c.pays() ? "pays" : "does not pay");
  if (c.break_even_density && *c.break_even_density <= 0)
    s += "  break-even density: none (the selection and decoding alone cost more than the exposed dense reduction)\n";
  else if (c.break_even_density)
    s += fmt::format("  break-even density {:.4g} (density {:.4g}: compression pays below the break-even)\n",
                     *c.break_even_density, c.density);
  return s;
}

}  // namespace exatrain::plan
