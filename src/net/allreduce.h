// The collectives of train.strategy allreduce across processes, on Gloo
// (the engine PyTorch uses on CPU): halving-doubling or ring allreduce over
// TCP, allgather and broadcast. Rank 0 serves a rendezvous (rendezvous.proto, a key-value
// store behind the cluster's token) at the spec's rendezvous address; every
// rank publishes its Gloo address there and connects a full mesh.
//
// Deadlines: connecting, and every collective, gives up after
// cluster.collective_timeout_s with Unavailable naming the rendezvous or
// the collective and what Gloo said (a peer that died closes its sockets,
// and the survivors fail at once; one that hangs is caught by the
// deadline). So no rank is left waiting for a peer that is gone.
//
// Sums are bit-identical on every rank (each block is reduced in one place
// and the result passed around), so ranks that apply them to identical
// parameters stay identical.
//
// Thread safety: one collective at a time (the sync barrier's completing
// thread, or the trainer's thread between rounds); counters may be read
// by any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "net/net_options.h"
#include "ps_shm/sync_aggregator.h"

namespace shardwild {

// Which of Gloo's allreduce algorithms sums the float buffers
// (cluster.allreduce_algorithm). The ring (Gloo's newer interface): a peer
// that dies mid-collective fails the others at once, so the group re-forms
// within a grace period. Halving-doubling (the older, bound interface):
// 2 log2(n) exchanges, about twice as fast on the default MLP's 0.9 MiB,
// but a peer lost mid-collective is noticed only at the deadline
// (timeout_s). Both give every rank the same bits.
using AllreduceAlgorithm = CollectiveAlgorithm;

struct CollectiveOptions {
  int rank = 0;
  int size = 1;  // >= 1; rank in [0, size)
  // Rank 0: where the rendezvous is served (its port is the rendezvous
  // port). Every rank: how to reach it.
  PsServerOptions server;
  PsClientOptions rendezvous;
  // The interface Gloo's sockets bind (an address or a name of this host).
  std::string gloo_host = "127.0.0.1";
  // Connecting and every collective; > 0.
  double timeout_s = 60;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kRing;
  // Tests only: called with the generation each time this rank's mesh has
  // connected; an exception it throws counts as that connect failing.
  std::function<void(int64_t generation)> after_connect_for_test;
};

class Collective final : public GradientReducer {
 public:
  // Rank 0 starts the rendezvous; every rank then connects Gloo's mesh.
  // Unavailable when the rendezvous cannot be bound or reached, or a peer
  // does not show up within the timeout (naming which). Gloo writes to its
  // peers with writev(), so Connect ignores SIGPIPE for the process (unless
  // the program set its own disposition): a peer that dies mid-collective
  // fails the collective instead of killing this process.
  static absl::StatusOr<std::unique_ptr<Collective>> Connect(const CollectiveOptions& options);
  ~Collective() override;

  // This process's rank and the group's size in the current generation.
  int rank() const;
  int size() const;

  // Elastic membership. Rank 0 (the first generation's; it must outlive the
  // job) keeps the membership: a generation is a list of member ids, and a
  // rank is its member's index there. The first generation holds the
  // `size` processes the launcher started. After a failed collective
  // (failed()), or when rank 0 says joiners wait, every member calls
  // Reform(): its sockets close, it asks rank 0 for the next generation,
  // which forms when every member of the last has asked, or a grace period
  // (min(timeout_s, 5 s)) after the first did, with the members that asked
  // and every process that joined since (joined_late()). The mesh of the new
  // generation is then connected. Unavailable when no generation forms
  // within timeout_s, or this member was left out.
  //
  // A member that dies while a generation's mesh is being connected (the
  // first one included) closes its sockets under the others' connect. A
  // rank whose connect fails so asks for the next generation itself and
  // connects that one, within the same timeout_s: Connect and Reform then
  // succeed without the dead member (lost_at_last_forming counts it).
  absl::Status Reform();
  int64_t generation() const;
  int64_t member() const;
  bool joined_late() const;
  // Members of the previous generation that the last forming left out.
  int lost_at_last_forming() const;
  // Whether a collective failed since the last forming.
  bool failed() const;
  // Rank 0 of the first generation only: whether processes wait to join.
  bool joiners_waiting() const;

  // Sums data[0..n) over every rank, in place (options.algorithm; the
  // algorithm is bound to the buffer at its first call and reused after).
  absl::Status AllreduceSum(float* data, size_t n) override;
  // Sums int64 counters over every rank, in place.
  absl::Status AllreduceSum(int64_t* data, size_t n);
  // Every rank's `value`, in rank order.
  absl::StatusOr<std::vector<uint64_t>> Allgather(uint64_t value);
  // Checks that every rank holds the same `value`; otherwise
  // FailedPrecondition on every rank, naming `what` and the ranks that
  // differ from rank 0.
  absl::Status CheckSame(uint64_t value, const std::string& what);
  // Copies rank `root`'s data[0..n) to every rank.
  absl::Status Broadcast(float* data, size_t n, int root);
  // The same for `bytes` bytes.
  absl::Status BroadcastBytes(void* data, size_t bytes, int root);

  // Bytes this rank's collectives reduced or moved (payload, not wire
  // bytes), and the seconds they took.
  uint64_t payload_bytes() const { return payload_bytes_.load(std::memory_order_relaxed); }
  double seconds() const { return static_cast<double>(nanos_.load(std::memory_order_relaxed)) * 1e-9; }
  uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  class Impl;

 private:
  explicit Collective(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> payload_bytes_{0};
  std::atomic<uint64_t> nanos_{0};
  std::atomic<uint64_t> calls_{0};
};

// FNV-1a over `bytes` bytes, continuing from `seed` (the offset basis by
// default): what ranks compare of their layouts and parameters.
uint64_t Fnv1a(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ull);
// The same over `n` floats.
inline uint64_t Fingerprint(const float* data, size_t n, uint64_t seed = 1469598103934665603ull) {
  return Fnv1a(data, n * sizeof(float), seed);
}

}  // namespace shardwild
