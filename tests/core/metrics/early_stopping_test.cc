// Tests for EarlyStopping: Keras-equivalent stop decisions, NaN handling and
// the JSON state round trip.
#include "core/metrics/early_stopping.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/config/options.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

EarlyStoppingOptions Opts(const std::string& monitor, int patience, double min_delta = 0,
                          const std::string& mode = "auto") {
  EarlyStoppingOptions o;
  o.monitor = monitor;
  o.mode = mode;
  o.patience = patience;
  o.min_delta = min_delta;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  return o;
}

// Feeds `values` until Update says stop; returns the index of the stopping
// evaluation, or -1 if it never said so.
int StopIndex(EarlyStopping& es, const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (es.Update(values[i])) return static_cast<int>(i);
  }
  return -1;
}

// keras.callbacks.EarlyStopping.on_epoch_end (keras 3, baseline=None,
// start_from_epoch=0), line by line: min mode uses ops.less with min_delta
// negated, max mode ops.greater.
struct KerasReference {
  KerasReference(bool max_mode, double min_delta, int patience)
      : max_mode(max_mode), min_delta(max_mode ? std::abs(min_delta) : -std::abs(min_delta)),
        patience(patience), best(max_mode ? -kInf : kInf) {}
  bool IsImprovement(double monitor_value, double reference_value) const {
    const double a = monitor_value - min_delta;
    return max_mode ? a > reference_value : a < reference_value;
  }
  bool OnEpochEnd(int epoch, double current) {  // returns model.stop_training
    wait += 1;
    if (IsImprovement(current, best)) {
      best = current;
      best_epoch = epoch;
      wait = 0;
      return false;
    }
    return wait >= patience && epoch > 0;
  }
  bool max_mode;
  double min_delta;
  int patience;
  double best;
  int best_epoch = -1;
  int wait = 0;
};

TEST(EarlyStoppingTest, KerasPatienceExample) {
  // Keras's own test_EarlyStopping_patience: stops after 3 epochs.
  EarlyStopping es(Opts("test_loss", 2));
  EXPECT_EQ(StopIndex(es, {0.0860, 0.1096, 0.1040, 0.1019}), 2);
  EXPECT_EQ(es.best(), 0.0860);
  EXPECT_EQ(es.best_index(), 0);
  EXPECT_EQ(es.wait(), 2);
  EXPECT_TRUE(es.stopped());
}

TEST(EarlyStoppingTest, MinModePatienceZeroStopsAtFirstNonImprovement) {
  EarlyStopping es(Opts("test_loss", 0));
  EXPECT_FALSE(es.maximize());
  EXPECT_FALSE(es.Update(0.5));
  EXPECT_FALSE(es.Update(0.4));
  EXPECT_TRUE(es.Update(0.4));  // equal is not an improvement
  EXPECT_EQ(es.best(), 0.4);
  EXPECT_EQ(es.best_index(), 1);
  EXPECT_EQ(es.wait(), 1);
}

TEST(EarlyStoppingTest, MinModePatienceThree) {
  EarlyStopping es(Opts("train_loss", 3));
  // Improvements at 0, 1, 3; then three in a row without.
  EXPECT_EQ(StopIndex(es, {1.0, 0.9, 0.95, 0.8, 0.85, 0.8, 0.81, 0.7}), 6);
  EXPECT_EQ(es.best(), 0.8);
  EXPECT_EQ(es.best_index(), 3);
  EXPECT_EQ(es.wait(), 3);
}

TEST(EarlyStoppingTest, MaxModeForAccuracy) {
  EarlyStopping es(Opts("test_accuracy", 0));
  EXPECT_TRUE(es.maximize());
  EXPECT_EQ(StopIndex(es, {0.5, 0.75, 0.875, 0.75, 0.9}), 3);
  EXPECT_EQ(es.best(), 0.875);
  EXPECT_EQ(es.best_index(), 2);

  EarlyStopping es3(Opts("train_accuracy", 3));
  EXPECT_EQ(StopIndex(es3, {0.5, 0.4, 0.6, 0.6, 0.55, 0.6, 0.61}), 5);
  EXPECT_EQ(es3.best(), 0.6);
  EXPECT_EQ(es3.best_index(), 2);
}

TEST(EarlyStoppingTest, ModeAutoAndExplicit) {
  EXPECT_FALSE(Opts("test_loss", 0).maximize());
  EXPECT_FALSE(Opts("train_loss", 0).maximize());
  EXPECT_TRUE(Opts("test_accuracy", 0).maximize());
  EXPECT_TRUE(Opts("train_accuracy", 0).maximize());
  EXPECT_TRUE(Opts("test_loss", 0, 0, "max").maximize());
  EXPECT_FALSE(Opts("test_accuracy", 0, 0, "min").maximize());
  // auto also recognises "auc" (for monitors added later).
  EarlyStoppingOptions o;
  o.monitor = "test_auc";
  EXPECT_TRUE(o.maximize());
}

