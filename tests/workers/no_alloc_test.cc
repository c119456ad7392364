// The steady-state training step allocates nothing: after a warm-up, a run of
// Worker::Train steps makes no call to malloc, calloc, realloc, the aligned
// allocators or operator new from Shardwild's code (data gathering, pulls,
// layers, loss, the fused optimizer push, counters).
//
// oneDNN itself is the one exception: dnnl_primitive_execute builds a small
// argument map on the heap on every call (about 7 allocations per primitive
// in oneDNN 2.6), whatever the caller does. The test measures that part
// separately by interposing dnnl_primitive_execute, and reports it.
//
// Allocation is counted by interposing the C allocator (glibc exports the
// real functions as __libc_*), which also catches operator new. Sanitizers
// interpose the allocator themselves, so the test is skipped under them.
#include <dlfcn.h>
#include <malloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "core/base/sanitizers.h"
#include "core/model/model.h"
#include "oneapi/dnnl/dnnl.h"
#include "ps_shm/shm_store.h"
#include "workers/replicated_store.h"
#include "tests/core/model/bag_data.h"
#include "tests/workers/sparse_test_util.h"
#include "workers/job.h"
#include "workers/worker.h"

#ifndef SHARDWILD_SANITIZED
namespace {
thread_local bool t_counting = false;
thread_local bool t_in_onednn = false;
std::atomic<int64_t> g_allocations{0};         // by Shardwild's code
std::atomic<int64_t> g_onednn_allocations{0};  // inside dnnl_primitive_execute
std::atomic<int64_t> g_executes{0};
inline void Count() {
  if (!t_counting) return;
  (t_in_onednn ? g_onednn_allocations : g_allocations).fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

extern "C" dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t primitive, dnnl_stream_t stream, int nargs,
                                                const dnnl_exec_arg_t* args) {
  using Fn = dnnl_status_t (*)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "dnnl_primitive_execute"));
  if (t_counting) g_executes.fetch_add(1, std::memory_order_relaxed);
  t_in_onednn = true;
  const dnnl_status_t s = real(primitive, stream, nargs, args);
  t_in_onednn = false;
  return s;
}

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

