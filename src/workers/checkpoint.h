// Checkpoints: a job's parameters, optimizer slots and progress on disk, in a
// form any safetensors reader opens, written so that a crash at any moment
// never leaves a checkpoint that loads wrongly.
//
// Layout of a checkpoint directory `DIR` (checkpoint.dir):
//
//   DIR/checkpoint                the pointer: JSON {"latest": "ckpt-<step>",
//                                 "all": [...]}, replaced atomically
//   DIR/history.jsonl             one line {"name", "step"} appended per
//                                 completed checkpoint, right after its rename
//   DIR/ckpt-<step>/              one complete checkpoint
//       dense.safetensors         every dense variable as one global tensor
//                                 "<var>" [rows, cols] F32, and each optimizer
//                                 slot as "<var>/slot<k>" (slot names in the
//                                 file's metadata)
//       table-<t>.safetensors     embedding table t (layout order): "ids" U64
//                                 [n], "update_count" U64 [n], "params" F32
//                                 [n, dim], "slot<k>" F32 [n, dim]; n = the
//                                 rows the table holds
//       manifest.json             {"body": {...}, "crc32c": C}: C is the
//                                 CRC32C of body's compact dump (sorted keys);
//                                 body holds step, epoch, model version,
//                                 config hash, the optimizers, the store's
//                                 partitioning, the caller's data cursor, RNG
//                                 state and extra fields, and every tensor
//                                 file's size and CRC32C
//
// Tensors are global (not per shard), so a checkpoint restores into a store
// with any shard count: rows are re-partitioned on load.
//
// Kinds of checkpoint, told apart by the manifest body:
//   * a store checkpoint (no "kind" key): the above. A partial store
//     (ShmParamStore hosting a block of the global shards, one ps task's
//     share) writes the same files holding only its hosted rows: each dense
//     tensor "<var>" is [hosted rows, cols] (possibly [0, cols]) and the
//     table files hold the rows of the hosted shards. Its body then has
//     "hosted": {"first_shard", "num_shards" (hosted), "total_shards",
//     "rows": [[begin, end] per variable]}; a full store's body has no
//     "hosted" key, so its files and manifest are as before.
//   * a state checkpoint ("kind": "state"; WriteStateCheckpoint): the chief of
//     a cluster, whose parameters live on the ps tasks, records its progress
//     (step, epoch, data cursor, RNG, extra) and "params" (what the caller
//     says about where the parameters are, e.g. the ps tasks' checkpoint
//     paths); it has no tensor files ("files": []).
// Both kinds use the same directory names, pointer, history and pruning, and
// both are found by FindLatestCheckpoint and checked by VerifyCheckpoint
// (CheckpointInfo::kind says which it is).
//
// Writing (WriteCheckpoint): everything goes into DIR/.ckpt-<step>.tmp-<pid>;
// each file is fsynced, the manifest written last and fsynced, the directory
// fsynced, then renamed to ckpt-<step> and DIR fsynced. Only then is the
// pointer replaced (written to checkpoint.tmp, fsynced, renamed, DIR
// fsynced), and only after that are checkpoints beyond `keep` (oldest first)
// and temporary directories of dead writers removed. A crash before the
// rename leaves only a temporary directory, which loading ignores; a crash
// after it leaves a complete checkpoint, found by scanning even if the
// pointer still names the previous one.
//
// Loading (FindLatestCheckpoint): candidates are the pointer's checkpoint and
// every ckpt-<step> directory, newest step first; the first whose manifest
// parses, whose CRC matches and whose files all have the recorded size and
// CRC32C is used. Each one skipped is reported with the reason.
//
// Consistency: a checkpoint is exact only if no worker pulls or pushes while
// it is written (the trainer writes them between steps). With concurrent
// pushes the tensors mix updates as a Hogwild read does.
//
// Thread safety: the functions are not meant to run concurrently on the same
// directory; they may run concurrently with readers of the store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "ps_shm/shm_store.h"

namespace shardwild {

// What the caller records beside the parameters.
struct CheckpointState {
  int64_t step = 0;             // global steps done
  int64_t epoch = 0;            // epochs fully done
  std::string config_hash;      // of the training config (a changed config is reported on resume)
  nlohmann::json data_cursor;   // the dispatcher's cursor (which tasks of the epoch are done)
  nlohmann::json rng;           // RNG streams to continue
  nlohmann::json extra;         // anything else (metrics, early-stopping state)
};

// Where a crash is injected while writing (tests only): the writer calls
// _exit(kCheckpointCrashExitCode) right after that phase.
enum class CheckpointCrashPoint {
  kNone,
  kAfterTensorFiles,    // tensor files written, no manifest
  kAfterManifest,       // temporary directory complete, not renamed
  kAfterRename,         // ckpt-<step> in place, pointer not updated
  kAfterPointerTemp,    // checkpoint.tmp written, not renamed
  kAfterPointer,        // pointer updated, old checkpoints not pruned
};
inline constexpr int kCheckpointCrashExitCode = 86;

struct CheckpointWriteOptions {
  int keep = 5;        // checkpoint.keep: complete checkpoints kept, >= 1
  bool fsync = true;   // fsync files and directories (tests may turn it off for speed)
  CheckpointCrashPoint crash_at = CheckpointCrashPoint::kNone;
};

// Writes a checkpoint of `store` and `state` as ckpt-<state.step> under
// `dir` (created if missing), then updates the pointer and prunes. A
// complete ckpt-<step> already there is replaced. Returns the checkpoint's
// path. Errors name the file and what failed; on error the previous
// checkpoints are untouched.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, ShmParamStore& store,
                                            const CheckpointState& state, const CheckpointWriteOptions& options = {});

