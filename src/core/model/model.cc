#include "core/model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/data/data_kernels.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/sparse_layers.h"
#include "core/base/sanitizers.h"
#include "core/base/cpu_features.h"
#include "core/base/parallel_for.h"
#include "core/base/prefetch.h"
#include "core/base/random.h"
#include "core/base/step_clock.h"
#include "core/base/status.h"

#ifdef SHARDWILD_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace shardwild {
namespace {

absl::Status Bad(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", what));
}

// The id the store sees: a static table takes the raw id modulo its rows
// (DLRM's hex % max_ind_range); a dynamic one takes it as is, but for the
// reserved empty-slot id 2^64-1, which moves to its neighbour.
inline uint64_t StoreId(uint64_t raw, int64_t static_rows) {
  if (static_rows > 0) return raw % static_cast<uint64_t>(static_rows);
  return raw == ~uint64_t{0} ? ~uint64_t{0} - 1 : raw;
}

void AddTowerVariables(const std::string& prefix, int64_t in, const std::vector<LayerOptions>& layers,
                       std::vector<VariableSpec>* specs) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const int64_t out = layers[i].units;
    specs->push_back(VariableSpec{absl::StrCat(prefix, i, "/kernel"), in, out, InitKind::kGlorotUniform, in, out});
    specs->push_back(VariableSpec{absl::StrCat(prefix, i, "/bias"), out, 1, InitKind::kZeros, 0, 0});
    in = out;
  }
}

}  // namespace

DataShape DataShape::Of(const Dataset& data) {
  DataShape s;
  s.dense_dim = data.dense_dim;
  s.num_classes = data.num_classes;
  for (const SparseField& f : data.fields) s.fields.push_back(f.name);
  return s;
}

// Slices of the given sizes, each starting on a cache line, of one zeroed
// block of *arena (which they then point into, so it must not change),
// allocated by HugePageAllocator; a slice of size 0 is empty, with no data.
// Under AddressSanitizer each slice is followed by a poisoned line, so that
// a layer that writes past its slice is still caught, as it was when each
// had a vector of its own.
template <typename T>
std::vector<absl::Span<T>> SlicesOnHugePages(const std::vector<size_t>& sizes, HugePageVector<T>* arena) {
  constexpr size_t kLine = 64 / sizeof(T);
#ifdef SHARDWILD_ASAN
  constexpr size_t kGuard = kLine;
#else
  constexpr size_t kGuard = 0;
#endif
  auto rounded = [](size_t n) { return n == 0 ? 0 : (n + kLine - 1) / kLine * kLine + kGuard; };
  size_t total = 0;
  for (size_t n : sizes) total += rounded(n);
  arena->assign(total, T{0});
  std::vector<absl::Span<T>> slices;
  slices.reserve(sizes.size());
  T* at = arena->data();
  for (size_t n : sizes) {
    slices.emplace_back(n > 0 ? at : nullptr, n);
#ifdef SHARDWILD_ASAN
    ASAN_POISON_MEMORY_REGION(at + n, (rounded(n) - n) * sizeof(T));
#endif
    at += rounded(n);
  }
  return slices;
}

// A stack of dense layers with optional dropout after each. Every buffer is
// allocated in Build and stays at its address.
class Model::Tower {
 public:
  // x: [batch, in], dx: where the gradient wrt x goes (nullptr = nowhere).
  // The layers' parameters and gradients are params[first_var + 2i] (kernel)
  // and [.. + 1] (bias).
  absl::Status Build(const dnnl::engine& engine, int64_t batch, int64_t in, const std::vector<LayerOptions>& layers,
                     const float* x, float* dx, std::vector<absl::Span<float>>& params,
                     std::vector<absl::Span<float>>& grads, std::vector<absl::Span<uint16_t>>& params16,
                     int first_var, Precision precision) {
    batch_ = batch;
    first_var_ = first_var;
    const size_t n = layers.size();
    y_.resize(n);
    dy_.resize(n);
    out_.resize(n);
    dout_.resize(n);
    mask_.resize(n);
    rate_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t units = layers[i].units;
      y_[i].assign(batch * units, 0.0f);
      dy_[i].assign(batch * units, 0.0f);
      rate_[i] = layers[i].dropout;
      if (rate_[i] > 0) {
        out_[i].assign(batch * units, 0.0f);
        dout_[i].assign(batch * units, 0.0f);
        mask_[i].assign(batch * units, 1.0f);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      DenseLayer::Buffers b;
      b.x = i == 0 ? x : out(i - 1);
      b.y = y_[i].data();
      b.w = params[first_var + 2 * i].data();
      if (!params16[first_var + 2 * i].empty()) b.w16 = params16[first_var + 2 * i].data();
      b.b = params[first_var + 2 * i + 1].data();
      b.dy = dy_[i].data();
      b.dx = i == 0 ? dx : dout(i - 1);
      b.dw = grads[first_var + 2 * i].data();
      b.db = grads[first_var + 2 * i + 1].data();
      SW_ASSIGN_OR_RETURN(auto layer, DenseLayer::Create(engine, batch, in, layers[i].units, layers[i].activation, b,
                                                                   precision));
      layers_.push_back(std::move(layer));
      in = layers[i].units;
    }
    return absl::OkStatus();
  }

  // The last layer's output (after its dropout) and the gradient wrt it.
  float* out() { return out(layers_.size() - 1); }
  float* dout() { return dout(layers_.size() - 1); }

  void Forward(bool training, uint64_t* rng, const dnnl::stream& stream) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->Forward(stream);
      if (rate_[i] > 0) {
        std::memcpy(out_[i].data(), y_[i].data(), y_[i].size() * sizeof(float));
        if (training) DropoutForward(out_[i].data(), mask_[i].data(), static_cast<int64_t>(out_[i].size()), rate_[i], rng);
      }
    }
  }

  // Needs dout() filled; leaves the gradient wrt x in the Build's dx. After
  // each layer (the top one first) `ready`, if set, hears that the layer's
  // kernel and bias gradients are final.
  void Backward(const dnnl::stream& stream, const std::function<void(int, int)>& ready) {
    for (size_t i = layers_.size(); i-- > 0;) {
      if (rate_[i] > 0) {
        std::memcpy(dy_[i].data(), dout_[i].data(), dy_[i].size() * sizeof(float));
        DropoutBackward(dy_[i].data(), mask_[i].data(), static_cast<int64_t>(dy_[i].size()));
      }
      layers_[i]->Backward(stream);
      if (ready) ready(first_var_ + 2 * static_cast<int>(i), 2);
    }
  }

  // Each layer's variables, {kernel, bias}, in the order Backward finishes them.
  void AddBackwardGroups(std::vector<std::vector<int>>* out) const {
    for (size_t i = layers_.size(); i-- > 0;) {
      const int v = first_var_ + 2 * static_cast<int>(i);
      out->push_back({v, v + 1});
    }
  }

  void AddForwardImpls(std::vector<std::string>* out) const {
    for (const auto& l : layers_) out->push_back(l->forward_impl());
  }

  double ForwardFlops() const {
    double f = 0;
    for (const auto& l : layers_) f += l->ForwardFlops();
    return f;
  }
  double BackwardFlops() const {
    double f = 0;
    for (const auto& l : layers_) f += l->BackwardFlops();
    return f;
  }

 private:
  float* out(size_t i) { return rate_[i] > 0 ? out_[i].data() : y_[i].data(); }
  float* dout(size_t i) { return rate_[i] > 0 ? dout_[i].data() : dy_[i].data(); }

  int64_t batch_ = 0;
  int first_var_ = 0;
  std::vector<std::unique_ptr<DenseLayer>> layers_;
  std::vector<std::vector<float>> y_, dy_, out_, dout_, mask_;
  std::vector<float> rate_;
};

Model::~Model() = default;

namespace {
// `options` with the top tower's `units: auto` resolved to the head's outputs.
ModelOptions ResolveAutoUnits(const ModelOptions& options, const DataShape& shape) {
  ModelOptions o = options;
  if (!o.layers.empty() && o.layers.back().units == 0) {
    o.layers.back().units = o.head == HeadType::kSoftmax ? shape.num_classes : 1;
  }
  return o;
}
}  // namespace

EmbeddingDecl EmbeddingDeclOf(const TableOptions& t) {
  EmbeddingDecl d{t.name, t.rows, t.dim, t.dynamic, t.evict_lru, t.init_scale, t.bf16};
  if (d.init_scale == 0) d.init_scale = 1.0f / std::sqrt(static_cast<float>(t.rows));
  return d;
}

