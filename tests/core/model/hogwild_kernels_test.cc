// Tests of the Hogwild kernels' copies, fills and gathers on every dispatch
// target against sequential references, and of their one permitted race:
// under ThreadSanitizer (make tsan) the concurrent test below fails if a
// kernel's loads and stores of parameter memory are instrumented.
// The optimizer kernels are tested per target in optimizer_test.cc.
#include "core/model/hogwild_kernels.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "core/model/optimizer.h"
#include "core/model/sparse_layers.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

constexpr float kSentinel = -777.0f;

class HogwildKernelTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {
 protected:
  void SetUp() override {
    const std::vector<std::string> supported = HogwildKernelTargets();
    if (std::find(supported.begin(), supported.end(), target()) == supported.end()) {
      GTEST_SKIP() << "this CPU does not support " << target();
    }
    scoped_ = std::make_unique<ScopedHogwildKernelTarget>(target());
    ASSERT_TRUE(scoped_->ok());
    ASSERT_EQ(ActiveHogwildKernelTarget(), target());
  }
  void TearDown() override { scoped_.reset(); }
  const std::string& target() const { return std::get<0>(GetParam()); }
  int64_t n() const { return std::get<1>(GetParam()); }

  std::unique_ptr<ScopedHogwildKernelTarget> scoped_;
};

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST_P(HogwildKernelTest, CopiesExactlyNAndNothingPast) {
  const std::vector<float> src = Random(n(), 1);
  // Offset by one float so the copy is unaligned on every target.
  std::vector<float> dst(n() + 5, kSentinel);
  HogwildCopyFrom(src.data(), dst.data() + 1, n());
  EXPECT_EQ(dst[0], kSentinel);
  for (int64_t i = 0; i < n(); ++i) ASSERT_EQ(dst[i + 1], src[i]) << i;
  for (int64_t i = n() + 1; i < n() + 5; ++i) EXPECT_EQ(dst[i], kSentinel) << i;

  std::vector<float> back(n() + 3, kSentinel);
  HogwildCopyTo(dst.data() + 1, back.data(), n());
  for (int64_t i = 0; i < n(); ++i) ASSERT_EQ(back[i], src[i]) << i;
  for (int64_t i = n(); i < n() + 3; ++i) EXPECT_EQ(back[i], kSentinel) << i;
}

// bf16 of x rounded to nearest, ties to even, computed the slow way: the
// two bf16 neighbours of x in double and the nearer one (the even one on a
// tie). x finite.
uint16_t ReferenceBf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);  // toward zero
  const uint16_t up = static_cast<uint16_t>(down + 1);      // away from zero
  if ((bits & 0xFFFFu) == 0) return down;
  auto value = [](uint16_t h) { return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(h) << 16)); };
  const double dd = std::abs(static_cast<double>(x) - value(down)), du = std::abs(value(up) - static_cast<double>(x));
  if (dd < du) return down;
  if (du < dd) return up;
  return (down & 1) == 0 ? down : up;
}

float FromBf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

TEST_P(HogwildKernelTest, CopiesAsBf16RoundingToNearestEven) {
  std::vector<float> src = Random(n(), 3);
  // Ties both ways, a value that rounds up into the next binade, +-0, the
  // largest float (rounds to inf) and an infinity, where n allows.
  const float special[] = {std::bit_cast<float>(0x3F808000u), std::bit_cast<float>(0x3F818000u),
                           std::bit_cast<float>(0x3FFFFFFFu), -0.0f, 0.0f,
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity(),
                           std::bit_cast<float>(0xBF80C001u)};
  for (size_t i = 0; i < std::size(special) && static_cast<int64_t>(i) < n(); ++i) src[i * 7 % n()] = special[i];
  std::vector<uint16_t> dst(n() + 4, 0xABCD);
  HogwildCopyFromAsBf16(src.data(), dst.data() + 1, n());
  EXPECT_EQ(dst[0], 0xABCD);
  for (int64_t i = 0; i < n(); ++i) {
    const uint16_t want = std::isinf(src[i]) || src[i] == std::numeric_limits<float>::max()
                              ? static_cast<uint16_t>((std::bit_cast<uint32_t>(src[i]) >> 16 & 0x8000u) | 0x7F80u)
                              : ReferenceBf16(src[i]);
    ASSERT_EQ(dst[i + 1], want) << i << ": " << src[i];
  }
  for (int64_t i = n() + 1; i < n() + 4; ++i) EXPECT_EQ(dst[i], 0xABCD) << i;
  // A NaN stays a NaN.
  if (n() > 0) {
    std::vector<float> nan(n(), std::numeric_limits<float>::quiet_NaN());
    HogwildCopyFromAsBf16(nan.data(), dst.data(), n());
    for (int64_t i = 0; i < n(); ++i) ASSERT_TRUE(std::isnan(FromBf16(dst[i]))) << i;
  }
}

