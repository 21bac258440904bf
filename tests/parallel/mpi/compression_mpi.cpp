// Under mpirun (1, 2, 4, 8 ranks): the sparse collectives (parallel/sparse_collectives.hpp) and the
// [comm] compressors (parallel/compressors.hpp) against references every rank computes alone.
//   * Collectives: all-gather of pairs, split-and-reduce (scatter and all), shared-index all-reduce
//     against the dense sum of every rank's pairs, bit for bit (both add in rank order; the
//     shared-index one to MPI's reduction order), and the ledger against the ring convention exactly.
//   * Compressors: topk (all-gather and split-and-reduce, entry scope with role densities and
//     dense small pieces), temporal, blocktopk, dgc and sign over several steps against a host
//     emulation of the algorithm with error feedback, bit for bit; PowerSGD reconstructs a
//     low-rank sum exactly (to float rounding); a reduce-scatter gives the all-reduce's shard;
//     every rank ends with the same bits; at one rank every compressor is the identity.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <tuple>

#include "backend/backend.hpp"
#include "model/layout.hpp"
#include "parallel/compressors.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/sparse_collectives.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

namespace {

Backend& be() {
  static std::unique_ptr<Backend> b = make_cpu_backend(1);
  return *b;
}

// Distinct magnitudes (no ties unless wanted), a step-dependent pattern, computed in double and
// rounded once (FMA contraction could round a float expression differently at two call sites).
float grad(int rank, int64_t i, int step) {
  return float(std::sin(0.37 * double(i) + 1.3 * rank + 0.71 * step) * (1.0 + 0.01 * double((i * 7919) % 101)));
}

std::vector<float> down(const float* dev, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  be().download(h.data(), dev, sizeof(float) * size_t(n));
  return h;
}

struct DevF {
  DeviceBuffer b;
  explicit DevF(const std::vector<float>& h) : b(be(), std::max<int64_t>(int64_t(h.size()), 1)) {
    if (!h.empty()) be().upload(b.data(), h.data(), sizeof(float) * h.size());
  }
  float* p() const { return b.data(); }
};
struct DevI {
  DeviceBuffer b;
  explicit DevI(const std::vector<int32_t>& h) : b(be(), std::max<int64_t>(int64_t(h.size()), 1)) {
    if (!h.empty()) be().upload(b.data(), h.data(), 4 * h.size());
  }
  const int32_t* p() const { return reinterpret_cast<const int32_t*>(b.data()); }
};

bool same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> first = v;
  MPI_Bcast(first.data(), int(first.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::memcmp(first.data(), v.data(), 4 * v.size()) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Rank r's pairs for the collective tests: a rank-dependent subset, so counts differ.
void pairs_of(int r, int64_t n, std::vector<int32_t>* idx, std::vector<float>* val) {
  idx->clear(), val->clear();
  for (int64_t i = 0; i < n; i++)
    if ((i * 7 + r) % 5 == 0 || (r == 1 && i % 3 == 0)) idx->push_back(int32_t(i)), val->push_back(grad(r, i, 0));
}

// The k largest magnitudes of x[lo, hi) (ties: the lower index), ascending.
std::vector<int32_t> host_topk(const std::vector<float>& x, int64_t lo, int64_t hi, int64_t k) {
  std::vector<int32_t> o(static_cast<size_t>(hi - lo));
  std::iota(o.begin(), o.end(), int32_t(lo));
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return std::fabs(x[size_t(a)]) > std::fabs(x[size_t(b)]); });
  o.resize(size_t(k));
  std::sort(o.begin(), o.end());
  return o;
}

}  // namespace

TEST(SparseCollectivesMpi, AllGatherOfPairsEqualsTheDenseSumAndCountsRingBytes) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be());
  const int p = g.size(), me = g.rank();
  const int64_t n = 1001;
  std::vector<int32_t> idx;
  std::vector<float> val, want(size_t(n), 0.0f);
  std::vector<int64_t> counts;
  for (int r = 0; r < p; r++) {
    pairs_of(r, n, &idx, &val);
    counts.push_back(int64_t(idx.size()));
    for (size_t j = 0; j < idx.size(); j++) want[size_t(idx[j])] += val[j];
  }
  pairs_of(me, n, &idx, &val);
  DevI di(idx);
  DevF dv(val), out(std::vector<float>(size_t(n), 7.0f));
  Scratch s(be());
  allgather_pairs_sum(g, be(), {di.p(), dv.p(), int64_t(idx.size())}, n, out.p(), s);
  EXPECT_EQ(down(out.p(), n), want);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
  // counts: ring all-gather of p ints; pairs: all_gather_v of indices and values.
  EXPECT_EQ(ledger.bytes["dp_all_gather"], 4 * (p - 1) + 2 * 4 * (total - counts[size_t((me + 1) % p)]));
}

