// Variables: the named parameter tensors a model declares and a ParamStore
// holds. A variable is a [rows, cols] row-major float matrix; 1-D variables
// (biases) have cols == 1. Rows are the unit of partitioning across shards.
#pragma once

#include <cstdint>
#include <string>

namespace shardwild {

enum class InitKind {
  kZeros,
  kGlorotUniform,  // U(-l, l), l = sqrt(6 / (fan_in + fan_out)) (TensorFlow's default for Dense kernels)
};

struct VariableSpec {
  std::string name;   // unique within a model, e.g. "dense_0/kernel"
  int64_t rows = 0;
  int64_t cols = 1;
  InitKind init = InitKind::kZeros;
  int64_t fan_in = 0;   // for kGlorotUniform
  int64_t fan_out = 0;

  int64_t size() const { return rows * cols; }
};

// How a worker may use the rows of an embedding table at their addresses in
// the store (ParamStore::RowAddresses, Model::UseRowAddresses): not at all
// (kNo: it pulls them into a copy and pushes their gradients), read them in
// place and push their gradients (kRead: an optimizer with slots), or read
// them and update them in place with plain SGD fused with the embedding-bag
// backward (kReadAndSgd).
enum class RowsInPlace : uint8_t { kNo, kRead, kReadAndSgd };

// Fills `out` (spec.size() floats) with the variable's initial value. The
// values depend only on (seed, spec.name, spec's shape), never on which thread
// or process calls this, so runs with the same seed start identically.
void FillInitialValue(const VariableSpec& spec, uint64_t seed, float* out);

}  // namespace shardwild
