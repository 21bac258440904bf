#include "parallel/pair_codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "backend/half_convert.hpp"
#include "core/check.hpp"

namespace exatrain::parallel {
namespace {

using half_convert::bf16_to_f32;
using half_convert::bits_of;
using half_convert::f32_to_bf16;
using half_convert::float_of;

// Bits appended from the least significant end of 32-bit words.
class BitWriter {
 public:
  void put(uint64_t v, int bits) {  // bits <= 32
    acc_ |= (v & ((uint64_t(1) << bits) - 1)) << fill_;
    fill_ += bits;
    if (fill_ >= 32) words_.push_back(uint32_t(acc_)), acc_ >>= 32, fill_ -= 32;
  }
  void ones(uint64_t n) {  // n ones
    for (; n >= 32; n -= 32) put(0xffffffffu, 32);
    if (n) put((uint64_t(1) << n) - 1, int(n));
  }
  std::vector<uint32_t> finish() {
    if (fill_ > 0) words_.push_back(uint32_t(acc_));
    acc_ = 0, fill_ = 0;
    return std::move(words_);
  }

 private:
  std::vector<uint32_t> words_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint32_t* w, int64_t n) : w_(w), n_bits_(n * 32) {}
  uint32_t get(int bits) {  // bits <= 32
    EXA_CHECK(at_ + bits <= n_bits_, "packed pairs: the message ends at bit {} where {} more bits were expected",
              n_bits_, at_ + bits - n_bits_);
    uint64_t v = 0;
    for (int got = 0; got < bits;) {
      const int64_t word = at_ / 32, off = at_ % 32;
      const int take = std::min<int>(bits - got, 32 - int(off));
      v |= ((uint64_t(w_[word]) >> off) & ((uint64_t(1) << take) - 1)) << got;
      got += take, at_ += take;
    }
    return uint32_t(v);
  }
  // Ones up to the next zero (consumed), a word at a time; more than `limit` ones are refused.
  uint64_t unary(uint64_t limit) {
    uint64_t q = 0;
    for (;;) {
      EXA_CHECK(at_ < n_bits_, "packed pairs: the message ends inside a gap's unary part");
      const int avail = 32 - int(at_ % 32);
      const int ones = std::countr_one(w_[at_ / 32] >> (at_ % 32));  // stops at the zeros shifted in, at avail
      q += uint64_t(std::min(ones, avail)), at_ += std::min(ones, avail);
      EXA_CHECK(q <= limit, "packed pairs: a gap's unary part runs past its segment (over {} ones)", limit);
      if (ones < avail) return at_++, q;
    }
  }
  // The padding after the last bit read: zeros, and less than a word.
  void check_end() const {
    EXA_CHECK(n_bits_ - at_ < 32, "packed pairs: {} bits left over after the last segment", n_bits_ - at_);
    if (at_ % 32 != 0)
      EXA_CHECK((uint64_t(w_[at_ / 32]) >> (at_ % 32)) == 0, "packed pairs: the last word's padding bits are not zero");
  }
 private:
  const uint32_t* w_;
  int64_t n_bits_, at_ = 0;
};


// The pairs of segment s: [first, last) of idx (ascending), checked to lie inside it.
int64_t segment_end(const int32_t* idx, int64_t k, int64_t first, const PairSegment& s) {
  int64_t last = first;
  while (last < k && idx[last] < s.end) {
    EXA_CHECK(idx[last] >= s.begin && (last == first || idx[last] > idx[last - 1]),
              "packed pairs: index {} (pair {}) is not ascending, or lies between segments, at segment [{}, {})", idx[last], last, s.begin,
              s.end);
    last++;
  }
  return last;
}

// The Rice parameter with the shortest code for these gaps: b costs f(b) = c (b + 1) + sum d >> b.
// f is convex in b (f(b) - f(b + 1) = sum ceil((d >> b) / 2) - c, which never grows with b), so a
// walk from b = log2 of the mean gap to the first b whose right neighbour is no shorter and whose
// left one is longer finds the smallest best b in a few passes over the gaps, not 31.
int best_rice(const int32_t* idx, int64_t c, int64_t begin) {
  auto bits = [&](int b) {
    uint64_t sum = uint64_t(c) * uint64_t(b + 1);
    int64_t prev = begin - 1;
    for (int64_t i = 0; i < c; i++) sum += uint64_t(idx[i] - prev - 1) >> b, prev = idx[i];
    return sum;
  };
  const uint64_t mean = uint64_t(idx[c - 1] - (begin - 1)) / uint64_t(c);  // about the mean gap + 1
  int b = 0;
  while (b < 30 && (uint64_t(2) << b) <= mean) b++;
  uint64_t here = bits(b);
  for (uint64_t right; b < 30 && (right = bits(b + 1)) < here;) b++, here = right;
  for (uint64_t left; b > 0 && (left = bits(b - 1)) <= here;) b--, here = left;
  return b;
}

// The magnitude every value of a sign-coded segment carries (they were quantized to it), compared
// bit for bit: a non-finite one (an inf or NaN gradient) travels as it is, for the NaN policy to see.
float common_magnitude(const float* val, int64_t c) {
  const uint32_t mag = c > 0 ? bits_of(std::fabs(val[0])) : 0;
  for (int64_t i = 0; i < c; i++)
    EXA_CHECK(bits_of(std::fabs(val[i])) == mag,
              "packed pairs: values = \"sign\" carries one magnitude per segment; pair {} has {} where {} was sent "
              "(quantize_pairs first)", i, val[i], float_of(mag));
  return float_of(mag);
}

void put_value(BitWriter& w, float v, PairValues values) {
  if (values == PairValues::f32) return w.put(bits_of(v), 32);
  if (values == PairValues::bf16) {
    // A float is a bf16 exactly when its low 16 bits are 0 (NaN payloads included).
    EXA_CHECK((bits_of(v) & 0xffffu) == 0, "packed pairs: value {} is not a bf16 (quantize_pairs first)", v);
    return w.put(bits_of(v) >> 16, 16);
  }
  w.put(std::signbit(v) ? 1 : 0, 1);
}

}  // namespace

