// The Hogwild kernels (hogwild_kernels.h), written once with Google Highway
// and compiled for every x86 target Highway can reach, scalar included, so
// that each can be tested and timed on the same machine.
//
// Each optimizer is a functor whose operator() updates the lanes of one
// vector at index i; Run() drives it over whole vectors and then over the
// tail one lane at a time (a 1-lane tag), so no load or store ever touches
// memory past n, on any target.
//
// Bit-identical on every target: each formula is evaluated in the order
// optimizer.h writes it, with separate multiplies and adds (no fused
// multiply-add, which SSE4 lacks and which rounds once instead of twice) and
// IEEE division and square root. So a run gives the same parameters on an
// AVX-512 server and an SSE4 laptop, and sync mode stays reproducible
// across machines; the memory-bound kernels lose nothing by it.

// This file includes itself once per target (Highway's foreach_target), for
// every attainable one, scalar too (HWY_COMPILE_ALL_ATTAINABLE, set in
// CMakeLists.txt): tests compare each with the reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/model/hogwild_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

#include <algorithm>
#include <type_traits>

#include "core/base/prefetch.h"
#include "core/model/hogwild_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Where an update fused with a pull writes the new parameters besides the
// store: nowhere, the caller's f32 copy pc, or its bf16 copy pc16.
enum CopyKind : int { kNoCopy = 0, kCopyF32 = 1, kCopyBf16 = 2 };

// Stores the lanes of v to dst[0, lanes) as bf16, rounded to nearest even
// (what VCVTNEPS2BF16 and oneDNN's reorders do): the upper half of the
// float's bits after adding 0x7FFF plus the lowest bit kept. A NaN stays a
// NaN (quiet ones; parameters are never signalling NaNs).
template <class D, class V>
HWY_INLINE void StoreBf16(D d, V v, uint16_t* dst) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto upper = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  // In [0, 0xFFFF]: the signed-to-u16 demotion keeps it as it is.
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, upper)), d16, dst);
}

// Stores new parameters to p and, where the update is fused with a pull,
// to the caller's copy too (pc, or pc16 rounded to bf16).
template <int kCopy, class D, class V>
HWY_INLINE void StoreParams(D d, V vp, float* p, float* pc, uint16_t* pc16, int64_t i) {
  hn::StoreU(vp, d, p + i);
  if constexpr (kCopy == kCopyF32) hn::StoreU(vp, d, pc + i);
  if constexpr (kCopy == kCopyBf16) StoreBf16(d, vp, pc16 + i);
}

// Applies op at every index of [0, n): whole vectors, then single lanes.
template <class Op>
HWY_INLINE void Run(const Op& op, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) op(d, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < n; ++i) op(d1, i);
}

template <int kCopy>
struct SgdOp {
  float lr;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vp = hn::LoadU(d, p + i);
    StoreParams<kCopy>(d, hn::Sub(vp, hn::Mul(hn::Set(d, lr), hn::LoadU(d, g + i))), p, pc, pc16, i);
  }
};

// v = mu v + g;  p -= lr v  (nesterov: p -= lr (g + mu v))
template <int kCopy>
struct MomentumOp {
  float lr, mu;
  bool nesterov;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  float* v;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vg = hn::LoadU(d, g + i);
    const auto vmu = hn::Set(d, mu);
    const auto vv = hn::Add(hn::Mul(vmu, hn::LoadU(d, v + i)), vg);
    const auto step = nesterov ? hn::Add(vg, hn::Mul(vmu, vv)) : vv;
    const auto vp = hn::Sub(hn::LoadU(d, p + i), hn::Mul(hn::Set(d, lr), step));
    hn::StoreU(vv, d, v + i);
    StoreParams<kCopy>(d, vp, p, pc, pc16, i);
  }
};

