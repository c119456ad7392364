// libFuzzer target for the Criteo TSV parser (core/readers.h). An input is
// one knob byte (bits 0-1: the dense transform, 5-7: the label kind) and
// then a whole file. ParseBuffer must return a Status for any bytes, under
// both bad-row policies, and:
//  - a data set it accepts is well formed: 13 finite dense values and 26
//    fields C1..C26 of at most one 32-bit id per record, labels in range;
//  - the policies agree: kFail accepts exactly when kSkip skips nothing, and
//    then both give the same data set; a kFail error names a line of the
//    input and a column inside it, and moves with the first line number.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-fuzz/tests/fuzz/criteo_parser_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/criteo_parser.
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
  Check(d.count >= 0 && d.dense_dim == 13 && d.dense_names.size() == 13);
  Check(d.dense.size() == static_cast<size_t>(d.count * 13));
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
  Check(d.fields.size() == 26);
  for (size_t j = 0; j < d.fields.size(); ++j) {
    const SparseField& f = d.fields[j];
    Check(f.name == "C" + std::to_string(j + 1));
    Check(f.offsets.size() == static_cast<size_t>(d.count + 1) && f.offsets.front() == 0);
    for (int64_t r = 0; r < d.count; ++r) Check(f.size(r) == 0 || f.size(r) == 1);
    Check(f.offsets.back() == static_cast<int64_t>(f.ids.size()) && f.weights.empty());
    for (uint64_t id : f.ids) Check(id <= 0xffffffffULL);
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
  Check(skip.ok());  // every row error is a skipped row
  CheckDataset(*skip, o);
  if (fail.ok()) {
    Check(skip->skipped.total() == 0 && Same(*fail, *skip));
    return;
  }
  Check(fail.status().code() == absl::StatusCode::kInvalidArgument);
  Check(skip->skipped.total() >= 1);
  int64_t line = 0, column = 0;
  std::string_view rest;
  const std::string message(fail.status().message());
  Check(Where(message, &line, &column, &rest));
  Check(line >= 1 && column >= 1);
  Check(static_cast<size_t>(column) <= LineOf(bytes, line).size() + 1);
  Check(rest.find(", got '") != std::string_view::npos && rest.back() == '\'');
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
  o.format = DataFormat::kCriteo;
  o.threads = 1;
  o.dense_transform = static_cast<DenseTransform>(knobs % 3);
  o.labels = static_cast<LabelKind>((knobs >> 5) % 3);
  Run(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), o);
  return 0;
}
