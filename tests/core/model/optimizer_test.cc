// Tests for the optimizer kernels against textbook double-precision
// references, slot initial values, option validation, and the learning-rate
// schedule.
#include "core/model/optimizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/model/hogwild_kernels.h"
#include "core/config/options.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

constexpr int kSteps = 5;
constexpr float kSentinel = 12345.0f;  // fills the elements past `n`, which must stay untouched

struct Case {
  std::string name;
  OptimizerOptions opt;
  // Scale of slot 1 below which errors are absolute: Adam's second moment is
  // of order g^2, FTRL's z of order g.
  double slot1_floor = 1e-3;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

OptimizerOptions Make(OptimizerType type, bool nesterov = false) {
  OptimizerOptions o;
  o.type = type;
  o.nesterov = nesterov;
  o.momentum = 0.8f;
  o.beta1 = 0.85f;
  o.beta2 = 0.99f;
  o.epsilon = 1e-3f;  // large enough that the epsilon term matters
  o.rho = 0.8f;
  o.initial_accumulator_value = 0.25f;
  return o;
}

OptimizerOptions MakeFtrl(float l1, float l2) {
  OptimizerOptions o = Make(OptimizerType::kFtrl);
  o.l1 = l1;
  o.l2 = l2;
  return o;
}

// The value slot `s` starts at, written out independently of SlotInitialValue.
double RefInitialSlot(const OptimizerOptions& o, int s) {
  const bool accumulator = o.type == OptimizerType::kAdagrad || o.type == OptimizerType::kFtrl;
  return accumulator && s == 0 ? o.initial_accumulator_value : 0.0;
}

// State of a reference run, in double.
struct RefState {
  std::vector<double> p, s0, s1;
};

// One textbook update, element by element. `t` is the 1-based step.
void RefUpdate(const OptimizerOptions& o, double lr, int64_t t, const std::vector<double>& g, RefState* st) {
  for (size_t i = 0; i < g.size(); ++i) {
    switch (o.type) {
      case OptimizerType::kSgd:
        st->p[i] -= lr * g[i];
        break;
      case OptimizerType::kMomentum: {
        double& v = st->s0[i];
        v = o.momentum * v + g[i];
        st->p[i] -= o.nesterov ? lr * (g[i] + o.momentum * v) : lr * v;
        break;
      }
      case OptimizerType::kAdam: {
        const double b1 = o.beta1, b2 = o.beta2;
        double& m = st->s0[i];
        double& v = st->s1[i];
        m = b1 * m + (1 - b1) * g[i];
        v = b2 * v + (1 - b2) * g[i] * g[i];
        const double c2 = std::sqrt(1 - std::pow(b2, t));
        const double lr_t = lr * c2 / (1 - std::pow(b1, t));
        st->p[i] -= lr_t * m / (std::sqrt(v) + static_cast<double>(o.epsilon) * c2);
        break;
      }
      case OptimizerType::kAdagrad: {
        double& a = st->s0[i];
        a += g[i] * g[i];
        st->p[i] -= lr * g[i] / (std::sqrt(a) + o.epsilon);
        break;
      }
      case OptimizerType::kRmsprop: {
        const double rho = o.rho;
        double& ms = st->s0[i];
        ms = rho * ms + (1 - rho) * g[i] * g[i];
        st->p[i] -= lr * g[i] / (std::sqrt(ms) + o.epsilon);
        break;
      }
      case OptimizerType::kFtrl: {
        // McMahan et al. 2013, Algorithm 1, with TF's 2 * l2 and beta = 0.
        double& n = st->s0[i];
        double& z = st->s1[i];
        const double sigma = (std::sqrt(n + g[i] * g[i]) - std::sqrt(n)) / lr;
        z += g[i] - sigma * st->p[i];
        n += g[i] * g[i];
        const double l1 = o.l1, l2 = o.l2;
        st->p[i] = std::abs(z) <= l1 ? 0.0 : -(z - (z > 0 ? l1 : -l1)) / (std::sqrt(n) / lr + 2 * l2);
        break;
      }
    }
  }
}

// |got - want| within `rtol` relative to max(|want|, floor).
::testing::AssertionResult Close(const char* what, int64_t i, float got, double want, double rtol, double floor) {
  if (std::abs(got - want) <= rtol * std::max(std::abs(want), floor)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << "[" << i << "]: got " << got << ", want " << want;
}

// (optimizer case, n, instruction-set target of the kernels).
class ApplyUpdateTest : public ::testing::TestWithParam<std::tuple<Case, int64_t, std::string>> {};

// Every optimizer on every dispatch target the CPU supports equals the
// double-precision textbook reference, single-threaded.
TEST_P(ApplyUpdateTest, MatchesReferenceOverSteps) {
  const OptimizerOptions& opt = std::get<0>(GetParam()).opt;
  const int64_t n = std::get<1>(GetParam());
  const std::string& target = std::get<2>(GetParam());
  const std::vector<std::string> supported = HogwildKernelTargets();
  if (std::find(supported.begin(), supported.end(), target) == supported.end()) {
    GTEST_SKIP() << "this CPU does not support " << target;
  }
  ScopedHogwildKernelTarget scoped(target);
  ASSERT_TRUE(scoped.ok());
  ASSERT_EQ(ActiveHogwildKernelTarget(), target);
  const int slots = NumSlots(opt.type);
  const double slot1_floor = std::get<0>(GetParam()).slot1_floor;
  std::mt19937 rng(static_cast<uint32_t>(n) * 31 + static_cast<uint32_t>(opt.type) * 7 + opt.nesterov);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);

  // Buffers have 3 extra elements holding a sentinel.
  std::vector<float> params(n + 3, kSentinel);
  std::vector<std::vector<float>> slot(2, std::vector<float>(n + 3, kSentinel));
  RefState ref{std::vector<double>(n), std::vector<double>(n, RefInitialSlot(opt, 0)),
               std::vector<double>(n, RefInitialSlot(opt, 1))};
  for (int64_t i = 0; i < n; ++i) {
    params[i] = dist(rng);
    ref.p[i] = params[i];
    // Slots start where a store starts them; unused ones stay 0.
    for (int s = 0; s < 2; ++s) slot[s][i] = s < slots ? SlotInitialValue(opt, s) : 0.0f;
  }
  const std::vector<float> initial = params;
  float* slot_ptrs[2] = {slot[0].data(), slot[1].data()};

  for (int t = 1; t <= kSteps; ++t) {
    // Gradients change every step, with varied magnitudes. Elements past `n`
    // are large, so reading them would show in the sentinels.
    std::vector<float> g(n + 3, 1000.0f);
    std::vector<double> gd(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = dist(rng) * (i % 3 == 0 ? 0.01f : 1.0f);
      gd[i] = g[i];
    }
    const float lr = 0.1f / t;  // a schedule: lr differs per step
    ApplyUpdate(opt, UpdateParams{lr, t}, params.data(), slot_ptrs, g.data(), n);
    RefUpdate(opt, lr, t, gd, &ref);

    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(Close("param", i, params[i], ref.p[i], 1e-6, 1.0)) << "step " << t;
      if (slots >= 1) {
        ASSERT_TRUE(Close("slot0", i, slot[0][i], ref.s0[i], 2e-6, 0.05)) << "step " << t;
      }
      if (slots >= 2) {
        ASSERT_TRUE(Close("slot1", i, slot[1][i], ref.s1[i], 2e-6, slot1_floor)) << "step " << t;
      }
    }
  }
  // Parameters moved, and nothing past `n` was touched.
  for (int64_t i = 0; i < n; ++i) EXPECT_NE(params[i], initial[i]) << i;
  for (int64_t i = n; i < n + 3; ++i) {
    EXPECT_EQ(params[i], kSentinel);
    EXPECT_EQ(slot[0][i], kSentinel);
    EXPECT_EQ(slot[1][i], kSentinel);
  }
  // Unused slots are untouched too.
  for (int s = slots; s < 2; ++s) {
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(slot[s][i], 0.0f);
  }
}

std::vector<Case> Cases() {
  return {{"sgd", Make(OptimizerType::kSgd)},
          {"momentum", Make(OptimizerType::kMomentum)},
          {"nesterov", Make(OptimizerType::kMomentum, /*nesterov=*/true)},
          {"adam", Make(OptimizerType::kAdam)},
          {"adagrad", Make(OptimizerType::kAdagrad)},
          {"rmsprop", Make(OptimizerType::kRmsprop)},
          {"ftrl", MakeFtrl(0.0f, 0.0f), 1.0},
          {"ftrl_l1_l2", MakeFtrl(0.05f, 0.1f), 1.0}};
}

// Every x86 target Highway compiles for; those this CPU lacks are skipped.
const std::vector<std::string> kTargets = {"AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR", "EMU128"};

INSTANTIATE_TEST_SUITE_P(AllOptimizers, ApplyUpdateTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()), ::testing::Values(0, 1, 63, 64, 100, 130),
                                            ::testing::ValuesIn(kTargets)),
                         [](const ::testing::TestParamInfo<ApplyUpdateTest::ParamType>& info) {
                           return std::get<0>(info.param).name + "_n" + std::to_string(std::get<1>(info.param)) +
                                  "_" + std::get<2>(info.param);
                         });

// Runs 5 updates of `opt` on `target` from fixed inputs; returns params and slots.
std::vector<float> RunOn(const std::string& target, const OptimizerOptions& opt, int64_t n) {
  ScopedHogwildKernelTarget scoped(target);
  EXPECT_TRUE(scoped.ok()) << target;
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> p(n), s0(n, SlotInitialValue(opt, 0)), s1(n, SlotInitialValue(opt, 1)), g(n);
  for (float& x : p) x = dist(rng);
  float* slots[2] = {s0.data(), s1.data()};
  for (int t = 1; t <= 5; ++t) {
    for (float& x : g) x = dist(rng) * (t == 3 ? 1e-4f : 1.0f);
    ApplyUpdate(opt, UpdateParams{0.1f / t, t}, p.data(), slots, g.data(), n);
  }
  p.insert(p.end(), s0.begin(), s0.end());
  p.insert(p.end(), s1.begin(), s1.end());
  return p;
}

// Every target computes the same bits as the portable one (no fused
// multiply-add anywhere), so runs reproduce across machines.
TEST(HogwildKernelTargetsTest, EveryTargetIsBitIdenticalToTheScalarOne) {
  const std::vector<std::string> targets = HogwildKernelTargets();
  for (const Case& c : Cases()) {
    const std::vector<float> want = RunOn(targets.back(), c.opt, 1000);
    for (const std::string& target : targets) {
      const std::vector<float> got = RunOn(target, c.opt, 1000);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << c.name << " on " << target << ", element " << i << ": " << got[i] << " vs " << want[i];
      }
    }
  }
}

// A batch of embedding rows updated in one call equals each row updated by
// ApplyUpdate, bit for bit, on every target (rows scattered, dims with tails).
TEST(ApplyUpdateFormulaTest, RowsInOneCallEqualRowByRow) {
  for (const std::string& target : HogwildKernelTargets()) {
    ScopedHogwildKernelTarget scoped(target);
    for (const Case& c : Cases()) {
      if (c.opt.type == OptimizerType::kAdam) continue;  // per-row t: row by row only
      for (int64_t dim : {1, 16, 37}) {
        const int nslots = NumSlots(c.opt.type);
        const int64_t stride = (1 + nslots) * dim + 3;  // blocks apart, as in a table
        const std::vector<int> order = {5, 0, 9, 2, 7};
        std::vector<float> batched(10 * stride), single;
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> dist(0.1f, 1.0f);
        for (float& x : batched) x = dist(rng);
        single = batched;
        std::vector<float> g(order.size() * dim);
        for (float& x : g) x = dist(rng) - 0.5f;
        std::vector<float*> rows;
        std::vector<const float*> grads;
        for (size_t r = 0; r < order.size(); ++r) {
          rows.push_back(batched.data() + order[r] * stride);
          grads.push_back(g.data() + r * dim);
          float* p = single.data() + order[r] * stride;
          float* slots[2] = {p + dim, p + 2 * dim};
          ApplyUpdate(c.opt, UpdateParams{0.05f, 1}, p, slots, g.data() + r * dim, dim);
        }
        ApplyUpdateRows(c.opt, UpdateParams{0.05f, 1}, rows.data(), grads.data(), static_cast<int64_t>(rows.size()),
                        dim);
        for (size_t i = 0; i < batched.size(); ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(batched[i]), std::bit_cast<uint32_t>(single[i]))
              << c.name << " on " << target << ", dim " << dim << ", element " << i;
        }
      }
    }
  }
}

// A slot decaying where the gradient is 0 reaches 0 instead of subnormal
// values (x86 computes those tens of times slower), on every target, and
// the caller's floating-point mode is left as it was.
TEST(ApplyUpdateFormulaTest, SubnormalsAreFlushedToZero) {
  for (const std::string& target : HogwildKernelTargets()) {
    ScopedHogwildKernelTarget scoped(target);
    OptimizerOptions adam = Make(OptimizerType::kAdam);
    adam.beta1 = 0.5f;
    std::vector<float> p(19, 0.5f), m(19, 2e-38f), v(19, 1e-6f), g(19, 0.0f);
    float* slots[2] = {m.data(), v.data()};
    ApplyUpdate(adam, UpdateParams{1e-3f, 10}, p.data(), slots, g.data(), 19);
    // 0.5 * 2e-38 = 1e-38 < FLT_MIN: flushed.
    for (float x : m) EXPECT_EQ(x, 0.0f) << target;
    // A subnormal input reads as 0: momentum's velocity stays 0.
    OptimizerOptions momentum = Make(OptimizerType::kMomentum);
    std::vector<float> vel(19, 5e-39f), p2(19, 1.0f);
    float* mslots[1] = {vel.data()};
    ApplyUpdate(momentum, UpdateParams{0.1f, 1}, p2.data(), mslots, g.data(), 19);
    for (float x : vel) EXPECT_EQ(x, 0.0f) << target;
  }
  // Outside the kernels subnormals still exist (the mode was restored).
  volatile float tiny = 2e-38f;
  volatile float half = tiny * 0.5f;
  EXPECT_GT(half, 0.0f);
}

// The fused pull writes exactly the updated parameters.
TEST(ApplyUpdateFormulaTest, FusedCopyEqualsTheUpdatedParameters) {
  for (const Case& c : Cases()) {
    std::vector<float> p(77, 0.5f), s0(77, SlotInitialValue(c.opt, 0)), s1(77, SlotInitialValue(c.opt, 1));
    std::vector<float> g(77), copy(78, kSentinel);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    float* slots[2] = {s0.data(), s1.data()};
    ApplyUpdate(c.opt, UpdateParams{0.1f, 1}, p.data(), slots, g.data(), 77, copy.data());
    for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(copy[i], p[i]) << c.name << " " << i;
    EXPECT_EQ(copy[77], kSentinel) << c.name;
    EXPECT_NE(p[1], 0.5f) << c.name;
  }
  // FTRL skips a step at lr 0, and the copy still holds the parameters.
  std::vector<float> p(5, 0.25f), s0(5, 0.1f), s1(5, 0.0f), g(5, 1.0f), copy(5, 0.0f);
  float* slots[2] = {s0.data(), s1.data()};
  ApplyUpdate(MakeFtrl(0, 0), UpdateParams{0.0f, 1}, p.data(), slots, g.data(), 5, copy.data());
  for (float x : copy) EXPECT_EQ(x, 0.25f);
}

TEST(HogwildKernelTargetsTest, BestTargetIsTheDefaultAndScalarIsCompiledIn) {
  const std::vector<std::string> targets = HogwildKernelTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(ActiveHogwildKernelTarget(), targets.front());
  // A portable fallback is always there, whatever the CPU.
  EXPECT_TRUE(targets.back() == "SCALAR" || targets.back() == "EMU128") << targets.back();
  {
    ScopedHogwildKernelTarget scoped(targets.back());
    EXPECT_EQ(ActiveHogwildKernelTarget(), targets.back());
  }
  EXPECT_EQ(ActiveHogwildKernelTarget(), targets.front());
  ScopedHogwildKernelTarget unknown("NO_SUCH_TARGET");
  EXPECT_FALSE(unknown.ok());
  EXPECT_EQ(ActiveHogwildKernelTarget(), targets.front());
}

TEST(ApplyUpdateFormulaTest, AdamFirstStepIsSignTimesLr) {
  // With zero slots and eps -> 0, Adam's first step is lr * sign(g) whatever |g| is.
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdam;
  opt.epsilon = 1e-12f;
  std::vector<float> p = {1.0f, 1.0f, 1.0f};
  std::vector<float> m(3, 0.0f), v(3, 0.0f);
  const std::vector<float> g = {1e-3f, -5.0f, 0.2f};
  float* slots[2] = {m.data(), v.data()};
  ApplyUpdate(opt, UpdateParams{0.01f, 1}, p.data(), slots, g.data(), 3);
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], 1.01f, 1e-6);
  EXPECT_NEAR(p[2], 0.99f, 1e-6);
}

// The bound in closed form, written out independently: (1-b1) / sqrt((1-b2) (1 - b1^2/b2)).
TEST(AdamMomentRatioBoundTest, ClosedFormAndItsFiniteStepForm) {
  EXPECT_NEAR(AdamMomentRatioBound(0.9f, 0.999f, 1), 0.1 / std::sqrt(0.001 * (1 - 0.81 / 0.999)), 1e-4);  // 0.9f is not 0.9
  EXPECT_NEAR(AdamMomentRatioBound(0.9f, 0.999f, 1000000), AdamMomentRatioBound(0.9f, 0.999f, 1), 0);
  EXPECT_NEAR(AdamMomentRatioBound(0.0f, 0.5f, 3), std::sqrt(2.0), 1e-6);  // m = g, v >= g^2 / 2
  // b1^2 >= b2: the sum grows with t. At t = 1, |m| = (1-b1)|g| and v = (1-b2) g^2.
  EXPECT_NEAR(AdamMomentRatioBound(0.99f, 0.9f, 1), 0.01 / std::sqrt(0.1), 1e-6);
  EXPECT_GT(AdamMomentRatioBound(0.99f, 0.9f, 50), AdamMomentRatioBound(0.99f, 0.9f, 10));
  EXPECT_TRUE(std::isinf(AdamMomentRatioBound(0.99f, 0.9f, 100000)));
  EXPECT_TRUE(std::isinf(AdamMomentRatioBound(0.9f, 0.0f, 2)));
}

// Runs one element through `grads` with ApplyUpdate and with the textbook
// update (no repair) in double; the two agree at every step.
void ExpectUntornAdamIsTextbookAdam(float b1, float b2, const std::vector<double>& grads) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdam;
  opt.beta1 = b1;
  opt.beta2 = b2;
  opt.epsilon = 1e-8f;  // the eps where a torn pair hurts most
  float p = 0.5f, m = 0.0f, v = 0.0f;
  float* slots[2] = {&m, &v};
  RefState ref{{0.5}, {0.0}, {0.0}};
  for (size_t k = 0; k < grads.size(); ++k) {
    const int64_t t = static_cast<int64_t>(k) + 1;
    const float g = static_cast<float>(grads[k]);
    ApplyUpdate(opt, UpdateParams{1e-3f, t}, &p, slots, &g, 1);
    RefUpdate(opt, 1e-3, t, {static_cast<double>(g)}, &ref);
    ASSERT_NEAR(v, ref.s1[0], 1e-4 * ref.s1[0]) << "step " << t << " b1 " << b1 << " b2 " << b2;
    ASSERT_NEAR(m, ref.s0[0], 1e-4 * std::abs(ref.s0[0]) + 1e-30) << "step " << t;
    ASSERT_NEAR(p, ref.p[0], 1e-4) << "step " << t;
  }
}

// The histories that come closest to the bound never trigger the repair:
// one gradient then zeros (m over sqrt(v) shrinks), and the Cauchy-Schwarz
// equality case, g at lag k proportional to (b1/b2)^k.
TEST(ApplyUpdateFormulaTest, AdamRepairNeverActsOnAnUntornHistory) {
  for (const auto& [b1, b2, steps] : std::vector<std::tuple<float, float, int>>{
           {0.9f, 0.999f, 300}, {0.85f, 0.99f, 200}, {0.99f, 0.9f, 40}, {0.0f, 0.5f, 20}}) {
    std::vector<double> pulse(steps, 0.0);
    pulse[0] = 0.3;
    ExpectUntornAdamIsTextbookAdam(b1, b2, pulse);
    std::vector<double> worst(steps);
    const double growth = b1 > 0 ? static_cast<double>(b2) / b1 : 1.0;
    for (int j = 0; j < steps; ++j) worst[j] = 1e-3 * std::pow(growth, j);
    ExpectUntornAdamIsTextbookAdam(b1, b2, worst);
    // How close the equality case came: within the slack of the bound.
    double m = 0, v = 0;
    for (double g : worst) {
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g * g;
    }
    if (b1 > 0) {
      EXPECT_GT(m / std::sqrt(v), 0.9 * AdamMomentRatioBound(b1, b2, steps)) << b1 << " " << b2;
    }
  }
}

// The state a Hogwild race leaves (see optimizer.h): m from one thread's store,
// v from before it. With g = 0 the textbook step is alpha * m / eps_hat, about
// 26 here; the repaired step is at most lr * c2/c1 * 1.01 B, and v is left
// consistent with m, so the following steps stay small too.
TEST(ApplyUpdateFormulaTest, AdamRepairsATornMomentPair) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdam;
  opt.epsilon = 1e-8f;
  const double lr = 1e-3, b1 = opt.beta1, b2 = opt.beta2;
  float p = 0.0f, m = 1.44e-4f, v = 0.0f;
  float* slots[2] = {&m, &v};
  const float g = 0.0f;
  double moved = 0;
  for (int64_t t = 2; t <= 40; ++t) {
    const float before = p;
    ApplyUpdate(opt, UpdateParams{static_cast<float>(lr), t}, &p, slots, &g, 1);
    const double c2 = std::sqrt(1 - std::pow(b2, t)), c1 = 1 - std::pow(b1, t);
    const double bound = AdamMomentRatioBound(opt.beta1, opt.beta2, t);
    EXPECT_LE(std::abs(p - before), lr * c2 / c1 * 1.01 * bound * (1 + 1e-5)) << "step " << t;
    EXPECT_GE(std::sqrt(v) * 1.01 * bound * (1 + 1e-5), std::abs(m)) << "step " << t;
    moved += std::abs(p - before);
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_LT(std::abs(p), 40 * lr * 8);  // without the repair: thousands
}

TEST(ApplyUpdateFormulaTest, MomentumUsesExistingVelocity) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kMomentum;
  opt.momentum = 0.5f;
  std::vector<float> p = {0.0f, 0.0f};
  std::vector<float> vel = {2.0f, -4.0f};
  const std::vector<float> g = {1.0f, 1.0f};
  float* slots[1] = {vel.data()};
  ApplyUpdate(opt, UpdateParams{0.1f, 1}, p.data(), slots, g.data(), 2);
  // v = 0.5 * v + g = (2, -1); p = -0.1 * v.
  EXPECT_FLOAT_EQ(vel[0], 2.0f);
  EXPECT_FLOAT_EQ(vel[1], -1.0f);
  EXPECT_FLOAT_EQ(p[0], -0.2f);
  EXPECT_FLOAT_EQ(p[1], 0.1f);

  opt.nesterov = true;
  p = {0.0f, 0.0f};
  vel = {2.0f, -4.0f};
  ApplyUpdate(opt, UpdateParams{0.1f, 1}, p.data(), slots, g.data(), 2);
  // p -= lr * (g + m * v) = -0.1 * (1 + 0.5 * (2, -1)).
  EXPECT_FLOAT_EQ(p[0], -0.2f);
  EXPECT_FLOAT_EQ(p[1], -0.05f);
}

TEST(ApplyUpdateFormulaTest, AdagradUsesExistingAccumulator) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdagrad;
  opt.epsilon = 1e-12f;
  std::vector<float> p = {1.0f, 1.0f};
  std::vector<float> acc = {5.0f, 12.0f};
  const std::vector<float> g = {2.0f, -2.0f};
  float* slots[1] = {acc.data()};
  ApplyUpdate(opt, UpdateParams{0.3f, 1}, p.data(), slots, g.data(), 2);
  // acc = (9, 16); p -= 0.3 * g / sqrt(acc) = 0.3 * (2/3, -2/4).
  EXPECT_FLOAT_EQ(acc[0], 9.0f);
  EXPECT_FLOAT_EQ(acc[1], 16.0f);
  EXPECT_FLOAT_EQ(p[0], 0.8f);
  EXPECT_FLOAT_EQ(p[1], 1.15f);
}

TEST(ApplyUpdateFormulaTest, RmspropDecaysMeanSquare) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kRmsprop;
  opt.rho = 0.75f;
  opt.epsilon = 1e-12f;
  std::vector<float> p = {0.0f, 0.0f};
  std::vector<float> ms = {0.0f, 4.0f};
  const std::vector<float> g = {2.0f, 4.0f};
  float* slots[1] = {ms.data()};
  ApplyUpdate(opt, UpdateParams{0.1f, 1}, p.data(), slots, g.data(), 2);
  // ms = 0.75 ms + 0.25 g^2 = (1, 7); p = -0.1 * g / sqrt(ms).
  EXPECT_FLOAT_EQ(ms[0], 1.0f);
  EXPECT_FLOAT_EQ(ms[1], 7.0f);
  EXPECT_FLOAT_EQ(p[0], -0.2f);
  EXPECT_FLOAT_EQ(p[1], static_cast<float>(-0.4 / std::sqrt(7.0)));
}

TEST(ApplyUpdateFormulaTest, FtrlWorkedExample) {
  OptimizerOptions opt;
  opt.type = OptimizerType::kFtrl;
  opt.l1 = 0.25f;
  opt.l2 = 0.5f;
  // Element 0: n 16 -> 25, sigma = (5 - 4) / 0.5 = 2, z = 0 + 3 - 2 * 1 = 1,
  //   p = -(1 - 0.25) / (5 / 0.5 + 2 * 0.5) = -0.75 / 11.
  // Element 1: the mirror image.
  // Element 2: g = 0 leaves n, and |z| = 0.1 <= l1 clips p to exactly 0.
  std::vector<float> p = {1.0f, -1.0f, 0.7f};
  std::vector<float> n = {16.0f, 16.0f, 16.0f};
  std::vector<float> z = {0.0f, 0.0f, 0.1f};
  const std::vector<float> g = {3.0f, -3.0f, 0.0f};
  float* slots[2] = {n.data(), z.data()};
  ApplyUpdate(opt, UpdateParams{0.5f, 1}, p.data(), slots, g.data(), 3);
  EXPECT_FLOAT_EQ(n[0], 25.0f);
  EXPECT_FLOAT_EQ(n[1], 25.0f);
  EXPECT_FLOAT_EQ(n[2], 16.0f);
  EXPECT_FLOAT_EQ(z[0], 1.0f);
  EXPECT_FLOAT_EQ(z[1], -1.0f);
  EXPECT_FLOAT_EQ(z[2], 0.1f);
  EXPECT_FLOAT_EQ(p[0], -0.75f / 11);
  EXPECT_FLOAT_EQ(p[1], 0.75f / 11);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_FALSE(std::signbit(p[2]));  // +0, as TF gives

  // A zero learning rate (the end of a schedule to 0) changes nothing.
  ApplyUpdate(opt, UpdateParams{0.0f, 2}, p.data(), slots, g.data(), 3);
  EXPECT_FLOAT_EQ(n[0], 25.0f);
  EXPECT_FLOAT_EQ(z[0], 1.0f);
  EXPECT_FLOAT_EQ(p[0], -0.75f / 11);
}

TEST(NumSlotsTest, PerOptimizer) {
  EXPECT_EQ(NumSlots(OptimizerType::kSgd), 0);
  EXPECT_EQ(NumSlots(OptimizerType::kMomentum), 1);
  EXPECT_EQ(NumSlots(OptimizerType::kAdam), 2);
  EXPECT_EQ(NumSlots(OptimizerType::kAdagrad), 1);
  EXPECT_EQ(NumSlots(OptimizerType::kRmsprop), 1);
  EXPECT_EQ(NumSlots(OptimizerType::kFtrl), 2);
}

// UsesStepCount says exactly which updates depend on the step: the same
// state and gradient at step 1 and at step 5 give different parameters for
// those, the same for the others.
TEST(UsesStepCountTest, ExactlyTheUpdatesThatReadTheStep) {
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kMomentum, OptimizerType::kAdam,
                             OptimizerType::kAdagrad, OptimizerType::kRmsprop, OptimizerType::kFtrl}) {
    OptimizerOptions opt;
    opt.type = type;
    opt.initial_accumulator_value = 0.1f;
    std::vector<float> params[2];
    for (int k = 0; k < 2; ++k) {
      params[k] = {0.5f, -0.25f, 1.0f};
      std::vector<std::vector<float>> slot_data(NumSlots(type), std::vector<float>(3));
      std::vector<float*> slots;
      for (int s = 0; s < NumSlots(type); ++s) {
        std::fill(slot_data[s].begin(), slot_data[s].end(), s == 0 ? 0.2f : 0.05f);
        slots.push_back(slot_data[s].data());
      }
      const std::vector<float> g = {0.3f, -0.6f, 0.9f};
      ApplyUpdate(opt, UpdateParams{0.1f, k == 0 ? 1 : 5}, params[k].data(), slots.data(), g.data(), 3);
    }
    EXPECT_EQ(params[0] != params[1], UsesStepCount(type)) << OptimizerTypeName(type);
  }
}

TEST(SlotInitialValueTest, AccumulatorsStartAtInitialAccumulatorValue) {
  OptimizerOptions o;
  o.initial_accumulator_value = 0.3f;
  for (OptimizerType type : {OptimizerType::kAdagrad, OptimizerType::kFtrl}) {
    o.type = type;
    EXPECT_EQ(SlotInitialValue(o, 0), 0.3f) << OptimizerTypeName(type);
  }
  EXPECT_EQ(SlotInitialValue(o, 1), 0.0f);  // ftrl's z
  for (OptimizerType type : {OptimizerType::kMomentum, OptimizerType::kAdam, OptimizerType::kRmsprop}) {
    o.type = type;
    for (int s = 0; s < NumSlots(type); ++s) EXPECT_EQ(SlotInitialValue(o, s), 0.0f) << OptimizerTypeName(type) << s;
  }
  // The default is TF's 0.1.
  EXPECT_EQ(OptimizerOptions().initial_accumulator_value, 0.1f);
}

TEST(OptimizerOptionsTest, ValidateNamesTheNewKeys) {
  const auto message_of = [](void (*edit)(OptimizerOptions*)) {
    OptimizerOptions o;
    edit(&o);
    return std::string(o.Validate().message());
  };
  EXPECT_TRUE(OptimizerOptions().Validate().ok());
  EXPECT_NE(message_of([](OptimizerOptions* o) { o->rho = 1.0f; }).find("optimizer.rho"), std::string::npos);
  EXPECT_NE(message_of([](OptimizerOptions* o) { o->rho = -0.1f; }).find("optimizer.rho"), std::string::npos);
  EXPECT_NE(message_of([](OptimizerOptions* o) { o->l1 = -1.0f; }).find("optimizer.l1"), std::string::npos);
  EXPECT_NE(message_of([](OptimizerOptions* o) { o->l2 = -1.0f; }).find("optimizer.l2"), std::string::npos);
  EXPECT_NE(message_of([](OptimizerOptions* o) { o->initial_accumulator_value = -0.1f; })
                .find("optimizer.initial_accumulator_value"),
            std::string::npos);
  // Adagrad has epsilon to divide by; FTRL needs a positive accumulator.
  OptimizerOptions o;
  o.initial_accumulator_value = 0.0f;
  o.type = OptimizerType::kAdagrad;
  EXPECT_TRUE(o.Validate().ok());
  o.type = OptimizerType::kFtrl;
  EXPECT_NE(o.Validate().message().find("optimizer.initial_accumulator_value"), std::string::npos);
}

TEST(LrAtTest, Constant) {
  OptimizerOptions o;
  o.lr = 0.05f;
  o.final_lr = 0.001f;  // ignored by the constant schedule
  o.schedule = LrSchedule::kConstant;
  for (double p : {0.0, 0.25, 0.5, 1.0}) EXPECT_FLOAT_EQ(o.LrAt(p), 0.05f) << p;
}

TEST(LrAtTest, Cosine) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.final_lr = 0.02f;
  o.schedule = LrSchedule::kCosine;
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(0.5), 0.06f);
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.02f);
  // A quarter of the way: final + (lr - final) * (1 + cos(pi/4)) / 2.
  EXPECT_NEAR(o.LrAt(0.25), 0.02 + 0.08 * (1 + std::cos(M_PI / 4)) / 2, 1e-7);
  // Decreasing over the run.
  float prev = o.LrAt(0.0);
  for (int i = 1; i <= 20; ++i) {
    const float cur = o.LrAt(i / 20.0);
    EXPECT_LT(cur, prev) << i;
    prev = cur;
  }
  // Default final_lr is 0.
  o.final_lr = 0.0f;
  EXPECT_NEAR(o.LrAt(1.0), 0.0f, 1e-9);
  EXPECT_FLOAT_EQ(o.LrAt(0.5), 0.05f);
}


// Step decay (TF ExponentialDecay, staircase): lr * rate^floor(p / every).
TEST(LrAtTest, Step) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.schedule = LrSchedule::kStep;
  o.decay_rate = 0.5f;
  o.decay_every = 0.25;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(0.2499), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(0.25), 0.05f);    // 0.1 * 0.5^1
  EXPECT_FLOAT_EQ(o.LrAt(0.6), 0.025f);    // 0.1 * 0.5^2
  EXPECT_FLOAT_EQ(o.LrAt(0.99), 0.0125f);  // 0.1 * 0.5^3
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.00625f);  // 0.1 * 0.5^4, after the last step
  // decay_rate 1 is a constant rate.
  o.decay_rate = 1.0f;
  EXPECT_FLOAT_EQ(o.LrAt(0.9), 0.1f);
}

// A period of k epochs (k / E of the run) decays exactly when the trainer
// starts epoch k+1, 2k+1, ..., although (e-1)/E / (k/E) rounds below a whole
// number (0.3 / 0.1 = 2.9999999999999996).
TEST(LrAtTest, StepLandsOnEpochBoundaries) {
  for (int epochs : {3, 7, 10, 30, 90}) {
    for (int k = 1; k <= epochs; ++k) {
      OptimizerOptions o;
      o.lr = 1.0f;
      o.schedule = LrSchedule::kStep;
      o.decay_rate = 0.5f;
      o.decay_every = static_cast<double>(k) / epochs;  // what decay_epochs: k gives
      for (int e = 1; e <= epochs; ++e) {
        const double progress = static_cast<double>(e - 1) / epochs;  // as the trainer computes it
        const int decays = (e - 1) / k;
        ASSERT_FLOAT_EQ(o.LrAt(progress), std::pow(0.5f, decays)) << epochs << " epochs, every " << k << ", epoch " << e;
        // And not earlier: the last step of the previous epoch.
        if (e > 1) {
          const int before = (e - 2) / k;
          ASSERT_FLOAT_EQ(o.LrAt(progress - 1e-6), std::pow(0.5f, before)) << epochs << " " << k << " " << e;
        }
      }
    }
  }
}

// Linear warmup: start + (lr - start) * p / W for p < W, then the schedule
// over what is left of the run.
TEST(LrAtTest, WarmupThenConstant) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.warmup = 0.1;
  o.warmup_start_lr = 0.01f;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.01f);
  EXPECT_FLOAT_EQ(o.LrAt(0.05), 0.01f + (0.1f - 0.01f) * 0.5f);  // 0.055
  EXPECT_FLOAT_EQ(o.LrAt(0.025), 0.01f + (0.1f - 0.01f) * 0.25f);
  EXPECT_FLOAT_EQ(o.LrAt(0.1), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(0.5), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.1f);
  // Default start: 0.
  o.warmup_start_lr = 0.0f;
  EXPECT_EQ(o.LrAt(0.0), 0.0f);
  EXPECT_FLOAT_EQ(o.LrAt(0.05), 0.05f);
}

TEST(LrAtTest, WarmupThenCosine) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.final_lr = 0.02f;
  o.schedule = LrSchedule::kCosine;
  o.warmup = 0.2;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.0f);
  EXPECT_FLOAT_EQ(o.LrAt(0.1), 0.05f);  // half the warmup
  EXPECT_FLOAT_EQ(o.LrAt(0.2), 0.1f);   // the cosine starts at lr ...
  EXPECT_FLOAT_EQ(o.LrAt(0.6), 0.06f);  // ... is half-way at (0.2 + 1) / 2 ...
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.02f);  // ... and ends at final_lr
  // q = (p - W) / (1 - W); final + (lr - final) * (1 + cos(pi q)) / 2.
  const double q = (0.4 - 0.2) / (1 - 0.2);  // 0.25
  EXPECT_NEAR(o.LrAt(0.4), 0.02 + 0.08 * (1 + std::cos(M_PI * q)) / 2, 1e-7);
}

TEST(LrAtTest, WarmupThenStep) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.schedule = LrSchedule::kStep;
  o.decay_rate = 0.5f;
  o.decay_every = 0.25;
  o.warmup = 0.2;
  o.warmup_start_lr = 0.02f;
  ASSERT_TRUE(o.Validate().ok()) << o.Validate();
  EXPECT_FLOAT_EQ(o.LrAt(0.0), 0.02f);
  EXPECT_FLOAT_EQ(o.LrAt(0.1), 0.06f);
  // Periods are counted from the end of the warmup: t = p - W.
  EXPECT_FLOAT_EQ(o.LrAt(0.2), 0.1f);
  EXPECT_FLOAT_EQ(o.LrAt(0.44), 0.1f);     // t = 0.24
  EXPECT_FLOAT_EQ(o.LrAt(0.45), 0.05f);    // t = 0.25
  EXPECT_FLOAT_EQ(o.LrAt(0.7), 0.025f);    // t = 0.5
  EXPECT_FLOAT_EQ(o.LrAt(0.95), 0.0125f);  // t = 0.75
  EXPECT_FLOAT_EQ(o.LrAt(1.0), 0.0125f);   // t = 0.8
}

TEST(LrAtTest, WarmupRisesMonotonicallyToLr) {
  for (LrSchedule schedule : {LrSchedule::kConstant, LrSchedule::kCosine, LrSchedule::kStep}) {
    OptimizerOptions o;
    o.lr = 0.3f;
    o.final_lr = 0.01f;
    o.schedule = schedule;
    o.decay_every = 0.1;
    o.warmup = 0.3;
    o.warmup_start_lr = 0.001f;
    ASSERT_TRUE(o.Validate().ok()) << o.Validate();
    float prev = o.LrAt(0.0);
    EXPECT_FLOAT_EQ(prev, 0.001f);
    for (int i = 1; i <= 300; ++i) {
      const float cur = o.LrAt(0.3 * i / 300.0);
      EXPECT_GT(cur, prev) << static_cast<int>(schedule) << " " << i;
      EXPECT_LE(cur, 0.3f);
      prev = cur;
    }
    EXPECT_FLOAT_EQ(prev, 0.3f);  // reaches lr exactly at the end of the warmup
    EXPECT_NEAR(o.LrAt(0.3 - 1e-9), 0.3f, 1e-6);  // and is continuous there
  }
}

TEST(LrAtTest, ClampsProgress) {
  OptimizerOptions o;
  o.lr = 0.1f;
  o.schedule = LrSchedule::kStep;
  o.decay_every = 0.5;
  o.warmup = 0.1;
  EXPECT_EQ(o.LrAt(-1.0), o.LrAt(0.0));
  EXPECT_EQ(o.LrAt(2.0), o.LrAt(1.0));
}

TEST(OptimizerOptionsTest, ValidateScheduleKeys) {
  const auto message_of = [](void (*edit)(OptimizerOptions*)) {
    OptimizerOptions o;
    edit(&o);
    return std::string(o.Validate().message());
  };
  const OptimizerOptions defaults;
  EXPECT_EQ(defaults.decay_rate, 0.1f);
  EXPECT_EQ(defaults.decay_every, 0.0);
  EXPECT_EQ(defaults.warmup, 0.0);
  EXPECT_EQ(defaults.warmup_start_lr, 0.0f);
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->decay_rate = 2.0f; }),
            "optimizer.decay_rate: must be in (0, 1], got 2");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->decay_rate = 0.0f; }),
            "optimizer.decay_rate: must be in (0, 1], got 0");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->decay_rate = std::nanf(""); }).rfind("optimizer.decay_rate:", 0),
            0u);
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->decay_every = 1.5; }),
            "optimizer.decay_every: must be in (0, 1] (a fraction of the run), got 1.5");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->decay_every = -0.25; }),
            "optimizer.decay_every: must be in (0, 1] (a fraction of the run), got -0.25");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->schedule = LrSchedule::kStep; }),
            "optimizer.decay_every: is required with schedule step (a fraction of the run in (0, 1]; or give "
            "optimizer.decay_epochs)");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->warmup = 1.0; }),
            "optimizer.warmup: must be in [0, 1) (a fraction of the run), got 1");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->warmup = -0.1; }),
            "optimizer.warmup: must be in [0, 1) (a fraction of the run), got -0.1");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->warmup_start_lr = 0.5f; }),
            "optimizer.warmup_start_lr: must be in [0, lr], got 0.5");
  EXPECT_EQ(message_of([](OptimizerOptions* o) { o->warmup_start_lr = -0.5f; }),
            "optimizer.warmup_start_lr: must be in [0, lr], got -0.5");
  // Valid combinations.
  EXPECT_EQ(message_of([](OptimizerOptions* o) {
              o->schedule = LrSchedule::kStep;
              o->decay_every = 1.0;
              o->decay_rate = 1.0f;
              o->warmup = 0.5;
              o->warmup_start_lr = o->lr;
            }),
            "");
}

}  // namespace
}  // namespace shardwild
