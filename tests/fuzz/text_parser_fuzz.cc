// libFuzzer target for the fastText-style text parser (core/data/readers.h). An
// input is one knob byte (unused; kept so that inputs look like the other
// parsers') and then a whole file, parsed with word_ngrams 1, with 2 into
// "tokens" and with 2 into an "ngrams" field, each under both bad-row
// policies. ParseBuffer must return a Status for any bytes, and:
//  - a data set it accepts is well formed: sorted, distinct class names,
//    each the label of some record, labels in range, multi-label sets
//    without duplicates whose first entry is labels[r];
//  - the three n-gram settings agree on records, labels and tokens: "tokens"
//    of the ngrams-field parse is the word_ngrams 1 parse, "ngrams" holds
//    max(w - 1, 0) ids for w words, and word_ngrams 2 into "tokens" 2w - 1;
//  - the policies agree: kFail accepts exactly when kSkip skips nothing, and
//    then both give the same data set; a kFail error names a line of the
//    input and a column inside it, and moves with the first line number;
//  - reading again with the class names found as the dictionary gives the
//    same data set (the same rows skipped, perhaps for other reasons).
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-asan/tests/fuzz/text_parser_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/text_parser.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/data/readers.h"
#include "parser_fuzz.h"

namespace shardwild {
namespace {

using namespace fuzz;  // Check, CheckPolicies, kFile

void CheckField(const SparseField& f, const Dataset& d) {
  Check(f.offsets.size() == static_cast<size_t>(d.count + 1) && f.offsets.front() == 0);
  for (int64_t r = 0; r < d.count; ++r) Check(f.offsets[r] <= f.offsets[r + 1]);
  Check(f.offsets.back() == static_cast<int64_t>(f.ids.size()) && f.weights.empty());
}

void CheckDataset(const Dataset& d, const ReadOptions& o) {
  Check(d.count >= 0 && d.dense_dim == 0 && d.dense.empty() && d.targets.empty());
  Check(d.labels.size() == static_cast<size_t>(d.count));
  Check(d.num_classes == static_cast<int32_t>(d.class_names.size()));
  if (o.class_names == nullptr) {
    Check(std::is_sorted(d.class_names.begin(), d.class_names.end()));
    Check(std::adjacent_find(d.class_names.begin(), d.class_names.end()) == d.class_names.end());
    // Every class found is the label of a record that was kept.
    std::vector<bool> used(d.class_names.size(), false);
    for (int32_t l : d.multi_label() ? d.label_sets : d.labels) {
      Check(l >= 0 && static_cast<size_t>(l) < used.size());
      used[l] = true;
    }
    Check(std::find(used.begin(), used.end(), false) == used.end());
  }
  for (const std::string& n : d.class_names) Check(!n.empty());
  for (int32_t l : d.labels) Check(l >= 0 && l < d.num_classes);
  if (d.multi_label()) {
    Check(d.label_offsets.size() == static_cast<size_t>(d.count + 1) && d.label_offsets.front() == 0);
    Check(d.label_offsets.back() == static_cast<int64_t>(d.label_sets.size()));
    bool several = false;
    for (int64_t r = 0; r < d.count; ++r) {
      const int64_t b = d.label_offsets[r], e = d.label_offsets[r + 1];
      Check(b < e && d.label_sets[b] == d.labels[r]);
      several = several || e - b > 1;
      for (int64_t i = b; i < e; ++i) {
        Check(d.label_sets[i] >= 0 && d.label_sets[i] < d.num_classes);
        Check(std::find(d.label_sets.begin() + b, d.label_sets.begin() + i, d.label_sets[i]) ==
              d.label_sets.begin() + i);
      }
    }
    Check(several);  // else the arrays are left empty
  } else {
    Check(d.label_sets.empty());
  }
  const bool own_field = o.text.word_ngrams == 2 && o.text.ngrams_field;
  Check(d.fields.size() == (own_field ? 2u : 1u) && d.fields[0].name == "tokens");
  if (own_field) Check(d.fields[1].name == "ngrams");
  for (const SparseField& f : d.fields) CheckField(f, d);
  Check(d.tokens >= 0);
  if (o.on_error == OnBadRow::kFail) Check(d.skipped.total() == 0);
}

bool SameLabels(const Dataset& a, const Dataset& b) {
  return a.count == b.count && a.labels == b.labels && a.num_classes == b.num_classes &&
         a.class_names == b.class_names && a.label_offsets == b.label_offsets && a.label_sets == b.label_sets &&
         a.tokens == b.tokens && a.skipped.by_reason == b.skipped.by_reason;
}

bool Same(const Dataset& a, const Dataset& b) {
  if (!SameLabels(a, b) || a.fields.size() != b.fields.size()) return false;
  for (size_t f = 0; f < a.fields.size(); ++f) {
    if (a.fields[f].offsets != b.fields[f].offsets || a.fields[f].ids != b.fields[f].ids) return false;
  }
  return true;
}

// Parses under both policies and checks that they agree; returns the kSkip
// data set (which always exists: every row error is a skipped row).

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  ReadOptions o;
  o.format = DataFormat::kText;
  o.labels = LabelKind::kMultiClass;
  o.threads = 1;
  const Dataset unigrams = *CheckPolicies(bytes, o, CheckDataset, Same);
  o.text.word_ngrams = 2;
  const Dataset in_tokens = *CheckPolicies(bytes, o, CheckDataset, Same);
  o.text.ngrams_field = true;
  const Dataset own_field = *CheckPolicies(bytes, o, CheckDataset, Same);
  Check(SameLabels(unigrams, in_tokens) && SameLabels(unigrams, own_field));
  const SparseField& words = unigrams.fields[0];
  Check(own_field.fields[0].offsets == words.offsets && own_field.fields[0].ids == words.ids);
  for (int64_t r = 0; r < unigrams.count; ++r) {
    const int64_t w = words.size(r);
    Check(own_field.fields[1].size(r) == std::max<int64_t>(w - 1, 0));
    Check(in_tokens.fields[0].size(r) == std::max<int64_t>(2 * w - 1, 0));
  }
  Check(unigrams.tokens == static_cast<int64_t>(words.ids.size()));
  // The class names found, given as the dictionary: the same data set.
  if (!unigrams.class_names.empty()) {
    o = ReadOptions();
    o.format = DataFormat::kText;
    o.labels = LabelKind::kMultiClass;
    o.on_error = OnBadRow::kSkip;
    o.class_names = &unigrams.class_names;
    absl::StatusOr<Dataset> again = ParseBuffer(bytes, kFile, 1, o);
    Check(again.ok());
    // A row skipped for a label may be skipped for another reason now (an
    // unknown name before an empty one): compare the counts only.
    Check(again->skipped.total() == unigrams.skipped.total());
    again->skipped = unigrams.skipped;
    Check(Same(*again, unigrams));
  }
  return 0;
}
