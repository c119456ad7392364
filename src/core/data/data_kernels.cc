// The data kernels (data_kernels.h), compiled for every x86 target Highway
// can reach (HWY_COMPILE_ALL_ATTAINABLE, set in CMakeLists.txt) and
// dispatched at run time.

// This file includes itself once per target (Highway's foreach_target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "core/data/data_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "core/data/data_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void BytesToUnitFloatsImpl(const uint8_t* src, float* dst, int64_t n) {
  // Whole vectors of floats, each from a quarter-width vector of bytes.
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto v255 = hn::Set(df, 255.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto bytes = hn::LoadU(du8, src + i);
    hn::StoreU(hn::Div(hn::ConvertTo(df, hn::PromoteTo(di, bytes)), v255), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]) / 255.0f;
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shardwild {

HWY_EXPORT(BytesToUnitFloatsImpl);

void BytesToUnitFloats(const uint8_t* src, float* dst, int64_t n) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(BytesToUnitFloatsImpl)(src, dst, n);
}

}  // namespace shardwild
#endif  // HWY_ONCE
