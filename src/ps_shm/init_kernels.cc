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

// Mix32 (init_kernels.h) on every lane.
template <class D, class V>
HWY_INLINE V Mix32Lanes(D d, V x) {
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<16>(x)), hn::Set(d, kMix32Mul1));
  x = hn::Mul(hn::Xor(x, hn::ShiftRight<15>(x)), hn::Set(d, kMix32Mul2));
  return hn::Xor(x, hn::ShiftRight<16>(x));
}

// UniformRowValues' body, inlined into both kernels below.
HWY_INLINE void DrawRowValues(uint64_t row_key, int64_t j0, int64_t n, float a, float w, float* HWY_RESTRICT out) {
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const hn::RebindToFloat<decltype(du)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const uint32_t low = static_cast<uint32_t>(row_key);
  const auto high = hn::Set(du, static_cast<uint32_t>(row_key >> 32));
  // x = low + j * step for the lanes' j, advanced by lanes * step a vector
  // (all modulo 2^32, as the scalar expression).
  auto x = hn::Add(hn::Set(du, low + static_cast<uint32_t>(j0) * kRowLaneMul),
                   hn::Mul(hn::Iota(du, 0u), hn::Set(du, kRowLaneMul)));
  const auto advance = hn::Set(du, static_cast<uint32_t>(lanes) * kRowLaneMul);
  const auto scale = hn::Set(df, 0x1.0p-24f);
  const auto va = hn::Set(df, a);
  const auto vw = hn::Set(df, w);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto bits = hn::ShiftRight<8>(Mix32Lanes(du, hn::Xor(Mix32Lanes(du, x), high)));  // < 2^24: exact
    const auto u = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, bits)), scale);
    hn::StoreU(hn::Add(va, hn::Mul(vw, u)), df, out + i);
    x = hn::Add(x, advance);
  }
  for (; i < n; ++i) out[i] = RowUniformValue(row_key, j0 + i, a, w);
}

void UniformRowValuesImpl(uint64_t row_key, int64_t j0, int64_t n, float a, float w, float* out) {
  DrawRowValues(row_key, j0, n, a, w, out);
}

void UniformRowsValuesImpl(uint64_t base_key, uint64_t first_id, int64_t rows, int64_t dim, int64_t stride, float a,
                           float w, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    DrawRowValues(SplitMix64Mix(base_key ^ (first_id + static_cast<uint64_t>(r))), 0, dim, a, w, out + r * stride);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardwild {

HWY_EXPORT(UniformRowValuesImpl);
HWY_EXPORT(UniformRowsValuesImpl);

void UniformRowValues(uint64_t row_key, int64_t j0, int64_t n, float a, float w, float* out) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(UniformRowValuesImpl)(row_key, j0, n, a, w, out);
}

void UniformRowsValues(uint64_t base_key, uint64_t first_id, int64_t rows, int64_t dim, int64_t stride, float a,
                       float w, float* out) {
  if (rows > 0 && dim > 0) HWY_DYNAMIC_DISPATCH(UniformRowsValuesImpl)(base_key, first_id, rows, dim, stride, a, w, out);
}

}  // namespace shardwild
#endif  // HWY_ONCE
