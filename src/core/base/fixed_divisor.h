// Division by a divisor fixed ahead (a store's shard count), without a
// division instruction: a static table's row `id` lives on shard id % S as
// its local row id / S, and the store maps every id of a batch so, at each
// pull and push. A 64-bit `div` takes tens of cycles and ran once or twice
// an id (sparse_logreg.yaml with ps.shards 2: the `div`s held most of the
// samples of ShmParamStore::GroupIds and RowAddresses in a `perf` profile).
//
// Thread safety: immutable after construction.
#pragma once

#include <bit>
#include <cstdint>

namespace shardwild {

// x / d and x % d for a fixed d in [1, kMaxDivisor] and every x below
// kNumeratorLimit. A power of two shifts. Any other d multiplies by
// m = ceil(2^64 / d) and keeps the high 64 bits: x * m / 2^64 = x / d +
// x * (m - 2^64 / d) / 2^64, and the second term is below x / 2^64 <
// 2^-12 <= 1 / d, while x / d is at least 1 / d below the next whole
// number, so the floor is x / d's (the tests check every d with ids at and
// around its multiples, the largest ids and random ones).
class FixedDivisor {
 public:
  static constexpr uint64_t kMaxDivisor = uint64_t{1} << 12;  // ps.shards' limit, 4096
  // A static table's ids: each of its shards holds at most 2^40 rows
  // (EmbeddingTable), so its ids are below kMaxDivisor * 2^40.
  static constexpr uint64_t kNumeratorLimit = uint64_t{1} << 52;

  // `divisor` in [1, kMaxDivisor] (not checked here: the store validates
  // its shard count first).
  explicit FixedDivisor(uint32_t divisor = 1)
      : divisor_(divisor),
        shift_(std::has_single_bit(divisor) ? std::countr_zero(divisor) : -1),
        magic_(shift_ >= 0 ? 0 : ~uint64_t{0} / divisor + 1) {}

  uint64_t divisor() const { return divisor_; }
  // x / divisor, for x < kNumeratorLimit.
  uint64_t Quotient(uint64_t x) const {
    if (shift_ >= 0) return x >> shift_;
    return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * magic_) >> 64);
  }
  // x % divisor, given x's quotient.
  uint64_t Remainder(uint64_t x, uint64_t quotient) const { return x - quotient * divisor_; }

 private:
  uint64_t divisor_;
  int shift_;       // log2(divisor) for a power of two, else -1
  uint64_t magic_;  // ceil(2^64 / divisor) where shift_ is -1
};

}  // namespace shardwild
