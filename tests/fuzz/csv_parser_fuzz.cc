// libFuzzer target for the CSV parser (core/data/readers.h). An input is one knob
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
//   build-asan/tests/fuzz/csv_parser_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/csv_parser.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/data/readers.h"
#include "parser_fuzz.h"

namespace shardwild {
namespace {

using namespace fuzz;  // Check, CheckPolicies, kFile

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
  (void)CheckPolicies(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), o, CheckDataset, Same);
  return 0;
}
