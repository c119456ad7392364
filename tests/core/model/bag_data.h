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

// One bag field `name`: `count` records with labels of `classes` classes,
// record r holding length(r) ids below `id_range`, each followed by a
// weight in (0, 1] where `weighted`, all drawn from `seed`.
inline Dataset OneBagData(const std::string& name, int64_t count, int32_t classes, uint32_t seed, uint64_t id_range,
                          bool weighted, const std::function<int64_t(int64_t)>& length) {
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
      if (weighted) f.weights.push_back(static_cast<float>(rng() % 1000 + 1) / 1000.0f);
    }
    f.offsets.push_back(static_cast<int64_t>(f.ids.size()));
  }
  d.fields.push_back(std::move(f));
  return d;
}

}  // namespace shardwild::testdata