TEST(EarlyStoppingTest, MinDeltaMin) {
  // Binary-exact values, so the comparisons are exact: an improvement must
  // go below best - 0.25.
  EarlyStopping es(Opts("test_loss", 3, 0.25));
  EXPECT_EQ(StopIndex(es, {4.0, 3.875, 3.5, 3.375, 3.25, 3.25}), 5);
  EXPECT_EQ(es.best(), 3.5);  // 3.25 is exactly best - min_delta: not more than min_delta
  EXPECT_EQ(es.best_index(), 2);

  EarlyStopping es1(Opts("test_loss", 1, 0.25));
  EXPECT_EQ(StopIndex(es1, {4.0, 3.875}), 1);
}

TEST(EarlyStoppingTest, MinDeltaMax) {
  EarlyStopping es(Opts("test_accuracy", 1, 0.125));
  EXPECT_FALSE(es.Update(0.25));
  EXPECT_FALSE(es.Update(0.5));     // +0.25: improvement
  EXPECT_TRUE(es.Update(0.625));    // +0.125: not more than min_delta
  EXPECT_EQ(es.best(), 0.5);
}

TEST(EarlyStoppingTest, NaNIsNeverAnImprovement) {
  {
    // The first evaluation never stops training, even when it is NaN.
    EarlyStopping es(Opts("test_loss", 0));
    EXPECT_FALSE(es.Update(kNaN));
    EXPECT_EQ(es.best_index(), -1);
    EXPECT_EQ(es.best(), kInf);
    EXPECT_TRUE(es.Update(kNaN));
  }
  {
    EarlyStopping es(Opts("test_loss", 3));
    EXPECT_EQ(StopIndex(es, {1.0, kNaN, kNaN, kNaN}), 3);
    EXPECT_EQ(es.best(), 1.0);
    EXPECT_EQ(es.best_index(), 0);
  }
  {
    // A NaN between improvements only adds to wait.
    EarlyStopping es(Opts("test_accuracy", 2));
    EXPECT_EQ(StopIndex(es, {0.5, kNaN, 0.6, kNaN, kNaN}), 4);
    EXPECT_EQ(es.best(), 0.6);
    EXPECT_EQ(es.best_index(), 2);
  }
}

TEST(EarlyStoppingTest, MatchesKerasOnRandomSequences) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int trial = 0; trial < 400; ++trial) {
    const bool max_mode = trial % 2 == 1;
    const int patience = trial % 5;
    const double min_delta = (trial / 5) % 3 == 0 ? 0.0 : 0.125 * ((trial / 5) % 3);
    EarlyStopping es(Opts(max_mode ? "test_accuracy" : "test_loss", patience, min_delta));
    KerasReference keras(max_mode, min_delta, patience);
    for (int epoch = 0; epoch < 30; ++epoch) {
      // Values on a 1/8 grid (ties happen), and now and then a NaN.
      const int r = pick(rng);
      const double v = r == 0 ? kNaN : 0.125 * (pick(rng) + pick(rng));
      const bool keras_stop = keras.OnEpochEnd(epoch, v);
      ASSERT_EQ(es.Update(v), keras_stop) << "trial " << trial << " epoch " << epoch;
      ASSERT_EQ(es.wait(), keras.wait);
      ASSERT_EQ(es.best_index(), keras.best_epoch);
      if (keras.best_epoch >= 0) {
        ASSERT_EQ(es.best(), keras.best);
      }
      if (keras_stop) break;
    }
  }
}

