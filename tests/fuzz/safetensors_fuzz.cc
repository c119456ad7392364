// libFuzzer target: a safetensors file (checkpoint tensors) read from
// untrusted bytes. SafetensorsReader::Open must reject every malformed file
// with a Status; for a file it accepts, every tensor's bytes (Get, and GetAs
// of its dtype) and the metadata must be readable without leaving the
// mapping. Build with -DSHARDWILD_FUZZ=ON (clang), then run e.g.
//   build-asan/tests/fuzz/safetensors_fuzz tests/fuzz/corpus/safetensors -max_total_time=60
// Seeds: tests/fuzz/corpus/safetensors, written by safetensors_corpus_gen
// (SafetensorsWriter) plus a few broken files.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/io/safetensors.h"

namespace shardwild {
namespace {

// Reads every byte of `bytes` so that ASan sees any access outside the mapping.
uint64_t Touch(absl::Span<const uint8_t> bytes) {
  uint64_t sum = 0;
  for (uint8_t b : bytes) sum += b;
  return sum;
}

template <typename T>
uint64_t TouchAs(const SafetensorsReader& r, const std::string& name) {
  auto span = r.GetAs<T>(name);
  if (!span.ok()) return 0;
  return Touch(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(span->data()), span->size() * sizeof(T)));
}

uint64_t TouchTyped(const SafetensorsReader& r, const std::string& name, SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32: return TouchAs<float>(r, name);
    case SafetensorsDtype::kF64: return TouchAs<double>(r, name);
    case SafetensorsDtype::kI64: return TouchAs<int64_t>(r, name);
    case SafetensorsDtype::kU64: return TouchAs<uint64_t>(r, name);
    case SafetensorsDtype::kI32: return TouchAs<int32_t>(r, name);
    case SafetensorsDtype::kU32: return TouchAs<uint32_t>(r, name);
    case SafetensorsDtype::kI16: return TouchAs<int16_t>(r, name);
    case SafetensorsDtype::kU16: return TouchAs<uint16_t>(r, name);
    case SafetensorsDtype::kI8: return TouchAs<int8_t>(r, name);
    case SafetensorsDtype::kU8: return TouchAs<uint8_t>(r, name);
    default: return TouchAs<float>(r, name);  // the dtype mismatch path
  }
}

const std::string& TempPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") + "/shardwild_safetensors_fuzz." +
           std::to_string(getpid()) + ".safetensors";
  }();
  return path;
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardwild;
  const std::string& path = TempPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto reader = SafetensorsReader::Open(path);
  if (reader.ok()) {
    const SafetensorsReader& r = **reader;
    uint64_t sum = 0;
    for (const std::string& name : r.names()) {
      auto t = r.Get(name);
      if (!t.ok()) std::abort();  // names() lists only tensors Get finds
      if (t->data.size() != static_cast<uint64_t>(t->num_elements()) * SafetensorsDtypeSize(t->dtype)) std::abort();
      sum += Touch(t->data) + t->shape.size() + t->name.size();
      sum += TouchTyped(r, name, t->dtype);
    }
    for (const auto& [key, value] : r.metadata()) sum += key.size() + value.size();
    (void)r.Contains("__metadata__");
    (void)r.Get("no such tensor");
    volatile uint64_t sink = sum;
    (void)sink;
  }
  unlink(path.c_str());
  return 0;
}