TEST(SparseCollectivesMpi, PackedPairsAllGatherEqualsTheSumOfTheQuantizedPairs) {
  // Every rank's pairs rounded to signs x one magnitude per segment, Rice-coded: the sum of the
  // rounded pairs bit for bit, and the ledger the counts plus every other rank's words.
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be());
  const int p = g.size(), me = g.rank();
  const int64_t n = 1001;
  const std::vector<PairSegment> segs = {{0, 400}, {400, 1001}};
  const PairFormat format{PairIndices::rice, PairValues::sign};
  std::vector<int32_t> idx;
  std::vector<float> val, want(size_t(n), 0.0f), mine;
  std::vector<int64_t> words;
  for (int r = 0; r < p; r++) {
    pairs_of(r, n, &idx, &val);
    quantize_pairs(idx.data(), val.data(), int64_t(idx.size()), segs, format.values);
    words.push_back(int64_t(encode_pairs(idx.data(), val.data(), int64_t(idx.size()), segs, format).size()));
    for (size_t j = 0; j < idx.size(); j++) want[size_t(idx[j])] += val[j];
    if (r == me) mine = val;
  }
  pairs_of(me, n, &idx, &val);
  DevI di(idx);
  DevF dv(mine), out(std::vector<float>(size_t(n), 7.0f));
  Scratch s(be());
  allgather_packed_sum(g, be(), {di.p(), dv.p(), int64_t(idx.size())}, n, segs, format, out.p(), s);
  EXPECT_EQ(down(out.p(), n), want);
  const int64_t total = std::accumulate(words.begin(), words.end(), int64_t(0));
  EXPECT_EQ(ledger.bytes["dp_all_gather"], p == 1 ? 0 : 4 * (p - 1) + 4 * (total - words[size_t((me + 1) % p)]));
}

TEST(SparseCollectivesMpi, SplitAndReduceGivesEachRegionItsSumAndKeepsTheLargest) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be());
  const int p = g.size(), me = g.rank();
  const int64_t n = 997, region = (n + p - 1) / p;
  std::vector<int32_t> idx;
  std::vector<float> val, sum(size_t(n), 0.0f);
  std::vector<std::vector<int64_t>> to(static_cast<size_t>(p), std::vector<int64_t>(size_t(p), 0));  // pairs r -> region q
  for (int r = 0; r < p; r++) {
    pairs_of(r, n, &idx, &val);
    for (size_t j = 0; j < idx.size(); j++) sum[size_t(idx[j])] += val[j], to[size_t(r)][size_t(idx[j] / region)]++;
  }
  pairs_of(me, n, &idx, &val);
  DevI di(idx);
  DevF dv(val), reg(std::vector<float>(size_t(region), 3.0f));
  Scratch s(be());
  split_reduce_scatter(g, be(), {di.p(), dv.p(), int64_t(idx.size())}, n, region, reg.p(), s);
  const std::vector<float> got = down(reg.p(), region);
  for (int64_t i = 0; i < region; i++) {
    const int64_t at = me * region + i;
    ASSERT_EQ(got[size_t(i)], at < n ? sum[size_t(at)] : 0.0f) << "element " << at;
  }
  int64_t sent = 0;
  for (int q = 0; q < p; q++) sent += q == me ? 0 : to[size_t(me)][size_t(q)];
  EXPECT_EQ(ledger.bytes["dp_send"], 8 * sent);                        // indices + values to each owner
  // The counts: P per rank by one all-to-all (what each owner receives), not the P x P matrix.
  EXPECT_EQ(ledger.bytes["dp_all_to_all"], 4 * (int64_t(p) - 1));
  EXPECT_EQ(ledger.bytes.count("dp_all_gather"), 0u);
  // Then every region keeps its `keep` largest (its nonzeros when fewer), all-gathered.
  const int64_t keep = 25;
  std::vector<float> want(static_cast<size_t>(n), 0.0f);
  for (int q = 0; q < p; q++) {
    const int64_t lo = std::min(n, q * region), hi = std::min(n, lo + region);
    int64_t nz = 0;
    for (int64_t i = lo; i < hi; i++) nz += sum[size_t(i)] != 0;
    for (int32_t i : host_topk(sum, lo, hi, std::min(keep, nz))) want[size_t(i)] = sum[size_t(i)];
  }
  std::vector<int64_t> kept_by(static_cast<size_t>(p), 0);  // what owner q keeps: min(keep, its nonzeros)
  for (int q = 0; q < p; q++)
    for (int64_t i = std::min(n, q * region); i < std::min(n, q * region + region); i++)
      kept_by[size_t(q)] += want[size_t(i)] != 0;
  DevF out(std::vector<float>(size_t(n), 5.0f));
  ledger.reset();
  const SparsePairs kept = split_reduce_all(g, be(), {di.p(), dv.p(), int64_t(idx.size())}, n, keep, out.p(), s);
  EXPECT_EQ(down(out.p(), n), want);
  int64_t nonzero = 0;
  for (float w : want) nonzero += w != 0;
  EXPECT_EQ(kept.k, nonzero);
  // Its bytes, exactly: the same pairs to their owners and counts, then the kept pairs' all-gather
  // (its count, then index and value of every owner's kept pairs but the next rank's: the ring's).
  EXPECT_EQ(ledger.bytes["dp_send"], 8 * sent);
  EXPECT_EQ(ledger.bytes["dp_all_to_all"], 4 * (int64_t(p) - 1));
  EXPECT_EQ(ledger.bytes["dp_all_gather"], 4 * (int64_t(p) - 1) + 8 * (nonzero - kept_by[size_t((me + 1) % p)]));
}

