// CRC32C (Castagnoli) checksums, as used by TFRecord, LevelDB, iSCSI and ext4.
//
// The polynomial is 0x1EDC6F41 (reflected: 0x82F63B78), with the usual
// pre- and post-inversion, so Crc32c("123456789") == 0xE3069283.
//
// Two implementations give identical results: one uses the SSE4.2 crc32
// instruction and is chosen at run time when the CPU has it (the build does
// not assume -msse4.2); the other is a portable slicing-by-8 table loop. The
// ...ForTest functions let tests compare the two.
//
// Masking (MaskCrc32c) is the TFRecord/LevelDB convention for storing a CRC
// next to the data it covers: computing the CRC of a string that contains
// embedded CRCs is otherwise prone to degenerate results.
//
// Thread safety: every function here is pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardwild {

// Returns the CRC32C of data[0, n) appended to a string whose CRC32C is `crc`:
// Crc32cExtend(Crc32c(a), b) == Crc32c(a + b). Crc32cExtend(0, d, n) ==
// Crc32c(d, n). `data` may be null when n == 0; it needs no alignment.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// Returns the CRC32C of data[0, n).
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

inline constexpr uint32_t kCrc32cMaskDelta = 0xa282ead8u;

// Returns a masked representation of `crc` (rotate right by 15, add a
// constant), as stored in TFRecord and LevelDB files.
inline constexpr uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kCrc32cMaskDelta;
}

// Inverse of MaskCrc32c.
inline constexpr uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - kCrc32cMaskDelta;
  return (rot >> 17) | (rot << 15);
}

// Test hooks: each implementation on its own. The hardware one must only be
// called when Crc32cHardwareAvailableForTest() is true.
uint32_t Crc32cExtendPortableForTest(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cExtendHardwareForTest(uint32_t crc, const void* data, size_t n);
bool Crc32cHardwareAvailableForTest();

}  // namespace shardwild
