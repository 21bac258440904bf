#include "plan/validate.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "catalog/device.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "plan/flops.hpp"

namespace exatrain::plan {

std::vector<CsvRow> read_csv(const std::string& path) {
  EXA_CHECK(std::filesystem::exists(path), "cannot open validation file {}", path);
  // A regular file of at most 64 MiB (the published runs are ~100 KB); never a FIFO or device.
  std::string text = read_file_bytes(path, uint64_t(64) << 20);
  std::vector<std::vector<std::string>> records(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') { field += '"'; ++i; }
      else if (c == '"') quoted = false;
      else field += c;
    } else if (c == '"') quoted = true;
    else if (c == ',') { records.back().push_back(field); field.clear(); }
    else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      records.back().push_back(field);
      field.clear();
      records.emplace_back();
    } else field += c;
  }
  if (!field.empty() || !records.back().empty()) records.back().push_back(field);
  while (!records.empty() && (records.back().empty() ||
                              (records.back().size() == 1 && records.back()[0].empty())))
    records.pop_back();
  EXA_CHECK(!records.empty(), "{}: empty CSV", path);
  const auto& header = records[0];
  std::vector<CsvRow> rows;
  for (size_t r = 1; r < records.size(); ++r) {
    EXA_CHECK(records[r].size() == header.size(), "{}: row {} has {} fields, header has {}", path,
              r, records[r].size(), header.size());
    CsvRow row;
    for (size_t c = 0; c < header.size(); ++c) row[header[c]] = records[r][c];
    rows.push_back(row);
  }
  return rows;
}

namespace {

bool has(const std::string& s, const std::string& what) {
  std::string a = s, b = what;
  std::transform(a.begin(), a.end(), a.begin(), ::tolower);
  std::transform(b.begin(), b.end(), b.begin(), ::tolower);
  return a.find(b) != std::string::npos;
}
std::optional<double> number(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || it->second.empty()) return std::nullopt;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (!std::isfinite(v)) return std::nullopt;  // "nan", "inf", 1e999: no figure
    return v;
  } catch (...) {
    return std::nullopt;
  }
}
// A cell that holds a count: a whole number in [lo, 2^40] (so that casts and products stay
// defined); nullopt when absent or not such a number: the row is then skipped, never guessed.
std::optional<int64_t> whole(const std::string& text, int64_t lo) {
  CsvRow one{{"v", text}};
  auto v = number(one, "v");
  if (!v || *v != std::floor(*v) || *v < double(lo) || *v > double(int64_t(1) << 40)) return std::nullopt;
  return int64_t(*v);
}
std::optional<int64_t> whole(const CsvRow& row, const std::string& key, int64_t lo = 1) {
  auto it = row.find(key);
  return it == row.end() ? std::nullopt : whole(it->second, lo);
}
// Why a count cell is unusable: "KEY not stated" (empty) or "KEY = 'TEXT' is not a whole number".
std::string unusable(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || it->second.empty()) return key + " not stated";
  return fmt::format("{} = '{}' is not a whole number in range", key, it->second.substr(0, 40));
}
std::string cell(const CsvRow& row, const std::string& key) {
  auto it = row.find(key);
  return it == row.end() ? "" : it->second;
}

// The source's author or repository (first word), for grouping.
std::string source_key(const std::string& source) {
  std::string s = source.substr(0, source.find(' '));
  return s;
}

}  // namespace

RunCase case_from_row(const CsvRow& row, int index) {
  RunCase rc;
  rc.row = index;
  rc.source = source_key(cell(row, "source"));
  rc.model_name = cell(row, "model_name");
  const std::string notes = cell(row, "notes");
  auto skip = [&](std::string why) { rc.skip_reason = std::move(why); return rc; };

  // ---- model ----
  for (const char* k : {"layers", "hidden", "heads", "seq_len"})
    if (!whole(row, k)) return skip(unusable(row, k));
  // BLOOM rows leave the cell empty but their notes state the ~250k vocabulary of the BLOOM
  // tokenizer, 250,680 (stated in the production-run row of the same source).
  bool bloom_vocab = !whole(row, "vocab") && has(notes, "250k vocab");
  if (!whole(row, "vocab") && !bloom_vocab) return skip(unusable(row, "vocab"));
  ModelSpec& m = rc.model;
  m.layers = *whole(row, "layers");
  m.hidden = *whole(row, "hidden");
  m.heads = *whole(row, "heads");
  m.seq_len = *whole(row, "seq_len");
  m.vocab = bloom_vocab ? 250680 : *whole(row, "vocab");
  m.ffn_hidden = whole(row, "ffn_hidden").value_or(4 * m.hidden);
  m.kv_heads = m.heads;
  bool llama = has(rc.model_name, "llama");
  if (llama) {  // Llama 3 shapes: SwiGLU, RMSNorm, RoPE, 8 kv heads (notes: "GQA 8 KV heads")
    m.activation = Activation::swiglu;
    m.norm = Norm::rmsnorm;
    m.position = Position::rope;
    m.tie_embeddings = false;
    m.kv_heads = 8;
    m.bias = false;
  }
  if (has(rc.source, "mosaicml")) {  // MPT: ALiBi (no position table), no biases; GELU 4h
    m.position = Position::rope;
    m.bias = false;
  }

  // ---- measurement basis ----
  auto gpus = whole(row, "gpus");
  if (!gpus) return skip(unusable(row, "gpus"));
  auto gbs = whole(row, "global_batch_seqs");
  if (!gbs) return skip(unusable(row, "global_batch_seqs"));

  // ---- device and machine ----
  const std::string gpu = cell(row, "gpu_type");
  std::string device;
  std::string cluster;
  if (has(gpu, "H200")) { device = "h200"; cluster = "eos"; }
  else if (has(gpu, "H100 96GB")) { device = "h100-96g"; cluster = "eos"; }
  else if (has(gpu, "H100")) { device = "h100-sxm"; cluster = "eos"; }
  else if (has(gpu, "A100-40GB")) { device = "a100-40g"; cluster = "selene"; }
  else if (has(gpu, "Jean Zay")) { device = "a100-80g"; cluster = "jean-zay-a100"; }
  else if (has(gpu, "A100") && (has(gpu, "80GB") || has(gpu, "Selene"))) {
    device = "a100-80g"; cluster = "selene";
  } else return skip(fmt::format("gpu_type '{}' not in the catalog", gpu));
  if (has(gpu, "80GB per MS blog")) return skip("device memory unresolved (40 or 80 GB)");
  rc.machine = find_cluster(cluster);
  rc.machine.device = device;
  // The row's own network figure where it states one (per node).
  if (has(gpu, "1600 Gbps")) rc.machine.inter_node_bw_gbs = 200;
  if (has(gpu, "400 Gb/s RDMA per GPU") || has(gpu, "400Gb/s CX-7 per GPU"))
    rc.machine.inter_node_bw_gbs = 400;
  if (auto g = whole(row, "gpus_per_node")) rc.machine.gpus_per_node = *g;

  // ---- plan ----
  Plan& p = rc.plan;
  p.gpus = *gpus;
  p.global_batch = *gbs;
  if (!whole(row, "tp") || !whole(row, "pp")) return skip(unusable(row, whole(row, "tp") ? "pp" : "tp"));
  p.tp = *whole(row, "tp");
  p.pp = *whole(row, "pp");
  if (!cell(row, "cp").empty() && !whole(row, "cp")) return skip(unusable(row, "cp"));
  p.cp = whole(row, "cp").value_or(1);
  if (p.tp > (int64_t(1) << 20) || p.pp > (int64_t(1) << 20) || p.cp > (int64_t(1) << 20))
    return skip("tp, pp or cp above 2^20");
  p.dp = whole(row, "dp") ? *whole(row, "dp") : p.gpus / (p.tp * p.pp * p.cp);
  if (!whole(row, "micro_batch")) return skip(unusable(row, "micro_batch"));
  p.micro_batch = *whole(row, "micro_batch");
  std::string zero = cell(row, "zero_stage");
  if (zero.empty()) return skip("zero_stage not stated");
  if (has(zero, "SHARD_GRAD_OP")) p.zero = 2;
  else if (has(zero, "FSDP") || has(zero, "ZeRO-3")) p.zero = 3;
  else if (auto z = whole(zero, 0); z && *z <= 3) p.zero = *z;
  else return skip(fmt::format("zero_stage '{}' not understood", zero));
  std::string vp = cell(row, "virtual_pipeline_stages");
  if (!vp.empty()) {
    if (!whole(vp, 1)) return skip(fmt::format("virtual_pipeline_stages '{}' not a whole number >= 1", vp));
    p.vp = *whole(vp, 1);
  }
  else if (p.pp == 1) p.vp = 1;
  else if (has(notes, "interleaved")) return skip("interleaved schedule without vp");
  else p.vp = 1;
  // Megatron-DeepSpeed's "type:transformer|embedding" partition counts each embedding as a layer
  // slot: the first and last stages get one transformer layer fewer (vp 1: one stage per rank).
  if (p.pp > 1 && p.vp == 1 && has(notes, "transformer|embedding") && (m.layers + 2) % p.pp == 0) {
    int64_t per = (m.layers + 2) / p.pp;
    p.layers_per_stage.assign(p.pp, per);
    p.layers_per_stage.front() -= 1;
    p.layers_per_stage.back() -= 1;
  }
  // Partition not stated and the layers don't divide: assume Megatron-style balanced uneven
  // stages (floor(layers/pp) each, the remainder on the middle ranks; plan.hpp) and say so.
  if (p.pp > 1 && p.vp == 1 && p.layers_per_stage.empty() && m.layers % p.pp != 0) {
    p.layers_per_stage = balanced_layers(m.layers, p.pp);
    rc.assumption = fmt::format("stages not stated; assumed balanced [{}]",
                                fmt::join(p.layers_per_stage, ","));
  }
  std::string sp = cell(row, "seq_parallel");
  if (sp == "yes") p.seq_parallel = true;
  else if (sp == "no" || p.tp == 1) p.seq_parallel = false;
  // torchtitan's tensor-parallel plan always shards norms along the sequence (framework default).
  else if (has(rc.source, "torchtitan")) p.seq_parallel = true;
  else return skip("seq_parallel not stated with tp > 1");
  std::string rec = cell(row, "recompute");
  if (rec.rfind("none", 0) == 0) p.recompute = Recompute::none;
  else if (rec.rfind("full", 0) == 0) p.recompute = Recompute::full;
  else if (rec.rfind("selective", 0) == 0) p.recompute = Recompute::selective;
  else return skip("recompute not stated");
  std::string prec = cell(row, "precision");
  if (prec.empty()) return skip("precision not stated");
  if (has(prec, "fp8") || has(prec, "float8")) p.precision = Precision::fp8;
  else if (has(prec, "bf16")) p.precision = Precision::bf16;
  else if (has(prec, "16")) p.precision = Precision::fp16;
  else return skip(fmt::format("precision '{}' not understood", prec));
  // Software before FlashAttention (mid 2022) stored and streamed the attention scores.
  for (const char* old : {"Narayanan", "Korthikanti", "Smith", "bigscience-workshop/bigscience", "Zhang"})
    if (rc.source == old) p.flash_attention = false;
  std::string err = plan_error(m, p);
  if (!err.empty()) return skip("plan as stated is invalid: " + err);

  // ---- memory validation points ----
  if (has(notes, "OUT OF MEMORY")) rc.measured_oom = true;
  for (const char* key : {"peak memory ", "memory ", "embedding-stage nodes) = "}) {
    auto pos = notes.find(key);
    if (pos == std::string::npos) continue;
    try {
      const double gib = std::stod(notes.substr(pos + std::string(key).size()));
      if (std::isfinite(gib) && gib > 0) rc.measured_memory_gib = gib;
    } catch (...) {
    }
    if (rc.measured_memory_gib) break;
  }

  // ---- the measured step time ----
  if (auto st = number(row, "step_time_s")) {
    rc.measured_step_s = *st;
    rc.measured_basis = "step_time_s";
  } else if (auto tf = number(row, "measured_tflops_per_gpu")) {
    double flops = 0;
    if (has(notes, "INCLUDING the activation-recompute") || has(notes, "hardware TFLOPs") ||
        has(notes, "same FLOP convention as Table 1")) {
      flops = hardware_flops_per_step(m, p.global_batch, Recompute::full);
      rc.measured_basis = "hardware TFLOP/s (96 B s l h^2 formula)";
    } else if (has(notes, "model FLOPs") || has(notes, "MFU = TF/")) {
      flops = model_flops_per_step(m, p.global_batch);
      rc.measured_basis = "model TFLOP/s";
    } else return skip("TFLOP/s counting convention not stated");
    rc.measured_step_s = flops / (*tf * 1e12 * double(p.gpus));
  } else if (auto mfu = number(row, "measured_mfu_pct")) {
    const Device& d = find_device(device);
    rc.measured_step_s = model_flops_per_step(m, p.global_batch) /
                         (*mfu / 100 * d.peak_tflops(p.precision) * 1e12 * double(p.gpus));
    rc.measured_basis = "MFU";
  } else if (rc.measured_oom || rc.measured_memory_gib) {
    rc.memory_only = true;
  } else return skip("no measurement (step time, TFLOP/s or MFU)");
  return rc;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  std::vector<double> ra = ranks(a), rb = ranks(b);
  double n = double(a.size());
  double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - ma) * (rb[i] - mb);
    va += (ra[i] - ma) * (ra[i] - ma);
    vb += (rb[i] - mb) * (rb[i] - mb);
  }
  if (va == 0 || vb == 0) return 0;
  return cov / std::sqrt(va * vb);
}

