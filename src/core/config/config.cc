#include "core/config/config.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/base/status.h"

namespace shardwild {
namespace {

// Where a node came from, for messages: "file:line:col" or "--set key=value".
class Locator {
 public:
  // `positions`: name the line and column of a node (false for text made
  // from another structure, whose positions mean nothing to its author).
  Locator(std::string source, std::map<std::string, std::string> overridden, bool positions = true)
      : source_(std::move(source)), overridden_(std::move(overridden)), positions_(positions) {}

  std::string Where(const std::string& key, const YAML::Node& node) const {
    // The longest overridden prefix of `key` wins: its node came from --set.
    for (std::string k = key;; ) {
      auto it = overridden_.find(k);
      if (it != overridden_.end()) return absl::StrCat("--set ", it->second);
      const size_t dot = k.find_last_of(".[");
      if (dot == std::string::npos) break;
      k.resize(dot);
    }
    if (positions_ && node.IsDefined() && node.Mark().line >= 0) {
      return absl::StrCat(source_, ":", node.Mark().line + 1, ":", node.Mark().column + 1);
    }
    return source_;
  }

  absl::Status Error(const std::string& key, const YAML::Node& node, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(key, node), ": ", key, ": ", what));
  }

 private:
  std::string source_;
  std::map<std::string, std::string> overridden_;  // parser key -> "key=value" as given to --set
  bool positions_ = true;
};

std::string Describe(const YAML::Node& node) {
  if (node.IsScalar()) return absl::StrCat("'", node.Scalar(), "'");
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

// A leaf parser: reads `node` into its target or returns what was expected.
using LeafParser = std::function<absl::Status(const std::string& key, const YAML::Node& node, const Locator& loc)>;

// An integer of type T; unsigned types reject negative numbers.
template <typename T>
LeafParser Integer(T* out) {
  return [out](const std::string& key, const YAML::Node& node, const Locator& loc) {
    T v = 0;
    if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &v)) {
      return loc.Error(key, node, absl::StrCat(std::is_unsigned_v<T> ? "expected a non-negative integer, got "
                                                                     : "expected an integer, got ",
                                               Describe(node)));
    }
    *out = v;
    return absl::OkStatus();
  };
}
LeafParser Int64(int64_t* out) { return Integer(out); }
LeafParser Int(int* out) { return Integer(out); }
LeafParser Uint64(uint64_t* out) { return Integer(out); }

// An integer, or the word "auto" (stored as 0).
LeafParser IntOrAuto(int* out) {
  return [out](const std::string& key, const YAML::Node& node, const Locator& loc) {
    int v = 0;
    if (node.IsScalar() && node.Scalar() == "auto") {
      *out = 0;
      return absl::OkStatus();
    }
    if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &v) || v < 1) {
      return loc.Error(key, node, absl::StrCat("expected a positive integer or 'auto', got ", Describe(node)));
    }
    *out = v;
    return absl::OkStatus();
  };
}

template <typename T>
LeafParser Real(T* out) {
  return [out](const std::string& key, const YAML::Node& node, const Locator& loc) {
    double v = 0;
    if (!node.IsScalar() || !absl::SimpleAtod(node.Scalar(), &v) || !std::isfinite(v)) {
      return loc.Error(key, node, absl::StrCat("expected a number, got ", Describe(node)));
    }
    *out = static_cast<T>(v);
    return absl::OkStatus();
  };
}

LeafParser Bool(bool* out) {
  return [out](const std::string& key, const YAML::Node& node, const Locator& loc) {
    const std::string s = node.IsScalar() ? absl::AsciiStrToLower(node.Scalar()) : "";
    if (s == "true" || s == "yes" || s == "on") {
      *out = true;
    } else if (s == "false" || s == "no" || s == "off") {
      *out = false;
    } else {
      return loc.Error(key, node, absl::StrCat("expected true or false, got ", Describe(node)));
    }
    return absl::OkStatus();
  };
}

LeafParser String(std::string* out) {
  return [out](const std::string& key, const YAML::Node& node, const Locator& loc) {
    if (!node.IsScalar()) return loc.Error(key, node, absl::StrCat("expected a string, got ", Describe(node)));
    *out = node.Scalar();
    return absl::OkStatus();
  };
}

template <typename E>
LeafParser Enum(E* out, std::vector<std::pair<std::string, E>> choices) {
  return [out, choices](const std::string& key, const YAML::Node& node, const Locator& loc) {
    if (node.IsScalar()) {
      for (const auto& [name, value] : choices) {
        if (node.Scalar() == name) {
          *out = value;
          return absl::OkStatus();
        }
      }
    }
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    return loc.Error(key, node, absl::StrCat("expected one of ", absl::StrJoin(names, ", "), "; got ", Describe(node)));
  };
}

// A mapping section: named leaves and sub-sections. Unknown keys are errors.
struct Section {
  std::map<std::string, LeafParser> leaves;
  std::map<std::string, std::function<absl::Status(const std::string&, const YAML::Node&, const Locator&)>> custom;

