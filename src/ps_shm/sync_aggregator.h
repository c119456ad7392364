// SyncAggregator: the step barrier behind `ps.update: sync`.
//
// Every worker's gradient for a step is averaged, then applied once. Each
// worker copies its gradient into its own slot of a buffer allocated once
// (Contribute), then waits until every worker still in the group has
// contributed or left. The thread that completes the round sums the
// contributions in worker-index order (so the float result is the same on
// every run), divides by their number and pushes the mean once; then all
// contributors return and go on to pull. With a fixed seed and worker count a
// run is bit-for-bit reproducible.
//
// Each contribution is already the mean over that worker's batch, so the
// mean over the contributors is the mean over the step's batches (the padded
// last batch of a part counts as one batch, as in hogwild).
//
// Embedding rows (RowGrad) take part in the same round: each worker's row
// gradients are copied into its own buffers; the completing thread divides
// every contributed row gradient by the number of contributors and pushes
// each table's rows of all contributors as one PushRows batch, in worker
// order (PushRows sums repeated ids in batch order, then updates each unique
// row once). A row no worker named is not touched (lazy, as in hogwild).
// The order is fixed, so the result is bit-for-bit reproducible too.
//
// Arrive-and-drop: a worker whose epoch part is shorter runs fewer steps; when
// it is done it calls Leave(), and later rounds wait only for the workers
// still in. When every worker has left, the group re-forms with all of them
// for the next epoch. So each call of Worker::Train in sync mode must run on
// all workers together (one WorkerPool::RunAll), every worker leaving at the
// end of its call, even on error.
//
// The barrier is built on core/base/mutex.h (pthreads underneath), so
// ThreadSanitizer sees every happens-before edge it creates: a worker's slot
// is written before the worker arrives under mu_, read by the completing
// thread under mu_, and the push happens before every contributor's wake-up
// under mu_, hence before its next pull.
//
// Overlap (train.strategy allreduce with cluster.allreduce_overlap): the
// dense gradient crosses processes a bucket (a layer's variables) at a time,
// in the order the backward pass finishes them (Model::BackwardGroups). A
// worker hands each bucket over as soon as its backward has finished it
// (ContributeBucket); once every worker still in the group has handed bucket
// b over, the aggregator's own thread sums it in worker order, allreduces it
// across processes and divides it by the number of contributions, while the
// workers go on with the layers below. Contribute then only waits for the
// last bucket and applies the round as one push (so a round whose
// collective failed applies nothing, as without overlap). The first bucket
// carries the number of contributions and their learning rates. Every
// process issues the same collectives in the same order: the buckets of
// every round, padded ones included. For the same inputs the pushed values
// equal the single-collective ones wherever the reducer adds each element's
// contributions in the same order (every reducer with two processes).
//
// Thread safety: Contribute, ContributeBucket and Leave may be called
// concurrently, each worker index by one thread at a time. rounds() may be
// read by any thread. set_reducer and PadRounds need every worker out of the
// round (between RunAll calls).
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/base/mutex.h"
#include "ps_shm/param_store.h"

namespace shardwild {

// Sums a buffer over the processes of a job (train.strategy allreduce:
// net/allreduce.h, over Gloo). Every process calls it the same number of
// times with the same sizes; each call returns the same sum on every one.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual absl::Status AllreduceSum(float* data, size_t n) = 0;
};

class SyncAggregator {
 public:
  // Sizes the buffers from store->layout(): one slot of every variable's
  // floats per worker, plus one for the sum. `store` is not owned and must
  // outlive the aggregator. num_workers >= 1.
  SyncAggregator(ParamStore* store, int num_workers);
  ~SyncAggregator();
  SyncAggregator(const SyncAggregator&) = delete;
  SyncAggregator& operator=(const SyncAggregator&) = delete;

  int num_workers() const { return num_workers_; }

  // Worker `worker` contributes its gradient for this step: `grads` holds
  // exactly one DenseGrad per variable of the store (any order), each over
  // the whole variable, and `rows` any number of row gradients of the
  // store's embedding tables (a table may appear more than once; its lists
  // are concatenated). Blocks until every worker still in the group has
  // contributed or left; then the mean of the contributions is pushed once:
  // dense with the `lr` and tables with the `sparse_lr` the lowest-index
  // contributor passed. With buckets (set_reducer), the variables of the
  // buckets this worker has already handed over this round are not read
  // again (their gradients in `grads` are ignored, and `lr` if bucket 0 was
  // among them); the rest are handed over here. Returns the round's status (the first error of its
  // pushes; the same for every contributor of the round).
  // InvalidArgument (without arriving) for a bad worker index, gradient list
  // or table; FailedPrecondition if the worker has already left this group.
  // The caller must still call Leave() after an error. Allocates only while
  // the row buffers grow to the largest step seen.
  absl::Status Contribute(int worker, absl::Span<const DenseGrad> grads, float lr,
                          absl::Span<const RowGrad> rows = {}, float sparse_lr = 0.0f);

