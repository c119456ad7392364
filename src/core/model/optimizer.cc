#include "core/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/hogwild_kernels.h"

namespace shardwild {
namespace {

// Adam's repair acts only past this multiple of the bound: rounding in a
// history no race has torn stays far below it.
constexpr float kAdamRepairSlack = 1.01f;

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

bool UsesStepCount(OptimizerType type) { return type == OptimizerType::kAdam; }

float SlotInitialValue(const OptimizerOptions& opt, int slot) {
  const bool accumulator = (opt.type == OptimizerType::kAdagrad || opt.type == OptimizerType::kFtrl) && slot == 0;
  return accumulator ? opt.initial_accumulator_value : 0.0f;
}

namespace {

// The kernel's scalars for one update; false where the update is skipped
// (FTRL at lr <= 0: it divides by lr, and a schedule's end at 0 means no step).
bool MakeKernelArgs(const OptimizerOptions& opt, const UpdateParams& up, UpdateKernelArgs* out) {
  UpdateKernelArgs& a = *out;
  a.type = opt.type;
  a.lr = up.lr;
  switch (opt.type) {
    case OptimizerType::kSgd:
      break;
    case OptimizerType::kMomentum:
      a.momentum = opt.momentum;
      a.nesterov = opt.nesterov;
      break;
    case OptimizerType::kAdam: {
      const double t = static_cast<double>(std::max<int64_t>(up.step, 1));
      const double c2 = std::sqrt(1.0 - std::pow(static_cast<double>(opt.beta2), t));
      const double c1 = 1.0 - std::pow(static_cast<double>(opt.beta1), t);
      a.beta1 = opt.beta1;
      a.beta2 = opt.beta2;
      a.alpha = static_cast<float>(up.lr * c2 / c1);
      a.eps_hat = static_cast<float>(opt.epsilon * c2);
      // Hogwild repair of a torn moment pair (optimizer.h): v is raised to
      // (|m| / bound)^2 where it is below. The slack keeps rounding in an
      // untorn history from ever reaching it; 0 (no bound) leaves v as it is.
      const float bound = AdamMomentRatioBound(opt.beta1, opt.beta2, up.step) * kAdamRepairSlack;
      a.inv_bound = std::isfinite(bound) ? 1.0f / bound : 0.0f;
      break;
    }
    case OptimizerType::kAdagrad:
      a.epsilon = opt.epsilon;
      break;
    case OptimizerType::kRmsprop:
      a.epsilon = opt.epsilon;
      a.rho = opt.rho;
      break;
    case OptimizerType::kFtrl:
      if (!(up.lr > 0)) return false;
      a.l1 = opt.l1;
      a.two_l2 = 2.0f * opt.l2;
      a.inv_lr = static_cast<float>(1.0 / static_cast<double>(up.lr));
      break;
  }
  return true;
}

}  // namespace

void ApplyUpdate(const OptimizerOptions& opt, const UpdateParams& up, float* params, float* const* slots,
                 const float* grad, int64_t n, float* params_copy, uint16_t* params_copy_bf16) {
  UpdateKernelArgs a;
  if (!MakeKernelArgs(opt, up, &a)) {
    if (params_copy != nullptr) {
      HogwildCopyFrom(params, params_copy, n);
    } else if (params_copy_bf16 != nullptr) {
      HogwildCopyFromAsBf16(params, params_copy_bf16, n);
    }
    return;
  }
  const int nslots = NumSlots(opt.type);
  HogwildUpdate(a, params, nslots > 0 ? slots[0] : nullptr, nslots > 1 ? slots[1] : nullptr, grad, n,
                params_copy, params_copy_bf16);
}

void ApplyUpdateRows(const OptimizerOptions& opt, const UpdateParams& up, float* const* rows,
                     const float* const* grads, int64_t count, int64_t dim) {
  UpdateKernelArgs a;
  if (!MakeKernelArgs(opt, up, &a)) return;
  HogwildUpdateRows(a, rows, grads, count, dim);
}

void ApplyUpdateRowsBf16(const OptimizerOptions& opt, const UpdateParams& up, uint16_t* const* rows,
                         const float* const* grads, const uint32_t* salts, int64_t count, int64_t dim,
                         int64_t slot_offset) {
  UpdateKernelArgs a;
  if (!MakeKernelArgs(opt, up, &a)) return;
  HogwildUpdateRowsBf16(a, rows, grads, salts, count, dim, slot_offset);
}

}  // namespace shardwild