absl::StatusOr<ModelSpec> Model::Describe(const ModelOptions& given, const DataShape& shape) {
  SW_RETURN_IF_ERROR(given.Validate());
  const ModelOptions options = ResolveAutoUnits(given, shape);
  ModelSpec spec;
  if (options.input_dim != 0 && options.input_dim != shape.dense_dim) {
    return Bad("model.input_dim", absl::StrCat("the config says ", options.input_dim, " but the data has ",
                                               shape.dense_dim, " dense features"));
  }
  switch (options.head) {
    case HeadType::kSoftmax:
      if (shape.num_classes < 2) {
        return Bad("model.head", absl::StrCat("softmax needs class labels (at least 2 classes), the data has ",
                                              shape.num_classes));
      }
      spec.outputs = shape.num_classes;
      break;
    case HeadType::kBinary:
      if (shape.num_classes != 2 && shape.num_classes != 1) {
        return Bad("model.head", absl::StrCat("binary needs 0/1 labels, the data has ", shape.num_classes, " classes"));
      }
      spec.outputs = 1;
      break;
    case HeadType::kRegression:
      if (shape.num_classes != 0) return Bad("model.head", "regression needs real-valued targets, the data has class labels");
      spec.outputs = 1;
      break;
  }
  const size_t last = options.layers.size() - 1;
  if (options.layers[last].units != spec.outputs) {
    return Bad(absl::StrCat("model.layers[", last, "].units"),
               absl::StrCat("the last layer must have one unit per output of the ", HeadTypeName(options.head),
                            " head (", spec.outputs, " here), got ", options.layers[last].units));
  }
  if (!options.bottom.empty() && shape.dense_dim == 0) {
    return Bad("model.bottom", "a bottom tower needs dense features, and the data has none");
  }
  auto field_index = [&](const std::string& key, const std::string& name) -> absl::StatusOr<int> {
    for (size_t i = 0; i < shape.fields.size(); ++i) {
      if (shape.fields[i] == name) return static_cast<int>(i);
    }
    std::string have;
    for (const std::string& f : shape.fields) absl::StrAppend(&have, have.empty() ? "" : ", ", f);
    return Bad(key, absl::StrCat("the data has no sparse field '", name, "' (it has: ",
                                 have.empty() ? "none" : have, ")"));
  };
  // Tables in the order features first use them.
  for (size_t i = 0; i < options.sparse.size(); ++i) {
    const SparseFeatureOptions& f = options.sparse[i];
    Lookup l;
    l.field = f.field;
    SW_ASSIGN_OR_RETURN(l.data_field, field_index(absl::StrCat("model.sparse[", i, "].field"), f.field));
    const TableOptions& t = *options.FindTable(f.table);
    int table = -1;
    for (size_t k = 0; k < spec.tables.size(); ++k) {
      if (spec.tables[k].name == t.name) table = static_cast<int>(k);
    }
    if (table < 0) {
      spec.tables.push_back(EmbeddingDeclOf(t));
      table = static_cast<int>(spec.tables.size()) - 1;
    }
    l.table = table;
    l.dim = t.dim;
    l.pooling = f.pooling;
    l.weighted = f.weighted;
    spec.lookups.push_back(l);
  }
  for (size_t i = 0; i < options.wide.size(); ++i) {
    Lookup l;
    l.field = options.wide[i];
    SW_ASSIGN_OR_RETURN(l.data_field, field_index(absl::StrCat("model.wide[", i, "]"), l.field));
    // Wide weights start at zero, as a linear model's do.
    spec.tables.push_back(EmbeddingDecl{absl::StrCat("wide/", l.field), options.wide_rows, spec.outputs, false, false, 0.0f});
    l.table = static_cast<int>(spec.tables.size()) - 1;
    l.dim = spec.outputs;
    l.pooling = Pooling::kSum;
    l.weighted = true;
    l.wide = true;
    spec.lookups.push_back(l);
  }
  const int64_t db = options.bottom.empty() ? shape.dense_dim : options.bottom.back().units;
  const int64_t f = static_cast<int64_t>(options.sparse.size());
  switch (options.interaction) {
    case Interaction::kConcat: {
      int64_t w = db;
      for (const SparseFeatureOptions& s : options.sparse) w += options.FindTable(s.table)->dim;
      spec.interaction_width = w;
      break;
    }
    case Interaction::kDot: {
      const int64_t d = options.FindTable(options.sparse[0].table)->dim;
      if (db != d) {
        return Bad("model.interaction", absl::StrCat("dot: the dense vector (", db,
                                                     " wide: the bottom tower's output, or the dense features) must be "
                                                     "as wide as the embeddings (", d, ")"));
      }
      spec.interaction_width = DotInteractionWidth(f + 1, d, /*with_first=*/true);
      break;
    }
    case Interaction::kDotNoDense: {
      const int64_t d = options.FindTable(options.sparse[0].table)->dim;
      spec.interaction_width = db + DotInteractionWidth(f, d, /*with_first=*/false);
      break;
    }
  }
  if (spec.interaction_width < 1) return Bad("model", "the model has no inputs: no dense features and no sparse features");
  AddTowerVariables("bottom_", shape.dense_dim, options.bottom, &spec.variables);
  AddTowerVariables("dense_", spec.interaction_width, options.layers, &spec.variables);
  return spec;
}

absl::StatusOr<std::vector<VariableSpec>> Model::Variables(const ModelOptions& options, const DataShape& shape) {
  SW_ASSIGN_OR_RETURN(ModelSpec spec, Describe(options, shape));
  return std::move(spec.variables);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelOptions& given, const DataShape& shape,
                                                     int64_t batch, const dnnl::engine& engine, uint64_t seed) {
  const ModelOptions options = ResolveAutoUnits(given, shape);
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  std::unique_ptr<Model> m(new Model());
  SW_ASSIGN_OR_RETURN(m->spec_, Describe(given, shape));
  m->head_ = options.head;
  m->precision_ = options.precision;
  m->interaction_ = options.interaction;
  m->batch_ = batch;
  m->dense_dim_ = shape.dense_dim;
  m->rng_ = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  m->rng_seed_ = m->rng_;
  m->input_.assign(batch * shape.dense_dim, 0.0f);
  m->labels_.assign(batch, 0);
  m->targets_.assign(batch, 0.0f);
  m->label_offsets_.assign(batch + 1, 0);
  {
    // bf16: the layers' weights come from the pull already rounded, with no
    // f32 copy (the biases stay f32). Every params slice, then every gradient.
    std::vector<size_t> f32_sizes, bf16_sizes;
    for (const VariableSpec& s : m->spec_.variables) {
      const bool bf16 = options.precision == Precision::kBf16 && absl::EndsWith(s.name, "/kernel");
      f32_sizes.push_back(bf16 ? 0 : static_cast<size_t>(s.size()));
      bf16_sizes.push_back(bf16 ? static_cast<size_t>(s.size()) : 0);
    }
    for (const VariableSpec& s : m->spec_.variables) f32_sizes.push_back(static_cast<size_t>(s.size()));
    std::vector<absl::Span<float>> f32 = SlicesOnHugePages(f32_sizes, &m->dense_arena_);
    const auto vars = static_cast<std::ptrdiff_t>(m->spec_.variables.size());
    m->params_.assign(f32.begin(), f32.begin() + vars);
    m->grads_.assign(f32.begin() + vars, f32.end());
    m->params16_ = SlicesOnHugePages(bf16_sizes, &m->dense16_arena_);
  }
  const int64_t deep = static_cast<int64_t>(options.sparse.size());
  m->db_ = options.bottom.empty() ? shape.dense_dim : options.bottom.back().units;
  m->vec_dim_ = deep > 0 ? m->spec_.lookups[0].dim : 0;
  m->lookups_.resize(m->spec_.lookups.size());
  int64_t z_width = 0;
  switch (m->interaction_) {
    case Interaction::kConcat: z_width = m->spec_.interaction_width; break;
    case Interaction::kDot: m->num_vectors_ = deep + 1; z_width = m->num_vectors_ * m->vec_dim_; break;
    case Interaction::kDotNoDense: m->num_vectors_ = deep; z_width = deep * m->vec_dim_; break;
  }
  // Where each deep lookup's pooled vector sits in a row of z_.
  int64_t at = m->interaction_ == Interaction::kConcat ? m->db_ : (m->interaction_ == Interaction::kDot ? m->vec_dim_ : 0);
  for (size_t l = 0; l < m->spec_.lookups.size(); ++l) {
    const Lookup& lk = m->spec_.lookups[l];
    const EmbeddingDecl& t = m->spec_.tables[lk.table];
    m->static_rows_.push_back(t.dynamic ? 0 : t.rows);
    LookupState& st = m->lookups_[l];
    st.offsets.assign(batch + 1, 0);
    if (!lk.wide) {
      st.z_offset = at;
      at += lk.dim;
    }
    // The first lookup with ids of its own whose store ids are this one's
    // (bag_of), else this one.
    int bag = static_cast<int>(l);
    for (size_t e : m->bags_) {
      const Lookup& o = m->spec_.lookups[e];
      if (o.data_field == lk.data_field && o.weighted == lk.weighted && m->static_rows_[e] == m->static_rows_[l]) {
        bag = static_cast<int>(e);
        break;
      }
    }
    m->bag_of_.push_back(bag);
    if (bag == static_cast<int>(l)) m->bags_.push_back(l);
  }
  m->direct_ = m->interaction_ == Interaction::kConcat && deep == 0;
  if (!m->direct_) {
    m->z_.assign(batch * z_width, 0.0f);
    m->dz_.assign(batch * z_width, 0.0f);
  }
  const bool dot = m->interaction_ != Interaction::kConcat;
  if (dot) {
    m->inter_.assign(batch * m->spec_.interaction_width, 0.0f);
    m->dinter_.assign(batch * m->spec_.interaction_width, 0.0f);
  }
  if (!m->spec_.lookups.empty() && options.wide.size() > 0) m->wide_tmp_.assign(batch * m->spec_.outputs, 0.0f);
  int var = 0;
  if (!options.bottom.empty()) {
    m->bottom_ = std::make_unique<Tower>();
    SW_RETURN_IF_ERROR(m->bottom_->Build(engine, batch, shape.dense_dim, options.bottom, m->input_.data(),
                                         /*dx=*/nullptr, m->params_, m->grads_, m->params16_, var,
                                         options.precision));
    var += 2 * static_cast<int>(options.bottom.size());
  }
  m->top_ = std::make_unique<Tower>();
  const float* top_in = dot ? m->inter_.data() : m->z_.data();
  float* top_din = dot ? m->dinter_.data() : m->dz_.data();
  if (m->direct_) {
    top_in = m->bottom_ ? m->bottom_->out() : m->input_.data();
    top_din = m->bottom_ ? m->bottom_->dout() : nullptr;  // the input needs no gradient
  }
  const size_t top_first = static_cast<size_t>(var);
  SW_RETURN_IF_ERROR(m->top_->Build(engine, batch, m->spec_.interaction_width, options.layers, top_in, top_din,
                                    m->params_, m->grads_, m->params16_, var, options.precision));
  // The top tower's parameters and gradients (grads_ has every variable's
  // size; params_ is empty under bf16, whose 2-byte parameters count as 4).
  size_t top_bytes = 0;
  for (size_t v = top_first; v < m->grads_.size(); ++v) top_bytes += 2 * m->grads_[v].size() * sizeof(float);
  m->prefetch_rows_for_update_ = top_bytes > L2CacheBytes();
  m->logits_ = m->top_->out();
  m->dlogits_ = m->top_->dout();
  return m;
}

