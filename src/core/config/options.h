// Options structs for every part of a job.
//
// Each struct carries its defaults in place and has one Validate() that checks
// the values together. Validate() errors name the dotted config key
// ("train.batch_size: must be >= 1, got 0") so the CLI can print them as is.
// The YAML loader in config.h fills these structs; code that builds a job by
// hand can fill them directly and call Validate().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardwild {

enum class Activation { kNone, kRelu, kSigmoid, kTanh };
enum class LossType { kSoftmaxCrossEntropy };
enum class OptimizerType { kSgd, kMomentum, kAdam, kAdagrad, kRmsprop, kFtrl };  // values are stored in shm headers: append only
enum class LrSchedule { kConstant, kCosine, kStep, kLinear };  // values enter config hashes: append only
// What gradient an optimizer applies (optimizer.loss_reduction), after Keras'
// loss reductions: that of the loss averaged over the batch's records
// (sum_over_batch_size; the rate is per batch) or summed over them (sum; the
// rate is per record, as fastText's and Hogwild's per-example SGD).
enum class LossReduction { kSumOverBatchSize, kSum };
// How pushes reach the parameters (ps.update). Values are stored in shm
// headers: append only.
//   hogwild:  no locks; the SIMD Hogwild kernels (core/model/hogwild_kernels.h) read
//             and write parameter memory, races on it allowed.
//   row_lock: a per-row seqlock; a push changes a row's params and slots
//             together, and a pull or ReadRows sees whole rows.
//   sync:     every worker's gradient of a step is averaged, then applied once
//             (ps_shm/sync_aggregator.h); deterministic for a fixed seed and
//             worker count. The store itself behaves as in hogwild.
enum class UpdateMode { kHogwild, kRowLock, kSync };
// How the dense gradients of a job's worker processes meet (train.strategy):
//   ps:        through the parameter store (ps tasks of a cluster, or this
//              machine's shared memory), as ps.update says;
//   allreduce: every process holds the dense model, and the gradients of
//              all workers are summed every step (inside a process through
//              the sync barrier, across processes by Gloo's allreduce) and
//              applied identically everywhere (net/allreduce.h).
enum class TrainStrategy { kPs, kAllreduce };
const char* TrainStrategyName(TrainStrategy s);
// Where a cluster task learns its place (cluster.launcher): auto tries
// --cluster FILE, TF_CONFIG, Slurm (srun) and Open MPI (mpirun) in that
// order; none ignores the launchers' environment (a single-machine run inside
// an allocation); the others take that source only.
enum class ClusterLauncher { kAuto, kTfConfig, kSlurm, kMpi, kNone };
// Gloo's allreduce for train.strategy allreduce (cluster.allreduce_algorithm).
enum class CollectiveAlgorithm { kRing, kHalvingDoubling };
const char* CollectiveAlgorithmName(CollectiveAlgorithm a);  // "ring", "halving_doubling"
// cluster.allreduce_overlap: auto (when each rank has a spare core), true, false.
enum class AllreduceOverlap { kAuto, kOn, kOff };
const char* AllreduceOverlapName(AllreduceOverlap o);  // "auto", "true", "false"
const char* ClusterLauncherName(ClusterLauncher l);
enum class DataFormat { kIdx, kCriteo, kLibsvm, kText, kCsv };
// What a reader does with a bad row (data.on_error): stop with an error that
// names file, line, column and what was expected, or leave the row out and
// count it by reason.
enum class OnBadRow { kFail, kSkip };
// How Criteo's integer fields (and CSV dense columns) are transformed
// (data.dense_transform). A missing value counts as 0 before the transform.
//   log1p: log(1 + max(x, 0)), DLRM's preprocessing (negatives clamped to 0)
//   log3:  log(3 + max(x, -2)) (Criteo's smallest value is -3; clamped so the result is finite)
//   none:  x as is
enum class DenseTransform { kLog1p, kLog3, kNone };
// What labels mean; follows from model.head.
//   binary:     0/1, or -1/+1 (mapped to 0/1)
//   multiclass: integers >= 0 (libsvm, CSV) or names (text)
//   regression: any real number
enum class LabelKind { kBinary, kMultiClass, kRegression };
// What ShmParamStore::Create does with segments of its job left by a process
// that is gone (ps.stale_segments; see ps_shm/stale_segments.h).
enum class StaleSegmentPolicy { kRemove, kReport, kFail };
// Whether shards ask for transparent huge pages (ps.huge_pages).
enum class HugePagePolicy { kAuto, kOff };
// What memory the shards live in (ps.memory_kind).
//   shared: a /dev/shm segment per shard, which other processes can attach
//           to by name (worker processes, Python, a same-host cluster task).
//   private: anonymous memory of the process that creates the store: no
//           other process can attach, and nothing is left in /dev/shm if it
//           dies. Its pages can be huge where /dev/shm's cannot (THP's
//           `enabled` governs them, not `shmem_enabled` and tmpfs's huge=).
//   auto: private for a store no other process attaches to, when private
//         memory would get huge pages and /dev/shm would not; else shared.
enum class StoreMemoryKind { kAuto, kShared, kPrivate };
const char* StoreMemoryKindName(StoreMemoryKind kind);
// How many copies of the dense variables a job keeps (ps.replication), after
// DimmWitted and HogWild++. Embedding tables are never replicated.
//   per_machine: one copy, its shards spread over the NUMA nodes.
//   per_node:    one replica per NUMA node that runs workers; a worker uses
//                its node's replica. Replicas are averaged every
//                ps.sync_every steps (workers/replicated_store.h).
//   per_core:    one replica per worker (a local model), averaged the same way.
//   auto:        chosen from the topology; the job reports what and why.
enum class ReplicationPolicy { kPerMachine, kPerNode, kPerCore, kAuto };

const char* ActivationName(Activation a);
const char* OptimizerTypeName(OptimizerType t);
const char* UpdateModeName(UpdateMode m);
const char* ReplicationPolicyName(ReplicationPolicy p);
const char* LossReductionName(LossReduction r);

// The head: what the model's output means and its loss.
//   softmax:    K logits, softmax cross-entropy (multi-label records: the
//               target spreads evenly over the record's labels)
//   binary:     1 logit, sigmoid binary cross-entropy
//   regression: 1 output, mean squared error
enum class HeadType { kSoftmax, kBinary, kRegression };
// EmbeddingBag pooling over a record's ids of one field.
enum class Pooling { kSum, kMean };
// How the bottom tower's output and the pooled embeddings meet before the
// top tower.
//   concat:        [dense, e_1, ..., e_F]
//   dot:           DLRM: the dense vector (the bottom output, which must then
//                  be as wide as the embeddings) followed by the pairwise dot
//                  products of [dense, e_1, ..., e_F] (i < j)
//   dot_no_dense:  the pairwise dot products of [e_1, ..., e_F] only
enum class Interaction { kConcat, kDot, kDotNoDense };
// model.precision: what the dense layers compute in. bf16: the matmuls of
// forward and backward take bf16 activations, weights and gradients and
// accumulate in f32 (oneDNN); the bias, the activations' derivatives, the
// loss, the head and everything the store keeps (parameters, optimizer
// slots, checkpoints) stay f32.
enum class Precision { kF32, kBf16 };

const char* HeadTypeName(HeadType h);
const char* PrecisionName(Precision p);

struct LayerOptions {
  std::string type = "dense";         // only "dense" for now
  int64_t units = 0;                  // output width; required, >= 1
  Activation activation = Activation::kNone;
  // Inverted dropout on this layer's output while training, in [0, 1).
  float dropout = 0.0f;
};

// model.tables[]: an embedding table (a parameter-store table).
struct TableOptions {
  std::string name;                   // 1..47 bytes, unique
  int64_t rows = 0;                   // static: the vocabulary (id % rows); dynamic: the capacity
  int64_t dim = 0;                    // floats per row, >= 1
  bool dynamic = false;               // kind: static | dynamic (raw 64-bit ids, hashed into shards)
  bool evict_lru = false;             // dynamic: on_full evict_lru instead of error
  // Initial rows: uniform(-init_scale, init_scale); 0 = DLRM's
  // uniform(-1/sqrt(rows), 1/sqrt(rows)).
  float init_scale = 0.0f;
  // dtype: the rows' parameters in the store as f32 or bf16 (half the
  // memory; updates computed in f32 and stored by stochastic rounding;
  // pulls, checkpoints and the wire see f32).
  bool bf16 = false;
};

// Checks embedding tables as model.tables are checked (names 1..40 bytes,
// unique, not wide/...; rows and dim >= 1; on_full; init_scale); errors name
// `key`[i] and the table, e.g. "model.tables[2] (C3).dim: must be >= 1, got 0".
absl::Status ValidateTables(const std::vector<TableOptions>& tables, const std::string& key);

