#include "parallel/grad_sync.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "parallel/grad_sync_stages.hpp"

namespace exatrain::parallel {

SyncChunk chunk_view(Gpt& model, int tp_rank, bool tied_across_stages) {
  SyncChunk ch;
  ch.model = &model;
  for (const ParamInfo& p : model.layout().entries()) {
    ch.units[p.unit].push_back({p.offset, p.numel});  // one range per entry, in arena order
    const bool is_wte = p.role == ParamRole::embedding && p.split_dim == 0;  // the token table (wpe is replicated)
    if (is_wte && tied_across_stages) ch.tied = {p.offset, p.numel};
    // Each global element counted once: tp-replicated entries on tp rank 0; the tied copy not at all.
    const bool count = (p.split_dim >= 0 || tp_rank == 0) && !p.tied_copy;
    if (count && !ch.counted.empty() && ch.counted.back().end() == p.offset) ch.counted.back().len += p.numel;
    else if (count) ch.counted.push_back({p.offset, p.numel});
  }
  return ch;
}

double GradSync::counted_squares(int c, const float* data, int64_t begin, int64_t end) const {
  double s = 0;
  for (const Range& r : s_.chunks[size_t(c)].counted) {
    const int64_t lo = std::max(begin, r.offset), hi = std::min(end, r.end());
    if (lo < hi) s += be().sum_squares(data + (lo - begin), hi - lo);
  }
  return s;
}

void GradSync::add_arena_slices(std::vector<StateSlice>& out, int c, int state, float* data, int64_t n,
                                const std::vector<Range>& saved) {
  int64_t at = 0;
  auto add = [&](int64_t b, int64_t e, bool saver) {
    if (b < e) out.push_back({c, state, b, e, data + b, saver});
  };
  for (const Range& r : saved) {
    add(at, r.offset, false);
    add(r.offset, r.end(), true);
    at = r.end();
  }
  add(at, n, false);
}

void GradSync::masters_written() {
  for (size_t c = 0; c < s_.chunks.size(); c++)
    if (c < masters_.size() && masters_[c]) masters_[c]->masters_written();
    else s_.chunks[c].model->params_changed();
}

int64_t GradSync::released_param_bytes() const {
  int64_t b = 0;
  for (const auto& m : masters_) b += m ? m->released_bytes() : 0;
  return b;
}

void GradSync::gather_full_params() {
  for (auto& m : masters_)
    if (m) m->gather_full();
}

void GradSync::release_full_params() {
  for (auto& m : masters_)
    if (m) m->release();
}

int zero_run(int zero, int replicas) { return replicas == 1 ? 0 : zero; }

ArenaPolicy arena_policy(int zero, int replicas) {
  zero = zero_run(zero, replicas);
  ArenaPolicy a;
  a.lazy_params = zero == 3;
  a.lazy_grads = zero >= 2;
  a.init_weights = zero != 3;
  return a;
}

void GradSync::init_optimizer(const std::vector<ParamRegion>& regions, bool replicated) {
  static LocalReplicaComm one;
  OptimizerTopology t;
  t.comm = s_.optimizer_comm ? s_.optimizer_comm : &one;
  for (const SyncChunk& ch : s_.chunks) t.chunks.push_back(&ch.model->layout());
  t.replicated = replicated;
  s_.optimizer->connect(t);
  s_.optimizer->init_state(regions);
}

std::unique_ptr<GradSync> make_grad_sync(int zero, GradSyncSetup setup) {
  EXA_CHECK(setup.be && setup.dp && setup.compressor && setup.optimizer, "make_grad_sync: incomplete setup");
  const bool whole = setup.optimizer->needs_whole_entries();
  const int run = zero_run(zero, setup.dp->size());  // the checks below are of what runs
  EXA_CHECK(!whole || run <= 1,
            "ZeRO {}: the optimizer \"{}\" needs every parameter matrix whole on one rank, which ZeRO 2 and 3 "
            "shard by buckets and units; use zero = 0 or 1", zero, setup.optimizer->name());
  if (whole) setup.align_to_entries = true;
  EXA_CHECK(!(run == 1 && setup.align_to_entries) ||
                std::string(setup.compressor->name()) == "none",
            "ZeRO 1 with shards cut between parameter entries reduce-scatters shards of unequal size "
            "(reduce_scatter_v), which the compressor slot does not take: compressor \"{}\" needs equal shards "
            "(align_shards_to_entries = false, and an optimizer that does not need whole matrices) or zero = 0 or 2",
            setup.compressor->name());
  EXA_CHECK(run == 0 || !setup.compressor->compresses_momentum(),
            "[comm] compress = \"momentum\" with [parallel] zero = {}: each rank forms its local momentum from the "
            "synchronised one, which ZeRO 1 and 2 keep only as this rank's shard; expected zero = 0", zero);
  EXA_CHECK(run != 3 || std::string(setup.compressor->name()) == "none",
            "ZeRO 3 reduce-scatters every unit's gradients as backward makes them, without the compressor slot: "
            "compressor \"{}\" needs zero = 0, 1 or 2", setup.compressor->name());
  switch (run) {
    case 0: return make_zero0_sync(std::move(setup));
    case 1: return make_zero1_sync(std::move(setup));
    case 2: return make_zero2_sync(std::move(setup));
    case 3: return make_zero3_sync(std::move(setup));
  }
  EXA_FAIL("ZeRO stage {} does not exist (expected 0, 1, 2 or 3)", zero);
}

}  // namespace exatrain::parallel
