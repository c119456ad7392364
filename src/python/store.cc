// shardwild.Store: a parameter store in this machine's shared memory, reached
// from Python (ps_shm/shm_store.h). One process creates it from a layout; any
// number of processes attach to it by name and pull and push concurrently,
// Hogwild-style, with the optimizer applied inside the store.
//
//   with shardwild.Store.create({"variables": {"w": [784, 10], "b": [10]},
//                                "tables": [{"name": "emb", "rows": 100000, "dim": 16}],
//                                "optimizer": {"type": "sgd", "lr": 0.1}}) as store:
//       w = store.pull("w")                     # float32 [784, 10], a copy
//       store.push("w", grad)                   # w -= 0.1 * grad, in the store
//       rows = store.pull_rows("emb", ids)      # float32 [len(ids), 16]
//       store.push_rows("emb", ids, row_grads)
//       other = shardwild.Store.attach(store.name)   # typically in another process
//
// The layout is read by core/config's LoadStoreSpecFromString (the config
// file's tables, optimizer and ps keys, with their messages). The creator
// also writes it, as JSON, into the store's metadata segment
// (ps_shm/store_metadata.h), so attach(name) needs nothing but the name.
//
// Lifetime: the creating Store owns the segments and unlinks them when it is
// closed, garbage collected, or the interpreter exits (an atexit hook closes
// the creator stores still open). A creator killed outright leaves them to the
// stale-segment cleanup of the next store of its job (ps.job_name). An
// attached Store only unmaps. A forked child that inherits a creator Store
// never unlinks it (its pid is not the creator's).
//
// Threads: every call that touches parameter memory releases the GIL, so
// Python threads pull and push in parallel; the store's own Hogwild rules
// apply (param_store.h). close() waits for the calls in flight. Row calls use
// one RowScratch per thread, so a warm thread allocates nothing in them.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/config/config.h"
#include "core/model/model.h"
#include "core/model/variable.h"
#include "ps_shm/shm_segment.h"
#include "ps_shm/shm_store.h"
#include "ps_shm/stale_segments.h"
#include "ps_shm/store_metadata.h"
#include "python/bindings.h"
#include "python/errors.h"
#include "workers/job.h"
#include "workers/topology.h"

namespace py = pybind11;

namespace shardwild::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

[[noreturn]] void ThrowStoreError(const std::string& message) {
  Raise(absl::InvalidArgumentError(message), ErrorKind::kStore);
}

// "(784, 10)", as Python prints a shape.
std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}
std::vector<int64_t> ShapeOf(const py::array& a) { return std::vector<int64_t>(a.shape(), a.shape() + a.ndim()); }
std::string DtypeText(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// Whether `a` holds `kind` ('i', 'u', 'f') items of `bytes` bytes in this
// machine's byte order, C-contiguous: memory C++ may read as that type.
bool IsNativeContiguous(const py::array& a, char kind, int bytes) {
  const py::dtype d = a.dtype();
  return d.kind() == kind && d.itemsize() == bytes && (a.flags() & py::array::c_style) != 0 &&
         d.attr("isnative").cast<bool>();
}

// The calling thread's scratch for row pulls and pushes (param_store.h:
// reused, it stops allocating once it has seen the largest batch).
RowScratch& ThreadScratch() {
  thread_local RowScratch scratch;
  return scratch;
}

// Integer ids as uint64 without a copy where the array is C-contiguous
// uint64, or int64 with no negative id; otherwise converted once into
// `storage`. `arr` keeps the array alive for the call.
struct Ids {
  py::array arr;
  std::vector<uint64_t> storage;
  const uint64_t* data = nullptr;
  size_t size = 0;
};

// `ids` as an integer array of `ndim` dimensions (np.asarray's rules).
Ids ToIds(const char* what, const py::handle& ids, int ndim) {
  Ids out;
  out.arr = py::array::ensure(ids);
  if (!out.arr) throw py::type_error(absl::StrCat(what, ": ids must be an integer array"));
  const char kind = out.arr.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    // An empty list arrives as float64: no ids either way.
    if (out.arr.size() != 0) ThrowStoreError(absl::StrCat(what, ": ids must be integers, got ", DtypeText(out.arr)));
    out.arr = py::array_t<uint64_t>(ShapeOf(out.arr));
  }
  if (out.arr.ndim() != ndim) {
    ThrowStoreError(absl::StrCat(what, ": ids must have ", ndim, " dimension", ndim == 1 ? "" : "s", ", got shape ",
                                 ShapeText(ShapeOf(out.arr))));
  }
  out.size = static_cast<size_t>(out.arr.size());
  auto negative = [&](int64_t v, size_t i) {
    ThrowStoreError(absl::StrCat(what, ": ids must be >= 0, got ", v, " at position ", i));
  };
  if (IsNativeContiguous(out.arr, 'u', 8)) {
    out.data = static_cast<const uint64_t*>(out.arr.data());
    return out;
  }
  if (IsNativeContiguous(out.arr, 'i', 8)) {
    const int64_t* v = static_cast<const int64_t*>(out.arr.data());
    for (size_t i = 0; i < out.size; ++i) {
      if (v[i] < 0) negative(v[i], i);
    }
    out.data = reinterpret_cast<const uint64_t*>(v);  // same bits for ids >= 0
    return out;
  }
  // Any other integer type or layout: one conversion, through int64 for
  // signed types (to find negatives) and uint64 for unsigned ones.
  if (kind == 'u') {
    py::array_t<uint64_t, py::array::c_style | py::array::forcecast> u(out.arr);
    out.storage.assign(u.data(), u.data() + out.size);
  } else {
    py::array_t<int64_t, py::array::c_style | py::array::forcecast> s(out.arr);
    out.storage.resize(out.size);
    for (size_t i = 0; i < out.size; ++i) {
      if (s.data()[i] < 0) negative(s.data()[i], i);
      out.storage[i] = static_cast<uint64_t>(s.data()[i]);
    }
  }
  out.data = out.storage.data();
  return out;
}