// model.sparse[]: one sparse input field pooled through a table.
struct SparseFeatureOptions {
  std::string field;                  // data field ("C1", "features", "tokens", ...)
  std::string table;                  // model.tables[].name; empty = a table named after the field
  Pooling pooling = Pooling::kSum;
  // Multiply each row by the field's weights (libsvm values) where the data has them.
  bool weighted = true;
};

struct ModelOptions {
  // Dense input width. 0 = taken from the training data.
  int64_t input_dim = 0;
  // The top tower (config key `layers` or `top`): dense layers over the
  // interaction's output; the last one's units are the head's outputs
  // (classes for softmax, 1 otherwise) and it has no activation.
  std::vector<LayerOptions> layers;
  // The bottom tower over the dense features (empty = the dense features as they are).
  std::vector<LayerOptions> bottom;
  std::vector<TableOptions> tables;
  std::vector<SparseFeatureOptions> sparse;
  Interaction interaction = Interaction::kConcat;
  // Wide&Deep: sparse fields whose ids get a linear term (a dim-k table per
  // field, k = the head's outputs, named "wide/<field>", sum pooling)
  // added to the logits.
  std::vector<std::string> wide;
  int64_t wide_rows = 1000000;         // rows of each wide table (static, id % rows)
  HeadType head = HeadType::kSoftmax;
  LossType loss = LossType::kSoftmaxCrossEntropy;
  Precision precision = Precision::kF32;
  // The table named `name`, or nullptr.
  const TableOptions* FindTable(const std::string& name) const;
  absl::Status Validate() const;
};

// data.text.*: fastText-style text ("__label__X [__label__Y] tok tok ...").
struct TextOptions {
  // 1 = tokens only; 2 = also word bigrams (fastText's -wordNgrams 2).
  int word_ngrams = 1;
  // With word_ngrams 2: put the bigram ids into their own field "ngrams"
  // (so they can have their own table) instead of into "tokens".
  bool ngrams_field = false;
};

// data.csv.*: a CSV file with a header line; columns chosen by name.
struct CsvOptions {
  std::string label;                     // required
  std::vector<std::string> dense;        // numeric columns -> dense features, in this order
  std::vector<std::string> categorical;  // string columns -> one sparse field each (named after the column)
  char delimiter = ',';
};

struct DataOptions {
  DataFormat format = DataFormat::kIdx;
  // For idx: a path prefix; "<prefix>-images-idx3-ubyte[.gz]" and
  // "<prefix>-labels-idx1-ubyte[.gz]" are read. For the other formats: a file.
  std::string train;
  std::string test;
  // Keep only the first N records (0 = all). Useful for smoke runs and tests.
  int64_t max_train_records = 0;
  int64_t max_test_records = 0;
  // The most records one dispatcher task holds (train.worker_processes:
  // workers take tasks of this size; workers/task_trainer.h). >= 1.
  int64_t records_per_task = 1024;
  OnBadRow on_error = OnBadRow::kFail;
  DenseTransform dense_transform = DenseTransform::kLog1p;
  // Keep a binary cache of the parsed data next to the source
  // ("<file>.swcache") and use it while the source and the parse options
  // are unchanged.
  bool cache = false;
  // Where the cache files go instead of next to the source; empty = there.
  std::string cache_dir;
  // Parser threads; 0 = one per hardware thread.
  int reader_threads = 0;
  // Streamed training (core/data/column_cache.h): data.train is parsed once
  // into a columnar cache on disk ("<file>.swcols", in cache_dir or next to
  // the file) and each worker reads its tasks' records from it while it
  // trains, instead of the whole set being held in memory. Needs
  // ps.update hogwild or row_lock; not the text or idx formats.
  bool stream = false;
  // Streaming: records of a task read, shuffled and trained together (a
  // window of the task); 0 = as many as the memory budget allows.
  int64_t shuffle_buffer = 0;
  // Streaming: batches a worker's reader prepares ahead of its step; >= 1.
  int prefetch_batches = 8;
  // Streaming: what every worker's reader may hold at once (windows and
  // prepared batches), in MiB, shared among the workers; >= 1.
  int64_t memory_budget_mb = 256;
  // Streaming: text MiB per part of the columnar cache (parts are built in
  // parallel, and a first run trains on a part as soon as it and the
  // parts before it are built); >= 1.
  int64_t cache_part_mb = 64;
  // The most lines of the next batch a worker asks for at once
  // (core/data/prefetch_burst.h): 0 = auto, what this machine's cores
  // bring in, measured once per process; else 1..1024.
  int prefetch_burst_lines = 0;
  TextOptions text;
  CsvOptions csv;
  absl::Status Validate() const;
};

