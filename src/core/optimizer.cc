#include "core/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace shardwild {
namespace {

static_assert(std::atomic_ref<float>::is_always_lock_free, "Hogwild needs lock-free float atomics");

constexpr int64_t kBlock = 64;

// Adam's repair acts only past this multiple of the bound: rounding in a
// history no race has torn stays far below it.
constexpr float kAdamRepairSlack = 1.01f;

inline void LoadBlock(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = std::atomic_ref<float>(const_cast<float&>(src[i])).load(std::memory_order_relaxed);
  }
}

inline void StoreBlock(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    std::atomic_ref<float>(dst[i]).store(src[i], std::memory_order_relaxed);
  }
}

void Sgd(float lr, float* p, const float* g, int64_t n) {
  alignas(64) float bp[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    for (int64_t i = 0; i < m; ++i) bp[i] -= lr * g[b + i];
    StoreBlock(bp, p + b, m);
  }
}

void Momentum(float lr, float mu, bool nesterov, float* p, float* v, const float* g, int64_t n) {
  alignas(64) float bp[kBlock];
  alignas(64) float bv[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    LoadBlock(v + b, bv, m);
    const float* gb = g + b;
    if (nesterov) {
      for (int64_t i = 0; i < m; ++i) {
        bv[i] = mu * bv[i] + gb[i];
        bp[i] -= lr * (gb[i] + mu * bv[i]);
      }
    } else {
      for (int64_t i = 0; i < m; ++i) {
        bv[i] = mu * bv[i] + gb[i];
        bp[i] -= lr * bv[i];
      }
    }
    StoreBlock(bv, v + b, m);
    StoreBlock(bp, p + b, m);
  }
}

}  // namespace

float AdamMomentRatioBound(float beta1, float beta2, int64_t step) {
  const double b1 = beta1, b2 = beta2;
  if (!(b2 > 0)) return std::numeric_limits<float>::infinity();  // v holds only the last g^2
  const double t = static_cast<double>(std::max<int64_t>(step, 1));
  const double r = b1 * b1 / b2;
  // sum_{k<t} r^k, or its limit when that is finite (then for every t).
  const double s = r < 1 ? 1.0 / (1.0 - r) : r == 1 ? t : std::expm1(t * std::log(r)) / (r - 1.0);
  const double c = (1.0 - b1) * std::sqrt(s / (1.0 - b2));
  return c < std::numeric_limits<float>::max() ? static_cast<float>(c) : std::numeric_limits<float>::infinity();
}

namespace {

void Adam(const OptimizerOptions& o, const UpdateParams& up, float* p, float* m1, float* m2, const float* g,
          int64_t n) {
  const double t = static_cast<double>(std::max<int64_t>(up.step, 1));
  const double c2 = std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t));
  const double c1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
  const float alpha = static_cast<float>(up.lr * c2 / c1);
  const float eps_hat = static_cast<float>(o.epsilon * c2);
  const float b1 = o.beta1, b2 = o.beta2;
  // Hogwild repair of a torn moment pair (see optimizer.h): v is raised to
  // (|m| / bound)^2 where it is below. The slack keeps rounding in an untorn
  // history from ever reaching it; 0 (no bound) leaves v as it is.
  const float bound = AdamMomentRatioBound(o.beta1, o.beta2, up.step) * kAdamRepairSlack;
  const float inv_bound = std::isfinite(bound) ? 1.0f / bound : 0.0f;
  alignas(64) float bp[kBlock];
  alignas(64) float bm[kBlock];
  alignas(64) float bv[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    LoadBlock(m1 + b, bm, m);
    LoadBlock(m2 + b, bv, m);
    const float* gb = g + b;
    for (int64_t i = 0; i < m; ++i) {
      const float gi = gb[i];
      bm[i] = b1 * bm[i] + (1.0f - b1) * gi;
      bv[i] = b2 * bv[i] + (1.0f - b2) * gi * gi;
      const float floor = std::fabs(bm[i]) * inv_bound;
      bv[i] = std::max(bv[i], floor * floor);
      bp[i] -= alpha * bm[i] / (std::sqrt(bv[i]) + eps_hat);
    }
    StoreBlock(bm, m1 + b, m);
    StoreBlock(bv, m2 + b, m);
    StoreBlock(bp, p + b, m);
  }
}

