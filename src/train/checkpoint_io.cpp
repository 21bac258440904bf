#include "train/checkpoint_io.hpp"

#include <algorithm>
#include <climits>
#include <map>

#include <fmt/format.h>
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

using parallel::StateSlice;

const char* const kFiles[2] = {"model.safetensors", "optimizer.safetensors"};
constexpr const char* kStateFormat = "2";  // optimizer state stored by name (format 1: AdamW's m./v.)
// The largest piece staged between device memory and the file at once (4 MiB of floats).
constexpr int64_t kStagingFloats = int64_t(1) << 20;

int file_of(const StateSlice& s) { return s.state < 0 ? 0 : 1; }

// The tensor's name in its file: the parameter's own, or "<state>.<parameter>".
std::string tensor_name(const std::vector<std::string>& states, int state, const std::string& name) {
  return state < 0 ? name : states[size_t(state)] + "." + name;
}

CheckpointIoStats g_stats;
void note_buffer(size_t bytes) { g_stats.largest_buffer_bytes = std::max(g_stats.largest_buffer_bytes, int64_t(bytes)); }

// The checkpoint's collectives count as ops of group "world" for the watchdog; every rank saves
// and loads in the same order, so the indices agree across ranks.
int64_t g_ops = 0;

// Calls fn(entry, lo, hi) for every layout entry of the slice's chunk that overlaps the slice,
// with [lo, hi) the overlap as element indices of the entry's shard.
template <class Fn>
void for_each_entry_part(Trainer& t, const StateSlice& s, Fn&& fn) {
  const std::vector<ParamInfo>& entries = t.chunk(s.chunk).layout().entries();  // in arena order
  auto it = std::partition_point(entries.begin(), entries.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= s.begin; });
  for (; it != entries.end() && it->offset < s.end; ++it) {
    const int64_t lo = std::max(s.begin, it->offset), hi = std::min(s.end, it->offset + it->numel);
    if (lo < hi) fn(*it, lo - it->offset, hi - it->offset);
  }
}

// The host staging buffer of a save or load: as large as the largest piece moved at once (one
// entry's part of a slice, at most kStagingFloats).
HostBuffer<float> staging_for(Trainer& t, const std::vector<StateSlice>& slices) {
  int64_t floats = 1;
  for (const StateSlice& s : slices)
    for_each_entry_part(t, s, [&](const ParamInfo&, int64_t lo, int64_t hi) {
      floats = std::max(floats, std::min(kStagingFloats, hi - lo));
    });
  note_buffer(size_t(floats) * sizeof(float));
  return HostBuffer<float>(t.backend(), floats);
}

