// How long something took, in seconds, from a std::chrono::steady_clock
// time point: for reports (data.load_s, store.setup_s) and time-outs. Not
// for a training step's phases, which StepClock times.
#pragma once

#include <chrono>

namespace shardwild {

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace shardwild
