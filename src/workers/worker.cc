#include "workers/worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/base/cpu_features.h"
#include "core/base/prefetch.h"
#include "core/base/status.h"
#include "core/base/step_clock.h"
#include "core/model/optimizer.h"
#include "workers/replicated_store.h"
#include "ps_shm/sync_aggregator.h"

namespace shardwild {

MetricValues ExtraTestMetrics(const EvalResult& result) {
  MetricValues out;
  if (!result.metrics || result.metrics->count() == 0) return out;
  for (const auto& [name, value] : result.metrics->Values()) {
    if (name == "loss" || name == "accuracy") continue;  // reported as test_loss and test_accuracy
    out.emplace_back("test_" + name, value);
  }
  return out;
}

int64_t DensePushBytes(const Model& model, OptimizerType type) {
  int64_t params = 0;
  for (int v = 0; v < model.num_variables(); ++v) params += model.variable(v).size();
  return params * static_cast<int64_t>(sizeof(float)) * (4 + 2 * NumSlots(type));
}

bool AskNextBatchAfterPush(int64_t dense_push_bytes, size_t l2_bytes) {
  return dense_push_bytes > 0 && static_cast<uint64_t>(dense_push_bytes) > l2_bytes;
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(int index, const ModelOptions& model, int64_t batch,
                                                       const Dataset& train, ParamStore* store,
                                                       const dnnl::engine& engine, uint64_t seed) {
  std::unique_ptr<Worker> w(new Worker());
  w->index_ = index;
  w->train_ = &train;
  w->store_ = store;
  SW_ASSIGN_OR_RETURN(w->model_, Model::Create(model, DataShape::Of(train), batch, engine,
                                               seed * 1000003u + static_cast<uint64_t>(index)));
  const StoreLayout& layout = store->layout();
  if (static_cast<int>(layout.variables.size()) != w->model_->num_variables()) {
    return absl::FailedPreconditionError(absl::StrCat("the store holds ", layout.variables.size(),
                                                      " variables, the model has ", w->model_->num_variables()));
  }
  for (int v = 0; v < w->model_->num_variables(); ++v) {
    const VariableSpec& a = layout.variables[v];
    const VariableSpec& b = w->model_->variable(v);
    if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) {
      return absl::FailedPreconditionError(absl::StrCat("store variable ", v, " is '", a.name, "' [", a.rows, ",",
                                                        a.cols, "], the model expects '", b.name, "' [", b.rows, ",",
                                                        b.cols, "]"));
    }
    // A bf16 model's weights are rounded as the pull copies them.
    uint16_t* bf16 = w->model_->params_bf16(v);
    w->pulls_.push_back(PullSlice{v, 0, b.rows, bf16 != nullptr ? nullptr : w->model_->params(v), bf16});
    w->pushes_.push_back(DenseGrad{v, w->model_->grads(v)});
  }
  // Each layer's gradient, once final, to the sync barrier's buckets when
  // the step uses them (TrainSteps sets bucket_sync_).
  Worker* const self = w.get();
  w->model_->set_gradients_ready([self](int first_var, int count) {
    if (self->bucket_sync_ == nullptr || !self->bucket_status_.ok()) return;
    self->bucket_status_ = self->bucket_sync_->ContributeBucket(
        self->index_, self->next_bucket_++, {self->pushes_.data() + first_var, static_cast<size_t>(count)},
        self->step_lr_, self->step_sparse_lr_);
  });
  w->model_->set_rows_ready([self] { self->RowsReady(); });
  const std::vector<EmbeddingDecl>& tables = w->model_->spec().tables;
  if (layout.tables.size() != tables.size()) {
    return absl::FailedPreconditionError(absl::StrCat("the store holds ", layout.tables.size(),
                                                      " embedding tables, the model has ", tables.size()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    if (layout.tables[t].name != tables[t].name || layout.tables[t].dim != tables[t].dim) {
      return absl::FailedPreconditionError(absl::StrCat("store table ", t, " is '", layout.tables[t].name, "' (dim ",
                                                        layout.tables[t].dim, "), the model expects '", tables[t].name,
                                                        "' (dim ", tables[t].dim, ")"));
    }
  }
  w->row_pulls_.reserve(w->model_->num_lookups());
  w->row_pushes_.reserve(w->model_->num_lookups());
  // Rows in place only where the model reads them as the store keeps them
  // (bf16 or f32); otherwise the pull and push convert.
  w->in_place_possible_.assign(w->model_->num_lookups(), 1);
  for (int l = 0; l < w->model_->num_lookups(); ++l) {
    const int t = w->model_->lookup(l).table;
    if (layout.tables[t].bf16 != tables[t].bf16) w->in_place_possible_[l] = 0;
  }
  w->batch_records_.assign(batch, 0);
  w->next_records_.assign(batch, 0);
  try {
    w->stream_ = dnnl::stream(engine);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN stream: ", e.what()));
  }
  return w;
}

absl::Status Worker::PullRows(PullMode mode) {
  const int lookups = model_->num_lookups();
  if (lookups == 0) return absl::OkStatus();
  row_pulls_.clear();
  for (int l = 0; l < lookups; ++l) {
    model_->UseRowAddresses(l, RowsInPlace::kNo);
    row_pulls_.push_back(RowPull{model_->lookup(l).table, model_->ids(l), model_->rows(l)});
  }
  return store_->PullRowsBatch(row_pulls_, mode, &row_scratch_);
}

absl::Status Worker::PrepareRows(bool in_place_allowed) {
  const int lookups = model_->num_lookups();
  if (lookups == 0) return absl::OkStatus();
  row_pulls_.clear();
  for (int l = 0; l < lookups; ++l) {
    const Lookup& lk = model_->lookup(l);
    RowsInPlace mode = RowsInPlace::kNo;
    if (in_place_allowed && !lk.wide && in_place_possible_[l]) {
      SW_ASSIGN_OR_RETURN(mode, store_->RowAddresses(lk.table, model_->ids(l), model_->row_addresses(l)));
      if (mode == RowsInPlace::kNo) in_place_possible_[l] = 0;
    }
    model_->UseRowAddresses(l, mode);
    // Hot rows are copies updated by the fused SGD and merged as deltas; rows
    // read in place and pushed are not redirected.
    if (mode == RowsInPlace::kReadAndSgd && !hot_.empty()) {
      hot_.Redirect(lk.table, model_->ids(l), model_->row_addresses(l));
    }
    if (mode != RowsInPlace::kNo) {
      model_->PrefetchRowsInPlace(l);  // their lines asked for now, before the forward
    } else {
      row_pulls_.push_back(RowPull{lk.table, model_->ids(l), model_->rows(l)});
    }
  }
  if (row_pulls_.empty()) return absl::OkStatus();
  return store_->PullRowsBatch(row_pulls_, PullMode::kInsert, &row_scratch_);
}

absl::Status Worker::UpdateRows(float lr) {
  const int lookups = model_->num_lookups();
  row_pushes_.clear();
  for (int l = 0; l < lookups; ++l) {
    if (!model_->fuses_row_sgd(l)) {
      row_pushes_.push_back(RowGrad{model_->lookup(l).table, model_->ids(l), model_->row_grads(l)});
    }
  }
  if (!row_pushes_.empty()) SW_RETURN_IF_ERROR(store_->PushRowsBatch(row_pushes_, lr, &row_scratch_));
  model_->PrefetchRowsForUpdate();
  for (int l = 0; l < lookups; ++l) {
    if (model_->fuses_row_sgd(l)) model_->ApplyRowSgd(l, lr);
  }
  return absl::OkStatus();
}

void Worker::RowsReady() {
  if (!update_rows_in_backward_) return;
  const uint64_t start = StepClock::Now();
  rows_status_ = UpdateRows(step_sparse_lr_);
  rows_in_backward_ns_ += StepClock::Nanoseconds(start, StepClock::Now());
}

absl::Status Worker::CheckShape(const Dataset& data, const char* what) const {
  if (data.dense_dim != train_->dense_dim) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", data.dense_dim, " dense features per record, the model takes ",
                                                   train_->dense_dim));
  }
  for (int l = 0; l < model_->num_lookups(); ++l) {
    const Lookup& lk = model_->lookup(l);
    if (lk.data_field >= static_cast<int>(data.fields.size()) || data.fields[lk.data_field].name != lk.field) {
      return absl::InvalidArgumentError(absl::StrCat(what, " lacks the sparse field '", lk.field, "' the model reads"));
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::PullAll() { return store_->Pull(pulls_); }

absl::Status Worker::Train(const int32_t* order, int64_t count, int64_t max_steps, const OptimizerOptions& optimizer,
                           double progress_begin, double progress_end, PhaseTimes* times, int64_t untimed_steps) {
  const int64_t batch = model_->batch();
  const int64_t steps = max_steps >= 0 ? max_steps : (count + batch - 1) / batch;
  const double per_step = steps > 0 ? (progress_end - progress_begin) / static_cast<double>(steps) : 0.0;
  return TrainAndLeave(order, count, max_steps, optimizer, progress_begin, per_step, 0, times, untimed_steps);
}

absl::Status Worker::TrainRange(const int32_t* order, int64_t count, const OptimizerOptions& optimizer,
                                double progress_begin, double progress_per_step, int64_t first_step,
                                PhaseTimes* times, const std::function<bool()>& after_step) {
  return TrainAndLeave(order, count, /*max_steps=*/-1, optimizer, progress_begin, progress_per_step, first_step, times,
                       /*untimed_steps=*/0, after_step);
}

absl::Status Worker::TrainAndLeave(const int32_t* order, int64_t count, int64_t max_steps,
                                   const OptimizerOptions& optimizer, double progress_begin, double progress_per_step,
                                   int64_t first_step, PhaseTimes* times, int64_t untimed_steps,
                                   const std::function<bool()>& after_step) {
  SyncAggregator* const sync = update_.sync;
  const absl::Status trained = TrainSteps(order, count, max_steps, optimizer, progress_begin, progress_per_step,
                                          first_step, times, untimed_steps, after_step);
  if (sync == nullptr) return trained;
  // Leave the sync group however the steps end, so the other workers' rounds
  // stop waiting for this one (arrive-and-drop).
  const absl::Status left = sync->Leave(index_);
  return trained.ok() ? left : trained;
}

namespace {

// Copies up to `batch` records of order[] from *cursor on into out and
// advances *cursor: in a range run the last batch is short, in a cycling run
// batches wrap round the range. Returns how many it took.
int64_t TakeRecords(const int32_t* order, int64_t count, int64_t batch, bool cycle, int64_t* cursor, int32_t* out) {
  if (*cursor + batch <= count) {
    // Every batch but a range's last or a wrapping one: one copy, not a
    // loop that re-tests the cursor (sparse_logreg's 64 records: about 45
    // ns a step in an instrumented build).
    std::memcpy(out, order + *cursor, static_cast<size_t>(batch) * sizeof(int32_t));
    *cursor += batch;
    return batch;
  }
  int64_t n = 0;
  while (n < batch) {
    if (*cursor == count) {
      if (!cycle) break;
      *cursor = 0;
    }
    out[n++] = order[(*cursor)++];
  }
  return n;
}

// Asks for the `batch` entries of `order` from `cursor` on, as far as the
// range goes. Called once the next step's records are taken, these are
// the ones the step after it takes, so they have a whole step to arrive
// (where that batch wraps round the range, its entries from the range's
// start miss once). The order is read a line or a few a step, too slowly
// for the hardware's stream prefetcher to follow once the step's other
// traffic has passed through the caches, so each step's TakeRecords
// missed to memory (text config, 2-core EPYC VM, instrumented build:
// 125-150 ns of a 560-600 ns data phase; sparse_logreg's 4 lines 180 ns).
void PrefetchOrder(const int32_t* order, int64_t count, int64_t batch, int64_t cursor) {
  const int64_t end = std::min(cursor + batch, count);
  if (end > cursor) PrefetchLines(order + cursor, static_cast<size_t>(end - cursor) * sizeof(int32_t));
}

}  // namespace

absl::Status Worker::TrainSteps(const int32_t* order, int64_t count, int64_t max_steps,
                                const OptimizerOptions& optimizer, double progress_begin, double progress_per_step,
                                int64_t first_step, PhaseTimes* times, int64_t untimed_steps,
                                const std::function<bool()>& after_step) {
  timed_start_.reset();
  if (count <= 0) return absl::OkStatus();
  SyncAggregator* const sync = update_.sync;
  bucket_sync_ = sync != nullptr && sync->buckets() > 0 ? sync : nullptr;
  const OptimizerOptions& sparse_optimizer = update_.sparse_optimizer ? *update_.sparse_optimizer : optimizer;
  const int64_t batch = model_->batch();
  const int64_t steps = max_steps >= 0 ? max_steps : (count + batch - 1) / batch;
  const int lookups = model_->num_lookups();
  // Pulling every step, straight from the store to this worker: the push of
  // step k also writes the updated parameters to the local copy (PushPull),
  // which is step k + 1's pull, so the parameters are read once a step, not
  // twice. Not with sync rounds (the round applies the push) nor replicas
  // (StepDone may average after the push): those pull at each step's start.
  const bool fuse_pull = sync == nullptr && update_.replicas == nullptr && update_.pull_every == 1;
  // Embedding rows read and updated in the store's memory where it allows
  // (PrepareRows); the sync round and replica averaging need the gradients.
  const bool rows_in_place = update_.rows_in_place && sync == nullptr && update_.replicas == nullptr;
  // A run of max_steps steps cycles through the range; otherwise it ends with it.
  const bool cycle = max_steps >= 0;
  // Rows are updated inside the backward, as soon as their gradients are
  // known (RowsReady), not after the dense push: the lines the forward's
  // pooling read are then still in the caches, where the top tower's
  // backward and the dense push had pushed them out (DLRM, 2 workers on 2
  // cores, two sets of alternating runs: push rows 137 -> 81 and 210 -> 114
  // us a step). A sync round takes the rows' gradients with the dense ones,
  // after the backward.
  update_rows_in_backward_ = sync == nullptr && lookups > 0;
  rows_in_backward_ns_ = 0;
  // Hot rows (update_.hot_rows): chosen once, before the first step that
  // reads rows in place; every copy used is merged into the store when this
  // call returns, however it ends, so the store holds all its updates.
  if (rows_in_place && lookups > 0 && update_.hot_rows > 0 && !hot_rows_chosen_) {
    // Only tables whose rows the fused SGD updates in place use the copies
    // (PrepareRows); with no ids, RowAddresses only answers how.
    hot_.Choose(*model_, *train_, store_->layout(), update_.hot_rows, [this](int table) {
      const absl::StatusOr<RowsInPlace> mode = store_->RowAddresses(table, {}, nullptr);
      return mode.ok() && *mode == RowsInPlace::kReadAndSgd;
    });
    hot_rows_chosen_ = true;
  }
  absl::Cleanup merge_hot_rows = [this] { hot_.Merge(); };
  const int64_t merge_every = std::max(1, update_.hot_rows_merge_every);
  int64_t cursor = 0;
  // The next step's records are taken a step ahead, and their lines asked
  // for during this step: all at once after the forward where they are a
  // burst's worth (Model::RecordsPerPrefetchBurst of this machine's burst,
  // set_prefetch_burst_lines), else in up to 4 parts,
  // at the data phase's end, after the rows are prepared, after the forward
  // and after the backward. Each part's time counts as data.
  // (sparse_logreg.yaml, 64 records of 4 lines, 3 alternating pairs on 2
  // cores: data 2.50-2.51 -> 2.26-2.31 us a step.)
  //   Where the dense push moves more than an L2 (AskNextBatchAfterPush),
  // it evicts whatever was asked for before it, so the whole batch is asked
  // for after it, at the step's end, and that time counts as data too. (The
  // default MLP, Adam's 7.5 MB against 2 MiB of L2, on a 2-core Xeon VM, 5
  // alternating rounds: data 65.7 -> 53.7 us a step, medians, the step's
  // change within the noise. sparse_logreg's push is 8 bytes; asked for at
  // the step's end its batch was slower, 1.90 -> 2.62 us a step, as it had
  // less time to arrive.)
  const bool ask_after_push =
      !pushes_.empty() && AskNextBatchAfterPush(DensePushBytes(*model_, optimizer.type), L2CacheBytes());
  int64_t next_valid = 0;  // how many of next_records_ are the next step's
  const int64_t per_burst = model_->RecordsPerPrefetchBurst(packed_, prefetch_burst_lines_);
  const int parts =
      ask_after_push ? 1 : static_cast<int>(std::clamp<int64_t>((batch + per_burst - 1) / per_burst, 1, 4));
  const int64_t part_records = (batch + parts - 1) / parts;
  // Parts of at most a burst's records arrive whole; LoadBatch asks again
  // for those of larger ones.
  const Model::Asked asked = part_records <= per_burst ? Model::Asked::kInBursts : Model::Asked::kYes;
  // Asks for part `part` of the next step's records (nothing past them).
  auto prefetch_next_part = [&](int part) {
    const int64_t begin = std::min(part * part_records, next_valid);
    const int64_t end = std::min(begin + part_records, next_valid);
    if (end > begin) model_->PrefetchBatch(*train_, next_records_.data() + begin, end - begin, packed_);
  };
  // The points of the step where part p is asked for, the forward's end
  // being the one of a single part.
  const bool part_at_data = parts >= 2, part_at_rows = parts >= 3, part_at_backward = parts >= 4;
  const bool part_at_forward = !ask_after_push;
  PhaseTimes t;
  for (int64_t step = 0; step < steps; ++step) {
    if (stop_ != nullptr && stop_->load(std::memory_order_relaxed)) break;
    const double progress = progress_begin + static_cast<double>(first_step + step) * progress_per_step;
    const float lr = optimizer.LrAt(progress);
    const float sparse_lr = sparse_optimizer.LrAt(progress);
    if (step == untimed_steps) {
      // What the steps before this one added is not timed.
      t = PhaseTimes{};
      timed_start_ = std::chrono::steady_clock::now();
    }
    const uint64_t t0 = StepClock::Now();
    // Data: gather this batch's records (the last of a range run short and
    // padded), taken a step ago from the second step on, when their lines
    // were asked for.
    int64_t valid = next_valid;
    if (step == 0) {
      valid = TakeRecords(order, count, batch, cycle, &cursor, batch_records_.data());
    } else {
      std::swap(batch_records_, next_records_);
    }
    model_->LoadBatch(*train_, batch_records_.data(), valid, packed_, step > 0 ? asked : Model::Asked::kNo);
    next_valid = step + 1 < steps ? TakeRecords(order, count, batch, cycle, &cursor, next_records_.data()) : 0;
    if (step + 2 < steps) PrefetchOrder(order, count, batch, cursor);
    int part = 0;
    if (part_at_data) prefetch_next_part(part++);
    const uint64_t t1 = StepClock::Now();
    // Read params: refresh the local copy on the first step of the call, every
    // pull_every steps, when the store has moved more than max_staleness
    // pushes past the last pull, and always in sync mode.
    bool pull = sync != nullptr || step % update_.pull_every == 0;
    uint64_t version = 0;
    if (!pull && update_.max_staleness > 0) {
      version = store_->version();
      pull = version - version_at_pull_ > static_cast<uint64_t>(update_.max_staleness);
    } else if (pull) {
      version = store_->version();
    }
    if (pull) {
      // The version is read before the pull, so the copy is at least that
      // new. After the first step a fused pull came with the last push.
      version_at_pull_ = version;
      if (!(fuse_pull && step > 0)) SW_RETURN_IF_ERROR(PullAll());
      WorkerCounters::Bump(counters_.pulls, int64_t{1});
    }
    const uint64_t t2 = StepClock::Now();
    // Embedding rows are pulled every step: they are the batch's own.
    int64_t rows = 0;
    for (int l = 0; l < lookups; ++l) rows += static_cast<int64_t>(model_->ids(l).size());
    SW_RETURN_IF_ERROR(PrepareRows(rows_in_place));
    int64_t part_in_rows_ns = 0, part_in_backward_ns = 0;  // parts asked for in those phases' intervals
    if (part_at_rows) {
      const uint64_t asked = StepClock::Now();
      prefetch_next_part(part++);
      part_in_rows_ns = StepClock::Nanoseconds(asked, StepClock::Now());
    }
    const uint64_t t3 = StepClock::Now();
    model_->Forward(/*training=*/true, stream_);
    const uint64_t t4 = StepClock::Now();
    if (part_at_forward) prefetch_next_part(part++);
    const uint64_t t4_prefetched = StepClock::Now();
    next_bucket_ = 0;
    step_lr_ = lr;
    step_sparse_lr_ = sparse_lr;
    const LossResult loss =
        model_->Backward(valid, stream_, {optimizer.loss_reduction, sparse_optimizer.loss_reduction});
    SW_RETURN_IF_ERROR(std::exchange(bucket_status_, absl::OkStatus()));
    SW_RETURN_IF_ERROR(std::exchange(rows_status_, absl::OkStatus()));
    if (part_at_backward) {
      const uint64_t asked = StepClock::Now();
      prefetch_next_part(part++);
      part_in_backward_ns = StepClock::Nanoseconds(asked, StepClock::Now());
    }
    const uint64_t t5 = StepClock::Now();
    auto t6 = t5;
    if (sync != nullptr) {
      row_pushes_.clear();
      for (int l = 0; l < lookups; ++l) {
        row_pushes_.push_back(RowGrad{model_->lookup(l).table, model_->ids(l), model_->row_grads(l)});
      }
      SW_RETURN_IF_ERROR(sync->Contribute(index_, pushes_, lr, row_pushes_, sparse_lr));
      t6 = StepClock::Now();
    } else {
      if (!pushes_.empty()) {
        if (fuse_pull && step + 1 < steps) {
          SW_RETURN_IF_ERROR(store_->PushPull(pushes_, lr, pulls_));
        } else {
          SW_RETURN_IF_ERROR(store_->Push(pushes_, lr));
        }
      }
      if (update_.replicas != nullptr) SW_RETURN_IF_ERROR(update_.replicas->StepDone());
      t6 = StepClock::Now();
      if (lookups > 0 && !update_rows_in_backward_) SW_RETURN_IF_ERROR(UpdateRows(sparse_lr));
    }
    // The hot rows' merge is part of push rows.
    if (!hot_.empty() && (step + 1) % merge_every == 0) hot_.Merge();
    uint64_t t7 = StepClock::Now();
    int64_t after_push_ns = 0;  // the next batch asked for after the push, counted as data
    if (ask_after_push) {
      prefetch_next_part(part++);
      const uint64_t asked_end = StepClock::Now();
      after_push_ns = StepClock::Nanoseconds(t7, asked_end);
      t7 = asked_end;
    }
    // Each phase's time, once: into this call's PhaseTimes and the live
    // counters.
    const uint64_t marks[kNumStepPhases + 1] = {t0, t1, t2, t3, t4, t5, t6, t7};
    int64_t ns[kNumStepPhases];
    for (int p = 0; p < kNumStepPhases; ++p) ns[p] = StepClock::Nanoseconds(marks[p], marks[p + 1]);
    // The rows updated inside the backward count as push rows, not backward.
    static_assert(kStepPhaseFields[0] == &PhaseTimes::data && kStepPhaseFields[4] == &PhaseTimes::backward &&
                  kStepPhaseFields[6] == &PhaseTimes::push_rows);
    const int64_t rows_ns = std::exchange(rows_in_backward_ns_, 0);
    ns[4] -= rows_ns;
    ns[6] += rows_ns;
    // The next batch's parts asked for after the forward and after the
    // backward (both in the backward's interval) and after the rows are
    // prepared (in pull rows') count as data.
    const int64_t prefetch_ns = StepClock::Nanoseconds(t4, t4_prefetched) + part_in_backward_ns;
    ns[4] -= prefetch_ns;
    ns[2] -= part_in_rows_ns;
    ns[0] += prefetch_ns + part_in_rows_ns;
    ns[6] -= after_push_ns;  // (the last phase's span ends after the ask)
    ns[0] += after_push_ns;
    // (Each span is rounded to whole nanoseconds on its own, so a phase that
    // was all moved out may read -1.)
    for (int64_t& phase_ns : ns) phase_ns = std::max<int64_t>(phase_ns, 0);
    for (int p = 0; p < kNumStepPhases; ++p) {
      t.*kStepPhaseFields[p] += static_cast<double>(ns[p]) * 1e-9;
      WorkerCounters::Bump(counters_.phase_ns[p], ns[p]);
    }
    t.rows_in_forward += model_->TakeInPlacePoolSeconds();
    ++t.steps;
    t.rows += rows;
    t.pulls += pull ? 1 : 0;
    WorkerCounters::Bump(counters_.steps, int64_t{1});
    WorkerCounters::Bump(counters_.samples, static_cast<int64_t>(valid));
    WorkerCounters::Bump(counters_.loss_sum, static_cast<double>(loss.loss_sum));
    WorkerCounters::Bump(counters_.correct, static_cast<int64_t>(loss.correct));
    WorkerCounters::Bump(counters_.rows_pulled, rows);
    WorkerCounters::Bump(counters_.rows_pushed, rows);
    if (after_step && !after_step()) break;
  }
  // (Nothing where the call stopped before its first timed step.)
  if (times && timed_start_) times->Add(t);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Worker::Evaluate(const Dataset& data, int64_t begin, int64_t end) {
  EvalResult result;
  const bool softmax = model_->head() == HeadType::kSoftmax;
  // P@5 (fastText's precision at k) only where a record can have several
  // labels: with one label per record it is top-5 accuracy over 5, at most
  // 0.2, and says nothing accuracy does not.
  result.metrics.emplace(model_->head(), softmax ? static_cast<int>(model_->outputs()) : 2,
                         /*top_k=*/softmax && model_->outputs() >= 5 && data.multi_label() ? 5 : 1);
  if (begin >= end) return result;
  SW_RETURN_IF_ERROR(CheckShape(data, "evaluation data"));
  SW_RETURN_IF_ERROR(PullAll());
  const int64_t batch = model_->batch();
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t valid = std::min(batch, end - b);
    model_->LoadRange(data, b, valid);
    SW_RETURN_IF_ERROR(PullRows(PullMode::kReadOnly));
    model_->Forward(/*training=*/false, stream_);
    const LossResult r = model_->Loss(valid);
    result.count += valid;
    result.correct += r.correct;
    result.loss_sum += r.loss_sum;
    switch (model_->head()) {
      case HeadType::kBinary:
        result.metrics->AddBinary(model_->logits(), model_->labels(), valid);
        break;
      case HeadType::kRegression:
        result.metrics->AddRegression(model_->logits(), model_->targets(), valid);
        break;
      case HeadType::kSoftmax:
        result.metrics->AddSoftmax(model_->logits(), data.labels.data() + b,
                                   data.multi_label() ? data.label_offsets.data() : nullptr,
                                   data.multi_label() ? data.label_sets.data() : nullptr, b, valid);
        break;
    }
  }
  return result;
}

absl::Status Worker::Predict(const Dataset& data, int64_t begin, int64_t end, float* out) {
  if (begin >= end) return absl::OkStatus();
  SW_RETURN_IF_ERROR(CheckShape(data, "prediction input"));
  SW_RETURN_IF_ERROR(PullAll());
  const int64_t batch = model_->batch();
  const int64_t k = model_->outputs();
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t valid = std::min(batch, end - b);
    model_->LoadRange(data, b, valid);
    SW_RETURN_IF_ERROR(PullRows(PullMode::kReadOnly));
    model_->Forward(/*training=*/false, stream_);
    const float* logits = model_->logits();
    for (int64_t r = 0; r < valid; ++r) {
      const float* z = logits + r * k;
      float* p = out + (b - begin + r) * k;
      switch (model_->head()) {
        case HeadType::kBinary:
          p[0] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(z[0]))));
          break;
        case HeadType::kRegression:
          p[0] = z[0];
          break;
        case HeadType::kSoftmax: {
          const float m = *std::max_element(z, z + k);
          double sum = 0;
          for (int64_t c = 0; c < k; ++c) {
            p[c] = std::exp(z[c] - m);
            sum += p[c];
          }
          for (int64_t c = 0; c < k; ++c) p[c] = static_cast<float>(p[c] / sum);
          break;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardwild
