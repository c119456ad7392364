// The optimizer kernels (the fused push's arithmetic) on every dispatch
// target, each next to a STREAM triad compiled for the same target, in cache
// and out of cache, measured in the same run.
//
//   build/bench/core/model/optimizer_benchmark --benchmark_counters_tabular=true
//
// Rows are named BM_<what>/<target>/n:<floats>; compare an optimizer's
// bytes/s with the triad's of the same target and n. bytes/s counts the
// arrays each moves: triad 3 (two read, one written), an optimizer
// 2 * (1 + slots) + 1 (params and slots read and written, gradient read).
// n = 65536 keeps every array of Adam (5 x 256 KiB) in L2 of a server core;
// n = 2^24 (64 MiB per array) is memory-bound. BM_MlpPush (the default
// MLP's push) has its own bound beside it, BM_MlpPushBound: the same arrays
// moved without Adam's arithmetic.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/core/model/optimizer_benchmark.cc"
#define HWY_COMPILE_ALL_ATTAINABLE
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace shardwild {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a[i] = b[i] + s * c[i]
void TriadImpl(float* a, const float* b, const float* c, float s, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::MulAdd(vs, hn::LoadU(d, c + i), hn::LoadU(d, b + i)), d, a + i);
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

// The bytes of a fused Adam push without its arithmetic: p, m and v read
// and written, g read and the worker's copy c written (8 streams, 32 bytes
// a parameter), each new value the old one plus g.
void PushStreamsImpl(float* p, float* m, float* v, const float* g, float* c, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto vg = hn::LoadU(d, g + i);
    const auto vp = hn::Add(hn::LoadU(d, p + i), vg);
    hn::StoreU(hn::Add(hn::LoadU(d, m + i), vg), d, m + i);
    hn::StoreU(hn::Add(hn::LoadU(d, v + i), vg), d, v + i);
    hn::StoreU(vp, d, p + i);
    hn::StoreU(vp, d, c + i);
  }
  for (; i < n; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
    c[i] = p[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace shardwild
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/huge_page_allocator.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"

namespace shardwild {
namespace {

HWY_EXPORT(TriadImpl);
HWY_EXPORT(PushStreamsImpl);

constexpr int64_t kSizes[] = {65536, int64_t{1} << 24};

void BM_StreamTriad(benchmark::State& state, std::string target) {
  ScopedHogwildKernelTarget scoped(target);
  const int64_t n = state.range(0);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  for (auto _ : state) {
    HWY_DYNAMIC_DISPATCH(TriadImpl)(a.data(), b.data(), c.data(), 0.5f, n);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] = benchmark::Counter(3.0 * n * sizeof(float), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(target);
}

void BM_ApplyUpdate(benchmark::State& state, std::string target, OptimizerType type) {
  ScopedHogwildKernelTarget scoped(target);
  const int64_t n = state.range(0);
  OptimizerOptions opt;
  opt.type = type;
  const int slots = NumSlots(type);
  std::vector<float> p(n, 0.1f), g(n, 0.01f);
  std::vector<std::vector<float>> s(slots, std::vector<float>(n, 0.1f));
  float* sp[2] = {slots > 0 ? s[0].data() : nullptr, slots > 1 ? s[1].data() : nullptr};
  int64_t step = 0;
  for (auto _ : state) {
    ApplyUpdate(opt, UpdateParams{1e-3f, ++step}, p.data(), sp, g.data(), n);
    benchmark::ClobberMemory();
  }
  const double bytes = (2.0 * (1 + slots) + 1.0) * n * sizeof(float);
  state.counters["bytes/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["params/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(target + " " + OptimizerTypeName(type));
}

// The push of the default MLP (235,146 parameters, Adam) from every thread at
// once, on one shared set of parameters and slots (Hogwild: each thread's
// update pulls in the lines the others wrote) or on a private set per thread
// (no sharing): the bound a 2-worker step's push phase can reach, next to
// what sharing costs. Run with --benchmark_filter=MlpPush.
constexpr int64_t kMlpParams = 235146;

// On huge pages where the kernel grants them, as the store's shards and the
// worker's copy and gradient (Model's dense arena) are in the trainer.
struct SharedAdamState {
  HugePageVector<float> p = HugePageVector<float>(kMlpParams, 0.1f);
  HugePageVector<float> m = HugePageVector<float>(kMlpParams, 0.0f);
  HugePageVector<float> v = HugePageVector<float>(kMlpParams, 0.0f);
};

// bound: the same arrays moved as the push moves them, on the best target,
// with an add for each of Adam's formulas (PushStreamsImpl), in place of
// Adam itself. Compare the two's params/s.
void MlpPush(benchmark::State& state, bool shared, bool bound) {
  static SharedAdamState shared_state;
  SharedAdamState private_state;
  SharedAdamState& st = shared ? shared_state : private_state;
  OptimizerOptions opt;
  opt.type = OptimizerType::kAdam;
  HugePageVector<float> g(kMlpParams, bound ? 0.0f : 0.01f), copy(kMlpParams);
  float* sp[2] = {st.m.data(), st.v.data()};
  int64_t step = 0;
  for (auto _ : state) {
    if (bound) {
      HWY_DYNAMIC_DISPATCH(PushStreamsImpl)(st.p.data(), st.m.data(), st.v.data(), g.data(), copy.data(), kMlpParams);
    } else {
      // The fused pull writes the worker's copy too, as the step does.
      ApplyUpdate(opt, UpdateParams{1e-3f, ++step}, st.p.data(), sp, g.data(), kMlpParams, copy.data());
    }
    benchmark::ClobberMemory();
  }
  state.counters["params/s"] = benchmark::Counter(kMlpParams, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] =
      benchmark::Counter(8.0 * kMlpParams * sizeof(float), benchmark::Counter::kIsIterationInvariantRate);
  const char* sharing = shared ? "one shared copy (Hogwild)" : "a private copy per thread";
  state.SetLabel(bound ? absl::StrCat("bound: the same streams, ", sharing) : std::string(sharing));
}
void BM_MlpPush(benchmark::State& state, bool shared) { MlpPush(state, shared, /*bound=*/false); }
void BM_MlpPushBound(benchmark::State& state, bool shared) { MlpPush(state, shared, /*bound=*/true); }
BENCHMARK_CAPTURE(BM_MlpPush, shared, true)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpPush, private, false)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpPushBound, shared, true)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_MlpPushBound, private, false)->Threads(1)->Threads(2)->UseRealTime();

// Registered per target the CPU supports, so each row names its target.
[[maybe_unused]] const bool kRegistered = [] {
  const OptimizerType types[] = {OptimizerType::kSgd,     OptimizerType::kMomentum, OptimizerType::kAdam,
                                 OptimizerType::kAdagrad, OptimizerType::kRmsprop,  OptimizerType::kFtrl};
  for (const std::string& target : HogwildKernelTargets()) {
    auto* triad = benchmark::RegisterBenchmark(("BM_StreamTriad/" + target).c_str(), BM_StreamTriad, target);
    triad->ArgName("n");
    for (int64_t n : kSizes) triad->Arg(n);
    for (OptimizerType type : types) {
      auto* b = benchmark::RegisterBenchmark(("BM_" + std::string(OptimizerTypeName(type)) + "/" + target).c_str(),
                                             BM_ApplyUpdate, target, type);
      b->ArgName("n");
      for (int64_t n : kSizes) b->Arg(n);
    }
  }
  return true;
}();

}  // namespace
}  // namespace shardwild
#endif  // HWY_ONCE
