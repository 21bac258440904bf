// The planner's model of compressed data-parallel communication (plan/compression.hpp): the bytes
// each compressor puts on the wire against its formula, the split-and-reduce's volume that does
// not grow with the ranks where the all-gather's does, the break-even density (cost equals the
// dense reduction's there, pays below, not above), and predict charging it in dp_comm.
#include <gtest/gtest.h>

#include <cmath>

#include "catalog/device.hpp"
#include "job/parse.hpp"
#include "plan/compression.hpp"
#include "plan/predict.hpp"

using namespace exatrain;
using namespace exatrain::plan;

namespace {

CommSpec spec(const std::string& c, double density) {
  CommSpec s;
  s.compressor = c;
  s.density = density;
  return s;
}

const MachineSpec& frontier() {
  static const MachineSpec m = find_cluster("frontier");
  return m;
}

}  // namespace

TEST(Compression, BytesFollowEachCollectivesFormula) {
  const Device& d = find_device(frontier().device);
  const double n = 1e8, p = 16, k = 0.01 * n;
  CompressionCost c = compression_cost_flat(spec("topk", 0.01), frontier(), d, n, 16, 8);
  EXPECT_DOUBLE_EQ(c.dense_bytes, 2 * (p - 1) / p * 4 * n);
  EXPECT_DOUBLE_EQ(c.bytes, (p - 1) * (8 * k + 4));
  CommSpec split = spec("topk", 0.01);
  split.collective = "split_reduce";
  c = compression_cost_flat(split, frontier(), d, n, 16, 8);
  // The pairs to their owners, the all-to-all of P counts, the kept pairs' all-gather's count.
  EXPECT_DOUBLE_EQ(c.bytes, (p - 1) / p * 16 * k + 4 * (p - 1) + 4 * (p - 1));
  CommSpec temporal = spec("temporal", 0.01);
  temporal.refresh_every = 10;
  c = compression_cost_flat(temporal, frontier(), d, n, 16, 8);
  EXPECT_DOUBLE_EQ(c.bytes, ((p - 1) * (8 * k + 4) + 9 * 2 * (p - 1) / p * 4 * k) / 10);
  CommSpec blocks = spec("blocktopk", 0.01);
  blocks.block_size = 256;
  c = compression_cost_flat(blocks, frontier(), d, n, 16, 8);
  EXPECT_NEAR(c.bytes, (p - 1) * ((4 + 4 * 256) * k / 256 + 4), 1e-6 * c.bytes);
  c = compression_cost_flat(spec("sign", 1), frontier(), d, n, 16, 8);
  EXPECT_DOUBLE_EQ(c.bytes, (p - 1) * (n / 8 + 4));
  EXPECT_DOUBLE_EQ(c.density, 1.0 / 32);
}

TEST(Compression, PackedPairsCostTheirBitsOnTheWire) {
  // Rice-coded gaps at density d: the geometric gap's expected code length at the best b. At 1%:
  // b = 6 (m = 64): 7 + 0.99^64 / (1 - 0.99^64) = 7 + 1.1098; b = 7: 8 + 0.3826; b = 5: 6 + 3.1... : 8.11.
  CommSpec c = spec("topk", 0.01);
  EXPECT_DOUBLE_EQ(pair_bits(c, 0.01), 64);
  c.values = "bf16";
  EXPECT_DOUBLE_EQ(pair_bits(c, 0.01), 48);
  c.values = "sign", c.indices = "golomb";
  const double qm = std::pow(0.99, 64);
  EXPECT_NEAR(pair_bits(c, 0.01), 1 + 7 + qm / (1 - qm), 1e-12);
  EXPECT_NEAR(pair_bits(c, 0.001), 1 + std::log2(1000.0) + 1.5, 0.1);
  // The all-gather's bytes follow (flat: one piece, its header a 32-bit count, b's 5 bits and the
  // 32-bit magnitude).
  const Device& d = find_device(frontier().device);
  const double n = 1e8, p = 16, k = 0.01 * n;
  const CompressionCost cost = compression_cost_flat(c, frontier(), d, n, 16, 8);
  EXPECT_NEAR(cost.bytes, (p - 1) * (pair_bits(c, 0.01) / 8 * k + 4 + 69.0 / 8), 1e-9 * cost.bytes);
  EXPECT_LT(cost.bytes * 7, compression_cost_flat(spec("topk", 0.01), frontier(), d, n, 16, 8).bytes);
}

