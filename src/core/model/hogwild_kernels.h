// The Hogwild kernels: the only code that reads and writes parameter memory
// with plain (SIMD) loads and stores while other threads may do the same.
//
// Hogwild races are deliberate (DESIGN.md, "Non-negotiables"): concurrent
// updates of the same parameters may interleave lane by lane, and a copy that
// races an update may see a mix of old and new values. Every function here is
// written once with Google Highway and compiled for each instruction set the
// compiler can target (AVX-512, AVX2, SSE4, SSSE3, scalar); the best one the
// CPU supports is chosen at run time, so no -march flag is needed.
//
// Each kernel carries SHARDWILD_HOGWILD_KERNEL, which keeps it out of
// ThreadSanitizer's instrumentation: its loads and stores of parameter memory
// are invisible to TSan, so everything else stays checked. Each kernel is
// tested per instruction set against a sequential double-precision reference
// (tests/core/model/hogwild_kernels_test.cc, tests/core/model/optimizer_test.cc). Scalar
// code elsewhere that touches parameter memory uses std::atomic_ref (relaxed).
//
// Memory ordering: none. A kernel neither publishes nor acquires anything;
// callers order the data they hand over by other means (a worker's own
// buffers, a barrier, a lock around row_lock rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/random.h"
#include "core/config/options.h"

#if defined(__clang__) || defined(__GNUC__)
#define SHARDWILD_HOGWILD_KERNEL __attribute__((no_sanitize("thread")))
#else
#define SHARDWILD_HOGWILD_KERNEL
#endif

