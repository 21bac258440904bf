// Pure rank arithmetic of the process mesh (no MPI).
#include <gtest/gtest.h>

#include <set>

#include "core/check.hpp"
#include "parallel/mesh.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

TEST(Mesh, InfersDpAndValidatesTheEquation) {
  MeshShape s = resolve_mesh_shape(16, 2, 1, 4, std::nullopt);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.world(), 16);
  EXPECT_NE(error_of([] { resolve_mesh_shape(6, 4, 1, 2, 1); })
                .find("world 6 != tp 4 * cp 1 * dp 1 * pp 2 = 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { resolve_mesh_shape(6, 4, 1, 1, std::nullopt); })
                .find("cannot infer dp: world 6 is not divisible by tp 4 * cp 1 * pp 1 = 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { resolve_mesh_shape(8, 0, 1, 1, std::nullopt); }).find("tp must be >= 1"),
            std::string::npos);
}

TEST(Mesh, TpIsInnermostThenCpDpPp) {
  MeshShape s{2, 2, 3, 2};  // tp cp dp pp: 24 ranks
  // rank = ((pp * dp + dp_i) * cp + cp_i) * tp + tp_i
  MeshCoord c = coord_of(s, 1);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  c = coord_of(s, 2);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.cp, 1);
  c = coord_of(s, 4);
  EXPECT_EQ(c.dp, 1);
  c = coord_of(s, 12);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(group_ranks(s, 0, Axis::tp), (std::vector<int>{0, 1}));
  EXPECT_EQ(group_ranks(s, 5, Axis::dp), (std::vector<int>{1, 5, 9}));
  EXPECT_EQ(group_ranks(s, 3, Axis::pp), (std::vector<int>{3, 15}));
}

TEST(Mesh, GroupsPartitionTheWorld) {
  MeshShape s{2, 1, 2, 2};
  for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp}) {
    std::set<int> colours;
    for (int r = 0; r < s.world(); r++) {
      EXPECT_EQ(rank_of(s, coord_of(s, r)), r);
      std::vector<int> g = group_ranks(s, r, a);
      // r is in its own group, at the index of its coordinate; everyone in it has r's colour.
      MeshCoord c = coord_of(s, r);
      int idx = a == Axis::tp ? c.tp : a == Axis::cp ? c.cp : a == Axis::dp ? c.dp : c.pp;
      EXPECT_EQ(g[idx], r);
      for (int q : g) EXPECT_EQ(split_colour(s, q, a), split_colour(s, r, a));
      colours.insert(split_colour(s, r, a));
    }
    int deg = a == Axis::tp ? s.tp : a == Axis::cp ? s.cp : a == Axis::dp ? s.dp : s.pp;
    EXPECT_EQ(static_cast<int>(colours.size()), s.world() / deg) << axis_name(a);
  }
}

TEST(Mesh, ReplicaGroupIsDpTimesCpWithCpInner) {
  MeshShape s{2, 2, 2, 2};  // tp cp dp pp
  // rank 1 = (tp 1, cp 0, dp 0, pp 0); its replicas vary cp (stride 2) and dp (stride 4).
  EXPECT_EQ(replica_ranks(s, 1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(replica_ranks(s, 15), (std::vector<int>{9, 11, 13, 15}));
  MeshShape no_cp{2, 1, 3, 1};
  EXPECT_EQ(replica_ranks(no_cp, 2), group_ranks(no_cp, 2, Axis::dp));
}
