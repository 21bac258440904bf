#include "plan/mesh.hpp"

#include "core/check.hpp"

namespace exatrain::plan {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::cp: return "cp";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

MeshShape resolve_mesh_shape(int world, int tp, int cp, int pp, std::optional<int> dp) {
  EXA_CHECK(world >= 1, "[parallel] world size must be >= 1, got {}", world);
  EXA_CHECK(tp >= 1, "[parallel] tp must be >= 1, got {}", tp);
  EXA_CHECK(cp >= 1, "[parallel] cp must be >= 1, got {}", cp);
  EXA_CHECK(pp >= 1, "[parallel] pp must be >= 1, got {}", pp);
  MeshShape s{tp, cp, 1, pp};
  int model_ranks = tp * cp * pp;
  if (!dp) {
    EXA_CHECK(world % model_ranks == 0,
              "[parallel] cannot infer dp: world {} is not divisible by tp {} * cp {} * pp {} = {}",
              world, tp, cp, pp, model_ranks);
    s.dp = world / model_ranks;
  } else {
    EXA_CHECK(*dp >= 1, "[parallel] dp must be >= 1, got {}", *dp);
    s.dp = *dp;
  }
  EXA_CHECK(s.world() == world, "[parallel] world {} != tp {} * cp {} * dp {} * pp {} = {}", world,
            tp, cp, s.dp, pp, s.world());
  return s;
}

MeshCoord coord_of(const MeshShape& s, int rank) {
  EXA_CHECK(rank >= 0 && rank < s.world(), "rank {} outside mesh of {} ranks", rank, s.world());
  MeshCoord c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.cp = rank % s.cp;
  rank /= s.cp;
  c.dp = rank % s.dp;
  c.pp = rank / s.dp;
  return c;
}

int rank_of(const MeshShape& s, const MeshCoord& c) {
  return ((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.tp + c.tp;
}

int& coord_ref(MeshCoord& c, Axis a) {
  switch (a) {
    case Axis::tp: return c.tp;
    case Axis::cp: return c.cp;
    case Axis::dp: return c.dp;
    case Axis::pp: return c.pp;
  }
  return c.tp;
}

int degree(const MeshShape& s, Axis a) {
  switch (a) {
    case Axis::tp: return s.tp;
    case Axis::cp: return s.cp;
    case Axis::dp: return s.dp;
    case Axis::pp: return s.pp;
  }
  return 1;
}

std::vector<int> group_ranks(const MeshShape& s, int rank, Axis axis) {
  MeshCoord c = coord_of(s, rank);
  std::vector<int> ranks;
  for (int i = 0; i < degree(s, axis); i++) {
    coord_ref(c, axis) = i;
    ranks.push_back(rank_of(s, c));
  }
  return ranks;
}

std::vector<int> replica_ranks(const MeshShape& s, int rank) {
  MeshCoord c = coord_of(s, rank);
  std::vector<int> ranks;
  for (int d = 0; d < s.dp; d++)
    for (int k = 0; k < s.cp; k++) {
      c.dp = d;
      c.cp = k;
      ranks.push_back(rank_of(s, c));
    }
  return ranks;
}

int split_colour(const MeshShape& s, int rank, Axis axis) {
  // The rank with coordinate 0 on `axis` names the group: unique and equal within it.
  MeshCoord c = coord_of(s, rank);
  coord_ref(c, axis) = 0;
  return rank_of(s, c);
}

}  // namespace exatrain::plan
