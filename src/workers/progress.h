// Progress output for long work.
//
// On a terminal: one line refreshed in place (carriage return), e.g.
//   epoch 3/10  step 1412/4690  41230 samples/s  loss 0.3127  ETA 0:42
// Otherwise (a pipe, a log file, CI): the same fields as plain lines, one per
// refresh period, so logs stay readable. Lines that must stay (end of an
// epoch) are printed with Line().
//
// Thread safety: used from the coordinating thread only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

namespace shardwild {

struct ProgressState {
  int epoch = 0;             // 1-based
  int epochs = 0;
  int64_t step = 0;          // steps done in this epoch (all workers)
  int64_t steps = 0;         // steps in this epoch
  double samples_per_s = 0;
  double loss = 0;           // mean training loss so far this epoch
  double eta_s = 0;          // seconds left in the whole run
};

class ProgressReporter {
 public:
  // `out` is not owned. `interactive` selects the refreshing line.
  ProgressReporter(FILE* out, bool interactive) : out_(out), interactive_(interactive) {}
  // Interactive when `out` is a terminal.
  static ProgressReporter ForStream(FILE* out);
  // A reporter that prints nothing.
  static ProgressReporter Silent() { return ProgressReporter(nullptr, false); }
  // A reporter whose output goes to `sink` instead of a FILE, in the same
  // pieces it would write there (a refreshing line starts with "\r\033[K",
  // a plain one ends with "\n"): the Python API prints through sys.stdout.
  // Called on the coordinating thread.
  static ProgressReporter ForSink(std::function<void(const std::string&)> sink, bool interactive) {
    ProgressReporter r(nullptr, interactive);
    r.sink_ = std::move(sink);
    return r;
  }

  void Update(const ProgressState& s);
  void Line(const std::string& text);

  static std::string FormatDuration(double seconds);

 private:
  // Writes `text` to out_ or sink_ and flushes.
  void Write(const std::string& text);

  FILE* out_;
  std::function<void(const std::string&)> sink_;  // ForSink; then out_ is null
  bool interactive_;
  bool dirty_ = false;  // a refreshing line is on screen
};

}  // namespace shardwild
