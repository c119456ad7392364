// ps.update row_lock: the per-row seqlock keeps each row's parameters and
// optimizer slots together, under concurrent pushes and reads.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/base/sanitizers.h"
#include "core/model/optimizer.h"
#include "core/config/options.h"
#include "core/model/variable.h"
#include "gtest/gtest.h"
#include "ps_shm/embedding_table.h"
#include "ps_shm/param_store.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_store.h"

namespace shardwild {
namespace {

// Whole-variable snapshots each reader takes (every one checks 48 rows).
// ThreadSanitizer makes every atomic access ~20x slower, so it gets fewer.
#ifdef SHARDWILD_TSAN
constexpr int kReadsPerReader = 2000;
#else
constexpr int kReadsPerReader = 10000;
#endif

OpenStoreOptions Options(OptimizerType type, UpdateMode mode, int shards) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-rowlock";
  o.store.update = mode;
  o.optimizer.type = type;
  o.optimizer.lr = 0.01f;
  o.optimizer.momentum = 0.9f;
  o.seed = 3;
  o.num_shards = shards;
  return o;
}

std::unique_ptr<ShmParamStore> Make(const OpenStoreOptions& o, std::vector<VariableSpec> vars) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> s = ShmParamStore::Create(o, std::move(vars));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Every element of each row bit-equal to the row's first element.
bool RowsUniform(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t* bad_row) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 1; c < cols; ++c) {
      if (std::memcmp(&a[r * cols], &a[r * cols + c], sizeof(float)) != 0) {
        *bad_row = r;
        return false;
      }
    }
  }
  return true;
}

