#include "ps_shm/shm_store.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/config/options.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"
#include "core/model/partitioner.h"
#include "core/model/variable.h"
#include "gtest/gtest.h"
#include "ps_shm/memory_placer.h"
#include "ps_shm/param_store.h"
#include "ps_shm/push_chunks.h"
#include "ps_shm/shard_format.h"
#include "ps_shm/shm_segment.h"

namespace shardwild {
namespace {

// Succeeds if the message of `status` contains every one of `parts`.
::testing::AssertionResult MessageContains(const absl::Status& status,
                                           std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

// The variables most tests use: a 13x4 Glorot kernel and a 4-row bias, so
// that over 5 shards the kernel splits 3,3,3,2,2 and the bias leaves shard 4
// empty.
std::vector<VariableSpec> TestVariables() {
  return {
      VariableSpec{"w", 13, 4, InitKind::kGlorotUniform, 13, 4},
      VariableSpec{"b", 4, 1, InitKind::kZeros},
  };
}

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.type = OptimizerType::kSgd;
  return o;
}

OpenStoreOptions StoreOptionsFor(const OptimizerOptions& optimizer, int num_shards, uint64_t seed = 7) {
  OpenStoreOptions o;
  o.store.job_name = "swtest-store";
  o.optimizer = optimizer;
  o.seed = seed;
  o.num_shards = num_shards;
  return o;
}

std::vector<float> InitialValue(const VariableSpec& spec, uint64_t seed) {
  std::vector<float> v(spec.size());
  FillInitialValue(spec, seed, v.data());
  return v;
}

std::vector<float> PullAll(ParamStore& store, int var) {
  std::vector<float> out(store.layout().variables[var].size(), std::nanf(""));
  const absl::Status s = store.PullVariable(var, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Bit-for-bit equality of two float vectors (so that NaN or -0 differences
// are not hidden by ==).
::testing::AssertionResult BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::unique_ptr<ShmParamStore> MakeStore(const OpenStoreOptions& options,
                                         std::vector<VariableSpec> variables = TestVariables()) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(options, std::move(variables));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

// ---- Layout and initial values ---------------------------------------------

TEST(ShmStoreTest, LayoutFollowsTheDivRule) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5));
  ASSERT_NE(store, nullptr);
  const StoreLayout& l = store->layout();
  EXPECT_EQ(l.num_shards, 5);
  ASSERT_EQ(l.variables.size(), 2u);
  EXPECT_EQ(l.variables[0].name, "w");
  EXPECT_EQ(l.variables[1].name, "b");
  ASSERT_EQ(l.parts.size(), 2u);
  ASSERT_EQ(l.parts[0].size(), 5u);
  ASSERT_EQ(l.parts[1].size(), 5u);

  const std::vector<int64_t> w_sizes = {3, 3, 3, 2, 2};
  const std::vector<int64_t> b_sizes = {1, 1, 1, 1, 0};
  int64_t w_begin = 0, b_begin = 0;
  for (int s = 0; s < 5; ++s) {
    SCOPED_TRACE(absl::StrCat("shard ", s));
    EXPECT_EQ(l.parts[0][s].begin, w_begin);
    EXPECT_EQ(l.parts[0][s].size(), w_sizes[s]);
    EXPECT_EQ(l.parts[1][s].begin, b_begin);
    EXPECT_EQ(l.parts[1][s].size(), b_sizes[s]);
    w_begin += w_sizes[s];
    b_begin += b_sizes[s];
  }
  EXPECT_EQ(l.shard_nodes, std::vector<int>(5, 0));
  EXPECT_EQ(store->version(), 0u);
  EXPECT_GT(store->total_bytes(), 0u);
  for (int s = 0; s < 5; ++s) EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(store->name(), "-s", s)));
  EXPECT_FALSE(ShmSegment::Exists(absl::StrCat(store->name(), "-s5")));
}

TEST(ShmStoreTest, StoreNameCarriesTheJobName) {
  std::unique_ptr<ShmParamStore> a = MakeStore(StoreOptionsFor(Sgd(), 2));
  std::unique_ptr<ShmParamStore> b = MakeStore(StoreOptionsFor(Sgd(), 2));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->name().rfind("swtest-store-", 0), 0u) << a->name();
  EXPECT_NE(a->name(), b->name());
}

TEST(ShmStoreTest, PullVariableReturnsTheInitialValueBitForBit) {
  const OpenStoreOptions options = StoreOptionsFor(Sgd(), 5, /*seed=*/123);
  std::unique_ptr<ShmParamStore> store = MakeStore(options);
  ASSERT_NE(store, nullptr);
  const std::vector<VariableSpec> vars = TestVariables();
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) {
    SCOPED_TRACE(vars[v].name);
    EXPECT_TRUE(BitEqual(PullAll(*store, v), InitialValue(vars[v], 123)));
  }
  // The kernel is not trivially zero.
  const std::vector<float> w = PullAll(*store, 0);
  EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](float x) { return x != 0; }));
}

TEST(ShmStoreTest, SameSeedGivesIdenticalStoresWhateverTheShardCount) {
  std::unique_ptr<ShmParamStore> a = MakeStore(StoreOptionsFor(Sgd(), 5, /*seed=*/9));
  std::unique_ptr<ShmParamStore> b = MakeStore(StoreOptionsFor(Sgd(), 5, /*seed=*/9));
  std::unique_ptr<ShmParamStore> c = MakeStore(StoreOptionsFor(Sgd(), 2, /*seed=*/9));
  std::unique_ptr<ShmParamStore> d = MakeStore(StoreOptionsFor(Sgd(), 5, /*seed=*/10));
  ASSERT_TRUE(a && b && c && d);
  EXPECT_TRUE(BitEqual(PullAll(*a, 0), PullAll(*b, 0)));
  EXPECT_TRUE(BitEqual(PullAll(*a, 0), PullAll(*c, 0)));
  EXPECT_FALSE(BitEqual(PullAll(*a, 0), PullAll(*d, 0)));
}

TEST(ShmStoreTest, PullOfRowsAcrossShardBoundaries) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5, /*seed=*/5));
  ASSERT_NE(store, nullptr);
  const VariableSpec w = TestVariables()[0];
  const std::vector<float> init = InitialValue(w, 5);
  // Every sub-range, including empty ones and ones inside a single shard.
  for (int64_t begin = 0; begin <= w.rows; ++begin) {
    for (int64_t end = begin; end <= w.rows; ++end) {
      SCOPED_TRACE(absl::StrCat("rows [", begin, ", ", end, ")"));
      std::vector<float> out((end - begin) * w.cols + 1, -7.0f);
      const PullSlice slice{0, begin, end, out.data()};
      ASSERT_TRUE(store->Pull({&slice, 1}).ok());
      const std::vector<float> want(init.begin() + begin * w.cols, init.begin() + end * w.cols);
      EXPECT_TRUE(BitEqual(std::vector<float>(out.begin(), out.end() - 1), want));
      EXPECT_EQ(out.back(), -7.0f) << "wrote past the slice";
    }
  }
}

TEST(ShmStoreTest, PullOfSeveralSlicesAtOnce) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 3, /*seed=*/5));
  ASSERT_NE(store, nullptr);
  const std::vector<VariableSpec> vars = TestVariables();
  std::vector<float> w(2 * 4), b(3);
  const PullSlice slices[] = {{0, 4, 6, w.data()}, {1, 1, 4, b.data()}};
  ASSERT_TRUE(store->Pull(slices).ok());
  const std::vector<float> w_init = InitialValue(vars[0], 5);
  EXPECT_TRUE(BitEqual(w, std::vector<float>(w_init.begin() + 16, w_init.begin() + 24)));
  EXPECT_TRUE(BitEqual(b, std::vector<float>(3, 0.0f)));
}