// m = b1 m + (1-b1) g;  v = max(b2 v + (1-b2) g^2, (|m| inv_bound)^2);
// p -= alpha m / (sqrt(v) + eps_hat)   (optimizer.h: the Hogwild repair)
template <int kCopy>
struct AdamOp {
  float b1, b2, alpha, eps_hat, inv_bound;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  float* m1;
  float* m2;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vg = hn::LoadU(d, g + i);
    const auto m = hn::Add(hn::Mul(hn::Set(d, b1), hn::LoadU(d, m1 + i)), hn::Mul(hn::Set(d, 1.0f - b1), vg));
    auto v = hn::Add(hn::Mul(hn::Set(d, b2), hn::LoadU(d, m2 + i)), hn::Mul(hn::Mul(hn::Set(d, 1.0f - b2), vg), vg));
    const auto floor = hn::Mul(hn::Abs(m), hn::Set(d, inv_bound));
    v = hn::Max(v, hn::Mul(floor, floor));
    const auto step = hn::Div(hn::Mul(hn::Set(d, alpha), m), hn::Add(hn::Sqrt(v), hn::Set(d, eps_hat)));
    const auto vp = hn::Sub(hn::LoadU(d, p + i), step);
    hn::StoreU(m, d, m1 + i);
    hn::StoreU(v, d, m2 + i);
    StoreParams<kCopy>(d, vp, p, pc, pc16, i);
  }
};

// a += g^2;  p -= lr g / (sqrt(a) + eps)
template <int kCopy>
struct AdagradOp {
  float lr, eps;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  float* acc;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vg = hn::LoadU(d, g + i);
    const auto a = hn::Add(hn::LoadU(d, acc + i), hn::Mul(vg, vg));
    const auto step = hn::Div(hn::Mul(hn::Set(d, lr), vg), hn::Add(hn::Sqrt(a), hn::Set(d, eps)));
    const auto vp = hn::Sub(hn::LoadU(d, p + i), step);
    hn::StoreU(a, d, acc + i);
    StoreParams<kCopy>(d, vp, p, pc, pc16, i);
  }
};

// s = rho s + (1-rho) g^2;  p -= lr g / (sqrt(s) + eps)
template <int kCopy>
struct RmspropOp {
  float lr, rho, eps;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  float* ms;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vg = hn::LoadU(d, g + i);
    const auto s = hn::Add(hn::Mul(hn::Set(d, rho), hn::LoadU(d, ms + i)), hn::Mul(hn::Mul(hn::Set(d, 1.0f - rho), vg), vg));
    const auto step = hn::Div(hn::Mul(hn::Set(d, lr), vg), hn::Add(hn::Sqrt(s), hn::Set(d, eps)));
    const auto vp = hn::Sub(hn::LoadU(d, p + i), step);
    hn::StoreU(s, d, ms + i);
    StoreParams<kCopy>(d, vp, p, pc, pc16, i);
  }
};

// FTRL-proximal (optimizer.h): acc = n, lin = z.
template <int kCopy>
struct FtrlOp {
  float l1, two_l2, inv_lr;
  float* p;
  float* pc;  // the fused pull's copy (kCopy)
  uint16_t* pc16;
  float* acc;
  float* lin;
  const float* g;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto vg = hn::LoadU(d, g + i);
    const auto n_old = hn::LoadU(d, acc + i);
    const auto vp = hn::LoadU(d, p + i);
    const auto gg = hn::Mul(vg, vg);
    const auto n_new = hn::Add(n_old, gg);
    const auto sqrt_new = hn::Sqrt(n_new);
    // sqrt(n_new) - sqrt(n_old) without the cancellation; n > 0.
    const auto sigma = hn::Mul(hn::Div(gg, hn::Add(sqrt_new, hn::Sqrt(n_old))), hn::Set(d, inv_lr));
    const auto z = hn::Sub(hn::Add(hn::LoadU(d, lin + i), vg), hn::Mul(sigma, vp));
    // -(z - sign(z) l1) / q where |z| > l1, else +0.
    const auto shrunk = hn::Max(hn::Sub(hn::Abs(z), hn::Set(d, l1)), hn::Zero(d));
    const auto q = hn::Add(hn::Mul(sqrt_new, hn::Set(d, inv_lr)), hn::Set(d, two_l2));
    const auto np = hn::Add(hn::Div(hn::CopySign(shrunk, hn::Neg(z)), q), hn::Zero(d));
    hn::StoreU(n_new, d, acc + i);
    hn::StoreU(z, d, lin + i);
    StoreParams<kCopy>(d, np, p, pc, pc16, i);
  }
};

template <int kCopy>
HWY_INLINE void Update(const UpdateKernelArgs& a, float* p, float* s0, float* s1, const float* g, int64_t n,
                       float* pc, uint16_t* pc16) {
  switch (a.type) {
    case OptimizerType::kSgd:
      Run(SgdOp<kCopy>{a.lr, p, pc, pc16, g}, n);
      return;
    case OptimizerType::kMomentum:
      Run(MomentumOp<kCopy>{a.lr, a.momentum, a.nesterov, p, pc, pc16, s0, g}, n);
      return;
    case OptimizerType::kAdam:
      Run(AdamOp<kCopy>{a.beta1, a.beta2, a.alpha, a.eps_hat, a.inv_bound, p, pc, pc16, s0, s1, g}, n);
      return;
    case OptimizerType::kAdagrad:
      Run(AdagradOp<kCopy>{a.lr, a.epsilon, p, pc, pc16, s0, g}, n);
      return;
    case OptimizerType::kRmsprop:
      Run(RmspropOp<kCopy>{a.lr, a.rho, a.epsilon, p, pc, pc16, s0, g}, n);
      return;
    case OptimizerType::kFtrl:
      Run(FtrlOp<kCopy>{a.l1, a.two_l2, a.inv_lr, p, pc, pc16, s0, s1, g}, n);
      return;
  }
}

SHARDWILD_HOGWILD_KERNEL void UpdateImpl(const UpdateKernelArgs& a, float* p, float* s0, float* s1, const float* g,
                                         int64_t n, float* pc, uint16_t* pc16) {
  if (pc != nullptr) {
    Update<kCopyF32>(a, p, s0, s1, g, n, pc, nullptr);
  } else if (pc16 != nullptr) {
    Update<kCopyBf16>(a, p, s0, s1, g, n, nullptr, pc16);
  } else {
    Update<kNoCopy>(a, p, s0, s1, g, n, nullptr, nullptr);
  }
}

// f32 lanes of the bf16 values at src (exact: a bf16 is the upper half of a float).
template <class D>
HWY_INLINE auto LoadBf16(D d, const uint16_t* src) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint16_t, D> d16;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, src))));
}

// Stores the lanes of v (elements i, i + 1, ... of a row) to dst as bf16 by
// stochastic rounding: 16 random bits added to the float's bits before the
// lower half is dropped, so a value rounds away from zero with probability
// (its distance from the bf16 below) / (the bf16 step) and the rounding is
// unbiased. The bits hash (salt, element); a NaN is stored as its upper half.
// The salt must itself be well mixed (a SplitMix64 output), as callers give.
template <class D, class V>
HWY_INLINE void StoreBf16Stochastic(D d, V v, uint16_t* dst, uint32_t salt, int64_t i) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  // The random bits: the upper half of (element ^ salt) times 2^32 / phi,
  // Knuth's multiplicative hash (its upper bits mix every input bit; one
  // multiply, whose latency this kernel otherwise waits on).
  const auto index = hn::Add(hn::Iota(du, 0), hn::Set(du, static_cast<uint32_t>(i)));
  const auto random = hn::ShiftRight<16>(hn::Mul(hn::Xor(index, hn::Set(du, salt)), hn::Set(du, 0x9E3779B9u)));
  const auto bits = hn::BitCast(du, v);
  const auto rounded = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), bits, hn::Add(bits, random));
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(rounded))), d16, dst);
}

struct WidenOp {
  const uint16_t* src;
  float* dst;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    hn::StoreU(LoadBf16(d, src + i), d, dst + i);
  }
};

struct StochasticStoreOp {
  const float* src;
  uint16_t* dst;
  uint32_t salt;
  int64_t first;  // the element index of src[0] in its row
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    StoreBf16Stochastic(d, hn::LoadU(d, src + i), dst + i, salt, first + i);
  }
};

