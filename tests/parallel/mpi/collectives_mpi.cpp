// Under mpirun (1, 2, 4, 8 ranks): the mesh's communicators, collectives against a local
// reference, byte accounting against the documented convention, and bitwise agreement of ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <unistd.h>

#include <cstring>

#include "parallel/comm.hpp"
#include "parallel/mpi_group.hpp"
#include "parallel/mesh.hpp"

using namespace exatrain::parallel;

static int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
static int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A value every rank can compute for any (rank, index): the reference needs no communication.
// Computed in double and rounded once: with FMA contraction (g++ default for C++) a float
// expression can round differently at two inlined call sites.
static float value(int rank, int64_t i) {
  return static_cast<float>(std::sin(0.37 * i + 1.3 * rank) + 0.01 * rank);
}

// True when every rank of `g` holds exactly the same bytes in buf[n].
static bool identical_across(const MpiGroup& g, const float* buf, int64_t n) {
  std::vector<float> first(buf, buf + n);
  MPI_Bcast(first.data(), static_cast<int>(n), MPI_FLOAT, 0, g.comm());
  int same = std::memcmp(first.data(), buf, sizeof(float) * n) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, g.comm());
  return all == 1;
}

TEST(MeshMpi, EveryFactorisationBuildsGroupsMatchingTheArithmetic) {
  int W = world_size(), me = world_rank();
  for (int tp = 1; tp <= W; tp++)
    for (int cp = 1; cp <= W; cp++)
      for (int pp = 1; pp <= W; pp++) {
        if (W % (tp * cp * pp)) continue;
        MeshShape s = resolve_mesh_shape(W, tp, cp, pp, std::nullopt);
        Mesh m = Mesh::create(MPI_COMM_WORLD, s);
        for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp}) {
          std::vector<int> expect = group_ranks(s, me, a);
          int n = 0;
          MPI_Comm_size(m.comm(a), &n);
          ASSERT_EQ(n, static_cast<int>(expect.size()));
          std::vector<int> got(n);
          MPI_Allgather(&me, 1, MPI_INT, got.data(), 1, MPI_INT, m.comm(a));
          EXPECT_EQ(got, expect) << "tp" << tp << " cp" << cp << " pp" << pp << " axis "
                                 << axis_name(a);
        }
        std::vector<int> rep = replica_ranks(s, me), got(rep.size());
        MPI_Allgather(&me, 1, MPI_INT, got.data(), 1, MPI_INT, m.replica_comm);
        EXPECT_EQ(got, rep);
        m.free();
      }
}

TEST(CollectivesMpi, MatchTheReferenceAndCountBytesByTheRingConvention) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  int p = g.size(), me = g.rank();
  const int64_t n = 1003;  // odd on purpose

  // all-reduce: sum over ranks, every rank bit-identical.
  std::vector<float> buf(n);
  for (int64_t i = 0; i < n; i++) buf[i] = value(me, i);
  g.all_reduce_sum(buf.data(), n);
  for (int64_t i = 0; i < n; i++) {
    double ref = 0, mag = 0;
    for (int r = 0; r < p; r++) ref += value(r, i), mag += std::fabs(value(r, i));
    EXPECT_NEAR(buf[i], ref, 1e-6 * (1 + mag)) << i;  // float sum of p terms
  }
  EXPECT_TRUE(identical_across(g, buf.data(), n));

  // all-reduce max.
  for (int64_t i = 0; i < n; i++) buf[i] = value(me, i);
  g.all_reduce_max(buf.data(), n);
  for (int64_t i = 0; i < n; i++) {
    float ref = value(0, i);
    for (int r = 1; r < p; r++) ref = std::max(ref, value(r, i));
    EXPECT_EQ(buf[i], ref);
  }

  // reduce-scatter of [p * shard] -> my [shard]; all-gather back.
  const int64_t shard = 37;
  std::vector<float> full(p * shard), mine(shard);
  for (int64_t i = 0; i < p * shard; i++) full[i] = value(me, i);
  g.reduce_scatter_sum(full.data(), mine.data(), shard);
  for (int64_t j = 0; j < shard; j++) {
    double ref = 0, mag = 0;
    for (int r = 0; r < p; r++) ref += value(r, me * shard + j), mag += std::fabs(value(r, me * shard + j));
    EXPECT_NEAR(mine[j], ref, 1e-6 * (1 + mag));
  }
  std::vector<float> gathered(p * shard);
  g.all_gather(mine.data(), gathered.data(), shard);
  std::vector<float> in_place(p * shard, -1.f);
  std::copy(mine.begin(), mine.end(), in_place.begin() + me * shard);
  g.all_gather(nullptr, in_place.data(), shard);
  EXPECT_EQ(gathered, in_place);
  for (int64_t i = 0; i < p * shard; i++) {
    double ref = 0, mag = 0;
    for (int r = 0; r < p; r++) ref += value(r, i), mag += std::fabs(value(r, i));
    EXPECT_NEAR(gathered[i], ref, 1e-6 * (1 + mag));
  }

  // broadcast from the last rank.
  for (int64_t i = 0; i < n; i++) buf[i] = value(me, i);
  g.broadcast(buf.data(), n, p - 1);
  for (int64_t i = 0; i < n; i++) EXPECT_EQ(buf[i], value(p - 1, i));

  // Ledger: exactly the convention in comm.hpp, written out here independently: chunk c of E
  // elements holds E/p (+1 for the first E % p chunks); 4 bytes per float; p == 1 counts nothing.
  auto chunk = [&](int64_t e, int c) { return e / p + (c < e % p ? 1 : 0); };
  if (p > 1) {
    int next = (me + 1) % p;
    EXPECT_EQ(ledger.bytes["dp_all_reduce"], 2 * 4 * (2 * n - chunk(n, me) - chunk(n, next)));
    EXPECT_EQ(ledger.calls["dp_all_reduce"], 2);
    EXPECT_EQ(ledger.bytes["dp_reduce_scatter"], 4 * (p - 1) * shard);
    EXPECT_EQ(ledger.bytes["dp_all_gather"], 2 * 4 * (p - 1) * shard);
    EXPECT_EQ(ledger.bytes["dp_broadcast"], 4 * (n - chunk(n, next)));
  } else {
    EXPECT_EQ(ledger.total_bytes(), 0);
  }
}

