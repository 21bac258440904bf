#include "train/dist_checkpoint.hpp"

#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/safetensors.hpp"
#include "core/check.hpp"

namespace exatrain {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Element (i, j) of a shard [rows, cols] sits at global (gi, gj): the slice arithmetic of
// ParamInfo (split_dim 0 or 1 of a matrix, 0 of a vector). `to_global` copies shard -> global.
void copy_slice(const std::vector<int64_t>& global_shape, const std::vector<int64_t>& shard_shape, int split_dim,
                int64_t shard_start, float* global, float* shard, bool to_global) {
  const int64_t rows = shard_shape.size() == 2 ? shard_shape[0] : 1;
  const int64_t cols = shard_shape.back(), gcols = global_shape.back();
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      int64_t gi = i, gj = j;
      if (split_dim == 0 && shard_shape.size() == 2) gi += shard_start;
      if ((split_dim == 0 && shard_shape.size() == 1) || split_dim == 1) gj += shard_start;
      float& g = global[gi * gcols + gj];
      float& s = shard[i * cols + j];
      if (to_global) g = s;
      else s = g;
    }
}

struct GlobalTensor {
  std::vector<int64_t> shape;
  std::vector<float> arena[3];  // params, m, v
  int64_t placed = 0;
};

}  // namespace

std::string save_distributed_checkpoint(parallel::DistributedTrainer& t, MPI_Comm world, const std::string& root,
                                        const TrainerExtras& extras, int64_t keep_last) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::vector<parallel::DistributedTrainer::ChunkState> st = t.export_state();
  // This rank's slices: a JSON index plus the floats (params, m, v of each slice in turn).
  nlohmann::json index = nlohmann::json::array();
  std::vector<float> data;
  for (int c = 0; c < t.chunks(); c++)
    for (const ParamInfo& p : t.chunk(c).layout().entries()) {
      if (!t.saves_entry(c, p)) continue;
      index.push_back({{"name", p.name}, {"global", p.global_shape}, {"shard", p.shard_shape},
                       {"split", p.split_dim}, {"start", p.shard_start}});
      for (const std::vector<float>* a : {&st[size_t(c)].params, &st[size_t(c)].m, &st[size_t(c)].v})
        data.insert(data.end(), a->begin() + p.offset, a->begin() + p.offset + p.numel);
    }
  const std::string idx = index.dump();
  int counts[2] = {int(idx.size()), int(data.size())};
  std::vector<int> all_counts(static_cast<size_t>(2 * size));
  parallel::Watchdog* wd = t.runtime().watchdog();  // a rank that never arrives is reported
  {
    parallel::WatchdogScope watch(wd, "world", 1, "MPI_Gather (checkpoint sizes)");
    MPI_Gather(counts, 2, MPI_INT, all_counts.data(), 2, MPI_INT, 0, world);
  }
  const size_t nranks = static_cast<size_t>(size);
  std::vector<int> idx_n(nranks), idx_off(nranks), dat_n(nranks), dat_off(nranks);
  int64_t idx_total = 0, dat_total = 0;
  for (int r = 0; r < size && rank == 0; r++) {
    idx_n[size_t(r)] = all_counts[size_t(2 * r)], dat_n[size_t(r)] = all_counts[size_t(2 * r + 1)];
    idx_off[size_t(r)] = int(idx_total), dat_off[size_t(r)] = int(dat_total);
    idx_total += idx_n[size_t(r)], dat_total += dat_n[size_t(r)];
  }
  std::string all_idx(static_cast<size_t>(idx_total), 0);
  std::vector<float> all_data(static_cast<size_t>(dat_total));
  {
    parallel::WatchdogScope watch(wd, "world", 2, "MPI_Gatherv (checkpoint tensors)");
    MPI_Gatherv(idx.data(), counts[0], MPI_CHAR, all_idx.data(), idx_n.data(), idx_off.data(), MPI_CHAR, 0, world);
    MPI_Gatherv(data.data(), counts[1], MPI_FLOAT, all_data.data(), dat_n.data(), dat_off.data(), MPI_FLOAT, 0, world);
  }
  std::string dir;
  if (rank == 0) {
    std::map<std::string, GlobalTensor> tensors;
    for (int r = 0; r < size; r++) {
      const nlohmann::json ix = nlohmann::json::parse(all_idx.substr(size_t(idx_off[size_t(r)]), size_t(idx_n[size_t(r)])));
      float* d = all_data.data() + dat_off[size_t(r)];
      for (const auto& e : ix) {
        const auto gshape = e["global"].get<std::vector<int64_t>>();
        const auto sshape = e["shard"].get<std::vector<int64_t>>();
        GlobalTensor& g = tensors[e["name"].get<std::string>()];
        if (g.shape.empty()) {
          g.shape = gshape;
          for (auto& a : g.arena) a.assign(size_t(numel_of(gshape)), 0.0f);
        }
        const int64_t n = numel_of(sshape);
        for (int k = 0; k < 3; k++, d += n)
          copy_slice(gshape, sshape, e["split"].get<int>(), e["start"].get<int64_t>(), g.arena[k].data(), d, true);
        g.placed += n;
      }
    }
    checkpoint::SafetensorsWriter weights, opt;
    for (auto& [name, g] : tensors) {
      EXA_CHECK(g.placed == numel_of(g.shape), "checkpoint: tensor \"{}\" got {} of its {} elements from the ranks",
                name, g.placed, numel_of(g.shape));
      const std::vector<int64_t> zero(g.shape.size(), 0);
      weights.add_slice(name, g.shape, g.arena[0].data(), checkpoint::DType::F32, g.shape, zero);
      opt.add_slice("m." + name, g.shape, g.arena[1].data(), checkpoint::DType::F32, g.shape, zero);
      opt.add_slice("v." + name, g.shape, g.arena[2].data(), checkpoint::DType::F32, g.shape, zero);
    }
    weights.set_metadata("format", "pt");
    opt.set_metadata("step", std::to_string(t.step()));
    checkpoint::CheckpointWriter w(root, t.step());
    w.add_safetensors("model.safetensors", weights);
    w.add_safetensors("optimizer.safetensors", opt);
    add_trainer_blobs(w, t.step(), t.options().train.seed, extras);
    dir = w.commit(keep_last);
  }
  // Complete on disk before any rank goes on (or is killed). Not watched: the others wait here
  // while rank 0 writes, which may rightly take longer than the watchdog's timeout.
  MPI_Barrier(world);
  return dir;
}