// Floats of `shape` read straight from `value` where it is a C-contiguous
// float32 array, else converted once (np.ascontiguousarray(value, float32)).
FloatArray ToFloats(const char* what, const char* name, const py::handle& value, const std::vector<int64_t>& shape,
                    const std::string& of) {
  FloatArray a = FloatArray::ensure(value);
  if (!a) throw py::type_error(absl::StrCat(what, ": ", name, " must be a float array"));
  if (ShapeOf(a) != shape) {
    ThrowStoreError(absl::StrCat(what, ": ", name, " has shape ", ShapeText(ShapeOf(a)), ", ", of, " needs ",
                                 ShapeText(shape)));
  }
  return a;
}

// `out=`: a writable C-contiguous float32 array of `shape`.
py::array_t<float> CheckOut(const char* what, const py::handle& out, const std::vector<int64_t>& shape) {
  const std::string expected = absl::StrCat(what, ": out must be a writable C-contiguous float32 array of shape ",
                                            ShapeText(shape));
  if (!py::isinstance<py::array>(out)) ThrowStoreError(absl::StrCat(expected, ", got ", py::str(py::type::of(out)).cast<std::string>()));
  py::array a = py::reinterpret_borrow<py::array>(out);
  if (!IsNativeContiguous(a, 'f', 4) || !a.writeable() || ShapeOf(a) != shape) {
    ThrowStoreError(absl::StrCat(expected, ", got ", a.writeable() ? "" : "a read-only ", DtypeText(a),
                                 " array of shape ", ShapeText(ShapeOf(a))));
  }
  return py::reinterpret_borrow<py::array_t<float>>(out);
}

// The learning rate of a push: `lr`, or `fallback` (the layout's) for None.
float LearningRate(const char* what, const py::object& lr, float fallback) {
  if (lr.is_none()) return fallback;
  const double v = lr.cast<double>();
  if (!std::isfinite(v) || v < 0) ThrowStoreError(absl::StrCat(what, ": lr must be a finite number >= 0, got ", v));
  return static_cast<float>(v);
}

// A float32 as the shortest Python float that reads back as it (0.1, not
// 0.10000000149011612).
py::float_ Float(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), f);
  return py::float_(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
}

py::dict OptimizerDict(const OptimizerOptions& o) {
  py::dict d;
  d["type"] = OptimizerTypeName(o.type);
  d["lr"] = Float(o.lr);
  switch (o.type) {
    case OptimizerType::kSgd:
      break;
    case OptimizerType::kMomentum:
      d["momentum"] = Float(o.momentum);
      d["nesterov"] = o.nesterov;
      break;
    case OptimizerType::kAdam:
      d["beta1"] = Float(o.beta1);
      d["beta2"] = Float(o.beta2);
      d["epsilon"] = Float(o.epsilon);
      break;
    case OptimizerType::kAdagrad:
      d["epsilon"] = Float(o.epsilon);
      d["initial_accumulator_value"] = Float(o.initial_accumulator_value);
      break;
    case OptimizerType::kRmsprop:
      d["rho"] = Float(o.rho);
      d["epsilon"] = Float(o.epsilon);
      break;
    case OptimizerType::kFtrl:
      d["initial_accumulator_value"] = Float(o.initial_accumulator_value);
      d["l1"] = Float(o.l1);
      d["l2"] = Float(o.l2);
      break;
  }
  return d;
}

