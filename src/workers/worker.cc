#include "workers/worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "workers/replicated_store.h"
#include "ps_shm/sync_aggregator.h"

namespace shardwild {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(int index, const ModelOptions& model, int64_t batch,
                                                       const ImageDataset& train, ParamStore* store,
                                                       const dnnl::engine& engine) {
  std::unique_ptr<Worker> w(new Worker());
  w->index_ = index;
  w->train_ = &train;
  w->store_ = store;
  SW_ASSIGN_OR_RETURN(w->model_, Mlp::Create(model, train.features, train.num_classes, batch, engine));
  const StoreLayout& layout = store->layout();
  if (static_cast<int>(layout.variables.size()) != w->model_->num_variables()) {
    return absl::FailedPreconditionError("the store does not hold this model's variables");
  }
  for (int v = 0; v < w->model_->num_variables(); ++v) {
    const VariableSpec& a = layout.variables[v];
    const VariableSpec& b = w->model_->variable(v);
    if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) {
      return absl::FailedPreconditionError(absl::StrCat("store variable ", v, " is '", a.name, "' [", a.rows, ",",
                                                        a.cols, "], the model expects '", b.name, "' [", b.rows, ",",
                                                        b.cols, "]"));
    }
    w->pulls_.push_back(PullSlice{v, 0, b.rows, w->model_->params(v)});
    w->pushes_.push_back(DenseGrad{v, w->model_->grads(v)});
  }
  w->labels_.assign(batch, 0);
  try {
    w->stream_ = dnnl::stream(engine);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN stream: ", e.what()));
  }
  return w;
}

absl::Status Worker::PullAll() { return store_->Pull(pulls_); }

absl::Status Worker::Train(const int32_t* order, int64_t count, int64_t max_steps, const OptimizerOptions& optimizer,
                           double progress_begin, double progress_end, PhaseTimes* times) {
  const int64_t batch = model_->batch();
  const int64_t steps = max_steps >= 0 ? max_steps : (count + batch - 1) / batch;
  const double per_step = steps > 0 ? (progress_end - progress_begin) / static_cast<double>(steps) : 0.0;
  return TrainAndLeave(order, count, max_steps, optimizer, progress_begin, per_step, 0, times);
}

absl::Status Worker::TrainRange(const int32_t* order, int64_t count, const OptimizerOptions& optimizer,
                                double progress_begin, double progress_per_step, int64_t first_step,
                                PhaseTimes* times) {
  return TrainAndLeave(order, count, /*max_steps=*/-1, optimizer, progress_begin, progress_per_step, first_step, times);
}

absl::Status Worker::TrainAndLeave(const int32_t* order, int64_t count, int64_t max_steps,
                                   const OptimizerOptions& optimizer, double progress_begin, double progress_per_step,
                                   int64_t first_step, PhaseTimes* times) {
  SyncAggregator* const sync = update_.sync;
  const absl::Status trained =
      TrainSteps(order, count, max_steps, optimizer, progress_begin, progress_per_step, first_step, times);
  if (sync == nullptr) return trained;
  // Leave the sync group however the steps end, so the other workers' rounds
  // stop waiting for this one (arrive-and-drop).
  const absl::Status left = sync->Leave(index_);
  return trained.ok() ? left : trained;
}

