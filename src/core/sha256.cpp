#include "core/sha256.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/check.hpp"

namespace exatrain {

namespace {
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

bool g_force_portable = false;

#if defined(__x86_64__)
// One 64-byte block with the x86 SHA extensions (SHA-NI: Intel since Ice Lake/Goldmont, AMD
// since Zen), about 4x the portable code: checkpoint verification reads every byte it wrote.
// The layout follows Intel's reference: state kept as ABEF/CDGH, 4 rounds per group of the
// message schedule, sha256msg1/msg2 extending it.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_shani(uint32_t state[8],
                                                                 const uint8_t* block) {
  const __m128i kByteSwap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);              // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);        // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);     // CDGH
  const __m128i abef_save = state0, cdgh_save = state1;
  __m128i w[16];  // w[i] = message words 4i .. 4i+3
  for (int i = 0; i < 16; i++) {
    if (i < 4) {
      w[i] = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * i)),
                              kByteSwap);
    } else {
      __m128i w7 = _mm_alignr_epi8(w[i - 1], w[i - 2], 4);  // words t-7
      w[i] = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(w[i - 4], w[i - 3]), w7),
                                  w[i - 1]);
    }
    __m128i msg = _mm_add_epi32(w[i], _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kRound[4 * i])));
    state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
    msg = _mm_shuffle_epi32(msg, 0x0E);
    state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
  }
  state0 = _mm_add_epi32(state0, abef_save);
  state1 = _mm_add_epi32(state1, cdgh_save);
  tmp = _mm_shuffle_epi32(state0, 0x1B);        // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);     // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);  // A B C D in memory order
  state1 = _mm_alignr_epi8(state1, tmp, 8);     // E F G H in memory order
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), state1);
}

bool have_shani() {
  static const bool yes = __builtin_cpu_supports("sha") && __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif
}  // namespace

void Sha256::force_portable(bool on) { g_force_portable = on; }

Sha256::Sha256() {
  const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(state_, init, sizeof(init));
}

void Sha256::compress(const uint8_t* block) {
#if defined(__x86_64__)
  if (!g_force_portable && have_shani()) {
    compress_shani(state_, block);
    return;
  }
#endif
  uint32_t w[64];
  for (int i = 0; i < 16; i++) {
    w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) |
           (uint32_t(block[4 * i + 2]) << 8) | uint32_t(block[4 * i + 3]);
  }
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; i++) {
    uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + kRound[i] + w[i];
    uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  state_[0] += a; state_[1] += b; state_[2] += c; state_[3] += d;
  state_[4] += e; state_[5] += f; state_[6] += g; state_[7] += h;
}

void Sha256::update(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  if (buffered_ > 0) {  // fill the partial block first
    size_t take = std::min(bytes, 64 - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take; p += take; bytes -= take;
    if (buffered_ < 64) return;
    compress(buffer_);
    buffered_ = 0;
  }
  for (; bytes >= 64; p += 64, bytes -= 64) compress(p);
  std::memcpy(buffer_, p, bytes);
  buffered_ = bytes;
}

std::string Sha256::hex_digest() {
  // Padding: 0x80, zeros, then the message length in bits as a big-endian uint64.
  uint64_t bits = total_bytes_ * 8;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (buffered_ < 56) ? 56 - buffered_ : 120 - buffered_;
  update(pad, pad_len);
  uint8_t len_be[8];
  for (int i = 0; i < 8; i++) len_be[i] = uint8_t(bits >> (56 - 8 * i));
  update(len_be, 8);
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 8; j++) out[8 * i + j] = hex[(state_[i] >> (28 - 4 * j)) & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex_digest();
}

std::string sha256_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXA_SYSCHECK(fd >= 0, "cannot open {} to checksum it", path);
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