void Model::LoadRecordHead(const Dataset& data, int64_t r, int64_t slot, const PackedRecords* packed) {
  if (dense_dim_ > 0) {
    float* dst = input_.data() + slot * dense_dim_;
    if (packed != nullptr && packed->has_dense_bytes()) {
      // The same division as the IDX reader's: the very same floats.
      const uint8_t* src = packed->dense_bytes.data() + r * dense_dim_;
      BytesToUnitFloats(src, dst, dense_dim_);
    } else {
      std::memcpy(dst, data.dense.data() + r * dense_dim_, dense_dim_ * sizeof(float));
    }
  }
  if (packed != nullptr && packed->inline_label) {
    // In the record's block, after its counts (PackedRecords).
    const char* label = reinterpret_cast<const char*>(packed->Block(r)) +
                        static_cast<size_t>(packed->num_bags) * sizeof(uint32_t);
    if (head_ == HeadType::kRegression) {
      std::memcpy(&targets_[slot], label, sizeof(float));
    } else {
      std::memcpy(&labels_[slot], label, sizeof(int32_t));
    }
  } else if (head_ == HeadType::kRegression) {
    targets_[slot] = data.targets[r];
  } else {
    labels_[slot] = data.labels[r];
  }
  if (head_ == HeadType::kSoftmax) {
    const int64_t base = label_offsets_[slot];
    if (data.multi_label()) {
      const int64_t b = data.label_offsets[r], e = data.label_offsets[r + 1];
      if (label_sets_.size() < static_cast<size_t>(base + (e - b))) label_sets_.resize(base + (e - b));
      std::copy(data.label_sets.begin() + b, data.label_sets.begin() + e, label_sets_.begin() + base);
      label_offsets_[slot + 1] = base + (e - b);
    } else {
      if (label_sets_.size() < static_cast<size_t>(base + 1)) label_sets_.resize(base + 1);
      label_sets_[base] = labels_[slot];
      label_offsets_[slot + 1] = base + 1;
    }
  }
}

void Model::GrowLookup(size_t l, size_t need) {
  // Grows to the largest batch seen, then never again: the bag, and the rows
  // of every lookup that reads it.
  LookupState& bag = lookups_[l];
  bag.ids.resize(std::max(need + kIdSlack, 2 * bag.ids.size()));
  if (spec_.lookups[l].weighted) bag.weights.resize(bag.ids.size());
  for (size_t m = l; m < lookups_.size(); ++m) {
    if (bag_of_[m] != static_cast<int>(l)) continue;
    LookupState& st = lookups_[m];
    const int64_t dim = spec_.lookups[m].dim;
    st.rows.resize(bag.ids.size() * dim);
    st.row_grads.resize(bag.ids.size() * dim);
    st.addresses.resize(bag.ids.size());
  }
}

void Model::LoadRecord(const Dataset& data, int64_t r, int64_t slot, const PackedRecords* packed) {
  LoadRecordHead(data, r, slot, packed);
  if (packed != nullptr && packed->has_ids()) {
    LoadPackedIds(*packed, r, slot);
    return;
  }
  for (size_t l : bags_) {
    const Lookup& lk = spec_.lookups[l];
    LookupState& st = lookups_[l];
    const SparseField& f = data.fields[lk.data_field];
    const int64_t b = f.offsets[r], e = f.offsets[r + 1];
    const size_t need = st.count + static_cast<size_t>(e - b);
    EnsureIds(l, need);
    const int64_t rows = static_rows_[l];
    for (int64_t i = b; i < e; ++i) st.ids[st.count + (i - b)] = StoreId(f.ids[i], rows);
    if (st.has_weights) std::copy(f.weights.begin() + b, f.weights.begin() + e, st.weights.begin() + st.count);
    st.count = need;
    st.offsets[slot + 1] = static_cast<int64_t>(need);
  }
}

void Model::LoadPackedIds(const PackedRecords& packed, int64_t r, int64_t slot) {
  constexpr uint32_t kChunk = kIdSlack + 1;
  const uint64_t* block = packed.Block(r);
  const char* ids = reinterpret_cast<const char*>(block + packed.head_words);
  // Whole chunks of kIdSlack + 1 ids: EnsureIds leaves room for the last
  // one's overshoot, and PackRecords pads the words so the last block's
  // chunk is in them (kIdSlack words hold kIdSlack narrow ids and more).
  for (size_t k = 0; k < bags_.size(); ++k) {
    const size_t l = bags_[k];
    LookupState& st = lookups_[l];
    const uint32_t c = BlockCount(block, k);
    EnsureIds(l, st.count + c);
    uint64_t* to = st.ids.data() + st.count;
    const PackedRecords::WeightCode& code = packed.weight_codes[k];
    if (code.coded()) {
      // (GrowLookup keeps a weighted lookup's weights as long as its ids.)
      DecodeCodedEntries(reinterpret_cast<const uint32_t*>(ids), c, code.id_bits, code.unit, to,
                         st.weights.data() + st.count);
      ids += c * sizeof(uint32_t);
    } else if (packed.narrow_ids) {
      for (uint32_t i = 0; i < c; i += kChunk) {
        uint32_t chunk[kChunk];
        std::memcpy(chunk, ids + i * sizeof(uint32_t), sizeof(chunk));
        for (uint32_t k = 0; k < kChunk; ++k) to[i + k] = chunk[k];
      }
      ids += c * sizeof(uint32_t);
    } else {
      for (uint32_t i = 0; i < c; i += kChunk) std::memcpy(to + i, ids + i * sizeof(uint64_t), kChunk * sizeof(uint64_t));
      ids += c * sizeof(uint64_t);
    }
    if (packed.weighted[k] && !code.coded()) {
      std::memcpy(st.weights.data() + st.count, ids, c * sizeof(float));
      ids += c * sizeof(float);
    }
    st.count += c;
    st.offsets[slot + 1] = static_cast<int64_t>(st.count);
  }
}

namespace {

// 10^d, exact in a double for d <= PackedRecords::WeightCode::kMaxDecimals.
double PowerOfTen(int d) {
  double p = 1;
  for (int i = 0; i < d; ++i) p *= 10;
  return p;
}

// The whole number a weight is taken for with `decimals` decimals.
double WholeOf(float weight, int decimals) {
  return std::nearbyint(static_cast<double>(weight) * PowerOfTen(decimals));
}

}  // namespace

PackedRecords::WeightCode PackedRecords::WeightCode::Of(const std::vector<float>& weights, int64_t rows) {
  if (rows <= 0 || rows > (int64_t{1} << 32)) return {};
  const int id_bits = std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(rows - 1))));
  if (id_bits >= 32) return {};
  const double limit = std::ldexp(1.0, 32 - id_bits);  // k < limit
  for (float w : weights) {
    if (!std::isfinite(w) || std::signbit(w)) return {};
  }
  for (int d = 0; d <= kMaxDecimals; ++d) {
    const double unit = 1.0 / PowerOfTen(d);
    bool exact = true;
    for (float w : weights) {
      const double k = WholeOf(w, d);
      if (k >= limit) return {};  // and with more decimals
      if (Decode(static_cast<uint32_t>(k), unit) != w) {
        exact = false;
        break;
      }
    }
    if (exact) return WeightCode{id_bits, d, unit};
  }
  return {};
}

uint32_t PackedRecords::WeightCode::Word(uint32_t id, float weight) const {
  return id | static_cast<uint32_t>(WholeOf(weight, decimals)) << id_bits;
}

namespace {

// The words of the blocks that do not fit slots of `stride` words (they go
// after the slots): every block's words less those of the blocks that fit.
// Exact while the histogram's last entry (every block of that size or more)
// is longer than the slot.
uint64_t WordsPastSlots(const std::vector<int64_t>& words_histogram, uint64_t total_words, int64_t stride) {
  uint64_t fit = 0;
  for (int64_t w = 0; w <= stride; ++w) fit += static_cast<uint64_t>(words_histogram[w]) * static_cast<uint64_t>(w);
  return total_words - fit;
}

}  // namespace

