#include "parallel/mesh.hpp"

#include "core/check.hpp"

namespace exatrain::parallel {

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
    mpi_check(MPI_Comm_split(world, split_colour(shape, m.world_rank, a), plan::coord_ref(c, a), out),
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
