// What the optimizer reference drivers (muon_driver.cpp, optim_driver.cpp) share: the four
// entries they update and the raw float files they write for the Python side.
//   h.0.attn.q_proj.weight [8, 24]  matrix, m < n (weight decay)
//   h.0.mlp.fc2.weight     [24, 8]  matrix, m > n (weight decay)
//   h.0.ln_1.weight        [24]     norm (no weight decay; a 1-D entry)
//   wte.weight             [16, 8]  embedding (weight decay)
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "model/layout.hpp"

namespace exatrain::reference {

inline void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(sizeof(float) * v.size()));
  EXA_CHECK(f.good(), "reference driver: cannot write {}", path);
}

inline ParamLayout four_entries() {
  ParamLayout l;
  auto add = [&](const char* name, std::vector<int64_t> shape, ParamRole role, bool decay) {
    ParamInfo p;
    p.name = name, p.global_shape = shape, p.shard_shape = shape, p.role = role, p.decay = decay;
    l.add(p);
  };
  add("h.0.attn.q_proj.weight", {8, 24}, ParamRole::matrix, true);
  add("h.0.mlp.fc2.weight", {24, 8}, ParamRole::matrix, true);
  add("h.0.ln_1.weight", {24}, ParamRole::norm, false);
  add("wte.weight", {16, 8}, ParamRole::embedding, true);
  return l;
}

}  // namespace exatrain::reference
