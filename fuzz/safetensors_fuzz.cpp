// The safetensors reader and slice assembly (src/checkpoint/safetensors.cpp), the path every
// checkpoint load and `export` takes: header length, JSON header, dtypes, shapes, data offsets,
// the exatrain.slices metadata (global shapes and offsets), then every tensor read and assembled.
#include <string>

#include "checkpoint/safetensors.hpp"
#include "harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      exatrain::fuzz::write_scratch("in.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  exatrain::fuzz::expect_clear_errors([&] {
    exatrain::checkpoint::SafetensorsReader r(path);
    for (const auto& entry : r.tensors()) {
      const std::string& name = entry.first;  // (clang 14 cannot capture structured bindings)
      const exatrain::checkpoint::TensorInfo& info = entry.second;
      exatrain::fuzz::expect_clear_errors([&] {
        const std::vector<float> v = r.read_f32(name);
        exatrain::fuzz::require(int64_t(v.size()) == info.numel(), "read_f32 size");
        std::vector<int64_t> g;
        const std::vector<float> whole = exatrain::checkpoint::assemble_global({&r}, name, &g);
        exatrain::fuzz::require(g == info.global_shape, "assembled shape");
        int64_t first = -1;
        exatrain::checkpoint::count_nonfinite(whole.data(), int64_t(whole.size()), &first);
      });
    }
  });
  return 0;
}
