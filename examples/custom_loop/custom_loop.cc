// custom_loop: a hand-written training loop on shardwild::Coordinator, the
// C++ counterpart of TensorFlow's ClusterCoordinator custom training loop:
//
//   coordinator = ClusterCoordinator(strategy)
//   per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
//   per_worker_iterator = iter(per_worker_dataset)
//   for _ in range(steps): coordinator.schedule(train_step, args=(per_worker_iterator,))
//   coordinator.join()
//
// The model is a linear regression y = w.x + b with a planted solution; its
// parameters are shared by all workers and updated Hogwild-style (relaxed
// atomic_ref stores, races allowed by design, as in the parameter store).
// Each worker reads its own synthetic shard through its own iterator.
//
// The same number of steps is trained twice: once with one step per
// scheduled function, once with `--steps_per_execution K` steps per function
// (Coordinator::ScheduleSteps). The step itself is tiny, so the first run is
// dominated by the per-function cost (queueing, hand-off, wake-up, the
// RemoteValue); the second pays it once per K steps. The program prints both
// times per step; it exits non-zero if either run fails to learn the model.
//
// Usage: custom_loop_example [--steps small|N] [--workers N] [--steps_per_execution K]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "workers/coordinator.h"

namespace {

constexpr int kDim = 8;
constexpr int kBatch = 16;
constexpr int kExamplesPerWorker = 4096;

// The planted model the data comes from.
float TrueWeight(int j) { return 0.5f * static_cast<float>(j) - 1.5f; }
constexpr float kTrueBias = 0.25f;

// One worker's shard: examples generated from the planted model plus noise.
struct Example {
  float x[kDim];
  float y;
};

class ShardDataset {
 public:
  explicit ShardDataset(int worker) {
    std::mt19937 rng(1234 + worker);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    examples_.resize(kExamplesPerWorker);
    for (Example& e : examples_) {
      e.y = kTrueBias;
      for (int j = 0; j < kDim; ++j) {
        e.x[j] = normal(rng);
        e.y += TrueWeight(j) * e.x[j];
      }
      e.y += 0.01f * normal(rng);
    }
  }

  // Yields mini-batches of kBatch examples, cycling over the shard.
  class Iterator {
   public:
    explicit Iterator(const std::vector<Example>* examples) : examples_(examples) {}
    const Example* GetNext() {
      if (next_ + kBatch > examples_->size()) next_ = 0;
      const Example* batch = examples_->data() + next_;
      next_ += kBatch;
      return batch;
    }

   private:
    const std::vector<Example>* examples_;  // the dataset's, which outlives the iterator
    size_t next_ = 0;
  };
  Iterator MakeIterator() const { return Iterator(&examples_); }

 private:
  std::vector<Example> examples_;
};

// Parameters shared by all workers, updated without locks (Hogwild).
struct Model {
  float params[kDim + 1] = {};  // weights, then the bias