int64_t Model::ChooseStrideWords(const std::vector<int64_t>& words_histogram, uint64_t total_words) {
  const int64_t top = static_cast<int64_t>(words_histogram.size()) - 1;
  if (top != kStrideHistogramWords) return 0;
  int64_t n = 0;
  for (int64_t w = 0; w <= top; ++w) n += words_histogram[w];
  if (n == 0) return 0;
  // Lines a block of w words touches where it starts at a uniformly placed
  // word. (Blocks in the last entry are counted as that entry's size: both
  // layouts read them whole, so the comparison hardly moves.)
  auto block_lines = [](int64_t w) { return 1.0 + (static_cast<double>(w) * 8.0 - 8.0) / 64.0; };
  // A block after the slots, which cannot be asked for a step ahead (see
  // ChooseStrideWords in model.h), counts as this many times its lines.
  constexpr double kAfterSlotsWeight = 2.0;
  double best_lines = 0;
  for (int64_t w = 0; w <= top; ++w) best_lines += static_cast<double>(words_histogram[w]) * (1.0 + block_lines(w));
  const double one_after_another_bytes = (static_cast<double>(total_words) + static_cast<double>(n) + 1.0) * 8.0;
  int64_t best = 0;
  // Powers of two up to a line (no slot crosses one), then whole lines.
  std::vector<int64_t> strides = {2, 4, 8};
  for (int64_t s = 16; s <= kMaxStrideWords; s += 8) strides.push_back(s);
  for (int64_t stride : strides) {
    const double slot_lines = stride <= 8 ? 1.0 : static_cast<double>(stride / 8);
    double lines = static_cast<double>(n) * slot_lines;
    for (int64_t w = stride + 1; w <= top; ++w) lines += static_cast<double>(words_histogram[w]) * kAfterSlotsWeight * block_lines(w);
    const uint64_t past_slots = WordsPastSlots(words_histogram, total_words, stride);
    const double bytes = (static_cast<double>(n) * static_cast<double>(stride) + static_cast<double>(past_slots)) * 8.0;
    if (bytes > 2.0 * one_after_another_bytes) continue;
    if (lines < best_lines) {
      best_lines = lines;
      best = stride;
    }
  }
  return best;
}

std::optional<PackedRecords> Model::PackRecords(const Dataset& data, int64_t stride_bytes) const {
  PackedRecords p;
  p.records = data.count;
  const std::vector<size_t>& bags = bags_;
  const size_t nb = bags.size();
  const size_t nd = static_cast<size_t>(data.count) * static_cast<size_t>(dense_dim_);  // dense values
  if (nb > 0) {
    p.num_bags = static_cast<int>(nb);
    // A weighted lookup's weights, where its field has them, follow its ids.
    p.weighted.assign(nb, 0);
    for (size_t k = 0; k < nb; ++k) {
      const Lookup& lk = spec_.lookups[bags[k]];
      p.weighted[k] = lk.weighted && !data.fields[lk.data_field].weights.empty();
    }
    p.narrow_ids = true;
    for (size_t l : bags) p.narrow_ids = p.narrow_ids && static_rows_[l] > 0 && static_rows_[l] <= (int64_t{1} << 32);
    // Weights coded in the ids' words where every one of a field's allows.
    p.weight_codes.assign(nb, PackedRecords::WeightCode{});
    for (size_t k = 0; k < nb && p.narrow_ids; ++k) {
      if (p.weighted[k]) {
        p.weight_codes[k] =
            PackedRecords::WeightCode::Of(data.fields[spec_.lookups[bags[k]].data_field].weights, static_rows_[bags[k]]);
      }
    }
    const bool regression = head_ == HeadType::kRegression;
    p.inline_label = regression ? !data.targets.empty() : !data.labels.empty();
    // What every slot load asks of the records: narrow ids and one label a
    // record, in its block (no label sets, no regression target).
    const bool one_label_in_block = p.narrow_ids && p.inline_label && !regression && !data.multi_label();
    // The slots asked for: kAutoStride (ChooseStrideWords), 0 (blocks one
    // after the other) or that many words.
    const int64_t asked_stride =
        stride_bytes == kAutoStride ? kAutoStride
        : stride_bytes > 0 ? std::clamp<int64_t>(stride_bytes / static_cast<int64_t>(sizeof(uint64_t)), 2, kMaxStrideWords)
                           : 0;
    // The one-id layout (PackedRecords::kOneIdBags) where every record
    // allows it and its block fits the slots asked for (a slot of its words
    // or more; blocks one after the other keep the counts). The one layout
    // that the other slot loads do not cover: several bags, or dense values.
    bool one_id = one_label_in_block && nb <= static_cast<size_t>(PackedRecords::kMaxOneIdBags) &&
                  (nb > 1 || dense_dim_ > 0) && data.dense.size() == nd &&
                  std::find(p.weighted.begin(), p.weighted.end(), 1) == p.weighted.end();
    for (size_t k = 0; k < nb && one_id; ++k) {
      const SparseField& f = data.fields[spec_.lookups[bags[k]].data_field];
      for (int64_t r = 0; r < data.count && one_id; ++r) one_id = f.size(r) <= 1;
    }
    const uint64_t one_id_words =
        1 + (nb * sizeof(uint32_t) + static_cast<uint64_t>(dense_dim_) * sizeof(float) + sizeof(uint64_t) - 1) /
                sizeof(uint64_t);
    one_id = one_id && one_id_words <= static_cast<uint64_t>(kMaxStrideWords) &&
             (asked_stride == kAutoStride || asked_stride >= static_cast<int64_t>(one_id_words));
    p.head_words = one_id ? 1 : static_cast<int>((nb + (p.inline_label ? 1 : 0) + 1) / 2);
    // Each block's words: its head, then each bag's ids (two a word when
    // narrow) and weights (floats), the last word padded; in the one-id
    // layout, one_id_words.
    const uint64_t id_bytes = p.narrow_ids ? sizeof(uint32_t) : sizeof(uint64_t);
    auto block_words = [&](int64_t r) {
      if (one_id) return one_id_words;
      uint64_t bytes = 0;
      for (size_t k = 0; k < nb; ++k) {
        const uint64_t c = static_cast<uint64_t>(data.fields[spec_.lookups[bags[k]].data_field].size(r));
        bytes += c * (id_bytes + (p.weighted[k] && !p.weight_codes[k].coded() ? sizeof(float) : 0));
      }
      return static_cast<uint64_t>(p.head_words) + (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t);
    };
    // The blocks' sizes, for the layout.
    std::vector<int64_t> histogram(kStrideHistogramWords + 1, 0);
    uint64_t total_words = 0;
    bool overflow_mark_free = true;  // no block can begin with kOverflowSlot's bits
    const SparseField& first = data.fields[spec_.lookups[0].data_field];
    for (int64_t r = 0; r < data.count; ++r) {
      const uint64_t w = block_words(r);
      total_words += w;
      ++histogram[std::min<uint64_t>(w, histogram.size() - 1)];
      overflow_mark_free = overflow_mark_free && first.size(r) < 0xffffffffu;
    }
    int64_t stride = asked_stride == kAutoStride ? ChooseStrideWords(histogram, total_words) : asked_stride;
    // (A one-id block has no counts: its first word may be any bits, and no
    // block is after the slots to need the mark.)
    if (!overflow_mark_free && !one_id) stride = 0;
    // The one-id blocks are all one_id_words long, and the stride chosen for
    // them is the first that holds them (fewest lines, none after the slots;
    // PackedLayout.BlocksOfOneSizeGetTheFirstSlotThatHoldsThem).
    assert(!one_id || stride >= static_cast<int64_t>(one_id_words));
    p.stride_words = stride;
    // The blocks are written on every hardware thread, a range of records
    // each, every range's words (its slots, and its blocks one after
    // another or past the slots) zeroed and written by the thread that
    // first touches them (UninitHugePageVector): on the 2-core Zen 5 VM,
    // where a first write to a page is slow, DLRM's 77 MB had been zeroed
    // and written by one thread, 0.3 s before the first step. Each range
    // first sums the words it puts one after another, so it knows where
    // its own begin.
    const uint64_t slot_words = static_cast<uint64_t>(data.count) * static_cast<uint64_t>(stride);
    const uint64_t words_used =
        stride == 0 ? total_words : slot_words + WordsPastSlots(histogram, total_words, stride);
    if (stride == 0) p.start.resize(static_cast<size_t>(data.count) + 1);
    // kIdSlack words of padding after the last block (LoadPackedIds).
    p.words.resize(words_used + kIdSlack);
    const int64_t ranges = (data.count + kPackRange - 1) / kPackRange;
    std::vector<uint64_t> range_at(static_cast<size_t>(ranges) + 1, 0);  // where each range's blocks go
    ParallelFor(0, ranges, [&](int64_t g) {
      uint64_t after = 0;
      for (int64_t r = g * kPackRange, e = std::min(r + kPackRange, data.count); r < e; ++r) {
        const uint64_t w = block_words(r);
        if (stride == 0 || w > static_cast<uint64_t>(stride)) after += w;
      }
      range_at[static_cast<size_t>(g) + 1] = after;
    });
    range_at[0] = slot_words;
    for (int64_t g = 0; g < ranges; ++g) range_at[static_cast<size_t>(g) + 1] += range_at[static_cast<size_t>(g)];
    assert(range_at.back() == words_used);
    std::vector<int64_t> range_overflow(static_cast<size_t>(ranges), 0);
    ParallelFor(0, ranges, [&](int64_t g) {
      const int64_t r0 = g * kPackRange, r1 = std::min(r0 + kPackRange, data.count);
      uint64_t at = range_at[static_cast<size_t>(g)];  // where the range's next block one after another goes
      std::fill(p.words.data() + at, p.words.data() + range_at[static_cast<size_t>(g) + 1], uint64_t{0});
      if (stride > 0) std::fill(p.words.data() + r0 * stride, p.words.data() + r1 * stride, uint64_t{0});
      for (int64_t r = r0; r < r1; ++r) {
        const uint64_t w = block_words(r);
        uint64_t to = at;
        if (stride == 0) {
          p.start[r] = at;
          at += w;
        } else if (w <= static_cast<uint64_t>(stride)) {
          to = static_cast<uint64_t>(r) * static_cast<uint64_t>(stride);
        } else {
          uint64_t* slot = p.words.data() + r * stride;  // (Slot(r) is read-only)
          slot[0] = PackedRecords::kOverflowSlot;
          slot[1] = at;
          at += w;
          ++range_overflow[static_cast<size_t>(g)];
        }
        char* head = reinterpret_cast<char*>(p.words.data() + to);
        char* ids = head + p.head_words * sizeof(uint64_t);
        if (one_id) {
          // [mask, label][an id a bag][dense values] (PackedRecords).
          uint32_t mask = 0;
          for (size_t k = 0; k < nb; ++k) {
            const size_t l = bags[k];
            const SparseField& f = data.fields[spec_.lookups[l].data_field];
            if (f.size(r) == 0) continue;
            mask |= uint32_t{1} << k;
            const uint32_t id = static_cast<uint32_t>(StoreId(f.ids[f.offsets[r]], static_rows_[l]));
            std::memcpy(ids + k * sizeof(uint32_t), &id, sizeof(id));
          }
          std::memcpy(head, &mask, sizeof(mask));
          std::memcpy(head + sizeof(mask), &data.labels[r], sizeof(int32_t));
          if (dense_dim_ > 0) {
            std::memcpy(ids + nb * sizeof(uint32_t), data.dense.data() + r * dense_dim_, dense_dim_ * sizeof(float));
          }
          continue;
        }
        for (size_t k = 0; k < nb; ++k) {
          const size_t l = bags[k];
          const SparseField& f = data.fields[spec_.lookups[l].data_field];
          const int64_t b = f.offsets[r], e = f.offsets[r + 1];
          const uint32_t c = static_cast<uint32_t>(e - b);
          std::memcpy(head + k * sizeof(uint32_t), &c, sizeof(c));
          const PackedRecords::WeightCode& code = p.weight_codes[k];
          for (int64_t i = b; i < e; ++i) {
            const uint64_t id = StoreId(f.ids[i], static_rows_[l]);
            if (code.coded()) {
              const uint32_t word = code.Word(static_cast<uint32_t>(id), f.weights[i]);
              std::memcpy(ids, &word, sizeof(word));
            } else if (p.narrow_ids) {
              const uint32_t narrow = static_cast<uint32_t>(id);
              std::memcpy(ids, &narrow, sizeof(narrow));
            } else {
              std::memcpy(ids, &id, sizeof(id));
            }
            ids += id_bytes;
          }
          if (p.weighted[k] && !code.coded() && c > 0) {
            std::memcpy(ids, f.weights.data() + b, c * sizeof(float));
            ids += c * sizeof(float);
          }
        }
        if (p.inline_label) {
          uint32_t label = 0;
          if (regression) {
            std::memcpy(&label, &data.targets[r], sizeof(label));
          } else {
            std::memcpy(&label, &data.labels[r], sizeof(label));
          }
          std::memcpy(head + nb * sizeof(uint32_t), &label, sizeof(label));
        }
      }
    });
    std::fill(p.words.data() + words_used, p.words.data() + p.words.size(), uint64_t{0});
    for (const int64_t n : range_overflow) p.overflow_blocks += n;
    if (stride == 0) p.start[data.count] = words_used;
    // What a record's prefetch asks for (PrefetchRecord): its slot, whose
    // lines are all a prefetch a step ahead can know of (a block after the
    // slots is found only when the slot is read), else its block. Counting
    // the blocks after the slots in took sparse_logreg's 128-byte slots to
    // 3 lines a record, its bursts to 10 records and its 16-record parts
    // past them, so LoadBatch asked for every slot again (12 alternating
    // rounds of one build on the 2-core EPYC VM: data 1.056 -> 0.990 us a
    // step, medians).
    p.prefetch_bytes = stride > 0 ? stride * static_cast<int64_t>(sizeof(uint64_t))
                       : data.count > 0 ? static_cast<int64_t>(p.words.size() * sizeof(uint64_t)) / data.count
                                        : 0;
    // Slot by slot where the model reads one bag and a label, and nothing
    // else, from each record (its head one word: the count and the label).
    using SlotLoad = PackedRecords::SlotLoad;
    if (one_id) {
      p.slot_load = SlotLoad::kOneIdBags;
    } else if (stride > 0 && one_label_in_block && lookups_.size() == 1 && dense_dim_ == 0) {
      p.slot_load = !p.weighted[0]                 ? SlotLoad::kIds
                    : p.weight_codes[0].coded() ? SlotLoad::kCodedWeights
                                                : SlotLoad::kIdsThenWeights;
    }
  }
  // Dense bytes, only if every value is exactly k / 255.0f (checked value
  // by value, so the loads give back the same floats), and not where the
  // blocks hold the dense values.
  if (nd > 0 && data.dense.size() == nd && !p.dense_in_block()) {
    // In parts on every hardware thread, as the blocks above; the first
    // value that is not exact stops them all.
    UninitHugePageVector<uint8_t> bytes(nd);
    std::atomic<bool> exact{true};
    constexpr size_t kPart = kPackDenseBytes;
    ParallelFor(0, static_cast<int64_t>((nd + kPart - 1) / kPart), [&](int64_t g) {
      if (!exact.load(std::memory_order_relaxed)) return;
      const size_t b = static_cast<size_t>(g) * kPart, e = std::min(b + kPart, nd);
      for (size_t i = b; i < e; ++i) {
        const float v = data.dense[i];
        const float k = std::nearbyint(v * 255.0f);
        if (!(k >= 0.0f && k <= 255.0f && static_cast<float>(static_cast<uint8_t>(k)) / 255.0f == v &&
              !std::signbit(v))) {
          exact.store(false, std::memory_order_relaxed);
          return;
        }
        bytes[i] = static_cast<uint8_t>(k);
      }
    });
    if (exact.load(std::memory_order_relaxed)) p.dense_bytes = std::move(bytes);
  }
  if (!p.has_ids() && !p.has_dense_bytes()) return std::nullopt;
  return p;
}

