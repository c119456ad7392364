// The median of a sample of timings: what the benchmarks and the machine
// probes report of repeated measurements, so that one disturbed round does
// not move the figure.
//
// Thread safety: a pure function.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace shardwild {

// The middle value of `v`, or the mean of the two middle values where it
// has an even count; 0 where it is empty.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace shardwild
