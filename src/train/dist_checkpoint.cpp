#include "train/dist_checkpoint.hpp"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/sha256.hpp"
#include "parallel/mesh.hpp"
#include "train/checkpoint_slices.hpp"
#include "train/every_rank.hpp"

namespace exatrain {
namespace {

using parallel::DistributedTrainer;
using Kind = DistributedTrainer::StateKind;

const char* const kFiles[2] = {"model.safetensors", "optimizer.safetensors"};
int file_of(Kind k) { return k == Kind::params ? 0 : 1; }
std::string tensor_name(Kind k, const std::string& name) {
  return k == Kind::params ? name : (k == Kind::m ? "m." : "v.") + name;
}

CheckpointIoStats g_stats;
void note_buffer(size_t bytes) { g_stats.largest_buffer_bytes = std::max(g_stats.largest_buffer_bytes, int64_t(bytes)); }

// The checkpoint's collectives count as ops of group "world" for the watchdog; every rank saves
// and loads in the same order, so the indices agree across ranks.
int64_t g_ops = 0;

// Calls fn(entry, lo, hi) for every layout entry of the slice's chunk that overlaps the slice,
// with [lo, hi) the overlap as element indices of the entry's shard.
template <class Fn>
void for_each_entry_part(DistributedTrainer& t, const DistributedTrainer::StateSlice& s, Fn&& fn) {
  const std::vector<ParamInfo>& entries = t.chunk(s.chunk).layout().entries();  // in arena order
  auto it = std::partition_point(entries.begin(), entries.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= s.begin; });
  for (; it != entries.end() && it->offset < s.end; ++it) {
    const int64_t lo = std::max(s.begin, it->offset), hi = std::min(s.end, it->offset + it->numel);
    if (lo < hi) fn(*it, lo - it->offset, hi - it->offset);
  }
}

// The global tensors of the model (name -> global shape): the ranks at dp 0 and tp 0 (one per
// pipeline position, which holds every tensor of its stages) list the entries they save, and the
// lists are all-gathered; names and shapes only, a few bytes per tensor, each tensor once.
std::map<std::string, std::vector<int64_t>> all_tensors(DistributedTrainer& t, MPI_Comm world, int size) {
  nlohmann::json mine = nlohmann::json::array();
  const bool lists = t.runtime().dp().rank() == 0 && t.runtime().mesh().coord.tp == 0;
  for (int c = 0; c < t.chunks() && lists; c++)
    for (const ParamInfo& p : t.chunk(c).layout().entries())
      if (t.saves_entry(c, p)) mine.push_back({p.name, p.global_shape});
  const std::string text = mine.dump();
  note_buffer(text.size());
  int n = int(text.size());
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  parallel::Watchdog* wd = t.runtime().watchdog();
  {
    parallel::WatchdogScope watch(wd, "world", ++g_ops, "MPI_Allgather (checkpoint tensor list sizes)");
    parallel::mpi_check(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, world), "MPI_Allgather");
  }
  int64_t total = 0;
  for (int r = 0; r < size; r++) displs[size_t(r)] = int(total), total += counts[size_t(r)];
  EXA_CHECK(total < INT_MAX, "checkpoint: the tensor list is {} bytes, over MPI's int counts", total);
  std::string all(size_t(total), '\0');
  note_buffer(all.size());
  {
    parallel::WatchdogScope watch(wd, "world", ++g_ops, "MPI_Allgatherv (checkpoint tensor list)");
    parallel::mpi_check(MPI_Allgatherv(text.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR,
                                       world), "MPI_Allgatherv");
  }
  std::map<std::string, std::vector<int64_t>> out;
  for (int r = 0; r < size; r++)
    for (const auto& e : nlohmann::json::parse(all.substr(size_t(displs[size_t(r)]), size_t(counts[size_t(r)])))) {
      const auto shape = e[1].get<std::vector<int64_t>>();
      auto [it, fresh] = out.emplace(e[0].get<std::string>(), shape);
      EXA_CHECK(fresh || it->second == shape, "checkpoint: rank {} says tensor {} has global shape {}, another {}", r,
                it->first, checkpoint::shape_string(shape), checkpoint::shape_string(it->second));
    }
  return out;
}

