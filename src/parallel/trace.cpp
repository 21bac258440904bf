#include "parallel/trace.hpp"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "parallel/mesh.hpp"

namespace exatrain::parallel {

double trace_us_since(double origin) { return (MPI_Wtime() - origin) * 1e6; }

static nlohmann::json events_json(const std::vector<TraceEvent>& evs, int rank) {
  nlohmann::json arr = nlohmann::json::array();
  for (const TraceEvent& e : evs)
    arr.push_back({{"name", e.name}, {"cat", e.cat}, {"ph", "X"}, {"ts", e.start_us},
                   {"dur", e.dur_us}, {"pid", rank}, {"tid", e.cat == "compute" ? 0 : 1}});
  return arr;
}

std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& per_rank) {
  nlohmann::json all = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); r++) {
    all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r},
                   {"args", {{"name", fmt::format("rank {}", r)}}}});
    for (auto& e : events_json(per_rank[r], static_cast<int>(r))) all.push_back(e);
  }
  return all.dump();
}

void write_chrome_trace(MPI_Comm comm, const std::vector<TraceEvent>& mine, const std::string& path) {
  int rank = 0, size = 1;
  mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  // Each rank serialises its events; rank 0 gathers the strings (sizes first, then MPI_Gatherv).
  std::string text = events_json(mine, rank).dump();
  int len = static_cast<int>(text.size());
  std::vector<int> lens(size), displs(size);
  mpi_check(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm), "MPI_Gather");
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; r++) displs[r] = total, total += lens[r];
    all.resize(total);
  }
  mpi_check(MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR,
                        0, comm),
            "MPI_Gatherv");
  if (rank != 0) return;
  std::vector<std::vector<TraceEvent>> per_rank(size);
  for (int r = 0; r < size; r++)
    for (auto& e : nlohmann::json::parse(all.substr(displs[r], lens[r])))
      per_rank[r].push_back({e["name"], e["cat"], e["ts"], e["dur"]});
  std::string json = chrome_trace_json(per_rank);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXA_SYSCHECK(f != nullptr, "cannot write trace {}", path);
  bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
  ok = (std::fclose(f) == 0) && ok;
  EXA_SYSCHECK(ok, "writing trace {}", path);
}

void check_trace_writable(const std::string& path) {
  const bool existed = std::filesystem::exists(path);
  std::FILE* f = std::fopen(path.c_str(), "ab");  // "ab": an existing file is left as it is
  EXA_SYSCHECK(f != nullptr, "--trace {}: cannot write the trace there", path);
  EXA_SYSCHECK(std::fclose(f) == 0, "--trace {}: closing the file", path);
  if (!existed) std::filesystem::remove(path);
}

}  // namespace exatrain::parallel
