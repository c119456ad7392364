#include "ps_shm/sync_aggregator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/base/status.h"

namespace shardwild {

SyncAggregator::SyncAggregator(ParamStore* store, int num_workers) : store_(store), num_workers_(num_workers) {
  const StoreLayout& layout = store_->layout();
  for (size_t v = 0; v < layout.variables.size(); ++v) {
    var_offset_.push_back(slot_size_);
    var_size_.push_back(layout.variables[v].size());
    slot_size_ += layout.variables[v].size();
  }
  slots_.assign(num_workers_, std::vector<float>(slot_size_));
  for (const TableSpec& t : layout.tables) table_dim_.push_back(t.dim);
  row_ids_.assign(num_workers_, std::vector<std::vector<uint64_t>>(table_dim_.size()));
  row_grads_.assign(num_workers_, std::vector<std::vector<float>>(table_dim_.size()));
  MutexLock lock(&mu_);
  sum_.assign(slot_size_, 0.0f);
  for (size_t v = 0; v < var_offset_.size(); ++v) {
    sum_grads_.push_back(DenseGrad{static_cast<int>(v), sum_.data() + var_offset_[v]});
  }
  contributed_.assign(num_workers_, 0);
  left_.assign(num_workers_, 0);
  parts_.assign(num_workers_, 0);
  lr_.assign(num_workers_, 0.0f);
  sparse_lr_.assign(num_workers_, 0.0f);
  active_ = num_workers_;
}

SyncAggregator::~SyncAggregator() { StopCollectiveThread(); }

absl::Status SyncAggregator::Contribute(int worker, absl::Span<const DenseGrad> grads, float lr,
                                        absl::Span<const RowGrad> rows, float sparse_lr) {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("sync: no worker ", worker, " (", num_workers_, " workers)"));
  }
  if (grads.size() != var_offset_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sync: worker ", worker, " gave ", grads.size(), " gradients for ", var_offset_.size(), " variables"));
  }
  // Copy into this worker's slot before arriving (see slots_): what it has
  // not handed over by bucket.
  const int handed = buckets_.empty() ? 0 : worker_parts_[worker];
  float* slot = slots_[worker].data();
  for (const DenseGrad& g : grads) {
    if (g.var < 0 || g.var >= static_cast<int>(var_offset_.size()) || g.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sync: worker ", worker, " gave a gradient for no variable ", g.var));
    }
    if (handed > 0 && bucket_of_var_[g.var] < handed) continue;
    std::memcpy(slot + var_offset_[g.var], g.grad, var_size_[g.var] * sizeof(float));
  }
  for (const RowGrad& r : rows) {
    if (r.table < 0 || r.table >= static_cast<int>(table_dim_.size()) || (r.grads == nullptr && !r.ids.empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sync: worker ", worker, " gave row gradients for no embedding table ", r.table));
    }
  }
  for (size_t t = 0; t < table_dim_.size(); ++t) {
    row_ids_[worker][t].clear();
    row_grads_[worker][t].clear();
  }
  for (const RowGrad& r : rows) {
    std::vector<uint64_t>& ids = row_ids_[worker][r.table];
    std::vector<float>& g = row_grads_[worker][r.table];
    ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    g.insert(g.end(), r.grads, r.grads + r.ids.size() * table_dim_[r.table]);
  }
  MutexLock lock(&mu_);
  if (left_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("sync: worker ", worker, " contributed after leaving"));
  }
  contributed_[worker] = 1;
  if (handed == 0) {
    lr_[worker] = lr;
    sparse_lr_[worker] = sparse_lr;
  }
  if (!buckets_.empty()) {
    parts_[worker] = static_cast<int>(buckets_.size());
    MarkReadyBuckets();
  }
  ++arrived_;
  const uint64_t generation = generation_;
  if (arrived_ == active_) {
    CompleteRound();
  } else {
    round_done_.Wait(&mu_, [this, generation]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != generation; });
  }
  if (!buckets_.empty()) worker_parts_[worker] = 0;
  return round_status_;
}

