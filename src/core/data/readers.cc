#include "core/data/readers.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "core/io/crc32c.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"
#include "core/io/atomic_file.h"
#include "core/io/compressed.h"
#include "core/io/writable_file.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Field parsing.

// Where the number in `s` starts: after an optional '+', which must not be
// followed by another sign ("+-1" is not a number). nullptr: nothing there.
const char* NumberStart(std::string_view s) {
  if (s.empty()) return nullptr;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') {
    ++b;
    if (b == e || *b == '-' || *b == '+') return nullptr;
  }
  return b;
}

// An integer, the whole of `s`, within int64.
bool ParseInt(std::string_view s, int64_t* out) {
  const char* b = NumberStart(s);
  if (b == nullptr) return false;
  const char* e = s.data() + s.size();
  const auto [p, ec] = std::from_chars(b, e, *out);
  return ec == std::errc() && p == e;
}

// A finite real number, the whole of `s` (no "inf", "nan" or hex floats).
bool ParseReal(std::string_view s, double* out) {
  const char* b = NumberStart(s);
  if (b == nullptr) return false;
  const char* e = s.data() + s.size();
  const auto [p, ec] = std::from_chars(b, e, *out, std::chars_format::general);
  return ec == std::errc() && p == e && std::isfinite(*out);
}

// A real number that is also finite as a float (libsvm values, targets).
bool ParseFloat(std::string_view s, float* out) {
  double v = 0;
  if (!ParseReal(s, &v) || !(std::fabs(v) <= static_cast<double>(std::numeric_limits<float>::max()))) return false;
  *out = static_cast<float>(v);
  return true;
}

// The value of each byte as a hex digit, or -1.
constexpr std::array<int8_t, 256> kHexDigit = [] {
  std::array<int8_t, 256> t{};
  for (int c = 0; c < 256; ++c) {
    t[c] = c >= '0' && c <= '9' ? static_cast<int8_t>(c - '0')
           : c >= 'a' && c <= 'f' ? static_cast<int8_t>(c - 'a' + 10)
           : c >= 'A' && c <= 'F' ? static_cast<int8_t>(c - 'A' + 10)
                                  : int8_t{-1};
  }
  return t;
}();

// 1..8 hex digits, either case.
bool ParseHex32(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 8) return false;
  uint32_t v = 0;
  int bad = 0;  // any digit's -1 sets its sign bit
  for (unsigned char c : s) {
    const int d = kHexDigit[c];
    bad |= d;
    v = v << 4 | static_cast<uint32_t>(d & 15);
  }
  if (bad < 0) return false;
  *out = v;
  return true;
}

// The fields of a line split at `sep`: field k is line[starts[k], ends[k]).
// Records the first `max` fields and returns how many there are.
size_t SplitAt(std::string_view line, char sep, size_t* starts, size_t* ends, size_t max) {
  size_t n = 0;
  size_t b = 0;
  auto cut = [&](size_t at) {
    if (n < max) {
      starts[n] = b;
      ends[n] = at;
    }
    ++n;
    b = at + 1;
  };
  size_t i = 0;
#if defined(__SSE2__)
  // 16 bytes at a time (SSE2 is part of x86-64): a mask of the separators.
  const __m128i want = _mm_set1_epi8(sep);
  for (; i + 16 <= line.size(); i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(line.data() + i));
    for (unsigned m = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, want))); m != 0; m &= m - 1) {
      cut(i + static_cast<size_t>(__builtin_ctz(m)));
    }
  }
#endif
  for (; i < line.size(); ++i) {
    if (line[i] == sep) cut(i);
  }
  cut(line.size());
  return n;
}

float Transform(double x, DenseTransform t) {
  switch (t) {
    case DenseTransform::kLog1p: return static_cast<float>(std::log1p(std::max(x, 0.0)));
    case DenseTransform::kLog3: return static_cast<float>(std::log(3.0 + std::max(x, -2.0)));
    case DenseTransform::kNone: return static_cast<float>(x);
  }
  return static_cast<float>(x);
}

// abseil's string_view may be its own type: convert explicitly.
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

inline bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// A libsvm line of blanks and perhaps a comment: an empty line (as svmlight
// files have them, and as scikit-learn reads them), not a row without a label.
bool IsBlankLibsvmLine(std::string_view line) {
  for (char c : line) {
    if (c == '#') return true;
    if (!IsSpace(c)) return false;
  }
  return true;
}

// A bad row: where and what.
struct BadRow {
  int64_t line = 0;     // relative to the chunk's first line (0-based) until resolved
  int64_t column = 0;   // 1-based byte column
  std::string reason;   // the SkippedRows key
  std::string what;     // what was expected
  std::string got;
};

// The result of parsing one chunk: a partial data set plus what the chunk
// can't resolve alone (label names, the first bad row).
struct Chunk {
  Dataset data;
  std::vector<std::string> label_names;  // text without a dictionary: chunk-local ids -> names
  std::optional<BadRow> bad;             // kFail: the first bad row (parsing stopped there)
  absl::Status error;                    // not a bad row: the parse itself failed (out of memory)
  int64_t lines = 0;                     // lines consumed (all of the chunk's unless it stopped at `bad`)
  bool abandoned = false;                // stopped early: an earlier chunk has a bad row (kFail)
};

// Column names and positions of a CSV file, from its header.
struct CsvLayout {
  size_t columns = 0;
  int label = -1;
  std::vector<int> dense;
  std::vector<int> categorical;
};

// Splits a CSV line into fields (double quotes, "" escapes). False on bad
// quoting. A field is a view into `line`, or for a quoted field into
// `*scratch`, which holds the unquoted text (reserved up front so that it
// never moves while the views exist); `starts` gets each field's byte offset.
// Allocates only when a line is longer than any before it.
bool SplitCsv(std::string_view line, char delim, std::string* scratch, std::vector<std::string_view>* fields,
              std::vector<size_t>* starts) {
  fields->clear();
  starts->clear();
  scratch->clear();
  scratch->reserve(line.size());
  size_t i = 0;
  for (;;) {
    starts->push_back(i);
    if (i < line.size() && line[i] == '"') {
      ++i;
      const size_t from = scratch->size();
      for (;;) {
        if (i >= line.size()) return false;  // unterminated
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            scratch->push_back('"');
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        scratch->push_back(line[i++]);
      }
      if (i < line.size() && line[i] != delim) return false;  // text after the closing quote
      fields->push_back(std::string_view(*scratch).substr(from));
    } else {
      const size_t from = i;
      while (i < line.size() && line[i] != delim) {
        if (line[i] == '"') return false;  // a quote inside an unquoted field
        ++i;
      }
      fields->push_back(line.substr(from, i - from));
    }
    if (i >= line.size()) break;
    ++i;  // the delimiter
  }
  return true;
}