// JSON text of a Python value; NumPy scalars and arrays become numbers and lists.
std::string ToJson(const py::handle& value) {
  py::module_ json = py::module_::import("json");
  py::cpp_function convert([](py::handle o) -> py::object {
    if (py::hasattr(o, "tolist")) return o.attr("tolist")();  // NumPy arrays and scalars
    throw py::type_error(absl::StrCat("Store layout: ", py::str(py::type::of(o)).cast<std::string>(),
                                      " is not JSON serialisable"));
  });
  return json.attr("dumps")(value, py::arg("default") = convert).cast<std::string>();
}

class Store;

// Creator stores still open, closed by the atexit hook (guarded by g_owned_mu).
std::mutex g_owned_mu;
std::set<Store*> g_owned;

class Store {
 public:
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() { CloseNow(); }

  static std::unique_ptr<Store> Create(const py::object& layout);
  static std::unique_ptr<Store> Attach(const std::string& name, const py::object& optimizer);

  const std::string& name() const { return name_; }
  bool owner() const { return owner_pid_ != 0; }
  bool closed() {
    std::shared_lock lock(mu_);
    return store_ == nullptr;
  }
  std::string update_mode() const { return UpdateModeName(update_mode_); }
  py::dict optimizer() const { return OptimizerDict(optimizer_); }
  py::dict sparse_optimizer() const { return OptimizerDict(sparse_optimizer_); }
  py::object layout() const {
    if (layout_json_.empty()) return py::none();
    return py::module_::import("json").attr("loads")(layout_json_);
  }
  uint64_t nbytes() const { return nbytes_; }

  py::dict variables() const {
    py::dict d;
    for (const Variable& v : variables_) d[py::str(v.name)] = py::tuple(py::cast(v.shape));
    return d;
  }
  py::dict tables() const {
    py::dict d;
    for (const TableSpec& t : tables_) {
      py::dict e;
      e["rows"] = t.capacity;
      e["dim"] = t.dim;
      e["kind"] = t.kind == EmbeddingKind::kStatic ? "static" : "dynamic";
      e["dtype"] = t.bf16 ? "bf16" : "f32";
      d[py::str(t.name)] = e;
    }
    return d;
  }

  uint64_t Version() {
    std::shared_lock lock(mu_);
    return Open("Store.version")->version();
  }

