// Initial values of embedding rows, written once with Google Highway and
// dispatched at run time (like the Hogwild kernels, whose
// ScopedHogwildKernelTarget restricts these too). A table's rows are drawn at
// creation on every init thread, so this is the inner loop of creating a
// large table.
#pragma once

#include <cstdint>

#include "core/base/random.h"

namespace shardwild {

// Multiplies an element's index before it is mixed with the row's key.
inline constexpr uint64_t kRowElementMul = 0xd1b54a32d192ed03ULL;

// Draw n of element j of the row keyed `row_key`: a pure function of its
// arguments (SplitMix64's finaliser twice), so every element is independent
// of every other and of the order or the instruction set that computes it.
inline uint64_t RowElementDraw(uint64_t row_key, int64_t j, uint64_t n) {
  const uint64_t elem = SplitMix64Mix(row_key ^ (static_cast<uint64_t>(j) * kRowElementMul));
  return SplitMix64Mix(elem + n * kSplitMix64Gamma);
}

// A draw as a uniform double in [0, 1) with 53 bits (exact).
inline double RowUnit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// out[i] = float(a + w * U(j0 + i)) for i in [0, n), where U(j) =
// (RowElementDraw(row_key, j, 0) >> 11) * 2^-53 is uniform in [0, 1) with 53
// bits and the product and the sum are separate double operations. The same
// bits on every dispatch target as the scalar expression.
void UniformRowValues(uint64_t row_key, int64_t j0, int64_t n, double a, double w, float* out);

}  // namespace shardwild
