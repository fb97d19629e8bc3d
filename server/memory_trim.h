// MemoryTrimmer: gives the allocator's free pages back to the system every period.
//
// The server's allocator is tcmalloc where the build found it (CMake's
// SOFTMAX_TCMALLOC), else glibc's malloc. Either keeps freed memory, so that a
// multi-megabyte message reuses pages instead of faulting in fresh ones, and
// returns it only when asked: tcmalloc's page heap through
// MallocExtension_ReleaseFreeMemory, glibc's heaps (common/malloc_tuning.h)
// through malloc_trim. Without a trim, each glibc heap kept the most it had
// ever served, and bursts of large messages raised RSS step by step (a
// 10-minute CPU soak, bench/soak: 372 to 509 MiB with 49 MiB in use; one
// malloc_trim(0) returned 163 MB at once). A trim every period returns the
// free pages, so that RSS follows what the last period touched; pages used
// again fault back in once per period.
//
// Why tcmalloc: with glibc, gRPC's threads and the scheduler's hand small
// blocks to each other and queue on the heap locks of one heap per core. H200,
// 1 x 1024 float32 at 256 callers, 4 alternating rounds, ratio to the echo:
// glibc 0.71-0.98 unary (median 0.83), tcmalloc 0.93-0.99 (0.96).
//
// Thread-safety: TrimNow may be called from any thread; construct and destroy
// a MemoryTrimmer on one thread.
#ifndef SOFTMAX_SERVER_MEMORY_TRIM_H_
#define SOFTMAX_SERVER_MEMORY_TRIM_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace softmax::server {

class MemoryTrimmer {
 public:
  // Starts a thread that calls TrimNow every `period`. REQUIRES: period > 0;
  // the caller's signal mask is what the thread inherits.
  explicit MemoryTrimmer(absl::Duration period);
  // Stops the thread (at once, mid-period too) and joins it.
  ~MemoryTrimmer();
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Returns the allocator's free pages to the system; true when some were.
  static bool TrimNow();
  // "tcmalloc" or "glibc": the allocator this server was built with.
  static const char* AllocatorName();

 private:
  void Run(absl::Duration period);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_MEMORY_TRIM_H_