// 3 writers push momentum updates whose gradient is one value across each
// row but different for every push; 2 readers snapshot params and velocity
// with ReadRows (one of them also with Pull). The rows start equal (zeros),
// so in every consistent snapshot each row's params are all equal and its
// velocities are all equal; a torn row (half from one push, half from
// another) breaks that.
TEST(RowLockTest, NoTornRowUnderConcurrentPushesAndReads) {
  constexpr int64_t kRows = 48, kCols = 40;  // 40 floats: rows span cache lines
  constexpr int kWriters = 3, kReaders = 2;
  std::unique_ptr<ShmParamStore> store =
      Make(Options(OptimizerType::kMomentum, UpdateMode::kRowLock, /*shards=*/2),
           {VariableSpec{"w", kRows, kCols, InitKind::kZeros}});
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(store->update_mode(), UpdateMode::kRowLock);
  ASSERT_GT(store->layout().parts[0][1].size(), 0) << "the variable should span both shards";

  std::atomic<int> readers_done{0};
  std::atomic<int64_t> pushes{0};
  std::vector<std::thread> threads;
  std::vector<absl::Status> writer_status(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> grad(kRows * kCols);
      for (int64_t it = 0; readers_done.load(std::memory_order_relaxed) < kReaders || it < 50; ++it) {
        for (int64_t r = 0; r < kRows; ++r) {
          const float g = 0.5f + 0.125f * static_cast<float>((w * 7 + it * 3 + r) % 17);
          std::fill_n(grad.begin() + r * kCols, kCols, g);
        }
        const DenseGrad dg{0, grad.data()};
        absl::Status s = store->Push({&dg, 1}, 0.01f);
        if (!s.ok()) {
          writer_status[w] = s;
          return;
        }
        pushes.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::vector<int64_t> torn(kReaders, 0);
  std::vector<int64_t> first_bad(kReaders, -1);
  for (int rd = 0; rd < kReaders; ++rd) {
    threads.emplace_back([&, rd] {
      std::vector<float> params(kRows * kCols), velocity(kRows * kCols);
      float* slots[1] = {velocity.data()};
      for (int i = 0; i < kReadsPerReader; ++i) {
        int64_t bad = -1;
        if (rd == 1 && i % 2 == 1) {
          // Pull is row-consistent too (params only).
          const PullSlice sl{0, 0, kRows, params.data()};
          if (!store->Pull({&sl, 1}).ok() || !RowsUniform(params, kRows, kCols, &bad)) ++torn[rd];
        } else {
          if (!store->ReadRows(0, 0, kRows, params.data(), slots).ok() || !RowsUniform(params, kRows, kCols, &bad) ||
              !RowsUniform(velocity, kRows, kCols, &bad)) {
            ++torn[rd];
          }
        }
        if (bad >= 0 && first_bad[rd] < 0) first_bad[rd] = bad;
      }
      readers_done.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWriters; ++w) EXPECT_TRUE(writer_status[w].ok()) << writer_status[w];
  for (int rd = 0; rd < kReaders; ++rd) {
    EXPECT_EQ(torn[rd], 0) << "reader " << rd << " saw torn rows (first: row " << first_bad[rd] << ")";
  }
  EXPECT_GE(pushes.load(), kWriters * 50);
  EXPECT_EQ(store->version(), static_cast<uint64_t>(pushes.load()));

  // Quiescent: every row's sequence word is even again, so a final read
  // returns at once and is still uniform, and the rows really moved.
  std::vector<float> params(kRows * kCols), velocity(kRows * kCols);
  float* slots[1] = {velocity.data()};
  ASSERT_TRUE(store->ReadRows(0, 0, kRows, params.data(), slots).ok());
  int64_t bad = -1;
  EXPECT_TRUE(RowsUniform(params, kRows, kCols, &bad)) << bad;
  EXPECT_TRUE(RowsUniform(velocity, kRows, kCols, &bad)) << bad;
  for (int64_t r = 0; r < kRows; ++r) EXPECT_LT(params[r * kCols], 0.0f) << "row " << r;
}

// Single-threaded, row_lock and hogwild compute the same values: the seqlock
// changes when rows are updated, not what an update does.
TEST(RowLockTest, SameResultAsHogwildWithoutConcurrency) {
  const std::vector<VariableSpec> vars = {VariableSpec{"w", 13, 70, InitKind::kGlorotUniform, 13, 70},
                                          VariableSpec{"b", 5, 1, InitKind::kZeros}};
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam, OptimizerType::kFtrl}) {
    std::unique_ptr<ShmParamStore> locked = Make(Options(type, UpdateMode::kRowLock, 3), vars);
    std::unique_ptr<ShmParamStore> free = Make(Options(type, UpdateMode::kHogwild, 3), vars);
    ASSERT_NE(locked, nullptr);
    ASSERT_NE(free, nullptr);
    std::vector<float> g0(13 * 70), g1(5);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < g0.size(); ++i) g0[i] = std::sin(0.1f * i + step);
      for (size_t i = 0; i < g1.size(); ++i) g1[i] = std::cos(0.3f * i + step);
      const DenseGrad grads[2] = {{0, g0.data()}, {1, g1.data()}};
      ASSERT_TRUE(locked->Push(grads, 0.05f).ok());
      ASSERT_TRUE(free->Push(grads, 0.05f).ok());
    }
    const int nslots = NumSlots(type);
    for (int v = 0; v < 2; ++v) {
      const int64_t n = vars[v].size();
      std::vector<float> pa(n), pb(n);
      std::vector<std::vector<float>> sa(nslots, std::vector<float>(n)), sb(nslots, std::vector<float>(n));
      std::vector<float*> spa, spb;
      for (int k = 0; k < nslots; ++k) {
        spa.push_back(sa[k].data());
        spb.push_back(sb[k].data());
      }
      ASSERT_TRUE(locked->ReadRows(v, 0, vars[v].rows, pa.data(), spa).ok());
      ASSERT_TRUE(free->ReadRows(v, 0, vars[v].rows, pb.data(), spb).ok());
      EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), n * sizeof(float))) << OptimizerTypeName(type) << " var " << v;
      for (int k = 0; k < nslots; ++k) {
        EXPECT_EQ(0, std::memcmp(sa[k].data(), sb[k].data(), n * sizeof(float)))
            << OptimizerTypeName(type) << " var " << v << " slot " << k;
      }
      std::vector<float> pulled(n);
      ASSERT_TRUE(locked->PullVariable(v, pulled.data()).ok());
      EXPECT_EQ(0, std::memcmp(pa.data(), pulled.data(), n * sizeof(float)));
    }
  }
}

