// Tests for DenseLayer (every activation), SoftmaxCrossEntropy and the
// dense-only Model (an MLP): forward values against a double-precision
// reference, and gradients against central finite differences of a scalar
// loss.
#include "core/model/layers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/data/dataset.h"
#include "core/base/cpu_features.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/model.h"
#include "core/config/options.h"
#include "core/model/variable.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace shardwild {

// Names test parameters in gtest output (found by argument-dependent lookup).
void PrintTo(Activation a, std::ostream* os) { *os << ActivationName(a); }

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> Uniform(std::mt19937* rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(*rng);
  return v;
}

// Succeeds if every |analytic - numeric| <= rtol * max(|analytic|, |numeric|) + atol,
// and the whole vectors agree to a relative L2 error below rtol.
::testing::AssertionResult GradientsAgree(const std::string& what, const std::vector<double>& analytic,
                                          const std::vector<double>& numeric, double rtol, double atol) {
  if (analytic.size() != numeric.size()) {
    return ::testing::AssertionFailure() << what << ": sizes differ";
  }
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    const double a = analytic[i], n = numeric[i];
    if (!std::isfinite(a) || std::abs(a - n) > rtol * std::max(std::abs(a), std::abs(n)) + atol) {
      return ::testing::AssertionFailure() << what << "[" << i << "]: analytic " << a << " vs numeric " << n;
    }
    diff2 += (a - n) * (a - n);
    norm2 += std::max(a * a, n * n);
  }
  if (norm2 > 0 && std::sqrt(diff2 / norm2) > rtol) {
    return ::testing::AssertionFailure() << what << ": relative L2 error " << std::sqrt(diff2 / norm2);
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> ToDouble(const float* p, size_t n) { return std::vector<double>(p, p + n); }

// ---------------------------------------------------------------------------
// DenseLayer

// Buffers of one dense layer, owned by the test at fixed addresses.
struct DenseData {
  int64_t batch, in, out;
  std::vector<float> x, y, w, b, dy, dx, dw, db;
  std::vector<float> r;  // fixed random weights of the loss L = sum(y * r)

  DenseData(int64_t batch_size, int64_t in_width, int64_t out_width)
      : batch(batch_size), in(in_width), out(out_width), y(batch * out, kNaN), dy(batch * out),
        dx(batch * in, kNaN), dw(in * out, kNaN), db(out, kNaN) {}

  // Sets dL/dy in place (the layer holds the buffer's address).
  void SetDy(const std::vector<float>& g) { std::copy(g.begin(), g.end(), dy.begin()); }

  DenseLayer::Buffers Buffers(bool with_dx) {
    DenseLayer::Buffers buf;
    buf.x = x.data();
    buf.y = y.data();
    buf.w = w.data();
    buf.b = b.data();
    buf.dy = dy.data();
    buf.dx = with_dx ? dx.data() : nullptr;
    buf.dw = dw.data();
    buf.db = db.data();
    return buf;
  }

  // Pre-activation z = x W + b in double.
  std::vector<double> RefPreActivation() const {
    std::vector<double> z(batch * out);
    for (int64_t row = 0; row < batch; ++row) {
      for (int64_t o = 0; o < out; ++o) {
        double s = b[o];
        for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[row * in + i]) * w[i * out + o];
        z[row * out + o] = s;
      }
    }
    return z;
  }

  double Loss() const {
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(y[i]) * r[i];
    return l;
  }
};

