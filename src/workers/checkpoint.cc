#include "workers/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/io/crc32c.h"
#include "core/model/optimizer.h"
#include "core/io/safetensors.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kFormatVersion = 1;
constexpr char kPointer[] = "checkpoint";
constexpr char kHistory[] = "history.jsonl";
constexpr char kManifest[] = "manifest.json";
constexpr char kDenseFile[] = "dense.safetensors";
// Rows copied per piece while streaming a dense tensor.
constexpr int64_t kChunkRows = 4096;

absl::Status ErrnoError(const std::string& path, const char* what) {
  const int e = errno;
  return absl::Status(absl::ErrnoToStatusCode(e), absl::StrCat(path, ": ", what, ": ", std::strerror(e)));
}

absl::Status FsyncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "open for fsync");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) {
    errno = saved;
    return ErrnoError(path, "fsync");
  }
  return absl::OkStatus();
}

// Writes `text` to `path` (truncating), fsynced if asked.
absl::Status WriteSmallFile(const std::string& path, const std::string& text, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(path, "open");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const absl::Status s = ErrnoError(path, "write");
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) {
    const absl::Status s = ErrnoError(path, "fsync");
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return ErrnoError(path, "close");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void MaybeCrash(const CheckpointWriteOptions& o, CheckpointCrashPoint here) {
  if (o.crash_at == here) ::_exit(kCheckpointCrashExitCode);
}

std::string CheckpointName(int64_t step) { return absl::StrCat("ckpt-", step); }

// The step of a directory named ckpt-<step>, or nullopt.
std::optional<int64_t> StepOf(const std::string& name) {
  if (name.rfind("ckpt-", 0) != 0) return std::nullopt;
  int64_t step;
  if (!absl::SimpleAtoi(name.substr(5), &step) || step < 0 || CheckpointName(step) != name) return std::nullopt;
  return step;
}

std::string TableFile(int t) { return absl::StrCat("table-", t, ".safetensors"); }

// The CRC32C of a whole file, read in pieces.
absl::StatusOr<std::pair<uint64_t, uint32_t>> FileSizeAndCrc(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "open");
  std::vector<char> buf(1 << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const absl::Status s = ErrnoError(path, "read");
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    crc = Crc32cExtend(crc, buf.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return std::make_pair(size, crc);
}

// A producer that streams rows [row_begin, row_end) of variable `var` (slot
// < 0: the parameters; else that slot) in chunks.
SafetensorsWriter::Producer DenseProducer(ShmParamStore* store, int var, int slot, int64_t row_begin, int64_t row_end) {
  return [store, var, slot, row_begin, row_end](const SafetensorsWriter::Sink& sink) -> absl::Status {
    const VariableSpec& spec = store->layout().variables[var];
    std::vector<float> params(static_cast<size_t>(std::min(kChunkRows, row_end - row_begin) * spec.cols));
    std::vector<float> slot_buf(slot >= 0 ? params.size() : 0);
    std::vector<float*> slots;
    if (slot >= 0) {
      slots.assign(slot + 1, nullptr);
      slots[slot] = slot_buf.data();
    }
    for (int64_t b = row_begin; b < row_end; b += kChunkRows) {
      const int64_t e = std::min(row_end, b + kChunkRows);
      SW_RETURN_IF_ERROR(store->ReadRows(var, b, e, params.data(), slots));
      const float* src = slot >= 0 ? slot_buf.data() : params.data();
      SW_RETURN_IF_ERROR(sink({reinterpret_cast<const uint8_t*>(src), static_cast<size_t>((e - b) * spec.cols) * 4}));
    }
    return absl::OkStatus();
  };
}

// Which part of a table row a producer streams.
enum class RowPart { kIds, kCounts, kParams, kSlot };

// Streams exactly `n` rows' `part` of table `t`, a block of rows
// (ShmParamStore::VisitTableRowBlocks) per sink call. Fails if the table no
// longer holds exactly n rows (it changed while being written).
SafetensorsWriter::Producer TableProducer(ShmParamStore* store, int t, int64_t n, RowPart part, int slot) {
  return [=](const SafetensorsWriter::Sink& sink) -> absl::Status {
    const size_t dim = static_cast<size_t>(store->layout().tables[t].dim);
    ShmParamStore::TableRowParts parts;
    size_t row_bytes = sizeof(uint64_t);
    switch (part) {
      case RowPart::kIds: parts.ids = true; break;
      case RowPart::kCounts: parts.update_counts = true; break;
      case RowPart::kParams: parts.params = true; row_bytes = dim * sizeof(float); break;
      case RowPart::kSlot: parts.slots = uint32_t{1} << slot; row_bytes = dim * sizeof(float); break;
    }
    int64_t seen = 0;
    SW_RETURN_IF_ERROR(store->VisitTableRowBlocks(t, parts, [&](const ShmParamStore::TableRowBlock& b) -> absl::Status {
      // Never past n rows (a table that grew meanwhile fails below).
      const int64_t take = std::clamp<int64_t>(n - seen, 0, b.rows);
      seen += b.rows;
      if (take == 0) return absl::OkStatus();
      const void* src = nullptr;
      switch (part) {
        case RowPart::kIds: src = b.ids; break;
        case RowPart::kCounts: src = b.update_counts; break;
        case RowPart::kParams: src = b.params; break;
        case RowPart::kSlot: src = b.slots[slot]; break;
      }
      return sink({static_cast<const uint8_t*>(src), static_cast<size_t>(take) * row_bytes});
    }));
    if (seen != n) {
      return absl::FailedPreconditionError(absl::StrCat("embedding table '", store->layout().tables[t].name,
                                                        "' changed while being checkpointed (", n, " rows, then ",
                                                        seen, "); checkpoint while no worker runs"));
    }
    return absl::OkStatus();
  };
}

json Partitioning(const ShmParamStore& store) {
  const StoreLayout& l = store.layout();
  json vars = json::array();
  for (size_t v = 0; v < l.variables.size(); ++v) {
    json parts = json::array();
    for (const RowRange& r : l.parts[v]) parts.push_back({r.begin, r.end});
    vars.push_back({{"name", l.variables[v].name},
                    {"rows", l.variables[v].rows},
                    {"cols", l.variables[v].cols},
                    {"parts", parts},
                    {"update_count", store.update_count(static_cast<int>(v))}});
  }
  json tables = json::array();
  for (const TableSpec& t : l.tables) {
    tables.push_back({{"name", t.name},
                      {"kind", EmbeddingKindName(t.kind)},
                      {"dim", t.dim},
                      {"capacity", t.capacity}});
  }
  return {{"num_shards", l.num_shards}, {"variables", vars}, {"tables", tables}};
}

// The hosted block of a partial store, as the manifest records it
// ("hosted"; absent for a full store, whose manifests stay as before).
json HostedBlock(const ShmParamStore& store) {
  json rows = json::array();
  for (size_t v = 0; v < store.layout().variables.size(); ++v) {
    const RowRange r = store.hosted_rows(static_cast<int>(v));
    rows.push_back({r.begin, r.end});
  }
  return {{"first_shard", store.first_hosted_shard()},
          {"num_shards", store.num_hosted_shards()},
          {"total_shards", store.layout().num_shards},
          {"rows", rows}};
}

std::string DescribeBlock(int64_t first, int64_t num, int64_t total) {
  if (num == total) return absl::StrCat("all ", total, " shards");
  return absl::StrCat("shards ", first, "..", first + num - 1, " of ", total);
}

absl::Status Prune(const std::string& dir, const std::string& keep_name, int keep) {
  // Complete checkpoints beyond `keep`, oldest first; never the new one.
  std::vector<std::string> all = ListCheckpoints(dir);
  int excess = static_cast<int>(all.size()) - keep;
  for (const std::string& path : all) {
    if (excess <= 0) break;
    if (fs::path(path).filename() == keep_name) continue;
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return absl::InternalError(absl::StrCat(path, ": cannot remove an old checkpoint: ", ec.message()));
    --excess;
  }
  // Temporary directories of writers that are gone.
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp-");
    if (name.rfind(".ckpt-", 0) != 0 || at == std::string::npos) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(at + 5), &pid)) continue;
    if (pid == ::getpid() || (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // its writer may still run
    std::error_code rm;
    fs::remove_all(e.path(), rm);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> CheckpointHistory(const std::string& dir) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::ifstream in((fs::path(dir) / kHistory).string());
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    // A torn last line (a writer killed mid-append) is skipped.
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("step")) continue;
    out.emplace_back(j["name"].get<std::string>(), j["step"].get<int64_t>());
  }
  return out;
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    if (std::optional<int64_t> step = StepOf(e.path().filename().string())) found.emplace_back(*step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

namespace {

// The temporary directory of a checkpoint being written, removed on failure
// unless committed (CommitCheckpoint).
struct PendingCheckpoint {
  std::string dir, name, final_path, tmp;
  absl::Status Fail(absl::Status s) const {
    std::error_code rm;
    fs::remove_all(tmp, rm);
    return s;
  }
};

absl::StatusOr<PendingCheckpoint> BeginCheckpoint(const std::string& dir, const CheckpointState& state,
                                                  const CheckpointWriteOptions& options) {
  if (options.keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint.keep: must be >= 1, got ", options.keep));
  }
  if (state.step < 0) return absl::InvalidArgumentError(absl::StrCat("checkpoint: step ", state.step, " < 0"));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat(dir, ": cannot create the checkpoint directory: ", ec.message()));
  const std::string name = CheckpointName(state.step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = (fs::path(dir) / absl::StrCat(".", name, ".tmp-", ::getpid())).string();
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec) {
    return absl::FailedPreconditionError(absl::StrCat(tmp, ": cannot create: ", ec.message()));
  }
  return PendingCheckpoint{dir, name, final_path, tmp};
}

// Writes the manifest of `body` into the temporary directory, renames it into
// place, appends the history, replaces the pointer and prunes (the protocol
// in checkpoint.h). Returns the checkpoint's path.
absl::StatusOr<std::string> CommitCheckpoint(const PendingCheckpoint& p, const json& body, int64_t step,
                                             const CheckpointWriteOptions& options) {
  const std::string& dir = p.dir;
  const std::string& name = p.name;
  const std::string& final_path = p.final_path;
  const std::string& tmp = p.tmp;
  auto fail = [&](absl::Status s) { return p.Fail(std::move(s)); };
  std::error_code ec;
  const std::string dumped = body.dump();
  const json manifest = {{"body", body}, {"crc32c", Crc32c(dumped.data(), dumped.size())}};
  if (absl::Status s = WriteSmallFile((fs::path(tmp) / kManifest).string(), manifest.dump(1) + "\n", options.fsync);
      !s.ok()) {
    return fail(s);
  }
  if (options.fsync) {
    if (absl::Status s = FsyncPath(tmp, true); !s.ok()) return fail(s);
  }
  MaybeCrash(options, CheckpointCrashPoint::kAfterManifest);
  // Into place. A checkpoint of the same step (from a run that resumed from
  // an older one) is moved aside first: rename cannot replace a non-empty
  // directory.
  if (fs::exists(final_path, ec)) {
    const std::string old = (fs::path(dir) / absl::StrCat(".", name, ".old-", ::getpid())).string();
    fs::remove_all(old, ec);
    fs::rename(final_path, old, ec);
    if (ec) return fail(absl::InternalError(absl::StrCat(final_path, ": cannot move the old copy aside: ", ec.message())));
    fs::remove_all(old, ec);
  }
  fs::rename(tmp, final_path, ec);
  if (ec) return fail(absl::InternalError(absl::StrCat(tmp, ": cannot rename to ", final_path, ": ", ec.message())));
  if (options.fsync) SW_RETURN_IF_ERROR(FsyncPath(dir, true));
  // The history: one line per checkpoint ever completed here, so a watcher
  // can tell which ones it missed (they may be pruned before it looks).
  {
    const std::string history = (fs::path(dir) / kHistory).string();
    const std::string line = json{{"name", name}, {"step", step}}.dump() + "\n";
    const int fd = ::open(history.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoError(history, "open");
    const ssize_t n = ::write(fd, line.data(), line.size());
    const int saved = errno;
    ::close(fd);
    if (n != static_cast<ssize_t>(line.size())) {
      errno = n < 0 ? saved : EIO;
      return ErrnoError(history, "write");
    }
  }

  MaybeCrash(options, CheckpointCrashPoint::kAfterRename);

  // The pointer.
  json all = json::array();
  for (const std::string& p : ListCheckpoints(dir)) all.push_back(fs::path(p).filename().string());
  const std::string pointer = (fs::path(dir) / kPointer).string();
  const std::string pointer_tmp = pointer + ".tmp";
  SW_RETURN_IF_ERROR(WriteSmallFile(pointer_tmp, json{{"latest", name}, {"all", all}}.dump() + "\n", options.fsync));
  MaybeCrash(options, CheckpointCrashPoint::kAfterPointerTemp);
  if (::rename(pointer_tmp.c_str(), pointer.c_str()) != 0) return ErrnoError(pointer_tmp, "rename");
  if (options.fsync) SW_RETURN_IF_ERROR(FsyncPath(dir, true));
  MaybeCrash(options, CheckpointCrashPoint::kAfterPointer);

  SW_RETURN_IF_ERROR(Prune(dir, name, options.keep));
  return final_path;
}

}  // namespace

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, ShmParamStore& store, const CheckpointState& state,
                                            const CheckpointWriteOptions& options) {
  SW_ASSIGN_OR_RETURN(const PendingCheckpoint pending, BeginCheckpoint(dir, state, options));
  const std::string& tmp = pending.tmp;
  auto fail = [&](absl::Status s) { return pending.Fail(std::move(s)); };

  const StoreLayout& layout = store.layout();
  const OptimizerOptions& dense_opt = store.optimizer();
  const OptimizerOptions& sparse_opt = store.sparse_optimizer();
  const int dense_slots = NumSlots(dense_opt.type);
  const int sparse_slots = NumSlots(sparse_opt.type);
  SafetensorsWriteOptions wo;
  wo.fsync = options.fsync;

  // One file for the dense variables, then one per embedding table, written
  // side by side on every hardware thread: each file's rows are read,
  // checksummed and handed to the kernel by one thread, and its fsync waits
  // while the others go on (ctr_dlrm.yaml's 27 files, 2.0 GB: README,
  // "Checkpoints and resume").
  const int num_files = 1 + static_cast<int>(layout.tables.size());
  std::vector<SafetensorsFileInfo> infos(static_cast<size_t>(num_files));
  std::vector<int64_t> rows_of(layout.tables.size(), 0);
  auto write_dense = [&]() -> absl::Status {
    // Global tensors (a partial store: the rows it hosts of each, possibly none).
    SafetensorsWriter w;
    for (size_t v = 0; v < layout.variables.size(); ++v) {
      const VariableSpec& spec = layout.variables[v];
      const RowRange rows = store.hosted_rows(static_cast<int>(v));
      for (int k = -1; k < dense_slots; ++k) {
        const std::string tensor = k < 0 ? spec.name : absl::StrCat(spec.name, "/slot", k);
        SW_RETURN_IF_ERROR(w.AddTensor(tensor, SafetensorsDtype::kF32, {rows.size(), spec.cols},
                                       DenseProducer(&store, static_cast<int>(v), k, rows.begin, rows.end)));
      }
    }
    (void)w.SetMetadata("format", "shardwild-checkpoint");
    (void)w.SetMetadata("optimizer", OptimizerTypeName(dense_opt.type));
    (void)w.SetMetadata("step", absl::StrCat(state.step));
    SW_ASSIGN_OR_RETURN(infos[0], w.Write((fs::path(tmp) / kDenseFile).string(), wo));
    return absl::OkStatus();
  };
  auto write_table = [&](int ti) -> absl::Status {
    const TableSpec& spec = layout.tables[ti];
    int64_t n = 0;
    SW_RETURN_IF_ERROR(store.VisitTableRowBlocks(ti, {}, [&n](const ShmParamStore::TableRowBlock& b) {
      n += b.rows;
      return absl::OkStatus();
    }));
    SafetensorsWriter w;
    ShmParamStore* st = &store;
    SW_RETURN_IF_ERROR(w.AddTensor("ids", SafetensorsDtype::kU64, {n}, TableProducer(st, ti, n, RowPart::kIds, 0)));
    SW_RETURN_IF_ERROR(
        w.AddTensor("update_count", SafetensorsDtype::kU64, {n}, TableProducer(st, ti, n, RowPart::kCounts, 0)));
    SW_RETURN_IF_ERROR(
        w.AddTensor("params", SafetensorsDtype::kF32, {n, spec.dim}, TableProducer(st, ti, n, RowPart::kParams, 0)));
    for (int k = 0; k < sparse_slots; ++k) {
      SW_RETURN_IF_ERROR(w.AddTensor(absl::StrCat("slot", k), SafetensorsDtype::kF32, {n, spec.dim},
                                     TableProducer(st, ti, n, RowPart::kSlot, k)));
    }
    (void)w.SetMetadata("format", "shardwild-checkpoint");
    (void)w.SetMetadata("table", spec.name);
    (void)w.SetMetadata("kind", EmbeddingKindName(spec.kind));
    (void)w.SetMetadata("optimizer", OptimizerTypeName(sparse_opt.type));
    SW_ASSIGN_OR_RETURN(infos[1 + ti], w.Write((fs::path(tmp) / TableFile(ti)).string(), wo));
    rows_of[ti] = n;
    return absl::OkStatus();
  };
  if (absl::Status s = ParallelForStatus(/*threads=*/0, num_files,
                                         [&](int64_t i) {
                                           return i == 0 ? write_dense() : write_table(static_cast<int>(i - 1));
                                         });
      !s.ok()) {
    return fail(s);
  }
  json files = json::array();
  files.push_back({{"name", kDenseFile}, {"size", infos[0].size}, {"crc32c", infos[0].crc32c}});
  json table_rows = json::array();
  for (size_t t = 0; t < layout.tables.size(); ++t) {
    files.push_back({{"name", TableFile(static_cast<int>(t))}, {"size", infos[1 + t].size}, {"crc32c", infos[1 + t].crc32c}});
    table_rows.push_back(rows_of[t]);
  }
  MaybeCrash(options, CheckpointCrashPoint::kAfterTensorFiles);

  // The manifest, last.
  json body = {{"format", "shardwild-checkpoint"},
               {"format_version", kFormatVersion},
               {"step", state.step},
               {"epoch", state.epoch},
               {"model_version", store.version()},
               {"config_hash", state.config_hash},
               {"optimizer", {{"dense", OptimizerTypeName(dense_opt.type)}, {"sparse", OptimizerTypeName(sparse_opt.type)},
                              {"dense_slots", dense_slots}, {"sparse_slots", sparse_slots}}},
               {"partitioning", Partitioning(store)},
               {"table_rows", table_rows},
               {"data_cursor", state.data_cursor},
               {"rng", state.rng},
               {"extra", state.extra},
               {"files", files}};
  if (store.partial()) body["hosted"] = HostedBlock(store);
  return CommitCheckpoint(pending, body, state.step, options);
}

absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& path) {
  const std::string manifest_path = (fs::path(path) / kManifest).string();
  SW_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(manifest_path));
  json manifest = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded() || !manifest.is_object() || !manifest.contains("body") || !manifest.contains("crc32c")) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": not a checkpoint manifest (truncated or corrupted)"));
  }
  const json& body = manifest["body"];
  const std::string dumped = body.dump();
  if (!manifest["crc32c"].is_number_unsigned() ||
      manifest["crc32c"].get<uint64_t>() != Crc32c(dumped.data(), dumped.size())) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": CRC32C does not match its contents"));
  }
  CheckpointInfo info;
  info.path = path;
  try {
    if (body.at("format").get<std::string>() != "shardwild-checkpoint" ||
        body.at("format_version").get<int>() != kFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(manifest_path, ": format ", body.at("format").dump(), " version ",
                                                        body.at("format_version").dump(), ", this build reads version ",
                                                        kFormatVersion));
    }
    info.step = body.at("step").get<int64_t>();
    info.model_version = body.at("model_version").get<uint64_t>();
    info.state.step = info.step;
    info.state.epoch = body.at("epoch").get<int64_t>();
    info.state.config_hash = body.at("config_hash").get<std::string>();
    info.state.data_cursor = body.at("data_cursor");
    info.state.rng = body.at("rng");
    info.state.extra = body.at("extra");
    if (body.contains("kind")) {
      const std::string kind = body.at("kind").get<std::string>();
      if (kind != "state") {
        return absl::FailedPreconditionError(
            absl::StrCat(manifest_path, ": unknown checkpoint kind '", kind, "', this build reads 'state'"));
      }
      info.kind = CheckpointKind::kState;
      info.params_info = body.at("params");
    }
    // Every file read and checksummed, side by side on every hardware thread
    // (the error is the first file's in the manifest's order, as one by one).
    struct Expected {
      std::string file;
      uint64_t size;
      uint32_t crc32c;
    };
    std::vector<Expected> expected;
    for (const json& f : body.at("files")) {
      expected.push_back({(fs::path(path) / f.at("name").get<std::string>()).string(), f.at("size").get<uint64_t>(),
                          f.at("crc32c").get<uint32_t>()});
    }
    SW_RETURN_IF_ERROR(ParallelForStatus(0, static_cast<int64_t>(expected.size()), [&](int64_t i) -> absl::Status {
      const Expected& e = expected[static_cast<size_t>(i)];
      absl::StatusOr<std::pair<uint64_t, uint32_t>> got = FileSizeAndCrc(e.file);
      if (!got.ok()) return absl::DataLossError(absl::StrCat(e.file, ": missing or unreadable: ", got.status().message()));
      if (got->first != e.size) {
        return absl::DataLossError(absl::StrCat(e.file, ": ", got->first, " bytes, the manifest says ", e.size));
      }
      if (got->second != e.crc32c) {
        return absl::DataLossError(
            absl::StrFormat("%s: CRC32C 0x%08x, the manifest says 0x%08x", e.file, got->second, e.crc32c));
      }
      return absl::OkStatus();
    }));
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(manifest_path, ": malformed manifest: ", e.what()));
  }
  info.manifest = body;
  return info;
}