// The update's bf16 copy (a fused pull of a bf16 model) is the updated f32
// parameters rounded as HogwildCopyFromAsBf16 rounds them, for every
// optimizer, and it writes nothing past n.
TEST_P(HogwildKernelTest, UpdateWritesItsCopyAsBf16) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdagrad, OptimizerType::kRmsprop, OptimizerType::kFtrl}) {
    OptimizerOptions opt;
    opt.type = type;
    opt.momentum = 0.9f;
    std::vector<float> p = Random(n(), 5), g = Random(n(), 6);
    std::vector<float> s0(n(), SlotInitialValue(opt, 0)), s1(n(), SlotInitialValue(opt, 1));
    float* slots[2] = {s0.data(), s1.data()};
    std::vector<uint16_t> copy(n() + 3, 0xABCD), want(n());
    for (int t = 1; t <= 3; ++t) {
      ApplyUpdate(opt, UpdateParams{0.05f, t}, p.data(), slots, g.data(), n(), nullptr, copy.data());
      HogwildCopyFromAsBf16(p.data(), want.data(), n());
      for (int64_t i = 0; i < n(); ++i) ASSERT_EQ(copy[i], want[i]) << OptimizerTypeName(type) << " step " << t << " " << i;
    }
    for (int64_t i = n(); i < n() + 3; ++i) EXPECT_EQ(copy[i], 0xABCD) << OptimizerTypeName(type);
  }
}

TEST_P(HogwildKernelTest, FillsExactlyN) {
  std::vector<float> dst(n() + 3, kSentinel);
  HogwildFill(0.25f, dst.data(), n());
  for (int64_t i = 0; i < n(); ++i) ASSERT_EQ(dst[i], 0.25f) << i;
  for (int64_t i = n(); i < n() + 3; ++i) EXPECT_EQ(dst[i], kSentinel) << i;
}

TEST_P(HogwildKernelTest, GathersRowsInOrderWithRepeats) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const int64_t table_rows = 20;
  const std::vector<float> table = Random(table_rows * dim, 2);
  // Repeats and a stride of several rows: each id's row lands at its position.
  const std::vector<int64_t> ids = {3, 0, 19, 3, 7, 7, 12, 1, 18, 5, 3, 11, 0, 16, 2, 9, 4};
  std::vector<const float*> rows;
  for (int64_t id : ids) rows.push_back(table.data() + id * dim);
  std::vector<float> out(ids.size() * dim + 2, kSentinel);
  HogwildGatherRows(rows.data(), static_cast<int64_t>(rows.size()), dim, out.data());
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t j = 0; j < dim; ++j) ASSERT_EQ(out[r * dim + j], table[ids[r] * dim + j]) << r << "," << j;
  }
  EXPECT_EQ(out[ids.size() * dim], kSentinel);
  EXPECT_EQ(out[ids.size() * dim + 1], kSentinel);
}

