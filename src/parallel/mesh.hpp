// The realised process mesh: one MPI communicator per axis of the rank arithmetic in
// plan/mesh.hpp (re-exported here under exatrain::parallel).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <mpi.h>

#include "plan/mesh.hpp"

namespace exatrain::parallel {

using plan::Axis;
using plan::axis_name;
using plan::coord_of;
using plan::group_ranks;
using plan::MeshCoord;
using plan::MeshShape;
using plan::rank_of;
using plan::replica_ranks;
using plan::resolve_mesh_shape;
using plan::split_colour;

// The realised mesh: one communicator per axis, each with ranks ordered by that coordinate.
struct Mesh {
  MeshShape shape;
  MeshCoord coord;
  int world_rank = 0;
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm tp_comm = MPI_COMM_NULL, cp_comm = MPI_COMM_NULL, dp_comm = MPI_COMM_NULL,
           pp_comm = MPI_COMM_NULL;
  MPI_Comm replica_comm = MPI_COMM_NULL;  // dp x cp, see replica_ranks: gradients sync here

  // Splits `world` (collective over it). The caller keeps `world` alive; free() releases the five
  // communicators.
  static Mesh create(MPI_Comm world, const MeshShape& shape);
  MPI_Comm comm(Axis a) const;
  void free();
};

// MPI_* calls return an error code; with MPI_ERRORS_RETURN set it names the call. Default Open MPI
// handler aborts the job, which is what we want for a dead peer; the check covers the rest.
void mpi_check(int rc, const char* what);

}  // namespace exatrain::parallel