absl::StatusOr<std::optional<CheckpointInfo>> FindLatestCheckpoint(const std::string& dir,
                                                                  std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::optional<CheckpointInfo>();
  std::vector<std::string> candidates = ListCheckpoints(dir);
  std::reverse(candidates.begin(), candidates.end());
  // The pointer's checkpoint first (it is the newest unless a later one was
  // renamed into place just before a crash; both orders end at the newest
  // good one, since scanning covers every directory anyway).
  if (absl::StatusOr<std::string> text = ReadSmallFile((fs::path(dir) / kPointer).string()); text.ok()) {
    const json p = json::parse(*text, nullptr, false);
    if (p.is_object() && p.contains("latest") && p["latest"].is_string()) {
      const std::string named = (fs::path(dir) / p["latest"].get<std::string>()).string();
      if (std::find(candidates.begin(), candidates.end(), named) == candidates.end() && skipped != nullptr) {
        skipped->push_back(absl::StrCat(named, ": named by ", kPointer, " but missing"));
      }
    } else if (skipped != nullptr) {
      skipped->push_back(absl::StrCat((fs::path(dir) / kPointer).string(), ": unreadable pointer; scanned instead"));
    }
  }
  for (const std::string& path : candidates) {
    absl::StatusOr<CheckpointInfo> info = VerifyCheckpoint(path);
    if (info.ok()) return std::optional<CheckpointInfo>(*std::move(info));
    if (skipped != nullptr) skipped->push_back(std::string(info.status().message()));
  }
  return std::optional<CheckpointInfo>();
}

