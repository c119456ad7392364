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

uint16_t Bf16Bits(float x) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16); }

// Stochastic rounding to bf16: every result is one of the value's two bf16
// neighbours (the truncation, or the next one away from zero), an exact
// bf16 stays as it is, and over many salts the fraction rounded away from
// zero is the value's distance from the truncation in bf16 steps: the
// rounding is unbiased.
TEST_P(HogwildKernelTest, RoundsToBf16StochasticallyAndUnbiased) {
  if (n() == 0) return;
  std::vector<float> src = Random(n(), 9);
  src[0] = 1.5f;  // exact in bf16
  std::vector<uint16_t> dst(n() + 2, 0xABCD);
  for (uint32_t salt : {1u, 2u, 77u}) {
    HogwildRoundBf16Stochastic(src.data(), dst.data(), n(), salt);
    EXPECT_EQ(dst[0], Bf16Bits(1.5f));
    for (int64_t i = 0; i < n(); ++i) {
      const uint16_t down = Bf16Bits(src[i]);
      ASSERT_TRUE(dst[i] == down || dst[i] == static_cast<uint16_t>(down + 1)) << i << ": " << src[i];
    }
    EXPECT_EQ(dst[n()], 0xABCD);
  }
  // 1 + 0.3 steps (and its negative): rounded away from zero 30% of the time.
  const float up = std::bit_cast<float>(0x3F800000u + static_cast<uint32_t>(0.3 * 65536));
  std::vector<float> same(n(), up);
  for (int64_t i = 1; i < n(); i += 2) same[i] = -up;
  int64_t away = 0, total = 0;
  for (uint32_t salt = 0; salt < 20000 / static_cast<uint32_t>(n()) + 1; ++salt) {
    HogwildRoundBf16Stochastic(same.data(), dst.data(), n(), salt * 2654435761u);
    for (int64_t i = 0; i < n(); ++i) away += dst[i] != Bf16Bits(same[i]);
    total += n();
  }
  EXPECT_NEAR(static_cast<double>(away) / static_cast<double>(total), 0.3, 0.03) << away << " of " << total;
}