TEST(EarlyStoppingTest, StateRoundTripsThroughJson) {
  const EarlyStoppingOptions o = Opts("test_loss", 3, 0.001);
  EarlyStopping a(o);
  for (double v : {0.9, 0.7, 0.71, 0.72}) EXPECT_FALSE(a.Update(v));
  const nlohmann::json state = a.ToJson();
  EXPECT_EQ(state["monitor"], "test_loss");
  EXPECT_EQ(state["mode"], "min");
  EXPECT_EQ(state["best_index"], 1);
  EXPECT_EQ(state["wait"], 2);
  EXPECT_EQ(state["updates"], 4);

  // Through text, as a checkpoint stores it.
  EarlyStopping b(o);
  ASSERT_TRUE(b.FromJson(nlohmann::json::parse(state.dump())).ok());
  EXPECT_EQ(b.best(), 0.7);  // exact: doubles round-trip through the dump
  EXPECT_EQ(b.best_index(), 1);
  EXPECT_EQ(b.wait(), 2);
  EXPECT_EQ(b.updates(), 4);
  // Both go on identically: the next non-improvement stops both.
  EXPECT_TRUE(a.Update(0.75));
  EXPECT_TRUE(b.Update(0.75));
  EXPECT_EQ(a.ToJson(), b.ToJson());
  EXPECT_TRUE(b.stopped());

  // A fresh state (best = inf) survives too, although JSON has no inf.
  EarlyStopping fresh(o);
  const std::string text = fresh.ToJson().dump();
  EXPECT_NE(text.find("\"inf\""), std::string::npos) << text;
  EarlyStopping c(o);
  c.Update(0.5);
  ASSERT_TRUE(c.FromJson(nlohmann::json::parse(text)).ok());
  EXPECT_EQ(c.best(), kInf);
  EXPECT_EQ(c.best_index(), -1);
  EXPECT_EQ(c.updates(), 0);
  EarlyStopping m(Opts("test_accuracy", 1));
  ASSERT_TRUE(m.FromJson(EarlyStopping(Opts("test_accuracy", 5)).ToJson()).ok());
  EXPECT_EQ(m.best(), -kInf);
}

TEST(EarlyStoppingTest, FromJsonRejectsBadOrForeignState) {
  const EarlyStoppingOptions o = Opts("test_loss", 2);
  EarlyStopping es(o);
  es.Update(0.5);
  const nlohmann::json good = es.ToJson();
  const auto with = [&good](const char* key, nlohmann::json value) {
    nlohmann::json j = good;
    j[key] = std::move(value);
    return j;
  };
  const auto code_of = [&o](const nlohmann::json& j) {
    EarlyStopping e(o);
    return e.FromJson(j).code();
  };
  EXPECT_EQ(code_of(nlohmann::json::array()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("best", "big")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("best", nullptr)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("wait", -1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("wait", 2)), absl::StatusCode::kInvalidArgument);  // more than updates
  EXPECT_EQ(code_of(with("best_index", 1)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("updates", 1.5)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("mode", "auto")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of(with("stopped", 0)), absl::StatusCode::kInvalidArgument);
  nlohmann::json missing = good;
  missing.erase("wait");
  EXPECT_EQ(code_of(missing), absl::StatusCode::kInvalidArgument);
  // Another monitor or mode: FailedPrecondition, naming both.
  EarlyStopping e(o);
  const absl::Status s = e.FromJson(with("monitor", "train_loss"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("train_loss"), std::string::npos) << s;
  EXPECT_NE(s.message().find("test_loss"), std::string::npos) << s;
  EXPECT_EQ(code_of(with("mode", "max")), absl::StatusCode::kFailedPrecondition);
  // A failed restore changes nothing.
  EXPECT_EQ(e.updates(), 0);
  EXPECT_EQ(e.best(), kInf);
}

TEST(EarlyStoppingOptionsTest, ValidateNamesKeys) {
  EXPECT_TRUE(EarlyStoppingOptions().Validate().ok());  // off by default
  EXPECT_FALSE(EarlyStoppingOptions().enabled());
  const auto message_of = [](void (*edit)(EarlyStoppingOptions*)) {
    EarlyStoppingOptions o;
    o.monitor = "test_loss";
    edit(&o);
    return std::string(o.Validate().message());
  };
  EXPECT_EQ(message_of([](EarlyStoppingOptions*) {}), "");
  EXPECT_EQ(message_of([](EarlyStoppingOptions* o) { o->monitor = "val_loss"; }),
            "early_stopping.monitor: must be one of test_loss, test_accuracy, test_auc, test_logloss, test_rmse, "
            "test_precision_at_5, train_loss, train_accuracy (or empty: off), got 'val_loss'");
  EXPECT_EQ(message_of([](EarlyStoppingOptions* o) { o->mode = "lower"; }),
            "early_stopping.mode: must be min, max or auto, got 'lower'");
  EXPECT_EQ(message_of([](EarlyStoppingOptions* o) { o->min_delta = -0.5; }),
            "early_stopping.min_delta: must be a finite number >= 0, got -0.5");
  EXPECT_EQ(message_of([](EarlyStoppingOptions* o) { o->min_delta = kNaN; }).rfind("early_stopping.min_delta", 0), 0u);
  EXPECT_EQ(message_of([](EarlyStoppingOptions* o) { o->patience = -1; }),
            "early_stopping.patience: must be >= 0, got -1");
}

}  // namespace
}  // namespace shardwild
