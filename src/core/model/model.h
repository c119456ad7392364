// The model a config describes: dense features through a bottom tower,
// sparse fields pooled through embedding tables (EmbeddingBag), an
// interaction (concat or DLRM's dot), a top tower, an optional wide part
// (Wide&Deep), and a head (softmax, binary logistic, regression).
//
//   dense [B, D] -> bottom MLP -> b [B, Db] --+
//   field f ids -> table rows -> bag pool ----+-> interaction -> top MLP -> logits [B, K]
//   wide field ids -> dim-K rows -> sum -----------------------------------^ (added)
//
// A plain MLP over images (fashion_mnist_mlp.yaml) is the case with no
// sparse fields, no bottom tower and concat: the top tower sees the pixels.
//
// A Model belongs to one worker. It owns every buffer it computes with (the
// batch's dense inputs, labels and ids, the pulled table rows, activations, a
// local copy of the dense parameters filled by the caller from the
// ParamStore, and all gradients) and builds its oneDNN primitives once, in
// Create(). The step allocates nothing once the id buffers have grown to the
// largest batch seen (variable-length bags: text, libsvm).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/base/huge_page_allocator.h"
#include "core/base/prefetch.h"
#include "core/data/data_kernels.h"
#include "core/data/dataset.h"
#include "core/model/layers.h"
#include "core/config/options.h"
#include "core/model/variable.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace shardwild {

// What a model needs to know about its data.
struct DataShape {
  int64_t dense_dim = 0;
  int32_t num_classes = 0;          // 0 = regression targets
  std::vector<std::string> fields;  // the sparse fields, by name
  static DataShape Of(const Dataset& data);
};

// An embedding table the model uses (the store's TableSpec is made from it).
struct EmbeddingDecl {
  std::string name;
  int64_t rows = 0;      // static: vocabulary (ids are taken % rows); dynamic: capacity
  int64_t dim = 0;
  bool dynamic = false;
  bool evict_lru = false;
  float init_scale = 0;  // rows start uniform(-init_scale, init_scale); resolved (never 0 here)
  bool bf16 = false;     // parameters stored as bf16 (TableOptions::bf16)
};

// The table a model.tables entry declares: its settings, with init_scale 0
// resolved to DLRM's 1/sqrt(rows).
EmbeddingDecl EmbeddingDeclOf(const TableOptions& t);

// One sparse lookup: a data field pooled through a table.
struct Lookup {
  std::string field;
  int data_field = 0;    // index in Dataset::fields
  int table = 0;         // index in ModelSpec::tables
  int64_t dim = 0;
  Pooling pooling = Pooling::kSum;
  bool weighted = true;
  bool wide = false;     // part of the wide term (adds to the logits)
};

struct ModelSpec {
  std::vector<VariableSpec> variables;  // bottom_<i>/{kernel,bias}, then dense_<i>/{kernel,bias} (the top)
  std::vector<EmbeddingDecl> tables;    // model.tables used by some feature, then wide/<field>
  std::vector<Lookup> lookups;          // model.sparse in order, then model.wide
  int64_t outputs = 0;                  // K: classes (softmax) or 1
  int64_t interaction_width = 0;        // the top tower's input width
};