// bf16 rows (HogwildUpdateRowsBf16): the slots are exactly the f32 update's
// from the widened parameters, and the parameters are that update's result
// rounded stochastically with the row's salt; widening and the row gather
// are exact.
TEST_P(HogwildKernelTest, UpdatesBf16RowsAsTheF32UpdateRoundedStochastically) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const int64_t params_bytes = (dim * 2 + 3) / 4 * 4;
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdagrad, OptimizerType::kRmsprop, OptimizerType::kFtrl}) {
    OptimizerOptions opt;
    opt.type = type;
    const int slots = NumSlots(type);
    const int64_t stride = params_bytes + slots * dim * 4;
    std::vector<char> block(3 * stride);  // three rows
    std::vector<float> f32(3 * dim * (1 + 2));  // reference rows: params, slot 0, slot 1
    const std::vector<float> init = Random(3 * dim, 11);
    for (int r = 0; r < 3; ++r) {
      uint16_t* p = reinterpret_cast<uint16_t*>(block.data() + r * stride);
      HogwildCopyFromAsBf16(init.data() + r * dim, p, dim);
      float* ref = f32.data() + r * 3 * dim;
      HogwildWidenBf16(p, ref, dim);
      for (int k = 0; k < slots; ++k) {
        float* slot = reinterpret_cast<float*>(block.data() + r * stride + params_bytes) + k * dim;
        std::fill(slot, slot + dim, SlotInitialValue(opt, k));
        std::fill(ref + (k + 1) * dim, ref + (k + 2) * dim, SlotInitialValue(opt, k));
      }
    }
    const std::vector<float> g = Random(3 * dim, 12);
    uint16_t* rows[3];
    float* ref_rows[3];
    const float* grads[3];
    const uint32_t salts[3] = {5, 6, 7};
    for (int r = 0; r < 3; ++r) {
      rows[r] = reinterpret_cast<uint16_t*>(block.data() + r * stride);
      ref_rows[r] = f32.data() + r * 3 * dim;
      grads[r] = g.data() + r * dim;
    }
    const UpdateParams up{0.05f, 1};
    ApplyUpdateRowsBf16(opt, up, rows, grads, salts, 3, dim, params_bytes);
    for (int r = 0; r < 3; ++r) {
      // The f32 reference: the same update on the widened row, one row at a
      // time (ApplyUpdate), then rounded with the row's salt.
      float* ref = ref_rows[r];
      float* ref_slots[2] = {ref + dim, ref + 2 * dim};
      ApplyUpdate(opt, up, ref, ref_slots, grads[r], dim);
      std::vector<uint16_t> want(dim);
      HogwildRoundBf16Stochastic(ref, want.data(), dim, salts[r]);
      for (int64_t j = 0; j < dim; ++j) {
        ASSERT_EQ(rows[r][j], want[j]) << OptimizerTypeName(type) << " row " << r << " element " << j;
      }
      for (int k = 0; k < slots; ++k) {
        const float* slot = reinterpret_cast<const float*>(block.data() + r * stride + params_bytes) + k * dim;
        for (int64_t j = 0; j < dim; ++j) {
          ASSERT_EQ(slot[j], ref[(k + 1) * dim + j]) << OptimizerTypeName(type) << " slot " << k << " " << j;
        }
      }
    }
    // Gather widens each row exactly.
    std::vector<float> out(3 * dim + 1, kSentinel);
    const uint16_t* const_rows[3] = {rows[2], rows[0], rows[2]};
    HogwildGatherRowsBf16(const_rows, 3, dim, out.data());
    for (int r = 0; r < 3; ++r) {
      for (int64_t j = 0; j < dim; ++j) {
        ASSERT_EQ(Bf16Bits(out[r * dim + j]), const_rows[r][j]);
        ASSERT_EQ(std::bit_cast<uint32_t>(out[r * dim + j]) & 0xFFFFu, 0u);
      }
    }
    EXPECT_EQ(out[3 * dim], kSentinel);
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

// Each row's private copy merged as a delta: shared + (local - base) in
// float, the sequential reference's operations in its order, bit for bit;
// nothing past a row changes (rows of a table spaced one row apart,
// sentinels between), nor the copies.
TEST_P(HogwildKernelTest, MergesEachRowsDelta) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const int64_t count = 9;
  std::vector<float> table(2 * count * dim + 1, kSentinel);
  const std::vector<float> start = Random(count * dim, 11);
  std::vector<float*> shared;
  for (int64_t r = 0; r < count; ++r) {
    shared.push_back(table.data() + 2 * r * dim);
    std::copy(start.begin() + r * dim, start.begin() + (r + 1) * dim, shared.back());
  }
  std::vector<float> local = Random(count * dim, 12);
  std::vector<float> base = Random(count * dim, 13);
  const std::vector<float> local0 = local, base0 = base;
  HogwildMergeRows(shared.data(), local.data(), base.data(), count, dim);
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t j = 0; j < dim; ++j) {
      const int64_t k = r * dim + j;
      const float want = start[k] + (local0[k] - base0[k]);
      ASSERT_EQ(shared[r][j], want) << r << "," << j;
      ASSERT_EQ(local[k], local0[k]) << r << "," << j;
      ASSERT_EQ(base[k], base0[k]) << r << "," << j;
      ASSERT_EQ(shared[r][dim + j], kSentinel) << "past row " << r;
    }
  }
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

// The pools one float at a time, as EmbeddingBagForward documents them: 0 +
// w_0 r_0 + w_1 r_1 + ... in float, in the entries' order, times 1 / n for
// a mean; the gaps of out_stride untouched.
std::vector<float> NaivePools(const std::vector<float>& gathered, int64_t dim, const Bags& bags, const float* weights,
                              Pooling pooling, int64_t stride) {
  std::vector<float> out(bags.batch() * stride, kSentinel);
  for (int64_t b = 0; b < bags.batch(); ++b) {
    const int64_t begin = bags.offsets[b], end = bags.offsets[b + 1];
    for (int64_t j = 0; j < dim; ++j) {
      float sum = 0.0f;
      for (int64_t i = begin; i < end; ++i) sum += (weights ? weights[i] : 1.0f) * gathered[i * dim + j];
      if (pooling == Pooling::kMean && end > begin) sum *= 1.0f / static_cast<float>(end - begin);
      out[b * stride + j] = sum;
    }
  }
  return out;
}

