// The process mesh as rank arithmetic: world ranks arranged as (pp, dp, cp, tp) with tp
// innermost, so that the ranks of one tensor-parallel group are neighbours (same node first: tp
// talks the most). Megatron's order:
//
//   rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i
//
// THE rank-arithmetic functions of the project: the planner (plan::rank_position, its byte and
// time model) and the runtime (parallel::Mesh, which splits the MPI communicators) both call
// these. Pure functions, no MPI.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace exatrain::plan {

// Degrees of each axis. world = tp * cp * dp * pp always holds after resolve_mesh_shape.
struct MeshShape {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int world() const { return tp * cp * dp * pp; }
};

// Position of one rank on each axis.
struct MeshCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};

enum class Axis { tp, cp, dp, pp };
const char* axis_name(Axis a);

// Validates the degrees against the world size and infers dp when omitted
// (dp = world / (tp * cp * pp)). Throws exatrain::Error printing the equation when it does not
// add up, e.g. "world 6 != tp 4 * cp 1 * dp 1 * pp 2 = 8".
MeshShape resolve_mesh_shape(int world, int tp, int cp, int pp, std::optional<int> dp);

// The one rank-arithmetic function: coordinates of `rank` and its inverse.
MeshCoord coord_of(const MeshShape& s, int rank);
int rank_of(const MeshShape& s, const MeshCoord& c);

// World ranks of the group along `axis` that contains `rank`, in axis order (index i of the
// result is the rank with coordinate i on that axis; the group-local rank equals the coordinate).
std::vector<int> group_ranks(const MeshShape& s, int rank, Axis axis);

// The data-parallel replica group: every rank with the same tp and pp coordinates (dp x cp
// ranks hold the same weights and average their gradients), index = dp * cp_degree + cp — the
// planner's dp group. Equals group_ranks(.., Axis::dp) when cp = 1.
std::vector<int> replica_ranks(const MeshShape& s, int rank);

// The coordinate of `c` on axis `a` (assignable), and the degree of axis `a`.
int& coord_ref(MeshCoord& c, Axis a);
int degree(const MeshShape& s, Axis a);

// Colour for MPI_Comm_split: equal for exactly the ranks that share every coordinate but `axis`.
int split_colour(const MeshShape& s, int rank, Axis axis);

}  // namespace exatrain::plan
