#include "workers/run_callbacks.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/base/status.h"
#include "workers/trainer.h"

namespace shardwild {

absl::StatusOr<std::unique_ptr<RunCallbacks>> RunCallbacks::Create(const Config& config, bool resumed,
                                                                   const nlohmann::json& restored_extra,
                                                                   ProgressReporter* progress) {
  std::unique_ptr<RunCallbacks> c(new RunCallbacks());
  c->progress_ = progress;
  if (!config.metrics.jsonl.empty()) {
    SW_ASSIGN_OR_RETURN(c->jsonl_, MetricsLog::Open(config.metrics.jsonl, /*append=*/resumed));
  }
  if (!config.metrics.tensorboard.empty()) {
    SW_ASSIGN_OR_RETURN(c->events_, EventFileWriter::Open(config.metrics.tensorboard));
  }
  if (config.early_stopping.enabled()) {
    c->early_.emplace(config.early_stopping);
    if (restored_extra.is_object() && restored_extra.contains("early_stopping")) {
      if (absl::Status s = c->early_->FromJson(restored_extra["early_stopping"]); !s.ok()) {
        progress->Line(absl::StrCat("warning: early stopping starts afresh: ", s.message()));
        c->early_.emplace(config.early_stopping);
      }
    }
  }
  return c;
}

absl::Status RunCallbacks::Log(nlohmann::json record, int64_t step, absl::Span<const ScalarValue> scalars) {
  if (jsonl_) {
    record["step"] = step;
    SW_RETURN_IF_ERROR(jsonl_->Write(std::move(record)));
  }
  if (events_) {
    SW_RETURN_IF_ERROR(events_->AddScalars(scalars, step, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())));
    SW_RETURN_IF_ERROR(events_->Flush());
  }
  return absl::OkStatus();
}

bool RunCallbacks::Stop(double value) {
  if (!early_ || stopped_ || !early_->Update(value)) return false;
  stopped_ = true;
  progress_->Line(absl::StrFormat("early stopping: %s has not improved on %.4f for %d evaluation(s)",
                                  early_->monitor(), early_->best(), early_->wait()));
  return true;
}

absl::Status RunCallbacks::OnProgress(int epoch, int64_t step, double loss, double samples_per_s) {
  if (jsonl_ || events_) {
    const ScalarValue scalars[] = {{"train/loss", static_cast<float>(loss)},
                                   {"train/samples_per_s", static_cast<float>(samples_per_s)}};
    SW_RETURN_IF_ERROR(
        Log({{"kind", "train"}, {"epoch", epoch}, {"loss", loss}, {"samples_per_s", samples_per_s}}, step, scalars));
  }
  if (!observer_ || stopped_) return absl::OkStatus();
  SW_ASSIGN_OR_RETURN(const bool go_on, observer_({{"event", "progress"},
                                                   {"epoch", epoch},
                                                   {"step", step},
                                                   {"train_loss", loss},
                                                   {"samples_per_s", samples_per_s}}));
  if (!go_on) StopForObserver(epoch, step);
  return absl::OkStatus();
}

void RunCallbacks::StopForObserver(int epoch, int64_t step) {
  stopped_ = true;
  progress_->Line(absl::StrFormat("stopping: a callback asked to stop at epoch %d, step %d", epoch, step));
}

std::optional<bool> RunCallbacks::StopOnTest(double loss, double accuracy, const MetricValues& extra) {
  if (!early_) return std::nullopt;
  const std::string& m = early_->monitor();
  if (m == "test_loss") return Stop(loss);
  if (m == "test_accuracy") return Stop(accuracy);
  for (const auto& [name, value] : extra) {
    if (name == m) return Stop(value);
  }
  return std::nullopt;
}