TEST(ShmStoreTest, OpenCreatesAShmStore) {
  absl::StatusOr<std::unique_ptr<ParamStore>> store = ParamStore::Open(StoreOptionsFor(Sgd(), 2), TestVariables());
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_NE(dynamic_cast<ShmParamStore*>(store->get()), nullptr);
  EXPECT_EQ((*store)->layout().num_shards, 2);
  EXPECT_TRUE(ShmSegment::Exists((*store)->name() + "-s0"));
}

TEST(ShmStoreTest, CreateRejectsBadOptionsAndVariables) {
  {
    OpenStoreOptions o = StoreOptionsFor(Sgd(), 0);
    EXPECT_EQ(ShmParamStore::Create(o, TestVariables()).status().code(), absl::StatusCode::kInvalidArgument);
    o.num_shards = 4097;
    EXPECT_EQ(ShmParamStore::Create(o, TestVariables()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    OpenStoreOptions o = StoreOptionsFor(Sgd(), 1);
    o.store.job_name = "bad/name";
    EXPECT_EQ(ShmParamStore::Create(o, TestVariables()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    OpenStoreOptions o = StoreOptionsFor(Sgd(), 1);
    o.optimizer.lr = -1;
    EXPECT_EQ(ShmParamStore::Create(o, TestVariables()).status().code(), absl::StatusCode::kInvalidArgument);
  }
  const OpenStoreOptions o = StoreOptionsFor(Sgd(), 1);
  EXPECT_EQ(ShmParamStore::Create(o, {VariableSpec{"", 1, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmParamStore::Create(o, {VariableSpec{"x", 0, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmParamStore::Create(o, {VariableSpec{"x", 1, 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmParamStore::Create(o, {VariableSpec{std::string(kMaxNameBytes, 'n'), 1, 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Push ------------------------------------------------------------------

// A gradient whose every element differs, so that a row or shard mix-up shows.
std::vector<float> Ramp(int64_t n, float scale, float offset) {
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = offset + scale * static_cast<float>((i * 7) % 11 - 5);
  return g;
}

TEST(ShmStoreTest, SgdPushMovesParamsByMinusLrTimesGrad) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5, /*seed=*/3));
  ASSERT_NE(store, nullptr);
  const std::vector<VariableSpec> vars = TestVariables();
  std::vector<float> w_ref = InitialValue(vars[0], 3);
  std::vector<float> b_ref = InitialValue(vars[1], 3);
  const float lr = 0.05f;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> gw = Ramp(vars[0].size(), 0.25f, static_cast<float>(step));
    const std::vector<float> gb = Ramp(vars[1].size(), -0.5f, 1.0f);
    const DenseGrad grads[] = {{0, gw.data()}, {1, gb.data()}};
    ASSERT_TRUE(store->Push(grads, lr).ok());
    EXPECT_EQ(store->version(), static_cast<uint64_t>(step + 1));
    for (size_t i = 0; i < w_ref.size(); ++i) w_ref[i] -= lr * gw[i];
    for (size_t i = 0; i < b_ref.size(); ++i) b_ref[i] -= lr * gb[i];
    EXPECT_TRUE(BitEqual(PullAll(*store, 0), w_ref)) << "step " << step;
    EXPECT_TRUE(BitEqual(PullAll(*store, 1), b_ref)) << "step " << step;
  }
}

TEST(ShmStoreTest, VersionCountsPushes) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5));
  ASSERT_NE(store, nullptr);
  const std::vector<float> gw(13 * 4, 1.0f), gb(4, 1.0f);
  const DenseGrad w_only{0, gw.data()};
  const DenseGrad b_only{1, gb.data()};
  for (uint64_t i = 1; i <= 10; ++i) {
    ASSERT_TRUE(store->Push({i % 2 ? &w_only : &b_only, 1}, 0.01f).ok());
    EXPECT_EQ(store->version(), i);
  }
  // Shard 4 holds no rows of "b", so only the 5 pushes of "w" reached it.
  EXPECT_EQ(store->shard_version(0), 10u);
  EXPECT_EQ(store->shard_version(4), 5u);
}

// Textbook Adam in double precision, in the "epsilon hat" form documented in
// core/model/optimizer.h, with t counted per parameter from 1.
class ReferenceAdam {
 public:
  ReferenceAdam(const OptimizerOptions& o, std::vector<float> initial)
      : o_(o), p_(initial.begin(), initial.end()), m_(p_.size(), 0.0), v_(p_.size(), 0.0) {}

  void Step(double lr, const std::vector<float>& g) {
    ++t_;
    const double b1 = o_.beta1, b2 = o_.beta2;
    const double c2 = std::sqrt(1.0 - std::pow(b2, t_));
    const double c1 = 1.0 - std::pow(b1, t_);
    for (size_t i = 0; i < p_.size(); ++i) {
      m_[i] = b1 * m_[i] + (1 - b1) * g[i];
      v_[i] = b2 * v_[i] + (1 - b2) * double{g[i]} * g[i];
      p_[i] -= lr * c2 / c1 * m_[i] / (std::sqrt(v_[i]) + o_.epsilon * c2);
    }
  }
  const std::vector<double>& params() const { return p_; }

 private:
  const OptimizerOptions o_;
  std::vector<double> p_, m_, v_;
  int t_ = 0;
};

TEST(ShmStoreTest, AdamPushMatchesReferenceOverThreeSteps) {
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  adam.lr = 0.01f;
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(adam, 5, /*seed=*/11));
  ASSERT_NE(store, nullptr);
  const std::vector<VariableSpec> vars = TestVariables();
  ReferenceAdam w_ref(adam, InitialValue(vars[0], 11));
  ReferenceAdam b_ref(adam, InitialValue(vars[1], 11));
  const float lr = 0.01f;
  for (int step = 0; step < 3; ++step) {
    // Gradients that change from step to step: with a wrong t the bias
    // correction is off by tens of percent of a step.
    const std::vector<float> gw = Ramp(vars[0].size(), 0.1f * (step + 1), 0.3f * step - 0.2f);
    const std::vector<float> gb = Ramp(vars[1].size(), 0.5f, step == 1 ? 2.0f : -1.0f);
    const DenseGrad grads[] = {{0, gw.data()}, {1, gb.data()}};
    ASSERT_TRUE(store->Push(grads, lr).ok());
    w_ref.Step(lr, gw);
    b_ref.Step(lr, gb);
    const std::vector<float> w = PullAll(*store, 0);
    const std::vector<float> b = PullAll(*store, 1);
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(w[i], w_ref.params()[i], 2e-6) << "w[" << i << "] after step " << step + 1;
    }
    for (size_t i = 0; i < b.size(); ++i) {
      ASSERT_NEAR(b[i], b_ref.params()[i], 2e-6) << "b[" << i << "] after step " << step + 1;
    }
  }
  EXPECT_EQ(store->version(), 3u);
}

TEST(ShmStoreTest, AdamCountsStepsPerVariable) {
  // "b" is pushed once after "w" has been pushed twice: its first update must
  // still use t = 1 (a plain signed step of lr for a nonzero gradient).
  OptimizerOptions adam;
  adam.type = OptimizerType::kAdam;
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(adam, 2));
  ASSERT_NE(store, nullptr);
  const std::vector<float> gw(13 * 4, 1.0f), gb = {2.0f, -3.0f, 0.5f, -0.25f};
  const DenseGrad w_grad{0, gw.data()};
  const DenseGrad b_grad{1, gb.data()};
  ASSERT_TRUE(store->Push({&w_grad, 1}, 0.01f).ok());
  ASSERT_TRUE(store->Push({&w_grad, 1}, 0.01f).ok());
  ASSERT_TRUE(store->Push({&b_grad, 1}, 0.01f).ok());
  ReferenceAdam b_ref(adam, std::vector<float>(4, 0.0f));
  b_ref.Step(0.01, gb);
  const std::vector<float> b = PullAll(*store, 1);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], b_ref.params()[i], 1e-7) << i;
}

// A part larger than one push chunk (push_chunks.h) is updated chunk by
// chunk: the result, and the fused pull's copy, must be those of one update
// over the whole part, bit for bit, whatever the shard count. 1031 x 13
// elements is 3 chunks and a partial one on one shard, and parts that start
// and end inside chunks on three.
TEST(ShmStoreTest, ChunkedPushEqualsOneUpdateOverTheVariable) {
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kFtrl, OptimizerType::kSgd}) {
    for (int shards : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << OptimizerTypeName(type) << ", " << shards << " shards");
      OptimizerOptions opt;
      opt.type = type;
      opt.lr = 0.01f;
      const VariableSpec spec{"big", 1031, 13, InitKind::kGlorotUniform, 1031, 13};
      ASSERT_GT(spec.size(), 3 * PushChunks::kMinChunkElements);
      absl::StatusOr<std::unique_ptr<ShmParamStore>> store =
          ShmParamStore::Create(StoreOptionsFor(opt, shards, /*seed=*/5), {spec});
      ASSERT_TRUE(store.ok()) << store.status();
      std::vector<float> ref = InitialValue(spec, 5);
      std::vector<std::vector<float>> ref_slots;
      for (int k = 0; k < NumSlots(type); ++k) ref_slots.emplace_back(spec.size(), SlotInitialValue(opt, k));
      float* slot_ptrs[4] = {};
      for (size_t k = 0; k < ref_slots.size(); ++k) slot_ptrs[k] = ref_slots[k].data();
      std::vector<float> copy(spec.size(), std::nanf(""));
      for (int step = 1; step <= 3; ++step) {
        const std::vector<float> g = Ramp(spec.size(), 0.01f * step, 0.5f - step);
        const DenseGrad grad{0, g.data()};
        const PullSlice pull{0, 0, spec.rows, copy.data()};
        ASSERT_TRUE((*store)->PushPull({&grad, 1}, 0.01f, {&pull, 1}).ok());
        ApplyUpdate(opt, UpdateParams{0.01f, step}, ref.data(), slot_ptrs, g.data(), spec.size());
        ASSERT_TRUE(BitEqual(PullAll(**store, 0), ref)) << "step " << step;
        ASSERT_TRUE(BitEqual(copy, ref)) << "fused pull, step " << step;
      }
    }
  }
}

TEST(ShmStoreTest, MomentumPushMatchesReference) {
  OptimizerOptions mom;
  mom.type = OptimizerType::kMomentum;
  mom.momentum = 0.5f;
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(mom, 3, /*seed=*/4));
  ASSERT_NE(store, nullptr);
  const VariableSpec w = TestVariables()[0];
  const std::vector<float> initial = InitialValue(w, 4);
  std::vector<double> p(initial.begin(), initial.end()), vel(p.size(), 0.0);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Ramp(w.size(), 0.2f, static_cast<float>(step));
    const DenseGrad grad{0, g.data()};
    ASSERT_TRUE(store->Push({&grad, 1}, 0.1f).ok());
    for (size_t i = 0; i < p.size(); ++i) {
      vel[i] = 0.5 * vel[i] + g[i];
      p[i] -= 0.1 * vel[i];
    }
  }
  const std::vector<float> got = PullAll(*store, 0);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], p[i], 1e-5) << i;
}

