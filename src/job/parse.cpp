// Job-file parsing: TOML (guarded toml11, core/toml.hpp) -> layered key/value sections -> typed, validated
// Job. See parse.hpp for the precedence rules. All problems are collected, then reported at once.
// A job file is untrusted input (docs/security.md): its size is bounded, the TOML guard bounds
// nesting and refuses invalid UTF-8 and out-of-range integers, every value is range-checked here,
// presets are names of files in the catalog folders, and the resolved job is written back with a
// TOML writer so that parse(write(job)) == job.
#include "job/parse.hpp"

#include "core/profile_cache.hpp"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/check.hpp"
#include "core/fileio.hpp"
#include "core/paths.hpp"
#include "core/toml.hpp"

namespace exatrain {
namespace {

// One key's value and where it came from ("job.toml", "models/gpt2.toml", "--set"). The value
// lives in one of the parsed documents, which outlive the sections (Documents).
struct Entry {
  const toml::value* value = nullptr;
  std::string origin;
  std::string set_text;  // origin "--set": the override as given ("model.heads=5")
};

// Every TOML document a job is layered from (the file, presets, --set values), kept alive while
// the sections point into them.
using Documents = std::deque<toml::value>;

// A name from the file as it can be printed: itself, or TOML-quoted when it holds a character
// that would garble a message (a control character such as NUL or newline, a quote, a space).
std::string printable(const std::string& name) {
  const bool plain = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 && c != 0x7f && c != '"' && c != '\\';
  });
  return plain ? name : toml_text(toml::value(name));
}
// A value as the file would write it; a table inline ("{ norm = 2 }", [comm] role_density).
std::string show(const toml::value& v) {
  if (!v.is_table()) return toml_text(v);
  std::string s;
  for (const auto& [k, x] : v.as_table()) s += (s.empty() ? "" : ", ") + printable(k) + " = " + show(x);
  return "{ " + s + " }";
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
    entries_[key] = Entry{&v, origin, set_text};
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
    if (!reported_.insert(key).second) return;  // once per key (e.g. a preset read twice)
    const Entry& e = entries_.at(key);
    errors_.push_back(fmt::format("{}: [{}] {} = {}: expected {}", e.origin, name_, key,
                                  show(*e.value), expected));
  }

  // A key that is well-formed but has no meaning in this job (another optimizer's key):
  // "<origin>: [section] key = value: <why>"; the key counts as read.
  void refuse(const std::string& key, const std::string& why) {
    take(key);
    if (!reported_.insert(key).second) return;
    const Entry& e = entries_.at(key);
    errors_.push_back(fmt::format("{}: [{}] {} = {}: {}", e.origin, name_, key, show(*e.value), why));
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
  // A number in [lo, hi): hi itself is impossible (a momentum of 1 never forgets a gradient).
  void get_float_below(const std::string& key, double& out, double lo, double hi) {
    const toml::value* v = take(key);
    if (!v) return;
    const std::string want = fmt::format("a number in [{}, {})", lo, hi);
    double x;
    if (v->is_floating()) x = v->as_floating();
    else if (v->is_integer()) x = static_cast<double>(v->as_integer());
    else return bad(key, want);
    if (!(x >= lo && x < hi)) return bad(key, want);
    out = x;
  }
  // A number in (lo, hi]: lo itself is impossible (a density of 0 sends nothing, a damping of 0
  // divides by a zero eigenvalue).
  // `range`: the interval as the docs write it (e.g. "(2^-64, 2^64]"), else printed from lo, hi.
  void get_float_above(const std::string& key, double& out, double lo, double hi, const std::string& range = "") {
    const toml::value* v = take(key);
    if (!v) return;
    const std::string want = "a number in " + (range.empty() ? fmt::format("({}, {}]", lo, hi) : range);
    double x;
    if (v->is_floating()) x = v->as_floating();
    else if (v->is_integer()) x = static_cast<double>(v->as_integer());
    else return bad(key, want);
    if (!(x > lo && x <= hi)) return bad(key, want);
    out = x;
  }
  // An inline table { name = number, ... } whose names are among `names` and numbers in (lo, hi].
  void get_float_table(const std::string& key, std::map<std::string, double>& out,
                       const std::vector<std::string>& names, double lo, double hi) {
    const toml::value* v = take(key);
    if (!v) return;
    std::string want = fmt::format("an inline table of numbers in ({}, {}] named", lo, hi);
    for (size_t i = 0; i < names.size(); i++) want += (i ? ", " : " ") + names[i];
    if (!v->is_table()) return bad(key, want);
    std::map<std::string, double> m;
    for (const auto& [name, x] : v->as_table()) {
      if (std::find(names.begin(), names.end(), name) == names.end()) return bad(key, want);
      if (!x.is_floating() && !x.is_integer()) return bad(key, want);
      const double d = x.is_floating() ? x.as_floating() : double(x.as_integer());
      if (!(d > lo && d <= hi)) return bad(key, want);
      m[name] = d;
    }
    out = m;
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
  // A string without NUL characters (a NUL would cut a name or path short in the system calls);
  // `non_empty`: "" is refused too.
  void get_string(const std::string& key, std::string& out, bool non_empty = false) {
    const toml::value* v = take(key);
    if (!v) return;
    if (!v->is_string()) return bad(key, non_empty ? "a non-empty string" : "a string");
    const std::string& x = v->as_string().str;
    if (x.find('\0') != std::string::npos) return bad(key, "a string without NUL characters");
    if (non_empty && x.empty()) return bad(key, "a non-empty string");
    out = x;
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
  // A number in (lo, hi] or the string `word`: returns 1 for the word, 0 for a number (in `out`),
  // -1 when absent or bad.
  int get_float_above_or(const std::string& key, const std::string& word, double& out, double lo, double hi,
                         const std::string& range = "") {
    const toml::value* v = take(key);
    if (!v) return -1;
    if (v->is_string() && v->as_string().str == word) return 1;
    const std::string want = fmt::format("\"{}\" or a number in {}", word,
                                         range.empty() ? fmt::format("({}, {}]", lo, hi) : range);
    double x;
    if (v->is_floating()) x = v->as_floating();
    else if (v->is_integer()) x = static_cast<double>(v->as_integer());
    else return bad(key, want), -1;
    if (!(x > lo && x <= hi)) return bad(key, want), -1;
    out = x;
    return 0;
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
  // true, false or the string `word`, read as `on`, `off` or `named`; `out` unchanged when absent.
  template <class T>
  void get_bool_or_word(const std::string& key, const std::string& word, T off, T on, T named, T& out) {
    const toml::value* v = take(key);
    if (!v) return;
    if (v->is_string() && v->as_string().str == word) return void(out = named);
    if (!v->is_boolean()) return bad(key, fmt::format("true, false or \"{}\"", word));
    out = v->as_boolean() ? on : off;
  }
  void get_int_list(const std::string& key, std::vector<int64_t>& out, int64_t lo, int64_t hi) {
    const toml::value* v = take(key);
    if (!v) return;
    std::string want = fmt::format("an array of integers in [{}, {}]", lo, hi);
    if (!v->is_array()) return bad(key, want);
    std::vector<int64_t> xs;
    for (const auto& x : v->as_array()) {
      if (!x.is_integer() || x.as_integer() < lo || x.as_integer() > hi) return bad(key, want);
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
      errors_.push_back(fmt::format("{}: [{}] unknown key {}{}; known keys: {}", e.origin,
                                    name_, show(toml::value(key)), hint, list));
    }
  }

 private:
  const toml::value* take(const std::string& key) {
    read_.insert(key);
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : it->second.value;
  }

  std::string name_;
  std::vector<std::string>& errors_;
  std::map<std::string, Entry> entries_;
  std::set<std::string> read_;
  std::set<std::string> reported_;
};

std::string read_job_text(const std::string& path, const std::string& what) {
  EXA_CHECK(std::filesystem::exists(path), "cannot open {} '{}'", what, path);
  // A regular file (never a FIFO or device) of at most kMaxJobFileBytes.
  return read_file_bytes(path, kMaxJobFileBytes);
}

// A preset name: letters, digits, '.', '_', '-', not starting with '.', at most 64 bytes. A
// preset is a file of the catalog folders, never a path (a file of one's own is preset_file).
bool is_preset_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  return true;
}

// The preset names of a catalog folder (its *.toml files), for the error message.
std::string preset_names(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(fmt::format("{}/{}", data_root(), dir), ec))
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none found" : out;
}

// Puts a preset's section (its `preset_file` or catalog file) under the section's keys. `optional`:
// a file without that table adds nothing (the local profile of one rank measured no [machine]).
void put_preset_section(Section& sec, Documents& docs, const std::string& path, const std::string& shown,
                        std::vector<std::string>& errors, bool optional = false) {
  docs.push_back(parse_toml(read_job_text(path, "preset file"), shown));
  const toml::value& root = docs.back();
  if (optional && root.is_table() && !root.contains(sec.name())) return;
  if (!root.is_table() || !root.contains(sec.name()) || !root.at(sec.name()).is_table()) {
    errors.push_back(fmt::format("{}: expected a [{}] table", shown, sec.name()));
    return;
  }
  for (const auto& [key, v] : root.at(sec.name()).as_table())
    if (key != "preset" && key != "preset_file") sec.put(key, v, shown);
}

// Applies a section's `preset` (models/NAME.toml for [model], catalog/clusters/NAME.toml for
// [machine]) or `preset_file` (a TOML file of the user's own, by path: relative paths are taken
// from the directory of the job file that names it). The key itself was put by the caller.
void apply_preset(Section& sec, Documents& docs, const std::string& dir, const std::string& origin_of_key,
                  const std::string& job_dir, std::vector<std::string>& errors) {
  std::string name, file;
  sec.get_string("preset", name);
  sec.get_string("preset_file", file);
  if (!name.empty() && !file.empty()) {
    errors.push_back(fmt::format("{}: [{}] preset = \"{}\" and preset_file = \"{}\": expected one of them (a preset "
                                 "of {}/ by name, or a file of your own by path)", origin_of_key, sec.name(), name,
                                 file, dir));
    return;
  }
  if (!file.empty()) {
    const std::filesystem::path p(file);
    const std::string path = p.is_absolute() || job_dir.empty() ? file : (std::filesystem::path(job_dir) / p).string();
    if (!std::filesystem::is_regular_file(path)) {
      sec.bad("preset_file", fmt::format("the path of a TOML file with a [{}] table ({} is not a file)", sec.name(), path));
      return;
    }
    put_preset_section(sec, docs, path, path, errors);
    return;
  }
  if (name.empty()) return;
  const std::string rel = fmt::format("{}/{}.toml", dir, name);
  const std::string path = fmt::format("{}/{}", data_root(), rel);
  if (!is_preset_name(name) || !std::filesystem::is_regular_file(path)) {
    sec.bad("preset", fmt::format("the name of a preset in {}/ (one of: {}); a file of your own goes in "
                                  "preset_file = \"PATH\"", dir, preset_names(dir)));
    return;
  }
  put_preset_section(sec, docs, path, rel, errors);
  // This machine as `exatrain profile` measured it (core/profile_cache.hpp), over the shipped figures.
  // A profile of one rank has devices only (the catalog reads those) and no [machine]: the
  // network figures stay the shipped ones.
  if (dir == "catalog/clusters" && name == "local")
    if (const std::optional<std::string> profile = active_profile())
      put_preset_section(sec, docs, *profile, "local profile " + *profile, errors, /*optional=*/true);
}

// Splits "section.key=value" and parses value as TOML (falling back to a plain word, which must
// be valid UTF-8 without quotes or control characters: a string in TOML quotes otherwise).
void apply_set(std::map<std::string, Section>& sections, Documents& docs, const std::string& set,
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
    errors.push_back(fmt::format("--set {}: unknown section [{}]; known: model, machine, parallel, train, optimizer",
                                 set, section));
    return;
  }
  for (const std::string& text : {"v = " + raw, "v = '" + raw + "'"}) {  // a TOML value, else a plain word
    if (raw.find_first_of("\n\r") != std::string::npos) break;
    try {
      docs.push_back(parse_toml(text, "--set"));
    } catch (const Error&) {
      continue;
    }
    const toml::value& doc = docs.back();
    if (!doc.is_table() || doc.as_table().size() != 1 || !doc.contains("v")) continue;
    const toml::value& v = doc.at("v");
    // The plain-word form must give the word itself back (not e.g. "x" of "x' # y").
    if (text[4] != '\'' || (v.is_string() && v.as_string().str == raw)) {
      it->second.put(key, v, "--set", set);
      return;
    }
  }
  errors.push_back(fmt::format("--set {}: the value is neither a TOML value nor a plain word (valid UTF-8 without "
                               "quotes or control characters); write a string in TOML quotes", set));
}

