#include "server/memory_trim.h"

#include <malloc.h>

#include <cstddef>

#include "common/thread_name.h"

#if SOFTMAX_HAVE_TCMALLOC
#include <gperftools/malloc_extension_c.h>
#endif

namespace softmax::server {

MemoryTrimmer::MemoryTrimmer(absl::Duration period)
    : thread_([this, period] { Run(period); }) {}

MemoryTrimmer::~MemoryTrimmer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool MemoryTrimmer::TrimNow() {
#if SOFTMAX_HAVE_TCMALLOC
  size_t free_bytes = 0;
  MallocExtension_GetNumericProperty("tcmalloc.pageheap_free_bytes", &free_bytes);
  MallocExtension_ReleaseFreeMemory();
  return free_bytes > 0;
#else
  return malloc_trim(0) == 1;
#endif
}

const char* MemoryTrimmer::AllocatorName() { return SOFTMAX_HAVE_TCMALLOC ? "tcmalloc" : "glibc"; }

void MemoryTrimmer::Run(absl::Duration period) {
  NameThisThread("memory-trim");
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) {
    mu_.Unlock();
    TrimNow();
    mu_.Lock();
  }
}

}  // namespace softmax::server
