#include "optim/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "optim/first_order.hpp"
#include "optim/kfac.hpp"
#include "optim/mixed.hpp"
#include "optim/muon.hpp"
#include "optim/shampoo.hpp"
#include "optim/soap.hpp"

namespace exatrain {

int64_t EntryStateTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  return n;
}

void Optimizer::init_state(const std::vector<ParamRegion>& regions) {
  EXA_CHECK(state_.empty(), "optimizer {}: init_state called twice", name());
  const std::vector<std::string> names = state_names();
  region_first_tensor_.assign(1, 0);
  for (size_t k = 0; k < regions.size(); k++) {
    const ParamRegion& r = regions[k];
    std::vector<DeviceBuffer> bufs;
    for (const std::string& s : names) {
      bufs.emplace_back(be_, r.size(), ("optimizer state " + s).c_str());
      if (!bufs.back().empty()) be_.zero(bufs.back().data(), sizeof(float) * size_t(r.size()));
    }
    state_.push_back(std::move(bufs));
    init_entry_states(k, r);
    region_first_tensor_.push_back(entry_tensors_.size());
  }
}

// The entry states this rank holds (holds_entry_state) of every entry that region r holds whole
// (zeroed); an entry with entry states that the region cuts is a sharding that ignored
// needs_whole_entries.
void Optimizer::init_entry_states(size_t region, const ParamRegion& r) {
  for (const ParamInfo& p : r.layout->entries()) {
    if (p.offset + p.numel <= r.begin || p.offset >= r.end) continue;
    const std::vector<EntryStateSpec> specs = entry_states(p);
    if (specs.empty()) continue;
    EXA_CHECK(p.offset >= r.begin && p.offset + p.numel <= r.end,
              "optimizer {}: region {} holds arena elements [{}, {}) of {} (elements [{}, {})), whose state \"{}\" "
              "needs the whole entry: the sharding must cut between entries (needs_whole_entries)", name(), region,
              r.begin, r.end, p.name, p.offset, p.offset + p.numel, specs[0].name);
    for (size_t i = 0; i < specs.size(); i++) {
      if (!holds_entry_state(p, i)) continue;
      EntryStateTensor t{r.layout, &p, specs[i], nullptr, i, specs.size()};
      entry_buffers_.emplace_back(be_, t.numel(), ("optimizer entry state " + specs[i].name).c_str());
      t.data = entry_buffers_.back().data();
      if (t.data) be_.zero(t.data, sizeof(float) * size_t(t.numel()));
      entry_tensors_.push_back(std::move(t));
    }
  }
}

float* Optimizer::state(size_t region, size_t s) const { return state_.at(region).at(s).data(); }

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& bufs : state_)
    for (const DeviceBuffer& d : bufs) b += int64_t(sizeof(float)) * d.size();
  for (const DeviceBuffer& d : entry_buffers_) b += int64_t(sizeof(float)) * d.size();
  return b;
}

