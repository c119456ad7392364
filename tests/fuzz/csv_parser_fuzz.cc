// libFuzzer target for the CSV parser (core/readers.h). An input is one knob
// byte and then a whole file, whose header should name the columns y, a, b
// and c (as the seeds' do): the label is y, and bit 2 of the knob picks dense
// {a, b} and categorical {c}, or dense {a} and categorical {b, c}. Bits 0-1
// pick the dense transform, bit 3 a tab and bit 4 ';' as the delimiter
// (else ','), bits 5-7 the label kind. ParseBuffer must return a Status for
// any bytes, under both bad-row policies, and:
//  - a data set it accepts is well formed: finite dense values, one field
//    per categorical column with at most one id per record, labels in range;
//  - the policies agree: kFail accepts exactly when kSkip skips nothing, and
//    then both give the same data set; a header error is the same under
//    both; a kFail error names a line of the input and a column inside it,
//    and moves with the first line number.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-fuzz/tests/fuzz/csv_parser_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/csv_parser.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/dataset.h"
#include "core/readers.h"

namespace shardwild {
namespace {

constexpr std::string_view kFile = "fuzz";
constexpr int64_t kShift = 1000;  // a second parse starts at line 1 + kShift

void Check(bool ok) {
  if (!ok) std::abort();
}

// Line `line` (1-based) of `bytes` without its line end.
std::string_view LineOf(std::string_view bytes, int64_t line) {
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
bool Where(std::string_view m, int64_t* line, int64_t* column, std::string_view* rest) {
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

void CheckDataset(const Dataset& d, const ReadOptions& o) {
  Check(d.count >= 0 && d.dense_dim == static_cast<int64_t>(o.csv.dense.size()) && d.dense_names == o.csv.dense);
  Check(d.dense.size() == static_cast<size_t>(d.count * d.dense_dim));
  for (float x : d.dense) Check(std::isfinite(x));
  if (o.labels == LabelKind::kRegression) {
    Check(d.targets.size() == static_cast<size_t>(d.count) && d.labels.empty() && d.num_classes == 0);
    for (float t : d.targets) Check(std::isfinite(t));
  } else {
    Check(d.labels.size() == static_cast<size_t>(d.count) && d.targets.empty());
    if (o.labels == LabelKind::kBinary) Check(d.num_classes == 2);
    for (int32_t l : d.labels) Check(l >= 0 && l < d.num_classes);
  }
  Check(!d.multi_label() && d.class_names.empty());
  Check(d.fields.size() == o.csv.categorical.size());
  for (size_t j = 0; j < d.fields.size(); ++j) {
    const SparseField& f = d.fields[j];
    Check(f.name == o.csv.categorical[j]);
    Check(f.offsets.size() == static_cast<size_t>(d.count + 1) && f.offsets.front() == 0);
    for (int64_t r = 0; r < d.count; ++r) Check(f.size(r) == 0 || f.size(r) == 1);
    Check(f.offsets.back() == static_cast<int64_t>(f.ids.size()) && f.weights.empty());
  }
  if (o.on_error == OnBadRow::kFail) Check(d.skipped.total() == 0);
}

bool Same(const Dataset& a, const Dataset& b) {
  if (a.count != b.count || a.dense != b.dense || a.labels != b.labels || a.targets != b.targets ||
      a.num_classes != b.num_classes || a.fields.size() != b.fields.size()) {
    return false;
  }
  for (size_t f = 0; f < a.fields.size(); ++f) {
    if (a.fields[f].offsets != b.fields[f].offsets || a.fields[f].ids != b.fields[f].ids) return false;
  }
  return true;
}

void Run(std::string_view bytes, ReadOptions o) {
  o.on_error = OnBadRow::kFail;
  const absl::StatusOr<Dataset> fail = ParseBuffer(bytes, kFile, 1, o);
  if (fail.ok()) CheckDataset(*fail, o);
  o.on_error = OnBadRow::kSkip;
  const absl::StatusOr<Dataset> skip = ParseBuffer(bytes, kFile, 1, o);
  if (skip.ok()) CheckDataset(*skip, o);
  if (fail.ok()) {
    Check(skip.ok() && skip->skipped.total() == 0 && Same(*fail, *skip));
    return;
  }
  Check(fail.status().code() == absl::StatusCode::kInvalidArgument);
  if (skip.ok()) {
    Check(skip->skipped.total() >= 1);
  } else {
    Check(skip.status() == fail.status());  // the header: no policy applies
  }
  int64_t line = 0, column = 0;
  std::string_view rest;
  const std::string message(fail.status().message());
  if (!Where(message, &line, &column, &rest)) {
    Check(!skip.ok());  // only "the file is empty" names no line
    return;
  }
  Check(line >= 1 && column >= 1);
  Check(static_cast<size_t>(column) <= LineOf(bytes, line).size() + 1);
  o.on_error = OnBadRow::kFail;
  const absl::StatusOr<Dataset> shifted = ParseBuffer(bytes, kFile, 1 + kShift, o);
  Check(!shifted.ok());
  int64_t line2 = 0, column2 = 0;
  std::string_view rest2;
  const std::string message2(shifted.status().message());
  Check(Where(message2, &line2, &column2, &rest2) && line2 == line + kShift && column2 == column && rest2 == rest);
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  if (size == 0) return 0;
  const uint8_t knobs = data[0];
  ReadOptions o;
  o.format = DataFormat::kCsv;
  o.threads = 1;
  o.dense_transform = static_cast<DenseTransform>(knobs % 3);
  o.csv.label = "y";
  if (knobs & 4) {
    o.csv.dense = {"a"};
    o.csv.categorical = {"b", "c"};
  } else {
    o.csv.dense = {"a", "b"};
    o.csv.categorical = {"c"};
  }
  o.csv.delimiter = (knobs & 8) ? '\t' : (knobs & 16) ? ';' : ',';
  o.labels = static_cast<LabelKind>((knobs >> 5) % 3);
  Run(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), o);
  return 0;
}
