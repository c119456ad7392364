#include "core/model/variable.h"

#include <algorithm>
#include <cmath>

#include "core/base/random.h"

namespace shardwild {
namespace {

// SplitMix64: a fixed, documented mixer so values never change with the
// standard library or absl versions.
inline uint64_t Mix(uint64_t x) { return SplitMix64Mix(x); }

uint64_t NameSeed(uint64_t seed, const std::string& name) {
  uint64_t h = Mix(seed);
  for (unsigned char c : name) h = Mix(h ^ c);
  return h;
}

}  // namespace

void FillInitialValue(const VariableSpec& spec, uint64_t seed, float* out) {
  const int64_t n = spec.size();
  switch (spec.init) {
    case InitKind::kZeros:
      std::fill(out, out + n, 0.0f);
      return;
    case InitKind::kGlorotUniform: {
      const double limit = std::sqrt(6.0 / static_cast<double>(std::max<int64_t>(1, spec.fan_in + spec.fan_out)));
      uint64_t state = NameSeed(seed, spec.name);
      for (int64_t i = 0; i < n; ++i) {
        state = Mix(state);
        // 24 random bits -> [0, 1).
        const double u = static_cast<double>(state >> 40) * (1.0 / 16777216.0);
        out[i] = static_cast<float>((2.0 * u - 1.0) * limit);
      }
      return;
    }
  }
}

}  // namespace shardwild
