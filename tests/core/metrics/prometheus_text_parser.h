// A strict parser of the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), for tests
// of what Shardwild serves. Stricter than Prometheus where our output must
// be: only HELP and TYPE comments, no blank lines, no trailing commas, every
// family with both HELP and TYPE before its first sample.
//
//   # HELP <name> <text>             text escapes only \\ and \n
//   # TYPE <name> counter|gauge|histogram|summary|untyped
//   <name>[{<label>="<value>"(,<label>="<value>")*}] <value>[ <timestamp>]
//
// with <name> [a-zA-Z_:][a-zA-Z0-9_:]*, <label> [a-zA-Z_][a-zA-Z0-9_]*,
// label values escaping only \\, \" and \n, values Go floats (NaN, +Inf,
// -Inf included). A family's lines are contiguous, no series (name and
// label set) appears twice, and every line ends with '\n'.
// Header-only and standard C++ only, so any test can use it.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace shardwild::prometheus_text {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;
};

struct Family {
  std::string type;
  std::string help;  // unescaped
  std::vector<Sample> samples;
};

struct Parsed {
  std::string error;  // empty = the text is valid; else "line N: what"
  std::map<std::string, Family> families;
  bool ok() const { return error.empty(); }
  // The value of the series `name` with exactly `labels`; NaN if absent.
  double Value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    for (const auto& [family_name, f] : families) {
      for (const Sample& s : f.samples) {
        if (s.name == name && s.labels == labels) return s.value;
      }
    }
    return std::nan("");
  }
};

namespace internal {

inline bool IsMetricName(const std::string& s) {
  static const std::regex re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  return std::regex_match(s, re);
}

inline bool IsLabelName(const std::string& s) {
  static const std::regex re("[a-zA-Z_][a-zA-Z0-9_]*");
  return std::regex_match(s, re);
}

// A Go float as Prometheus reads it.
inline bool ParseValue(const std::string& s, double* out) {
  if (s == "NaN") {
    *out = std::nan("");
    return true;
  }
  if (s == "+Inf" || s == "Inf") {
    *out = INFINITY;
    return true;
  }
  if (s == "-Inf") {
    *out = -INFINITY;
    return true;
  }
  static const std::regex re("[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?");
  if (!std::regex_match(s, re)) return false;
  *out = std::strtod(s.c_str(), nullptr);
  return true;
}

}  // namespace internal

