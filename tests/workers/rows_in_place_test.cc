// The fused embedding path in a worker's step (WorkerUpdateOptions::
// rows_in_place): rows pooled from the store's memory and updated in place
// by the fused embedding-bag backward and SGD train the same model as rows
// pulled into a copy and pushed from a gradient buffer. Either way a step
// updates its rows inside the backward, before the dense push.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model/model.h"
#include "core/config/options.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "ps_shm/shm_store.h"
#include "workers/hot_rows.h"
#include "workers/job.h"
#include "tests/workers/sparse_test_util.h"
#include "workers/worker.h"

namespace shardwild {
namespace {

// testdata::TwoTableDotModel: a static table (in place under SGD), a
// dynamic one and a wide lookup (both always pulled).
struct SparseCase {
  Dataset data;
  ModelOptions model;
  std::vector<VariableSpec> variables;
  std::vector<TableSpec> tables;
};

// bf16_rows: table "ta" stores its parameters as bf16 (model.tables dtype).
SparseCase MakeCase(Pooling pooling, bool bf16_rows = false) {
  SparseCase c;
  c.data = testdata::TwoFieldSparseData(/*count=*/300, /*id_range=*/400);
  c.model = testdata::TwoTableDotModel(pooling);
  c.model.tables[0].bf16 = bf16_rows;
  auto spec = Model::Describe(c.model, DataShape::Of(c.data));
  EXPECT_TRUE(spec.ok()) << spec.status();
  c.variables = spec->variables;
  c.tables = TableSpecsOf(*spec);
  return c;
}

struct Trained {
  std::unique_ptr<ShmParamStore> store;
  PhaseTimes times;
  // WorkerUpdateOptions::hot_rows: the hot ids of table "ta", and the rows
  // the worker's merges wrote.
  std::vector<uint64_t> hot_ids;
  int64_t rows_merged = 0;
};

// Hot rows (ps.hot_rows) of a training run: how many per table, and the
// steps between merges.
struct Hot {
  int64_t rows = 0;
  int merge_every = 32;
};

// The store of every test here: plain SGD at lr 0.2, its rows updated by
// `sparse` (SGD: the rows go in place and are updated there; an optimizer
// with slots: they are read in place and pushed).
OpenStoreOptions StoreOptions(const SparseCase& c, const char* job_name, int shards,
                              OptimizerType sparse = OptimizerType::kSgd) {
  OpenStoreOptions so;
  so.store.job_name = job_name;
  so.num_shards = shards;
  so.optimizer.type = OptimizerType::kSgd;
  so.optimizer.lr = 0.2f;
  OptimizerOptions rows = so.optimizer;
  rows.type = sparse;
  so.sparse_optimizer = rows;
  so.tables = c.tables;
  so.seed = 5;
  return so;
}

Trained Train(const SparseCase& c, bool in_place, int shards, int epochs = 2, Hot hot = {},
              OptimizerType sparse = OptimizerType::kSgd) {
  Trained out;
  const OpenStoreOptions so = StoreOptions(
      c, epochs == 0 ? "sw-inplace-0" : hot.rows > 0 ? "sw-inplace-h" : in_place ? "sw-inplace-a" : "sw-inplace-b",
      shards, sparse);
  auto store = ShmParamStore::Create(so, c.variables);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return out;
  out.store = *std::move(store);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto worker = Worker::Create(0, c.model, /*batch=*/32, c.data, out.store.get(), engine, /*seed=*/3);
  EXPECT_TRUE(worker.ok()) << worker.status();
  if (!worker.ok()) return out;
  WorkerUpdateOptions u;
  u.rows_in_place = in_place;
  u.hot_rows = hot.rows;
  u.hot_rows_merge_every = hot.merge_every;
  (*worker)->set_update_options(u);
  std::vector<int32_t> order(c.data.count);
  for (int64_t i = 0; i < c.data.count; ++i) order[i] = static_cast<int32_t>((i * 37) % c.data.count);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    const absl::Status s = (*worker)->Train(order.data(), c.data.count, -1, so.optimizer, 0, 1, &out.times);
    EXPECT_TRUE(s.ok()) << s;
  }
  for (size_t t = 0; t < out.store->layout().tables.size(); ++t) {
    if (out.store->layout().tables[t].name == "ta") out.hot_ids = (*worker)->hot_rows().ids(static_cast<int>(t));
    if (out.store->layout().tables[t].name == "tb") {
      EXPECT_TRUE((*worker)->hot_rows().ids(static_cast<int>(t)).empty()) << "a dynamic table has no hot rows";
    }
  }
  out.rows_merged = (*worker)->hot_rows().rows_merged();
  // Evaluation pulls rows into the copy again, whatever training did.
  absl::StatusOr<EvalResult> eval = (*worker)->Evaluate(c.data, 0, c.data.count);
  EXPECT_TRUE(eval.ok()) << eval.status();
  return out;
}

// The two stores' variables and rows are equal within `tolerance` of the
// second's (relative, plus as much absolute); 0: bit for bit.
void ExpectSameModel(ShmParamStore& a, ShmParamStore& b, ShmParamStore& untrained, float tolerance = 1e-4f) {
  const StoreLayout& layout = a.layout();
  for (int v = 0; v < static_cast<int>(layout.variables.size()); ++v) {
    std::vector<float> pa(layout.variables[v].size()), pb(layout.variables[v].size());
    ASSERT_TRUE(a.PullVariable(v, pa.data()).ok());
    ASSERT_TRUE(b.PullVariable(v, pb.data()).ok());
    for (size_t i = 0; i < pa.size(); ++i) {
      ASSERT_NEAR(pa[i], pb[i], tolerance * (1 + std::abs(pb[i]))) << layout.variables[v].name << "[" << i << "]";
    }
  }
  RowScratch scratch;
  for (int t = 0; t < static_cast<int>(layout.tables.size()); ++t) {
    std::vector<uint64_t> ids;
    for (uint64_t id = 0; id < 400; ++id) ids.push_back(layout.tables[t].kind == EmbeddingKind::kStatic
                                                            ? id % static_cast<uint64_t>(layout.tables[t].capacity)
                                                            : id);
    const int64_t dim = layout.tables[t].dim;
    std::vector<float> ra(ids.size() * dim), rb(ids.size() * dim);
    ASSERT_TRUE(a.PullRows(t, ids, ra.data(), PullMode::kReadOnly, &scratch).ok());
    ASSERT_TRUE(b.PullRows(t, ids, rb.data(), PullMode::kReadOnly, &scratch).ok());
    int64_t moved = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
      ASSERT_NEAR(ra[i], rb[i], tolerance * (1 + std::abs(rb[i]))) << layout.tables[t].name << " value " << i;
    }
    // The rows did train (the comparison is not of untouched tables).
    std::vector<float> initial(ids.size() * dim);
    ASSERT_TRUE(untrained.PullRows(t, ids, initial.data(), PullMode::kReadOnly, &scratch).ok());
    for (size_t i = 0; i < ra.size(); ++i) moved += ra[i] != initial[i];
    EXPECT_GT(moved, 0) << layout.tables[t].name;
  }
}