// Fills the sections from the layers, lowest first: each section's preset (or preset_file), the
// file's keys, then the --set overrides. A preset named by --set replaces the file's.
void layer_sections(const toml::value& root, const std::string& source, const std::vector<std::string>& sets,
                    std::map<std::string, Section>& sections, Documents& docs, std::vector<std::string>& errors) {
  std::map<std::string, std::string> preset_sets;  // section -> the --set text
  std::vector<std::string> other_sets;
  for (const auto& s : sets) {
    bool is_preset = false;
    for (const char* sec : {"model", "machine"})
      for (const char* k : {".preset=", ".preset_file="})
        if (s.rfind(std::string(sec) + k, 0) == 0) preset_sets[sec] = s, is_preset = true;
    if (!is_preset) other_sets.push_back(s);
  }
  for (const auto& [name, table] : root.as_table()) {
    if (!sections.count(name)) {
      errors.push_back(fmt::format("{}: unknown section [{}]; expected [model], [machine], [parallel], [train], [optimizer], [comm]",
                                   source, printable(name)));
      continue;
    }
    if (!table.is_table()) errors.push_back(fmt::format("{}: {} must be a table [{}]", source, name, name));
  }
  // No [machine] table and no machine preset: the job runs on this machine, so it is the `local`
  // cluster (catalog/clusters/local.toml), the one "auto" plans use too; a --set machine.KEY
  // overrides one of its keys, as it would a preset's. (A data root without the catalog keeps the
  // built-in defaults: one cpu-local device.)
  const bool machine_named = root.contains("machine") || preset_sets.count("machine") ||
                             !std::filesystem::is_regular_file(fmt::format("{}/catalog/clusters/local.toml", data_root()));
  const std::string job_dir = std::filesystem::path(source).parent_path().string();
  for (auto& [name, sec] : sections) {
    const toml::value* table = root.contains(name) && root.at(name).is_table() ? &root.at(name) : nullptr;
    // The preset goes in first so that the file's own keys (and --set) override it.
    if (preset_sets.count(name)) apply_set(sections, docs, preset_sets[name], errors);
    for (const char* k : {"preset", "preset_file"})
      if (!preset_sets.count(name) && table && table->contains(k)) sec.put(k, table->at(k), source);
    if (name == "machine" && !machine_named) {
      docs.emplace_back(toml::value("local"));
      sec.put("preset", docs.back(), fmt::format("{} (no [machine]: this machine)", source));
    }
    if (sec.has("preset") || sec.has("preset_file"))
      apply_preset(sec, docs, name == "model" ? "models" : "catalog/clusters", preset_sets.count(name) ? "--set" : source,
                   preset_sets.count(name) ? "" : job_dir, errors);
    if (table)
      for (const auto& [key, v] : table->as_table())
        if (key != "preset" && key != "preset_file") sec.put(key, v, source);
  }
  for (const auto& s : other_sets) apply_set(sections, docs, s, errors);
}

