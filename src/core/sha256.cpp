#include "core/sha256.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <openssl/evp.h>

#include "core/check.hpp"
#include "core/fileio.hpp"

namespace exatrain {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  EXA_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
            "OpenSSL: cannot start a SHA-256 digest");
}

Sha256::~Sha256() {
  if (ctx_ && ctx_->md) EVP_MD_CTX_free(ctx_->md);
}

Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&& other) noexcept {
  if (this != &other) {
    if (ctx_ && ctx_->md) EVP_MD_CTX_free(ctx_->md);
    ctx_ = std::move(other.ctx_);
  }
  return *this;
}

void Sha256::update(const void* data, size_t bytes) {
  EXA_CHECK(EVP_DigestUpdate(ctx_->md, data, bytes) == 1, "OpenSSL: SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EXA_CHECK(EVP_DigestFinal_ex(ctx_->md, digest, &n) == 1 && n == 32, "OpenSSL: SHA-256 final failed");
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex_digest();
}

std::string sha256_file(const std::string& path) {
  int fd = open_regular_file(path);  // never blocks on a FIFO; names a non-file

  Sha256 h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      EXA_FAIL("cannot read {} to checksum it: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    h.update(buf.data(), size_t(n));
  }
  ::close(fd);
  return h.hex_digest();
}

}  // namespace exatrain