TEST(SparseCollectivesMpi, SharedIndexAllReduceSumsTheValuesAtCommonIndices) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be());
  const int p = g.size(), me = g.rank();
  const int64_t n = 500;
  std::vector<int32_t> idx;
  for (int32_t i = 3; i < n; i += 17) idx.push_back(i);
  const int64_t k = int64_t(idx.size());
  std::vector<float> val(static_cast<size_t>(k)), want(size_t(n), 0.0f);
  for (int64_t j = 0; j < k; j++) {
    val[size_t(j)] = grad(me, idx[size_t(j)], 1);
    double s = 0;
    for (int r = 0; r < p; r++) s += grad(r, idx[size_t(j)], 1);
    want[size_t(idx[size_t(j)])] = float(s);
  }
  DevI di(idx);
  DevF dv(val), out(std::vector<float>(size_t(n), 1.0f));
  shared_index_all_reduce(g, be(), di.p(), dv.p(), k, n, out.p());
  const std::vector<float> got = down(out.p(), n);
  for (int64_t i = 0; i < n; i++) ASSERT_NEAR(got[size_t(i)], want[size_t(i)], 1e-5) << i;
  EXPECT_TRUE(same_on_every_rank(got));
  EXPECT_EQ(ledger.bytes["dp_all_reduce"], 4 * ring_all_reduce_sent(k, p, me));  // values only
}

namespace {

// The host emulation of a sparsifier with error feedback on every rank: per step, each rank's
// accumulator acc = residual + g, its selection `choose(rank, acc)`, the sum of every rank's
// selected values in rank order, the residual = acc with the selection cleared.
struct Emulation {
  int p;
  int64_t n;
  std::vector<std::vector<float>> residual;
  Emulation(int ranks, int64_t len) : p(ranks), n(len), residual(size_t(ranks), std::vector<float>(size_t(len), 0.0f)) {}
  template <class Choose>
  std::vector<float> step(int t, Choose choose) {
    std::vector<float> out(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t);
      for (int32_t i : choose(r, acc)) out[size_t(i)] += acc[size_t(i)], acc[size_t(i)] = 0;
    }
    return out;
  }
};

// Runs `steps` steps of the compressor on this rank's gradients grad(rank, ., t); returns each step's result.
using GradFn = float (*)(int rank, int64_t i, int step);

std::vector<std::vector<float>> run(const CommSpec& spec, int steps, int64_t n, const ParamLayout* layout = nullptr,
                                    ReduceKind kind = ReduceKind::all_reduce, CommLedger* ledger_out = nullptr,
                                    std::map<std::string, double>* stats = nullptr, GradFn gen = grad,
                                    double grad_clip = 0) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr, &be());
  std::shared_ptr<Compressor> c = make_compressor(spec, {1234, grad_clip, n});
  std::vector<std::vector<float>> results;
  const int p = g.size();
  const int64_t shard = (n + p - 1) / p, padded = kind == ReduceKind::all_reduce ? n : shard * p;
  // The bucket's buffers stay where they are across steps (as the trainer's arenas): without a
  // layout the compressor knows a bucket by its data pointer.
  DevF data(std::vector<float>(size_t(padded), 0.0f)), out(std::vector<float>(size_t(shard), 9.0f));
  for (int t = 1; t <= steps; t++) {
    std::vector<float> h(static_cast<size_t>(padded), 0.0f);
    for (int64_t i = 0; i < n; i++) h[size_t(i)] = gen(g.rank(), i, t);
    be().upload(data.p(), h.data(), sizeof(float) * h.size());
    BucketReduce b;
    b.kind = kind, b.layout = layout, b.begin = 0, b.end = n, b.data = data.p(), b.n = padded, b.shard = shard;
    b.out = kind == ReduceKind::all_reduce ? data.p() : out.p();
    c->begin_step(t);
    ledger.reset();
    if (std::unique_ptr<Reduction> r = c->start(g, be(), b)) r->wait();
    results.push_back(kind == ReduceKind::all_reduce ? down(data.p(), n) : down(out.p(), shard));
    if (stats) *stats = c->step_stats();
  }
  if (ledger_out) *ledger_out = ledger;
  return results;
}

int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}
int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

CommSpec spec_of(const std::string& compressor, double density) {
  CommSpec s;
  s.compressor = compressor;
  s.density = density;
  s.min_compress = 0;
  return s;
}

}  // namespace

