#include "ps_shm/shm_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/hogwild_kernels.h"
#include "core/model/optimizer.h"
#include "core/base/random.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"
#include "ps_shm/memory_placer.h"
#include "ps_shm/push_chunks.h"
#include "ps_shm/row_seqlock.h"
#include "ps_shm/shard_format.h"

namespace shardwild {
namespace {

static_assert(std::atomic_ref<uint64_t>::is_always_lock_free, "shard counters need lock-free 64-bit atomics");

constexpr uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string SegmentName(const std::string& store, int shard) { return absl::StrCat(store, "-s", shard); }

std::string UniqueStoreName(const std::string& job) {
  std::random_device rd;
  const uint32_t nonce = rd();
  return absl::StrFormat("%s-%d-%08x", job, static_cast<int>(getpid()), nonce);
}

ShardHeader* Header(const ShmSegment& seg) { return static_cast<ShardHeader*>(seg.data()); }
LayoutEntry* Entries(const ShmSegment& seg) {
  return reinterpret_cast<LayoutEntry*>(static_cast<char*>(seg.data()) + sizeof(ShardHeader));
}

TableEntry* Tables(const ShmSegment& seg) {
  const ShardHeader* h = Header(seg);
  return reinterpret_cast<TableEntry*>(static_cast<char*>(seg.data()) + sizeof(ShardHeader) +
                                       uint64_t{h->num_entries} * sizeof(LayoutEntry));
}

// The global parts table of a partial store (shard_format.h), after the TableEntry records.
GlobalPart* GlobalParts(const ShmSegment& seg) {
  const ShardHeader* h = Header(seg);
  return reinterpret_cast<GlobalPart*>(reinterpret_cast<char*>(Tables(seg)) + uint64_t{h->num_tables} * sizeof(TableEntry));
}

// Bytes of the header region: the records, padded to a page.
uint64_t HeaderBytes(uint64_t nvars, uint64_t ntables, uint64_t num_shards, bool partial) {
  return AlignUp(sizeof(ShardHeader) + nvars * sizeof(LayoutEntry) + ntables * sizeof(TableEntry) +
                     (partial ? nvars * num_shards * sizeof(GlobalPart) : 0),
                 4096);
}

// ---- Embedding tables over shards (param_store.h, TableSpec) -----------------

// Rows shard s of `shards` holds of a table (TableSpec).
int64_t ShardCapacity(const TableSpec& t, int s, int shards) {
  if (shards == 1) return t.capacity;
  if (t.kind == EmbeddingKind::kStatic) return std::max<int64_t>(1, (t.capacity - s + shards - 1) / shards);
  const int64_t even = (t.capacity + shards - 1) / shards;
  return even + even / 8 + 16;
}

// The options of shard s's EmbeddingTable of table t.
EmbeddingTableOptions TableShardOptions(const TableSpec& spec, int t, int s, int shards, uint64_t seed,
                                        const OptimizerOptions& sparse, UpdateMode update) {
  EmbeddingTableOptions o;
  o.name = spec.name;
  o.kind = spec.kind;
  o.dim = spec.dim;
  o.capacity = ShardCapacity(spec, s, shards);
  o.on_full = spec.on_full;
  o.init = spec.init;
  o.bf16 = spec.bf16;
  o.seed = seed;
  // Dynamic rows are keyed by their global id, so their draws do not depend
  // on the shard; static rows by their local row, so the shard is mixed in.
  o.table_id = (static_cast<uint32_t>(t) << 12) | (spec.kind == EmbeddingKind::kStatic ? static_cast<uint32_t>(s) : 0u);
  o.SetOptimizer(sparse);
  o.row_lock = update == UpdateMode::kRowLock;
  return o;
}

uint64_t LoadRelaxed(uint64_t* p) { return std::atomic_ref<uint64_t>(*p).load(std::memory_order_relaxed); }

// Bytes of the row sequence words of a part holding `rows` rows (shard_format.h).
uint64_t SeqBytes(int64_t rows) { return AlignUp(static_cast<uint64_t>(rows) * sizeof(uint32_t), 64); }

// The error for a static table's id at or past its capacity: one wording
// for pulls, pushes, row reads and RowAddresses.
absl::Status StaticIdOutOfRange(const TableSpec& spec, uint64_t id) {
  return absl::InvalidArgumentError(absl::StrCat("embedding table '", spec.name, "': id ", id,
                                                 " is out of range for a static table of ", spec.capacity, " rows"));
}

}  // namespace

absl::Status PullConvertingToBf16(absl::Span<const PullSlice> slices, const StoreLayout& layout,
                                  const std::function<absl::Status(absl::Span<const PullSlice>)>& pull_f32) {
  bool any = false;
  for (const PullSlice& sl : slices) any = any || sl.out_bf16 != nullptr;
  if (!any) return pull_f32(slices);
  std::vector<PullSlice> f32(slices.begin(), slices.end());
  std::vector<std::vector<float>> buffers(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const PullSlice& sl = slices[i];
    if (sl.out_bf16 == nullptr) continue;
    if (sl.out != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pull: slice ", i, " sets both out and out_bf16"));
    }
    if (sl.var < 0 || sl.var >= static_cast<int>(layout.variables.size()) || sl.row_end < sl.row_begin) {
      return absl::InvalidArgumentError(absl::StrCat("pull: bad slice ", i, " (variable ", sl.var, ")"));
    }
    buffers[i].resize(static_cast<size_t>((sl.row_end - sl.row_begin) * layout.variables[sl.var].cols));
    f32[i].out = buffers[i].data();
    f32[i].out_bf16 = nullptr;
  }
  SW_RETURN_IF_ERROR(pull_f32(f32));
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].out_bf16 != nullptr) {
      HogwildCopyFromAsBf16(buffers[i].data(), slices[i].out_bf16, static_cast<int64_t>(buffers[i].size()));
    }
  }
  return absl::OkStatus();
}

StoreLayout StoreLayout::Make(std::vector<VariableSpec> variables, int num_shards,
                              const PartitionerOptions& partitioner) {
  StoreLayout l;
  l.num_shards = num_shards;
  int unpartitioned = 0;  // variables placed whole so far: the round-robin counter
  for (const VariableSpec& v : variables) {
    const int64_t row_bytes = v.cols * static_cast<int64_t>(sizeof(float));
    const bool whole = NumPartitions(partitioner, v.rows, row_bytes, num_shards) == 1;
    const int first_shard = whole ? unpartitioned++ % num_shards : 0;
    l.parts.push_back(PartitionRows(partitioner, v.rows, row_bytes, num_shards, first_shard));
  }
  l.variables = std::move(variables);
  l.shard_nodes.assign(num_shards, 0);
  return l;
}

absl::StatusOr<std::unique_ptr<ParamStore>> ParamStore::Open(const OpenStoreOptions& options,
                                                             std::vector<VariableSpec> variables) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmParamStore> store, ShmParamStore::Create(options, std::move(variables)));
  return std::unique_ptr<ParamStore>(std::move(store));
}

bool UsePrivateMemory(const OpenStoreOptions& options, const HugePageSettings& settings) {
  switch (options.store.memory_kind) {
    case StoreMemoryKind::kPrivate: return true;
    case StoreMemoryKind::kShared: return false;
    case StoreMemoryKind::kAuto: break;
  }
  return !options.others_attach && options.store.huge_pages == HugePagePolicy::kAuto && settings.private_allowed() &&
         !settings.allowed();
}

