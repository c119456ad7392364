// CacheLinesOf, the lines PrefetchLines asks for (core/base/prefetch.h); HugePageAllocator
// (core/base/huge_page_allocator.h).
#include <cstdint>
#include <vector>

#include "core/base/huge_page_allocator.h"
#include "core/base/prefetch.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(CacheLinesTest, CountsEveryLineTheRangeTouches) {
  // On a line's start.
  EXPECT_EQ(CacheLinesOf(0x1000, 64).count, 1u);
  EXPECT_EQ(CacheLinesOf(0x1000, 65).count, 2u);
  EXPECT_EQ(CacheLinesOf(0x1000, 128).count, 2u);
  // Off it: 64 bytes from offset 40 end in the next line, which a loop of
  // 64-byte strides from `begin` (the old PrefetchLines) missed.
  EXPECT_EQ(CacheLinesOf(0x1000 + 40, 64).count, 2u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 40, 24).count, 1u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 40, 25).count, 2u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 63, 1).count, 1u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 63, 2).count, 2u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 8, 144).count, 3u);  // a packed text record's block: 18 words
  EXPECT_EQ(CacheLinesOf(0x1000 + 56, 144).count, 4u);
  EXPECT_EQ(CacheLinesOf(0x1000 + 40, 64).first, uintptr_t{0x1000});
  EXPECT_EQ(CacheLinesOf(0x1000 + 40, 0).count, 0u);
  // Against a byte-by-byte count, every offset and length up to 3 lines.
  for (uintptr_t off = 0; off < 64; ++off) {
    for (size_t bytes = 0; bytes <= 192; ++bytes) {
      size_t want = 0;
      uintptr_t line = ~uintptr_t{0};
      for (size_t i = 0; i < bytes; ++i) {
        if (((0x4000 + off + i) & ~uintptr_t{63}) != line) {
          line = (0x4000 + off + i) & ~uintptr_t{63};
          ++want;
        }
      }
      EXPECT_EQ(CacheLinesOf(0x4000 + off, bytes).count, want) << off << " " << bytes;
    }
  }
}

TEST(HugePageAllocatorTest, LargeBlocksStartOnAHugePage) {
  HugePageVector<uint64_t> big(kHugePageMinBytes / sizeof(uint64_t) + 3, 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(big.back(), 5u);
  big.push_back(9);  // regrows through the allocator
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(big.back(), 9u);
  EXPECT_EQ(big.front(), 5u);
}

TEST(HugePageAllocatorTest, SmallBlocksAreOrdinary) {
  EXPECT_FALSE(OnHugePages(kHugePageMinBytes - 1));
  EXPECT_TRUE(OnHugePages(kHugePageMinBytes));
  HugePageVector<int32_t> small = {1, 2, 3};
  small.resize(1000, 4);
  EXPECT_EQ(small[2], 3);
  EXPECT_EQ(small[999], 4);
  HugePageVector<uint8_t> empty;
  EXPECT_TRUE(empty.empty());
  HugePageVector<uint8_t> copy(small.size());
  for (size_t i = 0; i < copy.size(); ++i) copy[i] = static_cast<uint8_t>(small[i]);
  EXPECT_EQ(copy[999], 4);
}

}  // namespace
}  // namespace shardwild
