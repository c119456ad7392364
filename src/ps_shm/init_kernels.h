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

// The uniform initialiser's 32-bit draws: Mix32 is Chris Wellons'
// "lowbias32" finaliser (two 32-bit multiplies), a bijection of 32-bit words.
inline constexpr uint32_t kRowLaneMul = 0x9e3779b9u;  // the element index's Weyl step
inline constexpr uint32_t kMix32Mul1 = 0x7feb352du;
inline constexpr uint32_t kMix32Mul2 = 0x846ca68bu;

inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= kMix32Mul1;
  x ^= x >> 15;
  x *= kMix32Mul2;
  return x ^ (x >> 16);
}

// The 32-bit draw of element j of the row keyed `row_key`: the key's low
// word plus j times a Weyl step (j modulo 2^32), mixed, XORed with the key's
// high word, mixed again. A pure function of (row_key, j), so independent of
// the order and the instruction set that computes it. (Two rows draw
// shifted copies of one sequence only where their keys' high words are
// equal and their low words a small multiple of the step apart: for keys
// that are 64-bit hashes, RowKey's, a chance of about 2^-59 a pair.)
inline uint32_t RowUniformDraw(uint64_t row_key, int64_t j) {
  const uint32_t x = static_cast<uint32_t>(row_key) + static_cast<uint32_t>(j) * kRowLaneMul;
  return Mix32(Mix32(x) ^ static_cast<uint32_t>(row_key >> 32));
}

// The uniform initial value of element j: a + w * U(j) in float arithmetic
// (a separate multiply and add), where U(j) = (RowUniformDraw(row_key, j) >>
// 8) * 2^-24 is uniform in [0, 1) with 24 bits (exact as a float).
inline float RowUniformValue(uint64_t row_key, int64_t j, float a, float w) {
  const float u = static_cast<float>(RowUniformDraw(row_key, j) >> 8) * 0x1.0p-24f;
  const float product = w * u;
  return a + product;
}

// out[i] = RowUniformValue(row_key, j0 + i, a, w) for i in [0, n), in
// 32-bit lanes: the same bits on every dispatch target as the scalar
// expression. (The draws were SplitMix64's finaliser twice,
// RowElementDraw, with the sum in double: five 64-bit multiplies a value,
// which AVX2 builds from 32-bit ones, and a 64-bit conversion it lacks;
// init_benchmark, 2-core EPYC VM, dim 16 rows over 256 MiB: 0.23G values/s
// against 3.05G/s for a plain fill of the same bytes.)
void UniformRowValues(uint64_t row_key, int64_t j0, int64_t n, float a, float w, float* out);

// UniformRowValues of elements [0, dim) of `rows` rows in one dispatched
// call, bit for bit what a call a row gives: row r is keyed
// SplitMix64Mix(base_key ^ (first_id + r)) (RowKey's last step, the
// table's base key and the id) and written from out + r * stride floats
// (stride >= dim; the floats between rows are left as they are). A static
// table's creation draws its rows this way: a call, a dispatch and a key
// setup a row took more than the draws of a row of 16 (init_benchmark).
void UniformRowsValues(uint64_t base_key, uint64_t first_id, int64_t rows, int64_t dim, int64_t stride, float a,
                       float w, float* out);

}  // namespace shardwild