  py::array Pull(const py::handle& var, const py::object& out) {
    const int v = VariableIndex("Store.pull", var);
    const std::vector<int64_t>& shape = variables_[v].shape;
    py::array_t<float> result = out.is_none() ? py::array_t<float>(shape) : CheckOut("Store.pull", out, shape);
    PullSlice slice{v, 0, variables_[v].rows, result.mutable_data(), nullptr};
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mu_);
      ThrowIfError(Open("Store.pull")->Pull({&slice, 1}), ErrorKind::kStore);
    }
    return result;
  }

  py::dict PullAll() {
    std::vector<py::array_t<float>> arrays;
    std::vector<PullSlice> slices;
    for (size_t v = 0; v < variables_.size(); ++v) {
      arrays.emplace_back(variables_[v].shape);
      slices.push_back(PullSlice{static_cast<int>(v), 0, variables_[v].rows, arrays.back().mutable_data(), nullptr});
    }
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mu_);
      ThrowIfError(Open("Store.pull_all")->Pull(slices), ErrorKind::kStore);
    }
    py::dict d;
    for (size_t v = 0; v < variables_.size(); ++v) d[py::str(variables_[v].name)] = arrays[v];
    return d;
  }

  void Push(const py::handle& var, const py::handle& grad, const py::object& lr) {
    const int v = VariableIndex("Store.push", var);
    const FloatArray g = ToFloats("Store.push", "the gradient", grad, variables_[v].shape,
                                  absl::StrCat("variable '", variables_[v].name, "'"));
    PushGrads({DenseGrad{v, g.data()}}, LearningRate("Store.push", lr, optimizer_.lr));
  }

  void PushMany(const py::dict& grads, const py::object& lr) {
    std::vector<FloatArray> keep;
    std::vector<DenseGrad> parts;
    for (const auto& [key, grad] : grads) {
      const int v = VariableIndex("Store.push", key);
      for (const DenseGrad& p : parts) {
        if (p.var == v) ThrowStoreError(absl::StrCat("Store.push: variable '", variables_[v].name, "' is given twice"));
      }
      keep.push_back(ToFloats("Store.push", "the gradient", grad, variables_[v].shape,
                              absl::StrCat("variable '", variables_[v].name, "'")));
      parts.push_back(DenseGrad{v, keep.back().data()});
    }
    PushGrads(parts, LearningRate("Store.push", lr, optimizer_.lr));
  }

  py::array PullRows(const py::handle& table, const py::handle& ids_obj, const py::object& out, bool insert) {
    const int t = TableIndex("Store.pull_rows", table);
    const Ids ids = ToIds("Store.pull_rows", ids_obj, 1);
    const std::vector<int64_t> shape{static_cast<int64_t>(ids.size), tables_[t].dim};
    py::array_t<float> result = out.is_none() ? py::array_t<float>(shape) : CheckOut("Store.pull_rows", out, shape);
    if (ids.size == 0) return result;
    float* dst = result.mutable_data();
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mu_);
      ThrowIfError(Open("Store.pull_rows")
                       ->PullRows(t, {ids.data, ids.size}, dst, insert ? PullMode::kInsert : PullMode::kReadOnly,
                                  &ThreadScratch()),
                   ErrorKind::kStore);
    }
    return result;
  }

  void PushRows(const py::handle& table, const py::handle& ids_obj, const py::handle& grads, const py::object& lr) {
    const int t = TableIndex("Store.push_rows", table);
    const Ids ids = ToIds("Store.push_rows", ids_obj, 1);
    const FloatArray g = ToFloats("Store.push_rows", "grads", grads, {static_cast<int64_t>(ids.size), tables_[t].dim},
                                  absl::StrCat(ids.size, " ids of table '", tables_[t].name, "'"));
    const float rate = LearningRate("Store.push_rows", lr, sparse_optimizer_.lr);
    if (ids.size == 0) return;
    py::gil_scoped_release release;
    std::shared_lock lock(mu_);
    ThrowIfError(Open("Store.push_rows")->PushRows(t, {ids.data, ids.size}, g.data(), rate, &ThreadScratch()),
                 ErrorKind::kStore);
  }

  // tables: T names (or indices) of tables of one dim; ids [T, n].
  py::array PullRowsBatch(const py::sequence& tables, const py::handle& ids_obj, const py::object& out, bool insert) {
    const std::vector<int> t = TableIndices("Store.pull_rows_batch", tables);
    const Ids ids = ToIds("Store.pull_rows_batch", ids_obj, 2);
    const int64_t n = BatchWidth("Store.pull_rows_batch", ids, t.size());
    const int64_t dim = t.empty() ? 0 : tables_[t[0]].dim;
    const std::vector<int64_t> shape{static_cast<int64_t>(t.size()), n, dim};
    py::array_t<float> result = out.is_none() ? py::array_t<float>(shape) : CheckOut("Store.pull_rows_batch", out, shape);
    std::vector<RowPull> parts;
    for (size_t i = 0; i < t.size(); ++i) {
      parts.push_back(RowPull{t[i], {ids.data + i * n, static_cast<size_t>(n)}, result.mutable_data() + i * n * dim});
    }
    {
      py::gil_scoped_release release;
      std::shared_lock lock(mu_);
      ThrowIfError(Open("Store.pull_rows_batch")
                       ->PullRowsBatch(parts, insert ? PullMode::kInsert : PullMode::kReadOnly, &ThreadScratch()),
                   ErrorKind::kStore);
    }
    return result;
  }

  void PushRowsBatch(const py::sequence& tables, const py::handle& ids_obj, const py::handle& grads, const py::object& lr) {
    const std::vector<int> t = TableIndices("Store.push_rows_batch", tables);
    const Ids ids = ToIds("Store.push_rows_batch", ids_obj, 2);
    const int64_t n = BatchWidth("Store.push_rows_batch", ids, t.size());
    const int64_t dim = t.empty() ? 0 : tables_[t[0]].dim;
    const FloatArray g = ToFloats("Store.push_rows_batch", "grads", grads, {static_cast<int64_t>(t.size()), n, dim},
                                  absl::StrCat(t.size(), " tables x ", n, " ids"));
    const float rate = LearningRate("Store.push_rows_batch", lr, sparse_optimizer_.lr);
    std::vector<RowGrad> parts;
    for (size_t i = 0; i < t.size(); ++i) {
      parts.push_back(RowGrad{t[i], {ids.data + i * n, static_cast<size_t>(n)}, g.data() + i * n * dim});
    }
    py::gil_scoped_release release;
    std::shared_lock lock(mu_);
    ThrowIfError(Open("Store.push_rows_batch")->PushRowsBatch(parts, rate, &ThreadScratch()), ErrorKind::kStore);
  }

  // Unmaps the store and, in the creator, unlinks its segments. Waits for
  // the calls in flight (without the GIL). Idempotent.
  void Close() {
    py::gil_scoped_release release;
    CloseNow();
  }

  std::string Repr() {
    return absl::StrCat("<shardwild.Store '", name_, "' ", variables_.size(), " variables, ", tables_.size(), " tables",
                        owner() ? ", creator" : ", attached", closed() ? ", closed" : "", ">");
  }

  // The atexit hook: closes every creator store still open in this process.
  static void CloseAllOwned() {
    std::set<Store*> owned;
    {
      std::lock_guard<std::mutex> lock(g_owned_mu);
      owned.swap(g_owned);
    }
    py::gil_scoped_release release;
    for (Store* s : owned) s->CloseNow();
  }

 private:
  struct Variable {
    std::string name;
    std::vector<int64_t> shape;  // as declared: [rows] or [rows, cols]
    int64_t rows = 0;
  };

  // The store, or a StoreError saying it is closed. mu_ must be held (shared).
  ShmParamStore* Open(const char* what) {
    if (store_ == nullptr) ThrowStoreError(absl::StrCat(what, ": store ", name_, " is closed"));
    return store_.get();
  }

  void CloseNow() {
    {
      std::lock_guard<std::mutex> lock(g_owned_mu);
      g_owned.erase(this);
    }
    std::unique_lock lock(mu_);
    if (owner_pid_ != 0 && owner_pid_ != getpid()) {
      // A forked child's copy: the segments are the parent's; leave them
      // (and their mappings, which end with the process).
      (void)store_.release();
      (void)meta_.release();
      return;
    }
    meta_.reset();
    store_.reset();
  }

  void PushGrads(const std::vector<DenseGrad>& grads, float lr) {
    py::gil_scoped_release release;
    std::shared_lock lock(mu_);
    ThrowIfError(Open("Store.push")->Push(grads, lr), ErrorKind::kStore);
  }

  int VariableIndex(const char* what, const py::handle& var) const {
    std::vector<std::string> names;
    for (const Variable& v : variables_) names.push_back(v.name);
    return IndexOf(what, "variable", var, variable_index_, names);
  }

  int TableIndex(const char* what, const py::handle& table) const {
    std::vector<std::string> names;
    for (const TableSpec& t : tables_) names.push_back(t.name);
    return IndexOf(what, "embedding table", table, table_index_, names);
  }

  // The position of `key` (a name in `index`, or a position) among `names`;
  // StoreError naming the `noun` and what the store has otherwise.
  int IndexOf(const char* what, const char* noun, const py::handle& key,
              const std::unordered_map<std::string, int>& index, const std::vector<std::string>& names) const {
    if (py::isinstance<py::str>(key)) {
      const std::string name = key.cast<std::string>();
      auto it = index.find(name);
      if (it != index.end()) return it->second;
      ThrowStoreError(absl::StrCat(what, ": no ", noun, " '", name, "' in store ", name_, " (it has: ",
                                   names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
    }
    if (py::isinstance<py::int_>(key)) {
      const int64_t i = key.cast<int64_t>();
      if (i < 0 || i >= static_cast<int64_t>(names.size())) {
        ThrowStoreError(absl::StrCat(what, ": no ", noun, " ", i, " in store ", name_, " (it has ", names.size(), ")"));
      }
      return static_cast<int>(i);
    }
    throw py::type_error(absl::StrCat(what, ": name the ", noun, " by a str (or its index)"));
  }

  // The tables of a batch call: all of one dim.
  std::vector<int> TableIndices(const char* what, const py::sequence& tables) const {
    if (py::isinstance<py::str>(tables)) throw py::type_error(absl::StrCat(what, ": tables must be a sequence of names"));
    std::vector<int> out;
    for (const py::handle& t : tables) out.push_back(TableIndex(what, t));
    for (int t : out) {
      if (tables_[t].dim != tables_[out[0]].dim) {
        ThrowStoreError(absl::StrCat(what, ": the tables must have one dim; '", tables_[out[0]].name, "' has ",
                                     tables_[out[0]].dim, ", '", tables_[t].name, "' has ", tables_[t].dim));
      }
    }
    return out;
  }

  // n of ids [T, n] (T = `tables`).
  static int64_t BatchWidth(const char* what, const Ids& ids, size_t tables) {
    const std::vector<int64_t> shape = ShapeOf(ids.arr);
    if (shape[0] != static_cast<int64_t>(tables)) {
      ThrowStoreError(absl::StrCat(what, ": ids has shape ", ShapeText(shape), ", one row per table needs ", tables,
                                   " rows"));
    }
    return shape[1];
  }

  // Fills the Python-side description from the store's layout; `declared`:
  // the variables' shapes as the layout gave them (else [rows, cols]).
  absl::Status Describe(const std::vector<StoreVariableOptions>* declared) {
    const StoreLayout& layout = store_->layout();
    for (size_t v = 0; v < layout.variables.size(); ++v) {
      const VariableSpec& spec = layout.variables[v];
      Variable var{spec.name, {spec.rows, spec.cols}, spec.rows};
      if (declared != nullptr) {
        const StoreVariableOptions* d = v < declared->size() ? &(*declared)[v] : nullptr;
        const int64_t cols = d != nullptr && d->shape.size() == 2 ? d->shape[1] : 1;
        if (d == nullptr || d->name != spec.name || d->shape[0] != spec.rows || cols != spec.cols) {
          return absl::FailedPreconditionError(absl::StrCat("store ", name_, ": its layout segment disagrees with its shards about variable ",
                                                            v, " ('", spec.name, "')"));
        }
        var.shape = d->shape;
      }
      variable_index_[spec.name] = static_cast<int>(v);
      variables_.push_back(std::move(var));
    }
    if (declared != nullptr && declared->size() != layout.variables.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("store ", name_, ": its layout segment lists ", declared->size(), " variables, its shards ",
                       layout.variables.size()));
    }
    tables_ = layout.tables;
    for (size_t t = 0; t < tables_.size(); ++t) table_index_[tables_[t].name] = static_cast<int>(t);
    update_mode_ = store_->update_mode();
    optimizer_ = store_->optimizer();
    sparse_optimizer_ = store_->sparse_optimizer();
    nbytes_ = store_->total_bytes();
    return absl::OkStatus();
  }

  // Constant after Create / Attach.
  std::string name_;
  pid_t owner_pid_ = 0;  // the creator's pid; 0 in an attached store
  std::string layout_json_;
  std::vector<Variable> variables_;
  std::unordered_map<std::string, int> variable_index_;
  std::vector<TableSpec> tables_;
  std::unordered_map<std::string, int> table_index_;
  UpdateMode update_mode_ = UpdateMode::kHogwild;
  OptimizerOptions optimizer_;
  OptimizerOptions sparse_optimizer_;
  uint64_t nbytes_ = 0;

  // Calls hold mu_ shared while they use the store; close holds it
  // exclusively, so it waits for them and they never see a freed store.
  std::shared_mutex mu_;
  std::unique_ptr<ShmParamStore> store_;  // guarded by mu_; null once closed
  std::unique_ptr<ShmSegment> meta_;      // guarded by mu_; the creator's metadata segment
};

