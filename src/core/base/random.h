// SplitMix64 (Steele, Lea and Flood, 2014), the one fixed mixer and
// generator the project uses wherever values must never change with the
// standard library or abseil: initial parameter values, table rows, epoch
// shuffles, task orders, dropout masks, generated data.
//
// Thread safety: pure functions; a state belongs to its caller.
#pragma once

#include <cstdint>

namespace shardwild {

// SplitMix64's constants: the step (the golden gamma) and the finaliser's
// two multipliers (also used by the vectorised copy in ps_shm/init_kernels).
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;
inline constexpr uint64_t kSplitMix64Mul1 = 0xbf58476d1ce4e5b9ULL;
inline constexpr uint64_t kSplitMix64Mul2 = 0x94d049bb133111ebULL;

// SplitMix64's output for the state x (its finaliser after one step): a
// bijective mix of 64 bits.
inline uint64_t SplitMix64Mix(uint64_t x) {
  x += kSplitMix64Gamma;
  x = (x ^ (x >> 30)) * kSplitMix64Mul1;
  x = (x ^ (x >> 27)) * kSplitMix64Mul2;
  return x ^ (x >> 31);
}

// The next value of the SplitMix64 stream `state` (advanced).
inline uint64_t SplitMix64(uint64_t& state) {
  const uint64_t out = SplitMix64Mix(state);
  state += kSplitMix64Gamma;
  return out;
}

}  // namespace shardwild