// The activation and its derivative at the pre-activation z, in double.
double RefActivation(Activation act, double z) {
  switch (act) {
    case Activation::kNone: return z;
    case Activation::kRelu: return std::max(z, 0.0);
    case Activation::kSigmoid: return 1.0 / (1.0 + std::exp(-z));
    case Activation::kTanh: return std::tanh(z);
  }
  return std::numeric_limits<double>::quiet_NaN();
}
double RefActivationDerivative(Activation act, double z) {
  switch (act) {
    case Activation::kNone: return 1.0;
    case Activation::kRelu: return z > 0 ? 1.0 : 0.0;
    case Activation::kSigmoid: {
      const double s = RefActivation(act, z);
      return s * (1 - s);
    }
    case Activation::kTanh: {
      const double t = std::tanh(z);
      return 1 - t * t;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Random data whose pre-activations all lie at least `margin` away from the
// ReLU kink, so that a finite-difference step of 1e-2 never crosses it.
DenseData MakeDenseData(int64_t batch, int64_t in, int64_t out, double margin) {
  for (uint32_t seed = 1;; ++seed) {
    std::mt19937 rng(seed);
    DenseData d(batch, in, out);
    d.x = Uniform(&rng, batch * in, -1, 1);
    d.w = Uniform(&rng, in * out, -1, 1);
    d.b = Uniform(&rng, out, -0.5, 0.5);
    d.r = Uniform(&rng, batch * out, -1, 1);
    bool ok = true;
    int positive = 0;
    for (double z : d.RefPreActivation()) {
      ok = ok && std::abs(z) >= margin;
      positive += z > 0;
    }
    // Both signs must occur so that the ReLU mask is exercised.
    if ((ok && positive > 0 && positive < batch * out) || seed == 100000) {
      if (seed == 100000) ADD_FAILURE() << "no seed keeps the pre-activations off the kink";
      return d;
    }
  }
}

class DenseLayerTest : public ::testing::TestWithParam<Activation> {
 protected:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

TEST_P(DenseLayerTest, ForwardMatchesReference) {
  const Activation act = GetParam();
  DenseData d = MakeDenseData(3, 7, 5, 0.0);
  absl::StatusOr<std::unique_ptr<DenseLayer>> layer = DenseLayer::Create(engine_, 3, 7, 5, act, d.Buffers(true));
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ((*layer)->in(), 7);
  EXPECT_EQ((*layer)->out(), 5);
  (*layer)->Forward(stream_);
  const std::vector<double> z = d.RefPreActivation();
  for (size_t i = 0; i < z.size(); ++i) {
    const double want = RefActivation(act, z[i]);
    EXPECT_NEAR(d.y[i], want, 1e-5 * (1 + std::abs(want))) << "y[" << i << "]";
  }
}

TEST_P(DenseLayerTest, GradientsMatchFiniteDifferences) {
  const Activation act = GetParam();
  constexpr double kEps = 1e-2;
  DenseData d = MakeDenseData(3, 7, 5, 0.05);
  auto layer = DenseLayer::Create(engine_, d.batch, d.in, d.out, act, d.Buffers(true));
  ASSERT_TRUE(layer.ok()) << layer.status();
  DenseLayer& l = **layer;

  l.Forward(stream_);
  d.SetDy(d.r);  // dL/dy
  l.Backward(stream_);
  const std::vector<double> dw = ToDouble(d.dw.data(), d.dw.size());
  const std::vector<double> db = ToDouble(d.db.data(), d.db.size());
  const std::vector<double> dx = ToDouble(d.dx.data(), d.dx.size());

  // Central differences, perturbing each buffer in place.
  auto numeric = [&](std::vector<float>* buf) {
    std::vector<double> g(buf->size());
    for (size_t i = 0; i < buf->size(); ++i) {
      const float saved = (*buf)[i];
      (*buf)[i] = static_cast<float>(saved + kEps);
      l.Forward(stream_);
      const double lp = d.Loss();
      (*buf)[i] = static_cast<float>(saved - kEps);
      l.Forward(stream_);
      const double lm = d.Loss();
      (*buf)[i] = saved;
      g[i] = (lp - lm) / (2 * kEps);
    }
    return g;
  };
  EXPECT_TRUE(GradientsAgree("dW", dw, numeric(&d.w), 1e-2, 1e-4));
  EXPECT_TRUE(GradientsAgree("db", db, numeric(&d.b), 1e-2, 1e-4));
  EXPECT_TRUE(GradientsAgree("dx", dx, numeric(&d.x), 1e-2, 1e-4));

  // The same gradients from the closed form in double, to a tight tolerance.
  const std::vector<double> z = d.RefPreActivation();
  std::vector<double> g(z.size());
  for (size_t i = 0; i < z.size(); ++i) g[i] = RefActivationDerivative(act, z[i]) * d.r[i];
  std::vector<double> ref_dw(d.in * d.out, 0.0), ref_db(d.out, 0.0), ref_dx(d.batch * d.in, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t o = 0; o < d.out; ++o) {
      const double go = g[r * d.out + o];
      ref_db[o] += go;
      for (int64_t i = 0; i < d.in; ++i) {
        ref_dw[i * d.out + o] += static_cast<double>(d.x[r * d.in + i]) * go;
        ref_dx[r * d.in + i] += static_cast<double>(d.w[i * d.out + o]) * go;
      }
    }
  }
  EXPECT_TRUE(GradientsAgree("dW (closed form)", dw, ref_dw, 1e-5, 1e-6));
  EXPECT_TRUE(GradientsAgree("db (closed form)", db, ref_db, 1e-5, 1e-6));
  EXPECT_TRUE(GradientsAgree("dx (closed form)", dx, ref_dx, 1e-5, 1e-6));
}

TEST_P(DenseLayerTest, BackwardOverwritesGradients) {
  DenseData d = MakeDenseData(4, 3, 6, 0.0);
  auto layer = DenseLayer::Create(engine_, d.batch, d.in, d.out, GetParam(), d.Buffers(true));
  ASSERT_TRUE(layer.ok()) << layer.status();
  (*layer)->Forward(stream_);
  d.SetDy(d.r);
  (*layer)->Backward(stream_);
  const std::vector<float> dw1 = d.dw, db1 = d.db, dx1 = d.dx;
  for (float v : dw1) ASSERT_TRUE(std::isfinite(v));
  for (float v : db1) ASSERT_TRUE(std::isfinite(v));
  for (float v : dx1) ASSERT_TRUE(std::isfinite(v));
  // A second backward pass with the same dL/dy gives the same gradients: they
  // are overwritten, not accumulated.
  std::fill(d.dw.begin(), d.dw.end(), 100.0f);
  std::fill(d.db.begin(), d.db.end(), 100.0f);
  std::fill(d.dx.begin(), d.dx.end(), 100.0f);
  d.SetDy(d.r);
  (*layer)->Backward(stream_);
  EXPECT_EQ(d.dw, dw1);
  EXPECT_EQ(d.db, db1);
  EXPECT_EQ(d.dx, dx1);
}

// x rounded to bf16 (to nearest even, as the pull and oneDNN's reorders
// round), as a double.
double RoundBf16(float x) {
  uint16_t h = 0;
  HogwildCopyFromAsBf16(&x, &h, 1);
  return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(h) << 16));
}

// model.precision bf16: the layer is the f32 layer's formula on x, W and
// dL/d(pre-activation) rounded to bf16, accumulated without further
// rounding (tight tolerances), and the bias, y, dx, dW and db stay f32.
TEST_P(DenseLayerTest, Bf16IsTheFormulaOnRoundedOperands) {
  if (!DetectCpuFeatures().bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16 or AMX_BF16";
  const Activation act = GetParam();
  DenseData d = MakeDenseData(16, 40, 24, 0.0);
  auto layer = DenseLayer::Create(engine_, d.batch, d.in, d.out, act, d.Buffers(true), Precision::kBf16);
  ASSERT_TRUE(layer.ok()) << layer.status();
  DenseLayer& l = **layer;
  EXPECT_EQ(l.precision(), Precision::kBf16);
  EXPECT_TRUE(l.forward_impl().find("bf16") != std::string::npos || l.forward_impl().find("amx") != std::string::npos)
      << l.forward_impl();
  l.Forward(stream_);
  std::vector<double> z(d.batch * d.out);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t o = 0; o < d.out; ++o) {
      double s = d.b[o];
      for (int64_t i = 0; i < d.in; ++i) s += RoundBf16(d.x[r * d.in + i]) * RoundBf16(d.w[i * d.out + o]);
      z[r * d.out + o] = s;
    }
  }
  for (size_t i = 0; i < z.size(); ++i) {
    const double want = RefActivation(act, z[i]);
    ASSERT_NEAR(d.y[i], want, 1e-5 * (1 + std::abs(want))) << "y[" << i << "]";
  }
  // dL/d(pre-activation) as the layer forms it in float from y, then rounded.
  std::vector<float> g(d.y.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const float y = d.y[i], r = d.r[i];
    switch (act) {
      case Activation::kNone: g[i] = r; break;
      case Activation::kRelu: g[i] = y > 0.0f ? r : 0.0f; break;
      case Activation::kSigmoid: g[i] = r * (y * (1.0f - y)); break;
      case Activation::kTanh: g[i] = r * (1.0f - y * y); break;
    }
  }
  d.SetDy(d.r);
  l.Backward(stream_);
  std::vector<double> ref_dw(d.in * d.out, 0.0), ref_db(d.out, 0.0), ref_dx(d.batch * d.in, 0.0);
  for (int64_t r = 0; r < d.batch; ++r) {
    for (int64_t o = 0; o < d.out; ++o) {
      const double gr = RoundBf16(g[r * d.out + o]);
      ref_db[o] += g[r * d.out + o];  // the bias gradient from the f32 one
      for (int64_t i = 0; i < d.in; ++i) {
        ref_dw[i * d.out + o] += RoundBf16(d.x[r * d.in + i]) * gr;
        ref_dx[r * d.in + i] += RoundBf16(d.w[i * d.out + o]) * gr;
      }
    }
  }
  EXPECT_TRUE(GradientsAgree("dW", ToDouble(d.dw.data(), d.dw.size()), ref_dw, 1e-5, 1e-6));
  EXPECT_TRUE(GradientsAgree("db", ToDouble(d.db.data(), d.db.size()), ref_db, 1e-5, 1e-6));
  EXPECT_TRUE(GradientsAgree("dx", ToDouble(d.dx.data(), d.dx.size()), ref_dx, 1e-5, 1e-6));

  // And within bf16's precision of the f32 layer on the same data.
  DenseData f = d;
  auto f32 = DenseLayer::Create(engine_, f.batch, f.in, f.out, act, f.Buffers(true));
  ASSERT_TRUE(f32.ok()) << f32.status();
  (*f32)->Forward(stream_);
  f.SetDy(f.r);
  (*f32)->Backward(stream_);
  EXPECT_TRUE(GradientsAgree("y vs f32", ToDouble(d.y.data(), d.y.size()), ToDouble(f.y.data(), f.y.size()), 3e-2, 3e-2));
  EXPECT_TRUE(GradientsAgree("dW vs f32", ToDouble(d.dw.data(), d.dw.size()), ToDouble(f.dw.data(), f.dw.size()), 3e-2, 3e-2));
}

