#include "server/memory_trim.h"

#include <malloc.h>

#include "common/thread_name.h"

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

bool MemoryTrimmer::TrimNow() { return malloc_trim(0) == 1; }

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