TEST(ShmStoreTest, AccumulatorSlotsStartAtInitialAccumulatorValue) {
  // With accumulators left at 0 instead, Adagrad's first step would be
  // lr * sign(g) and FTRL's would differ too.
  for (OptimizerType type : {OptimizerType::kAdagrad, OptimizerType::kFtrl}) {
    OptimizerOptions opt;
    opt.type = type;
    opt.initial_accumulator_value = 4.0f;
    std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(opt, 3, /*seed=*/5));
    ASSERT_NE(store, nullptr);
    const VariableSpec w = TestVariables()[0];
    const std::vector<float> initial = InitialValue(w, 5);
    const std::vector<float> g = Ramp(w.size(), 0.2f, -1.0f);
    const DenseGrad grad{0, g.data()};
    const double lr = 0.1;
    ASSERT_TRUE(store->Push({&grad, 1}, static_cast<float>(lr)).ok());
    const std::vector<float> got = PullAll(*store, 0);
    for (size_t i = 0; i < got.size(); ++i) {
      const double n0 = 4.0, gi = g[i], p0 = initial[i], n1 = n0 + gi * gi;
      double want;
      if (type == OptimizerType::kAdagrad) {
        want = p0 - lr * gi / (std::sqrt(n1) + opt.epsilon);
      } else {
        const double z = gi - (std::sqrt(n1) - std::sqrt(n0)) / lr * p0;  // l1 = l2 = 0
        want = -z * lr / std::sqrt(n1);
      }
      EXPECT_NEAR(got[i], want, 1e-6) << OptimizerTypeName(type) << " w[" << i << "]";
    }
  }
}

TEST(ShmStoreTest, BadVariableOrRowsIsInvalidArgument) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5));
  ASSERT_NE(store, nullptr);
  std::vector<float> out(13 * 4 + 4);
  const std::vector<float> before = PullAll(*store, 0);
  for (const PullSlice& bad : {PullSlice{-1, 0, 1, out.data()}, PullSlice{2, 0, 1, out.data()},
                               PullSlice{0, -1, 2, out.data()}, PullSlice{0, 0, 14, out.data()},
                               PullSlice{0, 5, 4, out.data()}, PullSlice{1, 3, 5, out.data()}}) {
    SCOPED_TRACE(absl::StrCat("var ", bad.var, " rows [", bad.row_begin, ", ", bad.row_end, ")"));
    const absl::Status s = store->Pull({&bad, 1});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  const std::vector<float> g(13 * 4, 1.0f);
  for (int var : {-1, 2, 1000}) {
    const DenseGrad bad{var, g.data()};
    const absl::Status s = store->Push({&bad, 1}, 0.1f);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  EXPECT_EQ(store->version(), 0u);
  EXPECT_TRUE(BitEqual(PullAll(*store, 0), before));
}

// ---- Lifetime and attaching --------------------------------------------------

TEST(ShmStoreTest, SegmentsAreGoneAfterTheStoreIsDestroyed) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 3));
  ASSERT_NE(store, nullptr);
  const std::string name = store->name();
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(name, "-s", s)));
  store.reset();
  for (int s = 0; s < 3; ++s) EXPECT_FALSE(ShmSegment::Exists(absl::StrCat(name, "-s", s)));
  EXPECT_EQ(ShmParamStore::Attach(name, Sgd()).status().code(), absl::StatusCode::kNotFound);
}