struct TrainOptions {
  int workers = 0;             // 0 = auto: one per physical core
  int intra_op_threads = 0;    // OpenMP threads per worker; 0 = auto: cores / workers (>= 1)
  int epochs = 10;
  int64_t batch_size = 128;
  uint64_t seed = 1;
  bool pin_threads = true;     // pin workers to cores through hwloc
  double log_every_s = 1.0;    // progress refresh period
  // A worker keeps its local copy of the dense parameters and pulls them only
  // every `pull_every` steps (ElasticDL's get_model_steps); >= 1. Ignored
  // (every step pulls) with ps.update sync.
  int pull_every = 1;
  // Run each worker as its own process attached to the shared-memory store,
  // with the dispatcher in this one (workers/task_trainer.h). Needs
  // ps.update hogwild or row_lock and one copy of the parameters.
  bool worker_processes = false;
  // With worker_processes: start a replacement when a worker process dies
  // (its tasks are re-queued either way); false = go on with fewer.
  bool restart_workers = true;
  // A worker silent for longer than this (no report, no heartbeat) loses its
  // task, which is re-queued; a worker process is then killed. > 0.
  double task_timeout_s = 60;
  // How often one task may be re-queued before the job fails; >= 0.
  int max_task_retries = 3;
  // ps or allreduce (TrainStrategy). allreduce steps every worker together
  // (as ps.update sync does), whatever ps.update says.
  TrainStrategy strategy = TrainStrategy::kPs;
  absl::Status Validate() const;
};

struct OptimizerOptions {
  OptimizerType type = OptimizerType::kAdam;
  float lr = 0.001f;
  float momentum = 0.9f;       // momentum
  bool nesterov = false;       // momentum
  float beta1 = 0.9f;          // adam
  float beta2 = 0.999f;        // adam
  // adam, adagrad, rmsprop. One field for all three: Keras defaults Adagrad
  // and RMSprop to 1e-7, so set it explicitly to match a Keras run exactly.
  float epsilon = 1e-8f;
  float initial_accumulator_value = 0.1f;  // adagrad, ftrl: starting value of the accumulator slot
  float rho = 0.9f;            // rmsprop: decay of the mean square
  float l1 = 0.0f;             // ftrl: L1 regularisation strength (TF l1_regularization_strength)
  float l2 = 0.0f;             // ftrl: L2 regularisation strength (TF l2_regularization_strength)
  // Learning-rate schedule. Times are fractions of the whole run (progress p:
  // 0 at the first step, 1 after the last; epoch e of E starts at (e-1)/E).
  // An optional linear warmup comes first, and the schedule runs after it:
  //   p < W (warmup):  warmup_start_lr + (lr - warmup_start_lr) * p / W
  // then, with t = p - W the time since the warmup ended:
  //   constant:  lr
  //   cosine:    final_lr + (lr - final_lr) * (1 + cos(pi * t / (1 - W))) / 2
  //              (SGDR without restarts, squeezed into what is left of the run)
  //   step:      lr * decay_rate ^ floor(t / decay_every)
  //              (TF ExponentialDecay with staircase=True; a boundary within
  //              1e-9 of a multiple of decay_every counts as reached, so a
  //              period of k/E decays exactly at the start of an epoch)
  //   linear:    final_lr + (lr - final_lr) * (1 - t / (1 - W))
  //              (fastText's decay; Keras PolynomialDecay with power 1)
  // The config also takes decay_epochs / warmup_epochs (in epochs of
  // train.epochs) instead of decay_every / warmup; see core/config/config.h.
  LrSchedule schedule = LrSchedule::kConstant;
  float final_lr = 0.0f;       // cosine, linear: the rate at the end of the run, in [0, lr]
  float decay_rate = 0.1f;     // step: factor per period, in (0, 1]
  double decay_every = 0.0;    // step: the period, a fraction of the run in (0, 1]; required
  double warmup = 0.0;         // warmup length, a fraction of the run in [0, 1); 0 = none
  float warmup_start_lr = 0.0f;  // the rate at p = 0 with a warmup, in [0, lr]
  // The gradient this optimizer applies to its parameters (the dense
  // variables for `optimizer`, the embedding rows for `optimizer.sparse`):
  // of the batch's mean loss, or of its summed loss, which is the mean's
  // gradient times the records in the batch (see LossReduction).
  LossReduction loss_reduction = LossReduction::kSumOverBatchSize;
  // The learning rate at `progress` (clamped to [0, 1]). Cheap and
  // allocation-free: it is called every step.
  float LrAt(double progress) const;
  absl::Status Validate() const;
};