absl::StatusOr<bool> RunCallbacks::OnEvaluation(int epoch, int64_t round, int64_t rounds, int64_t step,
                                                double loss, double accuracy, const MetricValues& extra) {
  last_eval_ = Evaluation{loss, accuracy, extra};
  std::string line = absl::StrFormat("epoch %d step %d/%d: test loss %.4f acc %.4f", epoch, round, rounds, loss, accuracy);
  nlohmann::json record = {{"kind", "eval"}, {"epoch", epoch}, {"test_loss", loss}, {"test_accuracy", accuracy}};
  std::vector<ScalarValue> scalars = {{"eval/loss", static_cast<float>(loss)},
                                      {"eval/accuracy", static_cast<float>(accuracy)}};
  std::vector<std::string> tags;  // the scalars' tags point into it: no reallocation
  tags.reserve(extra.size());
  for (const auto& [name, value] : extra) {
    absl::StrAppendFormat(&line, " %s %.4f", name.substr(5), value);
    record[name] = value;
    tags.push_back("eval/" + name.substr(5));
    scalars.push_back({tags.back(), static_cast<float>(value)});
  }
  progress_->Line(line);
  SW_RETURN_IF_ERROR(Log(std::move(record), step, scalars));
  return StopOnTest(loss, accuracy, extra).value_or(false);
}

absl::StatusOr<bool> RunCallbacks::OnEpochEnd(const EpochResult& er, int epochs, int64_t step) {
  std::string line =
      absl::StrFormat("epoch %d/%d: train loss %.4f acc %.4f", er.epoch, epochs, er.train_loss, er.train_accuracy);
  nlohmann::json record = {{"kind", "eval"},      {"epoch", er.epoch},     {"train_loss", er.train_loss},
                           {"train_accuracy", er.train_accuracy}, {"records", er.records},
                           {"seconds", er.seconds}};
  std::vector<ScalarValue> scalars = {{"epoch/train_loss", static_cast<float>(er.train_loss)},
                                      {"epoch/train_accuracy", static_cast<float>(er.train_accuracy)}};
  std::vector<std::string> tags;  // the scalars' tags point into it: no reallocation
  if (er.test_loss) {
    last_eval_ = Evaluation{*er.test_loss, *er.test_accuracy, er.test_metrics};
    absl::StrAppendFormat(&line, " | test loss %.4f acc %.4f", *er.test_loss, *er.test_accuracy);
    record["test_loss"] = *er.test_loss;
    record["test_accuracy"] = *er.test_accuracy;
    scalars.push_back({"eval/loss", static_cast<float>(*er.test_loss)});
    scalars.push_back({"eval/accuracy", static_cast<float>(*er.test_accuracy)});
    tags.reserve(er.test_metrics.size());
    for (const auto& [name, value] : er.test_metrics) {
      absl::StrAppendFormat(&line, " %s %.4f", name.substr(5), value);
      record[name] = value;
      tags.push_back("eval/" + name.substr(5));
      scalars.push_back({tags.back(), static_cast<float>(value)});
    }
  }
  absl::StrAppendFormat(&line, " | %.1f s, %.0f samples/s", er.seconds, er.samples_per_s);
  progress_->Line(line);
  SW_RETURN_IF_ERROR(Log(record, step, scalars));
  // Keras' on_epoch_end: on the training metrics, or on the test metrics
  // when this epoch evaluated.
  bool stop = false;
  if (early_) {
    const std::string& m = early_->monitor();
    if (m == "train_loss") {
      stop = Stop(er.train_loss);
    } else if (m == "train_accuracy") {
      stop = Stop(er.train_accuracy);
    } else if (er.test_loss) {
      stop = StopOnTest(*er.test_loss, *er.test_accuracy, er.test_metrics).value_or(false);
    }
  }
  if (observer_) {
    record.erase("kind");
    record["event"] = "epoch";
    record["epochs"] = epochs;
    record["step"] = step;
    record["samples_per_s"] = er.samples_per_s;
    SW_ASSIGN_OR_RETURN(const bool go_on, observer_(record));
    if (!go_on && !stopped_) StopForObserver(er.epoch, step);
    stop = stop || !go_on;
  }
  return stop;
}

}  // namespace shardwild