class ChunkParser {
 public:
  // `first_bad` (may be null): the lowest index of a chunk that stopped at a
  // bad row (kFail), shared by the parsers of one input; this parser is
  // chunk `index` and gives up once an earlier chunk has failed.
  ChunkParser(const ReadOptions& o, const CsvLayout* csv, size_t index, std::atomic<size_t>* first_bad)
      : o_(o), csv_(csv), index_(index), first_bad_(first_bad) {
    Dataset& d = out_.data;
    switch (o.format) {
      case DataFormat::kCriteo:
        d.dense_dim = 13;
        for (int i = 1; i <= 13; ++i) d.dense_names.push_back(absl::StrCat("I", i));
        for (int i = 1; i <= 26; ++i) AddField(absl::StrCat("C", i));
        break;
      case DataFormat::kLibsvm:
        AddField("features");
        break;
      case DataFormat::kText:
        AddField("tokens");
        if (o.text.word_ngrams == 2 && o.text.ngrams_field) AddField("ngrams");
        break;
      case DataFormat::kCsv:
        d.dense_dim = static_cast<int64_t>(o.csv.dense.size());
        d.dense_names = o.csv.dense;
        for (const std::string& c : o.csv.categorical) AddField(c);
        break;
      case DataFormat::kIdx:
        break;
    }
    if (o.class_names) {
      for (size_t i = 0; i < o.class_names->size(); ++i) dict_[(*o.class_names)[i]] = static_cast<int32_t>(i);
    }
    if (o.format == DataFormat::kCriteo) {
      for (int i = 0; i < kSmallInts; ++i) small_ints_[i] = Transform(i, o.dense_transform);
    }
  }

  // Parses `bytes` (whole lines); stops at the first bad row under kFail.
  // The arrays are reserved early for `reserve_bytes` of input (chunk 0
  // reserves for the whole input, so that the others can be appended to it
  // without a reallocation).
  Chunk ParseAll(std::string_view bytes, size_t reserve_bytes) {
    ParseLines(bytes, std::max(reserve_bytes, bytes.size()));
    if (o_.format == DataFormat::kText && multi_) {
      out_.data.label_offsets = std::move(label_offsets_);
      out_.data.label_sets = std::move(label_sets_);
    }
    return std::move(out_);
  }

 private:
  void ParseLines(std::string_view bytes, size_t reserve_bytes) {
    size_t pos = 0;
    int64_t line_index = 0;
    while (pos < bytes.size()) {
      const size_t nl = bytes.find('\n', pos);
      const size_t end = nl == std::string_view::npos ? bytes.size() : nl;
      std::string_view line = bytes.substr(pos, end - pos);
      pos = nl == std::string_view::npos ? bytes.size() : nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const int64_t this_line = line_index++;
      if (this_line == kSampleLines && pos < reserve_bytes) ReserveFor(static_cast<double>(reserve_bytes) / pos);
      if (first_bad_ != nullptr && (this_line & 1023) == 0 && first_bad_->load(std::memory_order_relaxed) < index_) {
        out_.abandoned = true;  // the result can't be used: an earlier chunk has the first bad row
        break;
      }
      if (line.empty() || (o_.format == DataFormat::kLibsvm && IsBlankLibsvmLine(line))) continue;
      std::optional<BadRow> bad = ParseLine(line);
      if (bad) {
        Rollback();
        bad->line = this_line;
        if (o_.on_error == OnBadRow::kFail) {
          out_.bad = std::move(bad);
          if (first_bad_ != nullptr) {
            // fetch_min. Relaxed: the value is only a hint to stop early;
            // the results are read after the threads are joined.
            size_t seen = first_bad_->load(std::memory_order_relaxed);
            while (index_ < seen && !first_bad_->compare_exchange_weak(seen, index_, std::memory_order_relaxed)) {
            }
          }
          break;
        }
        ++out_.data.skipped.by_reason[bad->reason];
        continue;
      }
      Commit();
    }
    out_.lines = line_index;
  }

  // After kSampleLines lines, the arrays are reserved for `scale` times what
  // they hold (plus 10%), so they rarely grow (and copy) again.
  static constexpr int64_t kSampleLines = 1024;
  void ReserveFor(double scale) {
    Dataset& d = out_.data;
    auto grow = [&](auto& v) { v.reserve(static_cast<size_t>(static_cast<double>(v.size()) * scale * 1.1) + 16); };
    grow(d.dense);
    grow(d.labels);
    grow(d.targets);
    for (SparseField& f : d.fields) {
      grow(f.offsets);
      grow(f.ids);
      grow(f.weights);
    }
  }

  void AddField(const std::string& name) {
    SparseField f;
    f.name = name;
    f.offsets.push_back(0);
    out_.data.fields.push_back(std::move(f));
  }

  // Undo a partly parsed record: trim every array back to the last record.
  void Rollback() {
    Dataset& d = out_.data;
    d.dense.resize(d.count * d.dense_dim);
    d.labels.resize(o_.labels == LabelKind::kRegression ? 0 : d.count);
    d.targets.resize(o_.labels == LabelKind::kRegression ? d.count : 0);
    for (SparseField& f : d.fields) {
      f.ids.resize(f.offsets.back());
      if (!f.weights.empty() || o_.format == DataFormat::kLibsvm) f.weights.resize(f.offsets.back());
    }
    if (o_.format == DataFormat::kText) {
      label_sets_.resize(label_offsets_.back());
      // A class first named on the rejected line is no class (no kept record has it).
      while (out_.label_names.size() > names_before_) {
        dict_.erase(out_.label_names.back());
        out_.label_names.pop_back();
      }
    }
    pending_tokens_ = 0;
  }

  void Commit() {
    Dataset& d = out_.data;
    ++d.count;
    for (SparseField& f : d.fields) f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
    if (o_.format == DataFormat::kText) {
      label_offsets_.push_back(static_cast<int64_t>(label_sets_.size()));
      d.tokens += pending_tokens_;
      pending_tokens_ = 0;
    }
  }

  static BadRow Bad(size_t column, std::string reason, std::string what, std::string_view got) {
    return BadRow{0, static_cast<int64_t>(column) + 1, std::move(reason), std::move(what), std::string(got.substr(0, 64))};
  }

  // The label in `s` as the label kind says, or a bad row at `column`.
  std::optional<BadRow> ParseLabel(std::string_view s, size_t column) {
    Dataset& d = out_.data;
    switch (o_.labels) {
      case LabelKind::kBinary: {
        if (s == "1" || s == "+1") {
          d.labels.push_back(1);
        } else if (s == "0" || s == "-1") {
          d.labels.push_back(0);
        } else {
          return Bad(column, "bad label", "label: expected 0/1 or -1/+1", s);
        }
        return std::nullopt;
      }
      case LabelKind::kMultiClass: {
        int64_t v = 0;
        if (!ParseInt(s, &v) || v < 0 || v > (1 << 24)) {
          return Bad(column, "bad label", "label: expected a class number >= 0", s);
        }
        d.labels.push_back(static_cast<int32_t>(v));
        return std::nullopt;
      }
      case LabelKind::kRegression: {
        float v = 0;
        if (!ParseFloat(s, &v)) return Bad(column, "bad label", "label: expected a real number (within float range)", s);
        d.targets.push_back(v);
        return std::nullopt;
      }
    }
    return std::nullopt;
  }

