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

}  // namespace shardwild