// How many partitions (row ranges along axis 0) each variable is split into,
// after TensorFlow's tf.distribute.experimental.partitioners; the rows are then
// dealt out with the "div" rule. The rules are in core/model/partitioner.h.
struct PartitionerOptions {
  enum class Kind {
    kFixedShards,  // FixedShardsPartitioner(num_shards = max_shards)
    kMinSize,      // MinSizePartitioner(min_shard_bytes, max_shards)
    kMaxSize,      // MaxSizePartitioner(max_shard_bytes, max_shards)
  };
  Kind kind = Kind::kFixedShards;
  int64_t min_shard_bytes = 256 << 10;  // min_size: >= 1
  int64_t max_shard_bytes = 0;          // max_size: required, >= 1
  // Upper bound on the partitions of one variable (for fixed_shards: their
  // number). 0 = the store's shard count, which caps it in any case.
  int max_shards = 0;
  absl::Status Validate() const;
};

struct StoreOptions {
  int shards = 0;              // 0 = auto: one per NUMA node
  UpdateMode update = UpdateMode::kHogwild;
  // ElasticDL's staleness bound: before each step a worker forces a pull when
  // the store's version() has moved more than this many pushes past the
  // version it last pulled at. 0 = unbounded (only train.pull_every applies).
  int64_t max_staleness = 0;
  // Prefix of the shared-memory segment names. Each run appends its pid and a
  // random nonce, so two runs never collide.
  std::string job_name = "shardwild";
  PartitionerOptions partitioner;
  // Segments "<job_name>-<pid>-<nonce>-s<k>" whose pid is gone (a run that
  // was SIGKILLed): `remove` unlinks them before creating the store, `report`
  // leaves them (the caller warns), `fail` makes Create fail naming them.
  StaleSegmentPolicy stale_segments = StaleSegmentPolicy::kRemove;
  // `auto`: madvise(MADV_HUGEPAGE) each shard where the kernel's shmem THP
  // settings allow it (ps_shm/huge_pages.h); `off`: never ask.
  HugePagePolicy huge_pages = HugePagePolicy::kAuto;
  StoreMemoryKind memory_kind = StoreMemoryKind::kAuto;
  // Copies of the dense variables (see ReplicationPolicy). Anything but
  // per_machine (or auto) is rejected with update sync, which averages every
  // step over a single copy already.
  ReplicationPolicy replication = ReplicationPolicy::kPerMachine;
  // With several replicas: they are averaged each time the steps of all
  // workers together reach a multiple of this. >= 1.
  int64_t sync_every = 16;
  // Per embedding table read and updated in place (static f32 tables under
  // hogwild SGD), each worker keeps its own copies of this many of the ids
  // most frequent in the training data and merges them into the store every
  // hot_rows_merge_every of its steps and at the end of each task
  // (workers/hot_rows.h). 0 = none.
  int64_t hot_rows = 0;
  int hot_rows_merge_every = 32;  // >= 1
  absl::Status Validate() const;
};

struct BenchOptions {
  int64_t warmup_steps = 20;   // per worker, not timed
  int64_t steps = 200;         // per worker, timed
  double peak_seconds = 1.0;   // how long the matmul-peak probe runs
  absl::Status Validate() const;
};

// checkpoint.*: where and how often training writes checkpoints
// (workers/checkpoint.h), and how many it keeps. With `dir` set, `shardwild
// train` resumes from the newest good checkpoint there (--fresh starts over).
struct CheckpointOptions {
  std::string dir;             // empty = no checkpoints, no resume
  // A checkpoint after every `every_steps` steps of each worker (a step is
  // one batch on every worker), and at the end of every `every_epochs`
  // epochs; 0 = never by that rule. The end of training always writes one.
  int64_t every_steps = 0;
  int every_epochs = 1;
  int keep = 5;                // checkpoints kept (TF's max_to_keep), >= 1
  absl::Status Validate() const;
};