// Writes this rank's saver slices of file f (and rank 0 the header) with MPI-IO; returns the
// elements written.
int64_t write_file_slices(DistributedTrainer& t, const std::vector<DistributedTrainer::StateSlice>& slices, int f,
                          const checkpoint::SafetensorsWriter& layout, const std::string& path, MPI_Comm world,
                          int rank) {
  const std::string prefix = layout.file_prefix();
  note_buffer(prefix.size());
  const auto ranges = layout.data_ranges();
  MPI_File fh;
  {
    parallel::WatchdogScope watch(t.runtime().watchdog(), "world", ++g_ops, "MPI_File_open (checkpoint)");
    parallel::mpi_check(MPI_File_open(world, path.c_str(), MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &fh),
                        ("MPI_File_open " + path).c_str());
  }
  const std::string what = "MPI_File_write_at " + path;
  MPI_Status status;
  if (rank == 0)
    parallel::mpi_check(MPI_File_write_at(fh, 0, prefix.data(), int(prefix.size()), MPI_BYTE, &status), what.c_str());
  int64_t written = 0;
  for (const DistributedTrainer::StateSlice& s : slices) {
    if (!s.saver || file_of(s.kind) != f) continue;
    for_each_entry_part(t, s, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
      if (!t.saves_entry(s.chunk, p)) return;
      const std::string name = tensor_name(s.kind, p.name);
      const uint64_t tensor_offset = prefix.size() + ranges.at(name).first;
      for_each_piece(p, lo, hi, tensor_offset, kMaxPieceFloats, [&](const FilePiece& piece) {
        const float* src = s.data + (p.offset + piece.local - s.begin);
        parallel::mpi_check(MPI_File_write_at(fh, MPI_Offset(piece.offset), src, piece.count, MPI_FLOAT, &status),
                            what.c_str());
        written += piece.count;
      });
    });
  }
  // MPI_File_sync: every writer's data reaches the storage device (the MPI standard's fsync).
  // Not watched: a rank with little to write waits here for the others' writes, which may
  // rightly take longer than the watchdog's timeout.
  parallel::mpi_check(MPI_File_sync(fh), ("MPI_File_sync " + path).c_str());
  parallel::mpi_check(MPI_File_close(&fh), ("MPI_File_close " + path).c_str());
  return written;
}

}  // namespace

const CheckpointIoStats& last_checkpoint_io_stats() { return g_stats; }