PairValues pair_values_from(const std::string& name) {
  if (name == "fp32") return PairValues::f32;
  if (name == "bf16") return PairValues::bf16;
  if (name == "sign") return PairValues::sign;
  EXA_FAIL("[comm] values = \"{}\": expected one of fp32, bf16, sign", name);
}

PairIndices pair_indices_from(const std::string& name) {
  if (name == "int32") return PairIndices::i32;
  if (name == "golomb") return PairIndices::rice;
  EXA_FAIL("[comm] indices = \"{}\": expected one of int32, golomb", name);
}

void quantize_pairs(const int32_t* idx, float* val, int64_t k, const std::vector<PairSegment>& segments,
                    PairValues values) {
  if (values == PairValues::f32) return;
  if (values == PairValues::bf16) {
    for (int64_t i = 0; i < k; i++) val[i] = bf16_to_f32(f32_to_bf16(val[i]));
    return;
  }
  int64_t first = 0;
  for (const PairSegment& s : segments) {
    const int64_t last = segment_end(idx, k, first, s);
    double sum = 0;
    int64_t nonzero = 0;
    for (int64_t i = first; i < last; i++) sum += std::fabs(double(val[i])), nonzero += val[i] != 0;
    const float mag = nonzero > 0 ? float(sum / double(nonzero)) : 0.0f;
    for (int64_t i = first; i < last; i++) val[i] = val[i] == 0 ? 0.0f : std::copysign(mag, val[i]);
    first = last;
  }
  EXA_CHECK(first == k, "packed pairs: pair {} (index {}) lies outside every segment", first, first < k ? idx[first] : -1);
}

std::vector<uint32_t> encode_pairs(const int32_t* idx, const float* val, int64_t k,
                                   const std::vector<PairSegment>& segments, PairFormat format) {
  const PairValues values = format.values;
  const bool rice = format.indices == PairIndices::rice;
  BitWriter w;
  int64_t first = 0;
  std::vector<int32_t> ids;  // the segment's pairs with a nonzero value: a zero adds nothing to the sum
  std::vector<float> vs;
  for (const PairSegment& s : segments) {
    const int64_t last = segment_end(idx, k, first, s);
    ids.clear(), vs.clear();
    for (int64_t i = first; i < last; i++)
      if (val[i] != 0) ids.push_back(idx[i]), vs.push_back(val[i]);
    const int64_t c = int64_t(ids.size());
    w.put(uint64_t(c), 32);
    if (c > 0) {
      const int b = rice ? best_rice(ids.data(), c, s.begin) : 0;
      if (rice) w.put(uint64_t(b), 5);
      if (values == PairValues::sign) w.put(bits_of(common_magnitude(vs.data(), c)), 32);
      int64_t prev = s.begin - 1;
      for (int64_t i = 0; i < c; i++) {
        const uint64_t d = uint64_t(ids[size_t(i)] - prev - 1);
        if (!rice) w.put(uint32_t(ids[size_t(i)]), 32);
        if (rice) w.ones(d >> b), w.put(0, 1);
        if (rice && b > 0) w.put(d, b);
        prev = ids[size_t(i)];
      }
      for (int64_t i = 0; i < c; i++) put_value(w, vs[size_t(i)], values);
    }
    first = last;
  }
  EXA_CHECK(first == k, "packed pairs: pair {} (index {}) lies outside every segment", first, first < k ? idx[first] : -1);
  return w.finish();
}

void decode_pairs(const uint32_t* words, int64_t n_words, const std::vector<PairSegment>& segments,
                  PairFormat format, std::vector<int32_t>& idx, std::vector<float>& val) {
  const PairValues values = format.values;
  const bool rice = format.indices == PairIndices::rice;
  BitReader r(words, n_words);
  for (const PairSegment& s : segments) {
    const int64_t c = r.get(32);
    EXA_CHECK(c <= s.end - s.begin, "packed pairs: {} pairs in a segment of {} elements", c, s.end - s.begin);
    if (c == 0) continue;
    const int b = rice ? int(r.get(5)) : 0;
    const float mag = values == PairValues::sign ? float_of(r.get(32)) : 0.0f;
    EXA_CHECK(values != PairValues::sign || (!std::signbit(mag) && mag != 0),
              "packed pairs: a sign-coded segment's magnitude is {} (expected > 0)", mag);
    int64_t prev = s.begin - 1;
    for (int64_t i = 0; i < c; i++) {
      uint64_t d = 0;
      if (rice) {
        const uint64_t q = r.unary(uint64_t(s.end - prev) >> b);  // read the quotient first, then the low bits
        d = (q << b) | (b > 0 ? r.get(b) : 0);
      } else {
        d = uint64_t(int64_t(r.get(32)) - prev - 1);
      }
      EXA_CHECK(d < uint64_t(s.end - prev - 1), "packed pairs: an index past its segment [{}, {})", s.begin, s.end);
      prev += int64_t(d) + 1;
      idx.push_back(int32_t(prev));
    }
    for (int64_t i = 0; i < c; i++) {
      if (values == PairValues::f32) val.push_back(float_of(r.get(32)));
      else if (values == PairValues::bf16) val.push_back(bf16_to_f32(uint16_t(r.get(16))));
      else val.push_back(r.get(1) ? -mag : mag);
    }
  }
  r.check_end();
}

}  // namespace exatrain::parallel
