// The packed pairs a rank receives from every other rank (src/parallel/pair_codec.hpp,
// decode_pairs): the first byte picks the format (bit 0: Rice-coded or int32 indices; the rest
// mod 3: fp32, bf16 or sign values), the rest is the message's 32-bit words. An accepted message
// must hold ascending indices inside its segments, and its nonzero pairs must survive encode and
// decode bit for bit.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/half_convert.hpp"
#include "harness.hpp"
#include "parallel/pair_codec.hpp"

using namespace exatrain::parallel;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::vector<PairSegment> segments = {{0, 100}, {100, 5000}, {5000, 5001}, {6000, 70000}};
  const PairFormat format{data[0] & 1 ? PairIndices::rice : PairIndices::i32, PairValues((data[0] >> 1) % 3)};
  std::vector<uint32_t> words((size - 1) / 4);
  if (!words.empty()) std::memcpy(words.data(), data + 1, words.size() * 4);
  std::vector<int32_t> idx;
  std::vector<float> val;
  bool accepted = false;
  exatrain::fuzz::expect_clear_errors([&] {
    decode_pairs(words.data(), int64_t(words.size()), segments, format, idx, val);
    accepted = true;
  });
  if (!accepted) return 0;
  exatrain::fuzz::require(idx.size() == val.size(), "as many values as indices");
  for (size_t i = 0; i < idx.size(); i++) {
    const bool inside = std::any_of(segments.begin(), segments.end(),
                                    [&](const PairSegment& s) { return idx[i] >= s.begin && idx[i] < s.end; });
    exatrain::fuzz::require(inside && (i == 0 || idx[i] > idx[i - 1]), "indices ascending inside the segments");
  }
  std::vector<int32_t> nz_idx;
  std::vector<float> nz_val;
  for (size_t i = 0; i < idx.size(); i++)
    if (val[i] != 0) nz_idx.push_back(idx[i]), nz_val.push_back(val[i]);
  const std::vector<uint32_t> again = encode_pairs(idx.data(), val.data(), int64_t(idx.size()), segments, format);
  std::vector<int32_t> idx2;
  std::vector<float> val2;
  decode_pairs(again.data(), int64_t(again.size()), segments, format, idx2, val2);
  bool same = idx2 == nz_idx && val2.size() == nz_val.size();
  for (size_t i = 0; same && i < val2.size(); i++)
    same = exatrain::half_convert::bits_of(val2[i]) == exatrain::half_convert::bits_of(nz_val[i]);
  exatrain::fuzz::require(same, "decode(encode(pairs)) = the nonzero pairs, bit for bit");
  return 0;
}
