// What the text-format parser fuzz targets (criteo_, libsvm_, text_ and
// csv_parser_fuzz.cc) check alike; each target adds its format's data-set
// checks (CheckDataset) and equality (Same).
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/data/readers.h"

namespace shardwild::fuzz {

inline constexpr std::string_view kFile = "fuzz";
inline constexpr int64_t kShift = 1000;  // a second parse starts at line 1 + kShift

inline void Check(bool ok) {
  if (!ok) std::abort();
}

// Line `line` (1-based) of `bytes` without its line end.
inline std::string_view LineOf(std::string_view bytes, int64_t line) {
  size_t pos = 0;
  for (int64_t l = 1; l < line; ++l) {
    const size_t nl = bytes.find('\n', pos);
    Check(nl != std::string_view::npos);
    pos = nl + 1;
  }
  std::string_view s = bytes.substr(pos, bytes.find('\n', pos) - pos);
  if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
  return s;
}

// Splits "<kFile>:<line>:<column>: <rest>"; false for another message.
inline bool Where(std::string_view m, int64_t* line, int64_t* column, std::string_view* rest) {
  if (m.substr(0, kFile.size() + 1) != std::string(kFile) + ":") return false;
  const char* p = m.data() + kFile.size() + 1;
  const char* e = m.data() + m.size();
  auto r = std::from_chars(p, e, *line);
  if (r.ec != std::errc() || r.ptr == e || *r.ptr != ':') return false;
  r = std::from_chars(r.ptr + 1, e, *column);
  if (r.ec != std::errc() || e - r.ptr < 2 || r.ptr[0] != ':' || r.ptr[1] != ' ') return false;
  *rest = std::string_view(r.ptr + 2, static_cast<size_t>(e - r.ptr - 2));
  return true;
}

// Parses `bytes` under both bad-row policies and checks that they agree:
// every data set returned passes check_dataset(d, options); kFail accepts
// exactly when kSkip skips nothing, and then same(fail, skip); otherwise
// kFail's InvalidArgument names a line of the input and a column inside it
// ("got '...'" quoted, but for CSV), and moves with the first line number.
// kSkip always succeeds, except for a CSV header error (an empty file
// included), which is the same under both policies. Returns kSkip's result.
template <typename CheckDatasetFn, typename SameFn>
absl::StatusOr<Dataset> CheckPolicies(std::string_view bytes, ReadOptions o, CheckDatasetFn check_dataset,
                                      SameFn same) {
  const bool csv = o.format == DataFormat::kCsv;
  o.on_error = OnBadRow::kFail;
  const absl::StatusOr<Dataset> fail = ParseBuffer(bytes, kFile, 1, o);
  if (fail.ok()) check_dataset(*fail, o);
  o.on_error = OnBadRow::kSkip;
  absl::StatusOr<Dataset> skip = ParseBuffer(bytes, kFile, 1, o);
  if (!csv) Check(skip.ok());  // every row error is a skipped row
  if (skip.ok()) check_dataset(*skip, o);
  if (fail.ok()) {
    Check(skip.ok() && skip->skipped.total() == 0 && same(*fail, *skip));
    return skip;
  }
  Check(fail.status().code() == absl::StatusCode::kInvalidArgument);
  if (skip.ok()) {
    Check(skip->skipped.total() >= 1);
  } else {
    Check(skip.status() == fail.status());  // the CSV header: no policy applies
  }
  int64_t line = 0, column = 0;
  std::string_view rest;
  const std::string message(fail.status().message());
  if (!Where(message, &line, &column, &rest)) {
    Check(!skip.ok());  // only a CSV file without a header names no line
    return skip;
  }
  Check(line >= 1 && column >= 1);
  Check(static_cast<size_t>(column) <= LineOf(bytes, line).size() + 1);
  if (!csv) Check(rest.find(", got '") != std::string_view::npos && rest.back() == '\'');
  o.on_error = OnBadRow::kFail;
  const absl::StatusOr<Dataset> shifted = ParseBuffer(bytes, kFile, 1 + kShift, o);
  Check(!shifted.ok());
  int64_t line2 = 0, column2 = 0;
  std::string_view rest2;
  const std::string message2(shifted.status().message());
  Check(Where(message2, &line2, &column2, &rest2) && line2 == line + kShift && column2 == column && rest2 == rest);
  return skip;
}

}  // namespace shardwild::fuzz
