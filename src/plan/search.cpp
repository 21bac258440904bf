#include "plan/search.hpp"

#include "plan/compute.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <chrono>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "plan/memory.hpp"

namespace exatrain::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

template <class T>
std::vector<T> choices(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

struct Candidate {
  double step;
  Plan plan;
  double memory = 0;  // bytes per device: of two equally fast plans the leaner ranks first
  int64_t seq = 0;    // order of enumeration: breaks the remaining ties (a total order)
};

// "a ranks before b": faster; as fast and leaner; or as both and enumerated first. A total order,
// so the k kept are the same whatever k is (the winner of an exact tie does not depend on --top).
bool ranks_before(const Candidate& a, const Candidate& b) {
  if (a.step != b.step) return a.step < b.step;
  if (a.memory != b.memory) return a.memory < b.memory;
  return a.seq < b.seq;
}

// Keeps the k best candidates by ranks_before.
struct TopK {
  int k;
  int64_t offered = 0;
  std::vector<Candidate> heap;  // max-heap: the worst kept candidate in front
  // Returns the candidate as ranked (with its enumeration number), kept or not.
  Candidate offer(double step, double memory, const Plan& p) {
    Candidate c{step, p, memory, offered++};
    if (int(heap.size()) < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), ranks_before);
    } else if (ranks_before(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), ranks_before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), ranks_before);
    }
    return c;
  }
};

// The job's inputs that no candidate can repair, checked once before the search: the kernels it
// asks for on this device, the headroom, and a listed stage split's sum and length.
void check_search_inputs(const ModelSpec& m, const ParallelSpec& f, const TrainSpec& train, const Device& dev,
                         double headroom) {
  Plan kernels;
  kernels.set_kernels(train);
  kernels.precision = train.precision;
  if (const std::string e = kernel_problem(kernels, dev); !e.empty()) throw Error(e);
  EXA_CHECK(headroom >= 0 && headroom < 1, "memory headroom {} must be in [0, 1)", headroom);
  // A listed split that no candidate can use is the job's error, not "no plan found".
  if (!f.layers_per_stage.empty()) {
    const int64_t sum = std::accumulate(f.layers_per_stage.begin(), f.layers_per_stage.end(), int64_t(0));
    EXA_CHECK(sum == m.layers, "[parallel] layers_per_stage sums to {} but the model has layers = {}", sum,
              m.layers);
    if (f.pp && f.vp)
      EXA_CHECK(int64_t(f.layers_per_stage.size()) == *f.pp * *f.vp,
                "[parallel] layers_per_stage has {} entries, expected pp * vp = {} * {} = {} (one per "
                "virtual stage, stage s = chunk * pp + pp_rank)",
                f.layers_per_stage.size(), *f.pp, *f.vp, *f.pp * *f.vp);
  }
}

// vp candidates for `pp`: the file's layers_per_stage (pp * vp entries: it fixes vp; none when its
// length is not a multiple of pp or disagrees with a fixed vp), a fixed vp, else the divisors of
// the layers per rank (rounded up), each stage keeping >= 1 layer.
std::vector<int64_t> vp_candidates(const ModelSpec& m, const ParallelSpec& f, int64_t pp) {
  const std::vector<int64_t>& stages = f.layers_per_stage;
  if (!stages.empty()) {
    if (int64_t(stages.size()) % pp) return {};
    const int64_t vp = int64_t(stages.size()) / pp;
    if (f.vp && *f.vp != vp) return {};
    return {vp};
  }
  if (f.vp) return {*f.vp};
  std::vector<int64_t> vps;
  for (int64_t v : divisors((m.layers + pp - 1) / pp))
    if ((v == 1 || pp > 1) && pp * v <= m.layers) vps.push_back(v);
  return vps;
}

