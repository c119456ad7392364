// Tests of the Hogwild kernels' copies, fills and gathers on every dispatch
// target against sequential references, and of their one permitted race:
// under ThreadSanitizer (make tsan) the concurrent test below fails if a
// kernel's loads and stores of parameter memory are instrumented.
// The optimizer kernels are tested per target in optimizer_test.cc.
#include "core/hogwild_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "core/optimizer.h"
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

}  // namespace
}  // namespace shardwild