// Both forwards (over gathered rows and over rows in place share the
// pooling code) against the naive pools, bit for bit, on every target.
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
      const std::vector<float> want = NaivePools(gathered, dim, bags, weights, pooling, stride);
      std::vector<float> pooled(bags.batch() * stride, kSentinel), got(bags.batch() * stride, kSentinel);
      EmbeddingBagForward(gathered.data(), dim, bags.offsets.data(), weights, bags.batch(), pooling, pooled.data(),
                          stride);
      HogwildEmbeddingBagForward(rows.data(), dim, bags.offsets.data(), weights, bags.batch(), pooling, got.data(),
                                 stride);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::memcmp(&pooled[i], &want[i], sizeof(float)), 0)
            << "gathered, pooling " << static_cast<int>(pooling) << " weights " << (weights != nullptr) << " at "
            << i << ": " << pooled[i] << " != " << want[i];
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "in place, pooling " << static_cast<int>(pooling) << " weights " << (weights != nullptr) << " at "
            << i << ": " << got[i] << " != " << want[i];
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

// The bf16 in-place kernels: the forward over bf16 rows is EmbeddingBagForward
// over the widened rows, bit for bit; the fused SGD is, occurrence by
// occurrence in order, the f32 step on the widened row rounded
// stochastically with that occurrence's salt.
TEST_P(HogwildKernelTest, Bf16InPlaceBagForwardAndSgd) {
  const int64_t dim = std::max<int64_t>(n(), 1);
  const Bags bags;
  const int64_t batch = bags.batch();
  std::vector<uint16_t> table(20 * dim);
  const std::vector<float> init = Random(20 * dim, 3);
  HogwildCopyFromAsBf16(init.data(), table.data(), 20 * dim);
  std::vector<float> widened(20 * dim);
  HogwildWidenBf16(table.data(), widened.data(), 20 * dim);
  const int64_t stride = dim + 3;
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean}) {
    for (const float* weights : {static_cast<const float*>(nullptr), bags.weights.data()}) {
      std::vector<const uint16_t*> rows;
      std::vector<float> gathered;
      for (int64_t id : bags.ids) {
        rows.push_back(table.data() + id * dim);
        gathered.insert(gathered.end(), widened.begin() + id * dim, widened.begin() + (id + 1) * dim);
      }
      std::vector<float> want(batch * stride, kSentinel), got(batch * stride, kSentinel);
      EmbeddingBagForward(gathered.data(), dim, bags.offsets.data(), weights, batch, pooling, want.data(), stride);
      HogwildEmbeddingBagForwardBf16(rows.data(), dim, bags.offsets.data(), weights, batch, pooling, got.data(),
                                     stride);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << i;

      // SGD: the reference replays each occurrence on a copy.
      const int64_t valid = batch - 1;
      const std::vector<float> dout = Random(batch * stride, 4);
      std::vector<float> drows(bags.ids.size() * dim);
      EmbeddingBagBackward(dout.data(), stride, dim, bags.offsets.data(), weights, batch, valid, pooling,
                           drows.data(), 0.375f);
      std::vector<uint16_t> ref = table, live = table;
      const uint64_t seed = 12345;
      for (size_t i = 0; i < static_cast<size_t>(bags.offsets[valid]); ++i) {
        std::vector<float> v(dim);
        HogwildWidenBf16(ref.data() + bags.ids[i] * dim, v.data(), dim);
        for (int64_t j = 0; j < dim; ++j) v[j] = v[j] - 0.1f * drows[i * dim + j];
        HogwildRoundBf16Stochastic(v.data(), ref.data() + bags.ids[i] * dim, dim,
                                   BagSgdBf16Salt(seed, static_cast<int64_t>(i)));
      }
      std::vector<uint16_t*> live_rows;
      for (int64_t id : bags.ids) live_rows.push_back(live.data() + id * dim);
      HogwildEmbeddingBagSgdBf16(live_rows.data(), dim, bags.offsets.data(), weights, batch, valid, pooling,
                                 dout.data(), stride, 0.375f, 0.1f, seed);
      ASSERT_EQ(live, ref);
      for (int64_t id : {16, 2, 9, 4}) {  // the padding bag's ids: untouched
        for (int64_t j = 0; j < dim; ++j) ASSERT_EQ(live[id * dim + j], table[id * dim + j]) << id;
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

// Hot rows' race (workers/hot_rows.h): two threads each copy rows in
// (HogwildCopyFrom), change their copies and merge them back as deltas
// (HogwildMergeRows), row 0 shared by both, row 1 + t each its own. Under
// ThreadSanitizer the test fails if these kernels were instrumented; each
// merge moves a row by 0.001 (row 0 by at most both threads' merges: a
// race may lose some, never add).
TEST(HogwildKernelRaceTest, ConcurrentHotRowCopiesAndMerges) {
  constexpr int64_t kDim = 16, kRows = 4, kMerges = 300;
  std::vector<float> table(kRows * kDim, 1.0f);
  auto work = [&](int t) {
    std::vector<float*> shared = {table.data(), table.data() + (1 + t) * kDim};
    std::vector<float> local(2 * kDim), base(2 * kDim);
    for (int m = 0; m < kMerges; ++m) {
      for (int r = 0; r < 2; ++r) HogwildCopyFrom(shared[r], local.data() + r * kDim, kDim);
      base = local;
      for (float& x : local) x -= 0.001f;
      HogwildMergeRows(shared.data(), local.data(), base.data(), 2, kDim);
      for (float x : local) ASSERT_TRUE(std::isfinite(x));
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_NEAR(table[1 * kDim + j], 1.0f - kMerges * 0.001f, 1e-3f);
    EXPECT_NEAR(table[2 * kDim + j], 1.0f - kMerges * 0.001f, 1e-3f);
    EXPECT_LE(table[0 * kDim + j], 1.0f - kMerges * 0.001f + 1e-3f);
    EXPECT_GE(table[0 * kDim + j], 1.0f - 2 * kMerges * 0.001f - 1e-3f);
    EXPECT_EQ(table[3 * kDim + j], 1.0f);  // no thread's
  }
}

// The bf16 rows' race: two threads update the same bf16 rows (the batched
// update and the in-place bag SGD) and read them (gather, in-place forward)
// at once. Under ThreadSanitizer the test fails if these kernels were
// instrumented; the values stay finite and move the way the gradient says.
TEST(HogwildKernelRaceTest, ConcurrentBf16RowUpdatesAndReads) {
  constexpr int64_t kDim = 16, kRows = 8, kSteps = 300;
  constexpr int64_t kStride = kDim * 2;  // SGD: no slots
  std::vector<uint16_t> table(kRows * kDim);
  const std::vector<float> ones(kRows * kDim, 1.0f);
  HogwildCopyFromAsBf16(ones.data(), table.data(), kRows * kDim);
  OptimizerOptions opt;
  opt.type = OptimizerType::kSgd;
  const std::vector<int64_t> offsets = {0, 2, 4};
  auto work = [&](int t) {
    std::vector<uint16_t*> rows;
    for (int64_t id : {0, 1 + t, 2, 3 + t}) rows.push_back(table.data() + id * kDim);
    std::vector<float> z(2 * kDim), dz(2 * kDim, 0.5f), gathered(4 * kDim);
    const std::vector<float> g(kDim, 0.5f);
    const float* grads[2] = {g.data(), g.data()};
    const uint32_t salts[2] = {static_cast<uint32_t>(t), 99u};
    for (int s = 0; s < kSteps; ++s) {
      HogwildEmbeddingBagForwardBf16(rows.data(), kDim, offsets.data(), nullptr, 2, Pooling::kSum, z.data(), kDim);
      HogwildGatherRowsBf16(rows.data(), 4, kDim, gathered.data());
      for (float x : z) ASSERT_TRUE(std::isfinite(x));
      HogwildEmbeddingBagSgdBf16(rows.data(), kDim, offsets.data(), nullptr, 2, 2, Pooling::kSum, dz.data(), kDim,
                                 1.0f, 0.001f, static_cast<uint64_t>(s * 2 + t));
      ApplyUpdateRowsBf16(opt, UpdateParams{0.001f, s + 1}, rows.data() + 2, grads, salts, 2, kDim, kStride);
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  // Row 7 is nobody's; every touched row moved down from 1 (each step
  // subtracts 0.0005 per update in expectation) and stayed finite.
  std::vector<float> v(kRows * kDim);
  HogwildWidenBf16(table.data(), v.data(), kRows * kDim);
  for (int64_t j = 0; j < kDim; ++j) {
    EXPECT_EQ(v[7 * kDim + j], 1.0f);
    for (int64_t r : {0, 1, 2, 3, 4}) {
      EXPECT_TRUE(std::isfinite(v[r * kDim + j]));
      EXPECT_LT(v[r * kDim + j], 1.0f) << r;
    }
  }
}

}  // namespace
}  // namespace shardwild
