// Tests for Model: what Describe declares, batch loading (ids, modulo,
// weights, padding), and the whole model's gradients (towers, EmbeddingBag,
// concat/dot interactions, wide part, each head) against central finite
// differences of the mean loss, and when the rows are prefetched for the
// fused update.
#include "core/model/model.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/sanitizers.h"
#include "core/base/cpu_features.h"
#include "core/data/dataset.h"
#include "core/config/options.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "tests/core/model/bag_data.h"

namespace shardwild {
namespace {

// A small data set: `dense` dense features, fields "a" (1..3 ids per record,
// weighted), "b" (0..max_b ids, unweighted) and "c" (exactly one id).
Dataset SmallData(int64_t count, int64_t dense, int32_t classes, bool multi_label, uint32_t seed, int max_b = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Dataset d;
  d.count = count;
  d.dense_dim = dense;
  for (int64_t i = 0; i < count * dense; ++i) d.dense.push_back(u(rng));
  d.num_classes = classes;
  for (int64_t r = 0; r < count; ++r) {
    if (classes == 0) {
      d.targets.push_back(u(rng));
    } else {
      d.labels.push_back(static_cast<int32_t>(rng() % classes));
    }
  }
  if (multi_label) {
    d.label_offsets.push_back(0);
    for (int64_t r = 0; r < count; ++r) {
      d.label_sets.push_back(d.labels[r]);
      if (r % 2 == 1) d.label_sets.push_back((d.labels[r] + 1) % classes);
      d.label_offsets.push_back(static_cast<int64_t>(d.label_sets.size()));
    }
  }
  const char* names[] = {"a", "b", "c"};
  for (int f = 0; f < 3; ++f) {
    SparseField field;
    field.name = names[f];
    field.offsets.push_back(0);
    for (int64_t r = 0; r < count; ++r) {
      const int n = f == 0 ? 1 + static_cast<int>(rng() % 3) : (f == 1 ? static_cast<int>(rng() % (max_b + 1)) : 1);
      for (int k = 0; k < n; ++k) {
        field.ids.push_back(1000 + rng() % 7);  // repeats within a batch
        if (f == 0) field.weights.push_back(0.5f + static_cast<float>(rng() % 4) * 0.25f);
      }
      field.offsets.push_back(static_cast<int64_t>(field.ids.size()));
    }
    d.fields.push_back(field);
  }
  return d;
}

ModelOptions SmallOptions(Interaction interaction, HeadType head, int64_t outputs, bool wide, bool bottom) {
  ModelOptions m;
  m.head = head;
  m.interaction = interaction;
  m.tables = {{"ta", 5, 3, false, false, 0.5f}, {"tc", 1 << 20, 3, true, false, 0.5f}};
  m.sparse = {{"a", "ta", Pooling::kSum, true}, {"b", "ta", Pooling::kMean, true}, {"c", "tc", Pooling::kSum, true}};
  if (bottom) m.bottom = {{"dense", 4, Activation::kTanh}, {"dense", 3, Activation::kSigmoid}};
  m.layers = {{"dense", 4, Activation::kTanh}, {"dense", outputs, Activation::kNone}};
  if (wide) m.wide = {"a", "b"};
  m.wide_rows = 11;
  return m;
}

// Each float's bits: comparing them tells -0 from 0 and a NaN from itself.
std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float f : v) out.push_back(std::bit_cast<uint32_t>(f));
  return out;
}

// Batches of `size` records spread over a data set of `count`: the one
// starting at record r holds r, r + gap, r + 2 gap, ... (mod count), for r
// = 0, size, 2 size, ... up to count.
std::vector<std::vector<int32_t>> SpreadBatches(int64_t count, int32_t size, int32_t gap) {
  std::vector<std::vector<int32_t>> batches;
  for (int32_t r = 0; r < count; r += size) {
    std::vector<int32_t> b;
    for (int32_t k = 0; k < size; ++k) b.push_back(static_cast<int32_t>((r + gap * k) % count));
    batches.push_back(b);
  }
  return batches;
}

class ModelTest : public ::testing::Test {
 protected:
  // A model of `options` on data shaped as `d`; null (and a failure) if it cannot be made.
  std::unique_ptr<Model> Make(const ModelOptions& options, const Dataset& d, int64_t batch) {
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Create(options, DataShape::Of(d), batch, engine_, 1);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  // The batches loaded into `a` and `b` are the same: every lookup's ids,
  // the labels, and the bags with their weights (the rows pooled hold a
  // value of their position in the batch, so a bag's sum, or mean, moves
  // with its size, its ends and each position's weight).
  void ExpectSameBatch(Model& a, Model& b, int64_t outputs, const std::string& what) {
    for (int l = 0; l < b.num_lookups(); ++l) {
      EXPECT_EQ(std::vector<uint64_t>(a.ids(l).begin(), a.ids(l).end()),
                std::vector<uint64_t>(b.ids(l).begin(), b.ids(l).end()))
          << "lookup " << l << ", " << what;
    }
    for (int64_t i = 0; i < b.batch() * b.dense_dim(); ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(a.dense_inputs()[i]), std::bit_cast<uint32_t>(b.dense_inputs()[i]))
          << "dense input " << i << ", " << what;
    }
    for (int64_t i = 0; i < b.batch(); ++i) {
      EXPECT_EQ(a.labels()[i], b.labels()[i]) << i << ", " << what;
      EXPECT_EQ(std::bit_cast<uint32_t>(a.targets()[i]), std::bit_cast<uint32_t>(b.targets()[i])) << i << ", " << what;
    }
    for (Model* x : {&a, &b}) {
      for (int l = 0; l < x->num_lookups(); ++l) {
        const size_t values = x->ids(l).size() * x->lookup(l).dim;
        for (size_t i = 0; i < values; ++i) x->rows(l)[i] = 1.0f + 0.125f * static_cast<float>((i * 7) % 11);
      }
      for (int v = 0; v < x->num_variables(); ++v) std::fill(x->params(v), x->params(v) + x->variable(v).size(), 0.5f);
      x->Forward(false, stream_);
    }
    for (int64_t i = 0; i < b.batch() * outputs; ++i) EXPECT_EQ(a.logits()[i], b.logits()[i]) << i << ", " << what;
  }

  // A model of `options` packs `d` (PackRecords) in each layout: its own
  // choice, blocks one after the other, and slots of 16, 24, 64 and 128
  // bytes (the short ones too short for most blocks, which then go after
  // the slots). Each of `batches` loaded from those packed records (two in
  // three after PrefetchBatch, as a worker loads them) is then the same
  // batch as a second model loads from d's fields (ExpectSameBatch).
  // Records, by stride asked for, how many records each layout put after
  // its slots (overflowing_). Returns the records packed as PackRecords
  // chooses, or nullopt (and a failure) where d is not packed.
  std::optional<PackedRecords> ExpectPackedLoadsAsFields(const ModelOptions& options, const Dataset& d, int64_t batch,
                                                         int64_t outputs,
                                                         const std::vector<std::vector<int32_t>>& batches) {
    const std::unique_ptr<Model> packed_model = Make(options, d, batch), plain_model = Make(options, d, batch);
    if (!packed_model || !plain_model) return std::nullopt;
    std::optional<PackedRecords> chosen;
    overflowing_.clear();
    for (int64_t stride : {Model::kAutoStride, int64_t{0}, int64_t{16}, int64_t{24}, int64_t{64}, int64_t{128}}) {
      const std::string layout = absl::StrCat("stride ", stride, " bytes asked for");
      std::optional<PackedRecords> packed = packed_model->PackRecords(d, stride);
      EXPECT_TRUE(packed.has_value()) << layout;
      if (!packed) return std::nullopt;
      if (!packed->has_ids()) {
        chosen = std::move(packed);
        break;
      }
      int64_t overflowing = 0;
      if (stride == 0) {
        EXPECT_EQ(packed->stride_words, 0);
      } else if (stride > 0) {
        EXPECT_EQ(packed->stride_words, stride / 8) << layout;
      }
      // What a record's prefetch asks for: its block, or its slot (whatever
      // went after the slots, found only when the slot is read), and the
      // records asked for in a burst of those lines.
      const int64_t asked_bytes = packed->stride_words > 0 ? packed->stride_words * 8
                                                           : static_cast<int64_t>(packed->words.size() * 8) / d.count;
      EXPECT_EQ(packed->prefetch_bytes, asked_bytes) << layout;
      if ((d.dense_dim == 0 || packed->dense_in_block()) && packed->inline_label) {
        for (const int64_t burst : {1, 16, 32, 48}) {
          EXPECT_EQ(packed_model->RecordsPerPrefetchBurst(&*packed, burst),
                    std::max<int64_t>(1, burst / ((asked_bytes + 63) / 64)))
              << layout << " burst " << burst;
        }
      }
      if (packed->stride_words == 0) {
        EXPECT_EQ(packed->slot_load, PackedRecords::SlotLoad::kRecords) << layout;  // slots only
        EXPECT_EQ(packed->start.size(), static_cast<size_t>(d.count) + 1) << layout;
        // The blocks, then a few words of padding (the loads copy whole chunks).
        EXPECT_LE(packed->start.back(), packed->words.size()) << layout;
        EXPECT_LE(packed->words.size(), packed->start.back() + 8) << layout;
      } else {
        EXPECT_TRUE(packed->start.empty()) << layout;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(packed->words.data()) % 64, 0u) << layout;
        const uint64_t slots = static_cast<uint64_t>(d.count * packed->stride_words);
        for (int64_t r = 0; r < d.count; ++r) {
          const uint64_t* slot = packed->words.data() + r * packed->stride_words;
          if (slot[0] != PackedRecords::kOverflowSlot) {
            EXPECT_EQ(packed->Block(r), slot) << layout;
            continue;
          }
          ++overflowing;
          EXPECT_GE(slot[1], slots) << "record " << r << ", " << layout;
          EXPECT_LT(slot[1], packed->words.size()) << "record " << r << ", " << layout;
        }
      }
      overflowing_[stride] = overflowing;
      for (size_t b = 0; b < batches.size(); ++b) {
        const int64_t n = static_cast<int64_t>(batches[b].size());
        // Batch after batch: not asked for, asked for (LoadBatch asks again)
        // and asked for in bursts (it does not), as a worker loads them.
        const Model::Asked asked = std::array{Model::Asked::kNo, Model::Asked::kYes, Model::Asked::kInBursts}[b % 3];
        if (asked != Model::Asked::kNo) packed_model->PrefetchBatch(d, batches[b].data(), n, &*packed);
        packed_model->LoadBatch(d, batches[b].data(), n, &*packed, asked);
        plain_model->LoadBatch(d, batches[b].data(), n);
        ExpectSameBatch(*packed_model, *plain_model, outputs,
                        absl::StrCat("batch ", b, " of ", n, " records, ", layout));
      }
      if (stride == Model::kAutoStride) chosen = std::move(packed);
    }
    return chosen;
  }

  // What one training step of a loaded batch gives: the logits, the dense
  // gradients and every lookup's row gradients, each one after another.
  struct StepResult {
    std::vector<float> logits, grads, row_grads;
  };
  // Fills x's parameters, then the loaded batch's rows, from one fixed seed,
  // and runs a training forward and backward over `valid` records.
  StepResult TrainStep(Model& x, int64_t valid) {
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-0.8f, 0.8f);
    for (int v = 0; v < x.num_variables(); ++v) {
      for (int64_t i = 0; i < x.variable(v).size(); ++i) x.params(v)[i] = u(rng);
    }
    for (int l = 0; l < x.num_lookups(); ++l) {
      for (size_t i = 0; i < x.ids(l).size() * x.lookup(l).dim; ++i) x.rows(l)[i] = u(rng);
    }
    x.Forward(true, stream_);
    StepResult r;
    r.logits.assign(x.logits(), x.logits() + x.batch() * x.outputs());
    x.Backward(valid, stream_);
    for (int v = 0; v < x.num_variables(); ++v) {
      r.grads.insert(r.grads.end(), x.grads(v), x.grads(v) + x.variable(v).size());
    }
    for (int l = 0; l < x.num_lookups(); ++l) {
      r.row_grads.insert(r.row_grads.end(), x.row_grads(l), x.row_grads(l) + x.ids(l).size() * x.lookup(l).dim);
    }
    return r;
  }

  std::map<int64_t, int64_t> overflowing_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
};

