// Job-file parsing: TOML (toml11) -> layered key/value sections -> typed, validated Job.
// See parse.hpp for the precedence rules. All problems are collected, then reported at once.
#include "job/parse.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <toml.hpp>

#include "core/check.hpp"
#include "core/paths.hpp"

namespace exatrain {
namespace {

// One key's value and where it came from ("job.toml", "models/gpt2.toml", "--set").
struct Entry {
  toml::value value;
  std::string origin;
  std::string set_text;  // origin "--set": the override as given ("model.heads=5")
};

std::string show(const toml::value& v) {
  std::ostringstream os;
  if (v.is_string()) os << '"' << v.as_string().str << '"';
  else os << toml::format(v);
  std::string s = os.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A section's keys with their origins, and typed getters that record what was read so that the
// remaining keys can be reported as unknown.
class Section {
 public:
  Section(std::string name, std::vector<std::string>& errors) : name_(std::move(name)), errors_(errors) {}

  void put(const std::string& key, const toml::value& v, const std::string& origin,
           const std::string& set_text = "") {
    entries_[key] = Entry{v, origin, set_text};
  }
  // Every key's origin: the file or preset it came from, or "--set section.key=value".
  void record_origins(std::map<std::string, std::string>& out) const {
    for (const auto& [key, e] : entries_)
      out[name_ + "." + key] = e.set_text.empty() ? e.origin : "--set " + e.set_text;
  }
  bool has(const std::string& key) const { return entries_.count(key) > 0; }
  const std::string& name() const { return name_; }

  // Reports a problem with a key's value: "<origin>: [section] key = value: <what was expected>".
  void bad(const std::string& key, const std::string& expected) {
    const Entry& e = entries_.at(key);
    errors_.push_back(fmt::format("{}: [{}] {} = {}: expected {}", e.origin, name_, key,
                                  show(e.value), expected));
  }

  // Getters: leave `out` untouched when the key is absent; record an error on a bad value.
  void get_int(const std::string& key, int64_t& out, int64_t lo, int64_t hi) {
    const toml::value* v = take(key);
    if (!v) return;
    if (!v->is_integer()) return bad(key, fmt::format("an integer in [{}, {}]", lo, hi));
    int64_t x = v->as_integer();
    if (x < lo || x > hi) return bad(key, fmt::format("an integer in [{}, {}]", lo, hi));
    out = x;
  }
  void get_uint(const std::string& key, uint64_t& out) {
    int64_t x = static_cast<int64_t>(out);
    get_int(key, x, 0, INT64_MAX);
    out = static_cast<uint64_t>(x);
  }
  void get_float(const std::string& key, double& out, double lo, double hi) {
    const toml::value* v = take(key);
    if (!v) return;
    double x;
    if (v->is_floating()) x = v->as_floating();
    else if (v->is_integer()) x = static_cast<double>(v->as_integer());
    else return bad(key, fmt::format("a number in [{}, {}]", lo, hi));
    if (!(x >= lo && x <= hi)) return bad(key, fmt::format("a number in [{}, {}]", lo, hi));
    out = x;
  }
  void get_opt_float(const std::string& key, std::optional<double>& out, double lo, double hi) {
    if (!has(key)) return;
    double x = 0;
    size_t before = errors_.size();
    get_float(key, x, lo, hi);
    if (errors_.size() == before) out = x;
  }
  void get_bool(const std::string& key, bool& out) {
    const toml::value* v = take(key);
    if (!v) return;
    if (!v->is_boolean()) return bad(key, "true or false");
    out = v->as_boolean();
  }
  void get_string(const std::string& key, std::string& out) {
    const toml::value* v = take(key);
    if (!v) return;
    if (!v->is_string()) return bad(key, "a string");
    out = v->as_string().str;
  }
  // One of `names`; returns the index or -1 (absent or bad).
  int get_choice(const std::string& key, const std::vector<std::string>& names) {
    const toml::value* v = take(key);
    if (!v) return -1;
    std::string want = "one of";
    for (auto& n : names) want += " \"" + n + "\"";
    if (!v->is_string()) return bad(key, want), -1;
    auto it = std::find(names.begin(), names.end(), v->as_string().str);
    if (it == names.end()) return bad(key, want), -1;
    return static_cast<int>(it - names.begin());
  }
  // An integer in [lo, hi] or "auto" (-> nullopt). Absent -> nullopt.
  void get_int_or_auto(const std::string& key, std::optional<int64_t>& out, int64_t lo, int64_t hi) {
    const toml::value* v = take(key);
    if (!v) return;
    if (v->is_string() && v->as_string().str == "auto") return out.reset();
    if (!v->is_integer() || v->as_integer() < lo || v->as_integer() > hi)
      return bad(key, fmt::format("an integer in [{}, {}] or \"auto\"", lo, hi));
    out = v->as_integer();
  }
  void get_bool_or_auto(const std::string& key, std::optional<bool>& out) {
    const toml::value* v = take(key);
    if (!v) return;
    if (v->is_string() && v->as_string().str == "auto") return out.reset();
    if (!v->is_boolean()) return bad(key, "true, false or \"auto\"");
    out = v->as_boolean();
  }
  void get_int_list(const std::string& key, std::vector<int64_t>& out, int64_t lo) {
    const toml::value* v = take(key);
    if (!v) return;
    std::string want = fmt::format("an array of integers >= {}", lo);
    if (!v->is_array()) return bad(key, want);
    std::vector<int64_t> xs;
    for (const auto& x : v->as_array()) {
      if (!x.is_integer() || x.as_integer() < lo) return bad(key, want);
      xs.push_back(x.as_integer());
    }
    out = xs;
  }

  // Every key that no getter asked for is a mistake: report it with the known keys.
  void report_unknown(const std::vector<std::string>& known) {
    for (const auto& [key, e] : entries_) {
      if (read_.count(key)) continue;
      std::string hint;
      size_t best = 3;
      for (const auto& k : known) {
        size_t d = edit_distance(key, k);
        if (d < best) best = d, hint = fmt::format(" (did you mean \"{}\"?)", k);
      }
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      errors_.push_back(fmt::format("{}: [{}] unknown key \"{}\"{}; known keys: {}", e.origin,
                                    name_, key, hint, list));
    }
  }

 private:
  const toml::value* take(const std::string& key) {
    read_.insert(key);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second.value;
  }

  std::string name_;
  std::vector<std::string>& errors_;
  std::map<std::string, Entry> entries_;
  std::set<std::string> read_;
};

toml::value parse_toml_text(const std::string& text, const std::string& source) {
  std::istringstream is(text);
  try {
    return toml::parse(is, source);
  } catch (const std::exception& e) {
    EXA_FAIL("{}: not valid TOML: {}", source, e.what());
  }
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  EXA_CHECK(f.good(), "cannot open {} '{}'", what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Copies a preset's section (models/NAME.toml [model], catalog/clusters/NAME.toml [machine]).
void apply_preset(Section& sec, const std::string& dir, const std::string& origin_of_key,
                  std::vector<std::string>& errors) {
  // The preset key itself was put by the caller; read it here.
  std::string name;
  sec.get_string("preset", name);
  if (name.empty()) return;
  std::string rel = fmt::format("{}/{}.toml", dir, name);
  std::string path = fmt::format("{}/{}", data_root(), rel);
  std::ifstream probe(path);
  if (!probe.good()) {
    errors.push_back(fmt::format("{}: [{}] preset = \"{}\": expected the name of a file {} (not found)",
                                 origin_of_key, sec.name(), name, rel));
    return;
  }
  toml::value root = parse_toml_text(read_file(path, "preset"), rel);
  if (!root.contains(sec.name()) || !root.at(sec.name()).is_table()) {
    errors.push_back(fmt::format("{}: expected a [{}] table", rel, sec.name()));
    return;
  }
  for (const auto& [key, v] : root.at(sec.name()).as_table())
    if (key != "preset") sec.put(key, v, rel);
}

// Splits "section.key=value" and parses value as TOML (falling back to a bare string).
void apply_set(std::map<std::string, Section>& sections, const std::string& set,
               std::vector<std::string>& errors) {
  auto eq = set.find('=');
  auto dot = set.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    errors.push_back(fmt::format("--set {}: expected section.key=value", set));
    return;
  }
  std::string section = set.substr(0, dot), key = set.substr(dot + 1, eq - dot - 1),
              raw = set.substr(eq + 1);
  auto it = sections.find(section);
  if (it == sections.end()) {
    errors.push_back(fmt::format("--set {}: unknown section [{}]; known: model, machine, parallel, train",
                                 set, section));
    return;
  }
  toml::value v;
  try {
    std::istringstream is("v = " + raw);
    v = toml::parse(is, "--set").at("v");
  } catch (const std::exception&) {
    v = toml::value(raw);  // bare word, e.g. --set model.activation=swiglu
  }
  it->second.put(key, v, "--set", set);
}

}  // namespace

Job parse_job(const std::string& text, const std::string& source, const std::vector<std::string>& sets,
              const JobCheck& extra) {
  toml::value root = parse_toml_text(text, source);
  EXA_CHECK(root.is_table(), "{}: expected a TOML document with tables", source);
  std::vector<std::string> errors;
  std::map<std::string, Section> sections;
  for (const char* s : {"model", "machine", "parallel", "train"}) sections.emplace(s, Section(s, errors));

  // A preset named by --set replaces the file's: it is applied first, like the file's would be.
  std::map<std::string, std::string> preset_sets;  // section -> the --set text
  std::vector<std::string> other_sets;
  for (const auto& s : sets) {
    bool is_preset = false;
    for (const char* sec : {"model", "machine"})
      if (s.rfind(std::string(sec) + ".preset=", 0) == 0) preset_sets[sec] = s, is_preset = true;
    if (!is_preset) other_sets.push_back(s);
  }
  for (const auto& [name, table] : root.as_table()) {
    if (!sections.count(name)) {
      errors.push_back(fmt::format("{}: unknown section [{}]; expected [model], [machine], [parallel], [train]",
                                   source, name));
      continue;
    }
    if (!table.is_table()) errors.push_back(fmt::format("{}: {} must be a table [{}]", source, name, name));
  }
  // No [machine] table and no machine preset: the job runs on this machine, so it is the `local`
  // cluster (catalog/clusters/local.toml), the one "auto" plans use too; a --set machine.KEY
  // overrides one of its keys, as it would a preset's. (A data root without the catalog keeps the
  // built-in defaults: one cpu-local device.)
  const bool machine_named = root.contains("machine") || preset_sets.count("machine") ||
                             !std::ifstream(fmt::format("{}/catalog/clusters/local.toml", data_root())).good();
  for (auto& [name, sec] : sections) {
    const toml::value* table = nullptr;
    if (root.contains(name) && root.at(name).is_table()) table = &root.at(name);
    // The preset goes in first so that the file's own keys (and --set) override it.
    if (preset_sets.count(name)) apply_set(sections, preset_sets[name], errors);
    else if (table && table->contains("preset")) sec.put("preset", table->at("preset"), source);
    else if (name == "machine" && !machine_named)
      sec.put("preset", toml::value("local"), fmt::format("{} (no [machine]: this machine)", source));
    if (sec.has("preset"))
      apply_preset(sec, name == "model" ? "models" : "catalog/clusters", preset_sets.count(name) ? "--set" : source,
                   errors);
    if (table)
      for (const auto& [key, v] : table->as_table())
        if (key != "preset") sec.put(key, v, source);
  }
  for (const auto& s : other_sets) apply_set(sections, s, errors);

  Job job;
  job.source = source;
  for (const auto& [name, sec] : sections) sec.record_origins(job.origins);

  // [model]
  {
    Section& s = sections.at("model");
    ModelSpec& m = job.model;
    s.get_string("preset", m.preset);
    const int64_t big = int64_t(1) << 40;
    s.get_int("layers", m.layers, 1, 100000);
    s.get_int("hidden", m.hidden, 1, big);
    s.get_int("heads", m.heads, 1, 100000);
    m.kv_heads = m.heads;
    s.get_int("kv_heads", m.kv_heads, 1, 100000);
    m.ffn_hidden = 4 * m.hidden;
    s.get_int("ffn_hidden", m.ffn_hidden, 1, big);
    s.get_int("seq_len", m.seq_len, 1, big);
    m.vocab_from_data = !s.has("vocab");
    s.get_int("vocab", m.vocab, 2, big);
    if (int i = s.get_choice("activation", {"gelu", "swiglu"}); i >= 0) m.activation = Activation(i);
    if (int i = s.get_choice("norm", {"layernorm", "rmsnorm"}); i >= 0) m.norm = Norm(i);
    if (int i = s.get_choice("position", {"learned", "rope"}); i >= 0) m.position = Position(i);
    s.get_bool("tie_embeddings", m.tie_embeddings);
    s.get_bool("bias", m.bias);
    s.get_float("norm_eps", m.norm_eps, 0, 1);
    s.get_float("rope_theta", m.rope_theta, 1, 1e12);
    // Shapes that cannot be built, with the equation, named by where their values came from.
    if (m.hidden % m.heads != 0)
      errors.push_back(fmt::format("{}: [model] hidden = {} is not divisible by heads = {} "
                                   "(head_dim = hidden / heads must be an integer)",
                                   job_origin(job, {"model.hidden", "model.heads"}), m.hidden, m.heads));
    if (m.heads % m.kv_heads != 0)
      errors.push_back(fmt::format("{}: [model] heads = {} is not divisible by kv_heads = {} "
                                   "(grouped-query attention shares each kv head among heads / kv_heads heads)",
                                   job_origin(job, {"model.heads", "model.kv_heads"}), m.heads, m.kv_heads));
    if (m.position == Position::rope && m.hidden % m.heads == 0 && (m.hidden / m.heads) % 2 != 0)
      errors.push_back(fmt::format("{}: [model] position = \"rope\" needs an even head_dim, but hidden / heads = "
                                   "{} / {} = {}", job_origin(job, {"model.position", "model.hidden", "model.heads"}), m.hidden,
                                   m.heads, m.hidden / m.heads));
    s.report_unknown({"preset", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
                      "activation", "norm", "position", "tie_embeddings", "bias", "norm_eps", "rope_theta"});
  }
  // [machine]
  {
    Section& s = sections.at("machine");
    MachineSpec& m = job.machine;
    s.get_string("preset", m.preset);
    s.get_string("device", m.device);
    s.get_int("gpus_per_node", m.gpus_per_node, 1, 1024);
    s.get_float("intra_node_bw_gbs", m.intra_node_bw_gbs, 0, 1e9);
    s.get_float("inter_node_bw_gbs", m.inter_node_bw_gbs, 0, 1e9);
    s.get_float("intra_node_latency_us", m.intra_node_latency_us, 0, 1e9);
    s.get_float("inter_node_latency_us", m.inter_node_latency_us, 0, 1e9);
    s.get_float("storage_bw_gbs", m.storage_bw_gbs, 0, 1e12);
    s.get_opt_float("node_mtbf_hours", m.node_mtbf_hours, 1e-6, 1e12);
    s.report_unknown({"preset", "device", "gpus_per_node", "intra_node_bw_gbs", "inter_node_bw_gbs",
                      "intra_node_latency_us", "inter_node_latency_us", "storage_bw_gbs", "node_mtbf_hours"});
  }
  // [parallel]
  {
    Section& s = sections.at("parallel");
    ParallelSpec& p = job.parallel;
    const int64_t big = int64_t(1) << 40;
    s.get_int("gpus", p.gpus, 1, big);
    s.get_int_or_auto("tp", p.tp, 1, 1 << 20);
    s.get_int_or_auto("pp", p.pp, 1, 1 << 20);
    s.get_int_or_auto("dp", p.dp, 1, big);
    s.get_int_or_auto("cp", p.cp, 1, 1 << 20);
    s.get_int_or_auto("vp", p.vp, 1, 1 << 20);
    s.get_int_or_auto("zero", p.zero, 0, 3);
    s.get_int_or_auto("micro_batch", p.micro_batch, 1, big);
    s.get_int("global_batch", p.global_batch, 1, big);
    if (s.has("recompute")) {
      int i = s.get_choice("recompute", {"none", "selective", "full", "auto"});
      if (i >= 0 && i < 3) p.recompute = Recompute(i);
    }
    s.get_bool_or_auto("seq_parallel", p.seq_parallel);
    if (s.has("schedule")) {
      int i = s.get_choice("schedule", {"gpipe", "1f1b", "auto"});
      if (i >= 0 && i < 2) p.schedule = Schedule(i);
    }
    s.get_int_list("layers_per_stage", p.layers_per_stage, 0);
    s.get_float("watchdog_timeout_s", p.watchdog_timeout_s, 0, 1e9);
    s.report_unknown({"gpus", "tp", "pp", "dp", "cp", "vp", "zero", "micro_batch", "global_batch",
                      "recompute", "seq_parallel", "schedule", "layers_per_stage", "watchdog_timeout_s"});
  }
  // [train]
  {
    Section& s = sections.at("train");
    TrainSpec& t = job.train;
    if (int i = s.get_choice("precision", {"fp32", "fp16", "bf16", "fp8"}); i >= 0) t.precision = Precision(i);
    if (s.get_choice("optimizer", {"adamw"}) == 0) t.optimizer = "adamw";
    s.get_int("steps", t.steps, 0, int64_t(1) << 40);
    s.get_uint("seed", t.seed);
    s.get_float("lr", t.lr, 0, 10);
    s.get_float("min_lr", t.min_lr, 0, 10);
    s.get_int("warmup_steps", t.warmup_steps, 0, int64_t(1) << 40);
    s.get_float("weight_decay", t.weight_decay, 0, 10);
    s.get_float("beta1", t.beta1, 0, 0.999999);
    s.get_float("beta2", t.beta2, 0, 0.999999999);
    s.get_float("eps", t.eps, 0, 1);
    s.get_float("grad_clip", t.grad_clip, 0, 1e12);
    s.get_string("data", t.data);
    s.get_string("run_dir", t.run_dir);
    s.get_int("checkpoint_every", t.checkpoint_every, 0, int64_t(1) << 40);
    s.get_int("keep_checkpoints", t.keep_checkpoints, 1, 1000000);
    s.get_int("eval_every", t.eval_every, 0, int64_t(1) << 40);
    s.get_int("eval_batches", t.eval_batches, 1, 1000000);
    s.get_int("log_every", t.log_every, 1, int64_t(1) << 40);
    s.get_int("threads", t.threads, 0, 4096);
    if (int i = s.get_choice("nan_policy", {"stop", "skip"}); i >= 0) t.nan_policy = i == 0 ? "stop" : "skip";
    if (int i = s.get_choice("backend", {"cpu", "cpu-guarded"}); i >= 0) t.backend = i == 0 ? "cpu" : "cpu-guarded";
    if (t.min_lr > t.lr)
      errors.push_back(fmt::format("{}: [train] min_lr = {} is above lr = {} (the cosine schedule decays "
                                   "from lr down to min_lr)", job_origin(job, {"train.min_lr", "train.lr"}), t.min_lr, t.lr));
    s.report_unknown({"precision", "optimizer", "steps", "seed", "lr", "min_lr", "warmup_steps",
                      "weight_decay", "beta1", "beta2", "eps", "grad_clip", "data", "run_dir",
                      "checkpoint_every", "keep_checkpoints", "eval_every", "eval_batches", "log_every",
                      "threads", "nan_policy", "backend"});
  }

  if (extra) extra(job, errors);
  if (!errors.empty()) {
    std::string msg = fmt::format("{} problem{} in job {}:", errors.size(), errors.size() == 1 ? "" : "s", source);
    for (const auto& e : errors) msg += "\n  " + e;
    throw Error(msg);
  }
  return job;
}

std::string job_origin(const Job& job, const std::vector<std::string>& keys) {
  std::vector<std::string> seen;
  for (const auto& k : keys) {
    auto it = job.origins.find(k);
    if (it != job.origins.end() && std::find(seen.begin(), seen.end(), it->second) == seen.end())
      seen.push_back(it->second);
  }
  std::string out;
  for (const auto& w : seen) out += (out.empty() ? "" : " and ") + w;
  return out.empty() ? job.source : out;
}

Job load_job(const std::string& path, const std::vector<std::string>& sets, const JobCheck& extra) {
  return parse_job(read_file(path, "job file"), path, sets, extra);
}

namespace {
// A TOML basic string: quotes and backslashes escaped, so any path round-trips.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
}  // namespace

std::string job_to_toml(const Job& job) {
  auto opt = [](const auto& o) -> std::string {
    if (!o) return "\"auto\"";
    return fmt::format("{}", *o);
  };
  const ModelSpec& m = job.model;
  const MachineSpec& mc = job.machine;
  const ParallelSpec& p = job.parallel;
  const TrainSpec& t = job.train;
  std::string out;
  out += fmt::format(
      "[model]\nlayers = {}\nhidden = {}\nheads = {}\nkv_heads = {}\nffn_hidden = {}\nseq_len = {}\n"
      "vocab = {}\nactivation = \"{}\"\nnorm = \"{}\"\nposition = \"{}\"\ntie_embeddings = {}\n"
      "bias = {}\nnorm_eps = {:.17g}\nrope_theta = {:.17g}\n\n",
      m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len, m.vocab, to_string(m.activation),
      to_string(m.norm), to_string(m.position), m.tie_embeddings, m.bias, m.norm_eps, m.rope_theta);
  out += fmt::format(
      "[machine]\ndevice = {}\ngpus_per_node = {}\nintra_node_bw_gbs = {:.17g}\ninter_node_bw_gbs = {:.17g}\n"
      "intra_node_latency_us = {:.17g}\ninter_node_latency_us = {:.17g}\nstorage_bw_gbs = {:.17g}\n",
      quoted(mc.device), mc.gpus_per_node, mc.intra_node_bw_gbs, mc.inter_node_bw_gbs, mc.intra_node_latency_us,
      mc.inter_node_latency_us, mc.storage_bw_gbs);
  if (mc.node_mtbf_hours) out += fmt::format("node_mtbf_hours = {:.17g}\n", *mc.node_mtbf_hours);
  out += fmt::format(
      "\n[parallel]\ngpus = {}\ntp = {}\npp = {}\ndp = {}\ncp = {}\nvp = {}\nzero = {}\nmicro_batch = {}\n"
      "global_batch = {}\nrecompute = {}\nseq_parallel = {}\nschedule = {}\n",
      p.gpus, opt(p.tp), opt(p.pp), opt(p.dp), opt(p.cp), opt(p.vp), opt(p.zero), opt(p.micro_batch),
      p.global_batch, p.recompute ? fmt::format("\"{}\"", to_string(*p.recompute)) : "\"auto\"",
      opt(p.seq_parallel), p.schedule ? fmt::format("\"{}\"", to_string(*p.schedule)) : "\"auto\"");
  if (!p.layers_per_stage.empty()) out += fmt::format("layers_per_stage = [{}]\n", fmt::join(p.layers_per_stage, ", "));
  out += fmt::format("watchdog_timeout_s = {:.17g}\n", p.watchdog_timeout_s);
  out += fmt::format(
      "\n[train]\nprecision = \"{}\"\noptimizer = \"{}\"\nsteps = {}\nseed = {}\nlr = {:.17g}\nmin_lr = {:.17g}\n"
      "warmup_steps = {}\nweight_decay = {:.17g}\nbeta1 = {:.17g}\nbeta2 = {:.17g}\neps = {:.17g}\n"
      "grad_clip = {:.17g}\ndata = {}\nrun_dir = {}\ncheckpoint_every = {}\nkeep_checkpoints = {}\n"
      "eval_every = {}\neval_batches = {}\nlog_every = {}\nthreads = {}\nnan_policy = \"{}\"\nbackend = \"{}\"\n",
      to_string(t.precision), t.optimizer, t.steps, t.seed, t.lr, t.min_lr, t.warmup_steps, t.weight_decay,
      t.beta1, t.beta2, t.eps, t.grad_clip, quoted(t.data), quoted(t.run_dir), t.checkpoint_every, t.keep_checkpoints,
      t.eval_every, t.eval_batches, t.log_every, t.threads, t.nan_policy, t.backend);
  return out;
}

}  // namespace exatrain