inline Parsed Parse(const std::string& text) {
  Parsed p;
  if (text.empty()) {
    p.error = "empty exposition";
    return p;
  }
  if (text.back() != '\n') {
    p.error = "the last line does not end with a line feed";
    return p;
  }
  std::set<std::string> helped, typed, closed;  // closed: families whose lines have ended
  std::set<std::pair<std::string, std::map<std::string, std::string>>> series;
  std::string current;  // the family of the previous line
  size_t pos = 0;
  int lineno = 0;
  auto fail = [&](const std::string& what) {
    p.error = "line " + std::to_string(lineno) + ": " + what;
    return p;
  };
  // Moves to family `name`; false when its lines were already closed.
  auto enter = [&](const std::string& name) {
    if (name == current) return true;
    if (closed.count(name)) return false;
    if (!current.empty()) closed.insert(current);
    current = name;
    return true;
  };
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    if (line.empty()) return fail("blank line");
    if (line[0] == '#') {
      const bool help = line.rfind("# HELP ", 0) == 0;
      const bool type = line.rfind("# TYPE ", 0) == 0;
      if (!help && !type) return fail("a comment other than # HELP or # TYPE: '" + line + "'");
      const std::string rest = line.substr(7);
      const size_t sp = rest.find(' ');
      if (sp == std::string::npos) return fail("no text after the metric name");
      const std::string name = rest.substr(0, sp);
      const std::string arg = rest.substr(sp + 1);
      if (!internal::IsMetricName(name)) return fail("invalid metric name '" + name + "'");
      if (!enter(name)) return fail("family " + name + " continues after other families' lines");
      Family& f = p.families[name];
      if (help) {
        if (!helped.insert(name).second) return fail("second HELP for " + name);
        std::string unescaped;
        for (size_t i = 0; i < arg.size(); ++i) {
          if (arg[i] != '\\') {
            unescaped += arg[i];
            continue;
          }
          if (i + 1 == arg.size()) return fail("HELP text ends in a lone backslash");
          const char e = arg[++i];
          if (e == '\\') {
            unescaped += '\\';
          } else if (e == 'n') {
            unescaped += '\n';
          } else {
            return fail(std::string("invalid escape \\") + e + " in HELP text");
          }
        }
        f.help = unescaped;
      } else {
        if (!typed.insert(name).second) return fail("second TYPE for " + name);
        if (!f.samples.empty()) return fail("TYPE of " + name + " after its samples");
        static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
        if (!kTypes.count(arg)) return fail("unknown type '" + arg + "'");
        f.type = arg;
      }
      continue;
    }
    // A sample.
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    Sample s;
    s.name = line.substr(0, i);
    if (!internal::IsMetricName(s.name)) return fail("invalid metric name '" + s.name + "'");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos) return fail("label without '='");
        const std::string label = line.substr(i, eq - i);
        if (!internal::IsLabelName(label)) return fail("invalid label name '" + label + "'");
        if (eq + 1 >= line.size() || line[eq + 1] != '"') return fail("label value not quoted");
        std::string value;
        size_t j = eq + 2;
        bool closed_quote = false;
        for (; j < line.size(); ++j) {
          const char c = line[j];
          if (c == '"') {
            closed_quote = true;
            break;
          }
          if (c != '\\') {
            value += c;
            continue;
          }
          if (j + 1 == line.size()) return fail("label value ends in a lone backslash");
          const char e = line[++j];
          if (e == '\\') {
            value += '\\';
          } else if (e == '"') {
            value += '"';
          } else if (e == 'n') {
            value += '\n';
          } else {
            return fail(std::string("invalid escape \\") + e + " in a label value");
          }
        }
        if (!closed_quote) return fail("unterminated label value");
        if (!s.labels.emplace(label, value).second) return fail("label '" + label + "' repeated");
        i = j + 1;
        if (i < line.size() && line[i] == ',') {
          ++i;
          continue;
        }
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        return fail("expected ',' or '}' after a label");
      }
    }
    if (i >= line.size() || line[i] != ' ') return fail("expected one space before the value");
    const std::string rest = line.substr(i + 1);
    const size_t sp = rest.find(' ');
    const std::string value = rest.substr(0, sp);
    if (!internal::ParseValue(value, &s.value)) return fail("invalid value '" + value + "'");
    if (sp != std::string::npos) {
      static const std::regex ts("-?[0-9]+");
      if (!std::regex_match(rest.substr(sp + 1), ts)) return fail("invalid timestamp '" + rest.substr(sp + 1) + "'");
    }
    // Its family: the name itself, or a histogram's / summary's _bucket, _sum, _count.
    std::string family = s.name;
    if (!typed.count(family)) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        const std::string sfx = suffix;
        if (s.name.size() > sfx.size() && s.name.compare(s.name.size() - sfx.size(), sfx.size(), sfx) == 0) {
          const std::string base = s.name.substr(0, s.name.size() - sfx.size());
          if (typed.count(base) && (p.families[base].type == "histogram" || p.families[base].type == "summary")) {
            family = base;
          }
        }
      }
    }
    if (!typed.count(family)) return fail("sample of " + s.name + " without a TYPE line before it");
    if (!helped.count(family)) return fail("sample of " + s.name + " without a HELP line before it");
    if (!enter(family)) return fail("family " + family + " continues after other families' lines");
    if (!series.emplace(s.name, s.labels).second) return fail("series " + s.name + " appears twice");
    p.families[family].samples.push_back(std::move(s));
  }
  for (const auto& [name, f] : p.families) {
    if (!typed.count(name)) return fail("family " + name + " has no TYPE");
    if (!helped.count(name)) return fail("family " + name + " has no HELP");
    if (f.samples.empty()) return fail("family " + name + " has no samples");
  }
  return p;
}

}  // namespace shardwild::prometheus_text