// bf16 rows: each row's parameters widened to f32 a chunk at a time, the
// f32 update (the same Update as f32 rows, slots in place), then stored
// back by stochastic rounding.
SHARDWILD_HOGWILD_KERNEL void UpdateRowsBf16Impl(const UpdateKernelArgs& a, uint16_t* const* rows,
                                                 const float* const* grads, const uint32_t* salts, int64_t count,
                                                 int64_t dim, int64_t slot_offset) {
  constexpr int64_t kAhead = 4;
  constexpr int64_t kChunk = 256;
  HWY_ALIGN float buf[kChunk];
  for (int64_t r = 0; r < count; ++r) {
    if (r + kAhead < count) hwy::Prefetch(rows[r + kAhead]);
    uint16_t* p = rows[r];
    float* s0 = reinterpret_cast<float*>(reinterpret_cast<char*>(p) + slot_offset);
    for (int64_t j = 0; j < dim; j += kChunk) {
      const int64_t n = std::min<int64_t>(kChunk, dim - j);
      Run(WidenOp{p + j, buf}, n);
      Update<kNoCopy>(a, buf, s0 + j, s0 + dim + j, grads[r] + j, n, nullptr, nullptr);
      Run(StochasticStoreOp{buf, p + j, salts[r], j}, n);
    }
  }
}

SHARDWILD_HOGWILD_KERNEL void WidenBf16Impl(const uint16_t* src, float* dst, int64_t n) { Run(WidenOp{src, dst}, n); }

SHARDWILD_HOGWILD_KERNEL void GatherRowsBf16Impl(const uint16_t* const* rows, int64_t count, int64_t dim, float* out) {
  constexpr int64_t kAhead = 8;
  for (int64_t r = 0; r < count; ++r) {
    if (r + kAhead < count) hwy::Prefetch(rows[r + kAhead]);
    Run(WidenOp{rows[r], out + r * dim}, dim);
  }
}

// Stochastic rounding alone (tests): dst = SR(src) with `salt`.
SHARDWILD_HOGWILD_KERNEL void RoundBf16StochasticImpl(const float* src, uint16_t* dst, int64_t n, uint32_t salt) {
  Run(StochasticStoreOp{src, dst, salt, 0}, n);
}

SHARDWILD_HOGWILD_KERNEL void UpdateRowsImpl(const UpdateKernelArgs& a, float* const* rows, const float* const* grads,
                                             int64_t count, int64_t dim) {
  constexpr int64_t kAhead = 4;
  for (int64_t r = 0; r < count; ++r) {
    if (r + kAhead < count) hwy::Prefetch(rows[r + kAhead]);
    float* p = rows[r];
    Update<kNoCopy>(a, p, p + dim, p + 2 * dim, grads[r], dim, nullptr, nullptr);
  }
}

struct CopyOp {
  const float* src;
  float* dst;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    hn::StoreU(hn::LoadU(d, src + i), d, dst + i);
  }
};

SHARDWILD_HOGWILD_KERNEL void CopyImpl(const float* src, float* dst, int64_t n) { Run(CopyOp{src, dst}, n); }

struct CopyBf16Op {
  const float* src;
  uint16_t* dst;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    StoreBf16(d, hn::LoadU(d, src + i), dst + i);
  }
};

SHARDWILD_HOGWILD_KERNEL void CopyBf16Impl(const float* src, uint16_t* dst, int64_t n) {
  Run(CopyBf16Op{src, dst}, n);
}

struct FillOp {
  float value;
  float* dst;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    hn::StoreU(hn::Set(d, value), d, dst + i);
  }
};

SHARDWILD_HOGWILD_KERNEL void FillImpl(float value, float* dst, int64_t n) { Run(FillOp{value, dst}, n); }

SHARDWILD_HOGWILD_KERNEL void GatherRowsImpl(const float* const* rows, int64_t count, int64_t dim, float* out) {
  constexpr int64_t kAhead = 8;
  for (int64_t r = 0; r < count; ++r) {
    if (r + kAhead < count) hwy::Prefetch(rows[r + kAhead]);
    Run(CopyOp{rows[r], out + r * dim}, dim);
  }
}

// shared += local - base.
struct MergeRowOp {
  float* shared;
  const float* local;
  const float* base;
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto delta = hn::Sub(hn::LoadU(d, local + i), hn::LoadU(d, base + i));
    hn::StoreU(hn::Add(hn::LoadU(d, shared + i), delta), d, shared + i);
  }
};

SHARDWILD_HOGWILD_KERNEL void MergeRowsImpl(float* const* shared, const float* local, const float* base,
                                            int64_t count, int64_t dim) {
  constexpr int64_t kAhead = 4;
  for (int64_t r = 0; r < count; ++r) {
    if (r + kAhead < count) PrefetchLineForWrite(shared[r + kAhead]);
    Run(MergeRowOp{shared[r], local + r * dim, base + r * dim}, dim);
  }
}