absl::Status Worker::TrainSteps(const int32_t* order, int64_t count, int64_t max_steps,
                                const OptimizerOptions& optimizer, double progress_begin, double progress_per_step,
                                int64_t first_step, PhaseTimes* times) {
  if (count <= 0) return absl::OkStatus();
  SyncAggregator* const sync = update_.sync;
  const int64_t batch = model_->batch();
  const int64_t features = train_->features;
  const int64_t steps = max_steps >= 0 ? max_steps : (count + batch - 1) / batch;
  int64_t cursor = 0;
  PhaseTimes t;
  for (int64_t step = 0; step < steps; ++step) {
    const float lr = optimizer.LrAt(progress_begin + static_cast<double>(first_step + step) * progress_per_step);
    const auto t0 = Clock::now();
    // Data: gather this batch's rows. In a range run the last batch is short
    // and padded; in a cycling run batches wrap round the range.
    int64_t valid = 0;
    float* x = model_->input();
    while (valid < batch) {
      if (cursor == count) {
        if (max_steps < 0) break;
        cursor = 0;
      }
      const int32_t r = order[cursor++];
      std::memcpy(x + valid * features, train_->images.data() + static_cast<int64_t>(r) * features,
                  features * sizeof(float));
      labels_[valid++] = train_->labels[r];
    }
    const auto t1 = Clock::now();
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
      // The version is read before the pull, so the copy is at least that new.
      version_at_pull_ = version;
      SW_RETURN_IF_ERROR(PullAll());
      counters_.pulls.fetch_add(1, std::memory_order_relaxed);
    }
    const auto t2 = Clock::now();
    model_->Forward(stream_);
    const auto t3 = Clock::now();
    const LossResult loss = model_->Backward(labels_.data(), valid, stream_);
    const auto t4 = Clock::now();
    if (sync != nullptr) {
      SW_RETURN_IF_ERROR(sync->Contribute(index_, pushes_, lr));
    } else {
      SW_RETURN_IF_ERROR(store_->Push(pushes_, lr));
      if (update_.replicas != nullptr) SW_RETURN_IF_ERROR(update_.replicas->StepDone());
    }
    const auto t5 = Clock::now();
    t.data += Seconds(t0, t1);
    t.read_params += Seconds(t1, t2);
    t.forward += Seconds(t2, t3);
    t.backward += Seconds(t3, t4);
    t.push += Seconds(t4, t5);
    counters_.steps.fetch_add(1, std::memory_order_relaxed);
    counters_.samples.fetch_add(valid, std::memory_order_relaxed);
    counters_.loss_sum.fetch_add(loss.loss_sum, std::memory_order_relaxed);
    counters_.correct.fetch_add(loss.correct, std::memory_order_relaxed);
  }
  if (times) times->Add(t);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Worker::Evaluate(const ImageDataset& data, int64_t begin, int64_t end) {
  EvalResult result;
  if (begin >= end) return result;
  if (data.features != train_->features) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation data has ", data.features, " features, training data ",
                                                   train_->features));
  }
  SW_RETURN_IF_ERROR(PullAll());
  const int64_t batch = model_->batch();
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t valid = std::min(batch, end - b);
    std::memcpy(model_->input(), data.images.data() + b * data.features, valid * data.features * sizeof(float));
    std::copy(data.labels.begin() + b, data.labels.begin() + b + valid, labels_.begin());
    const LossResult r = model_->Evaluate(labels_.data(), valid, stream_);
    result.count += valid;
    result.correct += r.correct;
    result.loss_sum += r.loss_sum;
  }
  return result;
}

absl::Status Worker::Predict(const ImageDataset& data, int64_t begin, int64_t end, float* out) {
  if (begin >= end) return absl::OkStatus();
  if (data.features != train_->features) {
    return absl::InvalidArgumentError(absl::StrCat("prediction input has ", data.features,
                                                   " features per record, the model takes ", train_->features));
  }
  SW_RETURN_IF_ERROR(PullAll());
  const int64_t batch = model_->batch();
  const int64_t k = model_->num_classes();
  for (int64_t b = begin; b < end; b += batch) {
    const int64_t valid = std::min(batch, end - b);
    std::memcpy(model_->input(), data.images.data() + b * data.features, valid * data.features * sizeof(float));
    model_->Forward(stream_);
    const float* logits = model_->logits();
    for (int64_t r = 0; r < valid; ++r) {
      const float* z = logits + r * k;
      float* p = out + (b - begin + r) * k;
      const float m = *std::max_element(z, z + k);
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) {
        p[c] = std::exp(z[c] - m);
        sum += p[c];
      }
      for (int64_t c = 0; c < k; ++c) p[c] = static_cast<float>(p[c] / sum);
    }
  }
  return absl::OkStatus();
}

}  // namespace shardwild
