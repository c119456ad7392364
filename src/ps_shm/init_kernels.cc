// The row initialisation kernels (init_kernels.h), compiled for every x86
// target Highway can reach (HWY_COMPILE_ALL_ATTAINABLE, set in
// CMakeLists.txt, with -ffp-contract=off so no target fuses the multiply and
// the add) and dispatched at run time.

// This file includes itself once per target (Highway's foreach_target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ps_shm/init_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "core/base/random.h"
#include "ps_shm/init_kernels.h"

// Once, not per target.
#ifndef SHARDWILD_PS_SHM_INIT_KERNELS_ONCE
#define SHARDWILD_PS_SHM_INIT_KERNELS_ONCE
namespace shardwild {
namespace init_detail {

constexpr uint64_t kElementMul = 0xd1b54a32d192ed03ULL;
constexpr uint64_t kDrawMul = 0x9e3779b97f4a7c15ULL;

// The scalar expression, for the tails and for RowElementDraw.
inline float UniformScalar(uint64_t row_key, int64_t j, double a, double w) {
  const uint64_t elem = SplitMix64Mix(row_key ^ (static_cast<uint64_t>(j) * kElementMul));
  const double u = static_cast<double>(SplitMix64Mix(elem) >> 11) * 0x1.0p-53;
  return static_cast<float>(a + w * u);
}

}  // namespace init_detail
}  // namespace shardwild
#endif  // SHARDWILD_PS_SHM_INIT_KERNELS_ONCE

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// SplitMix64Mix on every lane (64-bit multiplies: native on AVX-512, from
// 32-bit ones elsewhere; both exact modulo 2^64).
template <class D, class V>
HWY_INLINE V MixLanes(D d, V x) {
  x = hn::Add(x, hn::Set(d, 0x9e3779b97f4a7c15ULL));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<30>(x)), hn::Set(d, 0xbf58476d1ce4e5b9ULL));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<27>(x)), hn::Set(d, 0x94d049bb133111ebULL));
  return hn::Xor(x, hn::ShiftRight<31>(x));
}

void UniformRowValuesImpl(uint64_t row_key, int64_t j0, int64_t n, double a, double w, float* out) {
  const hn::ScalableTag<uint64_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Repartition<double, decltype(du)> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const auto key = hn::Set(du, row_key);
  const auto element_mul = hn::Set(du, init_detail::kElementMul);
  const auto step = hn::Set(du, static_cast<uint64_t>(lanes));
  const auto scale = hn::Set(dd, 0x1.0p-53);
  const auto va = hn::Set(dd, a);
  const auto vw = hn::Set(dd, w);
  auto j = hn::Iota(du, static_cast<uint64_t>(j0));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto elem = MixLanes(du, hn::Xor(key, hn::Mul(j, element_mul)));
    const auto bits = hn::ShiftRight<11>(MixLanes(du, elem));  // < 2^53: exact as a double
    const auto u = hn::Mul(hn::ConvertTo(dd, hn::BitCast(di, bits)), scale);
    hn::StoreU(hn::DemoteTo(df, hn::Add(va, hn::Mul(vw, u))), df, out + i);
    j = hn::Add(j, step);
  }
  for (; i < n; ++i) out[i] = init_detail::UniformScalar(row_key, j0 + i, a, w);
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardwild {

HWY_EXPORT(UniformRowValuesImpl);

uint64_t RowElementDraw(uint64_t row_key, int64_t j, uint64_t n) {
  const uint64_t elem = SplitMix64Mix(row_key ^ (static_cast<uint64_t>(j) * init_detail::kElementMul));
  return SplitMix64Mix(elem + n * init_detail::kDrawMul);
}

void UniformRowValues(uint64_t row_key, int64_t j0, int64_t n, double a, double w, float* out) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(UniformRowValuesImpl)(row_key, j0, n, a, w, out);
}

}  // namespace shardwild
#endif  // HWY_ONCE
