#include "dist_common.hpp"

#include <mpi.h>
#include <omp.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "plan/resolve.hpp"
#include "train/checkpoint_io.hpp"
#include "train/every_rank.hpp"
#include "train/trainer.hpp"

namespace dist_test {

World start_mpi(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "MPI provides thread level %d, below MPI_THREAD_FUNNELED\n", provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  World w;
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  omp_set_num_threads(1);
  return w;
}

using namespace exatrain;

std::unique_ptr<Backend> test_backend(int argc, char** argv) {
  std::string name = "cpu";
  for (int i = 1; i + 1 < argc; i++)
    if (std::string(argv[i]) == "--backend") name = argv[i + 1];
  return make_backend(name, 1);
}

std::vector<float> host_params(const Gpt& model) {
  std::vector<float> host(size_t(model.num_params()));
  model.backend().download(host.data(), const_cast<Gpt&>(model).params(), host.size() * sizeof(float));
  return host;
}

static int32_t token_at(uint64_t seq, int64_t i, int64_t vocab) {
  uint64_t x = seq * 0x9E3779B97F4A7C15ull + uint64_t(i) * 0xBF58476D1CE4E5B9ull + 12345;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return int32_t(x % uint64_t(vocab));
}

void SyntheticSource::next_batch(int64_t B, int64_t T, int32_t* inputs, int32_t* targets) {
  for (int64_t b = 0; b < B; b++) {
    const uint64_t seq = pos_ + uint64_t(dp_rank_ * B + b);
    for (int64_t t = 0; t < T; t++) {
      inputs[b * T + t] = token_at(seq, t, vocab_);
      targets[b * T + t] = token_at(seq, t + 1, vocab_);
    }
  }
  pos_ += uint64_t(B * dp_size_);
}

void val_batch(int64_t vocab, int64_t i, int64_t B, int64_t T, int32_t* inputs, int32_t* targets) {
  for (int64_t b = 0; b < B; b++) {
    const uint64_t seq = 1000000000ull + uint64_t(i * B + b);
    for (int64_t t = 0; t < T; t++) {
      inputs[b * T + t] = token_at(seq, t, vocab);
      targets[b * T + t] = token_at(seq, t + 1, vocab);
    }
  }
}

std::string Config::name() const {
  return fmt::format("dp{} tp{}{} pp{} vp{} {} zero{} recompute={} B={} m={}{}{}", dp, tp, sp ? "+sp" : "", pp, vp,
                     schedule == Schedule::gpipe ? "gpipe" : "1f1b", zero, to_string(recompute), micro_batch,
                     micro_batches, std::string(llama ? " llama" : untied ? " untied" : "") + (nobias ? " nobias" : ""),
                     layers_per_stage.empty() ? "" : fmt::format(" layers_per_stage {}", fmt::join(layers_per_stage, ",")));
}

ModelSpec tiny_model(bool llama) {
  ModelSpec m;
  m.layers = 4;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 2;  // grouped-query attention
  m.ffn_hidden = 64;
  m.seq_len = 16;
  m.vocab = 67;  // odd: the tp=2 vocabulary slices differ in size (34 + 33)
  if (llama) {
    m.activation = Activation::swiglu;
    m.norm = Norm::rmsnorm;
    m.position = Position::rope;
    m.tie_embeddings = false;
  }
  return m;
}

Job job_for(const Config& c, int steps) {
  Job j;
  j.source = "dist-test";
  j.model = tiny_model(c.llama);
  if (c.untied) j.model.tie_embeddings = false;
  if (c.nobias) j.model.bias = false;
  ParallelSpec& p = j.parallel;
  p.gpus = c.dp * c.tp * c.pp;
  p.tp = c.tp, p.pp = c.pp, p.dp = c.dp, p.cp = 1, p.vp = c.vp, p.zero = c.zero;
  p.micro_batch = c.micro_batch;
  p.global_batch = c.micro_batch * c.micro_batches * c.dp;
  p.recompute = c.recompute;
  p.seq_parallel = c.sp;
  p.schedule = c.schedule;
  p.layers_per_stage = c.layers_per_stage;
  j.train.steps = steps;
  j.train.lr = 3e-3;
  j.train.warmup_steps = 2;
  j.train.min_lr = 3e-4;
  j.train.seed = 77;
  j.train.grad_clip = 1.0;
  return j;
}

DistRun make_run(Backend& backend, const Job& job, const std::function<void(TrainerOptions&)>& tweak) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  DistRun r;
  r.job = job;
  const plan::Plan plan = plan::plan_from_job(job, world);
  parallel::RuntimeOptions ro;
  ro.watchdog_timeout_s = 60;  // a hang is reported instead of hitting the ctest timeout
  r.rt = std::make_unique<parallel::ParallelRuntime>(
      MPI_COMM_WORLD, parallel::MeshShape{int(plan.tp), int(plan.cp), int(plan.dp), int(plan.pp)}, backend, ro);
  r.src = std::make_unique<SyntheticSource>(job.model.vocab, r.rt->dp().rank(), r.rt->dp().size());
  TrainerOptions o = trainer_options(job, plan);
  o.skip_nonfinite = false;
  o.peak_gflops = 1;  // no sgemm measurement
  if (tweak) tweak(o);
  r.trainer = std::make_unique<Trainer>(backend, *r.rt, o, *r.src);
  return r;
}