TEST(CompressorsMpi, TopkWithErrorFeedbackEqualsTheEmulationStepByStep) {
  const int p = world();
  const int64_t n = 2000, k = 30;  // density 0.015 of 2000
  CommLedger ledger;
  CommSpec spec = spec_of("topk", 0.015);
  spec.overlap_every = 2;  // the raw gradient's top-k sets of steps 3 and 4 compared at step 4
  std::map<std::string, double> stats;
  const auto got = run(spec, 4, n, nullptr, ReduceKind::all_reduce, &ledger, &stats);
  if (p == 1) return;  // the identity at dp 1 (CompressorsMpi.IdentityOnOneRank)
  Emulation emu(p, n);
  for (int t = 1; t <= 4; t++) {
    const std::vector<float> want = emu.step(t, [&](int, const std::vector<float>& acc) { return host_topk(acc, 0, n, k); });
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_TRUE(same_on_every_rank(got.back()));
  std::vector<float> g3(static_cast<size_t>(n)), g4(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) g3[size_t(i)] = grad(world_rank(), i, 3), g4[size_t(i)] = grad(world_rank(), i, 4);
  const std::vector<int32_t> s3 = host_topk(g3, 0, n, k), s4 = host_topk(g4, 0, n, k);
  std::vector<int32_t> common;
  std::set_intersection(s3.begin(), s3.end(), s4.begin(), s4.end(), std::back_inserter(common));
  EXPECT_DOUBLE_EQ(stats["gradient_overlap"], double(common.size()) / double(k));
  // Tagged kinds: the count, the indices and the values of k pairs per rank, ring all-gather.
  EXPECT_EQ(ledger.bytes["dp_topk_all_gather"], 4 * (p - 1) + 8 * (p - 1) * k);
  EXPECT_EQ(ledger.bytes.count("dp_all_reduce"), 0u);
}

TEST(CompressorsMpi, TopkSplitAndReduceEqualsItsEmulationWithTheDroppedPairsKept) {
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1999, k = 40;  // density 0.02
  CommSpec spec = spec_of("topk", 0.02);
  spec.collective = "split_reduce";
  CommLedger ledger;
  const auto got = run(spec, 4, n, nullptr, ReduceKind::all_reduce, &ledger);
  const int64_t region = (n + p - 1) / p, keep = (k + p - 1) / p;
  std::vector<std::vector<float>> residual(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f));
  for (int t = 1; t <= 4; t++) {
    std::vector<std::vector<int32_t>> mine(static_cast<size_t>(p));
    std::vector<float> sum(static_cast<size_t>(n), 0.0f), want(size_t(n), 0.0f);
    for (int r = 0; r < p; r++) {
      for (int64_t i = 0; i < n; i++) residual[size_t(r)][size_t(i)] += grad(r, i, t);
      mine[size_t(r)] = host_topk(residual[size_t(r)], 0, n, k);
      for (int32_t i : mine[size_t(r)]) sum[size_t(i)] += residual[size_t(r)][size_t(i)];
    }
    std::vector<char> kept(static_cast<size_t>(n), 0);
    for (int q = 0; q < p; q++) {
      const int64_t lo = std::min(n, q * region), hi = std::min(n, lo + region);
      int64_t nz = 0;
      for (int64_t i = lo; i < hi; i++) nz += sum[size_t(i)] != 0;
      for (int32_t i : host_topk(sum, lo, hi, std::min(keep, nz))) kept[size_t(i)] = 1, want[size_t(i)] = sum[size_t(i)];
    }
    for (int r = 0; r < p; r++)
      for (int32_t i : mine[size_t(r)])
        if (kept[size_t(i)]) residual[size_t(r)][size_t(i)] = 0;  // the dropped ones stay in the residual
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_GT(ledger.bytes["dp_topk_send"], 0);
  EXPECT_GT(ledger.bytes["dp_topk_all_gather"], 0);
  EXPECT_EQ(ledger.bytes["dp_topk_all_to_all"] % (4 * (p - 1)), 0);  // P counts a rank per exchange
  EXPECT_GT(ledger.bytes["dp_topk_all_to_all"], 0);
}

TEST(CompressorsMpi, AReduceScatterGivesEachRankItsShardOfTheAllReduce) {
  const int p = world();
  const int64_t n = 1501;
  for (const char* c : {"topk", "sign", "blocktopk"}) {
    for (const char* collective : {"allgather", "split_reduce"}) {
      if (std::string(c) != "topk" && std::string(collective) != "allgather") continue;
      CommSpec spec = spec_of(c, 0.03);
      spec.block_size = 8;
      const auto all = run(spec, 3, n);  // all-gather of pairs: every rank's pairs summed
      // Split-and-reduce as a reduce-scatter keeps its region's whole sum (no second selection):
      // the all-gather's result.
      if (std::string(c) == "topk") spec.collective = collective;
      const auto shard = run(spec, 3, n, nullptr, ReduceKind::reduce_scatter);
      const int64_t sh = (n + p - 1) / p, lo = std::min(n, world_rank() * sh);
      for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < sh; i++)
          ASSERT_EQ(shard[size_t(t)][size_t(i)], lo + i < n ? all[size_t(t)][size_t(lo + i)] : 0.0f)
              << c << " " << collective << " step " << t << " element " << lo + i;
    }
  }
}

