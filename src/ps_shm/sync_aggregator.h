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
// Thread safety: Contribute and Leave may be called concurrently, each worker
// index by one thread at a time. rounds() may be read by any thread.
#pragma once

#include <cstdint>
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
  // contributor passed. Returns the round's status (the first error of its
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
  // nothing to contribute to a round still takes part: PadRounds. Embedding
  // rows cannot take part (InvalidArgument from Contribute).
  void set_reducer(GradientReducer* reducer);
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

  mutable Mutex mu_;
  CondVar round_done_;  // signalled when generation_ advances
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