// ps.memory_kind: private and shared are what they say; auto makes a store
// private only when no other process attaches, huge pages are wanted, and
// private memory gets them where /dev/shm does not.
TEST(ShmStoreTest, UsePrivateMemoryFollowsKindAttachersAndPages) {
  HugePageSettings only_private;
  only_private.thp_enabled = "madvise";
  only_private.shmem_enabled = "never";
  only_private.tmpfs_huge = "never";
  HugePageSettings both = only_private;
  both.tmpfs_huge = "advise";
  HugePageSettings neither = only_private;
  neither.thp_enabled = "never";
  OpenStoreOptions o = StoreOptionsFor(Sgd(), 1);
  o.others_attach = false;
  EXPECT_TRUE(UsePrivateMemory(o, only_private));
  EXPECT_FALSE(UsePrivateMemory(o, both));
  EXPECT_FALSE(UsePrivateMemory(o, neither));
  o.store.huge_pages = HugePagePolicy::kOff;
  EXPECT_FALSE(UsePrivateMemory(o, only_private));
  o.store.huge_pages = HugePagePolicy::kAuto;
  o.others_attach = true;
  EXPECT_FALSE(UsePrivateMemory(o, only_private));
  o.store.memory_kind = StoreMemoryKind::kPrivate;
  for (const HugePageSettings& s : {only_private, both, neither}) EXPECT_TRUE(UsePrivateMemory(o, s));
  o.store.memory_kind = StoreMemoryKind::kShared;
  o.others_attach = false;
  for (const HugePageSettings& s : {only_private, both, neither}) EXPECT_FALSE(UsePrivateMemory(o, s));
  // The default: others may attach, so shared.
  EXPECT_FALSE(UsePrivateMemory(StoreOptionsFor(Sgd(), 1), only_private));
}

TEST(ShmStoreTest, AttachInTheSameProcessSharesParameters) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 5));
  ASSERT_NE(store, nullptr);
  {
    absl::StatusOr<std::unique_ptr<ShmParamStore>> other = ShmParamStore::Attach(store->name(), Sgd());
    ASSERT_TRUE(other.ok()) << other.status();
    EXPECT_EQ((*other)->name(), store->name());
    const StoreLayout& l = (*other)->layout();
    EXPECT_EQ(l.num_shards, 5);
    ASSERT_EQ(l.variables.size(), 2u);
    for (int v = 0; v < 2; ++v) {
      EXPECT_EQ(l.variables[v].name, store->layout().variables[v].name);
      EXPECT_EQ(l.variables[v].rows, store->layout().variables[v].rows);
      EXPECT_EQ(l.variables[v].cols, store->layout().variables[v].cols);
      for (int s = 0; s < 5; ++s) {
        EXPECT_EQ(l.parts[v][s].begin, store->layout().parts[v][s].begin);
        EXPECT_EQ(l.parts[v][s].end, store->layout().parts[v][s].end);
      }
    }
    EXPECT_EQ((*other)->total_bytes(), store->total_bytes());
    EXPECT_TRUE(BitEqual(PullAll(**other, 0), PullAll(*store, 0)));

    const std::vector<float> g(13 * 4, 2.0f);
    const DenseGrad grad{0, g.data()};
    ASSERT_TRUE((*other)->Push({&grad, 1}, 0.5f).ok());
    EXPECT_EQ(store->version(), 1u);
    EXPECT_TRUE(BitEqual(PullAll(**other, 0), PullAll(*store, 0)));
  }
  // Destroying the attached store leaves the segments in place.
  for (int s = 0; s < 5; ++s) EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(store->name(), "-s", s)));
}

// Exit codes of the attaching child, one per check.
enum ChildExit : int {
  kChildOk = 0,
  kChildAttachFailed = 10,
  kChildWrongShardCount,
  kChildWrongVariables,
  kChildWrongParts,
  kChildPullFailed,
  kChildWrongValues,
  kChildPushFailed,
  kChildWrongVersion,
};

// Runs in a forked child: attaches to `name`, checks everything against the
// parent's layout and values, pushes `grad` to "w" with `lr`. No gtest
// assertions here; the result is the exit code.
int AttachingChild(const std::string& name, const OptimizerOptions& optimizer, const StoreLayout& want_layout,
                   const std::vector<float>& want_w, const std::vector<float>& grad, float lr) {
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Attach(name, optimizer);
  if (!store.ok()) return kChildAttachFailed;
  const StoreLayout& l = (*store)->layout();
  if (l.num_shards != want_layout.num_shards) return kChildWrongShardCount;
  if (l.variables.size() != want_layout.variables.size()) return kChildWrongVariables;
  for (size_t v = 0; v < l.variables.size(); ++v) {
    const VariableSpec& a = l.variables[v];
    const VariableSpec& b = want_layout.variables[v];
    if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) return kChildWrongVariables;
    for (int s = 0; s < l.num_shards; ++s) {
      if (l.parts[v][s].begin != want_layout.parts[v][s].begin || l.parts[v][s].end != want_layout.parts[v][s].end) {
        return kChildWrongParts;
      }
    }
  }
  std::vector<float> w(want_w.size());
  if (!(*store)->PullVariable(0, w.data()).ok()) return kChildPullFailed;
  if (std::memcmp(w.data(), want_w.data(), w.size() * sizeof(float)) != 0) return kChildWrongValues;
  if ((*store)->version() != 1) return kChildWrongVersion;
  const DenseGrad g{0, grad.data()};
  if (!(*store)->Push({&g, 1}, lr).ok()) return kChildPushFailed;
  return kChildOk;
}

TEST(ShmStoreTest, AnotherProcessAttachesPullsAndPushes) {
  const OptimizerOptions sgd = Sgd();
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(sgd, 5, /*seed=*/21));
  ASSERT_NE(store, nullptr);
  // The parent writes something the child can only know through the store.
  const std::vector<float> g1 = Ramp(13 * 4, 1.0f, 0.5f);
  const DenseGrad d1{0, g1.data()};
  ASSERT_TRUE(store->Push({&d1, 1}, 0.1f).ok());
  const std::vector<float> parent_w = PullAll(*store, 0);
  const std::vector<float> g2 = Ramp(13 * 4, -0.5f, 0.25f);
  const float lr2 = 0.2f;

  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) _exit(AttachingChild(store->name(), sgd, store->layout(), parent_w, g2, lr2));

  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid) << std::strerror(errno);
  ASSERT_TRUE(WIFEXITED(status)) << "wait status " << status;
  ASSERT_EQ(WEXITSTATUS(status), kChildOk) << "see enum ChildExit";

  std::vector<float> want = parent_w;
  for (size_t i = 0; i < want.size(); ++i) want[i] -= lr2 * g2[i];
  EXPECT_TRUE(BitEqual(PullAll(*store, 0), want));
  EXPECT_EQ(store->version(), 2u);
  // The child's destroyed attachment did not unlink anything.
  for (int s = 0; s < 5; ++s) EXPECT_TRUE(ShmSegment::Exists(absl::StrCat(store->name(), "-s", s)));
}

// ---- Corrupted headers -----------------------------------------------------

// Creates a fresh SGD store over `num_shards` shards, lets `corrupt` change shard
// `shard`'s memory, and returns what Attach says.
absl::Status AttachAfterCorrupting(int shard, const std::function<void(ShardHeader*, LayoutEntry*, size_t)>& corrupt,
                                   std::string* segment_name, int num_shards = 3) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), num_shards));
  if (store == nullptr) return absl::InternalError("no store");
  *segment_name = absl::StrCat(store->name(), "-s", shard);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(*segment_name);
  if (!seg.ok()) return absl::InternalError(absl::StrCat("test setup: ", seg.status().ToString()));
  char* base = static_cast<char*>((*seg)->data());
  corrupt(reinterpret_cast<ShardHeader*>(base), reinterpret_cast<LayoutEntry*>(base + sizeof(ShardHeader)),
          (*seg)->size());
  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), Sgd());
  if (attached.ok()) return absl::OkStatus();
  return attached.status();
}

TEST(ShmStoreTest, AttachRejectsBadMagic) {
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(0, [](ShardHeader* h, LayoutEntry*, size_t) { h->magic ^= 1; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "magic"}));
}

TEST(ShmStoreTest, AttachRejectsBadFormatVersion) {
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      0, [](ShardHeader* h, LayoutEntry*, size_t) { h->format_version = kShardFormatVersion + 1; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "format version"}));
}

