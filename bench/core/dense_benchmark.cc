// Dense layer and MLP step throughput, next to the sgemm peak measured in the
// same binary run (BM_Sgemm). Compare the FLOP/s counters of the two.
//
//   build/bench/core/dense_benchmark --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <vector>

#include "core/layers.h"
#include "core/model.h"
#include "oneapi/dnnl/dnnl.h"

namespace shardwild {
namespace {

// The bound: a square sgemm, single-threaded as a worker's primitives run.
void BM_Sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  for (auto _ : state) {
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Sgemm)->ArgName("size")->Arg(256)->Arg(1024);

// One Dense layer, forward + backward, at the default model's shapes.
void BM_DenseForwardBackward(benchmark::State& state) {
  const int64_t batch = state.range(0), in = state.range(1), out = state.range(2);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<float> x(batch * in, 0.1f), y(batch * out), w(in * out, 0.01f), b(out), dy(batch * out, 0.01f),
      dx(batch * in), dw(in * out), db(out);
  DenseLayer::Buffers buf{x.data(), y.data(), w.data(), b.data(), dy.data(), dx.data(), dw.data(), db.data()};
  auto layer = DenseLayer::Create(engine, batch, in, out, Activation::kRelu, buf);
  if (!layer.ok()) {
    state.SkipWithError(std::string(layer.status().message()).c_str());
    return;
  }
  for (auto _ : state) {
    (*layer)->Forward(stream);
    (*layer)->Backward(stream);
  }
  state.counters["FLOP/s"] = benchmark::Counter((*layer)->ForwardFlops() + (*layer)->BackwardFlops(),
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DenseForwardBackward)->ArgNames({"batch", "in", "out"})->Args({128, 784, 256})->Args({128, 256, 128});

// The default MLP's full step (forward, loss, backward), no store.
void BM_MlpStep(benchmark::State& state) {
  const int64_t batch = state.range(0);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  ModelOptions opts;
  opts.layers = {{"dense", 256, Activation::kRelu}, {"dense", 128, Activation::kRelu}, {"dense", 10, Activation::kNone}};
  Dataset data;
  data.count = batch;
  data.dense_dim = 784;
  data.num_classes = 10;
  data.dense.assign(batch * 784, 0.5f);
  for (int64_t i = 0; i < batch; ++i) data.labels.push_back(static_cast<int32_t>(i % 10));
  auto mlp = Model::Create(opts, DataShape::Of(data), batch, engine, 1);
  if (!mlp.ok()) {
    state.SkipWithError(std::string(mlp.status().message()).c_str());
    return;
  }
  (*mlp)->LoadRange(data, 0, batch);
  for (auto _ : state) {
    (*mlp)->Forward(/*training=*/true, stream);
    benchmark::DoNotOptimize((*mlp)->Backward(batch, stream));
  }
  state.counters["FLOP/s"] = benchmark::Counter((*mlp)->ForwardFlops() + (*mlp)->BackwardFlops(),
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["samples/s"] = benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MlpStep)->ArgName("batch")->Arg(128)->Arg(256);

}  // namespace
}  // namespace shardwild