absl::Status SyncAggregator::ContributeBucket(int worker, int bucket, absl::Span<const DenseGrad> grads, float lr,
                                              float sparse_lr) {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("sync: no worker ", worker, " (", num_workers_, " workers)"));
  }
  if (buckets_.empty()) {
    return absl::FailedPreconditionError("sync: no buckets to hand over (the gradient goes whole with Contribute)");
  }
  if (bucket != worker_parts_[worker]) {
    return absl::InvalidArgumentError(absl::StrCat("sync: worker ", worker, " handed over bucket ", bucket,
                                                   ", expected bucket ", worker_parts_[worker]));
  }
  const std::vector<int>& vars = buckets_[bucket];
  if (grads.size() != vars.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sync: worker ", worker, " gave ", grads.size(),
                                                   " gradients for bucket ", bucket, "'s ", vars.size(), " variables"));
  }
  float* slot = slots_[worker].data();
  for (size_t i = 0; i < vars.size(); ++i) {
    if (grads[i].var != vars[i] || grads[i].grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sync: worker ", worker, " gave a gradient of variable ",
                                                     grads[i].var, " where bucket ", bucket, " has variable ", vars[i]));
    }
  }
  for (const DenseGrad& g : grads) std::memcpy(slot + var_offset_[g.var], g.grad, var_size_[g.var] * sizeof(float));
  MutexLock lock(&mu_);
  if (left_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("sync: worker ", worker, " handed a bucket over after leaving"));
  }
  if (bucket == 0) {
    lr_[worker] = lr;
    sparse_lr_[worker] = sparse_lr;
  }
  parts_[worker] = bucket + 1;
  worker_parts_[worker] = bucket + 1;
  ++handed_over_;
  MarkReadyBuckets();
  return absl::OkStatus();
}

bool SyncAggregator::RoundUnderWay() const {
  if (arrived_ > 0) return true;
  for (int p : parts_) {
    if (p > 0) return true;
  }
  return false;
}

void SyncAggregator::MarkReadyBuckets() {
  if (buckets_.empty() || !RoundUnderWay()) return;
  int ready = static_cast<int>(buckets_.size());
  for (int w = 0; w < num_workers_; ++w) {
    if (!left_[w]) ready = std::min(ready, parts_[w]);
  }
  if (ready > ready_buckets_) {
    ready_buckets_ = ready;
    bucket_ready_.SignalAll();
  }
}

absl::Status SyncAggregator::Leave(int worker) {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("sync: no worker ", worker, " (", num_workers_, " workers)"));
  }
  if (!buckets_.empty()) worker_parts_[worker] = 0;
  MutexLock lock(&mu_);
  if (left_[worker]) return absl::OkStatus();
  left_[worker] = 1;
  --active_;
  absl::Status status;
  // The round the others (or, after a failure mid-backward, nobody) still
  // wait for; with buckets, the ones this worker held back are now ready.
  if (arrived_ == active_ && RoundUnderWay()) {
    CompleteRound();
    status = round_status_;
  } else {
    MarkReadyBuckets();
  }
  if (active_ == 0) {
    // Everyone is out: the next epoch's group has every worker again.
    active_ = num_workers_;
    left_.assign(num_workers_, 0);
  }
  return status;
}

absl::Status SyncAggregator::set_reducer(GradientReducer* reducer, std::vector<std::vector<int>> buckets) {
  if (reducer == nullptr) buckets.clear();
  if (!buckets.empty()) {
    std::vector<int> seen(var_offset_.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (buckets[b].empty()) return absl::InvalidArgumentError(absl::StrCat("sync: bucket ", b, " is empty"));
      for (int v : buckets[b]) {
        if (v < 0 || v >= static_cast<int>(seen.size()) || seen[v]++ > 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("sync: bucket ", b, " names variable ", v, ", which is no variable or in another bucket"));
        }
      }
    }
    for (size_t v = 0; v < seen.size(); ++v) {
      if (!seen[v]) return absl::InvalidArgumentError(absl::StrCat("sync: variable ", v, " is in no bucket"));
    }
  }
  StopCollectiveThread();
  buckets_ = std::move(buckets);
  bucket_of_var_.assign(var_offset_.size(), 0);
  bucket_buf_.clear();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t floats = b == 0 ? Extras() : 0;  // bucket 0: the count and the learning rates too
    for (int v : buckets_[b]) {
      bucket_of_var_[v] = static_cast<int>(b);
      floats += var_size_[v];
    }
    bucket_buf_.emplace_back(floats, 0.0f);
  }
  bucket_out_.assign(buckets_.empty() ? 0 : slot_size_, 0.0f);
  bucket_grads_.clear();
  if (!buckets_.empty()) {
    for (size_t v = 0; v < var_offset_.size(); ++v) {
      bucket_grads_.push_back(DenseGrad{static_cast<int>(v), bucket_out_.data() + var_offset_[v]});
    }
  }
  worker_parts_.assign(num_workers_, 0);
  contributors_.clear();
  contributors_.reserve(num_workers_);
  {
    MutexLock lock(&mu_);
    reducer_ = reducer;
    // Room for the contribution count and the learning rates after the sum.
    sum_.assign(slot_size_ + (reducer != nullptr ? Extras() : 0), 0.0f);
    sum_grads_.clear();
    for (size_t v = 0; v < var_offset_.size(); ++v) {
      sum_grads_.push_back(DenseGrad{static_cast<int>(v), sum_.data() + var_offset_[v]});
    }
    parts_.assign(num_workers_, 0);
    ready_buckets_ = 0;
    reduced_buckets_ = 0;
    bucket_status_ = absl::OkStatus();
  }
  if (!buckets_.empty()) collective_thread_ = std::thread([this] { CollectiveLoop(); });
  return absl::OkStatus();
}

