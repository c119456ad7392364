// The instruction sets this CPU offers and the operating system has enabled,
// read from CPUID and XCR0: what `shardwild topology` reports and what the
// bf16 paths need. x86-64 only; elsewhere every flag is false. Also the size
// of a core's L2 cache.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace shardwild {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512f = false;       // AVX-512 Foundation
  bool avx512_bf16 = false;   // VCVTNE2PS2BF16, VDPBF16PS
  bool amx_tile = false;      // AMX tiles (Sapphire Rapids and later)
  bool amx_bf16 = false;      // AMX bf16 tile multiplies

  // bf16 instructions of either kind: what a bf16 matmul needs to run at
  // bf16 speed rather than be emulated.
  bool bf16() const { return avx512_bf16 || amx_bf16; }

  // The names of those present, in that order ("AVX2", "AVX-512",
  // "AVX512_BF16", "AMX_TILE", "AMX_BF16").
  std::vector<std::string> Names() const {
    std::vector<std::string> n;
    if (avx2) n.push_back("AVX2");
    if (avx512f) n.push_back("AVX-512");
    if (avx512_bf16) n.push_back("AVX512_BF16");
    if (amx_tile) n.push_back("AMX_TILE");
    if (amx_bf16) n.push_back("AMX_BF16");
    return n;
  }
};

// CPUID says what the CPU has; XCR0 what the kernel saves and restores
// (a feature whose registers it does not save cannot be used): AVX needs the
// SSE and AVX state (bits 1, 2), AVX-512 the opmask and upper registers
// (5-7), AMX the tile configuration and data (17, 18).
inline CpuFeatures DetectCpuFeatures() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xE0) == 0xE0;
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned leaf7_max = a;
  f.avx2 = os_avx && ((b >> 5) & 1);
  f.avx512f = os_avx512 && ((b >> 16) & 1);
  f.amx_bf16 = os_amx && ((d >> 22) & 1);
  f.amx_tile = os_amx && ((d >> 24) & 1);
  if (leaf7_max >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = f.avx512f && ((a >> 5) & 1);
  }
#endif
  return f;
}

// One core's L2 cache in bytes, as glibc's sysconf tells it (from CPUID);
// 1 MiB where it cannot be told.
inline size_t L2CacheBytes() {
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? static_cast<size_t>(bytes) : size_t{1} << 20;
}

}  // namespace shardwild
