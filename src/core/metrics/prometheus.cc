#include "core/metrics/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

absl::Status Bad(const std::string& family, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("metric ", family, ": ", what));
}

}  // namespace

const char* MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
  }
  return "untyped";
}

bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  for (char c : name) {
    if (!(IsNameStart(c) || IsDigit(c) || c == ':')) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0]) || name.substr(0, 2) == "__") return false;
  for (char c : name) {
    if (!(IsNameStart(c) || IsDigit(c))) return false;
  }
  return true;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string EscapeHelpText(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Counters are whole numbers: write them as such (to_chars would pick
  // "1e+06" for a million, which is as short but harder to read).
  if (value == std::trunc(value) && std::fabs(value) < 1e16) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[32];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

absl::Status MetricRegistry::Add(MetricFamily family) {
  const std::string& name = family.name;
  if (!IsValidMetricName(name)) return Bad(name, "not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  if (family.series.empty()) return Bad(name, "has no series");
  std::set<std::vector<std::pair<std::string, std::string>>> seen;
  for (const MetricSeries& s : family.series) {
    if (!s.value) return Bad(name, "a series has no value callback");
    std::set<std::string> label_names;
    for (const auto& [label, value] : s.labels) {
      if (!IsValidLabelName(label)) {
        return Bad(name,
                   absl::StrCat("'", label, "' is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)"));
      }
      if (!label_names.insert(label).second) return Bad(name, absl::StrCat("label '", label, "' is repeated"));
    }
    auto sorted = s.labels;
    std::sort(sorted.begin(), sorted.end());
    if (!seen.insert(std::move(sorted)).second) return Bad(name, "two series have the same labels");
  }
  MutexLock lock(&mu_);
  for (const MetricFamily& f : families_) {
    if (f.name == name) return Bad(name, "is already registered");
  }
  families_.push_back(std::move(family));
  return absl::OkStatus();
}

std::string MetricRegistry::Render() const {
  std::string out;
  MutexLock lock(&mu_);
  for (const MetricFamily& f : families_) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", EscapeHelpText(f.help), "\n");
    absl::StrAppend(&out, "# TYPE ", f.name, " ", MetricTypeName(f.type), "\n");
    for (const MetricSeries& s : f.series) {
      out += f.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          absl::StrAppend(&out, i > 0 ? "," : "", s.labels[i].first, "=\"", EscapeLabelValue(s.labels[i].second),
                          "\"");
        }
        out += '}';
      }
      absl::StrAppend(&out, " ", FormatMetricValue(s.value()), "\n");
    }
  }
  return out;
}

}  // namespace shardwild