ValidationReport validate_runs(const std::string& csv_path, const Calibration& cal) {
  ValidationReport rep;
  std::vector<CsvRow> rows = read_csv(csv_path);
  for (size_t i = 0; i < rows.size(); ++i) {
    RunCase rc = case_from_row(rows[i], int(i) + 1);
    if (!rc.skip_reason.empty()) { rep.skipped.push_back(rc); continue; }
    if (rc.measured_memory_gib || rc.measured_oom) {
      Prediction pr = predict(rc.model, rc.machine, rc.plan, cal);
      rep.memory.push_back({rc, pr.memory.total / double(1 << 30), pr.fits});
    }
    if (rc.memory_only) continue;
    CaseResult res;
    res.run = rc;
    res.predicted_step_s = predict(rc.model, rc.machine, rc.plan, cal).step_time_s;
    res.error = (res.predicted_step_s - rc.measured_step_s) / rc.measured_step_s;
    rep.results.push_back(res);
  }
  int with_value = 0;
  for (const MemoryResult& mr : rep.memory) {
    if (mr.run.measured_oom) {
      ++rep.oom_rows;
      if (!mr.predicted_fits) ++rep.oom_predicted;
    } else if (mr.run.measured_memory_gib) {
      rep.memory_mape_pct += 100 * std::fabs(mr.predicted_gib / *mr.run.measured_memory_gib - 1);
      ++with_value;
    }
  }
  if (with_value) rep.memory_mape_pct /= with_value;
  std::map<std::string, std::vector<double>> by_source;
  double sum = 0;
  for (const CaseResult& r : rep.results) {
    by_source[r.run.source].push_back(r.error);
    sum += std::fabs(r.error);
  }
  rep.mape_pct = rep.results.empty() ? 0 : 100 * sum / double(rep.results.size());
  for (const auto& [src, errs] : by_source) {
    SourceStats s;
    s.source = src;
    s.rows = int(errs.size());
    for (double e : errs) { s.mape_pct += 100 * std::fabs(e); s.bias_pct += 100 * e; }
    s.mape_pct /= s.rows;
    s.bias_pct /= s.rows;
    rep.sources.push_back(s);
  }
  // Ranking: within runs of one model (layers x hidden) on one GPU count and device (any
  // sequence length, batch or plan), order by throughput (tokens/s), measured vs predicted.
  std::map<std::string, std::vector<const CaseResult*>> groups;
  for (const CaseResult& r : rep.results) {
    const auto& m = r.run.model;
    std::string key = fmt::format("{} {}x{} on {} {}", r.run.source, m.layers, m.hidden,
                                  r.run.plan.gpus, r.run.machine.device);
    groups[key].push_back(&r);
  }
  double rho_sum = 0;
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    std::vector<double> meas, pred;
    for (const CaseResult* r : members) {
      double tokens = double(r->run.plan.global_batch) * r->run.model.seq_len;
      meas.push_back(tokens / r->run.measured_step_s);
      pred.push_back(tokens / r->predicted_step_s);
    }
    GroupRank g{key, int(members.size()), spearman(meas, pred)};
    rho_sum += g.rho;
    rep.groups.push_back(g);
  }
  rep.mean_rho = rep.groups.empty() ? 0 : rho_sum / double(rep.groups.size());
  return rep;
}