// The candidate before vp, schedule, recomputation, sequence parallelism and micro-batch.
// `run_here`: as this trainer runs it (as_run_here), for `train`'s own choice.
Plan base_plan(const ParallelSpec& f, const TrainSpec& train, int64_t tp, int64_t cp, int64_t pp, int64_t dp,
               int64_t zero, bool run_here) {
  Plan base;
  base.gpus = f.gpus; base.tp = tp; base.cp = cp; base.pp = pp; base.dp = dp; base.zero = zero;
  base.global_batch = f.global_batch; base.precision = train.precision;
  base.set_optimizer(train);  // its state, its ZeRO rule (plan_error) and its step cost
  base.set_kernels(train);
  // The job's framework behaviours, as no-ops where they have nothing to act on (plan_notes);
  // recompute_early_stop acts on the candidates with recompute = full. At ZeRO 0 there is no
  // parameter gather to overlap, so the search drops overlap_param_gather from those candidates
  // (`predict` refuses the pair: plan.cpp Rules::framework).
  base.set_framework(f);
  if (zero == 0) base.overlap_param_gather = false;
  if (!run_here) return base;
  // The job's recompute_early_stop stays: Purpose::train refuses it at recompute = full, so `train`
  // skips those candidates (resolve.cpp best_runnable) rather than run a plan its job refuses.
  Plan here = as_run_here(base);
  here.recompute_early_stop = base.recompute_early_stop;
  return here;
}

// One search: its inputs, the candidates kept and the counts.
struct Search {
  const ModelSpec& m;
  const MachineSpec& mach;
  const Device dev;
  const Calibration& cal;
  const ParallelSpec& f;
  bool prune;
  double capacity;  // bytes a plan may use
  SearchResult res;
  TopK top;
  std::map<std::array<int64_t, 4>, Candidate> best_per_layout;

  // Every vp, schedule, recomputation, sequence parallelism and micro-batch of `base`'s layout.
  void layout(const Plan& base, const std::vector<int64_t>& vps) {
    const std::vector<int64_t> mbs = choices(f.micro_batch, divisors(f.global_batch / base.dp));
    // seq_parallel = true at tp = 1 is a no-op (resolve_plan): plan it as false there.
    const std::vector<bool> sps = base.tp == 1                                 ? std::vector<bool>{false}
                                  : f.seq_parallel                             ? std::vector<bool>{*f.seq_parallel}
                                  : base.tp_comm_overlap != TpCommOverlap::none ? std::vector<bool>{true}
                                                                               : std::vector<bool>{false, true};
    const std::vector<Recompute> recomputes =
        choices(f.recompute, {Recompute::none, Recompute::selective, Recompute::full});
    for (int64_t vp : vps) {
      // Per vp: the default split (so the end ranks' layers) may differ between vps.
      bool static_fits = true;
      if (prune) {
        Plan lower = base;
        lower.micro_batch = mbs.front();
        lower.vp = vp;
        static_fits = plan_error(m, lower).empty() ? static_memory_lower_bound(m, lower) <= capacity : true;
      }
      const std::vector<Schedule> scheds =
          f.schedule ? std::vector<Schedule>{*f.schedule}
          : (vp > 1 || base.pp == 1) ? std::vector<Schedule>{Schedule::one_f_one_b}
                                     : std::vector<Schedule>{Schedule::gpipe, Schedule::one_f_one_b};
      for (Schedule sched : scheds)
        for (Recompute rc : recomputes)
          for (bool sp : sps) {
            Plan p = base;
            p.vp = vp; p.schedule = sched; p.recompute = rc; p.seq_parallel = sp;
            micro_batches(p, mbs, static_fits);
          }
    }
  }

  // The micro-batches of `p`, smallest first: once one overflows the memory, the larger ones are
  // pruned (memory grows with micro_batch).
  void micro_batches(Plan p, const std::vector<int64_t>& mbs, bool static_fits) {
    bool mb_overflow = false;
    for (int64_t mb : mbs) {
      p.micro_batch = mb;
      if (!plan_error(m, p).empty()) continue;
      ++res.searched;
      if (prune && (!static_fits || mb_overflow)) continue;
      ++res.evaluated;
      Memory mem = memory_per_device(m, p, dev, cal.fragmentation, cal.fragmentation_at_capacity);
      if (mem.total > capacity) {
        mb_overflow = true;
        continue;
      }
      ++res.feasible;
      Prediction pr = predict_checked(m, mach, dev, p, mem, cal);
      const Candidate c = top.offer(pr.step_time_s, mem.total, p);
      std::array<int64_t, 4> key{p.tp, p.pp, p.dp, p.cp};
      auto it = best_per_layout.find(key);
      if (it == best_per_layout.end()) best_per_layout.emplace(key, c);
      else if (ranks_before(c, it->second)) it->second = c;
    }
  }