// early_stopping.*: stop training when a monitored metric has stopped
// improving (Keras EarlyStopping; the logic is in core/metrics/early_stopping.h).
struct EarlyStoppingOptions {
  // The metric watched after each evaluation: test_loss, test_accuracy,
  // train_loss or train_accuracy. Empty = early stopping off.
  std::string monitor;
  // min, max, or auto: max for a monitor whose name contains "acc" or "auc",
  // min otherwise.
  std::string mode = "auto";
  // A value improves on the best only by more than this (>= 0): below
  // best - min_delta in min mode, above best + min_delta in max mode.
  double min_delta = 0.0;
  // Evaluations without improvement tolerated before stopping (>= 0); as in
  // Keras, 0 stops at the first one that does not improve.
  int patience = 0;
  bool enabled() const { return !monitor.empty(); }
  // Whether larger values are better (mode max, or auto resolved as above).
  bool maximize() const;
  absl::Status Validate() const;
};

// eval.*: when training evaluates data.test (inline: the workers stop
// between steps, evaluate every test record exactly once, and go on).
struct EvalOptions {
  int every_epochs = 1;        // at the end of every N-th epoch (and the last); 0 = not by epochs
  int64_t every_steps = 0;     // after every N steps of each worker; 0 = never by steps
  // Leave evaluation to a separate process (`shardwild eval --watch
  // checkpoint.dir`): no inline evaluation at all. Needs checkpoint.dir.
  bool sidecar = false;
  absl::Status Validate() const;
};

// metrics.*: where training writes its metrics besides the progress line.
struct MetricsOptions {
  // A JSON-lines file: one line per progress interval (train.log_every_s)
  // and one per evaluation. Empty = none. Appended to when a run resumes.
  std::string jsonl;
  // A directory for TensorBoard event files (scalars train/loss,
  // train/samples_per_s, eval/loss, eval/accuracy). Empty = none.
  std::string tensorboard;
  // Live metrics in the Prometheus text format at http://<bind>:<port>/metrics
  // (workers/live_metrics.h): 0 = off; else in [1, 65535]. That port is the
  // chief's (the process of `shardwild train`); the job's other processes
  // take the ports after it, so that those of one machine never collide
  // (workers/live_metrics.h, MetricsProcess): worker process k of
  // train.worker_processes port + 1 + k; in a cluster ps task i
  // port + 1 + i and worker task j port + 1 + (ps tasks) + j.
  int port = 0;
  // The address the metrics server listens on: an IPv4 or IPv6 literal.
  // Loopback by default; "0.0.0.0" or "::" = every interface, where anyone
  // who can reach the port may read the metrics (there is no
  // authentication).
  std::string bind = "127.0.0.1";
  absl::Status Validate() const;
};

struct TopologyOptions {
  // Empty = the real machine. Otherwise an hwloc synthetic description
  // ("pack:2 numa:1 core:8 pu:2") or the path of an hwloc XML file.
  std::string synthetic;
  std::string xml;
  absl::Status Validate() const;
};

// How gradients travel to a remote ps (cluster.compression; net/half.h):
// float32 as they are, or rounded to bf16 / fp16 (half the bytes).
enum class GradientCompression { kNone, kBf16, kFp16 };
const char* GradientCompressionName(GradientCompression c);