TEST(ShmStoreTest, AttachRejectsOffsetOutsideTheSegment) {
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      0, [](ShardHeader*, LayoutEntry* e, size_t size) { e[0].offset = size; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "outside"}));
}

TEST(ShmStoreTest, AttachRejectsOffsetThatWrapsAround) {
  // offset + array_bytes overflows to a small number; the bounds check must
  // not be fooled by the wrap.
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      0,
      [](ShardHeader*, LayoutEntry* e, size_t) {
        e[0].offset = std::numeric_limits<uint64_t>::max() - e[0].array_bytes + 1;
      },
      &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "outside"}));
}

TEST(ShmStoreTest, AttachRejectsHugeArrayBytes) {
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      1, [](ShardHeader*, LayoutEntry* e, size_t) { e[1].array_bytes = uint64_t{1} << 63; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "outside"}));
}

TEST(ShmStoreTest, AttachRejectsShapeThatOverflows) {
  // rows * cols * sizeof(float) overflows to 0, which must not pass for
  // "the arrays are big enough". One shard, so that no other shard's copy of
  // the shape catches it first.
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      0, [](ShardHeader*, LayoutEntry* e, size_t) { e[0].cols = int64_t{1} << 62; }, &seg, /*num_shards=*/1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "outside"}));
}

TEST(ShmStoreTest, AttachRejectsArraysThatOverlapAnotherRegion) {
  // Crafted by hand while writing shard_header_fuzz (the fuzzer did not reach
  // it): in row_lock mode, variable 0's row sequence
  // words moved onto variable 1's parameters (all inside the segment) made
  // Pull spin forever on an "odd" word. Attach must reject the layout.
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(
      0,
      [](ShardHeader* h, LayoutEntry* e, size_t) {
        h->update_mode = static_cast<uint32_t>(UpdateMode::kRowLock);
        e[0].array_bytes = e[1].offset - e[0].offset;
      },
      &seg, /*num_shards=*/1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "array_bytes", "layout"}));
}

TEST(ShmStoreTest, AttachRejectsADroppedTable) {
  // Crafted while writing shard_header_fuzz: with num_tables lowered to 0, a variable's
  // arrays could reach into the now unlisted table region unchecked.
  OpenStoreOptions o = StoreOptionsFor(Sgd(), 1);
  TableSpec t;
  t.name = "emb";
  t.dim = 4;
  t.capacity = 16;
  o.tables.push_back(t);
  std::unique_ptr<ShmParamStore> store = MakeStore(o);
  ASSERT_NE(store, nullptr);
  const std::string seg_name = store->name() + "-s0";
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(seg_name);
  ASSERT_TRUE(seg.ok()) << seg.status();
  reinterpret_cast<ShardHeader*>((*seg)->data())->num_tables = 0;
  const absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), Sgd());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition) << attached.status();
  EXPECT_TRUE(MessageContains(attached.status(), {seg_name, "layout"}));
}

TEST(ShmStoreTest, AttachRejectsShardsThatDisagree) {
  std::string seg;
  absl::Status s = AttachAfterCorrupting(2, [](ShardHeader* h, LayoutEntry*, size_t) { h->shard_index = 1; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "shard_index"}));

  s = AttachAfterCorrupting(1, [](ShardHeader*, LayoutEntry* e, size_t) { e[0].row_begin += 1; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "partition"}));

  s = AttachAfterCorrupting(1, [](ShardHeader*, LayoutEntry* e, size_t) { e[1].name[0] = 'x'; }, &seg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(MessageContains(s, {seg, "disagrees"}));
}

TEST(ShmStoreTest, UncorruptedAttachSucceeds) {
  // The corruption helper itself does not break the store.
  std::string seg;
  const absl::Status s = AttachAfterCorrupting(0, [](ShardHeader*, LayoutEntry*, size_t) {}, &seg);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ShmStoreTest, AttachWithADifferentOptimizerTypeFails) {
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 2));
  ASSERT_NE(store, nullptr);
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kMomentum}) {
    OptimizerOptions other;
    other.type = type;
    const absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), other);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition) << attached.status();
    EXPECT_TRUE(MessageContains(attached.status(), {store->name() + "-s0", "optimizer"}));
  }
}

// ---- Partitioners and round-robin placement ----------------------------------

// Which shard holds each of `parts`'s rows: -1 where none does, for spotting
// gaps and overlaps; "[begin, end) on shard s" per non-empty part otherwise.
std::vector<std::pair<int, RowRange>> Holders(const std::vector<RowRange>& parts) {
  std::vector<std::pair<int, RowRange>> out;
  for (int s = 0; s < static_cast<int>(parts.size()); ++s) {
    if (parts[s].size() > 0) out.push_back({s, parts[s]});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second.begin < b.second.begin; });
  return out;
}

// Checks that variable `v` of `l` sits on `shards` (in row order) with `sizes` rows each.
::testing::AssertionResult PlacedOn(const StoreLayout& l, int v, const std::vector<int>& shards,
                                    const std::vector<int64_t>& sizes) {
  const std::vector<std::pair<int, RowRange>> h = Holders(l.parts[v]);
  std::vector<int> got_shards;
  std::vector<int64_t> got_sizes;
  int64_t next = 0;
  for (const auto& [s, r] : h) {
    if (r.begin != next) return ::testing::AssertionFailure() << l.variables[v].name << ": gap or overlap at row " << next;
    next = r.end;
    got_shards.push_back(s);
    got_sizes.push_back(r.size());
  }
  if (next != l.variables[v].rows) return ::testing::AssertionFailure() << l.variables[v].name << ": ends at row " << next;
  if (got_shards != shards || got_sizes != sizes) {
    auto str = [](const auto& xs) {
      std::string out;
      for (const auto& x : xs) absl::StrAppend(&out, out.empty() ? "" : ",", x);
      return out;
    };
    return ::testing::AssertionFailure() << l.variables[v].name << ": on shards {" << str(got_shards) << "} with rows {"
                                         << str(got_sizes) << "}, want {" << str(shards) << "} with {" << str(sizes)
                                         << "}";
  }
  return ::testing::AssertionSuccess();
}

// Variables of every size: in a 4-shard store with min_size 1 KiB, "emb"
// (4 KiB) gets 4 partitions and "mid" (1600 bytes) 2; with max_size 256
// bytes, "emb" gets 4 (16 capped by the shards), "w" 2, and "f" (one row of
// 400 bytes) 1. The rest stay whole.
std::vector<VariableSpec> MixedVariables() {
  return {
      VariableSpec{"emb", 64, 16, InitKind::kGlorotUniform, 64, 16},
      VariableSpec{"w", 13, 8, InitKind::kGlorotUniform, 13, 8},
      VariableSpec{"b", 8, 1, InitKind::kZeros},
      VariableSpec{"mid", 20, 20, InitKind::kGlorotUniform, 20, 20},
      VariableSpec{"c", 3, 2, InitKind::kGlorotUniform, 3, 2},
      VariableSpec{"d", 5, 3, InitKind::kGlorotUniform, 5, 3},
      VariableSpec{"e", 2, 2, InitKind::kGlorotUniform, 2, 2},
      VariableSpec{"f", 1, 100, InitKind::kGlorotUniform, 1, 100},
  };
}

PartitionerOptions MinSizeOptions() {
  PartitionerOptions p;
  p.kind = PartitionerOptions::Kind::kMinSize;
  p.min_shard_bytes = 1024;
  return p;
}

PartitionerOptions MaxSizeOptions() {
  PartitionerOptions p;
  p.kind = PartitionerOptions::Kind::kMaxSize;
  p.max_shard_bytes = 256;
  return p;
}

