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
//  - what decompressed, compressed again as one block, comes back equal;
//  - DecompressingReader, reading the same bytes from a file in small
//    pieces, ends (no endless loop) and agrees with the one-thread read:
//    the same bytes when that succeeds, an error when it fails.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-asan/tests/fuzz/compressed_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/compressed.
#include <sys/mman.h>
#include <unistd.h>

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
  // The streaming reader, on the bytes as a file.
  const int fd = memfd_create("compressed_fuzz", 0);
  if (fd >= 0) {
    if (write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size())) {
      absl::StatusOr<std::unique_ptr<DecompressingReader>> r =
          DecompressingReader::Open("/proc/self/fd/" + std::to_string(fd), c);
      Check(r.ok());
      std::string out;
      absl::Status status;
      for (int calls = 0;; ++calls) {
        Check(calls < (1 << 20));  // it ends
        absl::StatusOr<size_t> n = (*r)->Read(&out, 777);
        if (!n.ok()) {
          status = n.status();
          break;
        }
        if (*n == 0 || out.size() > kLimit) break;
      }
      o.sequential = true;
      const absl::StatusOr<std::string> seq = Decompress(file, c, "fuzz.in", o);
      if (seq.ok() && out.size() <= kLimit) Check(status.ok() && out == *seq);
      if (!seq.ok() && seq.status().code() == absl::StatusCode::kInvalidArgument && out.size() <= kLimit) {
        Check(!status.ok());
      }
    }
    close(fd);
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