// Weights the caller already holds in bf16 (the pull's rounding) give the
// very bits of the layer rounding W itself (oneDNN's reorder).
TEST_P(DenseLayerTest, Bf16CallerWeightsEqualTheLayersOwnRounding) {
  if (!DetectCpuFeatures().bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16 or AMX_BF16";
  DenseData a = MakeDenseData(8, 33, 17, 0.0);
  DenseData b = a;
  std::vector<uint16_t> w16(b.w.size());
  HogwildCopyFromAsBf16(b.w.data(), w16.data(), static_cast<int64_t>(w16.size()));
  std::fill(b.w.begin(), b.w.end(), kNaN);  // not read when w16 is given
  DenseLayer::Buffers bb = b.Buffers(true);
  bb.w16 = w16.data();
  auto la = DenseLayer::Create(engine_, a.batch, a.in, a.out, GetParam(), a.Buffers(true), Precision::kBf16);
  auto lb = DenseLayer::Create(engine_, b.batch, b.in, b.out, GetParam(), bb, Precision::kBf16);
  ASSERT_TRUE(la.ok()) << la.status();
  ASSERT_TRUE(lb.ok()) << lb.status();
  (*la)->Forward(stream_);
  (*lb)->Forward(stream_);
  a.SetDy(a.r);
  b.SetDy(b.r);
  (*la)->Backward(stream_);
  (*lb)->Backward(stream_);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.db, b.db);
}

