#include "train/checkpoint_io.hpp"

#include <algorithm>
#include <array>
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

// Entry states (Optimizer::entry_states: a matrix optimizer's factors) are stored whole, named
// "<state>.<parameter>"; a tensor-parallel shard of a split entry has its own, named
// "<state>.<parameter>.tp<r>of<n>" (shards may be unequal: a vocabulary of 67 over tp 2). So they
// load at any dp, pp and ZeRO stage, and a checkpoint of another tp degree names what is missing.
std::string entry_state_name(Trainer& t, const ParamInfo& p, const EntryStateSpec& spec) {
  const int tp = int(t.options().plan.tp);
  if (p.split_dim < 0 || tp == 1) return spec.name + "." + p.name;
  return fmt::format("{}.{}.tp{}of{}", spec.name, p.name, t.runtime().mesh().coord.tp, tp);
}
std::string entry_state_name(Trainer& t, const EntryStateTensor& e) { return entry_state_name(t, *e.entry, e.spec); }

// The chunk index of a layout.
int chunk_of(Trainer& t, const ParamLayout* layout) {
  for (int c = 0; c < t.chunks(); c++)
    if (&t.chunk(c).layout() == layout) return c;
  EXA_FAIL("checkpoint: an optimizer entry state of a layout that is no chunk of this trainer");
}

// The saver of an entry's entry states: the rank that saves the entry's parameters (its first
// element) and, over tp, the one saves_entry names, unless the optimizer names one. Under ZeRO 0 every replica holds the state
// and one saves it; under ZeRO 1 with shards cut between entries the owner does.
bool saves_entry_state(Trainer& t, const std::vector<StateSlice>& slices, const EntryStateTensor& e) {
  if (!t.saves_entry(*e.entry)) return false;
  // An optimizer may name the replica that saves a state it keeps on some replicas only (K-FAC's
  // eigenbases, on a layer's gradient workers: its inverse worker saves them).
  if (const int saver = t.optimizer().entry_state_saver(*e.entry, e.index); saver >= 0)
    return t.runtime().dp().rank() == saver;
  const int c = chunk_of(t, e.layout);
  for (const StateSlice& s : slices)
    if (s.state < 0 && s.chunk == c && s.saver && s.begin <= e.entry->offset && e.entry->offset < s.end) return true;
  return false;
}

// The host staging buffer of a save or load: as large as the largest piece moved at once (one
// entry's part of a slice, at most kStagingFloats).
HostBuffer<float> staging_for(Trainer& t, const std::vector<StateSlice>& slices) {
  int64_t floats = 1;
  for (const StateSlice& s : slices)
    for_each_entry_part(t, s, [&](const ParamInfo&, int64_t lo, int64_t hi) {
      floats = std::max(floats, std::min(kStagingFloats, hi - lo));
    });
  for (const EntryStateTensor& e : t.optimizer().entry_state_tensors())
    floats = std::max(floats, std::min(kStagingFloats, e.numel()));
  note_buffer(size_t(floats) * sizeof(float));
  return HostBuffer<float>(t.backend(), floats);
}

// The global tensors of the checkpoint (name -> shape in the file): [0] the parameters (and their
// per-element optimizer state), [1] the optimizer's entry states. The ranks at dp 0 and tp 0 (one
// per pipeline position, which holds every tensor of its stages) list the entries they save, every
// tp rank at dp 0 its shards' entry states, and the lists are all-gathered; names and shapes only,
// a few bytes per tensor, each tensor once.
using TensorShapes = std::map<std::string, std::vector<int64_t>>;
std::array<TensorShapes, 2> all_tensors(Trainer& t, MPI_Comm world, int size) {
  nlohmann::json mine = nlohmann::json::array();
  const bool lists = t.runtime().dp().rank() == 0, tp0 = t.runtime().mesh().coord.tp == 0;
  for (int c = 0; c < t.chunks() && lists; c++)
    for (const ParamInfo& p : t.chunk(c).layout().entries()) {
      if (!t.saves_entry(p)) continue;
      if (tp0) mine.push_back({p.name, p.global_shape, 0});
      for (const EntryStateSpec& spec : t.optimizer().entry_states(p))  // every tp rank its shard's
        mine.push_back({entry_state_name(t, p, spec), spec.shape, 1});
    }
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
  std::array<TensorShapes, 2> out;
  for (int r = 0; r < size; r++)
    for (const auto& e : nlohmann::json::parse(all.substr(size_t(displs[size_t(r)]), size_t(counts[size_t(r)])))) {
      const auto shape = e[1].get<std::vector<int64_t>>();
      auto [it, fresh] = out[e[2].get<size_t>()].emplace(e[0].get<std::string>(), shape);
      EXA_CHECK(fresh || it->second == shape, "checkpoint: rank {} says tensor {} has global shape {}, another {}", r,
                it->first, checkpoint::shape_string(shape), checkpoint::shape_string(it->second));
    }
  return out;
}