TEST(Compression, SplitAndReduceVolumeDoesNotGrowWithRanksButTheAllGathersDoes) {
  const Device& d = find_device(frontier().device);
  CommSpec gather = spec("topk", 0.001), split = gather;
  split.collective = "split_reduce";
  const double n = 1e9;
  const double g8 = compression_cost_flat(gather, frontier(), d, n, 8, 8).bytes;
  const double g512 = compression_cost_flat(gather, frontier(), d, n, 512, 8).bytes;
  const double s8 = compression_cost_flat(split, frontier(), d, n, 8, 8).bytes;
  const double s512 = compression_cost_flat(split, frontier(), d, n, 512, 8).bytes;
  EXPECT_NEAR(g512 / g8, 511.0 / 7.0, 0.01);
  EXPECT_LT(s512 / s8, 1.15);  // (P-1)/P 16 k bytes (+14% from 7/8 to 511/512), plus 8 (P - 1) bytes of counts
  const double k = 0.001 * n;
  EXPECT_NEAR(s512, 511.0 / 512 * 16 * k + 8 * 511, 1e-9 * s512);
}

TEST(Compression, TheCollectivesOwnDecodingIsThePartOfComputeItTimes) {
  // decode_s: the zero fill of the n outputs and the scatter-add of every rank's pairs (3 passes of
  // 4 n bytes per unit density per rank) at the device's stream rate; the packed codec adds
  // (1 + P) k pairs coded; split-and-reduce the owner's region (2 / P) and one scatter of k.
  const Device& d = find_device(frontier().device);
  const double n = 1e8, p = 16, dens = 0.01, k = dens * n, rate = d.hbm_bw_gbs * 1e9 * d.bw_efficiency;
  const CompressionCost gather = compression_cost_flat(spec("topk", dens), frontier(), d, n, 16, 8);
  EXPECT_NEAR(gather.decode_s, (1 + 3 * p * dens) * 4 * n / rate, 1e-9 * gather.decode_s);
  EXPECT_LT(gather.decode_s, gather.compute_s);  // the selection and error feedback are not the collective's
  CommSpec split = spec("topk", dens);
  split.collective = "split_reduce";
  const CompressionCost sr = compression_cost_flat(split, frontier(), d, n, 16, 8);
  EXPECT_NEAR(sr.decode_s, (1 + 2 / p + 3 * dens) * 4 * n / rate, 1e-9 * sr.decode_s);
  CommSpec packed = spec("topk", dens);
  packed.values = "sign", packed.indices = "golomb";
  const CompressionCost pk = compression_cost_flat(packed, frontier(), d, n, 16, 8);
  EXPECT_GT(pk.decode_s - gather.decode_s, (1 + p) * k * 1e-8);  // the codec: 1.3e-8 s a pair coded
  EXPECT_LT(pk.decode_s, pk.compute_s);
  EXPECT_EQ(compression_cost_flat(spec("powersgd", 1), frontier(), d, n, 16, 8).decode_s, 0.0);
  EXPECT_EQ(compression_cost_flat(spec("sign", 1), frontier(), d, n, 16, 8).decode_s, 0.0);
}

