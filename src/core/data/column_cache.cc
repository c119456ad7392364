#include "core/data/column_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/mutex.h"
#include "core/base/parallel_for.h"
#include "core/base/seconds_since.h"
#include "core/base/status.h"
#include "core/io/atomic_file.h"
#include "core/io/compressed.h"
#include "core/io/writable_file.h"
#include "nlohmann/json.hpp"

namespace shardwild {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;

int64_t MtimeNs(const struct stat& sb) {
  return static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
}

// One part of a source file to build. Positions in the file's text (the
// decompressed bytes) decide which lines it owns: those starting in
// [text_begin, text_end). Reading starts at file offset read_from, whose
// first decompressed byte is text offset read_text (for a run of gzip
// members, the member before the run, so that the byte before text_begin
// is seen), and goes on past text_end until the last owned line ends.
struct PartPlan {
  int64_t read_from = 0, read_text = 0;
  int64_t text_begin = 0, text_end = INT64_MAX;
};

absl::StatusOr<std::vector<PartPlan>> PlanParts(const std::string& path, Compression c, int64_t size, bool csv,
                                                int64_t part_bytes) {
  std::vector<PartPlan> parts;
  if (c == Compression::kNone && !csv) {
    const int64_t n = std::max<int64_t>(1, (size + part_bytes - 1) / part_bytes);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = size * i / n;
      parts.push_back({std::max<int64_t>(0, b - 1), std::max<int64_t>(0, b - 1), b, size * (i + 1) / n});
    }
    return parts;
  }
  if (c == Compression::kGzip && !csv) {
    // Members that carry their size ("SW"): runs of them, found by their
    // headers and trailers alone.
    SW_ASSIGN_OR_RETURN(const std::optional<std::vector<SizedGzipMember>> members, ListSizedGzipMembers(path));
    if (members && !members->empty()) {
      std::vector<int64_t> text_at;  // each member's first text offset
      int64_t text = 0;
      for (const SizedGzipMember& m : *members) {
        text_at.push_back(text);
        text += m.text_bytes;
      }
      size_t first = 0;
      for (size_t m = 1; m <= members->size(); ++m) {
        const int64_t end_text = m < members->size() ? text_at[m] : INT64_MAX;
        if (m == members->size() || end_text - text_at[first] >= part_bytes) {
          const size_t from = first > 0 ? first - 1 : 0;
          parts.push_back({(*members)[from].offset, text_at[from], text_at[first], end_text});
          first = m;
        }
      }
      return parts;
    }
  }
  parts.push_back({0, 0, 0, INT64_MAX});
  return parts;
}

// A column being written: a buffered file.
class ColumnWriter {
 public:
  static absl::StatusOr<ColumnWriter> Open(const std::string& path) {
    WritableFileOptions o;
    o.buffer_bytes = 64 << 10;
    ColumnWriter w;
    SW_ASSIGN_OR_RETURN(w.file_, WritableFile::Open(path, o));
    return w;
  }
  template <typename T>
  absl::Status Append(const T* data, size_t n) {
    if (n == 0) return absl::OkStatus();
    return file_->Append(absl::string_view(reinterpret_cast<const char*>(data), n * sizeof(T)));
  }
  absl::Status Close() { return file_->Close(); }
  uint64_t bytes() const { return file_->bytes_appended(); }

 private:
  std::unique_ptr<WritableFile> file_;
};

// What building one part found.
struct PartBuilt {
  int64_t records = 0;
  int64_t text_bytes = 0;     // text parsed
  int64_t lines = 0;          // '\n's in the part's text
  Dataset shape;              // count 0
  SkippedRows skipped;
  int64_t bytes = 0;
  // kFail: the first bad row's piece (re-parsed once the part's first line
  // is known, for the exact message) and its first line within the part.
  bool bad = false;
  std::string bad_piece;
  int64_t bad_piece_line = 0;
  absl::Status error;         // any other failure
};

std::string ColumnName(int field, const char* kind) { return absl::StrCat("f", field, ".", kind); }

// "/part-00003": part k's directory under a cache directory.
std::string PartDir(size_t k) {
  char name[32];
  std::snprintf(name, sizeof name, "/part-%05zu", k);
  return name;
}