TrainerOptions single_rank_options(const Job& job) {
  Job one = job;
  ParallelSpec& p = one.parallel;  // the same model and batch on one rank
  p.gpus = 1, p.tp = p.pp = p.dp = p.cp = p.vp = 1, p.zero = 0, p.seq_parallel = false, p.layers_per_stage.clear();
  p.schedule = Schedule::one_f_one_b;
  TrainerOptions o = trainer_options(one, plan::plan_from_job(one, 1));
  o.peak_gflops = 1;  // no sgemm measurement
  return o;
}

Reference run_single_rank(const Job& job, int64_t inject_nan_at_step, bool skip, const std::string& backend_name) {
  auto backend = make_backend(backend_name, 1);
  TrainerOptions o = single_rank_options(job);
  o.inject_nan_at_step = inject_nan_at_step;
  o.skip_nonfinite = skip;
  SyntheticSource src(job.model.vocab, 0, 1);
  auto rt = parallel::ParallelRuntime::local(*backend);
  Trainer trainer(*backend, *rt, o, src);
  Reference r;
  for (int64_t s = 0; s < job.train.steps; s++) {
    const StepMetrics m = trainer.train_step();
    r.losses.push_back(m.skipped ? std::nan("") : m.loss);
  }
  // The single-rank evaluate(): mean forward loss over the validation batches, the model driven
  // directly (mixed precision: GradSync::apply left its 16-bit copy current after the last step).
  const int64_t B = o.plan.micro_batch, T = job.model.seq_len;
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (int64_t i = 0; i < kValBatches; i++) {
    val_batch(job.model.vocab, i, B, T, tok.data(), tgt.data());
    r.val_loss += trainer.model().forward(tok.data(), nullptr, tgt.data()) / double(kValBatches);
  }
  r.layout = trainer.model().layout();
  r.params = host_params(trainer.model());
  return r;
}

bool all_ok(bool ok) {
  int mine = ok, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

int64_t dp_gradient_bytes(const std::map<std::string, int64_t>& bytes) {
  int64_t b = 0;
  for (const auto& [kind, n] : bytes)
    if (kind.rfind("dp_", 0) == 0 && kind != "dp_all_gather" && kind.rfind("dp_kfac_", 0) != 0) b += n;
  return b;
}

int64_t resident_bytes(const void* p, int64_t bytes) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = uintptr_t(p) / page * page, hi = (uintptr_t(p) + uintptr_t(bytes) + page - 1) / page * page;
  std::vector<unsigned char> in((hi - lo) / page);
  EXA_SYSCHECK(mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()) == 0, "mincore");
  int64_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * int64_t(page);
}

// Calls visit(p, local value, reference value) for every element of the model shard's entry p,
// paired with the matching element of the single-rank reference (tp slices mapped to global).
template <class Visit>
static void visit_slices(const Gpt& model, const Reference& ref, Visit visit) {
  const std::vector<float> host = host_params(model);
  const float* local = host.data();
  for (const ParamInfo& p : model.layout().entries()) {
    const ParamInfo& q = ref.layout.find(p.name);
    const int64_t rows = p.shard_shape.size() == 2 ? p.shard_shape[0] : 1;
    const int64_t cols = p.shard_shape.back();
    const int64_t gcols = q.global_shape.back();
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) {
        int64_t gi = i, gj = j;
        if (p.split_dim == 0 && p.shard_shape.size() == 2) gi += p.shard_start;
        if (p.split_dim == 0 && p.shard_shape.size() == 1) gj += p.shard_start;
        if (p.split_dim == 1) gj += p.shard_start;
        visit(p, double(local[p.offset + i * cols + j]), double(ref.params[size_t(q.offset + gi * gcols + gj)]));
      }
  }
}

double rel_diff(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return std::numeric_limits<double>::infinity();
  return b != 0 ? std::abs(a - b) / std::abs(b) : std::abs(a - b);
}

double worst_of(double worst, double x) {
  if (std::isnan(worst) || std::isnan(x)) return std::numeric_limits<double>::infinity();
  return std::max(worst, x);
}

// +inf for NaN and inf: a ratio of sums that overflowed or met a NaN fails every tolerance.
static double finite_or_inf(double x) { return std::isfinite(x) ? x : std::numeric_limits<double>::infinity(); }

double max_weight_diff(const Gpt& model, const Reference& ref) {
  double worst = 0;
  visit_slices(model, ref, [&](const ParamInfo&, double a, double b) {
    worst = worst_of(worst, finite_or_inf(std::abs(a - b) / (1 + std::abs(b))));
  });
  return worst;
}