TEST(RowLockTest, ReadRowsReturnsASliceWithItsSlots) {
  // Momentum after one push from zero velocity: v = g, p = p0 - lr * g.
  const std::vector<VariableSpec> vars = {VariableSpec{"w", 9, 3, InitKind::kGlorotUniform, 9, 3}};
  std::unique_ptr<ShmParamStore> store = Make(Options(OptimizerType::kMomentum, UpdateMode::kRowLock, 2), vars);
  ASSERT_NE(store, nullptr);
  std::vector<float> p0(27);
  ASSERT_TRUE(store->PullVariable(0, p0.data()).ok());
  std::vector<float> g(27);
  for (int i = 0; i < 27; ++i) g[i] = 0.1f * i;
  const DenseGrad dg{0, g.data()};
  ASSERT_TRUE(store->Push({&dg, 1}, 0.5f).ok());
  // Rows [3, 8) cross the shard boundary (5 | 4).
  std::vector<float> p(15), v(15);
  float* slots[1] = {v.data()};
  ASSERT_TRUE(store->ReadRows(0, 3, 8, p.data(), slots).ok());
  for (int i = 0; i < 15; ++i) {
    EXPECT_FLOAT_EQ(v[i], g[9 + i]);
    EXPECT_FLOAT_EQ(p[i], p0[9 + i] - 0.5f * g[9 + i]);
  }
  // A nullptr slot is skipped; no slots at all is fine.
  float* none[1] = {nullptr};
  EXPECT_TRUE(store->ReadRows(0, 0, 9, p0.data(), none).ok());
  EXPECT_TRUE(store->ReadRows(0, 0, 9, p0.data(), {}).ok());
  // Errors.
  float* two[2] = {v.data(), v.data()};
  EXPECT_EQ(store->ReadRows(0, 0, 1, p.data(), two).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReadRows(1, 0, 1, p.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReadRows(0, 5, 10, p.data(), {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ReadRows(0, 4, 3, p.data(), {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RowLockTest, AttachedStoreFollowsTheCreatorsMode) {
  const std::vector<VariableSpec> vars = {VariableSpec{"w", 6, 4, InitKind::kZeros}};
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock, UpdateMode::kSync}) {
    OpenStoreOptions o = Options(OptimizerType::kSgd, mode, 2);
    std::unique_ptr<ShmParamStore> store = Make(o, vars);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->update_mode(), mode);
    absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), o.optimizer);
    ASSERT_TRUE(attached.ok()) << attached.status();
    EXPECT_EQ((*attached)->update_mode(), mode) << UpdateModeName(mode);
    // A push through the attached store is seen by the creator.
    std::vector<float> g(24, 1.0f);
    const DenseGrad dg{0, g.data()};
    ASSERT_TRUE((*attached)->Push({&dg, 1}, 0.5f).ok());
    std::vector<float> p(24);
    ASSERT_TRUE(store->PullVariable(0, p.data()).ok());
    for (float x : p) EXPECT_FLOAT_EQ(x, -0.5f);
  }
}

// ---- Embedding tables --------------------------------------------------------

TableSpec RowLockTable(const char* name, EmbeddingKind kind, int64_t capacity, CapacityPolicy on_full, int64_t dim) {
  TableSpec t;
  t.name = name;
  t.kind = kind;
  t.dim = dim;
  t.capacity = capacity;
  t.on_full = on_full;
  t.init.kind = RowInitializer::Kind::kZeros;
  return t;
}

// The same test for table rows: 3 writers push momentum updates to rows of
// a static, a dynamic and an LRU table (each row's gradient one value, a
// different one every push, ids repeated within a batch so deduplication
// sums them); 2 readers snapshot rows with PullRows and with ReadTableRow
// (params, velocity and update count together). Rows start at zero, so a
// consistent row has all-equal params and all-equal velocities.
TEST(RowLockTest, NoTornTableRowUnderConcurrentPushesAndReads) {
  constexpr int64_t kDim = 40, kIds = 24;
  constexpr int kWriters = 3, kReaders = 2;
#ifdef SHARDWILD_TSAN
  constexpr int kReads = 300;
#else
  constexpr int kReads = 3000;
#endif
  OpenStoreOptions o = Options(OptimizerType::kMomentum, UpdateMode::kRowLock, /*shards=*/2);
  o.tables = {RowLockTable("static", EmbeddingKind::kStatic, kIds, CapacityPolicy::kError, kDim),
              RowLockTable("dynamic", EmbeddingKind::kDynamic, 64, CapacityPolicy::kError, kDim),
              RowLockTable("lru", EmbeddingKind::kDynamic, 64, CapacityPolicy::kEvictLru, kDim)};
  std::unique_ptr<ShmParamStore> store = Make(o, {});
  ASSERT_NE(store, nullptr);
  for (int t = 0; t < 3; ++t) ASSERT_TRUE(store->table_shard(t, 0).options().row_lock) << t;

  std::vector<uint64_t> ids(kIds);
  for (int64_t i = 0; i < kIds; ++i) ids[i] = static_cast<uint64_t>(i);
  // Every row exists before the readers start.
  {
    RowScratch scratch;
    std::vector<float> out(kIds * kDim);
    for (int t = 0; t < 3; ++t) ASSERT_TRUE(store->PullRows(t, ids, out.data(), PullMode::kInsert, &scratch).ok());
  }
  std::atomic<int> readers_done{0};
  std::vector<absl::Status> writer_status(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      RowScratch scratch;
      // Each batch names every id twice (the second half repeats the first).
      std::vector<uint64_t> batch(2 * kIds);
      std::vector<float> grad(2 * kIds * kDim);
      for (int64_t it = 0; readers_done.load(std::memory_order_relaxed) < kReaders || it < 30; ++it) {
        for (int64_t i = 0; i < 2 * kIds; ++i) {
          batch[i] = ids[(i + w + it) % kIds];
          const float g = 0.5f + 0.125f * static_cast<float>((w * 7 + it * 3 + i) % 17);
          std::fill_n(grad.begin() + i * kDim, kDim, g);
        }
        for (int t = 0; t < 3; ++t) {
          if (absl::Status s = store->PushRows(t, batch, grad.data(), 0.01f, &scratch); !s.ok()) {
            writer_status[w] = s;
            return;
          }
        }
      }
    });
  }
  std::vector<int64_t> torn(kReaders, 0);
  std::vector<std::string> first_bad(kReaders);
  for (int rd = 0; rd < kReaders; ++rd) {
    threads.emplace_back([&, rd] {
      RowScratch scratch;
      std::vector<float> rows(kIds * kDim), params(kDim), velocity(kDim);
      float* slots[1] = {velocity.data()};
      int64_t bad = -1;
      for (int i = 0; i < kReads; ++i) {
        const int t = i % 3;
        bool ok = true;
        if (rd == 0) {
          ok = store->PullRows(t, ids, rows.data(), PullMode::kInsert, &scratch).ok() &&
               RowsUniform(rows, kIds, kDim, &bad);
        } else {
          const uint64_t id = ids[i % kIds];
          uint64_t count = 0;
          ok = store->ReadTableRow(t, id, params.data(), slots, &count).ok() && RowsUniform(params, 1, kDim, &bad) &&
               RowsUniform(velocity, 1, kDim, &bad);
        }
        if (!ok) {
          if (torn[rd]++ == 0) first_bad[rd] = absl::StrCat("table ", t, " read ", i, " row ", bad);
        }
      }
      readers_done.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < kWriters; ++w) EXPECT_TRUE(writer_status[w].ok()) << writer_status[w];
  for (int rd = 0; rd < kReaders; ++rd) EXPECT_EQ(torn[rd], 0) << "reader " << rd << ": " << first_bad[rd];
  // Quiescent: every row moved and is uniform; no LRU row was evicted (64 rows
  // of room for 24 ids).
  for (int t = 0; t < 3; ++t) {
    std::vector<float> params(kDim), velocity(kDim);
    float* slots[1] = {velocity.data()};
    for (uint64_t id : ids) {
      ASSERT_TRUE(store->ReadTableRow(t, id, params.data(), slots).ok());
      int64_t bad = -1;
      EXPECT_TRUE(RowsUniform(params, 1, kDim, &bad) && RowsUniform(velocity, 1, kDim, &bad)) << t << " " << id;
      EXPECT_LT(params[0], 0.0f) << "table " << t << " id " << id;
    }
  }
  EXPECT_EQ(store->table_shard(2, 0).evictions() + store->table_shard(2, 1).evictions(), 0);
}

// Without concurrency, row_lock and hogwild tables compute the same rows,
// slots and Adam step counts.
TEST(RowLockTest, TablesSameResultAsHogwildWithoutConcurrency) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdagrad, OptimizerType::kAdam, OptimizerType::kFtrl}) {
    std::unique_ptr<ShmParamStore> stores[2];
    for (int m = 0; m < 2; ++m) {
      OpenStoreOptions o = Options(type, m == 0 ? UpdateMode::kRowLock : UpdateMode::kHogwild, 3);
      TableSpec t = RowLockTable("t", EmbeddingKind::kDynamic, 100, CapacityPolicy::kError, 9);
      t.init.kind = RowInitializer::Kind::kNormal;
      o.tables = {t, RowLockTable("s", EmbeddingKind::kStatic, 30, CapacityPolicy::kError, 9)};
      stores[m] = Make(o, {});
      ASSERT_NE(stores[m], nullptr);
    }
    std::vector<uint64_t> ids = {3, 17, 3, 29, 0, 17, 8};
    std::vector<float> g(ids.size() * 9);
    for (int step = 0; step < 4; ++step) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * i + step);
      for (int m = 0; m < 2; ++m) {
        RowScratch scratch;
        for (int t = 0; t < 2; ++t) ASSERT_TRUE(stores[m]->PushRows(t, ids, g.data(), 0.05f, &scratch).ok());
      }
    }
    const int nslots = NumSlots(type);
    for (int t = 0; t < 2; ++t) {
      for (uint64_t id : ids) {
        std::vector<float> p[2], sl[2][4];
        uint64_t count[2];
        for (int m = 0; m < 2; ++m) {
          p[m].assign(9, 0);
          std::vector<float*> ptrs;
          for (int k = 0; k < nslots; ++k) {
            sl[m][k].assign(9, 0);
            ptrs.push_back(sl[m][k].data());
          }
          ASSERT_TRUE(stores[m]->ReadTableRow(t, id, p[m].data(), ptrs, &count[m]).ok());
        }
        EXPECT_EQ(p[0], p[1]) << OptimizerTypeName(type) << " table " << t << " id " << id;
        for (int k = 0; k < nslots; ++k) EXPECT_EQ(sl[0][k], sl[1][k]) << OptimizerTypeName(type) << " slot " << k;
        EXPECT_EQ(count[0], count[1]);
        if (type == OptimizerType::kAdam) {
          EXPECT_EQ(count[0], 4u) << "one Adam step per push of the id";
        }
      }
    }
    // ReadTableRow's errors.
    float buf[9];
    EXPECT_EQ(stores[0]->ReadTableRow(0, 5555, buf, {}).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(stores[0]->ReadTableRow(1, 30, buf, {}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(stores[0]->ReadTableRow(2, 1, buf, {}).code(), absl::StatusCode::kInvalidArgument);
  }
}

// An attached store's tables follow the creator's update mode; a table
// region whose row_lock flag disagrees with the shard's mode is refused.
TEST(RowLockTest, AttachedTablesFollowTheCreatorsMode) {
  OpenStoreOptions o = Options(OptimizerType::kSgd, UpdateMode::kRowLock, 2);
  o.tables = {RowLockTable("t", EmbeddingKind::kStatic, 10, CapacityPolicy::kError, 4)};
  std::unique_ptr<ShmParamStore> store = Make(o, {});
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), o.optimizer);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_TRUE((*attached)->table_shard(0, 1).options().row_lock);
  std::vector<uint64_t> ids = {7};
  std::vector<float> g(4, 1.0f), out(4);
  RowScratch scratch;
  ASSERT_TRUE((*attached)->PushRows(0, ids, g.data(), 0.5f, &scratch).ok());
  ASSERT_TRUE(store->PullRows(0, ids, out.data(), PullMode::kReadOnly, &scratch).ok());
  for (float x : out) EXPECT_FLOAT_EQ(x, -0.5f);
}

}  // namespace
}  // namespace shardwild