  std::optional<BadRow> ParseLine(std::string_view line) {
    switch (o_.format) {
      case DataFormat::kCriteo: return ParseCriteo(line);
      case DataFormat::kLibsvm: return ParseLibsvm(line);
      case DataFormat::kText: return ParseText(line);
      case DataFormat::kCsv: return ParseCsv(line);
      case DataFormat::kIdx: break;
    }
    return Bad(0, "bad format", "a text format", line);
  }

  std::optional<BadRow> ParseCriteo(std::string_view line) {
    size_t starts[40];
    size_t ends[40];
    const size_t n = SplitAt(line, '\t', starts, ends, 40);
    if (n != 40) {
      return Bad(0, "wrong field count", absl::StrCat("expected 40 tab-separated fields (label, I1..I13, C1..C26), found ", n),
                 line);
    }
    auto field = [&](size_t k) { return line.substr(starts[k], ends[k] - starts[k]); };
    if (auto bad = ParseLabel(field(0), starts[0])) return bad;
    Dataset& d = out_.data;
    for (int j = 0; j < 13; ++j) {
      const std::string_view f = field(1 + j);
      int64_t v = 0;
      if (!f.empty() && !ParseInt(f, &v)) {
        return Bad(starts[1 + j], "non-numeric value", absl::StrCat("field I", j + 1, ": expected an integer"), f);
      }
      d.dense.push_back(v >= 0 && v < kSmallInts ? small_ints_[v] : Transform(static_cast<double>(v), o_.dense_transform));
    }
    for (int j = 0; j < 26; ++j) {
      const std::string_view f = field(14 + j);
      if (f.empty()) continue;
      uint64_t v = 0;
      if (!ParseHex32(f, &v)) {
        return Bad(starts[14 + j], "bad hex", absl::StrCat("field C", j + 1, ": expected a hex value of at most 8 digits"),
                   f);
      }
      d.fields[j].ids.push_back(v);
    }
    return std::nullopt;
  }

  std::optional<BadRow> ParseLibsvm(std::string_view line) {
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    size_t i = 0;
    auto next = [&](size_t* start) -> std::string_view {
      while (i < line.size() && IsSpace(line[i])) ++i;
      *start = i;
      while (i < line.size() && !IsSpace(line[i])) ++i;
      return line.substr(*start, i - *start);
    };
    size_t start = 0;
    const std::string_view label = next(&start);
    if (label.empty()) return Bad(0, "no label", "expected a label first", line);
    if (auto bad = ParseLabel(label, start)) return bad;
    SparseField& f = out_.data.fields[0];
    int64_t last = 0;
    for (;;) {
      const std::string_view tok = next(&start);
      if (tok.empty()) break;
      const size_t colon = tok.find(':');
      const std::string_view idx = tok.substr(0, colon);
      int64_t k = 0;
      if (!ParseInt(idx, &k) || k < 0) return Bad(start, "non-numeric value", "expected a feature index idx[:value]", tok);
      if (k == 0) return Bad(start, "index 0", "feature indices start at 1", tok);
      if (k <= last) {
        return Bad(start, "unsorted indices", absl::StrCat("feature indices must increase (the one before was ", last, ")"),
                   tok);
      }
      last = k;
      float v = 1.0f;
      if (colon != std::string_view::npos && !ParseFloat(tok.substr(colon + 1), &v)) {
        return Bad(start + colon + 1, "non-numeric value", "expected a real feature value (within float range) after ':'",
                   tok);
      }
      f.ids.push_back(static_cast<uint64_t>(k - 1));
      f.weights.push_back(v);
    }
    return std::nullopt;
  }

  std::optional<BadRow> ParseText(std::string_view line) {
    static constexpr std::string_view kPrefix = "__label__";
    size_t i = 0;
    size_t first = 0;
    int nlabels = 0;
    const size_t sets_before = label_sets_.size();
    names_before_ = out_.label_names.size();
    SparseField& tokens = out_.data.fields[0];
    SparseField& ngrams = out_.data.fields.size() > 1 ? out_.data.fields[1] : out_.data.fields[0];
    std::string_view prev;
    int64_t words = 0;
    for (;;) {
      while (i < line.size() && (IsSpace(line[i]) || line[i] == '\v' || line[i] == '\f')) ++i;
      if (i >= line.size()) break;
      const size_t start = i;
      while (i < line.size() && !(IsSpace(line[i]) || line[i] == '\v' || line[i] == '\f')) ++i;
      const std::string_view tok = line.substr(start, i - start);
      if (words == 0 && tok.substr(0, kPrefix.size()) == kPrefix) {
        const std::string_view name = tok.substr(kPrefix.size());
        if (name.empty()) return Bad(start, "bad label", "expected a class name after __label__", tok);
        int32_t id = 0;
        if (o_.class_names) {
          auto it = dict_.find(name);
          if (it == dict_.end()) return Bad(start, "unknown label", "label: expected a class of the training data", tok);
          id = it->second;
        } else {
          auto it = dict_.find(name);
          if (it == dict_.end()) {
            it = dict_.emplace(std::string(name), static_cast<int32_t>(out_.label_names.size())).first;
            out_.label_names.emplace_back(name);
          }
          id = it->second;
        }
        if (nlabels == 0) first = label_sets_.size();
        label_sets_.push_back(id);
        ++nlabels;
        continue;
      }
      if (nlabels == 0) return Bad(start, "no label", "expected __label__<name> first", tok);
      tokens.ids.push_back(Fnv1a64(tok));
      if (o_.text.word_ngrams == 2 && words > 0) {
        uint64_t h = Fnv1a64Extend(Fnv1a64(prev), "\x01");
        h = Fnv1a64Extend(h, tok);
        ngrams.ids.push_back(h);
      }
      prev = tok;
      ++words;
    }
    if (nlabels == 0) return Bad(0, "no label", "expected __label__<name> first", line);
    // Drop duplicate labels of a record, keep the first occurrence order.
    auto b = label_sets_.begin() + static_cast<int64_t>(sets_before);
    for (auto it = b; it != label_sets_.end();) {
      if (std::find(b, it, *it) != it) {
        it = label_sets_.erase(it);
      } else {
        ++it;
      }
    }
    out_.data.labels.push_back(label_sets_[first]);
    if (label_sets_.size() - sets_before > 1) multi_ = true;
    pending_tokens_ = words;
    return std::nullopt;
  }