  // Worker `worker` is done with this group (its part of the epoch is over,
  // or it failed): rounds no longer wait for it. If it was the last one the
  // current round waited for, this call completes the round (sums and
  // pushes) and returns the push's status. Leaving twice is a no-op.
  absl::Status Leave(int worker);

  // Rounds completed so far (pushes made), over the aggregator's life.
  uint64_t rounds() const;
  // Of those, the rounds whose reduction across processes succeeded (all of
  // them without a reducer): a failed one applied nothing.
  uint64_t completed_rounds() const;

  // Across processes (train.strategy allreduce): every round's sum of this
  // process's contributions is summed with every other process's through
  // `reducer` (not owned; set before any round), with the number of
  // contributions and their learning rates, and the mean over all of them
  // is pushed, so every process applies the same update. A process with
  // nothing to contribute to a round still takes part: PadRounds.
  // Embedding rows across processes: every process pushes its own
  // contributors' rows, divided by the number of contributions of all
  // processes, with the mean of all their sparse learning rates, to its
  // store; the tables must be shared by the processes (ps tasks: a Job's
  // JobOptions::tables), since each process pushes only its own rows. After
  // the pushes the processes meet once more (a 1-float allreduce), so that
  // no process's next round pulls rows before every process's push of this
  // one has landed, and a push that failed anywhere fails the round
  // everywhere. (Rows of the same id pushed by several processes are
  // applied once per process: for SGD the same as one push of their mean.)
  // `buckets` (may be empty: one collective per round, after the last
  // contribution) turns on overlap: the dense variables grouped in the order
  // the workers' backward passes finish them, each variable in exactly one
  // bucket (InvalidArgument otherwise); every process of the job must give
  // the same buckets. The aggregator then runs a thread of its own for the
  // collectives, until the next set_reducer or its destruction. nullptr
  // turns the reducer (and the buckets) off.
  absl::Status set_reducer(GradientReducer* reducer, std::vector<std::vector<int>> buckets = {});
  // The number of buckets set (0 = no overlap).
  int buckets() const { return static_cast<int>(buckets_.size()); }
  // Buckets handed over by ContributeBucket (during the workers' backward
  // passes, not at Contribute), over the aggregator's life.
  uint64_t buckets_handed_over() const;
  // Worker `worker` hands over its gradients of bucket `bucket` for this
  // round: `grads` holds exactly the bucket's variables, in the bucket's
  // order. A worker hands its buckets over in order (0, 1, ...), then calls
  // Contribute for the round. Returns at once (the reduction's status comes
  // with Contribute). InvalidArgument for a bucket out of order or a wrong
  // gradient list; FailedPrecondition without buckets or after Leave.
  absl::Status ContributeBucket(int worker, int bucket, absl::Span<const DenseGrad> grads, float lr,
                                float sparse_lr = 0.0f);
  // Takes part in `rounds` rounds with no contribution of this process (its
  // workers' parts of the epoch ran out before the other processes'): each
  // sums zeros with the others and pushes the mean when any process
  // contributed. Call with every worker out of the group (between RunAll
  // calls). The first error.
  absl::Status PadRounds(int64_t rounds);