namespace shardwild {

// The scalars of one optimizer step, resolved once per call (optimizer.cc
// fills it from OptimizerOptions and UpdateParams; see optimizer.h for the
// formulas).
struct UpdateKernelArgs {
  OptimizerType type = OptimizerType::kSgd;
  float lr = 0;
  float momentum = 0;   // momentum
  bool nesterov = false;
  float beta1 = 0, beta2 = 0;  // adam
  float alpha = 0;      // adam: lr * sqrt(1 - b2^t) / (1 - b1^t)
  float eps_hat = 0;    // adam: epsilon * sqrt(1 - b2^t)
  float inv_bound = 0;  // adam: 1 / (1.01 B), 0 = no repair (optimizer.h)
  float epsilon = 0;    // adagrad, rmsprop
  float rho = 0;        // rmsprop
  float l1 = 0, two_l2 = 0, inv_lr = 0;  // ftrl (lr > 0)
};

// The update kernels below run with subnormals flushed to zero (inputs read
// as 0, results stored as 0), restoring the caller's floating-point mode:
// decaying optimizer slots would otherwise reach subnormal values, which x86
// computes tens of times slower (hogwild_kernels.cc).
//
// One update of n parameters `p` with slots s0, s1 (as many as the optimizer
// has; the others may be null) and gradient g (private to the caller). With
// `p_copy` (the caller's private buffer, or null) the new parameters are
// also written there in the same pass: a fused pull of what this update
// left. With `p_copy_bf16` instead (p_copy null) that copy is bf16, rounded
// to nearest even as HogwildCopyFromAsBf16 rounds (model.precision bf16: the
// update stays f32, the worker's copy is what its bf16 matmuls read). Never
// allocates. Hogwild-safe: see above.
void HogwildUpdate(const UpdateKernelArgs& args, float* p, float* s0, float* s1, const float* g, int64_t n,
                   float* p_copy = nullptr, uint16_t* p_copy_bf16 = nullptr);

// The same update of `count` rows of `dim` parameters: row r's parameters
// start at rows[r] and its slots follow them, slot k at rows[r] + (k + 1) *
// dim (an embedding row's block); its gradient is grads[r][0, dim). One call
// for a batch of rows, prefetching a few rows ahead. Rows must be distinct.
void HogwildUpdateRows(const UpdateKernelArgs& args, float* const* rows, const float* const* grads, int64_t count,
                       int64_t dim);

// bf16 embedding rows (model.tables[i].dtype bf16): a row's parameters
// are dim bf16 values at rows[r], its slots f32 from (char*)rows[r] +
// slot_offset on, slot k at + k * dim floats. The same update as
// HogwildUpdateRows, computed in f32 on the widened parameters, and stored
// back by stochastic rounding (16 random bits added below the kept half, so
// E[stored] = the f32 result: small updates are not lost to rounding). The
// random bits hash (salts[r], element); a caller that wants runs to
// reproduce passes salts that depend only on the row's id and a per-call
// counter. Rows must be distinct.
void HogwildUpdateRowsBf16(const UpdateKernelArgs& args, uint16_t* const* rows, const float* const* grads,
                           const uint32_t* salts, int64_t count, int64_t dim, int64_t slot_offset);

// dst[0, n) = the bf16 values src[0, n) as floats (exact), src parameter
// memory other threads may be writing.
void HogwildWidenBf16(const uint16_t* src, float* dst, int64_t n);

// HogwildGatherRows for bf16 rows: out[i * dim, + dim) = rows[i][0, dim) widened.
void HogwildGatherRowsBf16(const uint16_t* const* rows, int64_t count, int64_t dim, float* out);

// dst[0, n) = src[0, n) rounded stochastically to bf16 with `salt`, as
// HogwildUpdateRowsBf16 stores (element i's bits hash (salt, i)).
void HogwildRoundBf16Stochastic(const float* src, uint16_t* dst, int64_t n, uint32_t salt);

// dst[0, n) = src[0, n), where src is parameter memory that other threads may
// be writing (a pull) and dst is the caller's private buffer.
void HogwildCopyFrom(const float* src, float* dst, int64_t n);

// dst[0, n) = bf16(src[0, n)), rounded to nearest even (ties to even; a
// quiet NaN stays NaN): HogwildCopyFrom into a bf16 buffer, a pull for a
// model that computes in bf16. src may also be private memory.
void HogwildCopyFromAsBf16(const float* src, uint16_t* dst, int64_t n);

// dst[0, n) = src[0, n), where dst is parameter memory that other threads may
// be reading or writing and src is the caller's private buffer.
void HogwildCopyTo(const float* src, float* dst, int64_t n);

// dst[0, n) = value for parameter memory (slot initial values, resets).
void HogwildFill(float value, float* dst, int64_t n);

// out[i * dim, (i + 1) * dim) = rows[i][0, dim) for i in [0, count): a gather
// of `count` rows of parameter memory into a private buffer (embedding pulls).
// Prefetches a few rows ahead.
void HogwildGatherRows(const float* const* rows, int64_t count, int64_t dim, float* out);

// Merges a worker's private copies of `count` rows into parameter memory
// (workers/hot_rows.h): for each r, with row r's private copy at
// local[r * dim, + dim) and its value when copied at base[r * dim, + dim),
// shared[r][j] += local[r * dim + j] - base[r * dim + j] (the updates made
// to the copy since, as a delta, so that other threads' updates of the
// shared row in between are kept). Prefetches a few rows ahead, with
// intent to write.
void HogwildMergeRows(float* const* shared, const float* local, const float* base, int64_t count, int64_t dim);

// EmbeddingBagForward's kernel (core/model/sparse_layers.h: the pools of
// rows gathered into a private buffer, row i at rows + i * dim). Not a
// Hogwild kernel (it reads no parameter memory), but the in-place forward
// below pools with the same code, the same floats in the same order.
void PoolGatheredBags(const float* rows, int64_t dim, const int64_t* offsets, const float* weights, int64_t batch,
                      Pooling pooling, float* out, int64_t out_stride);

// The fused embedding path (ParamStore::RowAddresses): rows read and updated
// in the store's memory, with no pulled copy and no gradient buffer.
//
// EmbeddingBagForward (core/model/sparse_layers.h) over rows read in place: for
// each bag b < batch, out[b * out_stride, + dim) = the pool over i in
// [offsets[b], offsets[b+1]) of w_i * rows[i][0, dim), w_i = weights ?
// weights[i] : 1; kMean divides by the bag's size. The same operations in
// the same order as EmbeddingBagForward over gathered rows, so the same
// floats (for rows no other thread is writing).
void HogwildEmbeddingBagForward(const float* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                int64_t batch, Pooling pooling, float* out, int64_t out_stride);

// The embedding-bag backward fused with plain SGD: for each id i of each bag
// b < valid, in order, rows[i][j] -= lr * (c_i * dout[b * out_stride + j])
// with c_i = w_i * (kMean ? 1 / n_b : 1) * scale, the gradient
// EmbeddingBagBackward would have written for that id. A repeated id gets
// one update per occurrence (PushRows sums them first: equal in exact
// arithmetic). Bags b >= valid (padding) are skipped. Runs with subnormals
// flushed, as the update kernels.
void HogwildEmbeddingBagSgd(float* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                            int64_t batch, int64_t valid, Pooling pooling, const float* dout, int64_t out_stride,
                            float scale, float lr);

// The same two over bf16 rows (a bf16 table's static rows in place; rows[i]
// points at dim bf16 values). The forward pools the widened rows, the same
// floats as EmbeddingBagForward over rows gathered by HogwildGatherRowsBf16.
// The SGD computes each occurrence's step in f32 on the widened row and
// stores it back by stochastic rounding with salt BagSgdBf16Salt(seed,
// occurrence) (HogwildRoundBf16Stochastic's bits): pass a new seed per call.
void HogwildEmbeddingBagForwardBf16(const uint16_t* const* rows, int64_t dim, const int64_t* offsets,
                                    const float* weights, int64_t batch, Pooling pooling, float* out,
                                    int64_t out_stride);
void HogwildEmbeddingBagSgdBf16(uint16_t* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                int64_t batch, int64_t valid, Pooling pooling, const float* dout, int64_t out_stride,
                                float scale, float lr, uint64_t seed);

// The stochastic rounding salt HogwildEmbeddingBagSgdBf16 uses for
// occurrence i (its index into the bags' ids) with `seed`.
inline uint32_t BagSgdBf16Salt(uint64_t seed, int64_t i) {
  return static_cast<uint32_t>(SplitMix64Mix(seed ^ static_cast<uint64_t>(i)) >> 32);
}

// The instruction-set targets compiled in and supported by this CPU, best
// first (Highway's names: "AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR"/"EMU128").
std::vector<std::string> HogwildKernelTargets();

// The target the kernels run on now.
std::string ActiveHogwildKernelTarget();

// Restricts the kernels to one target of HogwildKernelTargets() while it
// lives (tests and benchmarks that compare targets). Process-wide and not
// thread-safe: create it while no kernel runs. An unknown name leaves the
// dispatch as it is and ok() is false.
class ScopedHogwildKernelTarget {
 public:
  explicit ScopedHogwildKernelTarget(const std::string& name);
  ~ScopedHogwildKernelTarget();
  ScopedHogwildKernelTarget(const ScopedHogwildKernelTarget&) = delete;
  ScopedHogwildKernelTarget& operator=(const ScopedHogwildKernelTarget&) = delete;
  bool ok() const { return ok_; }

 private:
  bool ok_ = false;
};

}  // namespace shardwild