// A row's elements as f32 lanes: f32 rows as they are, bf16 rows widened.
template <class D>
HWY_INLINE auto LoadRow(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE auto LoadRow(D d, const uint16_t* p) {
  return LoadBf16(d, p);
}

// Stores f32 lanes (elements i, ... of a row) back to the row: f32 rows as
// they are, bf16 rows by stochastic rounding with `salt`.
template <class D, class V>
HWY_INLINE void StoreRow(D d, V v, float* row, uint32_t /*salt*/, int64_t i) {
  hn::StoreU(v, d, row + i);
}
template <class D, class V>
HWY_INLINE void StoreRow(D d, V v, uint16_t* row, uint32_t salt, int64_t i) {
  StoreBf16Stochastic(d, v, row + i, salt, i);
}

// p[0, dim) = p - lr * (c * g): EmbeddingBagBackward's product, then SgdOp's
// step (computed on the widened row and stochastically rounded for bf16).
template <typename T>
struct BagSgdOp {
  float c, lr;
  T* p;
  const float* g;
  uint32_t salt;  // bf16 rows only
  template <class D>
  HWY_INLINE void operator()(D d, int64_t i) const {
    const auto grad = hn::Mul(hn::Set(d, c), hn::LoadU(d, g + i));
    StoreRow(d, hn::Sub(LoadRow(d, p + i), hn::Mul(hn::Set(d, lr), grad)), p, salt, i);
  }
};

// One bag's pooled vector: out[0, dim) = s * sum_i w_i * rows[i][0, dim),
// summed in registers, a group of vectors at a time, and stored once.
// Filling the output with zeros and adding each row into it instead (a
// store, then a load and a store a row) pooled rows outside the caches at
// about half the rate: dense_benchmark's BM_InPlaceRows (DLRM's shape, dim
// 16, 2-core VM) 28-35M rows/s that way, 51-57M this way, against 82-85M
// for the random-row bound (RewriteRows) over the same rows.
// The sums are the same floats: 0 + w_0 r_0 + w_1 r_1 ..., then * s.
// (Named accumulators, not an array: scalable vectors cannot be array elements.)
// row_of(i): where entry i's row starts (an address in place, or a gathered
// row).
template <class D, class RowOf>
HWY_INLINE void PoolFourVectors(D d, const RowOf& row_of, const float* weights, int64_t begin, int64_t end,
                                bool scale, float s, int64_t c, float* o) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  for (int64_t i = begin; i < end; ++i) {
    const auto w = hn::Set(d, weights ? weights[i] : 1.0f);
    const auto* r = row_of(i) + c;
    a0 = hn::Add(a0, hn::Mul(w, LoadRow(d, r)));
    a1 = hn::Add(a1, hn::Mul(w, LoadRow(d, r + n)));
    a2 = hn::Add(a2, hn::Mul(w, LoadRow(d, r + 2 * n)));
    a3 = hn::Add(a3, hn::Mul(w, LoadRow(d, r + 3 * n)));
  }
  if (scale) {
    const auto vs = hn::Set(d, s);
    a0 = hn::Mul(a0, vs), a1 = hn::Mul(a1, vs), a2 = hn::Mul(a2, vs), a3 = hn::Mul(a3, vs);
  }
  hn::StoreU(a0, d, o + c);
  hn::StoreU(a1, d, o + c + n);
  hn::StoreU(a2, d, o + c + 2 * n);
  hn::StoreU(a3, d, o + c + 3 * n);
}

template <class D, class RowOf>
HWY_INLINE void PoolVector(D d, const RowOf& row_of, const float* weights, int64_t begin, int64_t end, bool scale,
                           float s, int64_t c, float* o) {
  auto a = hn::Zero(d);
  for (int64_t i = begin; i < end; ++i) {
    a = hn::Add(a, hn::Mul(hn::Set(d, weights ? weights[i] : 1.0f), LoadRow(d, row_of(i) + c)));
  }
  hn::StoreU(scale ? hn::Mul(a, hn::Set(d, s)) : a, d, o + c);
}

