// Optimizer kernels: update a span of parameters and its slots in place.
//
// The same kernel serves a slice of a dense variable and an embedding row.
// Parameters and slots may be shared with other threads that update them at
// the same time (Hogwild). The arithmetic runs in the SIMD kernels of
// core/model/hogwild_kernels.h (Google Highway, dispatched at run time to the best
// instruction set of the CPU): they load and store whole vectors of
// parameters and slots, so updates from different threads may interleave
// lane by lane, and no ordering with other memory is implied. Those kernels
// are the only code allowed to race, and stay out of ThreadSanitizer's view.
#pragma once

#include <cstdint>

#include "core/config/options.h"

namespace shardwild {

// Number of slot arrays (optimizer state per parameter) the optimizer keeps:
// sgd 0, momentum 1 (velocity), adam 2 (first and second moment), adagrad 1
// (accumulator), rmsprop 1 (mean square), ftrl 2 (accumulator n, linear z).
int NumSlots(OptimizerType type);

// The value every element of slot array `slot` (0 <= slot < NumSlots) holds
// before the first update: `initial_accumulator_value` for the accumulators of
// adagrad and ftrl (slot 0), 0 for every other slot. A store fills its slot
// arrays with it when it creates them.
float SlotInitialValue(const OptimizerOptions& opt, int slot);

// Whether the update reads UpdateParams::step (Adam's bias correction): a
// store must then count the updates of each span it updates apart (an
// embedding row: EmbeddingTableOptions::count_updates).
bool UsesStepCount(OptimizerType type);

// Hyper-parameters resolved for one update.
struct UpdateParams {
  float lr = 0;        // learning rate for this step (after any schedule)
  int64_t step = 1;    // 1-based count of updates applied to this span (Adam's bias correction)
};

// The largest |m| / sqrt(v) Adam's moments reach after `step` updates from
// m = v = 0, for any gradients: by Cauchy-Schwarz,
//   |m| = (1-b1) |sum_k b1^k g_k| <= (1-b1) sqrt(sum_{k<t} (b1^2/b2)^k) sqrt(v / (1-b2)),
// and the sum is bounded by 1 / (1 - b1^2/b2) for every t where b1^2 < b2
// (the defaults: 7.27). Infinite where there is no bound (b2 = 0) or it
// overflows a float.
float AdamMomentRatioBound(float beta1, float beta2, int64_t step);

// Applies one update of `n` parameters with gradient `grad`.
//   sgd:       p -= lr * g
//   momentum:  v = m * v + g;  p -= lr * v                (nesterov: p -= lr * (g + m * v))
//   adam:      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//              p -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps * sqrt(1-b2^t))
//              (the "epsilon hat" form of Kingma & Ba, section 2, as in TensorFlow)
//              Hogwild repair: before the step, v = max(v, (|m| / (1.01 B))^2)
//              with B = AdamMomentRatioBound(b1, b2, t). An update history
//              keeps |m| <= B sqrt(v), so this never acts on a pair that no
//              race has torn. A race can tear one: thread A stores m, thread B
//              loads that m but the v from before A's store, and B's store
//              leaves a large m over v ~ 0. Where g is then 0 (a dead unit, a
//              pixel that is always 0) the step would be m / eps_hat, tens per
//              step, and the model diverges. The repair bounds it by lr * 1.01 B,
//              the largest step an untorn history can take.
//   adagrad:   a += g^2;  p -= lr * g / (sqrt(a) + eps)
//              (Keras / TF ApplyAdagradV2; slot 0 = a starts at initial_accumulator_value)
//   rmsprop:   s = rho s + (1-rho) g^2;  p -= lr * g / (sqrt(s) + eps)
//              (tf.keras RMSprop with momentum 0 and centered false; the
//              `momentum` option does not apply to it; Keras 3 puts eps under
//              the root instead; slot 0 = s starts at 0)
//   ftrl:      FTRL-proximal (McMahan et al. 2013, Algorithm 1) as TF's
//              ApplyFtrl with lr_power = -0.5 and beta = 0; slot 0 = n starts
//              at initial_accumulator_value, slot 1 = z starts at 0:
//                sigma = (sqrt(n + g^2) - sqrt(n)) / lr
//                z += g - sigma * p;  n += g^2      (p and n before this step)
//                p = |z| <= l1 ? 0 : -(z - sign(z) l1) / (sqrt(n) / lr + 2 l2)
//                                                   (z and n after it)
//              sigma is evaluated as g^2 / (sqrt(n + g^2) + sqrt(n)) / lr, the
//              same value without the cancellation. The `2 l2` is TF's: TF's
//              l2 = 1 is the paper's lambda2 = 2. Needs n > 0, which
//              OptimizerOptions::Validate ensures for ftrl. With lr <= 0 the
//              update leaves params and slots as they are.
// `slots` holds NumSlots(type) pointers, each to `n` floats, in the order
// above. `grad` is private to the caller. `opt` must have passed Validate().
// Thread-safe in the Hogwild sense described above; never allocates.
// Every instruction-set target gives bit-identical results: the formulas
// above, evaluated left to right in float with no fused multiply-add, with
// subnormal inputs and results flushed to 0 (as TensorFlow's CPU threads
// do: a slot decaying where the gradient stays 0 would otherwise make every
// update of it tens of times slower once it passes FLT_MIN).
// With `params_copy` (a private buffer of n floats, or null) the updated
// parameters are also written there in the same pass (a fused pull); with
// `params_copy_bf16` instead, they are written rounded to bf16
// (HogwildCopyFromAsBf16's rounding).
void ApplyUpdate(const OptimizerOptions& opt, const UpdateParams& up, float* params, float* const* slots,
                 const float* grad, int64_t n, float* params_copy = nullptr, uint16_t* params_copy_bf16 = nullptr);

// One update, the same UpdateParams for every row, of `count` rows of `dim`
// parameters laid out as embedding rows (rows[r]: dim parameters, then the
// optimizer's slots, dim floats each) with gradients grads[r]: ApplyUpdate
// of each row, in one call. For optimizers whose step does not depend on a
// row's own update count (all but Adam, whose t is per row). Rows must be
// distinct. Thread-safe and allocation-free as ApplyUpdate.
void ApplyUpdateRows(const OptimizerOptions& opt, const UpdateParams& up, float* const* rows,
                     const float* const* grads, int64_t count, int64_t dim);

// ApplyUpdateRows for bf16 rows (HogwildUpdateRowsBf16: parameters dim bf16
// values at rows[r], slots f32 from (char*)rows[r] + slot_offset; the f32
// update, stored back by stochastic rounding with salts[r]). With Adam, one
// row per call (its own t in `up`).
void ApplyUpdateRowsBf16(const OptimizerOptions& opt, const UpdateParams& up, uint16_t* const* rows,
                         const float* const* grads, const uint32_t* salts, int64_t count, int64_t dim,
                         int64_t slot_offset);

}  // namespace shardwild