TEST_F(ModelTest, DescribeDeclaresTowersTablesAndLookups) {
  const Dataset d = SmallData(4, 5, 2, false, 1);
  absl::StatusOr<ModelSpec> spec =
      Model::Describe(SmallOptions(Interaction::kDot, HeadType::kBinary, 1, /*wide=*/true, /*bottom=*/true),
                      DataShape::Of(d));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->variables.size(), 8u);
  EXPECT_EQ(spec->variables[0].name, "bottom_0/kernel");
  EXPECT_EQ(spec->variables[0].rows, 5);
  EXPECT_EQ(spec->variables[4].name, "dense_0/kernel");
  // dot over [dense, a, b, c]: 3 (the dense vector) + 4*3/2 pairs.
  EXPECT_EQ(spec->interaction_width, 3 + 6);
  EXPECT_EQ(spec->variables[4].rows, 9);
  ASSERT_EQ(spec->tables.size(), 4u);  // ta (shared by a and b), tc, wide/a, wide/b
  EXPECT_EQ(spec->tables[0].name, "ta");
  EXPECT_EQ(spec->tables[1].name, "tc");
  EXPECT_TRUE(spec->tables[1].dynamic);
  EXPECT_EQ(spec->tables[2].name, "wide/a");
  EXPECT_EQ(spec->tables[2].dim, 1);
  EXPECT_EQ(spec->tables[2].rows, 11);
  EXPECT_EQ(spec->tables[2].init_scale, 0.0f);  // wide weights start at zero
  ASSERT_EQ(spec->lookups.size(), 5u);
  EXPECT_EQ(spec->lookups[1].table, 0);
  EXPECT_TRUE(spec->lookups[3].wide);
  EXPECT_EQ(spec->outputs, 1);

  // concat: dense vector (bottom out 3) + 3 embeddings of 3.
  spec = Model::Describe(SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, true), DataShape::Of(d));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->interaction_width, 12);
  // dot_no_dense: the bottom out (3) + 3*2/2 pairs of embeddings.
  spec = Model::Describe(SmallOptions(Interaction::kDotNoDense, HeadType::kBinary, 1, false, true), DataShape::Of(d));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->interaction_width, 6);
}

TEST_F(ModelTest, DescribeErrorsNameTheKey) {
  const Dataset d = SmallData(4, 5, 3, false, 1);
  auto expect_error = [&](const ModelOptions& m, const DataShape& s, const std::string& key) {
    absl::StatusOr<ModelSpec> spec = Model::Describe(m, s);
    ASSERT_FALSE(spec.ok()) << key;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(key), std::string::npos) << spec.status();
  };
  // A softmax head one unit short of the classes.
  expect_error(SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 2, false, true), DataShape::Of(d), "units");
  // A binary head on three classes.
  expect_error(SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, true), DataShape::Of(d), "model.head");
  // A field the data lacks.
  ModelOptions m = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  m.sparse[2].field = "zz";
  expect_error(m, DataShape::Of(d), "model.sparse[2].field");
  m = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, true, true);
  m.wide[1] = "nope";
  expect_error(m, DataShape::Of(d), "model.wide[1]");
  // dot with a dense vector of the wrong width (no bottom: the 5 features).
  expect_error(SmallOptions(Interaction::kDot, HeadType::kSoftmax, 3, false, false), DataShape::Of(d),
               "model.interaction");
  // Embeddings of different widths under dot.
  m = SmallOptions(Interaction::kDot, HeadType::kSoftmax, 3, false, true);
  m.tables[1].dim = 4;
  expect_error(m, DataShape::Of(d), "model.interaction");
  // A table no one defined.
  m = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  m.sparse[0].table = "missing";
  expect_error(m, DataShape::Of(d), "model.sparse[0]");
  // Regression on class labels.
  expect_error(SmallOptions(Interaction::kConcat, HeadType::kRegression, 1, false, true), DataShape::Of(d),
               "model.head");
}

TEST_F(ModelTest, LoadBatchMapsIdsPoolsWeightsAndPads) {
  const Dataset d = SmallData(6, 2, 2, false, 3);
  auto model = Model::Create(SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, true, false), DataShape::Of(d),
                             /*batch=*/4, engine_, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  const int32_t records[] = {5, 2, 0};
  m.LoadBatch(d, records, 3);
  // Lookup 0: field a through static table ta (5 rows): id % 5.
  std::vector<uint64_t> want;
  for (int32_t r : records) {
    for (int64_t i = d.fields[0].offsets[r]; i < d.fields[0].offsets[r + 1]; ++i) want.push_back(d.fields[0].ids[i] % 5);
  }
  EXPECT_EQ(std::vector<uint64_t>(m.ids(0).begin(), m.ids(0).end()), want);
  // Lookup 2: field c through the dynamic table: raw ids.
  want.clear();
  for (int32_t r : records) want.push_back(d.fields[2].ids[d.fields[2].offsets[r]]);
  EXPECT_EQ(std::vector<uint64_t>(m.ids(2).begin(), m.ids(2).end()), want);
  // Wide lookup of field a: static, wide_rows 11.
  EXPECT_EQ(m.ids(3).size(), m.ids(0).size());
  EXPECT_EQ(m.ids(3)[0], d.fields[0].ids[d.fields[0].offsets[5]] % 11);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(m.labels()[i], d.labels[records[i]]);
  EXPECT_EQ(m.labels()[3], 0);

  // Forward with every pulled row = 1: field a's sum pooling gives the weight
  // sum; the padding row's bags are empty and its logit is the bias path only.
  for (int l = 0; l < m.num_lookups(); ++l) {
    std::fill(m.rows(l), m.rows(l) + m.ids(l).size() * m.lookup(l).dim, 1.0f);
  }
  for (int v = 0; v < m.num_variables(); ++v) std::fill(m.params(v), m.params(v) + m.variable(v).size(), 0.0f);
  m.Forward(false, stream_);
  // Top is zero: the logit is the wide term = sum of a's weights + the count of b's ids.
  for (int i = 0; i < 3; ++i) {
    const int32_t r = records[i];
    double want_logit = 0;
    for (int64_t k = d.fields[0].offsets[r]; k < d.fields[0].offsets[r + 1]; ++k) want_logit += d.fields[0].weights[k];
    want_logit += static_cast<double>(d.fields[1].size(r));
    EXPECT_NEAR(m.logits()[i], want_logit, 1e-5) << i;
  }
  EXPECT_EQ(m.logits()[3], 0.0f);

  // A second, smaller batch reuses the buffers: counts restart.
  m.LoadRange(d, 1, 1);
  EXPECT_EQ(static_cast<int64_t>(m.ids(2).size()), 1);
}