TrainerExtras load_distributed_checkpoint(parallel::DistributedTrainer& t, const std::string& dir) {
  checkpoint::CheckpointReader r(dir);
  auto weights = r.safetensors("model.safetensors");
  auto opt = r.safetensors("optimizer.safetensors");
  std::vector<parallel::DistributedTrainer::ChunkState> st(size_t(t.chunks()));
  for (int c = 0; c < t.chunks(); c++) {
    const int64_t n = t.chunk(c).num_params();
    std::vector<float>* arenas[3] = {&st[size_t(c)].params, &st[size_t(c)].m, &st[size_t(c)].v};
    for (auto* a : arenas) a->assign(size_t(n), 0.0f);
    for (const ParamInfo& p : t.chunk(c).layout().entries()) {
      const std::string names[3] = {p.name, "m." + p.name, "v." + p.name};
      const checkpoint::SafetensorsReader* files[3] = {weights.get(), opt.get(), opt.get()};
      for (int k = 0; k < 3; k++) {
        const checkpoint::SafetensorsReader& f = *files[k];
        EXA_CHECK(f.has(names[k]), "{}: has no tensor \"{}\" (a checkpoint of a different model?)", f.path(), names[k]);
        const checkpoint::TensorInfo& info = f.info(names[k]);
        EXA_CHECK(info.shape == p.global_shape && info.global_shape == p.global_shape,
                  "{}: tensor \"{}\" has shape {} (global {}), this model needs the whole tensor {}", f.path(),
                  names[k], checkpoint::shape_string(info.shape), checkpoint::shape_string(info.global_shape),
                  checkpoint::shape_string(p.global_shape));
        std::vector<float> global = f.read_f32(names[k]);
        copy_slice(p.global_shape, p.shard_shape, p.split_dim, p.shard_start, global.data(),
                   arenas[k]->data() + p.offset, false);
      }
    }
  }
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(r.blob("trainer_state.json"));
  } catch (const nlohmann::json::exception& e) {
    EXA_FAIL("{}/trainer_state.json: not valid JSON ({})", r.dir(), e.what());
  }
  EXA_CHECK(state.contains("step") && state.contains("data_cursor"),
            "{}/trainer_state.json: expected keys \"step\" and \"data_cursor\"", r.dir());
  t.import_state(st, state["step"].get<int64_t>());
  TrainerExtras extras;
  extras.data_cursor_json = state["data_cursor"].dump();
  extras.tokenizer_type = state.value("tokenizer_type", "");
  extras.job_toml = r.blob("job.toml");
  if (r.has("tokenizer.model")) extras.tokenizer_model = r.blob("tokenizer.model");
  return extras;
}

}  // namespace exatrain