INSTANTIATE_TEST_SUITE_P(Activations, DenseLayerTest,
                         ::testing::Values(Activation::kNone, Activation::kRelu, Activation::kSigmoid,
                                           Activation::kTanh),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return std::string(ActivationName(info.param));
                         });

TEST(DenseLayerReluTest, BackwardZerosGradientWhereOutputIsZero) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  DenseData d = MakeDenseData(8, 4, 6, 0.0);
  auto layer = DenseLayer::Create(engine, d.batch, d.in, d.out, Activation::kRelu, d.Buffers(true));
  ASSERT_TRUE(layer.ok()) << layer.status();
  (*layer)->Forward(stream);
  std::mt19937 rng(7);
  const std::vector<float> upstream = Uniform(&rng, d.dy.size(), 0.5, 1.5);
  d.SetDy(upstream);
  (*layer)->Backward(stream);
  int zeros = 0, positives = 0;
  std::vector<double> col_sum(d.out, 0.0);
  for (size_t i = 0; i < d.y.size(); ++i) {
    ASSERT_GE(d.y[i], 0.0f) << "ReLU output must be non-negative";
    if (d.y[i] == 0.0f) {
      ++zeros;
      EXPECT_EQ(d.dy[i], 0.0f) << "gradient must vanish where y == 0, i=" << i;
    } else {
      ++positives;
      EXPECT_EQ(d.dy[i], upstream[i]) << "gradient must pass where y > 0, i=" << i;
    }
    col_sum[i % d.out] += d.dy[i];
  }
  EXPECT_GT(zeros, 0);
  EXPECT_GT(positives, 0);
  // db is the column sum of the masked gradient.
  for (int64_t o = 0; o < d.out; ++o) EXPECT_NEAR(d.db[o], col_sum[o], 1e-5) << "db[" << o << "]";
}

// Sigmoid and tanh: the fused post-op's output lies in the activation's range,
// and Backward scales dL/dy by the derivative taken from y.
TEST(DenseLayerSmoothActivationTest, BackwardScalesByTheDerivativeFromY) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  for (const Activation act : {Activation::kSigmoid, Activation::kTanh}) {
    SCOPED_TRACE(ActivationName(act));
    DenseData d = MakeDenseData(8, 4, 6, 0.0);
    for (float& v : d.x) v *= 3;  // pre-activations up to ~|13|: the tails too
    auto layer = DenseLayer::Create(engine, d.batch, d.in, d.out, act, d.Buffers(true));
    ASSERT_TRUE(layer.ok()) << layer.status();
    (*layer)->Forward(stream);
    const std::vector<double> z = d.RefPreActivation();
    std::mt19937 rng(7);
    const std::vector<float> upstream = Uniform(&rng, d.dy.size(), 0.5, 1.5);
    d.SetDy(upstream);
    (*layer)->Backward(stream);
    std::vector<double> col_sum(d.out, 0.0);
    for (size_t i = 0; i < d.y.size(); ++i) {
      const double y = d.y[i];
      if (act == Activation::kSigmoid) {
        ASSERT_GE(y, 0.0);
        ASSERT_LE(y, 1.0);
        EXPECT_NEAR(y, 1.0 / (1.0 + std::exp(-z[i])), 1e-6) << i;
        EXPECT_NEAR(d.dy[i], upstream[i] * y * (1 - y), 1e-6) << i;
      } else {
        ASSERT_GE(y, -1.0);
        ASSERT_LE(y, 1.0);
        EXPECT_NEAR(y, std::tanh(z[i]), 1e-6) << i;
        EXPECT_NEAR(d.dy[i], upstream[i] * (1 - y * y), 1e-6) << i;
      }
      col_sum[i % d.out] += d.dy[i];
    }
    for (int64_t o = 0; o < d.out; ++o) EXPECT_NEAR(d.db[o], col_sum[o], 1e-5) << "db[" << o << "]";
  }
}

TEST(ActivationNameTest, NamesEveryValue) {
  EXPECT_STREQ(ActivationName(Activation::kNone), "none");
  EXPECT_STREQ(ActivationName(Activation::kRelu), "relu");
  EXPECT_STREQ(ActivationName(Activation::kSigmoid), "sigmoid");
  EXPECT_STREQ(ActivationName(Activation::kTanh), "tanh");
}