void* malloc(size_t n) {
  Count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  Count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  Count();
  return __libc_realloc(p, n);
}
void free(void* p) { __libc_free(p); }
void* memalign(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}
void* aligned_alloc(size_t align, size_t n) {
  Count();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  Count();
  void* p = __libc_memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace shardwild {
namespace {

#ifndef SHARDWILD_SANITIZED
// A store of `so`'s shards and optimizer, with the tables of `model` on
// data's shape, and a worker of `batch` records on it.
void OpenSparseWorker(const ModelOptions& model, const Dataset& data, OpenStoreOptions so, int64_t batch,
                      const dnnl::engine& engine, std::unique_ptr<ShmParamStore>* store,
                      std::unique_ptr<Worker>* worker) {
  auto spec = Model::Describe(model, DataShape::Of(data));
  ASSERT_TRUE(spec.ok()) << spec.status();
  so.tables = TableSpecsOf(*spec);
  auto opened = ShmParamStore::Create(so, spec->variables);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto made = Worker::Create(0, model, batch, data, opened->get(), engine);
  ASSERT_TRUE(made.ok()) << made.status();
  *store = *std::move(opened);
  *worker = *std::move(made);
}

// One epoch of `order` warms the id buffers and the row scratch to the
// largest batch; the next one allocates nothing.
void ExpectWarmEpochAllocatesNothing(Worker& worker, const Dataset& data, const std::vector<int32_t>& order,
                                     const OptimizerOptions& optimizer, const std::string& what) {
  ASSERT_TRUE(worker.Train(order.data(), data.count, -1, optimizer, 0, 1, nullptr).ok());
  const int64_t before = g_allocations.load();
  t_counting = true;
  const absl::Status s = worker.Train(order.data(), data.count, -1, optimizer, 0, 1, nullptr);
  t_counting = false;
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(g_allocations.load() - before, 0) << "allocations during a sparse epoch " << what;
}
#endif

TEST(NoAllocationTest, SteadyStateStepAllocatesNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  Dataset data;
  data.count = 600;
  data.dense_dim = 784;
  data.num_classes = 10;
  data.dense.resize(data.count * data.dense_dim);
  data.labels.resize(data.count);
  for (int64_t i = 0; i < data.count * data.dense_dim; ++i) data.dense[i] = static_cast<float>((i * 7919) % 255) / 255.0f;
  for (int64_t i = 0; i < data.count; ++i) data.labels[i] = static_cast<int32_t>(i % 10);

  ModelOptions model;
  model.layers = {{"dense", 256, Activation::kRelu}, {"dense", 128, Activation::kRelu}, {"dense", 10, Activation::kNone}};
  auto vars = Model::Variables(model, DataShape::Of(data));
  ASSERT_TRUE(vars.ok()) << vars.status();
  OpenStoreOptions so;
  so.num_shards = 3;
  so.optimizer.type = OptimizerType::kAdam;
  auto store = ShmParamStore::Create(so, *vars);
  ASSERT_TRUE(store.ok()) << store.status();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto worker = Worker::Create(0, model, /*batch=*/128, data, store->get(), engine);
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::vector<int32_t> order(data.count);
  for (int64_t i = 0; i < data.count; ++i) order[i] = static_cast<int32_t>(i);

  OptimizerOptions opt = so.optimizer;
  PhaseTimes times;
  // Warm-up: oneDNN may set up per-thread state on first execution.
  ASSERT_TRUE((*worker)->Train(order.data(), data.count, 5, opt, 0, 0, &times).ok());
  t_counting = true;
  const absl::Status s = (*worker)->Train(order.data(), data.count, 25, opt, 0, 0, &times);
  t_counting = false;
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(g_allocations.load(), 0) << "allocations by Shardwild's code during 25 steady-state steps";
  // The interposer really sat between the layers and oneDNN: 3 layers run
  // forward, backward-weights and (except the first) backward-data.
  EXPECT_EQ(g_executes.load(), 25 * 8);
  std::printf("oneDNN allocated %ld times in %ld primitive executions (its own argument maps)\n",
              static_cast<long>(g_onednn_allocations.load()), static_cast<long>(g_executes.load()));
  // A padded last batch (600 = 4 x 128 + 88) is part of the steady state too.
  t_counting = true;
  const absl::Status s2 = (*worker)->Train(order.data(), data.count, -1, opt, 0, 1, &times);
  t_counting = false;
  ASSERT_TRUE(s2.ok()) << s2;
  EXPECT_EQ(g_allocations.load(), 0) << "allocations during an epoch with a padded batch";
#endif
}

// With replicas (ps.replication per_core) a step also reports to the
// ReplicatedStore, and every sync_every-th step averages the replicas on the
// worker's thread: neither allocates.
TEST(NoAllocationTest, ReplicaAveragingAllocatesNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  Dataset data;
  data.count = 256;
  data.dense_dim = 64;
  data.num_classes = 4;
  data.dense.assign(data.count * data.dense_dim, 0.5f);
  data.labels.resize(data.count);
  for (int64_t i = 0; i < data.count; ++i) data.labels[i] = static_cast<int32_t>(i % 4);
  ModelOptions model;
  model.layers = {{"dense", 32, Activation::kRelu}, {"dense", 4, Activation::kNone}};
  auto vars = Model::Variables(model, DataShape::Of(data));
  ASSERT_TRUE(vars.ok()) << vars.status();
  ReplicationPlan plan;
  plan.policy = ReplicationPolicy::kPerCore;
  plan.sync_every = 2;
  plan.replica_nodes = {0, 0};
  plan.worker_replica = {0, 1};
  OpenStoreOptions so;
  so.num_shards = 2;
  auto store = ReplicatedStore::Create(so, *vars, plan);
  ASSERT_TRUE(store.ok()) << store.status();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto worker = Worker::Create(0, model, /*batch=*/32, data, (*store)->ForWorker(0), engine);
  ASSERT_TRUE(worker.ok()) << worker.status();
  WorkerUpdateOptions update;
  update.replicas = store->get();
  (*worker)->set_update_options(update);
  std::vector<int32_t> order(data.count);
  for (int64_t i = 0; i < data.count; ++i) order[i] = static_cast<int32_t>(i);
  ASSERT_TRUE((*worker)->Train(order.data(), data.count, 4, so.optimizer, 0, 0, nullptr).ok());
  const int64_t before = g_allocations.load();
  t_counting = true;
  const absl::Status s = (*worker)->Train(order.data(), data.count, 20, so.optimizer, 0, 0, nullptr);
  t_counting = false;
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(g_allocations.load() - before, 0) << "allocations during 20 steps with 10 averagings";
  EXPECT_EQ((*store)->averagings(), 12);
#endif
}

// A sparse model's step (bags of ids pulled from and pushed to embedding
// tables, a dot interaction, towers on both sides) allocates nothing once
// its id buffers and the row scratch have seen the largest batch.
TEST(NoAllocationTest, SparseStepAllocatesNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  const Dataset data = testdata::TwoFieldSparseData(/*count=*/512, /*id_range=*/5000);
  const ModelOptions model = testdata::TwoTableDotModel(Pooling::kSum);
  std::vector<int32_t> order(data.count);
  for (int64_t i = 0; i < data.count; ++i) order[i] = static_cast<int32_t>(i);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  // The static table's rows are read in place (WorkerUpdateOptions::
  // rows_in_place): pushed under Adagrad, updated in place under SGD. The
  // dynamic table's are pulled and pushed.
  for (OptimizerType type : {OptimizerType::kAdagrad, OptimizerType::kSgd}) {
    SCOPED_TRACE(OptimizerTypeName(type));
    OpenStoreOptions so;
    so.num_shards = 2;
    so.optimizer.type = type;
    so.store.job_name = std::string("sw-noalloc-") + OptimizerTypeName(type);
    std::unique_ptr<ShmParamStore> store;
    std::unique_ptr<Worker> worker;
    ASSERT_NO_FATAL_FAILURE(OpenSparseWorker(model, data, so, /*batch=*/64, engine, &store, &worker));
    auto expect_warm_epoch_allocates_nothing = [&](const char* what) {
      ExpectWarmEpochAllocatesNothing(*worker, data, order, so.optimizer, what);
    };
    expect_warm_epoch_allocates_nothing("after a warm one");
    EXPECT_GT(worker->counters().rows_pulled.load(), 2 * data.count);
    // The same from the training set's packed ids (as a Job sets them).
    const std::optional<PackedRecords> packed = worker->model().PackRecords(data);
    ASSERT_TRUE(packed.has_value());
    worker->set_packed_records(&*packed);
    expect_warm_epoch_allocates_nothing("from packed ids");
    // With hot rows (ps.hot_rows): chosen and sized in the first epoch with
    // them; copying rows in, looking ids up and merging allocate nothing.
    if (type == OptimizerType::kSgd) {
      WorkerUpdateOptions u;
      u.hot_rows = 64;
      u.hot_rows_merge_every = 3;
      worker->set_update_options(u);
      expect_warm_epoch_allocates_nothing("with hot rows");
      EXPECT_GT(worker->hot_rows().rows_merged(), 0);
      // Turned off again: the copies go.
      u.hot_rows = 0;
      worker->set_update_options(u);
      EXPECT_TRUE(worker->hot_rows().empty());
    }
  }
#endif
}

// One lookup's ids in slots (the text and sparse_logreg configs' layout,
// which LoadBatch copies slot by slot, whole slots past each record's count,
// and the longer blocks after the slots to their count): bags of 0 to 34
// ids, not weighted, with weights after the ids and with weights coded in
// the ids' words, in slots of 64 bytes (most blocks after them) and of 128:
// once a warm epoch has grown the id buffers, none allocates.
TEST(NoAllocationTest, SlotLoadsAllocateNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  using testdata::BagWeights;
  for (BagWeights weights : {BagWeights::kDecimals, BagWeights::kReciprocals, BagWeights::kNone}) {
    const bool weighted = weights != BagWeights::kNone;
    SCOPED_TRACE(static_cast<int>(weights));
    // Bags of every length 0..34, in a scattered order.
    const Dataset data = testdata::OneBagData("features", 512, 2, 11, 20000, weights,
                                              [](int64_t r) { return (r * 13) % 35; });
    ModelOptions model;
    model.head = HeadType::kBinary;
    model.interaction = Interaction::kConcat;
    model.tables = {{"features", 1 << 16, 4, false, false, 0.1f}};
    model.sparse = {{"features", "features", Pooling::kSum, weighted}};
    model.layers = {{"dense", 1, Activation::kNone}};
    std::vector<int32_t> order(data.count);
    for (int64_t i = 0; i < data.count; ++i) order[i] = static_cast<int32_t>((i * 97) % data.count);
    OpenStoreOptions so;
    so.num_shards = 1;
    so.optimizer.type = OptimizerType::kAdagrad;
    so.store.job_name = absl::StrCat("sw-noalloc-slots-", static_cast<int>(weights));
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    std::unique_ptr<ShmParamStore> store;
    std::unique_ptr<Worker> worker;
    ASSERT_NO_FATAL_FAILURE(OpenSparseWorker(model, data, so, /*batch=*/32, engine, &store, &worker));
    for (int64_t stride_bytes : {64, 128}) {
      SCOPED_TRACE(stride_bytes);
      const std::optional<PackedRecords> packed = worker->model().PackRecords(data, stride_bytes);
      ASSERT_TRUE(packed.has_value());
      ASSERT_EQ(packed->stride_words * 8, stride_bytes);
      ASSERT_GT(packed->overflow_blocks, 0);
      ASSERT_EQ(packed->weight_codes[0].coded(), weights == BagWeights::kDecimals);
      worker->set_packed_records(&*packed);
      ExpectWarmEpochAllocatesNothing(*worker, data, order, so.optimizer, "from slots");
      worker->set_packed_records(nullptr);
    }
  }
#endif
}

// Records of bags of at most one id each, with dense values (the Criteo
// configs' layout, PackedRecords::kOneIdBags, which LoadBatch copies slot by
// slot, each bag's word at its count): once a warm epoch has grown the id
// buffers, a step from the packed records allocates nothing.
TEST(NoAllocationTest, OneIdLoadsAllocateNothing) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizers interpose the allocator";
#else
  Dataset data = testdata::TwoFieldSparseData(/*count=*/512, /*id_range=*/1000);
  for (SparseField& f : data.fields) {
    SparseField one;
    one.name = f.name;
    one.offsets.push_back(0);
    for (int64_t r = 0; r < data.count; ++r) {
      if (r % 5 != 0) one.ids.push_back(f.ids[f.offsets[r]]);  // every 5th record without
      one.offsets.push_back(static_cast<int64_t>(one.ids.size()));
    }
    f = std::move(one);
  }
  ModelOptions model = testdata::TwoTableDotModel(Pooling::kSum);
  model.tables[1].dynamic = false;  // narrow ids
  std::vector<int32_t> order(data.count);
  for (int64_t i = 0; i < data.count; ++i) order[i] = static_cast<int32_t>((i * 97) % data.count);
  OpenStoreOptions so;
  so.num_shards = 1;
  so.optimizer.type = OptimizerType::kAdagrad;
  so.store.job_name = "sw-noalloc-one-id";
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  std::unique_ptr<ShmParamStore> store;
  std::unique_ptr<Worker> worker;
  ASSERT_NO_FATAL_FAILURE(OpenSparseWorker(model, data, so, /*batch=*/32, engine, &store, &worker));
  const std::optional<PackedRecords> packed = worker->model().PackRecords(data);
  ASSERT_TRUE(packed.has_value());
  ASSERT_EQ(packed->slot_load, PackedRecords::SlotLoad::kOneIdBags);
  ASSERT_TRUE(packed->dense_in_block());
  worker->set_packed_records(&*packed);
  ExpectWarmEpochAllocatesNothing(*worker, data, order, so.optimizer, "from one-id slots");
  worker->set_packed_records(nullptr);
#endif
}

}  // namespace
}  // namespace shardwild
