#include "workers/progress.h"

#include <stdio.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Captures what a reporter writes, through a memory stream.
class Capture {
 public:
  Capture() : out_(open_memstream(&buf_, &size_)) {}
  ~Capture() {
    if (out_) std::fclose(out_);
    std::free(buf_);
  }
  FILE* stream() { return out_; }
  std::string text() {
    std::fflush(out_);
    return std::string(buf_, size_);
  }

 private:
  char* buf_ = nullptr;
  size_t size_ = 0;
  FILE* out_;
};

ProgressState State() {
  ProgressState s;
  s.epoch = 3;
  s.epochs = 10;
  s.step = 1412;
  s.steps = 4690;
  s.samples_per_s = 41230;
  s.loss = 0.3127;
  s.eta_s = 42;
  return s;
}

TEST(ProgressTest, PlainLinesWhenNotInteractive) {
  Capture cap;
  ASSERT_NE(cap.stream(), nullptr);
  ProgressReporter p(cap.stream(), /*interactive=*/false);
  p.Update(State());
  p.Update(State());
  p.Line("epoch 3/10: done");
  const std::string text = cap.text();
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(text.find('\033'), std::string::npos) << text;
  const std::string line = "epoch 3/10  step 1412/4690  41230 samples/s  loss 0.3127  ETA 0:42\n";
  EXPECT_EQ(text, line + line + "epoch 3/10: done\n");
}

TEST(ProgressTest, RefreshingLineWhenInteractive) {
  Capture cap;
  ASSERT_NE(cap.stream(), nullptr);
  ProgressReporter p(cap.stream(), /*interactive=*/true);
  p.Update(State());
  p.Line("kept");
  p.Line("kept too");
  const std::string text = cap.text();
  EXPECT_EQ(text, "\r\033[Kepoch 3/10  step 1412/4690  41230 samples/s  loss 0.3127  ETA 0:42\r\033[Kkept\nkept too\n");
}

TEST(ProgressTest, ForStreamOfAFileIsNotInteractive) {
  Capture cap;
  ASSERT_NE(cap.stream(), nullptr);
  ProgressReporter p = ProgressReporter::ForStream(cap.stream());
  p.Update(State());
  EXPECT_EQ(cap.text().find('\r'), std::string::npos);
}

TEST(ProgressTest, ASinkGetsWhatTheStreamWould) {
  for (const bool interactive : {false, true}) {
    Capture cap;
    ASSERT_NE(cap.stream(), nullptr);
    ProgressReporter file(cap.stream(), interactive);
    std::string sunk;
    int pieces = 0;
    ProgressReporter sink = ProgressReporter::ForSink(
        [&](const std::string& text) {
          sunk += text;
          ++pieces;
        },
        interactive);
    for (ProgressReporter* p : {&file, &sink}) {
      p->Update(State());
      p->Line("kept");
      p->Update(State());
    }
    EXPECT_EQ(sunk, cap.text()) << interactive;
    EXPECT_EQ(pieces, 3);  // one write per call
  }
}

TEST(ProgressTest, SilentPrintsNothing) {
  ProgressReporter p = ProgressReporter::Silent();
  p.Update(State());  // must not crash on the null stream
  p.Line("nothing");
}

TEST(ProgressTest, FormatDuration) {
  EXPECT_EQ(ProgressReporter::FormatDuration(0), "0:00");
  EXPECT_EQ(ProgressReporter::FormatDuration(42), "0:42");
  EXPECT_EQ(ProgressReporter::FormatDuration(59.6), "1:00");
  EXPECT_EQ(ProgressReporter::FormatDuration(3599), "59:59");
  EXPECT_EQ(ProgressReporter::FormatDuration(3600), "1:00:00");
  EXPECT_EQ(ProgressReporter::FormatDuration(3 * 3600 + 5 * 60 + 7), "3:05:07");
  EXPECT_EQ(ProgressReporter::FormatDuration(-1), "?");
  EXPECT_EQ(ProgressReporter::FormatDuration(std::numeric_limits<double>::infinity()), "?");
}

}  // namespace
}  // namespace shardwild