absl::Status RestoreCheckpoint(const CheckpointInfo& checkpoint, ShmParamStore& store) {
  const json& body = checkpoint.manifest;
  const StoreLayout& layout = store.layout();
  const std::string& path = checkpoint.path;
  auto mismatch = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", what));
  };
  if (checkpoint.kind == CheckpointKind::kState) {
    return mismatch("a state-only checkpoint (the chief's; its parameters are in the ps tasks' checkpoints) holds no "
                    "parameters to restore into a store");
  }
  const int dense_slots = NumSlots(store.optimizer().type);
  const int sparse_slots = NumSlots(store.sparse_optimizer().type);
  try {
    const json& opt = body.at("optimizer");
    if (opt.at("dense_slots").get<int>() != dense_slots || opt.at("dense").get<std::string>() != OptimizerTypeName(store.optimizer().type)) {
      return mismatch(absl::StrCat("the checkpoint's dense optimizer is ", opt.at("dense").get<std::string>(),
                                   ", the job's is ", OptimizerTypeName(store.optimizer().type)));
    }
    if (opt.at("sparse_slots").get<int>() != sparse_slots ||
        opt.at("sparse").get<std::string>() != OptimizerTypeName(store.sparse_optimizer().type)) {
      return mismatch(absl::StrCat("the checkpoint's sparse optimizer is ", opt.at("sparse").get<std::string>(),
                                   ", the job's is ", OptimizerTypeName(store.sparse_optimizer().type)));
    }
    const json& part = body.at("partitioning");
    const json& vars = part.at("variables");
    if (vars.size() != layout.variables.size()) {
      return mismatch(absl::StrCat("the checkpoint has ", vars.size(), " dense variables, the job ", layout.variables.size()));
    }
    const json& tables = part.at("tables");
    if (tables.size() != layout.tables.size()) {
      return mismatch(absl::StrCat("the checkpoint has ", tables.size(), " embedding tables, the job ", layout.tables.size()));
    }
    for (size_t v = 0; v < vars.size(); ++v) {
      const VariableSpec& spec = layout.variables[v];
      if (vars[v].at("name").get<std::string>() != spec.name || vars[v].at("rows").get<int64_t>() != spec.rows ||
          vars[v].at("cols").get<int64_t>() != spec.cols) {
        return mismatch(absl::StrCat("variable ", v, " is '", vars[v].at("name").get<std::string>(), "' [",
                                     vars[v].at("rows").get<int64_t>(), ", ", vars[v].at("cols").get<int64_t>(),
                                     "] in the checkpoint, '", spec.name, "' [", spec.rows, ", ", spec.cols,
                                     "] in the job"));
      }
    }
    for (size_t t = 0; t < tables.size(); ++t) {
      const TableSpec& spec = layout.tables[t];
      if (tables[t].at("name").get<std::string>() != spec.name ||
          tables[t].at("kind").get<std::string>() != EmbeddingKindName(spec.kind) ||
          tables[t].at("dim").get<int64_t>() != spec.dim) {
        return mismatch(absl::StrCat("embedding table ", t, " is '", tables[t].at("name").get<std::string>(), "' (",
                                     tables[t].at("kind").get<std::string>(), ", dim ", tables[t].at("dim").get<int64_t>(),
                                     ") in the checkpoint, '", spec.name, "' (", EmbeddingKindName(spec.kind), ", dim ",
                                     spec.dim, ") in the job"));
      }
    }

    // A partial store's checkpoint holds only its block: it restores into a
    // store hosting the same block of the same shard count, or into a full
    // store (its rows of each variable, the rows of its tables: one part of
    // a cluster's checkpoint, the others restored after it).
    const bool has_block = body.contains("hosted");
    {
      const int64_t first = has_block ? body["hosted"].at("first_shard").get<int64_t>() : 0;
      const int64_t total = has_block ? body["hosted"].at("total_shards").get<int64_t>() : 0;
      const int64_t num = has_block ? body["hosted"].at("num_shards").get<int64_t>() : 0;
      const bool into_full = has_block && !store.partial();
      if ((has_block || store.partial()) && !into_full &&
          (!has_block || first != store.first_hosted_shard() || num != store.num_hosted_shards() ||
           total != layout.num_shards)) {
        return mismatch(absl::StrCat(
            "the checkpoint holds ",
            has_block ? DescribeBlock(first, num, total) : std::string("the whole store (every row)"),
            ", the store hosts ",
            DescribeBlock(store.first_hosted_shard(), store.num_hosted_shards(), layout.num_shards),
            has_block ? "; restore a partial checkpoint into a store hosting the same block"
                      : "; restore a full checkpoint into a full store"));
      }
    }
    // Dense: global tensors, written over whatever shards this store has (a
    // partial store: its hosted rows).
    SW_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> dense,
                        SafetensorsReader::Open((fs::path(path) / kDenseFile).string()));
    for (size_t v = 0; v < vars.size(); ++v) {
      const VariableSpec& spec = layout.variables[v];
      SW_ASSIGN_OR_RETURN(absl::Span<const float> params, dense->GetAs<float>(spec.name));
      std::vector<absl::Span<const float>> slot_data;
      std::vector<const float*> slots;
      for (int k = 0; k < dense_slots; ++k) {
        SW_ASSIGN_OR_RETURN(absl::Span<const float> s, dense->GetAs<float>(absl::StrCat(spec.name, "/slot", k)));
        slot_data.push_back(s);
        slots.push_back(s.data());
      }
      RowRange rows = store.hosted_rows(static_cast<int>(v));
      if (has_block && !store.partial()) {  // a part, into a full store: the rows it holds
        const json& r = body["hosted"].at("rows").at(v);
        rows = RowRange{r.at(0).get<int64_t>(), r.at(1).get<int64_t>()};
        if (rows.begin < 0 || rows.begin > rows.end || rows.end > spec.rows) {
          return mismatch(absl::StrCat("rows [", rows.begin, ", ", rows.end, ") of '", spec.name, "' are not in [0, ",
                                       spec.rows, ")"));
        }
      }
      const size_t n = static_cast<size_t>(rows.size() * spec.cols);
      if (params.size() != n) return mismatch(absl::StrCat("tensor '", spec.name, "' has ", params.size(), " floats, not ", n));
      for (int k = 0; k < dense_slots; ++k) {
        if (slot_data[k].size() != n) return mismatch(absl::StrCat("slot ", k, " of '", spec.name, "' has the wrong size"));
      }
      if (rows.size() > 0) {
        SW_RETURN_IF_ERROR(store.WriteRows(static_cast<int>(v), rows.begin, rows.end, params.data(), slots));
      }
      store.SetUpdateCount(static_cast<int>(v), vars[v].at("update_count").get<uint64_t>());
    }
    // Tables: each row to the shard that holds its id now; the
    // tables side by side on every hardware thread (each writes only its
    // own table's rows).
    SW_RETURN_IF_ERROR(ParallelForStatus(0, static_cast<int64_t>(tables.size()), [&](int64_t t) -> absl::Status {
      SW_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> r,
                          SafetensorsReader::Open((fs::path(path) / TableFile(static_cast<int>(t))).string()));
      SW_ASSIGN_OR_RETURN(absl::Span<const uint64_t> ids, r->GetAs<uint64_t>("ids"));
      SW_ASSIGN_OR_RETURN(absl::Span<const uint64_t> counts, r->GetAs<uint64_t>("update_count"));
      SW_ASSIGN_OR_RETURN(absl::Span<const float> params, r->GetAs<float>("params"));
      const size_t dim = static_cast<size_t>(layout.tables[t].dim);
      std::vector<absl::Span<const float>> slot_data;
      for (int k = 0; k < sparse_slots; ++k) {
        SW_ASSIGN_OR_RETURN(absl::Span<const float> s, r->GetAs<float>(absl::StrCat("slot", k)));
        slot_data.push_back(s);
      }
      const size_t n = ids.size();
      if (counts.size() != n || params.size() != n * dim) {
        return mismatch(absl::StrCat("table file ", TableFile(static_cast<int>(t)), " has inconsistent tensor sizes"));
      }
      for (int k = 0; k < sparse_slots; ++k) {
        if (slot_data[k].size() != n * dim) return mismatch(absl::StrCat("slot ", k, " of table ", t, " has the wrong size"));
      }
      std::vector<const float*> slots(sparse_slots);
      for (int k = 0; k < sparse_slots; ++k) slots[k] = slot_data[k].data();
      // The file lists a static table shard by shard in row order, so its
      // rows go back in blocks.
      const absl::Status s = store.WriteTableRows(static_cast<int>(t), ids, params.data(), slots, counts.data());
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": restoring table ", t, ": ", s.message()));
      return absl::OkStatus();
    }));
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": malformed manifest: ", e.what()));
  }
  // A part restored into a full store keeps the largest version of the parts.
  const bool part_into_full = checkpoint.manifest.contains("hosted") && !store.partial();
  store.SetVersion(part_into_full ? std::max(store.version(), checkpoint.model_version) : checkpoint.model_version);
  return absl::OkStatus();
}

}  // namespace shardwild

