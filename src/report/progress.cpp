#include "report/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace exatrain::report {

Progress::Progress(int64_t total_steps, std::FILE* out, int interactive)
    : total_(std::max<int64_t>(total_steps, 1)), out_(out) {
  interactive_ = interactive >= 0 ? interactive != 0 : isatty(fileno(out)) != 0;
}

std::string Progress::format_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  auto t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{:02}:{:02}", t / 60, t % 60);
}

std::string Progress::bar_line(const StepStats& s, double eta) const {
  const int width = 24;
  int filled = static_cast<int>(width * std::min<double>(1.0, double(s.step) / total_));
  std::string bar(filled, '#');
  bar += std::string(width - filled, '.');
  return fmt::format("[{}] {}/{} loss {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}", bar, s.step, total_,
                     s.loss, s.tokens_per_s, 100 * s.mfu, format_eta(eta));
}

std::string Progress::plain_line(const StepStats& s, double eta) const {
  return fmt::format("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad_norm {:.3f} | {:.0f} tok/s | MFU {:.1f}% | "
                     "{:.0f} ms | ETA {}",
                     s.step, total_, s.loss, s.lr, s.grad_norm, s.tokens_per_s, 100 * s.mfu, 1e3 * s.step_seconds,
                     format_eta(eta));
}

void Progress::update(const StepStats& s) {
  ema_step_seconds_ = ema_step_seconds_ == 0 ? s.step_seconds : 0.9 * ema_step_seconds_ + 0.1 * s.step_seconds;
  double eta = ema_step_seconds_ * double(total_ - s.step);
  if (interactive_) {
    fmt::print(out_, "\r\033[K{}", bar_line(s, eta));  // \033[K clears the rest of the line
    bar_shown_ = true;
  } else {
    fmt::print(out_, "{}\n", plain_line(s, eta));
  }
  std::fflush(out_);
}

void Progress::note(const std::string& line) {
  if (interactive_ && bar_shown_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", line);
  bar_shown_ = false;
  std::fflush(out_);
}

void Progress::finish() {
  if (interactive_ && bar_shown_) fmt::print(out_, "\n");
  bar_shown_ = false;
  std::fflush(out_);
}

}  // namespace exatrain::report
