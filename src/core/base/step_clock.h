// The clock that times the phases of a training step (data, read params,
// pull rows, forward, backward, push, push rows): read at every phase's
// edge, a dozen times a step, so its own cost is part of every step.
//
// Where the time-stamp counter ticks at one constant rate on every core
// (CPUID's invariant-TSC bit, and Linux itself keeps time with it: its
// clocksource is "tsc", which it chooses only once it has found the cores'
// counters in step), a read is one RDTSC: 9 ns on the 2-core EPYC KVM guest
// against 21 ns for std::chrono::steady_clock::now() (the vDSO's own RDTSC
// plus its scaling and its retry loop). A text step of 7 us reads the clock
// 13 times. Elsewhere (another architecture, another clocksource) it is
// steady_clock, and a tick is a nanosecond.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace shardwild {

class StepClock {
 public:
  // Ticks since an arbitrary origin (the same for every thread).
  static uint64_t Now() {
#if defined(__x86_64__)
    if (Get().tsc) return __rdtsc();
#endif
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
  // The nanoseconds from `from` to `to`, two Now()s; 0 where `to` reads
  // before `from` (counters a few ticks apart on two cores).
  static int64_t Nanoseconds(uint64_t from, uint64_t to) {
    if (to <= from) return 0;
    return static_cast<int64_t>(static_cast<double>(to - from) * Get().ns_per_tick);
  }
  static double Seconds(uint64_t from, uint64_t to) { return static_cast<double>(Nanoseconds(from, to)) * 1e-9; }
  // Whether Now() reads the time-stamp counter; its nanoseconds a tick.
  static bool UsesTsc() { return Get().tsc; }
  static double NanosecondsPerTick() { return Get().ns_per_tick; }

 private:
  struct State {
    bool tsc = false;
    double ns_per_tick = 1.0;
  };
  static const State& Get() {
    static const State state = Calibrate();
    return state;
  }
  static State Calibrate() {
    State s;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    // (unsigned: clang's __get_cpuid_max returns int, GCC's unsigned int.)
    if (static_cast<unsigned>(__get_cpuid_max(0x80000000u, nullptr)) < 0x80000007u) return s;
    __cpuid(0x80000007u, a, b, c, d);
    if ((d & (1u << 8)) == 0) return s;  // not invariant
    std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string source;
    if (!(in >> source) || source != "tsc") return s;
    // Ticks against steady_clock over 2 ms. Each end is a steady_clock read
    // between two counter reads close together (a thread preempted there
    // would skew the rate by its time away: that pair is read again).
    using SteadyClock = std::chrono::steady_clock;
    auto pair = [](SteadyClock::time_point* t, uint64_t* ticks) {
      for (int attempt = 0; attempt < 100; ++attempt) {
        const uint64_t before = __rdtsc();
        *t = SteadyClock::now();
        const uint64_t after = __rdtsc();
        *ticks = before + (after - before) / 2;
        if (after - before < 20000) return true;
      }
      return false;
    };
    SteadyClock::time_point t0, t1;
    uint64_t c0 = 0, c1 = 0;
    if (!pair(&t0, &c0)) return s;
    while (SteadyClock::now() - t0 < std::chrono::milliseconds(2)) {
    }
    if (!pair(&t1, &c1) || c1 <= c0) return s;
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    s.ns_per_tick = ns / static_cast<double>(c1 - c0);
    s.tsc = true;
#endif
    return s;
  }
};

}  // namespace shardwild