TEST(RowsInPlaceTest, TrainsTheModelThatPulledRowsTrain) {
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    for (int shards : {1, 2, 3}) {
      SCOPED_TRACE(std::string(pooling == Pooling::kSum ? "sum" : "mean") + ", " + std::to_string(shards) +
                   " shards");
      const SparseCase c = MakeCase(pooling);
      Trained in_place = Train(c, /*in_place=*/true, shards);
      Trained pulled = Train(c, /*in_place=*/false, shards);
      ASSERT_NE(in_place.store, nullptr);
      ASSERT_NE(pulled.store, nullptr);
      // The static table went in place (its pooling timed in the forward),
      // the other path never did.
      EXPECT_GT(in_place.times.rows_in_forward, 0.0);
      EXPECT_EQ(pulled.times.rows_in_forward, 0.0);
      Trained untrained = Train(c, /*in_place=*/false, shards, /*epochs=*/0);
      ASSERT_NE(untrained.store, nullptr);
      ExpectSameModel(*in_place.store, *pulled.store, *untrained.store);
    }
  }
}

// Under an optimizer with slots the static table's rows are read in place
// (the forward pools them from the store's memory, no pulled copy) and
// their gradients pushed: with one worker, the very model that pulled rows
// train, bit for bit. A fused SGD step in place would differ (its step is
// not the optimizer's), as would a push of rows that also moved in place.
// A bf16 table's rows are widened by the pooling as by the pull, and pushed
// with the same stochastic rounding.
TEST(RowsInPlaceTest, RowsReadInPlaceUnderSlotsTrainTheModelThatPulledRowsTrain) {
  struct Case {
    OptimizerType sparse;
    bool bf16_rows;
  };
  for (const Case& k : {Case{OptimizerType::kAdagrad, false}, Case{OptimizerType::kFtrl, false},
                        Case{OptimizerType::kAdam, false}, Case{OptimizerType::kMomentum, false},
                        Case{OptimizerType::kAdagrad, true}}) {
    const OptimizerType sparse = k.sparse;
    for (int shards : {1, 2, 3}) {
      SCOPED_TRACE(std::string(OptimizerTypeName(sparse)) + (k.bf16_rows ? ", bf16 rows, " : ", ") +
                   std::to_string(shards) + " shards");
      const SparseCase c = MakeCase(Pooling::kMean, k.bf16_rows);
      Trained in_place = Train(c, /*in_place=*/true, shards, /*epochs=*/2, Hot{}, sparse);
      Trained pulled = Train(c, /*in_place=*/false, shards, /*epochs=*/2, Hot{}, sparse);
      ASSERT_NE(in_place.store, nullptr);
      ASSERT_NE(pulled.store, nullptr);
      EXPECT_GT(in_place.times.rows_in_forward, 0.0) << "the static table's rows were read in place";
      EXPECT_EQ(pulled.times.rows_in_forward, 0.0);
      Trained untrained = Train(c, /*in_place=*/false, shards, /*epochs=*/0, Hot{}, sparse);
      ASSERT_NE(untrained.store, nullptr);
      ExpectSameModel(*in_place.store, *pulled.store, *untrained.store, /*tolerance=*/0.0f);
      // Hot rows are copies for the fused SGD only: asked for here, the
      // worker reads the store's rows all the same.
      Trained hot = Train(c, /*in_place=*/true, shards, /*epochs=*/2, Hot{.rows = 64, .merge_every = 3}, sparse);
      ASSERT_NE(hot.store, nullptr);
      EXPECT_TRUE(hot.hot_ids.empty()) << "no copies chosen for rows the fused SGD does not update";
      EXPECT_EQ(hot.rows_merged, 0);
      ExpectSameModel(*hot.store, *pulled.store, *untrained.store, /*tolerance=*/0.0f);
    }
  }
}