TEST(CompressorsMpi, EntryScopeTakesRoleDensitiesAndSendsSmallPiecesDense) {
  const int p = world();
  ParamLayout layout;
  auto entry = [&](const char* name, std::vector<int64_t> shape, ParamRole role) {
    ParamInfo e;
    e.name = name, e.global_shape = shape, e.shard_shape = shape, e.role = role;
    e.numel = 1;
    for (int64_t d : shape) e.numel *= d;
    layout.add(e);
  };
  entry("m", {20, 50}, ParamRole::matrix);     // 1000: density 0.02 -> 20
  entry("norm", {100}, ParamRole::norm);       // 100 < min_compress: dense
  entry("wte", {30, 30}, ParamRole::embedding);  // 900: role density 0.1 -> 90
  const int64_t n = layout.total();
  CommSpec spec = spec_of("topk", 0.02);
  spec.min_compress = 200;
  spec.role_density = {{"embedding", 0.1}};
  std::map<std::string, double> stats;
  CommLedger ledger;
  const auto got = run(spec, 3, n, &layout, ReduceKind::all_reduce, &ledger, &stats);
  if (p == 1) return;
  std::vector<std::vector<float>> residual(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f));
  std::vector<int32_t> before, last;  // this rank's selections of steps 2 and 3
  for (int t = 1; t <= 3; t++) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t);
      std::vector<int32_t> sel = host_topk(acc, 0, 1000, 20), emb = host_topk(acc, 1100, 2000, 90);
      sel.insert(sel.end(), emb.begin(), emb.end());
      if (r == world_rank()) before = last, last = sel;
      for (int32_t i : sel) want[size_t(i)] += acc[size_t(i)], acc[size_t(i)] = 0;
      for (int64_t i = 1000; i < 1100; i++) want[size_t(i)] += acc[size_t(i)], acc[size_t(i)] = 0;
    }
    for (int64_t i = 0; i < n; i++) {
      if (i >= 1000 && i < 1100) ASSERT_NEAR(got[size_t(t - 1)][size_t(i)], want[size_t(i)], 1e-5) << i;  // MPI's order
      else ASSERT_EQ(got[size_t(t - 1)][size_t(i)], want[size_t(i)]) << "step " << t << " element " << i;
    }
  }
  EXPECT_DOUBLE_EQ(stats["density"], 110.0 / 1900.0);
  EXPECT_DOUBLE_EQ(stats["elements"], 1900);
  EXPECT_EQ(ledger.bytes["dp_all_reduce"], 4 * ring_all_reduce_sent(100, p, world_rank()));  // the norm
  std::vector<int32_t> common;
  std::set_intersection(before.begin(), before.end(), last.begin(), last.end(), std::back_inserter(common));
  EXPECT_DOUBLE_EQ(stats["index_overlap"], double(common.size()) / double(before.size()));
}

TEST(CompressorsMpi, SmallPiecesAsSignsKeepTheirRoundingInTheResidual) {
  // small_pieces = "sign": the norm (below min_compress) travels as scaled signs with error
  // feedback, all-gathered under the compressor's kind; the matrix's top-k as before.
  const int p = world();
  ParamLayout layout;
  for (auto [name, shape, role] : {std::tuple<const char*, std::vector<int64_t>, ParamRole>{"m", {20, 50}, ParamRole::matrix},
                                   {"norm", {100}, ParamRole::norm}}) {
    ParamInfo e;
    e.name = name, e.global_shape = shape, e.shard_shape = shape, e.role = role;
    e.numel = 1;
    for (int64_t d : shape) e.numel *= d;
    layout.add(e);
  }
  const int64_t n = layout.total();
  CommSpec spec = spec_of("topk", 0.02);
  spec.min_compress = 200;
  spec.small_pieces = "sign";
  CommLedger ledger;
  const auto got = run(spec, 3, n, &layout, ReduceKind::all_reduce, &ledger);
  if (p == 1) return;
  std::vector<std::vector<float>> residual(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f));
  for (int t = 1; t <= 3; t++) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t);
      for (int32_t i : host_topk(acc, 0, 1000, 20)) want[size_t(i)] += acc[size_t(i)], acc[size_t(i)] = 0;
      double abs = 0;
      for (int64_t i = 1000; i < 1100; i++) abs += std::fabs(double(acc[size_t(i)]));
      const float scale = float(abs / 100.0);
      for (int64_t i = 1000; i < 1100; i++) {
        const bool plus = acc[size_t(i)] >= 0;
        want[size_t(i)] += plus ? scale : -scale;
        acc[size_t(i)] += plus ? -scale : scale;
      }
    }
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_TRUE(same_on_every_rank(got.back()));
  // The count and 20 pairs, then the norm's 4 words of bits and its scale; no dense all-reduce.
  EXPECT_EQ(ledger.bytes["dp_topk_all_gather"], 4 * (p - 1) + 8 * (p - 1) * 20 + 4 * (p - 1) * 4 + 4 * (p - 1));
  EXPECT_EQ(ledger.bytes.count("dp_all_reduce"), 0u);
}

