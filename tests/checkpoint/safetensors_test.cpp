// safetensors: bf16 rounding, round trips, PyTorch reading our files (and us reading PyTorch's),
// slices assembled into global tensors, and clear errors for truncated or corrupt files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "checkpoint/safetensors.hpp"
#include "core/check.hpp"
#include "core/fileio.hpp"
#include "../test_util/temp_dir.hpp"
#include "../test_util/error_of.hpp"

using namespace exatrain;
using namespace exatrain::checkpoint;

namespace {

std::vector<float> pattern(int64_t n) {  // same values as safetensors_torch.py
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = float((i * 37) % 1001 - 500) / 7.0f;
  return v;
}

const std::vector<float> kSpecials = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f,
                                      INFINITY, -INFINITY, 3.4028234e38f, 1e-40f, -2.5e-39f,
                                      65504.0f, 0.1f, NAN};

std::string python_script() {
  return std::string(EXATRAIN_SOURCE_DIR) + "/tests/checkpoint/safetensors_torch.py";
}

}  // namespace

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie -> up
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(3.4028234e38f), 0x7f80);  // rounds past the largest bf16 to inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(0x3f81), 1.0078125f);
}

TEST(Safetensors, RoundTripF32AndBf16) {
  TempDir dir;
  std::vector<float> a = pattern(105), b = pattern(64 * 33);
  SafetensorsWriter w;
  w.add("a.f32", {3, 5, 7}, a.data());
  w.add("b.bf16", {64, 33}, b.data(), DType::BF16);
  w.add("c.bf16", {int64_t(kSpecials.size())}, kSpecials.data(), DType::BF16);
  w.set_metadata("format", "pt");
  std::string sum = write_safetensors(dir / "t.safetensors", w);
  EXPECT_EQ(sum, sha256_file(dir / "t.safetensors"));

  SafetensorsReader r(dir / "t.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.info("a.f32").shape, (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(r.read_f32("a.f32"), a);
  std::vector<float> back = r.read_f32("b.bf16");
  for (size_t i = 0; i < b.size(); i++) {
    EXPECT_EQ(back[i], bf16_to_float(float_to_bf16(b[i])));
    EXPECT_LE(std::fabs(back[i] - b[i]), std::fabs(b[i]) * 0x1p-8f);  // half an ulp of bf16
  }
  // The data section starts 8-byte aligned, as the format recommends.
  uint64_t n;
  std::string bytes = read_file_bytes(dir / "t.safetensors");
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, PyTorchReadsOurFile) {
  TempDir dir;
  std::vector<float> a = pattern(105), b = pattern(64 * 33);
  SafetensorsWriter w;
  w.add("a.f32", {3, 5, 7}, a.data());
  w.add("b.bf16", {64, 33}, b.data(), DType::BF16);
  w.add("c.bf16", {int64_t(kSpecials.size())}, kSpecials.data(), DType::BF16);
  w.set_metadata("format", "pt");
  write_safetensors(dir / "ours.safetensors", w);
  std::string cmd = "/usr/bin/python3 " + python_script() + " check " + (dir / "ours.safetensors");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(Safetensors, WeReadPyTorchsFile) {
  TempDir dir;
  std::string cmd = "/usr/bin/python3 " + python_script() + " write " + (dir / "py.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsReader r(dir / "py.safetensors");
  EXPECT_EQ(r.metadata().at("writer"), "python");
  std::vector<float> x = r.read_f32("x.f32");
  ASSERT_EQ(x.size(), 24u);
  for (int i = 0; i < 24; i++) EXPECT_EQ(x[size_t(i)], i * 0.5f - 3);
  EXPECT_EQ(r.info("y.bf16").dtype, DType::BF16);
  EXPECT_EQ(r.read_f32("y.bf16"),
            (std::vector<float>{1.5f, -2.25f, bf16_to_float(float_to_bf16(1e-3f)), 1000.0f}));
}

TEST(Safetensors, SlicesAssembleIntoTheGlobalTensor) {
  TempDir dir;
  // A [4, 6] weight split as tensor parallelism would: columns [0,2), [2,6) on two "ranks",
  // the second one further split by rows; plus a bias kept whole.
  std::vector<float> full = pattern(24), bias = pattern(6);
  auto slice = [&](int r0, int r1, int c0, int c1) {
    std::vector<float> s;
    for (int r = r0; r < r1; r++)
      for (int c = c0; c < c1; c++) s.push_back(full[size_t(r * 6 + c)]);
    return s;
  };
  std::vector<float> s0 = slice(0, 4, 0, 2), s1 = slice(0, 1, 2, 6), s2 = slice(1, 4, 2, 6);
  SafetensorsWriter w0, w1, w2;
  w0.add_slice("w", {4, 2}, s0.data(), DType::F32, {4, 6}, {0, 0});
  w0.add("bias", {6}, bias.data());
  w1.add_slice("w", {1, 4}, s1.data(), DType::F32, {4, 6}, {0, 2});
  w2.add_slice("w", {3, 4}, s2.data(), DType::F32, {4, 6}, {1, 2});
  write_safetensors(dir / "r0.safetensors", w0);
  write_safetensors(dir / "r1.safetensors", w1);
  write_safetensors(dir / "r2.safetensors", w2);
  SafetensorsReader r0(dir / "r0.safetensors"), r1(dir / "r1.safetensors"),
      r2(dir / "r2.safetensors");
  std::vector<int64_t> shape;
  EXPECT_EQ(assemble_global({&r0, &r1, &r2}, "w", &shape), full);
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(assemble_global({&r2, &r0, &r1}, "bias", &shape), bias);
  // A missing slice leaves a gap; the same slice twice overlaps: both are errors.
  EXPECT_NE(error_of([&] { assemble_global({&r0, &r1}, "w", nullptr); })
                .find("leave 12 of 24 elements of shape [4, 6] uncovered"),
            std::string::npos);
  EXPECT_NE(error_of([&] { assemble_global({&r0, &r1, &r2, &r2}, "w", nullptr); })
                .find("slices overlap"),
            std::string::npos);
}

TEST(Safetensors, TruncatedOrCorruptFilesAreNamed) {
  TempDir dir;
  std::vector<float> a = pattern(1000);
  SafetensorsWriter w;
  w.add("a", {1000}, a.data());
  std::string path = dir / "t.safetensors";
  write_safetensors(path, w);
  uint64_t size = file_size_or_throw(path);
  ASSERT_EQ(::truncate(path.c_str(), off_t(size - 10)), 0);
  std::string err = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(err.find("safetensors file " + path + " is truncated"), std::string::npos) << err;
  EXPECT_NE(err.find(std::to_string(size - 10) + " bytes, the header describes " +
                     std::to_string(size)),
            std::string::npos)
      << err;
  ASSERT_EQ(::truncate(path.c_str(), 20), 0);  // cut inside the header
  err = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(err.find(path + " is truncated: the header needs"), std::string::npos) << err;
  {
    std::ofstream(path, std::ios::binary) << std::string("\x10\0\0\0\0\0\0\0{not json}xxxxxx", 24);
  }
  err = error_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(err.find(path + ": header is not valid JSON"), std::string::npos) << err;
  // A refused file leaves no descriptor open (the fuzzer ran out of them after 20,000 refusals).
  auto open_fds = [] {
    int n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd"); it != std::filesystem::directory_iterator(); ++it) n++;
    return n;
  };
  const int before = open_fds();
  for (int i = 0; i < 100; i++) EXPECT_NE(error_of([&] { SafetensorsReader r(path); }), "");
  EXPECT_EQ(open_fds(), before);
}

TEST(Safetensors, ShapeMismatchSaysDifferentModel) {
  TempDir dir;
  std::vector<float> a = pattern(12);
  SafetensorsWriter w;
  w.add("wte", {3, 4}, a.data());
  write_safetensors(dir / "m.safetensors", w);
  SafetensorsReader r(dir / "m.safetensors");
  EXPECT_NO_THROW(r.expect_shape("wte", {3, 4}));
  std::string err = error_of([&] { r.expect_shape("wte", {4, 4}); });
  EXPECT_NE(err.find("tensor \"wte\" has shape [3, 4], expected [4, 4] (a checkpoint of a "
                     "different model?)"),
            std::string::npos)
      << err;
  err = error_of([&] { r.expect_shape("lm_head", {4, 4}); });
  EXPECT_NE(err.find("has no tensor \"lm_head\""), std::string::npos) << err;
}

// A file written piece by piece at data_ranges() offsets after file_prefix() (as the ranks of a
// sharded save do) is byte for byte the file write() makes of the same tensors, and
// read_f32_range reads any element range back.
TEST(Safetensors, DeclaredLayoutMatchesWrittenFile) {
  TempDir dir;
  const std::vector<float> a = pattern(15), b = pattern(8);
  SafetensorsWriter full, declared;
  full.add("b", {2, 4}, b.data());
  full.add("a", {3, 5}, a.data());
  declared.declare("a", {3, 5});
  declared.declare("b", {2, 4});
  for (SafetensorsWriter* w : {&full, &declared}) w->set_metadata("format", "pt");
  write_safetensors(dir / "full.safetensors", full);
  const std::string ref = read_file_bytes(dir / "full.safetensors");

  std::string pieced = declared.file_prefix();
  const auto ranges = declared.data_ranges();
  EXPECT_EQ(ranges.at("a"), (std::pair<uint64_t, uint64_t>{0, 60}));  // name order: a, then b
  EXPECT_EQ(ranges.at("b"), (std::pair<uint64_t, uint64_t>{60, 92}));
  pieced.resize(pieced.size() + 92);
  for (auto [name, v] : {std::pair{"a", &a}, std::pair{"b", &b}})
    std::memcpy(pieced.data() + declared.file_prefix().size() + ranges.at(name).first, v->data(), v->size() * 4);
  EXPECT_EQ(pieced, ref);

  SafetensorsReader r(dir / "full.safetensors");
  std::vector<float> part(4);
  r.read_f32_range("a", 6, 4, part.data());
  EXPECT_EQ(part, std::vector<float>(a.begin() + 6, a.begin() + 10));
  EXPECT_NE(error_of([&] { r.read_f32_range("a", 12, 4, part.data()); }).find("elements [12, 16) of tensor a are "
                                                                             "outside its 15 elements"),
            std::string::npos);
  EXPECT_NE(error_of([&] { OutputFile out(dir / "x"); declared.write(out); }).find("declared without data"),
            std::string::npos);
}
