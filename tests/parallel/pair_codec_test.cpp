// The packed pairs of parallel/pair_codec.hpp: every format round-trips bit for bit, a message's
// length is what the format says (a hand-counted example, and about log2(1/density) + 2.5 bits a
// pair for Rice-coded gaps with signs), quantization rounds to bf16 or to sign x the segment's
// mean magnitude, and malformed input is refused with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/half_convert.hpp"
#include "core/check.hpp"
#include "parallel/pair_codec.hpp"
#include "plan/compression.hpp"

using namespace exatrain;
using namespace exatrain::parallel;

namespace {

struct Pairs {
  std::vector<int32_t> idx;
  std::vector<float> val;
};

// Random pairs at `density` inside each segment (none in some), values of both signs, no zeros.
Pairs random_pairs(const std::vector<PairSegment>& segs, double density, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  Pairs p;
  for (const PairSegment& s : segs)
    for (int64_t i = s.begin; i < s.end; i++)
      if (u(rng) < density) p.idx.push_back(int32_t(i)), p.val.push_back(float((u(rng) - 0.5) * 3.7 + (u(rng) < 0.5 ? 0.01 : -0.01)));
  return p;
}

const std::vector<PairSegment> kSegments = {{0, 3000}, {3000, 3001}, {5000, 70000}, {70000, 70010}, {80000, 200000}};

}  // namespace

TEST(PairCodec, EveryFormatRoundTripsBitForBit) {
  for (double density : {0.001, 0.01, 0.3, 1.0})
    for (PairIndices ix : {PairIndices::i32, PairIndices::rice})
      for (PairValues vx : {PairValues::f32, PairValues::bf16, PairValues::sign}) {
        Pairs p = random_pairs(kSegments, density, 7);
        quantize_pairs(p.idx.data(), p.val.data(), int64_t(p.idx.size()), kSegments, vx);
        const std::vector<uint32_t> w = encode_pairs(p.idx.data(), p.val.data(), int64_t(p.idx.size()), kSegments, {ix, vx});
        Pairs back;
        decode_pairs(w.data(), int64_t(w.size()), kSegments, {ix, vx}, back.idx, back.val);
        ASSERT_EQ(back.idx, p.idx) << density << " " << int(ix) << " " << int(vx);
        ASSERT_EQ(back.val.size(), p.val.size());
        for (size_t i = 0; i < p.val.size(); i++) {
          ASSERT_EQ(std::signbit(back.val[i]), std::signbit(p.val[i])) << i;
          ASSERT_EQ(back.val[i], p.val[i]) << i;
        }
      }
}

TEST(PairCodec, AHandCountedMessage) {
  // One segment [0, 16), pairs at 0, 5, 15: gaps 0, 4, 9. Rice b = 0: 3 + 13 = 16 bits; b = 1: 6 + 6 = 12;
  // b = 2: 9 + 3 = 12; b = 3: 12 + 1 = 13: the first shortest, b = 1. Signs: 32 (count) + 5 (b) + 32
  // (magnitude) + 12 (gaps) + 3 (signs) = 84 bits: 3 words. int32 indices with fp32 values: 32 + 3 x 64 = 7 words.
  const std::vector<PairSegment> seg = {{0, 16}};
  std::vector<int32_t> idx = {0, 5, 15};
  std::vector<float> val = {2.0f, -1.0f, 0.5f};
  EXPECT_EQ(encode_pairs(idx.data(), val.data(), 3, seg, {PairIndices::i32, PairValues::f32}).size(), 7u);
  quantize_pairs(idx.data(), val.data(), 3, seg, PairValues::sign);
  const float mean = (2.0f + 1.0f + 0.5f) / 3;
  EXPECT_EQ(val, (std::vector<float>{mean, -mean, mean}));
  const std::vector<uint32_t> w = encode_pairs(idx.data(), val.data(), 3, seg, {PairIndices::rice, PairValues::sign});
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(w[0], 3u);                  // the count
  EXPECT_EQ(w[1] & 31u, 1u);            // b
  // Bits 0-31 the count, 32-36 b, 37-68 the magnitude, 69-80 the gaps, 81-83 the signs. The gaps in
  // write order: d = 0 -> "0" (unary 0) "0" (low bit); 4 -> "110" "0"; 9 -> "11110" "1": 0,0,1,1,0,0,1,1,1,1,0,1
  // from bit 69 up, the integer 0b1011'1100'1100. Signs +, -, +: 0, 1, 0.
  const uint64_t tail = (uint64_t(w[2]) << 32 | w[1]) >> (69 - 32);
  EXPECT_EQ(tail & 0xfffu, 0b101111001100u);
  EXPECT_EQ((tail >> 12) & 7u, 0b010u);
  EXPECT_EQ(half_convert::float_of(uint32_t((uint64_t(w[2]) << 32 | w[1]) >> 5)), mean);
}