// [optimizer]: the hyper-parameters of train.optimizer (AdamW's and LAMB's are [train]'s beta1,
// beta2, eps and weight_decay; the others' are here, defaults and sources in docs/job-file.md and
// job/job.hpp). A key of an optimizer the job does not use is refused: it would be silently
// ignored otherwise.
const std::vector<std::pair<std::string, std::vector<std::string>>>& optimizer_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> keys = {
      {"muon", {"momentum", "nesterov", "ns_steps", "scale", "others", "first_order_steps"}},
      {"sgd", {"momentum", "nesterov"}},
      {"lion", {"beta1", "beta2"}},
      {"adafactor", {"beta1", "decay_rate", "eps1", "clip_threshold", "factored"}},
      {"shampoo", {"factor_decay", "epsilon", "max_preconditioner_dim", "precondition_frequency",
                   "start_preconditioning_step", "others", "first_order_steps"}},
      {"soap", {"factor_decay", "max_preconditioner_dim", "precondition_frequency", "others", "first_order_steps"}},
      {"kfac", {"momentum", "nesterov", "damping", "factor_decay", "factor_update_steps", "inv_update_steps", "kl_clip",
                "grad_worker_fraction", "others", "first_order_steps"}}};
  return keys;
}

// The optimizers that have `key` among their [optimizer] keys, as "\"muon\" or \"sgd\"".
std::string optimizers_with_key(const std::string& key) {
  std::string out;
  for (const auto& [name, keys] : optimizer_keys())
    if (std::find(keys.begin(), keys.end(), key) != keys.end())
      out += fmt::format("{}\"{}\"", out.empty() ? "" : " or ", name);
  return out;
}

// [train] loss_scale and its dynamic keys (job.hpp LossScaleSpec; docs/job-file.md): fp16 only
// (fp32 and bf16 have float32's exponent range, nothing to scale); the dynamic keys need
// loss_scale = "dynamic"; the initial scale at least the minimum.
void parse_loss_scale(Section& s, const Job& job, TrainSpec& t, std::vector<std::string>& errors) {
  static const char* kDynamic[] = {"initial_loss_scale", "loss_scale_growth_interval", "loss_scale_growth_factor",
                                   "loss_scale_backoff", "min_loss_scale", "loss_scale_hysteresis"};
  if (t.precision != Precision::fp16) {
    for (const char* k : {"loss_scale", kDynamic[0], kDynamic[1], kDynamic[2], kDynamic[3], kDynamic[4], kDynamic[5]})
      if (s.has(k))
        s.refuse(k, fmt::format("loss scaling is for [train] precision = \"fp16\" only, and this job's precision is "
                                "\"{}\" (fp32 and bf16 have float32's exponent range: their gradients need no "
                                "scaling); expected precision = \"fp16\" or no {}", to_string(t.precision), k));
    return;
  }
  LossScaleSpec& ls = t.loss_scale;
  double fixed = 0;
  // Every scale and its reciprocal (the optimizer's gradient factor) stay normal fp32 numbers: a
  // scale of 1e-45 would make 1/S inf and the update NaN. Hence (2^-64, 2^64].
  const double lo = 1.0 / kMaxLossScale;
  const std::string range = "(2^-64, 2^64]";
  if (s.get_float_above_or("loss_scale", "dynamic", fixed, lo, kMaxLossScale, range) == 0)
    ls.dynamic = false, ls.initial = fixed;
  if (!ls.dynamic) {
    for (const char* k : kDynamic)
      if (s.has(k))
        s.refuse(k, fmt::format("[train] loss_scale = {} is a fixed scale, which never changes; this key is for "
                                "loss_scale = \"dynamic\"", fixed));
    return;
  }
  s.get_float_above("initial_loss_scale", ls.initial, lo, kMaxLossScale, range);
  s.get_int("loss_scale_growth_interval", ls.growth_interval, 1, int64_t(1) << 40);
  s.get_float_above("loss_scale_growth_factor", ls.growth_factor, 1, 1e6);
  s.get_float_below("loss_scale_backoff", ls.backoff, 1e-6, 1);  // 0 would zero the scale; 1 never backs off
  s.get_float_above("min_loss_scale", ls.min_scale, lo, kMaxLossScale, range);
  s.get_int("loss_scale_hysteresis", ls.hysteresis, 1, (int64_t(1) << 31) - 1);
  if (ls.initial < ls.min_scale)
    errors.push_back(fmt::format("{}: [train] initial_loss_scale = {} is below min_loss_scale = {} (the dynamic scale "
                                 "starts at the first and backs off no lower than the second); expected "
                                 "initial_loss_scale >= min_loss_scale",
                                 job_origin(job, {"train.initial_loss_scale", "train.min_loss_scale"}), ls.initial,
                                 ls.min_scale));
}

// fp16's loss scale against what reads the scaled gradients (docs/precision.md "Loss scaling"):
// a [comm] compressor encodes them (a sign or a top-k selection does not carry an inf through,
// so an overflow could go unseen, and error feedback would keep residuals of the old scale
// across a change), K-FAC builds its Kronecker factors from the backward's dY (which carries
// the scale, squared in the factor). The dense collectives, fp32 or bf16, sum scaled gradients
// exactly as unscaled ones (a power-of-two scale) and keep inf and NaN.
void check_fp16_companions(const Job& job, std::vector<std::string>& errors) {
  const TrainSpec& t = job.train;
  if (t.precision != Precision::fp16) return;
  if (t.comm.compressor != "none")
    errors.push_back(fmt::format("{}: [train] precision = \"fp16\" with [comm] compressor = \"{}\": the compressor "
                                 "would encode loss-scaled gradients (an inf may not survive the encoding, so an "
                                 "overflow could go unseen, and error-feedback residuals would outlive a scale "
                                 "change); expected compressor = \"none\" or precision = \"bf16\"",
                                 job_origin(job, {"train.precision", "comm.compressor"}), t.comm.compressor));
  if (t.optimizer == "kfac")
    errors.push_back(fmt::format("{}: [train] precision = \"fp16\" with optimizer = \"kfac\": K-FAC's gradient "
                                 "factors are built from the backward's output gradients, which carry the loss scale "
                                 "(squared in the factor, changing with every backoff); expected another optimizer "
                                 "or precision = \"bf16\"", job_origin(job, {"train.precision", "train.optimizer"})));
}

// Whether [train] beta1, beta2 and eps reach an Adam of the job's optimizer: AdamW, LAMB, Shampoo's
// grafting Adam, SOAP's Adam, the AdamW Muon runs off the matrices, a mixed order's adamw or lamb.
// SGD, Lion, Adafactor and K-FAC (SGD) have none (their moments are [optimizer] keys): the keys are refused.
bool uses_train_betas(const TrainSpec& t) {
  const std::string& o = t.optimizer;
  if (o == "sgd" || o == "lion" || o == "adafactor") return false;
  if ((o == "muon" || o == "kfac") && t.mixed.active())
    return t.mixed.first_order() == "adamw" || t.mixed.first_order() == "lamb";
  if (o == "kfac") return false;  // SGD everywhere
  return true;  // adamw, lamb, shampoo, soap (their own Adam), muon (AdamW off the matrices)
}

