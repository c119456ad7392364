// Test data of one bag field (the text and libsvm configs' shape), shared
// by the model and worker tests.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>

#include "core/data/dataset.h"

namespace shardwild::testdata {

// The weights of a bag's ids: none, or in (0, 1], either of 3 decimals
// (k / 1000, as a libsvm file's are read: PackRecords codes them in the
// ids' words) or 1 / k for k in [3, 1002] (which no whole number of 10^-d
// gives back: kept as floats).
enum class BagWeights { kNone, kDecimals, kReciprocals };

// One bag field `name`: `count` records with labels of `classes` classes,
// record r holding length(r) ids below `id_range`, each with a weight of
// the kind `weights`, all drawn from `seed`.
inline Dataset OneBagData(const std::string& name, int64_t count, int32_t classes, uint32_t seed, uint64_t id_range,
                          BagWeights weights, const std::function<int64_t(int64_t)>& length) {
  std::mt19937 rng(seed);
  Dataset d;
  d.count = count;
  d.num_classes = classes;
  SparseField f;
  f.name = name;
  f.offsets.push_back(0);
  for (int64_t r = 0; r < count; ++r) {
    d.labels.push_back(static_cast<int32_t>(rng() % classes));
    for (int64_t k = 0; k < length(r); ++k) {
      f.ids.push_back(rng() % id_range);
      if (weights == BagWeights::kDecimals) f.weights.push_back(static_cast<float>(rng() % 1000 + 1) / 1000.0f);
      if (weights == BagWeights::kReciprocals) f.weights.push_back(1.0f / static_cast<float>(rng() % 1000 + 3));
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  d.fields.push_back(std::move(f));
  return d;
}

}  // namespace shardwild::testdata
