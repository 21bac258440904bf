#include "model/layout.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "core/splitmix.hpp"

namespace exatrain {


int64_t ParamLayout::add(ParamInfo info) {
  int64_t n = 1;
  for (int64_t d : info.shard_shape) n *= d;
  info.numel = n;
  info.offset = total_;
  total_ += n;
  entries_.push_back(std::move(info));
  return entries_.back().offset;
}

void ParamLayout::mark_tied_copy(int64_t offset) {
  for (ParamInfo& e : entries_)
    if (e.offset == offset) e.tied_copy = true;
}

const ParamInfo& ParamLayout::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return e;
  EXA_FAIL("parameter '{}' is not in this model's layout ({} parameters)", name, entries_.size());
}

const char* to_string(ParamRole r) {
  switch (r) {
    case ParamRole::matrix: return "matrix";
    case ParamRole::embedding: return "embedding";
    case ParamRole::head: return "head";
    case ParamRole::norm: return "norm";
    case ParamRole::bias: return "bias";
  }
  return "?";
}

namespace {

// Stateless: hash of x + the golden-ratio increment (one splitmix64 step from state x).
uint64_t splitmix_hash(uint64_t x) { return splitmix64_mix(x + 0x9e3779b97f4a7c15ULL); }

uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Standard normal from a counter-based generator (Box-Muller on two hashed uniforms).
float normal_at(uint64_t key, uint64_t index) {
  uint64_t a = splitmix_hash(key ^ splitmix_hash(2 * index));
  uint64_t b = splitmix_hash(key ^ splitmix_hash(2 * index + 1));
  double u1 = (double(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);  // (0, 1)
  double u2 = double(b >> 11) * (1.0 / 9007199254740992.0);          // [0, 1)
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

void init_param_range(const ParamInfo& p, uint64_t seed, int64_t first, int64_t count,
                      float* out) {
  if (p.init_std <= 0) {
    for (int64_t i = 0; i < count; i++) out[i] = p.init_value;
    return;
  }
  const uint64_t key = splitmix_hash(seed) ^ hash_name(p.name);
  // Shard element (r, c) -> global flat index; 1-D tensors are treated as [n, 1].
  const int64_t cols = p.numel / p.shard_shape[0];
  const int64_t global_cols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; i++) {
    int64_t r = (first + i) / cols, c = (first + i) % cols;
    if (p.split_dim == 0) r += p.shard_start;
    if (p.split_dim == 1) c += p.shard_start;
    out[i] = p.init_std * normal_at(key, uint64_t(r * global_cols + c));
  }
}

void init_params(const ParamLayout& layout, uint64_t seed, float* arena) {
  for (const ParamInfo& p : layout.entries()) init_param_range(p, seed, 0, p.numel, arena + p.offset);
}

}  // namespace exatrain
