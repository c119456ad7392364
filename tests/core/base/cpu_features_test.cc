// DetectCpuFeatures against the kernel's own view, /proc/cpuinfo's flags
// (which the kernel clears for a feature whose state it does not enable).
#include "core/base/cpu_features.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::set<std::string> CpuinfoFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(CpuFeaturesTest, AgreesWithProcCpuinfo) {
  const std::set<std::string> flags = CpuinfoFlags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const CpuFeatures f = DetectCpuFeatures();
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(f.amx_tile, flags.count("amx_tile") == 1);
  EXPECT_EQ(f.amx_bf16, flags.count("amx_bf16") == 1);
  EXPECT_EQ(f.bf16(), flags.count("avx512_bf16") == 1 || flags.count("amx_bf16") == 1);
}

TEST(CpuFeaturesTest, NamesInOrder) {
  CpuFeatures f;
  EXPECT_TRUE(f.Names().empty());
  f.avx2 = f.avx512_bf16 = f.amx_bf16 = true;
  EXPECT_EQ(f.Names(), (std::vector<std::string>{"AVX2", "AVX512_BF16", "AMX_BF16"}));
  f.avx512f = f.amx_tile = true;
  EXPECT_EQ(f.Names(), (std::vector<std::string>{"AVX2", "AVX-512", "AVX512_BF16", "AMX_TILE", "AMX_BF16"}));
}

}  // namespace
}  // namespace shardwild