// The global tensors of the model (name -> global shape): the ranks at dp 0 and tp 0 (one per
// pipeline position, which holds every tensor of its stages) list the entries they save, and the
// lists are all-gathered; names and shapes only, a few bytes per tensor, each tensor once.
std::map<std::string, std::vector<int64_t>> all_tensors(Trainer& t, MPI_Comm world, int size) {
  nlohmann::json mine = nlohmann::json::array();
  const bool lists = t.runtime().dp().rank() == 0 && t.runtime().mesh().coord.tp == 0;
  for (int c = 0; c < t.chunks() && lists; c++)
    for (const ParamInfo& p : t.chunk(c).layout().entries())
      if (t.saves_entry(p)) mine.push_back({p.name, p.global_shape});
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

// Writes this rank's saver slices of file f at their offsets (pwrite into the file rank 0 created
// with the header), each piece downloaded into host staging first, then fsyncs; returns the
// elements written. A failed write (a full disk) ends the save on every rank with its message.
int64_t write_file_slices(Trainer& t, const std::vector<StateSlice>& slices, int f,
                          const checkpoint::SafetensorsWriter& layout, const std::string& path, MPI_Comm world,
                          int rank, HostBuffer<float>& host) {
  const std::string prefix = layout.file_prefix();
  note_buffer(prefix.size());
  const auto ranges = layout.data_ranges();
  const std::vector<std::string> states = t.optimizer().state_names();
  Backend& be = t.backend();
  parallel::Watchdog* wd = t.runtime().watchdog();
  on_all_ranks_or_none(world, wd, "MPI_Allreduce (checkpoint file created)", [&] {
    if (rank != 0) return;
    OutputFile header(path);
    header.write(prefix.data(), prefix.size());
    header.sync_and_close();
  });
  int64_t written = 0;
  // Not watched: a rank with little to write waits in the verdict for the others' writes, which
  // may rightly take longer than the watchdog's timeout.
  on_all_ranks_or_none(world, nullptr, "MPI_Allreduce (checkpoint slices written)", [&] {
    OutputFile out(path, OutputFile::Open::existing);
    for (const StateSlice& s : slices) {
      if (!s.saver || file_of(s) != f) continue;
      for_each_entry_part(t, s, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
        if (!t.saves_entry(p)) return;
        const uint64_t tensor_offset = prefix.size() + ranges.at(tensor_name(states, s.state, p.name)).first;
        for_each_piece(p, lo, hi, tensor_offset, host.size(), [&](const FilePiece& piece) {
          be.download(host.data(), s.data + (p.offset + piece.local - s.begin), sizeof(float) * size_t(piece.count));
          out.pwrite(host.data(), sizeof(float) * size_t(piece.count), piece.offset);
          written += piece.count;
        });
      });
    }
    out.sync_and_close();  // every writer's data on the storage device before rank 0 commits
  });
  return written;
}

// The two files' headers, every tensor declared (the data comes from every rank).
void declare_files(Trainer& t, const std::map<std::string, std::vector<int64_t>>& tensors,
                   checkpoint::SafetensorsWriter layout[2], int64_t expected[2]) {
  const std::vector<std::string> states = t.optimizer().state_names();
  std::string names;
  for (const std::string& s : states) names += (names.empty() ? "" : ",") + s;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    layout[0].declare(name, shape);
    for (const std::string& s : states) layout[1].declare(s + "." + name, shape);
    expected[0] += n, expected[1] += int64_t(states.size()) * n;
  }
  layout[0].set_metadata("format", "pt");
  layout[1].set_metadata("step", std::to_string(t.step()));
  layout[1].set_metadata("optimizer", t.optimizer().name());
  layout[1].set_metadata("state_format", kStateFormat);
  layout[1].set_metadata("states", names);
}

}  // namespace

const CheckpointIoStats& last_checkpoint_io_stats() { return g_stats; }