TEST(PairCodec, TheRiceParameterIsTheSmallestShortest) {
  // The encoder's b (bits 32-36 of a one-segment message) against every b from 0 to 30 counted by
  // brute force (c (b + 1) + sum of d >> b), the first shortest: geometric gaps at several
  // densities, equal gaps, a bimodal mix, one huge gap, a single pair, every index.
  std::vector<std::vector<int32_t>> cases;
  std::mt19937 rng(5);
  for (double density : {0.0005, 0.01, 0.2, 0.9}) {
    std::vector<int32_t> idx;
    std::uniform_real_distribution<double> u(0, 1);
    for (int32_t i = 0; i < 1000000 && idx.size() < 5000; i++)
      if (u(rng) < density) idx.push_back(i);
    cases.push_back(idx);
  }
  cases.push_back({});
  for (int32_t i = 0; i < 400; i++) cases.back().push_back(i * 64 + 63);  // every gap 63
  cases.push_back({});
  for (int32_t i = 0, at = 0; i < 300; i++) cases.back().push_back(at += (i % 3 == 0 ? 5000 : 2));  // bimodal
  cases.push_back({1, 2, 3, 1900000000});  // one huge gap
  cases.push_back({77});
  cases.push_back({});
  for (int32_t i = 0; i < 100; i++) cases.back().push_back(i);  // every index: b = 0
  for (const std::vector<int32_t>& idx : cases) {
    const int64_t c = int64_t(idx.size());
    int want = 0;
    uint64_t fewest = UINT64_MAX;
    for (int b = 0; b <= 30; b++) {
      uint64_t bits = uint64_t(c) * uint64_t(b + 1);
      int64_t prev = -1;
      for (int32_t i : idx) bits += uint64_t(i - prev - 1) >> b, prev = i;
      if (bits < fewest) fewest = bits, want = b;
    }
    std::vector<float> val(idx.size(), 1.0f);
    const std::vector<PairSegment> seg = {{0, 2000000000}};
    const std::vector<uint32_t> w = encode_pairs(idx.data(), val.data(), c, seg, {PairIndices::rice, PairValues::sign});
    ASSERT_GE(w.size(), 2u);
    EXPECT_EQ(int(w[1] & 31u), want) << c << " pairs, last index " << idx.back();
  }
}

TEST(PairCodec, RiceCodedSignsCostAboutLog2OfTheGapPlusTwoBits) {
  // At density d the gaps are about geometric with mean 1/d: a Rice code takes about log2(1/d) + 1.5
  // bits, the sign one more; int32 + fp32 take 64.
  for (double density : {0.001, 0.01, 0.1}) {
    const std::vector<PairSegment> seg = {{0, 1000000}};
    Pairs p = random_pairs(seg, density, 3);
    const int64_t k = int64_t(p.idx.size());
    quantize_pairs(p.idx.data(), p.val.data(), k, seg, PairValues::sign);
    const double bits = 32.0 * double(encode_pairs(p.idx.data(), p.val.data(), k, seg, {PairIndices::rice, PairValues::sign}).size());
    const double per_pair = bits / double(k), want = std::log2(1 / density) + 2.5;
    EXPECT_NEAR(per_pair, want, 0.5) << density;
  }
}