void Model::FinishLoad(int64_t n) {
  // Padding rows: zero inputs, empty bags, harmless labels.
  if (n < batch_) {
    std::fill(input_.begin() + n * dense_dim_, input_.end(), 0.0f);
    std::fill(labels_.begin() + n, labels_.end(), 0);
    std::fill(targets_.begin() + n, targets_.end(), 0.0f);
    for (int64_t s = n; s < batch_; ++s) label_offsets_[s + 1] = label_offsets_[n];
    for (size_t l : bags_) {
      LookupState& st = lookups_[l];
      for (int64_t s = n; s < batch_; ++s) st.offsets[s + 1] = static_cast<int64_t>(st.count);
    }
  }
}

void Model::PrefetchRecord(const Dataset& data, int64_t r, const PackedRecords* packed) const {
  // The label (or target) is a miss of its own once the data set outgrows
  // the caches, unless it is in the record's packed block.
  const bool label_in_block = packed != nullptr && packed->inline_label;
  if (!label_in_block && head_ == HeadType::kRegression) {
    if (!data.targets.empty()) PrefetchLine(data.targets.data() + r);
  } else if (!label_in_block && !data.labels.empty()) {
    PrefetchLine(data.labels.data() + r);
  }
  if (packed != nullptr && packed->has_dense_bytes()) {
    PrefetchLines(packed->dense_bytes.data() + r * dense_dim_, static_cast<size_t>(dense_dim_));
  } else if (packed == nullptr || !packed->dense_in_block()) {
    PrefetchLines(data.dense.data() + r * dense_dim_, static_cast<size_t>(dense_dim_) * sizeof(float));
  }
  if (packed != nullptr && packed->has_ids()) {
    if (packed->stride_words > 0) {
      // The slot (a block after the slots is found only once the slot is read).
      PrefetchLines(packed->Slot(r), packed->stride_words * sizeof(uint64_t));
    } else {
      const uint64_t b = packed->start[r], e = packed->start[r + 1];
      PrefetchLines(packed->words.data() + b, (e - b) * sizeof(uint64_t));
    }
  }
}

void Model::PrefetchBatch(const Dataset& data, const int32_t* records, int64_t n,
                          const PackedRecords* packed) const {
  if (packed != nullptr && packed->has_ids() && packed->stride_words > 0 && packed->inline_label &&
      (dense_dim_ == 0 || packed->dense_in_block())) {
    // All of a record in its slot (or found from it): PrefetchRecord's work
    // without its tests, a slot's lines a record (text config, the part
    // asked for after the forward, timed in an instrumented build: 65 -> 40
    // ns a step).
    const size_t bytes = static_cast<size_t>(packed->stride_words) * sizeof(uint64_t);
    for (int64_t i = 0; i < n; ++i) PrefetchLines(packed->Slot(records[i]), bytes);
    return;
  }
  if (packed != nullptr && packed->has_ids() && packed->stride_words == 0) {
    // The words that locate the blocks, which PrefetchRecord reads (a miss
    // of its own), all in flight first (LoadBatch loads them, in TouchBatch).
    // Slots have no such word.
    for (int64_t i = 0; i < n; ++i) PrefetchLine(packed->start.data() + records[i]);
  }
  for (int64_t i = 0; i < n; ++i) PrefetchRecord(data, records[i], packed);
}