TEST(StoreLayoutTest, MinSizeSplitsBigVariablesAndDealsOutTheRest) {
  const StoreLayout l = StoreLayout::Make(MixedVariables(), 4, MinSizeOptions());
  ASSERT_EQ(l.parts.size(), 8u);
  EXPECT_TRUE(PlacedOn(l, 0, {0, 1, 2, 3}, {16, 16, 16, 16}));  // emb: 4 KiB / 1 KiB
  EXPECT_TRUE(PlacedOn(l, 1, {0}, {13}));                       // w: 416 bytes, 1st whole one
  EXPECT_TRUE(PlacedOn(l, 2, {1}, {8}));                        // b: 2nd
  EXPECT_TRUE(PlacedOn(l, 3, {0, 1}, {10, 10}));                // mid: ceil(1600 / 1024) = 2, from shard 0
  EXPECT_TRUE(PlacedOn(l, 4, {2}, {3}));                        // c: 3rd
  EXPECT_TRUE(PlacedOn(l, 5, {3}, {5}));                        // d: 4th
  EXPECT_TRUE(PlacedOn(l, 6, {0}, {2}));                        // e: 5th, wraps round
  EXPECT_TRUE(PlacedOn(l, 7, {1}, {1}));                        // f: 6th
}

TEST(StoreLayoutTest, MaxSizeSplitsBigVariablesAndDealsOutTheRest) {
  const StoreLayout l = StoreLayout::Make(MixedVariables(), 4, MaxSizeOptions());
  EXPECT_TRUE(PlacedOn(l, 0, {0, 1, 2, 3}, {16, 16, 16, 16}));  // emb: 16 partitions, capped by 4 shards
  EXPECT_TRUE(PlacedOn(l, 1, {0, 1}, {7, 6}));                  // w: 8 rows of 32 bytes fit in 256
  EXPECT_TRUE(PlacedOn(l, 2, {0}, {8}));                        // b: 1st whole one
  EXPECT_TRUE(PlacedOn(l, 3, {0, 1, 2, 3}, {5, 5, 5, 5}));      // mid: 3 rows of 80 bytes a partition -> 7, capped
  EXPECT_TRUE(PlacedOn(l, 4, {1}, {3}));                        // c: 2nd
  EXPECT_TRUE(PlacedOn(l, 5, {2}, {5}));                        // d: 3rd
  EXPECT_TRUE(PlacedOn(l, 6, {3}, {2}));                        // e: 4th
  EXPECT_TRUE(PlacedOn(l, 7, {0}, {1}));                        // f: a 400-byte row is still one partition; 5th
}

TEST(StoreLayoutTest, FixedShardsDealsOutSingleRowVariables) {
  // With the default partitioner only variables of one row stay whole.
  const std::vector<VariableSpec> vars = {
      VariableSpec{"a", 1, 4, InitKind::kZeros}, VariableSpec{"b", 1, 4, InitKind::kZeros},
      VariableSpec{"k", 10, 4, InitKind::kZeros}, VariableSpec{"c", 1, 4, InitKind::kZeros},
      VariableSpec{"d", 1, 4, InitKind::kZeros}};
  const StoreLayout l = StoreLayout::Make(vars, 3, PartitionerOptions{});
  EXPECT_TRUE(PlacedOn(l, 0, {0}, {1}));
  EXPECT_TRUE(PlacedOn(l, 1, {1}, {1}));
  EXPECT_TRUE(PlacedOn(l, 2, {0, 1, 2}, {4, 3, 3}));
  EXPECT_TRUE(PlacedOn(l, 3, {2}, {1}));
  EXPECT_TRUE(PlacedOn(l, 4, {0}, {1}));
  // One shard: everything on it.
  const StoreLayout one = StoreLayout::Make(vars, 1, MinSizeOptions());
  for (int v = 0; v < 5; ++v) EXPECT_TRUE(PlacedOn(one, v, {0}, {vars[v].rows}));
}

class PartitionedStoreTest : public ::testing::TestWithParam<PartitionerOptions::Kind> {
 protected:
  OpenStoreOptions Options(uint64_t seed) const {
    OpenStoreOptions o = StoreOptionsFor(Sgd(), 4, seed);
    o.store.partitioner = GetParam() == PartitionerOptions::Kind::kMinSize ? MinSizeOptions() : MaxSizeOptions();
    return o;
  }
};

TEST_P(PartitionedStoreTest, CreatesPullsPushesAndAttaches) {
  const OpenStoreOptions options = Options(/*seed=*/31);
  const std::vector<VariableSpec> vars = MixedVariables();
  std::unique_ptr<ShmParamStore> store = MakeStore(options, vars);
  ASSERT_NE(store, nullptr);

  // The store uses the layout StoreLayout::Make gives for these options.
  const StoreLayout want = StoreLayout::Make(vars, 4, options.store.partitioner);
  const StoreLayout& l = store->layout();
  ASSERT_EQ(l.parts.size(), vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(l.parts[v][s].begin, want.parts[v][s].begin) << vars[v].name << " shard " << s;
      EXPECT_EQ(l.parts[v][s].end, want.parts[v][s].end) << vars[v].name << " shard " << s;
    }
  }

  // Every variable reads back as its initial value, whichever shards hold it.
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) {
    SCOPED_TRACE(vars[v].name);
    EXPECT_TRUE(BitEqual(PullAll(*store, v), InitialValue(vars[v], 31)));
  }

  // A push lands on the right rows.
  std::vector<std::vector<float>> grads, want_values;
  std::vector<DenseGrad> dense;
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) {
    grads.push_back(Ramp(vars[v].size(), 0.5f, static_cast<float>(v)));
    want_values.push_back(InitialValue(vars[v], 31));
  }
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) {
    dense.push_back(DenseGrad{v, grads[v].data()});
    for (size_t i = 0; i < grads[v].size(); ++i) want_values[v][i] -= 0.1f * grads[v][i];
  }
  ASSERT_TRUE(store->Push(dense, 0.1f).ok());
  for (int v = 0; v < static_cast<int>(vars.size()); ++v) {
    EXPECT_TRUE(BitEqual(PullAll(*store, v), want_values[v])) << vars[v].name;
  }

  // Another attachment accepts the wrapped, round-robin layout and sees the same.
  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), Sgd());
  ASSERT_TRUE(attached.ok()) << attached.status();
  const StoreLayout& al = (*attached)->layout();
  ASSERT_EQ(al.parts.size(), vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(al.parts[v][s].begin, l.parts[v][s].begin) << vars[v].name << " shard " << s;
      EXPECT_EQ(al.parts[v][s].end, l.parts[v][s].end) << vars[v].name << " shard " << s;
    }
    EXPECT_TRUE(BitEqual(PullAll(**attached, static_cast<int>(v)), want_values[v])) << vars[v].name;
  }
}