// others / first_order_steps of a matrix optimizer (MixedSpec).
void parse_mixed_values(Section& s, TrainSpec& t) {
  const std::vector<std::string>& firsts = first_order_optimizer_names();
  if (int i = s.get_choice("others", firsts); i >= 0) t.mixed.others = firsts[size_t(i)];
  s.get_int("first_order_steps", t.mixed.first_order_steps, 0, int64_t(1) << 40);
}

// kfac-pytorch's checks (KFACPreconditioner): damping > 0, factor_decay in (0, 1], intervals >= 1,
// kl_clip >= 0 (0: off here), a fraction of the replicas in (0, 1] (plan_problem checks it against dp).
void parse_kfac_values(Section& s, KfacSpec& k) {
  s.get_float_below("momentum", k.momentum, 0, 1);
  s.get_bool("nesterov", k.nesterov);
  if (k.nesterov && k.momentum == 0 && s.has("nesterov"))
    s.refuse("nesterov", "Nesterov momentum needs momentum > 0, and [optimizer] momentum is 0");
  s.get_float_above("damping", k.damping, 0, 1e6);
  s.get_float_above("factor_decay", k.factor_decay, 0, 1);
  s.get_int("factor_update_steps", k.factor_update_steps, 1, int64_t(1) << 40);
  s.get_int("inv_update_steps", k.inv_update_steps, 1, int64_t(1) << 40);
  s.get_float("kl_clip", k.kl_clip, 0, 1e6);
  s.get_float_above("grad_worker_fraction", k.grad_worker_fraction, 0, 1);
}

void parse_optimizer_values(Section& s, TrainSpec& t) {
  const std::vector<std::string>& matrix = matrix_optimizer_names();
  if (std::find(matrix.begin(), matrix.end(), t.optimizer) != matrix.end()) parse_mixed_values(s, t);
  if (t.optimizer == "muon") {
    MuonSpec& m = t.muon;
    s.get_float_below("momentum", m.momentum, 0, 1);  // 1: the buffer never forgets, and grows without bound
    s.get_bool("nesterov", m.nesterov);
    s.get_int("ns_steps", m.ns_steps, 1, 100);
    if (int i = s.get_choice("scale", {"rms_match", "shape"}); i >= 0) m.scale = i == 0 ? "rms_match" : "shape";
  } else if (t.optimizer == "sgd") {
    s.get_float_below("momentum", t.sgd.momentum, 0, 1);
    s.get_bool("nesterov", t.sgd.nesterov);
    if (t.sgd.nesterov && t.sgd.momentum == 0 && s.has("nesterov"))  // torch.optim.SGD refuses it too
      s.refuse("nesterov", "Nesterov momentum needs momentum > 0, and [optimizer] momentum is 0");
  } else if (t.optimizer == "lion") {
    s.get_float_below("beta1", t.lion.beta1, 0, 1);
    s.get_float_below("beta2", t.lion.beta2, 0, 1);
  } else if (t.optimizer == "adafactor") {
    AdafactorSpec& a = t.adafactor;
    s.get_float_below("beta1", a.beta1, 0, 1);
    s.get_float_below("decay_rate", a.decay_rate, -1, 0);  // beta2_t = 1 - t^c: c in [-1, 0) keeps it in [0, 1)
    s.get_float("eps1", a.eps1, 1e-37, 1);  // > 0: a zero gradient would give 0 / sqrt(0)
    s.get_float("clip_threshold", a.clip_threshold, 1e-6, 1e6);
    s.get_bool("factored", a.factored);
  } else if (t.optimizer == "shampoo") {
    ShampooSpec& h = t.shampoo;
    s.get_float("factor_decay", h.factor_decay, 0, 1);  // 1: the factors sum every step (Gupta et al.)
    s.get_float("epsilon", h.epsilon, 1e-30, 1);
    s.get_int("max_preconditioner_dim", h.max_preconditioner_dim, 1, 8192);
    s.get_int("precondition_frequency", h.precondition_frequency, 1, int64_t(1) << 40);
    s.get_int("start_preconditioning_step", h.start_preconditioning_step, 1, int64_t(1) << 40);
  } else if (t.optimizer == "kfac") {
    parse_kfac_values(s, t.kfac);
  } else if (t.optimizer == "soap") {
    SoapSpec& h = t.soap;
    s.get_float_below("factor_decay", h.factor_decay, 0, 1);  // 1: the factors would never see a gradient
    s.get_int("max_preconditioner_dim", h.max_preconditioner_dim, 1, 65536);
    s.get_int("precondition_frequency", h.precondition_frequency, 1, int64_t(1) << 40);
  }
}

void parse_optimizer_section(Section& s, TrainSpec& t) {
  std::vector<std::string> own, all;
  for (const auto& [name, keys] : optimizer_keys()) {
    for (const std::string& k : keys)
      if (std::find(all.begin(), all.end(), k) == all.end()) all.push_back(k);
    if (name == t.optimizer) own = keys;
  }
  std::string own_text;
  for (const std::string& k : own) own_text += (own_text.empty() ? "" : ", ") + k;
  own_text = own.empty() ? "whose keys are [train] beta1, beta2, eps and weight_decay" : "whose [optimizer] keys are " + own_text;
  for (const std::string& k : all)
    if (s.has(k) && std::find(own.begin(), own.end(), k) == own.end())
      s.refuse(k, fmt::format("a key of train.optimizer = {}, but train.optimizer is \"{}\" ({})", optimizers_with_key(k),
                              t.optimizer, own_text));
  parse_optimizer_values(s, t);
  s.report_unknown(all);
}

// [comm]: the data-parallel gradient compressor and its keys (CommSpec in job/job.hpp; docs/job-file.md,
// docs/compression.md). As in [optimizer], a key the chosen compressor does not take is refused.
const std::vector<std::pair<std::string, std::vector<std::string>>>& comm_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> keys = [] {
    const std::vector<std::string> sparse = {"density", "warmup_steps", "warmup", "error_feedback", "scope",
                                             "min_compress", "role_density", "overlap_every", "adam_variance",
                                             "compress"};
    auto with = [&](std::vector<std::string> extra, const std::vector<std::string>& without = {}) {
      std::vector<std::string> k = sparse;
      k.insert(k.end(), extra.begin(), extra.end());
      for (const std::string& w : without) k.erase(std::remove(k.begin(), k.end(), w), k.end());
      return k;
    };
    return std::vector<std::pair<std::string, std::vector<std::string>>>{
        {"none", {}},
        {"topk", with({"selection", "sample_fraction", "collective", "values", "indices", "small_pieces"})},
        // DGC always accumulates (its velocity is its error feedback) and trains SGD (or AdamW with
        // compress = "momentum"); blocktopk's blocks tile the bucket whatever the entries (no dense pieces).
        {"dgc", with({"selection", "sample_fraction", "collective", "momentum", "values", "indices", "small_pieces"},
                     {"error_feedback"})},
        {"blocktopk", with({"block_size"}, {"min_compress"})},
        {"temporal", with({"selection", "sample_fraction", "collective", "refresh_every"})},
        {"powersgd", {"rank", "warmup_steps", "error_feedback", "min_compress", "adam_variance", "compress"}},
        {"sign", {"warmup_steps", "error_feedback", "min_compress", "adam_variance", "compress"}}};
  }();
  return keys;
}