TEST(PairCodec, ThePlannersBitsPerPairAreWhatTheCodecWrites) {
  // plan::pair_bits (the planner's model of the wire) against encode_pairs on pairs drawn at
  // density d (geometric gaps): within 1% of the bits written, less the 69-bit header.
  CommSpec spec;
  spec.compressor = "topk", spec.values = "sign", spec.indices = "golomb";
  for (double density : {0.001, 0.01, 0.1}) {
    const std::vector<PairSegment> seg = {{0, 2000000}};
    Pairs p = random_pairs(seg, density, 11);
    const int64_t k = int64_t(p.idx.size());
    quantize_pairs(p.idx.data(), p.val.data(), k, seg, PairValues::sign);
    const double bits = 32.0 * double(encode_pairs(p.idx.data(), p.val.data(), k, seg, {PairIndices::rice, PairValues::sign}).size()) - 69;
    EXPECT_NEAR(bits / (plan::pair_bits(spec, double(k) / 2e6) * double(k)), 1.0, 0.01) << density;
  }
}

TEST(PairCodec, QuantizationRoundsToBf16AndToTheSegmentsMeanMagnitude) {
  const std::vector<PairSegment> segs = {{0, 10}, {10, 20}};
  std::vector<int32_t> idx = {1, 2, 3, 11, 12};
  std::vector<float> val = {1.0f, -3.0f, 0.0f, 1.00390625f + 1e-6f, -7.0f};
  std::vector<float> q = val;
  quantize_pairs(idx.data(), q.data(), 5, segs, PairValues::sign);
  EXPECT_EQ(q, (std::vector<float>{2.0f, -2.0f, 0.0f, (1.00390625f + 1e-6f + 7.0f) / 2, -(1.00390625f + 1e-6f + 7.0f) / 2}));
  q = val;
  quantize_pairs(idx.data(), q.data(), 5, segs, PairValues::bf16);
  // 1 + 2^-8 is the tie between the bf16 neighbours 1 and 1 + 2^-7; just above it rounds up.
  EXPECT_EQ(q, (std::vector<float>{1.0f, -3.0f, 0.0f, 1.0078125f, -7.0f}));
}

TEST(PairCodec, ZerosAreNotSentAndNonFiniteMagnitudesTravel) {
  // A top-k over an accumulator with fewer nonzeros than k selects zeros: they add nothing to the
  // sum, so they are left out (and the sign magnitude is the mean over the nonzeros).
  const std::vector<PairSegment> seg = {{0, 50}};
  std::vector<int32_t> idx = {3, 7, 20, 41};
  std::vector<float> val = {0.0f, -4.0f, 0.0f, 2.0f};
  quantize_pairs(idx.data(), val.data(), 4, seg, PairValues::sign);
  EXPECT_EQ(val, (std::vector<float>{0.0f, -3.0f, 0.0f, 3.0f}));
  for (PairValues vx : {PairValues::f32, PairValues::sign}) {
    const std::vector<uint32_t> w = encode_pairs(idx.data(), val.data(), 4, seg, {PairIndices::rice, vx});
    std::vector<int32_t> bi;
    std::vector<float> bv;
    decode_pairs(w.data(), int64_t(w.size()), seg, {PairIndices::rice, vx}, bi, bv);
    EXPECT_EQ(bi, (std::vector<int32_t>{7, 41}));
    EXPECT_EQ(bv, (std::vector<float>{-3.0f, 3.0f}));
  }
  // An inf in the accumulator makes the magnitude inf: it travels as it is (the NaN policy sees it).
  std::vector<float> inf = {1.0f, -INFINITY};
  std::vector<int32_t> two = {1, 2};
  quantize_pairs(two.data(), inf.data(), 2, seg, PairValues::sign);
  const std::vector<uint32_t> w = encode_pairs(two.data(), inf.data(), 2, seg, {PairIndices::rice, PairValues::sign});
  std::vector<int32_t> bi;
  std::vector<float> bv;
  decode_pairs(w.data(), int64_t(w.size()), seg, {PairIndices::rice, PairValues::sign}, bi, bv);
  ASSERT_EQ(bv.size(), 2u);
  EXPECT_TRUE(std::isinf(bv[0]) && bv[0] > 0 && std::isinf(bv[1]) && bv[1] < 0);
  // A bf16 NaN with a signalling payload (a received message's, fuzz/regressions/pairs) is a bf16
  // as it is: re-encoding it must not quieten it (the fuzzer's finding: it was refused).
  std::vector<float> nan = {half_convert::float_of(0xff810000u)};
  std::vector<int32_t> at = {9};
  const std::vector<uint32_t> wn = encode_pairs(at.data(), nan.data(), 1, seg, {PairIndices::rice, PairValues::bf16});
  bi.clear(), bv.clear();
  decode_pairs(wn.data(), int64_t(wn.size()), seg, {PairIndices::rice, PairValues::bf16}, bi, bv);
  ASSERT_EQ(bv.size(), 1u);
  EXPECT_EQ(half_convert::bits_of(bv[0]), 0xff810000u);
}

