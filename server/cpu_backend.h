// CPU backend: a fixed pool of threads that splits each batch's rows (over
// all its segments) into tasks of roughly equal element counts and runs
// softmax::CpuSoftmaxRows on them. Correct for every axis; float64
// accumulation.
//
// Thread-safety: Submit may be called from any thread; completion callbacks
// run on a pool thread (or inline in Submit for a batch with nothing to
// compute).
#ifndef SOFTMAX_SERVER_CPU_BACKEND_H_
#define SOFTMAX_SERVER_CPU_BACKEND_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/backend.h"

namespace softmax::server {

struct CpuBackendOptions {
  // Worker threads; 0 = std::thread::hardware_concurrency(). More threads
  // cut compute time for large batches until memory bandwidth saturates.
  int threads = 0;
  // Smallest task, in elements: below this, splitting costs more in
  // hand-offs than it gains in parallelism.
  int64_t min_task_elements = 16384;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);
  // Finishes the tasks already queued, then joins the threads.
  ~CpuBackend() override;

  std::string Describe() const override;
  // name: the processor's model (/proc/cpuinfo), multiprocessors: worker
  // threads; no memory size, peak bandwidth or occupancy to report.
  DeviceInfo Device() const override;
  void Submit(std::unique_ptr<Batch> batch, Done done) override;

  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  struct Job;
  // Rows from (first_segment, first_row) up to (last_segment, last_row_end),
  // in batch order: a task may span many small segments.
  struct Task {
    std::shared_ptr<Job> job;
    int first_segment = 0;
    int64_t first_row = 0;
    int last_segment = 0;
    int64_t last_row_end = 0;
  };
  void WorkerLoop();

  const CpuBackendOptions options_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_CPU_BACKEND_H_