absl::StatusOr<std::unique_ptr<ShmParamStore>> ShmParamStore::Create(const OpenStoreOptions& options,
                                                                     std::vector<VariableSpec> variables) {
  SW_RETURN_IF_ERROR(options.store.Validate());
  SW_RETURN_IF_ERROR(options.optimizer.Validate());
  if (options.num_shards < 1 || options.num_shards > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("ps.shards: must be 1..4096, got ", options.num_shards));
  }
  const int first_hosted = options.num_hosted_shards == -1 ? 0 : options.first_hosted_shard;
  const int num_hosted = options.num_hosted_shards == -1 ? options.num_shards : options.num_hosted_shards;
  if (first_hosted < 0 || num_hosted < 1 || first_hosted > options.num_shards - num_hosted) {
    return absl::InvalidArgumentError(absl::StrCat("hosted shards: ", num_hosted, " from shard ", first_hosted,
                                                   " are not a block of the ", options.num_shards, " shards"));
  }
  const bool partial = num_hosted != options.num_shards;
  for (const VariableSpec& v : variables) {
    if (v.name.empty() || v.name.size() >= kMaxNameBytes || v.rows < 1 || v.cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat("variable '", v.name, "': needs a name of 1..", kMaxNameBytes - 1,
                                                     " bytes and rows, cols >= 1"));
    }
  }
  const int init_threads = options.init_threads > 0
                               ? options.init_threads
                               : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const OptimizerOptions sparse = options.sparse_optimizer.value_or(options.optimizer);
  if (options.sparse_optimizer) {
    if (absl::Status s = options.sparse_optimizer->Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer.sparse: ", s.message()));
    }
  }
  if (options.tables.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("embedding tables: at most 4096, got ", options.tables.size()));
  }
  for (size_t t = 0; t < options.tables.size(); ++t) {
    const TableSpec& spec = options.tables[t];
    if (spec.name.empty() || spec.name.size() > 47) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table ", t, ": needs a name of 1..47 bytes, got '",
                                                     spec.name, "'"));
    }
    for (size_t u = 0; u < t; ++u) {
      if (options.tables[u].name == spec.name) {
        return absl::InvalidArgumentError(absl::StrCat("embedding table '", spec.name, "' is given twice"));
      }
    }
    const EmbeddingTableOptions o = TableShardOptions(spec, static_cast<int>(t), 0, 1, options.seed, sparse, options.store.update);
    if (absl::Status s = o.Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table '", spec.name, "': ", s.message()));
    }
  }
  std::unique_ptr<ShmParamStore> st(new ShmParamStore());

  // Segments of this job that runs which are gone left behind.
  SW_ASSIGN_OR_RETURN(std::vector<StaleSegment> stale, FindStaleSegments(options.store.job_name));
  if (!stale.empty()) {
    switch (options.store.stale_segments) {
      case StaleSegmentPolicy::kFail:
        return absl::FailedPreconditionError(absl::StrCat(
            "ps.stale_segments is 'fail' and ", stale.size(), " shared-memory segment(s) of job '",
            options.store.job_name, "' were left by processes that are gone: ", DescribeStaleSegments(stale),
            ". Remove them, or set ps.stale_segments to 'remove'"));
      case StaleSegmentPolicy::kRemove:
        SW_RETURN_IF_ERROR(RemoveStaleSegments(stale));
        st->removed_stale_segments_ = std::move(stale);
        break;
      case StaleSegmentPolicy::kReport:
        st->reported_stale_segments_ = std::move(stale);
        break;
    }
  }
  st->huge_page_settings_ = ReadHugePageSettings();
  st->private_memory_ = UsePrivateMemory(options, st->huge_page_settings_);
  const bool want_huge_pages =
      options.store.huge_pages == HugePagePolicy::kAuto &&
      (st->private_memory_ ? st->huge_page_settings_.private_allowed() : st->huge_page_settings_.allowed());
  st->huge_pages_requested_ = want_huge_pages;

  st->name_ = UniqueStoreName(options.store.job_name);
  st->optimizer_ = options.optimizer;
  st->sparse_optimizer_ = sparse;
  st->update_mode_ = options.store.update;
  st->layout_ = StoreLayout::Make(std::move(variables), options.num_shards, options.store.partitioner);
  st->layout_.tables = options.tables;
  st->shard_divisor_ = FixedDivisor(static_cast<uint32_t>(options.num_shards));
  const int num_slots = NumSlots(options.optimizer.type);
  const int nvars = static_cast<int>(st->layout_.variables.size());
  const int ntables = static_cast<int>(options.tables.size());
  const uint64_t header_bytes = HeaderBytes(nvars, ntables, options.num_shards, partial);
  st->tables_.assign(ntables, {});
  st->first_hosted_ = first_hosted;
  st->num_hosted_ = num_hosted;
  SW_RETURN_IF_ERROR(st->ComputeHostedRows());
  // The global parts table a partial store's headers carry.
  std::vector<GlobalPart> global_parts;
  if (partial) {
    for (int v = 0; v < nvars; ++v) {
      for (const RowRange& r : st->layout_.parts[v]) global_parts.push_back({r.begin, r.end});
    }
  }
  for (int s = 0; s < options.num_shards; ++s) {
    if (!st->hosts(s)) st->layout_.shard_nodes[s] = -1;  // not here: no memory, no node
  }

  for (int s = first_hosted; s < first_hosted + num_hosted; ++s) {
    const int k = s - first_hosted;  // the segment's index
    // Size the shard.
    std::vector<LayoutEntry> entries(nvars);
    uint64_t cursor = header_bytes;
    for (int v = 0; v < nvars; ++v) {
      const VariableSpec& spec = st->layout_.variables[v];
      const RowRange r = st->layout_.parts[v][s];
      LayoutEntry& e = entries[v];
      std::memset(&e, 0, sizeof(e));
      std::snprintf(e.name, sizeof(e.name), "%s", spec.name.c_str());
      e.rows = spec.rows;
      e.cols = spec.cols;
      e.row_begin = r.begin;
      e.row_end = r.end;
      e.array_bytes = AlignUp(static_cast<uint64_t>(r.size() * spec.cols) * sizeof(float), 64);
      e.offset = cursor;
      cursor += e.array_bytes * (1 + num_slots) + SeqBytes(r.size());
    }
    // The embedding tables' regions, after the dense arrays.
    std::vector<TableEntry> table_entries(ntables);
    std::vector<EmbeddingTableOptions> table_options;
    for (int t = 0; t < ntables; ++t) {
      const TableSpec& spec = options.tables[t];
      table_options.push_back(TableShardOptions(spec, t, s, options.num_shards, options.seed, sparse, options.store.update));
      TableEntry& te = table_entries[t];
      std::memset(&te, 0, sizeof(te));
      std::snprintf(te.name, sizeof(te.name), "%s", spec.name.c_str());
      te.kind = static_cast<uint32_t>(spec.kind);
      te.on_full = static_cast<uint32_t>(spec.on_full);
      te.dim = spec.dim;
      te.capacity = spec.capacity;
      te.shard_capacity = table_options.back().capacity;
      te.bytes = EmbeddingTable::BytesFor(table_options.back());
      if (te.bytes == 0) return table_options.back().Validate();
      cursor = AlignUp(cursor, 4096);
      te.offset = cursor;
      cursor += te.bytes;
    }
    const uint64_t total = AlignUp(std::max<uint64_t>(cursor, header_bytes), 4096);
    const int node = options.placer ? options.placer->NodeForShard(k, num_hosted) : 0;
    st->layout_.shard_nodes[s] = node;

    std::unique_ptr<ShmSegment> seg;
    auto create = [&]() -> absl::Status {
      if (st->private_memory_) {
        // Advised (and aligned) by CreatePrivate.
        SW_ASSIGN_OR_RETURN(seg, ShmSegment::CreatePrivate(SegmentName(st->name_, k), total, want_huge_pages));
      } else {
        SW_ASSIGN_OR_RETURN(seg, ShmSegment::Create(SegmentName(st->name_, k), total,
                                                    ShmSegment::Reservation::kByOwner));
        // Advised before any page exists, so where /dev/shm allows huge
        // pages the reservation below takes them directly.
        if (want_huge_pages && !AdviseHugePages(seg->data(), seg->size())) st->huge_pages_requested_ = false;
      }
      // Every page is reserved (allocated zeroed, and mapped) by threads
      // bound to this node (this one and the helpers it starts, which
      // inherit its binding), a chunk at a time: in parallel, where
      // posix_fallocate would take them all on one thread, and in one call
      // a chunk, not one fault a page when InitRows first touches them
      // (DLRM, 1.67 GB on 2 threads, alternating runs: store set-up
      // 1.17-1.29 -> 0.92-1.07 s).
      //   The static tables' rows (and side words) are reserved piece by
      // piece, each just before InitRows draws its rows: the kernel has just
      // zeroed those pages, so the rows' stores find their lines in the
      // caches instead of going out to memory a second time. Everything
      // else (headers, dense arrays, dynamic tables' rows and indexes) first,
      // in chunks, before Format writes the headers and indexes.
      const uint64_t size = seg->size();
      constexpr uint64_t kReserveChunk = uint64_t{4} << 20;
      constexpr int64_t kRowPiece = 32768;
      struct Span {
        uint64_t begin, end;  // offsets in the segment
      };
      std::vector<Span> row_spans;  // the static rows' bytes, reserved with their pieces
      for (int t = 0; t < ntables; ++t) {
        for (const EmbeddingTable::ByteRange& r :
             EmbeddingTable::InitRowsBytes(table_options[t], 0, table_options[t].capacity)) {
          const uint64_t begin = table_entries[t].offset + r.offset;
          if (r.bytes > 0) row_spans.push_back({begin, begin + r.bytes});
        }
      }
      std::sort(row_spans.begin(), row_spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
      std::vector<Span> chunks;  // the rest
      auto add_gap = [&](uint64_t begin, uint64_t end) {
        for (; begin < end; begin += kReserveChunk) chunks.push_back({begin, std::min(end, begin + kReserveChunk)});
      };
      uint64_t at = 0;
      for (const Span& r : row_spans) {
        add_gap(at, std::min(r.begin, size));
        at = std::max(at, r.end);
      }
      add_gap(at, size);
      SW_RETURN_IF_ERROR(ParallelForStatus(init_threads, static_cast<int64_t>(chunks.size()), [&](int64_t c) {
        return seg->Reserve(chunks[c].begin, chunks[c].end - chunks[c].begin);
      }));
      char* base = static_cast<char*>(seg->data());
      // Format the tables here too, and initialise their static rows on the
      // same node-bound threads, in pieces of kRowPiece rows. A row's values
      // depend only on (seed, table_id, id), so the split does not change
      // them. (Two pieces may share a page at their boundary: reserving a
      // page already there changes nothing in it.)
      std::vector<EmbeddingTable> formatted;
      struct Piece {
        int table;
        int64_t begin, end;
      };
      std::vector<Piece> pieces;
      for (int t = 0; t < ntables; ++t) {
        SW_ASSIGN_OR_RETURN(EmbeddingTable table,
                            EmbeddingTable::Format(base + table_entries[t].offset, table_entries[t].bytes, table_options[t]));
        formatted.push_back(table);
        if (table.kind() != EmbeddingKind::kStatic) continue;
        for (int64_t b = 0; b < table.capacity(); b += kRowPiece) {
          pieces.push_back({t, b, std::min(b + kRowPiece, table.capacity())});
        }
      }
      SW_RETURN_IF_ERROR(ParallelForStatus(init_threads, static_cast<int64_t>(pieces.size()), [&](int64_t i) {
        const Piece& p = pieces[i];
        for (const EmbeddingTable::ByteRange& r : EmbeddingTable::InitRowsBytes(table_options[p.table], p.begin, p.end)) {
          SW_RETURN_IF_ERROR(seg->Reserve(table_entries[p.table].offset + r.offset, r.bytes));
        }
        formatted[p.table].InitRows(p.begin, p.end);
        return absl::OkStatus();
      }));
      // Pages reserved small (a /dev/shm whose huge pages came after the
      // advice, or none free then): ask for them to be collapsed (on this
      // thread, so the huge pages come from this node too). Collapsing
      // keeps the pages' contents.
      if (want_huge_pages) CollapseHugePages(seg->data(), seg->size());
      // The helpers have been joined: every row is initialised before this.
      for (int t = 0; t < ntables; ++t) {
        formatted[t].Publish();
        st->tables_[t].push_back(formatted[t]);
      }
      return absl::OkStatus();
    };
    if (options.placer) {
      SW_RETURN_IF_ERROR(options.placer->RunOnNode(node, create));
      SW_RETURN_IF_ERROR(options.placer->BindArea(seg->data(), seg->size(), node));
    } else {
      SW_RETURN_IF_ERROR(create());
    }

    ShardHeader* h = Header(*seg);
    h->magic = kShardMagic;
    h->format_version = kShardFormatVersion;
    h->header_bytes = static_cast<uint32_t>(header_bytes);
    h->total_bytes = seg->size();
    h->owner_pid = getpid();
    h->shard_index = s;
    h->num_shards = options.num_shards;
    h->num_entries = nvars;
    h->optimizer_type = static_cast<uint32_t>(options.optimizer.type);
    h->num_slots = num_slots;
    h->update_mode = static_cast<uint32_t>(options.store.update);
    h->num_tables = static_cast<uint32_t>(ntables);
    h->sparse_optimizer_type = static_cast<uint32_t>(sparse.type);
    std::snprintf(h->store_name, sizeof(h->store_name), "%s", st->name_.c_str());
    h->first_hosted_shard = static_cast<uint32_t>(first_hosted);
    h->num_hosted_shards = static_cast<uint32_t>(num_hosted);
    if (nvars > 0) std::memcpy(Entries(*seg), entries.data(), entries.size() * sizeof(LayoutEntry));
    if (ntables > 0) std::memcpy(Tables(*seg), table_entries.data(), table_entries.size() * sizeof(TableEntry));
    if (!global_parts.empty()) {
      std::memcpy(GlobalParts(*seg), global_parts.data(), global_parts.size() * sizeof(GlobalPart));
    }
    st->segments_.push_back(std::move(seg));
  }
  SW_RETURN_IF_ERROR(st->BuildParts());

  // Initial values: computed once per (global) variable from the seed, then
  // copied to the rows each hosted shard holds, so a partial store's rows
  // start as the full store's. No other thread can see the store yet.
  std::vector<float> init;
  for (int v = 0; v < nvars; ++v) {
    const VariableSpec& spec = st->layout_.variables[v];
    if (st->hosted_rows_[v].size() == 0) continue;
    init.resize(spec.size());
    FillInitialValue(spec, options.seed, init.data());
    for (int s = first_hosted; s < first_hosted + num_hosted; ++s) {
      const Part& p = st->parts_[v][s];
      std::memcpy(p.params, init.data() + p.row_begin * spec.cols, (p.row_end - p.row_begin) * spec.cols * sizeof(float));
      // Slots start at the optimizer's initial value (the segment is zeroed).
      for (int k = 0; k < num_slots; ++k) {
        const float slot_init = SlotInitialValue(options.optimizer, k);
        if (slot_init != 0.0f) std::fill_n(p.slots[k], (p.row_end - p.row_begin) * spec.cols, slot_init);
      }
    }
  }
  return st;
}

absl::Status ShmParamStore::BuildParts() {
  const int nvars = static_cast<int>(layout_.variables.size());
  num_slots_ = NumSlots(optimizer_.type);
  parts_.assign(nvars, std::vector<Part>(layout_.num_shards));
  push_chunks_.clear();
  shard_versions_.clear();
  for (int s = first_hosted_; s < first_hosted_ + num_hosted_; ++s) {
    const ShmSegment& seg = *segments_[s - first_hosted_];
    ShardHeader* h = Header(seg);
    shard_versions_.push_back(&h->model_version);
    LayoutEntry* entries = Entries(seg);
    char* base = static_cast<char*>(seg.data());
    for (int v = 0; v < nvars; ++v) {
      LayoutEntry& e = entries[v];
      Part& p = parts_[v][s];
      p.params = reinterpret_cast<float*>(base + e.offset);
      for (uint32_t k = 0; k < h->num_slots && k < 4; ++k) {
        p.slots[k] = reinterpret_cast<float*>(base + e.offset + (k + 1) * e.array_bytes);
      }
      p.update_count = &e.update_count;
      p.row_seq = reinterpret_cast<uint32_t*>(base + e.offset + (1 + h->num_slots) * e.array_bytes);
      p.row_begin = e.row_begin;
      p.row_end = e.row_end;
      if (p.row_end > p.row_begin) {
        const int64_t cols = layout_.variables[v].cols;
        push_chunks_.push_back(std::make_unique<PushChunks>((p.row_end - p.row_begin) * cols));
        p.chunks = push_chunks_.back().get();
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::ComputeHostedRows() {
  hosted_rows_.clear();
  for (size_t v = 0; v < layout_.variables.size(); ++v) {
    // The hosted shards' non-empty ranges, sorted by row, must follow each
    // other without a gap (StoreLayout::Make guarantees it for any block;
    // an attached header might not).
    std::vector<RowRange> held;
    for (int s = first_hosted_; s < first_hosted_ + num_hosted_; ++s) {
      if (layout_.parts[v][s].size() > 0) held.push_back(layout_.parts[v][s]);
    }
    std::sort(held.begin(), held.end(), [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < held.size(); ++i) {
      if (held[i].begin != held[i - 1].end) {
        return absl::FailedPreconditionError(absl::StrCat(
            "store ", name_, ": shards ", first_hosted_, "..", first_hosted_ + num_hosted_ - 1, " hold rows of '",
            layout_.variables[v].name, "' that are not one contiguous range (", held[i - 1].begin, "..",
            held[i - 1].end, " and ", held[i].begin, "..", held[i].end, ")"));
      }
    }
    hosted_rows_.push_back(held.empty() ? RowRange{0, 0} : RowRange{held.front().begin, held.back().end});
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::CheckHosted(int var, int64_t begin, int64_t end, const char* what) const {
  const RowRange h = hosted_rows_[var];
  if (begin == end || (begin >= h.begin && end <= h.end)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": rows [", begin, ", ", end, ") of '", layout_.variables[var].name,
                                                 "' are not hosted here (store ", name_, " hosts shards ", first_hosted_,
                                                 "..", first_hosted_ + num_hosted_ - 1, " of ", layout_.num_shards,
                                                 ", rows [", h.begin, ", ", h.end, ") of it)"));
}

absl::Status ShmParamStore::NotHosted(int table, uint64_t id, int shard, const char* what) const {
  return absl::InvalidArgumentError(absl::StrCat(what, ": id ", id, " of embedding table '", layout_.tables[table].name,
                                                 "' lives on shard ", shard, ", which is not hosted here (store ", name_,
                                                 " hosts shards ", first_hosted_, "..", first_hosted_ + num_hosted_ - 1,
                                                 " of ", layout_.num_shards, ")"));
}

absl::StatusOr<std::unique_ptr<ShmParamStore>> ShmParamStore::Attach(
    const std::string& name, const OptimizerOptions& optimizer, const std::optional<OptimizerOptions>& sparse_optimizer) {
  std::unique_ptr<ShmParamStore> st(new ShmParamStore());
  st->name_ = name;
  st->optimizer_ = optimizer;
  st->sparse_optimizer_ = sparse_optimizer.value_or(optimizer);
  std::vector<TableEntry> first_tables;
  st->huge_page_settings_ = ReadHugePageSettings();  // for huge_pages(); the creator chose the pages
  uint32_t num_shards = 1, first_hosted = 0, num_hosted = 1;
  std::vector<LayoutEntry> first_entries;
  // k: the segment; s: the global shard it holds.
  for (uint32_t k = 0; k < num_hosted; ++k) {
    const std::string seg_name = SegmentName(name, k);
    SW_ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> seg, ShmSegment::Attach(seg_name));
    auto bad = [&](const std::string& what) {
      return absl::FailedPreconditionError(absl::StrCat("shared memory /", seg_name, ": ", what));
    };
    if (seg->size() < sizeof(ShardHeader)) return bad("too small to hold a shard header");
    const ShardHeader* h = Header(*seg);
    if (h->magic != kShardMagic) return bad(absl::StrFormat("bad magic 0x%016x (not a Shardwild shard)", h->magic));
    if (h->format_version != kShardFormatVersion) {
      return bad(absl::StrCat("format version ", h->format_version, ", this build reads version ", kShardFormatVersion));
    }
    if (h->total_bytes != seg->size()) return bad(absl::StrCat("header says ", h->total_bytes, " bytes, segment has ", seg->size()));
    if (k == 0) {
      num_shards = h->num_shards;
      if (num_shards < 1 || num_shards > 4096) return bad(absl::StrCat("num_shards ", num_shards, " out of range"));
      if (h->num_entries > 100000) return bad("too many variables");
      first_hosted = h->first_hosted_shard;
      num_hosted = h->num_hosted_shards;
      if (num_hosted < 1 || first_hosted >= num_shards || num_hosted > num_shards - first_hosted) {
        return bad(absl::StrCat("hosted shards ", first_hosted, " + ", num_hosted, " are not a block of ", num_shards));
      }
    } else if (h->num_shards != num_shards) {
      return bad(absl::StrCat("num_shards ", h->num_shards, " disagrees with shard 0 (", num_shards, ")"));
    } else if (h->first_hosted_shard != first_hosted || h->num_hosted_shards != num_hosted) {
      return bad(absl::StrCat("hosted shards ", h->first_hosted_shard, " + ", h->num_hosted_shards,
                              " disagree with segment 0's (", first_hosted, " + ", num_hosted, ")"));
    }
    const uint32_t s = first_hosted + k;
    const bool partial = num_hosted != num_shards;
    if (h->shard_index != s) return bad(absl::StrCat("shard_index ", h->shard_index, ", expected ", s));
    if (h->optimizer_type != static_cast<uint32_t>(optimizer.type) || h->num_slots != static_cast<uint32_t>(NumSlots(optimizer.type))) {
      return bad("optimizer type disagrees with this process's optimizer");
    }
    if (h->update_mode > static_cast<uint32_t>(UpdateMode::kSync)) {
      return bad(absl::StrCat("unknown update mode ", h->update_mode));
    }
    if (k == 0) {
      st->update_mode_ = static_cast<UpdateMode>(h->update_mode);
    } else if (h->update_mode != static_cast<uint32_t>(st->update_mode_)) {
      return bad("update mode disagrees with shard 0");
    }
    if (h->sparse_optimizer_type != static_cast<uint32_t>(st->sparse_optimizer_.type)) {
      return bad("sparse optimizer type (the embedding tables') disagrees with this process's sparse optimizer");
    }
    if (h->num_tables > 4096) return bad(absl::StrCat("num_tables ", h->num_tables, " out of range"));
    if (sizeof(ShardHeader) + uint64_t{h->num_entries} * sizeof(LayoutEntry) + uint64_t{h->num_tables} * sizeof(TableEntry) +
                (partial ? uint64_t{h->num_entries} * num_shards * sizeof(GlobalPart) : 0) >
            h->header_bytes ||
        h->header_bytes > seg->size()) {
      return bad("layout table does not fit in the header");
    }
    const LayoutEntry* entries = Entries(*seg);
    if (k == 0) {
      first_entries.assign(entries, entries + h->num_entries);
      for (const LayoutEntry& e : first_entries) {
        if (std::memchr(e.name, 0, sizeof(e.name)) == nullptr) return bad("variable name not terminated");
        if (e.rows < 1 || e.cols < 1) return bad(absl::StrCat("variable '", e.name, "' has a bad shape"));
        st->layout_.variables.push_back(VariableSpec{e.name, e.rows, e.cols});
      }
      st->layout_.num_shards = num_shards;
      st->shard_divisor_ = FixedDivisor(num_shards);
      st->layout_.parts.assign(first_entries.size(), std::vector<RowRange>(num_shards));
      st->layout_.shard_nodes.assign(num_shards, -1);
      if (partial) {
        // The rows of the shards not hosted here, from the global parts table
        // (each range checked; the tiling is checked once all are read).
        const GlobalPart* global = GlobalParts(*seg);
        for (uint32_t v = 0; v < h->num_entries; ++v) {
          for (uint32_t g = 0; g < num_shards; ++g) {
            const GlobalPart& gp = global[uint64_t{v} * num_shards + g];
            if (gp.row_begin < 0 || gp.row_end < gp.row_begin || gp.row_end > first_entries[v].rows) {
              return bad(absl::StrCat("global rows of variable '", first_entries[v].name, "' on shard ", g,
                                      " are not a valid partition"));
            }
            st->layout_.parts[v][g] = {gp.row_begin, gp.row_end};
          }
        }
      }
    } else if (h->num_entries != first_entries.size()) {
      return bad("variable count disagrees with shard 0");
    }
    for (uint32_t v = 0; v < h->num_entries; ++v) {
      const LayoutEntry& e = entries[v];
      const LayoutEntry& f = first_entries[v];
      if (std::strncmp(e.name, f.name, kMaxNameBytes) != 0 || e.rows != f.rows || e.cols != f.cols) {
        return bad(absl::StrCat("variable ", v, " disagrees with shard 0"));
      }
      // Here only the range itself; that the ranges tile the rows is checked
      // once every shard is read (partitions may sit on any shards).
      if (e.row_begin < 0 || e.row_end < e.row_begin || e.row_end > e.rows) {
        return bad(absl::StrCat("rows of variable '", f.name, "' are not a valid partition"));
      }
      // No product or sum here may overflow: a corrupted field must not wrap
      // around the bounds check.
      uint64_t need = 0;
      const bool need_overflows =
          __builtin_mul_overflow(static_cast<uint64_t>(e.row_end - e.row_begin), static_cast<uint64_t>(e.cols), &need) ||
          __builtin_mul_overflow(need, uint64_t{sizeof(float)}, &need);
      if (need_overflows || e.array_bytes < need || e.offset < h->header_bytes || e.offset % 64 != 0 ||
          e.offset > seg->size() || e.array_bytes > (seg->size() - e.offset) / (1 + h->num_slots) ||
          // The row sequence words after the slot arrays (rows * 4 <= need: no overflow).
          SeqBytes(e.row_end - e.row_begin) > seg->size() - e.offset - (1 + h->num_slots) * e.array_bytes) {
        return bad(absl::StrCat("arrays of variable '", f.name, "' lie outside the segment"));
      }
      if (partial && (st->layout_.parts[v][s].begin != e.row_begin || st->layout_.parts[v][s].end != e.row_end)) {
        return bad(absl::StrCat("rows of variable '", f.name, "' disagree with the global parts table"));
      }
      st->layout_.parts[v][s] = {e.row_begin, e.row_end};
    }
    // Embedding tables: the entry must agree with shard 0 and lie inside the
    // segment; the table's own header is then checked by EmbeddingTable.
    const TableEntry* tables = Tables(*seg);
    if (k == 0) {
      first_tables.assign(tables, tables + h->num_tables);
      st->tables_.assign(h->num_tables, {});
    } else if (h->num_tables != first_tables.size()) {
      return bad("embedding table count disagrees with shard 0");
    }
    for (uint32_t t = 0; t < h->num_tables; ++t) {
      const TableEntry& te = tables[t];
      const TableEntry& f = first_tables[t];
      if (std::memchr(te.name, 0, sizeof(te.name)) == nullptr) {
        return bad(absl::StrCat("embedding table ", t, ": name not terminated"));
      }
      if (std::strncmp(te.name, f.name, kMaxNameBytes) != 0 || te.kind != f.kind || te.on_full != f.on_full ||
          te.dim != f.dim || te.capacity != f.capacity) {
        return bad(absl::StrCat("embedding table ", t, " ('", te.name, "') disagrees with shard 0"));
      }
      if (te.kind > static_cast<uint32_t>(EmbeddingKind::kDynamic) ||
          te.on_full > static_cast<uint32_t>(CapacityPolicy::kEvictLru) || te.dim < 1 || te.capacity < 1) {
        return bad(absl::StrCat("embedding table '", te.name, "' has a bad kind, dim or capacity"));
      }
      TableSpec shape;
      shape.kind = static_cast<EmbeddingKind>(te.kind);
      shape.capacity = te.capacity;
      if (te.shard_capacity != ShardCapacity(shape, static_cast<int>(s), static_cast<int>(num_shards))) {
        return bad(absl::StrCat("embedding table '", te.name, "': shard_capacity ", te.shard_capacity,
                                " is not this shard's share of ", te.capacity, " rows"));
      }
      if (te.offset < h->header_bytes || te.offset % 4096 != 0 || te.offset > seg->size() ||
          te.bytes > seg->size() - te.offset) {
        return bad(absl::StrCat("embedding table '", te.name, "' lies outside the segment"));
      }
      absl::StatusOr<EmbeddingTable> table = EmbeddingTable::Attach(static_cast<char*>(seg->data()) + te.offset, te.bytes);
      if (!table.ok()) return bad(absl::StrCat("embedding table '", te.name, "': ", table.status().message()));
      if (table->kind() != static_cast<EmbeddingKind>(te.kind) || table->dim() != te.dim ||
          table->capacity() != te.shard_capacity) {
        return bad(absl::StrCat("embedding table '", te.name, "': its header disagrees with the layout table"));
      }
      if (table->options().row_lock != (st->update_mode_ == UpdateMode::kRowLock)) {
        return bad(absl::StrCat("embedding table '", te.name, "': its rows are ",
                                table->options().row_lock ? "" : "not ", "locked per row, but the store's update mode is ",
                                UpdateModeName(st->update_mode_)));
      }
      if (table->num_slots() < NumSlots(st->sparse_optimizer_.type)) {
        return bad(absl::StrCat("embedding table '", te.name, "' has ", table->num_slots(),
                                " slots per row, the sparse optimizer needs ", NumSlots(st->sparse_optimizer_.type)));
      }
      if (k > 0 && table->bf16() != st->tables_[t][0].bf16()) {
        return bad(absl::StrCat("embedding table '", te.name, "': its shards disagree on bf16 parameters"));
      }
      if (k == 0) {
        TableSpec spec;
        spec.name = te.name;
        spec.kind = static_cast<EmbeddingKind>(te.kind);
        spec.dim = te.dim;
        spec.capacity = te.capacity;
        spec.on_full = static_cast<CapacityPolicy>(te.on_full);
        spec.init = table->options().init;
        spec.bf16 = table->options().bf16;
        st->layout_.tables.push_back(spec);
      }
      st->tables_[t].push_back(*table);
    }
    st->segments_.push_back(std::move(seg));
  }
  // The non-empty ranges of each variable, sorted by row, must tile [0, rows)
  // exactly (no gap, no overlap); the first shard that breaks this is named.
  for (size_t v = 0; v < st->layout_.variables.size(); ++v) {
    const std::vector<RowRange>& parts = st->layout_.parts[v];
    std::vector<uint32_t> holders;  // shards with rows of v, in row order
    for (uint32_t s = 0; s < num_shards; ++s) {
      if (parts[s].size() > 0) holders.push_back(s);
    }
    std::sort(holders.begin(), holders.end(), [&](uint32_t a, uint32_t b) { return parts[a].begin < parts[b].begin; });
    int64_t next = 0;
    uint32_t culprit = num_shards;
    for (uint32_t s : holders) {
      if (parts[s].begin != next) {
        culprit = s;
        break;
      }
      next = parts[s].end;
    }
    if (culprit == num_shards && next != st->layout_.variables[v].rows) culprit = holders.empty() ? 0 : holders.back();
    if (culprit != num_shards) {
      // A shard not hosted here is described by segment 0's global parts table.
      const uint32_t seg = culprit >= first_hosted && culprit < first_hosted + num_hosted ? culprit - first_hosted : 0;
      return absl::FailedPreconditionError(absl::StrCat("shared memory /", SegmentName(name, seg), ": rows of variable '",
                                                        st->layout_.variables[v].name, "' are not a valid partition"));
    }
  }
  // Every region must sit exactly where Create puts it (the header, each
  // variable's arrays and row sequence words, then each table 4096-aligned,
  // then the end of the segment). Bounds alone are not enough: arrays that
  // overlap another variable's or a table's memory (or a table dropped from
  // num_tables) would make row_lock readers spin forever on "sequence words"
  // that are really parameters, and pushes corrupt each other.
  for (uint32_t k = 0; k < num_hosted; ++k) {
    const ShmSegment& seg = *st->segments_[k];
    const ShardHeader* h = Header(seg);
    auto bad = [&](const std::string& what) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared memory /", seg.name(), ": ", what, " (not the layout this build writes)"));
    };
    const uint64_t header_bytes = HeaderBytes(h->num_entries, h->num_tables, num_shards, num_hosted != num_shards);
    if (h->header_bytes != header_bytes) return bad(absl::StrCat("header_bytes ", h->header_bytes, ", expected ", header_bytes));
    uint64_t cursor = header_bytes;
    const LayoutEntry* entries = Entries(seg);
    for (uint32_t v = 0; v < h->num_entries; ++v) {
      const LayoutEntry& e = entries[v];
      // Bounded by the checks above: (row_end - row_begin) * cols * 4 fits.
      const uint64_t array_bytes = AlignUp(static_cast<uint64_t>(e.row_end - e.row_begin) * e.cols * sizeof(float), 64);
      if (e.offset != cursor || e.array_bytes != array_bytes) {
        return bad(absl::StrCat("variable '", e.name, "' has offset ", e.offset, " and array_bytes ", e.array_bytes,
                                ", expected ", cursor, " and ", array_bytes));
      }
      cursor += array_bytes * (1 + h->num_slots) + SeqBytes(e.row_end - e.row_begin);
    }
    const TableEntry* tables = Tables(seg);
    for (uint32_t t = 0; t < h->num_tables; ++t) {
      cursor = AlignUp(cursor, 4096);
      if (tables[t].offset != cursor) {
        return bad(absl::StrCat("embedding table '", tables[t].name, "' has offset ", tables[t].offset, ", expected ", cursor));
      }
      cursor += tables[t].bytes;
    }
    const uint64_t total = AlignUp(std::max<uint64_t>(cursor, header_bytes), 4096);
    if (h->total_bytes != total) return bad(absl::StrCat("total_bytes ", h->total_bytes, ", the regions need ", total));
  }
  st->first_hosted_ = static_cast<int>(first_hosted);
  st->num_hosted_ = static_cast<int>(num_hosted);
  SW_RETURN_IF_ERROR(st->ComputeHostedRows());
  SW_RETURN_IF_ERROR(st->BuildParts());
  return st;
}

ShmParamStore::~ShmParamStore() = default;

absl::Status ShmParamStore::Pull(absl::Span<const PullSlice> slices) {
  for (const PullSlice& sl : slices) {
    if (sl.var < 0 || sl.var >= static_cast<int>(parts_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("pull: no variable ", sl.var));
    }
    const VariableSpec& spec = layout_.variables[sl.var];
    if (sl.row_begin < 0 || sl.row_end > spec.rows || sl.row_begin > sl.row_end) {
      return absl::InvalidArgumentError(absl::StrCat("pull: rows [", sl.row_begin, ", ", sl.row_end, ") out of range for '",
                                                     spec.name, "' with ", spec.rows, " rows"));
    }
    SW_RETURN_IF_ERROR(CheckHosted(sl.var, sl.row_begin, sl.row_end, "pull"));
    if (sl.row_begin < sl.row_end && (sl.out == nullptr) == (sl.out_bf16 == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("pull: '", spec.name, "' needs exactly one of out and out_bf16"));
    }
    for (const Part& p : parts_[sl.var]) {
      const int64_t b = std::max(p.row_begin, sl.row_begin), e = std::min(p.row_end, sl.row_end);
      if (b >= e) continue;
      const float* src = p.params + (b - p.row_begin) * spec.cols;
      float* dst = sl.out != nullptr ? sl.out + (b - sl.row_begin) * spec.cols : nullptr;
      uint16_t* dst16 = sl.out != nullptr ? nullptr : sl.out_bf16 + (b - sl.row_begin) * spec.cols;
      auto copy = [&](int64_t at, int64_t n) {
        if (dst != nullptr) {
          HogwildCopyFrom(src + at, dst + at, n);
        } else {
          HogwildCopyFromAsBf16(src + at, dst16 + at, n);
        }
      };
      if (update_mode_ == UpdateMode::kRowLock) {
        // Row by row under each row's seqlock (see LockRow above).
        const int64_t cols = spec.cols;
        for (int64_t r = 0; r < e - b; ++r) {
          ReadRowConsistent(p.row_seq + (b - p.row_begin) + r, [&] { copy(r * cols, cols); });
        }
        continue;
      }
      copy(0, (e - b) * spec.cols);
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::ReadRows(int var, int64_t row_begin, int64_t row_end, float* params,
                                     absl::Span<float* const> slots) const {
  if (var < 0 || var >= static_cast<int>(parts_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("read rows: no variable ", var));
  }
  const VariableSpec& spec = layout_.variables[var];
  if (row_begin < 0 || row_end > spec.rows || row_begin > row_end) {
    return absl::InvalidArgumentError(absl::StrCat("read rows: rows [", row_begin, ", ", row_end, ") out of range for '",
                                                   spec.name, "' with ", spec.rows, " rows"));
  }
  SW_RETURN_IF_ERROR(CheckHosted(var, row_begin, row_end, "read rows"));
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("read rows: ", slots.size(), " slot buffers, the optimizer has ",
                                                   num_slots_, " slots"));
  }
  const int64_t cols = spec.cols;
  for (const Part& p : parts_[var]) {
    const int64_t b = std::max(p.row_begin, row_begin), e = std::min(p.row_end, row_end);
    for (int64_t row = b; row < e; ++row) {
      const int64_t src_off = (row - p.row_begin) * cols;
      const int64_t dst_off = (row - row_begin) * cols;
      auto copy = [&] {
        HogwildCopyFrom(p.params + src_off, params + dst_off, cols);
        for (size_t k = 0; k < slots.size(); ++k) {
          if (slots[k] != nullptr) HogwildCopyFrom(p.slots[k] + src_off, slots[k] + dst_off, cols);
        }
      };
      if (update_mode_ == UpdateMode::kRowLock) {
        ReadRowConsistent(p.row_seq + (row - p.row_begin), copy);
      } else {
        copy();
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::WriteRows(int var, int64_t row_begin, int64_t row_end, const float* params,
                                      absl::Span<const float* const> slots) {
  if (var < 0 || var >= static_cast<int>(parts_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("write rows: no variable ", var));
  }
  const VariableSpec& spec = layout_.variables[var];
  if (row_begin < 0 || row_end > spec.rows || row_begin > row_end) {
    return absl::InvalidArgumentError(absl::StrCat("write rows: rows [", row_begin, ", ", row_end,
                                                   ") out of range for '", spec.name, "' with ", spec.rows, " rows"));
  }
  SW_RETURN_IF_ERROR(CheckHosted(var, row_begin, row_end, "write rows"));
  if (static_cast<int>(slots.size()) > num_slots_) {
    return absl::InvalidArgumentError(absl::StrCat("write rows: ", slots.size(), " slot buffers, the optimizer has ",
                                                   num_slots_, " slots"));
  }
  if (params == nullptr) return absl::InvalidArgumentError("write rows: params is null");
  const int64_t cols = spec.cols;
  auto store = [](const float* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) std::atomic_ref<float>(dst[i]).store(src[i], std::memory_order_relaxed);
  };
  for (const Part& p : parts_[var]) {
    const int64_t b = std::max(p.row_begin, row_begin), e = std::min(p.row_end, row_end);
    for (int64_t row = b; row < e; ++row) {
      const int64_t dst_off = (row - p.row_begin) * cols;
      const int64_t src_off = (row - row_begin) * cols;
      const uint32_t odd = update_mode_ == UpdateMode::kRowLock ? LockRow(p.row_seq + (row - p.row_begin)) : 0;
      store(params + src_off, p.params + dst_off, cols);
      for (size_t k = 0; k < slots.size(); ++k) {
        if (slots[k] != nullptr) store(slots[k] + src_off, p.slots[k] + dst_off, cols);
      }
      if (update_mode_ == UpdateMode::kRowLock) UnlockRow(p.row_seq + (row - p.row_begin), odd);
    }
  }
  return absl::OkStatus();
}

uint64_t ShmParamStore::update_count(int var) const {
  uint64_t n = 0;
  for (const Part& p : parts_[var]) {
    if (p.row_end > p.row_begin) n = std::max(n, LoadRelaxed(p.update_count));
  }
  return n;
}

void ShmParamStore::SetUpdateCount(int var, uint64_t count) {
  for (const Part& p : parts_[var]) {
    if (p.update_count != nullptr) std::atomic_ref<uint64_t>(*p.update_count).store(count, std::memory_order_relaxed);
  }
}

void ShmParamStore::SetVersion(uint64_t version) {
  for (uint64_t* v : shard_versions_) std::atomic_ref<uint64_t>(*v).store(version, std::memory_order_relaxed);
}

absl::Status ShmParamStore::VisitTableRows(int table, const TableRowVisitor& visit) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("visit table rows: no embedding table ", table));
  }
  const int nslots = NumSlots(sparse_optimizer_.type);
  const size_t dim = static_cast<size_t>(layout_.tables[table].dim);
  const TableRowParts all{.ids = true, .update_counts = true, .params = true, .slots = (uint32_t{1} << nslots) - 1};
  std::array<const float*, kMaxEmbeddingSlots> row_slots{};
  return VisitTableRowBlocks(table, all, [&](const TableRowBlock& b) -> absl::Status {
    for (int64_t i = 0; i < b.rows; ++i) {
      const size_t at = static_cast<size_t>(i) * dim;
      for (int k = 0; k < nslots; ++k) row_slots[k] = b.slots[k] + at;
      SW_RETURN_IF_ERROR(visit(b.ids[i], b.params + at, absl::MakeConstSpan(row_slots.data(), nslots), b.update_counts[i]));
    }
    return absl::OkStatus();
  });
}

absl::Status ShmParamStore::VisitTableRowBlocks(int table, const TableRowParts& parts,
                                                const TableRowBlockVisitor& visit) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("visit table rows: no embedding table ", table));
  }
  const TableSpec& spec = layout_.tables[table];
  const int nslots = NumSlots(sparse_optimizer_.type);
  if ((parts.slots >> nslots) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("visit table rows: slots ", parts.slots, " asked for, the ",
                                                   OptimizerTypeName(sparse_optimizer_.type), " optimizer has ",
                                                   nslots));
  }
  const uint64_t nshards = static_cast<uint64_t>(layout_.num_shards);
  const int64_t block_rows = TableRowBlockRows(spec.dim);
  const size_t rows = static_cast<size_t>(block_rows), dim = static_cast<size_t>(spec.dim);
  std::vector<uint64_t> ids(parts.ids ? rows : 0), counts(parts.update_counts ? rows : 0);
  std::vector<float> params(parts.params ? rows * dim : 0);
  std::array<std::vector<float>, kMaxEmbeddingSlots> slot_bufs;
  std::array<float*, kMaxEmbeddingSlots> slots_out{};
  TableRowBlock block;
  block.ids = parts.ids ? ids.data() : nullptr;
  block.update_counts = parts.update_counts ? counts.data() : nullptr;
  block.params = parts.params ? params.data() : nullptr;
  for (int k = 0; k < nslots; ++k) {
    if (((parts.slots >> k) & 1) == 0) continue;
    slot_bufs[k].resize(rows * dim);
    slots_out[k] = slot_bufs[k].data();
    block.slots[k] = slots_out[k];
  }
  for (uint64_t s = first_hosted_; s < static_cast<uint64_t>(first_hosted_ + num_hosted_); ++s) {
    EmbeddingTable& part = tables_[table][s - first_hosted_];
    const int64_t n = part.size();
    for (int64_t b = 0; b < n; b += block_rows) {
      const int64_t e = std::min(n, b + block_rows);
      SW_ASSIGN_OR_RETURN(const int64_t used,
                          part.ReadRowsAt(b, e, parts.ids ? ids.data() : nullptr,
                                          parts.params ? params.data() : nullptr,
                                          absl::MakeSpan(slots_out.data(), static_cast<size_t>(nslots)),
                                          parts.update_counts ? counts.data() : nullptr));
      if (used == 0) continue;
      // Static rows are striped: local row r of shard s is global id r * S + s.
      if (parts.ids && spec.kind == EmbeddingKind::kStatic && nshards > 1) {
        for (int64_t i = 0; i < used; ++i) ids[i] = ids[i] * nshards + s;
      }
      block.rows = used;
      SW_RETURN_IF_ERROR(visit(block));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::WriteTableRow(int table, uint64_t id, const float* params,
                                          absl::Span<const float* const> slots, uint64_t update_count) {
  SW_ASSIGN_OR_RETURN(RowHome home, HomeOf(table, id, "write table row"));
  return home.table->WriteRowState(home.local_id, params, slots, update_count);
}

absl::Status ShmParamStore::WriteTableRows(int table, absl::Span<const uint64_t> ids, const float* params,
                                           absl::Span<const float* const> slots, const uint64_t* update_counts) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("write table rows: no embedding table ", table));
  }
  if (slots.size() > static_cast<size_t>(kMaxEmbeddingSlots)) {
    return absl::InvalidArgumentError(absl::StrCat("write table rows: ", slots.size(), " slots, at most ",
                                                   kMaxEmbeddingSlots));
  }
  const TableSpec& spec = layout_.tables[table];
  const size_t dim = static_cast<size_t>(spec.dim);
  // A static id s + k * S lives at row k of shard s: a run of ids S apart
  // is a run of rows of one shard.
  const bool runs = spec.kind == EmbeddingKind::kStatic;
  const auto step = static_cast<uint64_t>(layout_.num_shards);
  std::array<const float*, kMaxEmbeddingSlots> run_slots{};
  for (size_t i = 0; i < ids.size();) {
    SW_ASSIGN_OR_RETURN(const RowHome home, HomeOf(table, ids[i], "write table rows"));
    size_t n = 1;
    if (runs) {
      // Each id of the run is below the capacity (HomeOf checked the
      // first), so adding the step does not wrap.
      const auto capacity = static_cast<uint64_t>(spec.capacity);
      while (i + n < ids.size() && ids[i + n] == ids[i + n - 1] + step && ids[i + n] < capacity) ++n;
    }
    for (size_t k = 0; k < slots.size(); ++k) run_slots[k] = slots[k] != nullptr ? slots[k] + i * dim : nullptr;
    const absl::Status s =
        home.table->WriteRowStates(home.local_id, static_cast<int64_t>(n), params + i * dim,
                                   absl::MakeConstSpan(run_slots.data(), slots.size()),
                                   update_counts != nullptr ? update_counts + i : nullptr);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("id ", ids[i], ": ", s.message()));
    i += n;
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::Push(absl::Span<const DenseGrad> grads, float lr) { return PushImpl(grads, lr, false); }

absl::Status ShmParamStore::PushHosted(absl::Span<const DenseGrad> grads, float lr) {
  return PushImpl(grads, lr, true);
}

absl::Status ShmParamStore::PushPull(absl::Span<const DenseGrad> grads, float lr,
                                     absl::Span<const PullSlice> pulls) {
  // Which slices the update writes (a fixed-size mask: no allocation). More
  // than 64 slices, or a row_lock store, go the plain way.
  uint64_t fused = 0;
  if (update_mode_ != UpdateMode::kRowLock && pulls.size() <= 64) {
    for (size_t i = 0; i < pulls.size(); ++i) {
      const PullSlice& sl = pulls[i];
      if (sl.var < 0 || sl.var >= static_cast<int>(parts_.size()) || (sl.out == nullptr) == (sl.out_bf16 == nullptr)) {
        continue;
      }
      const int64_t rows = layout_.variables[sl.var].rows;
      const RowRange hosted = hosted_rows_[sl.var];
      if (sl.row_begin != 0 || sl.row_end != rows || hosted.begin != 0 || hosted.end != rows) continue;
      // Fused only if the variable is pushed exactly once.
      int pushed = 0;
      for (const DenseGrad& g : grads) pushed += g.var == sl.var;
      if (pushed != 1) continue;
      bool first = true;  // one slice per variable
      for (size_t j = 0; j < i; ++j) first = first && !((fused >> j) & 1 && pulls[j].var == sl.var);
      if (first) fused |= uint64_t{1} << i;
    }
  }
  SW_RETURN_IF_ERROR(PushImpl(grads, lr, /*from_hosted=*/false, pulls, fused));
  for (size_t i = 0; i < pulls.size(); ++i) {
    if (!((fused >> i) & 1)) SW_RETURN_IF_ERROR(Pull(pulls.subspan(i, 1)));
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::PushImpl(absl::Span<const DenseGrad> grads, float lr, bool from_hosted,
                                     absl::Span<const PullSlice> pulls, uint64_t fused) {
  const int nshards = layout_.num_shards;
  // Which shards this push touched (a fixed-size mask keeps the hot path free of allocation).
  uint64_t touched_small = 0;
  bool touched_all = false;
  for (const DenseGrad& g : grads) {
    if (g.var < 0 || g.var >= static_cast<int>(parts_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("push: no variable ", g.var));
    }
    const int64_t cols = layout_.variables[g.var].cols;
    // The row g.grad starts at: 0, or the first hosted row (PushHosted).
    const int64_t base = from_hosted ? hosted_rows_[g.var].begin : 0;
    // The fused pull's destination for this variable, if any (PushPull).
    float* copy = nullptr;
    uint16_t* copy16 = nullptr;
    for (size_t i = 0; i < pulls.size(); ++i) {
      if ((fused >> i) & 1 && pulls[i].var == g.var) {
        copy = pulls[i].out;
        copy16 = pulls[i].out_bf16;
      }
    }
    for (int s = 0; s < nshards; ++s) {
      const Part& p = parts_[g.var][s];
      if (p.row_end == p.row_begin) continue;
      const uint64_t t = std::atomic_ref<uint64_t>(*p.update_count).fetch_add(1, std::memory_order_relaxed) + 1;
      const UpdateParams up{lr, static_cast<int64_t>(t)};
      if (update_mode_ == UpdateMode::kRowLock) {
        // Each row's params and slots change together under its seqlock.
        float* row_slots[4] = {};
        for (int64_t r = 0; r < p.row_end - p.row_begin; ++r) {
          for (int k = 0; k < num_slots_; ++k) row_slots[k] = p.slots[k] + r * cols;
          const uint32_t odd = LockRow(p.row_seq + r);
          ApplyUpdate(optimizer_, up, p.params + r * cols, row_slots, g.grad + (p.row_begin - base + r) * cols, cols);
          UnlockRow(p.row_seq + r, odd);
        }
      } else {
        // Chunk by chunk, leaving a chunk another push is in for later
        // (push_chunks.h): the optimizers are element-wise, so the chunks'
        // updates are the whole part's, bit for bit.
        const float* grad = g.grad + (p.row_begin - base) * cols;
        float* part_copy = copy != nullptr ? copy + p.row_begin * cols : nullptr;
        uint16_t* part_copy16 = copy16 != nullptr ? copy16 + p.row_begin * cols : nullptr;
        p.chunks->ForEach([&](int64_t b, int64_t e) {
          float* slots[4];
          for (int k = 0; k < 4; ++k) slots[k] = p.slots[k] != nullptr ? p.slots[k] + b : nullptr;
          ApplyUpdate(optimizer_, up, p.params + b, slots, grad + b, e - b,
                      part_copy != nullptr ? part_copy + b : nullptr,
                      part_copy16 != nullptr ? part_copy16 + b : nullptr);
        });
      }
      const int k = s - first_hosted_;  // hosted: parts of other shards have no rows
      if (k < 64) touched_small |= uint64_t{1} << k; else touched_all = true;
    }
  }
  for (int k = 0; k < num_hosted_; ++k) {
    if (touched_all || (k < 64 && (touched_small >> k) & 1)) {
      std::atomic_ref<uint64_t>(*shard_versions_[k]).fetch_add(1, std::memory_order_relaxed);
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::AverageParams(absl::Span<ShmParamStore* const> replicas) {
  if (replicas.empty()) return absl::InvalidArgumentError("average: no stores");
  const ShmParamStore& first = *replicas[0];
  const int nvars = static_cast<int>(first.parts_.size());
  // Same variables, same row ranges on the same shards, same update mode.
  for (const ShmParamStore* r : replicas) {
    bool same = r->update_mode_ == first.update_mode_ && r->parts_.size() == first.parts_.size() &&
                r->layout_.num_shards == first.layout_.num_shards && r->first_hosted_ == first.first_hosted_ &&
                r->num_hosted_ == first.num_hosted_;
    for (int v = 0; same && v < nvars; ++v) {
      const VariableSpec& a = r->layout_.variables[v];
      const VariableSpec& b = first.layout_.variables[v];
      same = a.rows == b.rows && a.cols == b.cols;
      for (int s = 0; same && s < first.layout_.num_shards; ++s) {
        same = r->parts_[v][s].row_begin == first.parts_[v][s].row_begin &&
               r->parts_[v][s].row_end == first.parts_[v][s].row_end;
      }
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat("average: store ", r->name_, " does not have the layout of ",
                                                     first.name_));
    }
    if (std::count(replicas.begin(), replicas.end(), r) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("average: store ", r->name_, " is given more than once"));
    }
  }
  const size_t nrep = replicas.size();
  const float inv = 1.0f / static_cast<float>(nrep);
  // Averages element i .. i + n of part (v, s) across the replicas.
  auto average = [&](int v, int s, int64_t offset, int64_t n) {
    for (int64_t i = offset; i < offset + n; ++i) {
      float sum = 0.0f;
      for (ShmParamStore* r : replicas) {
        sum += std::atomic_ref<float>(r->parts_[v][s].params[i]).load(std::memory_order_relaxed);
      }
      const float mean = sum * inv;
      for (ShmParamStore* r : replicas) {
        std::atomic_ref<float>(r->parts_[v][s].params[i]).store(mean, std::memory_order_relaxed);
      }
    }
  };
  for (int v = 0; v < nvars; ++v) {
    const int64_t cols = first.layout_.variables[v].cols;
    for (int s = 0; s < first.layout_.num_shards; ++s) {
      const Part& p = first.parts_[v][s];
      const int64_t rows = p.row_end - p.row_begin;
      if (rows == 0) continue;
      if (first.update_mode_ != UpdateMode::kRowLock) {
        average(v, s, 0, rows * cols);
        continue;
      }
      for (int64_t row = 0; row < rows; ++row) {
        // Lock the row in every replica, in the order given: pushes hold one
        // row lock at a time and averagings take them in the same order, so
        // no cycle can form.
        for (ShmParamStore* r : replicas) LockRow(r->parts_[v][s].row_seq + row);
        average(v, s, row * cols, cols);
        for (size_t k = nrep; k-- > 0;) {
          // This thread holds the lock: the odd value it stored is still there.
          uint32_t* seq = replicas[k]->parts_[v][s].row_seq + row;
          UnlockRow(seq, std::atomic_ref<uint32_t>(*seq).load(std::memory_order_relaxed));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::GroupIds(int table, absl::Span<const uint64_t> ids, RowScratch* scratch) const {
  const TableSpec& spec = layout_.tables[table];
  const uint32_t nshards = static_cast<uint32_t>(layout_.num_shards);
  const bool is_static = spec.kind == EmbeddingKind::kStatic;
  const FixedDivisor& divisor = shard_divisor_;  // static ids: checked below capacity first, < 2^52
  const uint64_t capacity = static_cast<uint64_t>(spec.capacity);
  const size_t n = ids.size();
  // Counting sort, stable, so each shard sees its ids in batch order (the
  // order repeated ids' gradients are summed in). offsets[s + 1] counts, then
  // holds the start of shard s, then (after placing) its end.
  scratch->offsets.assign(nshards + 2, 0);
  scratch->ids.resize(n);
  scratch->positions.resize(n);
  // The loops read the store's fields and the scratch's buffers from
  // locals: through `this` and `scratch` they were loaded again after every
  // store to the counts, which the compiler cannot tell apart from them.
  uint32_t* const counts = scratch->offsets.data();
  uint64_t* const grouped = scratch->ids.data();
  uint32_t* const positions = scratch->positions.data();
  const uint32_t first = static_cast<uint32_t>(first_hosted_);
  const uint32_t hosted = static_cast<uint32_t>(num_hosted_);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    if (is_static && id >= capacity) {
      return StaticIdOutOfRange(spec, id);
    }
    if (!is_static && id == EmbeddingTable::kReservedId) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding table '", spec.name, "': id 2^64-1 is reserved in dynamic tables"));
    }
    const uint32_t shard =
        is_static ? static_cast<uint32_t>(divisor.Remainder(id, divisor.Quotient(id))) : ShardOfDynamicId(id, nshards);
    // hosts(shard), as one unsigned comparison.
    if (shard - first >= hosted) return NotHosted(table, id, static_cast<int>(shard), "rows");
    ++counts[shard + 2];
  }
  for (uint32_t s = 2; s < nshards + 2; ++s) counts[s] += counts[s - 1];
  if (is_static && nshards == 2) {
    // Two shards (two NUMA nodes): the two write cursors in registers. In
    // memory, each id's cursor is the one the id before it stored, half the
    // time (a store-to-load chain of a few cycles an id). 6 alternating
    // rounds of sparse_logreg with 2 shards against the loop below: push
    // rows 15.57 -> 14.31 us a step (6 of 6), the step lower in 5 of 6.
    // The shard and local row are FixedDivisor's for 2 written as bits:
    // through divisor_ (its test of the shift an id) push rows read 13.69
    // -> 13.99 us (3 of 3 rounds). The 2-shard RowAddresses test checks the
    // two agree (addresses against the rows PullRows groups here).
    uint32_t at[2] = {counts[1], counts[2]};
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = ids[i];
      const uint32_t shard = static_cast<uint32_t>(id & 1);
      const uint32_t to = shard == 0 ? at[0] : at[1];
      at[0] += 1 - shard;
      at[1] += shard;
      grouped[to] = id >> 1;
      positions[to] = static_cast<uint32_t>(i);
    }
    counts[1] = at[0];
    counts[2] = at[1];
    return absl::OkStatus();
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t id = ids[i];
    const uint64_t local = is_static ? divisor.Quotient(id) : id;
    const uint32_t shard =
        is_static ? static_cast<uint32_t>(divisor.Remainder(id, local)) : ShardOfDynamicId(id, nshards);
    const uint32_t at = counts[shard + 1]++;
    grouped[at] = local;
    positions[at] = static_cast<uint32_t>(i);
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::PullRows(int table, absl::Span<const uint64_t> ids, float* out, PullMode mode,
                                     RowScratch* scratch) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("pull rows: no embedding table ", table));
  }
  if (ids.empty()) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("pull rows: out is null");
  if (ids.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("pull rows: more than 2^32-1 ids in one call");
  }
  const int nshards = layout_.num_shards;
  // One shard holds every row under its own id (static: id / 1).
  if (nshards == 1) return tables_[table][0].Pull(ids, out, mode);
  const TableSpec& spec = layout_.tables[table];
  const size_t dim = static_cast<size_t>(spec.dim);
  if (scratch == nullptr) {
    // Validate every id first (nothing is copied on error), then read one by one.
    for (uint64_t id : ids) {
      if (spec.kind == EmbeddingKind::kStatic && id >= static_cast<uint64_t>(spec.capacity)) {
        return StaticIdOutOfRange(spec, id);
      }
      if (spec.kind == EmbeddingKind::kDynamic && id == EmbeddingTable::kReservedId) {
        return absl::InvalidArgumentError(
            absl::StrCat("embedding table '", spec.name, "': id 2^64-1 is reserved in dynamic tables"));
      }
      const int shard = ShardOfRowId(spec.kind, id, static_cast<uint32_t>(nshards));
      if (!hosts(shard)) return NotHosted(table, id, shard, "pull rows");
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t id = ids[i];
      const bool is_static = spec.kind == EmbeddingKind::kStatic;
      const int shard = ShardOfRowId(spec.kind, id, static_cast<uint32_t>(nshards));
      const uint64_t local = is_static ? id / nshards : id;
      SW_RETURN_IF_ERROR(tables_[table][shard - first_hosted_].Pull({&local, 1}, out + i * dim, mode));
    }
    return absl::OkStatus();
  }
  SW_RETURN_IF_ERROR(GroupIds(table, ids, scratch));
  const size_t n = ids.size();
  if (scratch->values.size() < n * dim) scratch->values.resize(n * dim);
  for (int s = first_hosted_; s < first_hosted_ + num_hosted_; ++s) {  // GroupIds: no id of another shard
    const uint32_t begin = scratch->offsets[s], end = scratch->offsets[s + 1];
    if (begin == end) continue;
    SW_RETURN_IF_ERROR(tables_[table][s - first_hosted_].Pull({scratch->ids.data() + begin, end - begin},
                                              scratch->values.data() + begin * dim, mode));
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out + scratch->positions[i] * dim, scratch->values.data() + i * dim, dim * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status ShmParamStore::PushRows(int table, absl::Span<const uint64_t> ids, const float* grads, float lr,
                                     RowScratch* scratch) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("push rows: no embedding table ", table));
  }
  if (ids.empty()) return absl::OkStatus();
  if (grads == nullptr || scratch == nullptr) {
    return absl::InvalidArgumentError("push rows: grads and scratch must not be null");
  }
  if (ids.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("push rows: more than 2^32-1 ids in one call");
  }
  const int nshards = layout_.num_shards;
  if (nshards == 1) return tables_[table][0].Push(ids, grads, sparse_optimizer_, lr, &scratch->table);
  SW_RETURN_IF_ERROR(GroupIds(table, ids, scratch));
  // Each shard's ids with their rows of `grads`: the gradients are read in
  // place, never copied.
  for (int s = first_hosted_; s < first_hosted_ + num_hosted_; ++s) {  // GroupIds: no id of another shard
    const uint32_t begin = scratch->offsets[s], end = scratch->offsets[s + 1];
    if (begin == end) continue;
    SW_RETURN_IF_ERROR(tables_[table][s - first_hosted_].Push({scratch->ids.data() + begin, end - begin}, grads,
                                              {scratch->positions.data() + begin, end - begin}, sparse_optimizer_,
                                              lr, &scratch->table));
  }
  return absl::OkStatus();
}

absl::StatusOr<RowsInPlace> ShmParamStore::RowAddresses(int table, absl::Span<const uint64_t> ids, float** out) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("row addresses: no embedding table ", table));
  }
  const TableSpec& spec = layout_.tables[table];
  const int nshards = layout_.num_shards;
  if (spec.kind != EmbeddingKind::kStatic || update_mode_ != UpdateMode::kHogwild || num_hosted_ != nshards) {
    return RowsInPlace::kNo;
  }
  for (const EmbeddingTable& shard : tables_[table]) {
    if (shard.row_lock()) return RowsInPlace::kNo;
  }
  auto out_of_range = [&]() -> absl::Status {
    for (uint64_t id : ids) {
      if (id >= static_cast<uint64_t>(spec.capacity)) return StaticIdOutOfRange(spec, id);
    }
    return absl::OkStatus();
  };
  // The ids are checked without a branch (EmbeddingTable::PastLastBits),
  // and only a batch that fails is searched for its first bad id. The
  // capacity is at most 2^52 (2^40 rows a shard).
  const uint64_t last = static_cast<uint64_t>(spec.capacity) - 1;
  const std::vector<EmbeddingTable>& shards = tables_[table];
  if (nshards == 1) {
    // The check and the addresses in one pass, computed as integers: a bad
    // id's address is never formed as a pointer past the rows, nor used
    // (sparse_logreg's 1,150 ids a step: two passes, the first with a
    // branch an id, were 2% of a bench run's samples).
    const uintptr_t base = reinterpret_cast<uintptr_t>(shards[0].StaticRowParams(0));
    const uintptr_t stride = shards[0].row_stride();
    uint64_t bad = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t id = ids[i];
      bad |= EmbeddingTable::PastLastBits(id, last);
      out[i] = reinterpret_cast<float*>(base + id * stride);
    }
    if ((bad >> 63) != 0) return out_of_range();
  } else {
    uint64_t bad = 0;
    for (uint64_t id : ids) bad |= EmbeddingTable::PastLastBits(id, last);
    if ((bad >> 63) != 0) return out_of_range();
    // (Every id checked below capacity above, so below 2^52.)
    const FixedDivisor& divisor = shard_divisor_;
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint64_t local = divisor.Quotient(ids[i]);
      out[i] = shards[divisor.Remainder(ids[i], local)].StaticRowParams(local);
    }
  }
  return sparse_optimizer_.type == OptimizerType::kSgd ? RowsInPlace::kReadAndSgd : RowsInPlace::kRead;
}

