// The checked readers' helpers: regular files only (a FIFO is refused without blocking), bounded
// reads, lines in bounded pieces that never split a UTF-8 character, directories that must be
// writable, plain file names, overflow-checked element counts.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "core/checked.hpp"
#include "core/fileio.hpp"
#include "../test_util/error_of.hpp"
#include "../test_util/temp_dir.hpp"

using namespace exatrain;

TEST(FileIo, AFifoIsRefusedWithoutBlocking) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  // With no writer, a blocking open would wait forever: the test would time out.
  EXPECT_EQ(error_of([&] { read_file_bytes(dir / "fifo"); }).find(dir / "fifo is a FIFO (named pipe), expected a "
                                                                   "regular file"), 0u);
  EXPECT_NE(error_of([&] { MappedFile m(dir / "fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { file_size_or_throw(dir / "fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { LineReader r(dir / "fifo"); }).find("is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] { read_file_bytes(dir.path); }).find("is a directory, expected a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_file_bytes("/dev/zero"); }).find("is a character device"), std::string::npos);
}

TEST(FileIo, ReadsAreBounded) {
  TempDir dir;
  std::ofstream(dir / "f") << std::string(100, 'x');
  EXPECT_EQ(read_file_bytes(dir / "f", 100).size(), 100u);
  EXPECT_NE(error_of([&] { read_file_bytes(dir / "f", 99); }).find("is 100 bytes, more than the 99 bytes expected"),
            std::string::npos);
}

TEST(FileIo, LongLinesComeInPiecesBetweenUtf8Characters) {
  TempDir dir;
  // 'é' is 2 bytes, '€' 3: a cut every 8 bytes would split them.
  const std::string line1 = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac\xe2\x82\xac\xe2\x82\xac end";
  std::ofstream(dir / "t.txt", std::ios::binary) << line1 << "\nshort\n\nlast without newline";
  LineReader r(dir / "t.txt", 8);
  std::vector<std::pair<std::string, bool>> pieces;
  std::string piece;
  bool end = false;
  while (r.next(piece, &end)) pieces.push_back({piece, end});
  std::string joined;
  size_t i = 0;
  for (; i < pieces.size() && !pieces[i].second; i++) joined += pieces[i].first;
  ASSERT_LT(i, pieces.size());
  joined += pieces[i].first;
  EXPECT_EQ(joined, line1);
  for (size_t k = 0; k <= i; k++) {
    EXPECT_LE(pieces[k].first.size(), 8u);
    // No piece ends inside a multi-byte character: its last lead byte is complete.
    const std::string& p = pieces[k].first;
    for (size_t b = p.size() >= 3 ? p.size() - 3 : 0; b < p.size(); b++) {
      unsigned char c = static_cast<unsigned char>(p[b]);
      size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      EXPECT_LE(b + len, p.size()) << "piece " << k << " splits a character";
    }
  }
  ASSERT_EQ(pieces.size(), i + 6);
  EXPECT_EQ(pieces[i + 1], std::make_pair(std::string("short"), true));
  EXPECT_EQ(pieces[i + 2], std::make_pair(std::string(""), true));
  EXPECT_EQ(pieces[i + 3], std::make_pair(std::string("last wit"), false));
  EXPECT_EQ(pieces[i + 4], std::make_pair(std::string("hout new"), false));
  EXPECT_EQ(pieces[i + 5], std::make_pair(std::string("line"), true));  // the input's end ends it
}

TEST(FileIo, ALineOfExactlyOnePieceEndsCleanly) {
  TempDir dir;
  std::ofstream(dir / "t.txt", std::ios::binary) << "12345678";  // no newline, exactly 8 bytes
  LineReader r(dir / "t.txt", 8);
  std::string piece;
  bool end = true;
  ASSERT_TRUE(r.next(piece, &end));
  EXPECT_EQ(piece, "12345678");
  EXPECT_FALSE(end);
  ASSERT_TRUE(r.next(piece, &end));  // the line ends with the input: an empty last piece
  EXPECT_EQ(piece, "");
  EXPECT_TRUE(end);
  EXPECT_FALSE(r.next(piece, &end));
}

TEST(FileIo, DirectoriesMustBeWritable) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  EXPECT_EQ(error_of([&] { make_directories(dir / "a/b", "--out"); }), "");
  EXPECT_NE(error_of([&] { make_directories(dir / "file", "export --out"); })
                .find("export --out = \"" + (dir / "file") + "\" exists but is not a directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_directories(dir / "file/sub", "[train] run_dir"); })
                .find("[train] run_dir = \"" + (dir / "file/sub") + "\": cannot create the directory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_directories("", "[train] run_dir"); }).find("[train] run_dir is empty"),
            std::string::npos);
}

TEST(FileIo, PlainFileNames) {
  for (const char* ok : {"model.safetensors", "shard_00000.bin", "a..b"}) EXPECT_TRUE(is_plain_file_name(ok)) << ok;
  for (const char* bad : {"", ".", "..", "../x", "a/b", "/etc/passwd", "a\nb"}) EXPECT_FALSE(is_plain_file_name(bad)) << bad;
  EXPECT_FALSE(is_plain_file_name(std::string("a\0b", 3)));
}

TEST(Checked, ElementCountsNeverWrap) {
  EXPECT_EQ(checked_numel({2, 3}), 6);
  EXPECT_EQ(checked_numel({}), 1);
  EXPECT_EQ(checked_numel({0, int64_t(1) << 62, int64_t(1) << 62}), 0);
  EXPECT_FALSE(checked_numel({int64_t(1) << 32, int64_t(1) << 32}).has_value());
  EXPECT_FALSE(checked_numel({-2, -2}).has_value());
  EXPECT_FALSE(checked_numel({1024, 1024}, 1000).has_value());
  EXPECT_FALSE(mul_u64(uint64_t(1) << 63, 2).has_value());
  EXPECT_FALSE(add_u64(UINT64_MAX, 1).has_value());
}
