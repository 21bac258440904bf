// How a rank's sparse (index, value) pairs travel: packed into 32-bit words with Golomb-Rice coded
// index gaps and values as fp32, bf16 or signs with one magnitude per segment ([comm] indices and
// values; docs/compression.md, "Packing the pairs"). The sparsifiers send k pairs of 64 bits each
// as (int32, fp32); at 1% density the gaps between successive indices average 100, which a Rice
// code writes in about 8 bits (Golomb 1966; Rice 1979), and sparse ternary compression (Sattler et
// al. 2019, "Robust and communication-efficient federated learning from non-iid data", STC) sends
// each selected value as its sign and one mean magnitude per tensor, 1 bit: 9 bits a pair instead
// of 64.
//
// The codec itself is lossless: quantize_pairs rounds the values first (bf16, or sign x the
// segment's mean |v|), the compressor keeps what the rounding lost in its error-feedback residual,
// and encode_pairs / decode_pairs reproduce the rounded values bit for bit (every rank decodes
// the same bits, so the replicas stay identical).
//
// A message is, for each segment in order: its pair count (32 bits), then if any: the Rice
// parameter b (5 bits, indices = golomb), the magnitude (32 bits, values = sign), the indices
// (golomb: the gaps d = index - previous - 1, previous starting at the segment's begin - 1, as
// d >> b ones, a zero and the b low bits of d; int32: 32 bits each), then the values (32, 16 or 1
// bit each). Bits are written from the least significant bit of each word.
//
// Owns: the wire format of packed pairs. May use: backend/half_convert.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace exatrain::parallel {

enum class PairValues { f32, bf16, sign };
enum class PairIndices { i32, rice };
PairValues pair_values_from(const std::string& name);    // "fp32" | "bf16" | "sign"
PairIndices pair_indices_from(const std::string& name);  // "int32" | "golomb"
struct PairFormat {
  PairIndices indices = PairIndices::i32;
  PairValues values = PairValues::f32;
};

// One range [begin, end) of the index space whose pairs share a Rice parameter and (signs) a
// magnitude: a compressor's piece of a bucket (one parameter entry's part).
struct PairSegment {
  int64_t begin = 0, end = 0;
};

// Rounds val[k] in place to what the wire carries: bf16 (round to nearest even), or sign(v) x the
// mean |v| of the segment's pairs (0 stays 0). idx[k] ascending, each inside one of `segments`
// (ascending, disjoint). fp32: nothing.
void quantize_pairs(const int32_t* idx, float* val, int64_t k, const std::vector<PairSegment>& segments,
                    PairValues values);

// Packs the (already quantized) pairs, leaving out those whose value is 0 (they add nothing to a
// sum); refuses values the format cannot carry exactly, and pairs
// outside the segments or not ascending.
std::vector<uint32_t> encode_pairs(const int32_t* idx, const float* val, int64_t k,
                                   const std::vector<PairSegment>& segments, PairFormat format);

// Unpacks one message of `words` words, appending its pairs to idx and val; refuses a message that
// ends early, has bits left over, or an index outside its segment.
void decode_pairs(const uint32_t* words, int64_t n_words, const std::vector<PairSegment>& segments,
                  PairFormat format, std::vector<int32_t>& idx, std::vector<float>& val);

}  // namespace exatrain::parallel
