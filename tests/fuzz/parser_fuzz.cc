// libFuzzer targets for the text parsers (core/readers.h), one binary per
// format: criteo_parser_fuzz, libsvm_parser_fuzz, text_parser_fuzz and
// csv_parser_fuzz (this file, built with SHARDWILD_FUZZ_FORMAT set to the
// DataFormat). The input is a whole file: ParseBuffer must return a Status
// for any bytes, under both bad-row policies, and every Dataset it accepts
// must be well formed (offsets, sizes, labels in range). The first byte picks
// options (label kind, n-grams, dense transform). Build with
// -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-fuzz/tests/fuzz/criteo_parser_fuzz tests/fuzz/corpus/criteo_parser -max_total_time=60
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/dataset.h"
#include "core/readers.h"

namespace shardwild {
namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckDataset(const Dataset& d, const ReadOptions& o) {
  Check(d.count >= 0);
  Check(d.dense.size() == static_cast<size_t>(d.count * d.dense_dim));
  if (o.labels == LabelKind::kRegression) {
    Check(d.targets.size() == static_cast<size_t>(d.count) && d.labels.empty());
  } else {
    Check(d.labels.size() == static_cast<size_t>(d.count));
    for (int32_t l : d.labels) Check(l >= 0 && l < d.num_classes);
  }
  if (d.multi_label()) {
    Check(d.label_offsets.size() == static_cast<size_t>(d.count + 1) && d.label_offsets.front() == 0);
    Check(d.label_offsets.back() == static_cast<int64_t>(d.label_sets.size()));
    for (int64_t r = 0; r < d.count; ++r) {
      Check(d.label_offsets[r] < d.label_offsets[r + 1]);
      Check(d.label_sets[d.label_offsets[r]] == d.labels[r]);
    }
  }
  for (const SparseField& f : d.fields) {
    Check(f.offsets.size() == static_cast<size_t>(d.count + 1) && f.offsets.front() == 0);
    for (int64_t r = 0; r < d.count; ++r) Check(f.offsets[r] <= f.offsets[r + 1]);
    Check(f.offsets.back() == static_cast<int64_t>(f.ids.size()));
    Check(f.weights.empty() || f.weights.size() == f.ids.size());
  }
  if (o.on_error == OnBadRow::kFail) Check(d.skipped.total() == 0);
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  if (size == 0) return 0;
  const uint8_t knobs = data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  ReadOptions o;
  o.format = static_cast<DataFormat>(SHARDWILD_FUZZ_FORMAT);
  o.threads = 1;
  o.dense_transform = static_cast<DenseTransform>(knobs % 3);
  switch (o.format) {
    case DataFormat::kText:
      o.labels = LabelKind::kMultiClass;
      o.text.word_ngrams = 1 + (knobs >> 2) % 2;
      o.text.ngrams_field = (knobs >> 3) % 2;
      break;
    case DataFormat::kCsv:
      o.csv.label = "y";
      o.csv.dense = {"a", "b"};
      o.csv.categorical = {"c"};
      o.csv.delimiter = (knobs >> 4) % 2 ? ';' : ',';
      [[fallthrough]];
    default:
      o.labels = static_cast<LabelKind>((knobs >> 5) % 3);
      break;
  }
  for (OnBadRow policy : {OnBadRow::kFail, OnBadRow::kSkip}) {
    o.on_error = policy;
    absl::StatusOr<Dataset> d = ParseBuffer(bytes, "fuzz", o);
    if (d.ok()) CheckDataset(*d, o);
  }
  return 0;
}