void Model::BeginLoad(const Dataset& data) {
  for (size_t l = 0; l < lookups_.size(); ++l) {
    const Lookup& lk = spec_.lookups[l];
    lookups_[l].count = 0;
    lookups_[l].has_weights = lk.weighted && !data.fields[lk.data_field].weights.empty();
  }
}

void Model::LoadBatch(const Dataset& data, const int32_t* records, int64_t n, const PackedRecords* packed,
                      Asked asked) {
  BeginLoad(data);
  // Records are scattered over the data set. Their first lines (the start
  // words, the labels, the packed blocks' counts) are loaded all at once
  // first, unless they are a few lines each and PrefetchBatch asked for them
  // a step ahead (then those loads only stall: text, alternating runs, data
  // 1.16 -> 1.02 us a step; the MLP's images, 784 bytes, keep them: 27 ->
  // 24 us). Then their lines are asked for: all of them at once where a
  // record is a few lines (text: data 0.87 -> 0.79 us a step; DLRM 73 -> 60
  // us), otherwise the next few's while one record is copied (an image: all
  // at once spilled L1, 27 -> 39 us).
  constexpr int64_t kAhead = 3;
  const bool asked_for = asked != Asked::kNo;
  const bool few_lines = RecordBytes(packed) <= kFewRecordBytes;
  const int64_t ahead = few_lines ? n : kAhead;
  if (!(asked_for && few_lines)) {
    TouchBatch(data, records, n, packed);
  } else if (packed != nullptr && packed->has_ids() && packed->stride_words > 0 && packed->overflow_blocks > 0) {
    // The slots are in the caches (PrefetchBatch asked for them); a block
    // after the slots is found only now. Its lines are asked for first, so
    // that their misses overlap each other and the loads of the others.
    // (Where every block is in its slot, as in the text config, this pass
    // would only wait for each slot's first line, which the copy waits for
    // anyway.)
    PrefetchOverflowBlocks(records, n, *packed);
  }
  // Where the batch was asked for a step ahead in bursts that arrive (at
  // most RecordsPerPrefetchBurst records each: the text config's 16
  // records of 2 lines, in one or two bursts), its lines are in the caches
  // already, and asking again only costs the requests (alternating runs,
  // 2-core VM: text data 0.29 -> 0.25 us a step). A larger batch was asked
  // for in bursts that lose many of their lines, which this brings in (DLRM
  // data 15.5 us a step with it, 28 without; Wide & Deep 24.5 against 45).
  if (asked != Asked::kInBursts) PrefetchBatch(data, records, std::min(ahead, n), packed);
  // Slot by slot where PackRecords chose it. (A switch with FinishLoad in
  // each case, in place of these tests, took the text config's data phase
  // from 0.160 to 0.186-0.188 us a step, 2 sets of 6-8 alternating rounds.)
  using SlotLoad = PackedRecords::SlotLoad;
  const SlotLoad slot_load = packed != nullptr ? packed->slot_load : SlotLoad::kRecords;
  if (slot_load != SlotLoad::kRecords) {
    if (slot_load == SlotLoad::kOneIdBags) {
      LoadOneIdSlots(records, n, *packed);
    } else if (slot_load == SlotLoad::kIds) {
      LoadSlots<SlotLoad::kIds>(records, n, *packed);
    } else if (slot_load == SlotLoad::kCodedWeights) {
      LoadSlots<SlotLoad::kCodedWeights>(records, n, *packed);
    } else {
      LoadSlots<SlotLoad::kIdsThenWeights>(records, n, *packed);
    }
    FinishLoad(n);
    return;
  }
  for (int64_t s = 0; s < n; ++s) {
    if (s + ahead < n) PrefetchRecord(data, records[s + ahead], packed);
    LoadRecord(data, records[s], s, packed);
  }
  FinishLoad(n);
}

// One record's entries in the slot layout of ids then float weights
// (Model::LoadSlots; plain ids and coded weights go through the data
// kernels): `copy` ids from `from`, widened, and `copy` weights from after
// its `count` ids. One entry at a time, which GCC widens 4 to a vector at the
// baseline x86-64; restrict, so that it need not test for overlap first.
inline void Model::CopyIdsThenWeights(const char* __restrict from, uint32_t count, int64_t copy,
                                      uint64_t* __restrict ids, float* __restrict weights) {
  for (int64_t i = 0; i < copy; ++i) {
    uint32_t id;
    std::memcpy(&id, from + i * sizeof(uint32_t), sizeof(id));
    ids[i] = id;
  }
  const char* __restrict w = from + count * sizeof(uint32_t);
  for (int64_t i = 0; i < copy; ++i) std::memcpy(weights + i, w + i * sizeof(float), sizeof(float));
}

template <PackedRecords::SlotLoad kEntries>
void Model::LoadSlots(const int32_t* records, int64_t n, const PackedRecords& packed) {
  // LoadRecord's work for this one layout, record after record with no
  // branch on what the records hold: the label after the count, and as many
  // ids (and weights) as the slot can hold whatever the count (the loops
  // run as many times for every record; one bound by the count, 5 to 30 ids
  // in the text config, is mispredicted about once a record). The ids and
  // weights past a record's count are overwritten by the next record's or
  // left unread. Read word by word up to the slot's end and no further:
  // whole chunks of ids would cross it, into the next slot's first line,
  // which nobody asked for (BM_DataPhase what:4 shape:0 doubled).
  //   A slot with weights after the ids is [count, label][c ids][c weights]
  // [padding]: a slot of e entries after its head holds c <= e of them, so
  // its first e ids and the e weights after its c ids both end in the slot.
  // One with coded weights is [count, label][c words][padding], as one
  // without weights.
  //   A batch in L1, 10 loads timed together (BM_DataPhase what:2, 2-core
  // EPYC VM): sparse_logreg's 64 weighted records 0.78 us through
  // LoadRecord (its weights a copy of the count's length, its blocks after
  // the slots a call each), 0.48 us here; text's 16 records 134 -> 105 ns
  // once the loop kept its pointers and count in registers.
  constexpr bool kWeighted = kEntries != PackedRecords::SlotLoad::kIds;
  LookupState& st = lookups_[0];
  const int64_t words_after_head = packed.stride_words - packed.head_words;
  const int64_t entries = kEntries == PackedRecords::SlotLoad::kIdsThenWeights ? words_after_head : 2 * words_after_head;
  constexpr bool kCoded = kEntries == PackedRecords::SlotLoad::kCodedWeights;
  const bool softmax = head_ == HeadType::kSoftmax;
  if (softmax && label_sets_.size() < static_cast<size_t>(n)) label_sets_.resize(n);
  // Room for every slot's entries (the last record's past the batch's
  // count), and again for a longer block's, which may grow the lookup.
  size_t count = st.count;
  uint64_t* ids = nullptr;
  float* weights = nullptr;
  auto room_for = [&](size_t more) {
    EnsureIds(0, count + more);
    ids = st.ids.data();
    if constexpr (kWeighted) weights = st.weights.data();
  };
  room_for(static_cast<size_t>(n) * static_cast<size_t>(entries));
  // The loop reads nothing through `this` or `packed`, which its stores
  // could alias.
  const uint64_t* const words = packed.words.data();
  const int64_t stride = packed.stride_words, head_words = packed.head_words;
  int32_t* const labels = labels_.data();
  int32_t* const label_sets = softmax ? label_sets_.data() : nullptr;
  int64_t* const label_offsets = label_offsets_.data();
  int64_t* const offsets = st.offsets.data();
  if constexpr (kCoded || kEntries == PackedRecords::SlotLoad::kIds) {
    // One pass of a vector kernel over the slots (DecodeCodedSlots, or
    // WidenIdSlots for plain ids; the head is one word, the count and the
    // label, as slot loads require),
    // blocks after the slots included; it stops only at one that needs
    // more room, made here. In one pass a slot's first line is read while
    // the slot before it is decoded. A first pass for the counts and
    // labels, then the kernel over the batch, waited for those lines on
    // their own: BM_DataPhase what:4 514-525 -> 482-490 ns. In the trainer
    // it is within the noise (sparse_logreg.yaml, two sets of 8 alternating
    // rounds on the 2-core EPYC VM: data 1.09 -> 1.01 and 1.02 -> 1.02 us a
    // step, medians). Decoded a word at a time in the loop below (4 a
    // vector at the baseline), the batch took 0.63 us in L1 (what:2); 0.41
    // us in a kernel. Plain ids likewise (the text config): widened by the
    // compiler's loop at the baseline, 16 records in L1 took 186-192 ns,
    // in WidenIdSlots 145-147 (BM_DataPhase what:2 shape:0, 3 alternating
    // rounds on the 2-core EPYC VM), and the trainer's data phase went from
    // 0.51 to 0.45 us a step (8 alternating rounds, medians).
    const PackedRecords::WeightCode& code = packed.weight_codes[0];
    SlotBatch a{.words = words,
                .stride_words = stride,
                .overflow_word = PackedRecords::kOverflowSlot,
                .records = records,
                .n = n,
                .entries = entries,
                .id_bits = code.id_bits,
                .unit = code.unit,
                .ids = ids,
                .weights = weights,
                .room = static_cast<int64_t>(st.ids.size()),
                .labels = labels,
                .label_sets = label_sets,
                .label_offsets = label_offsets,
                .offsets = offsets};
    auto copy_from = [&a](int64_t s, int64_t* at) {
      return kCoded ? DecodeCodedSlots(a, s, at) : WidenIdSlots(a, s, at);
    };
    int64_t at = static_cast<int64_t>(count);
    for (int64_t s = copy_from(0, &at); s < n; s = copy_from(s, &at)) {
      // Record s's block after the slots needs more room: for it and for
      // every later slot's entries. (GrowLookup keeps the weights as long
      // as the ids.)
      const uint32_t c = BlockCount(words + words[records[s] * stride + 1], 0);
      count = static_cast<size_t>(at);
      room_for(static_cast<size_t>(c) + static_cast<size_t>(n - s - 1) * static_cast<size_t>(entries));
      a.ids = ids;
      a.weights = weights;
      a.room = static_cast<int64_t>(st.ids.size());
    }
    st.count = static_cast<size_t>(at);
  } else {
    // Ids then their float weights, slot by slot.
    for (int64_t s = 0; s < n; ++s) {
      const uint64_t* block = words + records[s] * stride;
      const bool after_slots = block[0] == PackedRecords::kOverflowSlot;
      if (after_slots) block = words + block[1];
      const uint32_t c = BlockCount(block, 0);
      int64_t copy = entries;
      if (after_slots) {
        // A block after the slots: the same layout, longer, copied to its
        // count.
        copy = c;
        room_for(static_cast<size_t>(c) + static_cast<size_t>(n - s - 1) * static_cast<size_t>(entries));
      }
      int32_t label;  // after the one lookup's count (PackedRecords)
      std::memcpy(&label, reinterpret_cast<const char*>(block) + sizeof(uint32_t), sizeof(label));
      labels[s] = label;
      if (softmax) {
        label_sets[s] = label;
        label_offsets[s + 1] = s + 1;
      }
      CopyIdsThenWeights(reinterpret_cast<const char*>(block + head_words), c, copy, ids + count, weights + count);
      count += c;
      offsets[s + 1] = static_cast<int64_t>(count);
    }
    st.count = count;
  }
}

