// SHA-256 (FIPS 180-4), used for the checksums in data and checkpoint manifests.
// Hand-written (~100 lines) because the build links no crypto library and the manifests must
// be checkable with the standard `sha256sum` tool; tested against FIPS vectors and sha256sum.
// Uses the x86 SHA extensions when the processor has them (checked at run time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace exatrain {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // finishes the hash; 64 lowercase hex characters
  // Tests: use the portable code even where the x86 SHA extensions exist (not thread-safe).
  static void force_portable(bool on);

 private:
  void compress(const uint8_t* block);  // one 64-byte block
  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);
std::string sha256_file(const std::string& path);  // streams the file

}  // namespace exatrain