namespace shardwild {

absl::StatusOr<std::string> WriteStateCheckpoint(const std::string& dir, const CheckpointState& state,
                                                 const nlohmann::json& params_info, const CheckpointWriteOptions& options) {
  SW_ASSIGN_OR_RETURN(const PendingCheckpoint pending, BeginCheckpoint(dir, state, options));
  MaybeCrash(options, CheckpointCrashPoint::kAfterTensorFiles);  // there are none
  uint64_t model_version = 0;
  if (params_info.is_object() && params_info.contains("model_version") &&
      params_info["model_version"].is_number_unsigned()) {
    model_version = params_info["model_version"].get<uint64_t>();
  }
  const json body = {{"format", "shardwild-checkpoint"},
                     {"format_version", kFormatVersion},
                     {"kind", "state"},
                     {"step", state.step},
                     {"epoch", state.epoch},
                     {"model_version", model_version},
                     {"config_hash", state.config_hash},
                     {"params", params_info},
                     {"data_cursor", state.data_cursor},
                     {"rng", state.rng},
                     {"extra", state.extra},
                     {"files", json::array()}};
  return CommitCheckpoint(pending, body, state.step, options);
}

}  // namespace shardwild

namespace shardwild {

absl::Status RestoreClusterCheckpoint(const CheckpointInfo& chief, ShmParamStore& store) {
  const json& params = chief.params_info;
  if (chief.kind != CheckpointKind::kState || !params.is_object() || params.value("kind", "") != "cluster" ||
      !params.contains("ps") || !params["ps"].is_array()) {
    return absl::FailedPreconditionError(
        absl::StrCat(chief.path, ": not a cluster checkpoint (no list of the ps tasks' checkpoints)"));
  }
  for (const json& part : params["ps"]) {
    const std::string task = part.value("task", "?");
    const std::string path = part.value("path", "");
    absl::StatusOr<CheckpointInfo> info = VerifyCheckpoint(path);
    if (!info.ok()) {
      return absl::Status(info.status().code(), absl::StrCat(chief.path, ": the part of ", task, ": ",
                                                             info.status().message()));
    }
    if (info->step != chief.step) {
      return absl::FailedPreconditionError(absl::StrCat(chief.path, ": the part of ", task, " (", path,
                                                        ") is of step ", info->step, ", not ", chief.step));
    }
    SW_RETURN_IF_ERROR(RestoreCheckpoint(*info, store));
  }
  return absl::OkStatus();
}

}  // namespace shardwild