TEST(DenseLayerCreateTest, WithoutDxSkipsBackwardData) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  DenseData d = MakeDenseData(2, 3, 4, 0.0);
  auto layer = DenseLayer::Create(engine, 2, 3, 4, Activation::kNone, d.Buffers(false));
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_DOUBLE_EQ((*layer)->ForwardFlops(), 2.0 * 2 * 3 * 4);
  EXPECT_DOUBLE_EQ((*layer)->BackwardFlops(), 2.0 * 2 * 3 * 4);
  (*layer)->Forward(stream);
  d.SetDy(d.r);
  (*layer)->Backward(stream);
  // dx untouched; dW = x^T r.
  for (float v : d.dx) EXPECT_TRUE(std::isnan(v));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t o = 0; o < 4; ++o) {
      const double want = static_cast<double>(d.x[i]) * d.r[o] + static_cast<double>(d.x[3 + i]) * d.r[4 + o];
      EXPECT_NEAR(d.dw[i * 4 + o], want, 1e-5);
    }
  }

  auto with_dx = DenseLayer::Create(engine, 2, 3, 4, Activation::kNone, d.Buffers(true));
  ASSERT_TRUE(with_dx.ok()) << with_dx.status();
  EXPECT_DOUBLE_EQ((*with_dx)->BackwardFlops(), 4.0 * 2 * 3 * 4);
}

TEST(DenseLayerCreateTest, RejectsBadShapes) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  DenseData d(1, 1, 1);
  d.x.assign(1, 0.0f);
  d.w.assign(1, 0.0f);
  d.b.assign(1, 0.0f);
  for (auto [batch, in, out] : {std::tuple<int64_t, int64_t, int64_t>{0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {-1, 1, 1}}) {
    auto layer = DenseLayer::Create(engine, batch, in, out, Activation::kNone, d.Buffers(true));
    EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << batch << " " << in << " " << out;
  }
}

// ---------------------------------------------------------------------------
// SoftmaxCrossEntropy

TEST(SoftmaxCrossEntropyTest, LossMatchesHandComputedValue) {
  // Row 0: logits (1, 2, 3), label 2: loss = log(e^1 + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2).
  // Row 1: logits (2, 0, -1), label 1: loss = log(e^2 + 1 + e^-1).
  const std::vector<float> logits = {1, 2, 3, 2, 0, -1};
  const std::vector<int32_t> labels = {2, 1};
  std::vector<float> d(6, kNaN);
  const LossResult r = SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 2, 3, d.data());
  const double row0 = 0.40760596444438030;  // log(1 + e^-1 + e^-2)
  const double row1 = 2.16984602161163231;  // log(e^2 + 1 + e^-1)
  EXPECT_NEAR(r.loss_sum, row0 + row1, 1e-6);
  EXPECT_EQ(r.correct, 1);  // row 0 right (arg-max 2), row 1 wrong (arg-max 0)
  // d = (softmax - onehot) / 2.
  const double s0 = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double s1 = std::exp(2.0) + 1.0 + std::exp(-1.0);
  const double want[6] = {std::exp(1.0) / s0 / 2, std::exp(2.0) / s0 / 2, (std::exp(3.0) / s0 - 1) / 2,
                          std::exp(2.0) / s1 / 2, (1.0 / s1 - 1) / 2,     std::exp(-1.0) / s1 / 2};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(d[i], want[i], 1e-6) << i;
}

TEST(SoftmaxCrossEntropyTest, GradientMatchesFiniteDifferencesOfMeanLoss) {
  constexpr int64_t kBatch = 4, kK = 5;
  constexpr double kEps = 1e-2;
  std::mt19937 rng(3);
  std::vector<float> logits = Uniform(&rng, kBatch * kK, -3, 3);
  const std::vector<int32_t> labels = {0, 4, 2, 2};
  std::vector<float> d(kBatch * kK, kNaN);
  SoftmaxCrossEntropy(logits.data(), labels.data(), kBatch, kBatch, kK, d.data());
  std::vector<double> numeric(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float saved = logits[i];
    logits[i] = static_cast<float>(saved + kEps);
    const double lp = SoftmaxCrossEntropy(logits.data(), labels.data(), kBatch, kBatch, kK, nullptr).loss_sum;
    logits[i] = static_cast<float>(saved - kEps);
    const double lm = SoftmaxCrossEntropy(logits.data(), labels.data(), kBatch, kBatch, kK, nullptr).loss_sum;
    logits[i] = saved;
    numeric[i] = (lp - lm) / (2 * kEps) / kBatch;
  }
  EXPECT_TRUE(GradientsAgree("dlogits", ToDouble(d.data(), d.size()), numeric, 1e-2, 1e-5));
  // Each row of (softmax - onehot) sums to zero.
  for (int64_t b = 0; b < kBatch; ++b) {
    double s = 0;
    for (int64_t j = 0; j < kK; ++j) s += d[b * kK + j];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(SoftmaxCrossEntropyTest, PaddingRowsGetZeroGradientAndNoLoss) {
  constexpr int64_t kBatch = 4, kValid = 2, kK = 3;
  std::mt19937 rng(5);
  std::vector<float> logits = Uniform(&rng, kBatch * kK, -2, 2);
  const std::vector<int32_t> labels = {1, 0, 2, 2};
  std::vector<float> d(kBatch * kK, kNaN);
  const LossResult padded = SoftmaxCrossEntropy(logits.data(), labels.data(), kValid, kBatch, kK, d.data());
  // The same two rows on their own.
  std::vector<float> d2(kValid * kK, kNaN);
  const LossResult alone = SoftmaxCrossEntropy(logits.data(), labels.data(), kValid, kValid, kK, d2.data());
  EXPECT_DOUBLE_EQ(padded.loss_sum, alone.loss_sum);
  EXPECT_EQ(padded.correct, alone.correct);
  for (int64_t i = 0; i < kValid * kK; ++i) EXPECT_EQ(d[i], d2[i]) << i;
  for (int64_t i = kValid * kK; i < kBatch * kK; ++i) EXPECT_EQ(d[i], 0.0f) << "padding element " << i;

  // valid == 0: no loss, and every row is padding.
  std::fill(d.begin(), d.end(), kNaN);
  const LossResult none = SoftmaxCrossEntropy(logits.data(), labels.data(), 0, kBatch, kK, d.data());
  EXPECT_EQ(none.loss_sum, 0.0);
  EXPECT_EQ(none.correct, 0);
  for (float v : d) EXPECT_EQ(v, 0.0f);
}

TEST(SoftmaxCrossEntropyTest, GradientIsScaledByValidRows) {
  // The gradient is of the mean over `valid` rows, so it scales with 1/valid.
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 0.0f, 0.0f, 1.0f, 1.0f, -3.0f};
  const std::vector<int32_t> labels = {2, 0, 1};
  std::vector<float> d1(9), d3(9);
  SoftmaxCrossEntropy(logits.data(), labels.data(), 1, 3, 3, d1.data());
  SoftmaxCrossEntropy(logits.data(), labels.data(), 3, 3, 3, d3.data());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(d3[i] * 3, d1[i], 1e-6) << i;
}

TEST(SoftmaxCrossEntropyTest, CountsArgMaxHits) {
  const std::vector<float> logits = {
      0.1f, 0.9f, 0.0f, 0.0f,  // arg-max 1
      5.0f, 1.0f, 2.0f, 3.0f,  // arg-max 0
      -1.f, -2.f, -3.f, -0.5f, // arg-max 3
      0.0f, 0.0f, 7.0f, 6.9f,  // arg-max 2
      9.0f, 0.0f, 0.0f, 0.0f,  // padding
  };
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{1, 0, 3, 2, 0}.data(), 4, 5, 4, nullptr).correct,
            4);
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{1, 1, 3, 3, 0}.data(), 4, 5, 4, nullptr).correct,
            2);
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{0, 1, 2, 3, 0}.data(), 4, 5, 4, nullptr).correct,
            0);
  // The padding row (a hit if it were counted) is not.
  EXPECT_EQ(SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{1, 0, 3, 2, 0}.data(), 3, 5, 4, nullptr).correct,
            3);
}