  std::optional<BadRow> ParseCsv(std::string_view line) {
    if (!SplitCsv(line, o_.csv.delimiter, &csv_scratch_, &csv_fields_, &csv_starts_)) {
      return Bad(0, "bad quoting", "fields quoted with \"...\" (\"\" inside for a quote)", line);
    }
    if (csv_fields_.size() != csv_->columns) {
      return Bad(0, "wrong field count", absl::StrCat("expected ", csv_->columns, " fields as in the header, found ",
                                                      csv_fields_.size()),
                 line);
    }
    if (auto bad = ParseLabel(csv_fields_[csv_->label], csv_starts_[csv_->label])) return bad;
    Dataset& d = out_.data;
    for (size_t j = 0; j < csv_->dense.size(); ++j) {
      const int c = csv_->dense[j];
      double v = 0;
      const float x = csv_fields_[c].empty() || !ParseReal(csv_fields_[c], &v)
                          ? std::numeric_limits<float>::quiet_NaN()
                          : Transform(v, o_.dense_transform);
      if (!csv_fields_[c].empty() && !std::isfinite(x)) {
        return Bad(csv_starts_[c], "non-numeric value",
                   absl::StrCat("column ", o_.csv.dense[j], ": expected a number (within float range)"), csv_fields_[c]);
      }
      d.dense.push_back(csv_fields_[c].empty() ? Transform(0.0, o_.dense_transform) : x);
    }
    for (size_t j = 0; j < csv_->categorical.size(); ++j) {
      const std::string_view v = csv_fields_[csv_->categorical[j]];
      if (!v.empty()) d.fields[j].ids.push_back(Fnv1a64(v));
    }
    return std::nullopt;
  }

  static uint64_t Fnv1a64Extend(uint64_t h, std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
    return h;
  }

 private:
  const ReadOptions& o_;
  const CsvLayout* csv_;
  const size_t index_;
  std::atomic<size_t>* const first_bad_;
  Chunk out_;
  // Class name -> id (the given dictionary's, or chunk-local); looked up by
  // string_view without building a string.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, NameHash, std::equal_to<>> dict_;
  std::vector<int64_t> label_offsets_{0};
  std::vector<int32_t> label_sets_;
  bool multi_ = false;
  int64_t pending_tokens_ = 0;
  size_t names_before_ = 0;  // text: label_names.size() before the current line
  // Criteo: the transform of 0..kSmallInts-1 (most values), computed once.
  static constexpr int kSmallInts = 1024;
  std::array<float, kSmallInts> small_ints_{};
  std::string csv_scratch_;
  std::vector<std::string_view> csv_fields_;
  std::vector<size_t> csv_starts_;
};

// Reads the CSV header: the first non-empty line of `bytes`, whose first
// line is file line `first_line`. Sets `*consumed` to the bytes and `*lines`
// to the lines up to and including it.
absl::StatusOr<CsvLayout> ParseCsvHeader(std::string_view bytes, std::string_view file, int64_t first_line,
                                         const CsvOptions& csv, size_t* consumed, int64_t* lines) {
  size_t pos = 0;
  *lines = 0;
  std::string_view line;
  while (pos < bytes.size()) {
    const size_t nl = bytes.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? bytes.size() : nl;
    line = bytes.substr(pos, end - pos);
    pos = nl == std::string_view::npos ? bytes.size() : nl + 1;
    ++*lines;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) break;
  }
  *consumed = pos;
  if (line.empty()) return absl::InvalidArgumentError(absl::StrCat(AV(file), ": expected a CSV header line, the file is empty"));
  std::string scratch;
  std::vector<std::string_view> names;
  std::vector<size_t> starts;
  if (!SplitCsv(line, csv.delimiter, &scratch, &names, &starts)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(file), ":", first_line - 1 + *lines, ":1: header: bad quoting, got '", AV(line), "'"));
  }
  CsvLayout layout;
  layout.columns = names.size();
  auto find = [&](const std::string& key, const std::string& name) -> absl::StatusOr<int> {
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<int>(i);
    }
    return absl::InvalidArgumentError(absl::StrCat(AV(file), ":", first_line - 1 + *lines, ":1: ", key,
                                                   ": the header has no column '", name,
                                                   "' (it has ", names.size(), " columns)"));
  };
  SW_ASSIGN_OR_RETURN(layout.label, find("data.csv.label", csv.label));
  for (const std::string& c : csv.dense) {
    SW_ASSIGN_OR_RETURN(int i, find("data.csv.dense", c));
    layout.dense.push_back(i);
  }
  for (const std::string& c : csv.categorical) {
    SW_ASSIGN_OR_RETURN(int i, find("data.csv.categorical", c));
    layout.categorical.push_back(i);
  }
  return layout;
}

absl::Status CheckOptions(const ReadOptions& o) {
  if (o.format == DataFormat::kIdx) return absl::InvalidArgumentError("data.format idx is not a text format");
  if (o.format == DataFormat::kText && o.labels != LabelKind::kMultiClass) {
    return absl::InvalidArgumentError("data.format text: fastText labels are classes; use model.head softmax");
  }
  if (o.format == DataFormat::kText && o.text.word_ngrams != 1 && o.text.word_ngrams != 2) {
    return absl::InvalidArgumentError(absl::StrCat("data.text.word_ngrams: must be 1 or 2, got ", o.text.word_ngrams));
  }
  if (o.format == DataFormat::kCsv && o.csv.label.empty()) {
    return absl::InvalidArgumentError("data.csv.label: is required with data.format csv");
  }
  if (o.format == DataFormat::kCsv && (o.csv.delimiter == '"' || o.csv.delimiter == '\n' || o.csv.delimiter == '\r')) {
    return absl::InvalidArgumentError("data.csv.delimiter: must not be a quote or a line end");
  }
  if (o.max_records < 0) return absl::InvalidArgumentError(absl::StrCat("max_records: must be >= 0, got ", o.max_records));
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("data.reader_threads: must be >= 0 (0 = auto), got ", o.threads));
  }
  return absl::OkStatus();
}