// Writes the entry states this rank saves (saves_entry_state) into the optimizer file; returns
// the elements written.
int64_t write_entry_states(Trainer& t, const std::vector<StateSlice>& slices, size_t prefix,
                           const std::map<std::string, std::pair<uint64_t, uint64_t>>& ranges, OutputFile& out,
                           HostBuffer<float>& host) {
  int64_t written = 0;
  for (const EntryStateTensor& e : t.optimizer().entry_state_tensors()) {
    if (!saves_entry_state(t, slices, e)) continue;
    const uint64_t at = prefix + ranges.at(entry_state_name(t, e)).first;
    for (int64_t done = 0; done < e.numel(); done += host.size()) {
      const int64_t n = std::min(host.size(), e.numel() - done);
      t.backend().download(host.data(), e.data + done, sizeof(float) * size_t(n));
      out.pwrite(host.data(), sizeof(float) * size_t(n), at + sizeof(float) * uint64_t(done));
      written += n;
    }
  }
  return written;
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
    if (f == 1) written += write_entry_states(t, slices, prefix.size(), ranges, out, host);
    out.sync_and_close();  // every writer's data on the storage device before rank 0 commits
  });
  return written;
}

// The two files' headers, every tensor declared (the data comes from every rank).
void declare_files(Trainer& t, const std::array<TensorShapes, 2>& tensors, checkpoint::SafetensorsWriter layout[2],
                   int64_t expected[2]) {
  const std::vector<std::string> states = t.optimizer().state_names();
  std::string names;
  for (const std::string& s : states) names += (names.empty() ? "" : ",") + s;
  auto numel = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  };
  for (const auto& [name, shape] : tensors[0]) {
    layout[0].declare(name, shape);
    for (const std::string& s : states) layout[1].declare(s + "." + name, shape);
    expected[0] += numel(shape), expected[1] += int64_t(states.size()) * numel(shape);
  }
  for (const auto& [name, shape] : tensors[1]) layout[1].declare(name, shape), expected[1] += numel(shape);
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
  for (const EntryStateTensor& e : t.optimizer().entry_state_tensors())
    if (saves_entry_state(t, slices, e)) g_stats.slice_bytes += int64_t(sizeof(float)) * e.numel();
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

// Reads the entry states this rank holds (every holder, not only the saver) from the optimizer file.
void load_entry_states(Trainer& t, const checkpoint::SafetensorsReader& f, HostBuffer<float>& host) {
  for (const EntryStateTensor& e : t.optimizer().entry_state_tensors()) {
    const std::string name = entry_state_name(t, e);
    EXA_CHECK(f.has(name), "{}: has no tensor \"{}\", the state \"{}\" that optimizer \"{}\" keeps for {} (entry "
              "states are kept per tensor-parallel shard: resume at the tp degree that saved them; else a checkpoint "
              "of another optimizer configuration or model)", f.path(), name, e.spec.name, t.optimizer().name(),
              e.entry->name);
    const checkpoint::TensorInfo& info = f.info(name);
    EXA_CHECK(info.shape == e.spec.shape, "{}: tensor \"{}\" has shape {}, this run needs {}", f.path(), name,
              checkpoint::shape_string(info.shape), checkpoint::shape_string(e.spec.shape));
    for (int64_t done = 0; done < e.numel(); done += host.size()) {
      const int64_t n = std::min(host.size(), e.numel() - done);
      f.read_f32_range(name, done, n, host.data());
      t.backend().upload(e.data + done, host.data(), sizeof(float) * size_t(n));
      g_stats.moved_bytes += int64_t(sizeof(float)) * n;
    }
    g_stats.slice_bytes += int64_t(sizeof(float)) * e.numel();
  }
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
  load_entry_states(t, *files[1], host);
  t.masters_changed();  // every rank wrote its whole parameter arena
  int64_t step = 0;
  TrainerExtras extras = read_trainer_blobs(r, &step);
  t.set_step(step);
  return extras;
}

}  // namespace exatrain