VariableSpec VariableSpecOf(const StoreVariableOptions& v) {
  VariableSpec spec;
  spec.name = v.name;
  spec.rows = v.shape[0];
  spec.cols = v.shape.size() == 2 ? v.shape[1] : 1;
  if (v.init == StoreVariableInit::kGlorotUniform) {
    // A [fan_in, fan_out] kernel, as a Dense layer's (core/model/model.cc).
    spec.init = InitKind::kGlorotUniform;
    spec.fan_in = spec.rows;
    spec.fan_out = spec.cols;
  }
  return spec;
}

std::unique_ptr<Store> Store::Create(const py::object& layout) {
  if (!py::isinstance<py::dict>(layout)) {
    throw py::type_error(absl::StrCat("Store.create: layout must be a dict, got ", py::str(py::type::of(layout)).cast<std::string>()));
  }
  const std::string json = ToJson(layout);
  const StoreSpec spec = ValueOrThrow(LoadStoreSpecFromString(json, "layout", /*positions=*/false), ErrorKind::kConfig);
  auto st = std::make_unique<Store>();
  st->layout_json_ = json;
  {
    py::gil_scoped_release release;
    // Shards go to NUMA nodes as a training job's do: `auto` is one per node.
    std::unique_ptr<Topology> topology = ValueOrThrow(Topology::Detect(), ErrorKind::kStore);
    OpenStoreOptions so;
    so.store = spec.ps;
    so.optimizer = spec.optimizer;
    so.sparse_optimizer = spec.sparse_optimizer;
    so.seed = spec.seed;
    so.num_shards = topology->ResolveShards(spec.ps.shards);
    so.placer = topology.get();
    for (const TableOptions& t : spec.tables) so.tables.push_back(TableSpecOf(EmbeddingDeclOf(t)));
    std::vector<VariableSpec> variables;
    for (const StoreVariableOptions& v : spec.variables) variables.push_back(VariableSpecOf(v));
    std::unique_ptr<ShmParamStore> store =
        ValueOrThrow(ShmParamStore::Create(so, std::move(variables)), ErrorKind::kStore);
    st->meta_ = ValueOrThrow(WriteStoreMetadata(store->name(), json), ErrorKind::kStore);
    st->name_ = store->name();
    st->store_ = std::move(store);
  }
  st->owner_pid_ = getpid();
  ThrowIfError(st->Describe(&spec.variables), ErrorKind::kStore);
  // Stale segments of the job, as the CLI reports them (a RuntimeWarning).
  std::string warning;
  if (const auto& removed = st->store_->removed_stale_segments(); !removed.empty()) {
    warning = absl::StrCat("removed ", removed.size(), " stale shared-memory segment(s) of job '", spec.ps.job_name,
                           "' left by processes that are gone: ", DescribeStaleSegments(removed));
  } else if (const auto& left = st->store_->reported_stale_segments(); !left.empty()) {
    warning = absl::StrCat(left.size(), " stale shared-memory segment(s) of job '", spec.ps.job_name,
                           "' left by processes that are gone (kept, ps.stale_segments is 'report'): ",
                           DescribeStaleSegments(left));
  }
  if (!warning.empty() && PyErr_WarnEx(PyExc_RuntimeWarning, warning.c_str(), 1) != 0) throw py::error_already_set();
  std::lock_guard<std::mutex> lock(g_owned_mu);
  g_owned.insert(st.get());
  return st;
}

std::unique_ptr<Store> Store::Attach(const std::string& name, const py::object& optimizer) {
  std::optional<StoreOptimizers> given;
  if (!optimizer.is_none()) {
    if (!py::isinstance<py::dict>(optimizer)) {
      throw py::type_error(absl::StrCat("Store.attach: optimizer must be a dict (a layout's optimizer section), got ",
                                        py::str(py::type::of(optimizer)).cast<std::string>()));
    }
    given = ValueOrThrow(LoadStoreOptimizersFromString(ToJson(optimizer), "Store.attach", /*positions=*/false),
                         ErrorKind::kConfig);
  }
  auto st = std::make_unique<Store>();
  st->name_ = name;
  std::optional<StoreSpec> spec;
  {
    py::gil_scoped_release release;
    if (name.empty() || name.size() > 63 || name.find('/') != std::string::npos) {
      ThrowStoreError(absl::StrCat("Store.attach: '", name, "' is not a store name (a store's name is its ",
                                   "job name, pid and nonce, e.g. shardwild-1234-0badf00d)"));
    }
    absl::StatusOr<std::string> meta = ReadStoreMetadata(name);
    if (meta.ok()) {
      st->layout_json_ = *meta;
      spec = ValueOrThrow(LoadStoreSpecFromString(*meta, absl::StrCat("store ", name, "'s layout"), false),
                          ErrorKind::kStore);
    } else if (meta.status().code() != absl::StatusCode::kNotFound) {
      Raise(meta.status(), ErrorKind::kStore);
    } else if (!ShmSegment::Exists(name + "-s0")) {
      ThrowStoreError(absl::StrCat("Store.attach: no store named '", name, "' on this machine (no /dev/shm/", name,
                                   "-s0)"));
    } else if (!given) {
      ThrowStoreError(absl::StrCat("Store.attach: store '", name, "' has no layout segment (/dev/shm/", name,
                                   "-meta; it was not made by Store.create): pass optimizer= with the creator's "
                                   "optimizer section (and its sparse key when the tables have their own)"));
    }
    OptimizerOptions dense = given ? given->optimizer : spec->optimizer;
    std::optional<OptimizerOptions> sparse = given ? given->sparse_optimizer : spec->sparse_optimizer;
    absl::StatusOr<std::unique_ptr<ShmParamStore>> store = ShmParamStore::Attach(name, dense, sparse);
    if (!store.ok() && store.status().code() == absl::StatusCode::kNotFound) {
      // Closed between the metadata and the shards.
      ThrowStoreError(absl::StrCat("Store.attach: no store named '", name, "' on this machine (",
                                   store.status().message(), ")"));
    }
    st->store_ = ValueOrThrow(std::move(store), ErrorKind::kStore);
  }
  ThrowIfError(st->Describe(spec ? &spec->variables : nullptr), ErrorKind::kStore);
  return st;
}

}  // namespace