// Joins the chunks in order into one data set; resolves the first bad row's
// line and the text labels' dictionary. `first_line` is the 0-based file
// line of chunk 0's first line.
absl::StatusOr<Dataset> Join(std::vector<Chunk> chunks, int64_t first_line, std::string_view file, const ReadOptions& o) {
  // Every chunk before the first bad one was parsed to its end, so its line
  // count is exact and the bad row's file line follows from them.
  int64_t line = first_line;
  for (const Chunk& c : chunks) {
    if (!c.error.ok()) return c.error;
    if (c.bad) {
      const BadRow& b = *c.bad;
      return absl::InvalidArgumentError(
          absl::StrCat(AV(file), ":", line + b.line + 1, ":", b.column, ": ", b.what, ", got '", AV(b.got), "'"));
    }
    if (c.abandoned) return absl::InternalError("readers: a chunk gave up without an earlier bad row");  // can't happen
    line += c.lines;
  }
  // Text without a dictionary: the sorted names of every chunk.
  std::vector<std::string> names;
  std::vector<std::vector<int32_t>> remap(chunks.size());
  if (o.format == DataFormat::kText && o.class_names == nullptr) {
    for (const Chunk& c : chunks) names.insert(names.end(), c.label_names.begin(), c.label_names.end());
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    for (size_t c = 0; c < chunks.size(); ++c) {
      for (const std::string& n : chunks[c].label_names) {
        remap[c].push_back(static_cast<int32_t>(std::lower_bound(names.begin(), names.end(), n) - names.begin()));
      }
    }
  }
  const bool any_multi = std::any_of(chunks.begin(), chunks.end(), [](const Chunk& c) { return c.data.multi_label(); });
  // A chunk without multi-label records gets label_offsets/label_sets of one
  // label each, so that all chunks can be joined the same way.
  auto ensure_multi = [](Dataset& x) {
    if (x.multi_label()) return;
    x.label_offsets.resize(x.count + 1);
    for (int64_t r = 0; r <= x.count; ++r) x.label_offsets[r] = r;
    x.label_sets = x.labels;
  };
  for (size_t c = 0; c < chunks.size(); ++c) {
    Dataset& x = chunks[c].data;
    if (!remap[c].empty()) {
      for (int32_t& l : x.labels) l = remap[c][l];
      for (int32_t& l : x.label_sets) l = remap[c][l];
    }
    if (any_multi) ensure_multi(x);
  }
  // The totals, to reserve them once: no reallocation while appending.
  int64_t count = 0, label_sets = 0;
  std::vector<int64_t> ids(chunks[0].data.fields.size(), 0);
  for (const Chunk& c : chunks) {
    count += c.data.count;
    label_sets += static_cast<int64_t>(c.data.label_sets.size());
    for (size_t f = 0; f < ids.size(); ++f) ids[f] += static_cast<int64_t>(c.data.fields[f].ids.size());
  }
  Dataset d = std::move(chunks[0].data);
  if (chunks.size() > 1) {
    d.dense.reserve(count * d.dense_dim);
    if (o.labels == LabelKind::kRegression) {
      d.targets.reserve(count);
    } else {
      d.labels.reserve(count);
    }
    if (any_multi) {
      d.label_offsets.reserve(count + 1);
      d.label_sets.reserve(label_sets);
    }
    for (size_t f = 0; f < ids.size(); ++f) {
      SparseField& to = d.fields[f];
      to.offsets.reserve(count + 1);
      to.ids.reserve(ids[f]);
      if (o.format == DataFormat::kLibsvm) to.weights.reserve(ids[f]);
    }
  }
  for (size_t c = 1; c < chunks.size(); ++c) {
    Dataset& x = chunks[c].data;
    if (any_multi) {
      const int64_t base = static_cast<int64_t>(d.label_sets.size());
      for (int64_t r = 1; r <= x.count; ++r) d.label_offsets.push_back(base + x.label_offsets[r]);
      d.label_sets.insert(d.label_sets.end(), x.label_sets.begin(), x.label_sets.end());
    }
    d.dense.insert(d.dense.end(), x.dense.begin(), x.dense.end());
    d.labels.insert(d.labels.end(), x.labels.begin(), x.labels.end());
    d.targets.insert(d.targets.end(), x.targets.begin(), x.targets.end());
    for (size_t f = 0; f < d.fields.size(); ++f) {
      SparseField& to = d.fields[f];
      SparseField& from = x.fields[f];
      const int64_t base = static_cast<int64_t>(to.ids.size());
      for (int64_t r = 1; r <= x.count; ++r) to.offsets.push_back(base + from.offsets[r]);
      to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
      to.weights.insert(to.weights.end(), from.weights.begin(), from.weights.end());
      from = SparseField();  // give the chunk's memory back as we go
    }
    d.count += x.count;
    d.tokens += x.tokens;
    d.skipped.Add(x.skipped);
    x = Dataset();
  }
  // max_records: the first N good records.
  if (o.max_records > 0 && d.count > o.max_records) {
    const int64_t n = o.max_records;
    d.dense.resize(n * d.dense_dim);
    if (!d.labels.empty()) d.labels.resize(n);
    if (!d.targets.empty()) d.targets.resize(n);
    if (d.multi_label()) {
      d.label_sets.resize(d.label_offsets[n]);
      d.label_offsets.resize(n + 1);
    }
    for (SparseField& f : d.fields) {
      f.ids.resize(f.offsets[n]);
      if (!f.weights.empty()) f.weights.resize(f.offsets[n]);
      f.offsets.resize(n + 1);
    }
    d.count = n;
  }
  // Multi-label only when some kept record has several labels.
  if (d.multi_label()) {
    bool several = false;
    for (int64_t r = 0; r < d.count && !several; ++r) several = d.label_offsets[r + 1] - d.label_offsets[r] > 1;
    if (!several) {
      d.label_offsets.clear();
      d.label_sets.clear();
    }
  }
  switch (o.labels) {
    case LabelKind::kBinary: d.num_classes = 2; break;
    case LabelKind::kRegression: d.num_classes = 0; break;
    case LabelKind::kMultiClass:
      if (o.format == DataFormat::kText) {
        d.class_names = o.class_names ? *o.class_names : names;
        d.num_classes = static_cast<int32_t>(d.class_names.size());
      } else {
        int32_t mx = -1;
        for (int32_t l : d.labels) mx = std::max(mx, l);
        d.num_classes = mx + 1;
      }
      break;
  }
  return d;
}

// Chunks are at least this big: smaller ones are not worth a thread.
constexpr size_t kMinChunkBytes = 64 << 10;

// Where chunk boundaries go: up to `parts` pieces of about equal size (and at
// least kMinChunkBytes), each but the last ending just after a '\n'.
std::vector<size_t> ChunkBounds(std::string_view bytes, int parts) {
  parts = static_cast<int>(std::clamp<size_t>(bytes.size() / kMinChunkBytes, 1, static_cast<size_t>(std::max(parts, 1))));
  std::vector<size_t> bounds = {0};
  for (int p = 1; p < parts; ++p) {
    const size_t at = bytes.size() / static_cast<size_t>(parts) * static_cast<size_t>(p);
    if (at < bounds.back()) continue;
    const size_t nl = bytes.find('\n', at);
    if (nl == std::string_view::npos) break;
    if (nl + 1 > bounds.back() && nl + 1 < bytes.size()) bounds.push_back(nl + 1);
  }
  bounds.push_back(bytes.size());
  return bounds;
}

// Parses `bytes` in up to `threads` chunks. `first_line` is the 1-based file
// line of bytes' first line (for messages).
absl::StatusOr<Dataset> ParseParallel(std::string_view bytes, std::string_view file, int64_t first_line,
                                      const ReadOptions& o, int threads, int* chunks_out) {
  SW_RETURN_IF_ERROR(CheckOptions(o));
  CsvLayout csv;
  int64_t header_lines = 0;
  if (o.format == DataFormat::kCsv) {
    size_t consumed = 0;
    SW_ASSIGN_OR_RETURN(csv, ParseCsvHeader(bytes, file, first_line, o.csv, &consumed, &header_lines));
    bytes.remove_prefix(consumed);
  }
  const std::vector<size_t> bounds = ChunkBounds(bytes, threads);
  const size_t n = bounds.size() - 1;
  std::vector<Chunk> chunks(n);
  std::atomic<size_t> first_bad{n};
  // Each thread writes only chunks[c]; nothing else is shared but `o`, `csv`
  // and `bytes`, which are read-only here.
  auto parse = [&](size_t c) {
    try {
      ChunkParser p(o, &csv, c, &first_bad);
      chunks[c] = p.ParseAll(bytes.substr(bounds[c], bounds[c + 1] - bounds[c]), c == 0 ? bytes.size() : 0);
    } catch (const std::bad_alloc&) {
      chunks[c] = Chunk();
      chunks[c].error = absl::ResourceExhaustedError(absl::StrCat(AV(file), ": out of memory while parsing"));
    }
  };
  if (n == 1) {
    parse(0);
  } else {
    // Plain threads, joined here: the joins order every chunk's writes before
    // Join reads them (and ThreadSanitizer can see it). A thread that can't
    // be started leaves its chunk to this one.
    std::vector<std::thread> pool;
    std::vector<size_t> here = {0};
    for (size_t c = 1; c < n; ++c) {
      try {
        pool.emplace_back(parse, c);
      } catch (const std::system_error&) {
        here.push_back(c);
      }
    }
    for (size_t c : here) parse(c);
    for (std::thread& t : pool) t.join();
  }
  if (chunks_out) *chunks_out = static_cast<int>(n);
  return Join(std::move(chunks), first_line - 1 + header_lines, file, o);
}