void parse_comm_values(Section& s, CommSpec& c) {
  s.get_float_above("density", c.density, 0, 1);
  s.get_int("rank", c.rank, 1, 1024);
  s.get_int("warmup_steps", c.warmup_steps, 0, int64_t(1) << 40);
  if (int i = s.get_choice("warmup", {"dense", "exponential"}); i >= 0) c.warmup = i == 0 ? "dense" : "exponential";
  s.get_int("refresh_every", c.refresh_every, 1, 1000000);
  s.get_bool("error_feedback", c.error_feedback);
  if (int i = s.get_choice("selection", {"exact", "sample"}); i >= 0) c.selection = i == 0 ? "exact" : "sample";
  s.get_float_above("sample_fraction", c.sample_fraction, 0, 1);
  if (int i = s.get_choice("collective", {"allgather", "split_reduce"}); i >= 0)
    c.collective = i == 0 ? "allgather" : "split_reduce";
  if (int i = s.get_choice("scope", {"entry", "bucket"}); i >= 0) c.scope = i == 0 ? "entry" : "bucket";
  if (int i = s.get_choice("values", {"fp32", "bf16", "sign"}); i >= 0) c.values = i == 0 ? "fp32" : i == 1 ? "bf16" : "sign";
  if (int i = s.get_choice("indices", {"int32", "golomb"}); i >= 0) c.indices = i == 0 ? "int32" : "golomb";
  if (int i = s.get_choice("small_pieces", {"fp32", "sign"}); i >= 0) c.small_pieces = i == 0 ? "fp32" : "sign";
  s.get_int("block_size", c.block_size, 1, 1 << 20);
  s.get_int("min_compress", c.min_compress, 0, int64_t(1) << 40);
  s.get_float_below("momentum", c.momentum, 0, 1);
  s.get_int("overlap_every", c.overlap_every, 0, 1000000);
  if (int i = s.get_choice("adam_variance", {"update", "freeze"}); i >= 0) c.adam_variance = i == 0 ? "update" : "freeze";
  if (int i = s.get_choice("compress", {"gradient", "momentum"}); i >= 0) c.compress = i == 0 ? "gradient" : "momentum";
  s.get_float_table("role_density", c.role_density, {"matrix", "embedding", "head", "norm", "bias"}, 0, 1);
  if (c.selection != "sample" && s.has("sample_fraction"))
    s.refuse("sample_fraction", "the fraction of elements DGC's sampled threshold reads, which needs [comm] "
                                "selection = \"sample\"");
  if (c.compress == "momentum" && s.has("momentum"))
    s.refuse("momentum", "with [comm] compress = \"momentum\" DGC's velocity is AdamW's first moment, whose rate is "
                         "[train] beta1");
  if (c.collective != "allgather" && s.has("values") && c.values != "fp32")
    s.refuse("values", "packed pairs travel by the all-gather of pairs; split-and-reduce sends int32 indices and fp32 "
                       "values: expected [comm] collective = \"allgather\"");
  if (c.collective != "allgather" && s.has("indices") && c.indices != "int32")
    s.refuse("indices", "packed pairs travel by the all-gather of pairs; split-and-reduce sends int32 indices and fp32 "
                        "values: expected [comm] collective = \"allgather\"");
  if (!c.error_feedback && (c.values != "fp32" || c.small_pieces == "sign"))
    s.refuse("error_feedback", "rounded values (values = \"bf16\" or \"sign\", small_pieces = \"sign\") keep their "
                               "rounding error in the error-feedback residual; without it the rounding is lost: "
                               "expected error_feedback = true");
  if (c.small_pieces == "sign" && (c.scope != "entry" || c.min_compress == 0))
    s.refuse("small_pieces", "the small pieces are the entries' pieces below min_compress, which needs scope = "
                             "\"entry\" and min_compress > 0 (without them there is none)");
  if (c.scope != "entry" && s.has("role_density"))
    s.refuse("role_density", "densities per parameter role need the selection per entry ([comm] scope = \"entry\")");
}

// Compressed momentum (1-bit Adam, Tang et al. 2021): the group's sum of the compressed local
// momenta becomes AdamW's m, and its v, which no rank can measure from compressed momenta, stays
// as the dense warm-up left it; the compressor reads m from the optimizer's full-arena state, which
// only ZeRO 0 keeps on every rank.
void check_compressed_momentum(const Job& job, std::vector<std::string>& errors) {
  const TrainSpec& t = job.train;
  const CommSpec& c = t.comm;
  if (c.compress != "momentum") return;
  if (t.optimizer != "adamw" || t.mixed.active() || c.adam_variance != "freeze")
    errors.push_back(fmt::format(
        "{}: [comm] compress = \"momentum\" with [train] optimizer = \"{}\"{} and [comm] adam_variance = \"{}\": the "
        "compressed momentum replaces AdamW's first moment, and its second moment cannot be measured from "
        "compressed momenta, so it is frozen after the dense warm-up (1-bit Adam); expected optimizer = \"adamw\" "
        "(no [optimizer] others) and adam_variance = \"freeze\" (with warmup_steps > 0)",
        job_origin(job, {"comm.compress", "train.optimizer", "comm.adam_variance"}), t.optimizer,
        t.mixed.active() ? " with [optimizer] others = \"" + t.mixed.first_order() + "\"" : "", c.adam_variance));
  if (job.parallel.zero && *job.parallel.zero != 0)
    errors.push_back(fmt::format(
        "{}: [comm] compress = \"momentum\" with [parallel] zero = {}: each rank forms its local momentum from "
        "the synchronised one, which ZeRO 1 and 2 keep only as this rank's shard; expected zero = 0",
        job_origin(job, {"comm.compress", "parallel.zero"}), *job.parallel.zero));
}

void parse_comm_section(Section& s, Job& job, std::vector<std::string>& errors) {
  CommSpec& c = job.train.comm;
  const std::vector<std::string>& names = comm_compressor_names();
  if (int i = s.get_choice("compressor", names); i >= 0) c.compressor = names[size_t(i)];
  std::vector<std::string> own, all = {"compressor"};
  for (const auto& [name, keys] : comm_keys()) {
    for (const std::string& k : keys)
      if (std::find(all.begin(), all.end(), k) == all.end()) all.push_back(k);
    if (name == c.compressor) own = keys;
  }
  std::string own_text;
  for (const std::string& k : own) own_text += (own_text.empty() ? "" : ", ") + k;
  for (const std::string& k : all)
    if (k != "compressor" && s.has(k) && std::find(own.begin(), own.end(), k) == own.end())
      s.refuse(k, fmt::format("not a key of [comm] compressor = \"{}\" ({})", c.compressor,
                              own.empty() ? "which takes no other key" : "whose keys are " + own_text));
  parse_comm_values(s, c);
  s.report_unknown(all);
  const TrainSpec& t = job.train;
  // 1-bit Adam's frozen variance (Tang et al. 2021): AdamW's, after the dense warm-up it measures v over.
  if (c.adam_variance == "freeze" && (t.optimizer != "adamw" || c.warmup_steps == 0 || c.warmup != "dense"))
    errors.push_back(fmt::format(
        "{}: [comm] adam_variance = \"freeze\" with [train] optimizer = \"{}\" and [comm] warmup_steps = {}{}: the "
        "second moment is frozen after the dense warm-up steps, which measure it (1-bit Adam); expected optimizer = "
        "\"adamw\" and warmup_steps > 0 with warmup = \"dense\"",
        job_origin(job, {"comm.adam_variance", "train.optimizer", "comm.warmup_steps", "comm.warmup"}), t.optimizer,
        c.warmup_steps, c.warmup == "dense" ? "" : ", warmup = \"" + c.warmup + "\""));
  check_compressed_momentum(job, errors);
  // A bf16 reduction is the dense collective in bf16; a compressor sends its own encoding.
  if (t.grad_reduce_dtype == "bf16" && c.compressor != "none")
    errors.push_back(fmt::format("{}: [train] grad_reduce_dtype = \"bf16\" with [comm] compressor = \"{}\": the bf16 "
                                 "reduction is the dense collective in bf16, the compressor sends its own encoding; "
                                 "expected grad_reduce_dtype = \"fp32\" or compressor = \"none\"",
                                 job_origin(job, {"train.grad_reduce_dtype", "comm.compressor"}), c.compressor));
  // DGC's momentum correction is the momentum (Lin et al. 2018, section 3.2): the optimizer must be plain SGD.
  // With compress = "momentum" DGC's velocity is AdamW's momentum instead (check_compressed_momentum).
  if (c.compressor == "dgc" && c.compress != "momentum" && (t.optimizer != "sgd" || t.sgd.momentum != 0))
    errors.push_back(fmt::format(
        "{}: [comm] compressor = \"dgc\" with [train] optimizer = \"{}\"{}: DGC's momentum correction accumulates "
        "the velocity before the selection ([comm] momentum = {}), so it replaces the optimizer's momentum; expected "
        "optimizer = \"sgd\" with [optimizer] momentum = 0, or [comm] compress = \"momentum\" with optimizer = "
        "\"adamw\" (DGC's velocity is then AdamW's momentum; other optimizers: compressor = \"topk\")",
        job_origin(job, {"comm.compressor", "train.optimizer", "optimizer.momentum"}), t.optimizer,
        t.optimizer == "sgd" ? fmt::format(" and [optimizer] momentum = {}", t.sgd.momentum) : "", c.momentum));
}