// Every region entry by entry: the part of each layout entry inside it, in arena order, with the
// entry's entry states when the region holds it whole (init_entry_states made them in this order;
// null where this rank holds none). Pointers into part_state_'s vectors stay valid as it grows.
void Optimizer::collect_parts(const std::vector<ParamRegion>& regions) {
  EXA_CHECK(regions.size() == state_.size(), "optimizer {}: {} regions, state for {}", name(), regions.size(),
            state_.size());
  const size_t states = state_names().size();
  struct Where { const ParamInfo* p; int64_t first, n; float* params; const float* grads; };
  std::vector<Where> where;
  part_state_.clear();
  for (size_t r = 0; r < regions.size(); r++) {
    const ParamRegion& reg = regions[r];
    const std::vector<ParamInfo>& entries = reg.layout->entries();
    size_t next = region_first_tensor_[r];  // the next entry-state tensor of this region
    auto it = std::partition_point(entries.begin(), entries.end(),
                                   [&](const ParamInfo& p) { return p.offset + p.numel <= reg.begin; });
    for (; it != entries.end() && it->offset < reg.end; ++it) {
      const int64_t lo = std::max(reg.begin, it->offset), hi = std::min(reg.end, it->offset + it->numel);
      if (lo >= hi) continue;
      const int64_t k = lo - reg.begin;  // position in the region
      std::vector<float*> ptrs(states);
      for (size_t s = 0; s < states; s++) ptrs[s] = state_[r][s].data() + k;
      for (; next < region_first_tensor_[r + 1] && entry_tensors_[next].entry == &*it; next++) {
        const EntryStateTensor& t = entry_tensors_[next];
        ptrs.resize(states + t.of, nullptr);  // no-op after the first of the entry
        ptrs[states + t.index] = t.data;
      }
      where.push_back({&*it, lo - it->offset, hi - lo, reg.params + k, reg.grads + k});
      part_state_.push_back(std::move(ptrs));
    }
  }
  parts_.clear();
  for (size_t i = 0; i < where.size(); i++) {
    const Where& w = where[i];
    float* const* st = part_state_[i].data();
    parts_.push_back({*w.p, w.first, w.n, w.params, w.grads, st, part_state_[i].size() > states ? st + states : nullptr});
  }
}

// The parts of every region (collect_parts), the work across them (prepare_step), then each update.
void Optimizer::step(const std::vector<ParamRegion>& regions, const OptimStep& ctx) {
  EXA_CHECK(!ctx.grads_are_momentum || takes_momentum(), "optimizer {}: handed the synchronised momentum in place "
            "of the gradient ([comm] compress = \"momentum\"), which only adamw takes", name());
  collect_parts(regions);
  prepare_step(parts_, ctx);
  for (const EntryPart& e : parts_) update(e, ctx);
}

void adamw_part(Backend& be, const AdamWConfig& c, const EntryPart& e, float* m, float* v, const OptimStep& ctx) {
  const float bc1 = 1.0f - std::pow(c.beta1, float(ctx.step));
  // Frozen variance: beta2 = 1 leaves v exactly as it is (v = 1 v + 0 g^2), its correction that of the freeze.
  const bool frozen = c.freeze_variance_after > 0 && ctx.step > c.freeze_variance_after;
  const float beta2 = frozen ? 1.0f : c.beta2;
  const float bc2 = 1.0f - std::pow(c.beta2, float(frozen ? c.freeze_variance_after : ctx.step));
  // Compressed momentum: the "gradient" is the new m itself; beta1 = 0 makes the update's
  // m = 0 m + 1 g exactly, and bc1 stays that of beta1 (m estimates the same moving average).
  EXA_CHECK(!ctx.grads_are_momentum || frozen, "adamw: handed the synchronised momentum at step {} with its variance "
            "not frozen (freeze_variance_after = {}): [comm] compress = \"momentum\" needs adam_variance = \"freeze\"",
            ctx.step, c.freeze_variance_after);
  const float beta1 = ctx.grads_are_momentum ? 0.0f : c.beta1;
  be.adamw_update(e.params, e.grads, m, v, e.n, ctx.lr, beta1, beta2, c.eps, e.p.decay ? c.weight_decay : 0.0f,
                  bc1, bc2, ctx.grad_scale);
}

void check_whole_entry(const char* optimizer, const EntryPart& e) {
  EXA_CHECK(e.first == 0 && e.n == e.p.numel, "{}: {} is cut by its region (elements [{}, {}) of {}): the sharding "
            "must cut between entries (needs_whole_entries)", optimizer, e.p.name, e.first, e.first + e.n, e.p.numel);
}

int64_t bytes_of(std::initializer_list<const DeviceBuffer*> buffers) {
  int64_t b = 0;
  for (const DeviceBuffer* d : buffers) b += int64_t(sizeof(float)) * d->size();
  return b;
}

float* reserve_scratch(Backend& be, DeviceBuffer& buf, int64_t n, const char* label) {
  if (buf.size() < n) buf = DeviceBuffer(be, n, label);
  return buf.data();
}