// ---------------------------------------------------------------------------
// The binary cache.

constexpr char kCacheMagic[8] = {'S', 'W', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr uint32_t kCacheVersion = 1;

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t payload_crc;
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint64_t options_hash;
  uint64_t payload_size;
};

uint64_t OptionsHash(const ReadOptions& o) {
  std::string s = absl::StrCat(ParseOptionsKey(o), "m", o.max_records, "|");
  if (o.class_names) {
    for (const std::string& x : *o.class_names) absl::StrAppend(&s, x.size(), ":", x);
  } else {
    absl::StrAppend(&s, "nodict");
  }
  return Fnv1a64(s);
}

class Writer {
 public:
  template <typename T>
  void Pod(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    out.append(p, sizeof(T));
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    Pod(static_cast<uint64_t>(v.size()));
    if (!v.empty()) out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void Str(const std::string& s) {
    Pod(static_cast<uint64_t>(s.size()));
    out.append(s);
  }
  std::string out;
};

// `n` values of T from `from` (any alignment) into *v, replacing it, on
// huge pages where they are granted (ResetOnHugePages).
template <typename T>
void CopyArray(const char* from, uint64_t n, std::vector<T>* v) {
  ResetOnHugePages(v, n);
  if (n > 0) std::memcpy(v->data(), from, n * sizeof(T));  // data() may be null when empty
}

// One array of a cache's payload, to be copied once its structure is read.
struct ArrayCopy {
  uint64_t bytes = 0;
  std::function<void()> copy;
};

class Reader {
 public:
  // The arrays of at least kDeferBytes are not copied by Vec but listed in
  // *deferred, each copy writing only its own vector: the caller runs them
  // (on several threads) once the whole payload has been read, and no
  // vector Vec was given may move before then.
  Reader(std::string_view in, std::vector<ArrayCopy>* deferred) : in_(in), deferred_(deferred) {}
  static constexpr uint64_t kDeferBytes = uint64_t{64} << 10;
  template <typename T>
  bool Pod(T* v) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint64_t n = 0;
    if (!Pod(&n) || n > in_.size() / sizeof(T)) return false;
    const char* from = in_.data();
    in_.remove_prefix(n * sizeof(T));
    if (n * sizeof(T) >= kDeferBytes) {
      deferred_->push_back({n * sizeof(T), [from, n, v] { CopyArray(from, n, v); }});
    } else {
      CopyArray(from, n, v);
    }
    return true;
  }
  bool Str(std::string* s) {
    uint64_t n = 0;
    if (!Pod(&n) || n > in_.size()) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  size_t remaining() const { return in_.size(); }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
  std::vector<ArrayCopy>* deferred_;
};

std::string Serialize(const Dataset& d) {
  Writer w;
  w.Pod(d.count);
  w.Pod(d.dense_dim);
  w.Vec(d.dense);
  w.Pod(static_cast<uint64_t>(d.dense_names.size()));
  for (const std::string& s : d.dense_names) w.Str(s);
  w.Vec(d.labels);
  w.Vec(d.targets);
  w.Pod(d.num_classes);
  w.Pod(static_cast<uint64_t>(d.class_names.size()));
  for (const std::string& s : d.class_names) w.Str(s);
  w.Vec(d.label_offsets);
  w.Vec(d.label_sets);
  w.Pod(static_cast<uint64_t>(d.fields.size()));
  for (const SparseField& f : d.fields) {
    w.Str(f.name);
    w.Vec(f.offsets);
    w.Vec(f.ids);
    w.Vec(f.weights);
  }
  w.Pod(static_cast<uint64_t>(d.skipped.by_reason.size()));
  for (const auto& [reason, k] : d.skipped.by_reason) {
    w.Str(reason);
    w.Pod(k);
  }
  w.Pod(d.tokens);
  return std::move(w.out);
}

// The payload's arrays are copied on up to `threads` threads (ResolveThreads),
// each array whole by one of them, largest first, after the structure is read.
// (DLRM's caches, 182 MB of training and 45 MB of test data, read on two
// threads on the 2-core Zen 5 VM where a first write to a page is slow:
// the training set's copies had run on one of them for most of its time.)
std::optional<Dataset> Deserialize(std::string_view bytes, int threads) {
  std::vector<ArrayCopy> copies;
  Reader r(bytes, &copies);
  Dataset d;
  uint64_t n = 0;
  if (!r.Pod(&d.count) || !r.Pod(&d.dense_dim) || !r.Vec(&d.dense) || !r.Pod(&n)) return std::nullopt;
  for (uint64_t i = 0; i < n; ++i) {
    std::string s;
    if (!r.Str(&s)) return std::nullopt;
    d.dense_names.push_back(std::move(s));
  }
  if (!r.Vec(&d.labels) || !r.Vec(&d.targets) || !r.Pod(&d.num_classes) || !r.Pod(&n)) return std::nullopt;
  for (uint64_t i = 0; i < n; ++i) {
    std::string s;
    if (!r.Str(&s)) return std::nullopt;
    d.class_names.push_back(std::move(s));
  }
  if (!r.Vec(&d.label_offsets) || !r.Vec(&d.label_sets) || !r.Pod(&n)) return std::nullopt;
  // Sized up front, so the fields' vectors stay where their copies will
  // write (a field takes at least its four sizes' 32 bytes).
  if (n > r.remaining() / 32) return std::nullopt;
  d.fields.resize(n);
  for (SparseField& f : d.fields) {
    if (!r.Str(&f.name) || !r.Vec(&f.offsets) || !r.Vec(&f.ids) || !r.Vec(&f.weights)) return std::nullopt;
  }
  if (!r.Pod(&n)) return std::nullopt;
  for (uint64_t i = 0; i < n; ++i) {
    std::string reason;
    int64_t k = 0;
    if (!r.Str(&reason) || !r.Pod(&k)) return std::nullopt;
    d.skipped.by_reason[reason] = k;
  }
  if (!r.Pod(&d.tokens) || !r.done()) return std::nullopt;
  std::sort(copies.begin(), copies.end(), [](const ArrayCopy& a, const ArrayCopy& b) { return a.bytes > b.bytes; });
  ParallelFor(threads, static_cast<int64_t>(copies.size()), [&](int64_t i) { copies[static_cast<size_t>(i)].copy(); });
  // The shapes must agree, so a damaged cache never reaches a model (the
  // CRC catches accidents; this catches a file written by something else).
  const auto count = static_cast<uint64_t>(d.count);
  if (d.count < 0 || d.count > (int64_t{1} << 48) || d.dense_dim < 0) return std::nullopt;
  if (d.dense_dim == 0 ? !d.dense.empty()
                       : (d.dense.size() % static_cast<uint64_t>(d.dense_dim) != 0 ||
                          d.dense.size() / static_cast<uint64_t>(d.dense_dim) != count)) {
    return std::nullopt;
  }
  if (!d.dense_names.empty() && d.dense_names.size() != static_cast<uint64_t>(d.dense_dim)) return std::nullopt;
  if (!(d.labels.empty() || d.labels.size() == count) || !(d.targets.empty() || d.targets.size() == count)) {
    return std::nullopt;
  }
  for (int32_t l : d.labels) {
    if (l < 0 || l >= d.num_classes) return std::nullopt;
  }
  auto good_offsets = [&](const std::vector<int64_t>& offsets, size_t values) {
    return offsets.size() == count + 1 && offsets.front() == 0 && offsets.back() == static_cast<int64_t>(values) &&
           std::is_sorted(offsets.begin(), offsets.end());
  };
  if (!d.label_offsets.empty() || !d.label_sets.empty()) {
    if (!good_offsets(d.label_offsets, d.label_sets.size())) return std::nullopt;
    for (int32_t l : d.label_sets) {
      if (l < 0 || l >= d.num_classes) return std::nullopt;
    }
  }
  for (const SparseField& f : d.fields) {
    if (!good_offsets(f.offsets, f.ids.size()) || (!f.weights.empty() && f.weights.size() != f.ids.size())) {
      return std::nullopt;
    }
  }
  return d;
}

std::string CachePath(const std::string& path, const ReadOptions& o) {
  const fs::path p(path);
  const fs::path dir = o.cache_dir.empty() ? p.parent_path() : fs::path(o.cache_dir);
  return (dir / (p.filename().string() + ".swcache")).string();
}

std::optional<Dataset> ReadCache(const std::string& cache, const CacheHeader& want, int threads) {
  // The file is mapped and its payload checked and decoded in place: no
  // buffer of its size is zeroed and filled with a copy first. (DLRM's
  // caches, 182 MB of training and 45 MB of test data, read on two threads
  // on a 2-core Zen 5 VM where each first write to a page costs about 5 us,
  // 3 alternating rounds: data.load_s 1.38-1.68 -> 0.79-0.83 s.) A cache is
  // only ever replaced whole, by a rename (WriteCache), so the mapped file
  // does not change under the decode.
  const int fd = ::open(cache.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat sb;
  std::optional<Dataset> d;
  if (::fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && static_cast<uint64_t>(sb.st_size) >= sizeof(CacheHeader)) {
    const size_t size = static_cast<size_t>(sb.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      const char* bytes = static_cast<const char*>(map);
      CacheHeader h;
      std::memcpy(&h, bytes, sizeof h);
      // The payload runs to the end of the file, nothing after it.
      if (std::memcmp(h.magic, kCacheMagic, 8) == 0 && h.version == kCacheVersion &&
          h.source_size == want.source_size && h.source_mtime_ns == want.source_mtime_ns &&
          h.options_hash == want.options_hash && h.payload_size == size - sizeof h) {
        const std::string_view payload(bytes + sizeof h, h.payload_size);
        if (Crc32c(payload.data(), payload.size()) == h.payload_crc) d = Deserialize(payload, threads);
      }
      ::munmap(map, size);
    }
  }
  ::close(fd);
  return d;
}

absl::Status WriteCache(const std::string& cache, CacheHeader h, const Dataset& d) {
  const std::string payload = Serialize(d);
  h.payload_size = payload.size();
  h.payload_crc = Crc32c(payload.data(), payload.size());
  // Two reads of one file may race to write it: each has its own temporary file.
  SW_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFile> f, AtomicFile::Open(cache, /*sync=*/true));
  SW_RETURN_IF_ERROR(f->Append(absl::string_view(reinterpret_cast<const char*>(&h), sizeof h)));
  SW_RETURN_IF_ERROR(f->Append(absl::string_view(payload)));
  return f->Commit();
}

}  // namespace

