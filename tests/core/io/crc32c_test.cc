#include "core/io/crc32c.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

// A bit-at-a-time reference, independent of both implementations.
uint32_t ReferenceCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Every implementation under test: the dispatcher and both paths.
using CrcFn = uint32_t (*)(uint32_t, const void*, size_t);
struct Impl {
  const char* name;
  CrcFn fn;
};
std::vector<Impl> Implementations() {
  std::vector<Impl> impls = {{"dispatch", &Crc32cExtend}, {"portable", &Crc32cExtendPortableForTest}};
  if (Crc32cHardwareAvailableForTest()) impls.push_back({"sse4.2", &Crc32cExtendHardwareForTest});
  return impls;
}

TEST(Crc32cTest, KnownVectors) {
  const std::string digits = "123456789";
  const std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xff);
  std::vector<uint8_t> ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<uint8_t>(i);
    descending[i] = static_cast<uint8_t>(31 - i);
  }
  const std::string fox = "The quick brown fox jumps over the lazy dog";
  for (const Impl& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    EXPECT_EQ(impl.fn(0, digits.data(), digits.size()), 0xE3069283u);
    // RFC 3720 (iSCSI) B.4 test vectors.
    EXPECT_EQ(impl.fn(0, zeros.data(), zeros.size()), 0x8A9136AAu);
    EXPECT_EQ(impl.fn(0, ones.data(), ones.size()), 0x62A8AB43u);
    EXPECT_EQ(impl.fn(0, ascending.data(), ascending.size()), 0x46DD794Eu);
    EXPECT_EQ(impl.fn(0, descending.data(), descending.size()), 0x113FDB5Cu);
    EXPECT_EQ(impl.fn(0, "a", 1), 0xC1D04330u);
    EXPECT_EQ(impl.fn(0, fox.data(), fox.size()), 0x22620404u);
    EXPECT_EQ(impl.fn(0, nullptr, 0), 0u);
    EXPECT_EQ(impl.fn(0x12345678u, nullptr, 0), 0x12345678u);
  }
  EXPECT_EQ(Crc32c(digits.data(), digits.size()), 0xE3069283u);
}

TEST(Crc32cTest, UnalignedStartsAndAllShortLengthsMatchReference) {
  const std::vector<uint8_t> buf = RandomBytes(70 + 16, 1);
  for (const Impl& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    for (size_t start = 0; start < 16; ++start) {
      for (size_t len = 0; len <= 70; ++len) {
        const uint8_t* p = buf.data() + start;
        ASSERT_EQ(impl.fn(0, p, len), ReferenceCrc32c(p, len)) << "start " << start << " len " << len;
      }
    }
  }
}

TEST(Crc32cTest, PortableAndHardwareAgreeOnLargeBuffers) {
  if (!Crc32cHardwareAvailableForTest()) GTEST_SKIP() << "CPU has no SSE4.2";
  const std::vector<uint8_t> buf = RandomBytes((1 << 20) + 13, 2);
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t len : {size_t{1000}, size_t{4096}, size_t{65537}, buf.size() - 7}) {
      EXPECT_EQ(Crc32cExtendPortableForTest(0, buf.data() + start, len),
                Crc32cExtendHardwareForTest(0, buf.data() + start, len))
          << "start " << start << " len " << len;
    }
  }
  EXPECT_EQ(Crc32cExtendPortableForTest(0, buf.data(), 5000), ReferenceCrc32c(buf.data(), 5000));
}

// The hardware path takes 3 x 8,192 and then 3 x 256 bytes at a time as
// three chains joined after each block: every length around those edges,
// from unaligned starts and from a state other than 0.
TEST(Crc32cTest, HardwareChainsJoinAtEveryBlockEdge) {
  if (!Crc32cHardwareAvailableForTest()) GTEST_SKIP() << "CPU has no SSE4.2";
  const std::vector<uint8_t> buf = RandomBytes(3 * (3 * 8192) + 3 * 256 + 64, 6);
  std::vector<size_t> lengths;
  for (size_t edge : {size_t{3 * 256}, size_t{3 * 8192}, size_t{3 * 8192 + 3 * 256}, size_t{2 * 3 * 8192},
                      size_t{3 * 3 * 8192 + 3 * 256}}) {
    for (size_t d : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{255}, size_t{256}}) {
      lengths.push_back(edge + d);
      if (d <= edge) lengths.push_back(edge - d);
    }
  }
  for (size_t start : {0, 1, 5}) {
    for (size_t len : lengths) {
      if (start + len > buf.size()) continue;
      for (uint32_t from : {0u, 0xDEADBEEFu}) {
        ASSERT_EQ(Crc32cExtendHardwareForTest(from, buf.data() + start, len),
                  Crc32cExtendPortableForTest(from, buf.data() + start, len))
            << "start " << start << " len " << len << " from " << from;
      }
    }
  }
  EXPECT_EQ(Crc32cExtendHardwareForTest(0, buf.data(), 3 * 8192 + 5), ReferenceCrc32c(buf.data(), 3 * 8192 + 5));
}

TEST(Crc32cTest, ExtendInPiecesEqualsWhole) {
  const std::vector<uint8_t> buf = RandomBytes(1000, 3);
  const uint32_t whole = ReferenceCrc32c(buf.data(), buf.size());
  std::mt19937 rng(4);
  for (const Impl& impl : Implementations()) {
    SCOPED_TRACE(impl.name);
    for (int trial = 0; trial < 50; ++trial) {
      uint32_t crc = 0;
      size_t pos = 0;
      while (pos < buf.size()) {
        const size_t piece = std::min<size_t>(rng() % 40, buf.size() - pos);  // includes empty pieces
        crc = impl.fn(crc, buf.data() + pos, piece);
        pos += piece;
      }
      ASSERT_EQ(crc, whole) << "trial " << trial;
    }
    // "123456789" split at every point.
    const char* digits = "123456789";
    for (size_t split = 0; split <= 9; ++split) {
      EXPECT_EQ(impl.fn(impl.fn(0, digits, split), digits + split, 9 - split), 0xE3069283u) << split;
    }
  }
}

TEST(Crc32cTest, MaskRoundTripsAndMatchesTfRecordConvention) {
  EXPECT_EQ(MaskCrc32c(0xE3069283u), 0xC78AB0E5u);  // computed independently in Python
  EXPECT_EQ(UnmaskCrc32c(0xC78AB0E5u), 0xE3069283u);
  std::mt19937 rng(5);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t crc = rng();
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc);
  }
  EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(0)), 0u);
  EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(0xffffffffu)), 0xffffffffu);
}

}  // namespace
}  // namespace shardwild
