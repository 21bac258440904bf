#include "parallel/mesh.hpp"

#include "core/check.hpp"

namespace exatrain::parallel {

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

static int& coord_ref(MeshCoord& c, Axis a) {
  switch (a) {
    case Axis::tp: return c.tp;
    case Axis::cp: return c.cp;
    case Axis::dp: return c.dp;
    case Axis::pp: return c.pp;
  }
  return c.tp;
}

static int degree(const MeshShape& s, Axis a) {
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

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  EXA_FAIL("{} failed: {}", what, std::string(text, len));
}

Mesh Mesh::create(MPI_Comm world, const MeshShape& shape) {
  Mesh m;
  m.world = world;
  m.shape = shape;
  int size = 0;
  mpi_check(MPI_Comm_rank(world, &m.world_rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(world, &size), "MPI_Comm_size");
  EXA_CHECK(size == shape.world(), "[parallel] world {} != tp {} * cp {} * dp {} * pp {} = {}",
            size, shape.tp, shape.cp, shape.dp, shape.pp, shape.world());
  m.coord = coord_of(shape, m.world_rank);
  for (Axis a : {Axis::tp, Axis::cp, Axis::dp, Axis::pp}) {
    MPI_Comm* out = a == Axis::tp ? &m.tp_comm : a == Axis::cp ? &m.cp_comm
                  : a == Axis::dp ? &m.dp_comm : &m.pp_comm;
    // key = coordinate on the axis, so the group-local rank is that coordinate.
    MeshCoord c = m.coord;
    mpi_check(MPI_Comm_split(world, split_colour(shape, m.world_rank, a), coord_ref(c, a), out),
              "MPI_Comm_split");
  }
  MeshCoord named = m.coord;  // the replica group is named by its member with dp = cp = 0
  named.dp = named.cp = 0;
  mpi_check(MPI_Comm_split(world, rank_of(shape, named), m.coord.dp * shape.cp + m.coord.cp,
                           &m.replica_comm),
            "MPI_Comm_split");
  return m;
}

MPI_Comm Mesh::comm(Axis a) const {
  switch (a) {
    case Axis::tp: return tp_comm;
    case Axis::cp: return cp_comm;
    case Axis::dp: return dp_comm;
    case Axis::pp: return pp_comm;
  }
  return MPI_COMM_NULL;
}

void Mesh::free() {
  for (MPI_Comm* c : {&tp_comm, &cp_comm, &dp_comm, &pp_comm, &replica_comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace exatrain::parallel