std::string format_report(const ValidationReport& rep, bool per_row) {
  std::string s;
  if (per_row) {
    s += fmt::format("{:>4} {:<30} {:<28} {:<58} {:>10} {:>10} {:>7}\n", "row", "source", "model",
                     "plan", "measured", "predicted", "err%");
    for (const CaseResult& r : rep.results)
      s += fmt::format("{:>4} {:<30.30} {:<28.28} {:<58.58} {:>10.4g} {:>10.4g} {:>+7.1f}\n",
                       r.run.row, r.run.source, r.run.model_name, plan_summary(r.run.plan),
                       r.run.measured_step_s, r.predicted_step_s, 100 * r.error);
    for (const CaseResult& r : rep.results)
      if (!r.run.assumption.empty())
        s += fmt::format("{:>4} assumption: {}\n", r.run.row, r.run.assumption);
    s += "skipped rows:\n";
    for (const RunCase& rc : rep.skipped)
      s += fmt::format("{:>4} {:<30.30} {:<28.28} {}\n", rc.row, rc.source, rc.model_name,
                       rc.skip_reason);
  }
  if (per_row) {
    s += "memory per GPU (most loaded rank), GiB:\n";
    for (const MemoryResult& mr : rep.memory)
      s += fmt::format("{:>4} {:<28.28} {:<58.58} measured {:>6} predicted {:>6.1f}{}\n",
                       mr.run.row, mr.run.model_name, plan_summary(mr.run.plan),
                       mr.run.measured_oom ? std::string("OOM")
                                           : fmt::format("{:.1f}", *mr.run.measured_memory_gib),
                       mr.predicted_gib, mr.predicted_fits ? "" : " (does not fit)");
  }
  s += fmt::format("{:<32} {:>5} {:>9} {:>9}\n", "source", "rows", "MAPE%", "bias%");
  for (const SourceStats& st : rep.sources)
    s += fmt::format("{:<32} {:>5} {:>9.1f} {:>+9.1f}\n", st.source, st.rows, st.mape_pct,
                     st.bias_pct);
  s += fmt::format("ranking within groups (Spearman rho of tokens/s, groups of >= 2 runs):\n");
  for (const GroupRank& g : rep.groups)
    s += fmt::format("  {:<64} n={:<3} rho={:+.2f}\n", g.group, g.rows, g.rho);
  s += fmt::format("mean rho={:.2f} over {} groups; {} rows skipped (missing cells)\n",
                   rep.mean_rho, rep.groups.size(), rep.skipped.size());
  s += fmt::format("memory: {} rows with a measured peak, MAPE {:.1f}%; {} of {} out-of-memory "
                   "runs predicted not to fit\n",
                   rep.memory.size() - rep.oom_rows, rep.memory_mape_pct, rep.oom_predicted,
                   rep.oom_rows);
  s += fmt::format("mape_pct={:.2f} rows={}\n", rep.mape_pct, rep.results.size());
  return s;
}

}  // namespace exatrain::plan