// TwoFieldSparseData with field "a" skewed: every record holds id 7, record
// r also r % 5 and 100 + r (so ids 0..4 are in a fifth of the records each,
// and the rest in one).
SparseCase MakeSkewedCase(Pooling pooling) {
  SparseCase c = MakeCase(pooling);
  SparseField& a = c.data.fields[0];
  EXPECT_EQ(a.name, "a");
  a.ids.clear();
  a.offsets.assign(1, 0);
  for (int64_t r = 0; r < c.data.count; ++r) {
    for (uint64_t id : {uint64_t{7}, static_cast<uint64_t>(r % 5), static_cast<uint64_t>(100 + r)}) a.ids.push_back(id);
    a.offsets.push_back(static_cast<int64_t>(a.ids.size()));
  }
  return c;
}

// ps.hot_rows: the worker's own copies of the most frequent rows of the
// table read in place, merged into the store every few steps and when a
// training call returns, train the same model as the store's rows: with one
// worker the merges only move the copies' values into the store.
TEST(HotRowsTest, TrainTheModelThatTheStoresRowsTrain) {
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    SCOPED_TRACE(pooling == Pooling::kSum ? "sum" : "mean");
    const SparseCase c = MakeSkewedCase(pooling);
    Trained hot = Train(c, /*in_place=*/true, /*shards=*/2, /*epochs=*/2, Hot{6, 4});
    Trained plain = Train(c, /*in_place=*/true, /*shards=*/2);
    ASSERT_NE(hot.store, nullptr);
    ASSERT_NE(plain.store, nullptr);
    // The 6 most frequent ids of "a", the table read in place: 7 (every
    // record), then 0..4 (a fifth each; ties go to the smaller id).
    EXPECT_EQ(hot.hot_ids, (std::vector<uint64_t>{7, 0, 1, 2, 3, 4}));
    // 10 steps a call (300 records, batch 32), each of its periods (steps
    // 1-4, 5-8, 9-10) using all 6: merged after steps 4 and 8 and when the
    // call returns, in both calls.
    EXPECT_EQ(hot.rows_merged, 6 * 3 * 2);
    Trained untrained = Train(c, /*in_place=*/false, 2, /*epochs=*/0);
    ASSERT_NE(untrained.store, nullptr);
    ExpectSameModel(*hot.store, *plain.store, *untrained.store);
  }
}

