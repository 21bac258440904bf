// SHA-256 (FIPS 180-4) for the checksums in data and checkpoint manifests, through OpenSSL's
// libcrypto (EVP interface; it uses the processor's SHA extensions where present). The digests
// are the ones `sha256sum` prints, so a manifest can be checked by hand.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace exatrain {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // finishes the hash; 64 lowercase hex characters

 private:
  struct Ctx;  // OpenSSL's EVP_MD_CTX, kept out of this header
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(std::string_view bytes);
std::string sha256_file(const std::string& path);  // streams the file

}  // namespace exatrain
