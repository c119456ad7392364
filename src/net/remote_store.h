// RemoteParamStore: a ParamStore whose shards all live in one ps task's
// PsServer, reached through a PsClient.
//
// This is the single-server building block of the gRPC bridge: a worker
// given a RemoteParamStore pulls and pushes exactly as with the local
// ShmParamStore the server serves (the same bits for the same calls; see
// tests/net/remote_store_test.cc). The server must host every shard.
// Spreading one store's shards over several ps tasks (the global shard map,
// net/cluster_spec.h ShardMap), mixing local and remote ps tasks and calling
// them in parallel is net/cluster_store.h's ClusterParamStore.
//
// Each call is one or more gRPC calls with PsClient's deadline and retries;
// their errors come back as the ParamStore method's Status (Unavailable
// naming the task when the server stays unreachable).
//
// Thread safety: every method may be called concurrently (PsClient is
// thread-safe; the cached version is an atomic).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "net/ps_client.h"
#include "ps_shm/param_store.h"

namespace shardwild {

class RemoteParamStore final : public ParamStore {
 public:
  // Connects (one GetLayout call, with retries) and copies the server's
  // layout. Errors: those of PsClient::Create and GetLayout.
  static absl::StatusOr<std::unique_ptr<RemoteParamStore>> Connect(const PsClientOptions& options);

  const StoreLayout& layout() const override { return layout_; }
  // "<task>/<the server's store name>", e.g. "ps:0/shardwild-1234-ab12".
  const std::string& name() const override { return name_; }
  // Each slice is one PullDense call, in order.
  absl::Status Pull(absl::Span<const PullSlice> slices) override;
  // One PushDense call carrying every gradient (applied at once on the server).
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override;
  // `scratch` is not used: ids are grouped on the server.
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                        RowScratch* scratch) override;
  absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                        RowScratch* scratch) override;
  // One PullRowsBatch / PushRowsBatch call for all parts (PullRows /
  // PushRows: a batch of one).
  absl::Status PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch* scratch) override;
  absl::Status PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch* scratch) override;
  // The server's model version (a Version call). If the server cannot be
  // reached, the last version seen by any call of this store: the next pull
  // or push reports the error.
  uint64_t version() const override;

  PsClient& client() { return *client_; }

 private:
  RemoteParamStore() = default;
  absl::Status CheckTable(int table, const char* what) const;
  void SeeVersion(uint64_t v) const;

  // Constant after Connect.
  std::unique_ptr<PsClient> client_;
  StoreLayout layout_;
  std::string name_;
  // The latest version a Version call returned, or a larger one a pull or
  // push saw since (relaxed: a hint for when the server is unreachable).
  mutable std::atomic<uint64_t> last_version_{0};
};

}  // namespace shardwild
