// The data kernels on every dispatch target against their scalar expression,
// bit for bit.
#include "core/data/data_kernels.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/model/hogwild_kernels.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

TEST(DataKernelsTest, BytesToUnitFloatsIsTheScalarDivisionOnEveryTarget) {
  // Every byte value, at every offset of a vector (lengths around the widest
  // vector and the IDX image width), with a sentinel past the end.
  std::vector<uint8_t> src(1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i * 7 + i / 256) & 0xFF);
  for (const std::string& target : HogwildKernelTargets()) {
    SCOPED_TRACE(target);
    ScopedHogwildKernelTarget scoped(target);
    ASSERT_TRUE(scoped.ok());
    for (int64_t n : {0, 1, 3, 15, 16, 17, 31, 33, 64, 65, 784, 1000}) {
      for (int64_t offset : {0, 1, 5}) {
        std::vector<float> out(n + 1, -1.0f);
        BytesToUnitFloats(src.data() + offset, out.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          const float want = static_cast<float>(src[offset + i]) / 255.0f;
          ASSERT_EQ(std::memcmp(&out[i], &want, sizeof(float)), 0)
              << "n " << n << " offset " << offset << " i " << i << ": " << out[i] << " != " << want;
        }
        EXPECT_EQ(out[n], -1.0f) << "wrote past n = " << n;
      }
    }
  }
}

TEST(DataKernelsTest, EveryByteValueMapsToItsDivision) {
  std::vector<uint8_t> all(256);
  for (int v = 0; v < 256; ++v) all[v] = static_cast<uint8_t>(v);
  std::vector<float> out(256);
  BytesToUnitFloats(all.data(), out.data(), 256);
  for (int v = 0; v < 256; ++v) EXPECT_EQ(out[v], static_cast<float>(v) / 255.0f) << v;
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[255], 1.0f);
}

}  // namespace
}  // namespace shardwild