// Bags over a table of 20 rows: repeats within and across bags, an empty
// bag, one of a single id, and weights that are not 1.
struct Bags {
  std::vector<int64_t> ids = {3, 0, 19, 3, 7, 7, 12, 1, 18, 5, 3, 11, 0, 16, 2, 9, 4};
  std::vector<int64_t> offsets = {0, 3, 3, 4, 9, 12, 17};  // 6 bags
  std::vector<float> weights = {0.5f, -1.25f, 2.0f, 1.0f, 0.75f, 3.0f, -0.5f, 1.5f, 0.25f, 2.5f, -2.0f, 1.0f,
                                0.125f, 1.75f, -0.75f, 0.5f, 1.0f};
  int64_t batch() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

TEST_P(HogwildKernelTest, EmbeddingBagForwardInPlaceIsTheGatheredForward) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const Bags bags;
  const std::vector<float> table = Random(20 * dim, 3);
  std::vector<const float*> rows;
  std::vector<float> gathered;
  for (int64_t id : bags.ids) {
    rows.push_back(table.data() + id * dim);
    gathered.insert(gathered.end(), table.begin() + id * dim, table.begin() + (id + 1) * dim);
  }
  const int64_t stride = dim + 3;  // the pooled vectors sit in wider rows (z's)
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    for (const float* weights : {static_cast<const float*>(nullptr), bags.weights.data()}) {
      std::vector<float> want(bags.batch() * stride, kSentinel), got(bags.batch() * stride, kSentinel);
      EmbeddingBagForward(gathered.data(), dim, bags.offsets.data(), weights, bags.batch(), pooling, want.data(),
                          stride);
      HogwildEmbeddingBagForward(rows.data(), dim, bags.offsets.data(), weights, bags.batch(), pooling, got.data(),
                                 stride);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "pooling " << static_cast<int>(pooling) << " weights " << (weights != nullptr) << " at " << i << ": "
            << got[i] << " != " << want[i];
      }
    }
  }
}

TEST_P(HogwildKernelTest, EmbeddingBagSgdIsTheBackwardThenSgdPerOccurrence) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const Bags bags;
  const int64_t batch = bags.batch();
  const int64_t valid = batch - 1;  // the last bag is padding: its rows keep their values
  const int64_t stride = dim + 2;
  const std::vector<float> dout = Random(batch * stride, 4);
  const float lr = 0.1f, scale = 0.375f;
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    for (const float* weights : {static_cast<const float*>(nullptr), bags.weights.data()}) {
      std::vector<float> table = Random(20 * dim, 5);
      // Reference: the unfused backward's gradients, then one float SGD step
      // per occurrence in order (SgdOp's p - lr * g), and in double the
      // textbook p - lr * sum of the id's gradients.
      std::vector<float> drows(bags.ids.size() * dim);
      EmbeddingBagBackward(dout.data(), stride, dim, bags.offsets.data(), weights, batch, valid, pooling,
                           drows.data(), scale);
      std::vector<float> want = table;
      std::vector<double> textbook(table.begin(), table.end());
      for (size_t i = 0; i < static_cast<size_t>(bags.offsets[valid]); ++i) {
        for (int64_t j = 0; j < dim; ++j) {
          float& p = want[bags.ids[i] * dim + j];
          p = p - lr * drows[i * dim + j];
          textbook[bags.ids[i] * dim + j] -= static_cast<double>(lr) * drows[i * dim + j];
        }
      }
      std::vector<float*> rows;
      for (int64_t id : bags.ids) rows.push_back(table.data() + id * dim);
      HogwildEmbeddingBagSgd(rows.data(), dim, bags.offsets.data(), weights, batch, valid, pooling, dout.data(),
                             stride, scale, lr);
      for (size_t i = 0; i < table.size(); ++i) {
        ASSERT_EQ(std::memcmp(&table[i], &want[i], sizeof(float)), 0) << i << ": " << table[i] << " != " << want[i];
        ASSERT_NEAR(table[i], textbook[i], 1e-5 * (1 + std::abs(textbook[i]))) << i;
      }
      // The padding bag's ids (16, 2, 9, 4) appear nowhere else: untouched.
      const std::vector<float> initial = Random(20 * dim, 5);
      for (int64_t id : {16, 2, 9, 4}) {
        for (int64_t j = 0; j < dim; ++j) ASSERT_EQ(table[id * dim + j], initial[id * dim + j]) << id;
      }
    }
  }
}

