// SHA-256 against the FIPS 180-4 example vectors and against the system's sha256sum.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/sha256.hpp"
#include "../test_util/temp_dir.hpp"

using exatrain::Sha256;
using exatrain::sha256_hex;

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, ChunkedUpdatesEqualOneShot) {
  std::string text;
  for (int i = 0; i < 5000; i++) text += char('a' + (i * 7) % 26);
  for (size_t chunk : {1u, 3u, 55u, 56u, 63u, 64u, 65u, 1000u}) {
    Sha256 h;
    for (size_t i = 0; i < text.size(); i += chunk) {
      h.update(text.data() + i, std::min(chunk, text.size() - i));
    }
    EXPECT_EQ(h.hex_digest(), sha256_hex(text)) << "chunk " << chunk;
  }
}

TEST(Sha256, FileMatchesSha256sum) {
  TempDir dir;
  std::string path = dir / "f.bin";
  std::ofstream(path, std::ios::binary) << std::string(3 << 20, 'x') << "tail";
  std::string cmd = "sha256sum " + path;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[65] = {};
  ASSERT_EQ(fread(buf, 1, 64, p), 64u);
  pclose(p);
  EXPECT_EQ(exatrain::sha256_file(path), std::string(buf));
}