absl::Status ShmParamStore::ReadTableRow(int table, uint64_t id, float* params, absl::Span<float* const> slots,
                                         uint64_t* update_count) {
  SW_ASSIGN_OR_RETURN(RowHome home, HomeOf(table, id, "read table row"));
  return home.table->ReadRowState(home.local_id, params, slots, update_count);
}

absl::StatusOr<ShmParamStore::RowHome> ShmParamStore::HomeOf(int table, uint64_t id, const char* what) {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no embedding table ", table));
  }
  const TableSpec& spec = layout_.tables[table];
  const uint32_t nshards = static_cast<uint32_t>(layout_.num_shards);
  if (spec.kind == EmbeddingKind::kStatic) {
    if (id >= static_cast<uint64_t>(spec.capacity)) {
      return StaticIdOutOfRange(spec, id);
    }
    const int shard = static_cast<int>(id % nshards);
    if (!hosts(shard)) return NotHosted(table, id, shard, what);
    return RowHome{&tables_[table][shard - first_hosted_], id / nshards};
  }
  const int shard = nshards == 1 ? 0 : ShardOfDynamicId(id, nshards);
  if (!hosts(shard)) return NotHosted(table, id, shard, what);
  return RowHome{&tables_[table][shard - first_hosted_], id};
}

