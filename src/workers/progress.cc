#include "workers/progress.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/str_format.h"

namespace shardwild {

ProgressReporter ProgressReporter::ForStream(FILE* out) { return ProgressReporter(out, isatty(fileno(out)) != 0); }

std::string ProgressReporter::FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

void ProgressReporter::Write(const std::string& text) {
  if (sink_) {
    sink_(text);
    return;
  }
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
}

void ProgressReporter::Update(const ProgressState& s) {
  if (!out_ && !sink_) return;
  const std::string text =
      absl::StrFormat("epoch %d/%d  step %d/%d  %.0f samples/s  loss %.4f  ETA %s", s.epoch, s.epochs, s.step,
                      s.steps, s.samples_per_s, s.loss, FormatDuration(s.eta_s));
  if (interactive_) {
    Write("\r\033[K" + text);
    dirty_ = true;
  } else {
    Write(text + "\n");
  }
}

void ProgressReporter::Line(const std::string& text) {
  if (!out_ && !sink_) return;
  Write((dirty_ ? "\r\033[K" : "") + text + "\n");
  dirty_ = false;
}

}  // namespace shardwild
