// How many cache lines this machine's cores bring in when they are asked for
// at once: the size of the bursts in which a worker asks for its next
// batch's lines (Model::RecordsPerPrefetchBurst, workers/worker.cc).
//
// Software prefetches that miss wait in the core's line fill buffers; past
// what those hold, a burst's later requests stall the core and many of their
// lines never arrive, so the loads a step later miss again. How many a burst
// may hold differs from one machine to the next, even among VMs of one
// type: on 2-core AMD EPYC KVM guests bursts of 8 lines arrived on one host
// and of 48 on another (2026-11-28), and of 16 but not 32 on a third
// (2026-12-06: 32 random lines loaded 10 us after a burst took 240-270 ns,
// against 420-450 not asked for and 30-40 in L1; 16 lines arrived whole).
// So it is measured, once per process (MachinePrefetchBurst), in about 3 ms.
// The lines a burst loses are those whose pages' translations are not
// cached: lines of pages touched just before arrive in bursts of 64 on that
// third host. A batch's records are scattered over the data set, so the
// probe asks for lines of pages it has not touched lately.
//
// Thread safety: ChooseBurstLines is a pure function; ProbePrefetchBurst
// may run on any thread (it times its own loads, so other work on the same
// core or memory at the time makes it choose smaller bursts);
// MachinePrefetchBurst may be called from any number of threads (the first
// call measures, the others wait for it).
#pragma once

#include <vector>

namespace shardwild {

// The burst where nothing is measured (not x86-64, where the probe's
// cache flush is missing, or a clock that cannot tell a miss from a hit).
inline constexpr int kDefaultPrefetchBurstLines = 32;
// A burst whose lines are, on the median, more than this share as slow to
// load as lines not asked for at all has lost too many of them.
inline constexpr double kMaxLostBurstShare = 0.25;

// The loads of `lines` random lines, each a median over the probe's rounds,
// in nanoseconds (the clock's own cost included in each).
struct BurstTiming {
  int lines = 0;
  double cold_ns = 0;    // flushed from every cache, not asked for: from memory
  double asked_ns = 0;   // fresh lines, asked for in one burst of prefetches, loaded 10 us later
  double cached_ns = 0;  // loaded again at once: in L1
  // How much of the miss the burst left: (asked - cached) / (cold - cached),
  // in [0, 1]; 1 where cold is no slower than cached (nothing to tell).
  double LostShare() const;
};

// The largest burst whose lines arrive: the lines of the last of `sizes`
// (in increasing order of lines) before the first whose LostShare exceeds
// kMaxLostBurstShare; the first size's lines where even it does;
// kDefaultPrefetchBurstLines where `sizes` is empty.
int ChooseBurstLines(const std::vector<BurstTiming>& sizes);

struct PrefetchBurstProbe {
  int lines = kDefaultPrefetchBurstLines;  // ChooseBurstLines(sizes)
  bool measured = false;                   // false: the default, sizes empty
  std::vector<BurstTiming> sizes;          // 4, 8, 12, 16, 24, 32, 48 and 64 lines
  double seconds = 0;                      // the probe's own time
};

// Measures the bursts' timings on the calling thread, `rounds` rounds of
// every size (the sizes interleaved, so a disturbance touches them all
// alike), and chooses. Random lines of a private 8 MiB buffer (huge pages,
// as a packed data set), flushed with clflush: each round asks for a
// burst of fresh lines first, then loads other lines cold and again.
// On other architectures: the default, measured = false.
PrefetchBurstProbe ProbePrefetchBurst(int rounds = 24);

// ProbePrefetchBurst's result for this process, measured at the first call
// and the same ever after, so every job of a process (a bench sweep's
// points) asks in the same bursts.
const PrefetchBurstProbe& MachinePrefetchBurst();

}  // namespace shardwild