const std::vector<std::string> kTargets = {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR", "EMU128"};

INSTANTIATE_TEST_SUITE_P(AllTargets, HogwildKernelTest,
                         ::testing::Combine(::testing::ValuesIn(kTargets), ::testing::Values(0, 1, 7, 16, 33, 1000)),
                         [](const ::testing::TestParamInfo<HogwildKernelTest::ParamType>& info) {
                           return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param));
                         });

// Two threads update and copy the same parameters at once: the race the
// design allows. The result stays finite and within what SGD on a constant
// gradient can reach; under ThreadSanitizer (halt_on_error=1) the test fails
// if the kernels' accesses were instrumented.
TEST(HogwildKernelRaceTest, ConcurrentUpdatesAndCopiesOfOneBuffer) {
  constexpr int64_t kN = 4099;
  constexpr int kSteps = 200;
  std::vector<float> params(kN, 1.0f);
  std::vector<float> acc(kN, 0.1f);
  const std::vector<float> grad(kN, 0.5f);
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdagrad;
  opt.initial_accumulator_value = 0.1f;
  auto work = [&] {
    std::vector<float> copy(kN);
    float* slots[1] = {acc.data()};
    for (int s = 0; s < kSteps; ++s) {
      ApplyUpdate(opt, UpdateParams{0.01f, s + 1}, params.data(), slots, grad.data(), kN);
      HogwildCopyFrom(params.data(), copy.data(), kN);
      for (float x : copy) ASSERT_TRUE(std::isfinite(x));
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  // Every step moves each parameter down by less than lr (|g| / sqrt(acc) < 1),
  // and at least one thread's steps all landed.
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_LT(params[i], 1.0f);
    ASSERT_GT(params[i], 1.0f - 2 * kSteps * 0.01f);
  }
}

// The fused embedding path's race: two threads pool and update the same rows
// in place at once (every bag shares ids with the other thread's). Under
// ThreadSanitizer the test fails if these kernels were instrumented.
TEST(HogwildKernelRaceTest, ConcurrentInPlaceBagForwardAndSgdOfSharedRows) {
  constexpr int64_t kDim = 16, kRows = 8, kSteps = 300;
  std::vector<float> table(kRows * kDim, 1.0f);
  const std::vector<int64_t> offsets = {0, 2, 4};
  auto work = [&](int t) {
    std::vector<float*> rows;
    for (int64_t id : {0, 1 + t, 2, 3 + t}) rows.push_back(table.data() + id * kDim);
    std::vector<float> z(2 * kDim), dz(2 * kDim, 0.5f);
    for (int s = 0; s < kSteps; ++s) {
      HogwildEmbeddingBagForward(rows.data(), kDim, offsets.data(), nullptr, 2, Pooling::kSum, z.data(), kDim);
      for (float x : z) ASSERT_TRUE(std::isfinite(x));
      HogwildEmbeddingBagSgd(rows.data(), kDim, offsets.data(), nullptr, 2, 2, Pooling::kSum, dz.data(), kDim, 1.0f,
                             0.001f);
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  // Each update moves a row by 0.0005 downwards; row 0 gets both threads'
  // (some may be lost to the race), row 1 only thread 0's, row 7 none.
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_NEAR(table[1 * kDim + j], 1.0f - kSteps * 0.0005f, 1e-4f);
    EXPECT_LE(table[0 * kDim + j], 1.0f - kSteps * 0.0005f + 1e-4f);
    EXPECT_GE(table[0 * kDim + j], 1.0f - 2 * kSteps * 0.0005f - 1e-4f);
    EXPECT_EQ(table[7 * kDim + j], 1.0f);  // no thread's
  }
}

}  // namespace
}  // namespace shardwild