TEST(Compression, BreakEvenDensityIsWhereTheCostMeetsTheDenseReduction) {
  const Device& d = find_device(frontier().device);
  for (const char* collective : {"allgather", "split_reduce"}) {
    CommSpec s = spec("topk", 0.01);
    s.collective = collective;
    const CompressionCost c = compression_cost_flat(s, frontier(), d, 64e6, 64, 8);
    ASSERT_TRUE(c.break_even_density.has_value());
    const double be = *c.break_even_density;
    ASSERT_GT(be, 0.0) << collective;
    ASSERT_LT(be, 1.0) << collective;
    s.density = be;
    const CompressionCost at = compression_cost_flat(s, frontier(), d, 64e6, 64, 8);
    EXPECT_NEAR(at.seconds(), at.dense_s, 1e-6 * at.dense_s) << collective;
    s.density = be / 2;
    EXPECT_TRUE(compression_cost_flat(s, frontier(), d, 64e6, 64, 8).pays()) << collective;
    s.density = std::min(1.0, be * 2);
    EXPECT_FALSE(compression_cost_flat(s, frontier(), d, 64e6, 64, 8).pays()) << collective;
  }
  EXPECT_FALSE(compression_cost_flat(spec("powersgd", 1), frontier(), d, 64e6, 64, 8).break_even_density);
}

TEST(Compression, PredictChargesTheCompressedReductionInDpComm) {
  const std::string job = "[model]\npreset = \"gpt2\"\n[machine]\npreset = \"frontier\"\n"
                          "[parallel]\ngpus = 64\ntp = 1\npp = 1\ndp = 64\nzero = 0\nmicro_batch = 4\nglobal_batch = 256\n"
                          "recompute = \"none\"\n";
  auto run = [&](const std::string& comm) {
    const Job j = parse_job(job + comm, "job.toml");
    Plan p = resolve_plan(j.parallel, j.train.precision);
    p.set_optimizer(j.train);
    return predict(j.model, j.machine, p);
  };
  const Prediction dense = run(""), topk = run("[comm]\ncompressor = \"topk\"\ndensity = 0.001\n");
  EXPECT_FALSE(dense.compression.has_value());
  EXPECT_FALSE(to_json(dense).contains("compression"));
  ASSERT_TRUE(topk.compression.has_value());
  EXPECT_DOUBLE_EQ(topk.breakdown.dp_comm, topk.compression->seconds());
  // The all-gather of pairs at dp 64: 63 x 8 k against 2 63/64 x 4 n bytes, 1 / (64 x 0.001) = 15.6x fewer.
  EXPECT_NEAR(topk.compression->dense_bytes / topk.compression->bytes, 15.6, 0.2);
  EXPECT_EQ(to_json(topk)["compression"]["compressor"], "topk");
  EXPECT_EQ(dense.breakdown.compute, topk.breakdown.compute);
  const Prediction psgd = run("[comm]\ncompressor = \"powersgd\"\nrank = 4\n");
  ASSERT_TRUE(psgd.compression.has_value());
  EXPECT_GT(psgd.compression->compute_s, 0.0);  // its GEMMs
  EXPECT_LT(psgd.compression->density, 0.05);   // (rows + cols) r of 768-wide matrices
  // small_pieces = "sign": GPT-2's norms and biases (12 layers x 9,984 + 1,536 = 121,344 elements, in
  // the planner's entry classes 2 norms and 1 bias entry per layer and ln_f: 37 scales) as scaled
  // signs, (P-1) (N_d / 8 + 4 per entry), instead of a ring all-reduce of N_d fp32 (2 (P-1)/P 4 N_d):
  // at dp 64 the all-gather of signs costs about what the ring all-reduce does (63/8 against 7.9).
  const Prediction small = run("[comm]\ncompressor = \"topk\"\ndensity = 0.001\nsmall_pieces = \"sign\"\n");
  ASSERT_TRUE(small.compression.has_value());
  const double nd = 12 * 9984 + 1536, entries = 12 * 3 + 1;
  EXPECT_NEAR(topk.compression->bytes - small.compression->bytes,
              2 * 63.0 / 64 * 4 * nd - 63 * (nd / 8 + 4 * entries), 1e-6 * topk.compression->bytes);
}
