// libFuzzer target for the libsvm/svmlight parser (core/data/readers.h). An
// input is one knob byte (bits 5-7: the label kind) and then a whole file.
// ParseBuffer must return a Status for any bytes, under both bad-row
// policies, and:
//  - a data set it accepts is well formed: one field "features" whose ids
//    strictly increase within a record, one finite weight per id, labels in
//    range (finite targets for regression);
//  - the policies agree: kFail accepts exactly when kSkip skips nothing, and
//    then both give the same data set; a kFail error names a line of the
//    input and a column inside it, and moves with the first line number.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-asan/tests/fuzz/libsvm_parser_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/libsvm_parser.
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
  Check(d.count >= 0 && d.dense_dim == 0 && d.dense.empty());
  if (o.labels == LabelKind::kRegression) {
    Check(d.targets.size() == static_cast<size_t>(d.count) && d.labels.empty() && d.num_classes == 0);
    for (float t : d.targets) Check(std::isfinite(t));
  } else {
    Check(d.labels.size() == static_cast<size_t>(d.count) && d.targets.empty());
    if (o.labels == LabelKind::kBinary) Check(d.num_classes == 2);
    for (int32_t l : d.labels) Check(l >= 0 && l < d.num_classes);
  }
  Check(!d.multi_label() && d.class_names.empty());
  Check(d.fields.size() == 1 && d.fields[0].name == "features");
  const SparseField& f = d.fields[0];
  Check(f.offsets.size() == static_cast<size_t>(d.count + 1) && f.offsets.front() == 0);
  Check(f.offsets.back() == static_cast<int64_t>(f.ids.size()) && f.weights.size() == f.ids.size());
  for (int64_t r = 0; r < d.count; ++r) {
    Check(f.offsets[r] <= f.offsets[r + 1]);
    for (int64_t i = f.offsets[r] + 1; i < f.offsets[r + 1]; ++i) Check(f.ids[i - 1] < f.ids[i]);
  }
  for (float w : f.weights) Check(std::isfinite(w));
  if (o.on_error == OnBadRow::kFail) Check(d.skipped.total() == 0);
}

bool Same(const Dataset& a, const Dataset& b) {
  return a.count == b.count && a.labels == b.labels && a.targets == b.targets && a.num_classes == b.num_classes &&
         a.fields.size() == b.fields.size() && a.fields[0].offsets == b.fields[0].offsets &&
         a.fields[0].ids == b.fields[0].ids && a.fields[0].weights == b.fields[0].weights;
}


}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  if (size == 0) return 0;
  const uint8_t knobs = data[0];
  ReadOptions o;
  o.format = DataFormat::kLibsvm;
  o.threads = 1;
  o.labels = static_cast<LabelKind>((knobs >> 5) % 3);
  (void)CheckPolicies(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), o, CheckDataset, Same);
  return 0;
}