// Ids packed by PackRecords load exactly as ids read from the fields: every
// lookup's ids (static ones mapped, dynamic ones raw, empty bags and repeats
// included), a weighted lookup's weights (in the block after its ids, where
// its field has them), offsets and labels, over batches of several sizes.
TEST_F(ModelTest, PackedRecordsLoadAsTheFieldsDo) {
  const ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, true, true);
  for (bool weights : {true, false}) {
    Dataset d = SmallData(40, 2, 3, false, 3);
    if (!weights) d.fields[0].weights.clear();  // "a" weighted, each weight 1
    const std::optional<PackedRecords> packed = ExpectPackedLoadsAsFields(
        opts, d, /*batch=*/8, /*outputs=*/3, {{39, 0, 17, 17, 5, 22, 8, 31}, {3}, {12, 1, 30}, {}});
    ASSERT_TRUE(packed.has_value()) << weights;
    const std::unique_ptr<Model> m = Make(opts, d, 8);
    ASSERT_TRUE(m);
    EXPECT_EQ(packed->records, d.count);
    EXPECT_EQ(packed->slot_load, PackedRecords::SlotLoad::kRecords);  // several lookups, dense values
    // Lookups a, b, c, then the wide part's a and b, each with ids of its
    // own (the wide tables' rows differ from ta's): only "a" is weighted.
    EXPECT_EQ(packed->num_bags, m->num_lookups());
    ASSERT_EQ(packed->weighted.size(), static_cast<size_t>(m->num_lookups()));
    for (int l = 0; l < m->num_lookups(); ++l) {
      EXPECT_EQ(m->bag_of(l), l);
      EXPECT_EQ(packed->weighted[l] != 0, weights && m->lookup(l).weighted && m->lookup(l).data_field == 0) << l;
    }
  }
}

// A wide lookup of a deep lookup's field, through a table of as many rows
// (Wide & Deep's), reads the deep lookup's ids: loaded and packed once. The
// model computes what it computes over copies of those fields under other
// names (no lookup shares): the same ids, logits and gradients, bit for bit,
// loaded from the fields and from packed records.
TEST_F(ModelTest, WideLookupsOfDeepFieldsThroughTablesOfTheSameRowsShareTheirIds) {
  const Dataset d = SmallData(40, 2, 3, false, 3, /*max_b=*/5);
  ModelOptions shared = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, /*wide=*/true, /*bottom=*/true);
  shared.wide_rows = 5;  // ta's rows
  Dataset copies = d;
  for (const char* f : {"a", "b"}) {
    SparseField copy = d.fields[f[0] - 'a'];
    copy.name = absl::StrCat("w", f);
    copies.fields.push_back(copy);
  }
  ModelOptions apart = shared;
  apart.wide = {"wa", "wb"};
  constexpr int64_t kBatch = 8;
  const std::unique_ptr<Model> a = Make(shared, d, kBatch), b = Make(apart, copies, kBatch);
  ASSERT_TRUE(a && b);
  // Lookups a, b, c, wide a, wide b.
  EXPECT_EQ(std::vector<int>({a->bag_of(0), a->bag_of(1), a->bag_of(2), a->bag_of(3), a->bag_of(4)}),
            std::vector<int>({0, 1, 2, 0, 1}));
  EXPECT_EQ(std::vector<int>({b->bag_of(0), b->bag_of(1), b->bag_of(2), b->bag_of(3), b->bag_of(4)}),
            std::vector<int>({0, 1, 2, 3, 4}));
  const std::optional<PackedRecords> packed_a = a->PackRecords(d), packed_b = b->PackRecords(copies);
  ASSERT_TRUE(packed_a.has_value() && packed_a->has_ids());
  ASSERT_TRUE(packed_b.has_value() && packed_b->has_ids());
  EXPECT_EQ(packed_a->num_bags, 3);
  EXPECT_EQ(packed_b->num_bags, 5);
  EXPECT_LT(packed_a->words.size(), packed_b->words.size());
  const std::vector<std::vector<int32_t>> batches = {{39, 0, 17, 17, 5, 22, 8, 31}, {3}, {12, 1, 30}};
  for (bool packed : {false, true}) {
    for (size_t i = 0; i < batches.size(); ++i) {
      const std::string what = absl::StrCat(packed ? "packed" : "fields", ", batch ", i);
      const int64_t n = static_cast<int64_t>(batches[i].size());
      a->LoadBatch(d, batches[i].data(), n, packed ? &*packed_a : nullptr);
      b->LoadBatch(copies, batches[i].data(), n, packed ? &*packed_b : nullptr);
      for (int l = 0; l < a->num_lookups(); ++l) {
        EXPECT_EQ(std::vector<uint64_t>(a->ids(l).begin(), a->ids(l).end()),
                  std::vector<uint64_t>(b->ids(l).begin(), b->ids(l).end()))
            << "lookup " << l << ", " << what;
      }
      const StepResult ra = TrainStep(*a, n), rb = TrainStep(*b, n);
      EXPECT_EQ(Bits(ra.logits), Bits(rb.logits)) << what;
      EXPECT_EQ(Bits(ra.grads), Bits(rb.grads)) << what;
      EXPECT_EQ(Bits(ra.row_grads), Bits(rb.row_grads)) << what;
    }
  }
  // And packed as the fields load, in every layout.
  EXPECT_TRUE(ExpectPackedLoadsAsFields(shared, d, kBatch, 3, batches).has_value());
}

// Where every table is static with at most 2^32 rows, the packed ids are
// uint32 and each record's label (a regression head's target) is in its
// block: they load as from the fields, for each head, bags of 0..13 ids
// (odd and even counts, so blocks padded to whole words), the data set's
// last record included. A dynamic table, or a static one past 2^32 rows,
// keeps 64-bit ids.
TEST_F(ModelTest, NarrowPackedIdsAndTheLabelInTheBlockLoadAsTheFieldsDo) {
  std::vector<std::vector<int32_t>> batches;
  for (int32_t r = 0; r < 60; r += 6) batches.push_back({r, (r + 13) % 60, (r + 29) % 60, 59, (r + 7) % 60, r});
  batches.push_back({59});
  for (HeadType head : {HeadType::kSoftmax, HeadType::kBinary, HeadType::kRegression}) {
    const int32_t classes = head == HeadType::kSoftmax ? 3 : head == HeadType::kBinary ? 2 : 0;
    const int64_t outputs = head == HeadType::kSoftmax ? 3 : 1;
    Dataset d = SmallData(60, 2, classes, false, 11, /*max_b=*/13);
    d.fields[0].weights.clear();
    ModelOptions opts = SmallOptions(Interaction::kConcat, head, outputs, false, true);
    opts.tables[1].dynamic = false;  // tc: static, 2^20 rows
    const std::optional<PackedRecords> packed =
        ExpectPackedLoadsAsFields(opts, d, /*batch=*/6, outputs, batches);
    ASSERT_TRUE(packed.has_value()) << static_cast<int>(head);
    EXPECT_TRUE(packed->narrow_ids) << static_cast<int>(head);
    EXPECT_TRUE(packed->inline_label) << static_cast<int>(head);
    // 3 counts and the label: 2 words of head.
    EXPECT_EQ(packed->head_words, 2);
    int64_t ids = 0;
    for (const SparseField& f : d.fields) ids += static_cast<int64_t>(f.ids.size());
    const std::unique_ptr<Model> m = Make(opts, d, 6);
    ASSERT_TRUE(m);
    const std::optional<PackedRecords> one_after_another = m->PackRecords(d, 0);
    EXPECT_LE(one_after_another->start.back(), static_cast<uint64_t>(2 * d.count + (ids + d.count) / 2))
        << static_cast<int>(head);
  }
  Dataset d = SmallData(10, 2, 3, false, 11);
  d.fields[0].weights.clear();
  ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  const std::unique_ptr<Model> dynamic = Make(opts, d, 4);
  ASSERT_TRUE(dynamic);
  EXPECT_FALSE(dynamic->PackRecords(d)->narrow_ids);
  opts.tables[1] = {"tc", (int64_t{1} << 32) + 1, 3, false, false, 0.5f};
  const std::unique_ptr<Model> wide_rows = Make(opts, d, 4);
  ASSERT_TRUE(wide_rows);
  EXPECT_FALSE(wide_rows->PackRecords(d)->narrow_ids);
  EXPECT_TRUE(wide_rows->PackRecords(d)->inline_label);
}

// SmallData's fields with at most one id a bag: "a" and "b" one id or none
// (every `missing`-th record, at different records, and a run of records
// with neither), "c" always one; no weights.
Dataset OneIdData(int64_t count, int64_t dense, int32_t classes, uint32_t seed, int64_t missing) {
  Dataset d = SmallData(count, dense, classes, false, seed);
  for (int f = 0; f < 3; ++f) {
    SparseField& field = d.fields[f];
    SparseField one;
    one.name = field.name;
    one.offsets.push_back(0);
    for (int64_t r = 0; r < count; ++r) {
      const bool none = f < 2 && ((r + f) % missing == 0 || (r >= 20 && r < 26));
      if (!none) one.ids.push_back(field.ids[field.offsets[r]]);
      one.offsets.push_back(static_cast<int64_t>(one.ids.size()));
    }
    field = std::move(one);
  }
  return d;
}