std::string ParseOptionsKey(const ReadOptions& o) {
  std::string s = absl::StrCat("f", static_cast<int>(o.format), "l", static_cast<int>(o.labels), "e",
                               static_cast<int>(o.on_error), "t", static_cast<int>(o.dense_transform), "n",
                               o.text.word_ngrams, o.text.ngrams_field ? "F" : "f", "c|", o.csv.label, "|",
                               std::string(1, o.csv.delimiter), "|");
  for (const std::string& x : o.csv.dense) absl::StrAppend(&s, x, ",");
  absl::StrAppend(&s, "|");
  for (const std::string& x : o.csv.categorical) absl::StrAppend(&s, x, ",");
  absl::StrAppend(&s, "|");
  return s;
}

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

ReadOptions MakeReadOptions(const DataOptions& data, LabelKind labels) {
  ReadOptions o;
  o.format = data.format;
  o.labels = labels;
  o.on_error = data.on_error;
  o.dense_transform = data.dense_transform;
  o.text = data.text;
  o.csv = data.csv;
  o.threads = data.reader_threads;
  o.cache = data.cache;
  o.cache_dir = data.cache_dir;
  return o;
}

absl::StatusOr<Dataset> ParseBuffer(std::string_view bytes, std::string_view file_name, int64_t first_line_number,
                                    const ReadOptions& options) {
  return ParseParallel(bytes, file_name, first_line_number, options, 1, nullptr);
}

absl::StatusOr<Dataset> ReadDataset(const std::string& path, const ReadOptions& options, ReadStats* stats) {
  ReadStats local;
  ReadStats& st = stats ? *stats : local;
  st = ReadStats();
  SW_RETURN_IF_ERROR(CheckOptions(options));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(e)));
  }
  struct stat sb;
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  CacheHeader want{};
  std::memcpy(want.magic, kCacheMagic, 8);
  want.version = kCacheVersion;
  want.source_size = static_cast<uint64_t>(sb.st_size);
  want.source_mtime_ns = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
  want.options_hash = OptionsHash(options);
  if (options.cache) {
    st.cache_path = CachePath(path, options);
    if (std::optional<Dataset> d = ReadCache(st.cache_path, want, options.threads)) {
      ::close(fd);
      st.from_cache = true;
      return *std::move(d);
    }
  }
  const size_t size = static_cast<size_t>(sb.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": mmap: ", std::strerror(e)));
    }
    ::madvise(map, size, MADV_SEQUENTIAL);
  }
  ::close(fd);
  const int threads = ResolveThreads(options.threads);
  std::string_view bytes(static_cast<const char*>(map), size);
  const Compression compression = DetectCompression(bytes.substr(0, 4));
  st.compression = CompressionName(compression);
  std::string text;
  if (compression != Compression::kNone) {
    DecompressOptions dopts;
    dopts.threads = threads;
    absl::StatusOr<std::string> decompressed = Decompress(bytes, compression, path, dopts);
    if (map != nullptr) ::munmap(map, size);
    map = nullptr;
    if (!decompressed.ok()) return decompressed.status();
    text = *std::move(decompressed);
    bytes = text;
  }
  absl::StatusOr<Dataset> d = ParseParallel(bytes, path, 1, options, threads, &st.chunks);
  if (map != nullptr) ::munmap(map, size);
  if (!d.ok()) return d.status();
  if (options.cache) {
    absl::Status w = WriteCache(st.cache_path, want, *d);
    if (w.ok()) {
      st.cache_written = true;
    } else {
      std::fprintf(stderr, "shardwild: warning: data cache not written: %s\n", std::string(w.message()).c_str());
    }
  }
  return d;
}