WeightErrors weight_errors(const Gpt& model, const Reference& ref) {
  struct Sums {
    double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  };
  std::map<std::string, Sums> per;
  visit_slices(model, ref, [&](const ParamInfo& p, double a, double b) {
    Sums& s = per[p.name];
    s.diff2 += (a - b) * (a - b), s.ref2 += b * b;
    s.max_diff = worst_of(s.max_diff, std::abs(a - b)), s.max_ref = worst_of(s.max_ref, std::abs(b));
  });
  double model_max_ref = 0;
  for (const float w : ref.params) model_max_ref = worst_of(model_max_ref, double(std::abs(w)));
  const bool rope = model.options().model.position == Position::rope;
  WeightErrors w;
  for (const auto& [name, s] : per) {
    if (!rope && name.ends_with("attn.k_proj.bias")) {
      // Its exact gradient is 0: q . (k + b) adds the same q . b to every score of a query's row,
      // and softmax ignores that. Its values are AdamW's normalisation of rounding noise, in any
      // implementation and summation order: compared on the model's scale.
      w.zero_grad_rel = worst_of(w.zero_grad_rel, finite_or_inf(s.max_diff / model_max_ref));
      continue;
    }
    const double norm = finite_or_inf(s.ref2 > 0 ? std::sqrt(s.diff2 / s.ref2) : std::sqrt(s.diff2));
    const double max = finite_or_inf(s.max_ref > 0 ? s.max_diff / s.max_ref : s.max_diff);
    if (norm > w.norm_rel) w.norm_rel = norm, w.norm_tensor = name;
    if (max > w.max_rel) w.max_rel = max, w.max_tensor = name;
  }
  return w;
}

std::string nan_comparison_problems(Gpt& model, const Reference& ref) {
  const double nan = std::nan("");
  std::string problems;
  if (!(rel_diff(nan, 3.0) > 1e-5) || !(rel_diff(3.0, nan) > 1e-5)) problems += " rel_diff passes a NaN loss;";
  if (!(worst_of(0.0, nan) > 1e-5) || !(worst_of(nan, 0.0) > 1e-5)) problems += " worst_of drops a NaN;";
  // One weight of the first tensor this rank holds turned into NaN, as a diverged run would have.
  float* p = model.params() + model.layout().entries().front().offset;
  Backend& be = model.backend();
  float saved = 0;
  be.download(&saved, p, sizeof(float));
  const float bad = std::numeric_limits<float>::quiet_NaN();
  be.upload(p, &bad, sizeof(float));
  const WeightErrors e = weight_errors(model, ref);
  if (!(e.norm_rel > 1e-5) || !(e.max_rel > 1e-5)) problems += fmt::format(" weight_errors passes a NaN weight ({}, {});", e.norm_rel, e.max_rel);
  if (!(max_weight_diff(model, ref) > 1e-4)) problems += " max_weight_diff passes a NaN weight;";
  be.upload(p, &saved, sizeof(float));
  return problems;
}

SavedRun run_saving_at(Backend& be, const Job& job, int steps, int save_at, const std::string& dir) {
  SavedRun out{make_run(be, job), {}, {}};
  for (int s = 0; s < steps; s++) {
    if (s == save_at) {
      TrainerExtras ex;
      ex.data_cursor_json = fmt::format("{{\"position\": {}}}", out.run.src->position());
      out.checkpoint = save_checkpoint(*out.run.trainer, MPI_COMM_WORLD, dir, ex, 2);
      broadcast_from_rank0(out.checkpoint, MPI_COMM_WORLD, nullptr, "MPI_Bcast (test checkpoint)");
    }
    out.losses.push_back(out.run.trainer->train_step().loss);
  }
  return out;
}

DistRun resumed_run(Backend& be, const Job& job, const std::string& checkpoint) {
  DistRun r = make_run(be, job);
  const TrainerExtras ex = load_checkpoint(*r.trainer, MPI_COMM_WORLD, checkpoint);
  r.src->seek(std::stoull(ex.data_cursor_json.substr(ex.data_cursor_json.find(':') + 1)));
  return r;
}

double worst_over_ranks(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); i++) worst = worst_of(worst, rel_diff(a[i], b[i]));
  double out = 0;
  MPI_Allreduce(&worst, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

std::string shared_temp_dir(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string root;
  if (rank == 0) {
    std::string tmpl = fmt::format("/tmp/exatrain-{}-XXXXXX", name);
    EXA_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp({}) failed", tmpl);
    root = tmpl;
  }
  broadcast_from_rank0(root, MPI_COMM_WORLD, nullptr, "MPI_Bcast (test directory)");
  return root;
}

std::string refusal(Backend& backend, const Job& job) {
  try {
    make_run(backend, job);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int report(bool ok, const std::string& line, int rank) {
  if (rank == 0) std::printf("%s %s\n", ok ? "OK  " : "FAIL", line.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace dist_test