// cluster.*: the networking of a job spread over several machines (src/net).
// Which machines and roles there are comes from the cluster spec
// (net/cluster_spec.h: TF_CONFIG, --cluster FILE or flags), not from here.
struct ClusterOptions {
  // The host a ps task's (and the chief's) server binds, with the port its
  // cluster-spec address gives. Loopback (127.0.0.1, ::1, localhost) by
  // default, and then a task whose spec address is itself loopback binds
  // that address (127.0.0.2 standing for another machine of one box); any
  // other host needs token_file, so no unauthenticated server is ever
  // reachable from another machine.
  std::string bind_host = "127.0.0.1";
  // A file holding the shared secret every request carries (its first line,
  // surrounding whitespace removed; at least 16 bytes). It must not be
  // readable by group or others. Empty = no token (loopback only).
  std::string token_file;
  // TLS: the server's certificate chain and private key (PEM). Both or
  // neither; with them every connection is TLS. tls_ca_file is the root
  // clients verify servers against; empty = tls_cert_file itself (one
  // self-signed certificate shared by the cluster).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // Every remote call's deadline, per attempt; > 0.
  double deadline_s = 10.0;
  // HTTP/2 keepalive on every connection (ps and chief servers, and their
  // clients): each side pings the other after keepalive_s without traffic
  // and drops the connection when a ping is not answered within keepalive_s,
  // so a peer machine that vanished without closing its connections (power,
  // network) is noticed within about 2 x keepalive_s even when no call is
  // out (an idle worker task's session; the chief then re-queues its work
  // as for a dead worker). 0 = off; else >= 0.1.
  double keepalive_s = 10.0;
  // Attempts of one call before it fails (1 = no retry); >= 1. Retries
  // wait initial_backoff_s, doubling up to max_backoff_s (0 < initial <= max).
  int max_attempts = 3;
  double initial_backoff_s = 0.1;
  double max_backoff_s = 2.0;
  // The largest gRPC message either side sends or accepts, set explicitly on
  // both; larger tensors travel in chunks that fit. In [4096, 1 GiB].
  int64_t max_message_bytes = 4 << 20;
  // Gradients pushed to a remote ps: none (float32), bf16 or fp16. Pulls
  // always travel as float32.
  GradientCompression compression = GradientCompression::kNone;
  // Which launcher's environment places this process (ClusterLauncher).
  ClusterLauncher launcher = ClusterLauncher::kAuto;
  // With Slurm or Open MPI: rank r's address is its host with port
  // base_port + r (1..65535 for every rank). With train.strategy ps rank 0
  // is the chief, ranks 1..P the ps tasks (P >= 1) and the rest the worker
  // tasks; with train.strategy allreduce the last P ranks are the ps tasks
  // (P >= 0; they host the embedding tables) and the others the ranks that
  // train. ps_tasks -1 = auto: 1 under ps, 0 under allreduce. Read it
  // through PsTasksFor, never directly.
  int base_port = 2222;
  int ps_tasks = -1;
  // P above: ps_tasks, or its auto value under `strategy`.
  int PsTasksFor(TrainStrategy strategy) const {
    if (ps_tasks >= 0) return ps_tasks;
    return strategy == TrainStrategy::kPs ? 1 : 0;
  }
  // train.strategy allreduce: where the ranks meet (host:port, served by
  // rank 0). Empty = rank 0's address (TF_CONFIG, Slurm, or Open MPI on one
  // host).
  std::string rendezvous;
  // Every collective's and the rendezvous's deadline (allreduce); > 0. A
  // rank that waits longer for its peers fails with an error naming them.
  double collective_timeout_s = 60.0;
  // train.strategy allreduce: the fewest ranks the job goes on with after
  // losing some (>= 1); fewer stop it with an error on every survivor.
  int min_workers = 1;
  // ring or halving_doubling (CollectiveAlgorithm).
  CollectiveAlgorithm allreduce_algorithm = CollectiveAlgorithm::kRing;
  // train.strategy allreduce: true = each layer's gradient goes across
  // processes as soon as every worker of the process has finished that
  // layer's backward, while the layers below are still being differentiated
  // (one collective per layer a round); false = one collective of the whole
  // gradient after the backward; auto = true where each rank of a host has
  // a core its workers leave free for the collectives (net/allreduce_task.h).
  AllreduceOverlap allreduce_overlap = AllreduceOverlap::kAuto;
  absl::Status Validate() const;
};

// OptimizerOptions::Validate of optimizer.sparse: its errors name
// optimizer.sparse.* keys instead of optimizer.*.
absl::Status ValidateSparseOptimizer(const OptimizerOptions& sparse);

struct Config {
  ModelOptions model;
  DataOptions data;
  TrainOptions train;
  OptimizerOptions optimizer;
  // optimizer.sparse: the optimizer of the embedding tables; unset = the
  // dense `optimizer` for them too.
  std::optional<OptimizerOptions> sparse_optimizer;
  StoreOptions ps;
  BenchOptions bench;
  TopologyOptions topology;
  CheckpointOptions checkpoint;
  MetricsOptions metrics;
  EarlyStoppingOptions early_stopping;
  EvalOptions eval;
  ClusterOptions cluster;
  std::string source;          // where it came from (file path), for messages
  absl::Status Validate() const;
};

}  // namespace shardwild