void SyncAggregator::StopCollectiveThread() {
  if (!collective_thread_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stop_collectives_ = true;
    bucket_ready_.SignalAll();
  }
  collective_thread_.join();
  MutexLock lock(&mu_);
  stop_collectives_ = false;
}

void SyncAggregator::CollectiveLoop() {
  mu_.Lock();
  for (;;) {
    bucket_ready_.Wait(&mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return stop_collectives_ || reduced_buckets_ < ready_buckets_;
    });
    if (reduced_buckets_ >= ready_buckets_) break;  // stopping, and nothing is left to reduce
    const int b = reduced_buckets_;
    contributors_.clear();
    for (int w = 0; w < num_workers_; ++w) {
      if (parts_[w] > b) contributors_.push_back(w);
    }
    const float lr = contributors_.empty() ? 0.0f : lr_[contributors_[0]];
    const float sparse_lr = contributors_.empty() ? 0.0f : sparse_lr_[contributors_[0]];
    const bool skip = !bucket_status_.ok();  // the group broke earlier this round
    GradientReducer* const reducer = reducer_;
    mu_.Unlock();
    absl::Status s = skip ? absl::OkStatus() : ReduceBucket(b, reducer, lr, sparse_lr);
    mu_.Lock();
    if (!s.ok() && bucket_status_.ok()) bucket_status_ = std::move(s);
    if (++reduced_buckets_ == static_cast<int>(buckets_.size())) bucket_done_.SignalAll();
  }
  mu_.Unlock();
}

absl::Status SyncAggregator::ReduceBucket(int b, GradientReducer* reducer, float lr, float sparse_lr) {
  std::vector<float>& buf = bucket_buf_[b];
  int64_t at = 0;
  for (int v : buckets_[b]) {
    float* sum = buf.data() + at;
    const int64_t n = var_size_[v];
    if (contributors_.empty()) {
      std::memset(sum, 0, n * sizeof(float));
    } else {
      // Worker order, as CompleteRound sums a whole slot.
      std::memcpy(sum, slots_[contributors_[0]].data() + var_offset_[v], n * sizeof(float));
      for (size_t k = 1; k < contributors_.size(); ++k) {
        const float* g = slots_[contributors_[k]].data() + var_offset_[v];
        for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
      }
    }
    at += n;
  }
  if (b == 0) {
    const float n = static_cast<float>(contributors_.size());
    buf[at] = n;
    buf[at + 1] = lr * n;
    if (!table_dim_.empty()) buf[at + 2] = sparse_lr * n;
  }
  SW_RETURN_IF_ERROR(reducer->AllreduceSum(buf.data(), buf.size()));
  if (b == 0) {
    global_n_ = buf[at];
    global_lr_ = global_n_ > 0 ? buf[at + 1] / global_n_ : 0.0f;
    global_sparse_lr_ = global_n_ > 0 && !table_dim_.empty() ? buf[at + 2] / global_n_ : 0.0f;
  }
  at = 0;
  for (int v : buckets_[b]) {
    const float* sum = buf.data() + at;
    float* out = bucket_out_.data() + var_offset_[v];
    const int64_t n = var_size_[v];
    if (global_n_ > 0) {
      for (int64_t i = 0; i < n; ++i) out[i] = sum[i] / global_n_;
    }
    at += n;
  }
  return absl::OkStatus();
}

absl::Status SyncAggregator::PadRounds(int64_t rounds) {
  MutexLock lock(&mu_);
  if (reducer_ == nullptr) return absl::FailedPreconditionError("sync: PadRounds needs a reducer (allreduce)");
  if (RoundUnderWay()) return absl::FailedPreconditionError("sync: PadRounds while a round is under way");
  for (int64_t r = 0; r < rounds; ++r) {
    CompleteRound();  // with buckets, every bucket of zeros goes across
    if (!round_status_.ok()) return round_status_;
  }
  return absl::OkStatus();
}

uint64_t SyncAggregator::completed_rounds() const {
  MutexLock lock(&mu_);
  return generation_ - failed_rounds_;
}

uint64_t SyncAggregator::buckets_handed_over() const {
  MutexLock lock(&mu_);
  return handed_over_;
}

uint64_t SyncAggregator::rounds() const {
  MutexLock lock(&mu_);
  return generation_;
}

