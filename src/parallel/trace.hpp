// Timeline events of a rank (pipeline actions, collectives) and the Chrome / Perfetto trace
// format ("Trace Event Format", JSON array of complete events "ph": "X"), one process row per
// rank, so the pipeline schedule of every rank can be seen side by side in ui.perfetto.dev.
#pragma once
#include <string>
#include <vector>

#include <mpi.h>

namespace exatrain::parallel {

struct TraceEvent {
  std::string name;  // e.g. "F mb3 c1", "B mb0 c0", "wait RecvAct mb3"
  std::string cat;   // "compute" | "wait"
  double start_us = 0, dur_us = 0;  // since the rank's trace origin (after a common barrier)
};

// Microseconds since `origin` (an MPI_Wtime value).
double trace_us_since(double origin);

// JSON for all ranks' events: per_rank[r] becomes process r ("pid": r).
std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& per_rank);

// Before step 1: that rank 0 will be able to write the trace to `path` (opened for appending and
// closed; a file created by the check is removed again), so a bad --trace PATH ends the run at
// start instead of after the traced steps. Throws naming the path and the system's reason.
void check_trace_writable(const std::string& path);

// Gathers every rank's events to rank 0 of `comm`, which writes the JSON to `path` (checked).
// Collective over comm.
void write_chrome_trace(MPI_Comm comm, const std::vector<TraceEvent>& mine, const std::string& path);

}  // namespace exatrain::parallel