// HotRows on its own: a hot row's address becomes the copy's, filled from
// the store's row on its first use; a merge adds the copy's change to the
// store's row as it is then (another worker's update in between is kept);
// the next use copies the merged row in again. Ids that are not hot keep
// the store's address.
TEST(HotRowsTest, MergesTheCopysChangeIntoTheRowAsItIsThen) {
  const SparseCase c = MakeSkewedCase(Pooling::kSum);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  auto model = Model::Create(c.model, DataShape::Of(c.data), /*batch=*/16, engine, /*seed=*/3);
  ASSERT_TRUE(model.ok()) << model.status();
  StoreLayout layout;
  layout.tables = c.tables;
  int ta = -1;
  for (size_t t = 0; t < layout.tables.size(); ++t) {
    if (layout.tables[t].name == "ta") ta = static_cast<int>(t);
  }
  ASSERT_GE(ta, 0);
  HotRows hot;
  // Tables the store would not update in place with the fused SGD get none.
  hot.Choose(**model, c.data, layout, /*count=*/2, [](int) { return false; });
  EXPECT_TRUE(hot.empty());
  EXPECT_TRUE(hot.ids(ta).empty());
  hot.Choose(**model, c.data, layout, /*count=*/2, [ta](int table) { return table == ta; });
  ASSERT_EQ(hot.ids(ta), (std::vector<uint64_t>{7, 0}));
  const int64_t dim = layout.tables[ta].dim;
  std::vector<float> table(10 * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.25f * static_cast<float>(i);
  const std::vector<float> start = table;
  auto row = [&](uint64_t id) { return table.data() + id * dim; };
  const std::vector<uint64_t> ids = {3, 7, 0, 7};
  std::vector<float*> addresses;
  for (uint64_t id : ids) addresses.push_back(row(id));
  hot.Redirect(ta, ids, addresses.data());
  EXPECT_EQ(addresses[0], row(3));
  ASSERT_NE(addresses[1], row(7));
  EXPECT_EQ(addresses[3], addresses[1]) << "one copy per row";
  ASSERT_NE(addresses[2], row(0));
  for (int64_t j = 0; j < dim; ++j) {
    EXPECT_EQ(addresses[1][j], row(7)[j]);
    EXPECT_EQ(addresses[2][j], row(0)[j]);
  }
  // This worker's updates to its copies; another's to the store's rows.
  for (int64_t j = 0; j < dim; ++j) {
    addresses[1][j] += 1.0f;
    addresses[2][j] -= 2.0f;
    row(7)[j] += 0.5f;
  }
  hot.Merge();
  EXPECT_EQ(hot.rows_merged(), 2);
  for (int64_t j = 0; j < dim; ++j) {
    EXPECT_EQ(row(7)[j], start[7 * dim + j] + 0.5f + 1.0f) << j;
    EXPECT_EQ(row(0)[j], start[j] - 2.0f) << j;
    EXPECT_EQ(row(3)[j], start[3 * dim + j]) << j;
  }
  // Changed in the store after the merge: the next use copies it in.
  row(0)[0] = 100.0f;
  std::vector<float*> again = {row(0)};
  hot.Redirect(ta, absl::MakeConstSpan(ids).subspan(2, 1), again.data());
  ASSERT_NE(again[0], row(0));
  EXPECT_EQ(again[0][0], 100.0f);
  hot.Merge();
  EXPECT_EQ(row(0)[0], 100.0f) << "an unchanged copy merges nothing";
  EXPECT_EQ(hot.rows_merged(), 3);
}

// Forwards to a ShmParamStore and records a worker's store calls: 'P' for a
// step's row pull (PullRowsBatch), 'R' for its row push (PushRowsBatch), 'D'
// for its dense push (Push or PushPull). At each 'P' and 'D' it also copies
// every row of static table "ta" (the one that goes in place).
class StepOrderStore final : public ParamStore {
 public:
  explicit StepOrderStore(ShmParamStore* base) : base_(base) {
    for (size_t t = 0; t < base->layout().tables.size(); ++t) {
      if (base->layout().tables[t].name == "ta") table_ = static_cast<int>(t);
    }
    for (uint64_t id = 0; id < static_cast<uint64_t>(base->layout().tables[table_].capacity); ++id) ids_.push_back(id);
  }
  const StoreLayout& layout() const override { return base_->layout(); }
  const std::string& name() const override { return base_->name(); }
  uint64_t version() const override { return base_->version(); }
  absl::Status Pull(absl::Span<const PullSlice> slices) override { return base_->Pull(slices); }
  absl::Status Push(absl::Span<const DenseGrad> grads, float lr) override {
    Record('D');
    return base_->Push(grads, lr);
  }
  absl::Status PushPull(absl::Span<const DenseGrad> grads, float lr, absl::Span<const PullSlice> pulls) override {
    Record('D');
    return base_->PushPull(grads, lr, pulls);
  }
  absl::Status PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                        RowScratch* scratch) override {
    return base_->PullRows(table, ids, out, mode, scratch);
  }
  absl::Status PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                        RowScratch* scratch) override {
    return base_->PushRows(table, ids, grads, lr, scratch);
  }
  absl::Status PullRowsBatch(absl::Span<const RowPull> parts, PullMode mode, RowScratch* scratch) override {
    Record('P');
    return base_->PullRowsBatch(parts, mode, scratch);
  }
  absl::Status PushRowsBatch(absl::Span<const RowGrad> parts, float lr, RowScratch* scratch) override {
    events_ += 'R';
    return base_->PushRowsBatch(parts, lr, scratch);
  }
  absl::StatusOr<RowsInPlace> RowAddresses(int table, absl::Span<const uint64_t> ids, float** out) override {
    return base_->RowAddresses(table, ids, out);
  }

  const std::string& events() const { return events_; }
  // The copies of table "ta", one per 'P' and 'D' in events() order.
  const std::vector<std::vector<float>>& snapshots() const { return snapshots_; }

 private:
  void Record(char event) {
    events_ += event;
    std::vector<float> rows(ids_.size() * base_->layout().tables[table_].dim);
    RowScratch scratch;
    EXPECT_TRUE(base_->PullRows(table_, ids_, rows.data(), PullMode::kReadOnly, &scratch).ok());
    snapshots_.push_back(std::move(rows));
  }

  ShmParamStore* base_;
  int table_ = 0;
  std::vector<uint64_t> ids_;
  std::string events_;
  std::vector<std::vector<float>> snapshots_;
};

