// splitmix64 (Steele, Lea & Flood 2014): a tiny, fast, well-mixed 64-bit generator. Used where
// a stream of seeded random numbers must be identical everywhere (data shuffling, reservoir
// sampling, split-independent weight init); std::mt19937_64 would do too, but its output is not
// specified for the distributions we need, and this keeps the exact sequence in our hands.
#pragma once
#include <cstdint>

namespace exatrain {

// The mixing function: a bijective hash of x.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The generator: advances `state` and returns the next number.
inline uint64_t splitmix64(uint64_t& state) { return splitmix64_mix(state += 0x9e3779b97f4a7c15ull); }

}  // namespace exatrain