void Adagrad(float lr, float eps, float* p, float* acc, const float* g, int64_t n) {
  alignas(64) float bp[kBlock];
  alignas(64) float ba[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    LoadBlock(acc + b, ba, m);
    const float* gb = g + b;
    for (int64_t i = 0; i < m; ++i) {
      const float gi = gb[i];
      ba[i] += gi * gi;
      bp[i] -= lr * gi / (std::sqrt(ba[i]) + eps);
    }
    StoreBlock(ba, acc + b, m);
    StoreBlock(bp, p + b, m);
  }
}

void Rmsprop(float lr, float rho, float eps, float* p, float* ms, const float* g, int64_t n) {
  alignas(64) float bp[kBlock];
  alignas(64) float bs[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    LoadBlock(ms + b, bs, m);
    const float* gb = g + b;
    for (int64_t i = 0; i < m; ++i) {
      const float gi = gb[i];
      bs[i] = rho * bs[i] + (1.0f - rho) * gi * gi;
      bp[i] -= lr * gi / (std::sqrt(bs[i]) + eps);
    }
    StoreBlock(bs, ms + b, m);
    StoreBlock(bp, p + b, m);
  }
}

// Slots: `acc` = n, `lin` = z. See optimizer.h for the formula.
void Ftrl(const OptimizerOptions& o, float lr, float* p, float* acc, float* lin, const float* g, int64_t n) {
  if (!(lr > 0)) return;  // FTRL divides by lr; a zero rate (the end of a schedule to 0) skips the step
  const float inv_lr = static_cast<float>(1.0 / static_cast<double>(lr));
  const float l1 = o.l1;
  const float two_l2 = 2.0f * o.l2;
  alignas(64) float bp[kBlock];
  alignas(64) float bn[kBlock];
  alignas(64) float bz[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    LoadBlock(p + b, bp, m);
    LoadBlock(acc + b, bn, m);
    LoadBlock(lin + b, bz, m);
    const float* gb = g + b;
    for (int64_t i = 0; i < m; ++i) {
      const float gi = gb[i];
      const float gg = gi * gi;
      const float n_new = bn[i] + gg;
      const float sqrt_new = std::sqrt(n_new);
      // sqrt(n_new) - sqrt(n), without the cancellation; n > 0 so the sum is > 0.
      const float sigma = gg / (sqrt_new + std::sqrt(bn[i])) * inv_lr;
      const float z = bz[i] + gi - sigma * bp[i];
      // -(z - sign(z) l1) / q where |z| > l1, else 0, without a branch: a
      // select of a value that may trap keeps GCC from vectorising. The
      // trailing + 0 turns the -0 of a clipped positive z into +0.
      bp[i] = std::copysign(std::max(std::abs(z) - l1, 0.0f), -z) / (sqrt_new * inv_lr + two_l2) + 0.0f;
      bz[i] = z;
      bn[i] = n_new;
    }
    StoreBlock(bn, acc + b, m);
    StoreBlock(bz, lin + b, m);
    StoreBlock(bp, p + b, m);
  }
}

}  // namespace

int NumSlots(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd: return 0;
    case OptimizerType::kMomentum: return 1;
    case OptimizerType::kAdam: return 2;
    case OptimizerType::kAdagrad: return 1;
    case OptimizerType::kRmsprop: return 1;
    case OptimizerType::kFtrl: return 2;
  }
  return 0;
}

float SlotInitialValue(const OptimizerOptions& opt, int slot) {
  const bool accumulator = (opt.type == OptimizerType::kAdagrad || opt.type == OptimizerType::kFtrl) && slot == 0;
  return accumulator ? opt.initial_accumulator_value : 0.0f;
}

void ApplyUpdate(const OptimizerOptions& opt, const UpdateParams& up, float* params, float* const* slots,
                 const float* grad, int64_t n) {
  switch (opt.type) {
    case OptimizerType::kSgd:
      Sgd(up.lr, params, grad, n);
      return;
    case OptimizerType::kMomentum:
      Momentum(up.lr, opt.momentum, opt.nesterov, params, slots[0], grad, n);
      return;
    case OptimizerType::kAdam:
      Adam(opt, up, params, slots[0], slots[1], grad, n);
      return;
    case OptimizerType::kAdagrad:
      Adagrad(up.lr, opt.epsilon, params, slots[0], grad, n);
      return;
    case OptimizerType::kRmsprop:
      Rmsprop(up.lr, opt.rho, opt.epsilon, params, slots[0], grad, n);
      return;
    case OptimizerType::kFtrl:
      Ftrl(opt, up.lr, params, slots[0], slots[1], grad, n);
      return;
  }
}

}  // namespace shardwild