uint64_t ShmParamStore::shard_version(int shard) const { return LoadRelaxed(shard_versions_[shard - first_hosted_]); }

uint64_t ShmParamStore::version() const {
  uint64_t v = 0;
  for (uint64_t* p : shard_versions_) v = std::max(v, LoadRelaxed(p));
  return v;
}

uint64_t ShmParamStore::total_bytes() const {
  uint64_t n = 0;
  for (const auto& seg : segments_) n += seg->size();
  return n;
}

ShmParamStore::Memory ShmParamStore::memory() const {
  Memory m;
  // The rows held here (all of them in a full store).
  for (size_t v = 0; v < layout_.variables.size(); ++v) {
    m.params += static_cast<uint64_t>(hosted_rows_[v].size() * layout_.variables[v].cols) * sizeof(float);
  }
  m.slots = m.params * static_cast<uint64_t>(num_slots_);
  for (size_t t = 0; t < tables_.size(); ++t) {
    TableMemory tm;
    tm.name = layout_.tables[t].name;
    tm.bf16 = layout_.tables[t].bf16;
    for (const EmbeddingTable& part : tables_[t]) {
      const uint64_t rows = static_cast<uint64_t>(part.capacity());
      const uint64_t row_bytes = static_cast<uint64_t>(part.dim()) * sizeof(float);
      tm.rows += rows;
      tm.params += rows * part.params_bytes_per_row();  // half for bf16 rows
      tm.slots += rows * row_bytes * static_cast<uint64_t>(part.num_slots());
      tm.overhead += EmbeddingTable::BytesFor(part.options());
      tm.bytes_per_row = part.bytes_per_row();
      tm.meta_bytes_per_row = part.meta_bytes_per_row();
    }
    tm.overhead -= tm.params + tm.slots;
    m.params += tm.params;
    m.slots += tm.slots;
    m.tables.push_back(std::move(tm));
  }
  m.overhead = total_bytes() - m.params - m.slots;
  return m;
}

HugePageStatus ShmParamStore::huge_pages() const {
  HugePageStatus status;
  status.requested = huge_pages_requested_;
  status.shmem_enabled = huge_page_settings_.shmem_enabled;
  status.tmpfs_huge = huge_page_settings_.tmpfs_huge;
  status.thp_enabled = huge_page_settings_.thp_enabled;
  // Per segment, and no more than its size: a private segment's mapping
  // ends on a whole huge page (ShmSegment::mapped_bytes).
  const std::optional<std::string> smaps = ReadSelfSmaps();
  if (!smaps) return status;
  uint64_t granted = 0;
  for (const auto& seg : segments_) {
    const auto begin = reinterpret_cast<uintptr_t>(seg->data());
    const MappedRange range{begin, begin + seg->mapped_bytes()};
    const std::optional<uint64_t> bytes =
        PmdMappedBytes(*smaps, {&range, 1}, private_memory_ ? "AnonHugePages:" : "ShmemPmdMapped:");
    if (!bytes) return status;
    granted += std::min<uint64_t>(*bytes, seg->size());
  }
  status.granted_bytes = granted;
  return status;
}

}  // namespace shardwild