std::string save_distributed_checkpoint(DistributedTrainer& t, MPI_Comm world, const std::string& root,
                                        const TrainerExtras& extras, int64_t keep_last) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  g_stats = {};
  parallel::Watchdog* wd = t.runtime().watchdog();
  const std::map<std::string, std::vector<int64_t>> tensors = all_tensors(t, world, size);
  checkpoint::SafetensorsWriter layout[2];  // headers only: the data comes from every rank
  int64_t expected[2] = {0, 0};             // elements of each file
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    layout[0].declare(name, shape);
    layout[1].declare("m." + name, shape);
    layout[1].declare("v." + name, shape);
    expected[0] += n, expected[1] += 2 * n;
  }
  layout[0].set_metadata("format", "pt");
  layout[1].set_metadata("step", std::to_string(t.step()));
  g_stats.file_data_bytes = int64_t(sizeof(float)) * (expected[0] + expected[1]);

  std::unique_ptr<checkpoint::CheckpointWriter> w;
  std::string temp_dir;
  if (rank == 0) {
    w = std::make_unique<checkpoint::CheckpointWriter>(root, t.step());
    temp_dir = w->temp_dir();
  }
  broadcast_from_rank0(temp_dir, world, wd, "MPI_Bcast (checkpoint directory)");
  const std::vector<DistributedTrainer::StateSlice> slices = t.state_slices();
  for (const auto& s : slices)
    if (s.saver) g_stats.slice_bytes += int64_t(sizeof(float)) * (s.end - s.begin);
  for (int f = 0; f < 2; f++) {
    const std::string path = temp_dir + "/" + kFiles[f];
    const int64_t mine = write_file_slices(t, slices, f, layout[f], path, world, rank);
    g_stats.moved_bytes += int64_t(sizeof(float)) * mine;
    int64_t total = 0;
    {
      parallel::WatchdogScope watch(wd, "world", ++g_ops, "MPI_Reduce (checkpoint elements written)");
      parallel::mpi_check(MPI_Reduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, 0, world), "MPI_Reduce");
    }
    if (rank != 0) continue;
    // Each element has exactly one saver, so the counts add up to the file's; a shortfall would
    // leave a hole of zeros that the checksum would faithfully record.
    EXA_CHECK(total == expected[f], "checkpoint {}: the ranks wrote {} elements, the file holds {} (a slice without "
              "a saver, or one saved twice)", path, total, expected[f]);
    const uint64_t bytes = file_size_or_throw(path);
    const uint64_t want = layout[f].file_prefix().size() + uint64_t(expected[f]) * sizeof(float);
    EXA_CHECK(bytes == want, "checkpoint {}: {} bytes on disk, its header describes {}", path, bytes, want);
    w->add_written_file(kFiles[f], {bytes, sha256_file(path)});  // the read-back: 1 MiB at a time
  }
  std::string dir;
  if (rank == 0) {
    add_trainer_blobs(*w, t.step(), t.options().train.seed, extras);
    dir = w->commit(keep_last);
  }
  // Complete on disk before any rank goes on (or is killed). Not watched: the others wait here
  // while rank 0 checksums and commits, which may rightly take longer than the watchdog's timeout.
  MPI_Barrier(world);
  return dir;
}

TrainerExtras load_distributed_checkpoint(DistributedTrainer& t, MPI_Comm world, const std::string& dir,
                                          bool checksums_verified) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  g_stats = {};
  if (!checksums_verified)  // rank 0 reads every file once; the verdict goes to all
    on_rank0_for_all(world, t.runtime().watchdog(), "MPI_Bcast (checkpoint verdict)",
                     [&] { checkpoint::CheckpointReader verify(dir); });
  checkpoint::CheckpointReader r(dir, checkpoint::Verify::sizes);
  const std::unique_ptr<checkpoint::SafetensorsReader> files[2] = {r.safetensors(kFiles[0]), r.safetensors(kFiles[1])};
  for (const auto& f : files)
    for (const auto& [name, info] : f->tensors()) g_stats.file_data_bytes += int64_t(info.end - info.begin);
  for (const DistributedTrainer::StateSlice& s : t.state_slices()) {
    g_stats.slice_bytes += int64_t(sizeof(float)) * (s.end - s.begin);
    const checkpoint::SafetensorsReader& f = *files[file_of(s.kind)];
    for_each_entry_part(t, s, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
      const std::string name = tensor_name(s.kind, p.name);
      EXA_CHECK(f.has(name), "{}: has no tensor \"{}\" (a checkpoint of a different model?)", f.path(), name);
      const checkpoint::TensorInfo& info = f.info(name);
      EXA_CHECK(info.shape == p.global_shape && info.global_shape == p.global_shape,
                "{}: tensor \"{}\" has shape {} (global {}), this model needs the whole tensor {}", f.path(), name,
                checkpoint::shape_string(info.shape), checkpoint::shape_string(info.global_shape),
                checkpoint::shape_string(p.global_shape));
      for_each_run(p, lo, hi, [&](const SliceRun& run) {
        f.read_f32_range(name, run.global, run.count, s.data + (p.offset + run.local - s.begin));
        g_stats.moved_bytes += int64_t(sizeof(float)) * run.count;
      });
    });
  }
  int64_t step = 0;
  TrainerExtras extras = read_trainer_blobs(r, &step);
  t.set_step(step);
  return extras;
}

}  // namespace exatrain