TEST(CompressorsMpi, TemporalReusesTheSharedSetBetweenRefreshes) {
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1200, k = 24;  // density 0.02
  CommSpec spec = spec_of("temporal", 0.02);
  spec.refresh_every = 3;
  const int steps = 7;  // refreshes at 1, 4, 7
  CommLedger ledger;
  std::map<std::string, double> stats;
  const auto got = run(spec, steps, n, nullptr, ReduceKind::all_reduce, &ledger, &stats);
  std::vector<std::vector<float>> residual(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f));
  std::vector<int32_t> set;
  for (int t = 1; t <= steps; t++) {
    const bool refresh = (t - 1) % 3 == 0;
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t);
      for (int32_t i : refresh ? host_topk(acc, 0, n, k) : set) want[size_t(i)] += acc[size_t(i)], acc[size_t(i)] = 0;
    }
    if (refresh) set = host_topk(want, 0, n, k);
    for (int64_t i = 0; i < n; i++) {
      if (refresh) ASSERT_EQ(got[size_t(t - 1)][size_t(i)], want[size_t(i)]) << "refresh step " << t << " " << i;
      else ASSERT_NEAR(got[size_t(t - 1)][size_t(i)], want[size_t(i)], 1e-5) << "step " << t << " " << i;
    }
  }
  // The last step refreshed: the all-gather of pairs; in between, k values all-reduced.
  EXPECT_EQ(stats["refreshed"], 1.0);
  EXPECT_GE(stats["index_overlap"], 0.0);
  EXPECT_EQ(ledger.bytes["dp_temporal_all_gather"], 4 * (p - 1) + 8 * (p - 1) * k);
  const auto reuse = run(spec, 2, n, nullptr, ReduceKind::all_reduce, &ledger);
  EXPECT_EQ(ledger.bytes["dp_temporal_all_reduce"], 4 * ring_all_reduce_sent(k, p, world_rank()));
  EXPECT_EQ(ledger.bytes.count("dp_temporal_all_gather"), 0u);
}

TEST(CompressorsMpi, BlockTopkSendsTheLargestBlocksWithOneIndexEach) {
  const int p = world();
  if (p == 1) return;
  const int64_t n = 2000, B = 16, nb = 125, kb = 3;  // density 0.02 of 125 blocks -> 3
  CommSpec spec = spec_of("blocktopk", 0.02);
  spec.block_size = B;
  CommLedger ledger;
  const auto got = run(spec, 3, n, nullptr, ReduceKind::all_reduce, &ledger);
  Emulation emu(p, n);
  for (int t = 1; t <= 3; t++) {
    const auto want = emu.step(t, [&](int, const std::vector<float>& acc) {
      std::vector<float> norms(static_cast<size_t>(nb));
      for (int64_t b = 0; b < nb; b++) {
        double s = 0;
        for (int64_t i = b * B; i < std::min(n, (b + 1) * B); i++) s += double(acc[size_t(i)]) * double(acc[size_t(i)]);
        norms[size_t(b)] = float(s);
      }
      std::vector<int32_t> sel;
      for (int32_t b : host_topk(norms, 0, nb, kb))
        for (int64_t i = b * B; i < std::min(n, (b + 1) * B); i++) sel.push_back(int32_t(i));
      return sel;
    });
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_EQ(ledger.bytes["dp_blocktopk_all_gather"], 4 * (p - 1) + (p - 1) * kb * (4 + 4 * B));
}

TEST(CompressorsMpi, PackedTopkSendsSignsAndKeepsTheRoundingInTheResidual) {
  // topk with values = "sign", indices = "golomb": each rank's top k of its accumulator, rounded
  // to sign x their mean magnitude, summed in rank order; the residual keeps acc - the sent value
  // where it sent, acc elsewhere. Against a host emulation, bit for bit, with the ledger's words.
  const int p = world();
  const int64_t n = 2000, k = 30;
  CommSpec spec = spec_of("topk", 0.015);
  spec.values = "sign", spec.indices = "golomb";
  CommLedger ledger;
  const auto got = run(spec, 4, n, nullptr, ReduceKind::all_reduce, &ledger);
  if (p == 1) return;
  const std::vector<PairSegment> seg = {{0, n}};
  std::vector<std::vector<float>> residual(size_t(p), std::vector<float>(size_t(n), 0.0f));
  std::vector<int64_t> words(static_cast<size_t>(p));
  for (int t = 1; t <= 4; t++) {
    std::vector<float> want(size_t(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t);
      std::vector<int32_t> set = host_topk(acc, 0, n, k);
      std::vector<float> q;
      for (int32_t i : set) q.push_back(acc[size_t(i)]);
      quantize_pairs(set.data(), q.data(), k, seg, PairValues::sign);
      words[size_t(r)] = int64_t(encode_pairs(set.data(), q.data(), k, seg, {PairIndices::rice, PairValues::sign}).size());
      for (int64_t j = 0; j < k; j++) {
        const size_t i = size_t(set[size_t(j)]);
        want[i] += q[size_t(j)];
        acc[i] = 0.0f + (acc[i] - q[size_t(j)]);
      }
    }
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_TRUE(same_on_every_rank(got.back()));
  const int64_t total = std::accumulate(words.begin(), words.end(), int64_t(0));
  EXPECT_EQ(ledger.bytes["dp_topk_all_gather"], 4 * (p - 1) + 4 * (total - words[size_t((world_rank() + 1) % p)]));
  // 30 pairs of 2000: gaps of about 66, Rice b 5 or 6, about 8 bits each with the sign, against 64.
  EXPECT_LT(words[0], (32 + 5 + 32 + k * 10 + 31) / 32 + 1);
}

TEST(CompressorsMpi, DgcAccumulatesTheMomentumCorrectedVelocityAndMasksIt) {
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1000, k = 10;
  CommSpec spec = spec_of("dgc", 0.01);
  spec.momentum = 0.9;
  const auto got = run(spec, 4, n);
  std::vector<std::vector<float>> u(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f)), v = u;
  for (int t = 1; t <= 4; t++) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      for (int64_t i = 0; i < n; i++) {
        u[size_t(r)][size_t(i)] = float(0.9 * double(u[size_t(r)][size_t(i)]) + double(grad(r, i, t)));
        v[size_t(r)][size_t(i)] += u[size_t(r)][size_t(i)];
      }
      for (int32_t i : host_topk(v[size_t(r)], 0, n, k))
        want[size_t(i)] += v[size_t(r)][size_t(i)], v[size_t(r)][size_t(i)] = 0, u[size_t(r)][size_t(i)] = 0;
    }
    for (int64_t i = 0; i < n; i++)  // the momentum's float rounding may differ by an FMA
      ASSERT_NEAR(got[size_t(t - 1)][size_t(i)], want[size_t(i)], 1e-5 * (1 + std::fabs(want[size_t(i)])))
          << "step " << t << " element " << i;
  }
}