TEST(SoftmaxCrossEntropyTest, StableWithLargeLogits) {
  const std::vector<float> logits = {1000.0f, 0.0f,     -1000.0f,  // confident and right or very wrong
                                     1000.0f, 1000.0f,  1000.0f,   // uniform at a large offset
                                     -1000.0f, -999.0f, -1000.0f};
  std::vector<float> d(9, kNaN);
  const LossResult right = SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{0, 0, 1}.data(), 3, 3, 3, d.data());
  // Row 0: ~0; row 1: log 3; row 2: log(1 + 2 e^-1).
  EXPECT_NEAR(right.loss_sum, 0.0 + std::log(3.0) + std::log(1 + 2 * std::exp(-1.0)), 1e-5);
  for (float v : d) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(d[0], 0.0, 1e-6);
  EXPECT_NEAR(d[3], (1.0 / 3 - 1) / 3, 1e-6);
  EXPECT_NEAR(d[4], 1.0 / 9, 1e-6);

  const LossResult wrong = SoftmaxCrossEntropy(logits.data(), std::vector<int32_t>{2, 0, 1}.data(), 1, 3, 3, d.data());
  EXPECT_NEAR(wrong.loss_sum, 2000.0, 1e-3);
  EXPECT_NEAR(d[0], 1.0, 1e-6);
  EXPECT_NEAR(d[2], -1.0, 1e-6);
}

// Rows of up to kKeptExponentials classes keep their exponentials for the
// gradient; wider rows compute them again. Both give (softmax - onehot) /
// valid, against a double-precision reference, on either side of the limit.
TEST(SoftmaxCrossEntropyTest, GradientOnEitherSideOfTheKeptExponentials) {
  std::mt19937 rng(17);
  for (int64_t k : {int64_t{2}, kKeptExponentials - 1, kKeptExponentials, kKeptExponentials + 1, int64_t{300}}) {
    SCOPED_TRACE(testing::Message() << "k " << k);
    constexpr int64_t kValid = 3, kBatch = 4;
    const std::vector<float> logits = Uniform(&rng, kBatch * k, -6, 6);
    const std::vector<int32_t> labels = {0, static_cast<int32_t>(k - 1), static_cast<int32_t>(k / 2), 0};
    std::vector<float> d(kBatch * k, kNaN);
    const LossResult r = SoftmaxCrossEntropy(logits.data(), labels.data(), kValid, kBatch, k, d.data());
    double want_loss = 0;
    for (int64_t b = 0; b < kValid; ++b) {
      const float* z = logits.data() + b * k;
      const double mx = *std::max_element(z, z + k);
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += std::exp(z[j] - mx);
      want_loss += std::log(sum) - (z[labels[b]] - mx);
      for (int64_t j = 0; j < k; ++j) {
        const double want = (std::exp(z[j] - mx) / sum - (j == labels[b] ? 1.0 : 0.0)) / kValid;
        ASSERT_NEAR(d[b * k + j], want, 1e-7 + 1e-6 * std::abs(want)) << "row " << b << " class " << j;
      }
    }
    // (The loss subtracts the maximum in float, as its callers' logits are.)
    EXPECT_NEAR(r.loss_sum, want_loss, 1e-6 * want_loss);
    for (int64_t j = kValid * k; j < kBatch * k; ++j) ASSERT_EQ(d[j], 0.0f) << j;  // the padding row
  }
}

