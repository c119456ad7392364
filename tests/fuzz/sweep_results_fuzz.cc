// libFuzzer target for a sweep's results.json as `bench compare` and
// `bench report` read it (ParseSweep, workers/bench_sweep.h): any bytes give
// a Status, never an exception, a crash or undefined behaviour; and what it
// accepts can be summarised, written as CSV and compared with itself, where
// every common point has the ratio 1 (or 0 for a zero median) within noise.
// Build with -DSHARDWILD_FUZZ=ON (clang), then e.g.
//   build-asan/tests/fuzz/sweep_results_fuzz CORPUS_COPY -max_total_time=60
// from a copy of tests/fuzz/corpus/sweep_results.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "workers/bench_sweep.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlohmann::json;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<json> sweep = shardwild::ParseSweep(text, "fuzz/results.json");
  if (!sweep.ok()) {
    Check(!sweep.status().message().empty());
    return 0;
  }
  const std::string csv = shardwild::SweepCsv(*sweep);
  Check(!csv.empty() && csv.back() == '\n');
  const json c = shardwild::CompareSweeps(*sweep, *sweep, "a", "a");
  Check(c.at("only_in_a").empty() && c.at("only_in_b").empty());
  for (const json& row : c.at("rows")) {
    const double ratio = row.at("ratio").get<double>();
    Check(ratio == 1.0 || ratio == 0.0);
    Check(row.at("overlap").get<bool>() && row.at("verdict") == "within noise");
  }
  Check(!shardwild::FormatComparison(c).empty());
  return 0;
}
