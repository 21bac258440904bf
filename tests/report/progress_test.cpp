// The progress display: a redrawn bar on a terminal, plain lines elsewhere.
#include <gtest/gtest.h>

#include <cstdio>

#include "report/progress.hpp"

using namespace exatrain::report;

namespace {
std::string run(int interactive) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  {
    Progress p(4, f, interactive);
    for (int i = 1; i <= 2; ++i) p.update({i, 5.0 - i, 1e-3, 1.0, 1000.0, 0.25, 2.0});
    p.note("val_loss 3.5");
    p.finish();
  }
  std::fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}
}  // namespace

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::string s = run(0);
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(s.find("\033"), std::string::npos);
  EXPECT_NE(s.find("step      1/4 | loss 4.0000 | lr 1.000e-03 | grad_norm 1.000 | 1000 tok/s | MFU 25.0% | 2000 ms | ETA 00:06"),
            std::string::npos) << s;
  EXPECT_NE(s.find("ETA 00:04\nval_loss 3.5\n"), std::string::npos) << s;  // step 2: 2 steps left, EMA 2 s
}

TEST(Progress, BarRedrawsInPlaceOnATerminal) {
  std::string s = run(1);
  EXPECT_NE(s.find("\r\033[K[######..................] 1/4 loss 4.0000"), std::string::npos) << s;
  EXPECT_NE(s.find("\r\033[K[############............] 2/4 loss 3.0000"), std::string::npos) << s;
  EXPECT_NE(s.find("\r\033[Kval_loss 3.5\n"), std::string::npos) << s;  // the note clears the bar first
}

TEST(Progress, EtaFormatting) {
  EXPECT_EQ(Progress::format_eta(59.4), "00:59");
  EXPECT_EQ(Progress::format_eta(3725), "1:02:05");
  EXPECT_EQ(Progress::format_eta(-1), "--:--");
}