TEST(CollectivesMpi, AllToAllDeliversBlockRToRankRAndCountsWhatLeavesThisRank) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  const int p = g.size(), me = g.rank();
  const int64_t n = 5;
  // Block r of my input holds value(me, r * n + j): rank r must receive it as its block `me`.
  std::vector<int32_t> in(size_t(p * n)), out(size_t(p * n), -1);
  auto tagged = [&](int from, int to, int64_t j) { return int32_t(1000 * from + 10 * to + j); };
  for (int r = 0; r < p; r++)
    for (int64_t j = 0; j < n; j++) in[size_t(r * n + j)] = tagged(me, r, j);
  g.all_to_all(in.data(), out.data(), n, DType::i32);
  for (int r = 0; r < p; r++)
    for (int64_t j = 0; j < n; j++) ASSERT_EQ(out[size_t(r * n + j)], tagged(r, me, j)) << "block " << r;
  EXPECT_EQ(ledger.bytes["dp_all_to_all"], 4 * (p - 1) * n);  // my own block does not leave
  EXPECT_EQ(ledger.calls["dp_all_to_all"], p > 1 ? 1 : 0);
}

TEST(CollectivesMpi, NonBlockingVariantsAgreeWithBlockingOnes) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "cp", &ledger, nullptr);
  int p = g.size(), me = g.rank();
  const int64_t n = 517;
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; i++) a[i] = b[i] = value(me, i);
  g.all_reduce_sum(a.data(), n);
  Request r = g.iall_reduce_sum(b.data(), n);
  g.wait(r);
  for (int64_t i = 0; i < n; i++) EXPECT_NEAR(a[i], b[i], 1e-6 * (1 + std::fabs(a[i])));

  const int64_t shard = 11;
  std::vector<float> full(p * shard), s1(shard), s2(shard);
  for (int64_t i = 0; i < p * shard; i++) full[i] = value(me, 3 * i);
  g.reduce_scatter_sum(full.data(), s1.data(), shard);
  Request rs = g.ireduce_scatter_sum(full.data(), s2.data(), shard);
  g.wait(rs);
  for (int64_t j = 0; j < shard; j++) EXPECT_NEAR(s1[j], s2[j], 1e-6 * (1 + std::fabs(s1[j])));
  std::vector<float> g1(p * shard), g2(p * shard);
  g.all_gather(s1.data(), g1.data(), shard);
  Request ag = g.iall_gather(s1.data(), g2.data(), shard);
  g.wait(ag);
  EXPECT_EQ(g1, g2);

  // Ring of point-to-point messages: each rank sends to the next and receives from the previous.
  if (p > 1) {
    std::vector<float> out(n), in(n);
    for (int64_t i = 0; i < n; i++) out[i] = value(me, i);
    int next = (me + 1) % p, prev = (me + p - 1) % p;
    Request rr = g.irecv(in.data(), n, prev, 7);
    Request sr = g.isend(out.data(), n, next, 7);
    g.wait(rr);
    g.wait(sr);
    for (int64_t i = 0; i < n; i++) EXPECT_EQ(in[i], value(prev, i));
    EXPECT_EQ(ledger.bytes["cp_send"], 4 * n);
    EXPECT_EQ(ledger.bytes.count("cp_recv"), 0u);  // receiving sends nothing
    // Blocking pair: even ranks send first (no deadlock on any p).
    if (me % 2 == 0) {
      g.send(out.data(), n, next, 8);
      g.recv(in.data(), n, prev, 8);
    } else {
      g.recv(in.data(), n, prev, 8);
      g.send(out.data(), n, next, 8);
    }
    for (int64_t i = 0; i < n; i++) EXPECT_EQ(in[i], value(prev, i));
    EXPECT_EQ(ledger.bytes["cp_send"], 2 * 4 * n);
  }
}

