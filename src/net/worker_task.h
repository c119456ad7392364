// A cluster's worker task (`shardwild serve CONFIG` with task type worker):
// computes. It reads the training data (and, with inline evaluation, the
// test data), reaches the parameters through a ClusterParamStore (the ps
// tasks of this machine through shared memory, the others through gRPC),
// starts train.workers pinned worker threads as one machine would (a Job on
// that store), and each thread joins the chief's task loop as one slot
// (chief.h): it opens a session, says hello and ready, and runs the task
// and evaluation lines it is sent (workers/task_workers.h TaskRunner),
// with heartbeats between pieces of a task, until the chief says exit.
//
// Losing the chief: a thread whose session ends (the chief restarted, the
// network dropped it, the chief gave up on the slot) connects again and
// goes on; one that cannot reach the chief for train.task_timeout_s gives
// up, and the task fails with Unavailable naming chief:0. A session the
// chief refuses for good (a slot it does not expect, another thread count,
// a wrong token) fails the task with the chief's message.
#pragma once

#include "absl/status/status.h"
#include "core/config/options.h"
#include "net/cluster_setup.h"
#include "net/cluster_spec.h"

namespace shardwild {

class FunctionRegistry;

// Runs worker task `index` of `spec`; returns when every thread has been
// told to exit (OK) or one failed for good (its error). Meanwhile the task
// serves the chief's scheduled functions (cluster_functions.h) from
// `functions` (not owned; nullptr = the built-ins, AddBuiltinFunctions) on
// a thread of its own, one call at a time.
absl::Status RunWorkerTask(const Config& config, const ClusterSpec& spec, int index, const TaskLog& log,
                           const FunctionRegistry* functions = nullptr);

}  // namespace shardwild