// A data set laid out for fast batch loads by one model (Model::PackRecords),
// built once per job and read-only after: every worker of a job shares one.
// Its arrays are on huge pages where the kernel grants them
// (HugePageAllocator): a batch reads records scattered over all of them.
// Either part may be absent (empty), and loads then read `Dataset` itself.
//   * ids: each record's sparse ids, already mapped to store ids, in one
//     contiguous block, instead of an offset and an id list per field
//     scattered over as many arrays as there are fields.
//   * dense bytes: when every dense value is exactly k / 255.0f for a byte k
//     (IDX images as the reader scales them), the bytes k, a quarter of the
//     memory traffic of the floats; a load computes k / 255.0f again, so the
//     batch holds the very same floats.
struct PackedRecords {
  // Record r's block: head_words words of uint32 slots, one count per bag
  // (num_bags; little end first) and, where `inline_label`, the record's
  // label (int32; a regression head's target as float bits) after them;
  // then those counts' store ids, bag after bag: uint32 each where
  // `narrow_ids` (every lookup's table is static with at most 2^32 rows, so
  // its store ids fit), else uint64, each bag's followed by its weights
  // (floats) where `weighted`, or with its weights in its ids' words where
  // they are coded (weight_codes); the block padded to whole words. The narrow
  // ids and the label in the block take a text record from about 5 random
  // lines (its start word, 3 of ids, its label) to 3; the weights in it take
  // a libsvm record from 5 (its offsets, ids, weights, label, each a miss,
  // the ids' and weights' only known once the offsets are read) to 3.
  //
  // The blocks are laid out one of two ways (PackRecords chooses, by the
  // lines a record's load touches; Block(r) finds one either way):
  //   * in slots (stride_words > 0, `start` empty): record r's slot is
  //     words[r * stride_words, (r + 1) * stride_words), starting on a cache
  //     line where the stride is a power of two up to a line or whole lines
  //     (HugePageAllocator aligns `words`). A block that fits its slot is in
  //     it: no word to look up first, and at most the slot's lines. A longer
  //     one (a long tail of long records) goes after the slots: its slot
  //     holds kOverflowSlot, then the block's offset in `words`.
  //   * one after the other (stride_words == 0): record r's block is
  //     words[start[r], start[r + 1]).
  // After the last block, Model::kIdSlack words of padding. `words` is
  // empty when the ids are not packed.
  static constexpr uint64_t kOverflowSlot = ~uint64_t{0};
  UninitHugePageVector<uint64_t> start;  // [records + 1] when stride_words == 0, else empty
  UninitHugePageVector<uint64_t> words;
  int64_t stride_words = 0;
  // Blocks after the slots (stride_words > 0): LoadBatch looks for them only
  // where there are some.
  int64_t overflow_blocks = 0;
  // The lookups with ids of their own (Model::bag_of(l) == l), in order: a
  // block holds theirs, bag k's count and ids k-th.
  int num_bags = 0;
  // [num_bags] where ids are packed: 1 where bag k has weights, a weighted
  // lookup whose field has them: floats, as many as its ids, after its ids
  // in each block, unless they are coded in the ids' words (weight_codes).
  std::vector<uint8_t> weighted;
  // How a weighted bag's weights are coded in its ids' words: where its ids
  // are narrow and every weight of its field is exactly k / 10^d for a
  // whole k that fits above the id's bits, bag k's entries are one uint32
  // each, id | k << id_bits, instead of a uint32 id and a float (libsvm
  // data whose values have a few decimals, binary features, counts). A load
  // gives back the very same floats (Weight, the one decoder, checked value
  // by value when packing: WeightCode::Of). sparse_logreg.yaml's records, up
  // to 30 features of 3 decimals, then fit 128-byte slots instead of
  // 256-byte ones (its data phase, 6 alternating rounds on the 2-core EPYC
  // VM: 1.57 -> 1.18 us a step, medians).
  struct WeightCode {
    int id_bits = 0;  // 0: not coded (the weights are floats after the ids)
    int decimals = 0;
    double unit = 0;  // 10^-decimals
    bool coded() const { return id_bits > 0; }
    uint32_t Id(uint32_t word) const { return word & ((uint32_t{1} << id_bits) - 1); }
    float Weight(uint32_t word) const { return Decode(word >> id_bits, unit); }
    // k * unit, rounded once to float (CodedWeight, which the loads'
    // kernels, DecodeCodedSlots and DecodeCodedEntries, compute on every
    // target): the nearest float to k / 10^d, as a parser gives, for the k
    // and d that fit. Of checks every weight, so a load gives back the
    // very floats packed.
    static float Decode(uint32_t k, double unit) { return CodedWeight(k, unit); }
    // The code for `weights` beside ids below `rows` (at most 2^32): the
    // fewest decimals, up to kMaxDecimals, that give every weight back;
    // not coded (id_bits 0) where none does, where a weight is negative,
    // -0 or not finite, or where the ids leave no bits. One pass over the
    // weights a number of decimals tried.
    static WeightCode Of(const std::vector<float>& weights, int64_t rows);
    // The word of an id below the rows and a weight Of found codable.
    uint32_t Word(uint32_t id, float weight) const;
    static constexpr int kMaxDecimals = 6;
  };
  std::vector<WeightCode> weight_codes;  // [num_bags] where ids are packed
  // How Model::LoadBatch copies a batch, decided once by PackRecords: slot
  // by slot (Model::LoadSlots), where the model has one lookup, the ids are
  // narrow and in slots with the label, and there are no dense values, one
  // label a record and no regression target; what a slot holds after its
  // head then: ids, ids then their weights, or words with the weights coded
  // (WeightCode). kOneIdBags: slot by slot in the one-id layout below
  // (Model::LoadOneIdSlots). kRecords: record by record (Model::LoadRecord).
  enum class SlotLoad : uint8_t { kRecords, kIds, kIdsThenWeights, kCodedWeights, kOneIdBags };
  SlotLoad slot_load = SlotLoad::kRecords;
  // The one-id layout (slot_load kOneIdBags), for records of several bags of
  // at most one id each and perhaps dense values (Criteo's 26 categorical
  // fields, each one id or missing, and its 13 integers): where the ids are
  // narrow and unweighted, there are at most kMaxOneIdBags bags, one label a
  // record and no regression target, and the block fits a slot, a record's
  // block is one word, a mask of the bags that have their id (bit k: bag k)
  // and the label, then one uint32 a bag, in bag order (0 for a bag without
  // its id, never read), then the record's dense values (floats, the very
  // ones of Dataset::dense: dense_in_block()). No counts to read and no
  // second place to look for the dense values: Wide & Deep's record, 26
  // counts, the label and 26 ids in a 256-byte slot and its 13 floats apart
  // (4 lines and 1 or 2), becomes 164 bytes in a 192-byte slot (3 lines).
  static constexpr int kMaxOneIdBags = 32;
  // Whether a record's dense values (if the model has any) are in its block,
  // not read from Dataset::dense or dense_bytes: the one-id layout's only.
  bool dense_in_block() const { return slot_load == SlotLoad::kOneIdBags; }
  // The bytes of `words` a record's prefetch asks for (Model::RecordBytes):
  // its slot where stride_words > 0, else its block's mean; 0 without ids.
  int64_t prefetch_bytes = 0;
  int head_words = 0;
  bool narrow_ids = false;
  bool inline_label = false;
  int64_t records = 0;
  // [records x dense_dim] bytes k with dense value k / 255.0f; empty when
  // the dense values are not all of that form.
  UninitHugePageVector<uint8_t> dense_bytes;

  bool has_ids() const { return !words.empty(); }
  bool has_dense_bytes() const { return !dense_bytes.empty(); }
  // Record r's slot (stride_words > 0).
  const uint64_t* Slot(int64_t r) const { return words.data() + r * stride_words; }
  // Record r's block (has_ids()).
  const uint64_t* Block(int64_t r) const {
    if (stride_words == 0) return words.data() + start[r];
    // (kOverflowSlot marks a slot only where some block is after the slots:
    // elsewhere a block may begin with any bits, as a one-id block's mask
    // and label.)
    const uint64_t* slot = Slot(r);
    return overflow_blocks > 0 && slot[0] == kOverflowSlot ? words.data() + slot[1] : slot;
  }
};

// How Model::Backward reduces the records' gradients over a batch, for the
// dense variables (grads()) and for the embedding rows (row_grads(), the
// wide part's included): the optimizers' loss_reduction (core/config/options.h).
struct GradientReduction {
  LossReduction dense = LossReduction::kSumOverBatchSize;
  LossReduction sparse = LossReduction::kSumOverBatchSize;
};

class Model {
 public:
  // The variables, tables and lookups of `options` on data of `shape`.
  // InvalidArgument (naming the config key) when they don't fit together: a
  // field the data lacks, a softmax head whose width is not the number of
  // classes, a dot interaction whose vectors differ in width, ...
  static absl::StatusOr<ModelSpec> Describe(const ModelOptions& options, const DataShape& shape);
  // Describe(...).variables.
  static absl::StatusOr<std::vector<VariableSpec>> Variables(const ModelOptions& options, const DataShape& shape);

  // A model for batches of `batch` records. `seed` seeds the dropout masks.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelOptions& options, const DataShape& shape,
                                                       int64_t batch, const dnnl::engine& engine, uint64_t seed);
  ~Model();

  const ModelSpec& spec() const { return spec_; }
  HeadType head() const { return head_; }
  Precision precision() const { return precision_; }
  // The implementation oneDNN chose for each dense layer's forward matmul,
  // bottom tower first (DenseLayer::forward_impl).
  std::vector<std::string> ForwardImpls() const;
  int64_t batch() const { return batch_; }
  int64_t outputs() const { return spec_.outputs; }
  int64_t dense_dim() const { return dense_dim_; }
  int num_variables() const { return static_cast<int>(spec_.variables.size()); }
  const VariableSpec& variable(int v) const { return spec_.variables[v]; }
  // Where the caller puts variable v's parameters (a pull), for the layers
  // to read; null where params_bf16(v) takes its place.
  float* params(int v) { return params_[v].empty() ? nullptr : params_[v].data(); }
  // model.precision bf16: where variable v's parameters go instead of
  // params(v), rounded to bf16 (the layers' weights, which only the bf16
  // matmuls read); the caller's pull writes them (PullSlice::out_bf16).
  // Null for f32 models and for the biases, which stay in params(v).
  uint16_t* params_bf16(int v) { return params16_[v].empty() ? nullptr : params16_[v].data(); }
  const float* grads(int v) const { return grads_[v].data(); }

  int num_lookups() const { return static_cast<int>(spec_.lookups.size()); }
  const Lookup& lookup(int l) const { return spec_.lookups[l]; }
  // After LoadBatch: the store ids of lookup l's table for this batch (a
  // static table's id is the raw id % rows), all bags one after another.
  absl::Span<const uint64_t> ids(int l) const { return {BagState(l).ids.data(), BagState(l).count}; }
  // The lookup whose ids (and offsets and weights) lookup l reads: l itself,
  // or an earlier lookup of the same field, through a table of the same
  // rows (static) or kind (dynamic), equally weighted, whose store ids are
  // then the same (Wide & Deep's wide part over the deep part's fields):
  // loaded and packed once for both.
  int bag_of(int l) const { return bag_of_[l]; }
  // The lookup of bag k of PackedRecords (the k-th lookup l with bag_of(l) == l).
  int bag_lookup(int k) const { return static_cast<int>(bags_[k]); }
  // Where the caller puts the pulled rows of ids(l) ([ids(l).size() x dim]).
  float* rows(int l) { return lookups_[l].rows.data(); }
  // After Backward: the gradient of each row of ids(l) (same layout).
  const float* row_grads(int l) const { return lookups_[l].row_grads.data(); }

  // Rows in place (ParamStore::RowAddresses), per deep (not wide) lookup
  // and per batch. After LoadBatch the caller writes the address of each
  // id's row in the store to row_addresses(l)[0, ids(l).size()) and calls
  // UseRowAddresses(l, mode) with what the store allows: with kRead or
  // kReadAndSgd, Forward pools the rows in place (no pulled copy). With
  // kReadAndSgd, Backward writes no row_grads(l) and ApplyRowSgd(l, lr)
  // applies the embedding-bag gradient straight to the rows with plain SGD
  // (the fused embedding path); with kRead, Backward writes row_grads(l) as
  // for pulled rows, for the caller to push (an optimizer with slots). A
  // bf16 table's addresses point at bf16 values (ParamStore::RowAddresses):
  // Forward widens them, ApplyRowSgd rounds its updates stochastically.
  // UseRowAddresses(l, kNo) (the state after Create) goes back to rows(l)
  // and row_grads(l). Returns false for a wide lookup, which always uses
  // rows(l).
  float** row_addresses(int l) { return lookups_[l].addresses.data(); }
  bool UseRowAddresses(int l, RowsInPlace mode);
  bool uses_row_addresses(int l) const { return lookups_[l].in_place != RowsInPlace::kNo; }
  // Whether lookup l's rows are updated in place by ApplyRowSgd
  // (kReadAndSgd), so that the caller pushes no row_grads(l).
  bool fuses_row_sgd(int l) const { return lookups_[l].in_place == RowsInPlace::kReadAndSgd; }
  // For a lookup using row addresses: asks for the first line of each of its
  // rows, with intent to write, all at once, so that their misses overlap
  // each other instead of landing one by one in the pooling or the fused
  // update (the worker calls it before each), whose own prefetch covers the
  // rest of a longer row. A hint only: no effect on any value.
  void PrefetchRowsInPlace(int l) const;
  // Before a step's fused updates (ApplyRowSgd): PrefetchRowsInPlace of
  // every lookup whose rows they update (fuses_row_sgd), where
  // prefetches_rows_for_update().
  void PrefetchRowsForUpdate() const;
  // Whether the top tower, run between the pooling and the fused update,
  // moves more bytes than a core's L2 holds (its parameters, read, and its
  // gradients, written): then the pooled rows have likely left L2 and the
  // TLB by the update, and asking for them all at once first overlaps their
  // misses (DLRM, 2 workers on 2 cores, 8 alternating runs: push rows 109 ->
  // 74 us a step). Where the tower is small (a text model's one layer) they
  // are still cached and the pass only costs time (text: 3.4 -> 3.9 us).
  bool prefetches_rows_for_update() const { return prefetch_rows_for_update_; }
  // After Backward(valid, ...), for a lookup that fuses_row_sgd(l): rows -=
  // lr * the gradient of each of its ids (HogwildEmbeddingBagSgd), with
  // Backward's reduction. Nothing for any other lookup.
  void ApplyRowSgd(int l, float lr);
  // Seconds the Forward calls since the last call spent pooling the deep
  // lookups' rows where any was read in place (the embedding phase hidden
  // in the forward; 0 when none was), then resets.
  double TakeInPlacePoolSeconds() {
    const double s = in_place_pool_s_;
    in_place_pool_s_ = 0;
    return s;
  }

  // Copies records[0..n) of `data` (n <= batch) into the batch: dense
  // inputs, labels and each lookup's ids; rows n..batch are padding (zero
  // inputs, empty bags). `data` must have the shape the model was made for.
  // With `packed` (PackRecords(data), or null) the ids come from there.
  // `asked`: how PrefetchBatch was called for these records a step before
  // (a hint: the values loaded are the same either way).
  enum class Asked {
    kNo,
    // Asked for, but in requests of more than RecordsPerPrefetchBurst
    // records, which lose some of their lines: LoadBatch asks again.
    kYes,
    // Asked for in requests of at most RecordsPerPrefetchBurst records
    // each, whose lines arrive: LoadBatch does not ask again.
    kInBursts,
  };
  void LoadBatch(const Dataset& data, const int32_t* records, int64_t n, const PackedRecords* packed = nullptr,
                 Asked asked = Asked::kNo);
  // The same for the consecutive records [first, first + n).
  void LoadRange(const Dataset& data, int64_t first, int64_t n);
  // Asks for record r's inputs (its label or target, its dense values or
  // bytes, and its packed ids) to be brought toward the caches, ahead of the
  // LoadBatch that will read it: issued during a step's compute, the misses
  // overlap it instead of stalling the next data phase. A hint only: no
  // effect on any value.
  void PrefetchRecord(const Dataset& data, int64_t r, const PackedRecords* packed) const;
  // A step ahead of LoadBatch(records, n): where the packed blocks are one
  // after the other, the words that locate them, all in flight at once;
  // then PrefetchRecord for each (which reads those words; slots need none).
  void PrefetchBatch(const Dataset& data, const int32_t* records, int64_t n, const PackedRecords* packed) const;
  // How many records' lines PrefetchBatch asks for in a burst of about
  // `burst_lines` lines (at least 1 record): prefetches that miss, issued
  // back to back, are lost past what the core's line fill buffers hold,
  // which differs from one machine to the next (core/data/prefetch_burst.h
  // measures it). A worker asks for a larger batch a part at a time, at
  // several points of its step, and tells LoadBatch whether each part was
  // at most this many records (Asked). O(1).
  int64_t RecordsPerPrefetchBurst(const PackedRecords* packed, int64_t burst_lines) const;
  // `data` packed for this model (PackedRecords): the ids (and weights)
  // where there are lookups, the dense bytes where every value is
  // k / 255.0f. nullopt when neither part applies. Three passes over
  // `data` (the blocks' sizes; each range's words; the blocks), which must
  // have the shape the model was made for. `stride_bytes`: the
  // blocks' layout, kAutoStride (ChooseStrideWords), 0 (one after the other, with start words) or slots
  // of that many bytes (whole words, from 16 to 8 * kMaxStrideWords: the
  // tests' and benchmarks' way to pick one). The blocks are written on
  // every hardware thread, kPackRange records at a time; the dense bytes
  // kPackDenseBytes at a time.
  static constexpr int64_t kAutoStride = -1;
  static constexpr int64_t kPackRange = 4096;
  static constexpr size_t kPackDenseBytes = size_t{1} << 16;
  std::optional<PackedRecords> PackRecords(const Dataset& data, int64_t stride_bytes = kAutoStride) const;
  // The slot stride (in words) whose loads touch the fewest cache lines for
  // blocks of these sizes (words_histogram[w]: how many blocks are w words,
  // kStrideHistogramWords + 1 entries, the last counting every block of that
  // size or more; 0 for any other size), or 0 where
  // blocks one after the other touch fewer, or slots would take more than
  // twice their memory (`total_words`: every block's words). Lines a load
  // touches: an aligned slot's lines, plus 1 + (bytes - 8) / 64 for a
  // block after the slots or after another block (a uniformly placed
  // start), plus the start word's line for blocks one after the other. A
  // block after the slots counts its lines twice: it is found in its slot,
  // so a worker cannot ask for it a step ahead, and its misses are waited
  // for in the data phase (sparse_logreg.yaml, its weights as floats after
  // the ids, before they were coded: 192-byte slots, 3 lines and a block
  // after them for 20% of the records, against 256-byte ones, 4 lines and
  // almost none: data 1.62-1.71 against 1.42-1.50 us a step, 5 alternating
  // pairs on the 2-core EPYC VM).
  // Slots are at most kMaxStrideWords (512 bytes).
  static constexpr int64_t kMaxStrideWords = 64;
  static constexpr int64_t kStrideHistogramWords = 4 * kMaxStrideWords;
  static int64_t ChooseStrideWords(const std::vector<int64_t>& words_histogram, uint64_t total_words);

  // Forward pass over the loaded batch and pulled rows. `training` applies dropout.
  void Forward(bool training, const dnnl::stream& stream);
  // The head's loss over the first `valid` rows, then the backward pass:
  // gradients into grads() and row_grads(), of the mean loss over the
  // `valid` records, or with LossReduction::kSum of their summed loss
  // (`valid` times the mean's), as `reduction` says for each. The returned
  // loss is the sum either way. Call after Forward(true, ...).
  LossResult Backward(int64_t valid, const dnnl::stream& stream, GradientReduction reduction = {});
  // Called by Backward after each dense layer, as soon as its gradients
  // (grads(first_var .. first_var + count - 1)) are final and its weights
  // are no longer read by this pass: a layer's gradient can leave (an
  // allreduce) while the layers below it are differentiated. Empty = none.
  // The calls come in BackwardGroups() order, on Backward's thread.
  void set_gradients_ready(std::function<void(int first_var, int count)> ready) {
    gradients_ready_ = std::move(ready);
  }
  // Called by Backward once every lookup's row gradient is known (row_grads(),
  // and the pooled gradient ApplyRowSgd reads) and before the bottom tower's
  // backward, on Backward's thread: the rows can be updated while the lines
  // the forward's pooling read are still in the caches. Empty = none.
  void set_rows_ready(std::function<void()> ready) { rows_ready_ = std::move(ready); }
  // The dense variables grouped by layer ({kernel, bias}), in the order
  // Backward finishes them: the top tower's layers from the last, then the
  // bottom tower's. Every variable is in exactly one group.
  std::vector<std::vector<int>> BackwardGroups() const;
  // The head's loss over `valid` rows of the last Forward, no gradients.
  LossResult Loss(int64_t valid);

  // [batch x outputs()] after Forward: logits (softmax, binary) or predictions (regression).
  const float* logits() const { return logits_; }
  // The loaded batch's dense inputs ([batch x dense_dim()]).
  const float* dense_inputs() const { return input_.data(); }
  // The loaded batch's labels ([batch]; classification) and targets ([batch]; regression).
  const int32_t* labels() const { return labels_.data(); }
  const float* targets() const { return targets_.data(); }

  // FLOPs (2 per multiply-add) of one forward and one backward pass over a full batch (dense layers only).
  double ForwardFlops() const;
  double BackwardFlops() const;

 private:
  class Tower;
  struct LookupState {
    // The bag part: what a batch loads (read through BagState(l); empty for a
    // lookup that reads another's, bag_of_).
    std::vector<uint64_t> ids;
    std::vector<int64_t> offsets;     // [batch + 1], relative to ids
    std::vector<float> weights;       // empty when not weighted
    bool has_weights = false;         // the batch's weights are in `weights`; otherwise each is 1 (BatchWeights)
    size_t count = 0;                 // ids of this batch
    // The rows part, the lookup's own.
    std::vector<float> rows, row_grads;
    std::vector<float*> addresses;    // [ids.size()] the rows in the store (in_place)
    RowsInPlace in_place = RowsInPlace::kNo;  // UseRowAddresses
    int64_t z_offset = 0;             // where its pooled vector goes in a row of z_ (deep lookups)
  };
  Model() = default;
  // Record `record` into batch row `slot`: its dense values (from `packed`'s
  // bytes where it has them) and label or target (LoadRecordHead), then its
  // ids, from `packed` where it has them (LoadPackedIds), else from `data`'s
  // fields.
  void LoadRecord(const Dataset& data, int64_t record, int64_t slot, const PackedRecords* packed = nullptr);
  void LoadRecordHead(const Dataset& data, int64_t record, int64_t slot, const PackedRecords* packed);
  void LoadPackedIds(const PackedRecords& packed, int64_t record, int64_t slot);
  // LoadRecord for every record of a batch, for the one layout of a bag of
  // words or of weighted features: one lookup's narrow ids (and their
  // weights, where weighted) in slots, the label in them, no dense values,
  // one label a record (PackedRecords::slot_load, kEntries, says which).
  template <PackedRecords::SlotLoad kEntries>
  void LoadSlots(const int32_t* records, int64_t n, const PackedRecords& packed);
  // LoadRecord for every record of a batch in the one-id layout
  // (PackedRecords::kOneIdBags): each bag's id where the record's mask has
  // it, the label and the dense values, from each record's slot.
  void LoadOneIdSlots(const int32_t* records, int64_t n, const PackedRecords& packed);
  static void CopyIdsThenWeights(const char* __restrict from, uint32_t count, int64_t copy,
                                 uint64_t* __restrict ids, float* __restrict weights);
  // Room in lookup l for `need` ids and kIdSlack more: LoadPackedIds copies
  // ids in chunks of kIdSlack + 1, so it may write up to kIdSlack past the
  // lookup's count. GrowLookup (never shrinks) when there is not.
  static constexpr uint32_t kIdSlack = 3;
  void EnsureIds(size_t l, size_t need) {
    if (lookups_[l].ids.size() < need + kIdSlack) GrowLookup(l, need);
  }
  // Lookup l's bag part (LookupState): its own or the one it reads (bag_of_).
  const LookupState& BagState(size_t l) const { return lookups_[bag_of_[l]]; }
  void GrowLookup(size_t l, size_t need);
  // Lookup l's id count in a packed block (PackedRecords).
  static uint32_t BlockCount(const uint64_t* block, size_t l) {
    uint32_t c = 0;
    std::memcpy(&c, reinterpret_cast<const char*>(block) + l * sizeof(uint32_t), sizeof(c));
    return c;
  }
  void FinishLoad(int64_t n);
  // A record's bytes that PrefetchRecord asks for (dense values, and the
  // packed slot, or mean id block, where ids are packed; unpacked ids are
  // not prefetched);
  // LoadBatch asks for every record's lines at once up to kFewRecordBytes, a
  // few lines a record. O(1): PackedRecords::prefetch_bytes is kept when packing.
  int64_t RecordBytes(const PackedRecords* packed) const;
  static constexpr int64_t kFewRecordBytes = 512;
  // For the records whose packed block is after the slots
  // (PackedRecords::kOverflowSlot in their slot, which must be in the
  // caches): asks for the block's first lines.
  void PrefetchOverflowBlocks(const int32_t* records, int64_t n, const PackedRecords& packed) const;
  // Loads the first lines of the batch's records (labels, packed blocks) all
  // at once, before LoadRecord copies them one by one.
  void TouchBatch(const Dataset& data, const int32_t* records, int64_t n, const PackedRecords* packed) const;
  // Pools every deep lookup's rows into its columns of z_.
  void PoolLookups();
  void AddWide();  // adds the wide lookups' terms to the logits
  // Starts a batch from `data`: no ids yet, and whether its weights are read.
  void BeginLoad(const Dataset& data);
  // The loaded batch's weights of a lookup for the kernels: nullptr when
  // each is 1 (not weighted, or a weighted field whose data has no weights;
  // the kernels' `weights ? weights[i] : 1.0f` gives the same bits as 1s).
  static const float* BatchWeights(const LookupState& st) { return st.has_weights ? st.weights.data() : nullptr; }

  ModelSpec spec_;
  HeadType head_ = HeadType::kSoftmax;
  Precision precision_ = Precision::kF32;
  Interaction interaction_ = Interaction::kConcat;
  int64_t batch_ = 0, dense_dim_ = 0, db_ = 0, num_vectors_ = 0, vec_dim_ = 0;
  // concat with no deep lookups: the top tower reads the dense vector (the
  // input or the bottom's output) in place, with no copy into z_.
  bool direct_ = false;
  std::vector<int64_t> static_rows_;  // per lookup: table rows for static tables, 0 for dynamic
  std::vector<float> input_;          // [batch, dense_dim]
  std::vector<int32_t> labels_;
  std::vector<float> targets_;
  std::vector<int64_t> label_offsets_;
  std::vector<int32_t> label_sets_;
  std::vector<LookupState> lookups_;
  std::vector<int> bag_of_;           // per lookup: bag_of(l)
  std::vector<size_t> bags_;          // the lookups l with bag_of(l) == l, in order (PackedRecords' bags)
  std::vector<float> z_, dz_;         // interaction input (dot) or the top's input (concat) and its gradient
  std::vector<float> inter_, dinter_; // the top tower's input and gradient (dot interactions)
  std::vector<float> wide_tmp_;       // [batch, outputs] one wide lookup's pooled term
  // Every variable's f32 parameters (the worker's copy, which the pull or
  // the fused push writes and the layers read) and gradients, in one block
  // allocated by HugePageAllocator (on huge pages where the kernel grants
  // them): every params slice, then every gradient, each on a cache line of
  // its own. The layers and the push read and write all of them every step,
  // and on 4 KiB pages that is a TLB miss a page, a two-level page walk in a
  // VM guest. Default MLP (1.9 MB of them) on a 2-core Zen 5 VM, 3
  // alternating pairs of `shardwild bench` with 1 worker: push 76-84 ->
  // 57-62 us a step, samples/s +3-11%.
  HugePageVector<float> dense_arena_;
  std::vector<absl::Span<float>> params_, grads_;  // slices of dense_arena_; params_ empty under bf16 (kernels)
  HugePageVector<uint16_t> dense16_arena_;         // the same for params16_
  std::vector<absl::Span<uint16_t>> params16_;     // params_bf16
  std::unique_ptr<Tower> bottom_, top_;
  std::function<void(int, int)> gradients_ready_;  // set_gradients_ready
  std::function<void()> rows_ready_;              // set_rows_ready
  bool prefetch_rows_for_update_ = false;         // prefetches_rows_for_update
  float* logits_ = nullptr;
  float* dlogits_ = nullptr;
  uint64_t rng_ = 0;
  uint64_t rng_seed_ = 0;       // the seed's state at Create: bf16 rows' rounding seeds derive from it
  uint64_t row_sgd_calls_ = 0;  // ApplyRowSgd calls on bf16 rows so far
  // The last Backward's: records and the deep rows' gradient factor.
  int64_t valid_ = 0;
  float row_grad_scale_ = 1.0f;
  double in_place_pool_s_ = 0;  // TakeInPlacePoolSeconds
};

}  // namespace shardwild