// What a checkpoint holds (the manifest body's "kind"; see above).
enum class CheckpointKind {
  kStore,  // a store's parameters (full or partial) and the state
  kState,  // the state only (WriteStateCheckpoint)
};

// Writes a state-only checkpoint ("kind": "state") of `state` as
// ckpt-<state.step> under `dir`, with `params_info` (any JSON; if it is an
// object with an unsigned "model_version", that becomes the checkpoint's
// model_version, else 0) recorded as the body's "params". The same atomic
// write, pointer, history and pruning as WriteCheckpoint. For the chief of a
// cluster, whose parameters the ps tasks checkpoint themselves.
absl::StatusOr<std::string> WriteStateCheckpoint(const std::string& dir, const CheckpointState& state,
                                                 const nlohmann::json& params_info,
                                                 const CheckpointWriteOptions& options = {});

// A checkpoint found on disk, verified.
struct CheckpointInfo {
  std::string path;             // DIR/ckpt-<step>
  int64_t step = 0;
  uint64_t model_version = 0;
  CheckpointKind kind = CheckpointKind::kStore;
  CheckpointState state;
  nlohmann::json params_info;   // kState: the caller's params_info; else null
  nlohmann::json manifest;      // the manifest's body
};

// Checks one checkpoint directory: manifest present, parsed, CRC matching,
// every file present with its recorded size and CRC32C. Errors name the
// path and the first problem.
absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& path);

// The newest checkpoint under `dir` that verifies, or nullopt if there is
// none (or `dir` does not exist). Each newer one that did not verify is
// appended to `skipped` (if not null) as "path: reason".
absl::StatusOr<std::optional<CheckpointInfo>> FindLatestCheckpoint(const std::string& dir,
                                                                  std::vector<std::string>* skipped = nullptr);

// Every checkpoint ever completed under `dir`, in the order written (name,
// step), from DIR/history.jsonl, which WriteCheckpoint appends to right after
// it renames a checkpoint into place (a crash between the two leaves a
// complete checkpoint the history lacks). Pruned checkpoints stay listed.
std::vector<std::pair<std::string, int64_t>> CheckpointHistory(const std::string& dir);

// Every complete checkpoint directory under `dir` (ckpt-<step>), oldest
// first, not verified.
std::vector<std::string> ListCheckpoints(const std::string& dir);

// Loads `checkpoint` into `store`: every dense variable's parameters, slots
// and update count, every table's rows (inserted into dynamic tables), and
// the model version. The store must hold the same variables (name, rows,
// cols) and tables (name, kind, dim) with the same optimizers (their slot
// counts); its shard count may differ. A partial store's checkpoint restores
// into a store hosting the same block of the same number of shards, or into
// a full store (the rows it holds; restoring each ps task's part of a
// cluster checkpoint assembles the whole model, RestoreClusterCheckpoint),
// and a full one only into a full store (FailedPrecondition naming both
// blocks otherwise); a state checkpoint restores into no store (FailedPrecondition). Call it on a freshly created store
// before workers start (rows a store already holds that the checkpoint does
// not name are left as they are).
// Errors: FailedPrecondition naming the checkpoint and the mismatch; the
// errors of the files (a damaged file is found by VerifyCheckpoint first).
absl::Status RestoreCheckpoint(const CheckpointInfo& checkpoint, ShmParamStore& store);

// Loads a cluster's checkpoint into one full store: `chief` is the chief's
// state checkpoint (params_info {"kind": "cluster", "ps": [{"task",
// "path"}...]}); each ps task's checkpoint at its recorded path (which must
// be readable here: a shared file system, or copies at the same paths) is
// verified and restored into `store` in turn. Errors: FailedPrecondition
// when `chief` is no cluster checkpoint, and those of VerifyCheckpoint and
// RestoreCheckpoint naming the part.
absl::Status RestoreClusterCheckpoint(const CheckpointInfo& chief, ShmParamStore& store);

}  // namespace shardwild