TEST(CompressorsMpi, DgcClipsEachRanksGradientToItsShareOfTheThresholdFirst) {
  // Lin et al. 2018, section 3.2: each rank clips its gradient to grad_clip / sqrt(P) (here the
  // bucket's share of it, sqrt(len / total) = 1: one bucket of the whole gradient) before the
  // momentum correction. grad_clip 0.5 is below every step's gradient norm here, so each step clips.
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1000, k = 10;
  const double clip = 0.5, limit = clip / std::sqrt(double(p));
  CommSpec spec = spec_of("dgc", 0.01);
  spec.momentum = 0.9;
  const auto got = run(spec, 4, n, nullptr, ReduceKind::all_reduce, nullptr, nullptr, grad, clip);
  std::vector<std::vector<float>> u(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f)), v = u;
  int clipped = 0;
  for (int t = 1; t <= 4; t++) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      double sq = 0;
      for (int64_t i = 0; i < n; i++) sq += double(grad(r, i, t)) * double(grad(r, i, t));
      const double norm = std::sqrt(sq);
      const float scale = norm > limit ? float(limit / norm) : 1.0f;
      clipped += norm > limit;
      for (int64_t i = 0; i < n; i++) {
        u[size_t(r)][size_t(i)] = float(0.9 * double(u[size_t(r)][size_t(i)]) + double(grad(r, i, t) * scale));
        v[size_t(r)][size_t(i)] += u[size_t(r)][size_t(i)];
      }
      for (int32_t i : host_topk(v[size_t(r)], 0, n, k))
        want[size_t(i)] += v[size_t(r)][size_t(i)], v[size_t(r)][size_t(i)] = 0, u[size_t(r)][size_t(i)] = 0;
    }
    for (int64_t i = 0; i < n; i++)
      ASSERT_NEAR(got[size_t(t - 1)][size_t(i)], want[size_t(i)], 1e-5 * (1 + std::fabs(want[size_t(i)])))
          << "step " << t << " element " << i;
  }
  EXPECT_EQ(clipped, 4 * p);  // the threshold was reached: the test sees the clipping
}

TEST(CompressorsMpi, ExponentialWarmUpFallsFromAQuarterToTheDensityGeometrically) {
  // DGC's warm-up (section 3.3), for any sparsifier with warmup = "exponential": the density at
  // step t <= W is max(d, 0.25 (d / 0.25)^(t / W)), here 11.2%, 5%, 2.2%, 1% of 1000 elements,
  // then d. Each step's sum equals the emulation that selects ceil(density n) per rank.
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1000;
  CommSpec spec = spec_of("topk", 0.01);
  spec.warmup = "exponential", spec.warmup_steps = 4;
  const auto got = run(spec, 6, n);
  Emulation emu(p, n);
  const int64_t ks[] = {112, 50, 23, 10, 10, 10};
  for (int t = 1; t <= 6; t++) {
    const double d = t <= 4 ? std::max(0.01, 0.25 * std::pow(0.01 / 0.25, t / 4.0)) : 0.01;
    ASSERT_EQ(int64_t(std::ceil(d * double(n))), ks[t - 1]) << t;
    const std::vector<float> want =
        emu.step(t, [&](int, const std::vector<float>& acc) { return host_topk(acc, 0, n, ks[t - 1]); });
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
}

TEST(CompressorsMpi, SignSendsBitsAndAScaleWithErrorFeedback) {
  const int p = world();
  if (p == 1) return;
  const int64_t n = 1000;
  CommLedger ledger;
  const auto got = run(spec_of("sign", 1), 3, n, nullptr, ReduceKind::all_reduce, &ledger);
  std::vector<std::vector<float>> residual(static_cast<size_t>(p), std::vector<float>(size_t(n), 0.0f));
  for (int t = 1; t <= 3; t++) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < p; r++) {
      std::vector<float>& acc = residual[size_t(r)];
      double abs = 0;
      for (int64_t i = 0; i < n; i++) acc[size_t(i)] += grad(r, i, t), abs += std::fabs(double(acc[size_t(i)]));
      const float scale = float(abs / double(n));
      for (int64_t i = 0; i < n; i++) {
        const bool plus = acc[size_t(i)] >= 0;
        want[size_t(i)] += plus ? scale : -scale;
        acc[size_t(i)] += plus ? -scale : scale;
      }
    }
    ASSERT_EQ(got[size_t(t - 1)], want) << "step " << t;
  }
  EXPECT_EQ(ledger.bytes["dp_sign_all_gather"], 4 * (p - 1) * ((n + 31) / 32) + 4 * (p - 1));  // bits, one scale
}