// One bag's pooled vector, out[0, dim), from rows of T (float or bf16)
// found by row_of (PoolFourVectors): groups of four vectors, then single
// vectors, then 8 floats (where a vector holds more), then one at a time.
template <typename T, class RowOf>
HWY_INLINE void PoolBag(const RowOf& row_of, int64_t dim, const float* weights, int64_t begin, int64_t end,
                        Pooling pooling, float* o) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 1> d1;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d)), n8 = static_cast<int64_t>(hn::Lanes(d8));
  const bool scale = pooling == Pooling::kMean && end > begin;
  const float s = scale ? 1.0f / static_cast<float>(end - begin) : 1.0f;
  int64_t c = 0;
  for (; c + 4 * n <= dim; c += 4 * n) PoolFourVectors(d, row_of, weights, begin, end, scale, s, c, o);
  for (; c + n <= dim; c += n) PoolVector(d, row_of, weights, begin, end, scale, s, c, o);
  for (; c + n8 <= dim; c += n8) PoolVector(d8, row_of, weights, begin, end, scale, s, c, o);
  for (; c < dim; ++c) PoolVector(d1, row_of, weights, begin, end, scale, s, c, o);
}

// The in-place embedding-bag forward over rows of T (float or bf16).
template <typename T>
HWY_INLINE void EmbeddingBagForwardRows(const T* const* rows, int64_t dim, const int64_t* offsets,
                                        const float* weights, int64_t batch, Pooling pooling, float* out,
                                        int64_t out_stride) {
  constexpr int64_t kAhead = 16;
  const int64_t total = offsets[batch];
  const size_t bytes = static_cast<size_t>(dim) * sizeof(T);
  const auto row_of = [rows](int64_t i) { return rows[i]; };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    // With intent to write: the step's fused update follows.
    for (int64_t i = begin + kAhead; i < std::min(end + kAhead, total); ++i) PrefetchLinesForWrite(rows[i], bytes);
    PoolBag<T>(row_of, dim, weights, begin, end, pooling, out + b * out_stride);
  }
}

// The embedding-bag forward over gathered rows (private memory, not
// parameters: no Hogwild attribute): row i at rows + i * dim.
void EmbeddingBagForwardGatheredImpl(const float* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                     int64_t batch, Pooling pooling, float* out, int64_t out_stride) {
  const auto row_of = [rows, dim](int64_t i) { return rows + i * dim; };
  for (int64_t b = 0; b < batch; ++b) {
    PoolBag<float>(row_of, dim, weights, offsets[b], offsets[b + 1], pooling, out + b * out_stride);
  }
}

// The fused embedding-bag backward and SGD over rows of T; bf16 rows round
// occurrence i with BagSgdBf16Salt(seed, i).
template <typename T>
HWY_INLINE void EmbeddingBagSgdRows(T* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                    int64_t valid, Pooling pooling, const float* dout, int64_t out_stride,
                                    float scale, float lr, uint64_t seed) {
  constexpr int64_t kAhead = 16;
  const int64_t total = offsets[valid];
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < valid; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    const float* g = dout + b * out_stride;
    const float pool = pooling == Pooling::kMean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
    for (int64_t i = begin; i < end; ++i) {
      if (i + kAhead < total) PrefetchLinesForWrite(rows[i + kAhead], static_cast<size_t>(bytes));
      const uint32_t salt = std::is_same_v<T, uint16_t> ? BagSgdBf16Salt(seed, i) : 0u;
      Run(BagSgdOp<T>{(weights ? weights[i] : 1.0f) * pool * scale, lr, rows[i], g, salt}, dim);
    }
  }
}

SHARDWILD_HOGWILD_KERNEL void EmbeddingBagForwardImpl(const float* const* rows, int64_t dim, const int64_t* offsets,
                                                      const float* weights, int64_t batch, Pooling pooling,
                                                      float* out, int64_t out_stride) {
  EmbeddingBagForwardRows(rows, dim, offsets, weights, batch, pooling, out, out_stride);
}

SHARDWILD_HOGWILD_KERNEL void EmbeddingBagSgdImpl(float* const* rows, int64_t dim, const int64_t* offsets,
                                                  const float* weights, int64_t valid, Pooling pooling,
                                                  const float* dout, int64_t out_stride, float scale, float lr) {
  EmbeddingBagSgdRows(rows, dim, offsets, weights, valid, pooling, dout, out_stride, scale, lr, /*seed=*/0);
}