std::string save_checkpoint(Trainer& t, MPI_Comm world, const std::string& root, const TrainerExtras& extras,
                            int64_t keep_last) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  g_stats = {};
  parallel::Watchdog* wd = t.runtime().watchdog();
  checkpoint::SafetensorsWriter layout[2];  // headers only: the data comes from every rank
  int64_t expected[2] = {0, 0};             // elements of each file
  declare_files(t, all_tensors(t, world, size), layout, expected);
  g_stats.file_data_bytes = int64_t(sizeof(float)) * (expected[0] + expected[1]);

  std::unique_ptr<checkpoint::CheckpointWriter> w;
  std::string temp_dir;
  if (rank == 0) {
    w = std::make_unique<checkpoint::CheckpointWriter>(root, t.step());
    temp_dir = w->temp_dir();
  }
  broadcast_from_rank0(temp_dir, world, wd, "MPI_Bcast (checkpoint directory)");
  const std::vector<StateSlice> slices = t.state_slices();
  for (const auto& s : slices)
    if (s.saver) g_stats.slice_bytes += int64_t(sizeof(float)) * (s.end - s.begin);
  HostBuffer<float> host = staging_for(t, slices);
  for (int f = 0; f < 2; f++) {
    const std::string path = temp_dir + "/" + kFiles[f];
    const int64_t mine = write_file_slices(t, slices, f, layout[f], path, world, rank, host);
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

namespace {

// The optimizer state's names in the file: "<state>.<parameter>" (format 2) or, for a format-1
// checkpoint (AdamW moments "m." / "v.", no state_format), their old names; another optimizer
// than the file's is refused with what to do.
std::vector<std::string> stored_state_names(const checkpoint::SafetensorsReader& f, const Optimizer& opt) {
  const std::vector<std::string> states = opt.state_names();
  const auto& meta = f.metadata();
  auto format = meta.find("state_format");
  if (format == meta.end()) {
    EXA_CHECK(std::string(opt.name()) == "adamw",
              "{}: a checkpoint of format 1 (AdamW moments m.* and v.*, written before optimizer state was stored by "
              "name) cannot start the optimizer \"{}\": resume it with train.optimizer = \"adamw\" (it loads and the "
              "next checkpoint is in the current format), or start \"{}\" from its weights alone "
              "(`exatrain export` them, then train from a fresh run)", f.path(), opt.name(), opt.name());
    return {"m", "v"};
  }
  EXA_CHECK(format->second == kStateFormat, "{}: state_format {} is newer than this exatrain reads ({})", f.path(),
            format->second, kStateFormat);
  auto name = meta.find("optimizer");
  EXA_CHECK(name != meta.end() && name->second == opt.name(),
            "{}: holds the state of optimizer \"{}\", this job's train.optimizer is \"{}\": resume with the same "
            "optimizer", f.path(), name == meta.end() ? "?" : name->second, opt.name());
  return states;
}

}  // namespace

TrainerExtras load_checkpoint(Trainer& t, MPI_Comm world, const std::string& dir, bool checksums_verified) {
  g_stats = {};
  if (!checksums_verified)  // rank 0 reads every file once; the verdict goes to all
    on_rank0_for_all(world, t.runtime().watchdog(), "MPI_Bcast (checkpoint verdict)",
                     [&] { checkpoint::CheckpointReader verify(dir); });
  checkpoint::CheckpointReader r(dir, checkpoint::Verify::sizes);
  const std::unique_ptr<checkpoint::SafetensorsReader> files[2] = {r.safetensors(kFiles[0]), r.safetensors(kFiles[1])};
  for (const auto& f : files)
    for (const auto& [name, info] : f->tensors()) g_stats.file_data_bytes += int64_t(info.end - info.begin);
  const std::vector<std::string> states = stored_state_names(*files[1], t.optimizer());
  Backend& be = t.backend();
  const std::vector<StateSlice> slices = t.state_slices();
  HostBuffer<float> host = staging_for(t, slices);
  for (const StateSlice& s : slices) {
    g_stats.slice_bytes += int64_t(sizeof(float)) * (s.end - s.begin);
    const checkpoint::SafetensorsReader& f = *files[file_of(s)];
    for_each_entry_part(t, s, [&](const ParamInfo& p, int64_t lo, int64_t hi) {
      const std::string name = tensor_name(states, s.state, p.name);
      EXA_CHECK(f.has(name), "{}: has no tensor \"{}\" (a checkpoint of a different model?)", f.path(), name);
      const checkpoint::TensorInfo& info = f.info(name);
      EXA_CHECK(info.shape == p.global_shape && info.global_shape == p.global_shape,
                "{}: tensor \"{}\" has shape {} (global {}), this model needs the whole tensor {}", f.path(), name,
                checkpoint::shape_string(info.shape), checkpoint::shape_string(info.global_shape),
                checkpoint::shape_string(p.global_shape));
      for_each_run(p, lo, hi, [&](const SliceRun& run) {
        for (int64_t done = 0; done < run.count; done += host.size()) {
          const int64_t n = std::min(host.size(), run.count - done);
          f.read_f32_range(name, run.global + done, n, host.data());
          be.upload(s.data + (p.offset + run.local + done - s.begin), host.data(), sizeof(float) * size_t(n));
          g_stats.moved_bytes += int64_t(sizeof(float)) * n;
        }
      });
    });
  }
  int64_t step = 0;
  TrainerExtras extras = read_trainer_blobs(r, &step);
  t.set_step(step);
  return extras;
}

}  // namespace exatrain