void Model::LoadOneIdSlots(const int32_t* records, int64_t n, const PackedRecords& packed) {
  // Record after record, every bag's word stored at its bag's count, which
  // the mask's bit then advances: no branch on whether a bag has its id (8%
  // of the generated Criteo fields have none), and a word stored past a
  // bag's count is overwritten by the next record's or left unread. The
  // bags' pointers and counts are in arrays on the stack (26 bags outgrow
  // the registers); each record's dense values are one copy from its slot.
  const int nb = packed.num_bags;
  uint64_t* ids[PackedRecords::kMaxOneIdBags];
  int64_t* offsets[PackedRecords::kMaxOneIdBags];
  int64_t counts[PackedRecords::kMaxOneIdBags];
  for (int k = 0; k < nb; ++k) {
    const size_t l = bags_[k];
    EnsureIds(l, static_cast<size_t>(n));  // at most one id a record
    ids[k] = lookups_[l].ids.data();
    offsets[k] = lookups_[l].offsets.data();
    counts[k] = 0;  // (BeginLoad)
  }
  const bool softmax = head_ == HeadType::kSoftmax;
  if (softmax && label_sets_.size() < static_cast<size_t>(n)) label_sets_.resize(n);
  const uint64_t* const words = packed.words.data();
  const int64_t stride = packed.stride_words;
  int32_t* const labels = labels_.data();
  int32_t* const label_sets = softmax ? label_sets_.data() : nullptr;
  int64_t* const label_offsets = label_offsets_.data();
  float* const input = input_.data();
  const int64_t dense_dim = dense_dim_;
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t* block = words + records[s] * stride;
    const uint32_t mask = static_cast<uint32_t>(block[0]);
    int32_t label;
    std::memcpy(&label, reinterpret_cast<const char*>(block) + sizeof(uint32_t), sizeof(label));
    labels[s] = label;
    if (softmax) {
      label_sets[s] = label;
      label_offsets[s + 1] = s + 1;
    }
    const char* id_words = reinterpret_cast<const char*>(block + 1);
    for (int k = 0; k < nb; ++k) {
      uint32_t id;
      std::memcpy(&id, id_words + k * sizeof(uint32_t), sizeof(id));
      ids[k][counts[k]] = id;
      counts[k] += (mask >> k) & 1u;
      offsets[k][s + 1] = counts[k];
    }
    if (dense_dim > 0) {
      std::memcpy(input + s * dense_dim, id_words + nb * sizeof(uint32_t), dense_dim * sizeof(float));
    }
  }
  for (int k = 0; k < nb; ++k) lookups_[bags_[k]].count = static_cast<size_t>(counts[k]);
}

int64_t Model::RecordsPerPrefetchBurst(const PackedRecords* packed, int64_t burst_lines) const {
  // A record's lines: its bytes, and its label's line where the label is
  // not in its block.
  const int64_t lines = (RecordBytes(packed) + 63) / 64;
  const bool label_in_block = packed != nullptr && packed->has_ids() && packed->inline_label;
  return std::max<int64_t>(1, burst_lines / std::max<int64_t>(1, label_in_block ? lines : lines + 1));
}

int64_t Model::RecordBytes(const PackedRecords* packed) const {
  const bool bytes = packed != nullptr && packed->has_dense_bytes();
  const bool in_block = packed != nullptr && packed->dense_in_block();
  int64_t b = in_block ? 0 : dense_dim_ * static_cast<int64_t>(bytes ? sizeof(uint8_t) : sizeof(float));
  if (packed != nullptr) b += packed->prefetch_bytes;
  return b;
}

void Model::PrefetchOverflowBlocks(const int32_t* records, int64_t n, const PackedRecords& packed) const {
  // Longer than a slot, so a slot's bytes and a line more cover its start
  // (and, in the text config, all of it).
  const size_t bytes = static_cast<size_t>(packed.stride_words) * sizeof(uint64_t) + 64;
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t* slot = packed.Slot(records[s]);
    if (slot[0] == PackedRecords::kOverflowSlot) PrefetchLines(packed.words.data() + slot[1], bytes);
  }
}

void Model::TouchBatch(const Dataset& data, const int32_t* records, int64_t n, const PackedRecords* packed) const {
  // Loads, not prefetches: LoadRecord waits for each record's first lines
  // in turn, and prefetches issued a few records ahead still left it waiting.
  // Independent loads of every record's first lines overlap all their misses
  // (text config, 16-record batches: data phase 2.1 -> 1.5 us a step).
  uint64_t sink = 0;
  const bool ids = packed != nullptr && packed->has_ids();
  const int32_t* labels = data.labels.empty() || (ids && packed->inline_label) ? nullptr : data.labels.data();
  const bool start_words = ids && packed->stride_words == 0;
  for (int64_t s = 0; s < n; ++s) {
    if (start_words) sink += packed->start[records[s]];
    if (labels != nullptr) sink += static_cast<uint32_t>(labels[records[s]]);
  }
  if (ids) {
    // The block's first word (its counts): in slots, the slot's first word
    // (and a longer block's, after the slots); else at the address the pass
    // above loaded.
    for (int64_t s = 0; s < n; ++s) sink += *packed->Block(records[s]);
  }
  asm volatile("" : : "r"(sink));
}

void Model::LoadRange(const Dataset& data, int64_t first, int64_t n) {
  BeginLoad(data);
  for (int64_t s = 0; s < n; ++s) LoadRecord(data, first + s, s);
  FinishLoad(n);
}

void Model::Forward(bool training, const dnnl::stream& stream) {
  const float* b_out = input_.data();
  // The rows first, while the lines the worker asked for just before this
  // call (PrepareRows) are in L2: pooled after the bottom tower's forward,
  // they had been pushed out by it (DLRM, 2 workers on 2 cores, alternating
  // runs: pooling 110 -> 62 us a step).
  if (!direct_) PoolLookups();
  if (bottom_) {
    bottom_->Forward(training, &rng_, stream);
    b_out = bottom_->out();
  }
  if (direct_) {
    top_->Forward(training, &rng_, stream);
    AddWide();
    return;
  }
  const int64_t zw = static_cast<int64_t>(z_.size()) / batch_;
  // The dense vector's place: columns [0, db) of z_ (concat, dot) or of inter_ (dot_no_dense).
  float* dense_to = interaction_ == Interaction::kDotNoDense ? inter_.data() : z_.data();
  const int64_t dense_stride = interaction_ == Interaction::kDotNoDense ? spec_.interaction_width : zw;
  if (db_ > 0) {
    for (int64_t r = 0; r < batch_; ++r) {
      std::memcpy(dense_to + r * dense_stride, b_out + r * db_, db_ * sizeof(float));
    }
  }
  switch (interaction_) {
    case Interaction::kConcat: break;
    case Interaction::kDot:
      DotInteractionForward(z_.data(), batch_, num_vectors_, vec_dim_, /*with_first=*/true, inter_.data(),
                            spec_.interaction_width);
      break;
    case Interaction::kDotNoDense:
      DotInteractionForward(z_.data(), batch_, num_vectors_, vec_dim_, /*with_first=*/false, inter_.data() + db_,
                            spec_.interaction_width);
      break;
  }
  top_->Forward(training, &rng_, stream);
  AddWide();
}