  absl::Status Parse(const std::string& prefix, const YAML::Node& node, const Locator& loc) const {
    if (!node.IsMap()) return loc.Error(prefix, node, absl::StrCat("expected a mapping, got ", Describe(node)));
    for (const auto& kv : node) {
      const std::string name = kv.first.Scalar();
      const std::string key = prefix.empty() ? name : absl::StrCat(prefix, ".", name);
      if (auto it = leaves.find(name); it != leaves.end()) {
        SW_RETURN_IF_ERROR(it->second(key, kv.second, loc));
      } else if (auto ct = custom.find(name); ct != custom.end()) {
        SW_RETURN_IF_ERROR(ct->second(key, kv.second, loc));
      } else {
        std::vector<std::string> known;
        for (const auto& l : leaves) known.push_back(l.first);
        for (const auto& c : custom) known.push_back(c.first);
        return absl::InvalidArgumentError(absl::StrCat(loc.Where(key, kv.first), ": unknown key '", key,
                                                       "' (expected one of: ", absl::StrJoin(known, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }
};

absl::Status ParseLayers(const std::string& key, const YAML::Node& node, const Locator& loc,
                         std::vector<LayerOptions>* layers) {
  if (!node.IsSequence()) return loc.Error(key, node, absl::StrCat("expected a list of layers, got ", Describe(node)));
  layers->clear();
  for (size_t i = 0; i < node.size(); ++i) {
    LayerOptions layer;
    Section s;
    s.leaves["type"] = String(&layer.type);
    s.leaves["units"] = [&layer](const std::string& k, const YAML::Node& n, const Locator& l) -> absl::Status {
      if (n.IsScalar() && n.Scalar() == "auto") {
        layer.units = 0;  // the head's outputs; allowed on the top tower's last layer (ModelOptions::Validate)
        return absl::OkStatus();
      }
      return Int64(&layer.units)(k, n, l);
    };
    s.leaves["activation"] = Enum(&layer.activation, {{"none", Activation::kNone},
                                                      {"relu", Activation::kRelu},
                                                      {"sigmoid", Activation::kSigmoid},
                                                      {"tanh", Activation::kTanh}});
    s.leaves["dropout"] = Real(&layer.dropout);
    SW_RETURN_IF_ERROR(s.Parse(absl::StrCat(key, "[", i, "]"), node[i], loc));
    layers->push_back(layer);
  }
  return absl::OkStatus();
}

// A list of strings (or one string, a list of one).
absl::Status ParseStrings(const std::string& key, const YAML::Node& node, const Locator& loc,
                          std::vector<std::string>* out) {
  out->clear();
  if (node.IsScalar()) {
    out->push_back(node.Scalar());
    return absl::OkStatus();
  }
  if (!node.IsSequence()) return loc.Error(key, node, absl::StrCat("expected a list of names, got ", Describe(node)));
  for (size_t i = 0; i < node.size(); ++i) {
    if (!node[i].IsScalar()) {
      return loc.Error(absl::StrCat(key, "[", i, "]"), node[i], absl::StrCat("expected a name, got ", Describe(node[i])));
    }
    out->push_back(node[i].Scalar());
  }
  return absl::OkStatus();
}

// The leaves of a table's own settings (model.tables[i], or inline in a
// model.sparse[i] entry) into `t`.
void AddTableLeaves(Section* s, TableOptions* t) {
  s->leaves["rows"] = Int64(&t->rows);
  s->leaves["dim"] = Int64(&t->dim);
  s->custom["kind"] = [t](const std::string& k, const YAML::Node& n, const Locator& l) {
    return Enum(&t->dynamic, {{"static", false}, {"dynamic", true}})(k, n, l);
  };
  s->custom["on_full"] = [t](const std::string& k, const YAML::Node& n, const Locator& l) {
    return Enum(&t->evict_lru, {{"error", false}, {"evict_lru", true}})(k, n, l);
  };
  s->leaves["init_scale"] = Real(&t->init_scale);
  s->custom["dtype"] = [t](const std::string& k, const YAML::Node& n, const Locator& l) {
    return Enum(&t->bf16, {{"f32", false}, {"bf16", true}})(k, n, l);
  };
}

absl::Status ParseTables(const std::string& key, const YAML::Node& node, const Locator& loc,
                         std::vector<TableOptions>* tables) {
  if (!node.IsSequence()) return loc.Error(key, node, absl::StrCat("expected a list of tables, got ", Describe(node)));
  for (size_t i = 0; i < node.size(); ++i) {
    TableOptions t;
    Section s;
    s.leaves["name"] = String(&t.name);
    AddTableLeaves(&s, &t);
    SW_RETURN_IF_ERROR(s.Parse(absl::StrCat(key, "[", i, "]"), node[i], loc));
    if (t.name.empty()) return loc.Error(absl::StrCat(key, "[", i, "].name"), node[i], "is required");
    tables->push_back(t);
  }
  return absl::OkStatus();
}

// model.sparse: each entry names one field (`field`) or several (`fields`,
// each its own feature), and either a shared table (`table`) or its own
// table's settings inline (rows, dim, kind, on_full, init_scale, dtype): then each
// field gets a table named after it.
absl::Status ParseSparse(const std::string& key, const YAML::Node& node, const Locator& loc, ModelOptions* model) {
  if (!node.IsSequence()) return loc.Error(key, node, absl::StrCat("expected a list of sparse features, got ", Describe(node)));
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item = absl::StrCat(key, "[", i, "]");
    SparseFeatureOptions f;
    TableOptions own;
    std::vector<std::string> fields;
    bool inline_table = false;
    Section s;
    s.custom["field"] = [&fields](const std::string& k, const YAML::Node& n, const Locator& l) {
      if (!n.IsScalar()) return l.Error(k, n, absl::StrCat("expected a field name, got ", Describe(n)));
      fields = {n.Scalar()};
      return absl::OkStatus();
    };
    s.custom["fields"] = [&fields](const std::string& k, const YAML::Node& n, const Locator& l) {
      return ParseStrings(k, n, l, &fields);
    };
    s.leaves["table"] = String(&f.table);
    s.leaves["pooling"] = Enum(&f.pooling, {{"sum", Pooling::kSum}, {"mean", Pooling::kMean}});
    s.leaves["weighted"] = Bool(&f.weighted);
    Section table_keys;
    AddTableLeaves(&table_keys, &own);
    // (Copies, not structured bindings: older clang can't capture those.)
    for (const auto& entry : table_keys.leaves) {
      const LeafParser parser = entry.second;
      s.custom[entry.first] = [&inline_table, parser](const std::string& k, const YAML::Node& n, const Locator& l) {
        inline_table = true;
        return parser(k, n, l);
      };
    }
    for (const auto& entry : table_keys.custom) {
      const auto parser = entry.second;
      s.custom[entry.first] = [&inline_table, parser](const std::string& k, const YAML::Node& n, const Locator& l) {
        inline_table = true;
        return parser(k, n, l);
      };
    }
    SW_RETURN_IF_ERROR(s.Parse(item, node[i], loc));
    if (fields.empty()) return loc.Error(item, node[i], "needs `field` or `fields`");
    if (inline_table && !f.table.empty()) {
      return loc.Error(item + ".table", node[i]["table"],
                       "give either a shared `table` or this feature's own table settings (rows, dim, ...), not both");
    }
    if (f.table.empty() && !inline_table) {
      return loc.Error(item, node[i], "needs a `table` (from model.tables) or its own `rows` and `dim`");
    }
    for (const std::string& name : fields) {
      SparseFeatureOptions g = f;
      g.field = name;
      if (inline_table) {
        TableOptions t = own;
        t.name = name;
        g.table = name;
        model->tables.push_back(t);
      }
      model->sparse.push_back(g);
    }
  }
  return absl::OkStatus();
}

// optimizer.decay_epochs and optimizer.warmup_epochs (also under
// optimizer.sparse): read as numbers while parsing, turned into fractions of
// the run (decay_every, warmup) once the whole config, and so train.epochs,
// has been read.
struct EpochKeys {
  struct Pending {
    std::string key;           // "optimizer.decay_epochs"
    std::string fraction_key;  // "optimizer.decay_every"
    YAML::Node node;
    double epochs = 0;
    bool warmup = false;       // [0, epochs) rather than (0, epochs]
    double* fraction = nullptr;
  };
  std::vector<Pending> pending;
  std::set<std::string> fractions_given;  // decay_every / warmup keys given

  // A leaf for decay_every or warmup that remembers it was given.
  LeafParser Fraction(double* out) {
    return [this, inner = Real(out)](const std::string& key, const YAML::Node& node, const Locator& loc) {
      fractions_given.insert(key);
      return inner(key, node, loc);
    };
  }
  // `<name>_epochs`, stored in `out` as a fraction of the run by Resolve.
  LeafParser Epochs(const char* fraction_name, bool warmup, double* out) {
    return [this, fraction_name, warmup, out](const std::string& key, const YAML::Node& node, const Locator& loc) {
      double v = 0;
      SW_RETURN_IF_ERROR(Real(&v)(key, node, loc));
      const std::string prefix = key.substr(0, key.rfind('.') + 1);
      pending.push_back({key, prefix + fraction_name, node, v, warmup, out});
      return absl::OkStatus();
    };
  }

  absl::Status Resolve(int epochs, const Locator& loc) const {
    for (const Pending& p : pending) {
      if (fractions_given.count(p.fraction_key)) {
        return loc.Error(p.key, p.node, absl::StrCat("give either ", p.key, " or ", p.fraction_key, ", not both"));
      }
      if (epochs < 1) continue;  // validation reports train.epochs
      const bool ok = p.warmup ? (p.epochs >= 0 && p.epochs < epochs) : (p.epochs > 0 && p.epochs <= epochs);
      if (!ok) {
        return loc.Error(p.key, p.node, absl::StrCat("must be in ", p.warmup ? "[0, " : "(0, ", "train.epochs = ",
                                                     epochs, p.warmup ? ")" : "]", ", got ", p.epochs));
      }
      *p.fraction = p.epochs / epochs;
    }
    return absl::OkStatus();
  }
};

// The keys of an optimizer section (optimizer, optimizer.sparse) into `o`.
void AddOptimizerLeaves(Section* s, OptimizerOptions* o, EpochKeys* epoch_keys) {
  s->leaves["type"] = Enum(&o->type, {{"sgd", OptimizerType::kSgd},
                                      {"momentum", OptimizerType::kMomentum},
                                      {"adam", OptimizerType::kAdam},
                                      {"adagrad", OptimizerType::kAdagrad},
                                      {"rmsprop", OptimizerType::kRmsprop},
                                      {"ftrl", OptimizerType::kFtrl}});
  s->leaves["lr"] = Real(&o->lr);
  s->leaves["momentum"] = Real(&o->momentum);
  s->leaves["nesterov"] = Bool(&o->nesterov);
  s->leaves["beta1"] = Real(&o->beta1);
  s->leaves["beta2"] = Real(&o->beta2);
  s->leaves["epsilon"] = Real(&o->epsilon);
  s->leaves["initial_accumulator_value"] = Real(&o->initial_accumulator_value);
  s->leaves["rho"] = Real(&o->rho);
  s->leaves["l1"] = Real(&o->l1);
  s->leaves["l2"] = Real(&o->l2);
  s->leaves["schedule"] = Enum(&o->schedule, {{"constant", LrSchedule::kConstant},
                                              {"cosine", LrSchedule::kCosine},
                                              {"step", LrSchedule::kStep},
                                              {"linear", LrSchedule::kLinear}});
  s->leaves["final_lr"] = Real(&o->final_lr);
  s->leaves["decay_rate"] = Real(&o->decay_rate);
  s->leaves["decay_every"] = epoch_keys->Fraction(&o->decay_every);
  s->leaves["decay_epochs"] = epoch_keys->Epochs("decay_every", /*warmup=*/false, &o->decay_every);
  s->leaves["warmup"] = epoch_keys->Fraction(&o->warmup);
  s->leaves["warmup_epochs"] = epoch_keys->Epochs("warmup", /*warmup=*/true, &o->warmup);
  s->leaves["warmup_start_lr"] = Real(&o->warmup_start_lr);
  s->leaves["loss_reduction"] = Enum(&o->loss_reduction, {{"sum_over_batch_size", LossReduction::kSumOverBatchSize},
                                                          {"sum", LossReduction::kSum}});
}

// The keys of the ps section into `o`.
void AddStoreLeaves(Section* s, StoreOptions* o) {
  s->leaves["shards"] = IntOrAuto(&o->shards);
  s->leaves["update"] = Enum(&o->update, {{"hogwild", UpdateMode::kHogwild},
                                          {"row_lock", UpdateMode::kRowLock},
                                          {"sync", UpdateMode::kSync}});
  s->leaves["max_staleness"] = Int64(&o->max_staleness);
  s->leaves["hot_rows"] = Int64(&o->hot_rows);
  s->leaves["hot_rows_merge_every"] = Int(&o->hot_rows_merge_every);
  s->leaves["job_name"] = String(&o->job_name);
  s->leaves["stale_segments"] = Enum(&o->stale_segments, {{"remove", StaleSegmentPolicy::kRemove},
                                                          {"report", StaleSegmentPolicy::kReport},
                                                          {"fail", StaleSegmentPolicy::kFail}});
  s->leaves["huge_pages"] = Enum(&o->huge_pages, {{"auto", HugePagePolicy::kAuto}, {"off", HugePagePolicy::kOff}});
  s->leaves["memory_kind"] = Enum(&o->memory_kind, {{"auto", StoreMemoryKind::kAuto},
                                                    {"shared", StoreMemoryKind::kShared},
                                                    {"private", StoreMemoryKind::kPrivate}});
  s->leaves["replication"] = Enum(&o->replication, {{"per_machine", ReplicationPolicy::kPerMachine},
                                                    {"per_node", ReplicationPolicy::kPerNode},
                                                    {"per_core", ReplicationPolicy::kPerCore},
                                                    {"auto", ReplicationPolicy::kAuto}});
  s->leaves["sync_every"] = Int64(&o->sync_every);
  s->custom["partitioner"] = [o](const std::string& k, const YAML::Node& n, const Locator& l) {
    Section partitioner;
    partitioner.leaves["type"] = Enum(&o->partitioner.kind, {{"fixed_shards", PartitionerOptions::Kind::kFixedShards},
                                                             {"min_size", PartitionerOptions::Kind::kMinSize},
                                                             {"max_size", PartitionerOptions::Kind::kMaxSize}});
    partitioner.leaves["min_shard_bytes"] = Int64(&o->partitioner.min_shard_bytes);
    partitioner.leaves["max_shard_bytes"] = Int64(&o->partitioner.max_shard_bytes);
    partitioner.leaves["max_shards"] = Int(&o->partitioner.max_shards);
    return partitioner.Parse(k, n, l);
  };
}

absl::Status ParseRoot(const YAML::Node& root, const Locator& loc, Config* c) {
  Section model;
  model.leaves["input_dim"] = Int64(&c->model.input_dim);
  model.leaves["loss"] = Enum(&c->model.loss, {{"softmax_cross_entropy", LossType::kSoftmaxCrossEntropy}});
  auto top_layers = [c](const std::string& k, const YAML::Node& n, const Locator& l) -> absl::Status {
    if (!c->model.layers.empty()) return l.Error(k, n, "give the top tower as either `layers` or `top`, not both");
    return ParseLayers(k, n, l, &c->model.layers);
  };
  model.custom["layers"] = top_layers;
  model.custom["top"] = top_layers;
  model.custom["bottom"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseLayers(k, n, l, &c->model.bottom);
  };
  model.custom["tables"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseTables(k, n, l, &c->model.tables);
  };
  model.custom["sparse"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseSparse(k, n, l, &c->model);
  };
  model.custom["wide"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseStrings(k, n, l, &c->model.wide);
  };
  model.leaves["wide_rows"] = Int64(&c->model.wide_rows);
  model.leaves["interaction"] = Enum(&c->model.interaction, {{"concat", Interaction::kConcat},
                                                             {"dot", Interaction::kDot},
                                                             {"dot_no_dense", Interaction::kDotNoDense}});
  model.leaves["precision"] = Enum(&c->model.precision, {{"f32", Precision::kF32}, {"bf16", Precision::kBf16}});
  model.leaves["head"] = Enum(&c->model.head, {{"softmax", HeadType::kSoftmax},
                                               {"binary", HeadType::kBinary},
                                               {"regression", HeadType::kRegression}});

  Section data;
  data.leaves["format"] = Enum(&c->data.format, {{"idx", DataFormat::kIdx},
                                                 {"criteo", DataFormat::kCriteo},
                                                 {"libsvm", DataFormat::kLibsvm},
                                                 {"text", DataFormat::kText},
                                                 {"csv", DataFormat::kCsv}});
  data.leaves["on_error"] = Enum(&c->data.on_error, {{"fail", OnBadRow::kFail}, {"skip", OnBadRow::kSkip}});
  data.leaves["dense_transform"] = Enum(&c->data.dense_transform, {{"log1p", DenseTransform::kLog1p},
                                                                   {"log3", DenseTransform::kLog3},
                                                                   {"none", DenseTransform::kNone}});
  data.leaves["cache"] = Bool(&c->data.cache);
  data.leaves["cache_dir"] = String(&c->data.cache_dir);
  data.leaves["reader_threads"] = Int(&c->data.reader_threads);
  Section text;
  text.leaves["word_ngrams"] = Int(&c->data.text.word_ngrams);
  text.leaves["ngrams_field"] = Bool(&c->data.text.ngrams_field);
  data.custom["text"] = [text](const std::string& k, const YAML::Node& n, const Locator& l) { return text.Parse(k, n, l); };
  Section csv;
  csv.leaves["label"] = String(&c->data.csv.label);
  csv.custom["dense"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseStrings(k, n, l, &c->data.csv.dense);
  };
  csv.custom["categorical"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseStrings(k, n, l, &c->data.csv.categorical);
  };
  csv.leaves["delimiter"] = [c](const std::string& k, const YAML::Node& n, const Locator& l) -> absl::Status {
    if (!n.IsScalar() || n.Scalar().size() != 1) {
      return l.Error(k, n, absl::StrCat("expected one character, got ", Describe(n)));
    }
    c->data.csv.delimiter = n.Scalar()[0];
    return absl::OkStatus();
  };
  data.custom["csv"] = [csv](const std::string& k, const YAML::Node& n, const Locator& l) { return csv.Parse(k, n, l); };
  // A path, a glob, or a list of them (kept joined by commas, as
  // ExpandDataFiles reads them; a name with a comma can't be listed).
  for (const std::pair<const char*, std::string*>& file_key :
       {std::pair<const char*, std::string*>{"train", &c->data.train}, {"test", &c->data.test}}) {
    std::string* out = file_key.second;  // (not a structured binding: older clang can't capture those)
    data.leaves[file_key.first] = [out](const std::string& k, const YAML::Node& n, const Locator& l) -> absl::Status {
      std::vector<std::string> files;
      SW_RETURN_IF_ERROR(ParseStrings(k, n, l, &files));
      for (size_t i = 0; i < files.size(); ++i) {
        if (n.IsSequence() && files[i].find(',') != std::string::npos) {
          return l.Error(absl::StrCat(k, "[", i, "]"), n[i], "expected a file name without a comma");
        }
      }
      *out = absl::StrJoin(files, ",");
      return absl::OkStatus();
    };
  }
  data.leaves["max_train_records"] = Int64(&c->data.max_train_records);
  data.leaves["max_test_records"] = Int64(&c->data.max_test_records);
  data.leaves["records_per_task"] = Int64(&c->data.records_per_task);
  data.leaves["stream"] = Bool(&c->data.stream);
  data.leaves["shuffle_buffer"] = Int64(&c->data.shuffle_buffer);
  data.leaves["prefetch_batches"] = Int(&c->data.prefetch_batches);
  data.leaves["memory_budget_mb"] = Int64(&c->data.memory_budget_mb);
  data.leaves["cache_part_mb"] = Int64(&c->data.cache_part_mb);
  data.leaves["prefetch_burst_lines"] = IntOrAuto(&c->data.prefetch_burst_lines);

  Section train;
  train.leaves["workers"] = IntOrAuto(&c->train.workers);
  train.leaves["intra_op_threads"] = IntOrAuto(&c->train.intra_op_threads);
  train.leaves["epochs"] = Int(&c->train.epochs);
  train.leaves["batch_size"] = Int64(&c->train.batch_size);
  train.leaves["seed"] = Uint64(&c->train.seed);
  train.leaves["pin_threads"] = Bool(&c->train.pin_threads);
  train.leaves["log_every_s"] = Real(&c->train.log_every_s);
  train.leaves["pull_every"] = Int(&c->train.pull_every);
  train.leaves["worker_processes"] = Bool(&c->train.worker_processes);
  train.leaves["restart_workers"] = Bool(&c->train.restart_workers);
  train.leaves["task_timeout_s"] = Real(&c->train.task_timeout_s);
  train.leaves["max_task_retries"] = Int(&c->train.max_task_retries);
  train.leaves["strategy"] =
      Enum(&c->train.strategy, {{"ps", TrainStrategy::kPs}, {"allreduce", TrainStrategy::kAllreduce}});

  Section opt;
  EpochKeys epoch_keys;
  AddOptimizerLeaves(&opt, &c->optimizer, &epoch_keys);
  // optimizer.sparse: the embedding tables' own optimizer (every key as in
  // optimizer; a key not given takes its default, not the dense value).
  opt.custom["sparse"] = [c, &epoch_keys](const std::string& k, const YAML::Node& n, const Locator& l) {
    c->sparse_optimizer.emplace();
    Section sparse;
    AddOptimizerLeaves(&sparse, &*c->sparse_optimizer, &epoch_keys);
    return sparse.Parse(k, n, l);
  };

  Section ps;
  AddStoreLeaves(&ps, &c->ps);

  Section bench;
  bench.leaves["warmup_steps"] = Int64(&c->bench.warmup_steps);
  bench.leaves["steps"] = Int64(&c->bench.steps);
  bench.leaves["peak_seconds"] = Real(&c->bench.peak_seconds);

  Section ckpt;
  ckpt.leaves["dir"] = String(&c->checkpoint.dir);
  ckpt.leaves["every_steps"] = Int64(&c->checkpoint.every_steps);
  ckpt.leaves["every_epochs"] = Int(&c->checkpoint.every_epochs);
  ckpt.leaves["keep"] = Int(&c->checkpoint.keep);

  Section eval;
  eval.leaves["every_epochs"] = Int(&c->eval.every_epochs);
  eval.leaves["every_steps"] = Int64(&c->eval.every_steps);
  eval.leaves["sidecar"] = Bool(&c->eval.sidecar);

  Section metrics;
  metrics.leaves["jsonl"] = String(&c->metrics.jsonl);
  metrics.leaves["tensorboard"] = String(&c->metrics.tensorboard);
  metrics.leaves["port"] = Int(&c->metrics.port);
  metrics.leaves["bind"] = String(&c->metrics.bind);

  Section early;
  early.leaves["monitor"] = String(&c->early_stopping.monitor);
  early.leaves["mode"] = String(&c->early_stopping.mode);
  early.leaves["min_delta"] = Real(&c->early_stopping.min_delta);
  early.leaves["patience"] = Int(&c->early_stopping.patience);

  Section topo;
  topo.leaves["synthetic"] = String(&c->topology.synthetic);
  topo.leaves["xml"] = String(&c->topology.xml);

  Section cluster;
  cluster.leaves["bind_host"] = String(&c->cluster.bind_host);
  cluster.leaves["token_file"] = String(&c->cluster.token_file);
  cluster.leaves["tls_cert_file"] = String(&c->cluster.tls_cert_file);
  cluster.leaves["tls_key_file"] = String(&c->cluster.tls_key_file);
  cluster.leaves["tls_ca_file"] = String(&c->cluster.tls_ca_file);
  cluster.leaves["deadline_s"] = Real(&c->cluster.deadline_s);
  cluster.leaves["keepalive_s"] = Real(&c->cluster.keepalive_s);
  cluster.leaves["max_attempts"] = Int(&c->cluster.max_attempts);
  cluster.leaves["initial_backoff_s"] = Real(&c->cluster.initial_backoff_s);
  cluster.leaves["max_backoff_s"] = Real(&c->cluster.max_backoff_s);
  cluster.leaves["max_message_bytes"] = Int64(&c->cluster.max_message_bytes);
  cluster.leaves["compression"] = Enum(&c->cluster.compression, {{"none", GradientCompression::kNone},
                                                                 {"bf16", GradientCompression::kBf16},
                                                                 {"fp16", GradientCompression::kFp16}});
  cluster.leaves["launcher"] = Enum(&c->cluster.launcher, {{"auto", ClusterLauncher::kAuto},
                                                           {"tf_config", ClusterLauncher::kTfConfig},
                                                           {"slurm", ClusterLauncher::kSlurm},
                                                           {"mpi", ClusterLauncher::kMpi},
                                                           {"none", ClusterLauncher::kNone}});
  cluster.leaves["base_port"] = Int(&c->cluster.base_port);
  cluster.leaves["ps_tasks"] = Int(&c->cluster.ps_tasks);
  cluster.leaves["min_workers"] = Int(&c->cluster.min_workers);
  cluster.leaves["rendezvous"] = String(&c->cluster.rendezvous);
  cluster.leaves["collective_timeout_s"] = Real(&c->cluster.collective_timeout_s);
  cluster.leaves["allreduce_algorithm"] = Enum(&c->cluster.allreduce_algorithm,
                                               {{"ring", CollectiveAlgorithm::kRing},
                                                {"halving_doubling", CollectiveAlgorithm::kHalvingDoubling}});
  cluster.leaves["allreduce_overlap"] = Enum(&c->cluster.allreduce_overlap, {{"auto", AllreduceOverlap::kAuto},
                                                                           {"true", AllreduceOverlap::kOn},
                                                                           {"false", AllreduceOverlap::kOff}});

  Section top;
  auto sub = [](const Section& s) {
    return [&s](const std::string& k, const YAML::Node& n, const Locator& l) { return s.Parse(k, n, l); };
  };
  top.custom["model"] = sub(model);
  top.custom["data"] = sub(data);
  top.custom["train"] = sub(train);
  top.custom["optimizer"] = sub(opt);
  top.custom["ps"] = sub(ps);
  top.custom["bench"] = sub(bench);
  top.custom["topology"] = sub(topo);
  top.custom["checkpoint"] = sub(ckpt);
  top.custom["metrics"] = sub(metrics);
  top.custom["eval"] = sub(eval);
  top.custom["early_stopping"] = sub(early);
  top.custom["cluster"] = sub(cluster);
  SW_RETURN_IF_ERROR(top.Parse("", root, loc));
  return epoch_keys.Resolve(c->train.epochs, loc);
}

// Sets root[path] = value, creating mappings on the way. List items are
// addressed by a numeric segment.
absl::Status ApplyOverride(YAML::Node root, const ConfigOverride& o) {
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", o.key, "=", o.value, ": not a valid YAML value: ", e.msg));
  }
  if (!value.IsDefined() || value.IsNull()) value = YAML::Node(o.value);
  std::vector<std::string> parts = absl::StrSplit(o.key, '.');
  // yaml-cpp nodes are handles: assigning through a copy writes into the tree,
  // but operator= on a handle rebinds, so walk with reset().
  YAML::Node cur;
  cur.reset(root);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p.empty()) return absl::InvalidArgumentError(absl::StrCat("--set ", o.key, ": empty key segment"));
    const bool last = i + 1 == parts.size();
    YAML::Node next;
    size_t idx = 0;
    if (cur.IsSequence() && absl::SimpleAtoi(p, &idx)) {
      if (idx >= cur.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", o.key, ": index ", idx, " is out of range (the list has ",
                                                       cur.size(), " items)"));
      }
      if (last) {
        cur[idx] = value;
        return absl::OkStatus();
      }
      next.reset(cur[idx]);
    } else {
      if (!cur.IsMap() && !cur.IsNull() && cur.IsDefined()) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", o.key, ": '", parts[i - 1], "' is not a mapping"));
      }
      if (last) {
        cur[p] = value;
        return absl::OkStatus();
      }
      if (!cur[p].IsDefined() || cur[p].IsNull()) cur[p] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[p]);
    }
    cur.reset(next);
  }
  return absl::OkStatus();
}

