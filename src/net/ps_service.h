// PsService: what a ps task does with each request of ps.proto, apart from
// the transport. PsServer (ps_server.h) puts it behind gRPC with the token
// check; the fuzzer (tests/fuzz/ps_request_fuzz.cc) calls it directly with
// decoded messages.
//
// Every request is checked in full before the store is touched: an unknown
// variable or table, a row range outside the variable, a gradient whose
// length does not match, an id the table cannot hold, a non-finite learning
// rate or a push over the byte budget is InvalidArgument, and nothing is
// written. So are rows and ids the store does not host (a partial store,
// one ps task's block of the global shards; ps.proto says what a push must
// carry). Pushes are applied only after their whole stream has been read.
//
// Thread safety: every method may be called concurrently (the store is
// Hogwild-safe; the push de-duplication state is under mu_; SaveShard and
// RestoreShard are serialised with each other). A checkpoint taken while
// pushes run mixes them as ShmParamStore's snapshots do.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "core/base/mutex.h"
#include "net/ps.pb.h"
#include "ps_shm/shm_store.h"

namespace shardwild {

class PsService {
 public:
  struct Options {
    // The most floats one answer message carries (chunks of a pull).
    int64_t max_chunk_floats = (4 << 20) / 4 - 256;
    // The most bytes of gradients and ids one push may carry in all.
    int64_t max_push_bytes = int64_t{1} << 30;
    // SaveShard / RestoreShard directory; empty = FailedPrecondition.
    std::string checkpoint_dir;
    // PsServerOptions::checkpoint_keep.
    int checkpoint_keep = 5;
    // For messages ("ps:0").
    std::string task_name = "ps";
    // PsServerOptions::start_closed: pulls and pushes are UNAVAILABLE and
    // saves FAILED_PRECONDITION until RestoreShard opens the store.
    bool start_closed = false;
    // PsServerOptions::exit_when_done.
    bool exit_when_done = false;
  };
  // Recently applied push sequences remembered per client, and clients
  // remembered; beyond them the oldest are forgotten.
  static constexpr size_t kSequencesPerClient = 4096;
  static constexpr size_t kMaxClients = 4096;

  // `store` is not owned and must outlive the service.
  PsService(ShmParamStore* store, Options options);

  // Write a message of a streamed answer; false when the peer is gone.
  template <typename T>
  using Writer = std::function<bool(const T&)>;
  // Read the next message of a request stream into *msg; false at its end.
  template <typename T>
  using Reader = std::function<bool(T*)>;

  void GetLayout(net::LayoutResponse* out) const;
  absl::Status PullDense(const net::PullDenseRequest& request, const Writer<net::DenseChunk>& write) const;
  // Every slice is checked first (nothing is sent when one is bad), then
  // each is streamed as PullDense would, its chunks marked with its index.
  absl::Status PullDenseBatch(const net::PullDenseBatchRequest& request, const Writer<net::DenseChunk>& write) const;
  absl::Status PushDense(const Reader<net::PushDenseRequest>& read, net::PushResponse* out);
  // ps.proto PullRowsBatch: every part is checked first (nothing is sent
  // when one is bad), then each is streamed, its chunks marked with its index.
  absl::Status PullRowsBatch(const net::PullRowsBatchRequest& request, const Writer<net::RowsChunk>& write) const;
  // ps.proto PushRowsBatch: the parts are read and checked in full, then
  // applied in order, each as one PushRows.
  absl::Status PushRowsBatch(const Reader<net::PushRowsRequest>& read, net::PushResponse* out);
  uint64_t Version() const { return store_->version(); }
  absl::Status SaveShard(const net::SaveShardRequest& request, net::SaveShardResponse* out);
  absl::Status RestoreShard(const net::RestoreShardRequest& request, net::RestoreShardResponse* out);
  // Whether pulls and pushes are served (Options::start_closed).
  bool open() const { return open_.load(std::memory_order_acquire); }
  // ps.proto JobDone: with Options::exit_when_done, job_done() is true from
  // then on (the ps task's loop exits).
  void JobDone(const net::JobDoneRequest& request, net::JobDoneResponse* out);
  bool job_done() const { return job_done_.load(std::memory_order_acquire); }

  // Pushes applied, and those answered as duplicates of an applied one.
  uint64_t pushes_applied() const;
  uint64_t pushes_deduplicated() const;

 private:
  // Marks (client, sequence) as being applied; false when it was already
  // (a retry of a push that reached us). client 0 is never de-duplicated.
  absl::StatusOr<bool> BeginPush(uint64_t client, uint64_t sequence);
  // Forgets (client, sequence) after its push failed, so a retry applies.
  void AbortPush(uint64_t client, uint64_t sequence);
  absl::Status Invalid(const std::string& what) const;
  // UNAVAILABLE while the store is closed; `what` names the request.
  absl::Status CheckOpen(const char* what) const;
  // PullDense's checks of one slice.
  absl::Status CheckPull(const net::PullDenseRequest& request) const;
  // Streams one checked slice; its chunks carry `slice`.
  absl::Status StreamPull(const net::PullDenseRequest& request, int slice, uint64_t version,
                          const Writer<net::DenseChunk>& write) const;
  // The checks of one part of a row pull (`where` starts the message); its mode.
  absl::StatusOr<PullMode> CheckRowPull(const net::PullRowsRequest& request, const std::string& where) const;
  // Streams one checked part of a row pull; its chunks carry `part`.
  absl::Status StreamRows(const net::PullRowsRequest& request, PullMode mode, int part, uint64_t version,
                          const Writer<net::RowsChunk>& write) const;
  // A row push as read from its stream, every id checked.
  struct RowPushPart {
    int part = 0;  // PushRowsRequest.part
    int table = 0;
    std::vector<uint64_t> ids;
    std::vector<float> grads;
  };
  struct RowPushRequest {
    uint64_t client = 0, sequence = 0;
    float lr = 0;
    std::vector<RowPushPart> parts;
  };
  // Reads and checks a PushRowsBatch stream.
  absl::Status ReadRowPush(const Reader<net::PushRowsRequest>& read, RowPushRequest* out) const;
  // Applies a checked row push once per (client, sequence).
  absl::Status ApplyRowPush(const RowPushRequest& request, net::PushResponse* out);
  // "this server hosts shards f..l of S", for messages.
  std::string HostedWhat() const;
  // Invalid (prefixed by `where`) when `id`'s shard is not hosted here.
  absl::Status CheckIdHosted(const TableSpec& table, uint64_t id, const std::string& where) const;

  // Constant after construction.
  ShmParamStore* const store_;
  const Options options_;

  mutable Mutex mu_;
  // State below is guarded by mu_.
  struct ClientPushes {
    std::set<uint64_t> sequences;  // applied or being applied, the newest kSequencesPerClient
    uint64_t last_use = 0;         // tick of the latest push, to forget idle clients first
  };
  std::map<uint64_t, ClientPushes> clients_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pushes_applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pushes_deduplicated_ ABSL_GUARDED_BY(mu_) = 0;

  // Serialises SaveShard and RestoreShard.
  Mutex checkpoint_mu_;
  // Set by RestoreShard (release: its writes are seen by the requests that
  // pass CheckOpen).
  std::atomic<bool> open_;
  std::atomic<bool> job_done_{false};
};

}  // namespace shardwild