// ---------------------------------------------------------------------------
// The dense-only Model (an MLP over the dense features, softmax head)

ModelOptions SmallModel() {
  ModelOptions m;
  m.layers = {{"dense", 5, Activation::kRelu}, {"dense", 4, Activation::kRelu}, {"dense", 3, Activation::kNone}};
  return m;
}

DataShape Shape(int64_t dense, int32_t classes) {
  DataShape s;
  s.dense_dim = dense;
  s.num_classes = classes;
  return s;
}

TEST(MlpVariablesTest, DeclaresKernelAndBiasPerLayer) {
  absl::StatusOr<std::vector<VariableSpec>> specs = Model::Variables(SmallModel(), Shape(6, 3));
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 6u);
  const int64_t widths[] = {6, 5, 4, 3};
  for (int i = 0; i < 3; ++i) {
    const VariableSpec& k = (*specs)[2 * i];
    const VariableSpec& b = (*specs)[2 * i + 1];
    EXPECT_EQ(k.name, "dense_" + std::to_string(i) + "/kernel");
    EXPECT_EQ(k.rows, widths[i]);
    EXPECT_EQ(k.cols, widths[i + 1]);
    EXPECT_EQ(k.init, InitKind::kGlorotUniform);
    EXPECT_EQ(k.fan_in, widths[i]);
    EXPECT_EQ(k.fan_out, widths[i + 1]);
    EXPECT_EQ(b.name, "dense_" + std::to_string(i) + "/bias");
    EXPECT_EQ(b.size(), widths[i + 1]);
    EXPECT_EQ(b.init, InitKind::kZeros);
  }
}

TEST(MlpVariablesTest, Errors) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  // Last layer must have one unit per class.
  absl::StatusOr<std::vector<VariableSpec>> specs = Model::Variables(SmallModel(), Shape(6, 4));
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("units"), std::string::npos) << specs.status();
  auto mlp = Model::Create(SmallModel(), Shape(6, 4), 2, engine, 1);
  EXPECT_EQ(mlp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mlp.status().message().find("units"), std::string::npos) << mlp.status();

  // The configured input width must match the data.
  ModelOptions m = SmallModel();
  m.input_dim = 7;
  specs = Model::Variables(m, Shape(6, 3));
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("input_dim"), std::string::npos) << specs.status();

  // No layers at all.
  specs = Model::Variables(ModelOptions{}, Shape(6, 3));
  EXPECT_EQ(specs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(specs.status().message().find("model.layers"), std::string::npos) << specs.status();

  // units: auto takes the classes of the data.
  m = SmallModel();
  m.layers.back().units = 0;
  specs = Model::Variables(m, Shape(6, 7));
  ASSERT_TRUE(specs.ok()) << specs.status();
  EXPECT_EQ(specs->back().size(), 7);
}

// Double-precision forward pass of the model's current parameters on the
// first `rows` records of `x` ([rows, in]); returns the logits and collects
// the hidden layers' pre-activations into `hidden_z`.
std::vector<double> RefMlpForward(Model& mlp, const ModelOptions& opts, const float* x, int64_t rows,
                                  std::vector<double>* hidden_z) {
  std::vector<double> a(x, x + rows * mlp.dense_dim());
  int64_t in = mlp.dense_dim();
  for (size_t l = 0; l < opts.layers.size(); ++l) {
    const int64_t out = opts.layers[l].units;
    const float* w = mlp.params(2 * l);
    const float* b = mlp.params(2 * l + 1);
    std::vector<double> z(rows * out);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double s = b[o];
        for (int64_t i = 0; i < in; ++i) s += a[r * in + i] * w[i * out + o];
        z[r * out + o] = s;
      }
    }
    if (opts.layers[l].activation == Activation::kRelu) {
      hidden_z->insert(hidden_z->end(), z.begin(), z.end());
      for (double& v : z) v = std::max(v, 0.0);
    }
    a = std::move(z);
    in = out;
  }
  return a;
}

class MlpTest : public ::testing::Test {
 protected:
  // A data set of `batch` records with 6 features and labels {2, 0, 1, 1, ...}.
  static Dataset Data(int64_t batch) {
    Dataset d;
    d.count = batch;
    d.dense_dim = 6;
    d.num_classes = 3;
    d.dense.assign(batch * 6, 0.0f);
    const int32_t labels[] = {2, 0, 1, 1};
    for (int64_t i = 0; i < batch; ++i) d.labels.push_back(labels[i % 4]);
    return d;
  }