  // The kept candidates, best first, and the best plan of another (tp, pp, dp, cp) layout.
  void finish() {
    std::sort(top.heap.begin(), top.heap.end(), ranks_before);
    for (const Candidate& c : top.heap) res.top.push_back(predict(m, mach, c.plan, cal));
    if (res.top.empty()) return;
    const Plan& w = res.top.front().plan;
    const Candidate* other = nullptr;
    for (const auto& [key, c] : best_per_layout)
      if (key != std::array<int64_t, 4>{w.tp, w.pp, w.dp, w.cp} && (!other || ranks_before(c, *other))) other = &c;
    if (other) res.best_other_layout = predict(m, mach, other->plan, cal);
  }
};

SearchResult run_search(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& f,
                        const TrainSpec& train, int top_k, const Calibration& cal, bool prune,
                        double headroom, bool run_here = false) {
  auto start = std::chrono::steady_clock::now();
  const Device dev = cal.tuned(find_device(mach.device));
  check_search_inputs(m, f, train, dev, headroom);
  // A plan must leave `headroom` of the device free: the memory model's error (docs/planner.md)
  // is a few GiB either way, and a plan right at the limit is an out-of-memory run in waiting.
  Search s{m, mach, dev, cal, f, prune, dev.hbm_gib * double(1 << 30) * (1 - headroom), {}, TopK{std::max(1, top_k), 0, {}}, {}};
  const int64_t G = f.gpus, B = f.global_batch;
  for (int64_t tp : choices(f.tp, divisors(G))) {
    if (G % tp || m.heads % tp || m.ffn_hidden % tp) continue;
    if (m.kv_heads % tp && tp % m.kv_heads) continue;
    for (int64_t cp : choices(f.cp, divisors(G / tp))) {
      if ((G / tp) % cp || (cp > 1 && m.seq_len % (2 * cp))) continue;
      for (int64_t pp : choices(f.pp, divisors(G / (tp * cp)))) {
        if ((G / (tp * cp)) % pp || pp > m.layers) continue;
        const int64_t dp = G / (tp * cp * pp);
        if ((f.dp && *f.dp != dp) || B % dp) continue;
        const std::vector<int64_t> vps = vp_candidates(m, f, pp);
        if (vps.empty()) continue;
        for (int64_t zero : choices<int64_t>(f.zero, {0, 1, 2, 3})) {
          if (zero > 0 && dp * cp == 1) continue;  // nothing to shard: same as zero 0
          s.layout(base_plan(f, train, tp, cp, pp, dp, zero, run_here), vps);
        }
      }
    }
  }
  s.finish();
  s.res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s.res;
}

}  // namespace

namespace {
TrainSpec adamw_at(Precision precision) {
  TrainSpec t;  // optimizer "adamw"
  t.precision = precision;
  return t;
}
}  // namespace

SearchResult search_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& f,
                          Precision precision, int top_k, const Calibration& cal,
                          double memory_headroom) {
  return run_search(m, mach, f, adamw_at(precision), top_k, cal, true, memory_headroom);
}

SearchResult search_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& f,
                          const TrainSpec& train, int top_k, const Calibration& cal,
                          double memory_headroom) {
  return run_search(m, mach, f, train, top_k, cal, true, memory_headroom);
}

SearchResult search_runnable_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& f,
                                   const TrainSpec& train, int top_k) {
  return run_search(m, mach, f, train, top_k, default_calibration(), true, 0, /*run_here=*/true);
}