// [model]: the shape; shapes that cannot be built are errors naming where their values came from.
void parse_model_section(Section& s, Job& job, std::vector<std::string>& errors) {
  ModelSpec& m = job.model;
  s.get_string("preset", m.preset);
  s.get_string("preset_file", m.preset_file);
  const int64_t big = int64_t(1) << 40;
  s.get_int("layers", m.layers, 1, 100000);
  s.get_int("hidden", m.hidden, 1, big);
  s.get_int("heads", m.heads, 1, 100000);
  m.kv_heads = m.heads;
  s.get_int("kv_heads", m.kv_heads, 1, 100000);
  m.ffn_hidden = 4 * m.hidden;
  s.get_int("ffn_hidden", m.ffn_hidden, 1, 4 * big);  // 4 * big: the default 4 * hidden is always allowed
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
  s.report_unknown({"preset", "preset_file", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab",
                    "activation", "norm", "position", "tie_embeddings", "bias", "norm_eps", "rope_theta"});
}

// [machine]: a preset or a described machine.
void parse_machine_section(Section& s, MachineSpec& m) {
  s.get_string("preset", m.preset);
  s.get_string("preset_file", m.preset_file);
  s.get_string("device", m.device, true);
  s.get_int("gpus_per_node", m.gpus_per_node, 1, 1024);
  s.get_float("intra_node_bw_gbs", m.intra_node_bw_gbs, 0, 1e9);
  s.get_float("inter_node_bw_gbs", m.inter_node_bw_gbs, 0, 1e9);
  s.get_float("intra_node_latency_us", m.intra_node_latency_us, 0, 1e9);
  s.get_float("inter_node_latency_us", m.inter_node_latency_us, 0, 1e9);
  s.get_float("storage_bw_gbs", m.storage_bw_gbs, 0, 1e12);
  s.get_opt_float("node_mtbf_hours", m.node_mtbf_hours, 1e-6, 1e12);
  s.report_unknown({"preset", "preset_file", "device", "gpus_per_node", "intra_node_bw_gbs", "inter_node_bw_gbs",
                    "intra_node_latency_us", "inter_node_latency_us", "storage_bw_gbs", "node_mtbf_hours"});
}

// [parallel]: the degrees (or "auto"), the batch, recomputation, the schedule and the overlaps.
void parse_parallel_section(Section& s, ParallelSpec& p) {
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
    int i = s.get_choice("recompute", {"none", "selective", "full", "op", "auto"});
    if (i >= 0 && i < 4) p.recompute = Recompute(i);
  }
  s.get_bool_or_auto("seq_parallel", p.seq_parallel);
  if (s.has("schedule")) {
    int i = s.get_choice("schedule", {"gpipe", "1f1b", "auto"});
    if (i >= 0 && i < 2) p.schedule = Schedule(i);
  }
  s.get_int_list("layers_per_stage", p.layers_per_stage, 0, 100000);
  s.get_float("watchdog_timeout_s", p.watchdog_timeout_s, 0, 1e9);
  s.get_bool("overlap_grad_reduce", p.overlap_grad_reduce);
  s.get_bool("overlap_param_gather", p.overlap_param_gather);
  s.get_bool_or_word("tp_comm_overlap", "forward", TpCommOverlap::none, TpCommOverlap::all, TpCommOverlap::forward,
                     p.tp_comm_overlap);
  s.get_bool("recompute_early_stop", p.recompute_early_stop);
  s.get_bool("overlap_p2p_comm", p.overlap_p2p_comm);
  s.report_unknown({"gpus", "tp", "pp", "dp", "cp", "vp", "zero", "micro_batch", "global_batch",
                    "recompute", "seq_parallel", "schedule", "layers_per_stage", "watchdog_timeout_s",
                    "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "recompute_early_stop",
                    "overlap_p2p_comm"});
}

// [train] and its [optimizer] table: precision, the optimizer and its schedule, the run's files, the
// device; beta1/beta2/eps refused where the optimizer keeps no Adam moments.
void parse_train_section(Section& s, Section& optimizer, Job& job, std::vector<std::string>& errors) {
  TrainSpec& t = job.train;
  if (int i = s.get_choice("precision", {"fp32", "fp16", "bf16", "fp8"}); i >= 0) t.precision = Precision(i);
  if (int i = s.get_choice("optimizer", optimizer_names()); i >= 0) t.optimizer = optimizer_names()[size_t(i)];
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
  s.get_string("run_dir", t.run_dir, true);
  s.get_int("checkpoint_every", t.checkpoint_every, 0, int64_t(1) << 40);
  s.get_int("keep_checkpoints", t.keep_checkpoints, 0, 1000000);  // 0: keep all
  s.get_int("eval_every", t.eval_every, 0, int64_t(1) << 40);
  s.get_int("eval_batches", t.eval_batches, 1, 1000000);
  s.get_int("log_every", t.log_every, 1, int64_t(1) << 40);
  s.get_int("threads", t.threads, 0, 4096);
  if (int i = s.get_choice("nan_policy", {"stop", "skip"}); i >= 0) t.nan_policy = i == 0 ? "stop" : "skip";
  parse_loss_scale(s, job, t, errors);
  if (int i = s.get_choice("grad_reduce_dtype", {"fp32", "bf16"}); i >= 0) t.grad_reduce_dtype = i == 0 ? "fp32" : "bf16";
  if (int i = s.get_choice("pipeline_dtype", {"auto", "fp32"}); i >= 0) t.pipeline_dtype = i == 0 ? "auto" : "fp32";
  if (int i = s.get_choice("tp_comm_dtype", {"auto", "fp32"}); i >= 0) t.tp_comm_dtype = i == 0 ? "auto" : "fp32";
  if (int i = s.get_choice("residual_dtype", {"auto", "fp32"}); i >= 0) t.residual_dtype = i == 0 ? "auto" : "fp32";
  static const std::vector<std::string> devices = {"auto", "cpu", "cuda"}, backends = {"cpu", "cpu-guarded", "cuda"};
  if (int i = s.get_choice("device", devices); i >= 0) t.device = devices[size_t(i)];
  if (int i = s.get_choice("backend", backends); i >= 0) t.backend = backends[size_t(i)];
  if (!t.backend.empty() && t.device != "auto" && (t.backend == "cuda") != (t.device == "cuda"))
    errors.push_back(fmt::format("{}: [train] backend = \"{}\" does not run on [train] device = \"{}\" (expected "
                                 "backend \"cuda\" on device \"cuda\", \"cpu\" or \"cpu-guarded\" on device \"cpu\"; "
                                 "or set only one of them)",
                                 job_origin(job, {"train.backend", "train.device"}), t.backend, t.device));
  if (int i = s.get_choice("fp8_recipe", {"delayed", "tensorwise", "rowwise"}); i >= 0) t.fp8_recipe = Fp8Recipe(i);
  if (int i = s.get_choice("attention", {"flash2", "flash1", "flash3", "unfused"}); i >= 0) t.attention = Attention(i);
  s.get_bool("fp8_param_gather", t.fp8_param_gather);
  if (t.min_lr > t.lr)
    errors.push_back(fmt::format("{}: [train] min_lr = {} is above lr = {} (the cosine schedule decays "
                                 "from lr down to min_lr)", job_origin(job, {"train.min_lr", "train.lr"}), t.min_lr, t.lr));
  s.report_unknown({"precision", "optimizer", "steps", "seed", "lr", "min_lr", "warmup_steps",
                    "weight_decay", "beta1", "beta2", "eps", "grad_clip", "data", "run_dir",
                    "checkpoint_every", "keep_checkpoints", "eval_every", "eval_batches", "log_every",
                    "threads", "nan_policy", "grad_reduce_dtype", "pipeline_dtype", "tp_comm_dtype",
                    "residual_dtype", "device",
                    "backend", "fp8_recipe", "attention", "fp8_param_gather",
                    "loss_scale", "initial_loss_scale", "loss_scale_growth_interval", "loss_scale_growth_factor",
                    "loss_scale_backoff", "min_loss_scale", "loss_scale_hysteresis"});
  parse_optimizer_section(optimizer, t);
  if (!uses_train_betas(t))
    for (const char* k : {"beta1", "beta2", "eps"})
      if (s.has(k))
        s.refuse(k, fmt::format("train.optimizer = \"{}\"{} keeps no Adam moments, so this would be ignored (beta1, "
                                "beta2 and eps are AdamW's, LAMB's, Shampoo's, SOAP's and Muon's AdamW's; {})",
                                t.optimizer, t.mixed.active() ? " with [optimizer] others = \"" + t.mixed.first_order() + "\"" : "",
                                t.optimizer == "muon" ? "Muon's momentum is [optimizer] momentum" :
                                "its own are [optimizer] keys, docs/job-file.md"));
}

}  // namespace

