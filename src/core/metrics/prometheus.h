// Prometheus metrics: a registry of metric families whose values are read
// from callbacks when they are rendered (at scrape time), and their
// rendering in the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/):
//
//   # HELP shardwild_samples_total Training records processed.
//   # TYPE shardwild_samples_total counter
//   shardwild_samples_total 12345
//   # HELP shardwild_step_phase_seconds_total Seconds in each phase of the step.
//   # TYPE shardwild_step_phase_seconds_total counter
//   shardwild_step_phase_seconds_total{phase="data"} 0.25
//
// Nothing here serves HTTP or starts a thread: workers/metrics_server.h
// serves a registry's rendering at GET /metrics.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/base/mutex.h"

namespace shardwild {

// The Content-Type of the text format this unit renders.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

enum class MetricType { kCounter, kGauge };
const char* MetricTypeName(MetricType type);  // "counter", "gauge"

// One series of a family: its labels (name and value, rendered in this
// order) and the callback that gives its value at each rendering.
struct MetricSeries {
  std::vector<std::pair<std::string, std::string>> labels;
  std::function<double()> value;
};

// A metric family: name, type, help text and its series (at least one).
struct MetricFamily {
  std::string name;
  MetricType type = MetricType::kGauge;
  std::string help;
  std::vector<MetricSeries> series;
};

// Whether `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(absl::string_view name);
// Whether `name` is a valid label name: [a-zA-Z_][a-zA-Z0-9_]* and not
// starting with "__" (reserved for Prometheus itself).
bool IsValidLabelName(absl::string_view name);
// A label value as the text format writes it between its quotes: backslash,
// double quote and line feed become \\, \" and \n.
std::string EscapeLabelValue(absl::string_view value);
// HELP text as the text format writes it: backslash and line feed become
// \\ and \n.
std::string EscapeHelpText(absl::string_view text);
// A sample value as the text format writes it: NaN, +Inf, -Inf, or the
// shortest decimal that reads back as the same double (integers without a
// fraction or exponent up to 1e16: "12345").
std::string FormatMetricValue(double value);

// Metric families, rendered in the order they were added.
//
// Thread safety: thread-safe. Render() calls the families' callbacks on the
// calling thread while holding the registry's lock, so a callback must be
// cheap, must not block for long and must not call into the registry; what
// it reads must outlive every Render() (that is, the registry's use).
class MetricRegistry {
 public:
  MetricRegistry() = default;
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // Adds `family`. InvalidArgument naming the family when its name or a
  // label name is invalid, the name is already registered, it has no
  // series, a series has no callback, repeats a label name, or has the same
  // labels as another series of the family.
  absl::Status Add(MetricFamily family);

  // The text exposition of every family: HELP and TYPE lines, then one line
  // per series with the value its callback returns now.
  std::string Render() const;

 private:
  mutable Mutex mu_;
  std::vector<MetricFamily> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardwild
