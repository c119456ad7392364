// Writing and restoring a checkpoint of embedding tables, next to the bounds
// measured in the same run: the same bytes handed to the kernel with
// write(2), and read back with read(2), as many files on as many threads.
// The store is DLRM's kind (ctr_dlrm.yaml): static tables of 16 floats a row
// and SGD, so a row is its 64 bytes of parameters.
//
//   build/bench/workers/checkpoint_benchmark --benchmark_counters_tabular=true
//
// Args: tables, rows a table, what:
//   0  WriteCheckpoint (keep 1, so each new one also removes the last)
//   1  bound: the checkpoint's files, as many bytes each, written from a
//      buffer with write(2) in 1 MiB pieces on every hardware thread, then
//      removed
//   2  FindLatestCheckpoint (every file's CRC32C) and RestoreCheckpoint into
//      a second store
//   3  bound: the checkpoint's files read with read(2) in 1 MiB pieces on
//      every hardware thread
// Nothing is fsynced, and each benchmark starts after a sync(2) and runs 3
// iterations, so that none meets the kernel's dirty-page limits, where the
// disk's rate bounds every write. With fsync (the trainer's default) the
// disk's rate bounds a checkpoint as well (`dd if=/dev/zero of=F bs=1M
// count=1024 conv=fsync` measures it).
// Counter: bytes/s of the checkpoint's files.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/parallel_for.h"
#include "ps_shm/shm_store.h"
#include "workers/checkpoint.h"

namespace shardwild {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDim = 16;
constexpr size_t kPiece = size_t{1} << 20;

// A scratch directory under $TMPDIR (else /tmp), removed at exit.
const std::string& ScratchDir() {
  static const struct Dir {
    std::string path;
    Dir() {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/sw-ckpt-bench-XXXXXX";
      path = mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
    }
    ~Dir() {
      std::error_code ec;
      if (!path.empty()) fs::remove_all(path, ec);
    }
  } dir;
  return dir.path;
}

std::unique_ptr<ShmParamStore> MakeStore(int64_t tables, int64_t rows, uint64_t seed) {
  OpenStoreOptions o;
  o.store.job_name = "swbench-ckpt";
  o.optimizer.type = OptimizerType::kSgd;
  o.sparse_optimizer = o.optimizer;
  o.seed = seed;
  for (int64_t t = 0; t < tables; ++t) {
    TableSpec spec;
    spec.name = absl::StrCat("t", t);
    spec.dim = kDim;
    spec.capacity = rows;
    o.tables.push_back(spec);
  }
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s =
      ShmParamStore::Create(o, {VariableSpec{"w", 64, 64, InitKind::kGlorotUniform, 64, 64}});
  return s.ok() ? *std::move(s) : nullptr;
}

// The stores and the checkpoint of the last (tables, rows), kept between
// benchmarks: a store is rows x tables x 64 bytes.
struct Fixture {
  std::tuple<int64_t, int64_t> key{-1, -1};
  std::unique_ptr<ShmParamStore> store, restored;
  int64_t step = 0;
  std::vector<std::pair<std::string, uint64_t>> files;  // the last checkpoint's: name, bytes
  uint64_t bytes = 0;
};
Fixture g;

std::string CheckpointDir() { return ScratchDir() + "/ckpt"; }

// Writes the next checkpoint; records its files.
absl::Status WriteNext() {
  CheckpointState state;
  state.step = ++g.step;
  state.config_hash = "bench";
  CheckpointWriteOptions o;
  o.keep = 1;
  o.fsync = false;
  absl::StatusOr<std::string> path = WriteCheckpoint(CheckpointDir(), *g.store, state, o);
  if (!path.ok()) return path.status();
  g.files.clear();
  g.bytes = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(*path)) {
    if (e.path().extension() != ".safetensors") continue;
    g.files.emplace_back(e.path().filename().string(), e.file_size());
    g.bytes += e.file_size();
  }
  return absl::OkStatus();
}

bool SetUp(benchmark::State& state, int64_t tables, int64_t rows) {
  if (ScratchDir().empty()) {
    state.SkipWithError("no scratch directory");
    return false;
  }
  if (g.key != std::make_tuple(tables, rows)) {
    g = Fixture{};
    g.key = {tables, rows};
    g.store = MakeStore(tables, rows, 1);
    g.restored = MakeStore(tables, rows, 2);
    if (g.store == nullptr || g.restored == nullptr) {
      g = Fixture{};
      state.SkipWithError("store creation failed");
      return false;
    }
    // Twice: a checkpoint is written while the last is still there, so two
    // checkpoints' worth of page cache is what the timed writes reuse (the
    // first write of fresh memory costs the guest's and host's page faults,
    // 3-6 times the rest on a 2-core VM).
    for (int i = 0; i < 2; ++i) {
      if (absl::Status s = WriteNext(); !s.ok()) {
        state.SkipWithError(std::string(s.message()).c_str());
        return false;
      }
    }
  }
  return true;
}