SHARDWILD_HOGWILD_KERNEL void EmbeddingBagForwardBf16Impl(const uint16_t* const* rows, int64_t dim,
                                                          const int64_t* offsets, const float* weights, int64_t batch,
                                                          Pooling pooling, float* out, int64_t out_stride) {
  EmbeddingBagForwardRows(rows, dim, offsets, weights, batch, pooling, out, out_stride);
}

SHARDWILD_HOGWILD_KERNEL void EmbeddingBagSgdBf16Impl(uint16_t* const* rows, int64_t dim, const int64_t* offsets,
                                                      const float* weights, int64_t valid, Pooling pooling,
                                                      const float* dout, int64_t out_stride, float scale, float lr,
                                                      uint64_t seed) {
  EmbeddingBagSgdRows(rows, dim, offsets, weights, valid, pooling, dout, out_stride, scale, lr, seed);
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace shardwild {
namespace {

// Subnormal floats cost about a hundred cycles per operation on x86. An
// optimizer's slots decay geometrically wherever the gradient stays 0 (a
// pixel that is always 0, a dead unit): Adam's m falls below FLT_MIN after
// about 800 steps of beta1 = 0.9, and from then on every update of it ran
// tens of times slower (the default MLP's push went from 21% to 55% of the
// step between steps 300 and 1400). So the update kernels run with
// flush-to-zero and denormals-are-zero, as TensorFlow's CPU threads do: a
// subnormal input reads as 0 and a subnormal result is stored as 0, on every
// target alike (all x86 targets obey MXCSR). The caller's mode is restored.
class ScopedFlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtzDaz); }
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bit 15 (FTZ) and bit 6 (DAZ)
  unsigned saved_;
#endif
};

}  // namespace

HWY_EXPORT(UpdateImpl);
HWY_EXPORT(UpdateRowsImpl);
HWY_EXPORT(CopyImpl);
HWY_EXPORT(CopyBf16Impl);
HWY_EXPORT(UpdateRowsBf16Impl);
HWY_EXPORT(WidenBf16Impl);
HWY_EXPORT(GatherRowsBf16Impl);
HWY_EXPORT(RoundBf16StochasticImpl);
HWY_EXPORT(FillImpl);
HWY_EXPORT(GatherRowsImpl);
HWY_EXPORT(MergeRowsImpl);
HWY_EXPORT(EmbeddingBagForwardImpl);
HWY_EXPORT(EmbeddingBagForwardGatheredImpl);
HWY_EXPORT(EmbeddingBagSgdImpl);
HWY_EXPORT(EmbeddingBagForwardBf16Impl);
HWY_EXPORT(EmbeddingBagSgdBf16Impl);
HWY_EXPORT(TargetNameImpl);

void HogwildUpdate(const UpdateKernelArgs& args, float* p, float* s0, float* s1, const float* g, int64_t n,
                   float* p_copy, uint16_t* p_copy_bf16) {
  if (n <= 0) return;
  ScopedFlushDenormals ftz;
  HWY_DYNAMIC_DISPATCH(UpdateImpl)(args, p, s0, s1, g, n, p_copy, p_copy != nullptr ? nullptr : p_copy_bf16);
}

void HogwildUpdateRows(const UpdateKernelArgs& args, float* const* rows, const float* const* grads, int64_t count,
                       int64_t dim) {
  if (count <= 0 || dim <= 0) return;
  ScopedFlushDenormals ftz;
  HWY_DYNAMIC_DISPATCH(UpdateRowsImpl)(args, rows, grads, count, dim);
}

void HogwildUpdateRowsBf16(const UpdateKernelArgs& args, uint16_t* const* rows, const float* const* grads,
                           const uint32_t* salts, int64_t count, int64_t dim, int64_t slot_offset) {
  if (count <= 0 || dim <= 0) return;
  ScopedFlushDenormals ftz;
  HWY_DYNAMIC_DISPATCH(UpdateRowsBf16Impl)(args, rows, grads, salts, count, dim, slot_offset);
}

void HogwildWidenBf16(const uint16_t* src, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(WidenBf16Impl)(src, dst, n);
}