  float Load(int i) { return std::atomic_ref<float>(params[i]).load(std::memory_order_relaxed); }
  void Add(int i, float delta) {
    std::atomic_ref<float> p(params[i]);
    p.store(p.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
};

// One SGD step on the worker's next batch; returns the batch's mean squared error.
float TrainStep(Model& model, ShardDataset::Iterator& it, float lr) {
  const Example* batch = it.GetNext();
  float w[kDim + 1];
  for (int i = 0; i <= kDim; ++i) w[i] = model.Load(i);
  float grad[kDim + 1] = {};
  float loss = 0.0f;
  for (int n = 0; n < kBatch; ++n) {
    float pred = w[kDim];
    for (int j = 0; j < kDim; ++j) pred += w[j] * batch[n].x[j];
    const float err = pred - batch[n].y;
    loss += err * err;
    for (int j = 0; j < kDim; ++j) grad[j] += 2.0f * err * batch[n].x[j];
    grad[kDim] += 2.0f * err;
  }
  for (int i = 0; i <= kDim; ++i) model.Add(i, -lr * grad[i] / kBatch);
  return loss / kBatch;
}

float DistanceToTruth(Model& model) {
  float d = 0.0f;
  for (int j = 0; j < kDim; ++j) d += std::pow(model.Load(j) - TrueWeight(j), 2.0f);
  d += std::pow(model.Load(kDim) - kTrueBias, 2.0f);
  return std::sqrt(d);
}

struct RunResult {
  bool ok = false;
  double seconds = 0.0;
  float last_loss = 0.0f;
  float distance = 0.0f;
};

// Trains `steps` steps in functions of `steps_per_execution` steps each.
RunResult Train(shardwild::Coordinator& coordinator, shardwild::PerWorker<ShardDataset::Iterator>& iterators,
                int steps, int steps_per_execution) {
  Model model;
  const float lr = 0.02f;
  const auto start = std::chrono::steady_clock::now();
  shardwild::RemoteValue<float> last;
  for (int done = 0; done < steps; done += steps_per_execution) {
    // `iterators` reaches the function as the running worker's own iterator.
    last = coordinator.ScheduleSteps(
        [&model, lr](ShardDataset::Iterator& it) { return TrainStep(model, it, lr); },
        std::min(steps_per_execution, steps - done), iterators);
  }
  const absl::Status joined = coordinator.Join();  // blocks until every step has run
  RunResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!joined.ok()) {
    std::fprintf(stderr, "custom_loop: training failed: %s\n", joined.ToString().c_str());
    return result;
  }
  const absl::StatusOr<float> loss = last.Fetch();  // the loss of the last step scheduled
  if (!loss.ok()) {
    std::fprintf(stderr, "custom_loop: %s\n", loss.status().ToString().c_str());
    return result;
  }
  result.ok = true;
  result.last_loss = *loss;
  result.distance = DistanceToTruth(model);
  return result;
}

int ParsePositive(const char* flag, const char* value) {
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || n < 1 || n > 100000000) {
    std::fprintf(stderr, "custom_loop: %s: expected a positive integer, got '%s'\n", flag, value);
    std::exit(2);
  }
  return static_cast<int>(n);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20000;
  int workers = 2;
  int steps_per_execution = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc || (flag != "--steps" && flag != "--workers" && flag != "--steps_per_execution")) {
      std::fprintf(stderr, "usage: %s [--steps small|N] [--workers N] [--steps_per_execution K]\n", argv[0]);
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--steps") {
      steps = std::string(value) == "small" ? 2000 : ParsePositive("--steps", value);
    } else if (flag == "--workers") {
      workers = ParsePositive("--workers", value);
    } else {
      steps_per_execution = ParsePositive("--steps_per_execution", value);
    }
  }

  absl::StatusOr<std::unique_ptr<shardwild::Coordinator>> coordinator =
      shardwild::Coordinator::Create(shardwild::CoordinatorOptions{.num_workers = workers});
  if (!coordinator.ok()) {
    std::fprintf(stderr, "custom_loop: %s\n", coordinator.status().ToString().c_str());
    return 1;
  }
  // dataset_fn runs once per worker; each worker gets its own shard.
  absl::StatusOr<shardwild::PerWorker<ShardDataset>> datasets =
      (*coordinator)->CreatePerWorkerDataset([](int worker) { return ShardDataset(worker); });
  if (!datasets.ok()) {
    std::fprintf(stderr, "custom_loop: %s\n", datasets.status().ToString().c_str());
    return 1;
  }
  shardwild::PerWorker<ShardDataset::Iterator> iterators = datasets->MakeIterators();

  std::printf("custom_loop: %d steps of batch %d on %d workers\n", steps, kBatch, workers);
  bool learned = true;
  for (int spe : {1, steps_per_execution}) {
    const RunResult r = Train(**coordinator, iterators, steps, spe);
    if (!r.ok) return 1;
    std::printf("  steps_per_execution=%-5d %8.3f us/step  last loss %.5f  |w - w*| %.4f\n", spe,
                1e6 * r.seconds / steps, r.last_loss, r.distance);
    learned = learned && r.distance < 0.05f;
  }
  if (!learned) {
    std::fprintf(stderr, "custom_loop: the model did not reach the planted solution\n");
    return 1;
  }
  return 0;
}
