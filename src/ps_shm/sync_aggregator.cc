#include "ps_shm/sync_aggregator.h"

#include <cstring>

#include "absl/strings/str_cat.h"

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
  lr_.assign(num_workers_, 0.0f);
  sparse_lr_.assign(num_workers_, 0.0f);
  active_ = num_workers_;
}

absl::Status SyncAggregator::Contribute(int worker, absl::Span<const DenseGrad> grads, float lr,
                                        absl::Span<const RowGrad> rows, float sparse_lr) {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("sync: no worker ", worker, " (", num_workers_, " workers)"));
  }
  if (grads.size() != var_offset_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sync: worker ", worker, " gave ", grads.size(), " gradients for ", var_offset_.size(), " variables"));
  }
  // Copy into this worker's slot before arriving (see slots_).
  float* slot = slots_[worker].data();
  for (const DenseGrad& g : grads) {
    if (g.var < 0 || g.var >= static_cast<int>(var_offset_.size()) || g.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("sync: worker ", worker, " gave a gradient for no variable ", g.var));
    }
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
  if (reducer_ != nullptr && !rows.empty()) {
    return absl::InvalidArgumentError(
        "sync: embedding rows cannot be summed across processes (train.strategy allreduce trains dense models)");
  }
  if (left_[worker]) {
    return absl::FailedPreconditionError(absl::StrCat("sync: worker ", worker, " contributed after leaving"));
  }
  contributed_[worker] = 1;
  lr_[worker] = lr;
  sparse_lr_[worker] = sparse_lr;
  ++arrived_;
  const uint64_t generation = generation_;
  if (arrived_ == active_) {
    CompleteRound();
  } else {
    round_done_.Wait(&mu_, [this, generation]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != generation; });
  }
  return round_status_;
}

absl::Status SyncAggregator::Leave(int worker) {
  if (worker < 0 || worker >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("sync: no worker ", worker, " (", num_workers_, " workers)"));
  }
  MutexLock lock(&mu_);
  if (left_[worker]) return absl::OkStatus();
  left_[worker] = 1;
  --active_;
  absl::Status status;
  if (arrived_ > 0 && arrived_ == active_) {
    CompleteRound();
    status = round_status_;
  }
  if (active_ == 0) {
    // Everyone is out: the next epoch's group has every worker again.
    active_ = num_workers_;
    left_.assign(num_workers_, 0);
  }
  return status;
}

void SyncAggregator::set_reducer(GradientReducer* reducer) {
  MutexLock lock(&mu_);
  reducer_ = reducer;
  // Room for the contribution count and the learning rates after the sum.
  sum_.assign(slot_size_ + (reducer != nullptr ? 2 : 0), 0.0f);
  sum_grads_.clear();
  for (size_t v = 0; v < var_offset_.size(); ++v) {
    sum_grads_.push_back(DenseGrad{static_cast<int>(v), sum_.data() + var_offset_[v]});
  }
}

absl::Status SyncAggregator::PadRounds(int64_t rounds) {
  MutexLock lock(&mu_);
  if (reducer_ == nullptr) return absl::FailedPreconditionError("sync: PadRounds needs a reducer (allreduce)");
  if (arrived_ != 0) return absl::FailedPreconditionError("sync: PadRounds while a round is under way");
  for (int64_t r = 0; r < rounds; ++r) {
    CompleteRound();
    if (!round_status_.ok()) return round_status_;
  }
  return absl::OkStatus();
}

uint64_t SyncAggregator::completed_rounds() const {
  MutexLock lock(&mu_);
  return generation_ - failed_rounds_;
}

uint64_t SyncAggregator::rounds() const {
  MutexLock lock(&mu_);
  return generation_;
}

void SyncAggregator::CompleteRound() {
  // Sum in worker order: the first contributor's slot, then each later one's.
  // The same order every run gives the same float result.
  int count = 0;
  float lr = 0, sparse_lr = 0;
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
  float n = static_cast<float>(count);
  if (reducer_ != nullptr) {
    // Across processes: the sum of every process's sum, the number of
    // contributions and the sum of their learning rates, in one call.
    if (count == 0 && slot_size_ > 0) std::memset(sum_.data(), 0, slot_size_ * sizeof(float));
    sum_[slot_size_] = n;
    sum_[slot_size_ + 1] = lr * n;
    round_status_ = reducer_->AllreduceSum(sum_.data(), sum_.size());
    if (!round_status_.ok()) {
      contributed_.assign(num_workers_, 0);
      arrived_ = 0;
      ++failed_rounds_;
      ++generation_;
      round_done_.SignalAll();
      return;
    }
    n = sum_[slot_size_];
    lr = n > 0 ? sum_[slot_size_ + 1] / n : 0.0f;
  }
  if (n == 0) {
    round_status_ = absl::OkStatus();  // no process contributed: nothing to apply
  } else {
    for (int64_t i = 0; i < slot_size_; ++i) sum_[i] /= n;
    round_status_ = store_->Push(sum_grads_, lr);
  }
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
  contributed_.assign(num_workers_, 0);
  arrived_ = 0;
  ++generation_;
  round_done_.SignalAll();
}

}  // namespace shardwild