void HogwildGatherRowsBf16(const uint16_t* const* rows, int64_t count, int64_t dim, float* out) {
  if (count > 0 && dim > 0) HWY_DYNAMIC_DISPATCH(GatherRowsBf16Impl)(rows, count, dim, out);
}

void HogwildRoundBf16Stochastic(const float* src, uint16_t* dst, int64_t n, uint32_t salt) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(RoundBf16StochasticImpl)(src, dst, n, salt);
}

void HogwildCopyFrom(const float* src, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(CopyImpl)(src, dst, n);
}

void HogwildCopyFromAsBf16(const float* src, uint16_t* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(CopyBf16Impl)(src, dst, n);
}

void HogwildCopyTo(const float* src, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(CopyImpl)(src, dst, n);
}

void HogwildFill(float value, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(FillImpl)(value, dst, n);
}

void HogwildGatherRows(const float* const* rows, int64_t count, int64_t dim, float* out) {
  if (count > 0 && dim > 0) HWY_DYNAMIC_DISPATCH(GatherRowsImpl)(rows, count, dim, out);
}

void HogwildMergeRows(float* const* shared, const float* local, const float* base, int64_t count, int64_t dim) {
  if (count > 0 && dim > 0) HWY_DYNAMIC_DISPATCH(MergeRowsImpl)(shared, local, base, count, dim);
}

void PoolGatheredBags(const float* rows, int64_t dim, const int64_t* offsets, const float* weights, int64_t batch,
                      Pooling pooling, float* out, int64_t out_stride) {
  if (batch > 0 && dim > 0) {
    HWY_DYNAMIC_DISPATCH(EmbeddingBagForwardGatheredImpl)(rows, dim, offsets, weights, batch, pooling, out,
                                                          out_stride);
  }
}

void HogwildEmbeddingBagForward(const float* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                int64_t batch, Pooling pooling, float* out, int64_t out_stride) {
  if (batch > 0 && dim > 0) {
    HWY_DYNAMIC_DISPATCH(EmbeddingBagForwardImpl)(rows, dim, offsets, weights, batch, pooling, out, out_stride);
  }
}

void HogwildEmbeddingBagSgd(float* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                            int64_t batch, int64_t valid, Pooling pooling, const float* dout, int64_t out_stride,
                            float scale, float lr) {
  valid = std::min(valid, batch);
  if (valid <= 0 || dim <= 0) return;
  ScopedFlushDenormals ftz;
  HWY_DYNAMIC_DISPATCH(EmbeddingBagSgdImpl)(rows, dim, offsets, weights, valid, pooling, dout, out_stride, scale, lr);
}

void HogwildEmbeddingBagForwardBf16(const uint16_t* const* rows, int64_t dim, const int64_t* offsets,
                                    const float* weights, int64_t batch, Pooling pooling, float* out,
                                    int64_t out_stride) {
  if (batch > 0 && dim > 0) {
    HWY_DYNAMIC_DISPATCH(EmbeddingBagForwardBf16Impl)(rows, dim, offsets, weights, batch, pooling, out, out_stride);
  }
}

void HogwildEmbeddingBagSgdBf16(uint16_t* const* rows, int64_t dim, const int64_t* offsets, const float* weights,
                                int64_t batch, int64_t valid, Pooling pooling, const float* dout, int64_t out_stride,
                                float scale, float lr, uint64_t seed) {
  valid = std::min(valid, batch);
  if (valid <= 0 || dim <= 0) return;
  ScopedFlushDenormals ftz;
  HWY_DYNAMIC_DISPATCH(EmbeddingBagSgdBf16Impl)(rows, dim, offsets, weights, valid, pooling, dout, out_stride, scale,
                                                lr, seed);
}

std::vector<std::string> HogwildKernelTargets() {
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

std::string ActiveHogwildKernelTarget() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

ScopedHogwildKernelTarget::ScopedHogwildKernelTarget(const std::string& name) {
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      ok_ = true;
      return;
    }
  }
}

ScopedHogwildKernelTarget::~ScopedHogwildKernelTarget() {
  if (ok_) hwy::SetSupportedTargetsForTest(0);
}

}  // namespace shardwild
#endif  // HWY_ONCE