TEST(PairCodec, MalformedInputIsRefusedWithTheReason) {
  const std::vector<PairSegment> seg = {{0, 100}};
  std::vector<int32_t> idx = {5, 50};
  std::vector<float> val = {1.0f, -2.0f};
  auto refuses = [](auto f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refuses([&] { encode_pairs(idx.data(), val.data(), 2, seg, {PairIndices::rice, PairValues::sign}); }, "one magnitude per segment");
  std::vector<float> odd = {1.0f + 1e-7f, 2.0f};
  refuses([&] { encode_pairs(idx.data(), odd.data(), 2, seg, {PairIndices::rice, PairValues::bf16}); }, "is not a bf16");
  std::vector<int32_t> down = {50, 5};
  refuses([&] { encode_pairs(down.data(), val.data(), 2, seg, {PairIndices::rice, PairValues::f32}); }, "not ascending");
  std::vector<int32_t> out = {5, 150};
  refuses([&] { encode_pairs(out.data(), val.data(), 2, seg, {PairIndices::rice, PairValues::f32}); }, "outside every segment");
  const std::vector<uint32_t> w = encode_pairs(idx.data(), val.data(), 2, seg, {PairIndices::rice, PairValues::f32});
  std::vector<int32_t> bi;
  std::vector<float> bv;
  refuses([&] { decode_pairs(w.data(), int64_t(w.size()) - 1, seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "the message ends");
  std::vector<uint32_t> longer = w;
  longer.push_back(0);
  refuses([&] { decode_pairs(longer.data(), int64_t(longer.size()), seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "left over");
  std::vector<uint32_t> many = {1000u};
  refuses([&] { decode_pairs(many.data(), 1, seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "pairs in a segment of 100");
  refuses([] { pair_values_from("fp8"); }, "expected one of fp32, bf16, sign");
  // Crafted messages: count 1, b = 0, a gap of 200 ones in a segment of 100; the same with a
  // gap that ends inside the message but past the segment; a sign magnitude of -1; nonzero padding.
  std::vector<uint32_t> run = {1u, 0xffffffe0u, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  refuses([&] { decode_pairs(run.data(), int64_t(run.size()), seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "unary part runs past");
  // Bits 32-36 b = 7, bit 37 the unary "0", bits 38-44 the low bits 120: index 120 of a segment of 100.
  std::vector<uint32_t> past = {1u, 7u | (uint32_t(120) << 6), 0u};
  refuses([&] { decode_pairs(past.data(), int64_t(past.size()), seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "an index past its segment");
  std::vector<int32_t> one = {5};
  std::vector<float> minus = {-1.0f};
  std::vector<uint32_t> neg = encode_pairs(one.data(), minus.data(), 1, seg, {PairIndices::rice, PairValues::sign});
  neg[2] |= 1u << 4;  // the magnitude (bits 37-68): its sign bit, bit 68, is bit 4 of word 2
  refuses([&] { decode_pairs(neg.data(), int64_t(neg.size()), seg, {PairIndices::rice, PairValues::sign}, bi, bv); }, "magnitude is");
  std::vector<uint32_t> padded = encode_pairs(one.data(), minus.data(), 1, seg, {PairIndices::rice, PairValues::f32});
  padded.back() |= 0x80000000u;
  refuses([&] { decode_pairs(padded.data(), int64_t(padded.size()), seg, {PairIndices::rice, PairValues::f32}, bi, bv); }, "padding bits");
}