std::string DottedToKey(const std::string& dotted) {
  // "model.layers.1.units" -> "model.layers[1].units", matching parser keys.
  std::vector<std::string> parts = absl::StrSplit(dotted, '.');
  std::string out;
  for (const auto& p : parts) {
    size_t idx;
    if (!out.empty() && absl::SimpleAtoi(p, &idx)) {
      absl::StrAppend(&out, "[", p, "]");
    } else {
      absl::StrAppend(&out, out.empty() ? "" : ".", p);
    }
  }
  return out;
}

absl::StatusOr<ConfigOverride> ParseOverrideImpl(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", text, ": expected key=value (for example train.workers=2)"));
  }
  return ConfigOverride{text.substr(0, eq), text.substr(eq + 1)};
}

}  // namespace

absl::StatusOr<ConfigOverride> ParseOverride(const std::string& text) {
  return WithErrorKind(ParseOverrideImpl(text), ErrorKind::kConfig);
}

namespace {

// YAML::Load of `yaml`, an empty document read as an empty mapping.
absl::StatusOr<YAML::Node> LoadYamlOrEmptyMap(const std::string& yaml, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": invalid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  return root;
}

absl::StatusOr<Config> LoadConfigFromStringImpl(const std::string& yaml, const std::string& source_name,
                                                const std::vector<ConfigOverride>& overrides) {
  SW_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlOrEmptyMap(yaml, source_name));
  std::map<std::string, std::string> overridden;
  for (const ConfigOverride& o : overrides) {
    SW_RETURN_IF_ERROR(ApplyOverride(root, o));
    overridden[DottedToKey(o.key)] = absl::StrCat(o.key, "=", o.value);
  }
  Locator loc(source_name, overridden);
  Config config;
  config.source = source_name;
  try {
    SW_RETURN_IF_ERROR(ParseRoot(root, loc, &config));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", e.what()));
  }
  absl::Status valid = config.Validate();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", valid.message()));
  return config;
}

}  // namespace

