#include "workers/evaluator.h"

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "workers/trainer.h"

namespace shardwild {

namespace fs = std::filesystem;

absl::StatusOr<CheckpointInfo> ResolveCheckpoint(const std::string& path, std::vector<std::string>* skipped) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return WithErrorKind(VerifyCheckpoint(path), ErrorKind::kCheckpoint);
  if (!fs::is_directory(path, ec)) {
    return WithErrorKind(absl::NotFoundError(absl::StrCat(path, ": no such checkpoint or directory")),
                         ErrorKind::kCheckpoint);
  }
  absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(path, skipped);
  if (!found.ok()) return WithErrorKind(found.status(), ErrorKind::kCheckpoint);
  if (!*found) {
    return WithErrorKind(absl::NotFoundError(absl::StrCat(path, ": holds no checkpoint that verifies")),
                         ErrorKind::kCheckpoint);
  }
  return **std::move(found);
}

absl::StatusOr<CheckpointEvaluation> EvaluateCheckpoint(Job& job, const CheckpointInfo& checkpoint,
                                                        const Dataset& data) {
  SW_RETURN_IF_ERROR(RestoreJob(job, checkpoint));
  CheckpointEvaluation e;
  e.path = checkpoint.path;
  e.name = fs::path(checkpoint.path).filename().string();
  e.step = checkpoint.step;
  e.final = checkpoint.state.extra.is_object() && checkpoint.state.extra.value("final", false);
  SW_ASSIGN_OR_RETURN(e.result, EvaluateAll(job, data));
  return e;
}

absl::StatusOr<WatchSummary> WatchCheckpoints(
    Job& job, const Dataset& data, const WatchOptions& options,
    const std::function<void(const CheckpointEvaluation&)>& on_evaluated,
    const std::function<void(const std::string& name, const std::string& why)>& on_skipped) {
  using Clock = std::chrono::steady_clock;
  WatchSummary summary;
  size_t handled = 0;  // entries of the history dealt with
  auto last_new = Clock::now();
  for (;;) {
    const std::vector<std::pair<std::string, int64_t>> history = CheckpointHistory(options.dir);
    if (history.size() > handled) last_new = Clock::now();
    for (; handled < history.size(); ++handled) {
      const std::string& name = history[handled].first;
      const std::string path = (fs::path(options.dir) / name).string();
      auto skip = [&](const std::string& why) {
        summary.skipped.emplace_back(name, why);
        if (on_skipped) on_skipped(name, why);
      };
      std::error_code ec;
      if (!fs::exists(path, ec)) {
        skip("removed (checkpoint.keep) before it could be evaluated");
        continue;
      }
      absl::StatusOr<CheckpointInfo> info = VerifyCheckpoint(path);
      if (!info.ok()) {
        skip(fs::exists(path, ec) ? std::string(info.status().message()) : "deleted while it was being read");
        continue;
      }
      absl::StatusOr<CheckpointEvaluation> e = EvaluateCheckpoint(job, *info, data);
      if (!e.ok()) {
        // Pruned while restoring: the files vanish under the reader. The
        // error is real only if the checkpoint is still whole.
        if (!fs::exists(path, ec) || !VerifyCheckpoint(path).ok()) {
          skip(absl::StrCat("deleted while it was being read (", e.status().message(), ")"));
          continue;
        }
        return e.status();
      }
      summary.evaluated.push_back(*e);
      if (on_evaluated) on_evaluated(*e);
      if (e->final) {
        summary.saw_final = true;
        return summary;
      }
    }
    if (options.idle_timeout_s > 0 &&
        SecondsSince(last_new) >= options.idle_timeout_s) {
      summary.idle_timed_out = true;
      return summary;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options.poll_s));
  }
}

namespace {

absl::StatusOr<Dataset> LoadImagesForPredictionImpl(const std::string& path, int64_t features) {
  SW_ASSIGN_OR_RETURN(IdxArray images, ReadIdx(path));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected images (3 dimensions: count, rows, cols), got ",
                                                   images.dims.size(), " dimensions"));
  }
  Dataset d;
  d.count = images.dims[0];
  d.dense_dim = images.dims[1] * images.dims[2];
  if (features > 0 && d.dense_dim != features) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", d.dense_dim, " pixels per image, the model takes ", features));
  }
  d.dense.resize(images.data.size());
  for (size_t i = 0; i < images.data.size(); ++i) d.dense[i] = images.data[i] / 255.0f;
  d.labels.assign(static_cast<size_t>(d.count), 0);
  return d;
}

}  // namespace

absl::StatusOr<Dataset> LoadImagesForPrediction(const std::string& path, int64_t features) {
  return WithErrorKind(LoadImagesForPredictionImpl(path, features), ErrorKind::kData);
}

}  // namespace shardwild
