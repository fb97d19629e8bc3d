// MemoryTrimmer: gives the heaps' free pages back to the system every period.
//
// The server keeps freed memory in glibc's heaps (common/malloc_tuning.h), so
// that a multi-megabyte message reuses pages instead of faulting in fresh
// ones. Free memory between live allocations goes back to the system only
// through malloc_trim, though: without it, each heap kept the most it had
// ever served, and bursts of large messages raised RSS step by step (a
// 10-minute CPU soak, bench/soak: 372 to 509 MiB with 49 MiB in use; one
// malloc_trim(0) returned 163 MB at once). A trim every period returns each
// heap's free pages (madvise), so that RSS follows what the last period
// touched; pages used again fault back in once per period.
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

  // Returns the free pages of every heap to the system; true when some were.
  static bool TrimNow();

 private:
  void Run(absl::Duration period);

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_MEMORY_TRIM_H_