absl::StatusOr<Config> LoadConfigFromString(const std::string& yaml, const std::string& source_name,
                                            const std::vector<ConfigOverride>& overrides) {
  return WithErrorKind(LoadConfigFromStringImpl(yaml, source_name, overrides), ErrorKind::kConfig);
}

absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return WithErrorKind(absl::NotFoundError(absl::StrCat(path, ": cannot open config file: ", std::strerror(errno))),
                         ErrorKind::kConfig);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return LoadConfigFromString(ss.str(), path, overrides);
}

// ---- Store specs (StoreSpec) -------------------------------------------------

namespace {

// Optimizer keys of a training run rather than of a store's update rule: a
// store applies the rate each push gives, and the gradient it is handed.
constexpr const char* kRunOnlyOptimizerKeys[] = {"schedule",     "final_lr", "decay_rate",    "decay_every",
                                                 "decay_epochs", "warmup",   "warmup_epochs", "warmup_start_lr",
                                                 "loss_reduction"};
// ps keys of a training job's workers and replicas rather than of one store.
constexpr const char* kJobOnlyStoreKeys[] = {"max_staleness", "replication", "sync_every", "hot_rows",
                                             "hot_rows_merge_every", "memory_kind"};

// An optimizer section of a store spec (optimizer, optimizer.sparse) into `o`.
void AddStoreOptimizerLeaves(Section* s, OptimizerOptions* o, EpochKeys* unused_epoch_keys) {
  AddOptimizerLeaves(s, o, unused_epoch_keys);
  for (const char* key : kRunOnlyOptimizerKeys) s->leaves.erase(key);
}

// variables.<name>'s shape: a list of 1 or 2 integers >= 1.
absl::Status ParseShape(const std::string& key, const YAML::Node& node, const Locator& loc, std::vector<int64_t>* shape) {
  constexpr char kExpected[] = "expected a shape: a list of 1 or 2 integers >= 1, got ";
  if (!node.IsSequence()) return loc.Error(key, node, absl::StrCat(kExpected, Describe(node)));
  if (node.size() < 1 || node.size() > 2) return loc.Error(key, node, absl::StrCat(kExpected, "a list of ", node.size()));
  shape->clear();
  for (size_t i = 0; i < node.size(); ++i) {
    int64_t v = 0;
    if (!node[i].IsScalar() || !absl::SimpleAtoi(node[i].Scalar(), &v) || v < 1) {
      return loc.Error(key, node[i], absl::StrCat(kExpected, Describe(node[i]), " in it"));
    }
    shape->push_back(v);
  }
  return absl::OkStatus();
}

// variables: {name: [rows] | [rows, cols] | {shape: [...], init: ...}}.
absl::Status ParseStoreVariables(const std::string& key, const YAML::Node& node, const Locator& loc,
                                 std::vector<StoreVariableOptions>* variables) {
  if (!node.IsMap()) {
    return loc.Error(key, node, absl::StrCat("expected a mapping of variable names to shapes, got ", Describe(node)));
  }
  for (const auto& kv : node) {
    StoreVariableOptions v;
    v.name = kv.first.Scalar();
    const std::string k = absl::StrCat(key, ".", v.name);
    if (v.name.empty() || v.name.size() > 63) return loc.Error(k, kv.first, "a variable name must be 1..63 bytes");
    for (const StoreVariableOptions& other : *variables) {
      if (other.name == v.name) return loc.Error(k, kv.first, "this variable is given twice");
    }
    if (kv.second.IsMap()) {
      bool has_shape = false;
      Section s;
      s.custom["shape"] = [&v, &has_shape](const std::string& sk, const YAML::Node& n, const Locator& l) {
        has_shape = true;
        return ParseShape(sk, n, l, &v.shape);
      };
      s.leaves["init"] = Enum(&v.init, {{"zeros", StoreVariableInit::kZeros},
                                        {"glorot_uniform", StoreVariableInit::kGlorotUniform}});
      SW_RETURN_IF_ERROR(s.Parse(k, kv.second, loc));
      if (!has_shape) return loc.Error(k + ".shape", kv.second, "is required");
    } else {
      SW_RETURN_IF_ERROR(ParseShape(k, kv.second, loc, &v.shape));
    }
    variables->push_back(std::move(v));
  }
  return absl::OkStatus();
}

// A store spec's optimizer section (with `sparse`) into `optimizer` and
// `sparse_optimizer`.
absl::Status ParseStoreOptimizers(const std::string& key, const YAML::Node& node, const Locator& loc,
                                  OptimizerOptions* optimizer, std::optional<OptimizerOptions>* sparse_optimizer) {
  EpochKeys epoch_keys;  // stays empty: the epoch keys are run-only
  Section opt;
  AddStoreOptimizerLeaves(&opt, optimizer, &epoch_keys);
  opt.custom["sparse"] = [sparse_optimizer, &epoch_keys](const std::string& k, const YAML::Node& n, const Locator& l) {
    sparse_optimizer->emplace();
    Section sparse;
    AddStoreOptimizerLeaves(&sparse, &**sparse_optimizer, &epoch_keys);
    return sparse.Parse(k, n, l);
  };
  return opt.Parse(key, node, loc);
}

// OptimizerOptions::Validate of both.
absl::Status ValidateStoreOptimizers(const OptimizerOptions& optimizer,
                                     const std::optional<OptimizerOptions>& sparse_optimizer) {
  SW_RETURN_IF_ERROR(optimizer.Validate());
  if (sparse_optimizer) SW_RETURN_IF_ERROR(ValidateSparseOptimizer(*sparse_optimizer));
  return absl::OkStatus();
}

absl::Status ParseStoreSpec(const YAML::Node& root, const Locator& loc, StoreSpec* spec) {
  Section top;
  top.custom["variables"] = [spec](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseStoreVariables(k, n, l, &spec->variables);
  };
  top.custom["tables"] = [spec](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseTables(k, n, l, &spec->tables);
  };
  top.custom["optimizer"] = [spec](const std::string& k, const YAML::Node& n, const Locator& l) {
    return ParseStoreOptimizers(k, n, l, &spec->optimizer, &spec->sparse_optimizer);
  };
  Section ps;
  AddStoreLeaves(&ps, &spec->ps);
  for (const char* key : kJobOnlyStoreKeys) ps.leaves.erase(key);
  top.custom["ps"] = [&ps](const std::string& k, const YAML::Node& n, const Locator& l) { return ps.Parse(k, n, l); };
  top.leaves["seed"] = Uint64(&spec->seed);
  return top.Parse("", root, loc);
}

absl::StatusOr<StoreSpec> LoadStoreSpecFromStringImpl(const std::string& yaml, const std::string& source_name,
                                                      bool positions) {
  SW_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlOrEmptyMap(yaml, source_name));
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_name, ": expected a mapping of variables, tables, optimizer, ps and seed, got ", Describe(root)));
  }
  Locator loc(source_name, {}, positions);
  StoreSpec spec;
  try {
    SW_RETURN_IF_ERROR(ParseStoreSpec(root, loc, &spec));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", e.what()));
  }
  absl::Status valid = [&]() -> absl::Status {
    if (spec.variables.empty() && spec.tables.empty()) {
      return absl::InvalidArgumentError("a store needs at least one variable (variables) or embedding table (tables)");
    }
    SW_RETURN_IF_ERROR(ValidateTables(spec.tables, "tables"));
    SW_RETURN_IF_ERROR(ValidateStoreOptimizers(spec.optimizer, spec.sparse_optimizer));
    if (spec.ps.update == UpdateMode::kSync) {
      return absl::InvalidArgumentError(
          "ps.update: sync averages the gradients of a training job's workers in lock-step; a store on its own "
          "takes hogwild or row_lock");
    }
    return spec.ps.Validate();
  }();
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", valid.message()));
  return spec;
}

}  // namespace

absl::StatusOr<StoreSpec> LoadStoreSpecFromString(const std::string& yaml, const std::string& source_name,
                                                  bool positions) {
  return WithErrorKind(LoadStoreSpecFromStringImpl(yaml, source_name, positions), ErrorKind::kConfig);
}

absl::StatusOr<StoreOptimizers> LoadStoreOptimizersFromString(const std::string& yaml, const std::string& source_name,
                                                              bool positions) {
  auto load = [&]() -> absl::StatusOr<StoreOptimizers> {
    SW_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlOrEmptyMap(yaml, source_name));
    Locator loc(source_name, {}, positions);
    StoreOptimizers out;
    try {
      SW_RETURN_IF_ERROR(ParseStoreOptimizers("optimizer", root, loc, &out.optimizer, &out.sparse_optimizer));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", e.what()));
    }
    if (absl::Status s = ValidateStoreOptimizers(out.optimizer, out.sparse_optimizer); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source_name, ": ", s.message()));
    }
    return out;
  };
  return WithErrorKind(load(), ErrorKind::kConfig);
}

}  // namespace shardwild
