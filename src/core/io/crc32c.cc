#include "core/io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SW_CRC32C_HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#else
#define SW_CRC32C_HAVE_SSE42_PATH 0
#endif

namespace shardwild {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected 0x1EDC6F41

// kTables[0] is the classic byte-at-a-time table; kTables[k][b] is the CRC
// register after feeding byte b followed by k zero bytes, which lets the
// slicing loop fold 8 input bytes with 8 independent lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

// Little-endian loads from any alignment, independent of the host's byte order.
inline uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  uint32_t c = ~crc;
  // Single bytes up to an 8-byte boundary, so the main loop's loads are aligned.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  while (n >= 8) {
    const uint32_t lo = LoadLe32(p) ^ c;
    const uint32_t hi = LoadLe32(p + 4);
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^
        kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    --n;
  }
  return ~c;
}

#if SW_CRC32C_HAVE_SSE42_PATH
// The crc32 instruction takes 3 cycles and can start one a cycle, so one
// chain of them runs at a third of its rate (9 GB/s on the Zen 5 VM, where
// one thread reads memory at 24 GB/s). Long buffers are taken three blocks
// at a time, one chain each, and the chains joined: the register is linear
// over GF(2) in its state and its data, so the state after blocks A B C
// from state r is Z(Z(crc(r, A)) ^ crc(0, B)) ^ crc(0, C), where Z is the
// effect of a block's length of zero bytes on a state.
//
// Z for `len` zero bytes (a multiple of 8) as four byte-indexed tables: the
// images of the 32 single bits of a state, XORed by the bits each byte has.
struct ZeroShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) ZeroShift MakeZeroShift(size_t len) {
  std::array<uint32_t, 32> image{};
  for (int bit = 0; bit < 32; ++bit) {
    uint64_t c = uint64_t{1} << bit;
    for (size_t k = 0; k < len / 8; ++k) c = _mm_crc32_u64(c, 0);
    image[bit] = static_cast<uint32_t>(c);
  }
  ZeroShift z;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int j = 0; j < 8; ++j) {
        if ((b >> j) & 1) v ^= image[8 * k + j];
      }
      z.t[k][b] = v;
    }
  }
  return z;
}

// Blocks of `len` bytes (a multiple of 8), three at a time while 3 * len
// bytes are left, from state *c.
template <size_t len>
__attribute__((target("sse4.2"))) void ThreeChains(uint64_t* c, const uint8_t** p, size_t* n, const ZeroShift& shift) {
  while (*n >= 3 * len) {
    const uint8_t* a = *p;
    const uint8_t* const end = a + len;
    uint64_t c0 = *c, c1 = 0, c2 = 0;
    do {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, a, 8);
      std::memcpy(&v1, a + len, 8);
      std::memcpy(&v2, a + 2 * len, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
      a += 8;
    } while (a < end);
    c0 = shift(static_cast<uint32_t>(c0)) ^ c1;
    *c = shift(static_cast<uint32_t>(c0)) ^ c2;
    *p += 3 * len;
    *n -= 3 * len;
  }
}

constexpr size_t kLongBlock = 8192;  // three are 24 KiB: within an L1
constexpr size_t kShortBlock = 256;

// Compiled for SSE4.2 on its own (the target attribute), so the rest of the
// build stays portable; only called after __builtin_cpu_supports("sse4.2").
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ZeroShift long_shift = MakeZeroShift(kLongBlock);
  static const ZeroShift short_shift = MakeZeroShift(kShortBlock);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  ThreeChains<kLongBlock>(&c, &p, &n, long_shift);
  ThreeChains<kShortBlock>(&c, &p, &n, short_shift);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));  // aligned by now; memcpy keeps UBSan quiet
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}

bool HardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}
#else
bool HardwareAvailable() { return false; }
#endif

using ExtendFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

ExtendFn ChooseExtend() {
#if SW_CRC32C_HAVE_SSE42_PATH
  if (HardwareAvailable()) return &ExtendSse42;
#endif
  return &ExtendPortable;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const ExtendFn extend = ChooseExtend();  // decided once, thread-safe
  if (n == 0) return crc;
  return extend(crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtendPortableForTest(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;
  return ExtendPortable(crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtendHardwareForTest(uint32_t crc, const void* data, size_t n) {
#if SW_CRC32C_HAVE_SSE42_PATH
  if (n == 0) return crc;
  return ExtendSse42(crc, static_cast<const uint8_t*>(data), n);
#else
  return Crc32cExtendPortableForTest(crc, data, n);
#endif
}

bool Crc32cHardwareAvailableForTest() { return HardwareAvailable(); }

}  // namespace shardwild