TEST_P(PartitionedStoreTest, AttachRejectsRowsThatNoLongerTile) {
  const std::vector<VariableSpec> vars = MixedVariables();
  std::unique_ptr<ShmParamStore> store = MakeStore(Options(/*seed=*/3), vars);
  ASSERT_NE(store, nullptr);
  // "d" (variable 5) is held whole by one shard; cut its last row off there.
  const std::vector<std::pair<int, RowRange>> holders = Holders(store->layout().parts[5]);
  ASSERT_EQ(holders.size(), 1u);
  const std::string seg_name = absl::StrCat(store->name(), "-s", holders[0].first);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(seg_name);
  ASSERT_TRUE(seg.ok()) << seg.status();
  LayoutEntry* entries = reinterpret_cast<LayoutEntry*>(static_cast<char*>((*seg)->data()) + sizeof(ShardHeader));
  entries[5].row_end -= 1;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> attached = ShmParamStore::Attach(store->name(), Sgd());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition) << attached.status();
  EXPECT_TRUE(MessageContains(attached.status(), {seg_name, "'d'", "partition"}));

  // A second holder of rows that another shard already has is an overlap.
  entries[5].row_end += 1;
  ASSERT_TRUE(ShmParamStore::Attach(store->name(), Sgd()).ok());
  const std::vector<std::pair<int, RowRange>> emb = Holders(store->layout().parts[0]);
  ASSERT_EQ(emb.size(), 4u);
  const std::string seg2_name = absl::StrCat(store->name(), "-s", emb[2].first);
  absl::StatusOr<std::unique_ptr<ShmSegment>> seg2 = ShmSegment::Attach(seg2_name);
  ASSERT_TRUE(seg2.ok()) << seg2.status();
  LayoutEntry* entries2 = reinterpret_cast<LayoutEntry*>(static_cast<char*>((*seg2)->data()) + sizeof(ShardHeader));
  entries2[0].row_begin -= 1;
  entries2[0].row_end -= 1;  // same size, so the arrays still fit
  attached = ShmParamStore::Attach(store->name(), Sgd());
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kFailedPrecondition) << attached.status();
  EXPECT_TRUE(MessageContains(attached.status(), {seg2_name, "'emb'", "partition"}));
}

INSTANTIATE_TEST_SUITE_P(Kinds, PartitionedStoreTest,
                         ::testing::Values(PartitionerOptions::Kind::kMinSize, PartitionerOptions::Kind::kMaxSize),
                         [](const ::testing::TestParamInfo<PartitionerOptions::Kind>& info) {
                           return info.param == PartitionerOptions::Kind::kMinSize ? std::string("MinSize")
                                                                                   : std::string("MaxSize");
                         });

// ---- Hogwild ---------------------------------------------------------------

// Every value SGD with gradient 1 can produce from `initial`: x[k+1] =
// fl(x[k] - lr). Lost updates make the final value x[k] for some smaller k;
// anything off this chain is a corrupted value.
std::vector<float> SgdChain(float initial, float lr, int steps) {
  std::vector<float> chain(steps + 1);
  chain[0] = initial;
  for (int k = 0; k < steps; ++k) chain[k + 1] = chain[k] - lr;
  return chain;
}

TEST(ShmStoreTest, HogwildPushersAndPullersStayConsistent) {
  constexpr int kPushers = 4;
  constexpr int kPullers = 2;
  constexpr int kPushesEach = 1000;
  constexpr int kTotal = kPushers * kPushesEach;
  constexpr float kLr = 1e-3f;
  const VariableSpec spec{"h", 6, 8, InitKind::kGlorotUniform, 6, 8};
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(Sgd(), 2, /*seed=*/17), {spec});
  ASSERT_NE(store, nullptr);
  const std::vector<float> initial = PullAll(*store, 0);

  std::atomic<bool> go{false};
  std::atomic<int> pushers_done{0};
  std::atomic<int> push_errors{0};
  std::atomic<int> pull_errors{0};
  std::atomic<int> bad_values{0};
  std::atomic<int64_t> pulls{0};
  const std::vector<float> grad(spec.size(), 1.0f);

  std::vector<std::thread> threads;
  for (int t = 0; t < kPushers; ++t) {
    threads.emplace_back([&] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const DenseGrad g{0, grad.data()};
      for (int i = 0; i < kPushesEach; ++i) {
        if (!store->Push({&g, 1}, kLr).ok()) push_errors.fetch_add(1);
      }
      pushers_done.fetch_add(1, std::memory_order_release);
    });
  }
  for (int t = 0; t < kPullers; ++t) {
    threads.emplace_back([&] {
      std::vector<float> out(spec.size());
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      do {
        if (!store->PullVariable(0, out.data()).ok()) pull_errors.fetch_add(1);
        for (size_t i = 0; i < out.size(); ++i) {
          const float lo = initial[i] - kTotal * kLr - 1e-3f;
          if (!std::isfinite(out[i]) || out[i] < lo || out[i] > initial[i]) bad_values.fetch_add(1);
        }
        pulls.fetch_add(1, std::memory_order_relaxed);
      } while (pushers_done.load(std::memory_order_acquire) < kPushers);
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& t : threads) t.join();

  EXPECT_EQ(push_errors.load(), 0);
  EXPECT_EQ(pull_errors.load(), 0);
  EXPECT_EQ(bad_values.load(), 0);
  EXPECT_GT(pulls.load(), 0);
  EXPECT_EQ(store->version(), static_cast<uint64_t>(kTotal));

  const std::vector<float> final_values = PullAll(*store, 0);
  for (size_t i = 0; i < final_values.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("element ", i, ": initial ", initial[i], ", final ", final_values[i]));
    const float x = final_values[i];
    ASSERT_TRUE(std::isfinite(x));
    const double moved = double{initial[i]} - x;
    EXPECT_LE(moved, kTotal * kLr + 1e-3);
    EXPECT_GE(moved, 0.25 * kTotal * kLr);
    // The value is one of the chain's, at least a quarter of the way along.
    const std::vector<float> chain = SgdChain(initial[i], kLr, kTotal);
    const auto it = std::find(chain.begin(), chain.end(), x);
    ASSERT_NE(it, chain.end()) << "not a value any sequence of updates produces";
    EXPECT_GE(it - chain.begin(), kTotal / 4);
  }
}

// ---- NUMA placement --------------------------------------------------------

// A placer for a pretend 2-node machine that records what the store asks of it.
class FakePlacer : public MemoryPlacer {
 public:
  int NodeForShard(int shard, int num_shards) const override { return shard % 2; }

  absl::Status RunOnNode(int node, const std::function<absl::Status()>& fn) override {
    run_nodes.push_back(node);
    // A real placer runs `fn` on a thread bound to `node`; so does this one.
    absl::Status result;
    std::thread t([&] { result = fn(); });
    t.join();
    return result;
  }

  absl::Status BindArea(void* addr, size_t bytes, int node) override {
    bind_nodes.push_back(node);
    bind_bytes.push_back(bytes);
    return absl::OkStatus();
  }

  std::vector<int> run_nodes;
  std::vector<int> bind_nodes;
  std::vector<size_t> bind_bytes;
};

TEST(ShmStoreTest, PlacerDecidesTheNodeOfEveryShard) {
  FakePlacer placer;
  OpenStoreOptions options = StoreOptionsFor(Sgd(), 5, /*seed=*/8);
  options.placer = &placer;
  std::unique_ptr<ShmParamStore> store = MakeStore(options);
  ASSERT_NE(store, nullptr);
  const std::vector<int> want = {0, 1, 0, 1, 0};
  EXPECT_EQ(store->layout().shard_nodes, want);
  EXPECT_EQ(placer.run_nodes, want);
  EXPECT_EQ(placer.bind_nodes, want);
  uint64_t bound = 0;
  for (size_t b : placer.bind_bytes) bound += b;
  EXPECT_EQ(bound, store->total_bytes());
  // Placement does not change the values.
  EXPECT_TRUE(BitEqual(PullAll(*store, 0), InitialValue(TestVariables()[0], 8)));
}

// A placer whose node cannot be used.
class FailingPlacer : public FakePlacer {
 public:
  absl::Status RunOnNode(int node, const std::function<absl::Status()>& fn) override {
    if (node == 1) return absl::UnavailableError("node 1 is offline");
    return FakePlacer::RunOnNode(node, fn);
  }
};