// Records of several bags of at most one id each (Criteo's fields) are
// packed in the one-id layout (a mask of the bags with their id, the label,
// an id a bag, the dense values) where the slots hold its blocks, and load
// as from the fields: the ids, their bags (offsets), labels and dense
// values, bit for bit, for softmax and binary heads, batch after batch into
// the same buffers; slots too short, blocks one after the other, and data
// the layout cannot hold keep the counts.
TEST_F(ModelTest, OneIdBagsLoadAsTheFieldsDo) {
  using SlotLoad = PackedRecords::SlotLoad;
  std::vector<std::vector<int32_t>> batches = SpreadBatches(60, 6, 7);
  batches.push_back({20, 21, 22, 23, 24, 25});  // neither "a" nor "b" has an id
  batches.push_back({59});
  batches.push_back({});
  for (HeadType head : {HeadType::kSoftmax, HeadType::kBinary}) {
    const int32_t classes = head == HeadType::kSoftmax ? 3 : 2;
    const int64_t outputs = head == HeadType::kSoftmax ? 3 : 1;
    const Dataset d = OneIdData(60, 2, classes, 11, /*missing=*/4);
    ModelOptions opts = SmallOptions(Interaction::kConcat, head, outputs, /*wide=*/true, /*bottom=*/true);
    opts.tables[1].dynamic = false;  // tc: static, 2^20 rows (narrow ids)
    const std::optional<PackedRecords> packed = ExpectPackedLoadsAsFields(opts, d, /*batch=*/6, outputs, batches);
    ASSERT_TRUE(packed.has_value()) << static_cast<int>(head);
    // 5 bags (a, b, c and the wide part's a and b, through tables of other
    // rows) and 2 dense values: the head word, 5 ids and 2 floats, 40 bytes,
    // in 64-byte slots.
    EXPECT_EQ(packed->num_bags, 5);
    EXPECT_EQ(packed->slot_load, SlotLoad::kOneIdBags);
    EXPECT_TRUE(packed->dense_in_block());
    EXPECT_FALSE(packed->has_dense_bytes());
    EXPECT_EQ(packed->head_words, 1);
    EXPECT_EQ(packed->stride_words, 8);
    EXPECT_EQ(packed->overflow_blocks, 0);
    EXPECT_EQ(packed->prefetch_bytes, 64);
    const std::unique_ptr<Model> m = Make(opts, d, 6);
    ASSERT_TRUE(m);
    // Its block, word by word, for a record with "b" missing (r = 3: (3 + 1)
    // % 4), and so the wide part's "b".
    const uint64_t* block = packed->Block(3);
    EXPECT_EQ(static_cast<uint32_t>(block[0]), 0b01101u);
    EXPECT_EQ(static_cast<int32_t>(block[0] >> 32), d.labels[3]);
    EXPECT_EQ(static_cast<uint32_t>(block[1]), d.fields[0].ids[d.fields[0].offsets[3]] % 5);
    float dense[2];
    std::memcpy(dense, reinterpret_cast<const char*>(block + 1) + 5 * sizeof(uint32_t), sizeof(dense));
    EXPECT_EQ(dense[0], d.dense[6]);
    EXPECT_EQ(dense[1], d.dense[7]);
    // Slots that hold the block take it; shorter ones, and blocks one after
    // the other, keep the counts.
    for (int64_t stride : {64, 128}) EXPECT_EQ(m->PackRecords(d, stride)->slot_load, SlotLoad::kOneIdBags) << stride;
    for (int64_t stride : {0, 16, 24, 32}) {
      const std::optional<PackedRecords> counts = m->PackRecords(d, stride);
      EXPECT_EQ(counts->slot_load, SlotLoad::kRecords) << stride;
      EXPECT_FALSE(counts->dense_in_block()) << stride;
    }
  }
  // One bag of at most one id with dense values takes the layout; without
  // dense values it is a bag of words (kIds).
  {
    Dataset d = OneIdData(40, 3, 2, 5, 3);
    d.fields.resize(1);
    ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, false);
    opts.sparse.resize(1);
    EXPECT_EQ(ExpectPackedLoadsAsFields(opts, d, 5, 1, SpreadBatches(40, 5, 3))->slot_load, SlotLoad::kOneIdBags);
    d.dense_dim = 0;
    d.dense.clear();
    EXPECT_EQ(ExpectPackedLoadsAsFields(opts, d, 5, 1, SpreadBatches(40, 5, 3))->slot_load, SlotLoad::kIds);
  }
  // Dense values that are all bytes k / 255 go in the block as the floats.
  {
    Dataset d = OneIdData(40, 2, 3, 7, 5);
    for (size_t i = 0; i < d.dense.size(); ++i) d.dense[i] = static_cast<float>(i % 256) / 255.0f;
    ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
    opts.tables[1].dynamic = false;
    const std::optional<PackedRecords> packed = ExpectPackedLoadsAsFields(opts, d, 4, 3, SpreadBatches(40, 4, 9));
    EXPECT_EQ(packed->slot_load, SlotLoad::kOneIdBags);
    EXPECT_FALSE(packed->has_dense_bytes());
  }
  // What the layout cannot hold: a bag of two ids, weights, a regression
  // target, several labels, 64-bit ids, more than 32 bags.
  auto slot_load = [&](const ModelOptions& opts, const Dataset& d) {
    const std::unique_ptr<Model> m = Make(opts, d, 4);
    return m ? m->PackRecords(d)->slot_load : SlotLoad::kRecords;
  };
  ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  opts.tables[1].dynamic = false;
  EXPECT_EQ(slot_load(opts, OneIdData(30, 2, 3, 1, 4)), SlotLoad::kOneIdBags);
  {
    Dataset two = OneIdData(30, 2, 3, 1, 4);
    SparseField& c = two.fields[2];
    c.ids.insert(c.ids.begin() + c.offsets[29], 1000);
    ++c.offsets[30];
    EXPECT_EQ(slot_load(opts, two), SlotLoad::kRecords);
  }
  {
    Dataset weighted = OneIdData(30, 2, 3, 1, 4);
    weighted.fields[0].weights.assign(weighted.fields[0].ids.size(), 0.5f);
    EXPECT_EQ(slot_load(opts, weighted), SlotLoad::kRecords);
  }
  {
    ModelOptions regression = SmallOptions(Interaction::kConcat, HeadType::kRegression, 1, false, true);
    regression.tables[1].dynamic = false;
    EXPECT_EQ(slot_load(regression, OneIdData(30, 2, 0, 1, 4)), SlotLoad::kRecords);
  }
  {
    Dataset multi = OneIdData(30, 2, 3, 1, 4);
    multi.label_offsets.push_back(0);
    for (int64_t r = 0; r < multi.count; ++r) {
      multi.label_sets.push_back(multi.labels[r]);
      multi.label_offsets.push_back(r + 1);
    }
    EXPECT_EQ(slot_load(opts, multi), SlotLoad::kRecords);
  }
  {
    ModelOptions dynamic = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);  // tc dynamic
    EXPECT_EQ(slot_load(dynamic, OneIdData(30, 2, 3, 1, 4)), SlotLoad::kRecords);
  }
  for (int fields : {32, 33}) {
    Dataset d = OneIdData(30, 2, 3, 1, 4);
    ModelOptions many = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
    many.tables = {{"t", 97, 2, false, false, 0.5f}};
    many.sparse.clear();
    for (int f = 0; f < fields; ++f) {
      if (f >= 3) {
        SparseField copy = d.fields[f % 3];
        copy.name = absl::StrCat("f", f);
        d.fields.push_back(std::move(copy));
      }
      many.sparse.push_back({d.fields[f].name, "t", Pooling::kSum, false});
    }
    if (fields == 32) {
      const std::optional<PackedRecords> packed = ExpectPackedLoadsAsFields(many, d, 4, 3, SpreadBatches(30, 4, 7));
      EXPECT_EQ(packed->slot_load, SlotLoad::kOneIdBags);
      EXPECT_EQ(packed->num_bags, 32);
    } else {
      EXPECT_EQ(slot_load(many, d), SlotLoad::kRecords);
    }
  }
}

// Packed blocks are copied in chunks of several ids: bags of every length
// from 0 to 13 ids, batch after batch into the same buffers, and the data
// set's last record (whose chunk reads into the padding) load exactly as
// from the fields, offsets included.
TEST_F(ModelTest, PackedRecordsOfLongBagsLoadAsTheFieldsDo) {
  // "a" keeps its weights: they follow its ids in each block, and a chunk
  // of its ids reads into them.
  Dataset d = SmallData(150, 2, 3, false, 5, /*max_b=*/13);
  const ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  std::set<int64_t> lengths;
  for (int64_t r = 0; r < d.count; ++r) lengths.insert(d.fields[1].size(r));
  ASSERT_EQ(lengths.size(), 14u) << "the data should hold bags of every length 0..13";
  std::vector<std::vector<int32_t>> batches = SpreadBatches(d.count, 6, 7);
  batches.push_back({static_cast<int32_t>(d.count - 1)});
  batches.push_back({static_cast<int32_t>(d.count - 1), 0, static_cast<int32_t>(d.count - 1)});
  EXPECT_TRUE(ExpectPackedLoadsAsFields(opts, d, /*batch=*/6, /*outputs=*/3, batches).has_value());
  // Slots of 64 and 128 bytes hold some blocks (64-bit ids: tc is dynamic)
  // and send others after them.
  for (int64_t stride : {64, 128}) {
    EXPECT_GT(overflowing_[stride], 0) << stride;
    EXPECT_LT(overflowing_[stride], d.count) << stride;
  }
}

// A bag of words (one lookup, no dense values, narrow ids and the label in
// the block: the text config's layout, which LoadBatch copies slot by slot
// with no branch on a record's count): bags of 0 to 34 ids, in slots that
// hold all of them, some or few (the rest after the slots), and blocks one
// after the other, load as from the fields, for a softmax and a binary head,
// batch after batch into the same buffers, the data set's last record
// included.
TEST_F(ModelTest, PackedBagsOfWordsLoadAsTheFieldsDo) {
  for (HeadType head : {HeadType::kSoftmax, HeadType::kBinary}) {
    const int32_t classes = head == HeadType::kSoftmax ? 4 : 2;
    const int64_t outputs = head == HeadType::kSoftmax ? 4 : 1;
    // Every length in turn; ids mapped to 4096 rows.
    const Dataset d = testdata::OneBagData("tokens", 200, classes, 7, 10000, testdata::BagWeights::kNone,
                                          [](int64_t r) { return r % 35; });
    ModelOptions opts;
    opts.head = head;
    opts.interaction = Interaction::kConcat;
    opts.tables = {{"tokens", 4096, 3, false, false, 0.5f}};
    opts.sparse = {{"tokens", "tokens", Pooling::kMean, true}};
    opts.layers = {{"dense", outputs, Activation::kNone}};
    std::vector<std::vector<int32_t>> batches = SpreadBatches(d.count, 16, 37);
    batches.push_back({static_cast<int32_t>(d.count - 1)});
    batches.push_back({34, static_cast<int32_t>(d.count - 1), 0, 33});
    const std::optional<PackedRecords> packed =
        ExpectPackedLoadsAsFields(opts, d, /*batch=*/16, outputs, batches);
    ASSERT_TRUE(packed.has_value()) << static_cast<int>(head);
    EXPECT_TRUE(packed->narrow_ids);
    EXPECT_TRUE(packed->inline_label);
    EXPECT_EQ(packed->head_words, 1);
    EXPECT_EQ(packed->slot_load, PackedRecords::SlotLoad::kIds);
    // 64-byte slots hold 14 ids and 128-byte ones 30: the longer bags go
    // after them, and PackRecords counts them.
    EXPECT_GT(overflowing_[64], overflowing_[128]);
    EXPECT_GT(overflowing_[128], 0);
    const std::unique_ptr<Model> m = Make(opts, d, 16);
    ASSERT_TRUE(m);
    for (int64_t stride : {64, 128}) EXPECT_EQ(m->PackRecords(d, stride)->overflow_blocks, overflowing_[stride]);
  }
}

// PackRecords decides once how batches load (PackedRecords::slot_load):
// slot by slot only for one bag and one label a record with nothing else
// (the text and libsvm configs); record by record for a multi-label data
// set, a regression target, dense values, or blocks one after the other.
TEST_F(ModelTest, SlotLoadsAreChosenOnlyForOneBagAndOneLabel) {
  using SlotLoad = PackedRecords::SlotLoad;
  auto slot_load = [&](HeadType head, const Dataset& d, int64_t stride) {
    ModelOptions opts;
    opts.head = head;
    opts.interaction = Interaction::kConcat;
    opts.tables = {{"tokens", 4096, 3, false, false, 0.5f}};
    opts.sparse = {{"tokens", "tokens", Pooling::kMean, true}};
    if (d.dense_dim > 0) opts.bottom = {{"dense", 4, Activation::kRelu}};
    opts.layers = {{"dense", head == HeadType::kSoftmax ? 4 : 1, Activation::kNone}};
    const std::unique_ptr<Model> m = Make(opts, d, 8);
    EXPECT_TRUE(m);
    if (!m) return SlotLoad::kRecords;
    const std::optional<PackedRecords> packed = m->PackRecords(d, stride);
    EXPECT_TRUE(packed.has_value() && packed->has_ids());
    return packed ? packed->slot_load : SlotLoad::kRecords;
  };
  const Dataset bags = testdata::OneBagData("tokens", 40, 4, 3, 10000, testdata::BagWeights::kNone,
                                            [](int64_t r) { return r % 9; });
  EXPECT_EQ(slot_load(HeadType::kSoftmax, bags, 64), SlotLoad::kIds);
  EXPECT_EQ(slot_load(HeadType::kSoftmax, bags, 0), SlotLoad::kRecords);
  Dataset multi = bags;
  multi.label_offsets.push_back(0);
  for (int64_t r = 0; r < multi.count; ++r) {
    multi.label_sets.push_back(multi.labels[r]);
    multi.label_offsets.push_back(static_cast<int64_t>(multi.label_sets.size()));
  }
  EXPECT_EQ(slot_load(HeadType::kSoftmax, multi, 64), SlotLoad::kRecords);
  Dataset target = bags;
  target.labels.clear();
  target.num_classes = 0;
  for (int64_t r = 0; r < target.count; ++r) target.targets.push_back(0.25f * static_cast<float>(r % 4));
  EXPECT_EQ(slot_load(HeadType::kRegression, target, 64), SlotLoad::kRecords);
  Dataset dense = bags;
  dense.dense_dim = 2;
  dense.dense.assign(static_cast<size_t>(dense.count) * 2, 0.5f);
  EXPECT_EQ(slot_load(HeadType::kSoftmax, dense, 64), SlotLoad::kRecords);
}

// Weighted features (sparse_logreg's layout: one weighted lookup, no dense
// values, narrow ids and the label in the block, which LoadBatch copies slot
// by slot, with no branch on a record's count): bags of 0 to 34 weighted
// ids, in slots that hold all of them, some or few (the rest after the
// slots), and blocks one after the other, load as from the fields, weights
// included, for a binary and a softmax head, batch after batch into the
// same buffers, the data set's last record included. Weights of 3 decimals
// are coded in the ids' words (a slot's ids and weights decoded by
// DecodeCodedEntries, a block's one after the other by LoadPackedIds);
// others follow the ids as floats.
TEST_F(ModelTest, PackedWeightedFeaturesLoadAsTheFieldsDo) {
  using testdata::BagWeights;
  for (BagWeights weights : {BagWeights::kDecimals, BagWeights::kReciprocals}) {
    const bool coded = weights == BagWeights::kDecimals;
    for (HeadType head : {HeadType::kBinary, HeadType::kSoftmax}) {
      SCOPED_TRACE(absl::StrCat(coded ? "coded" : "floats", ", head ", static_cast<int>(head)));
      const int32_t classes = head == HeadType::kSoftmax ? 3 : 2;
      const int64_t outputs = head == HeadType::kSoftmax ? 3 : 1;
      // Every length, in a scattered order; ids mapped to 2^20 rows.
      const Dataset d =
          testdata::OneBagData("features", 210, classes, 8, 3000000, weights, [](int64_t r) { return (r * 13) % 35; });
      ModelOptions opts;
      opts.head = head;
      opts.interaction = Interaction::kConcat;
      opts.tables = {{"features", 1 << 20, 1, false, false, 0.5f}};
      opts.sparse = {{"features", "features", Pooling::kSum, true}};
      opts.layers = {{"dense", outputs, Activation::kNone}};
      std::vector<std::vector<int32_t>> batches = SpreadBatches(d.count, 32, 41);
      batches.push_back({static_cast<int32_t>(d.count - 1)});
      batches.push_back({34, static_cast<int32_t>(d.count - 1), 0, 33, 34});
      const std::optional<PackedRecords> packed = ExpectPackedLoadsAsFields(opts, d, /*batch=*/32, outputs, batches);
      ASSERT_TRUE(packed.has_value());
      EXPECT_TRUE(packed->narrow_ids);
      EXPECT_TRUE(packed->inline_label);
      ASSERT_EQ(packed->weighted.size(), 1u);
      EXPECT_TRUE(packed->weighted[0]);
      ASSERT_EQ(packed->weight_codes.size(), 1u);
      EXPECT_EQ(packed->weight_codes[0].coded(), coded);
      // In slots, loaded slot by slot, the coded words or the ids then the
      // weights.
      const std::unique_ptr<Model> m = Make(opts, d, 32);
      ASSERT_TRUE(m);
      EXPECT_EQ(m->PackRecords(d, 128)->slot_load,
                coded ? PackedRecords::SlotLoad::kCodedWeights : PackedRecords::SlotLoad::kIdsThenWeights);
      if (coded) {
        EXPECT_EQ(packed->weight_codes[0].id_bits, 20);
        EXPECT_EQ(packed->weight_codes[0].decimals, 3);
      }
      EXPECT_EQ(packed->head_words, 1);
      // 64-byte slots hold 7 weighted ids (14 coded) and 128-byte ones 15
      // (30): the longer bags go after them.
      EXPECT_GT(overflowing_[64], overflowing_[128]);
      EXPECT_GT(overflowing_[128], 0);
    }
  }
}

// The weight codes PackRecords chooses (PackedRecords::WeightCode::Of): the
// fewest decimals that give every weight back, in the bits the ids leave.
TEST(WeightCode, TakesTheFewestDecimalsThatGiveEveryWeightBack) {
  using Code = PackedRecords::WeightCode;
  auto expect_code = [](const std::vector<float>& weights, int64_t rows, int id_bits, int decimals) {
    const Code code = Code::Of(weights, rows);
    ASSERT_TRUE(code.coded()) << rows << " rows";
    EXPECT_EQ(code.id_bits, id_bits) << rows << " rows";
    EXPECT_EQ(code.decimals, decimals) << rows << " rows";
    // Every weight and the largest id come back from their word.
    for (float w : weights) {
      for (uint32_t id : {uint32_t{0}, static_cast<uint32_t>(rows - 1)}) {
        const uint32_t word = code.Word(id, w);
        EXPECT_EQ(code.Id(word), id);
        EXPECT_EQ(std::bit_cast<uint32_t>(code.Weight(word)), std::bit_cast<uint32_t>(w)) << w;
      }
    }
  };
  // Binary features, counts, halves, libsvm's 3 decimals, 6.
  expect_code({1.0f, 1.0f}, 1 << 20, 20, 0);
  expect_code({0.0f, 1.0f, 7.0f, 4095.0f}, 1 << 20, 20, 0);
  expect_code({0.5f, 1.5f, 2.0f}, 1 << 20, 20, 1);
  expect_code({0.299f, 0.124f, 0.079f, 1.0f, 0.001f, 4.095f}, 1048576, 20, 3);
  expect_code({0.000001f, 0.123456f}, 2000, 11, 6);
  // The ids' bits: those of the largest row, at least one.
  expect_code({1.0f}, 1, 1, 0);
  expect_code({1.0f}, 2, 1, 0);
  expect_code({1.0f}, 3, 2, 0);
  expect_code({1.0f}, 1048577, 21, 0);
  expect_code({1.0f}, int64_t{1} << 31, 31, 0);
  // Not coded: a whole number too large for the bits left (4096 in 12;
  // 4.096 needs 4096 too), weights no 10^-d gives back (a third, 6
  // decimals and more, a float near but not at 0.1), negative, -0, not
  // finite; ids of 32 bits, or more rows than narrow ids hold.
  for (const std::vector<float>& weights :
       std::vector<std::vector<float>>{{4096.0f},
                                       {4.096f},
                                       {1.0f / 3.0f},
                                       {0.0000001f},
                                       {std::nextafter(0.1f, 1.0f)},
                                       {0.5f, -0.5f},
                                       {-0.0f},
                                       {1.0f, std::numeric_limits<float>::infinity()},
                                       {std::numeric_limits<float>::quiet_NaN()}}) {
    EXPECT_FALSE(Code::Of(weights, 1 << 20).coded()) << weights[0];
  }
  EXPECT_TRUE(Code::Of({1.0f}, int64_t{1} << 31).coded());
  EXPECT_FALSE(Code::Of({1.0f}, int64_t{1} << 32).coded());
  EXPECT_FALSE(Code::Of({1.0f}, (int64_t{1} << 32) + 1).coded());
  EXPECT_FALSE(Code::Of({1.0f}, 0).coded());
  EXPECT_FALSE(Code::Of({2.0f}, int64_t{1} << 31).coded());  // one bit left
}