// The bound's files: `files`' sizes under `dir`, written from `source`.
absl::Status WriteFiles(const std::string& dir, const std::vector<uint8_t>& source) {
  return ParallelForStatus(0, static_cast<int64_t>(g.files.size()), [&](int64_t i) -> absl::Status {
    const std::string path = dir + "/" + g.files[static_cast<size_t>(i)].first;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::InternalError("open " + path);
    for (uint64_t left = g.files[static_cast<size_t>(i)].second; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kPiece));
      const ssize_t w = ::write(fd, source.data(), n);
      if (w <= 0) {
        ::close(fd);
        return absl::InternalError("write " + path);
      }
      left -= static_cast<uint64_t>(w);
    }
    ::close(fd);
    return absl::OkStatus();
  });
}

absl::Status ReadFiles(const std::string& dir) {
  return ParallelForStatus(0, static_cast<int64_t>(g.files.size()), [&](int64_t i) -> absl::Status {
    const std::string path = dir + "/" + g.files[static_cast<size_t>(i)].first;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError("open " + path);
    std::vector<uint8_t> buf(kPiece);
    uint8_t sum = 0;
    uint64_t got = 0;
    for (ssize_t r; (r = ::read(fd, buf.data(), buf.size())) > 0;) {
      sum ^= buf[static_cast<size_t>(r) - 1];
      got += static_cast<uint64_t>(r);
    }
    benchmark::DoNotOptimize(sum);
    ::close(fd);
    if (got != g.files[static_cast<size_t>(i)].second) return absl::InternalError("short read of " + path);
    return absl::OkStatus();
  });
}

void BM_Checkpoint(benchmark::State& state) {
  const int64_t tables = state.range(0), rows = state.range(1), what = state.range(2);
  if (!SetUp(state, tables, rows)) return;
  const std::string bound_dir = ScratchDir() + "/bound";
  std::vector<uint8_t> source(what == 1 ? kPiece : 0, 0x5a);
  if (what == 1) {
    // Once untimed, as the checkpoints were (SetUp).
    fs::create_directories(bound_dir);
    if (absl::Status s = WriteFiles(bound_dir, source); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  // Every benchmark starts with nothing dirty and runs as many iterations:
  // past the kernel's dirty limits (vm.dirty_background_ratio,
  // vm.dirty_ratio) writes wait for the disk, so a run that followed more
  // written bytes would measure the disk instead.
  ::sync();
  int64_t round = 0;
  for (auto _ : state) {
    absl::Status s;
    if (what == 0) {
      s = WriteNext();
    } else if (what == 1) {
      // Written next to the last files, which are then removed, as a
      // checkpoint with keep 1 does.
      const bool a = (round++ % 2) == 0;
      const std::string next = bound_dir + (a ? "-a" : "-b");
      fs::create_directories(next);
      s = WriteFiles(next, source);
      std::error_code ec;
      fs::remove_all(bound_dir + (a ? "-b" : "-a"), ec);
      fs::remove_all(bound_dir, ec);
    } else if (what == 2) {
      absl::StatusOr<std::optional<CheckpointInfo>> found = FindLatestCheckpoint(CheckpointDir());
      s = !found.ok()              ? found.status()
          : !found->has_value() ? absl::NotFoundError("no checkpoint")
                                : RestoreCheckpoint(**found, *g.restored);
    } else {
      s = ReadFiles(CheckpointDir() + "/ckpt-" + std::to_string(g.step));
    }
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
  }
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(g.bytes), benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1024);
  state.counters["threads"] = ResolveThreads(0);
  state.counters["files"] = static_cast<double>(g.files.size());
  state.counters["MiB"] = static_cast<double>(g.bytes) / (1 << 20);
  static const char* const kLabels[] = {"WriteCheckpoint", "bound: write(2) of the same bytes", "FindLatest + Restore",
                                        "bound: read(2) of the same files"};
  state.SetLabel(kLabels[what]);
}

BENCHMARK(BM_Checkpoint)
    ->ArgNames({"tables", "rows", "what"})
    ->ArgsProduct({{8}, {1 << 20}, {0, 1, 2, 3}})
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardwild
