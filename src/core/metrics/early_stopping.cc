#include "core/metrics/early_stopping.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

nlohmann::json NumberToJson(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

bool NumberFromJson(const nlohmann::json& j, double* out) {
  if (j.is_number()) {
    *out = j.get<double>();
    return true;
  }
  if (!j.is_string()) return false;
  const std::string& s = j.get_ref<const std::string&>();
  if (s == "inf") {
    *out = kInf;
  } else if (s == "-inf") {
    *out = -kInf;
  } else if (s == "nan") {
    *out = std::numeric_limits<double>::quiet_NaN();
  } else {
    return false;
  }
  return true;
}

}  // namespace

EarlyStopping::EarlyStopping(const EarlyStoppingOptions& options)
    : monitor_(options.monitor),
      maximize_(options.maximize()),
      min_delta_(std::abs(options.min_delta)),
      patience_(options.patience),
      best_(maximize_ ? -kInf : kInf) {}

bool EarlyStopping::Improves(double value) const {
  return maximize_ ? value - min_delta_ > best_ : value + min_delta_ < best_;
}

bool EarlyStopping::Update(double value) {
  const int64_t index = updates_++;
  ++wait_;
  if (Improves(value)) {
    best_ = value;
    best_index_ = index;
    wait_ = 0;
    stopped_ = false;
    return false;
  }
  stopped_ = wait_ >= patience_ && index > 0;
  return stopped_;
}

nlohmann::json EarlyStopping::ToJson() const {
  return {{"monitor", monitor_}, {"mode", maximize_ ? "max" : "min"}, {"best", NumberToJson(best_)},
          {"best_index", best_index_}, {"wait", wait_}, {"updates", updates_}, {"stopped", stopped_}};
}

absl::Status EarlyStopping::FromJson(const nlohmann::json& state) {
  const auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("early stopping state: ", what));
  };
  if (!state.is_object()) return bad("expected a JSON object");
  const auto field = [&state](const char* name) -> const nlohmann::json* {
    auto it = state.find(name);
    return it == state.end() ? nullptr : &*it;
  };
  const nlohmann::json* monitor = field("monitor");
  const nlohmann::json* mode = field("mode");
  const nlohmann::json* best = field("best");
  const nlohmann::json* best_index = field("best_index");
  const nlohmann::json* wait = field("wait");
  const nlohmann::json* updates = field("updates");
  const nlohmann::json* stopped = field("stopped");
  if (!monitor || !monitor->is_string()) return bad("'monitor' must be a string");
  if (!mode || !mode->is_string() || (*mode != "min" && *mode != "max")) return bad("'mode' must be \"min\" or \"max\"");
  double best_value = 0;
  if (!best || !NumberFromJson(*best, &best_value)) return bad("'best' must be a number, \"inf\", \"-inf\" or \"nan\"");
  if (!updates || !updates->is_number_integer() || updates->get<int64_t>() < 0) {
    return bad("'updates' must be an integer >= 0");
  }
  const int64_t n = updates->get<int64_t>();
  if (!best_index || !best_index->is_number_integer() || best_index->get<int64_t>() < -1 ||
      best_index->get<int64_t>() >= n) {
    return bad(absl::StrCat("'best_index' must be an integer in [-1, updates = ", n, ")"));
  }
  if (!wait || !wait->is_number_integer() || wait->get<int64_t>() < 0 || wait->get<int64_t>() > n) {
    return bad(absl::StrCat("'wait' must be an integer in [0, updates = ", n, "]"));
  }
  if (!stopped || !stopped->is_boolean()) return bad("'stopped' must be true or false");

  const std::string their_monitor = monitor->get<std::string>();
  const bool their_max = *mode == "max";
  if (their_monitor != monitor_ || their_max != maximize_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "early stopping state is for monitor '", their_monitor, "' in mode ", their_max ? "max" : "min",
        "; this run monitors '", monitor_, "' in mode ", maximize_ ? "max" : "min"));
  }
  best_ = best_value;
  best_index_ = best_index->get<int64_t>();
  wait_ = static_cast<int>(wait->get<int64_t>());
  updates_ = n;
  stopped_ = stopped->get<bool>();
  return absl::OkStatus();
}

}  // namespace shardwild