// A coded weight is the float a parser reads from its decimal text: for
// every whole k the bits above a 2^20-row table's ids hold, and every
// number of decimals, k * 10^-d rounded once is the float nearest k / 10^d.
TEST(WeightCode, DecodesToTheParsedDecimal) {
  for (int d = 0; d <= PackedRecords::WeightCode::kMaxDecimals; ++d) {
    double unit = 1;
    for (int i = 0; i < d; ++i) unit /= 10;
    for (uint32_t k = 0; k < (uint32_t{1} << 12); ++k) {
      // k / 10^d as decimal text: its digits, the point d from the right.
      std::string text = std::to_string(k);
      if (d > 0) {
        if (text.size() <= static_cast<size_t>(d)) text.insert(0, static_cast<size_t>(d) + 1 - text.size(), '0');
        text.insert(text.size() - d, ".");
      }
      float parsed = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), parsed);
      ASSERT_EQ(ec, std::errc()) << text;
      ASSERT_EQ(std::bit_cast<uint32_t>(PackedRecords::WeightCode::Decode(k, unit)), std::bit_cast<uint32_t>(parsed))
          << text;
    }
  }
}

// PackRecords' layout: the fewest lines a load touches, within twice the
// memory of blocks one after the other.
TEST(PackedLayout, ChoosesTheStrideWhoseLoadsTouchTheFewestLines) {
  auto histogram = [](std::initializer_list<std::pair<int64_t, int64_t>> counts) {
    std::vector<int64_t> h(Model::kStrideHistogramWords + 1, 0);
    uint64_t total = 0;
    for (auto [words, n] : counts) {
      h[std::min<int64_t>(words, static_cast<int64_t>(h.size()) - 1)] += n;
      total += static_cast<uint64_t>(words * n);
    }
    return std::make_pair(h, total);
  };
  auto choose = [&](std::initializer_list<std::pair<int64_t, int64_t>> counts) {
    auto [h, total] = histogram(counts);
    return Model::ChooseStrideWords(h, total);
  };
  // The text config's records: 5..30 narrow ids and a head word, 4..16
  // words. 128-byte slots (2 lines) beat 64-byte ones (1 line, and a block
  // after them for most records) and the blocks one after the other (their
  // start word and about 2.1 lines).
  EXPECT_EQ(choose({{4, 1}, {5, 2}, {6, 2}, {7, 2}, {8, 2}, {9, 2}, {10, 2}, {11, 2}, {12, 2}, {13, 2}, {14, 2},
                    {15, 2}, {16, 3}}),
            16);
  // DLRM's: 27 words (216 bytes) each: 256-byte slots, 4 lines, against 1 + 4.25.
  EXPECT_EQ(choose({{27, 1000}}), 32);
  // Two words each: four to a line.
  EXPECT_EQ(choose({{2, 1000}}), 2);
  // Three words: 32-byte slots, two to a line (16-byte ones would put every
  // block after them).
  EXPECT_EQ(choose({{3, 1000}}), 4);
  // sparse_logreg's: 4..32 weighted narrow ids (a word each) and a head
  // word, 5..33 words, most near 19. 192-byte slots (3 lines) would send a
  // fifth of them after the slots (3 + 0.2 * 2 * 4.3 lines a record):
  // 256-byte ones (4 lines, and only the longest after them, 4.04) beat
  // them and the blocks one after the other (4.25).
  int64_t libsvm_words = 0;
  std::vector<int64_t> libsvm_h(Model::kStrideHistogramWords + 1, 0);
  for (int64_t c = 4; c <= 32; ++c) {
    const int64_t n = 15 - std::abs(c - 18);  // the ways 4 + U(0..14) + U(0..14) makes c
    libsvm_h[c + 1] += n;
    libsvm_words += (c + 1) * n;
  }
  EXPECT_EQ(Model::ChooseStrideWords(libsvm_h, static_cast<uint64_t>(libsvm_words)), 32);
  // A long tail: short slots send the few long blocks after them (1 + 0.1
  // * 2 * 8.4 = 2.68 lines a record), fewer than slots long enough for them
  // (8 lines) or a start word for every record (3.08).
  EXPECT_EQ(choose({{4, 900}, {60, 100}}), 4);
  // Records past 512 bytes: no slots hold them, and slots plus a block
  // after them read more lines than blocks one after the other.
  EXPECT_EQ(choose({{100, 1000}}), 0);
  // Memory: 64-byte slots would hold every block of these, 1 line each,
  // but take 3.3 times the memory of the blocks one after the other; 16-byte
  // ones hold 90% of them (1.15 lines a record) in 1.25 times.
  EXPECT_EQ(choose({{1, 90}, {5, 10}}), 2);
  // No records: nothing to lay out.
  EXPECT_EQ(choose({}), 0);
  // A histogram of another length cannot tell which blocks fit: no slots.
  EXPECT_EQ(Model::ChooseStrideWords(std::vector<int64_t>(Model::kMaxStrideWords + 1, 10), 10 * 2080), 0);
}

// PackRecords lays a data set out as ChooseStrideWords says: text-like
// records (one bag of 5..30 ids, 32-bit, and the label: 4..16 words) in
// 128-byte slots; records of 200 ids (over 512 bytes) one after the other.
// Blocks all of one size (the one-id layout's) get the first slot size
// that holds them: a power of two up to a line, then whole lines, none
// after the slots. PackRecords relies on it for the one-id layout.
TEST(PackedLayout, BlocksOfOneSizeGetTheFirstSlotThatHoldsThem) {
  for (int64_t w = 1; w <= Model::kMaxStrideWords; ++w) {
    std::vector<int64_t> histogram(Model::kStrideHistogramWords + 1, 0);
    histogram[w] = 1000;
    const int64_t first_holding = w <= 2 ? 2 : w <= 4 ? 4 : w <= 8 ? 8 : (w + 7) / 8 * 8;
    EXPECT_EQ(Model::ChooseStrideWords(histogram, static_cast<uint64_t>(1000 * w)), first_holding) << w << " words";
  }
}

TEST(PackedLayout, PackRecordsUsesTheChosenStride) {
  for (const auto& [min_ids, max_ids, want] : {std::tuple<int, int, int64_t>{5, 30, 16}, {200, 200, 0}}) {
    // (Init-captures: clang does not capture structured bindings.)
    const Dataset d =
        testdata::OneBagData("tokens", 260, 4, 9, 5000, testdata::BagWeights::kNone, [lo = min_ids, hi = max_ids](int64_t r) {
          return static_cast<int64_t>(lo) + r % (hi - lo + 1);
        });
    ModelOptions opts;
    opts.tables = {{"tokens", 5000, 8, false, false, 0.125f}};
    opts.sparse = {{"tokens", "tokens", Pooling::kMean, false}};
    opts.layers = {{"dense", 4, Activation::kNone}};
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    auto m = Model::Create(opts, DataShape::Of(d), 8, engine, 1);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::optional<PackedRecords> packed = (*m)->PackRecords(d);
    ASSERT_TRUE(packed.has_value());
    EXPECT_TRUE(packed->narrow_ids);
    EXPECT_EQ(packed->stride_words, want) << min_ids << ".." << max_ids << " ids";
    EXPECT_EQ(packed->start.empty(), want > 0);
  }
}

// A weighted lookup whose data carries no weights weighs every id 1: the
// same logits, gradients and row gradients, bit for bit, as the same data
// with every weight written out as 1.
TEST_F(ModelTest, AWeightedFieldWithoutWeightsWeighsEachIdOne) {
  Dataset none = SmallData(12, 5, 3, false, 9, /*max_b=*/4);
  none.fields[0].weights.clear();
  Dataset ones = none;
  ones.fields[0].weights.assign(ones.fields[0].ids.size(), 1.0f);
  const ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, true, true);
  ASSERT_TRUE(opts.sparse[0].weighted);
  constexpr int64_t kBatch = 5, kValid = 4;
  auto a = Model::Create(opts, DataShape::Of(none), kBatch, engine_, 1);
  auto b = Model::Create(opts, DataShape::Of(ones), kBatch, engine_, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const int32_t records[] = {7, 2, 11, 2};
  (*a)->LoadBatch(none, records, kValid);
  (*b)->LoadBatch(ones, records, kValid);
  const StepResult ra = TrainStep(**a, kValid), rb = TrainStep(**b, kValid);
  EXPECT_EQ(Bits(ra.logits), Bits(rb.logits));
  EXPECT_EQ(Bits(ra.grads), Bits(rb.grads));
  EXPECT_EQ(Bits(ra.row_grads), Bits(rb.row_grads));
  // And the weights do count where they are not all 1.
  Dataset halves = ones;
  halves.fields[0].weights.assign(halves.fields[0].ids.size(), 0.5f);
  (*b)->LoadBatch(halves, records, kValid);
  (*b)->Forward(true, stream_);
  EXPECT_NE(Bits(std::vector<float>((*b)->logits(), (*b)->logits() + kBatch * 3)), Bits(ra.logits));
}