 private:
  // Sums the contributions of this round in worker order, pushes the mean,
  // and starts the next round, waking the contributors.
  void CompleteRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round failed: nothing is applied; its contributors get the error.
  void FailRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes each table's rows of the round's contributors (divided by the
  // n contributions), then ends the round, waking the contributors.
  void PushRowsAndEndRound(float n, float sparse_lr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether any worker has handed over anything this round.
  bool RoundUnderWay() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Overlap: advances ready_buckets_ to the buckets every worker still in
  // the group has handed over (when a round is under way), waking the
  // collective thread.
  void MarkReadyBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The collective thread: reduces the ready buckets in order.
  void CollectiveLoop();
  // Sums bucket b over contributors_ (worker order), allreduces it with the
  // other processes' and writes it, divided by the number of contributions,
  // to bucket_out_. Bucket 0 also carries the contributions' count and
  // learning rates (lr: the first contributor's).
  absl::Status ReduceBucket(int b, GradientReducer* reducer, float lr, float sparse_lr);
  // Floats a round's reduction carries after the gradient: the number of
  // contributions and their learning rates (dense, and sparse with tables).
  int Extras() const { return table_dim_.empty() ? 2 : 3; }
  // Stops and joins the collective thread, if any.
  void StopCollectiveThread();

  // Constant after construction.
  ParamStore* const store_;
  const int num_workers_;
  std::vector<int64_t> var_offset_;   // offset of each variable in a slot
  std::vector<int64_t> var_size_;
  int64_t slot_size_ = 0;
  std::vector<DenseGrad> sum_grads_;  // one per variable, into sum_

  // slots_[w]: written only by worker w, in Contribute before it arrives
  // under mu_; read only by the thread completing that round, under mu_,
  // before the round ends. The mutex orders the two, so no lock is held
  // while copying.
  std::vector<std::vector<float>> slots_;
  // The same for rows: row_ids_[w][t] and row_grads_[w][t] hold worker w's
  // ids and gradients of table t for the current round.
  std::vector<int64_t> table_dim_;
  std::vector<std::vector<std::vector<uint64_t>>> row_ids_;
  std::vector<std::vector<std::vector<float>>> row_grads_;

  // Overlap, set by set_reducer while no round is under way and no
  // collective thread runs, constant while one does: buckets_[b] the
  // variables of bucket b, bucket_of_var_[v] v's bucket.
  std::vector<std::vector<int>> buckets_;
  std::vector<int> bucket_of_var_;
  // worker_parts_[w]: the buckets worker w has handed over this round;
  // read and written only by worker w's thread (a mirror of parts_[w]).
  std::vector<int> worker_parts_;
  // Owned by the collective thread while a round's buckets are reduced,
  // read by the thread completing the round once reduced_buckets_ says the
  // last is done (under mu_, which orders the two): bucket_buf_[b] bucket b's
  // sum (+ the count and learning rates for b = 0), bucket_out_ every
  // variable's mean (as a slot), bucket_grads_ over it, global_n_ and
  // global_lr_ the round's contributions and mean learning rate over all
  // processes, contributors_ the bucket's contributors (scratch).
  std::vector<std::vector<float>> bucket_buf_;
  std::vector<float> bucket_out_;
  std::vector<DenseGrad> bucket_grads_;
  float global_n_ = 0;
  float global_lr_ = 0;
  float global_sparse_lr_ = 0;
  std::vector<int> contributors_;
  std::thread collective_thread_;  // touched only by set_reducer and the destructor

  mutable Mutex mu_;
  CondVar round_done_;  // signalled when generation_ advances
  CondVar bucket_ready_;  // ready_buckets_ advanced, or stop_collectives_
  CondVar bucket_done_;   // reduced_buckets_ reached the number of buckets
  std::vector<int> parts_ ABSL_GUARDED_BY(mu_);  // buckets each worker handed over this round
  int ready_buckets_ ABSL_GUARDED_BY(mu_) = 0;   // handed over by every worker still in
  int reduced_buckets_ ABSL_GUARDED_BY(mu_) = 0;  // of those, reduced (or skipped after a failure)
  absl::Status bucket_status_ ABSL_GUARDED_BY(mu_);  // the round's first failed collective
  bool stop_collectives_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t handed_over_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<char> contributed_ ABSL_GUARDED_BY(mu_);  // in the current round
  std::vector<char> left_ ABSL_GUARDED_BY(mu_);         // left the current group
  std::vector<float> lr_ ABSL_GUARDED_BY(mu_);          // of each contribution
  std::vector<float> sparse_lr_ ABSL_GUARDED_BY(mu_);   // of each contribution
  // One table's rows of all contributors, and PushRows' scratch.
  std::vector<uint64_t> merged_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<float> merged_grads_ ABSL_GUARDED_BY(mu_);
  RowScratch row_scratch_ ABSL_GUARDED_BY(mu_);
  GradientReducer* reducer_ ABSL_GUARDED_BY(mu_) = nullptr;
  int active_ ABSL_GUARDED_BY(mu_) = 0;                 // workers in the group
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;                // contributions this round
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;        // rounds completed
  uint64_t failed_rounds_ ABSL_GUARDED_BY(mu_) = 0;     // of those, whose reduction failed
  absl::Status round_status_ ABSL_GUARDED_BY(mu_);      // of the last round's push
};

}  // namespace shardwild
