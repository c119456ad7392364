#include "workers/task_workers.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <cerrno>
#include <cstring>
#include <exception>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "workers/trainer.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;

std::string Real(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

std::string OneLine(absl::string_view text) {
  std::string s(text);
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

bool InlineEvaluation(const Config& config) { return !config.data.test.empty() && !config.eval.sidecar; }

// Encodes an evaluation task's result for `evaldone`: count, correct,
// loss_sum (17 digits) and the metrics' bytes in base64 ("-" when absent).
std::string EncodeEvalResult(const EvalResult& r) {
  return absl::StrCat(r.count, " ", r.correct, " ", Real(r.loss_sum), " ",
                      r.metrics ? absl::Base64Escape(r.metrics->Serialize()) : std::string("-"));
}

absl::StatusOr<EvalResult> DecodeEvalResult(const std::vector<std::string>& f, size_t at) {
  EvalResult r;
  if (f.size() != at + 4 || !absl::SimpleAtoi(f[at], &r.count) || !absl::SimpleAtoi(f[at + 1], &r.correct) ||
      !absl::SimpleAtod(f[at + 2], &r.loss_sum) || r.count < 0) {
    return absl::InvalidArgumentError("malformed evaluation result");
  }
  if (f[at + 3] != "-") {
    std::string bytes;
    if (!absl::Base64Unescape(f[at + 3], &bytes)) return absl::InvalidArgumentError("malformed metrics (base64)");
    SW_ASSIGN_OR_RETURN(EvalMetrics m, EvalMetrics::Deserialize(bytes));
    r.metrics = std::move(m);
  }
  return r;
}

absl::StatusOr<std::shared_ptr<Inbox>> Inbox::Create() {
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  return std::shared_ptr<Inbox>(new Inbox(p[0], p[1]));
}

Inbox::~Inbox() {
  close(read_fd_);
  close(write_fd_);
}

void Inbox::Post(std::string line) {
  MutexLock lock(&mu_);
  if (closed_ || ended_) return;
  lines_.push_back(std::move(line));
  // A full pipe already wakes the reader, so EAGAIN is fine.
  [[maybe_unused]] const ssize_t n = ::write(write_fd_, "x", 1);
}

void Inbox::End() {
  MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  [[maybe_unused]] const ssize_t n = ::write(write_fd_, "x", 1);
}

bool Inbox::Drain(std::string* out) {
  char chunk[256];
  while (::read(read_fd_, chunk, sizeof chunk) > 0) {
  }
  MutexLock lock(&mu_);
  for (std::string& line : lines_) absl::StrAppend(out, line, "\n");
  lines_.clear();
  return !ended_;
}

void Inbox::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  lines_.clear();
}

std::optional<std::string> TaskRunner::Run(const std::string& line, const std::function<bool()>& heartbeat) {
  const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (f.empty()) return std::nullopt;
  std::optional<std::string> reply;
  try {
    if (f[0] == "task") reply = Train(f, line, heartbeat);
    if (f[0] == "eval") reply = Evaluate(f, line);
  } catch (const std::exception& e) {  // out of memory, say: the task failed, the worker goes on
    reply = absl::StrCat("fail ", f.size() > 1 ? f[1] : "0", " ", f[0], " threw: ", OneLine(e.what()));
  }
  last_sent_ = Clock::now();
  return reply;
}

namespace {

// A worker's counters when a training task starts; Done is the task's reply
// with what they gained since (plus `extra` fields, when given).
class TaskCounts {
 public:
  explicit TaskCounts(WorkerCounters& c)
      : c_(c),
        steps_(c.steps.load(std::memory_order_relaxed)),
        samples_(c.samples.load(std::memory_order_relaxed)),
        correct_(c.correct.load(std::memory_order_relaxed)),
        loss_(c.loss_sum.load(std::memory_order_relaxed)) {}
  std::string Done(uint64_t lease, const std::string& extra = "") const {
    std::string line = absl::StrCat("done ", lease, " ", c_.samples.load(std::memory_order_relaxed) - samples_, " ",
                                    c_.steps.load(std::memory_order_relaxed) - steps_, " ",
                                    Real(c_.loss_sum.load(std::memory_order_relaxed) - loss_), " ",
                                    c_.correct.load(std::memory_order_relaxed) - correct_);
    if (!extra.empty()) absl::StrAppend(&line, " ", extra);
    return line;
  }

 private:
  WorkerCounters& c_;
  const int64_t steps_, samples_, correct_;
  const double loss_;
};

}  // namespace

std::optional<std::string> TaskRunner::Train(const std::vector<std::string>& f, const std::string& line,
                                 const std::function<bool()>& heartbeat) {
  uint64_t lease = 0;
  int epoch = 0;
  int64_t first = 0, count = 0;
  double progress_begin = 0, per_step = 0;
  if (f.size() != 7 || !absl::SimpleAtoi(f[1], &lease) || !absl::SimpleAtoi(f[2], &epoch) ||
      !absl::SimpleAtoi(f[3], &first) || !absl::SimpleAtoi(f[4], &count) ||
      !absl::SimpleAtod(f[5], &progress_begin) || !absl::SimpleAtod(f[6], &per_step) || epoch < 1 || first < 0 ||
      count < 0 || first + count > (feed_ ? stream_->records() : train_.count)) {
    return absl::StrCat("fail ", lease, " malformed task: ", OneLine(line));
  }
  if (feed_) return TrainStreamed(lease, epoch, first, count, progress_begin, per_step, heartbeat);
  if (epoch != order_epoch_) {
    order_ = EpochOrder(train_.count, config_.train.seed, epoch);
    order_epoch_ = epoch;
  }
  const TaskCounts counts(worker_.counters());
  // The whole task in one call, with a heartbeat between steps once a
  // second has passed since the last message. A call's steps fuse each pull
  // into the last step's push and ask for the next batch a step ahead,
  // which calls of one step each (pull_every 1) never did. `train`, 2
  // workers, alternating runs: default MLP read params 3.4-3.8% -> 0.5-0.6%
  // of the step, step 2.64-2.83 -> 2.52-2.62 ms; sparse_logreg data 10.5-11.6
  // -> 8.0-8.3 us a step; text data 1.33-1.44 -> 1.02-1.16 us.
  bool parent_gone = false;
  absl::Status trained = worker_.TrainRange(
      order_.data() + first, count, config_.optimizer, progress_begin, per_step, 0, nullptr, [&] {
        if (SecondsSince(last_sent_) < 1.0) return true;
        if (!heartbeat()) {
          parent_gone = true;
          return false;
        }
        last_sent_ = Clock::now();
        return true;
      });
  if (parent_gone) return std::nullopt;
  if (trained.ok() && flush_) trained = flush_();
  if (!trained.ok()) return absl::StrCat("fail ", lease, " ", OneLine(trained.message()));
  return counts.Done(lease);
}

void TaskRunner::set_stream(const ColumnCache* cache, const StreamFeedOptions& options) {
  feed_ = std::make_unique<StreamFeed>(*cache, options);
  stream_ = cache;
}

std::optional<std::string> TaskRunner::TrainStreamed(uint64_t lease, int epoch, int64_t first, int64_t count,
                                                     double progress_begin, double per_step,
                                                     const std::function<bool()>& heartbeat) {
  const int64_t batch = config_.train.batch_size;
  const TaskCounts counts(worker_.counters());
  const double wait0 = feed_->wait_s();
  absl::Status trained;
  feed_->Start(epoch, first, count);
  int64_t done = 0;  // records of the task trained
  while (trained.ok()) {
    absl::StatusOr<const Dataset*> item = feed_->Next();
    if (!item.ok()) {
      trained = item.status();
      break;
    }
    if (*item == nullptr) break;
    const Dataset& data = **item;
    if (static_cast<int64_t>(order_.size()) < data.count) {
      order_.resize(static_cast<size_t>(data.count));
      std::iota(order_.begin(), order_.end(), 0);
    }
    order_epoch_ = -1;  // order_ is no epoch's order now
    worker_.set_train_data(&data);
    trained = worker_.TrainRange(order_.data(), data.count, config_.optimizer, progress_begin, per_step, done / batch,
                                 nullptr);
    done += data.count;
    if (SecondsSince(last_sent_) >= 1.0 && done < count) {
      if (!heartbeat()) {
        feed_->Finish();
        worker_.set_train_data(&train_);
        return std::nullopt;
      }
      last_sent_ = Clock::now();
    }
  }
  feed_->Finish();
  worker_.set_train_data(&train_);
  if (trained.ok() && done != count) {
    trained = absl::InternalError(absl::StrCat("streamed task: ", done, " records fed of ", count));
  }
  if (trained.ok() && flush_) trained = flush_();
  if (!trained.ok()) return absl::StrCat("fail ", lease, " ", OneLine(trained.message()));
  return counts.Done(lease, absl::StrCat(Real(feed_->wait_s() - wait0), " ", feed_->peak_bytes()));
}

std::string TaskRunner::Evaluate(const std::vector<std::string>& f, const std::string& line) {
  uint64_t lease = 0;
  int64_t first = 0, count = 0;
  if (f.size() != 4 || !absl::SimpleAtoi(f[1], &lease) || !absl::SimpleAtoi(f[2], &first) ||
      !absl::SimpleAtoi(f[3], &count) || test_ == nullptr || first < 0 || count < 0 ||
      first + count > test_->count) {
    return absl::StrCat("fail ", lease, " malformed evaluation task", test_ == nullptr ? " (no test data)" : "",
                        ": ", OneLine(line));
  }
  absl::StatusOr<EvalResult> r = worker_.Evaluate(*test_, first, first + count);
  if (!r.ok()) return absl::StrCat("fail ", lease, " ", OneLine(r.status().message()));
  return absl::StrCat("evaldone ", lease, " ", EncodeEvalResult(*r));
}

}  // namespace shardwild