// A step's rows are updated as soon as the backward has their gradients,
// before the dense push (their lines are still in the caches then), and only
// once: nothing moves them between the dense push and the next step.
TEST(RowsInPlaceTest, RowsAreUpdatedOnceBeforeTheDensePush) {
  const SparseCase c = MakeCase(Pooling::kSum);
  for (bool in_place : {true, false}) {
    SCOPED_TRACE(in_place ? "in place" : "pulled");
    const OpenStoreOptions so = StoreOptions(c, "sw-inplace-order", /*shards=*/2);
    auto store = ShmParamStore::Create(so, c.variables);
    ASSERT_TRUE(store.ok()) << store.status();
    StepOrderStore recorder(store->get());
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    auto worker = Worker::Create(0, c.model, /*batch=*/32, c.data, &recorder, engine, /*seed=*/3);
    ASSERT_TRUE(worker.ok()) << worker.status();
    WorkerUpdateOptions u;
    u.rows_in_place = in_place;
    (*worker)->set_update_options(u);
    std::vector<int32_t> order(c.data.count);
    for (int64_t i = 0; i < c.data.count; ++i) order[i] = static_cast<int32_t>(i);
    PhaseTimes times;
    constexpr int kSteps = 3;
    ASSERT_TRUE((*worker)->Train(order.data(), c.data.count, kSteps, so.optimizer, 0, 1, &times).ok());
    // Per step: the rows of the dynamic table and the wide lookup pulled, then
    // pushed, then the dense push.
    EXPECT_EQ(recorder.events(), "PRDPRDPRD");
    ASSERT_EQ(recorder.snapshots().size(), 2u * kSteps);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float>& pulled = recorder.snapshots()[2 * step];
      const std::vector<float>& at_dense_push = recorder.snapshots()[2 * step + 1];
      EXPECT_TRUE(pulled != at_dense_push) << "step " << step << ": the static table's rows had not moved yet";
      if (step + 1 < kSteps) {
        EXPECT_TRUE(at_dense_push == recorder.snapshots()[2 * step + 2])
            << "step " << step << ": the rows moved after the dense push";
      }
    }
    EXPECT_GT(times.push_rows, 0.0);
    EXPECT_EQ(times.rows_in_forward > 0.0, in_place);
  }
}

}  // namespace
}  // namespace shardwild