// Dense values that are all k / 255.0f (IDX pixels) pack as bytes and load
// as the very same floats; other values are not packed. The bytes are
// checked and written kPackDenseBytes values at a time, on every hardware
// thread: a set of 9 records, and one of several parts, whose records on
// either side of the first part's edge and whose last are loaded; one value
// off the grid (or negative zero) in any part, the last value included,
// leaves them all as floats.
TEST_F(ModelTest, DenseBytesLoadAsTheSameFloats) {
  constexpr int64_t kDim = 37;  // not a multiple of any vector width
  constexpr int32_t kPartRecord = static_cast<int32_t>(Model::kPackDenseBytes / kDim);  // spans the first edge
  for (const int64_t count : {int64_t{9}, static_cast<int64_t>(2 * Model::kPackDenseBytes) / kDim + 5}) {
    Dataset d;
    d.count = count;
    d.dense_dim = kDim;
    d.num_classes = 2;
    for (int64_t i = 0; i < d.count * d.dense_dim; ++i) d.dense.push_back(static_cast<float>((i * 37) % 256) / 255.0f);
    for (int64_t r = 0; r < d.count; ++r) d.labels.push_back(static_cast<int32_t>(r % 2));
    ModelOptions m;
    m.head = HeadType::kSoftmax;
    m.layers = {{"dense", 2, Activation::kNone}};
    const std::unique_ptr<Model> packed_model = Make(m, d, 4), plain_model = Make(m, d, 4);
    ASSERT_TRUE(packed_model && plain_model);
    const std::optional<PackedRecords> packed = packed_model->PackRecords(d);
    ASSERT_TRUE(packed.has_value()) << count;
    EXPECT_TRUE(packed->has_dense_bytes()) << count;
    EXPECT_FALSE(packed->has_ids()) << count;
    const int32_t last = static_cast<int32_t>(count - 1);
    const std::vector<int32_t> records =
        count > kPartRecord ? std::vector<int32_t>{last, 0, kPartRecord, kPartRecord + 1} : std::vector<int32_t>{8, 0, 3, 3};
    packed_model->LoadBatch(d, records.data(), 4, &*packed);
    plain_model->LoadBatch(d, records.data(), 4);
    for (Model* x : {packed_model.get(), plain_model.get()}) {
      for (int k = 0; k < x->num_variables(); ++k) std::fill(x->params(k), x->params(k) + x->variable(k).size(), 0.25f);
      x->Forward(false, stream_);
    }
    for (int i = 0; i < 4 * 2; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(packed_model->logits()[i]), std::bit_cast<uint32_t>(plain_model->logits()[i]))
          << count;
    }
    std::vector<size_t> off_at = {40, d.dense.size() - 1};
    if (count > kPartRecord) off_at.push_back(Model::kPackDenseBytes + 1);
    for (const size_t at : off_at) {
      for (float bad : {0.3f, -0.0f, 2.0f}) {
        Dataset off = d;
        off.dense[at] = bad;
        EXPECT_FALSE(packed_model->PackRecords(off).has_value()) << count << " " << at << " " << bad;
      }
    }
  }
}

// PackRecords writes its blocks kPackRange records at a time, on every
// hardware thread, each range placing its blocks one after another (or
// past the slots) after the ranges before it: more records than two
// ranges, in every layout (blocks past 64- and 128-byte slots included,
// and the one-id layout), load as from the fields, the records on either
// side of each range's edge and the last one included.
TEST_F(ModelTest, PackedRecordsOfSeveralRangesLoadAsTheFieldsDo) {
  constexpr int64_t kRange = Model::kPackRange;
  const int64_t count = 2 * kRange + 1000;
  std::vector<std::vector<int32_t>> batches = SpreadBatches(count, 6, 1237);
  for (const int64_t edge : {kRange, 2 * kRange}) {
    batches.push_back({static_cast<int32_t>(edge - 1), static_cast<int32_t>(edge), static_cast<int32_t>(edge + 1),
                       static_cast<int32_t>(edge - 2), 0, static_cast<int32_t>(count - 1)});
  }
  const Dataset d = SmallData(count, 2, 3, false, 23, /*max_b=*/13);
  const ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, false, true);
  EXPECT_TRUE(ExpectPackedLoadsAsFields(opts, d, /*batch=*/6, /*outputs=*/3, batches).has_value());
  for (int64_t stride : {64, 128}) {
    EXPECT_GT(overflowing_[stride], count / 10) << stride;  // past the slots, from every range
    EXPECT_LT(overflowing_[stride], count) << stride;
  }
  ModelOptions one_id = SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, /*wide=*/true, /*bottom=*/true);
  one_id.tables[1].dynamic = false;
  const std::optional<PackedRecords> packed =
      ExpectPackedLoadsAsFields(one_id, OneIdData(count, 2, 2, 29, /*missing=*/4), 6, 1, batches);
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(packed->slot_load, PackedRecords::SlotLoad::kOneIdBags);
}

// (interaction, head, wide, bottom)
using GradParam = std::tuple<Interaction, HeadType, bool, bool>;

class ModelGradientTest : public ModelTest, public ::testing::WithParamInterface<GradParam> {};

TEST_P(ModelGradientTest, MatchesFiniteDifferences) {
  const auto [interaction, head, wide, bottom] = GetParam();
  const int32_t classes = head == HeadType::kSoftmax ? 3 : (head == HeadType::kBinary ? 2 : 0);
  const int64_t outputs = head == HeadType::kSoftmax ? 3 : 1;
  const int64_t dense = bottom ? 5 : 3;  // without a bottom the dense vector must be as wide as the embeddings (dot)
  const Dataset d = SmallData(8, dense, classes, head == HeadType::kSoftmax, 7);
  const ModelOptions opts = SmallOptions(interaction, head, outputs, wide, bottom);
  constexpr int64_t kBatch = 5, kValid = 4;
  auto model = Model::Create(opts, DataShape::Of(d), kBatch, engine_, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-0.8f, 0.8f);
  for (int v = 0; v < m.num_variables(); ++v) {
    for (int64_t i = 0; i < m.variable(v).size(); ++i) m.params(v)[i] = u(rng);
  }
  const int32_t records[] = {3, 1, 6, 0};
  m.LoadBatch(d, records, kValid);
  for (int l = 0; l < m.num_lookups(); ++l) {
    for (size_t i = 0; i < m.ids(l).size() * m.lookup(l).dim; ++i) m.rows(l)[i] = u(rng);
  }
  auto loss = [&] {
    m.Forward(false, stream_);
    return m.Loss(kValid).loss_sum / kValid;
  };
  m.Forward(true, stream_);
  m.Backward(kValid, stream_);
  std::vector<std::vector<float>> grads, row_grads;
  for (int v = 0; v < m.num_variables(); ++v) grads.emplace_back(m.grads(v), m.grads(v) + m.variable(v).size());
  for (int l = 0; l < m.num_lookups(); ++l) {
    row_grads.emplace_back(m.row_grads(l), m.row_grads(l) + m.ids(l).size() * m.lookup(l).dim);
  }
  constexpr double kEps = 1e-3;
  auto check = [&](float* p, float analytic, const std::string& what) {
    const float saved = *p;
    *p = static_cast<float>(saved + kEps);
    const double lp = loss();
    *p = static_cast<float>(saved - kEps);
    const double lm = loss();
    *p = saved;
    const double numeric = (lp - lm) / (2 * kEps);
    EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << what;
  };
  for (int v = 0; v < m.num_variables(); ++v) {
    for (int64_t i = 0; i < m.variable(v).size(); i += 3) {
      check(m.params(v) + i, grads[v][i], absl::StrCat(m.variable(v).name, "[", i, "]"));
    }
  }
  int checked_rows = 0;
  for (int l = 0; l < m.num_lookups(); ++l) {
    for (size_t i = 0; i < row_grads[l].size(); ++i) {
      check(m.rows(l) + i, row_grads[l][i], absl::StrCat("lookup ", l, " (", m.lookup(l).field, ") row value ", i));
      ++checked_rows;
    }
  }
  EXPECT_GT(checked_rows, 10);
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelGradientTest,
    ::testing::Values(GradParam{Interaction::kConcat, HeadType::kBinary, false, true},
                      GradParam{Interaction::kConcat, HeadType::kSoftmax, true, true},
                      GradParam{Interaction::kConcat, HeadType::kRegression, true, false},
                      GradParam{Interaction::kDot, HeadType::kBinary, true, true},
                      GradParam{Interaction::kDot, HeadType::kSoftmax, false, false},
                      GradParam{Interaction::kDotNoDense, HeadType::kBinary, false, true},
                      GradParam{Interaction::kDotNoDense, HeadType::kRegression, true, true}));

// LossReduction: with kSum a part's gradients are those of the mean loss
// times the batch's records (4 of 5 here, the padding excluded); the other
// part's are unchanged. Wide rows follow the sparse reduction.
TEST_F(ModelTest, GradientReductionScalesEachPartByTheRecords) {
  const Dataset d = SmallData(8, 5, 3, /*multi_label=*/false, 3);
  const ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kSoftmax, 3, /*wide=*/true, /*bottom=*/true);
  constexpr int64_t kBatch = 5, kValid = 4;
  auto model = Model::Create(opts, DataShape::Of(d), kBatch, engine_, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-0.8f, 0.8f);
  for (int v = 0; v < m.num_variables(); ++v) {
    for (int64_t i = 0; i < m.variable(v).size(); ++i) m.params(v)[i] = u(rng);
  }
  const int32_t records[] = {2, 5, 7, 1};
  m.LoadBatch(d, records, kValid);
  for (int l = 0; l < m.num_lookups(); ++l) {
    for (size_t i = 0; i < m.ids(l).size() * m.lookup(l).dim; ++i) m.rows(l)[i] = u(rng);
  }
  struct Grads {
    std::vector<std::vector<float>> dense, rows;
    double loss_sum = 0;
  };
  auto backward = [&](GradientReduction reduction) {
    m.Forward(true, stream_);
    Grads g;
    g.loss_sum = m.Backward(kValid, stream_, reduction).loss_sum;
    for (int v = 0; v < m.num_variables(); ++v) g.dense.emplace_back(m.grads(v), m.grads(v) + m.variable(v).size());
    for (int l = 0; l < m.num_lookups(); ++l) {
      g.rows.emplace_back(m.row_grads(l), m.row_grads(l) + m.ids(l).size() * m.lookup(l).dim);
    }
    return g;
  };
  constexpr LossReduction kMean = LossReduction::kSumOverBatchSize, kSum = LossReduction::kSum;
  const Grads mean = backward({});
  const Grads explicit_mean = backward({kMean, kMean});
  EXPECT_EQ(explicit_mean.dense, mean.dense);  // the default is the mean, bit for bit
  EXPECT_EQ(explicit_mean.rows, mean.rows);
  double largest = 0;
  for (const auto& v : mean.dense) {
    for (float x : v) largest = std::max(largest, std::abs(static_cast<double>(x)));
  }
  ASSERT_GT(largest, 1e-3);  // the comparison below is not between zeros
  auto expect_scaled = [](const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& base,
                          double factor, const std::string& what) {
    ASSERT_EQ(got.size(), base.size());
    for (size_t v = 0; v < got.size(); ++v) {
      ASSERT_EQ(got[v].size(), base[v].size());
      for (size_t i = 0; i < got[v].size(); ++i) {
        const double want = factor * base[v][i];
        ASSERT_NEAR(got[v][i], want, 1e-6 + 1e-5 * std::abs(want)) << what << " " << v << "[" << i << "]";
      }
    }
  };
  for (const GradientReduction r : {GradientReduction{kSum, kSum}, GradientReduction{kMean, kSum},
                                    GradientReduction{kSum, kMean}}) {
    const Grads g = backward(r);
    const std::string what = absl::StrCat("dense ", LossReductionName(r.dense), ", sparse ", LossReductionName(r.sparse));
    expect_scaled(g.dense, mean.dense, r.dense == kSum ? kValid : 1, what + ": variable");
    expect_scaled(g.rows, mean.rows, r.sparse == kSum ? kValid : 1, what + ": lookup");
    EXPECT_EQ(g.loss_sum, mean.loss_sum) << what;  // the reported loss does not change
  }
}

TEST_F(ModelTest, DropoutOnlyWhileTraining) {
  const Dataset d = SmallData(8, 5, 2, false, 5);
  ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, true);
  opts.layers = {{"dense", 16, Activation::kTanh, 0.5f}, {"dense", 1, Activation::kNone}};
  auto model = Model::Create(opts, DataShape::Of(d), 4, engine_, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (int v = 0; v < m.num_variables(); ++v) {
    for (int64_t i = 0; i < m.variable(v).size(); ++i) m.params(v)[i] = u(rng);
  }
  m.LoadRange(d, 0, 4);
  for (int l = 0; l < m.num_lookups(); ++l) {
    for (size_t i = 0; i < m.ids(l).size() * m.lookup(l).dim; ++i) m.rows(l)[i] = u(rng);
  }
  m.Forward(false, stream_);
  const std::vector<float> eval1(m.logits(), m.logits() + 4);
  m.Forward(false, stream_);
  EXPECT_EQ(std::vector<float>(m.logits(), m.logits() + 4), eval1);  // deterministic without dropout
  m.Forward(true, stream_);
  const std::vector<float> train1(m.logits(), m.logits() + 4);
  m.Forward(true, stream_);
  const std::vector<float> train2(m.logits(), m.logits() + 4);
  EXPECT_NE(train1, eval1);
  EXPECT_NE(train1, train2);  // a new mask each step
}

// The rows are asked for again before the fused update only where the top
// tower moves more than a core's L2 between the pooling and the update.
TEST_F(ModelTest, RowsArePrefetchedForTheUpdateOnlyBehindALargeTopTower) {
  const Dataset d = SmallData(8, 5, 2, false, 5);
  ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, true);
  opts.layers = {{"dense", 8, Activation::kRelu}, {"dense", 1, Activation::kNone}};
  auto small = Model::Create(opts, DataShape::Of(d), 4, engine_, 1);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE((*small)->prefetches_rows_for_update());
  // Parameters and gradients of a tower 16x wider than L2 holds (its
  // second layer alone is `width` squared floats of each).
  const int64_t width = static_cast<int64_t>(std::sqrt(static_cast<double>(L2CacheBytes()) * 16 / 8));
  opts.layers = {{"dense", width, Activation::kRelu}, {"dense", width, Activation::kRelu}, {"dense", 1, Activation::kNone}};
  auto large = Model::Create(opts, DataShape::Of(d), 4, engine_, 1);
  ASSERT_TRUE(large.ok()) << large.status();
  EXPECT_TRUE((*large)->prefetches_rows_for_update());
}

// The dense parameters (the worker's copy) and their gradients are slices
// of one block, each on a cache line of its own and none overlapping another,
// all zero; a block of 256 KiB or more starts on a 2 MiB page
// (HugePageAllocator), so the layers and the push read them through a few
// TLB entries. Under bf16 the kernels' copies are bf16 slices instead.
TEST_F(ModelTest, DenseParametersAndGradientsAreSlicesOfOneBlockOnHugePages) {
  const Dataset d = SmallData(8, 5, 2, false, 5);
  ModelOptions opts = SmallOptions(Interaction::kConcat, HeadType::kBinary, 1, false, true);
  // The second kernel alone is 256 KiB of params and as much of gradients.
  opts.layers = {{"dense", 256, Activation::kRelu}, {"dense", 256, Activation::kRelu}, {"dense", 1, Activation::kNone}};
  for (const Precision precision : {Precision::kF32, Precision::kBf16}) {
    SCOPED_TRACE(precision == Precision::kF32 ? "f32" : "bf16");
    if (precision == Precision::kBf16 && !DetectCpuFeatures().bf16()) continue;  // no bf16 matmul here
    opts.precision = precision;
    absl::StatusOr<std::unique_ptr<Model>> made = Model::Create(opts, DataShape::Of(d), 4, engine_, 1);
    ASSERT_TRUE(made.ok()) << made.status();
    Model& m = **made;
    struct Slice {
      uintptr_t begin, end;
      std::string what;
    };
    std::vector<Slice> f32, bf16;
    for (int v = 0; v < m.num_variables(); ++v) {
      const auto n = static_cast<size_t>(m.variable(v).size());
      const bool kernel = absl::EndsWith(m.variable(v).name, "/kernel");
      if (precision == Precision::kBf16 && kernel) {
        EXPECT_EQ(m.params(v), nullptr) << v;
        const uint16_t* p = m.params_bf16(v);
        ASSERT_NE(p, nullptr) << v;
        EXPECT_TRUE(std::all_of(p, p + n, [](uint16_t x) { return x == 0; })) << v;
        bf16.push_back({reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p + n), absl::StrCat("bf16 ", v)});
      } else {
        EXPECT_EQ(m.params_bf16(v), nullptr) << v;
        const float* p = m.params(v);
        ASSERT_NE(p, nullptr) << v;
        EXPECT_TRUE(std::all_of(p, p + n, [](float x) { return x == 0.0f; })) << v;
        f32.push_back({reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p + n), absl::StrCat("params ", v)});
      }
    }
    for (int v = 0; v < m.num_variables(); ++v) {
      const float* g = m.grads(v);
      const auto n = static_cast<size_t>(m.variable(v).size());
      ASSERT_NE(g, nullptr) << v;
      EXPECT_TRUE(std::all_of(g, g + n, [](float x) { return x == 0.0f; })) << v;
      f32.push_back({reinterpret_cast<uintptr_t>(g), reinterpret_cast<uintptr_t>(g + n), absl::StrCat("grads ", v)});
    }
    for (std::vector<Slice>* slices : {&f32, &bf16}) {
      if (slices->empty()) continue;
      // In order in one block: each starts on a line at or after the last one's end.
      for (size_t i = 0; i < slices->size(); ++i) {
        const Slice& s = (*slices)[i];
        EXPECT_EQ(s.begin % 64, 0u) << s.what;
        if (i > 0) {
          EXPECT_GE(s.begin, (*slices)[i - 1].end) << s.what;
        }
      }
      const uintptr_t bytes = slices->back().end - slices->front().begin;
      if (OnHugePages(bytes)) {
        EXPECT_EQ(slices->front().begin % kHugePageBytes, 0u) << bytes << " bytes";
      }
    }
    EXPECT_TRUE(OnHugePages(f32.back().end - f32.front().begin));
#ifdef SHARDWILD_ASAN
    // A line after each slice is poisoned: a write past a slice is still
    // caught, also where the slice ends on a line (the 256 x 256 kernel).
    for (int v = 0; v < m.num_variables(); ++v) {
      if (m.variable(v).size() != 256 * 256) continue;
      float* const grads = const_cast<float*>(m.grads(v));
      const int64_t end = m.variable(v).size();
      EXPECT_DEATH({ static_cast<volatile float*>(grads)[end] = 1.0f; }, "use-after-poison");
    }
#endif
  }
}

}  // namespace
}  // namespace shardwild
