// Kernels of the data phase: private buffers only (no parameter memory, no
// races), written once with Google Highway and dispatched at run time to the
// best instruction set of the CPU, like the Hogwild kernels (whose
// ScopedHogwildKernelTarget restricts these too: the dispatch is one
// process-wide setting).
#pragma once

#include <cstdint>

namespace shardwild {

// dst[i] = static_cast<float>(src[i]) / 255.0f for i in [0, n): IEEE division
// on every target, so the floats are exactly those of the scalar expression
// (the IDX reader's pixels; PackedRecords keeps them as these bytes).
void BytesToUnitFloats(const uint8_t* src, float* dst, int64_t n);

// A weight kept as a whole number k of units 10^-d (PackedRecords::WeightCode
// in core/model/model.h): k * unit in double, rounded once to float, the
// nearest float to k / 10^d (as a parser gives) for the k and d that code
// weights. k < 2^31, so the conversion is the signed one every target has.
inline float CodedWeight(uint32_t k, double unit) {
  return static_cast<float>(static_cast<double>(static_cast<int32_t>(k)) * unit);
}

// The entries of n packed records whose weights are coded in their ids'
// words (word = id | k << id_bits, 1 <= id_bits <= 31): record j's count[j]
// words, from from[j], into ids[to[j] + i] = word & (2^id_bits - 1) (widened)
// and weights[to[j] + i] = CodedWeight(word >> id_bits, unit), bit for bit
// on every target. Reads and writes no entry past a record's count (a
// record's last vector overlaps the one before, where its count is not a
// whole number of vectors).
void DecodeCodedEntries(const uint32_t* const* from, const int64_t* count, const int64_t* to, int64_t n, int id_bits,
                        double unit, uint64_t* ids, float* weights);

}  // namespace shardwild