Job parse_job(const std::string& text, const std::string& source, const std::vector<std::string>& sets,
              const JobCheck& extra) {
  EXA_CHECK(text.size() <= kMaxJobFileBytes, "{}: {} bytes, more than the {} a job file may have", source,
            text.size(), kMaxJobFileBytes);
  const toml::value root = parse_toml(text, source);
  EXA_CHECK(root.is_table(), "{}: expected a TOML document with tables", source);
  std::vector<std::string> errors;
  std::map<std::string, Section> sections;
  for (const char* s : {"model", "machine", "parallel", "train", "optimizer", "comm"}) sections.emplace(s, Section(s, errors));
  Documents docs;
  layer_sections(root, source, sets, sections, docs, errors);

  Job job;
  job.source = source;
  for (const auto& [name, sec] : sections) sec.record_origins(job.origins);

  parse_model_section(sections.at("model"), job, errors);
  parse_machine_section(sections.at("machine"), job.machine);
  parse_parallel_section(sections.at("parallel"), job.parallel);
  parse_train_section(sections.at("train"), sections.at("optimizer"), job, errors);

  parse_comm_section(sections.at("comm"), job, errors);
  check_fp16_companions(job, errors);

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
  return parse_job(read_job_text(path, "job file"), path, sets, extra);
}

namespace {
// "key = VALUE" lines, VALUE written by the TOML library (toml_text: strings escaped, floats with
// the shortest digits that read back exactly), so that every accepted job reads back as itself.
std::string line(const char* key, const std::string& v) { return fmt::format("{} = {}\n", key, toml_text(toml::value(v))); }
std::string line(const char* key, const char* v) { return line(key, std::string(v)); }
std::string line(const char* key, double v) { return fmt::format("{} = {}\n", key, toml_text(toml::value(v))); }
std::string line(const char* key, bool v) { return fmt::format("{} = {}\n", key, toml_text(toml::value(v))); }
std::string line(const char* key, int64_t v) { return fmt::format("{} = {}\n", key, toml_text(toml::value(v))); }
// An integer or "auto" (std::nullopt), a choice or "auto".
std::string line(const char* key, const std::optional<int64_t>& v) { return v ? line(key, *v) : line(key, "auto"); }
std::string line(const char* key, const std::optional<bool>& v) { return v ? line(key, *v) : line(key, "auto"); }
template <class E>
std::string line_choice(const char* key, const std::optional<E>& v) { return v ? line(key, to_string(*v)) : line(key, "auto"); }
}  // namespace

// [comm] with the keys its compressor takes (comm_keys), nothing when there is none.
static std::string comm_toml(const CommSpec& c) {
  if (!c.active()) return "";
  std::vector<std::string> own;
  for (const auto& [name, keys] : comm_keys())
    if (name == c.compressor) own = keys;
  auto takes = [&](const char* k) { return std::find(own.begin(), own.end(), k) != own.end(); };
  std::string out = "\n[comm]\n" + line("compressor", c.compressor);
  if (takes("density")) out += line("density", c.density);
  if (takes("rank")) out += line("rank", c.rank);
  out += line("warmup_steps", c.warmup_steps);
  if (takes("warmup")) out += line("warmup", c.warmup);
  if (takes("refresh_every")) out += line("refresh_every", c.refresh_every);
  if (takes("error_feedback")) out += line("error_feedback", c.error_feedback);
  if (takes("selection")) out += line("selection", c.selection);
  if (takes("sample_fraction") && c.selection == "sample") out += line("sample_fraction", c.sample_fraction);
  if (takes("collective")) out += line("collective", c.collective);
  if (takes("values") && c.collective == "allgather") out += line("values", c.values);
  if (takes("indices") && c.collective == "allgather") out += line("indices", c.indices);
  if (takes("small_pieces")) out += line("small_pieces", c.small_pieces);
  if (takes("scope")) out += line("scope", c.scope);
  if (takes("block_size")) out += line("block_size", c.block_size);
  if (takes("min_compress")) out += line("min_compress", c.min_compress);
  if (takes("momentum")) out += line("momentum", c.momentum);
  if (takes("overlap_every")) out += line("overlap_every", c.overlap_every);
  if (takes("adam_variance")) out += line("adam_variance", c.adam_variance);
  if (takes("compress")) out += line("compress", c.compress);
  if (!c.role_density.empty() && c.scope == "entry") {
    std::string t;
    for (const auto& [role, d] : c.role_density) t += fmt::format("{}{} = {}", t.empty() ? "" : ", ", role, toml_text(toml::value(d)));
    out += fmt::format("role_density = {{ {} }}\n", t);
  }
  return out;
}

bool same_settings(const Job& a, const Job& b) {
  auto settings = [](Job j) {
    j.model.preset.clear(), j.model.preset_file.clear(), j.model.vocab_from_data = false;
    j.machine.preset.clear(), j.machine.preset_file.clear();
    return std::tuple(j.model, j.machine, j.parallel, j.train);
  };
  return settings(a) == settings(b);
}

