// PsClient: calls one ps task's PsServer (ps.proto).
//
// Every call has a deadline (options.deadline_s per attempt) and is retried
// when an attempt fails with UNAVAILABLE or DEADLINE_EXCEEDED, at most
// options.max_attempts times in all, waiting initial_backoff_s, then twice
// that, up to max_backoff_s. Pushes are safe to retry: each carries this
// client's id and a fresh sequence number, and the server applies a
// (client, sequence) once. When every attempt has failed that way the call
// returns Unavailable naming the task, its address, the attempts and the
// time spent, e.g.
//   ps:1 (127.0.0.1:40411) is unavailable: 3 attempts in 0.4 s, last: failed to connect to all addresses
// Other errors keep their code (PermissionDenied, InvalidArgument, ...) with
// the task's name in front of the server's message.
//
// Large tensors: requests are split and answers reassembled so that no
// message exceeds options.max_message_bytes (set on the channel too).
//
// Compression (options.compression): pushed gradients are rounded to bf16 or
// fp16 (net/half.h) and travel in half the bytes; the server applies the
// rounded values. A row push sums repeated ids first, then rounds the sums.
//
// Every call blocks until it is answered or has failed (at most about
// max_attempts * deadline_s plus the backoffs).
//
// Thread safety: every method may be called concurrently; the client holds
// one channel (HTTP/2 connection) that the calls share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "net/net_options.h"
#include "ps_shm/embedding_table.h"
#include "ps_shm/param_store.h"

namespace shardwild {

// What GetLayout says about the served store.
struct RemoteLayout {
  std::string store_name;
  // Variables (name, rows, cols; `init` is not sent and reads kZeros), the
  // shard count, each variable's rows per shard, the shards' NUMA nodes on
  // the server, and the tables (name, kind, dim, capacity, on_full; `init`
  // is not sent).
  StoreLayout layout;
  std::string optimizer, sparse_optimizer, update_mode;
  uint64_t version = 0;
  // The block of layout.num_shards shards the server hosts (all of them for
  // a server that does not say).
  int first_hosted_shard = 0;
  int num_hosted_shards = 0;
};

// Rows [row_begin, row_end) of variable `var`, into `out` ((row_end -
// row_begin) * cols floats).
struct RemotePullSlice {
  int var = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  absl::Span<float> out;
};

// A gradient for variable `var`, or for a run of it: `grad` holds the floats
// starting `offset` floats into the variable (row-major). The server needs
// exactly its hosted rows of each variable named (ps.proto
// PushDenseRequest): offset = b * cols and grad.size() = (e - b) * cols for
// its hosted rows [b, e); the whole variable (offset 0) for a server
// hosting every shard.
struct RemoteDenseGrad {
  int var = 0;
  absl::Span<const float> grad;
  int64_t offset = 0;
};

// One part of a batched row pull: the rows of `ids` of table `table` into
// `out` (ids.size() * dim floats).
struct RemoteRowPull {
  int table = 0;
  absl::Span<const uint64_t> ids;
  absl::Span<float> out;
};

// One part of a batched row push: gradients `grads` (ids.size() * dim
// floats) for the rows of `ids` of table `table`.
struct RemoteRowPush {
  int table = 0;
  absl::Span<const uint64_t> ids;
  absl::Span<const float> grads;
};

class PsClient {
 public:
  // Makes the channel; connects lazily, on the first call. InvalidArgument
  // for bad options (PsClientOptions::Validate).
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(const PsClientOptions& options);
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  const PsClientOptions& options() const;

  absl::StatusOr<RemoteLayout> GetLayout();
  // Rows [row_begin, row_end) of variable `var` into `out`, which must hold
  // exactly (row_end - row_begin) * cols floats: a server answering another
  // length is an Internal error. `version`, if not null, gets the model
  // version when the pull began.
  absl::Status PullDense(int var, int64_t row_begin, int64_t row_end, absl::Span<float> out,
                         uint64_t* version = nullptr);
  // Several slices in one call (PullDenseBatch): slice i's rows
  // [row_begin, row_end) of variable `var` into its `out`, which must hold
  // exactly (row_end - row_begin) * cols floats. `version` as PullDense's.
  absl::Status PullDenseBatch(absl::Span<const RemotePullSlice> slices, uint64_t* version = nullptr);
  // Applies one optimizer step with `lr` to each variable with its gradient
  // (ParamStore::Push; RemoteDenseGrad says which floats each carries);
  // returns the model version after it.
  absl::StatusOr<uint64_t> PushDense(absl::Span<const RemoteDenseGrad> grads, float lr);
  // Rows of `ids` of table `table` into `out` (ids.size() * dim floats).
  // Ids may repeat. A PullRowsBatch of one part.
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, absl::Span<float> out,
                        PullMode mode = PullMode::kInsert);
  // One step of the table's optimizer with `lr` on the rows of `ids`
  // (gradients ids.size() * dim floats; dim = grads.size() / ids.size()).
  // Repeated ids are summed here first (in batch order), so each row goes
  // over the wire once. A PushRowsBatch of one part.
  absl::StatusOr<uint64_t> PushRows(int table, absl::Span<const uint64_t> ids, absl::Span<const float> grads,
                                    float lr);
  // Every part's rows in one call (PullRowsBatch; several calls only when
  // the ids exceed max_message_bytes): part i's rows into its `out`, which
  // must hold ids.size() * dim floats of its table. Parts without ids are
  // skipped. A bad part anywhere (the server checks all of them first)
  // means nothing is pulled in that call.
  absl::Status PullRowsBatch(absl::Span<const RemoteRowPull> parts, PullMode mode = PullMode::kInsert);
  // Every part's row push in one stream (PushRowsBatch), applied by the
  // server in part order, each part one optimizer step on its rows
  // (repeated ids of a part summed here first). Parts without ids are left out.
  // Returns the model version after it. Nothing is applied when any part is
  // invalid.
  absl::StatusOr<uint64_t> PushRowsBatch(absl::Span<const RemoteRowPush> parts, float lr);
  absl::StatusOr<uint64_t> Version();
  // The server writes ckpt-<step> into its checkpoint directory; returns its path.
  absl::StatusOr<std::string> SaveShard(int64_t step);
  // The server loads ckpt-<step> (nullopt: its newest good checkpoint);
  // returns the step loaded.
  absl::StatusOr<int64_t> RestoreShard(std::optional<int64_t> step);
  // Opens a server started closed (PsServerOptions::start_closed) with the
  // values its store holds; a no-op on an open one.
  absl::Status Open();
  // ps.proto JobDone, from `from` ("rank 0"): whether the ps task exits now.
  absl::StatusOr<bool> JobDone(const std::string& from);
  // grpc.health.v1 Check of `service` ("" = the server): true for SERVING.
  absl::StatusOr<bool> Healthy(const std::string& service = "");

  // Bytes of the pull and push messages this client sent and received (the
  // protobuf encoding, every attempt; HTTP/2 framing not counted): the
  // effect of options.compression on the wire. Thread-safe.
  struct Stats {
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
  };
  Stats stats() const;

  class Impl;

 private:
  explicit PsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardwild
