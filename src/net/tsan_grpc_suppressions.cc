// ThreadSanitizer and Debian's gRPC.
//
// Debian's libgrpc/libgpr are not built with -fsanitize=thread. TSan cannot
// see their internal synchronisation (their own atomics, futexes and
// lock-free queues), yet its interceptors still record what they do to file
// descriptors and memory through libc. The result is reports whose both
// sides are inside gRPC (or the abseil it locks with), e.g. epoll_create1 in the Epoll1Poller
// constructor "racing" epoll_wait on gRPC's event_engine thread: nothing of
// Shardwild's is involved.
//
// `called_from_lib` makes TSan ignore the interceptors called from those
// libraries, i.e. treat gRPC as the opaque, uninstrumented code it is. Races
// in Shardwild's own code (every frame of both accesses instrumented)
// are still reported: the suppression does not match them. Linked into the
// net tests and, in TSan builds, the shardwild binary (whose cluster tasks
// run gRPC); nothing else is affected.
#include "core/base/sanitizers.h"

#ifdef SHARDWILD_TSAN
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgrpc++.so\n"
         "called_from_lib:libgpr.so\n"
         // gRPC's own threads (its timer manager, executor and resolver
         // threads, all grpc_core::Thread) are joined by gRPC's shutdown,
         // which gRPC 1.51 may run on a thread of its own after the last
         // channel goes. A process that exits just then (a rank whose
         // rendezvous is unreachable prints its one error line and exits)
         // ends with such a thread finished but not yet joined: a "thread
         // leak" whose creation stack is inside gRPC. Matched by that stack,
         // so a std::thread of ours left unjoined is still reported. (Seen
         // once in CI: AllreduceCli.BadPlacementsAreOneClearError.)
         "thread:grpc_core::Thread::Thread\n"
         // oneDNN, uninstrumented too: its primitive cache is created and
         // locked by its own thread-safe statics and rwlocks, which TSan
         // cannot follow when two threads build their first primitives at
         // once (worker tasks of an in-process cluster test). Our buffers
         // are unaffected: uninstrumented code reports no memory accesses.
         "called_from_lib:libdnnl.so\n"
         // Gloo (the allreduce collectives), uninstrumented too. When a
         // collective fails (a peer's socket breaks: a killed rank), the
         // calling rank unwinds and destroys the collective's UnboundBuffers
         // while Gloo's loop thread may still be signalling them
         // (pthread_cond_signal/broadcast): signalException for the broken
         // pair, handleRecvCompletion/handleSendCompletion for a transfer
         // with a live peer that completed just then. The destructor first
         // waits, through the shared_ptr count of Gloo's
         // ShareableNonOwningPtr, for every such holder to let go
         // (gloo/common/memory.h: its last member, so destroyed first), which
         // TSan cannot see in an uninstrumented library. Matched by the
         // other side of the report, Gloo's own signalling (the destroying
         // side shows the destructor, or the delete after it): only races
         // with that Gloo thread are hidden, not ours on the same objects.
         // Narrow on purpose: called_from_lib would also hide Gloo's
         // mutexes, which TSan does follow. (handleRecvCompletion: seen once
         // in CI, AllreduceCli.AKilledRankOfTheHybridIsLeftBehind.)
         "race:gloo::transport::tcp::UnboundBuffer::signalException\n"
         "race:gloo::transport::tcp::UnboundBuffer::handleRecvCompletion\n"
         "race:gloo::transport::tcp::UnboundBuffer::handleSendCompletion\n"
         // gRPC's TLS (the Tls test): OpenSSL, uninstrumented too.
         "called_from_lib:libssl.so\n"
         "called_from_lib:libcrypto.so\n"
         // gRPC 1.51 is built on abseil (absl::Mutex and its deadlock
         // detector, StrCat, time zones, hash tables), just as uninstrumented
         // in Debian (the reason core/base/mutex.h exists); every abseil library
         // these tests load (one entry must match exactly one library).
         // Shardwild's own code uses abseil only for Status values and
         // string formatting, never shared between threads.
         "called_from_lib:libabsl_bad_optional_access.so\n"
         "called_from_lib:libabsl_bad_variant_access.so\n"
         "called_from_lib:libabsl_base.so\n"
         "called_from_lib:libabsl_city.so\n"
         "called_from_lib:libabsl_civil_time.so\n"
         "called_from_lib:libabsl_cord.so\n"
         "called_from_lib:libabsl_cord_internal.so\n"
         "called_from_lib:libabsl_cordz_functions.so\n"
         "called_from_lib:libabsl_cordz_handle.so\n"
         "called_from_lib:libabsl_cordz_info.so\n"
         "called_from_lib:libabsl_debugging_internal.so\n"
         "called_from_lib:libabsl_demangle_internal.so\n"
         "called_from_lib:libabsl_exponential_biased.so\n"
         "called_from_lib:libabsl_graphcycles_internal.so\n"
         "called_from_lib:libabsl_hash.so\n"
         "called_from_lib:libabsl_hashtablez_sampler.so\n"
         "called_from_lib:libabsl_int128.so\n"
         "called_from_lib:libabsl_log_severity.so\n"
         "called_from_lib:libabsl_low_level_hash.so\n"
         "called_from_lib:libabsl_malloc_internal.so\n"
         "called_from_lib:libabsl_random_distributions.so\n"
         "called_from_lib:libabsl_random_internal_platform.so\n"
         "called_from_lib:libabsl_random_internal_pool_urbg.so\n"
         "called_from_lib:libabsl_random_internal_randen.so\n"
         "called_from_lib:libabsl_random_internal_randen_hwaes.so\n"
         "called_from_lib:libabsl_random_internal_randen_hwaes_impl.so\n"
         "called_from_lib:libabsl_random_internal_randen_slow.so\n"
         "called_from_lib:libabsl_random_internal_seed_material.so\n"
         "called_from_lib:libabsl_random_seed_gen_exception.so\n"
         "called_from_lib:libabsl_random_seed_sequences.so\n"
         "called_from_lib:libabsl_raw_hash_set.so\n"
         "called_from_lib:libabsl_raw_logging_internal.so\n"
         "called_from_lib:libabsl_spinlock_wait.so\n"
         "called_from_lib:libabsl_stacktrace.so\n"
         "called_from_lib:libabsl_status.so\n"
         "called_from_lib:libabsl_statusor.so\n"
         "called_from_lib:libabsl_str_format_internal.so\n"
         "called_from_lib:libabsl_strerror.so\n"
         "called_from_lib:libabsl_strings.so\n"
         "called_from_lib:libabsl_strings_internal.so\n"
         "called_from_lib:libabsl_symbolize.so\n"
         "called_from_lib:libabsl_synchronization.so\n"
         "called_from_lib:libabsl_throw_delegate.so\n"
         "called_from_lib:libabsl_time.so\n"
         "called_from_lib:libabsl_time_zone.so\n"
         // Template code instantiated in our binary (so instrumented) but
         // run by uninstrumented gRPC: a status message gRPC's thread copies
         // out of an absl::Cord into a std::string, which the calling thread
         // reads after gRPC's completion queue (invisible to TSan) handed it
         // over. Narrow on purpose: CopyCordToString never runs our code.
         "race:absl::debian3::CopyCordToString\n";
}
#endif