// The [optimizer] table: the keys of the job's optimizer (none for AdamW and LAMB), then the mixed
// choice's (`others`, `first_order_steps`), as job_to_toml has always written them.
static std::string optimizer_toml(const TrainSpec& t) {
  std::string out;
  if (t.optimizer == "muon")
    out += "\n[optimizer]\n" + line("momentum", t.muon.momentum) + line("nesterov", t.muon.nesterov) +
           line("ns_steps", t.muon.ns_steps) + line("scale", t.muon.scale);
  if (t.optimizer == "sgd") out += "\n[optimizer]\n" + line("momentum", t.sgd.momentum) + line("nesterov", t.sgd.nesterov);
  if (t.optimizer == "lion") out += "\n[optimizer]\n" + line("beta1", t.lion.beta1) + line("beta2", t.lion.beta2);
  if (t.optimizer == "adafactor")
    out += "\n[optimizer]\n" + line("beta1", t.adafactor.beta1) + line("decay_rate", t.adafactor.decay_rate) +
           line("eps1", t.adafactor.eps1) + line("clip_threshold", t.adafactor.clip_threshold) +
           line("factored", t.adafactor.factored);
  if (t.optimizer == "shampoo")
    out += "\n[optimizer]\n" + line("factor_decay", t.shampoo.factor_decay) + line("epsilon", t.shampoo.epsilon) +
           line("max_preconditioner_dim", t.shampoo.max_preconditioner_dim) +
           line("precondition_frequency", t.shampoo.precondition_frequency) +
           line("start_preconditioning_step", t.shampoo.start_preconditioning_step);
  if (t.optimizer == "kfac")
    out += "\n[optimizer]\n" + line("momentum", t.kfac.momentum) + line("nesterov", t.kfac.nesterov) +
           line("damping", t.kfac.damping) + line("factor_decay", t.kfac.factor_decay) +
           line("factor_update_steps", t.kfac.factor_update_steps) + line("inv_update_steps", t.kfac.inv_update_steps) +
           line("kl_clip", t.kfac.kl_clip) + line("grad_worker_fraction", t.kfac.grad_worker_fraction);
  if (t.optimizer == "soap")
    out += "\n[optimizer]\n" + line("factor_decay", t.soap.factor_decay) +
           line("max_preconditioner_dim", t.soap.max_preconditioner_dim) +
           line("precondition_frequency", t.soap.precondition_frequency);
  if (!t.mixed.others.empty()) out += line("others", t.mixed.others);
  if (t.mixed.first_order_steps > 0) out += line("first_order_steps", t.mixed.first_order_steps);
  return out;
}

std::string job_to_toml(const Job& job) {
  const ModelSpec& m = job.model;
  const MachineSpec& mc = job.machine;
  const ParallelSpec& p = job.parallel;
  const TrainSpec& t = job.train;
  EXA_CHECK(t.seed <= uint64_t(INT64_MAX), "job {}: [train] seed = {} cannot be written as a TOML integer", job.source,
            t.seed);
  std::string out = "[model]\n";
  out += line("layers", m.layers) + line("hidden", m.hidden) + line("heads", m.heads) + line("kv_heads", m.kv_heads) +
         line("ffn_hidden", m.ffn_hidden) + line("seq_len", m.seq_len) + line("vocab", m.vocab) +
         line("activation", to_string(m.activation)) + line("norm", to_string(m.norm)) +
         line("position", to_string(m.position)) + line("tie_embeddings", m.tie_embeddings) + line("bias", m.bias) +
         line("norm_eps", m.norm_eps) + line("rope_theta", m.rope_theta);
  out += "\n[machine]\n";
  out += line("device", mc.device) + line("gpus_per_node", mc.gpus_per_node) +
         line("intra_node_bw_gbs", mc.intra_node_bw_gbs) + line("inter_node_bw_gbs", mc.inter_node_bw_gbs) +
         line("intra_node_latency_us", mc.intra_node_latency_us) +
         line("inter_node_latency_us", mc.inter_node_latency_us) + line("storage_bw_gbs", mc.storage_bw_gbs);
  if (mc.node_mtbf_hours) out += line("node_mtbf_hours", *mc.node_mtbf_hours);
  out += "\n[parallel]\n";
  out += line("gpus", p.gpus) + line("tp", p.tp) + line("pp", p.pp) + line("dp", p.dp) + line("cp", p.cp) +
         line("vp", p.vp) + line("zero", p.zero) + line("micro_batch", p.micro_batch) +
         line("global_batch", p.global_batch) + line_choice("recompute", p.recompute) +
         line("seq_parallel", p.seq_parallel) + line_choice("schedule", p.schedule);
  if (!p.layers_per_stage.empty()) {
    toml::array a;
    for (int64_t n : p.layers_per_stage) a.push_back(toml::value(n));
    out += fmt::format("layers_per_stage = {}\n", toml_text(toml::value(a)));
  }
  const bool tp_overlap_forward = p.tp_comm_overlap == TpCommOverlap::forward;
  out += line("watchdog_timeout_s", p.watchdog_timeout_s) + line("overlap_grad_reduce", p.overlap_grad_reduce) +
         line("overlap_param_gather", p.overlap_param_gather) +
         (tp_overlap_forward ? line("tp_comm_overlap", "forward")
                             : line("tp_comm_overlap", p.tp_comm_overlap == TpCommOverlap::all)) +
         line("recompute_early_stop", p.recompute_early_stop) + line("overlap_p2p_comm", p.overlap_p2p_comm);
  out += "\n[train]\n";
  out += line("precision", to_string(t.precision)) + line("optimizer", t.optimizer) + line("steps", t.steps) +
         line("seed", int64_t(t.seed)) + line("lr", t.lr) + line("min_lr", t.min_lr) +
         line("warmup_steps", t.warmup_steps) + line("weight_decay", t.weight_decay) +
         (uses_train_betas(t) ? line("beta1", t.beta1) + line("beta2", t.beta2) + line("eps", t.eps) : "") +
         line("grad_clip", t.grad_clip) + line("data", t.data) +
         line("run_dir", t.run_dir) + line("checkpoint_every", t.checkpoint_every) +
         line("keep_checkpoints", t.keep_checkpoints) + line("eval_every", t.eval_every) +
         line("eval_batches", t.eval_batches) + line("log_every", t.log_every) + line("threads", t.threads) +
         line("nan_policy", t.nan_policy) + line("grad_reduce_dtype", t.grad_reduce_dtype) +
         line("pipeline_dtype", t.pipeline_dtype) + line("tp_comm_dtype", t.tp_comm_dtype) +
         line("residual_dtype", t.residual_dtype) + line("device", t.device) +
         (t.backend.empty() ? "" : line("backend", t.backend)) + line("fp8_recipe", to_string(t.fp8_recipe)) +
         line("attention", to_string(t.attention)) + line("fp8_param_gather", t.fp8_param_gather);
  if (t.precision == Precision::fp16 && t.loss_scale.dynamic)
    out += line("loss_scale", "dynamic") + line("initial_loss_scale", t.loss_scale.initial) +
           line("loss_scale_growth_interval", t.loss_scale.growth_interval) +
           line("loss_scale_growth_factor", t.loss_scale.growth_factor) +
           line("loss_scale_backoff", t.loss_scale.backoff) + line("min_loss_scale", t.loss_scale.min_scale) +
           line("loss_scale_hysteresis", t.loss_scale.hysteresis);
  else if (t.precision == Precision::fp16)
    out += line("loss_scale", t.loss_scale.initial);
  out += optimizer_toml(t);
  out += comm_toml(t.comm);
  return out;
}

std::string resolved_backend(const TrainSpec& t, int visible_gpus) {
  if (!t.backend.empty()) return t.backend;
  if (t.device == "auto") return visible_gpus > 0 ? "cuda" : "cpu";
  return t.device;  // "cpu" or "cuda": the backend of the same name
}

}  // namespace exatrain