SearchResult brute_force_search(const ModelSpec& m, const MachineSpec& mach,
                                const ParallelSpec& f, Precision precision, int top_k,
                                const Calibration& cal, double memory_headroom) {
  return run_search(m, mach, f, adamw_at(precision), top_k, cal, false, memory_headroom);
}

std::vector<OptimizerSearch> compare_optimizers(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& f,
                                                const TrainSpec& train, const std::vector<std::string>& optimizers,
                                                int top_k, const Calibration& cal, double memory_headroom) {
  std::vector<OptimizerSearch> out;
  for (const std::string& o : optimizers) {
    TrainSpec t = train;
    t.optimizer = o;
    // A mixed order ([optimizer] others, first_order_steps) is a matrix optimizer's: the first-order
    // rows are the optimizer alone.
    const std::vector<std::string>& matrix = matrix_optimizer_names();
    if (std::find(matrix.begin(), matrix.end(), o) == matrix.end()) t.mixed = MixedSpec{};
    out.push_back({o, search_plans(m, mach, f, t, top_k, cal, memory_headroom)});
  }
  return out;
}

std::string explain_choice(const Prediction& a, const Prediction& b) {
  std::string s;
  double gain = b.step_time_s / a.step_time_s - 1;
  s += fmt::format("best   : {}\nagainst: {}\n", plan_summary(a.plan), plan_summary(b.plan));
  s += fmt::format("the best plan is {:.2f}% faster ({:.4g} s vs {:.4g} s per step)", 100 * gain,
                   a.step_time_s, b.step_time_s);
  const Breakdown &x = a.breakdown, &y = b.breakdown;
  struct Part { const char* name; double d; };
  std::vector<Part> parts = {{"compute", y.compute - x.compute},   {"tp_comm", y.tp_comm - x.tp_comm},
                             {"cp_comm", y.cp_comm - x.cp_comm},   {"pp_comm", y.pp_comm - x.pp_comm},
                             {"pp_bubble", y.pp_bubble - x.pp_bubble},
                             {"dp_comm", y.dp_comm - x.dp_comm},   {"optimizer", y.optimizer - x.optimizer}};
  std::sort(parts.begin(), parts.end(),
            [](const Part& p, const Part& q) { return std::fabs(p.d) > std::fabs(q.d); });
  s += ". Runner-up minus best, largest first:";
  int shown = 0;
  for (const Part& p : parts) {
    if (shown == 4 || std::fabs(p.d) < 1e-6 * a.step_time_s) break;
    s += fmt::format("{} {} {:+.4g} s", shown ? "," : "", p.name, p.d);
    ++shown;
  }
  if (!shown) s += " no measurable difference (a tie)";
  // Name the fields that differ, so the reader sees which choice bought the gain.
  std::string fields;
  auto diff = [&](const char* name, auto x, auto y) {
    if (x != y) fields += fmt::format("{}{} {} vs {}", fields.empty() ? "" : ", ", name, x, y);
  };
  diff("tp", a.plan.tp, b.plan.tp);
  diff("pp", a.plan.pp, b.plan.pp);
  diff("dp", a.plan.dp, b.plan.dp);
  diff("cp", a.plan.cp, b.plan.cp);
  diff("vp", a.plan.vp, b.plan.vp);
  diff("zero", a.plan.zero, b.plan.zero);
  diff("micro_batch", a.plan.micro_batch, b.plan.micro_batch);
  diff("recompute", std::string(to_string(a.plan.recompute)), std::string(to_string(b.plan.recompute)));
  diff("seq_parallel", a.plan.seq_parallel, b.plan.seq_parallel);
  diff("schedule", std::string(to_string(a.plan.schedule)), std::string(to_string(b.plan.schedule)));
  if (!fields.empty()) s += fmt::format(".\nit differs in: {}", fields);
  s += fmt::format(".\nmemory per GPU: {:.1f} GiB vs {:.1f} GiB\n", a.memory.total / double(1 << 30),
                   b.memory.total / double(1 << 30));
  return s;
}

}  // namespace exatrain::plan