// Builds part `plan` of `path` into `dir` (created here).
PartBuilt BuildPart(const std::string& path, Compression c, const PartPlan& plan, const std::string& csv_header,
                    const ReadOptions& read, int64_t piece_bytes, const std::string& dir) {
  PartBuilt out;
  auto fail = [&](absl::Status s) {
    out.error = std::move(s);
    return out;
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(absl::InvalidArgumentError(absl::StrCat(dir, ": cannot create: ", ec.message())));
  absl::StatusOr<std::unique_ptr<DecompressingReader>> reader = DecompressingReader::Open(path, c, plan.read_from);
  if (!reader.ok()) return fail(reader.status());
  ReadOptions o = read;
  o.max_records = 0;
  std::string text;
  // Up to the byte before text_begin (whose being a '\n' or not says whether
  // a line starts at text_begin): read and dropped.
  int64_t consumed = plan.read_text;  // text offset of text[0]
  const int64_t keep_from = plan.text_begin > 0 ? plan.text_begin - 1 : 0;
  while (consumed < keep_from) {
    text.clear();
    absl::StatusOr<size_t> got = (*reader)->Read(&text, static_cast<size_t>(std::min<int64_t>(keep_from - consumed, piece_bytes)));
    if (!got.ok()) return fail(got.status());
    if (*got == 0) return out;  // the file ended before the part: nothing here
    consumed += static_cast<int64_t>(*got);
  }
  text.clear();
  bool skipping_partial = plan.text_begin > 0;
  bool done = false, header_seen = csv_header.empty();
  std::vector<ColumnWriter> columns;
  std::vector<int64_t> field_base;
  while (!done) {
    absl::StatusOr<size_t> got = (*reader)->Read(&text, static_cast<size_t>(piece_bytes));
    if (!got.ok()) return fail(got.status());
    const bool end_of_input = *got == 0;
    if (skipping_partial) {
      const size_t nl = text.find('\n');
      if (nl == std::string::npos) {
        if (end_of_input) break;
        consumed += static_cast<int64_t>(text.size());
        text.clear();
        continue;
      }
      consumed += static_cast<int64_t>(nl + 1);
      text.erase(0, nl + 1);
      skipping_partial = false;
    }
    if (!header_seen) {  // a CSV file's own header: the one given is used for every piece
      const size_t nl = text.find('\n');
      if (nl == std::string::npos && !end_of_input) continue;
      const size_t cut = nl == std::string::npos ? text.size() : nl + 1;
      text.erase(0, cut);
      out.lines += 1;
      header_seen = true;
    }
    // The piece: whole lines, those that start before text_end.
    size_t cut = text.size();
    if (!end_of_input) {
      const size_t nl = text.rfind('\n');
      if (nl == std::string::npos) continue;  // no whole line yet
      cut = nl + 1;
    }
    {
      // Lines starting at offsets >= text_end belong to the next part.
      if (plan.text_end != INT64_MAX && consumed + static_cast<int64_t>(cut) > plan.text_end) {
        const int64_t limit = plan.text_end - consumed;  // lines must start before this index
        size_t at = 0, keep = 0;
        while (at < cut && static_cast<int64_t>(at) < limit) {
          const size_t nl = text.find('\n', at);
          at = nl == std::string::npos ? cut : nl + 1;
          keep = at;
        }
        cut = keep;
        done = true;
      }
    }
    if (end_of_input) done = true;
    const std::string_view piece(text.data(), cut);
    if (!piece.empty()) {
      const int64_t piece_line = out.lines + 1;
      out.lines += static_cast<int64_t>(std::count(piece.begin(), piece.end(), '\n'));
      out.text_bytes += static_cast<int64_t>(piece.size());
      const std::string with_header = csv_header.empty() ? std::string() : csv_header + std::string(piece);
      absl::StatusOr<Dataset> d = ParseBuffer(csv_header.empty() ? piece : std::string_view(with_header), path,
                                              csv_header.empty() ? piece_line : piece_line - 1, o);
      if (!d.ok()) {
        if (d.status().code() != absl::StatusCode::kInvalidArgument) return fail(d.status());
        out.bad = true;
        out.bad_piece = std::string(piece);
        out.bad_piece_line = piece_line;
        return out;
      }
      if (columns.empty()) {
        // The columns, from the first piece's layout.
        std::vector<std::string> names = {"dense.f32", d->labels.empty() && !d->targets.empty() ? "targets.f32"
                                                                                                 : "labels.i32"};
        for (size_t f = 0; f < d->fields.size(); ++f) {
          names.push_back(ColumnName(static_cast<int>(f), "off"));
          names.push_back(ColumnName(static_cast<int>(f), "ids"));
          names.push_back(ColumnName(static_cast<int>(f), "w"));
        }
        for (const std::string& n : names) {
          absl::StatusOr<ColumnWriter> w = ColumnWriter::Open(dir + "/" + n);
          if (!w.ok()) return fail(w.status());
          columns.push_back(std::move(*w));
        }
        out.shape = *d;
        out.shape.count = 0;
        out.shape.dense.clear();
        out.shape.labels.clear();
        out.shape.targets.clear();
        for (SparseField& f : out.shape.fields) {
          f.offsets = {0};
          f.ids.clear();
          f.weights.clear();
        }
        field_base.assign(d->fields.size(), 0);
        const int64_t zero = 0;
        for (size_t f = 0; f < d->fields.size(); ++f) {
          absl::Status s = columns[2 + 3 * f].Append(&zero, 1);
          if (!s.ok()) return fail(s);
        }
      }
      if (d->dense_dim != out.shape.dense_dim || d->fields.size() != out.shape.fields.size()) {
        return fail(absl::InternalError(absl::StrCat(path, ": pieces parsed to different shapes")));
      }
      absl::Status s = columns[0].Append(d->dense.data(), d->dense.size());
      if (s.ok()) {
        s = d->labels.empty() && !d->targets.empty() ? columns[1].Append(d->targets.data(), d->targets.size())
                                                     : columns[1].Append(d->labels.data(), d->labels.size());
      }
      for (size_t f = 0; f < d->fields.size() && s.ok(); ++f) {
        const SparseField& sf = d->fields[f];
        std::vector<int64_t> offsets(sf.offsets.begin() + 1, sf.offsets.end());
        for (int64_t& x : offsets) x += field_base[f];
        field_base[f] += static_cast<int64_t>(sf.ids.size());
        s = columns[2 + 3 * f].Append(offsets.data(), offsets.size());
        if (s.ok()) s = columns[3 + 3 * f].Append(sf.ids.data(), sf.ids.size());
        if (s.ok()) s = columns[4 + 3 * f].Append(sf.weights.data(), sf.weights.size());
        if (!sf.weights.empty()) out.shape.fields[f].weights = {1.0f};  // marks a weighted field
      }
      if (!s.ok()) return fail(s);
      out.shape.num_classes = std::max(out.shape.num_classes, d->num_classes);
      out.records += d->count;
      out.skipped.Add(d->skipped);
    }
    consumed += static_cast<int64_t>(cut);
    text.erase(0, cut);
  }
  for (ColumnWriter& w : columns) {
    absl::Status s = w.Close();
    if (!s.ok()) return fail(s);
    out.bytes += static_cast<int64_t>(w.bytes());
  }
  return out;
}

// The index.json of the cache in `dir` when it matches the source (size,
// mtime), the parse options' `key` and the format; null otherwise.
json ValidIndex(const std::string& dir, int64_t size, int64_t mtime, const std::string& key) {
  std::ifstream in(dir + "/index.json");
  std::stringstream ss;
  ss << in.rdbuf();
  json index = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (index.is_object() && index.value("version", 0) == kFormatVersion &&
      index.value("source_size", int64_t{-1}) == size && index.value("source_mtime_ns", int64_t{-1}) == mtime &&
      index.value("options", "") == key && index.contains("parts") && index["parts"].is_array()) {
    return index;
  }
  return nullptr;
}

// Renames the built cache `tmp` to `dir`, without removing another
// process's valid cache (is_valid(dir)): the rename fails while a directory
// is there; a valid one (another process built the same file first: readers
// may be opening it) is kept and `tmp` dropped (columns already open from
// it stay readable); a stale one is moved aside, then removed. Builds of the
// file do this one at a time (an exclusive flock on "<dir>.lock", which
// stays), so none judges a cache stale that another is putting in place.
void PutInPlace(const std::string& tmp, const std::string& dir, const std::function<bool(const std::string&)>& is_valid) {
  const int lock_fd = ::open((dir + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd >= 0) {
    while (::flock(lock_fd, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  std::error_code ec;
  for (int attempt = 0; attempt < 3; ++attempt) {
    fs::rename(tmp, dir, ec);
    if (!ec || is_valid(dir)) break;
    const std::string aside = absl::StrCat(dir, ".stale.", getpid());
    std::error_code ignored;
    fs::remove_all(aside, ignored);
    fs::rename(dir, aside, ignored);
    fs::remove_all(aside, ignored);
  }
  if (ec) fs::remove_all(tmp, ec);
  if (lock_fd >= 0) ::close(lock_fd);  // (releases the lock)
}

json ShapeJson(const Dataset& d) {
  json fields = json::array();
  for (const SparseField& f : d.fields) fields.push_back({{"name", f.name}, {"weighted", !f.weights.empty()}});
  return {{"dense_dim", d.dense_dim},   {"dense_names", d.dense_names},         {"num_classes", d.num_classes},
          {"fields", fields},           {"regression", d.labels.empty() && d.num_classes == 0}};
}

}  // namespace

// One open column file.
struct ColumnCache::Column {
  int fd = -1;
  std::string path;
  int64_t bytes = 0;
  ~Column() {
    if (fd >= 0) ::close(fd);
  }
  template <typename T>
  absl::Status ReadInto(int64_t first, int64_t n, T* out) const {
    const int64_t off = first * static_cast<int64_t>(sizeof(T));
    const int64_t len = n * static_cast<int64_t>(sizeof(T));
    if (off < 0 || off + len > bytes) {
      return absl::DataLossError(absl::StrCat(path, ": the cache column is shorter than its index says"));
    }
    char* dst = reinterpret_cast<char*>(out);
    for (int64_t done = 0; done < len;) {
      const ssize_t r = ::pread(fd, dst + done, static_cast<size_t>(len - done), static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return absl::DataLossError(absl::StrCat(path, ": read: ", r < 0 ? std::strerror(errno) : "end of file"));
      done += r;
    }
    return absl::OkStatus();
  }
};

struct ColumnCache::Part {
  int64_t records = 0;
  std::unique_ptr<Column> dense, labels;  // labels: targets.f32 for regression labels
  std::vector<std::unique_ptr<Column>> off, ids, w;  // per field; w null when unweighted
};

namespace {

// One source file of a cache: its directory, valid or to build.
struct FileJob {
  std::string path, dir;
  Compression c = Compression::kNone;
  int64_t size = 0, mtime = 0;
  std::string csv_header;
  std::vector<PartPlan> plans;  // to build: the parts
  std::vector<PartBuilt> built;  // [part], written by the part's builder
  std::string tmp;               // to build: where the parts go until the index is written
  json index;                    // the valid index (read, or written once built)
  json parts = json::array();    // to build: the index entries of the parts published
  int64_t lines = 0;             // to build: lines of the parts published
  int64_t skipped = 0;           // rows skipped over the parts published
};

json PartJson(const PartBuilt& b) {
  return {{"records", b.records},
          {"lines", b.lines},
          {"bytes", b.bytes},
          {"shape", ShapeJson(b.shape)},
          {"skipped", b.skipped.by_reason}};
}

}  // namespace

struct ColumnCache::Build {
  ReadOptions read;
  ColumnCacheOptions options;
  std::string key;
  std::vector<std::string> files;
  std::vector<FileJob> jobs;
  struct Slot {
    size_t file = 0, part = 0;
    bool build = false;  // built here (else read from a valid index)
    double weight = 0;   // its share of the source bytes (for estimated_records)
  };
  std::vector<Slot> slots;  // every part of every file, in record order
  std::vector<size_t> work;  // the slots to build, in order
  int threads = 1;
  std::chrono::steady_clock::time_point t0;
  std::atomic<bool> cancel{false};
  bool expected = false;  // the layout was given (Begin)

  mutable Mutex mu;
  std::vector<char> done ABSL_GUARDED_BY(mu);  // [slot]: built (or failed)
  size_t next ABSL_GUARDED_BY(mu) = 0;         // slots published
  absl::Status error ABSL_GUARDED_BY(mu);
  bool layout_set ABSL_GUARDED_BY(mu) = false;
  int64_t published ABSL_GUARDED_BY(mu) = 0;   // records of the slots published
  double published_weight ABSL_GUARDED_BY(mu) = 0;
  double total_weight = 0;
  int64_t total_bytes ABSL_GUARDED_BY(mu) = 0;  // column bytes published
  ColumnCacheStats stats ABSL_GUARDED_BY(mu);
  bool waited ABSL_GUARDED_BY(mu) = false;

  // Makes the built parts readable in `cache`, in order, as far as they go.
  void Publish(ColumnCache& cache) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status PublishSlot(ColumnCache& cache, size_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status AddPart(ColumnCache& cache, size_t slot, const std::string& open_dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

ColumnCache::ColumnCache() = default;

ColumnCache::~ColumnCache() {
  if (builder_.joinable()) {
    build_->cancel.store(true, std::memory_order_relaxed);
    builder_.join();
  }
}

absl::StatusOr<std::unique_ptr<ColumnCache>> ColumnCache::Plan(const std::vector<std::string>& files,
                                                               const ReadOptions& read,
                                                               const ColumnCacheOptions& options,
                                                               const ColumnCacheExpectation* expected) {
  if (read.format == DataFormat::kText) {
    return absl::InvalidArgumentError(
        "data.stream: the text format's class list needs every file read first; train text without data.stream");
  }
  if (read.format == DataFormat::kIdx) return absl::InvalidArgumentError("data.stream: idx files are loaded whole");
  if (files.empty()) return absl::InvalidArgumentError("data.stream: no data files");
  if (options.part_bytes < 1 || options.piece_bytes < 4096) {
    return absl::InvalidArgumentError("column cache: part_bytes must be >= 1 and piece_bytes >= 4096");
  }
  std::unique_ptr<ColumnCache> cache(new ColumnCache());
  cache->build_ = std::make_unique<Build>();
  Build& b = *cache->build_;
  b.t0 = std::chrono::steady_clock::now();
  b.read = read;
  b.options = options;
  b.key = ParseOptionsKey(read);
  b.files = files;
  b.jobs.resize(files.size());
  MutexLock lock(&b.mu);
  for (size_t i = 0; i < files.size(); ++i) {
    FileJob& j = b.jobs[i];
    j.path = files[i];
    struct stat sb;
    if (::stat(j.path.c_str(), &sb) != 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(j.path, ": no such file"));
      return absl::InvalidArgumentError(absl::StrCat(j.path, ": cannot stat: ", std::strerror(errno)));
    }
    if (!S_ISREG(sb.st_mode)) return absl::InvalidArgumentError(absl::StrCat(j.path, ": not a regular file"));
    j.size = sb.st_size;
    j.mtime = MtimeNs(sb);
    const fs::path p(j.path);
    j.dir = ((read.cache_dir.empty() ? p.parent_path() : fs::path(read.cache_dir)) / (p.filename().string() + ".swcols"))
                .string();
    cache->dirs_.push_back(j.dir);
    j.index = ValidIndex(j.dir, j.size, j.mtime, b.key);
    size_t parts = 0;
    if (!j.index.is_null()) {
      ++b.stats.files_cached;
      parts = j.index["parts"].size();
    } else {
      char head[4] = {0, 0, 0, 0};
      {
        std::ifstream in(j.path, std::ios::binary);
        in.read(head, 4);
      }
      j.c = DetectCompression(std::string_view(head, 4));
      if (read.format == DataFormat::kCsv) {
        SW_ASSIGN_OR_RETURN(std::unique_ptr<DecompressingReader> r, DecompressingReader::Open(j.path, j.c));
        std::string text;
        while (text.find('\n') == std::string::npos) {
          SW_ASSIGN_OR_RETURN(const size_t n, r->Read(&text, 64 << 10));
          if (n == 0) break;
        }
        const size_t nl = text.find('\n');
        j.csv_header = nl == std::string::npos ? text + "\n" : text.substr(0, nl + 1);
      }
      SW_ASSIGN_OR_RETURN(j.plans, PlanParts(j.path, j.c, j.size, read.format == DataFormat::kCsv, options.part_bytes));
      j.built.resize(j.plans.size());
      // Unique per build (a process may build the same file's cache twice at
      // once: two jobs of the Python API).
      static std::atomic<uint64_t> builds{0};
      j.tmp = absl::StrCat(j.dir, ".tmp.", getpid(), ".", builds.fetch_add(1, std::memory_order_relaxed));
      std::error_code ec;
      fs::remove_all(j.tmp, ec);
      parts = j.plans.size();
      b.stats.source_bytes += j.size;
    }
    for (size_t k = 0; k < parts; ++k) {
      const double weight = static_cast<double>(std::max<int64_t>(j.size, 1)) / static_cast<double>(parts);
      if (j.index.is_null()) b.work.push_back(b.slots.size());
      b.slots.push_back({i, k, j.index.is_null(), weight});
      b.total_weight += weight;
    }
  }
  b.done.assign(b.slots.size(), 0);
  cache->parts_.resize(b.slots.size());
  cache->part_first_.assign(b.slots.size() + 1, 0);
  cache->regression_ = read.labels == LabelKind::kRegression;
  if (expected != nullptr) {
    b.expected = true;
    b.layout_set = true;
    cache->dense_dim_ = expected->shape.dense_dim;
    cache->num_classes_ = expected->shape.num_classes;
    for (const SparseField& f : expected->shape.fields) cache->field_names_.push_back(f.name);
    cache->bytes_per_record_ = expected->bytes_per_record;
  }
  if (!b.work.empty()) {
    b.threads = ResolveThreads(read.threads);
    b.stats.build_threads = std::min<int>(b.threads, static_cast<int>(b.work.size()));
  }
  b.Publish(*cache);  // what valid indexes hold, up to the first part to build
  return cache;
}

absl::StatusOr<std::unique_ptr<ColumnCache>> ColumnCache::Open(const std::vector<std::string>& files,
                                                               const ReadOptions& read,
                                                               const ColumnCacheOptions& options,
                                                               ColumnCacheStats* stats) {
  if (stats != nullptr) *stats = ColumnCacheStats();
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ColumnCache> cache, Plan(files, read, options, nullptr));
  cache->RunBuild();
  SW_RETURN_IF_ERROR(cache->Wait(stats));
  return cache;
}

absl::StatusOr<std::unique_ptr<ColumnCache>> ColumnCache::Begin(const std::vector<std::string>& files,
                                                                const ReadOptions& read,
                                                                const ColumnCacheOptions& options,
                                                                const ColumnCacheExpectation& expected) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ColumnCache> cache, Plan(files, read, options, &expected));
  if (!cache->build_->work.empty()) {
    ColumnCache* c = cache.get();
    cache->builder_ = std::thread([c] { c->RunBuild(); });
  }
  return cache;
}

void ColumnCache::RunBuild() {
  Build& b = *build_;
  if (b.work.empty()) return;
  ParallelFor(b.threads, static_cast<int64_t>(b.work.size()), [&](int64_t w) {
    const size_t slot = b.work[static_cast<size_t>(w)];
    const Build::Slot& s = b.slots[slot];
    FileJob& j = b.jobs[s.file];
    if (b.options.before_part && !b.cancel.load(std::memory_order_relaxed)) b.options.before_part(slot);
    if (!b.cancel.load(std::memory_order_relaxed)) {
      try {
        j.built[s.part] =
            BuildPart(j.path, j.c, j.plans[s.part], j.csv_header, b.read, b.options.piece_bytes, j.tmp + PartDir(s.part));
      } catch (const std::bad_alloc&) {
        j.built[s.part] = PartBuilt();
        j.built[s.part].error = absl::ResourceExhaustedError(
            absl::StrCat(j.path, ": out of memory while building its column cache (lower data.reader_threads)"));
      }
    }
    MutexLock lock(&b.mu);
    b.done[slot] = 1;
    if (!b.cancel.load(std::memory_order_relaxed)) b.Publish(*this);
  });
  MutexLock lock(&b.mu);
  if (!b.error.ok() || b.next < b.slots.size()) {
    // Failed or cancelled: no half-built directory stays behind.
    std::error_code ec;
    for (FileJob& j : b.jobs) {
      if (!j.tmp.empty()) fs::remove_all(j.tmp, ec);
    }
  }
}

void ColumnCache::Build::Publish(ColumnCache& cache) {
  while (error.ok() && next < slots.size() && (!slots[next].build || done[next])) {
    absl::Status s = PublishSlot(cache, next);
    if (!s.ok()) {
      error = std::move(s);
      cancel.store(true, std::memory_order_relaxed);
      return;
    }
    ++next;
    if (next == slots.size()) {
      stats.build_s = SecondsSince(t0);
    }
  }
}

absl::Status ColumnCache::Build::PublishSlot(ColumnCache& cache, size_t slot) {
  const Slot& s = slots[slot];
  FileJob& j = jobs[s.file];
  if (!s.build) {
    SW_RETURN_IF_ERROR(AddPart(cache, slot, j.dir));
    return absl::OkStatus();
  }
  PartBuilt& pb = j.built[s.part];
  stats.text_bytes += pb.text_bytes;
  if (!pb.error.ok()) return pb.error;
  if (pb.bad) {
    // The exact message of the first bad row: its piece parsed again with
    // its true first line (the lines of the parts before it are known now).
    ReadOptions o = read;
    o.max_records = 0;
    const std::string with_header = j.csv_header + pb.bad_piece;
    absl::StatusOr<Dataset> again =
        ParseBuffer(j.csv_header.empty() ? std::string_view(pb.bad_piece) : std::string_view(with_header), j.path,
                    j.lines + pb.bad_piece_line - (j.csv_header.empty() ? 0 : 1), o);
    return again.ok() ? absl::InternalError(absl::StrCat(j.path, ": a bad row parsed on a second read")) : again.status();
  }
  j.lines += pb.lines;
  j.parts.push_back(PartJson(pb));
  SW_RETURN_IF_ERROR(AddPart(cache, slot, j.tmp));
  if (s.part + 1 < j.plans.size()) return absl::OkStatus();
  // The file's last part: its index, then the directory into place (the
  // columns already open stay readable through their descriptors).
  json index = {{"version", kFormatVersion}, {"source", j.path},   {"source_size", j.size},
                {"source_mtime_ns", j.mtime}, {"options", key},  {"parts", j.parts}};
  SW_RETURN_IF_ERROR(WriteFileAtomically(j.tmp + "/index.json", index.dump()));
  PutInPlace(j.tmp, j.dir, [&](const std::string& d) { return !ValidIndex(d, j.size, j.mtime, key).is_null(); });
  j.tmp.clear();
  j.index = ValidIndex(j.dir, j.size, j.mtime, key);
  if (j.index.is_null()) return absl::InvalidArgumentError(absl::StrCat(j.dir, ": the cache could not be put in place"));
  ++stats.files_built;
  return absl::OkStatus();
}

absl::Status ColumnCache::Build::AddPart(ColumnCache& cache, size_t slot, const std::string& open_dir) {
  const Slot& s = slots[slot];
  FileJob& j = jobs[s.file];
  const json& pj = s.build ? j.parts.back() : j.index["parts"][s.part];
  const int64_t records = pj.value("records", int64_t{-1});
  if (records < 0) return absl::DataLossError(absl::StrCat(j.dir, "/index.json: a part without its record count"));
  const json& shape = pj["shape"];
  SkippedRows skipped;
  if (pj.contains("skipped") && pj["skipped"].is_object()) {
    for (auto it = pj["skipped"].begin(); it != pj["skipped"].end(); ++it) {
      skipped.by_reason[it.key()] = it.value().get<int64_t>();
    }
  }
  j.skipped += skipped.total();
  cache.shape_.skipped.Add(skipped);
  auto part = std::make_unique<Part>();
  part->records = records;
  if (records > 0) {
    // The first part with records sets the layout (unless it was given);
    // the others must match it.
    const int dense_dim = shape.value("dense_dim", -1);
    const json& fields = shape["fields"];
    if (!layout_set) {
      cache.dense_dim_ = dense_dim;
      cache.num_classes_ = shape.value("num_classes", 0);
      for (const json& f : fields) cache.field_names_.push_back(f.value("name", ""));
      cache.shape_.dense_names = shape.value("dense_names", std::vector<std::string>{});
      layout_set = true;
    } else if (dense_dim != cache.dense_dim_ || fields.size() != cache.field_names_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          j.path, ": ", dense_dim, " dense features and ", fields.size(), " sparse fields, ",
          expected && published == 0 ? "the first lines of the data have " : "the records before it have ",
          cache.dense_dim_, " and ", cache.field_names_.size()));
    }
    if (!expected) cache.num_classes_ = std::max(cache.num_classes_, shape.value("num_classes", 0));
    cache.shape_.num_classes = std::max(cache.shape_.num_classes, shape.value("num_classes", 0));
    if (cache.shape_.dense_names.empty()) {
      cache.shape_.dense_names = shape.value("dense_names", std::vector<std::string>{});
    }
    const std::string dir = open_dir + PartDir(s.part) + "/";
    const std::string shown = j.dir + PartDir(s.part) + "/";  // where it is once the build is over
    int64_t opened_bytes = 0;
    auto open = [&](const std::string& file) -> absl::StatusOr<std::unique_ptr<Column>> {
      auto c = std::make_unique<Column>();
      c->fd = ::open((dir + file).c_str(), O_RDONLY | O_CLOEXEC);
      c->path = shown + file;
      if (c->fd < 0) return absl::DataLossError(absl::StrCat(c->path, ": cannot open: ", std::strerror(errno)));
      struct stat sb;
      if (::fstat(c->fd, &sb) != 0) return absl::DataLossError(absl::StrCat(c->path, ": cannot stat"));
      c->bytes = sb.st_size;
      opened_bytes += c->bytes;
      return c;
    };
    const std::string damaged =
        absl::StrCat(shown, ": column sizes do not match the index (a damaged cache: remove ", j.dir, ")");
    SW_ASSIGN_OR_RETURN(part->dense, open("dense.f32"));
    SW_ASSIGN_OR_RETURN(part->labels, open(cache.regression_ ? "targets.f32" : "labels.i32"));
    if (part->dense->bytes != records * dense_dim * 4 || part->labels->bytes != records * 4) {
      return absl::DataLossError(damaged);
    }
    for (size_t f = 0; f < fields.size(); ++f) {
      SW_ASSIGN_OR_RETURN(std::unique_ptr<Column> off, open(ColumnName(static_cast<int>(f), "off")));
      SW_ASSIGN_OR_RETURN(std::unique_ptr<Column> ids, open(ColumnName(static_cast<int>(f), "ids")));
      SW_ASSIGN_OR_RETURN(std::unique_ptr<Column> w, open(ColumnName(static_cast<int>(f), "w")));
      int64_t last = -1;
      if (off->bytes == (records + 1) * 8 && !off->ReadInto(records, 1, &last).ok()) last = -1;
      if (off->bytes != (records + 1) * 8 || last < 0 || ids->bytes != last * 8 ||
          (w->bytes != 0 && w->bytes * 2 != ids->bytes)) {
        return absl::DataLossError(damaged);
      }
      part->off.push_back(std::move(off));
      part->ids.push_back(std::move(ids));
      part->w.push_back(w->bytes > 0 ? std::move(w) : nullptr);
    }
    total_bytes += opened_bytes;
  }
  // Readable from here: the entries first, then the counts that admit them.
  cache.parts_[slot] = std::move(part);
  published += records;
  published_weight += s.weight;
  cache.part_first_[slot + 1] = published;
  const int64_t cap = read.max_records;
  const bool capped = cap > 0 && published >= cap;
  cache.ready_parts_.store(slot + 1, std::memory_order_release);
  cache.ready_records_.store(cap > 0 ? std::min(published, cap) : published, std::memory_order_release);
  if (capped || slot + 1 == slots.size()) cache.all_ready_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status ColumnCache::Wait(ColumnCacheStats* stats) {
  if (builder_.joinable()) builder_.join();
  Build& b = *build_;
  MutexLock lock(&b.mu);
  if (!b.error.ok()) return b.error;
  if (b.next < b.slots.size()) return absl::CancelledError("column cache: the build was cancelled");
  if (!b.waited) {
    b.waited = true;
    for (const FileJob& j : b.jobs) {
      if (j.skipped > 0 && b.files.size() > 1) shape_.skipped.by_file[j.path] = j.skipped;
    }
    shape_.dense_dim = dense_dim_;
    for (const std::string& name : field_names_) {
      SparseField sf;
      sf.name = name;
      sf.offsets = {0};
      shape_.fields.push_back(std::move(sf));
    }
    if (!b.layout_set) {
      // No records anywhere: the shape of an empty parse.
      ReadOptions o = b.read;
      SW_ASSIGN_OR_RETURN(Dataset empty, ParseBuffer("", b.files[0], 1, o));
      SkippedRows skipped = shape_.skipped;
      shape_ = std::move(empty);
      shape_.skipped = std::move(skipped);
      dense_dim_ = shape_.dense_dim;
      for (const SparseField& f : shape_.fields) field_names_.push_back(f.name);
    }
    if (!b.expected) num_classes_ = shape_.num_classes;
    bytes_per_record_ =
        b.published > 0 ? static_cast<double>(b.total_bytes) / static_cast<double>(b.published) : bytes_per_record_;
    b.stats.parts = static_cast<int>(
        std::count_if(parts_.begin(), parts_.end(), [](const std::unique_ptr<Part>& p) { return p && p->records > 0; }));
    b.stats.bytes = b.total_bytes;
  }
  if (stats != nullptr) *stats = b.stats;
  return absl::OkStatus();
}

absl::Status ColumnCache::build_error() const {
  MutexLock lock(&build_->mu);
  return build_->error;
}

int64_t ColumnCache::estimated_records() const {
  if (all_ready()) return records();
  const Build& b = *build_;
  MutexLock lock(&b.mu);
  if (b.published == 0 || b.published_weight <= 0) return b.published;
  const double total = static_cast<double>(b.published) * b.total_weight / b.published_weight;
  const int64_t est = std::max(b.published, static_cast<int64_t>(std::llround(total)));
  return b.read.max_records > 0 ? std::min(est, b.read.max_records) : est;
}

absl::Status ColumnCache::Read(int64_t first, int64_t count, Dataset* out) const {
  // The counts first (acquire): the parts they admit are set.
  const int64_t ready = ready_records_.load(std::memory_order_acquire);
  const size_t np = ready_parts_.load(std::memory_order_acquire);
  if (first < 0 || count < 0 || first + count > ready) {
    return absl::InvalidArgumentError(
        absl::StrCat("column cache: records [", first, ", ", first + count, ") outside [0, ", ready, ")"));
  }
  Dataset& d = *out;
  d.count = count;
  d.dense_dim = dense_dim_;
  d.num_classes = num_classes_;
  d.dense.resize(static_cast<size_t>(count * dense_dim_));
  d.labels.resize(regression_ ? 0 : static_cast<size_t>(count));
  d.targets.resize(regression_ ? static_cast<size_t>(count) : 0);
  d.fields.resize(field_names_.size());
  for (size_t f = 0; f < d.fields.size(); ++f) {
    d.fields[f].name = field_names_[f];
    d.fields[f].offsets.assign(1, 0);
    d.fields[f].offsets.reserve(static_cast<size_t>(count) + 1);
    d.fields[f].ids.clear();
    d.fields[f].weights.clear();
  }
  if (count == 0) return absl::OkStatus();
  size_t p = static_cast<size_t>(std::upper_bound(part_first_.begin(), part_first_.begin() + np + 1, first) -
                                 part_first_.begin()) - 1;
  int64_t at = 0;  // records of *out filled
  std::vector<int64_t> offsets;
  while (at < count) {
    const Part& part = *parts_[p];
    if (part.records == 0) {
      ++p;
      continue;
    }
    const int64_t local = first + at - part_first_[p];
    const int64_t n = std::min(count - at, part.records - local);
    SW_RETURN_IF_ERROR(part.dense->ReadInto(local * dense_dim_, n * dense_dim_, d.dense.data() + at * dense_dim_));
    if (regression_) {
      SW_RETURN_IF_ERROR(part.labels->ReadInto(local, n, d.targets.data() + at));
    } else {
      SW_RETURN_IF_ERROR(part.labels->ReadInto(local, n, d.labels.data() + at));
    }
    for (size_t f = 0; f < d.fields.size(); ++f) {
      SparseField& sf = d.fields[f];
      offsets.resize(static_cast<size_t>(n) + 1);
      SW_RETURN_IF_ERROR(part.off[f]->ReadInto(local, n + 1, offsets.data()));
      const int64_t ids = offsets[static_cast<size_t>(n)] - offsets[0];
      if (ids < 0) return absl::DataLossError(absl::StrCat(part.off[f]->path, ": offsets go down"));
      const int64_t base = static_cast<int64_t>(sf.ids.size());
      sf.ids.resize(static_cast<size_t>(base + ids));
      SW_RETURN_IF_ERROR(part.ids[f]->ReadInto(offsets[0], ids, sf.ids.data() + base));
      if (part.w[f]) {
        sf.weights.resize(static_cast<size_t>(base + ids));
        SW_RETURN_IF_ERROR(part.w[f]->ReadInto(offsets[0], ids, sf.weights.data() + base));
      }
      for (int64_t r = 1; r <= n; ++r) {
        const int64_t o = offsets[static_cast<size_t>(r)] - offsets[0];
        if (o < sf.offsets.back() - base || o > ids) {
          return absl::DataLossError(absl::StrCat(part.off[f]->path, ": offsets go down"));
        }
        sf.offsets.push_back(base + o);
      }
    }
    at += n;
    ++p;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Dataset>> PeekShape(const std::vector<std::string>& files, const ReadOptions& read,
                                                 double* bytes_per_record) {
  if (read.labels == LabelKind::kMultiClass || files.empty()) return std::optional<Dataset>();
  char head[4] = {0, 0, 0, 0};
  {
    std::ifstream in(files[0], std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(files[0], ": no such file"));
    in.read(head, 4);
  }
  SW_ASSIGN_OR_RETURN(std::unique_ptr<DecompressingReader> r,
                      DecompressingReader::Open(files[0], DetectCompression(std::string_view(head, 4))));
  std::string text;
  while (text.size() < (64 << 10)) {
    SW_ASSIGN_OR_RETURN(const size_t n, r->Read(&text, (64 << 10) - text.size()));
    if (n == 0) break;
  }
  // Whole lines only (all of it at the end of the file), parsed leniently:
  // a bad row here is the build's to report.
  const size_t nl = text.rfind('\n');
  if (nl != std::string::npos && text.size() == (64 << 10)) text.resize(nl + 1);
  ReadOptions o = read;
  o.on_error = OnBadRow::kSkip;
  o.max_records = 0;
  SW_ASSIGN_OR_RETURN(Dataset d, ParseBuffer(text, files[0], 1, o));
  if (bytes_per_record != nullptr) {
    int64_t bytes = static_cast<int64_t>((d.dense.size() + d.labels.size() + d.targets.size()) * 4);
    for (const SparseField& f : d.fields) bytes += static_cast<int64_t>(f.offsets.size() * 8 + f.ids.size() * 8 + f.weights.size() * 4);
    *bytes_per_record = d.count > 0 ? static_cast<double>(bytes) / static_cast<double>(d.count) : 0;
  }
  Dataset shape;
  shape.dense_dim = d.dense_dim;
  shape.dense_names = d.dense_names;
  shape.num_classes = d.num_classes;
  for (const SparseField& f : d.fields) {
    SparseField g;
    g.name = f.name;
    g.offsets = {0};
    shape.fields.push_back(std::move(g));
  }
  return std::optional<Dataset>(std::move(shape));
}

void GatherRecords(const Dataset& from, const int32_t* rows, int64_t n, Dataset* out) {
  Dataset& d = *out;
  const int64_t dd = from.dense_dim;
  d.count = n;
  d.dense_dim = dd;
  d.num_classes = from.num_classes;
  d.dense.resize(static_cast<size_t>(n * dd));
  d.labels.resize(from.labels.empty() ? 0 : static_cast<size_t>(n));
  d.targets.resize(from.targets.empty() ? 0 : static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    std::copy_n(from.dense.data() + r * dd, dd, d.dense.data() + i * dd);
    if (!from.labels.empty()) d.labels[static_cast<size_t>(i)] = from.labels[static_cast<size_t>(r)];
    if (!from.targets.empty()) d.targets[static_cast<size_t>(i)] = from.targets[static_cast<size_t>(r)];
  }
  d.fields.resize(from.fields.size());
  for (size_t f = 0; f < from.fields.size(); ++f) {
    const SparseField& a = from.fields[f];
    SparseField& b = d.fields[f];
    b.name = a.name;
    b.offsets.resize(static_cast<size_t>(n) + 1);
    b.offsets[0] = 0;
    b.ids.clear();
    b.weights.clear();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      const int64_t lo = a.offsets[static_cast<size_t>(r)], hi = a.offsets[static_cast<size_t>(r) + 1];
      b.ids.insert(b.ids.end(), a.ids.begin() + lo, a.ids.begin() + hi);
      if (!a.weights.empty()) b.weights.insert(b.weights.end(), a.weights.begin() + lo, a.weights.begin() + hi);
      b.offsets[static_cast<size_t>(i) + 1] = static_cast<int64_t>(b.ids.size());
    }
  }
}

int64_t DatasetBytes(const Dataset& d) {
  int64_t b = static_cast<int64_t>(d.dense.capacity() * sizeof(float) + d.labels.capacity() * sizeof(int32_t) +
                                   d.targets.capacity() * sizeof(float));
  for (const SparseField& f : d.fields) {
    b += static_cast<int64_t>(f.offsets.capacity() * sizeof(int64_t) + f.ids.capacity() * sizeof(uint64_t) +
                              f.weights.capacity() * sizeof(float));
  }
  return b;
}

}  // namespace shardwild
