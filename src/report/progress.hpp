// Training progress on the terminal: a one-line bar redrawn in place (step, loss, tokens/s, MFU,
// ETA) when stdout is a terminal, plain log lines otherwise (CI logs, `| tee`, batch jobs).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace exatrain::report {

struct StepStats {
  int64_t step = 0;           // 1-based, the step just finished
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, mfu = 0;
  double step_seconds = 0;
};

class Progress {
 public:
  // `interactive` defaults to whether `out` is a terminal.
  Progress(int64_t total_steps, std::FILE* out = stdout, int interactive = -1);
  void update(const StepStats& s);
  // A message that must not be overwritten by the bar (validation loss, checkpoint saved, ...).
  void note(const std::string& line);
  void finish();

  static std::string format_eta(double seconds);
  std::string bar_line(const StepStats& s, double eta_seconds) const;
  std::string plain_line(const StepStats& s, double eta_seconds) const;

 private:
  int64_t total_;
  std::FILE* out_;
  bool interactive_;
  bool bar_shown_ = false;
  double ema_step_seconds_ = 0;  // smoothed step time for a steady ETA
};

}  // namespace exatrain::report