namespace {
// Rank r's gradient of a [40, 60] matrix: a_r(i) b(j), so the sum over ranks has rank 1.
float low_rank(int rank, int64_t e, int step) {
  const int64_t i = e / 60, j = e % 60;
  return float(std::cos(0.3 * double(i) + rank + step) * std::sin(0.17 * double(j) + 0.5 * step));
}

// One [40, 60] matrix entry of 2400 elements: PowerSGD's unit.
ParamLayout one_matrix() {
  ParamLayout layout;
  ParamInfo e;
  e.name = "w", e.global_shape = e.shard_shape = {40, 60}, e.numel = 2400, e.role = ParamRole::matrix;
  layout.add(e);
  return layout;
}
}  // namespace

TEST(CompressorsMpi, PowerSgdReconstructsALowRankSumAndSendsOnlyTheFactors) {
  const int p = world();
  const ParamLayout layout = one_matrix();
  CommSpec spec = spec_of("powersgd", 1);
  spec.rank = 2;
  spec.error_feedback = false;
  CommLedger ledger;
  const auto got = run(spec, 3, 2400, &layout, ReduceKind::all_reduce, &ledger, nullptr, low_rank);
  if (p == 1) return;
  for (int t = 1; t <= 3; t++) {
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < 2400; i++) {
      double s = 0;
      for (int r = 0; r < p; r++) s += low_rank(r, i, t);
      worst = std::max(worst, std::fabs(double(got[size_t(t - 1)][size_t(i)]) - s));
      largest = std::max(largest, std::fabs(s));
    }
    EXPECT_LT(worst, 1e-4 * largest) << "step " << t;
  }
  EXPECT_TRUE(same_on_every_rank(got.back()));
  const int me = world_rank();
  EXPECT_EQ(ledger.bytes["dp_powersgd_all_reduce"],
            4 * (ring_all_reduce_sent(40 * 2, p, me) + ring_all_reduce_sent(60 * 2, p, me)));
}

namespace {
// Rank r's gradient of a [40, 60] matrix, the same every step: eight rank-1 terms of weights 1,
// 1/2, ..., 1/8, so that rank 2 leaves a good part of it out.
float rank8(int rank, int64_t e, int) {
  const int64_t i = e / 60, j = e % 60;
  double x = 0;
  for (int c = 0; c < 8; c++)
    x += std::cos(0.29 * (c + 1) * double(i) + 0.5 * rank) * std::sin(0.23 * (c + 1) * double(j) + c) / (c + 1);
  return float(x);
}
}  // namespace

TEST(CompressorsMpi, PowerSgdWithErrorFeedbackLosesNothingOverSteps) {
  // Rank 2 of a rank-8 sum: without error feedback every step drops the same remainder, so the
  // summed results fall behind the summed gradients in proportion to the steps; with it the
  // remainder is carried and sent later, and the average over 40 steps comes close to the sum
  // (measured at 2, 4 and 8 ranks: 0.42-0.44 without, 0.054-0.057 with).
  const int p = world();
  const ParamLayout layout = one_matrix();
  CommSpec spec = spec_of("powersgd", 1);
  spec.rank = 2;
  const int steps = 40;
  const auto with_ef = run(spec, steps, 2400, &layout, ReduceKind::all_reduce, nullptr, nullptr, rank8);
  spec.error_feedback = false;
  const auto without = run(spec, steps, 2400, &layout, ReduceKind::all_reduce, nullptr, nullptr, rank8);
  if (p == 1) return;
  auto average_error = [&](const std::vector<std::vector<float>>& got) {  // |mean of the results - the sum| / |sum|
    double err = 0, ref = 0;
    for (int64_t i = 0; i < 2400; i++) {
      double s = 0, mean = 0;
      for (int r = 0; r < p; r++) s += rank8(r, i, 0);
      for (int t = 0; t < steps; t++) mean += got[size_t(t)][size_t(i)] / double(steps);
      err += (mean - s) * (mean - s), ref += s * s;
    }
    return std::sqrt(err / ref);
  };
  const double ef = average_error(with_ef), plain = average_error(without);
  EXPECT_GT(plain, 0.3) << "rank 2 of this sum should lose much of it";  // the test can see the difference
  EXPECT_LT(ef, 0.25 * plain) << "with error feedback " << ef << ", without " << plain;
}

TEST(CompressorsMpi, OnOneRankEveryCompressorIsTheIdentity) {
  if (world() != 1) return;
  for (const char* c : {"topk", "dgc", "blocktopk", "temporal", "powersgd", "sign"}) {
    const auto got = run(spec_of(c, 0.01), 2, 300);
    for (int64_t i = 0; i < 300; i++) ASSERT_EQ(got[1][size_t(i)], grad(0, i, 2)) << c;
  }
}