void Model::PoolLookups() {
  const int64_t zw = static_cast<int64_t>(z_.size()) / batch_;
  // The pooling of rows read in place is where their misses land: timed as
  // a whole (TakeInPlacePoolSeconds).
  bool any_in_place = false;
  const uint64_t pool_start = StepClock::Now();
  for (size_t l = 0; l < lookups_.size(); ++l) {
    const Lookup& lk = spec_.lookups[l];
    if (lk.wide) continue;
    LookupState& st = lookups_[l];
    const int64_t* offsets = BagState(l).offsets.data();
    const float* weights = BatchWeights(BagState(l));
    const bool in_place = st.in_place != RowsInPlace::kNo;
    if (in_place && spec_.tables[lk.table].bf16) {
      any_in_place = true;
      HogwildEmbeddingBagForwardBf16(reinterpret_cast<const uint16_t* const*>(st.addresses.data()), lk.dim,
                                     offsets, weights, batch_, lk.pooling, z_.data() + st.z_offset, zw);
    } else if (in_place) {
      any_in_place = true;
      HogwildEmbeddingBagForward(st.addresses.data(), lk.dim, offsets, weights, batch_, lk.pooling,
                                 z_.data() + st.z_offset, zw);
    } else {
      EmbeddingBagForward(st.rows.data(), lk.dim, offsets, weights, batch_, lk.pooling, z_.data() + st.z_offset, zw);
    }
  }
  if (any_in_place) {
    in_place_pool_s_ += StepClock::Seconds(pool_start, StepClock::Now());
  }
}

void Model::AddWide() {
  const int64_t k = spec_.outputs;
  for (size_t l = 0; l < lookups_.size(); ++l) {
    const Lookup& lk = spec_.lookups[l];
    if (!lk.wide) continue;
    EmbeddingBagForward(lookups_[l].rows.data(), k, BagState(l).offsets.data(), BatchWeights(BagState(l)), batch_,
                        Pooling::kSum, wide_tmp_.data(), k);
    for (int64_t i = 0; i < batch_ * k; ++i) logits_[i] += wide_tmp_[i];
  }
}

LossResult Model::Loss(int64_t valid) {
  switch (head_) {
    case HeadType::kBinary:
      return SigmoidBinaryCrossEntropy(logits_, labels_.data(), valid, batch_, nullptr);
    case HeadType::kRegression:
      return MeanSquaredError(logits_, targets_.data(), valid, batch_, nullptr);
    case HeadType::kSoftmax:
      return SoftmaxCrossEntropyMultiLabel(logits_, label_offsets_.data(), label_sets_.data(), valid, batch_,
                                           spec_.outputs, nullptr);
  }
  return {};
}

LossResult Model::Backward(int64_t valid, const dnnl::stream& stream, GradientReduction reduction) {
  LossResult r;
  switch (head_) {
    case HeadType::kBinary:
      r = SigmoidBinaryCrossEntropy(logits_, labels_.data(), valid, batch_, dlogits_);
      break;
    case HeadType::kRegression:
      r = MeanSquaredError(logits_, targets_.data(), valid, batch_, dlogits_);
      break;
    case HeadType::kSoftmax:
      r = SoftmaxCrossEntropyMultiLabel(logits_, label_offsets_.data(), label_sets_.data(), valid, batch_,
                                        spec_.outputs, dlogits_);
      break;
  }
  const int64_t k = spec_.outputs;
  // The losses give the mean loss's gradient; a sum reduction multiplies it
  // by the records. The dense factor goes into dlogits (after the wide rows
  // have read them), so the deep rows, downstream of it, take the ratio.
  const float records = static_cast<float>(std::max<int64_t>(valid, 1));
  const float dense_scale = reduction.dense == LossReduction::kSum ? records : 1.0f;
  const float sparse_scale = reduction.sparse == LossReduction::kSum ? records : 1.0f;
  valid_ = valid;
  row_grad_scale_ = sparse_scale / dense_scale;
  // Wide rows first: the top tower's backward may change dlogits in place.
  for (size_t l = 0; l < lookups_.size(); ++l) {
    const Lookup& lk = spec_.lookups[l];
    if (!lk.wide) continue;
    EmbeddingBagBackward(dlogits_, k, k, BagState(l).offsets.data(), BatchWeights(BagState(l)), batch_, valid,
                         Pooling::kSum, lookups_[l].row_grads.data(), sparse_scale);
  }
  if (dense_scale != 1.0f) {
    for (int64_t i = 0; i < valid * k; ++i) dlogits_[i] *= dense_scale;
  }
  top_->Backward(stream, gradients_ready_);
  if (direct_) {
    if (rows_ready_) rows_ready_();  // only wide rows here, their gradients taken above
    if (bottom_) bottom_->Backward(stream, gradients_ready_);  // the top wrote its input gradient into the bottom's dout
    return r;
  }
  const int64_t zw = static_cast<int64_t>(z_.size()) / batch_;
  switch (interaction_) {
    case Interaction::kConcat: break;  // dz_ is the top's input gradient
    case Interaction::kDot:
      DotInteractionBackward(z_.data(), dinter_.data(), spec_.interaction_width, batch_, num_vectors_, vec_dim_,
                             /*with_first=*/true, dz_.data());
      break;
    case Interaction::kDotNoDense:
      DotInteractionBackward(z_.data(), dinter_.data() + db_, spec_.interaction_width, batch_, num_vectors_, vec_dim_,
                             /*with_first=*/false, dz_.data());
      break;
  }
  for (size_t l = 0; l < lookups_.size(); ++l) {
    const Lookup& lk = spec_.lookups[l];
    if (lk.wide) continue;
    LookupState& st = lookups_[l];
    if (st.in_place == RowsInPlace::kReadAndSgd) continue;  // ApplyRowSgd reads dz_
    EmbeddingBagBackward(dz_.data() + st.z_offset, zw, lk.dim, BagState(l).offsets.data(),
                         BatchWeights(BagState(l)), batch_, valid, lk.pooling, st.row_grads.data(),
                         sparse_scale / dense_scale);
  }
  if (rows_ready_) rows_ready_();
  if (bottom_) {
    // Gather the gradient wrt the dense vector into the bottom's output gradient.
    const float* from = interaction_ == Interaction::kDotNoDense ? dinter_.data() : dz_.data();
    const int64_t stride = interaction_ == Interaction::kDotNoDense ? spec_.interaction_width : zw;
    float* to = bottom_->dout();
    for (int64_t r = 0; r < batch_; ++r) std::memcpy(to + r * db_, from + r * stride, db_ * sizeof(float));
    bottom_->Backward(stream, gradients_ready_);
  }
  return r;
}

std::vector<std::vector<int>> Model::BackwardGroups() const {
  std::vector<std::vector<int>> groups;
  top_->AddBackwardGroups(&groups);
  if (bottom_) bottom_->AddBackwardGroups(&groups);
  return groups;
}

bool Model::UseRowAddresses(int l, RowsInPlace mode) {
  if (mode != RowsInPlace::kNo && spec_.lookups[l].wide) return false;
  lookups_[l].in_place = mode;
  return true;
}

void Model::PrefetchRowsInPlace(int l) const {
  const LookupState& st = lookups_[l];
  for (size_t i = 0; i < BagState(l).count; ++i) PrefetchLineForWrite(st.addresses[i]);
}

void Model::PrefetchRowsForUpdate() const {
  if (!prefetch_rows_for_update_) return;
  for (size_t l = 0; l < lookups_.size(); ++l) {
    if (fuses_row_sgd(static_cast<int>(l))) PrefetchRowsInPlace(static_cast<int>(l));
  }
}

void Model::ApplyRowSgd(int l, float lr) {
  const Lookup& lk = spec_.lookups[l];
  LookupState& st = lookups_[l];
  if (st.in_place != RowsInPlace::kReadAndSgd) return;
  const int64_t zw = static_cast<int64_t>(z_.size()) / batch_;
  if (spec_.tables[lk.table].bf16) {
    // Stochastic rounding: a new seed per call, from this model's seed.
    const uint64_t seed = SplitMix64Mix(rng_seed_ + 0x9E3779B97F4A7C15ull * ++row_sgd_calls_);
    HogwildEmbeddingBagSgdBf16(reinterpret_cast<uint16_t* const*>(st.addresses.data()), lk.dim,
                               BagState(l).offsets.data(), BatchWeights(BagState(l)), batch_, valid_, lk.pooling,
                               dz_.data() + st.z_offset, zw, row_grad_scale_, lr, seed);
    return;
  }
  HogwildEmbeddingBagSgd(st.addresses.data(), lk.dim, BagState(l).offsets.data(), BatchWeights(BagState(l)),
                         batch_, valid_, lk.pooling, dz_.data() + st.z_offset, zw, row_grad_scale_, lr);
}

std::vector<std::string> Model::ForwardImpls() const {
  std::vector<std::string> impls;
  if (bottom_) bottom_->AddForwardImpls(&impls);
  top_->AddForwardImpls(&impls);
  return impls;
}

double Model::ForwardFlops() const { return (bottom_ ? bottom_->ForwardFlops() : 0) + top_->ForwardFlops(); }
double Model::BackwardFlops() const { return (bottom_ ? bottom_->BackwardFlops() : 0) + top_->BackwardFlops(); }

}  // namespace shardwild
