// Writes the seed corpus of safetensors_fuzz with SafetensorsWriter:
//   safetensors_corpus_gen tests/fuzz/corpus/safetensors
// Valid files (seed-*), then broken copies of them (broken-*). Each < 2 KB.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/io/safetensors.h"

namespace {

bool WriteRaw(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  return std::fclose(f) == 0 && ok;
}

std::string ReadRaw(const std::string& path) {
  std::string out;
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using shardwild::SafetensorsDtype;
  using shardwild::SafetensorsWriter;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::vector<float> w = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.125f};
  const std::vector<int64_t> steps = {1200, -3};
  const std::vector<double> d = {1.5};
  const std::vector<uint8_t> mask = {1, 0, 1};
  const std::vector<uint16_t> half = {0x3c00, 0xc000};
  bool ok = true;
  {  // two tensors and metadata, as a checkpoint file
    SafetensorsWriter wr;
    ok &= wr.AddTensor("steps", {2}, absl::MakeConstSpan(steps)).ok();
    ok &= wr.AddTensor("dense/w", {2, 3}, absl::MakeConstSpan(w)).ok();
    ok &= wr.SetMetadata("step", "1200").ok();
    ok &= wr.SetMetadata("shard", "0").ok();
    ok &= wr.Write(dir + "/seed-checkpoint").ok();
  }
  {  // a scalar, a zero-sized dimension, bool, f16 bytes and f64
    SafetensorsWriter wr;
    ok &= wr.AddTensor("scalar", {}, absl::MakeConstSpan(d)).ok();
    ok &= wr.AddTensor("empty", {0, 4}, absl::Span<const float>()).ok();
    ok &= wr.AddTensor("mask", SafetensorsDtype::kBool, {3}, absl::MakeConstSpan(mask)).ok();
    ok &= wr.AddTensor("half", SafetensorsDtype::kF16, {2},
                       absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(half.data()), 4))
              .ok();
    ok &= wr.Write(dir + "/seed-dtypes").ok();
  }
  {  // no tensors, metadata only
    SafetensorsWriter wr;
    ok &= wr.SetMetadata("note", "empty").ok();
    ok &= wr.Write(dir + "/seed-metadata-only").ok();
  }
  if (!ok) {
    std::fprintf(stderr, "writing the valid seeds failed\n");
    return 1;
  }
  // Broken copies of the checkpoint seed.
  const std::string good = ReadRaw(dir + "/seed-checkpoint");
  std::string s = good;
  s.resize(s.size() - 5);  // truncated data region
  ok &= WriteRaw(dir + "/broken-truncated", s);
  s = good;
  s[0] = static_cast<char>(0xff);  // header length beyond the file
  ok &= WriteRaw(dir + "/broken-header-length", s);
  s = good;
  if (const size_t p = s.find("\"data_offsets\":[0,"); p != std::string::npos) s[p + 16] = '8';  // gap at the start
  ok &= WriteRaw(dir + "/broken-offsets", s);
  s = good;
  if (const size_t p = s.find("F32"); p != std::string::npos) s.replace(p, 3, "F64");  // size disagrees with dtype
  ok &= WriteRaw(dir + "/broken-dtype", s);
  return ok ? 0 : 1;
}