TEST(ShmStoreTest, PlacerFailureIsReportedAndLeavesNothingBehind) {
  FailingPlacer placer;
  OpenStoreOptions options = StoreOptionsFor(Sgd(), 3);
  options.store.job_name = "swtest-placerfail";
  options.placer = &placer;
  absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Create(options, TestVariables());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();
  EXPECT_EQ(placer.run_nodes, std::vector<int>{0});
  EXPECT_EQ(placer.bind_nodes, std::vector<int>{0});
  // Shard 0 was created before the failure; it must have been removed.
  const std::string prefix = absl::StrCat(options.store.job_name, "-", getpid(), "-");
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0u) << "left behind: " << entry.path();
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

// PushPull equals Push followed at once by Pull, fused or not: whole-variable
// slices (fused), a partial slice and a slice of a variable not pushed (both
// pulled after the push), over several shards and in every update mode.
TEST(ShmStoreTest, PushPullEqualsPushThenPull) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock}) {
    for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdam}) {
      OptimizerOptions opt;
      opt.type = type;
      OpenStoreOptions o = StoreOptionsFor(opt, 3, /*seed=*/5);
      o.store.update = mode;
      o.store.partitioner.kind = PartitionerOptions::Kind::kFixedShards;
      o.store.partitioner.max_shards = 3;  // w's 13 rows over 3 shards
      std::unique_ptr<ShmParamStore> fused = MakeStore(o);
      o.store.job_name = "swtest-store-b";
      std::unique_ptr<ShmParamStore> plain = MakeStore(o);
      ASSERT_NE(fused, nullptr);
      ASSERT_NE(plain, nullptr);
      const std::vector<VariableSpec> vars = TestVariables();
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> gw = Ramp(vars[0].size(), 0.25f, static_cast<float>(step));
        const std::vector<float> gb = Ramp(vars[1].size(), -0.5f, 1.0f);
        // Only w is pushed; b's slice is pulled after the push.
        const DenseGrad grads[] = {{0, gw.data()}};
        std::vector<float> w(vars[0].size() + 1, -9.0f), b(vars[1].size(), -9.0f), part(2 * 4, -9.0f);
        const PullSlice slices[] = {{0, 0, 13, w.data()}, {1, 0, 4, b.data()}, {0, 5, 7, part.data()}};
        ASSERT_TRUE(fused->PushPull(grads, 0.05f, slices).ok());
        ASSERT_TRUE(plain->Push(grads, 0.05f).ok());
        EXPECT_EQ(fused->version(), plain->version());
        const std::vector<float> want_w = PullAll(*plain, 0), want_b = PullAll(*plain, 1);
        EXPECT_TRUE(BitEqual(PullAll(*fused, 0), want_w)) << "step " << step;
        EXPECT_TRUE(BitEqual(std::vector<float>(w.begin(), w.end() - 1), want_w)) << "step " << step;
        EXPECT_EQ(w.back(), -9.0f);  // nothing past the slice
        EXPECT_TRUE(BitEqual(b, want_b)) << "step " << step;
        EXPECT_TRUE(BitEqual(part, std::vector<float>(want_w.begin() + 5 * 4, want_w.begin() + 7 * 4)));
      }
      // A bad slice is reported after the push, as Pull reports it.
      const std::vector<float> g(vars[0].size(), 1.0f);
      const DenseGrad grads[] = {{0, g.data()}};
      std::vector<float> out(4);
      const PullSlice bad[] = {{1, 2, 9, out.data()}};
      EXPECT_EQ(fused->PushPull(grads, 0.05f, bad).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace shardwild

namespace shardwild {
namespace {

std::vector<uint16_t> Bf16Of(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  HogwildCopyFromAsBf16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// A bf16 model's pulls (PullSlice::out_bf16): Pull and PushPull, fused
// (whole variable) or not (partial slice, a variable not pushed), write the
// f32 parameters rounded to bf16, in every update mode, and the store keeps
// f32. A slice must set exactly one of out and out_bf16.
TEST(ShmStoreTest, Bf16PullsRoundTheF32Parameters) {
  for (UpdateMode mode : {UpdateMode::kHogwild, UpdateMode::kRowLock}) {
    OptimizerOptions opt;
    opt.type = OptimizerType::kAdam;
    OpenStoreOptions o = StoreOptionsFor(opt, 3, /*seed=*/7);
    o.store.update = mode;
    o.store.partitioner.kind = PartitionerOptions::Kind::kFixedShards;
    o.store.partitioner.max_shards = 3;
    std::unique_ptr<ShmParamStore> store = MakeStore(o);
    ASSERT_NE(store, nullptr);
    const std::vector<VariableSpec> vars = TestVariables();
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> gw = Ramp(vars[0].size(), 0.25f, static_cast<float>(step));
      const DenseGrad grads[] = {{0, gw.data()}};
      std::vector<uint16_t> w(vars[0].size() + 1, 0xABCD), b(vars[1].size(), 0xABCD), part(2 * 4, 0xABCD);
      const PullSlice slices[] = {{0, 0, 13, nullptr, w.data()}, {1, 0, 4, nullptr, b.data()},
                                  {0, 5, 7, nullptr, part.data()}};
      ASSERT_TRUE(store->PushPull(grads, 0.05f, slices).ok());
      const std::vector<float> now_w = PullAll(*store, 0), now_b = PullAll(*store, 1);
      const std::vector<uint16_t> want_w = Bf16Of(now_w);
      EXPECT_EQ(std::vector<uint16_t>(w.begin(), w.end() - 1), want_w) << "step " << step;
      EXPECT_EQ(w.back(), 0xABCD);  // nothing past the slice
      EXPECT_EQ(b, Bf16Of(now_b));
      EXPECT_EQ(part, std::vector<uint16_t>(want_w.begin() + 5 * 4, want_w.begin() + 7 * 4));
      // The f32 parameters are not themselves bf16 values (the store keeps f32).
      if (step == 2) {
        int exact = 0;
        for (size_t i = 0; i < now_w.size(); ++i) exact += std::bit_cast<uint32_t>(now_w[i]) << 16 == 0;
        EXPECT_LT(exact, static_cast<int>(now_w.size()));
      }
      std::vector<uint16_t> again(vars[0].size(), 0);
      const PullSlice plain[] = {{0, 0, 13, nullptr, again.data()}};
      ASSERT_TRUE(store->Pull(plain).ok());
      EXPECT_EQ(again, want_w);
    }
    std::vector<float> f(4);
    std::vector<uint16_t> h(4);
    const PullSlice both[] = {{1, 0, 4, f.data(), h.data()}};
    const PullSlice neither[] = {{1, 0, 4, nullptr, nullptr}};
    EXPECT_EQ(store->Pull(both).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Pull(neither).code(), absl::StatusCode::kInvalidArgument);
  }
}

// The network stores' path (PullConvertingToBf16): bf16 slices pulled as
// f32 through the given pull and rounded, f32 slices passed through.
TEST(PullConvertingToBf16Test, RoundsTheBf16SlicesOnly) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kSgd;
  std::unique_ptr<ShmParamStore> store = MakeStore(StoreOptionsFor(opt, 2, /*seed=*/3));
  ASSERT_NE(store, nullptr);
  const std::vector<VariableSpec> vars = TestVariables();
  std::vector<uint16_t> w(vars[0].size(), 0);
  std::vector<float> b(vars[1].size(), -9.0f);
  const PullSlice slices[] = {{0, 0, 13, nullptr, w.data()}, {1, 0, 4, b.data(), nullptr}};
  int calls = 0;
  const absl::Status s = PullConvertingToBf16(slices, store->layout(), [&](absl::Span<const PullSlice> f32) {
    ++calls;
    for (const PullSlice& sl : f32) EXPECT_EQ(sl.out_bf16, nullptr);
    return store->Pull(f32);
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(w, Bf16Of(PullAll(*store, 0)));
  EXPECT_TRUE(BitEqual(b, PullAll(*store, 1)));
}

}  // namespace
}  // namespace shardwild