TEST(CollectivesMpi, ReductionsAreBitwiseRepeatableAndIdenticalOnEveryRank) {
  // The equivalence tests rely on this: same inputs -> same bits, whatever the timing. Sizes
  // cover Open MPI's small-message and large-message (segmented ring) algorithms.
  MpiGroup g(MPI_COMM_WORLD, "dp", nullptr, nullptr);
  int me = g.rank();
  for (int64_t n : {7, 1000, 300000}) {
    std::vector<float> first(n), again(n), nonblocking(n);
    for (int64_t i = 0; i < n; i++) first[i] = again[i] = nonblocking[i] = value(me, i) * 1e3f;
    g.all_reduce_sum(first.data(), n);
    for (int rep = 0; rep < 3; rep++) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; i++) x[i] = value(me, i) * 1e3f;
      if (me == 0) usleep(2000 * rep);  // vary arrival order
      g.all_reduce_sum(x.data(), n);
      EXPECT_EQ(std::memcmp(x.data(), first.data(), sizeof(float) * n), 0) << "n " << n;
    }
    EXPECT_TRUE(identical_across(g, first.data(), n)) << "n " << n;
    Request r = g.iall_reduce_sum(nonblocking.data(), n);
    g.wait(r);
    EXPECT_TRUE(identical_across(g, nonblocking.data(), n)) << "n " << n;
  }
}

// bfloat16 as a Group dtype (the compressor slot's and a future NCCL group's): storage is the
// upper 16 bits of a float (round to nearest even); the sum is computed in fp32 and rounded back to
// bf16 at each pairwise step. With 1 or 2 ranks each element sees at most one addition, so the
// host emulation is exact; with more, Open MPI picks the order and each rounding is within 2^-8 of
// its partial sum. Bytes: 2 per element in the ledger's convention. all-gather moves bits unchanged.
static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CollectivesMpi, Bf16SumsMatchTheHostEmulationAndCountTwoBytesPerElement) {
  CommLedger ledger;
  MpiGroup g(MPI_COMM_WORLD, "dp", &ledger, nullptr);
  const int p = g.size(), me = g.rank();
  const int64_t n = 1003, shard = 37;
  auto emulated = [&](int64_t i) {
    float s = from_bf16(to_bf16(value(0, i)));
    for (int r = 1; r < p; r++) s = from_bf16(to_bf16(s + from_bf16(to_bf16(value(r, i)))));
    return s;
  };
  auto check = [&](float got, int64_t i, const char* what) {
    double mag = 0;
    for (int r = 0; r < p; r++) mag += std::fabs(value(r, i));
    if (p <= 2) EXPECT_EQ(got, emulated(i)) << what << " element " << i;
    else EXPECT_NEAR(got, emulated(i), 2 * p * mag / 256) << what << " element " << i;
  };
  std::vector<uint16_t> buf(n), blocking(n);
  for (int64_t i = 0; i < n; i++) buf[i] = to_bf16(value(me, i));
  blocking = buf;
  g.all_reduce(blocking.data(), n, DType::bf16, ReduceOp::sum);
  Request r = g.iall_reduce(buf.data(), n, DType::bf16);
  g.wait(r);
  for (int64_t i = 0; i < n; i++) check(from_bf16(blocking[i]), i, "all_reduce"), check(from_bf16(buf[i]), i, "iall_reduce");

  std::vector<uint16_t> full(p * shard), mine(shard), gathered(p * shard);
  for (int64_t i = 0; i < p * shard; i++) full[i] = to_bf16(value(me, i));
  g.reduce_scatter(full.data(), mine.data(), shard, DType::bf16);
  for (int64_t j = 0; j < shard; j++) check(from_bf16(mine[j]), me * shard + j, "reduce_scatter");
  g.all_gather(mine.data(), gathered.data(), shard, DType::bf16);
  std::vector<uint16_t> mine_all(p * shard);  // every rank's shard, gathered by hand
  MPI_Allgather(mine.data(), int(shard), MPI_UINT16_T, mine_all.data(), int(shard), MPI_UINT16_T, g.comm());
  EXPECT_EQ(gathered, mine_all);

  auto chunk = [&](int64_t e, int c) { return e / p + (c < e % p ? 1 : 0); };
  if (p > 1) {
    const int next = (me + 1) % p;
    EXPECT_EQ(ledger.bytes["dp_all_reduce"], 2 * 2 * (2 * n - chunk(n, me) - chunk(n, next)));
    EXPECT_EQ(ledger.bytes["dp_reduce_scatter"], 2 * (p - 1) * shard);
    EXPECT_EQ(ledger.bytes["dp_all_gather"], 2 * (p - 1) * shard);
  } else {
    EXPECT_EQ(ledger.total_bytes(), 0);
  }
}
