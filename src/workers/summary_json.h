// The JSON summaries of runs: what `shardwild train --json` and `eval --json`
// print, and what the Python API's train() and evaluate() return (one
// builder for both, so the two never drift apart).
#pragma once

#include "nlohmann/json.hpp"
#include "workers/evaluator.h"
#include "workers/job.h"
#include "workers/trainer.h"

namespace shardwild {

// store.memory of the train summary, summed over the replicas: bytes of
// parameters, optimizer slots and everything else, and per embedding table
// the bytes a row takes (bytes_per_row, of which meta_bytes_per_row are
// metadata) and the same split.
nlohmann::json StoreMemoryJson(ReplicatedStore& store);

// data.packed of the train and bench summaries: how the job packed its
// training records for the workers' loads (PackedRecords), null where it
// did not (streamed, or nothing to pack): bytes, the blocks' layout (slots
// of slot_bytes, records_after_slots of them longer, or one after the
// other), narrow ids, the label in the block, dense values as bytes, and
// per weighted field whether its weights are coded in the ids' words
// (decimals, id_bits) or kept as floats.
nlohmann::json PackedDataJson(Job& job);

// The summary of a training run of `job` (train --json): throughput,
// counters, checkpoints, test metrics, the store, per-epoch history, rows
// skipped.
nlohmann::json TrainSummaryJson(const TrainSummary& s, Job& job);

// One checkpoint's evaluation on `data` (eval --json).
nlohmann::json EvaluationJson(const CheckpointEvaluation& e, const Dataset& data);

}  // namespace shardwild