void AdamW::update(const EntryPart& e, const OptimStep& ctx) { adamw_part(be_, cfg_, e, e.state[0], e.state[1], ctx); }

std::unique_ptr<Optimizer> make_optimizer(Backend& backend, const TrainSpec& t) {
  if (t.mixed.active()) {  // muon, shampoo or soap on the matrices (parse_job allows no other)
    const std::vector<std::string>&ms = matrix_optimizer_names(), &fs = first_order_optimizer_names();
    EXA_CHECK(std::find(ms.begin(), ms.end(), t.optimizer) != ms.end() &&
                  std::find(fs.begin(), fs.end(), t.mixed.first_order()) != fs.end(),
              "train.optimizer = \"{}\" with [optimizer] others = \"{}\": a mixed order needs one of muon, shampoo, "
              "soap, kfac and a first-order one of adamw, lamb, sgd, lion, adafactor", t.optimizer, t.mixed.first_order());
    TrainSpec matrix = t, first = t;
    matrix.mixed = first.mixed = MixedSpec{};
    first.optimizer = t.mixed.first_order();
    return std::make_unique<MixedOrder>(backend, make_optimizer(backend, matrix), make_optimizer(backend, first),
                                        t.mixed.first_order_steps);
  }
  const float wd = float(t.weight_decay);
  const AdamWConfig adamw{float(t.beta1), float(t.beta2), float(t.eps), wd,
                          t.comm.adam_variance == "freeze" ? t.comm.warmup_steps : 0};
  if (t.optimizer == "adamw") return std::make_unique<AdamW>(backend, adamw);
  if (t.optimizer == "muon") {
    const MuonSpec& m = t.muon;
    return std::make_unique<Muon>(backend, MuonConfig{float(m.momentum), m.nesterov, m.ns_steps,
                                                      m.scale == "rms_match", adamw});
  }
  if (t.optimizer == "sgd") return std::make_unique<Sgd>(backend, SgdConfig{float(t.sgd.momentum), wd, t.sgd.nesterov});
  if (t.optimizer == "lion") return std::make_unique<Lion>(backend, LionConfig{float(t.lion.beta1), float(t.lion.beta2), wd});
  if (t.optimizer == "lamb") return std::make_unique<Lamb>(backend, adamw);
  if (t.optimizer == "adafactor") {
    const AdafactorSpec& a = t.adafactor;
    return std::make_unique<Adafactor>(backend, AdafactorConfig{float(a.beta1), float(a.decay_rate), float(a.eps1),
                                                                float(a.clip_threshold), wd, a.factored});
  }
  if (t.optimizer == "shampoo") {
    const ShampooSpec& h = t.shampoo;
    return std::make_unique<Shampoo>(backend, ShampooConfig{float(h.factor_decay), h.epsilon, h.max_preconditioner_dim,
                                                            h.precondition_frequency, h.start_preconditioning_step,
                                                            adamw});
  }
  if (t.optimizer == "soap") {
    const SoapSpec& h = t.soap;
    return std::make_unique<Soap>(backend, SoapConfig{float(h.factor_decay), h.max_preconditioner_dim,
                                                      h.precondition_frequency, adamw});
  }
  if (t.optimizer == "kfac") {
    const KfacSpec& k = t.kfac;
    return std::make_unique<Kfac>(backend, KfacConfig{float(k.momentum), k.nesterov, wd, float(k.damping),
                                                      float(k.factor_decay), k.factor_update_steps, k.inv_update_steps,
                                                      float(k.kl_clip), k.grad_worker_fraction});
  }
  EXA_FAIL("train.optimizer = \"{}\": expected one of adamw, sgd, lamb, lion, adafactor, muon, shampoo, soap, kfac",
           t.optimizer);
}

double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {
  if (warmup > 0 && step < warmup) return lr * double(step + 1) / double(warmup);
  if (total <= warmup) return lr;
  const double progress = std::min(1.0, double(step - warmup) / double(total - warmup));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace exatrain