  // Fills the data's features and every parameter with random values such
  // that every hidden pre-activation of the first `valid` rows is at least
  // `margin` from the ReLU kink, then loads the batch.
  void Randomize(Model& mlp, Dataset& data, const ModelOptions& opts, int64_t valid, double margin) {
    for (uint32_t seed = 1;; ++seed) {
      std::mt19937 rng(seed);
      data.dense = Uniform(&rng, data.count * data.dense_dim, -1, 1);
      for (int v = 0; v < mlp.num_variables(); ++v) {
        std::vector<float> p = Uniform(&rng, mlp.variable(v).size(), -0.7f, 0.7f);
        std::copy(p.begin(), p.end(), mlp.params(v));
      }
      std::vector<double> z;
      RefMlpForward(mlp, opts, data.dense.data(), valid, &z);
      bool ok = true;
      for (double v : z) ok = ok && std::abs(v) >= margin;
      if (ok) break;
      ASSERT_LT(seed, 100000u) << "no seed keeps the pre-activations off the kink";
    }
    mlp.LoadRange(data, 0, valid);
  }

  LossResult Step(Model& m, int64_t valid) {
    m.Forward(/*training=*/true, stream_);
    return m.Backward(valid, stream_);
  }
  LossResult Evaluate(Model& m, int64_t valid) {
    m.Forward(/*training=*/false, stream_);
    return m.Loss(valid);
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

TEST_F(MlpTest, ForwardMatchesReference) {
  const ModelOptions opts = SmallModel();
  auto mlp = Model::Create(opts, Shape(6, 3), 4, engine_, 1);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  Model& m = **mlp;
  EXPECT_EQ(m.batch(), 4);
  EXPECT_EQ(m.dense_dim(), 6);
  EXPECT_EQ(m.outputs(), 3);
  ASSERT_EQ(m.num_variables(), 6);
  EXPECT_EQ(m.num_lookups(), 0);
  Dataset data = Data(4);
  Randomize(m, data, opts, 4, 0.0);
  m.Forward(false, stream_);
  std::vector<double> z;
  const std::vector<double> want = RefMlpForward(m, opts, data.dense.data(), 4, &z);
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(m.logits()[i], want[i], 1e-5) << i;
  EXPECT_DOUBLE_EQ(m.ForwardFlops(), 2.0 * 4 * (6 * 5 + 5 * 4 + 4 * 3));
  EXPECT_DOUBLE_EQ(m.BackwardFlops(), 2.0 * 4 * 6 * 5 + 4.0 * 4 * (5 * 4 + 4 * 3));
}

TEST_F(MlpTest, StepGradientsMatchFiniteDifferences) {
  constexpr int64_t kBatch = 4, kValid = 3;  // the last row is padding
  constexpr double kEps = 5e-3;
  const ModelOptions opts = SmallModel();
  auto mlp = Model::Create(opts, Shape(6, 3), kBatch, engine_, 1);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  Model& m = **mlp;
  Dataset data = Data(kBatch);
  // Margin 0.1 with steps of 5e-3 on values below 1 keeps every ReLU on its side.
  Randomize(m, data, opts, kValid, 0.1);

  const LossResult step = Step(m, kValid);
  std::vector<std::vector<double>> analytic;
  for (int v = 0; v < m.num_variables(); ++v) analytic.push_back(ToDouble(m.grads(v), m.variable(v).size()));
  const LossResult eval = Evaluate(m, kValid);
  EXPECT_NEAR(step.loss_sum, eval.loss_sum, 1e-9);
  EXPECT_EQ(step.correct, eval.correct);
  EXPECT_GT(step.loss_sum, 0.0);

  for (int v = 0; v < m.num_variables(); ++v) {
    float* p = m.params(v);
    std::vector<double> numeric(m.variable(v).size());
    for (size_t i = 0; i < numeric.size(); ++i) {
      const float saved = p[i];
      p[i] = static_cast<float>(saved + kEps);
      const double lp = Evaluate(m, kValid).loss_sum;
      p[i] = static_cast<float>(saved - kEps);
      const double lm = Evaluate(m, kValid).loss_sum;
      p[i] = saved;
      numeric[i] = (lp - lm) / (2 * kEps) / kValid;
    }
    EXPECT_TRUE(GradientsAgree(m.variable(v).name, analytic[v], numeric, 1e-2, 2e-4));
  }
}

TEST_F(MlpTest, PaddingRowsDoNotAffectGradients) {
  const ModelOptions opts = SmallModel();
  auto padded = Model::Create(opts, Shape(6, 3), 4, engine_, 1);
  auto exact = Model::Create(opts, Shape(6, 3), 2, engine_, 1);
  ASSERT_TRUE(padded.ok()) << padded.status();
  ASSERT_TRUE(exact.ok()) << exact.status();
  Dataset data = Data(4);
  Randomize(**padded, data, opts, 4, 0.0);
  for (int v = 0; v < 6; ++v) {
    std::copy((*padded)->params(v), (*padded)->params(v) + (*padded)->variable(v).size(), (*exact)->params(v));
  }
  // The padded model loads 2 records into a batch of 4: the rest is padding.
  (*padded)->LoadRange(data, 0, 2);
  (*exact)->LoadRange(data, 0, 2);
  const LossResult a = Step(**padded, 2);
  const LossResult b = Step(**exact, 2);
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-5);
  EXPECT_EQ(a.correct, b.correct);
  for (int v = 0; v < 6; ++v) {
    EXPECT_TRUE(GradientsAgree((*padded)->variable(v).name, ToDouble((*padded)->grads(v), (*padded)->variable(v).size()),
                               ToDouble((*exact)->grads(v), (*exact)->variable(v).size()), 1e-5, 1e-6));
  }
}

}  // namespace
}  // namespace shardwild