void SyncAggregator::FailRound() {
  contributed_.assign(num_workers_, 0);
  arrived_ = 0;
  ++failed_rounds_;
  ++generation_;
  round_done_.SignalAll();
}

void SyncAggregator::CompleteRound() {
  int count = 0;
  float lr = 0, sparse_lr = 0;
  float n = 0;
  if (!buckets_.empty()) {
    // Overlap: whatever is not yet ready goes now (PadRounds, or workers that
    // left mid-round), and the round waits for the collective thread.
    ready_buckets_ = static_cast<int>(buckets_.size());
    bucket_ready_.SignalAll();
    bucket_done_.Wait(&mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return reduced_buckets_ == static_cast<int>(buckets_.size());
    });
    round_status_ = bucket_status_;
    bucket_status_ = absl::OkStatus();
    ready_buckets_ = 0;
    reduced_buckets_ = 0;
    parts_.assign(num_workers_, 0);
    if (!round_status_.ok()) return FailRound();
    n = global_n_;
    round_status_ = n > 0 ? store_->Push(bucket_grads_, global_lr_) : absl::OkStatus();
    PushRowsAndEndRound(n, global_sparse_lr_);
    return;
  }
  // Sum in worker order: the first contributor's slot, then each later one's.
  // The same order every run gives the same float result.
  for (int w = 0; w < num_workers_; ++w) {
    if (!contributed_[w]) continue;
    const float* slot = slots_[w].data();
    if (count == 0) {
      // (A store of embedding tables only has no dense floats: no copy, and
      // memcpy must not see the null data() of empty vectors.)
      if (slot_size_ > 0) std::memcpy(sum_.data(), slot, slot_size_ * sizeof(float));
      lr = lr_[w];
      sparse_lr = sparse_lr_[w];
    } else {
      for (int64_t i = 0; i < slot_size_; ++i) sum_[i] += slot[i];
    }
    ++count;
  }
  n = static_cast<float>(count);
  if (reducer_ != nullptr) {
    // Across processes: the sum of every process's sum, the number of
    // contributions and the sum of their learning rates, in one call.
    if (count == 0 && slot_size_ > 0) std::memset(sum_.data(), 0, slot_size_ * sizeof(float));
    sum_[slot_size_] = n;
    sum_[slot_size_ + 1] = lr * n;
    if (!table_dim_.empty()) sum_[slot_size_ + 2] = sparse_lr * n;
    round_status_ = reducer_->AllreduceSum(sum_.data(), sum_.size());
    if (!round_status_.ok()) return FailRound();
    n = sum_[slot_size_];
    lr = n > 0 ? sum_[slot_size_ + 1] / n : 0.0f;
    if (!table_dim_.empty()) sparse_lr = n > 0 ? sum_[slot_size_ + 2] / n : 0.0f;
  }
  if (n == 0) {
    round_status_ = absl::OkStatus();  // no process contributed: nothing to apply
  } else {
    for (int64_t i = 0; i < slot_size_; ++i) sum_[i] /= n;
    round_status_ = store_->Push(sum_grads_, lr);
  }
  PushRowsAndEndRound(n, sparse_lr);
}

void SyncAggregator::PushRowsAndEndRound(float n, float sparse_lr) {
  // Each table's rows: every contributor's, in worker order, divided by the
  // number of contributors, pushed as one batch.
  for (size_t t = 0; t < table_dim_.size(); ++t) {
    merged_ids_.clear();
    merged_grads_.clear();
    for (int w = 0; w < num_workers_; ++w) {
      if (!contributed_[w]) continue;
      merged_ids_.insert(merged_ids_.end(), row_ids_[w][t].begin(), row_ids_[w][t].end());
      for (float g : row_grads_[w][t]) merged_grads_.push_back(g / n);
    }
    if (merged_ids_.empty()) continue;
    absl::Status s = store_->PushRows(static_cast<int>(t), merged_ids_, merged_grads_.data(), sparse_lr, &row_scratch_);
    if (round_status_.ok()) round_status_ = std::move(s);
  }
  if (reducer_ != nullptr && !table_dim_.empty()) {
    // Every process's rows are in the shared tables before any process
    // starts its next round (whose pulls must see them), and a push that
    // failed anywhere fails the round everywhere.
    float failed = round_status_.ok() ? 0.0f : 1.0f;
    if (absl::Status s = reducer_->AllreduceSum(&failed, 1); !s.ok()) {
      round_status_ = std::move(s);
      return FailRound();
    }
    if (failed > 0 && round_status_.ok()) {
      round_status_ = absl::AbortedError(
          "sync: another process's push of embedding rows failed this round (its error is in its log)");
    }
  }
  contributed_.assign(num_workers_, 0);
  arrived_ = 0;
  ++generation_;
  round_done_.SignalAll();
}

}  // namespace shardwild