void RegisterStore(py::module_& m) {
  py::class_<Store>(m, "Store", R"doc(
A parameter store in this machine's shared memory: dense variables and
embedding tables, updated in place by the store's optimizer when gradients
are pushed (Hogwild: concurrent pushes from any thread or process interleave
without locks, unless the layout says ps.update row_lock).

Make one with Store.create(layout) and reach it from other processes with
Store.attach(store.name). The creator owns the shared memory: closing it
(close(), a with block, garbage collection or interpreter exit) removes the
store for every process. Calls that touch parameter memory release the GIL.
)doc")
      .def_static("create", &Store::Create, py::arg("layout"), R"doc(
Creates a store from a layout dict, read as the config file's keys:
  {"variables": {"w": [784, 10], "b": [10], "k": {"shape": [4, 3], "init": "glorot_uniform"}},
   "tables": [{"name": "emb", "rows": 100000, "dim": 16, "kind": "static"}],   # as model.tables
   "optimizer": {"type": "sgd", "lr": 0.1, "sparse": {"type": "adagrad", "lr": 0.05}},
   "ps": {"shards": 2, "update": "hogwild", "job_name": "mystore"},
   "seed": 1}
Variables start at zeros unless init says glorot_uniform; table rows start
uniform in +-init_scale (0: 1/sqrt(rows)). Raises ConfigError for a bad
layout (naming the key) and StoreError when the store cannot be made.
)doc")
      .def_static("attach", &Store::Attach, py::arg("name"), py::arg("optimizer") = py::none(), R"doc(
Attaches to the store called `name` (another process's Store.name). The
layout, optimizers included, comes from the store's metadata segment;
`optimizer` (a layout's optimizer section, with its sparse key) overrides
them, and is required for a store made by `shardwild train`, which has no
such segment. An attached store never removes the shared memory. Raises
StoreError when there is no such store or it does not match.
)doc")
      .def_property_readonly("name", &Store::name, "The store's name, for Store.attach.")
      .def_property_readonly("owner", &Store::owner, "Whether this Store created the store (and removes it on close).")
      .def_property_readonly("closed", &Store::closed)
      .def_property_readonly("update_mode", &Store::update_mode, "hogwild or row_lock (ps.update).")
      .def_property_readonly("optimizer", &Store::optimizer, "The dense variables' optimizer and its hyper-parameters.")
      .def_property_readonly("sparse_optimizer", &Store::sparse_optimizer, "The embedding tables' optimizer.")
      .def_property_readonly("layout", &Store::layout,
                             "The layout the store was created from (None for a store without a metadata segment).")
      .def_property_readonly("nbytes", &Store::nbytes, "Bytes of shared memory of all shards.")
      .def("variables", &Store::variables, "{name: shape} of the dense variables, in store order.")
      .def("tables", &Store::tables, "{name: {rows, dim, kind, dtype}} of the embedding tables, in store order.")
      .def("version", &Store::Version, "The model version: dense pushes applied so far (over every process).")
      .def("pull", &Store::Pull, py::arg("var"), py::arg("out") = py::none(), R"doc(
A copy of variable `var` (its name or index) as a float32 array of its
shape, or written into `out` (a writable C-contiguous float32 array of that
shape), which is returned.
)doc")
      .def("pull_all", &Store::PullAll, "{name: array} of every variable, in one pull.")
      // (The dict form first: the other takes any object as `var`.)
      .def("push", &Store::PushMany, py::arg("grads"), py::arg("lr") = py::none(),
           "push({name: grad, ...}, lr): one push over several variables (the version advances by one).")
      .def("push", &Store::Push, py::arg("var"), py::arg("grad"), py::arg("lr") = py::none(), R"doc(
Applies the optimizer to variable `var` with gradient `grad` (an array of
the variable's shape; float32 C-contiguous arrays are read in place, others
converted once) and learning rate `lr` (None: the layout's optimizer.lr),
then advances the model version by one.
)doc")
      .def("pull_rows", &Store::PullRows, py::arg("table"), py::arg("ids"), py::arg("out") = py::none(),
           py::arg("insert") = true, R"doc(
The rows of `ids` (any integer array; ids may repeat) of embedding table
`table` as a float32 array [len(ids), dim], or written into `out`. A
dynamic table gives a missing id a row at its initial value (insert=False:
reads it as that value without inserting). StoreError for an id out of
range (static: >= rows) or a negative one.
)doc")
      .def("push_rows", &Store::PushRows, py::arg("table"), py::arg("ids"), py::arg("grads"),
           py::arg("lr") = py::none(), R"doc(
One step of the tables' optimizer on the rows of `ids` with gradients
`grads` [len(ids), dim] and learning rate `lr` (None: the sparse optimizer's
lr). Repeated ids are summed first, then each row is updated once. Does not
advance version().
)doc")
      .def("pull_rows_batch", &Store::PullRowsBatch, py::arg("tables"), py::arg("ids"), py::arg("out") = py::none(),
           py::arg("insert") = true, R"doc(
pull_rows over several tables of one dim in one call: ids [T, n] (row t
for tables[t]) gives float32 [T, n, dim].
)doc")
      .def("push_rows_batch", &Store::PushRowsBatch, py::arg("tables"), py::arg("ids"), py::arg("grads"),
           py::arg("lr") = py::none(), "push_rows over several tables of one dim in one call: ids [T, n], grads [T, n, dim].")
      .def("close", &Store::Close, R"doc(
Unmaps the store; the creator also removes its shared memory. Waits for
calls in flight on other threads. Calling it again does nothing.
)doc")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& s, const py::args&) { s.Close(); })
      .def("__repr__", &Store::Repr);

  // Creator stores left open at exit are closed then, so the shared memory
  // goes with the interpreter even when module globals outlive finalisation.
  py::module_::import("atexit").attr("register")(py::cpp_function(&Store::CloseAllOwned));
}

}  // namespace shardwild::python