absl::StatusOr<std::vector<std::string>> ExpandDataFiles(const std::string& spec, std::string_view key) {
  std::vector<std::string> files;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    std::string entry = spec.substr(start, end - start);
    const size_t first = entry.find_first_not_of(" \t");
    entry = first == std::string::npos ? "" : entry.substr(first, entry.find_last_not_of(" \t") - first + 1);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(AV(key), ": an empty file name in '", spec, "'"));
    }
    if (entry.find_first_of("*?[") == std::string::npos) {
      files.push_back(entry);
    } else {
      glob_t g{};
      const int r = ::glob(entry.c_str(), GLOB_ERR, nullptr, &g);
      if (r == GLOB_NOMATCH) {
        ::globfree(&g);
        return absl::InvalidArgumentError(absl::StrCat(AV(key), ": '", entry, "' matches no file"));
      }
      if (r != 0) {
        ::globfree(&g);
        return absl::InvalidArgumentError(absl::StrCat(AV(key), ": '", entry, "': cannot list its directory"));
      }
      std::vector<std::string> matched(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      ::globfree(&g);
      std::sort(matched.begin(), matched.end());
      for (std::string& m : matched) {
        std::error_code ec;
        if (fs::is_regular_file(m, ec)) files.push_back(std::move(m));
      }
      if (matched.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(AV(key), ": '", entry, "' matches no file"));
      }
    }
    start = end + 1;
  }
  return files;
}

namespace {

// Appends `from` (read from `file`) to `into`; both from the same options.
absl::Status AppendDataset(Dataset* into, Dataset from, const std::string& file, bool merge_names) {
  if (from.dense_dim != into->dense_dim || from.fields.size() != into->fields.size()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", from.dense_dim, " dense features and ", from.fields.size(),
                                                   " sparse fields, the files before it have ", into->dense_dim,
                                                   " and ", into->fields.size()));
  }
  for (size_t f = 0; f < from.fields.size(); ++f) {
    if (from.fields[f].name != into->fields[f].name) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": sparse field ", f, " is '", from.fields[f].name,
                                                     "', in the files before it '", into->fields[f].name, "'"));
    }
  }
  if (merge_names && from.class_names != into->class_names) {
    // Both lists are sorted: their union, and each side's labels mapped onto it.
    std::vector<std::string> names;
    std::set_union(into->class_names.begin(), into->class_names.end(), from.class_names.begin(),
                   from.class_names.end(), std::back_inserter(names));
    auto remap = [&](Dataset* d) {
      std::vector<int32_t> to(d->class_names.size());
      for (size_t i = 0; i < to.size(); ++i) {
        to[i] = static_cast<int32_t>(std::lower_bound(names.begin(), names.end(), d->class_names[i]) - names.begin());
      }
      for (int32_t& l : d->labels) l = to[static_cast<size_t>(l)];
      for (int32_t& l : d->label_sets) l = to[static_cast<size_t>(l)];
      d->class_names = names;
      d->num_classes = static_cast<int32_t>(names.size());
    };
    remap(into);
    remap(&from);
  }
  into->num_classes = std::max(into->num_classes, from.num_classes);
  // Multi-label in either: both become multi-label (one label each where a file had one).
  if (into->multi_label() != from.multi_label()) {
    for (Dataset* d : {into, &from}) {
      if (d->multi_label()) continue;
      d->label_offsets.resize(static_cast<size_t>(d->count) + 1);
      for (int64_t r = 0; r <= d->count; ++r) d->label_offsets[static_cast<size_t>(r)] = r;
      d->label_sets = d->labels;
    }
  }
  if (from.multi_label()) {
    const int64_t base = into->label_sets.size();
    if (into->label_offsets.empty()) into->label_offsets.push_back(0);
    for (size_t r = 1; r < from.label_offsets.size(); ++r) into->label_offsets.push_back(base + from.label_offsets[r]);
    into->label_sets.insert(into->label_sets.end(), from.label_sets.begin(), from.label_sets.end());
  }
  into->dense.insert(into->dense.end(), from.dense.begin(), from.dense.end());
  into->labels.insert(into->labels.end(), from.labels.begin(), from.labels.end());
  into->targets.insert(into->targets.end(), from.targets.begin(), from.targets.end());
  for (size_t f = 0; f < from.fields.size(); ++f) {
    SparseField& a = into->fields[f];
    SparseField& b = from.fields[f];
    if (a.weights.empty() != b.weights.empty()) {
      if (a.weights.empty()) a.weights.assign(a.ids.size(), 1.0f);
      if (b.weights.empty()) b.weights.assign(b.ids.size(), 1.0f);
    }
    const int64_t base = static_cast<int64_t>(a.ids.size());
    for (size_t r = 1; r < b.offsets.size(); ++r) a.offsets.push_back(base + b.offsets[r]);
    a.ids.insert(a.ids.end(), b.ids.begin(), b.ids.end());
    a.weights.insert(a.weights.end(), b.weights.begin(), b.weights.end());
  }
  into->count += from.count;
  into->tokens += from.tokens;
  into->skipped.Add(from.skipped);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> ReadDatasetFiles(const std::vector<std::string>& files, const ReadOptions& options,
                                         ReadStats* stats) {
  if (files.empty()) return absl::InvalidArgumentError("read: no data files");
  if (files.size() == 1) {
    absl::StatusOr<Dataset> d = ReadDataset(files[0], options, stats);
    if (stats) stats->files = 1;
    return d;
  }
  Dataset all;
  bool every_from_cache = true;
  ReadStats st;
  for (size_t i = 0; i < files.size(); ++i) {
    ReadOptions o = options;
    if (options.max_records > 0) {
      if (all.count >= options.max_records) break;
      o.max_records = options.max_records - all.count;
    }
    SW_ASSIGN_OR_RETURN(Dataset d, ReadDataset(files[i], o, &st));
    every_from_cache = every_from_cache && st.from_cache;
    if (d.skipped.total() > 0) d.skipped.by_file[files[i]] = d.skipped.total();
    if (i == 0) {
      all = std::move(d);
    } else {
      SW_RETURN_IF_ERROR(AppendDataset(&all, std::move(d), files[i], options.class_names == nullptr));
    }
  }
  if (stats) {
    *stats = st;
    stats->files = static_cast<int>(files.size());
    stats->from_cache = every_from_cache;
  }
  return all;
}

float ApplyDenseTransform(double x, DenseTransform t) { return Transform(x, t); }

}  // namespace shardwild
