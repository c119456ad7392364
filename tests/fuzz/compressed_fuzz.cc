// libFuzzer target for the gzip and zstd framing (core/io/compressed.h). An
// input is one knob byte (bit 0: zstd instead of gzip, bits 1-2: reader
// threads - 1) and then a whole file. Decompress must return a Status for any
// bytes, never more than its output limit, and:
//  - the two ways of reading agree: when the pieces were found up front and
//    decompressed in parallel, reading member by member on one thread gives
//    the same bytes (the parallel way is the stricter one: it also checks the
//    sizes the headers claim);
//  - the thread count changes nothing, status included;
//  - an error is InvalidArgument or ResourceExhausted and names the file;
//  - what decompressed, compressed again as one block, comes back equal.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-fuzz/tests/fuzz/compressed_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/compressed.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/io/compressed.h"

namespace shardwild {
namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

constexpr uint64_t kLimit = uint64_t{4} << 20;

void Run(const uint8_t* data, size_t size) {
  if (size < 1) return;
  const Compression c = (data[0] & 1) ? Compression::kZstd : Compression::kGzip;
  const int threads = 1 + ((data[0] >> 1) & 3);
  const std::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);
  DecompressOptions o;
  o.max_output_bytes = kLimit;
  o.threads = threads;
  DecompressStats st;
  const absl::StatusOr<std::string> got = Decompress(file, c, "fuzz.in", o, &st);
  if (!got.ok()) {
    const absl::StatusCode code = got.status().code();
    Check(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted);
    Check(got.status().message().substr(0, 9) == "fuzz.in: ");
  } else {
    Check(got->size() <= kLimit);
  }
  o.threads = 1;
  const absl::StatusOr<std::string> one = Decompress(file, c, "fuzz.in", o);
  Check(one.ok() == got.ok());
  if (one.ok()) Check(*one == *got);
  if (!one.ok()) Check(one.status() == got.status());
  if (got.ok() && st.parallel) {
    o.sequential = true;
    const absl::StatusOr<std::string> seq = Decompress(file, c, "fuzz.in", o);
    Check(seq.ok() && *seq == *got);
  }
  if (got.ok() && got->size() <= (1u << 16)) {
    const absl::StatusOr<std::string> block = CompressBlock(*got, c, 1);
    Check(block.ok());
    const absl::StatusOr<std::string> back = Decompress(*block, c, "fuzz.in");
    Check(back.ok() && *back == *got);
  }
}

}  // namespace
}  // namespace shardwild

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardwild::Run(data, size);
  return 0;
}
