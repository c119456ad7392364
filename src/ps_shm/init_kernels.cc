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

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// SplitMix64Mix on every lane (64-bit multiplies: native on AVX-512, from
// 32-bit ones elsewhere; both exact modulo 2^64).
template <class D, class V>
HWY_INLINE V MixLanes(D d, V x) {
  x = hn::Add(x, hn::Set(d, kSplitMix64Gamma));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<30>(x)), hn::Set(d, kSplitMix64Mul1));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<27>(x)), hn::Set(d, kSplitMix64Mul2));
  return hn::Xor(x, hn::ShiftRight<31>(x));
}

void UniformRowValuesImpl(uint64_t row_key, int64_t j0, int64_t n, double a, double w, float* out) {
  const hn::ScalableTag<uint64_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::Repartition<double, decltype(du)> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const auto key = hn::Set(du, row_key);
  const auto element_mul = hn::Set(du, kRowElementMul);
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
  // The tail: the scalar expression (separate multiply and add, as above).
  for (; i < n; ++i) out[i] = static_cast<float>(a + w * RowUnit(RowElementDraw(row_key, j0 + i, 0)));
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardwild {

HWY_EXPORT(UniformRowValuesImpl);

void UniformRowValues(uint64_t row_key, int64_t j0, int64_t n, double a, double w, float* out) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(UniformRowValuesImpl)(row_key, j0, n, a, w, out);
}

}  // namespace shardwild
#endif  // HWY_ONCE
